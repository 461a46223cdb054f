/*
 * element_codec.h - the msgpack form of an element, shared by cache chunks
 * and the service's data messages (docs/cache-format.md specifies it).
 */
#ifndef CWI_ELEMENT_CODEC_H
#define CWI_ELEMENT_CODEC_H

#include "core.h"

/* Appends the msgpack encoding of one element (1 to 64 components).
 * Fixed-width payloads over 16 bytes are padded to start at a multiple of
 * 16 bytes from sb->data, so a decoder reading the same bytes from an
 * aligned buffer can hand them out in place. CACHEW_EINVAL for an element
 * without components, CACHEW_ERANGE for a component over 4 GiB. */
cachew_err cwi_element_encode(const cwi_element *e, cwi_strbuf *sb);
/* Decodes one element starting at data[*off], advancing *off. Tensor
 * payloads are zero-copy slices of `buf` when buf != NULL (buf->data must
 * be `data`, holding len bytes), else copies. CACHEW_ECORRUPT with a
 * cwi_fail message on any defect; never allocates more than the bytes
 * present justify. */
cachew_err cwi_element_decode(cwi_buffer *buf, const uint8_t *data,
    size_t len, size_t *off, cwi_element **out);
#endif /* CWI_ELEMENT_CODEC_H */
