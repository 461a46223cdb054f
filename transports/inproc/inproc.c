/*
 * inproc.c - the in-process transport: inproc://name.
 *
 * A request is handed to the listener's handler on the sending thread and
 * a reply goes straight into the client's completion queue: a round trip
 * costs no thread wake-up, no copy and no serialization (the cwi_msg and
 * its element pointers move). This is the transport of the embedded mode,
 * which must stay as fast as the plain executor.
 *
 * Semantics match the nng transport: per-request timeouts (enforced by
 * the completion queue), the receiver's size limit (header plus element
 * byte sizes), resets that complete requests in flight with
 * CACHEW_ECLOSED, and connections that find a listener of the same name
 * again after theirs closed, as an nng dialer reconnects.
 *
 * Process-wide state: the name table of listeners. It is the one mutable
 * global of the transports, as in nng's own inproc transport; names are
 * claimed by cwi_listen and released by close.
 *
 * Locking: one mutex, `lock`, guards the name table and every listener,
 * connection and request of this transport; then cq->mtx (transport.c).
 * Handlers run with no lock held. The critical sections are a few list
 * operations, so one lock costs less than the lock order of three.
 */
#include "../transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct ip_listener ip_listener;
typedef struct ip_conn ip_conn;
typedef struct ip_req ip_req;

struct ip_listener {
	cwi_listener base;
	char *name;    /* after "inproc://" */
	size_t max_msg;
	bool closed;
	unsigned active; /* handler calls running */
	ip_conn *conns;  /* bound connections (ip_conn.lnext) */
	ip_listener *next;
};

struct ip_conn {
	cwi_conn base;
	char *name;
	size_t max_msg; /* the client's receive limit, for replies */
	bool closed;
	unsigned refs;    /* the owner's + one per request held by a server */
	ip_listener *l;   /* bound listener or NULL */
	ip_conn *lnext;   /* on l->conns */
	ip_conn **lprevp; /* what points to it there: unbinding is O(1)
			   * (2,000 embedded iterators took 1.6 s to close
			   * their connections one list walk each) */
	ip_req *inflight; /* requests not answered yet (ip_req.next) */
};

struct ip_req {
	cwi_request base;
	ip_conn *conn;
	cwi_pending *p; /* NULL once the connection reset or closed */
	ip_req *prev, *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle_cv = PTHREAD_COND_INITIALIZER;
static ip_listener *names;
/* The listener whose handler this thread runs (close from a handler must
 * not wait for itself). */
static _Thread_local ip_listener *in_handler;

#define SCHEME "inproc://"

/* fork(): the registry lock is held across it, so that a child never
 * inherits it locked by a thread it does not have. The child keeps the
 * parent's listeners listed but never reaches them: their threads are
 * gone, and the embedded service names its own with the child's pid. */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void
fork_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void
fork_release(void)
{
	pthread_mutex_unlock(&lock);
}

static void
fork_register(void)
{
	(void)pthread_atfork(fork_prepare, fork_release, fork_release);
}

void
cwi_inproc_fork_init(void)
{
	pthread_once(&fork_once, fork_register);
}

static const char *
url_name(const char *url)
{
	return url + strlen(SCHEME);
}

static ip_listener *
names_find_locked(const char *name)
{
	for (ip_listener *l = names; l != NULL; l = l->next)
		if (strcmp(l->name, name) == 0)
			return l;
	return NULL;
}

/* nng cannot frame a message with an element taken out of it; neither
 * does inproc, so that code behaves the same on both. */
static cachew_err
msg_check(const cwi_msg *m, const char *what)
{
	for (uint32_t i = 0; i < m->n; i++)
		if (m->elems[i] == NULL)
			return cwi_fail(CACHEW_EINVAL,
			    "%s: message element %u was taken", what, i);
	return CACHEW_OK;
}

/* ---- requests in flight ------------------------------------------------- */

static void
req_link_locked(ip_conn *c, ip_req *r)
{
	r->prev = NULL;
	r->next = c->inflight;
	if (c->inflight != NULL)
		c->inflight->prev = r;
	c->inflight = r;
}

static void
req_unlink_locked(ip_conn *c, ip_req *r)
{
	if (r->prev != NULL)
		r->prev->next = r->next;
	else
		c->inflight = r->next;
	if (r->next != NULL)
		r->next->prev = r->prev;
	r->prev = r->next = NULL;
}

/* A list of pendings to complete once the lock is released. */
typedef struct pend_batch {
	cwi_pending **v;
	size_t n;
} pend_batch;

/* Detaches every request in flight on c: their server-side requests stay
 * valid but answer CACHEW_ECLOSED; their pendings go into *out (an array
 * to complete after unlocking; on ENOMEM they are completed here, under
 * the lock, which transport.c allows). */
static void
conn_reset_locked(ip_conn *c, pend_batch *out, const char *why)
{
	size_t n = 0;
	ip_req *r;

	out->v = NULL;
	out->n = 0;
	for (r = c->inflight; r != NULL; r = r->next)
		n++;
	if (n == 0)
		return;
	out->v = malloc(n * sizeof(*out->v));
	while ((r = c->inflight) != NULL) {
		req_unlink_locked(c, r);
		if (out->v != NULL)
			out->v[out->n++] = r->p;
		else
			cwi_pending_complete(r->p, CACHEW_ECLOSED, NULL, why);
		r->p = NULL;
	}
}

static void
batch_complete(pend_batch *b, const char *why)
{
	for (size_t i = 0; i < b->n; i++)
		cwi_pending_complete(b->v[i], CACHEW_ECLOSED, NULL, why);
	free(b->v);
}

static void
conn_bind_locked(ip_conn *c, ip_listener *l)
{
	c->l = l;
	c->lnext = l->conns;
	c->lprevp = &l->conns;
	if (l->conns != NULL)
		l->conns->lprevp = &c->lnext;
	l->conns = c;
}

static void
conn_unbind_locked(ip_conn *c)
{
	ip_listener *l = c->l;

	if (l == NULL)
		return;
	*c->lprevp = c->lnext;
	if (c->lnext != NULL)
		c->lnext->lprevp = c->lprevp;
	c->lnext = NULL;
	c->lprevp = NULL;
	c->l = NULL;
}

static void
conn_free(ip_conn *c)
{
	free(c->name);
	free(c->base.url);
	free(c);
}

/* Drops a server request's hold on its connection (under the lock);
 * returns the connection if the caller must free it after unlocking. */
static ip_conn *
conn_unref_locked(ip_conn *c)
{
	return --c->refs == 0 ? c : NULL;
}

/* Ends a server-side request: unlinks it and returns its pending (NULL
 * if the connection already reset). Frees r; *dead is a connection to
 * free after unlocking. */
static cwi_pending *
req_finish_locked(ip_req *r, ip_conn **dead)
{
	cwi_pending *p = r->p;

	if (p != NULL)
		req_unlink_locked(r->conn, r);
	*dead = conn_unref_locked(r->conn);
	return p;
}

static void
req_free(ip_req *r)
{
	cwi_msg_destroy(r->base.msg);
	free(r);
}

static cachew_err ip_fail(cwi_request *rq, cachew_err err, const char *msg);

static cachew_err
ip_reply(cwi_request *rq, cwi_msg *reply)
{
	ip_req *r = (ip_req *)rq;
	ip_conn *dead = NULL;
	cwi_pending *p;
	pend_batch b = {0};
	size_t size = cwi_msg_size(reply);
	bool over = false;
	char why[160];

	if (msg_check(reply, "inproc reply") != CACHEW_OK) {
		char msg[512];
		snprintf(msg, sizeof(msg), "reply not sent: %s",
		    cwi_errmsg_get());
		ip_fail(rq, CACHEW_EINVAL, msg);
		return cwi_fail(CACHEW_EINVAL, "%s", msg);
	}
	pthread_mutex_lock(&lock);
	if (r->p != NULL && size > r->conn->max_msg) {
		/* The client's receive limit: nng would drop its pipe. */
		over = true;
		snprintf(why, sizeof(why),
		    "reply of %zu bytes exceeds the limit of %zu", size,
		    r->conn->max_msg);
		conn_reset_locked(r->conn, &b, "connection reset: reply over "
					       "the size limit");
	}
	p = req_finish_locked(r, &dead);
	pthread_mutex_unlock(&lock);
	if (over) {
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "peer=%s reason=\"%s\" action=reset", r->conn->base.url,
		    why);
		batch_complete(&b, "connection reset: reply over the size "
				   "limit");
	}
	req_free(r);
	if (dead != NULL)
		conn_free(dead);
	if (p == NULL)
		return cwi_fail(CACHEW_ECLOSED,
		    over ? "inproc reply refused: %s"
			 : "inproc reply: the connection is gone%s",
		    over ? why : "");
	cwi_pending_complete(p, CACHEW_OK, reply, NULL);
	return CACHEW_OK;
}

static cachew_err
ip_fail(cwi_request *rq, cachew_err err, const char *msg)
{
	ip_req *r = (ip_req *)rq;
	ip_conn *dead;
	cwi_pending *p;
	char *full;

	pthread_mutex_lock(&lock);
	full = r->conn->l != NULL
	    ? cwi_asprintf("%s: %s", r->conn->l->base.url, msg)
	    : cwi_asprintf("%s%s: %s", SCHEME, r->conn->name, msg);
	p = req_finish_locked(r, &dead);
	pthread_mutex_unlock(&lock);
	req_free(r);
	if (dead != NULL)
		conn_free(dead);
	if (p != NULL)
		cwi_pending_complete(p, err, NULL, full != NULL ? full : msg);
	free(full);
	return p != NULL ? CACHEW_OK
			 : cwi_fail(CACHEW_ECLOSED,
			       "inproc: the connection is gone");
}

static void
ip_drop(cwi_request *rq)
{
	ip_req *r = (ip_req *)rq;
	ip_conn *dead;
	cwi_pending *p;

	pthread_mutex_lock(&lock);
	p = req_finish_locked(r, &dead);
	pthread_mutex_unlock(&lock);
	req_free(r);
	if (dead != NULL)
		conn_free(dead);
	if (p != NULL)
		cwi_pending_abandon(p);
}

static void
ip_reject(cwi_request *rq, const char *reason)
{
	ip_req *r = (ip_req *)rq;
	ip_conn *dead;
	cwi_pending *p;
	pend_batch b;

	cwi_log(CACHEW_LOG_WARN, "transport",
	    "peer=%s%s reason=\"%s\" action=reset", SCHEME, r->conn->name,
	    reason);
	pthread_mutex_lock(&lock);
	p = req_finish_locked(r, &dead);
	conn_reset_locked(r->conn, &b, "connection reset by peer");
	pthread_mutex_unlock(&lock);
	if (p != NULL)
		cwi_pending_complete(p, CACHEW_ECLOSED, NULL,
		    "connection reset by peer");
	batch_complete(&b, "connection reset by peer");
	req_free(r);
	if (dead != NULL)
		conn_free(dead);
}

static const char *
ip_peer(cwi_request *rq)
{
	return ((ip_req *)rq)->conn->base.url;
}

static const cwi_request_ops ip_request_ops = {
    .reply = ip_reply,
    .fail = ip_fail,
    .drop = ip_drop,
    .reject = ip_reject,
    .peer = ip_peer,
};

/* ---- connections -------------------------------------------------------- */

static cachew_err
ip_send(cwi_conn *cc, cwi_msg *req, cwi_pending *p)
{
	ip_conn *c = (ip_conn *)cc;
	ip_listener *l, *saved;
	ip_req *r;
	size_t size = cwi_msg_size(req);
	pend_batch b;

	if (msg_check(req, c->base.url) != CACHEW_OK)
		return CACHEW_EINVAL;
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_lock(&lock);
	if (c->closed) {
		pthread_mutex_unlock(&lock);
		free(r);
		return cwi_fail(CACHEW_ECLOSED, "%s: connection is closed",
		    c->base.url);
	}
	if (c->l == NULL) {
		/* Reconnect, as an nng dialer would. */
		l = names_find_locked(c->name);
		if (l == NULL) {
			pthread_mutex_unlock(&lock);
			free(r);
			return cwi_fail(CACHEW_EIO,
			    "%s: connection refused (no listener)",
			    c->base.url);
		}
		conn_bind_locked(c, l);
	}
	l = c->l;
	if (size > l->max_msg) {
		/* The listener's receive limit: like nng, reset the sender's
		 * connection; this request completes with the others. */
		r->conn = c;
		r->p = p;
		req_link_locked(c, r);
		conn_reset_locked(c, &b, "connection reset by peer");
		pthread_mutex_unlock(&lock);
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "peer=%s url=%s reason=\"message of %zu bytes exceeds the "
		    "limit of %zu\" action=reset",
		    c->base.url, l->base.url, size, l->max_msg);
		batch_complete(&b, "connection reset by peer");
		free(r);
		cwi_msg_destroy(req);
		return CACHEW_OK;
	}
	r->base.ops = &ip_request_ops;
	r->base.msg = req;
	r->conn = c;
	r->p = p;
	c->refs++;
	req_link_locked(c, r);
	l->active++;
	pthread_mutex_unlock(&lock);

	saved = in_handler;
	in_handler = l;
	l->base.handler(l->base.arg, &r->base);
	in_handler = saved;

	pthread_mutex_lock(&lock);
	if (--l->active == 0 && l->closed)
		pthread_cond_broadcast(&idle_cv);
	pthread_mutex_unlock(&lock);
	return CACHEW_OK;
}

static void
ip_conn_close(cwi_conn *cc)
{
	ip_conn *c = (ip_conn *)cc;
	pend_batch b = {0};

	pthread_mutex_lock(&lock);
	if (!c->closed) {
		c->closed = true;
		conn_reset_locked(c, &b, "connection closed");
		conn_unbind_locked(c);
	}
	pthread_mutex_unlock(&lock);
	batch_complete(&b, "connection closed");
}

static void
ip_conn_free(cwi_conn *cc)
{
	ip_conn *c = (ip_conn *)cc;
	ip_conn *dead;

	pthread_mutex_lock(&lock);
	dead = conn_unref_locked(c);
	pthread_mutex_unlock(&lock);
	if (dead != NULL)
		conn_free(dead);
}

static const cwi_conn_ops ip_conn_ops = {
    .send = ip_send,
    .close = ip_conn_close,
    .free = ip_conn_free,
};

static cachew_err
ip_dial(cwi_conn **out, const char *url, const cwi_transport_opts *opts)
{
	ip_conn *c;
	ip_listener *l;

	cwi_inproc_fork_init();
	if (url_name(url)[0] == '\0')
		return cwi_fail(CACHEW_EINVAL,
		    "'%s': inproc URL without a name", url);
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->base.ops = &ip_conn_ops;
	c->base.url = cwi_strdup(url);
	c->name = cwi_strdup(url_name(url));
	c->max_msg = opts->max_msg_size;
	c->refs = 1;
	if (c->base.url == NULL || c->name == NULL) {
		conn_free(c);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&lock);
	l = names_find_locked(c->name);
	if (l != NULL)
		conn_bind_locked(c, l);
	pthread_mutex_unlock(&lock);
	if (l == NULL && !opts->dial_async) {
		conn_free(c);
		return cwi_fail(CACHEW_EIO,
		    "%s: connection refused (no listener)", url);
	}
	*out = &c->base;
	return CACHEW_OK;
}

/* ---- listeners ---------------------------------------------------------- */

static void
ip_listener_close(cwi_listener *ll)
{
	ip_listener *l = (ip_listener *)ll;
	pend_batch *bs = NULL;
	size_t nb = 0, cap = 0;

	pthread_mutex_lock(&lock);
	if (!l->closed) {
		l->closed = true;
		for (ip_listener **pp = &names; *pp != NULL;
		     pp = &(*pp)->next) {
			if (*pp == l) {
				*pp = l->next;
				break;
			}
		}
		/* Reset every connection: their requests in flight fail
		 * now, and they find a new listener of this name later. */
		while (l->conns != NULL) {
			ip_conn *c = l->conns;
			pend_batch b;

			conn_reset_locked(c, &b, "connection reset: listener "
						 "closed");
			conn_unbind_locked(c);
			if (b.n == 0)
				continue;
			if (nb == cap) {
				size_t ncap = cap != 0 ? cap * 2 : 8;
				pend_batch *v = realloc(bs, ncap * sizeof(*v));
				if (v == NULL) {
					/* Rare: complete under the lock. */
					batch_complete(&b, "connection reset: "
							   "listener closed");
					continue;
				}
				bs = v;
				cap = ncap;
			}
			bs[nb++] = b;
		}
	}
	while (l->active > (in_handler == l ? 1u : 0u))
		pthread_cond_wait(&idle_cv, &lock);
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; i < nb; i++)
		batch_complete(&bs[i], "connection reset: listener closed");
	free(bs);
}

static void
ip_listener_free(cwi_listener *ll)
{
	ip_listener *l = (ip_listener *)ll;

	free(l->name);
	free(l->base.url);
	free(l);
}

static const cwi_listener_ops ip_listener_ops = {
    .close = ip_listener_close,
    .free = ip_listener_free,
};

static cachew_err
ip_listen(cwi_listener **out, const char *url, const cwi_transport_opts *opts,
    cwi_handler_fn handler, void *arg)
{
	ip_listener *l;

	cwi_inproc_fork_init();
	if (url_name(url)[0] == '\0')
		return cwi_fail(CACHEW_EINVAL,
		    "'%s': inproc URL without a name", url);
	l = calloc(1, sizeof(*l));
	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	l->base.ops = &ip_listener_ops;
	l->base.url = cwi_strdup(url);
	l->base.handler = handler;
	l->base.arg = arg;
	l->name = cwi_strdup(url_name(url));
	l->max_msg = opts->max_msg_size;
	if (l->base.url == NULL || l->name == NULL) {
		ip_listener_free(&l->base);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&lock);
	if (names_find_locked(l->name) != NULL) {
		pthread_mutex_unlock(&lock);
		ip_listener_free(&l->base);
		return cwi_fail(CACHEW_EEXIST, "%s: address in use", url);
	}
	l->next = names;
	names = l;
	pthread_mutex_unlock(&lock);
	*out = &l->base;
	return CACHEW_OK;
}

static const char *const ip_schemes[] = {"inproc", NULL};

const cwi_transport cwi_transport_inproc = {
    .name = "inproc",
    .schemes = ip_schemes,
    .listen = ip_listen,
    .dial = ip_dial,
};
