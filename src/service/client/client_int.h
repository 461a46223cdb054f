/*
 * client_int.h - what the parts of the service's client share (internal
 * to src/service/client): the iterator's context, a session (one epoch of
 * the stream) and its tasks. Each part owns one ledger of the session, as
 * zstd splits its compressor around one internal header:
 *   - client.c: the iterator, sessions' lifecycle, the fetch thread's
 *     loop, the element queue, acks, stream requests and their replies;
 *   - client_rounds.c: coordinated reads on the session's side (sending
 *     a round's requests, receiving its replies, delivering rounds in
 *     order; the round bookkeeping itself is client_coord.c's);
 *   - client_zstd.c: compression: what to ask workers for, auto
 *     compression's decision, and decoding replies (decompressed first);
 *   - client_direct.c: a direct task, read by the consumer's own calls,
 *     and its live operator rows (task_stats);
 *   - client_stats.c: the worker part's operator rows as the iterator
 *     shows them, and what a session handed to the client part.
 *
 * Lock order: ctx->rows_lock, then s->lock; exact_lock, then s->lock
 * (client_exact.c). rows_lock guards the
 * context's operator rows and ctx->cur; s->lock guards the element queue,
 * the error, the consumer's timing counters (auto_wait_ns among them) and
 * the direct task fields (inl*); the fetch thread owns everything else of
 * a session.
 */
#ifndef CWI_CLIENT_INT_H
#define CWI_CLIENT_INT_H

#include "client.h"
#include "client_coord.h"
#include "client_stitch.h"

#include "../service.h"
#include "../service_rpc.h"
#include "../service_payload.h"
#include "../../exec/exec_split.h"
#include "../../core/options.h"
#include "../../exec/exec_state.h"

#define TAG_HEARTBEAT UINT64_C(1)
#define TAG_ACK UINT64_C(2)
#define TAG_RELEASE UINT64_C(3)
/* Data requests: TAG_DATA_BASE + (x << 16 | task slot), x being the task
 * round of a coordinated request, else the KiB the request reserved of
 * the client buffer (what its reply may bring). */
#define TAG_DATA_BASE UINT64_C(16)
#define TAG_SLOT_BITS 16
#define MAX_TASK_SLOTS ((size_t)1 << TAG_SLOT_BITS)

/* A saved position being resumed (client_exact.c). */
typedef struct cwi_client_resume cwi_client_resume;

typedef struct held_reply {
	uint64_t seq;
	cwi_msg *msg;
	cwi_pmsg hdr;
	uint64_t reserved; /* of the client buffer, until it is queued */
} held_reply;

typedef struct ctask {
	uint64_t task_id;
	uint64_t secret;    /* its task_info's: sent in every request */
	char *address;
	cwi_conn *conn;     /* borrowed from the session's connection table */
	unsigned inflight;
	/* Bytes of the client buffer its requests in flight and its held
	 * replies may bring (send_requests) */
	uint64_t reserved;
	uint64_t next_seq;  /* next reply to process */
	/* A request of it failed (not exactly once): the reply the worker
	 * built for it may never come, so its replies are taken as they
	 * come from then on, not held for that one forever. */
	bool unordered;
	held_reply *held;   /* replies that came early */
	size_t nheld, capheld;
	bool ended;         /* end_of_task processed */
	bool gone;          /* no longer listed, or its worker failed */
	uint64_t last_group; /* exactly once: the last group it sent, or
			      * UINT64_MAX */
	bool stopped;       /* exactly once: never read again (its replies,
			     * late ones too, are dropped; its groups are
			     * replayed elsewhere) */
	bool direct;        /* read by the consumer (s->inl), not by requests */
	uint64_t retry_at_ns; /* after a failure: when to ask again */
	uint32_t unknown_ms; /* its worker did not have it yet: next wait */
} ctask;

/* One operator row of the worker part, with its own strings. */
typedef struct op_row {
	char name[48];
	char detail[80];
	cachew_op_stats s; /* name and detail unset */
} op_row;

/* A direct task (cwi_task_info.direct): read by calls from the consumer's
 * thread. */
typedef struct direct_task {
	uint64_t id;
	uint64_t secret; /* its task_info's */
	cwi_conn *conn; /* the session's (its connection table) */
} direct_task;

typedef struct conn_ent {
	char *address;
	cwi_conn *conn;
} conn_ent;

/* What auto compression measures over one window. */
typedef struct auto_state {
	uint64_t window_start_ns;
	uint64_t replies;    /* data replies */
	uint64_t backlogged; /* ... whose worker still held data */
	uint64_t raw_bytes;  /* payload bytes received (decoded) */
	uint64_t zraw, zwire; /* compressed replies: content and frame */
	double rate_off;     /* raw bytes/s before zstd went on */
	unsigned on_windows; /* full windows since it went on */
	unsigned backoff;    /* windows left before it may go on again */
	unsigned backoff_len;
} auto_state;

/* What every session of one iterator shares (lives as long as the
 * iterator). */
typedef struct client_ctx {
	char url[CWI_OPT_STR_MAX];
	cwi_opts opts;
	/* The token read from the token_file option (or CACHEW_TOKEN_FILE)
	 * at creation, sent in every request to the dispatcher; NULL:
	 * none. */
	char *token;
	cwi_split_plan *plan;
	/* The client's own spec of the worker part's output names no
	 * component (not known: a cache whose manifest it could not read at
	 * build): received elements take the names their worker tells
	 * (cwi_client_name_elements). Where the client knows names, its own
	 * win. */
	bool wire_names;
	uint8_t *graph;
	size_t graph_len;
	cwi_stream_source src;
	cachew_dataset *client_graph;
	uint64_t seed;
	/* The worker part's operator rows (named from the plan; a direct
	 * task's counters asked of it while an epoch runs, remote ones' from
	 * heartbeat replies; kept after): cachew_iterator_stats shows them
	 * before the client part's. rows_lock guards them and cur. */
	pthread_mutex_t rows_lock;
	struct session *cur; /* the open session, or NULL */
	op_row rows[64]; /* the open session's (names kept after) */
	size_t nrows;
	cachew_op_stats done[64]; /* counters of the sessions that ended */
	size_t ndone;
	bool inline_seen; /* a session read a direct task */
	/* cwi_client_iterator_restore: streams opened now wait for their
	 * restore (the saved position goes with the join) */
	bool restoring;
	/* What stitching made, all sessions (client_stitch.h). */
	cwi_stitch_counts stitched;
} client_ctx;

typedef struct session session;
struct session {
	client_ctx *ctx;
	uint64_t epoch;
	cwi_conn *dispatcher;
	cwi_cq *cq;
	uint64_t dataset_id, job_id, client_id;
	uint64_t lineage; /* the dispatcher's, from the job reply */
	/* The job's split layout (job reply), which a saved position keeps;
	 * and the position being resumed, during the join. */
	uint64_t units, units_per_split;
	const cwi_client_resume *resume;
	uint32_t heartbeat_ms;
	/* The fetch thread's longest wait: 50 ms, doubled after each wait
	 * in which nothing completed, up to heartbeat_ms (an idle iterator
	 * wakes a few times per heartbeat, not 20 times a second). */
	uint32_t idle_wait_ms;

	pthread_t fetcher;
	bool fetcher_started;
	atomic_bool closing;

	/* fetch thread only */
	ctask *tasks;
	size_t ntasks, captasks;
	conn_ent *conns;
	size_t nconns, capconns;
	uint64_t *acks; /* split ends queued, not yet sent */
	uint64_t *ack_parts, *ack_leases;
	size_t nacks, capacks;
	uint64_t *sent_acks; /* the ack message in flight */
	uint64_t *sent_parts, *sent_leases;
	size_t nsent;
	bool ack_inflight, hb_inflight;
	bool release_sent, release_done; /* TAG_RELEASE */
	uint64_t next_hb_ns;
	/* Until the job has a task, heartbeats go after this many ms (from
	 * 1, doubling up to the interval): a new job's task starts moments
	 * after the join, and a short job would otherwise wait a whole
	 * interval to learn of it. */
	uint64_t early_hb_ms;
	uint64_t last_hb_ok_ns;
	bool job_finished;
	/* An ack's reply said every split of the job is acknowledged: every
	 * element reached a client, so the tasks' ends need not be waited
	 * for (what they still send can only repeat acknowledged splits). */
	bool data_acked;
	cwi_coord *coord;   /* coordinated reads; NULL otherwise */
	bool coord_eof;     /* no task can serve a round any more */
	uint64_t coord_elements, coord_bytes; /* received, for the budget */
	cwi_compression compression; /* the job's */
	bool zstd_on;       /* ask remote workers for zstd payloads */
	ZSTD_DCtx *dctx;
	size_t data_limit;  /* data connections' max_msg_size */
	auto_state auto_;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	cwi_element **q; /* ring */
	size_t qhead, qlen, qcap;
	uint64_t qbytes;
	/* Bytes of elements taken whose reply buffer the queue's head still
	 * views (they live as long as it does), and of the chunk the last
	 * stream_next handed out (the iterator holds it until its next call) */
	uint64_t pinned, handed;
	uint64_t elem_max; /* the largest element queued so far */
	bool eof;
	/* cachew_iterator_cancel (stream_cancel, from any thread): the
	 * consumer stops waiting and returns CACHEW_ECANCELED. */
	bool canceled;
	cachew_err err;
	char errmsg[768];
	/* consumer timing since the last heartbeat */
	uint64_t batches, wait_ns, last_next_ns, batch_ns_sum;
	uint64_t last_chunk_n; /* elements handed over at last_next_ns */
	/* The job's direct task (an embedded worker's): the consumer calls
	 * it in stream_next, so its pipeline runs on the consumer's thread;
	 * inl_done once it has nothing more. Set by the fetch thread, used
	 * by the consumer (s->lock). inl_next: the task that replaces it
	 * after the dispatcher dropped the worker (it re-registered), taken
	 * by the consumer between calls; inl_stopped_ns: when a call found
	 * inl stopped (0: not), after which the consumer waits (bounded)
	 * for inl_next; inl_unknown_ns: since when its worker does not know
	 * the task yet (it starts it at its next heartbeat). */
	direct_task inl, inl_next;
	bool inl_done;
	uint64_t inl_stopped_ns, inl_unknown_ns;
	uint32_t inl_unknown_ms;
	char inl_errmsg[256];
	cwi_cq *inl_cq; /* the consumer's calls */
	/* Exactly once, the direct task: a call is running (s->lock
	 * released for it), and the task the consumer may no longer call
	 * (the dispatcher asked to stop it). */
	bool inl_calling;
	uint64_t inl_blocked;
	size_t rr_next; /* fetch thread: where send_requests starts */
	/* fetch thread: send_requests found the buffer full with nothing in
	 * flight */
	bool buffer_full;
	/* s->lock: send_requests refused a request for room; the consumer
	 * wakes the fetch thread (cwi_cq_wake) once its queued, pinned and
	 * handed bytes fall to wake_at_bytes */
	bool wake_armed;
	uint64_t wake_at_bytes;
	uint64_t full_since_ns;    /* since when buffer_full holds */
	uint64_t heap_released_ns; /* release_heap's last */
	uint64_t auto_wait_ns; /* since the last auto window */
	/* Handed to the client part (s->lock): the job's counters. */
	uint64_t elements_received, bytes_received;

	/* Exactly once (client_exact.c), under exact_lock: what this client
	 * received of each group, the tails being stitched, and the tasks to
	 * report as stopped or failed in the next heartbeat (sent_*: in the
	 * heartbeat in flight). The fetch thread and a direct task's
	 * consumer both take replies. */
	bool exact;
	pthread_mutex_t exact_lock;
	struct cgroup *groups;
	size_t ngroups, capgroups, lastgroup;
	struct cwi_stitch *stitch;
	/* The names the replies tell (ctx->wire_names; one reference, NULL:
	 * none yet), for the batches the stitcher makes of their tails. */
	cwi_names *stitch_names;
	uint64_t dups; /* elements received twice, dropped */
	/* Ordered delivery (a private job whose client part starts by
	 * selecting by position: take, skip, shard, enumerate): groups go
	 * out in split order, from `head`; the others' elements are held
	 * (held_bytes count against the client buffer). */
	bool ordered;
	uint64_t head;
	uint64_t held_bytes;
	uint64_t *stopped, *failed, *stop_direct;
	size_t nstopped, capstopped, nfailed, capfailed, nstop_direct,
	    capstop_direct;
	uint64_t *sent_stopped, *sent_failed;
	size_t nsent_stopped, nsent_failed;
};

/* ---- client.c: the session's shared state -------------------------------- */

/* Records the session's first failure and wakes the consumer. */
void cwi_client_fail(session *s, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);
/* Queues an element for the consumer (takes e on success); false on
 * ENOMEM. */
bool cwi_client_queue_push(session *s, cwi_element *e);
/* Bytes queued for the consumer. */
uint64_t cwi_client_queue_bytes(session *s);
/* Drops a task's replies that came early (their reservations with them). */
void cwi_client_task_drop_held(ctask *t);
/* Wakes the consumer (elements were queued). */
void cwi_client_wake(session *s);
/* Records a split end to acknowledge; false on ENOMEM. */
bool cwi_client_add_ack(session *s, uint64_t split_id, uint64_t parts,
    uint64_t lease);
/* The session's task with this id, or NULL. */
ctask *cwi_client_task_by_id(session *s, uint64_t id);
/* Sends g to the task in slot `slot` on the fetch thread's queue. */
cachew_err cwi_client_send_get(session *s, size_t slot,
    const cwi_msg_get_elements *g, uint64_t tag);
/* A failed data request or an error reply: true when it was handled (the
 * request is to be retried or the session failed); false: *hdr holds the
 * get_elements_reply (the caller frees it and c->reply). */
bool cwi_client_data_failed(session *s, ctask *t, cwi_completion *c,
    cwi_pmsg *hdr, uint64_t task_round);
/* The epoch ended for this client: the stitched last batches are queued,
 * then the end (wakes the consumer). Either thread; s->lock not held. */
void cwi_client_end_epoch(session *s);
/* Releases n elements and frees the array. */
void cwi_client_release_all(cwi_element **v, size_t n);

/* ---- client_rounds.c: coordinated reads ---------------------------------- */

/* Creates the session's round bookkeeping (s->coord). */
cachew_err cwi_client_rounds_start(session *s);
/* Sends the requests the next rounds need, within the client buffer. */
void cwi_client_rounds_send(session *s);
/* A reply to a coordinated request (t->inflight already counted down). */
void cwi_client_rounds_reply(session *s, ctask *t, cwi_completion *c,
    uint64_t task_round);
/* Moves the rounds that are ready into the queue, in round order. */
void cwi_client_rounds_deliver(session *s);

/* ---- client_zstd.c: compression ------------------------------------------ */

/* What to ask a task's worker for. */
cwi_compression cwi_client_ask_compression(const session *s,
    const ctask *t);
/* The elements of a reply as an array of *n references the caller owns
 * (release them, free the array), decompressed first when they travel
 * compressed; records what auto compression measures. CACHEW_EPROTO (a
 * reply that breaks the protocol, naming the worker), CACHEW_ENOMEM. */
cachew_err cwi_client_reply_elements(session *s, ctask *t, cwi_msg *msg,
    const cwi_msg_get_elements_reply *r, cwi_element ***out, size_t *n);
/* Gives v[0..n), a reply r's elements in order, the component names
 * r tells (r->names), when the client's own spec names none
 * (ctx->wire_names): only elements of the part's output with as many
 * components as names (an exactly-once tail, a partial group of an
 * operator below the output, is left as it came), only unnamed ones. A
 * shared element is cloned (immutable); ENOMEM leaves one unnamed. */
void cwi_client_name_elements(const session *s,
    const cwi_msg_get_elements_reply *r, cwi_element **v, size_t n);
/* Gives the unnamed ones of v[0..n) with names->n components `names`
 * (NULL: nothing), as cwi_client_name_elements does. */
void cwi_client_give_names(cwi_names *names, cwi_element **v, size_t n);
/* Auto compression's decision, once per window (fetch thread). */
void cwi_client_auto_tick(session *s, uint64_t now);

/* ---- client_exact.c: exactly once ---------------------------------------- */

/* Sets up the session's exactly-once state (s->exact set by the join;
 * exact_lock made with the session). */
cachew_err cwi_client_exact_init(session *s);
void cwi_client_exact_free(session *s);
/* The runs of an in-order reply whose elements are v[0..n) (all taken:
 * v[i] = NULL after): appends to `out`, in stream order, the elements to
 * deliver (those this client did not have yet) with, right after each
 * tail run, the batches its tails completed; records what it received.
 * With `queue` (the fetch thread), they go on to the consumer's queue
 * (out left empty) before exact_lock is released. CACHEW_EPROTO names the
 * worker (runs that do not add up); a stitching failure is the
 * pipeline's, with its message in err. */
cachew_err cwi_client_exact_reply(session *s, const char *worker,
    const cwi_msg_get_elements_reply *r, cwi_element **v, size_t n,
    cwi_chunk *out, bool queue, char *err, size_t errlen);
/* Ordered delivery: bytes held for later groups, and whether task t may
 * still send the head group (it sent no later group). */
uint64_t cwi_client_exact_held(session *s);
bool cwi_client_exact_may_hold_head(session *s, const ctask *t);
/* The epoch ended: the last partial batches, queued for the consumer
 * (out is scratch space, left empty). */
cachew_err cwi_client_exact_finish(session *s, cwi_chunk *out, char *err,
    size_t errlen);
/* Queues the elements of a chunk for the consumer (takes them); false on
 * ENOMEM (the rest released). */
bool cwi_client_queue_chunk(session *s, cwi_chunk *c);
/* The dispatcher asked to stop these tasks (heartbeat reply): each is
 * read no more and reported stopped (a direct task once no call to it
 * runs). Fetch thread. */
void cwi_client_exact_stop(session *s, const uint64_t *ids, size_t n);
/* A task's data request failed: it is read no more and reported failed
 * (and stopped). Fetch thread. */
void cwi_client_exact_failed(session *s, ctask *t);
/* Stops the direct tasks the dispatcher asked to stop whose calls are
 * over (fetch thread, each round). */
void cwi_client_exact_poll(session *s);
/* Whether a heartbeat should go at once (a report is due). */
bool cwi_client_exact_due(session *s);
/* Fills a heartbeat's exactly-once fields (copies it owns). */
void cwi_client_exact_fill(session *s, cwi_msg_client_heartbeat *m);
/* The heartbeat that carried them completed (ok) or failed (they go
 * again with the next). */
void cwi_client_exact_sent(session *s, bool ok);

/* A saved position's session part (cachew_iterator_save through the
 * service): what the client received of each group, the queue, held and
 * stitched elements, under exact_lock and s->lock. CACHEW_ENOTSUP for a
 * session that cannot resume (shared, coordinated, at-least-once), naming
 * why. Consumer's thread, between next() calls. */
cachew_err cwi_client_session_save(session *s, cwi_state_writer *w);
/* A saved session part, read back and checked against the stream's epoch
 * and the plan's batching operators (ngrouping); errors recorded in r. */
cachew_err cwi_client_resume_read(cwi_state_reader *r, uint64_t epoch,
    size_t ngrouping, cwi_client_resume **out);
/* The join request's resume fields (copies the request owns). */
cachew_err cwi_client_resume_fill(const cwi_client_resume *rs,
    cwi_msg_job_get_or_create *j);
/* After the join: the saved groups, queue and tails become the session's
 * (the elements are taken from rs). */
cachew_err cwi_client_resume_install(session *s, cwi_client_resume *rs);
/* The split layout the position was saved under. */
uint64_t cwi_client_resume_units(const cwi_client_resume *rs);
uint64_t cwi_client_resume_units_per_split(const cwi_client_resume *rs);
/* NULL is a no-op. */
void cwi_client_resume_free(cwi_client_resume *rs);

/* ---- client_direct.c: the direct task ------------------------------------ */

/* A direct task was listed (fetch thread): the consumer reads it. false
 * (the session failed) for a second one while the first lives. */
bool cwi_client_take_direct(session *s, ctask *t);
/* The consumer's turn at the direct task (s->lock held; released while a
 * call runs): true when it acted, with *got elements put in out, and the
 * caller looks at the session again; false when there is no direct task
 * to read (the caller waits for the fetch thread). */
bool cwi_client_direct_turn(session *s, cwi_chunk *out, size_t max,
    size_t *got);
/* Asks the direct task for its operator rows, live, into the context
 * (ctx->rows_lock held). */
void cwi_client_rows_refresh(client_ctx *ctx, session *s);

/* ---- client_stats.c: rows and counts ------------------------------------- */

/* Names the worker part's rows from the plan (at the iterator's
 * creation, before any session). */
void cwi_client_rows_prefill(client_ctx *ctx);
/* Remote workers: the job's operator counters in a heartbeat reply
 * become the worker part's rows (fetch thread). */
void cwi_client_rows_from_reply(session *s,
    const cwi_msg_client_heartbeat_reply *r);
/* The session ends: its rows' counters join the earlier epochs'. */
void cwi_client_session_retire_rows(session *s);
/* cachew_iterator_stats' part_stats (cwi_part_stats_fn): the worker
 * part's rows, in place of the stream's. */
size_t cwi_client_part_stats(void *arg, cachew_op_stats *out, size_t cap,
    size_t *hide);
/* Counts the last n elements of out, handed to the client part (s->lock
 * held). */
void cwi_client_count_received(session *s, const cwi_chunk *out, size_t n);

#endif /* CWI_CLIENT_INT_H */
