/*
 * nng_tls_ossl.c - an OpenSSL engine for nng 1.5's TLS streams.
 *
 * Why: nng 1.5 in Debian 12 encrypts with mbedTLS 2.28, whose record
 * ciphers run at 130-170 MB/s per core on this class of machine (AES-GCM
 * and ChaCha20-Poly1305 alike; mbedTLS's GHASH works a block per call),
 * while OpenSSL 3's AES-128-GCM runs at about 4 GB/s (AES-NI and
 * PCLMULQDQ, stitched). A W2 batch of f32 images is 600 KB per image:
 * through mbedTLS, encrypting and decrypting it cost more CPU than
 * decoding and cropping the JPEG did. nng lets a program register its
 * own engine (nng/supplemental/tls/engine.h), which every TLS
 * configuration allocated afterwards uses; this is that engine, on
 * libssl.
 *
 * What it keeps of nng's mbedTLS engine, so that peers of either kind
 * talk and refusals read the same (nng_tls.c, cwi_nng_tls_refusal):
 * TLS 1.2 only (a build on nng's engine speaks nothing else, and so
 * does the dialer's mbedTLS diagnosis), a client verifies the server by
 * default, NNG_EPEERAUTH for a peer whose certificate is missing or
 * fails verification, NNG_ECRYPTO for any other handshake failure (an
 * alert, bytes that are not TLS). OPTIONAL client authentication
 * verifies a certificate that is shown but lets the handshake finish
 * whatever the result, as mbedTLS's VERIFY_OPTIONAL does (`verified`
 * reports it). Cipher suites: ECDHE with AES-GCM first, then
 * ChaCha20-Poly1305.
 *
 * Bytes move through a BIO of our own whose read and write call
 * nng_tls_engine_recv / nng_tls_engine_send: NNG_EAGAIN becomes a retry,
 * anything else the connection's error, kept to be returned as such.
 *
 * CACHEW_TLS_ENGINE=mbedtls keeps nng's own engine (to compare, or should
 * a peer need it); the default, and "openssl", installs this one.
 */
#include "nng_int.h"

#include <nng/supplemental/tls/engine.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENGINE_NAME "cachew-openssl"

#define CIPHERS                                                               \
	"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"          \
	"ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"          \
	"ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

struct nng_tls_engine_config {
	SSL_CTX *ctx;
	bool server;
	nng_tls_auth_mode auth;
	char *server_name; /* the client's: SNI and the name verified */
};

struct nng_tls_engine_conn {
	SSL *ssl;
	void *tls; /* nng's, for nng_tls_engine_send/recv */
	int io_err; /* the transport's error that failed a BIO call */
	const char *name; /* a client's: the name the server must carry */
	char why[160]; /* OpenSSL's reason for the last failure */
};

/* ---- the BIO: bytes to and from nng's stream ------------------------------ */

static BIO_METHOD *bio_method;

static int
bio_write(BIO *b, const char *buf, int len)
{
	nng_tls_engine_conn *ec = BIO_get_data(b);
	size_t n = (size_t)len;
	int rv;

	BIO_clear_retry_flags(b);
	rv = nng_tls_engine_send(ec->tls, (const uint8_t *)buf, &n);
	if (rv == NNG_EAGAIN) {
		BIO_set_retry_write(b);
		return -1;
	}
	if (rv != 0) {
		ec->io_err = rv;
		return -1;
	}
	return (int)n;
}

static int
bio_read(BIO *b, char *buf, int len)
{
	nng_tls_engine_conn *ec = BIO_get_data(b);
	size_t n = (size_t)len;
	int rv;

	BIO_clear_retry_flags(b);
	rv = nng_tls_engine_recv(ec->tls, (uint8_t *)buf, &n);
	if (rv == NNG_EAGAIN) {
		BIO_set_retry_read(b);
		return -1;
	}
	if (rv != 0) {
		ec->io_err = rv;
		return -1;
	}
	return (int)n;
}

static long
bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	/* Writes go straight to nng (or to the record layer's buffer, which
	 * the link sends): nothing to flush. */
	return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int
bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

static pthread_once_t method_once = PTHREAD_ONCE_INIT;

BIO_METHOD *
cwi_nng_ossl_bio_method(const char *name, int (*rd)(BIO *, char *, int),
    int (*wr)(BIO *, const char *, int), long (*ctrl)(BIO *, int, long, void *))
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
	    name);

	if (m == NULL || !BIO_meth_set_write(m, wr) ||
	    !BIO_meth_set_read(m, rd) ||
	    !BIO_meth_set_ctrl(m, ctrl != NULL ? ctrl : bio_ctrl) ||
	    !BIO_meth_set_create(m, bio_create)) {
		BIO_meth_free(m);
		return NULL;
	}
	return m;
}

static void
method_make(void)
{
	bio_method = cwi_nng_ossl_bio_method("cachew-nng", bio_read, bio_write,
	    NULL);
}

/* ---- errors ----------------------------------------------------------------- */

/* The nng code of a failed SSL call: the transport's own error when a
 * BIO call failed, EPEERAUTH for a peer's certificate missing or not
 * verified, ECRYPTO for the rest. Clears OpenSSL's error queue (it is
 * per thread, and nng's threads serve every connection). */
static int
ssl_err(nng_tls_engine_conn *ec, int ret)
{
	int e = SSL_get_error(ec->ssl, ret);
	unsigned long code;
	int rv = NNG_ECRYPTO;

	ec->why[0] = '\0';

	switch (e) {
	case SSL_ERROR_WANT_READ:
	case SSL_ERROR_WANT_WRITE:
		return NNG_EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		ERR_clear_error();
		return NNG_ECLOSED;
	case SSL_ERROR_SYSCALL:
		if (ec->io_err != 0) {
			rv = ec->io_err;
			ec->io_err = 0;
		} else if (ERR_peek_error() == 0) {
			rv = NNG_ECONNSHUT; /* EOF where a record was due */
		}
		/* A client that drops the connection right after our
		 * certificate flight refused it: its alert may be lost to the
		 * reset its close sends (it leaves the rest of our flight
		 * unread), so say what the alert would have said. A port
		 * probe that never sent a ClientHello stays a reset. */
		if (SSL_is_server(ec->ssl) && !SSL_is_init_finished(ec->ssl) &&
		    SSL_get_state(ec->ssl) == TLS_ST_SW_SRVR_DONE)
			rv = NNG_ECRYPTO;
		break;
	default:
		break;
	}
	while ((code = ERR_get_error()) != 0) {
		/* The first reason is the one worth a log line. */
		if (ec->why[0] == '\0' && ERR_reason_error_string(code) != NULL)
			snprintf(ec->why, sizeof(ec->why), "%s",
			    ERR_reason_error_string(code));
		if (ERR_GET_LIB(code) != ERR_LIB_SSL)
			continue;
		switch (ERR_GET_REASON(code)) {
		case SSL_R_CERTIFICATE_VERIFY_FAILED:
		case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
		case SSL_R_NO_SHARED_CIPHER:
			rv = NNG_EPEERAUTH;
			break;
		default:
			break;
		}
	}
	return rv;
}

/* ---- connections ------------------------------------------------------------- */

static int
optional_verify(int ok, X509_STORE_CTX *x)
{
	(void)ok;
	(void)x;
	/* Verified, the result kept (conn_verified), never fatal. */
	return 1;
}

static bool
is_ip(const char *name)
{
	unsigned char buf[16];

	return inet_pton(AF_INET, name, buf) == 1 ||
	       inet_pton(AF_INET6, name, buf) == 1;
}

/* A client's check of the server's certificate: the chain as OpenSSL
 * verified it, then the name at depth 0. An address dialed matches an IP
 * entry of subjectAltName or, as with nng's mbedTLS engine, a DNS entry
 * (or the CN) spelling it, so certificates made for either engine work. */
static int
client_verify(int ok, X509_STORE_CTX *x)
{
	SSL *ssl = X509_STORE_CTX_get_ex_data(x,
	    SSL_get_ex_data_X509_STORE_CTX_idx());
	nng_tls_engine_conn *ec = ssl != NULL ? SSL_get_app_data(ssl) : NULL;
	X509 *cert = X509_STORE_CTX_get_current_cert(x);

	if (!ok || X509_STORE_CTX_get_error_depth(x) != 0 || ec == NULL ||
	    ec->name == NULL)
		return ok;
	if ((is_ip(ec->name) && X509_check_ip_asc(cert, ec->name, 0) == 1) ||
	    X509_check_host(cert, ec->name, 0, 0, NULL) == 1)
		return 1;
	X509_STORE_CTX_set_error(x, X509_V_ERR_HOSTNAME_MISMATCH);
	return 0;
}

/* ec's SSL of cfg's, over b (taken, even on failure). */
static int
conn_setup(nng_tls_engine_conn *ec, nng_tls_engine_config *cfg, BIO *b)
{
	if ((ec->ssl = SSL_new(cfg->ctx)) == NULL) {
		BIO_free(b);
		return NNG_ENOMEM;
	}
	SSL_set_bio(ec->ssl, b, b); /* the SSL owns it */
	SSL_set_mode(ec->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE |
				  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	if (cfg->server) {
		SSL_set_accept_state(ec->ssl);
		return 0;
	}
	SSL_set_connect_state(ec->ssl);
	if (cfg->server_name != NULL && cfg->auth != NNG_TLS_AUTH_MODE_NONE) {
		/* The configuration outlives its connections (nng holds a
		 * reference), so its name may be borrowed. */
		ec->name = cfg->server_name;
		SSL_set_app_data(ec->ssl, ec);
		SSL_set_verify(ec->ssl, SSL_get_verify_mode(ec->ssl),
		    client_verify);
	}
	if (cfg->server_name != NULL && !is_ip(cfg->server_name))
		(void)SSL_set_tlsext_host_name(ec->ssl, cfg->server_name);
	return 0;
}

static int
conn_init(nng_tls_engine_conn *ec, void *tls, nng_tls_engine_config *cfg)
{
	BIO *b;

	ec->tls = tls;
	pthread_once(&method_once, method_make);
	if (bio_method == NULL || (b = BIO_new(bio_method)) == NULL)
		return NNG_ENOMEM;
	BIO_set_data(b, ec);
	return conn_setup(ec, cfg, b);
}

static void
conn_fini(nng_tls_engine_conn *ec)
{
	SSL_free(ec->ssl);
	ec->ssl = NULL;
}

static void
conn_close(nng_tls_engine_conn *ec)
{
	/* A close_notify if it can go now; nothing waits for the peer's. */
	if (ec->ssl != NULL && SSL_is_init_finished(ec->ssl))
		(void)SSL_shutdown(ec->ssl);
	ERR_clear_error();
}

static int
conn_handshake(nng_tls_engine_conn *ec)
{
	int ret = SSL_do_handshake(ec->ssl);

	return ret == 1 ? 0 : ssl_err(ec, ret);
}

static int
conn_recv(nng_tls_engine_conn *ec, uint8_t *buf, size_t *szp)
{
	size_t n = 0;
	int ret = SSL_read_ex(ec->ssl, buf, *szp, &n);

	if (ret != 1)
		return ssl_err(ec, ret);
	*szp = n;
	return 0;
}

static int
conn_send(nng_tls_engine_conn *ec, const uint8_t *buf, size_t *szp)
{
	size_t n = 0;
	int ret = SSL_write_ex(ec->ssl, buf, *szp, &n);

	if (ret != 1)
		return ssl_err(ec, ret);
	*szp = n;
	return 0;
}

static bool
conn_verified(nng_tls_engine_conn *ec)
{
	X509 *peer = SSL_get1_peer_certificate(ec->ssl);
	bool ok = peer != NULL && SSL_get_verify_result(ec->ssl) == X509_V_OK;

	X509_free(peer);
	return ok;
}

/* ---- configurations ------------------------------------------------------------ */

static void
config_fini(nng_tls_engine_config *cfg)
{
	SSL_CTX_free(cfg->ctx);
	cfg->ctx = NULL;
	free(cfg->server_name);
	cfg->server_name = NULL;
}

static int
config_auth_mode(nng_tls_engine_config *cfg, nng_tls_auth_mode mode)
{
	switch (mode) {
	case NNG_TLS_AUTH_MODE_NONE:
		SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_NONE, NULL);
		break;
	case NNG_TLS_AUTH_MODE_OPTIONAL:
		SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_PEER, optional_verify);
		break;
	case NNG_TLS_AUTH_MODE_REQUIRED:
		SSL_CTX_set_verify(cfg->ctx,
		    SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
		break;
	default:
		return NNG_EINVAL;
	}
	cfg->auth = mode;
	return 0;
}

static int
config_init(nng_tls_engine_config *cfg, nng_tls_mode mode)
{
	cfg->server = mode == NNG_TLS_MODE_SERVER;
	cfg->ctx = SSL_CTX_new(cfg->server ? TLS_server_method()
					   : TLS_client_method());
	if (cfg->ctx == NULL)
		return NNG_ENOMEM;
	if (!SSL_CTX_set_min_proto_version(cfg->ctx, TLS1_2_VERSION) ||
	    !SSL_CTX_set_max_proto_version(cfg->ctx, TLS1_2_VERSION) ||
	    !SSL_CTX_set_cipher_list(cfg->ctx, CIPHERS)) {
		config_fini(cfg);
		ERR_clear_error();
		return NNG_ENOTSUP;
	}
	/* The server picks among the client's suites by its own order
	 * (AES-GCM first); no session tickets or cache: every connection
	 * is long-lived. */
	SSL_CTX_set_options(cfg->ctx, SSL_OP_CIPHER_SERVER_PREFERENCE |
					  SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_session_cache_mode(cfg->ctx, SSL_SESS_CACHE_OFF);
	return config_auth_mode(cfg, cfg->server ? NNG_TLS_AUTH_MODE_NONE
						 : NNG_TLS_AUTH_MODE_REQUIRED);
}

static int
config_server_name(nng_tls_engine_config *cfg, const char *name)
{
	char *dup = strdup(name);

	if (dup == NULL)
		return NNG_ENOMEM;
	free(cfg->server_name);
	cfg->server_name = dup;
	return 0;
}

static int
config_ca_chain(nng_tls_engine_config *cfg, const char *certs, const char *crl)
{
	X509_STORE *store = SSL_CTX_get_cert_store(cfg->ctx);
	BIO *b = BIO_new_mem_buf(certs, -1);
	X509 *x;
	int n = 0, rv = 0;

	if (b == NULL)
		return NNG_ENOMEM;
	while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
		if (!X509_STORE_add_cert(store, x))
			rv = NNG_ECRYPTO;
		X509_free(x);
		n++;
	}
	BIO_free(b);
	ERR_clear_error(); /* the end of the PEM data reads as an error */
	if (rv == 0 && n == 0)
		rv = NNG_ECRYPTO;
	if (rv == 0 && crl != NULL) {
		X509_CRL *c;

		if ((b = BIO_new_mem_buf(crl, -1)) == NULL)
			return NNG_ENOMEM;
		while ((c = PEM_read_bio_X509_CRL(b, NULL, NULL, NULL)) !=
		    NULL) {
			if (!X509_STORE_add_crl(store, c))
				rv = NNG_ECRYPTO;
			X509_CRL_free(c);
		}
		BIO_free(b);
		ERR_clear_error();
		X509_STORE_set_flags(store,
		    X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
	}
	return rv;
}

static int
config_own_cert(nng_tls_engine_config *cfg, const char *cert, const char *key,
    const char *pass)
{
	BIO *b = BIO_new_mem_buf(cert, -1);
	X509 *x = NULL;
	EVP_PKEY *k = NULL;
	int rv = NNG_ECRYPTO;

	if (b == NULL)
		return NNG_ENOMEM;
	/* The first certificate is ours, the rest its chain. */
	if ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) == NULL ||
	    SSL_CTX_use_certificate(cfg->ctx, x) != 1)
		goto done;
	for (X509 *c; (c = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL;) {
		if (SSL_CTX_add0_chain_cert(cfg->ctx, c) != 1) {
			X509_free(c);
			goto done;
		}
	}
	BIO_free(b);
	if ((b = BIO_new_mem_buf(key, -1)) == NULL) {
		rv = NNG_ENOMEM;
		goto done;
	}
	k = PEM_read_bio_PrivateKey(b, NULL, NULL, (void *)pass);
	if (k != NULL && SSL_CTX_use_PrivateKey(cfg->ctx, k) == 1 &&
	    SSL_CTX_check_private_key(cfg->ctx) == 1)
		rv = 0;
done:
	BIO_free(b);
	X509_free(x);
	EVP_PKEY_free(k);
	ERR_clear_error();
	return rv;
}

static int
config_version(nng_tls_engine_config *cfg, nng_tls_version lo,
    nng_tls_version hi)
{
	(void)cfg;
	/* TLS 1.2 only, as nng's engine: see the top of the file. */
	return lo <= NNG_TLS_1_2 && hi >= NNG_TLS_1_2 ? 0 : NNG_ENOTSUP;
}

static nng_tls_engine_config_ops config_ops = {
    .size = sizeof(nng_tls_engine_config),
    .init = config_init,
    .fini = config_fini,
    .server = config_server_name,
    .auth = config_auth_mode,
    .ca_chain = config_ca_chain,
    .own_cert = config_own_cert,
    .version = config_version,
};

static nng_tls_engine_conn_ops conn_ops = {
    .size = sizeof(nng_tls_engine_conn),
    .init = conn_init,
    .fini = conn_fini,
    .close = conn_close,
    .handshake = conn_handshake,
    .recv = conn_recv,
    .send = conn_send,
    .verified = conn_verified,
};

static const nng_tls_engine engine = {
    .version = NNG_TLS_ENGINE_VERSION,
    .config_ops = &config_ops,
    .conn_ops = &conn_ops,
    .name = ENGINE_NAME,
    .description = "OpenSSL (libssl), for cachew",
    .fips_mode = false,
};

/* ---- for cachew's own record layer (nng_tls_record.c) -------------------------- */

int
cwi_nng_ossl_config_create(nng_tls_engine_config **out, bool server,
    nng_tls_auth_mode auth, const char *ca_pem, const char *cert_pem,
    const char *key_pem, const char *server_name)
{
	nng_tls_engine_config *cfg = calloc(1, sizeof(*cfg));
	int rv;

	*out = NULL;
	if (cfg == NULL)
		return NNG_ENOMEM;
	rv = config_init(cfg, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT);
	if (rv == 0)
		rv = config_auth_mode(cfg, auth);
	if (rv == 0 && ca_pem != NULL)
		rv = config_ca_chain(cfg, ca_pem, NULL);
	if (rv == 0 && cert_pem != NULL)
		rv = config_own_cert(cfg, cert_pem, key_pem, NULL);
	if (rv == 0 && server_name != NULL)
		rv = config_server_name(cfg, server_name);
	if (rv != 0) {
		cwi_nng_ossl_config_destroy(cfg);
		return rv;
	}
	*out = cfg;
	return 0;
}

void
cwi_nng_ossl_config_destroy(nng_tls_engine_config *cfg)
{
	if (cfg == NULL)
		return;
	config_fini(cfg);
	free(cfg);
}

int
cwi_nng_ossl_conn_create(nng_tls_engine_conn **out, nng_tls_engine_config *cfg,
    BIO *b)
{
	nng_tls_engine_conn *ec = calloc(1, sizeof(*ec));
	int rv;

	*out = NULL;
	if (ec == NULL) {
		BIO_free(b);
		return NNG_ENOMEM;
	}
	if ((rv = conn_setup(ec, cfg, b)) != 0) {
		free(ec);
		return rv;
	}
	*out = ec;
	return 0;
}

void
cwi_nng_ossl_conn_destroy(nng_tls_engine_conn *ec)
{
	if (ec == NULL)
		return;
	conn_fini(ec);
	free(ec);
}

SSL *
cwi_nng_ossl_conn_ssl(nng_tls_engine_conn *ec)
{
	return ec->ssl;
}

int
cwi_nng_ossl_conn_err(nng_tls_engine_conn *ec, int ret, const char **why)
{
	int rv = ssl_err(ec, ret);

	*why = ec->why[0] != '\0' ? ec->why : nng_strerror(rv);
	return rv;
}

/* ---- installing it ------------------------------------------------------------- */

static bool
wanted(void)
{
	const char *e = getenv("CACHEW_TLS_ENGINE");

	return e == NULL || e[0] == '\0' || strcmp(e, "mbedtls") != 0;
}

int
cwi_nng_tls_engine_use(void)
{
	nng_tls_config *probe;
	int rv;

	if (!wanted() || strcmp(nng_tls_engine_name(), ENGINE_NAME) == 0)
		return 0;
	/* nng's initialisation (at its first use, again after nng_fini)
	 * registers its own engine: make it happen first, then replace
	 * it. Configurations allocated before keep the engine they had. */
	if ((rv = nng_tls_config_alloc(&probe, NNG_TLS_MODE_CLIENT)) != 0)
		return rv;
	nng_tls_config_free(probe);
	return nng_tls_engine_register(&engine);
}

const char *
cwi_nng_tls_engine(void)
{
	return nng_tls_engine_name();
}
