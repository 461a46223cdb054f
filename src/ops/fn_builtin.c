/*
 * fn_builtin.c - built-in map functions: add, mul, mod, cast, identity,
 * sleep_us, spin_us, uniform.
 *
 * Each init rejects parameters it does not know, naming them, so a typo
 * fails when the pipeline is built. The states are immutable after init
 * and shared by all threads.
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- parameters ------------------------------------------------------------ */

static cachew_err
get_double(const cachew_params *params, const char *key, bool required,
    double *out, char *err, size_t errlen)
{
	cachew_err rv = cachew_params_get_double(params, key, out);

	if (rv == CACHEW_ENOENT && !required)
		return CACHEW_OK;
	if (rv == CACHEW_ENOENT) {
		snprintf(err, errlen, "missing required parameter '%s'", key);
		return CACHEW_EINVAL;
	}
	if (rv != CACHEW_OK || !isfinite(*out)) {
		snprintf(err, errlen, "parameter '%s' must be a finite number",
		    key);
		return CACHEW_EINVAL;
	}
	return CACHEW_OK;
}

/* ---- f16 and bf16 ------------------------------------------------------------- */

/*
 * Rounds a double to a binary float of `mbits` mantissa and `ebits`
 * exponent bits (f16: 10/5, bf16: 7/8) to nearest, ties to even, in one
 * step (no double rounding through f32). Overflow gives infinity, values
 * below half the smallest subnormal give zero, NaN a quiet NaN.
 */
static uint16_t
round_to_small_float(double x, int mbits, int ebits)
{
	uint64_t bits, mant, q, rem, half;
	uint16_t sign, inf = (uint16_t)(((1u << ebits) - 1u) << mbits);
	int e, emin = 2 - (1 << (ebits - 1)), shift;

	memcpy(&bits, &x, sizeof(bits));
	sign = (uint16_t)((bits >> 63) << (mbits + ebits));
	e = (int)((bits >> 52) & 0x7ff);
	mant = bits & ((1ULL << 52) - 1);
	if (e == 0x7ff)
		return (uint16_t)(sign | inf |
		    (mant != 0 ? 1u << (mbits - 1) : 0u));
	if (e == 0)
		return sign; /* zero or a double subnormal: far below range */
	e -= 1023;
	mant |= 1ULL << 52;
	shift = 52 - mbits + (e < emin ? emin - e : 0);
	if (shift >= 60)
		return sign;
	q = mant >> shift;
	rem = mant & ((1ULL << shift) - 1);
	half = 1ULL << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	/* q carries the implicit bit, which bumps the exponent field to
	 * e - emin + 1; a rounding carry out of the mantissa does too. */
	bits = ((uint64_t)(e > emin ? e - emin : 0) << mbits) + q;
	if (bits >= inf)
		return (uint16_t)(sign | inf);
	return (uint16_t)(sign | bits);
}

static uint16_t
f64_to_f16(double x)
{
	return round_to_small_float(x, 10, 5);
}

static uint16_t
f64_to_bf16(double x)
{
	return round_to_small_float(x, 7, 8);
}

/* ---- add / mul ------------------------------------------------------------ */

typedef struct arith_state {
	double value;
	int64_t ivalue;
	bool integral;
} arith_state;

static cachew_err
arith_init(const cachew_params *params, void **state, char *err,
    size_t errlen, bool required)
{
	arith_state *s;
	double v = 1.0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "value", err, errlen);
	if (rv == CACHEW_OK)
		rv = get_double(params, "value", required, &v, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
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
	return arith_init(p, state, err, errlen, false);
}

static cachew_err
mul_init(const cachew_params *p, void **state, char *err, size_t errlen)
{
	return arith_init(p, state, err, errlen, true);
}

static void
free_state(void *state)
{
	free(state);
}

/* x = x (+|*) value over n values of dtype dt at p. Integers wrap. */
static void
arith_apply(uint8_t *p, int64_t n, cachew_dtype dt, const arith_state *s,
    bool mul)
{
	switch (dt) {
	case CACHEW_I64: {
		int64_t *x = (int64_t *)(void *)p;
		uint64_t v = (uint64_t)s->ivalue;
		for (int64_t i = 0; i < n; i++)
			x[i] = mul ? (int64_t)((uint64_t)x[i] * v)
				   : (int64_t)((uint64_t)x[i] + v);
		break;
	}
	case CACHEW_I32: {
		int32_t *x = (int32_t *)(void *)p;
		uint32_t v = (uint32_t)s->ivalue;
		for (int64_t i = 0; i < n; i++)
			x[i] = mul ? (int32_t)((uint32_t)x[i] * v)
				   : (int32_t)((uint32_t)x[i] + v);
		break;
	}
	case CACHEW_U8: {
		uint8_t v = (uint8_t)s->ivalue;
		for (int64_t i = 0; i < n; i++)
			p[i] = mul ? (uint8_t)(p[i] * v) : (uint8_t)(p[i] + v);
		break;
	}
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
	case CACHEW_F16:
	case CACHEW_BF16: {
		/* Exact in f64, then one rounding: correctly rounded. */
		uint16_t *x = (uint16_t *)(void *)p;
		for (int64_t i = 0; i < n; i++) {
			double d = dt == CACHEW_F16 ? cwi_f16_to_f64(x[i])
						    : cwi_bf16_to_f64(x[i]);
			d = mul ? d * s->value : d + s->value;
			x[i] = dt == CACHEW_F16 ? f64_to_f16(d) : f64_to_bf16(d);
		}
		break;
	}
	default:
		break;
	}
}

/* Applies x = x (+|*) value to every numeric component, in place when
 * the element and its buffers are not shared. */
static cachew_err
arith_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out,
    bool mul)
{
	const arith_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	/* The hot path (range | map(add) | batch): one inline i64 scalar. */
	if (e->n == 1 && e->comp[0].dtype == CACHEW_I64 &&
	    e->comp[0].rank == 0 && e->comp[0].buf == NULL && s->integral) {
		int64_t x;
		memcpy(&x, e->comp[0].inl.b, sizeof(x));
		x = mul ? (int64_t)((uint64_t)x * (uint64_t)s->ivalue)
			: (int64_t)((uint64_t)x + (uint64_t)s->ivalue);
		memcpy(e->comp[0].inl.b, &x, sizeof(x));
		*out = e;
		return CACHEW_OK;
	}
	for (uint32_t c = 0; c < e->n; c++) {
		cwi_tensor *t = &e->comp[c];
		cachew_dtype dt = (cachew_dtype)t->dtype;
		uint8_t *p;

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
		arith_apply(p, cwi_tensor_numel(t), dt, s, mul);
	}
	*out = e;
	return CACHEW_OK;
}

static cachew_err
add_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	return arith_map(ctx, in, out, false);
}

static cachew_err
mul_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	return arith_map(ctx, in, out, true);
}

static const cachew_op_def fn_add = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "add",
    .doc = "add(value=1): adds value to every numeric component, in place",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 5,
    .init = add_init,
    .fini = free_state,
    .map = add_map,
};

static const cachew_op_def fn_mul = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "mul",
    .doc = "mul(value): multiplies every numeric component by value, in place",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 5,
    .init = mul_init,
    .fini = free_state,
    .map = mul_map,
};

/* ---- mod ------------------------------------------------------------------------ */

/*
 * mod(value) replaces every integer x by x mod value, the remainder of
 * floor division (Python's and tf.math.floormod's: never negative for a
 * positive value), in place when unshared. Integer components only: a
 * key for group_by_window (`lambda x: x % 2`).
 */
typedef struct mod_state {
	int64_t value;
} mod_state;

static cachew_err
mod_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	mod_state *s;
	int64_t v = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "value", err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "value", 0, 1, INT64_MAX, &v, err,
		    errlen);
	if (rv == CACHEW_OK && v == 0) {
		snprintf(err, errlen, "missing required parameter 'value'");
		rv = CACHEW_EINVAL;
	}
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->value = v;
	*state = s;
	return CACHEW_OK;
}

static int64_t
floor_mod(int64_t x, int64_t m)
{
	int64_t r = x % m;

	return r < 0 ? r + m : r;
}

static void
mod_apply(uint8_t *p, int64_t n, cachew_dtype dt, int64_t m)
{
	for (int64_t i = 0; i < n; i++) {
		if (dt == CACHEW_I64) {
			int64_t x;
			memcpy(&x, p + i * 8, 8);
			x = floor_mod(x, m);
			memcpy(p + i * 8, &x, 8);
		} else if (dt == CACHEW_I32) {
			int32_t x;
			memcpy(&x, p + i * 4, 4);
			x = (int32_t)floor_mod(x, m);
			memcpy(p + i * 4, &x, 4);
		} else {
			p[i] = (uint8_t)floor_mod(p[i], m);
		}
	}
}

static cachew_err
mod_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const mod_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	for (uint32_t c = 0; c < e->n; c++) {
		cwi_tensor *t = &e->comp[c];
		cachew_dtype dt = (cachew_dtype)t->dtype;
		uint8_t *p;

		if (dt != CACHEW_I64 && dt != CACHEW_I32 && dt != CACHEW_U8) {
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx, "component %u is %s: not "
			    "an integer (u8, i32 or i64)", c,
			    cachew_dtype_name(dt));
		}
		if (cwi_tensor_make_mutable(t, &p) != CACHEW_OK) {
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx, "out of memory");
		}
		mod_apply(p, cwi_tensor_numel(t), dt, s->value);
	}
	*out = e;
	return CACHEW_OK;
}

static const cachew_op_def fn_mod = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "mod",
    .doc = "mod(value): replaces every integer by its remainder of floor division by value (>= 1), in place",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 5,
    .init = mod_init,
    .fini = free_state,
    .map = mod_map,
};

/* ---- cast ---------------------------------------------------------------------- */

/*
 * cast(dtype) converts every component to dtype (any numeric dtype or
 * bool; bytes in or out is an error):
 *   - to bool: x != 0 (NaN is true); from bool: 0 or 1;
 *   - integer to integer: two's-complement wrap-around, as C, numpy and
 *     tf.cast do (i64 300 -> u8 44, -1 -> u8 255);
 *   - float to integer: truncation toward zero, saturating at the
 *     target's limits (1e10 -> i32 2147483647, -3.7 -> u8 0); NaN -> 0;
 *   - to f16/bf16: round to nearest even from the exact f64 value
 *     (integers beyond 2^53 are first rounded to f64); overflow -> inf;
 *   - to f32/f64 from wider types: IEEE round to nearest even.
 * A component that already has the dtype keeps its buffer.
 */

typedef struct cast_state {
	cachew_dtype dtype;
} cast_state;

static cachew_err
cast_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	cast_state *s;
	const char *name;
	cachew_dtype dt;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "dtype", err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	rv = cachew_params_get_str(params, "dtype", &name);
	if (rv == CACHEW_ENOENT) {
		snprintf(err, errlen, "missing required parameter 'dtype'");
		return CACHEW_EINVAL;
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "%s", rv == CACHEW_ETYPE
		    ? "parameter 'dtype' must be a dtype name" : cwi_errmsg_get());
		return CACHEW_EINVAL;
	}
	if (cachew_dtype_from_name(name, &dt) != CACHEW_OK) {
		snprintf(err, errlen,
		    "unknown dtype '%s' (expected u8, i32, i64, f16, bf16, f32, "
		    "f64 or bool)",
		    name);
		return CACHEW_EINVAL;
	}
	if (dt == CACHEW_BYTES) {
		snprintf(err, errlen,
		    "cannot cast to bytes: cast converts between numeric "
		    "dtypes and bool");
		return CACHEW_EINVAL;
	}
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->dtype = dt;
	*state = s;
	return CACHEW_OK;
}

static bool
is_integer_dtype(cachew_dtype dt)
{
	return dt == CACHEW_U8 || dt == CACHEW_I32 || dt == CACHEW_I64 ||
	    dt == CACHEW_BOOL;
}

static int64_t
load_int(const uint8_t *p, cachew_dtype dt, int64_t i)
{
	int32_t i32;
	int64_t i64;

	switch (dt) {
	case CACHEW_U8:
		return p[i];
	case CACHEW_BOOL:
		return p[i] != 0;
	case CACHEW_I32:
		memcpy(&i32, p + i * 4, 4);
		return i32;
	default:
		memcpy(&i64, p + i * 8, 8);
		return i64;
	}
}

static double
load_float(const uint8_t *p, cachew_dtype dt, int64_t i)
{
	uint16_t h;
	float f;
	double d;

	switch (dt) {
	case CACHEW_F16:
		memcpy(&h, p + i * 2, 2);
		return cwi_f16_to_f64(h);
	case CACHEW_BF16:
		memcpy(&h, p + i * 2, 2);
		return cwi_bf16_to_f64(h);
	case CACHEW_F32:
		memcpy(&f, p + i * 4, 4);
		return f;
	default:
		memcpy(&d, p + i * 8, 8);
		return d;
	}
}

/* Truncates toward zero and clamps to [lo, hi]; NaN -> 0. */
static int64_t
saturate(double d, int64_t lo, int64_t hi)
{
	if (isnan(d))
		return 0;
	if (d <= (double)lo)
		return lo;
	if (d >= (double)hi)
		return hi;
	return (int64_t)d;
}

static void
store_float(uint8_t *p, cachew_dtype dt, int64_t i, double d)
{
	uint16_t h;
	int32_t i32;
	int64_t i64;
	float f;

	switch (dt) {
	case CACHEW_U8:
		p[i] = (uint8_t)saturate(d, 0, UINT8_MAX);
		break;
	case CACHEW_BOOL:
		p[i] = d != 0 || isnan(d);
		break;
	case CACHEW_I32:
		i32 = (int32_t)saturate(d, INT32_MIN, INT32_MAX);
		memcpy(p + i * 4, &i32, 4);
		break;
	case CACHEW_I64:
		i64 = saturate(d, INT64_MIN, INT64_MAX);
		memcpy(p + i * 8, &i64, 8);
		break;
	case CACHEW_F16:
	case CACHEW_BF16:
		h = dt == CACHEW_F16 ? f64_to_f16(d) : f64_to_bf16(d);
		memcpy(p + i * 2, &h, 2);
		break;
	case CACHEW_F32:
		f = (float)d;
		memcpy(p + i * 4, &f, 4);
		break;
	default:
		memcpy(p + i * 8, &d, 8);
		break;
	}
}

static void
store_int(uint8_t *p, cachew_dtype dt, int64_t i, int64_t v)
{
	int32_t i32;

	switch (dt) {
	case CACHEW_U8:
		p[i] = (uint8_t)(uint64_t)v;
		break;
	case CACHEW_BOOL:
		p[i] = v != 0;
		break;
	case CACHEW_I32:
		i32 = (int32_t)(uint32_t)(uint64_t)v;
		memcpy(p + i * 4, &i32, 4);
		break;
	case CACHEW_I64:
		memcpy(p + i * 8, &v, 8);
		break;
	default:
		store_float(p, dt, i, (double)v);
		break;
	}
}

static cachew_err
cast_component(cwi_tensor *t, cachew_dtype to)
{
	cachew_dtype from = (cachew_dtype)t->dtype;
	int64_t n = cwi_tensor_numel(t);
	const uint8_t *src = cwi_tensor_data(t);
	cwi_tensor res;
	uint8_t *dst;
	cachew_err rv;

	rv = cwi_tensor_init_alloc(&res, to, t->rank, t->shape, false, &dst);
	if (rv != CACHEW_OK)
		return rv;
	if (is_integer_dtype(from)) {
		for (int64_t i = 0; i < n; i++)
			store_int(dst, to, i, load_int(src, from, i));
	} else {
		for (int64_t i = 0; i < n; i++)
			store_float(dst, to, i, load_float(src, from, i));
	}
	cwi_tensor_clear(t);
	*t = res;
	return CACHEW_OK;
}

static cachew_err
cast_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const cast_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e;

	for (uint32_t c = 0; c < in->n; c++) {
		if (in->comp[c].dtype == CACHEW_BYTES) {
			cwi_element_release(in);
			return cachew_op_ctx_fail(ctx,
			    "component %u is bytes: cast converts numbers and "
			    "bools only",
			    c);
		}
	}
	e = cwi_element_make_unique(in);
	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	for (uint32_t c = 0; c < e->n; c++) {
		if (e->comp[c].dtype == s->dtype)
			continue;
		if (cast_component(&e->comp[c], s->dtype) != CACHEW_OK) {
			cwi_element_release(e);
			return cachew_op_ctx_fail(ctx,
			    "out of memory casting component %u", c);
		}
	}
	*out = e;
	return CACHEW_OK;
}

static const cachew_op_def fn_cast = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "cast",
    .doc = "cast(dtype): converts every component to dtype (float to int truncates and saturates)",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 10,
    .init = cast_init,
    .fini = free_state,
    .map = cast_map,
};

/* ---- identity --------------------------------------------------------------------- */

static cachew_err
identity_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	(void)state;
	return cwi_fn_check_keys(params, "", err, errlen);
}

static cachew_err
identity_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	*out = in;
	return CACHEW_OK;
}

static const cachew_op_def fn_identity = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "identity",
    .doc = "identity(): returns the element unchanged",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 1,
    .init = identity_init,
    .map = identity_map,
};

/* ---- sleep_us / spin_us: simulated I/O and compute ------------------------------- */

typedef struct delay_state {
	uint64_t ns;
} delay_state;

#define DELAY_MAX_US (INT64_MAX / 1000)

static cachew_err
delay_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	delay_state *s;
	int64_t us;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "us", err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	rv = cachew_params_get_int(params, "us", &us);
	if (rv == CACHEW_ENOENT) {
		snprintf(err, errlen, "missing required parameter 'us'");
		return CACHEW_EINVAL;
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "parameter 'us' must be an integer");
		return CACHEW_EINVAL;
	}
	if (us < 0 || us > DELAY_MAX_US) {
		snprintf(err, errlen, "parameter 'us' must be in [0, %lld], not "
				      "%lld",
		    (long long)DELAY_MAX_US, (long long)us);
		return CACHEW_ERANGE;
	}
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->ns = (uint64_t)us * 1000;
	*state = s;
	return CACHEW_OK;
}

/* Sleeps without using CPU, like a read from a slow store. */
static cachew_err
sleep_us_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const delay_state *s = cachew_op_ctx_state(ctx);
	if (s->ns > 0)
		cwi_sleep_ns(s->ns);
	*out = in;
	return CACHEW_OK;
}

/* Burns CPU for the time, like a decode. */
static cachew_err
spin_us_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const delay_state *s = cachew_op_ctx_state(ctx);
	uint64_t t0 = cwi_now_ns();

	while (cwi_now_ns() - t0 < s->ns) {
	}
	*out = in;
	return CACHEW_OK;
}

static const cachew_op_def fn_sleep_us = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "sleep_us",
    .doc = "sleep_us(us): sleeps us microseconds without using CPU (simulates I/O)",
    .kind = CACHEW_OP_MAP,
    .init = delay_init,
    .fini = free_state,
    .map = sleep_us_map,
};

static const cachew_op_def fn_spin_us = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "spin_us",
    .doc = "spin_us(us): burns us microseconds of CPU (simulates compute)",
    .kind = CACHEW_OP_MAP,
    .init = delay_init,
    .fini = free_state,
    .map = spin_us_map,
};

/* ---- uniform ------------------------------------------------------------------------ */

typedef struct uniform_state {
	double lo, hi;
} uniform_state;

static cachew_err
uniform_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	uniform_state *s;
	double lo = 0.0, hi = 1.0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "lo, hi", err, errlen);
	if (rv == CACHEW_OK)
		rv = get_double(params, "lo", false, &lo, err, errlen);
	if (rv == CACHEW_OK)
		rv = get_double(params, "hi", false, &hi, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	if (!(lo < hi) || !isfinite(hi - lo)) {
		snprintf(err, errlen,
		    "'lo' (%g) must be less than 'hi' (%g), a finite range",
		    lo, hi);
		return CACHEW_EINVAL;
	}
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->lo = lo;
	s->hi = hi;
	*state = s;
	return CACHEW_OK;
}

/* Appends an f64 scalar drawn uniformly from [lo, hi) by the element's
 * own random stream: a function of (pipeline seed, element index). */
static cachew_err
uniform_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const uniform_state *s = cachew_op_ctx_state(ctx);
	double u = (double)(cachew_op_ctx_random(ctx) >> 11) * 0x1p-53;
	double x = s->lo + (s->hi - s->lo) * u;
	cwi_element *e;

	if (in->n >= CACHEW_MAX_COMPONENTS) {
		cwi_element_release(in);
		return cachew_op_ctx_fail(ctx,
		    "the element already has %d components, the maximum",
		    CACHEW_MAX_COMPONENTS);
	}
	if (x >= s->hi) /* rounding up at the top of the range */
		x = nextafter(s->hi, s->lo);
	e = cwi_element_new(in->n + 1);
	if (e == NULL) {
		cwi_element_release(in);
		return cachew_op_ctx_fail(ctx, "out of memory");
	}
	for (uint32_t c = 0; c < in->n; c++)
		cwi_tensor_copy(&e->comp[c], &in->comp[c]);
	cwi_tensor_init_f64(&e->comp[in->n], x);
	cwi_element_release(in);
	*out = e;
	return CACHEW_OK;
}

static const cachew_op_def fn_uniform = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "uniform",
    .doc = "uniform(lo=0.0, hi=1.0): appends an f64 drawn uniformly from [lo, hi), seeded per element",
    .kind = CACHEW_OP_MAP,
    .flags = CACHEW_OP_RANDOM,
    .cost_ns = 20,
    .init = uniform_init,
    .fini = free_state,
    .map = uniform_map,
};

const cachew_op_def *const cwi_builtin_fns[] = {
    &fn_add,
    &fn_mul,
    &fn_mod,
    &fn_cast,
    &fn_identity,
    &fn_sleep_us,
    &fn_spin_us,
    &fn_uniform,
    &cwi_fn_decode_jpeg,
    &cwi_fn_is_valid_jpeg,
    &cwi_fn_random_resized_crop,
    &cwi_fn_resize,
    &cwi_fn_center_crop,
    &cwi_fn_flip_left_right,
    &cwi_fn_normalize,
    &cwi_fn_transpose,
    &cwi_fn_tokenize,
    &cwi_fn_pad_truncate,
    &cwi_fn_parse_example,
    NULL,
};
