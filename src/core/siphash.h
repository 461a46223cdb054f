/*
 * siphash.h - SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast
 * short-input PRF", 2012): a keyed 64-bit pseudorandom function. The
 * dispatcher derives each task's data-path secret with it from a key only
 * it holds, so a journal replay gives the same secrets and nobody without
 * the key can compute one.
 */
#ifndef CWI_SIPHASH_H
#define CWI_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of len bytes under the 128-bit key (its 16 bytes as the
 * paper reads them: k0 little-endian from bytes 0..7, k1 from 8..15).
 * The paper's vector: key 00 01 .. 0f, message 00 01 .. 0e gives
 * 0xa129ca6149be45e5. Thread safe. */
uint64_t cwi_siphash24(const uint8_t key[16], const void *data, size_t len);

#endif /* CWI_SIPHASH_H */
