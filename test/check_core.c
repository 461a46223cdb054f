/*
 * check_core.c - tensors, elements, params, options, errors, logging, the
 * registry, graph building and the iterator's generic behaviour.
 */
#include "cwt.h"
#include "../src/core/core.h"
#include "../src/graph/graph.h"
#include "../src/exec/exec.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- errors and version ---------------------------------------------------- */

START_TEST(version_matches_header)
{
	ck_assert_str_eq(cachew_version(), CACHEW_VERSION_STRING);
	ck_assert_uint_eq(cachew_version_number(), CACHEW_VERSION_NUMBER);
}
END_TEST

START_TEST(strerror_names_every_code)
{
	for (int e = CACHEW_OK; e <= CWI_ERR_LAST; e++) {
		const char *s = cachew_strerror((cachew_err)e);
		ck_assert_ptr_nonnull(s);
		ck_assert_str_ne(s, "unknown error");
	}
	ck_assert_str_eq(cachew_strerror((cachew_err)999), "unknown error");
}
END_TEST

/* A string built from nothing is "", not whatever the allocation held
 * (expat's reader of S3 listings finishes an empty <Key> so). */
START_TEST(strbuf_finished_empty_is_an_empty_string)
{
	cwi_strbuf sb;
	char *out;
	size_t len = 9;

	/* Fresh allocations filled with non-zero bytes (ASan fills them
	 * itself): the terminator must be written, not found. */
	mallopt(M_PERTURB, 0x5a);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_strbuf_finish(&sb, &out, &len), CACHEW_OK);
	mallopt(M_PERTURB, 0);
	ck_assert_ptr_nonnull(out);
	ck_assert_uint_eq(len, 0);
	ck_assert_str_eq(out, "");
	free(out);
}
END_TEST

/* ---- dtypes and tensors ------------------------------------------------------ */

START_TEST(dtype_names_round_trip)
{
	for (int d = CACHEW_U8; d <= CACHEW_BYTES; d++) {
		cachew_dtype out;
		ck_assert_int_eq(cachew_dtype_from_name(
				     cachew_dtype_name((cachew_dtype)d), &out),
		    CACHEW_OK);
		ck_assert_int_eq(out, d);
	}
	cachew_dtype out;
	ck_assert_int_eq(cachew_dtype_from_name("float32", &out), CACHEW_OK);
	ck_assert_int_eq(out, CACHEW_F32);
	ck_assert_int_eq(cachew_dtype_from_name("f128", &out), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "f128"));
	ck_assert_uint_eq(cachew_dtype_size(CACHEW_BF16), 2);
	ck_assert_uint_eq(cachew_dtype_size(CACHEW_BYTES), 0);
}
END_TEST

START_TEST(tensor_create_is_zeroed_and_shaped)
{
	int64_t shape[3] = {2, 3, 4};
	cachew_tensor *t;
	void *data;

	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_F32, 3, shape, &data),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_rank(t), 3);
	ck_assert_int_eq(cachew_tensor_shape(t)[2], 4);
	ck_assert_int_eq(cachew_tensor_numel(t), 24);
	ck_assert_uint_eq(cachew_tensor_nbytes(t), 96);
	for (int i = 0; i < 24; i++)
		ck_assert(((float *)data)[i] == 0.0f);
	((float *)data)[5] = 2.5f;
	ck_assert(((const float *)cachew_tensor_data(t))[5] == 2.5f);
	cachew_tensor_release(t);
	cachew_tensor_release(NULL);
}
END_TEST

START_TEST(tensor_retain_shares_the_buffer)
{
	int64_t shape[1] = {64};
	cachew_tensor *t, *r;
	void *data;

	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_I64, 1, shape, &data),
	    CACHEW_OK);
	((int64_t *)data)[63] = 42;
	ck_assert_int_eq(cachew_tensor_retain(&r, t), CACHEW_OK);
	ck_assert_ptr_ne(r, t);
	ck_assert_ptr_eq(cachew_tensor_data(r), cachew_tensor_data(t));
	cachew_tensor_release(t);
	ck_assert_int_eq(((const int64_t *)cachew_tensor_data(r))[63], 42);
	cachew_tensor_release(r);
}
END_TEST

/* The names before the ABI review stay usable: same functions. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
START_TEST(tensor_copy_and_destroy_still_retain_and_release)
{
	int64_t shape[1] = {64};
	cachew_tensor *t, *c;

	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_I64, 1, shape, NULL),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_copy(&c, t), CACHEW_OK);
	ck_assert_ptr_eq(cachew_tensor_data(c), cachew_tensor_data(t));
	cachew_tensor_destroy(t);
	cachew_tensor_destroy(c);
	cachew_tensor_destroy(NULL);
}
END_TEST
#pragma GCC diagnostic pop

START_TEST(tensor_rejects_bad_shapes)
{
	int64_t big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
	int64_t neg[1] = {-1};
	int64_t huge[2] = {INT64_MAX / 2, 16};
	cachew_tensor *t;
	void *d;

	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_U8, 9, big, &d),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "rank 9"));
	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_U8, 1, neg, &d),
	    CACHEW_EINVAL);
	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_I64, 2, huge, &d),
	    CACHEW_ERANGE);
	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_BYTES, 1, neg, &d),
	    CACHEW_EINVAL);
}
END_TEST

static int wrap_frees;

static void
count_free(void *ctx, void *data)
{
	(void)ctx;
	free(data);
	wrap_frees++;
}

START_TEST(tensor_wrap_frees_after_last_view)
{
	int64_t shape[1] = {1000};
	int32_t *mem = malloc(1000 * sizeof(int32_t));
	cachew_tensor *t, *s;

	for (int i = 0; i < 1000; i++)
		mem[i] = i;
	wrap_frees = 0;
	ck_assert_int_eq(cachew_tensor_wrap(&t, CACHEW_I32, 1, shape, mem,
			     4000, count_free, NULL),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_slice(&s, t, 100, 50), CACHEW_OK);
	/* Zero copy: the slice points into the wrapped memory. */
	ck_assert_ptr_eq(cachew_tensor_data(s), mem + 100);
	cachew_tensor_release(t);
	ck_assert_int_eq(wrap_frees, 0);
	ck_assert_int_eq(((const int32_t *)cachew_tensor_data(s))[49], 149);
	cachew_tensor_release(s);
	ck_assert_int_eq(wrap_frees, 1);
	ck_assert_int_eq(cachew_tensor_wrap(&t, CACHEW_I32, 1, shape, mem,
			     3999, count_free, NULL),
	    CACHEW_EINVAL);
}
END_TEST

START_TEST(tensor_slice_checks_bounds)
{
	int64_t shape[2] = {4, 2};
	cachew_tensor *t, *s;
	void *d;

	ck_assert_int_eq(cachew_tensor_create(&t, CACHEW_I64, 2, shape, &d),
	    CACHEW_OK);
	for (int i = 0; i < 8; i++)
		((int64_t *)d)[i] = i;
	ck_assert_int_eq(cachew_tensor_slice(&s, t, 3, 2), CACHEW_ERANGE);
	ck_assert_int_eq(cachew_tensor_slice(&s, t, -1, 1), CACHEW_ERANGE);
	ck_assert_int_eq(cachew_tensor_slice(&s, t, 1, 2), CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_shape(s)[0], 2);
	ck_assert_int_eq(cachew_tensor_shape(s)[1], 2);
	ck_assert_int_eq(((const int64_t *)cachew_tensor_data(s))[0], 2);
	ck_assert_int_eq(((const int64_t *)cachew_tensor_data(s))[3], 5);
	cachew_tensor_release(s);
	cachew_tensor_release(t);
}
END_TEST

START_TEST(bytes_tensor_holds_strings_and_slices)
{
	const char *items[3] = {"alpha", "", "gamma ray"};
	size_t lens[3] = {5, 0, 9};
	int64_t shape[1] = {3};
	cachew_tensor *t, *s, *one;
	const void *p;
	size_t len;

	ck_assert_int_eq(cachew_tensor_create_bytes(&t, 1, shape,
			     (const void *const *)items, lens),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_BYTES);
	ck_assert_uint_eq(cachew_tensor_nbytes(t), 14);
	ck_assert_int_eq(cachew_tensor_bytes_at(t, 2, &p, &len), CACHEW_OK);
	ck_assert_uint_eq(len, 9);
	ck_assert_int_eq(memcmp(p, "gamma ray", 9), 0);
	ck_assert_int_eq(cachew_tensor_bytes_at(t, 3, &p, &len), CACHEW_ERANGE);
	ck_assert_int_eq(cachew_tensor_slice(&s, t, 1, 2), CACHEW_OK);
	ck_assert_uint_eq(cachew_tensor_nbytes(s), 9);
	ck_assert_int_eq(cachew_tensor_bytes_at(s, 0, &p, &len), CACHEW_OK);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(cachew_tensor_slice(&one, s, 1, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_bytes_at(one, 0, &p, &len), CACHEW_OK);
	ck_assert_int_eq(memcmp(p, "gamma ray", 9), 0);
	cachew_tensor_release(t);
	cachew_tensor_release(s);
	/* The view outlives the tensors it came from. */
	ck_assert_int_eq(cachew_tensor_bytes_at(one, 0, &p, &len), CACHEW_OK);
	ck_assert_int_eq(memcmp(p, "gamma ray", 9), 0);
	cachew_tensor_release(one);
}
END_TEST

/* ---- elements ----------------------------------------------------------------- */

START_TEST(element_set_and_read_components)
{
	cachew_element *e;
	cachew_tensor *t;
	int64_t v = 42;
	double f = 0.5;

	ck_assert_int_eq(cachew_element_create(&e, 0), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_element_create(&e, 65), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_element_create(&e, 2), CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_create_scalar(&t, CACHEW_I64, &v),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 0, t), CACHEW_OK);
	cachew_tensor_release(t);
	ck_assert_int_eq(cachew_tensor_create_scalar(&t, CACHEW_F64, &f),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 1, t), CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 2, t), CACHEW_ERANGE);
	cachew_tensor_release(t);
	ck_assert_uint_eq(cachew_element_size(e), 2);
	ck_assert_int_eq(cwt_i64(e, 0), 42);
	ck_assert(cwt_f64(e, 1) == 0.5);
	ck_assert_ptr_null(cachew_element_component(e, 2));
	cachew_element_release(e);
}
END_TEST

START_TEST(shared_element_is_immutable)
{
	cachew_element *e;
	void *d;
	int64_t shape[1] = {4};

	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	cachew_element_retain(e);
	ck_assert_int_eq(cachew_element_alloc(e, 0, CACHEW_I32, 1, shape, &d),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "shared"));
	cachew_element_release(e);
	ck_assert_int_eq(cachew_element_alloc(e, 0, CACHEW_I32, 1, shape, &d),
	    CACHEW_OK);
	cachew_element_release(e);
}
END_TEST

START_TEST(mutable_data_copies_shared_buffers)
{
	cachew_element *a, *b;
	int64_t shape[1] = {64};
	void *d, *m;

	ck_assert_int_eq(cachew_element_create(&a, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_element_alloc(a, 0, CACHEW_I64, 1, shape, &d),
	    CACHEW_OK);
	((int64_t *)d)[0] = 7;
	ck_assert_int_eq(cachew_element_create(&b, 1), CACHEW_OK);
	ck_assert_int_eq(
	    cachew_element_set(b, 0, cachew_element_component(a, 0)),
	    CACHEW_OK);
	/* b shares a's buffer: writing through b must copy first. */
	ck_assert_int_eq(cachew_element_mutable_data(b, 0, &m), CACHEW_OK);
	ck_assert_ptr_ne(m, d);
	((int64_t *)m)[0] = 8;
	ck_assert_int_eq(((const int64_t *)cachew_tensor_data(
			      cachew_element_component(a, 0)))[0],
	    7);
	/* Now b's buffer is its own: no second copy. */
	void *m2;
	ck_assert_int_eq(cachew_element_mutable_data(b, 0, &m2), CACHEW_OK);
	ck_assert_ptr_eq(m2, m);
	cachew_element_release(a);
	cachew_element_release(b);
}
END_TEST

START_TEST(compact_copies_small_views_of_big_blocks)
{
	int64_t shape[1] = {1 << 20};
	cachew_tensor *block, *line;
	cachew_element *e;
	void *d;

	/* A 1 MiB u8 block and a 100-byte view of it, as text_lines makes. */
	ck_assert_int_eq(cachew_tensor_create(&block, CACHEW_U8, 1, shape, &d),
	    CACHEW_OK);
	memset(d, 'x', 1 << 20);
	((char *)d)[5000] = 'y';
	ck_assert_int_eq(cachew_tensor_slice(&line, block, 5000, 100), CACHEW_OK);
	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 0, line), CACHEW_OK);
	cachew_tensor_release(line);
	e = cwi_element_compact(e);
	ck_assert_ptr_nonnull(e);
	const cachew_tensor *t = cachew_element_component(e, 0);
	ck_assert_ptr_ne(cachew_tensor_data(t), (char *)d + 5000);
	ck_assert_int_eq(cachew_tensor_numel(t), 100);
	ck_assert_int_eq(((const char *)cachew_tensor_data(t))[0], 'y');
	ck_assert_int_eq(((const char *)cachew_tensor_data(t))[99], 'x');
	cachew_element_release(e);
	/* A view using most of its buffer stays a view. */
	ck_assert_int_eq(cachew_tensor_slice(&line, block, 0, 900000), CACHEW_OK);
	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 0, line), CACHEW_OK);
	cachew_tensor_release(line);
	e = cwi_element_compact(e);
	ck_assert_ptr_eq(cachew_tensor_data(cachew_element_component(e, 0)), d);
	cachew_element_release(e);
	cachew_tensor_release(block);
}
END_TEST

/* Sanitizer builds keep no freed buffers (tensor.c): they check bounds
 * on fresh malloc'd memory instead. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CWT_BUFFER_REUSE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CWT_BUFFER_REUSE 0
#endif
#endif
#ifndef CWT_BUFFER_REUSE
#define CWT_BUFFER_REUSE 1
#endif

/* W2's cycle: a freed f32 batch ([64, 3, 224, 224], 38.5 MB), then the
 * next batch's 64 crops (224x224x3 u8) allocated and freed together by
 * batch(64), then the next f32 batch. The crops must not push the batch
 * out of the reuse list (a list of 32 did: every batch was page-faulted
 * in again, a sixth of W2's CPU time), and a fit goes to the buffer freed
 * last. */
START_TEST(freed_batch_buffer_survives_a_batch_of_freed_crops)
{
	enum { CROPS = 64 };
	const size_t batch_bytes = (size_t)64 * 3 * 224 * 224 * 4;
	const size_t crop_bytes = (size_t)224 * 224 * 3;
	cwi_buffer *batch, *crops[CROPS], *again;
	uint8_t *batch_data, *last_crop;

	if (!CWT_BUFFER_REUSE)
		return;
	ck_assert_int_eq(cwi_buffer_alloc(&batch, batch_bytes, false),
	    CACHEW_OK);
	/* Marks: a fresh mapping at the same address would read zeros. */
	batch_data = batch->data;
	batch_data[0] = 0xa5;
	batch_data[batch_bytes - 1] = 0x5a;
	cwi_buffer_unref(batch);
	for (int i = 0; i < CROPS; i++) {
		ck_assert_int_eq(cwi_buffer_alloc(&crops[i], crop_bytes, false),
		    CACHEW_OK);
		crops[i]->data[0] = (uint8_t)(i + 1);
	}
	last_crop = crops[CROPS - 1]->data;
	for (int i = 0; i < CROPS; i++)
		cwi_buffer_unref(crops[i]);
	ck_assert_int_eq(cwi_buffer_alloc(&again, batch_bytes, false),
	    CACHEW_OK);
	ck_assert_ptr_eq(again->data, batch_data);
	ck_assert_uint_eq(again->data[0], 0xa5);
	ck_assert_uint_eq(again->data[batch_bytes - 1], 0x5a);
	cwi_buffer_unref(again);
	ck_assert_int_eq(cwi_buffer_alloc(&again, crop_bytes, false),
	    CACHEW_OK);
	ck_assert_ptr_eq(again->data, last_crop);
	ck_assert_uint_eq(again->data[0], CROPS);
	cwi_buffer_unref(again);
	cwi_buffer_cache_drop();
}
END_TEST

/* A freed large buffer, its first and last bytes marked: reallocating its
 * size finds it again with the marks while the reuse list keeps it, and
 * reads zeros (a fresh mapping) once it was freed. */
#define CWT_REUSE_BYTES ((size_t)64 * 3 * 224 * 224 * 4)

static uint8_t *
freed_marked_buffer(void)
{
	cwi_buffer *b;
	uint8_t *data;

	ck_assert_int_eq(cwi_buffer_alloc(&b, CWT_REUSE_BYTES, false),
	    CACHEW_OK);
	data = b->data;
	data[0] = 0xa5;
	data[CWT_REUSE_BYTES - 1] = 0x5a;
	cwi_buffer_unref(b);
	return data;
}

/* Whether the reuse list still held the buffer freed_marked_buffer()
 * freed: reallocating its size finds it, marks and all. Under valgrind
 * every buffer is malloc'd (tensor.c) and one freed is not zeroed, so a
 * fresh block at the same address would be read uninitialised: there only
 * `want` true is checked, and the answer is want. */
static bool
marked_buffer_kept(const uint8_t *data, bool want)
{
	cwi_buffer *b;
	bool kept = want;

	ck_assert_int_eq(cwi_buffer_alloc(&b, CWT_REUSE_BYTES, false),
	    CACHEW_OK);
	if (want || getenv("CWT_VALGRIND") == NULL)
		kept = b->data == data && b->data[0] == 0xa5 &&
		       b->data[CWT_REUSE_BYTES - 1] == 0x5a;
	/* Unmarked as it goes back, so a later check cannot see old marks. */
	b->data[0] = 0;
	b->data[CWT_REUSE_BYTES - 1] = 0;
	cwi_buffer_unref(b);
	return kept;
}

/* A client that keeps its buffer full gives memory back every second
 * (cwi_heap_release(false)): the buffers its next batches take stay (it
 * dropped them all, and W2 through the service page-faulted its 38.5 MB
 * batches in again every second); after a burst (all) they go. */
START_TEST(heap_release_keeps_recent_buffers_unless_all)
{
	uint8_t *data;

	if (!CWT_BUFFER_REUSE)
		return;
	cwi_buffer_cache_drop();
	data = freed_marked_buffer();
	cwi_heap_release(false);
	cwi_buffer_cache_trim();
	ck_assert(marked_buffer_kept(data, true));
	data = freed_marked_buffer();
	cwi_heap_release(true);
	ck_assert(!marked_buffer_kept(data, false));
	cwi_buffer_cache_drop();
}
END_TEST

/* The user's iterator's end drops the reuse list (an epoch's elements in
 * flight); the iterators the library makes while the user's runs (a
 * worker's lease, the client's stitched runs: cwi_exec_iterator_create
 * alone) leave it to the pipeline still running. */
START_TEST(only_the_users_iterator_end_drops_the_reuse_list)
{
	cachew_dataset *ds;
	cachew_options *opts;
	cachew_iterator *it;
	cachew_element *e;
	uint8_t *data;
	int n = 0;

	if (!CWT_BUFFER_REUSE)
		return;
	cwi_buffer_cache_drop();
	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(5) | batch(2)"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_create(&opts), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set(opts, "service", "local"),
	    CACHEW_OK);
	data = freed_marked_buffer();
	ck_assert_int_eq(cwi_exec_iterator_create(&it, ds, opts), CACHEW_OK);
	while (cachew_iterator_next(it, &e) == CACHEW_OK) {
		cachew_element_release(e);
		n++;
	}
	ck_assert_int_eq(n, 3);
	cachew_iterator_destroy(it);
	ck_assert(marked_buffer_kept(data, true));
	data = freed_marked_buffer();
	ck_assert_int_eq(cachew_iterator_create(&it, ds, opts), CACHEW_OK);
	cachew_iterator_destroy(it);
	ck_assert(!marked_buffer_kept(data, false));
	cachew_options_destroy(opts);
	cachew_dataset_release(ds);
	cwi_buffer_cache_drop();
}
END_TEST

/* ---- params and options --------------------------------------------------------- */

START_TEST(params_typed_get_and_set)
{
	cachew_params *p;
	int64_t i, list[4];
	double f, dl[2];
	int b;
	const char *s;
	size_t n;
	int64_t il[3] = {224, 224, 3};

	ck_assert_int_eq(cachew_params_create(&p), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_int(p, "n", 5), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_double(p, "x", 2.0), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_bool(p, "flag", 1), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_str(p, "mode", "bilinear"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_int_list(p, "size", il, 3),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_int(p, "bad key", 1), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_params_get_int(p, "n", &i), CACHEW_OK);
	ck_assert_int_eq(i, 5);
	ck_assert_int_eq(cachew_params_get_double(p, "n", &f), CACHEW_OK);
	ck_assert(f == 5.0);
	ck_assert_int_eq(cachew_params_get_int(p, "x", &i), CACHEW_OK);
	ck_assert_int_eq(i, 2);
	ck_assert_int_eq(cachew_params_get_bool(p, "flag", &b), CACHEW_OK);
	ck_assert_int_eq(b, 1);
	ck_assert_int_eq(cachew_params_get_str(p, "mode", &s), CACHEW_OK);
	ck_assert_str_eq(s, "bilinear");
	ck_assert_int_eq(cachew_params_get_int(p, "mode", &i), CACHEW_ETYPE);
	ck_assert_int_eq(cachew_params_get_int(p, "nope", &i), CACHEW_ENOENT);
	ck_assert_int_eq(cachew_params_get_int_list(p, "size", list, 2, &n),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(list[1], 224);
	ck_assert_int_eq(cachew_params_get_double_list(p, "size", dl, 2, &n),
	    CACHEW_OK);
	ck_assert(dl[0] == 224.0);
	/* Keys come back sorted. */
	ck_assert_uint_eq(cachew_params_count(p), 5);
	ck_assert_str_eq(cachew_params_key(p, 0), "flag");
	ck_assert_str_eq(cachew_params_key(p, 4), "x");
	ck_assert_ptr_null(cachew_params_key(p, 5));
	cachew_params_destroy(p);
}
END_TEST

START_TEST(options_defaults_and_validation)
{
	cachew_options *o;
	int64_t v;
	int b;
	const char *s;

	ck_assert_int_eq(cachew_options_create(&o), CACHEW_OK);
	ck_assert_int_eq(cachew_options_get_int(o, "seed", &v), CACHEW_OK);
	ck_assert_int_eq(v, -1);
	ck_assert_int_eq(cachew_options_get_bool(o, "deterministic", &b),
	    CACHEW_OK);
	ck_assert_int_eq(b, 1);
	ck_assert_int_eq(cachew_options_set_int(o, "threads", 4), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_int(o, "threads", -3),
	    CACHEW_ERANGE);
	ck_assert_ptr_nonnull(strstr(cachew_options_errmsg(o), "threads"));
	ck_assert_int_eq(cachew_options_set_int(o, "thread", 4), CACHEW_ENOENT);
	ck_assert_ptr_nonnull(
	    strstr(cachew_options_errmsg(o), "unknown option 'thread'"));
	ck_assert_int_eq(cachew_options_set_bool(o, "threads", 1),
	    CACHEW_ETYPE);
	ck_assert_int_eq(cachew_options_set(o, "seed", "1234"), CACHEW_OK);
	ck_assert_int_eq(cachew_options_get_int(o, "seed", &v), CACHEW_OK);
	ck_assert_int_eq(v, 1234);
	ck_assert_int_eq(cachew_options_set(o, "seed", "12x"), CACHEW_ETYPE);
	/* Decimal or 0x hex, never octal: 010 is ten (it was 8). */
	ck_assert_int_eq(cachew_options_set(o, "seed", "010"), CACHEW_OK);
	ck_assert_int_eq(cachew_options_get_int(o, "seed", &v), CACHEW_OK);
	ck_assert_int_eq(v, 10);
	ck_assert_int_eq(cachew_options_set(o, "seed", "0x10"), CACHEW_OK);
	ck_assert_int_eq(cachew_options_get_int(o, "seed", &v), CACHEW_OK);
	ck_assert_int_eq(v, 16);
	ck_assert_int_eq(cachew_options_set(o, "seed", " 5"), CACHEW_ETYPE);
	ck_assert_int_eq(cachew_options_set(o, "autotune", "off"), CACHEW_OK);
	ck_assert_int_eq(cachew_options_get_bool(o, "autotune", &b), CACHEW_OK);
	ck_assert_int_eq(b, 0);
	ck_assert_int_eq(cachew_options_set(o, "autotune", "maybe"),
	    CACHEW_ETYPE);
	ck_assert_int_eq(cachew_options_set(o, "service", "tcp://h:1"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_options_get_str(o, "service", &s), CACHEW_OK);
	ck_assert_str_eq(s, "tcp://h:1");
	cachew_options_destroy(o);
}
END_TEST

START_TEST(option_table_is_described)
{
	const char *name, *type, *def, *help;
	size_t i = 0;

	while (cachew_option_info(i, &name, &type, &def, &help) == CACHEW_OK) {
		ck_assert(strlen(name) > 0 && strlen(help) > 0);
		i++;
	}
	ck_assert_uint_ge(i, 6);
}
END_TEST

/* ---- logging -------------------------------------------------------------------- */

static char log_seen[256];

static void
capture_log(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	(void)ctx;
	(void)level;
	/* The registry's lines only: in one process (make valgrind) the
	 * threads of an embedded service an earlier test started log too. */
	if (strcmp(module, "registry") == 0)
		snprintf(log_seen, sizeof(log_seen), "%s: %s", module, msg);
}

/* ---- registry ------------------------------------------------------------------- */

static cachew_err
core_fail_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t v = cwt_i64(in, 0);
	if (v == 7) {
		cachew_element_release(in);
		return cachew_op_ctx_fail(ctx, "seven is not allowed");
	}
	*out = in;
	return CACHEW_OK;
}

static cachew_err
core_seed_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	cachew_element *e;
	uint64_t r = cachew_op_ctx_random(ctx);
	int64_t v = (int64_t)(r >> 1);
	cachew_tensor *t;

	cachew_element_release(in);
	if (cachew_element_create(&e, 1) != CACHEW_OK ||
	    cachew_tensor_create_scalar(&t, CACHEW_I64, &v) != CACHEW_OK)
		return cachew_op_ctx_fail(ctx, "out of memory");
	cachew_element_set(e, 0, t);
	cachew_tensor_release(t);
	*out = e;
	return CACHEW_OK;
}

static cachew_err
core_null_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	(void)out;
	cachew_element_release(in);
	return CACHEW_OK; /* a buggy function: success without a result */
}

static cachew_err
core_filter_fail(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	if (cwt_i64(in, 0) == 7)
		return cachew_op_ctx_fail(ctx, "seven is not allowed");
	*keep = 1;
	return CACHEW_OK;
}

static void
register_core_ops(void)
{
	static const cachew_op_def null_map = {
	    .version = CACHEW_OP_DEF_VERSION, .name = "core_test_null",
	    .kind = CACHEW_OP_MAP, .map = core_null_map};
	static const cachew_op_def filter_fail = {
	    .version = CACHEW_OP_DEF_VERSION, .name = "core_test_ffail",
	    .kind = CACHEW_OP_FILTER, .filter = core_filter_fail};
	ck_assert_int_eq(cachew_op_register(&null_map), CACHEW_OK);
	ck_assert_int_eq(cachew_op_register(&filter_fail), CACHEW_OK);
	static const cachew_op_def fail = {
	    .version = CACHEW_OP_DEF_VERSION, .name = "core_test_fail",
	    .kind = CACHEW_OP_MAP, .map = core_fail_map};
	static const cachew_op_def seed = {
	    .version = CACHEW_OP_DEF_VERSION, .name = "core_test_seed",
	    .kind = CACHEW_OP_MAP,
	    .flags = CACHEW_OP_RANDOM,
	    .map = core_seed_map};
	ck_assert_int_eq(cachew_op_register(&fail), CACHEW_OK);
	ck_assert_int_eq(cachew_op_register(&seed), CACHEW_OK);
}

static pthread_once_t core_once = PTHREAD_ONCE_INIT;

static void
core_setup(void)
{
	pthread_once(&core_once, register_core_ops);
}

START_TEST(register_rejects_bad_definitions)
{
	cachew_op_def d = {.version = CACHEW_OP_DEF_VERSION,
	    .name = "Bad-Name", .kind = CACHEW_OP_MAP,
	    .map = core_fail_map};
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_EINVAL);
	d.name = "core_test_fail";
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_EEXIST);
	d.name = "core_test_nofn";
	d.map = NULL;
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "lacks"));
	d.kind = (cachew_op_kind)9;
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_plugin_load("/nonexistent/plugin.so"),
	    CACHEW_ENOENT);
}
END_TEST

/* A definition written against version 1 of cachew_op_def (cachew.h): the
 * fields up to flat_close, without doc. Built the way an old plugin's
 * static definition is laid out, so the registry must read no further. */
typedef struct op_def_v1 {
	unsigned version;
	const char *name;
	cachew_op_kind kind;
	unsigned flags;
	double cost_ns;
	cachew_err (*init)(const cachew_params *params, void **state,
	    char *err, size_t errlen);
	void (*fini)(void *state);
	cachew_map_fn map;
	cachew_filter_fn filter;
	cachew_err (*flat_open)(
	    cachew_op_ctx *ctx, const cachew_element *in, void **seq);
	cachew_err (*flat_next)(
	    cachew_op_ctx *ctx, void *seq, cachew_element **out);
	void (*flat_close)(void *seq);
} op_def_v1;
_Static_assert(sizeof(op_def_v1) == offsetof(cachew_op_def, doc),
    "version 1 of cachew_op_def ends where doc begins");

START_TEST(register_takes_the_current_op_def_version)
{
	cachew_op_def d = {.version = CACHEW_OP_DEF_VERSION,
	    .name = "core_test_current", .kind = CACHEW_OP_MAP,
	    .map = core_fail_map, .doc = "core_test_current(): passes"};
	const cwi_fn *fn;

	ck_assert_msg(cachew_op_register(&d) == CACHEW_OK, "%s",
	    cachew_errmsg());
	fn = cwi_fn_lookup("core_test_current");
	ck_assert_ptr_nonnull(fn);
	ck_assert_str_eq(fn->def.doc, "core_test_current(): passes");
}
END_TEST

START_TEST(register_takes_a_version_1_op_def_without_doc)
{
	/* Exactly the bytes of a version 1 definition on the heap: a read of
	 * the doc field it lacks is an overflow under make asan. */
	op_def_v1 *v1 = malloc(sizeof(*v1));
	cachew_element **out = NULL;
	const cwi_fn *fn;
	char *got;
	size_t n = 0;

	ck_assert_ptr_nonnull(v1);
	memset(v1, 0, sizeof(*v1));
	v1->version = 1;
	v1->name = "core_test_v1";
	v1->kind = CACHEW_OP_MAP;
	v1->map = core_fail_map;
	ck_assert_msg(cachew_op_register((const cachew_op_def *)v1) ==
		CACHEW_OK, "%s", cachew_errmsg());
	free(v1); /* the registry keeps its own copy */
	fn = cwi_fn_lookup("core_test_v1");
	ck_assert_ptr_nonnull(fn);
	ck_assert_ptr_null(fn->def.doc);
	ck_assert_int_eq(cwt_run("range(4) | map(core_test_v1)", NULL, &out,
			     &n, NULL, 0), CACHEW_OK);
	got = cwt_join_i64(out, n, 0);
	ck_assert_str_eq(got, "0,1,2,3");
	free(got);
	cwt_free(out, n);
}
END_TEST

START_TEST(register_refuses_a_newer_op_def_version_naming_both)
{
	cachew_op_def d = {.version = CACHEW_OP_DEF_VERSION + 1,
	    .name = "core_test_future", .kind = CACHEW_OP_MAP,
	    .map = core_fail_map};
	char want[256];

	snprintf(want, sizeof(want),
	    "operator 'core_test_future' (not from a plugin): cachew_op_def "
	    "version %d is newer than this library's %d: build it against "
	    "this library's cachew.h or upgrade cachew",
	    CACHEW_OP_DEF_VERSION + 1, CACHEW_OP_DEF_VERSION);
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_ENOTSUP);
	ck_assert_str_eq(cachew_errmsg(), want);
	ck_assert_ptr_null(cwi_fn_lookup("core_test_future"));
}
END_TEST

START_TEST(register_refuses_an_unset_op_def_version)
{
	cachew_op_def d = {.name = "core_test_unset", .kind = CACHEW_OP_MAP,
	    .map = core_fail_map};
	char want[256];

	snprintf(want, sizeof(want),
	    "operator 'core_test_unset' (not from a plugin): cachew_op_def "
	    "version 0: set .version = CACHEW_OP_DEF_VERSION (this library "
	    "reads versions 1 to %d)", CACHEW_OP_DEF_VERSION);
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), want);
	ck_assert_ptr_null(cwi_fn_lookup("core_test_unset"));
}
END_TEST

START_TEST(register_refuses_a_garbage_version_without_reading_on)
{
	/* What a definition built before the version field looks like from
	 * here: the name pointer's low word where the version is, and the
	 * kind and flags where the name pointer is. Reading that "name"
	 * would crash. */
	cachew_op_def d;
	uintptr_t kind_and_flags = 0x1;
	char want[256];

	memset(&d, 0, sizeof(d));
	d.version = 0x5566aa10u;
	memcpy((char *)&d + offsetof(cachew_op_def, name), &kind_and_flags,
	    sizeof(kind_and_flags));
	snprintf(want, sizeof(want),
	    "an operator (not from a plugin): cachew_op_def version "
	    "1432791568 is not a version (this library reads 1 to %d): was it "
	    "built against a cachew.h without the version field?",
	    CACHEW_OP_DEF_VERSION);
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_ENOTSUP);
	ck_assert_str_eq(cachew_errmsg(), want);
}
END_TEST

START_TEST(registration_is_logged_to_the_sink)
{
	cachew_op_def d = {.version = CACHEW_OP_DEF_VERSION,
	    .name = "core_test_logged", .kind = CACHEW_OP_MAP,
	    .map = core_fail_map};
	log_seen[0] = '\0';
	cachew_log_set(capture_log, NULL, CACHEW_LOG_DEBUG);
	ck_assert_int_eq(cachew_op_register(&d), CACHEW_OK);
	cachew_log_set(NULL, NULL, CACHEW_LOG_DEBUG);
	ck_assert_str_eq(log_seen, "registry: registered operator 'core_test_logged'");
}
END_TEST

/* ---- graph building ------------------------------------------------------------- */

START_TEST(apply_reports_bad_graphs)
{
	cachew_dataset *r, *d;
	cachew_params *p;

	ck_assert_int_eq(cachew_dataset_range(&r, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_apply(&d, "no_such_op", &r, 1, NULL),
	    CACHEW_ENOENT);
	ck_assert_str_eq(cachew_errmsg(), "unknown operator 'no_such_op'");
	ck_assert_int_eq(cachew_dataset_apply(&d, "batch", &r, 1, NULL),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "batch: missing required parameter 'n'");
	ck_assert_int_eq(cachew_dataset_batch(&d, r, 0, 0), CACHEW_ERANGE);
	ck_assert_int_eq(cachew_params_create(&p), CACHEW_OK);
	cachew_params_set_int(p, "size", 3);
	ck_assert_int_eq(cachew_dataset_apply(&d, "batch", &r, 1, p),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "batch: unknown parameter 'size' (parameters: n, drop_remainder, "
	    "parallel, deterministic)"));
	ck_assert_int_eq(cachew_dataset_apply(&d, "range", &r, 1, NULL),
	    CACHEW_EINVAL);
	ck_assert_int_eq(cachew_dataset_map(&d, r, "no_such_fn", NULL, 1),
	    CACHEW_ENOENT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "no_such_fn"));
	cachew_params_set_int(p, "valeu", 1);
	ck_assert_int_eq(cachew_dataset_map(&d, r, "add", p, 1), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "map(add): unknown parameter"));
	ck_assert_int_eq(cachew_dataset_range(&d, 0, 10, 0), CACHEW_EINVAL);
	cachew_params_destroy(p);
	cachew_dataset_release(r);
}
END_TEST

START_TEST(fingerprint_covers_data_not_speed)
{
	cachew_dataset *a, *b, *m1, *m2, *m3;
	cachew_fingerprint fa, fb, f1, f2, f3;
	cachew_params *p;
	char hex[33];

	ck_assert_int_eq(cachew_dataset_range(&a, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_range(&b, 0, 11, 1), CACHEW_OK);
	cachew_dataset_fingerprint(a, &fa);
	cachew_dataset_fingerprint(b, &fb);
	ck_assert(fa.hi != fb.hi || fa.lo != fb.lo);
	cachew_params_create(&p);
	cachew_params_set_int(p, "value", 2);
	ck_assert_int_eq(cachew_dataset_map(&m1, a, "add", p, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_map(&m2, a, "add", p, 4), CACHEW_OK);
	cachew_params_set_int(p, "value", 3);
	ck_assert_int_eq(cachew_dataset_map(&m3, a, "add", p, 1), CACHEW_OK);
	cachew_dataset_fingerprint(m1, &f1);
	cachew_dataset_fingerprint(m2, &f2);
	cachew_dataset_fingerprint(m3, &f3);
	ck_assert(f1.hi == f2.hi && f1.lo == f2.lo);
	ck_assert(f1.hi != f3.hi || f1.lo != f3.lo);
	cachew_fingerprint_hex(&f1, hex);
	ck_assert_uint_eq(strlen(hex), 32);
	ck_assert_uint_eq(strspn(hex, "0123456789abcdef"), 32);
	cachew_params_destroy(p);
	cachew_dataset_release(a);
	cachew_dataset_release(b);
	cachew_dataset_release(m1);
	cachew_dataset_release(m2);
	cachew_dataset_release(m3);
}
END_TEST

/* ---- iterators ------------------------------------------------------------------- */

static cachew_dataset *
range_map(int64_t n, const char *fn)
{
	cachew_dataset *r, *m;
	ck_assert_int_eq(cachew_dataset_range(&r, 0, n, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_map(&m, r, fn, NULL, 1), CACHEW_OK);
	cachew_dataset_release(r);
	return m;
}

START_TEST(map_error_stops_iterator_with_message)
{
	cachew_dataset *ds = range_map(100, "core_test_fail");
	cachew_iterator *it;
	cachew_element *e;
	cachew_options *o = cwt_opts(1, 1);
	int got = 0;
	cachew_err rv;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		ck_assert_int_eq(cwt_i64(e, 0), got);
		got++;
		cachew_element_release(e);
	}
	ck_assert_int_eq(rv, CACHEW_EOP);
	ck_assert_int_eq(got, 7);
	ck_assert_str_eq(cachew_iterator_errmsg(it),
	    "map(core_test_fail): seven is not allowed (element 7)");
	/* Errors are sticky. */
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOP);
	cachew_iterator_destroy(it);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
}
END_TEST

/* Whether s is well-formed UTF-8 (no truncated or stray sequence). */
static bool
utf8_valid(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p != 0) {
		size_t need = *p < 0x80 ? 0 : *p >= 0xF0 ? 3 : *p >= 0xE0 ? 2
		    : *p >= 0xC0 ? 1 : 9;
		if (need == 9)
			return false;
		p++;
		for (size_t i = 0; i < need; i++, p++)
			if ((*p & 0xC0) != 0x80)
				return false;
	}
	return true;
}

/* A message longer than its buffer, quoting UTF-8 (a function name of
 * 400 'é'), is cut at a character, not inside one: bindings decode
 * messages strictly (Python raised UnicodeDecodeError in place of the
 * error). Both parities of the prefix, so that one of them falls inside
 * a character at the cut. */
START_TEST(long_messages_stay_valid_utf8)
{
	for (int k = 0; k < 2; k++) {
		char pipeline[1024];
		int len = snprintf(pipeline, sizeof(pipeline),
		    "range(3) | map(fn=\"%s", k ? "x" : "");
		cachew_dataset *ds = NULL;

		for (int i = 0; i < 400; i++)
			len += snprintf(pipeline + len, sizeof(pipeline) - len,
			    "\xc3\xa9");
		snprintf(pipeline + len, sizeof(pipeline) - len, "\")");
		ck_assert_int_eq(cachew_dataset_parse(&ds, pipeline),
		    CACHEW_ENOENT);
		ck_assert_uint_ge(strlen(cachew_errmsg()), 300);
		ck_assert_msg(utf8_valid(cachew_errmsg()), "k=%d: %s", k,
		    cachew_errmsg());
	}
}
END_TEST

START_TEST(error_mid_chunk_delivers_the_elements_before_it)
{
	cachew_dataset *r, *m;
	cachew_iterator *it;
	cachew_element *e;
	char *s;
	cachew_element *got[16];
	size_t n = 0;
	cachew_err rv;

	/* The iterator pulls 1, 2, then 4 elements: 7 fails inside the chunk
	 * [6, 7, 8, 9], and 6 must still arrive before the error. */
	ck_assert_int_eq(cachew_dataset_range(&r, 3, 100, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_map(&m, r, "core_test_fail", NULL, 1),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, m, NULL), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK && n < 16)
		got[n++] = e;
	ck_assert_int_eq(rv, CACHEW_EOP);
	s = cwt_join_i64(got, n, 0);
	ck_assert_str_eq(s, "3,4,5,6");
	free(s);
	for (size_t i = 0; i < n; i++)
		cachew_element_release(got[i]);
	cachew_iterator_destroy(it);
	cachew_dataset_release(r);
	cachew_dataset_release(m);
}
END_TEST

/* Elements delivered before the pipeline's error, and the error. */
static size_t
count_before_error(const char *pipeline, cachew_err *err, char *msg,
    size_t len)
{
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_options *o = cwt_opts(1, 2);
	size_t n = 0;

	ck_assert_msg(cachew_dataset_parse(&ds, pipeline) == CACHEW_OK, "%s: %s",
	    pipeline, cachew_errmsg());
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while ((*err = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		ck_assert_int_eq(cwt_i64(e, 0), (int64_t)n + 3);
		cachew_element_release(e);
		n++;
	}
	snprintf(msg, len, "%s", cachew_iterator_errmsg(it));
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return n;
}

START_TEST(every_operator_delivers_the_elements_before_an_error)
{
	/* Values start at 3 so the failing 7 falls inside the consumer's
	 * third request [6, 7, 8, 9], not at a chunk boundary. */
	static const char *const pipelines[] = {
	    "range(3, 100) | map(core_test_fail)",
	    "range(3, 100) | map(core_test_fail, parallel=2)",
	    "range(3, 100) | filter(core_test_ffail)",
	    "range(3, 100) | map(core_test_fail) | shuffle(buffer=1)",
	    "range(3, 100) | map(core_test_fail) | zip(range(100))",
	    "range(3, 100) | map(core_test_fail) | prefetch(4)",
	    "range(3, 100) | map(core_test_fail) | take(50)",
	};
	char msg[512];
	cachew_err err;

	for (size_t i = 0; i < sizeof(pipelines) / sizeof(pipelines[0]); i++) {
		size_t n = count_before_error(pipelines[i], &err, msg,
		    sizeof(msg));
		ck_assert_msg(n == 4, "%s delivered %zu, not 4", pipelines[i], n);
		ck_assert_int_eq(err, CACHEW_EOP);
		ck_assert_ptr_nonnull(strstr(msg, "seven is not allowed"));
	}
}
END_TEST

START_TEST(a_function_returning_nothing_is_an_error)
{
	char msg[512];
	cachew_err err;
	size_t n;

	n = count_before_error("range(3, 10) | map(core_test_null)", &err, msg,
	    sizeof(msg));
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(err, CACHEW_EOP);
	ck_assert_str_eq(msg,
	    "map(core_test_null): returned no element (element 0)");
	n = count_before_error("range(3, 10) | map(core_test_null, parallel=2)",
	    &err, msg, sizeof(msg));
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(err, CACHEW_EOP);
}
END_TEST

static char *
run_bytes(const char *pipeline)
{
	cachew_element **v;
	size_t n, len, used = 0;
	char err[512], *s = calloc(1, 1 << 16);
	const void *p;

	ck_assert_msg(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)) ==
		CACHEW_OK, "%s: %s", pipeline, err);
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(cachew_tensor_bytes_at(
				     cachew_element_component(v[i], 0), 0, &p, &len),
		    CACHEW_OK);
		used += (size_t)snprintf(s + used, (1 << 16) - used, "%s[%.*s]",
		    i ? "," : "", (int)len, (const char *)p);
	}
	cwt_free(v, n);
	return s;
}

START_TEST(text_lines_strip_a_final_carriage_return)
{
	char *dir = cwt_tmpdir(), path[256], pipeline[512], *s;

	snprintf(path, sizeof(path), "%s/crlf.txt", dir);
	cwt_write_file(path, "a\r\nb\r", 5);
	snprintf(pipeline, sizeof(pipeline), "text_lines(\"%s\")", path);
	s = run_bytes(pipeline);
	ck_assert_str_eq(s, "[a],[b]");
	free(s);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(read_file_reads_procfs_files_of_size_zero)
{
	char *s = run_bytes("from_tensors(\"/proc/self/status\") | read_file");
	ck_assert_ptr_nonnull(strstr(s, "Name:"));
	free(s);
}
END_TEST

static void
fp_of(const char *pipeline, cachew_fingerprint *fp)
{
	cachew_dataset *ds;
	ck_assert_msg(cachew_dataset_parse(&ds, pipeline) == CACHEW_OK, "%s: %s",
	    pipeline, cachew_errmsg());
	ck_assert_int_eq(cachew_dataset_fingerprint(ds, fp), CACHEW_OK);
	cachew_dataset_release(ds);
}

START_TEST(fingerprint_identifies_files_not_spellings)
{
	char *dir = cwt_tmpdir(), path[256], p1[512], p2[512], p3[512];
	cachew_fingerprint a, b, c;

	snprintf(path, sizeof(path), "%s/f.txt", dir);
	cwt_write_file(path, "x\ny\n", 4);
	snprintf(p1, sizeof(p1), "text_lines(\"%s/f.txt\")", dir);
	snprintf(p2, sizeof(p2), "text_lines([\"%s/./f.txt\"])", dir);
	snprintf(p3, sizeof(p3), "text_lines(\"%s/f*.txt\")", dir);
	fp_of(p1, &a);
	fp_of(p2, &b);
	fp_of(p3, &c);
	ck_assert(a.hi == b.hi && a.lo == b.lo);
	ck_assert(a.hi == c.hi && a.lo == c.lo);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(touching_a_file_keeps_seeded_orders)
{
	char *dir = cwt_tmpdir(), path[256], pipeline[512], *s1, *s2;
	cachew_fingerprint f1, f2;
	struct timespec times[2] = {{1000000000, 0}, {1000000000, 0}};

	snprintf(path, sizeof(path), "%s/n.txt", dir);
	cwt_write_file(path, "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", 21);
	snprintf(pipeline, sizeof(pipeline),
	    "text_lines(\"%s\") | shuffle(buffer=10, seed=42)", path);
	fp_of(pipeline, &f1);
	s1 = run_bytes(pipeline);
	ck_assert_int_eq(utimensat(AT_FDCWD, path, times, 0), 0);
	fp_of(pipeline, &f2);
	ck_assert(f1.hi != f2.hi || f1.lo != f2.lo); /* the data may differ */
	s2 = run_bytes(pipeline);
	ck_assert_str_eq(s1, s2); /* but seeds do not follow mtimes */
	ck_assert_str_ne(s1, "[1],[2],[3],[4],[5],[6],[7],[8],[9],[10]");
	free(s1);
	free(s2);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(end_of_sequence_is_sticky)
{
	cachew_dataset *ds = range_map(3, "add");
	cachew_iterator *it;
	cachew_element *e;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int i = 1; i <= 3; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), i);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOF);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOF);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}
END_TEST

static int64_t
first_random(int64_t seed, int64_t index)
{
	cachew_dataset *ds = range_map(index + 1, "core_test_seed");
	cachew_options *o = cwt_opts(seed, 1);
	cachew_element **v;
	size_t n;
	int64_t r;

	ck_assert_int_eq(cwt_run_ds(ds, o, &v, &n, NULL, 0), CACHEW_OK);
	ck_assert_uint_eq(n, (size_t)index + 1);
	r = cwt_i64(v[index], 0);
	cwt_free(v, n);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
	return r;
}

START_TEST(random_streams_follow_seed_and_index)
{
	int64_t a = first_random(5, 3), b = first_random(5, 3);
	int64_t c = first_random(6, 3), d = first_random(5, 4);
	ck_assert_int_eq(a, b);
	ck_assert_int_ne(a, c);
	ck_assert_int_ne(a, d);
}
END_TEST

START_TEST(stats_count_every_node)
{
	cachew_dataset *m = range_map(100, "add"), *b;
	cachew_iterator *it;
	cachew_element *e;
	cachew_op_stats st[4];
	size_t n;

	ck_assert_int_eq(cachew_dataset_batch(&b, m, 10, 0), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, b, NULL), CACHEW_OK);
	while (cachew_iterator_next(it, &e) == CACHEW_OK)
		cachew_element_release(e);
	ck_assert_int_eq(cachew_iterator_stats(it, st, 4, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(st[0].name, "range");
	ck_assert_str_eq(st[1].name, "map");
	ck_assert_str_eq(st[1].detail, "add");
	ck_assert_str_eq(st[2].name, "batch");
	ck_assert_uint_eq(st[0].elements, 100);
	ck_assert_uint_eq(st[1].elements, 100);
	ck_assert_uint_eq(st[2].elements, 10);
	ck_assert_uint_eq(st[2].bytes, 800);
	ck_assert_int_eq(st[2].node, 2);
	cachew_iterator_destroy(it);
	cachew_dataset_release(m);
	cachew_dataset_release(b);
}
END_TEST

/* Nobody listens at the service address: bounded retries, then an error
 * naming it (check_cluster.c covers a live service). */
START_TEST(unreachable_service_fails_with_its_address)
{
	cachew_dataset *ds = range_map(3, "add");
	cachew_options *o;
	cachew_iterator *it = NULL;
	cachew_element *e;
	cachew_err rv;

	cachew_options_create(&o);
	cachew_options_set_str(o, "service", "tcp://127.0.0.1:1");
	cachew_options_set_int(o, "service_timeout_ms", 300);
	rv = cachew_iterator_create(&it, ds, o);
	if (rv == CACHEW_OK) {
		rv = cachew_iterator_next(it, &e);
		ck_assert_ptr_nonnull(strstr(cachew_iterator_errmsg(it),
		    "tcp://127.0.0.1:1"));
		cachew_iterator_destroy(it);
	} else {
		ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
		    "tcp://127.0.0.1:1"));
	}
	ck_assert(rv == CACHEW_EIO || rv == CACHEW_ETIMEDOUT ||
	    rv == CACHEW_ECLOSED);
	cachew_options_destroy(o);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(batch_stacks_exact_values)
{
	cachew_dataset *m = range_map(10, "add"), *b;
	cachew_element **v;
	size_t n;
	char *s;

	ck_assert_int_eq(cachew_dataset_batch(&b, m, 4, 0), CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(b, NULL, &v, &n, NULL, 0), CACHEW_OK);
	s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "[1 2 3 4],[5 6 7 8],[9 10]");
	free(s);
	cwt_free(v, n);
	cachew_dataset_release(b);
	cachew_dataset_release(m);
}
END_TEST

/* ---- buffers that map a file ------------------------------------------------ */

/* A mapped buffer views the file's bytes from any offset; once the file
 * shrank, the kernel's reads of the mapping (a write into a pipe, as a
 * socket send does) fail with EFAULT rather than raise SIGBUS, and a copy
 * (what a compressor takes: cwi_element_unmap) fails with an error naming
 * the offset. Before that, an unmapped element holds the same bytes in a
 * buffer of its own. */
START_TEST(mapped_buffer_views_a_file_and_fails_cleanly_once_it_shrank)
{
	char *d = cwt_tmpdir();
	char *path = cwt_fmt("%s/m.bin", d);
	size_t size = 3 * 4096 + 100, off = 5000, len = size - off;
	uint8_t *data = malloc(size);
	cwi_buffer *b, *c;
	cwi_map_file *mf;
	cwi_element *e = cwi_element_new(1);
	int fd, pfd[2];

	for (size_t i = 0; i < size; i++)
		data[i] = (uint8_t)(i * 7 + i / 251);
	cwt_write_file(path, data, size);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(cwi_map_file_open(&mf, fd), CACHEW_OK);
	close(fd); /* the map file keeps its own descriptor */
	ck_assert_int_eq(cwi_buffer_map_file(&b, mf, off, len), CACHEW_OK);
	cwi_map_file_unref(mf); /* the buffer keeps a reference */
	ck_assert(cwi_buffer_mapped(b));
	ck_assert_uint_eq(b->size, len);
	ck_assert_int_eq(memcmp(b->data, data + off, len), 0);
	ck_assert_int_eq(cwi_buffer_map_copy(&c, b, 10, 4096), CACHEW_OK);
	ck_assert(!cwi_buffer_mapped(c));
	ck_assert_int_eq(memcmp(c->data, data + off + 10, 4096), 0);
	cwi_buffer_unref(c);
	ck_assert_int_eq(cwi_buffer_map_copy(&c, b, len - 1, 2),
	    CACHEW_ERANGE);

	/* A record viewing the mapping, unmapped: its own bytes. */
	cwi_tensor_init_bytes_view(&e->comp[0], b, 100, 3000);
	cwi_element_retain(e);
	cwi_element *u = e;
	ck_assert_int_eq(cwi_element_unmap(&u), CACHEW_OK);
	ck_assert_ptr_ne(u, e); /* e was shared: u is a clone */
	ck_assert(!cwi_buffer_mapped(u->comp[0].buf));
	ck_assert(cwi_buffer_mapped(e->comp[0].buf));
	const void *rec;
	size_t rlen;
	ck_assert_int_eq(cachew_tensor_bytes_at(&u->comp[0], 0, &rec, &rlen),
	    CACHEW_OK);
	ck_assert_uint_eq(rlen, 3000);
	ck_assert_int_eq(memcmp(rec, data + off + 100, 3000), 0);
	cwi_element_release(u);

	/* The file shrinks under the mapping. */
	ck_assert_int_eq(truncate(path, 4096), 0);
	ck_assert_int_eq(pipe(pfd), 0);
	errno = 0;
	ck_assert_int_eq(write(pfd[1], b->data + 4096, 4096), -1);
	ck_assert_int_eq(errno, EFAULT);
	close(pfd[0]);
	close(pfd[1]);
	u = e;
	ck_assert_int_eq(cwi_element_unmap(&u), CACHEW_ECORRUPT);
	ck_assert_ptr_null(u); /* released with the error */
	ck_assert_str_eq(cachew_errmsg(), "the file ends at byte offset 5100, "
	    "inside records already read (it is shorter than when it was "
	    "opened)");
	cwi_buffer_unref(b);
	free(data);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

Suite *
cwt_core_suite(void)
{
	Suite *s = suite_create("core");
	TCase *tc = tcase_create("core");

	tcase_add_unchecked_fixture(tc, core_setup, NULL);
	tcase_add_checked_fixture(tc, core_setup, NULL);
	tcase_add_test(tc, version_matches_header);
	tcase_add_test(tc, strerror_names_every_code);
	tcase_add_test(tc, strbuf_finished_empty_is_an_empty_string);
	tcase_add_test(tc, dtype_names_round_trip);
	tcase_add_test(tc, tensor_create_is_zeroed_and_shaped);
	tcase_add_test(tc, tensor_retain_shares_the_buffer);
	tcase_add_test(tc, tensor_copy_and_destroy_still_retain_and_release);
	tcase_add_test(tc, tensor_rejects_bad_shapes);
	tcase_add_test(tc, tensor_wrap_frees_after_last_view);
	tcase_add_test(tc,
	    mapped_buffer_views_a_file_and_fails_cleanly_once_it_shrank);
	tcase_add_test(tc, tensor_slice_checks_bounds);
	tcase_add_test(tc, bytes_tensor_holds_strings_and_slices);
	tcase_add_test(tc, element_set_and_read_components);
	tcase_add_test(tc, shared_element_is_immutable);
	tcase_add_test(tc, mutable_data_copies_shared_buffers);
	tcase_add_test(tc, compact_copies_small_views_of_big_blocks);
	tcase_add_test(tc, freed_batch_buffer_survives_a_batch_of_freed_crops);
	tcase_add_test(tc, heap_release_keeps_recent_buffers_unless_all);
	tcase_add_test(tc, only_the_users_iterator_end_drops_the_reuse_list);
	tcase_add_test(tc, params_typed_get_and_set);
	tcase_add_test(tc, options_defaults_and_validation);
	tcase_add_test(tc, option_table_is_described);
	tcase_add_test(tc, register_rejects_bad_definitions);
	tcase_add_test(tc, registration_is_logged_to_the_sink);
	tcase_add_test(tc, register_takes_the_current_op_def_version);
	tcase_add_test(tc, register_takes_a_version_1_op_def_without_doc);
	tcase_add_test(tc, register_refuses_a_newer_op_def_version_naming_both);
	tcase_add_test(tc, register_refuses_an_unset_op_def_version);
	tcase_add_test(tc, register_refuses_a_garbage_version_without_reading_on);
	tcase_add_test(tc, apply_reports_bad_graphs);
	tcase_add_test(tc, fingerprint_covers_data_not_speed);
	tcase_add_test(tc, map_error_stops_iterator_with_message);
	tcase_add_test(tc, error_mid_chunk_delivers_the_elements_before_it);
	tcase_add_test(tc, every_operator_delivers_the_elements_before_an_error);
	tcase_add_test(tc, a_function_returning_nothing_is_an_error);
	tcase_add_test(tc, text_lines_strip_a_final_carriage_return);
	tcase_add_test(tc, read_file_reads_procfs_files_of_size_zero);
	tcase_add_test(tc, fingerprint_identifies_files_not_spellings);
	tcase_add_test(tc, touching_a_file_keeps_seeded_orders);
	tcase_add_test(tc, end_of_sequence_is_sticky);
	tcase_add_test(tc, random_streams_follow_seed_and_index);
	tcase_add_test(tc, stats_count_every_node);
	tcase_add_test(tc, unreachable_service_fails_with_its_address);
	tcase_add_test(tc, batch_stacks_exact_values);
	tcase_add_test(tc, long_messages_stay_valid_utf8);
	suite_add_tcase(s, tc);
	return s;
}
