/*
 * nng_link.c - a link: one connected stream of the nng transport. It
 * sends the SP handshake, then a send queue written with writev (up to 8
 * iovecs a call, across messages), and runs a receive loop that reads
 * each message whole into one buffer and hands it to the link's owner (a
 * listener, nng_listen.c, or a connection, nng_dial.c). At a listener the
 * buffer grows as the bytes arrive, within the listener's budget (rx_budget
 * in nng_int.h), and a message must come whole within the send timeout: a
 * length field is a claim, not a reservation. A link's death is
 * reported to its owner once (on_down), always from the receive path.
 * What the bytes mean is nng_frame.c's: a link only moves them.
 *
 * Lifetime: links are reference counted (their owner holds one, each
 * server request one). The last reference hands the link to the
 * janitor, a thread that stops its aios and frees the stream: nng_aio_stop
 * may not run on the aio's own callback, where the last reference often
 * goes.
 *
 * Locking: a link's mutex comes last, after its owner's (the listener's
 * or the connection's, and cq->mtx before those); the janitor's mutex is
 * a leaf, never held with another. The owner callbacks (on_msg, on_down,
 * release) run with no lock held. nng runs an aio callback on its own
 * task threads, never on the thread that starts the operation, so
 * operations are started with the link's mutex held.
 */
#include "nng_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* A peer that does not finish its handshake in this time is dropped. */
#define HANDSHAKE_TIMEOUT_MS 10000

/* The remote address of a stream, for logs. */
static void
stream_peer(nng_stream *s, bool ipc, bool tls, char *buf, size_t len)
{
	const char *tcp = tls ? "tls+tcp" : "tcp";
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	if (nng_stream_get_addr(s, NNG_OPT_REMADDR, &sa) != 0) {
		snprintf(buf, len, "%s://?", ipc ? "ipc" : tcp);
		return;
	}
	switch (sa.s_family) {
	case NNG_AF_INET:
		inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s://%s:%u", tcp, ip,
		    ntohs(sa.s_in.sa_port));
		break;
	case NNG_AF_INET6:
		inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s://[%s]:%u", tcp, ip,
		    ntohs(sa.s_in6.sa_port));
		break;
	case NNG_AF_IPC:
		snprintf(buf, len, "ipc://%s", sa.s_ipc.sa_path);
		break;
	default:
		snprintf(buf, len, "%s://?", ipc ? "ipc" : tcp);
		break;
	}
}

/* Why a link that is not dead yet dies of rv (a failed send or
 * receive): before the peer's handshake, on a TLS link, the refused
 * handshake, logged by a listener; NULL for the caller's usual reason.
 * Either way, an early death is noted for the owner (early_rv). */
static const char *
early_death_locked(slink *lk, int rv, char *buf, size_t len)
{
	bool server = lk->peer_proto == SP_PROTO_REQ0;
	const char *why;

	if (lk->rx != RX_HANDSHAKE)
		return NULL;
	lk->early_rv = rv;
	if (!lk->tls || (why = cwi_nng_tls_refusal(rv, server)) == NULL)
		return NULL;
	snprintf(buf, len, "TLS handshake refused: %s", why);
	if (server)
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer,
		    lk->url, buf);
	return buf;
}

/* ---- the janitor: frees links off the aio threads ----------------------- */

static pthread_mutex_t jan_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jan_cv = PTHREAD_COND_INITIALIZER;
static slink *jan_q;
static bool jan_running;
static pthread_once_t jan_once = PTHREAD_ONCE_INIT;

static void
link_destroy(slink *lk)
{
	void *owner = lk->owner;
	const link_ops *ops = lk->ops;

	nng_aio_stop(lk->txa);
	nng_aio_stop(lk->rxa);
	nng_stream_free(lk->s);
	nng_aio_free(lk->txa);
	nng_aio_free(lk->rxa);
	cwi_nng_tx_free_list(lk->txq);
	if (lk->rxbuf != NULL && lk->budget != NULL)
		cwi_nng_budget_give(lk, lk->rxbuf->size);
	cwi_buffer_unref(lk->rxbuf);
	pthread_mutex_destroy(&lk->mtx);
	free(lk);
	ops->release(owner);
}

static void *
jan_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&jan_mtx);
	for (;;) {
		slink *q;

		while (jan_q == NULL)
			pthread_cond_wait(&jan_cv, &jan_mtx);
		q = jan_q;
		jan_q = NULL;
		pthread_mutex_unlock(&jan_mtx);
		while (q != NULL) {
			slink *nx = q->jnext;
			link_destroy(q);
			q = nx;
		}
		pthread_mutex_lock(&jan_mtx);
	}
	return NULL;
}

/* A child of fork() has no janitor thread: it starts its own. The links
 * queued in the parent are left (their aio threads are gone too). */
static void
jan_atfork_child(void)
{
	pthread_mutex_init(&jan_mtx, NULL);
	pthread_cond_init(&jan_cv, NULL);
	jan_q = NULL;
	jan_running = false;
}

static void
jan_init(void)
{
	pthread_atfork(NULL, NULL, jan_atfork_child);
}

static void
jan_push(slink *lk)
{
	pthread_once(&jan_once, jan_init);
	pthread_mutex_lock(&jan_mtx);
	if (!jan_running) {
		pthread_attr_t a;
		pthread_t th;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		jan_running = pthread_create(&th, &a, jan_main, NULL) == 0;
		pthread_attr_destroy(&a);
		if (!jan_running) {
			pthread_mutex_unlock(&jan_mtx);
			cwi_log(CACHEW_LOG_ERROR, "transport",
			    "url=%s reason=\"cannot start the janitor thread: "
			    "%s\" action=leak",
			    lk->url, strerror(errno));
			return;
		}
	}
	lk->jnext = jan_q;
	jan_q = lk;
	pthread_cond_signal(&jan_cv);
	pthread_mutex_unlock(&jan_mtx);
}

void
cwi_nng_link_ref(slink *lk)
{
	pthread_mutex_lock(&lk->mtx);
	lk->refs++;
	pthread_mutex_unlock(&lk->mtx);
}

void
cwi_nng_link_unref(slink *lk)
{
	bool last;

	pthread_mutex_lock(&lk->mtx);
	last = --lk->refs == 0;
	pthread_mutex_unlock(&lk->mtx);
	if (last)
		jan_push(lk);
}

/* ---- link: sending ------------------------------------------------------ */

/* Writes what the queue holds, up to TX_IOV iovecs across messages. */
static void
tx_arm_locked(slink *lk)
{
	unsigned n = 0;

	for (txmsg *t = lk->txq; t != NULL && n < TX_IOV; t = t->next) {
		for (unsigned i = t == lk->txq ? t->cur : 0;
		     i < t->niov && n < TX_IOV; i++) {
			size_t off = t == lk->txq && i == t->cur ? t->off : 0;
			lk->txv[n].iov_buf = (uint8_t *)t->iov[i].iov_buf + off;
			lk->txv[n].iov_len = t->iov[i].iov_len - off;
			n++;
		}
	}
	(void)nng_aio_set_iov(lk->txa, n, lk->txv);
	nng_aio_set_timeout(lk->txa, lk->send_timeout_ms);
	lk->txbusy = true;
	nng_stream_send(lk->s, lk->txa);
}

/* Marks lk dead and closes its stream (the pending operations then end
 * with an error). The receive path reports the death; a parked one is
 * woken for that. Returns the send queue to free when no send is in
 * nng (else the send callback frees it). */
static txmsg *
link_kill_locked(slink *lk, const char *why)
{
	txmsg *q = NULL;

	if (!lk->dead) {
		lk->dead = true;
		snprintf(lk->why, sizeof(lk->why), "%s", why);
		nng_stream_close(lk->s);
		/* A link parks only while alive, so this is the one moment
		 * it can be parked and dying: nothing would call the receive
		 * callback, so a zero sleep does, and it reports the death. */
		if (lk->rx == RX_PARKED)
			nng_sleep_aio(0, lk->rxa);
	}
	if (!lk->txbusy) {
		q = lk->txq;
		lk->txq = lk->txtail = NULL;
	}
	return q;
}

void
cwi_nng_link_kill(slink *lk, const char *why)
{
	txmsg *q;

	pthread_mutex_lock(&lk->mtx);
	q = link_kill_locked(lk, why);
	pthread_mutex_unlock(&lk->mtx);
	cwi_nng_tx_free_list(q);
}

/* Logs a WARN line for a peer that broke the protocol and kills lk. */
void
cwi_nng_link_reset(slink *lk, const char *reason)
{
	cwi_log(CACHEW_LOG_WARN, "transport",
	    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer, lk->url,
	    reason);
	cwi_nng_link_kill(lk, reason);
}

/* Queues t; on CACHEW_ECLOSED (the link is dead) the caller keeps it. */
cachew_err
cwi_nng_link_send(slink *lk, txmsg *t)
{
	pthread_mutex_lock(&lk->mtx);
	if (lk->dead) {
		pthread_mutex_unlock(&lk->mtx);
		return CACHEW_ECLOSED;
	}
	t->next = NULL;
	if (lk->txtail != NULL)
		lk->txtail->next = t;
	else
		lk->txq = t;
	lk->txtail = t;
	if (!lk->txbusy)
		tx_arm_locked(lk);
	pthread_mutex_unlock(&lk->mtx);
	return CACHEW_OK;
}

static void
link_tx_cb(void *arg)
{
	slink *lk = arg;
	int rv = nng_aio_result(lk->txa);
	size_t n = nng_aio_count(lk->txa);
	txmsg *done = NULL, **tail = &done;

	pthread_mutex_lock(&lk->mtx);
	lk->txbusy = false;
	if (rv != 0 || lk->dead) {
		char why[300];

		if (lk->dead || rv == 0 ||
		    early_death_locked(lk, rv, why, sizeof(why)) == NULL) {
			if (rv == NNG_ETIMEDOUT)
				snprintf(why, sizeof(why),
				    "the peer read nothing for %d ms",
				    lk->send_timeout_ms);
			else
				snprintf(why, sizeof(why), "send failed: %s",
				    rv != 0 ? nng_strerror(rv) : "closed");
		}
		if (rv == NNG_ETIMEDOUT && !lk->dead)
			cwi_log(CACHEW_LOG_WARN, "transport",
			    "peer=%s url=%s reason=\"%s\" action=reset",
			    lk->peer, lk->url, why);
		done = link_kill_locked(lk, why);
		pthread_mutex_unlock(&lk->mtx);
		cwi_nng_tx_free_list(done);
		return;
	}
	/* Consume n bytes from the head of the queue. */
	while (lk->txq != NULL) {
		txmsg *t = lk->txq;

		while (t->cur < t->niov) {
			size_t left = t->iov[t->cur].iov_len - t->off;
			if (n < left) {
				t->off += n;
				n = 0;
				break;
			}
			n -= left;
			t->cur++;
			t->off = 0;
		}
		if (t->cur < t->niov)
			break;
		lk->txq = t->next;
		if (lk->txq == NULL)
			lk->txtail = NULL;
		t->next = NULL;
		*tail = t;
		tail = &t->next;
	}
	if (lk->txq != NULL)
		tx_arm_locked(lk);
	pthread_mutex_unlock(&lk->mtx);
	/* The messages (and their elements) go outside the lock. */
	cwi_nng_tx_free_list(done);
}

/* ---- link: the receive budget ------------------------------------------ */

/* A burst this large that is over (the budget back under an eighth of it)
 * gives memory back to the system. */
#define BUDGET_RELEASE_PEAK ((size_t)8 << 20)

void
cwi_nng_link_set_budget(slink *lk, rx_budget *b)
{
	lk->budget = b;
}

/* Takes n more bytes of lk's budget. NULL when granted, else the reason
 * (written into buf). The first RX_FIRST bytes of a message are granted
 * within the link's share whatever the total: when peers that trickle
 * large messages hold the total, the small requests of the others still
 * come in (a listener holds at most RX_FIRST per connection more). */
static const char *
budget_take(slink *lk, size_t n, bool first, char *buf, size_t len)
{
	rx_budget *b = lk->budget;
	size_t mine = atomic_load(&lk->charged), used, peak;

	if (mine + n > b->link_limit) {
		snprintf(buf, len, "connection would hold %zu bytes of "
		    "messages received and requests unanswered, over its limit "
		    "of %zu", mine + n, b->link_limit);
		return buf;
	}
	used = atomic_fetch_add(&b->used, n) + n;
	if (used > b->limit && !first) {
		atomic_fetch_sub(&b->used, n);
		snprintf(buf, len, "listener would hold %zu bytes of messages "
		    "received and requests unanswered across its connections, "
		    "over its limit of %zu", used, b->limit);
		return buf;
	}
	atomic_fetch_add(&lk->charged, n);
	peak = atomic_load(&b->peak);
	while (used > peak && !atomic_compare_exchange_weak(&b->peak, &peak,
				  used)) {
	}
	return NULL;
}

void
cwi_nng_budget_give(slink *lk, size_t n)
{
	rx_budget *b = lk->budget;
	size_t used, peak;

	if (b == NULL || n == 0)
		return;
	atomic_fetch_sub(&lk->charged, n);
	used = atomic_fetch_sub(&b->used, n) - n;
	peak = atomic_load(&b->peak);
	if (peak >= BUDGET_RELEASE_PEAK && used < peak / 8 &&
	    atomic_compare_exchange_strong(&b->peak, &peak, used)) {
		cwi_log(CACHEW_LOG_INFO, "transport",
		    "url=%s event=heap_released reason=\"peers held %zu bytes, "
		    "now %zu\"", lk->url, peak, used);
		cwi_heap_release();
	}
}

/* ---- link: receiving ---------------------------------------------------- */

static void
rx_arm_locked(slink *lk)
{
	nng_duration ms = NNG_DURATION_INFINITE;
	nng_iov v;

	if (lk->rx == RX_BODY) {
		v.iov_buf = lk->rxbuf->data + lk->got;
		v.iov_len = lk->rxbuf->size - lk->got;
	} else {
		v.iov_buf = lk->rxhead + lk->got;
		v.iov_len = lk->need - lk->got;
	}
	if (lk->rx == RX_HANDSHAKE) {
		ms = HANDSHAKE_TIMEOUT_MS;
	} else if (lk->rx == RX_BODY && lk->budget != NULL) {
		uint64_t now = cwi_now_ns();
		ms = now < lk->rx_deadline_ns
			 ? (nng_duration)((lk->rx_deadline_ns - now) / 1000000u)
			 : 0;
		if (ms < 1)
			ms = 1;
	}
	(void)nng_aio_set_iov(lk->rxa, 1, &v);
	nng_aio_set_timeout(lk->rxa, ms);
	nng_stream_recv(lk->s, lk->rxa);
}

static void
rx_expect_head_locked(slink *lk)
{
	lk->rx = RX_HEAD;
	lk->got = 0;
	lk->need = cwi_nng_sp_prefix(lk->ipc);
}

/* The length prefix is in: checks it and sets up the body's read.
 * NULL when good, else the reason. */
static const char *
head_check_locked(slink *lk, char *buf, size_t len)
{
	const char *bad;
	size_t n;

	bad = cwi_nng_prefix_decode(lk->rxhead, lk->ipc, lk->max_len,
	    lk->id_room, &n, buf, len);
	if (bad != NULL)
		return bad;
	lk->rx = RX_BODY;
	lk->got = 0;
	lk->need = n;
	if (lk->budget == NULL)
		return cwi_buffer_alloc(&lk->rxbuf, n, false) == CACHEW_OK
			   ? NULL : strcpy(buf, "out of memory");
	/* Under a budget: the first bytes only, more as they come. */
	lk->rx_deadline_ns = cwi_now_ns() +
	    (uint64_t)lk->send_timeout_ms * 1000000u;
	bad = budget_take(lk, n < RX_FIRST ? n : RX_FIRST, true, buf, len);
	if (bad != NULL)
		return bad;
	if (cwi_buffer_alloc(&lk->rxbuf, n < RX_FIRST ? n : RX_FIRST, false) !=
	    CACHEW_OK) {
		cwi_nng_budget_give(lk, n < RX_FIRST ? n : RX_FIRST);
		return strcpy(buf, "out of memory");
	}
	return NULL;
}

/* The message's buffer is full and more is coming: doubles it (up to the
 * message's length) within the budget. NULL when done, else the reason. */
static const char *
rx_grow_locked(slink *lk, char *buf, size_t len)
{
	size_t have = lk->rxbuf->size;
	size_t want = have * 2 < lk->need ? have * 2 : lk->need;
	cwi_buffer *nb;
	const char *bad;

	bad = budget_take(lk, want - have, false, buf, len);
	if (bad != NULL)
		return bad;
	if (cwi_buffer_alloc(&nb, want, false) != CACHEW_OK) {
		cwi_nng_budget_give(lk, want - have);
		return strcpy(buf, "out of memory");
	}
	memcpy(nb->data, lk->rxbuf->data, lk->got);
	cwi_buffer_unref(lk->rxbuf);
	lk->rxbuf = nb;
	return NULL;
}

/* A whole message is in: hands it to the owner with no lock held, then
 * reads on, or parks if the owner wants no more for now. With lk->mtx
 * held on entry and on return; false when the link died meanwhile. */
static bool
rx_deliver_locked(slink *lk)
{
	cwi_buffer *msg = lk->rxbuf;
	bool more;

	lk->rxbuf = NULL;
	lk->rx = RX_DELIVER;
	pthread_mutex_unlock(&lk->mtx);
	more = lk->ops->on_msg(lk->owner, lk, msg);
	pthread_mutex_lock(&lk->mtx);
	if (lk->dead)
		return false;
	rx_expect_head_locked(lk);
	if (more || lk->resume_wanted) {
		lk->resume_wanted = false;
		rx_arm_locked(lk);
	} else {
		lk->rx = RX_PARKED;
	}
	return true;
}

static void
link_rx_cb(void *arg)
{
	slink *lk = arg;
	int rv = nng_aio_result(lk->rxa);
	size_t n = nng_aio_count(lk->rxa);
	char why[300];
	const char *bad = NULL;
	txmsg *q = NULL;

	pthread_mutex_lock(&lk->mtx);
	if (!lk->dead && rv != 0) {
		if (rv == NNG_ETIMEDOUT && lk->rx == RX_HANDSHAKE) {
			snprintf(why, sizeof(why),
			    "no handshake within %d ms", HANDSHAKE_TIMEOUT_MS);
			bad = why;
		} else if (early_death_locked(lk, rv, why, sizeof(why)) !=
			   NULL) {
			q = link_kill_locked(lk, why);
		} else if (rv == NNG_ETIMEDOUT && lk->rx == RX_BODY) {
			snprintf(why, sizeof(why), "a message of %zu bytes did "
			    "not come whole within %d ms (%zu came)", lk->need,
			    lk->send_timeout_ms, lk->got + n);
			bad = why;
		} else {
			q = link_kill_locked(lk,
			    rv == NNG_ECLOSED || rv == NNG_ECONNSHUT ||
				    rv == NNG_ECONNRESET
				? "connection reset by peer"
				: nng_strerror(rv));
		}
	}
	if (!lk->dead && bad == NULL) {
		lk->got += n;
		if (lk->got < lk->need && lk->rx == RX_BODY &&
		    lk->got == lk->rxbuf->size)
			bad = rx_grow_locked(lk, why, sizeof(why));
		if (bad == NULL && lk->got < lk->need) {
			rx_arm_locked(lk);
			pthread_mutex_unlock(&lk->mtx);
			return;
		}
	}
	if (!lk->dead && bad == NULL) {
		switch (lk->rx) {
		case RX_HANDSHAKE:
			bad = cwi_nng_handshake_check(lk->rxhead,
			    lk->peer_proto, why, sizeof(why));
			if (bad == NULL) {
				rx_expect_head_locked(lk);
				rx_arm_locked(lk);
				pthread_mutex_unlock(&lk->mtx);
				return;
			}
			break;
		case RX_HEAD:
			bad = head_check_locked(lk, why, sizeof(why));
			if (bad == NULL) {
				rx_arm_locked(lk);
				pthread_mutex_unlock(&lk->mtx);
				return;
			}
			break;
		case RX_BODY:
			if (rx_deliver_locked(lk)) {
				pthread_mutex_unlock(&lk->mtx);
				return;
			}
			break;
		default:
			break;
		}
	}
	if (bad != NULL) {
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer,
		    lk->url, bad);
		q = link_kill_locked(lk, bad);
	}
	/* Dead: report it once. */
	if (lk->rx == RX_DOWN) {
		pthread_mutex_unlock(&lk->mtx);
		cwi_nng_tx_free_list(q);
		return;
	}
	lk->rx = RX_DOWN;
	snprintf(why, sizeof(why), "%s", lk->why);
	pthread_mutex_unlock(&lk->mtx);
	cwi_nng_tx_free_list(q);
	lk->ops->on_down(lk->owner, lk, why);
}

/* Reading again after on_msg returned false. */
void
cwi_nng_link_resume(slink *lk)
{
	pthread_mutex_lock(&lk->mtx);
	if (lk->rx == RX_PARKED && !lk->dead) {
		rx_expect_head_locked(lk);
		rx_arm_locked(lk);
	} else if (lk->rx == RX_DELIVER) {
		lk->resume_wanted = true;
	}
	pthread_mutex_unlock(&lk->mtx);
}

/*
 * A link over a connected stream s (taken, even on failure), with one
 * reference for the owner. It sends its handshake (my_proto) and starts
 * reading; the caller adds it to its lists before anything can arrive
 * (the first callback needs the peer's handshake first).
 */
cachew_err
cwi_nng_link_create(slink **out, nng_stream *s, bool ipc, uint16_t my_proto,
    uint16_t peer_proto, const link_ops *ops, void *owner, const char *url,
    size_t max_len, int send_timeout_ms)
{
	slink *lk = calloc(1, sizeof(*lk));
	txmsg *hs;
	bool verified;
	int rv;

	if (lk == NULL) {
		nng_stream_free(s);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	if ((rv = nng_aio_alloc(&lk->txa, link_tx_cb, lk)) != 0 ||
	    (rv = nng_aio_alloc(&lk->rxa, link_rx_cb, lk)) != 0) {
		nng_aio_free(lk->txa);
		nng_stream_free(s);
		free(lk);
		return cwi_nng_err(rv, url, "nng_aio_alloc");
	}
	pthread_mutex_init(&lk->mtx, NULL);
	lk->refs = 1;
	lk->s = s;
	lk->ipc = ipc;
	lk->peer_proto = peer_proto;
	lk->ops = ops;
	lk->owner = owner;
	lk->url = url;
	lk->max_len = max_len;
	lk->id_room = peer_proto == SP_PROTO_REQ0 ? SP_BT_MAX : SP_ID_BYTES;
	lk->send_timeout_ms = send_timeout_ms;
	/* Only a TLS stream knows this option. */
	lk->tls = nng_stream_get_bool(s, NNG_OPT_TLS_VERIFIED, &verified) == 0;
	stream_peer(s, ipc, lk->tls, lk->peer, sizeof(lk->peer));
	if (!ipc)
		(void)nng_stream_set_bool(s, NNG_OPT_TCP_NODELAY, true);
	/* The handshake is the first thing sent: a message of its own. */
	if (cwi_nng_tx_handshake(&hs, my_proto) != CACHEW_OK) {
		nng_aio_free(lk->txa);
		nng_aio_free(lk->rxa);
		nng_stream_free(s);
		pthread_mutex_destroy(&lk->mtx);
		free(lk);
		return CACHEW_ENOMEM;
	}
	lk->txq = lk->txtail = hs;
	*out = lk;
	return CACHEW_OK;
}

/* Starts the handshake: sends ours, reads theirs. */
void
cwi_nng_link_start(slink *lk)
{
	pthread_mutex_lock(&lk->mtx);
	lk->rx = RX_HANDSHAKE;
	lk->got = 0;
	lk->need = SP_HANDSHAKE;
	rx_arm_locked(lk);
	if (lk->txq != NULL && !lk->txbusy)
		tx_arm_locked(lk);
	pthread_mutex_unlock(&lk->mtx);
}
