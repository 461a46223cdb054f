/*
 * fn_image.c - image map functions over libjpeg-turbo: decode_jpeg,
 * random_resized_crop (fused with decoding when its input is still JPEG
 * bytes), resize, center_crop, flip_left_right, normalize, transpose, and
 * the is_valid_jpeg filter. docs/preprocessing.md is their reference.
 *
 * Every function works on one component of the element, `component=0` by
 * default, and passes the others through untouched, so the output of
 * parse_example(image=..., label=...) goes through a whole augmentation
 * chain with its label. Images are u8 (or f32) tensors [H, W, C] or [H, W].
 *
 * Random functions draw only from cachew_op_ctx_random: their results are
 * a function of (pipeline seed, element index) at any parallelism.
 *
 * libjpeg reports errors by calling error_exit, which here longjmps back
 * to the setjmp of the decode job. Everything a job changes between its
 * setjmp and a longjmp lives in its dec_job struct (memory the caller
 * owns), never in locals of the function that called setjmp. A
 * decompressor is created per call: creating and destroying one costs
 * about 0.1 us (measured; a 500x375 decode takes about 2 ms), and it
 * leaves no per-thread state to free at thread exit.
 *
 * The states built by init are immutable and shared by all threads.
 */
#include "ops.h"

#include <assert.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <jerror.h>
#include <jpeglib.h>

/* ---- parameters (shared with fn_text.c through ops.h) ---------------------- */

cachew_err
cwi_fn_check_keys(const cachew_params *params, const char *known, char *err,
    size_t errlen)
{
	for (size_t i = 0; i < cachew_params_count(params); i++) {
		const char *k = cachew_params_key(params, i);
		size_t kl = strlen(k);
		const char *p = known;
		bool found = false;

		while (*p != '\0' && !found) {
			size_t nl = strcspn(p, ",");
			found = nl == kl && memcmp(p, k, kl) == 0;
			p += nl;
			while (*p == ',' || *p == ' ')
				p++;
		}
		if (!found) {
			snprintf(err, errlen,
			    "unknown parameter '%s' (parameters: %s)", k,
			    known[0] != '\0' ? known : "none");
			return CACHEW_EINVAL;
		}
	}
	return CACHEW_OK;
}

cachew_err
cwi_fn_get_int(const cachew_params *params, const char *key, int64_t def,
    int64_t min, int64_t max, int64_t *out, char *err, size_t errlen)
{
	cachew_err rv = cachew_params_get_int(params, key, out);

	if (rv == CACHEW_ENOENT) {
		*out = def;
		return CACHEW_OK;
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "parameter '%s' must be an integer", key);
		return CACHEW_EINVAL;
	}
	if (*out < min || *out > max) {
		snprintf(err, errlen, "parameter '%s' must be in [%lld, %lld], "
		    "not %lld", key, (long long)min, (long long)max,
		    (long long)*out);
		return CACHEW_ERANGE;
	}
	return CACHEW_OK;
}

cachew_err
cwi_fn_get_bool(const cachew_params *params, const char *key, bool def,
    bool *out, char *err, size_t errlen)
{
	int b = 0;
	cachew_err rv = cachew_params_get_bool(params, key, &b);

	if (rv == CACHEW_ENOENT) {
		*out = def;
		return CACHEW_OK;
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "parameter '%s' must be true or false", key);
		return CACHEW_EINVAL;
	}
	*out = b != 0;
	return CACHEW_OK;
}

/* A list of exactly `want` finite numbers (want == 0: 1 to cap of them). */
static cachew_err
get_double_list(const cachew_params *params, const char *key, double *out,
    size_t want, size_t cap, size_t *n, char *err, size_t errlen)
{
	size_t got = 0;
	cachew_err rv = cachew_params_get_double_list(params, key, out, cap,
	    &got);

	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "parameter '%s' must be a list of numbers",
		    key);
		return CACHEW_EINVAL;
	}
	if ((want != 0 && got != want) || got == 0 || got > cap) {
		if (want != 0)
			snprintf(err, errlen, "parameter '%s' needs %zu numbers, "
			    "got %zu", key, want, got);
		else
			snprintf(err, errlen, "parameter '%s' needs 1 to %zu "
			    "numbers, got %zu", key, cap, got);
		return CACHEW_EINVAL;
	}
	for (size_t i = 0; i < got; i++) {
		if (!isfinite(out[i])) {
			snprintf(err, errlen, "parameter '%s' must be finite",
			    key);
			return CACHEW_EINVAL;
		}
	}
	if (n != NULL)
		*n = got;
	return CACHEW_OK;
}

#define IMAGE_MAX_SIDE 65535 /* JPEG's own limit, and plenty for others */

/* size=224 (square) or size=[h, w]. */
static cachew_err
get_size(const cachew_params *params, const char *key, int64_t def,
    int64_t *h, int64_t *w, char *err, size_t errlen)
{
	int64_t v[2];
	size_t n = 0;
	cachew_err rv = cachew_params_get_int_list(params, key, v, 2, &n);

	if (rv == CACHEW_ENOENT) {
		*h = *w = def;
		return CACHEW_OK;
	}
	if (rv == CACHEW_OK && n == 1) {
		v[1] = v[0]; /* a single number: a square */
		n = 2;
	}
	if (rv != CACHEW_OK || n != 2) {
		snprintf(err, errlen,
		    "parameter '%s' must be an integer or [height, width]", key);
		return CACHEW_EINVAL;
	}
	if (v[0] < 1 || v[0] > IMAGE_MAX_SIDE || v[1] < 1 ||
	    v[1] > IMAGE_MAX_SIDE) {
		snprintf(err, errlen, "parameter '%s' must be in [1, %d]", key,
		    IMAGE_MAX_SIDE);
		return CACHEW_ERANGE;
	}
	*h = v[0];
	*w = v[1];
	return CACHEW_OK;
}

static void
free_state(void *state)
{
	free(state);
}

/* ---- images: component access ----------------------------------------------- */

/* Component `comp` of e, or a failure naming it. */
static cachew_err
image_component(cachew_op_ctx *ctx, cwi_element *e, int64_t comp,
    cwi_tensor **t)
{
	if ((uint64_t)comp >= e->n) {
		cachew_op_ctx_fail(ctx, "no component %lld: the element has %u",
		    (long long)comp, e->n);
		return CACHEW_EINVAL;
	}
	*t = &e->comp[comp];
	return CACHEW_OK;
}

/* An image: u8 or f32 (when `f32_ok`), [H, W, C] or [H, W]. */
static cachew_err
check_image(cachew_op_ctx *ctx, const cwi_tensor *t, int64_t comp,
    bool f32_ok)
{
	char spec[64];

	if ((t->dtype == CACHEW_U8 || (f32_ok && t->dtype == CACHEW_F32)) &&
	    (t->rank == 2 || t->rank == 3))
		return CACHEW_OK;
	cachew_op_ctx_fail(ctx, "component %lld is %s: expected an image, "
	    "%s [height, width, channels] or [height, width]", (long long)comp,
	    cwi_tensor_spec_str(t, spec, sizeof(spec)),
	    f32_ok ? "u8 or f32" : "u8");
	return CACHEW_ETYPE;
}

static int64_t
image_channels(const cwi_tensor *t)
{
	return t->rank == 3 ? t->shape[2] : 1;
}

/* Checks an image output of [h, w, c] values of dtype dt against the
 * pipeline's max_element_bytes before it is allocated (what: the
 * operation, for the message). CACHEW_ERANGE with the element's error. */
static cachew_err
image_check_size(cachew_op_ctx *ctx, const char *what, int64_t h, int64_t w,
    int64_t c, cachew_dtype dt)
{
	return cwi_op_ctx_check_bytes(ctx,
	    (uint64_t)h * (uint64_t)w * (uint64_t)c * cwi_dtype_sizes[dt & 15],
	    "%s [%lld, %lld, %lld] %s", what, (long long)h, (long long)w,
	    (long long)c, cachew_dtype_name(dt));
}

/* Replaces component t of e (unique) with res, or releases both on ENOMEM
 * paths handled by the caller. */
static void
replace_component(cwi_tensor *t, cwi_tensor *res)
{
	cwi_tensor_clear(t);
	*t = *res;
}

/* ---- bilinear resampling ------------------------------------------------------ */

/*
 * Half-pixel centers, no antialiasing: output pixel d of an axis samples
 * source coordinate origin + (d + 0.5) * extent / n - 0.5, clamped to
 * [lo, hi], between pixels floor(s) and floor(s) + 1 (clamped to hi).
 * This is torchvision's bilinear on tensors (align_corners=False,
 * antialias=False), OpenCV's INTER_LINEAR and tf.image.resize(bilinear,
 * antialias=False). The extent may be fractional: the fused crop samples
 * a box of the DCT-scaled image.
 */
typedef struct axis_plan {
	int32_t *i0, *i1; /* source pixel indices */
	float *w;         /* weight of i1 */
	int32_t *wq;      /* the same in 1/128ths (u8 images) */
	/* 3-channel u8 images along x only (SSE2): per output pixel the
	 * eight 16-bit factors {w0, w1, w0, w1, w0, w1, 0, 0} (16-aligned),
	 * and the number of leading pixels whose loads of 4 values at 3 * i0
	 * and at 3 * i0 + 3 stay inside the row (i0 <= hi - 2, so also i1 ==
	 * i0 + 1). */
	int16_t *wv;
	int64_t nv;
} axis_plan;

#define WQ_ONE 128 /* fixed-point weights: 7 bits */

static void
axis_plan_fill(axis_plan *a, int64_t n, double origin, double extent,
    int64_t lo, int64_t hi)
{
	double scale = extent / (double)n;

	for (int64_t d = 0; d < n; d++) {
		double s = origin + ((double)d + 0.5) * scale - 0.5;
		int64_t x0;

		if (s < (double)lo)
			s = (double)lo;
		if (s > (double)hi)
			s = (double)hi;
		x0 = (int64_t)floor(s);
		a->i0[d] = (int32_t)x0;
		a->i1[d] = (int32_t)(x0 < hi ? x0 + 1 : hi);
		a->w[d] = (float)(s - (double)x0);
		a->wq[d] = (int32_t)lrint((s - (double)x0) * WQ_ONE);
	}
}

#ifdef __SSE2__
/* Fills a->wv and a->nv from a filled plan of n pixels (see axis_plan). */
static void
axis_plan_fill_c3(axis_plan *a, int64_t n, int64_t hi)
{
	a->nv = 0;
	for (int64_t d = 0; d < n; d++) {
		int16_t w1 = (int16_t)a->wq[d], w0 = (int16_t)(WQ_ONE - w1);
		int16_t *v = a->wv + 8 * d;

		v[0] = v[2] = v[4] = w0;
		v[1] = v[3] = v[5] = w1;
		v[6] = v[7] = 0;
		if (a->i0[d] <= hi - 2)
			a->nv = d + 1; /* i0 is nondecreasing in d */
	}
}
#endif

/* One resampling: where to read and where to write. */
typedef struct resize_job {
	const uint8_t *src;  /* u8 or f32 values */
	size_t src_stride;   /* values per source row */
	bool f32;            /* src and dst are f32, else u8 */
	int64_t c;           /* channels */
	int64_t oh, ow;
	double x_origin, x_extent, y_origin, y_extent;
	int64_t x_lo, x_hi, y_lo, y_hi; /* source pixels that may be read */
	uint8_t *dst;
	/* Optional: source row y; NULL: src + y * stride. Rows are asked
	 * for in nondecreasing order except that the y-first resize asks for
	 * row y + 1 and then y: a row asked for is never before the one
	 * before the last asked for. A row pointer stays valid through a
	 * following call for the same row or the one before. */
	const uint8_t *(*row_at)(void *ctx, int64_t y);
	void *row_ctx;
} resize_job;

static const uint8_t *
source_row(const resize_job *j, int64_t row)
{
	size_t es = j->f32 ? sizeof(float) : 1;
	if (j->row_at != NULL)
		return j->row_at(j->row_ctx, row);
	return j->src + (size_t)row * j->src_stride * es;
}

/*
 * u8 images resample in fixed point: a row is first resampled along x
 * into 15-bit values (pixel * 128, at most 32640: they fit u16 and even
 * i16), then two such rows blend along y into 22 bits, rounded half up to
 * u8. The weights are exact for the simple fractions (1/4, 1/2, 3/4);
 * otherwise within 1/256 pixel of the float position, at most one level
 * off a float computation. 3-channel images under SSE2 blend along y
 * first (resize_run_c3): the same integers in another order.
 */
static void
resize_row_u8_c3(const uint8_t *r, const axis_plan *x, int64_t ow,
    uint16_t *out)
{
	for (int64_t d = 0; d < ow; d++) {
		const uint8_t *p0 = r + 3 * x->i0[d];
		const uint8_t *p1 = r + 3 * x->i1[d];
		int w1 = x->wq[d], w0 = WQ_ONE - w1;
		out[3 * d] = (uint16_t)(p0[0] * w0 + p1[0] * w1);
		out[3 * d + 1] = (uint16_t)(p0[1] * w0 + p1[1] * w1);
		out[3 * d + 2] = (uint16_t)(p0[2] * w0 + p1[2] * w1);
	}
}

static void
resize_row_u8(const resize_job *j, const axis_plan *x, int64_t row,
    uint16_t *out)
{
	const uint8_t *r = source_row(j, row);
	int64_t c = j->c, ow = j->ow;

	if (c == 3) {
		resize_row_u8_c3(r, x, ow, out);
		return;
	}
	for (int64_t d = 0; d < ow; d++) {
		const uint8_t *p0 = r + c * x->i0[d];
		const uint8_t *p1 = r + c * x->i1[d];
		int w1 = x->wq[d], w0 = WQ_ONE - w1;
		for (int64_t k = 0; k < c; k++)
			out[c * d + k] = (uint16_t)(p0[k] * w0 + p1[k] * w1);
	}
}

static void
resize_row_f32(const resize_job *j, const axis_plan *x, int64_t row,
    float *out)
{
	const float *r = (const float *)(const void *)source_row(j, row);
	int64_t c = j->c, ow = j->ow;

	for (int64_t d = 0; d < ow; d++) {
		const float *p0 = r + c * x->i0[d];
		const float *p1 = r + c * x->i1[d];
		for (int64_t k = 0; k < c; k++)
			out[c * d + k] = p0[k] + (p1[k] - p0[k]) * x->w[d];
	}
}

/* n u8 values (a * (128 - w1) + b * w1 + 8192) >> 14. */
static void
blend_rows_u8(const uint16_t *a, const uint16_t *b, uint32_t w1,
    uint8_t *o, size_t n)
{
	uint32_t w0 = WQ_ONE - w1;
	size_t k = 0;

#ifdef __SSE2__
	/* a and b interleaved as i16 pairs (they are below 2^15), one
	 * multiply-add per pair gives the exact 32-bit sum. */
	const __m128i w = _mm_set1_epi32((int)(w0 | w1 << 16));
	const __m128i half = _mm_set1_epi32(WQ_ONE * WQ_ONE / 2);
	for (; k + 16 <= n; k += 16) {
		__m128i a0 = _mm_loadu_si128((const __m128i *)(const void *)
		    (a + k));
		__m128i a1 = _mm_loadu_si128((const __m128i *)(const void *)
		    (a + k + 8));
		__m128i b0 = _mm_loadu_si128((const __m128i *)(const void *)
		    (b + k));
		__m128i b1 = _mm_loadu_si128((const __m128i *)(const void *)
		    (b + k + 8));
		__m128i s0 = _mm_madd_epi16(_mm_unpacklo_epi16(a0, b0), w);
		__m128i s1 = _mm_madd_epi16(_mm_unpackhi_epi16(a0, b0), w);
		__m128i s2 = _mm_madd_epi16(_mm_unpacklo_epi16(a1, b1), w);
		__m128i s3 = _mm_madd_epi16(_mm_unpackhi_epi16(a1, b1), w);
		s0 = _mm_srli_epi32(_mm_add_epi32(s0, half), 14);
		s1 = _mm_srli_epi32(_mm_add_epi32(s1, half), 14);
		s2 = _mm_srli_epi32(_mm_add_epi32(s2, half), 14);
		s3 = _mm_srli_epi32(_mm_add_epi32(s3, half), 14);
		_mm_storeu_si128((__m128i *)(void *)(o + k),
		    _mm_packus_epi16(_mm_packs_epi32(s0, s1),
			_mm_packs_epi32(s2, s3)));
	}
#endif
	for (; k < n; k++)
		o[k] = (uint8_t)((a[k] * w0 + b[k] * w1 +
		    WQ_ONE * WQ_ONE / 2) >> 14);
}

/* Output row d from the two resampled rows r0 (weight 1 - w) and r1. */
static void
blend_rows(const resize_job *j, const void *r0, const void *r1,
    const axis_plan *y, int64_t d)
{
	size_t rw = (size_t)(j->ow * j->c);

	if (j->f32) {
		const float *a = r0, *b = r1;
		float w = y->w[d];
		float *o = (float *)(void *)j->dst + (size_t)d * rw;
		for (size_t k = 0; k < rw; k++)
			o[k] = a[k] + (b[k] - a[k]) * w;
	} else {
		blend_rows_u8(r0, r1, (uint32_t)y->wq[d],
		    j->dst + (size_t)d * rw, rw);
	}
}

static void
resize_row(const resize_job *j, const axis_plan *x, int64_t row, void *out)
{
	if (j->f32)
		resize_row_f32(j, x, row, out);
	else
		resize_row_u8(j, x, row, out);
}

#ifdef __SSE2__
/*
 * 3-channel u8 images, y first: each output row is two source rows
 * blended, over the columns the x plan reads, into 15-bit values (16
 * bytes at a time), and then one pass along x takes each output pixel
 * from two of those per channel. Each output value is the sum over its
 * four source pixels of wy * wx * pixel, plus half, shifted by 14: the
 * same integer, exact in 32 bits, in whichever order the sum is taken,
 * so the output is bit for bit that of x first. But the x pass, one
 * pixel at a time, then runs once per output row instead of once per
 * source row read (up to two per output row), and its sums are rounded
 * to u8 16 at a time: resize's share of W2's CPU time 7.6 % -> 6.5 %
 * (perf record at one thread, means of 4 runs).
 */

/* acc[k] = r0[k] * (128 - w1) + r1[k] * w1 for k < n, 16 at a time. */
static void
vblend_u8(const uint8_t *r0, const uint8_t *r1, uint32_t w1, uint16_t *acc,
    size_t n)
{
	const __m128i zero = _mm_setzero_si128();
	const __m128i v0 = _mm_set1_epi16((short)(WQ_ONE - w1));
	const __m128i v1 = _mm_set1_epi16((short)w1);
	size_t k = 0;

	for (; k + 16 <= n; k += 16) {
		__m128i p = _mm_loadu_si128((const __m128i *)(const void *)
		    (r0 + k));
		__m128i q = _mm_loadu_si128((const __m128i *)(const void *)
		    (r1 + k));
		__m128i *a = (__m128i *)(void *)(acc + k);
		_mm_storeu_si128(a, _mm_add_epi16(
		    _mm_mullo_epi16(_mm_unpacklo_epi8(p, zero), v0),
		    _mm_mullo_epi16(_mm_unpacklo_epi8(q, zero), v1)));
		_mm_storeu_si128(a + 1, _mm_add_epi16(
		    _mm_mullo_epi16(_mm_unpackhi_epi8(p, zero), v0),
		    _mm_mullo_epi16(_mm_unpackhi_epi8(q, zero), v1)));
	}
	for (; k < n; k++)
		acc[k] = (uint16_t)(r0[k] * (WQ_ONE - w1) + r1[k] * w1);
}

/* The x pass of one output row: from acc, the y-blended values of the
 * source columns from byte c0 on, the ow * 3 sums of wx * value (below
 * 2^22) into sum. Per pixel the 4 values at 3 * i0 and the 4 at 3 * i1
 * (= 3 * i0 + 3), interleaved into channel pairs, by one multiply-add
 * with {w0, w1} x 3; the 16-byte store writes one sum past the pixel,
 * which the next pixel overwrites (sum has room for one more). */
static void
hpass_u8_c3(const uint16_t *acc, int64_t c0, const axis_plan *x,
    int64_t ow, int32_t *sum)
{
	int64_t d = 0;

	for (; d < x->nv; d++) {
		const uint16_t *a = acc + 3 * x->i0[d] - c0;
		__m128i p = _mm_unpacklo_epi16(
		    _mm_loadl_epi64((const __m128i *)(const void *)a),
		    _mm_loadl_epi64((const __m128i *)(const void *)(a + 3)));
		_mm_storeu_si128((__m128i *)(void *)(sum + 3 * d),
		    _mm_madd_epi16(p, _mm_load_si128((const __m128i *)(const
			void *)(x->wv + 8 * d))));
	}
	for (; d < ow; d++) {
		const uint16_t *a = acc + 3 * x->i0[d] - c0;
		const uint16_t *b = acc + 3 * x->i1[d] - c0;
		int32_t w1 = x->wq[d], w0 = WQ_ONE - w1;
		for (int k = 0; k < 3; k++)
			sum[3 * d + k] = a[k] * w0 + b[k] * w1;
	}
}

/* n u8 values (sum[k] + 8192) >> 14, 16 at a time. */
static void
round_sums_u8(const int32_t *sum, uint8_t *o, size_t n)
{
	const __m128i half = _mm_set1_epi32(WQ_ONE * WQ_ONE / 2);
	size_t k = 0;

	for (; k + 16 <= n; k += 16) {
		const __m128i *v = (const __m128i *)(const void *)(sum + k);
		__m128i s0 = _mm_srli_epi32(_mm_add_epi32(_mm_loadu_si128(v),
		    half), 14);
		__m128i s1 = _mm_srli_epi32(_mm_add_epi32(_mm_loadu_si128(v +
		    1), half), 14);
		__m128i s2 = _mm_srli_epi32(_mm_add_epi32(_mm_loadu_si128(v +
		    2), half), 14);
		__m128i s3 = _mm_srli_epi32(_mm_add_epi32(_mm_loadu_si128(v +
		    3), half), 14);
		_mm_storeu_si128((__m128i *)(void *)(o + k),
		    _mm_packus_epi16(_mm_packs_epi32(s0, s1),
			_mm_packs_epi32(s2, s3)));
	}
	for (; k < n; k++)
		o[k] = (uint8_t)((sum[k] + WQ_ONE * WQ_ONE / 2) >> 14);
}

/* The y-first resize of a 3-channel u8 job with filled plans; acc holds
 * resize_span_values(j) u16, sum 3 * ow + 4 i32. Of an output row's two
 * source rows, i1 is asked for first, then i0 (i1 is i0 or i0 + 1),
 * which the row source still has: both pointers stay valid until the
 * next call, and the rows asked for in all are those of x first. */
static void
resize_run_c3(const resize_job *j, const axis_plan *x, const axis_plan *y,
    uint16_t *acc, int32_t *sum)
{
	int64_t c0 = 3 * (int64_t)x->i0[0];
	size_t n = (size_t)(3 * (j->x_hi + 1) - c0);
	size_t rw = (size_t)(j->ow * 3);

	for (int64_t d = 0; d < j->oh; d++) {
		const uint8_t *r1 = source_row(j, y->i1[d]);
		const uint8_t *r0 = source_row(j, y->i0[d]);

		vblend_u8(r0 + c0, r1 + c0, (uint32_t)y->wq[d], acc, n);
		hpass_u8_c3(acc, c0, x, j->ow, sum);
		round_sums_u8(sum, j->dst + (size_t)d * rw, rw);
	}
}
#endif

/* Values of the y-blended row of resize_run_c3: the columns from x_lo to
 * x_hi, 3 values each. */
static size_t
resize_span_values(const resize_job *j)
{
	return (size_t)(3 * (j->x_hi - j->x_lo + 1));
}

/* Bytes of one resampled row in scratch: rw 4-byte values (f32, u16 or
 * the i32 sums of hpass_u8_c3), plus 16 bytes the 16-byte stores of
 * hpass_u8_c3 may touch, rounded up to keep the next row 16-aligned. */
static size_t
resize_row_bytes(const resize_job *j)
{
	return (4 * (size_t)(j->ow * j->c) + 16 + 15) & ~(size_t)15;
}

/* Bytes of scratch memory resize_run needs: x and y tables (4 words per
 * entry), up to 15 bytes to align what follows to 16, the x factors of
 * axis_plan.wv (16 bytes per output column), then two resampled rows
 * and the y-blended row of resize_run_c3. */
static size_t
resize_scratch_size(const resize_job *j)
{
	return 16 * (size_t)(j->ow + j->oh) + 15 + 16 * (size_t)j->ow +
	    2 * resize_row_bytes(j) + 2 * resize_span_values(j);
}

/* Runs a resize job in `scratch` (resize_scratch_size bytes, 4-aligned). */
static void
resize_run(const resize_job *j, void *scratch)
{
	size_t nx = (size_t)j->ow, ny = (size_t)j->oh;
	axis_plan x, y;
	void *r0, *r1;
	int64_t tag0 = -1, tag1 = -1;
	int32_t *mem = scratch;
	uint8_t *tail;

	x.i0 = mem;
	x.i1 = x.i0 + nx;
	x.wq = x.i1 + nx;
	x.w = (float *)(void *)(x.wq + nx);
	y.i0 = mem + 4 * nx;
	y.i1 = y.i0 + ny;
	y.wq = y.i1 + ny;
	y.w = (float *)(void *)(y.wq + ny);
	tail = (uint8_t *)(mem + 4 * (nx + ny));
	tail += (16 - (uintptr_t)tail % 16) % 16;
	x.wv = (int16_t *)(void *)tail;
	x.nv = 0;
	y.wv = NULL;
	y.nv = 0;
	r0 = tail + 16 * nx;
	r1 = (uint8_t *)r0 + resize_row_bytes(j);
	axis_plan_fill(&x, j->ow, j->x_origin, j->x_extent, j->x_lo, j->x_hi);
	axis_plan_fill(&y, j->oh, j->y_origin, j->y_extent, j->y_lo, j->y_hi);
#ifdef __SSE2__
	if (!j->f32 && j->c == 3) {
		axis_plan_fill_c3(&x, j->ow, j->x_hi);
		/* r0's room for 4 * ow * 3 + 16 bytes holds the sums. */
		resize_run_c3(j, &x, &y, (uint16_t *)(void *)((uint8_t *)r1 +
		    resize_row_bytes(j)), r0);
		return;
	}
#endif
	for (int64_t d = 0; d < j->oh; d++) {
		int64_t y0 = y.i0[d], y1 = y.i1[d];

		if (tag0 != y0) {
			if (tag1 == y0) {
				void *tr = r0;
				r0 = r1;
				r1 = tr;
				tag1 = tag0;
				tag0 = y0;
			} else {
				resize_row(j, &x, y0, r0);
				tag0 = y0;
			}
		}
		if (tag1 != y1) {
			resize_row(j, &x, y1, r1);
			tag1 = y1;
		}
		blend_rows(j, r0, r1, &y, d);
	}
}

/* Allocates res, an image of t's dtype and rank, [oh, ow(, c)]. */
static cachew_err
image_alloc_like(cwi_tensor *res, const cwi_tensor *t, int64_t oh, int64_t ow,
    uint8_t **data)
{
	int64_t shape[3] = {oh, ow, image_channels(t)};
	return cwi_tensor_init_alloc(res, (cachew_dtype)t->dtype, t->rank,
	    shape, false, data);
}

/* Resizes box (top, left, h, w) of image t into [oh, ow] at res. */
static cachew_err
resize_box(const cwi_tensor *t, int64_t top, int64_t left, int64_t h,
    int64_t w, int64_t oh, int64_t ow, cwi_tensor *res)
{
	resize_job j = {0};
	uint8_t *dst;
	void *scratch;
	cachew_err rv;

	rv = image_alloc_like(res, t, oh, ow, &dst);
	if (rv != CACHEW_OK)
		return rv;
	j.src = cwi_tensor_data(t);
	j.c = image_channels(t);
	j.f32 = t->dtype == CACHEW_F32;
	j.src_stride = (size_t)(t->shape[1] * j.c);
	j.oh = oh;
	j.ow = ow;
	j.x_origin = (double)left;
	j.x_extent = (double)w;
	j.x_lo = left;
	j.x_hi = left + w - 1;
	j.y_origin = (double)top;
	j.y_extent = (double)h;
	j.y_lo = top;
	j.y_hi = top + h - 1;
	j.dst = dst;
	scratch = malloc(resize_scratch_size(&j));
	if (scratch == NULL) {
		cwi_tensor_clear(res);
		return CACHEW_ENOMEM;
	}
	resize_run(&j, scratch);
	free(scratch);
	return CACHEW_OK;
}

/* ---- JPEG decoding ------------------------------------------------------------- */

/* 2^27 pixels (about 11585 x 11585): larger than any camera image, and it
 * bounds what a hostile header can make libjpeg allocate (~400 MB for a
 * progressive 4:4:4 file at the limit). */
#define CWI_JPEG_MAX_PIXELS ((uint64_t)1 << 27)

typedef struct dec_job {
	struct jpeg_decompress_struct cinfo; /* first: error_exit finds us */
	struct jpeg_error_mgr jerr;
	jmp_buf jb;
	bool created;
	bool have_out;
	cwi_tensor out;
	char msg[JMSG_LENGTH_MAX];
} dec_job;

static void
dec_error_exit(j_common_ptr cinfo)
{
	dec_job *job = (dec_job *)(void *)cinfo;
	(*cinfo->err->format_message)(cinfo, job->msg);
	longjmp(job->jb, 1);
}

/* Warnings are tolerated (libjpeg recovers from them, as PIL and TF do),
 * except a premature end of data: a truncated file is an error. */
static void
dec_emit_message(j_common_ptr cinfo, int level)
{
	if (level >= 0)
		return;
	if (cinfo->err->msg_code == JWRN_JPEG_EOF)
		dec_error_exit(cinfo);
	cinfo->err->num_warnings++;
}

static void
dec_job_prepare(dec_job *job)
{
	job->cinfo.err = jpeg_std_error(&job->jerr);
	job->jerr.error_exit = dec_error_exit;
	job->jerr.emit_message = dec_emit_message;
	job->created = false;
	job->have_out = false;
	job->msg[0] = '\0';
}

static void
dec_job_finish(dec_job *job)
{
	if (job->created)
		jpeg_destroy_decompress(&job->cinfo);
	job->created = false;
}

/* After setjmp: creates the decompressor and reads the header. */
static void
dec_open(dec_job *job, const uint8_t *data, size_t len)
{
	jpeg_create_decompress(&job->cinfo);
	job->created = true;
	jpeg_mem_src(&job->cinfo, data, (unsigned long)len);
	(void)jpeg_read_header(&job->cinfo, TRUE);
	/* The header's dimensions come from outside: a few hundred bytes can
	 * declare 30000 x 30000, which libjpeg would allocate for (progressive
	 * files buffer every coefficient). Refuse before any of that. */
	if ((uint64_t)job->cinfo.image_width * job->cinfo.image_height >
	    CWI_JPEG_MAX_PIXELS) {
		snprintf(job->msg, sizeof(job->msg),
		    "image of %u x %u pixels is larger than the limit of %llu "
		    "pixels", job->cinfo.image_width, job->cinfo.image_height,
		    (unsigned long long)CWI_JPEG_MAX_PIXELS);
		longjmp(job->jb, 1);
	}
}

/* channels 0: as stored (gray stays gray, anything else RGB). */
static int
dec_set_channels(dec_job *job, int64_t channels)
{
	if (channels == 1 ||
	    (channels == 0 && job->cinfo.num_components == 1)) {
		job->cinfo.out_color_space = JCS_GRAYSCALE;
		return 1;
	}
	job->cinfo.out_color_space = JCS_RGB;
	return 3;
}

/* Reads `rows` scanlines into dst, `stride` bytes apart. */
static void
dec_read_rows(dec_job *job, uint8_t *dst, size_t stride, JDIMENSION rows)
{
	JSAMPROW ptr[16];
	JDIMENSION done = 0;

	while (done < rows) {
		JDIMENSION k = rows - done < 16 ? rows - done : 16, got;
		for (JDIMENSION i = 0; i < k; i++)
			ptr[i] = dst + (size_t)(done + i) * stride;
		got = jpeg_read_scanlines(&job->cinfo, ptr, k);
		if (got == 0)
			ERREXIT(&job->cinfo, JERR_INPUT_EMPTY);
		done += got;
	}
}

/* Decodes the whole image straight into job->out. CACHEW_ECORRUPT with
 * job->msg on bad data, CACHEW_ENOMEM when the output cannot be had. */
static cachew_err
decode_full(dec_job *job, const uint8_t *data, size_t len, int64_t channels,
    cachew_op_ctx *ctx)
{
	int64_t shape[3];
	uint8_t *dst;
	int c;

	if (setjmp(job->jb) != 0)
		return CACHEW_ECORRUPT;
	dec_open(job, data, len);
	c = dec_set_channels(job, channels);
	jpeg_start_decompress(&job->cinfo);
	shape[0] = job->cinfo.output_height;
	shape[1] = job->cinfo.output_width;
	shape[2] = c;
	if (image_check_size(ctx, "decoding to", shape[0], shape[1], c,
		CACHEW_U8) != CACHEW_OK)
		return CACHEW_ERANGE;
	if (cwi_tensor_init_alloc(&job->out, CACHEW_U8, 3, shape, false,
		&dst) != CACHEW_OK)
		return CACHEW_ENOMEM;
	job->have_out = true;
	dec_read_rows(job, dst, (size_t)(shape[1] * c),
	    job->cinfo.output_height);
	(void)jpeg_finish_decompress(&job->cinfo);
	return CACHEW_OK;
}

/* The JPEG bytes of component comp: a bytes scalar. */
static cachew_err
jpeg_bytes(cachew_op_ctx *ctx, const cwi_tensor *t, int64_t comp,
    const uint8_t **data, size_t *len)
{
	char spec[64];

	if (t->dtype != CACHEW_BYTES || cwi_tensor_numel(t) != 1) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: expected the "
		    "JPEG file as a bytes scalar", (long long)comp,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		return CACHEW_ETYPE;
	}
	*data = cwi_tensor_str(t, 0, len);
	return CACHEW_OK;
}

static cachew_err
dec_fail(cachew_op_ctx *ctx, dec_job *job, cachew_err rv, size_t len)
{
	if (job->have_out)
		cwi_tensor_clear(&job->out);
	job->have_out = false;
	if (rv == CACHEW_ENOMEM)
		cachew_op_ctx_fail(ctx, "out of memory for the decoded image");
	else if (rv != CACHEW_ERANGE) /* its message is in ctx */
		cachew_op_ctx_fail(ctx, "corrupt JPEG (%zu bytes): %s", len,
		    job->msg[0] != '\0' ? job->msg : "bad data");
	return rv;
}

/* ---- decode_jpeg ------------------------------------------------------------- */

typedef struct decode_state {
	int64_t channels;
	int64_t component;
} decode_state;

static cachew_err
decode_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	decode_state *s;
	int64_t ch = 3, comp = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "channels, component", err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "channels", 3, 0, 3, &ch, err,
		    errlen);
	if (rv == CACHEW_OK && ch == 2) {
		snprintf(err, errlen, "parameter 'channels' must be 0 (as "
		    "stored), 1 (gray) or 3 (RGB), not 2");
		rv = CACHEW_EINVAL;
	}
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->channels = ch;
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

static cachew_err
decode_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const decode_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	const uint8_t *data;
	cwi_tensor *t;
	dec_job job;
	size_t len;
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv == CACHEW_OK)
		rv = jpeg_bytes(ctx, t, s->component, &data, &len);
	if (rv != CACHEW_OK)
		goto fail;
	dec_job_prepare(&job);
	rv = decode_full(&job, data, len, s->channels, ctx);
	dec_job_finish(&job);
	if (rv != CACHEW_OK) {
		dec_fail(ctx, &job, rv, len);
		goto fail;
	}
	replace_component(t, &job.out);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_decode_jpeg = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "decode_jpeg",
    .doc = "decode_jpeg(channels=3, component=0): decodes JPEG bytes to u8 [H, W, C] (channels 0 = as stored); corrupt data is ECORRUPT",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 2000000,
    .init = decode_init,
    .fini = free_state,
    .map = decode_map,
};

/* ---- is_valid_jpeg --------------------------------------------------------------- */

/* After setjmp: reads the header only. */
static cachew_err
check_header(dec_job *job, const uint8_t *data, size_t len)
{
	if (setjmp(job->jb) != 0)
		return CACHEW_ECORRUPT;
	dec_open(job, data, len);
	return CACHEW_OK;
}

/*
 * Keeps elements whose component holds a JPEG with a readable header that
 * ends in an EOI marker: it drops other files and truncated JPEGs at the
 * cost of a header parse (microseconds). Damaged entropy data is only
 * found by decoding: decode_jpeg then fails with ECORRUPT.
 */
static cachew_err
is_valid_jpeg_filter(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	const decode_state *s = cachew_op_ctx_state(ctx);
	const cwi_tensor *t;
	const uint8_t *data;
	dec_job job;
	size_t len;
	cachew_err rv;

	*keep = 0;
	if ((uint64_t)s->component >= in->n)
		return cachew_op_ctx_fail(ctx, "no component %lld: the element "
		    "has %u", (long long)s->component, in->n);
	t = &in->comp[s->component];
	if (t->dtype != CACHEW_BYTES || cwi_tensor_numel(t) != 1)
		return CACHEW_OK;
	data = cwi_tensor_str(t, 0, &len);
	/* EOI, possibly followed by padding zeros some writers add. */
	while (len > 2 && data[len - 1] == 0)
		len--;
	if (len < 4 || data[len - 2] != 0xff || data[len - 1] != 0xd9)
		return CACHEW_OK;
	dec_job_prepare(&job);
	rv = check_header(&job, data, len);
	dec_job_finish(&job);
	*keep = rv == CACHEW_OK;
	return CACHEW_OK;
}

static cachew_err
is_valid_jpeg_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	decode_state *s;
	int64_t comp = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "component", err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->channels = 0;
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

const cachew_op_def cwi_fn_is_valid_jpeg = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "is_valid_jpeg",
    .doc = "is_valid_jpeg(component=0): filter keeping JPEG bytes whose header parses and that end in EOI (drops truncated files)",
    .kind = CACHEW_OP_FILTER,
    .cost_ns = 5000,
    .init = is_valid_jpeg_init,
    .fini = free_state,
    .filter = is_valid_jpeg_filter,
};

/* ---- random_resized_crop ---------------------------------------------------------- */

typedef struct rrc_state {
	int64_t oh, ow;
	double scale[2];
	double log_ratio[2];
	double ratio[2];
	int64_t channels;
	int64_t component;
} rrc_state;

typedef struct crop_box {
	int64_t top, left, h, w;
} crop_box;

static double
uniform(cachew_op_ctx *ctx, double lo, double hi)
{
	double u = (double)(cachew_op_ctx_random(ctx) >> 11) * 0x1p-53;
	return lo + (hi - lo) * u;
}

/* Uniform in [0, n), n > 0 (the modulo bias is below 2^-40 here). */
static int64_t
below(cachew_op_ctx *ctx, int64_t n)
{
	return (int64_t)(cachew_op_ctx_random(ctx) % (uint64_t)n);
}

/* Python's round(): to nearest, ties to even (the default FP mode). */
static int64_t
round_even(double x)
{
	return (int64_t)nearbyint(x);
}

/*
 * torchvision.transforms.RandomResizedCrop.get_params: up to 10 draws of
 * an area fraction in scale and a log-uniform aspect ratio in ratio; the
 * first box that fits is placed uniformly. Otherwise the whole image,
 * center-cropped to the nearest ratio bound.
 */
static void
rrc_sample(const rrc_state *s, cachew_op_ctx *ctx, int64_t H, int64_t W,
    crop_box *b)
{
	double area = (double)H * (double)W, in_ratio;

	for (int attempt = 0; attempt < 10; attempt++) {
		double target = area * uniform(ctx, s->scale[0], s->scale[1]);
		double aspect = exp(uniform(ctx, s->log_ratio[0],
		    s->log_ratio[1]));
		int64_t w = round_even(sqrt(target * aspect));
		int64_t h = round_even(sqrt(target / aspect));

		if (w > 0 && w <= W && h > 0 && h <= H) {
			b->h = h;
			b->w = w;
			b->top = below(ctx, H - h + 1);
			b->left = below(ctx, W - w + 1);
			return;
		}
	}
	in_ratio = (double)W / (double)H;
	if (in_ratio < s->ratio[0]) {
		b->w = W;
		b->h = round_even((double)W / s->ratio[0]);
	} else if (in_ratio > s->ratio[1]) {
		b->h = H;
		b->w = round_even((double)H * s->ratio[1]);
	} else {
		b->w = W;
		b->h = H;
	}
	if (b->h < 1)
		b->h = 1;
	if (b->w < 1)
		b->w = 1;
	b->top = (H - b->h) / 2;
	b->left = (W - b->w) / 2;
}

static cachew_err
rrc_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	rrc_state *s;
	double scale[2] = {0.08, 1.0}, ratio[2] = {0.75, 4.0 / 3.0};
	int64_t oh, ow, ch = 3, comp = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "size, scale, ratio, channels, "
	    "component", err, errlen);
	if (rv == CACHEW_OK)
		rv = get_size(params, "size", 224, &oh, &ow, err, errlen);
	if (rv == CACHEW_OK && cachew_params_has(params, "scale"))
		rv = get_double_list(params, "scale", scale, 2, 2, NULL, err,
		    errlen);
	if (rv == CACHEW_OK && cachew_params_has(params, "ratio"))
		rv = get_double_list(params, "ratio", ratio, 2, 2, NULL, err,
		    errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "channels", 3, 0, 3, &ch, err,
		    errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	if (!(scale[0] > 0 && scale[0] <= scale[1]) ||
	    !(ratio[0] > 0 && ratio[0] <= ratio[1]) || ch == 2) {
		snprintf(err, errlen, "need 0 < scale[0] <= scale[1], 0 < "
		    "ratio[0] <= ratio[1] and channels 0, 1 or 3");
		return CACHEW_EINVAL;
	}
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->oh = oh;
	s->ow = ow;
	memcpy(s->scale, scale, sizeof(scale));
	memcpy(s->ratio, ratio, sizeof(ratio));
	s->log_ratio[0] = log(ratio[0]);
	s->log_ratio[1] = log(ratio[1]);
	s->channels = ch;
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

/*
 * The smallest DCT scaling n/8 that keeps the crop at least the output
 * size (so the resize never upsamples what full decoding would not), of
 * 1/8, 2/8, 4/8 and 8/8 only: libjpeg-turbo has SIMD inverse DCTs for
 * those, while 3/8 and 5/8 to 7/8 run plain C code that is slower than a
 * full 8/8 decode (measured on 500x375 4:2:0 images: 5/8 takes 1.4x the
 * time of 8/8).
 */
static int
dct_scale_for(const crop_box *b, int64_t oh, int64_t ow)
{
	for (int n = 1; n < 8; n *= 2)
		if (b->w * n >= ow * 8 && b->h * n >= oh * 8)
			return n;
	return 8;
}

/* The decoder as a row source for resize_run: STREAM_ROWS scanlines at a
 * time (libjpeg is slower when asked for one) into a small buffer that
 * stays in cache. No row asked for is before the one before the last
 * row asked for (resize_job.row_at), so a refill only moves forward,
 * keeping one row. A libjpeg error longjmps out of resize_run, whose
 * scratch memory is libjpeg's and goes with the decompressor. */
#define STREAM_ROWS 16

typedef struct row_stream {
	dec_job *job;
	uint8_t *rows;  /* 1 + STREAM_ROWS rows of `stride` bytes */
	size_t stride;
	int64_t base;   /* the row in rows[0], counted from the first kept */
	int64_t filled; /* rows in the buffer */
	int64_t total;  /* rows to read in all */
} row_stream;

static const uint8_t *
stream_row(void *ctx, int64_t y)
{
	row_stream *rs = ctx;

	/* A strong downscale asks for rows more than a buffer apart: refill
	 * until y is in the buffer, reading the rows between (rare enough
	 * that skipping is not worth another libjpeg state to reason about).
	 * A refill keeps the last row read in rows[0]: the y-first resize
	 * asks for a row and the next, then maybe for the first again. */
	while (y >= rs->base + rs->filled) {
		int64_t next = rs->base + rs->filled, n, keep;
		n = rs->total - next;
		if (n <= 0)
			ERREXIT(&rs->job->cinfo, JERR_INPUT_EMPTY);
		keep = rs->filled > 0 ? 1 : 0;
		if (keep)
			memcpy(rs->rows, rs->rows + (size_t)(rs->filled - 1) *
			    rs->stride, rs->stride);
		n = n < STREAM_ROWS ? n : STREAM_ROWS;
		dec_read_rows(rs->job, rs->rows + (size_t)keep * rs->stride,
		    rs->stride, (JDIMENSION)n);
		rs->base = next - keep;
		rs->filled = n + keep;
	}
	assert(y >= rs->base);
	return rs->rows + (size_t)(y - rs->base) * rs->stride;
}

/*
 * The fused path: reads the header, samples the crop, then decodes only
 * the crop: DCT-domain scaling by n/8, jpeg_crop_scanline for the columns
 * (widened to iMCU boundaries), jpeg_skip_scanlines for the rows above,
 * stopping after the last row needed. The box is mapped into the scaled
 * image (fractional) and resampled from there.
 */
static cachew_err
decode_crop(dec_job *job, const uint8_t *data, size_t len,
    const rrc_state *s, cachew_op_ctx *ctx)
{
	struct jpeg_decompress_struct *ci = &job->cinfo;
	JDIMENSION xoff, cw;
	resize_job j = {0};
	crop_box b;
	double fx, fy, bx, by, bw, bh;
	int64_t xlo, xhi, ylo, yhi, shape[3];
	size_t stride;
	row_stream rs;
	int c;

	if (setjmp(job->jb) != 0)
		return CACHEW_ECORRUPT;
	dec_open(job, data, len);
	c = dec_set_channels(job, s->channels);
	rrc_sample(s, ctx, ci->image_height, ci->image_width, &b);
	ci->scale_num = (unsigned)dct_scale_for(&b, s->oh, s->ow);
	ci->scale_denom = 8;
	jpeg_start_decompress(ci);
	fx = (double)ci->output_width / (double)ci->image_width;
	fy = (double)ci->output_height / (double)ci->image_height;
	bx = (double)b.left * fx;
	bw = (double)b.w * fx;
	by = (double)b.top * fy;
	bh = (double)b.h * fy;
	xlo = (int64_t)floor(bx);
	xhi = (int64_t)ceil(bx + bw) - 1;
	if (xhi > (int64_t)ci->output_width - 1)
		xhi = (int64_t)ci->output_width - 1;
	if (xhi < xlo)
		xhi = xlo;
	ylo = (int64_t)floor(by);
	yhi = (int64_t)ceil(by + bh) - 1;
	if (yhi > (int64_t)ci->output_height - 1)
		yhi = (int64_t)ci->output_height - 1;
	if (yhi < ylo)
		yhi = ylo;
	xoff = (JDIMENSION)xlo;
	cw = (JDIMENSION)(xhi - xlo + 1);
	/* One more column when the image has it: the last column of a
	 * cropped decode is upsampled from a chroma sample libjpeg-turbo 2.1
	 * did not decode (valgrind: uninitialised bytes of its main buffer),
	 * so the columns we sample must all be interior. */
	if ((JDIMENSION)xhi + 1 < ci->output_width)
		cw++;
	jpeg_crop_scanline(ci, &xoff, &cw);
	stride = (size_t)cw * (size_t)c;
	/* The resize reads only bytes libjpeg wrote: the columns up to xhi
	 * of rows read (no vector load goes past them), so no zeroing. */
	rs.rows = (*ci->mem->alloc_large)((j_common_ptr)ci, JPOOL_IMAGE,
	    stride * (STREAM_ROWS + 1));
	if (ylo > 0)
		(void)jpeg_skip_scanlines(ci, (JDIMENSION)ylo);
	rs.job = job;
	rs.stride = stride;
	rs.base = 0;
	rs.filled = 0;
	rs.total = yhi - ylo + 1;

	shape[0] = s->oh;
	shape[1] = s->ow;
	shape[2] = c;
	if (image_check_size(ctx, "a crop resized to", s->oh, s->ow, c,
		CACHEW_U8) != CACHEW_OK)
		return CACHEW_ERANGE;
	if (cwi_tensor_init_alloc(&job->out, CACHEW_U8, 3, shape, false,
		&j.dst) != CACHEW_OK)
		return CACHEW_ENOMEM;
	job->have_out = true;
	j.row_at = stream_row;
	j.row_ctx = &rs;
	j.src_stride = stride;
	j.c = c;
	j.oh = s->oh;
	j.ow = s->ow;
	j.x_origin = bx - (double)xoff;
	j.x_extent = bw;
	j.x_lo = xlo - (int64_t)xoff;
	j.x_hi = xhi - (int64_t)xoff;
	j.y_origin = by - (double)ylo;
	j.y_extent = bh;
	j.y_lo = 0;
	j.y_hi = yhi - ylo;
	resize_run(&j, (*ci->mem->alloc_large)((j_common_ptr)ci, JPOOL_IMAGE,
			   resize_scratch_size(&j)));
	return CACHEW_OK;
}

static cachew_err
rrc_decoded(cachew_op_ctx *ctx, const rrc_state *s, cwi_tensor *t)
{
	cwi_tensor res;
	crop_box b;
	cachew_err rv;

	rv = check_image(ctx, t, s->component, true);
	if (rv != CACHEW_OK)
		return rv;
	if (t->shape[0] < 1 || t->shape[1] < 1) {
		cachew_op_ctx_fail(ctx, "empty image [%lld, %lld]",
		    (long long)t->shape[0], (long long)t->shape[1]);
		return CACHEW_ERANGE;
	}
	rv = image_check_size(ctx, "a crop resized to", s->oh, s->ow,
	    image_channels(t), (cachew_dtype)t->dtype);
	if (rv != CACHEW_OK)
		return rv;
	rrc_sample(s, ctx, t->shape[0], t->shape[1], &b);
	rv = resize_box(t, b.top, b.left, b.h, b.w, s->oh, s->ow, &res);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		return rv;
	}
	replace_component(t, &res);
	return CACHEW_OK;
}

static cachew_err
rrc_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const rrc_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	const uint8_t *data;
	cwi_tensor *t;
	dec_job job;
	size_t len;
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv != CACHEW_OK)
		goto fail;
	if (t->dtype != CACHEW_BYTES) {
		rv = rrc_decoded(ctx, s, t);
		if (rv != CACHEW_OK)
			goto fail;
		*out = e;
		return CACHEW_OK;
	}
	rv = jpeg_bytes(ctx, t, s->component, &data, &len);
	if (rv != CACHEW_OK)
		goto fail;
	dec_job_prepare(&job);
	rv = decode_crop(&job, data, len, s, ctx);
	dec_job_finish(&job);
	if (rv != CACHEW_OK) {
		dec_fail(ctx, &job, rv, len);
		goto fail;
	}
	replace_component(t, &job.out);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_random_resized_crop = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "random_resized_crop",
    .doc = "random_resized_crop(size=224, scale=[0.08, 1.0], ratio=[0.75, 1.3333], channels=3, component=0): torchvision's random crop + bilinear resize; on JPEG bytes fused with decoding (decodes only the crop, DCT-scaled)",
    .kind = CACHEW_OP_MAP,
    .flags = CACHEW_OP_RANDOM,
    .cost_ns = 1000000,
    .init = rrc_init,
    .fini = free_state,
    .map = rrc_map,
};

/* ---- resize / center_crop ----------------------------------------------------------- */

typedef struct hw_state {
	int64_t h, w;
	int64_t component;
} hw_state;

static cachew_err
hw_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	hw_state *s;
	int64_t h = 0, w = 0, comp = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "h, w, component", err, errlen);
	if (rv == CACHEW_OK && (!cachew_params_has(params, "h") ||
				   !cachew_params_has(params, "w"))) {
		snprintf(err, errlen, "missing required parameter '%s'",
		    cachew_params_has(params, "h") ? "w" : "h");
		rv = CACHEW_EINVAL;
	}
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "h", 0, 1, IMAGE_MAX_SIDE, &h, err,
		    errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "w", 0, 1, IMAGE_MAX_SIDE, &w, err,
		    errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->h = h;
	s->w = w;
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

static cachew_err
resize_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const hw_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	cwi_tensor *t, res;
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv == CACHEW_OK)
		rv = check_image(ctx, t, s->component, true);
	if (rv == CACHEW_OK && (t->shape[0] < 1 || t->shape[1] < 1)) {
		cachew_op_ctx_fail(ctx, "empty image [%lld, %lld]",
		    (long long)t->shape[0], (long long)t->shape[1]);
		rv = CACHEW_ERANGE;
	}
	if (rv != CACHEW_OK)
		goto fail;
	if (t->shape[0] == s->h && t->shape[1] == s->w) {
		*out = e;
		return CACHEW_OK;
	}
	rv = image_check_size(ctx, "resizing to", s->h, s->w, image_channels(t),
	    (cachew_dtype)t->dtype);
	if (rv != CACHEW_OK)
		goto fail;
	rv = resize_box(t, 0, 0, t->shape[0], t->shape[1], s->h, s->w, &res);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	replace_component(t, &res);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_resize = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "resize",
    .doc = "resize(h, w, component=0): bilinear resize of a u8/f32 [H, W(, C)] image, half-pixel centers, no antialiasing",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 300000,
    .init = hw_init,
    .fini = free_state,
    .map = resize_map,
};

static cachew_err
center_crop_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const hw_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	cwi_tensor *t, res;
	int64_t top, left;
	size_t px, row;
	const uint8_t *src;
	uint8_t *dst;
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv == CACHEW_OK)
		rv = check_image(ctx, t, s->component, true);
	if (rv == CACHEW_OK && (t->shape[0] < s->h || t->shape[1] < s->w)) {
		cachew_op_ctx_fail(ctx, "cannot crop [%lld, %lld] from an image "
		    "of [%lld, %lld]", (long long)s->h, (long long)s->w,
		    (long long)t->shape[0], (long long)t->shape[1]);
		rv = CACHEW_ERANGE;
	}
	if (rv != CACHEW_OK)
		goto fail;
	/* torchvision: int(round((H - h) / 2.0)), ties to even. */
	top = round_even((double)(t->shape[0] - s->h) / 2.0);
	left = round_even((double)(t->shape[1] - s->w) / 2.0);
	rv = image_alloc_like(&res, t, s->h, s->w, &dst);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	px = (size_t)image_channels(t) * cwi_dtype_sizes[t->dtype];
	row = (size_t)t->shape[1] * px;
	src = cwi_tensor_data(t) + (size_t)top * row + (size_t)left * px;
	for (int64_t y = 0; y < s->h; y++)
		memcpy(dst + (size_t)y * (size_t)s->w * px,
		    src + (size_t)y * row, (size_t)s->w * px);
	replace_component(t, &res);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_center_crop = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "center_crop",
    .doc = "center_crop(h, w, component=0): the central h x w of a [H, W(, C)] image (torchvision's rounding); larger than the image is ERANGE",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 20000,
    .init = hw_init,
    .fini = free_state,
    .map = center_crop_map,
};

/* ---- flip_left_right -------------------------------------------------------------------- */

typedef struct flip_state {
	double p;
	int64_t component;
} flip_state;

static cachew_err
flip_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	flip_state *s;
	double p = 0.5;
	int64_t comp = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "p, component", err, errlen);
	if (rv == CACHEW_OK && cachew_params_has(params, "p") &&
	    (cachew_params_get_double(params, "p", &p) != CACHEW_OK ||
		!(p >= 0 && p <= 1))) {
		snprintf(err, errlen, "parameter 'p' must be a number in [0, 1]");
		rv = CACHEW_EINVAL;
	}
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->p = p;
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

/* Reverses the px-byte pixels of each of `rows` rows of w pixels. */
static void
flip_rows(uint8_t *p, int64_t rows, int64_t w, size_t px)
{
	size_t row = (size_t)w * px;

	for (int64_t y = 0; y < rows; y++) {
		uint8_t *a = p + (size_t)y * row, *b = a + row - px;
		if (px == 3) {
			for (; a < b; a += 3, b -= 3) {
				uint8_t t0 = a[0], t1 = a[1], t2 = a[2];
				a[0] = b[0];
				a[1] = b[1];
				a[2] = b[2];
				b[0] = t0;
				b[1] = t1;
				b[2] = t2;
			}
			continue;
		}
		for (; a < b; a += px, b -= px) {
			for (size_t k = 0; k < px; k++) {
				uint8_t t = a[k];
				a[k] = b[k];
				b[k] = t;
			}
		}
	}
}

static cachew_err
flip_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const flip_state *s = cachew_op_ctx_state(ctx);
	/* One draw per element whatever p is: the stream stays aligned. */
	double u = uniform(ctx, 0.0, 1.0);
	cwi_element *e = cwi_element_make_unique(in);
	cwi_tensor *t;
	size_t es;
	uint8_t *p;
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv == CACHEW_OK && (t->dtype == CACHEW_BYTES ||
				   (t->rank != 2 && t->rank != 3))) {
		char spec[64];
		cachew_op_ctx_fail(ctx, "component %lld is %s: expected an "
		    "image [height, width(, channels)]", (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		rv = CACHEW_ETYPE;
	}
	if (rv != CACHEW_OK)
		goto fail;
	if (!(u < s->p) || cwi_tensor_numel(t) == 0) {
		*out = e;
		return CACHEW_OK;
	}
	if (cwi_tensor_make_mutable(t, &p) != CACHEW_OK) {
		rv = cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	es = cwi_dtype_sizes[t->dtype];
	flip_rows(p, t->shape[0], t->shape[1], es * (size_t)image_channels(t));
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_flip_left_right = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "flip_left_right",
    .doc = "flip_left_right(p=0.5, component=0): mirrors a [H, W(, C)] image along W with probability p, seeded per element",
    .kind = CACHEW_OP_MAP,
    .flags = CACHEW_OP_RANDOM,
    .cost_ns = 20000,
    .init = flip_init,
    .fini = free_state,
    .map = flip_map,
};

/* ---- normalize ---------------------------------------------------------------------------- */

#define NORM_MAX_CHANNELS 16

typedef struct normalize_state {
	size_t n; /* 1 (broadcast) or the channel count */
	double mean[NORM_MAX_CHANNELS], std[NORM_MAX_CHANNELS];
	int64_t axis;
	int64_t component;
	bool channels_first; /* [.., H, W, C] in, [.., C, H, W] out */
	float lut[NORM_MAX_CHANNELS][256]; /* u8 input: per channel */
} normalize_state;

static cachew_err
normalize_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	normalize_state *s;
	double mean[NORM_MAX_CHANNELS], sd[NORM_MAX_CHANNELS];
	size_t nm = 0, ns = 0;
	int64_t axis = -1, comp = 0;
	bool chw = false;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "mean, std, axis, component, "
	    "channels_first", err, errlen);
	if (rv == CACHEW_OK && (!cachew_params_has(params, "mean") ||
				   !cachew_params_has(params, "std"))) {
		snprintf(err, errlen, "missing required parameter '%s'",
		    cachew_params_has(params, "mean") ? "std" : "mean");
		rv = CACHEW_EINVAL;
	}
	if (rv == CACHEW_OK)
		rv = get_double_list(params, "mean", mean, 0, NORM_MAX_CHANNELS,
		    &nm, err, errlen);
	if (rv == CACHEW_OK)
		rv = get_double_list(params, "std", sd, 0, NORM_MAX_CHANNELS,
		    &ns, err, errlen);
	if (rv == CACHEW_OK && nm != ns) {
		snprintf(err, errlen, "'mean' has %zu values and 'std' %zu: "
		    "they must match", nm, ns);
		rv = CACHEW_EINVAL;
	}
	for (size_t i = 0; rv == CACHEW_OK && i < ns; i++) {
		if (sd[i] == 0) {
			snprintf(err, errlen, "'std' must not be zero");
			rv = CACHEW_EINVAL;
		}
	}
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "axis", -1, -CACHEW_MAX_RANK,
		    CACHEW_MAX_RANK - 1, &axis, err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_bool(params, "channels_first", false, &chw, err,
		    errlen);
	if (rv == CACHEW_OK && chw && axis != -1) {
		snprintf(err, errlen, "channels_first needs the channels last "
		    "(axis=-1)");
		rv = CACHEW_EINVAL;
	}
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->n = nm;
	memcpy(s->mean, mean, nm * sizeof(double));
	memcpy(s->std, sd, nm * sizeof(double));
	s->axis = axis;
	s->component = comp;
	s->channels_first = chw;
	for (size_t k = 0; k < nm; k++)
		for (int v = 0; v < 256; v++)
			s->lut[k][v] = (float)(((double)v / 255.0 - mean[k]) /
			    sd[k]);
	*state = s;
	return CACHEW_OK;
}

/* u8 -> f32 by table, for `outer` blocks of c channels of `inner` values. */
static void
normalize_u8(const normalize_state *s, const uint8_t *src, float *dst,
    int64_t outer, int64_t c, int64_t inner)
{
	if (inner == 1 && c == 3 && s->n == 3) {
		const float *l0 = s->lut[0], *l1 = s->lut[1], *l2 = s->lut[2];
		for (int64_t i = 0; i < outer; i++) {
			dst[3 * i] = l0[src[3 * i]];
			dst[3 * i + 1] = l1[src[3 * i + 1]];
			dst[3 * i + 2] = l2[src[3 * i + 2]];
		}
		return;
	}
	for (int64_t o = 0; o < outer; o++) {
		for (int64_t k = 0; k < c; k++) {
			const float *l = s->lut[s->n == 1 ? 0 : k];
			size_t base = (size_t)((o * c + k) * inner);
			for (int64_t i = 0; i < inner; i++)
				dst[base + (size_t)i] = l[src[base + (size_t)i]];
		}
	}
}

/* One RGB image of `spatial` pixels into its three planes, four pixels
 * at a time: the table lookups stay scalar (SSE2 has no gather), but the
 * planes are written 16 bytes at a time from one read of the pixels
 * instead of three strided passes (60 -> 50 us per 224 x 224 crop alone;
 * normalize's share of W2's CPU time 6.1-6.6 % -> 4.4-4.5 %, perf record
 * at one thread). The same table values, bit for bit. */
static void
normalize_u8_rgb_planes(const normalize_state *s, const uint8_t *in,
    float *p0, float *p1, float *p2, int64_t spatial)
{
	const float *l0 = s->lut[0];
	const float *l1 = s->lut[s->n == 1 ? 0 : 1];
	const float *l2 = s->lut[s->n == 1 ? 0 : 2];
	int64_t p = 0;

#ifdef __SSE2__
	for (; p + 4 <= spatial; p += 4) {
		const uint8_t *q = in + 3 * p;
		_mm_storeu_ps(p0 + p,
		    _mm_set_ps(l0[q[9]], l0[q[6]], l0[q[3]], l0[q[0]]));
		_mm_storeu_ps(p1 + p,
		    _mm_set_ps(l1[q[10]], l1[q[7]], l1[q[4]], l1[q[1]]));
		_mm_storeu_ps(p2 + p,
		    _mm_set_ps(l2[q[11]], l2[q[8]], l2[q[5]], l2[q[2]]));
	}
#endif
	for (; p < spatial; p++) {
		p0[p] = l0[in[3 * p]];
		p1[p] = l1[in[3 * p + 1]];
		p2[p] = l2[in[3 * p + 2]];
	}
}

/* Channels last in, first out, in the same pass: `outer` images of
 * `spatial` pixels of c channels become c planes per image. */
static void
normalize_u8_chw(const normalize_state *s, const uint8_t *src, float *dst,
    int64_t outer, int64_t c, int64_t spatial)
{
	if (c == 3) {
		for (int64_t o = 0; o < outer; o++) {
			float *p0 = dst + (size_t)(o * 3 * spatial);
			normalize_u8_rgb_planes(s, src + (size_t)(o * 3 *
			    spatial), p0, p0 + spatial, p0 + 2 * spatial,
			    spatial);
		}
		return;
	}
	for (int64_t o = 0; o < outer; o++) {
		const uint8_t *in = src + (size_t)(o * spatial * c);
		for (int64_t k = 0; k < c; k++) {
			const float *l = s->lut[s->n == 1 ? 0 : k];
			float *plane = dst + (size_t)((o * c + k) * spatial);
			for (int64_t p = 0; p < spatial; p++)
				plane[p] = l[in[p * c + k]];
		}
	}
}

static void
normalize_f32_chw(const normalize_state *s, const float *src, float *dst,
    int64_t outer, int64_t c, int64_t spatial)
{
	for (int64_t o = 0; o < outer; o++) {
		const float *in = src + (size_t)(o * spatial * c);
		for (int64_t k = 0; k < c; k++) {
			size_t ch = s->n == 1 ? 0 : (size_t)k;
			double m = s->mean[ch], sd = s->std[ch];
			float *plane = dst + (size_t)((o * c + k) * spatial);
			for (int64_t p = 0; p < spatial; p++)
				plane[p] = (float)(((double)in[p * c + k] - m) / sd);
		}
	}
}

static void
normalize_f32(const normalize_state *s, const float *src, float *dst,
    int64_t outer, int64_t c, int64_t inner)
{
	for (int64_t o = 0; o < outer; o++) {
		for (int64_t k = 0; k < c; k++) {
			size_t ch = s->n == 1 ? 0 : (size_t)k;
			double m = s->mean[ch], sd = s->std[ch];
			size_t base = (size_t)((o * c + k) * inner);
			for (int64_t i = 0; i < inner; i++)
				dst[base + (size_t)i] = (float)(((double)src[
				    base + (size_t)i] - m) / sd);
		}
	}
}

static cachew_err
normalize_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const normalize_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	int64_t axis, outer = 1, inner = 1, c;
	cwi_tensor *t, res;
	uint8_t *dst;
	char spec[64];
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv != CACHEW_OK)
		goto fail;
	axis = s->axis < 0 ? s->axis + t->rank : s->axis;
	if ((t->dtype != CACHEW_U8 && t->dtype != CACHEW_F32) || axis < 0 ||
	    axis >= t->rank) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: expected u8 or "
		    "f32 with a channel axis %lld", (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)),
		    (long long)s->axis);
		rv = CACHEW_ETYPE;
		goto fail;
	}
	c = t->shape[axis];
	if (s->n != 1 && (int64_t)s->n != c) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: %lld channels "
		    "on axis %lld, but mean and std have %zu values",
		    (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)), (long long)c,
		    (long long)axis, s->n);
		rv = CACHEW_ETYPE;
		goto fail;
	}
	if (s->channels_first && t->rank < 3) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: channels_first "
		    "needs [.., H, W, C]", (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		rv = CACHEW_ETYPE;
		goto fail;
	}
	rv = cwi_op_ctx_check_bytes(ctx, (uint64_t)cwi_tensor_numel(t) * 4,
	    "normalizing %lld values to f32", (long long)cwi_tensor_numel(t));
	if (rv != CACHEW_OK)
		goto fail;
	for (int64_t i = 0; i < axis; i++)
		outer *= t->shape[i];
	for (int64_t i = axis + 1; i < t->rank; i++)
		inner *= t->shape[i];
	if (s->channels_first) {
		/* [.., H, W, C] -> [.., C, H, W]; images = outer / (H*W). */
		int64_t shape[CACHEW_MAX_RANK];
		int64_t spatial = t->shape[t->rank - 3] * t->shape[t->rank - 2];
		memcpy(shape, t->shape, sizeof(shape));
		shape[t->rank - 3] = c;
		shape[t->rank - 2] = t->shape[t->rank - 3];
		shape[t->rank - 1] = t->shape[t->rank - 2];
		rv = cwi_tensor_init_alloc(&res, CACHEW_F32, t->rank, shape,
		    false, &dst);
		if (rv != CACHEW_OK) {
			cachew_op_ctx_fail(ctx, "out of memory");
			goto fail;
		}
		if (t->dtype == CACHEW_U8)
			normalize_u8_chw(s, cwi_tensor_data(t),
			    (float *)(void *)dst, outer / spatial, c, spatial);
		else
			normalize_f32_chw(s,
			    (const float *)(const void *)cwi_tensor_data(t),
			    (float *)(void *)dst, outer / spatial, c, spatial);
		replace_component(t, &res);
		*out = e;
		return CACHEW_OK;
	}
	rv = cwi_tensor_init_alloc(&res, CACHEW_F32, t->rank, t->shape, false,
	    &dst);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	if (t->dtype == CACHEW_U8)
		normalize_u8(s, cwi_tensor_data(t), (float *)(void *)dst, outer,
		    c, inner);
	else
		normalize_f32(s, (const float *)(const void *)cwi_tensor_data(t),
		    (float *)(void *)dst, outer, c, inner);
	replace_component(t, &res);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_normalize = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "normalize",
    .doc = "normalize(mean, std, axis=-1, channels_first=false, component=0): f32 (x/255 - mean)/std for u8, (x - mean)/std for f32, per channel along axis; channels_first also moves [.., H, W, C] to [.., C, H, W]",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 100000,
    .init = normalize_init,
    .fini = free_state,
    .map = normalize_map,
};

/* ---- transpose --------------------------------------------------------------------------- */

typedef struct transpose_state {
	size_t rank;
	int64_t perm[CACHEW_MAX_RANK];
	int64_t component;
} transpose_state;

static cachew_err
transpose_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	transpose_state *s;
	int64_t perm[CACHEW_MAX_RANK] = {2, 0, 1}, comp = 0;
	size_t n = 3;
	unsigned seen = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "perm, component", err, errlen);
	if (rv == CACHEW_OK && cachew_params_has(params, "perm") &&
	    (cachew_params_get_int_list(params, "perm", perm, CACHEW_MAX_RANK,
		 &n) != CACHEW_OK ||
		n > CACHEW_MAX_RANK)) {
		snprintf(err, errlen, "parameter 'perm' must be a list of at "
		    "most %d axes", CACHEW_MAX_RANK);
		rv = CACHEW_EINVAL;
	}
	for (size_t i = 0; rv == CACHEW_OK && i < n; i++) {
		if (perm[i] < 0 || perm[i] >= (int64_t)n ||
		    (seen & (1u << perm[i])) != 0) {
			snprintf(err, errlen, "parameter 'perm' must be a "
			    "permutation of 0..%zu", n - 1);
			rv = CACHEW_EINVAL;
		} else {
			seen |= 1u << perm[i];
		}
	}
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->rank = n;
	memcpy(s->perm, perm, sizeof(perm));
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

/* Copies src into dst in output order: output axis i reads source axis
 * perm[i], so its source stride is stride[perm[i]]. */
static void
transpose_copy(const uint8_t *src, uint8_t *dst, unsigned rank,
    const int64_t *oshape, const size_t *ostride_src, size_t es)
{
	int64_t idx[CACHEW_MAX_RANK] = {0};
	int64_t inner = oshape[rank - 1], outer = 1;
	size_t istride = ostride_src[rank - 1], off = 0;

	for (unsigned i = 0; i + 1 < rank; i++)
		outer *= oshape[i];
	for (int64_t o = 0; o < outer; o++) {
		const uint8_t *p = src + off;
		switch (es) {
		case 1:
			for (int64_t i = 0; i < inner; i++)
				dst[i] = p[(size_t)i * istride];
			break;
		case 4:
			for (int64_t i = 0; i < inner; i++)
				memcpy(dst + 4 * i, p + (size_t)i * istride, 4);
			break;
		default:
			for (int64_t i = 0; i < inner; i++)
				memcpy(dst + (size_t)i * es,
				    p + (size_t)i * istride, es);
			break;
		}
		dst += (size_t)inner * es;
		/* Odometer over the outer output axes. */
		for (int d = (int)rank - 2; d >= 0; d--) {
			off += ostride_src[d];
			if (++idx[d] < oshape[d])
				break;
			off -= ostride_src[d] * (size_t)oshape[d];
			idx[d] = 0;
		}
	}
}

static cachew_err
transpose_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const transpose_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	int64_t oshape[CACHEW_MAX_RANK];
	size_t stride[CACHEW_MAX_RANK], ostride[CACHEW_MAX_RANK], es;
	bool identity = true;
	cwi_tensor *t, res;
	uint8_t *dst;
	char spec[64];
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	rv = image_component(ctx, e, s->component, &t);
	if (rv != CACHEW_OK)
		goto fail;
	if (t->dtype == CACHEW_BYTES || t->rank != s->rank) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: expected a "
		    "fixed-width tensor of rank %zu", (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)), s->rank);
		rv = CACHEW_ETYPE;
		goto fail;
	}
	es = cwi_dtype_sizes[t->dtype];
	for (int d = (int)s->rank - 1; d >= 0; d--)
		stride[d] = d == (int)s->rank - 1 ? es
		    : stride[d + 1] * (size_t)t->shape[d + 1];
	for (size_t i = 0; i < s->rank; i++) {
		oshape[i] = t->shape[s->perm[i]];
		ostride[i] = stride[s->perm[i]];
		identity = identity && s->perm[i] == (int64_t)i;
	}
	if (identity || s->rank == 0) {
		*out = e;
		return CACHEW_OK;
	}
	rv = cwi_tensor_init_alloc(&res, (cachew_dtype)t->dtype, t->rank,
	    oshape, false, &dst);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	if (cwi_tensor_numel(t) > 0)
		transpose_copy(cwi_tensor_data(t), dst, t->rank, oshape,
		    ostride, es);
	replace_component(t, &res);
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_transpose = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "transpose",
    .doc = "transpose(perm=[2, 0, 1], component=0): permutes the axes of a tensor (HWC -> CHW by default), any rank up to 8",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 100000,
    .init = transpose_init,
    .fini = free_state,
    .map = transpose_map,
};

/* ---- dataset-operator aliases: `decode_jpeg(...)` is map(decode_jpeg, ...) --- */

/* Positional values of an alias bind to its function's leading parameters,
 * in the order its doc gives them: `center_crop(224, 224)` is
 * center_crop(h=224, w=224). */
static const char *const decode_jpeg_pos1[] = {"channels"};
static const char *const random_resized_crop_pos1[] = {"size"};
static const char *const resize_pos1[] = {"h"};
static const char *const resize_pos2[] = {"h", "w"};
static const char *const center_crop_pos1[] = {"h"};
static const char *const center_crop_pos2[] = {"h", "w"};
static const char *const flip_left_right_pos1[] = {"p"};
static const char *const normalize_pos1[] = {"mean"};
static const char *const normalize_pos2[] = {"mean", "std"};
static const char *const transpose_pos1[] = {"perm"};

const cwi_dataset_op cwi_op_decode_jpeg = {
    .name = "decode_jpeg",
    .doc = "decodes the JPEG bytes of component 0 to u8 [H, W, C] (map(decode_jpeg))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "decode_jpeg",
    .positional = {NULL, decode_jpeg_pos1},
};

const cwi_dataset_op cwi_op_random_resized_crop = {
    .name = "random_resized_crop",
    .doc = "torchvision's RandomResizedCrop, fused with decoding on JPEG bytes (map(random_resized_crop))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "random_resized_crop",
    .positional = {NULL, random_resized_crop_pos1},
};

const cwi_dataset_op cwi_op_resize = {
    .name = "resize",
    .doc = "bilinear resize of an image (map(resize))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "resize",
    .positional = {NULL, resize_pos1, resize_pos2},
};

const cwi_dataset_op cwi_op_center_crop = {
    .name = "center_crop",
    .doc = "the central part of an image (map(center_crop))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "center_crop",
    .positional = {NULL, center_crop_pos1, center_crop_pos2},
};

const cwi_dataset_op cwi_op_flip_left_right = {
    .name = "flip_left_right",
    .doc = "random horizontal flip of an image (map(flip_left_right))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "flip_left_right",
    .positional = {NULL, flip_left_right_pos1},
};

const cwi_dataset_op cwi_op_normalize = {
    .name = "normalize",
    .doc = "per-channel (x - mean) / std to f32 (map(normalize))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "normalize",
    .positional = {NULL, normalize_pos1, normalize_pos2},
};

const cwi_dataset_op cwi_op_transpose = {
    .name = "transpose",
    .doc = "permutes the axes of a component (map(transpose))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "transpose",
    .positional = {NULL, transpose_pos1},
};
