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
 * tls+tcp on cachew's record layer (lk->rec, nng_tls_record.c): the
 * stream is plain tcp and the link runs the TLS handshake before the SP
 * one. Sending encrypts up to TLS_TX_BATCH bytes of the queue into one
 * buffer, sent with one send; the queue's bytes are consumed once all of
 * it is written. Receiving reads as much ciphertext as has come (one
 * receive) and, in a loop on the receive callback, decrypts whole
 * records straight into what the receive state reads (rxhead, rxbuf)
 * while it wants bytes: many messages per receive, no thread hand-off
 * between them. A link parked by its owner leaves its ciphertext unread
 * (back-pressure, as on tcp).
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

/* A peer that does not finish its handshake (TLS's and SP's, from the
 * link's start) in this time is dropped. */
#define HANDSHAKE_TIMEOUT_MS 10000
/* cachew's TLS layer encrypts at most this much of the send queue per
 * send: large enough that a send's cost (a syscall, a callback on
 * another thread) is small beside the bytes', small enough to stay in
 * the caches while OpenSSL reads it and the kernel copies it. */
#define TLS_TX_BATCH ((size_t)256 << 10)
/* The plaintext of a full TLS record: smaller pieces of the queue (the
 * frame heads, small elements) are gathered to this before encrypted, so
 * that a record is not spent on a few bytes. */
#define TLS_RECORD 16384

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

static void budget_return(slink *lk, size_t n);

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
	cwi_tls_rec_destroy(lk->rec);
	cwi_nng_tx_free_list(lk->txq);
	if (lk->rxbuf != NULL && lk->budget != NULL)
		cwi_nng_budget_give(lk, lk->rxbuf->size);
	if (lk->tls_charged > 0)
		budget_return(lk, lk->tls_charged);
	cwi_buffer_unref(lk->rxbuf);
	cwi_nng_shm_unlink(lk->shm);
	cwi_nng_shm_unref(lk->shm);
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

static txmsg *link_kill_locked(slink *lk, const char *why);

/* Sends the rest of the ciphertext in flight (cachew's TLS layer). */
static void
tx_send_ct_locked(slink *lk)
{
	nng_iov v = {.iov_buf = lk->tx_ct + lk->tx_ct_off,
	    .iov_len = lk->tx_ct_len - lk->tx_ct_off};

	(void)nng_aio_set_iov(lk->txa, 1, &v);
	nng_aio_set_timeout(lk->txa, lk->send_timeout_ms);
	lk->txbusy = true;
	nng_stream_send(lk->s, lk->txa);
}

/* The bytes of the queue, from where it was written up to, that the next
 * send encrypts: TLS_TX_BATCH at most. */
static size_t
tx_batch_locked(const slink *lk)
{
	size_t total = 0;

	for (const txmsg *t = lk->txq; t != NULL && total < TLS_TX_BATCH;
	     t = t->next)
		for (unsigned i = t == lk->txq ? t->cur : 0; i < t->niov; i++)
			total += t->iov[i].iov_len -
			    (t == lk->txq && i == t->cur ? t->off : 0);
	return total < TLS_TX_BATCH ? total : TLS_TX_BATCH;
}

/* Encrypts up to TLS_TX_BATCH bytes of the queue, from where it was
 * written up to, into the pending ciphertext; lk->tx_plain is how many.
 * Pieces of a whole record or more go to OpenSSL as they are, smaller
 * ones through `stage`. 0 or an nng error (and why). */
static int
tx_encrypt_locked(slink *lk, const char **why)
{
	uint8_t stage[TLS_RECORD];
	size_t staged = 0, total = 0;
	int rv = 0;

	*why = NULL;
	if (!cwi_tls_rec_reserve(lk->rec, tx_batch_locked(lk))) {
		*why = "out of memory for TLS records";
		return NNG_ENOMEM;
	}
	for (txmsg *t = lk->txq; t != NULL && total < TLS_TX_BATCH && rv == 0;
	     t = t->next) {
		for (unsigned i = t == lk->txq ? t->cur : 0;
		     i < t->niov && total < TLS_TX_BATCH && rv == 0; i++) {
			size_t off = t == lk->txq && i == t->cur ? t->off : 0;
			const uint8_t *p = (const uint8_t *)t->iov[i].iov_buf + off;
			size_t len = t->iov[i].iov_len - off, n;

			if (len > TLS_TX_BATCH - total)
				len = TLS_TX_BATCH - total;
			total += len;
			for (; len > 0 && rv == 0; p += n, len -= n) {
				if (staged == 0 && len >= TLS_RECORD) {
					n = len - len % TLS_RECORD;
					rv = cwi_tls_rec_write(lk->rec, p, n, why);
					continue;
				}
				n = len < TLS_RECORD - staged ? len
							     : TLS_RECORD - staged;
				memcpy(stage + staged, p, n);
				staged += n;
				if (staged == TLS_RECORD) {
					rv = cwi_tls_rec_write(lk->rec, stage,
					    staged, why);
					staged = 0;
				}
			}
		}
	}
	if (rv == 0 && staged > 0)
		rv = cwi_tls_rec_write(lk->rec, stage, staged, why);
	lk->tx_plain = total;
	return rv;
}

/* cachew's TLS layer: once the handshake is done, encrypts a batch of
 * the queue behind what OpenSSL has pending (a handshake flight, an
 * alert) and sends it all with one send; nothing pending, nothing sent.
 * A failed encryption (out of memory) kills the link; its queue stays
 * for link_destroy to free, off this lock. */
static void
tx_arm_tls_locked(slink *lk)
{
	const char *why = NULL;
	char buf[300];
	txmsg *q;

	lk->tx_plain = 0;
	if (cwi_tls_rec_ready(lk->rec) && !lk->tls_failing &&
	    lk->txq != NULL && tx_encrypt_locked(lk, &why) != 0) {
		snprintf(buf, sizeof(buf), "TLS encryption failed: %s", why);
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer,
		    lk->url, buf);
		if ((q = link_kill_locked(lk, buf)) != NULL) {
			lk->txq = lk->txtail = q;
			while (lk->txtail->next != NULL)
				lk->txtail = lk->txtail->next;
		}
		return;
	}
	if (cwi_tls_rec_pending(lk->rec) == 0)
		return;
	cwi_tls_rec_take(lk->rec, &lk->tx_ct, &lk->tx_ct_len);
	lk->tx_ct_off = 0;
	tx_send_ct_locked(lk);
}

/* Writes what the queue holds, up to TX_IOV iovecs across messages. */
static void
tx_arm_locked(slink *lk)
{
	unsigned n = 0;

	if (lk->rec != NULL) {
		tx_arm_tls_locked(lk);
		return;
	}

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
	if (rv != 0 && lk->rec != NULL && !cwi_tls_rec_ready(lk->rec))
		rv = cwi_tls_rec_stream_err(lk->rec, rv);
	if (rv != 0 || lk->dead || (lk->tls_failing &&
	    lk->tx_ct_off + n == lk->tx_ct_len &&
	    cwi_tls_rec_pending(lk->rec) == 0)) {
		char why[300];

		if (lk->tls_failing && !lk->dead) {
			/* A refused handshake's alert went (or could not):
			 * the link dies of the refusal. */
			snprintf(why, sizeof(why), "%s", lk->tls_fail_why);
		} else if (lk->dead || rv == 0 ||
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
	if (lk->rec != NULL) {
		/* The ciphertext first, whole; then the queue's bytes it
		 * holds are written. */
		lk->tx_ct_off += n;
		if (lk->tx_ct_off < lk->tx_ct_len) {
			tx_send_ct_locked(lk);
			pthread_mutex_unlock(&lk->mtx);
			return;
		}
		n = lk->tx_plain;
		lk->tx_plain = 0;
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
	if (lk->txq != NULL ||
	    (lk->rec != NULL && cwi_tls_rec_pending(lk->rec) > 0))
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

/* Raises b's peak to used if it is higher. */
static void
budget_peak(rx_budget *b, size_t used)
{
	size_t peak = atomic_load(&b->peak);

	while (used > peak && !atomic_compare_exchange_weak(&b->peak, &peak,
				  used)) {
	}
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
	size_t mine = atomic_load(&lk->charged), used;

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
	budget_peak(b, used);
	return NULL;
}

/* cachew's TLS layer at a listener: n more bytes of the link's
 * ciphertext buffer. They count in the listener's total, so that many
 * links that read large records hold no more than the budget; not in the
 * link's share, which is for the messages it reads. `needed` (the room
 * of the record being read, without which the link cannot go on) is
 * granted whatever the total, as a message's first bytes are. */
static bool
tls_budget_take(slink *lk, size_t n, bool needed)
{
	rx_budget *b = lk->budget;
	size_t used = atomic_fetch_add(&b->used, n) + n;

	if (used > b->limit && !needed) {
		atomic_fetch_sub(&b->used, n);
		return false;
	}
	lk->tls_charged += n;
	budget_peak(b, used);
	return true;
}

/* n bytes of the listener's total given back (lk's). */
static void
budget_return(slink *lk, size_t n)
{
	rx_budget *b = lk->budget;
	size_t used, peak;

	used = atomic_fetch_sub(&b->used, n) - n;
	peak = atomic_load(&b->peak);
	if (peak >= BUDGET_RELEASE_PEAK && used < peak / 8 &&
	    atomic_compare_exchange_strong(&b->peak, &peak, used)) {
		cwi_log(CACHEW_LOG_INFO, "transport",
		    "url=%s event=heap_released reason=\"peers held %zu bytes, "
		    "now %zu\"", lk->url, peak, used);
		cwi_heap_release(true);
	}
}

void
cwi_nng_budget_give(slink *lk, size_t n)
{
	if (lk->budget == NULL || n == 0)
		return;
	atomic_fetch_sub(&lk->charged, n);
	budget_return(lk, n);
}

/* ---- link: receiving ---------------------------------------------------- */

/* Where the bytes the receive state waits for go. */
static nng_iov
rx_dest_locked(slink *lk)
{
	nng_iov v;

	if (lk->rx == RX_BODY) {
		v.iov_buf = lk->rxbuf->data + lk->got;
		v.iov_len = lk->rxbuf->size - lk->got;
	} else {
		v.iov_buf = lk->rxhead + lk->got;
		v.iov_len = lk->need - lk->got;
	}
	return v;
}

/* How long a read may wait: the rest of the handshake's time, the rest
 * of a message's under a budget, else for ever. */
static nng_duration
rx_timeout_locked(slink *lk)
{
	uint64_t due, now;
	nng_duration ms;

	if (lk->rx == RX_HANDSHAKE)
		due = lk->hs_deadline_ns;
	else if (lk->rx == RX_BODY && lk->budget != NULL)
		due = lk->rx_deadline_ns;
	else
		return NNG_DURATION_INFINITE;
	now = cwi_now_ns();
	ms = now < due ? (nng_duration)((due - now) / 1000000u) : 0;
	return ms < 1 ? 1 : ms;
}

/* Reads what the receive state waits for. On cachew's TLS layer the
 * state only says it wants bytes: the receive callback's loop decrypts
 * them (tls_rx_locked), woken by a zero sleep when it does not run. */
static void
rx_arm_locked(slink *lk)
{
	nng_iov v;

	if (lk->rec != NULL) {
		lk->rx_want = true;
		if (!lk->rx_in_cb) {
			lk->rx_waking = true;
			nng_sleep_aio(0, lk->rxa);
		}
		return;
	}
	v = rx_dest_locked(lk);
	(void)nng_aio_set_iov(lk->rxa, 1, &v);
	nng_aio_set_timeout(lk->rxa, rx_timeout_locked(lk));
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

/*
 * The receive state machine: n more bytes of what the state reads came
 * (rv 0), or its read failed (rv). Reads on, delivers or parks, and
 * returns false; true when the link is dead and its death is to be
 * reported (*q: a send queue to free then).
 */
static bool
rx_step_locked(slink *lk, int rv, size_t n, txmsg **q)
{
	char why[300];
	const char *bad = NULL;

	if (!lk->dead && rv != 0) {
		if (rv == NNG_ETIMEDOUT && lk->rx == RX_HANDSHAKE) {
			snprintf(why, sizeof(why),
			    "no handshake within %d ms", HANDSHAKE_TIMEOUT_MS);
			bad = why;
		} else if (early_death_locked(lk, rv, why, sizeof(why)) !=
			   NULL) {
			*q = link_kill_locked(lk, why);
		} else if (rv == NNG_ETIMEDOUT && lk->rx == RX_BODY) {
			snprintf(why, sizeof(why), "a message of %zu bytes did "
			    "not come whole within %d ms (%zu came)", lk->need,
			    lk->send_timeout_ms, lk->got + n);
			bad = why;
		} else {
			*q = link_kill_locked(lk,
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
			return false;
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
				return false;
			}
			break;
		case RX_HEAD:
			bad = head_check_locked(lk, why, sizeof(why));
			if (bad == NULL) {
				rx_arm_locked(lk);
				return false;
			}
			break;
		case RX_BODY:
			if (rx_deliver_locked(lk))
				return false;
			break;
		default:
			break;
		}
	}
	if (bad != NULL) {
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer,
		    lk->url, bad);
		*q = link_kill_locked(lk, bad);
	}
	return true;
}

/* Reads ciphertext (cachew's TLS layer) into the session's room, for as
 * long as the receive state may wait: room for the record being read,
 * more when reads fill it (at a listener, while its budget allows).
 * Returns as rx_step_locked (true: out of memory, the link is dead). */
static bool
tls_read_locked(slink *lk, txmsg **q)
{
	size_t need, want, cap = cwi_tls_rec_in_cap(lk->rec), room;
	nng_iov v;

	cwi_tls_rec_in_sizes(lk->rec, lk->budget != NULL, lk->rx == RX_HEAD,
	    &need, &want);
	if (lk->budget != NULL && want > cap &&
	    !tls_budget_take(lk, want - cap, false)) {
		want = need;
		if (want > cap)
			(void)tls_budget_take(lk, want - cap, true);
	}
	v.iov_buf = cwi_tls_rec_in_room(lk->rec, want, &room);
	if (v.iov_buf == NULL) {
		*q = link_kill_locked(lk, "out of memory for TLS records");
		return true;
	}
	if (lk->budget != NULL && cwi_tls_rec_in_cap(lk->rec) < cap) {
		/* An idle buffer shrank: its bytes go back to the budget. */
		lk->tls_charged -= cap - cwi_tls_rec_in_cap(lk->rec);
		budget_return(lk, cap - cwi_tls_rec_in_cap(lk->rec));
	}
	v.iov_len = room;
	(void)nng_aio_set_iov(lk->rxa, 1, &v);
	nng_aio_set_timeout(lk->rxa, rx_timeout_locked(lk));
	nng_stream_recv(lk->s, lk->rxa);
	return false;
}

/* The TLS handshake failed (err, OpenSSL's reason ossl_why): the link
 * dies of it as of a refused handshake on nng's TLS streams
 * (early_death_locked), once its alert is sent when one is pending
 * (then the tx callback kills it, and the read armed here reports the
 * death). Returns as rx_step_locked. */
static bool
tls_handshake_failed_locked(slink *lk, int err, const char *ossl_why,
    txmsg **q)
{
	char buf[300];
	const char *why = early_death_locked(lk, err, buf, sizeof(buf));

	if (why == NULL)
		snprintf(lk->tls_fail_why, sizeof(lk->tls_fail_why),
		    "TLS handshake failed: %s", ossl_why);
	else
		snprintf(lk->tls_fail_why, sizeof(lk->tls_fail_why), "%s", why);
	if (lk->txbusy || cwi_tls_rec_pending(lk->rec) == 0) {
		*q = link_kill_locked(lk, lk->tls_fail_why);
		return true;
	}
	lk->tls_failing = true;
	tx_arm_locked(lk);
	return tls_read_locked(lk, q);
}

/* A record that does not decrypt (err, OpenSSL's reason ossl_why), or
 * the peer's close_notify (NNG_ECLOSED). Returns as rx_step_locked. */
static bool
tls_record_failed_locked(slink *lk, int err, const char *ossl_why,
    txmsg **q)
{
	char why[300];

	if (err == NNG_ECLOSED || lk->rx == RX_HANDSHAKE)
		return rx_step_locked(lk, err == NNG_ECLOSED ? NNG_ECONNSHUT
							    : err, 0, q);
	snprintf(why, sizeof(why), "TLS record refused: %s", ossl_why);
	cwi_log(CACHEW_LOG_WARN, "transport",
	    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer, lk->url,
	    why);
	if (!lk->txbusy && cwi_tls_rec_pending(lk->rec) > 0) {
		/* OpenSSL's alert goes first (as a refused handshake's). */
		snprintf(lk->tls_fail_why, sizeof(lk->tls_fail_why), "%s", why);
		lk->tls_failing = true;
		tx_arm_locked(lk);
		return tls_read_locked(lk, q);
	}
	*q = link_kill_locked(lk, why);
	return true;
}

/*
 * cachew's TLS layer: n bytes of ciphertext came (rv 0; n is 0 after a
 * wake-up), or the stream failed (rv). Runs the handshake to its end,
 * then decrypts straight into what the receive state reads for as long
 * as it wants bytes and whole records are in, many messages per call;
 * reads more ciphertext when a record is incomplete. Returns as
 * rx_step_locked.
 */
static bool
tls_rx_locked(slink *lk, int rv, size_t n, txmsg **q)
{
	bool down = false;

	if (lk->tls_failing && !lk->dead) {
		/* The peer answered or hung up before our alert went. */
		*q = link_kill_locked(lk, lk->tls_fail_why);
		return true;
	}
	if (rv != 0 || lk->dead) {
		if (rv != 0 && !cwi_tls_rec_ready(lk->rec))
			rv = cwi_tls_rec_stream_err(lk->rec, rv);
		return rx_step_locked(lk, rv, 0, q);
	}
	cwi_tls_rec_in_commit(lk->rec, n);
	lk->rx_in_cb = true;
	while (!down && !lk->dead) {
		const char *why;
		size_t got = 0;
		nng_iov v;
		int err;

		if (!cwi_tls_rec_ready(lk->rec)) {
			err = cwi_tls_rec_handshake(lk->rec, &why);
			if (err == 0 || err == NNG_EAGAIN) {
				/* A flight to send, or the SP handshake
				 * (queued first) once it is done. */
				if (!lk->txbusy)
					tx_arm_locked(lk);
				if (err == 0)
					continue;
				down = tls_read_locked(lk, q);
				break;
			}
			down = tls_handshake_failed_locked(lk, err, why, q);
			break;
		}
		if (!lk->rx_want)
			break; /* parked: the ciphertext waits */
		v = rx_dest_locked(lk);
		err = cwi_tls_rec_read(lk->rec, v.iov_buf, v.iov_len, &got,
		    &why);
		if (err == 0) {
			lk->rx_want = false;
			down = rx_step_locked(lk, 0, got, q);
		} else if (err == NNG_EAGAIN) {
			down = tls_read_locked(lk, q);
			break;
		} else {
			down = tls_record_failed_locked(lk, err, why, q);
		}
	}
	lk->rx_in_cb = false;
	/* What OpenSSL wrote while reading (an alert: a warning such as its
	 * refusal of a renegotiation) goes now, not with the next message. */
	if (!down && !lk->dead && !lk->txbusy &&
	    cwi_tls_rec_pending(lk->rec) > 0)
		tx_arm_locked(lk);
	return down || lk->dead;
}

static void
link_rx_cb(void *arg)
{
	slink *lk = arg;
	int rv = nng_aio_result(lk->rxa);
	size_t n = nng_aio_count(lk->rxa);
	char why[300];
	txmsg *q = NULL;
	bool down;

	pthread_mutex_lock(&lk->mtx);
	if (lk->rec == NULL) {
		down = rx_step_locked(lk, rv, n, &q);
	} else {
		/* A wake-up (rx_arm_locked) reads nothing and fails not. */
		if (lk->rx_waking && rv == NNG_ETIMEDOUT)
			rv = 0;
		if (lk->rx_waking)
			n = 0;
		lk->rx_waking = false;
		down = tls_rx_locked(lk, rv, n, &q);
	}
	if (!down) {
		pthread_mutex_unlock(&lk->mtx);
		return;
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
    size_t max_len, int send_timeout_ms, const cwi_nng_tls *tls)
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
	/* cachew's TLS layer runs on a tcp stream; only nng's TLS streams
	 * know this option. */
	lk->tls = cwi_nng_tls_ossl(tls) != NULL ||
	    nng_stream_get_bool(s, NNG_OPT_TLS_VERIFIED, &verified) == 0;
	stream_peer(s, ipc, lk->tls, lk->peer, sizeof(lk->peer));
	if (!ipc)
		(void)nng_stream_set_bool(s, NNG_OPT_TCP_NODELAY, true);
	/* The handshake is the first thing sent: a message of its own. */
	if ((cwi_nng_tls_ossl(tls) != NULL &&
		cwi_tls_rec_create(&lk->rec, tls) != CACHEW_OK) ||
	    cwi_nng_tx_handshake(&hs, my_proto) != CACHEW_OK) {
		cwi_tls_rec_destroy(lk->rec);
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
	lk->hs_deadline_ns = cwi_now_ns() +
	    (uint64_t)HANDSHAKE_TIMEOUT_MS * 1000000u;
	rx_arm_locked(lk);
	if (lk->txq != NULL && !lk->txbusy)
		tx_arm_locked(lk);
	pthread_mutex_unlock(&lk->mtx);
}
