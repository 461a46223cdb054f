/*
 * check_provision.c - provisioners, each against the real thing on
 * loopback: "static" alone; "process" with a real `cachewd
 * --role=dispatcher` and the `cachewd --role=worker` children it starts
 * (registration checked with `cachew status --json`, processes by pid);
 * "kubernetes" against test/servers/k8s_api.py, an HTTPS stand-in for the
 * API server that checks each request exactly, answers from a script and
 * logs every request. Every wait polls a condition with a bound; the
 * certificates are made at test time with the openssl CLI.
 */
#include "cwt.h"

#include "../src/provision/provision.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS cwt_bound_ms(20000) /* bound of every wait on a condition */

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

static cwi_prov_status
status_of(cwi_provisioner *p)
{
	cwi_prov_status st;

	cwi_provisioner_status(p, &st);
	return st;
}

/* Polls the status (bounded) until cond(st, arg) holds; fails the test
 * with the last status otherwise. */
typedef bool (*status_cond)(const cwi_prov_status *st, uint64_t arg);

static cwi_prov_status
await_status(cwi_provisioner *p, status_cond cond, uint64_t arg,
    const char *what)
{
	uint64_t deadline = cwt_now_ms() + WAIT_MS;
	cwi_prov_status st;

	for (;;) {
		st = status_of(p);
		if (cond(&st, arg))
			return st;
		if (cwt_now_ms() > deadline)
			ck_abort_msg("timed out waiting for %s: target=%u "
			    "running=%u stopping=%u requests=%llu failures=%llu "
			    "last_error='%s'", what, st.target, st.running,
			    st.stopping, (unsigned long long)st.requests,
			    (unsigned long long)st.failures, st.last_error);
		cwt_nap_ms(10);
	}
}

static bool
settled_at(const cwi_prov_status *st, uint64_t n)
{
	return st->running == n && st->stopping == 0;
}

static bool
requests_at_least(const cwi_prov_status *st, uint64_t n)
{
	return st->requests >= n;
}

static bool
failures_at_least(const cwi_prov_status *st, uint64_t n)
{
	return st->failures >= n;
}


static bool
pid_gone(pid_t pid)
{
	return kill(pid, 0) == -1 && errno == ESRCH;
}

/* ---- static ---------------------------------------------------------------- */

START_TEST(static_records_targets_within_bounds)
{
	cwi_prov_config c;
	cwi_provisioner *p;
	cwi_prov_status st;

	cwi_prov_config_default(&c);
	c.min_workers = 1;
	c.max_workers = 5;
	ck_assert_int_eq(cwi_provisioner_create(&p, &c), CACHEW_OK);
	st = status_of(p);
	ck_assert_str_eq(st.kind, "static");
	ck_assert_uint_eq(st.target, 1);
	/* It runs nothing: the dispatcher counts who registered (issue
	 * 17: reporting the target showed 8 running beside 1 worker). */
	ck_assert(st.pool_registered);
	ck_assert_uint_eq(st.running, 0);
	ck_assert_uint_eq(st.action_mask, 0);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 3), CACHEW_OK);
	st = status_of(p);
	ck_assert_uint_eq(st.target, 3);
	ck_assert_uint_eq(st.running, 0);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 9), CACHEW_OK);
	ck_assert_uint_eq(status_of(p).target, 5);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 0), CACHEW_OK);
	st = status_of(p);
	ck_assert_uint_eq(st.target, 1);
	ck_assert_uint_eq(st.requests, 0);
	ck_assert_uint_eq(st.failures, 0);
	ck_assert_str_eq(st.last_error, "");
	cwi_provisioner_destroy(p);
	cwi_provisioner_destroy(NULL);
}
END_TEST

/* Creates with cfg and expects err with errmsg containing `needle`. */
static void
expect_refused(const cwi_prov_config *c, cachew_err err, const char *needle)
{
	cwi_provisioner *p = (cwi_provisioner *)1;

	ck_assert_int_eq(cwi_provisioner_create(&p, c), err);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(cachew_errmsg(), needle) != NULL,
	    "errmsg '%s' lacks '%s'", cachew_errmsg(), needle);
}

START_TEST(bad_kind_or_settings_are_refused_by_name)
{
	char *dir = cwt_tmpdir();
	char *text = fmt("%s/not-a-program", dir);
	cwi_prov_config c;

	cwi_prov_config_default(&c);
	c.kind = "cloud";
	expect_refused(&c, CACHEW_ENOENT, "unknown kind 'cloud'");
	cwi_prov_config_default(&c);
	c.min_workers = 4;
	c.max_workers = 2;
	expect_refused(&c, CACHEW_EINVAL, "min_workers 4 is above max_workers 2");
	cwi_prov_config_default(&c);
	c.kind = "process";
	expect_refused(&c, CACHEW_EINVAL, "no dispatcher URL");
	c.dispatcher = ""; /* option tables' "unset" */
	expect_refused(&c, CACHEW_EINVAL, "no dispatcher URL");
	c.dispatcher = "tcp://127.0.0.1:1";
	c.cachewd = text;
	expect_refused(&c, CACHEW_EINVAL, "is not an executable file");
	c.cachewd = "/bin/true";
	c.max_workers = 5000;
	expect_refused(&c, CACHEW_EINVAL, "max_workers 5000 is above 1024");
	cwi_prov_config_default(&c);
	c.kind = "kubernetes";
	unsetenv("KUBERNETES_SERVICE_HOST");
	expect_refused(&c, CACHEW_EINVAL, "no API server");
	c.api_url = "https://127.0.0.1:1";
	c.k8s_namespace = "ns/../../x";
	expect_refused(&c, CACHEW_EINVAL, "'ns/../../x' is not a valid "
	    "namespace name");
	c.k8s_namespace = "ns";
	c.deployment = "Workers";
	expect_refused(&c, CACHEW_EINVAL, "'Workers' is not a valid "
	    "deployment name");
	c.deployment = "w";
	c.api_url = "ftp://127.0.0.1";
	expect_refused(&c, CACHEW_EINVAL, "is not an https://");
	free(text);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- the kubernetes reply scanner ------------------------------------------ */

/* Copies text into an exactly sized heap block, so a read past the end is
 * caught by ASan and valgrind. */
static char *
exact(const char *text, size_t len)
{
	char *b = malloc(len > 0 ? len : 1);

	memcpy(b, text, len);
	return b;
}

static bool
replicas_of(const char *text, size_t len, uint32_t *n)
{
	char *b = exact(text, len);
	char why[200];
	bool ok = cwi_k8s_scale_replicas(b, len, n, why, sizeof(why));

	free(b);
	return ok;
}

static bool
replicas_in(const char *text, uint32_t *n)
{
	return replicas_of(text, strlen(text), n);
}

/* The reason a Scale reply is refused (static buffer). */
static const char *
replicas_why(const char *text)
{
	static char why[200];
	uint32_t n = 42;
	char *b = exact(text, strlen(text));

	why[0] = '\0';
	ck_assert(!cwi_k8s_scale_replicas(b, strlen(text), &n, why,
	    sizeof(why)));
	ck_assert_uint_eq(n, 42);
	free(b);
	return why;
}

START_TEST(k8s_reply_reader_reads_replicas_exactly)
{
	const char *scale = "{\"kind\":\"Scale\",\"metadata\":{\"name\":\"w\","
			    "\"annotations\":{\"x\":\"{\\\"spec\\\":1}\"},"
			    "\"list\":[1,{\"replicas\":9},[true,null]]},"
			    "\"spec\":{\"replicas\":7},\"status\":{\"selector\":"
			    "\"a=b\", \"replicas\" : 5 }}";
	uint32_t n = 0;

	ck_assert(replicas_of(scale, strlen(scale), &n));
	ck_assert_uint_eq(n, 5);
	ck_assert(replicas_in("{\"spec\":{\"replicas\":7}}", &n));
	ck_assert_uint_eq(n, 7);
	ck_assert(replicas_in("{\"spec\":{\"replicas\":7},\"status\":{}}", &n));
	ck_assert_uint_eq(n, 7);
	ck_assert(replicas_in("{\"spec\":{\"replicas\":4294967295}}", &n));
	ck_assert_uint_eq(n, UINT32_MAX);
	n = 42;
	ck_assert(!replicas_in("{\"spec\":{\"replicas\":4294967296}}", &n));
	ck_assert(!replicas_in("{\"spec\":{\"replicas\":-1}}", &n));
	ck_assert(!replicas_in("{\"spec\":{\"replicas\":3.5}}", &n));
	ck_assert(!replicas_in("{\"spec\":{\"replicas\":\"3\"}}", &n));
	ck_assert(!replicas_in("[{\"spec\":{\"replicas\":3}}]", &n));
	ck_assert(!replicas_in("", &n));
	ck_assert_uint_eq(n, 42);
	/* Every truncation fails: a strict parser takes no prefix for the
	 * document, and lengths are never trusted beyond the bytes present. */
	for (size_t len = 0; len < strlen(scale); len++)
		ck_assert_msg(!replicas_of(scale, len, &n), "prefix %zu", len);
}
END_TEST

START_TEST(k8s_bad_scale_replies_name_the_field)
{
	ck_assert_str_eq(replicas_why("{\"spec\":{\"replicas\":\"3\"}}"),
	    "spec.replicas is a string, not an integer");
	ck_assert_str_eq(replicas_why("{\"status\":{\"replicas\":2.5},"
				      "\"spec\":{\"replicas\":3}}"),
	    "status.replicas is a fractional number, not an integer");
	ck_assert_str_eq(replicas_why("{\"spec\":{\"replicas\":4294967296}}"),
	    "spec.replicas is 4294967296, outside [0, 4294967295]");
	ck_assert_str_eq(replicas_why("{\"spec\":[1]}"),
	    "spec is an array, not an object");
	ck_assert_str_eq(replicas_why("[{\"spec\":{\"replicas\":3}}]"),
	    "the reply is an array, not an object");
	ck_assert_str_eq(replicas_why("{\"kind\":\"Scale\"}"),
	    "neither status.replicas nor spec.replicas is present");
	/* A key given twice is ambiguous: refused, not last-one-wins. */
	ck_assert_ptr_nonnull(strstr(replicas_why("{\"spec\":{\"replicas\":1,"
						  "\"replicas\":2}}"),
	    "duplicate object key"));
	/* Truncated, a number too big for any integer type, nesting past
	 * the parser's limit: each says where. */
	ck_assert_ptr_nonnull(strstr(replicas_why("{\"spec\":{\"replicas\":3"),
	    "line 1, column 21 (byte 21)"));
	ck_assert_ptr_nonnull(strstr(replicas_why("{\"spec\":{\"replicas\":"
						  "99999999999999999999}}"),
	    "too big integer"));
	size_t deep = 200000;
	char *d = malloc(deep + 1);
	memcpy(d, "{\"a\":", 5);
	memset(d + 5, '[', deep - 5);
	d[deep] = '\0';
	ck_assert_ptr_nonnull(strstr(replicas_why(d), "maximum parsing depth"));
	free(d);
}
END_TEST

START_TEST(k8s_reply_reader_reads_status_messages)
{
	const char *st = "{\"kind\":\"Status\",\"details\":{\"message\":\"no\"},"
			 "\"message\":\"a \\\"b\\\"\\nc\\u00e9d\\\\\"}";
	char buf[64];
	char *b = exact(st, strlen(st));

	ck_assert(cwi_k8s_status_message(b, strlen(st), buf, sizeof(buf)));
	ck_assert_str_eq(buf, "a \"b\" c\xc3\xa9" "d\\");
	ck_assert(cwi_k8s_status_message(b, strlen(st), buf, 5));
	ck_assert_str_eq(buf, "a \"b");
	/* A cut never splits a character: "a \"b\" c" and not half of é. */
	ck_assert(cwi_k8s_status_message(b, strlen(st), buf, 9));
	ck_assert_str_eq(buf, "a \"b\" c");
	ck_assert(cwi_k8s_status_message(b, strlen(st), buf, 10));
	ck_assert_str_eq(buf, "a \"b\" c\xc3\xa9");
	for (size_t len = 0; len < strlen(st); len++)
		ck_assert(!cwi_k8s_status_message(b, len, buf, sizeof(buf)));
	free(b);
	ck_assert(!cwi_k8s_status_message("{\"message\":5}", 13, buf,
	    sizeof(buf)));
	ck_assert(!cwi_k8s_status_message("not json", 8, buf, sizeof(buf)));
	/* Invalid UTF-8 is not a Status: the caller shows the raw line. */
	ck_assert(!cwi_k8s_status_message("{\"message\":\"\xff\"}", 16, buf,
	    sizeof(buf)));
}
END_TEST

/* ---- process ---------------------------------------------------------------- */

typedef struct proc_fixture {
	char *dir;
	char *logs;
	char cachewd[600];
	cwt_daemon dispatcher;
	cwi_provisioner *p;
} proc_fixture;

static const char *const worker_args[] = {"--heartbeat-ms", "50",
    "--threads", "1", NULL};

static void
proc_config(proc_fixture *f, cwi_prov_config *c, uint32_t max)
{
	cwi_prov_config_default(c);
	c->kind = "process";
	c->max_workers = max;
	c->cachewd = f->cachewd;
	c->dispatcher = f->dispatcher.url;
	c->worker_args = worker_args;
	c->log_dir = f->logs;
	c->stop_timeout_ms = 10000;
	c->retry_max_ms = 1000;
}

static void
proc_setup(proc_fixture *f, uint32_t max)
{
	cwi_prov_config c;

	memset(f, 0, sizeof(*f));
	f->dir = cwt_tmpdir();
	f->logs = fmt("%s/logs", f->dir);
	snprintf(f->cachewd, sizeof(f->cachewd), "%s/cachewd",
	    cwt_build_dir());
	cwt_daemon_start(&f->dispatcher, f->dir, "dispatcher",
	    "--role=dispatcher", "--listen", "tcp://127.0.0.1:0",
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    (char *)NULL);
	proc_config(f, &c, max);
	ck_assert_msg(cwi_provisioner_create(&f->p, &c) == CACHEW_OK, "%s",
	    cachew_errmsg());
}

static void
proc_teardown(proc_fixture *f)
{
	cwi_provisioner_destroy(f->p);
	cwt_daemon_stop(&f->dispatcher, SIGTERM);
	cwt_rmtree(f->dir);
	free(f->logs);
	free(f->dir);
}

/* `cachew status --json` of the dispatcher, or NULL. */
static char *
dispatcher_status(const proc_fixture *f)
{
	char *out = fmt("%s/status.json", f->dir);
	char *cmd = fmt("%s/cachew status %s --json > %s 2>/dev/null",
	    cwt_build_dir(), f->dispatcher.url, out);
	char *json = system(cmd) == 0 ? cwt_slurp(out) : NULL;

	free(cmd);
	free(out);
	return json;
}

/* The pid of the latest `cachewd` started in slot (from its log's last
 * "event=listening role=worker url=... pid=..." line) once the dispatcher
 * lists that worker's url: waits (bounded) until that process, not an
 * earlier one, registered. `not` excludes an earlier pid of the same slot.
 * The worker registers from its heartbeat thread, so its "registered" log
 * line may come before or after main's "listening" line: the dispatcher's
 * list is what says it registered. */
static pid_t
slot_pid(const proc_fixture *f, unsigned slot, pid_t not)
{
	char *path = fmt("%s/worker-%u.log", f->logs, slot);
	uint64_t deadline = cwt_now_ms() + WAIT_MS;

	while (cwt_now_ms() < deadline) {
		char *log = cwt_slurp(path), *p, *last = NULL, *url, *status;
		pid_t pid = 0;
		for (p = log; p != NULL &&
		     (p = strstr(p, "event=listening role=worker")) != NULL; p++)
			last = p;
		if (last != NULL && (p = strstr(last, " pid=")) != NULL)
			pid = (pid_t)atoi(p + 5);
		if (pid != 0 && pid != not &&
		    (url = strstr(last, " url=")) != NULL) {
			url += 5;
			char *want = fmt("\"address\":\"%.*s\"",
			    (int)strcspn(url, " \n"), url);
			status = dispatcher_status(f);
			int registered = status != NULL &&
			    strstr(status, want) != NULL;
			free(status);
			free(want);
			if (registered) {
				free(log);
				free(path);
				return pid;
			}
		}
		free(log);
		cwt_nap_ms(10);
	}
	ck_abort_msg("worker in slot %u did not start and register (%s)", slot,
	    path);
	return 0;
}

/* The dispatcher's worker count, from `cachew status --json`. */
static int
registered_workers(const proc_fixture *f)
{
	char *json = dispatcher_status(f);
	const char *w = json != NULL ? strstr(json, "\"workers\":[") : NULL;
	const char *end = w != NULL ? strchr(w, ']') : NULL;
	int n = json != NULL ? 0 : -1;

	for (const char *p = w; p != NULL && p < end &&
	     (p = strstr(p, "\"address\":")) != NULL && p < end; p++)
		n++;
	free(json);
	return n;
}

static void
await_registered(const proc_fixture *f, int n)
{
	uint64_t deadline = cwt_now_ms() + WAIT_MS;
	int got;

	while ((got = registered_workers(f)) != n) {
		ck_assert_msg(cwt_now_ms() < deadline, "dispatcher lists %d "
		    "workers, not %d", got, n);
		cwt_nap_ms(20);
	}
}

START_TEST(process_scales_up_down_and_to_zero)
{
	proc_fixture f;
	cwi_prov_status st;

	proc_setup(&f, 8);
	st = status_of(f.p);
	ck_assert_str_eq(st.kind, "process");
	ck_assert_uint_eq(st.running, 0);
	ck_assert_int_eq(cwi_provisioner_set_target(f.p, 2), CACHEW_OK);
	await_status(f.p, settled_at, 2, "2 workers");
	pid_t w1 = slot_pid(&f, 1, 0), w2 = slot_pid(&f, 2, 0);
	await_registered(&f, 2);

	/* The newest goes: it drains, deregisters and exits 0. */
	ck_assert_int_eq(cwi_provisioner_set_target(f.p, 1), CACHEW_OK);
	st = await_status(f.p, settled_at, 1, "1 worker");
	ck_assert_uint_eq(st.failures, 0);
	ck_assert_str_eq(st.last_error, "");
	ck_assert(pid_gone(w2));
	ck_assert_int_eq(kill(w1, 0), 0);
	char *log2 = fmt("%s/worker-2.log", f.logs), *text = cwt_slurp(log2);
	ck_assert_ptr_nonnull(strstr(text, "event=deregistered"));
	ck_assert_ptr_nonnull(strstr(text, "event=stopped role=worker"));
	free(text);
	free(log2);
	await_registered(&f, 1);

	ck_assert_int_eq(cwi_provisioner_set_target(f.p, 0), CACHEW_OK);
	st = await_status(f.p, settled_at, 0, "no worker");
	ck_assert(pid_gone(w1));
	await_registered(&f, 0);
	ck_assert_uint_eq(st.requests, 4); /* 2 starts, 2 stops */
	ck_assert(!st.pool_registered);
	ck_assert_uint_eq(st.actions[CWI_PROV_START][0], 2);
	ck_assert_uint_eq(st.actions[CWI_PROV_STOP][0], 2);
	ck_assert_uint_eq(st.actions[CWI_PROV_RESTART][0], 0);
	ck_assert_uint_eq(st.actions[CWI_PROV_SCALE][0], 0);
	ck_assert_uint_eq(st.action_mask, 1u << CWI_PROV_START |
	    1u << CWI_PROV_RESTART | 1u << CWI_PROV_STOP);
	ck_assert_uint_eq(st.failures, 0);
	ck_assert_str_eq(st.last_error, "");
	proc_teardown(&f);
}
END_TEST

START_TEST(process_restarts_a_killed_worker)
{
	proc_fixture f;
	cwi_prov_status st;

	proc_setup(&f, 8);
	ck_assert_int_eq(cwi_provisioner_set_target(f.p, 1), CACHEW_OK);
	await_status(f.p, settled_at, 1, "1 worker");
	pid_t first = slot_pid(&f, 1, 0);
	ck_assert_int_eq(kill(first, SIGKILL), 0);
	/* A new process takes slot 1 and registers. */
	pid_t second = slot_pid(&f, 1, first);
	ck_assert_int_ne(second, first);
	st = await_status(f.p, settled_at, 1, "the restart");
	ck_assert_uint_eq(st.failures, 1);
	ck_assert_uint_eq(st.requests, 2);
	/* The death is its start's failure, not an action of its own; the
	 * new process is a restart. */
	ck_assert_uint_eq(st.actions[CWI_PROV_START][0], 1);
	ck_assert_uint_eq(st.actions[CWI_PROV_START][1], 0);
	ck_assert_uint_eq(st.actions[CWI_PROV_RESTART][0], 1);
	char *want = fmt("process: worker 1 (pid %d) was killed by signal 9",
	    (int)first);
	ck_assert_msg(strncmp(st.last_error, want, strlen(want)) == 0,
	    "last_error: %s", st.last_error);
	free(want);
	ck_assert(pid_gone(first));
	cwi_provisioner_destroy(f.p);
	f.p = NULL;
	ck_assert(pid_gone(second));
	proc_teardown(&f);
}
END_TEST

START_TEST(process_caps_at_max_workers_and_destroy_stops_all)
{
	proc_fixture f;
	cwi_prov_status st;

	proc_setup(&f, 2);
	ck_assert_int_eq(cwi_provisioner_set_target(f.p, 5), CACHEW_OK);
	st = await_status(f.p, settled_at, 2, "2 workers");
	ck_assert_uint_eq(st.target, 2);
	pid_t w1 = slot_pid(&f, 1, 0), w2 = slot_pid(&f, 2, 0);
	await_registered(&f, 2);
	st = status_of(f.p);
	ck_assert_uint_eq(st.running, 2);
	ck_assert_uint_eq(st.requests, 2);
	char *log3 = fmt("%s/worker-3.log", f.logs);
	ck_assert_int_ne(access(log3, F_OK), 0);
	free(log3);
	/* destroy drains them (exit 0) and reaps them: no process is left. */
	cwi_provisioner_destroy(f.p);
	f.p = NULL;
	ck_assert(pid_gone(w1));
	ck_assert(pid_gone(w2));
	await_registered(&f, 0);
	proc_teardown(&f);
}
END_TEST

START_TEST(process_crash_loop_reports_exit_status_with_backoff)
{
	char *dir = cwt_tmpdir();
	char *crash = fmt("%s/crash.sh", dir);
	const char *script = "#!/bin/sh\necho \"crashing: $*\" >&2\nexit 3\n";
	cwi_prov_config c;
	cwi_provisioner *p;
	cwi_prov_status st;

	cwt_write_file(crash, script, strlen(script));
	ck_assert_int_eq(chmod(crash, 0755), 0);
	cwi_prov_config_default(&c);
	c.kind = "process";
	c.cachewd = crash;
	c.dispatcher = "tcp://127.0.0.1:9";
	c.log_dir = dir;
	c.retry_max_ms = 200;
	c.min_workers = 1;
	ck_assert_int_eq(cwi_provisioner_create(&p, &c), CACHEW_OK);
	/* min_workers starts one at once; each exit is a failure and a new
	 * start after the backoff. */
	st = await_status(p, failures_at_least, 3, "3 crashes");
	ck_assert_msg(strstr(st.last_error, "process: worker 1 (pid ") ==
	    st.last_error && strstr(st.last_error, ") exited with status 3; "
	    "restarting in ") != NULL, "last_error: %s", st.last_error);
	ck_assert_uint_ge(st.requests, st.failures);
	cwi_provisioner_destroy(p);
	char *logp = fmt("%s/worker-1.log", dir), *log = cwt_slurp(logp);
	ck_assert_ptr_nonnull(strstr(log, "crashing: --role=worker "
	    "--dispatcher tcp://127.0.0.1:9 --listen tcp://127.0.0.1:0\n"));
	ck_assert_int_ge(cwt_count(log, "crashing:"), 3);
	free(log);
	free(logp);
	free(crash);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(process_exec_failure_names_the_cause)
{
	char *dir = cwt_tmpdir();
	char *bogus = fmt("%s/bogus", dir);
	const char junk[] = "\x7f" "ELF not really";
	cwi_prov_config c;
	cwi_provisioner *p;
	cwi_prov_status st;

	cwt_write_file(bogus, junk, sizeof(junk) - 1);
	ck_assert_int_eq(chmod(bogus, 0755), 0);
	cwi_prov_config_default(&c);
	c.kind = "process";
	c.cachewd = bogus;
	c.dispatcher = "tcp://127.0.0.1:9";
	c.retry_max_ms = 200;
	ck_assert_int_eq(cwi_provisioner_create(&p, &c), CACHEW_OK);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 1), CACHEW_OK);
	st = await_status(p, failures_at_least, 1, "the exec failure");
	char *want = fmt("process: worker 1: cannot execute %s: Exec format "
	    "error; retrying in ", bogus);
	ck_assert_msg(strncmp(st.last_error, want, strlen(want)) == 0,
	    "last_error: %s", st.last_error);
	ck_assert_uint_eq(st.running, 0);
	free(want);
	cwi_provisioner_destroy(p);
	free(bogus);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- kubernetes ------------------------------------------------------------ */

#define SCALE_PATH "/apis/apps/v1/namespaces/ns/deployments/cachew-worker/scale"

typedef struct k8s_fixture {
	char *dir;
	char log[600], token[600], cert[600], other[600];
	pid_t pid;
	int port;
	char url[64];
} k8s_fixture;

/* A self-signed certificate for 127.0.0.1 (srv.pem, srv.key) and an
 * unrelated one (other.pem) in dir; false when there is no openssl. */
static bool
make_certs(k8s_fixture *f)
{
	const char *req = "openssl req -x509 -newkey ec -pkeyopt "
			  "ec_paramgen_curve:prime256v1 -nodes -days 2 "
			  "-subj /CN=127.0.0.1 -addext "
			  "subjectAltName=IP:127.0.0.1";

	if (system("command -v openssl >/dev/null 2>&1") != 0) {
		printf("provision: skipping the kubernetes tests: no openssl "
		       "command to make a certificate with\n");
		return false;
	}
	char *cmd = fmt("cd '%s' && { %s -keyout srv.key -out srv.pem && "
			"%s -keyout other.key -out other.pem; } >openssl.log "
			"2>&1", f->dir, req, req);
	ck_assert_msg(system(cmd) == 0, "openssl failed: see %s/openssl.log",
	    f->dir);
	free(cmd);
	snprintf(f->cert, sizeof(f->cert), "%s/srv.pem", f->dir);
	snprintf(f->other, sizeof(f->other), "%s/other.pem", f->dir);
	return true;
}

/* The API stand-in of the running test: a failed assertion exits the
 * (forked) test, and this atexit handler then stops the server. */
static pid_t server_pid;

static void
kill_server(void)
{
	if (server_pid > 0) {
		kill(server_pid, SIGKILL);
		waitpid(server_pid, NULL, 0);
		server_pid = 0;
	}
}

static void
set_token(const k8s_fixture *f, const char *token)
{
	char *tmp = fmt("%s.tmp", f->token);

	/* Written aside and renamed in, as kubelet swaps projected tokens. */
	cwt_write_file(tmp, token, strlen(token));
	ck_assert_int_eq(rename(tmp, f->token), 0);
	free(tmp);
}

/* Starts k8s_api.py expecting `token` and answering `script`. false (the
 * test skips) without openssl. */
static bool
k8s_start(k8s_fixture *f, const char *token, const char *script,
    const char *status_offset)
{
	char portfile[600], key[600], want[64];

	memset(f, 0, sizeof(*f));
	f->dir = cwt_tmpdir();
	if (!make_certs(f)) {
		cwt_rmtree(f->dir);
		free(f->dir);
		return false;
	}
	snprintf(f->log, sizeof(f->log), "%s/requests.log", f->dir);
	snprintf(f->token, sizeof(f->token), "%s/token", f->dir);
	snprintf(portfile, sizeof(portfile), "%s/port", f->dir);
	snprintf(key, sizeof(key), "%s/srv.key", f->dir);
	snprintf(want, sizeof(want), "%s", token);
	char *argv[] = {"/usr/bin/python3", "test/servers/k8s_api.py", "--log",
	    f->log, "--portfile", portfile, "--token", want, "--namespace",
	    "ns", "--script", (char *)script, "--status-offset",
	    (char *)status_offset, "--tls-cert", f->cert, "--tls-key", key,
	    NULL};
	fflush(NULL);
	f->pid = fork();
	ck_assert_int_ge(f->pid, 0);
	if (f->pid == 0) {
		execv(argv[0], argv);
		_exit(127);
	}
	if (server_pid == 0)
		atexit(kill_server);
	server_pid = f->pid;
	uint64_t deadline = cwt_now_ms() + WAIT_MS;
	while (f->port <= 0) {
		char *s = cwt_slurp(portfile);
		if (s != NULL)
			f->port = atoi(s);
		free(s);
		if (f->port > 0)
			break;
		ck_assert_msg(waitpid(f->pid, NULL, WNOHANG) == 0,
		    "k8s_api.py exited early");
		ck_assert_msg(cwt_now_ms() < deadline, "k8s_api.py did not "
		    "start");
		cwt_nap_ms(20);
	}
	snprintf(f->url, sizeof(f->url), "https://127.0.0.1:%d", f->port);
	return true;
}

static void
k8s_stop(k8s_fixture *f)
{
	kill(f->pid, SIGTERM);
	waitpid(f->pid, NULL, 0);
	server_pid = -1;
	cwt_rmtree(f->dir);
	free(f->dir);
}

static cwi_provisioner *
k8s_provisioner(const k8s_fixture *f, const char *ca)
{
	cwi_prov_config c;
	cwi_provisioner *p;

	cwi_prov_config_default(&c);
	c.kind = "kubernetes";
	c.max_workers = 10;
	c.api_url = f->url;
	c.token_file = f->token;
	c.ca_file = ca != NULL ? ca : f->cert;
	c.k8s_namespace = "ns";
	c.retry_max_ms = 2000;
	c.request_timeout_ms = 10000;
	ck_assert_msg(cwi_provisioner_create(&p, &c) == CACHEW_OK, "%s",
	    cachew_errmsg());
	return p;
}

/* The server's log lines (free). */
static char *
requests_log(const k8s_fixture *f)
{
	char *s = cwt_slurp(f->log);

	ck_assert_ptr_nonnull(s);
	return s;
}

/* The i-th (0-based) log line (free), or NULL. */
static char *
log_line(const char *log, int i)
{
	const char *p = log;

	while (i-- > 0 && p != NULL) {
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	if (p == NULL || *p == '\0')
		return NULL;
	return strndup(p, strcspn(p, "\n"));
}

static double
line_time(const char *line)
{
	ck_assert(strncmp(line, "t=", 2) == 0);
	return strtod(line + 2, NULL);
}

START_TEST(k8s_patch_is_exact_and_status_replicas_are_reported)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-1", "", "-1"))
		return;
	set_token(&f, "tok-1\n");
	cwi_provisioner *p = k8s_provisioner(&f, NULL);
	cwi_prov_status st = status_of(p);
	ck_assert_str_eq(st.kind, "kubernetes");
	ck_assert_int_eq(cwi_provisioner_set_target(p, 3), CACHEW_OK);
	st = await_status(p, requests_at_least, 1, "the PATCH");
	/* The server said status.replicas 2 for spec.replicas 3: pods come
	 * up later, and running says what exists. */
	ck_assert_uint_eq(st.running, 2);
	ck_assert_uint_eq(st.target, 3);
	ck_assert_uint_eq(st.failures, 0);
	ck_assert_uint_eq(st.actions[CWI_PROV_SCALE][0], 1);
	ck_assert_uint_eq(st.action_mask, 1u << CWI_PROV_SCALE);
	ck_assert_str_eq(st.last_error, "");
	cwi_provisioner_destroy(p);
	char *log = requests_log(&f);
	ck_assert_int_eq(cwt_count(log, "\n"), 1);
	ck_assert_ptr_nonnull(strstr(log, " PATCH " SCALE_PATH " auth=Bearer "
	    "tok-1 ctype=application/merge-patch+json "
	    "body={\"spec\":{\"replicas\":3}} status=200\n"));
	free(log);
	k8s_stop(&f);
}
END_TEST

START_TEST(k8s_in_cluster_environment_names_the_api_server)
{
	k8s_fixture f;
	cwi_prov_config c;
	cwi_provisioner *p;
	char port[16];

	if (!k8s_start(&f, "tok-1", "", "0"))
		return;
	set_token(&f, "tok-1");
	snprintf(port, sizeof(port), "%d", f.port);
	setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
	setenv("KUBERNETES_SERVICE_PORT", port, 1);
	cwi_prov_config_default(&c);
	c.kind = "kubernetes";
	c.token_file = f.token;
	c.ca_file = f.cert;
	c.k8s_namespace = "ns";
	ck_assert_msg(cwi_provisioner_create(&p, &c) == CACHEW_OK, "%s",
	    cachew_errmsg());
	ck_assert_int_eq(cwi_provisioner_set_target(p, 4), CACHEW_OK);
	cwi_prov_status st = await_status(p, requests_at_least, 1, "the PATCH");
	ck_assert_uint_eq(st.running, 4);
	ck_assert_str_eq(st.last_error, "");
	cwi_provisioner_destroy(p);
	unsetenv("KUBERNETES_SERVICE_HOST");
	unsetenv("KUBERNETES_SERVICE_PORT");
	k8s_stop(&f);
}
END_TEST

START_TEST(k8s_nothing_is_sent_before_the_first_target)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-1", "", "0"))
		return;
	set_token(&f, "tok-1");
	cwi_provisioner *p = k8s_provisioner(&f, NULL);
	/* A restarted dispatcher must not scale the Deployment to
	 * min_workers on its own: nothing goes out until set_target (the
	 * nap gives a wrong implementation the time to send). */
	cwt_nap_ms(300);
	ck_assert_uint_eq(status_of(p).requests, 0);
	cwi_provisioner_destroy(p);
	char *log = requests_log(&f);
	ck_assert_str_eq(log, "");
	free(log);
	k8s_stop(&f);
}
END_TEST

/* Scripted failures that pass: each is retried until the PATCH succeeds. */
static void
check_retried(const char *script, int failures, int min_gap_ms)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-1", script, "0"))
		return;
	set_token(&f, "tok-1");
	cwi_provisioner *p = k8s_provisioner(&f, NULL);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 2), CACHEW_OK);
	cwi_prov_status st = await_status(p, requests_at_least,
	    (uint64_t)failures + 1, "the retries");
	cwi_provisioner_destroy(p);
	ck_assert_uint_eq(st.requests, (uint64_t)failures + 1);
	ck_assert_uint_eq(st.failures, (uint64_t)failures);
	ck_assert_uint_eq(st.running, 2);
	ck_assert_str_eq(st.last_error, "");
	char *log = requests_log(&f);
	ck_assert_int_eq(cwt_count(log, "\n"), failures + 1);
	ck_assert_int_eq(cwt_count(log, "body={\"spec\":{\"replicas\":2}}"),
	    failures + 1);
	ck_assert_int_eq(cwt_count(log, "status=200\n"), 1);
	ck_assert_ptr_null(strstr(log, " bad="));
	if (min_gap_ms > 0) {
		char *a = log_line(log, 0), *b = log_line(log, 1);
		double gap = line_time(b) - line_time(a);
		ck_assert_msg(gap * 1000 >= min_gap_ms - 50, "retried %.3f s "
		    "after a 429 with Retry-After", gap);
		free(a);
		free(b);
	}
	free(log);
	k8s_stop(&f);
}

START_TEST(k8s_409_conflict_is_retried)
{
	check_retried("409", 1, 0);
}
END_TEST

START_TEST(k8s_500_twice_is_retried_with_backoff)
{
	check_retried("500,503", 2, 0);
}
END_TEST

START_TEST(k8s_429_waits_for_retry_after)
{
	/* Retry-After: 1 s, where the backoff alone would wait 100 ms. */
	check_retried("429:1", 1, 1000);
}
END_TEST

START_TEST(k8s_401_waits_for_a_rotated_token)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-new", "", "0"))
		return;
	set_token(&f, "tok-old");
	cwi_provisioner *p = k8s_provisioner(&f, NULL);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 4), CACHEW_OK);
	cwi_prov_status st = await_status(p, failures_at_least, 1, "the 401");
	const char *head = "kubernetes: 401 Unauthorized from PATCH "
			   SCALE_PATH ": Unauthorized (not retried until ";
	ck_assert_msg(strncmp(st.last_error, head, strlen(head)) == 0,
	    "last_error: %s", st.last_error);
	char *tail = fmt("%s changes)", f.token);
	ck_assert_str_eq(st.last_error + strlen(st.last_error) - strlen(tail),
	    tail);
	free(tail);
	/* Neither time, a new target nor the same token rewritten makes it
	 * try again with a token the server refused. */
	ck_assert_int_eq(cwi_provisioner_set_target(p, 5), CACHEW_OK);
	set_token(&f, "tok-old\n");
	cwt_nap_ms(1500);
	char *log = requests_log(&f);
	ck_assert_int_eq(cwt_count(log, "\n"), 1);
	ck_assert_int_eq(cwt_count(log, "auth=Bearer tok-old "), 1);
	free(log);
	st = status_of(p);
	ck_assert_uint_eq(st.requests, 1);
	/* The rotated token goes out with the latest target. */
	set_token(&f, "tok-new\n");
	st = await_status(p, requests_at_least, 2, "the PATCH with the new "
	    "token");
	ck_assert_uint_eq(st.running, 5);
	ck_assert_str_eq(st.last_error, "");
	cwi_provisioner_destroy(p);
	log = requests_log(&f);
	ck_assert_int_eq(cwt_count(log, "\n"), 2);
	char *second = log_line(log, 1);
	ck_assert_ptr_nonnull(strstr(second, " auth=Bearer tok-new "
	    "ctype=application/merge-patch+json "
	    "body={\"spec\":{\"replicas\":5}} status=200"));
	free(second);
	free(log);
	k8s_stop(&f);
}
END_TEST

START_TEST(k8s_403_is_reported_with_the_status_message)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-1", "403", "0"))
		return;
	set_token(&f, "tok-1");
	cwi_provisioner *p = k8s_provisioner(&f, NULL);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 2), CACHEW_OK);
	cwi_prov_status st = await_status(p, failures_at_least, 1, "the 403");
	const char *want = "kubernetes: 403 Forbidden from PATCH " SCALE_PATH
			   ": deployments.apps \"cachew-worker\" is forbidden: "
			   "User \"system:serviceaccount:ns:cachew-dispatcher\" "
			   "cannot patch resource \"deployments/scale\"";
	ck_assert_msg(strncmp(st.last_error, want, strlen(want)) == 0,
	    "last_error: %s", st.last_error);
	ck_assert_uint_eq(st.running, 0);
	cwt_nap_ms(1500);
	st = status_of(p);
	ck_assert_uint_eq(st.requests, 1);
	ck_assert_uint_eq(st.failures, 1);
	ck_assert_uint_eq(st.actions[CWI_PROV_SCALE][0], 0);
	ck_assert_uint_eq(st.actions[CWI_PROV_SCALE][1], 1);
	cwi_provisioner_destroy(p);
	char *log = requests_log(&f);
	ck_assert_int_eq(cwt_count(log, "\n"), 1);
	ck_assert_int_eq(cwt_count(log, "status=403\n"), 1);
	free(log);
	k8s_stop(&f);
}
END_TEST

START_TEST(k8s_wrong_ca_is_a_clear_tls_error)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-1", "", "0"))
		return;
	set_token(&f, "tok-1");
	cwi_provisioner *p = k8s_provisioner(&f, f.other);
	ck_assert_int_eq(cwi_provisioner_set_target(p, 2), CACHEW_OK);
	cwi_prov_status st = await_status(p, failures_at_least, 1, "the TLS "
	    "failure");
	cwi_provisioner_destroy(p);
	char *want = fmt("kubernetes: TLS: PATCH %s" SCALE_PATH ": ", f.url);
	ck_assert_msg(strncmp(st.last_error, want, strlen(want)) == 0,
	    "last_error: %s", st.last_error);
	free(want);
	ck_assert_msg(strstr(st.last_error, "certificate") != NULL,
	    "last_error: %s", st.last_error);
	char *ca = fmt(", CA file %s; retry 1 in 100 ms", f.other);
	ck_assert_msg(strstr(st.last_error, ca) != NULL, "last_error: %s",
	    st.last_error);
	free(ca);
	ck_assert_uint_eq(st.running, 0);
	char *log = requests_log(&f);
	ck_assert_str_eq(log, "");
	free(log);
	k8s_stop(&f);
}
END_TEST

START_TEST(k8s_latest_target_wins)
{
	k8s_fixture f;

	if (!k8s_start(&f, "tok-1", "", "0"))
		return;
	set_token(&f, "tok-1");
	cwi_provisioner *p = k8s_provisioner(&f, NULL);
	for (uint32_t n = 1; n <= 6; n++)
		ck_assert_int_eq(cwi_provisioner_set_target(p, n), CACHEW_OK);
	uint64_t deadline = cwt_now_ms() + WAIT_MS;
	cwi_prov_status st;
	while ((st = status_of(p)).running != 6) {
		ck_assert_msg(cwt_now_ms() < deadline, "running %u", st.running);
		cwt_nap_ms(10);
	}
	cwi_provisioner_destroy(p);
	ck_assert_uint_le(st.requests, 6);
	char *log = requests_log(&f);
	ck_assert_int_eq(cwt_count(log, "\n"), (int)st.requests);
	char *last = log_line(log, (int)st.requests - 1);
	ck_assert_ptr_nonnull(strstr(last, "body={\"spec\":{\"replicas\":6}} "
	    "status=200"));
	free(last);
	free(log);
	k8s_stop(&f);
}
END_TEST

Suite *
cwt_provision_suite(void)
{
	Suite *s = suite_create("provision");
	TCase *tc_static = tcase_create("static");
	TCase *tc_process = tcase_create("process");
	TCase *tc_k8s = tcase_create("kubernetes");

	tcase_add_test(tc_static, static_records_targets_within_bounds);
	tcase_add_test(tc_static, bad_kind_or_settings_are_refused_by_name);
	tcase_add_test(tc_static, k8s_reply_reader_reads_replicas_exactly);
	tcase_add_test(tc_static, k8s_bad_scale_replies_name_the_field);
	tcase_add_test(tc_static, k8s_reply_reader_reads_status_messages);
	suite_add_tcase(s, tc_static);

	tcase_set_timeout(tc_process, 90);
	tcase_add_test(tc_process, process_scales_up_down_and_to_zero);
	tcase_add_test(tc_process, process_restarts_a_killed_worker);
	tcase_add_test(tc_process,
	    process_caps_at_max_workers_and_destroy_stops_all);
	tcase_add_test(tc_process,
	    process_crash_loop_reports_exit_status_with_backoff);
	tcase_add_test(tc_process, process_exec_failure_names_the_cause);
	suite_add_tcase(s, tc_process);

	tcase_set_timeout(tc_k8s, 90);
	tcase_add_test(tc_k8s, k8s_patch_is_exact_and_status_replicas_are_reported);
	tcase_add_test(tc_k8s, k8s_in_cluster_environment_names_the_api_server);
	tcase_add_test(tc_k8s, k8s_nothing_is_sent_before_the_first_target);
	tcase_add_test(tc_k8s, k8s_409_conflict_is_retried);
	tcase_add_test(tc_k8s, k8s_500_twice_is_retried_with_backoff);
	tcase_add_test(tc_k8s, k8s_429_waits_for_retry_after);
	tcase_add_test(tc_k8s, k8s_401_waits_for_a_rotated_token);
	tcase_add_test(tc_k8s, k8s_403_is_reported_with_the_status_message);
	tcase_add_test(tc_k8s, k8s_wrong_ca_is_a_clear_tls_error);
	tcase_add_test(tc_k8s, k8s_latest_target_wins);
	suite_add_tcase(s, tc_k8s);
	return s;
}
