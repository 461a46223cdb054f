/*
 * fuzz_cache_chunk.c - the chunk decoder and the element codec over
 * hostile bytes.
 *
 * The input is decoded three ways: as a whole chunk file
 * (cwi_cache_chunk_decode); as a stream of msgpack elements, zero-copy
 * and copying; and, so that the fuzzer reaches the element decoder behind
 * a valid zstd frame and checksums, as the content of one frame wrapped in
 * a well-formed chunk (the first byte is the element count). Decoding must
 * end in CACHEW_OK or CACHEW_ECORRUPT (chunk errors name "chunk: "), and
 * every element decoded must re-encode and decode to an equal element.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cache/cache_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_element(const cwi_element *e)
{
	cwi_strbuf sb;
	cwi_element *again = NULL;
	size_t off = 0;

	if (e->n == 0 || e->n > CACHEW_MAX_COMPONENTS)
		abort();
	for (uint32_t i = 0; i < e->n; i++) {
		const cwi_tensor *t = &e->comp[i];
		if (t->rank > CACHEW_MAX_RANK || t->dtype == CACHEW_INVALID ||
		    t->dtype > CACHEW_BYTES)
			abort();
		/* Touch every byte: a sanitizer sees a bad slice. */
		size_t n = cwi_tensor_nbytes(t);
		const uint8_t *p = t->dtype == CACHEW_BYTES
		    ? (t->buf != NULL ? t->buf->data + cwi_tensor_offsets(t)[0]
				      : NULL)
		    : cwi_tensor_data(t);
		volatile uint8_t sum = 0;
		for (size_t k = 0; k < n; k++)
			sum ^= p[k];
		(void)sum;
	}
	cwi_strbuf_init(&sb);
	if (cwi_element_encode(e, &sb) != CACHEW_OK)
		abort();
	if (cwi_element_decode(NULL, (const uint8_t *)sb.data, sb.len, &off,
		&again) != CACHEW_OK ||
	    off != sb.len || !cwi_element_equal(e, again))
		abort();
	cwi_element_release(again);
	cwi_strbuf_free(&sb);
}

static cachew_err
take(void *ctx, cwi_element *e)
{
	(void)ctx;
	check_element(e);
	cwi_element_release(e);
	return CACHEW_OK;
}

static void
expect_corrupt_or_ok(cachew_err rv, const char *prefix)
{
	if (rv == CACHEW_OK || rv == CACHEW_ENOMEM)
		return;
	if (rv != CACHEW_ECORRUPT ||
	    strncmp(cachew_errmsg(), prefix, strlen(prefix)) != 0)
		abort();
}

static void
elements(const uint8_t *data, size_t size, bool zero_copy)
{
	cwi_buffer *buf = NULL;
	const uint8_t *p = data;
	size_t off = 0;

	if (zero_copy) {
		if (cwi_buffer_alloc(&buf, size, false) != CACHEW_OK)
			return;
		if (size > 0)
			memcpy(buf->data, data, size);
		p = buf->data;
	}
	while (off < size) {
		cwi_element *e = NULL;
		cachew_err rv = cwi_element_decode(buf, p, size, &off, &e);
		if (rv != CACHEW_OK) {
			expect_corrupt_or_ok(rv, "element at byte");
			break;
		}
		check_element(e);
		cwi_element_release(e);
	}
	cwi_buffer_unref(buf);
}

/* A well-formed chunk of the given format around one record whose
 * content is the input (in format 2 stored when it does not compress). */
static void
wrapped(const uint8_t *data, size_t size, uint32_t version)
{
	cwi_chunk_header h = {.version = version};
	cwi_chunk_trailer t = {.records = 1};
	uint8_t hdr[CWI_CHUNK_HEADER_SIZE], tr[CWI_CHUNK_TRAILER_SIZE];
	ZSTD_CCtx *cctx;
	cwi_strbuf sb;
	uint32_t nelem;

	if (size < 2)
		return;
	nelem = data[0];
	t.elements = nelem;
	t.ubytes = size - 1;
	cctx = ZSTD_createCCtx();
	if (cctx == NULL)
		return;
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
	cwi_strbuf_init(&sb);
	cwi_chunk_header_put(hdr, &h);
	cwi_strbuf_append(&sb, hdr, sizeof(hdr));
	if (cwi_chunk_frame_encode(cctx, version, 1, data + 1, size - 1, nelem, &sb) ==
	    CACHEW_OK) {
		cwi_chunk_trailer_put(tr, &t);
		cwi_strbuf_append(&sb, tr, sizeof(tr));
		if (!sb.oom)
			expect_corrupt_or_ok(cwi_cache_chunk_decode(sb.data,
						 sb.len, take, NULL),
			    "chunk: ");
	}
	cwi_strbuf_free(&sb);
	ZSTD_freeCCtx(cctx);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	expect_corrupt_or_ok(cwi_cache_chunk_decode(data, size, take, NULL),
	    "chunk: ");
	elements(data, size, true);
	elements(data, size, false);
	wrapped(data, size, CWI_CHUNK_VERSION_1);
	wrapped(data, size, CWI_CHUNK_VERSION_2);
	return 0;
}
