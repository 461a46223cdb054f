/*
 * check_resume.c - resumable iteration on the plain executor and through
 * the service (cachew_iterator_save / cachew_iterator_restore, docs/design.md
 * "Saving and restoring a position"): for every operator that holds state, a run cut
 * at k elements, saved, destroyed and restored yields exactly the rest of
 * the uninterrupted run (element for element where the run is
 * deterministic, the same multiset where it is not); saving leaves the
 * iterator as it was; a state crosses processes through the CLI; a damaged
 * or foreign state is refused with a message, never a crash.
 */
#include "cwt.h"

#include "../src/exec/exec_state.h"
#include "../src/tools/gen.h"

#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------- */

typedef struct hashes {
	uint64_t *v;
	size_t n, cap;
} hashes;

static void
hashes_push(hashes *h, uint64_t x)
{
	if (h->n == h->cap) {
		h->cap = h->cap != 0 ? 2 * h->cap : 64;
		h->v = realloc(h->v, h->cap * sizeof(*h->v));
		ck_assert_ptr_nonnull(h->v);
	}
	h->v[h->n++] = x;
}

static cachew_dataset *
parse(const char *pipeline)
{
	return cwt_parse(pipeline);
}

/* Options of a plain-executor run with a fixed seed and `threads`. */
static cachew_options *
local_opts(int64_t seed, int threads)
{
	cachew_options *o = cwt_opts_at(seed, 0, "local");

	if (threads > 0)
		ck_assert_int_eq(cachew_options_set_int(o, "threads", threads),
		    CACHEW_OK);
	return o;
}

/* Pulls up to `count` elements (SIZE_MAX: to the end) into h; returns the
 * code that stopped it (CACHEW_OK when count was reached). */
static cachew_err
pull(cachew_iterator *it, size_t count, hashes *h)
{
	cachew_element *e;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < count; i++) {
		rv = cachew_iterator_next(it, &e);
		if (rv != CACHEW_OK)
			return rv;
		hashes_push(h, cachew_element_hash(e));
		cachew_element_release(e);
	}
	return rv;
}

static hashes
full_run(cachew_dataset *ds, const cachew_options *o)
{
	cachew_iterator *it = NULL;
	hashes h = {0};
	cachew_err rv;

	ck_assert_msg(cachew_iterator_create(&it, ds, o) == CACHEW_OK, "%s",
	    cachew_errmsg());
	rv = pull(it, SIZE_MAX, &h);
	ck_assert_msg(rv == CACHEW_EOF, "run: %s", cachew_iterator_errmsg(it));
	cachew_iterator_destroy(it);
	return h;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static void
assert_same_run(const char *what, hashes *want, hashes *got, bool sorted)
{
	ck_assert_msg(got->n == want->n, "%s: %zu elements, the full run has %zu",
	    what, got->n, want->n);
	if (sorted) {
		qsort(want->v, want->n, sizeof(uint64_t), cmp_u64);
		qsort(got->v, got->n, sizeof(uint64_t), cmp_u64);
	}
	for (size_t i = 0; i < want->n; i++)
		ck_assert_msg(got->v[i] == want->v[i],
		    "%s: element %zu differs from the full run's", what, i);
}

static void
save_state(cachew_iterator *it, void **state, size_t *len)
{
	cachew_err rv = cachew_iterator_save(it, state, len);
	ck_assert_msg(rv == CACHEW_OK, "save: %s", cachew_errmsg());
	ck_assert_uint_gt(*len, 0);
}

/*
 * Cuts the run of ds at k: iterates k, saves, checks that the saved
 * iterator still runs to the same end (save is non-destructive), then
 * restores (with ro) into a new iterator and checks that the k elements
 * and the rest make the full run.
 */
static void
check_cut(const char *pipeline, cachew_dataset *ds, cachew_options *so,
    cachew_options *ro, size_t k, bool sorted)
{
	cachew_iterator *it = NULL, *back = NULL;
	hashes want = full_run(ds, so), first = {0}, cont = {0};
	char what[160];
	void *state = NULL;
	size_t len = 0;
	cachew_err rv;

	snprintf(what, sizeof(what), "%s cut at %zu", pipeline, k);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, so), CACHEW_OK);
	rv = pull(it, k, &first);
	ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EOF, "%s: %s", what,
	    cachew_iterator_errmsg(it));
	save_state(it, &state, &len);
	/* The saved iterator goes on as if nothing happened. */
	for (size_t i = 0; i < first.n; i++)
		hashes_push(&cont, first.v[i]);
	ck_assert_int_eq(pull(it, SIZE_MAX, &cont), CACHEW_EOF);
	assert_same_run(what, &want, &cont, sorted);
	cachew_iterator_destroy(it);

	rv = cachew_iterator_restore(&back, ds, ro, state, len);
	ck_assert_msg(rv == CACHEW_OK, "%s: restore: %s", what,
	    cachew_errmsg());
	rv = pull(back, SIZE_MAX, &first);
	ck_assert_msg(rv == CACHEW_EOF, "%s: after restore: %s", what,
	    cachew_iterator_errmsg(back));
	cachew_iterator_destroy(back);
	free(want.v);
	want = full_run(ds, so);
	assert_same_run(what, &want, &first, sorted);
	free(state);
	free(want.v);
	free(first.v);
	free(cont.v);
}

/* check_cut at 0, 1, the middle, `boundary` (an epoch or batch edge), the
 * last element and the end, with threads 1 and 2 (saved with one, restored
 * with the other too: threads do not change the data). */
static void
check_pipeline_at(const char *pipeline, size_t boundary, bool sorted)
{
	cachew_dataset *ds = parse(pipeline);
	cachew_options *o1 = local_opts(7, 1), *o2 = local_opts(7, 2);
	hashes h = full_run(ds, o1);
	size_t n = h.n;
	size_t ks[] = {0, 1, n / 2, boundary, n > 0 ? n - 1 : 0, n};

	free(h.v);
	ck_assert_msg(n > 2, "%s: %zu elements, too few to cut", pipeline, n);
	for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
		size_t k = ks[i] <= n ? ks[i] : n;
		check_cut(pipeline, ds, o1, o1, k, sorted);
		check_cut(pipeline, ds, o2, o2, k, sorted);
	}
	check_cut(pipeline, ds, o2, o1, n / 3, sorted);
	check_cut(pipeline, ds, o1, o2, n / 3, sorted);
	cachew_options_destroy(o1);
	cachew_options_destroy(o2);
	cachew_dataset_release(ds);
}

static void
check_pipeline(const char *pipeline, size_t boundary)
{
	check_pipeline_at(pipeline, boundary, false);
}

/* Text files text-*.txt (40 lines in 3 files) in a fresh directory. */
static char *
text_dir(void)
{
	char *dir = cwt_tmpdir(), err[256];
	cwi_gen_text_config cfg = {.out_dir = dir, .lines = 40, .files = 3,
	    .seed = 5};

	ck_assert_msg(cwi_gen_text(&cfg, NULL, err, sizeof(err)) == CACHEW_OK,
	    "%s", err);
	return dir;
}

/* ImageNet-like TFRecord shards (12 small images in 3 shards). */
static char *
image_dir(void)
{
	char *dir = cwt_tmpdir(), err[256];
	cwi_gen_imagenet_config cfg = {.out_dir = dir, .images = 12,
	    .shards = 3, .seed = 3, .width = 48, .height = 32, .quality = 80};

	ck_assert_msg(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)) ==
			  CACHEW_OK, "%s", err);
	return dir;
}

/* A random filter: keeps an element when its draw is odd (the draw comes
 * from the element's index, which a state must carry). */
static cachew_err
keep_odd_draw(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	(void)in;
	*keep = (int)(cachew_op_ctx_random(ctx) & 1);
	return CACHEW_OK;
}

static const cachew_op_def keep_odd_draw_def = {
    .version = CACHEW_OP_DEF_VERSION, .name = "resume_test_keep",
    .kind = CACHEW_OP_FILTER, .flags = CACHEW_OP_RANDOM,
    .filter = keep_odd_draw};

static void
register_filter(void)
{
	cachew_err rv = cachew_op_register(&keep_odd_draw_def);
	ck_assert(rv == CACHEW_OK || rv == CACHEW_EEXIST);
}

/* ---- sources and position operators ------------------------------------------ */

START_TEST(range_and_literals_resume)
{
	check_pipeline("range(3, 60, 4)", 7);
	check_pipeline("range(50, 10, -3)", 5);
	check_pipeline("from_list([1, 2, 3, 4, 5, 6, 7])", 3);
	check_pipeline("from_tensors((1, 2.5)) | repeat(4)", 2);
}
END_TEST

START_TEST(repeat_take_skip_shard_enumerate_resume)
{
	check_pipeline("range(5) | repeat(4)", 5);
	check_pipeline("range(40) | skip(7) | take(20)", 10);
	check_pipeline("range(15) | take(-1) | skip(2)", 3);
	check_pipeline("range(50) | shard(4, 1)", 6);
	check_pipeline("range(20) | enumerate(start=100)", 10);
	check_pipeline("range(6) | repeat(2) | repeat(2)", 6);
}
END_TEST

START_TEST(shuffle_resume)
{
	/* The buffer, its generator and each epoch's reshuffle. */
	check_pipeline("range(60) | shuffle(16)", 16);
	check_pipeline("range(12) | shuffle(5) | repeat(3)", 12);
	check_pipeline("range(12) | shuffle(5, reshuffle_each_iteration=false)"
		       " | repeat(3)", 12);
	check_pipeline("range(30) | shuffle(100)", 29);
}
END_TEST

START_TEST(batch_unbatch_resume)
{
	check_pipeline("range(23) | batch(5)", 2);
	check_pipeline("range(23) | batch(5, drop_remainder=true)", 2);
	check_pipeline("range(23) | batch(4) | unbatch", 8);
	check_pipeline("range(9) | batch(2) | padded_batch(2)", 2);
	check_pipeline("range(17) | map(add, value=1) | batch(3) | repeat(2)", 6);
}
END_TEST

START_TEST(zip_concatenate_resume)
{
	check_pipeline("zip(range(12), range(100, 140, 2))", 6);
	check_pipeline("concatenate(range(6), range(20, 27))", 6);
	check_pipeline("concatenate(range(4) | shuffle(3), range(8) | "
		       "batch(3) | unbatch)", 4);
}
END_TEST

START_TEST(random_map_and_filter_resume)
{
	/* A random function draws from (seed, node, epoch, index). */
	check_pipeline("range(30) | map(uniform) | repeat(2)", 30);
	check_pipeline("range(40) | map(uniform, parallel=3)", 20);
	check_pipeline("range(40) | map(add, value=2, parallel=2) | "
		       "map(uniform, parallel=auto)", 11);
	register_filter();
	check_pipeline("range(60) | filter(resume_test_keep) | repeat(2)", 9);
}
END_TEST

START_TEST(parallel_map_and_prefetch_resume)
{
	check_pipeline("range(300) | map(add, value=1, parallel=3) | "
		       "prefetch(8)", 100);
	check_pipeline("range(200) | prefetch(auto) | map(uniform, "
		       "parallel=auto) | prefetch(2)", 64);
	/* Unordered: the batch before the map, so that a reordering moves
	 * whole batches and the sorted hashes compare (batched after it, a
	 * batch's members changed with the order: failed under ASan's load). */
	check_pipeline_at("range(150) | batch(4) | map(add, parallel=4, "
			  "deterministic=false) | prefetch(3)",
	    10, true);
}
END_TEST

START_TEST(file_sources_and_interleave_resume)
{
	char *dir = text_dir(), *p;

	p = cwt_fmt("text_lines(files=\"%s/*.txt\")", dir);
	check_pipeline(p, 13);
	free(p);
	/* Blocks of 64 bytes: lines span them. */
	p = cwt_fmt("text_lines(files=\"%s/*.txt\", buffer_size=64)", dir);
	check_pipeline(p, 13);
	free(p);
	p = cwt_fmt("list_files(\"%s/*.txt\") | repeat(2)", dir);
	check_pipeline(p, 3);
	free(p);
	p = cwt_fmt("list_files(\"%s/*.txt\") | flat_map(text_lines)", dir);
	check_pipeline(p, 14);
	free(p);
	p = cwt_fmt("list_files(\"%s/*.txt\") | interleave(text_lines, cycle=2, "
		"block=3)", dir);
	check_pipeline(p, 9);
	free(p);
	p = cwt_fmt("list_files(\"%s/*.txt\") | interleave(text_lines, cycle=3, "
		"block=2, parallel=2) | prefetch(4)", dir);
	check_pipeline(p, 9);
	free(p);
	p = cwt_fmt("list_files(\"%s/*.txt\") | interleave(text_lines, cycle=3, "
		"parallel=3, deterministic=false)", dir);
	check_pipeline_at(p, 9, true);
	free(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* Runs pipeline p to its end (to write a file). */
static void
run_through(const char *p)
{
	cachew_options *o = local_opts(1, 1);
	cachew_dataset *ds = parse(p);
	hashes h = full_run(ds, o);

	free(h.v);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}

START_TEST(record_files_resume_at_their_offsets)
{
	char *dir = cwt_tmpdir(), path[600], *p;
	uint8_t body[3 + 20 * 4 + 2];

	/* Fixed-length: a 3-byte header, 20 records of 4, a 2-byte footer;
	 * restore seeks to a record boundary past the header. */
	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = (uint8_t)(i * 7 + 1);
	snprintf(path, sizeof(path), "%s/recs.bin", dir);
	cwt_write_file(path, body, sizeof(body));
	p = cwt_fmt("fixed_length_records(files=\"%s\", record_bytes=4, "
		    "header_bytes=3, footer_bytes=2, buffer_size=8) | "
		    "repeat(2)", path);
	check_pipeline(p, 20);
	free(p);
	/* TFRecord, plain (seek) and gzip (read past). */
	p = cwt_fmt("from_list([\"a\", \"bb\", \"ccc\", \"dddd\", \"e\", "
		    "\"ff\", \"g\"]) | tfrecord_write(\"%s/plain.tfrecord\")",
	    dir);
	run_through(p);
	free(p);
	p = cwt_fmt("from_list([\"a\", \"bb\", \"ccc\", \"dddd\", \"e\", "
		    "\"ff\", \"g\"]) | tfrecord_write(\"%s/z.tfrecord.gz\", "
		    "compression=\"gzip\")", dir);
	run_through(p);
	free(p);
	p = cwt_fmt("tfrecord(files=[\"%s/plain.tfrecord\", "
		    "\"%s/plain.tfrecord\"], buffer_size=16)", dir, dir);
	check_pipeline(p, 7);
	free(p);
	p = cwt_fmt("tfrecord(files=\"%s/z.tfrecord.gz\", compression=\"gzip\")"
		    " | repeat(2)", dir);
	check_pipeline(p, 7);
	free(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* The W2 pipeline's shape on generated ImageNet-like shards. */
static char *
w2_pipeline(const char *dir, int parallel)
{
	return cwt_fmt("list_files(\"%s/*.tfrecord\") | interleave(tfrecord, "
		   "cycle=2, parallel=%d) | shuffle(5) | parse_example("
		   "image=\"image/encoded:bytes\", "
		   "label=\"image/class/label:i64\") | random_resized_crop("
		   "size=16, parallel=%d) | flip_left_right | batch(3) | "
		   "prefetch(2)",
	    dir, parallel, parallel);
}

START_TEST(w2_pipeline_resumes)
{
	char *dir = image_dir(), *p;

	/* Sequences reopened at their offsets (cut where they are open). */
	p = cwt_fmt("list_files(\"%s/*.tfrecord\") | interleave(tfrecord, "
		    "cycle=2, block=3)", dir);
	check_pipeline(p, 3);
	free(p);
	p = cwt_fmt("list_files(\"%s/*.tfrecord\", shuffle=false) | "
		    "flat_map(tfrecord)", dir);
	check_pipeline(p, 4);
	free(p);
	p = w2_pipeline(dir, 1);
	check_pipeline(p, 2);
	free(p);
	p = w2_pipeline(dir, 2);
	check_pipeline(p, 1);
	free(p);
	p = cwt_fmt("tfrecord(files=\"%s/*.tfrecord\") | repeat(2) | batch(5)",
	    dir);
	check_pipeline(p, 2);
	free(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(save_twice_and_restore_the_later)
{
	cachew_dataset *ds = parse("range(80) | shuffle(9) | map(add, "
				   "parallel=2) | batch(3) | prefetch(4)");
	cachew_options *o = local_opts(11, 2);
	cachew_iterator *it = NULL, *back = NULL;
	hashes want = full_run(ds, o), got = {0};
	void *s1 = NULL, *s2 = NULL;
	size_t l1 = 0, l2 = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	ck_assert_int_eq(pull(it, 4, &got), CACHEW_OK);
	save_state(it, &s1, &l1);
	ck_assert_int_eq(pull(it, 5, &got), CACHEW_OK);
	save_state(it, &s2, &l2);
	cachew_iterator_destroy(it);
	ck_assert_int_eq(cachew_iterator_restore(&back, ds, o, s2, l2),
	    CACHEW_OK);
	ck_assert_int_eq(pull(back, SIZE_MAX, &got), CACHEW_EOF);
	cachew_iterator_destroy(back);
	assert_same_run("saved twice", &want, &got, false);
	free(s1);
	free(s2);
	free(want.v);
	free(got.v);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(state_of_an_ended_iterator_restores_to_the_end)
{
	cachew_dataset *ds = parse("range(5) | batch(2)");
	cachew_options *o = local_opts(1, 1);
	cachew_iterator *it = NULL, *back = NULL;
	cachew_element *e = NULL;
	hashes h = {0};
	void *s = NULL;
	size_t len = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	ck_assert_int_eq(pull(it, SIZE_MAX, &h), CACHEW_EOF);
	save_state(it, &s, &len);
	cachew_iterator_destroy(it);
	ck_assert_int_eq(cachew_iterator_restore(&back, ds, o, s, len),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_next(back, &e), CACHEW_EOF);
	cachew_iterator_destroy(back);
	free(s);
	free(h.v);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
}
END_TEST

/* A lease of a worker (the service's unit of work) saves and restores
 * through the exec-level calls, with its unit cursor. */
static cachew_iterator *
lease_of(cachew_dataset *ds, const cwi_unit_range *r, size_t n)
{
	cachew_iterator *it = NULL;
	const cwi_node *src = ds;

	while (src->ninputs > 0)
		src = src->inputs[0];
	ck_assert_msg(cwi_iterator_create_lease(&it, ds, NULL, src, r, n, 9) ==
			  CACHEW_OK, "%s", cachew_errmsg());
	return it;
}

START_TEST(a_lease_resumes_through_the_exec_calls)
{
	static const cwi_unit_range r[] = {{10, 30}, {50, 61}};
	cachew_dataset *ds = parse("range(100) | shuffle(4) | batch(3)");
	cachew_iterator *it = lease_of(ds, r, 2), *back;
	hashes want = {0}, got = {0};
	cwi_state_writer w;
	cwi_state_reader rd;

	ck_assert_int_eq(pull(it, SIZE_MAX, &want), CACHEW_EOF);
	cachew_iterator_destroy(it);
	ck_assert_uint_eq(want.n, 11); /* 31 elements */
	it = lease_of(ds, r, 2);
	ck_assert_int_eq(pull(it, 4, &got), CACHEW_OK);
	cwi_strbuf_init(&w.sb);
	ck_assert_int_eq(cwi_exec_iterator_save(it, &w), CACHEW_OK);
	cachew_iterator_destroy(it);
	back = lease_of(ds, r, 2);
	cwi_sr_init(&rd, w.sb.data, w.sb.len);
	ck_assert_msg(cwi_exec_iterator_restore(back, &rd) == CACHEW_OK, "%s",
	    rd.errmsg);
	ck_assert_uint_eq(rd.c.pos, w.sb.len);
	ck_assert_int_eq(pull(back, SIZE_MAX, &got), CACHEW_EOF);
	assert_same_run("lease", &want, &got, false);
	cachew_iterator_destroy(back);
	cwi_strbuf_free(&w.sb);
	free(want.v);
	free(got.v);
	cachew_dataset_release(ds);
}
END_TEST

/* Saves a run of `saved` cut at k and restores it into `restored`, a
 * pipeline that differs only in what changes speed. */
static void
check_across(const char *saved, const char *restored, size_t k)
{
	cachew_dataset *a = parse(saved), *b = parse(restored);
	cachew_options *o = local_opts(5, 2);
	cachew_iterator *it = NULL, *back = NULL;
	hashes want = full_run(a, o), got = {0};
	void *s = NULL;
	size_t len = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, a, o), CACHEW_OK);
	ck_assert_int_eq(pull(it, k, &got), CACHEW_OK);
	save_state(it, &s, &len);
	cachew_iterator_destroy(it);
	ck_assert_msg(cachew_iterator_restore(&back, b, o, s, len) == CACHEW_OK,
	    "%s: %s", restored, cachew_errmsg());
	ck_assert_int_eq(pull(back, SIZE_MAX, &got), CACHEW_EOF);
	cachew_iterator_destroy(back);
	assert_same_run(restored, &want, &got, false);
	free(s);
	free(want.v);
	free(got.v);
	cachew_options_destroy(o);
	cachew_dataset_release(a);
	cachew_dataset_release(b);
}

START_TEST(parallelism_and_buffers_may_change_across_a_restore)
{
	char *dir = text_dir(), *a, *b;

	check_across("range(200) | map(add, parallel=4) | prefetch(16)",
	    "range(200) | map(add, parallel=1) | prefetch(1)", 9);
	check_across("range(200) | map(uniform, parallel=1) | batch(7)",
	    "range(200) | map(uniform, parallel=3) | batch(7)", 5);
	a = cwt_fmt("list_files(\"%s/*.txt\") | interleave(text_lines, "
		    "cycle=3, block=2, parallel=3) | prefetch(auto)", dir);
	b = cwt_fmt("list_files(\"%s/*.txt\") | interleave(text_lines, "
		    "cycle=3, block=2) | prefetch(2)", dir);
	check_across(a, b, 7);
	check_across(b, a, 7);
	free(a);
	free(b);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------ */

/* A state of `pipeline` saved with opts after k elements. */
static void
state_of(const char *pipeline, const cachew_options *o, size_t k, void **s,
    size_t *len)
{
	cachew_dataset *ds = parse(pipeline);
	cachew_iterator *it = NULL;
	hashes h = {0};

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	ck_assert_int_eq(pull(it, k, &h), CACHEW_OK);
	save_state(it, s, len);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	free(h.v);
}

static void
assert_refused(const char *pipeline, const cachew_options *o, const void *s,
    size_t len, cachew_err want, const char *needle)
{
	cachew_dataset *ds = parse(pipeline);
	cachew_iterator *it = NULL;
	cachew_err rv = cachew_iterator_restore(&it, ds, o, s, len);

	ck_assert_msg(rv == want, "restore gave %s (%s), expected %s",
	    cachew_strerror(rv), cachew_errmsg(), cachew_strerror(want));
	ck_assert_ptr_null(it);
	ck_assert_msg(strstr(cachew_errmsg(), needle) != NULL,
	    "message \"%s\" does not say \"%s\"", cachew_errmsg(), needle);
	cachew_dataset_release(ds);
}

START_TEST(state_of_another_pipeline_seed_or_epoch_is_refused)
{
	const char *p = "range(40) | shuffle(8) | batch(4)";
	cachew_options *o = local_opts(3, 1), *other = local_opts(4, 1);
	cachew_options *later = cwt_opts_at(3, 1, "local");
	void *s = NULL;
	size_t len = 0;

	state_of(p, o, 3, &s, &len);
	assert_refused("range(40) | shuffle(8) | batch(5)", o, s, len,
	    CACHEW_EINVAL, "another pipeline");
	assert_refused(p, other, s, len, CACHEW_EINVAL, "seed differs");
	assert_refused(p, later, s, len, CACHEW_EINVAL, "epoch differs");
	ck_assert_int_eq(cachew_options_set_bool(o, "deterministic", false),
	    CACHEW_OK);
	assert_refused(p, o, s, len, CACHEW_EINVAL, "deterministic differs");
	free(s);
	cachew_options_destroy(o);
	cachew_options_destroy(other);
	cachew_options_destroy(later);
}
END_TEST

START_TEST(unset_seed_takes_the_saved_one)
{
	const char *p = "range(40) | shuffle(40)";
	cachew_dataset *ds = parse(p);
	cachew_options *random = cwt_opts_at(-1, 0, "local");
	cachew_iterator *it = NULL, *back = NULL;
	hashes first = {0}, rest = {0};
	void *s = NULL;
	size_t len = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, random), CACHEW_OK);
	ck_assert_int_eq(pull(it, 10, &first), CACHEW_OK);
	save_state(it, &s, &len);
	/* What the saved iterator would have yielded next. */
	ck_assert_int_eq(pull(it, SIZE_MAX, &rest), CACHEW_EOF);
	cachew_iterator_destroy(it);
	ck_assert_int_eq(cachew_iterator_restore(&back, ds, random, s, len),
	    CACHEW_OK);
	free(first.v);
	first = (hashes){0};
	ck_assert_int_eq(pull(back, SIZE_MAX, &first), CACHEW_EOF);
	assert_same_run("random seed", &rest, &first, false);
	cachew_iterator_destroy(back);
	free(s);
	free(first.v);
	free(rest.v);
	cachew_options_destroy(random);
	cachew_dataset_release(ds);
}
END_TEST

/* ---- through a service ---------------------------------------------------- */

static char *cachew_run(const char *dir, int *status, bool err, ...);
static uint64_t json_u64(const char *json, const char *key, int base);

/* Options of a service run: seed 7, the service at `service`. */
static cachew_options *
service_opts(const char *service)
{
	return cwt_opts_at(7, 0, service);
}

/* Appends the int64 values of every element's first component (a batch:
 * all of them) to h: a run's data whatever the batches' composition. */
static cachew_err
pull_values(cachew_iterator *it, size_t count, hashes *h, size_t *partial,
    size_t batch)
{
	cachew_element *e;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 0; i < count; i++) {
		rv = cachew_iterator_next(it, &e);
		if (rv != CACHEW_OK)
			return rv;
		const cachew_tensor *t = cachew_element_component(e, 0);
		const int64_t *v = cachew_tensor_data(t);
		size_t n = (size_t)cachew_tensor_numel(t);
		if (batch > 0 && n != batch)
			(*partial)++;
		for (size_t k = 0; k < n; k++)
			hashes_push(h, (uint64_t)v[k]);
		cachew_element_release(e);
	}
	return rv;
}

/*
 * Runs `pipeline` (values v + add of range(n), batched by `batch` or not)
 * on the service at `service`, cut at k: saves, destroys the iterator,
 * restores it in a new one and reads the rest. The two parts hold every
 * value of the epoch once, and every batch is full but one at most (the
 * stitched tails went with the position).
 */
static void
check_service_cut(const char *pipeline, const char *service, size_t k,
    int64_t n, int64_t add, size_t batch)
{
	cachew_dataset *ds = parse(pipeline);
	cachew_options *o = service_opts(service);
	cachew_iterator *it = NULL, *back = NULL;
	hashes h = {0};
	size_t partial = 0;
	void *state = NULL;
	size_t len = 0;
	cachew_err rv;

	ck_assert_msg(cachew_iterator_create(&it, ds, o) == CACHEW_OK, "%s",
	    cachew_errmsg());
	rv = pull_values(it, k, &h, &partial, batch);
	ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EOF, "%s at %zu: %s",
	    pipeline, k, cachew_iterator_errmsg(it));
	save_state(it, &state, &len);
	cachew_iterator_destroy(it);
	rv = cachew_iterator_restore(&back, ds, o, state, len);
	ck_assert_msg(rv == CACHEW_OK, "%s at %zu: restore: %s", pipeline, k,
	    cachew_errmsg());
	rv = pull_values(back, SIZE_MAX, &h, &partial, batch);
	ck_assert_msg(rv == CACHEW_EOF, "%s at %zu: after restore: %s",
	    pipeline, k, cachew_iterator_errmsg(back));
	cachew_iterator_destroy(back);
	qsort(h.v, h.n, sizeof(uint64_t), cmp_u64);
	ck_assert_msg(h.n == (size_t)n, "%s cut at %zu: %zu values, the epoch "
	    "has %lld", pipeline, k, h.n, (long long)n);
	for (int64_t i = 0; i < n; i++)
		ck_assert_msg(h.v[i] == (uint64_t)(i + add), "%s cut at %zu: "
		    "value %lld missing or repeated", pipeline, k,
		    (long long)(i + add));
	ck_assert_msg(partial <= 1, "%s cut at %zu: %zu partial batches",
	    pipeline, k, partial);
	free(h.v);
	free(state);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
}

/* The embedded service (one inline worker) yields the plain executor's run:
 * a cut position restored there continues it element for element, the
 * client part's operators (take, skip, enumerate) included. */
START_TEST(service_positions_resume_on_the_embedded_service)
{
	static const char *const pipelines[] = {
	    "range(300) | shuffle(40) | map(add, value=1) | batch(7)",
	    "range(100) | batch(6) | take(11)",
	    "range(60) | map(add, value=2) | skip(7) | enumerate",
	    "range(90) | map(uniform, parallel=2) | batch(4) | prefetch(3)",
	};
	cachew_options *emb = service_opts("embedded");

	for (size_t i = 0; i < sizeof(pipelines) / sizeof(*pipelines); i++) {
		cachew_dataset *ds = parse(pipelines[i]);
		hashes h = full_run(ds, emb);
		size_t ks[] = {0, 1, h.n / 2, h.n - 1, h.n};
		for (size_t j = 0; j < sizeof(ks) / sizeof(*ks); j++)
			check_cut(pipelines[i], ds, emb, emb, ks[j], false);
		free(h.v);
		cachew_dataset_release(ds);
	}
	/* A client-side repeat at a later epoch: each pass is its own job,
	 * whose epoch is derived from the option and the pass (64 bits). */
	cachew_options *later = cwt_opts_at(7, 3, "embedded");
	const char *rp = "range(30) | map(add, value=1) | batch(4) | repeat(2)";
	cachew_dataset *rds = parse(rp);
	size_t rks[] = {0, 3, 8, 11, 16};
	for (size_t j = 0; j < sizeof(rks) / sizeof(*rks); j++)
		check_cut(rp, rds, later, later, rks[j], false);
	cachew_dataset_release(rds);
	cachew_options_destroy(later);
	/* A file source, read by files (its split units). */
	char *dir = text_dir(), files[700];
	snprintf(files, sizeof(files), "list_files(\"%s/text-*.txt\") | "
	    "interleave(text_lines, cycle=2) | batch(3)", dir);
	cachew_dataset *fds = parse(files);
	hashes fh = full_run(fds, emb);
	size_t fks[] = {0, 1, fh.n / 2, fh.n};
	for (size_t j = 0; j < sizeof(fks) / sizeof(*fks); j++)
		check_cut(files, fds, emb, emb, fks[j], false);
	free(fh.v);
	cachew_dataset_release(fds);
	cwt_rmtree(dir);
	free(dir);
	/* Several embedded workers: every value once, batches stitched. */
	check_service_cut("range(4000) | map(add, value=1) | batch(16)",
	    "embedded:2", 100, 4000, 1, 16);
	cachew_options_destroy(emb);
}
END_TEST

/* Real dispatcher and worker processes: positions cut anywhere resume in a
 * new iterator, in this process and (through the CLI) in another. */
START_TEST(service_positions_resume_through_a_cluster)
{
	cwt_cluster c;
	char service[300], state[600], *full, *first, *rest;
	const char *p = "range(5000) | map(add, value=1)";
	size_t ks[] = {0, 1, 90, 2500, 4999, 5000};
	int st = -1;

	cwt_cluster_start(&c, 2);
	snprintf(service, sizeof(service), "service=%s", c.dispatcher.url);
	for (size_t i = 0; i < sizeof(ks) / sizeof(*ks); i++)
		check_service_cut(p, c.dispatcher.url, ks[i], 5000, 1, 0);
	check_service_cut("range(3000) | map(add, value=5) | batch(16)",
	    c.dispatcher.url, 40, 3000, 5, 16);
	/* take keeps the plain run's first elements: ordered delivery's
	 * head and held groups go with the position. */
	check_service_cut("range(3000) | map(add, value=0) | take(1234)",
	    c.dispatcher.url, 61, 1234, 0, 0);
	/* Saved by one process, resumed by another: the element hashes of the
	 * halves add up to the whole run's (the plain executor's). */
	snprintf(state, sizeof(state), "%s/state", c.dir);
	full = cachew_run(c.dir, &st, false, p, NULL);
	ck_assert_int_eq(st, 0);
	first = cachew_run(c.dir, &st, false, "--set", service, "--save-at",
	    "777", "--state", state, p, NULL);
	ck_assert_msg(st == 0, "--save-at: exit %d, %s", st, first);
	rest = cachew_run(c.dir, &st, false, "--set", service, "--resume",
	    state, p, NULL);
	ck_assert_msg(st == 0, "--resume: exit %d, %s", st, rest);
	ck_assert_uint_eq(json_u64(first, "\"elements\":", 10), 777);
	ck_assert_uint_eq(json_u64(rest, "\"elements\":", 10), 5000 - 777);
	ck_assert_uint_eq(json_u64(first, "\"digest\":", 16) +
			      json_u64(rest, "\"digest\":", 16),
	    json_u64(full, "\"digest\":", 16));
	free(full);
	free(first);
	free(rest);
	cwt_cluster_stop(&c);
}
END_TEST

/*
 * The client tail (a remote service's client normalizes): range(200) of
 * u8 in batches of 16, normalized to x / 255; cut at k, saved with
 * client_tail `saved` on service `from`, restored with `restored` on
 * `to`. A position whose client part holds the normalize and one whose
 * workers ran it continue either way: every value once, one partial
 * batch at most.
 */
static void
check_tail_cut(const char *from, const char *saved, const char *to,
    const char *restored, size_t k)
{
	const char *p = "range(200, output_type=\"u8\") | batch(16) | "
			"normalize(mean=[0.0], std=[1.0])";
	cachew_dataset *ds = parse(p);
	cachew_options *so = service_opts(from), *ro = service_opts(to);
	cachew_iterator *it = NULL, *back = NULL;
	cachew_element *e;
	unsigned char seen[200] = {0};
	size_t len = 0, partial = 0, got = 0;
	void *state = NULL;
	cachew_err rv = CACHEW_OK;

	ck_assert_int_eq(cachew_options_set_str(so, "client_tail", saved),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_str(ro, "client_tail", restored),
	    CACHEW_OK);
	ck_assert_msg(cachew_iterator_create(&it, ds, so) == CACHEW_OK, "%s",
	    cachew_errmsg());
	for (int pass = 0; pass < 2; pass++) {
		cachew_iterator *cur = pass == 0 ? it : back;
		for (size_t i = 0; pass == 1 || i < k; i++) {
			rv = cachew_iterator_next(cur, &e);
			if (rv != CACHEW_OK)
				break;
			const cachew_tensor *t = cachew_element_component(e, 0);
			const float *v = cachew_tensor_data(t);
			size_t n = (size_t)cachew_tensor_numel(t);
			ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_F32);
			partial += n != 16;
			for (size_t j = 0; j < n; j++) {
				long x = lroundf(v[j] * 255.0f);
				ck_assert(x >= 0 && x < 200);
				seen[x]++;
			}
			got += n;
			cachew_element_release(e);
		}
		ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EOF,
		    "%s (%s) -> %s (%s) at %zu: %s", from, saved, to, restored,
		    k, cachew_iterator_errmsg(cur));
		if (pass == 1)
			break;
		save_state(it, &state, &len);
		cachew_iterator_destroy(it);
		rv = cachew_iterator_restore(&back, ds, ro, state, len);
		ck_assert_msg(rv == CACHEW_OK, "%s (%s) -> %s (%s) at %zu: "
		    "restore: %s", from, saved, to, restored, k,
		    cachew_errmsg());
	}
	cachew_iterator_destroy(back);
	ck_assert_int_eq(rv, CACHEW_EOF);
	ck_assert_msg(got == 200 && partial <= 1, "%s (%s) -> %s (%s) at %zu: "
	    "%zu values, %zu partial batches", from, saved, to, restored, k,
	    got, partial);
	for (int x = 0; x < 200; x++)
		ck_assert_msg(seen[x] == 1, "%s (%s) -> %s (%s) at %zu: value "
		    "%d seen %d times", from, saved, to, restored, k, x,
		    seen[x]);
	free(state);
	cachew_options_destroy(so);
	cachew_options_destroy(ro);
	cachew_dataset_release(ds);
}

START_TEST(service_positions_resume_with_the_client_tail_either_side)
{
	cwt_cluster c;
	const char *url;

	cwt_cluster_start(&c, 2);
	url = c.dispatcher.url;
	check_tail_cut(url, "auto", url, "auto", 5);
	check_tail_cut(url, "off", url, "auto", 5);
	check_tail_cut(url, "auto", url, "off", 6);
	check_tail_cut("embedded", "auto", url, "auto", 3);
	check_tail_cut(url, "auto", "embedded", "auto", 7);
	cwt_cluster_stop(&c);
}
END_TEST

/* What cannot resume through a service says why, and a position goes back
 * only where it can continue. */
START_TEST(service_positions_refused_say_why)
{
	cachew_dataset *ds = parse("range(10)");
	cachew_options *shared = service_opts("embedded");
	cachew_options *once = service_opts("embedded");
	cachew_options *emb = service_opts("embedded");
	cachew_options *local = local_opts(7, 1);
	cachew_iterator *it = NULL;
	cachew_element *e = NULL;
	void *s = NULL;
	size_t len = 0;

	ck_assert_int_eq(cachew_options_set_str(shared, "job_name", "team"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_bool(once, "exactly_once", false),
	    CACHEW_OK);
	const cachew_options *refused[] = {shared, once};
	const char *why[] = {"shared job", "not exactly-once"};
	for (size_t i = 0; i < 2; i++) {
		ck_assert_msg(cachew_iterator_create(&it, ds, refused[i]) ==
				  CACHEW_OK, "%s", cachew_errmsg());
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
		ck_assert_int_eq(cachew_iterator_save(it, &s, &len),
		    CACHEW_ENOTSUP);
		ck_assert_msg(strstr(cachew_errmsg(), why[i]) != NULL, "%s",
		    cachew_errmsg());
		/* The iterator goes on. */
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
		cachew_iterator_destroy(it);
	}
	state_of("range(10)", local, 2, &s, &len);
	assert_refused("range(10)", emb, s, len, CACHEW_EINVAL,
	    "saved by the plain executor");
	free(s);
	state_of("range(10)", emb, 2, &s, &len);
	assert_refused("range(10)", local, s, len, CACHEW_EINVAL,
	    "saved through a service");
	assert_refused("range(11)", emb, s, len, CACHEW_EINVAL,
	    "another pipeline");
	free(s);
	cachew_options_destroy(shared);
	cachew_options_destroy(once);
	cachew_options_destroy(emb);
	cachew_options_destroy(local);
	cachew_dataset_release(ds);
}
END_TEST

/* Restores state s of pipeline p and checks that it yields the values
 * [from, to) of range(to) and nothing else. */
static void
assert_rest(const char *p, const cachew_options *o, const void *s,
    size_t len, int64_t from, int64_t to)
{
	cachew_dataset *ds = parse(p);
	cachew_iterator *it = NULL;
	cachew_element *e = NULL;

	ck_assert_msg(cachew_iterator_restore(&it, ds, o, s, len) == CACHEW_OK,
	    "%s: %s", p, cachew_errmsg());
	for (int64_t v = from; v < to; v++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), v);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOF);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}

START_TEST(cache_ops_resume_reading_or_computing)
{
	char *root = cwt_tmpdir(), hex[33];
	char *p = cwt_fmt("range(30) | cache(root=\"%s\")", root), *get;
	cachew_dataset *in = parse("range(30)");
	cachew_options *o = local_opts(1, 1);
	cachew_fingerprint fp;
	void *computing = NULL, *reading = NULL;
	size_t lc = 0, lr = 0;

	cachew_dataset_fingerprint(in, &fp);
	cachew_fingerprint_hex(&fp, hex);
	get = cwt_fmt("cache_get(\"%s\", \"%s\")", root, hex);
	/* Cut while computing: the restored pass yields the rest and writes
	 * no cache (it would lack the first 5). */
	state_of(p, o, 5, &computing, &lc);
	assert_rest(p, o, computing, lc, 5, 30);
	/* The same fingerprint (cache passes data through), another tree. */
	assert_refused("range(30)", o, computing, lc, CACHEW_EINVAL,
	    "another pipeline: expected the state of range, found that of "
	    "cache");
	{
		cachew_dataset *g = parse(get);
		cachew_iterator *it = NULL;
		ck_assert_int_eq(cachew_iterator_create(&it, g, o),
		    CACHEW_ENOENT);
		cachew_dataset_release(g);
	}
	/* A complete pass writes it; the same state now resumes reading. */
	check_pipeline(p, 10);
	assert_rest(p, o, computing, lc, 5, 30);
	state_of(p, o, 12, &reading, &lr);
	check_pipeline(get, 10);
	/* Read to 12, then the cache is gone: recomputed, 12 dropped. */
	cwt_rmtree(root);
	assert_rest(p, o, reading, lr, 12, 30);
	free(computing);
	free(reading);
	free(p);
	free(get);
	cachew_options_destroy(o);
	cachew_dataset_release(in);
	cwt_rmtree(root);
	free(root);
}
END_TEST

START_TEST(tfrecord_write_cannot_save_and_says_why)
{
	char *dir = cwt_tmpdir();
	char *p = cwt_fmt("from_list([\"a\", \"b\", \"c\", \"d\", \"e\", "
		      "\"f\", \"g\", \"h\", \"i\", \"j\"]) | "
		      "tfrecord_write(\"%s/out.tfrecord\")", dir);
	cachew_dataset *ds = parse(p);
	cachew_options *o = local_opts(1, 1);
	cachew_iterator *it = NULL;
	hashes h = {0};
	void *s = NULL;
	size_t len = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	ck_assert_int_eq(pull(it, 3, &h), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_save(it, &s, &len), CACHEW_ENOTSUP);
	ck_assert_msg(strstr(cachew_errmsg(), "tfrecord_write: cannot save") !=
			  NULL, "%s", cachew_errmsg());
	/* The iterator goes on. */
	ck_assert_int_eq(pull(it, SIZE_MAX, &h), CACHEW_EOF);
	ck_assert_uint_eq(h.n, 10);
	cachew_iterator_destroy(it);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
	free(h.v);
	free(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(cache_put_resumes_without_writing)
{
	char *root = cwt_tmpdir();
	char *p = cwt_fmt("range(25) | cache_put(root=\"%s\") | batch(4)", root);

	check_pipeline(p, 3);
	free(p);
	cwt_rmtree(root);
	free(root);
}
END_TEST

/* Restores s (len bytes); when that works, runs the iterator to its end
 * (bounded): a damaged state that still decodes must run safely too. */
static cachew_err
restore_and_drain(cachew_dataset *ds, const cachew_options *o,
    const void *s, size_t len)
{
	cachew_iterator *it = NULL;
	hashes h = {0};
	cachew_err rv = cachew_iterator_restore(&it, ds, o, s, len);

	if (rv != CACHEW_OK) {
		ck_assert_ptr_null(it);
		ck_assert_msg(cachew_errmsg()[0] != '\0',
		    "restore failed (%s) without a message",
		    cachew_strerror(rv));
		return rv;
	}
	(void)pull(it, 100000, &h);
	cachew_iterator_destroy(it);
	free(h.v);
	return CACHEW_OK;
}

START_TEST(damaged_states_give_clear_errors)
{
	const char *p = "range(30) | shuffle(6) | map(add, parallel=2) | "
			"batch(4) | prefetch(3)";
	cachew_dataset *ds = parse(p);
	cachew_options *o = local_opts(9, 2);
	uint8_t *s = NULL, *bad;
	size_t len = 0, refused = 0;

	state_of(p, o, 2, (void **)&s, &len);
	bad = malloc(len);
	ck_assert_ptr_nonnull(bad);
	/* Every truncation is refused. */
	for (size_t cut = 0; cut < len; cut++) {
		cachew_err rv = restore_and_drain(ds, o, s, cut);
		ck_assert_msg(rv != CACHEW_OK, "a state cut to %zu of %zu bytes "
					       "was accepted", cut, len);
	}
	assert_refused(p, o, s, len - 1, CACHEW_ECORRUPT, "iterator state: ");
	/* Bit flips (two bits of every byte): refused, or (in a payload or
	 * a counter) run safely. */
	for (size_t i = 0; i < 2 * len; i++) {
		memcpy(bad, s, len);
		bad[i / 2] ^= (uint8_t)(1u << ((i / 2 + 5 * (i % 2)) % 8));
		refused += restore_and_drain(ds, o, bad, len) != CACHEW_OK;
	}
	ck_assert_uint_ge(refused, len / 4);
	/* Trailing bytes. */
	bad = realloc(bad, len + 1);
	memcpy(bad, s, len);
	bad[len] = 0;
	assert_refused(p, o, bad, len + 1, CACHEW_ECORRUPT, "follow");
	free(bad);
	free(s);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(not_a_state_and_a_newer_version_are_refused)
{
	cachew_options *o = local_opts(1, 1);
	/* ["cachew-iterator-state", 99, ...] */
	static const uint8_t newer[] = {0x99, 0xb5, 'c', 'a', 'c', 'h', 'e',
	    'w', '-', 'i', 't', 'e', 'r', 'a', 't', 'o', 'r', '-', 's', 't',
	    'a', 't', 'e', 99};

	assert_refused("range(3)", o, "hello", 5, CACHEW_ECORRUPT,
	    "iterator state");
	assert_refused("range(3)", o, newer, sizeof(newer), CACHEW_ENOTSUP,
	    "format version 99");
	assert_refused("range(3)", o, NULL, 0, CACHEW_ECORRUPT, "ends");
	cachew_options_destroy(o);
}
END_TEST

/* ---- across processes: the CLI ------------------------------------------------------ */

/* Runs `<build>/cachew run --json --quiet --seed 5 --set service=local
 * arg...` (NULL-terminated; later flags win) and returns its stdout, or
 * its stderr with `err` (exit status in *status). */
static char *
cachew_run(const char *dir, int *status, bool err, ...)
{
	char bin[512], out[600];
	char *argv[24] = {bin, "run", "--json", "--quiet", "--seed", "5",
	    "--set", "service=local"};
	size_t n = 8;
	va_list ap;
	pid_t pid;
	int st;

	va_start(ap, err);
	while (n < 23 && (argv[n] = va_arg(ap, char *)) != NULL)
		n++;
	va_end(ap);
	argv[n] = NULL;
	snprintf(bin, sizeof(bin), "%s/cachew", cwt_build_dir());
	snprintf(out, sizeof(out), "%s/output", dir);
	fflush(NULL);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (freopen(err ? "/dev/null" : out, "w", stdout) == NULL ||
		    freopen(err ? out : "/dev/null", "w", stderr) == NULL)
			_exit(127);
		execv(bin, argv);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	*status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	return cwt_slurp(out);
}

static uint64_t
json_u64(const char *json, const char *key, int base)
{
	const char *p = strstr(json, key);

	ck_assert_msg(p != NULL, "no %s in %s", key, json);
	p += strlen(key);
	if (*p == '"')
		p++;
	return strtoull(p, NULL, base);
}

START_TEST(cli_saves_in_one_process_and_resumes_in_another)
{
	char *dir = cwt_tmpdir(), state[600];
	const char *p = "range(200) | shuffle(20) | map(uniform, parallel=2) "
			"| batch(6) | prefetch(4)";
	char *full, *first, *rest;
	int st = -1;

	snprintf(state, sizeof(state), "%s/state", dir);
	full = cachew_run(dir, &st, false, p, NULL);
	ck_assert_int_eq(st, 0);
	first = cachew_run(dir, &st, false, "--save-at", "13", "--state", state,
	    p, NULL);
	ck_assert_msg(st == 0, "--save-at: exit %d, %s", st, first);
	ck_assert_uint_eq(json_u64(first, "\"saved_at\":", 10), 13);
	rest = cachew_run(dir, &st, false, "--resume", state, p, NULL);
	ck_assert_msg(st == 0, "--resume: exit %d, %s", st, rest);
	/* The digest is the sum of the element hashes: the two halves add up
	 * to the whole run exactly when they are its elements. */
	ck_assert_uint_eq(json_u64(first, "\"elements\":", 10) +
			      json_u64(rest, "\"elements\":", 10),
	    json_u64(full, "\"elements\":", 10));
	ck_assert_uint_eq(json_u64(first, "\"digest\":", 16) +
			      json_u64(rest, "\"digest\":", 16),
	    json_u64(full, "\"digest\":", 16));
	free(full);
	free(first);
	free(rest);
	/* A pipeline the embedded default would run, with no service named:
	 * the plain executor saves it, and the halves add up. */
	p = "range(1000) | shuffle(50) | batch(10)";
	full = cachew_run(dir, &st, false, "--seed", "3", p, NULL);
	ck_assert_int_eq(st, 0);
	first = cachew_run(dir, &st, false, "--seed", "3", "--save-at", "41",
	    "--state", state, p, NULL);
	ck_assert_msg(st == 0, "--save-at: exit %d, %s", st, first);
	rest = cachew_run(dir, &st, false, "--seed", "3", "--resume", state, p,
	    NULL);
	ck_assert_msg(st == 0, "--resume: exit %d, %s", st, rest);
	ck_assert_uint_eq(json_u64(first, "\"elements\":", 10) +
			      json_u64(rest, "\"elements\":", 10), 100);
	ck_assert_uint_eq(json_u64(first, "\"digest\":", 16) +
			      json_u64(rest, "\"digest\":", 16),
	    json_u64(full, "\"digest\":", 16));
	free(first);
	free(rest);
	/* Through the embedded service, named: its run is the plain
	 * executor's, and so are the halves. */
	snprintf(state, sizeof(state), "%s/state2", dir);
	first = cachew_run(dir, &st, false, "--seed", "3", "--set",
	    "service=embedded", "--save-at", "3", "--state", state, p, NULL);
	ck_assert_msg(st == 0, "--save-at: exit %d, %s", st, first);
	rest = cachew_run(dir, &st, false, "--seed", "3", "--set",
	    "service=embedded", "--resume", state, p, NULL);
	ck_assert_msg(st == 0, "--resume: exit %d, %s", st, rest);
	ck_assert_uint_eq(json_u64(first, "\"digest\":", 16) +
			      json_u64(rest, "\"digest\":", 16),
	    json_u64(full, "\"digest\":", 16));
	free(first);
	free(rest);
	free(full);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_resume_suite(void)
{
	Suite *s = suite_create("resume");
	TCase *tc = tcase_create("resume");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, range_and_literals_resume);
	tcase_add_test(tc, repeat_take_skip_shard_enumerate_resume);
	tcase_add_test(tc, shuffle_resume);
	tcase_add_test(tc, batch_unbatch_resume);
	tcase_add_test(tc, zip_concatenate_resume);
	tcase_add_test(tc, random_map_and_filter_resume);
	tcase_add_test(tc, parallel_map_and_prefetch_resume);
	tcase_add_test(tc, file_sources_and_interleave_resume);
	tcase_add_test(tc, record_files_resume_at_their_offsets);
	tcase_add_test(tc, w2_pipeline_resumes);
	tcase_add_test(tc, save_twice_and_restore_the_later);
	tcase_add_test(tc, a_lease_resumes_through_the_exec_calls);
	tcase_add_test(tc, parallelism_and_buffers_may_change_across_a_restore);
	tcase_add_test(tc, state_of_an_ended_iterator_restores_to_the_end);
	tcase_add_test(tc, state_of_another_pipeline_seed_or_epoch_is_refused);
	tcase_add_test(tc, unset_seed_takes_the_saved_one);
	tcase_add_test(tc, service_positions_refused_say_why);
	tcase_add_test(tc, cache_ops_resume_reading_or_computing);
	tcase_add_test(tc, cache_put_resumes_without_writing);
	tcase_add_test(tc, tfrecord_write_cannot_save_and_says_why);
	tcase_add_test(tc, damaged_states_give_clear_errors);
	tcase_add_test(tc, not_a_state_and_a_newer_version_are_refused);
	tcase_add_test(tc, cli_saves_in_one_process_and_resumes_in_another);
	suite_add_tcase(s, tc);
	tc = tcase_create("resume_service");
	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, service_positions_resume_on_the_embedded_service);
	tcase_add_test(tc, service_positions_resume_through_a_cluster);
	tcase_add_test(tc, service_positions_resume_with_the_client_tail_either_side);
	suite_add_tcase(s, tc);
	return s;
}
