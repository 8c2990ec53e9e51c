/* C fast path of the upstream log reader (cptrace_otel.analyze.sources.logs), loaded by logreader.py.
 *
 * Contract: for every line it accepts, the result equals cptrace_otel.model.logline.parse_line exactly (tag, field
 * keys in line order, value types and values). It accepts only the common shapes of ASCII lines: a "\w+" tag,
 * "k=v" tokens separated by ASCII whitespace, and the value shapes of value.c. Anything else (non-ASCII text,
 * tokens without "=", floats or texts that might be floats, odd rng or list shapes, broken markers) is answered
 * with "fall back" and the Python parser decides: the speedup never has to reproduce the rare cases, only to
 * recognise them.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags[, event_slots[, other_markers]])   the types it builds, the
 *       tags that step an epoch tracker (checks.epochs.EPOCH_TAGS); event_slots: see event.h; other_markers: a
 *       tuple of ASCII str (at most MAX_OTHER) whose lines, when they hold no "[CPTRACE", go to slow() too (the
 *       kv-canary violation lines, cptrace_otel.model.canary.MARKER: Python reads them)
 *   parse_line(line) -> (prefix, tag, fields, []) | None     None: let the Python parser decide
 *   fill_chunk(chunk, limit, data, pos, final, line_no, default_rank, state, path, slow) -> (pos, line_no)
 *       the loop of logs._file_chunks in C, over the bytes of the file: its lines split and decoded as the text
 *       reader does (newline="", UTF-8 with errors="replace"), the events (ts: the int ts= field, else the line
 *       number; rank: the int rank= field when >= 0, else ATTN_CP<n> of the prefix, else default_rank; seq and
 *       epoch from state[rank] = [next seq, EpochTracker]) appended to chunk until it holds limit of them. Lines
 *       without "[CPTRACE" (and without any of other_markers) are skipped; a line the C parser leaves to Python
 *       goes to slow(line, line_no), which returns (tag, fields, ts, rank) or None.
 *
 * Twin: cptrace_otel.model.logline.parse_line
 * Twin: cptrace_otel.analyze.sources.logs._file_chunks_py
 * Held equal by: tests/unit/test_logc.py
 */
#include "event.h"
#include "value.h"
#include "grammar.h"

#include <string.h>

static PyObject *key_ts, *key_rank;
static PyObject *marker_obj;   /* "[CPTRACE" */

/* other_markers of configure(): lines holding one (and no "[CPTRACE") are Python's */
#define MAX_OTHER CPTRACE_LINE_MAX_OTHER_MARKERS
static char *other_marker[MAX_OTHER];
static Py_ssize_t other_len[MAX_OTHER];
static int other_count;

/* -- interned keys and tags: few distinct ones, so an open-addressing table that stops growing when half full -- */

#define INTERN_SIZE 4096
static PyObject *intern_tab[INTERN_SIZE];
static int intern_count;

static PyObject *intern_ascii(const char *p, Py_ssize_t n)
{
    size_t i = hash_bytes(p, n) & (INTERN_SIZE - 1);
    PyObject *o;
    while ((o = intern_tab[i]) != NULL) {
        if (PyUnicode_GET_LENGTH(o) == n && memcmp(PyUnicode_1BYTE_DATA(o), p, (size_t)n) == 0) {
            Py_INCREF(o);
            return o;
        }
        i = (i + 1) & (INTERN_SIZE - 1);
    }
    o = PyUnicode_FromStringAndSize(p, n);
    if (o == NULL)
        return NULL;
    if (intern_count < INTERN_SIZE / 2 && intern_tab[i] == NULL) {   /* (still empty: nothing ran meanwhile) */
        PyUnicode_InternInPlace(&o);   /* same object as the literals "ts", "rank" in Python code */
        Py_INCREF(o);
        intern_tab[i] = o;
        intern_count++;
    }
    return o;
}

static inline int is_word(unsigned char c)
{
    return is_digit((char)c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* -- lines -- */

static Py_ssize_t find(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m)
{
    for (Py_ssize_t i = 0; i + m <= n; i++) {
        const char *q = memchr(s + i, needle[0], (size_t)(n - m - i + 1));
        if (q == NULL)
            return -1;
        i = q - s;
        if (memcmp(q, needle, (size_t)m) == 0)
            return i;
    }
    return -1;
}

/* The tokens of s[i:end] into fields; FALLBACK on a token without "=" or with an empty key. *has_list is set
 * when a value is a list (a container the fields dict must stay tracked by the collector for). */
static int parse_body(const char *s, Py_ssize_t i, Py_ssize_t end, PyObject *fields, int *has_list)
{
    for (;;) {
        while (i < end && ws_tab[(unsigned char)s[i]])
            i++;
        if (i >= end)
            return OK;
        Py_ssize_t t = i, eq = -1;
        for (; i < end; i++) {
            unsigned char c = (unsigned char)s[i];
            if (ws_tab[c])
                break;
            if (c == '=' && eq < 0)
                eq = i;
        }
        if (eq <= t)
            return FALLBACK;   /* no "=" (eq < 0) or an empty key (eq == t) */
        PyObject *v;
        int st = value_parse(s + eq + 1, i - eq - 1, &v);
        if (st != OK)
            return st;
        if (PyList_CheckExact(v))
            *has_list = 1;
        PyObject *k = intern_ascii(s + t, eq - t);
        if (k == NULL) {
            Py_DECREF(v);
            return ERR;
        }
        st = PyDict_SetItem(fields, k, v);   /* a duplicate key: the last value wins, the first place stays */
        Py_DECREF(k);
        Py_DECREF(v);
        if (st < 0)
            return ERR;
    }
}

static PyObject *new_dict(Py_ssize_t hint)
{
#if PY_VERSION_HEX < 0x030E0000
    return _PyDict_NewPresized(hint);   /* CPython-internal but exported through 3.13 */
#else
    (void)hint;
    return PyDict_New();
#endif
}

/* One ASCII line s[0:n] (its ending included): SKIP (no "[CPTRACE" at all), FALLBACK, ERR, or OK with *idx (the
 * marker's place), *tag, *fields. */
static int parse_ascii(const char *s, Py_ssize_t n, Py_ssize_t *idx, PyObject **tag, PyObject **fields)
{
    Py_ssize_t m = find(s, n, CPTRACE_LINE_MARKER " ", CPTRACE_LINE_MARKER_LEN + 1);
    if (m < 0)
        return find(s, n, CPTRACE_LINE_MARKER, CPTRACE_LINE_MARKER_LEN) >= 0 ? FALLBACK : SKIP;
    Py_ssize_t end = n;
    while (end > 0 && (s[end - 1] == '\r' || s[end - 1] == '\n'))
        end--;
    Py_ssize_t p = m + CPTRACE_LINE_MARKER_LEN + 1, q = p;
    while (q < end && is_word((unsigned char)s[q]))
        q++;
    if (q == p || q >= end || s[q] != ']')
        return FALLBACK;   /* a broken marker: Python reports it */
    Py_ssize_t b = q + 1;
    if (b < end) {
        if (s[b] != ' ')
            return FALLBACK;
        b++;
    }
    if (memchr(s + b, '\r', (size_t)(end - b)) || memchr(s + b, '\n', (size_t)(end - b)))
        return FALLBACK;   /* an inner line break: the line regex's "." stops there */
    Py_ssize_t ntok = 1;   /* a size hint, so that a dict of ~10 fields is not resized while it fills */
    for (const char *c = s + b; (c = memchr(c, ' ', (size_t)(s + end - c))) != NULL; c++)
        ntok++;
    PyObject *d = new_dict(ntok);
    if (d == NULL)
        return ERR;
    int has_list = 0;
    int st = parse_body(s, b, end, d, &has_list);
    if (st != OK) {
        Py_DECREF(d);
        return st;
    }
    /* Only ints, strs and Rngs of ints: no cycle can pass through this dict, so the collector need not visit
     * it (a later insert of a container tracks it again, as dicts do). */
    if (!has_list && PyObject_GC_IsTracked(d))
        PyObject_GC_UnTrack(d);
    *tag = intern_ascii(s + p, q - p);
    if (*tag == NULL) {
        Py_DECREF(d);
        return ERR;
    }
    *idx = m;
    *fields = d;
    return OK;
}

/* parse_ascii of a str line (a non-ASCII one is left to Python when it holds the marker) */
static int parse_one(PyObject *line, Py_ssize_t *idx, PyObject **tag, PyObject **fields)
{
    if (!PyUnicode_Check(line))
        return FALLBACK;
    Py_ssize_t n = PyUnicode_GET_LENGTH(line);
    if (!PyUnicode_IS_ASCII(line)) {
        Py_ssize_t f = PyUnicode_Find(line, marker_obj, 0, n, 1);
        return f == -2 ? ERR : (f >= 0 ? FALLBACK : SKIP);
    }
    return parse_ascii((const char *)PyUnicode_1BYTE_DATA(line), n, idx, tag, fields);
}

/* logs._prefix_rank for an ASCII line: int of the digits after the first "ATTN_CP" in s[0:idx], else NULL
 * without an error (no rank there). */
static int prefix_rank(const char *s, Py_ssize_t idx, PyObject **out)
{
    *out = NULL;
    Py_ssize_t a = find(s, idx, CPTRACE_LINE_RANK_PREFIX, CPTRACE_LINE_RANK_PREFIX_LEN);
    if (a < 0)
        return OK;
    Py_ssize_t j = a + CPTRACE_LINE_RANK_PREFIX_LEN, k = j;
    while (k < idx && is_digit(s[k]))
        k++;
    if (k == j)
        return OK;
    return value_int(s + j, k - j, out);
}

/* other_markers (a tuple of ASCII str) copied into other_marker */
static int set_other_markers(PyObject *markers)
{
    if (markers == NULL || markers == Py_None)
        return 0;
    if (!PyTuple_Check(markers) || PyTuple_GET_SIZE(markers) > MAX_OTHER) {
        PyErr_Format(PyExc_TypeError, "configure: other_markers must be a tuple of at most %d str", MAX_OTHER);
        return -1;
    }
    for (int i = 0; i < other_count; i++)
        PyMem_Free(other_marker[i]);
    other_count = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(markers); i++) {
        PyObject *m = PyTuple_GET_ITEM(markers, i);
        if (!PyUnicode_Check(m) || !PyUnicode_IS_ASCII(m) || PyUnicode_GET_LENGTH(m) == 0) {
            PyErr_SetString(PyExc_TypeError, "configure: other_markers must be non-empty ASCII str");
            return -1;
        }
        Py_ssize_t n = PyUnicode_GET_LENGTH(m);
        char *c = PyMem_Malloc((size_t)n);
        if (c == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(c, PyUnicode_1BYTE_DATA(m), (size_t)n);
        other_marker[other_count] = c;
        other_len[other_count] = n;
        other_count++;
    }
    return 0;
}

/* FALLBACK when s[0:n] holds one of other_markers, else SKIP */
static int other_line(const char *s, Py_ssize_t n)
{
    for (int i = 0; i < other_count; i++)
        if (find(s, n, other_marker[i], other_len[i]) >= 0)
            return FALLBACK;
    return SKIP;
}

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    PyObject *rng, *ev, *tracker, *tags, *slots = NULL, *markers = NULL;
    if (!PyArg_ParseTuple(args, "OOOO!|OO:configure", &rng, &ev, &tracker, &PyFrozenSet_Type, &tags, &slots,
                          &markers))
        return NULL;
    if (reader_configure(rng, ev, tracker, tags, slots) < 0 || set_other_markers(markers) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_parse_line(PyObject *self, PyObject *line)
{
    if (!reader_configured("_logreader"))
        return NULL;
    Py_ssize_t idx;
    PyObject *tag, *fields;
    int st = parse_one(line, &idx, &tag, &fields);
    if (st == ERR)
        return NULL;
    if (st != OK)
        Py_RETURN_NONE;
    PyObject *prefix = PyUnicode_Substring(line, 0, idx);
    PyObject *bad = PyList_New(0);
    if (prefix == NULL || bad == NULL) {
        Py_XDECREF(prefix);
        Py_XDECREF(bad);
        Py_DECREF(tag);
        Py_DECREF(fields);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(4, prefix, tag, fields, bad);
    Py_DECREF(prefix);
    Py_DECREF(bad);
    Py_DECREF(tag);
    Py_DECREF(fields);
    return r;
}

/* ts and rank of a parsed line as logs._file_chunks derives them; FALLBACK for a prefix rank Python must read */
static int ts_rank(const char *line, Py_ssize_t idx, PyObject *fields, PyObject *ln, PyObject *drank,
                   PyObject **ts, PyObject **rank)
{
    PyObject *t = PyDict_GetItemWithError(fields, key_ts);
    if (t == NULL && PyErr_Occurred())
        return ERR;
    *ts = (t != NULL && PyLong_CheckExact(t)) ? t : ln;
    Py_INCREF(*ts);
    PyObject *r = PyDict_GetItemWithError(fields, key_rank);
    if (r == NULL && PyErr_Occurred())
        return ERR;
    if (r != NULL && PyLong_CheckExact(r)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(r, &overflow);
        if (overflow > 0 || (overflow == 0 && v >= 0)) {
            Py_INCREF(r);
            *rank = r;
            return OK;
        }
    }
    int st = idx > 0 ? prefix_rank(line, idx, rank) : OK;
    if (st != OK)
        return st;
    if (*rank == NULL) {
        Py_INCREF(drank);
        *rank = drank;
    }
    return OK;
}

/* state[rank] (created as [0, EpochTracker()] when missing), borrowed */
static PyObject *rank_state(PyObject *state, PyObject *rank)
{
    PyObject *rs = PyDict_GetItemWithError(state, rank);
    if (rs != NULL || PyErr_Occurred())
        return rs;
    PyObject *t = event_new_tracker();
    if (t == NULL)
        return NULL;
    rs = PyList_New(2);
    if (rs == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    PyList_SET_ITEM(rs, 0, PyLong_FromLong(0));
    PyList_SET_ITEM(rs, 1, t);
    if (PyList_GET_ITEM(rs, 0) == NULL || PyDict_SetItem(state, rank, rs) < 0) {
        Py_DECREF(rs);
        return NULL;
    }
    Py_DECREF(rs);   /* the state dict holds it */
    return rs;
}

/* One event: seq and epoch from the rank's state, appended to chunk. Steals nothing. */
static int add_event(PyObject *chunk, PyObject *state, PyObject *path, PyObject *ln, PyObject *tag,
                     PyObject *fields, PyObject *ts, PyObject *rank)
{
    PyObject *rs = rank_state(state, rank);
    if (rs == NULL)
        return -1;
    if (!PyList_CheckExact(rs) || PyList_GET_SIZE(rs) < 2) {
        PyErr_SetString(PyExc_TypeError, "log reader state: [seq, EpochTracker] expected");
        return -1;
    }
    PyObject *seq = PyList_GET_ITEM(rs, 0);
    Py_INCREF(seq);
    PyObject *next = PyNumber_Add(seq, one_obj);   /* rs[0] = seq + 1 */
    if (next == NULL) {
        Py_DECREF(seq);
        return -1;
    }
    PyList_SetItem(rs, 0, next);
    PyObject *ep = event_epoch(PyList_GET_ITEM(rs, 1), tag, fields);
    if (ep == NULL) {
        Py_DECREF(seq);
        return -1;
    }
    PyObject *argv[EVENT_NFIELDS] = {tag, rank, seq, ts, ep, fields, one_obj, path, ln};
    PyObject *ev = event_new(argv);
    Py_DECREF(seq);
    Py_DECREF(ep);
    if (ev == NULL)
        return -1;
    int st = PyList_Append(chunk, ev);
    Py_DECREF(ev);
    return st;
}

/* End of the line starting at data[pos] as a text reader with newline="" splits: after "\n", "\r\n" or a lone
 * "\r". -1 when the line is not complete yet (no line break, or a "\r" at the end of data that a "\n" may follow)
 * and more data is to come (!final). */
static Py_ssize_t line_end(const char *data, Py_ssize_t n, Py_ssize_t pos, int final)
{
    const char *nl = memchr(data + pos, '\n', (size_t)(n - pos));
    Py_ssize_t lim = nl ? nl - data : n;
    const char *cr = memchr(data + pos, '\r', (size_t)(lim - pos));
    if (cr != NULL) {
        Py_ssize_t r = cr - data;
        if (r + 1 < n)
            return data[r + 1] == '\n' ? r + 2 : r + 1;
        return final ? n : -1;
    }
    if (nl != NULL)
        return lim + 1;
    return (final && pos < n) ? n : -1;
}

static int all_ascii(const char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull)
            return 0;
    }
    for (; i < n; i++)
        if ((unsigned char)s[i] & 0x80)
            return 0;
    return 1;
}

/* fill_chunk(chunk, limit, data, pos, final, line_no, default_rank, state, path, slow) -> (pos, line_no): the
 * events of the lines of data[pos:] (bytes of a UTF-8 file; line_no: the number of the line at pos) appended to
 * chunk until it holds limit of them (the line that filled it is the last one read) or the complete lines run
 * out; returns where to go on and that line's number. final: data runs to the end of the file (its last line
 * needs no line break). A line the C parser leaves to Python is decoded as the text reader decodes it (UTF-8,
 * errors="replace") and goes to slow(line, line_no), which returns (tag, fields, ts, rank) or None. */
static PyObject *py_fill_chunk(PyObject *self, PyObject *args)
{
    PyObject *chunk, *drank, *state, *path, *slow;
    Py_buffer buf;
    Py_ssize_t limit, pos, line_no;
    int final;
    if (!PyArg_ParseTuple(args, "O!ny*npnOO!OO:fill_chunk", &PyList_Type, &chunk, &limit, &buf, &pos, &final,
                          &line_no, &drank, &PyDict_Type, &state, &path, &slow))
        return NULL;
    if (!reader_configured("_logreader") || pos < 0 || pos > buf.len) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "fill_chunk: pos out of range");
        PyBuffer_Release(&buf);
        return NULL;
    }
    const char *data = buf.buf;
    Py_ssize_t n = buf.len;
    while (PyList_GET_SIZE(chunk) < limit) {
        Py_ssize_t end = line_end(data, n, pos, final);
        if (end < 0)
            break;
        const char *s = data + pos;
        Py_ssize_t len = end - pos, idx = 0;
        pos = end;
        line_no++;
        PyObject *tag = NULL, *fields = NULL, *ts = NULL, *rank = NULL, *ln = NULL;
        int st;
        if (all_ascii(s, len))
            st = parse_ascii(s, len, &idx, &tag, &fields);
        else   /* the marker is ASCII: in the decoded text iff in the bytes */
            st = find(s, len, CPTRACE_LINE_MARKER, CPTRACE_LINE_MARKER_LEN) >= 0 ? FALLBACK : SKIP;
        if (st == SKIP && other_count > 0)
            st = other_line(s, len);   /* (also ASCII markers: found in the bytes iff in the text) */
        if (st == SKIP)
            continue;
        if (st != ERR) {
            ln = PyLong_FromSsize_t(line_no - 1);
            if (ln == NULL)
                st = ERR;
        }
        if (st == OK)
            st = ts_rank(s, idx, fields, ln, drank, &ts, &rank);
        if (st == FALLBACK) {
            Py_CLEAR(tag);
            Py_CLEAR(fields);
            Py_CLEAR(ts);
            PyObject *line = PyUnicode_DecodeUTF8(s, len, "replace");
            PyObject *p = line ? PyObject_CallFunctionObjArgs(slow, line, ln, NULL) : NULL;
            Py_XDECREF(line);
            if (p == NULL) {
                st = ERR;
            } else if (p == Py_None) {
                st = SKIP;
                Py_DECREF(p);
            } else if (!PyTuple_CheckExact(p) || PyTuple_GET_SIZE(p) != 4) {
                PyErr_SetString(PyExc_TypeError, "slow() must return (tag, fields, ts, rank) or None");
                Py_DECREF(p);
                st = ERR;
            } else {
                tag = Py_NewRef(PyTuple_GET_ITEM(p, 0));
                fields = Py_NewRef(PyTuple_GET_ITEM(p, 1));
                ts = Py_NewRef(PyTuple_GET_ITEM(p, 2));
                rank = Py_NewRef(PyTuple_GET_ITEM(p, 3));
                Py_DECREF(p);
                st = OK;
            }
        }
        if (st == OK)
            st = add_event(chunk, state, path, ln, tag, fields, ts, rank) < 0 ? ERR : OK;
        Py_XDECREF(ln);
        Py_XDECREF(tag);
        Py_XDECREF(fields);
        Py_XDECREF(ts);
        Py_XDECREF(rank);
        if (st == ERR) {
            PyBuffer_Release(&buf);
            return NULL;
        }
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("nn", pos, line_no);
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS,
     "configure(Rng, Event, EpochTracker, epoch_tags[, event_slots]): the types the reader builds, the tags that "
     "step epochs."},
    {"fill_chunk", py_fill_chunk, METH_VARARGS,
     "fill_chunk(chunk, limit, data, pos, final, line_no, default_rank, state, path, slow) -> (pos, line_no)."},
    {"parse_line", py_parse_line, METH_O,
     "parse_line(line) -> (prefix, tag, fields, []) as logline.parse_line, or None: let Python decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_logreader", "C fast path of the upstream log reader.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__logreader(void)
{
    key_ts = PyUnicode_InternFromString(CPTRACE_LINE_TS_FIELD);
    key_rank = PyUnicode_InternFromString(CPTRACE_LINE_RANK_FIELD);
    marker_obj = PyUnicode_FromString(CPTRACE_LINE_MARKER);
    if (key_ts == NULL || key_rank == NULL || marker_obj == NULL)
        return NULL;
    return PyModule_Create(&module);
}
