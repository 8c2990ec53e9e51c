/* IdSet: a set of node ids whose membership test of an int costs a few nanoseconds, for the gate of cptrace (hot.c):
 * a sampled-out call must cost what a call below the level costs, and a Python set's lookup of an int the set does
 * not hold by identity (node ids are ints made at run time) goes through the generic rich compare (~90% of the
 * sampled-out call's extra cost, docs/performance.md).
 *
 * Contract: the membership of a Python set of the elements added and not discarded since the last clear, exactly:
 * `all` (a real set) holds them and decides every question the table cannot (a key that is not an exact int, or
 * any key while `all` holds an element that is not an exact int within int64: such an element may equal an int, as
 * True and 1.0 equal 1). The table mirrors the exact ints of `all` within int64, except INT64_MIN (its empty slot
 * marker), which counts among the others. Python-visible: IdSet([iterable]), add, discard, clear, len, in, iter.
 *
 * Mutations hand the element to `all` first; hashing or comparing an element may run Python code that mutates this
 * same IdSet (or a dealloc may, when discard or clear drops the last reference): a counter of mutations tells the
 * outer one, which then rebuilds the table from `all`. A table that cannot grow (no memory) is left stale and
 * unused until the next clear: membership stays right, only slower, and no error is raised for it.
 *
 * Twin: builtins.set
 * Held equal by: tests/unit/test_idset.py
 */
#include "idset.h"
#include <stdint.h>
#include <stdlib.h>

#define EMPTY IDSET_EMPTY
#define MIN_CAP 16

/* v: the key of an exact int within int64 other than EMPTY; 0 for any other object (no exception set) */
static inline int as_key(PyObject *o, int64_t *v) {
    if (!PyLong_CheckExact(o)) return 0;
    int of = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &of);
    if (of || x == EMPTY) return 0;
    *v = (int64_t)x;
    return 1;
}

#define home idset_home

static int table_has(const IdSet *s, int64_t v) { return s->n > 0 && idset_probe(s, v); }

/* A mutation begins: the table may disagree with all until it ends (Python code it runs, an element's __hash__,
 * __eq__ or __del__, may ask meanwhile, or mutate: then nested). */
static void begin(IdSet *s) {
    s->busy++;
    s->direct = 0;
}

/* A mutation ended: may the table alone decide an exact int again (not while an outer one is still running)? */
static void settle(IdSet *s) {
    s->busy--;
    s->direct = s->busy == 0 && s->all != NULL && s->others == 0 && !s->stale && s->keys != NULL;
}

static void table_reset(IdSet *s) {
    free(s->keys);
    s->keys = NULL;
    s->cap = s->n = 0;
    s->shift = 64;
}

static void place(IdSet *s, int64_t v) {
    size_t m = s->cap - 1, i = home(s, v);
    while (s->keys[i] != EMPTY) i = (i + 1) & m;
    s->keys[i] = v;
    s->n++;
}

/* 0, or -1 when no memory (the table is unchanged) */
static int table_grow(IdSet *s) {
    size_t cap = s->cap ? s->cap * 2 : MIN_CAP;
    int64_t *keys = malloc(cap * sizeof(int64_t)), *old = s->keys;
    if (keys == NULL) return -1;
    for (size_t i = 0; i < cap; i++) keys[i] = EMPTY;
    size_t ocap = s->cap;
    unsigned shift = 64;
    while (((size_t)1 << (64 - shift)) < cap) shift--;
    s->keys = keys;
    s->cap = cap;
    s->shift = shift;
    s->n = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i] != EMPTY) place(s, old[i]);
    free(old);
    return 0;
}

static void table_add(IdSet *s, int64_t v) {
    if (table_has(s, v)) return;
    if ((s->n + 1) * 2 > s->cap && table_grow(s) < 0) {
        s->stale = 1;
        return;
    }
    place(s, v);
}

/* 1 if v was held (now removed: the keys after it in its run shift back, so no probe stops early), else 0 */
static int table_remove(IdSet *s, int64_t v) {
    if (s->n == 0) return 0;
    size_t m = s->cap - 1, i = home(s, v);
    while (s->keys[i] != v) {
        if (s->keys[i] == EMPTY) return 0;
        i = (i + 1) & m;
    }
    for (size_t j = (i + 1) & m; s->keys[j] != EMPTY; j = (j + 1) & m) {
        size_t h = home(s, s->keys[j]);
        if (((j - h) & m) >= ((j - i) & m)) { /* slot i lies on the way from its home to j: it may move there */
            s->keys[i] = s->keys[j];
            i = j;
        }
    }
    s->keys[i] = EMPTY;
    s->n--;
    return 1;
}

/* An empty table of the least size (stale when there is no memory for it). */
static void table_empty(IdSet *s) {
    table_reset(s);
    s->stale = table_grow(s) < 0;
}

/* The table and the count of others made again from all (after a reentrant mutation, or an ambiguous removal). */
static void rebuild(IdSet *s) {
    table_empty(s);
    s->others = 0;
    if (s->stale || s->all == NULL) return;
    PyObject *it = PyObject_GetIter(s->all), *e;
    if (it == NULL) goto fail;
    while ((e = PyIter_Next(it)) != NULL) { /* iterating a set runs no Python code */
        int64_t v;
        if (as_key(e, &v))
            table_add(s, v);
        else
            s->others++;
        Py_DECREF(e);
    }
    Py_DECREF(it);
    if (!PyErr_Occurred()) return;
fail:
    PyErr_Clear();
    s->stale = 1;
}

int idset_contains_slow(PyObject *self, PyObject *key) {
    IdSet *s = (IdSet *)self;
    if (s->direct && PyLong_CheckExact(key)) {
        int of = 0;
        long long v = PyLong_AsLongLongAndOverflow(key, &of);
        /* every element is an exact int within int64 but INT64_MIN: an int beyond that range equals none */
        return (of || v == EMPTY) ? 0 : table_has(s, (int64_t)v);
    }
    if (s->all == NULL) return 0; /* cleared by the garbage collector */
    Py_INCREF(self);              /* the key's __hash__/__eq__ may drop the last other reference to this set */
    int r = PySet_Contains(s->all, key);
    Py_DECREF(self);
    return r;
}

static int idset_add_obj(IdSet *s, PyObject *x) {
    uint64_t before = ++s->muts;
    begin(s);
    Py_ssize_t n0 = PySet_GET_SIZE(s->all);
    int r = PySet_Add(s->all, x);
    int64_t v;
    if (s->muts != before)
        rebuild(s);
    else if (PySet_GET_SIZE(s->all) != n0) { /* else an equal element was there, and stays */
        if (as_key(x, &v))
            table_add(s, v);
        else
            s->others++;
    }
    settle(s);
    return r;
}

/* The element that discard(x) removed was not in the table unless the table held x's key: x is an exact int (the
 * table holds every exact int element within int64 but EMPTY), or x equals no int at all. */
static int removes_no_other_int(PyObject *x) {
    return PyLong_CheckExact(x) || PyUnicode_CheckExact(x) || PyBytes_CheckExact(x) || x == Py_None;
}

static PyObject *idset_add(IdSet *s, PyObject *x) {
    if (s->all == NULL) return PyErr_Format(PyExc_RuntimeError, "IdSet: cleared by the garbage collector");
    if (idset_add_obj(s, x) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *idset_discard(IdSet *s, PyObject *x) {
    if (s->all == NULL) return PyErr_Format(PyExc_RuntimeError, "IdSet: cleared by the garbage collector");
    uint64_t before = ++s->muts;
    begin(s);
    int r = PySet_Discard(s->all, x);
    int64_t v;
    if (s->muts != before)
        rebuild(s);
    else if (r == 1) {
        /* the element removed equals x: the int v itself when the table held v (all holds one element per value);
         * else one of the others, when x equals no int in the table */
        int from_table = as_key(x, &v) && table_remove(s, v);
        if (!from_table && (removes_no_other_int(x) || s->n == 0))
            s->others--;
        else if (!from_table)
            rebuild(s); /* True, 1.0, or an object of its own equality: which element went is not known here */
    }
    settle(s);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *idset_clear(IdSet *s, PyObject *unused) {
    if (s->all == NULL) return PyErr_Format(PyExc_RuntimeError, "IdSet: cleared by the garbage collector");
    uint64_t before = ++s->muts;
    begin(s);
    table_empty(s); /* before the elements go: their deallocs may add to this set meanwhile */
    s->others = 0;
    int r = PySet_Clear(s->all);
    if (s->muts != before) rebuild(s);
    settle(s);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *idset_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *init = NULL;
    if (!PyArg_ParseTuple(args, "|O:IdSet", &init)) return NULL;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "IdSet() takes no keyword arguments");
        return NULL;
    }
    IdSet *s = (IdSet *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->shift = 64;
    s->all = PySet_New(NULL);
    if (s->all == NULL) goto fail;
    table_empty(s);
    begin(s);
    settle(s);
    if (init != NULL) {
        PyObject *it = PyObject_GetIter(init), *e;
        if (it == NULL) goto fail;
        while ((e = PyIter_Next(it)) != NULL) {
            int r = idset_add_obj(s, e);
            Py_DECREF(e);
            if (r < 0) break;
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) goto fail;
    }
    return (PyObject *)s;
fail:
    Py_DECREF(s);
    return NULL;
}

static int idset_traverse(IdSet *s, visitproc visit, void *arg) {
    Py_VISIT(s->all);
    return 0;
}

static int idset_gc_clear(IdSet *s) {
    s->direct = 0;
    table_reset(s);
    s->others = 0;
    Py_CLEAR(s->all);
    return 0;
}

static void idset_dealloc(IdSet *s) {
    PyObject_GC_UnTrack(s);
    idset_gc_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Py_ssize_t idset_len(IdSet *s) { return s->all ? PySet_GET_SIZE(s->all) : 0; }

static int idset_sq_contains(IdSet *s, PyObject *key) { return idset_contains((PyObject *)s, key); }

static PyObject *idset_iter(IdSet *s) {
    if (s->all == NULL) return PyErr_Format(PyExc_RuntimeError, "IdSet: cleared by the garbage collector");
    return PyObject_GetIter(s->all);
}

static PyObject *idset_repr(IdSet *s) {
    if (s->all == NULL || PySet_GET_SIZE(s->all) == 0) return PyUnicode_FromString("IdSet()");
    PyObject *items = PySequence_List(s->all);
    if (items == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat("IdSet(%R)", items);
    Py_DECREF(items);
    return r;
}

static PyMethodDef idset_methods[] = {
    {"add", (PyCFunction)idset_add, METH_O, "add(x): add x (a no-op if an equal element is held)."},
    {"discard", (PyCFunction)idset_discard, METH_O, "discard(x): remove the element equal to x, if any."},
    {"clear", (PyCFunction)idset_clear, METH_NOARGS, "clear(): remove every element."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods idset_as_sequence = {
    .sq_length = (lenfunc)idset_len,
    .sq_contains = (objobjproc)idset_sq_contains,
};

PyTypeObject IdSet_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_hot.IdSet",
    .tp_basicsize = sizeof(IdSet),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "IdSet([iterable]): a set of ids (add, discard, clear, len, in, iter) with a set's membership; "
              "an int's lookup is a C hash probe (the sampled-out check of cptrace's gate).",
    .tp_new = idset_new,
    .tp_dealloc = (destructor)idset_dealloc,
    .tp_traverse = (traverseproc)idset_traverse,
    .tp_clear = (inquiry)idset_gc_clear,
    .tp_as_sequence = &idset_as_sequence,
    .tp_iter = (getiterfunc)idset_iter,
    .tp_repr = (reprfunc)idset_repr,
    .tp_methods = idset_methods,
};
