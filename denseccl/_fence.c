/* A full memory fence for the agreement board's page (denseccl/channel/fence.py).

Python has no memory barrier of its own, and on processors weaker than x86-TSO (ARM: Grace,
Graviton; POWER) a peer may see a board line's sequence number before its values without one.
C11's atomic_thread_fence(memory_order_seq_cst) is the portable spelling: MFENCE on x86,
DMB ISH on ARMv8, SYNC on POWER. It is also a compiler barrier. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

static PyObject *fence(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    atomic_thread_fence(memory_order_seq_cst);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fence", fence, METH_NOARGS, "A sequentially consistent memory fence (C11 atomic_thread_fence)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fence", "A full memory fence.", -1, methods};

PyMODINIT_FUNC PyInit__fence(void) { return PyModule_Create(&module); }
