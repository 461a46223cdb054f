/*
 * check_cluster.c - the service end to end with real processes on
 * loopback: a `cachewd --role=dispatcher`, `cachewd --role=worker`s, and
 * clients (this process through the library, or `cachew run`). Ports are
 * ephemeral; every wait is bounded and waits on readiness (the daemon's
 * "event=listening" line), never on a fixed sleep; every process started
 * is stopped by its pid.
 */
#include "cwt.h"
#include "../src/service/service_rpc.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long
rss_kb(pid_t pid)
{
	char path[64], *s, *p;
	long kb = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	s = cwt_slurp(path);
	if (s != NULL && (p = strstr(s, "VmRSS:")) != NULL)
		kb = strtol(p + 6, NULL, 10);
	free(s);
	return kb;
}

/* A dispatcher and nworkers workers, fast heartbeats. */
typedef struct cluster {
	char *dir;
	cwt_daemon dispatcher;
	cwt_daemon workers[4];
	int nworkers;
} cluster;

static void
worker_start(cluster *c, int i)
{
	char name[32];

	snprintf(name, sizeof(name), "worker%d", i);
	cwt_daemon_start(&c->workers[i], c->dir, name, "--role=worker",
	    "--dispatcher", c->dispatcher.url, "--listen", "tcp://127.0.0.1:0",
	    "--heartbeat-ms", "50", "--threads", "1", (char *)NULL);
}

static void
cluster_start(cluster *c, int nworkers)
{
	char work[600];

	memset(c, 0, sizeof(*c));
	c->dir = cwt_tmpdir();
	snprintf(work, sizeof(work), "%s/work", c->dir);
	cwt_daemon_start(&c->dispatcher, c->dir, "dispatcher", "--role=dispatcher",
	    "--listen", "tcp://127.0.0.1:0", "--work-dir", work,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--client-timeout-ms", "20000", (char *)NULL);
	for (int i = 0; i < nworkers; i++)
		worker_start(c, i);
	c->nworkers = nworkers;
}

static void
cluster_stop(cluster *c)
{
	for (int i = 0; i < 4; i++)
		if (c->workers[i].pid > 0)
			cwt_daemon_stop(&c->workers[i], SIGKILL);
	if (c->dispatcher.pid > 0)
		cwt_daemon_stop(&c->dispatcher, SIGTERM);
	cwt_rmtree(c->dir);
	free(c->dir);
}

/* The order-independent digest and count of a run (in-process when url is
 * NULL, else through the service), with extra options "name=value". */
typedef struct run_sum {
	uint64_t n, digest;
	int64_t min, max; /* of component 0 when it is a scalar i64 */
} run_sum;

static run_sum
run_digest(const char *pipeline, const char *url, const char *job_name)
{
	cachew_options *o = cwt_opts(7, 1);
	cachew_element **v;
	size_t n;
	char err[512];
	run_sum s = {0, 0, INT64_MAX, INT64_MIN};

	if (url != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "service", url),
		    CACHEW_OK);
	if (job_name != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "job_name", job_name),
		    CACHEW_OK);
	cachew_err rv = cwt_run(pipeline, o, &v, &n, err, sizeof(err));
	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, err);
	for (size_t i = 0; i < n; i++) {
		s.digest += cachew_element_hash(v[i]);
		const cachew_tensor *t = cachew_element_component(v[i], 0);
		if (cachew_tensor_rank(t) == 0 &&
		    cachew_tensor_dtype(t) == CACHEW_I64) {
			int64_t x = *(const int64_t *)cachew_tensor_data(t);
			if (x < s.min)
				s.min = x;
			if (x > s.max)
				s.max = x;
		}
	}
	s.n = n;
	cwt_free(v, n);
	cachew_options_destroy(o);
	return s;
}

/* ---- the same multiset in-process and through the service ------------------ */

START_TEST(cluster_distributed_epoch_equals_in_process)
{
	static const char *const pipelines[] = {
	    "range(20000) | map(add, value=3)",
	    "range(5000) | shuffle(100) | map(mul, value=2)",
	    "from_list([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])",
	};
	cluster c;

	cluster_start(&c, 2);
	for (size_t i = 0; i < sizeof(pipelines) / sizeof(pipelines[0]); i++) {
		run_sum local = run_digest(pipelines[i], NULL, NULL);
		run_sum remote = run_digest(pipelines[i], c.dispatcher.url, NULL);
		ck_assert_msg(local.n == remote.n && local.digest == remote.digest,
		    "%s: in-process %" PRIu64 " elements digest %016" PRIx64
		    ", service %" PRIu64 " digest %016" PRIx64,
		    pipelines[i], local.n, local.digest, remote.n, remote.digest);
	}
	cluster_stop(&c);
}
END_TEST

/* The sequence of a pipeline through the service at url, at an epoch. */
static char *
seq_at_epoch(const char *pipeline, const char *url, int64_t epoch)
{
	cachew_options *o;
	char *s;

	ck_assert_int_eq(cachew_options_create(&o), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_str(o, "service", url), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_int(o, "seed", 1), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_int(o, "epoch", epoch), CACHEW_OK);
	s = cwt_seq(pipeline, o);
	cachew_options_destroy(o);
	return s;
}

/* Reshuffles draw from the epoch on the workers as in-process (issue 20,
 * item 2): the same seed and epoch give the same data, another epoch
 * another order, and each pass of a client-side repeat is an epoch. */
START_TEST(cluster_reshuffle_draws_from_the_epoch)
{
	static const char *const p =
	    "range(10) | shuffle(10, seed=7, reshuffle_each_iteration=true)";
	char rep[200], both[200];
	cluster c;

	cluster_start(&c, 1);
	char *e0 = seq_at_epoch(p, c.dispatcher.url, 0);
	char *again = seq_at_epoch(p, c.dispatcher.url, 0);
	char *e1 = seq_at_epoch(p, c.dispatcher.url, 1);
	ck_assert_str_eq(e0, again);
	ck_assert_str_ne(e0, e1);
	snprintf(rep, sizeof(rep), "%s | repeat(2)", p);
	char *twice = seq_at_epoch(rep, c.dispatcher.url, 0);
	snprintf(both, sizeof(both), "%s,%s", e0, e1);
	ck_assert_str_eq(twice, both);
	free(e0);
	free(again);
	free(e1);
	free(twice);
	cluster_stop(&c);
}
END_TEST

/* Workers load operator plug-ins at start (--plugin, CACHEW_PLUGINS): a
 * pipeline with a user function runs on them and gives what it gives
 * in-process (issue 20, item 4); a plug-in that does not load stops the
 * worker at start with an error naming it. */
START_TEST(cluster_workers_run_plugin_functions)
{
	static const char *const p = "range(300) | map(square) | filter(is_even)";
	char so[600], cmd[1600], log[700];
	cluster c;

	snprintf(so, sizeof(so), "%s/plugin_example.so", cwt_build_dir());
	ck_assert_int_eq(cachew_plugin_load(so), CACHEW_OK);
	cluster_start(&c, 0);
	cwt_daemon_start(&c.workers[0], c.dir, "worker0", "--role=worker",
	    "--dispatcher", c.dispatcher.url, "--listen", "tcp://127.0.0.1:0",
	    "--heartbeat-ms", "50", "--threads", "1", "--plugin", so,
	    (char *)NULL);
	c.nworkers = 1;
	run_sum local = run_digest(p, NULL, NULL);
	run_sum remote = run_digest(p, c.dispatcher.url, NULL);
	ck_assert_uint_eq(local.n, 150);
	ck_assert_uint_eq(remote.n, local.n);
	ck_assert_uint_eq(remote.digest, local.digest);
	snprintf(log, sizeof(log), "%s/bad-plugin.log", c.dir);
	snprintf(cmd, sizeof(cmd), "%s/cachewd --role=worker --dispatcher %s "
	    "--plugin %s/missing.so 2>%s", cwt_build_dir(), c.dispatcher.url,
	    c.dir, log);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 1);
	char *text = cwt_slurp(log);
	ck_assert_msg(strstr(text, "event=start_failed role=worker error=\""
			  "plugin ") != NULL && strstr(text, "missing.so' not "
			  "found") != NULL, "%s", text);
	free(text);
	cluster_stop(&c);
}
END_TEST

/* --work-dir is created with its parents, as docs/cachewd.md says (issue
 * 17: a nested one failed the start with "No such file or directory"). */
START_TEST(dispatcher_creates_its_work_dir_with_parents)
{
	char *dir = cwt_tmpdir(), work[600], events[700];
	cwt_daemon d;

	snprintf(work, sizeof(work), "%s/a/b/c", dir);
	cwt_daemon_start(&d, dir, "dispatcher", "--role=dispatcher", "--listen",
	    "tcp://127.0.0.1:0", "--work-dir", work, (char *)NULL);
	snprintf(events, sizeof(events), "%s/events.jsonl", work);
	ck_assert_msg(access(events, F_OK) == 0, "%s was not created", events);
	ck_assert_int_eq(cwt_daemon_stop(&d, SIGTERM), 0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(cluster_text_files_equal_in_process)
{
	cluster c;
	char pat[700], pipeline[900];

	cluster_start(&c, 2);
	for (int f = 0; f < 6; f++) {
		char path[700], text[4096];
		size_t k = 0;
		snprintf(path, sizeof(path), "%s/part-%d.txt", c.dir, f);
		for (int l = 0; l < 100; l++)
			k += (size_t)snprintf(text + k, sizeof(text) - k,
			    "file %d line %d\n", f, l);
		cwt_write_file(path, text, k);
	}
	snprintf(pat, sizeof(pat), "%s/part-*.txt", c.dir);
	snprintf(pipeline, sizeof(pipeline), "text_lines(\"%s\")", pat);
	run_sum local = run_digest(pipeline, NULL, NULL);
	run_sum remote = run_digest(pipeline, c.dispatcher.url, NULL);
	ck_assert_uint_eq(local.n, 600);
	ck_assert_uint_eq(remote.n, 600);
	ck_assert_uint_eq(local.digest, remote.digest);
	cluster_stop(&c);
}
END_TEST

/* A client-side tail (take) runs after the service. */
START_TEST(cluster_client_part_runs_after_the_service)
{
	cluster c;

	cluster_start(&c, 1);
	run_sum s = run_digest("range(1000) | map(add, value=1) | take(10)",
	    c.dispatcher.url, NULL);
	ck_assert_uint_eq(s.n, 10);
	cluster_stop(&c);
}
END_TEST

/* service=embedded: the dispatcher and a worker inside this process on
 * the inproc transport (nothing serialized) give the same multiset; its
 * inline worker takes the whole epoch in one lease, so even batches across
 * split boundaries and seeded shuffles come out as in-process. */
START_TEST(embedded_service_equals_in_process)
{
	static const char *const pipelines[] = {
	    "range(20000) | map(add, value=3) | batch(100)",
	    "from_list([1, 2, 3, 4, 5]) | map(mul, value=2) | take(3)",
	    "range(300) | batch(64)",
	    "range(5000) | shuffle(100) | map(mul, value=2) | batch(7)",
	};

	for (size_t i = 0; i < sizeof(pipelines) / sizeof(pipelines[0]); i++) {
		run_sum local = run_digest(pipelines[i], NULL, NULL);
		run_sum emb = run_digest(pipelines[i], "embedded", NULL);
		ck_assert_msg(local.n == emb.n && local.digest == emb.digest,
		    "%s: in-process %" PRIu64 " elements, embedded %" PRIu64,
		    pipelines[i], local.n, emb.n);
	}
}
END_TEST

/* Reads pipeline to its end through `service` (NULL: in-process) and
 * copies the iterator's stats rows (up to cap; *n gets how many there
 * are); returns the number of elements read, and their payload bytes in
 * *bytes unless it is NULL. The rows keep copies of their strings. */
typedef struct stat_row {
	cachew_op_stats s;
	char name[48], detail[80];
} stat_row;

static size_t
read_counting(const char *pipeline, const char *service, stat_row *rows,
    size_t cap, size_t *n, uint64_t *bytes)
{
	cachew_options *o = cwt_opts(7, 1);
	cachew_op_stats st[16];
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	size_t got = 0;
	uint64_t b = 0;

	ck_assert_uint_le(cap, 16);
	ck_assert_int_eq(cachew_options_set_str(o, "service",
			     service != NULL ? service : "local"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while (cachew_iterator_next(it, &e) == CACHEW_OK) {
		for (size_t c = 0; c < cachew_element_size(e); c++)
			b += cachew_tensor_nbytes(
			    cachew_element_component(e, c));
		cachew_element_release(e);
		got++;
	}
	if (bytes != NULL)
		*bytes = b;
	ck_assert_int_eq(cachew_iterator_stats(it, st, cap, n), CACHEW_OK);
	for (size_t i = 0; i < *n && i < cap; i++) {
		rows[i].s = st[i];
		snprintf(rows[i].name, sizeof(rows[i].name), "%s", st[i].name);
		snprintf(rows[i].detail, sizeof(rows[i].detail), "%s",
		    st[i].detail != NULL ? st[i].detail : "");
	}
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return got;
}

static size_t
read_with_stats(const char *pipeline, const char *service, stat_row *rows,
    size_t cap, size_t *n)
{
	return read_counting(pipeline, service, rows, cap, n, NULL);
}

/* The embedded iterator's stats show the worker part's operators (run
 * inline) before the client part's own rows, as the plain executor's
 * would (no row for the stream between them), and keep them after the
 * epoch. */
START_TEST(embedded_stats_show_the_worker_part)
{
	stat_row rows[16];
	size_t n = 0;

	ck_assert_uint_eq(read_with_stats("range(1000) | map(add, value=1) | "
			      "batch(10) | take(50)", "embedded", rows, 16, &n),
	    50);
	ck_assert_uint_eq(n, 4);
	ck_assert_str_eq(rows[0].name, "range");
	ck_assert_uint_eq(rows[0].s.elements, 500);
	ck_assert_str_eq(rows[1].name, "map");
	ck_assert_str_eq(rows[1].detail, "add");
	ck_assert_str_eq(rows[2].name, "batch");
	ck_assert_uint_eq(rows[2].s.elements, 50);
	ck_assert_str_eq(rows[3].name, "take");
	ck_assert_uint_eq(rows[3].s.elements, 50);
	ck_assert_int_eq(rows[3].s.node, 3);
}
END_TEST

/* The default (no service named) is the embedded service, and a process
 * that forks after using it (a DataLoader's workers, the process
 * provisioner) gets its own in the child: the parent's threads are not
 * there. The child is bounded by alarm() and judged by its exit code. */
START_TEST(embedded_default_survives_fork)
{
	const char *p = "range(5000) | map(add, value=1) | batch(10)";
	run_sum before = run_digest(p, NULL, NULL);
	run_sum local = run_digest(p, "local", NULL);
	int status = 0;
	pid_t pid;

	ck_assert_uint_eq(before.n, 500);
	ck_assert_uint_eq(before.digest, local.digest);
	/* Under valgrind (make valgrind) the child's own leak check counts
	 * what the parent's threads hold (they are not in the child) as
	 * lost: the forked half runs in the other builds. */
	if (getenv("CWT_VALGRIND") != NULL)
		return;
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		cachew_options *o = cwt_opts(7, 1);
		cachew_element **v = NULL;
		size_t n = 0;
		uint64_t d = 0;
		char err[256];
		alarm(20);
		if (cwt_run(p, o, &v, &n, err, sizeof(err)) != CACHEW_OK)
			_exit(2);
		for (size_t i = 0; i < n; i++)
			d += cachew_element_hash(v[i]);
		_exit(n == 500 && d == local.digest ? 0 : 3);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "child: status %d", status);
	/* And the parent's service still runs. */
	ck_assert_uint_eq(run_digest(p, NULL, NULL).digest, local.digest);
}
END_TEST

/* Threads of this process, from /proc/self/task. */
static int
thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* A pipeline the service cannot split (zip of two sources) runs on the
 * plain executor by default, and the embedded service is not started for
 * it: no dispatcher ticker, no worker heartbeat for the process's life. A
 * fresh child process, so that no earlier test has started it; its exit
 * code says what it found. */
START_TEST(embedded_default_not_started_for_unsplittable)
{
	int status = 0;
	pid_t pid;

	if (getenv("CWT_VALGRIND") != NULL)
		return; /* the forked half: see embedded_default_survives_fork */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		cachew_options *o = cwt_opts(7, 1);
		cachew_element **v = NULL;
		size_t n = 0;
		char err[256];
		int before;
		alarm(20);
		before = thread_count();
		if (cwt_run("zip(range(50), range(50))", o, &v, &n, err,
			sizeof(err)) != CACHEW_OK)
			_exit(2);
		if (n != 50)
			_exit(3);
		_exit(thread_count() == before ? 0 : 4);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "child: status %d (4: threads were started)", status);
}
END_TEST

/* parallel_epochs on the embedded default: its one worker's task has a
 * runner (it is not inline) and is read by requests; every element once. */
START_TEST(embedded_parallel_epochs_reads_its_input)
{
	static const char *const services[] = {"", "embedded"};

	for (size_t i = 0; i < 2; i++) {
		cachew_options *o = cwt_opts(7, 1);
		cachew_element **v = NULL;
		size_t n = 0;
		char err[256];

		ck_assert_int_eq(cachew_options_set_str(o, "service",
				     services[i]), CACHEW_OK);
		ck_assert_int_eq(cachew_options_set_str(o, "processing_mode",
				     "parallel_epochs"), CACHEW_OK);
		ck_assert_msg(cwt_run("range(10) | map(add, value=1)", o, &v,
				  &n, err, sizeof(err)) == CACHEW_OK,
		    "service '%s': %s", services[i], err);
		ck_assert_uint_eq(n, 10);
		cwt_free(v, n);
		cachew_options_destroy(o);
	}
}
END_TEST

/* embedded:2 runs two worker threads (no inline task): the same multiset. */
START_TEST(embedded_worker_threads_equal_in_process)
{
	const char *p = "range(20000) | map(add, value=3)";
	run_sum local = run_digest(p, NULL, NULL);
	run_sum emb = run_digest(p, "embedded:2", NULL);

	ck_assert_uint_eq(emb.n, local.n);
	ck_assert_uint_eq(emb.digest, local.digest);
}
END_TEST

/* A pipeline error on a worker ends the client's epoch with that error
 * (it would recur wherever its split is leased), never a retry loop. */
static void
assert_pipeline_error(const char *url)
{
	cachew_options *o = cwt_opts(7, 1);
	cachew_element **v = NULL;
	size_t n = 0;
	char err[512];
	cachew_err rv;

	ck_assert_int_eq(cachew_options_set_str(o, "service", url), CACHEW_OK);
	rv = cwt_run("from_list([\"abc\", \"def\"]) | decode_jpeg(channels=3)",
	    o, &v, &n, err, sizeof(err));
	ck_assert_msg(rv != CACHEW_OK, "%s: a corrupt JPEG gave no error", url);
	ck_assert_msg(strstr(err, "Not a JPEG file") != NULL, "%s: %s", url,
	    err);
	cwt_free(v, n);
	cachew_options_destroy(o);
}

/* The status of the dispatcher at url (free with cwi_pmsg_free). */
static void
dispatcher_status(cwi_conn *c, cwi_pmsg *rep)
{
	cwi_pmsg req;

	cwi_pmsg_init(&req, CWI_MSG_STATUS);
	ck_assert_int_eq(cwi_rpc_call(c, &req, CWI_MSG_STATUS_REPLY, 5000, rep),
	    CACHEW_OK);
	cwi_pmsg_free(&req);
}

/* The ids of the dispatcher's newest active task and newest job (0:
 * none); either pointer may be NULL. */
static void
newest_ids(cwi_conn *c, uint64_t *task, uint64_t *job)
{
	const cwi_msg_status_reply *st;
	cwi_pmsg rep;
	uint64_t t = 0, j = 0;

	dispatcher_status(c, &rep);
	st = &rep.u.status_reply;
	for (size_t i = 0; i < st->ntasks; i++)
		if (st->tasks[i].state == CWI_TASK_ACTIVE &&
		    st->tasks[i].task_id > t)
			t = st->tasks[i].task_id;
	for (size_t i = 0; i < st->njobs; i++)
		if (st->jobs[i].job_id > j)
			j = st->jobs[i].job_id;
	cwi_pmsg_free(&rep);
	if (task != NULL)
		*task = t;
	if (job != NULL)
		*job = j;
}

static uint64_t
active_task(cwi_conn *c)
{
	uint64_t t;

	newest_ids(c, &t, NULL);
	return t;
}

static uint64_t
newest_job(cwi_conn *c)
{
	uint64_t j;

	newest_ids(c, NULL, &j);
	return j;
}

/* Deregisters every worker of the dispatcher, as a dispatcher that
 * declared them dead would have dropped them: each registers again at
 * its next heartbeat, and its jobs get new tasks. Returns how many. */
static size_t
drop_workers(cwi_conn *c)
{
	cwi_pmsg rep;
	size_t n;

	dispatcher_status(c, &rep);
	n = rep.u.status_reply.nworkers;
	for (size_t i = 0; i < n; i++) {
		cwi_pmsg req, ok;
		cwi_pmsg_init(&req, CWI_MSG_WORKER_DEREGISTER);
		req.u.worker_deregister.worker_id =
		    rep.u.status_reply.workers[i].worker_id;
		ck_assert_int_eq(cwi_rpc_call(c, &req, CWI_MSG_OK, 5000, &ok),
		    CACHEW_OK);
		cwi_pmsg_free(&req);
		cwi_pmsg_free(&ok);
	}
	cwi_pmsg_free(&rep);
	return n;
}

/* The embedded dispatcher drops its worker mid-epoch (as when it declares
 * it dead: a starved heartbeat thread). The worker registers again, stops
 * its old task and starts a new one for the job: the iterator moves to it
 * and delivers every element (what the old task had delivered
 * unacknowledged comes again: duplicates, no loss), instead of failing
 * with "task was stopped". */
START_TEST(embedded_worker_dropped_mid_epoch_loses_nothing)
{
	enum { N = 20000 };
	cachew_options *o = cwt_opts(7, 1);
	static uint32_t seen[N];
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;
	cwi_conn *c = NULL;
	char url[64];
	size_t got = 0;

	memset(seen, 0, sizeof(seen));
	ck_assert_int_eq(cachew_options_set_str(o, "service", "embedded"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(20000) | "
						   "map(add, value=0)"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		int64_t x = *(const int64_t *)cachew_tensor_data(
		    cachew_element_component(e, 0));
		ck_assert(x >= 0 && x < N);
		seen[x]++;
		cachew_element_release(e);
		if (++got != 1000)
			continue;
		snprintf(url, sizeof(url), "inproc://cachew-embedded-%ld",
		    (long)getpid());
		ck_assert_int_eq(cwi_dial(&c, url, NULL), CACHEW_OK);
		uint64_t old = active_task(c), now = old;
		ck_assert_uint_ne(old, 0);
		ck_assert_uint_eq(drop_workers(c), 1);
		/* Until the new task runs: the worker stopped the old one
		 * in the same heartbeat that started it. */
		for (uint64_t end = cwt_now_ms() + 20000;
		     now <= old && cwt_now_ms() < end;
		     cwt_nap_ms(10))
			now = active_task(c);
		ck_assert_msg(now > old, "no new task after "
		    "task %" PRIu64 " was dropped", old);
	}
	ck_assert_msg(rv == CACHEW_EOF, "after %zu elements: %s (%s)", got,
	    cachew_strerror(rv), cachew_iterator_errmsg(it));
	for (int i = 0; i < N; i++)
		ck_assert_msg(seen[i] >= 1, "element %d never came", i);
	ck_assert_uint_ge(got, N);
	cwi_conn_destroy(c);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

/* Three iterators of the embedded service alive at once and read in turn
 * by one thread (a train and an eval loop, Python's zip of two loaders):
 * each job runs on the embedded worker, none waits for another's end
 * (with the policy engine's fair share the one worker went to the oldest
 * job and the others waited for it: forever, since it was not read). */
static void
assert_read_in_turn(const char *service)
{
	enum { K = 3, N = 20000 };
	cachew_options *o = cwt_opts(7, 1);
	cachew_dataset *ds;
	cachew_iterator *it[K];
	uint64_t sum[K] = {0};
	size_t n[K] = {0};
	bool done[K] = {false};
	int left = K;

	ck_assert_int_eq(cachew_options_set_str(o, "service", service),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(20000)"), CACHEW_OK);
	for (int k = 0; k < K; k++)
		ck_assert_int_eq(cachew_iterator_create(&it[k], ds, o),
		    CACHEW_OK);
	while (left > 0) {
		for (int k = 0; k < K; k++) {
			for (int r = 0; r < 1000 && !done[k]; r++) {
				cachew_element *e;
				cachew_err rv = cachew_iterator_next(it[k], &e);
				if (rv != CACHEW_OK) {
					ck_assert_msg(rv == CACHEW_EOF, "%s: "
					    "iterator %d: %s", service, k,
					    cachew_iterator_errmsg(it[k]));
					done[k] = true;
					left--;
					break;
				}
				sum[k] += (uint64_t)*(const int64_t *)
				    cachew_tensor_data(
					cachew_element_component(e, 0));
				n[k]++;
				cachew_element_release(e);
			}
		}
	}
	for (int k = 0; k < K; k++) {
		ck_assert_uint_eq(n[k], N);
		ck_assert_uint_eq(sum[k], (uint64_t)N * (N - 1) / 2);
		cachew_iterator_destroy(it[k]);
	}
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}

START_TEST(embedded_iterators_read_in_turn)
{
	assert_read_in_turn("embedded");
	assert_read_in_turn("embedded:2");
}
END_TEST

/* A repeat runs on the client, and through a service each pass opens the
 * stream again: a new job per pass (0.3 ms each; range(10) | repeat() |
 * batch(4) ran 440 times slower than the plain executor). The implicit
 * default leaves such pipelines to the plain executor: reading 100 passes
 * makes no job; the same elements come. */
START_TEST(embedded_default_leaves_repeat_to_the_plain_executor)
{
	const char *p = "range(10) | repeat(100) | batch(4)";
	run_sum first = run_digest("range(3)", "embedded", NULL);
	run_sum def = {0}, local = run_digest(p, "local", NULL);
	cwi_conn *c;
	char url[64];
	uint64_t before;

	ck_assert_uint_eq(first.n, 3);
	snprintf(url, sizeof(url), "inproc://cachew-embedded-%ld",
	    (long)getpid());
	ck_assert_int_eq(cwi_dial(&c, url, NULL), CACHEW_OK);
	before = newest_job(c);
	ck_assert_uint_ne(before, 0);
	def = run_digest(p, NULL, NULL);
	ck_assert_uint_eq(def.n, 250);
	ck_assert_uint_eq(def.digest, local.digest);
	ck_assert_uint_eq(newest_job(c), before);
	cwi_conn_destroy(c);
}
END_TEST

START_TEST(embedded_pipeline_error_reaches_the_client)
{
	assert_pipeline_error("embedded");
}
END_TEST

START_TEST(embedded_threads_pipeline_error_reaches_the_client)
{
	assert_pipeline_error("embedded:2");
}
END_TEST

START_TEST(cluster_pipeline_error_reaches_the_client)
{
	cluster c;

	cluster_start(&c, 1);
	assert_pipeline_error(c.dispatcher.url);
	cluster_stop(&c);
}
END_TEST

/* Through a remote service, the iterator's stats show the worker part's
 * operators with every lease's counters once the epoch is read (a worker
 * reports a lease's before its end goes out, the client asks the
 * dispatcher at the end), in place of the client's stream row: the plain
 * executor's rows. */
START_TEST(cluster_stats_show_the_worker_part)
{
	cluster c;
	stat_row rows[16];
	size_t n = 0;

	cluster_start(&c, 1);
	ck_assert_uint_eq(read_with_stats("range(400) | map(sleep_us, us=2000)",
			      c.dispatcher.url, rows, 16, &n),
	    400);
	ck_assert_uint_eq(n, 2);
	ck_assert_str_eq(rows[0].name, "range");
	ck_assert_uint_eq(rows[0].s.elements, 400);
	ck_assert_str_eq(rows[1].name, "map");
	ck_assert_str_eq(rows[1].detail, "sleep_us");
	ck_assert_uint_eq(rows[1].s.elements, 400);
	ck_assert_int_eq(rows[1].s.node, 1);
	cluster_stop(&c);
}
END_TEST

/* The rows through `service` are those of the in-process run (names,
 * details, nodes), their counters summed over the job's workers and the
 * iterator's epochs, exactly: every element of the source and the map,
 * and as many batches as were delivered. */
static void
assert_stats_sum_every_worker(const char *service)
{
	static const char *const pipelines[] = {
	    "range(20000) | map(add, value=1) | batch(64)",
	    "range(20000) | map(add, value=1) | batch(64) | repeat(2)",
	};

	for (size_t p = 0; p < 2; p++) {
		stat_row local[16], rows[16];
		size_t nlocal = 0, n = 0, got;

		(void)read_with_stats(pipelines[p], NULL, local, 16, &nlocal);
		got = read_with_stats(pipelines[p], service, rows, 16, &n);
		ck_assert_uint_eq(n, nlocal);
		for (size_t i = 0; i < n; i++) {
			ck_assert_str_eq(rows[i].name, local[i].name);
			ck_assert_str_eq(rows[i].detail, local[i].detail);
			ck_assert_int_eq(rows[i].s.node, local[i].s.node);
		}
		ck_assert_uint_eq(rows[0].s.elements, 20000 * (p + 1));
		ck_assert_uint_eq(rows[1].s.elements, 20000 * (p + 1));
		ck_assert_msg(rows[2].s.elements == got, "%s: %s: batch row "
		    "%" PRIu64 ", %zu delivered", service, pipelines[p],
		    rows[2].s.elements, got);
		if (p == 1)
			ck_assert_uint_eq(rows[3].s.elements, got);
	}
}

START_TEST(cluster_stats_sum_every_worker_exactly)
{
	cluster c;

	cluster_start(&c, 2);
	assert_stats_sum_every_worker(c.dispatcher.url);
	cluster_stop(&c);
}
END_TEST

START_TEST(embedded_stats_sum_every_worker_exactly)
{
	assert_stats_sum_every_worker("embedded");
	assert_stats_sum_every_worker("embedded:2");
}
END_TEST

/* The status of the newest job of the dispatcher at url. */
static cwi_job_status
newest_job_status(const char *url)
{
	cwi_conn *c;
	cwi_pmsg rep;
	cwi_job_status js;

	ck_assert_int_eq(cwi_dial(&c, url, NULL), CACHEW_OK);
	dispatcher_status(c, &rep);
	ck_assert_uint_gt(rep.u.status_reply.njobs, 0);
	js = rep.u.status_reply.jobs[rep.u.status_reply.njobs - 1];
	js.name = js.scale_policy = js.reason = NULL;
	js.cache_mode = js.cache_reason = NULL;
	cwi_pmsg_free(&rep);
	cwi_conn_destroy(c);
	return js;
}

/* Once the iterator is gone, the job's counters in the dispatcher's
 * status are exactly what it received: elements (here batches) and their
 * payload bytes. */
static void
assert_status_counts_what_was_received(const char *service,
    const char *url)
{
	stat_row rows[16];
	size_t n = 0, got;
	uint64_t bytes = 0;
	cwi_job_status js;

	got = read_counting("range(20000) | map(add, value=1) | batch(64)",
	    service, rows, 16, &n, &bytes);
	js = newest_job_status(url);
	ck_assert(js.finished);
	ck_assert_msg(js.elements == got, "%s: status %" PRIu64 " elements, "
	    "%zu received", service, js.elements, got);
	ck_assert_uint_eq(js.bytes, bytes);
	ck_assert_uint_eq(bytes, 20000 * 8);
}

START_TEST(cluster_status_counts_what_the_client_received)
{
	cluster c;

	cluster_start(&c, 2);
	assert_status_counts_what_was_received(c.dispatcher.url,
	    c.dispatcher.url);
	cluster_stop(&c);
}
END_TEST

START_TEST(embedded_status_counts_what_the_client_received)
{
	char url[64];

	snprintf(url, sizeof(url), "inproc://cachew-embedded-%ld",
	    (long)getpid());
	assert_status_counts_what_was_received("embedded", url);
	snprintf(url, sizeof(url), "inproc://cachew-embedded-%ld-threads",
	    (long)getpid());
	assert_status_counts_what_was_received("embedded:2", url);
}
END_TEST

/* ---- two clients sharing a job ----------------------------------------------- */

typedef struct share_arg {
	const char *url;
	pthread_barrier_t *joined; /* both clients are in the job */
	run_sum sum;
} share_arg;

/* One client of the named job "shared": it joins (creates its iterator),
 * waits until the other has joined too, then reads to the end. Without
 * the wait a slow machine (valgrind) let the first client finish and end
 * the job before the second joined, which then read a new job of the
 * same name from the start. */
static void *
share_main(void *arg)
{
	share_arg *a = arg;
	cachew_options *o = cwt_opts(7, 1);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;

	ck_assert_int_eq(cachew_options_set_str(o, "service", a->url),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_str(o, "job_name", "shared"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(30000) | map(add, value=1)"),
	    CACHEW_OK);
	ck_assert_msg(cachew_iterator_create(&it, ds, o) == CACHEW_OK, "%s",
	    cachew_errmsg());
	pthread_barrier_wait(a->joined);
	memset(&a->sum, 0, sizeof(a->sum));
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		a->sum.n++;
		a->sum.digest += cachew_element_hash(e);
		cachew_element_release(e);
	}
	ck_assert_msg(rv == CACHEW_EOF, "%s", cachew_iterator_errmsg(it));
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return NULL;
}

/* Runs two clients of one named job through url. */
static void
share_run(const char *url, share_arg a[2])
{
	pthread_barrier_t joined;
	pthread_t th[2];

	ck_assert_int_eq(pthread_barrier_init(&joined, NULL, 2), 0);
	for (int i = 0; i < 2; i++) {
		a[i].url = url;
		a[i].joined = &joined;
		ck_assert_int_eq(pthread_create(&th[i], NULL, share_main, &a[i]),
		    0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&joined);
}

START_TEST(cluster_two_clients_share_a_named_job)
{
	cluster c;
	share_arg a[2];

	cluster_start(&c, 2);
	run_sum local = run_digest("range(30000) | map(add, value=1)", NULL,
	    NULL);
	share_run(c.dispatcher.url, a);
	ck_assert_uint_eq(a[0].sum.n + a[1].sum.n, local.n);
	ck_assert_uint_eq(a[0].sum.digest + a[1].sum.digest, local.digest);
	cluster_stop(&c);
}
END_TEST

/* Two in-process clients of one named job on the embedded service: both
 * pull from its one inline task; each element reaches one of them. */
START_TEST(embedded_two_clients_share_a_named_job)
{
	share_arg a[2];
	run_sum local = run_digest("range(30000) | map(add, value=1)", NULL,
	    NULL);

	share_run("embedded", a);
	ck_assert_uint_eq(a[0].sum.n + a[1].sum.n, local.n);
	ck_assert_uint_eq(a[0].sum.digest + a[1].sum.digest, local.digest);
}
END_TEST

/* ---- failures ------------------------------------------------------------------ */

typedef struct slow_arg {
	const char *url;
	int n;
	uint8_t *seen;       /* seen[v] counts value v */
	atomic_int received;
	cachew_err rv;
	char err[512];
} slow_arg;

static void *
slow_main(void *arg)
{
	slow_arg *a = arg;
	cachew_options *o = cwt_opts(1, 1);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	char p[128];

	snprintf(p, sizeof(p), "range(%d) | map(sleep_us, us=1000)", a->n);
	ck_assert_int_eq(cachew_options_set_str(o, "service", a->url),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	a->rv = cachew_iterator_create(&it, ds, o);
	if (a->rv == CACHEW_OK) {
		while ((a->rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			int64_t x = cwt_i64(e, 0);
			if (x >= 0 && x < a->n && a->seen[x] < 255)
				a->seen[x]++;
			atomic_fetch_add(&a->received, 1);
			cachew_element_release(e);
		}
		snprintf(a->err, sizeof(a->err), "%s",
		    cachew_iterator_errmsg(it));
		cachew_iterator_destroy(it);
	} else {
		snprintf(a->err, sizeof(a->err), "%s", cachew_errmsg());
	}
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return NULL;
}

static void
wait_received(slow_arg *a, int n)
{
	uint64_t deadline = cwt_now_ms() + 20000;

	while (atomic_load(&a->received) < n && cwt_now_ms() < deadline)
		cwt_nap_ms(5);
	ck_assert_int_ge(atomic_load(&a->received), n);
}

START_TEST(cluster_worker_killed_mid_epoch_loses_nothing)
{
	cluster c;
	slow_arg a = {0};
	pthread_t th;

	cluster_start(&c, 2);
	a.url = c.dispatcher.url;
	a.n = 3000;
	a.seen = calloc((size_t)a.n, 1);
	ck_assert_int_eq(pthread_create(&th, NULL, slow_main, &a), 0);
	wait_received(&a, 300);
	ck_assert_int_eq(cwt_daemon_stop(&c.workers[0], SIGKILL), 128 + SIGKILL);
	pthread_join(th, NULL);
	ck_assert_msg(a.rv == CACHEW_EOF, "client: %s", a.err);
	for (int v = 0; v < a.n; v++)
		ck_assert_msg(a.seen[v] >= 1, "element %d was lost", v);
	free(a.seen);
	cluster_stop(&c);
}
END_TEST

/* Worker 1 is paused (SIGSTOP) once data flows, so the epoch cannot end
 * before worker 2 is up: worker 2 must take the pending splits (and, if
 * worker 1 was declared dead meanwhile, the ones it held). */
START_TEST(cluster_worker_added_mid_epoch_takes_splits)
{
	cluster c;
	slow_arg a = {0};
	pthread_t th;
	char *events = NULL, path[700];
	uint64_t deadline;

	cluster_start(&c, 1);
	a.url = c.dispatcher.url;
	a.n = 3000;
	a.seen = calloc((size_t)a.n, 1);
	ck_assert_int_eq(pthread_create(&th, NULL, slow_main, &a), 0);
	wait_received(&a, 200);
	ck_assert_int_eq(kill(c.workers[0].pid, SIGSTOP), 0);
	worker_start(&c, 1);
	/* The events log shows the second worker's task (id 2) leasing. */
	snprintf(path, sizeof(path), "%s/work/events.jsonl", c.dir);
	deadline = cwt_now_ms() + 20000;
	while (cwt_now_ms() < deadline) {
		free(events);
		events = cwt_slurp(path);
		if (events != NULL && strstr(events, "\"event\":\"split_leased\","
		    "\"task_id\":2") != NULL)
			break;
		cwt_nap_ms(10);
	}
	kill(c.workers[0].pid, SIGCONT);
	pthread_join(th, NULL);
	ck_assert_msg(events != NULL && strstr(events, "\"event\":\"split_leased\","
	    "\"task_id\":2") != NULL, "worker 2 never leased: %s",
	    events != NULL ? events : "(no events)");
	free(events);
	ck_assert_msg(a.rv == CACHEW_EOF, "client: %s", a.err);
	for (int v = 0; v < a.n; v++)
		ck_assert_msg(a.seen[v] >= 1, "element %d was lost", v);
	free(a.seen);
	cluster_stop(&c);
}
END_TEST

/* A dispatcher that did not run for a while (its process and its
 * worker's stopped together, as a Ctrl-Z stops an embedded service) does
 * not declare the worker dead the moment it runs again: it heard from
 * nobody meanwhile, so its timeouts are extended by the pause. */
START_TEST(cluster_paused_dispatcher_keeps_its_workers)
{
	char work[600], path[700], *ev = NULL, *log = NULL;
	uint64_t deadline;
	cluster c;

	memset(&c, 0, sizeof(c));
	c.dir = cwt_tmpdir();
	snprintf(work, sizeof(work), "%s/work", c.dir);
	cwt_daemon_start(&c.dispatcher, c.dir, "dispatcher", "--role=dispatcher",
	    "--listen", "tcp://127.0.0.1:0", "--work-dir", work,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "1000",
	    (char *)NULL);
	worker_start(&c, 0);
	snprintf(path, sizeof(path), "%s/events.jsonl", work);
	deadline = cwt_now_ms() + 10000;
	while (cwt_now_ms() < deadline &&
	       (ev == NULL || strstr(ev, "\"worker_registered\"") == NULL)) {
		free(ev);
		cwt_nap_ms(10);
		ev = cwt_slurp(path);
	}
	ck_assert_msg(ev != NULL && strstr(ev, "\"worker_registered\""),
	    "the worker never registered");
	free(ev);
	ck_assert_int_eq(kill(c.dispatcher.pid, SIGSTOP), 0);
	ck_assert_int_eq(kill(c.workers[0].pid, SIGSTOP), 0);
	cwt_nap_ms(3000);
	ck_assert_int_eq(kill(c.dispatcher.pid, SIGCONT), 0);
	ck_assert_int_eq(kill(c.workers[0].pid, SIGCONT), 0);
	/* The first tick after the pause notices it; wait for its line. */
	deadline = cwt_now_ms() + 10000;
	while (cwt_now_ms() < deadline &&
	       (log == NULL || strstr(log, "event=paused") == NULL)) {
		free(log);
		cwt_nap_ms(10);
		log = cwt_slurp(c.dispatcher.log);
	}
	ck_assert_msg(log != NULL && strstr(log, "event=paused"), "log: %s",
	    log != NULL ? log : "(none)");
	free(log);
	/* More than a worker timeout later, the worker is still there and
	 * serves a job. */
	cwt_nap_ms(1500);
	ck_assert_uint_eq(run_digest("range(100)", c.dispatcher.url, NULL).n,
	    100);
	ev = cwt_slurp(path);
	ck_assert_ptr_nonnull(ev);
	ck_assert_msg(strstr(ev, "\"worker_dead\"") == NULL, "events: %s", ev);
	free(ev);
	cluster_stop(&c);
}
END_TEST

START_TEST(cluster_sigterm_drains_a_worker)
{
	cluster c;

	cluster_start(&c, 1);
	run_sum s = run_digest("range(100)", c.dispatcher.url, NULL);
	ck_assert_uint_eq(s.n, 100);
	ck_assert_int_eq(cwt_daemon_stop(&c.workers[0], SIGTERM), 0);
	char *log = cwt_slurp(c.workers[0].log);
	ck_assert_ptr_nonnull(strstr(log, "event=draining"));
	ck_assert_ptr_nonnull(strstr(log, "event=stopped"));
	free(log);
	cluster_stop(&c);
}
END_TEST

START_TEST(cluster_dispatcher_gone_is_a_clear_error)
{
	cluster c;
	cachew_options *o = cwt_opts(1, 1);
	cachew_element **v;
	size_t n;
	char err[512];

	cluster_start(&c, 0);
	char url[256];
	snprintf(url, sizeof(url), "%s", c.dispatcher.url);
	cwt_daemon_stop(&c.dispatcher, SIGKILL);
	ck_assert_int_eq(cachew_options_set_str(o, "service", url), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_int(o, "service_timeout_ms", 500),
	    CACHEW_OK);
	uint64_t t0 = cwt_now_ms();
	cachew_err rv = cwt_run("range(10)", o, &v, &n, err, sizeof(err));
	ck_assert_int_ne(rv, CACHEW_OK);
	ck_assert_msg(strstr(err, url) != NULL, "error names the service: %s",
	    err);
	ck_assert_uint_lt(cwt_now_ms() - t0, 10000);
	cachew_options_destroy(o);
	cluster_stop(&c);
}
END_TEST

/* ---- hostile peers ---------------------------------------------------------------- */

static int
tcp_connect(const char *url)
{
	const char *p = strrchr(url, ':');
	struct sockaddr_in sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)atoi(p + 1));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

static void
send_all(int fd, const void *buf, size_t len)
{
	/* The peer may reset us: MSG_NOSIGNAL, and errors are fine. */
	(void)send(fd, buf, len, MSG_NOSIGNAL);
}

/* The SP-over-TCP handshake of a REQ peer (protocol 0x30). */
static const uint8_t sp_req_hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};

static void
status_answers(const char *url)
{
	char bin[512], cmd[1200];

	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	snprintf(cmd, sizeof(cmd), "%s status %s >/dev/null 2>&1", bin, url);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(cluster_hostile_peers_leave_the_dispatcher_up)
{
	cluster c;
	uint8_t junk[256];
	int idle[100];
	long rss0, rss1;

	cluster_start(&c, 0);
	status_answers(c.dispatcher.url);
	rss0 = rss_kb(c.dispatcher.pid);
	/* Garbage bytes. */
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 131 + 7);
	int fd = tcp_connect(c.dispatcher.url);
	send_all(fd, junk, sizeof(junk));
	close(fd);
	/* A frame claiming 8 GiB. */
	fd = tcp_connect(c.dispatcher.url);
	send_all(fd, sp_req_hello, sizeof(sp_req_hello));
	uint8_t big[8] = {0, 0, 0, 2, 0, 0, 0, 0};
	send_all(fd, big, sizeof(big));
	send_all(fd, junk, 64);
	cwt_nap_ms(50);
	close(fd);
	/* A well-framed request whose msgpack claims 2^32 - 1 entries. */
	fd = tcp_connect(c.dispatcher.url);
	send_all(fd, sp_req_hello, sizeof(sp_req_hello));
	uint8_t msg[8 + 4 + 5] = {0, 0, 0, 0, 0, 0, 0, 9,
	    0x80, 0, 0, 1, 0xdd, 0xff, 0xff, 0xff, 0xff};
	send_all(fd, msg, sizeof(msg));
	cwt_nap_ms(50);
	close(fd);
	/* 100 idle connections, held open while a real client is served. */
	for (int i = 0; i < 100; i++)
		idle[i] = tcp_connect(c.dispatcher.url);
	status_answers(c.dispatcher.url);
	for (int i = 0; i < 100; i++)
		close(idle[i]);
	status_answers(c.dispatcher.url);
	rss1 = rss_kb(c.dispatcher.pid);
	ck_assert_msg(rss1 - rss0 < 64 * 1024, "RSS grew from %ld to %ld kB",
	    rss0, rss1);
	ck_assert_int_eq(kill(c.dispatcher.pid, 0), 0);
	cluster_stop(&c);
}
END_TEST

START_TEST(cluster_status_lists_workers_and_jobs)
{
	cluster c;
	char bin[512], cmd[2000], out[700];

	cluster_start(&c, 2);
	run_sum s = run_digest("range(100)", c.dispatcher.url, NULL);
	ck_assert_uint_eq(s.n, 100);
	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	snprintf(out, sizeof(out), "%s/status.json", c.dir);
	snprintf(cmd, sizeof(cmd), "%s status %s --json > %s", bin,
	    c.dispatcher.url, out);
	ck_assert_int_eq(system(cmd), 0);
	char *json = cwt_slurp(out);
	ck_assert_ptr_nonnull(strstr(json, "\"workers\":[{\"id\":"));
	ck_assert_ptr_nonnull(strstr(json, "\"jobs\":[{"));
	ck_assert_ptr_nonnull(strstr(json, "\"splits_acked\":"));
	/* Exactly what the client received. */
	ck_assert_ptr_nonnull(strstr(json, "\"elements\":100,\"bytes\":800,"));
	free(json);
	cluster_stop(&c);
}
END_TEST

/* ---- cachewd options ---------------------------------------------------------------- */

START_TEST(cachewd_bad_options_exit_2)
{
	char bin[512], cmd[1200];

	snprintf(bin, sizeof(bin), "%s/cachewd", cwt_build_dir());
	snprintf(cmd, sizeof(cmd), "%s --heartbeat-ms 5 --role=worker "
	    "--dispatcher tcp://127.0.0.1:1 2>/dev/null", bin);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s --role=worker 2>/dev/null", bin);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s --bogus=1 2>/dev/null", bin);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s --help >/dev/null", bin);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 0);
	snprintf(cmd, sizeof(cmd), "%s --version >/dev/null", bin);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 0);
}
END_TEST

START_TEST(cachewd_config_file_and_environment)
{
	char *dir = cwt_tmpdir(), conf[700], bin[512], cmd[2000];
	const char *text = "# cachewd\nrole = worker\nheartbeat_ms = 5\n";

	snprintf(conf, sizeof(conf), "%s/cachewd.conf", dir);
	cwt_write_file(conf, text, strlen(text));
	snprintf(bin, sizeof(bin), "%s/cachewd", cwt_build_dir());
	/* The file's bad value is reported with its line. */
	snprintf(cmd, sizeof(cmd), "%s --config %s --dispatcher tcp://x:1 "
	    "2> %s/err", bin, conf, dir);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s/err", dir);
	char *err = cwt_slurp(cmd);
	ck_assert_msg(strstr(err, "cachewd.conf:3") != NULL, "%s", err);
	free(err);
	/* The environment overrides the file. */
	snprintf(cmd, sizeof(cmd), "CACHEW_HEARTBEAT_MS=bad %s --role=worker "
	    "--dispatcher tcp://x:1 2> %s/err", bin, dir);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s/err", dir);
	err = cwt_slurp(cmd);
	ck_assert_msg(strstr(err, "CACHEW_HEARTBEAT_MS") != NULL, "%s", err);
	free(err);
	/* A directory is no config file (it read as an empty one). */
	snprintf(cmd, sizeof(cmd), "%s --config=%s --role=worker "
	    "--dispatcher tcp://x:1 2> %s/err", bin, dir, dir);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	snprintf(cmd, sizeof(cmd), "%s/err", dir);
	err = cwt_slurp(cmd);
	ck_assert_msg(strstr(err, ": is a directory") != NULL, "%s", err);
	free(err);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_cluster_suite(void)
{
	Suite *s = suite_create("cluster");
	TCase *tc = tcase_create("cluster");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, cluster_distributed_epoch_equals_in_process);
	tcase_add_test(tc, cluster_text_files_equal_in_process);
	tcase_add_test(tc, dispatcher_creates_its_work_dir_with_parents);
	tcase_add_test(tc, cluster_workers_run_plugin_functions);
	tcase_add_test(tc, cluster_reshuffle_draws_from_the_epoch);
	tcase_add_test(tc, cluster_client_part_runs_after_the_service);
	tcase_add_test(tc, embedded_service_equals_in_process);
	tcase_add_test(tc, embedded_worker_threads_equal_in_process);
	tcase_add_test(tc, embedded_stats_show_the_worker_part);
	tcase_add_test(tc, embedded_default_survives_fork);
	tcase_add_test(tc, embedded_default_not_started_for_unsplittable);
	tcase_add_test(tc, embedded_parallel_epochs_reads_its_input);
	tcase_add_test(tc, cluster_stats_show_the_worker_part);
	tcase_add_test(tc, cluster_stats_sum_every_worker_exactly);
	tcase_add_test(tc, embedded_stats_sum_every_worker_exactly);
	tcase_add_test(tc, cluster_status_counts_what_the_client_received);
	tcase_add_test(tc, embedded_status_counts_what_the_client_received);
	tcase_add_test(tc, embedded_pipeline_error_reaches_the_client);
	tcase_add_test(tc, embedded_worker_dropped_mid_epoch_loses_nothing);
	tcase_add_test(tc, embedded_iterators_read_in_turn);
	tcase_add_test(tc, embedded_default_leaves_repeat_to_the_plain_executor);
	tcase_add_test(tc, embedded_threads_pipeline_error_reaches_the_client);
	tcase_add_test(tc, cluster_pipeline_error_reaches_the_client);
	tcase_add_test(tc, embedded_two_clients_share_a_named_job);
	tcase_add_test(tc, cluster_two_clients_share_a_named_job);
	tcase_add_test(tc, cluster_worker_killed_mid_epoch_loses_nothing);
	tcase_add_test(tc, cluster_worker_added_mid_epoch_takes_splits);
	tcase_add_test(tc, cluster_sigterm_drains_a_worker);
	tcase_add_test(tc, cluster_paused_dispatcher_keeps_its_workers);
	tcase_add_test(tc, cluster_dispatcher_gone_is_a_clear_error);
	tcase_add_test(tc, cluster_hostile_peers_leave_the_dispatcher_up);
	tcase_add_test(tc, cluster_status_lists_workers_and_jobs);
	tcase_add_test(tc, cachewd_bad_options_exit_2);
	tcase_add_test(tc, cachewd_config_file_and_environment);
	suite_add_tcase(s, tc);
	return s;
}
