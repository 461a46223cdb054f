/*
 * sim_autocache.c - `cachew sim autocache`: Cachew's Figure 7 sweep.
 *
 * The modelled job reads source rows from remote object storage, then an
 * `autocache` marker (the source-cache candidate), then inflates each row
 * 2.5x, then sleeps (the expensive, non-cacheable-by-source part); the
 * pipeline end is the full-cache candidate. The sweep varies the sleep
 * from 200 to 500 ms per batch of 900 rows. For each setting every policy
 * (default, cachew, and the fixed compute, source and full) runs a job of
 * EPOCHS passes through the same job state machine the dispatcher uses
 * (autocache.h), in virtual time, and the report gives its decision and
 * epoch time next to the best fixed policy's. docs/autocaching.md holds
 * the numbers below and the results.
 *
 * The policies see measurements, not the model: every per-row compute
 * time and every storage rate they are given is the true value times a
 * seeded jitter of +-JITTER (profiling and the probe are not exact), drawn
 * afresh for each decision. The outcome (time) always uses the truth.
 */
#include "../policy/autocache.h"
#include "sim.h"

#include "../core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model ----------------------------------------------------------- */

#define ROWS_PER_BATCH 900.0
#define BATCHES 1000.0        /* per epoch: 900,000 rows */
#define EPOCHS 10.0
#define SRC_ROW_BYTES 110e3    /* a source row (a compressed image) */
#define INFLATE 2.5            /* the inflate step's growth */
#define SRC_READ_MBPS 250.0    /* remote object storage, per reader */
#define INFLATE_NS 40e3        /* inflating one row */
#define CACHE_READ_MBPS 400.0  /* the cache storage (a shared file system),
				* per reader, as the probe measures it */
#define CACHE_READ_ROWS 50e3   /* its per-row limit: 20 us per row */
#define CACHE_WRITE_MBPS 500.0 /* per writer */
#define WORKERS 1.0
#define JITTER 0.03            /* measurement error of profile and probe */
#define SLEEP_FROM 200
#define SLEEP_TO 500
#define SLEEP_STEP 25
#define SLEEP_STEP_QUICK 50
#define NEAR 0.10              /* "near a crossover": within 10% of it */

enum { P_DEFAULT, P_CACHEW, P_COMPUTE, P_SOURCE, P_FULL, NPOLICIES };
static const char *const policy_names[NPOLICIES] = {
    "default", "cachew", "compute", "source", "full"};

/* The two candidates: 0 the marker after the read, 1 the end. */
#define NCAND 2

/* The true per-row costs at a setting. */
typedef struct model {
	double sleep_ms;
	cwi_ac_point point[NCAND]; /* truth: rows, bytes, up_ns, after_ns */
	int drop_epoch;    /* from this epoch on (0: never) the cache storage */
	double drop_mbps;  /* reads this fast: another tenant's load */
} model;

/* The cache storage's true read rate during epoch e. */
static double
read_mbps(const model *m, int e)
{
	return m->drop_epoch > 0 && e >= m->drop_epoch ? m->drop_mbps
						       : CACHE_READ_MBPS;
}

static void
model_at(model *m, double sleep_ms)
{
	double sleep_ns = sleep_ms * 1e6 / ROWS_PER_BATCH;
	double read_ns = SRC_ROW_BYTES / (SRC_READ_MBPS * 1e6) * 1e9;

	memset(m, 0, sizeof(*m));
	m->sleep_ms = sleep_ms;
	m->point[0].rows = ROWS_PER_BATCH * BATCHES;
	m->point[0].row_bytes = SRC_ROW_BYTES;
	m->point[0].up_ns = read_ns;
	m->point[0].after_ns = INFLATE_NS + sleep_ns;
	m->point[1].rows = ROWS_PER_BATCH * BATCHES;
	m->point[1].row_bytes = SRC_ROW_BYTES * INFLATE;
	m->point[1].up_ns = read_ns + INFLATE_NS + sleep_ns;
	m->point[1].after_ns = 0;
}

static void
storage_true(cwi_ac_storage *st, double read_mb_per_s)
{
	memset(st, 0, sizeof(*st));
	st->read_mb_per_s = read_mb_per_s;
	st->read_rows_per_s = CACHE_READ_ROWS;
	st->write_mb_per_s = CACHE_WRITE_MBPS;
}

static void
sim_plan(cwi_ac_plan *plan)
{
	/* Built by hand: the simulator has no graph. Indices are those of
	 * files | autocache | map(inflate) | map(sleep_us). */
	memset(plan, 0, sizeof(*plan));
	plan->nnodes = 4;
	plan->ncand = NCAND;
	plan->cand[0].index = 1;
	plan->cand[1].index = 3;
	plan->cand[1].full = true;
}

/* The true inputs (before jitter and the job's state). */
static void
inputs_true(cwi_ac_inputs *in, const model *m, const cwi_ac_plan *plan,
    int e)
{
	memset(in, 0, sizeof(*in));
	in->n = NCAND;
	in->cand = plan->cand;
	memcpy(in->point, m->point, sizeof(m->point));
	storage_true(&in->storage, read_mbps(m, e));
	in->parallelism = WORKERS;
}

/* What a policy is told: the truth, jittered, plus the job's state. */
static void
inputs_measured(cwi_ac_inputs *in, const model *m, const cwi_ac_plan *plan,
    const cwi_ac_job *j, const bool *cached, int e, double left,
    uint64_t *rng)
{
	inputs_true(in, m, plan, e);
	for (size_t k = 0; k < NCAND; k++) {
		in->point[k].up_ns *= cwi_sim_jitter(rng, JITTER);
		in->point[k].after_ns *= cwi_sim_jitter(rng, JITTER);
		in->point[k].cached = cached[k];
		in->point[k].writing = (j->writes & (1u << k)) != 0;
	}
	in->storage.read_mb_per_s *= cwi_sim_jitter(rng, JITTER);
	in->storage.read_rows_per_s *= cwi_sim_jitter(rng, JITTER);
	in->storage.write_mb_per_s *= cwi_sim_jitter(rng, JITTER);
	in->current_left = left;
	in->epochs_after = EPOCHS - e;
}

/* True seconds per batch of the job's current mode: the model's own
 * arithmetic, written out independently of the policy's estimator. A
 * worker runs its stages one after the other; writing a cache adds its
 * bytes at the write rate; reading one costs its bytes at the read rate
 * (at least the per-row time) and then the stages after it. */
static double
batch_s(const cwi_ac_job *j, const model *m, int e)
{
	double compute = ROWS_PER_BATCH * m->point[NCAND - 1].up_ns * 1e-9;
	double s;

	if (j->mode == CWI_AC_GET) {
		const cwi_ac_point *pt = &m->point[j->target];
		double row_s = pt->row_bytes / (read_mbps(m, e) * 1e6);
		if (row_s < 1.0 / CACHE_READ_ROWS)
			row_s = 1.0 / CACHE_READ_ROWS;
		return ROWS_PER_BATCH * (row_s + pt->after_ns * 1e-9) / WORKERS;
	}
	s = compute;
	for (size_t k = 0; k < NCAND; k++)
		if ((j->writes & (1u << k)) != 0)
			s += ROWS_PER_BATCH * m->point[k].row_bytes /
			    (CACHE_WRITE_MBPS * 1e6);
	return s / WORKERS;
}

typedef struct outcome {
	double total_s;
	cwi_ac_choice decision;
	char reason[800]; /* the decision's reason, or the job's event */
} outcome;

/* Batches run in a pass before the dispatcher has fresh measurements of
 * it (a few heartbeats). */
#define OBSERVE_BATCHES 10.0

/* Runs one job of EPOCHS passes under a policy, in virtual time. */
static void
run_job(int policy, const model *m, uint64_t *rng, outcome *out)
{
	cwi_ac_config cfg;
	cwi_ac_plan plan;
	cwi_ac_job job;
	cwi_ac_inputs in;
	bool cached[NCAND] = {false, false};
	double total = 0;

	sim_plan(&plan);
	cwi_ac_config_default(&cfg);
	(void)cwi_ac_parse(&cfg, policy_names[policy]);
	cwi_ac_job_start(&job, &cfg, &plan, cached);
	memset(out, 0, sizeof(*out));
	for (int e = 1; e <= (int)EPOCHS; e++) {
		double done = 0;
		if (job.mode == CWI_AC_PROFILE && !job.decided) {
			double d = cfg.profile_batches < BATCHES
			    ? (double)cfg.profile_batches
			    : BATCHES;
			total += d * batch_s(&job, m, e);
			done = d;
			if (cwi_ac_job_batches(&job, (uint64_t)d)) {
				inputs_measured(&in, m, &plan, &job, cached, e,
				    1.0 - d / BATCHES, rng);
				cwi_ac_job_decide(&job, &in);
				snprintf(out->reason, sizeof(out->reason),
				    "%s", job.last.reason);
			}
		} else if (e > 1) {
			/* Fresh measurements early in each later pass: the
			 * default policy revisits when they drifted. */
			done = OBSERVE_BATCHES;
			total += done * batch_s(&job, m, e);
			inputs_measured(&in, m, &plan, &job, cached, e,
			    1.0 - done / BATCHES, rng);
			if (job.mode == CWI_AC_GET)
				in.point[job.target].cached = true;
			if (cwi_ac_job_observe(&job, &in))
				snprintf(out->reason, sizeof(out->reason),
				    "%s", job.event);
		}
		total += (BATCHES - done) * batch_s(&job, m, e);
		if (job.mode == CWI_AC_PUT)
			cached[job.target] = true;
		cwi_ac_job_pass_end(&job, job.mode == CWI_AC_PUT);
	}
	out->total_s = total;
	if (job.target < 0)
		out->decision = CWI_AC_CHOICE_COMPUTE;
	else
		out->decision = plan.cand[job.target].full
		    ? CWI_AC_CHOICE_FULL
		    : CWI_AC_CHOICE_SOURCE;
	if (out->reason[0] == '\0')
		snprintf(out->reason, sizeof(out->reason), "%s", job.event);
}

/* The best fixed policy on a model: its index and epoch time. */
static int
best_fixed_on(const model *m, double *epoch_s)
{
	outcome o;
	uint64_t rng = 1; /* fixed policies draw no measurements */
	int best = P_COMPUTE;
	double best_s = INFINITY;

	for (int p = P_COMPUTE; p < NPOLICIES; p++) {
		run_job(p, m, &rng, &o);
		if (o.total_s < best_s) {
			best_s = o.total_s;
			best = p;
		}
	}
	if (epoch_s != NULL)
		*epoch_s = best_s / EPOCHS;
	return best;
}

static int
best_fixed(double sleep_ms)
{
	model m;

	model_at(&m, sleep_ms);
	return best_fixed_on(&m, NULL);
}

/* The fixed policies' totals are linear in the sleep, so the crossovers
 * (where the best fixed policy changes) are found by bisection. */
static size_t
crossovers(double *at, size_t cap)
{
	size_t n = 0;
	int prev = best_fixed(SLEEP_FROM);

	for (int s = SLEEP_FROM + 1; s <= SLEEP_TO && n < cap; s++) {
		int cur = best_fixed(s);
		double lo = s - 1, hi = s;
		if (cur == prev)
			continue;
		for (int i = 0; i < 40; i++) {
			double mid = (lo + hi) / 2;
			if (best_fixed(mid) == prev)
				lo = mid;
			else
				hi = mid;
		}
		at[n++] = (lo + hi) / 2;
		prev = cur;
	}
	return n;
}

static bool
near_crossover(double sleep_ms, const double *at, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fabs(sleep_ms - at[i]) <= NEAR * at[i])
			return true;
	return false;
}

/* ---- the settings -------------------------------------------------------- */

/* After the sweep, two settings where the cache storage slows down from
 * epoch DROP_EPOCH on (another tenant's load on the shared file system):
 * one in each regime of the sweep. Deciding once cannot follow that. */
#define DROP_EPOCH 4
#define DROP_MBPS 150.0
static const int drift_sleeps[] = {300, 450};
#define NDRIFT (sizeof(drift_sleeps) / sizeof(drift_sleeps[0]))

typedef struct setting {
	char name[64];
	model m;
	bool near;  /* within NEAR of a crossover of the sweep */
	bool sweep; /* part of the plotted sweep */
} setting;

static size_t
settings(setting *v, int step, const double *cross, size_t ncross)
{
	size_t n = 0;

	for (int ms = SLEEP_FROM; ms <= SLEEP_TO; ms += step) {
		snprintf(v[n].name, sizeof(v[n].name), "sleep_ms=%d", ms);
		model_at(&v[n].m, ms);
		v[n].near = near_crossover(ms, cross, ncross);
		v[n].sweep = true;
		n++;
	}
	for (size_t i = 0; i < NDRIFT; i++) {
		snprintf(v[n].name, sizeof(v[n].name),
		    "sleep_ms=%d,cache_read_mbps=%.0f->%.0f@epoch%d",
		    drift_sleeps[i], CACHE_READ_MBPS, DROP_MBPS, DROP_EPOCH);
		model_at(&v[n].m, drift_sleeps[i]);
		v[n].m.drop_epoch = DROP_EPOCH;
		v[n].m.drop_mbps = DROP_MBPS;
		v[n].near = false;
		v[n].sweep = false;
		n++;
	}
	return n;
}

/* ---- the report ---------------------------------------------------------- */

static const char *
fixed_choice(int p)
{
	return p == P_COMPUTE ? "compute" : p == P_SOURCE ? "source" : "full";
}

static void
print_json(FILE *out, const cwi_sim_opts *o, int p, const setting *st,
    const outcome *r, double best_s, int best, const double *cross,
    size_t ncross)
{
	double epoch_s = r->total_s / EPOCHS;
	double hours = r->total_s / 3600.0;

	fputs("{\"scenario\":\"autocache\",\"policy\":", out);
	cwi_sim_json_str(out, policy_names[p]);
	fputs(",\"setting\":", out);
	cwi_sim_json_str(out, st->name);
	fprintf(out,
	    ",\"sleep_ms\":%.0f,\"workers\":%d,\"oracle_workers\":null,"
	    "\"windows\":null,\"epochs\":%d,\"epoch_s\":%.3f,"
	    "\"total_s\":%.3f,\"cost\":%.4f,\"decision\":\"%s\","
	    "\"best_fixed\":\"%s\",\"best_fixed_epoch_s\":%.3f,"
	    "\"vs_best\":%.4f,\"near_crossover\":%s,\"storage_drift\":%s,"
	    "\"crossover_ms\":[",
	    st->m.sleep_ms, (int)WORKERS, (int)EPOCHS, epoch_s, r->total_s,
	    hours * (WORKERS * o->price_worker + o->price_consumer),
	    cwi_ac_choice_name(r->decision), fixed_choice(best), best_s,
	    epoch_s / best_s - 1.0, st->near ? "true" : "false",
	    st->m.drop_epoch > 0 ? "true" : "false");
	for (size_t i = 0; i < ncross; i++)
		fprintf(out, "%s%.1f", i > 0 ? "," : "", cross[i]);
	fputs("],\"reason\":", out);
	cwi_sim_json_str(out, r->reason);
	fputs("}\n", out);
}

static void
print_header(FILE *out, const double *cross, size_t ncross)
{
	fprintf(out,
	    "autocache: Figure 7 sweep (read -> autocache -> inflate %.1fx "
	    "-> sleep; %d epochs of %.0f batches of %.0f rows, %d worker)\n"
	    "storage: source %.0f MB/s; cache read %.0f MB/s, write %.0f "
	    "MB/s; rows %.0f KB -> %.0f KB\n",
	    INFLATE, (int)EPOCHS, BATCHES, ROWS_PER_BATCH, (int)WORKERS,
	    SRC_READ_MBPS, CACHE_READ_MBPS, CACHE_WRITE_MBPS,
	    SRC_ROW_BYTES / 1e3, SRC_ROW_BYTES * INFLATE / 1e3);
	fputs("crossovers (best fixed policy changes) at sleep_ms:", out);
	for (size_t i = 0; i < ncross; i++)
		fprintf(out, " %.1f", cross[i]);
	fprintf(out, "%s\n\n", ncross == 0 ? " none" : "");
	fprintf(out, "%-8s %-8s %9s  %-16s %-16s %9s %9s %9s\n", "sleep_ms",
	    "best", "best_s", "default", "cachew", "compute", "source",
	    "full");
}

static void
print_row(FILE *out, const setting *st, int best, double best_s,
    const outcome *r)
{
	char d[2][32];

	for (int p = 0; p < 2; p++)
		snprintf(d[p], sizeof(d[p]), "%s %.1f%s",
		    cwi_ac_choice_name(r[p].decision), r[p].total_s / EPOCHS,
		    r[p].total_s / EPOCHS > best_s * 1.05 ? "!" : "");
	fprintf(out, "%-8.0f %-8s %9.1f  %-16s %-16s %9.1f %9.1f %9.1f%s\n",
	    st->m.sleep_ms, fixed_choice(best), best_s, d[0], d[1],
	    r[P_COMPUTE].total_s / EPOCHS, r[P_SOURCE].total_s / EPOCHS,
	    r[P_FULL].total_s / EPOCHS, st->near ? "  (near a crossover)" : "");
}

static int
plot(const cwi_sim_opts *o, const double (*y)[NPOLICIES], const double *x,
    size_t n)
{
	cwi_sim_series series[NPOLICIES];
	double *col = calloc(n * NPOLICIES, sizeof(*col));
	char *path = NULL;
	cachew_err rv;

	if (col == NULL) {
		fputs("cachew sim autocache: out of memory\n", stderr);
		return 1;
	}
	for (int p = 0; p < NPOLICIES; p++) {
		for (size_t i = 0; i < n; i++)
			col[(size_t)p * n + i] = y[i][p];
		series[p].title = policy_names[p];
		series[p].x = x;
		series[p].y = col + (size_t)p * n;
		series[p].n = n;
	}
	path = cwi_asprintf("%s/autocache.png", o->plot_dir);
	rv = path != NULL
	    ? cwi_sim_plot(path, "Figure 7: epoch time vs sleep per batch",
		  "sleep per batch of 900 rows (ms)", "epoch time (s)", series,
		  NPOLICIES)
	    : cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv != CACHEW_OK)
		fprintf(stderr, "cachew sim autocache: %s\n", cachew_errmsg());
	free(path);
	free(col);
	return rv == CACHEW_OK ? 0 : 1;
}

#define MAX_SETTINGS ((SLEEP_TO - SLEEP_FROM) / SLEEP_STEP + 1 + NDRIFT)

int
cwi_sim_autocache(const cwi_sim_opts *o, FILE *out)
{
	int step = o->quick ? SLEEP_STEP_QUICK : SLEEP_STEP;
	setting set[MAX_SETTINGS];
	double y[MAX_SETTINGS][NPOLICIES];
	double x[MAX_SETTINGS];
	double cross[8];
	size_t ncross = crossovers(cross, 8);
	size_t nset = settings(set, step, cross, ncross);
	size_t nsweep = 0;
	uint64_t rng = o->seed;

	if (!o->json)
		print_header(out, cross, ncross);
	for (size_t i = 0; i < nset; i++) {
		outcome r[NPOLICIES];
		double best_s;
		int best = best_fixed_on(&set[i].m, &best_s);

		if (!o->json && !set[i].sweep && set[i - 1].sweep)
			fprintf(out,
			    "\ncache storage slows to %.0f MB/s from epoch "
			    "%d:\n",
			    DROP_MBPS, DROP_EPOCH);
		for (int p = 0; p < NPOLICIES; p++) {
			run_job(p, &set[i].m, &rng, &r[p]);
			if (set[i].sweep)
				y[nsweep][p] = r[p].total_s / EPOCHS;
			if (o->json)
				print_json(out, o, p, &set[i], &r[p], best_s,
				    best, cross, ncross);
		}
		if (set[i].sweep)
			x[nsweep++] = set[i].m.sleep_ms;
		if (!o->json)
			print_row(out, &set[i], best, best_s, r);
	}
	if (!o->json)
		fputs("\nepoch_s per policy (decision for default and cachew); "
		      "! = more than 5% slower than the best fixed policy\n",
		    out);
	if (o->plot_dir != NULL)
		return plot(o, (const double(*)[NPOLICIES])y, x, nsweep);
	return 0;
}
