/*
 * pycachew.h - what the parts of cachew._cachew share: the module
 * (pycachew.c: errors, Dataset, the module table), its tensors
 * (pycachew_tensor.c: Tensor, DLPack, numpy), its iterators
 * (pycachew_iter.c) and the logging bridge (pycachew_log.c). Each file's
 * top comment says what it owns; pycachew.c's says how the GIL is used.
 */
#ifndef PYCACHEW_H
#define PYCACHEW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cachew.h"

/* Raises the exception class of code (cachew.ParseError...) with msg,
 * the library's detail (its strerror when empty), and e.code. Always
 * returns NULL. */
PyObject *pyc_raise(cachew_err code, const char *msg);

/* A component's name as an interned str (bytes that are not UTF-8 kept
 * as surrogates); a new reference, NULL with an exception set. */
PyObject *pyc_name(const char *name);

/* A tuple of n items, item i made by item(ctx, i) (a new reference, NULL
 * with an exception set, which fails the whole). */
PyObject *pyc_tuple_of(size_t n, PyObject *(*item)(void *ctx, size_t i),
    void *ctx);

typedef struct {
	PyObject_HEAD
	cachew_dataset *ds;
} pyc_dataset;

extern PyTypeObject pyc_dataset_type;
extern PyTypeObject pyc_tensor_type;
extern PyTypeObject pyc_iterator_type;

/* A Tensor viewing component i of e; it takes its own reference to e. */
PyObject *pyc_tensor_new(cachew_element *e, size_t i, bool writable);

/* The logging bridge's module functions (pycachew_log.c). */
PyObject *pyc_log_enable(PyObject *self, PyObject *arg);
PyObject *pyc_log_wait(PyObject *self, PyObject *arg);

#endif /* PYCACHEW_H */
