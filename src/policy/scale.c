/*
 * scale.c - the autoscaling policies and weighted fair share (scale.h).
 *
 * Every policy sees the same stream of samples. "cachew" and "model"
 * group them into measurement windows: whole samples are discarded until
 * discard_epoch batches (after an epoch start) or discard_change batches
 * (after a change of the decision or of the observed worker count) have
 * passed, then samples accumulate until the window holds window_batches
 * batches and the step has lasted min_step_batches batches ("model" also
 * ends discards after discard_max_ns and windows after window_max_ns, so
 * a slow start does not take minutes per window). A completed
 * window is one "decision window": the policy decides, and a new window
 * starts. "hpa" evaluates on Kubernetes' 15 s sync period instead, and
 * "fixed" never decides. Pure functions: no clock but the samples', no
 * I/O, no locks.
 */
#include "scale.h"

#include "../core/core.h"
#include "../core/msgpack_doc.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kubernetes' HPA defaults: the controller's sync period, the scale-down
 * stabilisation window (the largest recommendation of the last 5 minutes
 * wins), its tolerance, and its default scale-up limit (double or +4 pods
 * per period, whichever is more). */
#define HPA_SYNC_NS 15000000000ull
#define HPA_STABILISE_NS 300000000000ull
#define HPA_TOLERANCE 0.10
#define HPA_UP_PODS 4u
#define HPA_HISTORY 64 /* >= HPA_STABILISE_NS / HPA_SYNC_NS + 1 */

/* A fill below this is an empty queue: a factor of it is noise. */
#define FILL_FLOOR 0.05

typedef enum phase {
	PH_SEARCH,  /* cachew: adding one worker per window */
	PH_MEASURE, /* model: a window for the jump */
	PH_PROBE,   /* model: a window at one fewer worker */
	PH_DRAIN,   /* model: the probe's buffer drains; wait it out */
	PH_REF,     /* a window at the settled count, the drift reference */
	PH_SETTLED  /* drift re-check every drift_every samples */
} phase;

/* The totals of a run of samples. */
typedef struct window {
	uint64_t batches;
	uint64_t elapsed_ns;
	uint64_t wait_ns;
	uint32_t samples;
	double fill_sum;    /* sum of buffer_fill * elapsed (s) */
	double workers_sum; /* sum of workers * elapsed (s) */
	double busy_sum;    /* sum of worker_busy * elapsed (s), known ones */
	double busy_s;      /* elapsed (s) of samples with a known busy */
	double cpu_sum;
	double cpu_s;
	/* For the least-squares line of the fill over the window's time
	 * (t: seconds from the window's start to a sample's middle; all
	 * weighted by the sample's elapsed time, like fill_sum). */
	double t_sum;
	double tt_sum;
	double tf_sum;
} window;

struct cwi_scaler {
	cwi_scale_config cfg;
	uint32_t target;  /* the current decision */
	uint32_t have;    /* what the job has (granted or observed) */
	bool settled;
	cwi_scale_why why; /* of reason; not journaled (RESTORED after a
			    * recovery, until the next decision) */
	char reason[192];
	uint32_t windows; /* decision windows completed */
	bool changed_ever;
	uint64_t last_change_ns;

	phase ph;
	uint64_t discard_left; /* batches still to discard */
	uint64_t discard_ns;   /* time the current discard has lasted */
	uint64_t step_batches; /* batches since the last change */
	window win;            /* the window being filled */

	/* cachew search and probes: the previous window's count and time */
	bool have_prev;
	uint32_t prev_n;
	double prev_t;
	double prev_wait; /* model: the client's wait per batch (s) at prev_n */
	uint32_t jumps; /* model: jumps since the last reset */
	double p_jump;  /* model: per-worker rate the last jump used */
	double d_jump;  /* model: demand the last jump used */
	uint32_t n_jump; /* model: the count the first jump left */
	double r_jump;   /* model: its throughput (batches/s) */
	uint32_t gain_cap; /* model: more did not help above this (0: no) */
	bool redo;      /* model: re-estimating after drift */
	uint64_t drain_ns; /* model: time the probe's buffer has drained */
	uint64_t probe_ns; /* model: time since the probe's step down */

	/* drift reference: the settled count's batch time and queue */
	double ref_t;
	double ref_fill;
	window drift; /* samples since the last drift check */
	window recent; /* model: the probe window's latest quarter to half */

	/* hpa */
	uint64_t hpa_last_ns;
	bool hpa_started;
	uint32_t hpa_nrec;
	uint64_t hpa_rec_ns[HPA_HISTORY];
	uint32_t hpa_rec[HPA_HISTORY];
};

/* ---- configuration ------------------------------------------------------- */

void
cwi_scale_config_default(cwi_scale_config *c)
{
	memset(c, 0, sizeof(*c));
	c->kind = CWI_SCALE_MODEL;
	c->fixed = 1;
	c->hpa_target = 0.80;
	c->min_workers = 1;
	c->max_workers = UINT32_MAX;
	c->cooldown_ns = 0;
	c->window_batches = 500;
	c->discard_epoch = 200;
	c->discard_change = 150;
	c->min_step_batches = 650;
	c->improve = 0.07;
	c->drift_every = 21;
	c->drift_factor = 1.4;
	c->headroom = 0.10;
	c->window_max_ns = 60000000000ull;
	c->min_window_batches = 50;
	c->discard_max_ns = 30000000000ull;
	c->probe_min_ns = 10000000000ull;
	c->probe_max_ns = 300000000000ull;
	c->probe_watch_ns = 120000000000ull;
}

/* A decimal in [lo, hi] spelled with digits only. */
static bool
parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t v = 0;

	if (*s == '\0')
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
		if (v > hi)
			return false;
	}
	if (v < lo)
		return false;
	*out = (uint32_t)v;
	return true;
}

cachew_err
cwi_scale_parse(cwi_scale_config *c, const char *spec)
{
	uint32_t v;

	if (spec == NULL)
		return cwi_fail(CACHEW_EINVAL, "scaling policy: missing");
	if (strcmp(spec, "model") == 0) {
		c->kind = CWI_SCALE_MODEL;
		return CACHEW_OK;
	}
	if (strcmp(spec, "cachew") == 0) {
		c->kind = CWI_SCALE_CACHEW;
		return CACHEW_OK;
	}
	if (strncmp(spec, "fixed:", 6) == 0) {
		if (!parse_u32(spec + 6, 1, UINT32_MAX, &v))
			return cwi_fail(CACHEW_EINVAL,
			    "scaling policy '%s': fixed:N needs a worker "
			    "count N >= 1",
			    spec);
		c->kind = CWI_SCALE_FIXED;
		c->fixed = v;
		return CACHEW_OK;
	}
	if (strncmp(spec, "hpa:", 4) == 0) {
		if (!parse_u32(spec + 4, 1, 100, &v))
			return cwi_fail(CACHEW_EINVAL,
			    "scaling policy '%s': hpa:P needs a CPU target "
			    "P from 1 to 100 (percent)",
			    spec);
		c->kind = CWI_SCALE_HPA;
		c->hpa_target = v / 100.0;
		return CACHEW_OK;
	}
	return cwi_fail(CACHEW_EINVAL,
	    "unknown scaling policy '%s' (model, cachew, fixed:N, hpa:P)",
	    spec);
}

void
cwi_scale_name(const cwi_scale_config *c, char *buf, size_t size)
{
	if (size == 0)
		return;
	switch (c->kind) {
	case CWI_SCALE_CACHEW:
		snprintf(buf, size, "cachew");
		break;
	case CWI_SCALE_FIXED:
		snprintf(buf, size, "fixed:%" PRIu32, c->fixed);
		break;
	case CWI_SCALE_HPA:
		snprintf(buf, size, "hpa:%d",
		    (int)lround(c->hpa_target * 100.0));
		break;
	case CWI_SCALE_MODEL:
	default:
		snprintf(buf, size, "model");
		break;
	}
}

/* ---- common machinery ---------------------------------------------------- */

static uint32_t
clamp(const cwi_scaler *s, uint64_t n)
{
	if (n < s->cfg.min_workers)
		return s->cfg.min_workers;
	if (n > s->cfg.max_workers)
		return s->cfg.max_workers;
	return (uint32_t)n;
}

const char *
cwi_scale_why_name(cwi_scale_why w)
{
	static const char *const names[CWI_WHY_N] = {
	    [CWI_WHY_RESTORED] = "restored",
	    [CWI_WHY_START] = "start",
	    [CWI_WHY_FIXED] = "fixed",
	    [CWI_WHY_BOUND] = "bound",
	    [CWI_WHY_SEARCH] = "search",
	    [CWI_WHY_GAIN] = "gain",
	    [CWI_WHY_NO_GAIN] = "no_gain",
	    [CWI_WHY_DEMAND] = "demand",
	    [CWI_WHY_SATURATED] = "saturated",
	    [CWI_WHY_PROBE] = "probe",
	    [CWI_WHY_PROBE_KEPT] = "probe_kept",
	    [CWI_WHY_PROBE_REJECTED] = "probe_rejected",
	    [CWI_WHY_NO_WAIT] = "no_wait",
	    [CWI_WHY_GRANTED] = "granted",
	    [CWI_WHY_DRIFT] = "drift",
	    [CWI_WHY_CPU] = "cpu",
	};

	return (unsigned)w < CWI_WHY_N ? names[w] : "?";
}

static void
set_reason(cwi_scaler *s, cwi_scale_why why, const char *fmt, ...)
    CACHEW_PRINTF(3, 4);

static void
set_reason(cwi_scaler *s, cwi_scale_why why, const char *fmt, ...)
{
	va_list ap;

	s->why = why;
	va_start(ap, fmt);
	vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
	va_end(ap);
}

static void
window_clear(window *w)
{
	memset(w, 0, sizeof(*w));
}

static void
window_add(window *w, const cwi_scale_sample *smp, uint32_t workers)
{
	double e = (double)smp->elapsed_ns / 1e9;
	double mid = (double)w->elapsed_ns / 1e9 + e / 2;

	w->batches += smp->batches;
	w->elapsed_ns += smp->elapsed_ns;
	w->wait_ns += smp->wait_ns < smp->elapsed_ns ? smp->wait_ns
						     : smp->elapsed_ns;
	w->samples++;
	w->fill_sum += smp->buffer_fill * e;
	w->t_sum += mid * e;
	w->tt_sum += mid * mid * e;
	w->tf_sum += mid * smp->buffer_fill * e;
	w->workers_sum += (double)workers * e;
	if (smp->worker_busy >= 0) {
		w->busy_sum += (smp->worker_busy > 1 ? 1 : smp->worker_busy) * e;
		w->busy_s += e;
	}
	if (smp->worker_cpu >= 0) {
		w->cpu_sum += (smp->worker_cpu > 1 ? 1 : smp->worker_cpu) * e;
		w->cpu_s += e;
	}
}

/* Mean batch time (s) of a window; 0 without batches. */
static double
window_batch_s(const window *w)
{
	return w->batches ? (double)w->elapsed_ns / 1e9 / (double)w->batches
			  : 0;
}

static double
window_fill(const window *w)
{
	return w->elapsed_ns ? w->fill_sum / ((double)w->elapsed_ns / 1e9) : 0;
}

/* The client's buffer drained over the window: the least-squares line of
 * its fill falls from *from to *to with *to below *from / factor. Only the
 * trend says so: a single heartbeat's fill jumps with every reply that
 * arrives. Needs three samples and a fill that was above zero. */
static bool
window_drains(const window *w, double factor, double *from, double *to)
{
	double sw = (double)w->elapsed_ns / 1e9;
	double mt, mf, var, slope;

	*from = *to = 0;
	if (w->samples < 3 || sw <= 0)
		return false;
	mt = w->t_sum / sw;
	mf = w->fill_sum / sw;
	var = w->tt_sum / sw - mt * mt;
	if (var <= 0)
		return false;
	slope = (w->tf_sum / sw - mt * mf) / var;
	*from = mf - slope * mt;
	*to = mf + slope * (sw - mt);
	return *from > 0 && *to * factor < *from;
}

static double
window_workers(const window *w)
{
	return w->elapsed_ns
	    ? w->workers_sum / ((double)w->elapsed_ns / 1e9)
	    : 0;
}

/* Starts measuring afresh after a change: discard, then a new window. */
static void
restart_windows(cwi_scaler *s, uint64_t discard)
{
	window_clear(&s->win);
	window_clear(&s->drift);
	if (discard > s->discard_left)
		s->discard_left = discard;
	s->step_batches = 0;
}

/* Moves the decision to n (clamped) unless the cooldown forbids; false
 * when it is held. A move restarts the windows. */
static bool
change_to(cwi_scaler *s, uint64_t now, uint64_t n)
{
	uint32_t to = clamp(s, n);

	if (to == s->target)
		return true;
	if (s->changed_ever && s->cfg.cooldown_ns > 0 &&
	    now - s->last_change_ns < s->cfg.cooldown_ns)
		return false;
	s->target = to;
	s->changed_ever = true;
	s->last_change_ns = now;
	restart_windows(s, s->cfg.discard_change);
	return true;
}

/* Settles on the current count and starts measuring the drift reference
 * unless `t` (a batch time already measured there) serves. */
static void
settle(cwi_scaler *s, double t, double fill)
{
	s->settled = true;
	if (t > 0) {
		s->ref_t = t;
		s->ref_fill = fill;
		s->ph = PH_SETTLED;
	} else {
		s->ph = PH_REF;
	}
	window_clear(&s->drift);
}

/* ---- cachew -------------------------------------------------------------- */

static void
cachew_window(cwi_scaler *s, uint64_t now, uint32_t n, double t, double fill)
{
	double r;

	if (!s->have_prev) {
		s->have_prev = true;
		s->prev_n = n;
		s->prev_t = t;
		if (n >= s->cfg.max_workers) {
			set_reason(s, CWI_WHY_BOUND,
			    "cachew: %" PRIu32 " workers is the "
			    "maximum -> settle",
			    n);
			settle(s, t, fill);
			return;
		}
		if (change_to(s, now, (uint64_t)n + 1))
			set_reason(s, CWI_WHY_SEARCH,
			    "cachew: batch time %.1f ms at %" PRIu32
			    " workers -> %" PRIu32,
			    t * 1e3, n, s->target);
		else
			s->have_prev = false; /* retry when cooled down */
		return;
	}
	r = 1.0 - t / s->prev_t;
	if (r > s->cfg.improve && n > s->prev_n &&
	    n < s->cfg.max_workers) {
		if (!change_to(s, now, (uint64_t)n + 1))
			return;
		set_reason(s, CWI_WHY_GAIN,
		    "cachew: r = %.1f%% > %.0f%% at %" PRIu32
		    " workers -> %" PRIu32,
		    r * 100, s->cfg.improve * 100, n, s->target);
		s->prev_n = n;
		s->prev_t = t;
		return;
	}
	if (n > s->prev_n && r <= s->cfg.improve) {
		/* The last worker did not pay: back to the smaller count,
		 * whose batch time is the drift reference. */
		if (!change_to(s, now, s->prev_n))
			return;
		set_reason(s, CWI_WHY_NO_GAIN,
		    "cachew: r = %.1f%% <= %.0f%% -> settle at "
		    "%" PRIu32,
		    r * 100, s->cfg.improve * 100, s->target);
		settle(s, s->prev_t, -1);
		return;
	}
	/* No gain from the last step, or it was not granted. */
	if (!change_to(s, now, n))
		return;
	set_reason(s, CWI_WHY_NO_GAIN,
	    "cachew: settle at %" PRIu32 " (r = %.1f%%)", n,
	    r * 100);
	settle(s, t, fill);
}

/* ---- model --------------------------------------------------------------- */

/* A jump goes to at most this many times the current count. The model
 * extrapolates one window's per-worker rate linearly; far beyond the
 * count it was measured at, that says more about the measurement than
 * the job: a consumer that does nothing between batches (`cachew run
 * "range(N)"`) has a near-infinite demand, and one window asked for 31
 * workers, the next (8 workers sharing 2 cores) for 2494 (issue 17). */
#define MODEL_JUMP_FACTOR_MAX 8

/* The job's throughput over window w, batches/s. */
static double
window_rate(const window *w)
{
	return w->elapsed_ns > 0 ? (double)w->batches * 1e9 /
		(double)w->elapsed_ns : 0;
}

/* After the first jump up: when more workers did not make the job faster
 * (by `improve`), the workers are not what it waits for (its transport,
 * the consumer, a machine short of cores): back to the count before, and
 * settle there; until the scaler is reset (a new job, a cache mode
 * change), no estimate asks for more.
 * True when it did so (or the cooldown holds it). */
static bool
model_jump_gained_nothing(cwi_scaler *s, uint64_t now, uint32_t n)
{
	double r = window_rate(&s->win);

	if (s->jumps != 1 || s->n_jump == 0 || n <= s->n_jump ||
	    r > s->r_jump * (1.0 + s->cfg.improve))
		return false;
	if (!change_to(s, now, s->n_jump))
		return true;
	set_reason(s, CWI_WHY_SATURATED,
	    "model: %" PRIu32 " workers gave %.1f b/s, %" PRIu32
	    " gave %.1f b/s: more workers do not help -> %" PRIu32,
	    n, r, s->n_jump, s->r_jump, s->target);
	s->gain_cap = s->n_jump;
	s->n_jump = 0; /* once: drift re-estimates from here */
	s->settled = true;
	s->ph = PH_REF;
	return true;
}

/* The smallest count whose throughput meets the demand with headroom,
 * from one window; 0 when the window cannot tell (no busy figure and no
 * waiting: the workers are not the bottleneck but their capacity is
 * unknown). Writes the estimates for the reason. */
static uint32_t
model_estimate(const cwi_scaler *s, const window *w, uint32_t n,
    double *demand, double *per_worker)
{
	double e = (double)w->elapsed_ns / 1e9;
	double work = (double)(w->elapsed_ns - w->wait_ns) / 1e9;
	double rate = (double)w->batches / e;
	double nw = window_workers(w);
	double busy;
	double need;

	if (nw <= 0)
		nw = n;
	/* Consuming without waiting, the client would take `work` for
	 * these batches: its demand (the probe needs it even when the
	 * workers' capacity is unknown). */
	*demand = work > 0 ? (double)w->batches / work : INFINITY;
	*per_worker = 0;
	if (w->busy_s > 0)
		busy = w->busy_sum / w->busy_s;
	else if (w->wait_ns * 20 >= w->elapsed_ns)
		busy = 1.0; /* the client waits: workers are the bottleneck */
	else
		return 0;
	if (busy < 0.01)
		busy = 0.01;
	*per_worker = rate / (nw * busy);
	if (!isfinite(*demand))
		return s->cfg.max_workers;
	need = ceil(*demand * (1.0 + s->cfg.headroom) / *per_worker - 1e-9);
	if (need < 1)
		need = 1;
	if (need > (double)UINT32_MAX)
		need = (double)UINT32_MAX;
	return clamp(s, (uint64_t)need);
}

/* Starts the probe against batch time t measured at n: the count that
 * meets the estimated demand without headroom (at least one fewer than n,
 * the step the headroom bought), once. */
static void
model_start_probe(cwi_scaler *s, uint64_t now, uint32_t n, double t,
    double fill, double demand, double per_worker)
{
	uint64_t to = (uint64_t)n - 1;

	if (n <= s->cfg.min_workers) {
		set_reason(s, CWI_WHY_BOUND,
		    "model: %" PRIu32 " workers is the minimum -> "
		    "settle",
		    n);
		settle(s, t, fill);
		return;
	}
	/* Right after a jump up the workers also refill the client's
	 * buffer, so the window at n underrates them; the rate the jump
	 * measured is the better of the two. Too high a rate is what the
	 * probe's check is for. */
	if (s->p_jump > per_worker)
		per_worker = s->p_jump;
	/* A demand that fell a lot since the jump is more likely a window
	 * the consumer spent elsewhere (a loaded machine: 429 b/s against
	 * 864 once, which sent a probe from 5 to 2 workers) than a new
	 * demand; drift re-estimates a real one. The larger is safer. */
	if (s->d_jump > demand)
		demand = s->d_jump;
	if (per_worker > 0 && isfinite(demand)) {
		double bare = ceil(demand / per_worker - 1e-9);

		if (bare > (double)n && s->target == n &&
		    n < s->cfg.max_workers &&
		    (double)n * per_worker * (1.0 + s->cfg.improve) <
			demand) {
			/* Nothing holds the job at n, and even the better
			 * rate says n is short by more than the probe's
			 * tolerance: too few is the costly mistake. */
			if (!change_to(s, now, (uint64_t)bare))
				return;
			set_reason(s, CWI_WHY_DEMAND,
			    "model: confirm: demand %.1f b/s needs "
			    "%.0f workers at %.2f per worker -> "
			    "%" PRIu32,
			    demand, bare, per_worker, s->target);
			s->settled = true;
			s->ph = PH_REF;
			return;
		}
		if (bare > (double)n) {
			/* Held below the demand (bounds or fair share), or
			 * n supplies it within the probe's tolerance: fewer
			 * cannot do. */
			set_reason(s, CWI_WHY_DEMAND,
			    "model: demand needs %.0f workers, has "
			    "%" PRIu32 ", asks %" PRIu32 " -> settle",
			    bare, n, s->target);
			settle(s, t, fill);
			return;
		}
		if (bare < (double)to)
			to = bare < 1 ? 1 : (uint64_t)bare;
	}
	if (!change_to(s, now, to))
		return;
	s->prev_n = n;
	s->prev_t = t;
	s->probe_ns = 0;
	s->prev_wait = s->win.batches
	    ? (double)s->win.wait_ns / 1e9 / (double)s->win.batches
	    : 0;
	s->ph = PH_PROBE;
	set_reason(s, CWI_WHY_PROBE,
	    "model: probe %" PRIu32 " workers (%.1f b/s at %.2f "
	    "per worker; %" PRIu32 " with headroom: %.1f ms)",
	    s->target, demand, per_worker, n, t * 1e3);
}

/* A measurement window at n workers: the first one jumps to the
 * estimate; the next confirms it (a second jump only when the estimate
 * moved by more than one, which the probe could not fix) and starts the
 * probe. */
static void
model_measure(cwi_scaler *s, uint64_t now, uint32_t n, double t,
    double fill)
{
	double demand = 0, per_worker = 0;
	uint32_t want = model_estimate(s, &s->win, n, &demand, &per_worker);
	bool far;

	if (model_jump_gained_nothing(s, now, n))
		return;
	if (want > (uint64_t)n * MODEL_JUMP_FACTOR_MAX)
		want = clamp(s, (uint64_t)n * MODEL_JUMP_FACTOR_MAX);
	/* More workers were seen not to help this job: a re-estimate
	 * (drift) asks for no more than the count that did as well. */
	if (s->gain_cap > 0 && want > s->gain_cap)
		want = s->gain_cap;
	if (want == 0) {
		/* Not the bottleneck and capacity unknown: probe down. */
		set_reason(s, CWI_WHY_NO_WAIT,
		    "model: client never waits at %" PRIu32
		    " workers, busy unknown -> probe",
		    n);
		want = n;
	}
	if (s->redo) {
		/* After drift: move to the estimate and settle there (the
		 * probe was spent). A count that supplies the demand within
		 * `improve`, the probe's tolerance, stays: else drift and
		 * probe would take turns. */
		if (want == n ||
		    (n < want && (double)n * per_worker *
				(1.0 + s->cfg.improve) >= demand)) {
			set_reason(s, CWI_WHY_DEMAND,
			    "model: re-estimate keeps %" PRIu32
			    " workers (demand %.1f b/s, %.2f b/s "
			    "per worker)",
			    n, demand, per_worker);
			s->redo = false;
			settle(s, t, fill);
			return;
		}
		if (!change_to(s, now, want))
			return;
		set_reason(s, CWI_WHY_DEMAND,
		    "model: re-estimate: demand %.1f b/s, %.2f b/s "
		    "per worker -> %" PRIu32,
		    demand, per_worker, s->target);
		s->redo = false;
		s->settled = true;
		s->ph = PH_REF;
		return;
	}
	if (want > n && s->target >= want && s->jumps > 0) {
		/* Asked for enough already; fair share or the pool holds
		 * the job at n. */
		set_reason(s, CWI_WHY_GRANTED,
		    "model: demand %.1f b/s, %.2f b/s per worker "
		    "wants %" PRIu32 ", granted %" PRIu32,
		    demand, per_worker, want, n);
		settle(s, t, fill);
		return;
	}
	far = want > n + 1 || want + 1 < n;
	if (want != n && (s->jumps == 0 || (s->jumps == 1 && far))) {
		double r = window_rate(&s->win); /* change_to clears it */

		if (!change_to(s, now, want))
			return; /* cooldown: the next window retries */
		if (s->jumps == 0) {
			s->n_jump = n;
			s->r_jump = r;
		}
		s->jumps++;
		s->p_jump = per_worker;
		s->d_jump = demand;
		set_reason(s, CWI_WHY_DEMAND,
		    "model: demand %.1f b/s, %.2f b/s per worker "
		    "-> %" PRIu32 " (+%.0f%% headroom)",
		    demand, per_worker, s->target, s->cfg.headroom * 100);
		return;
	}
	s->jumps++;
	model_start_probe(s, now, n, t, fill, demand, per_worker);
}

/* The probe failed: back to the count it was tried against; false when
 * the cooldown holds the change (the next window retries). */
static bool
model_probe_back(cwi_scaler *s, uint64_t now)
{
	if (!change_to(s, now, s->prev_n))
		return false;
	/* The queue measured here was the probe's: unknown at the count
	 * settled on until the first drift check measures it. */
	settle(s, s->prev_t, -1);
	return true;
}

/* A probe window measured at fewer workers than the probe's count (fair
 * share granted less): it says nothing about the probe, which ends. */
static bool
probe_held(cwi_scaler *s, uint32_t n, double t, double fill)
{
	if (n >= s->target)
		return false;
	set_reason(s, CWI_WHY_GRANTED,
	    "model: probe of %" PRIu32 " workers granted %" PRIu32
	    " -> settle",
	    s->target, n);
	settle(s, t, fill);
	return true;
}

/* How much the probe slowed the client because of the workers: the
 * extra time per batch it waited, over the batch time at the count tried
 * against. Waiting is the workers' share of a batch time; the rest is the
 * consumer's own step, which on a shared machine varies by more than
 * `improve` and says nothing about the worker count. */
static double
probe_slowdown(const cwi_scaler *s, const window *w)
{
	double wait_b = w->batches
	    ? (double)w->wait_ns / 1e9 / (double)w->batches
	    : 0;

	return s->prev_t > 0 ? (wait_b - s->prev_wait) / s->prev_t : 0;
}

/* The probe's count kept up for one more window: settled on it once
 * probe_watch_ns have passed since the step down; until then every window
 * is judged again (a removed worker delivers the splits it leased first,
 * and the buffer it filled lasts after it: the shortfall can show late). */
static void
model_probe_keep(cwi_scaler *s, uint32_t n, double t, double fill,
    double slow, double worse, const char *when)
{
	if (s->probe_ns < s->cfg.probe_watch_ns) {
		s->settled = true;
		s->ph = PH_PROBE;
		set_reason(s, CWI_WHY_PROBE_KEPT,
		    "model: probe kept %" PRIu32 " workers%s: waits "
		    "%+.1f%% of a batch <= %.0f%% (batch time "
		    "%+.1f%%), watching",
		    n, when, slow * 100, s->cfg.improve * 100, worse * 100);
		return;
	}
	set_reason(s, CWI_WHY_PROBE_KEPT,
	    "model: probe kept %" PRIu32 " workers%s: waits "
	    "%+.1f%% of a batch <= %.0f%% (batch time %+.1f%%)",
	    n, when, slow * 100, s->cfg.improve * 100, worse * 100);
	settle(s, t, fill);
}

/* The probe's window at n. Elements buffered at the larger count feed
 * the client for a while whatever the probe's workers deliver, so a
 * client that did not wait more only says the probe's count keeps up
 * when the buffer held: when it drained, the probe goes on until the
 * client has waited (PH_DRAIN). */
static void
model_probe(cwi_scaler *s, uint64_t now, uint32_t n, double t, double fill)
{
	double worse = t / s->prev_t - 1.0;
	double slow = probe_slowdown(s, &s->win);
	double from, to;

	if (probe_held(s, n, t, fill))
		return;
	if (slow > s->cfg.improve) {
		if (!model_probe_back(s, now))
			return;
		set_reason(s, CWI_WHY_PROBE_REJECTED,
		    "model: probe rejected: waits %+.1f%% of a batch "
		    "> %.0f%% (batch time %+.1f%%) -> back to "
		    "%" PRIu32,
		    slow * 100, s->cfg.improve * 100, worse * 100, s->target);
		return;
	}
	/* The recent part too: a removed worker that still delivers its
	 * leased splits fills the buffer early in the window, and the fall
	 * after it stops would not tilt the whole window's line. */
	if (window_drains(&s->win, s->cfg.drift_factor, &from, &to) ||
	    window_drains(&s->recent, s->cfg.drift_factor, &from, &to)) {
		s->ph = PH_DRAIN;
		s->drain_ns = s->win.elapsed_ns;
		set_reason(s, CWI_WHY_PROBE,
		    "model: probe %" PRIu32 " workers: buffer "
		    "drains (fill %.3g -> %.3g), waits %+.1f%% "
		    "-> until the client waits",
		    n, from, to, slow * 100);
		return;
	}
	model_probe_keep(s, n, t, fill, slow, worse, "");
}

/* The probe's window after its buffer ran dry: how the probe's workers
 * keep up on their own. */
static void
model_probe_dry(cwi_scaler *s, uint64_t now, uint32_t n, double t,
    double fill)
{
	double worse = t / s->prev_t - 1.0;
	double slow = probe_slowdown(s, &s->win);

	if (probe_held(s, n, t, fill))
		return;
	if (slow > s->cfg.improve) {
		if (!model_probe_back(s, now))
			return;
		set_reason(s, CWI_WHY_PROBE_REJECTED,
		    "model: probe rejected once the buffer ran dry: "
		    "waits %+.1f%% of a batch > %.0f%% (batch time "
		    "%+.1f%%) -> back to %" PRIu32,
		    slow * 100, s->cfg.improve * 100, worse * 100, s->target);
		return;
	}
	model_probe_keep(s, n, t, fill, slow, worse,
	    " once the buffer ran dry");
}

/* A sample while the probe's buffer drains: the window (the dry part)
 * starts with the first sample in which the client waited. Without one
 * after probe_max_ns the evidence is ambiguous, and one worker too many
 * costs less than a slower training: back to the larger count. */
static void
model_drain_observe(cwi_scaler *s, const cwi_scale_sample *smp, uint32_t n)
{
	s->drain_ns += smp->elapsed_ns;
	if (s->win.samples == 0 && smp->wait_ns == 0) {
		if (s->cfg.probe_max_ns == 0 ||
		    s->drain_ns < s->cfg.probe_max_ns)
			return;
		if (!model_probe_back(s, smp->now_ns))
			return;
		s->windows++;
		set_reason(s, CWI_WHY_PROBE_REJECTED,
		    "model: probe ambiguous: buffer drained %.0f s "
		    "and the client never waited -> back to %" PRIu32,
		    (double)s->drain_ns / 1e9, s->target);
		return;
	}
	window_add(&s->win, smp, n);
}

/* ---- drift (cachew and model) -------------------------------------------- */

/* Every drift_every-th sample after settling compares the batch time and
 * the client queue since the last check with the settled reference. */
static void
drift_check(cwi_scaler *s, uint64_t now)
{
	double t = window_batch_s(&s->drift);
	double fill = window_fill(&s->drift);
	double f = s->cfg.drift_factor;
	int dir = 0;

	if (s->drift.samples < s->cfg.drift_every)
		return;
	if (s->ref_fill < 0)
		s->ref_fill = fill; /* first check of an epoch */
	if (t > 0 && s->ref_t > 0 && t >= f * s->ref_t)
		dir = 1; /* batches come slower */
	else if (s->ref_fill >= FILL_FLOOR && fill * f <= s->ref_fill)
		dir = 1; /* the queue drains */
	else if (t > 0 && s->ref_t > 0 && t * f <= s->ref_t)
		dir = -1; /* batches come faster: the consumer changed */
	else if (fill >= FILL_FLOOR && fill >= f * s->ref_fill &&
		 fill >= 0.5)
		dir = -1; /* the queue fills up: more than enough workers */
	if (dir == 0) {
		window_clear(&s->drift);
		return;
	}
	if (s->cfg.kind == CWI_SCALE_MODEL) {
		/* The model re-estimates instead of stepping by one. */
		set_reason(s, CWI_WHY_DRIFT,
		    "model: drift (batch time %.2fx, queue %.2f vs "
		    "%.2f) -> re-estimate",
		    s->ref_t > 0 ? t / s->ref_t : 0, fill, s->ref_fill);
		s->settled = false;
		s->ph = PH_MEASURE;
		s->redo = true;
		window_clear(&s->win);
		window_clear(&s->drift);
		return;
	}
	if (dir > 0 && s->target >= s->cfg.max_workers) {
		window_clear(&s->drift);
		return;
	}
	if (dir < 0 && s->target <= s->cfg.min_workers) {
		window_clear(&s->drift);
		return;
	}
	if (!change_to(s, now, dir > 0 ? (uint64_t)s->target + 1
				       : (uint64_t)s->target - 1))
		return;
	set_reason(s, CWI_WHY_DRIFT,
	    "cachew: drift (batch time %.2fx, queue %.2f vs %.2f) "
	    "-> %" PRIu32,
	    s->ref_t > 0 ? t / s->ref_t : 0, fill, s->ref_fill, s->target);
	s->ph = PH_REF;
}

/* ---- hpa ----------------------------------------------------------------- */

static void
hpa_observe(cwi_scaler *s, const cwi_scale_sample *smp, uint32_t n)
{
	double util, ratio;
	uint64_t desired, cap, rec;
	uint32_t keep = 0;

	if (smp->worker_cpu >= 0)
		window_add(&s->win, smp, n);
	if (!s->hpa_started) {
		s->hpa_started = true;
		s->hpa_last_ns = smp->now_ns;
		return;
	}
	if (smp->now_ns - s->hpa_last_ns < HPA_SYNC_NS)
		return;
	s->hpa_last_ns = smp->now_ns;
	if (s->win.cpu_s <= 0) {
		window_clear(&s->win);
		return; /* no metrics: the HPA holds */
	}
	s->windows++;
	util = s->win.cpu_sum / s->win.cpu_s;
	window_clear(&s->win);
	ratio = util / s->cfg.hpa_target;
	if (fabs(ratio - 1.0) <= HPA_TOLERANCE) {
		desired = n;
	} else {
		desired = (uint64_t)ceil((double)n * ratio - 1e-9);
		cap = (uint64_t)n * 2 > (uint64_t)n + HPA_UP_PODS
		    ? (uint64_t)n * 2
		    : (uint64_t)n + HPA_UP_PODS;
		if (desired > cap)
			desired = cap;
	}
	desired = clamp(s, desired);
	/* Scale-down stabilisation: the largest recommendation of the last
	 * five minutes, this one included. */
	for (uint32_t i = 0; i < s->hpa_nrec; i++)
		if (smp->now_ns - s->hpa_rec_ns[i] < HPA_STABILISE_NS) {
			s->hpa_rec_ns[keep] = s->hpa_rec_ns[i];
			s->hpa_rec[keep++] = s->hpa_rec[i];
		}
	s->hpa_nrec = keep;
	if (s->hpa_nrec == HPA_HISTORY) {
		memmove(s->hpa_rec_ns, s->hpa_rec_ns + 1,
		    (HPA_HISTORY - 1) * sizeof(s->hpa_rec_ns[0]));
		memmove(s->hpa_rec, s->hpa_rec + 1,
		    (HPA_HISTORY - 1) * sizeof(s->hpa_rec[0]));
		s->hpa_nrec--;
	}
	s->hpa_rec_ns[s->hpa_nrec] = smp->now_ns;
	s->hpa_rec[s->hpa_nrec++] = (uint32_t)desired;
	rec = desired;
	for (uint32_t i = 0; i < s->hpa_nrec; i++)
		if (s->hpa_rec[i] > rec)
			rec = s->hpa_rec[i];
	if (rec > s->target)
		rec = desired > s->target ? desired : s->target;
	if (rec == s->target) {
		s->settled = true;
		return;
	}
	if (change_to(s, smp->now_ns, rec)) {
		s->settled = false;
		set_reason(s, CWI_WHY_CPU,
		    "hpa:%d: cpu %.0f%% of %" PRIu32 " workers -> "
		    "%" PRIu32,
		    (int)lround(s->cfg.hpa_target * 100), util * 100, n,
		    s->target);
	}
}

/* ---- the scaler ---------------------------------------------------------- */

cachew_err
cwi_scaler_create(cwi_scaler **out, const cwi_scale_config *cfg,
    uint32_t initial)
{
	cwi_scaler *s;

	*out = NULL;
	if (cfg->min_workers > cfg->max_workers)
		return cwi_fail(CACHEW_EINVAL,
		    "scaler: min_workers %" PRIu32 " > max_workers %" PRIu32,
		    cfg->min_workers, cfg->max_workers);
	if (cfg->kind == CWI_SCALE_FIXED && cfg->fixed == 0)
		return cwi_fail(CACHEW_EINVAL, "scaler: fixed:0");
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "scaler: out of memory");
	s->cfg = *cfg;
	if (s->cfg.window_batches == 0)
		s->cfg.window_batches = 1;
	if (s->cfg.drift_every == 0)
		s->cfg.drift_every = 1;
	if (!(s->cfg.drift_factor > 1.0))
		s->cfg.drift_factor = 1.4;
	if (!(s->cfg.headroom >= 0))
		s->cfg.headroom = 0;
	cwi_scaler_reset(s, cfg->kind == CWI_SCALE_FIXED ? cfg->fixed
							 : initial);
	s->discard_left = s->cfg.discard_epoch;
	*out = s;
	return CACHEW_OK;
}

void
cwi_scaler_destroy(cwi_scaler *s)
{
	free(s);
}

uint32_t
cwi_scaler_target(const cwi_scaler *s)
{
	return s->target;
}

uint32_t
cwi_scaler_windows(const cwi_scaler *s)
{
	return s->windows;
}

void
cwi_scaler_reset(cwi_scaler *s, uint32_t workers)
{
	switch (s->cfg.kind) {
	case CWI_SCALE_FIXED:
		s->target = clamp(s, s->cfg.fixed);
		s->settled = true;
		set_reason(s, CWI_WHY_FIXED,
		    "fixed: %" PRIu32 " workers", s->target);
		break;
	case CWI_SCALE_CACHEW:
		s->target = clamp(s, 1); /* Cachew starts over at one */
		s->settled = false;
		s->ph = PH_SEARCH;
		set_reason(s, CWI_WHY_START,
		    "cachew: start at %" PRIu32 " workers",
		    s->target);
		break;
	case CWI_SCALE_HPA:
		s->target = clamp(s, workers);
		s->settled = false;
		s->hpa_nrec = 0;
		s->hpa_started = false;
		set_reason(s, CWI_WHY_START,
		    "hpa: start at %" PRIu32 " workers", s->target);
		break;
	case CWI_SCALE_MODEL:
	default:
		s->target = clamp(s, workers);
		s->settled = false;
		s->ph = PH_MEASURE;
		set_reason(s, CWI_WHY_START,
		    "model: measure at %" PRIu32 " workers",
		    s->target);
		break;
	}
	s->have = s->target;
	s->have_prev = false;
	s->jumps = 0;
	s->p_jump = 0;
	s->n_jump = 0;
	s->r_jump = 0;
	s->gain_cap = 0;
	s->d_jump = 0;
	s->redo = false;
	s->drain_ns = 0;
	s->probe_ns = 0;
	s->prev_t = 0;
	s->prev_wait = 0;
	s->ref_t = 0;
	s->ref_fill = 0;
	s->discard_left = 0;
	s->discard_ns = 0;
	restart_windows(s, s->cfg.discard_change);
}

void
cwi_scaler_granted(cwi_scaler *s, uint32_t granted)
{
	uint32_t g = granted < s->target ? granted : s->target;

	/* The ask stays (fair share may give more later); the windows
	 * restart because the count measured changes. */
	if (g == s->have)
		return;
	s->have = g;
	if (s->cfg.kind == CWI_SCALE_CACHEW || s->cfg.kind == CWI_SCALE_MODEL)
		restart_windows(s, s->cfg.discard_change);
}

/* Drops whole samples while a discard is pending; true when smp was
 * dropped. */
static bool
discarding(cwi_scaler *s, const cwi_scale_sample *smp)
{
	if (s->discard_left == 0)
		return false;
	s->discard_left = smp->batches >= s->discard_left
	    ? 0
	    : s->discard_left - smp->batches;
	s->discard_ns += smp->elapsed_ns;
	if (s->cfg.kind == CWI_SCALE_MODEL && s->cfg.discard_max_ns > 0 &&
	    s->discard_ns >= s->cfg.discard_max_ns)
		s->discard_left = 0;
	if (s->discard_left == 0)
		s->discard_ns = 0;
	return true;
}

/* A completed window: the policy's decision. */
static void
window_done(cwi_scaler *s, uint64_t now, uint32_t n)
{
	double t = window_batch_s(&s->win);
	double fill = window_fill(&s->win);

	s->windows++;
	switch (s->ph) {
	case PH_SEARCH:
		cachew_window(s, now, n, t, fill);
		break;
	case PH_MEASURE:
		model_measure(s, now, n, t, fill);
		break;
	case PH_PROBE:
		model_probe(s, now, n, t, fill);
		break;
	case PH_DRAIN:
		model_probe_dry(s, now, n, t, fill);
		break;
	case PH_REF:
		s->ref_t = t;
		s->ref_fill = fill;
		s->ph = PH_SETTLED;
		s->settled = true;
		break;
	case PH_SETTLED:
		break;
	}
	window_clear(&s->win);
}

/* A window ends at window_batches batches once the step has lasted
 * min_step_batches; the model's also after window_max_ns. A probe's
 * window also lasts probe_min_ns. */
static bool
window_complete(const cwi_scaler *s)
{
	const window *w = &s->win;

	if (w->batches == 0)
		return false;
	if ((s->ph == PH_PROBE || s->ph == PH_DRAIN) &&
	    w->elapsed_ns < s->cfg.probe_min_ns)
		return false;
	if (w->batches >= s->cfg.window_batches &&
	    s->step_batches >= s->cfg.min_step_batches)
		return true;
	return s->cfg.kind == CWI_SCALE_MODEL && s->cfg.window_max_ns > 0 &&
	    w->elapsed_ns >= s->cfg.window_max_ns &&
	    w->batches >= s->cfg.min_window_batches;
}

static void
windowed_observe(cwi_scaler *s, const cwi_scale_sample *smp, uint32_t n)
{
	if (smp->epoch_start) {
		window_clear(&s->win);
		window_clear(&s->drift);
		/* Every epoch starts with an empty queue that refills at
		 * the workers' surplus: the queue reference is measured
		 * again rather than compared with the last epoch's. */
		s->ref_fill = -1;
		if (s->cfg.discard_epoch > s->discard_left)
			s->discard_left = s->cfg.discard_epoch;
	}
	s->step_batches += smp->batches;
	if (s->ph == PH_PROBE || s->ph == PH_DRAIN)
		s->probe_ns += smp->elapsed_ns;
	if (discarding(s, smp))
		return;
	if (s->ph == PH_SETTLED) {
		window_add(&s->drift, smp, n);
		drift_check(s, smp->now_ns);
		return;
	}
	if (s->ph == PH_DRAIN) {
		model_drain_observe(s, smp, n);
	} else {
		window_add(&s->win, smp, n);
		if (s->ph == PH_PROBE) {
			/* Restarted with the window; then keeps its latest
			 * quarter to half. */
			if (s->win.samples == 1 ||
			    s->recent.elapsed_ns * 2 > s->win.elapsed_ns)
				window_clear(&s->recent);
			window_add(&s->recent, smp, n);
		}
	}
	if (window_complete(s))
		window_done(s, smp->now_ns, n);
}

void
cwi_scaler_observe(cwi_scaler *s, const cwi_scale_sample *smp,
    cwi_scale_decision *dec)
{
	uint32_t before = s->target;
	uint32_t n;

	if (smp->elapsed_ns > 0) {
		/* The observed count wins over what was granted: a change
		 * of it is a change to discard after. */
		n = smp->workers > 0 ? smp->workers : s->have;
		if (smp->workers > 0 && smp->workers != s->have) {
			s->have = smp->workers;
			if (s->cfg.kind == CWI_SCALE_CACHEW ||
			    s->cfg.kind == CWI_SCALE_MODEL) {
				window_clear(&s->win);
				window_clear(&s->drift);
				if (s->cfg.discard_change > s->discard_left)
					s->discard_left =
					    s->cfg.discard_change;
			}
		}
		switch (s->cfg.kind) {
		case CWI_SCALE_FIXED:
			break;
		case CWI_SCALE_HPA:
			hpa_observe(s, smp, n);
			break;
		case CWI_SCALE_CACHEW:
		case CWI_SCALE_MODEL:
		default:
			windowed_observe(s, smp, n);
			break;
		}
	}
	dec->workers = s->target;
	dec->changed = s->target != before;
	dec->settled = s->settled;
	dec->why = s->why;
	snprintf(dec->reason, sizeof(dec->reason), "%s", s->reason);
}

/* ---- fair share ---------------------------------------------------------- */

/* A job's weight; a non-positive or NaN one counts as 1. */
static double
weight_of(const double *weight, size_t i)
{
	return weight[i] > 0 && isfinite(weight[i]) ? weight[i] : 1.0;
}

/* got[i] / weight[i] < got[j] / weight[j], exactly enough for counts. */
static bool
share_less(uint32_t gi, double wi, uint32_t gj, double wj)
{
	return (double)gi * wj < (double)gj * wi;
}

/* The water level at which sum(min(want, max(1, weight * level))) reaches
 * total, found by bisection; shares at it are a lower bound of the exact
 * allocation, which the greedy step then completes. */
static double
water_level(const uint32_t *want, const double *weight, size_t n,
    uint32_t total)
{
	double lo = 0, hi = 1;

	for (int i = 0; i < 64; i++) {
		double sum = 0;

		for (size_t j = 0; j < n; j++)
			if (want[j] > 0)
				sum += fmin((double)want[j],
				    fmax(1.0, weight_of(weight, j) * hi));
		if (sum >= (double)total)
			break;
		hi *= 2;
	}
	for (int it = 0; it < 100; it++) {
		double mid = (lo + hi) / 2, sum = 0;

		for (size_t j = 0; j < n; j++)
			if (want[j] > 0)
				sum += fmin((double)want[j],
				    fmax(1.0, weight_of(weight, j) * mid));
		if (sum > (double)total)
			hi = mid;
		else
			lo = mid;
	}
	return lo;
}

void
cwi_fair_share(const uint32_t *want, const double *weight, size_t n,
    uint32_t total, uint32_t *got)
{
	uint64_t wanting = 0, sum_want = 0, given = 0;
	double level;

	for (size_t i = 0; i < n; i++) {
		got[i] = 0;
		if (want[i] > 0) {
			wanting++;
			sum_want += want[i];
		}
	}
	if (sum_want <= total) {
		memcpy(got, want, n * sizeof(*got));
		return;
	}
	if (total < wanting) {
		/* Fewer workers than jobs: the oldest get one each. */
		for (size_t i = 0; i < n && given < total; i++)
			if (want[i] > 0) {
				got[i] = 1;
				given++;
			}
		return;
	}
	level = water_level(want, weight, n, total);
	for (size_t i = 0; i < n; i++) {
		double share;

		if (want[i] == 0)
			continue;
		share = floor(weight_of(weight, i) * level * (1.0 - 1e-12));
		if (share < 1)
			share = 1;
		got[i] = share >= (double)want[i] ? want[i] : (uint32_t)share;
		given += got[i];
	}
	/* Fewer than n workers remain (the level's floors): one at a time
	 * to the job furthest below its share, ties to the lower index. */
	while (given < total) {
		size_t best = n;

		for (size_t i = 0; i < n; i++) {
			if (got[i] >= want[i])
				continue;
			if (best == n ||
			    share_less(got[i], weight_of(weight, i), got[best],
				weight_of(weight, best)))
				best = i;
		}
		if (best == n)
			break;
		got[best]++;
		given++;
	}
}

/* ---- saving and loading (the dispatcher's snapshot) ---------------------- */

#define CFG_FIELDS 20
#define WINDOW_FIELDS 13
#define SCALER_FIELDS 30

static void
cfg_encode(const cwi_scale_config *c, cwi_strbuf *sb)
{
	cwi_msgpack_put_array(sb, CFG_FIELDS);
	cwi_msgpack_put_uint(sb, (uint64_t)c->kind);
	cwi_msgpack_put_uint(sb, c->fixed);
	cwi_msgpack_put_f64(sb, c->hpa_target);
	cwi_msgpack_put_uint(sb, c->min_workers);
	cwi_msgpack_put_uint(sb, c->max_workers);
	cwi_msgpack_put_uint(sb, c->cooldown_ns);
	cwi_msgpack_put_uint(sb, c->window_batches);
	cwi_msgpack_put_uint(sb, c->discard_epoch);
	cwi_msgpack_put_uint(sb, c->discard_change);
	cwi_msgpack_put_uint(sb, c->min_step_batches);
	cwi_msgpack_put_f64(sb, c->improve);
	cwi_msgpack_put_uint(sb, c->drift_every);
	cwi_msgpack_put_f64(sb, c->drift_factor);
	cwi_msgpack_put_f64(sb, c->headroom);
	cwi_msgpack_put_uint(sb, c->window_max_ns);
	cwi_msgpack_put_uint(sb, c->min_window_batches);
	cwi_msgpack_put_uint(sb, c->discard_max_ns);
	cwi_msgpack_put_uint(sb, c->probe_min_ns);
	cwi_msgpack_put_uint(sb, c->probe_max_ns);
	cwi_msgpack_put_uint(sb, c->probe_watch_ns);
}

/* A finite double in [lo, hi]. */
static bool
f64_in(cwi_mp_doc *d, const char *field, double lo, double hi, double *v)
{
	if (!cwi_mp_doc_f64(d, field, v))
		return false;
	if (!(*v >= lo && *v <= hi))
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, field,
		    "%g is not in %g..%g", *v, lo, hi);
	return true;
}

/* The bounds cwi_scaler_create leaves a configuration within. */
static bool
cfg_decode(cwi_mp_doc *d, cwi_scale_config *c)
{
	size_t mark = cwi_mp_doc_enter(d, "cfg");
	uint32_t kind;

	memset(c, 0, sizeof(*c));
	cwi_mp_doc_record(d, NULL, CFG_FIELDS);
	cwi_mp_doc_u32(d, "kind", 0, CWI_SCALE_HPA, &kind);
	c->kind = (cwi_scale_kind)kind;
	cwi_mp_doc_u32(d, "fixed", 0, UINT32_MAX, &c->fixed);
	cwi_mp_doc_f64(d, "hpa_target", &c->hpa_target);
	cwi_mp_doc_u32(d, "min_workers", 0, UINT32_MAX, &c->min_workers);
	cwi_mp_doc_u32(d, "max_workers", c->min_workers, UINT32_MAX,
	    &c->max_workers);
	cwi_mp_doc_u64(d, "cooldown_ns", 0, UINT64_MAX, &c->cooldown_ns);
	cwi_mp_doc_u32(d, "window_batches", 1, UINT32_MAX,
	    &c->window_batches);
	cwi_mp_doc_u32(d, "discard_epoch", 0, UINT32_MAX, &c->discard_epoch);
	cwi_mp_doc_u32(d, "discard_change", 0, UINT32_MAX,
	    &c->discard_change);
	cwi_mp_doc_u32(d, "min_step_batches", 0, UINT32_MAX,
	    &c->min_step_batches);
	cwi_mp_doc_f64(d, "improve", &c->improve);
	cwi_mp_doc_u32(d, "drift_every", 1, UINT32_MAX, &c->drift_every);
	f64_in(d, "drift_factor", 1.0, INFINITY, &c->drift_factor);
	f64_in(d, "headroom", 0, INFINITY, &c->headroom);
	cwi_mp_doc_u64(d, "window_max_ns", 0, UINT64_MAX, &c->window_max_ns);
	cwi_mp_doc_u32(d, "min_window_batches", 0, UINT32_MAX,
	    &c->min_window_batches);
	cwi_mp_doc_u64(d, "discard_max_ns", 0, UINT64_MAX,
	    &c->discard_max_ns);
	cwi_mp_doc_u64(d, "probe_min_ns", 0, UINT64_MAX, &c->probe_min_ns);
	cwi_mp_doc_u64(d, "probe_max_ns", 0, UINT64_MAX, &c->probe_max_ns);
	cwi_mp_doc_u64(d, "probe_watch_ns", 0, UINT64_MAX,
	    &c->probe_watch_ns);
	if (d->rv == CACHEW_OK && c->kind == CWI_SCALE_FIXED && c->fixed == 0)
		cwi_mp_doc_fail(d, CACHEW_ECORRUPT, "fixed", "fixed:0");
	/* hpa divides by its target. */
	if (d->rv == CACHEW_OK && c->kind == CWI_SCALE_HPA &&
	    !(c->hpa_target >= 0.01 && c->hpa_target <= 1.0))
		cwi_mp_doc_fail(d, CACHEW_ECORRUPT, "hpa_target",
		    "%g is not in 0.01..1", c->hpa_target);
	if (d->rv == CACHEW_OK && !(c->drift_factor > 1.0))
		cwi_mp_doc_fail(d, CACHEW_ECORRUPT, "drift_factor",
		    "%g is not above 1", c->drift_factor);
	cwi_mp_doc_leave(d, mark);
	return d->rv == CACHEW_OK;
}

static void
window_encode(const window *w, cwi_strbuf *sb)
{
	cwi_msgpack_put_array(sb, WINDOW_FIELDS);
	cwi_msgpack_put_uint(sb, w->batches);
	cwi_msgpack_put_uint(sb, w->elapsed_ns);
	cwi_msgpack_put_uint(sb, w->wait_ns);
	cwi_msgpack_put_uint(sb, w->samples);
	cwi_msgpack_put_f64(sb, w->fill_sum);
	cwi_msgpack_put_f64(sb, w->workers_sum);
	cwi_msgpack_put_f64(sb, w->busy_sum);
	cwi_msgpack_put_f64(sb, w->busy_s);
	cwi_msgpack_put_f64(sb, w->cpu_sum);
	cwi_msgpack_put_f64(sb, w->cpu_s);
	cwi_msgpack_put_f64(sb, w->t_sum);
	cwi_msgpack_put_f64(sb, w->tt_sum);
	cwi_msgpack_put_f64(sb, w->tf_sum);
}

/* Sums are kept as they were (any double: a NaN in a sum is what the
 * saved scaler had too). */
static bool
window_decode(cwi_mp_doc *d, const char *name, window *w)
{
	size_t mark = cwi_mp_doc_enter(d, name);

	cwi_mp_doc_record(d, NULL, WINDOW_FIELDS);
	cwi_mp_doc_u64(d, "batches", 0, UINT64_MAX, &w->batches);
	cwi_mp_doc_u64(d, "elapsed_ns", 0, UINT64_MAX, &w->elapsed_ns);
	cwi_mp_doc_u64(d, "wait_ns", 0, UINT64_MAX, &w->wait_ns);
	cwi_mp_doc_u32(d, "samples", 0, UINT32_MAX, &w->samples);
	cwi_mp_doc_f64(d, "fill_sum", &w->fill_sum);
	cwi_mp_doc_f64(d, "workers_sum", &w->workers_sum);
	cwi_mp_doc_f64(d, "busy_sum", &w->busy_sum);
	cwi_mp_doc_f64(d, "busy_s", &w->busy_s);
	cwi_mp_doc_f64(d, "cpu_sum", &w->cpu_sum);
	cwi_mp_doc_f64(d, "cpu_s", &w->cpu_s);
	cwi_mp_doc_f64(d, "t_sum", &w->t_sum);
	cwi_mp_doc_f64(d, "tt_sum", &w->tt_sum);
	cwi_mp_doc_f64(d, "tf_sum", &w->tf_sum);
	cwi_mp_doc_leave(d, mark);
	return d->rv == CACHEW_OK;
}

void
cwi_scaler_encode(const cwi_scaler *s, cwi_strbuf *sb)
{
	cwi_msgpack_put_array(sb, SCALER_FIELDS);
	cfg_encode(&s->cfg, sb);
	cwi_msgpack_put_uint(sb, s->target);
	cwi_msgpack_put_uint(sb, s->have);
	cwi_msgpack_put_bool(sb, s->settled);
	cwi_msgpack_put_cstr(sb, s->reason);
	cwi_msgpack_put_uint(sb, s->windows);
	cwi_msgpack_put_bool(sb, s->changed_ever);
	cwi_msgpack_put_uint(sb, s->last_change_ns);
	cwi_msgpack_put_uint(sb, (uint64_t)s->ph);
	cwi_msgpack_put_uint(sb, s->discard_left);
	cwi_msgpack_put_uint(sb, s->discard_ns);
	cwi_msgpack_put_uint(sb, s->step_batches);
	window_encode(&s->win, sb);
	cwi_msgpack_put_bool(sb, s->have_prev);
	cwi_msgpack_put_uint(sb, s->prev_n);
	cwi_msgpack_put_f64(sb, s->prev_t);
	cwi_msgpack_put_f64(sb, s->prev_wait);
	cwi_msgpack_put_uint(sb, s->jumps);
	cwi_msgpack_put_f64(sb, s->p_jump);
	cwi_msgpack_put_f64(sb, s->d_jump);
	cwi_msgpack_put_bool(sb, s->redo);
	cwi_msgpack_put_uint(sb, s->drain_ns);
	cwi_msgpack_put_uint(sb, s->probe_ns);
	cwi_msgpack_put_f64(sb, s->ref_t);
	cwi_msgpack_put_f64(sb, s->ref_fill);
	window_encode(&s->drift, sb);
	window_encode(&s->recent, sb);
	cwi_msgpack_put_uint(sb, s->hpa_last_ns);
	cwi_msgpack_put_bool(sb, s->hpa_started);
	/* The history's live part: pairs of time and recommendation. */
	cwi_msgpack_put_array(sb, 2 * (size_t)s->hpa_nrec);
	for (uint32_t i = 0; i < s->hpa_nrec; i++) {
		cwi_msgpack_put_uint(sb, s->hpa_rec_ns[i]);
		cwi_msgpack_put_uint(sb, s->hpa_rec[i]);
	}
}

static bool
hpa_decode(cwi_mp_doc *d, cwi_scaler *s)
{
	uint64_t n;

	if (!cwi_mp_doc_array(d, "hpa_history", 2 * HPA_HISTORY, &n))
		return false;
	if (n % 2 != 0)
		return cwi_mp_doc_fail(d, CACHEW_ECORRUPT, "hpa_history",
		    "%" PRIu64 " items: pairs of time and count", n);
	s->hpa_nrec = (uint32_t)(n / 2);
	for (uint32_t i = 0; i < s->hpa_nrec; i++) {
		cwi_mp_doc_u64(d, "hpa_history", 0, UINT64_MAX,
		    &s->hpa_rec_ns[i]);
		cwi_mp_doc_u32(d, "hpa_history", 0, UINT32_MAX, &s->hpa_rec[i]);
	}
	return d->rv == CACHEW_OK;
}

bool
cwi_scaler_decode(cwi_mp_doc *d, cwi_scaler **out)
{
	cwi_scaler *s;
	uint32_t ph;

	*out = NULL;
	if (!cwi_mp_doc_record(d, NULL, SCALER_FIELDS))
		return false;
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return cwi_mp_doc_fail(d, CACHEW_ENOMEM, NULL, "out of memory");
	cfg_decode(d, &s->cfg);
	cwi_mp_doc_u32(d, "target", 0, UINT32_MAX, &s->target);
	cwi_mp_doc_u32(d, "have", 0, UINT32_MAX, &s->have);
	cwi_mp_doc_bool(d, "settled", &s->settled);
	cwi_mp_doc_text(d, "reason", s->reason, sizeof(s->reason) - 1);
	cwi_mp_doc_u32(d, "windows", 0, UINT32_MAX, &s->windows);
	cwi_mp_doc_bool(d, "changed_ever", &s->changed_ever);
	cwi_mp_doc_u64(d, "last_change_ns", 0, UINT64_MAX,
	    &s->last_change_ns);
	cwi_mp_doc_u32(d, "phase", PH_SEARCH, PH_SETTLED, &ph);
	s->ph = (phase)ph;
	cwi_mp_doc_u64(d, "discard_left", 0, UINT64_MAX, &s->discard_left);
	cwi_mp_doc_u64(d, "discard_ns", 0, UINT64_MAX, &s->discard_ns);
	cwi_mp_doc_u64(d, "step_batches", 0, UINT64_MAX, &s->step_batches);
	window_decode(d, "win", &s->win);
	cwi_mp_doc_bool(d, "have_prev", &s->have_prev);
	cwi_mp_doc_u32(d, "prev_n", 0, UINT32_MAX, &s->prev_n);
	cwi_mp_doc_f64(d, "prev_t", &s->prev_t);
	cwi_mp_doc_f64(d, "prev_wait", &s->prev_wait);
	cwi_mp_doc_u32(d, "jumps", 0, UINT32_MAX, &s->jumps);
	cwi_mp_doc_f64(d, "p_jump", &s->p_jump);
	cwi_mp_doc_f64(d, "d_jump", &s->d_jump);
	cwi_mp_doc_bool(d, "redo", &s->redo);
	cwi_mp_doc_u64(d, "drain_ns", 0, UINT64_MAX, &s->drain_ns);
	cwi_mp_doc_u64(d, "probe_ns", 0, UINT64_MAX, &s->probe_ns);
	cwi_mp_doc_f64(d, "ref_t", &s->ref_t);
	cwi_mp_doc_f64(d, "ref_fill", &s->ref_fill);
	window_decode(d, "drift", &s->drift);
	window_decode(d, "recent", &s->recent);
	cwi_mp_doc_u64(d, "hpa_last_ns", 0, UINT64_MAX, &s->hpa_last_ns);
	cwi_mp_doc_bool(d, "hpa_started", &s->hpa_started);
	hpa_decode(d, s);
	if (d->rv != CACHEW_OK) {
		free(s);
		return false;
	}
	*out = s;
	return true;
}
