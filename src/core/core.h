/*
 * core.h - internals shared by every module: errors, logging, buffers,
 * tensors, elements, values (the parameter model) and small utilities.
 * Never installed. Cross-file internal names start with cwi_.
 */
#ifndef CWI_CORE_H
#define CWI_CORE_H

#include "cachew.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Thread-local storage on hot paths: initial-exec avoids a __tls_get_addr
 * call per access in libcachew.so (the variables are small enough for the
 * static TLS surplus glibc keeps for dlopen'ed libraries). */
#define CWI_TLS_HOT _Thread_local __attribute__((tls_model("initial-exec")))

/* ---- errors and logging ------------------------------------------------ */

/* The last cachew_err value: codes a peer sends are in (CACHEW_OK,
 * CWI_ERR_LAST]. */
#define CWI_ERR_LAST CACHEW_EAUTH

/* Sets this thread's cachew_errmsg() and returns err, so a failing path can
 * `return cwi_fail(CACHEW_EINVAL, "...")`. */
cachew_err cwi_fail(cachew_err err, const char *fmt, ...) CACHEW_PRINTF(2, 3);
void cwi_clear_errmsg(void);
/* Copies this thread's errmsg (for objects that keep their own). */
const char *cwi_errmsg_get(void);
/* Cuts a trailing incomplete UTF-8 sequence off s (a message snprintf
 * truncated inside a character), so that messages built of UTF-8 stay
 * valid UTF-8 (bindings decode them strictly). */
void cwi_utf8_trim(char *s);

void cwi_log(cachew_log_level level, const char *module, const char *fmt,
    ...) CACHEW_PRINTF(3, 4);
bool cwi_log_enabled(cachew_log_level level);

/* ---- allocation -------------------------------------------------------- */

/* Strings and buffers handed to the caller are freed with cachew_free. */
char *cwi_strdup(const char *s);
char *cwi_strndup(const char *s, size_t n);
/* vsnprintf into a fresh heap string; NULL on ENOMEM. */
char *cwi_asprintf(const char *fmt, ...) CACHEW_PRINTF(1, 2);

/* Growable byte string used by printers and encoders. */
typedef struct cwi_strbuf {
	char *data;
	size_t len;
	size_t cap;
	bool oom; /* sticky: an append failed */
} cwi_strbuf;

void cwi_strbuf_init(cwi_strbuf *sb);
void cwi_strbuf_free(cwi_strbuf *sb);
void cwi_strbuf_append(cwi_strbuf *sb, const void *data, size_t len);
void cwi_strbuf_puts(cwi_strbuf *sb, const char *s);
void cwi_strbuf_printf(cwi_strbuf *sb, const char *fmt, ...) CACHEW_PRINTF(2, 3);
/* Hands the NUL-terminated data to the caller (free with cachew_free);
 * CACHEW_ENOMEM if any append failed. */
cachew_err cwi_strbuf_finish(cwi_strbuf *sb, char **out, size_t *len);

/* ---- time, hashing, randomness ----------------------------------------- */

/* Grows *v (an array of `size`-byte items with *cap slots) to hold at
 * least `need` items, doubling from 8. false on ENOMEM (*v unchanged). */
bool cwi_grow(void **v, size_t *cap, size_t need, size_t size);
#define CWI_GROW(arr, cap, need) \
	cwi_grow((void **)&(arr), &(cap), (need), sizeof(*(arr)))

uint64_t cwi_now_ns(void); /* CLOCK_MONOTONIC */
void cwi_sleep_ns(uint64_t ns);
/* Initialises a condition variable whose timed waits run on
 * CLOCK_MONOTONIC, so that a step of the wall clock (NTP, a resumed VM)
 * neither stretches nor cuts them. */
void cwi_cond_init_monotonic(pthread_cond_t *c);
/* pthread_cond_timedwait for at most ns from now, on a condition variable
 * made by cwi_cond_init_monotonic; m is held. Returns as it does (0, or
 * ETIMEDOUT). */
int cwi_cond_wait_ns(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns);
int cwi_online_cpus(void);
uint64_t cwi_available_ram(void); /* MemAvailable, bytes */

static inline uint64_t
cwi_mix64(uint64_t x)
{
	/* splitmix64 finalizer: a bijective avalanche of 64 bits. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

/* A stable seed from a parent seed and a stream index. */
static inline uint64_t
cwi_seed_derive(uint64_t seed, uint64_t index)
{
	return cwi_mix64(seed ^ cwi_mix64(index + 0x9e3779b97f4a7c15ULL));
}

/* splitmix64 stream: fast, 2^64 period, good enough for augmentation. */
typedef struct cwi_rng {
	uint64_t state;
} cwi_rng;

static inline uint64_t
cwi_rng_next(cwi_rng *r)
{
	r->state += 0x9e3779b97f4a7c15ULL;
	return cwi_mix64(r->state);
}

/* Uniform in [0, n) without modulo bias (Lemire). n > 0. */
uint64_t cwi_rng_below(cwi_rng *r, uint64_t n);
/* Uniform double in [0, 1). */
double cwi_rng_double(cwi_rng *r);

/* ---- buffers ----------------------------------------------------------- */

/* A refcounted block of bytes. Immutable once shared (refs > 1). Either the
 * bytes follow the header (owned) or they are external memory released by
 * free_fn when the last reference goes. */
typedef struct cwi_buffer {
	atomic_uint refs;
	size_t size;
	size_t capacity; /* owned: bytes allocated for data (>= size) */
	size_t map_bytes; /* a mapping of its own (munmap), else 0 (free) */
	uint8_t *data;
	void (*free_fn)(void *ctx, void *data);
	void *free_ctx;
} cwi_buffer;

/* A new owned buffer of `size` bytes, 64-byte aligned, zeroed if `zero`. */
cachew_err cwi_buffer_alloc(cwi_buffer **out, size_t size, bool zero);
cachew_err cwi_buffer_wrap(cwi_buffer **out, void *data, size_t size,
    void (*free_fn)(void *ctx, void *data), void *ctx);
/* An open local file that buffers may map (cwi_buffer_map_file): holds a
 * duplicate of fd (the caller keeps its own) for copies; each mapping
 * holds a reference. CACHEW_ENOMEM (no descriptor left), EIO. */
typedef struct cwi_map_file cwi_map_file;
cachew_err cwi_map_file_open(cwi_map_file **out, int fd);
void cwi_map_file_unref(cwi_map_file *f);
/* A buffer over len bytes of file from byte offset off, read only, mapped
 * (buffer_map.c). Only for bytes nothing in the process reads (the kernel
 * sends them): a thread reading a page of a file that shrank after the
 * mapping gets SIGBUS. CACHEW_ENOTSUP when the file cannot be mapped,
 * ENOMEM, EINVAL. */
cachew_err cwi_buffer_map_file(cwi_buffer **out, cwi_map_file *file,
    uint64_t off, size_t len);
/* Whether b maps a file (cwi_buffer_map_file). */
bool cwi_buffer_mapped(const cwi_buffer *b);
/* A copy of bytes [start, start + len) of mapped buffer b in a new owned
 * buffer, read from the file with pread(2): CACHEW_ECORRUPT naming the
 * offset when the file has shrunk since, CACHEW_EIO, ERANGE, ENOMEM
 * (through cwi_fail). */
cachew_err cwi_buffer_map_copy(cwi_buffer **out, const cwi_buffer *b,
    size_t start, size_t len);

static inline cwi_buffer *
cwi_buffer_ref(cwi_buffer *b)
{
	if (b != NULL)
		atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void cwi_buffer_unref_slow(cwi_buffer *b);
/* Frees the large buffers kept for reuse (tensor.c keeps recently freed
 * ones for a second). Thread safe. */
void cwi_buffer_cache_drop(void);
/* Frees only the kept buffers nobody took within their second (those a
 * later allocation would free anyway): a process whose allocations
 * stopped gives them back. Thread safe. */
void cwi_buffer_cache_trim(void);
/* Gives memory back to the system: glibc's free heap pages (malloc_trim)
 * and the large buffers kept for reuse, all of them when `all` (after a
 * burst that is over: hostile connections closed), else only the stale
 * ones (a process that gives back while it keeps working: the buffers
 * its next batches will take stay). Costs a walk of the heap: call it
 * after bursts or at most every second, never per message. Thread
 * safe. */
void cwi_heap_release(bool all);
/* Tunes glibc's malloc for a process that moves large messages, once per
 * process: one arena, 64 MiB mmap and trim thresholds (core_util.c says
 * why and what it costs). CACHEW_MALLOPT=1 in the environment tunes, 0
 * leaves malloc alone; otherwise `by_default` decides: true in cachewd's
 * main, false in a library user's process (the nng transport's first
 * listen or dial), whose other threads it would change too. Returns
 * whether malloc is tuned. Thread safe. */
bool cwi_heap_tune(bool by_default);

static inline void
cwi_buffer_unref(cwi_buffer *b)
{
	if (b != NULL)
		cwi_buffer_unref_slow(b);
}

static inline bool
cwi_buffer_unique(const cwi_buffer *b)
{
	return atomic_load_explicit(&b->refs, memory_order_acquire) == 1;
}

/* ---- tensors ----------------------------------------------------------- */

#define CWI_INLINE_BYTES 16

/*
 * The tensor value. Fixed-width tensors whose data fits in 16 bytes keep it
 * inline (buf == NULL): scalars cost no allocation. Otherwise `data` points
 * into buf at byte `off`.
 *
 * BYTES tensors: `buf` holds string data; string i spans
 * [offsets[i], offsets[i+1]) relative to buf->data. With numel <= 1 the two
 * offsets live inline (inl.u64), so a scalar string that is a slice of a
 * larger read buffer (a text line) costs no allocation; otherwise `obuf`
 * holds numel + 1 u64 offsets starting at entry `ooff`.
 *
 * Never hold a pointer to inline data across a copy of the struct: use the
 * accessors.
 */
struct cachew_tensor {
	uint8_t dtype;
	uint8_t rank;
	uint8_t heap; /* 1: a standalone handle from cachew_tensor_* */
	uint8_t pad_;
	int64_t shape[CACHEW_MAX_RANK];
	cwi_buffer *buf;
	cwi_buffer *obuf; /* BYTES with numel > 1: offsets */
	size_t off;       /* fixed-width: byte offset of data in buf */
	size_t ooff;      /* BYTES: first offset entry in obuf */
	union {
		uint8_t b[CWI_INLINE_BYTES];
		uint64_t u64[2];
	} inl;
};

typedef struct cachew_tensor cwi_tensor;

int64_t cwi_shape_numel(unsigned rank, const int64_t *shape);

static inline int64_t
cwi_tensor_numel(const cwi_tensor *t)
{
	int64_t n = 1;
	for (unsigned i = 0; i < t->rank; i++)
		n *= t->shape[i];
	return n;
}

static inline const uint8_t *
cwi_tensor_data(const cwi_tensor *t)
{
	return t->buf != NULL ? t->buf->data + t->off : t->inl.b;
}

/* BYTES offsets table (numel + 1 entries, relative to buf->data). */
static inline const uint64_t *
cwi_tensor_offsets(const cwi_tensor *t)
{
	return t->obuf != NULL ? (const uint64_t *)t->obuf->data + t->ooff
			       : t->inl.u64;
}

/* Bytes per value, indexed by cachew_dtype (0 for BYTES and invalid). */
extern const uint8_t cwi_dtype_sizes[16];

size_t cwi_tensor_nbytes_slow(const cwi_tensor *t);

/* The value of an IEEE half (f16) or a bfloat16 (the high half of an
 * f32), exactly, as a double: NaN and the infinities included. */
double cwi_f16_to_f64(uint16_t h);
double cwi_bf16_to_f64(uint16_t h);

static inline size_t
cwi_tensor_nbytes(const cwi_tensor *t)
{
	if (t->rank == 0 && t->dtype != CACHEW_BYTES)
		return cwi_dtype_sizes[t->dtype & 15];
	return cwi_tensor_nbytes_slow(t);
}

/* Value initialisers; none allocate unless noted. `dst` is overwritten
 * without releasing what it held. */
void cwi_tensor_init_scalar(cwi_tensor *dst, cachew_dtype dtype, const void *v);
void cwi_tensor_init_f64(cwi_tensor *dst, double v);

/* A rank-0 i64 value: the hot path of range and enumerate. */
static inline void
cwi_tensor_init_i64(cwi_tensor *dst, int64_t v)
{
	dst->dtype = CACHEW_I64;
	dst->rank = 0;
	dst->heap = 0;
	dst->buf = NULL;
	dst->obuf = NULL;
	dst->off = 0;
	dst->ooff = 0;
	memcpy(dst->inl.b, &v, sizeof(v));
	dst->inl.u64[1] = 0;
}
/* Allocates (zeroed if `zero`) storage for a fixed-width tensor. */
cachew_err cwi_tensor_init_alloc(cwi_tensor *dst, cachew_dtype dtype,
    unsigned rank, const int64_t *shape, bool zero, uint8_t **data);
/* A scalar BYTES tensor viewing [start, start+len) of buf (takes a new
 * reference on buf). */
void cwi_tensor_init_bytes_view(
    cwi_tensor *dst, cwi_buffer *buf, size_t start, size_t len);
/* A scalar BYTES tensor holding a copy of data. */
cachew_err cwi_tensor_init_bytes_copy(
    cwi_tensor *dst, const void *data, size_t len);
/* A BYTES tensor of shape `shape` from numel strings (copied). */
cachew_err cwi_tensor_init_bytes_list(cwi_tensor *dst, unsigned rank,
    const int64_t *shape, const void *const *items, const size_t *lens);
/* String i of a BYTES tensor. */
static inline const uint8_t *
cwi_tensor_str(const cwi_tensor *t, int64_t i, size_t *len)
{
	const uint64_t *o = cwi_tensor_offsets(t);
	*len = (size_t)(o[i + 1] - o[i]);
	return t->buf != NULL ? t->buf->data + o[i] : (const uint8_t *)"";
}

/* dst = a new reference to src's storage. */
void cwi_tensor_copy(cwi_tensor *dst, const cwi_tensor *src);
/* dst = rows [start, start+count) of src along dim 0 (rank >= 1), zero-copy
 * (small fixed-width slices are copied inline instead). */
cachew_err cwi_tensor_slice(
    cwi_tensor *dst, const cwi_tensor *src, int64_t start, int64_t count);
/* Drops the references a tensor value holds and resets it to an i64 zero. */
void cwi_tensor_clear(cwi_tensor *t);
/* Fixed-width only: makes the values writable in place, copying first if
 * the storage is shared or external. */
cachew_err cwi_tensor_make_mutable(cwi_tensor *t, uint8_t **data);
/* Same dtype and shape. */
static inline bool
cwi_tensor_same_spec(const cwi_tensor *a, const cwi_tensor *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank)
		return false;
	for (unsigned i = 0; i < a->rank; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}
/* Same dtype, shape and contents. */
bool cwi_tensor_equal(const cwi_tensor *a, const cwi_tensor *b);
/* "i64[64,3]" into buf; returns buf. */
const char *cwi_tensor_spec_str(const cwi_tensor *t, char *buf, size_t len);

/* ---- elements ---------------------------------------------------------- */

/* The names of an element's components: immutable once made, refcounted,
 * shared by every element an iterator hands out for one dataset (so that
 * naming costs a pointer per element, not a string). name[i] NULL: the
 * component is unnamed. */
typedef struct cwi_names {
	atomic_uint refs;
	uint32_t n;
	char *name[]; /* n entries */
} cwi_names;

/* The longest component name, in bytes. */
#define CWI_COMPONENT_NAME_MAX 255u

/* A component name every format carries (an element, a cache manifest,
 * the wire): 1 to CWI_COMPONENT_NAME_MAX bytes, none a control character
 * (names are printed by `cachew head` and in messages, and a NUL would
 * cut the C string short). */
bool cwi_component_name_ok(const char *s, size_t len);
/* A names table the formats carry: at most CACHEW_MAX_COMPONENTS entries,
 * each NULL or a name cwi_component_name_ok takes, no two alike. NULL is
 * fine (unnamed). */
bool cwi_names_ok(const cwi_names *names);

/* A names table of n entries copied from names (each may be NULL); NULL
 * on ENOMEM. */
cwi_names *cwi_names_create(uint32_t n, const char *const *names);
void cwi_names_unref_slow(cwi_names *names);

static inline cwi_names *
cwi_names_ref(cwi_names *names)
{
	if (names != NULL)
		atomic_fetch_add_explicit(&names->refs, 1, memory_order_relaxed);
	return names;
}

static inline void
cwi_names_unref(cwi_names *names)
{
	if (names != NULL)
		cwi_names_unref_slow(names);
}

struct cachew_element {
	atomic_uint refs;
	uint32_t n;
	cwi_names *names;  /* NULL: unnamed (the common case) */
	cwi_tensor comp[]; /* n components */
};

typedef struct cachew_element cwi_element;

/* Per-thread free lists of elements (element.c explains why). Sanitizer
 * builds keep none, so every allocation and free stays visible. */
#define CWI_ECACHE_MAX_N 4
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CWI_ECACHE_DEPTH 0u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CWI_ECACHE_DEPTH 0u
#endif
#endif
#ifndef CWI_ECACHE_DEPTH
#define CWI_ECACHE_DEPTH 1024u
#endif

typedef struct cwi_element_cache {
	cwi_element *head[CWI_ECACHE_MAX_N + 1];
	unsigned count[CWI_ECACHE_MAX_N + 1];
	unsigned stash_tries[CWI_ECACHE_MAX_N + 1];
	bool registered;
} cwi_element_cache;

extern CWI_TLS_HOT cwi_element_cache cwi_ecache;

cwi_element *cwi_element_new_slow(uint32_t n);
/* Takes an element whose last reference is gone and whose buffers are
 * released. */
void cwi_element_free_slow(cwi_element *e);

static inline void
cwi_element_init(cwi_element *e, uint32_t n)
{
	atomic_init(&e->refs, 1);
	e->n = n;
	e->names = NULL;
	for (uint32_t i = 0; i < n; i++) {
		cwi_tensor *t = &e->comp[i];
		t->dtype = CACHEW_I64;
		t->rank = 0;
		t->heap = 0;
		t->buf = NULL;
		t->obuf = NULL;
		t->off = 0;
		t->ooff = 0;
		t->inl.u64[0] = 0;
		t->inl.u64[1] = 0;
	}
}

/* A new element of n components (each an i64 zero), refs = 1; NULL on
 * ENOMEM. The fast path pops the thread's free list. */
static inline cwi_element *
cwi_element_new(uint32_t n)
{
	cwi_element_cache *c = &cwi_ecache;
	cwi_element *e;

	if (n - 1u < CWI_ECACHE_MAX_N && (e = c->head[n]) != NULL) {
		c->head[n] = *(cwi_element **)(void *)e->comp;
		c->count[n]--;
		cwi_element_init(e, n);
		return e;
	}
	return cwi_element_new_slow(n);
}

static inline void
cwi_element_retain(cwi_element *e)
{
	atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
}

/* Drops a reference; the last one releases the buffers and the element.
 * The fast path pushes onto the thread's free list. */
static inline void
cwi_element_release(cwi_element *e)
{
	cwi_element_cache *c;
	uint32_t n;

	if (e == NULL)
		return;
	/* The sole owner skips the locked decrement: nobody else holds a
	 * reference that could race with it. */
	if (atomic_load_explicit(&e->refs, memory_order_acquire) != 1 &&
	    atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1)
		return;
	n = e->n;
	for (uint32_t i = 0; i < n; i++) {
		cwi_buffer_unref(e->comp[i].buf);
		cwi_buffer_unref(e->comp[i].obuf);
	}
	cwi_names_unref(e->names);
	c = &cwi_ecache;
	/* 1 <= count < depth: registered and not full. */
	if (n - 1u < CWI_ECACHE_MAX_N &&
	    c->count[n] - 1u < CWI_ECACHE_DEPTH - 1u) {
		*(cwi_element **)(void *)e->comp = c->head[n];
		c->head[n] = e;
		c->count[n]++;
		return;
	}
	cwi_element_free_slow(e);
}

static inline bool
cwi_element_unique(const cwi_element *e)
{
	return atomic_load_explicit(&e->refs, memory_order_acquire) == 1;
}

/* A new unshared element holding references to e's components (and its
 * names). */
cwi_element *cwi_element_clone(const cwi_element *e);
/* Names e's components with `names` (which must have e->n entries, or be
 * NULL), taking a new reference; e must be unshared. */
static inline void
cwi_element_set_names(cwi_element *e, cwi_names *names)
{
	if (e->names == names)
		return;
	cwi_names_unref(e->names);
	e->names = cwi_names_ref(names);
}
/* Sum of the components' nbytes. */
static inline size_t
cwi_element_nbytes(const cwi_element *e)
{
	size_t n = 0;
	for (uint32_t i = 0; i < e->n; i++)
		n += cwi_tensor_nbytes(&e->comp[i]);
	return n;
}
/* Same component count and each component cwi_tensor_equal. */
bool cwi_element_equal(const cwi_element *a, const cwi_element *b);
/* For operators that hold elements for long (shuffle buffers): copies each
 * component that views a small part of a large buffer (a text line in a
 * 1 MiB read block) into a buffer of its own, so held elements do not pin
 * whole blocks. Returns e (made unique if anything is copied), or NULL on
 * ENOMEM with e released. */
cwi_element *cwi_element_compact(cwi_element *e);

/* Makes e unshared (cloning it if needed) and returns it. On ENOMEM returns
 * NULL and e is released. */
cwi_element *cwi_element_make_unique(cwi_element *e);
/* Makes every component of *e that views a mapped file (cwi_buffer_mapped)
 * view a copy read from the file instead, for code that reads the bytes
 * (cloning *e if shared). Errors as cwi_buffer_map_copy; then *e is
 * released and NULL. */
cachew_err cwi_element_unmap(cwi_element **e);

/* ---- values: the parameter model --------------------------------------- */

typedef enum cwi_vtype {
	CWI_V_NIL = 0,
	CWI_V_BOOL,
	CWI_V_INT,
	CWI_V_FLOAT,
	CWI_V_STR,   /* strings and bare identifiers */
	CWI_V_LIST,  /* [a, b] or (a, b): `tuple` marks the latter */
	CWI_V_MAP    /* string keys, kept sorted by key */
} cwi_vtype;

typedef struct cwi_value cwi_value;
typedef struct cwi_kv cwi_kv;

struct cwi_value {
	cwi_vtype type;
	bool tuple; /* CWI_V_LIST written with parentheses */
	bool ident; /* CWI_V_STR written as a bare identifier */
	union {
		bool b;
		int64_t i;
		double f;
		struct {
			char *ptr;
			size_t len;
		} s;
		struct {
			cwi_value *items;
			size_t n;
		} list;
		struct {
			cwi_kv *items;
			size_t n;
		} map;
	} u;
};

struct cwi_kv {
	char *key;
	cwi_value val;
};

/* Limits on every decoded or parsed value (outside input). */
#define CWI_VALUE_MAX_DEPTH 32
#define CWI_VALUE_MAX_ITEMS 1000000
#define CWI_VALUE_MAX_STR (16u << 20)

void cwi_value_free(cwi_value *v); /* frees contents, resets to NIL */
cachew_err cwi_value_copy(cwi_value *dst, const cwi_value *src);
bool cwi_value_equal(const cwi_value *a, const cwi_value *b);
cachew_err cwi_value_set_str(cwi_value *v, const char *s, size_t len);
/* Appends *item to the list, taking ownership (*item is reset to NIL). */
cachew_err cwi_value_list_push(cwi_value *list, cwi_value *item);

/* Maps: keys unique and sorted (strcmp). */
const cwi_value *cwi_map_get(const cwi_value *map, const char *key);
/* Takes ownership of *val (reset to NIL); replaces an existing key. */
cachew_err cwi_map_set(cwi_value *map, const char *key, cwi_value *val);
/* Removes key; returns true if it was present. */
bool cwi_map_del(cwi_value *map, const char *key);

/* Writes the value in pipeline-string syntax: ints, floats that round
 * trip (always with a '.' or exponent), true/false, identifiers bare,
 * other strings double-quoted with \" \\ \n \t \xNN escapes, lists. */
void cwi_value_print(cwi_strbuf *sb, const cwi_value *v);
/* True if s is an identifier: [A-Za-z_][A-Za-z0-9_]*. */
bool cwi_is_ident(const char *s, size_t len);

/* cachew_params is a map value. */
struct cachew_params {
	cwi_value map;
};

/* A list of strings from a value that is a string or a list of strings.
 * Returns a NULL-terminated array of borrowed pointers (free the array
 * only) or NULL on ENOMEM/ETYPE (errmsg set). */
const char **cwi_value_str_list(const cwi_value *v, size_t *n);

/* ---- chunks: the unit of hand-off between iterators, threads and transports ---- */

typedef struct cwi_chunk {
	cwi_element **v;
	size_t n;
	size_t cap;
} cwi_chunk;

/* Ensures room for `extra` more elements. */
cachew_err cwi_chunk_reserve(cwi_chunk *c, size_t extra);
/* Releases the elements; keeps the storage. */
void cwi_chunk_clear(cwi_chunk *c);
/* Releases elements and storage. */
void cwi_chunk_free(cwi_chunk *c);
/* Moves every element of src to the end of dst (src is left empty, its
 * storage kept); false on ENOMEM, with nothing moved. */
bool cwi_chunk_move_all(cwi_chunk *dst, cwi_chunk *src);

static inline void
cwi_chunk_push(cwi_chunk *c, cwi_element *e)
{
	c->v[c->n++] = e;
}

/* ---- range sets: which element indices of a group were delivered ------------- */

/*
 * A set of uint64 indices kept as ascending, disjoint, non-adjacent
 * half-open ranges: v[2i] <= x < v[2i+1]. What a client received of a
 * lease's elements and what a replay leaves out (docs/protocol.md,
 * "Exactly once"). Adding to it merges; a stream received in order stays
 * one range.
 */
typedef struct cwi_rset {
	uint64_t *v;
	size_t n; /* entries of v: twice the ranges */
	size_t cap;
} cwi_rset;

/* Adds [from, to) (nothing when from >= to). false on ENOMEM, with the
 * set unchanged. */
bool cwi_rset_add(cwi_rset *s, uint64_t from, uint64_t to);
/* Adds every range of a flat list (pairs as in cwi_rset.v); the list is
 * trusted to hold an even count (check it first). false on ENOMEM. */
bool cwi_rset_add_list(cwi_rset *s, const uint64_t *pairs, size_t n);
bool cwi_rset_has(const cwi_rset *s, uint64_t x);
/* Whether [from, to) is wholly in the set. */
bool cwi_rset_covers(const cwi_rset *s, uint64_t from, uint64_t to);
/* The number of indices in the set (saturating). */
uint64_t cwi_rset_count(const cwi_rset *s);
/* A flat list (pairs) is well formed: even length, each range non-empty,
 * ascending and disjoint. */
bool cwi_rset_list_ok(const uint64_t *pairs, size_t n);
void cwi_rset_free(cwi_rset *s);

#endif /* CWI_CORE_H */
