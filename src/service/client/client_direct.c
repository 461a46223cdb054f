/*
 * client_direct.c - the job's direct task (cwi_task_info.direct: an
 * embedded worker's), read by calls from the consumer's thread: its lease
 * pipeline runs where the plain executor would, on the thread that calls
 * cachew_iterator_next, with no hand-off. The fetch thread only learns of
 * the task (cwi_client_take_direct); the consumer calls it
 * (cwi_client_direct_turn), acknowledges the splits whose lease ended in
 * a call, waits for a task that replaces a stopped one, and asks the task
 * for its live operator rows (task_stats).
 *
 * Owns the session's direct fields (s->inl, inl_next, inl_done,
 * inl_stopped_ns, inl_unknown_*, inl_errmsg, inl_cq) and ctx->inline_seen;
 * while a direct task is read, ctx->rows come from it (client.c fills
 * them from heartbeats for remote workers).
 *
 * Lock order: ctx->rows_lock, then s->lock. The inl* fields are read and
 * changed under s->lock; a call to the task runs with s->lock released
 * (over inproc the worker runs the pipeline inside it), and rows are
 * asked for with ctx->rows_lock held.
 */
#include "client_int.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- the fetch thread learns of it --------------------------------------- */

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
bool
cwi_client_take_direct(session *s, ctask *t)
{
	bool ok = true;

	pthread_mutex_lock(&s->lock);
	if (s->inl.conn == NULL) {
		s->inl.id = t->task_id;
		s->inl.secret = t->secret;
		s->inl.conn = t->conn;
	} else if (direct_gone(s)) {
		s->inl_next.id = t->task_id;
		s->inl_next.secret = t->secret;
		s->inl_next.conn = t->conn;
	} else {
		ok = false;
	}
	t->direct = ok;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (!ok)
		cwi_client_fail(s, CACHEW_EINVAL, "job %llu: a second direct "
		    "task (%llu)", (unsigned long long)s->job_id,
		    (unsigned long long)t->task_id);
	return ok;
}

/* ---- the consumer reads it ---------------------------------------------- */

/* Acknowledges the splits of a direct task's lease that ended (the
 * consumer holds their elements), from the consumer's thread. */
static void
ack_direct(session *s, const cwi_split_end *ends, size_t n)
{
	cwi_pmsg req, rep;
	uint64_t *ids = malloc(n * sizeof(*ids));

	if (ids == NULL) {
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < n; i++)
		ids[i] = ends[i].split_id;
	cwi_pmsg_init(&req, CWI_MSG_SPLIT_ACK);
	req.u.split_ack.job_id = s->job_id;
	req.u.split_ack.client_id = s->client_id;
	req.u.split_ack.lineage = s->lineage;
	req.u.split_ack.split_ids = ids;
	req.u.split_ack.nsplit_ids = n;
	(void)cwi_pmsg_set_token(&req, s->ctx->token); /* none: refused */
	if (cwi_rpc_call_retry(s->dispatcher, &req, CWI_MSG_OK,
		s->ctx->opts.service_timeout_ms, &s->closing, &rep) !=
	    CACHEW_OK) {
		cwi_client_fail(s, CACHEW_EIO, "dispatcher %s: acknowledging "
		    "%zu splits: %s", s->ctx->url, n, cwi_errmsg_get());
		cwi_pmsg_free(&req);
		return;
	}
	cwi_pmsg_free(&req);
	if (rep.u.ok.job_finished) {
		pthread_mutex_lock(&s->lock);
		s->inl_done = true;
		pthread_mutex_unlock(&s->lock);
		cwi_client_end_epoch(s); /* every element reached a client */
	}
	cwi_pmsg_free(&rep);
}

/* A call found the direct task stopped (the job ended, or the worker was
 * dropped and a new task comes: the consumer waits for it,
 * inline_wait_replacement). s->lock held. */
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
		/* The first failure wins (the fetch thread's may have come
		 * while this call ran unlocked). */
		if (s->err == CACHEW_OK) {
			s->err = CACHEW_ENOENT;
			snprintf(s->errmsg, sizeof(s->errmsg), "%s, for %lld ms",
			    why, (long long)s->ctx->opts.service_timeout_ms);
		}
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
	req.u.get_elements.secret = t.secret;
	req.u.get_elements.client_id = s->client_id;
	req.u.get_elements.max_elements =
	    max < UINT32_MAX ? (uint32_t)max : UINT32_MAX;
	req.u.get_elements.exec = true;
	req.u.get_elements.epoch = s->epoch;
	req.u.get_elements.threads = o->threads;
	req.u.get_elements.ram_budget = o->ram_budget;
	req.u.get_elements.max_element_bytes = o->max_element_bytes;
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
		cwi_client_fail(s, code, "%s", e->message);
		return;
	}
	if (code != CACHEW_ECLOSED && code != CACHEW_ENOENT) {
		cwi_client_fail(s, code, "worker: %s", e->message);
		return;
	}
	pthread_mutex_lock(&s->lock);
	if (code == CACHEW_ECLOSED)
		direct_stopped(s, e->message);
	else
		direct_unknown(s, e->message);
	pthread_mutex_unlock(&s->lock);
}

/* Moves a direct reply's *n elements into out (at most max: the worker
 * sends no more); exactly once, those the client already has are
 * dropped, tails go to the stitcher and the batches they complete to the
 * queue. *n: how many went to out. false when the session failed. */
static bool
direct_elements(session *s, cwi_msg *msg, const cwi_msg_get_elements_reply *g,
    cwi_chunk *out, size_t max, size_t *n)
{
	cwi_chunk ordered = {0};
	cwi_element **v;
	size_t count = *n, k = 0;
	char err[512];
	cachew_err rv;

	if (!s->exact) {
		size_t first = out->n;
		if (count > max)
			count = max;
		for (size_t i = 0; i < count; i++)
			cwi_chunk_push(out, cwi_msg_take(msg, i));
		cwi_client_name_elements(s, g, out->v + first, out->n - first);
		*n = count;
		return true;
	}
	v = count > 0 ? malloc(count * sizeof(*v)) : NULL;
	if (count > 0 && v == NULL) {
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
		return false;
	}
	for (size_t i = 0; i < count; i++)
		v[i] = cwi_msg_take(msg, i);
	cwi_client_name_elements(s, g, v, count);
	rv = cwi_client_exact_reply(s, cwi_conn_url(s->inl.conn), g, v, count,
	    &ordered, false, err, sizeof(err));
	free(v);
	if (rv != CACHEW_OK) {
		cwi_chunk_free(&ordered);
		cwi_client_fail(s, rv, "%s", err);
		return false;
	}
	/* In stream order: what fits goes to the caller (room for max), the
	 * rest (stitched batches) to the queue, which the consumer reads
	 * next. */
	for (; k < ordered.n && k < max; k++)
		cwi_chunk_push(out, ordered.v[k]);
	if (k < ordered.n) {
		memmove(ordered.v, ordered.v + k,
		    (ordered.n - k) * sizeof(*ordered.v));
		ordered.n -= k;
		(void)cwi_client_queue_chunk(s, &ordered);
	}
	ordered.n = 0; /* moved to out or to the queue */
	cwi_chunk_free(&ordered);
	*n = k;
	return true;
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
		cwi_client_fail(s, CACHEW_EPROTO, "%s", cwi_errmsg_get());
		return 0;
	}
	if (rep.type == CWI_MSG_ERROR) {
		direct_error(s, &rep.u.error);
		cwi_pmsg_free(&rep);
		return 0;
	}
	if (rep.type != CWI_MSG_GET_ELEMENTS_REPLY) {
		cwi_client_fail(s, CACHEW_EPROTO, "worker: a %s reply to "
		    "get_elements", cwi_msg_type_name(rep.type));
		cwi_pmsg_free(&rep);
		return 0;
	}
	g = &rep.u.get_elements_reply;
	n = cwi_msg_count(msg);
	if (!direct_elements(s, msg, g, out, max, &n)) {
		cwi_pmsg_free(&rep);
		return 0;
	}
	if (g->nsplit_ends > 0) {
		/* The task's rows count these leases now: take them before
		 * the acknowledgement, which lets the dispatcher end the job
		 * and the worker drop the task, its rows with it (a consumer
		 * asking for stats after the end then found the task gone
		 * and saw none: 1 run in about 100 under load). */
		pthread_mutex_lock(&s->ctx->rows_lock);
		if (s->ctx->cur == s)
			cwi_client_rows_refresh(s->ctx, s);
		pthread_mutex_unlock(&s->ctx->rows_lock);
		ack_direct(s, g->split_ends, g->nsplit_ends);
	}
	if (g->end_of_task) {
		/* end_of_splits: the dispatcher has every split acked. */
		pthread_mutex_lock(&s->lock);
		s->inl_done = true;
		pthread_mutex_unlock(&s->lock);
		cwi_client_end_epoch(s);
	}
	pthread_mutex_lock(&s->lock);
	s->inl_unknown_ns = 0;
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

	if (s->exact && t.id == s->inl_blocked) {
		/* Exactly once: the dispatcher replays what it held. */
		direct_stopped(s, "the dispatcher stopped the task");
		return 0;
	}
	s->inl_calling = true;
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
			cwi_client_fail(s, rv, "worker %s: %s",
			    cwi_conn_url(t.conn), cwi_errmsg_get());
		}
	}
	pthread_mutex_lock(&s->lock);
	s->inl_calling = false;
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

/* The consumer's turn at the direct task (s->lock held). A replacement
 * task is taken between calls; a stopped one is waited for; a live one
 * runs here, on this thread. */
bool
cwi_client_direct_turn(session *s, cwi_chunk *out, size_t max, size_t *got)
{
	*got = 0;
	if (s->inl_next.conn != NULL) {
		inline_swap(s);
		return true;
	}
	if (s->inl_stopped_ns != 0) {
		inline_wait_replacement(s);
		return true;
	}
	if (s->inl.conn != NULL && !s->inl_done) {
		*got = pull_direct(s, out, max);
		return true;
	}
	return false;
}

/* ---- its operator rows --------------------------------------------------- */

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
		w->s.dropped = c->dropped;
		w->s.cache_hit_bytes = c->cache_hit_bytes;
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
void
cwi_client_rows_refresh(client_ctx *ctx, session *s)
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
	req.u.task_stats.secret = t.secret;
	if (cwi_rpc_call(t.conn, &req, CWI_MSG_TASK_STATS_REPLY,
		(int)ctx->opts.service_timeout_ms, &rep) != CACHEW_OK)
		return; /* the task is gone: the last rows stay */
	if (!rep.u.task_stats_reply.busy)
		rows_take(ctx, &rep.u.task_stats_reply);
	cwi_pmsg_free(&rep);
}
