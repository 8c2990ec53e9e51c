/* OTLP protobuf intake of ``cptrace-otel serve`` in C: the bytes of one ExportTraceServiceRequest read straight into
 * the records the Python decoder (cptrace_otel.analyze.otlp_intake) builds through opentelemetry-proto's objects,
 * without a protobuf object per span, event or attribute; loaded by otlpin.py.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags, event_slots, keys, parse_value)   the types it builds, the
 *       attribute keys and names it reads (keys: a dict given by otlpin.py from model.semconv / model.attrs) and
 *       logline.parse_value (a record text the shared value grammar leaves to Python)
 *   decode(body) -> (spans_seen, spans) | None
 *       spans: one (run_id|None, level|None, trace_hex, span_hex, start_us, codes, events, stamp|None) per span
 *       that holds records, in request order; otlp_intake turns them into SpanRecords or rejects exactly as
 *       from_request does. stamp: the bytes of the span's Resource message when one of its keys starts with the
 *       config stamp's prefix (keys["stamp_prefix"]): otlp_intake reads the stamp from them with the Python twin's own
 *       code, once per resource (a few attributes a request, not a record's).
 *
 * None means "let Python decide": the C reader answers only for bodies it reads with certainty, i.e. every field it
 * meets is one of the schema's fields with its wire type, each singular field at most once, every string valid
 * UTF-8, and every record's range summaries written as the exporter writes them (the five parts consecutive, in
 * order). Anything else (an unknown or repeated field, a newer schema's field, a truncated or malformed body, a
 * record value whose conversion raised, a non-str violation attribute, nesting deeper than MAX_DEPTH) is answered
 * with None, and otlp_intake's Python decoder then gives the records, rejects or Undecodable itself. So the C
 * reader never accepts a body the Python one rejects nor reads one differently; tests/unit/test_otlp_intake_c.py
 * holds the two equal on our exporter's bytes, the collector's re-encoding and Hypothesis-generated and broken bodies.
 *
 * Why C: the Python decoder spends ~75% of a serve replica's CPU building protobuf objects and walking them
 * (WhichOneof, one Python object per attribute) before a single rule runs.
 *
 * Twin: cptrace_otel.analyze.otlp_intake.from_request
 * Held equal by: tests/unit/test_otlp_intake_c.py
 */
#include "event.h"
#include "value.h"

#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32

typedef struct {
    const uint8_t *p, *end;
} Rd;

/* the keys and names read beyond the readers' shared state (value.h), set by configure */
static PyObject *k_service, *k_config, *watch_service;

/* -- the wire format ------------------------------------------------------------------------------------------ */

static inline int rd_varint(Rd *r, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p >= r->end)
            return FALLBACK;
        uint8_t b = *r->p++;
        if (i == 9 && b > 1)
            return FALLBACK;
        x |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return OK;
        }
    }
    return FALLBACK;
}

/* the next field's number and wire type; FALLBACK on a malformed tag, a group or a field number 0 */
static inline int rd_tag(Rd *r, uint32_t *field, int *wt)
{
    uint64_t t;
    *field = 0;
    *wt = 0;
    if (rd_varint(r, &t) != OK || t > 0xFFFFFFFFu)
        return FALLBACK;
    *field = (uint32_t)(t >> 3);
    *wt = (int)(t & 7);
    return (*field == 0 || *wt == 3 || *wt == 4 || *wt > 5) ? FALLBACK : OK;
}

/* the value of a field of wire type wt: a varint in *v, a fixed one in *v, a length-delimited one in *sub */
static inline int rd_value(Rd *r, int wt, uint64_t *v, Rd *sub)
{
    *v = 0;
    sub->p = sub->end = r->p;
    if (wt == 0)
        return rd_varint(r, v);
    if (wt == 1 || wt == 5) {
        int n = wt == 1 ? 8 : 4;
        if (r->end - r->p < n)
            return FALLBACK;
        uint64_t x = 0;
        memcpy(&x, r->p, (size_t)n);   /* little-endian hosts only: setup builds for x86-64 and aarch64 */
        r->p += n;
        *v = x;
        return OK;
    }
    uint64_t n;
    if (rd_varint(r, &n) != OK || n > (uint64_t)(r->end - r->p))
        return FALLBACK;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return OK;
}

/* the next field of a message already checked (no error possible): its number, value or payload */
static inline void rd_next(Rd *r, uint32_t *f, uint64_t *v, Rd *sub)
{
    int wt;
    rd_tag(r, f, &wt);
    rd_value(r, wt, v, sub);
}

/* -- checking what is not read: the schema of the messages the intake skips -------------------------------- */

enum { K_VARINT, K_I64, K_I32, K_STR, K_BYTES, K_KV, K_ANY, K_ARR, K_KVL, K_SCOPE, K_LINK, K_STATUS, K_NONE };
enum { M_KV, M_ANY, M_ARR, M_KVL, M_SCOPE, M_LINK, M_STATUS };

static int kind_of(int msg, uint32_t f)
{
    switch (msg) {
    case M_KV: return f == 1 ? K_STR : f == 2 ? K_ANY : K_NONE;
    case M_ANY:
        switch (f) {
        case 1: return K_STR;
        case 2: case 3: return K_VARINT;
        case 4: return K_I64;
        case 5: return K_ARR;
        case 6: return K_KVL;
        case 7: return K_BYTES;
        default: return K_NONE;
        }
    case M_ARR: return f == 1 ? K_ANY : K_NONE;
    case M_KVL: return f == 1 ? K_KV : K_NONE;
    case M_SCOPE: return f == 1 || f == 2 ? K_STR : f == 3 ? K_KV : f == 4 ? K_VARINT : K_NONE;
    case M_LINK:
        switch (f) {
        case 1: case 2: return K_BYTES;
        case 3: return K_STR;
        case 4: return K_KV;
        case 5: return K_VARINT;
        case 6: return K_I32;
        default: return K_NONE;
        }
    case M_STATUS: return f == 2 ? K_STR : f == 3 ? K_VARINT : K_NONE;
    }
    return K_NONE;
}

static const int wire_of[] = {[K_VARINT] = 0, [K_I64] = 1, [K_I32] = 5, [K_STR] = 2, [K_BYTES] = 2, [K_KV] = 2,
                              [K_ANY] = 2, [K_ARR] = 2, [K_KVL] = 2, [K_SCOPE] = 2, [K_LINK] = 2, [K_STATUS] = 2};
static const int msg_of[] = {[K_KV] = M_KV, [K_ANY] = M_ANY, [K_ARR] = M_ARR, [K_KVL] = M_KVL, [K_SCOPE] = M_SCOPE,
                             [K_LINK] = M_LINK, [K_STATUS] = M_STATUS};

/* OK when the message reads as the schema says (AnyValue: one value, KeyValue: each field once), FALLBACK otherwise */
static int check_msg(Rd r, int msg, int depth)
{
    if (depth > MAX_DEPTH)
        return FALLBACK;
    uint32_t seen = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Rd sub;
        if (rd_tag(&r, &f, &wt) != OK)
            return FALLBACK;
        int k = kind_of(msg, f);
        if (k == K_NONE || wire_of[k] != wt || rd_value(&r, wt, &v, &sub) != OK)
            return FALLBACK;
        if (msg == M_KV || msg == M_ANY) {   /* singular fields; AnyValue's are one oneof */
            uint32_t bit = msg == M_ANY ? 1 : 1u << f;
            if (seen & bit)
                return FALLBACK;
            seen |= bit;
        }
        if (k == K_STR && !utf8_ok(sub.p, sub.end - sub.p))
            return FALLBACK;
        if (k >= K_KV && k <= K_STATUS && check_msg(sub, msg_of[k], depth + 1) != OK)
            return FALLBACK;
    }
    return OK;
}

/* -- reading values ----------------------------------------------------------------------------------------- */

/* a KeyValue already checked (check_msg M_KV): its key and its AnyValue (empty when absent) */
static void rd_kv(Rd r, Rd *key, Rd *val)
{
    key->p = key->end = val->p = val->end = r.p;
    while (r.p < r.end) {
        uint32_t f;
        uint64_t v;
        Rd sub;
        rd_next(&r, &f, &v, &sub);
        if (f == 1)
            *key = sub;
        else
            *val = sub;
    }
}

static inline int key_is(Rd k, PyObject *bytes)
{
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    return k.end - k.p == n && memcmp(k.p, PyBytes_AS_STRING(bytes), (size_t)n) == 0;
}

static inline int key_starts(Rd k, PyObject *bytes)
{
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    return k.end - k.p >= n && memcmp(k.p, PyBytes_AS_STRING(bytes), (size_t)n) == 0;
}

/* otlp_intake.value of a checked AnyValue: a new reference (Py_None when unset) or NULL with an exception */
static PyObject *any_to_py(Rd r)
{
    if (r.p >= r.end)
        Py_RETURN_NONE;
    uint32_t f;
    uint64_t v;
    Rd sub;
    rd_next(&r, &f, &v, &sub);
    switch (f) {
    case 1: return PyUnicode_DecodeUTF8((const char *)sub.p, sub.end - sub.p, "strict");
    case 2: return PyBool_FromLong(v != 0);
    case 3: return PyLong_FromLongLong((long long)v);
    case 4: {
        double d;
        memcpy(&d, &v, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case 7: return PyBytes_FromStringAndSize((const char *)sub.p, sub.end - sub.p);
    }
    PyObject *out = f == 5 ? PyList_New(0) : PyDict_New();
    while (out && sub.p < sub.end) {
        uint32_t g;
        Rd item, key, val;
        rd_next(&sub, &g, &v, &item);
        PyObject *x, *k = NULL;
        if (f == 5)
            x = any_to_py(item);
        else {
            rd_kv(item, &key, &val);
            k = PyUnicode_DecodeUTF8((const char *)key.p, key.end - key.p, "strict");
            x = k ? any_to_py(val) : NULL;
        }
        if (x == NULL || (f == 5 ? PyList_Append(out, x) : PyDict_SetItem(out, k, x)) < 0)
            Py_CLEAR(out);
        Py_XDECREF(x);
        Py_XDECREF(k);
    }
    return out;
}

/* a record value as attrs.attributes_to_fields keeps it: a str through logline.parse_value, any other as is */
static int field_value(Rd val, PyObject **out)
{
    Rd r = val;
    uint32_t f = 0;
    uint64_t v;
    Rd s;
    if (r.p < r.end) {
        rd_next(&r, &f, &v, &s);
    }
    if (f != 1)
        return (*out = any_to_py(val)) ? OK : ERR;
    return value_text((const char *)s.p, s.end - s.p, parse_value_fn, out);   /* FALLBACK: the span is rejected */
}

/* -- records ------------------------------------------------------------------------------------------------ */

/* the record of one span event (an Event in *out, or *out = NULL when it is not one); FALLBACK for a shape the
 * Python decoder must read */
static int read_event(Rd r, PyObject *rank, int convert, PyObject **out)
{
    *out = NULL;
    uint64_t ts = 0, v;
    Rd name = {r.p, r.p}, sub;
    uint32_t f, seen = 0;
    int wt;
    const uint8_t *attrs = r.p;
    for (Rd q = r; q.p < q.end;) {   /* first the singular fields, wherever they are */
        if (rd_tag(&q, &f, &wt) != OK || f > 4 || wt != (f == 1 ? 1 : f == 4 ? 0 : 2) || rd_value(&q, wt, &v, &sub) != OK)
            return FALLBACK;
        if (f != 3 && (seen & (1u << f)))
            return FALLBACK;
        seen |= 1u << f;
        if (f == 1)
            ts = v;
        else if (f == 2)
            name = sub;
        else if (f == 3 && check_msg(sub, M_KV, 0) != OK)
            return FALLBACK;
    }
    if (!utf8_ok(name.p, name.end - name.p))
        return FALLBACK;
    if (!convert || key_is(name, k_ev_violation))
        return OK;   /* (a finding: skipped) */
    PyObject *fields = PyDict_New(), *seq = NULL, *epoch = NULL, *level = NULL;
    if (fields == NULL)
        return ERR;
    int st = OK;
    Py_ssize_t plen = PyBytes_GET_SIZE(k_prefix);
    Rd q = {attrs, r.end}, key, val;
    ValueFields vf = {0};
    while (st == OK && q.p < q.end) {
        rd_next(&q, &f, &v, &sub);
        if (f != 3)
            continue;
        rd_kv(sub, &key, &val);
        Py_ssize_t kn = key.end - key.p;
        if (kn < plen || memcmp(key.p, PyBytes_AS_STRING(k_prefix), (size_t)plen) != 0) {
            PyObject **slot = key_is(key, k_seq) ? &seq : key_is(key, k_epoch) ? &epoch : key_is(key, k_level) ? &level : NULL;
            if (slot) {
                PyObject *x = any_to_py(val);
                if (x == NULL)
                    st = ERR;
                Py_XSETREF(*slot, x);
            }
            continue;
        }
        PyObject *x;
        if ((st = field_value(val, &x)) == OK)
            st = value_field_add(&vf, fields, (const char *)key.p + plen, kn - plen, rng_suffix, x);
    }
    st = value_fields_end(&vf, st);
    if (st == OK && seq && PyLong_CheckExact(seq)) {
        PyObject *nm = value_name((const char *)name.p, name.end - name.p), *t = PyLong_FromUnsignedLongLong(ts);
        PyObject *argv[EVENT_NFIELDS] = {nm, rank, seq, t, epoch && PyLong_CheckExact(epoch) ? epoch : zero_obj,
                                         fields, level && PyLong_CheckExact(level) ? level : one_obj, src_obj,
                                         zero_obj};
        *out = nm && t ? event_new(argv) : NULL;
        if (*out == NULL)
            st = ERR;
        Py_XDECREF(nm);
        Py_XDECREF(t);
    }
    Py_DECREF(fields);
    Py_XDECREF(seq);
    Py_XDECREF(epoch);
    Py_XDECREF(level);
    return st;
}

/* -- spans -------------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject *run_id, *level, *rank;   /* the resource's run id (str) and trace level (int), else None; rank */
    PyObject *stamp;                   /* the Resource message's bytes when it carries a config stamp, else None */
    int own;                           /* the checker's own write-back spans */
    Py_ssize_t seen;
    PyObject *out;
} Res;

static PyObject *hex_of(Rd b)
{
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = b.end - b.p;
    PyObject *s = PyUnicode_New(2 * n, 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        d[2 * i] = (Py_UCS1)digits[b.p[i] >> 4];
        d[2 * i + 1] = (Py_UCS1)digits[b.p[i] & 15];
    }
    return s;
}

/* the wire type of each Span field (1-16), -1 for a repeated message, -2 for one read elsewhere */
static const int span_wt[17] = {-3, 2, 2, 2, 2, 2, 0, 1, 1, -1, 0, -1, 0, -1, 0, 2, 5};

static int read_span(Rd r, Res *res)
{
    res->seen++;
    Rd tid = {r.p, r.p}, sid = {r.p, r.p}, viol = {NULL, NULL}, sub, key, val;
    uint64_t start = 0, v;
    uint32_t f, seen = 0;
    int wt, nev = 0, st = OK;
    PyObject *rank = Py_NewRef(res->rank);
    for (Rd q = r; st == OK && q.p < q.end;) {
        if (rd_tag(&q, &f, &wt) != OK || f > 16 || wt != (span_wt[f] < 0 ? 2 : span_wt[f]) ||
            rd_value(&q, wt, &v, &sub) != OK) {
            st = FALLBACK;
            break;
        }
        if (span_wt[f] >= 0) {
            if (seen & (1u << f))
                st = FALLBACK;
            seen |= 1u << f;
        }
        switch (f) {
        case 1: tid = sub; break;
        case 2: sid = sub; break;
        case 3: case 5: if (!utf8_ok(sub.p, sub.end - sub.p)) st = FALLBACK; break;
        case 7: start = v; break;
        case 9:
            if (check_msg(sub, M_KV, 0) != OK) {
                st = FALLBACK;
                break;
            }
            rd_kv(sub, &key, &val);
            if (key_is(key, k_rank)) {
                PyObject *x = any_to_py(val);
                if (x == NULL)
                    st = ERR;
                Py_XSETREF(rank, x);
            } else if (key_is(key, k_violation))
                viol = val;
            break;
        case 11: nev++; break;
        case 13: if (check_msg(sub, M_LINK, 0) != OK) st = FALLBACK; break;
        case 15: if (check_msg(sub, M_STATUS, 0) != OK) st = FALLBACK; break;
        }
    }
    int convert = st == OK && !res->own && nev > 0;
    if (convert && !PyLong_CheckExact(rank))
        Py_SETREF(rank, Py_NewRef(zero_obj));
    PyObject *evs = convert ? PyList_New(0) : NULL;
    if (convert && evs == NULL)
        st = ERR;
    for (Rd q = r; st == OK && nev > 0 && q.p < q.end;) {
        rd_next(&q, &f, &v, &sub);
        if (f != 11)
            continue;
        PyObject *ev;
        st = read_event(sub, rank, convert, &ev);
        if (ev && PyList_Append(evs, ev) < 0)
            st = ERR;
        Py_XDECREF(ev);
    }
    Py_DECREF(rank);
    if (st != OK || evs == NULL || PyList_GET_SIZE(evs) == 0) {
        Py_XDECREF(evs);
        return st;
    }
    PyObject *codes = NULL;
    if (viol.p) {   /* frozenset(str(value).split(",")), for a str value (any other: Python renders it) */
        Rd a = viol, s = {viol.p, viol.p};
        f = 0;
        if (a.p < a.end)
            rd_next(&a, &f, &v, &s);
        if (viol.p == viol.end || f != 1) {
            Py_DECREF(evs);
            return FALLBACK;
        }
        PyObject *text = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, "strict");
        PyObject *sep = text ? PyUnicode_FromString(",") : NULL;
        PyObject *parts = sep ? PyUnicode_Split(text, sep, -1) : NULL;
        codes = parts ? PyFrozenSet_New(parts) : NULL;
        Py_XDECREF(text);
        Py_XDECREF(sep);
        Py_XDECREF(parts);
    } else
        codes = PyFrozenSet_New(NULL);
    PyObject *th = codes ? hex_of(tid) : NULL, *sh = th ? hex_of(sid) : NULL;
    PyObject *us = sh ? PyLong_FromUnsignedLongLong(start / 1000) : NULL;
    PyObject *item = us ? PyTuple_Pack(8, res->run_id, res->level, th, sh, us, codes, evs, res->stamp) : NULL;
    if (item == NULL || PyList_Append(res->out, item) < 0)
        st = ERR;
    Py_XDECREF(item);
    Py_XDECREF(us);
    Py_XDECREF(sh);
    Py_XDECREF(th);
    Py_XDECREF(codes);
    Py_DECREF(evs);
    return st;
}

/* the resource's attributes that matter (service, run id, rank, level; the last of each key, as a dict keeps it);
 * *stamped set when a key starts with the config stamp's prefix (model/config_stamp.py: Python reads that stamp) */
static int read_resource(Rd r, PyObject **vals, int *stamped)
{
    uint32_t f, seen = 0;
    int wt;
    uint64_t v;
    Rd sub, key, val;
    while (r.p < r.end) {
        if (rd_tag(&r, &f, &wt) != OK || f > 2 || wt != (f == 1 ? 2 : 0) || rd_value(&r, wt, &v, &sub) != OK)
            return FALLBACK;
        if (f == 2) {
            if (seen)
                return FALLBACK;
            seen = 1;
            continue;
        }
        if (check_msg(sub, M_KV, 0) != OK)
            return FALLBACK;
        rd_kv(sub, &key, &val);
        if (key_starts(key, k_config))
            *stamped = 1;
        PyObject *keys[4] = {k_service, k_run_id, k_cp_rank, k_trace_level};
        for (int i = 0; i < 4; i++)
            if (key_is(key, keys[i])) {
                PyObject *x = any_to_py(val);
                if (x == NULL)
                    return ERR;
                Py_XSETREF(vals[i], x);
            }
    }
    return OK;
}

static int read_resource_spans(Rd r, Py_ssize_t *seen, PyObject *out)
{
    uint32_t f, once = 0;
    int wt;
    uint64_t v;
    Rd sub;
    PyObject *vals[4] = {0}, *stamp = NULL;
    int st = OK, stamped = 0;
    for (Rd q = r; st == OK && q.p < q.end;) {   /* the resource first, wherever it is */
        if (rd_tag(&q, &f, &wt) != OK || f > 3 || wt != 2 || rd_value(&q, wt, &v, &sub) != OK)
            st = FALLBACK;
        else if (f != 2 && (once & (1u << f)))
            st = FALLBACK;
        else if (f == 1) {
            st = read_resource(sub, vals, &stamped);
            if (st == OK && stamped && (stamp = PyBytes_FromStringAndSize((const char *)sub.p, sub.end - sub.p)) == NULL)
                st = ERR;
        }
        else if (f == 3 && !utf8_ok(sub.p, sub.end - sub.p))
            st = FALLBACK;
        once |= 1u << f;
    }
    Res res = {Py_None, Py_None, vals[2] ? vals[2] : Py_None, stamp ? stamp : Py_None, 0, 0, out};
    if (st == OK && vals[0] && PyUnicode_Check(vals[0]) && (res.own = PyObject_RichCompareBool(vals[0], watch_service, Py_EQ)) < 0)
        st = ERR;
    if (vals[1] && PyUnicode_Check(vals[1]))
        res.run_id = vals[1];
    if (vals[3] && PyLong_CheckExact(vals[3]))
        res.level = vals[3];
    for (Rd q = r; st == OK && q.p < q.end;) {
        rd_next(&q, &f, &v, &sub);
        if (f != 2)
            continue;
        uint32_t sseen = 0;
        for (Rd s = sub; st == OK && s.p < s.end;) {   /* a ScopeSpans */
            Rd x;
            if (rd_tag(&s, &f, &wt) != OK || f > 3 || wt != 2 || rd_value(&s, wt, &v, &x) != OK ||
                (f != 2 && (sseen & (1u << f))))
                st = FALLBACK;
            else if (f == 1)
                st = check_msg(x, M_SCOPE, 0);
            else if (f == 3)
                st = utf8_ok(x.p, x.end - x.p) ? OK : FALLBACK;
            else
                st = read_span(x, &res);
            sseen |= 1u << f;
        }
    }
    *seen += res.seen;
    for (int i = 0; i < 4; i++)
        Py_XDECREF(vals[i]);
    Py_XDECREF(stamp);
    return st;
}

static PyObject *py_decode(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    if (reader_open("_otlpin", arg, &b) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    Py_ssize_t seen = 0;
    int st = out ? OK : ERR;
    for (Rd r = {b.buf, (const uint8_t *)b.buf + b.len}; st == OK && r.p < r.end;) {
        uint32_t f;
        int wt;
        uint64_t v;
        Rd sub;
        if (rd_tag(&r, &f, &wt) != OK || f != 1 || wt != 2 || rd_value(&r, wt, &v, &sub) != OK)
            st = FALLBACK;
        else
            st = read_resource_spans(sub, &seen, out);
    }
    PyBuffer_Release(&b);
    return st == OK ? Py_BuildValue("(nN)", seen, out) : reader_decline(st, out);
}

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    static const ReaderKey bytes_keys[] = {{"service", &k_service}, {"stamp_prefix", &k_config}};
    static const ReaderKey str_keys[] = {{"watch_service", &watch_service}};
    if (reader_configure_spans(args, bytes_keys, 2, str_keys, 1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS, READER_SPANS_CONFIGURE_DOC},
    {"decode", py_decode, METH_O, "decode(body) -> (spans_seen, spans) | None (None: let Python decide)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlpin(void) { return PyModule_Create(&module); }
