/*
 * pycachew_log.c - the bridge from the library's log (cachew_log_set) to
 * Python's logging. The library calls its sink on any of its threads,
 * some of which hold its locks, so the sink never takes the GIL (a thread
 * holding the GIL may be waiting for one of those locks: destroy joins
 * threads): it only copies the line into a bounded ring. A Python thread
 * (cachew.enable_logging starts it) waits on the ring without the GIL
 * (log_wait) and hands the lines to logging. When the ring is full the
 * oldest line is dropped and counted; the next batch reports how many.
 *
 * Locking: ring_lock guards the ring; it is a leaf.
 */
#include "pycachew.h"

#include <pthread.h>
#include <time.h>

#define RING_LINES 1024
#define LINE_BYTES 512

typedef struct log_line {
	int level;
	char module[24];
	char msg[LINE_BYTES];
} log_line;

static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_cond = PTHREAD_COND_INITIALIZER;
static log_line ring[RING_LINES];
static size_t ring_head, ring_count;
static uint64_t ring_dropped;

static void
ring_sink(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	log_line *l;

	(void)ctx;
	pthread_mutex_lock(&ring_lock);
	if (ring_count == RING_LINES) {
		ring_head = (ring_head + 1) % RING_LINES;
		ring_count--;
		ring_dropped++;
	}
	l = &ring[(ring_head + ring_count) % RING_LINES];
	l->level = (int)level;
	snprintf(l->module, sizeof(l->module), "%s", module);
	snprintf(l->msg, sizeof(l->msg), "%s", msg);
	ring_count++;
	pthread_cond_signal(&ring_cond);
	pthread_mutex_unlock(&ring_lock);
}

/* log_enable(level): installs the ring as the library's sink for levels
 * 0 (errors) to level (3: debug); -1 removes it. */
PyObject *
pyc_log_enable(PyObject *self, PyObject *arg)
{
	long level = PyLong_AsLong(arg);

	(void)self;
	if (level == -1 && PyErr_Occurred())
		return NULL;
	if (level < -1 || level > CACHEW_LOG_DEBUG) {
		PyErr_Format(PyExc_ValueError, "cachew: log level %ld is not "
		    "in [-1, 3]", level);
		return NULL;
	}
	if (level < 0)
		cachew_log_set(NULL, NULL, CACHEW_LOG_ERROR);
	else
		cachew_log_set(ring_sink, NULL, (cachew_log_level)level);
	Py_RETURN_NONE;
}

/* Takes every line in the ring, under ring_lock, into out (room for
 * RING_LINES); returns how many and the drop count since the last take. */
static size_t
ring_take(log_line *out, uint64_t *dropped)
{
	size_t n = ring_count;

	for (size_t i = 0; i < n; i++)
		out[i] = ring[(ring_head + i) % RING_LINES];
	ring_head = (ring_head + n) % RING_LINES;
	ring_count = 0;
	*dropped = ring_dropped;
	ring_dropped = 0;
	return n;
}

/* log_wait(timeout_ms) -> (dropped, [(level, module, msg)...]): waits
 * without the GIL until lines come or the time passes. */
PyObject *
pyc_log_wait(PyObject *self, PyObject *arg)
{
	long ms = PyLong_AsLong(arg);
	static log_line batch[RING_LINES]; /* one waiter: the bridge thread */
	uint64_t dropped = 0;
	struct timespec ts;
	PyObject *list;
	size_t n;

	(void)self;
	if (ms == -1 && PyErr_Occurred())
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&ring_lock);
	while (ring_count == 0 && ring_dropped == 0 &&
	    pthread_cond_timedwait(&ring_cond, &ring_lock, &ts) == 0) {
	}
	n = ring_take(batch, &dropped);
	pthread_mutex_unlock(&ring_lock);
	Py_END_ALLOW_THREADS
	list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list != NULL && i < n; i++) {
		/* A line may quote bytes that are not UTF-8 (a file name),
		 * or end inside a character the ring cut: shown escaped, not
		 * a UnicodeDecodeError that would end the log bridge. */
		PyObject *t = Py_BuildValue("(iNN)", batch[i].level,
		    PyUnicode_DecodeUTF8(batch[i].module,
			(Py_ssize_t)strlen(batch[i].module), "backslashreplace"),
		    PyUnicode_DecodeUTF8(batch[i].msg,
			(Py_ssize_t)strlen(batch[i].msg), "backslashreplace"));
		if (t == NULL) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, t);
	}
	if (list == NULL)
		return NULL;
	return Py_BuildValue("(KN)", (unsigned long long)dropped, list);
}
