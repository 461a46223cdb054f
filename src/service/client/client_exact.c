/*
 * client_exact.c - exactly-once delivery on the client's side
 * (docs/protocol.md, "Exactly once").
 *
 * Every element a worker sends in an exactly-once job is numbered within
 * its group (a lease's splits, replayed whole with the same ranges and
 * seed): the reply's runs say which. The client keeps, per group, the set
 * of numbers it received; an element it already has is dropped (a replay
 * the dispatcher could not fully trim), and the set is what it reports
 * when the dispatcher asks it to stop reading a task that went (the
 * dispatcher then replays the group leaving those out). Tail elements (a
 * lease's last partial batch, before batching) go to the stitcher
 * (client_stitch.c), which makes full batches of them across leases.
 *
 * exact_lock guards all of it: the fetch thread takes remote replies, the
 * consumer a direct task's. Lock order: exact_lock, then s->lock (the
 * queue): a remote reply's elements are recorded and queued under
 * exact_lock, and a failure recorded in the session before it is
 * released, so a saved position (cwi_client_session_save, which takes
 * both) never sees an element recorded as received that no buffer holds.
 */
#include "client_int.h"
#include "client_stitch.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct cgroup {
	uint64_t id;
	cwi_rset got;
	bool ended;
	uint64_t total;
	uint32_t splits; /* its split count (the next group is id + splits);
			  * 0 until a run said it */
	/* Ordered delivery: its elements, held until it is the head. */
	cwi_chunk held;
} cgroup;

/* A client part that starts by selecting by position sees in-process's
 * order only if groups come in split order. */
static bool
needs_order(const client_ctx *ctx)
{
	static const char *const positional[] = {"take", "skip", "shard",
	    "enumerate", "take_while", "unique", "scan", "reduce",
	    "window", "group_by_window", "bucket_by_sequence_length",
	    "ragged_batch", "rebatch"};
	const cwi_node *b = ctx->plan->boundary;

	if (b == NULL || ctx->opts.job_name[0] != '\0')
		return false;
	for (size_t i = 0; i < sizeof(positional) / sizeof(*positional); i++)
		if (strcmp(b->op->name, positional[i]) == 0)
			return true;
	return false;
}

cachew_err
cwi_client_exact_init(session *s)
{
	s->ordered = s->exact && needs_order(s->ctx);
	if (!s->exact || s->ctx->plan->ngroups == 0)
		return CACHEW_OK;
	return cwi_stitch_create(&s->stitch, s->ctx->plan, &s->ctx->opts,
	    s->ctx->seed, s->epoch, &s->ctx->stitched);
}

void
cwi_client_exact_free(session *s)
{
	/* A replay the dispatcher could not trim (it had no report of them):
	 * dropped here, worth knowing. */
	if (s->dups > 0)
		cwi_log(CACHEW_LOG_INFO, "client", "event=repeats_dropped "
		    "job=%llu elements=%llu", (unsigned long long)s->job_id,
		    (unsigned long long)s->dups);
	for (size_t i = 0; i < s->ngroups; i++) {
		cwi_rset_free(&s->groups[i].got);
		cwi_chunk_free(&s->groups[i].held);
	}
	free(s->groups);
	cwi_stitch_destroy(s->stitch);
	cwi_names_unref(s->stitch_names);
	free(s->stopped);
	free(s->failed);
	free(s->stop_direct);
	free(s->sent_stopped);
	free(s->sent_failed);
	pthread_mutex_destroy(&s->exact_lock);
}

/* The group's record, made on first use (exact_lock held). */
static cgroup *
group_get(session *s, uint64_t id)
{
	cgroup *g;

	if (s->lastgroup < s->ngroups && s->groups[s->lastgroup].id == id)
		return &s->groups[s->lastgroup];
	for (size_t i = s->ngroups; i-- > 0;) {
		if (s->groups[i].id == id) {
			s->lastgroup = i;
			return &s->groups[i];
		}
	}
	if (!CWI_GROW(s->groups, s->capgroups, s->ngroups + 1))
		return NULL;
	g = &s->groups[s->ngroups];
	memset(g, 0, sizeof(*g));
	g->id = id;
	s->lastgroup = s->ngroups++;
	return g;
}

/* Delivers e of group g: into out, or (ordered delivery, g not the head
 * yet) into g's held elements. false on ENOMEM (e released). */
static bool
emit(session *s, cgroup *g, cwi_element *e, cwi_chunk *out)
{
	cwi_chunk *dst = s->ordered && g->id != s->head ? &g->held : out;

	if (cwi_chunk_reserve(dst, 1) != CACHEW_OK) {
		cwi_element_release(e);
		return false;
	}
	if (dst != out)
		s->held_bytes += cwi_element_nbytes(e);
	cwi_chunk_push(dst, e);
	return true;
}

/* Ordered delivery: while the head group has ended, the next one (in
 * split order) becomes the head and what it holds goes out. */
static bool
advance_head(session *s, cwi_chunk *out)
{
	for (;;) {
		cgroup *h = NULL;
		for (size_t i = 0; i < s->ngroups && h == NULL; i++)
			if (s->groups[i].id == s->head)
				h = &s->groups[i];
		if (h == NULL)
			return true;
		if (h->held.n > 0) {
			for (size_t i = 0; i < h->held.n; i++)
				s->held_bytes -= cwi_element_nbytes(h->held.v[i]);
			if (!cwi_chunk_move_all(out, &h->held))
				return false;
		}
		if (!h->ended || h->splits == 0)
			return true;
		s->head = h->id + h->splits;
	}
}

/* Whether the set holds any of [from, to). */
static bool
rset_meets(const cwi_rset *s, uint64_t from, uint64_t to)
{
	for (size_t i = s->n; i >= 2; i -= 2) {
		if (s->v[i - 1] <= from)
			return false; /* this range and all before end first */
		if (s->v[i - 2] < to)
			return true;
	}
	return false;
}

/* Takes one run of a reply whose elements start at v[*e] (exact_lock
 * held): records them, delivers the new ones (tails to the stitcher, with
 * the batches they complete right after), drops the repeats. */
static cachew_err
take_run(session *s, const char *worker, const cwi_run *run, cwi_element **v,
    size_t *e, cwi_chunk *out, char *err, size_t errlen)
{
	cgroup *g = group_get(s, run->group);
	cachew_err rv = CACHEW_OK;

	if (g == NULL)
		return CACHEW_ENOMEM;
	/* The common case, a stream read in order: none of the run was
	 * received before, so it is recorded at once and its output
	 * elements go out as they are. */
	bool fresh = run->n > 0 && run->tail == 0 &&
	    !rset_meets(&g->got, run->from, run->from + run->n);
	if (fresh) {
		if (!cwi_rset_add(&g->got, run->from, run->from + run->n))
			return CACHEW_ENOMEM;
		for (uint32_t k = 0; k < run->n; k++, (*e)++) {
			cwi_element *x = v[*e];
			v[*e] = NULL;
			if (!emit(s, g, x, out))
				return CACHEW_ENOMEM;
		}
	}
	for (uint32_t k = 0; !fresh && k < run->n; k++, (*e)++) {
		uint64_t idx = run->from + k;
		cwi_element *x = v[*e];
		if (cwi_rset_has(&g->got, idx)) {
			cwi_element_release(x);
			v[*e] = NULL;
			s->dups++;
			continue;
		}
		if (run->tail > 0 && s->stitch == NULL) {
			snprintf(err, errlen, "%s: a tail element, but the "
			    "pipeline has no batch to stitch", worker);
			return CACHEW_EPROTO;
		}
		if (!cwi_rset_add(&g->got, idx, idx + 1))
			return CACHEW_ENOMEM;
		v[*e] = NULL;
		if (run->tail == 0) {
			if (!emit(s, g, x, out))
				return CACHEW_ENOMEM;
			continue;
		}
		rv = cwi_stitch_add(s->stitch, run->tail - 1, x);
		if (rv != CACHEW_OK) {
			snprintf(err, errlen, "%s: %s", worker,
			    cwi_errmsg_get());
			return rv;
		}
	}
	if (run->splits > 0)
		g->splits = run->splits;
	if (run->end) {
		g->ended = true;
		g->total = run->from + run->n;
	}
	/* The batches a tail run completes take their place in the stream
	 * right after it (in its group, ordered). */
	if (run->tail > 0) {
		cwi_chunk made = {0};
		rv = cwi_stitch_drain(s->stitch, false, &made, err, errlen);
		cwi_client_give_names(s->stitch_names, made.v, made.n);
		for (size_t k = 0; k < made.n; k++)
			if (rv == CACHEW_OK && !emit(s, g, made.v[k], out))
				rv = CACHEW_ENOMEM;
			else if (rv != CACHEW_OK)
				cwi_element_release(made.v[k]);
		made.n = 0;
		cwi_chunk_free(&made);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (s->ordered && g->id == s->head && !advance_head(s, out))
		return CACHEW_ENOMEM;
	return CACHEW_OK;
}

cachew_err
cwi_client_exact_reply(session *s, const char *worker,
    const cwi_msg_get_elements_reply *r, cwi_element **v, size_t n,
    cwi_chunk *out, bool queue, char *err, size_t errlen)
{
	size_t e = 0;
	cachew_err rv = CACHEW_OK;

	if (!s->exact)
		return CACHEW_OK;
	for (size_t i = 0; i < r->nruns; i++) {
		if (r->runs[i].n > n - e) {
			snprintf(err, errlen, "%s: the runs of reply %llu name "
			    "more than its %zu elements", worker,
			    (unsigned long long)r->seq, n);
			rv = CACHEW_EPROTO;
			goto release;
		}
		e += r->runs[i].n;
	}
	if (e != n) {
		snprintf(err, errlen, "%s: the runs of reply %llu name %zu of "
		    "its %zu elements", worker, (unsigned long long)r->seq, e,
		    n);
		rv = CACHEW_EPROTO;
		goto release;
	}
	if (cwi_chunk_reserve(out, n) != CACHEW_OK) {
		snprintf(err, errlen, "out of memory");
		rv = CACHEW_ENOMEM;
		goto release;
	}
	pthread_mutex_lock(&s->exact_lock);
	/* Tails are left unnamed (cwi_client_name_elements): the batches
	 * stitched of them are outputs of the part and take the names. */
	if (s->ctx->wire_names && r->names != NULL &&
	    s->stitch_names != r->names) {
		cwi_names_unref(s->stitch_names);
		s->stitch_names = cwi_names_ref(r->names);
	}
	e = 0;
	for (size_t i = 0; i < r->nruns && rv == CACHEW_OK; i++)
		rv = take_run(s, worker, &r->runs[i], v, &e, out, err, errlen);
	if (rv == CACHEW_ENOMEM)
		snprintf(err, errlen, "out of memory");
	/* Queued, or the session failed, before the lock goes: a saved
	 * position never sees an element recorded as received that is
	 * neither queued nor held. */
	if (rv == CACHEW_OK && queue && out->n > 0)
		(void)cwi_client_queue_chunk(s, out);
	else if (rv != CACHEW_OK)
		cwi_client_fail(s, rv, "%s", err);
	pthread_mutex_unlock(&s->exact_lock);
release:
	/* What is left of v (a refused reply, or a failure that stopped
	 * the walk) is released: every caller gives v up. */
	for (size_t i = 0; i < n; i++) {
		cwi_element_release(v[i]);
		v[i] = NULL;
	}
	return rv;
}

cachew_err
cwi_client_exact_finish(session *s, cwi_chunk *out, char *err, size_t errlen)
{
	cachew_err rv = CACHEW_OK;

	if (!s->exact)
		return CACHEW_OK;
	pthread_mutex_lock(&s->exact_lock);
	/* Ordered delivery: whatever is still held (a group whose end was
	 * never seen: not expected), in group order. */
	while (s->ordered && s->held_bytes > 0 && rv == CACHEW_OK) {
		cgroup *next = NULL;
		for (size_t i = 0; i < s->ngroups; i++)
			if (s->groups[i].held.n > 0 &&
			    (next == NULL || s->groups[i].id < next->id))
				next = &s->groups[i];
		if (next == NULL)
			break;
		s->head = next->id;
		if (!advance_head(s, out))
			rv = CACHEW_ENOMEM;
	}
	if (rv == CACHEW_OK && s->stitch != NULL &&
	    cwi_stitch_held(s->stitch) > 0) {
		size_t before = out->n;
		rv = cwi_stitch_drain(s->stitch, true, out, err, errlen);
		if (rv == CACHEW_OK)
			cwi_client_give_names(s->stitch_names,
			    out->v + before, out->n - before);
	}
	if (rv == CACHEW_ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (rv == CACHEW_OK && out->n > 0)
		(void)cwi_client_queue_chunk(s, out);
	else if (rv != CACHEW_OK)
		cwi_client_fail(s, rv, "%s", err);
	pthread_mutex_unlock(&s->exact_lock);
	return rv;
}

uint64_t
cwi_client_exact_held(session *s)
{
	uint64_t b;

	if (!s->ordered)
		return 0;
	pthread_mutex_lock(&s->exact_lock);
	b = s->held_bytes;
	pthread_mutex_unlock(&s->exact_lock);
	return b;
}

bool
cwi_client_exact_may_hold_head(session *s, const ctask *t)
{
	bool may;

	if (!s->ordered || t->last_group == UINT64_MAX)
		return true;
	pthread_mutex_lock(&s->exact_lock);
	may = t->last_group <= s->head;
	pthread_mutex_unlock(&s->exact_lock);
	return may;
}

bool
cwi_client_queue_chunk(session *s, cwi_chunk *c)
{
	bool ok = true;

	for (size_t i = 0; i < c->n; i++) {
		if (ok && cwi_client_queue_push(s, c->v[i]))
			continue;
		ok = false;
		cwi_element_release(c->v[i]);
	}
	c->n = 0;
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
	else
		cwi_client_wake(s);
	return ok;
}

/* ---- stopping tasks and reporting ------------------------------------------ */

static bool
ids_add(uint64_t **v, size_t *n, size_t *cap, uint64_t id)
{
	for (size_t i = 0; i < *n; i++)
		if ((*v)[i] == id)
			return true;
	if (!CWI_GROW(*v, *cap, *n + 1))
		return false;
	(*v)[(*n)++] = id;
	return true;
}

/* A remote task is read no more (fetch thread). */
static void
task_stop(ctask *t)
{
	cwi_client_task_drop_held(t);
	t->gone = true;
	t->stopped = true;
}

void
cwi_client_exact_stop(session *s, const uint64_t *ids, size_t n)
{
	bool ok = true;

	for (size_t i = 0; i < n; i++) {
		ctask *t = cwi_client_task_by_id(s, ids[i]);
		if (t != NULL && t->direct) {
			pthread_mutex_lock(&s->exact_lock);
			ok &= ids_add(&s->stop_direct, &s->nstop_direct,
			    &s->capstop_direct, ids[i]);
			pthread_mutex_unlock(&s->exact_lock);
			continue;
		}
		if (t != NULL)
			task_stop(t);
		pthread_mutex_lock(&s->exact_lock);
		ok &= ids_add(&s->stopped, &s->nstopped, &s->capstopped,
		    ids[i]);
		pthread_mutex_unlock(&s->exact_lock);
	}
	cwi_client_exact_poll(s);
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

void
cwi_client_exact_failed(session *s, ctask *t)
{
	bool ok;

	task_stop(t);
	pthread_mutex_lock(&s->exact_lock);
	ok = ids_add(&s->failed, &s->nfailed, &s->capfailed, t->task_id) &&
	     ids_add(&s->stopped, &s->nstopped, &s->capstopped, t->task_id);
	pthread_mutex_unlock(&s->exact_lock);
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

void
cwi_client_exact_poll(session *s)
{
	bool ok = true;

	pthread_mutex_lock(&s->exact_lock);
	for (size_t i = 0; i < s->nstop_direct;) {
		uint64_t id = s->stop_direct[i];
		bool idle;

		/* The consumer calls the task with s->lock released: once
		 * it is blocked while no call runs, nothing more of it can
		 * arrive. */
		pthread_mutex_lock(&s->lock);
		idle = !s->inl_calling || s->inl.id != id;
		if (idle)
			s->inl_blocked = id;
		pthread_mutex_unlock(&s->lock);
		if (!idle) {
			i++;
			continue;
		}
		ok &= ids_add(&s->stopped, &s->nstopped, &s->capstopped, id);
		s->stop_direct[i] = s->stop_direct[--s->nstop_direct];
		ctask *t = cwi_client_task_by_id(s, id);
		if (t != NULL) {
			t->gone = true;
			t->stopped = true;
		}
	}
	pthread_mutex_unlock(&s->exact_lock);
	if (!ok)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

bool
cwi_client_exact_due(session *s)
{
	bool due;

	if (!s->exact)
		return false;
	pthread_mutex_lock(&s->exact_lock);
	due = s->nstopped > 0 || s->nfailed > 0;
	pthread_mutex_unlock(&s->exact_lock);
	return due;
}

static uint64_t *
ids_copy(const uint64_t *v, size_t n)
{
	uint64_t *c = n > 0 ? malloc(n * sizeof(*c)) : NULL;

	if (c != NULL)
		memcpy(c, v, n * sizeof(*c));
	return c;
}

void
cwi_client_exact_fill(session *s, cwi_msg_client_heartbeat *m)
{
	if (!s->exact)
		return;
	pthread_mutex_lock(&s->exact_lock);
	if (s->nstopped == 0 && s->nfailed == 0) {
		pthread_mutex_unlock(&s->exact_lock);
		return;
	}
	/* Every group this client has data of: the dispatcher takes the
	 * ones it is recovering (a complete one included: its ack may still
	 * be on its way). */
	m->progress = calloc(s->ngroups > 0 ? s->ngroups : 1,
	    sizeof(*m->progress));
	m->stopped_tasks = ids_copy(s->stopped, s->nstopped);
	m->failed_tasks = ids_copy(s->failed, s->nfailed);
	if (m->progress == NULL || (s->nstopped > 0 && m->stopped_tasks ==
	    NULL) || (s->nfailed > 0 && m->failed_tasks == NULL)) {
		/* Nothing reported this time; the next heartbeat tries. */
		free(m->progress);
		free(m->stopped_tasks);
		free(m->failed_tasks);
		m->progress = NULL;
		m->stopped_tasks = m->failed_tasks = NULL;
		pthread_mutex_unlock(&s->exact_lock);
		return;
	}
	m->nstopped_tasks = s->nstopped;
	m->nfailed_tasks = s->nfailed;
	for (size_t i = 0; i < s->ngroups; i++) {
		const cgroup *g = &s->groups[i];
		cwi_progress *p = &m->progress[m->nprogress];
		p->group = g->id;
		p->ended = g->ended;
		p->total = g->total;
		p->ranges = ids_copy(g->got.v, g->got.n);
		if (g->got.n > 0 && p->ranges == NULL)
			continue;
		p->nranges = g->got.n;
		m->nprogress++;
	}
	/* In flight now; back to the lists if the heartbeat fails. */
	free(s->sent_stopped);
	free(s->sent_failed);
	s->sent_stopped = s->stopped;
	s->nsent_stopped = s->nstopped;
	s->sent_failed = s->failed;
	s->nsent_failed = s->nfailed;
	s->stopped = s->failed = NULL;
	s->nstopped = s->capstopped = s->nfailed = s->capfailed = 0;
	pthread_mutex_unlock(&s->exact_lock);
}

void
cwi_client_exact_sent(session *s, bool ok)
{
	bool mem = true;

	if (!s->exact)
		return;
	pthread_mutex_lock(&s->exact_lock);
	for (size_t i = 0; !ok && i < s->nsent_stopped; i++)
		mem &= ids_add(&s->stopped, &s->nstopped, &s->capstopped,
		    s->sent_stopped[i]);
	for (size_t i = 0; !ok && i < s->nsent_failed; i++)
		mem &= ids_add(&s->failed, &s->nfailed, &s->capfailed,
		    s->sent_failed[i]);
	free(s->sent_stopped);
	free(s->sent_failed);
	s->sent_stopped = s->sent_failed = NULL;
	s->nsent_stopped = s->nsent_failed = 0;
	pthread_mutex_unlock(&s->exact_lock);
	if (!mem)
		cwi_client_fail(s, CACHEW_ENOMEM, "out of memory");
}

/* ---- a saved position (cachew_iterator_save through a service) ------------ */

/*
 * The session's part of a saved position, one msgpack array:
 *   [epoch, units, units_per_split, head,
 *    groups: [[id, splits, ended, total, [from, to, ...], held elements]...],
 *    queued elements, tails: [elements of grouping operator k...]]
 * groups in id order: every group this client has elements of; `held`
 * is what ordered delivery holds of it. Every element recorded as received
 * is in exactly one place at the saving moment: handed to the client part
 * (whose own state saves it), queued, held, or a tail in the stitcher
 * (exact_lock covers the fetch thread's reply from recording to queueing).
 */

/* A saved group, read back. */
typedef struct saved_group {
	cwi_progress p; /* ranges owned */
	cwi_chunk held;
} saved_group;

struct cwi_client_resume {
	uint64_t epoch, units, units_per_split, head;
	saved_group *groups;
	size_t ngroups;
	cwi_chunk queue;
	cwi_chunk tails[CWI_SPLIT_MAX_GROUPS];
	size_t ntails;
};

static int
group_order(const void *a, const void *b)
{
	const cgroup *x = *(const cgroup *const *)a;
	const cgroup *y = *(const cgroup *const *)b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* Why this session's position cannot be saved, or NULL. */
static const char *
save_refusal(const session *s)
{
	if (s->ctx->opts.job_name[0] != '\0')
		return "a shared job (job_name) has one position for all its "
		       "clients, not one per client";
	if (s->coord != NULL)
		return "coordinated reads (num_consumers) do not resume";
	if (!s->exact)
		return "the job is not exactly-once (exactly_once=true and "
		       "processing_mode=distributed_epoch resume)";
	if (s->units_per_split == 0)
		return "the dispatcher did not say the job's split layout (it "
		       "is older than resumable iteration)";
	return NULL;
}

static cachew_err
save_groups(session *s, cwi_state_writer *w)
{
	const cgroup **v = NULL;
	cachew_err rv = CACHEW_OK;

	if (s->ngroups > 0 && (v = malloc(s->ngroups * sizeof(*v))) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < s->ngroups; i++)
		v[i] = &s->groups[i];
	if (s->ngroups > 1)
		qsort(v, s->ngroups, sizeof(*v), group_order);
	cwi_sw_array(w, s->ngroups);
	for (size_t i = 0; i < s->ngroups && rv == CACHEW_OK; i++) {
		const cgroup *g = v[i];
		if (g->splits == 0) {
			rv = cwi_fail(CACHEW_ENOTSUP, "iterator save: a worker "
			    "did not say the split count of group %llu (it is "
			    "older than resumable iteration)",
			    (unsigned long long)g->id);
			break;
		}
		cwi_sw_array(w, 6);
		cwi_sw_uint(w, g->id);
		cwi_sw_uint(w, g->splits);
		cwi_sw_bool(w, g->ended);
		cwi_sw_uint(w, g->total);
		cwi_sw_array(w, g->got.n);
		for (size_t k = 0; k < g->got.n; k++)
			cwi_sw_uint(w, g->got.v[k]);
		rv = cwi_sw_elements(w, g->held.v, g->held.n);
	}
	free(v);
	return rv;
}

/* The queued elements, oldest first (s->lock held). */
static cachew_err
save_queue(session *s, cwi_state_writer *w)
{
	cwi_element **v = NULL;
	cachew_err rv;

	if (s->qlen > 0 && (v = malloc(s->qlen * sizeof(*v))) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < s->qlen; i++)
		v[i] = s->q[(s->qhead + i) % s->qcap];
	rv = cwi_sw_elements(w, v, s->qlen);
	free(v);
	return rv;
}

cachew_err
cwi_client_session_save(session *s, cwi_state_writer *w)
{
	const char *why = save_refusal(s);
	cachew_err rv;

	if (why != NULL)
		return cwi_fail(CACHEW_ENOTSUP, "iterator save through the "
		    "service %s: %s", s->ctx->url, why);
	pthread_mutex_lock(&s->exact_lock);
	pthread_mutex_lock(&s->lock);
	if (s->err != CACHEW_OK) {
		rv = cwi_fail(s->err, "iterator save: the stream failed (%s): "
		    "there is no position to save", s->errmsg);
		goto out;
	}
	cwi_sw_array(w, 7);
	cwi_sw_uint(w, s->epoch);
	cwi_sw_uint(w, s->units);
	cwi_sw_uint(w, s->units_per_split);
	cwi_sw_uint(w, s->head);
	rv = save_groups(s, w);
	if (rv == CACHEW_OK)
		rv = save_queue(s, w);
	if (rv == CACHEW_OK)
		rv = s->stitch != NULL ? cwi_stitch_save(s->stitch, w)
				       : (cwi_sw_array(w, 0), CACHEW_OK);
out:
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&s->exact_lock);
	return rv;
}

uint64_t
cwi_client_resume_units(const cwi_client_resume *rs)
{
	return rs->units;
}

uint64_t
cwi_client_resume_units_per_split(const cwi_client_resume *rs)
{
	return rs->units_per_split;
}

void
cwi_client_resume_free(cwi_client_resume *rs)
{
	if (rs == NULL)
		return;
	for (size_t i = 0; i < rs->ngroups; i++) {
		free(rs->groups[i].p.ranges);
		cwi_chunk_free(&rs->groups[i].held);
	}
	free(rs->groups);
	cwi_chunk_free(&rs->queue);
	for (size_t k = 0; k < CWI_SPLIT_MAX_GROUPS; k++)
		cwi_chunk_free(&rs->tails[k]);
	free(rs);
}

/* One saved group; ids ascending and the ranges canonical, or the reader
 * fails naming it. */
static bool
read_group(cwi_state_reader *r, saved_group *g, const saved_group *prev)
{
	uint64_t splits = 0, n = 0;

	if (!cwi_sr_array(r, "group", 6) ||
	    !cwi_sr_uint(r, "group id", &g->p.group, UINT64_MAX) ||
	    !cwi_sr_uint(r, "group splits", &splits, CWI_PROTO_MAX_SPLITS) ||
	    !cwi_sr_bool(r, "group ended", &g->p.ended) ||
	    !cwi_sr_uint(r, "group total", &g->p.total, UINT64_MAX) ||
	    !cwi_sr_count(r, "group ranges", &n, CWI_PROTO_MAX_SPLITS))
		return false;
	g->p.splits = (uint32_t)splits;
	if (splits == 0 || (prev != NULL && (g->p.group < prev->p.group ||
	    g->p.group - prev->p.group < prev->p.splits)))
		return cwi_sr_fail(r, CACHEW_ECORRUPT, "group %llu of %llu "
		    "splits overlaps the group before it, or has none",
		    (unsigned long long)g->p.group,
		    (unsigned long long)splits);
	if (n > 0 && (g->p.ranges = malloc(n * sizeof(uint64_t))) == NULL)
		return cwi_sr_fail(r, CACHEW_ENOMEM, "out of memory");
	for (uint64_t k = 0; k < n; k++)
		if (!cwi_sr_uint(r, "group range", &g->p.ranges[k], UINT64_MAX))
			return false;
	g->p.nranges = (size_t)n;
	if (!cwi_rset_list_ok(g->p.ranges, g->p.nranges) || (g->p.ended &&
	    n > 0 && g->p.ranges[n - 1] > g->p.total))
		return cwi_sr_fail(r, CACHEW_ECORRUPT, "group %llu: its "
		    "received ranges are not ascending, disjoint pairs within "
		    "its elements", (unsigned long long)g->p.group);
	return cwi_sr_elements(r, "held elements", &g->held);
}

cachew_err
cwi_client_resume_read(cwi_state_reader *r, uint64_t epoch, size_t ngrouping,
    cwi_client_resume **out)
{
	cwi_client_resume *rs = calloc(1, sizeof(*rs));
	uint64_t n = 0;

	*out = NULL;
	if (rs == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (!cwi_sr_array(r, "session", 7) ||
	    !cwi_sr_uint(r, "epoch", &rs->epoch, UINT64_MAX) ||
	    !cwi_sr_uint(r, "units", &rs->units, UINT64_MAX) ||
	    !cwi_sr_uint(r, "units per split", &rs->units_per_split,
		UINT64_MAX) ||
	    !cwi_sr_uint(r, "head", &rs->head, UINT64_MAX) ||
	    !cwi_sr_count(r, "groups", &n, CWI_PROTO_MAX_SPLITS))
		goto fail;
	if (rs->units_per_split == 0) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "units per split: 0");
		goto fail;
	}
	if (rs->epoch != epoch) {
		cwi_sr_fail(r, CACHEW_EINVAL, "the stream was saved at epoch "
		    "%llu, this one reads epoch %llu",
		    (unsigned long long)rs->epoch, (unsigned long long)epoch);
		goto fail;
	}
	if (n > 0 && (rs->groups = calloc((size_t)n, sizeof(*rs->groups))) ==
	    NULL) {
		cwi_sr_fail(r, CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	for (uint64_t i = 0; i < n; i++) {
		rs->ngroups++;
		if (!read_group(r, &rs->groups[i], i > 0 ? &rs->groups[i - 1]
							  : NULL))
			goto fail;
	}
	if (!cwi_sr_elements(r, "queued elements", &rs->queue) ||
	    !cwi_sr_count(r, "tails", &n, CWI_SPLIT_MAX_GROUPS))
		goto fail;
	if (n != 0 && n != ngrouping) {
		cwi_sr_fail(r, CACHEW_EINVAL, "the state has the tails of %llu "
		    "batching operators, the pipeline's worker part %zu",
		    (unsigned long long)n, ngrouping);
		goto fail;
	}
	for (rs->ntails = 0; rs->ntails < n; rs->ntails++)
		if (!cwi_sr_elements(r, "tail elements",
			&rs->tails[rs->ntails]))
			goto fail;
	*out = rs;
	return CACHEW_OK;
fail:
	cwi_client_resume_free(rs);
	return cwi_sr_error(r);
}

cachew_err
cwi_client_resume_fill(const cwi_client_resume *rs,
    cwi_msg_job_get_or_create *j)
{
	j->resume_units = rs->units;
	j->resume_units_per_split = rs->units_per_split;
	if (rs->ngroups == 0)
		return CACHEW_OK;
	j->resume = calloc(rs->ngroups, sizeof(*j->resume));
	if (j->resume == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < rs->ngroups; i++) {
		const cwi_progress *p = &rs->groups[i].p;
		cwi_progress *q = &j->resume[j->nresume++];
		*q = *p;
		q->ranges = ids_copy(p->ranges, p->nranges);
		if (p->nranges > 0 && q->ranges == NULL) {
			q->nranges = 0;
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
	}
	return CACHEW_OK;
}

/* The saved groups become the session's (exact_lock held). */
static cachew_err
install_groups(session *s, cwi_client_resume *rs)
{
	/* A new session has no group yet, and the saved ones are distinct. */
	if (!CWI_GROW(s->groups, s->capgroups, s->ngroups + rs->ngroups))
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < rs->ngroups; i++) {
		saved_group *sg = &rs->groups[i];
		cgroup *g = &s->groups[s->ngroups++];
		memset(g, 0, sizeof(*g));
		g->id = sg->p.group;
		if (!cwi_rset_add_list(&g->got, sg->p.ranges, sg->p.nranges))
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		g->ended = sg->p.ended;
		g->total = sg->p.total;
		g->splits = sg->p.splits;
		if (sg->held.n > 0 && !s->ordered)
			return cwi_fail(CACHEW_EINVAL, "iterator restore: the "
			    "state holds elements of group %llu for ordered "
			    "delivery, which this pipeline does not use",
			    (unsigned long long)sg->p.group);
		for (size_t k = 0; k < sg->held.n; k++)
			s->held_bytes += cwi_element_nbytes(sg->held.v[k]);
		if (!cwi_chunk_move_all(&g->held, &sg->held))
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

cachew_err
cwi_client_resume_install(session *s, cwi_client_resume *rs)
{
	cachew_err rv;

	if (!s->exact)
		return cwi_fail(CACHEW_EPROTO, "iterator restore: the "
		    "dispatcher made the job at-least-once");
	pthread_mutex_lock(&s->exact_lock);
	s->head = rs->head;
	rv = install_groups(s, rs);
	for (size_t k = 0; k < rs->ntails && rv == CACHEW_OK; k++) {
		if (rs->tails[k].n > 0 && s->stitch == NULL) {
			rv = cwi_fail(CACHEW_EINVAL, "iterator restore: the "
			    "state holds tails to stitch, but the pipeline "
			    "has no batch to stitch them");
			break;
		}
		for (size_t i = 0; i < rs->tails[k].n && rv == CACHEW_OK; i++) {
			cwi_element *e = rs->tails[k].v[i];
			rs->tails[k].v[i] = NULL;
			rv = cwi_stitch_add(s->stitch, (uint32_t)k, e);
		}
	}
	if (rv == CACHEW_OK) {
		for (size_t i = 0; i < rs->queue.n; i++) {
			cwi_element *e = rs->queue.v[i];
			rs->queue.v[i] = NULL;
			if (!cwi_client_queue_push(s, e)) {
				cwi_element_release(e);
				rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
				break;
			}
		}
	}
	pthread_mutex_unlock(&s->exact_lock);
	return rv;
}
