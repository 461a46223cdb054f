/*
 * check_transport.c - the transport conformance suite: the same tests run
 * on inproc://, tcp://127.0.0.1:0 and ipc:// (loop index = transport),
 * then nng-only tests with hostile raw TCP peers (garbage, a frame header
 * claiming 8 GiB, a frame whose element count lies, 100 idle connections)
 * that must leave the server up, serving, and its memory bounded.
 *
 * The test server's handler acts on the request header, a plain string
 * here (the transport never interprets headers): "echo..." replies with
 * the same header and the request's elements, "hold..." keeps the request
 * for the test to answer, "drop" never answers, "fail" answers with an
 * error, "reject" resets the connection, "badreply" answers with a
 * message whose element was taken out.
 */
#include "cwt.h"

#include "../transports/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A bound for waits on readiness: generous, never reached when the code
 * works (tests must not depend on timing). */
#define WAIT_MS 10000
#define NTRANSPORTS 3

/* ---- fixtures ----------------------------------------------------------- */

static const char *const tnames[NTRANSPORTS] = {"inproc", "tcp", "ipc"};

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
	default:
		snprintf(buf, sizeof(buf), "ipc:///tmp/cachew-t-%d-%d.ipc",
		    (int)getpid(), seq++);
		break;
	}
	return strdup(buf);
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

static void
srv_start(tsrv *s, int ti, const cwi_transport_opts *opts)
{
	char *url = test_url(ti);

	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->mtx, NULL);
	pthread_cond_init(&s->cv, NULL);
	ck_assert_msg(cwi_listen(&s->l, url, opts, handler, s) == CACHEW_OK,
	    "listen %s: %s", url, cachew_errmsg());
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

/* Waits until the server holds n requests; fails the test after
 * WAIT_MS. */
static void
wait_held(tsrv *s, int n)
{
	uint64_t until = cwi_now_ns() + (uint64_t)WAIT_MS * 1000000u;

	pthread_mutex_lock(&s->mtx);
	while (s->nheld < n && cwi_now_ns() < until) {
		pthread_mutex_unlock(&s->mtx);
		cwi_sleep_ns(1000000);
		pthread_mutex_lock(&s->mtx);
	}
	ck_assert_int_eq(s->nheld, n);
	pthread_mutex_unlock(&s->mtx);
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

static cwi_conn *
dial(const tsrv *s)
{
	cwi_conn *c;

	ck_assert_msg(cwi_dial(&c, cwi_listener_url(s->l), NULL) == CACHEW_OK,
	    "dial %s: %s", cwi_listener_url(s->l), cachew_errmsg());
	return c;
}

/* A call whose reply header must be `expect`. */
static void
call_ok(cwi_conn *c, const char *req, const char *expect)
{
	cwi_msg *reply;
	char *h;

	ck_assert_msg(cwi_conn_call(c, mk(req), WAIT_MS, &reply) == CACHEW_OK,
	    "call %s: %s", req, cachew_errmsg());
	h = hdr_str(reply);
	ck_assert_str_eq(h, expect);
	free(h);
	cwi_msg_destroy(reply);
}

/* Calls until one succeeds: after a reset an nng connection redials,
 * and a request sent before the new pipe is up may still see the old
 * one go. Bounded. */
static void
call_ok_after_reset(cwi_conn *c, const char *req)
{
	cwi_msg *reply = NULL;
	cachew_err rv = CACHEW_ECLOSED;

	for (int i = 0; i < 50 && rv == CACHEW_ECLOSED; i++)
		rv = cwi_conn_call(c, mk(req), WAIT_MS, &reply);
	ck_assert_msg(rv == CACHEW_OK, "%s", cachew_errmsg());
	cwi_msg_destroy(reply);
}

/* ---- log capture -------------------------------------------------------- */

static pthread_mutex_t log_mtx = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[16384];

static void
log_sink(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	(void)ctx;
	if (level > CACHEW_LOG_WARN)
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

START_TEST(test_roundtrip)
{
	tsrv s;
	cwi_conn *c;

	srv_start(&s, _i, NULL);
	if (_i == 1)
		ck_assert_msg(strcmp(cwi_listener_url(s.l), "tcp://127.0.0.1:0"),
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

	if (cwi_dial(&c, cwi_listener_url(a->s->l), NULL) != CACHEW_OK)
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
	ck_assert_int_eq(s.handled, NC * 40);
	srv_stop(&s);
}
END_TEST

START_TEST(test_requests_in_flight_answered_out_of_order)
{
	enum { N = 16 };
	bool got[N] = {false};
	cwi_completion comp;
	cwi_conn *c;
	cwi_cq *q;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	ck_assert_int_eq(cwi_cq_create(&q), CACHEW_OK);
	for (int i = 0; i < N; i++) {
		char req[32];
		snprintf(req, sizeof(req), "hold %d", i);
		ck_assert_int_eq(
		    cwi_conn_send(c, mk(req), WAIT_MS, q, (uint64_t)i),
		    CACHEW_OK);
	}
	ck_assert_uint_eq(cwi_cq_outstanding(q), N);
	/* All N reach the server before any is answered: pipelined. */
	wait_held(&s, N);
	/* Answer in reverse order; each reply names its request. */
	for (int i = N - 1; i >= 0; i--) {
		cwi_request *r = take_held(&s, i);
		char *h = hdr_str(cwi_request_msg(r));
		cwi_msg *out = mk(h);
		ck_assert_int_eq(cwi_request_reply(r, out), CACHEW_OK);
		free(h);
	}
	s.nheld = 0;
	for (int k = 0; k < N; k++) {
		char expect[32];
		char *h;
		ck_assert_int_eq(cwi_cq_wait(q, WAIT_MS, &comp), CACHEW_OK);
		ck_assert_int_eq(comp.err, CACHEW_OK);
		ck_assert_uint_lt(comp.tag, N);
		ck_assert(!got[comp.tag]);
		got[comp.tag] = true;
		snprintf(expect, sizeof(expect), "hold %d", (int)comp.tag);
		h = hdr_str(comp.reply);
		ck_assert_str_eq(h, expect);
		free(h);
		cwi_msg_destroy(comp.reply);
	}
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
	cwi_element *sent[16], *keep[16];
	cwi_msg *req, *reply;
	cwi_conn *c;
	size_t n;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	n = mk_elements(sent);
	req = mk("echo elements");
	for (size_t i = 0; i < n; i++) {
		keep[i] = sent[i];
		cwi_element_retain(sent[i]);
		ck_assert_int_eq(cwi_msg_push(req, sent[i]), CACHEW_OK);
	}
	ck_assert_int_eq(cwi_conn_call(c, req, WAIT_MS, &reply), CACHEW_OK);
	ck_assert_uint_eq(cwi_msg_count(reply), n);
	for (size_t i = 0; i < n; i++) {
		cwi_element *e = cwi_msg_element(reply, i);
		ck_assert_msg(cwi_element_equal(e, keep[i]), "element %zu", i);
		if (_i == 0) {
			/* inproc: the very same elements, both ways. */
			ck_assert_ptr_eq(s.seen[i], keep[i]);
			ck_assert_ptr_eq(e, keep[i]);
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
		cwi_element_release(keep[i]);
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
	cwi_msg *req, *reply;
	cwi_conn *c;
	size_t n;
	tsrv s;

	srv_start(&s, _i, NULL);
	c = dial(&s);
	n = mk_elements(sent);
	req = mk("echo elements");
	for (size_t i = 0; i < n; i++) {
		cwi_element_retain(sent[i]);
		ck_assert_int_eq(cwi_msg_push(req, sent[i]), CACHEW_OK);
	}
	ck_assert_int_eq(cwi_conn_call(c, req, WAIT_MS, &reply), CACHEW_OK);
	ck_assert_uint_eq(cwi_msg_count(reply), n);
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

START_TEST(test_conn_close_wakes_blocked_call)
{
	blocked_call b;
	pthread_t t;
	tsrv s;

	srv_start(&s, _i, NULL);
	b = (blocked_call){.c = dial(&s), .req = "hold me"};
	ck_assert_int_eq(pthread_create(&t, NULL, blocked_main, &b), 0);
	wait_held(&s, 1);
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
	b = (blocked_call){.c = dial(&s), .req = "hold me"};
	ck_assert_int_eq(pthread_create(&t, NULL, blocked_main, &b), 0);
	wait_held(&s, 1);
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
	cwi_transport_opts o;
	cwi_conn *big, *other;
	cwi_msg *m, *reply;
	char *h = malloc(70000);
	tsrv s;

	cwi_transport_opts_init(&o);
	o.max_msg_size = 65536;
	log_start();
	srv_start(&s, _i, &o);
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
	tsrv s;

	srv_start(&s, _i, NULL);
	ck_assert_int_eq(
	    cwi_listen(&l2, cwi_listener_url(s.l), NULL, handler, &s),
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
	ck_assert_int_eq(cwi_dial(&c, url, NULL), CACHEW_EIO);
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
	memset(&s, 0, sizeof(s));
	pthread_mutex_init(&s.mtx, NULL);
	pthread_cond_init(&s.cv, NULL);
	ck_assert_int_eq(cwi_listen(&s.l, url, &o, handler, &s), CACHEW_OK);
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

/* ---- nng only: hostile raw TCP peers ------------------------------------- */

static long
rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static int
raw_connect(const char *url)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	const char *colon = strrchr(url, ':');
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	sa.sin_port = htons((uint16_t)atoi(colon + 1));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

static void
write_all(int fd, const void *data, size_t len)
{
	const uint8_t *p = data;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* the server may already have closed */
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

/* The SP-over-TCP connection header of a REQ peer (protocol 0x30):
 * 0x00 'S' 'P' 0x00, protocol id (16 bits, big-endian), reserved. */
static const uint8_t sp_req_header[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};

static void
put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (uint8_t)v;
		v >>= 8;
	}
}

START_TEST(test_hostile_garbage_bytes)
{
	static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
				      "\xff\xfe\x00\x01 not an SP header";
	tsrv s;
	int fd;

	srv_start(&s, 1, NULL);
	fd = raw_connect(cwi_listener_url(s.l));
	write_all(fd, garbage, sizeof(garbage));
	ck_assert(closed_by_server(fd));
	close(fd);
	{
		cwi_conn *c = dial(&s);
		call_ok(c, "echo still here", "echo still here");
		cwi_conn_destroy(c);
	}
	srv_stop(&s);
}
END_TEST

START_TEST(test_hostile_8gib_length_header)
{
	uint8_t frame[8];
	long before, after;
	tsrv s;
	int fd;

	srv_start(&s, 1, NULL);
	before = rss_kib();
	for (int k = 0; k < 4; k++) {
		fd = raw_connect(cwi_listener_url(s.l));
		write_all(fd, sp_req_header, sizeof(sp_req_header));
		put_be64(frame, (uint64_t)8 << 30);
		write_all(fd, frame, sizeof(frame));
		ck_assert(closed_by_server(fd));
		close(fd);
	}
	after = rss_kib();
	ck_assert_msg(after - before < 64 * 1024, "RSS grew %ld KiB",
	    after - before);
	{
		cwi_conn *c = dial(&s);
		call_ok(c, "echo still here", "echo still here");
		cwi_conn_destroy(c);
	}
	srv_stop(&s);
}
END_TEST

/* Sends one SP message (request ID + body) on a raw connection. */
static void
raw_send_frame(int fd, const uint8_t *body, size_t len)
{
	uint8_t head[12];

	put_be64(head, len + 4);
	head[8] = 0x80, head[9] = 0, head[10] = 0, head[11] = 1; /* req id */
	write_all(fd, head, sizeof(head));
	write_all(fd, body, len);
}

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
		int fd = raw_connect(cwi_listener_url(s.l));
		write_all(fd, sp_req_header, sizeof(sp_req_header));
		raw_send_frame(fd, frames[k], lens[k]);
		ck_assert(closed_by_server(fd));
		close(fd);
		ck_assert_msg(log_wait(reasons[k]), "frame %d: log: %s", k,
		    log_buf);
	}
	ck_assert_int_eq(s.handled, 0);
	{
		cwi_conn *c = dial(&s);
		call_ok(c, "echo still here", "echo still here");
		cwi_conn_destroy(c);
	}
	log_stop();
	srv_stop(&s);
}
END_TEST

START_TEST(test_hostile_100_idle_connections)
{
	enum { N = 100 };
	int fds[N];
	long before, after;
	tsrv s;

	srv_start(&s, 1, NULL);
	before = rss_kib();
	for (int k = 0; k < N; k++) {
		fds[k] = raw_connect(cwi_listener_url(s.l));
		/* Half complete the SP handshake and then idle; half never
		 * say anything. */
		if (k % 2 == 0)
			write_all(fds[k], sp_req_header, sizeof(sp_req_header));
	}
	{
		cwi_conn *c = dial(&s);
		call_ok(c, "echo still here", "echo still here");
		cwi_conn_destroy(c);
	}
	after = rss_kib();
	ck_assert_msg(after - before < 64 * 1024, "RSS grew %ld KiB",
	    after - before);
	for (int k = 0; k < N; k++)
		close(fds[k]);
	srv_stop(&s);
}
END_TEST

Suite *
cwt_transport_suite(void)
{
	Suite *s = suite_create("transport");
	TCase *conf = tcase_create("conformance");
	TCase *msg = tcase_create("message");
	TCase *hostile = tcase_create("hostile");

	(void)tnames;
	tcase_set_timeout(conf, 60);
	tcase_add_loop_test(conf, test_roundtrip, 0, NTRANSPORTS);
	tcase_add_loop_test(conf, test_many_concurrent_clients, 0, NTRANSPORTS);
	tcase_add_loop_test(conf, test_requests_in_flight_answered_out_of_order,
	    0, NTRANSPORTS);
	tcase_add_loop_test(conf, test_elements_round_trip, 0, NTRANSPORTS);
	tcase_add_loop_test(conf, test_received_elements_outlive_their_message,
	    0, NTRANSPORTS);
	tcase_add_loop_test(conf, test_header_only_and_empty_messages, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_handler_error_reaches_client, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_message_with_taken_element_is_refused, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_timeout_when_server_never_replies, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_cq_wait_times_out_and_closes, 0, 1);
	tcase_add_loop_test(conf, test_conn_close_wakes_blocked_call, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_listener_close_wakes_blocked_call, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_cq_close_wakes_waiter, 0, NTRANSPORTS);
	tcase_add_loop_test(conf, test_oversized_request_resets_sender_only, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_reject_resets_connection_with_reason, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_listen_on_taken_address_fails, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_dial_without_listener_is_refused, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_listener_reopened_is_found_again, 0,
	    NTRANSPORTS);
	tcase_add_loop_test(conf, test_bad_urls, 0, 1);
	suite_add_tcase(s, conf);

	tcase_add_test(msg, test_msg_ownership_and_size);
	suite_add_tcase(s, msg);

	tcase_set_timeout(hostile, 60);
	tcase_add_test(hostile, test_hostile_garbage_bytes);
	tcase_add_test(hostile, test_hostile_8gib_length_header);
	tcase_add_test(hostile, test_hostile_frame_with_lying_counts);
	tcase_add_test(hostile, test_hostile_100_idle_connections);
	suite_add_tcase(s, hostile);
	return s;
}
