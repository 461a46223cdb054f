/*
 * transport_base.c - what every transport shares: messages, completion
 * queues and the requests in flight that feed them, and the wrappers that
 * dispatch to a transport's ops. The transports (transports/inproc,
 * transports/nng) build on it; the registry by URL scheme
 * (transports/transport.c) sits above them.
 *
 * Locking: each completion queue has one mutex (cq->mtx) that also guards
 * the state of the pending requests posted to it. inproc calls
 * cwi_pending_complete / _abandon with its own lock released or held
 * (inproc lock -> cq->mtx). The one call out of this file under cq->mtx is
 * a pending's cancel hook (nng: cq->mtx -> connection lock), so the nng
 * transport never completes a request with its connection lock held.
 */
#include "../transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>


void
cwi_transport_opts_init(cwi_transport_opts *opts)
{
	*opts = (cwi_transport_opts){
	    .max_msg_size = CWI_TRANSPORT_MAX_MSG_DEFAULT,
	    .max_inflight = 4096,
	    .send_timeout_ms = 30000,
	    .reconnect_min_ms = 100,
	    .reconnect_max_ms = 2000,
	    .dial_async = false,
	};
}

cachew_err
cwi_tls_client_auth_parse(
    const char *text, const char *what, cwi_tls_client_auth *out)
{
	if (text == NULL || text[0] == '\0' || strcmp(text, "none") == 0)
		*out = CWI_TLS_CLIENT_AUTH_NONE;
	else if (strcmp(text, "optional") == 0)
		*out = CWI_TLS_CLIENT_AUTH_OPTIONAL;
	else if (strcmp(text, "required") == 0)
		*out = CWI_TLS_CLIENT_AUTH_REQUIRED;
	else
		return cwi_fail(CACHEW_EINVAL, "%s must be none, optional or "
		    "required, not '%s'", what, text);
	return CACHEW_OK;
}

/* ---- messages ----------------------------------------------------------- */

cachew_err
cwi_msg_create(cwi_msg **out)
{
	cwi_msg *m = calloc(1, sizeof(*m));

	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	*out = m;
	return CACHEW_OK;
}

void
cwi_msg_destroy(cwi_msg *m)
{
	if (m == NULL)
		return;
	for (uint32_t i = 0; i < m->n; i++)
		cwi_element_release(m->elems[i]);
	free(m->elems);
	cwi_buffer_unref(m->hdr_buf);
	free(m);
}

void
cwi_msg_set_header_view(
    cwi_msg *m, cwi_buffer *buf, const uint8_t *data, size_t len)
{
	cwi_buffer *old = m->hdr_buf;

	m->hdr_buf = cwi_buffer_ref(buf);
	m->hdr = data;
	m->hdr_len = len;
	cwi_buffer_unref(old);
}

cachew_err
cwi_msg_set_header(cwi_msg *m, const void *data, size_t len)
{
	cwi_buffer *buf;
	cachew_err rv;

	if (len == 0) {
		cwi_buffer_unref(m->hdr_buf);
		m->hdr_buf = NULL;
		m->hdr = NULL;
		m->hdr_len = 0;
		return CACHEW_OK;
	}
	rv = cwi_buffer_alloc(&buf, len, false);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(buf->data, data, len);
	cwi_msg_set_header_view(m, buf, buf->data, len);
	cwi_buffer_unref(buf);
	return CACHEW_OK;
}

static void
free_heap(void *ctx, void *data)
{
	(void)ctx;
	free(data);
}

cachew_err
cwi_msg_set_header_strbuf(cwi_msg *m, cwi_strbuf *sb)
{
	cwi_buffer *buf;
	cachew_err rv;

	if (sb->oom)
		return cwi_fail(CACHEW_ENOMEM, "message header: out of memory");
	if (sb->len == 0) {
		cwi_strbuf_free(sb);
		return cwi_msg_set_header(m, NULL, 0);
	}
	rv = cwi_buffer_wrap(&buf, sb->data, sb->len, free_heap, NULL);
	if (rv != CACHEW_OK)
		return rv;
	cwi_msg_set_header_view(m, buf, buf->data, sb->len);
	cwi_buffer_unref(buf);
	cwi_strbuf_init(sb);
	return CACHEW_OK;
}

const uint8_t *
cwi_msg_header(const cwi_msg *m, size_t *len)
{
	*len = m->hdr_len;
	return m->hdr;
}

cachew_err
cwi_msg_push(cwi_msg *m, cwi_element *e)
{
	if (m->n == m->cap) {
		uint32_t cap = m->cap != 0 ? m->cap * 2 : 8;
		cwi_element **v;

		if (m->n >= CWI_MSG_MAX_ELEMENTS)
			return cwi_fail(CACHEW_ERANGE,
			    "message: more than %u elements",
			    CWI_MSG_MAX_ELEMENTS);
		if (cap > CWI_MSG_MAX_ELEMENTS)
			cap = CWI_MSG_MAX_ELEMENTS;
		v = realloc(m->elems, cap * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		m->elems = v;
		m->cap = cap;
	}
	m->elems[m->n++] = e;
	return CACHEW_OK;
}

size_t
cwi_msg_count(const cwi_msg *m)
{
	return m->n;
}

cwi_element *
cwi_msg_element(const cwi_msg *m, size_t i)
{
	return i < m->n ? m->elems[i] : NULL;
}

cwi_element *
cwi_msg_take(cwi_msg *m, size_t i)
{
	cwi_element *e;

	if (i >= m->n)
		return NULL;
	e = m->elems[i];
	m->elems[i] = NULL;
	return e;
}

size_t
cwi_msg_size(const cwi_msg *m)
{
	size_t n = m->hdr_len;

	for (uint32_t i = 0; i < m->n; i++)
		if (m->elems[i] != NULL)
			n += cwi_element_nbytes(m->elems[i]);
	return n;
}

/* ---- completion queues and pending requests ----------------------------- */

typedef enum pending_state {
	P_INFLIGHT, /* on cq->inflight, the transport may complete it */
	P_DONE,     /* on cq->done, waiting to be collected */
	P_GONE      /* collected or its queue destroyed */
} pending_state;

struct cwi_pending {
	cwi_pending *prev, *next; /* on cq->inflight or cq->done */
	cwi_cq *cq;
	uint64_t tag;
	uint64_t deadline_ns; /* 0: none */
	int timeout_ms;
	pending_state state;
	/* Under cq->mtx: the collecting side's reference (dropped when
	 * collected or the queue is destroyed) and the transport's (dropped
	 * when it completes or abandons). */
	unsigned refs;
	cachew_err err;
	cwi_msg *reply;
	char *errmsg;
	void (*cancel)(void *arg, cwi_pending *p);
	void *cancel_arg;
};

typedef struct pending_list {
	cwi_pending *head, *tail;
} pending_list;

struct cwi_cq {
	pthread_mutex_t mtx;
	pthread_cond_t cv; /* CLOCK_MONOTONIC */
	unsigned refs;     /* the owner's + one per live pending */
	bool closed, destroyed;
	bool woken; /* cwi_cq_wake: the next wait returns at once */
	pending_list inflight, done;
	size_t outstanding;
};

static void
list_push(pending_list *l, cwi_pending *p)
{
	p->next = NULL;
	p->prev = l->tail;
	if (l->tail != NULL)
		l->tail->next = p;
	else
		l->head = p;
	l->tail = p;
}

static void
list_remove(pending_list *l, cwi_pending *p)
{
	if (p->prev != NULL)
		p->prev->next = p->next;
	else
		l->head = p->next;
	if (p->next != NULL)
		p->next->prev = p->prev;
	else
		l->tail = p->prev;
	p->prev = p->next = NULL;
}

cachew_err
cwi_cq_create(cwi_cq **out)
{
	pthread_condattr_t ca;
	cwi_cq *q = calloc(1, sizeof(*q));

	if (q == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&q->mtx, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&q->cv, &ca);
	pthread_condattr_destroy(&ca);
	q->refs = 1;
	*out = q;
	return CACHEW_OK;
}

static void
cq_free(cwi_cq *q)
{
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mtx);
	free(q);
}

/* Drops one reference of p under q->mtx. Returns what the caller must
 * free after unlocking: the pending (and its leftovers) when its last
 * reference went, and whether the queue's last reference went with it. */
static cwi_pending *
pending_unref_locked(cwi_pending *p, bool *free_cq)
{
	cwi_cq *q = p->cq;

	*free_cq = false;
	if (--p->refs > 0)
		return NULL;
	*free_cq = --q->refs == 0;
	return p;
}

static void
pending_free(cwi_pending *p)
{
	cwi_msg_destroy(p->reply);
	free(p->errmsg);
	free(p);
}

/* Ends a pending's life outside the lock (see pending_unref_locked). */
static void
pending_release(cwi_pending *dead, cwi_cq *q, bool free_cq)
{
	if (dead != NULL)
		pending_free(dead);
	if (free_cq)
		cq_free(q);
}

static cachew_err
pending_create(cwi_pending **out, cwi_cq *q, uint64_t tag, int timeout_ms)
{
	cwi_pending *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	p->cq = q;
	p->tag = tag;
	p->timeout_ms = timeout_ms;
	p->deadline_ns = timeout_ms >= 0
	    ? cwi_now_ns() + (uint64_t)timeout_ms * 1000000u
	    : 0;
	p->refs = 2;
	p->state = P_INFLIGHT;
	pthread_mutex_lock(&q->mtx);
	if (q->closed) {
		pthread_mutex_unlock(&q->mtx);
		free(p);
		return cwi_fail(CACHEW_ECLOSED, "completion queue is closed");
	}
	q->refs++;
	q->outstanding++;
	list_push(&q->inflight, p);
	pthread_mutex_unlock(&q->mtx);
	*out = p;
	return CACHEW_OK;
}

/* The transport refused the request: undo pending_create. */
static void
pending_cancel(cwi_pending *p)
{
	cwi_cq *q = p->cq;
	bool free_cq;

	pthread_mutex_lock(&q->mtx);
	if (p->state == P_INFLIGHT) {
		list_remove(&q->inflight, p);
		q->outstanding--;
	}
	/* Both references: nobody else has seen p. */
	p->refs = 1;
	p = pending_unref_locked(p, &free_cq);
	pthread_mutex_unlock(&q->mtx);
	pending_release(p, q, free_cq);
}

uint64_t
cwi_pending_deadline(const cwi_pending *p)
{
	return p->deadline_ns;
}

void
cwi_pending_set_cancel(
    cwi_pending *p, void (*cancel)(void *arg, cwi_pending *p), void *arg)
{
	cwi_cq *q = p->cq;

	pthread_mutex_lock(&q->mtx);
	p->cancel = cancel;
	p->cancel_arg = arg;
	pthread_mutex_unlock(&q->mtx);
}

/* The request is finished for its waiter while its transport still holds
 * it: let the transport stop what it has in flight. Under q->mtx; the
 * transport's reference keeps p (and, by the transport's contract, its
 * connection) alive. */
static void
pending_cancel_hook_locked(cwi_pending *p)
{
	void (*fn)(void *, cwi_pending *) = p->cancel;

	p->cancel = NULL;
	if (fn != NULL && p->refs == 2)
		fn(p->cancel_arg, p);
}

void
cwi_pending_complete(
    cwi_pending *p, cachew_err err, cwi_msg *reply, const char *errmsg)
{
	cwi_cq *q = p->cq;
	char *msg = NULL;
	cwi_msg *drop = NULL;
	cwi_pending *dead;
	bool free_cq;

	if (err != CACHEW_OK)
		msg = cwi_strdup(
		    errmsg != NULL ? errmsg : cachew_strerror(err));
	pthread_mutex_lock(&q->mtx);
	if (p->state == P_INFLIGHT && !q->closed) {
		list_remove(&q->inflight, p);
		p->state = P_DONE;
		p->err = err;
		p->reply = err == CACHEW_OK ? reply : NULL;
		p->errmsg = msg;
		msg = NULL;
		list_push(&q->done, p);
		pthread_cond_signal(&q->cv);
	} else {
		/* Timed out or nobody listens any more. */
		drop = reply;
	}
	dead = pending_unref_locked(p, &free_cq);
	pthread_mutex_unlock(&q->mtx);
	free(msg);
	cwi_msg_destroy(drop);
	pending_release(dead, q, free_cq);
}

void
cwi_pending_abandon(cwi_pending *p)
{
	cwi_cq *q = p->cq;
	cwi_pending *dead;
	bool free_cq;

	pthread_mutex_lock(&q->mtx);
	dead = pending_unref_locked(p, &free_cq);
	pthread_mutex_unlock(&q->mtx);
	pending_release(dead, q, free_cq);
}

/* Moves every request whose deadline passed to the done list with
 * CACHEW_ETIMEDOUT; returns the earliest deadline still ahead (0: none). */
static uint64_t
cq_expire_locked(cwi_cq *q, uint64_t now)
{
	uint64_t next = 0;
	cwi_pending *p = q->inflight.head, *nx;

	for (; p != NULL; p = nx) {
		nx = p->next;
		if (p->deadline_ns == 0)
			continue;
		if (p->deadline_ns <= now) {
			list_remove(&q->inflight, p);
			p->state = P_DONE;
			p->err = CACHEW_ETIMEDOUT;
			p->errmsg = cwi_asprintf(
			    "no reply within %d ms", p->timeout_ms);
			list_push(&q->done, p);
			pending_cancel_hook_locked(p);
		} else if (next == 0 || p->deadline_ns < next) {
			next = p->deadline_ns;
		}
	}
	return next;
}

static void
cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mtx, uint64_t when_ns)
{
	struct timespec ts;

	if (when_ns == 0) {
		pthread_cond_wait(cv, mtx);
		return;
	}
	ts.tv_sec = (time_t)(when_ns / 1000000000u);
	ts.tv_nsec = (long)(when_ns % 1000000000u);
	pthread_cond_timedwait(cv, mtx, &ts);
}

cachew_err
cwi_cq_wait(cwi_cq *q, int timeout_ms, cwi_completion *out)
{
	uint64_t until = timeout_ms >= 0
	    ? cwi_now_ns() + (uint64_t)timeout_ms * 1000000u
	    : 0;
	cwi_pending *p, *dead;
	bool free_cq;
	char *msg;

	pthread_mutex_lock(&q->mtx);
	for (;;) {
		uint64_t now, next, wake;

		if (q->closed) {
			pthread_mutex_unlock(&q->mtx);
			return cwi_fail(CACHEW_ECLOSED, "completion queue is "
							"closed");
		}
		if ((p = q->done.head) != NULL)
			break;
		if (q->woken) {
			q->woken = false;
			pthread_mutex_unlock(&q->mtx);
			return cwi_fail(CACHEW_ETIMEDOUT, "woken");
		}
		now = cwi_now_ns();
		next = cq_expire_locked(q, now);
		if (q->done.head != NULL)
			continue;
		if (until != 0 && now >= until) {
			pthread_mutex_unlock(&q->mtx);
			return cwi_fail(CACHEW_ETIMEDOUT,
			    "no completion within %d ms", timeout_ms);
		}
		wake = until;
		if (next != 0 && (wake == 0 || next < wake))
			wake = next;
		cond_wait_until(&q->cv, &q->mtx, wake);
	}
	list_remove(&q->done, p);
	p->state = P_GONE;
	q->outstanding--;
	out->tag = p->tag;
	out->err = p->err;
	out->reply = p->reply;
	p->reply = NULL;
	msg = p->errmsg;
	p->errmsg = NULL;
	dead = pending_unref_locked(p, &free_cq);
	pthread_mutex_unlock(&q->mtx);
	if (out->err != CACHEW_OK)
		cwi_fail(out->err, "%s", msg != NULL ? msg : "out of memory");
	free(msg);
	pending_release(dead, q, free_cq);
	return CACHEW_OK;
}

size_t
cwi_cq_outstanding(cwi_cq *q)
{
	size_t n;

	pthread_mutex_lock(&q->mtx);
	n = q->outstanding;
	pthread_mutex_unlock(&q->mtx);
	return n;
}

void
cwi_cq_wake(cwi_cq *q)
{
	pthread_mutex_lock(&q->mtx);
	q->woken = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mtx);
}

void
cwi_cq_close(cwi_cq *q)
{
	pthread_mutex_lock(&q->mtx);
	q->closed = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mtx);
}

void
cwi_cq_destroy(cwi_cq *q)
{
	cwi_pending *p, *nx, *dead_list = NULL;
	bool free_cq;

	if (q == NULL)
		return;
	pthread_mutex_lock(&q->mtx);
	q->closed = q->destroyed = true;
	/* Drop the collecting side's reference of everything: finished ones
	 * die now, those in flight when their transport lets go. */
	for (p = q->done.head; p != NULL; p = nx) {
		nx = p->next;
		list_remove(&q->done, p);
		p->state = P_GONE;
		if (pending_unref_locked(p, &free_cq) != NULL) {
			p->next = dead_list;
			dead_list = p;
		}
	}
	for (p = q->inflight.head; p != NULL; p = nx) {
		nx = p->next;
		list_remove(&q->inflight, p);
		p->state = P_GONE;
		pending_cancel_hook_locked(p);
		if (pending_unref_locked(p, &free_cq) != NULL) {
			p->next = dead_list;
			dead_list = p;
		}
	}
	q->outstanding = 0;
	free_cq = --q->refs == 0;
	pthread_mutex_unlock(&q->mtx);
	for (p = dead_list; p != NULL; p = nx) {
		nx = p->next;
		pending_free(p);
	}
	if (free_cq)
		cq_free(q);
}

/* ---- connections -------------------------------------------------------- */


cachew_err
cwi_conn_send(
    cwi_conn *c, cwi_msg *req, int timeout_ms, cwi_cq *cq, uint64_t tag)
{
	cwi_pending *p = NULL;
	cachew_err rv = pending_create(&p, cq, tag, timeout_ms);

	if (rv != CACHEW_OK)
		return rv;
	rv = c->ops->send(c, req, p);
	if (rv != CACHEW_OK)
		pending_cancel(p);
	return rv;
}

cachew_err
cwi_conn_call(cwi_conn *c, cwi_msg *req, int timeout_ms, cwi_msg **reply)
{
	cwi_completion comp;
	cwi_cq *q;
	cachew_err rv;

	*reply = NULL;
	rv = cwi_cq_create(&q);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(req);
		return rv;
	}
	rv = cwi_conn_send(c, req, timeout_ms, q, 0);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(req);
		cwi_cq_destroy(q);
		return rv;
	}
	/* The request's own deadline bounds this wait. */
	rv = cwi_cq_wait(q, -1, &comp);
	cwi_cq_destroy(q);
	if (rv != CACHEW_OK)
		return rv;
	if (comp.err != CACHEW_OK)
		return comp.err;
	*reply = comp.reply;
	return CACHEW_OK;
}

const char *
cwi_conn_url(const cwi_conn *c)
{
	return c->url;
}

bool
cwi_conn_unreachable(cwi_conn *c)
{
	return c->ops->unreachable != NULL && c->ops->unreachable(c);
}

void
cwi_conn_close(cwi_conn *c)
{
	c->ops->close(c);
}

void
cwi_conn_destroy(cwi_conn *c)
{
	if (c == NULL)
		return;
	c->ops->close(c);
	c->ops->free(c);
}

/* ---- listeners and requests --------------------------------------------- */


const char *
cwi_listener_url(const cwi_listener *l)
{
	return l->url;
}

void
cwi_listener_close(cwi_listener *l)
{
	l->ops->close(l);
}

void
cwi_listener_destroy(cwi_listener *l)
{
	if (l == NULL)
		return;
	l->ops->close(l);
	l->ops->free(l);
}

cwi_msg *
cwi_request_msg(cwi_request *r)
{
	return r->msg;
}

const char *
cwi_request_peer(cwi_request *r)
{
	return r->ops->peer(r);
}

cachew_err
cwi_request_reply(cwi_request *r, cwi_msg *reply)
{
	return r->ops->reply(r, reply);
}

cachew_err
cwi_request_fail(cwi_request *r, cachew_err err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (err == CACHEW_OK)
		err = CACHEW_EINTERNAL;
	return r->ops->fail(r, err, msg);
}

void
cwi_request_drop(cwi_request *r)
{
	r->ops->drop(r);
}

void
cwi_request_reject(cwi_request *r, const char *reason)
{
	r->ops->reject(r, reason);
}
