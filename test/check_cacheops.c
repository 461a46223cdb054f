/*
 * check_cacheops.c - the cache operators (cache_put, cache_get, cache), the
 * `cachew cache` command (real processes of <build>/cachew), crash safety
 * of a writer killed with SIGKILL, detection and recomputation of
 * corrupted caches, and gc running alongside readers. Every test works on
 * real files in a temporary directory.
 *
 * The crash and corruption loops run their full counts (20 kills; 200 bit
 * flips and 20 truncations) unless CACHEW_TEST_SMALL is set to something
 * other than 0, or the suite runs under valgrind (seen in LD_PRELOAD):
 * then they run a quarter of them, with the same seeds.
 */
#include "cwt.h"

#include "../src/cache/cache.h"
#include "../src/exec/exec_split.h"
#include "../src/exec/exec_tune.h"
#include "../src/tools/gen.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEED 7

/* ---- helpers ------------------------------------------------------------------ */

static bool
small_run(void)
{
	const char *s = getenv("CACHEW_TEST_SMALL");
	const char *pre = getenv("LD_PRELOAD");

	return (s != NULL && s[0] != '\0' && strcmp(s, "0") != 0) ||
	       (pre != NULL && strstr(pre, "vgpreload") != NULL);
}

static char *
fmt(const char *f, ...) CACHEW_PRINTF(1, 2);

static char *
fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, f);
	ck_assert_int_ge(vasprintf(&s, f, ap), 0);
	va_end(ap);
	return s;
}

typedef struct run_out {
	cachew_err rv;
	size_t n;
	cachew_element **v;
	char err[1024];
} run_out;

static run_out
run(const char *pipeline)
{
	cachew_options *o = cwt_opts(SEED, 2);
	run_out r;

	memset(&r, 0, sizeof(r));
	r.rv = cwt_run(pipeline, o, &r.v, &r.n, r.err, sizeof(r.err));
	cachew_options_destroy(o);
	return r;
}

static run_out
run_ok(const char *pipeline)
{
	run_out r = run(pipeline);

	ck_assert_msg(r.rv == CACHEW_OK, "'%s' failed: %s: %s", pipeline,
	    cachew_strerror(r.rv), r.err);
	return r;
}

static void
run_free(run_out *r)
{
	cwt_free(r->v, r->n);
	r->v = NULL;
	r->n = 0;
}

/* The same elements in the same order: dtype, shape and bytes. */
static void
assert_same(const run_out *want, const run_out *got, const char *what)
{
	ck_assert_msg(want->n == got->n, "%s: %zu elements, expected %zu",
	    what, got->n, want->n);
	for (size_t i = 0; i < want->n; i++)
		ck_assert_msg(cwi_element_equal(want->v[i], got->v[i]),
		    "%s: element %zu differs", what, i);
}

static cachew_fingerprint
fp_of(const char *pipeline)
{
	cachew_dataset *ds;
	cachew_fingerprint fp;

	ck_assert_msg(cachew_dataset_parse(&ds, pipeline) == CACHEW_OK,
	    "%s: %s", pipeline, cachew_errmsg());
	ck_assert_int_eq(cachew_dataset_fingerprint(ds, &fp), CACHEW_OK);
	cachew_dataset_release(ds);
	return fp;
}

static void
fp_hex(const char *pipeline, char hex[33])
{
	cachew_fingerprint fp = fp_of(pipeline);
	cachew_fingerprint_hex(&fp, hex);
}

/* The manifest of the cache of fp under root, or NULL with *rv. */
static cwi_cache_manifest *
manifest_of(const char *root, const cachew_fingerprint *fp, cachew_err *rv)
{
	cwi_cache_root *r;
	cwi_cache_manifest *m = NULL;

	ck_assert_int_eq(cwi_cache_root_open(&r, root, 0), CACHEW_OK);
	*rv = cwi_cache_lookup(r, fp, &m);
	cwi_cache_root_close(r);
	return *rv == CACHEW_OK ? m : NULL;
}

static cachew_err
lookup(const char *root, const cachew_fingerprint *fp)
{
	cachew_err rv;
	cwi_cache_manifest *m = manifest_of(root, fp, &rv);

	cwi_cache_manifest_free(m);
	return rv;
}

static cachew_err
verify(const char *root, const cachew_fingerprint *fp)
{
	cwi_cache_root *r;
	cachew_err rv;

	ck_assert_int_eq(cwi_cache_root_open(&r, root, 0), CACHEW_OK);
	rv = cwi_cache_verify(r, fp);
	cwi_cache_root_close(r);
	return rv;
}

static char *
read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = '\0';
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void
flip_bit(const char *path, uint64_t bit)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)(bit / 8)), 1);
	b ^= (uint8_t)(1u << (bit % 8));
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(bit / 8)), 1);
	close(fd);
}

static bool
is_chunk_name(const char *name)
{
	return name[0] != '.' && strcmp(name, "manifest") != 0 &&
	       strcmp(name, "BAD") != 0 && strcmp(name, "last_read") != 0;
}

/* ---- captured log messages ---------------------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int log_warns;
static char log_text[16384];

static void
log_sink(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	size_t len;

	(void)ctx;
	if (level > CACHEW_LOG_WARN)
		return;
	pthread_mutex_lock(&log_mu);
	log_warns++;
	len = strlen(log_text);
	snprintf(log_text + len, sizeof(log_text) - len, "%s: %s\n", module,
	    msg);
	pthread_mutex_unlock(&log_mu);
}

static void
log_capture(void)
{
	pthread_mutex_lock(&log_mu);
	log_warns = 0;
	log_text[0] = '\0';
	pthread_mutex_unlock(&log_mu);
	cachew_log_set(log_sink, NULL, CACHEW_LOG_WARN);
}

static void
log_release(void)
{
	cachew_log_set(NULL, NULL, CACHEW_LOG_ERROR);
}

/* ---- data sets ------------------------------------------------------------------ */

/* Small ImageNet-like shards in dir; returns the W2-style pipeline up to
 * the u8 crops (heap string). */
static char *
image_source(const char *dir)
{
	cwi_gen_imagenet_config cfg = {.out_dir = dir, .images = 24,
	    .shards = 2, .seed = 3, .width = 64, .height = 48, .quality = 85};
	char err[256];

	ck_assert_msg(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)) ==
			  CACHEW_OK, "%s", err);
	return fmt("tfrecord(files=\"%s/*.tfrecord\") | parse_example("
		   "image=\"image/encoded:bytes\", "
		   "label=\"image/class/label:i64\") | "
		   "random_resized_crop(size=32)", dir);
}

static char *
text_file(const char *dir, size_t lines)
{
	char *path = fmt("%s/lines.txt", dir);
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	for (size_t i = 0; i < lines; i++)
		fprintf(f, "line %zu %.*s\n", i, (int)(i % 37), 
		    "the quick brown fox jumps over the lazy dog");
	ck_assert_int_eq(fclose(f), 0);
	return path;
}

/* Writes the cache of `input` with cache_put and checks the pass-through
 * yielded the input; returns the uncached run. */
static run_out
put(const char *input, const char *root, const char *put_args)
{
	char *p = fmt("%s | cache_put(\"%s\"%s)", input, root, put_args);
	run_out want = run_ok(input), got = run_ok(p);
	cachew_fingerprint fp = fp_of(input);

	assert_same(&want, &got, "cache_put pass-through");
	run_free(&got);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_OK);
	free(p);
	return want;
}

/* cache_get of the cache of `input` yields exactly `want`. */
static void
assert_get(const char *input, const char *root, const run_out *want,
    const char *get_args)
{
	char hex[33], *p;
	run_out got;

	fp_hex(input, hex);
	p = fmt("cache_get(\"%s\", \"%s\"%s)", root, hex, get_args);
	got = run_ok(p);
	assert_same(want, &got, p);
	run_free(&got);
	free(p);
}

/* ---- cache_put + cache_get round trips ------------------------------------------ */

START_TEST(put_then_get_range_map_batch_is_exact)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(1000) | map(add, value=3) | batch(7)";
	run_out want = put(in, root, ", chunk_bytes=4096");

	ck_assert_uint_eq(want.n, 143);
	assert_get(in, root, &want, "");
	assert_get(in, root, &want, ", threads=1");
	assert_get(in, root, &want, ", threads=3");
	run_free(&want);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_then_get_text_lines_is_exact)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *file = text_file(dir, 3000);
	char *in = fmt("text_lines(\"%s\")", file);
	run_out want = put(in, root, ", chunk_bytes=8192");

	ck_assert_uint_eq(want.n, 3000);
	assert_get(in, root, &want, "");
	run_free(&want);
	cwt_rmtree(dir);
	free(in);
	free(file);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_then_get_u8_image_crops_is_exact)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *data = fmt("%s/data", dir), *in = image_source(data);
	run_out want = put(in, root, ", chunk_bytes=16384");
	const cachew_tensor *t;

	ck_assert_uint_eq(want.n, 24);
	t = cachew_element_component(want.v[0], 0);
	ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_U8);
	ck_assert_int_eq(cachew_tensor_rank(t), 3);
	assert_get(in, root, &want, "");
	run_free(&want);
	cwt_rmtree(dir);
	free(in);
	free(data);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_of_many_chunks_keeps_order_across_chunks)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(6000) | map(uniform) | batch(4)";
	cachew_fingerprint fp = fp_of(in);
	run_out want = put(in, root, ", chunk_bytes=4096, threads=3");
	cwi_cache_manifest *m;
	cachew_err rv;

	m = manifest_of(root, &fp, &rv);
	ck_assert_ptr_nonnull(m);
	ck_assert_uint_ge(m->nchunks, 4);
	ck_assert_uint_eq(m->elements, 1500);
	cwi_cache_manifest_free(m);
	assert_get(in, root, &want, ", threads=4");
	assert_get(in, root, &want, ", threads=1");
	run_free(&want);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_of_empty_input_makes_an_empty_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	run_out want = put("range(0)", root, "");

	ck_assert_uint_eq(want.n, 0);
	assert_get("range(0)", root, &want, "");
	run_free(&want);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cache_ops_keep_the_inputs_fingerprint)
{
	cachew_fingerprint a = fp_of("range(10) | map(add)");
	cachew_fingerprint b = fp_of("range(10) | map(add) | cache_put(\"/x\", "
				     "chunk_bytes=4096, threads=3)");
	cachew_fingerprint c = fp_of("range(10) | map(add) | cache(\"/y\")");
	cachew_fingerprint d = fp_of(
	    "cache_get(\"/x\", \"0123456789abcdef0123456789abcdef\")");
	cachew_fingerprint e = fp_of(
	    "cache_get(\"/z\", \"0123456789abcdef0123456789abcdef\", "
	    "threads=2)");

	ck_assert(a.hi == b.hi && a.lo == b.lo);
	ck_assert(a.hi == c.hi && a.lo == c.lo);
	/* cache_get's root and threads are not part of its identity. */
	ck_assert(d.hi == e.hi && d.lo == e.lo);
}
END_TEST

START_TEST(put_over_a_complete_cache_passes_through)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(500) | batch(10)";
	char hex[33], *man, *p;
	run_out want = put(in, root, ""), again;
	struct stat st1, st2;

	fp_hex(in, hex);
	man = fmt("%s/%s/manifest", root, hex);
	ck_assert_int_eq(stat(man, &st1), 0);
	p = fmt("%s | cache_put(\"%s\")", in, root);
	again = run_ok(p);
	assert_same(&want, &again, "second cache_put");
	ck_assert_int_eq(stat(man, &st2), 0);
	ck_assert_int_eq(st1.st_ino, st2.st_ino); /* not rewritten */
	run_free(&again);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(man);
	free(root);
	free(dir);
}
END_TEST

/* ---- passes that do not complete ------------------------------------------------ */

START_TEST(put_cut_short_by_take_leaves_no_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *p = fmt("range(1000) | cache_put(\"%s\", chunk_bytes=4096) | "
		      "take(10)", root);
	run_out r = run_ok(p);
	cachew_fingerprint fp = fp_of("range(1000)");
	cwi_cache_root *cr;
	cwi_cache_entry *v;
	size_t n;

	ck_assert_uint_eq(r.n, 10);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	ck_assert_int_eq(cwi_cache_root_open(&cr, root, 0), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_list(cr, &v, &n), CACHEW_OK);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_ne(v[i].state, CWI_CACHE_COMPLETE);
	cwi_cache_entries_free(v, n);
	cwi_cache_root_close(cr);
	run_free(&r);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_iterator_destroyed_midway_leaves_no_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *p = fmt("range(5000) | batch(2) | cache_put(\"%s\", "
		      "chunk_bytes=4096)", root);
	cachew_fingerprint fp = fp_of("range(5000) | batch(2)");
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;

	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int i = 0; i < 2400; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
	}
	cachew_iterator_destroy(it);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	/* The next complete pass writes it. */
	run_out r = run_ok(p);
	ck_assert_uint_eq(r.n, 2500);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_OK);
	run_free(&r);
	cachew_dataset_release(ds);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_upstream_error_fails_and_leaves_no_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *file = text_file(dir, 50), *rec = fmt("%s/r.tfrecord", dir);
	char *w = fmt("text_lines(\"%s\") | tfrecord_write(\"%s\")", file, rec);
	char *in = fmt("tfrecord(\"%s\")", rec), *p;
	struct stat st;
	run_out r = run_ok(w);

	run_free(&r);
	ck_assert_int_eq(stat(rec, &st), 0);
	ck_assert_int_eq(truncate(rec, st.st_size - 3), 0);
	p = fmt("%s | cache_put(\"%s\")", in, root);
	r = run(p);
	ck_assert_int_eq(r.rv, CACHEW_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(r.err, "truncated"));
	cachew_fingerprint fp = fp_of(in);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	cwt_rmtree(dir);
	free(p);
	free(in);
	free(w);
	free(rec);
	free(file);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_to_an_unusable_root_warns_and_passes_through)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/file", dir);
	char *p = fmt("range(100) | cache_put(\"%s\")", root);
	run_out r;

	cwt_write_file(root, "x", 1); /* a file, not a directory */
	log_capture();
	r = run_ok(p);
	log_release();
	ck_assert_uint_eq(r.n, 100);
	ck_assert_int_ge(log_warns, 1);
	ck_assert_msg(strstr(log_text, "not caching") != NULL, "%s", log_text);
	ck_assert_msg(strstr(log_text, root) != NULL, "%s", log_text);
	run_free(&r);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_over_capacity_warns_and_passes_through)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(20000) | map(uniform) | batch(8)";
	char *p = fmt("%s | cache_put(\"%s\", chunk_bytes=4096, "
		      "capacity=8192)", in, root);
	cachew_fingerprint fp = fp_of(in);
	run_out want = run_ok(in), got;

	log_capture();
	got = run_ok(p);
	log_release();
	assert_same(&want, &got, "cache_put over capacity");
	ck_assert_msg(strstr(log_text, "not caching") != NULL, "%s", log_text);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	run_free(&got);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

/* ---- cache_get errors and splits -------------------------------------------------- */

START_TEST(get_of_a_missing_cache_is_enoent)
{
	char *dir = cwt_tmpdir();
	char *p = fmt("cache_get(\"%s\", \"0123456789abcdef0123456789abcdef\")",
	    dir);
	run_out r = run(p);

	ck_assert_int_eq(r.rv, CACHEW_ENOENT);
	ck_assert_msg(strstr(r.err, "no complete cache "
				    "0123456789abcdef0123456789abcdef") != NULL,
	    "%s", r.err);
	cwt_rmtree(dir);
	free(p);
	free(dir);
}
END_TEST

START_TEST(get_with_a_malformed_fingerprint_is_einval)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, "cache_get(\"/tmp\", "
						   "\"12345\")"),
	    CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "not 32 hex digits") != NULL,
	    "%s", cachew_errmsg());
	ck_assert_ptr_null(ds);
}
END_TEST

/* The path of chunk `index` of the cache of fp and, in *bytes, its size. */
static char *
chunk_path(const char *root, const cachew_fingerprint *fp, size_t index,
    uint64_t *bytes)
{
	cachew_err rv;
	cwi_cache_manifest *m = manifest_of(root, fp, &rv);
	char hex[33], *path;

	ck_assert_ptr_nonnull(m);
	ck_assert_uint_gt(m->nchunks, index);
	cachew_fingerprint_hex(fp, hex);
	path = fmt("%s/%s/%s", root, hex, m->chunks[index].name);
	*bytes = m->chunks[index].bytes;
	cwi_cache_manifest_free(m);
	return path;
}

/* Flips a bit in the middle of chunk `index` of the cache of fp. */
static char *
corrupt_chunk(const char *root, const cachew_fingerprint *fp, size_t index)
{
	uint64_t bytes;
	char *path = chunk_path(root, fp, index, &bytes);

	flip_bit(path, bytes * 8 / 2);
	return path;
}

START_TEST(get_of_a_corrupt_chunk_fails_naming_it_and_marks_bad)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(4000) | map(uniform) | batch(4)";
	cachew_fingerprint fp = fp_of(in);
	run_out want = put(in, root, ", chunk_bytes=4096");
	char hex[33], *chunk, *p;
	const char *base;
	run_out got;

	chunk = corrupt_chunk(root, &fp, 2);
	base = strrchr(chunk, '/') + 1;
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	log_capture();
	got = run(p);
	log_release();
	ck_assert_int_eq(got.rv, CACHEW_ECORRUPT);
	ck_assert_msg(strstr(got.err, base) != NULL, "%s", got.err);
	ck_assert_msg(strstr(got.err, "marked bad") != NULL, "%s", got.err);
	/* A later lookup no longer finds it. */
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(chunk);
	free(root);
	free(dir);
}
END_TEST

/* Replaces chunk `index` of the cache of fp by a FIFO of the same name
 * (which nobody writes); returns its path. */
static char *
fifo_for_chunk(const char *root, const cachew_fingerprint *fp, size_t index)
{
	uint64_t bytes;
	char *path = chunk_path(root, fp, index, &bytes);

	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	return path;
}

/* A FIFO named like a chunk would block a reader's open for ever: it is
 * refused at once as damage (cache_get fails naming it, cache recomputes).
 * The tcase's timeout bounds the test if it ever blocks. */
START_TEST(get_of_a_fifo_chunk_fails_at_once_and_cache_recomputes)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(4000) | map(add) | batch(4)";
	char *p = fmt("%s | cache(\"%s\", chunk_bytes=4096)", in, root);
	cachew_fingerprint fp = fp_of(in);
	run_out want = put(in, root, ", chunk_bytes=4096"), got;
	char hex[33], *fifo, *get;

	fifo = fifo_for_chunk(root, &fp, 1);
	cachew_fingerprint_hex(&fp, hex);
	get = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	log_capture();
	got = run(get);
	log_release();
	ck_assert_int_eq(got.rv, CACHEW_ECORRUPT);
	ck_assert_msg(strstr(got.err, "not a regular file (a FIFO)") != NULL,
	    "%s", got.err);
	ck_assert_msg(strstr(got.err, strrchr(fifo, '/') + 1) != NULL, "%s",
	    got.err);
	run_free(&got);
	/* Marked bad: the cache operator computes the data again. */
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	got = run_ok(p);
	assert_same(&want, &got, "pass over a FIFO chunk");
	run_free(&got);
	run_free(&want);
	cwt_rmtree(dir);
	free(get);
	free(fifo);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(get_yields_only_verified_elements_before_corruption)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(4000) | map(uniform) | batch(4)";
	cachew_fingerprint fp = fp_of(in);
	run_out want = put(in, root, ", chunk_bytes=4096");
	char hex[33], *chunk, *p;
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;
	size_t n = 0;

	chunk = corrupt_chunk(root, &fp, 1);
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		ck_assert_uint_lt(n, want.n);
		ck_assert_msg(cwi_element_equal(e, want.v[n]),
		    "element %zu differs", n);
		cachew_element_release(e);
		n++;
	}
	ck_assert_int_eq(rv, CACHEW_ECORRUPT);
	ck_assert_uint_lt(n, want.n);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(chunk);
	free(root);
	free(dir);
}
END_TEST

/* Random i64 values barely compress: records stored (format 2), about
 * 1 MiB each, all in one chunk of the default 64 MiB. */
static const char one_chunk_input[] =
    "random(seed=5) | take(1100000) | batch(1000)";

/* The records of a chunk file: each one's payload offset, payload size,
 * element count and kind (docs/cache-format.md, section 3.2). */
typedef struct rec_info {
	uint64_t payload_at;
	uint32_t clen, nelem, kind;
} rec_info;

static size_t
chunk_records(const char *path, rec_info *out, size_t max)
{
	size_t len, n = 0;
	char *b = read_all(path, &len);
	uint64_t pos = 32;

	for (;;) {
		uint32_t w[4];
		ck_assert_uint_le(pos + 32, len);
		memcpy(w, b + pos, sizeof(w)); /* little-endian host */
		if (w[0] == 0)
			break;
		ck_assert_uint_lt(n, max);
		out[n++] = (rec_info){.payload_at = pos + 32, .clen = w[0],
		    .nelem = w[2], .kind = w[3]};
		pos += 32 + (uint64_t)w[0];
	}
	free(b);
	return n;
}

/* The reader threads share one chunk's records (a claim walks the record
 * headers, the loads run at once): the elements still come in the written
 * order, whatever the number of threads. */
START_TEST(get_threads_share_one_chunk_in_written_order)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *path;
	cachew_fingerprint fp = fp_of(one_chunk_input);
	run_out want = put(one_chunk_input, root, "");
	rec_info recs[64];
	uint64_t bytes;
	size_t n;

	ck_assert_uint_eq(want.n, 1100);
	path = chunk_path(root, &fp, 0, &bytes);
	n = chunk_records(path, recs, 64);
	ck_assert_uint_ge(n, 8);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(recs[i].kind, 2); /* stored */
	assert_get(one_chunk_input, root, &want, ", threads=2");
	assert_get(one_chunk_input, root, &want, ", threads=4");
	assert_get(one_chunk_input, root, &want, ", threads=1");
	run_free(&want);
	cwt_rmtree(dir);
	free(path);
	free(root);
	free(dir);
}
END_TEST

/* A damaged record in the middle of a chunk that four threads read: every
 * element of the records before it, in order, then CACHEW_ECORRUPT naming
 * the file and the record, whichever load finished first. */
START_TEST(get_of_a_damaged_record_mid_chunk_yields_the_records_before_it)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *path, *p;
	cachew_fingerprint fp = fp_of(one_chunk_input);
	run_out want = put(one_chunk_input, root, "");
	rec_info recs[64];
	uint64_t bytes;
	size_t n, before = 0, got = 0;
	char hex[33];
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;

	path = chunk_path(root, &fp, 0, &bytes);
	n = chunk_records(path, recs, 64);
	ck_assert_uint_ge(n, 8);
	for (size_t i = 0; i < 4; i++)
		before += recs[i].nelem;
	flip_bit(path, (recs[4].payload_at + recs[4].clen / 2) * 8 + 3);
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\", threads=4)", root, hex);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	log_capture();
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		ck_assert_uint_lt(got, before);
		ck_assert_msg(cwi_element_equal(e, want.v[got]),
		    "element %zu differs", got);
		cachew_element_release(e);
		got++;
	}
	log_release();
	ck_assert_int_eq(rv, CACHEW_ECORRUPT);
	ck_assert_uint_eq(got, before);
	ck_assert_msg(strstr(cachew_iterator_errmsg(it),
			  strrchr(path, '/') + 1) != NULL &&
		strstr(cachew_iterator_errmsg(it), "record 4 (stored") != NULL,
	    "%s", cachew_iterator_errmsg(it));
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(path);
	free(root);
	free(dir);
}
END_TEST

/* Drops a file's pages from the page cache; true when its last byte then
 * is out of it (a file system that keeps every page, tmpfs, says false). */
static bool
drop_pages(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	struct iovec v;
	char c;
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(fdatasync(fd), 0);
	ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	v = (struct iovec){.iov_base = &c, .iov_len = 1};
	n = preadv2(fd, &v, 1, st.st_size - 1, RWF_NOWAIT);
	close(fd);
	return n < 0 && errno == EAGAIN;
}

/* A chunk out of the page cache read by several threads: the claims read
 * the payloads that are not in it, in file order (one stream for the
 * disk), and the loads verify and decode them; the elements are those
 * written, in order. Once the file is in the page cache, the loads read
 * every payload themselves again. */
START_TEST(get_of_a_cold_chunk_with_threads_reads_it_in_file_order)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *path;
	cachew_fingerprint fp = fp_of(one_chunk_input);
	run_out want = put(one_chunk_input, root, "");
	uint64_t bytes, c0;
	bool cold;

	path = chunk_path(root, &fp, 0, &bytes);
	cold = drop_pages(path);
	c0 = cwi_cache_claimed_payloads();
	assert_get(one_chunk_input, root, &want, ", threads=2");
	if (cold)
		ck_assert_uint_gt(cwi_cache_claimed_payloads(), c0);
	else
		fprintf(stderr, "%s: its pages stay in memory: the claims' "
		    "reads are not tested\n", path);
	cold = drop_pages(path);
	assert_get(one_chunk_input, root, &want, ", threads=4");
	/* Warm now: the loads read (and copy) every payload. */
	c0 = cwi_cache_claimed_payloads();
	assert_get(one_chunk_input, root, &want, ", threads=2");
	ck_assert_uint_eq(cwi_cache_claimed_payloads(), c0);
	/* One thread claims and loads alike: it reads its payloads itself. */
	(void)drop_pages(path);
	assert_get(one_chunk_input, root, &want, ", threads=1");
	ck_assert_uint_eq(cwi_cache_claimed_payloads(), c0);
	run_free(&want);
	cwt_rmtree(dir);
	free(path);
	free(root);
	free(dir);
}
END_TEST

/* The first record of a cold chunk, damaged, read by the claim (its
 * pages are surely not in the page cache): the load that hashes it finds
 * the damage; no element comes, CACHEW_ECORRUPT names the record and the
 * cache is marked bad. */
START_TEST(get_of_a_cold_damaged_first_record_yields_nothing)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *path, *p;
	cachew_fingerprint fp = fp_of(one_chunk_input);
	run_out want = put(one_chunk_input, root, "");
	rec_info recs[64];
	uint64_t bytes, c0;
	char hex[33];
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;
	bool cold;

	path = chunk_path(root, &fp, 0, &bytes);
	ck_assert_uint_ge(chunk_records(path, recs, 64), 8);
	flip_bit(path, (recs[0].payload_at + recs[0].clen / 3) * 8 + 5);
	cold = drop_pages(path);
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\", threads=2)", root, hex);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	log_capture();
	c0 = cwi_cache_claimed_payloads();
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	rv = cachew_iterator_next(it, &e);
	log_release();
	ck_assert_int_eq(rv, CACHEW_ECORRUPT);
	if (cold)
		ck_assert_uint_gt(cwi_cache_claimed_payloads(), c0);
	ck_assert_msg(strstr(cachew_iterator_errmsg(it), "record 0 (stored") !=
		NULL, "%s", cachew_iterator_errmsg(it));
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(path);
	free(root);
	free(dir);
}
END_TEST

START_TEST(get_split_units_are_the_chunks)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(3000) | map(uniform) | batch(3)";
	cachew_fingerprint fp = fp_of(in);
	run_out want = put(in, root, ", chunk_bytes=4096");
	const cwi_dataset_op *op = cwi_dataset_op_lookup("cache_get");
	cwi_cache_manifest *m;
	cachew_dataset *ds;
	uint64_t units = 0;
	char hex[33], *p;
	cachew_err rv;

	ck_assert_ptr_nonnull(op);
	ck_assert(op->flags & CWI_OPF_SPLITTABLE);
	m = manifest_of(root, &fp, &rv);
	ck_assert_ptr_nonnull(m);
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	ck_assert_int_eq(op->split_units(ds, &units), CACHEW_OK);
	ck_assert_uint_eq(units, m->nchunks);
	ck_assert_uint_ge(units, 3);
	cachew_dataset_release(ds);
	cwi_cache_manifest_free(m);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

/* Runs node `ds` as the split source of a pipeline reading `ranges`. */
static run_out
run_split(cachew_dataset *ds, const cwi_unit_range *ranges, size_t nranges)
{
	cwi_pipeline pl;
	cwi_iter_args args = {0};
	cwi_iter *it = NULL;
	cwi_chunk c = {0};
	run_out r;
	size_t cap = 0;

	memset(&pl, 0, sizeof(pl));
	memset(&r, 0, sizeof(r));
	cwi_opts_defaults(&pl.opts);
	pl.opts.threads = 2;
	pl.opts.ram_budget = 1 << 30;
	pl.seed = SEED;
	pl.job_seed = SEED;
	atomic_init(&pl.cancelled, false);
	pthread_mutex_init(&pl.lock, NULL);
	pl.split_node = ds;
	pl.split_ranges = ranges;
	pl.nsplit_ranges = nranges;
	args.pl = &pl;
	args.epoch = 0;
	r.rv = cwi_iter_create(&it, ds, &args);
	while (r.rv == CACHEW_OK) {
		r.rv = cwi_iter_next(it, &c, 64);
		for (size_t i = 0; i < c.n; i++) {
			if (r.n == cap) {
				cap = cap ? cap * 2 : 64;
				r.v = realloc(r.v, cap * sizeof(*r.v));
				ck_assert_ptr_nonnull(r.v);
			}
			r.v[r.n++] = c.v[i];
		}
		c.n = 0;
	}
	snprintf(r.err, sizeof(r.err), "%s", pl.errmsg);
	if (r.rv == CACHEW_EOF)
		r.rv = CACHEW_OK;
	atomic_store(&pl.cancelled, true);
	cwi_tune_cancel(&pl);
	cwi_iter_destroy(it);
	cwi_chunk_free(&c);
	pthread_mutex_destroy(&pl.lock);
	return r;
}

START_TEST(get_reads_only_its_split_ranges_in_order)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(3000) | map(uniform) | batch(3)";
	cachew_fingerprint fp = fp_of(in);
	run_out all = put(in, root, ", chunk_bytes=4096"), want, got;
	cwi_unit_range ranges[2] = {{2, 4}, {0, 1}};
	size_t start[64], k = 0;
	cwi_cache_manifest *m;
	cachew_dataset *ds;
	char hex[33], *p;
	cachew_err rv;

	m = manifest_of(root, &fp, &rv);
	ck_assert_ptr_nonnull(m);
	ck_assert_uint_ge(m->nchunks, 4);
	ck_assert_uint_lt(m->nchunks, 64);
	start[0] = 0;
	for (size_t i = 0; i < m->nchunks; i++)
		start[i + 1] = start[i] + m->chunks[i].elements;
	memset(&want, 0, sizeof(want));
	want.v = calloc(all.n, sizeof(*want.v));
	for (size_t r = 0; r < 2; r++)
		for (uint64_t u = ranges[r].begin; u < ranges[r].end; u++)
			for (size_t i = start[u]; i < start[u + 1]; i++)
				want.v[k++] = all.v[i];
	want.n = k;
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\", threads=2)", root, hex);
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	got = run_split(ds, ranges, 2);
	ck_assert_msg(got.rv == CACHEW_OK, "%s", got.err);
	assert_same(&want, &got, "split ranges");
	run_free(&got);
	/* A range past the last chunk is an error naming it. */
	cwi_unit_range bad = {1, m->nchunks + 1};
	got = run_split(ds, &bad, 1);
	ck_assert_int_eq(got.rv, CACHEW_EINVAL);
	ck_assert_msg(strstr(got.err, "outside the cache") != NULL, "%s",
	    got.err);
	run_free(&got);
	cachew_dataset_release(ds);
	cwi_cache_manifest_free(m);
	free(want.v);
	run_free(&all);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(get_destroyed_midway_stops_its_readers)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(8000) | map(uniform) | batch(2)";
	run_out want = put(in, root, ", chunk_bytes=4096");
	const char *tails[] = {"", " | prefetch(3)", " | map(identity, parallel=2)"};
	char hex[33];

	fp_hex(in, hex);
	for (size_t k = 0; k < 3; k++) {
		char *p = fmt("cache_get(\"%s\", \"%s\", threads=3)%s", root,
		    hex, tails[k]);
		cachew_dataset *ds;
		cachew_iterator *it;
		cachew_element *e;

		ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
		ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL),
		    CACHEW_OK);
		for (size_t i = 0; i < 1000; i++) {
			ck_assert_int_eq(cachew_iterator_next(it, &e),
			    CACHEW_OK);
			ck_assert(cwi_element_equal(e, want.v[i]));
			cachew_element_release(e);
		}
		/* Reader threads waiting for the consumer must stop. */
		cachew_iterator_destroy(it);
		cachew_dataset_release(ds);
		free(p);
	}
	run_free(&want);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

/* ---- cache(): tf.data semantics ---------------------------------------------------- */

/* The counters of the nodes named `op` in a run, summed: elements, bytes
 * and cache_hit_bytes. */
static cachew_op_stats
op_row(cachew_iterator *it, const char *op)
{
	cachew_op_stats s[16], sum = {.name = op};
	size_t n = 0;

	ck_assert_int_eq(cachew_iterator_stats(it, s, 16, &n), CACHEW_OK);
	for (size_t i = 0; i < n && i < 16; i++) {
		if (strcmp(s[i].name, op) != 0)
			continue;
		sum.elements += s[i].elements;
		sum.bytes += s[i].bytes;
		sum.cache_hit_bytes += s[i].cache_hit_bytes;
	}
	return sum;
}

/* Runs p to its end, checking it yields want; returns the counters of the
 * node `op`. */
static cachew_op_stats
run_row(const char *p, const char *op, const run_out *want)
{
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_options *o = cwt_opts(SEED, 2);
	cachew_err rv;
	cachew_op_stats produced;
	size_t n = 0;

	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		ck_assert_uint_lt(n, want->n);
		ck_assert_msg(cwi_element_equal(e, want->v[n]),
		    "element %zu differs", n);
		cachew_element_release(e);
		n++;
	}
	ck_assert_int_eq(rv, CACHEW_EOF);
	ck_assert_uint_eq(n, want->n);
	produced = op_row(it, op);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return produced;
}

START_TEST(cache_first_pass_computes_and_second_reads)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(2000) | map(add, value=5) | batch(5)";
	char *p = fmt("%s | cache(\"%s\", chunk_bytes=4096)", in, root);
	cachew_fingerprint fp = fp_of(in);
	run_out want = run_ok(in);

	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	ck_assert_uint_eq(run_row(p, "range", &want).elements, 2000);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_OK);
	/* The second pass reads: the input is not even started. */
	ck_assert_uint_eq(run_row(p, "range", &want).elements, 0);
	ck_assert_uint_eq(run_row(p, "cache", &want).elements, 400);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

/* issue 17: the bytes an operator read from a cache are counted apart
 * (cachew_op_stats.cache_hit_bytes; the dispatcher's
 * cachew_job_cache_hit_bytes_total sums them): none on the pass that
 * computes and writes, all of them on the pass that reads, for cache()
 * on disk and cache_get alike, and for the in-memory cache() the
 * repetitions after its first. */
START_TEST(cache_hit_bytes_count_what_is_read_from_a_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(300) | map(add, value=1) | batch(4)";
	char *p = fmt("%s | cache(\"%s\", chunk_bytes=4096)", in, root);
	char hex[33], *get;
	run_out want = run_ok(in), twice;
	cachew_op_stats first, second, r;

	first = run_row(p, "cache", &want);
	ck_assert_uint_eq(first.elements, 75);
	ck_assert_uint_gt(first.bytes, 0);
	ck_assert_uint_eq(first.cache_hit_bytes, 0);
	second = run_row(p, "cache", &want);
	ck_assert_uint_eq(second.bytes, first.bytes);
	ck_assert_uint_eq(second.cache_hit_bytes, first.bytes);
	fp_hex(in, hex);
	get = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	r = run_row(get, "cache_get", &want);
	ck_assert_uint_eq(r.cache_hit_bytes, first.bytes);
	/* In memory, under repeat: the first repetition fills, the second
	 * replays. */
	free(p);
	p = fmt("%s | cache() | repeat(2)", in);
	twice = run_ok(p);
	r = run_row(p, "cache", &twice);
	ck_assert_uint_eq(r.bytes, 2 * first.bytes);
	ck_assert_uint_eq(r.cache_hit_bytes, first.bytes);
	/* What computes is no hit. */
	r = run_row(p, "batch", &twice);
	ck_assert_uint_eq(r.bytes, first.bytes);
	ck_assert_uint_eq(r.cache_hit_bytes, 0);
	run_free(&twice);
	run_free(&want);
	cwt_rmtree(dir);
	free(get);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cache_second_pass_yields_the_cached_data)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *file = fmt("%s/f.txt", dir);
	char *in = fmt("text_lines(\"%s\")", file);
	char *p = fmt("%s | cache(\"%s\")", in, root);
	struct timespec times[2];
	struct stat st;
	run_out first, second;

	cwt_write_file(file, "alpha\nbeta\n", 11);
	first = run_ok(p);
	ck_assert_uint_eq(first.n, 2);
	/* Same size and mtime: the same fingerprint, other contents. */
	ck_assert_int_eq(stat(file, &st), 0);
	cwt_write_file(file, "gamma\ndelta", 11);
	times[0] = st.st_atim;
	times[1] = st.st_mtim;
	ck_assert_int_eq(utimensat(AT_FDCWD, file, times, 0), 0);
	second = run_ok(p);
	assert_same(&first, &second, "cached text");
	run_free(&second);
	second = run_ok(in);
	ck_assert_uint_eq(second.n, 2); /* the file now says gamma, delta */
	ck_assert(!cwi_element_equal(first.v[0], second.v[0]));
	run_free(&second);
	run_free(&first);
	cwt_rmtree(dir);
	free(p);
	free(in);
	free(file);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cache_cut_short_leaves_no_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *p = fmt("range(3000) | cache(\"%s\", chunk_bytes=4096) | take(5)",
	    root);
	cachew_fingerprint fp = fp_of("range(3000)");
	run_out r = run_ok(p);

	ck_assert_uint_eq(r.n, 5);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	run_free(&r);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cache_under_repeat_fills_then_reads)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *p = fmt("range(50) | cache(\"%s\") | repeat(3)", root);
	cachew_fingerprint fp = fp_of("range(50)");
	char *s = cwt_seq(p, NULL), *want = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&want, &len);

	for (int r = 0; r < 3; r++)
		for (int i = 0; i < 50; i++)
			fprintf(f, "%s%d", r == 0 && i == 0 ? "" : ",", i);
	fclose(f);
	ck_assert_str_eq(s, want);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_OK);
	free(want);
	free(s);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cache_recomputes_after_a_corrupt_chunk)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(4000) | map(uniform) | batch(4)";
	char *p = fmt("%s | cache(\"%s\", chunk_bytes=4096)", in, root);
	cachew_fingerprint fp = fp_of(in);
	run_out want = run_ok(in), got = run_ok(p);
	char *chunk;

	assert_same(&want, &got, "first pass");
	run_free(&got);
	chunk = corrupt_chunk(root, &fp, 3);
	log_capture();
	got = run_ok(p);
	log_release();
	assert_same(&want, &got, "pass over a corrupt chunk");
	ck_assert_msg(strstr(log_text, "recomputing") != NULL, "%s", log_text);
	ck_assert_msg(strstr(log_text, strrchr(chunk, '/') + 1) != NULL, "%s",
	    log_text);
	/* The recomputing pass wrote a new, sound cache. */
	ck_assert_int_eq(verify(root, &fp), CACHEW_OK);
	run_free(&got);
	got = run_ok(p);
	assert_same(&want, &got, "pass over the rewritten cache");
	run_free(&got);
	run_free(&want);
	cwt_rmtree(dir);
	free(chunk);
	free(p);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cache_recomputes_after_a_damaged_manifest)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(1000) | batch(4)";
	char *p = fmt("%s | cache(\"%s\")", in, root);
	cachew_fingerprint fp = fp_of(in);
	run_out want = run_ok(in), got = run_ok(p);
	char hex[33], *man;

	run_free(&got);
	cachew_fingerprint_hex(&fp, hex);
	man = fmt("%s/%s/manifest", root, hex);
	ck_assert_int_eq(truncate(man, 10), 0);
	got = run_ok(p);
	assert_same(&want, &got, "pass over a damaged manifest");
	ck_assert_int_eq(verify(root, &fp), CACHEW_OK);
	run_free(&got);
	run_free(&want);
	cwt_rmtree(dir);
	free(man);
	free(p);
	free(root);
	free(dir);
}
END_TEST

/* ---- component names ----------------------------------------------------------- */

#define NAMED_INPUT "from_tensors({image=[1, 2], label=3}) | repeat(3)"

/* Writes the cache of NAMED_INPUT under root with cache_put; *get is the
 * cache_get pipeline that reads it (heap string). */
static void
named_put(const char *root, char **get)
{
	char hex[33], *p = fmt(NAMED_INPUT " | cache_put(\"%s\")", root);
	run_out r = run_ok(p);

	ck_assert_uint_eq(r.n, 3);
	run_free(&r);
	free(p);
	fp_hex(NAMED_INPUT, hex);
	*get = fmt("cache_get(\"%s\", \"%s\")", root, hex);
}

/* Three elements {image: [1 2], label: 3}; with `named` false unnamed. */
static void
assert_named_run(cachew_element **v, size_t n, bool named, const char *what)
{
	char *s;

	ck_assert_msg(n == 3, "%s: %zu elements", what, n);
	s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "[1 2],[1 2],[1 2]");
	free(s);
	s = cwt_join_i64(v, n, 1);
	ck_assert_str_eq(s, "3,3,3");
	free(s);
	for (size_t i = 0; i < n; i++) {
		const char *a = cachew_element_name(v[i], 0);
		const char *b = cachew_element_name(v[i], 1);
		if (!named) {
			ck_assert_msg(a == NULL && b == NULL,
			    "%s: element %zu is named", what, i);
			continue;
		}
		ck_assert_msg(a != NULL && strcmp(a, "image") == 0 &&
				  b != NULL && strcmp(b, "label") == 0,
		    "%s: element %zu is named %s, %s", what, i,
		    a != NULL ? a : "(none)", b != NULL ? b : "(none)");
	}
}

/* cache_put records the names; cache_get knows the spec and cardinality
 * at build and yields named elements, in-process and through the
 * embedded service; cache reading its cache does too. */
START_TEST(named_components_survive_put_then_get)
{
	static const char *const services[] = {NULL, "embedded"};
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *get = NULL;
	char *cached = fmt(NAMED_INPUT " | cache(\"%s\")", root);
	char *by_name;
	cachew_fingerprint fp = fp_of(NAMED_INPUT);
	cwi_cache_manifest *m;
	cachew_err rv;

	named_put(root, &get);
	m = manifest_of(root, &fp, &rv);
	ck_assert_int_eq(rv, CACHEW_OK);
	ck_assert_str_eq(m->names->name[0], "image");
	ck_assert_str_eq(m->names->name[1], "label");
	cwi_cache_manifest_free(m);
	cwt_spec_is(get, "{image: i64[2], label: i64[]}");
	ck_assert_int_eq(cwt_card(get), 3);
	ck_assert_int_eq(cwt_card(cached), 3);
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(SEED, 0, services[k]);
		const char *const pipes[] = {get, cached};
		for (size_t p = 0; p < 2; p++) {
			cachew_element **v;
			size_t n;
			char err[512];
			ck_assert_msg(cwt_run(pipes[p], o, &v, &n, err,
					  sizeof(err)) == CACHEW_OK,
			    "%s: %s", pipes[p], err);
			assert_named_run(v, n, true, pipes[p]);
			cwt_free(v, n);
		}
		cachew_options_destroy(o);
	}
	/* A name resolves against the cache's spec when the stage is
	 * built. */
	by_name = fmt("%s | pad_truncate(len=3, component=\"image\")", get);
	cwt_seq_is(by_name, NULL, "[1 2 0],[1 2 0],[1 2 0]");
	cwt_spec_is(by_name, "{image: i64[3], label: i64[]}");
	free(by_name);
	free(cached);
	free(get);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

/* With the cache's spec known at build, a mismatch is refused there, at
 * the column of the operator, as for any other source. */
START_TEST(get_spec_mismatch_is_refused_at_build)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *get = NULL;
	char *p;

	named_put(root, &get);
	p = fmt("%s | concatenate(range(3))", get);
	cwt_build_refused(p, CACHEW_ETYPE, "elements of 2 and of 1 "
	    "components ({image: i64[2], label: i64[]} against i64[])");
	free(p);
	p = fmt("%s | pad_truncate(len=3, component=\"mask\")", get);
	cwt_build_refused(p, CACHEW_ENOENT, "mask");
	free(p);
	free(get);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

/* A cache that does not exist (or cannot be read) at build leaves the
 * spec and cardinality unknown; one written after the build still names
 * the elements it yields, from its manifest. A damaged manifest builds
 * as unknown and fails the run as it always did. */
START_TEST(get_of_a_cache_missing_at_build_is_unknown_then_named)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *get, *man;
	cachew_element **v;
	cachew_dataset *ds;
	size_t n;
	char hex[33], err[512];

	fp_hex(NAMED_INPUT, hex);
	get = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	cwt_spec_is(get, "?");
	ck_assert_int_eq(cwt_card(get), CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(access(root, F_OK), -1); /* building made nothing */
	ds = cwt_parse(get);
	free(get);
	named_put(root, &get);
	ck_assert_msg(cwt_run_ds(ds, NULL, &v, &n, err, sizeof(err)) ==
			  CACHEW_OK, "%s", err);
	assert_named_run(v, n, true, "built before the cache was written");
	cwt_free(v, n);
	cachew_dataset_release(ds);
	/* Damaged: unknown at build, ECORRUPT at run, marked bad then. */
	man = fmt("%s/%s/manifest", root, hex);
	ck_assert_int_eq(truncate(man, 10), 0);
	cwt_spec_is(get, "?");
	ck_assert_int_eq(cwt_card(get), CACHEW_CARDINALITY_UNKNOWN);
	cwt_run_fails(get, NULL, CACHEW_ECORRUPT, "corrupt");
	free(man);
	free(get);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

/* How a client reads through the service in service_names_...: an
 * option and its value (value NULL: the boolean option off; key NULL:
 * the defaults, exactly once). */
typedef struct svc_way {
	const char *what;
	const char *key, *value;
	bool coordinated; /* one consumer of a coordinated read */
} svc_way;

/* ds through the cluster at url read `way`: elements named or not. */
static void
assert_service_names(cachew_dataset *ds, const char *url, const svc_way *way,
    bool named)
{
	cachew_options *o = cwt_opts_at(SEED, 0, url);
	cachew_element **v;
	size_t n;
	char err[512];

	if (way->key != NULL && way->value != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, way->key,
				     way->value), CACHEW_OK);
	else if (way->key != NULL)
		ck_assert_int_eq(cachew_options_set_bool(o, way->key, false),
		    CACHEW_OK);
	if (way->coordinated) {
		ck_assert_int_eq(cachew_options_set_int(o, "num_consumers", 1),
		    CACHEW_OK);
		ck_assert_int_eq(cachew_options_set_int(o, "consumer_index",
				     0), CACHEW_OK);
	}
	ck_assert_msg(cwt_run_ds(ds, o, &v, &n, err, sizeof(err)) ==
			  CACHEW_OK, "%s: %s", way->what, err);
	assert_named_run(v, n, named, way->what);
	cwt_free(v, n);
	cachew_options_destroy(o);
}

/* A cache the client cannot read when it builds (on the service the
 * root is the workers' storage; here it was elsewhere at the client's
 * build) leaves the client's spec unknown. The worker reads the
 * manifest when it builds its task and tells the names in its replies:
 * the elements arrive named however the client reads, as they do
 * in-process; before, they arrived unnamed. */
START_TEST(service_names_elements_the_client_could_not_name_at_build)
{
	static const svc_way ways[] = {
	    {"exactly once", NULL, NULL, false},
	    {"at least once", "exactly_once", NULL, false},
	    {"compressed", "compression", "zstd", false},
	    {"parallel_epochs", "processing_mode", "parallel_epochs", false},
	    {"coordinated", "job_name", "named-coordinated", true},
	};
	cwt_cluster c;
	char *root, *away, *get = NULL;
	cachew_dataset *unknown, *known;

	cwt_cluster_start(&c, 1);
	root = fmt("%s/named", c.dir);
	away = fmt("%s/named.away", c.dir);
	named_put(root, &get);
	ck_assert_int_eq(rename(root, away), 0);
	cwt_spec_is(get, "?");
	unknown = cwt_parse(get);
	ck_assert_int_eq(rename(away, root), 0);
	known = cwt_parse(get);
	for (size_t i = 0; i < sizeof(ways) / sizeof(ways[0]); i++) {
		assert_service_names(unknown, c.dispatcher.url, &ways[i], true);
		/* The client's own names, as before. */
		assert_service_names(known, c.dispatcher.url, &ways[i], true);
	}
	cachew_dataset_release(unknown);
	cachew_dataset_release(known);
	cwt_cluster_stop(&c);
	free(get);
	free(away);
	free(root);
}
END_TEST

/* The same with a batch in the worker part over a cache of many chunks
 * (splits), read exactly once by two workers: each lease ends in a
 * partial batch the client stitches, and the stitched batches are named
 * as the others. */
START_TEST(service_names_stitched_batches_the_client_could_not_name)
{
	const char *input = "from_tensors({image=[1, 2], label=3}) | "
			    "repeat(20000)";
	cwt_cluster c;
	char *root, *away, *p, *get, hex[33], err[512];
	cachew_options *o;
	cachew_element **v;
	cachew_dataset *ds;
	run_out r;
	size_t n, rows = 0;

	cwt_cluster_start(&c, 2);
	root = fmt("%s/named", c.dir);
	away = fmt("%s/named.away", c.dir);
	/* 4 KiB chunks stored nearly raw: about 30 splits. */
	p = fmt("%s | cache_put(\"%s\", chunk_bytes=4096, level=-7)", input,
	    root);
	r = run_ok(p);
	ck_assert_uint_eq(r.n, 20000);
	run_free(&r);
	free(p);
	fp_hex(input, hex);
	get = fmt("cache_get(\"%s\", \"%s\") | batch(7)", root, hex);
	ck_assert_int_eq(rename(root, away), 0);
	cwt_spec_is(get, "?");
	ds = cwt_parse(get);
	ck_assert_int_eq(rename(away, root), 0);
	o = cwt_opts_at(SEED, 0, c.dispatcher.url);
	ck_assert_msg(cwt_run_ds(ds, o, &v, &n, err, sizeof(err)) ==
			  CACHEW_OK, "%s", err);
	for (size_t i = 0; i < n; i++) {
		const char *a = cachew_element_name(v[i], 0);
		const char *b = cachew_element_name(v[i], 1);
		ck_assert_msg(a != NULL && strcmp(a, "image") == 0 &&
				  b != NULL && strcmp(b, "label") == 0,
		    "batch %zu of %zu is named %s, %s", i, n,
		    a != NULL ? a : "(none)", b != NULL ? b : "(none)");
		rows += (size_t)cachew_tensor_shape(
		    cachew_element_component(v[i], 0))[0];
	}
	ck_assert_uint_eq(rows, 20000);
	ck_assert_uint_eq(n, (20000 + 6) / 7); /* full batches: stitched */
	cwt_free(v, n);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
	cwt_cluster_stop(&c);
	free(get);
	free(away);
	free(root);
}
END_TEST

/* A manifest without names (written before names existed, here by the
 * encoder with none) reads as before: the same data, unnamed. */
START_TEST(get_of_a_manifest_without_names_reads_unnamed)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *get = NULL;
	cachew_fingerprint fp = fp_of(NAMED_INPUT);
	cwi_cache_manifest *m;
	cachew_element **v;
	cwi_strbuf sb;
	size_t n;
	char hex[33], err[512], *man;
	cachew_err rv;
	FILE *f;

	named_put(root, &get);
	m = manifest_of(root, &fp, &rv);
	ck_assert_int_eq(rv, CACHEW_OK);
	cwi_names_unref(m->names);
	m->names = NULL;
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_cache_manifest_encode(m, &sb), CACHEW_OK);
	cachew_fingerprint_hex(&fp, hex);
	man = fmt("%s/%s/manifest", root, hex);
	f = fopen(man, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(sb.data, 1, sb.len, f), sb.len);
	ck_assert_int_eq(fclose(f), 0);
	cwi_strbuf_free(&sb);
	cwi_cache_manifest_free(m);
	cwt_spec_is(get, "(i64[2], i64[])");
	ck_assert_int_eq(cwt_card(get), 3);
	ck_assert_msg(cwt_run(get, NULL, &v, &n, err, sizeof(err)) ==
			  CACHEW_OK, "%s", err);
	assert_named_run(v, n, false, "a manifest without names");
	cwt_free(v, n);
	free(man);
	free(get);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

/* Building never waits long on storage: an S3 endpoint that takes the
 * connection and never answers leaves cache_get's spec unknown after one
 * short attempt (CWI_CACHE_PEEK_STALL_SECS), where a run's reads would
 * retry for minutes. The test case's timeout bounds it. */
START_TEST(get_build_gives_up_on_an_s3_root_that_does_not_answer)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t alen = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char url[64], *get;
	cachew_dataset *ds;

	ck_assert_int_ge(fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(fd, 16), 0); /* never accepted */
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(a.sin_port));
	setenv("AWS_ENDPOINT_URL", url, 1);
	setenv("AWS_ACCESS_KEY_ID", "K", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "S", 1);
	get = fmt("cache_get(\"s3://bkt/caches\", \"%032x\")", 7);
	/* One stalled attempt of a few seconds, not the default 30 s stall
	 * times 9 attempts (which the suite's 60 s timeout would cut). */
	ds = cwt_parse(get);
	ck_assert_uint_eq(cachew_dataset_num_components(ds), 0);
	ck_assert_int_eq(cachew_dataset_cardinality(ds),
	    CACHEW_CARDINALITY_UNKNOWN);
	cachew_dataset_release(ds);
	unsetenv("AWS_ENDPOINT_URL");
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	close(fd);
	free(get);
}
END_TEST

/* ---- the CLI ------------------------------------------------------------------------ */

typedef struct cli_result {
	int status; /* exit code, or 128 + signal */
	char *out;
	char *err;
} cli_result;

/* Runs `<build>/cachew arg...` (NULL-terminated) with one extra
 * environment assignment (or NULL); output goes through files. */
static cli_result
cli_env(const char *env, ...)
{
	char bin[512], *argv[32];
	char *dir = cwt_tmpdir(), *out = fmt("%s/out", dir);
	char *err = fmt("%s/err", dir);
	cli_result r;
	va_list ap;
	size_t n = 1, len;
	pid_t pid;
	int st;

	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	argv[0] = bin;
	va_start(ap, env);
	while ((argv[n] = va_arg(ap, char *)) != NULL && n < 30)
		n++;
	va_end(ap);
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (freopen(out, "w", stdout) == NULL ||
		    freopen(err, "w", stderr) == NULL)
			_exit(127);
		unsetenv("CACHEW_CACHE_ROOT");
		if (env != NULL)
			putenv((char *)env);
		execv(argv[0], argv);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	r.out = read_all(out, &len);
	r.err = read_all(err, &len);
	cwt_rmtree(dir);
	free(out);
	free(err);
	free(dir);
	return r;
}

#define cli(...) cli_env(NULL, __VA_ARGS__, (char *)NULL)

static void
cli_free(cli_result *r)
{
	free(r->out);
	free(r->err);
}

/* Writes the caches of `a` and `b` under root through `cachew run`. */
static void
cli_put(const char *root, const char *in)
{
	char *p = fmt("%s | cache_put(\"%s\", chunk_bytes=4096)", in, root);
	cli_result r = cli("run", "--quiet", "--seed", "7", p);

	ck_assert_msg(r.status == 0, "%s", r.err);
	cli_free(&r);
	free(p);
}

/* `cachew head` prints the components of a named cache by name, and
 * `cachew explain` its spec and cardinality. */
START_TEST(cli_head_and_explain_of_a_named_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir), *get = NULL;
	cli_result r;

	named_put(root, &get);
	r = cli("head", "-n", "2", get);
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_msg(strstr(r.out, "0: {image: i64[2] [1 2], label: 3}\n"
				    "1: {image: i64[2] [1 2], label: 3}\n") !=
			  NULL, "%s", r.out);
	cli_free(&r);
	r = cli("explain", get);
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_msg(strstr(r.out, "spec={image: i64[2], label: i64[]} "
				    "card=3") != NULL, "%s", r.out);
	cli_free(&r);
	free(get);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cli_cache_help_lists_the_commands)
{
	cli_result r = cli("cache", "--help");

	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "usage: cachew cache"));
	ck_assert_ptr_nonnull(strstr(r.out, "gc ROOT --max-bytes N"));
	cli_free(&r);
	r = cli("cache", "ls", "--help");
	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "usage: cachew cache"));
	cli_free(&r);
}
END_TEST

static void
assert_usage(cli_result r, const char *needle)
{
	ck_assert_msg(r.status == 2, "exit %d: %s", r.status, r.err);
	ck_assert_msg(strstr(r.err, needle) != NULL, "'%s' not in: %s", needle,
	    r.err);
	ck_assert_str_eq(r.out, "");
	cli_free(&r);
}

START_TEST(cli_cache_usage_errors_exit_2)
{
	assert_usage(cli("cache"), "missing a command");
	assert_usage(cli("cache", "frob"), "unknown command 'frob'");
	assert_usage(cli("cache", "ls"), "CACHEW_CACHE_ROOT is not set");
	assert_usage(cli("cache", "ls", "/tmp", "--color"),
	    "unknown flag '--color'");
	assert_usage(cli("cache", "verify"), "missing ROOT");
	assert_usage(cli("cache", "rm", "/tmp"), "missing FP");
	assert_usage(cli("cache", "rm", "/tmp", "xyz"),
	    "'xyz' is not a fingerprint");
	assert_usage(cli("cache", "gc", "/tmp"), "missing --max-bytes");
	assert_usage(cli("cache", "gc", "/tmp", "--max-bytes", "12Q"),
	    "'12Q' is not a size");
	assert_usage(cli("cache", "gc", "/tmp", "--max-bytes"),
	    "--max-bytes expects a size");
	assert_usage(cli("cache", "probe"), "missing ROOT");
	assert_usage(cli("cache", "probe", "/tmp", "--bytes", "0"),
	    "--bytes expects a positive size");
}
END_TEST

START_TEST(cli_cache_ls_lists_fingerprint_state_and_pipeline)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char a[33], b[33];
	cli_result r;

	cli_put(root, "range(300) | batch(3)");
	cli_put(root, "range(40)");
	fp_hex("range(300) | batch(3)", a);
	fp_hex("range(40)", b);
	r = cli("cache", "ls", root);
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_ptr_nonnull(strstr(r.out, a));
	ck_assert_ptr_nonnull(strstr(r.out, b));
	ck_assert_ptr_nonnull(strstr(r.out, "complete"));
	ck_assert_ptr_nonnull(strstr(r.out, "range(start=0, stop=300, step=1) | batch(n=3"));
	ck_assert_ptr_nonnull(strstr(r.out, "2 caches"));
	ck_assert_ptr_nonnull(strstr(r.out, "       100  ")); /* elements */
	cli_free(&r);
	/* The root from the environment. */
	char *env = fmt("CACHEW_CACHE_ROOT=%s", root);
	r = cli_env(env, "cache", "ls", (char *)NULL);
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_ptr_nonnull(strstr(r.out, a));
	cli_free(&r);
	free(env);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cli_cache_ls_json_is_one_array)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char a[33], *want;
	cli_result r;

	cli_put(root, "range(40)");
	fp_hex("range(40)", a);
	r = cli("cache", "ls", root, "--json");
	ck_assert_msg(r.status == 0, "%s", r.err);
	want = fmt("[{\"fingerprint\":\"%s\",\"state\":\"complete\",", a);
	ck_assert_msg(strncmp(r.out, want, strlen(want)) == 0, "%s", r.out);
	ck_assert_ptr_nonnull(strstr(r.out, "\"elements\":40,"));
	ck_assert_ptr_nonnull(
	    strstr(r.out, "\"pipeline\":\"range(start=0, stop=40, step=1)\""));
	ck_assert_ptr_nonnull(strstr(r.out, "}]\n"));
	cli_free(&r);
	free(want);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cli_cache_ls_of_a_missing_root_exits_1)
{
	cli_result r = cli("cache", "ls", "/nonexistent/cache-root");

	ck_assert_int_eq(r.status, 1);
	ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/cache-root"));
	cli_free(&r);
}
END_TEST

START_TEST(cli_cache_verify_reports_ok_and_corruption)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(3000) | map(add) | batch(2)";
	cachew_fingerprint fp = fp_of(in);
	char a[33], *chunk;
	cli_result r;

	cli_put(root, in);
	cachew_fingerprint_hex(&fp, a);
	r = cli("cache", "verify", root);
	ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
	ck_assert_ptr_nonnull(strstr(r.out, a));
	ck_assert_ptr_nonnull(strstr(r.out, "ok  1500 elements"));
	cli_free(&r);
	chunk = corrupt_chunk(root, &fp, 0);
	r = cli("cache", "verify", root, a);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.out, "CORRUPT") != NULL, "%s", r.out);
	ck_assert_msg(strstr(r.out, strrchr(chunk, '/') + 1) != NULL, "%s",
	    r.out);
	cli_free(&r);
	r = cli("cache", "ls", root);
	ck_assert_ptr_nonnull(strstr(r.out, "bad"));
	cli_free(&r);
	/* An unknown fingerprint is a runtime error naming it. */
	r = cli("cache", "verify", root, "00000000000000000000000000000000");
	ck_assert_int_eq(r.status, 1);
	ck_assert_ptr_nonnull(strstr(r.err, "no such cache"));
	cli_free(&r);
	cwt_rmtree(dir);
	free(chunk);
	free(root);
	free(dir);
}
END_TEST

/* `cachew cache verify` over a FIFO named like a chunk reports it and
 * exits 1 instead of waiting for a writer. */
START_TEST(cli_cache_verify_refuses_a_fifo_chunk)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(3000) | map(add) | batch(2)";
	cachew_fingerprint fp = fp_of(in);
	char *fifo;
	cli_result r;

	cli_put(root, in);
	fifo = fifo_for_chunk(root, &fp, 0);
	r = cli("cache", "verify", root);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.out, "not a regular file (a FIFO)") != NULL,
	    "%s%s", r.out, r.err);
	cli_free(&r);
	cwt_rmtree(dir);
	free(fifo);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cli_cache_rm_removes_by_fingerprint_or_prefix)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char a[33], b[33], prefix[9];
	cachew_fingerprint fa = fp_of("range(30)"), fb = fp_of("range(31)");
	cli_result r;

	cli_put(root, "range(30)");
	cli_put(root, "range(31)");
	cachew_fingerprint_hex(&fa, a);
	cachew_fingerprint_hex(&fb, b);
	r = cli("cache", "rm", root, a);
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_ptr_nonnull(strstr(r.out, "removed"));
	cli_free(&r);
	ck_assert_int_eq(lookup(root, &fa), CACHEW_ENOENT);
	ck_assert_int_eq(lookup(root, &fb), CACHEW_OK);
	memcpy(prefix, b, 8);
	prefix[8] = '\0';
	r = cli("cache", "rm", root, prefix);
	ck_assert_msg(r.status == 0, "%s", r.err);
	cli_free(&r);
	ck_assert_int_eq(lookup(root, &fb), CACHEW_ENOENT);
	r = cli("cache", "rm", root, a);
	ck_assert_int_eq(r.status, 1);
	ck_assert_ptr_nonnull(strstr(r.err, "no such cache"));
	cli_free(&r);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cli_cache_gc_evicts_down_to_max_bytes)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	cachew_fingerprint fa = fp_of("range(300)"), fb = fp_of("range(301)");
	cli_result r;

	cli_put(root, "range(300)");
	cli_put(root, "range(301)");
	r = cli("cache", "gc", root, "--max-bytes", "1G");
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_ptr_nonnull(strstr(r.out, "freed 0 B"));
	cli_free(&r);
	ck_assert_int_eq(lookup(root, &fa), CACHEW_OK);
	r = cli("cache", "gc", root, "--max-bytes", "0");
	ck_assert_msg(r.status == 0, "%s", r.err);
	ck_assert_ptr_nonnull(strstr(r.out, "freed"));
	cli_free(&r);
	ck_assert_int_eq(lookup(root, &fa), CACHEW_ENOENT);
	ck_assert_int_eq(lookup(root, &fb), CACHEW_ENOENT);
	r = cli("cache", "ls", root);
	ck_assert_ptr_nonnull(strstr(r.out, "no caches"));
	cli_free(&r);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

START_TEST(cli_cache_probe_reports_read_rates)
{
	char *dir = cwt_tmpdir();
	cli_result r = cli("cache", "probe", dir, "--element-bytes", "4K",
	    "--bytes", "1M", "--json");
	double mbps = 0, eps = 0;
	const char *p;

	ck_assert_msg(r.status == 0, "%s", r.err);
	p = strstr(r.out, "\"read_mb_per_s\":");
	ck_assert_ptr_nonnull(p);
	mbps = atof(p + strlen("\"read_mb_per_s\":"));
	p = strstr(r.out, "\"read_elements_per_s\":");
	ck_assert_ptr_nonnull(p);
	eps = atof(p + strlen("\"read_elements_per_s\":"));
	ck_assert(mbps > 0);
	ck_assert(eps > 0);
	ck_assert_ptr_nonnull(strstr(r.out, "\"element_bytes\":4096,"));
	cli_free(&r);
	r = cli("cache", "ls", dir);
	ck_assert_ptr_nonnull(strstr(r.out, "no caches")); /* removed */
	cli_free(&r);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- crash safety: a writer killed with SIGKILL -------------------------------------- */

static uint64_t
rng_next(uint64_t *s)
{
	*s += 0x9e3779b97f4a7c15ULL;
	uint64_t z = *s;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static pid_t
spawn_writer(const char *pipeline)
{
	char bin[512];
	pid_t pid;

	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	fflush(NULL);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);
		dup2(fd, 1);
		dup2(fd, 2);
		execl(bin, bin, "run", "--quiet", "--seed", "7", pipeline,
		    (char *)NULL);
		_exit(127);
	}
	return pid;
}

static cachew_err
release_element(void *ctx, cwi_element *e)
{
	size_t *count = ctx;

	(*count)++;
	cwi_element_release(e);
	return CACHEW_OK;
}

/* Every final-named file in the cache directory is whole: each chunk
 * decodes completely, and a manifest means a cache that verifies.
 * Returns true when a manifest exists. */
static bool
assert_no_bad_final_file(const char *root, const cachew_fingerprint *fp)
{
	char hex[33], *cdir;
	bool manifest = false;
	struct dirent *de;
	DIR *d;

	cachew_fingerprint_hex(fp, hex);
	cdir = fmt("%s/%s", root, hex);
	d = opendir(cdir);
	if (d == NULL) {
		free(cdir);
		return false;
	}
	while ((de = readdir(d)) != NULL) {
		char *path;
		size_t len, count = 0;
		char *data;

		if (strcmp(de->d_name, "manifest") == 0)
			manifest = true;
		if (!is_chunk_name(de->d_name))
			continue;
		path = fmt("%s/%s", cdir, de->d_name);
		data = read_all(path, &len);
		ck_assert_msg(cwi_cache_chunk_decode(data, len, release_element,
				  &count) == CACHEW_OK,
		    "final-named chunk %s is bad: %s", path, cachew_errmsg());
		free(data);
		free(path);
	}
	closedir(d);
	free(cdir);
	if (manifest)
		ck_assert_int_eq(verify(root, fp), CACHEW_OK);
	else
		ck_assert_int_eq(lookup(root, fp), CACHEW_ENOENT);
	return manifest;
}

START_TEST(crash_killed_writer_never_leaves_a_bad_final_file)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(12000) | map(uniform) | batch(8)";
	char *wp = fmt("%s | cache_put(\"%s\", chunk_bytes=8192)", in, root);
	char *cp = fmt("%s | cache(\"%s\", chunk_bytes=8192)", in, root);
	cachew_fingerprint fp = fp_of(in);
	run_out want = run_ok(in), got;
	int kills = small_run() ? 5 : 20, st, complete = 0;
	uint64_t rng = 20240601, t0, full_us;
	pid_t pid;

	/* The fastest of three uninterrupted writes scales the kill delays
	 * (a slow first run must not push every kill past the end). */
	full_us = UINT64_MAX;
	for (int i = 0; i < 3; i++) {
		t0 = now_us();
		pid = spawn_writer(wp);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		if (now_us() - t0 < full_us)
			full_us = now_us() - t0;
		ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		ck_assert_int_eq(verify(root, &fp), CACHEW_OK);
		cwt_rmtree(root);
	}
	for (int k = 0; k < kills; k++) {
		/* Uniform over the writer's life, a little past its end. */
		uint64_t delay = rng_next(&rng) % (full_us * 5 / 4 + 1);

		pid = spawn_writer(wp);
		usleep((useconds_t)delay);
		kill(pid, SIGKILL);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		complete += assert_no_bad_final_file(root, &fp);
		/* The next run recomputes (or reads) the exact data... */
		got = run_ok(cp);
		assert_same(&want, &got, "cache() after a killed writer");
		run_free(&got);
		/* ...and leaves a sound cache. */
		ck_assert_int_eq(verify(root, &fp), CACHEW_OK);
		cwt_rmtree(root);
	}
	/* A sanity check of the delays, not a timing assertion: uniform
	 * delays over the writer's life leave some kills mid-write. */
	ck_assert_int_lt(complete, kills);
	run_free(&want);
	cwt_rmtree(dir);
	free(cp);
	free(wp);
	free(root);
	free(dir);
}
END_TEST

/* ---- corruption: flipped bits and truncated files ------------------------------------ */

typedef struct pristine_file {
	char *path;
	char *data;
	size_t len;
} pristine_file;

typedef struct pristine_cache {
	char *input;           /* the cached pipeline */
	char *pipeline;        /* input | cache(root) */
	cachew_fingerprint fp;
	char *dir;
	run_out want;
	pristine_file files[64];
	size_t nfiles;
} pristine_cache;

static void
pristine_take(pristine_cache *c, const char *root)
{
	char hex[33];
	struct dirent *de;
	DIR *d;

	cachew_fingerprint_hex(&c->fp, hex);
	c->dir = fmt("%s/%s", root, hex);
	d = opendir(c->dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)) != NULL) {
		pristine_file *f;
		if (!is_chunk_name(de->d_name) &&
		    strcmp(de->d_name, "manifest") != 0)
			continue;
		ck_assert_uint_lt(c->nfiles, 64);
		f = &c->files[c->nfiles++];
		f->path = fmt("%s/%s", c->dir, de->d_name);
		f->data = read_all(f->path, &f->len);
	}
	closedir(d);
	ck_assert_uint_ge(c->nfiles, 2);
}

/* Puts the cache back exactly as it was written. */
static void
pristine_restore(pristine_cache *c)
{
	cwt_rmtree(c->dir);
	ck_assert_int_eq(mkdir(c->dir, 0755), 0);
	for (size_t i = 0; i < c->nfiles; i++)
		cwt_write_file(c->files[i].path, c->files[i].data,
		    c->files[i].len);
}

START_TEST(corruption_is_always_detected_and_recomputed)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	char *data = fmt("%s/data", dir), *file = text_file(dir, 2000);
	pristine_cache caches[3];
	int flips = small_run() ? 50 : 200, truncs = small_run() ? 5 : 20;
	uint64_t rng = 4242;
	int detected = 0;

	memset(caches, 0, sizeof(caches));
	caches[0].input = strdup("range(3000) | map(uniform) | batch(4)");
	caches[1].input = fmt("text_lines(\"%s\")", file);
	caches[2].input = image_source(data);
	for (int i = 0; i < 3; i++) {
		pristine_cache *c = &caches[i];
		run_out w;
		c->fp = fp_of(c->input);
		c->pipeline = fmt("%s | cache(\"%s\", chunk_bytes=8192)",
		    c->input, root);
		c->want = run_ok(c->input);
		w = run_ok(c->pipeline);
		assert_same(&c->want, &w, "first pass");
		run_free(&w);
		pristine_take(c, root);
	}
	for (int k = 0; k < flips + truncs; k++) {
		pristine_cache *c = &caches[rng_next(&rng) % 3];
		pristine_file *f = &c->files[rng_next(&rng) % c->nfiles];
		run_out got;

		pristine_restore(c);
		if (k < flips)
			flip_bit(f->path, rng_next(&rng) % (f->len * 8));
		else
			ck_assert_int_eq(truncate(f->path,
					     (off_t)(rng_next(&rng) % f->len)),
			    0);
		log_capture();
		got = run_ok(c->pipeline);
		log_release();
		/* 0 bad elements: exactly the uncorrupted data. */
		assert_same(&c->want, &got, f->path);
		run_free(&got);
		ck_assert_msg(log_warns > 0,
		    "corruption %d of %s (%s) went unnoticed", k, f->path,
		    k < flips ? "bit flip" : "truncation");
		detected++;
		/* The recomputing pass left a sound cache. */
		ck_assert_int_eq(verify(root, &c->fp), CACHEW_OK);
	}
	ck_assert_int_eq(detected, flips + truncs);
	for (int i = 0; i < 3; i++) {
		pristine_cache *c = &caches[i];
		for (size_t j = 0; j < c->nfiles; j++) {
			free(c->files[j].path);
			free(c->files[j].data);
		}
		run_free(&c->want);
		free(c->dir);
		free(c->pipeline);
		free(c->input);
	}
	cwt_rmtree(dir);
	free(file);
	free(data);
	free(root);
	free(dir);
}
END_TEST

/* ---- gc alongside readers ------------------------------------------------------------ */

typedef struct reader_arg {
	const char *pipeline;
	const run_out *want;
	pthread_barrier_t *started;
	pthread_barrier_t *resume;
	size_t n;
	bool ok;
} reader_arg;

/* Reads a few elements, waits while gc runs, then reads the rest. */
static void *
reader_main(void *arg)
{
	reader_arg *a = arg;
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;

	a->ok = cachew_dataset_parse(&ds, a->pipeline) == CACHEW_OK &&
		cachew_iterator_create(&it, ds, NULL) == CACHEW_OK;
	for (int i = 0; a->ok && i < 10; i++) {
		a->ok = cachew_iterator_next(it, &e) == CACHEW_OK &&
			cwi_element_equal(e, a->want->v[a->n]);
		cachew_element_release(e);
		a->n++;
	}
	pthread_barrier_wait(a->started);
	pthread_barrier_wait(a->resume);
	while (a->ok && (rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		a->ok = a->n < a->want->n &&
			cwi_element_equal(e, a->want->v[a->n]);
		cachew_element_release(e);
		a->n++;
	}
	a->ok = a->ok && rv == CACHEW_EOF && a->n == a->want->n;
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	return NULL;
}

START_TEST(gc_spares_a_cache_being_read_and_removes_it_after)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(20000) | map(uniform) | batch(4)";
	cachew_fingerprint fp = fp_of(in), other = fp_of("range(77)");
	run_out want = put(in, root, ", chunk_bytes=8192"), o;
	pthread_barrier_t started, resume;
	reader_arg args[3];
	pthread_t tids[3];
	char hex[33], *p;
	cli_result r;

	o = put("range(77)", root, "");
	run_free(&o);
	cachew_fingerprint_hex(&fp, hex);
	p = fmt("cache_get(\"%s\", \"%s\", threads=2)", root, hex);
	pthread_barrier_init(&started, NULL, 4);
	pthread_barrier_init(&resume, NULL, 4);
	for (int i = 0; i < 3; i++) {
		args[i] = (reader_arg){.pipeline = p, .want = &want,
		    .started = &started, .resume = &resume};
		ck_assert_int_eq(
		    pthread_create(&tids[i], NULL, reader_main, &args[i]), 0);
	}
	pthread_barrier_wait(&started);
	r = cli("cache", "gc", root, "--max-bytes", "0");
	ck_assert_msg(r.status == 0, "%s", r.err);
	cli_free(&r);
	/* The idle cache went; the one being read stays. */
	ck_assert_int_eq(lookup(root, &other), CACHEW_ENOENT);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_OK);
	pthread_barrier_wait(&resume);
	for (int i = 0; i < 3; i++) {
		pthread_join(tids[i], NULL);
		ck_assert_msg(args[i].ok, "reader %d failed after %zu elements",
		    i, args[i].n);
	}
	r = cli("cache", "gc", root, "--max-bytes", "0");
	ck_assert_msg(r.status == 0, "%s", r.err);
	cli_free(&r);
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	pthread_barrier_destroy(&started);
	pthread_barrier_destroy(&resume);
	run_free(&want);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

/* ---- distributed writes: one part per lease ------------------------------ */

static uint64_t
multiset_digest(const run_out *r)
{
	uint64_t d = 0;

	for (size_t i = 0; i < r->n; i++)
		d += cachew_element_hash(r->v[i]);
	return d;
}

/* Runs one lease of the plan's worker part to its end. */
static void
run_put_lease(const cwi_split_plan *p, const cwi_unit_range *r, size_t n)
{
	cachew_iterator *it = NULL;
	cachew_element *e;
	cachew_err rv;

	rv = cwi_iterator_create_lease(&it, p->worker, NULL, p->source, r, n, 1);
	ck_assert_msg(rv == CACHEW_OK, "lease: %s", cachew_errmsg());
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK)
		cachew_element_release(e);
	ck_assert_int_eq(rv, CACHEW_EOF);
	cachew_iterator_destroy(it);
}

START_TEST(put_with_write_id_writes_a_part_per_lease_then_commits)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(100) | map(add, value=3)";
	char *pipeline = fmt("%s | cache_put(\"%s\", write_id=77, "
			     "chunk_bytes=4096)", in, root);
	cachew_dataset *ds = NULL;
	cwi_split_plan *plan = NULL;
	cwi_cache_root *r = NULL;
	cwi_unit_range a[] = {{0, 30}, {60, 70}}, b[] = {{30, 60}},
		       c[] = {{70, 100}};
	cachew_fingerprint fp = fp_of(in);
	uint64_t n = 0;
	run_out want = run_ok(in), got;
	char hex[33], *get;

	ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline), CACHEW_OK);
	ck_assert_msg(cwi_split_plan_create(&plan, (cwi_node *)ds) == CACHEW_OK,
	    "%s", cachew_errmsg());
	/* The write runs on the workers: nothing is left for the client. */
	ck_assert_uint_eq(plan->nclient, 0);
	ck_assert_uint_eq(plan->units, 100);
	run_put_lease(plan, a, 2);
	run_put_lease(plan, b, 1);
	run_put_lease(plan, b, 1); /* a replayed lease */
	ck_assert_int_eq(lookup(root, &fp), CACHEW_ENOENT);
	run_put_lease(plan, c, 1);
	ck_assert_int_eq(cwi_cache_root_open(&r, root, 0), CACHEW_OK);
	ck_assert_msg(cwi_cache_parts_commit(r, &plan->worker_fp, in, 77,
			  plan->units, &n) == CACHEW_OK,
	    "%s", cachew_errmsg());
	ck_assert_uint_eq(n, 100);
	ck_assert(memcmp(&plan->worker_fp, &fp, sizeof(fp)) == 0);
	fp_hex(in, hex);
	get = fmt("cache_get(\"%s\", \"%s\")", root, hex);
	got = run_ok(get);
	ck_assert_uint_eq(got.n, want.n);
	ck_assert_uint_eq(multiset_digest(&got), multiset_digest(&want));
	run_free(&got);
	run_free(&want);
	free(get);
	cwi_cache_root_close(r);
	cwi_split_plan_destroy(plan);
	cachew_dataset_release(ds);
	cwt_rmtree(dir);
	free(pipeline);
	free(root);
	free(dir);
}
END_TEST

START_TEST(put_with_write_id_in_process_writes_the_whole_cache)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(50)";
	char *p = fmt("%s | cache_put(\"%s\", write_id=5)", in, root);
	run_out want = run_ok(in), got = run_ok(p);
	cachew_fingerprint fp = fp_of(in);

	/* Not split: one writer, complete at the end of the pass. */
	assert_same(&want, &got, "pass-through");
	ck_assert_int_eq(lookup(root, &fp), CACHEW_OK);
	run_free(&want);
	run_free(&got);
	cwt_rmtree(dir);
	free(p);
	free(root);
	free(dir);
}
END_TEST

/* ---- plans: PUT and GET rewrites ----------------------------------------- */

static cwi_node *
find_op(cwi_node *n, const char *op)
{
	if (strcmp(n->op->name, op) == 0)
		return n;
	for (size_t i = 0; i < n->ninputs; i++) {
		cwi_node *f = find_op(n->inputs[i], op);
		if (f != NULL)
			return f;
	}
	return NULL;
}

/* Runs a dataset in-process (two threads, fixed seed). */
static run_out
run_ds(cachew_dataset *ds)
{
	char *s = NULL;
	run_out r;

	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	r = run_ok(s);
	cachew_free(s);
	return r;
}

START_TEST(plans_write_then_read_the_cache_at_the_marker)
{
	char *dir = cwt_tmpdir(), *root = fmt("%s/cache", dir);
	const char *in = "range(100) | map(add, value=3) | autocache() | "
			 "map(add, value=1) | batch(7)";
	cachew_dataset *ds = NULL, *put = NULL, *get = NULL;
	cachew_fingerprint f0, f1, f2;
	cwi_node *marker;
	run_out want = run_ok(in), got;
	char *s = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, in), CACHEW_OK);
	marker = find_op(ds, "autocache");
	ck_assert_ptr_nonnull(marker);
	ck_assert_int_eq(cwi_cache_plan_put(ds, marker, root, 0, &put),
	    CACHEW_OK);
	cachew_dataset_fingerprint(ds, &f0);
	cachew_dataset_fingerprint(put, &f1);
	ck_assert(memcmp(&f0, &f1, sizeof(f0)) == 0);
	got = run_ds(put);
	assert_same(&want, &got, "PUT plan");
	run_free(&got);
	ck_assert_int_eq(lookup(root, cwi_node_fp(marker)), CACHEW_OK);
	ck_assert_int_eq(cwi_cache_plan_get(ds, marker, root, &get), CACHEW_OK);
	cachew_dataset_fingerprint(get, &f2);
	ck_assert(memcmp(&f0, &f2, sizeof(f0)) == 0);
	ck_assert_int_eq(cachew_dataset_to_string(get, &s), CACHEW_OK);
	ck_assert_msg(strncmp(s, "cache_get(", 10) == 0 &&
			  strstr(s, "range(") == NULL,
	    "%s", s);
	cachew_free(s);
	got = run_ds(get);
	assert_same(&want, &got, "GET plan");
	run_free(&got);
	/* A node of another graph is refused. */
	{
		cachew_dataset *other = NULL, *bad = NULL;
		ck_assert_int_eq(cachew_dataset_parse(&other, "range(5)"),
		    CACHEW_OK);
		ck_assert_int_eq(cwi_cache_plan_get(ds, other, root, &bad),
		    CACHEW_EINVAL);
		ck_assert_ptr_null(bad);
		cachew_dataset_release(other);
	}
	run_free(&want);
	cachew_dataset_release(get);
	cachew_dataset_release(put);
	cachew_dataset_release(ds);
	cwt_rmtree(dir);
	free(root);
	free(dir);
}
END_TEST

Suite *
cwt_cacheops_suite(void)
{
	Suite *s = suite_create("cacheops");
	TCase *ops = tcase_create("operators");
	TCase *cli_tc = tcase_create("cli");
	TCase *harsh = tcase_create("crash_corruption_gc");
	TCase *svc_tc = tcase_create("service_names");

	tcase_set_timeout(ops, 60);
	tcase_add_test(ops, put_then_get_range_map_batch_is_exact);
	tcase_add_test(ops, put_with_write_id_writes_a_part_per_lease_then_commits);
	tcase_add_test(ops, put_with_write_id_in_process_writes_the_whole_cache);
	tcase_add_test(ops, plans_write_then_read_the_cache_at_the_marker);
	tcase_add_test(ops, put_then_get_text_lines_is_exact);
	tcase_add_test(ops, put_then_get_u8_image_crops_is_exact);
	tcase_add_test(ops, put_of_many_chunks_keeps_order_across_chunks);
	tcase_add_test(ops, put_of_empty_input_makes_an_empty_cache);
	tcase_add_test(ops, cache_ops_keep_the_inputs_fingerprint);
	tcase_add_test(ops, put_over_a_complete_cache_passes_through);
	tcase_add_test(ops, put_cut_short_by_take_leaves_no_cache);
	tcase_add_test(ops, put_iterator_destroyed_midway_leaves_no_cache);
	tcase_add_test(ops, put_upstream_error_fails_and_leaves_no_cache);
	tcase_add_test(ops, put_to_an_unusable_root_warns_and_passes_through);
	tcase_add_test(ops, put_over_capacity_warns_and_passes_through);
	tcase_add_test(ops, get_of_a_missing_cache_is_enoent);
	tcase_add_test(ops, get_with_a_malformed_fingerprint_is_einval);
	tcase_add_test(ops, get_of_a_corrupt_chunk_fails_naming_it_and_marks_bad);
	tcase_add_test(ops, get_yields_only_verified_elements_before_corruption);
	tcase_add_test(ops, get_of_a_fifo_chunk_fails_at_once_and_cache_recomputes);
	tcase_add_test(ops, get_threads_share_one_chunk_in_written_order);
	tcase_add_test(ops, get_of_a_damaged_record_mid_chunk_yields_the_records_before_it);
	tcase_add_test(ops, get_of_a_cold_chunk_with_threads_reads_it_in_file_order);
	tcase_add_test(ops, get_of_a_cold_damaged_first_record_yields_nothing);
	tcase_add_test(ops, get_split_units_are_the_chunks);
	tcase_add_test(ops, get_reads_only_its_split_ranges_in_order);
	tcase_add_test(ops, get_destroyed_midway_stops_its_readers);
	tcase_add_test(ops, cache_first_pass_computes_and_second_reads);
	tcase_add_test(ops, cache_hit_bytes_count_what_is_read_from_a_cache);
	tcase_add_test(ops, cache_second_pass_yields_the_cached_data);
	tcase_add_test(ops, cache_cut_short_leaves_no_cache);
	tcase_add_test(ops, cache_under_repeat_fills_then_reads);
	tcase_add_test(ops, cache_recomputes_after_a_corrupt_chunk);
	tcase_add_test(ops, cache_recomputes_after_a_damaged_manifest);
	tcase_add_test(ops, named_components_survive_put_then_get);
	tcase_add_test(ops, get_spec_mismatch_is_refused_at_build);
	tcase_add_test(ops, get_of_a_cache_missing_at_build_is_unknown_then_named);
	tcase_add_test(ops, get_of_a_manifest_without_names_reads_unnamed);
	tcase_add_test(ops, get_build_gives_up_on_an_s3_root_that_does_not_answer);

	/* Real dispatcher and worker processes. */
	tcase_set_timeout(svc_tc, 120);
	tcase_add_test(svc_tc, service_names_elements_the_client_could_not_name_at_build);
	tcase_add_test(svc_tc, service_names_stitched_batches_the_client_could_not_name);

	tcase_set_timeout(cli_tc, 60);
	tcase_add_test(cli_tc, cli_cache_help_lists_the_commands);
	tcase_add_test(cli_tc, cli_head_and_explain_of_a_named_cache);
	tcase_add_test(cli_tc, cli_cache_usage_errors_exit_2);
	tcase_add_test(cli_tc, cli_cache_ls_lists_fingerprint_state_and_pipeline);
	tcase_add_test(cli_tc, cli_cache_ls_json_is_one_array);
	tcase_add_test(cli_tc, cli_cache_ls_of_a_missing_root_exits_1);
	tcase_add_test(cli_tc, cli_cache_verify_reports_ok_and_corruption);
	tcase_add_test(cli_tc, cli_cache_verify_refuses_a_fifo_chunk);
	tcase_add_test(cli_tc, cli_cache_rm_removes_by_fingerprint_or_prefix);
	tcase_add_test(cli_tc, cli_cache_gc_evicts_down_to_max_bytes);
	tcase_add_test(cli_tc, cli_cache_probe_reports_read_rates);

	tcase_set_timeout(harsh, 120);
	tcase_add_test(harsh, crash_killed_writer_never_leaves_a_bad_final_file);
	tcase_add_test(harsh, corruption_is_always_detected_and_recomputed);
	tcase_add_test(harsh, gc_spares_a_cache_being_read_and_removes_it_after);

	suite_add_tcase(s, ops);
	suite_add_tcase(s, cli_tc);
	suite_add_tcase(s, harsh);
	suite_add_tcase(s, svc_tc);
	return s;
}
