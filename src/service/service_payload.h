/*
 * service_payload.h - the compressed form of a get_elements reply's element
 * payloads (docs/protocol.md, "Compressed payloads"): workers write it,
 * clients read it.
 *
 * A compressed reply carries ONE transport element, a scalar BYTES tensor
 * holding one zstd frame. The frame's content is the reply's elements in
 * the element encoding of docs/cache-format.md (section 4), back to back
 * from offset 0, exactly as the nng framing would have carried them; its
 * header declares the content size. One frame per reply rather than per
 * element: small elements compress together, and a reply costs one
 * compression call however many elements it holds.
 *
 * The reader trusts nothing: the frame must declare its content size, that
 * size must be within the caller's limit (the connection's max_msg_size),
 * the frame must end exactly where the bytes end, the element count must fit
 * the content, and every element must decode and end exactly at the
 * content's end. Decoded tensors are zero-copy views into one decompressed
 * buffer (16-byte aligned payloads stay aligned: the buffer is 64-byte
 * aligned and the encoding pads from its start).
 *
 * Thread safety: a cwi_zstd_pool is safe from any thread; the functions
 * keep no other state. A ZSTD_DCtx is one thread's at a time.
 */
#ifndef CWI_PAYLOAD_ZSTD_H
#define CWI_PAYLOAD_ZSTD_H

#include "../core/core.h"

#include <zstd.h>

/* The compression levels workers use (docs/protocol.md, "Compressed
 * payloads", has the measurements): level 1, zstd's fastest regular
 * level, as long as payloads compress; level -1 for payloads that do not
 * (decoded pixels: 0.95 at level 1, stored as is at -1 but 3 times
 * faster). On integer batches both give the same ratio. */
#define CWI_PAYLOAD_ZSTD_LEVEL 1
#define CWI_PAYLOAD_ZSTD_FAST (-1)

/* Compression contexts and encode buffers for reuse across replies: a
 * context costs about a megabyte and microseconds to set up, more than
 * compressing one small batch. */
typedef struct cwi_zstd_pool cwi_zstd_pool;

/* CACHEW_ENOMEM. */
cachew_err cwi_zstd_pool_create(cwi_zstd_pool **out);
/* Frees every pooled context. No call may be running on it. NULL is a
 * no-op. */
void cwi_zstd_pool_destroy(cwi_zstd_pool *pool);

/* Encodes elems[0..n) back to back and compresses them at `level` into one
 * frame, returned as a new element of one scalar BYTES component (*out, the
 * caller's reference). *content_len gets the encoded (uncompressed) size.
 * The elements are only read. CACHEW_ENOMEM; CACHEW_EINVAL for an element
 * the codec refuses (no components); CACHEW_EINTERNAL if zstd fails. */
cachew_err cwi_payload_compress(cwi_zstd_pool *pool, int level,
    cwi_element *const *elems, size_t n, cwi_element **out,
    size_t *content_len);

/* Decompresses `frame` (len bytes) and decodes `count` elements from it
 * into out[0..count) (new references, the caller's). dctx may be NULL (a
 * context is made for the call). limit bounds the declared content size,
 * checked before anything is allocated. On failure nothing is returned in
 * out and the error is CACHEW_EPROTO with a cwi_fail message saying what
 * was wrong (no content size, over the limit, truncated or trailing bytes,
 * a zstd error, a count that does not fit, an element that does not
 * decode), or CACHEW_ENOMEM. */
cachew_err cwi_payload_decompress(ZSTD_DCtx *dctx, const uint8_t *frame,
    size_t len, uint32_t count, size_t limit, cwi_element **out);

#endif /* CWI_PAYLOAD_ZSTD_H */
