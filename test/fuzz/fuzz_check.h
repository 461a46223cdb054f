/*
 * fuzz_check.h - what the fuzz targets of the service's wire decoders
 * (fuzz_nng_frame.c, fuzz_payload_zstd.c) ask of every element they
 * decode. A failed check abort()s, which libFuzzer and the corpus replay
 * report.
 */
#ifndef FUZZ_CHECK_H
#define FUZZ_CHECK_H

#include <stdint.h>
#include <stdlib.h>

#include "../../src/core/core.h"

static void
fuzz_must(bool ok)
{
	if (!ok)
		abort();
}

/*
 * A decoded element is well formed (1 to 64 components, known dtypes,
 * rank at most 8), and each component's bytes lie inside the buffer they
 * view: inside [lo, hi) when that buffer is `in` (the decoder's input;
 * NULL: any buffer), else inside their own buffer's size. Every byte is
 * read, so a sanitizer sees a slice that lies.
 */
static void
fuzz_check_element(const cwi_element *e, const cwi_buffer *in,
    const uint8_t *lo, const uint8_t *hi)
{
	fuzz_must(e->n >= 1 && e->n <= CACHEW_MAX_COMPONENTS);
	for (uint32_t i = 0; i < e->n; i++) {
		const cwi_tensor *t = &e->comp[i];
		const uint8_t *p, *base, *end;
		size_t n;
		volatile uint8_t sum = 0;

		fuzz_must(t->rank <= CACHEW_MAX_RANK &&
		    t->dtype != CACHEW_INVALID && t->dtype <= CACHEW_BYTES);
		if (t->dtype == CACHEW_BYTES) {
			/* The strings follow each other: their offsets never
			 * go back. */
			const uint64_t *o = cwi_tensor_offsets(t);
			int64_t numel = cwi_tensor_numel(t);
			for (int64_t k = 0; k < numel; k++)
				fuzz_must(o[k] <= o[k + 1]);
		}
		n = cwi_tensor_nbytes(t);
		if (t->buf == NULL) {
			/* Inline: a fixed-width value of at most 16 bytes, or
			 * an empty string. */
			fuzz_must(n <= CWI_INLINE_BYTES);
			continue;
		}
		p = t->dtype == CACHEW_BYTES
		    ? t->buf->data + cwi_tensor_offsets(t)[0]
		    : cwi_tensor_data(t);
		base = t->buf == in && in != NULL ? lo : t->buf->data;
		end = t->buf == in && in != NULL ? hi
						 : t->buf->data + t->buf->size;
		fuzz_must(p >= base && p <= end && n <= (size_t)(end - p));
		for (size_t k = 0; k < n; k++)
			sum ^= p[k];
		(void)sum;
	}
}

#endif /* FUZZ_CHECK_H */
