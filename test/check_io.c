/*
 * check_io.c - src/io: local reads, HTTP (whole objects, ranges, errors,
 * retries, resume after cut connections, changed objects, connection
 * reuse), HTTPS with a throwaway CA (CACHEW_CA_BUNDLE, untrusted
 * certificates, resume), S3 (SigV4 against AWS's documented example, ListObjectsV2
 * pages, s3rver end to end, missing credentials), GCS (bearer token and
 * JSON listing), and the file sources reading URLs.
 *
 * Servers run on 127.0.0.1 with ephemeral ports: test/servers/
 * http_server.py (faults on request, one log line per request) and, when
 * .ci/test-deps.sh installed it, s3rver. Each test starts its own server,
 * waits for its port file and stops it by pid.
 */
#include "cwt.h"

#include "../src/io/io.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------- */

typedef struct server {
	pid_t pid;
	int port;
	char *dir;  /* temp dir: www/, log, port */
	char *root; /* files served */
	char log[512];
	char base[64]; /* "http://127.0.0.1:PORT" */
} server;

static char *
fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, f);
	ck_assert_int_ge(vasprintf(&s, f, ap), 0);
	va_end(ap);
	return s;
}

/* Starts http_server.py over a fresh www/ (token: require a bearer; tls:
 * a directory holding srv.pem and srv.key to serve HTTPS with). */
static void
srv_start_with(server *s, const char *token, const char *tls)
{
	char portfile[512], cert[512], key[512];

	memset(s, 0, sizeof(*s));
	s->dir = cwt_tmpdir();
	s->root = fmt("%s/www", s->dir);
	ck_assert_int_eq(mkdir(s->root, 0755), 0);
	snprintf(s->log, sizeof(s->log), "%s/log", s->dir);
	snprintf(portfile, sizeof(portfile), "%s/port", s->dir);
	snprintf(cert, sizeof(cert), "%s/srv.pem", tls != NULL ? tls : "");
	snprintf(key, sizeof(key), "%s/srv.key", tls != NULL ? tls : "");
	char *argv[] = {"python3", "test/servers/http_server.py", "--root",
	    s->root, "--log", s->log, "--portfile", portfile, "--token",
	    (char *)(token != NULL ? token : ""), "--tls-cert",
	    tls != NULL ? cert : "", "--tls-key", tls != NULL ? key : "", NULL};
	s->pid = cwt_spawn(argv, NULL);
	s->port = cwt_await_port(portfile, s->pid);
	ck_assert_msg(s->port > 0, "test/servers/http_server.py did not start");
	snprintf(s->base, sizeof(s->base), "%s://127.0.0.1:%d",
	    tls != NULL ? "https" : "http", s->port);
}

static void
srv_start(server *s, const char *token)
{
	srv_start_with(s, token, NULL);
}

static void
srv_stop(server *s)
{
	cwt_stop_pid(s->pid);
	cwt_rmtree(s->dir);
	free(s->dir);
	free(s->root);
}

/* Writes `len` deterministic pseudo-random bytes to root/name; returns
 * them (free). */
static uint8_t *
put_random(const server *s, const char *name, size_t len, uint64_t seed)
{
	uint8_t *d = malloc(len + 1);
	char *p = fmt("%s/%s", s->root, name);
	char *slash = strrchr(p, '/');

	*slash = '\0';
	char *cmd = fmt("mkdir -p '%s'", p);
	ck_assert_int_eq(system(cmd), 0);
	free(cmd);
	*slash = '/';
	for (size_t i = 0; i < len; i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		d[i] = (uint8_t)(seed >> 56);
	}
	cwt_write_file(p, d, len);
	free(p);
	return d;
}

static void
put_text(const server *s, const char *name, const char *text)
{
	char *p = fmt("%s/%s", s->root, name);
	char *slash = strrchr(p, '/');
	*slash = '\0';
	char *cmd = fmt("mkdir -p '%s'", p);
	ck_assert_int_eq(system(cmd), 0);
	free(cmd);
	*slash = '/';
	cwt_write_file(p, text, strlen(text));
	free(p);
}

/* The server's log (free), and the count of lines containing `needle`. */
static char *
read_log(const server *s)
{
	FILE *f = fopen(s->log, "r");
	char *buf = calloc(1, 1 << 20);
	size_t n;

	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, (1 << 20) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static int
log_count(const server *s, const char *needle)
{
	char *log = read_log(s);
	int n = 0;

	for (char *p = log; (p = strstr(p, needle)) != NULL; p++)
		n++;
	free(log);
	return n;
}

static cwi_io_opts
fast_opts(int retries)
{
	cwi_io_opts o;
	cwi_io_opts_default(&o);
	o.max_retries = retries;
	o.backoff_ms = 1;
	return o;
}

/* Reads all of url with reads of `chunk` bytes. */
static cachew_err
slurp(const char *url, uint64_t off, uint64_t len, const cwi_io_opts *o,
    size_t chunk, uint8_t **out, size_t *outlen)
{
	cwi_file *f;
	cwi_strbuf sb;
	uint8_t *buf = malloc(chunk);
	cachew_err rv;

	*out = NULL;
	*outlen = 0;
	rv = cwi_file_open_range(&f, url, off, len, o);
	if (rv != CACHEW_OK) {
		free(buf);
		return rv;
	}
	cwi_strbuf_init(&sb);
	for (;;) {
		size_t got;
		rv = cwi_file_read(f, buf, chunk, &got);
		if (rv != CACHEW_OK || got == 0)
			break;
		cwi_strbuf_append(&sb, buf, got);
	}
	cwi_file_close(f);
	free(buf);
	if (rv != CACHEW_OK) {
		cwi_strbuf_free(&sb);
		return rv;
	}
	*outlen = sb.len;
	*out = (uint8_t *)sb.data;
	return CACHEW_OK;
}

static void
assert_bytes(const uint8_t *got, size_t glen, const uint8_t *want, size_t wlen)
{
	ck_assert_uint_eq(glen, wlen);
	if (wlen > 0)
		ck_assert_msg(memcmp(got, want, wlen) == 0, "bytes differ");
}

/* Lines of component 0, joined with '|'. */
static char *
run_lines(const char *pipeline)
{
	cachew_element **v = NULL;
	size_t n = 0;
	char err[512] = "";
	cwi_strbuf sb;
	char *out;

	cachew_err rv = cwt_run(pipeline, NULL, &v, &n, err, sizeof(err));
	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, err);
	cwi_strbuf_init(&sb);
	for (size_t i = 0; i < n; i++) {
		const void *d;
		size_t len;
		ck_assert_int_eq(cachew_tensor_bytes_at(
				     cachew_element_component(v[i], 0), 0, &d, &len),
		    CACHEW_OK);
		if (i > 0)
			cwi_strbuf_puts(&sb, "|");
		cwi_strbuf_append(&sb, d, len);
	}
	cwt_free(v, n);
	ck_assert_int_eq(cwi_strbuf_finish(&sb, &out, NULL), CACHEW_OK);
	return out;
}

/* Sets env vars for one test and clears them at the end (the valgrind run
 * has no fork between tests). */
static const char *const io_env[] = {"AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
    "CACHEW_S3_ADDRESSING", "GOOGLE_OAUTH_ACCESS_TOKEN",
    "CACHEW_GCS_ENDPOINT", "CACHEW_IO_BACKOFF_MS", "CACHEW_IO_RETRIES",
    "CACHEW_CA_BUNDLE", "CURL_CA_BUNDLE"};

static void
env_clear(void)
{
	for (size_t i = 0; i < sizeof(io_env) / sizeof(io_env[0]); i++)
		unsetenv(io_env[i]);
}

/* ---- local ----------------------------------------------------------------- */

START_TEST(test_local_whole_and_range_reads)
{
	char *d = cwt_tmpdir();
	char *p = fmt("%s/f.txt", d), *u = fmt("file://%s", p);
	const char *text = "0123456789abcdefghij";
	uint8_t *got;
	size_t len;
	cwi_file *f;

	cwt_write_file(p, text, 20);
	ck_assert_int_eq(slurp(p, 0, UINT64_MAX, NULL, 7, &got, &len), CACHEW_OK);
	assert_bytes(got, len, (const uint8_t *)text, 20);
	free(got);
	ck_assert_int_eq(slurp(u, 5, 10, NULL, 3, &got, &len), CACHEW_OK);
	assert_bytes(got, len, (const uint8_t *)text + 5, 10);
	free(got);
	ck_assert_int_eq(cwi_file_open(&f, p, NULL), CACHEW_OK);
	ck_assert_int_eq(cwi_file_size(f), 20);
	cwi_file_close(f);
	free(p);
	p = fmt("%s/nope", d);
	ck_assert_int_eq(cwi_file_open(&f, p, NULL), CACHEW_ENOENT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), p));
	free(p);
	free(u);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_unknown_scheme_is_enotsup)
{
	cwi_file *f;
	ck_assert_int_eq(cwi_file_open(&f, "ftp://h/x", NULL), CACHEW_ENOTSUP);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "ftp://h/x"));
}
END_TEST

/* ---- HTTP ------------------------------------------------------------------- */

#define BIG (3u << 20)

START_TEST(test_http_whole_object_identical)
{
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(2);
	cwi_file *f;

	srv_start(&s, NULL);
	want = put_random(&s, "big.bin", BIG, 1);
	char *u = fmt("%s/big.bin", s.base);
	ck_assert_int_eq(cwi_file_open(&f, u, &o), CACHEW_OK);
	ck_assert_int_eq(cwi_file_size(f), BIG);
	cwi_file_close(f);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 65536, &got, &len), CACHEW_OK);
	assert_bytes(got, len, want, BIG);
	free(got);
	/* Tiny reads go through the spill buffer. */
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 777, &got, &len), CACHEW_OK);
	assert_bytes(got, len, want, BIG);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_range_sends_range_header)
{
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(2);

	srv_start(&s, NULL);
	want = put_random(&s, "r.bin", 100000, 2);
	char *u = fmt("%s/r.bin", s.base);
	ck_assert_int_eq(slurp(u, 1000, 5000, &o, 4096, &got, &len), CACHEW_OK);
	assert_bytes(got, len, want + 1000, 5000);
	free(got);
	ck_assert_int_eq(log_count(&s, "range=bytes=1000-5999 "), 1);
	/* To the end, and past the end (empty). */
	ck_assert_int_eq(slurp(u, 99990, UINT64_MAX, &o, 4096, &got, &len),
	    CACHEW_OK);
	assert_bytes(got, len, want + 99990, 10);
	free(got);
	ck_assert_int_eq(slurp(u, 200000, 10, &o, 4096, &got, &len), CACHEW_OK);
	ck_assert_uint_eq(len, 0);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_404_is_enoent_naming_url)
{
	server s;
	cwi_io_opts o = fast_opts(2);
	cwi_file *f = NULL;

	srv_start(&s, NULL);
	char *u = fmt("%s/missing.txt", s.base);
	ck_assert_int_eq(cwi_file_open(&f, u, &o), CACHEW_ENOENT);
	ck_assert_ptr_null(f);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), u));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "HTTP 404"));
	/* 404 is final: one request, no retries. */
	ck_assert_int_eq(log_count(&s, "GET /missing.txt"), 1);
	free(u);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_500_then_success_is_retried)
{
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(3);

	srv_start(&s, NULL);
	want = put_random(&s, "f.bin", 50000, 3);
	char *u = fmt("%s/@status=500,times=2/f.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 8192, &got, &len), CACHEW_OK);
	assert_bytes(got, len, want, 50000);
	ck_assert_int_eq(log_count(&s, "GET /@status=500"), 3);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

static const size_t cut_points[] = {0, 1, 1023, 65536, BIG - 1};

START_TEST(test_http_resumes_after_cut_with_identical_bytes)
{
	server s;
	uint8_t *want, *got;
	size_t len, cut = cut_points[_i];
	cwi_io_opts o = fast_opts(3);
	char needle[64];

	srv_start(&s, NULL);
	want = put_random(&s, "c.bin", BIG, 4);
	char *u = fmt("%s/@cut=%zu/c.bin", s.base, cut);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 1 << 20, &got, &len),
	    CACHEW_OK);
	assert_bytes(got, len, want, BIG);
	/* Two requests: the cut one and a resume from the byte after. */
	ck_assert_int_eq(log_count(&s, "GET /@cut="), 2);
	snprintf(needle, sizeof(needle), "range=bytes=%zu- ", cut);
	if (cut > 0)
		ck_assert_int_eq(log_count(&s, needle), 1);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_resume_inside_a_range)
{
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(3);

	srv_start(&s, NULL);
	want = put_random(&s, "c.bin", 200000, 5);
	char *u = fmt("%s/@cut=1000/c.bin", s.base);
	ck_assert_int_eq(slurp(u, 5000, 100000, &o, 4096, &got, &len), CACHEW_OK);
	assert_bytes(got, len, want + 5000, 100000);
	ck_assert_int_eq(log_count(&s, "range=bytes=6000-104999 "), 1);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_server_ignoring_range_resumes_by_skipping)
{
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(3);

	srv_start(&s, NULL);
	want = put_random(&s, "n.bin", 300000, 6);
	char *u = fmt("%s/@cut=70000,norange=1/n.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 65536, &got, &len),
	    CACHEW_OK);
	assert_bytes(got, len, want, 300000);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_persistent_cuts_fail_after_retry_budget)
{
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(3);

	srv_start(&s, NULL);
	want = put_random(&s, "p.bin", 10000, 7);
	char *u = fmt("%s/@cut=0,times=999/p.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 4096, &got, &len),
	    CACHEW_EIO);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), u));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "gave up after 4 attempts"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "curl error 18"));
	ck_assert_int_eq(log_count(&s, "GET /@cut=0"), 4);
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_changed_object_fails_on_resume)
{
	server s;
	uint8_t *want, *got = NULL;
	size_t len;
	cwi_io_opts o = fast_opts(3);

	srv_start(&s, NULL);
	want = put_random(&s, "v.bin", 100000, 8);
	/* The server checks If-Match (412) ... */
	char *u = fmt("%s/@cut=1000,change=1/v.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 4096, &got, &len),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "changed while it was read"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "412"));
	ck_assert_int_eq(log_count(&s, "if-match=\""), 1);
	free(u);
	/* ... or ignores it, and the client compares ETags itself. */
	u = fmt("%s/@cut=1000,change=1,noifmatch=1/v.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 4096, &got, &len),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "ETag"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), u));
	free(u);
	/* ... or shrank below where the resume starts: its 416 is not the
	 * end of the object (it read as a clean end: 1,000 of 100,000
	 * bytes and no error). */
	u = fmt("%s/@cut=1000,shrink=500,noifmatch=1/v.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 4096, &got, &len),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "HTTP 416 on resuming at byte "
			  "1000 of 100000") != NULL, "%s", cachew_errmsg());
	free(u);
	free(want);
	srv_stop(&s);
}
END_TEST

START_TEST(test_http_sequential_files_reuse_one_connection)
{
	server s;
	cwi_io_opts o = fast_opts(2);
	uint8_t *got;
	size_t len;

	srv_start(&s, NULL);
	for (int i = 0; i < 3; i++) {
		char name[32];
		snprintf(name, sizeof(name), "s%d.bin", i);
		free(put_random(&s, name, 20000, (uint64_t)i));
	}
	for (int i = 0; i < 3; i++) {
		char *u = fmt("%s/s%d.bin", s.base, i);
		ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 65536, &got, &len),
		    CACHEW_OK);
		ck_assert_uint_eq(len, 20000);
		free(got);
		free(u);
	}
	/* Every GET on the connection of the first (the readiness probe
	 * was a connection of its own). */
	char *log = read_log(&s), needle[32];
	int conn = 0;
	ck_assert_int_eq(sscanf(log, "conn=%d GET", &conn), 1);
	free(log);
	snprintf(needle, sizeof(needle), "conn=%d GET", conn);
	ck_assert_int_eq(log_count(&s, needle), 3);
	ck_assert_int_eq(log_count(&s, " GET "), 3);
	srv_stop(&s);
}
END_TEST

/* ---- sources reading URLs ---------------------------------------------------- */

START_TEST(test_text_lines_reads_http_urls)
{
	server s;

	srv_start(&s, NULL);
	put_text(&s, "a.txt", "alpha\nbeta\r\ngamma");
	put_text(&s, "b.txt", "delta\n");
	char *p = fmt("text_lines([\"%s/a.txt\", \"%s/b.txt\"], buffer_size=3)",
	    s.base, s.base);
	char *lines = run_lines(p);
	ck_assert_str_eq(lines, "alpha|beta|gamma|delta");
	free(lines);
	free(p);
	srv_stop(&s);
}
END_TEST

START_TEST(test_text_lines_http_404_fails_naming_url)
{
	server s;
	char err[512] = "";
	cachew_element **v = NULL;
	size_t n = 0;

	srv_start(&s, NULL);
	char *p = fmt("text_lines(\"%s/nope.txt\")", s.base);
	ck_assert_int_eq(cwt_run(p, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_ENOENT);
	ck_assert_msg(strstr(err, "/nope.txt: HTTP 404") != NULL, "%s", err);
	cwt_free(v, n);
	free(p);
	srv_stop(&s);
}
END_TEST

START_TEST(test_fixed_length_records_over_http_with_header)
{
	server s;

	srv_start(&s, NULL);
	put_text(&s, "r.bin", "HHaaaabbbbccccFFF");
	char *p = fmt("fixed_length_records(\"%s/r.bin\", record_bytes=4, "
		      "header_bytes=2, footer_bytes=3)",
	    s.base);
	char *lines = run_lines(p);
	ck_assert_str_eq(lines, "aaaa|bbbb|cccc");
	ck_assert_int_eq(log_count(&s, "range=bytes=2-13 "), 1);
	free(lines);
	free(p);
	srv_stop(&s);
}
END_TEST

START_TEST(test_read_file_reads_http_url_through_a_cut)
{
	server s;
	uint8_t *want;
	cachew_element **v = NULL;
	size_t n = 0;
	char err[512] = "";
	const void *d;
	size_t len;

	setenv("CACHEW_IO_BACKOFF_MS", "1", 1);
	srv_start(&s, NULL);
	want = put_random(&s, "w.bin", 500000, 9);
	char *p = fmt("from_list([\"%s/@cut=65536/w.bin\"]) | read_file", s.base);
	ck_assert_int_eq(cwt_run(p, NULL, &v, &n, err, sizeof(err)), CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(cachew_tensor_bytes_at(
			     cachew_element_component(v[0], 0), 0, &d, &len),
	    CACHEW_OK);
	assert_bytes(d, len, want, 500000);
	cwt_free(v, n);
	free(p);
	free(want);
	srv_stop(&s);
	env_clear();
}
END_TEST

START_TEST(test_tfrecord_reads_http_url_through_a_cut)
{
	server s;
	char err[512] = "";
	cachew_element **v = NULL;
	size_t n = 0;

	/* Write a TFRecord file into the server's root with cachew itself,
	 * then read it back over HTTP with the connection cut mid-record. */
	setenv("CACHEW_IO_BACKOFF_MS", "1", 1);
	srv_start(&s, NULL);
	char *w = fmt("from_list([\"alpha\", \"beta\", \"gamma\", \"delta\"]) | "
		      "tfrecord_write(\"%s/t.tfrecord\")", s.root);
	ck_assert_int_eq(cwt_run(w, NULL, &v, &n, err, sizeof(err)), CACHEW_OK);
	cwt_free(v, n);
	char *p = fmt("tfrecord(\"%s/@cut=30/t.tfrecord\")", s.base);
	char *lines = run_lines(p);
	ck_assert_str_eq(lines, "alpha|beta|gamma|delta");
	ck_assert_int_eq(log_count(&s, "range=bytes=30- "), 1);
	free(lines);
	free(p);
	free(w);
	srv_stop(&s);
	env_clear();
}
END_TEST

/* ---- HTTPS --------------------------------------------------------------------- */

/* Writes a throwaway CA (ca.pem) and a server certificate for 127.0.0.1
 * (an IP subjectAltName) signed by it (srv.pem, srv.key) into a new temp
 * dir, with the openssl CLI. NULL (after saying why) when there is no
 * openssl: the HTTPS tests then skip. */
static char *
tls_certs(const char *test)
{
	static const char cnf[] =
	    "[req]\ndistinguished_name = dn\nprompt = no\n"
	    "[dn]\nCN = cachew test\n"
	    "[ca_ext]\nbasicConstraints = critical,CA:TRUE\n"
	    "keyUsage = critical,keyCertSign,cRLSign\n"
	    "subjectKeyIdentifier = hash\n"
	    "[srv_ext]\nbasicConstraints = CA:FALSE\n"
	    "keyUsage = critical,digitalSignature,keyEncipherment\n"
	    "extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1\n"
	    "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n";
	const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
			 "-nodes";
	char *dir, *p, *cmd;

	if (system("command -v openssl >/dev/null 2>&1") != 0) {
		printf("io: skipping %s: no openssl command to make a test "
		       "CA with\n",
		    test);
		return NULL;
	}
	dir = cwt_tmpdir();
	p = fmt("%s/openssl.cnf", dir);
	cwt_write_file(p, cnf, strlen(cnf));
	free(p);
	cmd = fmt("cd '%s' && { "
		  "openssl req -x509 -config openssl.cnf -extensions ca_ext "
		  "%s -keyout ca.key -out ca.pem -days 2 "
		  "-subj '/CN=cachew test CA' && "
		  "openssl req -new -config openssl.cnf %s -keyout srv.key "
		  "-out srv.csr -subj /CN=127.0.0.1 && "
		  "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key "
		  "-set_serial 2 -days 2 -extfile openssl.cnf "
		  "-extensions srv_ext -out srv.pem; } >openssl.log 2>&1",
	    dir, ec, ec);
	ck_assert_msg(system(cmd) == 0, "openssl failed: see %s/openssl.log",
	    dir);
	free(cmd);
	return dir;
}

/* Sets CACHEW_CA_BUNDLE (or `var`) to certs/ca.pem. */
static void
trust_ca(const char *var, const char *certs)
{
	char *ca = fmt("%s/ca.pem", certs);
	setenv(var, ca, 1);
	free(ca);
}

START_TEST(test_https_with_ca_bundle_reads_exact_lines)
{
	char *certs = tls_certs("HTTPS tests");
	server s;

	if (certs == NULL)
		return;
	env_clear();
	srv_start_with(&s, NULL, certs);
	put_text(&s, "x.txt", "alpha\nbeta\r\ngamma\n");
	char *p = fmt("text_lines(\"%s/x.txt\")", s.base);
	ck_assert_ptr_nonnull(strstr(p, "\"https://127.0.0.1:"));
	trust_ca("CACHEW_CA_BUNDLE", certs);
	char *lines = run_lines(p);
	ck_assert_str_eq(lines, "alpha|beta|gamma");
	free(lines);
	/* The conventional CURL_CA_BUNDLE when CACHEW_CA_BUNDLE is unset. */
	unsetenv("CACHEW_CA_BUNDLE");
	trust_ca("CURL_CA_BUNDLE", certs);
	lines = run_lines(p);
	ck_assert_str_eq(lines, "alpha|beta|gamma");
	free(lines);
	ck_assert_int_eq(log_count(&s, " GET /x.txt "), 2);
	free(p);
	srv_stop(&s);
	env_clear();
	cwt_rmtree(certs);
	free(certs);
}
END_TEST

START_TEST(test_https_untrusted_certificate_fails_naming_url)
{
	char *certs = tls_certs("HTTPS tests");
	server s;
	char err[512] = "";
	cachew_element **v = NULL;
	size_t n = 0;
	cwi_io_opts o = fast_opts(2);
	cwi_file *f = NULL;

	if (certs == NULL)
		return;
	env_clear();
	setenv("CACHEW_IO_RETRIES", "2", 1);
	setenv("CACHEW_IO_BACKOFF_MS", "1", 1);
	srv_start_with(&s, NULL, certs);
	put_text(&s, "x.txt", "alpha\n");
	char *u = fmt("%s/x.txt", s.base);
	char *p = fmt("text_lines(\"%s\")", u);
	ck_assert_int_eq(cwt_run(p, NULL, &v, &n, err, sizeof(err)), CACHEW_EIO);
	ck_assert_msg(strstr(err, u) != NULL, "%s", err);
	ck_assert_msg(strstr(err, "certificate") != NULL, "%s", err);
	ck_assert_msg(strstr(err, "set CACHEW_CA_BUNDLE") != NULL, "%s", err);
	cwt_free(v, n);
	/* Final at once, before any request reached the server. */
	ck_assert_int_eq(cwi_file_open(&f, u, &o), CACHEW_EIO);
	ck_assert_ptr_null(f);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), u));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "curl error 60"));
	ck_assert_int_eq(log_count(&s, " GET "), 0);
	/* A bundle that cannot be read is named with its variable. */
	setenv("CACHEW_CA_BUNDLE", "/nonexistent/ca.pem", 1);
	ck_assert_int_eq(cwi_file_open(&f, u, &o), CACHEW_EIO);
	ck_assert_ptr_null(f);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), u));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "/nonexistent/ca.pem from CACHEW_CA_BUNDLE"));
	free(p);
	free(u);
	srv_stop(&s);
	env_clear();
	cwt_rmtree(certs);
	free(certs);
}
END_TEST

START_TEST(test_https_resumes_after_cut_with_identical_bytes)
{
	char *certs = tls_certs("HTTPS tests");
	server s;
	uint8_t *want, *got;
	size_t len;
	cwi_io_opts o = fast_opts(3);

	if (certs == NULL)
		return;
	env_clear();
	srv_start_with(&s, NULL, certs);
	trust_ca("CACHEW_CA_BUNDLE", certs);
	want = put_random(&s, "c.bin", 300000, 10);
	char *u = fmt("%s/@cut=65536/c.bin", s.base);
	ck_assert_int_eq(slurp(u, 0, UINT64_MAX, &o, 40000, &got, &len),
	    CACHEW_OK);
	assert_bytes(got, len, want, 300000);
	ck_assert_int_eq(log_count(&s, "GET /@cut="), 2);
	ck_assert_int_eq(log_count(&s, "range=bytes=65536- "), 1);
	free(got);
	free(u);
	free(want);
	srv_stop(&s);
	env_clear();
	cwt_rmtree(certs);
	free(certs);
}
END_TEST

/* ---- S3 ------------------------------------------------------------------------ */

/* AWS's documented S3 SigV4 example ("GET Object", Signature Version 4
 * examples of the S3 API reference): bytes 0-9 of examplebucket/test.txt
 * at 20130524T000000Z must carry this exact signature. */
START_TEST(test_s3_signature_matches_aws_example)
{
	server s;
	cwi_io_opts o = fast_opts(0);
	char connect_to[128];
	uint8_t *got;
	size_t len;

	srv_start(&s, NULL);
	put_text(&s, "test.txt", "0123456789abcdef");
	setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE", 1);
	setenv("AWS_SECRET_ACCESS_KEY",
	    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", 1);
	setenv("AWS_REGION", "us-east-1", 1);
	setenv("AWS_ENDPOINT_URL", "http://s3.amazonaws.com", 1);
	setenv("CACHEW_S3_ADDRESSING", "virtual", 1);
	snprintf(connect_to, sizeof(connect_to),
	    "examplebucket.s3.amazonaws.com:80:127.0.0.1:%d", s.port);
	o.amz_date = "20130524T000000Z";
	o.connect_to = connect_to;
	ck_assert_int_eq(slurp("s3://examplebucket/test.txt", 0, 10, &o, 64,
			     &got, &len),
	    CACHEW_OK);
	assert_bytes(got, len, (const uint8_t *)"0123456789", 10);
	free(got);
	ck_assert_int_eq(log_count(&s,
			     "auth=AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/"
			     "20130524/us-east-1/s3/aws4_request, SignedHeaders="
			     "host;range;x-amz-content-sha256;x-amz-date, "
			     "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170"
			     "aba48dd91039c6036bdb41 "),
	    1);
	srv_stop(&s);
	env_clear();
}
END_TEST

START_TEST(test_s3_missing_credentials_is_einval)
{
	cwi_file *f = NULL;

	env_clear();
	ck_assert_int_eq(cwi_file_open(&f, "s3://b/k.txt", NULL), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "s3://b/k.txt"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "AWS_ACCESS_KEY_ID"));
}
END_TEST

START_TEST(test_s3_list_follows_continuation_tokens)
{
	server s;
	cwi_io_opts o = fast_opts(1);
	cwi_io_entry *v;
	size_t n;

	srv_start(&s, NULL);
	/* 8 keys under the prefix d/p, 6 of them matching. */
	const char *names[] = {"bkt/d/p1.txt", "bkt/d/p2.txt", "bkt/d/p3.txt",
	    "bkt/d/p4.txt", "bkt/d/p5.txt", "bkt/d/q.txt", "bkt/d/sub/p6.txt",
	    "bkt/d/p&7.txt", "bkt/d/px.csv", "bkt/d/p9/x.txt"};
	for (size_t i = 0; i < 10; i++)
		put_text(&s, names[i], "x");
	setenv("AWS_ACCESS_KEY_ID", "id", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
	setenv("AWS_SESSION_TOKEN", "tok", 1);
	setenv("AWS_ENDPOINT_URL", s.base, 1);
	o.s3_max_keys = 2;
	ck_assert_int_eq(cwi_io_list("s3://bkt/d/p*.txt", &o, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 6);
	ck_assert_str_eq(v[0].url, "s3://bkt/d/p&7.txt");
	ck_assert_str_eq(v[1].url, "s3://bkt/d/p1.txt");
	ck_assert_str_eq(v[5].url, "s3://bkt/d/p5.txt");
	ck_assert_int_eq(v[1].size, 1);
	ck_assert_str_eq(v[1].etag, "\"9dd4e461268c8034f5c8564e155c67a6\"");
	cwi_io_entries_free(v, n);
	/* 8 keys under d/p at 2 a page: 4 requests, 3 with a token. */
	ck_assert_int_eq(log_count(&s, "list-type=2"), 4);
	ck_assert_int_eq(log_count(&s, "continuation-token="), 3);
	ck_assert_int_eq(log_count(&s, "/s3/aws4_request"), 4);
	/* A "bucket" naming a host and port (the request, signed with the
	 * process's credentials, went there): not a bucket name. */
	ck_assert_int_eq(cwi_io_list("s3://10.0.0.5:8443#/d/p*.txt", &o, &v,
			     &n), CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "'10.0.0.5:8443#' is not a "
			  "bucket name") != NULL, "%s", cachew_errmsg());
	/* A store that gives the same token again would be asked for the
	 * same page forever (memory growing): refused at the repeat. */
	{
		char *ep = fmt("%s/@sametoken=1", s.base);
		setenv("AWS_ENDPOINT_URL", ep, 1);
		ck_assert_int_eq(cwi_io_list("s3://bkt/d/p*.txt", &o, &v, &n),
		    CACHEW_EPROTO);
		ck_assert_msg(strstr(cachew_errmsg(), "s3://bkt/d/p: the "
				  "listing gave the same continuation token "
				  "twice ('0')") != NULL, "%s", cachew_errmsg());
		free(ep);
	}
	srv_stop(&s);
	env_clear();
}
END_TEST

static void
fp_hex_of(const cachew_dataset *ds, char out[33])
{
	cachew_fingerprint fp;

	ck_assert_int_eq(cachew_dataset_fingerprint(ds, &fp), CACHEW_OK);
	cachew_fingerprint_hex(&fp, out);
}

START_TEST(test_s3_glob_is_listed_for_the_fingerprint_on_first_use_not_when_built)
{
	const char *text = "list_files(\"s3://bkt/d/*.txt\") | batch(2)";
	cachew_dataset *ds = NULL, *changed = NULL;
	char a[33], again[33], b[33];
	void *buf = NULL;
	size_t len = 0;
	server s;

	srv_start(&s, NULL);
	put_text(&s, "bkt/d/a.txt", "x");
	put_text(&s, "bkt/d/b.txt", "yy");
	setenv("AWS_ACCESS_KEY_ID", "id", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
	setenv("AWS_ENDPOINT_URL", s.base, 1);
	/* Building and serialising do no network I/O. */
	ck_assert_int_eq(cachew_dataset_parse(&ds, text), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	cachew_free(buf);
	ck_assert_int_eq(log_count(&s, "list-type=2"), 0);
	/* The fingerprint lists the bucket once, and keeps what it saw. */
	fp_hex_of(ds, a);
	ck_assert_int_eq(log_count(&s, "list-type=2"), 1);
	put_text(&s, "bkt/d/b.txt", "yyy");
	fp_hex_of(ds, again);
	ck_assert_str_eq(again, a);
	ck_assert_int_eq(log_count(&s, "list-type=2"), 1);
	/* A pipeline built after the object changed sees its new size and
	 * ETag. */
	ck_assert_int_eq(cachew_dataset_parse(&changed, text), CACHEW_OK);
	ck_assert_int_eq(log_count(&s, "list-type=2"), 1);
	fp_hex_of(changed, b);
	ck_assert_int_eq(log_count(&s, "list-type=2"), 2);
	ck_assert_str_ne(a, b);
	cachew_dataset_release(changed);
	cachew_dataset_release(ds);
	srv_stop(&s);
	env_clear();
}
END_TEST

static const char *
s3rver_bin(void)
{
	static char path[512];
	const char *dir = getenv("CACHEW_NPM_DIR");
	snprintf(path, sizeof(path), "%s/node_modules/s3rver",
	    dir != NULL ? dir : "build/npm");
	return access(path, R_OK) == 0 ? path : NULL;
}

START_TEST(test_s3rver_text_lines_and_list_files_end_to_end)
{
	char *dir, *seed, *store, *portfile, *node_path, *p, *lines;
	const char *mod = s3rver_bin();
	pid_t pid;
	int port;

	if (mod == NULL) {
		printf("io: skipping s3rver end-to-end test: s3rver is not "
		       "installed (run sh .ci/test-deps.sh)\n");
		return;
	}
	dir = cwt_tmpdir();
	seed = fmt("%s/seed", dir);
	store = fmt("%s/store", dir);
	portfile = fmt("%s/port", dir);
	node_path = fmt("%s/..", mod);
	p = fmt("mkdir -p %s/dir/sub %s", seed, store);
	ck_assert_int_eq(system(p), 0);
	free(p);
	p = fmt("%s/dir/train-1.txt", seed);
	cwt_write_file(p, "one\ntwo\n", 8);
	free(p);
	p = fmt("%s/dir/train-2.txt", seed);
	cwt_write_file(p, "three\n", 6);
	free(p);
	p = fmt("%s/dir/other.log", seed);
	cwt_write_file(p, "no\n", 3);
	free(p);
	p = fmt("%s/dir/sub/train-3.txt", seed);
	cwt_write_file(p, "deep\n", 5);
	free(p);
	char *argv[] = {"node", "test/servers/s3rver_launch.js", store, "bkt",
	    seed, portfile, NULL};
	pid = cwt_spawn(argv, node_path);
	port = cwt_await_port(portfile, pid);
	ck_assert_msg(port > 0, "s3rver did not start");
	p = fmt("http://127.0.0.1:%d", port);
	setenv("AWS_ENDPOINT_URL", p, 1);
	free(p);
	setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
	lines = run_lines("text_lines(\"s3://bkt/dir/*.txt\")");
	ck_assert_str_eq(lines, "one|two|three");
	free(lines);
	lines = run_lines("list_files(\"s3://bkt/dir/train-*\", shuffle=false)");
	ck_assert_str_eq(lines, "s3://bkt/dir/train-1.txt|s3://bkt/dir/train-2.txt");
	free(lines);
	lines = run_lines("list_files(\"s3://bkt/dir/*/*.txt\", shuffle=false) | "
			  "flat_map(text_lines)");
	ck_assert_str_eq(lines, "deep");
	free(lines);
	cwt_stop_pid(pid);
	env_clear();
	cwt_rmtree(dir);
	free(dir);
	free(seed);
	free(store);
	free(portfile);
	free(node_path);
}
END_TEST

START_TEST(test_s3_glob_matching_nothing_is_enoent)
{
	server s;
	char err[512] = "";
	cachew_element **v = NULL;
	size_t n = 0;

	srv_start(&s, NULL);
	put_text(&s, "bkt/a.txt", "x");
	setenv("AWS_ACCESS_KEY_ID", "id", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
	setenv("AWS_ENDPOINT_URL", s.base, 1);
	ck_assert_int_eq(cwt_run("list_files(\"s3://bkt/*.csv\")", NULL, &v, &n,
			     err, sizeof(err)),
	    CACHEW_ENOENT);
	ck_assert_msg(strstr(err, "no objects match 's3://bkt/*.csv'") != NULL,
	    "%s", err);
	srv_stop(&s);
	env_clear();
}
END_TEST

/* ---- listing pages (expat for S3, jansson for GCS) ----------------------------- */

typedef cachew_err (*page_parser)(const char *, const char *, const char *,
    size_t, cwi_io_entry **, size_t *, size_t *, char **);

/* Parses text as one page from an exact-size copy (a read past its end
 * is an ASan error); the entries and token are the caller's. */
static cachew_err
parse_page(page_parser parse, const char *text, cwi_io_entry **v, size_t *n,
    char **token)
{
	size_t len = strlen(text), cap = 0;
	char *b = malloc(len > 0 ? len : 1);
	cachew_err rv;

	memcpy(b, text, len);
	*v = NULL;
	*n = 0;
	rv = parse("listing://bkt/p", "bkt", b, len, v, n, &cap, token);
	free(b);
	return rv;
}

/* A page that must fail with CACHEW_EPROTO and a message holding want. */
static void
page_refused(page_parser parse, const char *text, const char *want)
{
	cwi_io_entry *v;
	size_t n;
	char *token = NULL;

	ck_assert_msg(parse_page(parse, text, &v, &n, &token) == CACHEW_EPROTO,
	    "%s: accepted (%zu entries)", text, n);
	ck_assert_msg(strstr(cachew_errmsg(), want) != NULL,
	    "%s: got \"%s\", want \"%s\"", text, cachew_errmsg(), want);
	ck_assert_ptr_null(token);
	cwi_io_entries_free(v, n);
}

/* A last page with no objects. */
static void
page_is_empty(page_parser parse, const char *text)
{
	cwi_io_entry *v;
	size_t n;
	char *token;

	ck_assert_int_eq(parse_page(parse, text, &v, &n, &token), CACHEW_OK);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(token);
	free(v);
}

typedef struct bad_page {
	const char *page, *want;
} bad_page;

static void
pages_refused(page_parser parse, const bad_page *bad, size_t n)
{
	for (size_t i = 0; i < n; i++)
		page_refused(parse, bad[i].page, bad[i].want);
}

#define S3_HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" \
	"<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"

START_TEST(test_s3_listing_page_is_read_exactly)
{
	const char *page = S3_HEAD "<Name>bkt</Name><Prefix>d/</Prefix>"
	    "<KeyCount>2</KeyCount><IsTruncated>true</IsTruncated>"
	    "<NextContinuationToken>a&amp;b=</NextContinuationToken>"
	    "<Contents><Key>d/a&amp;&#x41;&lt;<![CDATA[x>y]]></Key>"
	    "<Size>12</Size><ETag>&quot;e1&quot;</ETag>"
	    "<Owner><ID>o</ID><DisplayName>Key</DisplayName></Owner>"
	    "<StorageClass>STANDARD</StorageClass></Contents>"
	    "<Contents><ETag>\"e2\"</ETag><Key>d/\xc3\xa9</Key></Contents>"
	    "</ListBucketResult>\n";
	cwi_io_entry *v;
	size_t n;
	char *token;

	ck_assert_int_eq(parse_page(cwi_s3_parse_page, page, &v, &n, &token),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert_str_eq(v[0].url, "s3://bkt/d/a&A<x>y");
	ck_assert_int_eq(v[0].size, 12);
	ck_assert_str_eq(v[0].etag, "\"e1\"");
	ck_assert_str_eq(v[1].url, "s3://bkt/d/\xc3\xa9");
	ck_assert_int_eq(v[1].size, -1);
	ck_assert_str_eq(v[1].etag, "\"e2\"");
	ck_assert_str_eq(token, "a&b=");
	free(token);
	cwi_io_entries_free(v, n);
	/* The last page: no token. */
	page_is_empty(cwi_s3_parse_page, S3_HEAD "<IsTruncated>false"
	    "</IsTruncated></ListBucketResult>");
}
END_TEST

START_TEST(test_s3_bad_listing_pages_name_the_element)
{
	static const bad_page bad[] = {
	    {"", "the listing is not XML: no element found at line 1"},
	    {S3_HEAD "<Contents><Key>a</Key>",
		"the listing is not XML: no element found"},
	    {"<Error><Code>AccessDenied</Code></Error>",
		"the listing is <Error>, not a <ListBucketResult>"},
	    {S3_HEAD "<Contents><Size>1</Size></Contents></ListBucketResult>",
		"<Contents> #1 has no <Key>"},
	    {S3_HEAD "<Contents><Key>a</Key></Contents><Contents><Key></Key>"
		     "</Contents></ListBucketResult>",
		"an empty <Key> in <Contents> #2"},
	    {S3_HEAD "<Contents><Key>a</Key><Key>b</Key></Contents>"
		     "</ListBucketResult>",
		"a second <Key> in <Contents> #1"},
	    {S3_HEAD "<Contents><Key>a</Key><Size>-1</Size></Contents>"
		     "</ListBucketResult>",
		"<Size> \"-1\" of <Contents> #1 is not a byte count"},
	    {S3_HEAD "<Contents><Key>a</Key><Size>99999999999999999999</Size>"
		     "</Contents></ListBucketResult>",
		"is not a byte count"},
	    {S3_HEAD "<Contents><Key>a<b/></Key></Contents></ListBucketResult>",
		"<Key> holds an element <b>"},
	    {S3_HEAD "<IsTruncated>maybe</IsTruncated></ListBucketResult>",
		"<IsTruncated> is \"maybe\", not true or false"},
	    {S3_HEAD "<IsTruncated>true</IsTruncated></ListBucketResult>",
		"a truncated listing without a NextContinuationToken"},
	    {"<?xml version=\"1.0\"?><!DOCTYPE l [<!ENTITY a \"aaaa\">]>"
	     "<ListBucketResult>&a;</ListBucketResult>",
		"a DOCTYPE declaration (a ListObjectsV2 reply has none)"},
	    {S3_HEAD "<Contents><Key>a</Key></Contents></ListBucketResult>x",
		"junk after document element"},
	    {S3_HEAD "<Contents><Key>\xff</Key></Contents></ListBucketResult>",
		"not well-formed (invalid token) at line 2"},
	};

	pages_refused(cwi_s3_parse_page, bad, sizeof(bad) / sizeof(bad[0]));
}
END_TEST

START_TEST(test_s3_listing_limits_depth_and_text)
{
	size_t deep = 100000, at = strlen(S3_HEAD);
	char *d = malloc(at + deep * 3 + 1);

	memcpy(d, S3_HEAD, at);
	for (size_t i = 0; i < deep; i++)
		memcpy(d + at + 3 * i, "<a>", 3);
	d[at + deep * 3] = '\0';
	page_refused(cwi_s3_parse_page, d, "elements nested deeper than 16");
	free(d);
	/* A key longer than any S3 key is a broken reply, not an object. */
	d = malloc(200000);
	at = (size_t)sprintf(d, "%s<Contents><Key>", S3_HEAD);
	memset(d + at, 'k', 100000);
	strcpy(d + at + 100000, "</Key></Contents></ListBucketResult>");
	page_refused(cwi_s3_parse_page, d,
	    "<Key> of <Contents> #1 longer than 8192 bytes");
	free(d);
}
END_TEST

START_TEST(test_gcs_listing_page_is_read_exactly)
{
	const char *page = "{\"kind\":\"storage#objects\",\"items\":["
	    "{\"name\":\"d/a\\u00e9\\\"\",\"size\":\"12\",\"etag\":\"E1\","
	    "\"metadata\":{\"a\":[1,{}]}},"
	    "{\"name\":\"d/b\",\"size\":7},{\"name\":\"d/c\"}],"
	    "\"nextPageToken\":\"t/1\"}";
	cwi_io_entry *v;
	size_t n;
	char *token;

	ck_assert_int_eq(parse_page(cwi_gcs_parse_page, page, &v, &n, &token),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(v[0].url, "gs://bkt/d/a\xc3\xa9\"");
	ck_assert_int_eq(v[0].size, 12);
	ck_assert_str_eq(v[0].etag, "E1");
	ck_assert_int_eq(v[1].size, 7);
	ck_assert_ptr_null(v[1].etag);
	ck_assert_int_eq(v[2].size, -1);
	ck_assert_str_eq(token, "t/1");
	free(token);
	cwi_io_entries_free(v, n);
	/* An empty prefix's page has no items at all; an empty token is
	 * the last page. */
	page_is_empty(cwi_gcs_parse_page,
	    "{\"kind\":\"storage#objects\",\"nextPageToken\":\"\"}");
}
END_TEST

START_TEST(test_gcs_bad_listing_pages_name_the_field)
{
	static const bad_page bad[] = {
	    {"", "the listing is not JSON: line 1, column 0 (byte 0)"},
	    {"{\"items\":[{\"name\":\"a\"}", "the listing is not JSON: line 1"},
	    {"[]", "listing: the reply is an array, not an object"},
	    {"{\"items\":{}}", "listing: items is an object, not an array"},
	    {"{\"items\":[7]}", "listing items[0] is an integer, not an object"},
	    {"{\"items\":[{\"name\":\"a\"},{\"size\":\"1\"}]}",
		"listing items[1]: name is missing"},
	    {"{\"items\":[{\"name\":3}]}",
		"listing items[0]: name is an integer, not a string"},
	    {"{\"items\":[{\"name\":\"\"}]}", "listing items[0]: name is empty"},
	    {"{\"items\":[{\"name\":\"a\",\"size\":\"1x\"}]}",
		"listing items[0]: size \"1x\" is not a byte count"},
	    {"{\"items\":[{\"name\":\"a\",\"size\":-4}]}",
		"listing items[0]: size -4 is negative"},
	    {"{\"items\":[{\"name\":\"a\",\"size\":1.5}]}",
		"listing items[0]: size is a fractional number, not a string"},
	    {"{\"items\":[{\"name\":\"a\",\"etag\":null}]}",
		"listing items[0]: etag is null, not a string"},
	    {"{\"nextPageToken\":5}",
		"listing: nextPageToken is an integer, not a string"},
	    {"{\"items\":[],\"items\":[]}", "duplicate object key"},
	    {"{\"items\":[{\"name\":\"a\\u0000b\"}]}", "\\u0000 is not allowed"},
	};

	pages_refused(cwi_gcs_parse_page, bad, sizeof(bad) / sizeof(bad[0]));
	size_t deep = 100000;
	char *d = malloc(deep + 1);
	memset(d, '[', deep);
	d[deep] = '\0';
	page_refused(cwi_gcs_parse_page, d, "maximum parsing depth reached");
	free(d);
}
END_TEST

/* ---- GCS ------------------------------------------------------------------------ */

START_TEST(test_gcs_bearer_token_listing_and_read)
{
	server s;
	cwi_io_opts o = fast_opts(1);
	cwi_io_entry *v;
	size_t n;
	uint8_t *got;
	size_t len;

	srv_start(&s, "sekret");
	for (int i = 0; i < 5; i++) {
		char name[48];
		snprintf(name, sizeof(name), "bkt/d/f%d.txt", i);
		put_text(&s, name, "hello");
	}
	put_text(&s, "bkt/d/g.bin", "x");
	setenv("CACHEW_GCS_ENDPOINT", s.base, 1);
	setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "sekret", 1);
	ck_assert_int_eq(cwi_io_list("gs://bkt/d/f*.txt", &o, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 5);
	ck_assert_str_eq(v[0].url, "gs://bkt/d/f0.txt");
	ck_assert_str_eq(v[4].url, "gs://bkt/d/f4.txt");
	ck_assert_int_eq(v[0].size, 5);
	ck_assert_str_eq(v[0].etag, "E5d41402abc4b2a76b9719d911017c592");
	cwi_io_entries_free(v, n);
	/* 6 objects at 2 a page: 3 listing requests. */
	ck_assert_int_eq(log_count(&s, "GET /storage/v1/b/bkt/o?prefix=d%2Ff"), 3);
	ck_assert_int_eq(log_count(&s, "pageToken="), 2);
	ck_assert_int_eq(slurp("gs://bkt/d/f3.txt", 0, UINT64_MAX, &o, 64, &got,
			     &len),
	    CACHEW_OK);
	assert_bytes(got, len, (const uint8_t *)"hello", 5);
	free(got);
	ck_assert_int_eq(log_count(&s, "auth=Bearer sekret "), 4);
	/* A page token given twice: refused, as for S3. */
	{
		char *ep = fmt("%s/@sametoken=1", s.base);
		setenv("CACHEW_GCS_ENDPOINT", ep, 1);
		ck_assert_int_eq(cwi_io_list("gs://bkt/d/f*.txt", &o, &v, &n),
		    CACHEW_EPROTO);
		ck_assert_msg(strstr(cachew_errmsg(), "gs://bkt/d/f: the "
				  "listing gave the same continuation token "
				  "twice ('0')") != NULL, "%s", cachew_errmsg());
		free(ep);
		setenv("CACHEW_GCS_ENDPOINT", s.base, 1);
	}
	/* Without the token the server refuses, and the error says so. */
	unsetenv("GOOGLE_OAUTH_ACCESS_TOKEN");
	ck_assert_int_eq(slurp("gs://bkt/d/f3.txt", 0, UINT64_MAX, &o, 64, &got,
			     &len),
	    CACHEW_EIO);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "gs://bkt/d/f3.txt: HTTP 401"));
	srv_stop(&s);
	env_clear();
}
END_TEST

Suite *
cwt_io_suite(void)
{
	Suite *s = suite_create("io");
	TCase *tc = tcase_create("io");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_local_whole_and_range_reads);
	tcase_add_test(tc, test_unknown_scheme_is_enotsup);
	tcase_add_test(tc, test_http_whole_object_identical);
	tcase_add_test(tc, test_http_range_sends_range_header);
	tcase_add_test(tc, test_http_404_is_enoent_naming_url);
	tcase_add_test(tc, test_http_500_then_success_is_retried);
	tcase_add_loop_test(tc, test_http_resumes_after_cut_with_identical_bytes,
	    0, (int)(sizeof(cut_points) / sizeof(cut_points[0])));
	tcase_add_test(tc, test_http_resume_inside_a_range);
	tcase_add_test(tc, test_http_server_ignoring_range_resumes_by_skipping);
	tcase_add_test(tc, test_http_persistent_cuts_fail_after_retry_budget);
	tcase_add_test(tc, test_http_changed_object_fails_on_resume);
	tcase_add_test(tc, test_http_sequential_files_reuse_one_connection);
	tcase_add_test(tc, test_text_lines_reads_http_urls);
	tcase_add_test(tc, test_text_lines_http_404_fails_naming_url);
	tcase_add_test(tc, test_fixed_length_records_over_http_with_header);
	tcase_add_test(tc, test_read_file_reads_http_url_through_a_cut);
	tcase_add_test(tc, test_tfrecord_reads_http_url_through_a_cut);
	tcase_add_test(tc, test_https_with_ca_bundle_reads_exact_lines);
	tcase_add_test(tc, test_https_untrusted_certificate_fails_naming_url);
	tcase_add_test(tc, test_https_resumes_after_cut_with_identical_bytes);
	tcase_add_test(tc, test_s3_signature_matches_aws_example);
	tcase_add_test(tc, test_s3_missing_credentials_is_einval);
	tcase_add_test(tc, test_s3_list_follows_continuation_tokens);
	tcase_add_test(tc, test_s3_glob_matching_nothing_is_enoent);
	tcase_add_test(tc,
	    test_s3_glob_is_listed_for_the_fingerprint_on_first_use_not_when_built);
	tcase_add_test(tc, test_s3rver_text_lines_and_list_files_end_to_end);
	tcase_add_test(tc, test_gcs_bearer_token_listing_and_read);
	tcase_add_test(tc, test_s3_listing_page_is_read_exactly);
	tcase_add_test(tc, test_s3_bad_listing_pages_name_the_element);
	tcase_add_test(tc, test_s3_listing_limits_depth_and_text);
	tcase_add_test(tc, test_gcs_listing_page_is_read_exactly);
	tcase_add_test(tc, test_gcs_bad_listing_pages_name_the_field);
	suite_add_tcase(s, tc);
	return s;
}
