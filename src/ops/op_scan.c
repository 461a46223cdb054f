/*
 * op_scan.c - scan(reducer, initial) and reduce(reducer, initial): tf.data's
 * scan and reduce over built-in reducers named sum, prod, min, max and
 * count.
 *
 * Why named reducers and not a user function: a function here
 * (cachew_op_def) maps one element to one element with a state that init
 * builds and every thread then shares read-only; it has no argument for a
 * running state, and nothing could save that state in a checkpoint. A
 * reducer the library knows carries its state in the iterator, saves it
 * with cachew_iterator_save and runs the same in-process and in a
 * service's client part.
 *
 * The state has the structure of the elements: per component the same
 * dtype and shape, combined value by value (sum, prod, min, max); count
 * ignores the values and counts elements (an i64 scalar). Integers wrap
 * as tf.data's do; u8, i32, i64, f32 and f64 are taken. The state starts
 * as `initial` in every value (sum 0, prod 1, count 0 when absent), or,
 * for min and max without one, as the first element. scan yields the
 * state after each element (tf.data's scan whose function returns the new
 * state as its output); reduce yields only the last state: one element.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum reducer {
	R_SUM,
	R_PROD,
	R_MIN,
	R_MAX,
	R_COUNT
} reducer;

static const char *const reducer_names[] = {"sum", "prod", "min", "max",
    "count"};
#define NREDUCERS (sizeof(reducer_names) / sizeof(reducer_names[0]))

typedef struct scan_iter {
	cwi_iter base;
	cwi_iter *input;
	reducer r;
	bool terminal;     /* reduce: yields the last state only */
	bool has_initial;  /* `initial` given (or sum/prod/count's default) */
	bool initial_float;
	int64_t initial_i;
	double initial_f;
	cwi_element *state; /* the last state; NULL before the first element */
	uint64_t index;    /* elements read at the input */
	bool done;         /* reduce: its element was yielded */
} scan_iter;

static int
reducer_find(const char *name)
{
	for (size_t i = 0; i < NREDUCERS; i++)
		if (strcmp(name, reducer_names[i]) == 0)
			return (int)i;
	return -1;
}

static bool
numeric(uint8_t dtype)
{
	return dtype == CACHEW_U8 || dtype == CACHEW_I32 ||
	    dtype == CACHEW_I64 || dtype == CACHEW_F32 || dtype == CACHEW_F64;
}

static bool
is_float(uint8_t dtype)
{
	return dtype == CACHEW_F32 || dtype == CACHEW_F64;
}

/* ---- value kernels ------------------------------------------------------- */

static int64_t
load_i(const uint8_t *p, uint8_t dtype, size_t j)
{
	int32_t i32;
	int64_t i64;

	switch (dtype) {
	case CACHEW_U8:
		return p[j];
	case CACHEW_I32:
		memcpy(&i32, p + 4 * j, sizeof(i32));
		return i32;
	default:
		memcpy(&i64, p + 8 * j, sizeof(i64));
		return i64;
	}
}

static void
store_i(uint8_t *p, uint8_t dtype, size_t j, int64_t v)
{
	uint32_t u32 = (uint32_t)(uint64_t)v;

	switch (dtype) {
	case CACHEW_U8:
		p[j] = (uint8_t)(uint64_t)v;
		break;
	case CACHEW_I32:
		memcpy(p + 4 * j, &u32, sizeof(u32));
		break;
	default:
		memcpy(p + 8 * j, &v, sizeof(v));
		break;
	}
}

static double
load_f(const uint8_t *p, uint8_t dtype, size_t j)
{
	float f32;
	double f64;

	if (dtype == CACHEW_F32) {
		memcpy(&f32, p + 4 * j, sizeof(f32));
		return f32;
	}
	memcpy(&f64, p + 8 * j, sizeof(f64));
	return f64;
}

static void
store_f(uint8_t *p, uint8_t dtype, size_t j, double v)
{
	float f32 = (float)v;

	if (dtype == CACHEW_F32)
		memcpy(p + 4 * j, &f32, sizeof(f32));
	else
		memcpy(p + 8 * j, &v, sizeof(v));
}

/* Integers wrap (two's complement, as tf.data's do). */
static int64_t
combine_i(reducer r, int64_t a, int64_t b)
{
	switch (r) {
	case R_SUM:
		return (int64_t)((uint64_t)a + (uint64_t)b);
	case R_PROD:
		return (int64_t)((uint64_t)a * (uint64_t)b);
	case R_MIN:
		return a < b ? a : b;
	default:
		return a > b ? a : b;
	}
}

/* min and max propagate a NaN, as tf.math.minimum and maximum do. */
static double
combine_f(reducer r, double a, double b)
{
	switch (r) {
	case R_SUM:
		return a + b;
	case R_PROD:
		return a * b;
	case R_MIN:
		return isnan(a) || isnan(b) ? NAN : (a < b ? a : b);
	default:
		return isnan(a) || isnan(b) ? NAN : (a > b ? a : b);
	}
}

/* out = prev (op) in over n values; prev NULL: the initial value. */
static void
combine_values(const scan_iter *s, uint8_t dtype, size_t n,
    const uint8_t *prev, const uint8_t *in, uint8_t *out)
{
	for (size_t j = 0; j < n; j++) {
		if (is_float(dtype)) {
			double a = prev != NULL ? load_f(prev, dtype, j)
			    : s->initial_float ? s->initial_f
					       : (double)s->initial_i;
			store_f(out, dtype, j,
			    combine_f(s->r, a, load_f(in, dtype, j)));
		} else {
			int64_t a = prev != NULL ? load_i(prev, dtype, j)
						 : s->initial_i;
			store_i(out, dtype, j,
			    combine_i(s->r, a, load_i(in, dtype, j)));
		}
	}
}

/* ---- the state ----------------------------------------------------------- */

static const char *
op_name(const scan_iter *s)
{
	return s->terminal ? "reduce" : "scan";
}

/* Refuses an element the reducer cannot take or whose structure differs
 * from the state's. */
static cachew_err
check_element(scan_iter *s, const cwi_element *e)
{
	char got[64], want[64];

	for (uint32_t c = 0; c < e->n; c++) {
		const cwi_tensor *t = &e->comp[c];
		if (!numeric(t->dtype))
			return cwi_pipeline_fail(s->base.pl, CACHEW_ETYPE,
			    "%s(%s): component %u of element %llu is %s; the "
			    "reducer takes u8, i32, i64, f32 or f64", op_name(s),
			    reducer_names[s->r], c, (unsigned long long)s->index,
			    cwi_tensor_spec_str(t, got, sizeof(got)));
		if (!s->initial_float || is_float(t->dtype))
			continue;
		return cwi_pipeline_fail(s->base.pl, CACHEW_ETYPE,
		    "%s(%s): initial=%g is not an integer but component %u "
		    "is %s", op_name(s), reducer_names[s->r], s->initial_f, c,
		    cachew_dtype_name((cachew_dtype)t->dtype));
	}
	if (s->state == NULL)
		return CACHEW_OK;
	if (e->n != s->state->n)
		return cwi_pipeline_fail(s->base.pl, CACHEW_ETYPE,
		    "%s(%s): element %llu has %u components, the state %u",
		    op_name(s), reducer_names[s->r],
		    (unsigned long long)s->index, e->n, s->state->n);
	for (uint32_t c = 0; c < e->n; c++)
		if (!cwi_tensor_same_spec(&e->comp[c], &s->state->comp[c]))
			return cwi_pipeline_fail(s->base.pl, CACHEW_ETYPE,
			    "%s(%s): component %u of element %llu is %s but "
			    "the state's is %s: every element must have the "
			    "state's dtype and shape", op_name(s),
			    reducer_names[s->r], c,
			    (unsigned long long)s->index,
			    cwi_tensor_spec_str(&e->comp[c], got, sizeof(got)),
			    cwi_tensor_spec_str(&s->state->comp[c], want,
				sizeof(want)));
	return CACHEW_OK;
}

/* count: the state after one more element. */
static cwi_element *
count_next(const scan_iter *s)
{
	cwi_element *out = cwi_element_new(1);
	int64_t prev = s->initial_i;

	if (out == NULL)
		return NULL;
	if (s->state != NULL)
		prev = load_i(cwi_tensor_data(&s->state->comp[0]), CACHEW_I64,
		    0);
	cwi_tensor_init_i64(&out->comp[0], combine_i(R_SUM, prev, 1));
	return out;
}

/* The state after element e, as a new element (the old state and e are
 * shared with the consumer, so they are never written). */
static cachew_err
state_next(scan_iter *s, cwi_element *e, cwi_element **out)
{
	cwi_element *next;
	cachew_err rv;

	if (s->r == R_COUNT) {
		next = count_next(s);
		if (next == NULL)
			return cwi_pipeline_fail(s->base.pl, CACHEW_ENOMEM,
			    "%s: out of memory", op_name(s));
		*out = next;
		return CACHEW_OK;
	}
	rv = check_element(s, e);
	if (rv != CACHEW_OK)
		return rv;
	if (s->state == NULL && !s->has_initial) {
		cwi_element_retain(e); /* min, max: the first element */
		*out = e;
		return CACHEW_OK;
	}
	next = cwi_element_new(e->n);
	if (next == NULL)
		return cwi_pipeline_fail(s->base.pl, CACHEW_ENOMEM,
		    "%s: out of memory", op_name(s));
	for (uint32_t c = 0; c < e->n; c++) {
		const cwi_tensor *t = &e->comp[c];
		uint8_t *data;
		rv = cwi_tensor_init_alloc(&next->comp[c],
		    (cachew_dtype)t->dtype, t->rank, t->shape, false, &data);
		if (rv != CACHEW_OK) {
			cwi_element_release(next);
			return cwi_pipeline_fail(s->base.pl, rv, "%s: %s",
			    op_name(s), cachew_errmsg());
		}
		combine_values(s, t->dtype, (size_t)cwi_tensor_numel(t),
		    s->state != NULL ? cwi_tensor_data(&s->state->comp[c])
				     : NULL,
		    cwi_tensor_data(t), data);
	}
	*out = next;
	return CACHEW_OK;
}

/* Folds element e into the state; the new state is retained by the
 * iterator. */
static cachew_err
fold(scan_iter *s, cwi_element *e)
{
	cwi_element *next = NULL;
	cachew_err rv = state_next(s, e, &next);

	if (rv != CACHEW_OK)
		return rv;
	cwi_element_release(s->state);
	s->state = next;
	s->index++;
	return CACHEW_OK;
}

/* ---- scan ------------------------------------------------------------------ */

/* Replaces every pulled element by the state after it. */
static cachew_err
scan_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	scan_iter *s = (scan_iter *)it;
	size_t n0 = out->n;
	cachew_err rv = cwi_iter_next(s->input, out, max);

	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = n0; i < out->n; i++) {
		rv = fold(s, out->v[i]);
		if (rv != CACHEW_OK) {
			for (size_t k = i; k < out->n; k++)
				cwi_element_release(out->v[k]);
			out->n = i;
			return rv;
		}
		cwi_element_release(out->v[i]);
		cwi_element_retain(s->state);
		out->v[i] = s->state;
	}
	return CACHEW_OK;
}

/* ---- reduce ----------------------------------------------------------------- */

/* The state of an empty input: `initial` in every value of the input's
 * spec, which must be known in full. */
static cachew_err
empty_state(scan_iter *s, cwi_element **out)
{
	const cwi_spec *spec = &s->base.node->inputs[0]->spec;
	cwi_element *e;

	if (s->r == R_COUNT) {
		*out = cwi_element_new(1);
		if (*out == NULL)
			return cwi_pipeline_fail(s->base.pl, CACHEW_ENOMEM,
			    "reduce: out of memory");
		cwi_tensor_init_i64(&(*out)->comp[0], s->initial_i);
		return CACHEW_OK;
	}
	if (!s->has_initial)
		return cwi_pipeline_fail(s->base.pl, CACHEW_EINVAL,
		    "reduce(%s): the input is empty and there is no initial "
		    "value to yield: give initial=", reducer_names[s->r]);
	for (uint32_t c = 0; spec->known && c < spec->n; c++) {
		const cwi_comp_spec *cs = &spec->comp[c];
		bool known = numeric(cs->dtype) && cs->rank != CWI_RANK_UNKNOWN;
		for (unsigned d = 0; known && d < cs->rank; d++)
			known = cs->shape[d] >= 0;
		if (!known)
			return cwi_pipeline_fail(s->base.pl, CACHEW_EINVAL,
			    "reduce(%s): the input is empty and its component "
			    "%u has no known numeric dtype and shape to hold "
			    "the initial value", reducer_names[s->r], c);
	}
	if (!spec->known)
		return cwi_pipeline_fail(s->base.pl, CACHEW_EINVAL,
		    "reduce(%s): the input is empty and its element spec is "
		    "not known, so there is no state to yield",
		    reducer_names[s->r]);
	e = cwi_element_new(spec->n);
	if (e == NULL)
		return cwi_pipeline_fail(s->base.pl, CACHEW_ENOMEM,
		    "reduce: out of memory");
	for (uint32_t c = 0; c < spec->n; c++) {
		const cwi_comp_spec *cs = &spec->comp[c];
		uint8_t *data;
		cachew_err rv = cwi_tensor_init_alloc(&e->comp[c],
		    (cachew_dtype)cs->dtype, cs->rank, cs->shape, false, &data);
		size_t n = (size_t)cwi_shape_numel(cs->rank, cs->shape);
		if (rv != CACHEW_OK) {
			cwi_element_release(e);
			return cwi_pipeline_fail(s->base.pl, rv, "reduce: %s",
			    cachew_errmsg());
		}
		for (size_t j = 0; j < n; j++) {
			if (is_float(cs->dtype))
				store_f(data, cs->dtype, j, s->initial_float
				    ? s->initial_f : (double)s->initial_i);
			else
				store_i(data, cs->dtype, j, s->initial_i);
		}
	}
	*out = e;
	return CACHEW_OK;
}

/* Reads the whole input, then yields the last state. */
static cachew_err
reduce_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	scan_iter *s = (scan_iter *)it;
	cwi_chunk in = {0};
	cachew_err rv;

	(void)max;
	if (s->done)
		return CACHEW_EOF;
	for (;;) {
		if (cwi_pipeline_cancelled(it->pl)) {
			cwi_chunk_free(&in);
			return CACHEW_ECANCELED;
		}
		rv = cwi_iter_next(s->input, &in, 256);
		if (rv == CACHEW_EOF)
			break;
		for (size_t i = 0; rv == CACHEW_OK && i < in.n; i++)
			rv = fold(s, in.v[i]);
		cwi_chunk_clear(&in);
		if (rv != CACHEW_OK) {
			cwi_chunk_free(&in);
			return rv;
		}
	}
	cwi_chunk_free(&in);
	if (s->state == NULL) {
		rv = empty_state(s, &s->state);
		if (rv != CACHEW_OK)
			return rv;
	}
	s->done = true;
	cwi_element_retain(s->state);
	cwi_chunk_push(out, s->state);
	return CACHEW_OK;
}

/* ---- both ------------------------------------------------------------------- */

static void
scan_destroy(cwi_iter *it)
{
	scan_iter *s = (scan_iter *)it;

	cwi_iter_destroy(s->input);
	cwi_element_release(s->state);
	free(s);
}

/* [index, done, [state] or [], input]. */
static cachew_err
scan_save(cwi_iter *it, cwi_state_writer *w)
{
	scan_iter *s = (scan_iter *)it;
	cachew_err rv;

	cwi_sw_array(w, 4);
	cwi_sw_uint(w, s->index);
	cwi_sw_bool(w, s->done);
	rv = cwi_sw_elements(w, &s->state, s->state != NULL ? 1 : 0);
	return rv != CACHEW_OK ? rv : cwi_iter_save(s->input, w);
}

static cachew_err
scan_restore(cwi_iter *it, cwi_state_reader *r)
{
	scan_iter *s = (scan_iter *)it;
	cwi_chunk state = {0};

	if (!cwi_sr_array(r, op_name(s), 4) ||
	    !cwi_sr_uint(r, "index", &s->index, UINT64_MAX) ||
	    !cwi_sr_bool(r, "done", &s->done) ||
	    !cwi_sr_elements(r, "state", &state)) {
		cwi_chunk_free(&state);
		return cwi_sr_error(r);
	}
	if (state.n > 1 || (state.n == 0 && (s->index > 0 || s->done))) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "%s: %zu saved states after "
		    "%llu elements", op_name(s), state.n,
		    (unsigned long long)s->index);
		cwi_chunk_free(&state);
		return cwi_sr_error(r);
	}
	if (state.n == 1) {
		s->state = state.v[0];
		state.n = 0;
	}
	cwi_chunk_free(&state);
	return cwi_iter_restore(s->input, r);
}

static const cwi_iter_ops scan_iter_ops = {
    .next = scan_next,
    .destroy = scan_destroy,
    .save = scan_save,
    .restore = scan_restore,
};

static const cwi_iter_ops reduce_iter_ops = {
    .next = reduce_next,
    .destroy = scan_destroy,
    .save = scan_save,
    .restore = scan_restore,
};

static cachew_err
scan_iter_create(cwi_iter **out, const cwi_node *node,
    const cwi_iter_args *args, bool terminal)
{
	scan_iter *s = calloc(1, sizeof(*s));
	const cwi_value *init = cwi_node_value(node, "initial");
	cachew_err rv;

	if (s == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	s->base.ops = terminal ? &reduce_iter_ops : &scan_iter_ops;
	s->terminal = terminal;
	s->r = (reducer)reducer_find(cwi_node_str(node, "reducer"));
	s->has_initial = s->r != R_MIN && s->r != R_MAX;
	s->initial_i = s->r == R_PROD ? 1 : 0;
	if (init != NULL && init->type != CWI_V_NIL) {
		s->has_initial = true;
		s->initial_float = init->type == CWI_V_FLOAT;
		s->initial_i = init->type == CWI_V_INT ? init->u.i : 0;
		s->initial_f = init->type == CWI_V_FLOAT ? init->u.f : 0;
	}
	rv = cwi_iter_create(&s->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(s);
		return rv;
	}
	*out = &s->base;
	return CACHEW_OK;
}

static cachew_err
scan_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return scan_iter_create(out, node, args, false);
}

static cachew_err
reduce_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return scan_iter_create(out, node, args, true);
}

/* The reducer is known; initial is a number (an integer for count). */
static cachew_err
scan_validate(cwi_node *node)
{
	const char *name = cwi_node_str(node, "reducer");
	const cwi_value *init = cwi_node_value(node, "initial");
	int r = reducer_find(name);

	if (r < 0)
		return cwi_fail(CACHEW_EINVAL, "%s: unknown reducer '%s': the "
		    "reducers are sum, prod, min, max and count",
		    node->op->name, name);
	if (init == NULL || init->type == CWI_V_NIL)
		return CACHEW_OK;
	if (init->type != CWI_V_INT && init->type != CWI_V_FLOAT)
		return cwi_fail(CACHEW_EINVAL, "%s: initial must be a number",
		    node->op->name);
	if (r == R_COUNT && init->type != CWI_V_INT)
		return cwi_fail(CACHEW_EINVAL, "%s(count): initial must be an "
		    "integer (the count is i64)", node->op->name);
	return CACHEW_OK;
}

/* count: i64[]. The others: the input's spec, whose dtypes must be
 * numeric where known, and integers when initial is a fraction. */
static cachew_err
scan_spec(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	const cwi_value *init = cwi_node_value(node, "initial");
	const char *name = cwi_node_str(node, "reducer");
	bool frac = init != NULL && init->type == CWI_V_FLOAT;
	char label[96];

	if (reducer_find(name) == R_COUNT)
		return cwi_spec_scalar(&node->spec, CACHEW_I64);
	for (uint32_t c = 0; in->known && c < in->n; c++) {
		uint8_t dt = in->comp[c].dtype;
		const char *dn = cachew_dtype_name((cachew_dtype)dt);
		if (dt == CACHEW_INVALID)
			continue;
		if (!numeric(dt) || (frac && !is_float(dt)))
			return cwi_fail(CACHEW_ETYPE, "%s(%s): %s is %s; the "
			    "reducer takes u8, i32, i64, f32 or f64%s",
			    node->op->name, name,
			    cwi_comp_spec_label(in, c, label, sizeof(label)),
			    dn != NULL ? dn : "?",
			    numeric(dt) ? ", and a fractional initial only "
					  "for f32 and f64" : "");
	}
	return cwi_spec_copy(&node->spec, in);
}

static cachew_err
scan_infer(cwi_node *node)
{
	node->card = node->inputs[0]->card;
	return scan_spec(node);
}

/* One element; an infinite input is refused (it would never end). */
static cachew_err
reduce_infer(cwi_node *node)
{
	if (node->inputs[0]->card == CACHEW_CARDINALITY_INFINITE)
		return cwi_fail(CACHEW_EINVAL, "reduce: the input is infinite, "
		    "so its reduction never ends (take or take_while first)");
	node->card = 1;
	return scan_spec(node);
}

static const cwi_param_spec scan_params[] = {
    {.name = "reducer", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "sum, prod, min, max or count"},
    {.name = "initial", .type = CWI_P_ANY, .flags = CWI_PF_OPTIONAL,
	.help = "the state's first value, in every value of the state "
		"(default: sum 0, prod 1, count 0; min and max start from "
		"the first element)"},
};

const cwi_dataset_op cwi_op_scan = {
    .name = "scan",
    .doc = "yields the running state of a built-in reducer (sum, prod, "
	   "min, max, count) after each element",
    .params = scan_params,
    .nparams = sizeof(scan_params) / sizeof(scan_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .validate = scan_validate,
    .iter_create = scan_create,
    .saves = "the count of elements read, the state, and the input",
    .infer = scan_infer,
    .note = "tf.data's `scan(initial_state, scan_func)` takes any function of "
	"(state, element). Here the reducer is one of the library's, by name: "
	"a registered function (`cachew_op_def`) maps one element to one "
	"element and shares a read-only state among threads, so it has no "
	"running state to pass on, and nothing could save one with "
	"`cachew_iterator_save`. A named reducer keeps its state in the "
	"iterator, saves it, and runs the same in-process and through the "
	"service. The state has the elements' structure (same dtype and shape "
	"per component, combined value by value; integers wrap; u8, i32, i64, "
	"f32, f64) and starts as `initial` in every value; `count` counts "
	"elements into an i64 scalar whatever they hold. scan yields the "
	"state after each element, as tf.data's scan does when its function "
	"returns the new state as its output. Through the service it runs in "
	"the client part, in split order in a private job.",
};

const cwi_dataset_op cwi_op_reduce = {
    .name = "reduce",
    .doc = "reads the whole input and yields one element: the final state "
	   "of a built-in reducer (sum, prod, min, max, count)",
    .params = scan_params,
    .nparams = sizeof(scan_params) / sizeof(scan_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .validate = scan_validate,
    .iter_create = reduce_create,
    .saves = "the count of elements read, the state, whether it was "
	"yielded, and the input",
    .infer = reduce_infer,
    .note = "tf.data's `Dataset.reduce` returns a value; here it is a dataset "
	"of one element, so it composes (`reduce(sum) | repeat(2)`) and runs "
	"through the service, in the client part. The reducers are scan's, "
	"for the same reason. An empty input yields the initial state shaped "
	"by the input's element spec (which must then be known in full, and "
	"`initial` given for min and max); an infinite input is refused when "
	"the dataset is built.",
};
