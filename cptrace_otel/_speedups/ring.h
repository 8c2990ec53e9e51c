/* The record ring (ring.c), linked into _hot: hot.c's gate hands it a record's keyword arrays before any dict is
 * built. See ring.c for the layout and the contract. */
#ifndef CPTRACE_RING_H
#define CPTRACE_RING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The ring_put function object of _hot (set by PyInit__hot): api installs it as the submit function when the ring
 * is on, and the gate takes the keyword fast path only while api's state.submit is this object. */
extern PyObject *ring_put_fn;

/* Put one record (level: an exact int; tag; vals[i] the value of kwnames[i]) into the attached ring: encoded when
 * every value has a common shape, else a placeholder in the ring and the record on the side deque. Drops (ring or
 * deque full, no ring attached) are counted in the ring header. 0, or -1 with an exception (the caller swallows). */
int ring_put_kw(PyObject *level, PyObject *tag, PyObject *const *vals, PyObject *kwnames);

extern PyMethodDef ring_methods[];
/* After PyModule_AddFunctions(m, ring_methods): the module-level objects ring.c keeps. 0, or -1 with an exception. */
int ring_module_init(PyObject *m);

#endif
