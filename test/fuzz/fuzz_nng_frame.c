/*
 * fuzz_nng_frame.c - the nng stream transport's receive path over hostile
 * bytes: what a peer may send on one tcp or ipc connection, checked by the
 * pure functions the links call (transports/nng/nng_frame.c).
 *
 * The first byte picks the side (bit 1: a server reading requests, else a
 * client reading replies), the mapping (bit 0: ipc, else tcp) and the
 * receive limit (bits 2-3: 64 bytes, 4 KiB, 1 MiB or the 256 MiB default).
 * The rest is the stream: the peer's 8-byte SP handshake, then messages,
 * each a length prefix and that many bytes, read as a link reads them
 * until one is refused (the link would reset the connection) or the bytes
 * run out (it would wait for more).
 *
 * Every length field must be checked before it is used: a prefix that
 * passes is at most the limit plus the room of the request id, and a body
 * over the limit is refused. A frame that decodes must lie inside the
 * message (header and every element), and its elements must encode again
 * (cwi_nng_tx_build, the sender's path) into a frame that decodes to equal
 * elements and encodes to the same bytes. An error frame must carry a
 * known code and at most 1024 bytes of text, and come only as a reply. A
 * control frame (kinds 2 and 3, the same-host path) carries at most 128
 * bytes and encodes again to the same. A broken promise abort()s.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../transports/nng/nng_int.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const size_t limits[4] = {64, 4096, (size_t)1 << 20,
    CWI_TRANSPORT_MAX_MSG_DEFAULT};

/* The bytes of a framed message as they go on the wire. */
static uint8_t *
flatten(const txmsg *t, size_t *len)
{
	size_t n = 0;
	uint8_t *out;

	for (unsigned i = 0; i < t->niov; i++)
		n += t->iov[i].iov_len;
	out = malloc(n != 0 ? n : 1);
	fuzz_must(out != NULL);
	n = 0;
	for (unsigned i = 0; i < t->niov; i++) {
		memcpy(out + n, t->iov[i].iov_buf, t->iov[i].iov_len);
		n += t->iov[i].iov_len;
	}
	*len = n;
	return out;
}

/* Decodes the wire bytes of one framed message (prefix included), as a
 * link and its owner would: it must pass. */
static cwi_nng_frame_in
redecode(const uint8_t *wire, size_t len, bool ipc, size_t idlen,
    size_t max_msg, size_t id_room)
{
	size_t pre = cwi_nng_sp_prefix(ipc), n = 0;
	char why[300];
	cwi_buffer *buf = NULL;
	cwi_nng_frame_in fi;

	fuzz_must(len >= pre);
	fuzz_must(cwi_nng_prefix_decode(wire, ipc, max_msg + id_room,
		      id_room, &n, why, sizeof(why)) == NULL &&
	    n == len - pre);
	fuzz_must(cwi_buffer_alloc(&buf, n, false) == CACHEW_OK);
	memcpy(buf->data, wire + pre, n);
	fuzz_must(cwi_nng_frame_decode(buf, idlen, max_msg, &fi) ==
	    CACHEW_OK);
	return fi;
}

static bool
same_msg(const cwi_msg *a, const cwi_msg *b)
{
	size_t alen, blen;
	const uint8_t *ah = cwi_msg_header(a, &alen);
	const uint8_t *bh = cwi_msg_header(b, &blen);

	if (alen != blen || (alen > 0 && memcmp(ah, bh, alen) != 0) ||
	    a->n != b->n)
		return false;
	for (uint32_t i = 0; i < a->n; i++)
		if (!cwi_element_equal(a->elems[i], b->elems[i]))
			return false;
	return true;
}

/* A decoded message frame encodes again into one that decodes to the
 * same message and encodes to the same bytes. */
static void
roundtrip_msg(const cwi_msg *m, const uint8_t *id, size_t idlen, bool ipc,
    size_t max_msg, size_t id_room)
{
	txmsg *t1 = NULL, *t2 = NULL;
	uint8_t *w1, *w2;
	size_t l1, l2;
	cwi_nng_frame_in fi;

	fuzz_must(cwi_nng_tx_build(&t1, ipc, id, idlen, m) == CACHEW_OK);
	w1 = flatten(t1, &l1);
	/* The sender's framing of what the receiver accepted may be
	 * larger (a misaligned payload is padded): only then may it not
	 * fit the limit. */
	if (l1 - cwi_nng_sp_prefix(ipc) - idlen > max_msg) {
		free(w1);
		cwi_nng_tx_free(t1);
		return;
	}
	fi = redecode(w1, l1, ipc, idlen, max_msg, id_room);
	fuzz_must(fi.msg != NULL && same_msg(m, fi.msg));
	fuzz_must(cwi_nng_tx_build(&t2, ipc, id, idlen, fi.msg) == CACHEW_OK);
	w2 = flatten(t2, &l2);
	fuzz_must(l1 == l2 && memcmp(w1, w2, l1) == 0);
	free(w1);
	free(w2);
	cwi_nng_tx_free(t1);
	cwi_nng_tx_free(t2);
	cwi_msg_destroy(fi.msg);
}

/* An error frame carries a known code and a short text, and encodes
 * again to the same code and text. */
static void
roundtrip_error(const cwi_nng_frame_in *in, const uint8_t *id, size_t idlen,
    bool ipc, size_t max_msg, size_t id_room)
{
	txmsg *t = NULL;
	uint8_t *w;
	size_t l;
	cwi_nng_frame_in fi;

	fuzz_must(in->peer_err > CACHEW_OK && in->peer_err <= CWI_ERR_LAST);
	fuzz_must(strlen(in->peer_msg) <= FRAME_ERRMSG_MAX);
	fuzz_must(cwi_nng_tx_build_error(&t, ipc, id, idlen, in->peer_err,
		      in->peer_msg) == CACHEW_OK);
	w = flatten(t, &l);
	if (l - cwi_nng_sp_prefix(ipc) - idlen <= max_msg) {
		fi = redecode(w, l, ipc, idlen, max_msg, id_room);
		fuzz_must(fi.msg == NULL && fi.peer_err == in->peer_err &&
		    strcmp(fi.peer_msg, in->peer_msg) == 0);
	}
	free(w);
	cwi_nng_tx_free(t);
}

/* A control frame (the same-host path's hello or block) carries at most
 * FRAME_CTL_MAX bytes and encodes again to the same kind and bytes. */
static void
roundtrip_ctl(const cwi_nng_frame_in *in, const uint8_t *id, size_t idlen,
    bool ipc, size_t max_msg, size_t id_room)
{
	txmsg *t = NULL;
	uint8_t *w;
	size_t l;
	cwi_nng_frame_in fi;

	fuzz_must(in->msg == NULL && in->peer_err == CACHEW_OK);
	fuzz_must((in->ctl_kind == FRAME_KIND_SHM_HELLO ||
		      in->ctl_kind == FRAME_KIND_SHM_BLOCK) &&
	    in->ctl_len <= FRAME_CTL_MAX);
	fuzz_must(cwi_nng_tx_build_ctl(&t, ipc, id, idlen, in->ctl_kind,
		      in->ctl, in->ctl_len) == CACHEW_OK);
	w = flatten(t, &l);
	fi = redecode(w, l, ipc, idlen, max_msg, id_room);
	fuzz_must(fi.ctl_kind == in->ctl_kind && fi.ctl_len == in->ctl_len &&
	    memcmp(fi.ctl, in->ctl, in->ctl_len) == 0);
	free(w);
	cwi_nng_tx_free(t);
}

/* The header and the elements of m lie inside the body of buf, which
 * starts at body_off. */
static void
check_inside(const cwi_msg *m, const cwi_buffer *buf, size_t body_off)
{
	const uint8_t *lo = buf->data + body_off, *hi = buf->data + buf->size;
	size_t hlen;
	const uint8_t *h = cwi_msg_header(m, &hlen);

	fuzz_must(hlen == 0 || (h >= lo + FRAME_HEAD && h <= hi &&
				   hlen <= (size_t)(hi - h)));
	fuzz_must(m->n <= (buf->size - body_off) / 8);
	for (uint32_t i = 0; i < m->n; i++)
		fuzz_check_element(m->elems[i], buf, lo, hi);
}

/* One message of n bytes (its prefix already checked). False when the
 * connection would be reset. */
static bool
one_message(const uint8_t *p, size_t n, bool ipc, bool server,
    size_t max_msg, size_t id_room)
{
	cwi_buffer *buf = NULL;
	cwi_nng_frame_in fi;
	uint8_t id[SP_BT_MAX];
	size_t idlen = SP_ID_BYTES;
	cachew_err rv;

	if (server) {
		idlen = cwi_nng_backtrace_len(p, n);
		if (idlen == 0)
			return false;
		fuzz_must(idlen % SP_ID_BYTES == 0 && idlen <= SP_BT_MAX &&
		    idlen <= n);
		fuzz_must(cwi_nng_get_u32(p + idlen - SP_ID_BYTES) & SP_ID_FLAG);
	}
	memcpy(id, p, idlen);
	if (cwi_buffer_alloc(&buf, n, false) != CACHEW_OK)
		return false;
	memcpy(buf->data, p, n);
	cwi_buffer_ref(buf); /* ours, to check the views against */
	rv = cwi_nng_frame_decode(buf, idlen, max_msg, &fi);
	if (rv != CACHEW_OK) {
		fuzz_must((rv == CACHEW_EPROTO && cwi_errmsg_get()[0] != '\0') ||
		    rv == CACHEW_ENOMEM);
		fuzz_must(fi.msg == NULL);
		cwi_buffer_unref(buf);
		return false;
	}
	/* A body over the limit never decodes. */
	fuzz_must(n - idlen <= max_msg);
	if (fi.ctl_kind != 0) {
		roundtrip_ctl(&fi, id, idlen, ipc, max_msg, id_room);
		cwi_buffer_unref(buf);
		/* A server answers a hello and resets on a block frame; a
		 * client checks either against its region (nng_shm.c). */
		return !server || fi.ctl_kind == FRAME_KIND_SHM_HELLO;
	}
	if (fi.msg == NULL) {
		roundtrip_error(&fi, id, idlen, ipc, max_msg, id_room);
		cwi_buffer_unref(buf);
		return !server; /* a request may not be an error frame */
	}
	check_inside(fi.msg, buf, idlen);
	roundtrip_msg(fi.msg, id, idlen, ipc, max_msg, id_room);
	cwi_msg_destroy(fi.msg);
	cwi_buffer_unref(buf);
	return true;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bool ipc, server;
	size_t max_msg, id_room, pre, off;
	char why[300];

	if (size < 1 + SP_HANDSHAKE)
		return 0;
	ipc = data[0] & 1;
	server = data[0] & 2;
	max_msg = limits[(data[0] >> 2) & 3];
	id_room = server ? SP_BT_MAX : SP_ID_BYTES;
	pre = cwi_nng_sp_prefix(ipc);
	if (cwi_nng_handshake_check(data + 1,
		server ? SP_PROTO_REQ0 : SP_PROTO_REP0, why, sizeof(why)) !=
	    NULL)
		return 0;
	off = 1 + SP_HANDSHAKE;
	while (size - off >= pre) {
		size_t n = 0;

		if (cwi_nng_prefix_decode(data + off, ipc, max_msg + id_room,
			id_room, &n, why, sizeof(why)) != NULL)
			break;
		/* What the link may allocate before the bytes come. */
		fuzz_must(n >= SP_ID_BYTES && n <= max_msg + id_room);
		off += pre;
		if (n > size - off)
			break;
		if (!one_message(data + off, n, ipc, server, max_msg, id_room))
			break;
		off += n;
	}
	return 0;
}
