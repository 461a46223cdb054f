/*
 * pycachew_tensor.c - cachew.Tensor: one component of an element, viewed
 * without a copy through the buffer protocol, numpy's
 * __array_interface__ and DLPack (__dlpack__, the v0.x ABI torch 1.13
 * reads), with to_numpy(), to_torch() and tolist(). A Tensor holds a
 * reference to its element, and a DLPack capsule one of its own, so the
 * exported memory lives until the last view is gone; the capsule's
 * deleter may run on any thread without the GIL (cachew_element_release
 * is thread safe).
 */
#include "pycachew.h"

/* ---- Tensor: a zero-copy view of one component ------------------------------- */

typedef struct {
	PyObject_HEAD
	cachew_element *elem; /* one reference, ours */
	const cachew_tensor *t; /* borrowed from elem */
	bool writable;
	Py_ssize_t shape[CACHEW_MAX_RANK];
	Py_ssize_t strides[CACHEW_MAX_RANK];
} TensorObject;


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

PyObject *
pyc_tensor_new(cachew_element *e, size_t i, bool writable)
{
	TensorObject *o = PyObject_New(TensorObject, &pyc_tensor_type);
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
			return pyc_raise(CACHEW_EINTERNAL, cachew_errmsg());
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
			return pyc_raise(CACHEW_EINTERNAL, cachew_errmsg());
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

PyTypeObject pyc_tensor_type = {
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

