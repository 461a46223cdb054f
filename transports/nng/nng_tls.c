/*
 * nng_tls.c - TLS for the nng transport: tls+tcp://host:port is a tcp
 * link whose bytes go through TLS 1.2; the framing above is unchanged
 * (docs/protocol.md, "Transport framing"). Two layers can carry it:
 * cachew's own record layer (nng_tls_record.c, the default: a plain tcp
 * stream, OpenSSL driven by the link) and nng 1.5's TLS streams
 * (CACHEW_TLS_LAYER=nng; the engine nng_tls_ossl.c registers, or nng's
 * mbedTLS one with CACHEW_TLS_ENGINE=mbedtls). What this file owns:
 *
 *   layers        which one a listener or a dialer uses, and its
 *                 configuration made of the credentials.
 *   credentials   the PEM files of cwi_transport_opts .tls_*, read and
 *                 checked here with mbedTLS before nng sees them, so that
 *                 a missing file, a key that is not the certificate's,
 *                 an expired certificate or an empty CA file is refused at
 *                 listen or dial time naming the option and the file (nng
 *                 says "Cryptographic error" for all of them).
 *   refusals      nng reports a failed handshake as NNG_ECRYPTO,
 *                 NNG_EPEERAUTH or NNG_ECONNSHUT and keeps the reason. A
 *                 listener names what the code tells (a missing client
 *                 certificate is NNG_EPEERAUTH). A dialer diagnoses
 *                 (cwi_nng_tls_diagnose): it connects once more on a
 *                 socket of its own and runs the handshake with mbedTLS
 *                 directly, the same credentials and the server's
 *                 certificate verified optionally, and reads the reason
 *                 off what happens: the verification flags of the
 *                 server's certificate (not signed by tls_ca, expired,
 *                 another name), the alert the server sends about ours,
 *                 a certificate request it could not answer, or the first
 *                 bytes of a listener that does not speak TLS (the SP
 *                 handshake "\0SP\0"). A tcp:// dialer whose link dies
 *                 before the peer's handshake asks the opposite question:
 *                 does a peer that does not speak first answer a TLS
 *                 ClientHello?
 *
 * The diagnosis blocks for at most DIAG_BUDGET_MS: the dialer runs it on
 * a thread of its own, never on nng's.
 */
#include "nng_int.h"

#include <nng/supplemental/tls/tls.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>

/* The diagnosis reads fields of the handshake's context (its state, the
 * alert received, whether a certificate was asked for) that mbedTLS 3
 * makes private; nng 1.5 in Debian 12 is built on mbedTLS 2.28. */
#if MBEDTLS_VERSION_MAJOR != 2
#error "nng_tls.c is written for mbedTLS 2.x (the one nng 1.5 uses)"
#endif

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* PEM files larger than this are not certificates or keys. */
#define PEM_MAX_BYTES (1 << 20)
/* The whole diagnosis: connect, handshake, in this time. A link's own
 * handshake gets as long (HANDSHAKE_TIMEOUT_MS, nng_link.c), and the probe's
 * is the same work: a peer that answers ends it in milliseconds, and a
 * slow one needs the time. 1.5 s ran out under valgrind at load 16-19
 * (the test process runs both ends' ECDHE and ECDSA tens of times
 * slower): the probe saw no certificate, and a lasting refusal ended as
 * a dead link's CACHEW_ECLOSED, not CACHEW_EAUTH naming the reason. */
#define DIAG_BUDGET_MS 10000

struct cwi_nng_tls {
	nng_tls_config *cfg;          /* on nng's TLS streams */
	nng_tls_engine_config *ossl; /* on cachew's record layer */
	bool server;
	/* The dialer's, for the diagnosis: PEM text (NUL-terminated). */
	char *ca_pem, *cert_pem, *key_pem;
	char *ca_path, *cert_path;
	char *server_name;
	char cert_subject[200]; /* ours, for messages */
	cwi_tls_client_auth client_auth;
};

bool
cwi_nng_url_is_tls(const char *url)
{
	return strncmp(url, "tls+tcp://", 10) == 0;
}

bool
cwi_nng_tls_own_layer(void)
{
	const char *layer = getenv("CACHEW_TLS_LAYER");
	const char *engine = getenv("CACHEW_TLS_ENGINE");

	if (engine != NULL && strcmp(engine, "mbedtls") == 0)
		return false;
	return layer == NULL || strcmp(layer, "nng") != 0;
}

nng_tls_engine_config *
cwi_nng_tls_ossl(const cwi_nng_tls *t)
{
	return t != NULL ? t->ossl : NULL;
}

char *
cwi_nng_tls_stream_url(const char *url, bool own_layer)
{
	/* "tls+tcp://..." less its "tls+". */
	if (own_layer && cwi_nng_url_is_tls(url))
		return cwi_strdup(url + 4);
	return cwi_strdup(url);
}

static const char *
opt_str(const char *s)
{
	return s != NULL && s[0] != '\0' ? s : NULL;
}

/* ---- credentials ---------------------------------------------------------- */

/* Reads a PEM file whole, NUL-terminated (mbedTLS parses PEM with its
 * terminating NUL). `what` names the option in errors. */
static cachew_err
pem_read(const char *url, const char *what, const char *path, char **out)
{
	struct stat st;
	char *buf = NULL;
	cachew_err rv = CACHEW_OK;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	size_t got = 0;

	*out = NULL;
	if (fd < 0)
		return cwi_fail(errno == ENOENT ? CACHEW_ENOENT : CACHEW_EIO,
		    "%s: %s '%s': %s", url, what, path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size > PEM_MAX_BYTES) {
		rv = cwi_fail(CACHEW_EINVAL, "%s: %s '%s': not a PEM file (a "
		    "regular file of at most %d bytes)", url, what, path,
		    PEM_MAX_BYTES);
		goto done;
	}
	if ((buf = malloc((size_t)st.st_size + 1)) == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n <= 0) {
			rv = cwi_fail(CACHEW_EIO, "%s: %s '%s': %s", url, what,
			    path, n == 0 ? "file shrank while read"
					 : strerror(errno));
			goto done;
		}
		got += (size_t)n;
	}
	buf[got] = '\0';
	*out = buf;
	buf = NULL;
done:
	free(buf);
	close(fd);
	return rv;
}

static const char *
tls_strerror(int err, char *buf, size_t len)
{
	mbedtls_strerror(err, buf, len);
	return buf;
}

/* "2026-11-29 01:11:50 UTC" */
static void
time_text(const mbedtls_x509_time *t, char *buf, size_t len)
{
	snprintf(buf, len, "%04d-%02d-%02d %02d:%02d:%02d UTC", t->year,
	    t->mon, t->day, t->hour, t->min, t->sec);
}

/* Our certificate and key: both parse, belong together, and the
 * certificate has not expired. */
static cachew_err
own_cert_check(cwi_nng_tls *t, const char *url, const cwi_transport_opts *o,
    const char *cert_pem, const char *key_pem)
{
	mbedtls_x509_crt crt;
	mbedtls_pk_context key;
	char err[160], when[40];
	cachew_err rv = CACHEW_OK;
	int mrv;

	mbedtls_x509_crt_init(&crt);
	mbedtls_pk_init(&key);
	mrv = mbedtls_x509_crt_parse(&crt, (const unsigned char *)cert_pem,
	    strlen(cert_pem) + 1);
	if (mrv != 0) {
		rv = cwi_fail(CACHEW_EINVAL, "%s: tls_cert '%s': not a PEM "
		    "certificate: %s", url, o->tls_cert,
		    tls_strerror(mrv, err, sizeof(err)));
		goto done;
	}
	mbedtls_x509_dn_gets(t->cert_subject, sizeof(t->cert_subject),
	    &crt.subject);
	mrv = mbedtls_pk_parse_key(&key, (const unsigned char *)key_pem,
	    strlen(key_pem) + 1, NULL, 0);
	if (mrv != 0) {
		rv = cwi_fail(CACHEW_EINVAL, "%s: tls_key '%s': not a PEM "
		    "private key (or one with a passphrase): %s", url,
		    o->tls_key, tls_strerror(mrv, err, sizeof(err)));
		goto done;
	}
	mrv = mbedtls_pk_check_pair(&crt.pk, &key);
	if (mrv != 0) {
		rv = cwi_fail(CACHEW_EINVAL, "%s: tls_key '%s' is not the key "
		    "of tls_cert '%s' (%s)", url, o->tls_key, o->tls_cert,
		    t->cert_subject);
		goto done;
	}
	if (mbedtls_x509_time_is_past(&crt.valid_to)) {
		time_text(&crt.valid_to, when, sizeof(when));
		rv = cwi_fail(CACHEW_EAUTH, "%s: tls_cert '%s': the "
		    "certificate '%s' expired on %s", url, o->tls_cert,
		    t->cert_subject, when);
		goto done;
	}
	if (mbedtls_x509_time_is_future(&crt.valid_from)) {
		time_text(&crt.valid_from, when, sizeof(when));
		cwi_log(CACHEW_LOG_WARN, "transport", "url=%s tls_cert=%s "
		    "reason=\"the certificate '%s' is not valid before %s "
		    "(is this host's clock right?)\"", url, o->tls_cert,
		    t->cert_subject, when);
	}
done:
	mbedtls_pk_free(&key);
	mbedtls_x509_crt_free(&crt);
	return rv;
}

static cachew_err
ca_check(const char *url, const char *path, const char *pem)
{
	mbedtls_x509_crt ca;
	char err[160];
	int mrv;

	mbedtls_x509_crt_init(&ca);
	mrv = mbedtls_x509_crt_parse(&ca, (const unsigned char *)pem,
	    strlen(pem) + 1);
	mbedtls_x509_crt_free(&ca);
	/* > 0: that many certificates of the file did not parse. */
	if (mrv != 0)
		return cwi_fail(CACHEW_EINVAL, "%s: tls_ca '%s': %s", url, path,
		    mrv > 0 ? "some certificates do not parse"
			    : tls_strerror(mrv, err, sizeof(err)));
	return CACHEW_OK;
}

/* The host of "tls+tcp://host:port" ("[v6]" without brackets). */
static char *
url_host(const char *url)
{
	const char *h = strstr(url, "://"), *end;

	h = h != NULL ? h + 3 : url;
	if (*h == '[') {
		h++;
		end = strchr(h, ']');
	} else {
		end = strrchr(h, ':');
	}
	if (end == NULL)
		end = h + strlen(h);
	return cwi_asprintf("%.*s", (int)(end - h), h);
}

/* What a dialer or a listener needs, named when missing. */
static cachew_err
creds_required(const char *url, const cwi_transport_opts *o, bool server)
{
	if ((opt_str(o->tls_cert) == NULL) != (opt_str(o->tls_key) == NULL))
		return cwi_fail(CACHEW_EINVAL, "%s: tls_cert and tls_key go "
		    "together: %s is missing", url,
		    opt_str(o->tls_cert) == NULL ? "tls_cert" : "tls_key");
	if (server && opt_str(o->tls_cert) == NULL)
		return cwi_fail(CACHEW_EINVAL, "%s: a TLS listener needs its "
		    "certificate and key: set tls_cert and tls_key", url);
	if (!server && opt_str(o->tls_ca) == NULL)
		return cwi_fail(CACHEW_EINVAL, "%s: a TLS dialer needs the CA "
		    "that signs the server's certificate: set tls_ca", url);
	if (server && o->tls_client_auth != CWI_TLS_CLIENT_AUTH_NONE &&
	    opt_str(o->tls_ca) == NULL)
		return cwi_fail(CACHEW_EINVAL, "%s: tls_client_auth=%s needs "
		    "tls_ca, the CA that signs clients' certificates", url,
		    o->tls_client_auth == CWI_TLS_CLIENT_AUTH_REQUIRED
			? "required" : "optional");
	return CACHEW_OK;
}

/* Hands the checked credentials to nng. */
static cachew_err
nng_config_build(cwi_nng_tls *t, const char *url, bool own_layer)
{
	static const nng_tls_auth_mode modes[] = {
	    [CWI_TLS_CLIENT_AUTH_NONE] = NNG_TLS_AUTH_MODE_NONE,
	    [CWI_TLS_CLIENT_AUTH_OPTIONAL] = NNG_TLS_AUTH_MODE_OPTIONAL,
	    [CWI_TLS_CLIENT_AUTH_REQUIRED] = NNG_TLS_AUTH_MODE_REQUIRED,
	};
	int nrv;

	if (own_layer) {
		nrv = cwi_nng_ossl_config_create(&t->ossl, t->server, t->server
			? modes[t->client_auth] : NNG_TLS_AUTH_MODE_REQUIRED,
		    t->ca_pem, t->cert_pem, t->key_pem,
		    t->server ? NULL : t->server_name);
		return nrv == 0 ? CACHEW_OK
				: cwi_nng_err(nrv, url, "TLS configuration");
	}
	if ((nrv = cwi_nng_tls_engine_use()) != 0)
		return cwi_nng_err(nrv, url, "TLS engine");
	if ((nrv = nng_tls_config_alloc(&t->cfg, t->server
		     ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT)) != 0)
		return cwi_nng_err(nrv, url, "TLS configuration");
	nrv = nng_tls_config_auth_mode(t->cfg, t->server
		? modes[t->client_auth] : NNG_TLS_AUTH_MODE_REQUIRED);
	if (nrv == 0 && t->ca_pem != NULL)
		nrv = nng_tls_config_ca_chain(t->cfg, t->ca_pem, NULL);
	if (nrv == 0 && t->cert_pem != NULL)
		nrv = nng_tls_config_own_cert(t->cfg, t->cert_pem, t->key_pem,
		    NULL);
	if (nrv == 0 && !t->server)
		nrv = nng_tls_config_server_name(t->cfg, t->server_name);
	if (nrv != 0)
		return cwi_nng_err(nrv, url, "TLS configuration");
	return CACHEW_OK;
}

cachew_err
cwi_nng_tls_create(cwi_nng_tls **out, const char *url,
    const cwi_transport_opts *o, bool server, bool own_layer)
{
	cwi_nng_tls *t = calloc(1, sizeof(*t));
	cachew_err rv;

	*out = NULL;
	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	t->server = server;
	t->client_auth = server ? o->tls_client_auth : CWI_TLS_CLIENT_AUTH_NONE;
	if ((rv = creds_required(url, o, server)) != CACHEW_OK)
		goto fail;
	if (opt_str(o->tls_ca) != NULL &&
	    (t->client_auth != CWI_TLS_CLIENT_AUTH_NONE || !server)) {
		if ((rv = pem_read(url, "tls_ca", o->tls_ca, &t->ca_pem)) !=
			CACHEW_OK ||
		    (rv = ca_check(url, o->tls_ca, t->ca_pem)) != CACHEW_OK)
			goto fail;
	}
	if (opt_str(o->tls_cert) != NULL) {
		if ((rv = pem_read(url, "tls_cert", o->tls_cert,
			 &t->cert_pem)) != CACHEW_OK ||
		    (rv = pem_read(url, "tls_key", o->tls_key, &t->key_pem)) !=
			CACHEW_OK ||
		    (rv = own_cert_check(t, url, o, t->cert_pem, t->key_pem)) !=
			CACHEW_OK)
			goto fail;
	}
	t->server_name = opt_str(o->tls_server_name) != NULL
	    ? cwi_strdup(o->tls_server_name) : url_host(url);
	t->ca_path = cwi_strdup(opt_str(o->tls_ca) != NULL ? o->tls_ca : "");
	t->cert_path = cwi_strdup(
	    opt_str(o->tls_cert) != NULL ? o->tls_cert : "");
	if (t->server_name == NULL || t->ca_path == NULL ||
	    t->cert_path == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if ((rv = nng_config_build(t, url, own_layer)) != CACHEW_OK)
		goto fail;
	if (server)
		cwi_log(CACHEW_LOG_INFO, "transport", "event=tls_listener "
		    "url=%s layer=%s engine=%s client_auth=%s", url,
		    own_layer ? "cachew" : "nng",
		    own_layer ? "openssl" : cwi_nng_tls_engine(),
		    t->client_auth == CWI_TLS_CLIENT_AUTH_REQUIRED ? "required"
		    : t->client_auth == CWI_TLS_CLIENT_AUTH_OPTIONAL ? "optional"
								   : "none");
	*out = t;
	return CACHEW_OK;
fail:
	cwi_nng_tls_destroy(t);
	return rv;
}

void
cwi_nng_tls_destroy(cwi_nng_tls *t)
{
	if (t == NULL)
		return;
	if (t->cfg != NULL)
		nng_tls_config_free(t->cfg);
	cwi_nng_ossl_config_destroy(t->ossl);
	free(t->ca_pem);
	free(t->cert_pem);
	if (t->key_pem != NULL) {
		/* A private key does not outlive its use in freed memory. */
		volatile char *k = t->key_pem;
		for (size_t i = 0; k[i] != '\0'; i++)
			k[i] = '\0';
		free(t->key_pem);
	}
	free(t->ca_path);
	free(t->cert_path);
	free(t->server_name);
	free(t);
}

int
cwi_nng_tls_set_dialer(cwi_nng_tls *t, nng_stream_dialer *d)
{
	if (t->cfg == NULL)
		return 0; /* cachew's layer: d dials tcp:// */
	return nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, t->cfg);
}

int
cwi_nng_tls_set_listener(cwi_nng_tls *t, nng_stream_listener *l)
{
	if (t->cfg == NULL)
		return 0; /* cachew's layer: l listens on tcp:// */
	return nng_stream_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, t->cfg);
}

/* ---- refusals --------------------------------------------------------------- */

const char *
cwi_nng_tls_refusal(int rv, bool server)
{
	switch (rv) {
	case NNG_EPEERAUTH:
		return server ? "the client sent no certificate, or one that "
				"tls_ca does not trust or that has expired "
				"(tls_client_auth requires one)"
			      : "the server could not be authenticated";
	case NNG_ECRYPTO:
		/* mbedTLS says no more: the client's alert, a certificate
		 * of its that fails verification, and bytes that are not
		 * TLS all end here. */
		return server ? "the client refused our certificate, or showed "
				"one that tls_ca does not trust, or does not "
				"speak TLS (a tcp:// dialer?)"
			      : "TLS handshake failed";
	case NNG_ECONNSHUT:
	case NNG_ECONNRESET:
		/* A listener sees this from anyone who connects and leaves
		 * (a port probe): not worth a warning. */
		return server ? NULL
			      : "the server closed the connection during the "
				"TLS handshake";
	default:
		return NULL;
	}
}

/* ---- the dialer's diagnosis ------------------------------------------------- */

/* One diagnosis: its socket, its deadline, what it saw. */
typedef struct probe {
	int fd;
	uint64_t deadline_ns;
	uint8_t first[4]; /* the first bytes the peer sent */
	size_t nfirst;
	bool leaf_seen;   /* the server's certificate arrived */
	char leaf_subject[200];
	char leaf_issuer[200];
	mbedtls_x509_time leaf_from, leaf_to;
} probe;

static int
probe_left_ms(const probe *p)
{
	uint64_t now = cwi_now_ns();

	return now >= p->deadline_ns ? 0
				     : (int)((p->deadline_ns - now) / 1000000u);
}

static int
probe_send(void *ctx, const unsigned char *buf, size_t len)
{
	probe *p = ctx;
	ssize_t n = send(p->fd, buf, len, MSG_NOSIGNAL);

	return n < 0 ? MBEDTLS_ERR_NET_SEND_FAILED : (int)n;
}

static int
probe_recv(void *ctx, unsigned char *buf, size_t len, uint32_t timeout)
{
	probe *p = ctx;
	struct pollfd pf = {.fd = p->fd, .events = POLLIN};
	ssize_t n;

	(void)timeout; /* the probe's own deadline bounds every read */
	if (poll(&pf, 1, probe_left_ms(p)) <= 0)
		return MBEDTLS_ERR_SSL_TIMEOUT;
	n = recv(p->fd, buf, len, 0);
	if (n < 0)
		return MBEDTLS_ERR_NET_RECV_FAILED;
	for (ssize_t i = 0; i < n && p->nfirst < sizeof(p->first); i++)
		p->first[p->nfirst++] = buf[i];
	return (int)n; /* 0: the peer closed */
}

static int
probe_verify(void *ctx, mbedtls_x509_crt *crt, int depth, uint32_t *flags)
{
	probe *p = ctx;

	(void)flags; /* judged at the end, from the verify result */
	if (depth == 0) {
		p->leaf_seen = true;
		mbedtls_x509_dn_gets(p->leaf_subject, sizeof(p->leaf_subject),
		    &crt->subject);
		mbedtls_x509_dn_gets(p->leaf_issuer, sizeof(p->leaf_issuer),
		    &crt->issuer);
		p->leaf_from = crt->valid_from;
		p->leaf_to = crt->valid_to;
	}
	return 0;
}

/* Connects to host:port within the probe's deadline. */
static bool
probe_connect(probe *p, const char *host, const char *port)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	struct pollfd pf;
	int err = 0;
	socklen_t elen = sizeof(err);

	p->fd = -1;
	if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL)
		return false;
	p->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC |
	    SOCK_NONBLOCK, ai->ai_protocol);
	if (p->fd < 0) {
		err = errno;
	} else if (connect(p->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		if (errno != EINPROGRESS) {
			/* Failed at once (no route, say): not connected. */
			err = errno != 0 ? errno : EIO;
		} else {
			pf = (struct pollfd){.fd = p->fd, .events = POLLOUT};
			if (poll(&pf, 1, probe_left_ms(p)) != 1 ||
			    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err,
				&elen) != 0)
				err = ETIMEDOUT;
		}
	}
	freeaddrinfo(ai);
	return err == 0 && p->fd >= 0;
}

/* The reason the server's certificate fails verification (flags != 0). */
static void
leaf_reason(const cwi_nng_tls *t, const probe *p, uint32_t flags, char *buf,
    size_t len)
{
	char when[40];

	if (flags & MBEDTLS_X509_BADCERT_EXPIRED) {
		time_text(&p->leaf_to, when, sizeof(when));
		snprintf(buf, len, "the server's certificate '%s' expired on "
		    "%s", p->leaf_subject, when);
	} else if (flags & MBEDTLS_X509_BADCERT_FUTURE) {
		time_text(&p->leaf_from, when, sizeof(when));
		snprintf(buf, len, "the server's certificate '%s' is not valid "
		    "before %s", p->leaf_subject, when);
	} else if (flags & MBEDTLS_X509_BADCERT_NOT_TRUSTED) {
		snprintf(buf, len, "the server's certificate '%s' (issuer "
		    "'%s') is not signed by a CA in tls_ca '%s'",
		    p->leaf_subject, p->leaf_issuer, t->ca_path);
	} else if (flags & MBEDTLS_X509_BADCERT_CN_MISMATCH) {
		snprintf(buf, len, "the server's certificate '%s' is not "
		    "issued for '%s' (set tls_server_name to a name it "
		    "carries)", p->leaf_subject, t->server_name);
	} else {
		char info[200];
		mbedtls_x509_crt_verify_info(info, sizeof(info), "", flags);
		info[strcspn(info, "\n")] = '\0';
		snprintf(buf, len, "the server's certificate '%s' is refused: "
		    "%s", p->leaf_subject, info);
	}
}

static const char *
alert_name(unsigned a)
{
	switch (a) {
	case MBEDTLS_SSL_ALERT_MSG_HANDSHAKE_FAILURE:
		return "handshake failure";
	case MBEDTLS_SSL_ALERT_MSG_BAD_CERT:
		return "bad certificate";
	case MBEDTLS_SSL_ALERT_MSG_CERT_EXPIRED:
		return "certificate expired";
	case MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA:
		return "unknown CA: not signed by the server's CA";
	case MBEDTLS_SSL_ALERT_MSG_CERT_UNKNOWN:
		return "certificate unknown";
	case MBEDTLS_SSL_ALERT_MSG_UNSUPPORTED_CERT:
		return "unsupported certificate";
	case MBEDTLS_SSL_ALERT_MSG_CERT_REVOKED:
		return "certificate revoked";
	default:
		return NULL;
	}
}

/* A failed probe handshake over TLS (mrv != 0): why, or false when it
 * tells nothing that lasts (the server went away). */
static bool
tls_failure_reason(const cwi_nng_tls *t, const probe *p,
    mbedtls_ssl_context *ssl, int mrv, char *buf, size_t len)
{
	bool asked_cert = ssl->client_auth != 0;
	char err[160];

	if (p->nfirst >= 4 && memcmp(p->first, "\0SP\0", 4) == 0) {
		snprintf(buf, len, "the listener does not speak TLS (a "
		    "plaintext tcp:// listener): dial it with tcp://");
		return true;
	}
	if (mrv == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE) {
		unsigned a = ssl->in_msg[1];
		char what[64];

		if (alert_name(a) != NULL)
			snprintf(what, sizeof(what), "%s", alert_name(a));
		else
			snprintf(what, sizeof(what), "TLS alert %u", a);
		if (!asked_cert)
			snprintf(buf, len, "the listener refused the handshake: "
			    "%s", what);
		else if (t->cert_pem == NULL)
			snprintf(buf, len, "the listener requires a client "
			    "certificate: set tls_cert and tls_key (%s)", what);
		else
			snprintf(buf, len, "the listener refused our "
			    "certificate '%s' (tls_cert '%s'): %s",
			    t->cert_subject, t->cert_path, what);
		return true;
	}
	if (asked_cert && ssl->state > MBEDTLS_SSL_CLIENT_CERTIFICATE) {
		/* It asked for our certificate, got it (or none) and hung
		 * up: mbedTLS refuses a missing one without an alert. */
		if (t->cert_pem == NULL)
			snprintf(buf, len, "the listener requires a client "
			    "certificate: set tls_cert and tls_key");
		else
			snprintf(buf, len, "the listener refused our "
			    "certificate '%s' (tls_cert '%s'): it hung up on "
			    "it (is it signed by the listener's CA, and "
			    "valid?)", t->cert_subject, t->cert_path);
		return true;
	}
	if (mrv == MBEDTLS_ERR_SSL_TIMEOUT || mrv == MBEDTLS_ERR_SSL_CONN_EOF ||
	    mrv == MBEDTLS_ERR_NET_RECV_FAILED ||
	    mrv == MBEDTLS_ERR_NET_SEND_FAILED || mrv == 0)
		return false;
	snprintf(buf, len, "TLS handshake failed: %s",
	    tls_strerror(mrv, err, sizeof(err)));
	return true;
}

/* mbedTLS's side of a probe. */
typedef struct probe_tls {
	mbedtls_entropy_context entropy;
	mbedtls_ctr_drbg_context drbg;
	mbedtls_ssl_config conf;
	mbedtls_ssl_context ssl;
	mbedtls_x509_crt ca, own;
	mbedtls_pk_context key;
} probe_tls;

static void
probe_tls_free(probe_tls *x)
{
	mbedtls_ssl_free(&x->ssl);
	mbedtls_ssl_config_free(&x->conf);
	mbedtls_x509_crt_free(&x->ca);
	mbedtls_x509_crt_free(&x->own);
	mbedtls_pk_free(&x->key);
	mbedtls_ctr_drbg_free(&x->drbg);
	mbedtls_entropy_free(&x->entropy);
}

/* A client context over p's socket with t's credentials (none when t is
 * NULL), verifying the server's certificate optionally so that the
 * handshake goes on and the verdict can be read. False when mbedTLS
 * cannot set it up (then nothing is diagnosed). */
static bool
probe_tls_init(probe_tls *x, const cwi_nng_tls *t, probe *p)
{
	mbedtls_entropy_init(&x->entropy);
	mbedtls_ctr_drbg_init(&x->drbg);
	mbedtls_ssl_config_init(&x->conf);
	mbedtls_ssl_init(&x->ssl);
	mbedtls_x509_crt_init(&x->ca);
	mbedtls_x509_crt_init(&x->own);
	mbedtls_pk_init(&x->key);
	if (mbedtls_ctr_drbg_seed(&x->drbg, mbedtls_entropy_func, &x->entropy,
		(const unsigned char *)"cachew", 6) != 0 ||
	    mbedtls_ssl_config_defaults(&x->conf, MBEDTLS_SSL_IS_CLIENT,
		MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT) != 0)
		return false;
	mbedtls_ssl_conf_rng(&x->conf, mbedtls_ctr_drbg_random, &x->drbg);
	mbedtls_ssl_conf_authmode(&x->conf, t != NULL
		? MBEDTLS_SSL_VERIFY_OPTIONAL : MBEDTLS_SSL_VERIFY_NONE);
	mbedtls_ssl_conf_verify(&x->conf, probe_verify, p);
	if (t != NULL && t->ca_pem != NULL &&
	    mbedtls_x509_crt_parse(&x->ca, (const unsigned char *)t->ca_pem,
		strlen(t->ca_pem) + 1) == 0)
		mbedtls_ssl_conf_ca_chain(&x->conf, &x->ca, NULL);
	if (t != NULL && t->cert_pem != NULL &&
	    mbedtls_x509_crt_parse(&x->own, (const unsigned char *)t->cert_pem,
		strlen(t->cert_pem) + 1) == 0 &&
	    mbedtls_pk_parse_key(&x->key, (const unsigned char *)t->key_pem,
		strlen(t->key_pem) + 1, NULL, 0) == 0)
		(void)mbedtls_ssl_conf_own_cert(&x->conf, &x->own, &x->key);
	if (mbedtls_ssl_setup(&x->ssl, &x->conf) != 0 ||
	    (t != NULL &&
		mbedtls_ssl_set_hostname(&x->ssl, t->server_name) != 0))
		return false;
	mbedtls_ssl_set_bio(&x->ssl, p, probe_send, NULL, probe_recv);
	return true;
}

/* A tcp:// dialer's probe must not send a ClientHello to a plaintext
 * listener (it would log a TLS peer that was never there): an SP listener
 * speaks first, its handshake at once, and a TLS one never does. */
#define SPEAKS_FIRST_MS 200

static bool
peer_speaks_first(const probe *p)
{
	struct pollfd pf = {.fd = p->fd, .events = POLLIN};
	int left = probe_left_ms(p);

	return poll(&pf, 1, left < SPEAKS_FIRST_MS ? left : SPEAKS_FIRST_MS) > 0;
}

/* The probe proper: a handshake with mbedTLS on p's socket, and what it
 * tells. */
static bool
probe_run(const cwi_nng_tls *t, probe *p, const char *url, char *buf,
    size_t len)
{
	probe_tls x;
	bool found = false;
	uint32_t flags;
	int mrv;

	if (!probe_tls_init(&x, t, p) || (t == NULL && peer_speaks_first(p)))
		goto done;
	do
		mrv = mbedtls_ssl_handshake(&x.ssl);
	while (mrv == MBEDTLS_ERR_SSL_WANT_READ ||
	       mrv == MBEDTLS_ERR_SSL_WANT_WRITE);
	if (t == NULL) {
		/* A tcp:// dialer: does the peer answer a ClientHello? */
		found = mrv == 0 || x.ssl.state > MBEDTLS_SSL_SERVER_HELLO;
		if (found)
			snprintf(buf, len, "the listener speaks TLS: dial "
			    "tls+%s", url);
		goto done;
	}
	flags = mbedtls_ssl_get_verify_result(&x.ssl);
	if (p->leaf_seen && flags != 0 && flags != (uint32_t)-1) {
		leaf_reason(t, p, flags, buf, len);
		found = true;
	} else if (mrv != 0) {
		found = tls_failure_reason(t, p, &x.ssl, mrv, buf, len);
	}
	if (mrv == 0)
		(void)mbedtls_ssl_close_notify(&x.ssl);
done:
	probe_tls_free(&x);
	return found;
}

cachew_err
cwi_nng_tls_diagnose(const cwi_nng_tls *t, const char *url, char *buf,
    size_t len)
{
	const char *hp = strstr(url, "://");
	char *host;
	const char *port;
	probe p = {.fd = -1};
	bool found = false;

	if (hp == NULL || (host = url_host(url)) == NULL)
		return CACHEW_OK;
	port = strrchr(hp + 3, ':');
	p.deadline_ns = cwi_now_ns() + (uint64_t)DIAG_BUDGET_MS * 1000000u;
	if (port != NULL && probe_connect(&p, host, port + 1))
		found = probe_run(t, &p, url, buf, len);
	if (p.fd >= 0)
		close(p.fd);
	free(host);
	return found ? CACHEW_EAUTH : CACHEW_OK;
}
