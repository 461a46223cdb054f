/*
 * worker_direct.c - direct tasks: the lease pipeline runs on the thread
 * that sends the get_elements.
 *
 * An embedded worker (service=embedded) serves its uncoordinated
 * distributed_epoch tasks this way. Over inproc the transport runs the
 * handler on the sender's thread, so a client that calls from the thread
 * that consumes runs the pipeline where the plain executor would: no
 * runner thread, no queue, no hand-off, and a take(5) pulls 5 elements.
 * Nothing here knows who the client is or how it got here; the client
 * knows only that the dispatcher listed the task as direct.
 *
 * One call at a time runs a task's pipeline (pull_lock): the lease being
 * read (pull_it) and its splits; a lease that ends adds its operator rows
 * to the task's (worker_stats.c, which answers task_stats).
 * A lease ends inside a call: its splits go back in that reply, to be
 * acknowledged by the client that holds every element of them not handed
 * to an earlier caller.
 */
#include "worker_task_int.h"
#include "../../core/options.h"

#include <stdio.h>
#include <stdlib.h>

/* A call goes on pulling for this long at most (pull_elements). */
#define FILL_NS (UINT64_C(500) * 1000)

/* ---- pulling ------------------------------------------------------------------ */

/* What one pull gave besides elements. */
typedef struct pulled {
	uint64_t *split_ids; /* the lease that ended in this pull (malloc'd) */
	size_t nsplits;
	cwi_run *runs;       /* exactly once: what the elements are */
	size_t nruns, capruns;
	bool end_of_task;    /* every split is acknowledged: nothing more */
	uint32_t retry_ms;   /* nothing now: every split is leased elsewhere */
} pulled;

/* The executor settings of the lease pipeline: the worker's, or the
 * client's when the request carries them. A new options object
 * (cachew_options_destroy), or NULL on ENOMEM. */
static cachew_options *
lease_options(const cwi_wtask *t, const cwi_msg_get_elements *m)
{
	cwi_opts v = *cwi_options_values(t->lease_opts);

	if (m->exec) {
		v.epoch = (int64_t)m->epoch;
		v.threads = m->threads;
		v.ram_budget = m->ram_budget;
		if (m->max_element_bytes > 0)
			v.max_element_bytes = m->max_element_bytes;
		v.deterministic = m->deterministic;
		v.autotune = m->autotune;
	}
	return cwi_options_from_values(&v);
}

/* Leases the next splits and opens their pipeline; sets r->end_of_task or
 * r->retry_ms when there are none. Called with pull_lock held. */
static cachew_err
pull_lease(cwi_wtask *t, const cwi_msg_get_elements *m, pulled *r)
{
	cwi_pmsg rep;
	cwi_msg_split_lease_reply *lr;
	cwi_unit_range *ranges;
	cachew_options *opts;
	cachew_err rv;

	rv = cwi_wtask_lease_splits(t, &rep);
	if (rv == CACHEW_ENOENT ||
	    (rv == CACHEW_ECANCELED && atomic_load(&t->stop))) {
		/* The dispatcher dropped the task (its worker was declared
		 * dead), or the worker stopped it while the lease call was
		 * retrying: stopped, as far as the caller is concerned. */
		char why[256];
		snprintf(why, sizeof(why), "%s", cwi_errmsg_get());
		return cwi_fail(CACHEW_ECLOSED, "task %llu was stopped: %s",
		    (unsigned long long)t->id, why);
	}
	if (rv != CACHEW_OK)
		return rv;
	lr = &rep.u.split_lease_reply;
	if (lr->nsplits == 0) {
		if (lr->end_of_splits) {
			pthread_mutex_lock(&t->lock);
			t->produced_all = true;
			t->end_ns = cwi_now_ns();
			pthread_mutex_unlock(&t->lock);
			r->end_of_task = true;
		} else {
			r->retry_ms = lr->retry_ms > 0 ? lr->retry_ms : 20;
		}
		cwi_pmsg_free(&rep);
		return CACHEW_OK;
	}
	ranges = cwi_wtask_lease_ranges(lr);
	opts = lease_options(t, m);
	t->pull_splits = malloc(lr->nsplits * sizeof(*t->pull_splits));
	if (ranges == NULL || opts == NULL || t->pull_splits == NULL) {
		free(ranges);
		cachew_options_destroy(opts);
		cwi_pmsg_free(&rep);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < lr->nsplits; i++)
		t->pull_splits[i] = lr->splits[i].split_id;
	t->pull_nsplits = lr->nsplits;
	t->pull_group = lr->group;
	t->pull_next = 0;
	cwi_rset_free(&t->pull_skip);
	if (!cwi_rset_list_ok(lr->skip, lr->nskip))
		rv = cwi_fail(CACHEW_EPROTO, "split_lease_reply: skip is not "
		    "ascending [from, to) pairs");
	else if (!cwi_rset_add_list(&t->pull_skip, lr->skip, lr->nskip))
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	else
		rv = cwi_wtask_lease_open(t, &t->pull_it, opts, ranges,
		    lr->nsplits);
	free(ranges);
	cachew_options_destroy(opts);
	cwi_pmsg_free(&rep);
	return rv;
}

/* Exactly once: numbers the elements out->v[n0..] of the lease being
 * read (tail: 0, or the grouping operator's number), drops those the lease
 * leaves out and records runs (pull_lock held). */
static cachew_err
number_new(cwi_wtask *t, cwi_chunk *out, size_t n0, uint32_t tail,
    pulled *r)
{
	size_t w = n0;

	if (!t->exactly_once || out->n == n0)
		return CACHEW_OK;
	if (t->pull_skip.n == 0) {
		/* Nothing to leave out (the common case): one run. */
		uint64_t first = t->pull_next;
		t->pull_next += out->n - n0;
		if (!cwi_wtask_run_add(&r->runs, &r->nruns, &r->capruns,
			t->pull_group, (uint32_t)t->pull_nsplits, first,
			(uint32_t)(out->n - n0), tail, false))
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		return CACHEW_OK;
	}
	for (size_t i = n0; i < out->n; i++) {
		uint64_t idx = t->pull_next++;
		if (cwi_rset_has(&t->pull_skip, idx)) {
			cwi_element_release(out->v[i]);
			continue;
		}
		out->v[w++] = out->v[i];
		if (!cwi_wtask_run_add(&r->runs, &r->nruns, &r->capruns,
			t->pull_group, (uint32_t)t->pull_nsplits, idx, 1,
			tail, false)) {
			for (size_t k = i + 1; k < out->n; k++)
				cwi_element_release(out->v[k]);
			out->n = w;
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
	}
	out->n = w;
	return CACHEW_OK;
}

/* Exactly once, at the lease's end: its tails go after its elements, then
 * the group's end (pull_lock held). */
static cachew_err
take_tails(cwi_wtask *t, cwi_chunk *out, pulled *r)
{
	cachew_err rv = CACHEW_OK;

	if (!t->exactly_once)
		return CACHEW_OK;
	for (size_t k = 0; k < t->plan->ngroups && rv == CACHEW_OK; k++) {
		size_t n0 = out->n;
		rv = cwi_iterator_take_tails(t->pull_it, k, out);
		if (rv == CACHEW_OK)
			rv = number_new(t, out, n0, (uint32_t)(k + 1), r);
	}
	if (rv == CACHEW_OK &&
	    !cwi_wtask_run_add(&r->runs, &r->nruns, &r->capruns,
		t->pull_group, (uint32_t)t->pull_nsplits, t->pull_next, 0, 0,
		true))
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	return rv;
}

/* The lease being read ended: its rows are kept and its splits go to the
 * caller (pull_lock held). */
static void
lease_done(cwi_wtask *t, pulled *r)
{
	cwi_wtask_add_stats(t, t->pull_it);
	cachew_iterator_destroy(t->pull_it);
	t->pull_it = NULL;
	r->split_ids = t->pull_splits;
	r->nsplits = t->pull_nsplits;
	t->pull_splits = NULL;
	t->pull_nsplits = 0;
}

/* Reads up to max elements into out (room reserved) from the lease being
 * read, opening the next lease first when there is none (pull_lock held).
 * It goes on pulling while the pipeline gives elements quickly, up to max
 * or FILL_NS from the first: a call costs a few microseconds (two headers
 * encoded and decoded, a request through the transport), which W1's
 * pipeline pays once per 64 batches when a call takes only one step of it
 * (3% of its time), and once per 256 when it fills. A slow pipeline's
 * first elements do not wait for the rest. */
static cachew_err
pull_elements(cwi_wtask *t, const cwi_msg_get_elements *m, cwi_chunk *out,
    size_t max, pulled *r)
{
	cachew_err rv;

	if (t->pull_it == NULL) {
		if (t->produced_all) {
			r->end_of_task = true;
			return CACHEW_OK;
		}
		free(t->pull_splits);
		t->pull_splits = NULL;
		t->pull_nsplits = 0;
		rv = pull_lease(t, m, r);
		if (rv != CACHEW_OK || t->pull_it == NULL)
			return rv;
	}
	uint64_t t0 = 0;
	do {
		if (atomic_load(&t->stop))
			return out->n > 0 ? CACHEW_OK
					  : cwi_fail(CACHEW_ECLOSED,
						"task %llu was stopped",
						(unsigned long long)t->id);
		size_t n0 = out->n;
		rv = cwi_iterator_next_chunk(t->pull_it, out, max - out->n);
		if (rv == CACHEW_EOF) {
			rv = take_tails(t, out, r);
			lease_done(t, r);
			return rv;
		}
		if (rv == CACHEW_OK)
			rv = number_new(t, out, n0, 0, r);
		if (rv != CACHEW_OK) {
			/* Elements already pulled go first; the failure stays
			 * with the lease iterator for the next call. */
			if (out->n > 0)
				return CACHEW_OK;
			return cwi_fail(rv, "%s",
			    cachew_iterator_errmsg(t->pull_it));
		}
		if (t0 == 0)
			t0 = cwi_now_ns();
	} while (out->n < max && cwi_now_ns() - t0 < FILL_NS);
	return CACHEW_OK;
}

/* One pull with the task's bookkeeping: counters, delivered splits, and a
 * pipeline failure that stays (every later call gets it). */
static cachew_err
pull(cwi_wtask *t, const cwi_msg_get_elements *m, cwi_chunk *out,
    size_t max, pulled *r)
{
	uint64_t bytes = 0;
	cachew_err rv;

	pthread_mutex_lock(&t->pull_lock);
	/* A stopped task may outlive its worker: no lease call then. */
	if (t->detached || (t->pull_it == NULL && !t->produced_all &&
				atomic_load(&t->stop))) {
		rv = cwi_fail(CACHEW_ECLOSED, "task %llu was stopped",
		    (unsigned long long)t->id);
		goto done;
	}
	if (t->failed != CACHEW_OK) {
		rv = cwi_fail(t->failed, "%s", t->errmsg);
		goto done;
	}
	rv = pull_elements(t, m, out, max, r);
	for (size_t i = 0; i < out->n; i++)
		bytes += cwi_element_nbytes(out->v[i]);
	pthread_mutex_lock(&t->lock);
	t->elements += out->n;
	t->bytes += bytes;
	for (size_t i = 0; i < r->nsplits; i++)
		(void)cwi_wtask_add_delivered(t, r->split_ids[i]);
	if (rv != CACHEW_OK && rv != CACHEW_ECLOSED && t->failed == CACHEW_OK) {
		t->failed = rv;
		snprintf(t->errmsg, sizeof(t->errmsg), "%s", cwi_errmsg_get());
		t->produced_all = true;
	}
	pthread_mutex_unlock(&t->lock);
done:
	pthread_mutex_unlock(&t->pull_lock);
	return rv;
}

/* ---- the reply ------------------------------------------------------------------ */

/* The reply to a pull: its elements ride alongside (their references move
 * to the message), the ended lease's splits end after the last of them. */
static cachew_err
direct_reply(cwi_wtask *t, cwi_chunk *out, pulled *r, cwi_msg **msg)
{
	cwi_split_end *ends = NULL;
	cwi_pmsg rep;
	cachew_err rv;

	rv = cwi_msg_create(msg);
	if (rv != CACHEW_OK)
		return rv;
	if (r->nsplits > 0 &&
	    (ends = calloc(r->nsplits, sizeof(*ends))) == NULL) {
		cwi_msg_destroy(*msg);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < r->nsplits; i++) {
		ends[i].split_id = r->split_ids[i];
		ends[i].after = (uint32_t)out->n;
	}
	for (size_t i = 0; i < out->n; i++) {
		rv = cwi_msg_push(*msg, out->v[i]);
		if (rv != CACHEW_OK)
			break;
		out->v[i] = NULL;
	}
	cwi_pmsg_init(&rep, CWI_MSG_GET_ELEMENTS_REPLY);
	rep.u.get_elements_reply.task_id = t->id;
	rep.u.get_elements_reply.elements = (uint32_t)out->n;
	rep.u.get_elements_reply.split_ends = ends;
	rep.u.get_elements_reply.nsplit_ends = r->nsplits;
	rep.u.get_elements_reply.runs = r->runs;
	rep.u.get_elements_reply.nruns = r->nruns;
	r->runs = NULL; /* the reply frees them */
	r->nruns = 0;
	rep.u.get_elements_reply.end_of_task = r->end_of_task;
	rep.u.get_elements_reply.retry_ms = r->retry_ms;
	if (out->n > 0)
		rep.u.get_elements_reply.names =
		    cwi_wtask_reply_names(t, *msg);
	if (rv == CACHEW_OK)
		rv = cwi_wtask_set_header(*msg, &rep); /* frees ends */
	else
		cwi_pmsg_free(&rep);
	if (rv != CACHEW_OK) {
		cwi_msg_destroy(*msg);
		*msg = NULL;
	}
	return rv;
}

/* A failed call's error reply: a stopped task's (CACHEW_ECLOSED), or the
 * pipeline's own code and message, marked as such, so that the client
 * tells them from its request's faults (ENOENT: an unknown task). */
static void
direct_fail(cwi_request *r, cachew_err rv)
{
	if (rv != CACHEW_ECLOSED) {
		cwi_rpc_reply_pipeline_error(r, rv, cwi_errmsg_get());
		return;
	}
	cwi_rpc_reply_error(r, rv, "%s", cwi_errmsg_get());
}

void
cwi_wtask_get_elements_direct(cwi_wtask *t, cwi_request *r,
    const cwi_msg_get_elements *m)
{
	size_t max = m->max_elements > 0 ? m->max_elements : REPLY_MAX_ELEMENTS;
	cwi_chunk out = {0};
	cwi_msg *msg = NULL;
	pulled got;
	cachew_err rv;

	memset(&got, 0, sizeof(got));
	rv = cwi_chunk_reserve(&out, max);
	if (rv == CACHEW_OK)
		rv = pull(t, m, &out, max, &got);
	if (rv == CACHEW_OK)
		rv = direct_reply(t, &out, &got, &msg);
	/* Elements not moved into the reply (none, unless it failed). */
	for (size_t i = 0; i < out.n; i++)
		if (out.v[i] != NULL)
			cwi_element_release(out.v[i]);
	free(out.v);
	free(got.split_ids);
	free(got.runs);
	if (rv != CACHEW_OK) {
		direct_fail(r, rv);
		return;
	}
	if (cwi_request_reply(r, msg) != CACHEW_OK)
		cwi_msg_destroy(msg);
}
