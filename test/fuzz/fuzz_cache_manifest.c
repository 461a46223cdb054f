/*
 * fuzz_cache_manifest.c - the manifest decoder over hostile bytes.
 *
 * Decoding must end in CACHEW_OK or CACHEW_ECORRUPT ("manifest: ...").
 * A manifest that decodes must be consistent (the chunks' sums are the
 * totals, names are plain file names, component names are checked) and
 * must re-encode to bytes that decode to the same manifest. The input is also tried with its trailer
 * recomputed, so that the fuzzer reaches the body's checks past the
 * checksum.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../../src/cache/cache_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
same(const cwi_cache_manifest *a, const cwi_cache_manifest *b)
{
	if (a->fp.hi != b->fp.hi || a->fp.lo != b->fp.lo ||
	    strcmp(a->pipeline, b->pipeline) != 0 ||
	    a->writer_version != b->writer_version ||
	    a->cache_id != b->cache_id || a->created_unix != b->created_unix ||
	    a->elements != b->elements || a->bytes != b->bytes ||
	    a->ncomponents != b->ncomponents || a->nchunks != b->nchunks)
		abort();
	for (size_t i = 0; i < a->ncomponents; i++)
		if (a->spec[i].dtype != b->spec[i].dtype ||
		    a->spec[i].rank != b->spec[i].rank ||
		    memcmp(a->spec[i].shape, b->spec[i].shape,
			a->spec[i].rank * sizeof(int64_t)) != 0)
			abort();
	for (size_t i = 0; i < a->nchunks; i++)
		if (strcmp(a->chunks[i].name, b->chunks[i].name) != 0 ||
		    a->chunks[i].elements != b->chunks[i].elements ||
		    a->chunks[i].bytes != b->chunks[i].bytes ||
		    a->chunks[i].xxh64 != b->chunks[i].xxh64 ||
		    a->chunks[i].writer_id != b->chunks[i].writer_id ||
		    a->chunks[i].index != b->chunks[i].index)
			abort();
	/* Names: both unnamed, or the same table (decoded names are
	 * 1 to 255 bytes without control characters, and unique). */
	if ((a->names == NULL) != (b->names == NULL))
		abort();
	for (uint32_t i = 0; a->names != NULL && i < a->names->n; i++) {
		const char *x = a->names->name[i], *y = b->names->name[i];
		if (a->names->n != b->names->n || a->names->n != a->ncomponents ||
		    (x == NULL) != (y == NULL) ||
		    (x != NULL && (strcmp(x, y) != 0 || x[0] == '\0' ||
				      strlen(x) > 255)))
			abort();
		for (const char *c = x; c != NULL && *c != '\0'; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				abort();
	}
	if (a->nunits != b->nunits)
		abort();
	for (size_t i = 0; i < a->nunits; i++)
		if (a->units[i].begin != b->units[i].begin ||
		    a->units[i].end != b->units[i].end ||
		    a->units[i].begin >= a->units[i].end)
			abort();
}

static void
decode(const uint8_t *data, size_t size)
{
	cwi_cache_manifest *m = NULL, *again = NULL;
	uint64_t elements = 0, bytes = 0;
	cwi_strbuf sb;
	cachew_err rv = cwi_cache_manifest_decode(data, size, &m);

	if (rv != CACHEW_OK) {
		if (m != NULL ||
		    (rv != CACHEW_ECORRUPT && rv != CACHEW_ENOMEM) ||
		    (rv == CACHEW_ECORRUPT &&
			strncmp(cachew_errmsg(), "manifest: ", 10) != 0))
			abort();
		return;
	}
	for (size_t i = 0; i < m->nchunks; i++) {
		const char *n = m->chunks[i].name;
		if (n[0] == '.' || strchr(n, '/') != NULL)
			abort();
		elements += m->chunks[i].elements;
		bytes += m->chunks[i].bytes;
	}
	if (elements != m->elements || bytes != m->bytes ||
	    m->ncomponents > CACHEW_MAX_COMPONENTS)
		abort();
	cwi_strbuf_init(&sb);
	if (cwi_cache_manifest_encode(m, &sb) != CACHEW_OK ||
	    cwi_cache_manifest_decode(sb.data, sb.len, &again) != CACHEW_OK)
		abort();
	same(m, again);
	cwi_cache_manifest_free(again);
	cwi_strbuf_free(&sb);
	cwi_cache_manifest_free(m);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *fixed;
	uint64_t h;

	decode(data, size);
	/* The same body behind a correct trailer. */
	if (size > (64u << 10))
		return 0;
	fixed = malloc(size + 16);
	if (fixed == NULL)
		return 0;
	if (size > 0)
		memcpy(fixed, data, size);
	h = XXH64(data, size, 0);
	memcpy(fixed + size, "CWMF", 4);
	for (unsigned i = 0; i < 4; i++)
		fixed[size + 4 + i] = (uint8_t)(size >> (8 * i));
	for (unsigned i = 0; i < 8; i++)
		fixed[size + 8 + i] = (uint8_t)(h >> (8 * i));
	decode(fixed, size + 16);
	free(fixed);
	return 0;
}
