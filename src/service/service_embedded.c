/*
 * service_embedded.c - the service inside the process: `service=embedded`
 * (or `embedded:N`) starts, once per process, a dispatcher and N workers
 * (default 1) on the inproc transport, so jobs, splits, leases, metrics and
 * later the policies run exactly as with remote workers, without sockets
 * or serialization (element buffers move as pointers).
 *
 * Locking: emb_lock guards the process-wide instance. It is stopped at
 * exit (atexit), after every iterator using it should be gone.
 */
#include "service.h"
#include "worker/worker_task.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define EMBEDDED_MAX_WORKERS 64

static pthread_mutex_t emb_lock = PTHREAD_MUTEX_INITIALIZER;
static cwi_dispatcher_server *emb_dispatcher;
static cwi_worker *emb_workers[EMBEDDED_MAX_WORKERS];
static size_t emb_nworkers;
static char emb_url[64];
static bool emb_inline; /* emb_workers[0] runs its tasks inline */
static bool emb_atexit;
static pthread_once_t emb_fork_once = PTHREAD_ONCE_INIT;

/* fork(): the child has none of the parent's threads, so the instance it
 * inherits cannot run, and stopping it would wait for threads that do not
 * exist. The child forgets it (its memory stays, unused) and starts its
 * own on first use, under a name with its own pid. emb_lock is held
 * across the fork so that the child's copy is consistent. */
static void
emb_fork_prepare(void)
{
	pthread_mutex_lock(&emb_lock);
}

static void
emb_fork_parent(void)
{
	pthread_mutex_unlock(&emb_lock);
}

static void
emb_fork_child(void)
{
	emb_dispatcher = NULL;
	emb_nworkers = 0;
	emb_inline = false;
	pthread_mutex_unlock(&emb_lock);
}

static void
emb_fork_register(void)
{
	(void)pthread_atfork(emb_fork_prepare, emb_fork_parent,
	    emb_fork_child);
}

static void
embedded_stop(void)
{
	pthread_mutex_lock(&emb_lock);
	for (size_t i = 0; i < emb_nworkers; i++)
		cwi_worker_stop(emb_workers[i]);
	emb_nworkers = 0;
	cwi_dispatcher_server_stop(emb_dispatcher);
	emb_dispatcher = NULL;
	pthread_mutex_unlock(&emb_lock);
}

/* Parses "embedded" or "embedded:N". */
static cachew_err
parse_spec(const char *spec, size_t *nworkers)
{
	char *end;
	long n;

	*nworkers = 1;
	if (strcmp(spec, "embedded") == 0)
		return CACHEW_OK;
	if (strncmp(spec, "embedded:", 9) != 0)
		return cwi_fail(CACHEW_EINVAL, "service '%s': expected embedded "
		    "or embedded:N", spec);
	n = strtol(spec + 9, &end, 10);
	if (*end != '\0' || n < 1 || n > EMBEDDED_MAX_WORKERS)
		return cwi_fail(CACHEW_EINVAL, "service '%s': N must be 1..%d",
		    spec, EMBEDDED_MAX_WORKERS);
	*nworkers = (size_t)n;
	return CACHEW_OK;
}

cachew_err
cwi_embedded_service(const char *spec, char *url, size_t urllen)
{
	cwi_service_config cfg;
	size_t want;
	cachew_err rv;

	rv = parse_spec(spec, &want);
	if (rv != CACHEW_OK)
		return rv;
	pthread_once(&emb_fork_once, emb_fork_register);
	pthread_mutex_lock(&emb_lock);
	if (emb_dispatcher == NULL) {
		snprintf(emb_url, sizeof(emb_url), "inproc://cachew-embedded-%ld",
		    (long)getpid());
		cwi_service_config_defaults(&cfg);
		snprintf(cfg.role, sizeof(cfg.role), "dispatcher");
		snprintf(cfg.listen, sizeof(cfg.listen), "%s", emb_url);
		cfg.heartbeat_ms = 100;
		/* The inline worker takes a whole epoch in one lease. */
		cfg.max_lease = CWI_PROTO_MAX_SPLITS;
		rv = cwi_dispatcher_server_start(&emb_dispatcher, &cfg);
		if (rv != CACHEW_OK)
			goto done;
		if (!emb_atexit) {
			atexit(embedded_stop);
			emb_atexit = true;
		}
	}
	while (emb_nworkers < want) {
		cwi_service_config_defaults(&cfg);
		snprintf(cfg.role, sizeof(cfg.role), "worker");
		snprintf(cfg.dispatcher, sizeof(cfg.dispatcher), "%s", emb_url);
		snprintf(cfg.listen, sizeof(cfg.listen), "%s-w%zu", emb_url,
		    emb_nworkers);
		cfg.heartbeat_ms = 100;
		/* `embedded` (one worker): its tasks run in the clients'
		 * threads, so the service costs what the plain executor
		 * does; embedded:N runs N worker threads. */
		if (emb_nworkers == 0)
			emb_inline = want == 1;
		if (emb_nworkers == 0 && emb_inline)
			rv = cwi_worker_start_inline(&emb_workers[0], &cfg);
		else
			rv = cwi_worker_start(&emb_workers[emb_nworkers], &cfg);
		if (rv != CACHEW_OK)
			goto done;
		emb_nworkers++;
	}
	/* A job created before its workers registered would wait a client
	 * heartbeat to learn of its tasks. In-process, registering takes
	 * microseconds. */
	for (size_t i = 0; i < emb_nworkers; i++)
		(void)cwi_worker_wait_registered(emb_workers[i], 2000);
	snprintf(url, urllen, "%s", emb_url);
done:
	pthread_mutex_unlock(&emb_lock);
	return rv;
}

void
cwi_embedded_poke(const char *url, bool wait)
{
	pthread_mutex_lock(&emb_lock);
	if (emb_dispatcher != NULL && url != NULL && strcmp(url, emb_url) == 0)
		for (size_t i = 0; i < emb_nworkers; i++) {
			if (wait)
				cwi_worker_poke_wait(emb_workers[i], 100);
			else
				cwi_worker_poke(emb_workers[i]);
		}
	pthread_mutex_unlock(&emb_lock);
}

struct cwi_wtask *
cwi_embedded_inline_task(const char *address, uint64_t task_id,
    bool *inline_worker)
{
	struct cwi_wtask *t = NULL;

	*inline_worker = false;
	if (address == NULL || strncmp(address, "inproc://", 9) != 0)
		return NULL;
	pthread_mutex_lock(&emb_lock);
	for (size_t i = 0; i < emb_nworkers && t == NULL; i++) {
		if (strcmp(cwi_worker_url(emb_workers[i]), address) != 0)
			continue;
		*inline_worker = emb_inline && i == 0;
		t = cwi_worker_task(emb_workers[i], task_id);
		if (t != NULL && !cwi_wtask_is_inline(t)) {
			cwi_wtask_unref(t);
			t = NULL;
		}
	}
	pthread_mutex_unlock(&emb_lock);
	return t;
}
