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
/*
 * The same encoding, scattered: the small bytes (array and bin headers,
 * shapes, padding, payloads under ref_min) are appended to sb, and each
 * payload of at least ref_min bytes is recorded in refs instead, by
 * pointer, to be sent from where it lies (writev). The bytes on the wire
 * are sb's with each ref's payload inserted at its `at` offset, in order.
 * skew is the number of bytes at the start of sb that precede the stream
 * the padding is reckoned from (a transport's length prefix), so the
 * payloads are aligned exactly as cwi_element_encode would align them in
 * a buffer holding the stream. The refs point into the element's
 * buffers: the element must stay referenced until they are sent.
 */
typedef struct cwi_enc_ref {
	size_t at;           /* offset in sb where the payload goes */
	const uint8_t *data; /* the payload, borrowed */
	size_t len;
} cwi_enc_ref;

typedef struct cwi_gather {
	cwi_strbuf sb;
	size_t skew;
	size_t ref_min;   /* payloads of at least this many bytes go by ref */
	size_t ref_bytes; /* sum of the refs' lengths */
	cwi_enc_ref *refs;
	size_t nrefs, cap;
} cwi_gather;

/* Appends e's encoding to g. Errors as cwi_element_encode. */
cachew_err cwi_element_encode_gather(const cwi_element *e, cwi_gather *g);

/* Decodes one element starting at data[*off], advancing *off. Tensor
 * payloads are zero-copy slices of `buf` when buf != NULL (buf->data must
 * be `data`, holding len bytes), else copies. CACHEW_ECORRUPT with a
 * cwi_fail message on any defect; never allocates more than the bytes
 * present justify. */
cachew_err cwi_element_decode(cwi_buffer *buf, const uint8_t *data,
    size_t len, size_t *off, cwi_element **out);
#endif /* CWI_ELEMENT_CODEC_H */
