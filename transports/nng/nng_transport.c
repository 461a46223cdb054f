/*
 * nng_transport.c - the network transport: tcp://host:port and
 * ipc:///path over nng 1.5 (v1 API) req/rep sockets with contexts.
 *
 * Client: one nng_req0 socket and dialer per connection, and one nng_ctx +
 * nng_aio per request in flight (kept on a free list for reuse), so any
 * number of requests share the connection and complete in any order. nng's
 * own resend is disabled: a request whose pipe drops completes with
 * CACHEW_ECLOSED (nng reports NNG_ECONNRESET) and the caller retries.
 *
 * Server: one nng_rep0 socket and listener, and a pool of contexts, each
 * with an aio whose callback calls the handler. A context stays with its
 * request until the request is consumed, so held requests do not stop the
 * others: the pool grows by one whenever no context is left receiving, up
 * to max_inflight; past that nng stops reading from peers.
 *
 * Framing (docs/protocol.md, "Transport framing"): the body of every SP
 * message is a 16-byte head, the header bytes, then the elements in the
 * element codec's form (src/core/element_codec.h). Received elements are
 * zero-copy views into the received nng_msg, which a cwi_buffer wraps and
 * frees with its last reference. Sending copies each payload once, into
 * the nng_msg it is encoded in (nng 1.5 cannot send caller memory);
 * bench/transport_bench.c measures what that costs.
 *
 * Limits: NNG_OPT_RECVMAXSZ on every socket is max_msg_size plus an
 * eighth (nng_recv_max), so nng refuses a frame claiming more before
 * allocating (it closes the pipe); a frame within it but over
 * max_msg_size, or malformed, is refused here: the pipe is closed with a
 * WARN line naming the peer and the reason.
 *
 * Locking: one mutex per listener and per connection (mtx), then cq->mtx
 * (transport.c). Operations are started (nng_ctx_send/recv) and canceled
 * with mtx held, so that close sees every one of them: nng never runs an
 * aio callback on the thread that starts or cancels the operation, so the
 * callbacks, which take mtx, cannot deadlock with that. `armed` counts aio
 * operations in flight (a receive being handled counts until its handler
 * returns).
 *
 * Closing (nng 1.5.2): nng_close frees the contexts while its timer
 * thread may still be expiring an operation on one of them (a
 * use-after-free seen under valgrind). So close first cancels every
 * armed operation, waits for their callbacks, stops every aio, and only
 * then closes the socket, when no aio refers to a context any more.
 * nng_close itself runs with a time limit (close_bounded): nng 1.5 can
 * deadlock there.
 *
 * Process-wide: the first listen or dial tunes glibc's malloc for large
 * messages (heap_tune_once; CACHEW_MALLOPT=0 opts out).
 */
#include "../transport.h"
#include "../../src/core/element_codec.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* ---- framing ------------------------------------------------------------ */

#define FRAME_MAGIC0 'C'
#define FRAME_MAGIC1 'W'
#define FRAME_VERSION 1
#define FRAME_HEAD 16
#define FRAME_KIND_MSG 0
#define FRAME_KIND_ERROR 1
/* The 4-byte request ID that req/rep put before the body: the element
 * codec pads payloads to 16 bytes from the start of the SP message, so
 * that they are aligned where nng reads them (it allocates the ID and the
 * body together). */
#define SP_ID_BYTES 4
/* RECVMAXSZ room over max_msg_size for the SP backtrace (one 4-byte ID
 * here, up to 8 hops through devices). */
#define SP_SLACK 64

/* nng's own guard: frames up to an eighth over the limit are read and
 * refused here, with a logged reason; nng closes the pipe of a larger
 * claim (an 8 GiB length field) before allocating anything, silently. */
static size_t
nng_recv_max(size_t max_msg)
{
	return max_msg + max_msg / 8 + SP_SLACK;
}
/* Error frames carry a short message. */
#define FRAME_ERRMSG_MAX 1024

static void
put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t
get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void
put_head(uint8_t *h, int kind, size_t hdr_len, uint32_t count)
{
	h[0] = FRAME_MAGIC0;
	h[1] = FRAME_MAGIC1;
	h[2] = FRAME_VERSION;
	h[3] = (uint8_t)kind;
	put_u32(h + 4, (uint32_t)hdr_len);
	put_u32(h + 8, count);
	put_u32(h + 12, 0); /* flags: none defined */
}

/* Bytes of the msgpack form of unsigned integer u. */
static size_t
mp_uint_size(uint64_t u)
{
	return u <= 0x7f ? 1 : u <= 0xff ? 2 : u <= 0xffff ? 3
	    : u <= 0xffffffffu ? 5 : 9;
}

/*
 * The most bytes cwi_element_encode can write for e, from the element
 * form (src/core/element_codec.c): array headers of at most 5 bytes,
 * unsigned integers of at most 9, the padding bin of at most 2 + 15
 * bytes and bin headers of at most 5 around each payload. The lengths
 * list of a BYTES component is sized exactly, so that a batch of short
 * strings is not framed in up to 9 times its size. frame_encode relies
 * on this being a true bound: it encodes into memory nng allocated.
 */
static size_t
element_encoded_max(const cwi_element *e)
{
	size_t n = 5;

	for (uint32_t i = 0; i < e->n; i++) {
		const cwi_tensor *t = &e->comp[i];

		n += 1 + 9 + 5 + 9 * (size_t)t->rank;
		if (t->dtype == CACHEW_BYTES) {
			int64_t k = cwi_tensor_numel(t);
			const uint64_t *o = cwi_tensor_offsets(t);

			n += 5 + 5 + (size_t)(o[k] - o[0]);
			for (int64_t j = 0; j < k; j++)
				n += mp_uint_size(o[j + 1] - o[j]);
		} else {
			n += 2 + 15 + 5 + cwi_tensor_nbytes(t);
		}
	}
	return n;
}

/*
 * Encodes m into a new nng_msg; m is not consumed. The elements are
 * encoded straight into the message's body (nng 1.5 cannot send memory
 * it did not allocate, so this one copy of each payload is the least
 * there is): the body is allocated at the bound of the encoding, then
 * its unused tail is chopped off. The encoding starts SP_ID_BYTES before
 * the frame head, where the request ID will be on the receiving side, so
 * that the codec's payload padding is reckoned from the start of the SP
 * message as the receiver sees it; those bytes are trimmed before
 * sending (nng sends the ID from the message header).
 */
static cachew_err
frame_encode(const cwi_msg *m, nng_msg **out)
{
	/* + 1: cwi_strbuf keeps a NUL after its bytes. */
	size_t cap = SP_ID_BYTES + FRAME_HEAD + m->hdr_len + 1;
	cwi_strbuf sb;
	nng_msg *nm;
	cachew_err rv;
	int nrv;

	if (m->hdr_len > UINT32_MAX)
		return cwi_fail(CACHEW_ERANGE, "message header of %zu bytes is "
					       "too large to frame",
		    m->hdr_len);
	for (uint32_t i = 0; i < m->n; i++) {
		if (m->elems[i] == NULL)
			return cwi_fail(CACHEW_EINVAL,
			    "message element %u was taken", i);
		cap += element_encoded_max(m->elems[i]);
	}
	nrv = nng_msg_alloc(&nm, cap);
	if (nrv != 0)
		return cwi_fail(CACHEW_ENOMEM, "nng_msg_alloc(%zu): %s", cap,
		    nng_strerror(nrv));
	/* A strbuf over the body that never needs to grow (the bound
	 * above): it must never realloc memory nng owns. */
	sb.data = nng_msg_body(nm);
	sb.cap = cap;
	sb.len = SP_ID_BYTES + FRAME_HEAD;
	sb.oom = false;
	put_head((uint8_t *)sb.data + SP_ID_BYTES, FRAME_KIND_MSG,
	    m->hdr_len, m->n);
	if (m->hdr_len > 0)
		cwi_strbuf_append(&sb, m->hdr, m->hdr_len);
	for (uint32_t i = 0; i < m->n; i++) {
		rv = cwi_element_encode(m->elems[i], &sb);
		if (rv != CACHEW_OK) {
			nng_msg_free(nm);
			return rv;
		}
	}
	assert(sb.data == nng_msg_body(nm) && sb.len < cap && !sb.oom);
	if (nng_msg_chop(nm, cap - sb.len) != 0 ||
	    nng_msg_trim(nm, SP_ID_BYTES) != 0) {
		nng_msg_free(nm);
		return cwi_fail(CACHEW_EINTERNAL, "framing a message of %zu "
						  "bytes",
		    sb.len);
	}
	*out = nm;
	return CACHEW_OK;
}

static cachew_err
frame_encode_error(cachew_err err, const char *msg, nng_msg **out)
{
	size_t len = strlen(msg);
	nng_msg *nm;

	if (len > FRAME_ERRMSG_MAX)
		len = FRAME_ERRMSG_MAX;
	if (nng_msg_alloc(&nm, FRAME_HEAD + len) != 0)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	put_head(nng_msg_body(nm), FRAME_KIND_ERROR, len, (uint32_t)err);
	memcpy((uint8_t *)nng_msg_body(nm) + FRAME_HEAD, msg, len);
	*out = nm;
	return CACHEW_OK;
}

static void
free_nng_msg(void *ctx, void *data)
{
	(void)data;
	nng_msg_free(ctx);
}

/* What a received frame turned out to be. */
typedef struct frame_in {
	cwi_msg *msg;        /* kind message */
	cachew_err peer_err; /* kind error: the code, msg == NULL */
	char peer_msg[FRAME_ERRMSG_MAX + 1];
} frame_in;

/* Decodes a received frame, consuming nm. CACHEW_EPROTO with the reason
 * in this thread's errmsg when it breaks the framing or exceeds max_msg
 * (the caller closes the pipe); CACHEW_ENOMEM. */
static cachew_err
frame_decode(nng_msg *nm, size_t max_msg, frame_in *fi)
{
	const uint8_t *body = nng_msg_body(nm);
	size_t len = nng_msg_len(nm), off;
	uint32_t hlen, count, flags;
	cwi_buffer *buf = NULL;
	cwi_msg *m = NULL;
	cachew_err rv;

	fi->msg = NULL;
	fi->peer_err = CACHEW_OK;
	fi->peer_msg[0] = '\0';
	if (len > max_msg) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "message of %zu bytes exceeds the limit of %zu", len,
		    max_msg);
		goto fail_nm;
	}
	if (len < FRAME_HEAD) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "frame of %zu bytes is shorter than its %d-byte head", len,
		    FRAME_HEAD);
		goto fail_nm;
	}
	if (body[0] != FRAME_MAGIC0 || body[1] != FRAME_MAGIC1 ||
	    body[2] != FRAME_VERSION) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "bad frame magic or version (%02x %02x %02x)", body[0],
		    body[1], body[2]);
		goto fail_nm;
	}
	hlen = get_u32(body + 4);
	count = get_u32(body + 8);
	flags = get_u32(body + 12);
	if (flags != 0) {
		rv = cwi_fail(CACHEW_EPROTO, "unknown frame flags 0x%x", flags);
		goto fail_nm;
	}
	if (hlen > len - FRAME_HEAD) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "header length %u exceeds the %zu bytes after the head",
		    hlen, len - FRAME_HEAD);
		goto fail_nm;
	}
	off = FRAME_HEAD + hlen;
	if (body[3] == FRAME_KIND_ERROR) {
		size_t n = hlen < FRAME_ERRMSG_MAX ? hlen : FRAME_ERRMSG_MAX;
		if (count == CACHEW_OK || count > CACHEW_EINTERNAL ||
		    off != len) {
			rv = cwi_fail(CACHEW_EPROTO,
			    "error frame with code %u and %zu trailing bytes",
			    count, len - off);
			goto fail_nm;
		}
		fi->peer_err = (cachew_err)count;
		memcpy(fi->peer_msg, body + FRAME_HEAD, n);
		fi->peer_msg[n] = '\0';
		nng_msg_free(nm);
		return CACHEW_OK;
	}
	if (body[3] != FRAME_KIND_MSG) {
		rv = cwi_fail(CACHEW_EPROTO, "unknown frame kind %u", body[3]);
		goto fail_nm;
	}
	/* No element takes fewer than 8 bytes (array, component array,
	 * dtype, shape, two bins): the count is checked before the array of
	 * pointers is allocated. */
	if (count > CWI_MSG_MAX_ELEMENTS || count > (len - off) / 8) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "element count %u does not fit the %zu bytes present",
		    count, len - off);
		goto fail_nm;
	}
	rv = cwi_msg_create(&m);
	if (rv != CACHEW_OK)
		goto fail_nm;
	if (count > 0) {
		m->elems = malloc(count * sizeof(*m->elems));
		if (m->elems == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			goto fail_nm;
		}
		m->cap = count;
	}
	/* From here the buffer owns nm. */
	rv = cwi_buffer_wrap(&buf, (void *)body, len, free_nng_msg, nm);
	if (rv != CACHEW_OK)
		goto fail_nm;
	if (hlen > 0)
		cwi_msg_set_header_view(m, buf, body + FRAME_HEAD, hlen);
	for (uint32_t i = 0; i < count; i++) {
		rv = cwi_element_decode(buf, body, len, &off, &m->elems[i]);
		if (rv != CACHEW_OK) {
			rv = rv == CACHEW_ENOMEM
			    ? rv
			    : cwi_fail(CACHEW_EPROTO, "element %u: %s", i,
				  cwi_errmsg_get());
			goto fail_buf;
		}
		m->n++;
	}
	if (off != len) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "%zu bytes after the last of %u elements", len - off, count);
		goto fail_buf;
	}
	cwi_buffer_unref(buf);
	fi->msg = m;
	return CACHEW_OK;

fail_nm:
	cwi_msg_destroy(m);
	nng_msg_free(nm);
	return rv;
fail_buf:
	cwi_msg_destroy(m);
	cwi_buffer_unref(buf);
	return rv;
}

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
 * The heap of a process that uses nng. nng 1.5 allocates every message
 * it receives with calloc on its I/O threads, and frame_encode's messages
 * come from calloc too. glibc gives each thread an arena of its own; a
 * thread arena's heaps are at most 64 MiB and a heap that becomes free is
 * unmapped at once, whatever the trim threshold, and above the mmap
 * threshold (adaptive, at most 32 MiB) every block is a fresh mapping.
 * Either way a large message page-faults in, zero-filled page by page by
 * the kernel: for W2's batches of 38.5 MB, clear_page and the faults were
 * half of the client's CPU and part of the workers'
 * (docs/performance.md, W5); 1 MiB messages met the same in madvise'd
 * arena tops. So, once per process, at its first nng socket: one arena
 * (M_ARENA_MAX 1: nng's threads, which attach to an arena on their first
 * malloc, then share the main heap), blocks up to 64 MiB in the heap,
 * and a free top kept up to 64 MiB. Reused heap memory costs calloc a
 * memset, a fraction of the faults. Measured on W2 through the service
 * (2000 images, docs/performance.md): the client's CPU 0.88-0.92 ->
 * 0.39-0.45 s against glibc's defaults, and 0.62-0.74 -> 0.37-0.40 s
 * against the thresholds alone (which left its peak RSS at 267 MiB
 * instead of 121); the workers' CPU 6-12 % lower. The price: threads
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

/*
 * Closing a socket, with a bound. nng 1.5.2's nng_close can wait forever
 * (nanomsg/nng#1543 and #1813, fixed upstream in 1.8's nanomsg/nng#1824):
 * its reaper thread gets stuck on a pipe's teardown and nng_close waits
 * for that pipe. A client seen stuck there never exited. So nng_close
 * runs on a thread of its own, and a close that has not returned within
 * CLOSE_TIMEOUT_MS is logged and abandoned: the caller goes on, and
 * whatever the socket's operations refer to (aios, contexts) is leaked
 * rather than freed under nng's feet. Every aio of the socket is stopped
 * before this is called, so no callback of ours can run afterwards.
 */
#define CLOSE_TIMEOUT_MS 10000

typedef struct sock_closer {
	nng_socket sock;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	bool done;
	bool abandoned; /* the closing thread frees this */
} sock_closer;

static void
closer_free(sock_closer *k)
{
	pthread_cond_destroy(&k->cv);
	pthread_mutex_destroy(&k->mtx);
	free(k);
}

static void *
closer_main(void *arg)
{
	sock_closer *k = arg;
	bool abandoned;

	nng_close(k->sock);
	pthread_mutex_lock(&k->mtx);
	k->done = true;
	abandoned = k->abandoned;
	pthread_cond_signal(&k->cv);
	pthread_mutex_unlock(&k->mtx);
	if (abandoned)
		closer_free(k);
	return NULL;
}

/* nng_close(sock) within CLOSE_TIMEOUT_MS: true when it returned, false
 * when it was abandoned (logged). */
static bool
close_bounded(nng_socket sock, const char *url)
{
	pthread_condattr_t ca;
	struct timespec until;
	sock_closer *k = calloc(1, sizeof(*k));
	pthread_t th;
	bool done;

	if (k == NULL) {
		nng_close(sock); /* no memory for the bound: unbounded */
		return true;
	}
	k->sock = sock;
	pthread_mutex_init(&k->mtx, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&k->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&th, NULL, closer_main, k) != 0) {
		closer_free(k);
		nng_close(sock);
		return true;
	}
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += CLOSE_TIMEOUT_MS / 1000;
	until.tv_nsec += (long)(CLOSE_TIMEOUT_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&k->mtx);
	while (!k->done &&
	       pthread_cond_timedwait(&k->cv, &k->mtx, &until) != ETIMEDOUT)
		;
	done = k->done;
	if (!done)
		k->abandoned = true;
	pthread_mutex_unlock(&k->mtx);
	if (done) {
		pthread_join(th, NULL);
		closer_free(k);
		return true;
	}
	pthread_detach(th);
	cwi_log(CACHEW_LOG_WARN, "transport",
	    "url=%s reason=\"nng_close did not return within %d ms (nng 1.5 "
	    "close deadlock, nanomsg/nng#1543)\" action=abandoned",
	    url, CLOSE_TIMEOUT_MS);
	return false;
}

/* The remote address of a pipe, for logs. */
static void
pipe_peer(nng_pipe p, char *buf, size_t len)
{
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0) {
		snprintf(buf, len, "pipe#%d", nng_pipe_id(p));
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
		snprintf(buf, len, "pipe#%d", nng_pipe_id(p));
		break;
	}
}

/* Closes the pipe of a peer that broke the framing, with a WARN line. */
static void
peer_reset(nng_pipe p, const char *url, const char *reason)
{
	char peer[160];

	pipe_peer(p, peer, sizeof(peer));
	cwi_log(CACHEW_LOG_WARN, "transport",
	    "peer=%s url=%s reason=\"%s\" action=reset", peer, url, reason);
	nng_pipe_close(p);
}

/* ---- server ------------------------------------------------------------- */

typedef struct nt_listener nt_listener;

typedef enum sctx_state { SC_IDLE, SC_RECV, SC_HELD, SC_SEND } sctx_state;

typedef struct nt_sctx {
	nt_listener *l;
	nng_ctx ctx;
	nng_aio *aio;
	sctx_state state;
	struct nt_sctx *next; /* on l->all */
} nt_sctx;

struct nt_listener {
	cwi_listener base;
	nng_socket sock;
	nng_listener lst;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	bool closed;
	unsigned armed;     /* aio operations in flight (see the top) */
	unsigned receiving; /* contexts with a receive armed */
	unsigned nctx, max_ctx;
	unsigned refs; /* the owner's + one per request held */
	bool abandoned; /* nng_close timed out: leak the aios */
	nt_sctx *all;
	size_t max_msg;
	int send_timeout_ms;
};

typedef struct nt_req {
	cwi_request base;
	nt_sctx *sc;
	nng_pipe pipe;
	char peer[160];
} nt_req;

static void srv_cb(void *arg);

static void
listener_free(nt_listener *l)
{
	nt_sctx *sc, *nx;

	for (sc = l->all; sc != NULL; sc = nx) {
		nx = sc->next;
		if (!l->abandoned)
			nng_aio_free(sc->aio);
		free(sc);
	}
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mtx);
	free(l->base.url);
	free(l);
}

static void
listener_unref(nt_listener *l)
{
	bool last;

	pthread_mutex_lock(&l->mtx);
	last = --l->refs == 0;
	pthread_mutex_unlock(&l->mtx);
	if (last)
		listener_free(l);
}

/* Puts sc back to receiving (or idle once closed). `done_op` also ends
 * the operation whose callback is calling. */
static void
sctx_rearm(nt_sctx *sc, bool done_op)
{
	nt_listener *l = sc->l;
	bool arm;

	pthread_mutex_lock(&l->mtx);
	if (done_op)
		l->armed--;
	arm = !l->closed;
	if (arm) {
		sc->state = SC_RECV;
		l->armed++;
		l->receiving++;
		nng_ctx_recv(sc->ctx, sc->aio);
	} else {
		sc->state = SC_IDLE;
		if (l->armed == 0)
			pthread_cond_broadcast(&l->cv);
	}
	pthread_mutex_unlock(&l->mtx);
}

static cachew_err
sctx_open(nt_listener *l, nt_sctx **out)
{
	nt_sctx *sc = calloc(1, sizeof(*sc));
	int rv;

	if (sc == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	sc->l = l;
	if ((rv = nng_aio_alloc(&sc->aio, srv_cb, sc)) != 0) {
		free(sc);
		return nng_err(rv, l->base.url, "nng_aio_alloc");
	}
	if ((rv = nng_ctx_open(&sc->ctx, l->sock)) != 0) {
		nng_aio_free(sc->aio);
		free(sc);
		return nng_err(rv, l->base.url, "nng_ctx_open");
	}
	pthread_mutex_lock(&l->mtx);
	sc->next = l->all;
	l->all = sc;
	pthread_mutex_unlock(&l->mtx);
	*out = sc;
	return CACHEW_OK;
}

/* One more receiving context (l->nctx was already counted). */
static void
listener_grow(nt_listener *l)
{
	nt_sctx *sc;

	if (sctx_open(l, &sc) != CACHEW_OK) {
		pthread_mutex_lock(&l->mtx);
		l->nctx--;
		pthread_mutex_unlock(&l->mtx);
		cwi_log(CACHEW_LOG_WARN, "transport",
		    "url=%s reason=\"cannot add a context: %s\"", l->base.url,
		    cwi_errmsg_get());
		return;
	}
	sctx_rearm(sc, false);
}

static const cwi_request_ops nt_request_ops;

/* A request arrived on sc: decode it and call the handler (the callback's
 * operation stays counted in armed until srv_cb returns). */
static void
srv_recv_done(nt_sctx *sc)
{
	nt_listener *l = sc->l;
	nng_msg *nm = nng_aio_get_msg(sc->aio);
	nng_pipe pipe = nng_msg_get_pipe(nm);
	nt_req *r = NULL;
	frame_in fi;
	cachew_err rv;
	bool grow;

	nng_aio_set_msg(sc->aio, NULL);
	pthread_mutex_lock(&l->mtx);
	l->receiving--;
	if (l->closed) {
		/* Arrived while closing: no handler starts any more. */
		sc->state = SC_IDLE;
		pthread_mutex_unlock(&l->mtx);
		nng_msg_free(nm);
		return;
	}
	sc->state = SC_HELD;
	grow = l->receiving == 0 && l->nctx < l->max_ctx;
	if (grow)
		l->nctx++;
	pthread_mutex_unlock(&l->mtx);
	if (grow)
		listener_grow(l);

	rv = frame_decode(nm, l->max_msg, &fi);
	if (rv == CACHEW_OK && fi.msg == NULL)
		rv = cwi_fail(CACHEW_EPROTO, "a request may not be an error "
					     "frame");
	if (rv == CACHEW_OK && (r = calloc(1, sizeof(*r))) == NULL) {
		cwi_msg_destroy(fi.msg);
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	if (rv != CACHEW_OK) {
		if (rv == CACHEW_EPROTO)
			peer_reset(pipe, l->base.url, cwi_errmsg_get());
		else
			cwi_log(CACHEW_LOG_WARN, "transport",
			    "url=%s reason=\"request dropped: %s\"",
			    l->base.url, cwi_errmsg_get());
		sctx_rearm(sc, false);
		return;
	}
	r->base.ops = &nt_request_ops;
	r->base.msg = fi.msg;
	r->sc = sc;
	r->pipe = pipe;
	pthread_mutex_lock(&l->mtx);
	l->refs++;
	pthread_mutex_unlock(&l->mtx);
	l->base.handler(l->base.arg, &r->base);
}

static void
srv_cb(void *arg)
{
	nt_sctx *sc = arg;
	nt_listener *l = sc->l;
	int rv = nng_aio_result(sc->aio);

	if (sc->state == SC_SEND) {
		if (rv != 0) {
			nng_msg *nm = nng_aio_get_msg(sc->aio);
			nng_aio_set_msg(sc->aio, NULL);
			nng_msg_free(nm);
			if (rv != NNG_ECLOSED && rv != NNG_ECANCELED)
				cwi_log(CACHEW_LOG_DEBUG, "transport",
				    "url=%s reason=\"reply not sent: %s\"",
				    l->base.url, nng_strerror(rv));
		}
		sctx_rearm(sc, true);
		return;
	}
	if (rv != 0) {
		pthread_mutex_lock(&l->mtx);
		l->receiving--;
		pthread_mutex_unlock(&l->mtx);
		if (rv != NNG_ECLOSED && rv != NNG_ECANCELED)
			cwi_log(CACHEW_LOG_WARN, "transport",
			    "url=%s reason=\"receive failed: %s\"", l->base.url,
			    nng_strerror(rv));
		if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
			pthread_mutex_lock(&l->mtx);
			sc->state = SC_IDLE;
			if (--l->armed == 0)
				pthread_cond_broadcast(&l->cv);
			pthread_mutex_unlock(&l->mtx);
			return;
		}
		sctx_rearm(sc, true);
		return;
	}
	srv_recv_done(sc);
	/* The handler has returned: l may go once armed reaches zero. */
	pthread_mutex_lock(&l->mtx);
	if (--l->armed == 0 && l->closed)
		pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mtx);
}

/* Sends a framed reply on r's context and consumes r. */
static cachew_err
srv_send(nt_req *r, nng_msg *nm)
{
	nt_sctx *sc = r->sc;
	nt_listener *l = sc->l;
	bool closed;

	cwi_msg_destroy(r->base.msg);
	free(r);
	pthread_mutex_lock(&l->mtx);
	closed = l->closed;
	if (closed) {
		sc->state = SC_IDLE;
	} else {
		sc->state = SC_SEND;
		l->armed++;
		nng_aio_set_msg(sc->aio, nm);
		nng_aio_set_timeout(sc->aio, l->send_timeout_ms);
		nng_ctx_send(sc->ctx, sc->aio);
	}
	pthread_mutex_unlock(&l->mtx);
	if (closed) {
		cwi_fail(CACHEW_ECLOSED, "%s: listener is closed", l->base.url);
		nng_msg_free(nm);
		listener_unref(l);
		return CACHEW_ECLOSED;
	}
	listener_unref(l);
	return CACHEW_OK;
}

static cachew_err
nt_reply(cwi_request *rq, cwi_msg *reply)
{
	nt_req *r = (nt_req *)rq;
	nng_msg *nm;
	cachew_err rv, rv2;

	rv = frame_encode(reply, &nm);
	if (rv != CACHEW_OK) {
		/* Tell the client why instead of leaving it to time out. */
		char why[512];
		snprintf(why, sizeof(why), "%s: reply not sent: %s",
		    r->sc->l->base.url, cwi_errmsg_get());
		if (frame_encode_error(rv, why, &nm) == CACHEW_OK)
			srv_send(r, nm);
		else
			cwi_request_drop(rq);
		return cwi_fail(rv, "%s", why);
	}
	rv2 = srv_send(r, nm);
	if (rv2 == CACHEW_OK)
		cwi_msg_destroy(reply);
	return rv2;
}

static cachew_err
nt_fail(cwi_request *rq, cachew_err err, const char *msg)
{
	nt_req *r = (nt_req *)rq;
	char full[FRAME_ERRMSG_MAX];
	nng_msg *nm;

	snprintf(full, sizeof(full), "%s: %s", r->sc->l->base.url, msg);
	if (frame_encode_error(err, full, &nm) != CACHEW_OK) {
		cwi_request_drop(rq);
		return CACHEW_ENOMEM;
	}
	return srv_send(r, nm);
}

/* Consumes r without a reply: its context receives again. */
static void
srv_release(nt_req *r)
{
	nt_sctx *sc = r->sc;
	nt_listener *l = sc->l;

	cwi_msg_destroy(r->base.msg);
	free(r);
	sctx_rearm(sc, false);
	listener_unref(l);
}

static void
nt_drop(cwi_request *rq)
{
	srv_release((nt_req *)rq);
}

static void
nt_reject(cwi_request *rq, const char *reason)
{
	nt_req *r = (nt_req *)rq;

	peer_reset(r->pipe, r->sc->l->base.url, reason);
	srv_release(r);
}

static const char *
nt_peer(cwi_request *rq)
{
	nt_req *r = (nt_req *)rq;

	if (r->peer[0] == '\0')
		pipe_peer(r->pipe, r->peer, sizeof(r->peer));
	return r->peer;
}

static const cwi_request_ops nt_request_ops = {
    .reply = nt_reply,
    .fail = nt_fail,
    .drop = nt_drop,
    .reject = nt_reject,
    .peer = nt_peer,
};

static void
nt_listener_close(cwi_listener *ll)
{
	nt_listener *l = (nt_listener *)ll;
	bool first;

	pthread_mutex_lock(&l->mtx);
	first = !l->closed;
	l->closed = true;
	for (nt_sctx *sc = l->all; sc != NULL; sc = sc->next)
		if (sc->state == SC_RECV || sc->state == SC_SEND)
			nng_aio_cancel(sc->aio);
	while (l->armed > 0)
		pthread_cond_wait(&l->cv, &l->mtx);
	pthread_mutex_unlock(&l->mtx);
	/* See the top: no aio may be in nng's hands when the socket goes.
	 * The list is stable: contexts are only added while not closed. */
	if (first) {
		for (nt_sctx *sc = l->all; sc != NULL; sc = sc->next)
			nng_aio_stop(sc->aio);
		l->abandoned = !close_bounded(l->sock, l->base.url);
		/* nng 1.5 leaves the socket file of an ipc listener. */
		if (strncmp(l->base.url, "ipc://", 6) == 0)
			unlink(l->base.url + 6);
	}
}

static void
nt_listener_free(cwi_listener *ll)
{
	listener_unref((nt_listener *)ll);
}

static const cwi_listener_ops nt_listener_ops = {
    .close = nt_listener_close,
    .free = nt_listener_free,
};

/* "tcp://host:0" with the port nng bound; other URLs unchanged. */
static char *
bound_url(const char *url, nng_listener lst)
{
	const char *colon;
	int port;

	if (strncmp(url, "tcp", 3) != 0 ||
	    nng_listener_get_int(lst, NNG_OPT_TCP_BOUND_PORT, &port) != 0 ||
	    (colon = strrchr(url, ':')) == NULL || colon < url + 6)
		return cwi_strdup(url);
	return cwi_asprintf("%.*s:%d", (int)(colon - url), url, port);
}

/* Initial receiving contexts; more are added as requests are held. */
#define LISTEN_CTX_INITIAL 4u

static cachew_err
nt_listen(cwi_listener **out, const char *url, const cwi_transport_opts *opts,
    cwi_handler_fn handler, void *arg)
{
	nt_listener *l = calloc(1, sizeof(*l));
	nt_sctx *initial[LISTEN_CTX_INITIAL];
	unsigned n0;
	cachew_err rv;
	int nrv;

	if (l == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&l->mtx, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->base.ops = &nt_listener_ops;
	l->base.handler = handler;
	l->base.arg = arg;
	l->max_msg = opts->max_msg_size;
	l->max_ctx = opts->max_inflight;
	l->send_timeout_ms = opts->send_timeout_ms;
	l->refs = 1;
	pthread_once(&heap_once, heap_tune_once);
	if ((nrv = nng_rep0_open(&l->sock)) != 0) {
		rv = nng_err(nrv, url, "nng_rep0_open");
		goto fail_nosock;
	}
	if ((nrv = nng_socket_set_size(l->sock, NNG_OPT_RECVMAXSZ,
		 nng_recv_max(opts->max_msg_size))) != 0 ||
	    (nrv = nng_listener_create(&l->lst, l->sock, url)) != 0 ||
	    (nrv = nng_listener_set_size(l->lst, NNG_OPT_RECVMAXSZ,
		 nng_recv_max(opts->max_msg_size))) != 0 ||
	    (nrv = nng_listener_start(l->lst, 0)) != 0) {
		rv = nng_err(nrv, url, "listen");
		goto fail;
	}
	l->base.url = bound_url(url, l->lst);
	if (l->base.url == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	n0 = l->max_ctx < LISTEN_CTX_INITIAL ? l->max_ctx : LISTEN_CTX_INITIAL;
	for (unsigned i = 0; i < n0; i++) {
		rv = sctx_open(l, &initial[i]);
		if (rv != CACHEW_OK)
			goto fail;
		l->nctx++;
	}
	for (unsigned i = 0; i < n0; i++)
		sctx_rearm(initial[i], false);
	*out = &l->base;
	return CACHEW_OK;

fail:
	nng_close(l->sock);
fail_nosock:
	l->refs = 1;
	listener_free(l);
	return rv;
}

/* ---- client ------------------------------------------------------------- */

/*
 * Deadlines: a request's operations run without an nng timeout. nng
 * 1.5.2's timer thread can expire an operation at the moment its reply
 * completes it and then cancel whatever the context does next (the next
 * request on a reused context failed with a timeout) or touch a context
 * that close freed. Instead the completion queue tells us when a deadline
 * passes (cwi_pending_set_cancel) and cli_cancel cancels the operation
 * under the connection lock, where nothing can reuse the context.
 */

typedef struct nt_conn nt_conn;

typedef enum cctx_state { CC_IDLE, CC_SEND, CC_RECV } cctx_state;

typedef struct nt_cctx {
	nt_conn *c;
	nng_ctx ctx;
	nng_aio *aio;
	cwi_pending *p;  /* the request this context carries */
	cctx_state state;
	bool in_nng;     /* an operation is armed */
	bool expired;    /* the deadline passed before it was armed */
	struct nt_cctx *next_all, *next_free;
} nt_cctx;

struct nt_conn {
	cwi_conn base;
	nng_socket sock;
	nng_dialer dialer;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	bool closed;
	unsigned armed; /* contexts with an operation in nng */
	bool abandoned; /* nng_close timed out: leak the aios */
	nt_cctx *all, *free;
	size_t max_msg;
};

static void cli_cb(void *arg);

static cachew_err
cctx_open(nt_conn *c, nt_cctx **out)
{
	nt_cctx *x = calloc(1, sizeof(*x));
	int rv;

	if (x == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	x->c = c;
	if ((rv = nng_aio_alloc(&x->aio, cli_cb, x)) != 0) {
		free(x);
		return nng_err(rv, c->base.url, "nng_aio_alloc");
	}
	nng_aio_set_timeout(x->aio, NNG_DURATION_INFINITE);
	if ((rv = nng_ctx_open(&x->ctx, c->sock)) != 0) {
		nng_aio_free(x->aio);
		free(x);
		return nng_err(rv, c->base.url, "nng_ctx_open");
	}
	*out = x;
	return CACHEW_OK;
}

/* The outcome of a failed operation, as the waiting client sees it. */
static cachew_err
cli_error(nt_conn *c, int rv, char *msg, size_t len)
{
	switch (rv) {
	case NNG_ETIMEDOUT:
		snprintf(msg, len, "%s: no reply in time", c->base.url);
		return CACHEW_ETIMEDOUT;
	case NNG_ECLOSED:
		snprintf(msg, len, "%s: connection closed", c->base.url);
		return CACHEW_ECLOSED;
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
		snprintf(msg, len, "%s: connection reset by peer", c->base.url);
		return CACHEW_ECLOSED;
	default:
		snprintf(msg, len, "%s: %s", c->base.url, nng_strerror(rv));
		return CACHEW_EIO;
	}
}

/* Returns x to the free list (x->p already completed). */
static void
cctx_done_locked(nt_conn *c, nt_cctx *x)
{
	x->p = NULL;
	x->state = CC_IDLE;
	x->expired = false;
	x->next_free = c->free;
	c->free = x;
}

/* The deadline of x's request passed (see the top of this section). */
static void
cli_cancel(void *arg, cwi_pending *p)
{
	nt_cctx *x = arg;
	nt_conn *c = x->c;

	pthread_mutex_lock(&c->mtx);
	if (x->p == p) {
		if (x->in_nng)
			nng_aio_cancel(x->aio);
		else
			x->expired = true;
	}
	pthread_mutex_unlock(&c->mtx);
}

static void
cli_cb(void *arg)
{
	nt_cctx *x = arg;
	nt_conn *c = x->c;
	int rv = nng_aio_result(x->aio);
	cwi_pending *p = x->p;
	cachew_err err = CACHEW_OK;
	cwi_msg *reply = NULL;
	char msg[FRAME_ERRMSG_MAX + 160];
	bool closed;

	pthread_mutex_lock(&c->mtx);
	x->in_nng = false;
	closed = c->closed;
	if (x->state == CC_SEND && rv == 0 && !closed) {
		/* Sent: now wait for the reply. */
		x->state = CC_RECV;
		x->in_nng = true;
		nng_ctx_recv(x->ctx, x->aio);
		pthread_mutex_unlock(&c->mtx);
		return;
	}
	pthread_mutex_unlock(&c->mtx);
	if (rv == NNG_ECANCELED || (rv == 0 && closed && x->state == CC_SEND))
		rv = closed ? NNG_ECLOSED : NNG_ETIMEDOUT;
	msg[0] = '\0';
	if (rv != 0) {
		if (x->state == CC_SEND) {
			nng_msg *nm = nng_aio_get_msg(x->aio);
			nng_aio_set_msg(x->aio, NULL);
			nng_msg_free(nm);
		}
		err = cli_error(c, rv, msg, sizeof(msg));
	} else {
		nng_msg *nm = nng_aio_get_msg(x->aio);
		nng_pipe pipe = nng_msg_get_pipe(nm);
		frame_in fi;

		nng_aio_set_msg(x->aio, NULL);
		err = frame_decode(nm, c->max_msg, &fi);
		if (err == CACHEW_EPROTO) {
			peer_reset(pipe, c->base.url, cwi_errmsg_get());
			snprintf(msg, sizeof(msg), "%s: malformed reply: %s",
			    c->base.url, cwi_errmsg_get());
		} else if (err != CACHEW_OK) {
			snprintf(msg, sizeof(msg), "%s: %s", c->base.url,
			    cwi_errmsg_get());
		} else if (fi.msg == NULL) {
			err = fi.peer_err;
			snprintf(msg, sizeof(msg), "%s", fi.peer_msg);
		} else {
			reply = fi.msg;
		}
	}
	/* No connection lock here: the queue's lock comes first. */
	cwi_pending_complete(p, err, reply, msg);

	pthread_mutex_lock(&c->mtx);
	cctx_done_locked(c, x);
	if (--c->armed == 0 && c->closed)
		pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mtx);
}

static cachew_err
nt_send(cwi_conn *cc, cwi_msg *req, cwi_pending *p)
{
	nt_conn *c = (nt_conn *)cc;
	nt_cctx *x = NULL, *fresh = NULL;
	cachew_err err = CACHEW_OK;
	nng_msg *nm;
	cachew_err rv;

	pthread_mutex_lock(&c->mtx);
	if (!c->closed && (x = c->free) != NULL)
		c->free = x->next_free;
	pthread_mutex_unlock(&c->mtx);
	if (x == NULL) {
		rv = cctx_open(c, &fresh);
		if (rv != CACHEW_OK)
			return rv;
		x = fresh;
	}
	rv = frame_encode(req, &nm);
	pthread_mutex_lock(&c->mtx);
	if (fresh != NULL && !c->closed) {
		/* Only while open: close walks the list unlocked once
		 * closed. */
		fresh->next_all = c->all;
		c->all = fresh;
		fresh = NULL;
	}
	if (rv != CACHEW_OK || c->closed) {
		if (fresh == NULL) {
			x->next_free = c->free;
			c->free = x;
		}
		pthread_mutex_unlock(&c->mtx);
		if (fresh != NULL) {
			/* Never armed; its context goes with the socket. */
			nng_aio_free(fresh->aio);
			free(fresh);
		}
		if (rv != CACHEW_OK)
			return rv;
		nng_msg_free(nm);
		return cwi_fail(CACHEW_ECLOSED, "%s: connection is closed",
		    c->base.url);
	}
	/* x is reserved for p; the queue's lock may not be taken under
	 * ours, so the hook is set in between. */
	x->p = p;
	x->state = CC_SEND;
	pthread_mutex_unlock(&c->mtx);
	cwi_pending_set_cancel(p, cli_cancel, x);

	pthread_mutex_lock(&c->mtx);
	if (c->closed || x->expired) {
		err = c->closed ? CACHEW_ECLOSED : CACHEW_ETIMEDOUT;
		cctx_done_locked(c, x);
	} else {
		c->armed++;
		x->in_nng = true;
		nng_aio_set_msg(x->aio, nm);
		nng_ctx_send(x->ctx, x->aio);
		nm = NULL;
	}
	pthread_mutex_unlock(&c->mtx);
	cwi_msg_destroy(req);
	if (nm != NULL) {
		/* Accepted, then ended before it left: complete it here. */
		nng_msg_free(nm);
		cwi_pending_complete(p, err, NULL,
		    err == CACHEW_ECLOSED ? "connection closed"
					  : "request timed out");
	}
	return CACHEW_OK;
}

static void
nt_conn_close(cwi_conn *cc)
{
	nt_conn *c = (nt_conn *)cc;
	bool first;

	pthread_mutex_lock(&c->mtx);
	first = !c->closed;
	c->closed = true;
	for (nt_cctx *x = c->all; x != NULL; x = x->next_all)
		if (x->in_nng)
			nng_aio_cancel(x->aio);
	while (c->armed > 0)
		pthread_cond_wait(&c->cv, &c->mtx);
	pthread_mutex_unlock(&c->mtx);
	/* See the top of the file: stop every aio before the socket goes. */
	if (first) {
		for (nt_cctx *x = c->all; x != NULL; x = x->next_all)
			nng_aio_stop(x->aio);
		/* Each context explicitly: nng 1.5's nng_close() waits for
		 * every context of the socket to go, and was seen to wait
		 * forever on a req context whose request had been canceled. */
		for (nt_cctx *x = c->all; x != NULL; x = x->next_all)
			(void)nng_ctx_close(x->ctx);
		c->abandoned = !close_bounded(c->sock, c->base.url);
	}
}

static void
conn_free(nt_conn *c)
{
	nt_cctx *x, *nx;

	for (x = c->all; x != NULL; x = nx) {
		nx = x->next_all;
		if (!c->abandoned)
			nng_aio_free(x->aio);
		free(x);
	}
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mtx);
	free(c->base.url);
	free(c);
}

static void
nt_conn_free(cwi_conn *cc)
{
	conn_free((nt_conn *)cc);
}

static const cwi_conn_ops nt_conn_ops = {
    .send = nt_send,
    .close = nt_conn_close,
    .free = nt_conn_free,
};

static cachew_err
nt_dial(cwi_conn **out, const char *url, const cwi_transport_opts *opts)
{
	nt_conn *c = calloc(1, sizeof(*c));
	size_t rmax = nng_recv_max(opts->max_msg_size);
	cachew_err rv;
	int nrv;

	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&c->mtx, NULL);
	pthread_cond_init(&c->cv, NULL);
	c->base.ops = &nt_conn_ops;
	c->max_msg = opts->max_msg_size;
	c->base.url = cwi_strdup(url);
	if (c->base.url == NULL) {
		conn_free(c);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	pthread_once(&heap_once, heap_tune_once);
	if ((nrv = nng_req0_open(&c->sock)) != 0) {
		rv = nng_err(nrv, url, "nng_req0_open");
		conn_free(c);
		return rv;
	}
	/* We retry ourselves, with our own timeouts: a resend would reach a
	 * server that may already be working on the first copy. */
	if ((nrv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME,
		 NNG_DURATION_INFINITE)) != 0 ||
	    (nrv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, rmax)) != 0 ||
	    (nrv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT,
		 opts->reconnect_min_ms)) != 0 ||
	    (nrv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT,
		 opts->reconnect_max_ms)) != 0 ||
	    (nrv = nng_dialer_create(&c->dialer, c->sock, url)) != 0 ||
	    (nrv = nng_dialer_set_size(c->dialer, NNG_OPT_RECVMAXSZ, rmax)) !=
		0 ||
	    (nrv = nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMINT,
		 opts->reconnect_min_ms)) != 0 ||
	    (nrv = nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMAXT,
		 opts->reconnect_max_ms)) != 0 ||
	    (nrv = nng_dialer_start(c->dialer,
		 opts->dial_async ? NNG_FLAG_NONBLOCK : 0)) != 0) {
		rv = nng_err(nrv, url, "dial");
		nng_close(c->sock);
		conn_free(c);
		return rv;
	}
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
