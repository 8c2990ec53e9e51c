/* C fast path of the upstream log-line parser (cptrace_otel.analyze.sources.logs).
 *
 * Contract: for every line it accepts, the result equals cptrace_otel.logline.parse_line exactly (tag, field
 * keys in line order, value types and values). It accepts only the common shapes of ASCII lines: a "\w+" tag,
 * "k=v" tokens separated by ASCII whitespace, and values that are canonical decimal ints, bare words,
 * rng summaries "(cnt=..,min=..,max=..,first=..,last=..)" of five canonical ints, or flat lists of canonical
 * ints. Anything else (non-ASCII text, tokens without "=", floats or texts that might be floats, odd rng or
 * list shapes, broken markers) is answered with "fall back" and the Python parser decides: the speedup never
 * has to reproduce the rare cases, only to recognise them.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags[, event_slots])   the types it builds, the tags that step an
 *       epoch tracker; event_slots: Event's field names in constructor order when Event is a plain slots class
 *       whose __init__ only assigns them (a dataclass(slots=True) without __post_init__): Events are then built by
 *       writing those slots directly, not by calling the generated Python __init__ (about 40% of the parse cost)
 *   parse_line(line) -> (prefix, tag, fields, []) | None     None: let the Python parser decide
 *   fill_chunk(chunk, limit, data, pos, final, line_no, default_rank, state, path, slow) -> (pos, line_no)
 *       the loop of logs._file_chunks in C, over the bytes of the file: its lines split and decoded as the text
 *       reader does (newline="", UTF-8 with errors="replace"), the events (ts: the int ts= field, else the line
 *       number; rank: the int rank= field when >= 0, else ATTN_CP<n> of the prefix, else default_rank; seq and
 *       epoch from state[rank] = [next seq, EpochTracker]) appended to chunk until it holds limit of them. Lines
 *       without "[CPTRACE" are skipped; a line the C parser leaves to Python goes to slow(line, line_no), which
 *       returns (tag, fields, ts, rank) or None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>   /* T_OBJECT_EX: the member type of a __slots__ entry */
#include <stdint.h>
#include <string.h>

/* Status of the helpers below: OK (result set), FALLBACK (let Python decide), ERR (exception set). */
enum { OK = 0, FALLBACK = 1, ERR = -1, SKIP = 2 };

/* int(s) raises for more digits than sys.get_int_max_str_digits() (4300 by default): leave those to Python. */
#define MAX_DIGITS 4000

static PyObject *rng_type;      /* logline.Rng */
static int rng_is_tuple;        /* Rng is a plain tuple subclass: build instances like tuple.__new__ does */
static PyObject *key_ts, *key_rank, *empty_str;
static PyObject *event_type, *tracker_type, *epoch_tags;   /* events.Event, EpochTracker, logs._EPOCH_TAGS */
static PyObject *attr_after_reset, *attr_epoch, *attr_step, *one;

#define EVENT_NFIELDS 9
static Py_ssize_t event_off[EVENT_NFIELDS];   /* slot offsets of Event's fields; event_off[0] == 0: call the type */

/* Event(*argv) with the 9 constructor arguments: a new reference, or NULL with an exception set. */
static PyObject *new_event(PyObject *const *argv)
{
    if (event_off[0] == 0)
        return PyObject_Vectorcall(event_type, argv, EVENT_NFIELDS, NULL);
    PyTypeObject *tp = (PyTypeObject *)event_type;
    PyObject *ev = tp->tp_alloc(tp, 0);   /* zeroed (and GC-tracked): every slot starts unset */
    if (ev == NULL)
        return NULL;
    for (int i = 0; i < EVENT_NFIELDS; i++) {
        Py_INCREF(argv[i]);
        *(PyObject **)((char *)ev + event_off[i]) = argv[i];
    }
    return ev;
}

/* Fill event_off from Event's member descriptors; leaves it zero (the calling path) unless every name is an object
 * slot of a type without instance dicts. */
static int configure_event_slots(PyObject *type, PyObject *names)
{
    memset(event_off, 0, sizeof(event_off));
    if (names == NULL || names == Py_None)
        return 0;
    if (!PyType_Check(type) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) != EVENT_NFIELDS) {
        PyErr_SetString(PyExc_TypeError, "configure: event_slots must be a tuple of the 9 Event field names");
        return -1;
    }
    PyTypeObject *tp = (PyTypeObject *)type;
    if (tp->tp_dictoffset != 0 || tp->tp_alloc == NULL)
        return 0;
    Py_ssize_t off[EVENT_NFIELDS];
    for (int i = 0; i < EVENT_NFIELDS; i++) {
        PyObject *d = PyObject_GetAttr(type, PyTuple_GET_ITEM(names, i));
        if (d == NULL)
            return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 ((PyMemberDescrObject *)d)->d_member->offset > 0;
        if (ok)
            off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok)
            return 0;
    }
    memcpy(event_off, off, sizeof(off));
    return 0;
}

static uint32_t hash_bytes(const char *p, Py_ssize_t n)
{
    uint32_t h = 2166136261u;   /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

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

/* -- value cache: value text -> immutable parsed value (str or Rng), direct-mapped, replaced on collision -- */

#define VC_SIZE 4096
#define VC_MAXLEN 64
typedef struct {
    PyObject *obj;
    Py_ssize_t n;
    char text[VC_MAXLEN];
} vc_slot;
static vc_slot vcache[VC_SIZE];

static vc_slot *vc_find(const char *p, Py_ssize_t n, PyObject **hit)
{
    vc_slot *s = &vcache[hash_bytes(p, n) & (VC_SIZE - 1)];
    *hit = (s->obj != NULL && s->n == n && memcmp(s->text, p, (size_t)n) == 0) ? s->obj : NULL;
    return s;
}

static void vc_store(vc_slot *s, const char *p, Py_ssize_t n, PyObject *obj)
{
    Py_INCREF(obj);
    Py_XSETREF(s->obj, obj);
    s->n = n;
    memcpy(s->text, p, (size_t)n);
}

/* -- scalar values -- */

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ASCII whitespace as str.split() sees it: \t \n \v \f \r, \x1c-\x1f and space */
static const unsigned char ws_tab[256] = {
    [9] = 1, [10] = 1, [11] = 1, [12] = 1, [13] = 1, [0x1c] = 1, [0x1d] = 1, [0x1e] = 1, [0x1f] = 1, [' '] = 1,
};
static inline int is_ws(unsigned char c) { return ws_tab[c]; }

static inline int is_word(unsigned char c)
{
    return is_digit((char)c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* How logline._scalar sees p[0:n] with respect to ints: 0 = not "-?\d+", 1 = canonical (str(int(s)) == s),
 * 2 = "-?\d+" but not canonical (leading zero or "-0": it stays a string). */
static int int_kind(const char *p, Py_ssize_t n)
{
    Py_ssize_t i = (n > 0 && p[0] == '-') ? 1 : 0;
    if (i >= n)
        return 0;
    for (Py_ssize_t j = i; j < n; j++)
        if (!is_digit(p[j]))
            return 0;
    if (p[i] == '0' && (n - i > 1 || i == 1))
        return 2;
    return 1;
}

/* int of an optionally signed run of ASCII digits (leading zeros allowed) */
static int make_int(const char *p, Py_ssize_t n, PyObject **out)
{
    int neg = p[0] == '-';
    if (n - neg <= 18) {
        long long v = 0;
        for (Py_ssize_t i = neg; i < n; i++)
            v = v * 10 + (p[i] - '0');
        *out = PyLong_FromLongLong(neg ? -v : v);
        return *out ? OK : ERR;
    }
    if (n > MAX_DIGITS)
        return FALLBACK;
    char *buf = PyMem_Malloc((size_t)n + 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        return ERR;
    }
    memcpy(buf, p, (size_t)n);
    buf[n] = '\0';
    *out = PyLong_FromString(buf, NULL, 10);
    PyMem_Free(buf);
    return *out ? OK : ERR;
}

/* 0 when float(p[0:n]) surely raises ValueError (p starts with a digit, '-' or '.'); 1 when it might not.
 * float() takes only digits, '.', '_', an exponent, a leading sign (or one right after the exponent mark) and
 * the words inf/infinity/nan. */
static int maybe_float(const char *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = p[i];
        if (is_digit(c) || c == '.' || c == '_')
            continue;
        if (c == '+' || c == '-') {
            if (i > 0 && p[i - 1] != 'e' && p[i - 1] != 'E')
                return 0;
            continue;
        }
        if (c != '\0' && strchr("eEinfatyINFATY", c) != NULL)
            continue;
        return 0;
    }
    return 1;
}

static int make_str(const char *p, Py_ssize_t n, PyObject **out)
{
    if (n > VC_MAXLEN) {
        *out = PyUnicode_FromStringAndSize(p, n);
        return *out ? OK : ERR;
    }
    PyObject *hit;
    vc_slot *s = vc_find(p, n, &hit);
    if (hit != NULL) {
        Py_INCREF(hit);
        *out = hit;
        return OK;
    }
    *out = PyUnicode_FromStringAndSize(p, n);
    if (*out == NULL)
        return ERR;
    vc_store(s, p, n, *out);
    return OK;
}

static PyObject *new_rng(PyObject **parts)
{
    if (rng_is_tuple) {   /* what Rng.__new__ does: tuple.__new__(Rng, parts) */
        PyTypeObject *t = (PyTypeObject *)rng_type;
        PyObject *r = t->tp_alloc(t, 5);
        if (r == NULL)
            return NULL;
        for (int i = 0; i < 5; i++) {
            Py_INCREF(parts[i]);
            PyTuple_SET_ITEM(r, i, parts[i]);
        }
        PyObject_GC_UnTrack(r);   /* ints only, no cycle possible: what the collector would decide anyway */
        return r;
    }
    return PyObject_CallFunctionObjArgs(rng_type, parts[0], parts[1], parts[2], parts[3], parts[4], NULL);
}

/* "(cnt=I,min=I,max=I,first=I,last=I)" with five canonical ints -> Rng; any other "(cnt=..." -> fall back */
static int make_rng(const char *p, Py_ssize_t n, PyObject **out)
{
    static const char *labels[5] = {"(cnt=", ",min=", ",max=", ",first=", ",last="};
    PyObject *hit;
    vc_slot *slot = NULL;
    if (n <= VC_MAXLEN) {
        slot = vc_find(p, n, &hit);
        if (hit != NULL) {
            Py_INCREF(hit);
            *out = hit;
            return OK;
        }
    }
    Py_ssize_t pos = 0, start[5], len[5];
    for (int i = 0; i < 5; i++) {
        size_t l = strlen(labels[i]);
        if (n - pos < (Py_ssize_t)l || memcmp(p + pos, labels[i], l) != 0)
            return FALLBACK;
        pos += (Py_ssize_t)l;
        start[i] = pos;
        while (pos < n && p[pos] != ',' && p[pos] != ')')
            pos++;
        len[i] = pos - start[i];
        if (int_kind(p + start[i], len[i]) != 1)
            return FALLBACK;
    }
    if (pos != n - 1 || p[pos] != ')')
        return FALLBACK;
    PyObject *parts[5] = {NULL, NULL, NULL, NULL, NULL};
    int st = OK;
    for (int i = 0; i < 5 && st == OK; i++)
        st = make_int(p + start[i], len[i], &parts[i]);
    if (st == OK) {
        *out = new_rng(parts);
        st = *out ? OK : ERR;
    }
    for (int i = 0; i < 5; i++)
        Py_XDECREF(parts[i]);
    if (st == OK && slot != NULL)
        vc_store(slot, p, n, *out);
    return st;
}

/* "[I,I,...]" (or "[]") of canonical ints -> list of int; any other "[...]" -> fall back */
static int make_list(const char *p, Py_ssize_t n, PyObject **out)
{
    PyObject *lst = PyList_New(0);
    if (lst == NULL)
        return ERR;
    Py_ssize_t pos = 1, end = n - 1;
    while (pos < end) {
        Py_ssize_t s = pos;
        while (pos < end && p[pos] != ',')
            pos++;
        PyObject *v;
        int st = int_kind(p + s, pos - s) == 1 ? make_int(p + s, pos - s, &v) : FALLBACK;
        if (st != OK) {
            Py_DECREF(lst);
            return st;
        }
        st = PyList_Append(lst, v);
        Py_DECREF(v);
        if (st < 0) {
            Py_DECREF(lst);
            return ERR;
        }
        if (pos < end) {   /* at a comma: an item must follow ("[1,]" has an empty one) */
            pos++;
            if (pos == end) {
                Py_DECREF(lst);
                return FALLBACK;
            }
        }
    }
    *out = lst;
    return OK;
}

/* logline.parse_value of one token value, for the shapes this module knows */
static int parse_value(const char *p, Py_ssize_t n, PyObject **out)
{
    if (n == 0) {
        Py_INCREF(empty_str);
        *out = empty_str;
        return OK;
    }
    char c = p[0];
    if (is_digit(c) || c == '-' || c == '.') {
        int k = int_kind(p, n);
        if (k == 1)
            return make_int(p, n, out);
        if (k == 2 || (c == '-' && n == 1) || !maybe_float(p, n))
            return make_str(p, n, out);   /* "007", "-0", "-", "0-63": _scalar keeps the text */
        return FALLBACK;                  /* maybe a float: Python checks repr(float(s)) == s */
    }
    if (c == '(') {
        if (n >= 5 && memcmp(p, "(cnt=", 5) == 0)
            return make_rng(p, n, out);
        return make_str(p, n, out);       /* "(none)", "(0)", "(err:..)": no rng regex match */
    }
    if (c == '[' && p[n - 1] == ']')
        return make_list(p, n, out);
    return make_str(p, n, out);           /* a bare word ("[" without "]" included) */
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
        int st = parse_value(s + eq + 1, i - eq - 1, &v);
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

static PyObject *marker_obj;   /* "[CPTRACE" */

/* One ASCII line s[0:n] (its ending included): SKIP (no "[CPTRACE" at all), FALLBACK, ERR, or OK with *idx (the
 * marker's place), *tag, *fields. */
static int parse_ascii(const char *s, Py_ssize_t n, Py_ssize_t *idx, PyObject **tag, PyObject **fields)
{
    Py_ssize_t m = find(s, n, "[CPTRACE ", 9);
    if (m < 0)
        return find(s, n, "[CPTRACE", 8) >= 0 ? FALLBACK : SKIP;
    Py_ssize_t end = n;
    while (end > 0 && (s[end - 1] == '\r' || s[end - 1] == '\n'))
        end--;
    Py_ssize_t p = m + 9, q = p;
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
    Py_ssize_t a = find(s, idx, "ATTN_CP", 7);
    if (a < 0)
        return OK;
    Py_ssize_t j = a + 7, k = j;
    while (k < idx && is_digit(s[k]))
        k++;
    if (k == j)
        return OK;
    return make_int(s + j, k - j, out);
}

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    PyObject *rng, *ev, *tracker, *tags, *slots = NULL;
    if (!PyArg_ParseTuple(args, "OOOO!|O:configure", &rng, &ev, &tracker, &PyFrozenSet_Type, &tags, &slots))
        return NULL;
    if (configure_event_slots(ev, slots) < 0)
        return NULL;
    Py_INCREF(rng);
    Py_XSETREF(rng_type, rng);
    Py_INCREF(ev);
    Py_XSETREF(event_type, ev);
    Py_INCREF(tracker);
    Py_XSETREF(tracker_type, tracker);
    Py_INCREF(tags);
    Py_XSETREF(epoch_tags, tags);
    rng_is_tuple = PyType_Check(rng) && PyType_IsSubtype((PyTypeObject *)rng, &PyTuple_Type) &&
                   ((PyTypeObject *)rng)->tp_dictoffset == 0 && ((PyTypeObject *)rng)->tp_alloc != NULL;
    for (int i = 0; i < VC_SIZE; i++)   /* cached Rng values of an earlier type must not leak out */
        Py_CLEAR(vcache[i].obj);
    Py_RETURN_NONE;
}

static int check_configured(void)
{
    if (rng_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_logc.configure() was not called");
        return -1;
    }
    return 0;
}

static PyObject *py_parse_line(PyObject *self, PyObject *line)
{
    if (check_configured() < 0)
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

/* The epoch of a record, as logs._file_chunks computes it:
 * ``t.step(tag, fields) if (tag in epoch_tags or t._after_reset) else t.epoch`` */
static PyObject *epoch_of(PyObject *t, PyObject *tag, PyObject *fields)
{
    int step = PySet_Contains(epoch_tags, tag);
    if (step < 0)
        return NULL;
    if (!step) {
        PyObject *a = PyObject_GetAttr(t, attr_after_reset);
        if (a == NULL)
            return NULL;
        step = PyObject_IsTrue(a);
        Py_DECREF(a);
        if (step < 0)
            return NULL;
    }
    if (step)
        return PyObject_CallMethodObjArgs(t, attr_step, tag, fields, NULL);
    return PyObject_GetAttr(t, attr_epoch);
}

/* state[rank] (created as [0, EpochTracker()] when missing), borrowed */
static PyObject *rank_state(PyObject *state, PyObject *rank)
{
    PyObject *rs = PyDict_GetItemWithError(state, rank);
    if (rs != NULL || PyErr_Occurred())
        return rs;
    PyObject *t = PyObject_CallNoArgs(tracker_type);
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
    PyObject *next = PyNumber_Add(seq, one);   /* rs[0] = seq + 1 */
    if (next == NULL) {
        Py_DECREF(seq);
        return -1;
    }
    PyList_SetItem(rs, 0, next);
    PyObject *ep = epoch_of(PyList_GET_ITEM(rs, 1), tag, fields);
    if (ep == NULL) {
        Py_DECREF(seq);
        return -1;
    }
    PyObject *argv[EVENT_NFIELDS] = {tag, rank, seq, ts, ep, fields, one, path, ln};
    PyObject *ev = new_event(argv);
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
    if (check_configured() < 0 || pos < 0 || pos > buf.len) {
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
            st = find(s, len, "[CPTRACE", 8) >= 0 ? FALLBACK : SKIP;
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

/* A field value of a live record as the exporter worker's intake converts it: OK with *out (new reference) for an
 * exact int (kept) or a str without spaces of at most max_chars (a common shape parsed here, any other through
 * value_fn, the worker's Python conversion); FALLBACK for any other value (the worker's Python path renders it
 * first); ERR with an exception. */
static int live_value(PyObject *v, Py_ssize_t max_chars, PyObject *value_fn, PyObject **out)
{
    if (PyLong_CheckExact(v)) {
        *out = Py_NewRef(v);
        return OK;
    }
    if (!PyUnicode_CheckExact(v))
        return FALLBACK;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    if (n > max_chars)
        return FALLBACK;   /* cut with a marker first */
    if (PyUnicode_IS_ASCII(v)) {
        const char *p = (const char *)PyUnicode_1BYTE_DATA(v);
        int plain = 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (p[i] == ' ')
                return FALLBACK;   /* spaces are removed first */
            if (ws_tab[(unsigned char)p[i]])
                plain = 0;   /* other whitespace: never inside a log token, let Python parse it */
        }
        if (plain) {
            int st = parse_value(p, n, out);
            if (st != FALLBACK)
                return st;
        }
    } else {
        Py_ssize_t sp = PyUnicode_FindChar(v, ' ', 0, n, 1);
        if (sp == -2)
            return ERR;
        if (sp >= 0)
            return FALLBACK;
    }
    *out = PyObject_CallOneArg(value_fn, v);
    return *out ? OK : ERR;
}

/* intake(items, seq, default_rank, epochs, max_chars, value_fn, slow) -> list of Events: the exporter worker's
 * ``_add_items_fast`` loop over compact items ``(ts, level, tag, fields)``. Field values are converted in place
 * (live_value), rank is ``fields["rank"]`` when an int >= 0 else default_rank, epochs[rank] is the rank's
 * EpochTracker (created when missing), and the Event is ``Event(tag, rank, seq, ts, epoch, fields, level, "live",
 * 0)`` with seq counting up from seq. An item of another shape (not a 4-tuple, a non-str tag, a non-int level, a
 * non-dict fields), with a value live_value leaves to Python, or whose conversion raised, goes to slow(item, seq),
 * which returns its Event or None (dropped and reported; seq still advances). */
static PyObject *py_intake(PyObject *self, PyObject *args)
{
    PyObject *items, *drank, *epochs, *value_fn, *slow;
    Py_ssize_t seq0, max_chars;
    if (!PyArg_ParseTuple(args, "O!nOO!nOO:intake", &PyList_Type, &items, &seq0, &drank, &PyDict_Type, &epochs,
                          &max_chars, &value_fn, &slow))
        return NULL;
    if (check_configured() < 0)
        return NULL;
    static PyObject *live = NULL, *zero = NULL;
    if (live == NULL && (live = PyUnicode_InternFromString("live")) == NULL)
        return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *seq = PyLong_FromSsize_t(seq0 + i), *ev = NULL;
        if (seq == NULL)
            goto fail;
        PyObject *ts, *level, *tag, *f;
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4 ||
            !PyUnicode_CheckExact(tag = PyTuple_GET_ITEM(item, 2)) ||
            !PyLong_CheckExact(level = PyTuple_GET_ITEM(item, 1)) || !PyDict_CheckExact(f = PyTuple_GET_ITEM(item, 3))) {
            ev = PyObject_CallFunctionObjArgs(slow, item, seq, NULL);
            goto append;
        }
        ts = PyTuple_GET_ITEM(item, 0);
        /* values in place: same keys, same order (replacing a value does not reorder a dict) */
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(f, &pos, &k, &v)) {
            if (PyLong_CheckExact(v))
                continue;
            PyObject *nv = NULL;
            int st = live_value(v, max_chars, value_fn, &nv);
            if (st == OK) {
                st = nv == v ? 0 : PyDict_SetItem(f, k, nv);   /* an existing key: no resize, Next stays valid */
                Py_DECREF(nv);
            }
            if (st != 0) {
                /* slow() converts the item again (converting twice gives the same values) and reports it */
                PyErr_Clear();
                ev = PyObject_CallFunctionObjArgs(slow, item, seq, NULL);
                goto append;
            }
        }
        PyObject *r = PyDict_GetItemWithError(f, key_rank), *rank = drank;
        if (r == NULL && PyErr_Occurred())
            goto fail_seq;
        if (r != NULL && PyLong_CheckExact(r)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(r, &overflow);
            if (overflow > 0 || (overflow == 0 && x >= 0))
                rank = r;
        }
        PyObject *t = PyDict_GetItemWithError(epochs, rank);
        if (t == NULL) {
            if (PyErr_Occurred() || (t = PyObject_CallNoArgs(tracker_type)) == NULL)
                goto fail_seq;
            int st = PyDict_SetItem(epochs, rank, t);
            Py_DECREF(t);   /* epochs holds it */
            if (st < 0)
                goto fail_seq;
        }
        PyObject *ep = epoch_of(t, tag, f);
        if (ep == NULL)
            goto fail_seq;
        PyObject *argv[EVENT_NFIELDS] = {tag, rank, seq, ts, ep, f, level, live, zero};
        ev = new_event(argv);
        Py_DECREF(ep);
    append:
        Py_DECREF(seq);
        if (ev == NULL)
            goto fail;
        if (ev != Py_None && PyList_Append(out, ev) < 0) {
            Py_DECREF(ev);
            goto fail;
        }
        Py_DECREF(ev);
        continue;
    fail_seq:
        Py_DECREF(seq);
        goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS,
     "configure(Rng, Event, EpochTracker, epoch_tags): the types the parser builds, the tags that step epochs."},
    {"fill_chunk", py_fill_chunk, METH_VARARGS,
     "fill_chunk(chunk, limit, data, pos, final, line_no, default_rank, state, path, slow) -> (pos, line_no)."},
    {"intake", py_intake, METH_VARARGS,
     "intake(items, seq, default_rank, epochs, max_chars, value_fn, slow) -> [Event]: the exporter's intake."},
    {"parse_line", py_parse_line, METH_O,
     "parse_line(line) -> (prefix, tag, fields, []) as logline.parse_line, or None: let Python decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_logc", "C fast path of the upstream log parser.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__logc(void)
{
    key_ts = PyUnicode_InternFromString("ts");
    key_rank = PyUnicode_InternFromString("rank");
    empty_str = PyUnicode_FromStringAndSize("", 0);
    marker_obj = PyUnicode_FromString("[CPTRACE");
    attr_after_reset = PyUnicode_InternFromString("_after_reset");
    attr_epoch = PyUnicode_InternFromString("epoch");
    attr_step = PyUnicode_InternFromString("step");
    one = PyLong_FromLong(1);
    if (key_ts == NULL || key_rank == NULL || empty_str == NULL || marker_obj == NULL || attr_after_reset == NULL ||
        attr_epoch == NULL || attr_step == NULL || one == NULL)
        return NULL;
    return PyModule_Create(&module);
}
