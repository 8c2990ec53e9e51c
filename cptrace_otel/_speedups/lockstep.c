/* C1's per-epoch state and its step for one structural record, in C; loaded by lockstep.py.
 *
 * The cross-rank rule C1 (checks/rules_c1.py) projects each rank's stream onto structural tuples and pops the queue
 * heads every rank agrees on. That step runs for every insert, evict, split, prepare and reload of every rank, about a
 * third of the cross-rank stage's records, and as Python it was the stage's largest single cost (the tuple built from
 * four field lookups, the queue append, the agreeing heads popped). Everything rarer (the full comparison with its
 * readiness and tie-break, a divergence and its findings, the joins that wait for C1) stays in Python and reads this
 * object's attributes as it reads the Python twin's: the same names, the same Python objects (the queues are deques
 * of (tuple, record), ``qs`` a list of them), so either twin can be handed to every rule.
 *
 * configure(names): the 7 names of checks.cross_base.C1_NAMES (node_id, len, pre_len, split_len, tier, then the split
 * and evict tags), declared in Python only; before it, push raises.
 * EpochC1(): queues (dict rank -> deque), counts (dict rank -> int), qs (list), qs_ranks (list or None), index (int),
 * diverged (int or None), wait (set), late (list); all settable, as the Python class's slots are.
 * EpochC1.push(ev, ranks, ready) -> 0, 1 or 2: see the twin's docstring (what the caller still does). Any error
 * (a record without rank, fields or tag) propagates as the Python twin's would.
 *
 * Twin: cptrace_otel.checks.cross_base.EpochC1
 * Held equal by: tests/unit/test_lockstep_c.py
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>

typedef struct {
    PyObject_HEAD
    PyObject *queues, *counts, *qs, *qs_ranks, *diverged, *wait, *late;
    Py_ssize_t index;
} EpochC1;

static PyTypeObject EpochC1_Type;

/* interned names and constants, set at module init (and by configure) */
static PyObject *s_rank, *s_fields, *s_tag, *s_append, *s_popleft, *s_get;
static PyObject *k_node_id, *k_len, *k_pre_len, *k_split_len, *k_tier, *t_split, *t_evict;   /* configure() */
static PyObject *deque_type;   /* collections.deque */
static PyObject *one;          /* 1 */

static PyObject *EpochC1_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "EpochC1() takes no arguments");
        return NULL;
    }
    EpochC1 *self = (EpochC1 *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->queues = PyDict_New();
    self->counts = PyDict_New();
    self->qs = PyList_New(0);
    self->wait = PySet_New(NULL);
    self->late = PyList_New(0);
    Py_INCREF(Py_None); self->qs_ranks = Py_None;
    Py_INCREF(Py_None); self->diverged = Py_None;
    self->index = 0;
    if (!self->queues || !self->counts || !self->qs || !self->wait || !self->late) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int EpochC1_traverse(EpochC1 *self, visitproc visit, void *arg) {
    Py_VISIT(self->queues); Py_VISIT(self->counts); Py_VISIT(self->qs); Py_VISIT(self->qs_ranks);
    Py_VISIT(self->diverged); Py_VISIT(self->wait); Py_VISIT(self->late);
    return 0;
}

static int EpochC1_clear(EpochC1 *self) {
    Py_CLEAR(self->queues); Py_CLEAR(self->counts); Py_CLEAR(self->qs); Py_CLEAR(self->qs_ranks);
    Py_CLEAR(self->diverged); Py_CLEAR(self->wait); Py_CLEAR(self->late);
    return 0;
}

static void EpochC1_dealloc(EpochC1 *self) {
    PyObject_GC_UnTrack(self);
    EpochC1_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* fields.get(key): a new reference (None when absent), NULL with an exception set. A dict is read directly; any
 * other mapping through its own get, as the twin calls it. */
static PyObject *field(PyObject *fields, PyObject *key) {
    if (PyDict_CheckExact(fields)) {
        PyObject *v = PyDict_GetItemWithError(fields, key);
        if (v == NULL) {
            if (PyErr_Occurred()) return NULL;
            v = Py_None;
        }
        Py_INCREF(v);
        return v;
    }
    return PyObject_CallMethodOneArg(fields, s_get, key);
}

/* The record's C1 tuple (tag, node id, length, split_len, tier), each element kept only when of the exact type the
 * twin keeps (int, int, int, str), else None. New reference or NULL. */
static PyObject *c1_tuple(PyObject *tag, PyObject *fields) {
    if (t_evict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_lockstep.configure(names) was not called");
        return NULL;
    }
    int is_split = PyObject_RichCompareBool(tag, t_split, Py_EQ);
    if (is_split < 0) return NULL;
    int is_evict = PyObject_RichCompareBool(tag, t_evict, Py_EQ);
    if (is_evict < 0) return NULL;
    PyObject *v[4] = {NULL, NULL, NULL, NULL};
    PyObject *keys[4] = {k_node_id, is_split ? k_pre_len : k_len, k_split_len, k_tier};
    for (int i = 0; i < 4; i++) {
        if (i == 3 && !is_evict) {
            v[i] = Py_None;
            Py_INCREF(Py_None);
            continue;
        }
        v[i] = field(fields, keys[i]);
        if (v[i] == NULL) {
            for (int j = 0; j < i; j++) Py_DECREF(v[j]);
            return NULL;
        }
        int keep = i == 3 ? PyUnicode_CheckExact(v[i]) : PyLong_CheckExact(v[i]);
        if (!keep) {
            Py_DECREF(v[i]);
            v[i] = Py_None;
            Py_INCREF(Py_None);
        }
    }
    PyObject *t = PyTuple_New(5);
    if (t == NULL) {
        for (int j = 0; j < 4; j++) Py_DECREF(v[j]);
        return NULL;
    }
    Py_INCREF(tag);
    PyTuple_SET_ITEM(t, 0, tag);
    for (int j = 0; j < 4; j++) PyTuple_SET_ITEM(t, j + 1, v[j]);   /* (the references move into the tuple) */
    return t;
}

/* all(qs): 1, 0, or -1 with an exception set */
static int all_nonempty(PyObject *qs) {
    PyObject *seq = PySequence_Fast(qs, "EpochC1.qs must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int res = 1;
    for (Py_ssize_t i = 0; i < n && res == 1; i++) {
        int t = PyObject_IsTrue(items[i]);
        res = t < 0 ? -1 : t;
    }
    Py_DECREF(seq);
    return res;
}

/* q[0][0], a new reference or NULL */
static PyObject *head(PyObject *q) {
    PyObject *item = PySequence_GetItem(q, 0);
    if (item == NULL) return NULL;
    PyObject *h;
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) > 0) {
        h = PyTuple_GET_ITEM(item, 0);
        Py_INCREF(h);
    } else {
        h = PySequence_GetItem(item, 0);
    }
    Py_DECREF(item);
    return h;
}

/* The twin's _agree(qs): pop the heads while every queue has one and all are equal; the number of steps popped, or
 * -1 with an exception set. */
static Py_ssize_t agree(PyObject *qs) {
    PyObject *seq = PySequence_Fast(qs, "EpochC1.qs must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t nq = PySequence_Fast_GET_SIZE(seq), steps = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (;;) {
        int all = all_nonempty(seq);
        if (all < 0) goto fail;
        if (!all) break;
        PyObject *h0 = head(items[0]);
        if (h0 == NULL) goto fail;
        int same = 1;
        for (Py_ssize_t i = 0; i < nq && same == 1; i++) {
            PyObject *h = head(items[i]);
            if (h == NULL) { Py_DECREF(h0); goto fail; }
            int ne = PyObject_RichCompareBool(h, h0, Py_NE);   /* (q[0][0] != h0) */
            Py_DECREF(h);
            same = ne < 0 ? -1 : !ne;
        }
        Py_DECREF(h0);
        if (same < 0) goto fail;
        if (!same) break;
        for (Py_ssize_t i = 0; i < nq; i++) {
            PyObject *r = PyObject_CallMethodNoArgs(items[i], s_popleft);
            if (r == NULL) goto fail;
            Py_DECREF(r);
        }
        steps++;
    }
    Py_DECREF(seq);
    return steps;
fail:
    Py_DECREF(seq);
    return -1;
}

static PyObject *EpochC1_push(EpochC1 *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "push(ev, ranks, ready) takes 3 arguments");
        return NULL;
    }
    PyObject *ev = args[0], *ranks = args[1];
    int ready = PyObject_IsTrue(args[2]);
    if (ready < 0) return NULL;
    PyObject *rank = PyObject_GetAttr(ev, s_rank), *fields = NULL, *tag = NULL, *t = NULL, *item = NULL;
    PyObject *res = NULL;
    if (rank == NULL) return NULL;
    /* counts[r] = counts.get(r, 0) + 1 */
    PyObject *old = PyDict_GetItemWithError(self->counts, rank), *cnt;
    if (old == NULL && PyErr_Occurred()) goto done;
    cnt = old == NULL ? PyLong_FromLong(1) : PyNumber_Add(old, one);
    if (cnt == NULL) goto done;
    int err = PyDict_SetItem(self->counts, rank, cnt);
    Py_DECREF(cnt);
    if (err < 0) goto done;
    if (self->diverged != Py_None) {
        res = PyLong_FromLong(0);
        goto done;
    }
    PyObject *q = PyDict_GetItemWithError(self->queues, rank);   /* borrowed */
    if (q == NULL) {
        if (PyErr_Occurred()) goto done;
        q = PyObject_CallNoArgs(deque_type);
        if (q == NULL) goto done;
        err = PyDict_SetItem(self->queues, rank, q);
        Py_DECREF(q);   /* (the dict holds it) */
        if (err < 0) goto done;
    }
    Py_INCREF(q);   /* held across the calls below, which may run Python code */
    Py_ssize_t n = PyObject_Length(q);
    if (n < 0) { Py_DECREF(q); goto done; }
    fields = PyObject_GetAttr(ev, s_fields);
    tag = fields ? PyObject_GetAttr(ev, s_tag) : NULL;
    t = tag ? c1_tuple(tag, fields) : NULL;
    item = t ? PyTuple_Pack(2, t, ev) : NULL;
    PyObject *r = item ? PyObject_CallMethodOneArg(q, s_append, item) : NULL;
    Py_DECREF(q);
    if (r == NULL) goto done;
    Py_DECREF(r);
    if (n >= 2) {   /* the rank was two or more tuples ahead: the heads are untouched (see the twin) */
        res = PyLong_FromLong(0);
        goto done;
    }
    if (self->qs_ranks == ranks) {
        PyObject *qs = self->qs;
        Py_INCREF(qs);
        int all = all_nonempty(qs);
        if (all <= 0) {
            Py_DECREF(qs);
            if (all == 0) res = PyLong_FromLong(0);
            goto done;
        }
        if (ready) {
            Py_ssize_t steps = agree(qs);
            if (steps < 0) { Py_DECREF(qs); goto done; }
            self->index += steps;
            all = all_nonempty(qs);
            Py_DECREF(qs);
            if (all >= 0) res = PyLong_FromLong(all ? 1 : 2);
            goto done;
        }
        Py_DECREF(qs);
    }
    res = PyLong_FromLong(1);
done:
    Py_DECREF(rank);
    Py_XDECREF(fields);
    Py_XDECREF(tag);
    Py_XDECREF(t);
    Py_XDECREF(item);
    return res;
}

static PyMethodDef EpochC1_methods[] = {
    {"push", (PyCFunction)(void (*)(void))EpochC1_push, METH_FASTCALL,
     "push(ev, ranks, ready) -> 0, 1 or 2: C1's step for one structural record (the twin's docstring)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef EpochC1_members[] = {
    {"queues", T_OBJECT_EX, offsetof(EpochC1, queues), 0, "rank -> deque of (C1 tuple, record)"},
    {"counts", T_OBJECT_EX, offsetof(EpochC1, counts), 0, "rank -> structural records of this epoch so far"},
    {"qs", T_OBJECT_EX, offsetof(EpochC1, qs), 0, "queues[r] for r in qs_ranks"},
    {"qs_ranks", T_OBJECT_EX, offsetof(EpochC1, qs_ranks), 0, "the ranks list qs was built for, or None"},
    {"index", T_PYSSIZET, offsetof(EpochC1, index), 0, "tuples compared so far"},
    {"diverged", T_OBJECT_EX, offsetof(EpochC1, diverged), 0, "the index of the earliest divergence, or None"},
    {"wait", T_OBJECT_EX, offsetof(EpochC1, wait), 0, "join keys waiting for C1"},
    {"late", T_OBJECT_EX, offsetof(EpochC1, late), 0, "C2 findings with the structural index they are judged at"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject EpochC1_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_lockstep.EpochC1",
    .tp_basicsize = sizeof(EpochC1),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Per-epoch C1 state and its step (the twin: checks.cross_base.EpochC1)",
    .tp_new = EpochC1_new,
    .tp_dealloc = (destructor)EpochC1_dealloc,
    .tp_traverse = (traverseproc)EpochC1_traverse,
    .tp_clear = (inquiry)EpochC1_clear,
    .tp_methods = EpochC1_methods,
    .tp_members = EpochC1_members,
};

static PyObject *configure(PyObject *mod, PyObject *names) {
    PyObject **slots[] = {&k_node_id, &k_len, &k_pre_len, &k_split_len, &k_tier, &t_split, &t_evict};
    const Py_ssize_t n = (Py_ssize_t)(sizeof slots / sizeof *slots);
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != n) {
        PyErr_Format(PyExc_TypeError, "configure(names): a tuple of %zd str", n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_Format(PyExc_TypeError, "configure(names): a tuple of %zd str", n);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(names, i);
        Py_INCREF(v);
        PyUnicode_InternInPlace(&v);
        Py_XSETREF(*slots[i], v);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_O, "configure(names): the C1 field names and tags (checks.cross_base.C1_NAMES)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lockstep_module = {
    PyModuleDef_HEAD_INIT, "_lockstep", "C1's per-epoch state and step (lockstep.c)", -1, module_methods,
};

PyMODINIT_FUNC PyInit__lockstep(void) {
    /* (Python's attribute and method names: Event's and deque's) */
    const char *names[] = {"rank", "fields", "tag", "append", "popleft", "get"};
    PyObject **slots[] = {&s_rank, &s_fields, &s_tag, &s_append, &s_popleft, &s_get};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        if (*slots[i] == NULL && (*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    }
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return NULL;
    if (deque_type == NULL) {
        PyObject *coll = PyImport_ImportModule("collections");
        if (coll == NULL) return NULL;
        deque_type = PyObject_GetAttrString(coll, "deque");
        Py_DECREF(coll);
        if (deque_type == NULL) return NULL;
    }
    if (PyType_Ready(&EpochC1_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&lockstep_module);
    if (m == NULL) return NULL;
    Py_INCREF(&EpochC1_Type);
    if (PyModule_AddObject(m, "EpochC1", (PyObject *)&EpochC1_Type) < 0) {
        Py_DECREF(&EpochC1_Type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
