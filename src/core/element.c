/*
 * element.c - elements: refcounted tuples of tensor values.
 *
 * No locks: an element is modified only while unshared (refs == 1).
 */
#include "core.h"

#include <pthread.h>
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/*
 * Per-thread caches of freed elements with 1..CWI_ECACHE_MAX_N components
 * (the fast paths are inline in core.h; these are the slow ones).
 * Pipelines allocate and free elements in bursts of a chunk (64-1024),
 * which overflows glibc's 7-entry tcache bins and falls into the slow
 * allocator; a deeper per-thread list keeps the W1 hot path out of malloc.
 * Pipelines with worker threads allocate on one thread and free on another,
 * so a full cache hands its whole list to a global transfer stash (one lock
 * per CWI_ECACHE_DEPTH elements, as tcmalloc's transfer cache does) and an
 * empty cache refills from it before calling malloc. A thread's cache is
 * emptied when the thread exits (pthread key destructor); the main thread's
 * and the stash stay reachable until the process ends.
 */
CWI_TLS_HOT cwi_element_cache cwi_ecache;

/* The transfer stash: whole free lists of CWI_ECACHE_DEPTH elements. */
#define STASH_LISTS 16

static pthread_mutex_t stash_lock = PTHREAD_MUTEX_INITIALIZER;
static cwi_element *stash[CWI_ECACHE_MAX_N + 1][STASH_LISTS];
static unsigned stash_n[CWI_ECACHE_MAX_N + 1];
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

/* Moves a full local list to the stash; false if the stash is full. */
__attribute__((unused)) static bool
stash_put(cwi_element *list, uint32_t n)
{
	bool ok = false;

	pthread_mutex_lock(&stash_lock);
	if (stash_n[n] < STASH_LISTS) {
		stash[n][stash_n[n]++] = list;
		ok = true;
	}
	pthread_mutex_unlock(&stash_lock);
	return ok;
}

/* Takes a full list (CWI_ECACHE_DEPTH elements) from the stash, or NULL. */
static cwi_element *
stash_get(uint32_t n)
{
	cwi_element *list = NULL;

	pthread_mutex_lock(&stash_lock);
	if (stash_n[n] > 0)
		list = stash[n][--stash_n[n]];
	pthread_mutex_unlock(&stash_lock);
	return list;
}

static void
cache_drain(void *arg)
{
	cwi_element_cache *c = arg;
	for (unsigned n = 1; n <= CWI_ECACHE_MAX_N; n++) {
		while (c->head[n] != NULL) {
			cwi_element *e = c->head[n];
			c->head[n] = *(cwi_element **)(void *)e->comp;
			free(e);
		}
		c->count[n] = 0;
	}
	/* A later destructor may still free or allocate elements: the next
	 * push registers again and glibc runs the destructors once more. */
	c->registered = false;
}

static void
cache_key_create(void)
{
	(void)pthread_key_create(&cache_key, cache_drain);
}

/* Every thread whose cache ever holds an element registers, so the list
 * goes back to malloc when the thread exits. */
static void
cache_register(cwi_element_cache *c)
{
	pthread_once(&cache_once, cache_key_create);
	(void)pthread_setspecific(cache_key, c);
	c->registered = true;
}

cwi_element *
cwi_element_new_slow(uint32_t n)
{
	cwi_element_cache *c = &cwi_ecache;
	cwi_element *e = NULL;

	/* The local list is empty: try the stash, once per 64 misses while it
	 * stays empty (it costs a lock), at once after a hit. */
	if (CWI_ECACHE_DEPTH > 0 && n >= 1 && n <= CWI_ECACHE_MAX_N &&
	    c->stash_tries[n]++ % 64 == 0) {
		cwi_element *list = stash_get(n);
		if (list != NULL) {
			if (!c->registered)
				cache_register(c);
			c->head[n] = *(cwi_element **)(void *)list->comp;
			c->count[n] = CWI_ECACHE_DEPTH - 1;
			c->stash_tries[n] = 0;
			e = list;
		}
	}
	if (e == NULL) {
		e = malloc(sizeof(*e) + (size_t)n * sizeof(cwi_tensor));
		if (e == NULL)
			return NULL;
	}
	cwi_element_init(e, n);
	return e;
}

void
cwi_element_free_slow(cwi_element *e)
{
	cwi_element_cache *c = &cwi_ecache;
	uint32_t n = e->n;

#if CWI_ECACHE_DEPTH == 0
	(void)c;
	(void)n;
	free(e);
#else
	if (n < 1 || n > CWI_ECACHE_MAX_N) {
		free(e);
		return;
	}
	if (c->count[n] >= CWI_ECACHE_DEPTH) {
		if (!stash_put(c->head[n], n)) {
			free(e);
			return;
		}
		c->head[n] = NULL;
		c->count[n] = 0;
	}
	if (!c->registered)
		cache_register(c);
	/* The free list links through the first component. */
	*(cwi_element **)(void *)e->comp = c->head[n];
	c->head[n] = e;
	c->count[n]++;
#endif
}

cwi_element *
cwi_element_clone(const cwi_element *e)
{
	cwi_element *c = cwi_element_new(e->n);
	if (c == NULL)
		return NULL;
	for (uint32_t i = 0; i < e->n; i++)
		cwi_tensor_copy(&c->comp[i], &e->comp[i]);
	c->names = cwi_names_ref(e->names);
	return c;
}

/* ---- component names ---------------------------------------------------- */

static cachew_err check_writable(const cachew_element *e, size_t i);

bool
cwi_component_name_ok(const char *s, size_t len)
{
	if (len == 0 || len > CWI_COMPONENT_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

bool
cwi_names_ok(const cwi_names *names)
{
	if (names == NULL)
		return true;
	if (names->n > CACHEW_MAX_COMPONENTS)
		return false;
	for (uint32_t i = 0; i < names->n; i++) {
		const char *a = names->name[i];
		if (a == NULL)
			continue;
		if (!cwi_component_name_ok(a, strlen(a)))
			return false;
		for (uint32_t j = 0; j < i; j++)
			if (names->name[j] != NULL &&
			    strcmp(names->name[j], a) == 0)
				return false;
	}
	return true;
}

cwi_names *
cwi_names_create(uint32_t n, const char *const *names)
{
	cwi_names *t = calloc(1, sizeof(*t) + (size_t)n * sizeof(char *));

	if (t == NULL)
		return NULL;
	atomic_init(&t->refs, 1);
	t->n = n;
	for (uint32_t i = 0; i < n; i++) {
		if (names[i] == NULL)
			continue;
		t->name[i] = cwi_strdup(names[i]);
		if (t->name[i] == NULL) {
			cwi_names_unref_slow(t);
			return NULL;
		}
	}
	return t;
}

void
cwi_names_unref_slow(cwi_names *names)
{
	if (atomic_fetch_sub_explicit(&names->refs, 1, memory_order_acq_rel) !=
	    1)
		return;
	for (uint32_t i = 0; i < names->n; i++)
		free(names->name[i]);
	free(names);
}

const char *
cachew_element_name(const cachew_element *e, size_t i)
{
	if (e == NULL || e->names == NULL || i >= e->n || i >= e->names->n)
		return NULL;
	return e->names->name[i];
}

cachew_err
cachew_element_find(const cachew_element *e, const char *name, size_t *index)
{
	if (e == NULL || name == NULL || index == NULL)
		return cwi_fail(CACHEW_EINVAL, "NULL argument");
	for (uint32_t i = 0; e->names != NULL && i < e->names->n && i < e->n;
	     i++)
		if (e->names->name[i] != NULL &&
		    strcmp(e->names->name[i], name) == 0) {
			*index = i;
			return CACHEW_OK;
		}
	return cwi_fail(CACHEW_ENOENT, "no component of the element is named "
	    "'%s'%s", name, e->names == NULL ? " (its components are "
	    "unnamed)" : "");
}

/* Names are shared by many elements: setting one copies the table. */
cachew_err
cachew_element_set_name(cachew_element *e, size_t i, const char *name)
{
	const char *names[CACHEW_MAX_COMPONENTS];
	cwi_names *t;
	cachew_err rv;

	cwi_clear_errmsg();
	if (e == NULL)
		return cwi_fail(CACHEW_EINVAL, "element is NULL");
	rv = check_writable(e, i);
	if (rv != CACHEW_OK)
		return rv;
	if (name != NULL && !cwi_component_name_ok(name, strlen(name)))
		return cwi_fail(CACHEW_EINVAL, "a component name has 1 to %u "
		    "bytes and no control character (caches and the service "
		    "carry names by that rule)", CWI_COMPONENT_NAME_MAX);
	for (uint32_t k = 0; k < e->n; k++)
		names[k] = e->names != NULL && k < e->names->n
		    ? e->names->name[k]
		    : NULL;
	names[i] = name;
	for (uint32_t k = 0; name != NULL && k < e->n; k++)
		if (k != i && names[k] != NULL && strcmp(names[k], name) == 0)
			return cwi_fail(CACHEW_EEXIST, "component %u is already "
			    "named '%s'", k, name);
	t = cwi_names_create(e->n, names);
	if (t == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	cwi_names_unref(e->names);
	e->names = t;
	return CACHEW_OK;
}

cwi_element *
cwi_element_make_unique(cwi_element *e)
{
	cwi_element *c;

	if (cwi_element_unique(e))
		return e;
	c = cwi_element_clone(e);
	cwi_element_release(e);
	return c;
}

/* A view worth copying: it uses less than a quarter of a buffer that is
 * larger than 64 KiB. */
static bool
pins_block(const cwi_tensor *t)
{
	size_t used;

	if (t->buf == NULL || t->buf->size <= (64u << 10))
		return false;
	used = cwi_tensor_nbytes(t);
	return used < t->buf->size / 4;
}

static cachew_err
compact_tensor(cwi_tensor *t)
{
	cwi_tensor c;
	cachew_err rv;

	if (t->dtype == CACHEW_BYTES) {
		int64_t n = cwi_tensor_numel(t);
		const uint64_t *o = cwi_tensor_offsets(t);
		if (n <= 1 && t->obuf == NULL) {
			size_t len;
			const uint8_t *p = cwi_tensor_str(t, 0, &len);
			rv = cwi_tensor_init_bytes_copy(&c, p, len);
			if (rv != CACHEW_OK)
				return rv;
			memcpy(c.shape, t->shape, sizeof(c.shape));
			c.rank = t->rank;
		} else {
			/* Rebase the strings into one new data buffer. */
			cwi_buffer *data, *offs;
			uint64_t base = o[0];
			size_t total = (size_t)(o[n] - o[0]);
			rv = cwi_buffer_alloc(&data, total, false);
			if (rv != CACHEW_OK)
				return rv;
			rv = cwi_buffer_alloc(&offs, ((size_t)n + 1) * 8, false);
			if (rv != CACHEW_OK) {
				cwi_buffer_unref(data);
				return rv;
			}
			memcpy(data->data, t->buf->data + base, total);
			for (int64_t i = 0; i <= n; i++)
				((uint64_t *)(void *)offs->data)[i] = o[i] - base;
			c = *t;
			c.buf = data;
			c.obuf = offs;
			c.ooff = 0;
		}
	} else {
		size_t nbytes = cwi_tensor_nbytes(t);
		uint8_t *p;
		rv = cwi_tensor_init_alloc(&c, (cachew_dtype)t->dtype, t->rank,
		    t->shape, false, &p);
		if (rv != CACHEW_OK)
			return rv;
		memcpy(p, cwi_tensor_data(t), nbytes);
	}
	cwi_tensor_clear(t);
	*t = c;
	return CACHEW_OK;
}

cwi_element *
cwi_element_compact(cwi_element *e)
{
	bool any = false;

	for (uint32_t i = 0; i < e->n; i++)
		any = any || pins_block(&e->comp[i]);
	if (!any)
		return e;
	e = cwi_element_make_unique(e);
	if (e == NULL)
		return NULL;
	for (uint32_t i = 0; i < e->n; i++) {
		if (pins_block(&e->comp[i]) &&
		    compact_tensor(&e->comp[i]) != CACHEW_OK) {
			cwi_element_release(e);
			return NULL;
		}
	}
	return e;
}

bool
cwi_element_equal(const cwi_element *a, const cwi_element *b)
{
	if (a->n != b->n)
		return false;
	for (uint32_t i = 0; i < a->n; i++)
		if (!cwi_tensor_equal(&a->comp[i], &b->comp[i]))
			return false;
	return true;
}

/* ---- public API -------------------------------------------------------- */

cachew_err
cachew_element_create(cachew_element **out, size_t n)
{
	if (n == 0 || n > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_EINVAL,
		    "an element has 1 to %d components, not %zu",
		    CACHEW_MAX_COMPONENTS, n);
	*out = cwi_element_new((uint32_t)n);
	if (*out == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	return CACHEW_OK;
}

size_t
cachew_element_size(const cachew_element *e)
{
	return e->n;
}

const cachew_tensor *
cachew_element_component(const cachew_element *e, size_t i)
{
	return i < e->n ? &e->comp[i] : NULL;
}

static cachew_err
check_writable(const cachew_element *e, size_t i)
{
	if (i >= e->n)
		return cwi_fail(CACHEW_ERANGE,
		    "component %zu of an element of %u", i, e->n);
	if (!cwi_element_unique(e))
		return cwi_fail(CACHEW_EINVAL, "element is shared (immutable)");
	return CACHEW_OK;
}

cachew_err
cachew_element_set(cachew_element *e, size_t i, const cachew_tensor *t)
{
	cwi_tensor v;
	cachew_err rv = check_writable(e, i);
	if (rv != CACHEW_OK)
		return rv;
	cwi_tensor_copy(&v, t);
	cwi_tensor_clear(&e->comp[i]);
	e->comp[i] = v;
	return CACHEW_OK;
}

cachew_err
cachew_element_set_slice(cachew_element *e, size_t i, const cachew_tensor *t,
    int64_t start, int64_t count)
{
	cwi_tensor v;
	cachew_err rv = check_writable(e, i);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_tensor_slice(&v, t, start, count);
	if (rv != CACHEW_OK)
		return rv;
	cwi_tensor_clear(&e->comp[i]);
	e->comp[i] = v;
	return CACHEW_OK;
}

cachew_err
cachew_element_alloc(cachew_element *e, size_t i, cachew_dtype dtype,
    unsigned rank, const int64_t *shape, void **data)
{
	cwi_tensor v;
	uint8_t *p;
	cachew_err rv = check_writable(e, i);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_tensor_init_alloc(&v, dtype, rank, shape, true, &p);
	if (rv != CACHEW_OK)
		return rv;
	cwi_tensor_clear(&e->comp[i]);
	e->comp[i] = v;
	/* Inline storage moved with the value: point into the element. */
	*data = (void *)cwi_tensor_data(&e->comp[i]);
	return CACHEW_OK;
}

cachew_err
cachew_element_mutable_data(cachew_element *e, size_t i, void **data)
{
	uint8_t *p;
	cachew_err rv = check_writable(e, i);
	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_tensor_make_mutable(&e->comp[i], &p);
	if (rv != CACHEW_OK)
		return rv;
	*data = p;
	return CACHEW_OK;
}

cachew_element *
cachew_element_retain(cachew_element *e)
{
	if (e != NULL)
		cwi_element_retain(e);
	return e;
}

void
cachew_element_release(cachew_element *e)
{
	cwi_element_release(e);
}

/* ---- canonical hash -------------------------------------------------------- */

uint64_t
cachew_element_hash(const cachew_element *e)
{
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t c = 0; c < e->n; c++) {
		const cwi_tensor *t = &e->comp[c];
		uint64_t head[2 + CACHEW_MAX_RANK];
		int64_t numel = cwi_tensor_numel(t);

		head[0] = t->dtype;
		head[1] = t->rank;
		for (unsigned d = 0; d < t->rank; d++)
			head[2 + d] = (uint64_t)t->shape[d];
		XXH3_64bits_update(&st, head, (2 + t->rank) * sizeof(head[0]));
		if (t->dtype != CACHEW_BYTES) {
			XXH3_64bits_update(&st, cwi_tensor_data(t),
			    cwi_tensor_nbytes(t));
			continue;
		}
		const uint64_t *off = cwi_tensor_offsets(t);
		const uint8_t *base = t->buf != NULL ? t->buf->data : NULL;
		for (int64_t i = 0; i < numel; i++) {
			uint64_t len = off[i + 1] - off[i];
			XXH3_64bits_update(&st, &len, sizeof(len));
			if (len > 0)
				XXH3_64bits_update(&st, base + off[i], len);
		}
	}
	return XXH3_64bits_digest(&st);
}
