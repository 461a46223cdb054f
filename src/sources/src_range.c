/*
 * src_range.c - range(start, stop, step, output_type): scalars like
 * Python's range, i64 unless output_type says otherwise (tf.data's
 * range(output_type=)). Split unit u is the element start + u * step.
 */
#include "sources.h"

#include "../exec/exec_split.h"
#include "../exec/exec_state.h"

#include <stdlib.h>
#include <string.h>

typedef struct range_iter {
	cwi_iter base;
	int64_t next, stop, step;
	int64_t start;
	cachew_dtype dtype;    /* output_type */
	bool split;            /* read only the lease's units */
	cwi_unit_cursor lease;
} range_iter;

/* The number of elements of range(start, stop, step), step != 0. The
 * differences are taken in uint64_t: stop - start may not fit int64_t. */
static uint64_t
range_count(int64_t start, int64_t stop, int64_t step)
{
	if (step > 0)
		return start < stop
		    ? ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1
		    : 0;
	return start > stop ? ((uint64_t)start - (uint64_t)stop - 1) /
		(0 - (uint64_t)step) + 1
			    : 0;
}

/* The dtypes output_type may name. */
static bool
range_dtype_ok(cachew_dtype dt)
{
	return dt == CACHEW_I64 || dt == CACHEW_I32 || dt == CACHEW_U8 ||
	    dt == CACHEW_F32 || dt == CACHEW_F64;
}

/* The node's output_type (absent: i64). Valid after range_validate. */
static cachew_dtype
range_dtype(const cwi_node *node)
{
	const cwi_value *v = cwi_node_value(node, "output_type");
	cachew_dtype dt = CACHEW_I64;

	if (v != NULL && v->type == CWI_V_STR &&
	    cachew_dtype_from_name(v->u.s.ptr, &dt) != CACHEW_OK)
		dt = CACHEW_I64;
	return dt;
}

/* Sets t to the scalar v of dtype, which range_validate made sure holds
 * every value of the range exactly (integers) or rounded (floats). */
static void
range_value(cwi_tensor *t, cachew_dtype dtype, int64_t v)
{
	switch (dtype) {
	case CACHEW_I32: {
		int32_t x = (int32_t)v;
		cwi_tensor_init_scalar(t, dtype, &x);
		break;
	}
	case CACHEW_U8: {
		uint8_t x = (uint8_t)v;
		cwi_tensor_init_scalar(t, dtype, &x);
		break;
	}
	case CACHEW_F32: {
		float x = (float)v;
		cwi_tensor_init_scalar(t, dtype, &x);
		break;
	}
	case CACHEW_F64:
		cwi_tensor_init_f64(t, (double)v);
		break;
	default:
		cwi_tensor_init_i64(t, v);
		break;
	}
}

static cachew_err
range_split_units(const cwi_node *node, uint64_t *units)
{
	*units = range_count(cwi_node_int(node, "start"),
	    cwi_node_int(node, "stop"), cwi_node_int(node, "step"));
	return CACHEW_OK;
}

static cachew_err
range_next_split(cwi_iter *it, cwi_chunk *out, size_t max)
{
	range_iter *r = (range_iter *)it;
	size_t got = 0;
	uint64_t u;

	while (got < max && cwi_unit_cursor_next(&r->lease, &u)) {
		cwi_element *e = cwi_element_new(1);
		if (e == NULL)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "range: out of memory");
		/* In range: u < count (up to 2^64 - 1), so the value lies
		 * in [start, stop); u * step and the sum wrap mod 2^64 in
		 * uint64_t (defined), and the true value is their residue. */
		int64_t v = (int64_t)((uint64_t)r->start + u * (uint64_t)r->step);
		if (r->dtype == CACHEW_I64)
			cwi_tensor_init_i64(&e->comp[0], v);
		else
			range_value(&e->comp[0], r->dtype, v);
		cwi_chunk_push(out, e);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static cachew_err
range_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	range_iter *r = (range_iter *)it;
	size_t got = 0;

	if (r->split)
		return range_next_split(it, out, max);
	while (got < max && (r->step > 0 ? r->next < r->stop
					 : r->next > r->stop)) {
		cwi_element *e = cwi_element_new(1);
		if (e == NULL)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "range: out of memory");
		/* i64, the common case, without range_value's switch (W1
		 * pays for every instruction here). */
		if (r->dtype == CACHEW_I64)
			cwi_tensor_init_i64(&e->comp[0], r->next);
		else
			range_value(&e->comp[0], r->dtype, r->next);
		cwi_chunk_push(out, e);
		got++;
		/* Stop instead of overflowing past INT64 limits. */
		if (__builtin_add_overflow(r->next, r->step, &r->next))
			r->next = r->stop;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
range_destroy(cwi_iter *it)
{
	free(it);
}

/* [next value, lease cursor]. */
static cachew_err
range_save(cwi_iter *it, cwi_state_writer *w)
{
	range_iter *r = (range_iter *)it;

	cwi_sw_array(w, 2);
	cwi_sw_int(w, r->next);
	cwi_sw_unit_cursor(w, &r->lease);
	return CACHEW_OK;
}

static cachew_err
range_restore(cwi_iter *it, cwi_state_reader *rd)
{
	range_iter *r = (range_iter *)it;
	int64_t next = 0;
	bool ok;

	if (!cwi_sr_array(rd, "range", 2) ||
	    !cwi_sr_int(rd, "next", &next, INT64_MIN, INT64_MAX))
		return cwi_sr_error(rd);
	/* A value of the walk from start, at most one step past the last
	 * (or stop itself, where an overflow leaves it). */
	if (r->step > 0) {
		uint64_t d = (uint64_t)next - (uint64_t)r->start;
		ok = next >= r->start && d % (uint64_t)r->step == 0 &&
		    d / (uint64_t)r->step <=
			range_count(r->start, r->stop, r->step);
	} else {
		uint64_t d = (uint64_t)r->start - (uint64_t)next;
		uint64_t st = 0 - (uint64_t)r->step;
		ok = next <= r->start && d % st == 0 &&
		    d / st <= range_count(r->start, r->stop, r->step);
	}
	if (!ok && next != r->stop) {
		cwi_sr_fail(rd, CACHEW_ECORRUPT,
		    "next %lld is not a value of range(%lld, %lld, %lld)",
		    (long long)next, (long long)r->start, (long long)r->stop,
		    (long long)r->step);
		return cwi_sr_error(rd);
	}
	r->next = next;
	return cwi_sr_unit_cursor(rd, &r->lease) ? CACHEW_OK
						 : cwi_sr_error(rd);
}

static const cwi_iter_ops range_iter_ops = {
    .next = range_next,
    .destroy = range_destroy,
    .save = range_save,
    .restore = range_restore,
};

static cachew_err
range_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	range_iter *r = calloc(1, sizeof(*r));
	const cwi_unit_range *ranges;
	size_t nranges;
	bool split;
	cachew_err rv;

	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->base.ops = &range_iter_ops;
	r->start = r->next = cwi_node_int(node, "start");
	r->stop = cwi_node_int(node, "stop");
	r->step = cwi_node_int(node, "step");
	r->dtype = range_dtype(node);
	rv = cwi_split_source_ranges(args, node,
	    range_count(r->start, r->stop, r->step), &split, &ranges, &nranges);
	if (rv != CACHEW_OK) {
		free(r);
		return rv;
	}
	r->split = split;
	cwi_unit_cursor_init(&r->lease, ranges, nranges);
	*out = &r->base;
	return CACHEW_OK;
}

static cachew_err
range_validate(cwi_node *node)
{
	const cwi_value *v = cwi_node_value(node, "output_type");
	int64_t start = cwi_node_int(node, "start");
	int64_t step = cwi_node_int(node, "step");
	int64_t lo, hi, min, max, last;
	uint64_t n;
	cachew_dtype dt;

	if (step == 0)
		return cwi_fail(CACHEW_EINVAL, "range: step must not be 0");
	if (v == NULL)
		return CACHEW_OK;
	if (v->type != CWI_V_STR ||
	    cachew_dtype_from_name(v->u.s.ptr, &dt) != CACHEW_OK ||
	    !range_dtype_ok(dt))
		return cwi_fail(CACHEW_EINVAL, "range: output_type must be one "
		    "of i64, i32, u8, f32, f64");
	/* One spelling in the canonical form: float32 is f32. */
	if (strcmp(v->u.s.ptr, cachew_dtype_name(dt)) != 0 &&
	    cachew_params_set_str(&node->params, "output_type",
		cachew_dtype_name(dt)) != CACHEW_OK)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	n = range_count(start, cwi_node_int(node, "stop"), step);
	if (n == 0 || (dt != CACHEW_I32 && dt != CACHEW_U8))
		return CACHEW_OK;
	/* The last value, in uint64_t as range_next_split computes it. */
	last = (int64_t)((uint64_t)start + (n - 1) * (uint64_t)step);
	lo = start < last ? start : last;
	hi = start < last ? last : start;
	min = dt == CACHEW_U8 ? 0 : INT32_MIN;
	max = dt == CACHEW_U8 ? UINT8_MAX : INT32_MAX;
	if (lo < min || hi > max)
		return cwi_fail(CACHEW_ERANGE, "range: values from %lld to %lld "
		    "do not fit output_type %s", (long long)lo, (long long)hi,
		    cachew_dtype_name(dt));
	return CACHEW_OK;
}

/* tf.data: range(42).cardinality() == 42, range(5, 1) is empty. */
static cachew_err
range_infer(cwi_node *node)
{
	uint64_t n = range_count(cwi_node_int(node, "start"),
	    cwi_node_int(node, "stop"), cwi_node_int(node, "step"));

	node->card = n <= INT64_MAX ? (int64_t)n : CACHEW_CARDINALITY_UNKNOWN;
	return cwi_spec_scalar(&node->spec, range_dtype(node));
}

static const cwi_param_spec range_params[] = {
    {.name = "start", .type = CWI_P_INT, .def_int = 0,
	.help = "first value"},
    {.name = "stop", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED,
	.help = "end value (exclusive)"},
    {.name = "step", .type = CWI_P_INT, .def_int = 1,
	.help = "increment, not 0"},
    {.name = "output_type", .type = CWI_P_STR, .flags = CWI_PF_OPTIONAL,
	.help = "dtype of the values: i64 (when absent), i32, u8, f32 or "
		"f64; integers must fit it"},
};

static const char *const range_pos1[] = {"stop"};
static const char *const range_pos2[] = {"start", "stop"};
static const char *const range_pos3[] = {"start", "stop", "step"};

const cwi_dataset_op cwi_op_range = {
    .name = "range",
    .doc = "scalars start, start+step, ... up to stop (exclusive), i64 or "
	   "output_type",
    .params = range_params,
    .nparams = sizeof(range_params) / sizeof(range_params[0]),
    .positional = {NULL, range_pos1, range_pos2, range_pos3},
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_SPLITTABLE,
    .validate = range_validate,
    .iter_create = range_create,
    .split_units = range_split_units,
    .saves = "the next value (and a lease's unit cursor)",
    .infer = range_infer,
};

/* ---- counter ------------------------------------------------------------------ */

/* tf.data's Counter: start, start + step, ... without end. The values wrap
 * modulo 2^64 as int64 arithmetic in TensorFlow does; step 0 repeats
 * start. Not splittable: an endless input has no units to count, so the
 * service runs it whole (as repeat()). */
typedef struct counter_iter {
	cwi_iter base;
	int64_t next, step;
} counter_iter;

static cachew_err
counter_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	counter_iter *c = (counter_iter *)it;

	for (size_t got = 0; got < max; got++) {
		cwi_element *e = cwi_element_new(1);
		if (e == NULL)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "counter: out of memory");
		cwi_tensor_init_i64(&e->comp[0], c->next);
		cwi_chunk_push(out, e);
		c->next = (int64_t)((uint64_t)c->next + (uint64_t)c->step);
	}
	return CACHEW_OK;
}

/* [next value]. */
static cachew_err
counter_save(cwi_iter *it, cwi_state_writer *w)
{
	cwi_sw_array(w, 1);
	cwi_sw_int(w, ((counter_iter *)it)->next);
	return CACHEW_OK;
}

static cachew_err
counter_restore(cwi_iter *it, cwi_state_reader *rd)
{
	counter_iter *c = (counter_iter *)it;

	if (!cwi_sr_array(rd, "counter", 1) ||
	    !cwi_sr_int(rd, "next", &c->next, INT64_MIN, INT64_MAX))
		return cwi_sr_error(rd);
	return CACHEW_OK;
}

static const cwi_iter_ops counter_iter_ops = {
    .next = counter_next,
    .destroy = range_destroy,
    .save = counter_save,
    .restore = counter_restore,
};

static cachew_err
counter_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	counter_iter *c = calloc(1, sizeof(*c));

	(void)args;
	if (c == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	c->base.ops = &counter_iter_ops;
	c->next = cwi_node_int(node, "start");
	c->step = cwi_node_int(node, "step");
	*out = &c->base;
	return CACHEW_OK;
}

static cachew_err
counter_infer(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_INFINITE;
	return cwi_spec_scalar(&node->spec, CACHEW_I64);
}

static const cwi_param_spec counter_params[] = {
    {.name = "start", .type = CWI_P_INT, .def_int = 0,
	.help = "first value"},
    {.name = "step", .type = CWI_P_INT, .def_int = 1,
	.help = "increment (0 repeats start; values wrap modulo 2^64)"},
};

const cwi_dataset_op cwi_op_counter = {
    .name = "counter",
    .doc = "i64 scalars start, start+step, ... without end (tf.data's "
	   "Counter)",
    .params = counter_params,
    .nparams = sizeof(counter_params) / sizeof(counter_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE,
    .iter_create = counter_create,
    .saves = "the next value",
    .infer = counter_infer,
};

/* ---- random ------------------------------------------------------------------- */

/* tf.data's Dataset.random: endless i64 values, uniform over [0, 2^63).
 * Value i is a pure function of (key, i) -- splitmix64's i-th output --
 * so a saved position is the index alone. The key: seed, or the pipeline
 * seed for -1, mixed with the node's structure (two random sources of one
 * pipeline differ) and, with rerandomize_each_iteration, the epoch (each
 * repetition under repeat() too), as shuffle derives its own. Not
 * splittable: the service runs it whole. */
typedef struct random_iter {
	cwi_iter base;
	uint64_t key;
	uint64_t index;
} random_iter;

static cachew_err
random_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	random_iter *r = (random_iter *)it;

	for (size_t got = 0; got < max; got++) {
		cwi_element *e = cwi_element_new(1);
		uint64_t x;
		if (e == NULL)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "random: out of memory");
		r->index++;
		x = cwi_mix64(r->key + r->index * 0x9e3779b97f4a7c15ULL);
		cwi_tensor_init_i64(&e->comp[0], (int64_t)(x >> 1));
		cwi_chunk_push(out, e);
	}
	return CACHEW_OK;
}

/* [values yielded]. */
static cachew_err
random_save(cwi_iter *it, cwi_state_writer *w)
{
	cwi_sw_array(w, 1);
	cwi_sw_uint(w, ((random_iter *)it)->index);
	return CACHEW_OK;
}

static cachew_err
random_restore(cwi_iter *it, cwi_state_reader *rd)
{
	random_iter *r = (random_iter *)it;

	if (!cwi_sr_array(rd, "random", 1) ||
	    !cwi_sr_uint(rd, "index", &r->index, UINT64_MAX))
		return cwi_sr_error(rd);
	return CACHEW_OK;
}

static const cwi_iter_ops random_iter_ops = {
    .next = random_next,
    .destroy = range_destroy,
    .save = random_save,
    .restore = random_restore,
};

static cachew_err
random_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	random_iter *r = calloc(1, sizeof(*r));
	int64_t seed = cwi_node_int(node, "seed");
	uint64_t key;

	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->base.ops = &random_iter_ops;
	key = seed == -1 ? args->pl->seed : (uint64_t)seed;
	key = cwi_seed_derive(key, node->seed_fp.hi ^ node->seed_fp.lo);
	if (cwi_node_bool(node, "rerandomize_each_iteration"))
		key = cwi_seed_derive(key, args->epoch);
	r->key = key;
	*out = &r->base;
	return CACHEW_OK;
}

static cachew_err
random_infer(cwi_node *node)
{
	node->card = CACHEW_CARDINALITY_INFINITE;
	return cwi_spec_scalar(&node->spec, CACHEW_I64);
}

static const cwi_param_spec random_params[] = {
    {.name = "seed", .type = CWI_P_INT, .def_int = -1, .min = -1,
	.max = INT64_MAX, .help = "seed; -1 = derived from the pipeline seed"},
    {.name = "rerandomize_each_iteration", .type = CWI_P_BOOL, .def_int = 0,
	.help = "new values for each epoch (each repetition under repeat)"},
};

const cwi_dataset_op cwi_op_random = {
    .name = "random",
    .doc = "endless i64 pseudorandom values, uniform over [0, 2^63) "
	   "(tf.data's Dataset.random)",
    .params = random_params,
    .nparams = sizeof(random_params) / sizeof(random_params[0]),
    .min_inputs = 0,
    .max_inputs = 0,
    .flags = CWI_OPF_SOURCE | CWI_OPF_RANDOM,
    .iter_create = random_create,
    .saves = "the count of values yielded",
    .infer = random_infer,
    .note = "The values are splitmix64's, not TensorFlow's Philox stream: "
	"the same seed gives the same values in every cachew run, not those "
	"of tf.data. Without rerandomize_each_iteration every epoch (and "
	"every repetition under repeat) yields the same values, as in "
	"tf.data.",
};

