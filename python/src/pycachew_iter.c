/*
 * pycachew_iter.c - cachew.Iterator: runs a pipeline with options given
 * as a dict and yields its elements as tuples of Tensors, or dicts of
 * them when the components are named. The GIL is released around
 * creation (which may connect to a service), waits and destroy; a wait is cut into WAIT_SLICE_MS slices of
 * cachew_iterator_next_timeout with PyErr_CheckSignals in between.
 */
#include "pycachew.h"

/* Slice of a blocking wait between checks for signals. */
#define WAIT_SLICE_MS 50


typedef struct {
	PyObject_HEAD
	cachew_iterator *it;
	bool writable;
	/* A next() is running (GIL-protected flags): another thread's next()
	 * is refused, and a close() only cancels, leaving the destroy to
	 * that next() when it returns (the C iterator is one thread at a
	 * time, and must not be destroyed under a call). */
	bool busy, close_pending;
	/* The dict keys made for the last named element, by position
	 * (component_key). */
	PyObject *keys[CACHEW_MAX_COMPONENTS];
} IteratorObject;


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
		pyc_raise(rv, cachew_options_errmsg(o));
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
		&pyc_dataset_type, &ds, &PyDict_Type, &opts, &writable))
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
	rv = cachew_iterator_create(&self->it, ((pyc_dataset *)ds)->ds, o);
	Py_END_ALLOW_THREADS
	cachew_options_destroy(o);
	if (rv != CACHEW_OK) {
		self->it = NULL;
		Py_DECREF(self);
		return pyc_raise(rv, cachew_errmsg());
	}
	return (PyObject *)self;
}

static void
iterator_close_it(IteratorObject *o)
{
	cachew_iterator *it = o->it;

	if (o->busy) {
		cachew_iterator_cancel(it);
		o->close_pending = true;
		return;
	}
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
	for (size_t i = 0; i < CACHEW_MAX_COMPONENTS; i++)
		Py_CLEAR(o->keys[i]);
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

/* The dict key of component i of e: its name, or its position when it
 * is unnamed. The str made for position i is kept and given again while
 * the elements name that position alike, so a stream of dicts makes no
 * new strings. A new reference; NULL with an exception set. */
static PyObject *
component_key(IteratorObject *o, const cachew_element *e, size_t i)
{
	const char *name = cachew_element_name(e, i);
	PyObject *k;

	if (name == NULL)
		return PyLong_FromSize_t(i);
	if (o->keys[i] != NULL) {
		const char *cached = PyUnicode_AsUTF8(o->keys[i]);
		if (cached != NULL && strcmp(cached, name) == 0)
			return Py_NewRef(o->keys[i]);
		PyErr_Clear(); /* a name kept as surrogates: made anew */
	}
	k = pyc_name(name);
	if (k == NULL)
		return NULL;
	Py_XDECREF(o->keys[i]);
	o->keys[i] = Py_NewRef(k);
	return k;
}

static PyObject *
tensor_of(void *element, size_t i)
{
	return pyc_tensor_new(element, i, false);
}

static PyObject *
writable_tensor_of(void *element, size_t i)
{
	return pyc_tensor_new(element, i, true);
}

/* {name: Tensor} in component order; an unnamed component (enumerate's
 * counter beside named ones, a zip of named and unnamed inputs) is keyed
 * by its position, as component= addresses it. */
static PyObject *
element_dict(IteratorObject *o, cachew_element *e, size_t n)
{
	PyObject *d = PyDict_New();

	for (size_t i = 0; d != NULL && i < n; i++) {
		PyObject *k = component_key(o, e, i);
		PyObject *c = k != NULL ? pyc_tensor_new(e, i, o->writable) : NULL;
		if (c == NULL || PyDict_SetItem(d, k, c) < 0)
			Py_CLEAR(d);
		Py_XDECREF(k);
		Py_XDECREF(c);
	}
	return d;
}

/* An element as Python sees it: a tuple of Tensors, or a dict when any
 * component is named (docs/python.md). Consumes the caller's reference
 * to e; each Tensor takes its own. */
static PyObject *
element_to_python(IteratorObject *o, cachew_element *e)
{
	size_t n;
	bool named = false;
	PyObject *r;

	if (o->writable) {
		cachew_err rv = make_writable(&e);
		if (rv != CACHEW_OK) {
			cachew_element_release(e);
			return pyc_raise(rv, cachew_errmsg());
		}
	}
	n = cachew_element_size(e);
	assert(n <= CACHEW_MAX_COMPONENTS);
	for (size_t i = 0; !named && i < n; i++)
		named = cachew_element_name(e, i) != NULL;
	r = named ? element_dict(o, e, n)
		  : pyc_tuple_of(n, o->writable ? writable_tensor_of : tensor_of, e);
	cachew_element_release(e);
	return r;
}

/* Waits for the next element without the GIL, in slices, checking for
 * signals (whose handlers may run any Python code) in between. */
static cachew_err
wait_next(IteratorObject *o, cachew_element **e)
{
	cachew_iterator *it = o->it;
	cachew_err rv;

	/* CACHEW_OK with no element: the slice ran out. */
	rv = cachew_iterator_next_timeout(it, e, 0);
	while (rv == CACHEW_OK && *e == NULL && !o->close_pending) {
		Py_BEGIN_ALLOW_THREADS
		rv = cachew_iterator_next_timeout(it, e, WAIT_SLICE_MS);
		Py_END_ALLOW_THREADS
		if (rv == CACHEW_OK && *e == NULL && PyErr_CheckSignals() < 0)
			return CACHEW_EINTERNAL; /* the signal's exception is set */
	}
	return rv;
}

/* The next element: what is ready is taken with the GIL held; a wait is
 * done without it (wait_next). */
static PyObject *
iterator_next(IteratorObject *o)
{
	cachew_element *e = NULL;
	cachew_err rv;

	if (o->it == NULL)
		return pyc_raise(CACHEW_ECLOSED, "iterator: closed");
	if (o->busy) {
		PyErr_SetString(PyExc_RuntimeError, "cachew: next() is already "
		    "running on this iterator in another thread");
		return NULL;
	}
	o->busy = true;
	rv = wait_next(o, &e);
	o->busy = false;
	if (o->close_pending) {
		/* close() came from another thread or a signal handler. */
		if (rv == CACHEW_OK)
			cachew_element_release(e); /* NULL: a no-op */
		o->close_pending = false;
		iterator_close_it(o);
		if (PyErr_Occurred())
			return NULL;
		return pyc_raise(CACHEW_ECLOSED,
		    "iterator: closed while next() waited");
	}
	if (rv == CACHEW_EINTERNAL && PyErr_Occurred())
		return NULL;
	if (rv == CACHEW_EOF)
		return NULL; /* StopIteration */
	if (rv != CACHEW_OK)
		return pyc_raise(rv, cachew_iterator_errmsg(o->it));
	return element_to_python(o, e);
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
		return pyc_raise(CACHEW_ECLOSED, "iterator: closed");
	(void)cachew_iterator_stats(o->it, rows, 64, &n);
	if (n > 64)
		n = 64;
	l = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; l != NULL && i < n; i++) {
		PyObject *d = Py_BuildValue(
		    "{s:s,s:s,s:i,s:K,s:K,s:K,s:K,s:i,s:L,s:L,s:K,s:K}", "name",
		    rows[i].name, "detail", rows[i].detail, "node", rows[i].node,
		    "elements", (unsigned long long)rows[i].elements, "bytes",
		    (unsigned long long)rows[i].bytes, "busy_ns",
		    (unsigned long long)rows[i].busy_ns, "wait_ns",
		    (unsigned long long)rows[i].wait_ns, "parallelism",
		    rows[i].parallelism, "buffer_limit",
		    (long long)rows[i].buffer_limit, "buffered",
		    (long long)rows[i].buffered, "dropped",
		    (unsigned long long)rows[i].dropped, "cache_hit_bytes",
		    (unsigned long long)rows[i].cache_hit_bytes);
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

PyTypeObject pyc_iterator_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cachew.Iterator",
    .tp_basicsize = sizeof(IteratorObject),
    .tp_dealloc = (destructor)iterator_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Iterator(dataset, options=None, writable=False): runs a "
	      "pipeline and yields its elements as tuples of Tensors, or dicts "
	      "{name: Tensor} when the components are named.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iterator_next,
    .tp_methods = iterator_methods,
    .tp_new = iterator_new,
};

