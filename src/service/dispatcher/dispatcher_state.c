/*
 * dispatcher_state.c - the dispatcher's state machine (see
 * dispatcher_state.h; docs/protocol.md, "Dispatcher rules").
 *
 * Layout: workers, datasets, jobs and tasks live in vectors of pointers
 * kept in id order (ids only grow, new entries are appended, removal keeps
 * the order), so every scan, reply and event comes out in a reproducible
 * order. Sizes are small (hundreds of workers, thousands of tasks), so
 * lookups scan; the one large table, a job's splits, is indexed by split
 * id.
 *
 * A job's splits move PENDING -> LEASED -> ACKED, and LEASED -> PENDING
 * when their worker dies (or a shared job's client leaves with them).
 * ACKED is final. The pending pool is a ring of split ids: a split is in
 * the ring at most once, a split acknowledged while pending leaves a
 * stale entry that popping skips, so the ring never needs more than
 * nsplits slots. Released splits go to the front, so lost data is
 * produced again first.
 *
 * Invariant (checked by the tests): npending + nleased + nacked ==
 * nsplits, and every split is in exactly one of those states.
 */
#include "dispatcher_state.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#define NS_PER_MS 1000000ull

/* ---- the state ----------------------------------------------------------- */

typedef struct vec {
	void **v;
	size_t n, cap;
} vec;

typedef struct worker {
	uint64_t id;
	char *address;
	char *build;
	uint32_t cores;
	uint64_t memory_bytes;
	uint64_t last_seen_ns;
	double cpu_use;
	bool draining;
	uint32_t ntasks;
} worker;

typedef struct dataset {
	uint64_t id;
	cachew_fingerprint fp;
	uint8_t *graph;
	size_t graph_len;
	int64_t split_units;
	uint64_t last_used_ns; /* registered or given a job */
} dataset;

enum { SPLIT_PENDING = 0, SPLIT_LEASED, SPLIT_ACKED };

typedef struct split {
	uint8_t state;
	bool delivered;     /* the lessee sent its last element */
	uint32_t acks;      /* acknowledgements, duplicates included */
	uint32_t part_acks; /* clients in `ackers` */
	uint32_t ackers_cap;
	uint32_t lease;     /* leases so far: the current one's number */
	/* Clients that acknowledged their part of this lease, when it was
	 * read by several (parts > 1): each counts once, so that an ack
	 * resent after a lost reply cannot complete the split early. */
	uint64_t *ackers;
	uint64_t orphan_ns; /* when its lessee went, delivered but unacked */
	uint64_t task_id;   /* lessee; 0 once the task is gone */
	uint64_t worker_id; /* lessee's worker */
} split;

typedef struct client {
	uint64_t id;
	int64_t consumer_index;
	uint64_t last_seen_ns;
	uint64_t batch_time_ns;
	uint64_t wait_time_ns;
	double buffer_fill;
	uint64_t round;
	uint64_t told_target; /* block_round in its last reply */
	bool ready;           /* acknowledged the pending change's round */
	/* heartbeats since the job's last scale sample */
	uint64_t acc_batches, acc_elapsed_ns, acc_wait_ns;
	double acc_fill;
	uint32_t acc_reports;
} client;

typedef struct job job;

typedef struct task {
	uint64_t id;
	job *job;
	worker *w;
	cwi_task_state state;
	uint64_t start_round;
	uint64_t end_round;
	uint64_t nleased;
	uint64_t elements;
	uint64_t bytes;
	uint64_t rate_at_ns;
	double elements_per_s;
	double bytes_per_s;
	cwi_op_counters *ops;
	size_t nops;
	/* run and stall time: last reported, and growth since the job's
	 * last scale sample */
	uint64_t run_ns, stall_ns;
	uint64_t acc_run_ns, acc_stall_ns;
} task;

/* The split ledger of a distributed_epoch job: its invariant is that every
 * split unit is delivered once per epoch (see the top of this file). splits
 * NULL: no ledger (parallel_epochs, an empty dataset, a finished job). */
struct split_ledger {
	split *splits;         /* indexed by split id */
	uint64_t nsplits, nunits, units_per_split;
	uint64_t *ring;        /* the pending pool */
	uint64_t ring_head, ring_len;
	uint64_t npending, nleased, nacked;
};

/* How many workers a job gets: its worker count decision (count_fn), or
 * with the policy engine (autoscale) its scaler's want and fair share's
 * grant. */
struct job_sizing {
	cwi_worker_count_fn count_fn; /* NULL: the policy engine decides */
	void *count_ctx;
	uint32_t target;       /* the decision last applied */
	bool target_set;
	/* Policy engine (autoscale): NULL scaler = not autoscaled. */
	cwi_scaler *scaler;
	char scale_name[32];   /* the policy's canonical spelling */
	double weight;
	uint32_t want;         /* the scaler's decision */
	uint32_t granted;      /* fair share's answer */
	bool settled;
	bool epoch_start;      /* the next sample starts an epoch */
	uint64_t sample_ns;    /* the current sample began */
	char reason[192];
};

/* Coordinated reads (num_consumers > 0): the job's round schedule. */
struct coord_schedule {
	uint64_t target;       /* pending schedule change, or NONE */
	bool published;        /* a client has been sent the task list */
};

/* Autocaching: the pass this job runs (graph NULL: the dataset's graph, no
 * planner). */
struct job_pass {
	uint8_t *graph;
	size_t graph_len;
	uint64_t units;
	double worker_scale;   /* > 0: scale a carried-over count */
	void *ctx;             /* the planner's until the end is queued */
	bool ended;
	char cache_mode[12];
	char cache_reason[512];
};

struct job {
	uint64_t id;
	char *name;
	uint64_t iteration;
	dataset *ds;
	cwi_processing_mode mode;
	cwi_compression compression;
	uint64_t seed;
	cwi_worker_policy policy;
	uint32_t num_workers;
	uint32_t num_consumers;
	client *clients;
	size_t nclients, capclients;
	bool data_done;
	bool any_task_done; /* parallel_epochs: the pass is ending */
	bool finished;
	uint64_t elements, bytes;
	struct split_ledger ledger; /* distributed_epoch */
	struct job_sizing sizing;
	struct coord_schedule coord;
	struct job_pass pass;
};

struct cwi_dispatcher {
	cwi_dispatcher_config cfg;
	vec workers, datasets, jobs, tasks;
	uint64_t next_worker_id, next_dataset_id, next_job_id;
	uint64_t next_client_id, next_task_id;
	uint64_t now; /* the current call's clock, for events */
	cwi_strbuf ev;
	/* policy engine */
	uint64_t next_decision_ns;
	uint32_t pool_target;
	uint32_t *pool_recent; /* the last pool_down_intervals raw targets */
	uint32_t npool_recent;
	/* autocaching */
	cwi_job_pass *offered;  /* the next job created takes it */
	cwi_pass_end *pass_ends; /* queued for take_pass_ends */
	size_t npass_ends, cappass_ends;
};

#define WORKER(d, i) ((worker *)(d)->workers.v[i])
#define DATASET(d, i) ((dataset *)(d)->datasets.v[i])
#define JOB(d, i) ((job *)(d)->jobs.v[i])
#define TASK(d, i) ((task *)(d)->tasks.v[i])

static bool
vec_push(vec *v, void *p)
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

static void
vec_remove(vec *v, void *p)
{
	for (size_t i = 0; i < v->n; i++) {
		if (v->v[i] == p) {
			memmove(&v->v[i], &v->v[i + 1],
			    (v->n - i - 1) * sizeof(*v->v));
			v->n--;
			return;
		}
	}
}

/* ---- events -------------------------------------------------------------- */

static void
ev_begin(cwi_dispatcher *d, const char *name)
{
	d->ev.len = 0;
	d->ev.oom = false;
	cwi_strbuf_printf(&d->ev, "{\"ts_ns\":%" PRIu64 ",\"event\":\"%s\"",
	    d->now, name);
}

static void
ev_u64(cwi_dispatcher *d, const char *key, uint64_t v)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":%" PRIu64, key, v);
}

static void
ev_i64(cwi_dispatcher *d, const char *key, int64_t v)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":%" PRId64, key, v);
}

/* A JSON string: quotes, backslashes and control bytes escaped; other
 * bytes (UTF-8 included) as they are. */
static void
ev_str(cwi_dispatcher *d, const char *key, const char *s)
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

static void
ev_ids(cwi_dispatcher *d, const char *key, const uint64_t *ids, size_t n)
{
	cwi_strbuf_printf(&d->ev, ",\"%s\":[", key);
	for (size_t i = 0; i < n; i++)
		cwi_strbuf_printf(&d->ev, "%s%" PRIu64, i > 0 ? "," : "",
		    ids[i]);
	cwi_strbuf_puts(&d->ev, "]");
}

static void
ev_end(cwi_dispatcher *d)
{
	cwi_strbuf_puts(&d->ev, "}");
	/* An event that ran out of memory is dropped, not half written. */
	if (d->ev.oom)
		return;
	if (d->cfg.event_fn != NULL)
		d->cfg.event_fn(d->cfg.event_ctx, d->ev.data, d->ev.len);
	if (d->cfg.event_file != NULL) {
		fwrite(d->ev.data, 1, d->ev.len, d->cfg.event_file);
		fputc('\n', d->cfg.event_file);
		fflush(d->cfg.event_file);
	}
}

static bool
events_on(const cwi_dispatcher *d)
{
	return d->cfg.event_fn != NULL || d->cfg.event_file != NULL;
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
	cwi_strbuf_init(&d->ev);
	d->pool_target = d->cfg.min_workers;
	d->pool_recent = calloc(d->cfg.pool_down_intervals,
	    sizeof(*d->pool_recent));
	if (d->pool_recent == NULL) {
		free(d);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
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
job_free_splits(job *j)
{
	struct split_ledger *l = &j->ledger;

	for (uint64_t i = 0; l->splits != NULL && i < l->nsplits; i++)
		free(l->splits[i].ackers);
	free(l->splits);
	free(l->ring);
	l->splits = NULL;
	l->ring = NULL;
}

static void
job_free(const cwi_dispatcher *d, job *j)
{
	if (j == NULL)
		return;
	job_free_splits(j);
	cwi_scaler_destroy(j->sizing.scaler);
	free(j->clients);
	free(j->name);
	free(j->pass.graph);
	if (j->pass.ctx != NULL && d->cfg.pass_free != NULL)
		d->cfg.pass_free(j->pass.ctx);
	free(j);
}

void
cwi_dispatcher_destroy(cwi_dispatcher *d)
{
	if (d == NULL)
		return;
	for (size_t i = 0; i < d->tasks.n; i++)
		task_free(TASK(d, i));
	for (size_t i = 0; i < d->jobs.n; i++)
		job_free(d, JOB(d, i));
	for (size_t i = 0; i < d->npass_ends; i++)
		if (d->pass_ends[i].ctx != NULL && d->cfg.pass_free != NULL)
			d->cfg.pass_free(d->pass_ends[i].ctx);
	cwi_dispatcher_pass_ends_free(d->pass_ends, d->npass_ends);
	for (size_t i = 0; i < d->datasets.n; i++) {
		free(DATASET(d, i)->graph);
		free(DATASET(d, i));
	}
	for (size_t i = 0; i < d->workers.n; i++) {
		free(WORKER(d, i)->address);
		free(WORKER(d, i)->build);
		free(WORKER(d, i));
	}
	free(d->tasks.v);
	free(d->jobs.v);
	free(d->datasets.v);
	free(d->workers.v);
	cwi_strbuf_free(&d->ev);
	free(d->pool_recent);
	free(d);
}

static worker *
find_worker(const cwi_dispatcher *d, uint64_t id)
{
	for (size_t i = 0; i < d->workers.n; i++)
		if (WORKER(d, i)->id == id)
			return WORKER(d, i);
	return NULL;
}

static task *
find_task(const cwi_dispatcher *d, uint64_t id)
{
	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->id == id)
			return TASK(d, i);
	return NULL;
}

static job *
find_job(const cwi_dispatcher *d, uint64_t id)
{
	for (size_t i = 0; i < d->jobs.n; i++)
		if (JOB(d, i)->id == id)
			return JOB(d, i);
	return NULL;
}

static dataset *
find_dataset(const cwi_dispatcher *d, uint64_t id)
{
	for (size_t i = 0; i < d->datasets.n; i++)
		if (DATASET(d, i)->id == id)
			return DATASET(d, i);
	return NULL;
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
	job *j = find_job(d, job_id);

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

static uint32_t
workers_available(const cwi_dispatcher *d)
{
	uint32_t n = 0;

	for (size_t i = 0; i < d->workers.n; i++)
		if (!WORKER(d, i)->draining)
			n++;
	return n;
}

static bool
coordinated(const job *j)
{
	return j->num_consumers > 0;
}

/* ---- splits -------------------------------------------------------------- */

static void
ring_push(struct split_ledger *l, uint64_t id, bool front)
{
	if (front) {
		l->ring_head = (l->ring_head + l->nsplits - 1) % l->nsplits;
		l->ring[l->ring_head] = id;
	} else {
		l->ring[(l->ring_head + l->ring_len) % l->nsplits] = id;
	}
	l->ring_len++;
}

/* The next pending split; stale entries (acknowledged while pending) are
 * dropped on the way. false when none is pending. */
static bool
ring_pop(struct split_ledger *l, uint64_t *id)
{
	while (l->ring_len > 0) {
		uint64_t s = l->ring[l->ring_head];
		l->ring_head = (l->ring_head + 1) % l->nsplits;
		l->ring_len--;
		if (l->splits[s].state == SPLIT_PENDING) {
			*id = s;
			return true;
		}
	}
	return false;
}

static void
split_range(const struct split_ledger *l, uint64_t id, cwi_split *out)
{
	out->split_id = id;
	out->begin = id * l->units_per_split;
	out->end = out->begin + l->units_per_split;
	if (out->end > l->nunits)
		out->end = l->nunits;
}

/* LEASED -> PENDING, at the front of the pool. */
static void
split_release(cwi_dispatcher *d, job *j, uint64_t id)
{
	split *s = &j->ledger.splits[id];
	task *t = s->task_id != 0 ? find_task(d, s->task_id) : NULL;

	if (t != NULL && t->nleased > 0)
		t->nleased--;
	s->state = SPLIT_PENDING;
	s->task_id = 0;
	s->worker_id = 0;
	s->delivered = false;
	j->ledger.nleased--;
	j->ledger.npending++;
	ring_push(&j->ledger, id, true);
}

/* Releases the leased, unacknowledged splits of job j that `match`
 * selects; one split_released event lists them. */
static void
release_splits(cwi_dispatcher *d, job *j, bool (*match)(const split *,
    uint64_t), uint64_t arg, const char *reason, uint64_t worker_id)
{
	uint64_t *ids = NULL;
	size_t n = 0;

	if (j->ledger.splits == NULL || j->ledger.nleased == 0)
		return;
	if (events_on(d))
		ids = malloc(j->ledger.nleased * sizeof(*ids));
	/* Backwards, so the front of the pool ends up in ascending order. */
	for (uint64_t k = j->ledger.nsplits; k-- > 0;) {
		if (j->ledger.splits[k].state != SPLIT_LEASED ||
		    !match(&j->ledger.splits[k], arg))
			continue;
		split_release(d, j, k);
		if (ids != NULL)
			ids[n] = k;
		n++;
	}
	if (n > 0 && ids != NULL) {
		for (size_t a = 0, b = n - 1; a < b; a++, b--) {
			uint64_t x = ids[a];
			ids[a] = ids[b];
			ids[b] = x;
		}
		ev_begin(d, "split_released");
		ev_u64(d, "job_id", j->id);
		if (worker_id != 0)
			ev_u64(d, "worker_id", worker_id);
		ev_str(d, "reason", reason);
		ev_ids(d, "splits", ids, n);
		ev_end(d);
	}
	free(ids);
}

/* A split whose task ended (its data delivered) that no client has
 * acknowledged within the grace period: the acknowledgement was lost (a
 * reply lost in a reset connection, a client that gave up on a worker).
 * Leasing it again may repeat elements; keeping it would end the epoch
 * never. `arg` is the cutoff time. */
static bool
match_orphaned(const split *s, uint64_t cutoff)
{
	return s->task_id == 0 && s->delivered && s->orphan_ns < cutoff;
}

static bool
match_worker(const split *s, uint64_t worker_id)
{
	return s->worker_id == worker_id;
}

/* A worker that deregistered drained first: the splits it delivered are
 * on their way to clients, whose acknowledgements can trail its goodbye
 * (a slow client: autoscale_process_provisioner_scales_a_job got 500
 * elements twice). Leased again they would come twice; uncoordinated,
 * they stay delivered and unacked, and the orphan rule (match_orphaned)
 * leases them again only if no acknowledgement comes within its grace. */
static bool
match_worker_undelivered(const split *s, uint64_t worker_id)
{
	return s->worker_id == worker_id && !s->delivered;
}

static bool
match_task(const split *s, uint64_t task_id)
{
	return s->task_id == task_id;
}

static bool
match_delivered(const split *s, uint64_t unused)
{
	(void)unused;
	return s->delivered;
}

/* Queues the end of a job's autocaching pass with its tasks' counters.
 * Out of memory: the planner never hears of it (its ctx is freed), which
 * only costs what the pass would have taught it. */
static void
pass_end(cwi_dispatcher *d, job *j, bool complete)
{
	cwi_pass_end *pe;
	size_t nops = 0;

	if (j->pass.ctx == NULL || j->pass.ended)
		return;
	j->pass.ended = true;
	if (d->npass_ends == d->cappass_ends) {
		size_t cap = d->cappass_ends ? 2 * d->cappass_ends : 4;
		cwi_pass_end *v = realloc(d->pass_ends, cap * sizeof(*v));
		if (v == NULL)
			goto oom;
		d->pass_ends = v;
		d->cappass_ends = cap;
	}
	pe = &d->pass_ends[d->npass_ends];
	memset(pe, 0, sizeof(*pe));
	pe->job_id = j->id;
	pe->complete = complete;
	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->job == j)
			nops += TASK(d, i)->nops;
	pe->ops = calloc(nops + 1, sizeof(*pe->ops));
	if (pe->ops == NULL)
		goto oom;
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		if (t->job != j)
			continue;
		pe->workers++;
		for (size_t k = 0; k < t->nops; k++) {
			cwi_op_counters *c = &pe->ops[pe->nops];
			*c = t->ops[k];
			c->name = cwi_strdup(t->ops[k].name);
			if (c->name == NULL) {
				for (size_t m = 0; m < pe->nops; m++)
					free(pe->ops[m].name);
				free(pe->ops);
				goto oom;
			}
			pe->nops++;
		}
	}
	pe->ctx = j->pass.ctx;
	j->pass.ctx = NULL;
	d->npass_ends++;
	return;
oom:
	if (d->cfg.pass_free != NULL)
		d->cfg.pass_free(j->pass.ctx);
	j->pass.ctx = NULL;
}

static void
epoch_check(cwi_dispatcher *d, job *j)
{
	if (j->data_done || j->mode != CWI_MODE_DISTRIBUTED_EPOCH ||
	    j->ledger.nacked < j->ledger.nsplits)
		return;
	j->data_done = true;
	ev_begin(d, "epoch_done");
	ev_u64(d, "job_id", j->id);
	ev_u64(d, "splits", j->ledger.nsplits);
	ev_end(d);
	pass_end(d, j, true);
}

/* ---- tasks --------------------------------------------------------------- */

static void
task_event(cwi_dispatcher *d, const char *name, const task *t)
{
	ev_begin(d, name);
	ev_u64(d, "task_id", t->id);
	ev_u64(d, "job_id", t->job->id);
	ev_u64(d, "worker_id", t->w->id);
}

/* Forgets a task. Splits it still holds stay leased to its worker (which
 * delivered them, or they are released with it when it dies). */
static void
task_drop(cwi_dispatcher *d, task *t, const char *reason)
{
	job *j = t->job;

	if (t->nleased > 0 && j->ledger.splits != NULL) {
		for (uint64_t k = 0; k < j->ledger.nsplits; k++) {
			split *s = &j->ledger.splits[k];
			if (s->state == SPLIT_LEASED && s->task_id == t->id) {
				s->task_id = 0;
				s->delivered = true;
				s->orphan_ns = d->now;
			}
		}
	}
	task_event(d, "task_removed", t);
	ev_str(d, "reason", reason);
	ev_end(d);
	t->w->ntasks--;
	vec_remove(&d->tasks, t);
	task_free(t);
}

/* Whether a change to the job's schedule can take effect at once because
 * nobody can be reading from it: no client has seen a task list yet, or
 * no task serves now or later (changes still pending do not count). */
static bool
schedule_empty(const cwi_dispatcher *d, const job *j)
{
	if (!j->coord.published)
		return true;
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		if (t->job == j && t->start_round != CWI_ROUND_NONE &&
		    t->end_round == CWI_ROUND_NONE)
			return false;
	}
	return true;
}

static uint64_t
consumer_round(const job *j, bool max)
{
	uint64_t r = max ? 0 : UINT64_MAX;

	for (size_t i = 0; i < j->nclients; i++) {
		uint64_t c = j->clients[i].round;
		if (max ? c > r : c < r)
			r = c;
	}
	return j->nclients == 0 ? 0 : r;
}

/* Announces a schedule change: it will happen at coord_target, which every
 * consumer is told (block_round) and must acknowledge first. */
static void
coord_open(cwi_dispatcher *d, job *j)
{
	if (j->coord.target != CWI_ROUND_NONE)
		return;
	j->coord.target = consumer_round(j, true) + d->cfg.coord_round_margin;
	for (size_t i = 0; i < j->nclients; i++)
		j->clients[i].ready = false;
	ev_begin(d, "schedule_change_announced");
	ev_u64(d, "job_id", j->id);
	ev_u64(d, "round", j->coord.target);
	ev_end(d);
}

static task *
task_add(cwi_dispatcher *d, job *j, worker *w)
{
	task *t = calloc(1, sizeof(*t));

	if (t == NULL || !vec_push(&d->tasks, t)) {
		free(t);
		return NULL;
	}
	t->id = d->next_task_id++;
	t->job = j;
	t->w = w;
	t->state = CWI_TASK_ACTIVE;
	t->start_round = 0;
	t->end_round = CWI_ROUND_NONE;
	w->ntasks++;
	/* Coordinated: nobody can be reading from an empty schedule, so a
	 * task joins it at once, at the round the slowest consumer waits
	 * for; otherwise at a round announced to every consumer first. */
	if (coordinated(j) && schedule_empty(d, j)) {
		t->start_round = consumer_round(j, false);
	} else if (coordinated(j)) {
		t->state = CWI_TASK_STARTING;
		t->start_round = CWI_ROUND_NONE;
	}
	task_event(d, "task_added", t);
	if (coordinated(j) && t->start_round != CWI_ROUND_NONE)
		ev_u64(d, "start_round", t->start_round);
	ev_end(d);
	if (t->state == CWI_TASK_STARTING)
		coord_open(d, j);
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
	if (coordinated(j)) {
		if (t->state == CWI_TASK_STARTING) {
			task_drop(d, t, reason);
			return true;
		}
		/* Consumers keep reading it until the announced round. */
		t->state = CWI_TASK_REMOVING;
		coord_open(d, j);
	} else if (j->mode == CWI_MODE_PARALLEL_EPOCHS || t->nleased == 0) {
		task_drop(d, t, reason);
		return true;
	} else {
		t->state = CWI_TASK_REMOVING;
	}
	task_event(d, "task_removing", t);
	ev_u64(d, "leased", t->nleased);
	ev_str(d, "reason", reason);
	ev_end(d);
	return false;
}

/* A task has delivered everything it will deliver. */
static void
task_done(cwi_dispatcher *d, task *t)
{
	job *j = t->job;

	if (j->mode == CWI_MODE_PARALLEL_EPOCHS)
		j->any_task_done = true;
	task_drop(d, t, "done");
	if (j->mode == CWI_MODE_PARALLEL_EPOCHS && !j->data_done) {
		for (size_t i = 0; i < d->tasks.n; i++)
			if (TASK(d, i)->job == j)
				return;
		j->data_done = true;
		ev_begin(d, "epoch_done");
		ev_u64(d, "job_id", j->id);
		ev_end(d);
	}
}

/* Removing tasks (uncoordinated) go once every split they hold is
 * acknowledged. Returns whether any went: their workers are free for
 * other tasks. */
static bool
drop_finished_removals(cwi_dispatcher *d, job *j)
{
	bool dropped = false;

	for (size_t i = 0; i < d->tasks.n;) {
		task *t = TASK(d, i);
		if (t->job == j && t->state == CWI_TASK_REMOVING &&
		    !coordinated(j) && t->nleased == 0) {
			task_drop(d, t, "removed");
			dropped = true;
			continue;
		}
		i++;
	}
	return dropped;
}

/* ---- coordinated reads --------------------------------------------------- */

static void
coord_commit(cwi_dispatcher *d, job *j, uint64_t round)
{
	uint64_t *started = NULL, *ended = NULL;
	size_t ns = 0, ne = 0;

	if (events_on(d)) {
		started = malloc((d->tasks.n + 1) * sizeof(*started));
		ended = malloc((d->tasks.n + 1) * sizeof(*ended));
	}
	for (size_t i = 0; i < d->tasks.n; i++) {
		task *t = TASK(d, i);
		if (t->job != j)
			continue;
		if (t->state == CWI_TASK_STARTING) {
			t->state = CWI_TASK_ACTIVE;
			t->start_round = round;
			if (started != NULL)
				started[ns] = t->id;
			ns++;
		} else if (t->state == CWI_TASK_REMOVING &&
		    t->end_round == CWI_ROUND_NONE) {
			t->end_round = round;
			if (ended != NULL)
				ended[ne] = t->id;
			ne++;
		}
	}
	j->coord.target = CWI_ROUND_NONE;
	if (started != NULL && ended != NULL) {
		ev_begin(d, "schedule_changed");
		ev_u64(d, "job_id", j->id);
		ev_u64(d, "round", round);
		ev_ids(d, "started", started, ns);
		ev_ids(d, "ended", ended, ne);
		ev_end(d);
	}
	free(started);
	free(ended);
}

/* Commits the pending change once every consumer acknowledged its round;
 * at once when nobody can be reading (no consumers, or an empty
 * schedule). Then drops ended tasks every consumer has read past. */
static void
coord_update(cwi_dispatcher *d, job *j)
{
	if (!coordinated(j) || j->finished)
		return;
	if (j->coord.target != CWI_ROUND_NONE) {
		bool all = true;
		for (size_t i = 0; i < j->nclients; i++)
			all = all && j->clients[i].ready;
		if (j->nclients == 0 || schedule_empty(d, j))
			coord_commit(d, j, consumer_round(j, false));
		else if (all)
			coord_commit(d, j, j->coord.target);
	}
	for (size_t i = 0; i < d->tasks.n;) {
		task *t = TASK(d, i);
		if (t->job == j && t->state == CWI_TASK_REMOVING &&
		    t->end_round != CWI_ROUND_NONE &&
		    (j->nclients == 0 ||
			consumer_round(j, false) >= t->end_round)) {
			/* Its rounds are read: what it leased and nobody
			 * acknowledged will never be read from it. */
			release_splits(d, j, match_task, t->id, "task_ended",
			    t->w->id);
			task_drop(d, t, "removed");
			continue;
		}
		i++;
	}
}

/* ---- worker count decisions ---------------------------------------------- */

uint32_t
cwi_worker_count_default(void *ctx, const cwi_job_view *view)
{
	(void)ctx;
	if (view->worker_policy == CWI_WORKERS_FIXED)
		return view->num_workers;
	return view->workers_available;
}

static void
job_view(const cwi_dispatcher *d, const job *j, cwi_job_view *v)
{
	uint64_t bt = 0, wt = 0, nbt = 0;

	memset(v, 0, sizeof(*v));
	v->job_id = j->id;
	v->name = j->name;
	v->processing_mode = j->mode;
	v->worker_policy = j->policy;
	v->num_workers = j->num_workers;
	v->num_consumers = j->num_consumers;
	v->clients = (uint32_t)j->nclients;
	v->workers_available = workers_available(d);
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		if (t->job != j)
			continue;
		v->elements_per_s += t->elements_per_s;
		if (t->state != CWI_TASK_REMOVING)
			v->tasks++;
	}
	for (size_t i = 0; i < j->nclients; i++) {
		if (j->clients[i].batch_time_ns == 0)
			continue;
		bt += j->clients[i].batch_time_ns;
		wt += j->clients[i].wait_time_ns;
		nbt++;
	}
	if (nbt > 0) {
		v->batch_time_ns = bt / nbt;
		v->wait_time_ns = wt / nbt;
	}
}

static bool
worker_has_task_of(const cwi_dispatcher *d, const worker *w, const job *j)
{
	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->w == w && TASK(d, i)->job == j)
			return true;
	return false;
}

/* The worker a new task of j goes to: not draining, no task of j yet, the
 * fewest tasks, then the lowest id. */
static worker *
pick_worker(const cwi_dispatcher *d, const job *j)
{
	worker *best = NULL;

	for (size_t i = 0; i < d->workers.n; i++) {
		worker *w = WORKER(d, i);
		if (w->draining || worker_has_task_of(d, w, j))
			continue;
		if (best == NULL || w->ntasks < best->ntasks)
			best = w;
	}
	return best;
}

/* The task to take away: on the busiest worker, then the newest. */
static task *
pick_victim(const cwi_dispatcher *d, const job *j)
{
	task *best = NULL;

	for (size_t i = 0; i < d->tasks.n; i++) {
		task *t = TASK(d, i);
		if (t->job != j || t->state == CWI_TASK_REMOVING)
			continue;
		if (best == NULL || t->w->ntasks >= best->w->ntasks)
			best = t;
	}
	return best;
}

/* Brings the job's task count to what its decision says. */
static void
reconcile_job(cwi_dispatcher *d, job *j)
{
	cwi_job_view v;
	uint32_t target;

	if (j->finished || j->data_done || j->any_task_done)
		return;
	job_view(d, j, &v);
	if (j->sizing.count_fn == NULL)
		target = j->sizing.granted; /* the policy engine's */
	else
		target = j->sizing.count_fn(j->sizing.count_ctx, &v);
	if (target > v.workers_available)
		target = v.workers_available;
	if (!j->sizing.target_set || target != j->sizing.target) {
		j->sizing.target = target;
		j->sizing.target_set = true;
		ev_begin(d, "job_target");
		ev_u64(d, "job_id", j->id);
		ev_u64(d, "workers", target);
		ev_end(d);
	}
	/* Coordinated, once every split is leased: a new task could only
	 * end at once, after making every consumer wait for a schedule
	 * change. */
	while (v.tasks < target &&
	       !(coordinated(j) && j->mode == CWI_MODE_DISTRIBUTED_EPOCH &&
		   j->ledger.splits != NULL && j->ledger.npending == 0)) {
		worker *w = pick_worker(d, j);
		if (w == NULL || task_add(d, j, w) == NULL)
			break;
		v.tasks++;
	}
	while (v.tasks > target) {
		task *t = pick_victim(d, j);
		if (t == NULL)
			break;
		task_begin_remove(d, t, "scaled_down");
		v.tasks--;
	}
	coord_update(d, j);
}

static void share(cwi_dispatcher *d, bool tell);

/* Every job's task count to its decision; with the policy engine, fair
 * share first, so workers that came or went, and jobs that started or
 * ended, move workers at once. */
static void
reconcile(cwi_dispatcher *d)
{
	share(d, false);
	for (size_t i = 0; i < d->jobs.n; i++)
		reconcile_job(d, JOB(d, i));
}

/* ---- the policy engine --------------------------------------------------- */

/* A job the policy engine sizes now: autoscaled, running, data to come. */
static bool
scaled(const job *j)
{
	return j->sizing.scaler != NULL && j->sizing.count_fn == NULL &&
	       !j->finished && !j->data_done && !j->any_task_done;
}

/* Weighted fair share of the available workers over the scaled jobs, in
 * creation order (d->jobs is in id order). `tell`: a job that got less
 * than it wants tells its scaler, once per decision interval. */
static void
share(cwi_dispatcher *d, bool tell)
{
	size_t n = d->jobs.n;
	uint32_t *want, *got;
	double *weight;

	if (!d->cfg.autoscale || n == 0)
		return;
	want = calloc(n, sizeof(*want));
	got = calloc(n, sizeof(*got));
	weight = calloc(n, sizeof(*weight));
	if (want == NULL || got == NULL || weight == NULL)
		goto out; /* the grants stay as they were */
	for (size_t i = 0; i < n; i++) {
		const job *j = JOB(d, i);
		want[i] = scaled(j) ? j->sizing.want : 0;
		weight[i] = j->sizing.weight > 0 ? j->sizing.weight : 1.0;
	}
	cwi_fair_share(want, weight, n, workers_available(d), got);
	for (size_t i = 0; i < n; i++) {
		job *j = JOB(d, i);
		if (!scaled(j))
			continue;
		if (got[i] != j->sizing.granted) {
			ev_begin(d, "job_share");
			ev_u64(d, "job_id", j->id);
			ev_u64(d, "want", want[i]);
			ev_u64(d, "granted", got[i]);
			ev_u64(d, "available", workers_available(d));
			ev_end(d);
		}
		j->sizing.granted = got[i];
		if (tell && got[i] >= 1 && got[i] < want[i])
			cwi_scaler_granted(j->sizing.scaler, got[i]);
	}
out:
	free(want);
	free(got);
	free(weight);
}

/* One observation of job j since its last sample: its clients' mean
 * consumption, its tasks' stall time, its workers' CPU. Resets the
 * accumulators. */
static void
job_sample(cwi_dispatcher *d, job *j, uint64_t now, cwi_scale_sample *smp)
{
	uint64_t nb = 0, ne = 0, nw = 0, run = 0, stall = 0;
	double fill = 0, cpu = 0;
	uint32_t nrep = 0, ncpu = 0, ntasks = 0;

	memset(smp, 0, sizeof(*smp));
	for (size_t i = 0; i < j->nclients; i++) {
		client *c = &j->clients[i];
		if (c->acc_reports == 0)
			continue;
		nb += c->acc_batches;
		ne += c->acc_elapsed_ns;
		nw += c->acc_wait_ns;
		fill += c->acc_fill / c->acc_reports;
		nrep++;
		c->acc_batches = c->acc_elapsed_ns = c->acc_wait_ns = 0;
		c->acc_fill = 0;
		c->acc_reports = 0;
	}
	for (size_t i = 0; i < d->tasks.n; i++) {
		task *t = TASK(d, i);
		if (t->job != j)
			continue;
		run += t->acc_run_ns;
		stall += t->acc_stall_ns;
		t->acc_run_ns = t->acc_stall_ns = 0;
		/* A removing task delivers the splits it leased until they
		 * are acknowledged: it serves the job until then, and the
		 * scaler must see the count drop when it really does (a
		 * probe's window restarts on it). */
		if (t->state != CWI_TASK_REMOVING || t->nleased > 0)
			ntasks++;
		if (t->w->cores > 0) {
			double u = t->w->cpu_use / t->w->cores;
			cpu += u < 0 ? 0 : u > 1 ? 1 : u;
			ncpu++;
		}
	}
	smp->now_ns = now;
	if (nrep > 0) {
		smp->batches = nb / nrep;
		smp->elapsed_ns = ne / nrep;
		/* A wait that began before the batches counted here (a
		 * client blocked across a heartbeat) is part of their time. */
		smp->wait_ns = nw / nrep;
		if (smp->wait_ns > smp->elapsed_ns)
			smp->elapsed_ns = smp->wait_ns;
		smp->buffer_fill = fill / nrep;
	}
	smp->epoch_start = j->sizing.epoch_start;
	smp->workers = ntasks;
	smp->worker_busy = run > 0 ? 1.0 - (double)stall / (double)run : -1.0;
	smp->worker_cpu = ncpu > 0 ? cpu / ncpu : -1.0;
	j->sizing.epoch_start = false;
	j->sizing.sample_ns = now;
}

/* Feeds job j's sample to its scaler; an event when the decision moved. */
static void
job_decide(cwi_dispatcher *d, job *j, uint64_t now)
{
	cwi_scale_sample smp;
	cwi_scale_decision dec;

	job_sample(d, j, now, &smp);
	memset(&dec, 0, sizeof(dec));
	cwi_scaler_observe(j->sizing.scaler, &smp, &dec);
	dec.reason[sizeof(dec.reason) - 1] = '\0';
	if (dec.workers == j->sizing.want && dec.settled == j->sizing.settled)
		return;
	j->sizing.want = dec.workers;
	j->sizing.settled = dec.settled;
	snprintf(j->sizing.reason, sizeof(j->sizing.reason), "%s", dec.reason);
	ev_begin(d, "scale_decision");
	ev_u64(d, "job_id", j->id);
	ev_str(d, "policy", j->sizing.scale_name);
	ev_u64(d, "want", j->sizing.want);
	cwi_strbuf_printf(&d->ev, ",\"settled\":%s",
	    j->sizing.settled ? "true" : "false");
	ev_u64(d, "batches", smp.batches);
	ev_u64(d, "elapsed_ns", smp.elapsed_ns);
	ev_u64(d, "wait_ns", smp.wait_ns);
	ev_u64(d, "workers", smp.workers);
	ev_str(d, "reason", j->sizing.reason);
	ev_end(d);
}

/* The pool target: the sum of what the scaled jobs want, within the
 * bounds, and no lower than any raw target of the last
 * pool_down_intervals intervals (it rises at once, falls late). */
static void
pool_update(cwi_dispatcher *d)
{
	uint64_t sum = 0;
	uint32_t raw, target;

	for (size_t i = 0; i < d->jobs.n; i++)
		if (scaled(JOB(d, i)))
			sum += JOB(d, i)->sizing.want;
	if (d->cfg.max_workers > 0 && sum > d->cfg.max_workers)
		sum = d->cfg.max_workers;
	if (sum < d->cfg.min_workers)
		sum = d->cfg.min_workers;
	raw = sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
	memmove(&d->pool_recent[1], &d->pool_recent[0],
	    (d->cfg.pool_down_intervals - 1) * sizeof(*d->pool_recent));
	d->pool_recent[0] = raw;
	if (d->npool_recent < d->cfg.pool_down_intervals)
		d->npool_recent++;
	target = raw;
	for (uint32_t i = 0; i < d->npool_recent; i++)
		if (d->pool_recent[i] > target)
			target = d->pool_recent[i];
	if (target == d->pool_target)
		return;
	ev_begin(d, "pool_target");
	ev_u64(d, "workers", target);
	ev_u64(d, "wanted", raw);
	ev_u64(d, "available", workers_available(d));
	ev_end(d);
	d->pool_target = target;
}

void
cwi_dispatcher_decide(cwi_dispatcher *d, uint64_t now_ns)
{
	d->now = now_ns;
	if (!d->cfg.autoscale)
		return;
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		/* A job younger than half an interval keeps measuring. */
		if (scaled(j) && now_ns - j->sizing.sample_ns >=
			d->cfg.decision_interval_ns / 2)
			job_decide(d, j, now_ns);
	}
	share(d, true);
	pool_update(d);
	reconcile(d);
	d->next_decision_ns = now_ns + d->cfg.decision_interval_ns;
}

uint32_t
cwi_dispatcher_pool_target(const cwi_dispatcher *d)
{
	return d->pool_target;
}

/* The scale configuration a job request asks for, checked. */
static cachew_err
job_scale_config(const cwi_dispatcher *d, const cwi_msg_job_get_or_create *r,
    cwi_scale_config *c)
{
	*c = d->cfg.scale;
	if (d->cfg.max_workers > 0 && c->max_workers > d->cfg.max_workers)
		c->max_workers = d->cfg.max_workers;
	if (r->scale_policy != NULL) {
		if (cwi_scale_parse(c, r->scale_policy) != CACHEW_OK)
			return cwi_fail(CACHEW_EINVAL, "scale_policy: %s",
			    cwi_errmsg_get());
	} else if (r->worker_policy == CWI_WORKERS_FIXED) {
		char spec[32];
		snprintf(spec, sizeof(spec), "fixed:%" PRIu32, r->num_workers);
		if (cwi_scale_parse(c, spec) != CACHEW_OK)
			return cwi_fail(CACHEW_EINVAL, "num_workers: %s",
			    cwi_errmsg_get());
	}
	if (r->min_workers > 0)
		c->min_workers = r->min_workers;
	if (r->max_workers > 0)
		c->max_workers = r->max_workers;
	if (c->min_workers > c->max_workers)
		return cwi_fail(CACHEW_EINVAL, "min_workers %" PRIu32 " is "
		    "larger than max_workers %" PRIu32, c->min_workers,
		    c->max_workers);
	if (!isfinite(r->weight) || r->weight < 0 || r->weight > 1e6)
		return cwi_fail(CACHEW_EINVAL, "weight %g is not in (0, 1e6]",
		    r->weight);
	return CACHEW_OK;
}

/* The previous pass of a named job, finished, still holding a scaler
 * with the same policy: its scaler carries on into the next pass. */
static job *
previous_pass(const cwi_dispatcher *d, const job *j)
{
	job *best = NULL;

	if (j->name == NULL)
		return NULL;
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *p = JOB(d, i);
		if (p != j && p->finished && p->sizing.scaler != NULL &&
		    p->name != NULL && strcmp(p->name, j->name) == 0 &&
		    p->iteration < j->iteration &&
		    strcmp(p->sizing.scale_name, j->sizing.scale_name) == 0)
			best = p; /* the newest */
	}
	return best;
}

/* Where a new job's scaler starts. Cachew's rule starts at one worker;
 * "model" and "hpa" start with the workers that are there (the scaler
 * clamps to its bounds): idle workers of a static pool cost nothing, and
 * the model measures from them how busy each one is (a surplus stalls on
 * full queues) and sheds what the demand does not need. With no worker
 * yet (a provisioner starts them) that is one. */
static uint32_t
initial_workers(const cwi_dispatcher *d, const cwi_scale_config *c)
{
	uint32_t n = workers_available(d);

	switch (c->kind) {
	case CWI_SCALE_FIXED:
		return c->fixed;
	case CWI_SCALE_CACHEW:
		return 1;
	default:
		return n > 0 ? n : 1;
	}
}

/* The cache mode changed from the previous pass: carry the worker count
 * over scaled by the new mode's expected pass time over the old one's (a
 * pass that reads a cache in a tenth of the time needs about a tenth of
 * the workers to keep its consumer fed). Cachew's own rule restarts at
 * one worker instead (cwi_scaler_reset). */
static void
carry_scaled(job *j)
{
	double n = ceil((double)cwi_scaler_target(j->sizing.scaler) *
	    j->pass.worker_scale);
	uint32_t workers = n < 1 ? 1 : n > 65536 ? 65536 : (uint32_t)n;

	cwi_scaler_reset(j->sizing.scaler, workers);
	snprintf(j->sizing.reason, sizeof(j->sizing.reason),
	    "cache mode %s: %u workers carried over (x%.2f)",
	    j->pass.cache_mode, cwi_scaler_target(j->sizing.scaler),
	    j->pass.worker_scale);
}

/* Gives a new job its scaler (autoscale on). */
static cachew_err
job_scale_init(cwi_dispatcher *d, job *j, const cwi_msg_job_get_or_create *r)
{
	cwi_scale_config c;
	job *prev;
	cachew_err rv;

	rv = job_scale_config(d, r, &c);
	if (rv != CACHEW_OK)
		return rv;
	cwi_scale_name(&c, j->sizing.scale_name, sizeof(j->sizing.scale_name));
	j->sizing.weight = r->weight > 0 ? r->weight : 1.0;
	j->sizing.epoch_start = true;
	j->sizing.sample_ns = d->now;
	prev = previous_pass(d, j);
	if (prev != NULL) {
		j->sizing.scaler = prev->sizing.scaler;
		prev->sizing.scaler = NULL;
		j->sizing.settled = prev->sizing.settled;
		snprintf(j->sizing.reason, sizeof(j->sizing.reason), "%s",
		    prev->sizing.reason);
		if (j->pass.worker_scale > 0 &&
		    strcmp(j->pass.cache_mode, prev->pass.cache_mode) != 0)
			carry_scaled(j);
	} else {
		rv = cwi_scaler_create(&j->sizing.scaler, &c,
		    initial_workers(d, &c));
		if (rv != CACHEW_OK)
			return rv;
		snprintf(j->sizing.reason, sizeof(j->sizing.reason), "new job");
	}
	j->sizing.want = cwi_scaler_target(j->sizing.scaler);
	j->sizing.count_fn = NULL;
	j->sizing.count_ctx = NULL;
	return CACHEW_OK;
}

/* ---- jobs ---------------------------------------------------------------- */

/* Drops the datasets no job refers to that nobody registered or used for
 * a client timeout: a long-running process (the embedded service) that
 * builds many pipelines keeps only those in use. A client between its
 * register and its job request is far quicker than that. */
static void
gc_datasets(cwi_dispatcher *d)
{
	for (size_t i = 0; i < d->datasets.n;) {
		dataset *ds = DATASET(d, i);
		bool used = ds->last_used_ns >= d->now ||
			    d->now - ds->last_used_ns <= d->cfg.client_timeout_ns;

		for (size_t k = 0; k < d->jobs.n && !used; k++)
			used = JOB(d, k)->ds == ds;
		if (used) {
			i++;
			continue;
		}
		ev_begin(d, "dataset_dropped");
		ev_u64(d, "dataset_id", ds->id);
		ev_end(d);
		vec_remove(&d->datasets, ds);
		free(ds->graph);
		free(ds);
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
			vec_remove(&d->jobs, j);
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
	pass_end(d, j, false); /* no-op when the data was done */
	for (size_t i = 0; i < d->tasks.n;) {
		task *t = TASK(d, i);
		if (t->job == j) {
			task_drop(d, t, "job_finished");
			continue;
		}
		i++;
	}
	j->finished = true;
	j->coord.target = CWI_ROUND_NONE;
	job_free_splits(j);
	ev_begin(d, "job_finished");
	ev_u64(d, "job_id", j->id);
	ev_str(d, "reason", reason);
	ev_end(d);
}

/* A client leaves (released or timed out). A shared job that goes on gets
 * back the splits its workers delivered that nobody acknowledged: they may
 * have gone to this client. With no client left the job ends. */
static void
client_leave(cwi_dispatcher *d, job *j, client *c, const char *event)
{
	size_t idx = (size_t)(c - j->clients);

	ev_begin(d, event);
	ev_u64(d, "job_id", j->id);
	ev_u64(d, "client_id", c->id);
	ev_end(d);
	memmove(&j->clients[idx], &j->clients[idx + 1],
	    (j->nclients - idx - 1) * sizeof(*c));
	j->nclients--;
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
	    !coordinated(j)) {
		release_splits(d, j, match_delivered, 0, "client_left", 0);
		drop_finished_removals(d, j);
	}
	coord_update(d, j);
}

static cachew_err
job_check_request(const cwi_dispatcher *d, const cwi_msg_job_get_or_create *r,
    const dataset *ds)
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
	if (r->processing_mode == CWI_MODE_DISTRIBUTED_EPOCH &&
	    ds->split_units < 0)
		return cwi_fail(CACHEW_EINVAL, "dataset %" PRIu64 " has no "
					       "splittable source: "
					       "distributed_epoch needs one "
					       "(use parallel_epochs)",
		    ds->id);
	if (r->job_name != NULL && r->job_name[0] == '\0')
		return cwi_fail(CACHEW_EINVAL, "empty job name (leave it out "
					       "for a private job)");
	if (d->cfg.autoscale) {
		cwi_scale_config c;
		return job_scale_config(d, r, &c);
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
	return CACHEW_OK;
}

/* Groups the dataset's units into about splits_per_worker splits per
 * available worker (at least one unit each). */
static cachew_err
job_make_splits(cwi_dispatcher *d, job *j)
{
	uint64_t want, w = workers_available(d);

	/* An autoscaled pool grows after the job starts (a provisioner may
	 * not have started any worker yet): size for the most it may have,
	 * so the epoch's last splits do not leave one worker busy while
	 * the others idle. */
	if (d->cfg.autoscale && d->cfg.max_workers > w)
		w = d->cfg.max_workers < 256 ? d->cfg.max_workers : 256;

	j->ledger.nunits = j->pass.graph != NULL ? j->pass.units
					  : (uint64_t)j->ds->split_units;
	want = (uint64_t)d->cfg.splits_per_worker * (w > 0 ? w : 1);
	if (want > CWI_PROTO_MAX_SPLITS)
		want = CWI_PROTO_MAX_SPLITS;
	j->ledger.units_per_split = j->ledger.nunits / want +
	    (j->ledger.nunits % want != 0);
	if (j->ledger.units_per_split == 0)
		j->ledger.units_per_split = 1;
	j->ledger.nsplits = j->ledger.nunits / j->ledger.units_per_split +
	    (j->ledger.nunits % j->ledger.units_per_split != 0);
	if (j->ledger.nsplits == 0)
		return CACHEW_OK;
	j->ledger.splits = calloc(j->ledger.nsplits, sizeof(*j->ledger.splits));
	j->ledger.ring = malloc(j->ledger.nsplits * sizeof(*j->ledger.ring));
	if (j->ledger.splits == NULL || j->ledger.ring == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (uint64_t k = 0; k < j->ledger.nsplits; k++)
		ring_push(&j->ledger, k, false);
	j->ledger.npending = j->ledger.nsplits;
	return CACHEW_OK;
}

static cachew_err
job_create(cwi_dispatcher *d, const cwi_msg_job_get_or_create *r,
    dataset *ds, job **out)
{
	job *j = calloc(1, sizeof(*j));
	cachew_err rv;

	if (j == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	j->ds = ds;
	ds->last_used_ns = d->now;
	j->iteration = r->iteration;
	j->mode = r->processing_mode;
	j->compression = r->compression;
	j->seed = r->seed;
	j->policy = r->worker_policy;
	j->num_workers = r->num_workers;
	j->num_consumers = r->num_consumers;
	j->sizing.count_fn = d->cfg.worker_count;
	j->sizing.count_ctx = d->cfg.worker_count_ctx;
	j->coord.target = CWI_ROUND_NONE;
	if (r->job_name != NULL &&
	    (j->name = cwi_strdup(r->job_name)) == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	if (d->offered != NULL && j->mode == CWI_MODE_DISTRIBUTED_EPOCH &&
	    d->offered->graph != NULL) {
		cwi_job_pass *p = d->offered;
		j->pass.graph = p->graph;
		j->pass.graph_len = p->graph_len;
		j->pass.units = p->units;
		j->pass.worker_scale = p->worker_scale;
		j->pass.ctx = p->ctx;
		snprintf(j->pass.cache_mode, sizeof(j->pass.cache_mode), "%s",
		    p->mode);
		snprintf(j->pass.cache_reason, sizeof(j->pass.cache_reason),
		    "%s", p->event);
		p->graph = NULL;
		p->ctx = NULL;
		d->offered = NULL;
	}
	if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH) {
		rv = job_make_splits(d, j);
		if (rv != CACHEW_OK)
			goto fail;
	}
	if (d->cfg.autoscale) {
		rv = job_scale_init(d, j, r);
		if (rv != CACHEW_OK)
			goto fail;
	}
	if (!vec_push(&d->jobs, j)) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	j->id = d->next_job_id++;
	ev_begin(d, "job_created");
	ev_u64(d, "job_id", j->id);
	if (j->name != NULL) {
		ev_str(d, "name", j->name);
		ev_u64(d, "iteration", j->iteration);
	}
	ev_u64(d, "dataset_id", ds->id);
	ev_str(d, "processing_mode", cwi_processing_mode_name(j->mode));
	ev_u64(d, "num_consumers", j->num_consumers);
	if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH) {
		ev_u64(d, "splits", j->ledger.nsplits);
		ev_u64(d, "units_per_split", j->ledger.units_per_split);
	}
	if (j->sizing.scaler != NULL) {
		ev_str(d, "policy", j->sizing.scale_name);
		ev_u64(d, "want", j->sizing.want);
	}
	if (j->pass.cache_mode[0] != '\0') {
		ev_str(d, "cache_mode", j->pass.cache_mode);
		ev_str(d, "cache", j->pass.cache_reason);
	}
	ev_end(d);
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
	memset(c, 0, sizeof(*c));
	c->id = d->next_client_id++;
	c->consumer_index = consumer_index;
	c->last_seen_ns = now;
	c->told_target = CWI_ROUND_NONE;
	ev_begin(d, "client_joined");
	ev_u64(d, "job_id", j->id);
	ev_u64(d, "client_id", c->id);
	if (consumer_index >= 0)
		ev_i64(d, "consumer_index", consumer_index);
	ev_end(d);
	return c;
}

static job *
find_named_job(const cwi_dispatcher *d, const char *name, uint64_t iteration)
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
	dataset *ds = find_dataset(d, req->dataset_id);
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
	rv = job_check_request(d, req, ds);
	if (rv != CACHEW_OK)
		return rv;
	if (req->job_name != NULL)
		j = find_named_job(d, req->job_name, req->iteration);
	if (j != NULL) {
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
		rv = job_create(d, req, ds, &j);
		if (rv != CACHEW_OK)
			return rv;
		created = true;
	}
	if (c == NULL) {
		c = client_add(d, j, req->consumer_index, now_ns);
		if (c == NULL) {
			if (created) {
				vec_remove(&d->jobs, j);
				job_free(d, j);
			}
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
	}
	c->last_seen_ns = now_ns;
	rep->job_id = j->id;
	rep->client_id = c->id;
	rep->created = created;
	rep->processing_mode = j->mode;
	rep->num_consumers = j->num_consumers;
	rep->compression = j->compression;
	rep->heartbeat_interval_ms = d->cfg.client_heartbeat_ms;
	if (created) {
		if (j->mode == CWI_MODE_DISTRIBUTED_EPOCH)
			epoch_check(d, j); /* an empty dataset */
		reconcile(d);
	}
	return CACHEW_OK;
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
	client_leave(d, j, c, "client_released");
	reconcile(d);
	gc_finished(d);
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_set_worker_count(cwi_dispatcher *d, uint64_t now_ns,
    uint64_t job_id, cwi_worker_count_fn fn, void *ctx)
{
	job *j = find_job(d, job_id);

	d->now = now_ns;
	if (j == NULL || j->finished)
		return cwi_fail(CACHEW_ENOENT, "job %" PRIu64 " is not running",
		    job_id);
	j->sizing.count_fn = fn != NULL ? fn : cwi_worker_count_default;
	j->sizing.count_ctx = fn != NULL ? ctx : NULL;
	if (fn == NULL && j->sizing.scaler != NULL)
		j->sizing.count_fn = NULL; /* back to the policy engine */
	reconcile(d);
	return CACHEW_OK;
}

/* ---- splits: lease and acknowledge --------------------------------------- */

static uint32_t
active_tasks(const cwi_dispatcher *d, const job *j)
{
	uint32_t n = 0;

	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->job == j &&
		    TASK(d, i)->state == CWI_TASK_ACTIVE)
			n++;
	return n;
}

cachew_err
cwi_dispatcher_split_lease(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_split_lease *req, cwi_msg_split_lease_reply *rep)
{
	worker *w = find_worker(d, req->worker_id);
	task *t = find_task(d, req->task_id);
	uint64_t want, fair, ids_n = 0, *ids = NULL;
	uint32_t nactive;
	job *j;

	cwi_pmsg_body_init(CWI_MSG_SPLIT_LEASE_REPLY, rep);
	d->now = now_ns;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOENT, "worker %" PRIu64 " is not "
					       "registered",
		    req->worker_id);
	if (t == NULL || t->w != w)
		return cwi_fail(CACHEW_ENOENT, "task %" PRIu64 " is not "
					       "assigned to worker %" PRIu64,
		    req->task_id, req->worker_id);
	j = t->job;
	if (j->mode != CWI_MODE_DISTRIBUTED_EPOCH)
		return cwi_fail(CACHEW_EINVAL, "task %" PRIu64 " belongs to a "
					       "parallel_epochs job: it reads "
					       "its whole input, without "
					       "splits",
		    t->id);
	w->last_seen_ns = now_ns;
	/* Coordinated: a task ends with an incomplete last round that it
	 * can only drop once it knows no split will come, and the splits
	 * leased elsewhere may be waiting in exactly such rounds: waiting
	 * for them would wait forever. So once nothing is pending, its
	 * input is over. */
	if (t->state == CWI_TASK_REMOVING || w->draining || j->data_done ||
	    (coordinated(j) && t->state == CWI_TASK_ACTIVE &&
		j->ledger.npending == 0)) {
		rep->end_of_splits = true;
		return CACHEW_OK;
	}
	if (t->state == CWI_TASK_STARTING || j->ledger.npending == 0) {
		/* Everything is leased: the epoch ends as soon as the last
		 * acks arrive, and the task learns it by asking again, so it
		 * asks often (an epoch's tail would otherwise wait a whole
		 * retry interval). */
		rep->retry_ms = t->state == CWI_TASK_STARTING
		    ? d->cfg.lease_retry_ms
		    : (d->cfg.lease_retry_ms + 4) / 5;
		return CACHEW_OK;
	}
	/* Several splits per round trip, but no more than a fair share of
	 * what is left, so the last splits do not queue behind one worker. */
	nactive = active_tasks(d, j);
	fair = (j->ledger.npending + nactive - 1) / (nactive > 0 ? nactive : 1);
	want = req->max_splits;
	if (want == 0 || want > d->cfg.max_lease)
		want = d->cfg.max_lease;
	if (want > fair)
		want = fair;
	if (want == 0)
		want = 1;
	rep->splits = calloc((size_t)want, sizeof(*rep->splits));
	if (events_on(d))
		ids = malloc((size_t)want * sizeof(*ids));
	if (rep->splits == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	while (rep->nsplits < want) {
		uint64_t id;
		split *s;
		if (!ring_pop(&j->ledger, &id))
			break;
		s = &j->ledger.splits[id];
		s->state = SPLIT_LEASED;
		s->part_acks = 0;
		s->lease++;
		s->task_id = t->id;
		s->worker_id = w->id;
		s->delivered = false;
		j->ledger.npending--;
		j->ledger.nleased++;
		t->nleased++;
		split_range(&j->ledger, id, &rep->splits[rep->nsplits]);
		rep->splits[rep->nsplits++].lease = s->lease;
		if (ids != NULL)
			ids[ids_n++] = id;
	}
	if (ids != NULL) {
		task_event(d, "split_leased", t);
		ev_ids(d, "splits", ids, ids_n);
		ev_end(d);
	}
	free(ids);
	return CACHEW_OK;
}

/* The split's room for one more client acknowledging its part. */
static cachew_err
ackers_reserve(split *s)
{
	uint32_t cap;
	uint64_t *a;

	if (s->part_acks < s->ackers_cap)
		return CACHEW_OK;
	cap = s->ackers_cap < 4 ? 4 : s->ackers_cap * 2;
	if (cap <= s->ackers_cap ||
	    (a = realloc(s->ackers, cap * sizeof(*a))) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	s->ackers = a;
	s->ackers_cap = cap;
	return CACHEW_OK;
}

/* Checks acknowledgements before any is applied: split ids in range, and
 * room to record each client's part of a split read by several. */
static cachew_err
acks_check(job *j, const uint64_t *ids, const uint64_t *parts, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		cachew_err rv;
		if (ids[i] >= j->ledger.nsplits)
			return cwi_fail(CACHEW_EINVAL,
			    "split %" PRIu64 " is out of range: job %" PRIu64
			    " has %" PRIu64 " splits",
			    ids[i], j->id, j->ledger.nsplits);
		split *s = &j->ledger.splits[ids[i]];
		if (parts != NULL && parts[i] > 1 &&
		    s->state != SPLIT_ACKED &&
		    (rv = ackers_reserve(s)) != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* Whether client_id's part of s is new (and records it); room was
 * reserved by acks_check. */
static bool
part_ack_new(split *s, uint64_t client_id)
{
	for (uint32_t k = 0; k < s->part_acks; k++)
		if (s->ackers[k] == client_id)
			return false;
	s->ackers[s->part_acks++] = client_id;
	return true;
}

/* Applies acknowledgements (checked by acks_check). */
static void
acks_apply(cwi_dispatcher *d, job *j, const client *c, const uint64_t *ids,
    const uint64_t *parts, const uint64_t *leases, size_t n)
{
	uint64_t *fresh = NULL, nfresh = 0, dups = 0;

	if (n == 0)
		return;
	if (events_on(d))
		fresh = malloc(n * sizeof(*fresh));
	for (size_t i = 0; i < n; i++) {
		split *s = &j->ledger.splits[ids[i]];
		uint64_t need = parts != NULL && parts[i] > 0 ? parts[i] : 1;
		s->acks++;
		if (s->state == SPLIT_ACKED) {
			dups++;
			continue;
		}
		/* A lease read by several clients of a shared job: each
		 * acknowledges its part, once. A part of an earlier lease
		 * (an ack resent after the split was released and leased
		 * again) is not a part of this one. */
		if (need > 1) {
			if ((leases != NULL && leases[i] != 0 &&
				leases[i] != s->lease) ||
			    !part_ack_new(s, c->id)) {
				dups++;
				continue;
			}
			if (s->part_acks < need)
				continue;
		}
		if (s->state == SPLIT_LEASED) {
			task *t = s->task_id != 0 ? find_task(d, s->task_id)
						  : NULL;
			if (t != NULL && t->nleased > 0)
				t->nleased--;
			j->ledger.nleased--;
		} else {
			/* Released after a death, yet it did arrive: its
			 * ring entry goes stale. */
			j->ledger.npending--;
		}
		s->state = SPLIT_ACKED;
		s->task_id = 0;
		free(s->ackers);
		s->ackers = NULL;
		s->ackers_cap = 0;
		j->ledger.nacked++;
		if (fresh != NULL)
			fresh[nfresh] = ids[i];
		nfresh++;
	}
	if (fresh != NULL && (nfresh > 0 || dups > 0)) {
		ev_begin(d, "split_acked");
		ev_u64(d, "job_id", j->id);
		ev_u64(d, "client_id", c->id);
		ev_ids(d, "splits", fresh, (size_t)nfresh);
		if (dups > 0)
			ev_u64(d, "duplicates", dups);
		ev_end(d);
	}
	free(fresh);
	epoch_check(d, j);
	if (drop_finished_removals(d, j))
		reconcile(d);
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
		rv = acks_check(j, req->split_ids,
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

/* The job's operator counters: its tasks' (as their workers last
 * reported them) summed by operator, in the order first met. */
static cachew_err
fill_job_ops(const cwi_dispatcher *d, const job *j,
    cwi_msg_client_heartbeat_reply *rep)
{
	size_t cap = 0;

	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->job == j)
			cap += TASK(d, i)->nops;
	if (cap == 0)
		return CACHEW_OK;
	if (cap > CWI_PROTO_MAX_OPS)
		cap = CWI_PROTO_MAX_OPS;
	rep->ops = calloc(cap, sizeof(*rep->ops));
	if (rep->ops == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		if (t->job != j)
			continue;
		for (size_t k = 0; k < t->nops; k++) {
			const cwi_op_counters *c = &t->ops[k];
			cwi_op_counters *o = NULL;
			for (size_t m = 0; m < rep->nops; m++)
				if (strcmp(rep->ops[m].name, c->name) == 0)
					o = &rep->ops[m];
			if (o == NULL) {
				if (rep->nops == cap)
					continue;
				o = &rep->ops[rep->nops];
				o->name = cwi_strdup(c->name);
				if (o->name == NULL)
					return cwi_fail(CACHEW_ENOMEM,
					    "out of memory");
				rep->nops++;
			}
			o->elements += c->elements;
			o->bytes += c->bytes;
			o->busy_ns += c->busy_ns;
			o->wait_ns += c->wait_ns;
			o->buffered += c->buffered;
		}
	}
	return CACHEW_OK;
}

/* The reply's task list: every task of the job, in id order. */
static cachew_err
fill_task_list(const cwi_dispatcher *d, const job *j,
    cwi_msg_client_heartbeat_reply *rep)
{
	size_t n = 0;

	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->job == j)
			n++;
	if (n == 0)
		return CACHEW_OK;
	rep->tasks = calloc(n, sizeof(*rep->tasks));
	if (rep->tasks == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		cwi_task_info *ti;
		if (t->job != j)
			continue;
		ti = &rep->tasks[rep->ntasks++];
		ti->task_id = t->id;
		ti->worker_id = t->w->id;
		ti->state = t->state;
		ti->start_round = t->start_round;
		ti->end_round = t->end_round;
		ti->address = cwi_strdup(t->w->address);
		if (ti->address == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

/* Coordinated reads: a consumer reporting its round either acknowledges
 * the announced change (it was told the round and has not read it: the
 * next round it reads is at most that one) or has already read past it,
 * which moves the change further out. A consumer waiting at the round
 * itself reports exactly it: that is an acknowledgement, or the change
 * would move away from every consumer that keeps up. */
static void
coord_heartbeat(cwi_dispatcher *d, job *j, client *c)
{
	if (j->coord.target == CWI_ROUND_NONE)
		return;
	if (c->round > j->coord.target) {
		j->coord.target = CWI_ROUND_NONE;
		coord_open(d, j);
		return;
	}
	if (c->told_target == j->coord.target)
		c->ready = true;
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
		rv = acks_check(j, req->acked_splits, NULL,
		    req->nacked_splits);
	if (rv != CACHEW_OK)
		return rv;
	c->last_seen_ns = now_ns;
	c->batch_time_ns = req->batch_time_ns;
	c->wait_time_ns = req->wait_time_ns;
	c->buffer_fill = req->buffer_fill;
	c->round = req->round;
	/* A peer's counts: a product that would wrap is not a measurement. */
	if (req->batches > 0 && req->batch_time_ns > 0 &&
	    req->batch_time_ns <= UINT64_MAX / 4 / req->batches) {
		c->acc_batches += req->batches;
		c->acc_elapsed_ns += req->batches * req->batch_time_ns;
	}
	c->acc_wait_ns += req->wait_time_ns;
	/* A peer's float: anything outside 0..1 (NaN included) is 0. */
	c->acc_fill += req->buffer_fill >= 0 && req->buffer_fill <= 1
	    ? req->buffer_fill : 0;
	c->acc_reports++;
	acks_apply(d, j, c, req->acked_splits, NULL, NULL,
	    req->nacked_splits);
	if (coordinated(j)) {
		coord_heartbeat(d, j, c);
		coord_update(d, j);
	}
	rep->job_finished = j->data_done;
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
		(void)fill_job_ops(d, j, rep); /* metrics only */
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
	ev_begin(d, event);
	ev_u64(d, "worker_id", w->id);
	if (reason != NULL)
		ev_str(d, "reason", reason);
	ev_end(d);
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		if (!j->finished)
			release_splits(d, j,
			    reason == NULL && !coordinated(j)
				? match_worker_undelivered
				: match_worker,
			    w->id,
			    reason != NULL ? reason : "worker_deregistered",
			    w->id);
	}
	for (size_t i = 0; i < d->tasks.n;) {
		task *t = TASK(d, i);
		if (t->w == w) {
			task_drop(d, t, "worker_gone");
			continue;
		}
		i++;
	}
	vec_remove(&d->workers, w);
	free(w->address);
	free(w->build);
	free(w);
	for (size_t i = 0; i < d->jobs.n; i++)
		coord_update(d, JOB(d, i));
}

cachew_err
cwi_dispatcher_worker_register(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_register *req, cwi_msg_worker_register_reply *rep)
{
	worker *w;

	cwi_pmsg_body_init(CWI_MSG_WORKER_REGISTER_REPLY, rep);
	d->now = now_ns;
	if (req->address == NULL || req->address[0] == '\0')
		return cwi_fail(CACHEW_EINVAL, "worker_register: empty "
					       "address");
	w = calloc(1, sizeof(*w));
	if (w == NULL || (w->address = cwi_strdup(req->address)) == NULL ||
	    (req->build != NULL &&
		(w->build = cwi_strdup(req->build)) == NULL) ||
	    !vec_push(&d->workers, w)) {
		if (w != NULL) {
			free(w->address);
			free(w->build);
		}
		free(w);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	/* A worker restarted faster than its timeout: the old incarnation
	 * is gone, and so is what it held. */
	for (size_t i = 0; i < d->workers.n; i++) {
		worker *old = WORKER(d, i);
		if (old != w && strcmp(old->address, w->address) == 0) {
			worker_remove(d, old, "worker_dead", "replaced");
			break;
		}
	}
	w->id = d->next_worker_id++;
	w->cores = req->cores;
	w->memory_bytes = req->memory_bytes;
	w->last_seen_ns = now_ns;
	ev_begin(d, "worker_registered");
	ev_u64(d, "worker_id", w->id);
	ev_str(d, "address", w->address);
	ev_u64(d, "cores", w->cores);
	ev_end(d);
	rep->worker_id = w->id;
	rep->heartbeat_interval_ms = d->cfg.worker_heartbeat_ms;
	rep->worker_timeout_ms =
	    (uint32_t)(d->cfg.worker_timeout_ns / NS_PER_MS);
	reconcile(d);
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_worker_deregister(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_deregister *req)
{
	worker *w = find_worker(d, req->worker_id);

	d->now = now_ns;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOENT, "worker %" PRIu64 " is not "
					       "registered",
		    req->worker_id);
	worker_remove(d, w, "worker_deregistered", NULL);
	reconcile(d);
	return CACHEW_OK;
}

static cachew_err
copy_ops(task *t, const cwi_task_report *r)
{
	cwi_op_counters *ops = NULL;

	if (r->nops > 0) {
		ops = calloc(r->nops, sizeof(*ops));
		if (ops == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < r->nops; i++) {
		ops[i] = r->ops[i];
		ops[i].name = cwi_strdup(r->ops[i].name != NULL ? r->ops[i].name
								: "");
		if (ops[i].name == NULL) {
			for (size_t k = 0; k < i; k++)
				free(ops[k].name);
			free(ops);
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
	}
	for (size_t i = 0; i < t->nops; i++)
		free(t->ops[i].name);
	free(t->ops);
	t->ops = ops;
	t->nops = r->nops;
	return CACHEW_OK;
}

/* Run and stall time since the last report (smaller counters: the worker
 * started over); stall never counts for more than the run. */
static void
task_busy(task *t, const cwi_task_report *r)
{
	uint64_t drun, dstall;

	drun = r->run_ns >= t->run_ns ? r->run_ns - t->run_ns : r->run_ns;
	dstall = r->stall_ns >= t->stall_ns ? r->stall_ns - t->stall_ns
					    : r->stall_ns;
	if (dstall > drun)
		dstall = drun;
	t->acc_run_ns += drun;
	t->acc_stall_ns += dstall;
	t->run_ns = r->run_ns;
	t->stall_ns = r->stall_ns;
}

/* Counters, delivery progress and completion of one reported task. */
static void
task_report(cwi_dispatcher *d, task *t, const cwi_task_report *r,
    uint64_t now)
{
	job *j = t->job;
	struct split_ledger *l = &j->ledger;
	uint64_t de, db;

	/* Counters only grow; smaller ones mean the worker started over. */
	de = r->elements >= t->elements ? r->elements - t->elements
					: r->elements;
	db = r->bytes >= t->bytes ? r->bytes - t->bytes : r->bytes;
	j->elements += de;
	j->bytes += db;
	if (t->rate_at_ns != 0 && now > t->rate_at_ns) {
		double dt = (double)(now - t->rate_at_ns) / 1e9;
		t->elements_per_s = (double)de / dt;
		t->bytes_per_s = (double)db / dt;
	}
	t->rate_at_ns = now;
	t->elements = r->elements;
	t->bytes = r->bytes;
	task_busy(t, r);
	(void)copy_ops(t, r); /* metrics only: keep the old ones on ENOMEM */
	for (size_t k = 0; k < r->nsplits_delivered && l->splits != NULL; k++) {
		uint64_t id = r->splits_delivered[k];
		if (id < l->nsplits && l->splits[id].state == SPLIT_LEASED &&
		    l->splits[id].task_id == t->id)
			l->splits[id].delivered = true;
	}
	if (r->done)
		task_done(d, t);
}

static bool
reported(const cwi_msg_worker_heartbeat *req, uint64_t task_id)
{
	for (size_t i = 0; i < req->ntasks; i++)
		if (req->tasks[i].task_id == task_id)
			return true;
	return false;
}

static cachew_err
fill_task_def(const task *t, uint32_t lease_size, cwi_task_def *td)
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
	td->num_consumers = t->job->num_consumers;
	td->lease_size = lease_size;
	td->graph = malloc(len);
	if (td->graph == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	memcpy(td->graph, graph, len);
	td->graph_len = len;
	return CACHEW_OK;
}

/* Tasks the worker should have and did not report (start) and tasks it
 * reported that are not its (stop). */
static cachew_err
fill_worker_reply(cwi_dispatcher *d, const worker *w,
    const cwi_msg_worker_heartbeat *req, cwi_msg_worker_heartbeat_reply *rep)
{
	size_t nstart = 0, nstop = 0;
	cachew_err rv;

	for (size_t i = 0; i < d->tasks.n; i++)
		if (TASK(d, i)->w == w && !reported(req, TASK(d, i)->id))
			nstart++;
	for (size_t i = 0; i < req->ntasks; i++) {
		task *t = find_task(d, req->tasks[i].task_id);
		if (t == NULL || t->w != w)
			nstop++;
	}
	if (nstart > 0)
		rep->start = calloc(nstart, sizeof(*rep->start));
	if (nstop > 0)
		rep->stop = calloc(nstop, sizeof(*rep->stop));
	if ((nstart > 0 && rep->start == NULL) ||
	    (nstop > 0 && rep->stop == NULL))
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		if (t->w != w || reported(req, t->id))
			continue;
		rv = fill_task_def(t, d->cfg.lease_size,
		    &rep->start[rep->nstart++]);
		if (rv != CACHEW_OK)
			return rv;
	}
	for (size_t i = 0; i < req->ntasks; i++) {
		task *t = find_task(d, req->tasks[i].task_id);
		if (t == NULL || t->w != w)
			rep->stop[rep->nstop++] = req->tasks[i].task_id;
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_worker_heartbeat(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_worker_heartbeat *req, cwi_msg_worker_heartbeat_reply *rep)
{
	worker *w = find_worker(d, req->worker_id);

	cwi_pmsg_body_init(CWI_MSG_WORKER_HEARTBEAT_REPLY, rep);
	d->now = now_ns;
	if (w == NULL)
		return cwi_fail(CACHEW_ENOENT, "worker %" PRIu64 " is not "
					       "registered (timed out, or the "
					       "dispatcher restarted): "
					       "register again",
		    req->worker_id);
	w->last_seen_ns = now_ns;
	w->cpu_use = req->cpu_use;
	if (req->draining && !w->draining) {
		w->draining = true;
		ev_begin(d, "worker_draining");
		ev_u64(d, "worker_id", w->id);
		ev_end(d);
		for (size_t i = 0; i < d->tasks.n;) {
			task *t = TASK(d, i);
			if (t->w == w && task_begin_remove(d, t, "draining"))
				continue;
			i++;
		}
	}
	for (size_t i = 0; i < req->ntasks; i++) {
		task *t = find_task(d, req->tasks[i].task_id);
		if (t != NULL && t->w == w)
			task_report(d, t, &req->tasks[i], now_ns);
	}
	reconcile(d);
	return fill_worker_reply(d, w, req, rep);
}

/* ---- datasets ------------------------------------------------------------ */

cachew_err
cwi_dispatcher_dataset_register(cwi_dispatcher *d, uint64_t now_ns,
    const cwi_msg_dataset_register *req, cwi_msg_dataset_register_reply *rep)
{
	dataset *ds;
	char hex[33];

	cwi_pmsg_body_init(CWI_MSG_DATASET_REGISTER_REPLY, rep);
	d->now = now_ns;
	if (req->graph_len == 0)
		return cwi_fail(CACHEW_EINVAL, "dataset_register: empty graph");
	if (req->split_units < -1)
		return cwi_fail(CACHEW_EINVAL, "dataset_register: split_units "
					       "%" PRId64 " is negative",
		    req->split_units);
	for (size_t i = 0; i < d->datasets.n; i++) {
		ds = DATASET(d, i);
		if (ds->fp.hi == req->fingerprint.hi &&
		    ds->fp.lo == req->fingerprint.lo) {
			ds->last_used_ns = now_ns;
			rep->dataset_id = ds->id;
			return CACHEW_OK;
		}
	}
	ds = calloc(1, sizeof(*ds));
	if (ds == NULL || (ds->graph = malloc(req->graph_len)) == NULL ||
	    !vec_push(&d->datasets, ds)) {
		if (ds != NULL)
			free(ds->graph);
		free(ds);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	memcpy(ds->graph, req->graph, req->graph_len);
	ds->graph_len = req->graph_len;
	ds->fp = req->fingerprint;
	ds->split_units = req->split_units;
	ds->last_used_ns = now_ns;
	ds->id = d->next_dataset_id++;
	cachew_fingerprint_hex(&ds->fp, hex);
	ev_begin(d, "dataset_registered");
	ev_u64(d, "dataset_id", ds->id);
	ev_str(d, "fingerprint", hex);
	ev_i64(d, "split_units", ds->split_units);
	ev_end(d);
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
	/* Ten client heartbeats, at least 2 s: an ack is sent the moment
	 * the split's end arrives, so this only catches lost ones. */
	uint64_t grace = (uint64_t)d->cfg.client_heartbeat_ms * 10000000u;
	if (grace < 2000000000u)
		grace = 2000000000u;
	for (size_t i = 0; i < d->jobs.n; i++) {
		job *j = JOB(d, i);
		if (!j->finished && !coordinated(j) && now_ns > grace)
			release_splits(d, j, match_orphaned, now_ns - grace,
			    "unacknowledged", 0);
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
		reconcile(d);
	gc_finished(d);
}

/* ---- status -------------------------------------------------------------- */

static cachew_err
status_workers(const cwi_dispatcher *d, uint64_t now, cwi_msg_status_reply *rep)
{
	if (d->workers.n == 0)
		return CACHEW_OK;
	rep->workers = calloc(d->workers.n, sizeof(*rep->workers));
	if (rep->workers == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->workers.n; i++) {
		const worker *w = WORKER(d, i);
		cwi_worker_status *ws = &rep->workers[rep->nworkers++];
		ws->worker_id = w->id;
		ws->cores = w->cores;
		ws->draining = w->draining;
		ws->heartbeat_age_ms = now > w->last_seen_ns
		    ? (now - w->last_seen_ns) / NS_PER_MS
		    : 0;
		ws->cpu_use = w->cpu_use;
		ws->tasks = w->ntasks;
		if ((ws->address = cwi_strdup(w->address)) == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

static cachew_err
status_jobs(const cwi_dispatcher *d, cwi_msg_status_reply *rep)
{
	if (d->jobs.n == 0)
		return CACHEW_OK;
	rep->jobs = calloc(d->jobs.n, sizeof(*rep->jobs));
	if (rep->jobs == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->jobs.n; i++) {
		const job *j = JOB(d, i);
		cwi_job_status *js = &rep->jobs[rep->njobs++];
		cwi_job_view v;
		job_view(d, j, &v);
		js->job_id = j->id;
		js->iteration = j->iteration;
		js->dataset_id = j->ds->id;
		js->processing_mode = j->mode;
		js->num_consumers = j->num_consumers;
		js->clients = (uint32_t)j->nclients;
		js->tasks = v.tasks;
		js->target_workers = j->sizing.target;
		js->units_per_split = j->ledger.units_per_split;
		js->splits_total = j->ledger.nsplits;
		js->splits_pending = j->ledger.npending;
		js->splits_leased = j->ledger.nleased;
		js->splits_acked = j->ledger.nacked;
		js->elements = j->elements;
		js->bytes = j->bytes;
		js->elements_per_s = v.elements_per_s;
		for (size_t k = 0; k < d->tasks.n; k++)
			if (TASK(d, k)->job == j)
				js->bytes_per_s += TASK(d, k)->bytes_per_s;
		js->batch_time_ns = v.batch_time_ns;
		js->data_done = j->data_done;
		js->finished = j->finished;
		if (j->sizing.scale_name[0] != '\0') {
			js->weight = j->sizing.weight;
			js->want = j->sizing.want;
			js->granted = j->sizing.granted;
			js->settled = j->sizing.settled;
			js->scale_policy = cwi_strdup(j->sizing.scale_name);
			js->reason = cwi_strdup(j->sizing.reason);
			if (js->scale_policy == NULL || js->reason == NULL)
				return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		if (j->pass.cache_mode[0] != '\0') {
			js->cache_mode = cwi_strdup(j->pass.cache_mode);
			js->cache_reason = cwi_strdup(j->pass.cache_reason);
			if (js->cache_mode == NULL || js->cache_reason == NULL)
				return cwi_fail(CACHEW_ENOMEM, "out of memory");
		}
		if (j->name != NULL && (js->name = cwi_strdup(j->name)) == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_status(cwi_dispatcher *d, uint64_t now_ns,
    cwi_msg_status_reply *rep)
{
	cachew_err rv;

	cwi_pmsg_body_init(CWI_MSG_STATUS_REPLY, rep);
	rep->time_ns = now_ns;
	if (d->cfg.autoscale)
		rep->pool_target = d->pool_target;
	rv = status_workers(d, now_ns, rep);
	if (rv == CACHEW_OK)
		rv = status_jobs(d, rep);
	if (rv != CACHEW_OK)
		return rv;
	if (d->datasets.n > 0) {
		rep->datasets = calloc(d->datasets.n, sizeof(*rep->datasets));
		if (rep->datasets == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < d->datasets.n; i++) {
		cwi_dataset_status *s = &rep->datasets[rep->ndatasets++];
		s->dataset_id = DATASET(d, i)->id;
		s->fingerprint = DATASET(d, i)->fp;
		s->split_units = DATASET(d, i)->split_units;
	}
	if (d->tasks.n > 0) {
		rep->tasks = calloc(d->tasks.n, sizeof(*rep->tasks));
		if (rep->tasks == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < d->tasks.n; i++) {
		const task *t = TASK(d, i);
		cwi_task_status *s = &rep->tasks[rep->ntasks++];
		s->task_id = t->id;
		s->job_id = t->job->id;
		s->worker_id = t->w->id;
		s->state = t->state;
		s->splits_leased = t->nleased;
		s->elements = t->elements;
		s->bytes = t->bytes;
		s->elements_per_s = t->elements_per_s;
	}
	return CACHEW_OK;
}

cachew_err
cwi_dispatcher_task_ops(const cwi_dispatcher *d, uint64_t task_id,
    const cwi_op_counters **ops, size_t *nops)
{
	const task *t = find_task(d, task_id);

	if (t == NULL)
		return cwi_fail(CACHEW_ENOENT,
		    "task %" PRIu64 " is not running", task_id);
	*ops = t->ops;
	*nops = t->nops;
	return CACHEW_OK;
}

/* ---- one entry point for a server loop ----------------------------------- */

cachew_err
cwi_dispatcher_handle(cwi_dispatcher *d, uint64_t now_ns, const cwi_pmsg *req,
    cwi_pmsg *rep)
{
	cwi_msg_type rtype = CWI_MSG_OK;
	cachew_err rv;

	cwi_pmsg_init(rep, CWI_MSG_NONE);
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
	default:
		rv = cwi_fail(CACHEW_EPROTO, "the dispatcher does not take %s "
					     "messages",
		    cwi_msg_type_name(req->type));
		break;
	}
	rep->type = rtype;
	if (rv != CACHEW_OK) {
		const char *msg = cwi_errmsg_get();
		cwi_pmsg_free(rep);
		cwi_pmsg_init(rep, CWI_MSG_ERROR);
		rep->u.error.code = (int64_t)rv;
		rep->u.error.message = cwi_strdup(msg != NULL ? msg : "");
		if (rep->u.error.message != NULL &&
		    strlen(rep->u.error.message) > CWI_PROTO_MAX_ERRMSG)
			rep->u.error.message[CWI_PROTO_MAX_ERRMSG] = '\0';
	}
	return rv;
}

/* ---- autocaching passes --------------------------------------------------- */

bool
cwi_dispatcher_job_wants_pass(const cwi_dispatcher *d,
    const cwi_msg_job_get_or_create *req, uint8_t **graph, size_t *len,
    uint64_t *units)
{
	const dataset *ds = find_dataset(d, req->dataset_id);

	*graph = NULL;
	*len = 0;
	*units = 0;
	if (ds == NULL || req->processing_mode != CWI_MODE_DISTRIBUTED_EPOCH ||
	    ds->split_units < 0 || ds->graph_len == 0)
		return false;
	if (req->job_name != NULL &&
	    find_named_job(d, req->job_name, req->iteration) != NULL)
		return false;
	*graph = malloc(ds->graph_len);
	if (*graph == NULL)
		return false;
	memcpy(*graph, ds->graph, ds->graph_len);
	*len = ds->graph_len;
	*units = (uint64_t)ds->split_units;
	return true;
}

void
cwi_dispatcher_offer_pass(cwi_dispatcher *d, cwi_job_pass *p)
{
	d->offered = p;
}

size_t
cwi_dispatcher_take_pass_ends(cwi_dispatcher *d, cwi_pass_end **out)
{
	size_t n = d->npass_ends;

	*out = d->pass_ends;
	d->pass_ends = NULL;
	d->npass_ends = d->cappass_ends = 0;
	return n;
}

void
cwi_dispatcher_pass_ends_free(cwi_pass_end *v, size_t n)
{
	for (size_t i = 0; v != NULL && i < n; i++) {
		for (size_t k = 0; k < v[i].nops; k++)
			free(v[i].ops[k].name);
		free(v[i].ops);
	}
	free(v);
}

void
cwi_dispatcher_autocache_event(cwi_dispatcher *d, uint64_t now_ns,
    uint64_t job_id, const char *mode, const char *text)
{
	job *j = find_job(d, job_id);

	d->now = now_ns;
	if (j == NULL)
		return;
	if (mode != NULL)
		snprintf(j->pass.cache_mode, sizeof(j->pass.cache_mode), "%s",
		    mode);
	snprintf(j->pass.cache_reason, sizeof(j->pass.cache_reason), "%s",
	    text);
	ev_begin(d, "autocache");
	ev_u64(d, "job_id", j->id);
	ev_str(d, "cache_mode", j->pass.cache_mode);
	ev_str(d, "cache", text);
	ev_end(d);
}
