/*
 * pycachew.c - cachew._cachew, the compiled core of the Python package:
 * pipelines (Dataset), iterators (Iterator) and zero-copy views of
 * element components (Tensor), over libcachew's public C API only
 * (include/cachew.h). The Python layer (cachew/__init__.py) builds
 * pipelines as pipeline strings and wraps these types in tf.data's API.
 *
 * Ownership: a Dataset holds one reference to its cachew_dataset; an
 * Iterator owns its cachew_iterator; a Tensor holds one reference to the
 * element whose component it views, so the memory it exports (buffer
 * protocol, __array_interface__, DLPack) lives until the last view is gone.
 * A DLPack capsule holds its own reference (its deleter may run on any
 * thread without the GIL: cachew_element_release is thread safe).
 *
 * The GIL: released only around calls that block (iterator creation,
 * which may connect to a service; waits for the next element; destroy,
 * which joins threads). A wait is cut into 50 ms slices with
 * cachew_iterator_next_timeout, and between slices the thread takes the
 * GIL and runs PyErr_CheckSignals, so Ctrl-C raises KeyboardInterrupt
 * within a slice whatever the pipeline is doing; the pull goes on, and
 * the next call continues it (nothing is lost).
 *
 * Elements are tuples of Tensors today. Named components (a dict) will
 * come from element_to_python alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cachew.h"

/* Slice of a blocking wait between checks for signals. */
#define WAIT_SLICE_MS 50

/* ---- errors -------------------------------------------------------------------- */

static PyObject *Error; /* cachew.Error: every failure's base */
static PyObject *ServiceError; /* the service's failures' base */
static PyObject *code_exc[20]; /* by cachew_err value */

typedef struct exc_def {
	cachew_err code;
	const char *name;
	PyObject **builtin; /* a builtin base besides the family, or NULL */
	bool service;       /* a ServiceError */
	const char *doc;
} exc_def;

static const exc_def exc_defs[] = {
    {CACHEW_EINVAL, "InvalidArgumentError", &PyExc_ValueError, false,
	"an invalid argument, parameter or option (CACHEW_EINVAL)"},
    {CACHEW_ENOMEM, "OutOfMemoryError", &PyExc_MemoryError, false,
	"out of memory, or over a memory limit (CACHEW_ENOMEM)"},
    {CACHEW_ERANGE, "OutOfRangeError", &PyExc_ValueError, false,
	"a value outside its allowed range (CACHEW_ERANGE)"},
    {CACHEW_ENOENT, "NotFoundError", &PyExc_LookupError, false,
	"no such operator, option, file or symbol (CACHEW_ENOENT)"},
    {CACHEW_EPARSE, "ParseError", &PyExc_ValueError, false,
	"a bad pipeline string or serialized graph (CACHEW_EPARSE)"},
    {CACHEW_ETYPE, "TypeMismatchError", &PyExc_TypeError, false,
	"a dtype or shape mismatch (CACHEW_ETYPE)"},
    {CACHEW_EIO, "IOFailedError", NULL, false,
	"an I/O operation failed (CACHEW_EIO)"},
    {CACHEW_ECORRUPT, "CorruptDataError", NULL, false,
	"input data is corrupt (CACHEW_ECORRUPT)"},
    {CACHEW_EOP, "OperatorError", NULL, false,
	"an operator failed (CACHEW_EOP)"},
    {CACHEW_ECANCELED, "CanceledError", NULL, false,
	"the iterator was canceled (CACHEW_ECANCELED)"},
    {CACHEW_ETIMEDOUT, "DeadlineExceededError", NULL, true,
	"a deadline passed (CACHEW_ETIMEDOUT)"},
    {CACHEW_ECLOSED, "ClosedError", NULL, true,
	"the object or connection is closed, or the iterator was inherited "
	"through fork() (CACHEW_ECLOSED)"},
    {CACHEW_EEXIST, "AlreadyExistsError", NULL, false,
	"the name is already taken (CACHEW_EEXIST)"},
    {CACHEW_ENOTSUP, "NotSupportedError", NULL, false,
	"not supported by this build or object (CACHEW_ENOTSUP)"},
    {CACHEW_EPROTO, "ProtocolError", NULL, true,
	"a peer violated the protocol (CACHEW_EPROTO)"},
    {CACHEW_EINTERNAL, "InternalError", NULL, false,
	"an internal invariant failed: a bug (CACHEW_EINTERNAL)"},
    {CACHEW_EPERM, "PermissionDeniedError", NULL, true,
	"the peer may not do this (CACHEW_EPERM)"},
    {CACHEW_EAUTH, "AuthenticationError", NULL, true,
	"a peer could not be authenticated (CACHEW_EAUTH)"},
};

/* Raises the exception of code with msg (the library's detail; its
 * strerror when empty). Always returns NULL. */
static PyObject *
raise_code(cachew_err code, const char *msg)
{
	PyObject *type = (unsigned)code < sizeof(code_exc) / sizeof(code_exc[0]) &&
		code_exc[code] != NULL ? code_exc[code] : Error;
	PyObject *val;

	if (msg == NULL || msg[0] == '\0')
		msg = cachew_strerror(code);
	val = PyObject_CallFunction(type, "s", msg);
	if (val == NULL)
		return NULL;
	PyObject *num = PyLong_FromLong(code);
	if (num != NULL && PyObject_SetAttrString(val, "code", num) == 0)
		PyErr_SetObject(type, val);
	Py_XDECREF(num);
	Py_DECREF(val);
	return NULL;
}

static int
add_exceptions(PyObject *m)
{
	Error = PyErr_NewExceptionWithDoc("cachew.Error",
	    "Base of every cachew failure; `code` is the library's error "
	    "number, str() its message.", NULL, NULL);
	if (Error == NULL || PyModule_AddObjectRef(m, "Error", Error) < 0)
		return -1;
	ServiceError = PyErr_NewExceptionWithDoc("cachew.ServiceError",
	    "Base of the failures of talking to a service (a dispatcher or "
	    "its workers).", Error, NULL);
	if (ServiceError == NULL ||
	    PyModule_AddObjectRef(m, "ServiceError", ServiceError) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(exc_defs) / sizeof(exc_defs[0]); i++) {
		const exc_def *d = &exc_defs[i];
		char qual[96];
		PyObject *bases, *e;

		snprintf(qual, sizeof(qual), "cachew.%s", d->name);
		bases = d->builtin != NULL
		    ? PyTuple_Pack(2, d->service ? ServiceError : Error,
			  *d->builtin)
		    : PyTuple_Pack(1, d->service ? ServiceError : Error);
		if (bases == NULL)
			return -1;
		e = PyErr_NewExceptionWithDoc(qual, d->doc, bases, NULL);
		Py_DECREF(bases);
		if (e == NULL || PyModule_AddObjectRef(m, d->name, e) < 0)
			return -1;
		code_exc[d->code] = e;
	}
	return 0;
}

/* ---- Dataset ------------------------------------------------------------------ */

typedef struct {
	PyObject_HEAD
	cachew_dataset *ds;
} DatasetObject;

static PyTypeObject DatasetType;

static PyObject *
dataset_wrap(cachew_dataset *ds)
{
	DatasetObject *o = PyObject_New(DatasetObject, &DatasetType);

	if (o == NULL) {
		cachew_dataset_release(ds);
		return NULL;
	}
	o->ds = ds;
	return (PyObject *)o;
}

static void
dataset_dealloc(DatasetObject *o)
{
	cachew_dataset_release(o->ds);
	PyObject_Free(o);
}

static PyObject *
dataset_to_string(DatasetObject *o, PyObject *unused)
{
	char *s = NULL;
	cachew_err rv;
	PyObject *r;

	(void)unused;
	rv = cachew_dataset_to_string(o->ds, &s);
	if (rv != CACHEW_OK)
		return raise_code(rv, cachew_errmsg());
	r = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
	cachew_free(s);
	return r;
}

static PyObject *
dataset_fingerprint(DatasetObject *o, PyObject *unused)
{
	cachew_fingerprint fp;
	char hex[33];
	cachew_err rv;

	(void)unused;
	rv = cachew_dataset_fingerprint(o->ds, &fp);
	if (rv != CACHEW_OK)
		return raise_code(rv, cachew_errmsg());
	cachew_fingerprint_hex(&fp, hex);
	return PyUnicode_FromString(hex);
}

static PyObject *
dataset_get_op(DatasetObject *o, void *closure)
{
	(void)closure;
	return PyUnicode_FromString(cachew_dataset_op(o->ds));
}

static PyObject *
dataset_get_inputs(DatasetObject *o, void *closure)
{
	size_t n = cachew_dataset_num_inputs(o->ds);
	PyObject *t = PyTuple_New((Py_ssize_t)n);

	(void)closure;
	for (size_t i = 0; t != NULL && i < n; i++) {
		PyObject *in = dataset_wrap(
		    cachew_dataset_retain(cachew_dataset_input(o->ds, i)));
		if (in == NULL) {
			Py_DECREF(t);
			return NULL;
		}
		PyTuple_SET_ITEM(t, (Py_ssize_t)i, in);
	}
	return t;
}

static PyMethodDef dataset_methods[] = {
    {"to_string", (PyCFunction)dataset_to_string, METH_NOARGS,
	"The canonical pipeline string."},
    {"fingerprint", (PyCFunction)dataset_fingerprint, METH_NOARGS,
	"The 128-bit structural fingerprint, as 32 hex digits."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef dataset_getset[] = {
    {"op", (getter)dataset_get_op, NULL, "the operator's name", NULL},
    {"inputs", (getter)dataset_get_inputs, NULL,
	"the input pipelines, a tuple", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DatasetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cachew._cachew.Dataset",
    .tp_basicsize = sizeof(DatasetObject),
    .tp_dealloc = (destructor)dataset_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pipeline graph node (immutable); built by parse().",
    .tp_methods = dataset_methods,
    .tp_getset = dataset_getset,
};

static PyObject *
mod_parse(PyObject *self, PyObject *arg)
{
	cachew_dataset *ds = NULL;
	const char *text;
	cachew_err rv;

	(void)self;
	text = PyUnicode_AsUTF8(arg);
	if (text == NULL)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rv = cachew_dataset_parse(&ds, text);
	Py_END_ALLOW_THREADS
	if (rv != CACHEW_OK)
		return raise_code(rv, cachew_errmsg());
	return dataset_wrap(ds);
}

/* ---- Tensor: a zero-copy view of one component ------------------------------- */

typedef struct {
	PyObject_HEAD
	cachew_element *elem; /* one reference, ours */
	const cachew_tensor *t; /* borrowed from elem */
	bool writable;
	Py_ssize_t shape[CACHEW_MAX_RANK];
	Py_ssize_t strides[CACHEW_MAX_RANK];
} TensorObject;

static PyTypeObject TensorType;

/* The buffer protocol's format and numpy's typestr of a dtype; NULL for
 * dtypes neither can name (bf16, bytes). */
static const char *
dtype_format(cachew_dtype d)
{
	switch (d) {
	case CACHEW_U8: return "B";
	case CACHEW_I32: return "i";
	case CACHEW_I64: return "q";
	case CACHEW_F16: return "e";
	case CACHEW_F32: return "f";
	case CACHEW_F64: return "d";
	case CACHEW_BOOL: return "?";
	default: return NULL;
	}
}

static const char *
dtype_typestr(cachew_dtype d)
{
	switch (d) {
	case CACHEW_U8: return "|u1";
	case CACHEW_I32: return "<i4";
	case CACHEW_I64: return "<i8";
	case CACHEW_F16: return "<f2";
	case CACHEW_F32: return "<f4";
	case CACHEW_F64: return "<f8";
	case CACHEW_BOOL: return "|b1";
	default: return NULL;
	}
}

static PyObject *
tensor_new(cachew_element *e, size_t i, bool writable)
{
	TensorObject *o = PyObject_New(TensorObject, &TensorType);
	const cachew_tensor *t = cachew_element_component(e, i);
	const int64_t *shape = cachew_tensor_shape(t);
	unsigned rank = cachew_tensor_rank(t);
	Py_ssize_t stride = (Py_ssize_t)cachew_dtype_size(cachew_tensor_dtype(t));

	if (o == NULL)
		return NULL;
	o->elem = cachew_element_retain(e);
	o->t = t;
	o->writable = writable;
	for (unsigned k = rank; k-- > 0;) {
		o->shape[k] = (Py_ssize_t)shape[k];
		o->strides[k] = stride;
		stride *= (Py_ssize_t)shape[k];
	}
	return (PyObject *)o;
}

static void
tensor_dealloc(TensorObject *o)
{
	cachew_element_release(o->elem);
	PyObject_Free(o);
}

static int
tensor_getbuffer(TensorObject *o, Py_buffer *view, int flags)
{
	cachew_dtype d = cachew_tensor_dtype(o->t);
	const char *fmt = dtype_format(d);

	if (fmt == NULL) {
		PyErr_Format(PyExc_BufferError, "cachew: a %s tensor has no "
		    "buffer-protocol format%s", cachew_dtype_name(d),
		    d == CACHEW_BF16 ? ": use to_torch() (DLPack)"
				     : ": use to_numpy() or tolist()");
		return -1;
	}
	if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && !o->writable) {
		PyErr_SetString(PyExc_BufferError, "cachew: the tensor is "
		    "read-only; iterate with writable=True for writable arrays "
		    "(which copies buffers received from a service)");
		return -1;
	}
	view->buf = (void *)cachew_tensor_data(o->t);
	view->obj = Py_NewRef((PyObject *)o);
	view->len = (Py_ssize_t)cachew_tensor_nbytes(o->t);
	view->readonly = !o->writable;
	view->itemsize = (Py_ssize_t)cachew_dtype_size(d);
	view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
	view->ndim = (int)cachew_tensor_rank(o->t);
	view->shape = (flags & PyBUF_ND) ? o->shape : NULL;
	view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? o->strides
								  : NULL;
	view->suboffsets = NULL;
	view->internal = NULL;
	return 0;
}

static PyBufferProcs tensor_as_buffer = {
    .bf_getbuffer = (getbufferproc)tensor_getbuffer,
};

static PyObject *
shape_tuple(const TensorObject *o)
{
	unsigned rank = cachew_tensor_rank(o->t);
	PyObject *t = PyTuple_New(rank);

	for (unsigned k = 0; t != NULL && k < rank; k++)
		PyTuple_SET_ITEM(t, k, PyLong_FromSsize_t(o->shape[k]));
	return t;
}

static PyObject *
tensor_get_shape(TensorObject *o, void *closure)
{
	(void)closure;
	return shape_tuple(o);
}

static PyObject *
tensor_get_dtype(TensorObject *o, void *closure)
{
	(void)closure;
	return PyUnicode_FromString(cachew_dtype_name(cachew_tensor_dtype(o->t)));
}

static PyObject *
tensor_get_writable(TensorObject *o, void *closure)
{
	(void)closure;
	return PyBool_FromLong(o->writable);
}

/* numpy's __array_interface__ (version 3): the data pointer and whether
 * it is read-only; numpy keeps a reference to the tensor. */
static PyObject *
tensor_get_array_interface(TensorObject *o, void *closure)
{
	const char *ts = dtype_typestr(cachew_tensor_dtype(o->t));
	PyObject *shape, *r;

	(void)closure;
	if (ts == NULL) {
		PyErr_Format(PyExc_AttributeError, "cachew: a %s tensor has no "
		    "__array_interface__",
		    cachew_dtype_name(cachew_tensor_dtype(o->t)));
		return NULL;
	}
	shape = shape_tuple(o);
	if (shape == NULL)
		return NULL;
	r = Py_BuildValue("{s:N,s:s,s:(N,O),s:i}", "shape", shape, "typestr", ts,
	    "data", PyLong_FromVoidPtr((void *)cachew_tensor_data(o->t)),
	    o->writable ? Py_False : Py_True, "version", 3);
	return r;
}

/* ---- DLPack (the v0.x ABI torch 1.13 reads) ---- */

typedef struct {
	int32_t device_type; /* kDLCPU = 1 */
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4 */
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* What a capsule owns: the tensor record, its shape and strides, and a
 * reference to the element. */
typedef struct dl_ctx {
	DLManagedTensor managed;
	cachew_element *elem;
	int64_t shape[CACHEW_MAX_RANK];
	int64_t strides[CACHEW_MAX_RANK];
} dl_ctx;

static void
dl_deleter(DLManagedTensor *m)
{
	dl_ctx *c = m->manager_ctx;

	cachew_element_release(c->elem);
	PyMem_RawFree(c);
}

/* A capsule nobody consumed (still named "dltensor") frees its tensor. */
static void
dl_capsule_destructor(PyObject *cap)
{
	DLManagedTensor *m;

	if (!PyCapsule_IsValid(cap, "dltensor"))
		return;
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (m != NULL && m->deleter != NULL)
		m->deleter(m);
}

static bool
dl_dtype(cachew_dtype d, DLDataType *out)
{
	out->lanes = 1;
	switch (d) {
	case CACHEW_U8: out->code = 1; out->bits = 8; return true;
	case CACHEW_I32: out->code = 0; out->bits = 32; return true;
	case CACHEW_I64: out->code = 0; out->bits = 64; return true;
	case CACHEW_F16: out->code = 2; out->bits = 16; return true;
	case CACHEW_BF16: out->code = 4; out->bits = 16; return true;
	case CACHEW_F32: out->code = 2; out->bits = 32; return true;
	case CACHEW_F64: out->code = 2; out->bits = 64; return true;
	case CACHEW_BOOL: out->code = 6; out->bits = 8; return true;
	default: return false;
	}
}

/* A DLPack capsule viewing o, holding a reference to its element.
 * bool_as_u8: a bool tensor is described as uint8 (torch 1.13 does not
 * read kDLBool; to_torch views the result as bool). */
static PyObject *
dlpack_capsule(TensorObject *o, bool bool_as_u8)
{
	cachew_dtype d = cachew_tensor_dtype(o->t);
	unsigned rank = cachew_tensor_rank(o->t);
	PyObject *cap;
	dl_ctx *c;

	c = PyMem_RawCalloc(1, sizeof(*c));
	if (c == NULL)
		return PyErr_NoMemory();
	if (!dl_dtype(d, &c->managed.dl_tensor.dtype)) {
		PyMem_RawFree(c);
		PyErr_Format(PyExc_BufferError, "cachew: a %s tensor cannot be "
		    "exported through DLPack: use to_numpy() or tolist()",
		    cachew_dtype_name(d));
		return NULL;
	}
	if (bool_as_u8 && d == CACHEW_BOOL)
		c->managed.dl_tensor.dtype.code = 1;
	for (unsigned k = 0; k < rank; k++) {
		c->shape[k] = (int64_t)o->shape[k];
		c->strides[k] = (int64_t)(o->strides[k] /
		    (Py_ssize_t)cachew_dtype_size(d));
	}
	c->elem = cachew_element_retain(o->elem);
	c->managed.dl_tensor.data = (void *)cachew_tensor_data(o->t);
	c->managed.dl_tensor.device.device_type = 1;
	c->managed.dl_tensor.ndim = (int32_t)rank;
	c->managed.dl_tensor.shape = c->shape;
	c->managed.dl_tensor.strides = c->strides;
	c->managed.manager_ctx = c;
	c->managed.deleter = dl_deleter;
	cap = PyCapsule_New(&c->managed, "dltensor", dl_capsule_destructor);
	if (cap == NULL)
		dl_deleter(&c->managed);
	return cap;
}

static PyObject *
tensor_dlpack(TensorObject *o, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"stream", NULL};
	PyObject *stream = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &stream))
		return NULL;
	if (stream != Py_None) {
		PyErr_SetString(PyExc_ValueError,
		    "cachew: tensors live in CPU memory: stream must be None");
		return NULL;
	}
	return dlpack_capsule(o, false);
}

static PyObject *
tensor_dlpack_device(TensorObject *o, PyObject *unused)
{
	(void)o;
	(void)unused;
	return Py_BuildValue("(ii)", 1, 0);
}

/* A BYTES tensor as a flat list of bytes objects (copies). */
static PyObject *
bytes_list(const cachew_tensor *t)
{
	int64_t n = cachew_tensor_numel(t);
	PyObject *l = PyList_New((Py_ssize_t)n);

	for (int64_t i = 0; l != NULL && i < n; i++) {
		const void *data;
		size_t len;
		PyObject *b;

		if (cachew_tensor_bytes_at(t, i, &data, &len) != CACHEW_OK) {
			Py_DECREF(l);
			return raise_code(CACHEW_EINTERNAL, cachew_errmsg());
		}
		b = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
		if (b == NULL) {
			Py_DECREF(l);
			return NULL;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, b);
	}
	return l;
}

/* Calls module.attr(*args) (numpy, torch: imported when first used). */
static PyObject *
call_module(const char *module, const char *attr, PyObject *arg)
{
	PyObject *m = PyImport_ImportModule(module), *f, *r;

	if (m == NULL)
		return NULL;
	f = PyObject_GetAttrString(m, attr);
	Py_DECREF(m);
	if (f == NULL)
		return NULL;
	r = PyObject_CallOneArg(f, arg);
	Py_DECREF(f);
	return r;
}

/* numpy.array(items, dtype=object): bytes stay bytes objects (numpy
 * would make them fixed-width S<n> strings). */
static PyObject *
object_array(PyObject *items)
{
	PyObject *m = PyImport_ImportModule("numpy"), *f = NULL, *args = NULL,
		 *kw = NULL, *r = NULL;

	if (m == NULL)
		return NULL;
	f = PyObject_GetAttrString(m, "array");
	args = PyTuple_Pack(1, items);
	kw = Py_BuildValue("{s:O}", "dtype", (PyObject *)&PyBaseObject_Type);
	if (f != NULL && args != NULL && kw != NULL)
		r = PyObject_Call(f, args, kw);
	Py_XDECREF(kw);
	Py_XDECREF(args);
	Py_XDECREF(f);
	Py_DECREF(m);
	return r;
}

static PyObject *
tensor_to_numpy(TensorObject *o, PyObject *unused)
{
	PyObject *l, *arr, *shape, *r;

	(void)unused;
	if (cachew_tensor_dtype(o->t) != CACHEW_BYTES)
		return call_module("numpy", "asarray", (PyObject *)o);
	/* bytes: an object array of bytes, in the tensor's shape. */
	l = bytes_list(o->t);
	if (l == NULL)
		return NULL;
	arr = object_array(l);
	Py_DECREF(l);
	if (arr == NULL)
		return NULL;
	shape = shape_tuple(o);
	r = shape != NULL ? PyObject_CallMethod(arr, "reshape", "O", shape)
			  : NULL;
	Py_XDECREF(shape);
	Py_DECREF(arr);
	return r;
}

static PyObject *
tensor_to_torch(TensorObject *o, PyObject *unused)
{
	bool is_bool = cachew_tensor_dtype(o->t) == CACHEW_BOOL;
	PyObject *cap, *x, *r, *torch, *tbool;

	(void)unused;
	cap = dlpack_capsule(o, true);
	if (cap == NULL)
		return NULL;
	x = call_module("torch.utils.dlpack", "from_dlpack", cap);
	Py_DECREF(cap);
	if (x == NULL || !is_bool)
		return x;
	/* torch 1.13 reads no kDLBool: a uint8 view, seen as bool (same
	 * size, no copy). */
	torch = PyImport_ImportModule("torch");
	tbool = torch != NULL ? PyObject_GetAttrString(torch, "bool") : NULL;
	r = tbool != NULL ? PyObject_CallMethod(x, "view", "O", tbool) : NULL;
	Py_XDECREF(tbool);
	Py_XDECREF(torch);
	Py_DECREF(x);
	return r;
}

/* Plain Python values: a scalar's value, nested lists otherwise. */
static PyObject *
tensor_tolist(TensorObject *o, PyObject *unused)
{
	PyObject *arr, *r;

	(void)unused;
	if (cachew_tensor_dtype(o->t) == CACHEW_BYTES &&
	    cachew_tensor_rank(o->t) == 0) {
		const void *data;
		size_t len;
		if (cachew_tensor_bytes_at(o->t, 0, &data, &len) != CACHEW_OK)
			return raise_code(CACHEW_EINTERNAL, cachew_errmsg());
		return PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
	}
	arr = tensor_to_numpy(o, NULL);
	if (arr == NULL)
		return NULL;
	r = PyObject_CallMethod(arr, "tolist", NULL);
	Py_DECREF(arr);
	return r;
}

static PyObject *
tensor_repr(TensorObject *o)
{
	PyObject *shape = shape_tuple(o), *r;

	if (shape == NULL)
		return NULL;
	r = PyUnicode_FromFormat("cachew.Tensor(dtype=%s, shape=%R%s)",
	    cachew_dtype_name(cachew_tensor_dtype(o->t)), shape,
	    o->writable ? ", writable" : "");
	Py_DECREF(shape);
	return r;
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack,
	METH_VARARGS | METH_KEYWORDS,
	"A DLPack capsule viewing the tensor (no copy); it holds the element."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
	"(kDLCPU, 0)."},
    {"to_numpy", (PyCFunction)tensor_to_numpy, METH_NOARGS,
	"A numpy array viewing the tensor (no copy; read-only unless the "
	"iterator was made with writable=True). bytes tensors: an object "
	"array of bytes (copied)."},
    {"to_torch", (PyCFunction)tensor_to_torch, METH_NOARGS,
	"A torch tensor viewing the tensor through DLPack (no copy). torch "
	"has no read-only tensors: do not write to it unless the iterator was "
	"made with writable=True."},
    {"tolist", (PyCFunction)tensor_tolist, METH_NOARGS,
	"The values as Python objects (copied)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_get_shape, NULL, "the shape, a tuple", NULL},
    {"dtype", (getter)tensor_get_dtype, NULL,
	"the dtype's name: u8, i32, i64, f16, bf16, f32, f64, bool, bytes",
	NULL},
    {"writable", (getter)tensor_get_writable, NULL,
	"whether its views may be written", NULL},
    {"__array_interface__", (getter)tensor_get_array_interface, NULL,
	"numpy's array interface (version 3)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static Py_ssize_t
tensor_len(TensorObject *o)
{
	if (cachew_tensor_rank(o->t) == 0) {
		PyErr_SetString(PyExc_TypeError, "len() of a scalar tensor");
		return -1;
	}
	return o->shape[0];
}

static PySequenceMethods tensor_as_sequence = {
    .sq_length = (lenfunc)tensor_len,
};

static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cachew.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_as_buffer = &tensor_as_buffer,
    .tp_as_sequence = &tensor_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One component of an element, viewed without a copy: "
	      "numpy.asarray(t) (buffer protocol, __array_interface__), "
	      "torch.utils.dlpack.from_dlpack(t) (__dlpack__), to_numpy(), "
	      "to_torch(). The element lives until its last view is gone.",
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
};

/* ---- Iterator --------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD
	cachew_iterator *it;
	bool writable;
} IteratorObject;

static PyTypeObject IteratorType;

/* Sets one option from a Python value: bool, int and str go to the typed
 * setters; anything else as its str() text. */
static int
set_option(cachew_options *o, PyObject *key, PyObject *value)
{
	const char *name = PyUnicode_AsUTF8(key), *text;
	cachew_err rv;

	if (name == NULL)
		return -1;
	if (PyBool_Check(value)) {
		rv = cachew_options_set_bool(o, name, value == Py_True);
	} else if (PyLong_Check(value)) {
		long long v = PyLong_AsLongLong(value);
		if (v == -1 && PyErr_Occurred())
			return -1;
		rv = cachew_options_set_int(o, name, v);
	} else {
		PyObject *s = PyObject_Str(value);
		if (s == NULL)
			return -1;
		text = PyUnicode_AsUTF8(s);
		rv = text == NULL ? CACHEW_EINVAL
				  : PyUnicode_Check(value)
				  ? cachew_options_set_str(o, name, text)
				  : cachew_options_set(o, name, text);
		Py_DECREF(s);
		if (text == NULL)
			return -1;
	}
	if (rv != CACHEW_OK) {
		raise_code(rv, cachew_options_errmsg(o));
		return -1;
	}
	return 0;
}

static PyObject *
iterator_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"dataset", "options", "writable", NULL};
	PyObject *ds, *opts = NULL, *key, *value;
	cachew_options *o = NULL;
	IteratorObject *self;
	Py_ssize_t pos = 0;
	int writable = 0;
	cachew_err rv;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|O!p", kwlist,
		&DatasetType, &ds, &PyDict_Type, &opts, &writable))
		return NULL;
	if (cachew_options_create(&o) != CACHEW_OK)
		return PyErr_NoMemory();
	while (opts != NULL && PyDict_Next(opts, &pos, &key, &value)) {
		if (set_option(o, key, value) < 0) {
			cachew_options_destroy(o);
			return NULL;
		}
	}
	self = (IteratorObject *)type->tp_alloc(type, 0);
	if (self == NULL) {
		cachew_options_destroy(o);
		return NULL;
	}
	self->writable = writable != 0;
	/* Creating may connect to a service and join its job. */
	Py_BEGIN_ALLOW_THREADS
	rv = cachew_iterator_create(&self->it, ((DatasetObject *)ds)->ds, o);
	Py_END_ALLOW_THREADS
	cachew_options_destroy(o);
	if (rv != CACHEW_OK) {
		self->it = NULL;
		Py_DECREF(self);
		return raise_code(rv, cachew_errmsg());
	}
	return (PyObject *)self;
}

static void
iterator_close_it(IteratorObject *o)
{
	cachew_iterator *it = o->it;

	o->it = NULL;
	if (it == NULL)
		return;
	/* Joins its threads (and a service session's). */
	Py_BEGIN_ALLOW_THREADS
	cachew_iterator_destroy(it);
	Py_END_ALLOW_THREADS
}

static void
iterator_dealloc(IteratorObject *o)
{
	iterator_close_it(o);
	Py_TYPE(o)->tp_free((PyObject *)o);
}

/* Makes every fixed-width component of e writable in place (the
 * library copies a buffer that is shared or not its own). */
static cachew_err
components_writable(cachew_element *e)
{
	size_t n = cachew_element_size(e);
	void *data;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; rv == CACHEW_OK && i < n; i++)
		if (cachew_tensor_dtype(cachew_element_component(e, i)) !=
		    CACHEW_BYTES)
			rv = cachew_element_mutable_data(e, i, &data);
	return rv;
}

/* writable=True: the components' values made writable, without a copy
 * when the element and its buffers are the caller's alone, copied where
 * they are shared (a reply buffer several elements of a received message
 * view, a buffer the library wraps). An element still shared with the
 * library is replaced by a fresh one sharing its tensors first. */
static cachew_err
make_writable(cachew_element **ep)
{
	cachew_element *e = *ep, *copy = NULL;
	size_t n = cachew_element_size(e);
	cachew_err rv;

	rv = components_writable(e);
	if (rv != CACHEW_EINVAL)
		return rv;
	rv = cachew_element_create(&copy, n);
	for (size_t i = 0; rv == CACHEW_OK && i < n; i++)
		rv = cachew_element_set(copy, i, cachew_element_component(e, i));
	if (rv == CACHEW_OK)
		rv = components_writable(copy);
	if (rv != CACHEW_OK) {
		cachew_element_release(copy);
		return rv;
	}
	cachew_element_release(e);
	*ep = copy;
	return CACHEW_OK;
}

/* An element as Python sees it: a tuple of Tensors. (Named components
 * will make it a dict here.) Consumes the caller's reference to e. */
static PyObject *
element_to_python(cachew_element *e, bool writable)
{
	size_t n;
	PyObject *t;

	if (writable) {
		cachew_err rv = make_writable(&e);
		if (rv != CACHEW_OK) {
			cachew_element_release(e);
			return raise_code(rv, cachew_errmsg());
		}
	}
	n = cachew_element_size(e);
	t = PyTuple_New((Py_ssize_t)n);
	for (size_t i = 0; t != NULL && i < n; i++) {
		PyObject *c = tensor_new(e, i, writable);
		if (c == NULL) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, (Py_ssize_t)i, c);
	}
	cachew_element_release(e);
	return t;
}

/* The next element: what is ready is taken with the GIL held; a wait is
 * done without it, in slices, checking for signals in between. */
static PyObject *
iterator_next(IteratorObject *o)
{
	cachew_element *e = NULL;
	cachew_err rv;

	if (o->it == NULL)
		return raise_code(CACHEW_ECLOSED, "iterator: closed");
	rv = cachew_iterator_next_timeout(o->it, &e, 0);
	while (rv == CACHEW_ETIMEDOUT) {
		Py_BEGIN_ALLOW_THREADS
		rv = cachew_iterator_next_timeout(o->it, &e, WAIT_SLICE_MS);
		Py_END_ALLOW_THREADS
		if (rv == CACHEW_ETIMEDOUT && PyErr_CheckSignals() < 0)
			return NULL;
	}
	if (rv == CACHEW_EOF)
		return NULL; /* StopIteration */
	if (rv != CACHEW_OK)
		return raise_code(rv, cachew_iterator_errmsg(o->it));
	return element_to_python(e, o->writable);
}

static PyObject *
iterator_close(IteratorObject *o, PyObject *unused)
{
	(void)unused;
	iterator_close_it(o);
	Py_RETURN_NONE;
}

static PyObject *
iterator_cancel(IteratorObject *o, PyObject *unused)
{
	(void)unused;
	cachew_iterator_cancel(o->it);
	Py_RETURN_NONE;
}

static PyObject *
iterator_enter(PyObject *o, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(o);
}

static PyObject *
iterator_exit(IteratorObject *o, PyObject *args)
{
	(void)args;
	iterator_close_it(o);
	Py_RETURN_FALSE;
}

static PyObject *
iterator_stats(IteratorObject *o, PyObject *unused)
{
	cachew_op_stats rows[64];
	size_t n = 0;
	PyObject *l;

	(void)unused;
	if (o->it == NULL)
		return raise_code(CACHEW_ECLOSED, "iterator: closed");
	(void)cachew_iterator_stats(o->it, rows, 64, &n);
	if (n > 64)
		n = 64;
	l = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; l != NULL && i < n; i++) {
		PyObject *d = Py_BuildValue(
		    "{s:s,s:s,s:i,s:K,s:K,s:K,s:K,s:i,s:L,s:L}", "name",
		    rows[i].name, "detail", rows[i].detail, "node", rows[i].node,
		    "elements", (unsigned long long)rows[i].elements, "bytes",
		    (unsigned long long)rows[i].bytes, "busy_ns",
		    (unsigned long long)rows[i].busy_ns, "wait_ns",
		    (unsigned long long)rows[i].wait_ns, "parallelism",
		    rows[i].parallelism, "buffer_limit",
		    (long long)rows[i].buffer_limit, "buffered",
		    (long long)rows[i].buffered);
		if (d == NULL) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, d);
	}
	return l;
}

static PyMethodDef iterator_methods[] = {
    {"close", (PyCFunction)iterator_close, METH_NOARGS,
	"Stops the pipeline and frees it; tensors already returned stay "
	"valid. Later next() raises ClosedError."},
    {"cancel", (PyCFunction)iterator_cancel, METH_NOARGS,
	"From any thread: a next() blocked in another thread, and every "
	"later one, raises CanceledError."},
    {"stats", (PyCFunction)iterator_stats, METH_NOARGS,
	"Per-operator counters, a list of dicts in pipeline order."},
    {"__enter__", (PyCFunction)iterator_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)iterator_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IteratorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cachew.Iterator",
    .tp_basicsize = sizeof(IteratorObject),
    .tp_dealloc = (destructor)iterator_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Iterator(dataset, options=None, writable=False): runs a "
	      "pipeline and yields its elements as tuples of Tensors.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iterator_next,
    .tp_methods = iterator_methods,
    .tp_new = iterator_new,
};

/* ---- module --------------------------------------------------------------------- */

static PyObject *
mod_version(PyObject *self, PyObject *unused)
{
	(void)self;
	(void)unused;
	return PyUnicode_FromString(cachew_version());
}

/* The option table: (name, type, default, help) tuples. */
static PyObject *
mod_options(PyObject *self, PyObject *unused)
{
	const char *name, *type, *def, *help;
	PyObject *l = PyList_New(0);

	(void)self;
	(void)unused;
	for (size_t i = 0; l != NULL &&
	     cachew_option_info(i, &name, &type, &def, &help) == CACHEW_OK;
	     i++) {
		PyObject *t = Py_BuildValue("(ssss)", name, type, def, help);
		if (t == NULL || PyList_Append(l, t) < 0) {
			Py_XDECREF(t);
			Py_CLEAR(l);
			break;
		}
		Py_DECREF(t);
	}
	return l;
}

static PyMethodDef module_methods[] = {
    {"parse", mod_parse, METH_O,
	"parse(text) -> Dataset: parses a pipeline string."},
    {"version", mod_version, METH_NOARGS,
	"The version of the linked libcachew."},
    {"options", mod_options, METH_NOARGS,
	"The iterator options: (name, type, default, help) tuples."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cachew._cachew",
    .m_doc = "The compiled core of the cachew package (libcachew).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__cachew(void)
{
	PyObject *m;

	if (PyType_Ready(&DatasetType) < 0 || PyType_Ready(&TensorType) < 0 ||
	    PyType_Ready(&IteratorType) < 0)
		return NULL;
	m = PyModule_Create(&module_def);
	if (m == NULL)
		return NULL;
	if (add_exceptions(m) < 0 ||
	    PyModule_AddObjectRef(m, "Dataset", (PyObject *)&DatasetType) < 0 ||
	    PyModule_AddObjectRef(m, "Tensor", (PyObject *)&TensorType) < 0 ||
	    PyModule_AddObjectRef(m, "Iterator", (PyObject *)&IteratorType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
