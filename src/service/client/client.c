/*
 * client.c - the client of the service: a cachew_iterator whose worker
 * part runs on the service's workers.
 *
 * cwi_client_iterator_create() plans the split (exec_split.h), registers
 * the worker part with the dispatcher, and iterates the client part
 * locally over a stream source. Each open of the stream is a session: it
 * joins (or creates) the job, and one fetch thread then
 *   - heartbeats every heartbeat interval (elements consumed and their
 *     timing, buffer fill: the autoscaler's signal) and
 *     learns the job's tasks (worker addresses) and whether it finished;
 *   - keeps up to INFLIGHT get_elements requests outstanding per task, on
 *     one completion queue, within the client_buffer byte budget (handed
 *     out breadth first, from a rotating task, so with many workers the
 *     budget is shared and no task starves);
 *   - puts each task's replies back in worker order (their seq), queues the
 *     elements for next(), and acknowledges a split to the dispatcher once
 *     every element before its end has been queued.
 * The consumer thread only takes elements from the queue.
 *
 * Coordinated reads (num_consumers > 0) replace the per-task streams by
 * rounds (client_coord.h): the fetch thread asks each task for its next
 * rounds by task round, and moves rounds into the queue strictly in round
 * order, acknowledging each round's split ends as it goes.
 *
 * Compression (the job's `compression`): the fetch thread asks workers in
 * other processes for zstd payloads (service_payload.h) when the job says
 * zstd, or, with auto, while its measurements say the link is the
 * bottleneck (auto_tick below states the rule); it decompresses them
 * before queueing.
 *
 * Locking: s->lock protects the element queue, the error and the timing
 * counters shared with the consumer; everything else belongs to the fetch
 * thread.
 */
#include "client.h"
#include "client_coord.h"

#include "../service.h"
#include "../service_rpc.h"
#include "../service_payload.h"
#include "../../exec/exec_split.h"
#include "../../core/options.h"

#include <stdio.h>
#include <stdlib.h>

#define INFLIGHT 4            /* get_elements outstanding per task */
#define REPLY_BYTES ((uint64_t)8 << 20)
/* With compression: smaller replies. The worker compresses a reply in one
 * piece before any of it is sent, so a small one starts moving sooner;
 * and auto sees several per window even on a slow link, and its decision
 * takes effect after little data already asked for uncompressed. */
#define REPLY_BYTES_ZSTD ((uint64_t)1 << 20)
/* Coordinated: rounds asked for ahead of the next one delivered, and at
 * most this many of one task's rounds at once (each request is one
 * element, so more are in flight than in stream mode). */
#define COORD_WINDOW 64u
#define COORD_PER_TASK 16u
#define TAG_HEARTBEAT UINT64_C(1)
#define TAG_ACK UINT64_C(2)
#define TAG_RELEASE UINT64_C(3)
/* Data requests: TAG_DATA_BASE + (task round << 16 | task slot). */
#define TAG_DATA_BASE UINT64_C(16)
#define TAG_SLOT_BITS 16
#define MAX_TASK_SLOTS ((size_t)1 << TAG_SLOT_BITS)

/* auto compression (auto_tick) */
#define AUTO_WINDOW_NS (250 * UINT64_C(1000000))
#define AUTO_MIN_REPLIES 3    /* replies a window must see */
#define AUTO_WAIT_FRAC 0.10   /* the consumer waits this share of time */
#define AUTO_BACKLOG_FRAC 0.5 /* replies that left data at the worker */
#define AUTO_MIN_GAIN 1.10    /* zstd must deliver this much more */
#define AUTO_BAD_RATIO 0.90   /* compressed/raw above this: no use */
#define AUTO_BACKOFF_MIN 8u   /* windows before trying again */
#define AUTO_BACKOFF_MAX 64u
#define AUTO_RECHECK_WINDOWS 120u /* on this long (30 s): measure again */

typedef struct held_reply {
	uint64_t seq;
	cwi_msg *msg;
	cwi_pmsg hdr;
} held_reply;

typedef struct ctask {
	uint64_t task_id;
	char *address;
	cwi_conn *conn;     /* borrowed from the session's connection table */
	unsigned inflight;
	uint64_t next_seq;  /* next reply to process */
	held_reply *held;   /* replies that came early */
	size_t nheld, capheld;
	bool ended;         /* end_of_task processed */
	bool gone;          /* no longer listed, or its worker failed */
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
	cwi_split_plan *plan;
	uint8_t *graph;
	size_t graph_len;
	cwi_stream_source src;
	cachew_dataset *client_graph;
	uint64_t seed;
	/* The worker part's operator rows (a direct task's, asked of it
	 * while an epoch runs, kept after): cachew_iterator_stats shows
	 * them before the client part's. rows_lock guards them and cur. */
	pthread_mutex_t rows_lock;
	struct session *cur; /* the open session, or NULL */
	op_row rows[64]; /* the open session's (names kept after) */
	size_t nrows;
	cachew_op_stats done[64]; /* counters of the sessions that ended */
	size_t ndone;
	bool inline_seen; /* a session read a direct task */
} client_ctx;

typedef struct session session;
struct session {
	client_ctx *ctx;
	uint64_t epoch;
	cwi_conn *dispatcher;
	cwi_cq *cq;
	uint64_t dataset_id, job_id, client_id;
	uint32_t heartbeat_ms;

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
	bool eof;
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
	size_t rr_next; /* fetch thread: where send_requests starts */
	uint64_t auto_wait_ns; /* since the last auto window */
};

/* ---- session state shared with the consumer ------------------------------- */

static void
session_fail(session *s, cachew_err err, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

static void
session_fail(session *s, cachew_err err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&s->lock);
	if (s->err == CACHEW_OK) {
		s->err = err;
		va_start(ap, fmt);
		vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
		va_end(ap);
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static bool
queue_push(session *s, cwi_element *e)
{
	pthread_mutex_lock(&s->lock);
	if (s->qlen == s->qcap) {
		size_t cap = s->qcap != 0 ? s->qcap * 2 : 256;
		cwi_element **nq = malloc(cap * sizeof(*nq));
		if (nq == NULL) {
			pthread_mutex_unlock(&s->lock);
			return false;
		}
		for (size_t i = 0; i < s->qlen; i++)
			nq[i] = s->q[(s->qhead + i) % s->qcap];
		free(s->q);
		s->q = nq;
		s->qcap = cap;
		s->qhead = 0;
	}
	s->q[(s->qhead + s->qlen++) % s->qcap] = e;
	s->qbytes += cwi_element_nbytes(e);
	pthread_mutex_unlock(&s->lock);
	return true;
}

static uint64_t
queue_bytes(session *s)
{
	uint64_t b;

	pthread_mutex_lock(&s->lock);
	b = s->qbytes;
	pthread_mutex_unlock(&s->lock);
	return b;
}

/* ---- connections ----------------------------------------------------------- */

static cwi_conn *
conn_for(session *s, const char *address)
{
	cwi_transport_opts o;
	cwi_conn *c;

	for (size_t i = 0; i < s->nconns; i++)
		if (strcmp(s->conns[i].address, address) == 0)
			return s->conns[i].conn;
	cwi_transport_opts_init(&o);
	o.max_msg_size = (size_t)s->ctx->opts.client_buffer > REPLY_BYTES * 4
			     ? (size_t)s->ctx->opts.client_buffer
			     : CWI_TRANSPORT_MAX_MSG_DEFAULT;
	if (o.max_msg_size < CWI_TRANSPORT_MAX_MSG_DEFAULT)
		o.max_msg_size = CWI_TRANSPORT_MAX_MSG_DEFAULT;
	s->data_limit = o.max_msg_size;
	o.dial_async = true;
	if (!CWI_GROW(s->conns, s->capconns, s->nconns + 1))
		return NULL;
	if (cwi_dial(&c, address, &o) != CACHEW_OK)
		return NULL;
	s->conns[s->nconns].address = cwi_strdup(address);
	s->conns[s->nconns].conn = c;
	s->nconns++;
	return c;
}

/* ---- tasks ------------------------------------------------------------------- */

static ctask *
task_by_id(session *s, uint64_t id)
{
	for (size_t i = 0; i < s->ntasks; i++)
		if (s->tasks[i].task_id == id)
			return &s->tasks[i];
	return NULL;
}

/* Whether every direct task the session knows is gone from the
 * dispatcher's list (the fetch thread's view; s->lock held). */
static bool
direct_gone(const session *s)
{
	for (size_t i = 0; i < s->ntasks; i++)
		if (s->tasks[i].direct && !s->tasks[i].gone)
			return false;
	return true;
}

/* A direct task was listed: the consumer reads it (t->conn is open). The
 * first is the job's; after the dispatcher dropped its worker (declared
 * dead, it registered again), the job's new task replaces it: what the
 * old one delivered unacknowledged is leased again (duplicates, no loss).
 * false: a second direct task while the first lives, an error (one
 * worker serves directly, and a job has one task per worker). */
static bool
take_direct(session *s, ctask *t)
{
	bool ok = true;

	pthread_mutex_lock(&s->lock);
	if (s->inl.conn == NULL) {
		s->inl.id = t->task_id;
		s->inl.conn = t->conn;
	} else if (direct_gone(s)) {
		s->inl_next.id = t->task_id;
		s->inl_next.conn = t->conn;
	} else {
		ok = false;
	}
	t->direct = ok;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (!ok)
		session_fail(s, CACHEW_EINVAL, "job %llu: a second direct task "
		    "(%llu)", (unsigned long long)s->job_id,
		    (unsigned long long)t->task_id);
	return ok;
}

static void
update_tasks(session *s, const cwi_msg_client_heartbeat_reply *r)
{
	for (size_t i = 0; i < s->ntasks; i++) {
		bool listed = false;
		for (size_t k = 0; k < r->ntasks; k++)
			if (r->tasks[k].task_id == s->tasks[i].task_id)
				listed = true;
		if (!listed)
			s->tasks[i].gone = true;
	}
	for (size_t k = 0; k < r->ntasks; k++) {
		const cwi_task_info *ti = &r->tasks[k];
		ctask *t = task_by_id(s, ti->task_id);

		if (t != NULL) {
			/* Listed again (a worker came back): try it again. */
			if (t->gone && !t->ended && t->inflight == 0)
				t->gone = false;
			continue;
		}
		if (s->ntasks >= MAX_TASK_SLOTS ||
		    !CWI_GROW(s->tasks, s->captasks, s->ntasks + 1))
			continue;
		t = &s->tasks[s->ntasks];
		memset(t, 0, sizeof(*t));
		t->task_id = ti->task_id;
		t->address = cwi_strdup(ti->address);
		t->conn = t->address != NULL ? conn_for(s, t->address) : NULL;
		if (t->conn == NULL) {
			free(t->address);
			continue;
		}
		if (ti->direct && s->coord == NULL && !take_direct(s, t)) {
			free(t->address);
			continue;
		}
		s->ntasks++;
	}
	s->job_finished = r->job_finished;
	if (s->coord != NULL &&
	    cwi_coord_update(s->coord, r->tasks, r->ntasks, r->block_round) !=
		CACHEW_OK)
		session_fail(s, CACHEW_ENOMEM, "out of memory");
}

static void
task_drop_held(ctask *t)
{
	for (size_t i = 0; i < t->nheld; i++) {
		cwi_msg_destroy(t->held[i].msg);
		cwi_pmsg_free(&t->held[i].hdr);
	}
	t->nheld = 0;
}

static bool
add_ack(session *s, uint64_t split_id, uint64_t parts, uint64_t lease)
{
	if (!CWI_GROW(s->acks, s->capacks, s->nacks + 1))
		return false;
	/* capacks counts acks; ack_parts and ack_leases grow alongside. */
	uint64_t *p = realloc(s->ack_parts, s->capacks * sizeof(*p));
	if (p == NULL)
		return false;
	s->ack_parts = p;
	p = realloc(s->ack_leases, s->capacks * sizeof(*p));
	if (p == NULL)
		return false;
	s->ack_leases = p;
	s->acks[s->nacks] = split_id;
	s->ack_parts[s->nacks] = parts;
	s->ack_leases[s->nacks] = lease;
	s->nacks++;
	return true;
}

/* ---- sending ------------------------------------------------------------------ */

static void
send_heartbeat(session *s)
{
	cwi_pmsg m;
	cwi_msg *msg;
	uint64_t batches, wait, sum, qb, gap;

	pthread_mutex_lock(&s->lock);
	batches = s->batches;
	wait = s->wait_ns;
	sum = s->batch_ns_sum;
	s->batches = s->wait_ns = s->batch_ns_sum = 0;
	qb = s->qbytes;
	pthread_mutex_unlock(&s->lock);
	cwi_pmsg_init(&m, CWI_MSG_CLIENT_HEARTBEAT);
	m.u.client_heartbeat.job_id = s->job_id;
	m.u.client_heartbeat.client_id = s->client_id;
	m.u.client_heartbeat.batch_time_ns = batches > 0 ? sum / batches : 0;
	m.u.client_heartbeat.batches = batches;
	m.u.client_heartbeat.wait_time_ns = wait;
	m.u.client_heartbeat.buffer_fill =
	    (double)qb / (double)s->ctx->opts.client_buffer;
	if (s->coord != NULL)
		m.u.client_heartbeat.round = cwi_coord_next_round(s->coord);
	if (cwi_rpc_pack(&m, &msg) == CACHEW_OK) {
		if (cwi_conn_send(s->dispatcher, msg, (int)s->heartbeat_ms * 4,
			s->cq, TAG_HEARTBEAT) == CACHEW_OK)
			s->hb_inflight = true;
		else
			cwi_msg_destroy(msg);
	}
	cwi_pmsg_free(&m);
	gap = (uint64_t)s->heartbeat_ms;
	if (s->ntasks == 0) {
		s->early_hb_ms = s->early_hb_ms == 0 ? 1 : s->early_hb_ms * 2;
		if (s->early_hb_ms > gap)
			s->early_hb_ms = gap; /* doubling stops at the interval */
		gap = s->early_hb_ms;
	}
	s->next_hb_ns = cwi_now_ns() + gap * 1000000u;
}

static void
send_acks(session *s)
{
	cwi_pmsg m;
	cwi_msg *msg;
	cachew_err rv;

	if (s->nacks == 0 || s->ack_inflight)
		return;
	cwi_pmsg_init(&m, CWI_MSG_SPLIT_ACK);
	m.u.split_ack.job_id = s->job_id;
	m.u.split_ack.client_id = s->client_id;
	m.u.split_ack.split_ids = s->acks; /* borrowed for the encoding */
	m.u.split_ack.parts = s->ack_parts;
	m.u.split_ack.leases = s->ack_leases;
	m.u.split_ack.nsplit_ids = s->nacks;
	m.u.split_ack.nparts = s->nacks;
	m.u.split_ack.nleases = s->nacks;
	rv = cwi_rpc_pack(&m, &msg);
	m.u.split_ack.split_ids = NULL;
	m.u.split_ack.parts = NULL;
	m.u.split_ack.leases = NULL;
	cwi_pmsg_free(&m);
	if (rv != CACHEW_OK)
		return;
	if (cwi_conn_send(s->dispatcher, msg,
		(int)s->ctx->opts.service_timeout_ms, s->cq, TAG_ACK) !=
	    CACHEW_OK) {
		cwi_msg_destroy(msg);
		return;
	}
	/* Keep them until the dispatcher confirms; a failed ack is merged
	 * back and sent again (the dispatcher ignores repeats). */
	s->ack_inflight = true;
	s->sent_acks = s->acks;
	s->sent_parts = s->ack_parts;
	s->sent_leases = s->ack_leases;
	s->nsent = s->nacks;
	s->acks = NULL;
	s->ack_parts = NULL;
	s->ack_leases = NULL;
	s->nacks = s->capacks = 0;
}

static void
on_ack(session *s, cwi_completion *c)
{
	s->ack_inflight = false;
	if (c->err == CACHEW_OK && c->reply != NULL) {
		cwi_pmsg rep;
		if (cwi_rpc_unpack(c->reply, s->ctx->url, &rep) == CACHEW_OK) {
			/* A shared job's split needs every client's part; a
			 * part acked twice (an ack resent after a timeout that
			 * had been applied) could complete it before another
			 * client took its part: shared jobs read their tasks
			 * to the end as before. */
			if (rep.type == CWI_MSG_OK && rep.u.ok.job_finished &&
			    s->ctx->opts.job_name[0] == '\0')
				s->data_acked = true;
			cwi_pmsg_free(&rep);
		}
	}
	if (c->reply != NULL)
		cwi_msg_destroy(c->reply);
	if (c->err != CACHEW_OK) {
		for (size_t i = 0; i < s->nsent; i++)
			(void)add_ack(s, s->sent_acks[i], s->sent_parts[i],
			    s->sent_leases[i]);
	}
	free(s->sent_acks);
	free(s->sent_parts);
	free(s->sent_leases);
	s->sent_acks = NULL;
	s->sent_parts = NULL;
	s->sent_leases = NULL;
	s->nsent = 0;
}

/* What to ask a task's worker for: zstd when it is on and the worker is in
 * another process (inproc moves pointers: nothing to save). */
static cwi_compression
ask_compression(const session *s, const ctask *t)
{
	if (!s->zstd_on || strncmp(t->address, "inproc://", 9) == 0)
		return CWI_COMPRESSION_NONE;
	return CWI_COMPRESSION_ZSTD;
}

static cachew_err
send_get(session *s, size_t slot, const cwi_msg_get_elements *g,
    uint64_t tag)
{
	ctask *t = &s->tasks[slot];
	cwi_pmsg m;
	cwi_msg *msg;
	cachew_err rv;

	cwi_pmsg_init(&m, CWI_MSG_GET_ELEMENTS);
	m.u.get_elements = *g;
	rv = cwi_rpc_pack(&m, &msg);
	cwi_pmsg_free(&m);
	if (rv != CACHEW_OK)
		return rv;
	/* A held request waits for data as long as the pipeline needs: no
	 * deadline of its own beyond the service timeout. */
	rv = cwi_conn_send(t->conn, msg, (int)s->ctx->opts.service_timeout_ms,
	    s->cq, tag);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(msg);
		return rv;
	}
	t->inflight++;
	return CACHEW_OK;
}

/* Coordinated: the task rounds the next rounds need (client_coord.h),
 * within the client buffer: what is queued plus what is asked for, at the
 * mean size of the elements received so far. */
static void
send_coord_requests(session *s)
{
	uint64_t now = cwi_now_ns();
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer, outstanding = 0;
	cwi_coord_request cr;

	for (size_t k = 0; k < s->ntasks; k++)
		outstanding += s->tasks[k].inflight;
	for (;;) {
		uint64_t mean = s->coord_elements > 0
		    ? s->coord_bytes / s->coord_elements : 0;
		if (outstanding > 0 &&
		    queue_bytes(s) + outstanding * mean > budget)
			break;
		if (!cwi_coord_next_request(s->coord, now, &cr))
			break;
		outstanding++;
		ctask *t = task_by_id(s, cr.task_id);
		cwi_msg_get_elements g;
		size_t slot;

		if (t == NULL) {
			/* Listed, but its worker could not be dialed. */
			cwi_coord_failed(s->coord, cr.task_id, cr.task_round,
			    now + 200000000u);
			continue;
		}
		slot = (size_t)(t - s->tasks);
		cwi_pmsg_body_init(CWI_MSG_GET_ELEMENTS, &g);
		g.task_id = cr.task_id;
		g.client_id = s->client_id;
		g.consumer_index = s->ctx->opts.consumer_index;
		g.round = cr.round;
		g.task_round = cr.task_round;
		g.max_elements = 1;
		g.compression = ask_compression(s, t);
		if (send_get(s, slot, &g, TAG_DATA_BASE +
			(cr.task_round << TAG_SLOT_BITS | slot)) != CACHEW_OK)
			cwi_coord_failed(s->coord, cr.task_id, cr.task_round,
			    now + 100000000u);
	}
}

static void
send_requests(session *s)
{
	uint64_t now = cwi_now_ns();
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer;
	uint64_t reply_bytes = s->compression != CWI_COMPRESSION_NONE
	    ? REPLY_BYTES_ZSTD : REPLY_BYTES;

	if (s->coord != NULL) {
		send_coord_requests(s);
		return;
	}
	/* Breadth first, from a rotating start: every task gets one request
	 * before any gets a second, so when the budget allows fewer
	 * requests than tasks x INFLIGHT (many workers), no task starves
	 * behind the first ones in the list. */
	size_t n = s->ntasks, first = n > 0 ? s->rr_next % n : 0;
	if (n > 0)
		s->rr_next = (first + 1) % n;
	for (unsigned depth = 1; depth <= INFLIGHT; depth++) {
		for (size_t j = 0; j < n; j++) {
			size_t i = (first + j) % n;
			ctask *t = &s->tasks[i];
			uint64_t outstanding = 0;

			if (t->ended || t->gone || t->direct ||
			    now < t->retry_at_ns ||
			    t->inflight >= depth)
				continue;
			for (size_t k = 0; k < n; k++)
				outstanding += s->tasks[k].inflight;
			if (queue_bytes(s) + outstanding * reply_bytes / 2 >
				budget &&
			    outstanding > 0)
				return;
			cwi_msg_get_elements g;
			cwi_pmsg_body_init(CWI_MSG_GET_ELEMENTS, &g);
			g.task_id = t->task_id;
			g.client_id = s->client_id;
			g.max_bytes = reply_bytes;
			g.compression = ask_compression(s, t);
			if (send_get(s, i, &g, TAG_DATA_BASE + i) != CACHEW_OK)
				t->retry_at_ns = now + 100000000u;
		}
	}
}

/* ---- receiving ------------------------------------------------------------------ */

static void
release_all(cwi_element **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cwi_element_release(v[i]);
	free(v);
}

/*
 * The elements of a reply as an array of n references the caller owns
 * (release them, free the array), decompressed first when they travel
 * compressed. Records what auto compression measures. A reply that breaks
 * the protocol is CACHEW_EPROTO naming the worker.
 */
static cachew_err
reply_elements(session *s, ctask *t, cwi_msg *msg,
    const cwi_msg_get_elements_reply *r, cwi_element ***out, size_t *n)
{
	size_t count = cwi_msg_count(msg), raw = 0;
	cwi_element **v;
	cachew_err rv;

	*out = NULL;
	*n = 0;
	if (r->compression == CWI_COMPRESSION_NONE) {
		if (r->elements != count)
			return cwi_fail(CACHEW_EPROTO, "%s: a reply says %u "
			    "elements but carries %zu", t->address, r->elements,
			    count);
		v = malloc((count > 0 ? count : 1) * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		for (size_t i = 0; i < count; i++) {
			v[i] = cwi_msg_take(msg, i);
			raw += v[i] != NULL ? cwi_element_nbytes(v[i]) : 0;
		}
		*n = count;
	} else {
		/* One scalar BYTES element: the frame (service_payload.h). */
		const cwi_element *fe = count == 1 ? cwi_msg_element(msg, 0)
						   : NULL;
		const uint8_t *frame;
		size_t flen;

		if (r->compression != CWI_COMPRESSION_ZSTD || fe == NULL ||
		    fe->n != 1 || fe->comp[0].dtype != CACHEW_BYTES ||
		    fe->comp[0].rank != 0)
			return cwi_fail(CACHEW_EPROTO, "%s: a compressed reply "
			    "must carry one scalar bytes element (zstd), not "
			    "%zu elements (%s)", t->address, count,
			    cwi_compression_name(r->compression));
		if (s->dctx == NULL && (s->dctx = ZSTD_createDCtx()) == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		frame = cwi_tensor_str(&fe->comp[0], 0, &flen);
		v = malloc((r->elements > 0 ? r->elements : 1) * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		rv = cwi_payload_decompress(s->dctx, frame, flen, r->elements,
		    s->data_limit, v);
		if (rv != CACHEW_OK) {
			free(v);
			return rv == CACHEW_ENOMEM
			    ? rv
			    : cwi_fail(rv, "%s: %s", t->address, cwi_errmsg_get());
		}
		for (size_t i = 0; i < r->elements; i++)
			raw += cwi_element_nbytes(v[i]);
		*n = r->elements;
		s->auto_.zraw += raw;
		s->auto_.zwire += flen;
	}
	s->auto_.replies++;
	if (r->queued_bytes > 0)
		s->auto_.backlogged++;
	s->auto_.raw_bytes += raw;
	*out = v;
	return CACHEW_OK;
}

/* Queues the elements of one in-order reply and records its split ends
 * (takes v). */
static void
process_reply(session *s, ctask *t, cwi_element **v, size_t n,
    const cwi_msg_get_elements_reply *r)
{
	size_t e = 0;

	for (size_t k = 0; k <= r->nsplit_ends; k++) {
		size_t upto = k < r->nsplit_ends ? r->split_ends[k].after : n;
		if (upto > n || upto < e) {
			session_fail(s, CACHEW_EPROTO, "%s: a split end at "
			    "element %zu of a reply of %zu", t->address, upto, n);
			goto done;
		}
		for (; e < upto; e++) {
			cwi_element *el = v[e];
			v[e] = NULL;
			if (el != NULL && !queue_push(s, el)) {
				cwi_element_release(el);
				session_fail(s, CACHEW_ENOMEM, "out of memory");
				goto done;
			}
		}
		if (k < r->nsplit_ends &&
		    !add_ack(s, r->split_ends[k].split_id,
			r->split_ends[k].parts > 0 ? r->split_ends[k].parts : 1,
			r->split_ends[k].lease)) {
			session_fail(s, CACHEW_ENOMEM, "out of memory");
			goto done;
		}
	}
	if (n > 0) {
		pthread_mutex_lock(&s->lock);
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
	}
	if (r->end_of_task)
		t->ended = true;
done:
	release_all(v, n);
}

/* Decodes an in-order reply and queues it. */
static void
take_reply(session *s, ctask *t, cwi_msg *msg,
    const cwi_msg_get_elements_reply *r)
{
	cwi_element **v;
	size_t n;
	cachew_err rv = reply_elements(s, t, msg, r, &v, &n);

	if (rv != CACHEW_OK) {
		session_fail(s, rv, "%s", cwi_errmsg_get());
		return;
	}
	process_reply(s, t, v, n, r);
}

/* A failed data request or an error reply: true when it was handled (the
 * request is to be retried or the session failed). */
static bool
data_failed(session *s, ctask *t, cwi_completion *c, cwi_pmsg *hdr,
    uint64_t task_round)
{
	uint64_t now = cwi_now_ns();

	if (c->err != CACHEW_OK) {
		if (c->err == CACHEW_ENOENT && s->coord == NULL) {
			t->gone = true; /* the worker no longer has it */
		} else if (!t->ended) {
			/* A worker that died or stalls: its unacknowledged
			 * splits are leased again; ask again later in case
			 * it is still listed. */
			cwi_log(CACHEW_LOG_INFO, "client", "event=task_unreachable "
			    "task=%llu worker=%s error=\"%s\"",
			    (unsigned long long)t->task_id, t->address,
			    cwi_errmsg_get());
			if (s->coord != NULL) {
				cwi_coord_failed(s->coord, t->task_id,
				    task_round, now + 200000000u);
			} else {
				t->retry_at_ns = now + 200000000u;
				task_drop_held(t);
				t->gone = true;
			}
		}
		return true;
	}
	if (cwi_rpc_unpack(c->reply, t->address, hdr) == CACHEW_OK &&
	    hdr->type == CWI_MSG_GET_ELEMENTS_REPLY)
		return false;
	if (hdr->type == CWI_MSG_ERROR && hdr->u.error.code == CACHEW_ENOENT) {
		/* The worker has not started the task yet (it learns of it
		 * at its next heartbeat, or at once when in this process) or
		 * has dropped it; the job's task list tells which. Ask again
		 * soon: after 1 ms, doubling up to 20. */
		uint64_t gap;
		t->unknown_ms = t->unknown_ms == 0 ? 1
			      : t->unknown_ms < 20 ? t->unknown_ms * 2 : 20;
		gap = (uint64_t)t->unknown_ms * 1000000u;
		if (s->coord != NULL)
			cwi_coord_failed(s->coord, t->task_id, task_round,
			    now + gap);
		else
			t->retry_at_ns = now + gap;
	} else if (hdr->type == CWI_MSG_ERROR) {
		session_fail(s, (cachew_err)hdr->u.error.code > CACHEW_OK
			? (cachew_err)hdr->u.error.code : CACHEW_EOP,
		    "%s", hdr->u.error.message != NULL
			      ? hdr->u.error.message : "worker error");
	} else {
		session_fail(s, CACHEW_EPROTO, "%s: not a get_elements "
		    "reply: %s", t->address, cwi_errmsg_get());
	}
	cwi_pmsg_free(hdr);
	cwi_msg_destroy(c->reply);
	return true;
}

/* Coordinated: a reply is one task round, kept until its round comes. */
static void
on_coord_data(session *s, ctask *t, cwi_completion *c, uint64_t task_round)
{
	cwi_pmsg hdr;
	cwi_msg_get_elements_reply *r;
	cwi_element **v = NULL;
	size_t n = 0;
	cachew_err rv;

	if (data_failed(s, t, c, &hdr, task_round))
		return;
	r = &hdr.u.get_elements_reply;
	if (r->task_round != task_round || r->task_id != t->task_id) {
		session_fail(s, CACHEW_EPROTO, "%s: a reply for task %llu round "
		    "%llu answers task %llu round %llu", t->address,
		    (unsigned long long)t->task_id,
		    (unsigned long long)task_round,
		    (unsigned long long)r->task_id,
		    (unsigned long long)r->task_round);
		goto done;
	}
	rv = reply_elements(s, t, c->reply, r, &v, &n);
	if (rv != CACHEW_OK) {
		session_fail(s, rv, "%s", cwi_errmsg_get());
		goto done;
	}
	if (n > 1 || (n == 0 && !r->end_of_task)) {
		/* Not a round: nothing ready (a worker may say so), or more
		 * than one element, which no consumer can take in lock-step. */
		if (n > 1) {
			session_fail(s, CACHEW_EPROTO, "%s: %zu elements for one "
			    "coordinated round", t->address, n);
		} else {
			cwi_coord_failed(s->coord, t->task_id, task_round,
			    cwi_now_ns() + 1000000u);
		}
		release_all(v, n);
		goto done;
	}
	if (n == 1) {
		s->coord_elements++;
		s->coord_bytes += cwi_element_nbytes(v[0]);
	}
	rv = cwi_coord_received(s->coord, t->task_id, task_round,
	    n == 1 ? v[0] : NULL, r->end_of_task, r->split_ends,
	    r->nsplit_ends);
	free(v);
	r->split_ends = NULL; /* taken */
	r->nsplit_ends = 0;
	if (rv == CACHEW_EINVAL)
		session_fail(s, CACHEW_EPROTO, "%s: %s", t->address,
		    cwi_errmsg_get());
done:
	cwi_pmsg_free(&hdr);
	cwi_msg_destroy(c->reply);
}

static void
on_data(session *s, ctask *t, cwi_completion *c)
{
	cwi_pmsg hdr;

	t->inflight--;
	if (data_failed(s, t, c, &hdr, 0))
		return;
	if (hdr.u.get_elements_reply.seq != t->next_seq) {
		if (hdr.u.get_elements_reply.seq < t->next_seq ||
		    !CWI_GROW(t->held, t->capheld, t->nheld + 1)) {
			session_fail(s, CACHEW_EPROTO, "%s: reply %llu repeated",
			    t->address,
			    (unsigned long long)hdr.u.get_elements_reply.seq);
			cwi_pmsg_free(&hdr);
			cwi_msg_destroy(c->reply);
			return;
		}
		t->held[t->nheld].seq = hdr.u.get_elements_reply.seq;
		t->held[t->nheld].msg = c->reply;
		t->held[t->nheld].hdr = hdr;
		t->nheld++;
		return;
	}
	take_reply(s, t, c->reply, &hdr.u.get_elements_reply);
	cwi_pmsg_free(&hdr);
	cwi_msg_destroy(c->reply);
	t->next_seq++;
	/* Replies that were waiting for this one. */
	for (bool found = true; found;) {
		found = false;
		for (size_t i = 0; i < t->nheld; i++) {
			if (t->held[i].seq != t->next_seq)
				continue;
			held_reply h = t->held[i];
			t->held[i] = t->held[--t->nheld];
			take_reply(s, t, h.msg, &h.hdr.u.get_elements_reply);
			cwi_pmsg_free(&h.hdr);
			cwi_msg_destroy(h.msg);
			t->next_seq++;
			found = true;
			break;
		}
	}
}

/* Coordinated: moves the rounds that are ready into the queue, in round
 * order, while the buffer has room; acknowledges their splits. */
static void
deliver_rounds(session *s)
{
	uint64_t budget = (uint64_t)s->ctx->opts.client_buffer;
	bool pushed = false;

	while (!s->coord_eof && queue_bytes(s) < budget) {
		cwi_coord_round cr;
		cwi_coord_pop_result rv = cwi_coord_pop(s->coord, &cr);

		if (rv == CWI_COORD_END) {
			s->coord_eof = true;
			break;
		}
		if (rv == CWI_COORD_WAIT)
			break;
		for (size_t i = 0; i < cr.nends; i++) {
			if (!add_ack(s, cr.ends[i].split_id,
				cr.ends[i].parts > 0 ? cr.ends[i].parts : 1,
				cr.ends[i].lease))
				session_fail(s, CACHEW_ENOMEM, "out of memory");
		}
		free(cr.ends);
		if (cr.element != NULL) {
			if (!queue_push(s, cr.element)) {
				cwi_element_release(cr.element);
				session_fail(s, CACHEW_ENOMEM, "out of memory");
				break;
			}
			pushed = true;
		}
	}
	if (pushed) {
		pthread_mutex_lock(&s->lock);
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
	}
}

/*
 * Auto compression, evaluated once per AUTO_WINDOW_NS. The link is taken to
 * be the bottleneck when, over a window, the consumer waited for data at
 * least AUTO_WAIT_FRAC of the time while at least AUTO_BACKLOG_FRAC of the
 * replies left data queued at the worker (queued_bytes > 0): the workers
 * are ahead, the consumer is starved, so what limits it is moving bytes.
 * zstd then goes on, and is kept only if it pays: after two full windows
 * the rate of payload bytes delivered must have grown by AUTO_MIN_GAIN
 * (while the consumer still waits; a consumer that stopped waiting is
 * proof enough), and the data must keep compressing (frames at most
 * AUTO_BAD_RATIO of their content). A failed try waits a backoff (8
 * windows, doubling to 64 after each failed try) before zstd may go on
 * again. A try that paid is re-measured every AUTO_RECHECK_WINDOWS: zstd
 * goes off, and the rule above decides again from fresh measurements.
 * (Workers becoming the bottleneck once zstd is on is the expected
 * outcome, not a reason to stop: only the delivered rate says whether it
 * pays.)
 */
static void
auto_tick(session *s, uint64_t now)
{
	auto_state *a = &s->auto_;
	uint64_t dt, wait;
	double wait_frac, backlog_frac, rate;
	const char *off = NULL;

	if (s->compression != CWI_COMPRESSION_AUTO)
		return;
	if (a->window_start_ns == 0) {
		a->window_start_ns = now;
		a->backoff_len = AUTO_BACKOFF_MIN;
		return;
	}
	/* A window needs a few replies to say anything (at a slow link one
	 * 8 MiB reply takes a good part of it): it grows up to 8 times. */
	if (now - a->window_start_ns < AUTO_WINDOW_NS ||
	    (a->replies < AUTO_MIN_REPLIES &&
		now - a->window_start_ns < 8 * AUTO_WINDOW_NS))
		return;
	dt = now - a->window_start_ns;
	pthread_mutex_lock(&s->lock);
	wait = s->auto_wait_ns;
	s->auto_wait_ns = 0;
	pthread_mutex_unlock(&s->lock);
	/* (a wait that began in the previous window counts in this one) */
	wait_frac = (double)wait / (double)dt;
	if (wait_frac > 1)
		wait_frac = 1;
	backlog_frac = a->replies > 0
	    ? (double)a->backlogged / (double)a->replies : 0;
	rate = (double)a->raw_bytes * 1e9 / (double)dt;
	if (!s->zstd_on) {
		if (a->backoff > 0) {
			a->backoff--;
		} else if (a->replies >= AUTO_MIN_REPLIES &&
			   wait_frac >= AUTO_WAIT_FRAC &&
			   backlog_frac >= AUTO_BACKLOG_FRAC) {
			s->zstd_on = true;
			a->rate_off = rate;
			a->on_windows = 0;
			cwi_log(CACHEW_LOG_INFO, "client", "event=compression_on "
			    "job=%llu wait=%.2f backlog=%.2f bytes_per_s=%.0f",
			    (unsigned long long)s->job_id, wait_frac,
			    backlog_frac, rate);
		}
	} else {
		a->on_windows++;
		if (a->zraw > 0 &&
		    (double)a->zwire > AUTO_BAD_RATIO * (double)a->zraw)
			off = "incompressible";
		else if (a->on_windows == 2 && wait_frac >= AUTO_WAIT_FRAC &&
			 rate < AUTO_MIN_GAIN * a->rate_off)
			off = "no_gain";
		else if (a->on_windows >= AUTO_RECHECK_WINDOWS)
			off = "recheck";
		else if (a->on_windows == 2)
			a->backoff_len = AUTO_BACKOFF_MIN; /* it paid */
		if (off != NULL && strcmp(off, "recheck") == 0) {
			/* Not a failure: measure without it again (the
			 * link or the data may have changed). */
			s->zstd_on = false;
			a->backoff = 0;
		} else if (off != NULL) {
			s->zstd_on = false;
			a->backoff = a->backoff_len;
			if (a->backoff_len < AUTO_BACKOFF_MAX)
				a->backoff_len *= 2;
			cwi_log(CACHEW_LOG_INFO, "client", "event=compression_off "
			    "job=%llu reason=%s wait=%.2f backlog=%.2f "
			    "bytes_per_s=%.0f before=%.0f ratio=%.2f",
			    (unsigned long long)s->job_id, off, wait_frac,
			    backlog_frac, rate, a->rate_off,
			    a->zraw > 0 ? (double)a->zwire / (double)a->zraw : 0);
		}
	}
	a->window_start_ns = now;
	a->replies = a->backlogged = a->raw_bytes = a->zraw = a->zwire = 0;
}

/* Remote workers: the job's operator counters, as the dispatcher last
 * heard them ("<node>:<name>[/<detail>]"), become the worker part's rows
 * (a direct task's are asked of it, rows_refresh). */
static void
rows_from_reply(session *s, const cwi_msg_client_heartbeat_reply *r)
{
	client_ctx *ctx = s->ctx;
	size_t n = r->nops < 64 ? r->nops : 64;

	if (n == 0)
		return;
	pthread_mutex_lock(&ctx->rows_lock);
	if (ctx->cur == s && !ctx->inline_seen) {
		for (size_t i = 0; i < n; i++) {
			const cwi_op_counters *c = &r->ops[i];
			op_row *w = &ctx->rows[i];
			const char *colon = strchr(c->name, ':');
			const char *name = colon != NULL ? colon + 1 : c->name;
			const char *slash = strchr(name, '/');
			int len = slash != NULL ? (int)(slash - name)
						: (int)strlen(name);

			memset(w, 0, sizeof(*w));
			snprintf(w->name, sizeof(w->name), "%.*s", len, name);
			snprintf(w->detail, sizeof(w->detail), "%s",
			    slash != NULL ? slash + 1 : "");
			w->s.node = (int)i;
			w->s.elements = c->elements;
			w->s.bytes = c->bytes;
			w->s.busy_ns = c->busy_ns;
			w->s.wait_ns = c->wait_ns;
			w->s.parallelism = 1;
			w->s.buffered = (int64_t)c->buffered;
		}
		ctx->nrows = n;
	}
	pthread_mutex_unlock(&ctx->rows_lock);
}

static void
on_heartbeat(session *s, cwi_completion *c)
{
	cwi_pmsg rep;
	uint64_t now = cwi_now_ns();

	s->hb_inflight = false;
	if (c->err == CACHEW_OK &&
	    cwi_rpc_unpack(c->reply, s->ctx->url, &rep) == CACHEW_OK) {
		if (rep.type == CWI_MSG_CLIENT_HEARTBEAT_REPLY) {
			update_tasks(s, &rep.u.client_heartbeat_reply);
			rows_from_reply(s, &rep.u.client_heartbeat_reply);
			s->last_hb_ok_ns = now;
		} else if (rep.type == CWI_MSG_ERROR) {
			session_fail(s, CACHEW_EIO, "dispatcher %s: %s",
			    s->ctx->url, rep.u.error.message != NULL
					     ? rep.u.error.message : "error");
		}
		cwi_pmsg_free(&rep);
	}
	if (c->reply != NULL)
		cwi_msg_destroy(c->reply);
	if (now - s->last_hb_ok_ns >
	    (uint64_t)s->ctx->opts.service_timeout_ms * 1000000u)
		session_fail(s, CACHEW_ETIMEDOUT, "dispatcher %s did not answer "
		    "for %lld ms", s->ctx->url,
		    (long long)s->ctx->opts.service_timeout_ms);
}

static bool
all_tasks_done(const session *s)
{
	if (s->coord != NULL)
		return s->coord_eof;
	for (size_t i = 0; i < s->ntasks; i++)
		if (!s->tasks[i].ended && !s->tasks[i].gone)
			return false;
	return true;
}

/* The epoch is over for this client: uncoordinated, an ack's reply said
 * every split is acknowledged, or the dispatcher says the job finished and
 * every task was read to its end; coordinated, no
 * task can serve a round any more (a job whose last rounds were dropped
 * may never see every split acknowledged). Every ack went out first. */
static bool
session_done(const session *s)
{
	if (s->nacks > 0 || s->ack_inflight)
		return false;
	if (s->coord != NULL)
		return s->coord_eof;
	return s->data_acked || (s->job_finished && all_tasks_done(s));
}

static void
on_completion(session *s, cwi_completion *c)
{
	uint64_t x, slot;

	if (c->tag == TAG_HEARTBEAT) {
		on_heartbeat(s, c);
		return;
	}
	if (c->tag == TAG_ACK) {
		on_ack(s, c);
		return;
	}
	if (c->tag == TAG_RELEASE) {
		s->release_done = true;
		if (c->reply != NULL)
			cwi_msg_destroy(c->reply);
		return;
	}
	x = c->tag - TAG_DATA_BASE;
	slot = x & (MAX_TASK_SLOTS - 1);
	if (c->tag < TAG_DATA_BASE || slot >= s->ntasks) {
		if (c->reply != NULL)
			cwi_msg_destroy(c->reply);
		return;
	}
	if (s->coord != NULL) {
		s->tasks[slot].inflight--;
		on_coord_data(s, &s->tasks[slot], c, x >> TAG_SLOT_BITS);
	} else {
		on_data(s, &s->tasks[slot], c);
	}
}

/* How long the fetch thread may wait for a completion: until the next
 * heartbeat or the next retry of a task, at most 50 ms. */
static int
fetch_wait_ms(const session *s, uint64_t now)
{
	uint64_t until = now + 50 * UINT64_C(1000000);

	if (!s->hb_inflight && s->next_hb_ns < until)
		until = s->next_hb_ns;
	for (size_t i = 0; i < s->ntasks; i++) {
		const ctask *t = &s->tasks[i];
		if (!t->ended && t->retry_at_ns > now && t->retry_at_ns < until)
			until = t->retry_at_ns;
	}
	return until > now ? (int)((until - now + 999999u) / 1000000u) : 0;
}

static void *
fetch_main(void *arg)
{
	session *s = arg;

	s->last_hb_ok_ns = cwi_now_ns();
	send_heartbeat(s);
	while (!atomic_load(&s->closing)) {
		cwi_completion c;
		uint64_t now = cwi_now_ns();
		bool soon;
		int wait_ms;

		pthread_mutex_lock(&s->lock);
		bool stop = s->err != CACHEW_OK || s->eof;
		pthread_mutex_unlock(&s->lock);
		if (stop)
			break;
		if (s->coord != NULL)
			deliver_rounds(s);
		if (session_done(s)) {
			pthread_mutex_lock(&s->lock);
			s->eof = true;
			pthread_cond_broadcast(&s->cond);
			pthread_mutex_unlock(&s->lock);
			break;
		}
		/* Near the end (every task ended, every ack confirmed), ask
		 * every 20 ms whether the job finished; coordinated, the same
		 * while a schedule change holds the rounds back. */
		soon = (s->ntasks > 0 && all_tasks_done(s) &&
			   s->nacks == 0 && !s->ack_inflight) ||
		       (s->coord != NULL && cwi_coord_blocked(s->coord));
		if (!s->hb_inflight &&
		    (now >= s->next_hb_ns ||
			(soon && now + (uint64_t)s->heartbeat_ms * 1000000u >=
				     s->next_hb_ns + 20000000u)))
			send_heartbeat(s);
		send_acks(s);
		send_requests(s);
		auto_tick(s, now);
		wait_ms = fetch_wait_ms(s, now);
		if (cwi_cq_wait(s->cq, wait_ms, &c) != CACHEW_OK)
			continue;
		on_completion(s, &c);
		/* Take whatever else completed before going round again. */
		while (cwi_cq_wait(s->cq, 0, &c) == CACHEW_OK)
			on_completion(s, &c);
	}
	return NULL;
}

/* ---- session lifecycle ----------------------------------------------------------- */

static cachew_err
join_job(session *s)
{
	client_ctx *ctx = s->ctx;
	int64_t total = ctx->opts.service_timeout_ms;
	cwi_pmsg req, rep;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_DATASET_REGISTER);
	req.u.dataset_register.fingerprint = ctx->plan->worker_fp;
	req.u.dataset_register.graph = ctx->graph;
	req.u.dataset_register.graph_len = ctx->graph_len;
	req.u.dataset_register.split_units = (int64_t)ctx->plan->units;
	rv = cwi_rpc_call_retry(s->dispatcher, &req,
	    CWI_MSG_DATASET_REGISTER_REPLY, total, &s->closing, &rep);
	req.u.dataset_register.graph = NULL; /* borrowed */
	cwi_pmsg_free(&req);
	if (rv != CACHEW_OK)
		return rv;
	s->dataset_id = rep.u.dataset_register_reply.dataset_id;
	cwi_pmsg_free(&rep);

	cwi_pmsg_init(&req, CWI_MSG_JOB_GET_OR_CREATE);
	cwi_msg_job_get_or_create *j = &req.u.job_get_or_create;
	j->dataset_id = s->dataset_id;
	j->job_name = ctx->opts.job_name[0] != '\0'
			  ? cwi_strdup(ctx->opts.job_name) : NULL;
	j->iteration = s->epoch;
	(void)cwi_processing_mode_parse(ctx->opts.processing_mode,
	    &j->processing_mode);
	j->num_consumers = (uint32_t)ctx->opts.num_consumers;
	j->consumer_index = ctx->opts.num_consumers > 0
				? ctx->opts.consumer_index : -1;
	j->worker_policy = ctx->opts.workers > 0 ? CWI_WORKERS_FIXED
						 : CWI_WORKERS_ALL;
	j->num_workers = (uint32_t)ctx->opts.workers;
	(void)cwi_compression_parse(ctx->opts.compression, &j->compression);
	j->seed = ctx->seed;
	if (ctx->opts.scale_policy[0] != '\0')
		j->scale_policy = cwi_strdup(ctx->opts.scale_policy);
	j->weight = (double)ctx->opts.job_weight;
	j->min_workers = (uint32_t)ctx->opts.min_workers;
	j->max_workers = (uint32_t)ctx->opts.max_workers;
	rv = cwi_rpc_call_retry(s->dispatcher, &req,
	    CWI_MSG_JOB_GET_OR_CREATE_REPLY, total, &s->closing, &rep);
	cwi_pmsg_free(&req);
	if (rv != CACHEW_OK)
		return rv;
	s->job_id = rep.u.job_get_or_create_reply.job_id;
	s->client_id = rep.u.job_get_or_create_reply.client_id;
	/* A named job's settings are its first client's. */
	s->compression = rep.u.job_get_or_create_reply.compression;
	s->zstd_on = s->compression == CWI_COMPRESSION_ZSTD;
	if (rep.u.job_get_or_create_reply.num_consumers > 0)
		rv = cwi_coord_create(&s->coord, COORD_WINDOW, COORD_PER_TASK);
	s->heartbeat_ms = rep.u.job_get_or_create_reply.heartbeat_interval_ms;
	if (s->heartbeat_ms == 0 || s->heartbeat_ms > 10000)
		s->heartbeat_ms = 500;
	cwi_pmsg_free(&rep);
	if (rv != CACHEW_OK)
		return rv;
	cwi_log(CACHEW_LOG_INFO, "client", "event=joined job=%llu client=%llu "
	    "dispatcher=%s consumer=%lld compression=%s",
	    (unsigned long long)s->job_id, (unsigned long long)s->client_id,
	    ctx->url, s->coord != NULL ? (long long)ctx->opts.consumer_index
				       : -1LL,
	    cwi_compression_name(s->compression));
	return CACHEW_OK;
}

/* At the end of the epoch, the requests still in flight (coordinated:
 * rounds asked for beyond a task's end) are answered at once: wait for
 * them (2 s at most) rather than cancel them. nng 1.5's nng_close() was
 * seen to hang on a req socket whose contexts had requests canceled, with
 * many in flight. */
static void
drain_requests(session *s)
{
	uint64_t deadline = cwi_now_ns() + 2000 * UINT64_C(1000000);
	bool eof;

	pthread_mutex_lock(&s->lock);
	eof = s->eof;
	pthread_mutex_unlock(&s->lock);
	while (eof && s->cq != NULL && cwi_cq_outstanding(s->cq) > 0) {
		cwi_completion c;
		uint64_t now = cwi_now_ns();
		if (now >= deadline ||
		    cwi_cq_wait(s->cq, (int)((deadline - now) / 1000000u) + 1,
			&c) != CACHEW_OK)
			break;
		if (c.reply != NULL)
			cwi_msg_destroy(c.reply);
	}
}

/* Copies a task_stats reply's rows into the context (rows_lock held). */
static void
rows_take(client_ctx *ctx, const cwi_msg_task_stats_reply *r)
{
	size_t n = r->nops < 64 ? r->nops : 64;

	for (size_t i = 0; i < n; i++) {
		const cwi_op_counters *c = &r->ops[i];
		op_row *w = &ctx->rows[i];

		memset(w, 0, sizeof(*w));
		snprintf(w->name, sizeof(w->name), "%s", c->name);
		snprintf(w->detail, sizeof(w->detail), "%s",
		    c->detail != NULL ? c->detail : "");
		w->s.node = (int)c->node;
		w->s.elements = c->elements;
		w->s.bytes = c->bytes;
		w->s.busy_ns = c->busy_ns;
		w->s.wait_ns = c->wait_ns;
		w->s.parallelism = (int)c->parallelism;
		w->s.buffer_limit = c->buffer_limit;
		w->s.buffered = (int64_t)c->buffered;
	}
	ctx->nrows = n;
}

/* Asks the direct task for its operator rows, live, and copies them into
 * the context. Called with ctx->rows_lock held. A task whose pipeline is
 * running a call at this moment says busy: the last rows stay. */
static void
rows_refresh(client_ctx *ctx, session *s)
{
	direct_task t;
	cwi_pmsg req, rep;

	pthread_mutex_lock(&s->lock);
	t = s->inl;
	pthread_mutex_unlock(&s->lock);
	if (t.conn == NULL)
		return;
	ctx->inline_seen = true;
	cwi_pmsg_init(&req, CWI_MSG_TASK_STATS);
	req.u.task_stats.task_id = t.id;
	if (cwi_rpc_call(t.conn, &req, CWI_MSG_TASK_STATS_REPLY,
		(int)ctx->opts.service_timeout_ms, &rep) != CACHEW_OK)
		return; /* the task is gone: the last rows stay */
	if (!rep.u.task_stats_reply.busy)
		rows_take(ctx, &rep.u.task_stats_reply);
	cwi_pmsg_free(&rep);
}

/* A session ended: its counters join those of the earlier epochs (the
 * plain executor's counters run over all of an iterator's epochs). */
static void
rows_retire(client_ctx *ctx)
{
	for (size_t i = 0; i < ctx->nrows; i++) {
		cachew_op_stats *d = &ctx->done[i];
		const cachew_op_stats *r = &ctx->rows[i].s;
		if (i >= ctx->ndone)
			memset(d, 0, sizeof(*d));
		d->node = r->node;
		d->elements += r->elements;
		d->bytes += r->bytes;
		d->busy_ns += r->busy_ns;
		d->wait_ns += r->wait_ns;
		d->parallelism = r->parallelism;
		d->buffer_limit = r->buffer_limit;
		d->buffered = 0;
	}
	if (ctx->nrows > ctx->ndone)
		ctx->ndone = ctx->nrows;
	/* The names stay in rows[]; their counters now live in done[]. */
	for (size_t i = 0; i < ctx->nrows; i++) {
		cachew_op_stats keep = ctx->rows[i].s;
		memset(&ctx->rows[i].s, 0, sizeof(ctx->rows[i].s));
		ctx->rows[i].s.node = keep.node;
		ctx->rows[i].s.parallelism = keep.parallelism;
		ctx->rows[i].s.buffer_limit = keep.buffer_limit;
	}
}

static size_t
ctx_part_stats(void *arg, cachew_op_stats *out, size_t cap, size_t *hide)
{
	client_ctx *ctx = arg;
	size_t n;

	pthread_mutex_lock(&ctx->rows_lock);
	if (ctx->cur != NULL)
		rows_refresh(ctx, ctx->cur);
	/* Inline, the stream is no hand-off: its row would only repeat the
	 * worker part's last one. */
	*hide = ctx->inline_seen ? 1 : 0;
	n = ctx->nrows;
	for (size_t i = 0; i < n && i < cap; i++) {
		out[i] = ctx->rows[i].s;
		out[i].name = ctx->rows[i].name;
		out[i].detail = ctx->rows[i].detail;
		if (i < ctx->ndone) {
			out[i].elements += ctx->done[i].elements;
			out[i].bytes += ctx->done[i].bytes;
			out[i].busy_ns += ctx->done[i].busy_ns;
			out[i].wait_ns += ctx->done[i].wait_ns;
		}
	}
	pthread_mutex_unlock(&ctx->rows_lock);
	return n;
}

static void
session_free(session *s)
{
	if (s == NULL)
		return;
	/* The epoch's last rows stay with the iterator. */
	pthread_mutex_lock(&s->ctx->rows_lock);
	if (s->ctx->cur == s) {
		rows_refresh(s->ctx, s);
		rows_retire(s->ctx);
		s->ctx->cur = NULL;
	}
	pthread_mutex_unlock(&s->ctx->rows_lock);
	atomic_store(&s->closing, true);
	if (s->job_id != 0 && s->dispatcher != NULL) {
		/* Released through the fetch thread's queue: its reply
		 * also ends the fetch thread's wait at once (it would
		 * otherwise sleep out its timeout before noticing
		 * `closing`, up to 50 ms per iterator). Without a fetch
		 * thread, a plain call. */
		cwi_pmsg req, rep;
		cwi_msg *msg;
		cwi_pmsg_init(&req, CWI_MSG_JOB_RELEASE);
		req.u.job_release.job_id = s->job_id;
		req.u.job_release.client_id = s->client_id;
		if (!s->fetcher_started) {
			if (cwi_rpc_call(s->dispatcher, &req, CWI_MSG_OK, 2000,
				&rep) == CACHEW_OK)
				cwi_pmsg_free(&rep);
		} else if (cwi_rpc_pack(&req, &msg) == CACHEW_OK) {
			if (cwi_conn_send(s->dispatcher, msg, 2000, s->cq,
				TAG_RELEASE) == CACHEW_OK)
				s->release_sent = true;
			else
				cwi_msg_destroy(msg);
		}
		cwi_pmsg_free(&req);
	}
	if (s->fetcher_started)
		pthread_join(s->fetcher, NULL);
	/* The release must reach the dispatcher before the connection
	 * closes (closing cancels what is still queued): wait for its
	 * reply (2 s at most) if the fetch thread did not take it. */
	if (s->release_sent) {
		uint64_t deadline = cwi_now_ns() + 2000 * UINT64_C(1000000);
		while (!s->release_done) {
			cwi_completion c;
			uint64_t now = cwi_now_ns();
			if (now >= deadline ||
			    cwi_cq_wait(s->cq, (int)((deadline - now) / 1000000u) +
				    1, &c) != CACHEW_OK)
				break;
			on_completion(s, &c);
		}
	}
	drain_requests(s);
	for (size_t i = 0; i < s->nconns; i++)
		cwi_conn_close(s->conns[i].conn);
	if (s->dispatcher != NULL)
		cwi_conn_close(s->dispatcher);
	if (s->cq != NULL)
		cwi_cq_close(s->cq);
	for (size_t i = 0; i < s->ntasks; i++) {
		task_drop_held(&s->tasks[i]);
		free(s->tasks[i].held);
		free(s->tasks[i].address);
	}
	free(s->tasks);
	for (size_t i = 0; i < s->nconns; i++) {
		cwi_conn_destroy(s->conns[i].conn);
		free(s->conns[i].address);
	}
	free(s->conns);
	cwi_conn_destroy(s->dispatcher);
	cwi_cq_destroy(s->cq);
	for (size_t i = 0; i < s->qlen; i++)
		cwi_element_release(s->q[(s->qhead + i) % s->qcap]);
	free(s->q);
	free(s->acks);
	free(s->ack_parts);
	free(s->ack_leases);
	free(s->sent_acks);
	free(s->sent_parts);
	free(s->sent_leases);
	cwi_coord_destroy(s->coord);
	cwi_cq_destroy(s->inl_cq);
	ZSTD_freeDCtx(s->dctx);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

static cachew_err
stream_open(void *arg, uint64_t epoch, void **out, char *err, size_t errlen)
{
	client_ctx *ctx = arg;
	session *s = calloc(1, sizeof(*s));
	cwi_transport_opts o;
	cachew_err rv;

	*out = NULL;
	if (s == NULL) {
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	s->ctx = ctx;
	/* `epoch` already counts the epoch option (the client part's
	 * iterator runs with it) plus the repetitions before this one. */
	s->epoch = epoch;
	atomic_init(&s->closing, false);
	pthread_mutex_init(&s->lock, NULL);
	cwi_cond_init_monotonic(&s->cond);
	cwi_transport_opts_init(&o);
	o.max_msg_size = CWI_TRANSPORT_MAX_MSG_DEFAULT;
	o.dial_async = true;
	rv = cwi_dial(&s->dispatcher, ctx->url, &o);
	if (rv == CACHEW_OK)
		rv = cwi_cq_create(&s->cq);
	if (rv == CACHEW_OK)
		rv = cwi_cq_create(&s->inl_cq);
	if (rv == CACHEW_OK)
		rv = join_job(s);
	if (rv == CACHEW_OK) {
		if (pthread_create(&s->fetcher, NULL, fetch_main, s) != 0)
			rv = cwi_fail(CACHEW_ENOMEM, "cannot start a thread");
		else
			s->fetcher_started = true;
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "service %s: %s", ctx->url,
		    cwi_errmsg_get());
		session_free(s);
		return rv;
	}
	pthread_mutex_lock(&ctx->rows_lock);
	ctx->cur = s;
	pthread_mutex_unlock(&ctx->rows_lock);
	*out = s;
	return CACHEW_OK;
}

/* Acknowledges the splits of a direct task's lease that ended (the
 * consumer holds their elements), from the consumer's thread. */
static void
ack_direct(session *s, const cwi_split_end *ends, size_t n)
{
	cwi_pmsg req, rep;
	uint64_t *ids = malloc(n * sizeof(*ids));

	if (ids == NULL) {
		session_fail(s, CACHEW_ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < n; i++)
		ids[i] = ends[i].split_id;
	cwi_pmsg_init(&req, CWI_MSG_SPLIT_ACK);
	req.u.split_ack.job_id = s->job_id;
	req.u.split_ack.client_id = s->client_id;
	req.u.split_ack.split_ids = ids;
	req.u.split_ack.nsplit_ids = n;
	if (cwi_rpc_call_retry(s->dispatcher, &req, CWI_MSG_OK,
		s->ctx->opts.service_timeout_ms, &s->closing, &rep) !=
	    CACHEW_OK) {
		session_fail(s, CACHEW_EIO, "dispatcher %s: acknowledging %zu "
		    "splits: %s", s->ctx->url, n, cwi_errmsg_get());
		cwi_pmsg_free(&req);
		return;
	}
	cwi_pmsg_free(&req);
	if (rep.u.ok.job_finished) {
		pthread_mutex_lock(&s->lock);
		s->inl_done = true;
		s->eof = true; /* every element reached a client */
		pthread_mutex_unlock(&s->lock);
	}
	cwi_pmsg_free(&rep);
}

/* A call found the direct task stopped (the job ended, or the worker was
 * dropped and a new task comes: stream_next waits). s->lock held. */
static void
direct_stopped(session *s, const char *why)
{
	if (s->inl_stopped_ns == 0) {
		s->inl_stopped_ns = cwi_now_ns();
		snprintf(s->inl_errmsg, sizeof(s->inl_errmsg), "%s", why);
	}
}

/* Its worker does not know the task yet (it starts it at its next
 * heartbeat; a job just created has its tasks started before its client
 * reads the reply, a second client's or a replacement's may not): wait a
 * little, doubling, and call again; past service_timeout_ms it fails.
 * s->lock held. */
static void
direct_unknown(session *s, const char *why)
{
	uint64_t now = cwi_now_ns(),
		 limit = (uint64_t)s->ctx->opts.service_timeout_ms * 1000000u;

	if (s->inl_unknown_ns == 0) {
		s->inl_unknown_ns = now;
		s->inl_unknown_ms = 1;
	}
	if (now - s->inl_unknown_ns >= limit) {
		s->err = CACHEW_ENOENT;
		snprintf(s->errmsg, sizeof(s->errmsg), "%s, for %lld ms", why,
		    (long long)s->ctx->opts.service_timeout_ms);
		pthread_cond_broadcast(&s->cond);
		return;
	}
	(void)cwi_cond_wait_ns(&s->cond, &s->lock,
	    (uint64_t)s->inl_unknown_ms * 1000000u);
	if (s->inl_unknown_ms < 64)
		s->inl_unknown_ms *= 2;
}

/* Sends one get_elements to the direct task and waits for its reply: over
 * inproc the worker runs the task's pipeline on this thread, and the reply
 * is there when the send returns. The request carries the client's
 * executor settings and this epoch, so that the lease pipeline runs as
 * the plain executor would run it here. */
static cachew_err
direct_call(session *s, direct_task t, size_t max, cwi_completion *c)
{
	const cwi_opts *o = &s->ctx->opts;
	cwi_pmsg req;
	cwi_msg *msg;
	cachew_err rv;

	cwi_pmsg_init(&req, CWI_MSG_GET_ELEMENTS);
	req.u.get_elements.task_id = t.id;
	req.u.get_elements.client_id = s->client_id;
	req.u.get_elements.max_elements =
	    max < UINT32_MAX ? (uint32_t)max : UINT32_MAX;
	req.u.get_elements.exec = true;
	req.u.get_elements.epoch = s->epoch;
	req.u.get_elements.threads = o->threads;
	req.u.get_elements.ram_budget = o->ram_budget;
	req.u.get_elements.deterministic = o->deterministic != 0;
	req.u.get_elements.autotune = o->autotune != 0;
	rv = cwi_rpc_pack(&req, &msg);
	cwi_pmsg_free(&req);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_conn_send(t.conn, msg, (int)o->service_timeout_ms,
	    s->inl_cq, 0);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(msg);
		return rv;
	}
	return cwi_cq_wait(s->inl_cq, -1, c);
}

/* An error reply to a direct call: the pipeline's failure reads as the
 * plain executor's; a stopped task waits for its replacement; an unknown
 * one for its worker to start it. s->lock not held. */
static void
direct_error(session *s, const cwi_msg_error *e)
{
	cachew_err code = (cachew_err)e->code;

	if (e->pipeline) {
		session_fail(s, code, "%s", e->message);
		return;
	}
	if (code != CACHEW_ECLOSED && code != CACHEW_ENOENT) {
		session_fail(s, code, "worker: %s", e->message);
		return;
	}
	pthread_mutex_lock(&s->lock);
	if (code == CACHEW_ECLOSED)
		direct_stopped(s, e->message);
	else
		direct_unknown(s, e->message);
	pthread_mutex_unlock(&s->lock);
}

/* Takes a direct reply's elements into out and acts on the rest of it;
 * returns how many elements came. s->lock not held. */
static size_t
direct_take(session *s, cwi_msg *msg, cwi_chunk *out, size_t max)
{
	cwi_pmsg rep;
	cwi_msg_get_elements_reply *g;
	size_t n;

	if (cwi_rpc_unpack(msg, s->ctx->url, &rep) != CACHEW_OK) {
		session_fail(s, CACHEW_EPROTO, "%s", cwi_errmsg_get());
		return 0;
	}
	if (rep.type == CWI_MSG_ERROR) {
		direct_error(s, &rep.u.error);
		cwi_pmsg_free(&rep);
		return 0;
	}
	if (rep.type != CWI_MSG_GET_ELEMENTS_REPLY) {
		session_fail(s, CACHEW_EPROTO, "worker: a %s reply to "
		    "get_elements", cwi_msg_type_name(rep.type));
		cwi_pmsg_free(&rep);
		return 0;
	}
	g = &rep.u.get_elements_reply;
	n = cwi_msg_count(msg);
	if (n > max)
		n = max; /* never: the worker sends at most max */
	for (size_t i = 0; i < n; i++)
		cwi_chunk_push(out, cwi_msg_take(msg, i));
	if (g->nsplit_ends > 0)
		ack_direct(s, g->split_ends, g->nsplit_ends);
	pthread_mutex_lock(&s->lock);
	s->inl_unknown_ns = 0;
	if (g->end_of_task) {
		/* end_of_splits: the dispatcher has every split acked. */
		s->inl_done = true;
		s->eof = true;
	}
	if (s->eof || s->err != CACHEW_OK)
		pthread_cond_broadcast(&s->cond);
	if (n == 0 && g->retry_ms > 0 && !s->eof && s->err == CACHEW_OK)
		/* Every split is leased (to another reader or worker): ask
		 * again after the dispatcher's retry interval. */
		(void)cwi_cond_wait_ns(&s->cond, &s->lock,
		    (uint64_t)g->retry_ms * 1000000u);
	pthread_mutex_unlock(&s->lock);
	cwi_pmsg_free(&rep);
	return n;
}

/*
 * Reads up to max elements of the direct task into out, on this thread.
 * Called and returns with s->lock held (released while calling). Returns
 * how many elements came; 0 means look at the session again (it may have
 * ended, failed, or be waiting for splits leased elsewhere).
 */
static size_t
pull_direct(session *s, cwi_chunk *out, size_t max)
{
	/* s->inl is set by the fetch thread once, then changed (swapped)
	 * only on this, the consumer's, thread. */
	direct_task t = s->inl;
	cwi_completion c;
	size_t got = 0;
	cachew_err rv;

	pthread_mutex_unlock(&s->lock);
	rv = direct_call(s, t, max, &c);
	if (rv == CACHEW_OK && c.err == CACHEW_OK) {
		got = direct_take(s, c.reply, out, max);
		cwi_msg_destroy(c.reply);
	} else {
		if (rv == CACHEW_OK)
			rv = c.err;
		if (rv == CACHEW_ECLOSED && !atomic_load(&s->closing)) {
			/* Its worker's listener closed: it was stopped. */
			pthread_mutex_lock(&s->lock);
			direct_stopped(s, cwi_errmsg_get());
			pthread_mutex_unlock(&s->lock);
		} else {
			session_fail(s, rv, "worker %s: %s",
			    cwi_conn_url(t.conn), cwi_errmsg_get());
		}
	}
	pthread_mutex_lock(&s->lock);
	return got;
}

/* Moves the consumer to the direct task that replaced a dropped one
 * (s->lock held; on the consumer's thread, between calls). */
static void
inline_swap(session *s)
{
	s->inl = s->inl_next;
	memset(&s->inl_next, 0, sizeof(s->inl_next));
	s->inl_done = false;
	s->inl_stopped_ns = 0;
	s->inl_unknown_ns = 0;
	cwi_log(CACHEW_LOG_WARN, "client", "event=inline_task_replaced "
	    "job=%llu", (unsigned long long)s->job_id);
}

/* The inline task was stopped: waits for its replacement or the job's
 * end, at most service_timeout_ms from the stop, then fails with the
 * stop's message (s->lock held). */
static void
inline_wait_replacement(session *s)
{
	uint64_t limit = (uint64_t)s->ctx->opts.service_timeout_ms * 1000000u,
		 waited = cwi_now_ns() - s->inl_stopped_ns;

	if (waited >= limit) {
		s->err = CACHEW_ECLOSED;
		snprintf(s->errmsg, sizeof(s->errmsg), "%s, and no task "
		    "replaced it within %lld ms", s->inl_errmsg,
		    (long long)s->ctx->opts.service_timeout_ms);
		pthread_cond_broadcast(&s->cond);
		return;
	}
	(void)cwi_cond_wait_ns(&s->cond, &s->lock, limit - waited);
}

static cachew_err
stream_next(void *arg, cwi_chunk *out, size_t max, char *err, size_t errlen)
{
	session *s = arg;
	uint64_t t0 = cwi_now_ns();
	cachew_err rv = CACHEW_OK;
	size_t n = 0;

	pthread_mutex_lock(&s->lock);
	while (s->qlen == 0 && !s->eof && s->err == CACHEW_OK) {
		if (s->inl_next.conn != NULL) {
			inline_swap(s);
			continue;
		}
		if (s->inl_stopped_ns != 0) {
			inline_wait_replacement(s);
			continue;
		}
		if (s->inl.conn != NULL && !s->inl_done) {
			/* The direct task runs here, on this thread. */
			size_t got = pull_direct(s, out, max);
			if (got > 0) {
				n = got;
				goto taken;
			}
			continue;
		}
		pthread_cond_wait(&s->cond, &s->lock);
	}
	if (s->qlen > 0) {
		n = s->qlen < max ? s->qlen : max;
		for (size_t i = 0; i < n; i++) {
			cwi_element *e = s->q[s->qhead];
			s->qhead = (s->qhead + 1) % s->qcap;
			s->qlen--;
			s->qbytes -= cwi_element_nbytes(e);
			cwi_chunk_push(out, e);
		}
	} else if (s->err != CACHEW_OK) {
		rv = s->err;
		snprintf(err, errlen, "%s", s->errmsg);
	} else {
		rv = CACHEW_EOF;
	}
taken:;
	uint64_t now = cwi_now_ns();
	s->wait_ns += now - t0;
	s->auto_wait_ns += now - t0;
	/* The consumer took the elements of the previous chunk (the
	 * trainer's batches, when the pipeline ends with batch()) in the
	 * time since that chunk was handed over. */
	if (s->last_next_ns != 0) {
		s->batch_ns_sum += now - s->last_next_ns;
		s->batches += s->last_chunk_n;
	}
	s->last_next_ns = now;
	s->last_chunk_n = n;
	pthread_mutex_unlock(&s->lock);
	return rv;
}

static void
stream_close(void *arg)
{
	session_free(arg);
}

static const cwi_stream_ops stream_ops = {
    .open = stream_open,
    .next = stream_next,
    .close = stream_close,
};

/* ---- the iterator ---------------------------------------------------------------- */

static void
ctx_free(void *arg)
{
	client_ctx *ctx = arg;

	if (ctx == NULL)
		return;
	cachew_dataset_release(ctx->client_graph);
	cwi_split_plan_destroy(ctx->plan);
	cachew_free(ctx->graph);
	pthread_mutex_destroy(&ctx->rows_lock);
	free(ctx);
}

cachew_err
cwi_client_iterator_create(cachew_iterator **out, cachew_dataset *ds,
    const cachew_options *opts, const char *url)
{
	client_ctx *ctx = calloc(1, sizeof(*ctx));
	cachew_err rv;

	*out = NULL;
	if (ctx == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&ctx->rows_lock, NULL);
	if (opts != NULL)
		ctx->opts = *cwi_options_values(opts);
	else
		cwi_opts_defaults(&ctx->opts);
	snprintf(ctx->url, sizeof(ctx->url), "%s", url);
	ctx->seed = ctx->opts.seed >= 0 ? (uint64_t)ctx->opts.seed
					: cwi_fresh_seed();
	rv = cwi_split_plan_create(&ctx->plan, ds);
	if (rv != CACHEW_OK) {
		rv = cwi_fail(rv, "service %s: %s", url, cwi_errmsg_get());
		goto fail;
	}
	rv = cachew_dataset_to_msgpack(ctx->plan->worker,
	    (void **)&ctx->graph, &ctx->graph_len);
	if (rv != CACHEW_OK)
		goto fail;
	ctx->src.ops = &stream_ops;
	ctx->src.ctx = ctx;
	rv = cwi_split_client_graph(ctx->plan, &ctx->src, &ctx->client_graph);
	if (rv != CACHEW_OK)
		goto fail;
	/* The client part runs locally with the job's seed, so that a
	 * client-side shuffle replays like the in-process run. */
	rv = cwi_iterator_create_owned(out, ctx->client_graph, opts,
	    ctx->seed, ctx_free, ctx);
	if (rv == CACHEW_OK)
		cwi_iterator_set_part_stats(*out, ctx_part_stats);
	return rv;
fail:
	ctx_free(ctx);
	return rv;
}
