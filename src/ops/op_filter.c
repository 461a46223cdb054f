/*
 * op_filter.c - filter(fn) keeps the elements a filter function accepts;
 * flat_map(fn) replaces every element by the sequence a flat_map function
 * opens for it; take_while(fn) yields elements until the first one a
 * filter function rejects (tf.data's take_while). They count element
 * indices at their input, so a random function sees the same index (and
 * seed) in every run.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdlib.h>

/* Releases out->v[from..to). */
static void
release_range(cwi_chunk *out, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		cwi_element_release(out->v[i]);
}

/* ---- filter ------------------------------------------------------------- */

/* filter's and take_while's iterator. */
typedef struct filter_iter {
	cwi_iter base;
	cwi_iter *input;
	cachew_op_ctx ctx;
	uint64_t index; /* elements seen (take_while: accepted) at the input */
	bool done;      /* take_while: an element was rejected, the end */
} filter_iter;

static cachew_err
filter_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	filter_iter *f = (filter_iter *)it;
	size_t n0 = out->n, w;
	cachew_err rv;

	/* Pull into out and compact in place until something is kept. */
	do {
		/* A filter that rejects an endless input never returns:
		 * let the iterator's destruction stop it. */
		if (cwi_pipeline_cancelled(it->pl))
			return CACHEW_ECANCELED;
		rv = cwi_iter_next(f->input, out, max);
		if (rv != CACHEW_OK)
			return rv;
		w = n0;
		for (size_t i = n0; i < out->n; i++) {
			cwi_element *e = out->v[i];
			bool keep = false;
			cwi_op_ctx_at(&f->ctx, f->index++);
			rv = cwi_apply_filter(&f->ctx, it, true, e, &keep);
			if (rv != CACHEW_OK) {
				/* [n0, w) kept: delivered before the error
				 * (exec.h); [w, i) gone, [i, n) unseen. */
				release_range(out, i, out->n);
				out->n = w;
				return rv;
			}
			if (keep)
				out->v[w++] = e;
			else
				cwi_element_release(e);
		}
		out->n = w;
	} while (out->n == n0);
	return CACHEW_OK;
}

static void
filter_destroy(cwi_iter *it)
{
	filter_iter *f = (filter_iter *)it;
	cwi_iter_destroy(f->input);
	free(f);
}

/* [index, input]: the index seeds the function's random stream. */
static cachew_err
filter_save(cwi_iter *it, cwi_state_writer *w)
{
	filter_iter *f = (filter_iter *)it;

	cwi_sw_array(w, 2);
	cwi_sw_uint(w, f->index);
	return cwi_iter_save(f->input, w);
}

static cachew_err
filter_restore(cwi_iter *it, cwi_state_reader *r)
{
	filter_iter *f = (filter_iter *)it;

	if (!cwi_sr_array(r, "filter", 2) ||
	    !cwi_sr_uint(r, "index", &f->index, UINT64_MAX))
		return cwi_sr_error(r);
	return cwi_iter_restore(f->input, r);
}

static const cwi_iter_ops filter_iter_ops = {
    .next = filter_next,
    .destroy = filter_destroy,
    .save = filter_save,
    .restore = filter_restore,
};

static cachew_err
filter_iter_create(cwi_iter **out, const cwi_node *node,
    const cwi_iter_args *args, const cwi_iter_ops *ops)
{
	filter_iter *f = calloc(1, sizeof(*f));
	cachew_err rv;

	if (f == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	f->base.ops = ops;
	cwi_op_ctx_init(&f->ctx, node, args->pl, args->epoch);
	rv = cwi_iter_create(&f->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(f);
		return rv;
	}
	*out = &f->base;
	return CACHEW_OK;
}

static cachew_err
filter_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return filter_iter_create(out, node, args, &filter_iter_ops);
}

static const cwi_param_spec filter_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the filter function"},
};

const cwi_dataset_op cwi_op_filter = {
    .name = "filter",
    .doc = "keeps the elements a filter function accepts",
    .params = filter_params,
    .nparams = sizeof(filter_params) / sizeof(filter_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_FILTER,
    .iter_create = filter_create,
    .saves = "the input index (the function's random stream), and the input",
    .infer = cwi_infer_filter,
};

/* ---- take_while ---------------------------------------------------------- */


/* Tests the pulled elements in order; the first rejected one ends the
 * stream, and it and those after it are dropped unread (as tf.data, which
 * reads no further). */
static cachew_err
take_while_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	filter_iter *t = (filter_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	if (t->done)
		return CACHEW_EOF;
	rv = cwi_iter_next(t->input, out, max);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = n0; i < out->n; i++) {
		bool keep = false;
		cwi_op_ctx_at(&t->ctx, t->index);
		rv = cwi_apply_filter(&t->ctx, it, false, out->v[i],
		    &keep);
		if (rv != CACHEW_OK || !keep) {
			release_range(out, i, out->n);
			out->n = i;
			if (rv != CACHEW_OK)
				return rv;
			t->done = true;
			return out->n > n0 ? CACHEW_OK : CACHEW_EOF;
		}
		t->index++;
	}
	return CACHEW_OK;
}

/* [index, done, input]. */
static cachew_err
take_while_save(cwi_iter *it, cwi_state_writer *w)
{
	filter_iter *t = (filter_iter *)it;

	cwi_sw_array(w, 3);
	cwi_sw_uint(w, t->index);
	cwi_sw_uint(w, t->done);
	return cwi_iter_save(t->input, w);
}

static cachew_err
take_while_restore(cwi_iter *it, cwi_state_reader *r)
{
	filter_iter *t = (filter_iter *)it;
	uint64_t done = 0;

	if (!cwi_sr_array(r, "take_while", 3) ||
	    !cwi_sr_uint(r, "index", &t->index, UINT64_MAX) ||
	    !cwi_sr_uint(r, "done", &done, 1))
		return cwi_sr_error(r);
	t->done = done != 0;
	return cwi_iter_restore(t->input, r);
}

static const cwi_iter_ops take_while_iter_ops = {
    .next = take_while_next,
    .destroy = filter_destroy,
    .save = take_while_save,
    .restore = take_while_restore,
};

static cachew_err
take_while_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return filter_iter_create(out, node, args, &take_while_iter_ops);
}

static const cwi_param_spec take_while_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the predicate: a filter function"},
};

const cwi_dataset_op cwi_op_take_while = {
    .name = "take_while",
    .doc = "yields elements while a filter function accepts them; the first "
	   "it rejects ends the stream",
    .params = take_while_params,
    .nparams = sizeof(take_while_params) / sizeof(take_while_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_FILTER,
    .iter_create = take_while_create,
    .saves = "the count of elements accepted, whether one was rejected, "
	"and the input",
    .infer = cwi_infer_filter,
};

/* ---- flat_map ----------------------------------------------------------- */

/* Input elements pulled at a time: each opens a whole sequence, so a few
 * are enough and holding many would only hold memory. */
#define FLAT_MAP_PULL 16

typedef struct flat_map_iter {
	cwi_iter base;
	cwi_iter *input;
	cwi_chunk in;   /* pulled input elements: in.v[pos..n) not opened */
	size_t pos;
	cwi_seq seq;    /* the open sequence, if seq.open */
	uint64_t index; /* elements taken from the input */
	bool input_done;
} flat_map_iter;

/* Opens the sequence of the next input element; CACHEW_EOF at the end. */
static cachew_err
open_next(flat_map_iter *f, size_t want)
{
	cwi_element *e;
	cachew_err rv;

	if (f->pos == f->in.n) {
		f->in.n = 0;
		f->pos = 0;
		if (f->input_done)
			return CACHEW_EOF;
		rv = cwi_iter_next(f->input, &f->in,
		    want < FLAT_MAP_PULL ? want : FLAT_MAP_PULL);
		if (rv == CACHEW_EOF)
			f->input_done = true;
		if (rv != CACHEW_OK)
			return rv;
	}
	e = f->in.v[f->pos++];
	rv = cwi_seq_open(&f->seq, f->base.node, f->base.pl, f->base.epoch, e,
	    f->index++);
	/* The sequence keeps what it needs of e. */
	cwi_element_release(e);
	return rv;
}

static cachew_err
flat_map_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	flat_map_iter *f = (flat_map_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	while (out->n - n0 < max) {
		if (!f->seq.open) {
			if (cwi_pipeline_cancelled(it->pl)) {
				rv = CACHEW_ECANCELED;
				goto fail;
			}
			rv = open_next(f, max - (out->n - n0));
			if (rv == CACHEW_EOF)
				break;
			if (rv != CACHEW_OK)
				goto fail;
			continue;
		}
		rv = cwi_seq_next(&f->seq, it->node, it->pl, out,
		    max - (out->n - n0));
		if (rv == CACHEW_EOF)
			cwi_seq_close(&f->seq);
		else if (rv != CACHEW_OK)
			goto fail;
	}
	return out->n > n0 ? CACHEW_OK : CACHEW_EOF;
fail:
	/* What was produced before the failure is delivered first. */
	return rv;
}

static void
flat_map_destroy(cwi_iter *it)
{
	flat_map_iter *f = (flat_map_iter *)it;

	cwi_seq_close(&f->seq);
	cwi_iter_destroy(f->input);
	for (size_t i = f->pos; i < f->in.n; i++)
		cwi_element_release(f->in.v[i]);
	free(f->in.v);
	free(f);
}

/* [index, input done, pulled not yet opened, open sequence, input]. */
static cachew_err
flat_map_save(cwi_iter *it, cwi_state_writer *w)
{
	flat_map_iter *f = (flat_map_iter *)it;
	cachew_err rv;

	cwi_sw_array(w, 5);
	cwi_sw_uint(w, f->index);
	cwi_sw_bool(w, f->input_done);
	rv = cwi_sw_elements(w, f->in.v + f->pos, f->in.n - f->pos);
	if (rv == CACHEW_OK)
		rv = cwi_seq_save(&f->seq, w);
	if (rv == CACHEW_OK)
		rv = cwi_iter_save(f->input, w);
	return rv;
}

static cachew_err
flat_map_restore(cwi_iter *it, cwi_state_reader *r)
{
	flat_map_iter *f = (flat_map_iter *)it;

	if (!cwi_sr_array(r, "flat_map", 5) ||
	    !cwi_sr_uint(r, "index", &f->index, UINT64_MAX) ||
	    !cwi_sr_bool(r, "input done", &f->input_done) ||
	    !cwi_sr_elements(r, "pulled", &f->in))
		return cwi_sr_error(r);
	f->pos = 0;
	if (cwi_seq_restore(&f->seq, it->node, it->pl, it->epoch, r) !=
	    CACHEW_OK)
		return cwi_sr_error(r);
	return cwi_iter_restore(f->input, r);
}

static const cwi_iter_ops flat_map_iter_ops = {
    .next = flat_map_next,
    .destroy = flat_map_destroy,
    .save = flat_map_save,
    .restore = flat_map_restore,
};

static cachew_err
flat_map_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	flat_map_iter *f = calloc(1, sizeof(*f));
	cachew_err rv;

	if (f == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	f->base.ops = &flat_map_iter_ops;
	rv = cwi_iter_create(&f->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(f);
		return rv;
	}
	*out = &f->base;
	return CACHEW_OK;
}

static const cwi_param_spec flat_map_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the flat_map function"},
};

const cwi_dataset_op cwi_op_flat_map = {
    .name = "flat_map",
    .doc = "replaces every element by the sequence a flat_map function "
	   "yields for it",
    .params = flat_map_params,
    .nparams = sizeof(flat_map_params) / sizeof(flat_map_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_FLAT,
    .iter_create = flat_map_create,
    .saves = "the open sequence (the element that opened it, the elements "
	"it yielded and, for a file function, the offset of the next: a "
	"restore reopens it and seeks there, or reads past them), elements "
	"pulled ahead, and the input",
    .infer = cwi_infer_flat,
};
