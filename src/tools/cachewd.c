/*
 * cachewd.c - the cachew daemon: `cachewd --role=dispatcher|worker`.
 *
 * Thin by design: parses options (defaults < config file < CACHEW_*
 * environment < flags, one table in src/service/service_config.c), starts
 * the role from the library and waits for a signal. SIGTERM or SIGINT
 * starts a graceful stop (a worker drains its leased splits first); a
 * second signal exits at once. Exit codes (docs/cachewd.md): 0 clean stop,
 * 1 runtime failure, 2 usage error.
 */
#include "cachew.h"

#include "../service/service.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

static volatile sig_atomic_t signals_seen;

static void
on_signal(int sig)
{
	(void)sig;
	if (++signals_seen >= 2)
		_exit(EXIT_RUNTIME);
}

static void
usage(FILE *out)
{
	fprintf(out,
	    "usage: cachewd --role=dispatcher|worker [options]\n"
	    "       cachewd --help | --version\n"
	    "\n"
	    "  cachewd --role=dispatcher --listen tcp://0.0.0.0:7070 "
	    "--work-dir /var/lib/cachew\n"
	    "          --auth-tokens /etc/cachew/tokens\n"
	    "  cachewd --role=worker --dispatcher tcp://HOST:7070 "
	    "--listen tcp://0.0.0.0:7071\n"
	    "\n"
	    "Every option is a flag (--name=value or --name value), a "
	    "config-file\nline (name = value; --config PATH or CACHEW_CONFIG) "
	    "and an environment\nvariable; flags override the environment, "
	    "which overrides the file.\n\n");
	cwi_service_config_print(out);
	fprintf(out, "\nexit codes: 0 stopped cleanly, 1 runtime failure, "
		     "2 usage error\n");
}

static cachew_log_level
level_of(const char *name)
{
	if (strcmp(name, "error") == 0)
		return CACHEW_LOG_ERROR;
	if (strcmp(name, "warn") == 0)
		return CACHEW_LOG_WARN;
	if (strcmp(name, "debug") == 0)
		return CACHEW_LOG_DEBUG;
	return CACHEW_LOG_INFO;
}

/* Finds --config among the flags: the file is read before the
 * environment and the other flags. */
static const char *
config_path(int argc, char **argv)
{
	const char *path = getenv("CACHEW_CONFIG");

	for (int i = 1; i < argc; i++) {
		if (strncmp(argv[i], "--config=", 9) == 0)
			path = argv[i] + 9;
		else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			path = argv[i + 1];
	}
	return path;
}

/* Applies the flags other than --config. Returns 0 or an exit code. */
static int
parse_flags(int argc, char **argv, cwi_service_config *cfg)
{
	for (int i = 1; i < argc; i++) {
		char name[64], origin[80];
		const char *arg = argv[i], *value, *eq;
		size_t n;

		if (strncmp(arg, "--", 2) != 0) {
			fprintf(stderr, "cachewd: unexpected argument '%s'\n",
			    arg);
			return EXIT_USAGE;
		}
		arg += 2;
		eq = strchr(arg, '=');
		n = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
		if (eq != NULL)
			value = eq + 1;
		else if (strcmp(arg, "insecure") == 0 &&
			 (i + 1 == argc || strncmp(argv[i + 1], "--", 2) == 0))
			value = "1"; /* a bare --insecure */
		else if (i + 1 < argc)
			value = argv[++i];
		else {
			fprintf(stderr, "cachewd: --%s needs a value\n", arg);
			return EXIT_USAGE;
		}
		if (n >= sizeof(name)) {
			fprintf(stderr, "cachewd: unknown option '--%.*s'\n",
			    (int)n, arg);
			return EXIT_USAGE;
		}
		memcpy(name, arg, n);
		name[n] = '\0';
		if (strcmp(name, "config") == 0)
			continue;
		snprintf(origin, sizeof(origin), "--%s", name);
		for (char *p = name; *p != '\0'; p++)
			if (*p == '-')
				*p = '_';
		if (cwi_service_config_set(cfg, name, value, origin) !=
		    CACHEW_OK) {
			fprintf(stderr, "cachewd: %s\n", cachew_errmsg());
			return EXIT_USAGE;
		}
	}
	return 0;
}

/*
 * Signals: main blocks SIGTERM and SIGINT before the role starts, so every
 * thread of the library inherits the mask, and the first signal can only
 * be taken here, by sigwait. (Unblocked in every thread, a process signal
 * goes to whichever thread takes it first: an nng thread ran the handler
 * while main slept on in sigsuspend, and the worker never drained.) Once
 * the first has come this thread unblocks them, so a second one runs
 * on_signal, which exits at once.
 */
static sigset_t stop_signals;

static void
block_stop_signals(void)
{
	sigemptyset(&stop_signals);
	sigaddset(&stop_signals, SIGTERM);
	sigaddset(&stop_signals, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
}

static int
wait_for_signals(void)
{
	int sig = 0;

	while (sigwait(&stop_signals, &sig) != 0)
		;
	signals_seen = 1;
	pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL);
	return (int)signals_seen;
}

static int
run_dispatcher(const cwi_service_config *cfg)
{
	cwi_dispatcher_server *d;

	if (cwi_dispatcher_server_start(&d, cfg) != CACHEW_OK) {
		fprintf(stderr, "event=start_failed role=dispatcher error=\"%s\"\n",
		    cachew_errmsg());
		return EXIT_RUNTIME;
	}
	fprintf(stderr, "event=listening role=dispatcher url=%s pid=%ld\n",
	    cwi_dispatcher_server_url(d), (long)getpid());
	wait_for_signals();
	cwi_dispatcher_server_stop(d);
	fprintf(stderr, "event=stopped role=dispatcher\n");
	return 0;
}

static int
run_worker(const cwi_service_config *cfg)
{
	cwi_worker *w;
	int rc = 0;

	if (cwi_worker_start(&w, cfg) != CACHEW_OK) {
		fprintf(stderr, "event=start_failed role=worker error=\"%s\"\n",
		    cachew_errmsg());
		return EXIT_RUNTIME;
	}
	fprintf(stderr, "event=listening role=worker url=%s pid=%ld\n",
	    cwi_worker_url(w), (long)getpid());
	wait_for_signals();
	fprintf(stderr, "event=draining role=worker\n");
	cwi_worker_drain(w);
	if (cwi_worker_wait_drained(w, cfg->drain_timeout_ms) != CACHEW_OK) {
		fprintf(stderr, "event=drain_timeout role=worker "
				"timeout_ms=%lld\n",
		    (long long)cfg->drain_timeout_ms);
		rc = EXIT_RUNTIME;
	}
	cwi_worker_stop(w);
	fprintf(stderr, "event=stopped role=worker\n");
	return rc;
}

int
main(int argc, char **argv)
{
	cwi_service_config cfg;
	struct sigaction sa;
	const char *path;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("cachewd %s\n", cachew_version());
			return 0;
		}
	}
	cwi_service_config_defaults(&cfg);
	path = config_path(argc, argv);
	if (path != NULL && cwi_service_config_file(&cfg, path) != CACHEW_OK) {
		fprintf(stderr, "cachewd: %s\n", cachew_errmsg());
		return EXIT_USAGE;
	}
	if (cwi_service_config_env(&cfg) != CACHEW_OK) {
		fprintf(stderr, "cachewd: %s\n", cachew_errmsg());
		return EXIT_USAGE;
	}
	rc = parse_flags(argc, argv, &cfg);
	if (rc != 0)
		return rc;
	if (cwi_service_config_check(&cfg) != CACHEW_OK) {
		fprintf(stderr, "cachewd: %s\n", cachew_errmsg());
		usage(stderr);
		return EXIT_USAGE;
	}
	/* A daemon's pipelines come from other users: its worker touches
	 * only what --allow-read and --cache-root allow. */
	cfg.confined = true;
	cachew_log_set(cachew_log_stderr, NULL, level_of(cfg.log_level));
	/* A daemon's process is its own: malloc tuned for large messages
	 * before any thread starts (cwi_heap_tune; CACHEW_MALLOPT=0 opts
	 * out). A library user's process is left alone. */
	(void)cwi_heap_tune(true);
	/* Blocked first: a stop signal arriving between the two would run
	 * the handler (which counts it and returns) and be lost to the
	 * sigwait that starts the shutdown. */
	block_stop_signals();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (strcmp(cfg.role, "dispatcher") == 0)
		return run_dispatcher(&cfg);
	return run_worker(&cfg);
}
