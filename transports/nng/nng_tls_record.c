/*
 * nng_tls_record.c - cachew's own TLS record layer: a link's TLS session
 * on OpenSSL (nng_tls_ossl.c's configuration, verification and error
 * codes) whose ciphertext the link (nng_link.c) moves on a plain tcp://
 * nng stream.
 *
 * Why: nng 1.5's TLS streams move ciphertext 16 KiB at a time, one aio
 * and one thread hand-off per record, through buffers of a size fixed at
 * its compile time. On loopback they carried 0.35 GB/s of 1 MiB elements
 * against tcp's 1.61 GB/s, with 43 % of the CPU in the kernel (sends,
 * receives, wake-ups) and under 2 % in libcrypto: the cipher was not the
 * cost, the framework was. Here a link reads as much ciphertext as has
 * arrived (up to IN_MAX bytes) with one receive and decrypts every whole
 * record of it straight into the message being read, and it encrypts up
 * to a batch of its send queue into one buffer written with one send.
 *
 * The wire is plain TLS 1.2 with nng_tls_ossl.c's cipher suites: a peer
 * on nng's TLS streams, on either of their engines, is a peer.
 *
 * Bytes reach OpenSSL through a BIO of our own over two buffers: `in`,
 * the ciphertext received and not yet read by OpenSSL, and `pend`, the
 * ciphertext OpenSSL wrote (records, handshake flights, alerts) and the
 * link has not taken yet.
 *
 * Sealing: OpenSSL's own records cost two copies of every byte sent
 * (into its write buffer, then out through the BIO), as much CPU as the
 * cipher. So the BIO offers itself as a kernel TLS socket would: when the
 * send keys change (the ChangeCipherSpec), OpenSSL hands them to the BIO
 * (its kTLS interface, BIO_CTRL_SET_KTLS) and from then on writes
 * plaintext to it, naming the type of any record that is not data; the
 * BIO seals each record itself with AES-GCM (EVP), straight from the
 * caller's bytes into `pend`, and the link's data skips SSL_write
 * altogether. The record is RFC 5288's: the 8-byte explicit nonce (the
 * one OpenSSL handed over, counting up), then the ciphertext and the
 * 16-byte tag, the sequence number, type, version and length in the
 * additional data. Suites other than AES-GCM (ChaCha20-Poly1305), or an
 * OpenSSL without kTLS, keep OpenSSL's records.
 *
 * Opening: receiving through OpenSSL costs two copies as well (into its
 * read buffer, out to the caller). OpenSSL offers the receive keys the
 * same way when the peer's ChangeCipherSpec arrives; the BIO keeps a copy
 * and declines, so that OpenSSL still reads the handshake's last records
 * (the peer's Finished), and counts the records OpenSSL reads from then
 * on (their sequence numbers). Once the handshake is done and OpenSSL
 * holds no record, whole or in part, the session opens every record
 * itself (`opener`): it checks the header (type, version, a length
 * between a tag's and 2^14 bytes of plaintext past it) before it waits
 * for the body, then decrypts and authenticates the record straight from
 * `in` into the caller's buffer when its plaintext fits there, else in
 * place in `in` (GCM decrypts in place), returned from there as asked.
 * Nothing that fails authentication is left readable: the bytes a
 * refused record decrypted to are cleared. Data is returned; a
 * close_notify ends the session as OpenSSL's SSL_read would
 * (NNG_ECLOSED); any other alert, a handshake record (renegotiation is
 * refused anyway) or a record that does not authenticate is fatal
 * (NNG_ECRYPTO, with the reason). Before that, a record's length is
 * OpenSSL's to check (a record over 2^14 + 2048 bytes is a fatal
 * record_overflow) before it reads the record.
 *
 * Memory: a link holds what it does, not what it might do. Issue 14: a
 * peer that finished a handshake and was reset at its first message
 * had made the dispatcher allocate 258 KiB (valgrind's DHAT); under
 * ASan, whose quarantine keeps what is freed, 300 such peers grew its
 * RSS by 76 MB (nng's TLS streams: 61 MB).
 * So nothing is allocated before a byte needs it: `in` holds
 * IN_HANDSHAKE bytes until the handshake is done (OpenSSL keeps a
 * partial record itself), then as much as the record being opened needs
 * (at most OPEN_RECORD_MAX), and grows only when reads fill it, up to
 * IN_MAX (at a listener, within its receive budget, and back to
 * IN_HANDSHAKE once empty between messages or while reads use under a
 * quarter of it: nng_link.c); `pend` starts at PEND_MIN, enough for a handshake flight, and is sized to the
 * batch being sealed; there is no plaintext buffer. Once the session
 * opens and seals every record itself, OpenSSL's own record buffers (two
 * of 16.7 KiB) are freed, and come back only for an alert. Such a link
 * now allocates 140 KiB, nearly all of it OpenSSL's handshake (its
 * message buffer, record buffers, key exchange), freed when it ends.
 *
 * Threads: none of its own; one thread at a time (the link's mutex).
 */
#include "nng_int.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <linux/tls.h>

#include <stdlib.h>
#include <string.h>

/* A record's plaintext at most, and what sealing adds to it: the header,
 * the explicit nonce, the tag. */
#define PLAIN_MAX 16384
#define SEAL_HEAD (5 + 8)
#define SEAL_TAG 16
/* The largest record the session opens itself: `in` grows to hold one
 * whole when its header says so. */
#define OPEN_RECORD_MAX (SEAL_HEAD + PLAIN_MAX + SEAL_TAG)
/* `in` until the handshake is done: a client's flights (its hello, a
 * certificate chain, the key exchange) come in reads of this size. */
#define IN_HANDSHAKE ((size_t)4 << 10)
/* `in` doubles, up to this, each time a read fills it: a link that only
 * carries requests holds a record's worth, one that carries batches
 * reads 256 KiB at once. */
#define IN_MAX ((size_t)256 << 10)
/* `pend` at first: a server's handshake flight (its certificate chain
 * of a few KiB), or a few small messages. */
#define PEND_MIN ((size_t)4 << 10)
/* The most ciphertext waiting to be sent: the link encrypts batches far
 * smaller (TLS_TX_BATCH, nng_link.c); a handshake flight is a few KiB. */
#define OUT_MAX ((size_t)4 << 20)

/* OpenSSL 3.0's BIO controls for kTLS (its include/internal/bio.h; the
 * public header names only the GET ones). */
#define CTRL_SET_KTLS 72
#define CTRL_SET_KTLS_TX_SEND_CTRL_MSG 74
#define CTRL_CLEAR_KTLS_TX_CTRL_MSG 75

typedef struct ctbuf {
	uint8_t *p;
	size_t len, cap;
} ctbuf;

/* The send direction's keys once OpenSSL handed them over. */
typedef struct sealer {
	EVP_CIPHER_CTX *ctx; /* NULL: OpenSSL seals */
	uint8_t salt[4], nonce[8], seq[8];
	int next_type; /* the next write's record type (0: data) */
} sealer;

/* The receive direction's keys (see the top of the file). */
typedef struct opener {
	EVP_CIPHER_CTX *ctx; /* NULL: no keys offered (or not AES-GCM) */
	uint8_t salt[4], seq[8];
	bool on;             /* we open records; OpenSSL reads no more */
	/* The records OpenSSL reads through the BIO since the keys came:
	 * the header being read (hdr_got bytes of it), the body left. */
	uint8_t hdr[5];
	size_t hdr_got, body_left;
	uint64_t counted;
	/* A record opened in place in `in`, not all of it returned yet: its
	 * plaintext left is in[plain_at, plain_at + plain_len). */
	size_t plain_at, plain_len;
} opener;

struct cwi_tls_rec {
	nng_tls_engine_conn *ec;
	SSL *ssl;
	uint8_t *in;
	size_t in_off, in_len, in_cap;
	bool in_filled; /* the last read filled the room: grow it */
	size_t in_last; /* the bytes the last read that got any got */
	ctbuf pend, flight;
	sealer seal;
	opener open;
};

/* ---- the BIO over the buffers ---------------------------------------------- */

/* Follows the records OpenSSL reads (n bytes at p) after the receive
 * keys came: their count is the sequence number of the next. */
static void
open_count(opener *x, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t k;

		if (x->hdr_got < 5) {
			x->hdr[x->hdr_got++] = *p++;
			n--;
			if (x->hdr_got == 5)
				x->body_left = (size_t)x->hdr[3] << 8 | x->hdr[4];
		} else {
			k = n < x->body_left ? n : x->body_left;
			x->body_left -= k;
			p += k;
			n -= k;
		}
		if (x->hdr_got == 5 && x->body_left == 0) {
			x->hdr_got = 0;
			x->counted++;
		}
	}
}

static int
rec_bio_read(BIO *b, char *buf, int len)
{
	cwi_tls_rec *r = BIO_get_data(b);
	size_t n = r->in_len - r->in_off;

	BIO_clear_retry_flags(b);
	if (n == 0) {
		/* The link reads more from the stream and calls again. */
		BIO_set_retry_read(b);
		return -1;
	}
	if (n > (size_t)len)
		n = (size_t)len;
	memcpy(buf, r->in + r->in_off, n);
	if (r->open.ctx != NULL)
		open_count(&r->open, r->in + r->in_off, n);
	r->in_off += n;
	return (int)n;
}

/* Room for n more bytes in `pend`, within OUT_MAX: doubling from
 * PEND_MIN, or to exactly what is asked when that is more. */
static bool
pend_reserve(cwi_tls_rec *r, size_t n)
{
	ctbuf *o = &r->pend;
	size_t cap = o->cap == 0 ? PEND_MIN : 2 * o->cap;
	uint8_t *p;

	if (o->len + n <= o->cap)
		return true;
	if (o->len + n > OUT_MAX)
		return false;
	if (cap < o->len + n)
		cap = o->len + n;
	if (cap > OUT_MAX)
		cap = OUT_MAX;
	if ((p = realloc(o->p, cap)) == NULL)
		return false;
	o->p = p;
	o->cap = cap;
	return true;
}

/* The big-endian counter c of 8 bytes, plus one. */
static void
count_up(uint8_t c[8])
{
	for (int i = 7; i >= 0 && ++c[i] == 0; i--) {
	}
}

/* Seals len bytes of plaintext into records of type `type` in `pend`
 * (see the top of the file). False when out of room or EVP fails: the
 * session cannot go on. */
static bool
seal(cwi_tls_rec *r, uint8_t type, const uint8_t *p, size_t len)
{
	sealer *x = &r->seal;

	while (len > 0) {
		size_t n = len < PLAIN_MAX ? len : PLAIN_MAX;
		size_t body = 8 + n + SEAL_TAG;
		uint8_t *o, aad[13], iv[12];
		int outl;

		if (!pend_reserve(r, 5 + body))
			return false;
		o = r->pend.p + r->pend.len;
		o[0] = type;
		o[1] = 3;
		o[2] = 3;
		o[3] = (uint8_t)(body >> 8);
		o[4] = (uint8_t)body;
		memcpy(o + 5, x->nonce, 8);
		memcpy(iv, x->salt, 4);
		memcpy(iv + 4, x->nonce, 8);
		memcpy(aad, x->seq, 8);
		aad[8] = type;
		aad[9] = 3;
		aad[10] = 3;
		aad[11] = (uint8_t)(n >> 8);
		aad[12] = (uint8_t)n;
		if (EVP_EncryptInit_ex(x->ctx, NULL, NULL, NULL, iv) != 1 ||
		    EVP_EncryptUpdate(x->ctx, NULL, &outl, aad, 13) != 1 ||
		    EVP_EncryptUpdate(x->ctx, o + SEAL_HEAD, &outl, p,
			(int)n) != 1 ||
		    EVP_EncryptFinal_ex(x->ctx, o + SEAL_HEAD + n, &outl) != 1 ||
		    EVP_CIPHER_CTX_ctrl(x->ctx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG,
			o + SEAL_HEAD + n) != 1)
			return false;
		count_up(x->seq);
		count_up(x->nonce);
		r->pend.len += 5 + body;
		p += n;
		len -= n;
	}
	return true;
}

/* The AES-GCM keys of a direction OpenSSL hands over (ptr: the kernel's
 * tls12_crypto_info_*) in a context for encrypting (enc) or decrypting,
 * with the salt, the explicit nonce and the sequence number; NULL for
 * another version or suite (ChaCha20-Poly1305 stays OpenSSL's). */
static EVP_CIPHER_CTX *
keys_take(const void *ptr, bool enc, uint8_t salt[4], uint8_t nonce[8],
    uint8_t seq[8])
{
	const struct tls_crypto_info *ci = ptr;
	const struct tls12_crypto_info_aes_gcm_128 *g128 = ptr;
	const struct tls12_crypto_info_aes_gcm_256 *g256 = ptr;
	const EVP_CIPHER *c;
	const uint8_t *key;
	EVP_CIPHER_CTX *ctx;

	if (ci->version != TLS_1_2_VERSION)
		return NULL;
	if (ci->cipher_type == TLS_CIPHER_AES_GCM_128) {
		c = EVP_aes_128_gcm();
		key = g128->key;
		memcpy(salt, g128->salt, 4);
		memcpy(nonce, g128->iv, 8);
		memcpy(seq, g128->rec_seq, 8);
	} else if (ci->cipher_type == TLS_CIPHER_AES_GCM_256) {
		c = EVP_aes_256_gcm();
		key = g256->key;
		memcpy(salt, g256->salt, 4);
		memcpy(nonce, g256->iv, 8);
		memcpy(seq, g256->rec_seq, 8);
	} else {
		return NULL;
	}
	if ((ctx = EVP_CIPHER_CTX_new()) == NULL ||
	    EVP_CipherInit_ex(ctx, c, NULL, key, NULL, enc ? 1 : 0) != 1) {
		EVP_CIPHER_CTX_free(ctx);
		return NULL;
	}
	return ctx;
}

/* OpenSSL hands over the send keys: true when we seal from now on. */
static bool
seal_start(cwi_tls_rec *r, const void *ptr)
{
	sealer *x = &r->seal;

	if (x->ctx != NULL)
		return false;
	x->ctx = keys_take(ptr, true, x->salt, x->nonce, x->seq);
	return x->ctx != NULL;
}

/* OpenSSL offers the receive keys: kept, declined (see the top of the
 * file). */
static void
open_keep(cwi_tls_rec *r, const void *ptr)
{
	opener *x = &r->open;
	uint8_t nonce[8];

	if (x->ctx != NULL)
		return;
	x->ctx = keys_take(ptr, false, x->salt, nonce, x->seq);
	x->hdr_got = x->body_left = 0;
	x->counted = 0;
}

static int
rec_bio_write(BIO *b, const char *buf, int len)
{
	cwi_tls_rec *r = BIO_get_data(b);
	int type = r->seal.next_type != 0 ? r->seal.next_type : 23;

	BIO_clear_retry_flags(b);
	if (r->seal.ctx != NULL) {
		/* OpenSSL's own records (a Finished, an alert) after the
		 * keys came: plaintext, one record's worth. */
		r->seal.next_type = 0;
		return seal(r, (uint8_t)type, (const uint8_t *)buf, (size_t)len)
			   ? len : -1;
	}
	/* Never more than OUT_MAX: a failed write fails the SSL call. */
	if (!pend_reserve(r, (size_t)len))
		return -1;
	memcpy(r->pend.p + r->pend.len, buf, (size_t)len);
	r->pend.len += (size_t)len;
	return len;
}

static long
rec_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	cwi_tls_rec *r = BIO_get_data(b);

	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1; /* the link sends what is pending */
	case BIO_CTRL_GET_KTLS_SEND:
		return r->seal.ctx != NULL;
	case CTRL_SET_KTLS:
		/* num != 0 (SSL3_CC_WRITE): the send keys; else the receive
		 * keys, which OpenSSL keeps using until the handshake ends. */
		if (num != 0)
			return seal_start(r, ptr);
		open_keep(r, ptr);
		return 0;
	case CTRL_SET_KTLS_TX_SEND_CTRL_MSG:
		r->seal.next_type = (int)num;
		return 1;
	case CTRL_CLEAR_KTLS_TX_CTRL_MSG:
		r->seal.next_type = 0;
		return 1;
	default:
		return 0;
	}
}

static BIO_METHOD *rec_method;
static pthread_once_t rec_method_once = PTHREAD_ONCE_INIT;

static void
rec_method_make(void)
{
	rec_method = cwi_nng_ossl_bio_method("cachew-tls-record", rec_bio_read,
	    rec_bio_write, rec_bio_ctrl);
}

/* ---- sessions ------------------------------------------------------------- */

cachew_err
cwi_tls_rec_create(cwi_tls_rec **out, const cwi_nng_tls *t)
{
	cwi_tls_rec *r = calloc(1, sizeof(*r));
	BIO *b;
	int rv;

	*out = NULL;
	pthread_once(&rec_method_once, rec_method_make);
	if (r == NULL || rec_method == NULL ||
	    (b = BIO_new(rec_method)) == NULL) {
		cwi_tls_rec_destroy(r);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	BIO_set_data(b, r);
	rv = cwi_nng_ossl_conn_create(&r->ec, cwi_nng_tls_ossl(t), b);
	if (rv != 0) {
		cwi_tls_rec_destroy(r);
		return cwi_fail(CACHEW_ENOMEM, "TLS session: %s",
		    nng_strerror(rv));
	}
	r->ssl = cwi_nng_ossl_conn_ssl(r->ec);
	/* The send keys come to rec_bio_ctrl (see the top of the file). */
	SSL_set_options(r->ssl, SSL_OP_ENABLE_KTLS);
	*out = r;
	return CACHEW_OK;
}

void
cwi_tls_rec_destroy(cwi_tls_rec *r)
{
	if (r == NULL)
		return;
	cwi_nng_ossl_conn_destroy(r->ec);
	EVP_CIPHER_CTX_free(r->seal.ctx); /* cleanses the key */
	EVP_CIPHER_CTX_free(r->open.ctx);
	free(r->in);
	free(r->pend.p);
	free(r->flight.p);
	free(r);
}

int
cwi_tls_rec_handshake(cwi_tls_rec *r, const char **why)
{
	int ret = SSL_do_handshake(r->ssl);

	*why = NULL;
	return ret == 1 ? 0 : cwi_nng_ossl_conn_err(r->ec, ret, why);
}

bool
cwi_tls_rec_ready(const cwi_tls_rec *r)
{
	return SSL_is_init_finished(r->ssl);
}

int
cwi_tls_rec_stream_err(const cwi_tls_rec *r, int rv)
{
	/* As nng_tls_ossl.c's ssl_err says of nng's streams. */
	if (SSL_is_server(r->ssl) && !SSL_is_init_finished(r->ssl) &&
	    SSL_get_state(r->ssl) == TLS_ST_SW_SRVR_DONE &&
	    (rv == NNG_ECONNSHUT || rv == NNG_ECONNRESET || rv == NNG_ECLOSED))
		return NNG_ECRYPTO;
	return rv;
}

void
cwi_tls_rec_in_sizes(const cwi_tls_rec *r, bool lean, bool between,
    size_t *need, size_t *want)
{
	size_t have = r->in_len - r->in_off, rec;

	/* What holds bytes keeps its size; so does a buffer reads use. */
	*need = IN_HANDSHAKE;
	if ((have > 0 || !lean) && r->in_cap > *need)
		*need = r->in_cap;
	*want = *need;
	if (!SSL_is_init_finished(r->ssl))
		return; /* nothing big before the handshake is done */
	if (r->open.on && have >= 5) {
		/* A record we open is read whole into `in`: its header, which
		 * open_read checked, says how long it is. */
		const uint8_t *h = r->in + r->in_off;

		rec = 5 + ((size_t)h[3] << 8 | h[4]);
		if (rec > OPEN_RECORD_MAX)
			rec = OPEN_RECORD_MAX;
		if (rec > *need)
			*need = *want = rec;
	}
	if (r->in_filled && r->in_cap < IN_MAX)
		*want = 2 * r->in_cap < IN_MAX ? 2 * r->in_cap : IN_MAX;
	else if (!(lean && between) && r->in_last >= r->in_cap / 4)
		*want = r->in_cap; /* in use: kept */
	if (*want < *need)
		*want = *need;
}

size_t
cwi_tls_rec_in_cap(const cwi_tls_rec *r)
{
	return r->in_cap;
}

uint8_t *
cwi_tls_rec_in_room(cwi_tls_rec *r, size_t cap, size_t *room)
{
	opener *x = &r->open;
	/* What is kept: the bytes not read yet, and the plaintext of a
	 * record opened in place not all returned yet. */
	size_t keep = x->plain_len > 0 && x->plain_at < r->in_off
	    ? x->plain_at : r->in_off;

	if (keep == r->in_len) {
		r->in_off = r->in_len = 0;
	} else if (keep > 0) {
		memmove(r->in, r->in + keep, r->in_len - keep);
		r->in_len -= keep;
		r->in_off -= keep;
		if (x->plain_len > 0)
			x->plain_at -= keep;
	}
	/* Grown, or shrunk when empty (a lean link's idle buffer). */
	if (cap > r->in_cap || (cap < r->in_cap && r->in_len == 0)) {
		uint8_t *p = realloc(r->in, cap);

		if (p == NULL && cap > r->in_cap)
			return NULL;
		if (p != NULL) {
			r->in = p;
			r->in_cap = cap;
		}
	}
	r->in_filled = false;
	*room = r->in_cap - r->in_len;
	return r->in + r->in_len;
}

void
cwi_tls_rec_in_commit(cwi_tls_rec *r, size_t n)
{
	if (n > 0 && r->in_len + n == r->in_cap)
		r->in_filled = true;
	if (n > 0)
		r->in_last = n;
	r->in_len += n;
}

/* Whether the session can open the records from now on: it has the
 * receive keys, the handshake is over and OpenSSL holds no record. Then
 * the sequence number moves on by the records OpenSSL read. */
static bool
open_begin(cwi_tls_rec *r)
{
	opener *x = &r->open;

	if (x->ctx == NULL || !SSL_is_init_finished(r->ssl) ||
	    SSL_pending(r->ssl) > 0 || x->hdr_got != 0 || x->body_left != 0)
		return false;
	for (; x->counted > 0; x->counted--)
		count_up(x->seq);
	x->on = true;
	/* OpenSSL reads no record from now on, and writes one only for an
	 * alert (sealed by us): its record buffers go, and one that an
	 * alert brings back goes again after it. */
	SSL_set_mode(r->ssl, SSL_MODE_RELEASE_BUFFERS);
	(void)SSL_free_buffers(r->ssl);
	return true;
}

/* Opens the record of `len` bytes of body at p (its header h) into out
 * (which may be p + 8: GCM decrypts in place): true when it
 * authenticates. When it does not, the bytes decrypted into out are
 * cleared: nothing unauthenticated is left where a caller could read. */
static bool
open_record(opener *x, const uint8_t *h, const uint8_t *p, size_t len,
    uint8_t *out)
{
	size_t n = len - 8 - SEAL_TAG;
	uint8_t aad[13], iv[12];
	int outl;

	memcpy(iv, x->salt, 4);
	memcpy(iv + 4, p, 8);
	memcpy(aad, x->seq, 8);
	memcpy(aad + 8, h, 3);
	aad[11] = (uint8_t)(n >> 8);
	aad[12] = (uint8_t)n;
	if (EVP_DecryptInit_ex(x->ctx, NULL, NULL, NULL, iv) == 1 &&
	    EVP_DecryptUpdate(x->ctx, NULL, &outl, aad, 13) == 1 &&
	    EVP_DecryptUpdate(x->ctx, out, &outl, p + 8, (int)n) == 1 &&
	    EVP_CIPHER_CTX_ctrl(x->ctx, EVP_CTRL_GCM_SET_TAG, SEAL_TAG,
		(void *)(p + 8 + n)) == 1 &&
	    EVP_DecryptFinal_ex(x->ctx, out + n, &outl) == 1)
		return true;
	memset(out, 0, n);
	return false;
}

/* The session's own read (see the top of the file): as
 * cwi_tls_rec_read. */
static int
open_read(cwi_tls_rec *r, uint8_t *dst, size_t len, size_t *got,
    const char **why)
{
	opener *x = &r->open;

	for (;;) {
		size_t have = r->in_len - r->in_off, body, n;
		uint8_t *h, *out;
		bool in_place;

		if (x->plain_len > 0) {
			*got = x->plain_len < len ? x->plain_len : len;
			memcpy(dst, r->in + x->plain_at, *got);
			x->plain_at += *got;
			x->plain_len -= *got;
			return 0;
		}
		if (have < 5)
			return NNG_EAGAIN;
		h = r->in + r->in_off;
		body = (size_t)h[3] << 8 | h[4];
		if (h[1] != 3 || h[2] != 3 || (h[0] != 21 && h[0] != 22 &&
		    h[0] != 23)) {
			*why = "not a TLS 1.2 record of this session";
			return NNG_ECRYPTO;
		}
		/* The length, checked before the body is waited for. */
		if (body < 8 + SEAL_TAG || body > 8 + PLAIN_MAX + SEAL_TAG) {
			*why = "record length out of bounds";
			return NNG_ECRYPTO;
		}
		if (have < 5 + body)
			return NNG_EAGAIN;
		n = body - 8 - SEAL_TAG;
		/* Data that fits goes straight to the caller; the rest (more
		 * than asked, an alert) is opened where it lies. */
		in_place = h[0] != 23 || n > len;
		out = in_place ? h + SEAL_HEAD : dst;
		if (!open_record(x, h, h + 5, body, out)) {
			*why = "bad record mac";
			return NNG_ECRYPTO;
		}
		count_up(x->seq);
		r->in_off += 5 + body;
		if (h[0] == 21) {
			/* An alert: a close_notify (warning level, 0) ends
			 * the session; any other ends it in error. */
			if (n == 2 && out[1] == 0)
				return NNG_ECLOSED;
			*why = "the peer sent an alert";
			return NNG_ECRYPTO;
		}
		if (h[0] == 22) {
			*why = "renegotiation refused";
			return NNG_ECRYPTO;
		}
		if (!in_place && n > 0) {
			*got = n;
			return 0;
		}
		if (in_place) {
			x->plain_at = r->in_off - SEAL_TAG - n;
			x->plain_len = n;
		}
	}
}

int
cwi_tls_rec_read(cwi_tls_rec *r, uint8_t *dst, size_t len, size_t *got,
    const char **why)
{
	int ret;

	*why = NULL;
	if (r->open.on || open_begin(r))
		return open_read(r, dst, len, got, why);
	ret = SSL_read_ex(r->ssl, dst, len, got);
	return ret == 1 ? 0 : cwi_nng_ossl_conn_err(r->ec, ret, why);
}

int
cwi_tls_rec_write(cwi_tls_rec *r, const uint8_t *src, size_t len,
    const char **why)
{
	*why = NULL;
	if (r->seal.ctx != NULL) {
		if (seal(r, 23, src, len))
			return 0;
		*why = "sealing a record failed (out of memory)";
		return NNG_ECRYPTO;
	}
	while (len > 0) {
		size_t n = 0;
		int ret = SSL_write_ex(r->ssl, src, len, &n);

		if (ret != 1)
			return cwi_nng_ossl_conn_err(r->ec, ret, why);
		src += n;
		len -= n;
	}
	return 0;
}

bool
cwi_tls_rec_reserve(cwi_tls_rec *r, size_t len)
{
	size_t records = len / PLAIN_MAX + 1;

	/* Sealing only: OpenSSL's own records (a cipher we do not seal)
	 * grow `pend` as they come. */
	return r->seal.ctx == NULL ||
	       pend_reserve(r, len + records * (SEAL_HEAD + SEAL_TAG));
}

size_t
cwi_tls_rec_pending(const cwi_tls_rec *r)
{
	return r->pend.len;
}

void
cwi_tls_rec_take(cwi_tls_rec *r, uint8_t **p, size_t *len)
{
	ctbuf t = r->flight;

	r->flight = r->pend;
	r->pend = t;
	r->pend.len = 0;
	*p = r->flight.p;
	*len = r->flight.len;
}
