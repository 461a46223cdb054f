/*
 * provision_process.c - the "process" provisioner: `cachewd --role=worker`
 * children of this process, on this host.
 *
 * Everything happens on the provisioner's thread: it forks, reaps with
 * waitpid(pid, WNOHANG) on its own children only (never waitpid(-1): the
 * host program may have children of its own), stops the newest children
 * first with SIGTERM and SIGKILLs those that outlive stop_timeout_ms.
 * While children exist the thread wakes every PROC_TICK_MS to reap; SIGCHLD
 * is left alone because a library must not own a process-wide signal.
 *
 * A child gets PR_SET_PDEATHSIG(SIGTERM): should this process die without
 * stopping them (SIGKILL, a crash), its workers drain and exit instead of
 * lingering. The signal follows the forking thread, which is the
 * provisioner's thread and outlives every child it starts. Each child is
 * the leader of its own process group, so a Ctrl-C meant for the dispatcher
 * reaches the workers only through destroy, in order.
 */
#include "provision.h"

#include "../core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define PROC_MAX_WORKERS 1024   /* max_workers accepted */
#define PROC_MAX_ARGS 64        /* extra worker arguments accepted */
#define PROC_TICK_MS 50         /* reaping interval while children live */
#define PROC_BACKOFF_MIN_MS 100 /* first restart delay after a death */
#define PROC_HEALTHY_MS 10000   /* a child up this long was not a crash
				 * loop: its death restarts the backoff */

typedef struct proc_child {
	pid_t pid;
	uint32_t slot;        /* names its log: worker-<slot>.log */
	uint64_t started_ns;
	uint64_t kill_at_ns;  /* stopping: when SIGKILL is due */
	bool stopping;        /* sent SIGTERM */
	bool killed;          /* sent SIGKILL */
} proc_child;

typedef struct proc_state {
	cwi_provisioner *p;
	char **argv;          /* argv[0]: the resolved cachewd path */
	char *log_dir;
	uint32_t stop_timeout_ms;
	uint32_t backoff_max_ms;
	proc_child *kids;     /* in start order: the newest last */
	size_t nkids, capkids;
	uint32_t quick_deaths;   /* consecutive deaths within PROC_HEALTHY_MS */
	uint32_t restarts_due;   /* deaths not yet replaced */
	uint64_t next_start_ns;  /* backoff: no start before this */
} proc_state;

/* ---- configuration ----------------------------------------------------------- */

/* An option that is unset: NULL or "" (option tables keep strings in
 * fixed arrays, where "" means unset). */
static const char *
opt(const char *s)
{
	return s != NULL && s[0] != '\0' ? s : NULL;
}

/* Finds an executable `name` (with a '/': as is; else on PATH). */
static char *
resolve_binary(const char *name)
{
	const char *path = getenv("PATH"), *dir, *end;

	if (strchr(name, '/') != NULL)
		return access(name, X_OK) == 0 ? cwi_strdup(name) : NULL;
	if (path == NULL)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (dir = path; *dir != '\0'; dir = *end != '\0' ? end + 1 : end) {
		end = strchr(dir, ':');
		if (end == NULL)
			end = dir + strlen(dir);
		if (end == dir)
			continue;
		char *cand = cwi_asprintf("%.*s/%s", (int)(end - dir), dir,
		    name);
		if (cand == NULL)
			return NULL;
		if (access(cand, X_OK) == 0)
			return cand;
		free(cand);
	}
	return NULL;
}

static void
proc_fini(void *state)
{
	proc_state *s = state;

	if (s == NULL)
		return;
	if (s->argv != NULL)
		for (size_t i = 0; s->argv[i] != NULL; i++)
			free(s->argv[i]);
	free(s->argv);
	free(s->log_dir);
	free(s->kids);
	free(s);
}

static cachew_err
build_argv(proc_state *s, const cwi_prov_config *cfg)
{
	const char *fixed[] = {"--role=worker", "--dispatcher",
	    cfg->dispatcher, "--listen",
	    opt(cfg->worker_listen) != NULL ? cfg->worker_listen
					    : "tcp://127.0.0.1:0"};
	const size_t nfixed = sizeof(fixed) / sizeof(fixed[0]);
	size_t nextra = 0, k = 0;
	const char *bin = opt(cfg->cachewd) != NULL ? cfg->cachewd : "cachewd";

	while (cfg->worker_args != NULL && cfg->worker_args[nextra] != NULL)
		if (++nextra > PROC_MAX_ARGS)
			return cwi_fail(CACHEW_EINVAL, "provisioner process: "
			    "more than %d worker arguments", PROC_MAX_ARGS);
	s->argv = calloc(1 + nfixed + nextra + 1, sizeof(char *));
	if (s->argv == NULL)
		return cwi_fail(CACHEW_ENOMEM, "provisioner process: out of "
		    "memory");
	s->argv[k] = resolve_binary(bin);
	if (s->argv[k++] == NULL)
		return cwi_fail(CACHEW_EINVAL, "provisioner process: cachewd "
		    "'%s' is not an executable file%s", bin,
		    strchr(bin, '/') == NULL ? " on PATH" : "");
	for (size_t i = 0; i < nfixed; i++)
		if ((s->argv[k++] = cwi_strdup(fixed[i])) == NULL)
			return cwi_fail(CACHEW_ENOMEM, "provisioner process: "
			    "out of memory");
	for (size_t i = 0; i < nextra; i++)
		if ((s->argv[k++] = cwi_strdup(cfg->worker_args[i])) == NULL)
			return cwi_fail(CACHEW_ENOMEM, "provisioner process: "
			    "out of memory");
	return CACHEW_OK;
}

static cachew_err
proc_init(void **state, const cwi_prov_config *cfg, cwi_provisioner *p)
{
	proc_state *s;
	struct stat sb;
	cachew_err rv;

	*state = NULL;
	if (opt(cfg->dispatcher) == NULL)
		return cwi_fail(CACHEW_EINVAL, "provisioner process: no "
		    "dispatcher URL for the workers to register with");
	if (cfg->max_workers > PROC_MAX_WORKERS)
		return cwi_fail(CACHEW_EINVAL, "provisioner process: "
		    "max_workers %u is above %d", cfg->max_workers,
		    PROC_MAX_WORKERS);
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "provisioner process: out of "
		    "memory");
	*state = s;
	s->p = p;
	s->stop_timeout_ms = cfg->stop_timeout_ms != 0 ? cfg->stop_timeout_ms
	    : 10000;
	s->backoff_max_ms = cfg->retry_max_ms != 0 ? cfg->retry_max_ms : 30000;
	rv = build_argv(s, cfg);
	if (rv != CACHEW_OK)
		return rv;
	if (opt(cfg->log_dir) != NULL) {
		if (mkdir(cfg->log_dir, 0755) != 0 && errno != EEXIST)
			return cwi_fail(CACHEW_EINVAL, "provisioner process: "
			    "log_dir %s: %s", cfg->log_dir, strerror(errno));
		if (stat(cfg->log_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
			return cwi_fail(CACHEW_EINVAL, "provisioner process: "
			    "log_dir %s is not a directory", cfg->log_dir);
		s->log_dir = cwi_strdup(cfg->log_dir);
		if (s->log_dir == NULL)
			return cwi_fail(CACHEW_ENOMEM, "provisioner process: "
			    "out of memory");
	}
	return CACHEW_OK;
}

/* ---- starting a child ---------------------------------------------------------- */

/* What a child reports through its error pipe when it cannot exec. */
typedef struct spawn_failure {
	int stage; /* 1: opening the log, 2: exec */
	int err;
} spawn_failure;

/* In the child, between fork and exec: async-signal-safe calls only,
 * because another thread of the parent may have held malloc's lock (or
 * any other) at the fork. Never returns. */
static void
child_exec(char *const argv[], const char *log_path, int errfd,
    pid_t parent)
{
	struct sigaction dfl;
	spawn_failure f = {0, 0};
	sigset_t none;
	int fd;

	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		(void)sigaction(sig, &dfl, NULL);
	(void)setpgid(0, 0);
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
		_exit(127); /* the parent is already gone */
	fd = open("/dev/null", O_RDONLY);
	if (fd >= 0 && fd != 0) {
		(void)dup2(fd, 0);
		(void)close(fd);
	}
	if (log_path != NULL) {
		fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0) {
			f = (spawn_failure){1, errno};
			goto fail;
		}
		(void)dup2(fd, 1);
		(void)dup2(fd, 2);
		if (fd > 2)
			(void)close(fd);
	}
	/* Only 0-2 and the error pipe (close-on-exec) survive: the
	 * dispatcher's sockets and files are none of a worker's business. */
	if (errfd > 3)
		(void)close_range(3, (unsigned)errfd - 1, 0);
	(void)close_range((unsigned)errfd + 1, ~0u, 0);
	sigemptyset(&none);
	(void)sigprocmask(SIG_SETMASK, &none, NULL);
	execve(argv[0], argv, environ);
	f = (spawn_failure){2, errno};
fail:
	(void)!write(errfd, &f, sizeof(f));
	_exit(127);
}

/* Forks and execs one worker; on failure names the cause in msg. */
static bool
spawn_child(proc_state *s, uint32_t slot, pid_t *out, char *msg,
    size_t msglen)
{
	char log_path[PATH_MAX];
	int pfd[2];
	sigset_t all, old;
	spawn_failure f;
	ssize_t got;
	pid_t pid, parent = getpid();

	if (s->log_dir != NULL &&
	    (size_t)snprintf(log_path, sizeof(log_path), "%s/worker-%u.log",
		s->log_dir, slot) >= sizeof(log_path)) {
		snprintf(msg, msglen, "log path in %s too long", s->log_dir);
		return false;
	}
	if (pipe2(pfd, O_CLOEXEC) != 0) {
		snprintf(msg, msglen, "pipe: %s", strerror(errno));
		return false;
	}
	/* Signals stay blocked in the child until its handlers are reset:
	 * none of the parent's handlers may run in the copy. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid = fork();
	if (pid == 0)
		child_exec(s->argv, s->log_dir != NULL ? log_path : NULL,
		    pfd[1], parent);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(pfd[1]);
	if (pid < 0) {
		snprintf(msg, msglen, "fork: %s", strerror(errno));
		close(pfd[0]);
		return false;
	}
	/* EOF: exec succeeded (the pipe closed on exec); else the reason. */
	do
		got = read(pfd[0], &f, sizeof(f));
	while (got < 0 && errno == EINTR);
	close(pfd[0]);
	if (got == (ssize_t)sizeof(f)) {
		(void)waitpid(pid, NULL, 0);
		if (f.stage == 1)
			snprintf(msg, msglen, "cannot open %s/worker-%u.log: %s",
			    s->log_dir, slot, strerror(f.err));
		else
			snprintf(msg, msglen, "cannot execute %s: %s",
			    s->argv[0], strerror(f.err));
		return false;
	}
	*out = pid;
	return true;
}

/* The lowest slot no live child holds. */
static uint32_t
free_slot(const proc_state *s)
{
	for (uint32_t slot = 1;; slot++) {
		bool used = false;
		for (size_t i = 0; i < s->nkids && !used; i++)
			used = s->kids[i].slot == slot;
		if (!used)
			return slot;
	}
}

static uint64_t
backoff_ms(const proc_state *s)
{
	uint64_t ms = PROC_BACKOFF_MIN_MS;

	for (uint32_t i = 1; i < s->quick_deaths && ms < s->backoff_max_ms; i++)
		ms *= 2;
	return ms < s->backoff_max_ms ? ms : s->backoff_max_ms;
}

/* ---- reaping ------------------------------------------------------------------- */

static void
describe_status(int st, char *buf, size_t len)
{
	if (WIFEXITED(st))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st),
		    strsignal(WTERMSIG(st)));
	else
		snprintf(buf, len, "ended with wait status 0x%x", st);
}

/* A child is gone (st < 0: reaped by someone else, status unknown). */
static void
child_gone(proc_state *s, const proc_child *c, int st, uint64_t now)
{
	char how[96];

	if (st < 0)
		snprintf(how, sizeof(how), "vanished (reaped elsewhere: is "
		    "SIGCHLD ignored?)");
	else
		describe_status(st, how, sizeof(how));
	if (c->stopping) {
		if (c->killed)
			cwi_prov_note_failure(s->p, CWI_PROV_EARLIER,
			    "process: worker %u (pid %d) did not stop within "
			    "%u ms of SIGTERM and was killed", c->slot,
			    (int)c->pid, s->stop_timeout_ms);
		else if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			cwi_prov_note_failure(s->p, CWI_PROV_EARLIER,
			    "process: worker %u (pid %d) %s when stopped",
			    c->slot, (int)c->pid, how);
		else
			cwi_log(CACHEW_LOG_INFO, "provision", "event=worker_stopped "
			    "slot=%u pid=%d", c->slot, (int)c->pid);
		return;
	}
	if (now - c->started_ns < (uint64_t)PROC_HEALTHY_MS * 1000000u)
		s->quick_deaths++;
	else
		s->quick_deaths = 1;
	s->restarts_due++;
	s->next_start_ns = now + backoff_ms(s) * 1000000u;
	cwi_prov_note_failure(s->p, CWI_PROV_EARLIER, "process: worker %u "
	    "(pid %d) %s; restarting in %llu ms", c->slot, (int)c->pid, how,
	    (unsigned long long)backoff_ms(s));
}

static void
reap(proc_state *s, uint64_t now)
{
	size_t i = 0;

	while (i < s->nkids) {
		proc_child c = s->kids[i];
		int st = 0;
		pid_t r = waitpid(c.pid, &st, WNOHANG);

		if (r == 0 || (r < 0 && errno == EINTR)) {
			i++;
			continue;
		}
		memmove(&s->kids[i], &s->kids[i + 1],
		    (s->nkids - i - 1) * sizeof(s->kids[0]));
		s->nkids--;
		child_gone(s, &c, r == c.pid ? st : -1, now);
	}
}

/* ---- the step ------------------------------------------------------------------ */

static uint32_t
count_active(const proc_state *s)
{
	uint32_t n = 0;

	for (size_t i = 0; i < s->nkids; i++)
		n += !s->kids[i].stopping;
	return n;
}

static void
start_one(proc_state *s, uint64_t now)
{
	char msg[300];
	uint32_t slot = free_slot(s);
	pid_t pid;

	if (!CWI_GROW(s->kids, s->capkids, s->nkids + 1))
		snprintf(msg, sizeof(msg), "out of memory");
	else if (spawn_child(s, slot, &pid, msg, sizeof(msg)))
		msg[0] = '\0';
	if (msg[0] != '\0') {
		/* The backoff also ends the caller's loop of starts. */
		s->quick_deaths++;
		s->next_start_ns = now + backoff_ms(s) * 1000000u;
		cwi_prov_note_failure(s->p, s->restarts_due > 0 ?
		    CWI_PROV_RESTART : CWI_PROV_START, "process: worker %u: "
		    "%s; retrying in %llu ms", slot, msg,
		    (unsigned long long)backoff_ms(s));
		return;
	}
	s->kids[s->nkids++] = (proc_child){.pid = pid, .slot = slot,
	    .started_ns = now};
	/* A restart does not clear a death from last_error. */
	cwi_prov_note_request(s->p, s->restarts_due > 0 ? CWI_PROV_RESTART
	    : CWI_PROV_START, s->restarts_due == 0);
	if (s->restarts_due > 0)
		s->restarts_due--;
	cwi_log(CACHEW_LOG_INFO, "provision", "event=worker_started slot=%u "
	    "pid=%d", slot, (int)pid);
}

/* SIGTERMs the newest active child. */
static void
stop_newest(proc_state *s, uint64_t now)
{
	for (size_t i = s->nkids; i-- > 0;) {
		proc_child *c = &s->kids[i];
		if (c->stopping)
			continue;
		c->stopping = true;
		c->kill_at_ns = now + (uint64_t)s->stop_timeout_ms * 1000000u;
		if (kill(c->pid, SIGTERM) != 0)
			cwi_prov_note_failure(s->p, CWI_PROV_STOP, "process: "
			    "worker %u (pid %d): SIGTERM: %s", c->slot,
			    (int)c->pid, strerror(errno));
		else
			cwi_prov_note_request(s->p, CWI_PROV_STOP, true);
		return;
	}
}

static void
kill_overdue(proc_state *s, uint64_t now)
{
	for (size_t i = 0; i < s->nkids; i++) {
		proc_child *c = &s->kids[i];
		if (c->stopping && !c->killed && now >= c->kill_at_ns) {
			(void)kill(c->pid, SIGKILL);
			c->killed = true;
		}
	}
}

static void
report(proc_state *s)
{
	uint32_t active = count_active(s);

	cwi_prov_set_running(s->p, active, (uint32_t)s->nkids - active);
}

static uint64_t
proc_step(void *state, uint32_t target)
{
	proc_state *s = state;
	uint64_t now = cwi_now_ns(), wait = CWI_PROV_IDLE;
	uint32_t active;

	reap(s, now);
	kill_overdue(s, now);
	active = count_active(s);
	if (active > target && s->restarts_due > 0)
		s->restarts_due = 0;
	if (target >= active && s->restarts_due > target - active)
		s->restarts_due = target - active;
	while (active > target) {
		stop_newest(s, now);
		active--;
	}
	if (active < target) {
		if (now < s->next_start_ns)
			wait = (s->next_start_ns - now + 999999u) / 1000000u;
		else
			while (count_active(s) < target &&
			       now >= s->next_start_ns)
				start_one(s, now);
		if (count_active(s) < target && s->next_start_ns > now)
			wait = (s->next_start_ns - now + 999999u) / 1000000u;
	}
	if (s->nkids > 0 && (wait == CWI_PROV_IDLE || wait > PROC_TICK_MS))
		wait = PROC_TICK_MS;
	report(s);
	return wait;
}

/* Destroy: SIGTERM to all, SIGKILL after stop_timeout_ms, reap all. */
static void
proc_stop(void *state)
{
	proc_state *s = state;
	uint64_t now = cwi_now_ns();

	while (count_active(s) > 0)
		stop_newest(s, now);
	report(s);
	while (s->nkids > 0) {
		now = cwi_now_ns();
		reap(s, now);
		kill_overdue(s, now);
		if (s->nkids > 0)
			cwi_sleep_ns(5000000u);
	}
	report(s);
}

const cwi_prov_kind cwi_prov_process = {
    .name = "process",
    .default_max = 8,
    .actions = 1u << CWI_PROV_START | 1u << CWI_PROV_RESTART |
	       1u << CWI_PROV_STOP,
    .init = proc_init,
    .step = proc_step,
    .stop = proc_stop,
    .fini = proc_fini,
};
