/* Jaeger search answers (``GET /api/traces``, Jaeger's JSON model) read in C for ``cptrace-otel watch``: the answer's
 * bytes indexed, and each trace's records built straight from its bytes, without a Python object per JSON value;
 * loaded by jaegerin.py.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags, event_slots, keys, parse_value)   as otlpin.c takes them
 *   index(body, max_item) -> [(trace_id, starts, off, end), ...] | None
 *       the ``data`` elements of ``{"data": [...], ..., "errors": null}``: each trace's id, its spans' startTime
 *       values (µs, in span order) and its byte range in body
 *   records(text) -> (run_ids, spans) | None
 *       one trace (a ``data`` element): run_ids its processes carry; spans: one (service, rank, codes, trace_id,
 *       span_id, start_us, level, seqs, events) per span in order. rank: the span's rank tag, else its process's
 *       cp rank tag, else 0; codes: the span's violation tag (str) or None; level: the process's trace-level tag
 *       (int) or None; seqs: each log's first seq field (int) or None; events: the span's records as Events (logs
 *       with a seq, the finding events left out), as sources.otlpfile.collect builds them from
 *       sources.tracedocs.v2_trace_to_otlp of the trace.
 *
 * None means "let Python decide": the C reader answers only for text it reads with certainty: valid JSON (strict:
 * no NaN, no leading zeros, no raw control characters, nesting under JSON_MAX_DEPTH), every tag and log field an object
 * {"key": str, "type": "string"|"int64"|"float64"|"bool", "value": of that JSON kind}, no object key read twice,
 * every string it keeps without escapes and valid UTF-8, processes given by processID (not inline), a trace no longer
 * than max_item bytes, an ``errors`` that is null or []. Anything else, and a record value parse_value refuses, is
 * answered with None and the caller runs the Python twin on the same bytes, which gives the events, Unread or
 * errors itself. So the C reader never reads an answer differently from the Python one.
 *
 * Why C: in Python, watch spent most of its CPU decoding Jaeger's JSON into dicts (twice: the stream split, then
 * each kept trace), converting them to OTLP/JSON dicts and those to Events, before a rule ran.
 *
 * Twin: cptrace_otel.analyze.sources.jaegerstream.iter_data
 * Twin: cptrace_otel.analyze.jaeger_read.records_py
 * Held equal by: tests/unit/test_jaegerin.py, tests/integration/test_watch_reader.py
 */
#include "event.h"
#include "jsonscan.h"

#include <stdint.h>
#include <string.h>

#define MAX_PROCS 256

static PyObject *thousand_obj;   /* the rest of what configure sets is the readers' shared state (value.h) */

/* -- index -------------------------------------------------------------------------------------------------------- */

/* one span of a trace: its startTime (0 when it has none) appended to the list starts */
static int span_start(Rd *r, void *starts)
{
    PyObject *t = NULL;
    int st = OK, n = 0, is_int;
    Str k, num;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (!str_is(k, "startTime"))
            st = skip(r, 3);
        else if (t != NULL || num_tok(r, &num, &is_int) != OK || !is_int)
            st = FALLBACK;
        else
            st = int_py(num, &t);
    }
    if (st == OK && t == NULL)
        t = Py_NewRef(zero_obj);
    if (st == OK && PyList_Append(starts, t) < 0)
        st = ERR;
    Py_XDECREF(t);
    return st;
}

typedef struct {
    const char *base;      /* the answer's first byte */
    Py_ssize_t max_item;   /* the largest trace read (larger: the twin hands it out as Unread) */
    PyObject *out;         /* the traces' rows */
} TraceSink;

/* one trace of the data array (an element read by each(), p a TraceSink): (trace_id, starts, off, end) appended to
 * out */
static int index_trace(Rd *r, void *p)
{
    const TraceSink *sink = p;
    const char *base = sink->base;
    PyObject *out = sink->out;
    ws(r);
    const char *start = r->p;
    PyObject *tid = NULL, *starts = PyList_New(0);
    if (starts == NULL)
        return ERR;
    int st = OK, n = 0, seen_id = 0, seen_spans = 0;
    Str k;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "traceID")) {
            Str v;
            if (seen_id++ || plain_str(r, &v) != OK || (tid = str_py(v)) == NULL)
                st = FALLBACK;
        } else if (str_is(k, "spans")) {
            st = seen_spans++ ? FALLBACK : each(r, span_start, starts);
        } else {
            st = skip(r, 2);
        }
    }
    if (st == OK && r->p - start > sink->max_item)
        st = FALLBACK;   /* too large to check: the Python twin hands it out as Unread */
    if (st == OK) {
        PyObject *row = Py_BuildValue("(OOnn)", tid ? tid : Py_None, starts, (Py_ssize_t)(start - base),
                                      (Py_ssize_t)(r->p - base));
        if (row == NULL || PyList_Append(out, row) < 0)
            st = ERR;
        Py_XDECREF(row);
    }
    Py_XDECREF(tid);
    Py_DECREF(starts);
    return st;
}

static PyObject *py_index(PyObject *self, PyObject *args)
{
    Py_buffer b;
    Py_ssize_t max_item;
    if (!PyArg_ParseTuple(args, "y*n:index", &b, &max_item))
        return NULL;
    if (!reader_configured("_jaegerin")) {
        PyBuffer_Release(&b);
        return NULL;
    }
    Rd r = {b.buf, (const char *)b.buf + b.len};
    PyObject *out = PyList_New(0);
    int st = out ? OK : ERR, n = 0;
    TraceSink sink = {b.buf, max_item, out};
    Str k;
    while (st == OK && next_key(&r, &n, &k, &st)) {
        if (n == 1)   /* the layout Jaeger writes: "data" first (the Python twin parses any other layout whole) */
            st = str_is(k, "data") ? each(&r, index_trace, &sink) : FALLBACK;
        else if (str_is(k, "data"))
            st = FALLBACK;
        else if (str_is(k, "errors")) {   /* null or []: no error (anything else: the twin raises it) */
            ws(&r);
            if (word(&r, "null") != OK && !(lit(&r, '[') && lit(&r, ']')))
                st = FALLBACK;
        } else
            st = skip(&r, 1);
    }
    if (st == OK && n < 2)
        st = FALLBACK;   /* {}: no data (the twin) */
    ws(&r);
    if (st == OK && r.p != r.end)
        st = FALLBACK;
    PyBuffer_Release(&b);
    return st == OK ? out : reader_decline(st, out);
}

/* -- records ------------------------------------------------------------------------------------------------------ */

typedef struct {
    Str key;
    char type;        /* 's' string, 'i' int64, 'f' float64, 'b' bool */
    Str val;          /* the value's token (a string's body) */
    int esc, is_int;  /* the string holds an escape; the number is an integer token */
} Tag;

/* a tag's value at r, of its type tv (read as far as its token): OK, or FALLBACK (another type, another JSON kind) */
static int tag_value(Rd *r, Str tv, Tag *t)
{
    ws(r);
    if (r->p >= r->end)
        return FALLBACK;
    if (str_is(tv, "string")) {
        t->type = 's';
        return str_tok(r, &t->val, &t->esc);
    }
    if (str_is(tv, "int64") || str_is(tv, "float64")) {
        t->type = tv.p[0] == 'i' ? 'i' : 'f';
        if (t->type == 'i' && *r->p == '"') {
            /* Jaeger writes an int64 past 2^53 as a decimal string (JavaScript's doubles): int() of it */
            if (str_tok(r, &t->val, &t->esc) != OK || t->esc || t->val.n == 0)
                return FALLBACK;
            for (Py_ssize_t i = t->val.p[0] == '-'; i < t->val.n; i++)
                if (!is_digit(t->val.p[i]))
                    return FALLBACK;
            t->is_int = 1;
            return t->val.n > (t->val.p[0] == '-') ? OK : FALLBACK;
        }
        if (num_tok(r, &t->val, &t->is_int) != OK || (t->type == 'i' && !t->is_int))
            return FALLBACK;
        return OK;
    }
    if (str_is(tv, "bool")) {
        t->type = 'b';
        t->is_int = *r->p == 't';
        return word(r, t->is_int ? "true" : "false");
    }
    return FALLBACK;
}

/* one {"key": .., "type": .., "value": ..} (any key order, each once; the value read in place when its type came
 * first, as Jaeger writes them) */
static int read_tag(Rd *r, Tag *t)
{
    int n = 0, st = OK, seen = 0, done = 0;
    Str tv = {0, 0}, k;
    const char *vstart = NULL;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "key")) {
            if (seen & 1 || plain_str(r, &t->key) != OK)
                return FALLBACK;
            seen |= 1;
        } else if (str_is(k, "type")) {
            if (seen & 2 || plain_str(r, &tv) != OK)
                return FALLBACK;
            seen |= 2;
        } else if (str_is(k, "value")) {
            if (seen & 4)
                return FALLBACK;
            seen |= 4;
            if (seen & 2) {
                if (tag_value(r, tv, t) != OK)
                    return FALLBACK;
                done = 1;
            } else {
                ws(r);
                vstart = r->p;
                if (skip(r, 4) != OK)
                    return FALLBACK;
            }
        } else {
            return FALLBACK;
        }
    }
    if (st != OK || seen != 7 || !utf8_ok(t->key.p, t->key.n))
        return FALLBACK;
    Rd v = {vstart, r->p};
    return done ? OK : tag_value(&v, tv, t);
}

/* the Python value of a tag as sources.otlpfile.any_value reads tracedocs._value's AnyValue */
static int tag_py(const Tag *t, PyObject **out)
{
    switch (t->type) {
    case 's':
        if (t->esc)
            return FALLBACK;
        return (*out = str_py(t->val)) ? OK : FALLBACK;
    case 'i':
        return int_py(t->val, out);
    case 'f': {
        char buf[64];
        if (t->val.n >= (Py_ssize_t)sizeof buf || (t->is_int && t->val.n > 15))   /* (float() of a long int: twin) */
            return FALLBACK;
        memcpy(buf, t->val.p, (size_t)t->val.n);
        buf[t->val.n] = 0;
        double d = PyOS_string_to_double(buf, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return FALLBACK;
        }
        return (*out = PyFloat_FromDouble(d)) ? OK : ERR;
    }
    default:
        *out = Py_NewRef(t->is_int ? Py_True : Py_False);
        return OK;
    }
}

/* a record value as attrs.attributes_to_fields keeps it: a str through logline.parse_value, any other as is */
static int field_value(const Tag *t, PyObject **out)
{
    if (t->type != 's')
        return tag_py(t, out);
    if (t->esc)
        return FALLBACK;
    return value_text(t->val.p, t->val.n, parse_value_fn, out);
}

typedef struct {
    Str id, service;
    PyObject *rank, *level;   /* the cp rank tag (int or NULL), the trace-level tag (int or NULL) */
} Proc;

typedef struct {
    Proc *proc;           /* the process whose tags these are */
    PyObject *run_ids;    /* the answer's run ids */
} ProcTags;

/* one tag of a process (an element read by each(), p a ProcTags): its rank and level kept, its run id appended */
static int proc_tag(Rd *r, void *p)
{
    ProcTags *sink = p;
    Tag t;
    PyObject *v = NULL;
    int st;
    if (read_tag(r, &t) != OK)
        return FALLBACK;
    PyObject **slot = str_is_key(t.key, k_cp_rank) ? &sink->proc->rank : str_is_key(t.key, k_trace_level)
                      ? &sink->proc->level : NULL;
    int rid = str_is_key(t.key, k_run_id);
    if (!slot && !rid)
        return OK;
    if ((slot && (*slot != NULL || t.type != 'i')) || (rid && t.type != 's'))
        return FALLBACK;   /* twice, or of another type: the twin decides */
    if ((st = tag_py(&t, &v)) != OK)
        return st;
    if (slot) {
        *slot = v;
        return OK;
    }
    if (PyUnicode_GET_LENGTH(v) > 0 && PyList_Append(sink->run_ids, v) < 0)
        st = ERR;
    Py_DECREF(v);
    return st;
}

/* the "processes" object: each process's id, service name, rank and level; run ids appended to run_ids */
static int read_procs(Rd *r, Proc *procs, int *np, PyObject *run_ids)
{
    int n = 0, st = OK;
    Str id;
    while (st == OK && next_key(r, &n, &id, &st)) {
        if (*np >= MAX_PROCS)
            return FALLBACK;
        Proc *p = &procs[*np];
        memset(p, 0, sizeof *p);
        (*np)++;
        p->id = id;
        for (int i = 0; i < *np - 1; i++)
            if (procs[i].id.n == p->id.n && memcmp(procs[i].id.p, p->id.p, (size_t)p->id.n) == 0)
                return FALLBACK;
        int m = 0, seen = 0;
        Str k;
        while (st == OK && next_key(r, &m, &k, &st)) {
            if (str_is(k, "serviceName")) {
                if (seen & 1 || plain_str(r, &p->service) != OK || !utf8_ok(p->service.p, p->service.n))
                    return FALLBACK;
                seen |= 1;
            } else if (str_is(k, "tags")) {
                if (seen & 2)
                    return FALLBACK;
                seen |= 2;
                ProcTags sink = {p, run_ids};
                if ((st = each(r, proc_tag, &sink)) != OK)
                    return st;
            } else if (skip(r, 3) != OK) {
                return FALLBACK;
            }
        }
        if (st == OK && !(seen & 1))
            return FALLBACK;   /* (no service name: the twin decides) */
    }
    return st;
}

typedef struct {
    PyObject *rank;     /* the span's rank */
    PyObject *seqs;     /* each log's first seq field */
    PyObject *events;   /* the logs' records */
} LogSink;

typedef struct {
    PyObject *fields;                  /* the record's fields */
    PyObject *seq, *epoch, *level;     /* the last seq / epoch / level field (or NULL) */
    PyObject *first_seq;               /* the first seq field, when an int */
    PyObject *name;                    /* the event name: the first "event" field that is not empty */
    ValueFields vf;                    /* range parts being joined */
} LogFields;

/* one field of a log (an element read by each(), p a LogFields): the event name, a seq / epoch / level, or one of
 * the record's fields (its prefix taken off) */
static int log_field(Rd *r, void *p)
{
    LogFields *lf = p;
    Tag t;
    int st;
    if ((st = read_tag(r, &t)) != OK)
        return st;
    if ((lf->name == NULL || PyUnicode_GET_LENGTH(lf->name) == 0) && str_is(t.key, "event")) {
        PyObject *x = NULL;
        if (t.type != 's')
            return FALLBACK;   /* str() of another type: the twin decides */
        if ((st = tag_py(&t, &x)) == OK)
            Py_XSETREF(lf->name, x);
        return st;
    }
    Py_ssize_t plen = PyBytes_GET_SIZE(k_prefix);
    if (t.key.n < plen || memcmp(t.key.p, PyBytes_AS_STRING(k_prefix), (size_t)plen) != 0) {
        int is_seq = str_is_key(t.key, k_seq);
        PyObject **slot = is_seq ? &lf->seq : str_is_key(t.key, k_epoch) ? &lf->epoch
                          : str_is_key(t.key, k_level) ? &lf->level : NULL;
        if (slot == NULL)
            return OK;
        PyObject *x;
        if ((st = tag_py(&t, &x)) != OK)
            return st;
        if (is_seq && lf->first_seq == NULL) {
            if (t.type != 'i') {
                Py_DECREF(x);
                return FALLBACK;   /* _as_int of a str seq: the twin decides */
            }
            lf->first_seq = Py_NewRef(x);
        }
        Py_XSETREF(*slot, x);
        return OK;
    }
    PyObject *x;
    if ((st = field_value(&t, &x)) != OK)
        return st;
    return value_field_add(&lf->vf, lf->fields, t.key.p + plen, t.key.n - plen, rng_suffix, x);
}

/* one log (an element read by each(), p a LogSink): its first seq field (or None) appended to seqs, its record (if
 * any) to events */
static int read_log(Rd *r, void *p)
{
    const LogSink *sink = p;
    PyObject *rank = sink->rank, *seqs = sink->seqs, *events = sink->events;
    /* the fields, read where they are: the event name, the record's fields (range parts joined), seq / epoch /
     * level; the timestamp wherever it is */
    LogFields lf = {PyDict_New(), NULL, NULL, NULL, NULL, NULL, {0}};
    if (lf.fields == NULL)
        return ERR;
    Str ts = {0, 0}, k;
    int n = 0, seen = 0, is_int, st = OK;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "timestamp")) {
            if (seen & 1 || num_tok(r, &ts, &is_int) != OK || !is_int)
                st = FALLBACK;
            seen |= 1;
        } else if (str_is(k, "fields")) {
            st = seen & 2 ? FALLBACK : each(r, log_field, &lf);   /* (twice: the twin decides) */
            seen |= 2;
        } else {
            st = skip(r, 4);
        }
    }
    PyObject *fields = lf.fields, *seq = lf.seq, *epoch = lf.epoch, *level = lf.level, *first_seq = lf.first_seq,
             *name = lf.name;
    st = value_fields_end(&lf.vf, st);
    if (st == OK && PyList_Append(seqs, first_seq ? first_seq : Py_None) < 0)
        st = ERR;
    int finding = 0;
    if (st == OK && name) {
        Py_ssize_t nn;
        const char *nb = PyUnicode_AsUTF8AndSize(name, &nn);
        if (nb == NULL)
            st = ERR;
        else
            finding = str_is_key((Str){nb, nn}, k_ev_violation);
    }
    if (st == OK && seq && PyLong_CheckExact(seq) && !finding) {
        PyObject *nm = name ? Py_NewRef(name) : PyUnicode_New(0, 127), *t0 = NULL, *t = NULL;
        if (ts.p) {
            st = int_py(ts, &t0);
            if (st == OK && (t = PyNumber_Multiply(t0, thousand_obj)) == NULL)
                st = ERR;
        } else {
            t = Py_NewRef(zero_obj);
        }
        if (st == OK && nm) {
            PyObject *ep = epoch && PyLong_CheckExact(epoch) ? epoch : zero_obj;
            PyObject *lv = level && PyLong_CheckExact(level) ? level : one_obj;
            PyObject *argv[EVENT_NFIELDS] = {nm, rank, seq, t, ep, fields, lv, src_obj, zero_obj};
            PyObject *ev = event_new(argv);
            if (ev == NULL || PyList_Append(events, ev) < 0)
                st = ERR;
            Py_XDECREF(ev);
        }
        Py_XDECREF(nm);
        Py_XDECREF(t0);
        Py_XDECREF(t);
    }
    Py_DECREF(fields);
    Py_XDECREF(seq);
    Py_XDECREF(epoch);
    Py_XDECREF(level);
    Py_XDECREF(first_seq);
    Py_XDECREF(name);
    return st;
}

/* a span's "logs" list: each log's first seq appended to seqs, its record to events */
static int read_logs(Rd *r, PyObject *rank, PyObject *seqs, PyObject *events)
{
    LogSink sink = {rank, seqs, events};
    return each(r, read_log, &sink);
}

typedef struct {
    const Proc *procs;   /* the answer's processes */
    int np;
    PyObject *out;       /* the spans' rows */
} SpanSink;

typedef struct {
    PyObject **rank, **codes;   /* the span's rank tag and its findings' codes (the last of each, as a dict keeps) */
} SpanTags;

/* one tag of a span (an element read by each(), p a SpanTags) */
static int span_tag(Rd *r, void *p)
{
    SpanTags *sink = p;
    Tag t;
    int st;
    if ((st = read_tag(r, &t)) != OK)
        return st;
    int is_rank = str_is_key(t.key, k_rank);
    if (!is_rank && !str_is_key(t.key, k_violation))
        return OK;
    PyObject *v;
    if (t.type != (is_rank ? 'i' : 's') || tag_py(&t, &v) != OK)
        return FALLBACK;
    Py_XSETREF(*(is_rank ? sink->rank : sink->codes), v);
    return OK;
}

/* one span (an element read by each(), p a SpanSink): (service, rank, codes, trace_id, span_id, start_us, level,
 * seqs, events) appended to out */
static int read_span(Rd *r, void *p)
{
    const SpanSink *sink = p;
    const Proc *procs = sink->procs;
    int np = sink->np;
    PyObject *out = sink->out;
    Str tid = {0, 0}, sid = {0, 0}, pid = {0, 0}, logs = {0, 0}, start = {0, 0};
    PyObject *rank = NULL, *codes = NULL, *seqs = NULL, *events = NULL;
    int n = 0, seen = 0, st = OK, is_int;
    Str k;
    while (st == OK && next_key(r, &n, &k, &st)) {
        if (str_is(k, "traceID"))
            st = seen & 1 || plain_str(r, &tid) != OK ? FALLBACK : (seen |= 1, OK);
        else if (str_is(k, "spanID"))
            st = seen & 2 || plain_str(r, &sid) != OK ? FALLBACK : (seen |= 2, OK);
        else if (str_is(k, "processID"))
            st = seen & 4 || plain_str(r, &pid) != OK ? FALLBACK : (seen |= 4, OK);
        else if (str_is(k, "startTime"))
            st = seen & 8 || num_tok(r, &start, &is_int) != OK || !is_int ? FALLBACK : (seen |= 8, OK);
        else if (str_is(k, "process"))
            st = FALLBACK;   /* an inline process: the twin reads it */
        else if (str_is(k, "logs")) {
            if (seen & 16)
                st = FALLBACK;
            seen |= 16;
            ws(r);
            logs.p = r->p;
            if (st == OK && rank != NULL && (seen & 32)) {
                /* the rank is known (the span's rank tag, read before): the records are read here, in one
                 * pass; else after the span, when its process is known */
                if ((seqs = PyList_New(0)) == NULL || (events = PyList_New(0)) == NULL)
                    st = ERR;
                else
                    st = read_logs(r, rank, seqs, events);
                logs.p = NULL;
            } else if (st == OK && (st = skip(r, 3)) == OK) {
                logs.n = r->p - logs.p;
            }
        } else if (str_is(k, "tags")) {
            SpanTags tags = {&rank, &codes};
            st = seen & 32 ? FALLBACK : each(r, span_tag, &tags);
            seen |= 32;
        } else
            st = skip(r, 3);
    }
    const Proc *proc = NULL;
    for (int i = 0; st == OK && i < np && proc == NULL; i++)
        if (procs[i].id.n == pid.n && memcmp(procs[i].id.p, pid.p, (size_t)pid.n) == 0)
            proc = &procs[i];
    if (st == OK && (!(seen & 4) || proc == NULL || !utf8_ok(tid.p, tid.n) || !utf8_ok(sid.p, sid.n)))
        st = FALLBACK;   /* no process, or one the answer does not list: the twin decides */
    if (st == OK && rank == NULL)
        rank = Py_NewRef(proc->rank ? proc->rank : zero_obj);
    PyObject *row = NULL, *svc = NULL, *t = NULL, *s = NULL, *t0 = NULL;
    if (st == OK && seqs == NULL && ((seqs = PyList_New(0)) == NULL || (events = PyList_New(0)) == NULL))
        st = ERR;
    if (st == OK && logs.p) {
        Rd l = {logs.p, logs.p + logs.n};
        st = read_logs(&l, rank, seqs, events);
    }
    if (st == OK) {
        svc = str_py(proc->service);
        t = str_py(tid);
        s = str_py(sid);
        if (start.p)
            st = int_py(start, &t0);
        else
            t0 = Py_NewRef(zero_obj);
        if (st == OK && (svc == NULL || t == NULL || s == NULL))
            st = FALLBACK;
    }
    PyObject *levels = NULL;
    if (st == OK && proc->level) {   /* (rank, level), the level at least 0 as collect's max(.., 0) keeps it */
        int neg = PyObject_RichCompareBool(proc->level, zero_obj, Py_LT);
        if (neg < 0 || (levels = PyTuple_Pack(2, rank, neg ? zero_obj : proc->level)) == NULL)
            st = ERR;
    }
    if (st == OK) {
        row = PyTuple_Pack(9, svc, rank, codes ? codes : Py_None, t, s, t0, levels ? levels : Py_None, seqs, events);
        if (row == NULL || PyList_Append(out, row) < 0)
            st = ERR;
    }
    Py_XDECREF(row);
    Py_XDECREF(levels);
    Py_XDECREF(svc);
    Py_XDECREF(t);
    Py_XDECREF(s);
    Py_XDECREF(t0);
    Py_XDECREF(seqs);
    Py_XDECREF(events);
    Py_XDECREF(rank);
    Py_XDECREF(codes);
    return st;
}

static PyObject *py_records(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    if (reader_open("_jaegerin", arg, &b) < 0)
        return NULL;
    Rd r = {b.buf, (const char *)b.buf + b.len}, spans = {0, 0};
    Proc procs[MAX_PROCS];
    int np = 0, st = OK, seen = 0;
    PyObject *run_ids = PyList_New(0), *out = PyList_New(0);
    if (run_ids == NULL || out == NULL)
        st = ERR;
    /* the processes first (Jaeger writes them after the spans) */
    int n = 0;
    Str k;
    while (st == OK && next_key(&r, &n, &k, &st)) {
        if (str_is(k, "spans")) {
            if (seen & 1)
                st = FALLBACK;
            seen |= 1;
            ws(&r);
            spans.p = r.p;
            if (st == OK && (st = skip(&r, 1)) == OK)
                spans.end = r.p;
        } else if (str_is(k, "processes")) {
            st = seen & 2 ? FALLBACK : read_procs(&r, procs, &np, run_ids);
            seen |= 2;
        } else
            st = skip(&r, 1);
    }
    ws(&r);
    if (st == OK && r.p != r.end)
        st = FALLBACK;
    if (st == OK && spans.p) {
        SpanSink sink = {procs, np, out};
        st = each(&spans, read_span, &sink);
    }
    for (int i = 0; i < np; i++) {
        Py_XDECREF(procs[i].rank);
        Py_XDECREF(procs[i].level);
    }
    PyBuffer_Release(&b);
    if (st == OK)
        return Py_BuildValue("(NN)", run_ids, out);
    Py_XDECREF(run_ids);
    return reader_decline(st, out);
}

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    if (thousand_obj == NULL && (thousand_obj = PyLong_FromLong(1000)) == NULL)
        return NULL;
    if (reader_configure_spans(args, NULL, 0, NULL, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS, READER_SPANS_CONFIGURE_DOC},
    {"index", py_index, METH_VARARGS, "index(body, max_item) -> [(trace_id, starts, off, end)] | None"},
    {"records", py_records, METH_O, "records(trace_text) -> (run_ids, spans) | None (None: let Python decide)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jaegerin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jaegerin(void) { return PyModule_Create(&module); }
