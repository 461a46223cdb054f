/*
 * front_embedded.c - the service inside the process: `service=embedded`
 * (or `embedded:N`) starts, once per process, a dispatcher and N workers
 * (default 1) on the inproc transport, so jobs, splits, leases, metrics and
 * later the policies run exactly as with remote workers, without sockets
 * or serialization (element buffers move as pointers).
 *
 * Locking: emb_lock guards the process-wide instances (one for
 * `embedded`, one for `embedded:N`). They are stopped at exit (atexit),
 * after every iterator using them should be gone.
 */
#include "front.h"
#include "../service/service.h"
#include "../service/service_proto.h"
#include "../../transports/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define EMBEDDED_MAX_WORKERS 64

/* One instance: a dispatcher and its workers. `embedded` (one worker)
 * and `embedded:N` get separate instances: were they one, a process that
 * once asked for embedded:2 would have every later default iterator's job
 * split over a threaded worker too (batches cut at more split boundaries,
 * operator rows of half the data), unlike the plain executor. */
typedef struct emb_instance {
	cwi_dispatcher_server *dispatcher;
	cwi_worker *workers[EMBEDDED_MAX_WORKERS];
	size_t nworkers;
	char url[64];
	bool inline_; /* workers[0] serves its tasks directly */
} emb_instance;

static pthread_mutex_t emb_lock = PTHREAD_MUTEX_INITIALIZER;
static emb_instance emb_inst[2]; /* [0]: `embedded`, [1]: `embedded:N` */
static bool emb_atexit;
static pthread_once_t emb_fork_once = PTHREAD_ONCE_INIT;

/* fork(): the child has none of the parent's threads, so the instances it
 * inherits cannot run, and stopping them would wait for threads that do
 * not exist. The child forgets them (their memory stays, unused) and
 * starts its own on first use, under names with its own pid. emb_lock is
 * held across the fork so that the child's copy is consistent. */
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
	for (size_t k = 0; k < 2; k++) {
		emb_inst[k].dispatcher = NULL;
		emb_inst[k].nworkers = 0;
		emb_inst[k].inline_ = false;
	}
	pthread_mutex_unlock(&emb_lock);
}

static void
emb_fork_register(void)
{
	/* emb_lock is held while listening and dialing on inproc, so fork()
	 * must take it before the inproc registry's lock: prepare handlers
	 * run last-registered first, so the registry's go in first. */
	cwi_inproc_fork_init();
	(void)pthread_atfork(emb_fork_prepare, emb_fork_parent,
	    emb_fork_child);
}

/* The dispatcher answered a job's creation or its last acknowledgement.
 * After a creation its workers start the job's tasks now, from the
 * dispatcher's start orders (a worker not registered yet heartbeats, and
 * this waits for that, at most 100 ms), so the job's tasks have started
 * when its client reads the reply; after the last acknowledgement they
 * heartbeat without a wait, and their runners' waits for splits end at
 * once. A heartbeat per creation carried every task the worker held: with
 * thousands of live iterators, creating one cost milliseconds. */
static void
emb_job_hook(void *arg, bool created, uint64_t job_id)
{
	emb_instance *in = arg;

	/* A direct worker holds no request and runs no runner: nothing of
	 * a finished job waits on its heartbeat (it drops the task at the
	 * next one), and a poke per epoch would cost 15% of an iterator. */
	if (!created && in->inline_)
		return;
	pthread_mutex_lock(&emb_lock);
	for (size_t i = 0; i < in->nworkers; i++) {
		cwi_worker *w = in->workers[i];
		uint64_t worker_id = created ? cwi_worker_id(w) : 0;
		cwi_pmsg starts;

		if (!created) {
			cwi_worker_poke(w);
		} else if (worker_id == 0 ||
			   cwi_dispatcher_server_job_starts(in->dispatcher,
			       job_id, worker_id, &starts) != CACHEW_OK) {
			cwi_worker_poke_wait(w, 100);
		} else {
			cwi_worker_start_tasks(w,
			    &starts.u.worker_heartbeat_reply);
			cwi_pmsg_free(&starts);
		}
	}
	pthread_mutex_unlock(&emb_lock);
}

static void
embedded_stop(void)
{
	pthread_mutex_lock(&emb_lock);
	for (size_t k = 0; k < 2; k++) {
		emb_instance *in = &emb_inst[k];
		for (size_t i = 0; i < in->nworkers; i++)
			cwi_worker_stop(in->workers[i]);
		in->nworkers = 0;
		cwi_dispatcher_server_stop(in->dispatcher);
		in->dispatcher = NULL;
	}
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
	emb_instance *in;
	size_t want;
	cachew_err rv;

	rv = parse_spec(spec, &want);
	if (rv != CACHEW_OK)
		return rv;
	pthread_once(&emb_fork_once, emb_fork_register);
	pthread_mutex_lock(&emb_lock);
	/* One worker: the inline instance; N: the threaded one, grown to
	 * the largest N asked for. */
	in = &emb_inst[want == 1 ? 0 : 1];
	if (in->dispatcher == NULL) {
		snprintf(in->url, sizeof(in->url), "inproc://cachew-embedded-%ld%s",
		    (long)getpid(), want == 1 ? "" : "-threads");
		cwi_service_config_defaults(&cfg);
		snprintf(cfg.role, sizeof(cfg.role), "dispatcher");
		snprintf(cfg.listen, sizeof(cfg.listen), "%s", in->url);
		cfg.heartbeat_ms = 100;
		/* The inline worker takes a whole epoch in one lease. */
		cfg.max_lease = CWI_PROTO_MAX_SPLITS;
		/* Every job on every worker: the inline worker's tasks run
		 * on their own consumers' threads, so jobs do not compete
		 * for it, and a policy that granted the one worker to the
		 * oldest job would leave the others waiting for its end:
		 * forever for a program that reads its train and eval
		 * iterators in turn. */
		cfg.policy_engine = false;
		rv = cwi_dispatcher_server_start(&in->dispatcher, &cfg);
		if (rv != CACHEW_OK)
			goto done;
		cwi_dispatcher_server_set_job_hook(in->dispatcher,
		    emb_job_hook, in);
		if (!emb_atexit) {
			atexit(embedded_stop);
			emb_atexit = true;
		}
	}
	while (in->nworkers < want) {
		cwi_service_config_defaults(&cfg);
		snprintf(cfg.role, sizeof(cfg.role), "worker");
		snprintf(cfg.dispatcher, sizeof(cfg.dispatcher), "%s", in->url);
		snprintf(cfg.listen, sizeof(cfg.listen), "%s-w%zu", in->url,
		    in->nworkers);
		cfg.heartbeat_ms = 100;
		/* `embedded` (one worker): its tasks run in the clients'
		 * threads, so the service costs what the plain executor
		 * does; embedded:N runs N worker threads. */
		if (in->nworkers == 0)
			in->inline_ = want == 1;
		if (in->nworkers == 0 && in->inline_)
			rv = cwi_worker_start_inline(&in->workers[0], &cfg);
		else
			rv = cwi_worker_start(&in->workers[in->nworkers], &cfg);
		if (rv != CACHEW_OK)
			goto done;
		in->nworkers++;
	}
	/* A job created before its workers registered would wait a client
	 * heartbeat to learn of its tasks. In-process, registering takes
	 * microseconds. */
	for (size_t i = 0; i < in->nworkers; i++)
		(void)cwi_worker_wait_registered(in->workers[i], 2000);
	snprintf(url, urllen, "%s", in->url);
done:
	pthread_mutex_unlock(&emb_lock);
	return rv;
}
