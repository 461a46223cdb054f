/*
 * cache_manifest.c - the manifest: a msgpack map describing a complete
 * cache, followed by a 16-byte trailer that checks it (docs/cache-format.md,
 * "Manifest").
 *
 *   manifest = body trailer
 *   body     = canonical msgpack map (keys below, sorted)
 *   trailer  = "CWMF" | u32 LE length of body | u64 LE XXH64(body, seed 0)
 *
 * The decoder trusts nothing: the trailer is checked before the body is
 * parsed, the body goes through the bounded value decoder, and every field
 * is checked for type, range and consistency (sums of the chunks).
 */
#include "cache_int.h"

#include "../core/value_msgpack.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#define FORMAT_NAME "cachew-cache"
#define TRAILER_MAGIC "CWMF"
#define TRAILER_SIZE 16
#define MAX_NAME 255
/* A component name: what cachew_element_set_name allows. */
#define MAX_COMPONENT_NAME CWI_COMPONENT_NAME_MAX

void
cwi_cache_manifest_clear(cwi_cache_manifest *m)
{
	free(m->pipeline);
	free(m->spec);
	cwi_names_unref(m->names);
	for (size_t i = 0; i < m->nchunks; i++)
		free(m->chunks[i].name);
	free(m->chunks);
	free(m->units);
	memset(m, 0, sizeof(*m));
}

void
cwi_cache_manifest_free(cwi_cache_manifest *m)
{
	if (m == NULL)
		return;
	cwi_cache_manifest_clear(m);
	free(m);
}

/* ---- encoder ------------------------------------------------------------ */

static void
put_key(cwi_strbuf *sb, const char *k)
{
	cwi_msgpack_put_str(sb, k, strlen(k));
}

static void
put_hex64(cwi_strbuf *sb, uint64_t v)
{
	char hex[17];

	snprintf(hex, sizeof(hex), "%016" PRIx64, v);
	cwi_msgpack_put_str(sb, hex, 16);
}

static void
put_u64(cwi_strbuf *sb, uint64_t v)
{
	cwi_msgpack_put_int(sb, (int64_t)v);
}

/* The name of component i, or NULL. */
static const char *
component_name(const cwi_cache_manifest *m, size_t i)
{
	return m->names != NULL && i < m->names->n ? m->names->name[i] : NULL;
}

/* The writer refuses what the reader would: a manifest it writes always
 * reads back. */
static cachew_err
check_names(const cwi_cache_manifest *m)
{
	if (m->names == NULL)
		return CACHEW_OK;
	if (m->names->n != m->ncomponents)
		return cwi_fail(CACHEW_ETYPE,
		    "manifest: %u component names for %zu components",
		    m->names->n, m->ncomponents);
	for (size_t i = 0; i < m->ncomponents; i++) {
		const char *a = component_name(m, i);
		if (a == NULL)
			continue;
		if (!cwi_component_name_ok(a, strlen(a)))
			return cwi_fail(CACHEW_EINVAL,
			    "manifest: component %zu's name is not 1 to %u "
			    "bytes without control characters",
			    i, MAX_COMPONENT_NAME);
		for (size_t j = 0; j < i; j++) {
			const char *b = component_name(m, j);
			if (b != NULL && strcmp(a, b) == 0)
				return cwi_fail(CACHEW_EINVAL,
				    "manifest: components %zu and %zu are "
				    "both named '%s'", j, i, a);
		}
	}
	return CACHEW_OK;
}

cachew_err
cwi_cache_manifest_encode(const cwi_cache_manifest *m, cwi_strbuf *sb)
{
	static const char writer[] = "cachew " CACHEW_VERSION_STRING;
	size_t start = sb->len;
	uint8_t trailer[TRAILER_SIZE];
	char fp[33];
	uint64_t h;
	cachew_err rv;

	if (m->elements > INT64_MAX || m->bytes > INT64_MAX)
		return cwi_fail(CACHEW_ERANGE, "manifest: totals out of range");
	rv = check_names(m);
	if (rv != CACHEW_OK)
		return rv;
	cachew_fingerprint_hex(&m->fp, fp);
	/* Keys in strcmp order: the encoding is canonical. */
	cwi_msgpack_put_map(sb, m->nunits > 0 ? 13 : 12);
	put_key(sb, "bytes");
	put_u64(sb, m->bytes);
	put_key(sb, "cache_id");
	put_hex64(sb, m->cache_id);
	put_key(sb, "chunks");
	cwi_msgpack_put_array(sb, m->nchunks);
	for (size_t i = 0; i < m->nchunks; i++) {
		const cwi_cache_chunk_info *c = &m->chunks[i];
		/* A chunk whose header says what its position and the cache
		 * id imply carries no header keys: one writer's manifests
		 * stay as they were. */
		bool own = c->writer_id == m->cache_id && c->index == i;
		cwi_msgpack_put_map(sb, own ? 4 : 6);
		put_key(sb, "bytes");
		put_u64(sb, c->bytes);
		put_key(sb, "elements");
		put_u64(sb, c->elements);
		if (!own) {
			put_key(sb, "index");
			put_u64(sb, c->index);
		}
		put_key(sb, "name");
		put_key(sb, c->name);
		if (!own) {
			put_key(sb, "writer_id");
			put_hex64(sb, c->writer_id);
		}
		put_key(sb, "xxh64");
		put_hex64(sb, c->xxh64);
	}
	put_key(sb, "created");
	cwi_msgpack_put_int(sb, m->created_unix);
	put_key(sb, "elements");
	put_u64(sb, m->elements);
	put_key(sb, "fingerprint");
	put_key(sb, fp);
	put_key(sb, "format");
	put_key(sb, FORMAT_NAME);
	put_key(sb, "pipeline");
	put_key(sb, m->pipeline != NULL ? m->pipeline : "");
	put_key(sb, "spec");
	cwi_msgpack_put_array(sb, m->ncomponents);
	for (size_t i = 0; i < m->ncomponents; i++) {
		const cwi_cache_spec *s = &m->spec[i];
		const char *dt = cachew_dtype_name(s->dtype);
		const char *name = component_name(m, i);
		/* "name" only where there is one: a manifest of unnamed
		 * components is byte for byte what writers before names
		 * wrote. */
		cwi_msgpack_put_map(sb, name != NULL ? 3 : 2);
		put_key(sb, "dtype");
		put_key(sb, dt != NULL ? dt : "");
		if (name != NULL) {
			put_key(sb, "name");
			put_key(sb, name);
		}
		put_key(sb, "shape");
		cwi_msgpack_put_array(sb, s->rank);
		for (unsigned d = 0; d < s->rank; d++)
			cwi_msgpack_put_int(sb, s->shape[d] < 0 ? -1 : s->shape[d]);
	}
	if (m->nunits > 0) {
		put_key(sb, "units");
		cwi_msgpack_put_array(sb, m->nunits);
		for (size_t i = 0; i < m->nunits; i++) {
			cwi_msgpack_put_array(sb, 2);
			put_u64(sb, m->units[i].begin);
			put_u64(sb, m->units[i].end);
		}
	}
	put_key(sb, "version");
	cwi_msgpack_put_int(sb, CWI_CACHE_FORMAT_VERSION);
	put_key(sb, "writer");
	put_key(sb, writer);
	put_key(sb, "writer_version");
	cwi_msgpack_put_int(sb, m->writer_version);
	if (sb->oom)
		return cwi_fail(CACHEW_ENOMEM, "manifest: out of memory");
	if (sb->len - start > CWI_CACHE_MAX_MANIFEST_BYTES - TRAILER_SIZE)
		return cwi_fail(CACHEW_ERANGE,
		    "manifest: %zu bytes exceeds the limit of %u",
		    sb->len - start, CWI_CACHE_MAX_MANIFEST_BYTES);
	h = XXH64(sb->data + start, sb->len - start, 0);
	memcpy(trailer, TRAILER_MAGIC, 4);
	for (unsigned i = 0; i < 4; i++)
		trailer[4 + i] = (uint8_t)((sb->len - start) >> (8 * i));
	for (unsigned i = 0; i < 8; i++)
		trailer[8 + i] = (uint8_t)(h >> (8 * i));
	cwi_strbuf_append(sb, trailer, sizeof(trailer));
	if (sb->oom)
		return cwi_fail(CACHEW_ENOMEM, "manifest: out of memory");
	return CACHEW_OK;
}

/* ---- decoder ------------------------------------------------------------ */

static cachew_err
bad(const char *fmt, ...) CACHEW_PRINTF(1, 2);

static cachew_err
bad(const char *fmt, ...)
{
	char what[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return cwi_fail(CACHEW_ECORRUPT, "manifest: %s", what);
}

static cachew_err
get_typed(const cwi_value *map, const char *key, cwi_vtype type,
    const cwi_value **out)
{
	const cwi_value *v = cwi_map_get(map, key);

	if (v == NULL)
		return bad("no '%s'", key);
	if (v->type != type || (type == CWI_V_LIST && v->tuple))
		return bad("'%s' has the wrong type", key);
	*out = v;
	return CACHEW_OK;
}

static cachew_err
get_int(const cwi_value *map, const char *key, int64_t min, int64_t *out)
{
	const cwi_value *v = NULL;
	cachew_err rv = get_typed(map, key, CWI_V_INT, &v);

	if (rv != CACHEW_OK)
		return rv;
	if (v->u.i < min)
		return bad("'%s' is %lld, below %lld", key, (long long)v->u.i,
		    (long long)min);
	*out = v->u.i;
	return CACHEW_OK;
}

static cachew_err
get_str(const cwi_value *map, const char *key, const char **s, size_t *len)
{
	const cwi_value *v = NULL;
	cachew_err rv = get_typed(map, key, CWI_V_STR, &v);

	if (rv != CACHEW_OK)
		return rv;
	*s = v->u.s.ptr;
	*len = v->u.s.len;
	return CACHEW_OK;
}

static cachew_err
get_hex64(const cwi_value *map, const char *key, uint64_t *out)
{
	const char *s = NULL;
	size_t len = 0;
	uint64_t x = 0;
	cachew_err rv = get_str(map, key, &s, &len);

	if (rv != CACHEW_OK)
		return rv;
	if (len != 16)
		return bad("'%s' is not 16 hex digits", key);
	for (size_t i = 0; i < 16; i++) {
		char c = s[i];
		unsigned v;
		if (c >= '0' && c <= '9')
			v = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = (unsigned)(c - 'a' + 10);
		else
			return bad("'%s' is not 16 lowercase hex digits", key);
		x = x << 4 | v;
	}
	*out = x;
	return CACHEW_OK;
}

/* A chunk name is a plain file name: it is joined to the cache directory
 * and must not climb out of it or collide with the store's own files. */
static bool
safe_name(const char *s, size_t len)
{
	if (len == 0 || len > MAX_NAME || s[0] == '.' ||
	    (len == strlen(CWI_CACHE_FILE_MANIFEST) &&
		memcmp(s, CWI_CACHE_FILE_MANIFEST, len) == 0) ||
	    (len == strlen(CWI_CACHE_FILE_BAD) && memcmp(s, CWI_CACHE_FILE_BAD, len) == 0) ||
	    (len == strlen(CWI_CACHE_FILE_LAST_READ) &&
		memcmp(s, CWI_CACHE_FILE_LAST_READ, len) == 0))
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			(c >= '0' && c <= '9') || c == '.' || c == '-' ||
			c == '_'))
			return false;
	}
	return true;
}

/* The optional "name" of each spec map (docs/cache-format.md, section
 * 5): checked like everything else, then made the manifest's one shared
 * names table when any component has one. */
static cachew_err
dec_names(const cwi_value *list, cwi_cache_manifest *m)
{
	const char *names[CACHEW_MAX_COMPONENTS] = {NULL};
	char *copy[CACHEW_MAX_COMPONENTS] = {NULL};
	cachew_err rv = CACHEW_OK;
	bool any = false;
	size_t n = list->u.list.n;

	for (size_t i = 0; i < n && rv == CACHEW_OK; i++) {
		const cwi_value *v = cwi_map_get(&list->u.list.items[i], "name");
		if (v == NULL)
			continue;
		if (v->type != CWI_V_STR)
			rv = bad("spec component %zu: 'name' is not a string", i);
		else if (!cwi_component_name_ok(v->u.s.ptr, v->u.s.len))
			rv = bad("spec component %zu: the name is not 1 to %u "
				 "bytes without control characters",
			    i, MAX_COMPONENT_NAME);
		else if ((copy[i] = cwi_strndup(v->u.s.ptr, v->u.s.len)) ==
		    NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		for (size_t j = 0; rv == CACHEW_OK && j < i; j++)
			if (copy[j] != NULL && strcmp(copy[j], copy[i]) == 0)
				rv = bad("spec components %zu and %zu are both "
					 "named '%s'", j, i, copy[i]);
		names[i] = copy[i];
		any = true;
	}
	if (rv == CACHEW_OK && any) {
		m->names = cwi_names_create((uint32_t)n, names);
		if (m->names == NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++)
		free(copy[i]);
	return rv;
}

static cachew_err
dec_spec(const cwi_value *list, cwi_cache_manifest *m)
{
	if (list->u.list.n > CACHEW_MAX_COMPONENTS)
		return bad("spec has %zu components, over %d", list->u.list.n,
		    CACHEW_MAX_COMPONENTS);
	if (list->u.list.n == 0)
		return CACHEW_OK;
	m->spec = calloc(list->u.list.n, sizeof(*m->spec));
	if (m->spec == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->ncomponents = list->u.list.n;
	for (size_t i = 0; i < list->u.list.n; i++) {
		const cwi_value *item = &list->u.list.items[i], *shape;
		cwi_cache_spec *s = &m->spec[i];
		const char *dt;
		size_t len;
		cachew_err rv;

		if (item->type != CWI_V_MAP)
			return bad("spec component %zu is not a map", i);
		rv = get_str(item, "dtype", &dt, &len);
		if (rv == CACHEW_OK)
			rv = get_typed(item, "shape", CWI_V_LIST, &shape);
		if (rv != CACHEW_OK)
			return rv;
		s->dtype = CACHEW_INVALID;
		for (int d = CACHEW_U8; d <= CACHEW_BYTES; d++) {
			const char *name = cachew_dtype_name((cachew_dtype)d);
			if (strlen(name) == len && memcmp(name, dt, len) == 0)
				s->dtype = (cachew_dtype)d;
		}
		if (s->dtype == CACHEW_INVALID)
			return bad("spec component %zu has an unknown dtype", i);
		if (shape->u.list.n > CACHEW_MAX_RANK)
			return bad("spec component %zu has rank %zu, over %d", i,
			    shape->u.list.n, CACHEW_MAX_RANK);
		s->rank = (unsigned)shape->u.list.n;
		for (unsigned d = 0; d < s->rank; d++) {
			const cwi_value *dim = &shape->u.list.items[d];
			if (dim->type != CWI_V_INT || dim->u.i < -1)
				return bad("spec component %zu: dimension %u is "
					   "not an integer >= -1",
				    i, d);
			s->shape[d] = dim->u.i;
		}
	}
	return dec_names(list, m);
}

/* The optional "writer_id" and "index" of a chunk (both or neither):
 * absent, the chunk is the cache's own chunk `i`. */
static cachew_err
dec_chunk_header_keys(const cwi_value *item, size_t i, uint64_t cache_id,
    cwi_cache_chunk_info *c)
{
	bool has_id = cwi_map_get(item, "writer_id") != NULL;
	bool has_index = cwi_map_get(item, "index") != NULL;
	int64_t index;
	cachew_err rv;

	if (!has_id && !has_index) {
		c->writer_id = cache_id;
		c->index = (uint32_t)i;
		return CACHEW_OK;
	}
	if (has_id != has_index)
		return bad("chunk %zu has only one of 'writer_id' and 'index'",
		    i);
	rv = get_hex64(item, "writer_id", &c->writer_id);
	if (rv == CACHEW_OK)
		rv = get_int(item, "index", 0, &index);
	if (rv != CACHEW_OK)
		return rv;
	if (index > UINT32_MAX)
		return bad("chunk %zu: index %lld is out of range", i,
		    (long long)index);
	c->index = (uint32_t)index;
	return CACHEW_OK;
}

/* The optional "units" of a part file: [begin, end) pairs, each
 * non-empty. */
static cachew_err
dec_units(const cwi_value *v, cwi_cache_manifest *m)
{
	const cwi_value *list = cwi_map_get(v, "units");

	if (list == NULL)
		return CACHEW_OK;
	if (list->type != CWI_V_LIST || list->u.list.n == 0)
		return bad("'units' is not a non-empty list");
	m->units = calloc(list->u.list.n, sizeof(*m->units));
	if (m->units == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < list->u.list.n; i++) {
		const cwi_value *r = &list->u.list.items[i];
		const cwi_value *b, *e;

		if (r->type != CWI_V_LIST || r->u.list.n != 2)
			return bad("unit range %zu is not a pair", i);
		b = &r->u.list.items[0];
		e = &r->u.list.items[1];
		if (b->type != CWI_V_INT || e->type != CWI_V_INT ||
		    b->u.i < 0 || e->u.i <= b->u.i)
			return bad("unit range %zu is not 0 <= begin < end", i);
		m->units[i].begin = (uint64_t)b->u.i;
		m->units[i].end = (uint64_t)e->u.i;
		m->nunits = i + 1;
	}
	return CACHEW_OK;
}

static cachew_err
dec_chunks(const cwi_value *list, cwi_cache_manifest *m)
{
	uint64_t elements = 0, bytes = 0;

	m->chunks = calloc(list->u.list.n + 1, sizeof(*m->chunks));
	if (m->chunks == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < list->u.list.n; i++) {
		const cwi_value *item = &list->u.list.items[i];
		cwi_cache_chunk_info *c = &m->chunks[i];
		const char *name;
		size_t len;
		int64_t ne, nb;
		cachew_err rv;

		if (item->type != CWI_V_MAP)
			return bad("chunk %zu is not a map", i);
		rv = get_str(item, "name", &name, &len);
		if (rv == CACHEW_OK && !safe_name(name, len))
			rv = bad("chunk %zu has an unsafe name", i);
		if (rv == CACHEW_OK)
			rv = get_int(item, "elements", 0, &ne);
		if (rv == CACHEW_OK)
			rv = get_int(item, "bytes", CWI_CHUNK_MIN_SIZE, &nb);
		if (rv == CACHEW_OK)
			rv = get_hex64(item, "xxh64", &c->xxh64);
		if (rv == CACHEW_OK)
			rv = dec_chunk_header_keys(item, i, m->cache_id, c);
		if (rv != CACHEW_OK)
			return rv;
		for (size_t j = 0; j < i; j++)
			if (strlen(m->chunks[j].name) == len &&
			    memcmp(m->chunks[j].name, name, len) == 0)
				return bad("chunk %zu repeats the name of chunk "
					   "%zu",
				    i, j);
		c->name = cwi_strndup(name, len);
		if (c->name == NULL)
			return cwi_fail(CACHEW_ENOMEM, "out of memory");
		m->nchunks = i + 1;
		c->elements = (uint64_t)ne;
		c->bytes = (uint64_t)nb;
		/* Both are below 2^63: the sums cannot wrap before the
		 * check. */
		elements += c->elements;
		bytes += c->bytes;
		if (elements > INT64_MAX || bytes > INT64_MAX)
			return bad("chunk totals overflow");
	}
	if (elements != m->elements || bytes != m->bytes)
		return bad("the chunks hold %llu elements in %llu bytes, the "
			   "totals say %llu in %llu",
		    (unsigned long long)elements, (unsigned long long)bytes,
		    (unsigned long long)m->elements,
		    (unsigned long long)m->bytes);
	return CACHEW_OK;
}

static cachew_err
dec_body(const cwi_value *v, cwi_cache_manifest *m)
{
	const cwi_value *spec = NULL, *chunks = NULL;
	const char *s = NULL;
	size_t len = 0;
	int64_t i;
	char hex[33];
	cachew_err rv;

	if (v->type != CWI_V_MAP)
		return bad("not a map");
	rv = get_str(v, "format", &s, &len);
	if (rv != CACHEW_OK)
		return rv;
	if (len != strlen(FORMAT_NAME) || memcmp(s, FORMAT_NAME, len) != 0)
		return bad("format is not '%s'", FORMAT_NAME);
	rv = get_int(v, "version", 0, &i);
	if (rv != CACHEW_OK)
		return rv;
	if (i != CWI_CACHE_FORMAT_VERSION)
		return bad("version %lld is not supported (this is version %u)",
		    (long long)i, CWI_CACHE_FORMAT_VERSION);
	rv = get_str(v, "fingerprint", &s, &len);
	if (rv != CACHEW_OK)
		return rv;
	if (len != 32)
		return bad("fingerprint is not 32 hex digits");
	memcpy(hex, s, 32);
	hex[32] = '\0';
	if (cwi_cache_fp_parse(hex, &m->fp) != CACHEW_OK)
		return bad("fingerprint is not 32 hex digits");
	rv = get_str(v, "pipeline", &s, &len);
	if (rv != CACHEW_OK)
		return rv;
	if (memchr(s, '\0', len) != NULL)
		return bad("pipeline contains a NUL byte");
	m->pipeline = cwi_strndup(s, len);
	if (m->pipeline == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = get_int(v, "writer_version", 0, &i);
	if (rv != CACHEW_OK)
		return rv;
	if (i > UINT32_MAX)
		return bad("writer_version is out of range");
	m->writer_version = (uint32_t)i;
	rv = get_str(v, "writer", &s, &len);
	if (rv == CACHEW_OK)
		rv = get_int(v, "created", INT64_MIN, &m->created_unix);
	if (rv == CACHEW_OK)
		rv = get_hex64(v, "cache_id", &m->cache_id);
	if (rv == CACHEW_OK)
		rv = get_int(v, "elements", 0, &i);
	if (rv != CACHEW_OK)
		return rv;
	m->elements = (uint64_t)i;
	rv = get_int(v, "bytes", 0, &i);
	if (rv != CACHEW_OK)
		return rv;
	m->bytes = (uint64_t)i;
	rv = get_typed(v, "spec", CWI_V_LIST, &spec);
	if (rv == CACHEW_OK)
		rv = dec_spec(spec, m);
	if (rv == CACHEW_OK)
		rv = get_typed(v, "chunks", CWI_V_LIST, &chunks);
	if (rv == CACHEW_OK)
		rv = dec_chunks(chunks, m);
	if (rv == CACHEW_OK)
		rv = dec_units(v, m);
	if (rv != CACHEW_OK)
		return rv;
	if (m->elements > 0 && m->ncomponents == 0)
		return bad("%llu elements but no element spec",
		    (unsigned long long)m->elements);
	return CACHEW_OK;
}

cachew_err
cwi_cache_manifest_decode(
    const void *data, size_t len, cwi_cache_manifest **out)
{
	const uint8_t *p = data;
	cwi_cache_manifest *m = NULL;
	cwi_value v = {.type = CWI_V_NIL};
	uint64_t body, h = 0;
	size_t used = 0;
	cachew_err rv;

	*out = NULL;
	if (len < TRAILER_SIZE + 1 || len > CWI_CACHE_MAX_MANIFEST_BYTES)
		return bad("%zu bytes is not a plausible size", len);
	body = len - TRAILER_SIZE;
	if (memcmp(p + body, TRAILER_MAGIC, 4) != 0)
		return bad("no trailer (truncated or not a manifest)");
	uint32_t blen = 0;
	for (unsigned i = 0; i < 4; i++)
		blen |= (uint32_t)p[body + 4 + i] << (8 * i);
	for (unsigned i = 0; i < 8; i++)
		h |= (uint64_t)p[body + 8 + i] << (8 * i);
	if (blen != body)
		return bad("trailer says %u bytes, the file holds %llu", blen,
		    (unsigned long long)body);
	if (XXH64(p, body, 0) != h)
		return bad("checksum mismatch (the file is damaged)");
	rv = cwi_value_from_msgpack(p, body, &used, &v, 8);
	if (rv == CACHEW_EPARSE)
		rv = bad("%s", cachew_errmsg());
	if (rv == CACHEW_OK && used != body)
		rv = bad("%llu bytes after the map", (unsigned long long)(body - used));
	if (rv != CACHEW_OK)
		goto fail;
	m = calloc(1, sizeof(*m));
	if (m == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	rv = dec_body(&v, m);
	if (rv != CACHEW_OK)
		goto fail;
	cwi_value_free(&v);
	*out = m;
	return CACHEW_OK;
fail:
	cwi_value_free(&v);
	cwi_cache_manifest_free(m);
	return rv;
}
