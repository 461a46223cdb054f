/*
 * check_image.c - the image and text preprocessing functions (fn_image.c,
 * fn_text.c): decode_jpeg against TurboJPEG's own decoder, corrupt input,
 * random_resized_crop (shape, determinism, sampling statistics, fused vs
 * unfused), exact values of resize, center_crop, flip_left_right,
 * normalize, transpose, tokenize and pad_truncate. JPEGs are made here
 * with tjCompress2.
 */
#include "cwt.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <xxhash.h>

/* ---- helpers --------------------------------------------------------------- */

/* A smooth RGB image with mild noise: JPEG-friendly, like a photo. */
static unsigned char *
make_rgb(int w, int h, unsigned seed)
{
	unsigned char *p = malloc((size_t)w * h * 3);
	uint32_t r = seed * 2654435761u + 1;

	ck_assert_ptr_nonnull(p);
	for (int y = 0; y < h; y++) {
		for (int x = 0; x < w; x++) {
			unsigned char *q = p + ((size_t)y * w + x) * 3;
			int n;
			r = r * 1664525u + 1013904223u;
			n = (int)(r >> 29) - 4;
			q[0] = (unsigned char)(x * 200 / w + 20 + n);
			q[1] = (unsigned char)(y * 200 / h + 20 + n);
			q[2] = (unsigned char)((x + y) * 100 / (w + h) + 80 + n);
		}
	}
	return p;
}

/* JPEG of an RGB image at quality 90 with the given chroma subsampling
 * and flags (TJFLAG_PROGRESSIVE); free with free(). */
static unsigned char *
encode_jpeg_as(const unsigned char *rgb, int w, int h, int subsamp,
    int flags, size_t *len)
{
	tjhandle tj = tjInitCompress();
	unsigned char *buf = NULL, *out;
	unsigned long size = 0;

	ck_assert_ptr_nonnull(tj);
	ck_assert_int_eq(tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &buf, &size,
			     subsamp, 90, flags),
	    0);
	out = malloc(size);
	ck_assert_ptr_nonnull(out);
	memcpy(out, buf, size);
	tjFree(buf);
	tjDestroy(tj);
	*len = size;
	return out;
}

/* 4:2:0 baseline, the common case. */
static unsigned char *
encode_jpeg(const unsigned char *rgb, int w, int h, size_t *len)
{
	return encode_jpeg_as(rgb, w, h, TJSAMP_420, 0, len);
}

/* Writes `count` JPEGs of w x h (seeds 1..count) as dir/img<i>.jpg. */
static void
write_jpegs(const char *dir, int count, int w, int h)
{
	for (int i = 0; i < count; i++) {
		unsigned char *rgb = make_rgb(w, h, (unsigned)i + 1), *jpg;
		char path[512];
		size_t len;
		jpg = encode_jpeg(rgb, w, h, &len);
		snprintf(path, sizeof(path), "%s/img%03d.jpg", dir, i);
		cwt_write_file(path, jpg, len);
		free(jpg);
		free(rgb);
	}
}

/* Runs a pipeline that must succeed; "%s" in fmt is the directory. */
static cachew_element **
run_ok(const char *dir, const char *fmt, int64_t seed, int threads,
    size_t *n)
{
	char pipeline[2048], err[512] = "";
	cachew_options *o = cwt_opts(seed, threads);
	cachew_element **v = NULL;
	cachew_err rv;

	snprintf(pipeline, sizeof(pipeline), fmt, dir);
	rv = cwt_run(pipeline, o, &v, n, err, sizeof(err));
	cachew_options_destroy(o);
	ck_assert_msg(rv == CACHEW_OK, "%s: %s (%s)", pipeline,
	    cachew_strerror(rv), err);
	return v;
}

static const cachew_tensor *
comp(cachew_element *e, size_t c)
{
	const cachew_tensor *t = cachew_element_component(e, c);
	ck_assert_ptr_nonnull(t);
	return t;
}

static void
assert_shape(const cachew_tensor *t, cachew_dtype dt, unsigned rank,
    int64_t d0, int64_t d1, int64_t d2)
{
	const int64_t *s = cachew_tensor_shape(t);
	int64_t want[3] = {d0, d1, d2};
	ck_assert_int_eq(cachew_tensor_dtype(t), dt);
	ck_assert_uint_eq(cachew_tensor_rank(t), rank);
	for (unsigned i = 0; i < rank && i < 3; i++)
		ck_assert_int_eq(s[i], want[i]);
}

static bool
same_data(const cachew_tensor *a, const cachew_tensor *b)
{
	return cachew_tensor_nbytes(a) == cachew_tensor_nbytes(b) &&
	    memcmp(cachew_tensor_data(a), cachew_tensor_data(b),
		cachew_tensor_nbytes(a)) == 0;
}

static double
mean_abs_diff(const cachew_tensor *a, const cachew_tensor *b)
{
	const uint8_t *p = cachew_tensor_data(a), *q = cachew_tensor_data(b);
	size_t n = cachew_tensor_nbytes(a);
	double sum = 0;

	ck_assert_uint_eq(n, cachew_tensor_nbytes(b));
	for (size_t i = 0; i < n; i++)
		sum += fabs((double)p[i] - (double)q[i]);
	return sum / (double)n;
}

/* ---- decode_jpeg ------------------------------------------------------------- */

START_TEST(decode_jpeg_matches_turbojpeg)
{
	char *dir = cwt_tmpdir();
	unsigned char *rgb = make_rgb(67, 45, 7), *jpg, *ref;
	tjhandle tj = tjInitDecompress();
	cachew_element **v;
	size_t n, len;
	char path[512];

	jpg = encode_jpeg(rgb, 67, 45, &len);
	snprintf(path, sizeof(path), "%s/a.jpg", dir);
	cwt_write_file(path, jpg, len);
	ref = malloc(67 * 45 * 3);
	ck_assert_int_eq(tjDecompress2(tj, jpg, len, ref, 67, 0, 45, TJPF_RGB,
			     0),
	    0);
	v = run_ok(dir, "list_files(\"%s/a.jpg\") | read_file | decode_jpeg",
	    1, 1, &n);
	ck_assert_uint_eq(n, 1);
	assert_shape(comp(v[0], 0), CACHEW_U8, 3, 45, 67, 3);
	ck_assert(memcmp(cachew_tensor_data(comp(v[0], 0)), ref,
		      67 * 45 * 3) == 0);
	cwt_free(v, n);
	/* Gray: the luma plane, as TurboJPEG gives it. */
	ck_assert_int_eq(tjDecompress2(tj, jpg, len, ref, 67, 0, 45, TJPF_GRAY,
			     0),
	    0);
	v = run_ok(dir, "list_files(\"%s/a.jpg\") | read_file | "
	    "decode_jpeg(channels=1)", 1, 1, &n);
	assert_shape(comp(v[0], 0), CACHEW_U8, 3, 45, 67, 1);
	ck_assert(memcmp(cachew_tensor_data(comp(v[0], 0)), ref, 67 * 45) == 0);
	cwt_free(v, n);
	tjDestroy(tj);
	free(ref);
	free(jpg);
	free(rgb);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(decode_jpeg_keeps_other_components)
{
	char *dir = cwt_tmpdir();
	cachew_element **v;
	size_t n;

	write_jpegs(dir, 3, 32, 24);
	/* (image bytes, label), as parse_example(image=..., label=...)
	 * gives; also the stage form equals map(decode_jpeg). */
	v = run_ok(dir, "zip(list_files(\"%s/*.jpg\", shuffle=false) | "
	    "read_file, range(10, 13)) | map(decode_jpeg, channels=3)", 1, 1,
	    &n);
	ck_assert_uint_eq(n, 3);
	for (size_t i = 0; i < n; i++) {
		assert_shape(comp(v[i], 0), CACHEW_U8, 3, 24, 32, 3);
		ck_assert_int_eq(cwt_i64(v[i], 1), 10 + (int64_t)i);
	}
	cwt_free(v, n);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Runs `pipeline` (with "%s" = dir), which must fail with `want`. */
/* A pipeline that must fail ("%s" in fmt is dir), with opts (NULL: the
 * defaults). */
static void
run_fails_with(const cachew_options *opts, const char *dir, const char *fmt,
    cachew_err want, const char *msg_part)
{
	char pipeline[1024];

	snprintf(pipeline, sizeof(pipeline), fmt, dir);
	cwt_run_fails(pipeline, opts, want, msg_part);
}

static void
run_fails(const char *dir, const char *fmt, cachew_err want,
    const char *msg_part)
{
	run_fails_with(NULL, dir, fmt, want, msg_part);
}

START_TEST(decode_jpeg_corrupt_is_an_error)
{
	char *dir = cwt_tmpdir(), path[512];
	unsigned char *rgb = make_rgb(64, 64, 3), *jpg;
	size_t len;

	jpg = encode_jpeg(rgb, 64, 64, &len);
	snprintf(path, sizeof(path), "%s/a_good.jpg", dir);
	cwt_write_file(path, jpg, len);
	snprintf(path, sizeof(path), "%s/b_trunc.jpg", dir);
	cwt_write_file(path, jpg, len / 2);
	snprintf(path, sizeof(path), "%s/c_text.jpg", dir);
	cwt_write_file(path, "not a jpeg at all", 17);
	run_fails(dir, "list_files(\"%s/b_trunc.jpg\") | read_file | "
	    "decode_jpeg", CACHEW_ECORRUPT, "corrupt JPEG");
	run_fails(dir, "list_files(\"%s/*.jpg\", shuffle=false) | read_file | "
	    "decode_jpeg", CACHEW_ECORRUPT, "(element 1)");
	run_fails(dir, "list_files(\"%s/c_text.jpg\") | read_file | "
	    "decode_jpeg", CACHEW_ECORRUPT, "corrupt JPEG (17 bytes)");
	/* The fused path reports the same way. */
	run_fails(dir, "list_files(\"%s/b_trunc.jpg\") | read_file | "
	    "random_resized_crop(size=16)", CACHEW_ECORRUPT, "corrupt JPEG");
	/* Not bytes. */
	run_fails(dir, "range(3) | decode_jpeg", CACHEW_ETYPE,
	    "component 0 is i64[]; expected JPEG bytes (a bytes scalar)");
	free(jpg);
	free(rgb);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* An image operator sizes its output from its parameters (resize,
 * random_resized_crop) or from the input (decode_jpeg, normalize): over
 * max_element_bytes the element fails with ERANGE, naming the size, before
 * anything is allocated. A 64x64 JPEG resized to 65535 x 65535 would ask
 * for 12.9 GB. */
START_TEST(image_outputs_over_max_element_bytes_fail_the_element)
{
	char *dir = cwt_tmpdir(), path[512];
	unsigned char *rgb = make_rgb(64, 64, 3), *jpg;
	cachew_options *small = cwt_opts(1, 1);
	size_t len;

	jpg = encode_jpeg(rgb, 64, 64, &len);
	snprintf(path, sizeof(path), "%s/a.jpg", dir);
	cwt_write_file(path, jpg, len);
	run_fails(dir, "list_files(\"%s/a.jpg\") | read_file | decode_jpeg | "
	    "resize(h=65535, w=65535)", CACHEW_ERANGE, "map(resize): resizing "
	    "to [65535, 65535, 3] u8 would take 12884508675 bytes, over "
	    "max_element_bytes (1073741824) (element 0)");
	/* Fused with decoding, and on a decoded image. */
	run_fails(dir, "list_files(\"%s/a.jpg\") | read_file | "
	    "random_resized_crop(size=65535)", CACHEW_ERANGE, "a crop resized "
	    "to [65535, 65535, 3] u8 would take 12884508675 bytes, over "
	    "max_element_bytes (1073741824)");
	run_fails(dir, "list_files(\"%s/a.jpg\") | read_file | decode_jpeg | "
	    "random_resized_crop(size=65535)", CACHEW_ERANGE, "a crop resized "
	    "to [65535, 65535, 3] u8 would take 12884508675 bytes");
	ck_assert_int_eq(cachew_options_set_int(small, "max_element_bytes",
			     8192), CACHEW_OK);
	run_fails_with(small, dir, "list_files(\"%s/a.jpg\") | read_file | "
	    "decode_jpeg", CACHEW_ERANGE, "map(decode_jpeg): decoding to [64, "
	    "64, 3] u8 would take 12288 bytes, over max_element_bytes (8192)");
	run_fails_with(small, dir, "from_tensors([[[1, 2, 3]]]) | map(cast, "
	    "dtype=u8) | resize(h=60, w=60)", CACHEW_ERANGE, "resizing to "
	    "[60, 60, 3] u8 would take 10800 bytes");
	ck_assert_int_eq(cachew_options_set_int(small, "max_element_bytes",
			     4096), CACHEW_OK);
	run_fails_with(small, dir, "from_tensors([[[1, 2, 3]]]) | map(cast, "
	    "dtype=u8) | resize(h=30, w=30) | normalize(mean=[0, 0, 0], "
	    "std=[1, 1, 1])", CACHEW_ERANGE, "normalizing 2700 values to f32 "
	    "would take 10800 bytes, over max_element_bytes (4096)");
	cachew_options_destroy(small);
	free(jpg);
	free(rgb);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* pad_truncate allocates its len values whatever the input. */
START_TEST(pad_truncate_over_max_element_bytes_fails_the_element)
{
	run_fails("", "from_tensors([1, 2]) | pad_truncate(len=4294967296)",
	    CACHEW_ERANGE, "map(pad_truncate): padding to 4294967296 values "
	    "would take 34359738368 bytes, over max_element_bytes "
	    "(1073741824)");
}
END_TEST

START_TEST(is_valid_jpeg_drops_truncated_and_other_files)
{
	char *dir = cwt_tmpdir(), path[512];
	unsigned char *rgb = make_rgb(40, 30, 3), *jpg;
	cachew_element **v;
	size_t len, n;

	jpg = encode_jpeg(rgb, 40, 30, &len);
	snprintf(path, sizeof(path), "%s/a_good.jpg", dir);
	cwt_write_file(path, jpg, len);
	snprintf(path, sizeof(path), "%s/b_trunc.jpg", dir);
	cwt_write_file(path, jpg, len - 10);
	snprintf(path, sizeof(path), "%s/c_text.jpg", dir);
	cwt_write_file(path, "not a jpeg\xff\xd9", 12);
	snprintf(path, sizeof(path), "%s/d_good.jpg", dir);
	cwt_write_file(path, jpg, len);
	v = run_ok(dir, "list_files(\"%s/*.jpg\", shuffle=false) | read_file "
	    "| filter(is_valid_jpeg) | decode_jpeg", 1, 1, &n);
	ck_assert_uint_eq(n, 2);
	assert_shape(comp(v[1], 0), CACHEW_U8, 3, 30, 40, 3);
	cwt_free(v, n);
	free(jpg);
	free(rgb);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(unknown_parameters_are_rejected)
{
	const char *bad[] = {
	    "range(1) | decode_jpeg(chanels=3)",
	    "range(1) | random_resized_crop(size=224, scales=[0.1, 1])",
	    "range(1) | resize(h=2, width=3)",
	    "range(1) | center_crop(h=2, w=2, x=1)",
	    "range(1) | flip_left_right(prob=0.5)",
	    "range(1) | normalize(mean=[0.5], std=[0.5], mode=1)",
	    "range(1) | transpose(axes=[1, 0])",
	    "range(1) | tokenize(lower=true)",
	    "range(1) | pad_truncate(length=4)",
	    "range(1) | filter(is_valid_jpeg, comp=1)",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cachew_dataset *ds = NULL;
		cachew_err rv = cachew_dataset_parse(&ds, bad[i]);
		ck_assert_msg(rv == CACHEW_EINVAL, "%s: %s", bad[i],
		    cachew_strerror(rv));
		ck_assert_msg(strstr(cachew_errmsg(), "unknown parameter") !=
			NULL,
		    "%s: %s", bad[i], cachew_errmsg());
	}
	{
		cachew_dataset *ds = NULL;
		ck_assert_int_eq(cachew_dataset_parse(&ds,
				     "range(1) | transpose(perm=[0, 0, 1])"),
		    CACHEW_EINVAL);
		ck_assert_int_eq(cachew_dataset_parse(&ds,
				     "range(1) | normalize(mean=[1, 2], std=[1])"),
		    CACHEW_EINVAL);
	}
}
END_TEST

/* ---- random_resized_crop -------------------------------------------------------- */

static const char *rrc_decoded_fmt =
    "list_files(\"%s/*.jpg\", shuffle=false) | read_file | decode_jpeg | "
    "random_resized_crop(size=[24, 40])";

START_TEST(random_resized_crop_shape_and_determinism)
{
	char *dir = cwt_tmpdir();
	cachew_element **a, **b, **c, **d, **f1, **f2;
	size_t na, nb, nc, nd, nf1, nf2;
	int differ = 0;

	write_jpegs(dir, 8, 96, 64);
	a = run_ok(dir, rrc_decoded_fmt, 5, 1, &na);
	b = run_ok(dir, rrc_decoded_fmt, 5, 1, &nb);
	c = run_ok(dir, rrc_decoded_fmt, 6, 1, &nc);
	d = run_ok(dir, "list_files(\"%s/*.jpg\", shuffle=false) | read_file | "
	    "decode_jpeg(parallel=2) | random_resized_crop(size=[24, 40], "
	    "parallel=2)", 5, 2, &nd);
	ck_assert_uint_eq(na, 8);
	ck_assert_uint_eq(nb, 8);
	ck_assert_uint_eq(nc, 8);
	ck_assert_uint_eq(nd, 8);
	for (size_t i = 0; i < na; i++) {
		assert_shape(comp(a[i], 0), CACHEW_U8, 3, 24, 40, 3);
		ck_assert(same_data(comp(a[i], 0), comp(b[i], 0)));
		ck_assert(same_data(comp(a[i], 0), comp(d[i], 0)));
		differ += !same_data(comp(a[i], 0), comp(c[i], 0));
	}
	ck_assert_int_ge(differ, 7);
	/* The fused path: deterministic too, inline and parallel. */
	f1 = run_ok(dir, "list_files(\"%s/*.jpg\", shuffle=false) | read_file | "
	    "random_resized_crop(size=32)", 9, 1, &nf1);
	f2 = run_ok(dir, "list_files(\"%s/*.jpg\", shuffle=false) | read_file | "
	    "random_resized_crop(size=32, parallel=2)", 9, 2, &nf2);
	ck_assert_uint_eq(nf1, 8);
	ck_assert_uint_eq(nf2, 8);
	for (size_t i = 0; i < nf1; i++) {
		assert_shape(comp(f1[i], 0), CACHEW_U8, 3, 32, 32, 3);
		ck_assert(same_data(comp(f1[i], 0), comp(f2[i], 0)));
	}
	cwt_free(a, na);
	cwt_free(b, nb);
	cwt_free(c, nc);
	cwt_free(d, nd);
	cwt_free(f1, nf1);
	cwt_free(f2, nf2);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* A u8 [S, S, 2] image whose pixel (y, x) holds (x, y), as a literal. */
static char *
coordinate_image(int S)
{
	size_t cap = (size_t)S * S * 12 + 64, len = 0;
	char *s = malloc(cap);

	ck_assert_ptr_nonnull(s);
	len += (size_t)snprintf(s + len, cap - len, "[");
	for (int y = 0; y < S; y++) {
		len += (size_t)snprintf(s + len, cap - len, "%s[", y ? "," : "");
		for (int x = 0; x < S; x++)
			len += (size_t)snprintf(s + len, cap - len, "%s[%d,%d]",
			    x ? "," : "", x, y);
		len += (size_t)snprintf(s + len, cap - len, "]");
	}
	snprintf(s + len, cap - len, "]");
	return s;
}

/*
 * With size [2, 2], the output samples the box at 1/4 and 3/4 of its
 * width and height; on a coordinate image that gives the box back within
 * a pixel: w = 2 (x1 - x0), left = x0 - w/4 + 1/2.
 */
START_TEST(random_resized_crop_sampling_statistics)
{
	enum { S = 120, N = 400 };
	char *img = coordinate_image(S), *pipeline;
	cachew_options *o = cwt_opts(3, 1);
	cachew_element **v;
	double sum_frac = 0, min_frac = 9, max_frac = 0;
	size_t n;
	int left_half = 0;
	char err[512] = "";
	size_t plen = strlen(img) + 256;

	pipeline = malloc(plen);
	ck_assert_ptr_nonnull(pipeline);
	snprintf(pipeline, plen, "from_tensors(%s) | map(cast, dtype=u8) | "
	    "repeat(%d) | random_resized_crop(size=[2, 2])", img, N);
	ck_assert_int_eq(cwt_run(pipeline, o, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, N);
	for (size_t i = 0; i < n; i++) {
		const uint8_t *p = cachew_tensor_data(comp(v[i], 0));
		/* p[(r * 2 + c) * 2 + k]: k = 0 x, k = 1 y. */
		double x0 = p[0], x1 = p[2], y0 = p[1], y1 = p[5];
		double w = 2 * (x1 - x0), h = 2 * (y1 - y0);
		double frac = w * h / (S * S), ratio = w / h;
		double left = x0 - w / 4 + 0.5;

		ck_assert_msg(ratio > 0.75 * 0.85 && ratio < 4.0 / 3 / 0.85,
		    "ratio %g", ratio);
		ck_assert(left > -1.5 && left + w < S + 1.5);
		sum_frac += frac;
		min_frac = frac < min_frac ? frac : min_frac;
		max_frac = frac > max_frac ? frac : max_frac;
		left_half += left + w / 2 < S / 2.0;
	}
	/* Uniform in [0.08, 1]: mean 0.54; rejections trim the top a bit. */
	ck_assert_msg(min_frac > 0.05 && min_frac < 0.15, "min %g", min_frac);
	ck_assert_msg(max_frac > 0.85 && max_frac < 1.1, "max %g", max_frac);
	ck_assert_msg(sum_frac / N > 0.45 && sum_frac / N < 0.6, "mean %g",
	    sum_frac / N);
	ck_assert_msg(left_half > N / 4 && left_half < 3 * N / 4, "%d",
	    left_half);
	cwt_free(v, n);
	cachew_options_destroy(o);
	free(pipeline);
	free(img);
}
END_TEST

/*
 * scale=[2, 2] makes every attempt too large, so the crop is the
 * deterministic fallback: the whole image center-cropped to the ratio
 * bound. Both paths then crop the same box, whatever their seeds.
 */
static void
fused_vs_unfused(const char *dir, const char *params, int64_t oh, int64_t ow,
    double max_mad)
{
	char fmt[512];
	cachew_element **f, **u;
	size_t nf, nu;

	snprintf(fmt, sizeof(fmt), "list_files(\"%%s/*.jpg\", shuffle=false) | "
	    "read_file | random_resized_crop(%s)", params);
	f = run_ok(dir, fmt, 1, 1, &nf);
	snprintf(fmt, sizeof(fmt), "list_files(\"%%s/*.jpg\", shuffle=false) | "
	    "read_file | decode_jpeg | random_resized_crop(%s)", params);
	u = run_ok(dir, fmt, 1, 1, &nu);
	ck_assert_uint_eq(nf, nu);
	for (size_t i = 0; i < nf; i++) {
		double mad;
		assert_shape(comp(f[i], 0), CACHEW_U8, 3, oh, ow, 3);
		assert_shape(comp(u[i], 0), CACHEW_U8, 3, oh, ow, 3);
		mad = mean_abs_diff(comp(f[i], 0), comp(u[i], 0));
		ck_assert_msg(mad <= max_mad, "%s: image %zu: mean abs diff %g",
		    params, i, mad);
	}
	cwt_free(f, nf);
	cwt_free(u, nu);
}

START_TEST(random_resized_crop_fused_matches_unfused)
{
	char *dir = cwt_tmpdir();

	write_jpegs(dir, 3, 160, 120);
	/* Box 160 x 80 at row 20: rows skipped; DCT scale 2/8. */
	fused_vs_unfused(dir, "size=[20, 40], scale=[2, 2], ratio=[2, 2]", 20,
	    40, 2.0);
	/* Box 60 x 120 at column 50: columns cropped; DCT scale 2/8. */
	fused_vs_unfused(dir, "size=[30, 15], scale=[2, 2], ratio=[0.5, 0.5]",
	    30, 15, 2.0);
	/* No DCT scaling (output as large as the box): nearly exact. */
	fused_vs_unfused(dir, "size=[120, 60], scale=[2, 2], ratio=[0.5, 0.5]",
	    120, 60, 0.05);
	/* Upsampling a box smaller than the output. */
	fused_vs_unfused(dir, "size=[200, 400], scale=[2, 2], ratio=[2, 2]",
	    200, 400, 0.05);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Progressive, 4:4:4, 4:2:2 and grayscale files take the same paths. */
START_TEST(random_resized_crop_fused_other_jpeg_kinds)
{
	static const int kinds[4][2] = {{TJSAMP_444, TJFLAG_PROGRESSIVE},
	    {TJSAMP_422, 0}, {TJSAMP_GRAY, 0}, {TJSAMP_420,
	    TJFLAG_PROGRESSIVE}};
	char *dir = cwt_tmpdir();

	for (int i = 0; i < 4; i++) {
		unsigned char *rgb = make_rgb(160, 120, (unsigned)i + 1), *jpg;
		char path[512];
		size_t len;
		jpg = encode_jpeg_as(rgb, 160, 120, kinds[i][0], kinds[i][1],
		    &len);
		snprintf(path, sizeof(path), "%s/img%03d.jpg", dir, i);
		cwt_write_file(path, jpg, len);
		free(jpg);
		free(rgb);
	}
	fused_vs_unfused(dir, "size=[20, 40], scale=[2, 2], ratio=[2, 2]", 20,
	    40, 2.0);
	fused_vs_unfused(dir, "size=[30, 15], scale=[2, 2], ratio=[0.5, 0.5]",
	    30, 15, 2.0);
	fused_vs_unfused(dir, "size=[120, 60], scale=[2, 2], ratio=[0.5, 0.5]",
	    120, 60, 0.05);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- resize / center_crop / flip / normalize / transpose --------------------------- */

static cachew_element **
run_literal(const char *pipeline, size_t *n)
{
	return run_ok("", pipeline, 1, 1, n);
}

static void
assert_u8(const cachew_tensor *t, const uint8_t *want, size_t n)
{
	const uint8_t *p = cachew_tensor_data(t);
	ck_assert_uint_eq(cachew_tensor_nbytes(t), n);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(p[i] == want[i], "value %zu: %u, want %u", i, p[i],
		    want[i]);
}

START_TEST(resize_bilinear_exact_values)
{
	/* 2x2 -> 4x4: x and y weights 0, .25, .75, 1 (half-pixel
	 * centers, clamped at the edges); values round half up. */
	static const uint8_t want[16] = {0, 25, 75, 100, 50, 72, 117, 139, 150,
	    167, 200, 216, 200, 214, 241, 255};
	static const float want_f[4] = {2.5f, 4.5f, 10.5f, 12.5f};
	cachew_element **v;
	const float *f;
	size_t n;

	v = run_literal("from_tensors([[0, 100], [200, 255]]) | map(cast, dtype=u8) "
			"| resize(h=4, w=4)", &n);
	assert_shape(comp(v[0], 0), CACHEW_U8, 2, 4, 4, 0);
	assert_u8(comp(v[0], 0), want, 16);
	cwt_free(v, n);
	/* f32 4x4 ramp -> 2x2: each output is the mean of a 2x2 block. */
	v = run_literal("from_tensors([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, "
			"11], [12, 13, 14, 15]]) | map(cast, dtype=f32) | "
			"resize(h=2, w=2)", &n);
	assert_shape(comp(v[0], 0), CACHEW_F32, 2, 2, 2, 0);
	f = cachew_tensor_data(comp(v[0], 0));
	for (int i = 0; i < 4; i++)
		ck_assert_float_eq(f[i], want_f[i]);
	cwt_free(v, n);
	/* Channels are resized independently. */
	v = run_literal("from_tensors([[[0, 10], [100, 110]]]) | map(cast, dtype=u8) "
			"| resize(h=1, w=4)", &n);
	{
		static const uint8_t w3[8] = {0, 10, 25, 35, 75, 85, 100, 110};
		assert_shape(comp(v[0], 0), CACHEW_U8, 3, 1, 4, 2);
		assert_u8(comp(v[0], 0), w3, 8);
	}
	cwt_free(v, n);
}
END_TEST

/* A random h x w x c u8 image (uniform values: every pair of neighbours
 * is as far apart as it gets) resized by the pipeline to oh x ow; the
 * result, free with free(). */
static uint8_t *
resize_random_image(const uint8_t *img, int h, int w, int c, int oh, int ow)
{
	size_t cap = (size_t)h * w * (4 * c + 4) + 4 * (size_t)h + 256, len;
	char *p = malloc(cap), err[512] = "";
	cachew_options *o = cwt_opts(1, 1);
	cachew_element **v = NULL;
	uint8_t *out;
	size_t n;
	cachew_err rv;

	ck_assert_ptr_nonnull(p);
	len = (size_t)snprintf(p, cap, "from_tensors([");
	for (int y = 0; y < h; y++) {
		len += (size_t)snprintf(p + len, cap - len, "%s[", y ? "," : "");
		for (int x = 0; x < w; x++) {
			len += (size_t)snprintf(p + len, cap - len, "%s[",
			    x ? "," : "");
			for (int k = 0; k < c; k++)
				len += (size_t)snprintf(p + len, cap - len,
				    "%s%u", k ? "," : "",
				    img[((size_t)y * w + x) * c + k]);
			len += (size_t)snprintf(p + len, cap - len, "]");
		}
		len += (size_t)snprintf(p + len, cap - len, "]");
	}
	snprintf(p + len, cap - len, "]) | map(cast, dtype=u8) | "
	    "resize(h=%d, w=%d)", oh, ow);
	rv = cwt_run(p, o, &v, &n, err, sizeof(err));
	cachew_options_destroy(o);
	ck_assert_msg(rv == CACHEW_OK, "%s (%s)", cachew_strerror(rv), err);
	ck_assert_uint_eq(n, 1);
	assert_shape(comp(v[0], 0), CACHEW_U8, 3, oh, ow, c);
	out = malloc((size_t)oh * ow * c);
	ck_assert_ptr_nonnull(out);
	memcpy(out, cachew_tensor_data(comp(v[0], 0)), (size_t)oh * ow * c);
	cwt_free(v, n);
	free(p);
	return out;
}

static uint8_t *
random_u8(size_t n, uint32_t seed)
{
	uint8_t *p = malloc(n);
	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = (uint8_t)(seed >> 24);
	}
	return p;
}

static int
px(const uint8_t *img, int w, int c, int y, int x, int k)
{
	return img[((size_t)y * w + x) * c + k];
}

/* Source pixels and weight of the second along one axis, half-pixel
 * centers, clamped (docs/preprocessing.md). */
static void
ref_axis(int d, int n, int in, int *i0, int *i1, double *w)
{
	double s = (d + 0.5) * in / n - 0.5;
	if (s < 0)
		s = 0;
	if (s > in - 1)
		s = in - 1;
	*i0 = (int)floor(s);
	*i1 = *i0 < in - 1 ? *i0 + 1 : in - 1;
	*w = s - *i0;
}

/* Odd sizes (the vector paths' tails and the clamped right edge), down
 * and up, with 1, 3 (the vector path) and 4 channels. */
static const int resize_cases[][4] = {
	{29, 40, 7, 5}, {29, 40, 13, 61}, {29, 40, 29, 40}, {29, 40, 50, 97},
	{29, 40, 1, 1}, {29, 40, 64, 17}, {3, 2, 5, 7}, {2, 3, 1, 2},
};

/* The largest distance of resize's result from the float computation on
 * img (h x w x c) resized to oh x ow. */
static double
resize_float_distance(const uint8_t *img, int h, int w, int c, int oh,
    int ow)
{
	uint8_t *got = resize_random_image(img, h, w, c, oh, ow);
	double worst = 0;

	for (int dy = 0; dy < oh; dy++) {
		int y0, y1, x0, x1;
		double wy, wx;
		ref_axis(dy, oh, h, &y0, &y1, &wy);
		for (int dx = 0; dx < ow; dx++) {
			ref_axis(dx, ow, w, &x0, &x1, &wx);
			for (int k = 0; k < c; k++) {
				double top = px(img, w, c, y0, x0, k) * (1 - wx) +
				    px(img, w, c, y0, x1, k) * wx;
				double bot = px(img, w, c, y1, x0, k) * (1 - wx) +
				    px(img, w, c, y1, x1, k) * wx;
				double ref = top * (1 - wy) + bot * wy;
				double e = fabs(got[((size_t)dy * ow + dx) * c +
				    k] - ref);
				if (e > worst)
					worst = e;
			}
		}
	}
	free(got);
	return worst;
}

/*
 * The 7-bit weights are within 1/256 of the real ones, so each axis adds
 * at most |p1 - p0| / 256 to the rounding's 1/2: a result is at most one
 * level from the float computation where neighbouring pixels differ by
 * at most 64 (photos, smooth images), and less than 2.5 levels on any
 * image (uniform noise: measured worst 1.55).
 */
START_TEST(resize_u8_within_one_level_of_float)
{
	static const int channels[] = {3, 1, 4};
	double worst_smooth = 0, worst_noise = 0;

	for (size_t ci = 0; ci < 3; ci++) {
		for (size_t i = 0; i < sizeof(resize_cases) /
		    sizeof(resize_cases[0]); i++) {
			int h = resize_cases[i][0], w = resize_cases[i][1];
			int oh = resize_cases[i][2], ow = resize_cases[i][3];
			int c = channels[ci];
			size_t n = (size_t)h * w * c;
			uint8_t *noise = random_u8(n, (uint32_t)(i * 7 + ci + 1));
			uint8_t *smooth = malloc(n);
			double e;

			ck_assert_ptr_nonnull(smooth);
			/* Neighbours differ by at most 2 + 61 (and 61 between
			 * channels, which are resized apart). */
			for (size_t q = 0; q < n; q++) {
				size_t x = q / (size_t)c % (size_t)w;
				size_t y = q / (size_t)c / (size_t)w;
				size_t v = 2 * (x + y) + 20 * (q % (size_t)c) +
				    noise[q] % 62u;
				smooth[q] = (uint8_t)(v < 255 ? v : 255);
			}
			e = resize_float_distance(smooth, h, w, c, oh, ow);
			ck_assert_msg(e <= 1.0, "smooth %dx%dx%d -> %dx%d: %.3f "
			    "levels from float", h, w, c, oh, ow, e);
			if (e > worst_smooth)
				worst_smooth = e;
			e = resize_float_distance(noise, h, w, c, oh, ow);
			ck_assert_msg(e < 2.5, "noise %dx%dx%d -> %dx%d: %.3f "
			    "levels from float", h, w, c, oh, ow, e);
			if (e > worst_noise)
				worst_noise = e;
			free(smooth);
			free(noise);
		}
	}
	/* The comparisons compared something. */
	ck_assert(worst_smooth > 0.5 && worst_noise > 0.5);
}
END_TEST

/* The vector paths of fn_image.c compute the same integers as the
 * fixed-point algorithm written plainly: 7-bit weights, x then y, rounded
 * half up. */
START_TEST(resize_u8_matches_fixed_point_reference)
{
	static const int channels[] = {3, 1, 4};

	for (size_t ci = 0; ci < 3; ci++) {
		for (size_t i = 0; i < sizeof(resize_cases) /
		    sizeof(resize_cases[0]); i++) {
			int h = resize_cases[i][0], w = resize_cases[i][1];
			int oh = resize_cases[i][2], ow = resize_cases[i][3];
			int c = channels[ci];
			uint8_t *img = random_u8((size_t)h * w * c,
			    (uint32_t)(i * 13 + ci + 5));
			uint8_t *got = resize_random_image(img, h, w, c, oh,
			    ow);

			for (int dy = 0; dy < oh; dy++) {
				int y0, y1, x0, x1;
				double wy, wx;
				long qy;
				ref_axis(dy, oh, h, &y0, &y1, &wy);
				qy = lrint(wy * 128);
				for (int dx = 0; dx < ow; dx++) {
					long qx;
					ref_axis(dx, ow, w, &x0, &x1, &wx);
					qx = lrint(wx * 128);
					for (int k = 0; k < c; k++) {
						long g = got[((size_t)dy * ow + dx) * c + k];
						long top = px(img, w, c, y0, x0, k) * (128 - qx) +
						    px(img, w, c, y0, x1, k) * qx;
						long bot = px(img, w, c, y1, x0, k) * (128 - qx) +
						    px(img, w, c, y1, x1, k) * qx;
						long want = (top * (128 - qy) + bot * qy +
						    8192) >> 14;

						ck_assert_msg(g == want, "%dx%dx%d -> %dx%d at "
						    "(%d, %d, %d): %ld, want %ld", h, w, c, oh,
						    ow, dy, dx, k, g, want);
					}
				}
			}
			free(got);
			free(img);
		}
	}
}
END_TEST

START_TEST(center_crop_exact_values)
{
	/* 5x5 ramp, crop 2x3: top = round(1.5) = 2 (ties to even), left 1. */
	static const uint8_t want[6] = {11, 12, 13, 16, 17, 18};
	cachew_element **v;
	size_t n;

	v = run_literal("from_tensors([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, "
			"11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22, "
			"23, 24]]) | map(cast, dtype=u8) | center_crop(h=2, w=3)",
	    &n);
	assert_shape(comp(v[0], 0), CACHEW_U8, 2, 2, 3, 0);
	assert_u8(comp(v[0], 0), want, 6);
	cwt_free(v, n);
	run_fails("", "from_tensors([[1, 2], [3, 4]]) | map(cast, dtype=u8) | "
		      "center_crop(h=3, w=1)",
	    CACHEW_ERANGE, "cannot crop [3, 1]");
}
END_TEST

START_TEST(flip_left_right_values_and_rate)
{
	static const uint8_t want[12] = {4, 5, 6, 1, 2, 3, 10, 11, 12, 7, 8, 9};
	static const uint8_t orig[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
	cachew_element **v, **w;
	size_t n, nw, flipped = 0;

	v = run_literal("from_tensors([[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], "
			"[10, 11, 12]]]) | map(cast, dtype=u8) | "
			"flip_left_right(p=1)",
	    &n);
	assert_shape(comp(v[0], 0), CACHEW_U8, 3, 2, 2, 3);
	assert_u8(comp(v[0], 0), want, 12);
	cwt_free(v, n);
	v = run_literal("from_tensors([[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], "
			"[10, 11, 12]]]) | map(cast, dtype=u8) | "
			"flip_left_right(p=0)",
	    &n);
	assert_u8(comp(v[0], 0), orig, 12);
	cwt_free(v, n);
	/* p = 0.5: about half, the same ones in every run. */
	v = run_literal("from_tensors([[1, 2, 3]]) | map(cast, dtype=u8) | "
			"repeat(400) | flip_left_right",
	    &n);
	w = run_literal("from_tensors([[1, 2, 3]]) | map(cast, dtype=u8) | "
			"repeat(400) | flip_left_right(parallel=2)",
	    &nw);
	ck_assert_uint_eq(n, 400);
	ck_assert_uint_eq(nw, 400);
	for (size_t i = 0; i < n; i++) {
		const uint8_t *p = cachew_tensor_data(comp(v[i], 0));
		flipped += p[0] == 3;
		ck_assert(same_data(comp(v[i], 0), comp(w[i], 0)));
	}
	ck_assert_msg(flipped > 150 && flipped < 250, "%zu", flipped);
	cwt_free(v, n);
	cwt_free(w, nw);
}
END_TEST

START_TEST(normalize_exact_values)
{
	static const double mean[3] = {0.485, 0.456, 0.406};
	static const double sd[3] = {0.229, 0.224, 0.225};
	static const int px[6] = {0, 128, 255, 17, 34, 51};
	cachew_element **v;
	const float *f;
	size_t n;

	v = run_literal("from_tensors([[[0, 128, 255], [17, 34, 51]]]) | "
			"map(cast, dtype=u8) | normalize(mean=[0.485, 0.456, 0.406], "
			"std=[0.229, 0.224, 0.225])",
	    &n);
	assert_shape(comp(v[0], 0), CACHEW_F32, 3, 1, 2, 3);
	f = cachew_tensor_data(comp(v[0], 0));
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(f[i],
		    (float)((px[i] / 255.0 - mean[i % 3]) / sd[i % 3]));
	cwt_free(v, n);
	/* CHW: the channel axis is 0; f32 input is not divided by 255. */
	v = run_literal("from_tensors([[[1, 2]], [[3, 4]]]) | map(cast, dtype=f32) "
			"| normalize(mean=[1, 2], std=[2, 4], axis=0)",
	    &n);
	assert_shape(comp(v[0], 0), CACHEW_F32, 3, 2, 1, 2);
	f = cachew_tensor_data(comp(v[0], 0));
	ck_assert_float_eq(f[0], 0.0f);
	ck_assert_float_eq(f[1], 0.5f);
	ck_assert_float_eq(f[2], 0.25f);
	ck_assert_float_eq(f[3], 0.5f);
	cwt_free(v, n);
	/* One value broadcasts; a count mismatch is an error. */
	v = run_literal("from_tensors([[2, 4]]) | map(cast, dtype=f32) | "
			"normalize(mean=[1], std=[2])",
	    &n);
	f = cachew_tensor_data(comp(v[0], 0));
	ck_assert_float_eq(f[0], 0.5f);
	ck_assert_float_eq(f[1], 1.5f);
	cwt_free(v, n);
	run_fails("", "from_tensors([[[1, 2]]]) | map(cast, dtype=u8) | "
		      "normalize(mean=[1, 2, 3], std=[1, 1, 1])",
	    CACHEW_ETYPE, "2 channels on axis 2");
}
END_TEST

/* normalize(channels_first=true) == transpose(channels to second) and
 * normalize on that axis, value for value, for u8 and f32 batches. */
START_TEST(normalize_channels_first_equals_transpose_then_normalize)
{
	static const char *const src[2] = {
	    "from_list([[[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]], "
	    "[[[200, 100, 50], [0, 255, 128]], [[9, 8, 7], [6, 5, 4]]]]) | "
	    "map(cast, dtype=u8) | batch(2)",
	    "from_list([[[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]], "
	    "[[[200, 100, 50], [0, 255, 128]], [[9, 8, 7], [6, 5, 4]]]]) | "
	    "map(cast, dtype=f32) | batch(2)"};
	char a[1024], b[1024];

	for (int k = 0; k < 2; k++) {
		cachew_element **va, **vb;
		size_t na, nb;
		snprintf(a, sizeof(a), "%s | transpose(perm=[0, 3, 1, 2]) | "
		    "normalize(mean=[0.5, 0.4, 0.3], std=[0.2, 0.3, 0.4], "
		    "axis=1)", src[k]);
		snprintf(b, sizeof(b), "%s | normalize(mean=[0.5, 0.4, 0.3], "
		    "std=[0.2, 0.3, 0.4], channels_first=true)", src[k]);
		va = run_literal(a, &na);
		vb = run_literal(b, &nb);
		ck_assert_uint_eq(na, 1);
		ck_assert_uint_eq(nb, 1);
		ck_assert_int_eq(cachew_tensor_rank(comp(vb[0], 0)), 4);
		ck_assert_int_eq(cachew_tensor_shape(comp(vb[0], 0))[0], 2);
		ck_assert_int_eq(cachew_tensor_shape(comp(vb[0], 0))[1], 3);
		ck_assert_int_eq(cachew_tensor_shape(comp(vb[0], 0))[3], 2);
		ck_assert_int_eq(memcmp(cachew_tensor_data(comp(va[0], 0)),
				     cachew_tensor_data(comp(vb[0], 0)), 24 * 4),
		    0);
		cwt_free(va, na);
		cwt_free(vb, nb);
	}
	run_fails("", "from_tensors([[1, 2, 3]]) | map(cast, dtype=u8) | "
		      "normalize(mean=[1], std=[1], channels_first=true)",
	    CACHEW_ETYPE, "channels_first needs");
}
END_TEST

/* channels_first on RGB u8 writes each plane four pixels at a time, then
 * a tail: a batch of two 3 x 3 images (9 pixels: two groups of four and
 * one left over) gets the formula's exact value at every position, with
 * per-channel and with one broadcast mean and std. */
START_TEST(normalize_channels_first_rgb_exact_at_every_position)
{
	static const double mean3[3] = {0.485, 0.456, 0.406};
	static const double sd3[3] = {0.229, 0.224, 0.225};
	char list[2048], pipe[2600];
	size_t len = 0;

	len += (size_t)snprintf(list + len, sizeof(list) - len, "[");
	for (int o = 0; o < 2; o++) {
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s[",
		    o ? ", " : "");
		for (int y = 0; y < 3; y++) {
			len += (size_t)snprintf(list + len, sizeof(list) - len,
			    "%s[", y ? ", " : "");
			for (int x = 0; x < 3; x++)
				len += (size_t)snprintf(list + len,
				    sizeof(list) - len, "%s[%d, %d, %d]",
				    x ? ", " : "", (o * 27 + y * 9 + x * 3) * 9 % 256,
				    (o * 27 + y * 9 + x * 3 + 1) * 9 % 256,
				    (o * 27 + y * 9 + x * 3 + 2) * 9 % 256);
			len += (size_t)snprintf(list + len, sizeof(list) - len,
			    "]");
		}
		len += (size_t)snprintf(list + len, sizeof(list) - len, "]");
	}
	snprintf(list + len, sizeof(list) - len, "]");
	for (int broadcast = 0; broadcast < 2; broadcast++) {
		cachew_element **v;
		const float *f;
		size_t n;

		snprintf(pipe, sizeof(pipe), "from_tensors(%s) | map(cast, "
		    "dtype=u8) | normalize(%s, channels_first=true)", list,
		    broadcast ? "mean=[0.485], std=[0.229]"
			      : "mean=[0.485, 0.456, 0.406], std=[0.229, "
				"0.224, 0.225]");
		v = run_literal(pipe, &n);
		ck_assert_uint_eq(n, 1);
		assert_shape(comp(v[0], 0), CACHEW_F32, 4, 2, 3, 3);
		ck_assert_int_eq(cachew_tensor_shape(comp(v[0], 0))[3], 3);
		f = cachew_tensor_data(comp(v[0], 0));
		for (int o = 0; o < 2; o++)
			for (int k = 0; k < 3; k++)
				for (int p = 0; p < 9; p++) {
					int px = (o * 27 + p * 3 + k) * 9 % 256;
					int ch = broadcast ? 0 : k;
					ck_assert_float_eq(f[(o * 3 + k) * 9 + p],
					    (float)((px / 255.0 - mean3[ch]) /
						sd3[ch]));
				}
		cwt_free(v, n);
	}
}
END_TEST

/* A strong downscale (a large crop to 8 x 8) asks the fused decoder for
 * rows more than its 16-row buffer apart: each must still arrive (this
 * aborted on a 4000 x 3000 photo before the refill skipped ahead). */
START_TEST(random_resized_crop_fused_downscales_large_images)
{
	char *dir = cwt_tmpdir();
	cachew_element **v;
	size_t n;

	write_jpegs(dir, 1, 2400, 1800);
	v = run_ok(dir, "list_files(\"%s/*.jpg\") | repeat(48) | read_file | "
			"random_resized_crop(size=8)", 3, 1, &n);
	ck_assert_uint_eq(n, 48);
	for (size_t i = 0; i < n; i++)
		assert_shape(comp(v[i], 0), CACHEW_U8, 3, 8, 8, 3);
	cwt_free(v, n);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(transpose_permutes_axes)
{
	cachew_element **v;
	const int64_t *p;
	size_t n;

	/* [2, 3, 4] ramp, perm [2, 0, 1]: out[k][i][j] = in[i][j][k]. */
	v = run_literal("from_tensors([[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, "
			"11]], [[12, 13, 14, 15], [16, 17, 18, 19], [20, 21, "
			"22, 23]]]) | transpose",
	    &n);
	assert_shape(comp(v[0], 0), CACHEW_I64, 3, 4, 2, 3);
	p = cachew_tensor_data(comp(v[0], 0));
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < 3; j++)
				ck_assert_int_eq(p[(k * 2 + i) * 3 + j],
				    i * 12 + j * 4 + k);
	cwt_free(v, n);
	/* u8 HWC -> CHW, and a rank-2 transpose. */
	v = run_literal("from_tensors([[[1, 2, 3], [4, 5, 6]]]) | "
			"map(cast, dtype=u8) | transpose(perm=[2, 0, 1])",
	    &n);
	{
		static const uint8_t want[6] = {1, 4, 2, 5, 3, 6};
		assert_shape(comp(v[0], 0), CACHEW_U8, 3, 3, 1, 2);
		assert_u8(comp(v[0], 0), want, 6);
	}
	cwt_free(v, n);
	v = run_literal("from_tensors([[1, 2, 3], [4, 5, 6]]) | "
			"transpose(perm=[1, 0])",
	    &n);
	p = cachew_tensor_data(comp(v[0], 0));
	assert_shape(comp(v[0], 0), CACHEW_I64, 2, 3, 2, 0);
	ck_assert_int_eq(p[0], 1);
	ck_assert_int_eq(p[1], 4);
	ck_assert_int_eq(p[2], 2);
	ck_assert_int_eq(p[5], 6);
	cwt_free(v, n);
	run_fails("", "from_tensors([1, 2]) | transpose", CACHEW_ETYPE,
	    "component 0 has rank 1 but perm has 3 axes");
}
END_TEST

/* ---- tokenize / pad_truncate ---------------------------------------------------------- */

static int64_t
token_id(const char *s, uint64_t vocab)
{
	return (int64_t)(XXH3_64bits(s, strlen(s)) % vocab);
}

START_TEST(tokenize_exact_ids)
{
	cachew_element **v;
	const int64_t *p;
	size_t n;

	v = run_literal("from_list([\"Hello  World\\tfoo.\\n\", \"\", "
			"\"   \"]) | tokenize",
	    &n);
	ck_assert_uint_eq(n, 3);
	assert_shape(comp(v[0], 0), CACHEW_I64, 1, 3, 0, 0);
	p = cachew_tensor_data(comp(v[0], 0));
	ck_assert_int_eq(p[0], token_id("hello", 262144));
	ck_assert_int_eq(p[1], token_id("world", 262144));
	ck_assert_int_eq(p[2], token_id("foo.", 262144));
	assert_shape(comp(v[1], 0), CACHEW_I64, 1, 0, 0, 0);
	assert_shape(comp(v[2], 0), CACHEW_I64, 1, 0, 0, 0);
	cwt_free(v, n);
	v = run_literal("from_tensors(\"Hello World\") | "
			"tokenize(lowercase=false, vocab=1000)",
	    &n);
	p = cachew_tensor_data(comp(v[0], 0));
	ck_assert_int_eq(p[0], token_id("Hello", 1000));
	ck_assert_int_eq(p[1], token_id("World", 1000));
	cwt_free(v, n);
}
END_TEST

START_TEST(pad_truncate_exact_values)
{
	cachew_element **v;
	char *s;
	size_t n;

	v = run_literal("from_list([[1, 2, 3], [1, 2, 3, 4, 5, 6], [7, 8, 9, "
			"10]]) | pad_truncate(len=4, pad=-1)",
	    &n);
	s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "[1 2 3 -1],[1 2 3 4],[7 8 9 10]");
	free(s);
	cwt_free(v, n);
	/* The W3 chain, batched. */
	v = run_literal("from_list([\"a b c\", \"d\"]) | tokenize(vocab=10) | "
			"pad_truncate(len=2) | batch(2)",
	    &n);
	ck_assert_uint_eq(n, 1);
	assert_shape(comp(v[0], 0), CACHEW_I64, 2, 2, 2, 0);
	{
		const int64_t *p = cachew_tensor_data(comp(v[0], 0));
		ck_assert_int_eq(p[0], token_id("a", 10));
		ck_assert_int_eq(p[1], token_id("b", 10));
		ck_assert_int_eq(p[2], token_id("d", 10));
		ck_assert_int_eq(p[3], 0);
	}
	cwt_free(v, n);
}
END_TEST

Suite *
cwt_image_suite(void)
{
	Suite *s = suite_create("image");
	TCase *tc = tcase_create("image");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, decode_jpeg_matches_turbojpeg);
	tcase_add_test(tc, decode_jpeg_keeps_other_components);
	tcase_add_test(tc, decode_jpeg_corrupt_is_an_error);
	tcase_add_test(tc, is_valid_jpeg_drops_truncated_and_other_files);
	tcase_add_test(tc, unknown_parameters_are_rejected);
	tcase_add_test(tc, random_resized_crop_shape_and_determinism);
	tcase_add_test(tc, random_resized_crop_sampling_statistics);
	tcase_add_test(tc, random_resized_crop_fused_matches_unfused);
	tcase_add_test(tc, random_resized_crop_fused_other_jpeg_kinds);
	tcase_add_test(tc, resize_bilinear_exact_values);
	tcase_add_test(tc, resize_u8_within_one_level_of_float);
	tcase_add_test(tc, resize_u8_matches_fixed_point_reference);
	tcase_add_test(tc, center_crop_exact_values);
	tcase_add_test(tc, flip_left_right_values_and_rate);
	tcase_add_test(tc, normalize_exact_values);
	tcase_add_test(tc, normalize_channels_first_equals_transpose_then_normalize);
	tcase_add_test(tc, normalize_channels_first_rgb_exact_at_every_position);
	tcase_add_test(tc, random_resized_crop_fused_downscales_large_images);
	tcase_add_test(tc, transpose_permutes_axes);
	tcase_add_test(tc, tokenize_exact_ids);
	tcase_add_test(tc, pad_truncate_exact_values);
	tcase_add_test(tc, image_outputs_over_max_element_bytes_fail_the_element);
	tcase_add_test(tc, pad_truncate_over_max_element_bytes_fails_the_element);
	suite_add_tcase(s, tc);
	return s;
}
