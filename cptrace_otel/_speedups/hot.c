/* The gate of api.cptrace in C: a call below the level, or of a node sampled out, returns before any dict of its
 * keyword arguments is built; loaded by hot.py.
 *
 * A Python function with **fields pays for building the fields dict before its first line runs; a vectorcall C
 * function gets the keyword names and values as arrays. So here the level compare and the sampled-out lookup (the
 * node_id value in the set of nodes decided out) cost a few nanoseconds each, and a sampled-out call costs what a
 * call below the level costs. Only a record that goes on gets its dict, handed to submit(level, tag, fields).
 *
 * State: api's gate state, a State object (level, drop, submit: the gate, the node ids sampled out (an IdSet,
 * idset.c, or any set) or None, and the function a record that goes on is handed to), shared with api's Python
 * definition, which reads the same three attributes: so api, or a test, setting one is seen at once, with no copy to
 * keep in step, and the gate reads them as three loads, where a module global would cost a dict lookup each.
 * configure(slow, slow_enabled, state, names): slow is api's Python cptrace, the definition of the semantics
 * (slow_enabled, its trace_enabled, is that of trace_enabled here): every call this code does not decide itself
 * goes there unchanged (a level or gate that is not an exact int within int64,
 * positional arguments other than (level, tag), a drop that is not a set), so its results and errors are Python's;
 * names = (node_key, split_tag): the field whose value is looked up in the drop set, and the tag whose records go on
 * even then (their new node inherits the decision); both declared in Python only.
 * cptrace(level, tag, /, **fields): the call sites' function. Never raises for a call slow would not raise for (a
 * signal handler's SystemExit or KeyboardInterrupt raised inside submit propagates, as it does from slow).
 * While submit is ring_put (the record ring is on, ring.c) and nothing is sampled out, a record that goes on is
 * put into the ring from the argument arrays: no dict, no Python call.
 *
 * Twin: cptrace_otel.traced.api._cptrace_py
 * Twin: cptrace_otel.traced.api._trace_enabled_py
 * Held equal by: tests/unit/test_hot_gate.py
 */
#include "idset.h"
#include "ring.h"
#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *level, *drop, *submit; /* NULL when deleted: see cptrace for what each absence means */
} State;
static PyTypeObject State_Type;

static PyObject *slow = NULL;   /* api's Python cptrace */
static PyObject *slow_enabled = NULL; /* api's Python trace_enabled */
static State *state = NULL;     /* api's gate state */
static PyObject *s_node_id = NULL, *s_split = NULL; /* names */

/* name == want (an interned str). Keyword names and tag literals of call sites are interned: then the pointers
 * decide, and only a str built at run time is compared character by character. */
static int is_key(PyObject *name, PyObject *want) {
    if (name == want) return 1;
    if (PyUnicode_CheckExact(name) && PyUnicode_CHECK_INTERNED(name)) return 0;
    return PyUnicode_Check(name) && PyUnicode_Compare(name, want) == 0;
}

/* The value of the keyword node_key, or NULL. Its name is the interned literal at nearly every call site: the first
 * pass compares pointers only; the second, for names built at run time, compares text. */
static PyObject *node_of(PyObject *const *vals, PyObject *kwnames) {
    if (kwnames == NULL) return NULL;
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    PyObject *const *names = &PyTuple_GET_ITEM(kwnames, 0);
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (names[i] == s_node_id) return vals[i];
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (is_key(names[i], s_node_id)) return vals[i];
    return NULL;
}

static PyObject *cptrace(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cptrace: _hot.configure was not called");
        return NULL;
    }
    PyObject *g = state->level;
    if (nargs != 2 || g == NULL || !PyLong_CheckExact(g) || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(slow, args, nargsf, kwnames);
    int overflow = 0, overflow_g = 0;
    long long level = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    long long gate = PyLong_AsLongLongAndOverflow(g, &overflow_g);
    if (overflow || overflow_g) return PyObject_Vectorcall(slow, args, nargsf, kwnames);
    if (level > gate) Py_RETURN_NONE;
    PyObject *drop = state->drop; /* deleted (NULL) or None: nothing sampled out */
    if (drop != NULL && drop != Py_None) {
        int idset = Py_IS_TYPE(drop, &IdSet_Type);
        if (!idset && !PyAnySet_Check(drop)) return PyObject_Vectorcall(slow, args, nargsf, kwnames);
        PyObject *node = node_of(args + nargs, kwnames);
        if (node != NULL) {
            int in;
            if (idset) {
                in = idset_contains(drop, node);
            } else {
                /* the node id's __hash__/__eq__ may run Python code that replaces state.drop: hold the set */
                Py_INCREF(drop);
                in = PySet_Contains(drop, node);
                Py_DECREF(drop);
            }
            if (in < 0) PyErr_Clear(); /* unhashable node id: not decided out; the sampler takes it from here */
            /* a split still goes on: its new node inherits the decision */
            if (in > 0 && !is_key(args[1], s_split)) Py_RETURN_NONE;
        }
    } else if (state->submit == ring_put_fn) {
        /* the record ring is on (submit is its put): encoded from the arrays, no dict (ring.c) */
        if (ring_put_kw(args[0], args[1], args + nargs, kwnames) < 0) goto swallow;
        Py_RETURN_NONE;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *fields = PyDict_New();
    if (fields == NULL) goto swallow;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyDict_SetItem(fields, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_DECREF(fields);
            goto swallow;
        }
    }
    PyObject *submit = state->submit;
    if (submit == NULL) { /* deleted: the record is dropped */
        Py_DECREF(fields);
        Py_RETURN_NONE;
    }
    Py_INCREF(submit); /* setting state.submit during the call must not free it under us */
    PyObject *call[3] = {args[0], args[1], fields};
    PyObject *r = PyObject_Vectorcall(submit, call, 3, NULL);
    Py_DECREF(submit);
    Py_DECREF(fields);
    if (r == NULL) goto swallow;
    Py_DECREF(r);
    Py_RETURN_NONE;
swallow: /* tracing never fails the traced process (submit functions catch every Exception themselves) */
    /* ...but a KeyboardInterrupt or SystemExit is not tracing's: an application's signal handler (its SIGTERM
     * handler's sys.exit) that ran inside submit raised it, and it propagates as it would without tracing */
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* trace_enabled(level=1): state.level >= level, decided here when both are exact ints within int64 (no level: 1);
 * any other call goes to api's Python trace_enabled, the definition, whose results and errors stand. */
static PyObject *trace_enabled(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (slow_enabled == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "trace_enabled: _hot.configure was not called");
        return NULL;
    }
    PyObject *g = state->level;
    if (kwnames != NULL || nargs > 1 || g == NULL || !PyLong_CheckExact(g) ||
        (nargs == 1 && !PyLong_CheckExact(args[0])))
        return PyObject_Vectorcall(slow_enabled, args, nargsf, kwnames);
    int overflow = 0, overflow_g = 0;
    long long level = nargs == 1 ? PyLong_AsLongLongAndOverflow(args[0], &overflow) : 1;
    long long gate = PyLong_AsLongLongAndOverflow(g, &overflow_g);
    if (overflow || overflow_g) return PyObject_Vectorcall(slow_enabled, args, nargsf, kwnames);
    return PyBool_FromLong(gate >= level);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *fn, *fn_enabled, *st, *names[2];
    if (!PyArg_ParseTuple(args, "OOO(UU)", &fn, &fn_enabled, &st, &names[0], &names[1])) return NULL;
    if (!PyCallable_Check(fn) || !PyCallable_Check(fn_enabled)) {
        PyErr_SetString(PyExc_TypeError, "configure: slow and slow_enabled must be callable");
        return NULL;
    }
    if (!Py_IS_TYPE(st, &State_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: state must be a State");
        return NULL;
    }
    PyObject **slots[2] = {&s_node_id, &s_split};
    for (int i = 0; i < 2; i++) {
        PyObject *k = Py_NewRef(names[i]);
        PyUnicode_InternInPlace(&k);
        Py_XSETREF(*slots[i], k);
    }
    Py_XSETREF(state, (State *)Py_NewRef(st));
    Py_XSETREF(slow, Py_NewRef(fn));
    Py_XSETREF(slow_enabled, Py_NewRef(fn_enabled));
    Py_RETURN_NONE;
}

static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) > 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) > 0)) {
        PyErr_SetString(PyExc_TypeError, "State() takes no arguments");
        return NULL;
    }
    State *st = (State *)type->tp_alloc(type, 0);
    if (st == NULL) return NULL;
    st->level = PyLong_FromLong(0);
    st->drop = Py_NewRef(Py_None);
    st->submit = Py_NewRef(Py_None);
    if (st->level == NULL) Py_CLEAR(st);
    return (PyObject *)st;
}

static int state_traverse(State *st, visitproc visit, void *arg) {
    Py_VISIT(st->level);
    Py_VISIT(st->drop);
    Py_VISIT(st->submit);
    return 0;
}

static int state_clear(State *st) {
    Py_CLEAR(st->level);
    Py_CLEAR(st->drop);
    Py_CLEAR(st->submit);
    return 0;
}

static void state_dealloc(State *st) {
    PyObject_GC_UnTrack(st);
    state_clear(st);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static PyMemberDef state_members[] = {
    {"level", T_OBJECT_EX, offsetof(State, level), 0, "the gate: a record of a higher level is skipped"},
    {"drop", T_OBJECT_EX, offsetof(State, drop), 0, "the ids sampled out (an IdSet or a set), or None"},
    {"submit", T_OBJECT_EX, offsetof(State, submit), 0, "submit(level, tag, fields): takes a record that goes on"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject State_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_hot.State",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "State(): the gate's state, read by the C gate and api's Python definition alike "
              "(level = 0, drop = None, submit = None until set).",
    .tp_new = state_new,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_members = state_members,
};

static PyMethodDef methods[] = {
    {"cptrace", (PyCFunction)(void (*)(void))cptrace, METH_FASTCALL | METH_KEYWORDS,
     "cptrace($module, level, tag, /, **fields)\n--\n\nRecord one tag event with fields if the gate is at least "
     "level; never raises, never blocks (the traced api's cptrace, its gate and sampled-out check in C)."},
    {"trace_enabled", (PyCFunction)(void (*)(void))trace_enabled, METH_FASTCALL | METH_KEYWORDS,
     "trace_enabled($module, /, level=1)\n--\n\nTrue when records at level are traced (the traced api's "
     "trace_enabled, its int compare in C)."},
    {"configure", configure, METH_VARARGS,
     "configure(slow, slow_enabled, state, names): api's Python cptrace and trace_enabled (for the calls decided "
     "there), api's State and the names (node_key, split_tag)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hot", "The gate of cptrace in C.", -1, methods};

PyMODINIT_FUNC PyInit__hot(void) {
    if (PyType_Ready(&State_Type) < 0 || PyType_Ready(&IdSet_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddFunctions(m, ring_methods) < 0 || ring_module_init(m) < 0 ||
                      PyModule_AddObjectRef(m, "State", (PyObject *)&State_Type) < 0 ||
                      PyModule_AddObjectRef(m, "IdSet", (PyObject *)&IdSet_Type) < 0))
        Py_CLEAR(m);
    return m;
}
