/*
 * nng_transport.c - the network transport: tcp://host:port and
 * ipc:///path. nng 1.5 provides the byte streams (nng_stream dialers and
 * listeners: address parsing, connect, accept, readv/writev on its I/O
 * threads); request/reply is implemented here, on the wire format of
 * nng's req0/rep0 protocols (docs/protocol.md, "Transport framing"), so
 * plain nng req and rep sockets interoperate with it.
 *
 * Why not nng's req/rep sockets: nng 1.5 sends only a contiguous nng_msg
 * that it allocated and zeroed, and receives only into one it zeroed. A
 * worker then copies every payload into a zeroed message, and W6 (1 MiB
 * elements) lost a third of raw nng's throughput to it
 * (docs/performance.md, W6). Here a message is sent with writev straight
 * from the element buffers (cwi_element_encode_gather) and received into
 * an unzeroed buffer whose payloads the received tensors view.
 *
 * Structure:
 * - A link is one connected stream: the SP handshake, a send queue
 *   written with writev (up to 8 iovecs a call, across messages), and a
 *   receive loop that reads each message whole into one buffer and hands
 *   it to the link's owner. A link's death is reported to its owner once
 *   (on_down), always from the receive path.
 * - A client connection (sconn) owns at most one link at a time, gives
 *   each request a 32-bit id (high bit set, as req0 does), matches
 *   replies by id, fails the requests of a link that dies with
 *   CACHEW_ECLOSED, and redials by itself (reconnect_min_ms doubling to
 *   reconnect_max_ms while it fails, each wait drawn from the upper half
 *   of the backoff). Requests sent while no link is up
 *   wait for the next one within their deadline.
 * - A listener (slistener) accepts links and calls the handler once per
 *   request; the request keeps its link (and the request id and
 *   backtrace) to send the reply on. Past max_inflight held requests, a
 *   link stops reading until one is consumed (back-pressure).
 *
 * Limits: a length field is checked against max_msg_size (plus room for
 * the request id or backtrace) before anything is allocated; a longer
 * claim resets the connection with a logged reason. The body is then
 * checked as before (frame_decode).
 *
 * Locking: cq->mtx (transport.c; held only around a pending's cancel
 * hook, cli_cancel), then the listener or connection mutex, then a
 * link's mutex; requests are completed with none of these held. The
 * owner callbacks (on_msg, on_down) run with no lock held. nng runs an
 * aio callback on its own task threads, never on the thread that starts
 * the operation, so operations are started with the link's mutex held.
 *
 * Lifetime: links are reference counted (their owner holds one, each
 * server request one). The last reference hands the link to the
 * janitor, a thread that stops its aios and frees the stream: nng_aio_stop
 * may not run on the aio's own callback, where the last reference often
 * goes.
 *
 * Process-wide: the first listen or dial tunes glibc's malloc for large
 * messages (heap_tune_once; CACHEW_MALLOPT=0 opts out).
 */
#include "nng_int.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* nng 1.5 takes at most 8 iovecs per operation. */
#define TX_IOV 8
/* A peer that does not finish its handshake in this time is dropped. */
#define HANDSHAKE_TIMEOUT_MS 10000
/* A blocking dial gives up after this. */
#define DIAL_TIMEOUT_MS 10000

/* ---- helpers ------------------------------------------------------------ */

static cachew_err
nng_err(int rv, const char *url, const char *what)
{
	switch (rv) {
	case NNG_ENOMEM:
		return cwi_fail(CACHEW_ENOMEM, "%s: %s: out of memory", url,
		    what);
	case NNG_EADDRINUSE:
		return cwi_fail(CACHEW_EEXIST, "%s: address in use", url);
	case NNG_EADDRINVAL:
	case NNG_EINVAL:
	case NNG_ENOTSUP:
		return cwi_fail(CACHEW_EINVAL, "%s: %s: invalid address (%s)",
		    url, what, nng_strerror(rv));
	case NNG_ECONNREFUSED:
	case NNG_ENOENT:
		return cwi_fail(CACHEW_EIO, "%s: connection refused", url);
	case NNG_ETIMEDOUT:
		return cwi_fail(CACHEW_ETIMEDOUT, "%s: %s timed out", url, what);
	case NNG_ECLOSED:
		return cwi_fail(CACHEW_ECLOSED, "%s: closed", url);
	default:
		return cwi_fail(CACHEW_EIO, "%s: %s: %s", url, what,
		    nng_strerror(rv));
	}
}

/*
 * The heap of a process that moves large messages. glibc gives each
 * thread an arena of its own; a thread arena's heaps are at most 64 MiB
 * and a heap that becomes free is unmapped at once, whatever the trim
 * threshold, and above the mmap threshold (adaptive, at most 32 MiB)
 * every block is a fresh mapping. Either way a large block page-faults
 * in, zero-filled page by page by the kernel: for W2's batches of 38.5
 * MB, clear_page and the faults were half of the client's CPU and part of
 * the workers' (docs/performance.md, W5). So, once per process, at its
 * first listen or dial: one arena (M_ARENA_MAX 1: nng's threads, which
 * attach to an arena on their first malloc, then share the main heap),
 * blocks up to 64 MiB in the heap, and a free top kept up to 64 MiB.
 * Measured on W2 through the service (2000 images): the client's CPU
 * 0.88-0.92 -> 0.39-0.45 s against glibc's defaults. The price: threads
 * that start after this share one arena's lock (tcache still serves
 * small blocks without it), and freed memory stays resident up to the
 * trim threshold. CACHEW_MALLOPT=0 in the environment leaves malloc
 * alone, for a program that tunes it itself.
 */
#define HEAP_MMAP_BYTES (64 << 20)
#define HEAP_TRIM_BYTES (64 << 20)

static pthread_once_t heap_once = PTHREAD_ONCE_INIT;

static void
heap_tune_once(void)
{
	const char *v = getenv("CACHEW_MALLOPT");

	if (v != NULL && strcmp(v, "0") == 0)
		return;
	mallopt(M_ARENA_MAX, 1);
	mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_BYTES);
	mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_BYTES);
}

/* The remote address of a stream, for logs. */
static void
stream_peer(nng_stream *s, bool ipc, char *buf, size_t len)
{
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	if (nng_stream_get_addr(s, NNG_OPT_REMADDR, &sa) != 0) {
		snprintf(buf, len, "%s://?", ipc ? "ipc" : "tcp");
		return;
	}
	switch (sa.s_family) {
	case NNG_AF_INET:
		inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip));
		snprintf(buf, len, "tcp://%s:%u", ip, ntohs(sa.s_in.sa_port));
		break;
	case NNG_AF_INET6:
		inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip));
		snprintf(buf, len, "tcp://[%s]:%u", ip, ntohs(sa.s_in6.sa_port));
		break;
	case NNG_AF_IPC:
		snprintf(buf, len, "ipc://%s", sa.s_ipc.sa_path);
		break;
	default:
		snprintf(buf, len, "%s://?", ipc ? "ipc" : "tcp");
		break;
	}
}

/* ---- links -------------------------------------------------------------- */

typedef struct slink slink;

typedef struct link_ops {
	/* A whole message (buf, taken) arrived. Returns false to stop
	 * reading until link_resume (back-pressure). No lock held. */
	bool (*on_msg)(void *owner, slink *lk, cwi_buffer *buf);
	/* The link is dead: called once, after the last on_msg. */
	void (*on_down)(void *owner, slink *lk, const char *why);
	/* The link is being freed: drops its reference on the owner. */
	void (*release)(void *owner);
} link_ops;

typedef enum rx_state {
	RX_HANDSHAKE, /* reading the peer's 8 bytes */
	RX_HEAD,      /* reading a message's length prefix */
	RX_BODY,      /* reading a message into rxbuf */
	RX_DELIVER,   /* the callback is handing a message to the owner */
	RX_PARKED,    /* stopped by the owner until link_resume */
	RX_DOWN,      /* on_down delivered: nothing more */
} rx_state;

struct slink {
	pthread_mutex_t mtx;
	unsigned refs;
	nng_stream *s;
	nng_aio *txa, *rxa;
	bool ipc;
	uint16_t peer_proto; /* what the peer must announce */
	const link_ops *ops;
	void *owner;
	const char *url; /* the owner's, for logs */
	char peer[160];
	size_t max_len; /* largest length field accepted */
	size_t id_room; /* of which the request id (or backtrace) */
	int send_timeout_ms;
	bool dead;
	char why[256];
	/* send */
	txmsg *txq, *txtail;
	bool txbusy;
	nng_iov txv[TX_IOV];
	/* receive */
	rx_state rx;
	bool resume_wanted; /* link_resume came while delivering */
	uint8_t rxhead[SP_IPC_PREFIX];
	size_t got, need;
	cwi_buffer *rxbuf;
	struct slink *next, *prev; /* the owner's list of links */
	struct slink *pnext;       /* a listener's parked links */
	bool parked;              /* on that list (listener's lock) */
	struct slink *jnext;       /* the janitor's queue */
};

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

static void
link_ref(slink *lk)
{
	pthread_mutex_lock(&lk->mtx);
	lk->refs++;
	pthread_mutex_unlock(&lk->mtx);
}

static void
link_unref(slink *lk)
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

static void
link_kill(slink *lk, const char *why)
{
	txmsg *q;

	pthread_mutex_lock(&lk->mtx);
	q = link_kill_locked(lk, why);
	pthread_mutex_unlock(&lk->mtx);
	cwi_nng_tx_free_list(q);
}

/* Logs a WARN line for a peer that broke the protocol and kills lk. */
static void
link_reset(slink *lk, const char *reason)
{
	cwi_log(CACHEW_LOG_WARN, "transport",
	    "peer=%s url=%s reason=\"%s\" action=reset", lk->peer, lk->url,
	    reason);
	link_kill(lk, reason);
}

/* Queues t; on CACHEW_ECLOSED (the link is dead) the caller keeps it. */
static cachew_err
link_send(slink *lk, txmsg *t)
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
		char why[200];

		if (rv == NNG_ETIMEDOUT)
			snprintf(why, sizeof(why),
			    "the peer read nothing for %d ms",
			    lk->send_timeout_ms);
		else
			snprintf(why, sizeof(why), "send failed: %s",
			    rv != 0 ? nng_strerror(rv) : "closed");
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

/* ---- link: receiving ---------------------------------------------------- */

static void
rx_arm_locked(slink *lk)
{
	nng_iov v;

	if (lk->rx == RX_BODY)
		v.iov_buf = lk->rxbuf->data + lk->got;
	else
		v.iov_buf = lk->rxhead + lk->got;
	v.iov_len = lk->need - lk->got;
	(void)nng_aio_set_iov(lk->rxa, 1, &v);
	nng_aio_set_timeout(lk->rxa, lk->rx == RX_HANDSHAKE
					 ? HANDSHAKE_TIMEOUT_MS
					 : NNG_DURATION_INFINITE);
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
	if (cwi_buffer_alloc(&lk->rxbuf, n, false) != CACHEW_OK) {
		snprintf(buf, len, "%s", cwi_errmsg_get());
		return buf;
	}
	lk->rx = RX_BODY;
	lk->got = 0;
	lk->need = n;
	return NULL;
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
	cwi_buffer *msg;
	bool more;

	pthread_mutex_lock(&lk->mtx);
	if (!lk->dead && rv != 0) {
		if (rv == NNG_ETIMEDOUT && lk->rx == RX_HANDSHAKE) {
			snprintf(why, sizeof(why),
			    "no handshake within %d ms", HANDSHAKE_TIMEOUT_MS);
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
		if (lk->got < lk->need) {
			rx_arm_locked(lk);
			pthread_mutex_unlock(&lk->mtx);
			return;
		}
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
			msg = lk->rxbuf;
			lk->rxbuf = NULL;
			lk->rx = RX_DELIVER;
			pthread_mutex_unlock(&lk->mtx);
			more = lk->ops->on_msg(lk->owner, lk, msg);
			pthread_mutex_lock(&lk->mtx);
			if (lk->dead)
				break;
			rx_expect_head_locked(lk);
			if (more || lk->resume_wanted) {
				lk->resume_wanted = false;
				rx_arm_locked(lk);
			} else {
				lk->rx = RX_PARKED;
			}
			pthread_mutex_unlock(&lk->mtx);
			return;
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
static void
link_resume(slink *lk)
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
static cachew_err
link_create(slink **out, nng_stream *s, bool ipc, uint16_t my_proto,
    uint16_t peer_proto, const link_ops *ops, void *owner, const char *url,
    size_t max_len, int send_timeout_ms)
{
	slink *lk = calloc(1, sizeof(*lk));
	txmsg *hs;
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
		return nng_err(rv, url, "nng_aio_alloc");
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
	stream_peer(s, ipc, lk->peer, sizeof(lk->peer));
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
static void
link_start(slink *lk)
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

/* ---- server ------------------------------------------------------------- */

typedef struct slistener {
	cwi_listener base;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	unsigned refs; /* the owner's + one per slink */
	bool closed;
	bool ipc;
	nng_stream_listener *sl;
	nng_aio *acc;
	bool acc_sleep; /* acc is a pause after a failed accept */
	slink *links;    /* live links: on_down not yet delivered */
	slink *parked, *parked_tail;
	unsigned held, max_held; /* requests handed out, not consumed */
	unsigned in_handler;
	size_t max_msg;
	int send_timeout_ms;
} slistener;

typedef struct sreq {
	cwi_request base;
	slistener *l;
	slink *lk; /* a reference: the reply goes there */
	uint8_t bt[SP_BT_MAX];
	size_t btlen;
} sreq;

static void
listener_free(slistener *l)
{
	nng_stream_listener_free(l->sl);
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
			link_ref(wake[n++]);
		}
		pthread_mutex_unlock(&l->mtx);
		for (unsigned i = 0; i < n; i++) {
			link_resume(wake[i]);
			link_unref(wake[i]);
		}
		if (n < 16)
			return;
		pthread_mutex_lock(&l->mtx);
	}
}

static const cwi_request_ops nt_request_ops;

static bool
srv_on_msg(void *owner, slink *lk, cwi_buffer *buf)
{
	slistener *l = owner;
	size_t btlen;
	sreq *r = NULL;
	cwi_nng_frame_in fi;
	cachew_err rv;
	bool more;

	pthread_mutex_lock(&l->mtx);
	if (l->closed) {
		/* Arrived while closing: no handler starts any more. */
		pthread_mutex_unlock(&l->mtx);
		cwi_buffer_unref(buf);
		return true;
	}
	l->in_handler++;
	l->held++;
	pthread_mutex_unlock(&l->mtx);

	/* The backtrace ends at the request id, the word with the high
	 * bit set. */
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
		if (rv == CACHEW_OK && fi.msg == NULL)
			rv = cwi_fail(CACHEW_EPROTO, "a request may not be an "
						     "error frame");
	}
	if (rv != CACHEW_OK) {
		free(r);
		if (rv == CACHEW_EPROTO)
			link_reset(lk, cwi_errmsg_get());
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
		link_ref(lk);
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
	link_unref(lk);
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
	free(r);
	srv_consumed(l);
	link_unref(lk);
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
	else if ((rv = link_send(r->lk, t)) != CACHEW_OK)
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
	/* The reply's elements must live until their bytes are written. */
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

	link_reset(r->lk, reason);
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

	err = link_create(&lk, s, l->ipc, SP_PROTO_REP0, SP_PROTO_REQ0,
	    &srv_link_ops, l, l->base.url, l->max_msg + SP_BT_MAX,
	    l->send_timeout_ms);
	pthread_mutex_lock(&l->mtx);
	if (err != CACHEW_OK) {
		l->refs--;
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "url=%s reason=\"connection dropped: %s\"", l->base.url,
		    cwi_errmsg_get());
	} else if (!l->closed) {
		lk->next = l->links;
		if (l->links != NULL)
			l->links->prev = lk;
		l->links = lk;
		link_start(lk);
		lk = NULL;
	}
	if (!l->closed)
		nng_stream_listener_accept(l->sl, l->acc);
	pthread_mutex_unlock(&l->mtx);
	if (lk != NULL) {
		/* Closed meanwhile: never started, nothing reports it. */
		link_kill(lk, "listener closed");
		link_unref(lk);
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
		link_kill(lk, "listener closed");
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

/* "tcp://host:0" with the port bound; other URLs unchanged. */
static char *
bound_url(const char *url, nng_stream_listener *sl)
{
	const char *colon;
	int port;

	if (strncmp(url, "tcp", 3) != 0 ||
	    nng_stream_listener_get_int(sl, NNG_OPT_TCP_BOUND_PORT, &port) !=
		0 ||
	    (colon = strrchr(url, ':')) == NULL || colon < url + 6)
		return cwi_strdup(url);
	return cwi_asprintf("%.*s:%d", (int)(colon - url), url, port);
}

static cachew_err
nt_listen(cwi_listener **out, const char *url, const cwi_transport_opts *opts,
    cwi_handler_fn handler, void *arg)
{
	slistener *l = calloc(1, sizeof(*l));
	cachew_err rv;
	int nrv;

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
	pthread_once(&heap_once, heap_tune_once);
	if ((nrv = nng_stream_listener_alloc(&l->sl, url)) != 0) {
		rv = nng_err(nrv, url, "listen");
		goto fail;
	}
	if ((nrv = nng_stream_listener_listen(l->sl)) != 0) {
		rv = nng_err(nrv, url, "listen");
		goto fail;
	}
	l->base.url = bound_url(url, l->sl);
	if (l->base.url == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if ((nrv = nng_aio_alloc(&l->acc, srv_accept_cb, l)) != 0) {
		rv = nng_err(nrv, url, "nng_aio_alloc");
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

/* ---- client ------------------------------------------------------------- */

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
};

static void
conn_free(sconn *c)
{
	nng_stream_dialer_free(c->d);
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

static bool
cli_on_msg(void *owner, slink *lk, cwi_buffer *buf)
{
	sconn *c = owner;
	uint32_t id = cwi_nng_get_u32(buf->data);
	char msg[FRAME_ERRMSG_MAX + 200];
	cachew_err err;
	cwi_msg *reply = NULL;
	cwi_nng_frame_in fi;
	creq *x;

	pthread_mutex_lock(&c->mtx);
	for (x = c->reqs; x != NULL; x = x->next)
		if (x->id == id && x->lk == lk)
			break;
	if (x != NULL)
		req_unlist_locked(c, x);
	pthread_mutex_unlock(&c->mtx);
	if (x == NULL) {
		/* The reply to a request that timed out: nobody waits. */
		cwi_buffer_unref(buf);
		return true;
	}
	msg[0] = '\0';
	err = cwi_nng_frame_decode(buf, SP_ID_BYTES, c->max_msg, &fi);
	if (err == CACHEW_EPROTO) {
		snprintf(msg, sizeof(msg), "%s: malformed reply: %s",
		    c->base.url, cwi_errmsg_get());
		link_reset(lk, cwi_errmsg_get());
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

static void
cli_on_down(void *owner, slink *lk, const char *why)
{
	sconn *c = owner;
	creq *lost = NULL, **tail = &lost;
	char msg[400];
	bool drop = false;

	pthread_mutex_lock(&c->mtx);
	if (c->lk == lk) {
		c->lk = NULL;
		drop = true;
	}
	for (creq *x = c->reqs, *nx; x != NULL; x = nx) {
		nx = x->next;
		if (x->lk != lk)
			continue;
		req_unlist_locked(c, x);
		*tail = x;
		tail = &x->next;
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
	if (drop)
		link_unref(lk);
}

static const link_ops cli_link_ops = {
    .on_msg = cli_on_msg,
    .on_down = cli_on_down,
    .release = cli_link_release,
};

/* Makes s the connection's link and sends the waiting requests on it.
 * With c->mtx held. */
static void
conn_attach_locked(sconn *c, slink *lk)
{
	c->lk = lk;
	c->attached_ns = cwi_now_ns();
	link_start(lk);
	for (creq *x = c->reqs; x != NULL; x = x->next) {
		if (x->lk != NULL)
			continue;
		if (link_send(lk, x->tx) != CACHEW_OK)
			break;
		x->tx = NULL;
		x->lk = lk;
	}
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
		dial_arm_locked(c, backoff_next_locked(c));
		pthread_mutex_unlock(&c->mtx);
		return;
	}
	c->refs++; /* the link's */
	pthread_mutex_unlock(&c->mtx);

	err = link_create(&lk, s, c->ipc, SP_PROTO_REQ0, SP_PROTO_REP0,
	    &cli_link_ops, c, c->base.url, c->max_msg + SP_ID_BYTES,
	    c->send_timeout_ms);
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
		link_kill(lk, "connection closed");
		link_unref(lk);
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
	if (c->closed || x->expired) {
		err = c->closed ? CACHEW_ECLOSED : CACHEW_ETIMEDOUT;
		pthread_mutex_unlock(&c->mtx);
		/* Accepted, then ended before it left: complete it here,
		 * and free x only then: until p completes, its cancel hook
		 * may still run with x (cwi_pending_set_cancel). */
		cwi_nng_tx_free(x->tx);
		x->tx = NULL;
		cwi_msg_destroy(req);
		cwi_pending_complete(p, err, NULL,
		    err == CACHEW_ECLOSED ? "connection closed"
					  : "request timed out");
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
	if (c->lk != NULL && link_send(c->lk, x->tx) == CACHEW_OK) {
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
		link_kill(lk, "connection closed");
		link_unref(lk);
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
};

static cachew_err
nt_dial(cwi_conn **out, const char *url, const cwi_transport_opts *opts)
{
	sconn *c = calloc(1, sizeof(*c));
	nng_aio *a = NULL;
	nng_stream *s;
	slink *lk;
	cachew_err rv;
	int nrv;

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
	c->next_id = (uint32_t)cwi_now_ns() & 0x7fffffffu;
	c->jitter.state = cwi_now_ns() ^ (uint64_t)(uintptr_t)c;
	c->base.url = cwi_strdup(url);
	if (c->base.url == NULL) {
		conn_free(c);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	pthread_once(&heap_once, heap_tune_once);
	if ((nrv = nng_stream_dialer_alloc(&c->d, url)) != 0 ||
	    (nrv = nng_aio_alloc(&c->dial, cli_dial_cb, c)) != 0 ||
	    (nrv = nng_aio_alloc(&c->reap_aio, cli_reap_cb, c)) != 0) {
		rv = nng_err(nrv, url, "dial");
		conn_free(c);
		return rv;
	}
	if (opts->dial_async) {
		pthread_mutex_lock(&c->mtx);
		dial_arm_locked(c, 0);
		pthread_mutex_unlock(&c->mtx);
		*out = &c->base;
		return CACHEW_OK;
	}
	if ((nrv = nng_aio_alloc(&a, NULL, NULL)) != 0) {
		rv = nng_err(nrv, url, "nng_aio_alloc");
		conn_free(c);
		return rv;
	}
	nng_aio_set_timeout(a, DIAL_TIMEOUT_MS);
	nng_stream_dialer_dial(c->d, a);
	nng_aio_wait(a);
	if ((nrv = nng_aio_result(a)) != 0) {
		nng_aio_free(a);
		rv = nng_err(nrv, url, "dial");
		conn_free(c);
		return rv;
	}
	s = nng_aio_get_output(a, 0);
	nng_aio_free(a);
	rv = link_create(&lk, s, c->ipc, SP_PROTO_REQ0, SP_PROTO_REP0,
	    &cli_link_ops, c, c->base.url, c->max_msg + SP_ID_BYTES,
	    c->send_timeout_ms);
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

static const char *const nt_schemes[] = {"tcp", "ipc", NULL};

const cwi_transport cwi_transport_nng = {
    .name = "nng",
    .schemes = nt_schemes,
    .listen = nt_listen,
    .dial = nt_dial,
};
