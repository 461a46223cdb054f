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

#include "../service_metrics.h"
#include "../service_rpc.h"
#include "../../exec/exec_split.h"

typedef struct cwi_wtask cwi_wtask;

/* What a task needs from its worker. */
typedef struct cwi_wtask_env {
	cwi_conn *dispatcher;  /* for split leases */
	/* The worker's token (--token-file), sent in every request to the
	 * dispatcher; NULL: none. */
	const char *token;
	uint64_t worker_id;
	/* The dispatcher's, from the registration (written by the
	 * heartbeat thread, read by tasks). */
	_Atomic uint64_t lineage;
	const char *address;   /* the worker's data listener, for messages */
	const cachew_options *opts; /* executor options of lease pipelines */
	int64_t rpc_timeout_ms;
	/* How long a lease request rides out an unreachable dispatcher
	 * (a restart) before the task fails. */
	int64_t absence_ms;
	uint64_t queue_bytes;  /* output queue bound */
	const atomic_bool *draining; /* stop leasing when set */
	bool inproc; /* clients share the process: never compress */
	/* Its uncoordinated distributed_epoch tasks are direct: no runner
	 * thread; a client's get_elements runs the pipeline on the sending
	 * thread, which inproc makes the client's own (an embedded worker's,
	 * so that the embedded service costs what the plain executor does). */
	bool inline_run;
	/* Split lease calls that got a reply, retries included (its
	 * /metrics); NULL: not measured. */
	cwi_histogram *lease_latency;
} cwi_wtask_env;

/* Creates a task from its definition (graph decoded and planned) and
 * starts its runner. A graph this worker cannot decode (a function it
 * lacks, another build of a plugin) gives a task that has failed: its
 * clients get the error, naming the worker, and it never reports done.
 * The env must outlive the task. */
cachew_err cwi_wtask_start(cwi_wtask **out, const cwi_task_def *def,
    const cwi_wtask_env *env);
uint64_t cwi_wtask_id(const cwi_wtask *t);
/* Whether a request carrying `secret` may read the task: its def had
 * none (0), or the same. */
bool cwi_wtask_secret_ok(const cwi_wtask *t, uint64_t secret);
/* Whether the task's file sources map local files rather than read them
 * (its records leave the process unread: worker_task.c, records_unread). */
bool cwi_wtask_maps_files(const cwi_wtask *t);
void cwi_wtask_ref(cwi_wtask *t);
/* Drops a reference; the last one frees the task (stopped first). */
void cwi_wtask_unref(cwi_wtask *t);
/* Stops the runner, fails held requests with CACHEW_ECLOSED, drops the
 * queue. Idempotent. */
void cwi_wtask_stop(cwi_wtask *t);
/* After cwi_wtask_stop, when the worker goes: waits for a direct task's
 * call in progress (running on a client's thread, which holds a reference)
 * to return, and makes later calls fail with CACHEW_ECLOSED without
 * touching the worker's dispatcher connection. */
void cwi_wtask_detach(cwi_wtask *t);

/* Ends the runner's wait for splits at once (it asks the dispatcher
 * again): an in-process client just saw the job's data all acknowledged. */
void cwi_wtask_poke(cwi_wtask *t);

/* Handles a get_elements request (decoded in m; r consumed). */
void cwi_wtask_get_elements(cwi_wtask *t, cwi_request *r,
    const cwi_msg_get_elements *m);
/* A direct task's get_elements (r consumed): runs the lease pipeline on
 * this thread, with the request's executor settings (m->exec), leasing
 * splits from the dispatcher as needed, and replies with up to
 * max_elements elements, the splits whose lease ended in this call (the
 * client acknowledges them), end_of_task once every split is acknowledged
 * or retry_ms when every split is leased elsewhere for now. One call at a
 * time runs a task's pipeline; a failure of the pipeline is an error reply
 * with its code and message marked `pipeline`, to this and every later
 * call; a stopped task's is CACHEW_ECLOSED. */
void cwi_wtask_get_elements_direct(cwi_wtask *t, cwi_request *r,
    const cwi_msg_get_elements *m);
/* Handles a task_stats request (r consumed): the task's operator rows
 * summed over its finished leases and, for a direct task, the lease being
 * read; busy when a get_elements is running its pipeline at that
 * moment. */
void cwi_wtask_task_stats(cwi_wtask *t, cwi_request *r);

/* Fills a heartbeat report (allocations owned by the report: free with
 * cwi_pmsg_body_free-compatible free() of its arrays). Its operator rows
 * are left out when the dispatcher took the same ones in a heartbeat
 * (cwi_wtask_report_acked), unless full: a dispatcher that keeps a task's
 * rows when a report has none reads the same state either way. */
cachew_err cwi_wtask_report(cwi_wtask *t, cwi_task_report *rep, bool full);
/* The dispatcher answered the heartbeat that carried rep (made by
 * cwi_wtask_report): it has the task's rows of rep->ops_leases leases. */
void cwi_wtask_report_acked(cwi_wtask *t, const cwi_task_report *rep);
/* True once the runner finished and every queued element and split end
 * was handed to a client. */
bool cwi_wtask_drained(cwi_wtask *t);

#endif /* CWI_WORKER_TASK_H */
