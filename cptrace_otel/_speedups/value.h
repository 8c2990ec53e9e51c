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

/* str of the UTF-8 text p[0:n], through a small cache of interned ASCII names (field names and tags recur in every
 * record; value_configure empties it): a new reference, or NULL with an exception set */
PyObject *value_name(const char *p, Py_ssize_t n);

/* keys[name] (keys: a dict) into *slot when it is bytes: 0, or -1 with a TypeError set (configure's key lists) */
int value_key_bytes(PyObject *keys, const char *name, PyObject **slot);

/* configure's keys (a dict): keys[names[i]] (bytes) into *slots[i] for i < n, and keys["rng_suffixes"] (a tuple of 5
 * non-empty bytes) into suffixes[0..4]: 0, or -1 with a TypeError set */
int value_configure_keys(PyObject *keys, const char *const *names, PyObject **const *slots, int n,
                         PyObject **suffixes);

/* a record text p[0:n] as attrs.attributes_to_fields keeps it, logline.parse_value of it: value_parse for a plain
 * ASCII token, else parse_value_fn(str): OK with *out, FALLBACK (not UTF-8, or parse_value raised: Python decides,
 * no exception left set), or ERR */
int value_text(const char *p, Py_ssize_t n, PyObject *parse_value_fn, PyObject **out);

/* The fields of one record as attrs.attributes_to_fields builds them from its attributes, one attribute at a time
 * (value_field_add), then value_fields_end. */
typedef struct {
    const char *base;    /* the base name of the range summary being joined */
    Py_ssize_t n;
    int pend;            /* its parts read so far (0: none open) */
    PyObject *parts[5];
} ValueFields;

/* The attribute named k[0:kn] (after the field prefix) with value x (a new reference, taken) into the dict fields:
 * a range summary's five parts (names ending with suffixes[0..4], bytes, one after another in that order) joined
 * into one Rng under their base name, any other under its name. OK, FALLBACK (parts out of the exporter's order:
 * Python decides), or ERR. */
int value_field_add(ValueFields *vf, PyObject *fields, const char *k, Py_ssize_t kn, PyObject *const *suffixes,
                    PyObject *x);

/* The end of the record: st, or FALLBACK when st is OK and a summary is incomplete; what vf holds is released. */
int value_fields_end(ValueFields *vf, int st);

#endif
