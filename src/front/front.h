/*
 * front.h - the front door: which form of cachew_iterator_create runs
 * (front_iterator.c), and the process's embedded service that the default
 * form reads from (front_embedded.c).
 *
 * The front door sits above every other module of the library (exec,
 * service and below); nothing under it calls up into it.
 */
#ifndef CWI_FRONT_H
#define CWI_FRONT_H

#include "../core/core.h"

/* The process's embedded service for `service=embedded` or `embedded:N`:
 * starts (once) a dispatcher and N workers (default 1) on inproc and
 * writes the dispatcher's URL. `embedded` (one inline worker) and
 * `embedded:N` are separate instances; more workers are added to the
 * latter when a later spec asks for more. */
cachew_err cwi_embedded_service(const char *spec, char *url, size_t urllen);
/* When url is the embedded service's: has its workers heartbeat now, and
 * with `wait` waits for those heartbeats (at most 100 ms each), so a job
 * just created has its tasks started when this returns. Without, it also
 * ends their runners' waits for splits. */
void cwi_embedded_poke(const char *url, bool wait);
/* The task task_id of the embedded worker listening at address when that
 * worker runs its tasks inline, referenced (cwi_wtask_unref); else NULL
 * (another worker, a remote one, a task with a runner, or one the worker
 * has not started yet). *inline_worker says whether address is an inline
 * worker's. */
struct cwi_wtask *cwi_embedded_inline_task(const char *address,
    uint64_t task_id, bool *inline_worker);

#endif /* CWI_FRONT_H */
