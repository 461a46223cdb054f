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
 * link has not taken yet. A record's length is OpenSSL's to check (a
 * record over 2^14 + 2048 bytes is a fatal record_overflow) before it
 * reads the record; `in` holds at least one whole record and at most
 * IN_MAX bytes, `pend` at most OUT_MAX.
 *
 * Threads: none of its own; one thread at a time (the link's mutex).
 */
#include "nng_int.h"

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <stdlib.h>
#include <string.h>

/* The largest TLS 1.2 record (2^14 bytes of plaintext and up to 2048 of
 * expansion) and its header: `in` always has room for one. */
#define RECORD_MAX (5 + 16384 + 2048)
/* `in` starts at this and doubles, up to IN_MAX, each time a read fills
 * it: a link that only carries requests holds a few KiB, one that
 * carries batches reads 256 KiB at once. */
#define IN_MIN (2 * RECORD_MAX)
#define IN_MAX ((size_t)256 << 10)
/* The most ciphertext waiting to be sent: the link encrypts batches far
 * smaller (TLS_TX_BATCH, nng_link.c); a handshake flight is a few KiB. */
#define OUT_MAX ((size_t)4 << 20)

typedef struct ctbuf {
	uint8_t *p;
	size_t len, cap;
} ctbuf;

struct cwi_tls_rec {
	nng_tls_engine_conn *ec;
	SSL *ssl;
	uint8_t *in;
	size_t in_off, in_len, in_cap;
	bool in_filled; /* the last read filled the room: grow it */
	ctbuf pend, flight;
};

/* ---- the BIO over the buffers ---------------------------------------------- */

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
	r->in_off += n;
	return (int)n;
}

static int
rec_bio_write(BIO *b, const char *buf, int len)
{
	cwi_tls_rec *r = BIO_get_data(b);
	ctbuf *o = &r->pend;
	size_t n = (size_t)len;

	BIO_clear_retry_flags(b);
	if (o->len + n > o->cap) {
		size_t cap = o->cap == 0 ? 2 * RECORD_MAX : o->cap;
		uint8_t *p;

		while (cap < o->len + n)
			cap *= 2;
		/* Never more: a failed write fails the SSL call. */
		if (cap > OUT_MAX || (p = realloc(o->p, cap)) == NULL)
			return -1;
		o->p = p;
		o->cap = cap;
	}
	memcpy(o->p + o->len, buf, n);
	o->len += n;
	return len;
}

static BIO_METHOD *rec_method;
static pthread_once_t rec_method_once = PTHREAD_ONCE_INIT;

static void
rec_method_make(void)
{
	rec_method = cwi_nng_ossl_bio_method("cachew-tls-record", rec_bio_read,
	    rec_bio_write);
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
	    (r->in = malloc(IN_MIN)) == NULL ||
	    (b = BIO_new(rec_method)) == NULL) {
		cwi_tls_rec_destroy(r);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	r->in_cap = IN_MIN;
	BIO_set_data(b, r);
	rv = cwi_nng_ossl_conn_create(&r->ec, cwi_nng_tls_ossl(t), b);
	if (rv != 0) {
		cwi_tls_rec_destroy(r);
		return cwi_fail(CACHEW_ENOMEM, "TLS session: %s",
		    nng_strerror(rv));
	}
	r->ssl = cwi_nng_ossl_conn_ssl(r->ec);
	*out = r;
	return CACHEW_OK;
}

void
cwi_tls_rec_destroy(cwi_tls_rec *r)
{
	if (r == NULL)
		return;
	cwi_nng_ossl_conn_destroy(r->ec);
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

uint8_t *
cwi_tls_rec_in_room(cwi_tls_rec *r, size_t *room)
{
	if (r->in_off == r->in_len) {
		r->in_off = r->in_len = 0;
	} else if (r->in_off > 0) {
		/* Less than a record is left: move it to the front. */
		memmove(r->in, r->in + r->in_off, r->in_len - r->in_off);
		r->in_len -= r->in_off;
		r->in_off = 0;
	}
	if (r->in_filled && r->in_cap < IN_MAX) {
		uint8_t *p = realloc(r->in, r->in_cap * 2);

		/* Out of memory: the buffer it has still works. */
		if (p != NULL) {
			r->in = p;
			r->in_cap *= 2;
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
	r->in_len += n;
}

int
cwi_tls_rec_read(cwi_tls_rec *r, uint8_t *dst, size_t len, size_t *got,
    const char **why)
{
	int ret = SSL_read_ex(r->ssl, dst, len, got);

	*why = NULL;
	return ret == 1 ? 0 : cwi_nng_ossl_conn_err(r->ec, ret, why);
}

int
cwi_tls_rec_write(cwi_tls_rec *r, const uint8_t *src, size_t len,
    const char **why)
{
	*why = NULL;
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
