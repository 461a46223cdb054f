/*
 * transport.h - the service's message transports: one small interface,
 * two implementations chosen by URL scheme.
 *
 *   inproc://name          transports/inproc/inproc.c: in-process; the
 *                          handler runs on the sending thread and the
 *                          message moves as a pointer: nothing is copied
 *                          or serialized (elements keep their refcounts)
 *   tcp://host:port        transports/nng/nng_transport.c: nng 1.5's
 *   tls+tcp://host:port    byte streams carrying nng's req/rep wire
 *   ipc:///path            protocol; elements are serialized with the
 *                          element codec, payloads written from and read
 *                          into place (no copy besides the kernel's);
 *                          tls+tcp is the same over TLS 1.2 (nng's
 *                          mbedTLS engine; transports/nng/nng_tls.c);
 *                          on one host a client may offer a region of
 *                          shared memory for its large replies
 *                          (shm_bytes, transports/nng/nng_shm.c)
 *
 * The model is request/reply. A client dials a URL and gets a connection
 * (cwi_conn); it sends a request message and gets exactly one completion
 * for it: a reply message or an error. A connection carries any number of
 * requests at once: cwi_conn_send() returns at once and the completion
 * arrives on a completion queue (cwi_cq) that may gather the replies of
 * many connections, so a client keeps N get-next requests in flight to
 * each worker and takes replies as they come, in any order.
 * cwi_conn_call() is the blocking form for control messages.
 *
 * A server listens on a URL with a handler. The handler is called once per
 * received request with a cwi_request that it answers exactly once, now or
 * later and from any thread: with a reply (cwi_request_reply), an error
 * (cwi_request_fail), nothing (cwi_request_drop: the client times out), or
 * by closing the peer's connection when the request is malformed
 * (cwi_request_reject). Holding a request is how the data path waits for
 * elements without blocking a thread.
 *
 * A message (cwi_msg) is a header, msgpack bytes of the wire protocol that
 * the transport never interprets, plus zero or more elements. The nng
 * transport frames them as docs/protocol.md, "Transport framing", says;
 * received tensors are zero-copy views into the received message.
 *
 * Timeouts: every request has one (its completion is CACHEW_ETIMEDOUT when
 * it passes) and every wait has one. Closing: closing a connection
 * completes its requests in flight with CACHEW_ECLOSED and wakes whoever
 * waits for them; closing a listener does the same to the requests of
 * every connection it accepted and stops calling the handler. A peer that
 * resets a connection (a listener closing, a request rejected as malformed
 * or oversized) completes that connection's requests in flight with
 * CACHEW_ECLOSED too; the connection itself stays usable and reconnects by
 * itself (nng redials at once, then with backoff; inproc finds the
 * listener of that name again).
 *
 * Limits: every receiver has a size limit (cwi_transport_opts
 * .max_msg_size). A message over it resets the sender's connection with a
 * logged reason; the process stays up. nng refuses a length field over
 * the limit (an 8 GiB claim) before allocating anything, and a listener
 * allocates a message as its bytes arrive, within a budget per connection
 * and in total (max_pending_bytes). inproc applies the same size limit to
 * the header plus the elements' byte sizes.
 *
 * TLS: a tls+tcp listener needs a certificate and its key, a dialer the
 * CA that signs the server's certificate (cwi_transport_opts .tls_*);
 * a listener may require client certificates (mutual TLS). A handshake
 * that fails (a certificate not trusted, expired or missing, TLS on one
 * side only) is not transient: the dialer finds out why (it connects
 * once more and looks at the peer's certificate and answers), completes
 * the requests waiting with CACHEW_EAUTH and a message naming the peer
 * and the reason, and fails new ones at once until a link works again;
 * a listener logs the refused peer (WARN). A tcp dialer whose peer
 * turns out to be a TLS listener fails the same way.
 *
 * Errors: dialing with no listener is CACHEW_EIO ("connection refused");
 * listening on a taken address or name is CACHEW_EEXIST; a bad URL is
 * CACHEW_EINVAL; a peer breaking the framing is CACHEW_EPROTO. Every
 * failing call sets this thread's cachew_errmsg() naming the URL or peer.
 *
 * Logging: module "transport", one key=value line per event, e.g.
 *   peer=tcp://127.0.0.1:40022 url=tcp://127.0.0.1:7070 reason="..."
 */
#ifndef CWI_TRANSPORT_H
#define CWI_TRANSPORT_H

#include "../src/core/core.h"

/* ---- options ------------------------------------------------------------ */

/* Default receive limits: data sockets carry batches of elements; control
 * sockets only small msgpack documents. */
#define CWI_TRANSPORT_MAX_MSG_DEFAULT ((size_t)256 << 20)
#define CWI_TRANSPORT_MAX_MSG_CONTROL ((size_t)1 << 20)
/* Elements per message, whatever the limit in bytes. */
#define CWI_MSG_MAX_ELEMENTS (1u << 20)

/* A TLS listener's demand on its clients: none (no client certificate
 * asked for), optional (verified against tls_ca when shown), required. */
typedef enum cwi_tls_client_auth {
	CWI_TLS_CLIENT_AUTH_NONE = 0,
	CWI_TLS_CLIENT_AUTH_OPTIONAL,
	CWI_TLS_CLIENT_AUTH_REQUIRED,
} cwi_tls_client_auth;

/* Options of a listener or a connection; zero fields take the defaults
 * that cwi_transport_opts_init() writes. */
typedef struct cwi_transport_opts {
	/* Largest message accepted from a peer, in bytes (header plus
	 * elements as framed on nng). Default 256 MiB. */
	size_t max_msg_size;
	/* Listener: requests held at once. Past it, nng stops reading from
	 * peers until one is answered. Default 4096. */
	unsigned max_inflight;
	/* nng listener: bytes it may hold of what peers sent, across its
	 * connections: the messages being received (a buffer grows as a
	 * message's bytes arrive, whatever its length field claims) and the
	 * requests received and not yet answered. A connection that would
	 * hold more than twice max_msg_size, or take the listener over this,
	 * is reset with a logged reason. Default (0): twice max_msg_size, at
	 * least 32 MiB. */
	size_t max_pending_bytes;
	/* nng: how long a peer may read nothing of a message waiting to be
	 * written before its connection is reset, in ms; and at a listener,
	 * how long a peer may take to send one message whole. Default
	 * 30000. */
	int send_timeout_ms;
	/* nng dialers: redial delays after a refused connection (or one
	 * that died young), doubling from min to max, in ms, each wait drawn
	 * from the upper half of the current delay (jitter). A connection
	 * that lived is redialed at once. Defaults 100 and 2000. */
	int reconnect_min_ms;
	int reconnect_max_ms;
	/* Dial: return at once and connect in the background (requests wait
	 * for the connection within their timeout) instead of failing when
	 * nobody listens yet. */
	bool dial_async;
	/* dial_async: a peer never reached whose every dial has failed
	 * (refused, unreachable) for this long, in ms, is unreachable:
	 * requests waiting for the connection fail with CACHEW_EIO naming
	 * the dial's error, and new ones fail at once while no link is up
	 * (cwi_conn_unreachable); the background redials go on, and the
	 * first link ends it. A peer once reached (a restart) is waited for
	 * within each request's timeout, as is one that answers slowly.
	 * Default 0: never unreachable. */
	int unreachable_after_ms;
	/* tls+tcp only (other schemes ignore them). PEM file paths, read at
	 * listen or dial time; borrowed for the call. tls_cert and tls_key:
	 * our certificate (a chain may follow it) and its private key:
	 * required to listen, sent by a dialer when the listener asks for
	 * one. tls_ca: the CAs that sign peers' certificates: required to
	 * dial, and to listen with client authentication. */
	const char *tls_cert;
	const char *tls_key;
	const char *tls_ca;
	/* Dialers: the name the server's certificate must carry (default:
	 * the URL's host). */
	const char *tls_server_name;
	/* Listeners: whether clients must show a certificate signed by
	 * tls_ca. */
	cwi_tls_client_auth tls_client_auth;
	/* nng dialers, tcp:// and ipc:// (not tls+tcp://): offer each link's
	 * listener a region of this many bytes of shared memory for its
	 * large replies (transports/nng/nng_shm.c); a listener on the same
	 * host and user takes it, others decline, and the replies then
	 * travel as before. CACHEW_SHM=0 in either process turns it off.
	 * Default 0: no offer. */
	size_t shm_bytes;
} cwi_transport_opts;

/* Parses "none", "optional" or "required" ("" is none) for the option
 * `what` (named in the CACHEW_EINVAL message). */
cachew_err cwi_tls_client_auth_parse(const char *text, const char *what,
    cwi_tls_client_auth *out);

void cwi_transport_opts_init(cwi_transport_opts *opts);

/* ---- messages ----------------------------------------------------------- */

/*
 * A message: header bytes (msgpack, opaque here) and elements. One thread
 * at a time; a message moves between threads with its ownership.
 */
typedef struct cwi_msg cwi_msg;

/* An empty message (no header, no elements). CACHEW_ENOMEM. */
cachew_err cwi_msg_create(cwi_msg **out);
/* Releases the header and every element still in the message. NULL is a
 * no-op. */
void cwi_msg_destroy(cwi_msg *m);

/* Sets the header to a copy of len bytes. CACHEW_ENOMEM. */
cachew_err cwi_msg_set_header(cwi_msg *m, const void *data, size_t len);
/* Sets the header to sb's bytes without copying; on success sb is left
 * empty (re-initialised), on failure the caller still owns it. */
cachew_err cwi_msg_set_header_strbuf(cwi_msg *m, cwi_strbuf *sb);
/* The header bytes (NULL with *len == 0 when there is none); borrowed,
 * valid until the header is replaced or the message destroyed. */
const uint8_t *cwi_msg_header(const cwi_msg *m, size_t *len);

/* Appends an element, taking over the caller's reference on success.
 * CACHEW_ENOMEM, CACHEW_ERANGE past CWI_MSG_MAX_ELEMENTS. */
cachew_err cwi_msg_push(cwi_msg *m, cwi_element *e);
size_t cwi_msg_count(const cwi_msg *m);
/* Element i, borrowed from the message (NULL once taken). */
cwi_element *cwi_msg_element(const cwi_msg *m, size_t i);
/* Moves element i's reference to the caller, leaving NULL in its slot. */
cwi_element *cwi_msg_take(cwi_msg *m, size_t i);
/* Header bytes plus the byte size of every element (cwi_element_nbytes):
 * what inproc compares with max_msg_size. */
size_t cwi_msg_size(const cwi_msg *m);

/* ---- completion queues -------------------------------------------------- */

/*
 * Where the completions of asynchronous requests arrive. Thread safe:
 * transports post from their own threads while one or more threads wait.
 * A queue may gather the requests of any number of connections.
 */
typedef struct cwi_cq cwi_cq;

/* One finished request: the tag given to cwi_conn_send, the outcome and,
 * when err == CACHEW_OK, the reply (owned by the caller from now on). */
typedef struct cwi_completion {
	uint64_t tag;
	cachew_err err;
	cwi_msg *reply;
} cwi_completion;

cachew_err cwi_cq_create(cwi_cq **out);
/* Waits up to timeout_ms (< 0: no limit) for the next completion. Returns
 * CACHEW_OK with *out filled; when out->err is not CACHEW_OK this thread's
 * cachew_errmsg() holds its detail. A request whose own timeout passes
 * completes with CACHEW_ETIMEDOUT here even if its transport is silent.
 * CACHEW_ETIMEDOUT when nothing completed in time, CACHEW_ECLOSED once the
 * queue is closed. */
cachew_err cwi_cq_wait(cwi_cq *q, int timeout_ms, cwi_completion *out);
/* Requests sent to this queue and not yet returned by cwi_cq_wait. */
size_t cwi_cq_outstanding(cwi_cq *q);
/* Makes the current or next cwi_cq_wait return at once, as if its timeout
 * had passed (CACHEW_ETIMEDOUT) unless a completion is there: another
 * thread's way to have the waiter look at its state again. */
void cwi_cq_wake(cwi_cq *q);
/* Wakes every waiter with CACHEW_ECLOSED, now and later. Completions
 * still arriving are dropped (replies destroyed). */
void cwi_cq_close(cwi_cq *q);
/* Closes and frees the queue; uncollected replies are destroyed, requests
 * still in flight complete into nothing. No thread may be waiting. NULL is
 * a no-op. */
void cwi_cq_destroy(cwi_cq *q);

/* ---- connections (client side) ------------------------------------------ */

/*
 * A dialed connection to one listener URL. Thread safe: any number of
 * threads may send on it at once, and cwi_conn_close may be called while
 * others are blocked in cwi_conn_call.
 */
typedef struct cwi_conn cwi_conn;

/* Dials url. Unless opts->dial_async, fails with CACHEW_EIO when nobody
 * listens there. opts may be NULL (defaults). A tls+tcp URL also fails
 * on its credentials (opts->tls_*), naming the option and the file:
 * CACHEW_EINVAL (missing or malformed), CACHEW_ENOENT, CACHEW_EIO,
 * CACHEW_EAUTH (our certificate expired). */
cachew_err cwi_dial(cwi_conn **out, const char *url,
    const cwi_transport_opts *opts);
/* On inproc the listener's handler runs inside cwi_conn_send and
 * cwi_conn_call, on the caller's thread: call them with no lock held that
 * a handler might take (the style's rule for callbacks, seen from the
 * caller's side). */

/* Sends a request without waiting; its completion arrives on cq with
 * `tag` within timeout_ms (< 0: no limit; avoid). Takes req on success;
 * on failure (CACHEW_ECLOSED: the connection is closed; CACHEW_EIO: no
 * inproc listener; CACHEW_ERANGE: too many elements to frame; ENOMEM) the
 * caller still owns req and no completion will come. */
cachew_err cwi_conn_send(cwi_conn *c, cwi_msg *req, int timeout_ms,
    cwi_cq *cq, uint64_t tag);
/* Sends a request and waits up to timeout_ms for its reply, which the
 * caller then owns (*reply is NULL on failure). Unlike cwi_conn_send it
 * always consumes req, sent or not: a blocking caller has nothing to
 * retry with a half-sent message. Errors: those of cwi_conn_send, then
 * the request's own: CACHEW_ETIMEDOUT, CACHEW_ECLOSED, CACHEW_EPROTO, or
 * the handler's (cwi_request_fail). */
cachew_err cwi_conn_call(cwi_conn *c, cwi_msg *req, int timeout_ms,
    cwi_msg **reply);
/* The URL as dialed; borrowed from c. */
const char *cwi_conn_url(const cwi_conn *c);
/* Whether c's peer is unreachable (see unreachable_after_ms): never
 * reached, and every dial failed for that long. Retrying a request then
 * only waits. Any thread. */
bool cwi_conn_unreachable(cwi_conn *c);
/* Completes every request in flight with CACHEW_ECLOSED (waking whoever
 * waits for them) and refuses new ones. Idempotent; any thread. */
void cwi_conn_close(cwi_conn *c);
/* Closes (if needed) and frees c. No other thread may use c any more.
 * NULL is a no-op. */
void cwi_conn_destroy(cwi_conn *c);

/* ---- HTTP (metrics and health endpoints) ------------------------------- */

/* A GET handler: sets *body to a malloc'd body of *len bytes (or NULL) and
 * may set *content_type (a static string; default text/plain) for the
 * request's path (its URI, query included), and returns the HTTP status.
 * It runs on a transport thread, concurrently with other requests. */
typedef int (*cwi_http_fn)(void *arg, const char *path, char **body,
    size_t *len, const char **content_type);
/* A listener of plain HTTP (no TLS). Thread safe. */
typedef struct cwi_http_listener cwi_http_listener;

/* Serves GET requests of every path on `addr` ("host:port" or
 * "http://host:port"; port 0: any, cwi_http_listener_url says which) with
 * fn(arg, ...). CACHEW_EINVAL for another form, CACHEW_EEXIST when the
 * address is taken. */
cachew_err cwi_http_listen(cwi_http_listener **out, const char *addr,
    cwi_http_fn fn, void *arg);
/* "http://host:port", the bound port; borrowed from l. */
const char *cwi_http_listener_url(const cwi_http_listener *l);
/* Stops serving (no handler runs after it returns) and frees l; NULL is a
 * no-op. */
void cwi_http_listener_destroy(cwi_http_listener *l);

/* ---- listeners (server side) -------------------------------------------- */

/* A received request, handed to the handler. One thread at a time; it may
 * move to another thread. Exactly one of reply, fail, drop or reject
 * consumes it. */
typedef struct cwi_request cwi_request;
/* A listener. Thread safe. */
typedef struct cwi_listener cwi_listener;

/*
 * Called once per received request, on a transport thread (nng) or on the
 * sending client's thread (inproc), with no transport lock held. It must
 * not block: it answers at once or keeps the request and answers later
 * from another thread. Handlers run concurrently for different requests.
 */
typedef void (*cwi_handler_fn)(void *arg, cwi_request *req);

/* Listens on url and calls handler(arg, req) for every request. A tcp URL
 * with port 0 binds an ephemeral port: cwi_listener_url() tells which.
 * CACHEW_EEXIST when the address or inproc name is taken, CACHEW_EINVAL
 * for a bad URL, and for tls+tcp its credentials' errors (cwi_dial's).
 * opts may be NULL. */
cachew_err cwi_listen(cwi_listener **out, const char *url,
    const cwi_transport_opts *opts, cwi_handler_fn handler, void *arg);
/* The bound URL ("tcp://127.0.0.1:40123" for "tcp://127.0.0.1:0");
 * borrowed from l. */
const char *cwi_listener_url(const cwi_listener *l);
/* Stops accepting, resets every connection (their requests in flight
 * complete with CACHEW_ECLOSED at the clients) and waits for running
 * handlers to return: no handler call starts after it returns. Requests
 * still held may then only be consumed (reply returns CACHEW_ECLOSED).
 * An ipc listener's socket file is removed. Idempotent; never from one of
 * l's handlers (it would wait for itself). */
void cwi_listener_close(cwi_listener *l);
/* Closes (if needed) and frees l; held requests stay valid until
 * consumed. NULL is a no-op. */
void cwi_listener_destroy(cwi_listener *l);

/* The request message, borrowed: the handler may read it and take its
 * elements (cwi_msg_take) until it consumes the request. */
cwi_msg *cwi_request_msg(cwi_request *r);
/* The peer for logs: "tcp://127.0.0.1:40022", "ipc:///tmp/x" or
 * "inproc://name". Borrowed, valid until the request is consumed. */
const char *cwi_request_peer(cwi_request *r);
/* Sends the reply and consumes r. Takes `reply` on success; on failure
 * the caller still owns it: CACHEW_ECLOSED when the client's connection or
 * the listener is gone or the reply is over the client's limit (nng
 * knows a peer is gone once it has seen its connection end: a reply
 * before that is written to a socket nobody reads, and dropped);
 * CACHEW_EINVAL (an element was taken out of it), CACHEW_ERANGE or
 * CACHEW_ENOMEM when it cannot be framed, in which case the client's
 * request completes with that error. */
cachew_err cwi_request_reply(cwi_request *r, cwi_msg *reply);
/* Completes the request at the client with err (not CACHEW_OK) and the
 * formatted message, which the client sees prefixed with the server's
 * URL. Consumes r. CACHEW_ECLOSED when nobody can hear it any more. */
cachew_err cwi_request_fail(cwi_request *r, cachew_err err, const char *fmt,
    ...) CACHEW_PRINTF(3, 4);
/* Consumes r without answering: the client's request times out. */
void cwi_request_drop(cwi_request *r);
/* For a malformed request: logs a WARN line with the peer and reason and
 * resets that peer's connection (its requests in flight complete with
 * CACHEW_ECLOSED). Consumes r. */
void cwi_request_reject(cwi_request *r, const char *reason);

/* ---- between the transports (transport.c, inproc/, nng/) ---------------- */

struct cwi_msg {
	cwi_buffer *hdr_buf; /* holds the header bytes; NULL: no header */
	const uint8_t *hdr;  /* hdr_len bytes inside hdr_buf */
	size_t hdr_len;
	cwi_element **elems;
	uint32_t n, cap;
};

/* Sets the header to a view of [data, data + len) inside buf, taking one
 * new reference on buf (nng: a header inside the received frame). */
void cwi_msg_set_header_view(
    cwi_msg *m, cwi_buffer *buf, const uint8_t *data, size_t len);

/* One request in flight on the client side. The transport that accepted
 * it (send returned CACHEW_OK) ends its part exactly once, by completing
 * it or abandoning it; after that it must not touch it. */
typedef struct cwi_pending cwi_pending;

/* Delivers the outcome: reply (taken; destroyed if nobody waits any more)
 * when err is CACHEW_OK, else err with errmsg (copied; may be NULL). */
void cwi_pending_complete(
    cwi_pending *p, cachew_err err, cwi_msg *reply, const char *errmsg);
/* Ends the transport's part without an outcome: the request times out at
 * its deadline (cwi_request_drop). */
void cwi_pending_abandon(cwi_pending *p);
/* The request's deadline on the cwi_now_ns() clock, 0 for none. */
uint64_t cwi_pending_deadline(const cwi_pending *p);
/* Asks to be told when the request's deadline passes (or its queue is
 * destroyed) before the transport completed it, so that the transport can
 * cancel what it has in flight; it still completes p afterwards (the
 * outcome is dropped). Set it before the request can complete. cancel
 * runs on the thread waiting on the queue with the queue's lock held: it
 * may only take the transport's own locks (lock order: cq->mtx, then the
 * transport's), never complete p, and must cope with p having completed
 * on another thread a moment ago (it is still valid: the transport's
 * reference is only dropped by cwi_pending_complete, which waits for the
 * queue's lock). */
void cwi_pending_set_cancel(
    cwi_pending *p, void (*cancel)(void *arg, cwi_pending *p), void *arg);

typedef struct cwi_conn_ops {
	/* Takes req and p on success (see cwi_pending); on failure neither. */
	cachew_err (*send)(cwi_conn *c, cwi_msg *req, cwi_pending *p);
	void (*close)(cwi_conn *c);
	void (*free)(cwi_conn *c); /* after close */
	/* cwi_conn_unreachable; NULL: never. */
	bool (*unreachable)(cwi_conn *c);
} cwi_conn_ops;

struct cwi_conn {
	const cwi_conn_ops *ops;
	char *url;
};

typedef struct cwi_listener_ops {
	void (*close)(cwi_listener *l);
	void (*free)(cwi_listener *l); /* after close */
} cwi_listener_ops;

struct cwi_listener {
	const cwi_listener_ops *ops;
	char *url; /* bound URL */
	cwi_handler_fn handler;
	void *arg;
};

typedef struct cwi_request_ops {
	/* Each consumes r; see the public functions. */
	cachew_err (*reply)(cwi_request *r, cwi_msg *reply);
	cachew_err (*fail)(cwi_request *r, cachew_err err, const char *msg);
	void (*drop)(cwi_request *r);
	void (*reject)(cwi_request *r, const char *reason);
	const char *(*peer)(cwi_request *r);
} cwi_request_ops;

struct cwi_request {
	const cwi_request_ops *ops;
	cwi_msg *msg;
};

/* A transport: a static const table registered in transport.c by the URL
 * schemes it serves. */
typedef struct cwi_transport {
	const char *name;
	const char *const *schemes; /* NULL-terminated, without "://" */
	/* Set base.handler/arg before the first request can arrive; opts
	 * are complete (defaults filled). */
	cachew_err (*listen)(cwi_listener **out, const char *url,
	    const cwi_transport_opts *opts, cwi_handler_fn handler, void *arg);
	cachew_err (*dial)(
	    cwi_conn **out, const char *url, const cwi_transport_opts *opts);
} cwi_transport;

extern const cwi_transport cwi_transport_inproc;
extern const cwi_transport cwi_transport_nng;

/* The transport serving url's scheme, or NULL (errmsg set, EINVAL). */
const cwi_transport *cwi_transport_find(const char *url);

/* Registers (once) the inproc registry's fork handlers, which hold its
 * lock across fork(). A module whose own fork handlers take a lock that it
 * holds while calling inproc (the embedded service's emb_lock, held while
 * it listens and dials) calls this before registering them: prepare
 * handlers run in the reverse order of registration, so fork() then takes
 * that lock before the registry's, in the order the rest of the process
 * takes them. */
void cwi_inproc_fork_init(void);

#endif /* CWI_TRANSPORT_H */
