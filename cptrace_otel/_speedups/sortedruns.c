/* The sorted runs on disk of ``check`` over span files (analyze/sources/sortedruns.py, the external sort behind
 * TraceDocs), their two hot steps in C: records packed to bytes and back, and runs merged; loaded by
 * _speedups/sortedruns.py.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags, event_slots)   as every reader takes them (event.h)
 *   pack(records) -> bytes | None
 *       records: a list of (epoch, seq, ts, Event), each key its Event's own values (what the sorted runs hold). The
 *       bytes hold each Event's nine values; None when one of them is of a type this format does not hold (below),
 *       or the Event is not exactly an Event whose slots this code reads: the caller then pickles the chunk instead
 *       (the twin).
 *   unpack(data) -> [(epoch, seq, ts, Event), ...]
 *       the records pack was given, rebuilt: Event(*values), the key (Event.epoch, Event.seq, Event.ts), each value
 *       of its type (bool stays bool, an int an int, a float the same 8 bytes, an Rng an Rng). Sharing is not
 *       kept: two records that held one dict get equal dicts. A ValueError for bytes pack did not write.
 *   merge_packed(runs, chunk, write) -> bool
 *       merge of runs of packed chunks straight from bytes to bytes (see its section below).
 *   mark_seqs(bits, records, limit) -> bool
 *       SeqBits.add's loop (see the seq bits section below).
 *   merge(runs, ts_field=None) -> iterator
 *       heapq.merge(*runs, key=itemgetter(0, 1, 2)) of records, or with ts_field heapq.merge(*runs,
 *       key=otlpfile.merge_key) of Events (see the merge section below).
 *
 * The format (one chunk): its record count (4 bytes, little-endian), then each record's nine values in Event's
 * constructor order. A value is a type byte and its body: N (None), F, T (False, True), i (an int64, zigzag varint),
 * d (a float64, 8 bytes little-endian), s (a str not yet in this chunk: its length, UTF-8; it joins the chunk's string
 * table), r (a str of the table: its index), l (a list: its length, values), R (an Rng: its five values), D (a dict:
 * its length, then key and value for each, every key a str); lengths and indices are varints of at most 32 bits
 * (LEB128: 7 bits a byte, lowest first). Varints, not fixed widths: a record's ints are mostly small (rank, epoch,
 * level, slot numbers, string indices), and the runs of a long run's records fill the temporary disk (217 bytes a
 * record with 4 and 8 byte numbers). Only the exact types: a subclass, an int outside int64, a str that is not valid
 * UTF-8 (lone surrogates), a tuple that is not an Rng or nesting deeper than MAX_DEPTH make pack answer None.
 *
 * Why C: a record's round trip through the sorted runs with pickle (each Event's values taken out as a tuple,
 * pickled, unpickled, an Rng rebuilt by a Python call, the Event rebuilt) cost about 5 µs, more than reading it
 * from its OTLP JSON line in C; heapq.merge is a Python generator, a step and a key tuple per record.
 *
 * Twin: cptrace_otel.analyze.sources.sortedruns.pickle_chunk
 * Twin: cptrace_otel.analyze.sources.sortedruns.unpickle_chunk
 * Twin: heapq.merge
 * Twin: cptrace_otel.analyze.sources.otlpfile.merge_key
 * Twin: cptrace_otel.analyze.sources.sortedruns.SeqBits._add_py
 * Twin: cptrace_otel.analyze.sources.sortedruns.RunFile._merge_records
 * Held equal by: tests/unit/test_sortedruns_c.py
 */
#include "event.h"

#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define RNG_PARTS 5
#define KEY_EPOCH 4   /* Event's constructor order: tag, rank, seq, ts, epoch, fields, level, src, line_no */
#define KEY_SEQ 2
#define KEY_TS 3

enum { V_NONE = 'N', V_FALSE = 'F', V_TRUE = 'T', V_INT = 'i', V_FLOAT = 'd', V_STR = 's', V_REF = 'r',
       V_LIST = 'l', V_RNG = 'R', V_DICT = 'D' };

static PyObject *rng_type;   /* logline.Rng (configure) */
static int configured;

/* -- pack ------------------------------------------------------------------------------------------------------ */

#define SEEN 512   /* slots of the cache of str objects met (a power of two) */

typedef struct {
    char *p;
    size_t n, cap;
    PyObject *strs;   /* dict: str -> its index in the chunk's string table */
    /* the same str objects recur (tags, field names, src): by address first, without hashing or comparing text.
     * The records hold every str met for the whole call, so no address is reused meanwhile. */
    struct { PyObject *s; Py_ssize_t ix; } seen[SEEN];
} Out;

enum { PACKED = 1, NOT_PACKABLE = 0, FAILED = -1 };

static int grow(Out *o, size_t add)
{
    if (o->n + add <= o->cap)
        return PACKED;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->n + add)
        cap *= 2;
    char *p = PyMem_Realloc(o->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    o->p = p;
    o->cap = cap;
    return PACKED;
}

static int put(Out *o, const void *src, size_t n)
{
    if (grow(o, n) < 0)
        return FAILED;
    memcpy(o->p + o->n, src, n);
    o->n += n;
    return PACKED;
}

static int put_byte(Out *o, char c) { return put(o, &c, 1); }

/* a chunk's record count: 4 bytes, little-endian (its place is written before the records are counted) */
static int put_count(Out *o, Py_ssize_t v)
{
    if ((size_t)v > UINT32_MAX)
        return NOT_PACKABLE;
    unsigned char b[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, (v >> 24) & 0xff};
    return put(o, b, 4);
}

/* a type byte, then v as a varint (LEB128: 7 bits a byte, the lowest first, the high bit set on all but the last) */
static int put_varint(Out *o, char type, uint64_t v)
{
    unsigned char b[11];
    int n = 0;
    b[n++] = (unsigned char)type;
    do {
        b[n] = v & 0x7f;
        v >>= 7;
        b[n++] |= v ? 0x80 : 0;
    } while (v);
    return put(o, b, (size_t)n);
}

/* a type byte and a length or table index: NOT_PACKABLE past 32 bits */
static int put_u32(Out *o, char type, Py_ssize_t v)
{
    return (size_t)v > UINT32_MAX ? NOT_PACKABLE : put_varint(o, type, (uint64_t)v);
}

static int put_str(Out *o, PyObject *s)
{
    size_t h = ((uintptr_t)s >> 4) & (SEEN - 1);
    if (o->seen[h].s == s)
        return put_u32(o, V_REF, o->seen[h].ix);
    PyObject *ix = PyDict_GetItemWithError(o->strs, s);
    if (ix != NULL) {
        o->seen[h].s = s;
        o->seen[h].ix = PyLong_AsSsize_t(ix);
        return put_u32(o, V_REF, o->seen[h].ix);
    }
    if (PyErr_Occurred())
        return FAILED;
    Py_ssize_t n;
    PyObject *tmp = NULL;
    const char *u;
    if (PyUnicode_IS_COMPACT_ASCII(s)) {   /* the text is its UTF-8: no copy made or cached on the str */
        u = (const char *)PyUnicode_DATA(s);
        n = PyUnicode_GET_LENGTH(s);
    } else {
        tmp = PyUnicode_AsUTF8String(s);
        if (tmp == NULL) {   /* lone surrogates: pickle keeps them, this format does not */
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
                return FAILED;
            PyErr_Clear();
            return NOT_PACKABLE;
        }
        u = PyBytes_AS_STRING(tmp);
        n = PyBytes_GET_SIZE(tmp);
    }
    int r = put_u32(o, V_STR, n);
    if (r == PACKED)
        r = put(o, u, (size_t)n);
    Py_XDECREF(tmp);
    if (r != PACKED)
        return r;
    PyObject *k = PyLong_FromSsize_t(PyDict_GET_SIZE(o->strs));
    if (k == NULL)
        return FAILED;
    r = PyDict_SetItem(o->strs, s, k);
    Py_DECREF(k);
    return r < 0 ? FAILED : PACKED;
}

static int put_value(Out *o, PyObject *v, int depth)
{
    if (v == Py_None)
        return put_byte(o, V_NONE);
    if (v == Py_True)
        return put_byte(o, V_TRUE);
    if (v == Py_False)
        return put_byte(o, V_FALSE);
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type)
        return put_str(o, v);
    if (t == &PyLong_Type) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return NOT_PACKABLE;
        if (x == -1 && PyErr_Occurred())
            return FAILED;
        return put_varint(o, V_INT, ((uint64_t)x << 1) ^ (uint64_t)(x >> 63));   /* zigzag: small negatives short */
    }
    if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        unsigned char b[9];
        b[0] = V_FLOAT;
        for (int i = 0; i < 8; i++)
            b[1 + i] = (unsigned char)(bits >> (8 * i));
        return put(o, b, 9);
    }
    if (depth >= MAX_DEPTH)
        return NOT_PACKABLE;
    int r;
    if (t == &PyList_Type) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        if ((r = put_u32(o, V_LIST, n)) != PACKED)
            return r;
        /* no Python code runs below (str hashes and compares, ints, floats): the list cannot change meanwhile */
        for (Py_ssize_t i = 0; i < n; i++)
            if ((r = put_value(o, PyList_GET_ITEM(v, i), depth + 1)) != PACKED)
                return r;
        return PACKED;
    }
    if ((PyObject *)t == rng_type && PyTuple_GET_SIZE(v) == RNG_PARTS) {
        if ((r = put_byte(o, V_RNG)) != PACKED)
            return r;
        for (int i = 0; i < RNG_PARTS; i++)
            if ((r = put_value(o, PyTuple_GET_ITEM(v, i), depth + 1)) != PACKED)
                return r;
        return PACKED;
    }
    if (t == &PyDict_Type) {
        if ((r = put_u32(o, V_DICT, PyDict_GET_SIZE(v))) != PACKED)
            return r;
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        while (PyDict_Next(v, &pos, &k, &x)) {
            if (!PyUnicode_CheckExact(k))
                return NOT_PACKABLE;
            if ((r = put_str(o, k)) != PACKED || (r = put_value(o, x, depth + 1)) != PACKED)
                return r;
        }
        return PACKED;
    }
    return NOT_PACKABLE;
}

static int put_records(Out *o, PyObject *records)
{
    Py_ssize_t n = PyList_GET_SIZE(records);
    int r = put_count(o, n);
    if (r != PACKED)
        return r;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 4)
            return NOT_PACKABLE;
        PyObject *ev = PyTuple_GET_ITEM(t, 3);
        for (int f = 0; f < EVENT_NFIELDS; f++) {
            PyObject *v = event_slot(ev, f);
            if (v == NULL)
                return NOT_PACKABLE;
            if ((r = put_value(o, v, 0)) != PACKED)
                return r;
        }
    }
    return PACKED;
}

static PyObject *py_pack(PyObject *self, PyObject *records)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "pack: not configured");
        return NULL;
    }
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "pack: records must be a list");
        return NULL;
    }
    Out o;
    memset(&o, 0, sizeof(o));
    if ((o.strs = PyDict_New()) == NULL)
        return NULL;
    int r = put_records(&o, records);
    PyObject *res = NULL;
    if (r == PACKED)
        res = PyBytes_FromStringAndSize(o.p, (Py_ssize_t)o.n);
    else if (r == NOT_PACKABLE)
        res = Py_NewRef(Py_None);
    PyMem_Free(o.p);
    Py_DECREF(o.strs);
    return res;
}

/* -- unpack ---------------------------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p, *end;
    PyObject *strs;   /* list: the chunk's string table */
} In;

static PyObject *corrupt(void)
{
    PyErr_SetString(PyExc_ValueError, "unpack: not records written by pack (truncated or corrupt)");
    return NULL;
}

/* the little-endian numbers of the format (a chunk's count, put_count; a float's 8 bytes) */
static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int get_u32(In *in, uint32_t *v)
{
    if (in->end - in->p < 4)
        return -1;
    *v = le32(in->p);
    in->p += 4;
    return 0;
}

/* One value's head as the format lays it out: the grammar of the bytes, read in this one place by every reader of
 * them (unpack's get_value, merge_packed's scan_value and copy_value). */
typedef struct {
    unsigned char type;
    uint32_t n;                   /* s: the text's length; r: its index in the table; l: items; D: pairs */
    long long ival;               /* i: the int */
    const unsigned char *body;    /* d: the 8 bytes; s: the text */
    uint64_t kids;                /* the values nested in it, which follow: l n, D 2n (key, value), R 5 */
} Tok;

/* a varint (put_varint's) at *p (before end) into *v and *p past it: 0, or -1 when cut short or past 64 bits */
static Py_ALWAYS_INLINE inline int get_varint(const unsigned char **pp, const unsigned char *end, uint64_t *v)
{
    const unsigned char *p = *pp;
    uint64_t x = 0;
    for (int shift = 0; p < end; shift += 7) {
        unsigned char c = *p++;
        if (shift == 63 && c > 1)
            return -1;
        x |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *pp = p;
            *v = x;
            return 0;
        }
        if (shift == 63)
            return -1;
    }
    return -1;
}

/* the head of the value at *pp (before end) into t and *pp past it (at its first nested value): 0, or -1 when the
 * bytes are not a value's head (an unknown type byte, cut short, or fewer bytes left than its nested values need:
 * each takes one at least) */
static Py_ALWAYS_INLINE inline int read_tok(const unsigned char **pp, const unsigned char *end, Tok *t)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return -1;
    uint64_t v;
    t->type = *p++;
    t->n = 0;
    t->ival = 0;
    t->body = p;
    t->kids = 0;
    switch (t->type) {
    case V_NONE:
    case V_FALSE:
    case V_TRUE:
        break;
    case V_INT:
        if (get_varint(&p, end, &v) < 0)
            return -1;
        t->ival = (long long)((v >> 1) ^ (0 - (v & 1)));   /* (zigzag) */
        break;
    case V_FLOAT:
        if (end - p < 8)
            return -1;
        p += 8;
        break;
    case V_STR:
    case V_REF:
    case V_LIST:
    case V_DICT:
        if (get_varint(&p, end, &v) < 0 || v > UINT32_MAX)
            return -1;
        t->n = (uint32_t)v;
        t->body = p;
        if (t->type == V_STR) {
            if ((size_t)(end - p) < t->n)
                return -1;
            p += t->n;
        } else if (t->type != V_REF) {
            t->kids = t->type == V_DICT ? 2 * (uint64_t)t->n : t->n;
        }
        break;
    case V_RNG:
        t->kids = RNG_PARTS;
        break;
    default:
        return -1;
    }
    if ((uint64_t)(end - p) < t->kids)
        return -1;
    *pp = p;
    return 0;
}

static PyObject *get_value(In *in, int depth)
{
    Tok t;
    if (depth > MAX_DEPTH || read_tok(&in->p, in->end, &t) < 0)
        return corrupt();
    switch (t.type) {
    case V_NONE:
        return Py_NewRef(Py_None);
    case V_FALSE:
        return Py_NewRef(Py_False);
    case V_TRUE:
        return Py_NewRef(Py_True);
    case V_INT:
        return PyLong_FromLongLong(t.ival);
    case V_FLOAT: {
        uint64_t bits = le64(t.body);
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case V_STR: {
        PyObject *s = PyUnicode_DecodeUTF8((const char *)t.body, t.n, NULL);
        if (s == NULL || PyList_Append(in->strs, s) < 0) {
            Py_XDECREF(s);
            return NULL;
        }
        return s;
    }
    case V_REF:
        if (t.n >= (uint32_t)PyList_GET_SIZE(in->strs))
            return corrupt();
        return Py_NewRef(PyList_GET_ITEM(in->strs, t.n));
    case V_LIST: {
        PyObject *l = PyList_New(t.n);
        if (l == NULL)
            return NULL;
        for (uint32_t i = 0; i < t.n; i++) {
            PyObject *x = get_value(in, depth + 1);
            if (x == NULL) {
                Py_DECREF(l);
                return NULL;
            }
            PyList_SET_ITEM(l, i, x);
        }
        return l;
    }
    case V_RNG: {
        /* what Rng(*parts) builds: tuple.__new__(Rng, parts), as the readers build it (value.c) */
        PyTypeObject *rt = (PyTypeObject *)rng_type;
        PyObject *r = rt->tp_alloc(rt, RNG_PARTS);
        int atomic = 1;
        if (r == NULL)
            return NULL;
        for (int i = 0; i < RNG_PARTS; i++) {
            PyObject *x = get_value(in, depth + 1);
            if (x == NULL) {
                Py_DECREF(r);
                return NULL;
            }
            PyTuple_SET_ITEM(r, i, x);
            atomic &= x == Py_None || PyLong_CheckExact(x) || PyFloat_CheckExact(x) || PyUnicode_CheckExact(x);
        }
        if (atomic)   /* no cycle through it: untracked, as the collector would (a dict holding it stays untracked) */
            PyObject_GC_UnTrack(r);
        return r;
    }
    default: {   /* V_DICT (read_tok knows no other) */
        PyObject *d = _PyDict_NewPresized(t.n);   /* (CPython's: no resize while it fills) */
        if (d == NULL)
            return NULL;
        for (uint32_t i = 0; i < t.n; i++) {
            PyObject *k = get_value(in, depth + 1);
            if (k == NULL || !PyUnicode_CheckExact(k)) {
                Py_XDECREF(k);
                Py_DECREF(d);
                return k == NULL ? NULL : corrupt();
            }
            PyObject *x = get_value(in, depth + 1);
            int rc = x == NULL ? -1 : PyDict_SetItem(d, k, x);
            Py_DECREF(k);
            Py_XDECREF(x);
            if (rc < 0) {
                Py_DECREF(d);
                return NULL;
            }
        }
        return d;
    }
    }
}

static PyObject *get_record(In *in)
{
    PyObject *argv[EVENT_NFIELDS] = {NULL};
    PyObject *res = NULL;
    for (int f = 0; f < EVENT_NFIELDS; f++)
        if ((argv[f] = get_value(in, 0)) == NULL)
            goto done;
    PyObject *ev = event_new(argv);
    if (ev != NULL)
        res = PyTuple_Pack(4, argv[KEY_EPOCH], argv[KEY_SEQ], argv[KEY_TS], ev);
    Py_XDECREF(ev);
done:
    for (int f = 0; f < EVENT_NFIELDS; f++)
        Py_XDECREF(argv[f]);
    return res;
}

static PyObject *py_unpack(PyObject *self, PyObject *arg)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "unpack: not configured");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    In in = {view.buf, (const unsigned char *)view.buf + view.len, PyList_New(0)};
    PyObject *out = NULL;
    uint32_t n;
    if (in.strs == NULL)
        goto done;
    if (get_u32(&in, &n) < 0 || (size_t)(in.end - in.p) < (size_t)n * EVENT_NFIELDS) {
        corrupt();
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *r = get_record(&in);
        if (r == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, r);
    }
    if (in.p != in.end) {
        Py_CLEAR(out);
        corrupt();
    }
done:
    Py_XDECREF(in.strs);
    PyBuffer_Release(&view);
    return out;
}

/* -- merge ----------------------------------------------------------------------------------------------------- */

/* merge(runs, ts_field=None) -> iterator: heapq.merge(*runs, key=...) lazily as the twin (each run's first item
 * taken at the first next(), a run's next item once the one it gave was taken) and stably (ties come in the order of
 * the runs). Without ts_field the runs hold records (tuples of three items at least), keyed by itemgetter(0, 1, 2)
 * (sortedruns.RECORD_KEY): the keys compare as tuples do (== then <; exact ints of 64 bits without a call). With it
 * they hold Events, keyed as otlpfile.merge_key keys them: the ts_field entry of Event.fields when it is an int (not
 * a bool), else Event.ts. An item of another kind is a TypeError. */

typedef struct {
    PyObject *rec;
    PyObject *key;    /* (ts_field mode) the Event's key, a new reference */
    Py_ssize_t run;
} Head;

typedef struct {
    PyObject_HEAD
    PyObject *runs;   /* tuple of iterators, by run */
    PyObject *ts_field;   /* NULL: records by (epoch, seq, ts); else Events by merge_key */
    Head *heap;
    Py_ssize_t n;     /* heads in the heap */
    Py_ssize_t taken; /* run of the record given last (-1: none: prime, or already advanced) */
    int primed;
} Merge;

static PyTypeObject Merge_Type;

/* two keys compared as a tuple's items are: -1 (p's less), 0 (equal), 1 (p's greater), or ERR with an exception
 * set (exact ints of 64 bits without a call; else == then <, by < alone, as a tuple's comparison does) */
#define ERR (-2)

static int one_cmp(PyObject *p, PyObject *q)
{
    if (p == q)
        return 0;
    if (PyLong_CheckExact(p) && PyLong_CheckExact(q)) {
        int o1, o2;
        long long u = PyLong_AsLongLongAndOverflow(p, &o1), v = PyLong_AsLongLongAndOverflow(q, &o2);
        if (!o1 && !o2)
            return u < v ? -1 : u > v;
    }
    int eq = PyObject_RichCompareBool(p, q, Py_EQ);
    if (eq < 0)
        return ERR;
    if (eq)
        return 0;
    int lt = PyObject_RichCompareBool(p, q, Py_LT);
    return lt < 0 ? ERR : lt ? -1 : 1;
}

/* the keys (first three items) of records a and b compared as tuples are: the first items that differ decide */
static int key_cmp(PyObject *a, PyObject *b)
{
    for (int i = 0; i < 3; i++) {
        int c = one_cmp(PyTuple_GET_ITEM(a, i), PyTuple_GET_ITEM(b, i));
        if (c != 0)
            return c;
    }
    return 0;
}

/* head a before head b: 1, 0, or -1 with an exception set (ties: the earlier run first) */
static int head_less(const Head *a, const Head *b)
{
    int c = a->key != NULL ? one_cmp(a->key, b->key) : key_cmp(a->rec, b->rec);
    if (c == ERR)
        return -1;
    return c < 0 || (c == 0 && a->run < b->run);
}

static int sift_down(Merge *m, Py_ssize_t i)
{
    Head *h = m->heap;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, small = i;
        if (l >= m->n)
            return 0;
        int lt = head_less(&h[l], &h[small]);
        if (lt < 0)
            return -1;
        if (lt)
            small = l;
        if (l + 1 < m->n) {
            lt = head_less(&h[l + 1], &h[small]);
            if (lt < 0)
                return -1;
            if (lt)
                small = l + 1;
        }
        if (small == i)
            return 0;
        Head t = h[i];
        h[i] = h[small];
        h[small] = t;
        i = small;
    }
}

/* rec (a new reference, stolen) as head h of m, its key taken: 0, or -1 with an exception set (rec released) */
static int set_head(Merge *m, Head *h, PyObject *rec)
{
    PyObject *key = NULL;
    if (m->ts_field == NULL) {
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 3) {
            PyErr_SetString(PyExc_TypeError, "merge: records must be tuples of (epoch, seq, ts, ...)");
            Py_DECREF(rec);
            return -1;
        }
    } else {
        PyObject *fields = event_slot(rec, 5), *ts = event_slot(rec, KEY_TS);
        if (fields == NULL || ts == NULL || !PyDict_CheckExact(fields)) {
            PyErr_SetString(PyExc_TypeError, "merge: the runs must hold Events (with a fields dict)");
            Py_DECREF(rec);
            return -1;
        }
        key = PyDict_GetItemWithError(fields, m->ts_field);
        if (key == NULL && PyErr_Occurred()) {
            Py_DECREF(rec);
            return -1;
        }
        key = Py_NewRef(key != NULL && PyLong_CheckExact(key) ? key : ts);   /* (type(t) is int: not a bool) */
    }
    Py_XSETREF(h->rec, rec);
    Py_XSETREF(h->key, key);
    return 0;
}

/* the next item of the top head's run into its slot, or the slot dropped at the run's end */
static int advance_top(Merge *m)
{
    PyObject *rec = PyIter_Next(PyTuple_GET_ITEM(m->runs, m->heap[0].run));
    if (rec == NULL) {
        if (PyErr_Occurred())
            return -1;
        Py_CLEAR(m->heap[0].rec);
        Py_CLEAR(m->heap[0].key);
        m->heap[0] = m->heap[--m->n];
        m->heap[m->n].rec = m->heap[m->n].key = NULL;
    } else if (set_head(m, &m->heap[0], rec) < 0) {
        return -1;
    }
    return sift_down(m, 0);
}

static int prime(Merge *m)
{
    Py_ssize_t k = PyTuple_GET_SIZE(m->runs);
    for (Py_ssize_t r = 0; r < k; r++) {
        PyObject *rec = PyIter_Next(PyTuple_GET_ITEM(m->runs, r));
        if (rec == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        if (set_head(m, &m->heap[m->n], rec) < 0)
            return -1;
        m->heap[m->n].run = r;
        m->n++;
    }
    for (Py_ssize_t i = m->n / 2 - 1; i >= 0; i--)
        if (sift_down(m, i) < 0)
            return -1;
    return 0;
}

static PyObject *Merge_next(Merge *m)
{
    if (!m->primed) {
        m->primed = 1;
        if (prime(m) < 0)
            return NULL;
    } else if (m->taken >= 0) {
        m->taken = -1;
        if (advance_top(m) < 0)
            return NULL;
    }
    if (m->n == 0)
        return NULL;
    m->taken = m->heap[0].run;
    return Py_NewRef(m->heap[0].rec);
}

static PyObject *Merge_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *runs, *ts_field = Py_None;
    static char *kwlist[] = {"runs", "ts_field", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:merge", kwlist, &runs, &ts_field))
        return NULL;
    if (ts_field != Py_None && !PyUnicode_CheckExact(ts_field)) {
        PyErr_SetString(PyExc_TypeError, "merge: ts_field must be a str or None");
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(runs);
    if (seq == NULL)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(seq);
    PyObject *its = PyTuple_New(k);
    for (Py_ssize_t r = 0; its != NULL && r < k; r++) {
        PyObject *it = PyObject_GetIter(PyTuple_GET_ITEM(seq, r));
        if (it == NULL)
            Py_CLEAR(its);
        else
            PyTuple_SET_ITEM(its, r, it);
    }
    Py_DECREF(seq);
    if (its == NULL)
        return NULL;
    Merge *m = PyObject_GC_New(Merge, type);
    if (m == NULL) {
        Py_DECREF(its);
        return NULL;
    }
    m->runs = its;
    m->ts_field = ts_field == Py_None ? NULL : Py_NewRef(ts_field);
    m->heap = PyMem_Calloc(k ? k : 1, sizeof(Head));
    m->n = 0;
    m->taken = -1;
    m->primed = 0;
    if (m->heap == NULL) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

static int Merge_traverse(Merge *m, visitproc visit, void *arg)
{
    Py_VISIT(m->runs);
    for (Py_ssize_t i = 0; m->heap != NULL && i < m->n; i++) {
        Py_VISIT(m->heap[i].rec);
        Py_VISIT(m->heap[i].key);
    }
    return 0;
}

static int Merge_clear(Merge *m)
{
    for (Py_ssize_t i = 0; m->heap != NULL && i < m->n; i++) {
        Py_CLEAR(m->heap[i].rec);
        Py_CLEAR(m->heap[i].key);
    }
    m->n = 0;
    Py_CLEAR(m->runs);
    Py_CLEAR(m->ts_field);
    return 0;
}

static void Merge_dealloc(Merge *m)
{
    PyObject_GC_UnTrack(m);
    Merge_clear(m);
    PyMem_Free(m->heap);
    PyObject_GC_Del(m);
}

static PyTypeObject Merge_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_sortedruns.merge",
    .tp_basicsize = sizeof(Merge),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "merge(runs, ts_field=None): heapq.merge(*runs, key=...) of records or Events, in C",
    .tp_new = Merge_new,
    .tp_traverse = (traverseproc)Merge_traverse,
    .tp_clear = (inquiry)Merge_clear,
    .tp_dealloc = (destructor)Merge_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Merge_next,
};

/* -- merge of packed runs ------------------------------------------------------------------------------------ */

/* merge_packed(runs, chunk, write) -> bool: the merge of sorted runs (each an iterator of the packed chunks pack
 * wrote, in order) by (epoch, seq, ts), stably, as merge(runs of the records unpack gives) then pack of every chunk
 * records would give, without a Python object per record: each record's bytes are copied into new chunks of `chunk`
 * records, its texts re-entered in the new chunk's string table. write(count, data) takes each new chunk. False,
 * at the first record whose epoch, seq or ts is not an int64 (the caller merges the records instead: what was
 * written is left unused); a ValueError for bytes pack did not write. */

typedef struct {
    const unsigned char *p;
    uint32_t n;
} Span;

typedef struct {
    PyObject *it;          /* the run's chunks */
    PyObject *chunk;       /* the chunk read now (bytes) */
    const unsigned char *p, *end;
    uint32_t left;         /* records of the chunk not yet scanned */
    Span *strs;            /* the chunk's string table, as far as scanned */
    Py_ssize_t nstrs, cap;
    const unsigned char *rec;   /* the head record's bytes: rec[0:rec_n] */
    size_t rec_n;
    long long key[3];      /* its (epoch, seq, ts) */
} Cursor;

enum { SCAN_OK = 1, SCAN_END = 0, SCAN_ERR = -1, SCAN_NOT_RAW = -2 };

static int scan_value(Cursor *c, int depth, int want_int, long long *out)
{
    Tok t;
    if (depth > MAX_DEPTH || read_tok(&c->p, c->end, &t) < 0)
        return SCAN_ERR;
    if (want_int) {
        if (t.type != V_INT)
            return SCAN_NOT_RAW;
        *out = t.ival;
    }
    if (t.type == V_STR) {
        if (c->nstrs == c->cap) {
            Py_ssize_t cap = c->cap ? 2 * c->cap : 64;
            Span *sp = PyMem_Realloc(c->strs, (size_t)cap * sizeof(Span));
            if (sp == NULL) {
                PyErr_NoMemory();
                return SCAN_ERR;
            }
            c->strs = sp;
            c->cap = cap;
        }
        c->strs[c->nstrs].p = t.body;
        c->strs[c->nstrs++].n = t.n;
    } else if (t.type == V_REF && t.n >= (uint32_t)c->nstrs) {
        return SCAN_ERR;
    }
    for (uint64_t i = 0; i < t.kids; i++) {
        int r = scan_value(c, depth + 1, 0, NULL);
        if (r != SCAN_OK)
            return r;
    }
    return SCAN_OK;
}

/* the run's next record as its head: SCAN_OK, SCAN_END (the run has no more), SCAN_NOT_RAW, or SCAN_ERR (an
 * exception set) */
static int next_record(Cursor *c)
{
    while (c->left == 0) {
        PyObject *chunk = PyIter_Next(c->it);
        if (chunk == NULL)
            return PyErr_Occurred() ? SCAN_ERR : SCAN_END;
        if (!PyBytes_CheckExact(chunk)) {
            Py_DECREF(chunk);
            PyErr_SetString(PyExc_TypeError, "merge_packed: the runs must give the bytes of packed chunks");
            return SCAN_ERR;
        }
        Py_XSETREF(c->chunk, chunk);
        c->p = (const unsigned char *)PyBytes_AS_STRING(chunk);
        c->end = c->p + PyBytes_GET_SIZE(chunk);
        c->nstrs = 0;
        if (c->end - c->p < 4)
            goto corrupt;
        c->left = le32(c->p);
        c->p += 4;
        if (c->left == 0 && c->p != c->end)
            goto corrupt;
    }
    c->rec = c->p;
    for (int f = 0; f < EVENT_NFIELDS; f++) {
        int key = f == KEY_EPOCH ? 0 : f == KEY_SEQ ? 1 : f == KEY_TS ? 2 : -1;
        int r = scan_value(c, 0, key >= 0, key >= 0 ? &c->key[key] : NULL);
        if (r == SCAN_NOT_RAW)
            return r;
        if (r != SCAN_OK)
            goto corrupt;
    }
    c->rec_n = (size_t)(c->p - c->rec);
    if (--c->left == 0 && c->p != c->end)
        goto corrupt;
    return SCAN_OK;
corrupt:
    if (!PyErr_Occurred())
        corrupt();
    return SCAN_ERR;
}

/* the new chunk being written: the records' bytes, its string table a hash set of the texts written in it (by
 * their offset in the buffer: the texts live there) */
typedef struct {
    size_t off;
    uint32_t n, ix;
} Text;

typedef struct {
    Out o;            /* (its strs and seen unused) */
    Text *texts;      /* open addressing, cap a power of two, at most half full */
    size_t cap, used;
    uint32_t count;
} NewChunk;

static uint64_t text_hash(const unsigned char *p, uint32_t n)
{
    uint64_t h = 1469598103934665603ULL;   /* FNV-1a */
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static int put_text(NewChunk *w, const unsigned char *p, uint32_t n)
{
    if (2 * (w->used + 1) > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        Text *t = PyMem_Calloc(cap, sizeof(Text));
        if (t == NULL) {
            PyErr_NoMemory();
            return FAILED;
        }
        for (size_t i = 0; i < w->cap; i++)
            if (w->texts[i].n || w->texts[i].off) {
                Text e = w->texts[i];
                size_t j = text_hash((const unsigned char *)w->o.p + e.off, e.n) & (cap - 1);
                while (t[j].n || t[j].off)
                    j = (j + 1) & (cap - 1);
                t[j] = e;
            }
        PyMem_Free(w->texts);
        w->texts = t;
        w->cap = cap;
    }
    size_t j = text_hash(p, n) & (w->cap - 1);
    while (w->texts[j].n || w->texts[j].off) {   /* (a slot is empty when both are 0: no text sits at offset 0) */
        Text e = w->texts[j];
        if (e.n == n && memcmp(w->o.p + e.off, p, n) == 0)
            return put_u32(&w->o, V_REF, e.ix);
        j = (j + 1) & (w->cap - 1);
    }
    int r = put_u32(&w->o, V_STR, n);
    if (r != PACKED)
        return r;
    size_t off = w->o.n;
    if ((r = put(&w->o, p, n)) != PACKED)
        return r;
    w->texts[j].off = off;
    w->texts[j].n = n;
    w->texts[j].ix = (uint32_t)w->used++;
    return PACKED;
}

/* one value of the head record of c (at *pp) into w, its texts re-entered: PACKED or FAILED (the bytes were
 * scanned already: they are whole) */
static int copy_value(Cursor *c, const unsigned char **pp, NewChunk *w)
{
    const unsigned char *head = *pp;
    Tok t;
    if (read_tok(pp, c->end, &t) < 0)   /* (cannot fail: scan_value read the same bytes) */
        return FAILED;
    int r;
    if (t.type == V_STR)
        r = put_text(w, t.body, t.n);
    else if (t.type == V_REF)
        r = put_text(w, c->strs[t.n].p, c->strs[t.n].n);
    else   /* the head's bytes as they are: a value, or a container's type and length */
        r = put(&w->o, head, (size_t)(*pp - head));
    for (uint64_t i = 0; r == PACKED && i < t.kids; i++)
        r = copy_value(c, pp, w);
    return r;
}

static int cursor_less(const Cursor *a, Py_ssize_t ia, const Cursor *b, Py_ssize_t ib)
{
    for (int i = 0; i < 3; i++)
        if (a->key[i] != b->key[i])
            return a->key[i] < b->key[i];
    return ia < ib;
}

static void sift_cursors(Cursor *cur, Py_ssize_t *heap, Py_ssize_t n, Py_ssize_t i)
{
    for (;;) {
        Py_ssize_t l = 2 * i + 1, small = i;
        if (l < n && cursor_less(&cur[heap[l]], heap[l], &cur[heap[small]], heap[small]))
            small = l;
        if (l + 1 < n && cursor_less(&cur[heap[l + 1]], heap[l + 1], &cur[heap[small]], heap[small]))
            small = l + 1;
        if (small == i)
            return;
        Py_ssize_t t = heap[i];
        heap[i] = heap[small];
        heap[small] = t;
        i = small;
    }
}

static int flush_chunk(NewChunk *w, PyObject *write)
{
    if (w->count == 0)
        return 0;
    unsigned char *b = (unsigned char *)w->o.p;
    for (int i = 0; i < 4; i++)
        b[i] = (unsigned char)(w->count >> (8 * i));
    PyObject *res = PyObject_CallFunction(write, "Iy#", (unsigned int)w->count, w->o.p, (Py_ssize_t)w->o.n);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    w->o.n = 4;   /* (the count's place) */
    w->count = 0;
    w->used = 0;
    memset(w->texts, 0, w->cap * sizeof(Text));
    return 0;
}

static PyObject *py_merge_packed(PyObject *self, PyObject *args)
{
    PyObject *runs, *write;
    unsigned int per_chunk;
    if (!PyArg_ParseTuple(args, "OIO:merge_packed", &runs, &per_chunk, &write))
        return NULL;
    PyObject *seq = PySequence_Tuple(runs);
    if (seq == NULL)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(seq), live = 0;
    Cursor *cur = PyMem_Calloc(k ? k : 1, sizeof(Cursor));
    Py_ssize_t *heap = PyMem_Calloc(k ? k : 1, sizeof(Py_ssize_t));
    NewChunk w;
    memset(&w, 0, sizeof(w));
    PyObject *res = NULL;
    int st = SCAN_OK;
    if (cur == NULL || heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < k; r++)
        if ((cur[r].it = PyObject_GetIter(PyTuple_GET_ITEM(seq, r))) == NULL)
            goto done;
    if (put_count(&w.o, 0) != PACKED)   /* the count's place */
        goto done;
    for (Py_ssize_t r = 0; r < k; r++) {
        st = next_record(&cur[r]);
        if (st == SCAN_OK)
            heap[live++] = r;
        else if (st != SCAN_END)
            goto done;
    }
    for (Py_ssize_t i = live / 2 - 1; i >= 0; i--)
        sift_cursors(cur, heap, live, i);
    while (live > 0) {
        Cursor *c = &cur[heap[0]];
        const unsigned char *p = c->rec;
        for (int f = 0; f < EVENT_NFIELDS; f++)
            if (copy_value(c, &p, &w) != PACKED)
                goto done;
        if (++w.count >= per_chunk && flush_chunk(&w, write) < 0)
            goto done;
        st = next_record(c);
        if (st == SCAN_END)
            heap[0] = heap[--live];
        else if (st != SCAN_OK)
            goto done;
        sift_cursors(cur, heap, live, 0);
    }
    st = SCAN_OK;
    if (flush_chunk(&w, write) < 0)
        goto done;
    res = Py_NewRef(Py_True);
done:
    if (res == NULL && !PyErr_Occurred()) {   /* (declined, or a length past 32 bits: not written by pack) */
        if (st == SCAN_NOT_RAW)
            res = Py_NewRef(Py_False);
        else
            corrupt();
    }
    for (Py_ssize_t r = 0; cur != NULL && r < k; r++) {
        Py_XDECREF(cur[r].it);
        Py_XDECREF(cur[r].chunk);
        PyMem_Free(cur[r].strs);
    }
    PyMem_Free(cur);
    PyMem_Free(heap);
    PyMem_Free(w.o.p);
    PyMem_Free(w.texts);
    Py_DECREF(seq);
    return res;
}

/* -- seq bits -------------------------------------------------------------------------------------------------- */

/* mark_seqs(bits, records, limit) -> clash: SeqBits.add's loop (its twin, SeqBits._add_py) over records (tuples
 * (epoch, seq, ...)): each seq's bit set in the bytearray bits, grown as the twin grows it (to at least the byte
 * needed, at least doubled, zeroed); True at the first seq that is not an exact int in [0, limit) or whose bit was
 * set already (the records after it are not looked at), else False. */
static PyObject *py_mark_seqs(PyObject *self, PyObject *args)
{
    PyObject *bits, *records;
    long long limit;
    if (!PyArg_ParseTuple(args, "O!O!L:mark_seqs", &PyByteArray_Type, &bits, &PyList_Type, &records, &limit))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PyList_GET_ITEM(records, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 2) {
            PyErr_SetString(PyExc_TypeError, "mark_seqs: records must be tuples of (epoch, seq, ...)");
            return NULL;
        }
        PyObject *seq = PyTuple_GET_ITEM(t, 1);
        if (!PyLong_CheckExact(seq))
            Py_RETURN_TRUE;
        int overflow;
        long long q = PyLong_AsLongLongAndOverflow(seq, &overflow);
        if (overflow || q < 0 || q >= limit)
            Py_RETURN_TRUE;
        Py_ssize_t i = (Py_ssize_t)(q >> 3), len = PyByteArray_GET_SIZE(bits);
        if (i >= len) {
            Py_ssize_t grow = i + 1 - len > len ? i + 1 - len : len;
            if (PyByteArray_Resize(bits, len + grow) < 0)
                return NULL;
            memset(PyByteArray_AS_STRING(bits) + len, 0, (size_t)grow);
        }
        unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(bits) + i, bit = (unsigned char)(1u << (q & 7));
        int seen = (*b & bit) != 0;
        *b |= bit;
        if (seen)
            Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* -- module ---------------------------------------------------------------------------------------------------- */

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    PyObject *rng, *ev, *tracker, *tags, *slots;
    if (!PyArg_ParseTuple(args, "OOOOO:configure", &rng, &ev, &tracker, &tags, &slots))
        return NULL;
    if (!PyType_Check(rng) || !PyType_IsSubtype((PyTypeObject *)rng, &PyTuple_Type) ||
        ((PyTypeObject *)rng)->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "configure: Rng must be a tuple subclass without instance dicts");
        return NULL;
    }
    configured = 0;
    if (event_configure(ev, tracker, tags, slots) < 0)
        return NULL;
    Py_INCREF(rng);
    Py_XSETREF(rng_type, rng);
    configured = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS, "configure(Rng, Event, EpochTracker, epoch_tags, event_slots)"},
    {"pack", py_pack, METH_O, "pack(records) -> bytes | None (None: pickle them)"},
    {"unpack", py_unpack, METH_O, "unpack(data) -> [(epoch, seq, ts, Event), ...]"},
    {"merge_packed", py_merge_packed, METH_VARARGS,
     "merge_packed(runs, chunk, write) -> bool (False: a key not an int64; merge the records instead)"},
    {"mark_seqs", py_mark_seqs, METH_VARARGS, "mark_seqs(bits, records, limit) -> clash (SeqBits.add's loop)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sortedruns", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sortedruns(void)
{
    if (PyType_Ready(&Merge_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "merge", (PyObject *)&Merge_Type) < 0)
        Py_CLEAR(m);
    return m;
}
