/* OTLP JSON lines (the file sink's output, an OTel Collector file exporter's) read in C for ``cptrace-otel check``
 * and ``report``: one line's ExportTraceServiceRequest read straight from its text into the records
 * sources.otlpfile.collect builds from json.loads of it, without a Python object per JSON value; loaded by
 * otlpjson.py.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags, event_slots, keys, parse_value)   as otlpin.c takes them
 *   read(line, src) -> [(resource, spans, ranks, records), ...] | None
 *       line: a str, or bytes as the file holds them (read only when they are UTF-8: else None, and the caller
 *       reads their text decoded with replacement characters)
 *       one row per resourceSpans element, in order. resource: the dict of its resource's attributes, each value as
 *       otlpfile.any_value reads it; spans: how many spans it holds; ranks: the distinct ranks of its spans in order
 *       (a span's rank attribute when it has one, else its resource's cp rank attribute; 0 where that is not an int);
 *       records: rank -> [(epoch, seq, ts, Event), ...], its spans' records in order, as collect builds them
 *       (Event.src = src, line_no 0; finding events and events without an int seq left out).
 *
 * None means "let Python decide": the C reader answers only for text it reads with certainty: strict JSON (no NaN,
 * no leading zeros, no raw control characters, nesting under JSON_MAX_DEPTH, nothing after the object), the
 * camelCase field names, no key that collect reads given twice, every AnyValue it reads an object of exactly one of
 * stringValue (a string), intValue (an integer, or a string of an optional '-' and digits), doubleValue (a number),
 * boolValue (true or false) and arrayValue ({"values": [AnyValue, ...]}), every attribute an object with a plain
 * "key" string and a "value", every string it keeps without escapes, record texts parse_value reads and range
 * summaries written as the exporter writes them. Anything else is answered with None, and the caller reads the line
 * with json and collect, which give the events, or the malformed-line report, themselves. So the C reader never
 * reads a line differently from the Python one.
 *
 * Why C: ``check`` over OTLP JSON lines spent about 85% of its time in json.loads and collect's walk of the dicts
 * (a dict per attribute and per value) before a rule ran: a tenth of the log reader's speed.
 *
 * Twin: cptrace_otel.analyze.sources.otlpfile.collect
 * Held equal by: tests/unit/test_otlpjson_c.py
 */
#include "event.h"
#include "jsonscan.h"

#include <stdint.h>
#include <string.h>

/* how any_value reads a value: as otlpfile.any_value does; as attributes_to_fields keeps a record's field (a text
 * through parse_value); or only checked to be one any_value reads without error (no object built) */
enum { AS_VALUE, AS_FIELD, AS_CHECK };

/* an intValue: a JSON integer, or a string of an optional '-' and digits (int() of anything else: the twin) */
static int int_value(Rd *r, int check, PyObject **out)
{
    Str s;
    int is_int, esc;
    ws(r);
    if (r->p < r->end && *r->p == '"') {
        if (str_tok(r, &s, &esc) != OK || esc)
            return FALLBACK;
        Py_ssize_t i = s.n > 0 && s.p[0] == '-';
        if (i == s.n)
            return FALLBACK;
        for (; i < s.n; i++)
            if (!is_digit(s.p[i]))
                return FALLBACK;
    } else if (num_tok(r, &s, &is_int) != OK || !is_int) {
        return FALLBACK;
    }
    if (check)
        return s.n > CPTRACE_VALUE_MAX_INT_DIGITS ? FALLBACK : OK;
    return int_py(s, out);
}

/* a doubleValue: a JSON number, as float() of json's value reads it (a string such as "NaN": the twin) */
static int double_value(Rd *r, int check, PyObject **out)
{
    Str s;
    int is_int;
    char buf[64];
    if (num_tok(r, &s, &is_int) != OK || s.n >= (Py_ssize_t)sizeof buf || (is_int && s.n > 15))
        return FALLBACK;   /* (float() of an int past 2^53 rounds: the twin does it) */
    if (check)
        return OK;
    memcpy(buf, s.p, (size_t)s.n);
    buf[s.n] = 0;
    double d = PyOS_string_to_double(buf, NULL, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return FALLBACK;
    }
    return (*out = PyFloat_FromDouble(d)) ? OK : ERR;
}

static int any_value(Rd *r, int depth, int mode, PyObject **out);

typedef struct {
    int depth, check;
    PyObject *lst;   /* the values (NULL when check) */
} ArraySink;

/* one value of an arrayValue's list (an element read by each(), p an ArraySink) */
static int array_item(Rd *r, void *p)
{
    ArraySink *a = p;
    PyObject *x = NULL;
    int st = any_value(r, a->depth + 1, a->check ? AS_CHECK : AS_VALUE, &x);
    if (st == OK && !a->check) {
        if (PyList_Append(a->lst, x) < 0)
            st = ERR;
        Py_DECREF(x);
    }
    return st;
}

/* an arrayValue: {"values": [AnyValue, ...]} or {} -> a list of any_value of each (a record's list field is kept as
 * any_value builds it, as attributes_to_fields keeps every value that is not a str) */
static int array_value(Rd *r, int depth, int check, PyObject **out)
{
    if (!lit(r, '{'))
        return FALLBACK;
    ArraySink a = {depth, check, check ? NULL : PyList_New(0)};
    if (!check && a.lst == NULL)
        return ERR;
    PyObject *lst = a.lst;
    int st = OK;
    if (!lit(r, '}')) {
        Str k;
        if (plain_str(r, &k) != OK || !str_is(k, "values") || !lit(r, ':'))
            st = FALLBACK;
        else
            st = each(r, array_item, &a);
        if (st == OK && !lit(r, '}'))
            st = FALLBACK;
    }
    if (st != OK) {
        Py_XDECREF(lst);
        return st;
    }
    if (!check)
        *out = lst;
    return OK;
}

/* one AnyValue (r at its '{'), read as mode asks: OK with *out (a new reference; none for AS_CHECK), FALLBACK or
 * ERR with *out untouched */
static int any_value(Rd *r, int depth, int mode, PyObject **out)
{
    if (depth > JSON_MAX_DEPTH || !lit(r, '{'))
        return FALLBACK;
    Str k;
    if (plain_str(r, &k) != OK || !lit(r, ':'))
        return FALLBACK;   /* (also an empty AnyValue, which any_value reads as None: the twin) */
    int check = mode == AS_CHECK, st;
    PyObject *x = NULL;
    if (str_is(k, "stringValue")) {
        Str s;
        int esc;
        if (str_tok(r, &s, &esc) != OK)
            st = FALLBACK;
        else if (check)
            st = OK;
        else if (esc)
            st = FALLBACK;
        else if (mode == AS_FIELD)
            st = value_text(s.p, s.n, parse_value_fn, &x);
        else
            st = (x = value_name(s.p, s.n)) ? OK : FALLBACK;
    } else if (str_is(k, "intValue")) {
        st = int_value(r, check, &x);
    } else if (str_is(k, "doubleValue")) {
        st = double_value(r, check, &x);
    } else if (str_is(k, "boolValue")) {
        ws(r);
        int t = r->p < r->end && *r->p == 't';
        st = word(r, t ? "true" : "false");
        if (st == OK && !check)
            x = Py_NewRef(t ? Py_True : Py_False);
    } else if (str_is(k, "arrayValue")) {
        st = array_value(r, depth, check, &x);
    } else {
        st = FALLBACK;
    }
    if (st == OK && !lit(r, '}'))
        st = FALLBACK;   /* a second key: the twin reads it by its own precedence */
    if (st != OK) {
        if (st == FALLBACK)
            PyErr_Clear();   /* (value_name's decode error, if any: the twin reads it) */
        Py_XDECREF(x);
        return st;
    }
    if (!check)
        *out = x;
    return OK;
}

/* one attribute {"key": str, "value": AnyValue} (other keys skipped, as collect skips them) as the sink's add
 * function sees it: its key, and a reader at its value, which add reads as the key asks (attr_value) */
typedef struct {
    Str key;
    Rd *val;
    int whole;   /* val holds the value's text and nothing else (it came before the key, and was skipped) */
} Attr;

typedef struct {
    int (*add)(const Attr *, void *);
    void *ctx;
} AttrSink;

/* the value of an attribute, read as mode asks */
static int attr_value(const Attr *a, int mode, PyObject **out)
{
    int st = any_value(a->val, 8, mode, out);
    if (st == OK && a->whole && a->val->p != a->val->end) {   /* (only whitespace can remain: skip read it) */
        if (mode != AS_CHECK)
            Py_CLEAR(*out);
        st = FALLBACK;
    }
    return st;
}

/* one attribute handed to the sink: read in one pass where its key comes first (as every encoder writes it), else
 * its value skipped and read once the key is known */
static int attr_item(Rd *r, void *p)
{
    const AttrSink *sink = p;
    int n = 0, seen = 0, st = OK;
    Rd later = {NULL, NULL};
    Attr a = {{NULL, 0}, NULL, 0};
    Str k;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "key")) {
            if (seen & 1 || plain_str(r, &a.key) != OK)
                return FALLBACK;
            seen |= 1;
        } else if (str_is(k, "value")) {
            if (seen & 2)
                return FALLBACK;
            seen |= 2;
            ws(r);
            if (seen & 1) {
                a.val = r;
                if ((st = sink->add(&a, sink->ctx)) != OK)
                    return st;
            } else {
                later.p = r->p;
                if (skip(r, 8) != OK)
                    return FALLBACK;
                later.end = r->p;
            }
        } else if (skip(r, 8) != OK) {
            return FALLBACK;
        }
    }
    if (st != OK || seen != 3)
        return FALLBACK;   /* (no key, or no value, which any_value reads as None: the twin) */
    if (later.p == NULL)
        return OK;
    a.val = &later;
    a.whole = 1;
    return sink->add(&a, sink->ctx);
}

/* an object (r at its '{') whose one key collect reads holds a list, each element read by item(r, ctx); its
 * other keys skipped (values nested depth deep in the line); the key twice, or its alias (the spelling protobuf's
 * JSON mapping also reads, or NULL), are the twin's */
static int list_field(Rd *r, const char *key, const char *alias, int depth, int (*item)(Rd *, void *), void *ctx)
{
    int n = 0, seen = 0, st = OK;
    Str k;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, key))
            st = seen++ ? FALLBACK : each(r, item, ctx);
        else if (alias != NULL && str_is(k, alias))
            st = FALLBACK;
        else
            st = skip(r, depth);
    }
    return st;
}

/* a list "[attr, ...]" (r at its '['), each attribute handed to add(a, ctx): OK, FALLBACK or ERR */
static int read_attrs(Rd *r, int (*add)(const Attr *, void *), void *ctx)
{
    AttrSink sink = {add, ctx};
    return each(r, attr_item, &sink);
}

/* -- resource ---------------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject *attrs;    /* key -> value */
    PyObject *rank;     /* the last cp rank attribute's value, or NULL */
} Resource;

static int add_resource_attr(const Attr *a, void *ctx)
{
    Resource *res = ctx;
    PyObject *v = NULL, *k;
    int st = attr_value(a, AS_VALUE, &v);
    if (st != OK)
        return st;
    if ((k = value_name(a->key.p, a->key.n)) == NULL || PyDict_SetItem(res->attrs, k, v) < 0)
        st = ERR;
    if (st == OK && str_is_key(a->key, k_cp_rank))
        Py_XSETREF(res->rank, Py_NewRef(v));
    Py_XDECREF(k);
    Py_DECREF(v);
    return st;
}

static int read_resource(Rd *r, Resource *res)
{
    AttrSink sink = {add_resource_attr, res};
    return list_field(r, "attributes", NULL, 4, attr_item, &sink);
}

/* -- spans and their events --------------------------------------------------------------------------------------- */

typedef struct {
    PyObject *src;       /* Event.src */
    PyObject *ranks;     /* rank -> None: the distinct span ranks, in order */
    PyObject *records;   /* rank -> [(epoch, seq, ts, Event)] */
    Py_ssize_t spans;
} Out;

typedef struct {
    PyObject *fields, *seq, *epoch, *level;
    ValueFields vf;
} EventAttrs;

static int add_event_attr(const Attr *a, void *ctx)
{
    EventAttrs *ea = ctx;
    Py_ssize_t plen = PyBytes_GET_SIZE(k_prefix);
    PyObject *x = NULL;
    int st;
    if (a->key.n >= plen && memcmp(a->key.p, PyBytes_AS_STRING(k_prefix), (size_t)plen) == 0) {
        if ((st = attr_value(a, AS_FIELD, &x)) == OK)
            st = value_field_add(&ea->vf, ea->fields, a->key.p + plen, a->key.n - plen, rng_suffix, x);
        return st;
    }
    PyObject **slot = str_is_key(a->key, k_seq) ? &ea->seq : str_is_key(a->key, k_epoch) ? &ea->epoch
                      : str_is_key(a->key, k_level) ? &ea->level : NULL;
    if (slot == NULL)
        return attr_value(a, AS_CHECK, NULL);
    if ((st = attr_value(a, AS_VALUE, &x)) == OK)
        Py_XSETREF(*slot, x);   /* (the last one, as collect's dict keeps it) */
    return st;
}

/* one span event: its record (if it is one) appended to *lst (created, and put in out->records, on the first) */
static int read_event(Rd *r, PyObject *rank, Out *out, PyObject **lst)
{
    EventAttrs ea = {PyDict_New(), NULL, NULL, NULL, {0}};
    if (ea.fields == NULL)
        return ERR;
    Str name = {"", 0}, ts = {0, 0}, k;
    int n = 0, seen = 0, st = OK, is_int;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "name"))
            st = seen & 1 || plain_str(r, &name) != OK ? FALLBACK : (seen |= 1, OK);
        else if (str_is(k, "timeUnixNano")) {
            ws(r);
            if (seen & 2)
                st = FALLBACK;
            else if (r->p < r->end && *r->p == '"')
                st = plain_str(r, &ts);
            else
                st = num_tok(r, &ts, &is_int) != OK || !is_int ? FALLBACK : OK;
            seen |= 2;
        } else if (str_is(k, "attributes"))
            st = seen & 4 ? FALLBACK : (seen |= 4, read_attrs(r, add_event_attr, &ea));
        else if (str_is(k, "time_unix_nano"))
            st = FALLBACK;
        else
            st = skip(r, 6);
    }
    st = value_fields_end(&ea.vf, st);
    PyObject *nm = NULL, *t = NULL;
    if (st == OK && !str_is_key(name, k_ev_violation) && ea.seq && PyLong_CheckExact(ea.seq)) {
        /* the event time: int() of the string or number (an empty or odd string: the twin) */
        if (ts.p == NULL)
            t = Py_NewRef(zero_obj);
        else {
            Py_ssize_t i = ts.n > 0 && ts.p[0] == '-';
            st = i < ts.n ? OK : FALLBACK;
            for (; st == OK && i < ts.n; i++)
                if (!is_digit(ts.p[i]))
                    st = FALLBACK;
            if (st == OK)
                st = int_py(ts, &t);
        }
        if (st == OK && (nm = value_name(name.p, name.n)) == NULL) {
            PyErr_Clear();
            st = FALLBACK;
        }
        if (st == OK) {
            PyObject *ep = ea.epoch && PyLong_CheckExact(ea.epoch) ? ea.epoch : zero_obj;
            PyObject *lv = ea.level && PyLong_CheckExact(ea.level) ? ea.level : one_obj;
            PyObject *argv[EVENT_NFIELDS] = {nm, rank, ea.seq, t, ep, ea.fields, lv, out->src, zero_obj};
            PyObject *ev = event_new(argv), *row = NULL;
            if (ev == NULL || (row = PyTuple_Pack(4, ep, ea.seq, t, ev)) == NULL)
                st = ERR;
            if (st == OK && *lst == NULL) {
                *lst = PyDict_GetItemWithError(out->records, rank);   /* borrowed */
                if (*lst == NULL && !PyErr_Occurred() && (*lst = PyList_New(0)) != NULL) {
                    if (PyDict_SetItem(out->records, rank, *lst) < 0)
                        st = ERR;
                    Py_DECREF(*lst);   /* (the dict holds it) */
                }
                if (*lst == NULL)
                    st = ERR;
            }
            if (st == OK && PyList_Append(*lst, row) < 0)
                st = ERR;
            Py_XDECREF(ev);
            Py_XDECREF(row);
        }
    }
    Py_XDECREF(nm);
    Py_XDECREF(t);
    Py_DECREF(ea.fields);
    Py_XDECREF(ea.seq);
    Py_XDECREF(ea.epoch);
    Py_XDECREF(ea.level);
    return st;
}

typedef struct {
    PyObject *rank;
    Out *out;
    PyObject *lst;   /* the rank's list of records (borrowed from out->records), once there is one */
} EventSink;

static int event_item(Rd *r, void *p)
{
    EventSink *sink = p;
    return read_event(r, sink->rank, sink->out, &sink->lst);
}

static int read_events(Rd *r, PyObject *rank, Out *out)
{
    EventSink sink = {rank, out, NULL};
    return each(r, event_item, &sink);
}

typedef struct {
    PyObject *rank;   /* the last rank attribute's value, or NULL */
} SpanAttrs;

static int add_span_attr(const Attr *a, void *ctx)
{
    SpanAttrs *sa = ctx;
    if (!str_is_key(a->key, k_rank))
        return attr_value(a, AS_CHECK, NULL);   /* (read only to be sure collect reads it without error) */
    PyObject *x = NULL;
    int st = attr_value(a, AS_VALUE, &x);
    if (st == OK)
        Py_XSETREF(sa->rank, x);
    return st;
}

/* a span's rank: its rank attribute when it has one, else its resource's cp rank attribute (rrank); 0 where that
 * is not an int (borrowed) */
static PyObject *span_rank(const SpanAttrs *sa, PyObject *rrank)
{
    PyObject *rank = sa->rank ? sa->rank : rrank;
    return rank != NULL && PyLong_CheckExact(rank) ? rank : zero_obj;
}

/* one span: its rank noted in out->ranks, its records appended to out->records; rrank: its resource's cp rank */
static int read_span(Rd *r, PyObject *rrank, Out *out)
{
    SpanAttrs sa = {NULL};
    Rd events = {NULL, NULL};
    int n = 0, seen = 0, st = OK;
    Str k;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "attributes"))
            st = seen & 1 ? FALLBACK : (seen |= 1, read_attrs(r, add_span_attr, &sa));
        else if (str_is(k, "events")) {
            if (seen & 2)
                st = FALLBACK;
            else if (seen & 1)   /* the rank is known (the attributes came first, as encoders write them) */
                st = read_events(r, span_rank(&sa, rrank), out);
            else {   /* read after the span, once its attributes are */
                ws(r);
                events.p = r->p;
                if ((st = skip(r, 5)) == OK)
                    events.end = r->p;
            }
            seen |= 2;
        } else
            st = skip(r, 5);
    }
    PyObject *rank = span_rank(&sa, rrank);
    out->spans++;
    if (st == OK && PyDict_SetDefault(out->ranks, rank, Py_None) == NULL)
        st = ERR;
    if (st == OK && events.p)
        st = read_events(&events, rank, out);
    Py_XDECREF(sa.rank);
    return st;
}

typedef struct {
    PyObject *rrank;   /* the resource's cp rank attribute, or NULL */
    Out *out;
} SpanSink;

static int span_item(Rd *r, void *p)
{
    SpanSink *sink = p;
    return read_span(r, sink->rrank, sink->out);
}

/* one scopeSpans element: its spans */
static int scope_item(Rd *r, void *p)
{
    return list_field(r, "spans", NULL, 4, span_item, p);
}

static int read_scope_spans(Rd *r, PyObject *rrank, Out *out)
{
    SpanSink sink = {rrank, out};
    return each(r, scope_item, &sink);
}

typedef struct {
    PyObject *src, *rows;
} RowSink;

/* one resourceSpans element: its row appended to rows */
static int resource_spans_item(Rd *r, void *p)
{
    PyObject *src = ((RowSink *)p)->src, *rows = ((RowSink *)p)->rows;
    Resource res = {PyDict_New(), NULL};
    Out out = {src, PyDict_New(), PyDict_New(), 0};
    Rd scopes = {NULL, NULL};
    int n = 0, seen = 0, st = res.attrs && out.ranks && out.records ? OK : ERR;
    Str k;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "resource"))
            st = seen & 1 ? FALLBACK : (seen |= 1, read_resource(r, &res));
        else if (str_is(k, "scopeSpans")) {
            st = seen & 2 ? FALLBACK : OK;
            seen |= 2;
            ws(r);
            if (st == OK && (seen & 1))
                st = read_scope_spans(r, res.rank, &out);
            else if (st == OK) {   /* before the resource: read once its cp rank is known */
                scopes.p = r->p;
                if ((st = skip(r, 2)) == OK)
                    scopes.end = r->p;
            }
        } else if (str_is(k, "scope_spans"))
            st = FALLBACK;
        else
            st = skip(r, 2);
    }
    if (st == OK && scopes.p)
        st = read_scope_spans(&scopes, res.rank, &out);
    PyObject *ranks = NULL, *row = NULL;
    if (st == OK && (ranks = PyDict_Keys(out.ranks)) == NULL)
        st = ERR;
    if (st == OK && ((row = Py_BuildValue("(OnOO)", res.attrs, out.spans, ranks, out.records)) == NULL ||
                     PyList_Append(rows, row) < 0))
        st = ERR;
    Py_XDECREF(row);
    Py_XDECREF(ranks);
    Py_XDECREF(res.attrs);
    Py_XDECREF(res.rank);
    Py_XDECREF(out.ranks);
    Py_XDECREF(out.records);
    return st;
}

/* 1 when p[0:n] is UTF-8 as Python's strict decoder takes it (no overlong forms, no surrogates, at most U+10FFFF):
 * then its decoded text's UTF-8 is these bytes, and every part of it between ASCII delimiters decodes alone */
static int utf8_valid(const unsigned char *p, Py_ssize_t n)
{
    const unsigned char *e = p + n;
    while (p < e) {
        while (e - p >= 8) {   /* ASCII, 8 bytes at a time */
            uint64_t w;
            memcpy(&w, p, 8);
            if (w & 0x8080808080808080ULL)
                break;
            p += 8;
        }
        if (p >= e)
            break;
        unsigned c = *p;
        Py_ssize_t left = e - p;
        if (c < 0x80) {
            p++;
        } else if (c < 0xC2) {
            return 0;
        } else if (c < 0xE0) {
            if (left < 2 || (p[1] & 0xC0) != 0x80)
                return 0;
            p += 2;
        } else if (c < 0xF0) {
            if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (c == 0xE0 && p[1] < 0xA0) ||
                (c == 0xED && p[1] >= 0xA0))
                return 0;
            p += 3;
        } else if (c < 0xF5) {
            if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80 ||
                (c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90))
                return 0;
            p += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static PyObject *py_read(PyObject *self, PyObject *args)
{
    PyObject *line, *src;
    if (!PyArg_ParseTuple(args, "OU:read", &line, &src))
        return NULL;
    if (!reader_configured("_otlpjson"))
        return NULL;
    Py_ssize_t n;
    const char *p;
    Py_buffer view = {0};
    if (PyUnicode_Check(line)) {
        p = PyUnicode_AsUTF8AndSize(line, &n);
        if (p == NULL) {   /* (a lone surrogate: json reads it) */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    } else {
        /* a line as the file holds it (bytes, or a memoryview of the reader's buffer): read only when it is UTF-8
         * (else: decoded with replacement characters by the caller, a text the twin reads). Nothing read keeps a
         * pointer into it: every value read is copied into its own object */
        if (PyObject_GetBuffer(line, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "read: line must be str or bytes-like");
            return NULL;
        }
        p = view.buf;
        n = view.len;
        if (!utf8_valid((const unsigned char *)p, n)) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
    }
    Rd r = {p, p + n};
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        if (view.obj != NULL)
            PyBuffer_Release(&view);
        return NULL;
    }
    RowSink sink = {src, rows};
    int st = list_field(&r, "resourceSpans", "resource_spans", 1, resource_spans_item, &sink);
    ws(&r);
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    if (st == OK && r.p != r.end)
        st = FALLBACK;
    return st == OK ? rows : reader_decline(st, rows);
}

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    if (reader_configure_spans(args, NULL, 0, NULL, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS, READER_SPANS_CONFIGURE_DOC},
    {"read", py_read, METH_VARARGS,
     "read(line: str | bytes-like, src) -> [(resource, spans, ranks, records), ...] | None (None: let Python decide)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpjson", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlpjson(void) { return PyModule_Create(&module); }
