/*
 * element_codec.h - the msgpack form of an element, shared by cache chunks
 * and the service's data messages (docs/cache-format.md specifies it).
 */
#ifndef CWI_ELEMENT_CODEC_H
#define CWI_ELEMENT_CODEC_H

#include "core.h"

/* Appends the msgpack encoding of one element. */
cachew_err cwi_element_encode(const cwi_element *e, cwi_strbuf *sb);
/* Decodes one element starting at data[*off], advancing *off. Tensor
 * payloads are zero-copy slices of `buf` when buf != NULL (buf->data must
 * be `data`, holding len bytes), else copies. CACHEW_ECORRUPT with a
 * cwi_fail message on any defect; never allocates more than the bytes
 * present justify. */
cachew_err cwi_element_decode(cwi_buffer *buf, const uint8_t *data,
    size_t len, size_t *off, cwi_element **out);
#endif /* CWI_ELEMENT_CODEC_H */
