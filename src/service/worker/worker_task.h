/*
 * worker_task.h - one task on a worker: a job's pipeline run lease by lease
 * on a runner thread, its output queue, and the clients reading it.
 *
 * The runner leases splits from the dispatcher, runs each lease as one
 * pipeline instance (cwi_iterator_create_lease) and queues the elements
 * followed by a lease-end marker. Clients' get_elements requests take
 * elements from the queue in order; a request that finds nothing is held
 * and answered when elements arrive or the task ends, so no thread blocks
 * on a slow pipeline.
 *
 * Split acknowledgement: when a lease's end marker is reached, every client
 * that received elements of the lease gets a split end for each of the
 * lease's splits, with `parts` = how many clients share it; the dispatcher
 * counts a split done when that many acks have come. A lease whose
 * elements all went to one client (the common case) has parts = 1.
 *
 * Coordinated reads (num_consumers N > 0): requests name a task round k
 * (the k-th round the consumer reads from this task). Round k is formed,
 * on the first request for it, from the next N queued elements, consumer
 * i getting the i-th, and kept until every consumer took its element;
 * every split whose end marker was met while forming it ends in that round
 * for every consumer (parts = N). When the input is over and fewer than N
 * elements are left, they are dropped and that round is the task's end:
 * end_of_task for every consumer, with the remaining split ends. Formed
 * rounds count against the queue bound, so the fastest consumer runs at
 * most a queue ahead of the slowest. docs/protocol.md, "Coordinated reads
 * on the wire", specifies it.
 *
 * Compression: a reply to a request that asks for zstd, from a client in
 * another process, carries its elements as one zstd frame
 * (service_payload.h), compressed after the lock is released.
 *
 * Locking: task->lock protects the queue, the leases, the held requests and
 * the per-client state. Replies are built under the lock and sent after it
 * is released (the transport may complete a client's request inline).
 */
#ifndef CWI_WORKER_TASK_H
#define CWI_WORKER_TASK_H

#include "../service_rpc.h"
#include "../../exec/exec_split.h"

typedef struct cwi_wtask cwi_wtask;

/* What a task needs from its worker. */
typedef struct cwi_wtask_env {
	cwi_conn *dispatcher;  /* for split leases */
	uint64_t worker_id;
	const cachew_options *opts; /* executor options of lease pipelines */
	int64_t rpc_timeout_ms;
	uint64_t queue_bytes;  /* output queue bound */
	const atomic_bool *draining; /* stop leasing when set */
	bool inproc; /* clients share the process: never compress */
	/* Its uncoordinated distributed_epoch tasks run inline: no runner
	 * thread, the clients' threads run the pipeline in cwi_wtask_pull
	 * (an embedded worker's, so that the embedded service costs what
	 * the plain executor does). */
	bool inline_run;
} cwi_wtask_env;

/* Creates a task from its definition (graph decoded and planned) and
 * starts its runner. The env must outlive the task. */
cachew_err cwi_wtask_start(cwi_wtask **out, const cwi_task_def *def,
    const cwi_wtask_env *env);
uint64_t cwi_wtask_id(const cwi_wtask *t);
void cwi_wtask_ref(cwi_wtask *t);
/* Drops a reference; the last one frees the task (stopped first). */
void cwi_wtask_unref(cwi_wtask *t);
/* Stops the runner, fails held requests with CACHEW_ECLOSED, drops the
 * queue. Idempotent. */
void cwi_wtask_stop(cwi_wtask *t);
/* After cwi_wtask_stop, when the worker goes: waits for a pull in
 * progress to return, and makes later pulls fail with CACHEW_ECLOSED
 * without touching the worker (an inline task outlives it, referenced by
 * the sessions that pull it). */
void cwi_wtask_detach(cwi_wtask *t);

/* Ends the runner's wait for splits at once (it asks the dispatcher
 * again): an in-process client just saw the job's data all acknowledged. */
void cwi_wtask_poke(cwi_wtask *t);

/* What one cwi_wtask_pull gave besides elements. */
typedef struct cwi_wtask_pulled {
	/* The lease ended in this pull: its splits (malloc'd; the caller
	 * frees them), to be acknowledged by the caller. */
	uint64_t *split_ids;
	size_t nsplits;
	bool end_of_task;  /* every split is acknowledged: nothing more */
	uint32_t retry_ms; /* nothing now: every split is leased; ask again */
} cwi_wtask_pulled;

/* Inline tasks: runs the task's lease pipeline on the calling thread
 * (with the puller's executor options opts, NULL = the worker's: threads,
 * determinism, the epoch a shuffle reshuffles by),
 * appending up to max elements to out (which has room for them), leasing
 * splits from the dispatcher as needed. Stops at a lease's end (so its
 * splits are acknowledged at once). One puller at a time; any number of
 * clients may pull (each element goes to one). Errors: the pipeline's
 * (the task has then failed for every puller), CACHEW_ECLOSED once
 * stopped, CACHEW_EINVAL for a task that is not inline. */
bool cwi_wtask_is_inline(const cwi_wtask *t);

/* One operator row of an inline task's pipeline, with its own strings. */
typedef struct cwi_wtask_row {
	char name[48];
	char detail[80];
	cachew_op_stats s; /* name and detail unset */
} cwi_wtask_row;

/* Inline tasks: the operator rows of the lease being pulled, or of the
 * last one finished. Copies up to cap rows; returns how many there are,
 * or SIZE_MAX (nothing copied) while a pull is running. */
size_t cwi_wtask_rows(cwi_wtask *t, cwi_wtask_row *rows, size_t cap);
cachew_err cwi_wtask_pull(cwi_wtask *t, const cachew_options *opts,
    cwi_chunk *out, size_t max, cwi_wtask_pulled *r);

/* Handles a get_elements request (decoded in m; r consumed). */
void cwi_wtask_get_elements(cwi_wtask *t, cwi_request *r,
    const cwi_msg_get_elements *m);

/* Fills a heartbeat report (allocations owned by the report: free with
 * cwi_pmsg_body_free-compatible free() of its arrays). */
cachew_err cwi_wtask_report(cwi_wtask *t, cwi_task_report *rep);
/* True once the runner finished and every queued element and split end
 * was handed to a client. */
bool cwi_wtask_drained(cwi_wtask *t);

#endif /* CWI_WORKER_TASK_H */
