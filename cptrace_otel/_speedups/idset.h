/* The set of node ids sampled out (idset.c), linked into _hot: hot.c's gate asks it about a call's node id. */
#ifndef CPTRACE_IDSET_H
#define CPTRACE_IDSET_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define IDSET_EMPTY INT64_MIN /* a free slot of the table */

typedef struct {
    PyObject_HEAD
    PyObject *all;      /* a set: every element (the definition of membership) */
    Py_ssize_t others;  /* elements of all not in the table (not an exact int within int64, or INT64_MIN) */
    int stale;          /* the table could not be kept (no memory): all decides until the next clear */
    int direct;         /* the table decides an exact int: no others, not stale, a table, no mutation running */
    int busy;           /* mutations running (nested when Python code run by one mutates again) */
    uint64_t muts;      /* mutations so far (a reentrant one is seen by the outer one) */
    int64_t *keys;      /* open addressing, linear probing; IDSET_EMPTY marks a free slot; NULL while cap == 0 */
    size_t cap, n;      /* slots (a power of two, or 0) and keys held; n <= cap / 2 */
    unsigned shift;     /* 64 - log2(cap): a key's first slot is the top bits of its Fibonacci hash */
} IdSet;

extern PyTypeObject IdSet_Type;

/* *v = o (an exact int) when it fits in one digit of CPython's int (|o| < 2**30): then the value is read in place,
 * a few instructions, where PyLong_AsLongLongAndOverflow is a call; 0 for a larger int (the caller asks the API). */
static inline int idset_small_int(PyObject *o, int64_t *v) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
    *v = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
#else
    Py_ssize_t size = Py_SIZE(o); /* digits, negative for a negative int */
    if (size < -1 || size > 1) return 0;
    *v = (int64_t)size * (int64_t)((PyLongObject *)o)->ob_digit[0];
#endif
    return 1;
}

/* v's first slot (Fibonacci hashing: consecutive ids spread over the table) */
static inline size_t idset_home(const IdSet *s, int64_t v) {
    return (size_t)(((uint64_t)v * 0x9E3779B97F4A7C15ULL) >> s->shift);
}

/* v in the table; s->keys != NULL */
static inline int idset_probe(const IdSet *s, int64_t v) {
    size_t m = s->cap - 1, i = idset_home(s, v);
    for (;;) {
        int64_t k = s->keys[i];
        if (k == v) return 1;
        if (k == IDSET_EMPTY) return 0;
        i = (i + 1) & m;
    }
}

/* Any key the inline test below does not decide: 1, 0, or -1 with an exception. */
int idset_contains_slow(PyObject *s, PyObject *key);

/* key in s (an IdSet), with a set's semantics: 1, 0, or -1 with an exception (an unhashable key). A small exact int
 * costs a C hash probe here; any other key, or any key while s holds an element that is not an exact int within
 * int64, is looked up in s's set (which may run the key's __hash__/__eq__; s is kept alive meanwhile). */
static inline int idset_contains(PyObject *self, PyObject *key) {
    IdSet *s = (IdSet *)self;
    int64_t v;
    if (s->direct && PyLong_CheckExact(key) && idset_small_int(key, &v)) return idset_probe(s, v);
    return idset_contains_slow(self, key);
}

#endif
