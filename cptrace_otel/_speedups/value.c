/* The value grammar and the readers' shared state (see value.h). Every result of the grammar equals
 * cptrace_otel.model.logline.parse_value of the same text; tests/unit/test_logc.py and test_export_fast_paths.py hold
 * them equal.
 *
 * Twin: cptrace_otel.model.logline.parse_value
 * Held equal by: tests/unit/test_logc.py, tests/unit/test_c_twins.py, tests/unit/test_export_fast_paths.py
 */
#include "value.h"
#include "event.h"
#include "grammar.h"

#include <stdio.h>
#include <string.h>

/* int(s) raises for more digits than sys.get_int_max_str_digits() (4300 by default): leave those to Python. */
#define MAX_DIGITS CPTRACE_VALUE_MAX_INT_DIGITS
#define NPARTS CPTRACE_VALUE_RNG_PARTS   /* cnt, min, max, first, last */

const unsigned char ws_tab[256] = {
    [9] = 1, [10] = 1, [11] = 1, [12] = 1, [13] = 1, [0x1c] = 1, [0x1d] = 1, [0x1e] = 1, [0x1f] = 1, [' '] = 1,
};

static PyObject *rng_type;      /* logline.Rng */
static int rng_is_tuple;        /* Rng is a plain tuple subclass: build instances like tuple.__new__ does */
static PyObject *empty_str;

/* "(" + field + "=" for the first part, "," + field + "=" for the others: the rendering of logline.Rng */
#define RNG_LABEL_MAX 32
static char rng_label[NPARTS][RNG_LABEL_MAX];
static Py_ssize_t rng_label_len[NPARTS];

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

#define NAMES 1024
static PyObject *names[NAMES];   /* value_name's cache */

int value_configure(PyObject *rng)
{
    for (int i = 0; i < NAMES; i++)
        Py_CLEAR(names[i]);
    PyObject *names = PyObject_GetAttrString(rng, "_fields");
    if (names == NULL)
        return -1;
    int ok = PyTuple_Check(names) && PyTuple_GET_SIZE(names) == NPARTS;
    for (int i = 0; ok && i < NPARTS; i++) {
        PyObject *f = PyTuple_GET_ITEM(names, i);
        Py_ssize_t n;
        const char *s = PyUnicode_Check(f) && PyUnicode_IS_ASCII(f) ? PyUnicode_AsUTF8AndSize(f, &n) : NULL;
        ok = s != NULL && n > 0 && n + 2 < RNG_LABEL_MAX;
        if (ok) {
            rng_label[i][0] = i == 0 ? '(' : ',';
            memcpy(rng_label[i] + 1, s, (size_t)n);
            rng_label[i][n + 1] = '=';
            rng_label_len[i] = n + 2;
        }
    }
    Py_DECREF(names);
    if (!ok) {
        rng_label_len[0] = 0;
        PyErr_SetString(PyExc_TypeError, "configure: Rng must name its five parts in _fields (short ASCII names)");
        return -1;
    }
    if (empty_str == NULL && (empty_str = PyUnicode_FromStringAndSize("", 0)) == NULL)
        return -1;
    Py_INCREF(rng);
    Py_XSETREF(rng_type, rng);
    rng_is_tuple = PyType_Check(rng) && PyType_IsSubtype((PyTypeObject *)rng, &PyTuple_Type) &&
                   ((PyTypeObject *)rng)->tp_dictoffset == 0 && ((PyTypeObject *)rng)->tp_alloc != NULL;
    for (int i = 0; i < VC_SIZE; i++)
        Py_CLEAR(vcache[i].obj);
    return 0;
}

PyObject *value_name(const char *p, Py_ssize_t n)
{
    size_t i = hash_bytes(p, n) & (NAMES - 1);
    PyObject *o = names[i];
    if (o && PyUnicode_GET_LENGTH(o) == n && PyUnicode_IS_ASCII(o) && memcmp(PyUnicode_1BYTE_DATA(o), p, (size_t)n) == 0)
        return Py_NewRef(o);
    o = PyUnicode_DecodeUTF8(p, n, "strict");
    if (o && PyUnicode_IS_ASCII(o)) {
        PyUnicode_InternInPlace(&o);
        Py_XSETREF(names[i], Py_NewRef(o));
    }
    return o;
}

int value_text(const char *p, Py_ssize_t n, PyObject *parse_value_fn, PyObject **out)
{
    int plain = 1;
    for (Py_ssize_t i = 0; i < n && plain; i++)
        plain = !((unsigned char)p[i] & 0x80) && !ws_tab[(unsigned char)p[i]];
    if (plain) {
        int st = value_parse(p, n, out);
        if (st != FALLBACK)
            return st;
    }
    PyObject *str = PyUnicode_DecodeUTF8(p, n, "strict");
    if (str != NULL) {
        *out = PyObject_CallOneArg(parse_value_fn, str);
        Py_DECREF(str);
        if (*out)
            return OK;
    }
    PyErr_Clear();
    return FALLBACK;
}

static PyObject *new_rng(PyObject **parts);

int value_field_add(ValueFields *vf, PyObject *fields, const char *k, Py_ssize_t kn, PyObject *const *suffixes,
                    PyObject *x)
{
    int part = -1;   /* a range part: the name ends with one of the five suffixes */
    for (int i = 0; i < 5 && part < 0; i++) {
        Py_ssize_t sn = PyBytes_GET_SIZE(suffixes[i]);
        if (kn >= sn && memcmp(k + kn - sn, PyBytes_AS_STRING(suffixes[i]), (size_t)sn) == 0)
            part = i;
    }
    Py_ssize_t bn = part >= 0 ? kn - PyBytes_GET_SIZE(suffixes[part]) : kn;
    int in_run = vf->pend > 0 && part == vf->pend && bn == vf->n && memcmp(k, vf->base, (size_t)bn) == 0;
    if ((vf->pend > 0 && !in_run) || (part > 0 && !in_run)) {
        Py_DECREF(x);
        return FALLBACK;   /* parts out of the exporter's order: attributes_to_fields decides */
    }
    if (part >= 0) {
        vf->parts[part] = x;
        vf->base = k;
        vf->n = bn;
        vf->pend = part + 1;
        if (vf->pend < 5)
            return OK;
        vf->pend = 0;
        int ints = 1;   /* five ints (the exporter's summaries): built as Rng.__new__ builds them, without the call */
        for (int i = 0; i < 5; i++)
            ints &= PyLong_CheckExact(vf->parts[i]);
        x = ints ? new_rng(vf->parts) : PyObject_Vectorcall(rng_type, vf->parts, 5, NULL);
        for (int i = 0; i < 5; i++)
            Py_CLEAR(vf->parts[i]);
        if (x == NULL)
            return ERR;
    }
    PyObject *name = value_name(k, bn);
    int st = name != NULL && PyDict_SetItem(fields, name, x) == 0 ? OK : ERR;
    Py_XDECREF(name);
    Py_DECREF(x);
    return st;
}

int value_fields_end(ValueFields *vf, int st)
{
    if (st == OK && vf->pend)
        st = FALLBACK;   /* an incomplete summary */
    for (int i = 0; i < 5; i++)
        Py_CLEAR(vf->parts[i]);
    return st;
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

int value_int(const char *p, Py_ssize_t n, PyObject **out)
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
        PyObject *r = t->tp_alloc(t, NPARTS);
        if (r == NULL)
            return NULL;
        for (int i = 0; i < NPARTS; i++) {
            Py_INCREF(parts[i]);
            PyTuple_SET_ITEM(r, i, parts[i]);
        }
        PyObject_GC_UnTrack(r);   /* ints only, no cycle possible: what the collector would decide anyway */
        return r;
    }
    return PyObject_CallFunctionObjArgs(rng_type, parts[0], parts[1], parts[2], parts[3], parts[4], NULL);
}

/* A rendered Rng of five canonical ints -> Rng; any other text after the first label -> fall back */
static int make_rng(const char *p, Py_ssize_t n, PyObject **out)
{
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
    Py_ssize_t pos = 0, start[NPARTS], len[NPARTS];
    for (int i = 0; i < NPARTS; i++) {
        Py_ssize_t l = rng_label_len[i];
        if (n - pos < l || memcmp(p + pos, rng_label[i], (size_t)l) != 0)
            return FALLBACK;
        pos += l;
        start[i] = pos;
        while (pos < n && p[pos] != ',' && p[pos] != ')')
            pos++;
        len[i] = pos - start[i];
        if (int_kind(p + start[i], len[i]) != 1)
            return FALLBACK;
    }
    if (pos != n - 1 || p[pos] != ')')
        return FALLBACK;
    PyObject *parts[NPARTS] = {NULL};
    int st = OK;
    for (int i = 0; i < NPARTS && st == OK; i++)
        st = value_int(p + start[i], len[i], &parts[i]);
    if (st == OK) {
        *out = new_rng(parts);
        st = *out ? OK : ERR;
    }
    for (int i = 0; i < NPARTS; i++)
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
        int st = int_kind(p + s, pos - s) == 1 ? value_int(p + s, pos - s, &v) : FALLBACK;
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

int value_parse(const char *p, Py_ssize_t n, PyObject **out)
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
            return value_int(p, n, out);
        if (k == 2 || (c == '-' && n == 1) || !maybe_float(p, n))
            return make_str(p, n, out);   /* "007", "-0", "-", "0-63": _scalar keeps the text */
        return FALLBACK;                  /* maybe a float: Python checks repr(float(s)) == s */
    }
    if (c == '(') {
        Py_ssize_t l = rng_label_len[0];
        if (n >= l && memcmp(p, rng_label[0], (size_t)l) == 0)
            return make_rng(p, n, out);
        return make_str(p, n, out);       /* "(none)", "(0)", "(err:..)": no rng regex match */
    }
    if (c == '[' && p[n - 1] == ']')
        return make_list(p, n, out);
    return make_str(p, n, out);           /* a bare word ("[" without "]" included) */
}

/* -- the readers' shared state ------------------------------------------------------------------------------------ */

PyObject *src_obj, *zero_obj, *one_obj;
PyObject *k_prefix, *k_seq, *k_epoch, *k_level, *k_rank, *k_violation, *k_ev_violation;
PyObject *k_run_id, *k_cp_rank, *k_trace_level;
PyObject *rng_suffix[5], *parse_value_fn;
static int configured;   /* a configure() succeeded */

/* keys[name] (keys: a dict) into *slot when it is bytes: 0, or -1 with a TypeError set */
static int key_bytes(PyObject *keys, const char *name, PyObject **slot)
{
    PyObject *v = PyDict_GetItemString(keys, name);   /* borrowed */
    if (v == NULL || !PyBytes_Check(v)) {
        PyErr_Format(PyExc_TypeError, "configure: keys[%s] must be bytes", name);
        return -1;
    }
    Py_XSETREF(*slot, Py_NewRef(v));
    return 0;
}

/* keys["rng_suffixes"] (a tuple of 5 non-empty bytes) into suffixes[0..4]: 0, or -1 with a TypeError set */
static int key_suffixes(PyObject *keys, PyObject **suffixes)
{
    PyObject *suf = PyDict_GetItemString(keys, "rng_suffixes");   /* borrowed */
    if (suf == NULL || !PyTuple_Check(suf) || PyTuple_GET_SIZE(suf) != 5) {
        PyErr_SetString(PyExc_TypeError, "configure: keys need rng_suffixes (5 bytes)");
        return -1;
    }
    for (int i = 0; i < 5; i++) {
        PyObject *x = PyTuple_GET_ITEM(suf, i);
        if (!PyBytes_Check(x) || PyBytes_GET_SIZE(x) == 0) {
            PyErr_SetString(PyExc_TypeError, "configure: rng_suffixes must be non-empty bytes");
            return -1;
        }
        Py_XSETREF(suffixes[i], Py_NewRef(x));
    }
    return 0;
}

/* reader_configure's work, without marking the module configured */
static int configure_common(PyObject *rng, PyObject *ev, PyObject *tracker, PyObject *tags, PyObject *slots)
{
    if (event_configure(ev, tracker, tags, slots) < 0 || value_configure(rng) < 0)
        return -1;
    if ((zero_obj == NULL && (zero_obj = PyLong_FromLong(0)) == NULL) ||
        (one_obj == NULL && (one_obj = PyLong_FromLong(1)) == NULL))
        return -1;
    return 0;
}

int reader_configure(PyObject *rng, PyObject *ev, PyObject *tracker, PyObject *tags, PyObject *slots)
{
    if (configure_common(rng, ev, tracker, tags, slots) < 0)
        return -1;
    configured = 1;
    return 0;
}

/* the attribute keys every span reader reads: the names of their entries in configure's keys */
static const ReaderKey shared_keys[] = {
    {"prefix", &k_prefix}, {"seq", &k_seq}, {"epoch", &k_epoch}, {"level", &k_level}, {"rank", &k_rank},
    {"violation", &k_violation}, {"event_violation", &k_ev_violation}, {"run_id", &k_run_id},
    {"cp_rank", &k_cp_rank}, {"trace_level", &k_trace_level},
};

int reader_configure_spans(PyObject *args, const ReaderKey *bytes_keys, int n_bytes, const ReaderKey *str_keys,
                           int n_str)
{
    const int n_shared = (int)(sizeof(shared_keys) / sizeof(shared_keys[0]));
    PyObject *rng, *ev, *tracker, *tags, *slots, *keys, *pv;
    if (!PyArg_ParseTuple(args, "OOOO!OO!O:configure", &rng, &ev, &tracker, &PyFrozenSet_Type, &tags, &slots,
                          &PyDict_Type, &keys, &pv))
        return -1;
    if (configure_common(rng, ev, tracker, tags, slots) < 0)
        return -1;
    for (int i = 0; i < n_shared + n_bytes; i++) {
        const ReaderKey *k = i < n_shared ? &shared_keys[i] : &bytes_keys[i - n_shared];
        if (key_bytes(keys, k->name, k->slot) < 0)
            return -1;
    }
    if (key_suffixes(keys, rng_suffix) < 0)
        return -1;
    /* the str keys, src last: all checked before any is kept, and one message names them all */
    int ok = 1;
    for (int i = 0; ok && i <= n_str; i++) {
        PyObject *v = PyDict_GetItemString(keys, i < n_str ? str_keys[i].name : "src");   /* borrowed */
        ok = v != NULL && PyUnicode_Check(v);
    }
    if (!ok) {
        char need[256] = "";
        for (int i = 0, used = 0; i < n_str && used < (int)sizeof(need); i++)
            used += snprintf(need + used, sizeof(need) - (size_t)used, "%s and ", str_keys[i].name);
        PyErr_Format(PyExc_TypeError, "configure: keys need %ssrc (str)", need);
        return -1;
    }
    for (int i = 0; i <= n_str; i++) {
        PyObject **slot = i < n_str ? str_keys[i].slot : &src_obj;
        Py_XSETREF(*slot, Py_NewRef(PyDict_GetItemString(keys, i < n_str ? str_keys[i].name : "src")));
    }
    Py_XSETREF(parse_value_fn, Py_NewRef(pv));
    configured = 1;
    return 0;
}

int reader_configured(const char *module)
{
    if (configured && rng_type != NULL && rng_label_len[0] > 0)
        return 1;
    PyErr_Format(PyExc_RuntimeError, "%s.configure() was not called", module);
    return 0;
}

int reader_open(const char *module, PyObject *arg, Py_buffer *b)
{
    return reader_configured(module) ? PyObject_GetBuffer(arg, b, PyBUF_SIMPLE) : -1;
}

PyObject *reader_decline(int st, PyObject *out)
{
    Py_XDECREF(out);
    if (st == ERR)
        return NULL;
    Py_RETURN_NONE;
}
