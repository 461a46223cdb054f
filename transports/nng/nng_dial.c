/*
 * nng_dial.c - the client side of the nng transport. A connection
 * (sconn) owns at most one link at a time, gives each request a 32-bit
 * id (high bit set, as req0 does), matches replies by id, fails the
 * requests of a link that dies with CACHEW_ECLOSED, and redials by itself
 * (reconnect_min_ms doubling to reconnect_max_ms while it fails, each
 * wait drawn from the upper half of the backoff). Requests sent while no
 * link is up wait for the next one within their deadline.
 *
 * Refusals: a link that dies before the peer's handshake (a TLS
 * handshake refused, or a tcp:// peer that hangs up at once) may mean a
 * peer that will never talk to us. A diagnosis thread (diag_main; at
 * most one per connection) asks why (cwi_nng_tls_diagnose); meanwhile
 * the requests that went out on that link wait as orphans (their bytes
 * are gone with it: they cannot be resent). A lasting refusal completes
 * the orphans and every request waiting for a link with CACHEW_EAUTH and
 * the reason, and fails new requests at once while no link is up, until
 * a reply arrives on a new link; anything else completes the orphans
 * with CACHEW_ECLOSED, as any dead link's requests.
 *
 * Unreachable peers (unreachable_after_ms): a connection that never had a
 * link and whose dials have all failed for that long takes the same
 * fail-fast state with CACHEW_EIO and the dial's error ("Connection
 * refused"), so a client named a dead address says so in seconds rather
 * than "no reply" at its timeout; the first link ends it. A peer once
 * reached is waited for, as before: it may be restarting.
 *
 * Locking: cq->mtx (transport.c; held only around a pending's cancel
 * hook, cli_cancel), then the connection's mutex, then a link's mutex
 * (nng_link.c); requests are completed with none of these held.
 */
#include "nng_int.h"

#include <stdio.h>
#include <stdlib.h>

/* A blocking dial gives up after this. */
#define DIAL_TIMEOUT_MS 10000

typedef struct sconn sconn;

/* One request in flight on a connection. */
typedef struct creq {
	cwi_pending *p;
	sconn *c;
	uint32_t id;
	txmsg *tx;    /* the framed request, until a link takes it */
	slink *lk;     /* the link it went out on; NULL: waiting for one */
	bool listed;  /* on c->reqs (the connection's lock) */
	bool expired; /* the deadline passed before it was listed */
	bool orphan;  /* its link died in the handshake: awaits diag_main */
	struct creq *next, *prev;
} creq;

struct sconn {
	cwi_conn base;
	pthread_mutex_t mtx;
	unsigned refs; /* the owner's + one per slink */
	bool closed;
	bool ipc;
	nng_stream_dialer *d;
	nng_aio *dial; /* dials, and waits between failed dials */
	bool dial_armed, dial_sleeping;
	int backoff_ms, rmin_ms, rmax_ms;
	cwi_rng jitter; /* spreads the redials of many clients */
	slink *lk; /* the current link, with a reference */
	uint64_t attached_ns; /* when lk was attached (cwi_now_ns) */
	creq *reqs, *reqs_tail;
	uint32_t next_id;
	creq *reap; /* expired requests to complete (on reap_aio) */
	nng_aio *reap_aio;
	bool reap_armed;
	size_t max_msg;
	int send_timeout_ms;
	cwi_nng_tls *tls; /* tls+tcp: the credentials */
	/* Refusals (see the top of the file). */
	bool diagnosing;
	cachew_err refused; /* CACHEW_OK, or the lasting refusal */
	char refusal[600];
	char orphan_why[300]; /* why the orphans' link died */
	/* Unreachable peers (see the top of the file). */
	int unreachable_ms; /* 0: never */
	bool reached;       /* a link was attached once */
	bool unreachable;   /* c->refused is the unreachable state */
	unsigned dial_fails; /* since the first, while never reached */
	uint64_t first_fail_ns;
	/* The same-host path (nng_shm.c): the region's size offered on
	 * each link (0: none); the link whose hello awaits its answer and
	 * the hello's id (requests wait for its answer); shm_off once a
	 * listener declined or a link died before answering (an older
	 * listener resets on a hello). */
	size_t shm_bytes;
	slink *hello_lk;
	uint32_t hello_id;
	bool shm_off;
};

static void conn_send_waiting_locked(sconn *c, slink *lk);

static void
conn_free(sconn *c)
{
	nng_stream_dialer_free(c->d);
	cwi_nng_tls_destroy(c->tls);
	nng_aio_free(c->dial);
	nng_aio_free(c->reap_aio);
	pthread_mutex_destroy(&c->mtx);
	free(c->base.url);
	free(c);
}

static void
conn_unref(sconn *c)
{
	bool last;

	pthread_mutex_lock(&c->mtx);
	last = --c->refs == 0;
	pthread_mutex_unlock(&c->mtx);
	if (last)
		conn_free(c);
}

static void
cli_link_release(void *owner)
{
	conn_unref(owner);
}

static void
req_unlist_locked(sconn *c, creq *x)
{
	if (x->prev != NULL)
		x->prev->next = x->next;
	else
		c->reqs = x->next;
	if (x->next != NULL)
		x->next->prev = x->prev;
	else
		c->reqs_tail = x->prev;
	x->next = x->prev = NULL;
	x->listed = false;
}

/* Completes and frees every request of the list linked by next. */
static void
req_complete_all(creq *x, cachew_err err, const char *msg)
{
	while (x != NULL) {
		creq *nx = x->next;
		cwi_pending_complete(x->p, err, NULL, msg);
		cwi_nng_tx_free(x->tx);
		free(x);
		x = nx;
	}
}

/* After a failed dial (or a link that died young): the backoff doubles
 * from reconnect_min_ms to reconnect_max_ms, and the wait is drawn from
 * its upper half, so that the clients of a peer that came back do not
 * all redial in the same millisecond. With c->mtx held. */
static int
backoff_next_locked(sconn *c)
{
	c->backoff_ms = c->backoff_ms == 0 ? c->rmin_ms
	    : c->backoff_ms >= c->rmax_ms / 2 ? c->rmax_ms
					      : c->backoff_ms * 2;
	return c->backoff_ms - (int)cwi_rng_below(&c->jitter,
				   (uint64_t)(c->backoff_ms / 2) + 1);
}

static void
dial_arm_locked(sconn *c, int delay_ms)
{
	c->dial_armed = true;
	c->dial_sleeping = delay_ms > 0;
	if (delay_ms > 0)
		nng_sleep_aio(delay_ms, c->dial);
	else
		nng_stream_dialer_dial(c->d, c->dial);
}

/* The listener's answer to our hello (buf, taken): whether it takes the
 * region. Either way the region's name has done its work. */
static void
cli_shm_answer(sconn *c, slink *lk, cwi_buffer *buf)
{
	cwi_nng_frame_in fi;
	cachew_err err = cwi_nng_frame_decode(buf, SP_ID_BYTES, c->max_msg,
	    &fi);
	cwi_shm *drop = NULL;
	bool yes = err == CACHEW_OK && fi.ctl_kind == FRAME_KIND_SHM_HELLO &&
		   fi.ctl_len == 1 && fi.ctl[0] == 1;

	if (err == CACHEW_OK)
		cwi_msg_destroy(fi.msg);
	pthread_mutex_lock(&lk->mtx);
	cwi_nng_shm_unlink(lk->shm);
	if (!yes) {
		drop = lk->shm;
		lk->shm = NULL;
	}
	pthread_mutex_unlock(&lk->mtx);
	cwi_nng_shm_unref(drop);
	pthread_mutex_lock(&c->mtx);
	if (!yes)
		c->shm_off = true;
	if (c->lk == lk)
		conn_send_waiting_locked(c, lk);
	pthread_mutex_unlock(&c->mtx);
	cwi_log(CACHEW_LOG_DEBUG, "transport", "url=%s event=%s", c->base.url,
	    yes ? "shm_taken" : "shm_declined");
}

/* A block frame's reply (fi's payload): the message in the region,
 * decoded in place. */
static cachew_err
cli_shm_reply(sconn *c, slink *lk, const uint8_t *id,
    cwi_nng_frame_in *fi)
{
	cwi_buffer *blk;
	cachew_err err;

	err = cwi_nng_shm_block(lk->shm, fi->ctl, fi->ctl_len,
	    c->max_msg + SP_ID_BYTES, &blk);
	if (err != CACHEW_OK)
		return err;
	if (memcmp(blk->data, id, SP_ID_BYTES) != 0) {
		cwi_buffer_unref(blk);
		return cwi_fail(CACHEW_EPROTO, "a shared memory block whose "
					       "request id is not its frame's");
	}
	err = cwi_nng_frame_decode(blk, SP_ID_BYTES, c->max_msg, fi);
	if (err == CACHEW_OK && fi->ctl_kind != 0)
		err = cwi_fail(CACHEW_EPROTO, "a control frame inside a "
					      "shared memory block");
	return err;
}

static bool
cli_on_msg(void *owner, slink *lk, cwi_buffer *buf)
{
	sconn *c = owner;
	uint32_t id = cwi_nng_get_u32(buf->data);
	uint8_t idb[SP_ID_BYTES];
	char msg[FRAME_ERRMSG_MAX + 200];
	cachew_err err;
	cwi_msg *reply = NULL;
	cwi_nng_frame_in fi;
	creq *x;
	bool hello;

	pthread_mutex_lock(&c->mtx);
	c->refused = CACHEW_OK; /* the peer talks to us */
	hello = lk == c->hello_lk && id == c->hello_id;
	if (hello)
		c->hello_lk = NULL;
	for (x = hello ? NULL : c->reqs; x != NULL; x = x->next)
		if (x->id == id && x->lk == lk)
			break;
	if (x != NULL)
		req_unlist_locked(c, x);
	pthread_mutex_unlock(&c->mtx);
	if (hello) {
		cli_shm_answer(c, lk, buf);
		return true;
	}
	msg[0] = '\0';
	memcpy(idb, buf->data, SP_ID_BYTES);
	err = cwi_nng_frame_decode(buf, SP_ID_BYTES, c->max_msg, &fi);
	if (err == CACHEW_OK && fi.ctl_kind == FRAME_KIND_SHM_BLOCK)
		err = cli_shm_reply(c, lk, idb, &fi);
	else if (err == CACHEW_OK && fi.ctl_kind != 0)
		err = cwi_fail(CACHEW_EPROTO, "a control frame of kind %d as "
					      "a reply", fi.ctl_kind);
	if (x == NULL) {
		/* The reply to a request that timed out: nobody waits (a
		 * block it named went back to the listener with it). */
		if (err == CACHEW_EPROTO)
			cwi_nng_link_reset(lk, cwi_errmsg_get());
		else if (err == CACHEW_OK)
			cwi_msg_destroy(fi.msg);
		return true;
	}
	if (err == CACHEW_EPROTO) {
		snprintf(msg, sizeof(msg), "%s: malformed reply: %s",
		    c->base.url, cwi_errmsg_get());
		cwi_nng_link_reset(lk, cwi_errmsg_get());
	} else if (err != CACHEW_OK) {
		snprintf(msg, sizeof(msg), "%s: %s", c->base.url,
		    cwi_errmsg_get());
	} else if (fi.msg == NULL) {
		err = fi.peer_err;
		snprintf(msg, sizeof(msg), "%s", fi.peer_msg);
	} else {
		reply = fi.msg;
	}
	cwi_pending_complete(x->p, err, reply, msg);
	free(x);
	return true;
}

/* Ends a diagnosis (see the top of the file): err and reason are its
 * verdict (CACHEW_OK: nothing that lasts). */
static void
diag_finish(sconn *c, cachew_err err, const char *reason)
{
	creq *done = NULL, **tail = &done;
	char msg[sizeof(c->refusal)];
	bool say = false;

	pthread_mutex_lock(&c->mtx);
	c->diagnosing = false;
	if (err != CACHEW_OK && !c->closed) {
		snprintf(msg, sizeof(msg), "%s: %s", c->base.url, reason);
		say = c->refused == CACHEW_OK || strcmp(c->refusal, msg) != 0;
		c->refused = err;
		memcpy(c->refusal, msg, sizeof(msg));
	} else {
		err = CACHEW_OK;
		snprintf(msg, sizeof(msg), "%s: %s", c->base.url,
		    c->orphan_why);
	}
	for (creq *x = c->reqs, *nx; x != NULL; x = nx) {
		nx = x->next;
		if (!x->orphan && (err == CACHEW_OK || x->lk != NULL))
			continue;
		req_unlist_locked(c, x);
		*tail = x;
		tail = &x->next;
	}
	pthread_mutex_unlock(&c->mtx);
	if (say)
		cwi_log(CACHEW_LOG_WARN, "transport", "url=%s reason=\"%s\" "
		    "action=refuse", c->base.url, reason);
	req_complete_all(done, err != CACHEW_OK ? err : CACHEW_ECLOSED, msg);
}

static void *
diag_main(void *arg)
{
	sconn *c = arg;
	char reason[sizeof(c->refusal) - 100];
	cachew_err err;

	err = cwi_nng_tls_diagnose(c->tls, c->base.url, reason,
	    sizeof(reason));
	diag_finish(c, err, reason);
	conn_unref(c);
	return NULL;
}

/* Whether a link that died of rv before the peer's handshake is worth a
 * diagnosis: a refused TLS handshake, or a tcp:// peer that hung up (a
 * TLS listener does, on our SP handshake). nng's TLS stream fails the
 * operations pending at a failed handshake with its error, and closes:
 * one that comes after (our SP handshake's send, on a loaded machine)
 * gets NNG_ECLOSED, and may be the first the link hears of it
 * (transport/tls test_tls_missing_client_certificate_is_refused saw
 * "send failed: Object closed" for the refusal, about 1 run in 150 at
 * load 9 to 15). */
static bool
early_death_suspect(const sconn *c, int rv)
{
	if (c->ipc || rv == 0)
		return false;
	if (rv == NNG_ECONNSHUT || rv == NNG_ECONNRESET)
		return true;
	return c->tls != NULL && (rv == NNG_EPEERAUTH || rv == NNG_ECRYPTO ||
				     rv == NNG_ECLOSED);
}

/* Starts diag_main with a reference on c; if no thread can start, the
 * orphans end at once as a dead link's requests do. */
static void
diag_start(sconn *c)
{
	pthread_attr_t a;
	pthread_t th;
	int prv;

	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	prv = pthread_create(&th, &a, diag_main, c);
	pthread_attr_destroy(&a);
	if (prv != 0) {
		diag_finish(c, CACHEW_OK, NULL);
		conn_unref(c);
	}
}

static void
cli_on_down(void *owner, slink *lk, const char *why)
{
	sconn *c = owner;
	creq *lost = NULL, **tail = &lost;
	char msg[400];
	bool drop = false, suspect, diagnose = false;

	pthread_mutex_lock(&c->mtx);
	if (c->lk == lk) {
		c->lk = NULL;
		drop = true;
	}
	if (c->hello_lk == lk) {
		/* Our hello unanswered: a listener of an older version
		 * resets a link on it. Offer no more; the requests held back
		 * for the answer go out on the next link. */
		c->hello_lk = NULL;
		c->shm_off = true;
	}
	suspect = drop && !c->closed && early_death_suspect(c, lk->early_rv);
	for (creq *x = c->reqs, *nx; x != NULL; x = nx) {
		nx = x->next;
		if (suspect && (x->lk == lk || x->lk == NULL))
			diagnose = true; /* someone waits for the verdict */
		if (x->lk != lk)
			continue;
		if (suspect) {
			x->lk = NULL;
			x->orphan = true;
			continue;
		}
		req_unlist_locked(c, x);
		*tail = x;
		tail = &x->next;
	}
	if (suspect)
		snprintf(c->orphan_why, sizeof(c->orphan_why), "%s", why);
	diagnose = diagnose && !c->diagnosing;
	if (diagnose) {
		c->diagnosing = true;
		c->refs++; /* diag_main's */
	}
	/* Redial at once after a link that lived; one that died young (a
	 * peer that hangs up at once or speaks another protocol) counts
	 * as a failed dial and backs off, as nng's dialer does. */
	if (drop && !c->closed && !c->dial_armed) {
		if (cwi_now_ns() - c->attached_ns >=
		    (uint64_t)c->rmax_ms * 1000000u) {
			c->backoff_ms = 0;
			dial_arm_locked(c, 0);
		} else {
			dial_arm_locked(c, backoff_next_locked(c));
		}
	}
	pthread_mutex_unlock(&c->mtx);
	snprintf(msg, sizeof(msg), "%s: %s", c->base.url, why);
	req_complete_all(lost, CACHEW_ECLOSED, msg);
	if (diagnose)
		diag_start(c);
	if (drop)
		cwi_nng_link_unref(lk);
}

static const link_ops cli_link_ops = {
    .on_msg = cli_on_msg,
    .on_down = cli_on_down,
    .release = cli_link_release,
};

/* Sends the requests waiting for a link on lk. With c->mtx held. */
static void
conn_send_waiting_locked(sconn *c, slink *lk)
{
	for (creq *x = c->reqs; x != NULL; x = x->next) {
		if (x->lk != NULL || x->orphan)
			continue;
		if (cwi_nng_link_send(lk, x->tx) != CACHEW_OK)
			break;
		x->tx = NULL;
		x->lk = lk;
	}
}

/* A region for lk's replies (nng_shm.c), before lk starts: the client's
 * half of the same-host path. Nothing when it cannot be made (no
 * /dev/shm): the replies come through the socket. With c->mtx held. */
static void
conn_offer_shm_locked(sconn *c, slink *lk)
{
	if (c->shm_bytes == 0 || c->shm_off || c->tls != NULL)
		return;
	if (cwi_nng_shm_create(&lk->shm, c->shm_bytes) != CACHEW_OK) {
		cwi_log(CACHEW_LOG_DEBUG, "transport", "url=%s event=shm_off "
		    "reason=\"%s\"", c->base.url, cwi_errmsg_get());
		c->shm_off = true;
	}
}

/* The hello naming lk's region, first on the link. With c->mtx held. */
static void
conn_send_hello_locked(sconn *c, slink *lk)
{
	uint8_t id[SP_ID_BYTES], hello[FRAME_CTL_MAX];
	size_t len = cwi_nng_shm_hello(lk->shm, hello);
	txmsg *t;

	c->hello_id = SP_ID_FLAG | c->next_id++;
	cwi_nng_put_u32(id, c->hello_id);
	if (cwi_nng_tx_build_ctl(&t, c->ipc, id, sizeof(id),
		FRAME_KIND_SHM_HELLO, hello, len) != CACHEW_OK)
		return; /* no hello: the listener never uses the region */
	if (cwi_nng_link_send(lk, t) != CACHEW_OK) {
		cwi_nng_tx_free(t);
		return;
	}
	c->hello_lk = lk;
}

/* Makes s the connection's link and sends the waiting requests on it.
 * With c->mtx held. */
static void
conn_attach_locked(sconn *c, slink *lk)
{
	c->lk = lk;
	c->attached_ns = cwi_now_ns();
	c->reached = true;
	if (c->unreachable) {
		c->unreachable = false;
		c->refused = CACHEW_OK;
	}
	conn_offer_shm_locked(c, lk);
	cwi_nng_link_start(lk);
	if (lk->shm != NULL)
		conn_send_hello_locked(c, lk);
	/* With a hello out, the requests wait for its answer: a listener
	 * of an older version resets the link on it, and those it never
	 * read then go out on the next link instead of failing. */
	if (c->hello_lk != lk)
		conn_send_waiting_locked(c, lk);
}

/* A dial failed with nng's rv: a peer never reached becomes unreachable
 * once its dials have failed for unreachable_ms (see the top of the
 * file). Returns the requests waiting for a link, unlisted, to complete
 * with c->refusal then (NULL otherwise). With c->mtx held. */
static creq *
dial_failed_locked(sconn *c, int rv)
{
	creq *done = NULL, **tail = &done;
	uint64_t now = cwi_now_ns(), for_ms;

	if (c->reached || c->unreachable_ms <= 0)
		return NULL;
	if (c->dial_fails++ == 0)
		c->first_fail_ns = now;
	for_ms = (now - c->first_fail_ns) / 1000000u;
	if (c->unreachable || c->refused != CACHEW_OK ||
	    for_ms < (uint64_t)c->unreachable_ms)
		return NULL;
	c->unreachable = true;
	c->refused = CACHEW_EIO;
	snprintf(c->refusal, sizeof(c->refusal), "%s: %s (%u dials in %llu "
	    "ms, none connected)", c->base.url, nng_strerror(rv),
	    c->dial_fails, (unsigned long long)for_ms);
	for (creq *x = c->reqs, *nx; x != NULL; x = nx) {
		nx = x->next;
		if (x->lk != NULL || x->orphan)
			continue;
		req_unlist_locked(c, x);
		*tail = x;
		tail = &x->next;
	}
	return done;
}

static bool
nt_conn_unreachable(cwi_conn *cc)
{
	sconn *c = (sconn *)cc;
	bool unreachable;

	pthread_mutex_lock(&c->mtx);
	unreachable = c->unreachable && c->lk == NULL;
	pthread_mutex_unlock(&c->mtx);
	return unreachable;
}

static void
cli_dial_cb(void *arg)
{
	sconn *c = arg;
	int rv = nng_aio_result(c->dial);
	nng_stream *s = NULL;
	slink *lk = NULL;
	cachew_err err;

	pthread_mutex_lock(&c->mtx);
	c->dial_armed = false;
	if (!c->dial_sleeping && rv == 0)
		s = nng_aio_get_output(c->dial, 0);
	if (c->closed) {
		pthread_mutex_unlock(&c->mtx);
		if (s != NULL) {
			nng_stream_close(s);
			nng_stream_free(s);
		}
		return;
	}
	if (c->dial_sleeping) {
		dial_arm_locked(c, 0);
		pthread_mutex_unlock(&c->mtx);
		return;
	}
	if (rv != 0) {
		creq *failed = dial_failed_locked(c, rv);
		char msg[sizeof(c->refusal)];

		if (failed != NULL)
			memcpy(msg, c->refusal, sizeof(msg));
		dial_arm_locked(c, backoff_next_locked(c));
		pthread_mutex_unlock(&c->mtx);
		req_complete_all(failed, CACHEW_EIO, msg);
		return;
	}
	c->refs++; /* the link's */
	pthread_mutex_unlock(&c->mtx);

	err = cwi_nng_link_create(&lk, s, c->ipc, SP_PROTO_REQ0, SP_PROTO_REP0,
	    &cli_link_ops, c, c->base.url, c->max_msg + SP_ID_BYTES,
	    c->send_timeout_ms, c->tls);
	pthread_mutex_lock(&c->mtx);
	if (err != CACHEW_OK) {
		c->refs--;
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "url=%s reason=\"connection dropped: %s\"", c->base.url,
		    cwi_errmsg_get());
		c->backoff_ms = 0;
		dial_arm_locked(c, backoff_next_locked(c));
	} else if (!c->closed) {
		conn_attach_locked(c, lk);
		lk = NULL;
	}
	pthread_mutex_unlock(&c->mtx);
	if (lk != NULL) {
		cwi_nng_link_kill(lk, "connection closed");
		cwi_nng_link_unref(lk);
	}
}

static void
cli_reap_cb(void *arg)
{
	sconn *c = arg;
	creq *q;

	pthread_mutex_lock(&c->mtx);
	q = c->reap;
	c->reap = NULL;
	c->reap_armed = false;
	pthread_mutex_unlock(&c->mtx);
	req_complete_all(q, CACHEW_ETIMEDOUT, "request timed out");
}

/* The deadline of x's request passed (see cwi_pending_set_cancel): its
 * completion goes to the reaper, off the queue's lock. */
static void
cli_cancel(void *arg, cwi_pending *p)
{
	creq *x = arg;
	sconn *c = x->c;

	(void)p;
	pthread_mutex_lock(&c->mtx);
	if (x->listed) {
		req_unlist_locked(c, x);
		x->next = c->reap;
		c->reap = x;
		if (!c->reap_armed && !c->closed) {
			c->reap_armed = true;
			nng_sleep_aio(0, c->reap_aio);
		}
	} else {
		x->expired = true;
	}
	pthread_mutex_unlock(&c->mtx);
}

static cachew_err
nt_send(cwi_conn *cc, cwi_msg *req, cwi_pending *p)
{
	sconn *c = (sconn *)cc;
	creq *x = calloc(1, sizeof(*x));
	uint8_t id[SP_ID_BYTES];
	cachew_err rv, err;
	bool closed;

	if (x == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_lock(&c->mtx);
	closed = c->closed;
	x->id = SP_ID_FLAG | c->next_id++;
	pthread_mutex_unlock(&c->mtx);
	if (closed) {
		free(x);
		return cwi_fail(CACHEW_ECLOSED, "%s: connection is closed",
		    c->base.url);
	}
	cwi_nng_put_u32(id, x->id);
	rv = cwi_nng_tx_build(&x->tx, c->ipc, id, sizeof(id), req);
	if (rv != CACHEW_OK) {
		free(x);
		return rv;
	}
	x->c = c;
	x->p = p;
	/* The queue's lock may not be taken under ours: the hook is set
	 * before x is listed, and a deadline passing in between marks x. */
	cwi_pending_set_cancel(p, cli_cancel, x);

	pthread_mutex_lock(&c->mtx);
	if (c->closed || x->expired ||
	    (c->lk == NULL && c->refused != CACHEW_OK)) {
		/* Closed, expired, or refused by the peer (fail fast while
		 * no link is up: see the top of the file). */
		char msg[sizeof(c->refusal)];
		err = c->closed ? CACHEW_ECLOSED
		    : x->expired ? CACHEW_ETIMEDOUT : c->refused;
		snprintf(msg, sizeof(msg), "%s", err == CACHEW_ECLOSED
			? "connection closed" : err == CACHEW_ETIMEDOUT
			? "request timed out" : c->refusal);
		pthread_mutex_unlock(&c->mtx);
		/* Accepted, then ended before it left: complete it here,
		 * and free x only then: until p completes, its cancel hook
		 * may still run with x (cwi_pending_set_cancel). */
		cwi_nng_tx_free(x->tx);
		x->tx = NULL;
		cwi_msg_destroy(req);
		cwi_pending_complete(p, err, NULL, msg);
		free(x);
		return CACHEW_OK;
	}
	x->tx->msg = req;
	x->listed = true;
	x->prev = c->reqs_tail;
	if (c->reqs_tail != NULL)
		c->reqs_tail->next = x;
	else
		c->reqs = x;
	c->reqs_tail = x;
	if (c->lk != NULL && c->hello_lk != c->lk &&
	    cwi_nng_link_send(c->lk, x->tx) == CACHEW_OK) {
		x->tx = NULL;
		x->lk = c->lk;
	}
	pthread_mutex_unlock(&c->mtx);
	return CACHEW_OK;
}

static void
nt_conn_close(cwi_conn *cc)
{
	sconn *c = (sconn *)cc;
	creq *all, *reaped;
	slink *lk;
	char msg[300];

	pthread_mutex_lock(&c->mtx);
	if (c->closed) {
		pthread_mutex_unlock(&c->mtx);
		return;
	}
	c->closed = true;
	lk = c->lk;
	c->lk = NULL;
	all = c->reqs;
	for (creq *x = all; x != NULL; x = x->next)
		x->listed = false;
	c->reqs = c->reqs_tail = NULL;
	pthread_mutex_unlock(&c->mtx);
	if (lk != NULL) {
		cwi_nng_link_kill(lk, "connection closed");
		cwi_nng_link_unref(lk);
	}
	snprintf(msg, sizeof(msg), "%s: connection closed", c->base.url);
	req_complete_all(all, CACHEW_ECLOSED, msg);
	nng_stream_dialer_close(c->d);
	nng_aio_stop(c->dial);
	nng_aio_stop(c->reap_aio);
	pthread_mutex_lock(&c->mtx);
	reaped = c->reap;
	c->reap = NULL;
	pthread_mutex_unlock(&c->mtx);
	req_complete_all(reaped, CACHEW_ETIMEDOUT, "request timed out");
}

static void
nt_conn_free(cwi_conn *cc)
{
	conn_unref((sconn *)cc);
}

static const cwi_conn_ops nt_conn_ops = {
    .send = nt_send,
    .close = nt_conn_close,
    .free = nt_conn_free,
    .unreachable = nt_conn_unreachable,
};

cachew_err
cwi_nng_dial(cwi_conn **out, const char *url, const cwi_transport_opts *opts)
{
	sconn *c = calloc(1, sizeof(*c));
	nng_aio *a = NULL;
	nng_stream *s;
	slink *lk;
	cachew_err rv;
	int nrv;
	bool own_tls = cwi_nng_url_is_tls(url) && cwi_nng_tls_own_layer();
	char *stream_url;

	if ((rv = cwi_nng_fork_check(url)) != CACHEW_OK) {
		free(c);
		return rv;
	}
	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&c->mtx, NULL);
	c->base.ops = &nt_conn_ops;
	c->refs = 1;
	c->ipc = strncmp(url, "ipc://", 6) == 0;
	c->max_msg = opts->max_msg_size;
	c->send_timeout_ms = opts->send_timeout_ms;
	c->rmin_ms = opts->reconnect_min_ms;
	c->rmax_ms = opts->reconnect_max_ms;
	c->unreachable_ms = opts->unreachable_after_ms;
	c->shm_bytes = cwi_nng_shm_enabled() && !cwi_nng_url_is_tls(url)
			   ? opts->shm_bytes : 0;
	c->next_id = (uint32_t)cwi_now_ns() & 0x7fffffffu;
	c->jitter.state = cwi_now_ns() ^ (uint64_t)(uintptr_t)c;
	c->base.url = cwi_strdup(url);
	if (c->base.url == NULL) {
		conn_free(c);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	/* A user's process: only if asked (CACHEW_MALLOPT=1). */
	cwi_heap_tune(false);
	/* cachew's TLS layer dials tcp:// and runs TLS on the link. */
	if ((stream_url = cwi_nng_tls_stream_url(url, own_tls)) == NULL) {
		conn_free(c);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	nrv = nng_stream_dialer_alloc(&c->d, stream_url);
	free(stream_url);
	if (nrv != 0 ||
	    (nrv = nng_aio_alloc(&c->dial, cli_dial_cb, c)) != 0 ||
	    (nrv = nng_aio_alloc(&c->reap_aio, cli_reap_cb, c)) != 0) {
		rv = cwi_nng_err(nrv, url, "dial");
		conn_free(c);
		return rv;
	}
	if (cwi_nng_url_is_tls(url)) {
		rv = cwi_nng_tls_create(&c->tls, url, opts, false, own_tls);
		if (rv == CACHEW_OK &&
		    (nrv = cwi_nng_tls_set_dialer(c->tls, c->d)) != 0)
			rv = cwi_nng_err(nrv, url, "dial");
		if (rv != CACHEW_OK) {
			conn_free(c);
			return rv;
		}
	}
	if (opts->dial_async) {
		pthread_mutex_lock(&c->mtx);
		dial_arm_locked(c, 0);
		pthread_mutex_unlock(&c->mtx);
		*out = &c->base;
		return CACHEW_OK;
	}
	if ((nrv = nng_aio_alloc(&a, NULL, NULL)) != 0) {
		rv = cwi_nng_err(nrv, url, "nng_aio_alloc");
		conn_free(c);
		return rv;
	}
	nng_aio_set_timeout(a, DIAL_TIMEOUT_MS);
	nng_stream_dialer_dial(c->d, a);
	nng_aio_wait(a);
	if ((nrv = nng_aio_result(a)) != 0) {
		nng_aio_free(a);
		rv = cwi_nng_err(nrv, url, "dial");
		conn_free(c);
		return rv;
	}
	s = nng_aio_get_output(a, 0);
	nng_aio_free(a);
	rv = cwi_nng_link_create(&lk, s, c->ipc, SP_PROTO_REQ0, SP_PROTO_REP0,
	    &cli_link_ops, c, c->base.url, c->max_msg + SP_ID_BYTES,
	    c->send_timeout_ms, c->tls);
	if (rv != CACHEW_OK) {
		conn_free(c);
		return rv;
	}
	pthread_mutex_lock(&c->mtx);
	c->refs++; /* the link's */
	conn_attach_locked(c, lk);
	pthread_mutex_unlock(&c->mtx);
	*out = &c->base;
	return CACHEW_OK;
}
