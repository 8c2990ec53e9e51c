/* OTLP protobuf encoding of spans and their events, the exporter worker's largest per-event cost in Python; loaded by
 * otlp.py.
 *
 * init(EventAttrs, Rng, field_prefix, rng_suffixes, trailer_keys): the two Python types the encoder recognises
 * and the attribute keys it writes, as cptrace_otel.model.attrs maps fields to attributes (given by Python, declared only
 * there): a field k becomes field_prefix + k, the five parts of a range field_prefix + k + rng_suffixes[i], and
 * trailer_keys are the keys of an EventAttrs' seq, epoch and level.
 *
 * span_events(events, fallback) -> bytes: the concatenated ``Span.events`` fields (tag 0x5a) of
 * ``events``, a sequence of (ts, name, attrs) tuples. An event is encoded here when its attrs are a clean
 * ``spans.EventAttrs`` whose fields are all of the common kinds: exact ints within int64, str, ``logline.Rng`` of
 * five int64 ints, and lists of ints (sent as their ``[a,b,...]`` text). Any other event (a plain dict of
 * attributes, a dirty EventAttrs, a float, bool, huge int, a field name with a dot, a string that is not valid
 * UTF-8, ...) is handed to ``fallback(ts, name, attrs)``, the Python encoder, which returns the same field bytes.
 * So the output is byte-for-byte what ``export.otlp`` writes in Python; tests/unit/test_otlpc.py holds them equal
 * and decodes both with opentelemetry-proto.
 *
 * span_fields(spans, span_fallback, event_fallback) -> list[bytes]: each span's whole ``ScopeSpans.spans`` field
 * (tag 0x12, length, Span: ids, parent, name, kind INTERNAL, times, attributes, events as span_events writes them).
 * A span is encoded here when it has the common shape: a 16-byte trace id, an 8-byte span id, a parent that is
 * empty or 8 bytes, a str name, int times, attributes that are exact int64 ints or strs, no links and no status;
 * any other span goes to ``span_fallback(span)`` (export.otlp_proto._span_field), so again the bytes are Python's.
 *
 * approx_bytes(fields) -> int: model.attrs.approx_bytes in C (the span builder calls it once per event).
 *
 * Why C: the Python encoder, after caching every repeated piece, still costs ~10 us per event on a slow core (one
 * bytes object per attribute, dict and tuple lookups); here an event is a few hundred bytes of memcpy. Whole spans
 * too: the per-span Python (ids, name, times, attributes, joins) cost ~1.2 us per event of a stream of short stage
 * spans (bench/jaeger_export.py: 3.3 events per span).
 *
 * Twin: cptrace_otel.export.otlp_proto._event_field
 * Twin: cptrace_otel.export.otlp_proto._span_field
 * Twin: cptrace_otel.model.attrs.approx_bytes
 * Held equal by: tests/unit/test_otlpc.py
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "grammar.h"   /* the protobuf tags and id sizes: cptrace_otel/model/grammar (OtlpWire) */

#define TRACE_ID_BYTES CPTRACE_OTLP_TRACE_ID_BYTES
#define SPAN_ID_BYTES CPTRACE_OTLP_SPAN_ID_BYTES

static PyObject *EventAttrs_type = NULL; /* spans.EventAttrs */
static PyObject *Rng_type = NULL;        /* logline.Rng */
static PyObject *s_fields, *s_seq, *s_epoch, *s_level, *s_dirty;

/* The keys, as UTF-8 bytes objects (init): the field prefix, the key suffix of each range part, and the keys of
 * seq, epoch and level. */
static PyObject *prefix_b, *part_suffix_b[5], *trailer_b[3];

/* -- a growable byte buffer ------------------------------------------------------------------------------------- */
typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra) cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

/* callers reserve first: these never fail */
static inline void put_varint(Buf *b, uint64_t v) {
    while (v > 0x7F) {
        b->p[b->n++] = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (char)v;
}

static inline void put_bytes(Buf *b, const char *s, Py_ssize_t n) {
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
}

/* One KeyValue attribute field (field tag ``tag``: 0x1a in an event, 0x4a in a span) with key = a + b + c (any may
 * be empty) and an AnyValue that is either an int64 (is_int) or a string (sv, sn). */
static int put_kv_tag(Buf *out, char tag, const char *a, Py_ssize_t an, const char *k, Py_ssize_t kn, const char *c,
                  Py_ssize_t cn, int is_int, uint64_t iv, const char *sv, Py_ssize_t sn) {
    Py_ssize_t key_len = an + kn + cn;
    Py_ssize_t av_len = is_int ? 1 + varint_len(iv) : 1 + varint_len((uint64_t)sn) + sn;
    Py_ssize_t kv_len = 1 + varint_len((uint64_t)key_len) + key_len + 1 + varint_len((uint64_t)av_len) + av_len;
    if (buf_reserve(out, 1 + 10 + kv_len) < 0) return -1;
    out->p[out->n++] = tag;
    put_varint(out, (uint64_t)kv_len);
    out->p[out->n++] = CPTRACE_OTLP_KV_KEY;
    put_varint(out, (uint64_t)key_len);
    put_bytes(out, a, an);
    put_bytes(out, k, kn);
    put_bytes(out, c, cn);
    out->p[out->n++] = CPTRACE_OTLP_KV_VALUE;
    put_varint(out, (uint64_t)av_len);
    if (is_int) {
        out->p[out->n++] = CPTRACE_OTLP_ANY_INT;
        put_varint(out, iv);
    } else {
        out->p[out->n++] = CPTRACE_OTLP_ANY_STRING;
        put_varint(out, (uint64_t)sn);
        put_bytes(out, sv, sn);
    }
    return 0;
}

#define put_kv(out, ...) put_kv_tag(out, CPTRACE_OTLP_EVENT_ATTRIBUTES, __VA_ARGS__)

/* An exact int within int64 -> 1 and *v (two's complement as uint64, i.e. ``v & (2**64 - 1)``); else 0. */
static int int64_of(PyObject *o, uint64_t *v) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return 0;
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *v = (uint64_t)x;
    return 1;
}

/* Result codes of the attribute encoder: 1 done, 0 "not a common case, use the fallback", -1 error set. */
static int encode_attrs(Buf *out, PyObject *attrs, Buf *tmp) {
    int rc = 0;
    Py_ssize_t start = out->n, pos = 0;
    PyObject *dirty = NULL, *fields = NULL, *seq = NULL, *epoch = NULL, *level = NULL;
    dirty = PyObject_GetAttr(attrs, s_dirty);
    if (!dirty) goto error;
    if (dirty != Py_False) goto done; /* a written-to copy: the Python dict path */
    fields = PyObject_GetAttr(attrs, s_fields);
    if (!fields) goto error;
    if (!PyDict_CheckExact(fields)) goto done;
    const char *pre = PyBytes_AS_STRING(prefix_b);
    Py_ssize_t pre_n = PyBytes_GET_SIZE(prefix_b);
    PyObject *k, *v;
    while (PyDict_Next(fields, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) goto undo;
        Py_ssize_t kn;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kn);
        if (!ks) {
            PyErr_Clear();
            goto undo;
        }
        if (memchr(ks, '.', (size_t)kn)) goto undo; /* could collide with range part keys: dict semantics decide */
        uint64_t iv;
        PyTypeObject *t = Py_TYPE(v);
        if (t == &PyLong_Type) {
            if (!int64_of(v, &iv)) goto undo;
            if (put_kv(out, pre, pre_n, ks, kn, "", 0, 1, iv, NULL, 0) < 0) goto error;
        } else if (t == &PyUnicode_Type) {
            Py_ssize_t sn;
            const char *s = PyUnicode_AsUTF8AndSize(v, &sn);
            if (!s) {
                PyErr_Clear();
                goto undo;
            }
            if (put_kv(out, pre, pre_n, ks, kn, "", 0, 0, 0, s, sn) < 0) goto error;
        } else if ((PyObject *)t == Rng_type) {
            if (PyTuple_GET_SIZE(v) != 5) goto undo;
            uint64_t parts[5];
            for (int i = 0; i < 5; i++)
                if (!int64_of(PyTuple_GET_ITEM(v, i), &parts[i])) goto undo;
            for (int i = 0; i < 5; i++) {
                PyObject *sfx = part_suffix_b[i];
                if (put_kv(out, pre, pre_n, ks, kn, PyBytes_AS_STRING(sfx), PyBytes_GET_SIZE(sfx), 1,
                           parts[i], NULL, 0) < 0)
                    goto error;
            }
        } else if (t == &PyList_Type) {
            /* a list of ints travels as its rendered text "[a,b,...]" (str() of each item) */
            Py_ssize_t m = PyList_GET_SIZE(v);
            if (m > 4096) goto undo;
            tmp->n = 0;
            if (buf_reserve(tmp, 2 + m * 21) < 0) goto error;
            tmp->p[tmp->n++] = '[';
            for (Py_ssize_t i = 0; i < m; i++) {
                PyObject *x = PyList_GET_ITEM(v, i);
                if (!int64_of(x, &iv)) goto undo;
                if (i) tmp->p[tmp->n++] = ',';
                tmp->n += snprintf(tmp->p + tmp->n, 21, "%lld", (long long)iv);
            }
            tmp->p[tmp->n++] = ']';
            if (put_kv(out, pre, pre_n, ks, kn, "", 0, 0, 0, tmp->p, tmp->n) < 0) goto error;
        } else {
            goto undo;
        }
    }
    seq = PyObject_GetAttr(attrs, s_seq);
    epoch = seq ? PyObject_GetAttr(attrs, s_epoch) : NULL;
    level = epoch ? PyObject_GetAttr(attrs, s_level) : NULL;
    if (!level) goto error;
    uint64_t tv[3];
    if (!int64_of(seq, &tv[0]) || !int64_of(epoch, &tv[1]) || !int64_of(level, &tv[2])) goto undo;
    for (int i = 0; i < 3; i++)
        if (put_kv(out, PyBytes_AS_STRING(trailer_b[i]), PyBytes_GET_SIZE(trailer_b[i]), "", 0, "", 0, 1, tv[i],
                   NULL, 0) < 0)
            goto error;
    rc = 1;
    goto done;
undo:
    out->n = start;
    rc = 0;
    goto done;
error:
    rc = -1;
done:
    Py_XDECREF(dirty);
    Py_XDECREF(fields);
    Py_XDECREF(seq);
    Py_XDECREF(epoch);
    Py_XDECREF(level);
    return rc;
}

/* Append the Span.events fields of ``events`` (a sequence of (ts, name, attrs)) to out; 0, or -1 with an
 * exception. attrs and tmp are scratch buffers. */
static int put_events(Buf *out, PyObject *events, PyObject *fallback, Buf *attrs, Buf *tmp) {
    PyObject *seq = PySequence_Fast(events, "events must be a sequence");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev = items[i];
        int rc = 0;
        PyObject *ts = NULL, *name = NULL, *at = NULL;
        if (PyTuple_CheckExact(ev) && PyTuple_GET_SIZE(ev) == 3) {
            ts = PyTuple_GET_ITEM(ev, 0);
            name = PyTuple_GET_ITEM(ev, 1);
            at = PyTuple_GET_ITEM(ev, 2);
        }
        Py_ssize_t nn = 0;
        const char *ns = NULL;
        if (at && (PyObject *)Py_TYPE(at) == EventAttrs_type && PyLong_Check(ts) && PyUnicode_CheckExact(name)) {
            ns = PyUnicode_AsUTF8AndSize(name, &nn);
            if (!ns) PyErr_Clear();
            else {
                attrs->n = 0;
                rc = encode_attrs(attrs, at, tmp);
                if (rc < 0) goto fail;
            }
        }
        if (rc == 1) {
            uint64_t t = PyLong_AsUnsignedLongLongMask(ts);
            if (t == (uint64_t)-1 && PyErr_Occurred()) goto fail;
            Py_ssize_t ev_len = 9 + 1 + varint_len((uint64_t)nn) + nn + attrs->n;
            if (buf_reserve(out, 1 + 10 + ev_len) < 0) goto fail;
            out->p[out->n++] = CPTRACE_OTLP_SPAN_EVENTS;
            put_varint(out, (uint64_t)ev_len);
            out->p[out->n++] = CPTRACE_OTLP_EVENT_TIME; /* fixed64 little-endian */
            for (int b = 0; b < 8; b++) out->p[out->n++] = (char)((t >> (8 * b)) & 0xFF);
            out->p[out->n++] = CPTRACE_OTLP_EVENT_NAME;
            put_varint(out, (uint64_t)nn);
            put_bytes(out, ns, nn);
            put_bytes(out, attrs->p, attrs->n);
        } else {
            if (!at) {
                PyErr_SetString(PyExc_TypeError, "span_events: each event must be a (ts, name, attrs) tuple");
                goto fail;
            }
            PyObject *b = PyObject_CallObject(fallback, ev);
            if (!b) goto fail;
            if (!PyBytes_Check(b)) {
                Py_DECREF(b);
                PyErr_SetString(PyExc_TypeError, "fallback must return bytes");
                goto fail;
            }
            Py_ssize_t bn = PyBytes_GET_SIZE(b);
            if (buf_reserve(out, bn) < 0) {
                Py_DECREF(b);
                goto fail;
            }
            put_bytes(out, PyBytes_AS_STRING(b), bn);
            Py_DECREF(b);
        }
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static int check_init(void) {
    if (!EventAttrs_type || !Rng_type) {
        PyErr_SetString(PyExc_RuntimeError, "_otlp.init() was not called");
        return -1;
    }
    return 0;
}

/* span_events(events, fallback) -> bytes */
static PyObject *span_events(PyObject *self, PyObject *args) {
    PyObject *events, *fallback;
    if (!PyArg_ParseTuple(args, "OO:span_events", &events, &fallback)) return NULL;
    if (check_init() < 0) return NULL;
    Buf out = {0}, attrs = {0}, tmp = {0};
    PyObject *result = NULL;
    if (put_events(&out, events, fallback, &attrs, &tmp) == 0)
        result = PyBytes_FromStringAndSize(out.p ? out.p : "", out.n);
    PyMem_Free(out.p);
    PyMem_Free(attrs.p);
    PyMem_Free(tmp.p);
    return result;
}

/* Span attributes we read; interned in PyInit. */
static PyObject *s_trace_id, *s_span_id, *s_parent, *s_name, *s_start, *s_end, *s_attrs, *s_events, *s_links,
    *s_status_code;

static inline void put_fixed64(Buf *b, uint64_t t) {
    for (int i = 0; i < 8; i++) b->p[b->n++] = (char)((t >> (8 * i)) & 0xFF);
}

/* The Span.attributes fields (tag 0x4a) of a dict whose values are exact int64 ints or strs: 1 done, 0 "another
 * kind of value (bool, float, a huge int, a lone surrogate...): use the fallback", -1 error. */
static int put_span_attrs(Buf *out, PyObject *attrs) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) return 0;
        Py_ssize_t kn, sn = 0;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kn), *s = NULL;
        if (!ks) {
            PyErr_Clear();
            return 0;
        }
        uint64_t iv = 0;
        int is_int = Py_TYPE(v) == &PyLong_Type;
        if (is_int) {
            if (!int64_of(v, &iv)) return 0;
        } else if (Py_TYPE(v) == &PyUnicode_Type) {
            s = PyUnicode_AsUTF8AndSize(v, &sn);
            if (!s) {
                PyErr_Clear();
                return 0;
            }
        } else {
            return 0;
        }
        if (put_kv_tag(out, CPTRACE_OTLP_SPAN_ATTRIBUTES, "", 0, ks, kn, "", 0, is_int, iv, s, sn) < 0) return -1;
    }
    return 1;
}

/* One span's ``ResourceSpans...spans`` field (tag 0x12, length, Span) when it is of the common shape: 1 done,
 * 0 use the fallback, -1 error. ``out`` is rewound on 0. */
static int put_span(Buf *out, PyObject *sp, PyObject *event_fallback, Buf *body, Buf *attrs, Buf *tmp) {
    int rc = -1;
    PyObject *tid = NULL, *sid = NULL, *parent = NULL, *name = NULL, *start = NULL, *end = NULL, *at = NULL,
             *events = NULL, *links = NULL, *status = NULL;
    if (!(tid = PyObject_GetAttr(sp, s_trace_id)) || !(sid = PyObject_GetAttr(sp, s_span_id)) ||
        !(name = PyObject_GetAttr(sp, s_name)) || !(start = PyObject_GetAttr(sp, s_start)) ||
        !(end = PyObject_GetAttr(sp, s_end)) || !(at = PyObject_GetAttr(sp, s_attrs)) ||
        !(events = PyObject_GetAttr(sp, s_events)) || !(links = PyObject_GetAttr(sp, s_links)) ||
        !(status = PyObject_GetAttr(sp, s_status_code)))
        goto done;
    parent = PyObject_GetAttr(sp, s_parent);
    if (!parent) {   /* spans without a parent attribute are roots (getattr(sp, "parent", b"")) */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto done;
        PyErr_Clear();
    }
    rc = 0;
    /* the common shape: ids of the right sizes, a str name, int times, a dict of attributes, no links, no status */
    if (!PyBytes_CheckExact(tid) || PyBytes_GET_SIZE(tid) != TRACE_ID_BYTES || !PyBytes_CheckExact(sid) ||
        PyBytes_GET_SIZE(sid) != SPAN_ID_BYTES || !PyUnicode_CheckExact(name) || !PyLong_Check(start) ||
        !PyLong_Check(end) ||
        !PyDict_CheckExact(at) || !PyList_CheckExact(links) || PyList_GET_SIZE(links) != 0 ||
        !PyLong_CheckExact(status) || PyObject_IsTrue(status) != 0)
        goto done;
    int has_parent = 0;
    if (parent && PyObject_IsTrue(parent)) {
        if (!PyBytes_CheckExact(parent) || PyBytes_GET_SIZE(parent) != SPAN_ID_BYTES) goto done;
        has_parent = 1;
    }
    Py_ssize_t nn;
    const char *ns = PyUnicode_AsUTF8AndSize(name, &nn);
    if (!ns) {
        PyErr_Clear();
        goto done;
    }
    uint64_t t0 = PyLong_AsUnsignedLongLongMask(start), t1 = PyLong_AsUnsignedLongLongMask(end);
    if (PyErr_Occurred()) {
        rc = -1;
        goto done;
    }
    body->n = 0;
    if (buf_reserve(body, 64 + nn) < 0) {
        rc = -1;
        goto done;
    }
    body->p[body->n++] = CPTRACE_OTLP_SPAN_TRACE_ID;
    body->p[body->n++] = TRACE_ID_BYTES;
    put_bytes(body, PyBytes_AS_STRING(tid), TRACE_ID_BYTES);
    body->p[body->n++] = CPTRACE_OTLP_SPAN_SPAN_ID;
    body->p[body->n++] = SPAN_ID_BYTES;
    put_bytes(body, PyBytes_AS_STRING(sid), SPAN_ID_BYTES);
    if (has_parent) {
        body->p[body->n++] = CPTRACE_OTLP_SPAN_PARENT;
        body->p[body->n++] = SPAN_ID_BYTES;
        put_bytes(body, PyBytes_AS_STRING(parent), SPAN_ID_BYTES);
    }
    body->p[body->n++] = CPTRACE_OTLP_SPAN_NAME;
    put_varint(body, (uint64_t)nn);
    put_bytes(body, ns, nn);
    body->p[body->n++] = CPTRACE_OTLP_SPAN_KIND;
    body->p[body->n++] = CPTRACE_OTLP_KIND_INTERNAL;
    body->p[body->n++] = CPTRACE_OTLP_SPAN_START;
    put_fixed64(body, t0);
    body->p[body->n++] = CPTRACE_OTLP_SPAN_END;
    put_fixed64(body, t1);
    int arc = put_span_attrs(body, at);
    if (arc <= 0) {
        rc = arc;
        goto done;
    }
    if (put_events(body, events, event_fallback, attrs, tmp) < 0) {
        rc = -1;
        goto done;
    }
    if (buf_reserve(out, 1 + 10 + body->n) < 0) {
        rc = -1;
        goto done;
    }
    out->p[out->n++] = CPTRACE_OTLP_SCOPE_SPANS_SPANS;
    put_varint(out, (uint64_t)body->n);
    put_bytes(out, body->p, body->n);
    rc = 1;
done:
    Py_XDECREF(tid);
    Py_XDECREF(sid);
    Py_XDECREF(parent);
    Py_XDECREF(name);
    Py_XDECREF(start);
    Py_XDECREF(end);
    Py_XDECREF(at);
    Py_XDECREF(events);
    Py_XDECREF(links);
    Py_XDECREF(status);
    return rc;
}

/* span_fields(spans, span_fallback, event_fallback) -> list[bytes] */
static PyObject *span_fields(PyObject *self, PyObject *args) {
    PyObject *spans, *span_fallback, *event_fallback;
    if (!PyArg_ParseTuple(args, "OOO:span_fields", &spans, &span_fallback, &event_fallback)) return NULL;
    if (check_init() < 0) return NULL;
    PyObject *seq = PySequence_Fast(spans, "spans must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = PyList_New(n);
    Buf out = {0}, body = {0}, attrs = {0}, tmp = {0};
    if (!result) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sp = PySequence_Fast_GET_ITEM(seq, i), *b;
        out.n = 0;
        int rc = put_span(&out, sp, event_fallback, &body, &attrs, &tmp);
        if (rc < 0) goto fail;
        if (rc == 1) {
            b = PyBytes_FromStringAndSize(out.p, out.n);
        } else {
            b = PyObject_CallOneArg(span_fallback, sp);
            if (b && !PyBytes_Check(b)) {
                Py_DECREF(b);
                PyErr_SetString(PyExc_TypeError, "span_fallback must return bytes");
                b = NULL;
            }
        }
        if (!b) goto fail;
        PyList_SET_ITEM(result, i, b);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    PyMem_Free(out.p);
    PyMem_Free(body.p);
    PyMem_Free(attrs.p);
    PyMem_Free(tmp.p);
    Py_DECREF(seq);
    return result;
}

/* approx_bytes(fields) -> int: model.attrs.approx_bytes (the span byte cap's estimate), the same number: 16 + 12 per
 * field, plus len - 4 per str (in code points), 48 per Rng, len(str(v)) per value of any other type but int and
 * float (exact types, as there). */
static PyObject *approx_bytes(PyObject *self, PyObject *fields) {
    if (!Rng_type) {
        PyErr_SetString(PyExc_RuntimeError, "_otlp.init() was not called");
        return NULL;
    }
    if (!PyDict_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "approx_bytes: fields must be a dict");
        return NULL;
    }
    Py_ssize_t pos = 0, n = 16 + 12 * PyDict_GET_SIZE(fields);
    PyObject *k, *v;
    while (PyDict_Next(fields, &pos, &k, &v)) {
        PyTypeObject *t = Py_TYPE(v);
        if (t == &PyLong_Type || t == &PyFloat_Type) continue;
        if (t == &PyUnicode_Type) {
            n += PyUnicode_GET_LENGTH(v) - 4;
        } else if ((PyObject *)t == Rng_type) {
            n += 48;
        } else {
            PyObject *r = PyObject_Str(v);
            if (!r) return NULL;
            n += PyUnicode_GET_LENGTH(r);
            Py_DECREF(r);
        }
    }
    return PyLong_FromSsize_t(n);
}

/* A new reference to the UTF-8 bytes of str s, or NULL with an exception. */
static PyObject *utf8_bytes(PyObject *s)
{
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "init: attribute keys must be str");
        return NULL;
    }
    return PyUnicode_AsUTF8String(s);
}

/* init(EventAttrs, Rng, field_prefix, rng_suffixes, trailer_keys): see the top of this file. */
static PyObject *init(PyObject *self, PyObject *args)
{
    PyObject *ea, *rng, *prefix, *parts, *trailer;
    if (!PyArg_ParseTuple(args, "OOUO!O!:init", &ea, &rng, &prefix, &PyTuple_Type, &parts, &PyTuple_Type, &trailer))
        return NULL;
    if (!PyType_Check(ea) || !PyType_Check(rng) || !PyType_IsSubtype((PyTypeObject *)rng, &PyTuple_Type) ||
        PyTuple_GET_SIZE(parts) != 5 || PyTuple_GET_SIZE(trailer) != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "init(EventAttrs type, Rng tuple type, field prefix, 5 range key suffixes, 3 trailer keys)");
        return NULL;
    }
    PyObject *p = utf8_bytes(prefix), *sfx[5] = {NULL}, *tr[3] = {NULL};
    int ok = p != NULL;
    for (int i = 0; ok && i < 5; i++)
        ok = (sfx[i] = utf8_bytes(PyTuple_GET_ITEM(parts, i))) != NULL;
    for (int i = 0; ok && i < 3; i++)
        ok = (tr[i] = utf8_bytes(PyTuple_GET_ITEM(trailer, i))) != NULL;
    if (!ok) {
        Py_XDECREF(p);
        for (int i = 0; i < 5; i++) Py_XDECREF(sfx[i]);
        for (int i = 0; i < 3; i++) Py_XDECREF(tr[i]);
        return NULL;
    }
    Py_XSETREF(prefix_b, p);
    for (int i = 0; i < 5; i++) Py_XSETREF(part_suffix_b[i], sfx[i]);
    for (int i = 0; i < 3; i++) Py_XSETREF(trailer_b[i], tr[i]);
    Py_XSETREF(EventAttrs_type, Py_NewRef(ea));
    Py_XSETREF(Rng_type, Py_NewRef(rng));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"span_events", span_events, METH_VARARGS,
     "span_events(events, fallback) -> bytes: the Span.events fields of (ts, name, attrs) tuples; events the C "
     "encoder does not cover go through fallback(ts, name, attrs) -> bytes."},
    {"span_fields", span_fields, METH_VARARGS,
     "span_fields(spans, span_fallback, event_fallback) -> list[bytes]: each span's whole spans field (tag 0x12); a "
     "span the C encoder does not cover goes through span_fallback(span) -> bytes."},
    {"approx_bytes", approx_bytes, METH_O,
     "approx_bytes(fields) -> int: the number model.attrs.approx_bytes gives (the span byte cap's estimate)."},
    {"init", init, METH_VARARGS,
     "init(EventAttrs, Rng, field_prefix, rng_suffixes, trailer_keys): the Python types the encoder recognises and the "
     "attribute keys it writes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlp", "C encoder of OTLP span events.", -1, methods};

PyMODINIT_FUNC PyInit__otlp(void) {
    s_fields = PyUnicode_InternFromString("fields");
    s_seq = PyUnicode_InternFromString("seq");
    s_epoch = PyUnicode_InternFromString("epoch");
    s_level = PyUnicode_InternFromString("level");
    s_dirty = PyUnicode_InternFromString("dirty");
    if (!s_fields || !s_seq || !s_epoch || !s_level || !s_dirty) return NULL;
    s_trace_id = PyUnicode_InternFromString("trace_id");
    s_span_id = PyUnicode_InternFromString("span_id");
    s_parent = PyUnicode_InternFromString("parent");
    s_name = PyUnicode_InternFromString("name");
    s_start = PyUnicode_InternFromString("start");
    s_end = PyUnicode_InternFromString("end");
    s_attrs = PyUnicode_InternFromString("attrs");
    s_events = PyUnicode_InternFromString("events");
    s_links = PyUnicode_InternFromString("links");
    s_status_code = PyUnicode_InternFromString("status_code");
    if (!s_trace_id || !s_span_id || !s_parent || !s_name || !s_start || !s_end || !s_attrs || !s_events ||
        !s_links || !s_status_code)
        return NULL;
    return PyModule_Create(&module);
}
