/* Building cptrace_otel.model.events.Event objects and numbering their epochs (checks.epochs.EpochTracker), shared by the
 * C readers (logreader.c, intake.c, otlpin.c, jaegerin.c); compiled into each of their modules (event.c).
 *
 * The types and the set of tags that can move a tracker (checks.epochs.EPOCH_TAGS) come from Python at load time
 * (event_configure); nothing here names a record tag.
 */
#ifndef CPTRACE_EVENT_H
#define CPTRACE_EVENT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "grammar.h"

#define EVENT_NFIELDS CPTRACE_EVENT_FIELDS_COUNT   /* Event(tag, rank, seq, ts, epoch, fields, level, src, line_no) */

/* event_configure(Event, EpochTracker, epoch_tags, event_slots): event_slots (None or Event's 9 field names in
 * constructor order, when Event is a plain slots class whose __init__ only assigns them: a dataclass(slots=True)
 * without __post_init__) lets event_new write the slots directly instead of calling the generated Python __init__
 * (about 40% of the parse cost). 0, or -1 with an exception set. */
int event_configure(PyObject *event, PyObject *tracker, PyObject *epoch_tags, PyObject *event_slots);

/* Event(*argv) with the 9 constructor arguments: a new reference, or NULL with an exception set. */
PyObject *event_new(PyObject *const *argv);

/* Slot i (constructor order) of ev when ev's type is exactly Event and event_new writes its slots directly: a borrowed
 * reference; NULL, with no exception set, for any other object or an unset slot (the caller takes its generic path). */
PyObject *event_slot(PyObject *ev, int i);

/* A new EpochTracker(), or NULL with an exception set. */
PyObject *event_new_tracker(void);

/* The epoch of a record, as the Python loops compute it:
 * ``t.step(tag, fields) if (tag in EPOCH_TAGS or t.pending) else t.epoch``. New reference or NULL. */
PyObject *event_epoch(PyObject *t, PyObject *tag, PyObject *fields);

#endif
