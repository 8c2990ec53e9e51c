/* The value grammar of cptrace_otel.model.logline (parse_value) for the common token shapes, shared by the C line reader
 * (logreader.c) and the C exporter intake (intake.c); compiled into both modules (value.c).
 *
 * It mirrors logline.fast_value: canonical decimal ints, rng summaries of five canonical ints, flat lists of
 * canonical ints and plain texts are decoded here; a text that might be a float, or an odd rng or list shape, is
 * answered with FALLBACK and Python (logline.parse_value) decides. The range labels ("(cnt=", ",min=", ...) are not
 * written here: value_configure builds them from the Rng type's field names.
 */
#ifndef CPTRACE_VALUE_H
#define CPTRACE_VALUE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Status of the helpers: OK (result set), FALLBACK (let Python decide), ERR (exception set), SKIP (no record). */
enum { OK = 0, FALLBACK = 1, ERR = -1, SKIP = 2 };

static inline uint32_t hash_bytes(const char *p, Py_ssize_t n)
{
    uint32_t h = 2166136261u;   /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ASCII whitespace as str.split() sees it: \t \n \v \f \r, \x1c-\x1f and space */
extern const unsigned char ws_tab[256];

/* value_configure(Rng): the type rng summaries become (a tuple subclass is built as tuple.__new__ does); its
 * _fields name the five labels. Clears the value cache (cached values of an earlier type must not leak out).
 * 0, or -1 with an exception set. */
int value_configure(PyObject *rng);

/* Whether value_configure succeeded (with an exception set when not: "<module>.configure() was not called"). */
int value_configured(const char *module);

/* int of an optionally signed run of ASCII digits (leading zeros allowed): OK, FALLBACK (too long for int()), ERR */
int value_int(const char *p, Py_ssize_t n, PyObject **out);

/* logline.parse_value of one ASCII token value p[0:n] (no whitespace in it): OK with *out, FALLBACK, or ERR */
int value_parse(const char *p, Py_ssize_t n, PyObject **out);

#endif
