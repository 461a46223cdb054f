/*
 * check_transport.c - the transport conformance suite: the same tests run
 * on inproc://, tcp://127.0.0.1:0, ipc:// and tls+tcp://127.0.0.1:0
 * (loop index = transport; TLS with certificates made at test time),
 * then nng-only tests with hostile raw TCP and IPC peers (garbage, a
 * frame header claiming 8 GiB, a frame whose element count lies, a wrong
 * protocol id, a request id without its high bit, 100 idle connections,
 * a server whose reply claims 8 GiB) that must leave the server up,
 * serving, and its memory bounded, and wire tests that pin the bytes of
 * docs/protocol.md, "Transport framing", against plain nng req0/rep0
 * sockets and raw peers, whatever implements tcp:// and ipc://. The tls
 * case: mutual TLS, and every refusal (a server certificate another CA
 * signed or that has expired, a missing client certificate, TLS on one
 * side only) named, promptly, on both sides.
 *
 * The test server's handler acts on the request header, a plain string
 * here (the transport never interprets headers): "echo..." replies with
 * the same header and the request's elements, "hold..." keeps the request
 * for the test to answer, "drop" never answers, "fail" answers with an
 * error, "reject" resets the connection, "badreply" answers with a
 * message whose element was taken out.
 */
#include "cwt.h"

#include "../src/core/element_codec.h"
#include "../transports/transport.h"
#include "../transports/nng/nng_int.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* A bound for waits on readiness: generous, never reached when the code
 * works (tests must not depend on timing). */
#define WAIT_MS cwt_bound_ms(10000)
/* The stream transports with raw peers: inproc, tcp, ipc. */
#define NTRANSPORTS 3
/* The conformance tests also run on tls+tcp (index 3). */
#define NCONF 4
#define TLS_T 3

/* ---- fixtures ----------------------------------------------------------- */

static const char *const tnames[NCONF] = {"inproc", "tcp", "ipc", "tls"};

/* A fresh URL for transport i. */
static char *
test_url(int i)
{
	static int seq;
	char buf[128];

	switch (i) {
	case 0:
		snprintf(buf, sizeof(buf), "inproc://t-%d-%d", (int)getpid(),
		    seq++);
		break;
	case 1:
		snprintf(buf, sizeof(buf), "tcp://127.0.0.1:0");
		break;
	case TLS_T:
		snprintf(buf, sizeof(buf), "tls+tcp://127.0.0.1:0");
		break;
	default:
		snprintf(buf, sizeof(buf), "ipc:///tmp/cachew-t-%d-%d.ipc",
		    (int)getpid(), seq++);
		break;
	}
	return strdup(buf);
}

/* The options for listening on (listen) or dialing url: opts (or the
 * defaults) with, for a tls+tcp URL, the server's certificate or the CA
 * that signs it added where opts names none, copied into buf; opts
 * unchanged otherwise. */
static const cwi_transport_opts *
tls_for(const char *url, const cwi_transport_opts *opts, bool listen,
    cwi_transport_opts *buf)
{
	if (strncmp(url, "tls+tcp://", 10) != 0)
		return opts;
	if (opts != NULL)
		*buf = *opts;
	else
		cwi_transport_opts_init(buf);
	if (listen && buf->tls_cert == NULL) {
		buf->tls_cert = cwt_tls_file("server.pem");
		buf->tls_key = cwt_tls_file("server.key");
	} else if (!listen && buf->tls_ca == NULL) {
		buf->tls_ca = cwt_tls_file("ca.pem");
	}
	return buf;
}

#define MAX_HELD 64

typedef struct tsrv {
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	cwi_request *held[MAX_HELD];
	int nheld;
	int handled;
	/* Element pointers of the last echoed request, as received. */
	cwi_element *seen[16];
	size_t nseen;
	cwi_listener *l;
} tsrv;

static bool
hdr_is(cwi_msg *m, const char *prefix)
{
	size_t len;
	const uint8_t *h = cwi_msg_header(m, &len);

	return len >= strlen(prefix) && memcmp(h, prefix, strlen(prefix)) == 0;
}

/* A message with header s and no elements. */
static cwi_msg *
mk(const char *s)
{
	cwi_msg *m;

	ck_assert_int_eq(cwi_msg_create(&m), CACHEW_OK);
	ck_assert_int_eq(cwi_msg_set_header(m, s, strlen(s)), CACHEW_OK);
	return m;
}

/* The header as a string (test headers are text). */
static char *
hdr_str(const cwi_msg *m)
{
	size_t len;
	const uint8_t *h = cwi_msg_header(m, &len);
	char *s = malloc(len + 1);

	memcpy(s, h, len);
	s[len] = '\0';
	return s;
}

/* Answers r with a copy of its header and its elements (moved). */
static void
echo(tsrv *s, cwi_request *r)
{
	cwi_msg *in = cwi_request_msg(r), *out;
	size_t len;
	const uint8_t *h = cwi_msg_header(in, &len);

	ck_assert_int_eq(cwi_msg_create(&out), CACHEW_OK);
	ck_assert_int_eq(cwi_msg_set_header(out, h, len), CACHEW_OK);
	pthread_mutex_lock(&s->mtx);
	s->nseen = 0;
	for (size_t i = 0; i < cwi_msg_count(in); i++) {
		cwi_element *e = cwi_msg_take(in, i);
		if (s->nseen < 16)
			s->seen[s->nseen++] = e;
		ck_assert_int_eq(cwi_msg_push(out, e), CACHEW_OK);
	}
	pthread_mutex_unlock(&s->mtx);
	if (cwi_request_reply(r, out) != CACHEW_OK)
		cwi_msg_destroy(out);
}

static void
handler(void *arg, cwi_request *r)
{
	tsrv *s = arg;
	cwi_msg *m = cwi_request_msg(r);

	if (hdr_is(m, "echo")) {
		echo(s, r);
	} else if (hdr_is(m, "hold")) {
		pthread_mutex_lock(&s->mtx);
		ck_assert_int_lt(s->nheld, MAX_HELD);
		s->held[s->nheld++] = r;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mtx);
		return; /* counted when held */
	} else if (hdr_is(m, "drop")) {
		cwi_request_drop(r);
	} else if (hdr_is(m, "fail")) {
		cwi_request_fail(r, CACHEW_EINVAL, "bad split %d", 7);
	} else if (hdr_is(m, "reject")) {
		cwi_request_reject(r, "test: rejected");
	} else if (hdr_is(m, "badreply")) {
		cwi_msg *out = mk("bad");
		cwi_element *e = cwi_element_new(1);
		ck_assert_int_eq(cwi_msg_push(out, e), CACHEW_OK);
		cwi_element_release(cwi_msg_take(out, 0));
		ck_assert_int_eq(cwi_request_reply(r, out), CACHEW_EINVAL);
		cwi_msg_destroy(out);
	} else {
		cwi_request_fail(r, CACHEW_EPROTO, "unknown test request");
	}
	pthread_mutex_lock(&s->mtx);
	s->handled++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mtx);
}

/* A test server listening on url. */
static void
srv_start_at(tsrv *s, const char *url, const cwi_transport_opts *opts)
{
	cwi_transport_opts buf;

	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->mtx, NULL);
	pthread_cond_init(&s->cv, NULL);
	ck_assert_msg(cwi_listen(&s->l, url, tls_for(url, opts, true, &buf),
			  handler, s) == CACHEW_OK,
	    "listen %s: %s", url, cachew_errmsg());
}

/* A test server on a fresh URL of transport ti. */
static void
srv_start(tsrv *s, int ti, const cwi_transport_opts *opts)
{
	char *url = test_url(ti);

	srv_start_at(s, url, opts);
	free(url);
}

static void
srv_stop(tsrv *s)
{
	cwi_listener_destroy(s->l);
	/* Requests still held are consumed after the listener is gone. */
	for (int i = 0; i < s->nheld; i++)
		cwi_request_drop(s->held[i]);
	s->nheld = 0;
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mtx);
}

/* A test server on transport ti whose messages may be max_msg bytes
 * long at most (max_msg_size): the limit the oversized tests cross. */
static void
srv_start_limited(tsrv *s, int ti, size_t max_msg)
{
	cwi_transport_opts o;

	cwi_transport_opts_init(&o);
	o.max_msg_size = max_msg;
	srv_start(s, ti, &o);
}

/* Waits until *count, one of s's counters (read under s->mtx), reaches
 * n, then checks that it is exactly n. Bounded by WAIT_MS. */
static void
wait_count(tsrv *s, const int *count, int n)
{
	uint64_t until = cwi_now_ns() + (uint64_t)WAIT_MS * 1000000u;

	pthread_mutex_lock(&s->mtx);
	while (*count < n && cwi_now_ns() < until) {
		pthread_mutex_unlock(&s->mtx);
		cwi_sleep_ns(1000000);
		pthread_mutex_lock(&s->mtx);
	}
	ck_assert_int_eq(*count, n);
	pthread_mutex_unlock(&s->mtx);
}

/* Waits until the server holds n requests; fails the test after
 * WAIT_MS. */
static void
wait_held(tsrv *s, int n)
{
	wait_count(s, &s->nheld, n);
}

/* Waits until the handler has finished n requests (it counts each
 * after answering it, so a reply can reach the client first), then
 * checks that it was exactly n. Bounded by WAIT_MS. */
static void
wait_handled(tsrv *s, int n)
{
	wait_count(s, &s->handled, n);
}

static cwi_request *
take_held(tsrv *s, int i)
{
	cwi_request *r;

	pthread_mutex_lock(&s->mtx);
	r = s->held[i];
	s->held[i] = NULL;
	pthread_mutex_unlock(&s->mtx);
	return r;
}

/* Dials url with opts (NULL: defaults), adding the suite's CA for a
 * tls+tcp URL. */
static cachew_err
dial_url(cwi_conn **c, const char *url, const cwi_transport_opts *opts)
{
	cwi_transport_opts buf;

	return cwi_dial(c, url, tls_for(url, opts, false, &buf));
}

static cwi_conn *
dial(const tsrv *s)
{
	cwi_conn *c;

	ck_assert_msg(dial_url(&c, cwi_listener_url(s->l), NULL) == CACHEW_OK,
	    "dial %s: %s", cwi_listener_url(s->l), cachew_errmsg());
	return c;
}

/* Fails the test unless m's header is `want`. */
static void
assert_hdr(const cwi_msg *m, const char *want)
{
	char *h = hdr_str(m);

	ck_assert_str_eq(h, want);
	free(h);
}

/* A message with header s carrying new references to v[0..n): the
 * caller keeps its own. */
static cwi_msg *
mk_elems(const char *s, cwi_element *const *v, size_t n)
{
	cwi_msg *m = mk(s);

	for (size_t i = 0; i < n; i++) {
		cwi_element_retain(v[i]);
		ck_assert_int_eq(cwi_msg_push(m, v[i]), CACHEW_OK);
	}
	return m;
}

/* A call whose reply header must be `expect`. */
static void
call_ok(cwi_conn *c, const char *req, const char *expect)
{
	cwi_msg *reply;

	ck_assert_msg(cwi_conn_call(c, mk(req), WAIT_MS, &reply) == CACHEW_OK,
	    "call %s: %s", req, cachew_errmsg());
	assert_hdr(reply, expect);
	cwi_msg_destroy(reply);
}

/* The server still serves: a new client's echo `req` comes back. The
 * tests that abuse a server end with this. */
static void
assert_served(const tsrv *s, const char *req)
{
	cwi_conn *c = dial(s);

	call_ok(c, req, req);
	cwi_conn_destroy(c);
}

/* Calls until one succeeds: after a reset an nng connection redials,
 * and a request sent before the new pipe is up may still see the old
 * one go. Bounded by WAIT_MS in all: before, 50 calls of WAIT_MS each
 * could outlast the tcase's timeout, and a Check timeout says nothing of
 * why (listener_reopened failed once so); now the failure says how many
 * calls were made, for how long, and the last error. */
static void
call_ok_after_reset(cwi_conn *c, const char *req)
{
	uint64_t t0 = cwt_now_ms(), spent = 0;
	cwi_msg *reply = NULL;
	cachew_err rv = CACHEW_ECLOSED;
	int calls = 0;

	while (rv == CACHEW_ECLOSED && spent < (uint64_t)WAIT_MS) {
		rv = cwi_conn_call(c, mk(req), WAIT_MS - (int)spent, &reply);
		calls++;
		spent = cwt_now_ms() - t0;
	}
	ck_assert_msg(rv == CACHEW_OK, "%s after %d calls in %llu ms: %s",
	    cachew_strerror(rv), calls, (unsigned long long)spent,
	    cachew_errmsg());
	cwi_msg_destroy(reply);
}

/* ---- pipelined "hold" requests ------------------------------------------- */

/* Sends "hold 0" .. "hold n-1" on c without waiting, request k tagged k
 * on q: all n are in flight at once. */
static void
send_holds(cwi_conn *c, cwi_cq *q, int n)
{
	for (int k = 0; k < n; k++) {
		char req[32];
		snprintf(req, sizeof(req), "hold %d", k);
		ck_assert_int_eq(
		    cwi_conn_send(c, mk(req), WAIT_MS, q, (uint64_t)k),
		    CACHEW_OK);
	}
}

/* Answers held request i with its own header, so that the client can
 * tell which request a reply belongs to. */
static void
reply_held_with_its_header(tsrv *s, int i)
{
	cwi_request *r = take_held(s, i);
	char *h = hdr_str(cwi_request_msg(r));

	ck_assert_int_eq(cwi_request_reply(r, mk(h)), CACHEW_OK);
	free(h);
}

/* Waits for the n completions of send_holds's requests on q, answered
 * by reply_held_with_its_header: each tag once, in any order, each
 * reply naming its own request. */
static void
collect_hold_replies(cwi_cq *q, int n)
{
	bool got[MAX_HELD] = {false};
	cwi_completion comp;

	ck_assert_int_le(n, MAX_HELD);
	for (int k = 0; k < n; k++) {
		char expect[32];
		ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
		ck_assert_int_eq(comp.err, CACHEW_OK);
		ck_assert_uint_lt(comp.tag, (uint64_t)n);
		ck_assert(!got[comp.tag]);
		got[comp.tag] = true;
		snprintf(expect, sizeof(expect), "hold %d", (int)comp.tag);
		assert_hdr(comp.reply, expect);
		cwi_msg_destroy(comp.reply);
	}
}

/* ---- log capture -------------------------------------------------------- */

static pthread_mutex_t log_mtx = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[16384];
/* The lines captured: up to WARN, or up to INFO (what a listener says of
 * itself) when a test sets this. */
static cachew_log_level log_level = CACHEW_LOG_WARN;

static void
log_sink(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	(void)ctx;
	if (level > log_level)
		return;
	pthread_mutex_lock(&log_mtx);
	size_t n = strlen(log_buf);
	snprintf(log_buf + n, sizeof(log_buf) - n, "[%s] %s\n", module, msg);
	pthread_mutex_unlock(&log_mtx);
}

static void
log_start(void)
{
	log_buf[0] = '\0';
	cachew_log_set(log_sink, NULL, CACHEW_LOG_WARN);
}

/* Waits (bounded) until the log holds `needle`; returns the log. */
static bool
log_wait(const char *needle)
{
	uint64_t until = cwi_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	bool found;

	for (;;) {
		pthread_mutex_lock(&log_mtx);
		found = strstr(log_buf, needle) != NULL;
		pthread_mutex_unlock(&log_mtx);
		if (found || cwi_now_ns() >= until)
			return found;
		cwi_sleep_ns(1000000);
	}
}

static void
log_stop(void)
{
	cachew_log_set(NULL, NULL, CACHEW_LOG_ERROR);
}

/* ---- elements ----------------------------------------------------------- */

static cwi_element *
mk_fixed(cachew_dtype dt, unsigned rank, const int64_t *shape, int seed)
{
	cwi_element *e = cwi_element_new(1);
	uint8_t *data;
	size_t n;

	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(cwi_tensor_init_alloc(&e->comp[0], dt, rank, shape,
			     false, &data),
	    CACHEW_OK);
	n = cwi_tensor_nbytes(&e->comp[0]);
	for (size_t i = 0; i < n; i++)
		data[i] = dt == CACHEW_BOOL ? (uint8_t)((i + seed) & 1)
					    : (uint8_t)(i * 31 + seed);
	return e;
}

static cwi_element *
mk_bytes(int nstr)
{
	cwi_element *e = cwi_element_new(2);
	const void *items[8];
	size_t lens[8];
	static const char *const words[8] = {"", "a", "bc", "hello, world",
	    "\x00\xff\x01", "", "the quick brown fox", "z"};
	int64_t shape[1] = {nstr};

	ck_assert_ptr_nonnull(e);
	for (int i = 0; i < nstr; i++) {
		items[i] = words[i];
		lens[i] = i == 4 ? 3 : strlen(words[i]);
	}
	ck_assert_int_eq(
	    cwi_tensor_init_bytes_list(&e->comp[0], 1, shape, items, lens),
	    CACHEW_OK);
	cwi_tensor_init_i64(&e->comp[1], -42);
	return e;
}

/* Every dtype, scalars and arrays, strings, and one 8 MiB tensor. */
static size_t
mk_elements(cwi_element **v)
{
	static const cachew_dtype dts[] = {CACHEW_U8, CACHEW_I32, CACHEW_I64,
	    CACHEW_F16, CACHEW_BF16, CACHEW_F32, CACHEW_F64, CACHEW_BOOL};
	int64_t s2[2] = {3, 5}, s0[1] = {0}, big[1] = {8 << 20};
	size_t n = 0;

	for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
		v[n++] = mk_fixed(dts[i], 2, s2, (int)i);
	v[n++] = mk_fixed(CACHEW_F64, 0, NULL, 9);   /* inline scalar */
	v[n++] = mk_fixed(CACHEW_I32, 1, s0, 0);     /* empty */
	v[n++] = mk_bytes(8);
	v[n++] = mk_bytes(1);
	v[n++] = mk_fixed(CACHEW_U8, 1, big, 3);     /* 8 MiB */
	return n;
}

/* ---- conformance: request/reply ------------------------------------------ */

/* Calls "echo elements" on c with mk_elements's elements (in sent, *n
 * of them, the caller's references); returns the reply, which must hold
 * as many. */
static cwi_msg *
call_echo_elements(cwi_conn *c, cwi_element **sent, size_t *n)
{
	cwi_msg *reply;

	*n = mk_elements(sent);
	ck_assert_int_eq(cwi_conn_call(c, mk_elems("echo elements", sent, *n),
			     WAIT_MS, &reply),
	    CACHEW_OK);
	ck_assert_uint_eq(cwi_msg_count(reply), *n);
	return reply;
}

START_TEST(test_roundtrip)
{
	tsrv s;
	cwi_conn *c;

	srv_start(&s, _i, NULL);
	if (_i == 1 || _i == TLS_T)
		ck_assert_msg(strcmp(cwi_listener_url(s.l) + (_i == TLS_T ? 4 : 0),
				  "tcp://127.0.0.1:0"),
		    "bound port not reported");
	c = dial(&s);
	call_ok(c, "echo hello", "echo hello");
	call_ok(c, "echo", "echo");
	ck_assert_str_eq(cwi_conn_url(c), cwi_listener_url(s.l));
	cwi_conn_destroy(c);
	if (_i == 2) {
		/* Closing an ipc listener removes its socket file. */
		char path[128];
		snprintf(path, sizeof(path), "%s", cwi_listener_url(s.l) + 6);
		ck_assert_int_eq(access(path, F_OK), 0);
		srv_stop(&s);
		ck_assert_int_eq(access(path, F_OK), -1);
		return;
	}
	srv_stop(&s);
}
END_TEST

typedef struct client_arg {
	const tsrv *s;
	int id;
	int ok;
} client_arg;

static void *
client_main(void *arg)
{
	client_arg *a = arg;
	cwi_conn *c;

	if (dial_url(&c, cwi_listener_url(a->s->l), NULL) != CACHEW_OK)
		return NULL;
	for (int i = 0; i < 40; i++) {
		char req[64];
		cwi_msg *reply;
		snprintf(req, sizeof(req), "echo %d/%d", a->id, i);
		if (cwi_conn_call(c, mk(req), WAIT_MS, &reply) != CACHEW_OK)
			break;
		char *h = hdr_str(reply);
		if (strcmp(h, req) == 0)
			a->ok++;
		free(h);
		cwi_msg_destroy(reply);
	}
	cwi_conn_destroy(c);
	return NULL;
}

START_TEST(test_many_concurrent_clients)
{
	enum { NC = 8 };
	pthread_t t[NC];
	client_arg a[NC];
	tsrv s;

	srv_start(&s, _i, NULL);
	for (int i = 0; i < NC; i++) {
		a[i] = (client_arg){.s = &s, .id = i};
		ck_assert_int_eq(pthread_create(&t[i], NULL, client_main, &a[i]),
		    0);
	}
	for (int i = 0; i < NC; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(a[i].ok, 40);
	}
	wait_handled(&s, NC * 40);
	srv_stop(&s);
}
END_TEST

START_TEST(test_requests_in_flight_answered_out_of_order)
{
	enum { N = 16 };
	cwi_completion comp;
	cwi_conn *c;
	cwi_cq *q;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	send_holds(c, q, N);
	ck_assert_uint_eq(cwi_cq_outstanding(q), N);
	/* All N reach the server before any is answered: pipelined. */
	wait_held(&s, N);
	/* Answer in reverse order; each reply names its request. */
	for (int i = N - 1; i >= 0; i--)
		reply_held_with_its_header(&s, i);
	s.nheld = 0;
	collect_hold_replies(q, N);
	ck_assert_uint_eq(cwi_cq_outstanding(q), 0);
	/* Nothing more: the wait times out. */
	ck_assert_int_eq(cwi_cq_wait(q, 10, &comp), CACHEW_ETIMEDOUT);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_elements_round_trip)
{
	cwi_element *sent[16];
	cwi_msg *reply;
	cwi_conn *c;
	size_t n;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	reply = call_echo_elements(c, sent, &n);
	for (size_t i = 0; i < n; i++) {
		cwi_element *e = cwi_msg_element(reply, i);
		ck_assert_msg(cwi_element_equal(e, sent[i]), "element %zu", i);
		if (_i == 0) {
			/* inproc: the very same elements, both ways. */
			ck_assert_ptr_eq(s.seen[i], sent[i]);
			ck_assert_ptr_eq(e, sent[i]);
		}
	}
	if (_i != 0) {
		/* nng: payloads are views into the one received frame. */
		cwi_element *a = cwi_msg_element(reply, 1);
		cwi_element *big = cwi_msg_element(reply, n - 1);
		ck_assert_ptr_nonnull(big->comp[0].buf);
		ck_assert_ptr_eq(big->comp[0].buf, a->comp[0].buf);
		ck_assert_uint_gt(big->comp[0].buf->size,
		    cwi_tensor_nbytes(&big->comp[0]));
		ck_assert_uint_eq((uintptr_t)cwi_tensor_data(&big->comp[0]) % 16,
		    0);
	}
	cwi_msg_destroy(reply);
	for (size_t i = 0; i < n; i++)
		cwi_element_release(sent[i]);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* Received payloads are views into the received frame (nng) or the sent
 * elements themselves (inproc): elements taken out of a reply must stay
 * valid, with their data, after the reply is destroyed, each in any
 * order, until the last one is released. */
START_TEST(test_received_elements_outlive_their_message)
{
	cwi_element *sent[16], *got[16];
	cwi_msg *reply;
	cwi_conn *c;
	size_t n;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	reply = call_echo_elements(c, sent, &n);
	for (size_t i = 0; i < n; i++)
		got[i] = cwi_msg_take(reply, i);
	cwi_msg_destroy(reply);
	cwi_conn_destroy(c);
	srv_stop(&s);
	/* The frame now lives only through the elements: release them one
	 * at a time, starting in the middle, checking the rest each time. */
	for (size_t k = 0; k < n; k++) {
		size_t i = (k + n / 2) % n;
		for (size_t j = 0; j < n; j++) {
			if (got[j] != NULL)
				ck_assert_msg(cwi_element_equal(got[j], sent[j]),
				    "element %zu after %zu released", j, k);
		}
		cwi_element_release(got[i]);
		got[i] = NULL;
	}
	for (size_t i = 0; i < n; i++)
		cwi_element_release(sent[i]);
}
END_TEST

START_TEST(test_header_only_and_empty_messages)
{
	cwi_msg *reply;
	cwi_conn *c;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	/* A header of every byte value, including NULs. */
	{
		uint8_t h[260];
		size_t len;
		cwi_msg *m;
		h[0] = 'e', h[1] = 'c', h[2] = 'h', h[3] = 'o';
		for (int i = 4; i < 260; i++)
			h[i] = (uint8_t)i;
		ck_assert_int_eq(cwi_msg_create(&m), CACHEW_OK);
		ck_assert_int_eq(cwi_msg_set_header(m, h, sizeof(h)), CACHEW_OK);
		ck_assert_int_eq(cwi_conn_call(c, m, WAIT_MS, &reply), CACHEW_OK);
		const uint8_t *got = cwi_msg_header(reply, &len);
		ck_assert_uint_eq(len, sizeof(h));
		ck_assert_int_eq(memcmp(got, h, len), 0);
		ck_assert_uint_eq(cwi_msg_count(reply), 0);
		cwi_msg_destroy(reply);
	}
	/* No header at all: the server answers with an error. */
	{
		cwi_msg *m;
		ck_assert_int_eq(cwi_msg_create(&m), CACHEW_OK);
		ck_assert_int_eq(cwi_conn_call(c, m, WAIT_MS, &reply),
		    CACHEW_EPROTO);
		ck_assert_ptr_null(reply);
	}
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_handler_error_reaches_client)
{
	cwi_msg *reply;
	cwi_conn *c;
	char expect[256];
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_conn_call(c, mk("fail"), WAIT_MS, &reply),
	    CACHEW_EINVAL);
	ck_assert_ptr_null(reply);
	snprintf(expect, sizeof(expect), "%s: bad split 7",
	    cwi_listener_url(s.l));
	ck_assert_str_eq(cachew_errmsg(), expect);
	/* The connection is fine afterwards. */
	call_ok(c, "echo after", "echo after");
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_message_with_taken_element_is_refused)
{
	cwi_msg *m, *reply;
	cwi_conn *c;
	cwi_cq *q;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	/* Sending: refused before anything leaves; the caller keeps it. */
	m = mk("echo");
	ck_assert_int_eq(cwi_msg_push(m, cwi_element_new(1)), CACHEW_OK);
	cwi_element_release(cwi_msg_take(m, 0));
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(c, m, WAIT_MS, q, 1), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "element 0 was taken"));
	ck_assert_uint_eq(cwi_cq_outstanding(q), 0);
	cwi_msg_destroy(m);
	cwi_cq_destroy(q);
	/* Replying: the client learns why. */
	ck_assert_int_eq(cwi_conn_call(c, mk("badreply"), WAIT_MS, &reply),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "reply not sent"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "element 0 was taken"));
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* ---- conformance: timeouts and close ------------------------------------- */

START_TEST(test_timeout_when_server_never_replies)
{
	cwi_msg *reply;
	cwi_conn *c;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_conn_call(c, mk("drop"), 100, &reply),
	    CACHEW_ETIMEDOUT);
	ck_assert_ptr_null(reply);
	/* Held past its deadline, then answered: the late reply is
	 * accepted by the server and dropped at the client. */
	ck_assert_int_eq(cwi_conn_call(c, mk("hold late"), 100, &reply),
	    CACHEW_ETIMEDOUT);
	wait_held(&s, 1);
	ck_assert_int_eq(cwi_request_reply(take_held(&s, 0), mk("late")),
	    CACHEW_OK);
	s.nheld = 0;
	call_ok(c, "echo next", "echo next");
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_cq_wait_times_out_and_closes)
{
	cwi_completion comp;
	cwi_cq *q;

	(void)_i;
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	ck_assert_int_eq(cwi_cq_wait(q, 20, &comp), CACHEW_ETIMEDOUT);
	cwi_cq_close(q);
	ck_assert_int_eq(cwi_cq_wait(q, 20, &comp), CACHEW_ECLOSED);
	cwi_cq_destroy(q);
}
END_TEST

typedef struct blocked_call {
	cwi_conn *c;
	const char *req;
	cachew_err rv;
	char errmsg[256];
} blocked_call;

static void *
blocked_main(void *arg)
{
	blocked_call *b = arg;
	cwi_msg *reply = NULL;

	b->rv = cwi_conn_call(b->c, mk(b->req), 60000, &reply);
	snprintf(b->errmsg, sizeof(b->errmsg), "%s", cachew_errmsg());
	cwi_msg_destroy(reply);
	return NULL;
}

/* A new connection to s whose call of "hold me", made in thread *t,
 * has reached the server and blocks there, unanswered. */
static void
blocked_call_start(tsrv *s, blocked_call *b, pthread_t *t)
{
	*b = (blocked_call){.c = dial(s), .req = "hold me"};
	ck_assert_int_eq(pthread_create(t, NULL, blocked_main, b), 0);
	wait_held(s, 1);
}

START_TEST(test_conn_close_wakes_blocked_call)
{
	blocked_call b;
	pthread_t t;
	tsrv s;

	srv_start(&s, _i, NULL);
	blocked_call_start(&s, &b, &t);
	cwi_conn_close(b.c);
	pthread_join(t, NULL);
	ck_assert_int_eq(b.rv, CACHEW_ECLOSED);
	/* A closed connection refuses new requests at once. */
	{
		cwi_msg *reply;
		ck_assert_int_eq(cwi_conn_call(b.c, mk("echo"), WAIT_MS, &reply),
		    CACHEW_ECLOSED);
	}
	/* The server's held request can no longer be answered: inproc
	 * knows at once; nng knows once it has seen the connection end,
	 * and until then writes the reply to a socket nobody reads. */
	{
		cwi_msg *x = mk("x");
		cachew_err rv = cwi_request_reply(take_held(&s, 0), x);
		if (rv != CACHEW_OK)
			cwi_msg_destroy(x);
		if (_i == 0)
			ck_assert_int_eq(rv, CACHEW_ECLOSED);
		else
			ck_assert(rv == CACHEW_OK || rv == CACHEW_ECLOSED);
	}
	s.nheld = 0;
	cwi_conn_destroy(b.c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_listener_close_wakes_blocked_call)
{
	blocked_call b;
	pthread_t t;
	tsrv s;
	cwi_request *r;
	cwi_msg *late;

	srv_start(&s, _i, NULL);
	blocked_call_start(&s, &b, &t);
	cwi_listener_close(s.l);
	pthread_join(t, NULL);
	ck_assert_int_eq(b.rv, CACHEW_ECLOSED);
	/* A held request outlives its listener; answering it says so. */
	r = take_held(&s, 0);
	s.nheld = 0;
	late = mk("late");
	ck_assert_int_eq(cwi_request_reply(r, late), CACHEW_ECLOSED);
	cwi_msg_destroy(late);
	cwi_conn_destroy(b.c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_cq_close_wakes_waiter)
{
	cwi_completion comp;
	cwi_conn *c;
	cwi_cq *q;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(c, mk("hold"), WAIT_MS, q, 7),
	    CACHEW_OK);
	wait_held(&s, 1);
	/* Closing the connection completes the request with ECLOSED. */
	cwi_conn_close(c);
	ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
	ck_assert_uint_eq(comp.tag, 7);
	ck_assert_int_eq(comp.err, CACHEW_ECLOSED);
	ck_assert_ptr_null(comp.reply);
	cwi_cq_close(q);
	ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_ECLOSED);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* ---- conformance: limits and bad peers ----------------------------------- */

START_TEST(test_oversized_request_resets_sender_only)
{
	cwi_conn *big, *other;
	cwi_msg *m, *reply;
	char *h = malloc(70000);
	tsrv s;

	log_start();
	srv_start_limited(&s, _i, 65536);
	big = dial(&s);
	other = dial(&s);
	call_ok(other, "echo before", "echo before");
	memset(h, 'x', 70000);
	memcpy(h, "echo", 4);
	ck_assert_int_eq(cwi_msg_create(&m), CACHEW_OK);
	ck_assert_int_eq(cwi_msg_set_header(m, h, 70000), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_call(big, m, WAIT_MS, &reply),
	    CACHEW_ECLOSED);
	ck_assert_msg(log_wait("exceeds the limit of 65536"), "log: %s",
	    log_buf);
	ck_assert_ptr_nonnull(strstr(log_buf, "action=reset"));
	/* Others are served; the sender's connection recovers. */
	call_ok(other, "echo after", "echo after");
	call_ok_after_reset(big, "echo again");
	log_stop();
	free(h);
	cwi_conn_destroy(big);
	cwi_conn_destroy(other);
	srv_stop(&s);
}
END_TEST

START_TEST(test_reject_resets_connection_with_reason)
{
	cwi_msg *reply;
	cwi_conn *c;
	tsrv s;

	log_start();
	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_conn_call(c, mk("reject"), WAIT_MS, &reply),
	    CACHEW_ECLOSED);
	ck_assert(log_wait("reason=\"test: rejected\" action=reset"));
	call_ok_after_reset(c, "echo again");
	log_stop();
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_listen_on_taken_address_fails)
{
	cwi_listener *l2 = NULL;
	cwi_transport_opts buf;
	tsrv s;

	srv_start(&s, _i, NULL);
	ck_assert_int_eq(cwi_listen(&l2, cwi_listener_url(s.l),
			     tls_for(cwi_listener_url(s.l), NULL, true, &buf),
			     handler, &s),
	    CACHEW_EEXIST);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "address in use"));
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), cwi_listener_url(s.l)));
	srv_stop(&s);
}
END_TEST

START_TEST(test_dial_without_listener_is_refused)
{
	cwi_conn *c = NULL;
	char url[128];
	tsrv s;

	/* An address that was bound a moment ago and is free now. */
	srv_start(&s, _i, NULL);
	snprintf(url, sizeof(url), "%s", cwi_listener_url(s.l));
	srv_stop(&s);
	ck_assert_int_eq(dial_url(&c, url, NULL), CACHEW_EIO);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "connection refused"));
	ck_assert_ptr_null(c);
}
END_TEST

START_TEST(test_listener_reopened_is_found_again)
{
	cwi_transport_opts o;
	cwi_conn *c;
	char url[128];
	tsrv s;

	srv_start(&s, _i, NULL);
	snprintf(url, sizeof(url), "%s", cwi_listener_url(s.l));
	c = dial(&s);
	call_ok(c, "echo one", "echo one");
	srv_stop(&s);
	/* Same address, new listener: the connection finds it. */
	cwi_transport_opts_init(&o);
	srv_start_at(&s, url, &o);
	call_ok_after_reset(c, "echo two");
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_bad_urls)
{
	cwi_listener *l;
	cwi_conn *c;

	(void)_i;
	ck_assert_int_eq(cwi_dial(&c, "foo://x", NULL), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "unsupported transport"));
	ck_assert_int_eq(cwi_dial(&c, "no-scheme", NULL), CACHEW_EINVAL);
	ck_assert_int_eq(cwi_listen(&l, "inproc://", NULL, handler, NULL),
	    CACHEW_EINVAL);
	ck_assert_int_eq(
	    cwi_listen(&l, "tcp://127.0.0.1:notaport", NULL, handler, NULL),
	    CACHEW_EINVAL);
	ck_assert_int_eq(cwi_dial(&c, "tcp://", NULL), CACHEW_EINVAL);
	ck_assert_int_eq(cwi_listen(&l, "inproc://x", NULL, NULL, NULL),
	    CACHEW_EINVAL);
}
END_TEST

/* ---- messages ----------------------------------------------------------- */

START_TEST(test_msg_ownership_and_size)
{
	cwi_strbuf sb;
	cwi_msg *m;
	cwi_element *e = mk_fixed(CACHEW_I32, 1, (int64_t[]){10}, 1);
	size_t len;

	ck_assert_int_eq(cwi_msg_create(&m), CACHEW_OK);
	cwi_strbuf_init(&sb);
	cwi_strbuf_puts(&sb, "hdr");
	ck_assert_int_eq(cwi_msg_set_header_strbuf(m, &sb), CACHEW_OK);
	ck_assert_ptr_null(sb.data);
	ck_assert_int_eq(memcmp(cwi_msg_header(m, &len), "hdr", 3), 0);
	ck_assert_uint_eq(len, 3);
	ck_assert_int_eq(cwi_msg_push(m, e), CACHEW_OK);
	ck_assert_uint_eq(cwi_msg_size(m), 3 + 40);
	ck_assert_ptr_eq(cwi_msg_element(m, 0), e);
	ck_assert_ptr_eq(cwi_msg_take(m, 0), e);
	ck_assert_ptr_null(cwi_msg_element(m, 0));
	ck_assert_ptr_null(cwi_msg_take(m, 5));
	cwi_msg_destroy(m);
	cwi_element_release(e);
}
END_TEST

/* ---- raw peers: fixtures of the hostile and wire tests --------------------
 *
 * Raw POSIX stream sockets speak SP by hand, right or wrong: as clients of
 * a listener on tcp:// or ipc://, or as a server that cwi_dial reaches.
 */

/* A "<field>: N kB" line of /proc/self/status, in KiB. */
static long
status_kib(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256], fmt[64];
	long kib = -1;

	ck_assert_ptr_nonnull(f);
	snprintf(fmt, sizeof(fmt), "%s: %%ld kB", field);
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, fmt, &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static long
rss_kib(void)
{
	return status_kib("VmRSS");
}

/* Fails the test unless the resident set grew by less than 64 MiB since
 * rss_kib() said `before`: a length a peer claims must not be allocated
 * before its bytes are there. */
static void
assert_rss_bounded(long before)
{
	long after = rss_kib();

	ck_assert_msg(after - before < 64 * 1024, "RSS grew %ld KiB",
	    after - before);
}

/* The address of a tcp:// URL (on loopback) or an ipc:// one; returns
 * its length. */
static socklen_t
raw_addr(const char *url, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (strncmp(url, "ipc://", 6) == 0) {
		struct sockaddr_un *un = (struct sockaddr_un *)ss;

		un->sun_family = AF_UNIX;
		ck_assert_uint_lt(strlen(url + 6), sizeof(un->sun_path));
		memcpy(un->sun_path, url + 6, strlen(url + 6) + 1);
		return sizeof(*un);
	} else {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;

		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)atoi(strrchr(url, ':') + 1));
		in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		return sizeof(*in);
	}
}

/* A raw stream socket connected to a tcp:// or ipc:// listener. */
static int
raw_connect(const char *url)
{
	struct sockaddr_storage ss;
	socklen_t sl = raw_addr(url, &ss);
	int fd = socket(ss.ss_family, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&ss, sl), 0);
	return fd;
}

/* write() of all len bytes, without SIGPIPE: a server that closes early
 * is what most of these tests expect, so a short send just stops. */
static void
send_all(int fd, const void *data, size_t len)
{
	const uint8_t *p = data;

	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		p += n;
		len -= (size_t)n;
	}
}

/* True once the server closed fd (EOF or reset), reading and discarding
 * whatever it sent first (its SP header). Bounded by WAIT_MS. */
static bool
closed_by_server(int fd)
{
	uint64_t until = cwi_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	uint8_t buf[256];

	while (cwi_now_ns() < until) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 100) <= 0)
			continue;
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return true;
	}
	return false;
}

/* Reads exactly len bytes within WAIT_MS; false on EOF, reset or time. */
static bool
read_exact(int fd, void *buf, size_t len)
{
	uint64_t until = cwi_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	uint8_t *p = buf;

	while (len > 0 && cwi_now_ns() < until) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		ssize_t n;
		if (poll(&pf, 1, 100) <= 0)
			continue;
		n = read(fd, p, len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return len == 0;
}

/* SP protocol ids: a cachew client is a req0 peer, a listener rep0. */
#define SP_REQ0 0x30
#define SP_REP0 0x31

/* The SP connection header of protocol `proto`: 0x00 'S' 'P' 0x00, the
 * protocol id (16 bits, big-endian), two reserved zero bytes. */
static void
sp_header(uint8_t out[8], uint8_t proto)
{
	static const uint8_t h[8] = {0, 'S', 'P', 0, 0x00, 0x00, 0, 0};

	memcpy(out, h, sizeof(h));
	out[5] = proto;
}

/* A raw connection to url that has sent the SP header of `proto`; the
 * listener's own header is left unread. */
static int
raw_connect_sp(const char *url, uint8_t proto)
{
	uint8_t hs[8];
	int fd = raw_connect(url);

	sp_header(hs, proto);
	send_all(fd, hs, sizeof(hs));
	return fd;
}

/* Reads the SP header the other side sends first and fails the test
 * unless it is that of `proto`. */
static void
raw_expect_sp_header(int fd, uint8_t proto)
{
	uint8_t want[8], got[8];

	sp_header(want, proto);
	ck_assert(read_exact(fd, got, sizeof(got)));
	ck_assert_int_eq(memcmp(got, want, sizeof(want)), 0);
}

/* A raw req0 peer past the handshake: both SP headers exchanged. */
static int
raw_connect_req(const char *url)
{
	int fd = raw_connect_sp(url, SP_REQ0);

	raw_expect_sp_header(fd, SP_REP0);
	return fd;
}

static void
put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (uint8_t)v;
		v >>= 8;
	}
}

static void
put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* Sends the head of one SP message of len bytes (request ID and body)
 * with the stream's framing: TCP a 64-bit big-endian length, IPC the
 * message type 1 and then the length. */
static void
raw_send_length(int fd, bool ipc, uint64_t len)
{
	uint8_t head[9];
	size_t n = 0;

	if (ipc)
		head[n++] = 1;
	put_be64(head + n, len);
	send_all(fd, head, n + 8);
}

/* Sends one SP message, `bytes` (request ID then body), framed. */
static void
raw_send_sp(int fd, bool ipc, const uint8_t *bytes, size_t len)
{
	raw_send_length(fd, ipc, len);
	send_all(fd, bytes, len);
}

/* Reads one SP message (after the peer's header was read); returns its
 * bytes (free()) and length, or NULL once the server closed. */
static uint8_t *
raw_recv_sp(int fd, bool ipc, size_t *len)
{
	uint8_t head[9];
	uint8_t *msg;
	uint64_t n = 0;
	size_t off = ipc ? 1 : 0;

	if (!read_exact(fd, head, off + 8))
		return NULL;
	if (ipc)
		ck_assert_uint_eq(head[0], 1);
	for (int i = 0; i < 8; i++)
		n = n << 8 | head[off + (size_t)i];
	ck_assert_uint_lt(n, 1u << 20);
	msg = malloc(n > 0 ? n : 1);
	ck_assert_ptr_nonnull(msg);
	if (!read_exact(fd, msg, n)) {
		free(msg);
		return NULL;
	}
	*len = n;
	return msg;
}

/* A body's fixed head: 'C' 'W' 1 kind, H, N (or an error code), flags. */
#define FRAME_HEAD_BYTES 16

/* A request as a raw peer sends it: the 4-byte ID, then a body with
 * `hdr` as its header and no elements. */
static size_t
raw_request(uint8_t *out, size_t cap, uint32_t id, const char *hdr)
{
	size_t hlen = strlen(hdr);

	ck_assert_uint_le(4 + FRAME_HEAD_BYTES + hlen, cap);
	put_be32(out, id);
	memset(out + 4, 0, FRAME_HEAD_BYTES);
	out[4] = 'C', out[5] = 'W', out[6] = 1, out[7] = 0;
	put_be32(out + 8, (uint32_t)hlen);
	memcpy(out + 4 + FRAME_HEAD_BYTES, hdr, hlen);
	return 4 + FRAME_HEAD_BYTES + hlen;
}

/* Sends raw_request(id, hdr): a request from a raw peer, or from a raw
 * server the reply to request `id`. */
static void
raw_send_msg(int fd, bool ipc, uint32_t id, const char *hdr)
{
	uint8_t msg[64];
	size_t len = raw_request(msg, sizeof(msg), id, hdr);

	raw_send_sp(fd, ipc, msg, len);
}

/* A raw req0 peer of the listener at url sends `msg` (len bytes:
 * backtrace, request ID, body), and the reply must be the very same
 * bytes: the ID and backtrace come back, and the echo's body is the
 * request's. */
static void
raw_assert_echoed(const char *url, const uint8_t *msg, size_t len)
{
	bool ipc = strncmp(url, "ipc://", 6) == 0;
	int fd = raw_connect_req(url);
	uint8_t *got;
	size_t glen;

	raw_send_sp(fd, ipc, msg, len);
	got = raw_recv_sp(fd, ipc, &glen);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(glen, len);
	ck_assert_int_eq(memcmp(got, msg, len), 0);
	free(got);
	close(fd);
}

/* After a hostile peer: the handler saw none of its requests, and the
 * server still serves `good`, a client connected before the peer
 * (destroyed here), or, when good is NULL, a new client. */
static void
assert_unharmed(tsrv *s, cwi_conn *good)
{
	ck_assert_int_eq(s->handled, 0);
	if (good == NULL) {
		assert_served(s, "echo still here");
		return;
	}
	call_ok(good, "echo still here", "echo still here");
	cwi_conn_destroy(good);
}

/* ---- nng only: hostile raw TCP peers ------------------------------------- */

START_TEST(test_hostile_garbage_bytes)
{
	static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
				      "\xff\xfe\x00\x01 not an SP header";
	tsrv s;
	int fd;

	srv_start(&s, 1, NULL);
	fd = raw_connect(cwi_listener_url(s.l));
	send_all(fd, garbage, sizeof(garbage));
	ck_assert(closed_by_server(fd));
	close(fd);
	assert_served(&s, "echo still here");
	srv_stop(&s);
}
END_TEST

START_TEST(test_hostile_8gib_length_header)
{
	long before;
	tsrv s;
	int fd;

	srv_start(&s, 1, NULL);
	before = rss_kib();
	for (int k = 0; k < 4; k++) {
		fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
		raw_send_length(fd, false, (uint64_t)8 << 30);
		ck_assert(closed_by_server(fd));
		close(fd);
	}
	assert_rss_bounded(before);
	assert_served(&s, "echo still here");
	srv_stop(&s);
}
END_TEST

START_TEST(test_hostile_frame_with_lying_counts)
{
	/* Frame head: magic, version 1, kind 0, header length, element
	 * count, flags. */
	static const uint8_t huge_count[20] = {'C', 'W', 1, 0, 0, 0, 0, 0,
	    0x80, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0x01, 0x90};
	static const uint8_t huge_header[16] = {'C', 'W', 1, 0, 0xff, 0xff,
	    0xff, 0xf0, 0, 0, 0, 0, 0, 0, 0, 0};
	/* One f32 component of 2^32-1 values whose data bin is missing. */
	static const uint8_t bad_element[29] = {'C', 'W', 1, 0, 0, 0, 0, 0, 0,
	    0, 0, 1, 0, 0, 0, 0, 0x91, 0x94, 0x06, 0x91, 0xce, 0xff, 0xff,
	    0xff, 0xff, 0xc4, 0x00, 0xc4, 0x10};
	const uint8_t *frames[3] = {huge_count, huge_header, bad_element};
	const size_t lens[3] = {sizeof(huge_count), sizeof(huge_header),
	    sizeof(bad_element)};
	const char *reasons[3] = {"element count 2147483648 does not fit",
	    "header length 4294967280 exceeds", "element 0:"};
	tsrv s;

	log_start();
	srv_start(&s, 1, NULL);
	for (int k = 0; k < 3; k++) {
		uint8_t msg[64];
		int fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
		/* A request ID, then the frame as its body. */
		put_be32(msg, 0x80000001u);
		memcpy(msg + 4, frames[k], lens[k]);
		raw_send_sp(fd, false, msg, 4 + lens[k]);
		ck_assert(closed_by_server(fd));
		close(fd);
		ck_assert_msg(log_wait(reasons[k]), "frame %d: log: %s", k,
		    log_buf);
	}
	assert_unharmed(&s, NULL);
	log_stop();
	srv_stop(&s);
}
END_TEST

START_TEST(test_hostile_100_idle_connections)
{
	enum { N = 100 };
	int fds[N];
	long before;
	tsrv s;

	srv_start(&s, 1, NULL);
	before = rss_kib();
	/* Half complete the SP handshake and then idle; half never say
	 * anything. */
	for (int k = 0; k < N; k++)
		fds[k] = k % 2 == 0
		    ? raw_connect_sp(cwi_listener_url(s.l), SP_REQ0)
		    : raw_connect(cwi_listener_url(s.l));
	assert_served(&s, "echo still here");
	assert_rss_bounded(before);
	for (int k = 0; k < N; k++)
		close(fds[k]);
	srv_stop(&s);
}
END_TEST

/* ---- wire: the SP framing on tcp:// and ipc:// ---------------------------
 *
 * These pin docs/protocol.md, "Transport framing", from outside the
 * transport: real nng req0/rep0 sockets talk to cwi_listen/cwi_dial, and
 * raw POSIX sockets play hostile peers on both stream transports, so that
 * any implementation of tcp:// and ipc:// (nng sockets or nng streams)
 * must speak the same bytes. Loop index 1 is tcp, 2 is ipc.
 */

/*
 * Builds a body by hand as the framing table says: 'C' 'W' 1 kind, H, N
 * (or the error code), flags 0, then H header bytes, then the elements.
 * The encoding starts 4 bytes before the body, where the request ID goes
 * (docs: the element padding is reckoned from there), so the body is
 * sb->data + 4, sb->len - 4 bytes long. cwi_strbuf_free when done.
 */
static void
body_build(cwi_strbuf *sb, uint8_t kind, const void *hdr, size_t hlen,
    uint32_t n_or_code, cwi_element *const *elems, size_t ne)
{
	uint8_t head[FRAME_HEAD_BYTES] = {'C', 'W', 1, kind};

	put_be32(head + 4, (uint32_t)hlen);
	put_be32(head + 8, n_or_code);
	put_be32(head + 12, 0);
	cwi_strbuf_init(sb);
	cwi_strbuf_append(sb, "\x80\0\0\0", 4);
	cwi_strbuf_append(sb, head, sizeof(head));
	if (hlen > 0)
		cwi_strbuf_append(sb, hdr, hlen);
	for (size_t i = 0; i < ne; i++)
		ck_assert_int_eq(cwi_element_encode(elems[i], sb), CACHEW_OK);
	ck_assert(!sb->oom);
}

static const uint8_t *
body_of(const cwi_strbuf *sb, size_t *len)
{
	*len = sb->len - 4;
	return (const uint8_t *)sb->data + 4;
}

/* An nng message holding sb's body. */
static nng_msg *
nng_body_msg(const cwi_strbuf *sb)
{
	size_t len;
	const uint8_t *b = body_of(sb, &len);
	nng_msg *m;

	ck_assert_int_eq(nng_msg_alloc(&m, 0), 0);
	ck_assert_int_eq(nng_msg_append(m, b, len), 0);
	return m;
}

/* Fails the test unless m's body is exactly sb's body. */
static void
assert_body_eq(nng_msg *m, const cwi_strbuf *sb, const char *what)
{
	size_t len;
	const uint8_t *b = body_of(sb, &len);

	ck_assert_msg(nng_msg_len(m) == len, "%s: body of %zu bytes, want %zu",
	    what, nng_msg_len(m), len);
	for (size_t i = 0; i < len; i++)
		ck_assert_msg(((const uint8_t *)nng_msg_body(m))[i] == b[i],
		    "%s: byte %zu is %02x, want %02x", what, i,
		    ((const uint8_t *)nng_msg_body(m))[i], b[i]);
}

/* Sends req's body on an nng req0 socket and fails the test unless the
 * reply's body is exactly want's. */
static void
nng_exchange(nng_socket sock, const cwi_strbuf *req, const cwi_strbuf *want,
    const char *what)
{
	nng_msg *rm;

	ck_assert_int_eq(nng_sendmsg(sock, nng_body_msg(req), 0), 0);
	ck_assert_int_eq(nng_recvmsg(sock, &rm, 0), 0);
	assert_body_eq(rm, want, what);
	nng_msg_free(rm);
}

/* Socket options every test's nng socket gets: bounded waits. */
static void
nng_sock_bound(nng_socket sock)
{
	ck_assert_int_eq(nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, WAIT_MS),
	    0);
	ck_assert_int_eq(nng_socket_set_ms(sock, NNG_OPT_SENDTIMEO, WAIT_MS),
	    0);
}

/* Elements whose fixed payloads are over 16 bytes (so they are padded),
 * plus strings and an inline scalar. */
static size_t
mk_wire_elements(cwi_element **v)
{
	int64_t s2[2] = {3, 5}, s1[1] = {1000};

	v[0] = mk_fixed(CACHEW_F32, 2, s2, 1);
	v[1] = mk_bytes(8);
	v[2] = mk_fixed(CACHEW_U8, 1, s1, 2);
	v[3] = mk_fixed(CACHEW_I64, 0, NULL, 3);
	return 4;
}

START_TEST(test_wire_nng_req_socket_calls_listener)
{
	cwi_element *elems[4];
	size_t ne = mk_wire_elements(elems);
	char text[256];
	cwi_strbuf sb, want;
	nng_socket sock;
	tsrv s;

	srv_start(&s, _i, NULL);
	ck_assert_int_eq(nng_req0_open(&sock), 0);
	nng_sock_bound(sock);
	ck_assert_int_eq(nng_dial(sock, cwi_listener_url(s.l), NULL, 0), 0);

	/* A header-only request: the echo is the same body. */
	body_build(&sb, 0, "echo interop", 12, 0, NULL, 0);
	nng_exchange(sock, &sb, &sb, "header-only echo");
	cwi_strbuf_free(&sb);

	/* With elements: the listener decodes them, the echo re-encodes
	 * them, padding included, into the very same bytes. */
	body_build(&sb, 0, "echo elements", 13, (uint32_t)ne, elems, ne);
	nng_exchange(sock, &sb, &sb, "echo with elements");
	cwi_strbuf_free(&sb);

	/* A handler's error comes back as an error frame: kind 1, the code
	 * where N was, the text prefixed with the listener's URL. */
	body_build(&sb, 0, "fail", 4, 0, NULL, 0);
	snprintf(text, sizeof(text), "%s: bad split 7", cwi_listener_url(s.l));
	body_build(&want, 1, text, strlen(text), CACHEW_EINVAL, NULL, 0);
	nng_exchange(sock, &sb, &want, "error frame");
	cwi_strbuf_free(&sb);
	cwi_strbuf_free(&want);

	wait_handled(&s, 3);
	ck_assert_int_eq(nng_close(sock), 0);
	for (size_t i = 0; i < ne; i++)
		cwi_element_release(elems[i]);
	srv_stop(&s);
}
END_TEST

/* A plain nng rep0 server: answers each request it receives with the
 * next prepared body, keeping what it received. */
typedef struct rep_peer {
	nng_socket sock;
	nng_msg *replies[4];
	nng_msg *got[4];
	int n;
	int served;
} rep_peer;

static void *
rep_main(void *arg)
{
	rep_peer *p = arg;

	for (int k = 0; k < p->n; k++) {
		if (nng_recvmsg(p->sock, &p->got[k], 0) != 0)
			break;
		if (nng_sendmsg(p->sock, p->replies[k], 0) != 0)
			break;
		p->replies[k] = NULL;
		p->served++;
	}
	return NULL;
}

/* An nng rep0 socket listening on transport ti's fresh URL; *url gets
 * the URL to dial (the bound port for tcp). */
static nng_socket
rep_listen(int ti, char *url, size_t len)
{
	char *want = test_url(ti);
	nng_listener lst;
	nng_socket sock;

	ck_assert_int_eq(nng_rep0_open(&sock), 0);
	nng_sock_bound(sock);
	ck_assert_int_eq(nng_listener_create(&lst, sock, want), 0);
	ck_assert_int_eq(nng_listener_start(lst, 0), 0);
	if (ti == 1) {
		int port;
		ck_assert_int_eq(nng_listener_get_int(lst,
				     NNG_OPT_TCP_BOUND_PORT, &port),
		    0);
		snprintf(url, len, "tcp://127.0.0.1:%d", port);
	} else {
		snprintf(url, len, "%s", want);
	}
	free(want);
	return sock;
}

START_TEST(test_wire_conn_calls_nng_rep_socket)
{
	static const char errtext[] = "tcp://10.0.0.5:7071: no split 9";
	cwi_element *elems[4], *answer;
	size_t ne = mk_wire_elements(elems);
	cwi_strbuf want_req, sb;
	cwi_msg *reply = NULL;
	char url[256];
	rep_peer p = {.n = 2};
	pthread_t t;
	cwi_conn *c;

	p.sock = rep_listen(_i, url, sizeof(url));
	/* Reply 0: a header and one element; reply 1: an error frame. */
	answer = mk_fixed(CACHEW_F64, 1, (int64_t[]){6}, 5);
	body_build(&sb, 0, "reply hdr", 9, 1, &answer, 1);
	p.replies[0] = nng_body_msg(&sb);
	cwi_strbuf_free(&sb);
	body_build(&sb, 1, errtext, strlen(errtext), CACHEW_ENOENT, NULL, 0);
	p.replies[1] = nng_body_msg(&sb);
	cwi_strbuf_free(&sb);
	ck_assert_int_eq(pthread_create(&t, NULL, rep_main, &p), 0);

	ck_assert_msg(cwi_dial(&c, url, NULL) == CACHEW_OK, "dial %s: %s", url,
	    cachew_errmsg());
	ck_assert_msg(cwi_conn_call(c, mk_elems("get elements", elems, ne),
			  WAIT_MS, &reply) == CACHEW_OK,
	    "call: %s", cachew_errmsg());
	assert_hdr(reply, "reply hdr");
	ck_assert_uint_eq(cwi_msg_count(reply), 1);
	ck_assert(cwi_element_equal(cwi_msg_element(reply, 0), answer));
	cwi_msg_destroy(reply);

	ck_assert_int_eq(cwi_conn_call(c, mk("x"), WAIT_MS, &reply),
	    CACHEW_ENOENT);
	ck_assert_ptr_null(reply);
	ck_assert_str_eq(cachew_errmsg(), errtext);
	pthread_join(t, NULL);
	ck_assert_int_eq(p.served, 2);

	/* What the client sent, byte for byte. */
	body_build(&want_req, 0, "get elements", 12, (uint32_t)ne, elems, ne);
	assert_body_eq(p.got[0], &want_req, "request with elements");
	cwi_strbuf_free(&want_req);
	body_build(&want_req, 0, "x", 1, 0, NULL, 0);
	assert_body_eq(p.got[1], &want_req, "header-only request");
	cwi_strbuf_free(&want_req);

	cwi_conn_destroy(c);
	for (int k = 0; k < 2; k++)
		nng_msg_free(p.got[k]);
	ck_assert_int_eq(nng_close(p.sock), 0);
	if (_i == 2)
		unlink(url + 6);
	cwi_element_release(answer);
	for (size_t i = 0; i < ne; i++)
		cwi_element_release(elems[i]);
}
END_TEST

/* ---- conformance: pipelining and back-pressure ---------------------------- */

/* The replies of test_pipelined_replies_of_very_different_sizes. */
enum { PIPE_N = 4, PIPE_MANY = 10000, PIPE_STRINGS = 50000 };

static cwi_element *
mk_short_strings(int n)
{
	cwi_element *e = cwi_element_new(1);
	const void **items = malloc((size_t)n * sizeof(*items));
	size_t *lens = malloc((size_t)n * sizeof(*lens));
	uint8_t *pool = malloc((size_t)n * 13);
	int64_t shape[1] = {n};

	ck_assert_ptr_nonnull(e);
	ck_assert(items != NULL && lens != NULL && pool != NULL);
	for (int k = 0; k < n; k++) {
		lens[k] = (size_t)(k % 13);
		for (size_t j = 0; j < lens[k]; j++)
			pool[(size_t)k * 13 + j] = (uint8_t)(k * 7 + (int)j);
		items[k] = pool + (size_t)k * 13;
	}
	ck_assert_int_eq(
	    cwi_tensor_init_bytes_list(&e->comp[0], 1, shape, items, lens),
	    CACHEW_OK);
	free(items);
	free(lens);
	free(pool);
	return e;
}

/* Takes the held request whose header is `name`: held requests arrive
 * in any order. Fails the test when none is. */
static cwi_request *
take_held_named(tsrv *s, const char *name)
{
	for (int i = 0; i < s->nheld; i++) {
		cwi_request *r;
		char *h;

		pthread_mutex_lock(&s->mtx);
		r = s->held[i];
		pthread_mutex_unlock(&s->mtx);
		if (r == NULL)
			continue;
		h = hdr_str(cwi_request_msg(r));
		if (strcmp(h, name) == 0) {
			free(h);
			return take_held(s, i);
		}
		free(h);
	}
	ck_abort_msg("no held request named \"%s\"", name);
	return NULL;
}

/* Reply k's header and elements (new references in out, *n of them). */
static const char *
pipe_reply(int k, cwi_element **out, size_t *n)
{
	*n = 0;
	switch (k) {
	case 0:
		return "a";
	case 1:
		out[(*n)++] = mk_fixed(CACHEW_U8, 1, (int64_t[]){20 << 20}, 11);
		return "twenty MiB";
	case 2:
		for (int i = 0; i < PIPE_MANY; i++)
			out[(*n)++] =
			    mk_fixed(CACHEW_U8, 1, (int64_t[]){100}, i);
		return "many small";
	default:
		out[(*n)++] = mk_short_strings(PIPE_STRINGS);
		return "short strings";
	}
}

START_TEST(test_pipelined_replies_of_very_different_sizes)
{
	static const int order[PIPE_N] = {3, 1, 0, 2};
	cwi_element **want[PIPE_N];
	size_t nwant[PIPE_N];
	const char *hwant[PIPE_N];
	bool got[PIPE_N] = {false};
	cwi_completion comp;
	cwi_conn *c;
	cwi_cq *q;
	tsrv s;

	for (int k = 0; k < PIPE_N; k++) {
		want[k] = malloc(PIPE_MANY * sizeof(cwi_element *));
		ck_assert_ptr_nonnull(want[k]);
		hwant[k] = pipe_reply(k, want[k], &nwant[k]);
	}
	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	send_holds(c, q, PIPE_N);
	wait_held(&s, PIPE_N);
	for (int j = 0; j < PIPE_N; j++) {
		int k = order[j];
		char name[32];
		cwi_request *r;

		snprintf(name, sizeof(name), "hold %d", k);
		r = take_held_named(&s, name);
		ck_assert_msg(cwi_request_reply(r, mk_elems(hwant[k], want[k],
						       nwant[k])) == CACHEW_OK,
		    "reply %d: %s", k, cachew_errmsg());
	}
	s.nheld = 0;
	for (int j = 0; j < PIPE_N; j++) {
		int k;

		ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
		ck_assert_msg(comp.err == CACHEW_OK, "completion %d: %s", j,
		    cachew_errmsg());
		ck_assert_uint_lt(comp.tag, PIPE_N);
		k = (int)comp.tag;
		ck_assert(!got[k]);
		got[k] = true;
		assert_hdr(comp.reply, hwant[k]);
		ck_assert_uint_eq(cwi_msg_count(comp.reply), nwant[k]);
		for (size_t i = 0; i < nwant[k]; i++)
			ck_assert_msg(cwi_element_equal(
					  cwi_msg_element(comp.reply, i),
					  want[k][i]),
			    "reply %d element %zu", k, i);
		cwi_msg_destroy(comp.reply);
	}
	ck_assert_uint_eq(cwi_cq_outstanding(q), 0);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	srv_stop(&s);
	for (int k = 0; k < PIPE_N; k++) {
		for (size_t i = 0; i < nwant[k]; i++)
			cwi_element_release(want[k][i]);
		free(want[k]);
	}
}
END_TEST

/* The number of requests that reached the handler so far. */
static int
held_count(tsrv *s)
{
	int n;

	pthread_mutex_lock(&s->mtx);
	n = s->nheld;
	pthread_mutex_unlock(&s->mtx);
	return n;
}

/* The window in which a request past max_inflight would have shown up
 * if back-pressure failed. Its length only makes a broken transport
 * likelier to be caught; a working one passes whatever it is. */
#define NO_MORE_MS 300

START_TEST(test_max_inflight_holds_back_further_requests)
{
	enum { N = 5 };
	cwi_transport_opts o;
	cwi_conn *c;
	cwi_cq *q;
	tsrv s;

	cwi_transport_opts_init(&o);
	o.max_inflight = 2;
	srv_start(&s, _i, &o);
	c = dial(&s);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	send_holds(c, q, N);
	wait_held(&s, 2);
	cwi_sleep_ns((uint64_t)NO_MORE_MS * 1000000u);
	ck_assert_int_eq(held_count(&s), 2);
	/* Each answer lets exactly one more in. */
	for (int i = 0; i < N; i++) {
		reply_held_with_its_header(&s, i);
		if (i + 2 < N) {
			wait_held(&s, i + 3);
			if (i == 0) {
				cwi_sleep_ns((uint64_t)NO_MORE_MS * 1000000u);
				ck_assert_int_eq(held_count(&s), 3);
			}
		}
	}
	s.nheld = 0;
	collect_hold_replies(q, N);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* Room freed by one connection's request reaches another that waits:
 * with max_inflight 1, A's request and B's first are held and both
 * links stop reading; answering them must let B's second request in,
 * although A, woken first, has nothing more to send. */
START_TEST(test_max_inflight_room_reaches_every_waiting_connection)
{
	cwi_transport_opts o;
	cwi_conn *a, *b;
	cwi_cq *q;
	tsrv s;

	cwi_transport_opts_init(&o);
	o.max_inflight = 1;
	srv_start(&s, _i, &o);
	a = dial(&s);
	b = dial(&s);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(a, mk("hold 0"), WAIT_MS, q, 0),
	    CACHEW_OK);
	wait_held(&s, 1);
	ck_assert_int_eq(cwi_conn_send(b, mk("hold 1"), WAIT_MS, q, 1),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(b, mk("hold 2"), WAIT_MS, q, 2),
	    CACHEW_OK);
	wait_held(&s, 2);
	reply_held_with_its_header(&s, 0);
	reply_held_with_its_header(&s, 1);
	wait_held(&s, 3);
	reply_held_with_its_header(&s, 2);
	s.nheld = 0;
	collect_hold_replies(q, 3);
	cwi_cq_destroy(q);
	cwi_conn_destroy(a);
	cwi_conn_destroy(b);
	srv_stop(&s);
}
END_TEST

/* ---- conformance: closing during a large reply ---------------------------- */

typedef struct big_call {
	cwi_conn *c;
	cachew_err rv;
	cwi_msg *reply;
} big_call;

static void *
big_call_main(void *arg)
{
	big_call *b = arg;

	b->rv = cwi_conn_call(b->c, mk("hold big"), 60000, &b->reply);
	return NULL;
}

/* A bound on closing a connection or a listener, which takes
 * microseconds when it works: generous, but short of the 10 s after
 * which the nng 1.5 transport gives up on a stuck nng_close (and leaks
 * the socket, nanomsg/nng#1543). */
#define CLOSE_BOUND_MS 5000

static uint64_t
ms_since(uint64_t t0_ns)
{
	return (cwi_now_ns() - t0_ns) / 1000000u;
}

/*
 * The client closes its connection from another thread right after the
 * server handed a 64 MiB reply to the transport, while it is on its way.
 * The call completes with CACHEW_ECLOSED, or, if the whole reply beat the
 * close, with that reply intact: which one depends on the scheduler, and
 * both are correct. What must not happen: a crash, a leak (valgrind), a
 * close that hangs, or a server that stops serving.
 */
START_TEST(test_conn_close_while_large_reply_in_transit)
{
	int64_t shape[1] = {(int64_t)64 << 20};
	cwi_transport_opts o;
	cwi_element *big = mk_fixed(CACHEW_U8, 1, shape, 5);
	cwi_request *r;
	big_call b = {0};
	uint64_t t0;
	pthread_t t;
	tsrv s;

	cwi_transport_opts_init(&o);
	o.max_msg_size = (size_t)80 << 20;
	srv_start(&s, _i, &o);
	ck_assert_int_eq(dial_url(&b.c, cwi_listener_url(s.l), &o), CACHEW_OK);
	ck_assert_int_eq(pthread_create(&t, NULL, big_call_main, &b), 0);
	wait_held(&s, 1);
	r = take_held(&s, 0);
	s.nheld = 0;
	ck_assert_msg(cwi_request_reply(r, mk_elems("big reply", &big, 1)) ==
		CACHEW_OK,
	    "reply: %s", cachew_errmsg());
	t0 = cwi_now_ns();
	cwi_conn_close(b.c);
	ck_assert_msg(ms_since(t0) < CLOSE_BOUND_MS,
	    "cwi_conn_close took %llu ms", (unsigned long long)ms_since(t0));
	pthread_join(t, NULL);
	ck_assert_msg(b.rv == CACHEW_ECLOSED || b.rv == CACHEW_OK, "call: %d",
	    (int)b.rv);
	if (b.rv == CACHEW_OK) {
		ck_assert_uint_eq(cwi_msg_count(b.reply), 1);
		ck_assert(cwi_element_equal(cwi_msg_element(b.reply, 0), big));
		cwi_msg_destroy(b.reply);
	} else {
		ck_assert_ptr_null(b.reply);
	}
	cwi_conn_destroy(b.c);
	/* The server serves the next client, and both close promptly. */
	t0 = cwi_now_ns();
	assert_served(&s, "echo next");
	srv_stop(&s);
	ck_assert_msg(ms_since(t0) < CLOSE_BOUND_MS,
	    "next client and listener close took %llu ms",
	    (unsigned long long)ms_since(t0));
	cwi_element_release(big);
}
END_TEST

/* ---- hostile raw peers on tcp:// and ipc:// -------------------------------- */

/* A raw peer that speaks the protocol right: handshake as req0, one echo
 * request, its reply checked byte for byte. Proves the raw helpers and
 * the framing (the hostile tests below only differ in one thing). */
START_TEST(test_wire_raw_peer_echo_matches_framing)
{
	uint8_t req[64];
	size_t len;
	tsrv s;

	srv_start(&s, _i, NULL);
	len = raw_request(req, sizeof(req), 0x80000007u, "echo raw");
	/* The reply carries the request's ID, then the same body. */
	raw_assert_echoed(cwi_listener_url(s.l), req, len);
	srv_stop(&s);
}
END_TEST

/* A request that came through an SP device carries one word per hop
 * before its request id (the backtrace; the id is the first word with the
 * high bit set). The reply must carry the whole backtrace back, as rep0
 * does, so that the devices can route it. */
START_TEST(test_wire_backtrace_of_2_hops_is_echoed)
{
	uint8_t req[64];
	size_t len;
	tsrv s;

	srv_start(&s, _i, NULL);
	put_be32(req, 0x00000005u); /* the device's pipe id */
	len = 4 + raw_request(req + 4, sizeof(req) - 4, 0x80000009u, "echo hop");
	raw_assert_echoed(cwi_listener_url(s.l), req, len);
	wait_handled(&s, 1);
	srv_stop(&s);
}
END_TEST

START_TEST(test_hostile_wrong_protocol_id_is_closed)
{
	/* A pair0 peer (0x10), a pub0 peer (0x20) and a second rep0
	 * (0x31): none may talk to a rep listener. */
	static const uint8_t ids[3] = {0x10, 0x20, SP_REP0};
	cwi_conn *good;
	tsrv s;

	srv_start(&s, _i, NULL);
	good = dial(&s);
	call_ok(good, "echo before", "echo before");
	for (int k = 0; k < 3; k++) {
		int fd = raw_connect_sp(cwi_listener_url(s.l), ids[k]);
		raw_send_msg(fd, _i == 2, 0x80000001u, "echo");
		ck_assert_msg(closed_by_server(fd), "protocol 0x%02x", ids[k]);
		close(fd);
	}
	wait_handled(&s, 1);
	call_ok(good, "echo after", "echo after");
	cwi_conn_destroy(good);
	srv_stop(&s);
}
END_TEST

/* A body one byte over max_msg_size, sent in full: refused (at the
 * length or after the bytes), the handler never sees it, the server
 * keeps serving. */
START_TEST(test_hostile_body_over_max_msg_size_is_closed)
{
	const size_t max = (size_t)1 << 20;
	size_t len = 4 + max + 1;
	uint8_t *msg = calloc(1, len);
	cwi_conn *good;
	long before;
	tsrv s;

	srv_start_limited(&s, _i, max);
	ck_assert_ptr_nonnull(msg);
	/* A well-formed echo request but for its size: header fills it. */
	put_be32(msg, 0x80000001u);
	msg[4] = 'C', msg[5] = 'W', msg[6] = 1, msg[7] = 0;
	put_be32(msg + 8, (uint32_t)(max + 1 - FRAME_HEAD_BYTES));
	memcpy(msg + 4 + FRAME_HEAD_BYTES, "echo", 4);
	good = dial(&s);
	before = rss_kib();
	for (int k = 0; k < 4; k++) {
		int fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
		raw_send_sp(fd, _i == 2, msg, len);
		ck_assert_msg(closed_by_server(fd), "attempt %d", k);
		close(fd);
	}
	assert_rss_bounded(before);
	assert_unharmed(&s, good);
	free(msg);
	srv_stop(&s);
}
END_TEST

/* A length field past the receive bound of docs/protocol.md (limits,
 * step 1: max_msg_size + max_msg_size/8 + 64) with no bytes after it: the
 * server closes at once, without waiting for (or allocating) the body. */
START_TEST(test_hostile_length_past_bound_closed_before_body)
{
	const size_t max = (size_t)1 << 20;
	cwi_conn *good;
	long before;
	tsrv s;

	srv_start_limited(&s, _i, max);
	good = dial(&s);
	before = rss_kib();
	for (int k = 0; k < 8; k++) {
		int fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
		/* k = 0: just past the bound; then ever larger claims. */
		raw_send_length(fd, _i == 2,
		    (uint64_t)(max + max / 8 + 64 + 1) << (4 * k));
		ck_assert_msg(closed_by_server(fd), "attempt %d", k);
		close(fd);
	}
	assert_rss_bounded(before);
	assert_unharmed(&s, good);
	srv_stop(&s);
}
END_TEST

/* A request whose 4-byte ID lacks the high bit and whose body has none
 * either (no word could end a backtrace): the peer is closed, the
 * handler never sees it. */
START_TEST(test_hostile_request_id_without_high_bit_is_closed)
{
	cwi_conn *good;
	tsrv s;
	int fd;

	srv_start(&s, _i, NULL);
	good = dial(&s);
	fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
	raw_send_msg(fd, _i == 2, 0x00000001u, "echo");
	ck_assert(closed_by_server(fd));
	close(fd);
	assert_unharmed(&s, good);
	srv_stop(&s);
}
END_TEST

/* A backtrace of 9 hops (IDs without the high bit) before a proper ID
 * and body: more than the 8 hops SP allows, and more than the one ID a
 * cachew client sends. The request is never handled. */
START_TEST(test_hostile_backtrace_of_9_hops_is_closed)
{
	uint8_t msg[128], *got;
	size_t len = 0;
	bool answered;
	cwi_conn *good;
	tsrv s;
	int fd;

	srv_start(&s, _i, NULL);
	good = dial(&s);
	for (uint32_t hop = 0; hop < 9; hop++) {
		put_be32(msg + len, hop + 1);
		len += 4;
	}
	len += raw_request(msg + len, sizeof(msg) - len, 0x80000001u, "echo");
	fd = raw_connect_req(cwi_listener_url(s.l));
	raw_send_sp(fd, _i == 2, msg, len);
	/* Then a proper request on the same connection: the server must
	 * close the connection instead of answering it. */
	raw_send_msg(fd, _i == 2, 0x80000002u, "echo ok");
	got = raw_recv_sp(fd, _i == 2, &len);
	answered = got != NULL;
	free(got);
	close(fd);
	ck_assert_msg(!answered, "the connection stayed open (%zu-byte "
				 "reply)",
	    len);
	assert_unharmed(&s, good);
	srv_stop(&s);
}
END_TEST

/* A peer that sends a request and goes away before the reply: answering
 * it later is CACHEW_OK (sent into the void) or CACHEW_ECLOSED (the
 * transport knew), as transport.h allows, and nothing else breaks. */
START_TEST(test_hostile_peer_gone_before_reply)
{
	cwi_conn *good;
	cwi_msg *out;
	cachew_err rv;
	tsrv s;
	int fd;

	srv_start(&s, _i, NULL);
	good = dial(&s);
	fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
	raw_send_msg(fd, _i == 2, 0x80000001u, "hold raw");
	wait_held(&s, 1);
	close(fd);
	/* The server keeps serving while it holds the orphan. */
	ck_assert_int_eq(cwi_conn_call(good, mk("echo between"), WAIT_MS, &out),
	    CACHEW_OK);
	cwi_msg_destroy(out);
	out = mk("late");
	rv = cwi_request_reply(take_held(&s, 0), out);
	s.nheld = 0;
	ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_ECLOSED, "reply: %d %s",
	    (int)rv, cachew_errmsg());
	if (rv != CACHEW_OK)
		cwi_msg_destroy(out);
	call_ok(good, "echo still here", "echo still here");
	cwi_conn_destroy(good);
	srv_stop(&s);
}
END_TEST

/* A handshake whose reserved bytes (6 and 7) are not zero: closed. */
START_TEST(test_hostile_handshake_reserved_bytes_is_closed)
{
	static const uint8_t hs[8] = {0, 'S', 'P', 0, 0x00, SP_REQ0, 0, 1};
	tsrv s;
	int fd;

	srv_start(&s, _i, NULL);
	fd = raw_connect(cwi_listener_url(s.l));
	send_all(fd, hs, sizeof(hs));
	raw_send_msg(fd, _i == 2, 0x80000001u, "echo");
	ck_assert(closed_by_server(fd));
	close(fd);
	assert_unharmed(&s, NULL);
	srv_stop(&s);
}
END_TEST

/* IPC frames start with the message type 1; any other is closed. */
START_TEST(test_hostile_ipc_message_type_not_1_is_closed)
{
	uint8_t req[64], head[9];
	size_t len;
	tsrv s;
	int fd;

	srv_start(&s, 2, NULL);
	fd = raw_connect_sp(cwi_listener_url(s.l), SP_REQ0);
	len = raw_request(req, sizeof(req), 0x80000001u, "echo");
	head[0] = 2;
	put_be64(head + 1, len);
	send_all(fd, head, sizeof(head));
	send_all(fd, req, len);
	ck_assert(closed_by_server(fd));
	close(fd);
	assert_unharmed(&s, NULL);
	srv_stop(&s);
}
END_TEST

/* ---- a raw server: what cwi_dial's side sends and accepts ---------------- */

/*
 * Binds fd to ss: 0, or the errno. An ipc path held by a socket file that
 * nobody listens on is taken over, as nng's ipc listener does: test_url's
 * paths carry the pid, and pids come round (pid_max is 32768) onto the
 * files of runs killed mid-test (/tmp held 22 such), where bind fails with
 * EADDRINUSE. A path someone listens on is left alone.
 */
static int
raw_bind(int fd, const struct sockaddr_storage *ss, socklen_t sl)
{
	const char *path = ((const struct sockaddr_un *)ss)->sun_path;
	int probe, err;

	if (bind(fd, (const struct sockaddr *)ss, sl) == 0)
		return 0;
	if (errno != EADDRINUSE || ss->ss_family != AF_UNIX)
		return errno;
	/* Non-blocking: a listener with a full backlog is not waited for. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
	ck_assert_int_ge(probe, 0);
	err = connect(probe, (const struct sockaddr *)ss, sl) == 0 ? EADDRINUSE
								 : errno;
	close(probe);
	if (err != ECONNREFUSED)
		return EADDRINUSE;
	if (unlink(path) != 0 && errno != ENOENT)
		return errno;
	return bind(fd, (const struct sockaddr *)ss, sl) == 0 ? 0 : errno;
}

/* A raw stream listener on transport ti (loopback tcp, ephemeral port,
 * or a fresh ipc path); *url gets the URL to dial. */
static int
raw_listen(int ti, char *url, size_t len)
{
	char *want = test_url(ti);
	struct sockaddr_storage ss;
	socklen_t sl = raw_addr(want, &ss);
	int fd = socket(ss.ss_family, SOCK_STREAM, 0), err;

	ck_assert_int_ge(fd, 0);
	err = raw_bind(fd, &ss, sl);
	ck_assert_msg(err == 0, "bind %s: %s", want, strerror(err));
	if (ti == 1) {
		ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &sl), 0);
		snprintf(url, len, "tcp://127.0.0.1:%u",
		    ntohs(((struct sockaddr_in *)&ss)->sin_port));
	} else {
		snprintf(url, len, "%s", want);
	}
	free(want);
	ck_assert_int_eq(listen(fd, 8), 0);
	return fd;
}

static void
raw_unlisten(int lfd, const char *url)
{
	close(lfd);
	if (strncmp(url, "ipc://", 6) == 0)
		unlink(url + 6);
}

/* A peer that accepts and hangs up at once (or speaks another protocol)
 * is redialed with backoff, as a refused dial is, not in a tight loop:
 * reconnect_min_ms 100 doubling to 400 allows about 5 connections in a
 * second; without backoff there were thousands. */
START_TEST(test_peer_hanging_up_at_once_is_redialed_with_backoff)
{
	cwi_transport_opts o;
	char url[256];
	uint64_t end;
	int lfd, accepted = 0;
	cwi_conn *c;

	lfd = raw_listen(_i, url, sizeof(url));
	cwi_transport_opts_init(&o);
	o.dial_async = true;
	o.reconnect_min_ms = 100;
	o.reconnect_max_ms = 400;
	ck_assert_int_eq(cwi_dial(&c, url, &o), CACHEW_OK);
	end = cwi_now_ns() + 1000000000u;
	while (cwi_now_ns() < end) {
		struct pollfd pf = {.fd = lfd, .events = POLLIN};
		if (poll(&pf, 1, 50) == 1) {
			int fd = accept(lfd, NULL, NULL);
			if (fd >= 0) {
				accepted++;
				close(fd);
			}
		}
	}
	cwi_conn_destroy(c);
	raw_unlisten(lfd, url);
	ck_assert_int_ge(accepted, 1);
	ck_assert_msg(accepted <= 12, "%d connections in 1 s", accepted);
}
END_TEST

/* Accepts the client's connection (bounded) and does the rep side of
 * the handshake, checking that the client announced req0. */
static int
raw_accept_req(int lfd)
{
	struct pollfd pf = {.fd = lfd, .events = POLLIN};
	uint8_t hs[8];
	int fd;

	ck_assert_int_eq(poll(&pf, 1, WAIT_MS), 1);
	fd = accept(lfd, NULL, NULL);
	ck_assert_int_ge(fd, 0);
	sp_header(hs, SP_REP0);
	send_all(fd, hs, sizeof(hs));
	raw_expect_sp_header(fd, SP_REQ0);
	return fd;
}

/* Reads one request on a raw server connection and checks that it is
 * a request ID with the high bit set, then the body of a header-only
 * message with header `hdr`; returns the ID. */
static uint32_t
raw_read_request(int fd, bool ipc, const char *hdr)
{
	uint8_t want[64], *got;
	size_t len, wlen;
	uint32_t id;

	got = raw_recv_sp(fd, ipc, &len);
	ck_assert_ptr_nonnull(got);
	wlen = raw_request(want, sizeof(want), 0, hdr);
	ck_assert_uint_eq(len, wlen);
	id = (uint32_t)got[0] << 24 | (uint32_t)got[1] << 16 |
	     (uint32_t)got[2] << 8 | got[3];
	ck_assert_msg(id & 0x80000000u, "request id %08x", id);
	ck_assert_int_eq(memcmp(got + 4, want + 4, len - 4), 0);
	free(got);
	return id;
}

/* The raw server's side of one exchange: reads the header-only request
 * `hdr` and answers it with header `reply`. */
static void
raw_answer(int fd, bool ipc, const char *hdr, const char *reply)
{
	raw_send_msg(fd, ipc, raw_read_request(fd, ipc, hdr), reply);
}

/* Waits for the next completion on q, which must be request `tag`'s and
 * a success; returns its reply (cwi_msg_destroy). */
static cwi_msg *
cq_wait_ok(cwi_cq *q, uint64_t tag)
{
	cwi_completion comp;

	ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
	ck_assert_msg(comp.err == CACHEW_OK, "%s", cachew_errmsg());
	ck_assert_uint_eq(comp.tag, tag);
	return comp.reply;
}

/* A reply carrying the ID of no request in flight (a late reply to one
 * that timed out looks like that) is dropped; the connection stays and
 * the right reply completes the request. */
START_TEST(test_wire_reply_with_unknown_id_is_dropped)
{
	bool ipc = _i == 2;
	cwi_transport_opts o;
	cwi_msg *reply;
	char url[256];
	uint32_t id;
	cwi_conn *c;
	cwi_cq *q;
	int lfd, fd;

	lfd = raw_listen(_i, url, sizeof(url));
	cwi_transport_opts_init(&o);
	o.dial_async = true; /* the raw server answers after cwi_dial */
	ck_assert_int_eq(cwi_dial(&c, url, &o), CACHEW_OK);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(c, mk("ask"), WAIT_MS, q, 1), CACHEW_OK);
	fd = raw_accept_req(lfd);
	id = raw_read_request(fd, ipc, "ask");
	raw_send_msg(fd, ipc, id ^ 0x1234u, "wrong");
	raw_send_msg(fd, ipc, id, "right");
	reply = cq_wait_ok(q, 1);
	assert_hdr(reply, "right");
	cwi_msg_destroy(reply);
	/* The same connection carries the next request. */
	ck_assert_int_eq(cwi_conn_send(c, mk("again"), WAIT_MS, q, 2),
	    CACHEW_OK);
	raw_answer(fd, ipc, "again", "fine");
	cwi_msg_destroy(cq_wait_ok(q, 2));
	ck_assert_uint_eq(cwi_cq_outstanding(q), 0);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	close(fd);
	raw_unlisten(lfd, url);
}
END_TEST

/* A server that answers with a length field claiming 8 GiB: the client
 * closes that connection without allocating, the request completes with
 * CACHEW_ECLOSED, and the connection redials by itself and serves the
 * next request. */
START_TEST(test_hostile_server_8gib_reply_length_resets_client)
{
	bool ipc = _i == 2;
	cwi_transport_opts o;
	cwi_completion comp;
	char url[256];
	long before;
	cwi_conn *c;
	cwi_cq *q;
	int lfd, fd;

	lfd = raw_listen(_i, url, sizeof(url));
	cwi_transport_opts_init(&o);
	o.dial_async = true;
	o.max_msg_size = (size_t)1 << 20;
	o.reconnect_min_ms = 10;
	o.reconnect_max_ms = 100;
	ck_assert_int_eq(cwi_dial(&c, url, &o), CACHEW_OK);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	before = rss_kib();
	ck_assert_int_eq(cwi_conn_send(c, mk("ask"), WAIT_MS, q, 1), CACHEW_OK);
	fd = raw_accept_req(lfd);
	(void)raw_read_request(fd, ipc, "ask");
	raw_send_length(fd, ipc, (uint64_t)8 << 30);
	ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
	ck_assert_uint_eq(comp.tag, 1);
	ck_assert_int_eq(comp.err, CACHEW_ECLOSED);
	ck_assert(closed_by_server(fd)); /* here: by the client */
	close(fd);
	assert_rss_bounded(before);
	/* Redialed: the next request arrives on a new connection. */
	ck_assert_int_eq(cwi_conn_send(c, mk("again"), WAIT_MS, q, 2),
	    CACHEW_OK);
	fd = raw_accept_req(lfd);
	raw_answer(fd, ipc, "again", "fine");
	cwi_msg_destroy(cq_wait_ok(q, 2));
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	close(fd);
	raw_unlisten(lfd, url);
}
END_TEST

/* ---- TLS: mutual authentication and refusals ------------------------------ */

/* Listens on tls+tcp://127.0.0.1:0 with the TLS fixture's cert and key and, past
 * none, client certificates checked against ca.pem. */
static void
tls_srv_start(tsrv *s, const char *cert, const char *key,
    cwi_tls_client_auth auth)
{
	cwi_transport_opts o;

	cwi_transport_opts_init(&o);
	o.tls_cert = cwt_tls_file(cert);
	o.tls_key = cwt_tls_file(key);
	o.tls_client_auth = auth;
	if (auth != CWI_TLS_CLIENT_AUTH_NONE)
		o.tls_ca = cwt_tls_file("ca.pem");
	srv_start_at(s, "tls+tcp://127.0.0.1:0", &o);
}

/* Client options: dial_async (as the service dials), ca.pem, and a
 * certificate when cert is not NULL. */
static cwi_transport_opts
tls_client_opts(const char *cert, const char *key)
{
	cwi_transport_opts o;

	cwi_transport_opts_init(&o);
	o.dial_async = true;
	o.tls_ca = cwt_tls_file("ca.pem");
	if (cert != NULL) {
		o.tls_cert = cwt_tls_file(cert);
		o.tls_key = cwt_tls_file(key);
	}
	return o;
}

/* A refusal must end a call well before any timeout: this bound only
 * catches a hang (the refusal takes milliseconds on loopback). Scaled
 * like WAIT_MS, which it stays half of: under valgrind the test process
 * runs each TLS handshake (the link's, then the diagnosis's) tens of
 * times slower, and a fixed 5 s failed 6 runs in 6 at load 12 (the
 * refusal came after 10.7 s), while a call that waits for its timeout
 * still fails it. */
#define REFUSAL_BOUND_MS cwt_bound_ms(5000)

/*
 * Calls "echo" on a new connection to url, which the peer refuses: the
 * call fails with CACHEW_EAUTH within REFUSAL_BOUND_MS, and so does a
 * second one (the refusal lasts while no link works). Returns the first
 * message (free it).
 */
static char *
refused_call(const char *url, const cwi_transport_opts *o)
{
	cwi_msg *reply = NULL;
	cwi_conn *c;
	cachew_err rv;
	uint64_t t0;
	char *msg;

	ck_assert_msg(cwi_dial(&c, url, o) == CACHEW_OK, "dial %s: %s", url,
	    cachew_errmsg());
	t0 = cwt_now_ms();
	rv = cwi_conn_call(c, mk("echo"), WAIT_MS, &reply);
	ck_assert_msg(rv == CACHEW_EAUTH, "%s: %s", cachew_strerror(rv),
	    cachew_errmsg());
	ck_assert_uint_lt(cwt_now_ms() - t0, (uint64_t)REFUSAL_BOUND_MS);
	msg = strdup(cachew_errmsg());
	t0 = cwt_now_ms();
	rv = cwi_conn_call(c, mk("echo again"), WAIT_MS, &reply);
	ck_assert_msg(rv == CACHEW_EAUTH, "%s: %s", cachew_strerror(rv),
	    cachew_errmsg());
	ck_assert_uint_lt(cwt_now_ms() - t0, (uint64_t)REFUSAL_BOUND_MS);
	cwi_conn_destroy(c);
	return msg;
}

/* Fails the test unless msg names url and holds `reason`. */
static void
assert_names(const char *msg, const char *url, const char *reason)
{
	ck_assert_msg(strstr(msg, url) != NULL, "'%s' does not name %s", msg,
	    url);
	ck_assert_msg(strstr(msg, reason) != NULL, "'%s' does not say '%s'",
	    msg, reason);
}

/* Dials s with a client certificate (o), and calls "echo" and
 * call_echo_elements on the connection: all must come back equal. */
static void
tls_echo_all(const tsrv *s, const cwi_transport_opts *o)
{
	cwi_element *sent[16];
	cwi_msg *reply;
	cwi_conn *c;
	size_t n;

	ck_assert_msg(cwi_dial(&c, cwi_listener_url(s->l), o) == CACHEW_OK,
	    "dial: %s", cachew_errmsg());
	call_ok(c, "echo mutual", "echo mutual");
	reply = call_echo_elements(c, sent, &n);
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(cwi_element_equal(cwi_msg_element(reply, i),
				  sent[i]), "element %zu", i);
		cwi_element_release(sent[i]);
	}
	cwi_msg_destroy(reply);
	cwi_conn_destroy(c);
}

START_TEST(test_tls_mutual_auth_required_and_satisfied)
{
	cwi_transport_opts o = tls_client_opts("client.pem", "client.key");
	tsrv s;

	tls_srv_start(&s, "server.pem", "server.key",
	    CWI_TLS_CLIENT_AUTH_REQUIRED);
	tls_echo_all(&s, &o);
	srv_stop(&s);
}
END_TEST

/*
 * Starts s on TLS with cert and key asking for client certificates as
 * auth says, and checks that a client with o is refused (refused_call)
 * with a message naming s and saying `reason`, and that s logs `log`
 * (unless NULL). s keeps running (srv_stop it).
 */
static void
assert_tls_refused(tsrv *s, const char *cert, const char *key,
    cwi_tls_client_auth auth, const cwi_transport_opts *o,
    const char *reason, const char *log)
{
	char *msg;

	log_start();
	tls_srv_start(s, cert, key, auth);
	msg = refused_call(cwi_listener_url(s->l), o);
	assert_names(msg, cwi_listener_url(s->l), reason);
	if (log != NULL)
		ck_assert_msg(log_wait(log), "the log lacks '%s': %s", log,
		    log_buf);
	free(msg);
	log_stop();
}

START_TEST(test_tls_server_certificate_of_another_ca_is_refused)
{
	cwi_transport_opts o = tls_client_opts(NULL, NULL);
	char *reason = cwt_fmt("the server's certificate 'CN=localhost' "
			       "(issuer 'CN=cachew-other-ca') is not signed by "
			       "a CA in tls_ca '%s'", cwt_tls_file("ca.pem"));
	tsrv s;

	assert_tls_refused(&s, "other-server.pem", "other-server.key",
	    CWI_TLS_CLIENT_AUTH_NONE, &o, reason,
	    "the client refused our certificate");
	free(reason);
	srv_stop(&s);
}
END_TEST

START_TEST(test_tls_server_name_not_in_certificate_is_refused)
{
	cwi_transport_opts o = tls_client_opts(NULL, NULL);
	tsrv s;

	o.tls_server_name = "data.example.org";
	assert_tls_refused(&s, "server.pem", "server.key",
	    CWI_TLS_CLIENT_AUTH_NONE, &o,
	    "the server's certificate 'CN=localhost' is not issued for "
	    "'data.example.org' (set tls_server_name", NULL);
	srv_stop(&s);
}
END_TEST

START_TEST(test_tls_missing_client_certificate_is_refused)
{
	cwi_transport_opts o = tls_client_opts(NULL, NULL);
	cwi_conn *c;
	tsrv s;

	assert_tls_refused(&s, "server.pem", "server.key",
	    CWI_TLS_CLIENT_AUTH_REQUIRED, &o,
	    "the listener requires a client certificate: set tls_cert and "
	    "tls_key", "the client sent no certificate");
	/* A client with a certificate is served meanwhile. */
	o = tls_client_opts("client.pem", "client.key");
	ck_assert_int_eq(cwi_dial(&c, cwi_listener_url(s.l), &o), CACHEW_OK);
	call_ok(c, "echo still", "echo still");
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

START_TEST(test_tls_client_certificate_of_another_ca_is_refused)
{
	cwi_transport_opts o = tls_client_opts("other-server.pem",
	    "other-server.key");
	char *reason = cwt_fmt("the listener refused our certificate "
			       "'CN=localhost' (tls_cert '%s')",
	    cwt_tls_file("other-server.pem"));
	tsrv s;

	assert_tls_refused(&s, "server.pem", "server.key",
	    CWI_TLS_CLIENT_AUTH_REQUIRED, &o, reason,
	    "one that tls_ca does not trust");
	free(reason);
	srv_stop(&s);
}
END_TEST

/* An nng rep0 socket on tls+tcp://127.0.0.1:0 serving cert (with
 * server.key): a peer whose certificate cachew itself would not load. */
static nng_socket
nng_tls_rep(const char *cert, char *url, size_t len)
{
	nng_tls_config *cfg;
	nng_listener l;
	nng_socket rep;
	char *pem = cwt_slurp(cwt_tls_file(cert));
	char *key = cwt_slurp(cwt_tls_file("server.key"));
	int port;

	ck_assert_ptr_nonnull(pem);
	ck_assert_ptr_nonnull(key);
	ck_assert_int_eq(nng_rep0_open(&rep), 0);
	ck_assert_int_eq(nng_listener_create(&l, rep, "tls+tcp://127.0.0.1:0"),
	    0);
	ck_assert_int_eq(nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER), 0);
	ck_assert_int_eq(nng_tls_config_own_cert(cfg, pem, key, NULL), 0);
	ck_assert_int_eq(nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg), 0);
	nng_tls_config_free(cfg);
	ck_assert_int_eq(nng_listener_start(l, 0), 0);
	ck_assert_int_eq(nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT,
			     &port), 0);
	snprintf(url, len, "tls+tcp://127.0.0.1:%d", port);
	free(pem);
	free(key);
	return rep;
}

START_TEST(test_tls_expired_server_certificate_is_refused)
{
	cwi_transport_opts o = tls_client_opts(NULL, NULL);
	char url[64], *msg;
	nng_socket rep = nng_tls_rep("server-expired.pem", url, sizeof(url));

	msg = refused_call(url, &o);
	assert_names(msg, url, "the server's certificate 'CN=localhost' "
			       "expired on ");
	free(msg);
	nng_close(rep);
}
END_TEST

START_TEST(test_tls_expired_own_certificate_is_refused_at_listen_and_dial)
{
	cwi_transport_opts o;
	cwi_listener *l = NULL;
	cwi_conn *c = NULL;
	tsrv s;

	cwi_transport_opts_init(&o);
	o.tls_cert = cwt_tls_file("server-expired.pem");
	o.tls_key = cwt_tls_file("server.key");
	ck_assert_int_eq(cwi_listen(&l, "tls+tcp://127.0.0.1:0", &o, handler,
			     NULL),
	    CACHEW_EAUTH);
	ck_assert_ptr_null(l);
	assert_names(cachew_errmsg(), "tls+tcp://127.0.0.1:0",
	    "the certificate 'CN=localhost' expired on ");
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), o.tls_cert));
	srv_start(&s, TLS_T, NULL);
	o = tls_client_opts("client-expired.pem", "client.key");
	ck_assert_int_eq(cwi_dial(&c, cwi_listener_url(s.l), &o),
	    CACHEW_EAUTH);
	ck_assert_ptr_null(c);
	assert_names(cachew_errmsg(), cwi_listener_url(s.l),
	    "the certificate 'CN=cachew-test-client' expired on ");
	srv_stop(&s);
}
END_TEST

START_TEST(test_tls_plaintext_client_on_tls_listener_is_refused)
{
	cwi_transport_opts o;
	char *msg, *plain, *want;
	tsrv s;

	log_start();
	srv_start(&s, TLS_T, NULL);
	plain = strdup(cwi_listener_url(s.l) + 4); /* tcp://... */
	cwi_transport_opts_init(&o);
	o.dial_async = true;
	msg = refused_call(plain, &o);
	want = cwt_fmt("the listener speaks TLS: dial %s", cwi_listener_url(s.l));
	assert_names(msg, plain, want);
	ck_assert(log_wait("does not speak TLS (a tcp:// dialer?)"));
	free(want);
	free(plain);
	free(msg);
	log_stop();
	srv_stop(&s);
}
END_TEST

START_TEST(test_tls_client_on_plaintext_listener_is_refused)
{
	cwi_transport_opts o = tls_client_opts(NULL, NULL);
	char *msg, *tls;
	tsrv s;

	log_start();
	srv_start(&s, 1, NULL);
	tls = cwt_fmt("tls+%s", cwi_listener_url(s.l));
	msg = refused_call(tls, &o);
	assert_names(msg, tls, "the listener does not speak TLS (a plaintext "
			       "tcp:// listener): dial it with tcp://");
	ck_assert(log_wait("the peer speaks TLS (a tls+tcp:// dialer?)"));
	free(tls);
	free(msg);
	log_stop();
	srv_stop(&s);
}
END_TEST

START_TEST(test_tls_credentials_are_checked_at_listen_and_dial)
{
	const char *url = "tls+tcp://127.0.0.1:0";
	cwi_transport_opts o;
	cwi_listener *l = NULL;
	cwi_conn *c = NULL;

	ck_assert_int_eq(cwi_listen(&l, url, NULL, handler, NULL),
	    CACHEW_EINVAL);
	assert_names(cachew_errmsg(), url, "a TLS listener needs its "
					   "certificate and key");
	ck_assert_int_eq(cwi_dial(&c, "tls+tcp://127.0.0.1:1", NULL),
	    CACHEW_EINVAL);
	assert_names(cachew_errmsg(), "tls+tcp://127.0.0.1:1", "set tls_ca");
	cwi_transport_opts_init(&o);
	o.tls_cert = cwt_tls_file("server.pem");
	o.tls_key = cwt_tls_file("client.key");
	ck_assert_int_eq(cwi_listen(&l, url, &o, handler, NULL), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "is not the key of "
						      "tls_cert"));
	o.tls_key = cwt_tls_file("no-such.key");
	ck_assert_int_eq(cwi_listen(&l, url, &o, handler, NULL), CACHEW_ENOENT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), o.tls_key));
	o.tls_key = cwt_tls_file("server.key");
	o.tls_client_auth = CWI_TLS_CLIENT_AUTH_REQUIRED;
	ck_assert_int_eq(cwi_listen(&l, url, &o, handler, NULL), CACHEW_EINVAL);
	assert_names(cachew_errmsg(), url, "tls_client_auth=required needs "
					   "tls_ca");
	o.tls_ca = cwt_tls_file("server.key"); /* a key is no CA */
	ck_assert_int_eq(cwi_listen(&l, url, &o, handler, NULL), CACHEW_EINVAL);
	assert_names(cachew_errmsg(), o.tls_ca, "tls_ca");
	ck_assert_ptr_null(l);
	ck_assert_ptr_null(c);
}
END_TEST

/* Which TLS layer this process's next listens and dials take
 * (transports/nng/nng_tls.c): "cachew" (its own record layer, the
 * default), "nng" (nng's TLS streams on the engine cachew registers,
 * OpenSSL) or "mbedtls" (nng's streams on nng's mbedTLS engine). */
static void
tls_layer_set(const char *layer)
{
	ck_assert_int_eq(unsetenv("CACHEW_TLS_LAYER"), 0);
	ck_assert_int_eq(unsetenv("CACHEW_TLS_ENGINE"), 0);
	if (strcmp(layer, "nng") == 0)
		ck_assert_int_eq(setenv("CACHEW_TLS_LAYER", "nng", 1), 0);
	else if (strcmp(layer, "mbedtls") == 0)
		ck_assert_int_eq(setenv("CACHEW_TLS_ENGINE", "mbedtls", 1), 0);
}

/*
 * cachew's record layer and nng's TLS streams (on mbedTLS, and on the
 * OpenSSL engine) talk to each other whichever listens, with mutual TLS:
 * every element comes back equal, an 8 MiB one (records and send batches
 * cut across it) and empty ones. The mbedTLS pairs go first: once this
 * process registers the OpenSSL engine, nng's streams keep it.
 */
START_TEST(test_tls_layers_interoperate_both_ways)
{
	/* listener, dialer, what the listener logs */
	static const char *const pairs[][3] = {
	    {"cachew", "mbedtls", "layer=cachew engine=openssl"},
	    {"mbedtls", "cachew", "layer=nng engine="},
	    {"cachew", "nng", "layer=cachew engine=openssl"},
	    {"nng", "cachew", "layer=nng engine=cachew-openssl"},
	};
	cwi_transport_opts o = tls_client_opts("client.pem", "client.key");
	tsrv s;

	for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
		log_buf[0] = '\0';
		log_level = CACHEW_LOG_INFO;
		cachew_log_set(log_sink, NULL, CACHEW_LOG_INFO);
		tls_layer_set(pairs[p][0]);
		tls_srv_start(&s, "server.pem", "server.key",
		    CWI_TLS_CLIENT_AUTH_REQUIRED);
		ck_assert_msg(log_wait(pairs[p][2]), "listener on %s: %s",
		    pairs[p][0], log_buf);
		tls_layer_set(pairs[p][1]);
		tls_echo_all(&s, &o);
		srv_stop(&s);
		log_stop();
		log_level = CACHEW_LOG_WARN;
	}
	tls_layer_set("cachew");
}
END_TEST

/* A peer that speaks TLS itself over a raw socket connected to a
 * tls+tcp:// url: its handshake done (the server's certificate taken on
 * trust) and its SP header sent, the socket (*fd) free for forged
 * bytes. Reads on it give up after WAIT_MS. */
static SSL *
raw_tls_client(const char *url, int *fd)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	struct timeval tv = {.tv_sec = WAIT_MS / 1000};
	uint8_t h[8];
	SSL *ssl;

	ck_assert_ptr_nonnull(ctx);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	ck_assert_int_eq(SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION),
	    1);
	*fd = raw_connect(url + 4); /* tcp://... */
	ck_assert_int_eq(setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv,
			     sizeof(tv)), 0);
	ssl = SSL_new(ctx);
	SSL_CTX_free(ctx); /* ssl holds it */
	ck_assert_ptr_nonnull(ssl);
	ck_assert_int_eq(SSL_set_fd(ssl, *fd), 1);
	ck_assert_int_eq(SSL_connect(ssl), 1);
	sp_header(h, SP_REQ0);
	ck_assert_int_eq(SSL_write(ssl, h, sizeof(h)), (int)sizeof(h));
	return ssl;
}

/* Sends len forged bytes on a TLS connection to s (raw_tls_client), or
 * with bytes NULL asks for a renegotiation, and checks that s resets it,
 * logging that it refused a record for `reason`. */
static void
assert_forged_record_resets(const tsrv *s, const uint8_t *bytes, size_t len,
    const char *reason)
{
	char want[160];
	SSL *ssl;
	int fd;

	log_start();
	ssl = raw_tls_client(cwi_listener_url(s->l), &fd);
	if (bytes != NULL) {
		send_all(fd, bytes, len);
	} else {
		ck_assert_int_eq(SSL_renegotiate(ssl), 1);
		(void)SSL_do_handshake(ssl); /* refused: an error */
	}
	ck_assert(closed_by_server(fd));
	snprintf(want, sizeof(want), "reason=\"TLS record refused: %s",
	    reason);
	ck_assert_msg(log_wait(want), "%s", log_buf);
	log_stop();
	SSL_free(ssl);
	close(fd);
}

/*
 * cachew's record layer takes the records a peer sends as hostile input:
 * a record whose authentication tag does not verify, a record header
 * claiming more than any record may hold (refused from the header alone,
 * its body never sent), and a renegotiation properly sealed each reset
 * their sender with a logged reason; the listener serves everyone else
 * meanwhile.
 */
START_TEST(test_tls_forged_records_reset_only_their_sender)
{
	static const uint8_t overlong[5] = {0x17, 0x03, 0x03, 0xff, 0xff};
	uint8_t forged[5 + 1024];
	cwi_conn *c;
	tsrv s;

	tls_layer_set("cachew");
	srv_start(&s, TLS_T, NULL);
	/* Application data of 1 KiB, not encrypted by the session's key. */
	memcpy(forged, (const uint8_t[]){0x17, 0x03, 0x03, 1024 >> 8, 0}, 5);
	memset(forged + 5, 0xa5, 1024);
	assert_forged_record_resets(&s, forged, sizeof(forged),
	    "bad record mac");
	assert_forged_record_resets(&s, overlong, sizeof(overlong),
	    "record length out of bounds");
	assert_forged_record_resets(&s, NULL, 0, "renegotiation refused");
	c = dial(&s);
	call_ok(c, "echo still", "echo still");
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* ---- TLS: every cipher suite the layer offers, both ways ---------------- */

/* The suites a P-256 certificate serves (nng_tls_ossl.c's list): cachew's
 * record layer seals and opens the AES-GCM ones itself and leaves
 * ChaCha20-Poly1305 to OpenSSL's records. */
static const char *const tls_suites[] = {
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
};

static void
ssl_write_all(SSL *ssl, const void *buf, size_t len)
{
	for (size_t off = 0, n; off < len; off += n)
		ck_assert_int_eq(SSL_write_ex(ssl, (const uint8_t *)buf + off,
				     len - off, &n), 1);
}

static bool
ssl_read_exact(SSL *ssl, void *buf, size_t len)
{
	for (size_t off = 0, n; off < len; off += n)
		if (SSL_read_ex(ssl, (uint8_t *)buf + off, len - off, &n) != 1)
			return false;
	return true;
}

/* A header-only message of `len` bytes of header ("echo" and a pattern
 * that no two records share), as a raw peer frames it on TLS: length
 * prefix, request id, frame head, header. *out: the bytes after the
 * prefix (free()), *out_len their count. */
static void
big_request(uint32_t id, size_t len, uint8_t **out, size_t *out_len)
{
	size_t n = 4 + FRAME_HEAD_BYTES + len;
	uint8_t *m = malloc(n);

	ck_assert_ptr_nonnull(m);
	put_be32(m, id);
	memset(m + 4, 0, FRAME_HEAD_BYTES);
	m[4] = 'C', m[5] = 'W', m[6] = 1, m[7] = 0;
	put_be32(m + 8, (uint32_t)len);
	memcpy(m + 4 + FRAME_HEAD_BYTES, "echo", 4);
	for (size_t i = 4; i < len; i++)
		m[4 + FRAME_HEAD_BYTES + i] = (uint8_t)(i * 7 + i / 251);
	*out = m;
	*out_len = n;
}

/* Sends one SP message (prefix, then bytes) on ssl. */
static void
ssl_send_sp(SSL *ssl, const uint8_t *bytes, size_t len)
{
	uint8_t prefix[8];

	put_be64(prefix, len);
	ssl_write_all(ssl, prefix, sizeof(prefix));
	ssl_write_all(ssl, bytes, len);
}

/* Reads one SP message on ssl and checks that it is `want`. */
static void
ssl_expect_sp(SSL *ssl, const uint8_t *want, size_t len)
{
	uint8_t prefix[8];
	uint8_t *got = malloc(len);
	uint64_t n = 0;

	ck_assert_ptr_nonnull(got);
	ck_assert(ssl_read_exact(ssl, prefix, sizeof(prefix)));
	for (int i = 0; i < 8; i++)
		n = n << 8 | prefix[i];
	ck_assert_uint_eq(n, len);
	ck_assert(ssl_read_exact(ssl, got, len));
	ck_assert_msg(memcmp(got, want, len) == 0, "the message differs");
	free(got);
}

/* The SP headers over ssl: ours (`mine`), then the peer's (`theirs`). */
static void
ssl_sp_handshake(SSL *ssl, uint8_t mine, uint8_t theirs)
{
	uint8_t h[8], want[8];

	sp_header(h, mine);
	ssl_write_all(ssl, h, sizeof(h));
	sp_header(want, theirs);
	ck_assert(ssl_read_exact(ssl, h, sizeof(h)));
	ck_assert_int_eq(memcmp(h, want, sizeof(h)), 0);
}

/* A TLS 1.2 context of OpenSSL's offering only `suite`: a client that
 * takes the server's certificate on trust, or a server with the
 * fixture's server.pem. */
static SSL_CTX *
one_suite_ctx(const char *suite, bool server)
{
	SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method()
					  : TLS_client_method());

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION),
	    1);
	ck_assert_int_eq(SSL_CTX_set_cipher_list(ctx, suite), 1);
	if (server) {
		ck_assert_int_eq(SSL_CTX_use_certificate_chain_file(ctx,
				     cwt_tls_file("server.pem")), 1);
		ck_assert_int_eq(SSL_CTX_use_PrivateKey_file(ctx,
				     cwt_tls_file("server.key"),
				     SSL_FILETYPE_PEM), 1);
	} else {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	}
	return ctx;
}

/* A session of ctx's on the connected socket fd (reads on it give up
 * after WAIT_MS): its handshake done (server: accepted), the suite
 * checked, the SP headers exchanged. */
static SSL *
suite_session(SSL_CTX *ctx, int fd, const char *suite, bool server)
{
	struct timeval tv = {.tv_sec = WAIT_MS / 1000};
	SSL *ssl;

	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv,
			     sizeof(tv)), 0);
	ssl = SSL_new(ctx);
	ck_assert_ptr_nonnull(ssl);
	ck_assert_int_eq(SSL_set_fd(ssl, fd), 1);
	ck_assert_msg((server ? SSL_accept(ssl) : SSL_connect(ssl)) == 1,
	    "%s: handshake", suite);
	ck_assert_str_eq(SSL_get_cipher_name(ssl), suite);
	if (server)
		ssl_sp_handshake(ssl, SP_REP0, SP_REQ0);
	else
		ssl_sp_handshake(ssl, SP_REQ0, SP_REP0);
	return ssl;
}

/* A peer on OpenSSL that offers only `suite` dials a cachew listener
 * (its record layer) and sends a 100 KB request across records of every
 * size; the echo comes back equal, sealed with that suite. */
static void
suite_via_listener(const tsrv *s, const char *suite)
{
	SSL_CTX *ctx = one_suite_ctx(suite, false);
	int fd = raw_connect(cwi_listener_url(s->l) + 4); /* tcp://... */
	SSL *ssl = suite_session(ctx, fd, suite, false);
	uint8_t *req;
	size_t len;

	big_request(0x80000011u, 100003, &req, &len);
	ssl_send_sp(ssl, req, len);
	ssl_expect_sp(ssl, req, len); /* the id, then the same body */
	free(req);
	SSL_free(ssl);
	SSL_CTX_free(ctx);
	close(fd);
}

/* cachew's dialer (its record layer) to a server on OpenSSL that offers
 * only `suite`: a 100 KB request and a 100 KB reply, each equal. */
static void
suite_via_dialer(const char *suite)
{
	SSL_CTX *ctx = one_suite_ctx(suite, true);
	cwi_transport_opts o = tls_client_opts(NULL, NULL);
	char url[256], tls_url[300];
	uint8_t *req, *reply, got_id[4], prefix[8], want_prefix[8];
	size_t len, rlen, hlen;
	cwi_msg *m, *back;
	cwi_conn *c;
	cwi_cq *q;
	SSL *ssl;
	int lfd = raw_listen(1, url, sizeof(url)), fd;
	struct pollfd pf = {.fd = lfd, .events = POLLIN};

	snprintf(tls_url, sizeof(tls_url), "tls+%s", url);
	big_request(0, 100003, &req, &len);
	ck_assert_int_eq(cwi_msg_create(&m), CACHEW_OK);
	ck_assert_int_eq(cwi_msg_set_header(m, req + 4 + FRAME_HEAD_BYTES,
			     len - 4 - FRAME_HEAD_BYTES), CACHEW_OK);
	ck_assert_msg(cwi_dial(&c, tls_url, &o) == CACHEW_OK, "dial: %s",
	    cachew_errmsg());
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(c, m, WAIT_MS, q, 1), CACHEW_OK);
	ck_assert_int_eq(poll(&pf, 1, WAIT_MS), 1);
	fd = accept(lfd, NULL, NULL);
	ck_assert_int_ge(fd, 0);
	ssl = suite_session(ctx, fd, suite, true);
	/* The request: any id with the high bit, then the same body. */
	put_be64(want_prefix, len);
	ck_assert(ssl_read_exact(ssl, prefix, sizeof(prefix)));
	ck_assert_int_eq(memcmp(prefix, want_prefix, sizeof(prefix)), 0);
	ck_assert(ssl_read_exact(ssl, got_id, sizeof(got_id)));
	ck_assert_msg(got_id[0] & 0x80, "request id");
	memcpy(req, got_id, 4);
	reply = malloc(len - 4);
	ck_assert_ptr_nonnull(reply);
	ck_assert(ssl_read_exact(ssl, reply, len - 4));
	ck_assert_int_eq(memcmp(reply, req + 4, len - 4), 0);
	free(reply);
	/* The reply: another 100 KB header, under the request's id. */
	big_request(0, 100019, &reply, &rlen);
	memcpy(reply, got_id, 4);
	reply[4 + FRAME_HEAD_BYTES + 4] ^= 0x5a; /* not the request's */
	ssl_send_sp(ssl, reply, rlen);
	back = cq_wait_ok(q, 1);
	const uint8_t *h = cwi_msg_header(back, &hlen);
	ck_assert_uint_eq(hlen, rlen - 4 - FRAME_HEAD_BYTES);
	ck_assert_int_eq(memcmp(h, reply + 4 + FRAME_HEAD_BYTES, hlen), 0);
	cwi_msg_destroy(back);
	free(reply);
	free(req);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	SSL_free(ssl);
	SSL_CTX_free(ctx);
	close(fd);
	raw_unlisten(lfd, url);
}

/*
 * Each cipher suite cachew's record layer negotiates moves data both
 * ways, at a listener and at a dialer: AES-128-GCM and AES-256-GCM
 * sealed and opened by the layer, ChaCha20-Poly1305 by OpenSSL's own
 * records (the layer takes no keys it cannot use). Peers on OpenSSL
 * that offer one suite each force the choice.
 */
START_TEST(test_tls_every_suite_moves_data_both_ways)
{
	tsrv s;

	tls_layer_set("cachew");
	tls_srv_start(&s, "server.pem", "server.key", CWI_TLS_CLIENT_AUTH_NONE);
	for (size_t i = 0; i < sizeof(tls_suites) / sizeof(tls_suites[0]); i++) {
		suite_via_listener(&s, tls_suites[i]);
		suite_via_dialer(tls_suites[i]);
	}
	srv_stop(&s);
}
END_TEST

/* ---- the heap of the process: a user's malloc is the user's ------------- */

/* Whether the tests share one process (CK_FORK=no). */
static bool
tests_share_a_process(void)
{
	const char *v = getenv("CK_FORK");

	return v != NULL && strcmp(v, "no") == 0;
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* glibc's arenas so far: the <heap nr=...> entries of malloc_info. */
static int
arena_count(void)
{
	char *xml = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&xml, &len);
	int n;

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(malloc_info(0, f), 0);
	fclose(f);
	n = cwt_count(xml, "<heap nr=");
	free(xml);
	return n;
}

static pthread_barrier_t arena_barrier;

/* Allocates while the other threads do, so none can take an arena that
 * another left free. */
static void *
arena_thread(void *arg)
{
	void *p = malloc(1000);

	(void)arg;
	pthread_barrier_wait(&arena_barrier);
	free(p);
	return NULL;
}

/* Listens and dials over tcp like a service client (nng starts its
 * threads), then runs 2 threads that allocate at once: returns how many
 * arenas glibc has then. */
static int
arenas_after_a_socket_and_threads(void)
{
	pthread_t t[2];
	cwi_conn *c = NULL;
	tsrv s;
	int n;

	srv_start(&s, 1, NULL);
	ck_assert_int_eq(dial_url(&c, cwi_listener_url(s.l), NULL), CACHEW_OK);
	pthread_barrier_init(&arena_barrier, NULL, 3);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(
		    pthread_create(&t[i], NULL, arena_thread, NULL), 0);
	pthread_barrier_wait(&arena_barrier);
	n = arena_count();
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&arena_barrier);
	cwi_conn_destroy(c);
	srv_stop(&s);
	return n;
}
#endif

/* A process using the library is the user's: opening nng sockets leaves
 * its malloc as glibc set it (issue 18: the library had put every later
 * thread, a trainer's included, on one arena). */
START_TEST(test_sockets_leave_a_users_malloc_alone)
{
	/* valgrind's malloc has no arenas; without fork the process decided
	 * in an earlier test. */
	if (getenv("CWT_VALGRIND") != NULL || tests_share_a_process())
		return;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	unsetenv("CACHEW_MALLOPT");
	ck_assert_int_gt(arenas_after_a_socket_and_threads(), 1);
	ck_assert(!cwi_heap_tune(false));
#endif
}
END_TEST

/* CACHEW_MALLOPT=1 asks for cachewd's tuning in a user's process: one
 * arena from the first socket on. */
START_TEST(test_mallopt_1_tunes_a_users_malloc_at_the_first_socket)
{
	if (getenv("CWT_VALGRIND") != NULL || tests_share_a_process())
		return;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	setenv("CACHEW_MALLOPT", "1", 1);
	ck_assert_int_eq(arenas_after_a_socket_and_threads(), 1);
	ck_assert(cwi_heap_tune(false));
#endif
}
END_TEST


/* ---- the same-host path (transports/nng/nng_shm.c) ---------------------- */

/* Files of this process's regions left in /dev/shm. */
static int
shm_files_of_mine(void)
{
	char pre[64];
	struct dirent *d;
	DIR *dir = opendir("/dev/shm");
	int n = 0;

	if (dir == NULL)
		return 0;
	snprintf(pre, sizeof(pre), "cachew-%d-", (int)getpid());
	while ((d = readdir(dir)) != NULL)
		n += strncmp(d->d_name, pre, strlen(pre)) == 0;
	closedir(dir);
	return n;
}

/* Dials s with a region of shm_bytes offered (0: none). */
static cwi_conn *
dial_shm(const tsrv *s, size_t shm_bytes)
{
	cwi_transport_opts o, buf;
	cwi_conn *c;

	cwi_transport_opts_init(&o);
	o.shm_bytes = shm_bytes;
	ck_assert_msg(cwi_dial(&c, cwi_listener_url(s->l),
			  tls_for(cwi_listener_url(s->l), &o, false, &buf)) ==
		CACHEW_OK,
	    "dial: %s", cachew_errmsg());
	return c;
}

/* Echoes one u8 element of n bytes (pattern seed) and checks the reply;
 * returns it (the caller destroys it). *blocks: whether it came as a
 * block of the region. */
static cwi_msg *
echo_big(cwi_conn *c, size_t n, int seed, bool *block)
{
	int64_t shape[1] = {(int64_t)n};
	cwi_element *e = mk_fixed(CACHEW_U8, 1, shape, seed);
	uint64_t before = cwi_nng_shm_received();
	cwi_msg *reply;

	ck_assert_int_eq(cwi_conn_call(c, mk_elems("echo big", &e, 1), WAIT_MS,
			     &reply),
	    CACHEW_OK);
	ck_assert_uint_eq(cwi_msg_count(reply), 1);
	ck_assert(cwi_element_equal(cwi_msg_element(reply, 0), e));
	cwi_element_release(e);
	*block = cwi_nng_shm_received() > before;
	return reply;
}

/* A client offering a region gets large replies in it, read in place
 * (the received tensor views the mapping), with every dtype and string
 * intact; small replies still come through the socket; the region's
 * file is gone once the listener took it. */
START_TEST(test_shm_large_replies_travel_in_shared_memory)
{
	cwi_element *sent[16];
	cwi_msg *reply;
	uint64_t before;
	cwi_conn *c;
	size_t n;
	bool block;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial_shm(&s, 32 << 20);
	call_ok(c, "echo small", "echo small");
	before = cwi_nng_shm_received();
	reply = call_echo_elements(c, sent, &n);
	ck_assert_uint_eq(cwi_nng_shm_received(), before + 1);
	for (size_t i = 0; i < n; i++) {
		cwi_element *e = cwi_msg_element(reply, i);
		ck_assert_msg(cwi_element_equal(e, sent[i]), "element %zu", i);
	}
	{
		/* The 8 MiB tensor views the block: memory of the mapping,
		 * not a buffer of ours (free_fn marks the block free). */
		cwi_element *big = cwi_msg_element(reply, n - 1);
		ck_assert_ptr_nonnull(big->comp[0].buf->free_fn);
		ck_assert_uint_eq(
		    (uintptr_t)cwi_tensor_data(&big->comp[0]) % 16, 0);
	}
	for (size_t i = 0; i < n; i++)
		cwi_element_release(sent[i]);
	/* The elements outlive their message and the connection. */
	{
		cwi_element *keep = cwi_msg_take(reply, n - 1);
		int64_t shape[1] = {8 << 20};
		cwi_element *want = mk_fixed(CACHEW_U8, 1, shape, 3);
		cwi_msg_destroy(reply);
		cwi_conn_destroy(c);
		ck_assert(cwi_element_equal(keep, want));
		cwi_element_release(keep);
		cwi_element_release(want);
	}
	/* Many replies reuse the region's blocks. */
	c = dial_shm(&s, 4 << 20);
	for (int i = 0; i < 40; i++) {
		reply = echo_big(c, (size_t)(1 << 20) + (size_t)i * 4097, i,
		    &block);
		ck_assert_msg(block, "reply %d came through the socket", i);
		cwi_msg_destroy(reply);
	}
	cwi_conn_destroy(c);
	srv_stop(&s);
	ck_assert_int_eq(shm_files_of_mine(), 0);
}
END_TEST

/* A client holding replies fills its region: the next ones come through
 * the socket, intact, and once it lets go the region serves again. */
START_TEST(test_shm_full_region_falls_back_to_the_socket)
{
	cwi_msg *held[3], *reply;
	cwi_conn *c;
	bool block;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial_shm(&s, 1 << 20); /* the least: 1 MiB of blocks */
	held[0] = echo_big(c, 600 << 10, 1, &block);
	ck_assert(block);
	held[1] = echo_big(c, 600 << 10, 2, &block);
	ck_assert_msg(!block, "two 600 KiB blocks in a 1 MiB region");
	held[2] = echo_big(c, 300 << 10, 3, &block);
	ck_assert(block);
	/* The held replies are still what was sent. */
	for (int i = 0; i < 3; i++) {
		int64_t shape[1] = {i == 2 ? 300 << 10 : 600 << 10};
		cwi_element *want = mk_fixed(CACHEW_U8, 1, shape, i + 1);
		ck_assert(cwi_element_equal(cwi_msg_element(held[i], 0), want));
		cwi_element_release(want);
		cwi_msg_destroy(held[i]);
	}
	reply = echo_big(c, 900 << 10, 4, &block);
	ck_assert_msg(block, "the region was not reclaimed");
	cwi_msg_destroy(reply);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* A block the client keeps long (W5: a partial batch held until the next
 * lease's elements complete it) pins its own bytes only: the replies that
 * come and go meanwhile keep finding room below and after it, and it stays
 * intact. (The region used to be a ring reclaimed from its oldest block:
 * one held block there sent every third large reply through the socket.) */
START_TEST(test_shm_a_held_block_pins_only_its_own_bytes)
{
	int64_t small[1] = {100 << 10};
	cwi_element *want = mk_fixed(CACHEW_U8, 1, small, 7);
	cwi_msg *held, *early, *reply;
	cwi_conn *c;
	bool block;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial_shm(&s, 4 << 20);
	early = echo_big(c, 1 << 20, 1, &block);
	ck_assert(block);
	held = echo_big(c, 100 << 10, 7, &block);
	ck_assert(block);
	cwi_msg_destroy(early); /* room below the held block */
	for (int i = 0; i < 24; i++) {
		reply = echo_big(c, i % 2 ? 1536 << 10 : 700 << 10, 10 + i,
		    &block);
		ck_assert_msg(block, "reply %d (%d KiB) took the socket beside "
		    "one held block of 100 KiB in a 4 MiB region", i,
		    i % 2 ? 1536 : 700);
		/* First fit: a 700 KiB reply goes in the MiB freed below
		 * the held block, not after it. */
		if (i % 2 == 0)
			ck_assert_msg((uintptr_t)cwi_tensor_data(
					  &cwi_msg_element(reply, 0)->comp[0]) <
				(uintptr_t)cwi_tensor_data(
				    &cwi_msg_element(held, 0)->comp[0]),
			    "reply %d of 700 KiB placed after the held block",
			    i);
		cwi_msg_destroy(reply);
	}
	ck_assert(cwi_element_equal(cwi_msg_element(held, 0), want));
	cwi_element_release(want);
	cwi_msg_destroy(held);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* This process's resident pages of shared memory, in KiB (both ends of
 * the link live here). */
static long
rss_shmem_kib(void)
{
	return status_kib("RssShmem");
}

/* After a burst of held replies, the pages written past what is in use
 * go back to the system (nng_shm.c, trim_locked) instead of staying with
 * the link while it lives. */
START_TEST(test_shm_region_gives_back_pages_after_a_burst)
{
	cwi_msg *held[10], *reply;
	long peak, after;
	cwi_conn *c;
	bool block;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial_shm(&s, 16 << 20);
	for (int i = 0; i < 10; i++) {
		held[i] = echo_big(c, 1 << 20, i, &block);
		ck_assert(block);
	}
	peak = rss_shmem_kib();
	for (int i = 0; i < 10; i++)
		cwi_msg_destroy(held[i]);
	/* 64 blocks in all make the listener look. */
	for (int i = 0; i < 60; i++) {
		reply = echo_big(c, 100 << 10, i, &block);
		ck_assert(block);
		cwi_msg_destroy(reply);
	}
	after = rss_shmem_kib();
	ck_assert_msg(after < peak - 8 * 1024, "shared memory resident %ld KiB "
	    "after the burst, %ld KiB at its peak", after, peak);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

static bool tests_share_a_process(void);

/* A full /dev/shm (a container's is 64 MB by default): the listener's
 * write of a block fails and the reply takes the socket, intact; nothing
 * raises SIGBUS. Needs a mount namespace of its own (root), in a forked
 * test process: skipped otherwise, saying so. */
START_TEST(test_shm_full_dev_shm_falls_back_to_the_socket)
{
	cwi_msg *held[6];
	int blocks = 0;
	cwi_conn *c;
	bool block;
	tsrv s;

	if (tests_share_a_process())
		return;
	if (unshare(CLONE_NEWNS) != 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=2m") != 0) {
		fprintf(stderr, "test_shm_full_dev_shm_falls_back_to_the_socket: "
		    "skipped, no mount namespace here (%s)\n", strerror(errno));
		return;
	}
	srv_start(&s, _i, NULL);
	c = dial_shm(&s, 16 << 20);
	for (int i = 0; i < 6; i++) {
		held[i] = echo_big(c, 1 << 20, i, &block);
		blocks += block;
	}
	/* 2 MiB of tmpfs: the head and one 1 MiB block */
	ck_assert_int_eq(blocks, 1);
	for (int i = 0; i < 6; i++) {
		int64_t shape[1] = {1 << 20};
		cwi_element *want = mk_fixed(CACHEW_U8, 1, shape, i);
		ck_assert(cwi_element_equal(cwi_msg_element(held[i], 0), want));
		cwi_element_release(want);
		cwi_msg_destroy(held[i]);
	}
	cwi_conn_destroy(c);
	srv_stop(&s);
	umount("/dev/shm");
}
END_TEST

/* A listener with CACHEW_SHM=0, and any TLS link, declines the region:
 * the replies come through the stream, and the client removes its
 * file. */
START_TEST(test_shm_declined_by_tls_and_by_cachew_shm_0)
{
	cwi_msg *reply;
	cwi_conn *c;
	bool block;
	tsrv s;

	if (_i != TLS_T)
		setenv("CACHEW_SHM", "0", 1);
	srv_start(&s, _i, NULL);
	unsetenv("CACHEW_SHM");
	c = dial_shm(&s, 4 << 20);
	for (int i = 0; i < 3; i++) {
		reply = echo_big(c, 1 << 20, i, &block);
		ck_assert(!block);
		cwi_msg_destroy(reply);
	}
	ck_assert_int_eq(shm_files_of_mine(), 0);
	cwi_conn_destroy(c);
	srv_stop(&s);
}
END_TEST

/* A control frame (kind 2 or 3) as a raw peer sends it, payload len
 * bytes, behind request id `id`. */
static size_t
raw_ctl(uint8_t *out, uint32_t id, int kind, const void *payload,
    size_t len)
{
	put_be32(out, id);
	memset(out + 4, 0, FRAME_HEAD_BYTES);
	out[4] = 'C', out[5] = 'W', out[6] = 1, out[7] = (uint8_t)kind;
	put_be32(out + 8, (uint32_t)len);
	memcpy(out + 4 + FRAME_HEAD_BYTES, payload, len);
	return 4 + FRAME_HEAD_BYTES + len;
}

/* The answer a raw peer gets to a hello: the kind 2 frame's one byte. */
static int
raw_hello_answer(int fd, bool ipc, uint32_t id)
{
	size_t len;
	uint8_t *got = raw_recv_sp(fd, ipc, &len);
	int yes;

	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(len, 4 + FRAME_HEAD_BYTES + 1);
	ck_assert_uint_eq(got[3] | got[2] << 8 | got[1] << 16 |
			      (uint32_t)got[0] << 24,
	    id);
	ck_assert_uint_eq(got[7], 2);
	yes = got[4 + FRAME_HEAD_BYTES];
	free(got);
	return yes;
}

/* Hostile clients: a hello naming a file outside the pattern, one named
 * right but whose head lacks the nonce, a truncated hello: each is
 * declined and the link goes on serving; a block frame sent as a request
 * resets the link; the listener serves others throughout. */
START_TEST(test_hostile_shm_hello_is_checked)
{
	bool ipc = _i == 2;
	uint8_t msg[256], hello[FRAME_CTL_MAX];
	char name[64], path[80];
	size_t len;
	tsrv s;
	int fd, ffd;

	srv_start(&s, _i, NULL);
	fd = raw_connect_req(cwi_listener_url(s.l));
	/* ../: refused by its name alone */
	hello[0] = 14;
	memcpy(hello + 1, "cachew-1-../ab", 14);
	memset(hello + 15, 0, 24);
	len = raw_ctl(msg, 0x80000001u, 2, hello, 15 + 24);
	raw_send_sp(fd, ipc, msg, len);
	ck_assert_int_eq(raw_hello_answer(fd, ipc, 0x80000001u), 0);
	/* a file of the right name and size, but not the nonce sent */
	snprintf(name, sizeof(name), "cachew-%d-00000000000000ff",
	    (int)getpid());
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	ffd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(ffd, 0);
	ck_assert_int_eq(ftruncate(ffd, 8 << 20), 0);
	close(ffd);
	hello[0] = (uint8_t)strlen(name);
	memcpy(hello + 1, name, strlen(name));
	put_be64(hello + 1 + strlen(name), 8 << 20);
	memset(hello + 9 + strlen(name), 0x5a, 16);
	len = raw_ctl(msg, 0x80000002u, 2, hello, 25 + strlen(name));
	raw_send_sp(fd, ipc, msg, len);
	ck_assert_int_eq(raw_hello_answer(fd, ipc, 0x80000002u), 0);
	/* the nonce right, but a head whose offset and length wrap past
	 * the file's 4 KiB (4096 slots: blocks at 20 KiB, 2^64 - 16 KiB of
	 * them) */
	{
		uint8_t head[64] = {'C', 'W', 'S', 'H', 'M', 0, 0, 1};
		memset(head + 8, 0x5a, 16);
		put_be32(head + 24, 4096);
		put_be64(head + 32, 20480);
		put_be64(head + 40, UINT64_MAX - 16383);
		ffd = open(path, O_RDWR | O_TRUNC);
		ck_assert_int_ge(ffd, 0);
		ck_assert_int_eq(pwrite(ffd, head, sizeof(head), 0),
		    (ssize_t)sizeof(head));
		ck_assert_int_eq(ftruncate(ffd, 4096), 0);
		close(ffd);
		put_be64(hello + 1 + strlen(name), 4096);
		len = raw_ctl(msg, 0x80000006u, 2, hello, 25 + strlen(name));
		raw_send_sp(fd, ipc, msg, len);
		ck_assert_int_eq(raw_hello_answer(fd, ipc, 0x80000006u), 0);
	}
	unlink(path);
	/* truncated */
	len = raw_ctl(msg, 0x80000003u, 2, hello, 5);
	raw_send_sp(fd, ipc, msg, len);
	ck_assert_int_eq(raw_hello_answer(fd, ipc, 0x80000003u), 0);
	/* the link still serves */
	raw_send_msg(fd, ipc, 0x80000004u, "echo after hellos");
	{
		uint8_t *got = raw_recv_sp(fd, ipc, &len);
		ck_assert_ptr_nonnull(got);
		free(got);
	}
	/* a block frame is no request */
	len = raw_ctl(msg, 0x80000005u, 3, hello, SHM_DESC);
	raw_send_sp(fd, ipc, msg, len);
	ck_assert(closed_by_server(fd));
	close(fd);
	assert_served(&s, "echo still here");
	srv_stop(&s);
}
END_TEST

/* A listener of an older version resets the link on the hello (a frame
 * kind it does not know): the request waiting for the hello's answer is
 * not lost but goes out on the next link, which carries no hello. */
START_TEST(test_shm_older_listener_resetting_on_the_hello_loses_no_request)
{
	bool ipc = _i == 2;
	cwi_transport_opts o;
	char url[256];
	cwi_msg *reply;
	cwi_conn *c;
	cwi_cq *q;
	uint8_t *got;
	size_t len;
	int lfd, fd;

	lfd = raw_listen(_i, url, sizeof(url));
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	cwi_transport_opts_init(&o);
	o.dial_async = true;
	o.shm_bytes = 2 << 20;
	o.reconnect_min_ms = 50;
	ck_assert_int_eq(cwi_dial(&c, url, &o), CACHEW_OK);
	ck_assert_int_eq(cwi_conn_send(c, mk("ask"), WAIT_MS, q, 1), CACHEW_OK);
	fd = raw_accept_req(lfd);
	got = raw_recv_sp(fd, ipc, &len);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(got[7], 2); /* the hello, first */
	free(got);
	close(fd); /* what an older listener does */
	fd = raw_accept_req(lfd);
	raw_answer(fd, ipc, "ask", "answered");
	reply = cq_wait_ok(q, 1);
	assert_hdr(reply, "answered");
	cwi_msg_destroy(reply);
	cwi_cq_destroy(q);
	cwi_conn_destroy(c);
	close(fd);
	raw_unlisten(lfd, url);
	ck_assert_int_eq(shm_files_of_mine(), 0);
}
END_TEST

/* Hostile servers: a block frame to a client that offered no region,
 * and one naming bytes outside the region offered: the request fails
 * naming the defect, nothing outside the region is read, and the
 * connection redials and serves the next request. */
START_TEST(test_hostile_server_block_frames_are_checked)
{
	bool ipc = _i == 2;
	cwi_transport_opts o;
	uint8_t msg[256], desc[SHM_DESC];
	char url[256];
	cwi_completion comp;
	cwi_conn *c;
	cwi_cq *q;
	int lfd, fd;
	uint32_t id;
	size_t len;

	lfd = raw_listen(_i, url, sizeof(url));
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	for (int offer = 0; offer < 2; offer++) {
		cwi_transport_opts_init(&o);
		o.dial_async = true;
		o.shm_bytes = offer ? 2 << 20 : 0;
		ck_assert_int_eq(cwi_dial(&c, url, &o), CACHEW_OK);
		ck_assert_int_eq(cwi_conn_send(c, mk("ask"), WAIT_MS, q, 1),
		    CACHEW_OK);
		fd = raw_accept_req(lfd);
		if (offer) {
			/* The hello comes first; say yes without mapping. */
			uint8_t *got = raw_recv_sp(fd, ipc, &len);
			uint8_t yes = 1;
			ck_assert_ptr_nonnull(got);
			ck_assert_uint_eq(got[7], 2);
			id = (uint32_t)got[0] << 24 | got[1] << 16 |
			     got[2] << 8 | got[3];
			free(got);
			len = raw_ctl(msg, id, 2, &yes, 1);
			raw_send_sp(fd, ipc, msg, len);
		}
		id = raw_read_request(fd, ipc, "ask");
		/* slot 0, 1 MiB at 4 GiB: outside any region */
		put_be32(desc, 0);
		put_be64(desc + 4, (uint64_t)4 << 30);
		put_be64(desc + 12, 1 << 20);
		len = raw_ctl(msg, id, 3, desc, sizeof(desc));
		raw_send_sp(fd, ipc, msg, len);
		ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
		ck_assert_int_eq(comp.err, CACHEW_EPROTO);
		ck_assert_msg(strstr(cachew_errmsg(), offer ? "outside the region"
					: "offered none") != NULL,
		    "%s", cachew_errmsg());
		ck_assert(closed_by_server(fd));
		close(fd);
		cwi_conn_destroy(c);
	}
	cwi_cq_destroy(q);
	raw_unlisten(lfd, url);
	ck_assert_int_eq(shm_files_of_mine(), 0);
}
END_TEST


Suite *
cwt_transport_suite(void)
{
	Suite *s = suite_create("transport");
	TCase *conf = tcase_create("conformance");
	TCase *msg = tcase_create("message");
	TCase *hostile = tcase_create("hostile");
	TCase *wire = tcase_create("wire");
	TCase *tls = tcase_create("tls");
	TCase *heap = tcase_create("heap");
	TCase *shm = tcase_create("shm");

	(void)tnames;
	tcase_set_timeout(conf, 60);
	tcase_add_unchecked_fixture(conf, cwt_tls_setup, cwt_tls_teardown);
	tcase_add_loop_test(conf, test_roundtrip, 0, NCONF);
	tcase_add_loop_test(conf, test_many_concurrent_clients, 0, NCONF);
	tcase_add_loop_test(conf, test_requests_in_flight_answered_out_of_order,
	    0, NCONF);
	tcase_add_loop_test(conf, test_elements_round_trip, 0, NCONF);
	tcase_add_loop_test(conf, test_received_elements_outlive_their_message,
	    0, NCONF);
	tcase_add_loop_test(conf, test_header_only_and_empty_messages, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_handler_error_reaches_client, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_message_with_taken_element_is_refused, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_timeout_when_server_never_replies, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_cq_wait_times_out_and_closes, 0, 1);
	tcase_add_loop_test(conf, test_conn_close_wakes_blocked_call, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_listener_close_wakes_blocked_call, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_cq_close_wakes_waiter, 0, NCONF);
	tcase_add_loop_test(conf, test_oversized_request_resets_sender_only, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_reject_resets_connection_with_reason, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_listen_on_taken_address_fails, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_dial_without_listener_is_refused, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_listener_reopened_is_found_again, 0,
	    NCONF);
	tcase_add_loop_test(conf, test_bad_urls, 0, 1);
	tcase_add_loop_test(conf, test_pipelined_replies_of_very_different_sizes,
	    0, NCONF);
	/* inproc ignores max_inflight: its handler runs on the sender's
	 * thread, and nothing queues. */
	tcase_add_loop_test(conf, test_max_inflight_holds_back_further_requests,
	    1, NCONF);
	tcase_add_loop_test(conf,
	    test_max_inflight_room_reaches_every_waiting_connection, 1,
	    NCONF);
	tcase_add_loop_test(conf, test_conn_close_while_large_reply_in_transit,
	    1, NCONF);
	suite_add_tcase(s, conf);

	tcase_add_test(msg, test_msg_ownership_and_size);
	suite_add_tcase(s, msg);

	tcase_add_test(heap, test_sockets_leave_a_users_malloc_alone);
	tcase_add_test(heap,
	    test_mallopt_1_tunes_a_users_malloc_at_the_first_socket);
	suite_add_tcase(s, heap);

	tcase_set_timeout(hostile, 60);
	tcase_add_test(hostile, test_hostile_garbage_bytes);
	tcase_add_test(hostile, test_hostile_8gib_length_header);
	tcase_add_test(hostile, test_hostile_frame_with_lying_counts);
	tcase_add_test(hostile, test_hostile_100_idle_connections);
	/* The stream transports (1 tcp, 2 ipc) with raw peers. */
	tcase_add_loop_test(hostile, test_hostile_wrong_protocol_id_is_closed,
	    1, NTRANSPORTS);
	tcase_add_loop_test(hostile,
	    test_hostile_body_over_max_msg_size_is_closed, 1, NTRANSPORTS);
	tcase_add_loop_test(hostile,
	    test_hostile_length_past_bound_closed_before_body, 1, NTRANSPORTS);
	tcase_add_loop_test(hostile,
	    test_hostile_request_id_without_high_bit_is_closed, 1, NTRANSPORTS);
	tcase_add_loop_test(hostile, test_hostile_backtrace_of_9_hops_is_closed,
	    1, NTRANSPORTS);
	tcase_add_loop_test(hostile, test_hostile_peer_gone_before_reply, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(hostile,
	    test_hostile_handshake_reserved_bytes_is_closed, 1, NTRANSPORTS);
	tcase_add_test(hostile, test_hostile_ipc_message_type_not_1_is_closed);
	tcase_add_loop_test(hostile,
	    test_hostile_server_8gib_reply_length_resets_client, 1,
	    NTRANSPORTS);
	suite_add_tcase(s, hostile);

	/* Wire compatibility with plain nng sockets and raw SP peers. */
	tcase_set_timeout(wire, 60);
	tcase_add_loop_test(wire, test_wire_nng_req_socket_calls_listener, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(wire, test_wire_conn_calls_nng_rep_socket, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(wire, test_wire_raw_peer_echo_matches_framing, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(wire, test_wire_backtrace_of_2_hops_is_echoed, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(wire, test_wire_reply_with_unknown_id_is_dropped, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(wire,
	    test_peer_hanging_up_at_once_is_redialed_with_backoff, 1,
	    NTRANSPORTS);
	suite_add_tcase(s, wire);

	tcase_set_timeout(shm, 60);
	tcase_add_unchecked_fixture(shm, cwt_tls_setup, cwt_tls_teardown);
	tcase_add_loop_test(shm, test_shm_large_replies_travel_in_shared_memory,
	    1, NTRANSPORTS);
	tcase_add_loop_test(shm, test_shm_full_region_falls_back_to_the_socket,
	    1, NTRANSPORTS);
	tcase_add_loop_test(shm, test_shm_a_held_block_pins_only_its_own_bytes,
	    1, NTRANSPORTS);
	tcase_add_loop_test(shm, test_shm_region_gives_back_pages_after_a_burst,
	    1, NTRANSPORTS);
	tcase_add_loop_test(shm, test_shm_full_dev_shm_falls_back_to_the_socket,
	    1, NTRANSPORTS);
	tcase_add_loop_test(shm, test_shm_declined_by_tls_and_by_cachew_shm_0,
	    1, NCONF);
	tcase_add_loop_test(shm, test_hostile_shm_hello_is_checked, 1,
	    NTRANSPORTS);
	tcase_add_loop_test(shm, test_hostile_server_block_frames_are_checked,
	    1, NTRANSPORTS);
	tcase_add_loop_test(shm,
	    test_shm_older_listener_resetting_on_the_hello_loses_no_request, 1,
	    NTRANSPORTS);
	suite_add_tcase(s, shm);

	tcase_set_timeout(tls, 60);
	tcase_add_unchecked_fixture(tls, cwt_tls_setup, cwt_tls_teardown);
	tcase_add_test(tls, test_tls_mutual_auth_required_and_satisfied);
	tcase_add_test(tls, test_tls_server_certificate_of_another_ca_is_refused);
	tcase_add_test(tls, test_tls_server_name_not_in_certificate_is_refused);
	tcase_add_test(tls, test_tls_missing_client_certificate_is_refused);
	tcase_add_test(tls, test_tls_client_certificate_of_another_ca_is_refused);
	tcase_add_test(tls, test_tls_expired_server_certificate_is_refused);
	tcase_add_test(tls,
	    test_tls_expired_own_certificate_is_refused_at_listen_and_dial);
	tcase_add_test(tls, test_tls_plaintext_client_on_tls_listener_is_refused);
	tcase_add_test(tls, test_tls_client_on_plaintext_listener_is_refused);
	tcase_add_test(tls, test_tls_credentials_are_checked_at_listen_and_dial);
	tcase_add_test(tls, test_tls_layers_interoperate_both_ways);
	tcase_add_test(tls, test_tls_forged_records_reset_only_their_sender);
	tcase_add_test(tls, test_tls_every_suite_moves_data_both_ways);
	suite_add_tcase(s, tls);
	return s;
}
