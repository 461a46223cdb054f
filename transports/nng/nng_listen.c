/*
 * nng_listen.c - the server side of the nng transport. A listener
 * (slistener) accepts links and calls the handler once per request; the
 * request keeps its link (and the request id and backtrace) to send the
 * reply on. Past max_inflight held requests, a link stops reading until
 * one is consumed (back-pressure): it parks on the listener's list, and
 * once there is room every parked link reads again. The bytes of the
 * messages its links read and of the requests it holds count against its
 * budget (rx_budget, nng_int.h): a request gives its bytes back when it is
 * answered or dropped.
 *
 * Locking: the listener's mutex, then a link's mutex (nng_link.c). The
 * handler runs, and requests are answered, with neither held.
 */
#include "nng_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct slistener {
	cwi_listener base;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	unsigned refs; /* the owner's + one per slink */
	bool closed;
	bool ipc;
	nng_stream_listener *sl;
	cwi_nng_tls *tls; /* tls+tcp: the credentials */
	nng_aio *acc;
	bool acc_sleep; /* acc is a pause after a failed accept */
	slink *links;    /* live links: on_down not yet delivered */
	slink *parked, *parked_tail;
	unsigned held, max_held; /* requests handed out, not consumed */
	unsigned in_handler;
	size_t max_msg;
	int send_timeout_ms;
	rx_budget budget;
	bool shm_ok; /* accepts clients' regions (CACHEW_SHM is not 0) */
} slistener;

/* Replies smaller than this go through the socket even to a client with
 * a region: a copy into it and a frame cost about what the socket does. */
#define SHM_REPLY_MIN ((size_t)64 << 10)

typedef struct sreq {
	cwi_request base;
	slistener *l;
	slink *lk; /* a reference: the reply goes there */
	size_t charged; /* bytes of lk's budget: its received message */
	uint8_t bt[SP_BT_MAX];
	size_t btlen;
} sreq;

static void
listener_free(slistener *l)
{
	nng_stream_listener_free(l->sl);
	cwi_nng_tls_destroy(l->tls);
	nng_aio_free(l->acc);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mtx);
	free(l->base.url);
	free(l);
}

static void
listener_unref(slistener *l)
{
	bool last;

	pthread_mutex_lock(&l->mtx);
	last = --l->refs == 0;
	pthread_mutex_unlock(&l->mtx);
	if (last)
		listener_free(l);
}

static void
srv_link_release(void *owner)
{
	listener_unref(owner);
}

static void
unpark_locked(slistener *l, slink *lk)
{
	slink **pp = &l->parked;

	if (!lk->parked)
		return;
	while (*pp != lk)
		pp = &(*pp)->pnext;
	*pp = lk->pnext;
	if (l->parked_tail == lk) {
		l->parked_tail = NULL;
		for (slink *x = l->parked; x != NULL; x = x->pnext)
			l->parked_tail = x;
	}
	lk->pnext = NULL;
	lk->parked = false;
}

/* A request was consumed: room for one more, maybe for a parked link. */
static void
srv_consumed(slistener *l)
{
	slink *wake[16];
	unsigned n;

	pthread_mutex_lock(&l->mtx);
	l->held--;
	for (;;) {
		/* Every parked link reads again once there is room: a woken
		 * link may have nothing more to send, so waking one link per
		 * consumed request can leave another parked with nothing
		 * held. Each woken link reads at most one message before it
		 * checks again. */
		n = 0;
		while (n < 16 && l->parked != NULL && l->held < l->max_held) {
			wake[n] = l->parked;
			unpark_locked(l, wake[n]);
			cwi_nng_link_ref(wake[n++]);
		}
		pthread_mutex_unlock(&l->mtx);
		for (unsigned i = 0; i < n; i++) {
			cwi_nng_link_resume(wake[i]);
			cwi_nng_link_unref(wake[i]);
		}
		if (n < 16)
			return;
		pthread_mutex_lock(&l->mtx);
	}
}

static const cwi_request_ops nt_request_ops;

/* Answers a client's offer of a region (nng_shm.c): yes when this
 * process can map it (the same host and user), and the link's large
 * replies go there from now on. Not on TLS links (their bytes are to be
 * encrypted) nor where CACHEW_SHM=0. */
static void
srv_shm_hello(slistener *l, slink *lk, const uint8_t *bt, size_t btlen,
    const cwi_nng_frame_in *fi)
{
	uint8_t yes = 0;
	cwi_shm *r = NULL;
	txmsg *t;

	if (!l->shm_ok || lk->tls) {
		cwi_log(CACHEW_LOG_DEBUG, "transport", "peer=%s url=%s "
		    "event=shm_declined reason=\"%s\"", lk->peer, l->base.url,
		    lk->tls ? "a TLS link" : "CACHEW_SHM=0");
	} else if (cwi_nng_shm_open(&r, fi->ctl, fi->ctl_len) != CACHEW_OK) {
		cwi_log(CACHEW_LOG_DEBUG, "transport", "peer=%s url=%s "
		    "event=shm_declined reason=\"%s\"", lk->peer, l->base.url,
		    cwi_errmsg_get());
	} else {
		pthread_mutex_lock(&lk->mtx);
		if (lk->shm == NULL) {
			__atomic_store_n(&lk->shm, r, __ATOMIC_RELEASE);
			r = NULL;
			yes = 1;
		}
		pthread_mutex_unlock(&lk->mtx);
		cwi_nng_shm_unref(r); /* a second hello: the first stays */
	}
	if (cwi_nng_tx_build_ctl(&t, l->ipc, bt, btlen, FRAME_KIND_SHM_HELLO,
		&yes, 1) == CACHEW_OK &&
	    cwi_nng_link_send(lk, t) != CACHEW_OK)
		cwi_nng_tx_free(t);
}

static bool
srv_on_msg(void *owner, slink *lk, cwi_buffer *buf)
{
	slistener *l = owner;
	size_t btlen, charged;
	sreq *r = NULL;
	cwi_nng_frame_in fi;
	cachew_err rv;
	bool more;

	pthread_mutex_lock(&l->mtx);
	if (l->closed) {
		/* Arrived while closing: no handler starts any more. */
		pthread_mutex_unlock(&l->mtx);
		cwi_nng_budget_give(lk, buf->size);
		cwi_buffer_unref(buf);
		return true;
	}
	l->in_handler++;
	l->held++;
	pthread_mutex_unlock(&l->mtx);

	/* The backtrace ends at the request id, the word with the high
	 * bit set. */
	charged = buf->size;
	btlen = cwi_nng_backtrace_len(buf->data, buf->size);
	if (btlen == 0) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "request of %zu bytes has no request id in its first %d "
		    "words",
		    buf->size, SP_MAX_HOPS);
		cwi_buffer_unref(buf);
	} else if ((r = calloc(1, sizeof(*r))) == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		cwi_buffer_unref(buf);
	} else {
		memcpy(r->bt, buf->data, btlen);
		r->btlen = btlen;
		rv = cwi_nng_frame_decode(buf, btlen, l->max_msg, &fi);
		if (rv == CACHEW_OK && fi.ctl_kind == FRAME_KIND_SHM_HELLO) {
			srv_shm_hello(l, lk, r->bt, r->btlen, &fi);
			free(r);
			r = NULL;
		} else if (rv == CACHEW_OK && fi.msg == NULL) {
			rv = cwi_fail(CACHEW_EPROTO, "a request may not be an "
			    "error or a block frame");
		}
	}
	if (rv == CACHEW_OK && r == NULL) {
		/* A hello, answered by the transport itself. */
		cwi_nng_budget_give(lk, charged);
		srv_consumed(l);
	} else if (rv != CACHEW_OK) {
		free(r);
		cwi_nng_budget_give(lk, charged);
		if (rv == CACHEW_EPROTO)
			cwi_nng_link_reset(lk, cwi_errmsg_get());
		else
			cwi_log(CACHEW_LOG_WARN, "transport",
			    "peer=%s url=%s reason=\"request dropped: %s\"",
			    lk->peer, l->base.url, cwi_errmsg_get());
		srv_consumed(l);
	} else {
		r->base.ops = &nt_request_ops;
		r->base.msg = fi.msg;
		r->l = l;
		r->lk = lk;
		r->charged = charged;
		cwi_nng_link_ref(lk);
		l->base.handler(l->base.arg, &r->base);
	}

	pthread_mutex_lock(&l->mtx);
	if (--l->in_handler == 0 && l->closed)
		pthread_cond_broadcast(&l->cv);
	more = l->closed || l->held < l->max_held;
	if (!more && !lk->parked) {
		lk->parked = true;
		lk->pnext = NULL;
		if (l->parked_tail != NULL)
			l->parked_tail->pnext = lk;
		else
			l->parked = lk;
		l->parked_tail = lk;
	}
	pthread_mutex_unlock(&l->mtx);
	return more;
}

static void
srv_on_down(void *owner, slink *lk, const char *why)
{
	slistener *l = owner;

	pthread_mutex_lock(&l->mtx);
	unpark_locked(l, lk);
	if (lk->prev != NULL)
		lk->prev->next = lk->next;
	else
		l->links = lk->next;
	if (lk->next != NULL)
		lk->next->prev = lk->prev;
	lk->next = lk->prev = NULL;
	pthread_mutex_unlock(&l->mtx);
	cwi_log(CACHEW_LOG_DEBUG, "transport",
	    "peer=%s url=%s event=disconnected reason=\"%s\"", lk->peer,
	    l->base.url, why);
	cwi_nng_link_unref(lk);
}

static const link_ops srv_link_ops = {
    .on_msg = srv_on_msg,
    .on_down = srv_on_down,
    .release = srv_link_release,
};

/* Ends r: its message, its place among the held requests, its link. */
static void
srv_release(sreq *r)
{
	slistener *l = r->l;
	slink *lk = r->lk;

	cwi_msg_destroy(r->base.msg);
	cwi_nng_budget_give(lk, r->charged);
	free(r);
	srv_consumed(l);
	cwi_nng_link_unref(lk);
}

/* Sends t as the answer to r and consumes r. On failure the caller still
 * owns t. */
static cachew_err
srv_send(sreq *r, txmsg *t)
{
	slistener *l = r->l;
	cachew_err rv;
	bool closed;

	pthread_mutex_lock(&l->mtx);
	closed = l->closed;
	pthread_mutex_unlock(&l->mtx);
	if (closed)
		rv = cwi_fail(CACHEW_ECLOSED, "%s: listener is closed",
		    l->base.url);
	else if ((rv = cwi_nng_link_send(r->lk, t)) != CACHEW_OK)
		rv = cwi_fail(CACHEW_ECLOSED, "%s: the connection of %s is gone",
		    l->base.url, r->lk->peer);
	srv_release(r);
	return rv;
}

static cachew_err
nt_reply(cwi_request *rq, cwi_msg *reply)
{
	sreq *r = (sreq *)rq;
	slistener *l = r->l;
	txmsg *t;
	cachew_err rv;

	rv = cwi_nng_tx_build(&t, l->ipc, r->bt, r->btlen, reply);
	if (rv != CACHEW_OK) {
		/* Tell the client why instead of leaving it to time out. */
		char why[512];
		snprintf(why, sizeof(why), "%s: reply not sent: %s",
		    l->base.url, cwi_errmsg_get());
		if (cwi_nng_tx_build_error(&t, l->ipc, r->bt, r->btlen, rv, why) ==
		    CACHEW_OK) {
			if (srv_send(r, t) != CACHEW_OK)
				cwi_nng_tx_free(t);
		} else {
			srv_release(r);
		}
		return cwi_fail(rv, "%s", why);
	}
	/* A client on this host that offered a region: a large reply's
	 * bytes go there, the socket carries the block's place. */
	cwi_shm *shm = __atomic_load_n(&r->lk->shm, __ATOMIC_ACQUIRE);
	if (shm != NULL) {
		txmsg *small;
		rv = cwi_nng_shm_pack(shm, l->ipc, t, SHM_REPLY_MIN, &small);
		if (rv == CACHEW_OK && small != NULL) {
			cwi_nng_tx_free(t);
			t = small;
		}
	}
	/* The reply's elements must live until their bytes are written
	 * (or, as a block, until it is sent: the caller keeps the reply
	 * when the send fails). */
	t->msg = reply;
	rv = srv_send(r, t);
	if (rv != CACHEW_OK) {
		t->msg = NULL;
		cwi_nng_tx_free(t);
	}
	return rv;
}

static cachew_err
nt_fail(cwi_request *rq, cachew_err err, const char *msg)
{
	sreq *r = (sreq *)rq;
	char full[FRAME_ERRMSG_MAX];
	txmsg *t;
	cachew_err rv;

	snprintf(full, sizeof(full), "%s: %s", r->l->base.url, msg);
	if (cwi_nng_tx_build_error(&t, r->l->ipc, r->bt, r->btlen, err, full) !=
	    CACHEW_OK) {
		srv_release(r);
		return CACHEW_ENOMEM;
	}
	rv = srv_send(r, t);
	if (rv != CACHEW_OK)
		cwi_nng_tx_free(t);
	return rv;
}

static void
nt_drop(cwi_request *rq)
{
	srv_release((sreq *)rq);
}

static void
nt_reject(cwi_request *rq, const char *reason)
{
	sreq *r = (sreq *)rq;

	cwi_nng_link_reset(r->lk, reason);
	srv_release(r);
}

static const char *
nt_peer(cwi_request *rq)
{
	return ((sreq *)rq)->lk->peer;
}

static const cwi_request_ops nt_request_ops = {
    .reply = nt_reply,
    .fail = nt_fail,
    .drop = nt_drop,
    .reject = nt_reject,
    .peer = nt_peer,
};

/* A failed accept (out of descriptors, say) is retried after this. */
#define ACCEPT_RETRY_MS 100

static void
srv_accept_cb(void *arg)
{
	slistener *l = arg;
	int rv = nng_aio_result(l->acc);
	nng_stream *s = NULL;
	slink *lk = NULL;
	cachew_err err;

	pthread_mutex_lock(&l->mtx);
	if (!l->acc_sleep && rv == 0)
		s = nng_aio_get_output(l->acc, 0);
	if (l->closed) {
		pthread_mutex_unlock(&l->mtx);
		if (s != NULL) {
			nng_stream_close(s);
			nng_stream_free(s);
		}
		return;
	}
	if (l->acc_sleep) {
		l->acc_sleep = false;
		nng_stream_listener_accept(l->sl, l->acc);
		pthread_mutex_unlock(&l->mtx);
		return;
	}
	if (rv != 0) {
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "url=%s reason=\"accept failed: %s\" action=retry",
		    l->base.url, nng_strerror(rv));
		l->acc_sleep = true;
		nng_sleep_aio(ACCEPT_RETRY_MS, l->acc);
		pthread_mutex_unlock(&l->mtx);
		return;
	}
	l->refs++; /* the link's */
	pthread_mutex_unlock(&l->mtx);

	err = cwi_nng_link_create(&lk, s, l->ipc, SP_PROTO_REP0, SP_PROTO_REQ0,
	    &srv_link_ops, l, l->base.url, l->max_msg + SP_BT_MAX,
	    l->send_timeout_ms, l->tls);
	pthread_mutex_lock(&l->mtx);
	if (err != CACHEW_OK) {
		l->refs--;
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "url=%s reason=\"connection dropped: %s\"", l->base.url,
		    cwi_errmsg_get());
	} else if (!l->closed) {
		cwi_nng_link_set_budget(lk, &l->budget);
		lk->next = l->links;
		if (l->links != NULL)
			l->links->prev = lk;
		l->links = lk;
		cwi_nng_link_start(lk);
		lk = NULL;
	}
	if (!l->closed)
		nng_stream_listener_accept(l->sl, l->acc);
	pthread_mutex_unlock(&l->mtx);
	if (lk != NULL) {
		/* Closed meanwhile: never started, nothing reports it. */
		cwi_nng_link_kill(lk, "listener closed");
		cwi_nng_link_unref(lk);
	}
}

static void
nt_listener_close(cwi_listener *ll)
{
	slistener *l = (slistener *)ll;
	bool first;

	pthread_mutex_lock(&l->mtx);
	first = !l->closed;
	l->closed = true;
	for (slink *lk = l->links; lk != NULL; lk = lk->next)
		cwi_nng_link_kill(lk, "listener closed");
	pthread_mutex_unlock(&l->mtx);
	if (first) {
		nng_stream_listener_close(l->sl);
		nng_aio_stop(l->acc);
	}
	pthread_mutex_lock(&l->mtx);
	while (l->in_handler > 0)
		pthread_cond_wait(&l->cv, &l->mtx);
	pthread_mutex_unlock(&l->mtx);
	/* An ipc listener's socket file goes with it. */
	if (first && l->ipc)
		unlink(l->base.url + 6);
}

static void
nt_listener_free(cwi_listener *ll)
{
	listener_unref((slistener *)ll);
}

static const cwi_listener_ops nt_listener_ops = {
    .close = nt_listener_close,
    .free = nt_listener_free,
};

/* "tcp://host:0" (or tls+tcp) with the port bound; other URLs
 * unchanged. */
static char *
bound_url(const char *url, nng_stream_listener *sl)
{
	const char *colon;
	int port;

	if ((strncmp(url, "tcp", 3) != 0 && !cwi_nng_url_is_tls(url)) ||
	    nng_stream_listener_get_int(sl, NNG_OPT_TCP_BOUND_PORT, &port) !=
		0 ||
	    (colon = strrchr(url, ':')) == NULL ||
	    colon < strstr(url, "//") + 2)
		return cwi_strdup(url);
	return cwi_asprintf("%.*s:%d", (int)(colon - url), url, port);
}

cachew_err
cwi_nng_listen(cwi_listener **out, const char *url, const cwi_transport_opts *opts,
    cwi_handler_fn handler, void *arg)
{
	slistener *l = calloc(1, sizeof(*l));
	cachew_err rv;
	int nrv;
	bool own_tls = cwi_nng_url_is_tls(url) && cwi_nng_tls_own_layer();
	char *stream_url;

	if ((rv = cwi_nng_fork_check(url)) != CACHEW_OK) {
		free(l);
		return rv;
	}
	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&l->mtx, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->base.ops = &nt_listener_ops;
	l->base.handler = handler;
	l->base.arg = arg;
	l->refs = 1;
	l->ipc = strncmp(url, "ipc://", 6) == 0;
	l->max_msg = opts->max_msg_size;
	l->max_held = opts->max_inflight;
	l->send_timeout_ms = opts->send_timeout_ms;
	l->shm_ok = cwi_nng_shm_enabled();
	atomic_init(&l->budget.used, 0);
	atomic_init(&l->budget.peak, 0);
	l->budget.limit = opts->max_pending_bytes;
	/* A connection: the message it is sending and as much again in
	 * requests waiting for their answers. */
	l->budget.link_limit = 2 * (opts->max_msg_size + SP_BT_MAX);
	if (l->budget.link_limit > l->budget.limit)
		l->budget.link_limit = l->budget.limit;
	/* A user's process: only if asked (CACHEW_MALLOPT=1). */
	cwi_heap_tune(false);
	/* cachew's TLS layer listens on tcp:// and runs TLS on the link. */
	if ((stream_url = cwi_nng_tls_stream_url(url, own_tls)) == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	nrv = nng_stream_listener_alloc(&l->sl, stream_url);
	free(stream_url);
	if (nrv != 0) {
		rv = cwi_nng_err(nrv, url, "listen");
		goto fail;
	}
	if (cwi_nng_url_is_tls(url)) {
		if ((rv = cwi_nng_tls_create(&l->tls, url, opts, true,
			 own_tls)) !=
			CACHEW_OK)
			goto fail;
		if ((nrv = cwi_nng_tls_set_listener(l->tls, l->sl)) != 0) {
			rv = cwi_nng_err(nrv, url, "listen");
			goto fail;
		}
	}
	if ((nrv = nng_stream_listener_listen(l->sl)) != 0) {
		rv = cwi_nng_err(nrv, url, "listen");
		goto fail;
	}
	l->base.url = bound_url(url, l->sl);
	if (l->base.url == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if ((nrv = nng_aio_alloc(&l->acc, srv_accept_cb, l)) != 0) {
		rv = cwi_nng_err(nrv, url, "nng_aio_alloc");
		goto fail;
	}
	nng_stream_listener_accept(l->sl, l->acc);
	*out = &l->base;
	return CACHEW_OK;

fail:
	if (l->sl != NULL)
		nng_stream_listener_close(l->sl);
	listener_free(l);
	return rv;
}
