/*
 * fn_builtin.c - built-in map functions: add, mul, cast, identity,
 * sleep_us, spin_us.
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- add / mul ------------------------------------------------------------ */

typedef struct arith_state {
	double value;
	int64_t ivalue;
	bool integral;
} arith_state;

static cachew_err
arith_init(const cachew_params *params, void **state, char *err,
    size_t errlen, double def)
{
	arith_state *s;
	double v = def;

	for (size_t i = 0; i < cachew_params_count(params); i++) {
		const char *k = cachew_params_key(params, i);
		if (strcmp(k, "value") != 0) {
			snprintf(err, errlen, "unknown parameter '%s' (parameters: "
			    "value)", k);
			return CACHEW_EINVAL;
		}
	}
	if (cachew_params_has(params, "value") &&
	    cachew_params_get_double(params, "value", &v) != CACHEW_OK) {
		snprintf(err, errlen, "parameter 'value' must be a number");
		return CACHEW_EINVAL;
	}
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->value = v;
	s->integral = v == floor(v) && fabs(v) < 9.2e18;
	s->ivalue = s->integral ? (int64_t)v : 0;
	*state = s;
	return CACHEW_OK;
}

static cachew_err
add_init(const cachew_params *p, void **state, char *err, size_t errlen)
{
	return arith_init(p, state, err, errlen, 1.0);
}

static void
arith_fini(void *state)
{
	free(state);
}

/* Applies x = x (+|*) value to every numeric component, in place. */
static cachew_err
arith_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out,
    bool mul)
{
	const arith_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	for (uint32_t c = 0; c < e->n; c++) {
		cwi_tensor *t = &e->comp[c];
		int64_t n = cwi_tensor_numel(t);
		uint8_t *p;
		cachew_dtype dt = (cachew_dtype)t->dtype;

		if (dt == CACHEW_BYTES || dt == CACHEW_BOOL) {
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx,
			    "component %u is %s: not a number", c,
			    cachew_dtype_name(dt));
		}
		if ((dt == CACHEW_U8 || dt == CACHEW_I32 || dt == CACHEW_I64) &&
		    !s->integral) {
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx,
			    "value %g is not an integer, component %u is %s",
			    s->value, c, cachew_dtype_name(dt));
		}
		if (cwi_tensor_make_mutable(t, &p) != CACHEW_OK) {
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx, "out of memory");
		}
		switch (dt) {
		case CACHEW_I64: {
			int64_t *x = (int64_t *)(void *)p;
			for (int64_t i = 0; i < n; i++)
				x[i] = mul ? (int64_t)((uint64_t)x[i] *
						 (uint64_t)s->ivalue)
					   : (int64_t)((uint64_t)x[i] +
						 (uint64_t)s->ivalue);
			break;
		}
		case CACHEW_I32: {
			int32_t *x = (int32_t *)(void *)p;
			for (int64_t i = 0; i < n; i++)
				x[i] = mul ? (int32_t)((uint32_t)x[i] *
						 (uint32_t)s->ivalue)
					   : (int32_t)((uint32_t)x[i] +
						 (uint32_t)s->ivalue);
			break;
		}
		case CACHEW_U8:
			for (int64_t i = 0; i < n; i++)
				p[i] = mul ? (uint8_t)(p[i] * (uint64_t)s->ivalue)
					   : (uint8_t)(p[i] + (uint64_t)s->ivalue);
			break;
		case CACHEW_F32: {
			float *x = (float *)(void *)p;
			float v = (float)s->value;
			for (int64_t i = 0; i < n; i++)
				x[i] = mul ? x[i] * v : x[i] + v;
			break;
		}
		case CACHEW_F64: {
			double *x = (double *)(void *)p;
			for (int64_t i = 0; i < n; i++)
				x[i] = mul ? x[i] * s->value : x[i] + s->value;
			break;
		}
		default:
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx,
			    "component %u: %s is not supported", c,
			    cachew_dtype_name(dt));
		}
	}
	*out = e;
	return CACHEW_OK;
}

static cachew_err
add_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	return arith_map(ctx, in, out, false);
}

static const cachew_op_def fn_add = {
    .name = "add",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 5,
    .init = add_init,
    .fini = arith_fini,
    .map = add_map,
};

const cachew_op_def *const cwi_builtin_fns[] = {
    &fn_add,
    NULL,
};
