/*
 * fuzz_payload_zstd.c - the client's reader of compressed get_elements
 * payloads (src/service/service_payload.h, docs/protocol.md "Compressed
 * payloads") over hostile bytes.
 *
 * The input is a 6-byte head, then the payload bytes. Head byte 0: bits
 * 0-1 the mode (0: the bytes are the zstd frame as received; 1: they are
 * the frame's content, compressed here into a valid frame with a
 * checksum, so the fuzzer reaches the element decoder behind it; 2: the
 * same without a checksum; 3: as 1, then one byte of the frame is xored
 * with head byte 5 at the position in head bytes 3-4, modulo the frame's
 * length), bit 2 a context made per call rather than a reused one, bits
 * 3-4 the limit (64 bytes, 4 KiB, 1 MiB, 16 MiB). Head bytes 1-2: the
 * element count the reply header claims (big-endian).
 *
 * Decoding must end in CACHEW_OK, or CACHEW_EPROTO with a message naming
 * the compressed payload (CACHEW_ENOMEM aside) and nothing returned.
 * Decoded elements must lie inside their buffers, fit the limit, and
 * compress again (cwi_payload_compress, the worker's path) into a frame
 * that decodes to equal elements. A broken promise abort()s.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/service/service_payload.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HEAD 6
#define COUNT_MAX 65535

static const size_t limits[4] = {64, 4096, (size_t)1 << 20,
    (size_t)16 << 20};

static ZSTD_DCtx *dctx;
static ZSTD_CCtx *cctx;
static cwi_zstd_pool *pool;
static cwi_element *out[COUNT_MAX];
static cwi_element *again[COUNT_MAX];

/* The content compressed into a frame that declares its size (and a
 * checksum when asked). NULL if zstd cannot. */
static uint8_t *
wrap(const uint8_t *content, size_t len, bool checksum, size_t *flen)
{
	size_t bound = ZSTD_compressBound(len), n;
	uint8_t *f = malloc(bound);

	fuzz_must(f != NULL);
	ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
	n = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, checksum);
	if (!ZSTD_isError(n))
		n = ZSTD_compress2(cctx, f, bound, content, len);
	if (ZSTD_isError(n)) {
		free(f);
		return NULL;
	}
	*flen = n;
	return f;
}

/* The elements compress again into one frame, which decodes to equal
 * elements. */
static void
roundtrip(uint32_t count, size_t limit)
{
	cwi_element *frame = NULL;
	const uint8_t *p;
	size_t content = 0, len;

	fuzz_must(cwi_payload_compress(pool, CWI_PAYLOAD_ZSTD_FAST, out, count,
		      &frame, &content) == CACHEW_OK);
	p = cwi_tensor_str(&frame->comp[0], 0, &len);
	/* A misaligned payload the reader copied is padded when encoded
	 * again: only then may the content outgrow the limit. */
	if (content <= limit) {
		fuzz_must(cwi_payload_decompress(dctx, p, len, count, limit,
			      again) == CACHEW_OK);
		for (uint32_t i = 0; i < count; i++) {
			fuzz_must(cwi_element_equal(out[i], again[i]));
			cwi_element_release(again[i]);
			again[i] = NULL;
		}
	}
	cwi_element_release(frame);
}

static void
decode(const uint8_t *frame, size_t len, uint32_t count, size_t limit,
    bool own_ctx)
{
	unsigned long long declared = ZSTD_getFrameContentSize(frame, len);
	cachew_err rv;

	rv = cwi_payload_decompress(own_ctx ? NULL : dctx, frame, len, count,
	    limit, out);
	if (rv != CACHEW_OK) {
		fuzz_must(rv == CACHEW_ENOMEM ||
		    (rv == CACHEW_EPROTO &&
			strstr(cwi_errmsg_get(), "compressed payload") != NULL));
		for (uint32_t i = 0; i < count; i++)
			fuzz_must(out[i] == NULL);
		return;
	}
	/* What passed: a declared size within the limit, a count that fits
	 * it. */
	fuzz_must(declared <= limit && count <= declared / 8);
	for (uint32_t i = 0; i < count; i++)
		fuzz_check_element(out[i], NULL, NULL, NULL);
	roundtrip(count, limit);
	for (uint32_t i = 0; i < count; i++) {
		cwi_element_release(out[i]);
		out[i] = NULL;
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *frame = NULL;
	size_t len, limit;
	uint32_t count;
	unsigned mode;

	if (size < HEAD)
		return 0;
	if (dctx == NULL) {
		dctx = ZSTD_createDCtx();
		cctx = ZSTD_createCCtx();
		fuzz_must(dctx != NULL && cctx != NULL &&
		    cwi_zstd_pool_create(&pool) == CACHEW_OK);
	}
	mode = data[0] & 3;
	limit = limits[(data[0] >> 3) & 3];
	count = (uint32_t)data[1] << 8 | data[2];
	len = size - HEAD;
	if (mode == 0) {
		/* An exact copy, so a sanitizer sees a read past the end. */
		frame = malloc(len != 0 ? len : 1);
		fuzz_must(frame != NULL);
		memcpy(frame, data + HEAD, len);
	} else {
		frame = wrap(data + HEAD, len, mode != 2, &len);
		if (frame == NULL)
			return 0;
		if (mode == 3 && len > 0)
			frame[((size_t)data[3] << 8 | data[4]) % len] ^= data[5];
	}
	decode(frame, len, count, limit, data[0] & 4);
	free(frame);
	return 0;
}
