/*
 * check_cache.c - the cache store: the element codec, chunk and manifest
 * formats, the writer and reader, corruption detection, the management
 * calls (list, verify, rm, gc, capacity) and the probe. The operators
 * built on it are tested in check_cacheops.c.
 *
 * Caches are small (kilobytes) so that the suite stays fast under
 * valgrind; small chunk_bytes and frame_bytes exercise rotation and
 * multi-frame chunks all the same.
 */
#include "cwt.h"

#include "../src/cache/cache_int.h"
#include "../src/core/element_codec.h"
#include "../src/io/io_put.h"

#include <dirent.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- helpers ------------------------------------------------------------ */

static cachew_fingerprint
fp_of(uint64_t n)
{
	return (cachew_fingerprint){.hi = 0x0123456789abcdefULL, .lo = n};
}

static cwi_element *
elem_new(uint32_t n)
{
	cwi_element *e = cwi_element_new(n);
	ck_assert_ptr_nonnull(e);
	return e;
}

/* Component c of e: a fixed-width tensor whose bytes follow a pattern
 * seeded by `seed`. */
static void
set_fixed(cwi_element *e, uint32_t c, cachew_dtype dt, unsigned rank,
    const int64_t *shape, unsigned seed)
{
	uint8_t *p;
	size_t nbytes;

	ck_assert_int_eq(cwi_tensor_init_alloc(&e->comp[c], dt, rank, shape,
			     false, &p),
	    CACHEW_OK);
	nbytes = cwi_tensor_nbytes(&e->comp[c]);
	for (size_t i = 0; i < nbytes; i++)
		p[i] = (uint8_t)(i * 131 + seed * 7 + 3);
	if (dt == CACHEW_BOOL)
		for (size_t i = 0; i < nbytes; i++)
			p[i] &= 1;
}

/* Like set_fixed with incompressible bytes. */
static void
set_random(cwi_element *e, uint32_t c, unsigned rank, const int64_t *shape,
    uint64_t seed)
{
	cwi_rng rng = {.state = seed};
	uint8_t *p;
	size_t nbytes;

	ck_assert_int_eq(cwi_tensor_init_alloc(&e->comp[c], CACHEW_U8, rank,
			     shape, false, &p),
	    CACHEW_OK);
	nbytes = cwi_tensor_nbytes(&e->comp[c]);
	for (size_t i = 0; i < nbytes; i++)
		p[i] = (uint8_t)cwi_rng_next(&rng);
}

static void
set_strings(cwi_element *e, uint32_t c, unsigned rank, const int64_t *shape,
    const char *const *items)
{
	size_t n = (size_t)cwi_shape_numel(rank, shape);
	size_t *lens = calloc(n + 1, sizeof(size_t));

	for (size_t i = 0; i < n; i++)
		lens[i] = strlen(items[i]);
	ck_assert_int_eq(cwi_tensor_init_bytes_list(&e->comp[c], rank, shape,
			     (const void *const *)items, lens),
	    CACHEW_OK);
	free(lens);
}

static cwi_element *
elem_i64(int64_t v)
{
	cwi_element *e = elem_new(1);
	cwi_tensor_init_i64(&e->comp[0], v);
	return e;
}

static void
elems_free(cwi_element **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cwi_element_release(v[i]);
	free(v);
}

static cwi_cache_root *
root_at(const char *dir, uint64_t capacity)
{
	cwi_cache_root *r = NULL;
	ck_assert_msg(cwi_cache_root_open(&r, dir, capacity) == CACHEW_OK, "%s",
	    cachew_errmsg());
	return r;
}

static void
write_cache(cwi_cache_root *r, const cachew_fingerprint *fp,
    cwi_element **v, size_t n, const cwi_cache_writer_opts *o)
{
	cwi_cache_writer *w = NULL;
	cachew_err rv = cwi_cache_writer_create(&w, r, fp, "range(3)", o);

	ck_assert_msg(rv == CACHEW_OK, "create: %s", cachew_errmsg());
	/* Uneven add sizes: the writer must not care. */
	for (size_t i = 0; i < n;) {
		size_t k = 1 + i % 7;
		if (k > n - i)
			k = n - i;
		rv = cwi_cache_writer_add(w, v + i, k);
		ck_assert_msg(rv == CACHEW_OK, "add: %s", cachew_errmsg());
		i += k;
	}
	rv = cwi_cache_writer_commit(w);
	ck_assert_msg(rv == CACHEW_OK, "commit: %s", cachew_errmsg());
	cwi_cache_writer_destroy(w);
}

/* Reads every chunk of the cache of fp in order. Returns the first error
 * (CACHEW_OK when all chunks read to their end); *out holds the elements
 * yielded until then. */
static cachew_err
read_cache(cwi_cache_root *r, const cachew_fingerprint *fp,
    cwi_element ***out, size_t *n, char *err, size_t errlen)
{
	cwi_cache_manifest *m = NULL;
	cwi_chunk c = {0};
	cachew_err rv = cwi_cache_lookup(r, fp, &m);

	*out = NULL;
	*n = 0;
	for (size_t i = 0; rv == CACHEW_OK && i < m->nchunks; i++) {
		cwi_cache_reader *rd = NULL;
		rv = cwi_cache_reader_open(&rd, r, m, i, true);
		while (rv == CACHEW_OK)
			rv = cwi_cache_reader_next(rd, &c, 5);
		if (rv == CACHEW_EOF)
			rv = CACHEW_OK;
		cwi_cache_reader_close(rd);
	}
	if (rv != CACHEW_OK && err != NULL)
		snprintf(err, errlen, "%s", cachew_errmsg());
	cwi_cache_manifest_free(m);
	*out = c.v;
	*n = c.n;
	return rv;
}

static void
assert_same(cwi_element **a, size_t na, cwi_element **b, size_t nb)
{
	ck_assert_uint_eq(na, nb);
	for (size_t i = 0; i < na; i++)
		ck_assert_msg(cwi_element_equal(a[i], b[i]), "element %zu differs",
		    i);
}

/* Every element yielded before a failure equals the original at its
 * position: no bad element ever comes out. */
static void
assert_prefix(cwi_element **got, size_t ngot, cwi_element **orig, size_t n)
{
	ck_assert_uint_le(ngot, n);
	for (size_t i = 0; i < ngot; i++)
		ck_assert_msg(cwi_element_equal(got[i], orig[i]),
		    "bad element %zu yielded", i);
}

static char *
path_in(const char *dir, const cachew_fingerprint *fp, const char *name)
{
	char hex[33];
	char *p;

	cachew_fingerprint_hex(fp, hex);
	p = cwi_asprintf("%s/%s/%s", dir, hex, name);
	ck_assert_ptr_nonnull(p);
	return p;
}

static bool
exists(const char *path)
{
	return access(path, F_OK) == 0;
}

static uint8_t *
slurp(const char *path, size_t *len)
{
	cwi_buffer *b = NULL;
	uint8_t *p;

	ck_assert_int_eq(cwi_file_read_all(path, NULL, &b, len), CACHEW_OK);
	p = malloc(*len + 1);
	memcpy(p, b->data, *len);
	cwi_buffer_unref(b);
	return p;
}

/* Entries of a directory other than . and .. */
static size_t
count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t n = 0;

	if (d == NULL)
		return 0;
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

static cwi_cache_manifest *
lookup_ok(cwi_cache_root *r, const cachew_fingerprint *fp)
{
	cwi_cache_manifest *m = NULL;
	cachew_err rv = cwi_cache_lookup(r, fp, &m);
	ck_assert_msg(rv == CACHEW_OK, "lookup: %s", cachew_errmsg());
	return m;
}

/* A mix of every dtype and shape the codec must carry: scalars, rank 1
 * to 8, empty tensors, strings with empty ones, several components. */
static cwi_element **
every_dtype_elements(size_t *n)
{
	static const cachew_dtype fixed[] = {CACHEW_U8, CACHEW_I32, CACHEW_I64,
	    CACHEW_F16, CACHEW_BF16, CACHEW_F32, CACHEW_F64, CACHEW_BOOL};
	static const char *const strs[] = {"", "a", "", "hello, cache", "",
	    "\x00\xff binary", "z"};
	cwi_element **v = calloc(64, sizeof(*v));
	size_t k = 0;

	for (size_t d = 0; d < sizeof(fixed) / sizeof(fixed[0]); d++) {
		int64_t s1[1] = {37}, s3[3] = {4, 5, 3}, s0[1] = {0},
			s8[8] = {2, 1, 2, 1, 3, 1, 2, 2}, s2e[2] = {3, 0};
		cwi_element *e = elem_new(6);
		set_fixed(e, 0, fixed[d], 0, NULL, (unsigned)d);
		set_fixed(e, 1, fixed[d], 1, s1, (unsigned)d + 1);
		set_fixed(e, 2, fixed[d], 3, s3, (unsigned)d + 2);
		set_fixed(e, 3, fixed[d], 1, s0, 0);
		set_fixed(e, 4, fixed[d], 8, s8, (unsigned)d + 3);
		set_fixed(e, 5, fixed[d], 2, s2e, 0);
		v[k++] = e;
	}
	{
		int64_t s1[1] = {7}, s23[2] = {2, 3}, s0[1] = {0};
		const char *six[] = {"ab", "", "cde", "", "", "f"};
		cwi_element *e = elem_new(5);
		set_strings(e, 0, 0, NULL, (const char *const[]){"scalar"});
		set_strings(e, 1, 1, s1, strs);
		set_strings(e, 2, 2, s23, six);
		set_strings(e, 3, 1, s0, NULL);
		set_strings(e, 4, 0, NULL, (const char *const[]){""});
		v[k++] = e;
	}
	{
		/* A big payload (zero-copy path) next to small ones. */
		int64_t big[3] = {32, 32, 3}, one[1] = {1};
		cwi_element *e = elem_new(3);
		set_fixed(e, 0, CACHEW_U8, 3, big, 9);
		cwi_tensor_init_i64(&e->comp[1], -42);
		set_strings(e, 2, 1, one, (const char *const[]){"label"});
		v[k++] = e;
	}
	*n = k;
	return v;
}

/* ---- element codec ------------------------------------------------------ */

START_TEST(test_codec_round_trips_every_dtype_and_shape)
{
	size_t n;
	cwi_element **v = every_dtype_elements(&n);

	for (size_t i = 0; i < n; i++) {
		cwi_strbuf sb;
		cwi_buffer *buf;
		cwi_element *copy = NULL, *view = NULL;
		size_t off = 0;

		cwi_strbuf_init(&sb);
		ck_assert_int_eq(cwi_element_encode(v[i], &sb), CACHEW_OK);
		/* Copying decode. */
		ck_assert_int_eq(cwi_element_decode(NULL, (uint8_t *)sb.data,
				     sb.len, &off, &copy),
		    CACHEW_OK);
		ck_assert_uint_eq(off, sb.len);
		ck_assert(cwi_element_equal(copy, v[i]));
		/* Zero-copy decode from an aligned buffer. */
		ck_assert_int_eq(cwi_buffer_alloc(&buf, sb.len, false), CACHEW_OK);
		memcpy(buf->data, sb.data, sb.len);
		off = 0;
		ck_assert_int_eq(
		    cwi_element_decode(buf, buf->data, sb.len, &off, &view),
		    CACHEW_OK);
		ck_assert(cwi_element_equal(view, v[i]));
		cwi_element_release(copy);
		cwi_element_release(view);
		cwi_buffer_unref(buf);
		cwi_strbuf_free(&sb);
	}
	elems_free(v, n);
}
END_TEST

/* The example of docs/cache-format.md, section 4, byte for byte. */
START_TEST(test_codec_writes_the_documented_bytes)
{
	static const uint8_t want[] = {0x92, 0x94, 0x03, 0x90, 0xc4, 0x00, 0xc4,
	    0x08, 0x05, 0, 0, 0, 0, 0, 0, 0, 0x94, 0x01, 0x91, 0x02, 0xc4, 0x00,
	    0xc4, 0x02, 0x07, 0x08};
	int64_t s[1] = {2};
	cwi_element *e = elem_new(2);
	uint8_t *p;
	cwi_strbuf sb;

	cwi_tensor_init_i64(&e->comp[0], 5);
	ck_assert_int_eq(cwi_tensor_init_alloc(&e->comp[1], CACHEW_U8, 1, s,
			     false, &p),
	    CACHEW_OK);
	p[0] = 7;
	p[1] = 8;
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_element_encode(e, &sb), CACHEW_OK);
	ck_assert_uint_eq(sb.len, sizeof(want));
	ck_assert_mem_eq(sb.data, want, sizeof(want));
	cwi_strbuf_free(&sb);
	cwi_element_release(e);
}
END_TEST

START_TEST(test_codec_payloads_are_aligned_zero_copy_slices)
{
	int64_t s[2] = {10, 10};
	cwi_element *e = elem_new(2), *d = NULL;
	cwi_strbuf sb;
	cwi_buffer *buf;
	size_t off = 0;

	set_fixed(e, 0, CACHEW_F32, 2, s, 1);
	set_fixed(e, 1, CACHEW_F64, 2, s, 2);
	cwi_strbuf_init(&sb);
	cwi_strbuf_append(&sb, "x", 1); /* an odd start */
	ck_assert_int_eq(cwi_element_encode(e, &sb), CACHEW_OK);
	ck_assert_int_eq(cwi_buffer_alloc(&buf, sb.len, false), CACHEW_OK);
	memcpy(buf->data, sb.data, sb.len);
	off = 1;
	ck_assert_int_eq(cwi_element_decode(buf, buf->data, sb.len, &off, &d),
	    CACHEW_OK);
	for (uint32_t c = 0; c < 2; c++) {
		ck_assert_ptr_eq(d->comp[c].buf, buf);
		ck_assert_uint_eq((uintptr_t)cwi_tensor_data(&d->comp[c]) % 16, 0);
	}
	ck_assert(cwi_element_equal(d, e));
	/* Shifted by one byte, the payload is copied, never misaligned. */
	cwi_buffer *shifted;
	ck_assert_int_eq(cwi_buffer_alloc(&shifted, sb.len + 1, false),
	    CACHEW_OK);
	memcpy(shifted->data + 1, sb.data, sb.len);
	cwi_element *d2 = NULL;
	off = 2;
	ck_assert_int_eq(cwi_element_decode(shifted, shifted->data, sb.len + 1,
			     &off, &d2),
	    CACHEW_OK);
	ck_assert_ptr_ne(d2->comp[0].buf, shifted);
	ck_assert(cwi_element_equal(d2, e));
	cwi_element_release(d2);
	cwi_buffer_unref(shifted);
	cwi_element_release(d);
	cwi_element_release(e);
	cwi_buffer_unref(buf);
	cwi_strbuf_free(&sb);
}
END_TEST

START_TEST(test_codec_rejects_every_truncation_and_bad_headers)
{
	size_t n;
	cwi_element **v = every_dtype_elements(&n);
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_element_encode(v[8], &sb), CACHEW_OK);
	for (size_t len = 0; len < sb.len; len++) {
		cwi_element *d = NULL;
		size_t off = 0;
		ck_assert_int_eq(cwi_element_decode(NULL, (uint8_t *)sb.data, len,
				     &off, &d),
		    CACHEW_ECORRUPT);
		ck_assert_ptr_null(d);
		ck_assert_msg(strstr(cachew_errmsg(), "element at byte 0") != NULL,
		    "%s", cachew_errmsg());
	}
	cwi_strbuf_free(&sb);
	/* An unknown dtype, a rank of 9, a data length that is not the
	 * shape's, too many components. */
	static const struct {
		const char *what;
		uint8_t bytes[16];
		size_t len;
	} bad[] = {
	    {"unknown dtype code", {0x91, 0x94, 0x0a, 0x90, 0xc4, 0, 0xc4, 1, 7},
		9},
	    {"rank exceeds 8",
		{0x91, 0x94, 0x01, 0x99, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0xc4, 0},
		15},
	    {"data length does not match",
		{0x91, 0x94, 0x01, 0x91, 0x02, 0xc4, 0, 0xc4, 3, 1, 2, 3}, 12},
	    {"components", {0x90}, 1},
	    {"string data length differs",
		{0x91, 0x94, 0x09, 0x90, 0x91, 0x02, 0xc4, 1, 'a'}, 9},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cwi_element *d = NULL;
		size_t off = 0;
		ck_assert_int_eq(cwi_element_decode(NULL, bad[i].bytes, bad[i].len,
				     &off, &d),
		    CACHEW_ECORRUPT);
		ck_assert_msg(strstr(cachew_errmsg(), bad[i].what) != NULL,
		    "%s: %s", bad[i].what, cachew_errmsg());
	}
	elems_free(v, n);
}
END_TEST

/* ---- writer and reader round trips -------------------------------------- */

START_TEST(test_cache_round_trips_every_dtype_and_shape)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(1);
	size_t n, ngot;
	cwi_element **v = every_dtype_elements(&n), **got;
	cwi_cache_writer_opts o = {.frame_bytes = 2048, .threads = 2};

	/* Repeat the mix so that frames hold several elements. The spec
	 * differs between elements (dtypes), so each kind gets its own
	 * cache. */
	for (size_t k = 0; k < n; k++) {
		cwi_element *rep[12];
		cachew_fingerprint f = fp_of(100 + k);
		for (size_t i = 0; i < 12; i++)
			rep[i] = v[k];
		write_cache(r, &f, rep, 12, &o);
		ck_assert_int_eq(read_cache(r, &f, &got, &ngot, NULL, 0),
		    CACHEW_OK);
		assert_same(got, ngot, rep, 12);
		elems_free(got, ngot);
	}
	(void)fp;
	elems_free(v, n);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_manifest_records_spec_with_varying_dims)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(2);
	cwi_element *v[3];
	cwi_cache_manifest *m;
	char hex[33];

	for (int i = 0; i < 3; i++) {
		int64_t s[3] = {2 + i, 3, 4 - i};
		v[i] = elem_new(2);
		set_fixed(v[i], 0, CACHEW_U8, 3, s, (unsigned)i);
		cwi_tensor_init_i64(&v[i]->comp[1], i);
	}
	write_cache(r, &fp, v, 3, NULL);
	m = lookup_ok(r, &fp);
	ck_assert_uint_eq(m->elements, 3);
	ck_assert_uint_eq(m->ncomponents, 2);
	ck_assert_int_eq(m->spec[0].dtype, CACHEW_U8);
	ck_assert_uint_eq(m->spec[0].rank, 3);
	ck_assert_int_eq(m->spec[0].shape[0], -1);
	ck_assert_int_eq(m->spec[0].shape[1], 3);
	ck_assert_int_eq(m->spec[0].shape[2], -1);
	ck_assert_int_eq(m->spec[1].dtype, CACHEW_I64);
	ck_assert_uint_eq(m->spec[1].rank, 0);
	ck_assert_str_eq(m->pipeline, "range(3)");
	ck_assert_uint_eq(m->writer_version, CACHEW_VERSION_NUMBER);
	ck_assert(m->created_unix > 1600000000);
	ck_assert_uint_eq(m->fp.lo, fp.lo);
	ck_assert_uint_eq(m->nchunks, 1);
	ck_assert_uint_eq(m->chunks[0].elements, 3);
	cachew_fingerprint_hex(&fp, hex);
	char *chunk = path_in(dir, &fp, m->chunks[0].name);
	struct stat st;
	ck_assert_int_eq(stat(chunk, &st), 0);
	ck_assert_uint_eq((uint64_t)st.st_size, m->chunks[0].bytes);
	ck_assert_uint_eq(m->bytes, m->chunks[0].bytes);
	free(chunk);
	cwi_cache_manifest_free(m);
	for (int i = 0; i < 3; i++)
		cwi_element_release(v[i]);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_small_chunks_rotate_and_keep_order)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(3);
	cwi_cache_writer_opts o = {.chunk_bytes = 4096, .frame_bytes = 200,
	    .threads = 3, .queue_bytes = 2000};
	size_t n = 3000, ngot;
	cwi_element **v = calloc(n, sizeof(*v)), **got;
	cwi_cache_manifest *m;
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++)
		v[i] = elem_i64((int64_t)i * 7 - 1000);
	write_cache(r, &fp, v, n, &o);
	m = lookup_ok(r, &fp);
	ck_assert_uint_ge(m->nchunks, 8);
	for (size_t i = 0; i < m->nchunks; i++) {
		ck_assert_uint_le(m->chunks[i].bytes, 4096);
		sum += m->chunks[i].elements;
	}
	ck_assert_uint_eq(sum, n);
	cwi_cache_manifest_free(m);
	ck_assert_int_eq(read_cache(r, &fp, &got, &ngot, NULL, 0), CACHEW_OK);
	assert_same(got, ngot, v, n);
	elems_free(got, ngot);
	elems_free(v, n);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_empty_cache_has_no_chunks)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(4);
	cwi_cache_manifest *m;

	write_cache(r, &fp, NULL, 0, NULL);
	m = lookup_ok(r, &fp);
	ck_assert_uint_eq(m->elements, 0);
	ck_assert_uint_eq(m->nchunks, 0);
	ck_assert_uint_eq(m->ncomponents, 0);
	cwi_cache_manifest_free(m);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

static cachew_err
collect(void *ctx, cwi_element *e)
{
	cwi_chunk *c = ctx;

	ck_assert_int_eq(cwi_chunk_reserve(c, 1), CACHEW_OK);
	cwi_chunk_push(c, e);
	return CACHEW_OK;
}

START_TEST(test_chunk_decode_reads_a_chunk_in_memory)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(5);
	cwi_element *v[50];
	cwi_cache_writer_opts o = {.frame_bytes = 100};
	cwi_chunk got = {0};
	cwi_cache_manifest *m;
	uint8_t *data;
	size_t len;

	for (int i = 0; i < 50; i++)
		v[i] = elem_i64(i);
	write_cache(r, &fp, v, 50, &o);
	m = lookup_ok(r, &fp);
	char *chunk = path_in(dir, &fp, m->chunks[0].name);
	data = slurp(chunk, &len);
	ck_assert_int_eq(cwi_cache_chunk_decode(data, len, collect, &got),
	    CACHEW_OK);
	assert_same(got.v, got.n, v, 50);
	/* Cut anywhere, it is corrupt. */
	for (size_t cut = 0; cut < len; cut += 7) {
		cwi_chunk part = {0};
		ck_assert_int_eq(cwi_cache_chunk_decode(data, cut, collect, &part),
		    CACHEW_ECORRUPT);
		assert_prefix(part.v, part.n, v, 50);
		cwi_chunk_free(&part);
	}
	free(data);
	free(chunk);
	cwi_cache_manifest_free(m);
	cwi_chunk_free(&got);
	for (int i = 0; i < 50; i++)
		cwi_element_release(v[i]);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- chunk formats: stored records, format 1 ---------------------------- */

/* Elements whose u8 payload (`bytes` each) is random (incompressible) or
 * zeros (compressible), with their index as an i64. */
static void
elems_payload(cwi_element **v, size_t n, size_t bytes, bool random)
{
	for (size_t i = 0; i < n; i++) {
		int64_t s[1] = {(int64_t)bytes};
		cwi_element *e = elem_new(2);
		if (random) {
			set_random(e, 0, 1, s, i + 1);
		} else {
			uint8_t *p;
			ck_assert_int_eq(cwi_tensor_init_alloc(&e->comp[0],
					     CACHEW_U8, 1, s, true, &p),
			    CACHEW_OK);
		}
		cwi_tensor_init_i64(&e->comp[1], (int64_t)i);
		v[i] = e;
	}
}

/* Releases n elements of an array the caller owns. */
static void
elems_release(cwi_element **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cwi_element_release(v[i]);
}

/* The chunk format version, and the kinds and element counts of the
 * records of a chunk file (read off its bytes as docs/cache-format.md
 * lays them out). */
static uint32_t
chunk_kinds(const char *path, uint32_t *kinds, uint32_t *nelems, size_t max,
    size_t *nkinds)
{
	size_t len, pos = CWI_CHUNK_HEADER_SIZE;
	uint8_t *p = slurp(path, &len);
	uint32_t version;
	cwi_chunk_header h;

	ck_assert_int_eq(cwi_chunk_header_parse(p, path, &h), CACHEW_OK);
	version = h.version;
	*nkinds = 0;
	for (;;) {
		cwi_chunk_rec r;
		bool trailer;
		ck_assert_int_eq(cwi_chunk_rec_parse(p + pos, version, path,
				     pos, &r, &trailer),
		    CACHEW_OK);
		if (trailer)
			break;
		ck_assert_uint_lt(*nkinds, max);
		nelems[*nkinds] = r.nelem;
		kinds[(*nkinds)++] = r.kind;
		pos += cwi_chunk_rec_size(version) + r.clen;
	}
	free(p);
	return version;
}

/* Writes n elements in the given chunk format (0: the current one) and
 * checks what its one chunk holds: its version and that every record is
 * of kind `kind`. The records' element counts go to nelems (64), and
 * their number is returned. */
static size_t
write_and_check_kinds(cwi_cache_root *r, const char *dir,
    const cachew_fingerprint *fp, cwi_element **v, size_t n,
    uint32_t chunk_version, uint32_t want_version, uint32_t kind,
    uint32_t *nelems)
{
	cwi_cache_writer_opts o = {.frame_bytes = 50000,
	    .chunk_version = chunk_version};
	uint32_t kinds[64];
	size_t nkinds;
	cwi_cache_manifest *m;
	char *chunk;

	write_cache(r, fp, v, n, &o);
	m = lookup_ok(r, fp);
	ck_assert_uint_eq(m->nchunks, 1);
	chunk = path_in(dir, fp, m->chunks[0].name);
	ck_assert_uint_eq(chunk_kinds(chunk, kinds, nelems, 64, &nkinds),
	    want_version);
	ck_assert_uint_ge(nkinds, 2);
	for (size_t i = 0; i < nkinds; i++)
		ck_assert_msg(kinds[i] == kind, "record %zu is of kind %u, not %u",
		    i, kinds[i], kind);
	free(chunk);
	cwi_cache_manifest_free(m);
	return nkinds;
}

/* Writers write format 2, with incompressible frames stored and
 * compressible ones as zstd frames; format 1 (all zstd) still reads;
 * both read back every element, and both pass verify. */
START_TEST(test_chunk_formats_1_and_2_both_read)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cwi_element *noise[20], *zeros[20];
	struct {
		cwi_element **v;
		uint32_t version, want, kind;
	} cases[] = {
	    {noise, 0, 2, CWI_CHUNK_REC_STORED},
	    {zeros, 0, 2, CWI_CHUNK_REC_ZSTD},
	    {noise, 1, 1, CWI_CHUNK_REC_ZSTD},
	    {zeros, 1, 1, CWI_CHUNK_REC_ZSTD},
	};

	elems_payload(noise, 20, 20000, true);
	elems_payload(zeros, 20, 20000, false);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		cachew_fingerprint fp = fp_of(100 + c);
		cwi_element **got = NULL;
		size_t ngot = 0;
		char err[512];
		uint32_t nelems[64];

		write_and_check_kinds(r, dir, &fp, cases[c].v, 20,
		    cases[c].version, cases[c].want, cases[c].kind, nelems);
		ck_assert_msg(read_cache(r, &fp, &got, &ngot, err,
				  sizeof(err)) == CACHEW_OK,
		    "case %zu: %s", c, err);
		assert_same(got, ngot, cases[c].v, 20);
		elems_free(got, ngot);
		ck_assert_msg(cwi_cache_verify(r, &fp) == CACHEW_OK,
		    "case %zu: %s", c, cachew_errmsg());
	}
	elems_release(noise, 20);
	elems_release(zeros, 20);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* A cache of 20 incompressible elements of 20 KB in one chunk of stored
 * records. */
typedef struct stored_cache {
	char *dir;
	cwi_cache_root *r;
	cachew_fingerprint fp;
	cwi_element *v[20];
	uint32_t nelems[64]; /* elements per record */
	size_t nrec;
} stored_cache;

static void
stored_setup(stored_cache *c)
{
	c->dir = cwt_tmpdir();
	c->r = root_at(c->dir, 0);
	c->fp = fp_of(120);
	elems_payload(c->v, 20, 20000, true);
	c->nrec = write_and_check_kinds(c->r, c->dir, &c->fp, c->v, 20, 0, 2,
	    CWI_CHUNK_REC_STORED, c->nelems);
}

static void
stored_teardown(stored_cache *c)
{
	elems_release(c->v, 20);
	cwi_cache_root_close(c->r);
	cwt_rmtree(c->dir);
	free(c->dir);
}

/* A stored record's elements point into the buffer the record was read
 * into: no copy after the read (one buffer per record, shared). */
START_TEST(test_stored_records_are_slices_of_the_read_buffer)
{
	stored_cache c;
	cwi_element **got = NULL;
	size_t ngot = 0, first = 0, shared = 0;
	const uint32_t *nelems = c.nelems;
	char err[512];

	stored_setup(&c);
	ck_assert_msg(read_cache(c.r, &c.fp, &got, &ngot, err, sizeof(err)) ==
		CACHEW_OK,
	    "%s", err);
	assert_same(got, ngot, c.v, 20);
	/* Every element of a record, every component, points into one
	 * buffer of the record's size; the next record has another. */
	for (size_t k = 0; k < c.nrec; first += nelems[k++]) {
		const cwi_buffer *b = got[first]->comp[0].buf;
		ck_assert_ptr_nonnull(b);
		ck_assert_uint_ge(b->size, nelems[k] * 20000u);
		ck_assert_uint_lt(b->size, nelems[k] * 20100u);
		if (k > 0)
			ck_assert_ptr_ne(b, got[first - 1]->comp[0].buf);
		for (size_t i = first; i < first + nelems[k]; i++) {
			const cwi_tensor *t = &got[i]->comp[0];
			ck_assert_ptr_eq(t->buf, b);
			ck_assert(cwi_tensor_data(t) >= b->data &&
			    cwi_tensor_data(t) + 20000 <= b->data + b->size);
			/* Aligned as section 4 promises. */
			ck_assert_uint_eq((uintptr_t)cwi_tensor_data(t) % 16, 0);
			shared += nelems[k] > 1;
		}
	}
	ck_assert_uint_eq(first, 20);
	ck_assert_uint_gt(shared, 10);
	elems_free(got, ngot);
	stored_teardown(&c);
}
END_TEST

/* A byte changed inside a stored record's payload is found by its XXH3
 * before any of its elements is yielded, and the error names the chunk,
 * the record and where its payload starts. */
START_TEST(test_damaged_stored_record_is_named)
{
	stored_cache c;
	cwi_element **got = NULL;
	size_t ngot = 0, len, pos = CWI_CHUNK_HEADER_SIZE;
	char err[512], want[64];
	cwi_cache_manifest *m;
	char *chunk;
	uint8_t *p;
	cwi_chunk_rec rec;
	bool trailer;

	stored_setup(&c);
	m = lookup_ok(c.r, &c.fp);
	chunk = path_in(c.dir, &c.fp, m->chunks[0].name);
	p = slurp(chunk, &len);
	/* Record 1's payload: after record 0's header and payload. */
	ck_assert_int_eq(cwi_chunk_rec_parse(p + pos, 2, chunk, pos, &rec,
			     &trailer),
	    CACHEW_OK);
	pos += CWI_CHUNK_REC2_SIZE + rec.clen + CWI_CHUNK_REC2_SIZE;
	p[pos + 5000] ^= 0x01;
	cwt_write_file(chunk, p, len);
	ck_assert_int_eq(read_cache(c.r, &c.fp, &got, &ngot, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	/* Record 0's elements, none of record 1's. */
	ck_assert_uint_eq(ngot, c.nelems[0]);
	assert_prefix(got, ngot, c.v, 20);
	snprintf(want, sizeof(want), "from byte %zu", pos);
	ck_assert_msg(strstr(err, chunk) != NULL && strstr(err, "record 1") &&
		strstr(err, want) != NULL && strstr(err, "XXH3") != NULL,
	    "%s", err);
	elems_free(got, ngot);
	free(p);
	free(chunk);
	cwi_cache_manifest_free(m);
	stored_teardown(&c);
}
END_TEST

/* ---- writers: abort, exclusion, dead writers ---------------------------- */

START_TEST(test_abort_leaves_nothing_visible)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(6);
	cwi_cache_writer_opts o = {.chunk_bytes = 512, .frame_bytes = 100};
	cwi_cache_writer *w = NULL;
	cwi_cache_manifest *m = NULL;
	cwi_element *v[400];

	for (int i = 0; i < 400; i++)
		v[i] = elem_i64(i);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", &o), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_add(w, v, 400), CACHEW_OK);
	cwi_cache_writer_destroy(w);
	ck_assert_uint_eq(count_entries(dir), 0);
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ENOENT);
	ck_assert_ptr_null(m);
	for (int i = 0; i < 400; i++)
		cwi_element_release(v[i]);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_second_writer_gets_eexist)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(7);
	cwi_cache_writer *w1 = NULL, *w2 = NULL;
	cwi_element *e = elem_i64(1);

	ck_assert_int_eq(cwi_cache_writer_create(&w1, r, &fp, "p", NULL),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_create(&w2, r, &fp, "p", NULL),
	    CACHEW_EEXIST);
	ck_assert_ptr_null(w2);
	ck_assert_msg(strstr(cachew_errmsg(), "being written") != NULL, "%s",
	    cachew_errmsg());
	ck_assert_int_eq(cwi_cache_writer_add(w1, &e, 1), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_commit(w1), CACHEW_OK);
	cwi_cache_writer_destroy(w1);
	ck_assert_int_eq(cwi_cache_writer_create(&w2, r, &fp, "p", NULL),
	    CACHEW_EEXIST);
	ck_assert_msg(strstr(cachew_errmsg(), "already exists") != NULL, "%s",
	    cachew_errmsg());
	/* A failed create left the complete cache alone. */
	cwi_cache_manifest *m = lookup_ok(r, &fp);
	cwi_cache_manifest_free(m);
	cwi_element_release(e);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Another process holds the cache's lock file (flock(1), so that the
 * child is not a copy of this test under valgrind): a writer here gets
 * EEXIST, and once the holder is gone a writer takes the directory. */
START_TEST(test_lock_held_by_another_process_gives_eexist)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(8);
	cwi_cache_writer *w = NULL;
	char *cdir = path_in(dir, &fp, ""), *lock = path_in(dir, &fp, ".lock");
	int in[2], out[2], status;
	char line[16] = {0};
	pid_t pid;

	if (access("/usr/bin/flock", X_OK) != 0) {
		printf("cache: skipping the cross-process lock test: no "
		       "/usr/bin/flock\n");
		goto done;
	}
	ck_assert_int_eq(mkdir(cdir, 0755), 0);
	ck_assert_int_eq(pipe(in), 0);
	ck_assert_int_eq(pipe(out), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		execl("/usr/bin/flock", "flock", "-x", lock, "-c",
		    "echo locked; exec cat", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	/* Wait until the lock is held: the child says so. */
	ck_assert_int_eq(read(out[0], line, 7), 7);
	ck_assert_str_eq(line, "locked\n");
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", NULL),
	    CACHEW_EEXIST);
	ck_assert_ptr_null(w);
	close(in[1]); /* cat ends, flock releases */
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	close(out[0]);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", NULL),
	    CACHEW_OK);
	cwi_cache_writer_destroy(w);
done:
	free(cdir);
	free(lock);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_dead_writer_leftovers_are_partial_and_replaced)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(9);
	cwi_cache_entry *v = NULL;
	cwi_element *e = elem_i64(5), **got;
	size_t n, ngot;
	char *cdir = path_in(dir, &fp, ""), *junk = path_in(dir, &fp,
					     "chunk-000000-dead.cwc"),
	     *tmp = path_in(dir, &fp, ".tmp-chunk-000001-x.cwc-1");

	ck_assert_int_eq(mkdir(cdir, 0755), 0);
	cwt_write_file(junk, "junk", 4);
	cwt_write_file(tmp, "more junk", 9);
	ck_assert_int_eq(cwi_cache_list(r, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(v[0].state, CWI_CACHE_PARTIAL);
	ck_assert_uint_eq(v[0].bytes, 13);
	cwi_cache_entries_free(v, n);
	write_cache(r, &fp, &e, 1, NULL);
	ck_assert(!exists(junk));
	ck_assert(!exists(tmp));
	ck_assert_int_eq(read_cache(r, &fp, &got, &ngot, NULL, 0), CACHEW_OK);
	assert_same(got, ngot, &e, 1);
	elems_free(got, ngot);
	cwi_element_release(e);
	free(cdir);
	free(junk);
	free(tmp);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_elements_of_another_spec_fail_the_write)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(10);
	cwi_cache_writer *w = NULL;
	cwi_element *a = elem_i64(1), *b = elem_new(1);
	cwi_cache_manifest *m = NULL;

	cwi_tensor_init_f64(&b->comp[0], 2.5);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", NULL),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_add(w, &a, 1), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_add(w, &b, 1), CACHEW_ETYPE);
	ck_assert_msg(strstr(cachew_errmsg(), "element 1: component 0 is f64[]") !=
		NULL,
	    "%s", cachew_errmsg());
	/* Sticky. */
	ck_assert_int_eq(cwi_cache_writer_add(w, &a, 1), CACHEW_ETYPE);
	ck_assert_int_eq(cwi_cache_writer_commit(w), CACHEW_ETYPE);
	cwi_cache_writer_destroy(w);
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ENOENT);
	ck_assert_uint_eq(count_entries(dir), 0);
	cwi_element_release(a);
	cwi_element_release(b);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- corruption --------------------------------------------------------- */

typedef struct damaged {
	char *dir;
	cwi_cache_root *r;
	cachew_fingerprint fp;
	cwi_element **v;
	size_t n;
	char **chunks; /* paths */
	uint8_t **orig;
	size_t *len;
	size_t nchunks;
	char *manifest, *bad;
	uint8_t *morig;
	size_t mlen;
} damaged;

/* A cache of 3 chunks of mixed elements to damage. */
static void
damaged_setup_version(damaged *d, uint32_t chunk_version)
{
	cwi_cache_writer_opts o = {.chunk_bytes = 1000, .frame_bytes = 300,
	    .chunk_version = chunk_version};
	cwi_cache_manifest *m;

	memset(d, 0, sizeof(*d));
	d->dir = cwt_tmpdir();
	d->r = root_at(d->dir, 0);
	d->fp = fp_of(11);
	d->n = 60;
	d->v = calloc(d->n, sizeof(*d->v));
	for (size_t i = 0; i < d->n; i++) {
		int64_t s[1] = {(int64_t)(i % 5) * 9};
		cwi_element *e = elem_new(2);
		set_random(e, 0, 1, s, i);
		cwi_tensor_init_i64(&e->comp[1], (int64_t)i);
		d->v[i] = e;
	}
	write_cache(d->r, &d->fp, d->v, d->n, &o);
	m = lookup_ok(d->r, &d->fp);
	ck_assert_uint_ge(m->nchunks, 3);
	d->nchunks = m->nchunks;
	d->chunks = calloc(d->nchunks, sizeof(char *));
	d->orig = calloc(d->nchunks, sizeof(uint8_t *));
	d->len = calloc(d->nchunks, sizeof(size_t));
	for (size_t i = 0; i < d->nchunks; i++) {
		d->chunks[i] = path_in(d->dir, &d->fp, m->chunks[i].name);
		d->orig[i] = slurp(d->chunks[i], &d->len[i]);
	}
	cwi_cache_manifest_free(m);
	d->manifest = path_in(d->dir, &d->fp, "manifest");
	d->bad = path_in(d->dir, &d->fp, "BAD");
	d->morig = slurp(d->manifest, &d->mlen);
}

/* A damaged-cache fixture in the format writers write. */
static void
damaged_setup(damaged *d)
{
	damaged_setup_version(d, 0);
}

/* Rewrites what differs from the original (rewriting a file costs
 * milliseconds on ext4: keep the loops over hundreds of flips fast). */
static void
restore_file(const char *path, const uint8_t *orig, size_t len)
{
	cwi_buffer *b = NULL;
	size_t got = 0;
	bool same = cwi_file_read_all(path, NULL, &b, &got) == CACHEW_OK &&
	    got == len && memcmp(b->data, orig, len) == 0;

	cwi_buffer_unref(b);
	if (!same)
		cwt_write_file(path, orig, len);
}

static void
damaged_restore(damaged *d)
{
	for (size_t i = 0; i < d->nchunks; i++)
		restore_file(d->chunks[i], d->orig[i], d->len[i]);
	restore_file(d->manifest, d->morig, d->mlen);
	(void)unlink(d->bad);
}

static void
damaged_free(damaged *d)
{
	for (size_t i = 0; i < d->nchunks; i++) {
		free(d->chunks[i]);
		free(d->orig[i]);
	}
	free(d->chunks);
	free(d->orig);
	free(d->len);
	free(d->manifest);
	free(d->bad);
	free(d->morig);
	elems_free(d->v, d->n);
	cwi_cache_root_close(d->r);
	cwt_rmtree(d->dir);
	free(d->dir);
}

/* Reads the damaged cache: it must fail with CACHEW_ECORRUPT naming
 * `file`, yield no bad element, and leave the cache marked bad. */
static void
expect_detected(damaged *d, const char *file, const char *what)
{
	cwi_element **got = NULL;
	size_t ngot = 0;
	char err[1024];
	cwi_cache_manifest *m = NULL;
	cachew_err rv = read_cache(d->r, &d->fp, &got, &ngot, err, sizeof(err));

	ck_assert_msg(rv == CACHEW_ECORRUPT, "%s: read gave %s (%s)", what,
	    cachew_strerror(rv), rv == CACHEW_OK ? "" : err);
	ck_assert_msg(strstr(err, file) != NULL, "%s: message '%s' does not "
						 "name %s",
	    what, err, file);
	assert_prefix(got, ngot, d->v, d->n);
	elems_free(got, ngot);
	ck_assert_msg(exists(d->bad), "%s: not marked bad", what);
	ck_assert_int_eq(cwi_cache_lookup(d->r, &d->fp, &m), CACHEW_ENOENT);
}

/* Flips every 37th bit of every chunk, one at a time: each is found. */
static void
expect_flips_detected(uint32_t chunk_version)
{
	damaged d;
	size_t flips = 0;

	damaged_setup_version(&d, chunk_version);
	for (size_t c = 0; c < d.nchunks; c++) {
		/* Every byte of the header, record headers, frames and
		 * trailer is covered by some flip (step coprime with 8). */
		for (size_t bit = 0; bit < d.len[c] * 8; bit += 37) {
			char what[64];
			uint8_t *p = malloc(d.len[c]);
			memcpy(p, d.orig[c], d.len[c]);
			p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			cwt_write_file(d.chunks[c], p, d.len[c]);
			free(p);
			snprintf(what, sizeof(what), "chunk %zu bit %zu", c, bit);
			expect_detected(&d, d.chunks[c], what);
			damaged_restore(&d);
			flips++;
		}
	}
	ck_assert_uint_gt(flips, 100);
	damaged_free(&d);
}

START_TEST(test_flipped_bits_in_chunks_are_detected)
{
	expect_flips_detected(0);
}
END_TEST

/* Caches written before chunk format 2 keep reading, with every defect
 * still found. */
START_TEST(test_flipped_bits_in_v1_chunks_are_detected)
{
	expect_flips_detected(1);
}
END_TEST

START_TEST(test_truncated_and_extended_chunks_are_detected)
{
	damaged d;

	damaged_setup(&d);
	for (size_t c = 0; c < d.nchunks; c++) {
		for (size_t cut = 0; cut < d.len[c]; cut += 23) {
			char what[64];
			snprintf(what, sizeof(what), "chunk %zu cut at %zu", c, cut);
			cwt_write_file(d.chunks[c], d.orig[c], cut);
			expect_detected(&d, d.chunks[c], what);
			damaged_restore(&d);
		}
	}
	/* One byte more at the end. */
	uint8_t *p = malloc(d.len[1] + 1);
	memcpy(p, d.orig[1], d.len[1]);
	p[d.len[1]] = 0;
	cwt_write_file(d.chunks[1], p, d.len[1] + 1);
	free(p);
	expect_detected(&d, d.chunks[1], "extended");
	damaged_free(&d);
}
END_TEST

START_TEST(test_missing_and_swapped_chunks_are_detected)
{
	damaged d;

	damaged_setup(&d);
	ck_assert_int_eq(unlink(d.chunks[1]), 0);
	expect_detected(&d, d.chunks[1], "missing");
	ck_assert_msg(strstr(cachew_errmsg(), "missing") != NULL, "%s",
	    cachew_errmsg());
	damaged_restore(&d);
	/* Chunk 0's bytes under chunk 2's name. */
	cwt_write_file(d.chunks[2], d.orig[0], d.len[0]);
	expect_detected(&d, d.chunks[2], "swapped");
	damaged_free(&d);
}
END_TEST

START_TEST(test_flipped_bits_in_the_manifest_are_detected)
{
	damaged d;
	cwi_cache_manifest *m = NULL;

	damaged_setup(&d);
	/* Every single-bit flip, through the decoder. */
	for (size_t bit = 0; bit < d.mlen * 8; bit++) {
		uint8_t *p = malloc(d.mlen);
		memcpy(p, d.morig, d.mlen);
		p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		ck_assert_msg(cwi_cache_manifest_decode(p, d.mlen, &m) ==
			CACHEW_ECORRUPT,
		    "bit %zu not detected", bit);
		ck_assert_ptr_null(m);
		free(p);
	}
	/* Every truncation. */
	for (size_t len = 0; len < d.mlen; len++)
		ck_assert_int_eq(cwi_cache_manifest_decode(d.morig, len, &m),
		    CACHEW_ECORRUPT);
	/* Through a lookup: reported with the path and marked bad. */
	uint8_t *p = malloc(d.mlen);
	memcpy(p, d.morig, d.mlen);
	p[d.mlen / 2] ^= 0x10;
	cwt_write_file(d.manifest, p, d.mlen);
	free(p);
	ck_assert_int_eq(cwi_cache_lookup(d.r, &d.fp, &m), CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), d.manifest) != NULL, "%s",
	    cachew_errmsg());
	ck_assert(exists(d.bad));
	ck_assert_int_eq(cwi_cache_lookup(d.r, &d.fp, &m), CACHEW_ENOENT);
	ck_assert_msg(strstr(cachew_errmsg(), "marked bad") != NULL, "%s",
	    cachew_errmsg());
	damaged_free(&d);
}
END_TEST

/* Rewrites the manifest with a valid checksum after `edit` changed it: a
 * different element spec, or counts that disagree with the chunks. */
static void
rewrite_manifest(damaged *d, void (*edit)(cwi_cache_manifest *m))
{
	cwi_cache_manifest *m = NULL;
	cwi_strbuf sb;

	ck_assert_int_eq(cwi_cache_manifest_decode(d->morig, d->mlen, &m),
	    CACHEW_OK);
	edit(m);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(m, &sb), CACHEW_OK);
	cwt_write_file(d->manifest, sb.data, sb.len);
	cwi_strbuf_free(&sb);
	cwi_cache_manifest_free(m);
}

static void
edit_dtype(cwi_cache_manifest *m)
{
	m->spec[1].dtype = CACHEW_I32;
}

static void
edit_dim(cwi_cache_manifest *m)
{
	m->spec[0].shape[0] = 9;
}

static void
edit_rank(cwi_cache_manifest *m)
{
	m->spec[1].rank = 1;
	m->spec[1].shape[0] = -1;
}

static void
edit_elements(cwi_cache_manifest *m)
{
	m->chunks[1].elements++;
	m->elements++;
}

static void
edit_xxh64(cwi_cache_manifest *m)
{
	m->chunks[2].xxh64 ^= 1;
}

START_TEST(test_a_different_spec_or_count_is_detected)
{
	damaged d;
	static void (*const edits[])(cwi_cache_manifest *) = {
	    edit_dtype, edit_dim, edit_rank, edit_elements, edit_xxh64};
	static const char *const names[] = {
	    "dtype", "dim", "rank", "elements", "xxh64"};

	damaged_setup(&d);
	for (size_t i = 0; i < 5; i++) {
		rewrite_manifest(&d, edits[i]);
		expect_detected(&d, d.dir, names[i]);
		damaged_restore(&d);
	}
	rewrite_manifest(&d, edit_dtype);
	expect_detected(&d, d.chunks[0], "dtype names the chunk");
	ck_assert_msg(strstr(cachew_errmsg(), "spec") != NULL, "%s",
	    cachew_errmsg());
	damaged_free(&d);
}
END_TEST

START_TEST(test_manifest_round_trips_and_rejects_bad_fields)
{
	cwi_cache_chunk_info ch[2] = {
	    {.name = "chunk-000000-x.cwc", .elements = 5, .bytes = 100,
		.xxh64 = 0xfedcba9876543210ULL},
	    {.name = "chunk-000001-x.cwc", .elements = 0, .bytes = 64,
		.xxh64 = 1}};
	cwi_cache_spec spec[2] = {{.dtype = CACHEW_BF16, .rank = 2,
				      .shape = {-1, 7}},
	    {.dtype = CACHEW_BYTES, .rank = 0}};
	cwi_cache_manifest in = {.fp = fp_of(77), .pipeline = "range(5) | "
							  "batch(2)",
	    .writer_version = 100, .cache_id = 0x1122334455667788ULL,
	    .created_unix = 1700000000, .elements = 5, .bytes = 164,
	    .ncomponents = 2, .spec = spec, .nchunks = 2, .chunks = ch};
	cwi_cache_manifest *out = NULL;
	cwi_strbuf sb;

	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &sb), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_manifest_decode(sb.data, sb.len, &out),
	    CACHEW_OK);
	ck_assert_uint_eq(out->fp.hi, in.fp.hi);
	ck_assert_uint_eq(out->fp.lo, in.fp.lo);
	ck_assert_str_eq(out->pipeline, in.pipeline);
	ck_assert_uint_eq(out->writer_version, 100);
	ck_assert_uint_eq(out->cache_id, in.cache_id);
	ck_assert_int_eq(out->created_unix, 1700000000);
	ck_assert_uint_eq(out->ncomponents, 2);
	ck_assert_int_eq(out->spec[0].dtype, CACHEW_BF16);
	ck_assert_int_eq(out->spec[0].shape[0], -1);
	ck_assert_int_eq(out->spec[0].shape[1], 7);
	ck_assert_int_eq(out->spec[1].dtype, CACHEW_BYTES);
	ck_assert_uint_eq(out->nchunks, 2);
	ck_assert_str_eq(out->chunks[1].name, "chunk-000001-x.cwc");
	ck_assert_uint_eq(out->chunks[0].xxh64, 0xfedcba9876543210ULL);
	cwi_cache_manifest_free(out);
	cwi_strbuf_free(&sb);
	/* Totals that disagree with the chunks, a name that climbs out. */
	in.bytes = 165;
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &sb), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_manifest_decode(sb.data, sb.len, &out),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "totals") != NULL, "%s",
	    cachew_errmsg());
	cwi_strbuf_free(&sb);
	in.bytes = 164;
	ch[0].name = "../../etc/passwd";
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &sb), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_manifest_decode(sb.data, sb.len, &out),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), "unsafe name") != NULL, "%s",
	    cachew_errmsg());
	cwi_strbuf_free(&sb);
}
END_TEST

/* ---- component names in the manifest ------------------------------------ */

static cwi_names *
names_of(uint32_t n, const char *a, const char *b)
{
	const char *v[2] = {a, b};
	cwi_names *t = cwi_names_create(n, v);

	ck_assert_ptr_nonnull(t);
	return t;
}

/* The manifest `in` with the first `find` of its body replaced by `repl`
 * and a trailer recomputed for the new body: what a writer with other
 * ideas (or damage with a valid checksum) would leave. msgpack containers
 * count items, not bytes, so a string may change length. */
static void
splice_manifest(const cwi_strbuf *in, const void *find, size_t flen,
    const void *repl, size_t rlen, cwi_strbuf *out)
{
	size_t body = in->len - 16, at = 0;
	uint8_t trailer[16];
	uint64_t h;

	while (at + flen <= body && memcmp(in->data + at, find, flen) != 0)
		at++;
	ck_assert_msg(at + flen <= body, "splice: pattern not in the body");
	cwi_strbuf_init(out);
	cwi_strbuf_append(out, in->data, at);
	cwi_strbuf_append(out, repl, rlen);
	cwi_strbuf_append(out, in->data + at + flen, body - at - flen);
	h = XXH64(out->data, out->len, 0);
	memcpy(trailer, "CWMF", 4);
	for (unsigned i = 0; i < 4; i++)
		trailer[4 + i] = (uint8_t)(out->len >> (8 * i));
	for (unsigned i = 0; i < 8; i++)
		trailer[8 + i] = (uint8_t)(h >> (8 * i));
	cwi_strbuf_append(out, trailer, 16);
	ck_assert(!out->oom);
}

static void
expect_bad_body(const cwi_strbuf *in, const void *find, size_t flen,
    const void *repl, size_t rlen, const char *needle)
{
	cwi_cache_manifest *m = NULL;
	cwi_strbuf sb;

	splice_manifest(in, find, flen, repl, rlen, &sb);
	ck_assert_int_eq(cwi_cache_manifest_decode(sb.data, sb.len, &m),
	    CACHEW_ECORRUPT);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(cachew_errmsg(), needle) != NULL,
	    "wanted '%s' in: %s", needle, cachew_errmsg());
	cwi_strbuf_free(&sb);
}

START_TEST(test_manifest_names_round_trip_and_bad_names_are_refused)
{
	cwi_cache_chunk_info ch[1] = {{.name = "chunk-000000-x.cwc",
	    .elements = 5, .bytes = 100, .xxh64 = 7}};
	cwi_cache_spec spec[2] = {{.dtype = CACHEW_I64, .rank = 1,
				      .shape = {2}},
	    {.dtype = CACHEW_I64, .rank = 0}};
	cwi_cache_manifest in = {.fp = fp_of(78), .pipeline = "p",
	    .writer_version = 100, .cache_id = 9, .created_unix = 1,
	    .elements = 5, .bytes = 100, .ncomponents = 2, .spec = spec,
	    .nchunks = 1, .chunks = ch};
	cwi_cache_manifest *out = NULL;
	cwi_strbuf sb, plain;
	char long_name[300];

	/* Named, and partly named (a zip of named and unnamed inputs). */
	in.names = names_of(2, "image", "label");
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &sb), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_manifest_decode(sb.data, sb.len, &out),
	    CACHEW_OK);
	ck_assert_ptr_nonnull(out->names);
	ck_assert_uint_eq(out->names->n, 2);
	ck_assert_str_eq(out->names->name[0], "image");
	ck_assert_str_eq(out->names->name[1], "label");
	cwi_cache_manifest_free(out);
	cwi_names_unref(in.names);
	in.names = names_of(2, NULL, "label");
	cwi_strbuf_init(&plain);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &plain), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_manifest_decode(plain.data, plain.len,
			     &out), CACHEW_OK);
	ck_assert_ptr_null(out->names->name[0]);
	ck_assert_str_eq(out->names->name[1], "label");
	cwi_cache_manifest_free(out);
	cwi_strbuf_free(&plain);
	/* No names: spec maps of two keys, as before names, and no table
	 * on decode. */
	cwi_names_unref(in.names);
	in.names = NULL;
	cwi_strbuf_init(&plain);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &plain), CACHEW_OK);
	ck_assert_ptr_null(memmem(plain.data, plain.len, "\x83\xa5" "dtype", 7));
	ck_assert_ptr_nonnull(memmem(plain.data, plain.len, "\x82\xa5" "dtype",
	    7));
	ck_assert_int_eq(cwi_cache_manifest_decode(plain.data, plain.len,
			     &out), CACHEW_OK);
	ck_assert_ptr_null(out->names);
	cwi_cache_manifest_free(out);
	cwi_strbuf_free(&plain);

	/* The decoder trusts no name: a control character, a NUL, a name
	 * over 255 bytes, an empty one, one that is no string, two alike. */
	expect_bad_body(&sb, "\xa5image", 6, "\xa5im\tge", 6,
	    "spec component 0: the name is not 1 to 255 bytes");
	expect_bad_body(&sb, "\xa5image", 6, "\xa5im\0ge", 6,
	    "spec component 0: the name is not");
	memset(long_name, 'y', sizeof(long_name));
	long_name[0] = (char)0xd9;
	long_name[1] = (char)0xff; /* 255 bytes: still fine */
	{
		cwi_strbuf ok;
		splice_manifest(&sb, "\xa5image", 6, long_name, 257, &ok);
		ck_assert_int_eq(cwi_cache_manifest_decode(ok.data, ok.len,
				     &out), CACHEW_OK);
		ck_assert_uint_eq(strlen(out->names->name[0]), 255);
		cwi_cache_manifest_free(out);
		cwi_strbuf_free(&ok);
	}
	long_name[0] = (char)0xda; /* str16 of 256 bytes */
	long_name[1] = 0x01;
	long_name[2] = 0x00;
	expect_bad_body(&sb, "\xa5image", 6, long_name, 259,
	    "spec component 0: the name is not 1 to 255 bytes");
	expect_bad_body(&sb, "\xa5image", 6, "\xa0", 1,
	    "spec component 0: the name is not");
	expect_bad_body(&sb, "\xa5image", 6, "\xcc\x05", 2,
	    "spec component 0: 'name' is not a string");
	expect_bad_body(&sb, "\xa5label", 6, "\xa5image", 6,
	    "spec components 0 and 1 are both named 'image'");

	/* The encoder refuses what the decoder would: its manifests always
	 * read back. */
	in.names = names_of(2, "same", "same");
	cwi_strbuf_init(&plain);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &plain),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "both named 'same'") != NULL,
	    "%s", cachew_errmsg());
	cwi_names_unref(in.names);
	in.names = names_of(1, "one", NULL);
	ck_assert_int_eq(cwi_cache_manifest_encode(&in, &plain),
	    CACHEW_ETYPE);
	ck_assert_msg(strstr(cachew_errmsg(), "1 component names for 2 "
					      "components") != NULL,
	    "%s", cachew_errmsg());
	cwi_names_unref(in.names);
	cwi_strbuf_free(&plain);
	cwi_strbuf_free(&sb);
}
END_TEST

/* A manifest an older writer wrote (the fuzz corpus's, committed before
 * names existed) reads as unnamed and re-encodes to the same bytes: the
 * new key changed nothing for unnamed caches. */
START_TEST(test_manifest_of_an_older_writer_reads_unnamed)
{
	cwi_cache_manifest *m = NULL;
	cwi_strbuf sb;
	uint8_t *old;
	size_t len;

	old = slurp("test/fuzz/corpus/fuzz_cache_manifest/valid_two_chunks",
	    &len);
	ck_assert_msg(cwi_cache_manifest_decode(old, len, &m) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert_uint_gt(m->ncomponents, 0);
	ck_assert_ptr_null(m->names);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(m, &sb), CACHEW_OK);
	/* The writer string and version are this build's: compare the
	 * decoded spec, and the bytes up to the "version" key. */
	ck_assert_ptr_null(memmem(sb.data, sb.len, "\x83\xa5" "dtype", 7));
	ck_assert_ptr_nonnull(memmem(old, len, "\xa4spec", 5));
	{
		const uint8_t *a = memmem(old, len, "\xa7version", 8);
		const char *b = memmem(sb.data, sb.len, "\xa7version", 8);
		ck_assert_ptr_nonnull(a);
		ck_assert_ptr_nonnull(b);
		ck_assert_uint_eq((size_t)(a - old), (size_t)(b - sb.data));
		ck_assert_int_eq(memcmp(old, sb.data, (size_t)(a - old)), 0);
	}
	cwi_strbuf_free(&sb);
	cwi_cache_manifest_free(m);
	free(old);
}
END_TEST

START_TEST(test_writer_records_the_names_it_is_given)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(79), empty = fp_of(80), bad = fp_of(81);
	cwi_names *two = names_of(2, "image", "label");
	cwi_cache_writer_opts o = {.names = two};
	cwi_cache_writer *w = NULL;
	cwi_cache_manifest *m;
	cwi_element *e = elem_new(2), *one = elem_i64(5);
	int64_t shape[1] = {2};

	set_fixed(e, 0, CACHEW_I64, 1, shape, 1);
	cwi_tensor_init_i64(&e->comp[1], 3);
	write_cache(r, &fp, &e, 1, &o);
	m = lookup_ok(r, &fp);
	ck_assert_ptr_nonnull(m->names);
	ck_assert_str_eq(m->names->name[0], "image");
	ck_assert_str_eq(m->names->name[1], "label");
	cwi_cache_manifest_free(m);
	/* An empty cache has no components to name. */
	write_cache(r, &empty, NULL, 0, &o);
	m = lookup_ok(r, &empty);
	ck_assert_uint_eq(m->ncomponents, 0);
	ck_assert_ptr_null(m->names);
	cwi_cache_manifest_free(m);
	/* Names for another count of components fail the commit: nothing
	 * becomes visible. */
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &bad, "p", &o),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_add(w, &one, 1), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_commit(w), CACHEW_ETYPE);
	ck_assert_msg(strstr(cachew_errmsg(), "2 component names for 1") !=
			  NULL, "%s", cachew_errmsg());
	cwi_cache_writer_destroy(w);
	ck_assert_int_eq(cwi_cache_lookup(r, &bad, &m), CACHEW_ENOENT);
	/* The writer held its own reference. */
	ck_assert_uint_eq(atomic_load(&two->refs), 1);
	cwi_names_unref(two);
	cwi_element_release(e);
	cwi_element_release(one);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* The build-time read: no directory made, nothing marked bad, a FIFO
 * never waited on. */
START_TEST(test_peek_reads_a_manifest_without_side_effects)
{
	char *dir = cwt_tmpdir();
	char *missing = cwi_asprintf("%s/not/there", dir);
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(82), fifo = fp_of(83);
	cwi_names *names = names_of(1, "x", NULL);
	cwi_cache_writer_opts o = {.names = names};
	cwi_cache_manifest *m = NULL;
	cwi_element *e = elem_i64(4);
	char *manifest = path_in(dir, &fp, "manifest");
	char *fifo_dir = path_in(dir, &fifo, "");
	char *fifo_path = path_in(dir, &fifo, "manifest");
	char *bad = path_in(dir, &fp, "BAD");
	uint8_t *orig;
	size_t len;

	ck_assert_int_eq(cwi_cache_peek(missing, &fp, &m), CACHEW_ENOENT);
	ck_assert(!exists(missing));
	write_cache(r, &fp, &e, 1, &o);
	ck_assert_msg(cwi_cache_peek(dir, &fp, &m) == CACHEW_OK, "%s",
	    cachew_errmsg());
	ck_assert_uint_eq(m->elements, 1);
	ck_assert_str_eq(m->names->name[0], "x");
	cwi_cache_manifest_free(m);
	/* Damaged: an error, but the cache is not marked bad by a peek (the
	 * run's lookup finds the damage and reports it itself). */
	orig = slurp(manifest, &len);
	orig[len / 2] ^= 1;
	cwt_write_file(manifest, orig, len);
	ck_assert_int_eq(cwi_cache_peek(dir, &fp, &m), CACHEW_ECORRUPT);
	ck_assert_ptr_null(m);
	ck_assert(!exists(bad));
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ECORRUPT);
	ck_assert(exists(bad));
	/* Marked bad (by that lookup), with the manifest good again: not a
	 * cache. */
	orig[len / 2] ^= 1;
	cwt_write_file(manifest, orig, len);
	ck_assert_int_eq(cwi_cache_peek(dir, &fp, &m), CACHEW_ENOENT);
	ck_assert_msg(strstr(cachew_errmsg(), "marked bad") != NULL, "%s",
	    cachew_errmsg());
	/* A FIFO named like the manifest fails at once. */
	ck_assert_int_eq(mkdir(fifo_dir, 0755), 0);
	ck_assert_int_eq(mkfifo(fifo_path, 0644), 0);
	ck_assert_int_ne(cwi_cache_peek(dir, &fifo, &m), CACHEW_OK);
	ck_assert_ptr_null(m);
	cwi_names_unref(names);
	cwi_element_release(e);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(orig);
	free(bad);
	free(fifo_path);
	free(fifo_dir);
	free(manifest);
	free(missing);
	free(dir);
}
END_TEST

/* A shared lock in a read-only directory without a lock file is no lock
 * at all (nothing can change what is read): it failed with ENOENT, the
 * read-only open's error replacing the EROFS that said why (a cache
 * copied onto a read-only mount could not be read). The directory is
 * made read-only by a bind mount in a private mount namespace of a
 * child, which takes the mounts with it when it exits; skipped where
 * namespaces are not allowed, and under valgrind (no fork). */
START_TEST(test_a_read_only_cache_dir_without_a_lock_file_reads)
{
	char *dir = cwt_tmpdir();
	pid_t pid;
	int status = 0;

	if (getenv("CWT_VALGRIND") != NULL) {
		cwt_rmtree(dir);
		free(dir);
		return;
	}
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = 0;
		alarm(20);
		if (unshare(CLONE_NEWNS) != 0 ||
		    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
		    mount(dir, dir, NULL, MS_BIND, NULL) != 0 ||
		    mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY,
			NULL) != 0)
			_exit(77);
		if (cwi_cache_lock(dir, LOCK_SH, true, &fd) != CACHEW_OK)
			_exit(2);
		if (fd != -1)
			_exit(3);
		/* An exclusive lock there is refused, naming why. */
		if (cwi_cache_lock(dir, LOCK_EX, true, &fd) == CACHEW_OK ||
		    strstr(cachew_errmsg(), "Read-only") == NULL)
			_exit(4);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status), "child killed by signal %d",
	    WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	if (WEXITSTATUS(status) == 77)
		fprintf(stderr, "read-only cache dir: no mount namespace here, "
		    "skipped\n");
	else
		ck_assert_int_eq(WEXITSTATUS(status), 0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- bad markers and management ----------------------------------------- */

START_TEST(test_mark_bad_hides_the_cache_and_a_writer_replaces_it)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(12);
	cwi_element *e = elem_i64(3), **got;
	cwi_cache_manifest *m = NULL;
	cwi_cache_entry *v;
	size_t n, ngot;

	write_cache(r, &fp, &e, 1, NULL);
	ck_assert_int_eq(cwi_cache_mark_bad(r, &fp, "test: a reason"), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ENOENT);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(cachew_errmsg(), "test: a reason") != NULL, "%s",
	    cachew_errmsg());
	ck_assert_int_eq(cwi_cache_list(r, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(v[0].state, CWI_CACHE_BAD);
	ck_assert_str_eq(v[0].reason, "test: a reason");
	ck_assert_str_eq(cwi_cache_state_name(v[0].state), "bad");
	cwi_cache_entries_free(v, n);
	/* A writer may replace a bad cache. */
	write_cache(r, &fp, &e, 1, NULL);
	ck_assert_int_eq(read_cache(r, &fp, &got, &ngot, NULL, 0), CACHEW_OK);
	assert_same(got, ngot, &e, 1);
	elems_free(got, ngot);
	cwi_element_release(e);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_list_reports_every_state)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint a = fp_of(20), b = fp_of(21), c = fp_of(22),
			   d = fp_of(23);
	cwi_cache_writer *w = NULL;
	cwi_element *e[3] = {elem_i64(1), elem_i64(2), elem_i64(3)};
	cwi_cache_entry *v;
	size_t n;

	write_cache(r, &a, e, 3, NULL);
	write_cache(r, &b, e, 1, NULL);
	ck_assert_int_eq(cwi_cache_mark_bad(r, &b, "why"), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &c, "p", NULL),
	    CACHEW_OK);
	char *ddir = path_in(dir, &d, "");
	ck_assert_int_eq(mkdir(ddir, 0755), 0);
	free(ddir);
	ck_assert_int_eq(cwi_cache_list(r, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 4);
	/* Sorted by fingerprint: a, b, c, d. */
	ck_assert_int_eq(v[0].state, CWI_CACHE_COMPLETE);
	ck_assert_str_eq(v[0].pipeline, "range(3)");
	ck_assert_uint_eq(v[0].elements, 3);
	ck_assert_uint_gt(v[0].bytes, 64);
	ck_assert(v[0].created_unix > 0);
	ck_assert_int_eq(v[0].last_read_unix, 0);
	ck_assert_int_eq(v[1].state, CWI_CACHE_BAD);
	ck_assert_int_eq(v[2].state, CWI_CACHE_WRITING);
	ck_assert_int_eq(v[3].state, CWI_CACHE_PARTIAL);
	cwi_cache_entries_free(v, n);
	cwi_cache_writer_destroy(w);
	for (int i = 0; i < 3; i++)
		cwi_element_release(e[i]);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_verify_passes_a_good_cache_and_marks_a_bad_one)
{
	damaged d;
	cwi_cache_entry *v;
	size_t n;

	damaged_setup(&d);
	ck_assert_int_eq(cwi_cache_verify(d.r, &d.fp), CACHEW_OK);
	uint8_t *p = malloc(d.len[2]);
	memcpy(p, d.orig[2], d.len[2]);
	p[d.len[2] - 40] ^= 4;
	cwt_write_file(d.chunks[2], p, d.len[2]);
	free(p);
	ck_assert_int_eq(cwi_cache_verify(d.r, &d.fp), CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), d.chunks[2]) != NULL, "%s",
	    cachew_errmsg());
	ck_assert_int_eq(cwi_cache_list(d.r, &v, &n), CACHEW_OK);
	ck_assert_int_eq(v[0].state, CWI_CACHE_BAD);
	ck_assert_msg(strstr(v[0].reason, d.chunks[2]) != NULL, "%s",
	    v[0].reason);
	cwi_cache_entries_free(v, n);
	damaged_free(&d);
}
END_TEST

START_TEST(test_remove_deletes_but_not_while_read)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(30);
	cwi_element *e = elem_i64(3);
	cwi_cache_manifest *m;
	cwi_cache_reader *rd = NULL;

	write_cache(r, &fp, &e, 1, NULL);
	m = lookup_ok(r, &fp);
	ck_assert_int_eq(cwi_cache_reader_open(&rd, r, m, 0, true), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_remove(r, &fp), CACHEW_EIO);
	ck_assert_msg(strstr(cachew_errmsg(), "being read or written") != NULL,
	    "%s", cachew_errmsg());
	cwi_cache_reader_close(rd);
	ck_assert_int_eq(cwi_cache_remove(r, &fp), CACHEW_OK);
	ck_assert_uint_eq(count_entries(dir), 0);
	ck_assert_int_eq(cwi_cache_remove(r, &fp), CACHEW_ENOENT);
	/* The manifest of a removed cache opens nothing. */
	ck_assert_int_eq(cwi_cache_reader_open(&rd, r, m, 0, true), CACHEW_ENOENT);
	/* Nor that of a cache written again since (its chunks have other
	 * names): not damage, so the new cache is not marked bad (it was:
	 * "the chunk file is missing"). */
	write_cache(r, &fp, &e, 1, NULL);
	ck_assert_int_eq(cwi_cache_reader_open(&rd, r, m, 0, true), CACHEW_ENOENT);
	ck_assert_msg(strstr(cachew_errmsg(), "replaced or removed since it "
			  "was looked up") != NULL, "%s", cachew_errmsg());
	cwi_cache_manifest_free(m);
	m = lookup_ok(r, &fp);
	ck_assert_int_eq(cwi_cache_reader_open(&rd, r, m, 0, true), CACHEW_OK);
	cwi_cache_reader_close(rd);
	cwi_cache_manifest_free(m);
	cwi_element_release(e);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

static void
set_last_read(const char *dir, const cachew_fingerprint *fp, time_t t)
{
	char *p = path_in(dir, fp, "last_read");
	struct timespec ts[2] = {{.tv_sec = t}, {.tv_sec = t}};

	cwt_write_file(p, "", 0);
	ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
	free(p);
}

static uint64_t
cache_bytes(cwi_cache_root *r, const cachew_fingerprint *fp)
{
	cwi_cache_manifest *m = lookup_ok(r, fp);
	uint64_t b = m->bytes;
	cwi_cache_manifest_free(m);
	return b;
}

START_TEST(test_gc_evicts_least_recently_read_first)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp[4] = {fp_of(40), fp_of(41), fp_of(42), fp_of(43)};
	cwi_element *e[20];
	cwi_cache_manifest *m = NULL;
	uint64_t freed = 0, total = 0;
	time_t now = time(NULL);

	for (int i = 0; i < 20; i++)
		e[i] = elem_i64(i);
	for (int i = 0; i < 4; i++)
		write_cache(r, &fp[i], e, 20, NULL);
	/* Read order, oldest first: 2, 0, 3, 1. */
	set_last_read(dir, &fp[2], now - 400);
	set_last_read(dir, &fp[0], now - 300);
	set_last_read(dir, &fp[3], now - 200);
	set_last_read(dir, &fp[1], now - 100);
	ck_assert_int_eq(cwi_cache_usage(r, NULL, &total), CACHEW_OK);
	/* Room for a bit more than two caches. */
	ck_assert_int_eq(cwi_cache_gc(r, total / 2 + 10, &freed), CACHEW_OK);
	ck_assert_uint_eq(freed, total / 2);
	ck_assert_int_eq(cwi_cache_lookup(r, &fp[2], &m), CACHEW_ENOENT);
	ck_assert_int_eq(cwi_cache_lookup(r, &fp[0], &m), CACHEW_ENOENT);
	m = lookup_ok(r, &fp[3]);
	cwi_cache_manifest_free(m);
	m = lookup_ok(r, &fp[1]);
	cwi_cache_manifest_free(m);
	/* Within the limit: nothing to do. */
	ck_assert_int_eq(cwi_cache_gc(r, total, &freed), CACHEW_OK);
	ck_assert_uint_eq(freed, 0);
	for (int i = 0; i < 20; i++)
		cwi_element_release(e[i]);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_gc_leaves_caches_being_read_or_written)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint a = fp_of(50), b = fp_of(51), c = fp_of(52);
	cwi_element *e[10], **got;
	cwi_cache_manifest *m;
	cwi_cache_reader *rd = NULL;
	cwi_cache_writer *w = NULL;
	cwi_chunk ch = {0};
	uint64_t freed = 0;
	size_t ngot;

	for (int i = 0; i < 10; i++)
		e[i] = elem_i64(i);
	write_cache(r, &a, e, 10, NULL);
	write_cache(r, &b, e, 10, NULL);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &c, "p", NULL),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_add(w, e, 10), CACHEW_OK);
	uint64_t before = 0, after = 0;
	cwi_cache_manifest *mb = NULL;
	m = lookup_ok(r, &a);
	ck_assert_int_eq(cwi_cache_reader_open(&rd, r, m, 0, true), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_reader_next(rd, &ch, 3), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_usage(r, NULL, &before), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_gc(r, 0, &freed), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_usage(r, NULL, &after), CACHEW_OK);
	/* b went; a (being read) and c (being written) stayed. */
	ck_assert_uint_gt(freed, 0);
	ck_assert_uint_eq(freed, before - after);
	ck_assert_int_eq(cwi_cache_lookup(r, &b, &mb), CACHEW_ENOENT);
	while (cwi_cache_reader_next(rd, &ch, 3) == CACHEW_OK)
		;
	assert_same(ch.v, ch.n, e, 10);
	cwi_chunk_free(&ch);
	cwi_cache_reader_close(rd);
	cwi_cache_manifest_free(m);
	ck_assert_int_eq(cwi_cache_writer_commit(w), CACHEW_OK);
	cwi_cache_writer_destroy(w);
	ck_assert_int_eq(read_cache(r, &c, &got, &ngot, NULL, 0), CACHEW_OK);
	assert_same(got, ngot, e, 10);
	elems_free(got, ngot);
	/* Nobody holds them now. */
	ck_assert_int_eq(cwi_cache_gc(r, 0, &freed), CACHEW_OK);
	ck_assert_uint_eq(count_entries(dir), 0);
	for (int i = 0; i < 10; i++)
		cwi_element_release(e[i]);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_capacity_evicts_then_refuses)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r0 = root_at(dir, 0), *r;
	cachew_fingerprint a = fp_of(60), b = fp_of(61), c = fp_of(62);
	cwi_element *e[40];
	cwi_cache_manifest *m = NULL;
	cwi_cache_writer *w = NULL;
	uint64_t one;

	for (int i = 0; i < 40; i++) {
		int64_t s[1] = {64};
		e[i] = elem_new(1);
		set_random(e[i], 0, 1, s, (uint64_t)i);
	}
	write_cache(r0, &a, e, 20, NULL);
	one = cache_bytes(r0, &a);
	/* Room for one cache of 20 elements and a half. */
	r = root_at(dir, one + one / 2);
	write_cache(r, &b, e, 20, NULL);
	ck_assert_int_eq(cwi_cache_lookup(r, &a, &m), CACHEW_ENOENT);
	m = lookup_ok(r, &b);
	cwi_cache_manifest_free(m);
	/* 40 elements never fit: refused, b stays evicted only if needed. */
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &c, "p", NULL),
	    CACHEW_OK);
	cachew_err rv = cwi_cache_writer_add(w, e, 40);
	if (rv == CACHEW_OK)
		rv = cwi_cache_writer_commit(w);
	ck_assert_int_eq(rv, CACHEW_ENOMEM);
	ck_assert_msg(strstr(cachew_errmsg(), dir) != NULL &&
		strstr(cachew_errmsg(), "capacity") != NULL,
	    "%s", cachew_errmsg());
	cwi_cache_writer_destroy(w);
	ck_assert_int_eq(cwi_cache_lookup(r, &c, &m), CACHEW_ENOENT);
	for (int i = 0; i < 40; i++)
		cwi_element_release(e[i]);
	cwi_cache_root_close(r);
	cwi_cache_root_close(r0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_probe_measures_positive_rates)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cwi_cache_probe_result res;

	ck_assert_int_eq(cwi_cache_probe(r, 3000, 200000, &res), CACHEW_OK);
	ck_assert(res.read_mb_per_s > 0);
	ck_assert(res.read_elements_per_s > 0);
	ck_assert(res.write_mb_per_s > 0);
	/* The probe cleaned up after itself. */
	ck_assert_uint_eq(count_entries(dir), 0);
	ck_assert_int_eq(cwi_cache_probe(r, 0, 100, &res), CACHEW_ERANGE);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_root_rejects_unsupported_urls)
{
	cwi_cache_root *r = NULL;

	ck_assert_int_eq(cwi_cache_root_open(&r, "gs://b/p", 0), CACHEW_ENOTSUP);
	ck_assert_int_eq(cwi_cache_root_open(&r, "", 0), CACHEW_EINVAL);
	ck_assert_int_eq(cwi_cache_root_open(&r, "s3://", 0), CACHEW_EINVAL);
	ck_assert_ptr_null(r);
}
END_TEST

/* ---- S3 roots (s3rver) --------------------------------------------------- */

START_TEST(test_s3_root_round_trip_corruption_and_management)
{
	char mod[512], *dir, *store, *seed, *portfile, *cmd, url[64];
	const char *npm = getenv("CACHEW_NPM_DIR");
	cachew_fingerprint fp = fp_of(90), other = fp_of(91);
	cwi_names *names = names_of(2, "pixels", "index");
	cwi_cache_writer_opts o = {.chunk_bytes = 1000, .frame_bytes = 300,
	    .names = names};
	char hex[33], *get;
	cwi_cache_writer *w = NULL;
	cwi_cache_manifest *m = NULL;
	cwi_cache_root *r = NULL;
	cwi_cache_entry *v = NULL;
	cwi_element *e[40], **got;
	size_t n, ngot;
	char err[1024];
	pid_t pid;
	int port;

	snprintf(mod, sizeof(mod), "%s/node_modules/s3rver",
	    npm != NULL ? npm : "build/npm");
	if (access(mod, R_OK) != 0) {
		printf("cache: skipping the S3 test: s3rver is not installed "
		       "(run sh .ci/test-deps.sh)\n");
		cwi_names_unref(names); /* ASan's leak check runs on a skip too */
		return;
	}
	dir = cwt_tmpdir();
	store = cwi_asprintf("%s/store", dir);
	seed = cwi_asprintf("%s/seed", dir);
	portfile = cwi_asprintf("%s/port", dir);
	ck_assert_int_eq(mkdir(store, 0755), 0);
	ck_assert_int_eq(mkdir(seed, 0755), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char *node_path = cwi_asprintf("%s/..", mod);
		setenv("NODE_PATH", node_path, 1);
		execlp("node", "node", "test/servers/s3rver_launch.js", store,
		    "bkt", seed, portfile, (char *)NULL);
		_exit(127);
	}
	port = cwt_await_port(portfile, pid);
	ck_assert_msg(port > 0, "s3rver did not start");
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	setenv("AWS_ENDPOINT_URL", url, 1);
	setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);

	for (int i = 0; i < 40; i++) {
		int64_t s[1] = {(int64_t)(i % 7) * 5};
		e[i] = elem_new(2);
		set_random(e[i], 0, 1, s, (uint64_t)i);
		cwi_tensor_init_i64(&e[i]->comp[1], i);
	}
	r = root_at("s3://bkt/caches/", 0);
	ck_assert_str_eq(cwi_cache_root_path(r), "s3://bkt/caches");
	write_cache(r, &fp, e, 40, &o);
	m = lookup_ok(r, &fp);
	ck_assert_uint_ge(m->nchunks, 2);
	ck_assert_int_eq(read_cache(r, &fp, &got, &ngot, err, sizeof(err)),
	    CACHEW_OK);
	assert_same(got, ngot, e, 40);
	elems_free(got, ngot);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", NULL),
	    CACHEW_EEXIST);
	ck_assert_int_eq(cwi_cache_verify(r, &fp), CACHEW_OK);
	/* Names through an S3 root: cache_get knows the spec, names and
	 * cardinality at build from the object store's manifest, and names
	 * the elements. */
	ck_assert_str_eq(m->names->name[0], "pixels");
	cachew_fingerprint_hex(&fp, hex);
	get = cwi_asprintf("cache_get(\"s3://bkt/caches/\", \"%s\")", hex);
	cwt_spec_is(get, "{pixels: u8[-1], index: i64[]}");
	ck_assert_int_eq(cwt_card(get), 40);
	{
		cachew_element **named;
		size_t nnamed;
		ck_assert_msg(cwt_run(get, NULL, &named, &nnamed, err,
				  sizeof(err)) == CACHEW_OK, "%s", err);
		ck_assert_uint_eq(nnamed, 40);
		ck_assert_str_eq(cachew_element_name(named[39], 0), "pixels");
		ck_assert_str_eq(cachew_element_name(named[39], 1), "index");
		ck_assert_int_eq(cwt_i64(named[39], 1), 39);
		cwt_free(named, nnamed);
	}
	/* An aborted write leaves nothing. */
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &other, "p", &o),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_cache_writer_add(w, e, 40), CACHEW_OK);
	cwi_cache_writer_destroy(w);
	ck_assert_int_eq(cwi_cache_list(r, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(v[0].state, CWI_CACHE_COMPLETE);
	ck_assert_uint_gt(v[0].bytes, m->bytes);
	ck_assert_uint_eq(v[0].elements, 40);
	ck_assert(v[0].last_read_unix > 0);
	cwi_cache_entries_free(v, n);
	/* A flipped bit in a chunk object. */
	char *chunk = cwi_asprintf("s3://bkt/caches/%016llx%016llx/%s",
	    (unsigned long long)fp.hi, (unsigned long long)fp.lo,
	    m->chunks[1].name);
	cwi_buffer *b = NULL;
	size_t len = 0;
	ck_assert_int_eq(cwi_file_read_all(chunk, NULL, &b, &len), CACHEW_OK);
	b->data[len - 50] ^= 8;
	ck_assert_int_eq(cwi_io_put(chunk, b->data, len, NULL), CACHEW_OK);
	cwi_buffer_unref(b);
	ck_assert_int_eq(read_cache(r, &fp, &got, &ngot, err, sizeof(err)),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(err, chunk) != NULL, "%s", err);
	assert_prefix(got, ngot, e, 40);
	elems_free(got, ngot);
	cwi_cache_manifest_free(m);
	m = NULL;
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ENOENT);
	ck_assert_int_eq(cwi_cache_list(r, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(v[0].state, CWI_CACHE_BAD);
	/* Marked bad: unknown at build again. */
	cwt_spec_is(get, "?");
	free(get);
	cwi_cache_entries_free(v, n);
	ck_assert_int_eq(cwi_cache_remove(r, &fp), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_list(r, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 0);
	cwi_cache_entries_free(v, n);
	free(chunk);

	cwi_cache_root_close(r);
	for (int i = 0; i < 40; i++)
		cwi_element_release(e[i]);
	cwi_names_unref(names);
	cwt_stop_pid(pid);
	unsetenv("AWS_ENDPOINT_URL");
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	cmd = cwi_asprintf("%s", dir);
	cwt_rmtree(cmd);
	free(cmd);
	free(store);
	free(seed);
	free(portfile);
	free(dir);
}
END_TEST


/* ---- caches written in parts ----------------------------------------- */

/* Writes units [b, e) (element i = value i) as one part of write_id. */
static void
write_part_named(cwi_cache_root *r, const cachew_fingerprint *fp,
    uint64_t write_id, const cwi_unit_range *units, size_t nunits,
    bool commit, cwi_names *names)
{
	cwi_cache_writer_opts o = {.chunk_bytes = 4096, .frame_bytes = 256,
	    .part_write_id = write_id, .part_units = units,
	    .npart_units = nunits, .names = names};
	cwi_cache_writer *w = NULL;
	cachew_err rv = cwi_cache_writer_create(&w, r, fp, "range(100)", &o);

	ck_assert_msg(rv == CACHEW_OK, "create: %s", cachew_errmsg());
	for (size_t k = 0; k < nunits; k++)
		for (uint64_t u = units[k].begin; u < units[k].end; u++) {
			cwi_element *e = elem_i64((int64_t)u);
			ck_assert_int_eq(cwi_cache_writer_add(w, &e, 1),
			    CACHEW_OK);
			cwi_element_release(e);
		}
	if (commit)
		ck_assert_msg(cwi_cache_writer_commit(w) == CACHEW_OK, "%s",
		    cachew_errmsg());
	cwi_cache_writer_destroy(w);
}

static void
write_part(cwi_cache_root *r, const cachew_fingerprint *fp,
    uint64_t write_id, const cwi_unit_range *units, size_t nunits,
    bool commit)
{
	write_part_named(r, fp, write_id, units, nunits, commit, NULL);
}

/* The multiset of values read back, as a count per value 0..99. */
static void
read_counts(cwi_cache_root *r, const cachew_fingerprint *fp, int *count)
{
	cwi_element **got;
	size_t ngot;

	memset(count, 0, 100 * sizeof(*count));
	ck_assert_int_eq(read_cache(r, fp, &got, &ngot, NULL, 0), CACHEW_OK);
	for (size_t i = 0; i < ngot; i++) {
		int64_t v = *(const int64_t *)cachew_tensor_data(&got[i]->comp[0]);
		ck_assert(v >= 0 && v < 100);
		count[v]++;
	}
	elems_free(got, ngot);
}

START_TEST(test_parts_commit_holds_every_unit_once)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(40);
	cwi_unit_range a[] = {{0, 30}, {60, 70}}, b[] = {{30, 60}},
		       c[] = {{70, 100}};
	int count[100];
	uint64_t n = 0;
	cwi_cache_manifest *m;

	/* Written out of order, one lease with two ranges. */
	write_part(r, &fp, 7, c, 1, true);
	write_part(r, &fp, 7, a, 2, true);
	/* Not complete yet: nothing visible, and commit names the gap. */
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ENOENT);
	ck_assert_int_eq(cwi_cache_parts_commit(r, &fp, "range(100)", 7, 100,
			     &n),
	    CACHEW_ENOENT);
	ck_assert_msg(strstr(cachew_errmsg(), "no part covers unit 30 of 100"),
	    "%s", cachew_errmsg());
	write_part(r, &fp, 7, b, 1, true);
	ck_assert_msg(cwi_cache_parts_commit(r, &fp, "range(100)", 7, 100,
			  &n) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert_uint_eq(n, 100);
	m = lookup_ok(r, &fp);
	ck_assert_uint_eq(m->elements, 100);
	ck_assert_str_eq(m->pipeline, "range(100)");
	cwi_cache_manifest_free(m);
	read_counts(r, &fp, count);
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(count[i], 1);
	/* The part files are gone; a second commit finds the cache. */
	ck_assert_int_eq(cwi_cache_parts_commit(r, &fp, "range(100)", 7, 100,
			     NULL),
	    CACHEW_EEXIST);
	ck_assert_int_eq(cwi_cache_verify(r, &fp), CACHEW_OK);
	/* Parts that tile [0, 60) and one past a gap, for a source of 60
	 * units: refused (the stray part's elements went into the cache). */
	fp = fp_of(41);
	write_part(r, &fp, 8, a, 1, true);
	write_part(r, &fp, 8, b, 1, true);
	write_part(r, &fp, 8, c, 1, true);
	ck_assert_int_eq(cwi_cache_parts_commit(r, &fp, "range(60)", 8, 60,
			     &n),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "parts cover units up to 100, "
			  "the source has 60"), "%s", cachew_errmsg());
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_parts_commit_keeps_the_names_the_parts_agree_on)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(48), other = fp_of(49);
	cwi_unit_range a[] = {{0, 50}}, b[] = {{50, 100}};
	cwi_names *n = names_of(1, "value", NULL), *k = names_of(1, "key", NULL);
	cwi_cache_manifest *m;

	write_part_named(r, &fp, 5, a, 1, true, n);
	write_part_named(r, &fp, 5, b, 1, true, n);
	ck_assert_msg(cwi_cache_parts_commit(r, &fp, "range(100)", 5, 100,
			  NULL) == CACHEW_OK, "%s", cachew_errmsg());
	m = lookup_ok(r, &fp);
	ck_assert_ptr_nonnull(m->names);
	ck_assert_str_eq(m->names->name[0], "value");
	cwi_cache_manifest_free(m);
	/* Parts that name their components otherwise (or not at all) are
	 * not one cache. */
	write_part_named(r, &other, 6, a, 1, true, n);
	write_part_named(r, &other, 6, b, 1, true, k);
	ck_assert_int_eq(cwi_cache_parts_commit(r, &other, "range(100)", 6,
			     100, NULL), CACHEW_ETYPE);
	ck_assert_msg(strstr(cachew_errmsg(), "names its components "
					      "otherwise") != NULL,
	    "%s", cachew_errmsg());
	ck_assert_int_eq(cwi_cache_lookup(r, &other, &m), CACHEW_ENOENT);
	cwi_names_unref(n);
	cwi_names_unref(k);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_parts_replayed_and_crashed_leases_are_dropped)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(41);
	cwi_unit_range all4[] = {{0, 40}}, lo[] = {{0, 20}}, hi[] = {{20, 40}},
		       rest[] = {{40, 100}};
	int count[100];
	size_t files_before, files_after;
	char *cdir;
	char hex[33];

	/* A lease of 0-40 whose worker died before the ack, replayed as
	 * 0-20 and 20-40; a writer that crashed mid-way (never committed);
	 * and another write's part, which this commit must not touch. */
	write_part(r, &fp, 9, all4, 1, true);
	write_part(r, &fp, 9, lo, 1, true);
	write_part(r, &fp, 9, hi, 1, true);
	write_part(r, &fp, 9, rest, 1, false);
	write_part(r, &fp, 9, rest, 1, true);
	write_part(r, &fp, 10, lo, 1, true);
	cachew_fingerprint_hex(&fp, hex);
	cdir = cwi_asprintf("%s/%s", dir, hex);
	files_before = count_entries(cdir);
	ck_assert_msg(cwi_cache_parts_commit(r, &fp, "range(100)", 9, 100,
			  NULL) == CACHEW_OK,
	    "%s", cachew_errmsg());
	read_counts(r, &fp, count);
	for (int i = 0; i < 100; i++)
		ck_assert_msg(count[i] == 1, "value %d read %d times", i,
		    count[i]);
	/* Write 9's part files and unpicked chunks went; write 10's part
	 * stayed. */
	files_after = count_entries(cdir);
	ck_assert_uint_lt(files_after, files_before);
	ck_assert_int_eq(cwi_cache_parts_abort(r, &fp, 10), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_verify(r, &fp), CACHEW_OK);
	free(cdir);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_parts_commit_rejects_damaged_or_foreign_parts)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(42);
	cwi_unit_range all[] = {{0, 100}}, over[] = {{0, 120}};
	cwi_cache_manifest *m;
	char hex[33], *cdir, *part = NULL;
	DIR *d;
	struct dirent *de;

	write_part(r, &fp, 11, over, 1, true);
	ck_assert_int_eq(cwi_cache_parts_commit(r, &fp, "p", 11, 100, NULL),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "up to 120, the source has 100"),
	    "%s", cachew_errmsg());
	/* A part that claims a unit twice is damaged. */
	{
		cwi_unit_range twice[] = {{0, 10}, {5, 20}};
		write_part(r, &fp, 0x13, twice, 2, true);
		ck_assert_int_eq(cwi_cache_parts_commit(r, &fp, "p", 0x13, 20,
				     NULL),
		    CACHEW_ECORRUPT);
		ck_assert_msg(strstr(cachew_errmsg(), "overlap at unit 5"), "%s",
		    cachew_errmsg());
		ck_assert_int_eq(cwi_cache_parts_abort(r, &fp, 0x13), CACHEW_OK);
	}
	write_part(r, &fp, 0x12, all, 1, true);
	cachew_fingerprint_hex(&fp, hex);
	cdir = cwi_asprintf("%s/%s", dir, hex);
	d = opendir(cdir);
	while ((de = readdir(d)) != NULL)
		if (strncmp(de->d_name, "part-0000000000000012", 21) == 0 &&
		    strstr(de->d_name, ".cwp") != NULL)
			part = cwi_asprintf("%s/%s", cdir, de->d_name);
	closedir(d);
	ck_assert_ptr_nonnull(part);
	/* One flipped byte in the part file. */
	{
		size_t len;
		uint8_t *b = slurp(part, &len);
		FILE *f = fopen(part, "wb");
		b[len / 2] ^= 0x40;
		fwrite(b, 1, len, f);
		fclose(f);
		free(b);
	}
	ck_assert_int_eq(cwi_cache_parts_commit(r, &fp, "p", 0x12, 100, NULL),
	    CACHEW_ECORRUPT);
	ck_assert_msg(strstr(cachew_errmsg(), ".cwp"), "%s", cachew_errmsg());
	ck_assert_int_eq(cwi_cache_lookup(r, &fp, &m), CACHEW_ENOENT);
	/* Giving the write up removes its files. */
	ck_assert_int_eq(cwi_cache_parts_abort(r, &fp, 0x12), CACHEW_OK);
	ck_assert(!exists(part));
	free(part);
	free(cdir);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_part_writer_excludes_single_writer)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r = root_at(dir, 0);
	cachew_fingerprint fp = fp_of(43);
	cwi_unit_range u[] = {{0, 10}};
	cwi_cache_writer_opts o = {.part_write_id = 5, .part_units = u,
	    .npart_units = 1};
	cwi_cache_writer *pw = NULL, *w = NULL;

	ck_assert_int_eq(cwi_cache_writer_create(&pw, r, &fp, "p", &o),
	    CACHEW_OK);
	/* A single writer would clear the directory: it must wait. */
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", NULL),
	    CACHEW_EEXIST);
	/* Two parts write side by side. */
	{
		cwi_cache_writer *pw2 = NULL;
		ck_assert_int_eq(cwi_cache_writer_create(&pw2, r, &fp, "p", &o),
		    CACHEW_OK);
		cwi_cache_writer_destroy(pw2);
	}
	o.npart_units = 0;
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "p", &o),
	    CACHEW_EINVAL);
	cwi_cache_writer_destroy(pw);
	cwi_cache_root_close(r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Parts of writes that never commit stay in their cache's directory; a
 * part writer counts them against the root's capacity, or writes that
 * no one commits could fill the storage one part at a time. */
START_TEST(test_uncommitted_parts_count_against_capacity)
{
	char *dir = cwt_tmpdir();
	cwi_cache_root *r0 = root_at(dir, 0), *r;
	cachew_fingerprint fp = fp_of(44);
	cwi_unit_range u[] = {{0, 100}};
	cwi_cache_writer_opts o = {.chunk_bytes = 4096, .frame_bytes = 256,
	    .part_write_id = 2, .part_units = u, .npart_units = 1};
	cwi_cache_writer *w = NULL;
	uint64_t one = 0, now = 0;
	cachew_err rv = CACHEW_OK;

	write_part(r0, &fp, 1, u, 1, true); /* write 1: never committed */
	ck_assert_int_eq(cwi_cache_usage(r0, NULL, &one), CACHEW_OK);
	/* Room for that part and half of another. */
	r = root_at(dir, one + one / 2);
	ck_assert_int_eq(cwi_cache_writer_create(&w, r, &fp, "range(100)", &o),
	    CACHEW_OK);
	for (int64_t v = 0; v < 100 && rv == CACHEW_OK; v++) {
		cwi_element *e = elem_i64(v);
		rv = cwi_cache_writer_add(w, &e, 1);
		cwi_element_release(e);
	}
	if (rv == CACHEW_OK)
		rv = cwi_cache_writer_commit(w);
	ck_assert_int_eq(rv, CACHEW_ENOMEM);
	ck_assert_msg(strstr(cachew_errmsg(), "capacity") != NULL, "%s",
	    cachew_errmsg());
	cwi_cache_writer_destroy(w);
	ck_assert_int_eq(cwi_cache_usage(r0, NULL, &now), CACHEW_OK);
	ck_assert_uint_le(now, one + one / 2);
	cwi_cache_root_close(r);
	cwi_cache_root_close(r0);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("cache");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_codec_round_trips_every_dtype_and_shape);
	tcase_add_test(tc, test_codec_writes_the_documented_bytes);
	tcase_add_test(tc, test_codec_payloads_are_aligned_zero_copy_slices);
	tcase_add_test(tc, test_codec_rejects_every_truncation_and_bad_headers);
	tcase_add_test(tc, test_cache_round_trips_every_dtype_and_shape);
	tcase_add_test(tc, test_manifest_records_spec_with_varying_dims);
	tcase_add_test(tc, test_small_chunks_rotate_and_keep_order);
	tcase_add_test(tc, test_empty_cache_has_no_chunks);
	tcase_add_test(tc, test_chunk_decode_reads_a_chunk_in_memory);
	tcase_add_test(tc, test_abort_leaves_nothing_visible);
	tcase_add_test(tc, test_second_writer_gets_eexist);
	tcase_add_test(tc, test_lock_held_by_another_process_gives_eexist);
	tcase_add_test(tc, test_dead_writer_leftovers_are_partial_and_replaced);
	tcase_add_test(tc, test_elements_of_another_spec_fail_the_write);
	tcase_add_test(tc, test_flipped_bits_in_chunks_are_detected);
	tcase_add_test(tc, test_flipped_bits_in_v1_chunks_are_detected);
	tcase_add_test(tc, test_chunk_formats_1_and_2_both_read);
	tcase_add_test(tc, test_stored_records_are_slices_of_the_read_buffer);
	tcase_add_test(tc, test_damaged_stored_record_is_named);
	tcase_add_test(tc, test_truncated_and_extended_chunks_are_detected);
	tcase_add_test(tc, test_missing_and_swapped_chunks_are_detected);
	tcase_add_test(tc, test_flipped_bits_in_the_manifest_are_detected);
	tcase_add_test(tc, test_a_different_spec_or_count_is_detected);
	tcase_add_test(tc, test_manifest_round_trips_and_rejects_bad_fields);
	tcase_add_test(tc, test_manifest_names_round_trip_and_bad_names_are_refused);
	tcase_add_test(tc, test_manifest_of_an_older_writer_reads_unnamed);
	tcase_add_test(tc, test_writer_records_the_names_it_is_given);
	tcase_add_test(tc, test_peek_reads_a_manifest_without_side_effects);
	tcase_add_test(tc, test_a_read_only_cache_dir_without_a_lock_file_reads);
	tcase_add_test(tc, test_mark_bad_hides_the_cache_and_a_writer_replaces_it);
	tcase_add_test(tc, test_list_reports_every_state);
	tcase_add_test(tc, test_verify_passes_a_good_cache_and_marks_a_bad_one);
	tcase_add_test(tc, test_remove_deletes_but_not_while_read);
	tcase_add_test(tc, test_gc_evicts_least_recently_read_first);
	tcase_add_test(tc, test_gc_leaves_caches_being_read_or_written);
	tcase_add_test(tc, test_capacity_evicts_then_refuses);
	tcase_add_test(tc, test_probe_measures_positive_rates);
	tcase_add_test(tc, test_root_rejects_unsupported_urls);
	tcase_add_test(tc, test_s3_root_round_trip_corruption_and_management);
	tcase_add_test(tc, test_parts_commit_holds_every_unit_once);
	tcase_add_test(tc, test_parts_replayed_and_crashed_leases_are_dropped);
	tcase_add_test(tc, test_parts_commit_keeps_the_names_the_parts_agree_on);
	tcase_add_test(tc, test_parts_commit_rejects_damaged_or_foreign_parts);
	tcase_add_test(tc, test_part_writer_excludes_single_writer);
	tcase_add_test(tc, test_uncommitted_parts_count_against_capacity);
	suite_add_tcase(s, tc);
	return s;
}
