/* Event construction and epoch numbering shared by the C line reader and the C exporter intake (see event.h).
 *
 * Twin: cptrace_otel.model.events.Event
 * Held equal by: tests/unit/test_logc.py
 */
#include "event.h"

#include <structmember.h>   /* T_OBJECT_EX: the member type of a __slots__ entry */
#include <string.h>

static PyObject *event_type, *tracker_type, *epoch_tags;   /* events.Event, EpochTracker, EPOCH_TAGS */
static PyObject *attr_pending, *attr_epoch, *attr_step;    /* the EpochTracker API the loops use */
static Py_ssize_t event_off[EVENT_NFIELDS];   /* slot offsets of Event's fields; event_off[0] == 0: call the type */

/* Fill event_off from Event's member descriptors; leaves it zero (the calling path) unless every name is an object
 * slot of a type without instance dicts. */
static int configure_event_slots(PyObject *type, PyObject *names)
{
    memset(event_off, 0, sizeof(event_off));
    if (names == NULL || names == Py_None)
        return 0;
    if (!PyType_Check(type) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) != EVENT_NFIELDS) {
        PyErr_Format(PyExc_TypeError, "configure: event_slots must be a tuple of the %d Event field names",
                     EVENT_NFIELDS);
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

int event_configure(PyObject *event, PyObject *tracker, PyObject *tags, PyObject *slots)
{
    if (!PyFrozenSet_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "configure: epoch_tags must be a frozenset");
        return -1;
    }
    if (attr_pending == NULL) {
        attr_pending = PyUnicode_InternFromString("pending");
        attr_epoch = PyUnicode_InternFromString("epoch");
        attr_step = PyUnicode_InternFromString("step");
        if (attr_pending == NULL || attr_epoch == NULL || attr_step == NULL)
            return -1;
    }
    if (configure_event_slots(event, slots) < 0)
        return -1;
    Py_INCREF(event);
    Py_XSETREF(event_type, event);
    Py_INCREF(tracker);
    Py_XSETREF(tracker_type, tracker);
    Py_INCREF(tags);
    Py_XSETREF(epoch_tags, tags);
    return 0;
}

PyObject *event_new(PyObject *const *argv)
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

PyObject *event_slot(PyObject *ev, int i)
{
    if (event_off[0] == 0 || (PyObject *)Py_TYPE(ev) != event_type)
        return NULL;
    return *(PyObject **)((char *)ev + event_off[i]);
}

PyObject *event_new_tracker(void)
{
    return PyObject_CallNoArgs(tracker_type);
}

PyObject *event_epoch(PyObject *t, PyObject *tag, PyObject *fields)
{
    int step = PySet_Contains(epoch_tags, tag);
    if (step < 0)
        return NULL;
    if (!step) {
        PyObject *a = PyObject_GetAttr(t, attr_pending);
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
