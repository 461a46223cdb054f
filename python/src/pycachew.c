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
 * An element is a tuple of Tensors, or a dict when its components are
 * named (element_to_python, pycachew_iter.c).
 */
#include "pycachew.h"
#include <dlfcn.h>

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
PyObject *
pyc_raise(cachew_err code, const char *msg)
{
	PyObject *type = (unsigned)code < sizeof(code_exc) / sizeof(code_exc[0]) &&
		code_exc[code] != NULL ? code_exc[code] : Error;
	PyObject *val;

	if (msg == NULL || msg[0] == '\0')
		msg = cachew_strerror(code);
	/* A message may quote bytes that are not UTF-8 (a file name): kept
	 * as surrogates, as str(ds) keeps them, not a UnicodeDecodeError in
	 * place of the library's error. */
	PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg),
	    "surrogateescape");
	if (text == NULL)
		return NULL;
	val = PyObject_CallOneArg(type, text);
	Py_DECREF(text);
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

/* A component's name as a str: UTF-8, bytes that are not kept as
 * surrogates (as str(ds) keeps them), interned, since the same few names
 * key every element's dict and the user's lookups of them. */
PyObject *
pyc_name(const char *name)
{
	PyObject *s = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name),
	    "surrogateescape");

	if (s != NULL)
		PyUnicode_InternInPlace(&s);
	return s;
}

PyObject *
pyc_tuple_of(size_t n, PyObject *(*item)(void *ctx, size_t i),
    void *ctx)
{
	PyObject *t = PyTuple_New((Py_ssize_t)n);

	for (size_t i = 0; t != NULL && i < n; i++) {
		PyObject *v = item(ctx, i);
		if (v == NULL) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, (Py_ssize_t)i, v);
	}
	return t;
}

/* ---- Dataset ------------------------------------------------------------------ */


static PyObject *
dataset_wrap(cachew_dataset *ds)
{
	pyc_dataset *o = PyObject_New(pyc_dataset, &pyc_dataset_type);

	if (o == NULL) {
		cachew_dataset_release(ds);
		return NULL;
	}
	o->ds = ds;
	return (PyObject *)o;
}

static void
dataset_dealloc(pyc_dataset *o)
{
	cachew_dataset_release(o->ds);
	PyObject_Free(o);
}

static PyObject *
dataset_to_string(pyc_dataset *o, PyObject *unused)
{
	char *s = NULL;
	cachew_err rv;
	PyObject *r;

	(void)unused;
	rv = cachew_dataset_to_string(o->ds, &s);
	if (rv != CACHEW_OK)
		return pyc_raise(rv, cachew_errmsg());
	r = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
	cachew_free(s);
	return r;
}

static PyObject *
dataset_fingerprint(pyc_dataset *o, PyObject *unused)
{
	cachew_fingerprint fp;
	char hex[33];
	cachew_err rv;

	(void)unused;
	rv = cachew_dataset_fingerprint(o->ds, &fp);
	if (rv != CACHEW_OK)
		return pyc_raise(rv, cachew_errmsg());
	cachew_fingerprint_hex(&fp, hex);
	return PyUnicode_FromString(hex);
}

static PyObject *
dataset_get_op(pyc_dataset *o, void *closure)
{
	(void)closure;
	return PyUnicode_FromString(cachew_dataset_op(o->ds));
}

static PyObject *
dataset_input(void *ds, size_t i)
{
	return dataset_wrap(cachew_dataset_retain(cachew_dataset_input(ds, i)));
}

static PyObject *
dataset_get_inputs(pyc_dataset *o, void *closure)
{
	(void)closure;
	return pyc_tuple_of(cachew_dataset_num_inputs(o->ds), dataset_input, o->ds);
}

static PyObject *
dataset_cardinality(pyc_dataset *o, PyObject *unused)
{
	(void)unused;
	return PyLong_FromLongLong((long long)cachew_dataset_cardinality(o->ds));
}

/* A spec's shape: a tuple with None for a dimension not known (-1), or
 * None when the rank is not (-1). */
static PyObject *
shape_to_python(int rank, const int64_t *dims)
{
	PyObject *shape;

	if (rank < 0)
		Py_RETURN_NONE;
	shape = PyTuple_New(rank);
	for (int k = 0; shape != NULL && k < rank; k++) {
		PyObject *d = dims[k] < 0 ? Py_NewRef(Py_None)
					  : PyLong_FromLongLong((long long)dims[k]);
		if (d == NULL) {
			Py_CLEAR(shape);
			break;
		}
		PyTuple_SET_ITEM(shape, k, d);
	}
	return shape;
}

/* One component of the spec: (dtype, shape, name), None for what is not
 * known (a dtype, a rank; a dimension is None in shape), name None when
 * unnamed. */
static PyObject *
component_spec(void *dataset, size_t i)
{
	const cachew_dataset *ds = dataset;
	int64_t dims[CACHEW_MAX_RANK];
	const char *name = NULL;
	cachew_dtype dtype;
	PyObject *shape, *key, *r;
	int rank;
	cachew_err rv;

	rv = cachew_dataset_component(ds, i, &dtype, &rank, dims, &name);
	if (rv != CACHEW_OK)
		return pyc_raise(rv, cachew_errmsg());
	shape = shape_to_python(rank, dims);
	if (shape == NULL)
		return NULL;
	key = name != NULL ? pyc_name(name) : Py_NewRef(Py_None);
	if (key == NULL) {
		Py_DECREF(shape);
		return NULL;
	}
	r = Py_BuildValue("(zOO)", dtype == CACHEW_INVALID ? NULL
	    : cachew_dtype_name(dtype), shape, key);
	Py_DECREF(shape);
	Py_DECREF(key);
	return r;
}

/* The element spec: a tuple of (dtype, shape, name) per component, or
 * None when it is not known (downstream of a function registered from C
 * or a plugin: cachew_dataset_num_components is 0). */
static PyObject *
dataset_spec(pyc_dataset *o, PyObject *unused)
{
	size_t n = cachew_dataset_num_components(o->ds);

	(void)unused;
	if (n == 0)
		Py_RETURN_NONE;
	return pyc_tuple_of(n, component_spec, o->ds);
}

static PyMethodDef dataset_methods[] = {
    {"cardinality", (PyCFunction)dataset_cardinality, METH_NOARGS,
	"Elements per epoch, -1 (infinite) or -2 (unknown)."},
    {"spec", (PyCFunction)dataset_spec, METH_NOARGS,
	"The element spec: a tuple of (dtype, shape, name) per component "
	"(None for what is not known), or None when not known."},
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

PyTypeObject pyc_dataset_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cachew._cachew.Dataset",
    .tp_basicsize = sizeof(pyc_dataset),
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
		return pyc_raise(rv, cachew_errmsg());
	return dataset_wrap(ds);
}

/* A plugin calls the library's functions as the host process's: Python
 * opened this module RTLD_LOCAL, so its cachew_* symbols (the library is
 * linked in, and exports them) go global before the first plugin. */
static bool
symbols_global(void)
{
	static bool done;
	Dl_info info;
	void *h;

	if (done)
		return true;
	if (dladdr((void *)symbols_global, &info) == 0 ||
	    info.dli_fname == NULL)
		return false;
	h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
	if (h == NULL)
		return false;
	done = true; /* the reference stays: the module is never unloaded */
	return true;
}

/* Loads a plugin (cachew_plugin_load): its operators are then reachable as
 * builders and in pipeline strings, as the C library's. */
static PyObject *
mod_load_plugin(PyObject *self, PyObject *arg)
{
	PyObject *path = NULL;
	cachew_err rv;

	(void)self;
	if (!symbols_global()) {
		PyErr_Format(PyExc_ImportError, "cachew: cannot make the "
		    "library's symbols visible to plugins: %s", dlerror());
		return NULL;
	}
	if (!PyUnicode_FSConverter(arg, &path))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rv = cachew_plugin_load(PyBytes_AS_STRING(path));
	Py_END_ALLOW_THREADS
	Py_DECREF(path);
	if (rv != CACHEW_OK)
		return pyc_raise(rv, cachew_errmsg());
	Py_RETURN_NONE;
}

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
    {"load_plugin", mod_load_plugin, METH_O,
	"load_plugin(path): loads a plugin's operators (cachew_plugin_load)."},
    {"version", mod_version, METH_NOARGS,
	"The version of the linked libcachew."},
    {"options", mod_options, METH_NOARGS,
	"The iterator options: (name, type, default, help) tuples."},
    {"log_enable", pyc_log_enable, METH_O,
	"log_enable(level): the library's log lines up to level (0 errors .. "
	"3 debug) go to a ring that log_wait reads; -1 stops them."},
    {"log_wait", pyc_log_wait, METH_O,
	"log_wait(timeout_ms) -> (dropped, [(level, module, msg)...])."},
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

	if (PyType_Ready(&pyc_dataset_type) < 0 || PyType_Ready(&pyc_tensor_type) < 0 ||
	    PyType_Ready(&pyc_iterator_type) < 0)
		return NULL;
	m = PyModule_Create(&module_def);
	if (m == NULL)
		return NULL;
	if (add_exceptions(m) < 0 ||
	    PyModule_AddObjectRef(m, "Dataset", (PyObject *)&pyc_dataset_type) < 0 ||
	    PyModule_AddObjectRef(m, "Tensor", (PyObject *)&pyc_tensor_type) < 0 ||
	    PyModule_AddObjectRef(m, "Iterator", (PyObject *)&pyc_iterator_type) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
