/*
 * cache_chunk.c - the on-disk framing of chunk files (docs/cache-format.md,
 * "Chunk files"): the header, record headers, the trailer, one record's
 * payload (a zstd frame, or stored msgpack elements), and
 * cwi_cache_chunk_decode over a whole chunk in memory (the fuzz target's
 * entry point). Formats 1 and 2.
 *
 * All integers are little-endian. Every fixed-size structure ends in an
 * XXH32 of its other bytes, so a damaged length is caught before it is
 * used; the zstd frames carry a content checksum that covers every
 * element byte, and a stored record (format 2) an XXH3 of its content in
 * its header. XXH3 because a stored record's hash is the only pass over
 * its bytes besides the copy out of the page cache: it runs at about
 * twice XXH64's speed, and for a frame that did not compress zstd's
 * content checksum was a second pass on top of zstd copying its raw
 * blocks (docs/cache-format.md, section 3.2).
 */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_getFrameHeader */
#include "cache_int.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

static void
put_le32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void
put_le64(uint8_t *p, uint64_t v)
{
	for (unsigned i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

static uint64_t
get_le64(const uint8_t *p)
{
	return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

/* The check word of a structure of n bytes: XXH32 of the first n - 4. */
static uint32_t
check_word(const uint8_t *p, size_t n)
{
	return (uint32_t)XXH32(p, n - 4, 0);
}

/* ---- header, record headers, trailer ------------------------------------ */

void
cwi_chunk_header_put(uint8_t out[CWI_CHUNK_HEADER_SIZE],
    const cwi_chunk_header *h)
{
	memcpy(out, CWI_CHUNK_MAGIC, 8);
	put_le32(out + 8, h->version);
	put_le32(out + 12, h->flags);
	put_le64(out + 16, h->cache_id);
	put_le32(out + 24, h->index);
	put_le32(out + 28, check_word(out, CWI_CHUNK_HEADER_SIZE));
}

cachew_err
cwi_chunk_header_parse(const uint8_t *in, const char *name,
    cwi_chunk_header *h)
{
	if (memcmp(in, CWI_CHUNK_MAGIC, 8) != 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: not a cachew chunk file (bad magic)", name);
	if (get_le32(in + 28) != check_word(in, CWI_CHUNK_HEADER_SIZE))
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: chunk header checksum mismatch", name);
	h->version = get_le32(in + 8);
	h->flags = get_le32(in + 12);
	h->cache_id = get_le64(in + 16);
	h->index = get_le32(in + 24);
	if (h->version != CWI_CHUNK_VERSION_1 &&
	    h->version != CWI_CHUNK_VERSION_2)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: chunk format version %u is not supported (this "
		    "reader knows versions 1 and 2)",
		    name, h->version);
	if (h->flags != 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: unknown chunk flags 0x%x", name, h->flags);
	return CACHEW_OK;
}

static void
rec_put(uint8_t *out, uint32_t version, const cwi_chunk_rec *r)
{
	size_t size = cwi_chunk_rec_size(version);

	put_le32(out, r->clen);
	put_le32(out + 4, r->ulen);
	put_le32(out + 8, r->nelem);
	if (version != CWI_CHUNK_VERSION_1) {
		put_le32(out + 12, r->kind);
		put_le64(out + 16, r->hash);
		put_le32(out + 24, 0);
	}
	put_le32(out + size - 4, check_word(out, size));
}

/* Format 2's fields beyond format 1's: the kind, the payload hash and the
 * reserved word. */
static cachew_err
rec2_parse(const uint8_t *in, const char *name, uint64_t at,
    cwi_chunk_rec *r)
{
	r->kind = get_le32(in + 12);
	r->hash = get_le64(in + 16);
	if (get_le32(in + 24) != 0 ||
	    (r->kind != CWI_CHUNK_REC_ZSTD && r->kind != CWI_CHUNK_REC_STORED))
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu has unknown kind %u or a non-zero "
		    "reserved field",
		    name, (unsigned long long)at, r->kind);
	if (r->kind == CWI_CHUNK_REC_STORED && r->clen != r->ulen)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: stored record at byte %llu declares %u bytes of "
		    "payload for %u of content",
		    name, (unsigned long long)at, r->clen, r->ulen);
	return CACHEW_OK;
}

cachew_err
cwi_chunk_rec_parse(const uint8_t *in, uint32_t version, const char *name,
    uint64_t at, cwi_chunk_rec *r, bool *trailer)
{
	size_t size = cwi_chunk_rec_size(version);

	r->clen = get_le32(in);
	*trailer = r->clen == 0;
	if (*trailer)
		return CACHEW_OK;
	if (get_le32(in + size - 4) != check_word(in, size))
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record header checksum mismatch at byte %llu", name,
		    (unsigned long long)at);
	r->ulen = get_le32(in + 4);
	r->nelem = get_le32(in + 8);
	r->kind = CWI_CHUNK_REC_ZSTD;
	r->hash = 0;
	if (r->ulen > CWI_CACHE_MAX_FRAME_BYTES ||
	    r->clen > ZSTD_compressBound(CWI_CACHE_MAX_FRAME_BYTES))
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu declares %u/%u bytes, over the "
		    "frame limit of %u",
		    name, (unsigned long long)at, r->clen, r->ulen,
		    CWI_CACHE_MAX_FRAME_BYTES);
	/* An element takes at least 8 bytes. */
	if (r->nelem == 0 || r->nelem > r->ulen / 8)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu declares %u elements in %u bytes",
		    name, (unsigned long long)at, r->nelem, r->ulen);
	if (version != CWI_CHUNK_VERSION_1)
		return rec2_parse(in, name, at, r);
	return CACHEW_OK;
}

void
cwi_chunk_trailer_put(uint8_t out[CWI_CHUNK_TRAILER_SIZE],
    const cwi_chunk_trailer *t)
{
	put_le32(out, 0);
	put_le32(out + 4, t->records);
	put_le64(out + 8, t->elements);
	put_le64(out + 16, t->ubytes);
	put_le32(out + 24, 0);
	put_le32(out + 28, check_word(out, CWI_CHUNK_TRAILER_SIZE));
}

cachew_err
cwi_chunk_trailer_parse(const uint8_t *in, const char *name, uint64_t at,
    cwi_chunk_trailer *t)
{
	if (get_le32(in + 28) != check_word(in, CWI_CHUNK_TRAILER_SIZE) ||
	    get_le32(in) != 0 || get_le32(in + 24) != 0)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: chunk trailer at byte %llu is damaged", name,
		    (unsigned long long)at);
	t->records = get_le32(in + 4);
	t->elements = get_le64(in + 8);
	t->ubytes = get_le64(in + 16);
	return CACHEW_OK;
}

/* ---- payloads ----------------------------------------------------------- */

/* Compresses at `level` into the room reserved after out->len plus a
 * record header of hsize bytes; returns the frame size or a zstd error
 * code. */
static size_t
compress_at(ZSTD_CCtx *cctx, int level, const void *frame, size_t len,
    cwi_strbuf *out, size_t hsize, size_t bound)
{
	size_t rc = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);

	if (ZSTD_isError(rc))
		return rc;
	return ZSTD_compress2(cctx, out->data + out->len + hsize, bound, frame,
	    len);
}

/* Compresses a frame at `level`, or by the auto rule; returns the frame
 * size or a zstd error code. */
static size_t
compress_frame(ZSTD_CCtx *cctx, int level, const void *frame, size_t len,
    cwi_strbuf *out, size_t hsize, size_t bound)
{
	size_t n;

	if (level != CWI_CHUNK_LEVEL_AUTO)
		return compress_at(cctx, level, frame, len, out, hsize, bound);
	/* Decoded pixels barely compress: entropy-coding their literals
	 * saves ~5 % and makes decoding 20x slower (1 GB/s instead of 17 on
	 * this machine's cores). A negative level stores literals raw; only
	 * data it shrinks by more than an eighth is worth the full level-1
	 * pass. */
	n = compress_at(cctx, -1, frame, len, out, hsize, bound);
	if (!ZSTD_isError(n) && n < len - len / 8)
		n = compress_at(cctx, 1, frame, len, out, hsize, bound);
	return n;
}

cachew_err
cwi_chunk_frame_encode(ZSTD_CCtx *cctx, uint32_t version, int level,
    const void *frame, size_t len, uint32_t nelem, cwi_strbuf *out)
{
	size_t hsize = cwi_chunk_rec_size(version), start = out->len, n;
	size_t bound = ZSTD_compressBound(len);
	cwi_chunk_rec r = {.ulen = (uint32_t)len, .nelem = nelem,
	    .kind = CWI_CHUNK_REC_ZSTD};

	if (len > CWI_CACHE_MAX_FRAME_BYTES)
		return cwi_fail(CACHEW_ERANGE,
		    "cache: a frame of %zu bytes exceeds the limit of %u (one "
		    "element too large?)",
		    len, CWI_CACHE_MAX_FRAME_BYTES);
	/* Reserve header + bound, compress in place, then trim. */
	if (out->cap - out->len < hsize + bound + 1) {
		size_t need = out->len + hsize + bound + 1;
		char *p = realloc(out->data, need);
		if (p == NULL)
			return cwi_fail(CACHEW_ENOMEM,
			    "cache: out of memory compressing a frame");
		out->data = p;
		out->cap = need;
	}
	n = compress_frame(cctx, level, frame, len, out, hsize, bound);
	if (ZSTD_isError(n))
		return cwi_fail(CACHEW_EIO, "cache: zstd compression failed: %s",
		    ZSTD_getErrorName(n));
	if (version != CWI_CHUNK_VERSION_1 && n >= len - len / 16) {
		/* Not worth decompressing: a reader would pay zstd's copy
		 * of raw blocks and its checksum to save under 6 % of the
		 * bytes. Stored, it hands the bytes read out as they are,
		 * after one XXH3 pass. bound >= len, so the content fits. */
		memcpy(out->data + start + hsize, frame, len);
		n = len;
		r.kind = CWI_CHUNK_REC_STORED;
	}
	/* Of the payload, whichever kind: zstd's content checksum misses a
	 * flipped bit that decodes to the same content (a bitstream's
	 * padding), and the skeleton hash is to cover every byte. */
	if (version != CWI_CHUNK_VERSION_1)
		r.hash = XXH3_64bits(out->data + start + hsize, n);
	r.clen = (uint32_t)n;
	rec_put((uint8_t *)out->data + start, version, &r);
	out->len = start + hsize + n;
	return CACHEW_OK;
}

/* Decodes nelem elements filling exactly the first ulen bytes of buf, as
 * zero-copy slices of it; all or nothing. */
static cachew_err
decode_elements(cwi_buffer *buf, const char *name, uint64_t at,
    const cwi_chunk_rec *r, cwi_element **out)
{
	size_t pos = 0;
	uint32_t got = 0;
	cachew_err rv = CACHEW_OK;

	for (; got < r->nelem; got++) {
		rv = cwi_element_decode(buf, buf->data, r->ulen, &pos, &out[got]);
		if (rv != CACHEW_OK) {
			rv = cwi_fail(rv, "%s: record at byte %llu: %s", name,
			    (unsigned long long)at, cachew_errmsg());
			goto fail;
		}
	}
	if (pos != r->ulen) {
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: %zu bytes after its %u elements",
		    name, (unsigned long long)at, r->ulen - pos, r->nelem);
		goto fail;
	}
	return CACHEW_OK;
fail:
	for (uint32_t i = 0; i < got; i++) {
		cwi_element_release(out[i]);
		out[i] = NULL;
	}
	return rv;
}

cachew_err
cwi_chunk_stored_decode(cwi_buffer *buf, const char *name, uint64_t at,
    const cwi_chunk_rec *r, cwi_element **out)
{
	assert(r->kind == CWI_CHUNK_REC_STORED && buf->size >= r->ulen);
	return decode_elements(buf, name, at, r, out);
}

/* The frame is one whole zstd frame with a content checksum and the
 * record's content size. */
static cachew_err
frame_check(const char *name, uint64_t at,
    const cwi_chunk_rec *r, const uint8_t *src)
{
	unsigned long long csize = ZSTD_getFrameContentSize(src, r->clen);
	size_t fsize = ZSTD_findFrameCompressedSize(src, r->clen);
	ZSTD_frameHeader zfh;

	if (ZSTD_isError(fsize) || fsize != r->clen)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: not one whole zstd frame", name,
		    (unsigned long long)at);
	/* Without its content checksum a frame could not be verified
	 * before its elements are handed out. */
	if (ZSTD_getFrameHeader(&zfh, src, r->clen) != 0 || !zfh.checksumFlag ||
	    zfh.frameType != ZSTD_frame)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: the zstd frame has no content "
		    "checksum",
		    name, (unsigned long long)at);
	if (csize != r->ulen)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: zstd frame content size differs "
		    "from the record's %u bytes",
		    name, (unsigned long long)at, r->ulen);
	return CACHEW_OK;
}

cachew_err
cwi_chunk_frame_decode(ZSTD_DCtx *dctx, const char *name,
    uint64_t at, const cwi_chunk_rec *r, const uint8_t *src,
    cwi_element **out)
{
	cwi_buffer *buf = NULL;
	size_t n;
	cachew_err rv = frame_check(name, at, r, src);

	if (rv != CACHEW_OK)
		return rv;
	rv = cwi_buffer_alloc(&buf, r->ulen, false);
	if (rv != CACHEW_OK)
		return rv;
	n = ZSTD_decompressDCtx(dctx, buf->data, r->ulen, src, r->clen);
	if (ZSTD_isError(n) || n != r->ulen) {
		cwi_buffer_unref(buf);
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: zstd frame is damaged: %s", name,
		    (unsigned long long)at,
		    ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short content");
	}
	rv = decode_elements(buf, name, at, r, out);
	cwi_buffer_unref(buf);
	return rv;
}

bool
cwi_cache_spec_match(const cwi_cache_spec *spec, size_t ncomp,
    const cwi_element *e, char *why, size_t whylen)
{
	char got[128];

	if (e->n != ncomp) {
		snprintf(why, whylen, "%u components, the spec has %zu", e->n,
		    ncomp);
		return false;
	}
	for (size_t i = 0; i < ncomp; i++) {
		const cwi_tensor *t = &e->comp[i];
		bool ok = t->dtype == spec[i].dtype && t->rank == spec[i].rank;
		for (unsigned d = 0; ok && d < t->rank; d++)
			ok = spec[i].shape[d] < 0 ||
			    spec[i].shape[d] == t->shape[d];
		if (!ok) {
			snprintf(why, whylen,
			    "component %zu is %s, the spec says %s with %u "
			    "dimensions",
			    i, cwi_tensor_spec_str(t, got, sizeof(got)),
			    cachew_dtype_name(spec[i].dtype) != NULL
				? cachew_dtype_name(spec[i].dtype)
				: "?",
			    spec[i].rank);
			return false;
		}
	}
	return true;
}

/* ---- a whole chunk in memory -------------------------------------------- */

/* Verifies and decodes the record whose payload is r->clen bytes at src
 * into out[]. A stored record's content is copied into a buffer of its
 * own: the chunk's bytes belong to the caller. */
static cachew_err
decode_record(ZSTD_DCtx *dctx, uint32_t version, const char *name,
    uint64_t at, const cwi_chunk_rec *r, const uint8_t *src,
    cwi_element **out)
{
	cwi_buffer *buf = NULL;
	cachew_err rv;

	if (version != CWI_CHUNK_VERSION_1 &&
	    XXH3_64bits(src, r->clen) != r->hash)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: record at byte %llu: XXH3 of its %u bytes of payload "
		    "differs from the record header's",
		    name, (unsigned long long)at, r->clen);
	if (r->kind == CWI_CHUNK_REC_ZSTD)
		return cwi_chunk_frame_decode(dctx, name, at, r, src, out);
	rv = cwi_buffer_alloc(&buf, r->ulen, false);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(buf->data, src, r->ulen);
	rv = cwi_chunk_stored_decode(buf, name, at, r, out);
	cwi_buffer_unref(buf);
	return rv;
}

cachew_err
cwi_cache_chunk_decode(const void *data, size_t len,
    cachew_err (*fn)(void *ctx, cwi_element *e), void *ctx)
{
	static const char name[] = "chunk";
	const uint8_t *p = data;
	cwi_element **els = NULL;
	ZSTD_DCtx *dctx = NULL;
	cwi_chunk_header h;
	cwi_chunk_trailer t;
	uint64_t pos, elements = 0, ubytes = 0;
	uint32_t records = 0;
	size_t hsize;
	cachew_err rv;

	if (len < CWI_CHUNK_MIN_SIZE)
		return cwi_fail(CACHEW_ECORRUPT,
		    "%s: %zu bytes is shorter than any chunk", name, len);
	rv = cwi_chunk_header_parse(p, name, &h);
	if (rv != CACHEW_OK)
		return rv;
	hsize = cwi_chunk_rec_size(h.version);
	dctx = ZSTD_createDCtx();
	if (dctx == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (pos = CWI_CHUNK_HEADER_SIZE;;) {
		cwi_chunk_rec r;
		bool trailer;

		if (len - pos < hsize) {
			rv = cwi_fail(CACHEW_ECORRUPT,
			    "%s: truncated at byte %llu (no trailer)", name,
			    (unsigned long long)pos);
			goto done;
		}
		rv = cwi_chunk_rec_parse(p + pos, h.version, name, pos, &r,
		    &trailer);
		if (rv != CACHEW_OK)
			goto done;
		if (trailer)
			break;
		if (r.clen > len - pos - hsize) {
			rv = cwi_fail(CACHEW_ECORRUPT,
			    "%s: record at byte %llu overruns the file", name,
			    (unsigned long long)pos);
			goto done;
		}
		els = calloc(r.nelem, sizeof(*els));
		if (els == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			goto done;
		}
		rv = decode_record(dctx, h.version, name, pos, &r,
		    p + pos + hsize, els);
		for (uint32_t i = 0; rv == CACHEW_OK && i < r.nelem; i++) {
			rv = fn(ctx, els[i]);
			els[i] = NULL;
		}
		for (uint32_t i = 0; i < r.nelem; i++)
			cwi_element_release(els[i]);
		free(els);
		els = NULL;
		if (rv != CACHEW_OK)
			goto done;
		records++;
		elements += r.nelem;
		ubytes += r.ulen;
		pos += hsize + (uint64_t)r.clen;
	}
	if (len - pos != CWI_CHUNK_TRAILER_SIZE) {
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "%s: the trailer at byte %llu is not the last %u bytes",
		    name, (unsigned long long)pos, CWI_CHUNK_TRAILER_SIZE);
		goto done;
	}
	rv = cwi_chunk_trailer_parse(p + pos, name, pos, &t);
	if (rv == CACHEW_OK &&
	    (t.records != records || t.elements != elements ||
		t.ubytes != ubytes))
		rv = cwi_fail(CACHEW_ECORRUPT,
		    "%s: trailer counts %u records, %llu elements, but the "
		    "chunk holds %u, %llu",
		    name, t.records, (unsigned long long)t.elements, records,
		    (unsigned long long)elements);
done:
	ZSTD_freeDCtx(dctx);
	return rv;
}
