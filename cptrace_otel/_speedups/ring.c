/* The record ring: records encoded on the caller's thread into shared memory that the exporter process reads, so
 * that no thread of the traced process renders or pickles them (docs/performance.md, "the native record path").
 *
 * Layout of the shared buffer (a memfd mapped by both processes; little-endian, the machine's own):
 *   0    u64 magic, u64 cap (data bytes, a power of two)
 *   64   producer line: u64 write_pos, u64 dropped, u64 side_next, u64 written      (written by the traced process)
 *   128  consumer line: u64 read_pos, u64 consumed, u64 free_pos, u64 reader       (written by the exporter)
 *   256  cap bytes of records
 * Positions count bytes for ever (offset = pos & (cap - 1)). A record is 8-aligned and never wraps: when it does
 * not fit before the end, a PAD record fills the end and it starts at offset 0. Record: u32 size, u16 kind, u16
 * nfields, then
 *   REC  i64 ts_ns, i64 level, tag, nfields x (key, value); a string is a varint length + UTF-8; a value is one
 *        byte 'i' (i64), 'f' (f64), 's' (string), 'T' / 'F' (the bools, read back as the strs "True" / "False")
 *   PH   u64 side id: the record at this place went to the side deque (a value of another shape); the exporter
 *        gets it, rendered by the drainer, as the side id-th SIDE item, and puts it here, so order is kept
 *   PAD  nothing
 * One producer at a time: every producer holds the GIL and nothing here releases it or runs Python code between
 * reserving and publishing. write_pos is published with a release store after the bytes; the reader loads it with
 * an acquire load, and publishes read_pos (release) once it has copied the records out; the producer's free-space
 * check loads free_pos (<= read_pos) with an acquire load. A full ring (or side deque) drops the record and counts
 * it (dropped).
 *
 * Giving pages back: a ring that has wrapped would keep all its pages resident (cap bytes of shared memory per
 * traced process, for ever). The reader gives back the consumed span [free_pos, read_pos) in whole pages
 * (madvise MADV_REMOVE: a punched hole in the memfd, unmapped in both processes) once it is at least `punch` bytes,
 * and only then moves free_pos to the start of read_pos's page: the producer never writes into a span while it is
 * being punched, because it may only write below free_pos + cap. Without punching (punch 0) free_pos = read_pos.
 * So the ring holds about `punch` bytes plus what is unread, and each page given back is faulted in anew when the
 * producer next writes it: on this project's VM a fresh shared page costs 7-8 µs to fault in, 0.25-0.3 µs a record
 * of ~140 bytes.
 *
 * No resident window: a producer that went back to the ring's start early (behind a PAD to the end) to stay on
 * pages already mapped would leave a burst only the bytes before the PAD until the reader skipped it (measured:
 * 19-71% of 600k records lost in bursts with an 8 MiB window, against a saving of ~0.1 µs a record), so a record
 * goes back to offset 0 only when it does not fit before the end.
 *
 * One reader: `reader` is the token of the worker that claimed the ring last (ring_claim); ring_read by any other
 * token reads nothing (returns None), so a worker that outlives its replacement cannot take records from it. (The
 * traced process also kills and reaps a worker before it starts the next one: traced/channels.py.)
 *
 * What is encoded (else the side path): an exact int within int64, an exact str that encodes as UTF-8, an exact
 * float, a bool, a list or tuple (exact) of at most 64 exact ints within int64 (encoded as its upstream rendering
 * "[a,b]", the str the drainer would make of it); at most 64 fields, an exact str tag other than the side tag given
 * to ring_attach (the config record: the drainer reads the rank there), a record of at most max_rec bytes (64 KiB,
 * or an eighth of the ring). The side deque holds (ts, level, tag,
 * fields) items exactly as the deque path's; it is bounded by a count (qcap) and by an estimate of its bytes (qbytes:
 * the deque path's estimate, traced/rendering.py's, made for every side record; as the drainer takes items from the
 * front, the sum is scaled to those left, as the deque path does), so large values that take the side path (a str
 * record over max_rec) cannot grow it without bound.
 *
 * Twin: cptrace_otel.model.records.compact_item
 * Held equal by: tests/unit/test_ring.py
 */
#include "ring.h"
#include "grammar.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* the layout's constants: cptrace_otel/model/grammar (RingLayout), generated into grammar.h */
#define MAGIC CPTRACE_RING_MAGIC
#define HDR CPTRACE_RING_HEADER_BYTES
#define MAXF CPTRACE_RING_MAX_FIELDS
#define MAXLIST CPTRACE_RING_MAX_LIST
#define K_REC CPTRACE_RING_KIND_REC
#define K_PH CPTRACE_RING_KIND_PH
#define K_PAD CPTRACE_RING_KIND_PAD
#define ALIGN CPTRACE_RING_ALIGN
#define MIN_CAP CPTRACE_RING_MIN_CAP
#define PH_BYTES CPTRACE_RING_PLACEHOLDER_BYTES
#define REC_HDR CPTRACE_RING_RECORD_HEADER
#define REC_FIXED (REC_HDR + 16) /* the record header, i64 ts_ns, i64 level */
#define MAX_REC CPTRACE_RING_MAX_RECORD
#define MAX_SHARE CPTRACE_RING_MAX_RECORD_SHARE
#define V_INT CPTRACE_RING_V_INT
#define V_FLOAT CPTRACE_RING_V_FLOAT
#define V_STR CPTRACE_RING_V_STR
#define V_TRUE CPTRACE_RING_V_TRUE
#define V_FALSE CPTRACE_RING_V_FALSE

typedef struct {
    uint64_t magic, cap, pad0[6];
    uint64_t write_pos, dropped, side_next, written, pad1[4];
    uint64_t read_pos, consumed, free_pos, reader, pad2[4];
} ring_hdr;
_Static_assert(offsetof(ring_hdr, write_pos) == CPTRACE_RING_PRODUCER_LINE, "the producer's line");
_Static_assert(offsetof(ring_hdr, read_pos) == CPTRACE_RING_CONSUMER_LINE, "the consumer's line");
_Static_assert(sizeof(ring_hdr) <= HDR, "the header");
_Static_assert(REC_HDR == sizeof(uint32_t) + 2 * sizeof(uint16_t), "a record header: u32 size, u16 kind, u16 nf");
_Static_assert(PH_BYTES == REC_HDR + sizeof(uint64_t), "a placeholder: its header and the u64 side id");
_Static_assert(ALIGN >= REC_HDR && (ALIGN & (ALIGN - 1)) == 0, "records are aligned to a power of two");

PyObject *ring_put_fn = NULL;

static struct {
    Py_buffer view;
    ring_hdr *h; /* NULL: not attached */
    unsigned char *data;
    uint64_t cap, max_rec;
    PyObject *deque, *append; /* the side deque and its bound append */
    PyObject *wake; /* called after an append to the empty side deque (the drainer's wake-up; C, may be NULL) */
    Py_ssize_t qcap;
    uint64_t qbytes_max, qbytes, qn; /* the side deque's byte bound, estimated bytes of its qn newest items */
    PyObject *side_tag; /* records of this tag always take the side path (the drainer reads them) */
    const char *st_p;
    Py_ssize_t st_n;
} R;

static PyObject *s_true, *s_false;

static inline uint64_t load_acq(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store_rel(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* ring_clock(fn): records are stamped with fn() instead of CLOCK_REALTIME. For benchmarks that compare two trees'
 * bytes (bench/same_behaviour.py gives the traced process a fixed clock); NULL, the default, costs one branch. */
static PyObject *clock_fn;

static int64_t now_ns(void) {
    if (clock_fn != NULL) { /* called before any reservation: the Python code it runs may release the GIL */
        PyObject *r = PyObject_CallNoArgs(clock_fn);
        if (r != NULL) {
            long long v = PyLong_AsLongLong(r);
            Py_DECREF(r);
            if (!(v == -1 && PyErr_Occurred())) return (int64_t)v;
        }
        PyErr_Clear(); /* a clock that fails: the real one */
    }
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t); /* what time.time_ns reads */
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static size_t vlen(uint64_t n) { size_t k = 1; while (n >= 0x80) { n >>= 7; k++; } return k; }
static unsigned char *put_v(unsigned char *p, uint64_t n) {
    while (n >= 0x80) { *p++ = (unsigned char)(n | 0x80); n >>= 7; }
    *p++ = (unsigned char)n;
    return p;
}

typedef struct { const char *p; Py_ssize_t n; int64_t i; double f; char k; } fv_t;

/* One value's encoding into *o: 1, or 0 when it has another shape (side path). Runs no Python code. */
static int classify(PyObject *v, fv_t *o, char **scr, char *scr_end) {
    if (PyLong_CheckExact(v)) {
        int ovf;
        long long x = PyLong_AsLongLongAndOverflow(v, &ovf);
        if (ovf || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
        o->k = V_INT; o->i = x;
        return 1;
    }
    if (PyUnicode_CheckExact(v)) {
        o->p = PyUnicode_AsUTF8AndSize(v, &o->n);
        if (o->p == NULL) { PyErr_Clear(); return 0; } /* lone surrogates */
        o->k = V_STR;
        return 1;
    }
    if (v == Py_True || v == Py_False) { o->k = v == Py_True ? V_TRUE : V_FALSE; return 1; }
    if (PyFloat_CheckExact(v)) { o->k = V_FLOAT; o->f = PyFloat_AS_DOUBLE(v); return 1; }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (n > MAXLIST || scr_end - *scr < 2 + 21 * (n ? n : 1)) return 0;
        PyObject **it = PySequence_Fast_ITEMS(v);
        char *p = *scr;
        o->p = p;
        *p++ = '[';
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!PyLong_CheckExact(it[i])) return 0;
            int ovf;
            long long x = PyLong_AsLongLongAndOverflow(it[i], &ovf);
            if (ovf || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
            if (i) *p++ = ',';
            p += snprintf(p, 21, "%lld", x);
        }
        *p++ = ']';
        o->n = p - o->p;
        o->k = V_STR;
        *scr = p;
        return 1;
    }
    return 0;
}

/* Reserve size bytes (a multiple of 8) at the write position, padding the end when it does not fit there; the
 * record's offset, or -1 when the ring is full. Nothing is published. *next gets the new write position. */
static int64_t reserve(uint64_t size, uint64_t *next) {
    ring_hdr *h = R.h;
    uint64_t w = h->write_pos, r = load_acq(&h->free_pos);
    uint64_t off = w & (R.cap - 1), tail = R.cap - off, need = size;
    int wrap = size > tail;
    if (wrap) need = tail + size;
    if (w - r + need > R.cap) return -1;
    if (wrap) {
        uint32_t hd[2] = {(uint32_t)tail, K_PAD};
        memcpy(R.data + off, hd, REC_HDR);
        off = 0;
    }
    *next = w + need;
    return (int64_t)off;
}

static void write_hdr(unsigned char *p, uint64_t size, uint16_t kind, uint16_t nf) {
    uint32_t s = (uint32_t)size;
    memcpy(p, &s, 4);
    memcpy(p + 4, &kind, 2);
    memcpy(p + 6, &nf, 2);
}

/* Rough bytes one side record holds (traced/rendering.py's estimate): a constant per record and field plus its
 * strings' and lists' lengths. Runs no Python code. */
static uint64_t side_estimate(PyObject *fields) {
    uint64_t n = CPTRACE_SIDE_BASE + CPTRACE_SIDE_PER_FIELD * (uint64_t)PyDict_GET_SIZE(fields);
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(fields, &pos, &k, &v)) {
        if (PyUnicode_CheckExact(v)) n += (uint64_t)PyUnicode_GET_LENGTH(v);
        else if (PyBytes_CheckExact(v)) n += (uint64_t)PyBytes_GET_SIZE(v);
        else if (PyList_CheckExact(v) || PyTuple_CheckExact(v))
            n += CPTRACE_SIDE_PER_ITEM * (uint64_t)PySequence_Fast_GET_SIZE(v);
    }
    return n;
}

/* The side path: (ts, level, tag, fields) onto the deque with a placeholder in the ring, published only once the
 * append succeeded (so every published placeholder has its item). Steals nothing. */
static int side_put(PyObject *level, PyObject *tag, PyObject *fields, int64_t ts) {
    PyObject *t = PyLong_FromLongLong(ts);
    if (t == NULL) return -1;
    PyObject *item = PyTuple_Pack(4, t, level, tag, fields); /* (allocations first: they may run the collector) */
    Py_DECREF(t);
    if (item == NULL) return -1;
    if (R.h == NULL) { Py_DECREF(item); return 0; } /* detached meanwhile (a collector run did it) */
    Py_ssize_t n = PySequence_Size(R.deque);
    uint64_t next;
    int64_t off;
    if (n < 0) { Py_DECREF(item); return -1; }
    if ((uint64_t)n < R.qn) { /* the drainer took items from the front: scale the sum to those left */
        R.qbytes = n ? (uint64_t)((double)R.qbytes * (double)n / (double)R.qn) : 0;
        R.qn = (uint64_t)n;
    }
    uint64_t est = side_estimate(fields);
    if (n >= R.qcap || R.qbytes + est > R.qbytes_max || (off = reserve(PH_BYTES, &next)) < 0) {
        R.h->dropped++;
        Py_DECREF(item);
        return 0;
    }
    write_hdr(R.data + off, PH_BYTES, K_PH, 0);
    uint64_t id = R.h->side_next;
    memcpy(R.data + off + REC_HDR, &id, 8);
    PyObject *r = PyObject_CallOneArg(R.append, item); /* deque.append: C, allocates no Python object */
    Py_DECREF(item);
    if (r == NULL) { R.h->dropped++; return -1; }
    Py_DECREF(r);
    R.qbytes += est;
    R.qn++;
    R.h->side_next = id + 1;
    store_rel(&R.h->write_pos, next);
    if (n == 0 && R.wake != NULL) { /* the drainer waits for side records instead of polling for them */
        r = PyObject_CallNoArgs(R.wake); /* a lock's release: runs no Python code; raises when already set */
        if (r == NULL) PyErr_Clear();
        else Py_DECREF(r);
    }
    return 0;
}

/* keys[i]/vals[i], nf of them: encoded, or the side path (fields: the dict to put there, or NULL to build it). */
static int put(PyObject *level, PyObject *tag, PyObject *const *keys, PyObject *const *vals, Py_ssize_t nf,
               PyObject *fields) {
    int64_t ts = now_ns();
    if (R.h == NULL) return 0;
    static char scratch[4096];
    char *scr = scratch;
    fv_t fv[MAXF], kv[MAXF];
    const char *tp;
    Py_ssize_t tn;
    int ovf;
    long long lv = PyLong_CheckExact(level) ? PyLong_AsLongLongAndOverflow(level, &ovf) : (ovf = 1, 0);
    if (ovf || nf > MAXF || !PyUnicode_CheckExact(tag) || (tp = PyUnicode_AsUTF8AndSize(tag, &tn)) == NULL ||
        (tn == R.st_n && memcmp(tp, R.st_p, tn) == 0))
        goto side;
    uint64_t size = REC_FIXED + vlen((uint64_t)tn) + (uint64_t)tn;
    for (Py_ssize_t i = 0; i < nf; i++) {
        if (!PyUnicode_CheckExact(keys[i]) || (kv[i].p = PyUnicode_AsUTF8AndSize(keys[i], &kv[i].n)) == NULL ||
            !classify(vals[i], &fv[i], &scr, scratch + sizeof scratch))
            goto side;
        size += vlen((uint64_t)kv[i].n) + (uint64_t)kv[i].n + 1;
        char k = fv[i].k;
        size += (k == V_INT || k == V_FLOAT) ? 8 : k == V_STR ? vlen((uint64_t)fv[i].n) + (uint64_t)fv[i].n : 0;
        if (size > R.max_rec) goto side;
    }
    size = (size + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    uint64_t next;
    int64_t off = reserve(size, &next);
    if (off < 0) {
        R.h->dropped++;
        return 0;
    }
    unsigned char *p0 = R.data + off, *p = p0 + REC_HDR;
    int64_t lv64 = lv;
    memcpy(p, &ts, 8);
    memcpy(p + 8, &lv64, 8);
    p = put_v(p + 16, (uint64_t)tn);
    memcpy(p, tp, tn);
    p += tn;
    for (Py_ssize_t i = 0; i < nf; i++) {
        p = put_v(p, (uint64_t)kv[i].n);
        memcpy(p, kv[i].p, kv[i].n);
        p += kv[i].n;
        *p++ = (unsigned char)fv[i].k;
        if (fv[i].k == V_INT) { memcpy(p, &fv[i].i, 8); p += 8; }
        else if (fv[i].k == V_FLOAT) { memcpy(p, &fv[i].f, 8); p += 8; }
        else if (fv[i].k == V_STR) { p = put_v(p, (uint64_t)fv[i].n); memcpy(p, fv[i].p, fv[i].n); p += fv[i].n; }
    }
    write_hdr(p0, size, K_REC, (uint16_t)nf);
    R.h->written++;
    store_rel(&R.h->write_pos, next);
    return 0;
side:
    if (PyErr_Occurred()) PyErr_Clear();
    if (fields != NULL) return side_put(level, tag, fields, ts);
    PyObject *d = PyDict_New();
    if (d == NULL) return -1;
    for (Py_ssize_t i = 0; i < nf; i++)
        if (PyDict_SetItem(d, keys[i], vals[i]) < 0) { Py_DECREF(d); return -1; }
    int st = side_put(level, tag, d, ts);
    Py_DECREF(d);
    return st;
}

int ring_put_kw(PyObject *level, PyObject *tag, PyObject *const *vals, PyObject *kwnames) {
    Py_ssize_t nf = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    return put(level, tag, kwnames ? &PyTuple_GET_ITEM(kwnames, 0) : NULL, vals, nf, NULL);
}

/* ring_put(level, tag, fields): the submit function api installs while the ring is on (the Python gate, the
 * sampler and a C gate call with a drop set reach it). Never raises. */
static PyObject *py_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) Py_RETURN_NONE;
    PyObject *f = args[2];
    if (R.h == NULL) Py_RETURN_NONE;
    if (!PyDict_CheckExact(f)) { /* (the deque path drops and counts such a record in its drainer) */
        R.h->dropped++;
        Py_RETURN_NONE;
    }
    PyObject *keys[MAXF], *vals[MAXF];
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    int st;
    if (PyDict_GET_SIZE(f) > MAXF) {
        st = side_put(args[0], args[1], f, now_ns());
    } else {
        while (PyDict_Next(f, &pos, &k, &v)) { keys[i] = k; vals[i] = v; i++; }
        st = put(args[0], args[1], keys, vals, i, f);
    }
    if (st < 0) PyErr_Clear();
    Py_RETURN_NONE;
}

static ring_hdr *hdr_of(Py_buffer *b) {
    if (b->len < HDR) { PyErr_SetString(PyExc_ValueError, "ring: buffer too small"); return NULL; }
    ring_hdr *h = (ring_hdr *)b->buf;
    if (h->magic != MAGIC || h->cap < MIN_CAP || (h->cap & (h->cap - 1)) || (uint64_t)b->len < HDR + h->cap) {
        PyErr_SetString(PyExc_ValueError, "ring: not a ring buffer");
        return NULL;
    }
    return h;
}

/* ring_init(buf): a fresh ring over the whole writable buffer (its data part: the largest power of two). */
static PyObject *py_init(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_WRITABLE) < 0) return NULL;
    uint64_t cap = MIN_CAP;
    while (b.len >= HDR && cap * 2 <= (uint64_t)(b.len - HDR)) cap *= 2;
    if (b.len < HDR + MIN_CAP) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "ring: buffer too small");
        return NULL;
    }
    memset(b.buf, 0, HDR);
    ring_hdr *h = (ring_hdr *)b.buf;
    h->cap = cap;
    __atomic_store_n(&h->magic, MAGIC, __ATOMIC_RELEASE);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(cap);
}

static void detach(void) {
    if (R.h == NULL) return;
    R.h = NULL;
    PyBuffer_Release(&R.view);
    Py_CLEAR(R.append);
    Py_CLEAR(R.deque);
    Py_CLEAR(R.side_tag);
    Py_CLEAR(R.wake);
}

/* ring_attach(buf, deque, qcap, side_tag, qbytes, wake=None): this process's producer writes into buf (one ring at a
 * time), side records go to deque while it holds fewer than qcap records and an estimated qbytes bytes; records
 * tagged side_tag always go there; wake (a C callable that runs no Python code, or None) is called after each append
 * to the empty deque. */
static PyObject *py_attach(PyObject *self, PyObject *args) {
    PyObject *buf, *dq, *stag, *wake = Py_None;
    Py_ssize_t qcap, stn;
    unsigned long long qbytes;
    if (!PyArg_ParseTuple(args, "OOnUK|O:ring_attach", &buf, &dq, &qcap, &stag, &qbytes, &wake)) return NULL;
    const char *stp = PyUnicode_AsUTF8AndSize(stag, &stn);
    if (stp == NULL) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(buf, &b, PyBUF_WRITABLE) < 0) return NULL;
    ring_hdr *h = hdr_of(&b);
    PyObject *app = h ? PyObject_GetAttrString(dq, "append") : NULL;
    if (app == NULL) { PyBuffer_Release(&b); return NULL; }
    detach();
    R.view = b;
    R.data = (unsigned char *)b.buf + HDR;
    R.cap = h->cap;
    R.max_rec = h->cap / MAX_SHARE < MAX_REC ? h->cap / MAX_SHARE : MAX_REC;
    R.deque = Py_NewRef(dq);
    R.append = app;
    R.qcap = qcap;
    R.qbytes_max = qbytes;
    R.qbytes = R.qn = 0;
    R.side_tag = Py_NewRef(stag);
    R.wake = wake == Py_None ? NULL : Py_NewRef(wake);
    R.st_p = stp;
    R.st_n = stn;
    R.h = h;
    Py_RETURN_NONE;
}

/* ring_detach(buf=None): stop producing into buf (any ring when None); True when it was the attached one. */
static PyObject *py_detach(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (R.h == NULL) Py_RETURN_FALSE;
    if (nargs >= 1 && args[0] != Py_None) {
        Py_buffer b;
        if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0) return NULL;
        int same = b.buf == R.view.buf;
        PyBuffer_Release(&b);
        if (!same) Py_RETURN_FALSE;
    }
    detach();
    Py_RETURN_TRUE;
}

/* ring_forget(): in a forked child, forget the parent's ring without touching the Python objects' locks. */
static PyObject *py_forget(PyObject *self, PyObject *unused) {
    detach();
    Py_RETURN_NONE;
}

/* ring_counters(buf) -> (write_pos, read_pos, dropped, side_next, written, consumed, cap) */
static PyObject *py_counters(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    ring_hdr *h = hdr_of(&b);
    PyObject *r = h ? Py_BuildValue("(KKKKKKK)", (unsigned long long)load_acq(&h->write_pos),
                                    (unsigned long long)load_acq(&h->read_pos), (unsigned long long)h->dropped,
                                    (unsigned long long)h->side_next, (unsigned long long)h->written,
                                    (unsigned long long)load_acq(&h->consumed), (unsigned long long)h->cap)
                    : NULL;
    PyBuffer_Release(&b);
    return r;
}

static int get_v(const unsigned char **p, const unsigned char *end, uint64_t *out) {
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (*p >= end) return -1;
        unsigned char c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) { *out = v; return 0; }
    }
    return -1;
}

static PyObject *get_s(const unsigned char **p, const unsigned char *end, int intern) {
    uint64_t n;
    if (get_v(p, end, &n) < 0 || n > (uint64_t)(end - *p)) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)*p, (Py_ssize_t)n, "strict");
    *p += n;
    if (s != NULL && intern) PyUnicode_InternInPlace(&s);
    return s;
}

/* One REC record's (ts, level, tag, fields) item. */
static PyObject *decode(const unsigned char *p, const unsigned char *end, unsigned nf) {
    if (end - p < 16) return NULL;
    int64_t ts, lv;
    memcpy(&ts, p, 8);
    memcpy(&lv, p + 8, 8);
    p += 16;
    PyObject *tag = get_s(&p, end, 1), *f = tag ? PyDict_New() : NULL, *k = NULL, *v = NULL;
    if (f == NULL) goto bad;
    for (unsigned i = 0; i < nf; i++) {
        if ((k = get_s(&p, end, 1)) == NULL || p >= end) goto bad;
        char kind = (char)*p++;
        if (kind == V_INT || kind == V_FLOAT) {
            if (end - p < 8) goto bad;
            if (kind == V_INT) { int64_t x; memcpy(&x, p, 8); v = PyLong_FromLongLong(x); }
            else { double x; memcpy(&x, p, 8); v = PyFloat_FromDouble(x); }
            p += 8;
        } else if (kind == V_STR) v = get_s(&p, end, 0);
        else if (kind == V_TRUE) v = Py_NewRef(s_true);
        else if (kind == V_FALSE) v = Py_NewRef(s_false);
        if (v == NULL || PyDict_SetItem(f, k, v) < 0) goto bad;
        Py_CLEAR(k);
        Py_CLEAR(v);
    }
    PyObject *ts_o = PyLong_FromLongLong(ts), *lv_o = PyLong_FromLongLong(lv), *item = NULL;
    if (ts_o && lv_o) item = PyTuple_Pack(4, ts_o, lv_o, tag, f);
    Py_XDECREF(ts_o);
    Py_XDECREF(lv_o);
    Py_DECREF(tag);
    Py_DECREF(f);
    return item;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "ring: malformed record");
    Py_XDECREF(tag);
    Py_XDECREF(f);
    Py_XDECREF(k);
    Py_XDECREF(v);
    return NULL;
}

/* Give back the whole pages of the data span [from, to) (positions; at most a lap, and not writable by the
 * producer meanwhile: below free_pos + cap it is not). Returns the position up to which the span was handled: the
 * start of to's page (its rest is not consumed yet). */
static uint64_t punch_span(unsigned char *data, uint64_t cap, uint64_t from, uint64_t to) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uint64_t into = (uint64_t)(((uintptr_t)data + (to & (cap - 1))) & (pg - 1)); /* bytes of to's page before to */
    if (into >= to - from) return from;
    uint64_t upto = to - into;
    uint64_t s = from;
    while (s < upto) { /* at most two pieces: the span may wrap */
        uint64_t off = s & (cap - 1), n = upto - s;
        if (n > cap - off) n = cap - off;
        s += n;
        uintptr_t a = ((uintptr_t)data + off + pg - 1) & ~(pg - 1), e = ((uintptr_t)data + off + n) & ~(pg - 1);
        if (e > a) (void)madvise((void *)a, e - a, MADV_REMOVE); /* a failure leaves the pages resident, no more */
    }
    return upto;
}

/* ring_claim(buf, token): the reader with this token is the ring's only reader from now on (ring_read). */
static PyObject *py_claim(PyObject *self, PyObject *args) {
    PyObject *buf;
    unsigned long long token;
    if (!PyArg_ParseTuple(args, "OK:ring_claim", &buf, &token)) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(buf, &b, PyBUF_WRITABLE) < 0) return NULL;
    ring_hdr *h = hdr_of(&b);
    if (h != NULL) store_rel(&h->reader, token);
    PyBuffer_Release(&b);
    if (h == NULL) return NULL;
    Py_RETURN_NONE;
}

/* ring_read(buf, max_records, side_avail, token=0, punch=0) -> list or None: the exporter's intake of the ring.
 * None when another reader has claimed the ring (token is not the header's: nothing is read). Else the next records
 * in order, at most max_records: a REC as its (ts, level, tag, fields) item, a placeholder as its side id (an int);
 * it stops before a placeholder whose id is >= side_avail (its item has not come yet). Publishes read_pos and the
 * count of RECs taken (consumed) before returning: what was read is this reader's from then on. With punch > 0 the
 * consumed span's pages are given back once it is at least punch bytes (see the top of this file). A malformed
 * record raises ValueError after moving read_pos to the write position (what follows it cannot be framed). */
static PyObject *py_read(PyObject *self, PyObject *args) {
    PyObject *buf;
    Py_ssize_t maxn;
    unsigned long long avail, token = 0, punch = 0;
    if (!PyArg_ParseTuple(args, "OnK|KK:ring_read", &buf, &maxn, &avail, &token, &punch)) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(buf, &b, PyBUF_WRITABLE) < 0) return NULL;
    ring_hdr *h = hdr_of(&b);
    if (h != NULL && load_acq(&h->reader) != token) {
        PyBuffer_Release(&b);
        Py_RETURN_NONE;
    }
    PyObject *out = h ? PyList_New(0) : NULL;
    if (out == NULL) { PyBuffer_Release(&b); return NULL; }
    const unsigned char *data = (const unsigned char *)b.buf + HDR;
    uint64_t cap = h->cap, r = h->read_pos, w = load_acq(&h->write_pos), recs = 0;
    const char *bad = w - r > cap ? "positions out of range" : NULL;
    while (!bad && r < w && PyList_GET_SIZE(out) < maxn) {
        uint64_t off = r & (cap - 1);
        uint32_t size;
        uint16_t kind, nf;
        if (cap - off < REC_HDR) { bad = "record header past the end"; break; }
        memcpy(&size, data + off, 4);
        memcpy(&kind, data + off + 4, 2);
        memcpy(&nf, data + off + 6, 2);
        if (size < REC_HDR || (size & (ALIGN - 1)) || size > cap - off || size > w - r) { bad = "bad record size"; break; }
        PyObject *e = NULL;
        if (kind == K_PAD) {
            r += size;
            continue;
        } else if (kind == K_PH && size == PH_BYTES) {
            uint64_t id;
            memcpy(&id, data + off + REC_HDR, 8);
            if (id >= avail) break;
            e = PyLong_FromUnsignedLongLong(id);
        } else if (kind == K_REC) {
            e = decode(data + off + REC_HDR, data + off + size, nf);
            if (e == NULL && PyErr_ExceptionMatches(PyExc_ValueError)) { PyErr_Clear(); bad = "malformed record"; break; }
            recs++;
        } else {
            bad = "unknown record kind";
            break;
        }
        if (e == NULL || PyList_Append(out, e) < 0) {
            Py_XDECREF(e);
            Py_DECREF(out);
            PyBuffer_Release(&b);
            return NULL;
        }
        Py_DECREF(e);
        r += size;
    }
    if (bad) r = w;
    h->consumed += recs;
    store_rel(&h->read_pos, r);
    uint64_t fp = h->free_pos;
    if (punch == 0 || r - fp > cap) fp = r; /* (more than a lap behind: a ring read before without punching) */
    else if (r - fp >= punch) fp = punch_span((unsigned char *)data, cap, fp, r);
    store_rel(&h->free_pos, fp);
    PyBuffer_Release(&b);
    if (bad) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "ring: %s; the records up to the write position are skipped", bad);
        return NULL;
    }
    return out;
}

static PyObject *py_clock(PyObject *self, PyObject *fn) {
    (void)self;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "ring_clock(fn): fn must be callable or None");
        return NULL;
    }
    Py_XDECREF(clock_fn);
    clock_fn = fn == Py_None ? NULL : Py_NewRef(fn);
    Py_RETURN_NONE;
}

PyMethodDef ring_methods[] = {
    {"ring_clock", py_clock, METH_O,
     "ring_clock(fn): stamp records with fn() (int ns) instead of the real-time clock; None: the real clock again."},
    {"ring_put", (PyCFunction)(void (*)(void))py_put, METH_FASTCALL,
     "ring_put(level, tag, fields): put one record into the attached ring (the submit function while it is on)."},
    {"ring_init", py_init, METH_O, "ring_init(buf) -> cap: make buf a fresh, empty ring."},
    {"ring_attach", py_attach, METH_VARARGS,
     "ring_attach(buf, side_deque, qcap, side_tag, qbytes, wake=None): produce into buf."},
    {"ring_detach", (PyCFunction)(void (*)(void))py_detach, METH_FASTCALL,
     "ring_detach(buf=None) -> bool: stop producing into buf (or any)."},
    {"ring_forget", py_forget, METH_NOARGS, "ring_forget(): after fork, in the child: no ring."},
    {"ring_counters", py_counters, METH_O,
     "ring_counters(buf) -> (write_pos, read_pos, dropped, side_next, written, consumed, cap)."},
    {"ring_read", py_read, METH_VARARGS,
     "ring_read(buf, max_records, side_avail, token=0, punch=0) -> [item or side id], or None: claimed by another."},
    {"ring_claim", py_claim, METH_VARARGS, "ring_claim(buf, token): the reader with this token is the only one."},
    {NULL, NULL, 0, NULL},
};

int ring_module_init(PyObject *m) {
    s_true = PyUnicode_InternFromString(CPTRACE_VALUE_TRUE_TEXT);
    s_false = PyUnicode_InternFromString(CPTRACE_VALUE_FALSE_TEXT);
    ring_put_fn = PyObject_GetAttrString(m, "ring_put");
    return (s_true && s_false && ring_put_fn) ? 0 : -1;
}
