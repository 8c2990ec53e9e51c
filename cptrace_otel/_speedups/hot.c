/* The gate of api.cptrace in C: a call below the level, or of a node sampled out, returns before any dict of its
 * keyword arguments is built; loaded by hot.py.
 *
 * A Python function with **fields pays for building the fields dict before its first line runs; a vectorcall C
 * function gets the keyword names and values as arrays. So here the level compare and the sampled-out lookup (the
 * node_id value in the set of nodes decided out) cost a few nanoseconds each, and a sampled-out call costs what a
 * call below the level costs. Only a record that goes on gets its dict, handed to submit(level, tag, fields).
 *
 * configure(slow, state, names): slow is api's Python cptrace, the definition of the semantics: every call this
 * code does not decide itself goes there unchanged (a level or gate that is not an exact int within int64,
 * positional arguments other than (level, tag)), so its results and errors are Python's. state is api's module
 * dict, read on every call (so api, and a test, rebinding its globals is seen at once, with no copy to keep in step);
 * names = (gate, drop, submit, node_key, split_tag): the three globals' names (api's _LEVEL, _DROP: a set or None,
 * _submit), the field whose value is looked up in the drop set, and the tag whose records go on even then (their
 * new node inherits the decision); all declared in Python only.
 * cptrace(level, tag, /, **fields): the call sites' function. Never raises for a call slow would not raise for (a
 * signal handler's SystemExit or KeyboardInterrupt raised inside submit propagates, as it does from slow).
 * While api._submit is ring_put (the record ring is on, ring.c) and nothing is sampled out, a record that goes on is
 * put into the ring from the argument arrays: no dict, no Python call.
 */
#include "ring.h"

static PyObject *slow = NULL;  /* api's Python cptrace */
static PyObject *state = NULL; /* api's module dict */
static PyObject *k_gate = NULL, *k_drop = NULL, *k_submit = NULL, *s_node_id = NULL, *s_split = NULL; /* names */

/* name == want (an interned str). Keyword names and tag literals of call sites are interned: then the pointers
 * decide, and only a str built at run time is compared character by character. */
static int is_key(PyObject *name, PyObject *want) {
    if (name == want) return 1;
    if (PyUnicode_CheckExact(name) && PyUnicode_CHECK_INTERNED(name)) return 0;
    return PyUnicode_Check(name) && PyUnicode_Compare(name, want) == 0;
}

static PyObject *cptrace(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cptrace: _hot.configure was not called");
        return NULL;
    }
    PyObject *g = PyDict_GetItemWithError(state, k_gate); /* borrowed */
    if (nargs != 2 || g == NULL || !PyLong_CheckExact(g) || !PyLong_CheckExact(args[0])) {
        PyErr_Clear();
        return PyObject_Vectorcall(slow, args, nargsf, kwnames);
    }
    int overflow = 0, overflow_g = 0;
    long long level = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    long long gate = PyLong_AsLongLongAndOverflow(g, &overflow_g);
    if (overflow || overflow_g) return PyObject_Vectorcall(slow, args, nargsf, kwnames);
    if (level > gate) Py_RETURN_NONE;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *drop = PyDict_GetItemWithError(state, k_drop);
    if (drop == NULL) PyErr_Clear(); /* absent (no error) or a failed lookup: nothing sampled out */
    if (drop != NULL && drop != Py_None) {
        if (!PyAnySet_Check(drop)) return PyObject_Vectorcall(slow, args, nargsf, kwnames);
        for (Py_ssize_t i = 0; i < nkw; i++) {
            if (!is_key(PyTuple_GET_ITEM(kwnames, i), s_node_id)) continue;
            /* the node id's __hash__/__eq__ may run Python code that rebinds api._DROP: hold the set meanwhile */
            Py_INCREF(drop);
            int in = PySet_Contains(drop, args[nargs + i]);
            Py_DECREF(drop);
            if (in < 0) PyErr_Clear(); /* unhashable node id: not decided out; the sampler takes it from here */
            /* a split still goes on: its new node inherits the decision */
            if (in > 0 && !is_key(args[1], s_split)) Py_RETURN_NONE;
            break;
        }
    }
    if (drop == NULL || drop == Py_None) {
        /* the record ring is on (api._submit is its put): encoded from the arrays, no dict (ring.c) */
        PyObject *sub = PyDict_GetItemWithError(state, k_submit);
        if (sub != NULL && sub == ring_put_fn) {
            if (ring_put_kw(args[0], args[1], args + nargs, kwnames) < 0) goto swallow;
            Py_RETURN_NONE;
        }
    }
    PyObject *fields = PyDict_New();
    if (fields == NULL) goto swallow;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyDict_SetItem(fields, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_DECREF(fields);
            goto swallow;
        }
    }
    PyObject *submit = PyDict_GetItemWithError(state, k_submit);
    if (submit == NULL) {
        Py_DECREF(fields);
        goto swallow;
    }
    Py_INCREF(submit); /* rebinding api._submit during the call must not free it under us */
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

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *fn, *dict, *names[5];
    if (!PyArg_ParseTuple(args, "OO!(UUUUU)", &fn, &PyDict_Type, &dict, &names[0], &names[1], &names[2], &names[3],
                          &names[4]))
        return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "configure: slow must be callable");
        return NULL;
    }
    PyObject **slots[5] = {&k_gate, &k_drop, &k_submit, &s_node_id, &s_split};
    for (int i = 0; i < 5; i++) {
        PyObject *k = Py_NewRef(names[i]);
        PyUnicode_InternInPlace(&k);
        Py_XSETREF(*slots[i], k);
    }
    Py_XSETREF(state, Py_NewRef(dict));
    Py_XSETREF(slow, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"cptrace", (PyCFunction)(void (*)(void))cptrace, METH_FASTCALL | METH_KEYWORDS,
     "cptrace($module, level, tag, /, **fields)\n--\n\nRecord one tag event with fields if the gate is at least "
     "level; never raises, never blocks (the traced api's cptrace, its gate and sampled-out check in C)."},
    {"configure", configure, METH_VARARGS,
     "configure(slow, state, names): api's Python cptrace (for the calls decided there), api's module dict and "
     "the names (gate, drop, submit, node_key, split_tag)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hot", "The gate of cptrace in C.", -1, methods};

PyMODINIT_FUNC PyInit__hot(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddFunctions(m, ring_methods) < 0 || ring_module_init(m) < 0)) Py_CLEAR(m);
    return m;
}
