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
 *   nng_transport.c  the transport's table and what is process-wide (the
 *                    heap tuning, nng's error codes).
 *
 * docs/protocol.md, "Transport framing", is the format these implement.
 */
#ifndef CWI_NNG_INT_H
#define CWI_NNG_INT_H

#include "../transport.h"
#include "../../src/core/element_codec.h"

#include <nng/nng.h>

/* ---- framing (nng_frame.c) ---------------------------------------------- */

#define FRAME_MAGIC0 'C'
#define FRAME_MAGIC1 'W'
#define FRAME_VERSION 1
#define FRAME_HEAD 16
#define FRAME_KIND_MSG 0
#define FRAME_KIND_ERROR 1
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

#endif /* CWI_NNG_INT_H */
