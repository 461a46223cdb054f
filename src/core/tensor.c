/*
 * tensor.c - dtypes, refcounted buffers and tensor values.
 *
 * Buffers are shared through atomic reference counts and are immutable
 * once shared. One lock: bigbuf_lock, around the list of large buffers
 * kept for reuse (never held while calling out).
 */
#include "core.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
	const char *name;
	size_t size;
} dtypes[] = {
	[CACHEW_INVALID] = {NULL, 0},
	[CACHEW_U8] = {"u8", 1},
	[CACHEW_I32] = {"i32", 4},
	[CACHEW_I64] = {"i64", 8},
	[CACHEW_F16] = {"f16", 2},
	[CACHEW_BF16] = {"bf16", 2},
	[CACHEW_F32] = {"f32", 4},
	[CACHEW_F64] = {"f64", 8},
	[CACHEW_BOOL] = {"bool", 1},
	[CACHEW_BYTES] = {"bytes", 0},
};

#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const char *
cachew_dtype_name(cachew_dtype dtype)
{
	return (unsigned)dtype < NDTYPES ? dtypes[dtype].name : NULL;
}

size_t
cachew_dtype_size(cachew_dtype dtype)
{
	return (unsigned)dtype < NDTYPES ? dtypes[dtype].size : 0;
}

cachew_err
cachew_dtype_from_name(const char *name, cachew_dtype *out)
{
	for (unsigned i = 1; i < NDTYPES; i++) {
		if (strcmp(name, dtypes[i].name) == 0) {
			*out = (cachew_dtype)i;
			return CACHEW_OK;
		}
	}
	/* Accept the long spellings users know from numpy and torch. */
	static const struct {
		const char *alias;
		cachew_dtype dt;
	} aliases[] = {{"uint8", CACHEW_U8}, {"int32", CACHEW_I32},
	    {"int64", CACHEW_I64}, {"float16", CACHEW_F16},
	    {"bfloat16", CACHEW_BF16}, {"float32", CACHEW_F32},
	    {"float64", CACHEW_F64}, {"string", CACHEW_BYTES}};
	for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
		if (strcmp(name, aliases[i].alias) == 0) {
			*out = aliases[i].dt;
			return CACHEW_OK;
		}
	}
	return cwi_fail(CACHEW_EINVAL,
	    "unknown dtype '%s' (expected u8, i32, i64, f16, bf16, f32, f64, "
	    "bool or bytes)",
	    name);
}

/* ---- buffers ----------------------------------------------------------- */

#define BUF_ALIGN 64

/*
 * Large buffers (BIGBUF_MIN and up) are mappings of their own, never
 * glibc's heap. glibc's mmap threshold is adaptive: once a mapped block
 * of n bytes is freed, blocks up to n come from the arenas, and a process
 * has an arena per thread (up to 8 per core). An element allocated on an
 * executor thread and freed on the consumer's goes back to the executor
 * thread's arena, whose free pages are kept as fragments between live
 * blocks: W2 read through Python for 20 epochs grew its RSS by 15-21 %
 * (MALLOC_ARENA_MAX=1 or a fixed 64 KiB threshold kept it flat). A
 * mapping goes back whole on munmap, whichever thread frees it, and
 * leaves glibc's threshold alone. (The process-wide tuning that also
 * cured it, one arena and 64 MiB thresholds, belongs to the daemons:
 * cwi_nng_heap_tune.)
 *
 * Freed large buffers are kept for reuse. Pipelines allocate the same
 * large sizes over and over (a 224x224x3 crop, a batch of 64 of them),
 * and a fresh mapping is page-faulted in again, zero-filled page by page:
 * a quarter of W2's CPU time. A few recently freed buffers (bounded in
 * count and bytes, oldest evicted) are handed back out when one fits
 * within 25 %. A buffer nobody took within BIGBUF_AGE_NS is unmapped: a
 * hot allocate-free cycle takes it back within milliseconds, and one left
 * from a burst (a client's first large replies, a hostile peer's buffers)
 * would otherwise stay until others pushed it out, up to 256 MiB held
 * for nothing. The list has room for more than a batch's worth of
 * elements: batch(64) frees its 64 crops at once, and with 32 slots they
 * pushed out the freed 38.5 MB f32 batch and half of themselves, so W2
 * page-faulted every batch and 34 crops of 64 in again (394,000 faults,
 * 13 % of its CPU time at one thread; 20,000 with 128 slots). Sanitizer
 * builds and runs under valgrind keep none and allocate every buffer
 * with malloc, where they check its bounds.
 */
#define BIGBUF_MIN ((size_t)64 << 10)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BIGBUF_SLOTS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BIGBUF_SLOTS 0
#endif
#endif
#ifndef BIGBUF_SLOTS
#define BIGBUF_SLOTS 128
#endif
#define BIGBUF_MAX_BYTES ((size_t)256 << 20)
#define BIGBUF_AGE_NS (UINT64_C(1000000000))

/* The header is padded to the alignment so data is 64-byte aligned too. */
#define BUF_HDR ((sizeof(cwi_buffer) + BUF_ALIGN - 1) & ~(size_t)(BUF_ALIGN - 1))

/* Returns b's memory to the system, whichever way it was allocated. */
static void
buffer_release(cwi_buffer *b)
{
	if (b->map_bytes > 0)
		(void)munmap(b, b->map_bytes);
	else
		free(b);
}

#if BIGBUF_SLOTS > 0
static pthread_once_t bigbuf_once = PTHREAD_ONCE_INIT;
static size_t bigbuf_page; /* 0: large buffers come from malloc */

/* glibc raises its mmap threshold to the size of a mapped block that is
 * freed, and its trim threshold to twice that (mallopt(3), "dynamic
 * mmap threshold"): a program that frees one large malloc'd buffer stops
 * returning the top of its heap to the system after every burst of small
 * frees. Since large buffers are mappings of their own here, glibc never
 * sees one freed, stays at its 128 KiB default, and trims and page-faults
 * its heap top again for every batch of small elements (W3's 256 padded
 * rows: 302,000 page faults in 130 MB of text, 17 % of its time, against
 * 1,400 with a 2 MiB trim threshold). One 1 MiB block allocated and freed
 * through malloc moves glibc where any program that freed one would be;
 * it changes nothing where the thresholds are already higher or were set
 * with mallopt (which turns the adjustment off), and leaves the
 * adjustment on, unlike setting them. */
#define BIGBUF_GLIBC_NUDGE ((size_t)1 << 20)

static void
bigbuf_init(void)
{
	long page = sysconf(_SC_PAGESIZE);

	if (page > 0 && !RUNNING_ON_VALGRIND) {
		volatile uint8_t *p = malloc(BIGBUF_GLIBC_NUDGE);

		bigbuf_page = (size_t)page;
		if (p != NULL) {
			p[0] = 0; /* a use, so the pair is not elided */
			free((void *)p);
		}
	}
}

/* A new large buffer of its own mapping with room for cap bytes, its
 * capacity the whole mapping; NULL when mappings are not used or the
 * system refuses one (the caller then tries malloc, which says so). */
static cwi_buffer *
bigbuf_map(size_t cap)
{
	size_t len;
	void *p;
	cwi_buffer *b;

	pthread_once(&bigbuf_once, bigbuf_init);
	if (bigbuf_page == 0 || cap > SIZE_MAX - BUF_HDR - bigbuf_page)
		return NULL;
	len = (BUF_HDR + cap + bigbuf_page - 1) & ~(bigbuf_page - 1);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	    -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	b = p;
	b->map_bytes = len;
	b->capacity = len - BUF_HDR;
	return b;
}

static pthread_mutex_t bigbuf_lock = PTHREAD_MUTEX_INITIALIZER;
static cwi_buffer *bigbuf[BIGBUF_SLOTS]; /* oldest first */
static uint64_t bigbuf_at[BIGBUF_SLOTS]; /* when each was put */
static size_t bigbuf_n, bigbuf_bytes;

static void
bigbuf_remove_locked(size_t i)
{
	bigbuf_bytes -= bigbuf[i]->capacity;
	memmove(&bigbuf[i], &bigbuf[i + 1],
	    (bigbuf_n - i - 1) * sizeof(bigbuf[0]));
	memmove(&bigbuf_at[i], &bigbuf_at[i + 1],
	    (bigbuf_n - i - 1) * sizeof(bigbuf_at[0]));
	bigbuf_n--;
}

/* Moves the oldest buffers into evict (BIGBUF_SLOTS entries): those put
 * before `before`, and then as many as it takes for `room` more bytes and
 * a free slot (room 0: none needed). Returns how many. */
static size_t
bigbuf_evict_locked(uint64_t before, size_t room, cwi_buffer **evict)
{
	size_t n = 0;

	while (bigbuf_n > 0 &&
	       (bigbuf_at[0] < before ||
		   (room > 0 && (bigbuf_n == BIGBUF_SLOTS ||
				    bigbuf_bytes + room > BIGBUF_MAX_BYTES)))) {
		evict[n++] = bigbuf[0];
		bigbuf_remove_locked(0);
	}
	return n;
}

/* Buffers put before this are stale. */
static uint64_t
bigbuf_stale(uint64_t now)
{
	return now > BIGBUF_AGE_NS ? now - BIGBUF_AGE_NS : 0;
}

static void
bigbuf_free(cwi_buffer **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		buffer_release(v[i]);
}

static cwi_buffer *
bigbuf_take(size_t size)
{
	cwi_buffer *b = NULL, *evict[BIGBUF_SLOTS];
	size_t best = 0, nevict;

	pthread_mutex_lock(&bigbuf_lock);
	nevict = bigbuf_evict_locked(bigbuf_stale(cwi_now_ns()), 0, evict);
	/* Newest first: of equal fits the last one freed, whose pages are
	 * the likeliest still in this core's cache. */
	for (size_t i = bigbuf_n; i-- > 0;) {
		size_t cap = bigbuf[i]->capacity;
		if (cap >= size && cap - size <= size / 4 &&
		    (b == NULL || cap < b->capacity)) {
			b = bigbuf[i];
			best = i;
		}
	}
	if (b != NULL)
		bigbuf_remove_locked(best);
	pthread_mutex_unlock(&bigbuf_lock);
	bigbuf_free(evict, nevict);
	return b;
}

/* Keeps b for reuse; returns false (b to be freed) when it cannot. */
static bool
bigbuf_put(cwi_buffer *b)
{
	cwi_buffer *evict[BIGBUF_SLOTS];
	uint64_t now = cwi_now_ns();
	size_t nevict;

	if (b->capacity > BIGBUF_MAX_BYTES / 4)
		return false;
	pthread_mutex_lock(&bigbuf_lock);
	nevict = bigbuf_evict_locked(bigbuf_stale(now), b->capacity, evict);
	bigbuf_at[bigbuf_n] = now;
	bigbuf[bigbuf_n++] = b;
	bigbuf_bytes += b->capacity;
	pthread_mutex_unlock(&bigbuf_lock);
	bigbuf_free(evict, nevict);
	return true;
}
#endif

/* Frees the kept buffers put before `before` (UINT64_MAX: all). */
static void
buffer_cache_evict(uint64_t before)
{
#if BIGBUF_SLOTS > 0
	cwi_buffer *evict[BIGBUF_SLOTS];
	size_t nevict;

	pthread_mutex_lock(&bigbuf_lock);
	nevict = bigbuf_evict_locked(before, 0, evict);
	pthread_mutex_unlock(&bigbuf_lock);
	bigbuf_free(evict, nevict);
#else
	(void)before;
#endif
}

void
cwi_buffer_cache_drop(void)
{
	buffer_cache_evict(UINT64_MAX);
}

void
cwi_buffer_cache_trim(void)
{
#if BIGBUF_SLOTS > 0
	buffer_cache_evict(bigbuf_stale(cwi_now_ns()));
#endif
}

cachew_err
cwi_buffer_alloc(cwi_buffer **out, size_t size, bool zero)
{
	size_t cap;
	cwi_buffer *b = NULL;
	bool zeroed = false;

	if (size > SIZE_MAX - BUF_HDR - BUF_ALIGN)
		return cwi_fail(CACHEW_ENOMEM, "buffer of %zu bytes is too large",
		    size);
	cap = (size + BUF_ALIGN - 1) & ~(size_t)(BUF_ALIGN - 1);
#if BIGBUF_SLOTS > 0
	if (size >= BIGBUF_MIN) {
		b = bigbuf_take(size);
		if (b == NULL) {
			b = bigbuf_map(cap);
			zeroed = b != NULL; /* fresh anonymous pages */
		}
	}
#endif
	if (b == NULL) {
		b = aligned_alloc(BUF_ALIGN, BUF_HDR + cap);
		if (b == NULL)
			return cwi_fail(CACHEW_ENOMEM,
			    "out of memory allocating %zu bytes", size);
		b->capacity = cap;
		b->map_bytes = 0;
	}
	atomic_init(&b->refs, 1);
	b->size = size;
	b->data = (uint8_t *)b + BUF_HDR;
	b->free_fn = NULL;
	b->free_ctx = NULL;
	if (zero && !zeroed)
		memset(b->data, 0, size);
	*out = b;
	return CACHEW_OK;
}

cachew_err
cwi_buffer_wrap(cwi_buffer **out, void *data, size_t size,
    void (*free_fn)(void *ctx, void *data), void *ctx)
{
	cwi_buffer *b = malloc(sizeof(*b));
	if (b == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	atomic_init(&b->refs, 1);
	b->size = size;
	b->capacity = 0; /* never reused: its memory is the caller's */
	b->map_bytes = 0;
	b->data = data;
	b->free_fn = free_fn;
	b->free_ctx = ctx;
	*out = b;
	return CACHEW_OK;
}

static void
buffer_noop_free(void *ctx, void *data)
{
	(void)ctx;
	(void)data;
}

void
cwi_buffer_unref_slow(cwi_buffer *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (b->free_fn != NULL) {
		b->free_fn(b->free_ctx, b->data);
	}
#if BIGBUF_SLOTS > 0
	else if (b->capacity >= BIGBUF_MIN && bigbuf_put(b)) {
		return;
	}
#endif
	buffer_release(b);
}

/* ---- tensor values ----------------------------------------------------- */

int64_t
cwi_shape_numel(unsigned rank, const int64_t *shape)
{
	int64_t n = 1;
	for (unsigned i = 0; i < rank; i++)
		n *= shape[i];
	return n;
}

/* Checks rank and dims, and that numel * elsize fits in size_t. */
static cachew_err
check_shape(unsigned rank, const int64_t *shape, size_t elsize, size_t *nbytes)
{
	uint64_t n = 1;

	if (rank > CACHEW_MAX_RANK)
		return cwi_fail(CACHEW_EINVAL, "rank %u exceeds the maximum of %d",
		    rank, CACHEW_MAX_RANK);
	for (unsigned i = 0; i < rank; i++) {
		if (shape[i] < 0)
			return cwi_fail(CACHEW_EINVAL,
			    "dimension %u is negative (%lld)", i,
			    (long long)shape[i]);
		if (shape[i] != 0 && n > (UINT64_MAX >> 1) / (uint64_t)shape[i])
			return cwi_fail(CACHEW_ERANGE, "shape is too large");
		n *= (uint64_t)shape[i];
	}
	if (elsize != 0 && n > (SIZE_MAX >> 1) / elsize)
		return cwi_fail(CACHEW_ERANGE, "shape is too large");
	*nbytes = (size_t)n * elsize;
	return CACHEW_OK;
}

const uint8_t cwi_dtype_sizes[16] = {
    [CACHEW_U8] = 1, [CACHEW_I32] = 4, [CACHEW_I64] = 8, [CACHEW_F16] = 2,
    [CACHEW_BF16] = 2, [CACHEW_F32] = 4, [CACHEW_F64] = 8, [CACHEW_BOOL] = 1};

size_t
cwi_tensor_nbytes_slow(const cwi_tensor *t)
{
	if (t->dtype == CACHEW_BYTES) {
		int64_t n = cwi_tensor_numel(t);
		const uint64_t *o = cwi_tensor_offsets(t);
		return (size_t)(o[n] - o[0]);
	}
	return (size_t)cwi_tensor_numel(t) * cwi_dtype_sizes[t->dtype & 15];
}

static void
tensor_reset(cwi_tensor *t, cachew_dtype dtype, unsigned rank,
    const int64_t *shape)
{
	memset(t, 0, sizeof(*t));
	t->dtype = (uint8_t)dtype;
	t->rank = (uint8_t)rank;
	for (unsigned i = 0; i < rank; i++)
		t->shape[i] = shape[i];
}

void
cwi_tensor_init_scalar(cwi_tensor *dst, cachew_dtype dtype, const void *v)
{
	tensor_reset(dst, dtype, 0, NULL);
	memcpy(dst->inl.b, v, cachew_dtype_size(dtype));
}

void
cwi_tensor_init_f64(cwi_tensor *dst, double v)
{
	tensor_reset(dst, CACHEW_F64, 0, NULL);
	memcpy(dst->inl.b, &v, sizeof(v));
}

cachew_err
cwi_tensor_init_alloc(cwi_tensor *dst, cachew_dtype dtype, unsigned rank,
    const int64_t *shape, bool zero, uint8_t **data)
{
	size_t es = cachew_dtype_size(dtype);
	size_t nbytes;
	cachew_err rv;

	if (es == 0)
		return cwi_fail(CACHEW_EINVAL,
		    "a fixed-width dtype is required, not %s",
		    dtype == CACHEW_BYTES ? "bytes" : "an invalid dtype");
	rv = check_shape(rank, shape, es, &nbytes);
	if (rv != CACHEW_OK)
		return rv;
	tensor_reset(dst, dtype, rank, shape);
	if (nbytes <= CWI_INLINE_BYTES) {
		*data = dst->inl.b;
		return CACHEW_OK;
	}
	rv = cwi_buffer_alloc(&dst->buf, nbytes, zero);
	if (rv != CACHEW_OK) {
		tensor_reset(dst, CACHEW_I64, 0, NULL);
		return rv;
	}
	*data = dst->buf->data;
	return CACHEW_OK;
}

void
cwi_tensor_init_bytes_view(
    cwi_tensor *dst, cwi_buffer *buf, size_t start, size_t len)
{
	tensor_reset(dst, CACHEW_BYTES, 0, NULL);
	dst->buf = cwi_buffer_ref(buf);
	dst->inl.u64[0] = start;
	dst->inl.u64[1] = start + len;
}

cachew_err
cwi_tensor_init_bytes_copy(cwi_tensor *dst, const void *data, size_t len)
{
	cwi_buffer *b;
	cachew_err rv = cwi_buffer_alloc(&b, len, false);
	if (rv != CACHEW_OK)
		return rv;
	if (len > 0)
		memcpy(b->data, data, len);
	cwi_tensor_init_bytes_view(dst, b, 0, len);
	cwi_buffer_unref(b);
	return CACHEW_OK;
}

cachew_err
cwi_tensor_init_bytes_list(cwi_tensor *dst, unsigned rank,
    const int64_t *shape, const void *const *items, const size_t *lens)
{
	size_t n, total = 0;
	cwi_buffer *data = NULL, *offs = NULL;
	cachew_err rv;
	uint64_t *o;

	rv = check_shape(rank, shape, 1, &n);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = 0; i < n; i++) {
		if (lens[i] > SIZE_MAX / 2 - total)
			return cwi_fail(CACHEW_ERANGE, "strings are too large");
		total += lens[i];
	}
	rv = cwi_buffer_alloc(&data, total, false);
	if (rv != CACHEW_OK)
		return rv;
	tensor_reset(dst, CACHEW_BYTES, rank, shape);
	if (n <= 1) {
		o = dst->inl.u64;
	} else {
		rv = cwi_buffer_alloc(&offs, (n + 1) * sizeof(uint64_t), false);
		if (rv != CACHEW_OK) {
			cwi_buffer_unref(data);
			tensor_reset(dst, CACHEW_I64, 0, NULL);
			return rv;
		}
		o = (uint64_t *)offs->data;
	}
	o[0] = 0;
	for (size_t i = 0; i < n; i++) {
		if (lens[i] > 0)
			memcpy(data->data + o[i], items[i], lens[i]);
		o[i + 1] = o[i] + lens[i];
	}
	if (n == 0)
		o[1] = 0;
	dst->buf = data;
	dst->obuf = offs;
	return CACHEW_OK;
}

void
cwi_tensor_copy(cwi_tensor *dst, const cwi_tensor *src)
{
	*dst = *src;
	dst->heap = 0;
	cwi_buffer_ref(dst->buf);
	cwi_buffer_ref(dst->obuf);
}

void
cwi_tensor_clear(cwi_tensor *t)
{
	cwi_buffer_unref(t->buf);
	cwi_buffer_unref(t->obuf);
	tensor_reset(t, CACHEW_I64, 0, NULL);
}

cachew_err
cwi_tensor_slice(
    cwi_tensor *dst, const cwi_tensor *src, int64_t start, int64_t count)
{
	int64_t rows, row_numel = 1;

	if (src->rank == 0)
		return cwi_fail(CACHEW_ETYPE, "cannot slice a rank-0 tensor");
	rows = src->shape[0];
	if (start < 0 || count < 0 || start > rows || count > rows - start)
		return cwi_fail(CACHEW_ERANGE,
		    "slice [%lld, %lld) is outside dimension 0 of size %lld",
		    (long long)start, (long long)(start + count),
		    (long long)rows);
	for (unsigned i = 1; i < src->rank; i++)
		row_numel *= src->shape[i];

	cwi_tensor out;
	memset(&out, 0, sizeof(out));
	out.dtype = src->dtype;
	out.rank = src->rank;
	memcpy(out.shape, src->shape, sizeof(out.shape));
	out.shape[0] = count;

	if (src->dtype == CACHEW_BYTES) {
		const uint64_t *o = cwi_tensor_offsets(src);
		int64_t first = start * row_numel, n = count * row_numel;
		out.buf = cwi_buffer_ref(src->buf);
		if (n <= 1) {
			out.inl.u64[0] = o[first];
			out.inl.u64[1] = o[first + n];
		} else {
			/* n >= 2 implies src had numel >= 2, so src->obuf. */
			out.obuf = cwi_buffer_ref(src->obuf);
			out.ooff = src->ooff + (size_t)first;
		}
		*dst = out;
		return CACHEW_OK;
	}

	size_t es = cachew_dtype_size(src->dtype);
	size_t row_bytes = (size_t)row_numel * es;
	size_t nbytes = (size_t)count * row_bytes;
	const uint8_t *from = cwi_tensor_data(src) + (size_t)start * row_bytes;
	if (src->buf == NULL || nbytes <= CWI_INLINE_BYTES) {
		/* Small: copy inline, no reference to keep. */
		memcpy(out.inl.b, from, nbytes);
	} else {
		out.buf = cwi_buffer_ref(src->buf);
		out.off = src->off + (size_t)start * row_bytes;
	}
	*dst = out;
	return CACHEW_OK;
}

cachew_err
cwi_tensor_make_mutable(cwi_tensor *t, uint8_t **data)
{
	size_t nbytes;
	cwi_buffer *b;
	cachew_err rv;

	if (t->dtype == CACHEW_BYTES)
		return cwi_fail(CACHEW_ETYPE, "bytes tensors are not mutable");
	if (t->buf == NULL) {
		*data = t->inl.b;
		return CACHEW_OK;
	}
	if (cwi_buffer_unique(t->buf) && t->buf->free_fn == NULL) {
		*data = t->buf->data + t->off;
		return CACHEW_OK;
	}
	nbytes = cwi_tensor_nbytes(t);
	rv = cwi_buffer_alloc(&b, nbytes, false);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(b->data, cwi_tensor_data(t), nbytes);
	cwi_buffer_unref(t->buf);
	t->buf = b;
	t->off = 0;
	*data = b->data;
	return CACHEW_OK;
}

bool
cwi_tensor_equal(const cwi_tensor *a, const cwi_tensor *b)
{
	if (!cwi_tensor_same_spec(a, b))
		return false;
	if (a->dtype == CACHEW_BYTES) {
		int64_t n = cwi_tensor_numel(a);
		for (int64_t i = 0; i < n; i++) {
			size_t la, lb;
			const uint8_t *pa = cwi_tensor_str(a, i, &la);
			const uint8_t *pb = cwi_tensor_str(b, i, &lb);
			if (la != lb || (la > 0 && memcmp(pa, pb, la) != 0))
				return false;
		}
		return true;
	}
	return memcmp(cwi_tensor_data(a), cwi_tensor_data(b),
		   cwi_tensor_nbytes(a)) == 0;
}

const char *
cwi_tensor_spec_str(const cwi_tensor *t, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "%s[",
	    cachew_dtype_name((cachew_dtype)t->dtype) != NULL
		? cachew_dtype_name((cachew_dtype)t->dtype)
		: "?");
	for (unsigned i = 0; i < t->rank && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, i ? ",%lld" : "%lld",
		    (long long)t->shape[i]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
	return buf;
}

/* ---- public tensor handles --------------------------------------------- */

static cachew_err
tensor_handle(cachew_tensor **out, cwi_tensor *value)
{
	cwi_tensor *t = malloc(sizeof(*t));
	if (t == NULL) {
		cwi_tensor_clear(value);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	*t = *value;
	t->heap = 1;
	*out = t;
	return CACHEW_OK;
}

cachew_dtype
cachew_tensor_dtype(const cachew_tensor *t)
{
	return (cachew_dtype)t->dtype;
}

unsigned
cachew_tensor_rank(const cachew_tensor *t)
{
	return t->rank;
}

const int64_t *
cachew_tensor_shape(const cachew_tensor *t)
{
	return t->shape;
}

int64_t
cachew_tensor_numel(const cachew_tensor *t)
{
	return cwi_tensor_numel(t);
}

size_t
cachew_tensor_nbytes(const cachew_tensor *t)
{
	return cwi_tensor_nbytes(t);
}

const void *
cachew_tensor_data(const cachew_tensor *t)
{
	if (t->dtype == CACHEW_BYTES)
		return t->buf != NULL ? t->buf->data + cwi_tensor_offsets(t)[0]
				      : NULL;
	return cwi_tensor_data(t);
}

cachew_err
cachew_tensor_bytes_at(
    const cachew_tensor *t, int64_t i, const void **data, size_t *len)
{
	if (t->dtype != CACHEW_BYTES)
		return cwi_fail(CACHEW_ETYPE, "tensor is %s, not bytes",
		    cachew_dtype_name((cachew_dtype)t->dtype));
	if (i < 0 || i >= cwi_tensor_numel(t))
		return cwi_fail(CACHEW_ERANGE, "index %lld out of range",
		    (long long)i);
	*data = cwi_tensor_str(t, i, len);
	return CACHEW_OK;
}

cachew_err
cachew_tensor_create(cachew_tensor **out, cachew_dtype dtype, unsigned rank,
    const int64_t *shape, void **data)
{
	cwi_tensor v;
	uint8_t *p;
	cachew_err rv = cwi_tensor_init_alloc(&v, dtype, rank, shape, true, &p);
	if (rv != CACHEW_OK)
		return rv;
	rv = tensor_handle(out, &v);
	if (rv != CACHEW_OK)
		return rv;
	/* Inline data moved with the value: point into the handle. */
	if (data != NULL)
		*data = (void *)cwi_tensor_data(*out);
	return CACHEW_OK;
}

cachew_err
cachew_tensor_wrap(cachew_tensor **out, cachew_dtype dtype, unsigned rank,
    const int64_t *shape, void *data, size_t nbytes,
    void (*free_fn)(void *ctx, void *data), void *ctx)
{
	size_t es = cachew_dtype_size(dtype), want;
	cwi_tensor v;
	cachew_err rv;

	if (es == 0)
		return cwi_fail(CACHEW_EINVAL, "wrap needs a fixed-width dtype");
	rv = check_shape(rank, shape, es, &want);
	if (rv != CACHEW_OK)
		return rv;
	if (want != nbytes)
		return cwi_fail(CACHEW_EINVAL,
		    "nbytes is %zu but the shape needs %zu", nbytes, want);
	/* Allocate the handle first: once the buffer owns `data`, a failure
	 * would free it, and the caller still owns it on failure. */
	cwi_tensor *t = malloc(sizeof(*t));
	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	tensor_reset(&v, dtype, rank, shape);
	rv = cwi_buffer_wrap(&v.buf, data, nbytes,
	    free_fn != NULL ? free_fn : buffer_noop_free, ctx);
	if (rv != CACHEW_OK) {
		free(t);
		return rv;
	}
	*t = v;
	t->heap = 1;
	*out = t;
	return CACHEW_OK;
}

cachew_err
cachew_tensor_create_bytes(cachew_tensor **out, unsigned rank,
    const int64_t *shape, const void *const *items, const size_t *lens)
{
	cwi_tensor v;
	cachew_err rv = cwi_tensor_init_bytes_list(&v, rank, shape, items, lens);
	if (rv != CACHEW_OK)
		return rv;
	return tensor_handle(out, &v);
}

cachew_err
cachew_tensor_create_scalar(
    cachew_tensor **out, cachew_dtype dtype, const void *value)
{
	cwi_tensor v;
	if (cachew_dtype_size(dtype) == 0)
		return cwi_fail(CACHEW_EINVAL, "scalar needs a fixed-width dtype");
	cwi_tensor_init_scalar(&v, dtype, value);
	return tensor_handle(out, &v);
}

cachew_err
cachew_tensor_slice(cachew_tensor **out, const cachew_tensor *t,
    int64_t start, int64_t count)
{
	cwi_tensor v;
	cachew_err rv = cwi_tensor_slice(&v, t, start, count);
	if (rv != CACHEW_OK)
		return rv;
	return tensor_handle(out, &v);
}

cachew_err
cachew_tensor_retain(cachew_tensor **out, const cachew_tensor *t)
{
	cwi_tensor v;
	cwi_tensor_copy(&v, t);
	return tensor_handle(out, &v);
}

void
cachew_tensor_release(cachew_tensor *t)
{
	if (t == NULL)
		return;
	cwi_tensor_clear(t);
	free(t);
}

/* The names before 0.1's ABI review; exported for programs built against
 * them. */
cachew_err
cachew_tensor_copy(cachew_tensor **out, const cachew_tensor *t)
{
	return cachew_tensor_retain(out, t);
}

void
cachew_tensor_destroy(cachew_tensor *t)
{
	cachew_tensor_release(t);
}

double
cwi_f16_to_f64(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	double m = h & 0x3ff, v;

	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m != 0 ? NAN : INFINITY;
	else
		v = ldexp(m + 1024, e - 25);
	return (h & 0x8000) ? -v : v;
}

double
cwi_bf16_to_f64(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;

	memcpy(&f, &bits, sizeof(f));
	return f;
}
