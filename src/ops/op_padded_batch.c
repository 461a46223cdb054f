/*
 * op_padded_batch.c - the padding of padded_batch: stacks elements of
 * varying shapes into one element, each component padded to a common
 * shape. The operator itself shares batch's iterator (op_batch.c).
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- the shape parameter ------------------------------------------------ */

static cachew_err
shape_from_list(const cwi_value *list, unsigned *rank, int64_t *shape,
    const char *what)
{
	if (list->u.list.n > CACHEW_MAX_RANK)
		return cwi_fail(CACHEW_EINVAL,
		    "padded_batch: %s has %zu dimensions, more than the maximum "
		    "rank %d",
		    what, list->u.list.n, CACHEW_MAX_RANK);
	for (size_t d = 0; d < list->u.list.n; d++) {
		const cwi_value *v = &list->u.list.items[d];
		if (v->type != CWI_V_INT || v->u.i < -1)
			return cwi_fail(CACHEW_EINVAL,
			    "padded_batch: dimension %zu of %s must be an "
			    "integer >= 0, or -1 for the batch maximum",
			    d, what);
		shape[d] = v->u.i;
	}
	*rank = (unsigned)list->u.list.n;
	return CACHEW_OK;
}

/* ---- the pad_value parameter ---------------------------------------------- */

/* A map of pad values by name: each key names a component of the input's
 * spec; the components it leaves out pad with 0. */
static cachew_err
pad_values_by_name(cwi_pad_spec *spec, const cwi_node *node,
    const cwi_value *v)
{
	const cwi_spec *in = &node->inputs[0]->spec;

	if (!in->known)
		return cwi_fail(CACHEW_EINVAL, "padded_batch: pad_value by "
		    "component name needs the input's component names, and "
		    "its element spec is not known (give a list, one value "
		    "per component)");
	memset(spec->pad_values, 0, sizeof(spec->pad_values));
	spec->npad = in->n;
	for (size_t i = 0; i < v->u.map.n; i++) {
		const cwi_kv *kv = &v->u.map.items[i];
		int c = cwi_spec_find(in, kv->key);
		if (c < 0)
			return cwi_fail(CACHEW_EINVAL, "padded_batch: pad_value "
			    "names '%s', which is no component of the input",
			    kv->key);
		spec->pad_values[c] = kv->val.u.f;
	}
	return CACHEW_OK;
}

static cachew_err
pad_values_init(cwi_pad_spec *spec, const cwi_node *node)
{
	const cwi_value *v = cwi_node_value(node, "pad_value");
	const cwi_spec *in = &node->inputs[0]->spec;

	spec->pad_value = 0;
	spec->npad = 0;
	if (v == NULL || v->type == CWI_V_FLOAT) {
		spec->pad_value = v != NULL ? v->u.f : 0;
		return CACHEW_OK;
	}
	if (v->type == CWI_V_MAP)
		return pad_values_by_name(spec, node, v);
	if (v->u.list.n == 0 || v->u.list.n > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_EINVAL, "padded_batch: pad_value lists "
		    "%zu values; give one per component", v->u.list.n);
	if (in->known && in->n != v->u.list.n)
		return cwi_fail(CACHEW_EINVAL, "padded_batch: pad_value lists "
		    "%zu values but the elements have %u components",
		    v->u.list.n, in->n);
	for (size_t c = 0; c < v->u.list.n; c++)
		spec->pad_values[c] = v->u.list.items[c].u.f;
	spec->npad = v->u.list.n;
	return CACHEW_OK;
}

cachew_err
cwi_pad_spec_init(cwi_pad_spec *spec, const cwi_node *node)
{
	const cwi_value *v = cwi_node_value(node, "shape");
	bool nested;
	char what[64];
	cachew_err rv;

	rv = pad_values_init(spec, node);
	if (rv != CACHEW_OK)
		return rv;
	spec->ncomp = 0;
	spec->shared = false;
	if (v == NULL)
		return CACHEW_OK;
	if (v->type != CWI_V_LIST)
		return cwi_fail(CACHEW_EINVAL, "padded_batch: shape must be a list");
	nested = v->u.list.n > 0 && v->u.list.items[0].type == CWI_V_LIST;
	if (!nested) {
		spec->ncomp = 1;
		spec->shared = true;
		return shape_from_list(v, &spec->rank[0], spec->shape[0],
		    "shape");
	}
	if (v->u.list.n > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_EINVAL,
		    "padded_batch: shape lists %zu component shapes, more than "
		    "the maximum of %d components",
		    v->u.list.n, CACHEW_MAX_COMPONENTS);
	for (size_t c = 0; c < v->u.list.n; c++) {
		const cwi_value *item = &v->u.list.items[c];
		snprintf(what, sizeof(what), "the shape of component %zu", c);
		if (item->type != CWI_V_LIST)
			return cwi_fail(CACHEW_EINVAL,
			    "padded_batch: shape must be a list of integers or "
			    "a list of such lists (one per component); item %zu "
			    "is not a list",
			    c);
		rv = shape_from_list(item, &spec->rank[c], spec->shape[c], what);
		if (rv != CACHEW_OK)
			return rv;
	}
	spec->ncomp = v->u.list.n;
	return CACHEW_OK;
}

/* ---- the pad value ------------------------------------------------------ */

static uint16_t
f32_to_f16(float f)
{
	uint32_t x, man, exp, sign, h, rem, half;
	int32_t e;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000u;
	exp = (x >> 23) & 0xffu;
	man = x & 0x7fffffu;
	if (exp == 0xffu)
		return (uint16_t)(sign | 0x7c00u | (man != 0 ? 0x200u : 0));
	e = (int32_t)exp - 127 + 15;
	if (e >= 0x1f)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) {
		/* A half subnormal: man * 2^(exp-150) in units of 2^-24. */
		uint32_t shift;
		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000u;
		shift = (uint32_t)(14 - e);
		h = man >> shift;
		rem = man & ((1u << shift) - 1);
		half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1u)))
			h++;
		return (uint16_t)(sign | h);
	}
	h = ((uint32_t)e << 10) | (man >> 13);
	rem = man & 0x1fffu;
	/* Round to nearest even; a carry correctly bumps the exponent. */
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
		h++;
	return (uint16_t)(sign | h);
}

static uint16_t
f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static bool
integral_in(double v, double lo, double hi_excl)
{
	return v == floor(v) && v >= lo && v < hi_excl;
}

/* The bytes of pad_value as one value of dtype dt. */
static cachew_err
pad_bytes(double v, cachew_dtype dt, uint8_t *out, unsigned c, char *err,
    size_t errlen)
{
	bool ok = true;

	switch (dt) {
	case CACHEW_U8:
		ok = integral_in(v, 0, 256);
		if (ok)
			out[0] = (uint8_t)v;
		break;
	case CACHEW_I32:
		ok = integral_in(v, -2147483648.0, 2147483648.0);
		if (ok) {
			int32_t x = (int32_t)v;
			memcpy(out, &x, sizeof(x));
		}
		break;
	case CACHEW_I64:
		ok = integral_in(v, -9223372036854775808.0, 9223372036854775808.0);
		if (ok) {
			int64_t x = (int64_t)v;
			memcpy(out, &x, sizeof(x));
		}
		break;
	case CACHEW_F16: {
		uint16_t x = f32_to_f16((float)v);
		memcpy(out, &x, sizeof(x));
		break;
	}
	case CACHEW_BF16: {
		uint16_t x = f32_to_bf16((float)v);
		memcpy(out, &x, sizeof(x));
		break;
	}
	case CACHEW_F32: {
		float x = (float)v;
		memcpy(out, &x, sizeof(x));
		break;
	}
	case CACHEW_F64:
		memcpy(out, &v, sizeof(v));
		break;
	case CACHEW_BOOL:
		out[0] = v != 0 ? 1 : 0;
		break;
	default:
		snprintf(err, errlen, "component %u has an invalid dtype", c);
		return CACHEW_ETYPE;
	}
	if (!ok) {
		snprintf(err, errlen, "pad_value %g does not fit component %u's "
		    "dtype %s", v, c, cachew_dtype_name(dt));
		return CACHEW_EINVAL;
	}
	return CACHEW_OK;
}

/* ---- geometry: copying an element into its padded place ----------------- */

/*
 * An element's values, in row-major order, fall into runs along its last
 * dimension that stay contiguous in the padded layout. pad_runs walks them:
 * each run is `len` values starting at value `src` of the element and value
 * `dst` of the padded tensor (relative to the element's slot).
 */
typedef struct pad_runs {
	unsigned outer; /* dimensions walked by the odometer: rank - 1 */
	const int64_t *shape;
	int64_t idx[CACHEW_MAX_RANK];
	size_t stride[CACHEW_MAX_RANK]; /* padded strides, in values */
	size_t len, nruns, src, dst;
} pad_runs;

static void
runs_init(pad_runs *pr, unsigned rank, const int64_t *shape,
    const int64_t *target)
{
	size_t s = 1;

	pr->outer = rank > 0 ? rank - 1 : 0;
	pr->shape = shape;
	pr->len = rank > 0 ? (size_t)shape[rank - 1] : 1;
	pr->nruns = 1;
	for (unsigned d = rank; d-- > 0;) {
		pr->stride[d] = s;
		s *= (size_t)target[d];
	}
	for (unsigned d = 0; d < pr->outer; d++) {
		pr->idx[d] = 0;
		pr->nruns *= (size_t)shape[d];
	}
	if (pr->len == 0)
		pr->nruns = 0;
	pr->src = 0;
	pr->dst = 0;
}

static void
runs_advance(pad_runs *pr)
{
	pr->src += pr->len;
	for (unsigned d = pr->outer; d-- > 0;) {
		pr->idx[d]++;
		pr->dst += pr->stride[d];
		if (pr->idx[d] < pr->shape[d])
			return;
		pr->dst -= (size_t)pr->idx[d] * pr->stride[d];
		pr->idx[d] = 0;
	}
}

static void
fill_pattern(uint8_t *p, size_t nvalues, const uint8_t *value, size_t es)
{
	size_t done, total = nvalues * es;

	if (total == 0)
		return;
	memcpy(p, value, es);
	/* Doubling copies: log2(n) memcpy calls. */
	for (done = es; done < total; done *= 2)
		memcpy(p + done, p, done * 2 <= total ? done : total - done);
}

static cachew_err
pad_fixed(cwi_element *const *elems, size_t k, uint32_t c,
    const int64_t *target, const cwi_pad_spec *spec, cwi_tensor *dst,
    char *err, size_t errlen)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	cachew_dtype dt = (cachew_dtype)t0->dtype;
	unsigned rank = t0->rank;
	size_t es = cachew_dtype_size(dt), slot;
	int64_t shape[CACHEW_MAX_RANK];
	uint8_t padv[8] = {0}, *p;
	bool need_fill = false, zero = true;
	cachew_err rv;

	rv = pad_bytes(spec->npad > 0 ? spec->pad_values[c] : spec->pad_value,
	    dt, padv, c, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = 0; i < es; i++)
		zero = zero && padv[i] == 0;
	shape[0] = (int64_t)k;
	slot = 1;
	for (unsigned d = 0; d < rank; d++) {
		shape[d + 1] = target[d];
		slot *= (size_t)target[d];
	}
	for (size_t i = 0; i < k && !need_fill; i++)
		for (unsigned d = 0; d < rank; d++)
			need_fill = need_fill || elems[i]->comp[c].shape[d] != target[d];
	rv = cwi_tensor_init_alloc(dst, dt, rank + 1, shape, need_fill && zero, &p);
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "%s", cwi_errmsg_get());
		return rv;
	}
	if (need_fill && !zero)
		fill_pattern(p, k * slot, padv, es);
	for (size_t i = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		const uint8_t *src = cwi_tensor_data(t);
		uint8_t *base = p + i * slot * es;
		pad_runs pr;

		if (cwi_tensor_numel(t) == (int64_t)slot) {
			/* Each dimension is at most the target's, so an equal
			 * count means the same shape (or nothing to copy). */
			memcpy(base, src, slot * es);
			continue;
		}
		runs_init(&pr, rank, t->shape, target);
		for (size_t r = 0; r < pr.nruns; r++, runs_advance(&pr))
			memcpy(base + pr.dst * es, src + pr.src * es, pr.len * es);
	}
	return CACHEW_OK;
}

static cachew_err
pad_strings(cwi_element *const *elems, size_t k, uint32_t c,
    const int64_t *target, cwi_tensor *dst, char *err, size_t errlen)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	unsigned rank = t0->rank;
	size_t slot = 1, total = 0, n;
	cwi_buffer *data = NULL, *offs = NULL;
	uint64_t *o;
	pad_runs pr;
	cachew_err rv;

	for (unsigned d = 0; d < rank; d++)
		slot *= (size_t)target[d];
	n = k * slot;
	for (size_t i = 0; i < k; i++)
		total += cwi_tensor_nbytes(&elems[i]->comp[c]);
	rv = cwi_buffer_alloc(&data, total, false);
	if (rv == CACHEW_OK && n > 1)
		rv = cwi_buffer_alloc(&offs, (n + 1) * sizeof(uint64_t), false);
	if (rv != CACHEW_OK) {
		cwi_buffer_unref(data);
		snprintf(err, errlen, "%s", cwi_errmsg_get());
		return rv;
	}
	memset(dst, 0, sizeof(*dst));
	dst->dtype = CACHEW_BYTES;
	dst->rank = (uint8_t)(rank + 1);
	dst->shape[0] = (int64_t)k;
	for (unsigned d = 0; d < rank; d++)
		dst->shape[d + 1] = target[d];
	o = n > 1 ? (uint64_t *)offs->data : dst->inl.u64;
	/* Pass 1: string lengths at o[j + 1] (padding stays empty); then
	 * prefix sums turn them into offsets; pass 2 copies the bytes. */
	memset(o, 0, (n > 1 ? n + 1 : 2) * sizeof(uint64_t));
	for (size_t i = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		runs_init(&pr, rank, t->shape, target);
		for (size_t r = 0; r < pr.nruns; r++, runs_advance(&pr)) {
			for (size_t j = 0; j < pr.len; j++) {
				size_t len;
				(void)cwi_tensor_str(t, (int64_t)(pr.src + j), &len);
				o[i * slot + pr.dst + j + 1] = len;
			}
		}
	}
	for (size_t j = 0; j < n; j++)
		o[j + 1] += o[j];
	for (size_t i = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		runs_init(&pr, rank, t->shape, target);
		for (size_t r = 0; r < pr.nruns; r++, runs_advance(&pr)) {
			for (size_t j = 0; j < pr.len; j++) {
				size_t len;
				const uint8_t *s = cwi_tensor_str(t,
				    (int64_t)(pr.src + j), &len);
				if (len > 0)
					memcpy(data->data + o[i * slot + pr.dst + j],
					    s, len);
			}
		}
	}
	dst->buf = data;
	dst->obuf = offs;
	return CACHEW_OK;
}

/* ---- stacking with padding ---------------------------------------------- */

static void
shape_str(unsigned rank, const int64_t *shape, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "[");
	for (unsigned d = 0; d < rank && n < len; d++)
		n += (size_t)snprintf(buf + n, len - n, d ? ",%lld" : "%lld",
		    (long long)shape[d]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
}

/* The padded shape of component c: the batch maximum of each dimension,
 * or the requested size where the shape parameter gives one. */
static cachew_err
pad_target(cwi_element *const *elems, size_t k, uint32_t c,
    const cwi_pad_spec *spec, int64_t *target, char *err, size_t errlen)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	unsigned rank = t0->rank;
	char got[96], want[96];

	if (rank >= CACHEW_MAX_RANK) {
		snprintf(err, errlen,
		    "component %u already has the maximum rank %d", c,
		    CACHEW_MAX_RANK);
		return CACHEW_ETYPE;
	}
	for (unsigned d = 0; d < rank; d++)
		target[d] = 0;
	for (size_t i = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		if (t->dtype != t0->dtype || t->rank != rank) {
			snprintf(err, errlen,
			    "element %zu component %u is %s, expected the dtype "
			    "and rank of element 0's %s",
			    i, c, cwi_tensor_spec_str(t, got, sizeof(got)),
			    cwi_tensor_spec_str(t0, want, sizeof(want)));
			return CACHEW_ETYPE;
		}
		for (unsigned d = 0; d < rank; d++)
			if (t->shape[d] > target[d])
				target[d] = t->shape[d];
	}
	if (spec->ncomp == 0)
		return CACHEW_OK;
	size_t s = spec->shared ? 0 : c;
	if (spec->rank[s] != rank) {
		shape_str(spec->rank[s], spec->shape[s], want, sizeof(want));
		snprintf(err, errlen,
		    "component %u is %s but the padded shape %s has %u "
		    "dimensions",
		    c, cwi_tensor_spec_str(t0, got, sizeof(got)), want,
		    spec->rank[s]);
		return CACHEW_ETYPE;
	}
	for (unsigned d = 0; d < rank; d++) {
		if (spec->shape[s][d] < 0)
			continue;
		if (target[d] > spec->shape[s][d]) {
			size_t i = 0;
			while (elems[i]->comp[c].shape[d] <= spec->shape[s][d])
				i++;
			shape_str(rank, spec->shape[s], want, sizeof(want));
			snprintf(err, errlen,
			    "element %zu component %u is %s, larger than the "
			    "padded shape %s",
			    i, c,
			    cwi_tensor_spec_str(&elems[i]->comp[c], got,
				sizeof(got)),
			    want);
			return CACHEW_ERANGE;
		}
		target[d] = spec->shape[s][d];
	}
	return CACHEW_OK;
}

/* The padded batch must be addressable: k * prod(target) values, with room
 * for 8-byte values and string offsets; and its values (8-byte offsets
 * for strings) at most max_bytes. */
static cachew_err
pad_size_check(size_t k, const cwi_tensor *t0, const int64_t *target,
    uint32_t c, uint64_t max_bytes, char *err, size_t errlen)
{
	size_t es = t0->dtype == CACHEW_BYTES ? 8 : cwi_dtype_sizes[t0->dtype & 15];
	uint64_t n = k;
	char want[96];

	for (unsigned d = 0; d < t0->rank; d++) {
		if (__builtin_mul_overflow(n, (uint64_t)target[d], &n) ||
		    n > (SIZE_MAX >> 4)) {
			shape_str(t0->rank, target, want, sizeof(want));
			snprintf(err, errlen,
			    "a batch of %zu elements of shape %s (component %u) "
			    "is too large",
			    k, want, c);
			return CACHEW_ERANGE;
		}
	}
	if (n * es > max_bytes) {
		shape_str(t0->rank, target, want, sizeof(want));
		snprintf(err, errlen, "a batch of %zu elements padded to %s "
		    "(component %u) would take %llu bytes, over "
		    "max_element_bytes (%llu)", k, want, c,
		    (unsigned long long)(n * es), (unsigned long long)max_bytes);
		return CACHEW_ERANGE;
	}
	return CACHEW_OK;
}

cachew_err
cwi_stack_padded(cwi_element *const *elems, size_t k,
    const cwi_pad_spec *spec, uint64_t max_bytes, cwi_element **out,
    char *err, size_t errlen)
{
	const cwi_element *e0 = elems[0];
	int64_t target[CACHEW_MAX_RANK];
	cwi_element *res;
	cachew_err rv = CACHEW_OK;

	if (spec->ncomp > 0 && !spec->shared && spec->ncomp != e0->n) {
		snprintf(err, errlen,
		    "the shape parameter gives %zu component shapes but the "
		    "elements have %u components",
		    spec->ncomp, e0->n);
		return CACHEW_ETYPE;
	}
	if (spec->npad > 0 && spec->npad != e0->n) {
		snprintf(err, errlen,
		    "pad_value gives %zu values but the elements have %u "
		    "components",
		    spec->npad, e0->n);
		return CACHEW_ETYPE;
	}
	for (size_t i = 1; i < k; i++) {
		if (elems[i]->n != e0->n) {
			snprintf(err, errlen,
			    "element %zu has %u components, expected %u", i,
			    elems[i]->n, e0->n);
			return CACHEW_ETYPE;
		}
	}
	res = cwi_element_new(e0->n);
	if (res == NULL) {
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	for (uint32_t c = 0; c < e0->n && rv == CACHEW_OK; c++) {
		rv = pad_target(elems, k, c, spec, target, err, errlen);
		if (rv == CACHEW_OK)
			rv = pad_size_check(k, &e0->comp[c], target, c,
			    max_bytes, err, errlen);
		if (rv != CACHEW_OK)
			break;
		if (e0->comp[c].dtype == CACHEW_BYTES)
			rv = pad_strings(elems, k, c, target, &res->comp[c], err,
			    errlen);
		else
			rv = pad_fixed(elems, k, c, target, spec, &res->comp[c],
			    err, errlen);
	}
	if (rv != CACHEW_OK) {
		cwi_element_release(res);
		return rv;
	}
	*out = res;
	return CACHEW_OK;
}
