/* C fast path of the exporter worker's intake (cptrace_otel.export.worker: Exporter._add_items_fast and
 * _item_event), loaded by intake.py: compact items (ts, level, tag, fields) from the traced process -> Events.
 *
 *   configure(Rng, Event, EpochTracker, epoch_tags, event_slots, src)   the types it builds, the tags that step an
 *       epoch tracker (checks.epochs.EPOCH_TAGS), event_slots (see event.h) and the src of live Events
 *   intake(items, seq, default_rank, epochs, max_chars, value_fn, slow) -> [Event]
 *
 * The Events equal the worker's Python intake's (tests/unit/test_export_fast_paths.py holds them equal); values go
 * through the shared value grammar (value.c), any other value through the worker's Python conversion.
 *
 * Twin: cptrace_otel.export.worker.Exporter._item_event
 * Held equal by: tests/unit/test_export_fast_paths.py
 */
#include "event.h"
#include "value.h"
#include "grammar.h"

static PyObject *key_rank;

static PyObject *py_configure(PyObject *self, PyObject *args)
{
    PyObject *rng, *ev, *tracker, *tags, *slots, *src;
    if (!PyArg_ParseTuple(args, "OOOO!OU:configure", &rng, &ev, &tracker, &PyFrozenSet_Type, &tags, &slots, &src))
        return NULL;
    if (reader_configure(rng, ev, tracker, tags, slots) < 0)
        return NULL;
    Py_XSETREF(src_obj, Py_NewRef(src));
    Py_RETURN_NONE;
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
            int st = value_parse(p, n, out);
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
 * ``_add_items_fast`` loop over compact items ``(ts, level, tag, fields)``. Field values are converted
 * (live_value) into a copy of fields, made at the first value that changes (the item is never changed), rank is ``fields["rank"]`` when an int >= 0 else default_rank, epochs[rank] is the rank's
 * EpochTracker (created when missing), and the Event is ``Event(tag, rank, seq, ts, epoch, fields, level, src,
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
    if (!reader_configured("_intake"))
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
            !PyLong_CheckExact(level = PyTuple_GET_ITEM(item, 1)) ||
            !PyDict_CheckExact(f = PyTuple_GET_ITEM(item, 3))) {
            ev = PyObject_CallFunctionObjArgs(slow, item, seq, NULL);
            goto append;
        }
        ts = PyTuple_GET_ITEM(item, 0);
        /* the Event's fields: f itself while no value changes, else a copy (same keys, same order: replacing a
         * value of an existing key does not reorder a dict) with the converted values */
        PyObject *g = NULL;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(f, &pos, &k, &v)) {
            if (PyLong_CheckExact(v))
                continue;
            PyObject *nv = NULL;
            int st = live_value(v, max_chars, value_fn, &nv);
            if (st == OK) {
                if (nv == v)
                    st = 0;
                else if (g == NULL && (g = PyDict_Copy(f)) == NULL)
                    st = -1;
                else
                    st = PyDict_SetItem(g, k, nv);
                Py_DECREF(nv);
            }
            if (st != 0) {
                /* slow() converts the item (left as it came) and reports it */
                PyErr_Clear();
                Py_XDECREF(g);
                ev = PyObject_CallFunctionObjArgs(slow, item, seq, NULL);
                goto append;
            }
        }
        if (g != NULL)
            f = g;   /* owned: released once the Event holds it */
        PyObject *r = PyDict_GetItemWithError(f, key_rank), *rank = drank;
        if (r == NULL && PyErr_Occurred())
            goto fail_g;
        if (r != NULL && PyLong_CheckExact(r)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(r, &overflow);
            if (overflow > 0 || (overflow == 0 && x >= 0))
                rank = r;
        }
        PyObject *t = PyDict_GetItemWithError(epochs, rank);
        if (t == NULL) {
            if (PyErr_Occurred() || (t = event_new_tracker()) == NULL)
                goto fail_g;
            int st = PyDict_SetItem(epochs, rank, t);
            Py_DECREF(t);   /* epochs holds it */
            if (st < 0)
                goto fail_g;
        }
        PyObject *ep = event_epoch(t, tag, f);
        if (ep == NULL)
            goto fail_g;
        PyObject *argv[EVENT_NFIELDS] = {tag, rank, seq, ts, ep, f, level, src_obj, zero_obj};
        ev = event_new(argv);
        Py_DECREF(ep);
        Py_XDECREF(g);
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
    fail_g:
        Py_XDECREF(g);
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
     "configure(Rng, Event, EpochTracker, epoch_tags, event_slots, src): the types the intake builds, the tags "
     "that step epochs, the src of its Events."},
    {"intake", py_intake, METH_VARARGS,
     "intake(items, seq, default_rank, epochs, max_chars, value_fn, slow) -> [Event]: the exporter's intake."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_intake", "C fast path of the exporter's intake.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__intake(void)
{
    key_rank = PyUnicode_InternFromString(CPTRACE_LINE_RANK_FIELD);
    if (key_rank == NULL)
        return NULL;
    return PyModule_Create(&module);
}
