/* The value grammar of cptrace_otel.model.logline (parse_value) for the common token shapes, and the state the C
 * record readers share (logreader.c, intake.c, otlpin.c, jaegerin.c: what their configure() sets, and the guard of
 * their entry points); compiled into each of those modules (value.c), so each module holds its own copy.
 *
 * The grammar mirrors logline.fast_value: canonical decimal ints, rng summaries of five canonical ints, flat lists of
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

/* Whether p[0:n] is valid UTF-8 (str(bytes, "utf-8") would not raise): ASCII checked here, the rest by Python. */
static inline int utf8_ok(const void *p, Py_ssize_t n)
{
    const unsigned char *s = p;
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] & 0x80) {
            PyObject *o = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
            if (o == NULL) {
                PyErr_Clear();
                return 0;
            }
            Py_DECREF(o);
            return 1;
        }
    return 1;
}

/* ASCII whitespace as str.split() sees it: \t \n \v \f \r, \x1c-\x1f and space */
extern const unsigned char ws_tab[256];

/* value_configure(Rng): the type rng summaries become (a tuple subclass is built as tuple.__new__ does); its
 * _fields name the five labels. Clears the value cache (cached values of an earlier type must not leak out).
 * 0, or -1 with an exception set. */
int value_configure(PyObject *rng);

/* int of an optionally signed run of ASCII digits (leading zeros allowed): OK, FALLBACK (too long for int()), ERR */
int value_int(const char *p, Py_ssize_t n, PyObject **out);

/* logline.parse_value of one ASCII token value p[0:n] (no whitespace in it): OK with *out, FALLBACK, or ERR */
int value_parse(const char *p, Py_ssize_t n, PyObject **out);

/* str of the UTF-8 text p[0:n], through a small cache of interned ASCII names (field names and tags recur in every
 * record; value_configure empties it): a new reference, or NULL with an exception set */
PyObject *value_name(const char *p, Py_ssize_t n);

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

/* -- the readers' shared state: what configure() sets --------------------------------------------------------- */

/* Hidden like their definitions (every module links its own value.c; setup.py's -fvisibility=hidden covers only
 * definitions): the readers then load these directly, not through the GOT. */
#pragma GCC visibility push(hidden)

/* src_obj: the records' Event.src (set by intake.c's configure and by reader_configure_spans); zero_obj, one_obj:
 * the small ints, set by reader_configure. */
extern PyObject *src_obj, *zero_obj, *one_obj;

/* Set by reader_configure_spans (the span readers, otlpin.c and jaegerin.c): the attribute keys of configure's keys
 * (bytes), the five range-part suffixes (keys["rng_suffixes"], bytes) and logline.parse_value. */
extern PyObject *k_prefix, *k_seq, *k_epoch, *k_level, *k_rank, *k_violation, *k_ev_violation;
extern PyObject *k_run_id, *k_cp_rank, *k_trace_level;
extern PyObject *rng_suffix[5], *parse_value_fn;

#pragma GCC visibility pop

/* configure's common part, every reader: event_configure(Event, EpochTracker, epoch_tags, event_slots), then
 * value_configure(Rng), then the small ints; the module is configured (reader_configured) once it returns 0.
 * 0, or -1 with an exception set. */
int reader_configure(PyObject *rng, PyObject *ev, PyObject *tracker, PyObject *tags, PyObject *slots);

/* A key of configure's keys beyond the shared ones (a span reader's own), and the slot its value goes to. */
typedef struct {
    const char *name;
    PyObject **slot;
} ReaderKey;

/* configure(Rng, Event, EpochTracker, epoch_tags, event_slots, keys, parse_value) of a span reader (args: the
 * call's arguments): reader_configure's part, then from keys (a dict) the shared attribute keys and the module's
 * bytes_keys (bytes), rng_suffixes (5 non-empty bytes), the module's str_keys and src (str), and
 * parse_value. The module is configured once it returns 0. 0, or -1 with an exception set (a TypeError for a wrong
 * key). */
int reader_configure_spans(PyObject *args, const ReaderKey *bytes_keys, int n_bytes, const ReaderKey *str_keys,
                           int n_str);
#define READER_SPANS_CONFIGURE_DOC "configure(Rng, Event, EpochTracker, epoch_tags, event_slots, keys, parse_value)"

/* The guard of each reader's entry points: 1 when configure() succeeded (and the last Rng given was valid), else 0
 * with RuntimeError "<module>.configure() was not called" set. */
int reader_configured(const char *module);

/* A span reader's entry point taking one bytes-like arg: the guard (reader_configured), then arg's bytes into *b
 * (PyBUF_SIMPLE; the caller releases them). 0, or -1 with an exception set. */
int reader_open(const char *module, PyObject *arg, Py_buffer *b);

/* A reader's answer when its status st is not OK: None for FALLBACK (let Python decide), NULL for ERR (the exception
 * set); out (a new reference or NULL: what it built so far) is released. */
PyObject *reader_decline(int st, PyObject *out);

#endif
