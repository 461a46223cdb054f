/*
 * nng_frame.c - the bytes of the nng transport's wire (docs/protocol.md,
 * "Transport framing"): nng's SP mapping on a stream (the 8-byte
 * handshake, a length prefix per message, request ids and backtraces) and
 * cachew's frame inside each message (a 16-byte head, the header, the
 * elements in the element encoding). Pure functions over buffers: no
 * sockets, no locks; the links (nng_link.c) do the I/O.
 *
 * Limits: a length field is checked against max_msg_size (plus room for
 * the request id or backtrace) before anything is allocated; a longer
 * claim resets the connection with a logged reason. The body is then
 * checked as before (cwi_nng_frame_decode): the head, the header length
 * against the bytes present, the element count against the bytes present
 * (before the list of elements is allocated), each element by the element
 * decoder, and no byte after the last element.
 */
#include "nng_int.h"

#include <stdio.h>
#include <stdlib.h>

/* Payloads of at least this many bytes are sent from where they lie;
 * smaller ones are copied next to their headers (an iovec costs more). */
#define SEND_REF_MIN 4096

static void
put_head(uint8_t *h, int kind, size_t hdr_len, uint32_t count)
{
	h[0] = FRAME_MAGIC0;
	h[1] = FRAME_MAGIC1;
	h[2] = FRAME_VERSION;
	h[3] = (uint8_t)kind;
	cwi_nng_put_u32(h + 4, (uint32_t)hdr_len);
	cwi_nng_put_u32(h + 8, count);
	cwi_nng_put_u32(h + 12, 0); /* flags: none defined */
}

/* ---- encoding ----------------------------------------------------------- */

void
cwi_nng_tx_free(txmsg *t)
{
	if (t == NULL)
		return;
	cwi_msg_destroy(t->msg);
	cwi_strbuf_free(&t->g.sb);
	free(t->g.refs);
	free(t->iov);
	free(t);
}

void
cwi_nng_tx_free_list(txmsg *t)
{
	while (t != NULL) {
		txmsg *nx = t->next;
		cwi_nng_tx_free(t);
		t = nx;
	}
}

/* Writes the length prefix and lays out the iovecs of t (whose bytes are
 * all in place). */
static cachew_err
tx_finish(txmsg *t, bool ipc)
{
	cwi_gather *g = &t->g;
	size_t pre = cwi_nng_sp_prefix(ipc), prev = 0;
	unsigned n = 0;

	if (g->sb.oom)
		return cwi_fail(CACHEW_ENOMEM, "out of memory framing a "
					       "message");
	t->iov = malloc((2 * g->nrefs + 1) * sizeof(*t->iov));
	if (t->iov == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (ipc)
		g->sb.data[0] = SP_IPC_MSG;
	cwi_nng_put_u64((uint8_t *)g->sb.data + (ipc ? 1 : 0),
	    (uint64_t)(g->sb.len - pre + g->ref_bytes));
	for (size_t i = 0; i < g->nrefs; i++) {
		if (g->refs[i].at > prev) {
			t->iov[n].iov_buf = g->sb.data + prev;
			t->iov[n++].iov_len = g->refs[i].at - prev;
		}
		t->iov[n].iov_buf = (void *)g->refs[i].data;
		t->iov[n++].iov_len = g->refs[i].len;
		prev = g->refs[i].at;
	}
	if (g->sb.len > prev) {
		t->iov[n].iov_buf = g->sb.data + prev;
		t->iov[n++].iov_len = g->sb.len - prev;
	}
	t->niov = n;
	return CACHEW_OK;
}

static cachew_err
tx_start(txmsg **out, bool ipc, const uint8_t *id, size_t idlen)
{
	static const uint8_t zeros[SP_IPC_PREFIX];
	txmsg *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_strbuf_init(&t->g.sb);
	t->g.skew = cwi_nng_sp_prefix(ipc);
	t->g.ref_min = SEND_REF_MIN;
	cwi_strbuf_append(&t->g.sb, zeros, cwi_nng_sp_prefix(ipc));
	cwi_strbuf_append(&t->g.sb, id, idlen);
	*out = t;
	return CACHEW_OK;
}

/* The padding of the element encoding is reckoned from the id, where the
 * receiver's buffer starts, so that payloads land aligned there. */
cachew_err
cwi_nng_tx_build(txmsg **out, bool ipc, const uint8_t *id, size_t idlen,
    const cwi_msg *m)
{
	uint8_t head[FRAME_HEAD];
	txmsg *t;
	cachew_err rv;

	if (m->hdr_len > UINT32_MAX)
		return cwi_fail(CACHEW_ERANGE, "message header of %zu bytes is "
					       "too large to frame",
		    m->hdr_len);
	for (uint32_t i = 0; i < m->n; i++)
		if (m->elems[i] == NULL)
			return cwi_fail(CACHEW_EINVAL,
			    "message element %u was taken", i);
	rv = tx_start(&t, ipc, id, idlen);
	if (rv != CACHEW_OK)
		return rv;
	put_head(head, FRAME_KIND_MSG, m->hdr_len, m->n);
	cwi_strbuf_append(&t->g.sb, head, FRAME_HEAD);
	if (m->hdr_len > 0)
		cwi_strbuf_append(&t->g.sb, m->hdr, m->hdr_len);
	for (uint32_t i = 0; i < m->n; i++) {
		rv = cwi_element_encode_gather(m->elems[i], &t->g);
		if (rv != CACHEW_OK) {
			cwi_nng_tx_free(t);
			return rv;
		}
	}
	rv = tx_finish(t, ipc);
	if (rv != CACHEW_OK) {
		cwi_nng_tx_free(t);
		return rv;
	}
	*out = t;
	return CACHEW_OK;
}

/* A frame whose body is the head (kind, count) and len bytes of payload:
 * the error and control frames. */
static cachew_err
tx_build_flat(txmsg **out, bool ipc, const uint8_t *id, size_t idlen,
    int kind, uint32_t count, const void *payload, size_t len)
{
	uint8_t head[FRAME_HEAD];
	txmsg *t;
	cachew_err rv;

	rv = tx_start(&t, ipc, id, idlen);
	if (rv != CACHEW_OK)
		return rv;
	put_head(head, kind, len, count);
	cwi_strbuf_append(&t->g.sb, head, FRAME_HEAD);
	cwi_strbuf_append(&t->g.sb, payload, len);
	rv = tx_finish(t, ipc);
	if (rv != CACHEW_OK) {
		cwi_nng_tx_free(t);
		return rv;
	}
	*out = t;
	return CACHEW_OK;
}

cachew_err
cwi_nng_tx_build_error(txmsg **out, bool ipc, const uint8_t *id,
    size_t idlen, cachew_err err, const char *msg)
{
	size_t len = strlen(msg);

	return tx_build_flat(out, ipc, id, idlen, FRAME_KIND_ERROR,
	    (uint32_t)err, msg, len < FRAME_ERRMSG_MAX ? len : FRAME_ERRMSG_MAX);
}

cachew_err
cwi_nng_tx_build_ctl(txmsg **out, bool ipc, const uint8_t *id, size_t idlen,
    int kind, const uint8_t *payload, size_t len)
{
	return tx_build_flat(out, ipc, id, idlen, kind, 0, payload, len);
}

cachew_err
cwi_nng_tx_handshake(txmsg **out, uint16_t my_proto)
{
	txmsg *t = calloc(1, sizeof(*t));

	if (t != NULL) {
		cwi_strbuf_init(&t->g.sb);
		cwi_strbuf_append(&t->g.sb, "\0SP\0", 4);
		cwi_strbuf_append(&t->g.sb,
		    (uint8_t[]){(uint8_t)(my_proto >> 8), (uint8_t)my_proto,
			0, 0},
		    4);
		t->iov = malloc(sizeof(*t->iov));
	}
	if (t == NULL || t->iov == NULL || t->g.sb.oom) {
		cwi_nng_tx_free(t);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	t->iov[0].iov_buf = t->g.sb.data;
	t->iov[0].iov_len = SP_HANDSHAKE;
	t->niov = 1;
	*out = t;
	return CACHEW_OK;
}

/* ---- decoding: the SP layer --------------------------------------------- */

const char *
cwi_nng_handshake_check(const uint8_t *h, uint16_t peer_proto, char *buf,
    size_t len)
{
	unsigned proto = (unsigned)h[4] << 8 | h[5];

	/* A TLS record of type handshake (22), version 3.x: a ClientHello. */
	if (h[0] == 0x16 && h[1] == 0x03) {
		snprintf(buf, len, "the peer speaks TLS (a tls+tcp:// dialer?) "
		    "and this link is plaintext");
		return buf;
	}
	if (h[0] != 0 || h[1] != 'S' || h[2] != 'P' || h[3] != 0 ||
	    h[6] != 0 || h[7] != 0) {
		snprintf(buf, len, "not an SP handshake (%02x %02x %02x %02x)",
		    h[0], h[1], h[2], h[3]);
		return buf;
	}
	if (proto != peer_proto) {
		snprintf(buf, len,
		    "peer speaks SP protocol 0x%x, expected 0x%x (%s)", proto,
		    peer_proto, peer_proto == SP_PROTO_REQ0 ? "req0" : "rep0");
		return buf;
	}
	return NULL;
}

const char *
cwi_nng_prefix_decode(const uint8_t *h, bool ipc, size_t max_len,
    size_t id_room, size_t *msg_len, char *buf, size_t len)
{
	uint64_t n;

	if (ipc && h[0] != SP_IPC_MSG) {
		snprintf(buf, len, "unknown ipc message type %u", h[0]);
		return buf;
	}
	n = cwi_nng_get_u64(h + (ipc ? 1 : 0));
	if (n > max_len) {
		snprintf(buf, len,
		    "message of %llu bytes (with %zu for its request id) "
		    "exceeds the limit of %zu",
		    (unsigned long long)n, id_room, max_len - id_room);
		return buf;
	}
	if (n < SP_ID_BYTES) {
		snprintf(buf, len,
		    "message of %llu bytes is shorter than a request id",
		    (unsigned long long)n);
		return buf;
	}
	*msg_len = (size_t)n;
	return NULL;
}

size_t
cwi_nng_backtrace_len(const uint8_t *data, size_t size)
{
	for (size_t i = 0; i < SP_MAX_HOPS; i++) {
		if (SP_ID_BYTES * (i + 1) > size)
			break;
		if (cwi_nng_get_u32(data + SP_ID_BYTES * i) & SP_ID_FLAG)
			return SP_ID_BYTES * (i + 1);
	}
	return 0;
}

/* ---- decoding: the frame ------------------------------------------------ */

/* Checks the 16-byte head of a body of len bytes: the size limit, the
 * magic, the version, the flags and the header length against the bytes
 * after the head. The kind and the count are the caller's to check. */
static cachew_err
frame_head_check(const uint8_t *body, size_t len, size_t max_msg,
    uint32_t *hlen, uint32_t *count)
{
	uint32_t flags;

	if (len > max_msg)
		return cwi_fail(CACHEW_EPROTO,
		    "message of %zu bytes exceeds the limit of %zu", len,
		    max_msg);
	if (len < FRAME_HEAD)
		return cwi_fail(CACHEW_EPROTO,
		    "frame of %zu bytes is shorter than its %d-byte head", len,
		    FRAME_HEAD);
	if (body[0] != FRAME_MAGIC0 || body[1] != FRAME_MAGIC1 ||
	    body[2] != FRAME_VERSION)
		return cwi_fail(CACHEW_EPROTO,
		    "bad frame magic or version (%02x %02x %02x)", body[0],
		    body[1], body[2]);
	*hlen = cwi_nng_get_u32(body + 4);
	*count = cwi_nng_get_u32(body + 8);
	flags = cwi_nng_get_u32(body + 12);
	if (flags != 0)
		return cwi_fail(CACHEW_EPROTO, "unknown frame flags 0x%x", flags);
	if (*hlen > len - FRAME_HEAD)
		return cwi_fail(CACHEW_EPROTO,
		    "header length %u exceeds the %zu bytes after the head",
		    *hlen, len - FRAME_HEAD);
	return CACHEW_OK;
}

/* An error frame: a known code, the text, nothing after it. A text over
 * FRAME_ERRMSG_MAX bytes is cut there. */
static cachew_err
frame_error_decode(const uint8_t *body, size_t len, uint32_t hlen,
    uint32_t code, cwi_nng_frame_in *fi)
{
	size_t n = hlen < FRAME_ERRMSG_MAX ? hlen : FRAME_ERRMSG_MAX;

	if (code == CACHEW_OK || code > CWI_ERR_LAST ||
	    FRAME_HEAD + (size_t)hlen != len)
		return cwi_fail(CACHEW_EPROTO,
		    "error frame with code %u and %zu trailing bytes", code,
		    len - FRAME_HEAD - hlen);
	fi->peer_err = (cachew_err)code;
	memcpy(fi->peer_msg, body + FRAME_HEAD, n);
	fi->peer_msg[n] = '\0';
	return CACHEW_OK;
}

/* The header and count elements of a message frame whose header starts
 * at hdr_off in buf. The payloads' alignment is reckoned from the
 * buffer's start, where the sender reckoned it from. */
static cachew_err
frame_elements_decode(cwi_buffer *buf, size_t hdr_off, uint32_t hlen,
    uint32_t count, cwi_msg **out)
{
	size_t off = hdr_off + hlen;
	cwi_msg *m = NULL;
	cachew_err rv;

	/* No element takes fewer than 8 bytes (array, component array,
	 * dtype, shape, two bins): the count is checked before the array of
	 * pointers is allocated. */
	if (count > CWI_MSG_MAX_ELEMENTS || count > (buf->size - off) / 8)
		return cwi_fail(CACHEW_EPROTO,
		    "element count %u does not fit the %zu bytes present",
		    count, buf->size - off);
	rv = cwi_msg_create(&m);
	if (rv != CACHEW_OK)
		return rv;
	if (count > 0) {
		m->elems = malloc(count * sizeof(*m->elems));
		if (m->elems == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			goto fail;
		}
		m->cap = count;
	}
	if (hlen > 0)
		cwi_msg_set_header_view(m, buf, buf->data + hdr_off, hlen);
	for (uint32_t i = 0; i < count; i++) {
		rv = cwi_element_decode(buf, buf->data, buf->size, &off,
		    &m->elems[i]);
		if (rv != CACHEW_OK) {
			if (rv != CACHEW_ENOMEM)
				rv = cwi_fail(CACHEW_EPROTO, "element %u: %s", i,
				    cwi_errmsg_get());
			goto fail;
		}
		m->n++;
	}
	if (off != buf->size) {
		rv = cwi_fail(CACHEW_EPROTO,
		    "%zu bytes after the last of %u elements", buf->size - off,
		    count);
		goto fail;
	}
	*out = m;
	return CACHEW_OK;

fail:
	cwi_msg_destroy(m);
	return rv;
}

cachew_err
cwi_nng_frame_decode(cwi_buffer *buf, size_t body_off, size_t max_msg,
    cwi_nng_frame_in *fi)
{
	const uint8_t *body = buf->data + body_off;
	size_t len = buf->size - body_off;
	uint32_t hlen = 0, count = 0;
	cachew_err rv;

	fi->msg = NULL;
	fi->peer_err = CACHEW_OK;
	fi->peer_msg[0] = '\0';
	fi->ctl_kind = 0;
	fi->ctl_len = 0;
	rv = frame_head_check(body, len, max_msg, &hlen, &count);
	if (rv == CACHEW_OK) {
		switch (body[3]) {
		case FRAME_KIND_ERROR:
			rv = frame_error_decode(body, len, hlen, count, fi);
			break;
		case FRAME_KIND_MSG:
			rv = frame_elements_decode(buf, body_off + FRAME_HEAD,
			    hlen, count, &fi->msg);
			break;
		case FRAME_KIND_SHM_HELLO:
		case FRAME_KIND_SHM_BLOCK:
			/* The payload only: its owner checks what it says. */
			if (count != 0 || hlen > FRAME_CTL_MAX ||
			    FRAME_HEAD + (size_t)hlen != len) {
				rv = cwi_fail(CACHEW_EPROTO, "control frame of "
				    "kind %u with %u bytes, count %u and %zu "
				    "bytes in all", body[3], hlen, count, len);
				break;
			}
			fi->ctl_kind = body[3];
			fi->ctl_len = hlen;
			memcpy(fi->ctl, body + FRAME_HEAD, hlen);
			break;
		default:
			rv = cwi_fail(CACHEW_EPROTO, "unknown frame kind %u",
			    body[3]);
			break;
		}
	}
	cwi_buffer_unref(buf);
	return rv;
}
