/*
 * service_payload.c - compressed element payloads (service_payload.h).
 *
 * Locking: pool->lock guards the free list only; it is a leaf lock, held
 * for a push or a pop, never across compression.
 */
#include "service_payload.h"
#include "../core/element_codec.h"

#include <pthread.h>
#include <stdlib.h>

/* Contexts kept for reuse; more concurrent compressions make their own. */
#define POOL_MAX 8
/* Encode buffers over this are freed after use rather than pooled. */
#define POOL_KEEP_BYTES ((size_t)32 << 20)

typedef struct zstd_ent {
	ZSTD_CCtx *cctx;
	cwi_strbuf enc; /* the elements' encoding, before compression */
} zstd_ent;

struct cwi_zstd_pool {
	pthread_mutex_t lock;
	zstd_ent *free[POOL_MAX];
	size_t nfree;
};

cachew_err
cwi_zstd_pool_create(cwi_zstd_pool **out)
{
	cwi_zstd_pool *p = calloc(1, sizeof(*p));

	*out = NULL;
	if (p == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_mutex_init(&p->lock, NULL);
	*out = p;
	return CACHEW_OK;
}

static void
ent_free(zstd_ent *e)
{
	if (e == NULL)
		return;
	ZSTD_freeCCtx(e->cctx);
	cwi_strbuf_free(&e->enc);
	free(e);
}

void
cwi_zstd_pool_destroy(cwi_zstd_pool *pool)
{
	if (pool == NULL)
		return;
	for (size_t i = 0; i < pool->nfree; i++)
		ent_free(pool->free[i]);
	pthread_mutex_destroy(&pool->lock);
	free(pool);
}

static zstd_ent *
ent_get(cwi_zstd_pool *pool)
{
	zstd_ent *e = NULL;

	pthread_mutex_lock(&pool->lock);
	if (pool->nfree > 0)
		e = pool->free[--pool->nfree];
	pthread_mutex_unlock(&pool->lock);
	if (e != NULL)
		return e;
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return NULL;
	cwi_strbuf_init(&e->enc);
	e->cctx = ZSTD_createCCtx();
	if (e->cctx == NULL) {
		free(e);
		return NULL;
	}
	return e;
}

static void
ent_put(cwi_zstd_pool *pool, zstd_ent *e)
{
	if (e->enc.cap > POOL_KEEP_BYTES || e->enc.oom) {
		cwi_strbuf_free(&e->enc);
		cwi_strbuf_init(&e->enc);
	}
	e->enc.len = 0;
	pthread_mutex_lock(&pool->lock);
	if (pool->nfree < POOL_MAX) {
		pool->free[pool->nfree++] = e;
		e = NULL;
	}
	pthread_mutex_unlock(&pool->lock);
	ent_free(e);
}

/* Makes room for `need` bytes without copying what sb holds (nothing that
 * matters: it is emptied first). */
static bool
enc_reserve(cwi_strbuf *sb, size_t need)
{
	char *p;

	sb->len = 0;
	if (sb->cap >= need + 1)
		return true;
	p = malloc(need + 1);
	if (p == NULL)
		return false;
	free(sb->data);
	sb->data = p;
	sb->cap = need + 1;
	return true;
}

cachew_err
cwi_payload_compress(cwi_zstd_pool *pool, int level,
    cwi_element *const *elems, size_t n, cwi_element **out,
    size_t *content_len)
{
	zstd_ent *ent = ent_get(pool);
	cwi_buffer *buf = NULL;
	cwi_element *e;
	size_t est = 16, bound, clen;
	cachew_err rv;

	*out = NULL;
	*content_len = 0;
	if (ent == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		est += cwi_element_nbytes(elems[i]) + 96 * (size_t)elems[i]->n + 16;
	if (!enc_reserve(&ent->enc, est)) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory encoding %zu bytes "
		    "for compression", est);
		goto done;
	}
	for (size_t i = 0; i < n; i++) {
		rv = cwi_element_encode(elems[i], &ent->enc);
		if (rv != CACHEW_OK)
			goto done;
	}
	if (ent->enc.oom) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory encoding elements "
		    "for compression");
		goto done;
	}
	bound = ZSTD_compressBound(ent->enc.len);
	rv = cwi_buffer_alloc(&buf, bound, false);
	if (rv != CACHEW_OK)
		goto done;
	/* The frame declares its content size (the reader bounds its
	 * allocation by it) and carries a checksum of the content, so a
	 * corrupted payload is refused instead of decoded into other data. */
	ZSTD_CCtx_reset(ent->cctx, ZSTD_reset_session_and_parameters);
	clen = ZSTD_CCtx_setParameter(ent->cctx, ZSTD_c_compressionLevel,
	    level);
	if (!ZSTD_isError(clen))
		clen = ZSTD_CCtx_setParameter(ent->cctx, ZSTD_c_checksumFlag, 1);
	if (!ZSTD_isError(clen))
		clen = ZSTD_compress2(ent->cctx, buf->data, bound, ent->enc.data,
		    ent->enc.len);
	if (ZSTD_isError(clen)) {
		rv = cwi_fail(CACHEW_EINTERNAL, "zstd compression of %zu bytes "
		    "failed: %s", ent->enc.len, ZSTD_getErrorName(clen));
		goto done;
	}
	e = cwi_element_new(1);
	if (e == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto done;
	}
	cwi_tensor_init_bytes_view(&e->comp[0], buf, 0, clen);
	*out = e;
	*content_len = ent->enc.len;
	rv = CACHEW_OK;
done:
	cwi_buffer_unref(buf);
	ent_put(pool, ent);
	return rv;
}

cachew_err
cwi_payload_decompress(ZSTD_DCtx *dctx, const uint8_t *frame, size_t len,
    uint32_t count, size_t limit, cwi_element **out)
{
	unsigned long long declared;
	ZSTD_DCtx *own = NULL;
	cwi_buffer *buf = NULL;
	size_t flen, got, off = 0;
	uint32_t done = 0;
	cachew_err rv;

	declared = ZSTD_getFrameContentSize(frame, len);
	if (declared == ZSTD_CONTENTSIZE_ERROR)
		return cwi_fail(CACHEW_EPROTO, "compressed payload: %zu bytes "
		    "that do not start a zstd frame", len);
	if (declared == ZSTD_CONTENTSIZE_UNKNOWN)
		return cwi_fail(CACHEW_EPROTO, "compressed payload: the zstd "
		    "frame does not declare its content size");
	if (declared > limit)
		return cwi_fail(CACHEW_EPROTO, "compressed payload declares "
		    "%llu bytes, over the limit of %zu", declared, limit);
	flen = ZSTD_findFrameCompressedSize(frame, len);
	if (ZSTD_isError(flen))
		return cwi_fail(CACHEW_EPROTO, "compressed payload: %s "
		    "(%zu bytes)", ZSTD_getErrorName(flen), len);
	if (flen != len)
		return cwi_fail(CACHEW_EPROTO, "compressed payload: %zu bytes "
		    "after the zstd frame", len - flen);
	/* No element encodes in fewer than 8 bytes: the count must fit the
	 * content before anything is decoded. */
	if (count > (size_t)declared / 8)
		return cwi_fail(CACHEW_EPROTO, "compressed payload: %u elements "
		    "do not fit its %llu bytes", count, declared);
	rv = cwi_buffer_alloc(&buf, (size_t)declared, false);
	if (rv != CACHEW_OK)
		return rv;
	if (dctx == NULL) {
		own = ZSTD_createDCtx();
		if (own == NULL) {
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
			goto fail;
		}
		dctx = own;
	}
	got = ZSTD_decompressDCtx(dctx, buf->data, (size_t)declared, frame,
	    len);
	if (ZSTD_isError(got)) {
		rv = cwi_fail(CACHEW_EPROTO, "compressed payload: %s",
		    ZSTD_getErrorName(got));
		goto fail;
	}
	if (got != declared) {
		rv = cwi_fail(CACHEW_EPROTO, "compressed payload: %zu bytes "
		    "decompressed, the frame declared %llu", got, declared);
		goto fail;
	}
	for (; done < count; done++) {
		rv = cwi_element_decode(buf, buf->data, (size_t)declared, &off,
		    &out[done]);
		if (rv != CACHEW_OK) {
			if (rv != CACHEW_ENOMEM)
				rv = cwi_fail(CACHEW_EPROTO, "compressed payload: "
				    "element %u: %s", done, cwi_errmsg_get());
			goto fail;
		}
	}
	if (off != declared) {
		rv = cwi_fail(CACHEW_EPROTO, "compressed payload: %llu bytes "
		    "after the last of %u elements", declared - off, count);
		goto fail;
	}
	ZSTD_freeDCtx(own);
	cwi_buffer_unref(buf); /* the elements hold their references */
	return CACHEW_OK;
fail:
	for (uint32_t i = 0; i < done; i++) {
		cwi_element_release(out[i]);
		out[i] = NULL;
	}
	ZSTD_freeDCtx(own);
	cwi_buffer_unref(buf);
	return rv;
}
