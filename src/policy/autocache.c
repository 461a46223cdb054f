/*
 * autocache.c - autocaching decisions (autocache.h): candidates from a
 * pipeline graph, per-candidate costs from operator counters, our cost
 * model, Cachew's original rule, drift, and a job's mode progression.
 *
 * Pure: no clock, no I/O, no locks. Only the plan allocates.
 */
#include "autocache.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ------------------------------------------------------ */

#define AC_PROFILE_DEFAULT 100u
#define AC_PROFILE_CACHEW 300u /* Cachew's published profiling length */
#define AC_DRIFT 0.25

static const char *const kind_names[] = {
    [CWI_AC_DEFAULT] = "default",
    [CWI_AC_CACHEW] = "cachew",
    [CWI_AC_FIX_COMPUTE] = "compute",
    [CWI_AC_FIX_SOURCE] = "source",
    [CWI_AC_FIX_FULL] = "full",
};

void
cwi_ac_config_default(cwi_ac_config *c)
{
	memset(c, 0, sizeof(*c));
	c->kind = CWI_AC_DEFAULT;
	c->allow_frozen_random = false;
	c->profile_batches = AC_PROFILE_DEFAULT;
	c->drift = AC_DRIFT;
}

cachew_err
cwi_ac_parse(cwi_ac_config *c, const char *spec)
{
	for (size_t i = 0; i < sizeof(kind_names) / sizeof(kind_names[0]);
	     i++) {
		if (spec != NULL && strcmp(spec, kind_names[i]) == 0) {
			c->kind = (cwi_ac_kind)i;
			c->profile_batches = c->kind == CWI_AC_CACHEW
			    ? AC_PROFILE_CACHEW
			    : AC_PROFILE_DEFAULT;
			return CACHEW_OK;
		}
	}
	return cwi_fail(CACHEW_EINVAL,
	    "autocache policy \"%s\": expected default, cachew, compute, "
	    "source or full",
	    spec != NULL ? spec : "(null)");
}

const char *
cwi_ac_kind_name(cwi_ac_kind kind)
{
	if ((size_t)kind < sizeof(kind_names) / sizeof(kind_names[0]))
		return kind_names[kind];
	return "?";
}

const char *
cwi_ac_choice_name(cwi_ac_choice c)
{
	switch (c) {
	case CWI_AC_CHOICE_COMPUTE:
		return "compute";
	case CWI_AC_CHOICE_SOURCE:
		return "source";
	case CWI_AC_CHOICE_FULL:
		return "full";
	}
	return "?";
}

const char *
cwi_ac_mode_name(cwi_ac_mode m)
{
	switch (m) {
	case CWI_AC_PROFILE:
		return "profile";
	case CWI_AC_PUT:
		return "put";
	case CWI_AC_GET:
		return "get";
	case CWI_AC_COMPUTE:
		return "compute";
	}
	return "?";
}

/* Appends to a fixed buffer, truncating (reasons are for people). */
static void CACHEW_PRINTF(3, 4)
cat(char *buf, size_t size, const char *fmt, ...)
{
	size_t len = strnlen(buf, size);
	va_list ap;

	if (len + 1 >= size)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, size - len, fmt, ap);
	va_end(ap);
}

/* snprintf for reasons: truncation is fine (and not warned about). */
static void CACHEW_PRINTF(3, 4)
put(char *buf, size_t size, const char *fmt, ...)
{
	va_list ap;

	if (size == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, size, fmt, ap);
	va_end(ap);
}

/* ---- plans -------------------------------------------------------------- */

typedef struct node_list {
	const cwi_node **v;
	size_t n, cap;
} node_list;

static ptrdiff_t
node_find(const node_list *l, const cwi_node *node)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i] == node)
			return (ptrdiff_t)i;
	return -1;
}

/* The executor's order (exec_iter.c collect_nodes): post-order, inputs
 * before the node, each node once, so index i here is stats row i and the
 * "i:" of the workers' counters. */
static cachew_err
collect(node_list *l, const cwi_node *node)
{
	cachew_err rv;

	if (node_find(l, node) >= 0)
		return CACHEW_OK;
	for (size_t i = 0; i < node->ninputs; i++) {
		rv = collect(l, node->inputs[i]);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (l->n == l->cap) {
		size_t ncap = l->cap != 0 ? l->cap * 2 : 16;
		const cwi_node **v = realloc(l->v, ncap * sizeof(*v));
		if (v == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		l->v = v;
		l->cap = ncap;
	}
	l->v[l->n++] = node;
	return CACHEW_OK;
}

static bool
node_random(const cwi_node *n)
{
	return (n->op->flags & CWI_OPF_RANDOM) != 0 ||
	    (n->fn != NULL && (n->fn->def.flags & CACHEW_OP_RANDOM) != 0);
}

static void
mark_upstream(cwi_ac_plan *p, const node_list *l, const cwi_node *node,
    size_t k)
{
	ptrdiff_t i = node_find(l, node);

	if (i < 0 || p->upstream[(size_t)i * p->ncand + k])
		return;
	p->upstream[(size_t)i * p->ncand + k] = 1;
	for (size_t j = 0; j < node->ninputs; j++)
		mark_upstream(p, l, node->inputs[j], k);
}

static bool
is_marker(const cwi_node *n)
{
	return strcmp(n->op->name, "autocache") == 0;
}

cachew_err
cwi_autocache_plan(const cwi_node *end, cwi_ac_plan **out)
{
	node_list l = {0};
	cwi_ac_plan *p = NULL;
	size_t ncand = 0;
	cachew_err rv;

	*out = NULL;
	rv = collect(&l, end);
	if (rv != CACHEW_OK)
		goto fail;
	for (size_t i = 0; i < l.n; i++)
		if (is_marker(l.v[i]) || l.v[i] == end)
			ncand++;
	if (ncand > CWI_AC_MAX_CANDIDATES) {
		rv = cwi_fail(CACHEW_EINVAL,
		    "autocache: %zu candidate points (autocache markers and "
		    "the end); at most %d are considered",
		    ncand, CWI_AC_MAX_CANDIDATES);
		goto fail;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL || (p->upstream = calloc(l.n * ncand, 1)) == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	p->nnodes = l.n;
	p->ncand = ncand;
	for (size_t i = 0, k = 0; i < l.n; i++) {
		if (!is_marker(l.v[i]) && l.v[i] != end)
			continue;
		p->cand[k].node = l.v[i];
		p->cand[k].index = (int)i;
		p->cand[k].full = l.v[i] == end;
		k++;
	}
	for (size_t k = 0; k < ncand; k++) {
		cwi_ac_candidate *c = &p->cand[k];
		mark_upstream(p, &l, c->node, k);
		for (size_t i = 0; i < l.n && !c->random_upstream; i++) {
			const cwi_node *n = l.v[i];
			if (!p->upstream[i * ncand + k] || !node_random(n))
				continue;
			c->random_upstream = true;
			if (n->fn != NULL)
				put(c->random_op, sizeof(c->random_op),
				    "%s/%s", n->op->name, n->fn->name);
			else
				snprintf(c->random_op, sizeof(c->random_op),
				    "%s", n->op->name);
		}
	}
	free(l.v);
	*out = p;
	return CACHEW_OK;
fail:
	free(l.v);
	cwi_autocache_plan_free(p);
	return rv;
}

void
cwi_autocache_plan_free(cwi_ac_plan *p)
{
	if (p == NULL)
		return;
	free(p->upstream);
	free(p);
}

/* ---- measurements ------------------------------------------------------- */

/* The node index of a counter named "idx:op[/detail]"; -1 if malformed. */
static long
counter_index(const char *name)
{
	char *end = NULL;
	long idx;

	if (name == NULL || name[0] < '0' || name[0] > '9')
		return -1;
	idx = strtol(name, &end, 10);
	if (end == NULL || *end != ':' || idx < 0 || idx > 1000000)
		return -1;
	return idx;
}

cachew_err
cwi_autocache_measure(const cwi_ac_plan *plan, const cwi_ac_counter *ops,
    size_t nops, double epoch_fraction, cwi_ac_inputs *in)
{
	if (!(epoch_fraction > 0.0 && epoch_fraction <= 1.0))
		return cwi_fail(CACHEW_EINVAL,
		    "autocache: epoch fraction %g outside (0, 1]",
		    epoch_fraction);
	for (size_t i = 0; i < nops; i++) {
		long idx = counter_index(ops[i].name);
		if (idx < 0 || (size_t)idx >= plan->nnodes)
			return cwi_fail(CACHEW_EINVAL,
			    "autocache: counter \"%s\": %s",
			    ops[i].name != NULL ? ops[i].name : "(null)",
			    idx < 0 ? "expected \"index:operator\""
				    : "index outside the pipeline");
	}
	in->n = plan->ncand;
	in->cand = plan->cand;
	for (size_t k = 0; k < plan->ncand; k++) {
		double elements = 0, bytes = 0, up = 0, after = 0;
		for (size_t i = 0; i < nops; i++) {
			size_t idx = (size_t)counter_index(ops[i].name);
			if ((int)idx == plan->cand[k].index) {
				elements += (double)ops[i].elements;
				bytes += (double)ops[i].bytes;
			}
			if (plan->upstream[idx * plan->ncand + k])
				up += (double)ops[i].busy_ns;
			else
				after += (double)ops[i].busy_ns;
		}
		if (elements <= 0)
			return cwi_fail(CACHEW_EINVAL,
			    "autocache: candidate %d:%s produced no elements "
			    "yet; nothing to measure",
			    plan->cand[k].index, plan->cand[k].node->op->name);
		in->point[k].rows = elements / epoch_fraction;
		in->point[k].row_bytes = bytes / elements;
		in->point[k].up_ns = up / elements;
		in->point[k].after_ns = after / elements;
	}
	return CACHEW_OK;
}

/* ---- our rule ----------------------------------------------------------- */

static double
parallelism(const cwi_ac_inputs *in)
{
	return in->parallelism >= 1.0 ? in->parallelism : 1.0;
}

/* A compute pass: everything, per row of the end. */
static double
compute_pass_s(const cwi_ac_inputs *in)
{
	const cwi_ac_point *e = &in->point[in->n - 1];
	return e->rows * (e->up_ns + e->after_ns) * 1e-9 / parallelism(in);
}

/* A GET pass at k: reading at the measured rate (per-reader bandwidth,
 * per-row overhead, the storage's aggregate limit), plus the compute after
 * k. */
static double
get_pass_s(const cwi_ac_inputs *in, size_t k)
{
	const cwi_ac_point *pt = &in->point[k];
	const cwi_ac_storage *st = &in->storage;
	double p = parallelism(in);
	double row_s = pt->row_bytes / (st->read_mb_per_s * 1e6);
	double read_s;

	if (st->read_rows_per_s > 0 && 1.0 / st->read_rows_per_s > row_s)
		row_s = 1.0 / st->read_rows_per_s;
	read_s = pt->rows * row_s / p;
	if (st->read_mb_per_s_max > 0) {
		double agg = pt->rows * pt->row_bytes /
		    (st->read_mb_per_s_max * 1e6);
		if (agg > read_s)
			read_s = agg;
	}
	return read_s + pt->rows * pt->after_ns * 1e-9 / p;
}

static double
write_s(const cwi_ac_inputs *in, size_t k)
{
	const cwi_ac_point *pt = &in->point[k];
	return pt->rows * pt->row_bytes / (in->storage.write_mb_per_s * 1e6) /
	    parallelism(in);
}

/* "1.2 GB" style sizes for reasons. */
static void
fmt_bytes(char *buf, size_t size, double b)
{
	if (b >= 1e9)
		snprintf(buf, size, "%.1f GB", b / 1e9);
	else if (b >= 1e6)
		snprintf(buf, size, "%.1f MB", b / 1e6);
	else
		snprintf(buf, size, "%.0f B", b);
}

static void
label(char *buf, size_t size, const cwi_ac_inputs *in, int k)
{
	if (k < 0)
		snprintf(buf, size, "compute");
	else if (in->cand != NULL && in->cand[k].full)
		snprintf(buf, size, "full cache at node %d", in->cand[k].index);
	else if (in->cand != NULL)
		snprintf(buf, size, "source cache at node %d",
		    in->cand[k].index);
	else
		snprintf(buf, size, "cache at candidate %d", k);
}

static bool
is_full(const cwi_ac_inputs *in, size_t k)
{
	return in->cand != NULL ? in->cand[k].full : k + 1 == in->n;
}

/* The guards every policy applies: randomness and capacity. Returns false
 * with why_not filled when the candidate may not be cached. */
static bool
guard(const cwi_ac_config *cfg, const cwi_ac_inputs *in, size_t k,
    cwi_ac_estimate *e)
{
	const cwi_ac_point *pt = &in->point[k];
	const cwi_ac_storage *st = &in->storage;

	e->bytes = pt->rows * pt->row_bytes;
	if (in->cand != NULL && in->cand[k].random_upstream &&
	    !cfg->allow_frozen_random) {
		put(e->why_not, sizeof(e->why_not),
		    "random upstream (%s): a cache would replay one draw",
		    in->cand[k].random_op);
		return false;
	}
	if (st->capacity_bytes > 0 && !pt->cached) {
		double free_b = st->capacity_bytes > st->used_bytes
		    ? (double)(st->capacity_bytes - st->used_bytes)
		    : 0.0;
		if (e->bytes > free_b) {
			char need[32], fr[32], cap[32];
			fmt_bytes(need, sizeof(need), e->bytes);
			fmt_bytes(fr, sizeof(fr), free_b);
			fmt_bytes(cap, sizeof(cap),
			    (double)st->capacity_bytes);
			put(e->why_not, sizeof(e->why_not),
			    "needs %s, %s free of %s capacity", need, fr, cap);
			return false;
		}
	}
	return true;
}

static void
estimate_ours(const cwi_ac_config *cfg, const cwi_ac_inputs *in, size_t k,
    double c, cwi_ac_estimate *e)
{
	const cwi_ac_point *pt = &in->point[k];
	const cwi_ac_storage *st = &in->storage;
	double left = in->current_left > 0 ? in->current_left : 0;
	double after = in->epochs_after > 0 ? in->epochs_after : 0;
	double w;

	memset(e, 0, sizeof(*e));
	e->total_s = INFINITY;
	e->eligible = guard(cfg, in, k, e);
	if (!(st->read_mb_per_s > 0)) {
		if (e->eligible)
			snprintf(e->why_not, sizeof(e->why_not),
			    "cache storage not measured");
		e->eligible = false;
		return;
	}
	e->epoch_s = get_pass_s(in, k);
	if (pt->cached) {
		e->put_s = 0;
		if (e->eligible)
			e->total_s = (left + after) * e->epoch_s;
		return;
	}
	if (!(st->write_mb_per_s > 0)) {
		if (e->eligible)
			snprintf(e->why_not, sizeof(e->why_not),
			    "write rate not measured");
		e->eligible = false;
		return;
	}
	w = write_s(in, k);
	e->put_s = c + w;
	if (!e->eligible)
		return;
	if (pt->writing) {
		e->total_s = left * (c + w) + after * e->epoch_s;
	} else if (after >= 1.0) {
		e->total_s = left * c + (c + w) + (after - 1.0) * e->epoch_s;
	} else {
		snprintf(e->why_not, sizeof(e->why_not),
		    "no pass left to read it after writing it");
		e->eligible = false;
	}
}

/* Picks the cheapest eligible option by key(): compute first, so ties go
 * to computing, then to the earlier candidate. */
static int
cheapest(const cwi_ac_decision *d, bool by_total, int *runner_up)
{
	double best = by_total ? d->compute.total_s : d->compute.epoch_s;
	double second = INFINITY;
	int pick = -1;

	*runner_up = -2;
	for (size_t k = 0; k < d->n; k++) {
		double v = by_total ? d->cache[k].total_s : d->cache[k].epoch_s;
		if (!d->cache[k].eligible)
			continue;
		if (v < best) {
			second = best;
			*runner_up = pick;
			best = v;
			pick = (int)k;
		} else if (v < second) {
			second = v;
			*runner_up = (int)k;
		}
	}
	if (*runner_up == -2 && pick >= 0)
		*runner_up = -1; /* compute was the only other option */
	return pick;
}

static void
finish(const cwi_ac_config *cfg, const cwi_ac_inputs *in,
    cwi_ac_decision *d, int pick, int runner, bool by_total)
{
	char name[64];
	const cwi_ac_estimate *e = pick >= 0 ? &d->cache[pick] : &d->compute;
	double v = by_total ? e->total_s : e->epoch_s;

	d->candidate = pick;
	if (pick < 0)
		d->choice = CWI_AC_CHOICE_COMPUTE;
	else
		d->choice = is_full(in, (size_t)pick) ? CWI_AC_CHOICE_FULL
						      : CWI_AC_CHOICE_SOURCE;
	label(name, sizeof(name), in, pick);
	cat(d->reason, sizeof(d->reason), "%s: %s %.1f s%s", name,
	    by_total ? "total" : "per pass", v,
	    pick >= 0 && in->point[pick].cached ? " (already cached)" : "");
	if (runner >= -1 && runner != pick) {
		const cwi_ac_estimate *r = runner >= 0 ? &d->cache[runner]
						       : &d->compute;
		double rv = by_total ? r->total_s : r->epoch_s;
		label(name, sizeof(name), in, runner);
		if (isfinite(rv))
			cat(d->reason, sizeof(d->reason), "; next %s %.1f s",
			    name, rv);
	}
	for (size_t k = 0; k < d->n; k++) {
		if (d->cache[k].eligible)
			continue;
		label(name, sizeof(name), in, (int)k);
		cat(d->reason, sizeof(d->reason), "; not %s: %s", name,
		    d->cache[k].why_not);
	}
	if (cfg->allow_frozen_random && pick >= 0 && in->cand != NULL &&
	    in->cand[pick].random_upstream)
		cat(d->reason, sizeof(d->reason),
		    "; frozen randomness allowed: every later pass replays "
		    "the cached draw of %s",
		    in->cand[pick].random_op);
}

void
cwi_autocache_decide(const cwi_ac_config *cfg, const cwi_ac_inputs *in,
    cwi_ac_decision *out)
{
	double left = in->current_left > 0 ? in->current_left : 0;
	double after = in->epochs_after > 0 ? in->epochs_after : 0;
	double c;
	int pick, runner;

	memset(out, 0, sizeof(*out));
	out->candidate = -1;
	out->n = in->n;
	if (in->n == 0 || in->n > CWI_AC_MAX_CANDIDATES) {
		out->n = 0;
		out->compute.eligible = true;
		snprintf(out->reason, sizeof(out->reason),
		    "compute: no candidates measured");
		return;
	}
	c = compute_pass_s(in);
	out->compute.eligible = true;
	out->compute.epoch_s = c;
	out->compute.total_s = (left + after) * c;
	for (size_t k = 0; k < in->n; k++)
		estimate_ours(cfg, in, k, c, &out->cache[k]);
	pick = cheapest(out, true, &runner);
	finish(cfg, in, out, pick, runner, true);
}

/* ---- Cachew's rule ------------------------------------------------------ */

/* Read time per row vs row size, measured offline once (Cachew kept such a
 * table instead of measuring the cache storage). These numbers are a local
 * NVMe SSD through the page cache: ~5 us per row of overhead and about
 * 1.2 GB/s for large rows. */
static const struct {
	double bytes, us;
} read_table[] = {
    {1024, 6},
    {16384, 18},
    {65536, 60},
    {262144, 220},
    {1048576, 860},
    {4194304, 3400},
};
#define READ_TABLE_N (sizeof(read_table) / sizeof(read_table[0]))

double
cwi_autocache_table_us(double row_bytes)
{
	if (!(row_bytes > read_table[0].bytes))
		return read_table[0].us;
	for (size_t i = 1; i < READ_TABLE_N; i++) {
		if (row_bytes <= read_table[i].bytes) {
			double f = (row_bytes - read_table[i - 1].bytes) /
			    (read_table[i].bytes - read_table[i - 1].bytes);
			return read_table[i - 1].us +
			    f * (read_table[i].us - read_table[i - 1].us);
		}
	}
	/* Past the table: the largest rows' bandwidth. */
	return read_table[READ_TABLE_N - 1].us * row_bytes /
	    read_table[READ_TABLE_N - 1].bytes;
}

void
cwi_autocache_decide_cachew(const cwi_ac_config *cfg,
    const cwi_ac_inputs *in, cwi_ac_decision *out)
{
	double p = parallelism(in);
	int pick, runner;

	memset(out, 0, sizeof(*out));
	out->candidate = -1;
	out->n = in->n;
	out->compute.eligible = true;
	if (in->n == 0 || in->n > CWI_AC_MAX_CANDIDATES) {
		out->n = 0;
		snprintf(out->reason, sizeof(out->reason),
		    "compute: no candidates measured");
		return;
	}
	/* Per-row time x rows, as Cachew measured it (the end's rows). */
	out->compute.epoch_s = compute_pass_s(in);
	out->compute.total_s = out->compute.epoch_s;
	for (size_t k = 0; k < in->n; k++) {
		const cwi_ac_point *pt = &in->point[k];
		cwi_ac_estimate *e = &out->cache[k];
		e->total_s = INFINITY;
		e->eligible = guard(cfg, in, k, e);
		e->epoch_s = pt->rows * cwi_autocache_table_us(pt->row_bytes) *
		    1e-6 / p;
		if (!is_full(in, k))
			e->epoch_s += pt->rows * pt->after_ns * 1e-9 / p;
		e->put_s = out->compute.epoch_s; /* no write cost modelled */
		if (e->eligible)
			e->total_s = e->epoch_s;
	}
	pick = cheapest(out, false, &runner);
	snprintf(out->reason, sizeof(out->reason), "cachew rule (static read "
						   "table, decided once): ");
	finish(cfg, in, out, pick, runner, false);
}

/* ---- drift -------------------------------------------------------------- */

static bool
moved(double assumed, double now, double limit, const char *what,
    char *why, size_t why_size)
{
	double rel;

	if (!(assumed > 0))
		return false; /* nothing assumed, nothing to drift from */
	rel = (now - assumed) / assumed;
	if (fabs(rel) <= limit)
		return false;
	if (why != NULL && why_size > 0)
		snprintf(why, why_size, "%s %.4g -> %.4g (%+.0f%%)", what,
		    assumed, now, rel * 100.0);
	return true;
}

bool
cwi_autocache_drifted(const cwi_ac_config *cfg,
    const cwi_ac_inputs *assumed, const cwi_ac_inputs *now, char *why,
    size_t why_size)
{
	double limit = cfg->drift > 0 ? cfg->drift : AC_DRIFT;
	const cwi_ac_storage *a = &assumed->storage, *b = &now->storage;
	char what[48];

	if (why != NULL && why_size > 0)
		why[0] = '\0';
	if (assumed->n != now->n || now->n > CWI_AC_MAX_CANDIDATES) {
		if (why != NULL && why_size > 0)
			snprintf(why, why_size, "candidates %zu -> %zu",
			    assumed->n, now->n);
		return true;
	}
	if (moved(a->read_mb_per_s, b->read_mb_per_s, limit, "read_mb_per_s",
		why, why_size) ||
	    moved(a->read_rows_per_s, b->read_rows_per_s, limit,
		"read_rows_per_s", why, why_size) ||
	    moved(a->write_mb_per_s, b->write_mb_per_s, limit,
		"write_mb_per_s", why, why_size))
		return true;
	for (size_t k = 0; k < now->n; k++) {
		const cwi_ac_point *x = &assumed->point[k], *y = &now->point[k];
		const struct {
			const char *name;
			double a, b;
		} m[] = {
		    {"rows", x->rows, y->rows},
		    {"row_bytes", x->row_bytes, y->row_bytes},
		    {"up_ns", x->up_ns, y->up_ns},
		    {"after_ns", x->after_ns, y->after_ns},
		};
		for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
			snprintf(what, sizeof(what), "candidate %zu %s", k,
			    m[i].name);
			if (moved(m[i].a, m[i].b, limit, what, why, why_size))
				return true;
		}
	}
	return false;
}

/* ---- a job's modes ------------------------------------------------------ */

static bool
eligible_at_start(const cwi_ac_config *cfg, const cwi_ac_candidate *c)
{
	return !c->random_upstream || cfg->allow_frozen_random;
}

/* Records a mode change and its reason in j->event, and the worker scale
 * (new pass time / old) when both are known. */
static void
set_mode(cwi_ac_job *j, cwi_ac_mode mode, int target, double epoch_s,
    const char *why)
{
	char line[sizeof(j->event)];

	snprintf(line, sizeof(line), "%s", j->event);
	j->worker_scale = j->epoch_s > 0 && epoch_s > 0 ? epoch_s / j->epoch_s
							 : 1.0;
	put(j->event, sizeof(j->event), "%s%s%s -> %s", line,
	    line[0] != '\0' ? "; " : "", cwi_ac_mode_name(j->mode),
	    cwi_ac_mode_name(mode));
	if (target >= 0)
		cat(j->event, sizeof(j->event), " at candidate %d", target);
	if (why != NULL && why[0] != '\0')
		cat(j->event, sizeof(j->event), ": %s", why);
	j->mode = mode;
	j->target = target;
	j->epoch_s = epoch_s;
}

void
cwi_ac_job_start(cwi_ac_job *j, const cwi_ac_config *cfg,
    const cwi_ac_plan *plan, const bool *cached)
{
	int k = -1;

	memset(j, 0, sizeof(*j));
	j->cfg = *cfg;
	j->mode = CWI_AC_PROFILE;
	j->target = -1;
	j->pending = -1;
	j->worker_scale = 1.0;
	j->last.candidate = -1;
	for (size_t i = plan->ncand; i-- > 0 && cached != NULL;) {
		if (cached[i] && eligible_at_start(cfg, &plan->cand[i])) {
			k = (int)i;
			break;
		}
	}
	if (k >= 0 && cfg->kind != CWI_AC_FIX_COMPUTE) {
		j->decided = true;
		set_mode(j, CWI_AC_GET, k, 0,
		    "already cached: reading it at once");
		return;
	}
	switch (cfg->kind) {
	case CWI_AC_DEFAULT:
		for (size_t i = 0; i < plan->ncand; i++)
			if (eligible_at_start(cfg, &plan->cand[i]))
				j->writes |= 1u << i;
		snprintf(j->event, sizeof(j->event),
		    "profile: measuring, and writing %d candidate(s) until "
		    "the decision",
		    __builtin_popcount(j->writes));
		return;
	case CWI_AC_CACHEW:
		snprintf(j->event, sizeof(j->event), "profile: measuring");
		return;
	case CWI_AC_FIX_SOURCE:
		for (size_t i = 0; i < plan->ncand && k < 0; i++)
			if (!plan->cand[i].full &&
			    eligible_at_start(cfg, &plan->cand[i]))
				k = (int)i;
		break;
	case CWI_AC_FIX_FULL:
		if (eligible_at_start(cfg, &plan->cand[plan->ncand - 1]))
			k = (int)plan->ncand - 1;
		break;
	case CWI_AC_FIX_COMPUTE:
		break;
	}
	j->decided = true;
	if (k < 0) {
		set_mode(j, CWI_AC_COMPUTE, -1, 0,
		    cfg->kind == CWI_AC_FIX_COMPUTE
			? "fixed policy"
			: "fixed policy has no eligible candidate");
		return;
	}
	j->writes = 1u << k;
	set_mode(j, CWI_AC_PUT, k, 0, "fixed policy");
}

bool
cwi_ac_job_batches(cwi_ac_job *j, uint64_t batches)
{
	if (j->mode != CWI_AC_PROFILE || j->decided)
		return false;
	j->batches += batches;
	return j->batches >= j->cfg.profile_batches;
}

/* Applies a decision: see cwi_ac_job_decide. */
static void
apply(cwi_ac_job *j, const cwi_ac_inputs *in, const cwi_ac_decision *d)
{
	int k = d->candidate;

	if (k < 0) {
		j->writes = 0;
		j->pending = -1;
		if (j->mode != CWI_AC_COMPUTE)
			set_mode(j, CWI_AC_COMPUTE, -1, d->compute.epoch_s,
			    d->reason);
		return;
	}
	if (in->point[k].cached) {
		j->writes = 0;
		j->pending = -1;
		if (j->mode != CWI_AC_GET || j->target != k)
			set_mode(j, CWI_AC_GET, k, d->cache[k].epoch_s,
			    d->reason);
		return;
	}
	if ((j->writes & (1u << k)) != 0 && j->mode == CWI_AC_PROFILE) {
		/* Written since the pass began: finishing it makes it
		 * complete at the end of this pass. */
		j->writes = 1u << k;
		set_mode(j, CWI_AC_PUT, k, d->cache[k].put_s, d->reason);
		return;
	}
	/* The rest of this pass runs as it is; the next one writes. */
	j->writes = 0;
	j->pending = k;
	cat(j->event, sizeof(j->event), "%sdecided: put at candidate %d next "
					"pass: %s",
	    j->event[0] != '\0' ? "; " : "", k, d->reason);
}

void
cwi_ac_job_decide(cwi_ac_job *j, const cwi_ac_inputs *in)
{
	cwi_ac_decision d;

	j->event[0] = '\0';
	if (j->cfg.kind == CWI_AC_CACHEW)
		cwi_autocache_decide_cachew(&j->cfg, in, &d);
	else if (j->cfg.kind == CWI_AC_DEFAULT)
		cwi_autocache_decide(&j->cfg, in, &d);
	else
		return; /* fixed policies decided at the start */
	j->last = d;
	j->assumed = *in;
	j->decided = true;
	apply(j, in, &d);
}

void
cwi_ac_job_pass_end(cwi_ac_job *j, bool committed)
{
	j->event[0] = '\0';
	switch (j->mode) {
	case CWI_AC_PUT:
		if (committed) {
			double get_s = j->target >= 0 &&
				(size_t)j->target < j->last.n
			    ? j->last.cache[j->target].epoch_s
			    : 0;
			j->writes = 0;
			set_mode(j, CWI_AC_GET, j->target, get_s,
			    "cache complete");
		} else {
			j->writes = 0;
			set_mode(j, CWI_AC_COMPUTE, -1, j->last.compute.epoch_s,
			    "the cache write was abandoned (capacity or I/O; "
			    "see the worker's warning)");
		}
		return;
	case CWI_AC_PROFILE:
	case CWI_AC_GET:
	case CWI_AC_COMPUTE:
		if (j->pending >= 0) {
			int k = j->pending;
			j->pending = -1;
			j->writes = 1u << k;
			set_mode(j, CWI_AC_PUT, k,
			    (size_t)k < j->last.n ? j->last.cache[k].put_s : 0,
			    "the decided cache is written in this pass");
		}
		return;
	}
}

bool
cwi_ac_job_observe(cwi_ac_job *j, const cwi_ac_inputs *in)
{
	char why[160];
	cwi_ac_inputs now;
	cwi_ac_decision d;
	int before;

	j->event[0] = '\0';
	if (j->cfg.kind != CWI_AC_DEFAULT || !j->decided ||
	    j->mode == CWI_AC_PROFILE || j->mode == CWI_AC_PUT ||
	    j->pending >= 0)
		return false;
	if (j->assumed.n == 0) {
		/* Started on an existing cache: the first observation is the
		 * baseline. */
		j->assumed = *in;
		return false;
	}
	if (!cwi_autocache_drifted(&j->cfg, &j->assumed, in, why, sizeof(why)))
		return false;
	now = *in;
	if (j->mode == CWI_AC_GET && j->target >= 0 &&
	    (size_t)j->target < now.n)
		now.point[j->target].cached = true;
	cwi_autocache_decide(&j->cfg, &now, &d);
	before = j->mode == CWI_AC_GET ? j->target : -1;
	snprintf(j->event, sizeof(j->event), "drift (%s): revisited", why);
	j->last = d;
	j->assumed = now;
	apply(j, &now, &d);
	return d.candidate != before;
}
