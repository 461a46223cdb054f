/*
 * provision_k8s.c - the "kubernetes" provisioner: the worker count is the
 * replicas of a Deployment, set by a JSON merge PATCH of its scale
 * subresource:
 *
 *   PATCH {api}/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale
 *   Authorization: Bearer <service-account token>
 *   Content-Type: application/merge-patch+json
 *   {"spec":{"replicas":N}}
 *
 * One libcurl easy handle per provisioner, used only on its thread (so the
 * connection is reused). Failures are classified the way the API server
 * means them: 409 (a conflicting write), 429 (priority and fairness
 * throttling: honour Retry-After), 5xx and transport errors pass, so they
 * are retried with exponential backoff capped at retry_max_ms; 401/403 will
 * not pass by retrying the same token, so they wait until the token file
 * says something else (kubelet rotates projected tokens in place). The
 * token file is read again whenever its inode, size or times change, and
 * its content is compared every second while blocked.
 *
 * A reply is outside input: its body is kept up to K8S_MAX_BODY bytes and
 * parsed by jansson (io_json.h) for status.replicas (else spec.replicas)
 * and a Status's message; a 2xx reply whose replicas cannot be read is
 * logged naming the field, and the target counts as acknowledged.
 */
#include "provision.h"

#include "../core/core.h"
#include "../io/io_json.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define K8S_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define K8S_MAX_BODY (64u * 1024u)   /* reply bytes kept */
#define K8S_MAX_TOKEN (16u * 1024u)  /* service-account tokens are ~1 KiB */
#define K8S_BACKOFF_MIN_MS 100
#define K8S_TOKEN_POLL_MS 1000       /* while blocked on 401/403 */

typedef struct k8s_state {
	cwi_provisioner *p;
	CURL *curl;
	char *url;              /* the scale subresource's full URL */
	char *path;             /* its path, for messages */
	char *token_file;
	char *ca_file;          /* NULL: libcurl's default bundle */
	uint32_t retry_max_ms, timeout_ms;

	char *token;            /* NULL until read */
	struct stat token_st;   /* of the file token was read from */
	bool token_bad;         /* the file is unreadable or invalid */
	bool auth_blocked;      /* 401/403 with the current token */

	bool acked;             /* acked_target was acknowledged */
	uint32_t acked_target;
	uint32_t tried_target;  /* what attempts counts attempts of */
	uint32_t attempts;      /* consecutive retryable failures */
	uint64_t next_try_ns;

	char errbuf[CURL_ERROR_SIZE];
	char *body;             /* K8S_MAX_BODY + 1 bytes */
	size_t body_len;
	long retry_after_s;     /* -1: no Retry-After header */
} k8s_state;

/* ---- curl global init ----------------------------------------------------- */

static pthread_once_t k8s_once = PTHREAD_ONCE_INIT;
static CURLcode k8s_init_rv = CURLE_FAILED_INIT;

static void
k8s_global_init(void)
{
	k8s_init_rv = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- reading replies ------------------------------------------------------------ */

static bool
replicas_at(json_t *root, const char *path, uint32_t *out, bool *absent,
    char *why, size_t whylen)
{
	json_t *v = cwi_json_member(root, path, JSON_INTEGER, absent, why,
	    whylen);
	json_int_t n;

	if (v == NULL)
		return false;
	n = json_integer_value(v);
	if (n < 0 || n > (json_int_t)UINT32_MAX) {
		snprintf(why, whylen, "%s is %lld, outside [0, %u]", path,
		    (long long)n, UINT32_MAX);
		return false;
	}
	*out = (uint32_t)n;
	return true;
}

bool
cwi_k8s_scale_replicas(const char *body, size_t len, uint32_t *replicas,
    char *why, size_t whylen)
{
	json_t *root = cwi_json_parse(body, len, why, whylen);
	bool absent, ok;

	if (root == NULL)
		return false;
	ok = replicas_at(root, "status.replicas", replicas, &absent, why,
	    whylen);
	/* A Scale just written may have no status yet. */
	if (!ok && absent)
		ok = replicas_at(root, "spec.replicas", replicas, &absent, why,
		    whylen);
	if (!ok && absent)
		snprintf(why, whylen, "neither status.replicas nor "
		    "spec.replicas is present");
	json_decref(root);
	return ok;
}

bool
cwi_k8s_status_message(const char *body, size_t len, char *buf,
    size_t buflen)
{
	char why[160];
	json_t *root, *msg;
	const char *s;
	size_t n, keep;
	bool absent;

	if (buflen == 0)
		return false;
	root = cwi_json_parse(body, len, why, sizeof(why));
	msg = root != NULL ? cwi_json_member(root, "message", JSON_STRING,
				 &absent, why, sizeof(why))
			   : NULL;
	if (msg == NULL) {
		json_decref(root);
		return false;
	}
	s = json_string_value(msg);
	n = json_string_length(msg);
	/* jansson has checked the UTF-8: cut before a character's first
	 * byte only. */
	keep = n < buflen - 1 ? n : buflen - 1;
	while (keep > 0 && keep < n && ((unsigned char)s[keep] & 0xc0) == 0x80)
		keep--;
	for (size_t i = 0; i < keep; i++)
		buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? ' ' : s[i];
	buf[keep] = '\0';
	json_decref(root);
	return true;
}

/* ---- configuration ---------------------------------------------------------------- */

/* An option that is unset: NULL or "" (option tables keep strings in
 * fixed arrays, where "" means unset). */
static const char *
opt(const char *s)
{
	return s != NULL && s[0] != '\0' ? s : NULL;
}

/* A DNS-1123 name as namespaces and Deployments have: it also keeps the
 * URL path free of anything needing escapes. */
static bool
dns_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 253)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')
			|| s[i] == '-' || s[i] == '.'))
			return false;
	return s[0] != '-' && s[n - 1] != '-';
}

/* A small file's first line (the namespace file), or NULL. */
static char *
read_line(const char *path)
{
	char buf[256];
	FILE *f = fopen(path, "r");
	size_t n;

	if (f == NULL)
		return NULL;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	buf[strcspn(buf, " \t\r\n")] = '\0';
	return buf[0] != '\0' ? cwi_strdup(buf) : NULL;
}

/* The API server from KUBERNETES_SERVICE_HOST/PORT, as a pod sees it. */
static char *
in_cluster_url(void)
{
	const char *host = getenv("KUBERNETES_SERVICE_HOST");
	const char *port = getenv("KUBERNETES_SERVICE_PORT");

	if (host == NULL || host[0] == '\0')
		return NULL;
	if (port == NULL || port[0] == '\0')
		port = "443";
	return strchr(host, ':') != NULL
	    ? cwi_asprintf("https://[%s]:%s", host, port)
	    : cwi_asprintf("https://%s:%s", host, port);
}

static void
k8s_fini(void *state)
{
	k8s_state *s = state;

	if (s == NULL)
		return;
	if (s->curl != NULL)
		curl_easy_cleanup(s->curl);
	free(s->url);
	free(s->path);
	free(s->token_file);
	free(s->ca_file);
	free(s->token);
	free(s->body);
	free(s);
}

static cachew_err
k8s_locate(k8s_state *s, const cwi_prov_config *cfg)
{
	const char *api_opt = opt(cfg->api_url), *ns_opt = opt(cfg->k8s_namespace);
	char *api = api_opt != NULL ? cwi_strdup(api_opt) : in_cluster_url();
	char *ns = ns_opt != NULL ? cwi_strdup(ns_opt)
	    : read_line(K8S_SA_DIR "/namespace");
	const char *dep = opt(cfg->deployment) != NULL ? cfg->deployment
	    : "cachew-worker";
	cachew_err rv = CACHEW_OK;
	size_t alen;

	if (ns == NULL && ns_opt == NULL)
		ns = cwi_strdup("default");
	if (api == NULL || ns == NULL) {
		rv = api_opt == NULL && api == NULL
		    ? cwi_fail(CACHEW_EINVAL, "provisioner kubernetes: no API "
		      "server: set api_url, or run in a pod "
		      "(KUBERNETES_SERVICE_HOST is unset)")
		    : cwi_fail(CACHEW_ENOMEM, "provisioner kubernetes: out of "
		      "memory");
		goto done;
	}
	alen = strlen(api);
	while (alen > 0 && api[alen - 1] == '/')
		api[--alen] = '\0';
	if (strncmp(api, "https://", 8) != 0 && strncmp(api, "http://", 7) != 0) {
		rv = cwi_fail(CACHEW_EINVAL, "provisioner kubernetes: api_url "
		    "'%s' is not an https:// (or http://) URL", api);
		goto done;
	}
	if (!dns_name_ok(ns) || !dns_name_ok(dep)) {
		rv = cwi_fail(CACHEW_EINVAL, "provisioner kubernetes: '%s' is "
		    "not a valid %s name (lower-case letters, digits, '-', "
		    "'.')", dns_name_ok(ns) ? dep : ns,
		    dns_name_ok(ns) ? "deployment" : "namespace");
		goto done;
	}
	s->path = cwi_asprintf("/apis/apps/v1/namespaces/%s/deployments/%s/"
	    "scale", ns, dep);
	s->url = s->path != NULL ? cwi_asprintf("%s%s", api, s->path) : NULL;
	if (s->url == NULL)
		rv = cwi_fail(CACHEW_ENOMEM, "provisioner kubernetes: out of "
		    "memory");
done:
	free(api);
	free(ns);
	return rv;
}

static cachew_err
k8s_init(void **state, const cwi_prov_config *cfg, cwi_provisioner *p)
{
	k8s_state *s;
	cachew_err rv;

	*state = NULL;
	pthread_once(&k8s_once, k8s_global_init);
	if (k8s_init_rv != CURLE_OK)
		return cwi_fail(CACHEW_EIO, "provisioner kubernetes: libcurl "
		    "initialisation failed: %s", curl_easy_strerror(k8s_init_rv));
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "provisioner kubernetes: out of "
		    "memory");
	*state = s;
	s->p = p;
	s->retry_max_ms = cfg->retry_max_ms != 0 ? cfg->retry_max_ms : 30000;
	s->timeout_ms = cfg->request_timeout_ms != 0 ? cfg->request_timeout_ms
	    : 10000;
	rv = k8s_locate(s, cfg);
	if (rv != CACHEW_OK)
		return rv;
	s->token_file = cwi_strdup(opt(cfg->token_file) != NULL
	    ? cfg->token_file : K8S_SA_DIR "/token");
	if (opt(cfg->ca_file) != NULL)
		s->ca_file = cwi_strdup(cfg->ca_file);
	else if (access(K8S_SA_DIR "/ca.crt", R_OK) == 0)
		s->ca_file = cwi_strdup(K8S_SA_DIR "/ca.crt");
	s->body = malloc(K8S_MAX_BODY + 1);
	s->curl = curl_easy_init();
	if (s->token_file == NULL || (opt(cfg->ca_file) != NULL &&
		s->ca_file == NULL)
	    || s->body == NULL || s->curl == NULL)
		return cwi_fail(CACHEW_ENOMEM, "provisioner kubernetes: out of "
		    "memory");
	return CACHEW_OK;
}

/* ---- the token --------------------------------------------------------------- */

static bool
same_file_state(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
	    a->st_size == b->st_size &&
	    a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	    a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	    a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
	    a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Reads the token file into a new string (trailing white space dropped);
 * NULL with the reason in why. */
static char *
token_read(const char *path, struct stat *st, char *why, size_t len)
{
	FILE *f = fopen(path, "rb");
	char *tok;
	size_t n;

	if (f == NULL) {
		snprintf(why, len, "token file %s: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fileno(f), st) != 0 || st->st_size > (off_t)K8S_MAX_TOKEN) {
		snprintf(why, len, "token file %s: larger than %u bytes", path,
		    K8S_MAX_TOKEN);
		fclose(f);
		return NULL;
	}
	tok = malloc(K8S_MAX_TOKEN + 1);
	if (tok == NULL) {
		snprintf(why, len, "out of memory");
		fclose(f);
		return NULL;
	}
	n = fread(tok, 1, K8S_MAX_TOKEN, f);
	fclose(f);
	while (n > 0 && (tok[n - 1] == '\n' || tok[n - 1] == '\r' ||
			    tok[n - 1] == ' ' || tok[n - 1] == '\t'))
		n--;
	tok[n] = '\0';
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)tok[i] <= 0x20 || tok[i] == 0x7f) {
			snprintf(why, len, "token file %s: a control character or "
			    "space at byte %zu", path, i);
			free(tok);
			return NULL;
		}
	if (n == 0) {
		snprintf(why, len, "token file %s is empty", path);
		free(tok);
		return NULL;
	}
	return tok;
}

/* Brings s->token up to date with its file: read again when the file
 * changed (or always, when force). *changed says whether the content
 * differs from the token used so far. false when there is no usable
 * token (reported once per change). */
static bool
token_refresh(k8s_state *s, bool force, bool *changed)
{
	struct stat st;
	char why[400];
	char *tok;

	*changed = false;
	if (!force && s->token != NULL && stat(s->token_file, &st) == 0 &&
	    same_file_state(&st, &s->token_st))
		return true;
	tok = token_read(s->token_file, &st, why, sizeof(why));
	if (tok == NULL) {
		if (!s->token_bad)
			cwi_prov_note_failure(s->p, CWI_PROV_EARLIER,
			    "kubernetes: %s", why);
		s->token_bad = true;
		return false;
	}
	s->token_bad = false;
	s->token_st = st;
	if (s->token == NULL || strcmp(s->token, tok) != 0) {
		*changed = true;
		free(s->token);
		s->token = tok;
	} else {
		free(tok);
	}
	return true;
}

/* ---- one PATCH ---------------------------------------------------------------- */

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	k8s_state *s = arg;
	size_t n = size * nmemb, room = K8S_MAX_BODY - s->body_len;

	/* Beyond the limit the rest is dropped, not an error: a Scale or a
	 * Status is far smaller, and the status code decides anyway. */
	memcpy(s->body + s->body_len, data, n < room ? n : room);
	s->body_len += n < room ? n : room;
	return n;
}

static size_t
on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	k8s_state *s = arg;
	size_t n = size * nmemb;
	const char *name = "retry-after:";
	size_t nl = strlen(name);

	if (n > nl && strncasecmp(data, name, nl) == 0) {
		long v = 0;
		size_t i = nl;
		while (i < n && (data[i] == ' ' || data[i] == '\t'))
			i++;
		/* Delta-seconds only; an HTTP-date falls back to backoff. */
		while (i < n && data[i] >= '0' && data[i] <= '9' && v < 86400)
			v = v * 10 + (data[i++] - '0');
		if (i > nl && (i == n || data[i] == '\r' || data[i] == '\n'))
			s->retry_after_s = v;
	}
	return n;
}

static int
on_progress(void *arg, curl_off_t dlt, curl_off_t dln, curl_off_t ult,
    curl_off_t uln)
{
	k8s_state *s = arg;

	(void)dlt;
	(void)dln;
	(void)ult;
	(void)uln;
	return cwi_prov_closing(s->p) ? 1 : 0;
}

static const char *
reason_phrase(long code)
{
	switch (code) {
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 409: return "Conflict";
	case 415: return "Unsupported Media Type";
	case 422: return "Unprocessable Entity";
	case 429: return "Too Many Requests";
	case 500: return "Internal Server Error";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "HTTP error";
	}
}

/* Sends the PATCH; *code is the HTTP status (0 when none came back). */
static CURLcode
patch(k8s_state *s, uint32_t replicas, long *code)
{
	char body[64], auth[K8S_MAX_TOKEN + 32];
	struct curl_slist *hdrs = NULL, *h;
	CURL *e = s->curl;
	CURLcode rc;

	snprintf(body, sizeof(body), "{\"spec\":{\"replicas\":%u}}", replicas);
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", s->token);
	*code = 0;
	s->body_len = 0;
	s->retry_after_s = -1;
	s->errbuf[0] = '\0';
	hdrs = curl_slist_append(hdrs, auth);
	if (hdrs != NULL &&
	    (h = curl_slist_append(hdrs, "Content-Type: "
		"application/merge-patch+json")) != NULL &&
	    (h = curl_slist_append(h, "Accept: application/json")) != NULL)
		hdrs = h;
	else {
		curl_slist_free_all(hdrs);
		return CURLE_OUT_OF_MEMORY;
	}
	curl_easy_reset(e);
	curl_easy_setopt(e, CURLOPT_URL, s->url);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "https,http");
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "PATCH");
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
	if (s->ca_file != NULL)
		curl_easy_setopt(e, CURLOPT_CAINFO, s->ca_file);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)s->timeout_ms);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
	curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(e, CURLOPT_XFERINFODATA, s);
	rc = curl_easy_perform(e);
	if (rc == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, code);
	/* The token must not outlive the request in our memory more than
	 * needed: the handle keeps no copy of the header list. */
	curl_slist_free_all(hdrs);
	s->body[s->body_len] = '\0';
	return rc;
}

/* ---- the step ----------------------------------------------------------------- */

static uint64_t
retry_delay_ms(k8s_state *s, long code)
{
	uint64_t ms = K8S_BACKOFF_MIN_MS;

	/* Retry-After: 0 would make a hot loop of a throttled server: the
	 * backoff applies then. */
	if ((code == 429 || code == 503) && s->retry_after_s > 0)
		ms = (uint64_t)s->retry_after_s * 1000u;
	else
		for (uint32_t i = 1; i < s->attempts && ms < s->retry_max_ms; i++)
			ms *= 2;
	return ms < s->retry_max_ms ? ms : s->retry_max_ms;
}

/* The explanation the API server gave: a Status's message, else the
 * body's first line, printable characters only. */
static void
reply_message(const k8s_state *s, char *buf, size_t len)
{
	size_t n = 0;

	if (cwi_k8s_status_message(s->body, s->body_len, buf, len))
		return;
	for (size_t i = 0; i < s->body_len && n + 1 < len; i++) {
		unsigned char c = (unsigned char)s->body[i];
		if (c == '\n' || c == '\r')
			break;
		buf[n++] = c < 0x20 || c >= 0x7f ? '?' : (char)c;
	}
	buf[n] = '\0';
	if (n == 0)
		snprintf(buf, len, "(no message)");
}

static void
on_success(k8s_state *s, uint32_t target)
{
	uint32_t running = target;
	char why[200];

	if (!cwi_k8s_scale_replicas(s->body, s->body_len, &running, why,
		sizeof(why))) {
		running = target;
		cwi_log(CACHEW_LOG_WARN, "provision", "event=scale_reply_unread "
		    "kind=kubernetes path=%s reason=\"%s\"", s->path, why);
	}
	s->acked = true;
	s->acked_target = target;
	s->attempts = 0;
	cwi_prov_set_running(s->p, running, 0);
	cwi_prov_note_request(s->p, CWI_PROV_SCALE, true);
	cwi_log(CACHEW_LOG_INFO, "provision", "event=scaled kind=kubernetes "
	    "replicas=%u acknowledged=%u", target, running);
}

/* A failed PATCH: decides when to try again. */
static uint64_t
on_failure(k8s_state *s, CURLcode rc, long code, uint64_t now)
{
	char msg[300];
	uint64_t delay;

	if (rc == CURLE_OK && (code == 401 || code == 403)) {
		reply_message(s, msg, sizeof(msg));
		s->auth_blocked = true;
		cwi_prov_note_failure(s->p, CWI_PROV_SCALE, "kubernetes: %ld "
		    "%s from PATCH %s: %s (not retried until %s changes)", code,
		    reason_phrase(code), s->path, msg, s->token_file);
		return K8S_TOKEN_POLL_MS < s->retry_max_ms ? K8S_TOKEN_POLL_MS
		    : s->retry_max_ms;
	}
	s->attempts++;
	delay = retry_delay_ms(s, rc == CURLE_OK ? code : 0);
	s->next_try_ns = now + delay * 1000000u;
	if (rc != CURLE_OK) {
		bool tls = rc == CURLE_PEER_FAILED_VERIFICATION ||
		    rc == CURLE_SSL_CACERT_BADFILE ||
		    rc == CURLE_SSL_CONNECT_ERROR;
		cwi_prov_note_failure(s->p, CWI_PROV_SCALE, "kubernetes: "
		    "%sPATCH %s: %s (%s)%s%s; retry %u in %llu ms",
		    tls ? "TLS: " : "", s->url, curl_easy_strerror(rc),
		    s->errbuf[0] != '\0' ? s->errbuf : "no detail",
		    tls ? ", CA file " : "",
		    tls ? (s->ca_file != NULL ? s->ca_file : "(libcurl default)")
			: "",
		    s->attempts, (unsigned long long)delay);
	} else {
		reply_message(s, msg, sizeof(msg));
		cwi_prov_note_failure(s->p, CWI_PROV_SCALE, "kubernetes: %ld "
		    "%s from PATCH %s: %s; retry %u in %llu ms", code,
		    reason_phrase(code), s->path, msg, s->attempts, (unsigned long long)delay);
	}
	return delay;
}

static uint64_t
k8s_step(void *state, uint32_t target)
{
	k8s_state *s = state;
	uint64_t now = cwi_now_ns();
	uint64_t poll = K8S_TOKEN_POLL_MS < s->retry_max_ms ? K8S_TOKEN_POLL_MS
	    : s->retry_max_ms;
	bool changed;
	CURLcode rc;
	long code;

	if (s->acked && s->acked_target == target)
		return CWI_PROV_IDLE;
	if (target != s->tried_target) {
		/* The latest target goes out at once, whatever the backoff of
		 * the previous one. */
		s->tried_target = target;
		s->attempts = 0;
		s->next_try_ns = 0;
	}
	if (!token_refresh(s, s->auth_blocked || s->token_bad, &changed))
		return poll;
	if (s->auth_blocked) {
		if (!changed)
			return poll;
		s->auth_blocked = false;
		s->attempts = 0;
		s->next_try_ns = 0;
	}
	if (now < s->next_try_ns)
		return (s->next_try_ns - now + 999999u) / 1000000u;
	rc = patch(s, target, &code);
	if (rc == CURLE_ABORTED_BY_CALLBACK && cwi_prov_closing(s->p))
		return CWI_PROV_IDLE;
	if (rc == CURLE_OK && code >= 200 && code < 300) {
		on_success(s, target);
		return CWI_PROV_IDLE;
	}
	return on_failure(s, rc, code, cwi_now_ns());
}

const cwi_prov_kind cwi_prov_kubernetes = {
    .name = "kubernetes",
    .default_max = 1000,
    .actions = 1u << CWI_PROV_SCALE,
    .wait_first_target = true,
    .init = k8s_init,
    .step = k8s_step,
    .stop = NULL,
    .fini = k8s_fini,
};
