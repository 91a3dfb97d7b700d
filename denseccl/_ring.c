/* The flight recorder's record as one call (denseccl/recorder.py).

Every call the engine runs reads the clock anyway (the agreement's deadline). Ring.record(d)
is that clock read, time.monotonic()'s value, plus the record: d into slot count % length of
a list, the time into the same slot of an array of doubles (both made once by the recorder),
and the count's increment. In Python the record alone is seven bytecodes and two int objects
per call, about 60 ns, more than 1% of a 4 KiB call on the board path; here it is a few stores
inside a call that was made anyway. The times are doubles, not float objects: a ring of 1024
float objects kept alive made each call reuse a cold one (about 40 ns more, measured).

The list stays a plain Python list (the recorder's dumps read it); a list that someone resized
is refused, never written past its end. The array cannot be resized while the ring holds its
buffer. The GIL makes a record atomic: the old entry is let go only after the count says the
slot holds the new call. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if !defined(CLOCK_MONOTONIC)
#error "no CLOCK_MONOTONIC: the recorder records in Python here"
#endif

typedef struct {
    PyObject_HEAD
    PyObject *calls; /* list: the descriptors, by count % length */
    Py_buffer times; /* doubles: when each call's agreement step began (times.obj: the exporter) */
    Py_ssize_t length;
    Py_ssize_t count; /* the calls recorded: the next call's sequence */
} Ring;

static void ring_release(Ring *self) {
    if (self->times.obj != NULL)
        PyBuffer_Release(&self->times);
}

static int ring_init(Ring *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"calls", "times", NULL};
    PyObject *calls, *times;
    Py_buffer view;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O", names, &PyList_Type, &calls, &times))
        return -1;
    if (PyObject_GetBuffer(times, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view.itemsize != sizeof(double) || view.format == NULL || strcmp(view.format, "d") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "a ring's times are doubles: array('d') or the like");
        return -1;
    }
    if (PyList_GET_SIZE(calls) < 1 || PyList_GET_SIZE(calls) != view.len / view.itemsize) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "a ring needs a list and an array of the same length, at least 1");
        return -1;
    }
    ring_release(self);
    self->times = view;
    Py_INCREF(calls);
    Py_XSETREF(self->calls, calls);
    self->length = PyList_GET_SIZE(calls);
    self->count = 0;
    return 0;
}

static PyObject *ring_record(Ring *self, PyObject *descriptor) {
    struct timespec now;
    if (self->calls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the ring was not initialised");
        return NULL;
    }
    if (PyList_GET_SIZE(self->calls) != self->length) {
        PyErr_SetString(PyExc_RuntimeError, "the flight recorder's list was resized: the ring no longer fits it");
        return NULL;
    }
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    /* as time.monotonic() rounds: nanoseconds as one integer, then seconds */
    int64_t ns = (int64_t)now.tv_sec * 1000000000 + (int64_t)now.tv_nsec;
    double seconds = (double)ns / 1e9;
    Py_ssize_t slot = self->count % self->length;
    PyObject *old = PyList_GET_ITEM(self->calls, slot);
    Py_INCREF(descriptor);
    PyList_SET_ITEM(self->calls, slot, descriptor);
    ((double *)self->times.buf)[slot] = seconds;
    self->count++;
    Py_XDECREF(old); /* last: a finalizer run here sees the ring whole */
    return PyFloat_FromDouble(seconds);
}

static int ring_traverse(Ring *self, visitproc visit, void *arg) {
    Py_VISIT(self->calls);
    Py_VISIT(self->times.obj);
    return 0;
}

static int ring_clear(Ring *self) {
    Py_CLEAR(self->calls);
    ring_release(self);
    return 0;
}

static void ring_dealloc(Ring *self) {
    PyObject_GC_UnTrack(self);
    ring_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ring_methods[] = {
    {"record", (PyCFunction)ring_record, METH_O,
     "record(descriptor) -> float: time.monotonic() now, with descriptor and that time stored as the next call."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef ring_members[] = {
    {"count", T_PYSSIZET, offsetof(Ring, count), READONLY, "the calls recorded: the next call's sequence"},
    {"length", T_PYSSIZET, offsetof(Ring, length), READONLY, "the slots of each list"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "denseccl._ring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Ring(calls, times): the flight recorder's record into a list and an array('d') of one length.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_init,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_methods = ring_methods,
    .tp_members = ring_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_ring", .m_doc = "The flight recorder's record.", .m_size = -1,
};

PyMODINIT_FUNC PyInit__ring(void) {
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
