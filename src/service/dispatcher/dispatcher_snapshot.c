/*
 * dispatcher_snapshot.c - the dispatcher's whole state as one msgpack
 * document, and back (dispatcher_state.h). A journal of the calls made
 * since it brings a restarted dispatcher back to where it was.
 *
 * A dispatcher that loads a snapshot behaves exactly as the one that
 * saved it: the same further calls give the same replies and the same
 * event lines. So everything that decides a future reply is in it: the id
 * counters, lineage and incarnation, the last call's clock, every worker
 * (its functions), dataset (graph, fingerprint, needs), job (options,
 * clients, the split ledger with each split's group, ranges and ackers
 * and the pending pool in its order, recoveries, sizing with its scaler's
 * whole state, the coordinated schedule, the autocaching pass, the
 * counters of dropped tasks; finished jobs too, for status), task, the
 * policy engine's clock and pool history, the pass ends nobody took, and
 * the autocaching planner's state lines (dispatcher_planner.c).
 *
 * What cannot be saved, and what a loaded dispatcher has instead:
 * - a job's worker count function set with
 *   cwi_dispatcher_set_worker_count (a pointer into the process): after
 *   a load such a job uses the configuration's worker_count again. Jobs
 *   left to the default decision or to the policy engine keep theirs.
 * - the autocaching planner's ctx, of a running pass and of a queued pass
 *   end: NULL after a load. A pass then runs to its end as planned, but
 *   its end is not queued (cwi_pass_finish needs the ctx), and a loaded
 *   pass end has ctx NULL (a taker must skip it).
 * - the pass on offer (offered) and the events buffer: both live only
 *   inside one call.
 *
 * Layout (version 3; version 2 is the same without the owners, and loads
 * with none; version 1 without the planner's lines too): every struct is a msgpack array of its fields in
 * a fixed order (the encoders below are the reference); strings that may
 * be absent are nil; a split still as cwi_ledger_init made it is nil. The
 * pending pool is written from its head, so a loaded ring starts at 0.
 * The loader checks every type, bound and reference (ids increasing, a
 * task's job and worker present, split indices within nsplits, the
 * ledger's counts equal to its splits' states, every pending split in
 * the pool once) and fails with CACHEW_ECORRUPT naming the field's path.
 *
 * docs/snapshot-format.md lists every record's fields.
 *
 * Size and time (test/check_snapshot.c prints them, -O2): a job of 10,000
 * splits with 2,500 leased and 2,500 acknowledged saves to 160 kB (31 B a
 * touched split, 1 B an untouched one) in about 1 ms and loads in 1 to
 * 1.5 ms.
 */
#include "dispatcher_int.h"
#include "dispatcher_autocache.h"
#include "../../core/msgpack_doc.h"

#include <inttypes.h>
#include <stdlib.h>

#define SNAP_MAGIC "cachew-dispatcher-snapshot"
#define SNAP_VERSION 3u

/* Fields of each record, version 3 (the top's in earlier versions:
 * TOP_FIELDS_V1, TOP_FIELDS_V2). */
enum {
	TOP_FIELDS = 20,
	TOP_FIELDS_V2 = 19,
	TOP_FIELDS_V1 = 18,
	OWNER_FIELDS = 3,
	WORKER_FIELDS = 10,
	FN_FIELDS = 4,
	DATASET_FIELDS = 8,
	JOB_FIELDS = 24,
	CLIENT_FIELDS = 17,
	OPS_FIELDS = 9,
	LEDGER_FIELDS = 9,
	SPLIT_FIELDS = 17,
	SIZING_FIELDS = 12,
	PASS_FIELDS = 6,
	RECOVERY_FIELDS = 2,
	TASK_FIELDS = 20,
	PASS_END_FIELDS = 4
};

/* Limits beyond the protocol's: sane sizes no real state reaches. */
#define SNAP_MAX_ITEMS (1u << 20)  /* workers, datasets, jobs, tasks... */
#define SNAP_MAX_RANGES (1u << 20) /* a group's skip ranges */

/* How a job's worker count is decided (struct job_sizing.count_fn). */
enum { COUNT_ENGINE = 0, COUNT_DEFAULT, COUNT_CONFIG };

/* ---- save ---------------------------------------------------------------- */

static void
put_u(cwi_strbuf *sb, uint64_t v)
{
	cwi_msgpack_put_uint(sb, v);
}

static void
put_fns(cwi_strbuf *sb, const cwi_fn_ident *fns, size_t n)
{
	cwi_msgpack_put_array(sb, n);
	for (size_t i = 0; i < n; i++) {
		cwi_msgpack_put_array(sb, FN_FIELDS);
		cwi_msgpack_put_cstr(sb, fns[i].name);
		cwi_msgpack_put_cstr(sb, fns[i].plugin);
		cwi_msgpack_put_cstr(sb, fns[i].version);
		cwi_msgpack_put_cstr(sb, fns[i].hash);
	}
}

static void
put_ops(cwi_strbuf *sb, const cwi_op_counters *ops, size_t n)
{
	cwi_msgpack_put_array(sb, n);
	for (size_t i = 0; i < n; i++) {
		const cwi_op_counters *o = &ops[i];
		cwi_msgpack_put_array(sb, OPS_FIELDS);
		cwi_msgpack_put_cstr(sb, o->name != NULL ? o->name : "");
		put_u(sb, o->elements);
		put_u(sb, o->bytes);
		put_u(sb, o->busy_ns);
		put_u(sb, o->wait_ns);
		put_u(sb, o->buffered);
		cwi_msgpack_put_int(sb, o->node);
		cwi_msgpack_put_int(sb, o->parallelism);
		cwi_msgpack_put_int(sb, o->buffer_limit);
	}
}

static void
put_bin_or_nil(cwi_strbuf *sb, const uint8_t *p, size_t len)
{
	if (p == NULL)
		cwi_msgpack_put_nil(sb);
	else
		cwi_msgpack_put_bin(sb, p, len);
}

static void
save_worker(cwi_strbuf *sb, const worker *w)
{
	cwi_msgpack_put_array(sb, WORKER_FIELDS);
	put_u(sb, w->id);
	cwi_msgpack_put_cstr(sb, w->address);
	cwi_msgpack_put_cstr(sb, w->build);
	put_u(sb, w->cores);
	put_u(sb, w->memory_bytes);
	put_u(sb, w->last_seen_ns);
	cwi_msgpack_put_f64(sb, w->cpu_use);
	cwi_msgpack_put_bool(sb, w->draining);
	cwi_msgpack_put_bool(sb, w->direct);
	put_fns(sb, w->fns, w->nfns);
}

static void
save_dataset(cwi_strbuf *sb, const dataset *ds)
{
	cwi_msgpack_put_array(sb, DATASET_FIELDS);
	put_u(sb, ds->id);
	put_u(sb, ds->fp.hi);
	put_u(sb, ds->fp.lo);
	put_bin_or_nil(sb, ds->graph, ds->graph_len);
	put_u(sb, ds->split_units);
	cwi_msgpack_put_bool(sb, ds->splittable);
	put_u(sb, ds->last_used_ns);
	put_fns(sb, ds->needs, ds->nneeds);
}

static void
save_client(cwi_strbuf *sb, const client *c)
{
	cwi_msgpack_put_array(sb, CLIENT_FIELDS);
	put_u(sb, c->id);
	cwi_msgpack_put_int(sb, c->consumer_index);
	put_u(sb, c->last_seen_ns);
	put_u(sb, c->batch_time_ns);
	put_u(sb, c->wait_time_ns);
	cwi_msgpack_put_f64(sb, c->buffer_fill);
	put_u(sb, c->round);
	put_u(sb, c->told_target);
	put_u(sb, c->elements_received);
	put_u(sb, c->bytes_received);
	cwi_msgpack_put_bool(sb, c->ready);
	put_u(sb, c->acc_batches);
	put_u(sb, c->acc_elapsed_ns);
	put_u(sb, c->acc_wait_ns);
	cwi_msgpack_put_f64(sb, c->acc_fill);
	put_u(sb, c->acc_reports);
	put_u(sb, c->nonce);
}

/* A split as cwi_ledger_init made it (written as nil). */
static bool
split_fresh(const split *s)
{
	return s->state == SPLIT_PENDING && !s->delivered && s->acks == 0 &&
	       s->part_acks == 0 && s->lease == 0 && s->orphan_ns == 0 &&
	       s->task_id == 0 && s->worker_id == 0 && s->group == NO_GROUP &&
	       s->gsize == 0 && !s->total_known && s->total == 0 &&
	       s->skip.n == 0 && s->recov_task == 0 && s->parts_need == 0 &&
	       s->credits == 0;
}

static void
save_split(cwi_strbuf *sb, const split *s)
{
	if (split_fresh(s)) {
		cwi_msgpack_put_nil(sb);
		return;
	}
	cwi_msgpack_put_array(sb, SPLIT_FIELDS);
	put_u(sb, s->state);
	cwi_msgpack_put_bool(sb, s->delivered);
	put_u(sb, s->acks);
	put_u(sb, s->lease);
	/* An acknowledged split keeps its count but not its ackers. */
	put_u(sb, s->part_acks);
	cwi_msgpack_put_array(sb, s->ackers != NULL ? s->part_acks : 0);
	for (uint32_t k = 0; s->ackers != NULL && k < s->part_acks; k++)
		put_u(sb, s->ackers[k]);
	put_u(sb, s->orphan_ns);
	put_u(sb, s->task_id);
	put_u(sb, s->worker_id);
	put_u(sb, s->group);
	put_u(sb, s->gsize);
	cwi_msgpack_put_bool(sb, s->total_known);
	put_u(sb, s->total);
	cwi_rset_put_msgpack(sb, &s->skip);
	put_u(sb, s->recov_task);
	put_u(sb, s->parts_need);
	put_u(sb, s->credits);
}

static void
save_ledger(cwi_strbuf *sb, const struct split_ledger *l)
{
	cwi_msgpack_put_array(sb, LEDGER_FIELDS);
	put_u(sb, l->nsplits);
	put_u(sb, l->nunits);
	put_u(sb, l->units_per_split);
	put_u(sb, l->npending);
	put_u(sb, l->nleased);
	put_u(sb, l->nacked);
	put_u(sb, l->nrecovering);
	if (l->splits == NULL) {
		cwi_msgpack_put_nil(sb);
		cwi_msgpack_put_array(sb, 0);
		return;
	}
	cwi_msgpack_put_array(sb, l->nsplits);
	for (uint64_t k = 0; k < l->nsplits; k++)
		save_split(sb, &l->splits[k]);
	cwi_msgpack_put_array(sb, l->ring_len);
	for (uint64_t i = 0; i < l->ring_len; i++)
		put_u(sb, l->ring[(l->ring_head + i) % l->nsplits]);
}

static void
save_sizing(cwi_strbuf *sb, const struct job_sizing *z)
{
	uint64_t how = z->count_fn == NULL		      ? COUNT_ENGINE
		     : z->count_fn == cwi_worker_count_default ? COUNT_DEFAULT
							       : COUNT_CONFIG;

	cwi_msgpack_put_array(sb, SIZING_FIELDS);
	put_u(sb, how);
	put_u(sb, z->target);
	cwi_msgpack_put_bool(sb, z->target_set);
	if (z->scaler != NULL)
		cwi_scaler_encode(z->scaler, sb);
	else
		cwi_msgpack_put_nil(sb);
	cwi_msgpack_put_cstr(sb, z->scale_name);
	cwi_msgpack_put_f64(sb, z->weight);
	put_u(sb, z->want);
	put_u(sb, z->granted);
	cwi_msgpack_put_bool(sb, z->settled);
	cwi_msgpack_put_bool(sb, z->epoch_start);
	put_u(sb, z->sample_ns);
	cwi_msgpack_put_cstr(sb, z->reason);
}

static void
save_pass(cwi_strbuf *sb, const struct job_pass *p)
{
	cwi_msgpack_put_array(sb, PASS_FIELDS);
	put_bin_or_nil(sb, p->graph, p->graph_len);
	put_u(sb, p->units);
	cwi_msgpack_put_f64(sb, p->worker_scale);
	cwi_msgpack_put_bool(sb, p->ended);
	cwi_msgpack_put_cstr(sb, p->cache_mode);
	cwi_msgpack_put_cstr(sb, p->cache_reason);
}

static void
save_job(cwi_strbuf *sb, const job *j)
{
	cwi_msgpack_put_array(sb, JOB_FIELDS);
	put_u(sb, j->id);
	cwi_msgpack_put_cstr(sb, j->name);
	put_u(sb, j->iteration);
	put_u(sb, j->ds->id);
	put_u(sb, (uint64_t)j->mode);
	put_u(sb, (uint64_t)j->compression);
	put_u(sb, j->seed);
	put_u(sb, j->epoch);
	put_u(sb, (uint64_t)j->policy);
	put_u(sb, j->num_workers);
	put_u(sb, j->num_consumers);
	cwi_msgpack_put_array(sb, j->nclients);
	for (size_t i = 0; i < j->nclients; i++)
		save_client(sb, &j->clients[i]);
	cwi_msgpack_put_bool(sb, j->data_done);
	cwi_msgpack_put_bool(sb, j->any_task_done);
	cwi_msgpack_put_bool(sb, j->finished);
	put_u(sb, j->elements);
	put_u(sb, j->bytes);
	put_ops(sb, j->ops_done, j->nops_done);
	save_ledger(sb, &j->ledger);
	save_sizing(sb, &j->sizing);
	cwi_msgpack_put_array(sb, 2);
	put_u(sb, j->coord.target);
	cwi_msgpack_put_bool(sb, j->coord.published);
	save_pass(sb, &j->pass);
	cwi_msgpack_put_bool(sb, j->exactly_once);
	cwi_msgpack_put_array(sb, j->nrecovs);
	for (size_t i = 0; i < j->nrecovs; i++) {
		cwi_msgpack_put_array(sb, RECOVERY_FIELDS);
		put_u(sb, j->recovs[i].task_id);
		cwi_msgpack_put_array(sb, j->recovs[i].nawait);
		for (size_t k = 0; k < j->recovs[i].nawait; k++)
			put_u(sb, j->recovs[i].await[k]);
	}
}

static void
save_task(cwi_strbuf *sb, const task *t)
{
	cwi_msgpack_put_array(sb, TASK_FIELDS);
	put_u(sb, t->id);
	put_u(sb, t->job->id);
	put_u(sb, t->w->id);
	put_u(sb, (uint64_t)t->state);
	put_u(sb, t->start_round);
	put_u(sb, t->end_round);
	put_u(sb, t->nleased);
	put_u(sb, t->elements);
	put_u(sb, t->bytes);
	put_u(sb, t->rate_at_ns);
	cwi_msgpack_put_f64(sb, t->elements_per_s);
	cwi_msgpack_put_f64(sb, t->bytes_per_s);
	put_ops(sb, t->ops, t->nops);
	put_u(sb, t->ops_leases);
	put_u(sb, t->run_ns);
	put_u(sb, t->stall_ns);
	put_u(sb, t->acc_run_ns);
	put_u(sb, t->acc_stall_ns);
	put_u(sb, t->lease_seq);
	put_u(sb, t->lease_group);
}

static void
save_pass_end(cwi_strbuf *sb, const cwi_pass_end *pe)
{
	cwi_msgpack_put_array(sb, PASS_END_FIELDS);
	put_u(sb, pe->job_id);
	cwi_msgpack_put_bool(sb, pe->complete);
	put_ops(sb, pe->ops, pe->nops);
	put_u(sb, pe->workers);
}

static void
save_owner(cwi_strbuf *sb, unsigned kind, uint64_t id, const char *owner)
{
	if (owner == NULL)
		return;
	cwi_msgpack_put_array(sb, OWNER_FIELDS);
	put_u(sb, kind);
	put_u(sb, id);
	cwi_msgpack_put_cstr(sb, owner);
}

/* The owners (version 3 on): [kind (0 a worker, 1 a job), id, identity]
 * of every worker, then every job, that has one. */
static void
save_owners(cwi_strbuf *sb, const cwi_dispatcher *d)
{
	size_t n = 0;

	for (size_t i = 0; i < d->workers.n; i++)
		n += WORKER(d, i)->owner != NULL;
	for (size_t i = 0; i < d->jobs.n; i++)
		n += JOB(d, i)->owner != NULL;
	cwi_msgpack_put_array(sb, n);
	for (size_t i = 0; i < d->workers.n; i++)
		save_owner(sb, 0, WORKER(d, i)->id, WORKER(d, i)->owner);
	for (size_t i = 0; i < d->jobs.n; i++)
		save_owner(sb, 1, JOB(d, i)->id, JOB(d, i)->owner);
}

cachew_err
cwi_dispatcher_snapshot_save(const cwi_dispatcher *d, uint8_t **buf,
    size_t *len)
{
	cwi_strbuf sb;
	char *out;
	cachew_err rv;

	*buf = NULL;
	*len = 0;
	cwi_strbuf_init(&sb);
	cwi_msgpack_put_array(&sb, TOP_FIELDS);
	cwi_msgpack_put_cstr(&sb, SNAP_MAGIC);
	put_u(&sb, SNAP_VERSION);
	put_u(&sb, d->lineage);
	put_u(&sb, d->incarnation);
	put_u(&sb, d->next_worker_id);
	put_u(&sb, d->next_dataset_id);
	put_u(&sb, d->next_job_id);
	put_u(&sb, d->next_client_id);
	put_u(&sb, d->next_task_id);
	put_u(&sb, d->now);
	put_u(&sb, d->next_decision_ns);
	put_u(&sb, d->pool_target);
	cwi_msgpack_put_array(&sb, d->npool_recent);
	for (uint32_t i = 0; i < d->npool_recent; i++)
		put_u(&sb, d->pool_recent[i]);
	cwi_msgpack_put_array(&sb, d->workers.n);
	for (size_t i = 0; i < d->workers.n; i++)
		save_worker(&sb, WORKER(d, i));
	cwi_msgpack_put_array(&sb, d->datasets.n);
	for (size_t i = 0; i < d->datasets.n; i++)
		save_dataset(&sb, DATASET(d, i));
	cwi_msgpack_put_array(&sb, d->jobs.n);
	for (size_t i = 0; i < d->jobs.n; i++)
		save_job(&sb, JOB(d, i));
	cwi_msgpack_put_array(&sb, d->tasks.n);
	for (size_t i = 0; i < d->tasks.n; i++)
		save_task(&sb, TASK(d, i));
	cwi_msgpack_put_array(&sb, d->npass_ends);
	for (size_t i = 0; i < d->npass_ends; i++)
		save_pass_end(&sb, &d->pass_ends[i]);
	cwi_msgpack_put_array(&sb, d->nplanner);
	for (size_t i = 0; i < d->nplanner; i++)
		cwi_msgpack_put_str(&sb, d->planner[i].text, d->planner[i].len);
	save_owners(&sb, d);
	rv = cwi_strbuf_finish(&sb, &out, len);
	if (rv != CACHEW_OK)
		return rv;
	*buf = (uint8_t *)out;
	return CACHEW_OK;
}

/* ---- load ---------------------------------------------------------------- */

/* Every getter below reads into a struct already attached to d, so that a
 * failure anywhere leaves nothing cwi_disp_clear does not free. */

/* An array of n entries for vector v (filled by the caller). */
static bool
vec_reserve(cwi_mp_doc *x, vec *v, uint64_t n)
{
	if (n == 0)
		return true;
	v->v = calloc((size_t)n, sizeof(*v->v));
	if (v->v == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	v->cap = (size_t)n;
	return true;
}

/* An id after `prev` (increasing) and below the counter `next`. */
static bool
load_id(cwi_mp_doc *x, const char *field, uint64_t prev, uint64_t next,
    uint64_t *id)
{
	if (!cwi_mp_doc_u64(x, field, 0, UINT64_MAX, id))
		return false;
	if (*id <= prev)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " does not follow %" PRIu64 " (ids increase)",
		    *id, prev);
	if (*id >= next)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, field,
		    "%" PRIu64 " was never given out (the next is %" PRIu64 ")",
		    *id, next);
	return true;
}

static bool
load_fns(cwi_mp_doc *x, const char *field, cwi_fn_ident **out, size_t *nout)
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, field, CWI_PROTO_MAX_FUNCTIONS, &n) || n == 0)
		return x->rv == CACHEW_OK;
	*out = calloc((size_t)n, sizeof(**out));
	if (*out == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, field, "out of memory");
	*nout = (size_t)n;
	for (size_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		cwi_fn_ident *f = &(*out)[i];
		size_t mark = cwi_mp_doc_enter_at(x, field, i);
		cwi_mp_doc_record(x, NULL, FN_FIELDS);
		cwi_mp_doc_text(x, "name", f->name, sizeof(f->name) - 1);
		cwi_mp_doc_text(x, "plugin", f->plugin, sizeof(f->plugin) - 1);
		cwi_mp_doc_text(x, "version", f->version,
		    sizeof(f->version) - 1);
		cwi_mp_doc_text(x, "hash", f->hash, sizeof(f->hash) - 1);
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

/* Operator rows; *nout counts the allocated ones at every point, so the
 * owner's free takes what a failure left. */
static bool
load_ops(cwi_mp_doc *x, const char *field, uint64_t max,
    cwi_op_counters **out, size_t *nout)
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, field, max, &n) || n == 0)
		return x->rv == CACHEW_OK;
	*out = calloc((size_t)n, sizeof(**out));
	if (*out == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, field, "out of memory");
	*nout = (size_t)n;
	for (size_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		cwi_op_counters *o = &(*out)[i];
		size_t mark = cwi_mp_doc_enter_at(x, field, i);
		cwi_mp_doc_record(x, NULL, OPS_FIELDS);
		cwi_mp_doc_strdup(x, "name", CWI_PROTO_MAX_NAME, false,
		    &o->name);
		cwi_mp_doc_u64(x, "elements", 0, UINT64_MAX, &o->elements);
		cwi_mp_doc_u64(x, "bytes", 0, UINT64_MAX, &o->bytes);
		cwi_mp_doc_u64(x, "busy_ns", 0, UINT64_MAX, &o->busy_ns);
		cwi_mp_doc_u64(x, "wait_ns", 0, UINT64_MAX, &o->wait_ns);
		cwi_mp_doc_u64(x, "buffered", 0, UINT64_MAX, &o->buffered);
		cwi_mp_doc_i64(x, "node", INT64_MIN, INT64_MAX, &o->node);
		cwi_mp_doc_i64(x, "parallelism", INT64_MIN, INT64_MAX,
		    &o->parallelism);
		cwi_mp_doc_i64(x, "buffer_limit", INT64_MIN, INT64_MAX,
		    &o->buffer_limit);
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

static bool
load_worker(cwi_mp_doc *x, cwi_dispatcher *d, uint64_t prev)
{
	worker *w = calloc(1, sizeof(*w));

	if (w == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	d->workers.v[d->workers.n++] = w;
	cwi_mp_doc_record(x, NULL, WORKER_FIELDS);
	load_id(x, "id", prev, d->next_worker_id, &w->id);
	cwi_mp_doc_strdup(x, "address", CWI_PROTO_MAX_NAME, false,
	    &w->address);
	cwi_mp_doc_strdup(x, "build", CWI_PROTO_MAX_NAME, true, &w->build);
	cwi_mp_doc_u32(x, "cores", 0, UINT32_MAX, &w->cores);
	cwi_mp_doc_u64(x, "memory_bytes", 0, UINT64_MAX, &w->memory_bytes);
	cwi_mp_doc_u64(x, "last_seen_ns", 0, UINT64_MAX, &w->last_seen_ns);
	cwi_mp_doc_f64(x, "cpu_use", &w->cpu_use);
	cwi_mp_doc_bool(x, "draining", &w->draining);
	cwi_mp_doc_bool(x, "direct", &w->direct);
	load_fns(x, "fns", &w->fns, &w->nfns);
	return x->rv == CACHEW_OK;
}

static bool
load_dataset(cwi_mp_doc *x, cwi_dispatcher *d, uint64_t prev)
{
	dataset *ds = calloc(1, sizeof(*ds));

	if (ds == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	d->datasets.v[d->datasets.n++] = ds;
	cwi_mp_doc_record(x, NULL, DATASET_FIELDS);
	load_id(x, "id", prev, d->next_dataset_id, &ds->id);
	cwi_mp_doc_u64(x, "fingerprint_hi", 0, UINT64_MAX, &ds->fp.hi);
	cwi_mp_doc_u64(x, "fingerprint_lo", 0, UINT64_MAX, &ds->fp.lo);
	cwi_mp_doc_bindup(x, "graph", CWI_PROTO_MAX_GRAPH, true, &ds->graph,
	    &ds->graph_len);
	cwi_mp_doc_u64(x, "split_units", 0, UINT64_MAX, &ds->split_units);
	cwi_mp_doc_bool(x, "splittable", &ds->splittable);
	cwi_mp_doc_u64(x, "last_used_ns", 0, UINT64_MAX, &ds->last_used_ns);
	load_fns(x, "needs", &ds->needs, &ds->nneeds);
	return x->rv == CACHEW_OK;
}

static bool
load_client(cwi_mp_doc *x, const cwi_dispatcher *d, const job *j,
    uint64_t prev, uint8_t *taken, client *c)
{
	int64_t lo = j->num_consumers > 0 ? 0 : -1;
	int64_t hi = j->num_consumers > 0 ? (int64_t)j->num_consumers - 1 : -1;

	cwi_mp_doc_record(x, NULL, CLIENT_FIELDS);
	load_id(x, "id", prev, d->next_client_id, &c->id);
	if (cwi_mp_doc_i64(x, "consumer_index", lo, hi, &c->consumer_index) &&
	    c->consumer_index >= 0) {
		if (taken[c->consumer_index])
			return cwi_mp_doc_fail(x, CACHEW_ECORRUPT,
			    "consumer_index", "%" PRId64 " is taken twice",
			    c->consumer_index);
		taken[c->consumer_index] = 1;
	}
	cwi_mp_doc_u64(x, "last_seen_ns", 0, UINT64_MAX, &c->last_seen_ns);
	cwi_mp_doc_u64(x, "batch_time_ns", 0, UINT64_MAX, &c->batch_time_ns);
	cwi_mp_doc_u64(x, "wait_time_ns", 0, UINT64_MAX, &c->wait_time_ns);
	cwi_mp_doc_f64(x, "buffer_fill", &c->buffer_fill);
	cwi_mp_doc_u64(x, "round", 0, UINT64_MAX, &c->round);
	cwi_mp_doc_u64(x, "told_target", 0, UINT64_MAX, &c->told_target);
	cwi_mp_doc_u64(x, "elements_received", 0, UINT64_MAX,
	    &c->elements_received);
	cwi_mp_doc_u64(x, "bytes_received", 0, UINT64_MAX,
	    &c->bytes_received);
	cwi_mp_doc_bool(x, "ready", &c->ready);
	cwi_mp_doc_u64(x, "acc_batches", 0, UINT64_MAX, &c->acc_batches);
	cwi_mp_doc_u64(x, "acc_elapsed_ns", 0, UINT64_MAX,
	    &c->acc_elapsed_ns);
	cwi_mp_doc_u64(x, "acc_wait_ns", 0, UINT64_MAX, &c->acc_wait_ns);
	cwi_mp_doc_f64(x, "acc_fill", &c->acc_fill);
	cwi_mp_doc_u32(x, "acc_reports", 0, UINT32_MAX, &c->acc_reports);
	cwi_mp_doc_u64(x, "nonce", 0, UINT64_MAX, &c->nonce);
	return x->rv == CACHEW_OK;
}

static bool
load_clients(cwi_mp_doc *x, const cwi_dispatcher *d, job *j)
{
	uint64_t n, prev = 0;
	uint8_t *taken;

	/* Consumer indices are below num_consumers, itself within the
	 * configured limit (checked by the caller). */
	if (!cwi_mp_doc_array(x, "clients", SNAP_MAX_ITEMS, &n) || n == 0)
		return x->rv == CACHEW_OK;
	j->clients = calloc((size_t)n, sizeof(*j->clients));
	taken = calloc((size_t)j->num_consumers + 1, 1);
	if (j->clients == NULL || taken == NULL) {
		free(taken);
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, "clients",
		    "out of memory");
	}
	j->nclients = j->capclients = (size_t)n;
	for (size_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		size_t mark = cwi_mp_doc_enter_at(x, "clients", i);
		load_client(x, d, j, prev, taken, &j->clients[i]);
		prev = j->clients[i].id;
		cwi_mp_doc_leave(x, mark);
	}
	free(taken);
	return x->rv == CACHEW_OK;
}

static bool
load_split(cwi_mp_doc *x, const cwi_dispatcher *d, uint64_t k,
    uint64_t nsplits, split *s)
{
	uint64_t n;
	uint32_t state;

	s->group = NO_GROUP;
	if (cwi_mp_doc_nil(x))
		return true; /* as cwi_ledger_init made it */
	cwi_mp_doc_record(x, NULL, SPLIT_FIELDS);
	cwi_mp_doc_u32(x, "state", SPLIT_PENDING, SPLIT_RECOVERING, &state);
	s->state = (uint8_t)state;
	cwi_mp_doc_bool(x, "delivered", &s->delivered);
	cwi_mp_doc_u32(x, "acks", 0, UINT32_MAX, &s->acks);
	cwi_mp_doc_u32(x, "lease", 0, UINT32_MAX, &s->lease);
	cwi_mp_doc_u32(x, "part_acks", 0, UINT32_MAX, &s->part_acks);
	/* The ackers are each part's client; only an acknowledged split
	 * drops them (and never reads them again). */
	if (cwi_mp_doc_array(x, "ackers", UINT32_MAX, &n) &&
	    n != s->part_acks && (n != 0 || s->state != SPLIT_ACKED))
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ackers",
		    "%" PRIu64 " clients for %" PRIu32 " parts", n,
		    s->part_acks);
	if (n > 0) {
		s->ackers = calloc((size_t)n, sizeof(*s->ackers));
		if (s->ackers == NULL)
			return cwi_mp_doc_fail(x, CACHEW_ENOMEM, "ackers",
			    "out of memory");
		s->ackers_cap = (uint32_t)n;
		for (uint32_t i = 0; i < n; i++)
			cwi_mp_doc_u64(x, "ackers", 1, d->next_client_id - 1,
			    &s->ackers[i]);
	}
	cwi_mp_doc_u64(x, "orphan_ns", 0, UINT64_MAX, &s->orphan_ns);
	cwi_mp_doc_u64(x, "task_id", 0, d->next_task_id - 1, &s->task_id);
	cwi_mp_doc_u64(x, "worker_id", 0, d->next_worker_id - 1,
	    &s->worker_id);
	/* A group is named by its first split, this one or an earlier. */
	if (cwi_mp_doc_u64(x, "group", 0, UINT64_MAX, &s->group) &&
	    s->group != NO_GROUP && s->group > k)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "group",
		    "%" PRIu64 " is after the split", s->group);
	cwi_mp_doc_u32(x, "gsize", 0,
	    (uint32_t)(nsplits - k > UINT32_MAX ? UINT32_MAX : nsplits - k),
	    &s->gsize);
	cwi_mp_doc_bool(x, "total_known", &s->total_known);
	cwi_mp_doc_u64(x, "total", 0, UINT64_MAX, &s->total);
	cwi_rset_get_msgpack(x, "skip", SNAP_MAX_RANGES, &s->skip);
	cwi_mp_doc_u64(x, "recov_task", 0, d->next_task_id - 1,
	    &s->recov_task);
	cwi_mp_doc_u32(x, "parts_need", 0, UINT32_MAX, &s->parts_need);
	cwi_mp_doc_u32(x, "credits", 0, UINT32_MAX, &s->credits);
	return x->rv == CACHEW_OK;
}

/* The ledger's counts are its splits' states; groups hold together (a
 * member's group starts at a split naming itself, whose size reaches the
 * member). */
static bool
check_splits(cwi_mp_doc *x, const struct split_ledger *l)
{
	uint64_t count[4] = {0, 0, 0, 0};

	for (uint64_t k = 0; k < l->nsplits; k++) {
		const split *s = &l->splits[k];
		count[s->state]++;
		if (s->group == NO_GROUP)
			continue;
		if (l->splits[s->group].group != s->group ||
		    k >= s->group + l->splits[s->group].gsize)
			return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "splits",
			    "split %" PRIu64 " is not within its group %"
			    PRIu64, k, s->group);
	}
	if (count[SPLIT_PENDING] != l->npending ||
	    count[SPLIT_LEASED] != l->nleased ||
	    count[SPLIT_ACKED] != l->nacked ||
	    count[SPLIT_RECOVERING] != l->nrecovering)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "splits",
		    "states (%" PRIu64 " pending, %" PRIu64 " leased, %" PRIu64
		    " acked, %" PRIu64 " recovering) differ from the counts",
		    count[SPLIT_PENDING], count[SPLIT_LEASED],
		    count[SPLIT_ACKED], count[SPLIT_RECOVERING]);
	return true;
}

/* The pending pool: every pending split exactly once, besides stale
 * entries of acknowledged ones (which never come back), so it never
 * needs more than nsplits slots. */
static bool
load_ring(cwi_mp_doc *x, struct split_ledger *l)
{
	uint64_t n;
	uint8_t *seen;

	if (!cwi_mp_doc_array(x, "ring", l->nsplits, &n))
		return false;
	l->ring = malloc((size_t)l->nsplits * sizeof(*l->ring));
	seen = calloc((size_t)l->nsplits, 1);
	if (l->ring == NULL || seen == NULL) {
		free(seen);
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, "ring",
		    "out of memory");
	}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t id;
		if (!cwi_mp_doc_u64(x, "ring", 0, l->nsplits - 1, &id))
			break;
		if (seen[id] ||
		    (l->splits[id].state != SPLIT_PENDING &&
			l->splits[id].state != SPLIT_ACKED)) {
			cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ring",
			    "split %" PRIu64 " is %s", id,
			    seen[id] ? "in the pool twice"
				     : "in the pool but neither pending "
				       "nor acknowledged");
			break;
		}
		seen[id] = 1;
		l->ring[l->ring_len++] = id;
	}
	for (uint64_t k = 0; k < l->nsplits && x->rv == CACHEW_OK; k++)
		if (l->splits[k].state == SPLIT_PENDING && !seen[k])
			cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ring",
			    "pending split %" PRIu64 " is not in the pool", k);
	free(seen);
	return x->rv == CACHEW_OK;
}

static bool
load_ledger_counts(cwi_mp_doc *x, struct split_ledger *l)
{
	uint64_t ups, want;

	cwi_mp_doc_u64(x, "nsplits", 0, CWI_PROTO_MAX_SPLITS, &l->nsplits);
	cwi_mp_doc_u64(x, "nunits", 0, UINT64_MAX, &l->nunits);
	cwi_mp_doc_u64(x, "units_per_split", 0, UINT64_MAX,
	    &l->units_per_split);
	cwi_mp_doc_u64(x, "npending", 0, l->nsplits, &l->npending);
	cwi_mp_doc_u64(x, "nleased", 0, l->nsplits, &l->nleased);
	cwi_mp_doc_u64(x, "nacked", 0, l->nsplits, &l->nacked);
	cwi_mp_doc_u64(x, "nrecovering", 0, l->nsplits, &l->nrecovering);
	if (x->rv != CACHEW_OK)
		return false;
	/* The units cut as cwi_ledger_init cuts them (none: no ledger). */
	ups = l->units_per_split;
	want = ups == 0 ? 0 : l->nunits / ups + (l->nunits % ups != 0);
	if ((ups == 0 && l->nunits != 0) || want != l->nsplits)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "nsplits",
		    "%" PRIu64 " splits do not cut %" PRIu64 " units by %"
		    PRIu64, l->nsplits, l->nunits, ups);
	if (l->npending + l->nleased + l->nacked + l->nrecovering !=
	    l->nsplits)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "nsplits",
		    "the states' counts do not add up to %" PRIu64,
		    l->nsplits);
	return true;
}

static bool
load_ledger(cwi_mp_doc *x, const cwi_dispatcher *d, struct split_ledger *l)
{
	size_t mark = cwi_mp_doc_enter(x, "ledger");
	uint64_t n;

	cwi_mp_doc_record(x, NULL, LEDGER_FIELDS);
	if (!load_ledger_counts(x, l))
		goto out;
	if (cwi_mp_doc_nil(x)) {
		/* No ledger (parallel_epochs, finished): no pool either. */
		cwi_mp_doc_record(x, "ring", 0);
		goto out;
	}
	if (!cwi_mp_doc_array(x, "splits", CWI_PROTO_MAX_SPLITS, &n))
		goto out;
	if (n != l->nsplits || n == 0) {
		cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "splits",
		    "%" PRIu64 " splits, nsplits is %" PRIu64, n, l->nsplits);
		goto out;
	}
	l->splits = calloc((size_t)n, sizeof(*l->splits));
	if (l->splits == NULL) {
		cwi_mp_doc_fail(x, CACHEW_ENOMEM, "splits", "out of memory");
		goto out;
	}
	for (uint64_t k = 0; k < n && x->rv == CACHEW_OK; k++) {
		size_t m = cwi_mp_doc_enter_at(x, "splits", k);
		load_split(x, d, k, n, &l->splits[k]);
		cwi_mp_doc_leave(x, m);
	}
	if (x->rv == CACHEW_OK && check_splits(x, l))
		load_ring(x, l);
	l->orphan_hint = l->nsplits; /* the first tick counts them */
out:
	cwi_mp_doc_leave(x, mark);
	return x->rv == CACHEW_OK;
}

static bool
load_sizing(cwi_mp_doc *x, const cwi_dispatcher *d, struct job_sizing *z)
{
	size_t mark = cwi_mp_doc_enter(x, "sizing");
	uint32_t how;

	cwi_mp_doc_record(x, NULL, SIZING_FIELDS);
	cwi_mp_doc_u32(x, "count", COUNT_ENGINE, COUNT_CONFIG, &how);
	z->count_fn = how == COUNT_ENGINE ? NULL
		    : how == COUNT_DEFAULT ? cwi_worker_count_default
					   : d->cfg.worker_count;
	z->count_ctx = how == COUNT_CONFIG ? d->cfg.worker_count_ctx : NULL;
	cwi_mp_doc_u32(x, "target", 0, UINT32_MAX, &z->target);
	cwi_mp_doc_bool(x, "target_set", &z->target_set);
	if (x->rv == CACHEW_OK && !cwi_mp_doc_nil(x)) {
		size_t m = cwi_mp_doc_enter(x, "scaler");
		cwi_scaler_decode(x, &z->scaler);
		cwi_mp_doc_leave(x, m);
	}
	cwi_mp_doc_text(x, "scale_name", z->scale_name,
	    sizeof(z->scale_name) - 1);
	if (cwi_mp_doc_f64(x, "weight", &z->weight) &&
	    !(z->weight >= 0 && z->weight <= 1e6))
		cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "weight",
		    "%g is not in 0..1e6", z->weight);
	cwi_mp_doc_u32(x, "want", 0, UINT32_MAX, &z->want);
	cwi_mp_doc_u32(x, "granted", 0, UINT32_MAX, &z->granted);
	cwi_mp_doc_bool(x, "settled", &z->settled);
	cwi_mp_doc_bool(x, "epoch_start", &z->epoch_start);
	cwi_mp_doc_u64(x, "sample_ns", 0, UINT64_MAX, &z->sample_ns);
	cwi_mp_doc_text(x, "reason", z->reason, sizeof(z->reason) - 1);
	cwi_mp_doc_leave(x, mark);
	return x->rv == CACHEW_OK;
}

static bool
load_pass(cwi_mp_doc *x, struct job_pass *p)
{
	size_t mark = cwi_mp_doc_enter(x, "pass");

	cwi_mp_doc_record(x, NULL, PASS_FIELDS);
	cwi_mp_doc_bindup(x, "graph", CWI_PROTO_MAX_GRAPH, true, &p->graph,
	    &p->graph_len);
	cwi_mp_doc_u64(x, "units", 0, UINT64_MAX, &p->units);
	cwi_mp_doc_f64(x, "worker_scale", &p->worker_scale);
	cwi_mp_doc_bool(x, "ended", &p->ended);
	cwi_mp_doc_text(x, "cache_mode", p->cache_mode,
	    sizeof(p->cache_mode) - 1);
	cwi_mp_doc_text(x, "cache_reason", p->cache_reason,
	    sizeof(p->cache_reason) - 1);
	cwi_mp_doc_leave(x, mark);
	return x->rv == CACHEW_OK;
}

static bool
load_recoveries(cwi_mp_doc *x, const cwi_dispatcher *d, job *j)
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, "recovs", SNAP_MAX_ITEMS, &n) || n == 0)
		return x->rv == CACHEW_OK;
	j->recovs = calloc((size_t)n, sizeof(*j->recovs));
	if (j->recovs == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, "recovs",
		    "out of memory");
	j->nrecovs = j->caprecovs = (size_t)n;
	for (size_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		recovery *r = &j->recovs[i];
		size_t mark = cwi_mp_doc_enter_at(x, "recovs", i);
		uint64_t na;
		cwi_mp_doc_record(x, NULL, RECOVERY_FIELDS);
		cwi_mp_doc_u64(x, "task_id", 1, d->next_task_id - 1,
		    &r->task_id);
		for (size_t k = 0; k < i && x->rv == CACHEW_OK; k++)
			if (j->recovs[k].task_id == r->task_id)
				cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "task_id",
				    "task %" PRIu64 " is recovered twice",
				    r->task_id);
		if (cwi_mp_doc_array(x, "await", SNAP_MAX_ITEMS, &na) &&
		    na > 0) {
			r->await = calloc((size_t)na, sizeof(*r->await));
			if (r->await == NULL)
				cwi_mp_doc_fail(x, CACHEW_ENOMEM, "await",
				    "out of memory");
			else
				r->nawait = (size_t)na;
		}
		for (size_t k = 0; k < r->nawait; k++)
			cwi_mp_doc_u64(x, "await", 1, d->next_client_id - 1,
			    &r->await[k]);
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* A recovering split waits for one of its job's recoveries. */
static bool
check_recovering(cwi_mp_doc *x, const job *j)
{
	const struct split_ledger *l = &j->ledger;

	if (l->splits == NULL || l->nrecovering == 0)
		return true;
	if (j->nrecovs > 64) {
		/* Many recoveries: compare against a sorted copy. */
		uint64_t *ids = malloc(j->nrecovs * sizeof(*ids));
		bool ok = true;
		if (ids == NULL)
			return cwi_mp_doc_fail(x, CACHEW_ENOMEM, "recovs",
			    "out of memory");
		for (size_t i = 0; i < j->nrecovs; i++)
			ids[i] = j->recovs[i].task_id;
		qsort(ids, j->nrecovs, sizeof(*ids), cmp_u64);
		for (uint64_t k = 0; k < l->nsplits && ok; k++)
			ok = l->splits[k].state != SPLIT_RECOVERING ||
			     bsearch(&l->splits[k].recov_task, ids, j->nrecovs,
				 sizeof(*ids), cmp_u64) != NULL;
		free(ids);
		if (ok)
			return true;
	} else {
		uint64_t k;
		for (k = 0; k < l->nsplits; k++) {
			size_t i = 0;
			if (l->splits[k].state != SPLIT_RECOVERING)
				continue;
			while (i < j->nrecovs &&
			       j->recovs[i].task_id != l->splits[k].recov_task)
				i++;
			if (i == j->nrecovs)
				break;
		}
		if (k == l->nsplits)
			return true;
	}
	return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ledger.splits",
	    "a recovering split names a task with no recovery");
}

/* What holds between a job's parts. */
static bool
check_job(cwi_mp_doc *x, const job *j)
{
	if (j->mode == CWI_MODE_PARALLEL_EPOCHS && j->ledger.nsplits != 0)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ledger",
		    "a parallel_epochs job has no splits");
	if (j->finished && j->ledger.splits != NULL)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ledger",
		    "a finished job keeps no splits");
	/* Its acks and leases index the splits: a count without them
	 * would be trusted past the end of nothing. */
	if (!j->finished && j->mode == CWI_MODE_DISTRIBUTED_EPOCH &&
	    (j->ledger.splits == NULL) != (j->ledger.nsplits == 0))
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "ledger",
		    "a running distributed_epoch job keeps its %" PRIu64
		    " splits", (uint64_t)j->ledger.nsplits);
	if (!j->finished && j->nclients == 0)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "clients",
		    "a running job has clients");
	if (j->exactly_once && (j->mode != CWI_MODE_DISTRIBUTED_EPOCH ||
				   j->num_consumers > 0))
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "exactly_once",
		    "only uncoordinated distributed_epoch jobs are");
	if (!j->exactly_once && j->nrecovs > 0)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "recovs",
		    "only an exactly-once job recovers");
	return check_recovering(x, j);
}

static bool
load_job_options(cwi_mp_doc *x, cwi_dispatcher *d, job *j, uint64_t prev)
{
	uint64_t ds_id;
	uint32_t mode, compression, policy;

	load_id(x, "id", prev, d->next_job_id, &j->id);
	cwi_mp_doc_strdup(x, "name", CWI_PROTO_MAX_NAME, true, &j->name);
	cwi_mp_doc_u64(x, "iteration", 0, UINT64_MAX, &j->iteration);
	if (cwi_mp_doc_u64(x, "dataset_id", 1, UINT64_MAX, &ds_id) &&
	    (j->ds = cwi_vec_find(&d->datasets, ds_id)) == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "dataset_id",
		    "dataset %" PRIu64 " does not exist", ds_id);
	cwi_mp_doc_u32(x, "mode", CWI_MODE_DISTRIBUTED_EPOCH,
	    CWI_MODE_PARALLEL_EPOCHS, &mode);
	j->mode = (cwi_processing_mode)mode;
	cwi_mp_doc_u32(x, "compression", CWI_COMPRESSION_NONE,
	    CWI_COMPRESSION_AUTO, &compression);
	j->compression = (cwi_compression)compression;
	cwi_mp_doc_u64(x, "seed", 0, UINT64_MAX, &j->seed);
	cwi_mp_doc_u64(x, "epoch", 0, UINT64_MAX, &j->epoch);
	cwi_mp_doc_u32(x, "policy", CWI_WORKERS_ALL, CWI_WORKERS_FIXED,
	    &policy);
	j->policy = (cwi_worker_policy)policy;
	cwi_mp_doc_u32(x, "num_workers", 0, UINT32_MAX, &j->num_workers);
	cwi_mp_doc_u32(x, "num_consumers", 0, d->cfg.max_consumers,
	    &j->num_consumers);
	return x->rv == CACHEW_OK;
}

static bool
load_job(cwi_mp_doc *x, cwi_dispatcher *d, uint64_t prev)
{
	job *j = calloc(1, sizeof(*j));

	if (j == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	d->jobs.v[d->jobs.n++] = j;
	j->coord.target = CWI_ROUND_NONE;
	cwi_mp_doc_record(x, NULL, JOB_FIELDS);
	if (!load_job_options(x, d, j, prev) || !load_clients(x, d, j))
		return false;
	cwi_mp_doc_bool(x, "data_done", &j->data_done);
	cwi_mp_doc_bool(x, "any_task_done", &j->any_task_done);
	cwi_mp_doc_bool(x, "finished", &j->finished);
	cwi_mp_doc_u64(x, "elements", 0, UINT64_MAX, &j->elements);
	cwi_mp_doc_u64(x, "bytes", 0, UINT64_MAX, &j->bytes);
	load_ops(x, "ops_done", CWI_PROTO_MAX_OPS, &j->ops_done,
	    &j->nops_done);
	if (x->rv != CACHEW_OK || !load_ledger(x, d, &j->ledger) ||
	    !load_sizing(x, d, &j->sizing))
		return false;
	cwi_mp_doc_record(x, "coord", 2);
	cwi_mp_doc_u64(x, "coord.target", 0, UINT64_MAX, &j->coord.target);
	cwi_mp_doc_bool(x, "coord.published", &j->coord.published);
	if (x->rv != CACHEW_OK || !load_pass(x, &j->pass))
		return false;
	cwi_mp_doc_bool(x, "exactly_once", &j->exactly_once);
	if (!load_recoveries(x, d, j))
		return false;
	cwi_ledger_shuffle_loaded(j);
	return check_job(x, j);
}

static bool
load_task(cwi_mp_doc *x, cwi_dispatcher *d, uint64_t prev)
{
	task *t = calloc(1, sizeof(*t));
	uint64_t job_id, worker_id;
	uint32_t state;

	if (t == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	d->tasks.v[d->tasks.n++] = t;
	cwi_mp_doc_record(x, NULL, TASK_FIELDS);
	load_id(x, "id", prev, d->next_task_id, &t->id);
	if (cwi_mp_doc_u64(x, "job_id", 1, UINT64_MAX, &job_id) &&
	    ((t->job = cwi_vec_find(&d->jobs, job_id)) == NULL ||
		t->job->finished))
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "job_id",
		    "job %" PRIu64 " %s", job_id,
		    t->job == NULL ? "does not exist" : "is finished");
	if (cwi_mp_doc_u64(x, "worker_id", 1, UINT64_MAX, &worker_id) &&
	    (t->w = cwi_vec_find(&d->workers, worker_id)) == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "worker_id",
		    "worker %" PRIu64 " does not exist", worker_id);
	cwi_mp_doc_u32(x, "state", CWI_TASK_ACTIVE, CWI_TASK_REMOVING, &state);
	t->state = (cwi_task_state)state;
	cwi_mp_doc_u64(x, "start_round", 0, UINT64_MAX, &t->start_round);
	cwi_mp_doc_u64(x, "end_round", 0, UINT64_MAX, &t->end_round);
	cwi_mp_doc_u64(x, "nleased", 0,
	    t->job != NULL ? t->job->ledger.nsplits : 0, &t->nleased);
	cwi_mp_doc_u64(x, "elements", 0, UINT64_MAX, &t->elements);
	cwi_mp_doc_u64(x, "bytes", 0, UINT64_MAX, &t->bytes);
	cwi_mp_doc_u64(x, "rate_at_ns", 0, UINT64_MAX, &t->rate_at_ns);
	cwi_mp_doc_f64(x, "elements_per_s", &t->elements_per_s);
	cwi_mp_doc_f64(x, "bytes_per_s", &t->bytes_per_s);
	load_ops(x, "ops", CWI_PROTO_MAX_OPS, &t->ops, &t->nops);
	cwi_mp_doc_u64(x, "ops_leases", 0, UINT64_MAX, &t->ops_leases);
	cwi_mp_doc_u64(x, "run_ns", 0, UINT64_MAX, &t->run_ns);
	cwi_mp_doc_u64(x, "stall_ns", 0, UINT64_MAX, &t->stall_ns);
	cwi_mp_doc_u64(x, "acc_run_ns", 0, UINT64_MAX, &t->acc_run_ns);
	cwi_mp_doc_u64(x, "acc_stall_ns", 0, UINT64_MAX, &t->acc_stall_ns);
	cwi_mp_doc_u64(x, "lease_seq", 0, UINT64_MAX, &t->lease_seq);
	/* NO_GROUP, or a split of its job (lease_again checks the rest). */
	if (cwi_mp_doc_u64(x, "lease_group", 0, UINT64_MAX, &t->lease_group) &&
	    t->lease_group != NO_GROUP && t->job != NULL &&
	    t->lease_group >= t->job->ledger.nsplits)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "lease_group",
		    "split %" PRIu64 " is beyond the job's %" PRIu64,
		    t->lease_group, t->job->ledger.nsplits);
	if (x->rv != CACHEW_OK)
		return false;
	/* Tasks come in id order: so do their job's and worker's lists. */
	if (!cwi_vec_push(&t->job->tasks, t) || !cwi_vec_push(&t->w->tasks, t))
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	t->w->ntasks++;
	return true;
}

/* A leased split's task, when it has one, is a task of its job, and a
 * task's nleased counts the splits leased to it. */
static bool
check_lessees(cwi_mp_doc *x, const cwi_dispatcher *d)
{
	uint64_t *nleased = calloc(d->tasks.n + 1, sizeof(*nleased));

	if (nleased == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < d->jobs.n && x->rv == CACHEW_OK; i++) {
		const job *j = JOB(d, i);
		for (uint64_t k = 0; j->ledger.splits != NULL &&
		     k < j->ledger.nsplits; k++) {
			const split *s = &j->ledger.splits[k];
			size_t t;
			if (s->state != SPLIT_LEASED || s->task_id == 0)
				continue;
			t = cwi_vec_index(&d->tasks, s->task_id);
			if (t == d->tasks.n || TASK(d, t)->job != j) {
				cwi_mp_doc_fail(x, CACHEW_ECORRUPT, NULL,
				    "jobs[%zu].ledger.splits[%" PRIu64 "]: "
				    "leased to task %" PRIu64 ", not a task "
				    "of job %" PRIu64, i, k, s->task_id, j->id);
				break;
			}
			nleased[t]++;
		}
	}
	for (size_t t = 0; t < d->tasks.n && x->rv == CACHEW_OK; t++)
		if (TASK(d, t)->nleased != nleased[t])
			cwi_mp_doc_fail(x, CACHEW_ECORRUPT, NULL,
			    "tasks[%zu].nleased: %" PRIu64 ", but %" PRIu64
			    " splits are leased to it", t, TASK(d, t)->nleased,
			    nleased[t]);
	free(nleased);
	return x->rv == CACHEW_OK;
}

static bool
load_pass_ends(cwi_mp_doc *x, cwi_dispatcher *d)
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, "pass_ends", SNAP_MAX_ITEMS, &n) || n == 0)
		return x->rv == CACHEW_OK;
	d->pass_ends = calloc((size_t)n, sizeof(*d->pass_ends));
	if (d->pass_ends == NULL)
		return cwi_mp_doc_fail(x, CACHEW_ENOMEM, "pass_ends",
		    "out of memory");
	d->npass_ends = d->cappass_ends = (size_t)n;
	for (size_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		cwi_pass_end *pe = &d->pass_ends[i];
		size_t mark = cwi_mp_doc_enter_at(x, "pass_ends", i);
		cwi_mp_doc_record(x, NULL, PASS_END_FIELDS);
		cwi_mp_doc_u64(x, "job_id", 1, d->next_job_id - 1, &pe->job_id);
		cwi_mp_doc_bool(x, "complete", &pe->complete);
		load_ops(x, "ops", SNAP_MAX_ITEMS, &pe->ops, &pe->nops);
		cwi_mp_doc_u32(x, "workers", 0, UINT32_MAX, &pe->workers);
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

/* The planner's state lines (version 2 on): each one a planner line of
 * its own key, the storage line only first. */
static bool
load_planner(cwi_mp_doc *x, cwi_dispatcher *d)
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, "planner", CWI_DCACHE_MAX_DATASETS + 1, &n))
		return false;
	for (uint64_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		size_t mark = cwi_mp_doc_enter_at(x, "planner", i);
		char line[CWI_DCACHE_LINE_MAX]; /* its '\n' not saved */
		cachew_err rv;

		if (cwi_mp_doc_text(x, NULL, line, sizeof(line) - 1)) {
			rv = cwi_planner_load_line(d, line, strlen(line));
			if (rv != CACHEW_OK)
				cwi_mp_doc_fail(x, rv, NULL, "%s",
				    cwi_errmsg_get());
		}
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

/* The owners (version 3 on): each names a worker or job loaded above
 * that has no owner yet. */
static bool
load_owners(cwi_mp_doc *x, cwi_dispatcher *d)
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, "owners", 2 * SNAP_MAX_ITEMS, &n))
		return false;
	for (uint64_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		size_t mark = cwi_mp_doc_enter_at(x, "owners", i);
		uint32_t kind = 0;
		uint64_t id = 0;
		char **owner = NULL;
		worker *w;
		job *j;

		cwi_mp_doc_record(x, NULL, OWNER_FIELDS);
		cwi_mp_doc_u32(x, "kind", 0, 1, &kind);
		cwi_mp_doc_u64(x, "id", 1, UINT64_MAX, &id);
		if (x->rv == CACHEW_OK && kind == 0 &&
		    (w = cwi_disp_find_worker(d, id)) != NULL)
			owner = &w->owner;
		if (x->rv == CACHEW_OK && kind == 1 &&
		    (j = cwi_disp_find_job(d, id)) != NULL)
			owner = &j->owner;
		if (x->rv == CACHEW_OK && (owner == NULL || *owner != NULL))
			cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "id", "%s %" PRIu64
			    " is not in the snapshot, or has an owner already",
			    kind == 0 ? "worker" : "job", id);
		else if (x->rv == CACHEW_OK)
			cwi_mp_doc_strdup(x, "identity",
			    CWI_PROTO_MAX_IDENTITY, false, owner);
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

/* Loads n entries of one registry vector with `one`. */
static bool
load_vec(cwi_mp_doc *x, cwi_dispatcher *d, const char *name, vec *v,
    bool (*one)(cwi_mp_doc *, cwi_dispatcher *, uint64_t))
{
	uint64_t n;

	if (!cwi_mp_doc_array(x, name, SNAP_MAX_ITEMS, &n) ||
	    !vec_reserve(x, v, n))
		return false;
	for (uint64_t i = 0; i < n && x->rv == CACHEW_OK; i++) {
		size_t mark = cwi_mp_doc_enter_at(x, name, i);
		one(x, d, i > 0 ? cwi_vec_entry_id(v->v[i - 1]) : 0);
		cwi_mp_doc_leave(x, mark);
	}
	return x->rv == CACHEW_OK;
}

/* The counters and the policy engine's state. */
static bool
load_head(cwi_mp_doc *x, cwi_dispatcher *d, uint64_t *version)
{
	char magic[sizeof(SNAP_MAGIC)];
	uint64_t nfields, n;
	unsigned want;

	if (!cwi_mp_doc_array(x, NULL, 64, &nfields))
		return false;
	if (!cwi_mp_doc_text(x, "magic", magic, sizeof(magic) - 1) ||
	    strcmp(magic, SNAP_MAGIC) != 0)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "magic",
		    "not a dispatcher snapshot");
	if (!cwi_mp_doc_u64(x, "version", 0, UINT64_MAX, version))
		return false;
	if (*version < 1 || *version > SNAP_VERSION)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, "version",
		    "%" PRIu64 " is not 1 to %u, the versions this build reads",
		    *version, SNAP_VERSION);
	want = *version == 1 ? TOP_FIELDS_V1
	       : *version == 2 ? TOP_FIELDS_V2 : TOP_FIELDS;
	if (nfields != want)
		return cwi_mp_doc_fail(x, CACHEW_ECORRUPT, NULL,
		    "%" PRIu64 " fields, %u expected", nfields, want);
	cwi_mp_doc_u64(x, "lineage", 0, UINT64_MAX, &d->lineage);
	cwi_mp_doc_u64(x, "incarnation", 0, UINT64_MAX, &d->incarnation);
	cwi_mp_doc_u64(x, "next_worker_id", 1, UINT64_MAX, &d->next_worker_id);
	cwi_mp_doc_u64(x, "next_dataset_id", 1, UINT64_MAX,
	    &d->next_dataset_id);
	cwi_mp_doc_u64(x, "next_job_id", 1, UINT64_MAX, &d->next_job_id);
	cwi_mp_doc_u64(x, "next_client_id", 1, UINT64_MAX, &d->next_client_id);
	cwi_mp_doc_u64(x, "next_task_id", 1, UINT64_MAX, &d->next_task_id);
	cwi_mp_doc_u64(x, "now", 0, UINT64_MAX, &d->now);
	cwi_mp_doc_u64(x, "next_decision_ns", 0, UINT64_MAX,
	    &d->next_decision_ns);
	cwi_mp_doc_u32(x, "pool_target", 0, UINT32_MAX, &d->pool_target);
	/* The last targets, newest first: a shorter history configured
	 * now keeps the newest. */
	if (!cwi_mp_doc_array(x, "pool_recent", 1000, &n))
		return false;
	for (uint64_t i = 0; i < n; i++) {
		uint32_t v;
		if (!cwi_mp_doc_u32(x, "pool_recent", 0, UINT32_MAX, &v))
			return false;
		if (i < d->cfg.pool_down_intervals)
			d->pool_recent[d->npool_recent++] = v;
	}
	return x->rv == CACHEW_OK;
}

static bool
dispatcher_empty(const cwi_dispatcher *d)
{
	return d->workers.n == 0 && d->datasets.n == 0 && d->jobs.n == 0 &&
	       d->tasks.n == 0 && d->npass_ends == 0 && d->nplanner == 0 &&
	       d->next_worker_id == 1 && d->next_dataset_id == 1 &&
	       d->next_job_id == 1 && d->next_client_id == 1 &&
	       d->next_task_id == 1;
}

cachew_err
cwi_dispatcher_snapshot_load(cwi_dispatcher *d, const uint8_t *buf,
    size_t len)
{
	uint64_t lineage = d->lineage, incarnation = d->incarnation, version;
	cwi_mp_doc x;

	if (!dispatcher_empty(d))
		return cwi_fail(CACHEW_EINVAL, "dispatcher snapshot: the "
					       "dispatcher is not empty");
	cwi_mp_doc_init(&x, "dispatcher snapshot", buf, len);
	if (load_head(&x, d, &version) &&
	    load_vec(&x, d, "workers", &d->workers, load_worker) &&
	    load_vec(&x, d, "datasets", &d->datasets, load_dataset) &&
	    load_vec(&x, d, "jobs", &d->jobs, load_job) &&
	    load_vec(&x, d, "tasks", &d->tasks, load_task) &&
	    check_lessees(&x, d) && load_pass_ends(&x, d) &&
	    (version == 1 || load_planner(&x, d)) &&
	    (version < 3 || load_owners(&x, d)))
		cwi_mp_doc_end(&x);
	cwi_disp_addrs_stale(d);
	if (x.rv == CACHEW_OK) {
		for (size_t i = 0; i < d->jobs.n; i++)
			d->nclients += JOB(d, i)->nclients;
		return CACHEW_OK;
	}
	cwi_disp_clear(d);
	d->lineage = lineage;
	d->incarnation = incarnation;
	return cwi_mp_doc_error(&x);
}
