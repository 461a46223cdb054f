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

#include <pthread.h>

typedef struct cwi_dispatcher_server cwi_dispatcher_server;
typedef struct cwi_worker cwi_worker;

/* Starts a dispatcher listening on cfg->listen. Thread-safe object. */
cachew_err cwi_dispatcher_server_start(cwi_dispatcher_server **out,
    const cwi_service_config *cfg);
/* The bound address (port 0 resolved), borrowed from d. */
const char *cwi_dispatcher_server_url(const cwi_dispatcher_server *d);
void cwi_dispatcher_server_stop(cwi_dispatcher_server *d);

/* Starts a worker: listens for clients on cfg->listen and registers with
 * cfg->dispatcher (retrying until it answers). */
cachew_err cwi_worker_start(cwi_worker **out, const cwi_service_config *cfg);
/* The same, on inproc only, with its uncoordinated distributed_epoch tasks
 * run inline: by the threads of the in-process clients that read them
 * (cwi_wtask_pull), with no runner thread and no hand-off. The embedded
 * service's first worker. */
cachew_err cwi_worker_start_inline(cwi_worker **out,
    const cwi_service_config *cfg);
const char *cwi_worker_url(const cwi_worker *w);
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
/* Task task_id of w, referenced (cwi_wtask_unref), or NULL. */
struct cwi_wtask *cwi_worker_task(cwi_worker *w, uint64_t task_id);

#endif /* CWI_SERVICE_H */
