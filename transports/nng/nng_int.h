/*
 * nng_int.h - the internals the nng transport's files share; never
 * installed. The transport is split by what each part owns:
 *
 *   nng_frame.c      the bytes of the wire: the SP handshake, the length
 *                    prefix, request ids and backtraces, the frame head,
 *                    the encoder (txmsg) and the decoder (frame_decode).
 *                    Pure functions over buffers: no sockets, no locks,
 *                    no clock; the fuzz target fuzz_nng_frame drives the
 *                    decoder directly.
 *   nng_link.c       a link: one connected stream; its send queue, its
 *                    receive loop, its death, its lifetime (references
 *                    and the janitor that frees it off nng's threads).
 *   nng_listen.c     the server: a listener's links, the requests it
 *                    hands out and the back-pressure past max_inflight.
 *   nng_dial.c       the client: a connection's link, request ids, the
 *                    replies matched to them, redial with backoff.
 *   nng_tls.c        tls+tcp: credentials checked and handed to the
 *                    TLS layer, and the reason of a refused handshake.
 *   nng_tls_record.c cachew's own TLS record layer (the default): a
 *                    link's bytes through OpenSSL, the ciphertext on a
 *                    plain tcp stream in large reads and writes.
 *   nng_tls_ossl.c   the OpenSSL side: configurations, verification,
 *                    error codes; also an engine for nng's TLS streams
 *                    (CACHEW_TLS_LAYER=nng).
 *   nng_transport.c  the transport's table and what is process-wide (the
 *                    heap tuning, nng's error codes).
 *
 * Lock order across the files: cq->mtx (transport.c), then a listener's
 * or a connection's mutex, then a link's mutex; the janitor's is a leaf.
 *
 * docs/protocol.md, "Transport framing", is the format these implement.
 */
#ifndef CWI_NNG_INT_H
#define CWI_NNG_INT_H

#include "../transport.h"
#include "../../src/core/element_codec.h"

#include <nng/nng.h>
#include <nng/supplemental/tls/engine.h>

#include <pthread.h>

/* ---- framing (nng_frame.c) ---------------------------------------------- */

#define FRAME_MAGIC0 'C'
#define FRAME_MAGIC1 'W'
#define FRAME_VERSION 1
#define FRAME_HEAD 16
#define FRAME_KIND_MSG 0
#define FRAME_KIND_ERROR 1
/* The same-host path (nng_shm.c): a client's hello naming its region, and
 * the server's answer; a reply whose bytes are a block of the region. */
#define FRAME_KIND_SHM_HELLO 2
#define FRAME_KIND_SHM_BLOCK 3
/* The payload of a control frame (kinds 2 and 3) is at most this. */
#define FRAME_CTL_MAX 128
/* Error frames carry a short message. */
#define FRAME_ERRMSG_MAX 1024

/* SP (nng's scalability protocols) on a stream. */
#define SP_HANDSHAKE 8
#define SP_PROTO_REQ0 0x30
#define SP_PROTO_REP0 0x31
/* The request id: 4 bytes, high bit set. A request that went through
 * devices carries one 4-byte word per hop before it (its backtrace); a
 * reply echoes the whole backtrace. */
#define SP_ID_BYTES 4
#define SP_ID_FLAG 0x80000000u
#define SP_MAX_HOPS 8
#define SP_BT_MAX (SP_ID_BYTES * SP_MAX_HOPS)
/* TCP: 64-bit length; IPC: a type byte (1: message), then the length. */
#define SP_TCP_PREFIX 8
#define SP_IPC_PREFIX 9
#define SP_IPC_MSG 1

static inline void
cwi_nng_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline uint32_t
cwi_nng_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline void
cwi_nng_put_u64(uint8_t *p, uint64_t v)
{
	cwi_nng_put_u32(p, (uint32_t)(v >> 32));
	cwi_nng_put_u32(p + 4, (uint32_t)v);
}

static inline uint64_t
cwi_nng_get_u64(const uint8_t *p)
{
	return (uint64_t)cwi_nng_get_u32(p) << 32 | cwi_nng_get_u32(p + 4);
}

/* The bytes of a message's length prefix. */
static inline size_t
cwi_nng_sp_prefix(bool ipc)
{
	return ipc ? SP_IPC_PREFIX : SP_TCP_PREFIX;
}

/*
 * A message ready to send: g.sb holds the stream prefix, the request id
 * (or backtrace), the frame head, the header and every small part of the
 * elements; the large payloads are referenced in place (g.refs) and the
 * message (msg) is kept until the bytes are written, which keeps them
 * alive. iov is the whole message in order; cur/off is how far it has
 * been written (by the link that sends it; the encoder leaves them 0).
 */
typedef struct txmsg {
	struct txmsg *next;
	cwi_msg *msg; /* NULL until the sender hands it over */
	cwi_gather g;
	nng_iov *iov;
	unsigned niov, cur;
	size_t off;
} txmsg;

/* Frees t and its message; NULL is a no-op. */
void cwi_nng_tx_free(txmsg *t);
/* Frees every message of the list linked by next. */
void cwi_nng_tx_free_list(txmsg *t);

/*
 * Frames m behind the id bytes (the request id, or a request's backtrace
 * for its reply) for a tcp or an ipc stream. m is not consumed, but *out
 * refers to its payloads: the caller hands m to it ((*out)->msg) or frees
 * *out before m. CACHEW_ERANGE for a header over 4 GiB, CACHEW_EINVAL for
 * an element already taken, the element encoder's errors, CACHEW_ENOMEM.
 */
cachew_err cwi_nng_tx_build(txmsg **out, bool ipc, const uint8_t *id,
    size_t idlen, const cwi_msg *m);
/* An error frame carrying err and msg (cut to FRAME_ERRMSG_MAX bytes).
 * CACHEW_ENOMEM. */
cachew_err cwi_nng_tx_build_error(txmsg **out, bool ipc, const uint8_t *id,
    size_t idlen, cachew_err err, const char *msg);
/* A control frame of `kind` (FRAME_KIND_SHM_*) carrying len bytes
 * (<= FRAME_CTL_MAX) of payload in place of a header. CACHEW_ENOMEM. */
cachew_err cwi_nng_tx_build_ctl(txmsg **out, bool ipc, const uint8_t *id,
    size_t idlen, int kind, const uint8_t *payload, size_t len);
/* Our SP handshake, announcing my_proto: the first message a link sends.
 * CACHEW_ENOMEM. */
cachew_err cwi_nng_tx_handshake(txmsg **out, uint16_t my_proto);

/* Checks the peer's 8-byte handshake h against the protocol it must
 * speak. NULL when good, else the reason, written into buf. */
const char *cwi_nng_handshake_check(const uint8_t *h, uint16_t peer_proto,
    char *buf, size_t len);

/*
 * Reads a message's length prefix (cwi_nng_sp_prefix(ipc) bytes at h)
 * into *msg_len. NULL when good, else the reason, written into buf: an
 * unknown ipc message type, a length over max_len (the receive limit plus
 * id_room, the room of the request id or backtrace) or one shorter than a
 * request id. Nothing may be allocated for a length before this passes.
 */
const char *cwi_nng_prefix_decode(const uint8_t *h, bool ipc,
    size_t max_len, size_t id_room, size_t *msg_len, char *buf, size_t len);

/* The bytes of a request's backtrace, up to and with its request id (the
 * first word with the high bit set among the first SP_MAX_HOPS words of
 * data, size bytes); 0 when there is none. */
size_t cwi_nng_backtrace_len(const uint8_t *data, size_t size);

/* What a received frame turned out to be. */
typedef struct cwi_nng_frame_in {
	cwi_msg *msg;        /* kind message */
	cachew_err peer_err; /* kind error: the code, msg == NULL */
	char peer_msg[FRAME_ERRMSG_MAX + 1];
	/* A control frame (kinds 2 and 3; msg NULL, peer_err CACHEW_OK):
	 * its kind and payload; kind 0 otherwise */
	int ctl_kind;
	uint8_t ctl[FRAME_CTL_MAX];
	size_t ctl_len;
} cwi_nng_frame_in;

/*
 * Decodes the frame that starts at body_off in a received message (buf,
 * taken even on failure: the received tensors and header are views into
 * it). CACHEW_EPROTO with the reason in this thread's errmsg when it
 * breaks the framing or its body exceeds max_msg (the caller resets the
 * connection); CACHEW_ENOMEM. Every length and count is checked against
 * the bytes present before it is used.
 */
cachew_err cwi_nng_frame_decode(cwi_buffer *buf, size_t body_off,
    size_t max_msg, cwi_nng_frame_in *fi);

/* ---- the same-host path (nng_shm.c) ------------------------------------ */

typedef struct cwi_shm cwi_shm;
/* A region's file name, with its directory. */
#define SHM_NAME_MAX 64
/* A block frame's payload: slot (4), offset (8), length (8). */
#define SHM_DESC 20

/* Client: a new region of about `bytes` of blocks (a sparse file in
 * /dev/shm, mapped), one reference. CACHEW_EIO naming the file, ENOMEM. */
cachew_err cwi_nng_shm_create(cwi_shm **out, size_t bytes);
/* The hello's payload naming r, into buf (FRAME_CTL_MAX bytes); its
 * length. */
size_t cwi_nng_shm_hello(const cwi_shm *r, uint8_t *buf);
/* Client: removes the region's name once the server answered (or the
 * link died). Idempotent. */
void cwi_nng_shm_unlink(cwi_shm *r);
/* Server: maps the region a hello names, after checking it (a regular
 * file of this user, of the size and with the nonce the hello says).
 * CACHEW_EPROTO (a malformed hello), ENOENT (no such file: another host),
 * EPERM, EIO, ENOMEM. */
cachew_err cwi_nng_shm_open(cwi_shm **out, const uint8_t *hello,
    size_t len);
/* NULL is a no-op. The last reference unmaps. */
void cwi_nng_shm_unref(cwi_shm *r);
/* Server: when t (a framed reply) carries at least min_len bytes and a
 * block is free, copies its bytes after the stream prefix into a block
 * and sets *small to the block frame to send instead (t is then the
 * caller's to free); *small NULL: send t. CACHEW_ENOMEM. */
cachew_err cwi_nng_shm_pack(cwi_shm *r, bool ipc, const txmsg *t,
    size_t min_len, txmsg **small);
/* Client: the block a block frame's payload (desc, len bytes) names, as a
 * buffer that frees the block with its last reference. CACHEW_EPROTO for
 * a frame naming anything but a block in use inside r (or r NULL: no
 * region offered), ENOMEM. */
cachew_err cwi_nng_shm_block(cwi_shm *r, const uint8_t *desc, size_t len,
    size_t max_len, cwi_buffer **out);
/* Whether this process offers and takes regions: CACHEW_SHM is not "0".
 * Read at each listen and dial. */
bool cwi_nng_shm_enabled(void);
/* Replies received as blocks by this process (for tests). */
uint64_t cwi_nng_shm_received(void);

/* ---- links (nng_link.c) ------------------------------------------------- */

/* nng 1.5 takes at most 8 iovecs per operation. */
#define TX_IOV 8

typedef struct slink slink;
typedef struct cwi_tls_rec cwi_tls_rec;
typedef struct cwi_nng_tls cwi_nng_tls;

/*
 * What a listener's links may hold of the bytes peers sent
 * (cwi_transport_opts.max_pending_bytes): the message each is reading,
 * allocated as its bytes arrive (RX_FIRST bytes first, then doubling),
 * and the requests received and not yet answered. A link that would go
 * over its share or take the total over the limit is reset with a logged
 * reason: a peer that claims a large message and trickles it reserves
 * only what it sent, and all peers together at most `limit`. On cachew's
 * TLS layer each link's ciphertext buffer counts in the total too (not
 * in the link's share): it grows past a record's room only while the
 * total allows.
 */
typedef struct rx_budget {
	_Atomic size_t used;      /* across the listener's links */
	size_t limit;             /* the total */
	size_t link_limit;        /* one link's share */
	_Atomic size_t peak;      /* the most used since the last release */
} rx_budget;

/* The first allocation for a message read under a budget: every request
 * of the protocol but a dataset's registration fits. */
#define RX_FIRST ((size_t)16 << 10)

/* What a link's owner (a listener or a connection) is told. */
typedef struct link_ops {
	/* A whole message (buf, taken) arrived. Returns false to stop
	 * reading until cwi_nng_link_resume (back-pressure). No lock held. */
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
	RX_PARKED,    /* stopped by the owner until cwi_nng_link_resume */
	RX_DOWN,      /* on_down delivered: nothing more */
} rx_state;

/* One connected stream. mtx guards the fields, except the owner's (next,
 * prev, pnext, parked: the owner's lock) and jnext (the janitor's). */
struct slink {
	pthread_mutex_t mtx;
	unsigned refs;
	nng_stream *s;
	nng_aio *txa, *rxa;
	bool ipc;
	uint16_t peer_proto; /* what the peer must announce */
	bool tls;            /* a tls+tcp stream */
	/* tls+tcp on cachew's record layer (NULL otherwise): s is a plain
	 * tcp stream carrying rec's ciphertext, and the bytes below (the
	 * send queue, rxhead, rxbuf) are the plaintext. */
	cwi_tls_rec *rec;
	bool rx_want;  /* rec: the receive state waits for plaintext */
	bool rx_in_cb; /* rec: link_rx_cb's loop runs and will read it */
	bool rx_waking; /* rec: rxa is a zero sleep that wakes that loop */
	size_t tx_plain; /* rec: the queue's bytes the send in flight holds */
	uint8_t *tx_ct;  /* rec: the ciphertext in flight */
	size_t tx_ct_len, tx_ct_off;
	/* rec: a handshake that failed sends its alert first, then the
	 * link dies of this */
	bool tls_failing;
	char tls_fail_why[300];
	uint64_t hs_deadline_ns; /* the peer's handshake is due by then */
	/* The nng error that ended the link before the peer's handshake
	 * arrived (a TLS handshake refused, a peer that hung up), for the
	 * owner's on_down; 0 otherwise. */
	int early_rv;
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
	bool resume_wanted; /* cwi_nng_link_resume came while delivering */
	uint8_t rxhead[SP_IPC_PREFIX];
	size_t got, need;
	cwi_buffer *rxbuf;
	/* A listener's budget (NULL at a connection: a message is read into
	 * one buffer of its whole length), what this link holds of it, and
	 * when the message being read must be whole */
	rx_budget *budget;
	_Atomic size_t charged;
	/* Of the budget, the bytes of rec's ciphertext buffer (counted in
	 * the listener's total, not in the link's share) */
	size_t tls_charged;
	uint64_t rx_deadline_ns;
	/* The same-host region (nng_shm.c) with a reference, or NULL: set
	 * before the link starts (a client's offer) or by the server's
	 * receive callback on the hello (under mtx); freed with the link. */
	cwi_shm *shm;
	struct slink *next, *prev; /* the owner's list of links */
	struct slink *pnext;       /* a listener's parked links */
	bool parked;              /* on that list (listener's lock) */
	struct slink *jnext;       /* the janitor's queue */
};

/*
 * A link over a connected stream s (taken, even on failure), with one
 * reference for the owner. It sends its handshake (my_proto) and, once
 * started, reads; the caller adds it to its lists before it starts it
 * (the first callback needs the peer's handshake first). max_len is the
 * largest length prefix accepted (the receive limit plus the room of the
 * request id or backtrace). tls: a tls+tcp:// owner's credentials, NULL
 * otherwise; on cachew's record layer (cwi_nng_tls_ossl) s is a plain tcp
 * stream and the link runs the TLS handshake first. CACHEW_ENOMEM, nng's
 * errors (cwi_nng_err).
 */
cachew_err cwi_nng_link_create(slink **out, nng_stream *s, bool ipc,
    uint16_t my_proto, uint16_t peer_proto, const link_ops *ops, void *owner,
    const char *url, size_t max_len, int send_timeout_ms,
    const cwi_nng_tls *tls);
/* Starts the handshake: sends ours, reads theirs. */
void cwi_nng_link_start(slink *lk);
/* Queues t; on CACHEW_ECLOSED (the link is dead) the caller keeps it. */
cachew_err cwi_nng_link_send(slink *lk, txmsg *t);
/* Marks lk dead and closes its stream; its receive path reports the
 * death to the owner (on_down). */
void cwi_nng_link_kill(slink *lk, const char *why);
/* Logs a WARN line for a peer that broke the protocol and kills lk. */
void cwi_nng_link_reset(slink *lk, const char *reason);
/* Reading again after on_msg returned false. */
void cwi_nng_link_resume(slink *lk);
/* Reads lk's messages under budget b (a listener's, which outlives its
 * links); before cwi_nng_link_start. */
void cwi_nng_link_set_budget(slink *lk, rx_budget *b);
/* Gives back n bytes lk held of its budget: a request it received was
 * answered or dropped. When the budget falls well below a high peak (a
 * burst of hostile peers is over), the process gives memory back
 * (cwi_heap_release). No lock held. */
void cwi_nng_budget_give(slink *lk, size_t n);
void cwi_nng_link_ref(slink *lk);
/* The last reference hands lk to the janitor, which frees it and then
 * calls its owner's release. */
void cwi_nng_link_unref(slink *lk);

/* ---- the two sides and the process (nng_listen.c, nng_dial.c,
 * nng_transport.c) ---------------------------------------------------- */

/* The transport's listen and dial (cwi_transport_nng). */
cachew_err cwi_nng_listen(cwi_listener **out, const char *url,
    const cwi_transport_opts *opts, cwi_handler_fn handler, void *arg);
cachew_err cwi_nng_dial(cwi_conn **out, const char *url,
    const cwi_transport_opts *opts);

/* ---- TLS (nng_tls.c) --------------------------------------------------- */

/* A dialer's or a listener's TLS credentials, checked, with the
 * configuration of its layer made of them. Immutable once created. */

bool cwi_nng_url_is_tls(const char *url);
/* Reads and checks o's tls_* files for url (server: a listener), naming
 * the option and the file in errors, and makes the configuration of a
 * layer (own_layer: cachew's record layer, else nng's TLS streams):
 * CACHEW_EINVAL (missing, malformed, a key that is not the
 * certificate's), CACHEW_ENOENT, CACHEW_EIO, CACHEW_EAUTH (our
 * certificate has expired), CACHEW_ENOMEM. */
cachew_err cwi_nng_tls_create(cwi_nng_tls **out, const char *url,
    const cwi_transport_opts *o, bool server, bool own_layer);
/* NULL is a no-op. */
void cwi_nng_tls_destroy(cwi_nng_tls *t);
/* Whether tls+tcp:// runs on cachew's own record layer
 * (nng_tls_record.c), the default, rather than nng's TLS streams:
 * CACHEW_TLS_LAYER=nng, or CACHEW_TLS_ENGINE=mbedtls (an engine only
 * nng's streams have). Read at each listen and dial. */
bool cwi_nng_tls_own_layer(void);
/* t's OpenSSL configuration on cachew's record layer; NULL when t
 * configures nng's TLS streams. */
nng_tls_engine_config *cwi_nng_tls_ossl(const cwi_nng_tls *t);
/* The URL nng dials or listens on for url: tcp:// for a tls+tcp:// url
 * on cachew's record layer (t's), url itself otherwise. NULL: out of
 * memory. Free it. */
char *cwi_nng_tls_stream_url(const char *url, bool own_layer);
/* Sets t's configuration on an nng dialer or listener (nng errors); a
 * no-op on cachew's record layer. */
int cwi_nng_tls_set_dialer(cwi_nng_tls *t, nng_stream_dialer *d);
int cwi_nng_tls_set_listener(cwi_nng_tls *t, nng_stream_listener *l);
/* What an nng error ending a TLS link before the peer's handshake says
 * about the refusal, from the listener's side (server) or the dialer's;
 * NULL when it is not a handshake error. A static string. */
const char *cwi_nng_tls_refusal(int rv, bool server);
/* Makes nng's TLS use the OpenSSL engine (nng_tls_ossl.c) unless
 * CACHEW_TLS_ENGINE=mbedtls: called before every TLS configuration is
 * allocated (cheap once installed). 0 or an nng error. */
int cwi_nng_tls_engine_use(void);
/* The name of the engine nng's TLS uses now (nng's own: "mbed"). */
const char *cwi_nng_tls_engine(void);
/*
 * The dialer's diagnosis of a link to url that died before the peer's
 * handshake: connects once more with mbedTLS (t's credentials; t NULL for
 * a tcp:// dialer, which asks whether the peer speaks TLS) and, when the
 * peer refuses for a reason that redialing will not change, returns
 * CACHEW_EAUTH with the reason in buf; CACHEW_OK when it found nothing
 * (the peer went away, or it all worked this time). Blocks for at most
 * 10 s (as long as a link's handshake may take): never on an nng thread.
 */
cachew_err cwi_nng_tls_diagnose(const cwi_nng_tls *t, const char *url,
    char *buf, size_t len);

/* ---- OpenSSL (nng_tls_ossl.c), shared by both layers ------------------ */

/* OpenSSL's, named without its headers. */
struct bio_st;
struct bio_method_st;
struct ssl_st;

/* A configuration as nng_tls_ossl.c's engine makes one (TLS 1.2, its
 * cipher suites, its verification) from PEM text (NULL: none). nng
 * errors. */
int cwi_nng_ossl_config_create(nng_tls_engine_config **out, bool server,
    nng_tls_auth_mode auth, const char *ca_pem, const char *cert_pem,
    const char *key_pem, const char *server_name);
/* NULL is a no-op. */
void cwi_nng_ossl_config_destroy(nng_tls_engine_config *cfg);
/* A BIO method of a source-sink named name reading with rd, writing
 * with wr and controlled by ctrl (NULL: nothing to flush, no other
 * control). NULL: out of memory. */
struct bio_method_st *cwi_nng_ossl_bio_method(const char *name,
    int (*rd)(struct bio_st *, char *, int),
    int (*wr)(struct bio_st *, const char *, int),
    long (*ctrl)(struct bio_st *, int, long, void *));
/* A session of cfg's (which must outlive it) over the BIO b (taken, even
 * on failure). nng errors. */
int cwi_nng_ossl_conn_create(nng_tls_engine_conn **out,
    nng_tls_engine_config *cfg, struct bio_st *b);
/* NULL is a no-op. */
void cwi_nng_ossl_conn_destroy(nng_tls_engine_conn *ec);
struct ssl_st *cwi_nng_ossl_conn_ssl(nng_tls_engine_conn *ec);
/* The nng error of an SSL call that returned ret (NNG_EAGAIN: it waits
 * for bytes; NNG_EPEERAUTH: the peer's certificate is missing or fails
 * verification; NNG_ECRYPTO: any other failure; NNG_ECLOSED: the peer's
 * close_notify), and OpenSSL's reason in *why (valid until the next call
 * on ec). Clears OpenSSL's error queue. */
int cwi_nng_ossl_conn_err(nng_tls_engine_conn *ec, int ret, const char **why);

/* ---- cachew's TLS record layer (nng_tls_record.c) --------------------- */

/*
 * One link's TLS session: the link moves ciphertext in (in_room,
 * in_commit) and out (pending, take) on its stream, and asks for the
 * handshake, plaintext (read) and encryption (write). One thread at a
 * time (the link's mutex).
 *
 * cwi_tls_rec_create: a session of t's (cwi_nng_tls_ossl(t) != NULL; t
 * outlives it). CACHEW_ENOMEM.
 */
cachew_err cwi_tls_rec_create(cwi_tls_rec **out, const cwi_nng_tls *t);
/* NULL is a no-op. */
void cwi_tls_rec_destroy(cwi_tls_rec *r);
/* Runs the handshake on the ciphertext received: 0 when done, NNG_EAGAIN
 * while it waits for the peer's, else the failure (cwi_nng_ossl_conn_err)
 * and why. Either way its output may be pending. */
int cwi_tls_rec_handshake(cwi_tls_rec *r, const char **why);
bool cwi_tls_rec_ready(const cwi_tls_rec *r);
/* What the stream's error rv ending the handshake means: a client that
 * hangs up on a server's certificate refused it (its alert can be lost
 * to the reset), NNG_ECRYPTO; otherwise rv. */
int cwi_tls_rec_stream_err(const cwi_tls_rec *r, int rv);
/* The size the ciphertext buffer needs for the next read (*need: room
 * for the whole record being opened, never more than one record before
 * the handshake is done) and would like (*want: more when reads fill
 * it, up to 256 KiB). lean (a listener's link, whose buffer counts in
 * its budget): an empty buffer shrinks back to 4 KiB (*want below its
 * size) between messages (between), or when reads use under a quarter
 * of it; else it never shrinks. */
void cwi_tls_rec_in_sizes(const cwi_tls_rec *r, bool lean, bool between,
    size_t *need, size_t *want);
/* The ciphertext buffer's size now (0 before the first read). */
size_t cwi_tls_rec_in_cap(const cwi_tls_rec *r);
/* Where the next read of ciphertext goes and how much fits there, the
 * buffer grown to cap bytes first when smaller (cap >= what in_sizes
 * said it needs), or shrunk to it when larger and empty. NULL: out of
 * memory for growing (the buffer is as it was). */
uint8_t *cwi_tls_rec_in_room(cwi_tls_rec *r, size_t cap, size_t *room);
/* n bytes of ciphertext arrived in the room. */
void cwi_tls_rec_in_commit(cwi_tls_rec *r, size_t n);
/* Decrypts up to len bytes of plaintext into dst: 0 with *got > 0,
 * NNG_EAGAIN when a record is incomplete (read more ciphertext), else a
 * failure (NNG_ECLOSED: the peer's close_notify) and why. */
int cwi_tls_rec_read(cwi_tls_rec *r, uint8_t *dst, size_t len, size_t *got,
    const char **why);
/* Encrypts len bytes (records of at most 16 KiB) into the pending
 * ciphertext. 0, or a failure and why. */
int cwi_tls_rec_write(cwi_tls_rec *r, const uint8_t *src, size_t len,
    const char **why);
/* Makes room at once for len bytes of plaintext about to be written
 * (in one batch of writes): the pending ciphertext is sized to the batch
 * instead of doubling to it. False: out of memory, or over the 4 MiB
 * the pending ciphertext may hold. */
bool cwi_tls_rec_reserve(cwi_tls_rec *r, size_t len);
/* Bytes of ciphertext waiting to be sent. */
size_t cwi_tls_rec_pending(const cwi_tls_rec *r);
/* Takes the pending ciphertext to send: *p stays valid until the next
 * take (the link sends one buffer at a time). */
void cwi_tls_rec_take(cwi_tls_rec *r, uint8_t **p, size_t *len);

/* Maps an nng error to a cachew_err with a message naming url and what
 * failed. */
cachew_err cwi_nng_err(int rv, const char *url, const char *what);
/* Called first by every listen and dial: CACHEW_ENOTSUP, with a message
 * naming url, in a child forked after this process (or an ancestor) used
 * nng, which would abort there (nng_transport.c, "fork()"). */
cachew_err cwi_nng_fork_check(const char *url);

#endif /* CWI_NNG_INT_H */
