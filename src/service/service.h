/*
 * service.h - the service roles as library objects: a dispatcher and a
 * worker each run on their own threads behind start/stop, so cachewd,
 * the embedded mode and the tests drive the same code.
 *
 * Lifecycle (libuv-style): start returns a running object or an error (and
 * then nothing runs); stop returns after every thread has exited; after a
 * failed start no callback runs.
 */
#ifndef CWI_SERVICE_H
#define CWI_SERVICE_H

#include "service_config.h"
#include "service_proto.h"

#include <pthread.h>

typedef struct cwi_dispatcher_server cwi_dispatcher_server;
typedef struct cwi_worker cwi_worker;

/* Starts a dispatcher listening on cfg->listen. Thread-safe object. */
cachew_err cwi_dispatcher_server_start(cwi_dispatcher_server **out,
    const cwi_service_config *cfg);
/* The bound address (port 0 resolved), borrowed from d. */
const char *cwi_dispatcher_server_url(const cwi_dispatcher_server *d);
void cwi_dispatcher_server_stop(cwi_dispatcher_server *d);
/* Called after the dispatcher answered a request that created a job
 * (created) or that acknowledged the last of a job's splits (!created), on
 * the thread that handled it, with no lock held. The embedded service wakes
 * its workers with it, so that they start a new job's tasks, or end a
 * finished job's, now rather than at their next heartbeat; over inproc the
 * handler runs on the client's thread, so a new job's tasks have started
 * when the client reads the reply. Set before any client has the URL.
 * job_id: the job created or finished. */
typedef void (*cwi_dispatcher_job_hook)(void *arg, bool created,
    uint64_t job_id);
void cwi_dispatcher_server_set_job_hook(cwi_dispatcher_server *d,
    cwi_dispatcher_job_hook fn, void *arg);
/* The orders to start the tasks of job_id placed on worker_id, as a
 * heartbeat reply carries them: fills out (a cwi_pmsg of type
 * CWI_MSG_WORKER_HEARTBEAT_REPLY, freed by the caller with
 * cwi_pmsg_free), none when there are none. The embedded service hands them
 * to its workers when a job is created, rather than a heartbeat of every
 * task they hold per job (with thousands of live iterators, creating one
 * cost milliseconds). Takes the dispatcher's lock. */
cachew_err cwi_dispatcher_server_job_starts(cwi_dispatcher_server *d,
    uint64_t job_id, uint64_t worker_id, cwi_pmsg *out);

/* Starts a worker: listens for clients on cfg->listen and registers with
 * cfg->dispatcher (retrying until it answers). With cfg->user it switches
 * to that user once the listener is bound; with cfg->confined it then
 * confines its pipelines (cwi_worker_confine) before taking a task. */
cachew_err cwi_worker_start(cwi_worker **out, const cwi_service_config *cfg);
/* The same, on inproc only, with its uncoordinated distributed_epoch tasks
 * direct (it registers `direct`): a client's get_elements runs the task's
 * pipeline on the sending thread, the client's own over inproc, with no
 * runner thread and no hand-off. The embedded service's first worker. */
cachew_err cwi_worker_start_inline(cwi_worker **out,
    const cwi_service_config *cfg);
const char *cwi_worker_url(const cwi_worker *w);
/* Confines this process's pipelines to cfg->allow_read and cfg->cache_root
 * (creating the cache roots): the process-wide access policy of
 * src/io/io_policy.h, installed once. Errors name the flag and item. */
cachew_err cwi_worker_confine(const cwi_service_config *cfg);
/* Begins a drain: take no new splits, deliver the leased ones, deregister.
 * Returns at once; cwi_worker_wait_drained() waits for the end. */
void cwi_worker_drain(cwi_worker *w);
/* Waits up to timeout_ms until the dispatcher registered the worker;
 * CACHEW_ETIMEDOUT if it did not. */
cachew_err cwi_worker_wait_registered(cwi_worker *w, int64_t timeout_ms);
/* Waits up to timeout_ms for the drain to finish; CACHEW_ETIMEDOUT if it
 * did not. */
cachew_err cwi_worker_wait_drained(cwi_worker *w, int64_t timeout_ms);
/* Stops at once (undelivered leases are re-leased by the dispatcher). */
void cwi_worker_stop(cwi_worker *w);
/* Heartbeats now instead of at the end of the interval (a job was just
 * created in this process: its tasks start without waiting for it). */
void cwi_worker_poke(cwi_worker *w);
/* The same, then waits (up to timeout_ms) until a heartbeat that began
 * after the poke has ended: the tasks it was given have started. */
void cwi_worker_poke_wait(cwi_worker *w, int64_t timeout_ms);
/* The worker's id at the dispatcher; 0 until it registered. */
uint64_t cwi_worker_id(cwi_worker *w);
/* Starts the tasks of a heartbeat reply's start list that the worker does
 * not hold yet (none while it drains), as its heartbeat does: the
 * embedded service's start of a new job (cwi_dispatcher_server_job_starts). */
void cwi_worker_start_tasks(cwi_worker *w,
    const cwi_msg_worker_heartbeat_reply *starts);

#endif /* CWI_SERVICE_H */
