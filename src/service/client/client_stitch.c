/*
 * client_stitch.c - stitching the tails of leases (client_stitch.h).
 */
#include "client_stitch.h"
#include "../../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

struct cwi_stitch {
	const cwi_split_plan *plan;
	cachew_options *opts;
	uint64_t epoch;
	cwi_chunk held[CWI_SPLIT_MAX_GROUPS]; /* tails per operator */
	cwi_node *graph[CWI_SPLIT_MAX_GROUPS]; /* built on first use */
	cwi_stream_source src;
	cwi_stitch_counts *counts;
	size_t gpos[CWI_SPLIT_MAX_GROUPS]; /* groups[k]'s position */
	/* The run in progress: its input, taken from held[k] */
	cwi_element **feed;
	size_t nfeed, pos;
};

/* ---- the placeholder's stream: the elements of the run ------------------ */

static cachew_err
feed_open(void *ctx, uint64_t epoch, void **stream, char *err, size_t errlen)
{
	(void)epoch;
	(void)err;
	(void)errlen;
	*stream = ctx;
	return CACHEW_OK;
}

static cachew_err
feed_next(void *stream, cwi_chunk *out, size_t max, char *err, size_t errlen)
{
	cwi_stitch *st = stream;
	size_t n = 0;

	(void)err;
	(void)errlen;
	while (n < max && st->pos < st->nfeed) {
		cwi_chunk_push(out, st->feed[st->pos]);
		st->feed[st->pos++] = NULL;
		n++;
	}
	return n > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
feed_close(void *stream)
{
	(void)stream;
}

static const cwi_stream_ops feed_ops = {
    .open = feed_open,
    .next = feed_next,
    .close = feed_close,
};

/* The position of node in the worker part, from its source (0). */
static size_t
node_pos(const cwi_split_plan *p, const cwi_node *node)
{
	size_t len = 0, above = 0;

	for (const cwi_node *x = p->worker; x != NULL;
	     x = x->ninputs > 0 ? x->inputs[0] : NULL) {
		if (x == node)
			above = len;
		len++;
	}
	return len - 1 - above;
}

cachew_err
cwi_stitch_create(cwi_stitch **out, const cwi_split_plan *p,
    const cwi_opts *opts, uint64_t seed, uint64_t epoch,
    cwi_stitch_counts *counts)
{
	cwi_stitch *st = calloc(1, sizeof(*st));
	cwi_opts v = *opts;

	if (st == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	/* The job's seed and epoch: a stitched batch's random functions
	 * draw as the worker part's would, from the same pipeline seed. */
	v.seed = (int64_t)(seed & INT64_MAX);
	v.epoch = (int64_t)(epoch & INT64_MAX);
	v.service[0] = '\0';
	st->opts = cwi_options_from_values(&v);
	if (st->opts == NULL) {
		free(st);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	st->plan = p;
	st->epoch = epoch;
	st->counts = counts;
	for (size_t k = 0; k < p->ngroups; k++)
		st->gpos[k] = node_pos(p, p->groups[k]);
	st->src.ops = &feed_ops;
	st->src.ctx = st;
	*out = st;
	return CACHEW_OK;
}

cachew_err
cwi_stitch_add(cwi_stitch *st, uint32_t k, cwi_element *e)
{
	if (k >= st->plan->ngroups) {
		cwi_element_release(e);
		return cwi_fail(CACHEW_EPROTO, "a tail of grouping operator "
		    "%u, but the pipeline has %zu", k + 1,
		    st->plan->ngroups);
	}
	if (cwi_chunk_reserve(&st->held[k], 1) != CACHEW_OK) {
		cwi_element_release(e);
		return CACHEW_ENOMEM;
	}
	cwi_chunk_push(&st->held[k], e);
	return CACHEW_OK;
}

cachew_err
cwi_stitch_save(const cwi_stitch *st, cwi_state_writer *w)
{
	cachew_err rv = CACHEW_OK;

	cwi_sw_array(w, st->plan->ngroups);
	for (size_t k = 0; k < st->plan->ngroups && rv == CACHEW_OK; k++)
		rv = cwi_sw_elements(w, st->held[k].v, st->held[k].n);
	return rv;
}

size_t
cwi_stitch_held(const cwi_stitch *st)
{
	size_t n = 0;

	for (size_t k = 0; k < st->plan->ngroups; k++)
		n += st->held[k].n;
	return n;
}

/* Adds a run's rows (after its placeholder's) to the worker part's. */
static void
count_rows(cwi_stitch *st, size_t k, cachew_iterator *it)
{
	cachew_op_stats rows[64];
	size_t n = 0;

	if (st->counts == NULL ||
	    cachew_iterator_stats(it, rows, 64, &n) != CACHEW_OK)
		return;
	for (size_t j = 1; j < n && j < 64; j++) {
		size_t at = st->gpos[k] + j - 1;
		if (at >= 64)
			break;
		atomic_fetch_add(&st->counts->elements[at], rows[j].elements);
		atomic_fetch_add(&st->counts->bytes[at], rows[j].bytes);
	}
}

/* Runs operator k's segment over the first m elements held for it; what it
 * yields goes to the next operator's tails, or (the last) to out. */
static cachew_err
run_segment(cwi_stitch *st, size_t k, size_t m, cwi_chunk *out, char *err,
    size_t errlen)
{
	cwi_chunk *h = &st->held[k];
	cwi_chunk *dst = k + 1 < st->plan->ngroups ? &st->held[k + 1] : out;
	cachew_iterator *it = NULL;
	cachew_element *e;
	cachew_err rv;

	if (st->graph[k] == NULL) {
		rv = cwi_split_stitch_graph(st->plan, k, &st->src,
		    &st->graph[k]);
		if (rv != CACHEW_OK) {
			snprintf(err, errlen, "stitching batches: %s",
			    cwi_errmsg_get());
			return rv;
		}
	}
	st->feed = h->v;
	st->nfeed = m;
	st->pos = 0;
	rv = cwi_exec_iterator_create(&it, st->graph[k], st->opts);
	while (rv == CACHEW_OK && (rv = cachew_iterator_next(it, &e)) ==
	    CACHEW_OK) {
		rv = cwi_chunk_reserve(dst, 1);
		if (rv != CACHEW_OK) {
			cwi_element_release(e);
			break;
		}
		cwi_chunk_push(dst, e);
	}
	if (rv != CACHEW_EOF)
		snprintf(err, errlen, "%s", it != NULL
		    ? cachew_iterator_errmsg(it) : cwi_errmsg_get());
	if (it != NULL)
		count_rows(st, k, it);
	cachew_iterator_destroy(it);
	/* What the run did not take (it failed) is released; the rest of
	 * the held tails move to the front. */
	for (size_t i = st->pos; i < m; i++)
		if (h->v[i] != NULL)
			cwi_element_release(h->v[i]);
	memmove(h->v, h->v + m, (h->n - m) * sizeof(*h->v));
	h->n -= m;
	st->feed = NULL;
	st->nfeed = st->pos = 0;
	return rv == CACHEW_EOF ? CACHEW_OK : rv;
}

cachew_err
cwi_stitch_drain(cwi_stitch *st, bool final, cwi_chunk *out, char *err,
    size_t errlen)
{
	for (size_t k = 0; k < st->plan->ngroups; k++) {
		uint64_t n = cwi_split_group_n(st->plan, k);
		size_t m = final ? st->held[k].n
				 : st->held[k].n - st->held[k].n % n;
		cachew_err rv;

		if (m == 0)
			continue;
		rv = run_segment(st, k, m, out, err, errlen);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

void
cwi_stitch_destroy(cwi_stitch *st)
{
	if (st == NULL)
		return;
	for (size_t k = 0; k < CWI_SPLIT_MAX_GROUPS; k++) {
		cwi_chunk_free(&st->held[k]);
		cachew_dataset_release(st->graph[k]);
	}
	cachew_options_destroy(st->opts);
	free(st);
}
