/*
 * dispatcher_state.c - the dispatcher's state machine (see
 * dispatcher_state.h; docs/protocol.md, "Dispatcher rules"): the registry
 * of workers, datasets, jobs, clients and tasks, the events log, and the
 * entry point of every message. The structs and the parts kept in other
 * files are in dispatcher_int.h.
 */
#include "dispatcher_int.h"
#include "../../core/siphash.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

/* cwi_vec_find reads an entry's id as its first member. */
_Static_assert(offsetof(worker, id) == 0, "worker id first");
_Static_assert(offsetof(dataset, id) == 0, "dataset id first");
_Static_assert(offsetof(struct job, id) == 0, "job id first");
_Static_assert(offsetof(task, id) == 0, "task id first");

uint64_t
cwi_vec_entry_id(const void *p)
{
	return *(const uint64_t *)p;
}

bool
cwi_vec_push(vec *v, void *p)
{
	if (v->n == v->cap) {
		size_t cap = v->cap != 0 ? v->cap * 2 : 16;
		void **nv = realloc(v->v, cap * sizeof(*nv));
		if (nv == NULL)
			return false;
		v->v = nv;
		v->cap = cap;
	}
	v->v[v->n++] = p;
	return true;
}

size_t
cwi_vec_index(const vec *v, uint64_t id)
{
	size_t lo = 0, hi = v->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint64_t m = cwi_vec_entry_id(v->v[mid]);
		if (m == id)
			return mid;
		if (m < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return v->n;
}

void *
cwi_vec_find(const vec *v, uint64_t id)
{
	size_t i = cwi_vec_index(v, id);

	return i < v->n ? v->v[i] : NULL;
}

/* ---- workers by address ------------------------------------------------- */

/* Open addressing over (hash, worker) with tombstones, at most half full;
 * keyed SipHash so that addresses a peer picks cannot be made to collide.
 * The index is rebuilt from d->workers when it is marked stale (after a
 * snapshot load, a clear, or an allocation failure), so it never answers
 * from a set that differs from the vector's. */
struct worker_addrs {
	uint8_t key[16];
	struct addr_slot {
		uint64_t hash;
		worker *w; /* NULL: empty; ADDR_TOMB: deleted */
	} *slot;
	size_t cap, used; /* used counts tombstones */
	bool stale;
};

static worker addr_tomb;
#define ADDR_TOMB (&addr_tomb)

static uint64_t
addr_hash(const struct worker_addrs *a, const char *address)
{
	return cwi_siphash24(a->key, address, strlen(address));
}

static bool
addrs_put(struct worker_addrs *a, worker *w)
{
	uint64_t h;
	size_t i;

	if ((a->used + 1) * 2 > a->cap)
		return false;
	h = addr_hash(a, w->address);
	for (i = h & (a->cap - 1); a->slot[i].w != NULL &&
	     a->slot[i].w != ADDR_TOMB; i = (i + 1) & (a->cap - 1))
		;
	if (a->slot[i].w == NULL)
		a->used++;
	a->slot[i].hash = h;
	a->slot[i].w = w;
	return true;
}

/* Rebuilds the table for the workers (and room for as many again). */
static bool
addrs_rebuild(const cwi_dispatcher *d, struct worker_addrs *a)
{
	size_t cap = 64;
	struct addr_slot *v;

	while (cap < (d->workers.n + 1) * 4)
		cap *= 2;
	if ((v = calloc(cap, sizeof(*v))) == NULL)
		return false;
	free(a->slot);
	a->slot = v;
	a->cap = cap;
	a->used = 0;
	for (size_t i = 0; i < d->workers.n; i++)
		(void)addrs_put(a, WORKER(d, i));
	a->stale = false;
	return true;
}

static struct worker_addrs *
addrs_of(const cwi_dispatcher *d)
{
	struct worker_addrs *a = d->addrs;

	if (a == NULL || (a->stale && !addrs_rebuild(d, a)))
		return NULL;
	return a;
}

static void
addrs_add(cwi_dispatcher *d, worker *w)
{
	struct worker_addrs *a = d->addrs;

	if (a == NULL || a->stale)
		return; /* the next lookup rebuilds it */
	if (!addrs_put(a, w) && !addrs_rebuild(d, a))
		a->stale = true;
}

static void
addrs_del(cwi_dispatcher *d, const worker *w)
{
	struct worker_addrs *a = d->addrs;
	uint64_t h;

	if (a == NULL || a->stale)
		return;
	h = addr_hash(a, w->address);
	for (size_t i = h & (a->cap - 1); a->slot[i].w != NULL;
	     i = (i + 1) & (a->cap - 1))
		if (a->slot[i].w == w) {
			a->slot[i].w = ADDR_TOMB;
			return;
		}
}

worker *
cwi_disp_find_worker_by_address(const cwi_dispatcher *d, const char *address)
{
	struct worker_addrs *a = addrs_of(d);
	uint64_t h;

	if (a == NULL) { /* out of memory: the long way */
		for (size_t i = 0; i < d->workers.n; i++)
			if (strcmp(WORKER(d, i)->address, address) == 0)
				return WORKER(d, i);
		return NULL;
	}
	h = addr_hash(a, address);
	for (size_t i = h & (a->cap - 1); a->slot[i].w != NULL;
	     i = (i + 1) & (a->cap - 1))
		if (a->slot[i].w != ADDR_TOMB && a->slot[i].hash == h &&
		    strcmp(a->slot[i].w->address, address) == 0)
			return a->slot[i].w;
	return NULL;
}

void
cwi_disp_addrs_stale(cwi_dispatcher *d)
{
	if (d->addrs != NULL)
		d->addrs->stale = true;
}

void *
cwi_vec_find_near(const vec *v, uint64_t id, size_t *hint)
{
	size_t lo = *hint < v->n ? *hint : v->n, hi, step = 1;

	/* Invariant: the entries before lo are below id. */
	if (lo > 0 && cwi_vec_entry_id(v->v[lo - 1]) >= id)
		lo = 0; /* not rising: search from the start */
	for (hi = lo; hi < v->n && cwi_vec_entry_id(v->v[hi]) < id;
	     step *= 2) {
		lo = hi + 1;
		hi = v->n - lo > step ? lo + step : v->n;
	}
	/* hi is v->n or an entry at or above id: the first such is in
	 * [lo, hi] */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (cwi_vec_entry_id(v->v[mid]) < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	*hint = lo;
	if (lo < v->n && cwi_vec_entry_id(v->v[lo]) == id) {
		*hint = lo + 1;
		return v->v[lo];
	}
	return NULL;
}

void
cwi_vec_remove(vec *v, const void *p)
{
	size_t i = cwi_vec_index(v, cwi_vec_entry_id(p));

	if (i == v->n || v->v[i] != p)
		return;
	memmove(&v->v[i], &v->v[i + 1], (v->n - i - 1) * sizeof(*v->v));
	v->n--;
}

/* ---- events -------------------------------------------------------------- */

void
cwi_disp_ev_begin(cwi_dispatcher *d, const char *name)
{
	d->ev.len = 0;
	d->ev.oom = false;
	cwi_strbuf_printf(&d->ev, "{\"ts_ns\":%" PRIu64 ",\"event\":\"%s\"",
	    d->now, name);
}

void
cwi_disp_ev_u64(cwi_dispatcher *d, const char *key, uint64_t v)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":%" PRIu64, key, v);
}

void
cwi_disp_ev_i64(cwi_dispatcher *d, const char *key, int64_t v)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":%" PRId64, key, v);
}

/* A JSON string: quotes, backslashes and control bytes escaped; other
 * bytes (UTF-8 included) as they are. */
void
cwi_disp_ev_str(cwi_dispatcher *d, const char *key, const char *s)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":\"", key);
	for (const unsigned char *p = (const unsigned char *)s; *p != 0; p++) {
		if (*p == '"' || *p == '\\')
			cwi_strbuf_printf(&d->ev, "\\%c", *p);
		else if (*p < 0x20)
			cwi_strbuf_printf(&d->ev, "\\u%04x", *p);
		else
			cwi_strbuf_append(&d->ev, p, 1);
	}
	cwi_strbuf_puts(&d->ev, "\"");
}

void
cwi_disp_ev_ids(cwi_dispatcher *d, const char *key, const uint64_t *ids,
    size_t n)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":[", key);
	for (size_t i = 0; i < n; i++)
		cwi_strbuf_printf(&d->ev, "%s%" PRIu64, i > 0 ? "," : "",
		    ids[i]);
	cwi_strbuf_puts(&d->ev, "]");
}

void
cwi_disp_ev_end(cwi_dispatcher *d)
{
	cwi_strbuf_puts(&d->ev, "}");
	/* An event that ran out of memory is dropped, not half written;
	 * a replayed call's were written when it first ran. */
	if (d->ev.oom || d->quiet)
		return;
	if (d->cfg.event_fn != NULL)
		d->cfg.event_fn(d->cfg.event_ctx, d->ev.data, d->ev.len);
	if (d->cfg.event_file != NULL) {
		fwrite(d->ev.data, 1, d->ev.len, d->cfg.event_file);
		fputc('\n', d->cfg.event_file);
		if (!d->ev_hold)
			fflush(d->cfg.event_file);
	}
}

bool
cwi_disp_events_on(const cwi_dispatcher *d)
{
	return !d->quiet &&
	    (d->cfg.event_fn != NULL || d->cfg.event_file != NULL);
}

/* ---- create, destroy, lookups -------------------------------------------- */

void
cwi_dispatcher_config_default(cwi_dispatcher_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->worker_timeout_ns = 10000 * NS_PER_MS;
	cfg->client_timeout_ns = 10000 * NS_PER_MS;
	cfg->worker_heartbeat_ms = 1000;
	cfg->client_heartbeat_ms = 500;
	cfg->splits_per_worker = 8;
	cfg->max_lease = 4;
	cfg->lease_size = 4;
	cfg->lease_retry_ms = 100;
	cfg->coord_round_margin = 16;
	cfg->max_finished_jobs = 16;
	cfg->max_consumers = 1024;
	cwi_scale_config_default(&cfg->scale);
	cfg->decision_interval_ns = 500 * NS_PER_MS;
	cfg->pool_down_intervals = 4;
}

/* A random nonzero lineage (getrandom, else the clock and pid). */
static uint64_t
new_lineage(void)
{
	uint64_t x = 0;

	if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != (ssize_t)sizeof(x))
		x = cwi_mix64(cwi_now_ns() ^ ((uint64_t)getpid() << 32));
	return x != 0 ? x : 1;
}

cachew_err
cwi_dispatcher_create(cwi_dispatcher **out, const cwi_dispatcher_config *cfg)
{
	cwi_dispatcher_config def;
	cwi_dispatcher *d = calloc(1, sizeof(*d));

	if (d == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_dispatcher_config_default(&def);
	if (cfg != NULL) {
		d->cfg = *cfg;
#define DEF(f) if (d->cfg.f == 0) d->cfg.f = def.f
		DEF(worker_timeout_ns);
		DEF(client_timeout_ns);
		DEF(worker_heartbeat_ms);
		DEF(client_heartbeat_ms);
		DEF(splits_per_worker);
		DEF(max_lease);
		DEF(lease_size);
		DEF(lease_retry_ms);
		DEF(coord_round_margin);
		DEF(max_finished_jobs);
		DEF(max_consumers);
		DEF(decision_interval_ns);
		DEF(pool_down_intervals);
		if (d->cfg.scale.window_batches == 0)
			d->cfg.scale = def.scale; /* never filled in */
		if (d->cfg.pool_down_intervals > 1000)
			d->cfg.pool_down_intervals = 1000;
#undef DEF
	} else {
		d->cfg = def;
	}
	if (d->cfg.worker_count == NULL)
		d->cfg.worker_count = cwi_worker_count_default;
	d->next_worker_id = d->next_dataset_id = d->next_job_id = 1;
	d->next_client_id = d->next_task_id = 1;
	d->lineage = new_lineage();
	d->incarnation = 1;
	cwi_strbuf_init(&d->ev);
	d->pool_target = d->cfg.min_workers;
	d->pool_recent = calloc(d->cfg.pool_down_intervals,
	    sizeof(*d->pool_recent));
	d->addrs = calloc(1, sizeof(*d->addrs));
	if (d->pool_recent == NULL || d->addrs == NULL) {
		free(d->pool_recent);
		free(d->addrs);
		free(d);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	/* the table's key: a peer's addresses cannot aim at its buckets */
	if (getrandom(d->addrs->key, sizeof(d->addrs->key), GRND_NONBLOCK) !=
	    (ssize_t)sizeof(d->addrs->key)) {
		uint64_t k[2] = {cwi_now_ns(), (uint64_t)getpid()};
		memcpy(d->addrs->key, k, sizeof(k));
	}
	d->addrs->stale = true; /* built at the first lookup */
	*out = d;
	return CACHEW_OK;
}

static void
task_free(task *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->nops; i++)
		free(t->ops[i].name);
	free(t->ops);
	free(t);
}

static void
job_free(const cwi_dispatcher *d, job *j)
{
	if (j == NULL)
		return;
	cwi_ledger_free(&j->ledger);
	cwi_recover_free(j);
	cwi_counters_job_free(j);
	cwi_scaler_destroy(j->sizing.scaler);
	free(j->tasks.v);
	free(j->clients);
	free(j->name);
	free(j->owner);
	cwi_pass_free(d, j);
	free(j);
}

static void
dataset_free(dataset *ds)
{
	for (size_t i = 0; i < ds->ntenants; i++)
		free(ds->tenants[i]);
	free(ds->tenants);
	free(ds->graph);
	free(ds->needs);
	free(ds);
}

static void
worker_free(worker *w)
{
	if (w == NULL)
		return;
	free(w->address);
	free(w->build);
	free(w->owner);
	free(w->fns);
	free(w->tasks.v);
	free(w);
}

void
cwi_disp_clear(cwi_dispatcher *d)
{
	for (size_t i = 0; i < d->tasks.n; i++)
		task_free(TASK(d, i));
	for (size_t i = 0; i < d->jobs.n; i++)
		job_free(d, JOB(d, i));
	cwi_pass_ends_drop(d);
	cwi_planner_clear(d);
	for (size_t i = 0; i < d->datasets.n; i++)
		dataset_free(DATASET(d, i));
	for (size_t i = 0; i < d->workers.n; i++)
		worker_free(WORKER(d, i));
	free(d->tasks.v);
	free(d->jobs.v);
	free(d->datasets.v);
	free(d->workers.v);
	memset(&d->workers, 0, sizeof(d->workers));
	cwi_disp_addrs_stale(d);
	memset(&d->datasets, 0, sizeof(d->datasets));
	memset(&d->jobs, 0, sizeof(d->jobs));
	memset(&d->tasks, 0, sizeof(d->tasks));
	d->pass_ends = NULL;
	d->npass_ends = d->cappass_ends = 0;
	d->next_worker_id = d->next_dataset_id = d->next_job_id = 1;
	d->next_client_id = d->next_task_id = 1;
	d->nclients = 0;
	d->now = 0;
	d->next_decision_ns = 0;
	d->pool_target = d->cfg.min_workers;
	memset(d->pool_recent, 0,
	    d->cfg.pool_down_intervals * sizeof(*d->pool_recent));
	d->npool_recent = 0;
}

void
cwi_dispatcher_destroy(cwi_dispatcher *d)
{
	if (d == NULL)
		return;
	cwi_disp_clear(d);
	cwi_strbuf_free(&d->ev);
	free(d->pool_recent);
	if (d->addrs != NULL)
		free(d->addrs->slot);
	free(d->addrs);
	free(d);
}

worker *
cwi_disp_find_worker(const cwi_dispatcher *d, uint64_t id)
{
	return cwi_vec_find(&d->workers, id);
}

task *
cwi_disp_find_task(const cwi_dispatcher *d, uint64_t id)
{
	return cwi_vec_find(&d->tasks, id);
}

job *
cwi_disp_find_job(const cwi_dispatcher *d, uint64_t id)
{
	return cwi_vec_find(&d->jobs, id);
}

dataset *
cwi_disp_find_dataset(const cwi_dispatcher *d, uint64_t id)
{
	return cwi_vec_find(&d->datasets, id);
}

static client *
find_client(job *j, uint64_t id)
{
	for (size_t i = 0; i < j->nclients; i++)
		if (j->clients[i].id == id)
			return &j->clients[i];
	return NULL;
}

/* A live (unfinished) job and one of its clients, or ENOENT. */
static cachew_err
job_client(cwi_dispatcher *d, uint64_t job_id, uint64_t client_id, job **jp,
    client **cp)
{
	job *j = cwi_disp_find_job(d, job_id);

	if (j == NULL || j->finished)
		return cwi_fail(CACHEW_ENOENT, "job %" PRIu64 " is not running",
		    job_id);
	*cp = find_client(j, client_id);
	if (*cp == NULL)
		return cwi_fail(CACHEW_ENOENT, "client %" PRIu64 " is not in "
					       "job %" PRIu64
					       " (released or timed out)",
		    client_id, job_id);
	*jp = j;
	return CACHEW_OK;
}

uint32_t
cwi_disp_workers_available(const cwi_dispatcher *d)
{
	uint32_t n = 0;

	for (size_t i = 0; i < d->workers.n; i++)
		if (!WORKER(d, i)->draining)
			n++;
	return n;
}

/* ---- the end of a job's data --------------------------------------------- */

void
cwi_disp_epoch_check(cwi_dispatcher *d, job *j)
{
	if (j->data_done || j->mode != CWI_MODE_DISTRIBUTED_EPOCH ||
	    j->ledger.nacked < j->ledger.nsplits)
		return;
	j->data_done = true;
	cwi_disp_ev_begin(d, "epoch_done");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_u64(d, "splits", j->ledger.nsplits);
	cwi_disp_ev_end(d);
	cwi_pass_finish(d, j, true);
}

/* ---- tasks --------------------------------------------------------------- */

void
cwi_disp_task_event(cwi_dispatcher *d, const char *name, const task *t)
{
	cwi_disp_ev_begin(d, name);
	cwi_disp_ev_u64(d, "task_id", t->id);
	cwi_disp_ev_u64(d, "job_id", t->job->id);
	cwi_disp_ev_u64(d, "worker_id", t->w->id);
}

/* Forgets a task. Splits it still holds stay leased to its worker (which
 * delivered them, or they are released with it when it dies). */
void
cwi_disp_task_drop(cwi_dispatcher *d, task *t, const char *reason)
{
	cwi_disp_task_event(d, "task_removed", t);
	cwi_disp_ev_str(d, "reason", reason);
	cwi_disp_ev_end(d);
	cwi_recover_task_gone(d, t->job, t);
	cwi_ledger_task_gone(&t->job->ledger, t, d->now);
	t->w->ntasks--;
	cwi_counters_retire(t->job, t);
	cwi_vec_remove(&t->job->tasks, t);
	cwi_vec_remove(&t->w->tasks, t);
	cwi_vec_remove(&d->tasks, t);
	task_free(t);
}

static task *
task_add(cwi_dispatcher *d, job *j, worker *w)
{
	task *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return NULL;
	/* Its id is above every task's: each vector stays in id order. */
	t->id = d->next_task_id;
	if (!cwi_vec_push(&d->tasks, t)) {
		free(t);
		return NULL;
	}
	if (!cwi_vec_push(&j->tasks, t)) {
		d->tasks.n--;
		free(t);
		return NULL;
	}
	if (!cwi_vec_push(&w->tasks, t)) {
		d->tasks.n--;
		j->tasks.n--;
		free(t);
		return NULL;
	}
	d->next_task_id++;
	t->job = j;
	t->w = w;
	t->state = CWI_TASK_ACTIVE;
	t->start_round = 0;
	t->end_round = CWI_ROUND_NONE;
	t->lease_group = NO_GROUP;
	w->ntasks++;
	if (job_coordinated(j))
		cwi_sched_place(t);
	cwi_disp_task_event(d, "task_added", t);
	if (job_coordinated(j) && t->start_round != CWI_ROUND_NONE)
		cwi_disp_ev_u64(d, "start_round", t->start_round);
	cwi_disp_ev_end(d);
	if (t->state == CWI_TASK_STARTING)
		cwi_sched_open(d, j);
	return t;
}

/* Takes a task out of a running job. Returns true if it is gone already;
 * false if it stays, removing, until it finished what it holds. */
static bool
task_begin_remove(cwi_dispatcher *d, task *t, const char *reason)
{
	job *j = t->job;

	if (t->state == CWI_TASK_REMOVING)
		return false;
	if (job_coordinated(j)) {
		if (t->state == CWI_TASK_STARTING) {
			cwi_disp_task_drop(d, t, reason);
			return true;
		}
		/* Consumers keep reading it until the announced round. */
		t->state = CWI_TASK_REMOVING;
		cwi_sched_open(d, j);
	} else if (j->mode == CWI_MODE_PARALLEL_EPOCHS || t->nleased == 0) {
		cwi_disp_task_drop(d, t, reason);
		return true;
	} else {
		t->state = CWI_TASK_REMOVING;
	}
	cwi_disp_task_event(d, "task_removing", t);
	cwi_disp_ev_u64(d, "leased", t->nleased);
	cwi_disp_ev_str(d, "reason", reason);
	cwi_disp_ev_end(d);
	return false;
}

/* A task has delivered everything it will deliver. */
static void
task_done(cwi_dispatcher *d, task *t)
{
	job *j = t->job;

	if (j->mode == CWI_MODE_PARALLEL_EPOCHS)
		j->any_task_done = true;
	cwi_disp_task_drop(d, t, "done");
	if (j->mode == CWI_MODE_PARALLEL_EPOCHS && !j->data_done) {
		if (j->tasks.n > 0)
			return;
		j->data_done = true;
		cwi_disp_ev_begin(d, "epoch_done");
		cwi_disp_ev_u64(d, "job_id", j->id);
		cwi_disp_ev_end(d);
	}
}

/* Removing tasks (uncoordinated) go once every split they hold is
 * acknowledged. Returns whether any went: their workers are free for
 * other tasks. */
static bool
drop_finished_removals(cwi_dispatcher *d, job *j)
{
	bool dropped = false;

	for (size_t i = 0; i < j->tasks.n;) {
		task *t = OWN_TASK(j, i);
		if (t->state == CWI_TASK_REMOVING &&
		    !job_coordinated(j) && t->nleased == 0) {
			cwi_disp_task_drop(d, t, "removed");
			dropped = true;
			continue;
		}
		i++;
	}
	return dropped;
}

/* ---- a job's tasks to its target ----------------------------------------- */

static bool
worker_has_task_of(const worker *w, const job *j)
{
	if (w->tasks.n <= j->tasks.n) {
		for (size_t i = 0; i < w->tasks.n; i++)
			if (OWN_TASK(w, i)->job == j)
				return true;
		return false;
	}
	for (size_t i = 0; i < j->tasks.n; i++)
		if (OWN_TASK(j, i)->w == w)
			return true;
	return false;
}

/* The worker a new task of j goes to: not draining, with every function
 * j's graph needs, no task of j yet, the fewest tasks, then the lowest
 * id. */
static worker *
pick_worker(const cwi_dispatcher *d, const job *j)
{
	worker *best = NULL;

	for (size_t i = 0; i < d->workers.n; i++) {
		worker *w = WORKER(d, i);
		if (w->draining || worker_has_task_of(w, j) ||
		    !cwi_fns_worker_can_run(w, j->ds))
			continue;
		if (best == NULL || w->ntasks < best->ntasks)
			best = w;
	}
	return best;
}

/* The task to take away: on the busiest worker, then the newest. */
static task *
pick_victim(const job *j)
{
	task *best = NULL;

	for (size_t i = 0; i < j->tasks.n; i++) {
		task *t = OWN_TASK(j, i);
		if (t->state == CWI_TASK_REMOVING)
			continue;
		if (best == NULL || t->w->ntasks >= best->w->ntasks)
			best = t;
	}
	return best;
}

/* Brings the job's task count to what its decision says. */
static void
reconcile_job(cwi_dispatcher *d, job *j, uint32_t avail)
{
	cwi_job_view v;
	uint32_t target;

	if (j->finished || j->data_done || j->any_task_done)
		return;
	target = cwi_sizing_target(d, j, avail, &v);
	/* Coordinated, once every split is leased: a new task could only
	 * end at once, after making every consumer wait for a schedule
	 * change. */
	while (v.tasks < target &&
	       !(job_coordinated(j) && j->mode == CWI_MODE_DISTRIBUTED_EPOCH &&
		   j->ledger.splits != NULL && j->ledger.npending == 0)) {
		worker *w = pick_worker(d, j);
		if (w == NULL || task_add(d, j, w) == NULL)
			break;
		v.tasks++;
	}
	while (v.tasks > target) {
		task *t = pick_victim(j);
		if (t == NULL)
			break;
		task_begin_remove(d, t, "scaled_down");
		v.tasks--;
	}
	cwi_sched_update(d, j);
}


/* Every job's task count to its decision; with the policy engine, fair
 * share first, so workers that came or went, and jobs that started or
 * ended, move workers at once. */
void
cwi_disp_reconcile(cwi_dispatcher *d)
{
	/* Reconciling a job adds or removes tasks, never a worker. */
	uint32_t avail = cwi_disp_workers_available(d);

	cwi_sizing_share(d, false);
	for (size_t i = 0; i < d->jobs.n; i++)
		reconcile_job(d, JOB(d, i), avail);
}

/* ---- jobs ---------------------------------------------------------------- */

/* Drops the datasets no job refers to that nobody registered or used for
 * a client timeout: a long-running process (the embedded service) that
 * builds many pipelines keeps only those in use. A client between its
 * register and its job request is far quicker than that. */
static void
gc_datasets(cwi_dispatcher *d)
{
	for (size_t i = 0; i < d->datasets.n; i++)
		DATASET(d, i)->in_use = false;
	for (size_t k = 0; k < d->jobs.n; k++)
		JOB(d, k)->ds->in_use = true;
	for (size_t i = 0; i < d->datasets.n;) {
		dataset *ds = DATASET(d, i);
		bool used = ds->in_use || ds->last_used_ns >= d->now ||
			    d->now - ds->last_used_ns <= d->cfg.client_timeout_ns;

		if (used) {
			i++;
			continue;
		}
		cwi_disp_ev_begin(d, "dataset_dropped");
		cwi_disp_ev_u64(d, "dataset_id", ds->id);
		cwi_disp_ev_end(d);
		cwi_vec_remove(&d->datasets, ds);
		dataset_free(ds);
	}
}

/* Keeps at most max_finished_jobs finished jobs (for the status), and the
 * datasets in use. */
static void
gc_finished(cwi_dispatcher *d)
{
	size_t nfinished = 0;

	for (size_t i = 0; i < d->jobs.n; i++)
		if (JOB(d, i)->finished)
			nfinished++;
	for (size_t i = 0;
	     i < d->jobs.n && nfinished > d->cfg.max_finished_jobs;) {
		job *j = JOB(d, i);
		if (j->finished) {
			cwi_vec_remove(&d->jobs, j);
			job_free(d, j);
			nfinished--;
			continue;
		}
		i++;
	}
	gc_datasets(d);
}

static void
job_finish(cwi_dispatcher *d, job *j, const char *reason)
{
	cwi_pass_finish(d, j, false); /* no-op when the data was done */
	while (j->tasks.n > 0)
		cwi_disp_task_drop(d, OWN_TASK(j, 0), "job_finished");
	j->finished = true;
	j->coord.target = CWI_ROUND_NONE;
	cwi_ledger_free(&j->ledger);
	cwi_disp_ev_begin(d, "job_finished");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_str(d, "reason", reason);
	cwi_disp_ev_end(d);
}

/* A client leaves (released or timed out). A shared job that goes on gets
 * back the splits its workers delivered that nobody acknowledged: they may
 * have gone to this client. With no client left the job ends. */
static void
client_leave(cwi_dispatcher *d, job *j, client *c, const char *event)
{
	size_t idx = (size_t)(c - j->clients);
	uint64_t id = c->id;

	cwi_disp_ev_begin(d, event);
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_u64(d, "client_id", c->id);
	cwi_disp_ev_end(d);
	memmove(&j->clients[idx], &j->clients[idx + 1],
	    (j->nclients - idx - 1) * sizeof(*c));
	j->nclients--;
	d->nclients--;
	if (j->nclients == 0) {
		job_finish(d, j, strcmp(event, "client_released") == 0
			? "released"
			: "timed_out");
		return;
	}
	/* Coordinated consumers acknowledge their own part of every split
	 * (parts = num_consumers): one that leaves took nothing the others
	 * will miss, and releasing would give the others rounds again. */
	if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH && !j->data_done &&
	    !job_coordinated(j)) {
		cwi_recover_client_gone(d, j, id);
		cwi_ledger_release_delivered(d, j);
		drop_finished_removals(d, j);
	}
	cwi_sched_update(d, j);
}

/* Exactly once applies to uncoordinated distributed_epoch jobs. */
static bool
job_wants_exactly_once(const cwi_msg_job_get_or_create *r)
{
	return r->exactly_once && r->num_consumers == 0 &&
	       r->processing_mode == CWI_MODE_DISTRIBUTED_EPOCH;
}

static cachew_err
job_check_request(const cwi_dispatcher *d, const cwi_msg_job_get_or_create *r)
{
	if (r->num_consumers > d->cfg.max_consumers)
		return cwi_fail(CACHEW_EINVAL, "num_consumers %" PRIu32
					       " exceeds the limit of %" PRIu32,
		    r->num_consumers, d->cfg.max_consumers);
	if (r->num_consumers > 0 &&
	    (r->consumer_index < 0 ||
		r->consumer_index >= (int64_t)r->num_consumers))
		return cwi_fail(CACHEW_EINVAL, "consumer_index %" PRId64
					       " is not in 0..%" PRIu32,
		    r->consumer_index, r->num_consumers - 1);
	if (r->num_consumers == 0 && r->consumer_index != -1)
		return cwi_fail(CACHEW_EINVAL, "consumer_index %" PRId64
					       " without num_consumers",
		    r->consumer_index);
	if (r->worker_policy == CWI_WORKERS_FIXED && r->num_workers == 0)
		return cwi_fail(CACHEW_EINVAL, "worker policy 'fixed' needs "
					       "num_workers > 0");
	if (r->job_name != NULL && r->job_name[0] == '\0')
		return cwi_fail(CACHEW_EINVAL, "empty job name (leave it out "
					       "for a private job)");
	if (r->nresume > 0 && r->resume_units_per_split == 0)
		return cwi_fail(CACHEW_EINVAL, "resume: %zu groups without "
		    "resume_units_per_split", r->nresume);
	if (r->resume_units_per_split != 0 &&
	    (r->job_name != NULL || !job_wants_exactly_once(r)))
		return cwi_fail(CACHEW_ENOTSUP, "resuming a saved position: "
		    "only a private, uncoordinated, exactly-once "
		    "distributed_epoch job resumes (this one is %s)",
		    r->job_name != NULL ? "named" : !r->exactly_once
		    ? "not exactly-once" : r->num_consumers > 0
		    ? "coordinated" : "parallel_epochs");
	if (d->cfg.autoscale) {
		cwi_scale_config c;
		return cwi_sizing_check(d, r, &c);
	}
	return CACHEW_OK;
}

/* A named job that asks the same as r, or EINVAL naming the difference. */
static cachew_err
job_check_shared(const job *j, const cwi_msg_job_get_or_create *r)
{
	if (j->ds->id != r->dataset_id)
		return cwi_fail(CACHEW_EINVAL, "job '%s' runs dataset %" PRIu64
					       ", not %" PRIu64,
		    j->name, j->ds->id, r->dataset_id);
	if (j->mode != r->processing_mode)
		return cwi_fail(CACHEW_EINVAL, "job '%s' runs %s, not %s",
		    j->name, cwi_processing_mode_name(j->mode),
		    cwi_processing_mode_name(r->processing_mode));
	if (j->num_consumers != r->num_consumers)
		return cwi_fail(CACHEW_EINVAL, "job '%s' has num_consumers "
					       "%" PRIu32 ", not %" PRIu32,
		    j->name, j->num_consumers, r->num_consumers);
	if (j->exactly_once != job_wants_exactly_once(r))
		return cwi_fail(CACHEW_EINVAL, "job '%s' is %s, this client "
		    "asks for %s (a client built before exactly-once "
		    "delivery, or exactly_once=false, cannot share its job)",
		    j->name, j->exactly_once ? "exactly-once" : "at-least-once",
		    j->exactly_once ? "at-least-once" : "exactly-once");
	return CACHEW_OK;
}

static void
job_created_event(cwi_dispatcher *d, const job *j)
{
	cwi_disp_ev_begin(d, "job_created");
	cwi_disp_ev_u64(d, "job_id", j->id);
	if (j->name != NULL) {
		cwi_disp_ev_str(d, "name", j->name);
		cwi_disp_ev_u64(d, "iteration", j->iteration);
	}
	cwi_disp_ev_u64(d, "dataset_id", j->ds->id);
	cwi_disp_ev_str(d, "processing_mode",
	    cwi_processing_mode_name(j->mode));
	cwi_disp_ev_u64(d, "num_consumers", j->num_consumers);
	if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH) {
		cwi_disp_ev_u64(d, "splits", j->ledger.nsplits);
		cwi_disp_ev_u64(d, "units_per_split",
		    j->ledger.units_per_split);
	}
	if (j->sizing.scaler != NULL) {
		cwi_disp_ev_str(d, "policy", j->sizing.scale_name);
		cwi_disp_ev_u64(d, "want", j->sizing.want);
	}
	if (j->pass.cache_mode[0] != '\0') {
		cwi_disp_ev_str(d, "cache_mode", j->pass.cache_mode);
		cwi_disp_ev_str(d, "cache", j->pass.cache_reason);
	}
	cwi_disp_ev_end(d);
}

static cachew_err
job_create(cwi_dispatcher *d, const cwi_msg_job_get_or_create *r,
    dataset *ds, job **out)
{
	job *j = calloc(1, sizeof(*j));
	uint64_t resumed[2] = {0, 0}; /* groups done, formed again */
	cachew_err rv;

	if (j == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	j->ds = ds;
	ds->last_used_ns = d->now;
	j->iteration = r->iteration;
	j->mode = r->processing_mode;
	j->compression = r->compression;
	j->seed = r->seed;
	j->epoch = r->epoch;
	j->policy = r->worker_policy;
	j->num_workers = r->num_workers;
	j->num_consumers = r->num_consumers;
	j->exactly_once = job_wants_exactly_once(r);
	j->sizing.count_fn = d->cfg.worker_count;
	j->sizing.count_ctx = d->cfg.worker_count_ctx;
	j->coord.target = CWI_ROUND_NONE;
	if (r->job_name != NULL &&
	    (j->name = cwi_strdup(r->job_name)) == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH) {
		cwi_pass_take(d, j);
		rv = cwi_ledger_init(d, j);
		if (rv == CACHEW_OK && r->resume_units_per_split != 0)
			rv = cwi_ledger_resume(j, r, resumed);
		if (rv != CACHEW_OK)
			goto fail;
	}
	if (d->cfg.autoscale) {
		rv = cwi_sizing_init(d, j, r);
		if (rv != CACHEW_OK)
			goto fail;
	}
	j->id = d->next_job_id;
	if (!cwi_vec_push(&d->jobs, j)) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	d->next_job_id++;
	job_created_event(d, j);
	if (r->resume_units_per_split != 0) {
		cwi_disp_ev_begin(d, "job_resumed");
		cwi_disp_ev_u64(d, "job_id", j->id);
		cwi_disp_ev_u64(d, "splits", j->ledger.nsplits);
		cwi_disp_ev_u64(d, "groups_done", resumed[0]);
		cwi_disp_ev_u64(d, "groups_partial", resumed[1]);
		cwi_disp_ev_u64(d, "splits_acked", j->ledger.nacked);
		cwi_disp_ev_end(d);
	}
	*out = j;
	return CACHEW_OK;
fail:
	job_free(d, j);
	return rv;
}

static client *
client_add(cwi_dispatcher *d, job *j, int64_t consumer_index, uint64_t now)
{
	client *c;

	if (j->nclients == j->capclients) {
		size_t cap = j->capclients != 0 ? j->capclients * 2 : 4;
		client *nc = realloc(j->clients, cap * sizeof(*nc));
		if (nc == NULL)
			return NULL;
		j->clients = nc;
		j->capclients = cap;
	}
	c = &j->clients[j->nclients++];
	d->nclients++;
	memset(c, 0, sizeof(*c));
	c->id = d->next_client_id++;
	c->consumer_index = consumer_index;
	c->last_seen_ns = now;
	c->told_target = CWI_ROUND_NONE;
	cwi_disp_ev_begin(d, "client_joined");
	cwi_disp_ev_u64(d, "job_id", j->id);
	cwi_disp_ev_u64(d, "client_id", c->id);
	if (consumer_index >= 0)
		cwi_disp_ev_i64(d, "consumer_index", consumer_index);
	cwi_disp_ev_end(d);
	return c;
}

job *
cwi_disp_find_named_job(const cwi_dispatcher *d, const char *name,
    uint64_t iteration)
{
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		if (!j->finished && j->name != NULL &&
		    strcmp(j->name, name) == 0 && j->iteration == iteration)
			return j;
	}
	return NULL;
}

cachew_err
cwi_dispatcher_job_get_or_create(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_job_get_or_create *req,
    cwi_msg_job_get_or_create_reply *rep)
{
	dataset *ds = cwi_disp_find_dataset(d, req->dataset_id);
	job *j = NULL;
	client *c = NULL;
	bool created = false;
	cachew_err rv;

	cwi_pmsg_body_init(CWI_MSG_JOB_GET_OR_CREATE_REPLY, rep);
	d->now = now_ns;
	if (ds == NULL)
		return cwi_fail(CACHEW_ENOENT, "dataset %" PRIu64 " is not "
					       "registered",
		    req->dataset_id);
	rv = job_check_request(d, req);
	if (rv != CACHEW_OK)
		return rv;
	/* A join sent again (its reply was lost): the client it made. */
	for (size_t i = 0; req->nonce != 0 && req->client_id == 0 && c == NULL &&
	     i < d->jobs.n; i++) {
		job *k = JOB(d, i);
		for (size_t m = 0; !k->finished && m < k->nclients; m++)
			if (k->clients[m].nonce == req->nonce &&
			    k->ds == ds) {
				j = k;
				c = &k->clients[m];
				break;
			}
	}
	if (j == NULL && req->job_name != NULL)
		j = cwi_disp_find_named_job(d, req->job_name, req->iteration);
	if (c != NULL) {
		/* found above */
	} else if (j != NULL) {
		rv = job_check_shared(j, req);
		if (rv != CACHEW_OK)
			return rv;
		/* A retry of a request whose reply was lost. */
		if (req->client_id != 0)
			c = find_client(j, req->client_id);
		for (size_t i = 0; c == NULL && req->consumer_index >= 0 &&
		     i < j->nclients;
		     i++)
			if (j->clients[i].consumer_index == req->consumer_index)
				return cwi_fail(CACHEW_EEXIST,
				    "job '%s': consumer %" PRId64 " is "
				    "taken by client %" PRIu64,
				    j->name, req->consumer_index,
				    j->clients[i].id);
	} else {
		rv = cwi_fns_check_job(d, ds);
		if (rv == CACHEW_OK)
			rv = job_create(d, req, ds, &j);
		if (rv != CACHEW_OK)
			return rv;
		created = true;
	}
	if (c == NULL) {
		c = client_add(d, j, req->consumer_index, now_ns);
		if (c == NULL) {
			if (created) {
				cwi_vec_remove(&d->jobs, j);
				job_free(d, j);
			}
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		c->nonce = req->nonce;
	}
	c->last_seen_ns = now_ns;
	rep->job_id = j->id;
	rep->client_id = c->id;
	rep->created = created;
	rep->processing_mode = j->mode;
	rep->num_consumers = j->num_consumers;
	rep->compression = j->compression;
	rep->heartbeat_interval_ms = cwi_disp_client_interval_ms(d);
	rep->units = j->ledger.nunits;
	rep->units_per_split = j->ledger.units_per_split;
	if (created) {
		if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH)
			cwi_disp_epoch_check(d, j); /* an empty dataset */
		cwi_disp_reconcile(d);
	}
	return CACHEW_OK;
}

/* Clients a dispatcher hears at the configured interval; beyond, the
 * interval grows with their number, so that an idle dispatcher answers
 * about as many heartbeats per second with thousands of clients (issue
 * 18: 2,000 embedded iterators heartbeating every 100 ms kept a core
 * busy), up to a quarter of the client timeout. */
#define CLIENTS_AT_BASE_INTERVAL 200u

uint32_t
cwi_disp_client_interval_ms(const cwi_dispatcher *d)
{
	uint64_t ms = d->cfg.client_heartbeat_ms;
	uint64_t cap = d->cfg.client_timeout_ns / NS_PER_MS / 4;

	if (d->nclients > CLIENTS_AT_BASE_INTERVAL)
		ms = ms * d->nclients / CLIENTS_AT_BASE_INTERVAL;
	if (ms > cap)
		ms = cap > d->cfg.client_heartbeat_ms ? cap
						      : d->cfg.client_heartbeat_ms;
	return (uint32_t)ms;
}

cachew_err
cwi_dispatcher_job_release(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_job_release *req)
{
	job *j;
	client *c;
	cachew_err rv;

	d->now = now_ns;
	rv = job_client(d, req->job_id, req->client_id, &j, &c);
	if (rv != CACHEW_OK)
		return rv;
	cwi_counters_received(j, c, req->elements_received,
	    req->bytes_received);
	client_leave(d, j, c, "client_released");
	cwi_disp_reconcile(d);
	gc_finished(d);
	return CACHEW_OK;
}

/* ---- splits: lease and acknowledge --------------------------------------- */

/* A worker's request about one of its tasks: the task, or ENOENT. */
static cachew_err
worker_task(cwi_dispatcher *d, uint64_t worker_id, uint64_t task_id,
    task **out)
{
	worker *w = cwi_disp_find_worker(d, worker_id);
	task *t = cwi_disp_find_task(d, task_id);

	if (w == NULL)
		return cwi_fail(CACHEW_ENOENT, "worker %" PRIu64 " is not "
					       "registered",
		    worker_id);
	if (t == NULL || t->w != w)
		return cwi_fail(CACHEW_ENOENT, "task %" PRIu64 " is not "
					       "assigned to worker %" PRIu64,
		    task_id, worker_id);
	*out = t;
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_split_lease(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_split_lease *req, cwi_msg_split_lease_reply *rep)
{
	task *t;
	cachew_err rv;

	cwi_pmsg_body_init(CWI_MSG_SPLIT_LEASE_REPLY, rep);
	d->now = now_ns;
	rv = worker_task(d, req->worker_id, req->task_id, &t);
	if (rv != CACHEW_OK)
		return rv;
	if (t->job->mode != CWI_MODE_DISTRIBUTED_EPOCH)
		return cwi_fail(CACHEW_EINVAL, "task %" PRIu64 " belongs to a "
					       "parallel_epochs job: it reads "
					       "its whole input, without "
					       "splits",
		    t->id);
	t->w->last_seen_ns = now_ns;
	/* Exactly once: a request sent again gets the group it got; a
	 * second group would orphan the first, which the worker never
	 * heard of (its reply was lost in a dispatcher restart). */
	if (t->job->exactly_once && req->seq != 0 && req->seq == t->lease_seq &&
	    cwi_ledger_lease_again(d, t, rep))
		return CACHEW_OK;
	rv = cwi_ledger_lease(d, t, req->max_splits, rep);
	if (rv == CACHEW_OK && t->job->exactly_once) {
		t->lease_seq = req->seq;
		t->lease_group = rep->nsplits > 0 ? rep->group : NO_GROUP;
	}
	return rv;
}

bool
cwi_dispatcher_lease_waits(cwi_dispatcher *d, const cwi_msg_split_lease *req)
{
	worker *w = cwi_disp_find_worker(d, req->worker_id);
	task *t = cwi_disp_find_task(d, req->task_id);

	return w != NULL && t != NULL && t->w == w &&
	       t->job->mode == CWI_MODE_DISTRIBUTED_EPOCH &&
	       cwi_ledger_lease_waits(d, t);
}

cachew_err
cwi_dispatcher_task_counters(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_task_counters *req)
{
	task *t;
	cachew_err rv;

	d->now = now_ns;
	rv = worker_task(d, req->worker_id, req->task_id, &t);
	if (rv != CACHEW_OK)
		return rv;
	t->w->last_seen_ns = now_ns;
	return cwi_counters_task_ops(t, req->ops, req->nops, req->ops_leases);
}

/* Applies acknowledgements (checked by cwi_ledger_acks_check), then what
 * follows from them: the end of the epoch, removing tasks that hold no
 * split any more. */
static void
acks_apply(cwi_dispatcher *d, job *j, const client *c, const uint64_t *ids,
    const uint64_t *parts, const uint64_t *leases, size_t n)
{
	if (n == 0)
		return;
	cwi_ledger_ack(d, j, c->id, ids, parts, leases, n);
	cwi_disp_epoch_check(d, j);
	if (drop_finished_removals(d, j))
		cwi_disp_reconcile(d);
}

cachew_err
cwi_dispatcher_split_ack(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_split_ack *req, cwi_msg_ok *rep)
{
	job *j;
	client *c;
	cachew_err rv;

	d->now = now_ns;
	rv = job_client(d, req->job_id, req->client_id, &j, &c);
	if (rv == CACHEW_OK && req->nparts != 0 &&
	    req->nparts != req->nsplit_ids)
		rv = cwi_fail(CACHEW_EINVAL, "split_ack: %zu parts for %zu "
		    "splits", req->nparts, req->nsplit_ids);
	if (rv == CACHEW_OK && req->nleases != 0 &&
	    req->nleases != req->nsplit_ids)
		rv = cwi_fail(CACHEW_EINVAL, "split_ack: %zu leases for %zu "
		    "splits", req->nleases, req->nsplit_ids);
	if (rv == CACHEW_OK)
		rv = cwi_ledger_acks_check(j, req->split_ids,
		    req->nparts != 0 ? req->parts : NULL, req->nsplit_ids);
	if (rv != CACHEW_OK)
		return rv;
	c->last_seen_ns = now_ns;
	acks_apply(d, j, c, req->split_ids,
	    req->nparts != 0 ? req->parts : NULL,
	    req->nleases != 0 ? req->leases : NULL, req->nsplit_ids);
	if (rep != NULL)
		rep->job_finished = j->data_done &&
				    j->mode == CWI_MODE_DISTRIBUTED_EPOCH;
	return CACHEW_OK;
}

/* ---- clients ------------------------------------------------------------- */

/* The reply's task list: every task of the job, in id order. */
static cachew_err
fill_task_list(const cwi_dispatcher *d, const job *j,
    cwi_msg_client_heartbeat_reply *rep)
{
	if (j->tasks.n == 0)
		return CACHEW_OK;
	rep->tasks = calloc(j->tasks.n, sizeof(*rep->tasks));
	if (rep->tasks == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < j->tasks.n; i++) {
		const task *t = OWN_TASK(j, i);
		cwi_task_info *ti;
		ti = &rep->tasks[rep->ntasks++];
		ti->task_id = t->id;
		ti->worker_id = t->w->id;
		ti->state = t->state;
		ti->start_round = t->start_round;
		ti->end_round = t->end_round;
		ti->direct = t->w->direct && j->num_consumers == 0 &&
			     j->mode == CWI_MODE_DISTRIBUTED_EPOCH;
		ti->secret = cwi_owner_task_secret(d, t->id);
		ti->address = cwi_strdup(t->w->address);
		if (ti->address == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_client_heartbeat(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_client_heartbeat *req, cwi_msg_client_heartbeat_reply *rep)
{
	job *j;
	client *c;
	cachew_err rv;

	cwi_pmsg_body_init(CWI_MSG_CLIENT_HEARTBEAT_REPLY, rep);
	d->now = now_ns;
	rv = job_client(d, req->job_id, req->client_id, &j, &c);
	if (rv == CACHEW_OK)
		rv = cwi_ledger_acks_check(j, req->acked_splits, NULL,
		    req->nacked_splits);
	if (rv == CACHEW_OK)
		rv = cwi_recover_check(j, req);
	/* A round near the top would wrap the schedule's target past
	 * CWI_ROUND_NONE (a change announced for it never comes). */
	if (rv == CACHEW_OK && req->round > CWI_ROUND_NONE / 2)
		rv = cwi_fail(CACHEW_EPROTO, "client_heartbeat: round %llu "
		    "is past any a consumer reads",
		    (unsigned long long)req->round);
	if (rv != CACHEW_OK)
		return rv;
	c->last_seen_ns = now_ns;
	c->round = req->round;
	cwi_sizing_client_report(c, req);
	cwi_counters_received(j, c, req->elements_received,
	    req->bytes_received);
	acks_apply(d, j, c, req->acked_splits, NULL, NULL,
	    req->nacked_splits);
	/* After the acks: a group they complete needs no replay. */
	cwi_recover_report(d, j, c, req);
	if (j->finished)
		return cwi_fail(CACHEW_ENOENT, "job %" PRIu64 " is not "
		    "running", j->id);
	rv = cwi_recover_stop_list(j, c, rep);
	if (rv != CACHEW_OK)
		return rv;
	if (job_coordinated(j)) {
		cwi_sched_heartbeat(d, j, c);
		cwi_sched_update(d, j);
	}
	rep->job_finished = j->data_done;
	rep->heartbeat_interval_ms = cwi_disp_client_interval_ms(d);
	rep->splits_total = j->ledger.nsplits;
	rep->splits_acked = j->ledger.nacked;
	if (j->coord.target != CWI_ROUND_NONE) {
		rep->block_round = j->coord.target;
		c->told_target = j->coord.target;
	}
	rv = fill_task_list(d, j, rep);
	if (rep->ntasks > 0)
		j->coord.published = true;
	if (rv == CACHEW_OK)
		(void)cwi_counters_job_ops(j, rep); /* metrics only */
	return rv;
}

/* ---- workers ------------------------------------------------------------- */

/* A worker is gone: what it leased and nobody acknowledged is pending
 * again (after a deregistration from an uncoordinated job, what it had
 * not delivered), its tasks go, and the jobs get tasks elsewhere. */
static void
worker_remove(cwi_dispatcher *d, worker *w, const char *event,
    const char *reason)
{
	cwi_disp_ev_begin(d, event);
	cwi_disp_ev_u64(d, "worker_id", w->id);
	if (reason != NULL)
		cwi_disp_ev_str(d, "reason", reason);
	cwi_disp_ev_end(d);
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		if (!j->finished)
			cwi_ledger_release_worker(d, j, w->id, reason);
	}
	while (w->tasks.n > 0)
		cwi_disp_task_drop(d, OWN_TASK(w, 0), "worker_gone");
	addrs_del(d, w);
	cwi_vec_remove(&d->workers, w);
	worker_free(w);
	for (size_t i = 0; i < d->jobs.n; i++)
		cwi_sched_update(d, JOB(d, i));
}

cachew_err
cwi_dispatcher_worker_register(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_register *req, cwi_msg_worker_register_reply *rep)
{
	cachew_err rv = CACHEW_OK;
	worker *w, *old;

	cwi_pmsg_body_init(CWI_MSG_WORKER_REGISTER_REPLY, rep);
	d->now = now_ns;
	if (req->address == NULL || req->address[0] == '\0')
		return cwi_fail(CACHEW_EINVAL, "worker_register: empty "
					       "address");
	old = cwi_disp_find_worker_by_address(d, req->address);
	w = calloc(1, sizeof(*w));
	/* Its id before it joins the vector, which stays in id order. */
	if (w != NULL)
		w->id = d->next_worker_id;
	if (w == NULL || (w->address = cwi_strdup(req->address)) == NULL ||
	    (req->build != NULL &&
		(w->build = cwi_strdup(req->build)) == NULL) ||
	    (rv = cwi_fns_of_worker(w, req)) != CACHEW_OK ||
	    !cwi_vec_push(&d->workers, w)) {
		worker_free(w);
		return rv != CACHEW_OK ? rv
				       : cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	w->direct = req->direct;
	/* A worker restarted faster than its timeout: the old incarnation
	 * is gone, and so is what it held. */
	if (old != NULL)
		worker_remove(d, old, "worker_dead", "replaced");
	addrs_add(d, w);
	d->next_worker_id++;
	w->cores = req->cores;
	w->memory_bytes = req->memory_bytes;
	w->last_seen_ns = now_ns;
	cwi_disp_ev_begin(d, "worker_registered");
	cwi_disp_ev_u64(d, "worker_id", w->id);
	cwi_disp_ev_str(d, "address", w->address);
	cwi_disp_ev_u64(d, "cores", w->cores);
	if (w->nfns > 0)
		cwi_disp_ev_u64(d, "functions", w->nfns);
	cwi_disp_ev_end(d);
	rep->worker_id = w->id;
	rep->heartbeat_interval_ms = d->cfg.worker_heartbeat_ms;
	rep->worker_timeout_ms =
	    (uint32_t)(d->cfg.worker_timeout_ns / NS_PER_MS);
	cwi_disp_reconcile(d);
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_worker_deregister(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_deregister *req)
{
	worker *w = cwi_disp_find_worker(d, req->worker_id);

	d->now = now_ns;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOENT, "worker %" PRIu64 " is not "
					       "registered",
		    req->worker_id);
	worker_remove(d, w, "worker_deregistered", NULL);
	cwi_disp_reconcile(d);
	return CACHEW_OK;
}

/* Counters, delivery progress and completion of one reported task. */
static void
task_report(cwi_dispatcher *d, task *t, const cwi_task_report *r,
    uint64_t now)
{
	job *j = t->job;
	uint64_t de, db;

	/* Counters only grow; smaller ones mean the worker started over.
	 * (The job's own counts are what its clients received.) */
	de = r->elements >= t->elements ? r->elements - t->elements
					: r->elements;
	db = r->bytes >= t->bytes ? r->bytes - t->bytes : r->bytes;
	if (t->rate_at_ns != 0 && now > t->rate_at_ns) {
		double dt = (double)(now - t->rate_at_ns) / 1e9;
		t->elements_per_s = (double)de / dt;
		t->bytes_per_s = (double)db / dt;
	}
	t->rate_at_ns = now;
	t->elements = r->elements;
	t->bytes = r->bytes;
	cwi_sizing_task_busy(t, r);
	/* metrics only: keep the old ones on ENOMEM */
	(void)cwi_counters_task_ops(t, r->ops, r->nops, r->ops_leases);
	cwi_ledger_delivered(&j->ledger, t, r->splits_delivered,
	    r->nsplits_delivered);
	if (r->done)
		task_done(d, t);
}


/* A task's start order, as a heartbeat reply or the embedded service's
 * job hook gives it to its worker. */
static cachew_err
fill_task_def(const cwi_dispatcher *d, const task *t, cwi_task_def *td)
{
	const dataset *ds = t->job->ds;
	const uint8_t *graph = t->job->pass.graph != NULL ? t->job->pass.graph
							  : ds->graph;
	size_t len = t->job->pass.graph != NULL ? t->job->pass.graph_len
						: ds->graph_len;

	td->task_id = t->id;
	td->job_id = t->job->id;
	td->dataset_id = ds->id;
	td->fingerprint = ds->fp;
	td->processing_mode = t->job->mode;
	td->compression = t->job->compression;
	td->seed = t->job->seed;
	td->epoch = t->job->epoch;
	td->exactly_once = t->job->exactly_once;
	td->num_consumers = t->job->num_consumers;
	td->lease_size = d->cfg.lease_size;
	td->secret = cwi_owner_task_secret(d, t->id);
	td->graph = malloc(len);
	if (td->graph == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	memcpy(td->graph, graph, len);
	td->graph_len = len;
	return CACHEW_OK;
}

/* Tasks the worker should have and did not report (start) and tasks it
 * reported that are not its (stop). Its reported tasks are stamped with
 * this heartbeat's number first, so that each list costs one pass. */
static cachew_err
fill_worker_reply(cwi_dispatcher *d, const worker *w,
    const cwi_msg_worker_heartbeat *req, cwi_msg_worker_heartbeat_reply *rep)
{
	uint64_t seq = ++d->hb_seq;
	size_t nstart = 0, nstop = 0, hint = 0;
	cachew_err rv;

	for (size_t i = 0; i < req->ntasks; i++) {
		task *t = cwi_vec_find_near(&d->tasks, req->tasks[i].task_id,
		    &hint);
		if (t == NULL || t->w != w)
			nstop++;
		else
			t->hb_seen = seq;
	}
	for (size_t i = 0; i < w->tasks.n; i++)
		if (OWN_TASK(w, i)->hb_seen != seq)
			nstart++;
	if (nstart > 0)
		rep->start = calloc(nstart, sizeof(*rep->start));
	if (nstop > 0)
		rep->stop = calloc(nstop, sizeof(*rep->stop));
	if ((nstart > 0 && rep->start == NULL) ||
	    (nstop > 0 && rep->stop == NULL))
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < w->tasks.n; i++) {
		const task *t = OWN_TASK(w, i);
		if (t->hb_seen == seq)
			continue;
		rv = fill_task_def(d, t, &rep->start[rep->nstart++]);
		if (rv != CACHEW_OK)
			return rv;
	}
	hint = 0;
	for (size_t i = 0; i < req->ntasks && rep->nstop < nstop; i++) {
		task *t = cwi_vec_find_near(&d->tasks, req->tasks[i].task_id,
		    &hint);
		if (t == NULL || t->w != w)
			rep->stop[rep->nstop++] = req->tasks[i].task_id;
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_job_starts(cwi_dispatcher *d, uint64_t job_id,
    uint64_t worker_id, cwi_msg_worker_heartbeat_reply *rep)
{
	const job *j = cwi_disp_find_job(d, job_id);
	size_t n = 0;
	cachew_err rv;

	if (j == NULL)
		return CACHEW_OK;
	for (size_t i = 0; i < j->tasks.n; i++) {
		const task *t = OWN_TASK(j, i);
		if (t->w != NULL && t->w->id == worker_id &&
		    t->state != CWI_TASK_REMOVING)
			n++;
	}
	if (n == 0)
		return CACHEW_OK;
	if ((rep->start = calloc(n, sizeof(*rep->start))) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < j->tasks.n && rep->nstart < n; i++) {
		const task *t = OWN_TASK(j, i);
		if (t->w == NULL || t->w->id != worker_id ||
		    t->state == CWI_TASK_REMOVING)
			continue;
		rv = fill_task_def(d, t, &rep->start[rep->nstart++]);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_worker_heartbeat(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_heartbeat *req, cwi_msg_worker_heartbeat_reply *rep)
{
	worker *w = cwi_disp_find_worker(d, req->worker_id);

	cwi_pmsg_body_init(CWI_MSG_WORKER_HEARTBEAT_REPLY, rep);
	d->now = now_ns;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOENT, "worker %" PRIu64 " is not "
					       "registered (timed out, or the "
					       "dispatcher restarted): "
					       "register again",
		    req->worker_id);
	size_t ntasks = d->tasks.n, hint = 0;
	bool drain = req->draining && !w->draining;

	w->last_seen_ns = now_ns;
	w->cpu_use = req->cpu_use;
	if (drain) {
		w->draining = true;
		cwi_disp_ev_begin(d, "worker_draining");
		cwi_disp_ev_u64(d, "worker_id", w->id);
		cwi_disp_ev_end(d);
		for (size_t i = 0; i < w->tasks.n;) {
			if (task_begin_remove(d, OWN_TASK(w, i), "draining"))
				continue;
			i++;
		}
	}
	for (size_t i = 0; i < req->ntasks; i++) {
		task *t = cwi_vec_find_near(&d->tasks, req->tasks[i].task_id,
		    &hint);
		/* task_report may drop t (done), shifting the tasks after
		 * it: the hint's check then starts the next lookup over */
		if (t != NULL && t->w == w)
			task_report(d, t, &req->tasks[i], now_ns);
	}
	/* Tasks went (done, drained): their jobs and workers are sized
	 * again now, so that the reply carries what replaces them. Rates
	 * alone wait for the tick (every 50 ms), which reconciles every job:
	 * doing so at each heartbeat made 10,000 workers' heartbeats cost
	 * jobs x workers. */
	if (drain || d->tasks.n != ntasks)
		cwi_disp_reconcile(d);
	return fill_worker_reply(d, w, req, rep);
}

/* ---- datasets ------------------------------------------------------------ */

cachew_err
cwi_dispatcher_dataset_register(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_dataset_register *req, cwi_msg_dataset_register_reply *rep)
{
	cachew_err rv = CACHEW_OK;
	dataset *ds;
	char hex[33];

	cwi_pmsg_body_init(CWI_MSG_DATASET_REGISTER_REPLY, rep);
	d->now = now_ns;
	if (req->graph_len == 0)
		return cwi_fail(CACHEW_EINVAL, "dataset_register: empty graph");
	/* The same fingerprint is the same elements, not the same graph:
	 * a pass-through operator's parameters (cache_put's root,
	 * tfrecord_write's path) and performance ones are not hashed. So a
	 * registration reuses a dataset only when its graph is the same
	 * bytes too, or one tenant's job would write where another's graph
	 * says. */
	for (size_t i = 0; i < d->datasets.n; i++) {
		ds = DATASET(d, i);
		if (ds->fp.hi == req->fingerprint.hi &&
		    ds->fp.lo == req->fingerprint.lo &&
		    ds->graph_len == req->graph_len &&
		    memcmp(ds->graph, req->graph, req->graph_len) == 0) {
			ds->last_used_ns = now_ns;
			rep->dataset_id = ds->id;
			return CACHEW_OK;
		}
	}
	ds = calloc(1, sizeof(*ds));
	if (ds == NULL || (ds->graph = malloc(req->graph_len)) == NULL) {
		free(ds);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	memcpy(ds->graph, req->graph, req->graph_len);
	ds->graph_len = req->graph_len;
	/* The user functions its jobs' workers must have; a graph that does
	 * not decode could run on no worker. */
	rv = cwi_fns_of_dataset(ds);
	ds->id = d->next_dataset_id;
	if (rv != CACHEW_OK || !cwi_vec_push(&d->datasets, ds)) {
		dataset_free(ds);
		return rv != CACHEW_OK ? rv
				       : cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	ds->fp = req->fingerprint;
	ds->split_units = req->splittable ? req->split_units : 0;
	ds->splittable = req->splittable;
	ds->last_used_ns = now_ns;
	ds->tenants_known = true;
	d->next_dataset_id++;
	cachew_fingerprint_hex(&ds->fp, hex);
	cwi_disp_ev_begin(d, "dataset_registered");
	cwi_disp_ev_u64(d, "dataset_id", ds->id);
	cwi_disp_ev_str(d, "fingerprint", hex);
	if (ds->splittable)
		cwi_disp_ev_u64(d, "split_units", ds->split_units);
	else
		cwi_disp_ev_i64(d, "split_units", -1);
	cwi_disp_ev_end(d);
	rep->dataset_id = ds->id;
	rep->created = true;
	return CACHEW_OK;
}

/* ---- time ---------------------------------------------------------------- */

static bool
expired(uint64_t now, uint64_t last, uint64_t timeout)
{
	return now > last && now - last > timeout;
}

void
cwi_dispatcher_tick(cwi_dispatcher *d, uint64_t now_ns)
{
	d->now = now_ns;
	for (size_t i = 0; i < d->workers.n;) {
		worker *w = WORKER(d, i);
		if (expired(now_ns, w->last_seen_ns,
			d->cfg.worker_timeout_ns)) {
			worker_remove(d, w, "worker_dead", "timeout");
			continue;
		}
		i++;
	}
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		if (!j->finished && !job_coordinated(j))
			cwi_ledger_release_orphans(d, j, now_ns);
		for (size_t k = 0; !j->finished && k < j->nclients;) {
			client *c = &j->clients[k];
			if (expired(now_ns, c->last_seen_ns,
				d->cfg.client_timeout_ns)) {
				client_leave(d, j, c, "client_timed_out");
				continue;
			}
			k++;
		}
	}
	if (d->cfg.autoscale && now_ns >= d->next_decision_ns)
		cwi_dispatcher_decide(d, now_ns);
	else
		cwi_disp_reconcile(d);
	gc_finished(d);
}

/* ---- one entry point for a server loop ----------------------------------- */

/* The lineage a request's ids came from (0: not said). */
static uint64_t
req_lineage(const cwi_pmsg *req)
{
	switch (req->type) {
	case CWI_MSG_WORKER_HEARTBEAT:
		return req->u.worker_heartbeat.lineage;
	case CWI_MSG_WORKER_DEREGISTER:
		return req->u.worker_deregister.lineage;
	case CWI_MSG_JOB_GET_OR_CREATE:
		return req->u.job_get_or_create.lineage;
	case CWI_MSG_CLIENT_HEARTBEAT:
		return req->u.client_heartbeat.lineage;
	case CWI_MSG_SPLIT_LEASE:
		return req->u.split_lease.lineage;
	case CWI_MSG_SPLIT_ACK:
		return req->u.split_ack.lineage;
	case CWI_MSG_JOB_RELEASE:
		return req->u.job_release.lineage;
	case CWI_MSG_TASK_COUNTERS:
		return req->u.task_counters.lineage;
	default:
		return 0;
	}
}

/* Ids are never reused within a lineage; those of another one (a
 * dispatcher that restarted without its journal, or another dispatcher
 * on the same address) would name unrelated workers, jobs and clients
 * here, so a request carrying them changes nothing. */
static cachew_err
check_lineage(const cwi_dispatcher *d, const cwi_pmsg *req)
{
	uint64_t l = req_lineage(req);

	if (l == 0 || l == d->lineage)
		return CACHEW_OK;
	return cwi_fail(CACHEW_ENOENT, "%s names ids of dispatcher state "
	    "%016llx, but this dispatcher's state is %016llx (it restarted "
	    "without its journal, or another dispatcher took the address): "
	    "they are unknown here",
	    cwi_msg_type_name(req->type), (unsigned long long)l,
	    (unsigned long long)d->lineage);
}

cachew_err
cwi_dispatcher_handle(cwi_dispatcher *d, uint64_t now_ns, const cwi_pmsg *req,
    cwi_pmsg *rep)
{
	cwi_msg_type rtype = CWI_MSG_OK;
	cachew_err rv;

	cwi_pmsg_init(rep, CWI_MSG_NONE);
	rv = check_lineage(d, req);
	if (rv == CACHEW_OK)
		rv = cwi_owner_check(d, req);
	if (rv != CACHEW_OK)
		goto done;
	switch (req->type) {
	case CWI_MSG_WORKER_REGISTER:
		rtype = CWI_MSG_WORKER_REGISTER_REPLY;
		rv = cwi_dispatcher_worker_register(d, now_ns,
		    &req->u.worker_register, &rep->u.worker_register_reply);
		break;
	case CWI_MSG_WORKER_HEARTBEAT:
		rtype = CWI_MSG_WORKER_HEARTBEAT_REPLY;
		rv = cwi_dispatcher_worker_heartbeat(d, now_ns,
		    &req->u.worker_heartbeat, &rep->u.worker_heartbeat_reply);
		break;
	case CWI_MSG_WORKER_DEREGISTER:
		rv = cwi_dispatcher_worker_deregister(d, now_ns,
		    &req->u.worker_deregister);
		break;
	case CWI_MSG_DATASET_REGISTER:
		rtype = CWI_MSG_DATASET_REGISTER_REPLY;
		rv = cwi_dispatcher_dataset_register(d, now_ns,
		    &req->u.dataset_register, &rep->u.dataset_register_reply);
		break;
	case CWI_MSG_JOB_GET_OR_CREATE:
		rtype = CWI_MSG_JOB_GET_OR_CREATE_REPLY;
		rv = cwi_dispatcher_job_get_or_create(d, now_ns,
		    &req->u.job_get_or_create, &rep->u.job_get_or_create_reply);
		break;
	case CWI_MSG_CLIENT_HEARTBEAT:
		rtype = CWI_MSG_CLIENT_HEARTBEAT_REPLY;
		rv = cwi_dispatcher_client_heartbeat(d, now_ns,
		    &req->u.client_heartbeat, &rep->u.client_heartbeat_reply);
		break;
	case CWI_MSG_SPLIT_LEASE:
		rtype = CWI_MSG_SPLIT_LEASE_REPLY;
		rv = cwi_dispatcher_split_lease(d, now_ns, &req->u.split_lease,
		    &rep->u.split_lease_reply);
		break;
	case CWI_MSG_SPLIT_ACK:
		rv = cwi_dispatcher_split_ack(d, now_ns, &req->u.split_ack,
		    &rep->u.ok);
		break;
	case CWI_MSG_JOB_RELEASE:
		rv = cwi_dispatcher_job_release(d, now_ns, &req->u.job_release);
		break;
	case CWI_MSG_STATUS:
		rtype = CWI_MSG_STATUS_REPLY;
		rv = cwi_dispatcher_status(d, now_ns, &rep->u.status_reply);
		break;
	case CWI_MSG_TASK_COUNTERS:
		rv = cwi_dispatcher_task_counters(d, now_ns,
		    &req->u.task_counters);
		break;
	default:
		rv = cwi_fail(CACHEW_EPROTO, "the dispatcher does not take %s "
					     "messages",
		    cwi_msg_type_name(req->type));
		break;
	}
done:
	rep->type = rtype;
	if (rv == CACHEW_OK)
		cwi_owner_record(d, req, rep);
	if (rv == CACHEW_OK && rtype == CWI_MSG_WORKER_REGISTER_REPLY)
		rep->u.worker_register_reply.lineage = d->lineage;
	if (rv == CACHEW_OK && rtype == CWI_MSG_JOB_GET_OR_CREATE_REPLY)
		rep->u.job_get_or_create_reply.lineage = d->lineage;
	if (rv != CACHEW_OK) {
		const char *msg = cwi_errmsg_get();
		cwi_pmsg_free(rep);
		cwi_pmsg_init(rep, CWI_MSG_ERROR);
		rep->u.error.code = (int64_t)rv;
		rep->u.error.lineage = d->lineage;
		rep->u.error.message = cwi_strdup(msg != NULL ? msg : "");
		if (rep->u.error.message != NULL &&
		    strlen(rep->u.error.message) > CWI_PROTO_MAX_ERRMSG)
			rep->u.error.message[CWI_PROTO_MAX_ERRMSG] = '\0';
	}
	return rv;
}

