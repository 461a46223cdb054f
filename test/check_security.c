/*
 * check_security.c - what a worker may touch (src/io/io_policy.h,
 * docs/security.md, "Workers' file and URL access"): reads outside
 * --allow-read (a file, a ".." path, a symlink leading out, a glob
 * matching outside), URLs to private and loopback addresses (refused,
 * then allowed by a prefix naming the address; redirects), writes outside
 * --cache-root, uncommitted parts bounded by the root's capacity, and
 * --user.
 *
 * The policy is process-wide and set once, so the "policy" tests install
 * it in a child process of their own (never in the test's process, which
 * `make valgrind` runs every test in) and read back what the child saw.
 * The "worker" tests run real `cachewd` processes on loopback, an HTTP
 * server (test/servers/http_server.py) where URLs are concerned, and read
 * through the service as a client does.
 */
#include "cwt.h"

#include "../src/graph/graph.h"
#include "../src/io/io.h"
#include "../src/io/io_policy.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- a directory of data, with something outside ----------------------- */

/* <dir>/data/a.txt ("alpha\nbeta\n"), <dir>/outside/secret.txt
 * ("secret\n"), <dir>/data/link.txt -> ../outside/secret.txt, and the
 * cache root <dir>/cache. */
typedef struct tree {
	char *dir, *data, *outside, *cache;
} tree;

static void
tree_make(tree *t)
{
	char *p;

	t->dir = cwt_tmpdir();
	t->data = cwt_fmt("%s/data", t->dir);
	t->outside = cwt_fmt("%s/outside", t->dir);
	t->cache = cwt_fmt("%s/cache", t->dir);
	ck_assert_int_eq(mkdir(t->data, 0755), 0);
	ck_assert_int_eq(mkdir(t->outside, 0755), 0);
	ck_assert_int_eq(mkdir(t->cache, 0755), 0);
	p = cwt_fmt("%s/a.txt", t->data);
	cwt_write_file(p, "alpha\nbeta\n", 11);
	free(p);
	p = cwt_fmt("%s/secret.txt", t->outside);
	cwt_write_file(p, "secret\n", 7);
	free(p);
	p = cwt_fmt("%s/link.txt", t->data);
	ck_assert_int_eq(symlink("../outside/secret.txt", p), 0);
	free(p);
}

static void
tree_free(tree *t)
{
	cwt_rmtree(t->dir);
	free(t->dir);
	free(t->data);
	free(t->outside);
	free(t->cache);
}

static bool
exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

#define ck_assert_has(hay, needle)                                            \
	ck_assert_msg(strstr((hay), (needle)) != NULL,                        \
	    "expected \"%s\" in \"%s\"", (needle), (hay))

/* ---- a confined child process ------------------------------------------ */

/* Splits a ','-separated list (NULL: none) into v; returns the count. */
static size_t
split(char *list, const char **v, size_t max)
{
	size_t n = 0;
	char *save = NULL;

	for (char *p = list != NULL ? strtok_r(list, ",", &save) : NULL;
	     p != NULL && n < max; p = strtok_r(NULL, ",", &save))
		v[n++] = p;
	return n;
}

static cachew_err
act(const char *action, const char *arg)
{
	char *space = strchr(arg, ' ');
	cwi_file *f = NULL;
	char **paths = NULL;
	size_t n = 0;
	uint64_t cap = 0;
	cachew_err rv;

	if (strcmp(action, "open") == 0) {
		rv = cwi_file_open(&f, arg, NULL);
		cwi_file_close(f);
		return rv;
	}
	if (strcmp(action, "expand") == 0) {
		rv = cwi_paths_expand(&arg, 1, &paths, &n);
		cwi_paths_free(paths);
		return rv;
	}
	if (strcmp(action, "write") == 0)
		return cwi_io_check_write(arg);
	if (strcmp(action, "root") == 0)
		return cwi_io_check_cache_root(arg, &cap);
	if (strcmp(action, "url") == 0)
		return cwi_io_check_read(arg);
	if (space == NULL)
		return cwi_fail(CACHEW_EINVAL, "test: '%s' needs two arguments",
		    action);
	*space = '\0';
	if (strcmp(action, "peer") == 0)
		return cwi_io_check_peer_text(arg, space + 1);
	if (strcmp(action, "fd") == 0) {
		int fd = open(arg, O_RDONLY | O_CLOEXEC);
		ck_assert_int_ge(fd, 0);
		rv = cwi_io_check_read_fd(fd, space + 1);
		close(fd);
		return rv;
	}
	return cwi_fail(CACHEW_EINVAL, "test: unknown action '%s'", action);
}

/* In a child: installs the policy (reads, roots: ','-separated or NULL),
 * then does `what`: "open PATH", "expand PATTERN", "write PATH", "root
 * PATH" (a cache root), "url URL", "peer URL IP", "fd PATH ALIAS" (opens
 * PATH unchecked and checks the descriptor as ALIAS), "run PIPELINE",
 * "install" (a second policy). Writes "ok" or the error message to fd. */
static void
child(const char *reads, const char *roots, const char *what, int fd)
{
	char *r = reads != NULL ? strdup(reads) : NULL;
	char *w = roots != NULL ? strdup(roots) : NULL;
	char *cmd = strdup(what), *arg, msg[4096];
	const char *rv_[16], *wv[16];
	cwi_io_write_root wr[16];
	size_t nr = split(r, rv_, 16), nw = split(w, wv, 16);
	cachew_err rv;

	for (size_t i = 0; i < nw; i++)
		wr[i] = (cwi_io_write_root){.path = wv[i], .capacity = 0};
	rv = cwi_io_policy_install(rv_, nr, wr, nw);
	arg = strchr(cmd, ' ');
	if (arg != NULL)
		*arg++ = '\0';
	if (rv == CACHEW_OK && strcmp(cmd, "install") == 0) {
		rv = cwi_io_policy_install(rv_, nr, wr, nw);
	} else if (rv == CACHEW_OK && strcmp(cmd, "run") == 0) {
		cachew_element **out = NULL;
		size_t n = 0;
		msg[0] = '\0';
		rv = cwt_run(arg, NULL, &out, &n, msg, sizeof(msg));
		cwt_free(out, n);
		if (rv != CACHEW_OK)
			cwi_fail(rv, "%s", msg);
	} else if (rv == CACHEW_OK) {
		rv = act(cmd, arg != NULL ? arg : "");
	}
	snprintf(msg, sizeof(msg), "%s",
	    rv == CACHEW_OK ? "ok" : cachew_errmsg());
	ck_assert_int_eq(write(fd, msg, strlen(msg)), (ssize_t)strlen(msg));
	_exit(0);
}

/* What a process confined to reads and roots saw doing `what` (free). */
static char *
confined(const char *reads, const char *roots, const char *what)
{
	char buf[4096];
	size_t len = 0;
	ssize_t got;
	int fds[2], st = 0;
	pid_t pid;

	ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(fds[0]);
		child(reads, roots, what, fds[1]);
	}
	close(fds[1]);
	while (len < sizeof(buf) - 1 &&
	       (got = read(fds[0], buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)got;
	buf[len] = '\0';
	close(fds[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	/* Under make valgrind the child's leak check (of the heap it copied
	 * from this process) turns its exit code into valgrind's 1: what it
	 * wrote is its answer either way. */
	ck_assert_msg(WIFEXITED(st) && (WEXITSTATUS(st) == 0 ||
	    (getenv("CWT_VALGRIND") != NULL && WEXITSTATUS(st) == 1 &&
		len > 0)),
	    "the confined child died: %s", buf);
	return strdup(buf);
}

static void
expect(const char *reads, const char *roots, const char *what,
    const char *want)
{
	char *got = confined(reads, roots, what);

	if (strcmp(want, "ok") == 0)
		ck_assert_msg(strcmp(got, "ok") == 0, "%s: %s", what, got);
	else
		ck_assert_has(got, want);
	free(got);
}

/* expect() of two strings made with cwt_fmt, which it frees. */
static void
expect_own(const char *reads, const char *roots, char *what, char *want)
{
	expect(reads, roots, what, want);
	free(what);
	free(want);
}

/* ---- the policy, in a child ---------------------------------------------- */

START_TEST(policy_reads_under_allow_read)
{
	tree t;

	tree_make(&t);
	expect_own(t.data, NULL, cwt_fmt("open %s/a.txt", t.data),
	    cwt_fmt("ok"));
	/* A missing file inside is the usual error, not a refusal. */
	expect_own(t.data, NULL, cwt_fmt("open %s/missing.txt", t.data),
	    cwt_fmt("missing.txt: No such file"));
	tree_free(&t);
}
END_TEST

START_TEST(policy_refuses_a_file_outside_naming_it_and_the_flag)
{
	tree t;

	tree_make(&t);
	expect_own(t.data, NULL, cwt_fmt("open %s/secret.txt", t.outside),
	    cwt_fmt("%s/secret.txt: outside the worker's --allow-read "
		    "(allowed: %s)", t.outside, t.data));
	expect(t.data, NULL, "open /etc/hostname", "/etc/hostname: outside");
	expect(t.data, NULL, "open file:///etc/hostname", "outside the worker");
	tree_free(&t);
}
END_TEST

START_TEST(policy_without_allow_read_reads_nothing_local)
{
	tree t;

	tree_make(&t);
	expect_own(NULL, NULL, cwt_fmt("open %s/a.txt", t.data),
	    cwt_fmt("outside the worker's --allow-read (allowed: none)"));
	expect(NULL, NULL, "url https://example.com/x",
	    "outside the worker's --allow-read (allowed: none)");
	tree_free(&t);
}
END_TEST

START_TEST(policy_resolves_dotdot_before_checking)
{
	tree t;

	tree_make(&t);
	expect_own(t.data, NULL,
	    cwt_fmt("open %s/../outside/secret.txt", t.data),
	    cwt_fmt("resolves to %s/secret.txt, outside", t.outside));
	/* A ".." after a directory that does not exist resolves nowhere. */
	expect_own(t.data, NULL,
	    cwt_fmt("open %s/no/../../outside/secret.txt", t.data),
	    cwt_fmt("does not resolve"));
	tree_free(&t);
}
END_TEST

START_TEST(policy_refuses_a_symlink_leading_out)
{
	tree t;

	tree_make(&t);
	expect_own(t.data, NULL, cwt_fmt("open %s/link.txt", t.data),
	    cwt_fmt("%s/link.txt: resolves to %s/secret.txt, outside", t.data,
		t.outside));
	/* Where a descriptor really leads (a symlink swapped after the
	 * path was checked) is checked too. */
	expect_own(t.data, NULL,
	    cwt_fmt("fd %s/secret.txt %s/a.txt", t.outside, t.data),
	    cwt_fmt("/a.txt: resolves to %s/secret.txt", t.outside));
	tree_free(&t);
}
END_TEST

START_TEST(policy_checks_every_glob_match_and_the_glob_itself)
{
	tree t;

	tree_make(&t);
	expect_own(t.data, NULL, cwt_fmt("expand %s/*.txt", t.data),
	    cwt_fmt("%s/link.txt: resolves to", t.data));
	expect_own(t.data, NULL, cwt_fmt("expand %s/a*.txt", t.data),
	    cwt_fmt("ok"));
	/* A glob over a directory outside is refused before it lists. */
	expect_own(t.data, NULL, cwt_fmt("expand %s/*.txt", t.outside),
	    cwt_fmt("%s/*.txt: resolves to %s, outside", t.outside,
		t.outside));
	expect(t.data, NULL, "expand /etc/host*",
	    "/etc/host*: resolves to /etc, outside");
	/* A ".." after a wildcard would list outside the checked directory
	 * (and the matches' refusals name what is there): refused first. */
	expect_own(t.data, NULL, cwt_fmt("expand %s/[a]*/../../../etc/*",
				     t.data),
	    cwt_fmt("%s/[a]*/../../../etc/*: a '..' in a pattern is not "
		    "allowed", t.data));
	tree_free(&t);
}
END_TEST

START_TEST(policy_cache_roots_are_readable)
{
	tree t;
	char *p;

	tree_make(&t);
	p = cwt_fmt("%s/c.txt", t.cache);
	cwt_write_file(p, "c\n", 2);
	expect_own(NULL, t.cache, cwt_fmt("open %s", p), cwt_fmt("ok"));
	free(p);
	tree_free(&t);
}
END_TEST

START_TEST(policy_writes_only_under_cache_roots)
{
	tree t;
	char *dangle;

	tree_make(&t);
	expect_own(t.data, t.cache, cwt_fmt("write %s/new/x.tfrecord", t.cache),
	    cwt_fmt("ok"));
	expect_own(t.data, t.cache, cwt_fmt("write %s/x.tfrecord", t.data),
	    cwt_fmt("%s/x.tfrecord: outside the worker's --cache-root "
		    "(allowed: %s)", t.data, t.cache));
	expect_own(t.data, t.cache, cwt_fmt("write %s/../outside/x", t.cache),
	    cwt_fmt("outside the worker's --cache-root"));
	/* A dangling symlink would let O_CREAT make its target. */
	dangle = cwt_fmt("%s/dangle", t.cache);
	ck_assert_int_eq(symlink("../outside/new.txt", dangle), 0);
	expect_own(t.data, t.cache, cwt_fmt("write %s", dangle),
	    cwt_fmt("dangling symlink"));
	free(dangle);
	tree_free(&t);
}
END_TEST

START_TEST(policy_pipelines_writing_outside_fail_and_leave_nothing)
{
	tree t;
	char *out;

	tree_make(&t);
	out = cwt_fmt("%s/x.tfrecord", t.outside);
	expect_own(t.data, t.cache,
	    cwt_fmt("run from_list([\"a\", \"b\"]) | tfrecord_write(\"%s\")",
		out),
	    cwt_fmt("tfrecord_write: %s: outside the worker's --cache-root",
		out));
	ck_assert(!exists(out));
	free(out);
	/* The root itself: its temporary file would sit in the root's
	 * parent, outside. */
	expect_own(t.data, t.cache,
	    cwt_fmt("run from_list([\"a\"]) | tfrecord_write(\"%s\")",
		t.cache),
	    cwt_fmt("tfrecord_write: %s.tmp-", t.cache));
	{
		char *parent = strdup(t.cache);
		DIR *dd;
		struct dirent *de;
		*strrchr(parent, '/') = '\0';
		ck_assert_ptr_nonnull(dd = opendir(parent));
		while ((de = readdir(dd)) != NULL)
			ck_assert_msg(strstr(de->d_name, ".tmp-") == NULL,
			    "%s/%s left", parent, de->d_name);
		closedir(dd);
		free(parent);
	}
	out = cwt_fmt("%s/c", t.outside);
	expect_own(t.data, t.cache,
	    cwt_fmt("run range(3) | cache(\"%s\")", out),
	    cwt_fmt("cache: %s: outside the worker's --cache-root", out));
	ck_assert(!exists(out));
	free(out);
	tree_free(&t);
}
END_TEST

START_TEST(policy_caches_go_directly_in_a_cache_root)
{
	tree t;

	tree_make(&t);
	expect_own(NULL, t.cache, cwt_fmt("root %s/", t.cache), cwt_fmt("ok"));
	expect_own(NULL, t.cache, cwt_fmt("root %s/sub", t.cache),
	    cwt_fmt("below a --cache-root, not one"));
	expect(NULL, "s3://bucket/caches", "root s3://bucket/caches/", "ok");
	expect(NULL, "s3://bucket/caches", "root s3://bucket/other",
	    "outside the worker's --cache-root");
	expect_own(NULL, t.cache,
	    cwt_fmt("run range(3) | cache_put(\"%s/sub\")", t.cache),
	    cwt_fmt("cache_put: cache root %s/sub: below", t.cache));
	tree_free(&t);
}
END_TEST

START_TEST(policy_urls_need_a_prefix_at_a_boundary)
{
	const char *r = "https://h.example/data,s3://bucket/train/";

	expect(r, NULL, "url https://h.example/data/x", "ok");
	expect(r, NULL, "url HTTPS://H.EXAMPLE/data?part=1", "ok");
	expect(r, NULL, "url https://h.example/database",
	    "https://h.example/database: outside the worker's --allow-read "
	    "(allowed: https://h.example/data, s3://bucket/train/)");
	expect(r, NULL, "url https://h.example@evil.example/data/x",
	    "outside");
	expect(r, NULL, "url s3://bucket/train/a", "ok");
	expect(r, NULL, "url s3://bucket/other/a", "outside");
	/* Dot segments are refused, not resolved: S3 keys and curl differ. */
	expect(r, NULL, "url s3://bucket/train/../other/a", "'..' path segment");
	expect(r, NULL, "url https://h.example/data/%2E%2e/x", "path segment");
}
END_TEST

START_TEST(policy_private_addresses_need_a_prefix_naming_them)
{
	const char *any = "http://,https://";
	const char *lit = "http://10.1.2.3:8080/,http://[fd00::7]/";

	expect(any, NULL, "peer http://h.example/x 93.184.216.34", "ok");
	expect(any, NULL, "peer http://h.example/x 10.1.2.3",
	    "http://h.example/x: connects to 10.1.2.3, a private address");
	expect(any, NULL, "peer http://h.example:81/x 127.0.0.1",
	    "a loopback address, which a worker reaches only through an "
	    "--allow-read prefix naming that address (such as "
	    "http://127.0.0.1:81/)");
	expect(any, NULL, "peer http://h.example/x ::ffff:127.0.0.1",
	    "a loopback");
	expect(any, NULL, "peer http://h.example/x 169.254.169.254",
	    "a link-local");
	expect(any, NULL, "peer http://h.example/x 172.20.0.1", "a private");
	expect(any, NULL, "peer http://h.example/x 192.168.1.1", "a private");
	expect(any, NULL, "peer http://h.example/x 0.0.0.0", "unspecified");
	expect(any, NULL, "peer http://h.example/x ::1", "a loopback");
	expect(any, NULL, "peer http://h.example/x fe80::1", "a link-local");
	expect(any, NULL, "peer http://h.example/x fc00::1", "a unique local");
	expect(lit, NULL, "peer http://10.1.2.3:8080/x 10.1.2.3", "ok");
	expect(lit, NULL, "peer http://[fd00::7]/x fd00::7", "ok");
	/* The address must be the one the prefix names. */
	expect(lit, NULL, "peer http://10.1.2.3:8080/x 10.1.2.4", "a private");
	expect(lit, NULL, "peer http://10.1.2.3:9090/x 10.1.2.3", "a private");
}
END_TEST

START_TEST(policy_is_installed_once_and_checks_its_items)
{
	tree t;
	char *reads;

	tree_make(&t);
	expect(t.data, NULL, "install", "installed already");
	reads = cwt_fmt("%s/missing,%s", t.dir, t.data);
	expect_own(reads, NULL, cwt_fmt("url s3://b/k"),
	    cwt_fmt("--allow-read %s/missing: No such file or directory",
		t.dir));
	free(reads);
	reads = cwt_fmt("%s/a.txt", t.data);
	expect(reads, NULL, "url s3://b/k", "not a directory");
	free(reads);
	expect("ftp://h/", NULL, "url s3://b/k", "not a local directory or");
	expect(NULL, "https://h/", "url s3://b/k",
	    "--cache-root https://h/: not a local directory or "
	    "s3://bucket/prefix");
	tree_free(&t);
}
END_TEST

/* ---- real workers --------------------------------------------------------- */

typedef struct cluster {
	cwt_daemon dispatcher, worker;
} cluster;

/* A dispatcher and one worker started with up to six more flags (NULL
 * ends them). */
static void
cluster_start6(cluster *c, const char *dir, const char *const e[6])
{
	memset(c, 0, sizeof(*c));
	cwt_daemon_start(&c->dispatcher, dir, "dispatcher", "--role=dispatcher",
	    "--listen", "tcp://127.0.0.1:0", "--heartbeat-ms", "50",
	    (char *)NULL);
	cwt_daemon_start(&c->worker, dir, "worker", "--role=worker",
	    "--dispatcher", c->dispatcher.url, "--listen", "tcp://127.0.0.1:0",
	    "--heartbeat-ms", "50", "--threads", "1", e[0], e[1], e[2], e[3],
	    e[4], e[5], (char *)NULL);
}

static void
cluster_start(cluster *c, const char *dir, const char *a, const char *b,
    const char *x, const char *y)
{
	const char *const e[6] = {a, b, x, y, NULL, NULL};

	cluster_start6(c, dir, e);
}

static void
cluster_stop(cluster *c)
{
	cwt_daemon_stop(&c->worker, SIGKILL);
	cwt_daemon_stop(&c->dispatcher, SIGTERM);
}

static long
vthrough(const cluster *c, char *msg, size_t len, const char *fmt,
    va_list ap)
{
	cachew_options *o = cwt_opts_at(1, 0, c->dispatcher.url);
	cachew_element **out = NULL;
	char *pipeline = NULL;
	size_t n = 0;
	cachew_err rv;

	ck_assert_int_ge(vasprintf(&pipeline, fmt, ap), 0);
	msg[0] = '\0';
	rv = cwt_run(pipeline, o, &out, &n, msg, len);
	cachew_options_destroy(o);
	cwt_free(out, n);
	free(pipeline);
	return rv == CACHEW_OK ? (long)n : -1;
}

/* Runs the pipeline printf(fmt, ...) through the service and checks that
 * it delivers `count` elements. */
static void __attribute__((format(printf, 3, 4)))
delivers(const cluster *c, long count, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	long n;

	va_start(ap, fmt);
	n = vthrough(c, msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ck_assert_msg(n == count, "%ld elements, not %ld: %s", n, count, msg);
}

/* Runs the pipeline printf(fmt, ...) through the service and checks that
 * it fails with `want` in its message. */
static void __attribute__((format(printf, 3, 4)))
refused(const cluster *c, const char *want, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	long n;

	va_start(ap, fmt);
	n = vthrough(c, msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ck_assert_msg(n == -1, "delivered %ld elements", n);
	ck_assert_has(msg, want);
}

START_TEST(worker_reads_under_allow_read)
{
	tree t;
	cluster c;

	tree_make(&t);
	cluster_start(&c, t.dir, "--allow-read", t.data, NULL, NULL);
	delivers(&c, 2, "text_lines(\"%s/a.txt\")", t.data);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

START_TEST(worker_refuses_a_file_outside_allow_read)
{
	tree t;
	cluster c;
	char *want;

	tree_make(&t);
	cluster_start(&c, t.dir, "--allow-read", t.data, NULL, NULL);
	want = cwt_fmt("text_lines: /etc/passwd: outside the worker's "
		       "--allow-read (allowed: %s)", t.data);
	refused(&c, want, "text_lines(\"/etc/passwd\")");
	/* Opened by an operator on the worker: the same refusal. */
	refused(&c, "read_file): /etc/passwd: outside the worker's "
		    "--allow-read",
	    "from_list([\"/etc/passwd\"]) | read_file");
	free(want);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

START_TEST(worker_refuses_dotdot_symlinks_and_globs_leading_out)
{
	tree t;
	cluster c;
	char *want;

	tree_make(&t);
	cluster_start(&c, t.dir, "--allow-read", t.data, NULL, NULL);
	want = cwt_fmt("resolves to %s/secret.txt, outside the worker's "
		       "--allow-read", t.outside);
	refused(&c, want, "text_lines(\"%s/../outside/secret.txt\")", t.data);
	refused(&c, want, "text_lines(\"%s/link.txt\")", t.data);
	refused(&c, "link.txt: resolves to", "list_files(\"%s/*.txt\", "
	    "shuffle=false) | interleave(text_lines)", t.data);
	free(want);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

START_TEST(worker_without_allow_read_reads_nothing_local)
{
	tree t;
	cluster c;

	tree_make(&t);
	cluster_start(&c, t.dir, NULL, NULL, NULL, NULL);
	refused(&c, "outside the worker's --allow-read (allowed: none)",
	    "text_lines(\"%s/a.txt\")", t.data);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

/* An HTTP server on loopback serving <dir>/www/ok/a.txt. */
static void
www_start(cwt_http_server *s, const tree *t)
{
	char *www = cwt_fmt("%s/www", t->dir), *ok = cwt_fmt("%s/ok", www);
	char *f = cwt_fmt("%s/a.txt", ok);

	ck_assert_int_eq(mkdir(www, 0755), 0);
	ck_assert_int_eq(mkdir(ok, 0755), 0);
	cwt_write_file(f, "one\ntwo\nthree\n", 14);
	cwt_http_server_start(s, t->dir, www);
	free(www);
	free(ok);
	free(f);
}

/* How many requests the server logged. */
static int
requests(const cwt_http_server *s)
{
	char *log = cwt_slurp(s->log);
	int n = 0;

	for (const char *p = log; p != NULL && (p = strstr(p, "GET ")) != NULL;
	     p++)
		n++;
	free(log);
	return n;
}

START_TEST(worker_refuses_loopback_urls_without_an_allowance)
{
	tree t;
	cluster c;
	cwt_http_server s;
	char *want, *local;

	tree_make(&t);
	www_start(&s, &t);
	/* Every http URL, but public addresses only; and a name that
	 * resolves to loopback. */
	local = cwt_fmt("http://localhost:%d/", s.port);
	cluster_start(&c, t.dir, "--allow-read", "http://", "--allow-read",
	    local);
	want = cwt_fmt("%s/ok/a.txt: connects to 127.0.0.1, a loopback "
		       "address", s.base);
	refused(&c, want, "text_lines(\"%s/ok/a.txt\")", s.base);
	refused(&c, "loopback address", "text_lines(\"%sok/a.txt\")", local);
	/* Refused before connecting: the server never saw a request. */
	ck_assert_int_eq(requests(&s), 0);
	free(want);
	free(local);
	cluster_stop(&c);
	cwt_http_server_stop(&s);
	tree_free(&t);
}
END_TEST

START_TEST(worker_fetches_a_loopback_url_its_prefix_names)
{
	tree t;
	cluster c;
	cwt_http_server s;
	char *allow;

	tree_make(&t);
	www_start(&s, &t);
	allow = cwt_fmt("%s/ok/", s.base);
	cluster_start(&c, t.dir, "--allow-read", allow, NULL, NULL);
	delivers(&c, 3, "text_lines(\"%s/ok/a.txt\")", s.base);
	/* The same server outside the prefix is refused. */
	refused(&c, "/other/a.txt: outside the worker's --allow-read",
	    "text_lines(\"%s/other/a.txt\")", s.base);
	free(allow);
	cluster_stop(&c);
	cwt_http_server_stop(&s);
	tree_free(&t);
}
END_TEST

START_TEST(worker_checks_where_a_redirect_leads)
{
	tree t;
	cluster c;
	cwt_http_server s;
	char *allow, *allow2;

	tree_make(&t);
	www_start(&s, &t);
	/* /@moved=ok/a.txt redirects to /ok/a.txt, allowed; /@moved=www/
	 * ok/a.txt to /www/ok/a.txt, outside the prefixes. */
	allow = cwt_fmt("%s/ok/", s.base);
	allow2 = cwt_fmt("%s/@moved=ok/,%s/@moved=www/", s.base, s.base);
	cluster_start(&c, t.dir, "--allow-read", allow, "--allow-read", allow2);
	delivers(&c, 3, "text_lines(\"%s/@moved=ok/a.txt\")", s.base);
	refused(&c, "/@moved=www/ok/a.txt: redirected: ",
	    "text_lines(\"%s/@moved=www/ok/a.txt\")", s.base);
	refused(&c, "/www/ok/a.txt: outside the worker's --allow-read",
	    "text_lines(\"%s/@moved=www/ok/a.txt\")", s.base);
	free(allow);
	free(allow2);
	cluster_stop(&c);
	cwt_http_server_stop(&s);
	tree_free(&t);
}
END_TEST

/* A file or URL missing when a worker opens it is the pipeline's error
 * (ENOENT, as in-process), not an unknown task: the run ends with it at
 * once, after the elements before it, instead of the task failing over
 * and over on the same split. */
START_TEST(worker_missing_input_ends_the_run_with_its_error)
{
	tree t;
	cluster c;
	cwt_http_server s;
	char *allow;
	uint64_t t0;

	tree_make(&t);
	www_start(&s, &t);
	allow = cwt_fmt("%s/ok/", s.base);
	cluster_start(&c, t.dir, "--allow-read", t.data, "--allow-read",
	    allow);
	t0 = cwt_now_ms();
	refused(&c, "missing.txt: No such file or directory",
	    "from_list([\"%s/a.txt\", \"%s/missing.txt\"]) | read_file",
	    t.data, t.data);
	refused(&c, "404", "text_lines(\"%s/ok/missing.txt\")", s.base);
	/* Before the fix each failed again every half second until the
	 * test's timeout. */
	ck_assert_uint_lt(cwt_now_ms() - t0, 15000);
	delivers(&c, 3, "text_lines(\"%s/ok/a.txt\")", s.base);
	free(allow);
	cluster_stop(&c);
	cwt_http_server_stop(&s);
	tree_free(&t);
}
END_TEST

START_TEST(worker_refuses_writes_outside_its_cache_roots)
{
	tree t;
	cluster c;
	char *out;

	tree_make(&t);
	cluster_start(&c, t.dir, "--allow-read", t.data, "--cache-root",
	    t.cache);
	/* A distributed write runs on the workers, a lease at a time. */
	out = cwt_fmt("%s/caches", t.outside);
	refused(&c, "/outside/caches: outside the worker's --cache-root "
		    "(allowed: ",
	    "range(10) | cache_put(\"%s\", write_id=7)", out);
	ck_assert(!exists(out));
	free(out);
	/* Inside, the write happens. (A client keeps tfrecord_write and
	 * cache(): policy_pipelines_writing_outside_fail_and_leave_nothing
	 * covers them on a worker.) */
	delivers(&c, 11, "range(11) | cache_put(\"%s\", write_id=8)", t.cache);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

/* Bytes of the regular files under dir, recursively. */
static uint64_t
tree_bytes(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint64_t total = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		char *p;
		if (e->d_name[0] == '.' && (e->d_name[1] == '\0' ||
					       strcmp(e->d_name, "..") == 0))
			continue;
		p = cwt_fmt("%s/%s", dir, e->d_name);
		ck_assert_int_eq(lstat(p, &st), 0);
		total += S_ISDIR(st.st_mode) ? tree_bytes(p)
		    : S_ISREG(st.st_mode)    ? (uint64_t)st.st_size
					     : 0;
		free(p);
	}
	closedir(d);
	return total;
}

START_TEST(worker_bounds_parts_that_are_never_committed)
{
	tree t;
	cluster c;
	char *p, *bin;
	unsigned char block[65536];
	uint64_t seed = 7;

	tree_make(&t);
	/* 64 KiB that do not compress. */
	for (size_t i = 0; i < sizeof(block); i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		block[i] = (unsigned char)(seed >> 56);
	}
	bin = cwt_fmt("%s/rand.bin", t.data);
	cwt_write_file(bin, block, sizeof(block));
	{
		const char *const e[6] = {"--allow-read", t.data,
		    "--cache-root", t.cache, "--cache-capacity", "40000"};
		cluster_start6(&c, t.dir, e);
	}
	/* Three writes no one commits, 64 KiB each: the data flows, the
	 * parts stop at the root's capacity. */
	for (int k = 0; k < 3; k++) {
		delivers(&c, (long)(sizeof(block) >> (8 + k)),
		    "fixed_length_records(\"%s\", record_bytes=%d) | "
		    "cache_put(\"%s\", write_id=%d)",
		    bin, 256 << k, t.cache, k + 1);
		ck_assert_msg(tree_bytes(t.cache) <= 40000, "%llu bytes",
		    (unsigned long long)tree_bytes(t.cache));
	}
	p = cwt_slurp(c.worker.log);
	ck_assert_has(p, "capacity of 40000 bytes exceeded");
	free(p);
	free(bin);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

/* ---- --user ----------------------------------------------------------------- */

/* Runs `cachewd --role=worker ... --user USER` (as uid `as` when not -1)
 * to its exit: the exit code, its stderr in err. */
static int
worker_as(const char *dir, uid_t as, const char *user, char *err,
    size_t len)
{
	char *log = cwt_fmt("%s/user.log", dir), *bin, *text;
	pid_t pid;
	int st = 0;

	bin = cwt_fmt("%s/cachewd", cwt_build_dir());
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || dup2(fd, 2) < 0)
			_exit(126);
		if (as != (uid_t)-1 && (setgid(as) != 0 || setuid(as) != 0))
			_exit(125);
		execl(bin, bin, "--role=worker", "--dispatcher",
		    "tcp://127.0.0.1:1", "--listen", "tcp://127.0.0.1:0",
		    "--user", user, (char *)NULL);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	text = cwt_slurp(log);
	snprintf(err, len, "%s", text != NULL ? text : "");
	free(text);
	free(log);
	free(bin);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(user_unknown_is_refused)
{
	char *dir = cwt_tmpdir(), err[2048];

	ck_assert_int_eq(worker_as(dir, (uid_t)-1, "no-such-user-cachew", err,
			     sizeof(err)),
	    1);
	ck_assert_has(err, "--user no-such-user-cachew: no such user");
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(user_needs_root)
{
	char *dir = cwt_tmpdir(), err[2048];

	/* As nobody (when the tests run as root), or as whoever runs them. */
	chmod(dir, 0777);
	ck_assert_int_eq(worker_as(dir, geteuid() == 0 ? 65534 : (uid_t)-1,
			     "root", err, sizeof(err)),
	    1);
	ck_assert_has(err, "--user root: switching to another user needs root");
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(user_worker_runs_unprivileged)
{
	tree t;
	cluster c;
	char line[256] = "", *p;
	FILE *f;

	if (geteuid() != 0)
		return; /* only root can switch users */
	tree_make(&t);
	/* The data and the log must be reachable by nobody. */
	ck_assert_int_eq(chmod(t.dir, 0755), 0);
	cluster_start(&c, t.dir, "--allow-read", t.data, "--user", "nobody");
	/* Real, effective, saved and file-system uids: all nobody's. */
	p = cwt_fmt("/proc/%d/status", (int)c.worker.pid);
	f = fopen(p, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL &&
	       strncmp(line, "Uid:", 4) != 0)
		;
	fclose(f);
	ck_assert_str_eq(line, "Uid:\t65534\t65534\t65534\t65534\n");
	free(p);
	delivers(&c, 2, "text_lines(\"%s/a.txt\")", t.data);
	p = cwt_slurp(c.worker.log);
	ck_assert_has(p, "event=user_switched user=nobody uid=65534");
	free(p);
	cluster_stop(&c);
	tree_free(&t);
}
END_TEST

START_TEST(dispatcher_takes_one_cache_root)
{
	char *dir = cwt_tmpdir(), *cmd, *err;

	cmd = cwt_fmt("%s/cachewd --role=dispatcher --cache-root %s/a "
		      "--cache-root %s/b 2>%s/err", cwt_build_dir(), dir, dir, dir);
	ck_assert_int_eq(WEXITSTATUS(system(cmd)), 2);
	free(cmd);
	cmd = cwt_fmt("%s/err", dir);
	err = cwt_slurp(cmd);
	ck_assert_has(err, "a dispatcher takes one --cache-root");
	free(err);
	free(cmd);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_security_suite(void)
{
	Suite *s = suite_create("security");
	TCase *tc = tcase_create("policy");

	tcase_add_test(tc, policy_reads_under_allow_read);
	tcase_add_test(tc, policy_refuses_a_file_outside_naming_it_and_the_flag);
	tcase_add_test(tc, policy_without_allow_read_reads_nothing_local);
	tcase_add_test(tc, policy_resolves_dotdot_before_checking);
	tcase_add_test(tc, policy_refuses_a_symlink_leading_out);
	tcase_add_test(tc, policy_checks_every_glob_match_and_the_glob_itself);
	tcase_add_test(tc, policy_cache_roots_are_readable);
	tcase_add_test(tc, policy_writes_only_under_cache_roots);
	tcase_add_test(tc, policy_pipelines_writing_outside_fail_and_leave_nothing);
	tcase_add_test(tc, policy_caches_go_directly_in_a_cache_root);
	tcase_add_test(tc, policy_urls_need_a_prefix_at_a_boundary);
	tcase_add_test(tc, policy_private_addresses_need_a_prefix_naming_them);
	tcase_add_test(tc, policy_is_installed_once_and_checks_its_items);
	suite_add_tcase(s, tc);

	tc = tcase_create("worker");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, worker_reads_under_allow_read);
	tcase_add_test(tc, worker_refuses_a_file_outside_allow_read);
	tcase_add_test(tc, worker_refuses_dotdot_symlinks_and_globs_leading_out);
	tcase_add_test(tc, worker_without_allow_read_reads_nothing_local);
	tcase_add_test(tc, worker_refuses_loopback_urls_without_an_allowance);
	tcase_add_test(tc, worker_fetches_a_loopback_url_its_prefix_names);
	tcase_add_test(tc, worker_checks_where_a_redirect_leads);
	tcase_add_test(tc, worker_missing_input_ends_the_run_with_its_error);
	tcase_add_test(tc, worker_refuses_writes_outside_its_cache_roots);
	tcase_add_test(tc, worker_bounds_parts_that_are_never_committed);
	suite_add_tcase(s, tc);

	tc = tcase_create("user");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, user_unknown_is_refused);
	tcase_add_test(tc, user_needs_root);
	tcase_add_test(tc, user_worker_runs_unprivileged);
	tcase_add_test(tc, dispatcher_takes_one_cache_root);
	suite_add_tcase(s, tc);
	return s;
}
