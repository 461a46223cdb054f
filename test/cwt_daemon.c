/*
 * cwt_daemon.c - starting and stopping real cachewd processes for the
 * end-to-end suites (check_cluster.c, check_coord.c): readiness by the
 * daemon's "event=listening" line, bounded waits, and an atexit handler
 * that kills whatever a failed test left running.
 */
#include "cwt.h"

#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

uint64_t
cwt_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int
cwt_bound_ms(int ms)
{
	return getenv("CWT_VALGRIND") != NULL ? ms * 6 : ms;
}

void
cwt_nap_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	/* The whole time, even when a signal (a child stopping: SIGCHLD)
	 * interrupts the sleep. */
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

int
cwt_count(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

char *
cwt_slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;

	if (f == NULL)
		return NULL;
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	ck_assert_ptr_nonnull(buf);
	len = (long)fread(buf, 1, (size_t)len, f);
	buf[len] = '\0';
	fclose(f);
	return buf;
}

/* Daemons still running: a failing assertion ends the (forked) test with
 * exit(), and this atexit handler then stops them, so a failed test never
 * leaves a process behind. */
static pid_t live_pids[16];
static bool live_registered;

static void
kill_live(void)
{
	for (size_t i = 0; i < 16; i++) {
		if (live_pids[i] > 0) {
			kill(live_pids[i], SIGKILL);
			kill(live_pids[i], SIGCONT);
			waitpid(live_pids[i], NULL, 0);
			live_pids[i] = 0;
		}
	}
}

static void
live_add(pid_t pid)
{
	if (!live_registered) {
		atexit(kill_live);
		live_registered = true;
	}
	for (size_t i = 0; i < 16; i++) {
		if (live_pids[i] == 0) {
			live_pids[i] = pid;
			return;
		}
	}
}

static void
live_remove(pid_t pid)
{
	for (size_t i = 0; i < 16; i++)
		if (live_pids[i] == pid)
			live_pids[i] = 0;
}

/* Starts `cachewd <args...>` (NULL-terminated) with stderr to a log in dir
 * and waits (10 s at most) for its "event=listening ... url=" line. */
void
cwt_daemon_start(cwt_daemon *d, const char *dir, const char *name, ...)
{
	const char *args[32];
	va_list ap;
	size_t n = 0;

	va_start(ap, name);
	while ((args[n] = va_arg(ap, const char *)) != NULL && n < 30)
		n++;
	va_end(ap);
	args[n] = NULL;
	cwt_daemon_startv(d, dir, name, args);
}

void
cwt_daemon_startv(cwt_daemon *d, const char *dir, const char *name,
    const char *const *args)
{
	char bin[512], *argv[32];
	size_t n = 1;
	uint64_t deadline;

	memset(d, 0, sizeof(*d));
	snprintf(bin, sizeof(bin), "%s/cachewd", cwt_build_dir());
	snprintf(d->log, sizeof(d->log), "%s/%s.log", dir, name);
	argv[0] = bin;
	for (; args[n - 1] != NULL && n < 31; n++)
		argv[n] = (char *)args[n - 1];
	argv[n] = NULL;
	fflush(NULL);
	/* posix_spawn, not fork: the child runs no atfork handler and
	 * touches nothing of this process, whose other threads (a client
	 * reading meanwhile) may hold any lock. With fork, a replacement
	 * worker started by the chaos tests was seen, twice in some hundred
	 * starts, to never reach its exec (no log file after 10 s). */
	posix_spawn_file_actions_t fa;
	int rc;
	ck_assert_int_eq(posix_spawn_file_actions_init(&fa), 0);
	ck_assert_int_eq(posix_spawn_file_actions_addopen(&fa, 2, d->log,
			     O_WRONLY | O_CREAT | O_TRUNC, 0644), 0);
	ck_assert_int_eq(posix_spawn_file_actions_addopen(&fa, 1, "/dev/null",
			     O_WRONLY, 0), 0);
	rc = posix_spawn(&d->pid, bin, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	ck_assert_msg(rc == 0, "posix_spawn %s: %s", bin, strerror(rc));
	live_add(d->pid);
	deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(10000);
	while (cwt_now_ms() < deadline) {
		char *log = cwt_slurp(d->log), *p;
		if (log != NULL && (p = strstr(log, "event=listening")) != NULL &&
		    (p = strstr(p, "url=")) != NULL) {
			size_t k = 0;
			p += 4;
			while (p[k] != '\0' && p[k] != ' ' && p[k] != '\n' &&
			       k + 1 < sizeof(d->url))
				k++;
			memcpy(d->url, p, k);
			d->url[k] = '\0';
			free(log);
			return;
		}
		free(log);
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			char *why = cwt_slurp(d->log);
			ck_abort_msg("cachewd %s exited early: %s", name,
			    why != NULL ? why : "");
		}
		cwt_nap_ms(10);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	ck_abort_msg("cachewd %s did not start listening in 10 s", name);
}

/* Sends sig and waits (10 s at most) for the exit; returns the status as
 * an exit code (128 + signal when killed). */
int
cwt_daemon_stop(cwt_daemon *d, int sig)
{
	if (d->pid <= 0)
		return -1;
	kill(d->pid, sig);
	return cwt_daemon_wait(d, 10000);
}

void
cwt_refused_url(char *url, size_t len)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t salen = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &salen), 0);
	close(fd);
	snprintf(url, len, "tcp://127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
}

int
cwt_daemon_wait(cwt_daemon *d, int ms)
{
	uint64_t deadline = cwt_now_ms() + (uint64_t)cwt_bound_ms(ms);
	int st = 0;

	if (d->pid <= 0)
		return -1;
	while (waitpid(d->pid, &st, WNOHANG) == 0) {
		if (cwt_now_ms() > deadline) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			break;
		}
		cwt_nap_ms(5);
	}
	live_remove(d->pid);
	d->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}


int
cwt_dispatcher_stop_verified(cwt_daemon *d)
{
	char *log;
	int rc = cwt_daemon_stop(d, SIGTERM);

	log = cwt_slurp(d->log);
	ck_assert_msg(log != NULL &&
		strstr(log, "event=journal_verify_failed") == NULL,
	    "%s", log != NULL ? log : "no dispatcher log");
	ck_assert_msg(strstr(log, "event=journal_verified") != NULL,
	    "the dispatcher did not verify its journal: %s", log);
	free(log);
	return rc;
}

/* ---- servers the tests talk to ------------------------------------------ */

pid_t
cwt_spawn(char *const argv[], const char *node_path)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (node_path != NULL)
			setenv("NODE_PATH", node_path, 1);
		execvp(argv[0], argv);
		_exit(127);
	}
	return pid;
}

bool
cwt_port_accepts(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
	    .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

int
cwt_await_port(const char *portfile, pid_t pid)
{
	for (int i = 0; i < 400; i++) {
		FILE *f = fopen(portfile, "r");
		int port = 0;
		if (f != NULL) {
			if (fscanf(f, "%d", &port) != 1)
				port = 0;
			fclose(f);
		}
		if (port > 0 && cwt_port_accepts(port))
			return port;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		usleep(50000);
	}
	return -1;
}

void
cwt_stop_pid(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	for (int i = 0; i < 100; i++) {
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return;
		usleep(20000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

void
cwt_http_server_start(cwt_http_server *s, const char *dir, const char *root)
{
	char portfile[512];
	char *argv[] = {"python3", "test/servers/http_server.py", "--root",
	    (char *)root, "--log", s->log, "--portfile", portfile, NULL};

	memset(s, 0, sizeof(*s));
	snprintf(s->log, sizeof(s->log), "%s/http.log", dir);
	snprintf(portfile, sizeof(portfile), "%s/http.port", dir);
	s->pid = cwt_spawn(argv, NULL);
	live_add(s->pid);
	s->port = cwt_await_port(portfile, s->pid);
	ck_assert_msg(s->port > 0, "test/servers/http_server.py did not start");
	snprintf(s->base, sizeof(s->base), "http://127.0.0.1:%d", s->port);
}

void
cwt_http_server_stop(cwt_http_server *s)
{
	cwt_stop_pid(s->pid);
	live_remove(s->pid);
	s->pid = 0;
}

/* ---- a cluster ---------------------------------------------------------- */

/* Appends to args (at n, returning the new n) the TLS flags of c's
 * daemons, none for a plaintext cluster. */
static size_t
cluster_tls_args(const cwt_cluster *c, const char **args, size_t n)
{
	if (c->tls_client_auth == NULL)
		return n;
	args[n++] = "--tls-cert";
	args[n++] = cwt_tls_file("server.pem");
	args[n++] = "--tls-key";
	args[n++] = cwt_tls_file("server.key");
	args[n++] = "--tls-ca";
	args[n++] = cwt_tls_file("ca.pem");
	args[n++] = "--tls-client-auth";
	args[n++] = c->tls_client_auth;
	return n;
}

static const char *
cluster_listen(const cwt_cluster *c)
{
	return c->tls_client_auth != NULL ? "tls+tcp://127.0.0.1:0"
					  : "tcp://127.0.0.1:0";
}

void
cwt_cluster_worker_start(cwt_cluster *c, int i)
{
	char name[32], cache[600];
	const char *args[24] = {"--role=worker", "--dispatcher",
	    c->dispatcher.url, "--listen", cluster_listen(c), "--heartbeat-ms",
	    "50", "--threads", "1", "--allow-read", c->dir, "--cache-root",
	    cache};
	size_t n;

	ck_assert_int_lt(i, CWT_CLUSTER_MAX_WORKERS);
	snprintf(name, sizeof(name), "worker%d", i);
	snprintf(cache, sizeof(cache), "%s/cache", c->dir);
	n = cluster_tls_args(c, args, 13);
	if (c->worker_token[0] != '\0') {
		args[n++] = "--token-file";
		args[n++] = c->worker_token;
	}
	args[n] = NULL;
	cwt_daemon_startv(&c->workers[i], c->dir, name, args);
}

/* Writes text to path with mode 0600 (token files must not be readable
 * by others). */
static void
write_private(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	ck_assert_int_eq(close(fd), 0);
}

/* A fresh random token: 32 hex digits from /dev/urandom. */
static void
random_token(char out[33])
{
	uint8_t b[16];
	int fd = open("/dev/urandom", O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(read(fd, b, sizeof(b)), (ssize_t)sizeof(b));
	close(fd);
	for (size_t i = 0; i < sizeof(b); i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* The token table and files of a secure cluster, in its dir. */
static void
cluster_tokens(cwt_cluster *c)
{
	char w[33], cl[33], line[200];

	random_token(w);
	random_token(cl);
	snprintf(c->token_table, sizeof(c->token_table), "%s/tokens", c->dir);
	snprintf(c->worker_token, sizeof(c->worker_token), "%s/worker.token",
	    c->dir);
	snprintf(c->client_token, sizeof(c->client_token), "%s/client.token",
	    c->dir);
	snprintf(line, sizeof(line), "worker w %s\nclient tenant %s\n", w, cl);
	write_private(c->token_table, line);
	snprintf(line, sizeof(line), "%s\n", w);
	write_private(c->worker_token, line);
	snprintf(line, sizeof(line), "%s\n", cl);
	write_private(c->client_token, line);
}

static void
cluster_start(cwt_cluster *c, int nworkers, const char *tls_client_auth,
    bool tokens)
{
	const char *args[32] = {"--role=dispatcher", "--listen", NULL,
	    "--work-dir", NULL, "--heartbeat-ms", "50", "--worker-timeout-ms",
	    "2000", "--client-timeout-ms", "20000", "--journal-verify", "1"};
	char work[600];
	size_t n;

	memset(c, 0, sizeof(*c));
	c->dir = cwt_tmpdir();
	c->tls_client_auth = tls_client_auth;
	snprintf(work, sizeof(work), "%s/work", c->dir);
	args[2] = cluster_listen(c);
	args[4] = work;
	n = cluster_tls_args(c, args, 13);
	if (tokens) {
		cluster_tokens(c);
		args[n++] = "--auth-tokens";
		args[n++] = c->token_table;
	}
	args[n] = NULL;
	cwt_daemon_startv(&c->dispatcher, c->dir, "dispatcher", args);
	c->verify_journal = true;
	for (int i = 0; i < nworkers; i++)
		cwt_cluster_worker_start(c, i);
	c->nworkers = nworkers;
}

void
cwt_cluster_start(cwt_cluster *c, int nworkers)
{
	cluster_start(c, nworkers, NULL, false);
}

void
cwt_cluster_start_tls(cwt_cluster *c, int nworkers, const char *client_auth)
{
	cluster_start(c, nworkers, client_auth, false);
}

void
cwt_cluster_start_secure(cwt_cluster *c, int nworkers, const char *client_auth)
{
	cluster_start(c, nworkers, client_auth, true);
}

/* Kills the dispatcher (SIGKILL) and starts it again on the same address
 * and work dir after `away_ms`; with `discard`, it starts empty (its
 * journal set aside). */
void
cwt_cluster_dispatcher_restart(cwt_cluster *c, unsigned away_ms, bool discard)
{
	char work[600], url[256];

	snprintf(url, sizeof(url), "%s", c->dispatcher.url);
	snprintf(work, sizeof(work), "%s/work", c->dir);
	cwt_daemon_stop(&c->dispatcher, SIGKILL);
	cwt_nap_ms(away_ms);
	cwt_daemon_start(&c->dispatcher, c->dir, "dispatcher2",
	    "--role=dispatcher", "--listen", url, "--work-dir", work,
	    "--heartbeat-ms", "50", "--worker-timeout-ms", "2000",
	    "--client-timeout-ms", "20000", "--journal-discard",
	    discard ? "1" : "0", "--journal-verify", "1", (char *)NULL);
	ck_assert_str_eq(c->dispatcher.url, url);
}

void
cwt_cluster_stop(cwt_cluster *c)
{
	for (int i = 0; i < CWT_CLUSTER_MAX_WORKERS; i++)
		if (c->workers[i].pid > 0)
			cwt_daemon_stop(&c->workers[i], SIGKILL);
	if (c->dispatcher.pid > 0 && !c->verify_journal)
		cwt_daemon_stop(&c->dispatcher, SIGTERM);
	else if (c->dispatcher.pid > 0)
		cwt_dispatcher_stop_verified(&c->dispatcher);
	cwt_rmtree(c->dir);
	free(c->dir);
}
