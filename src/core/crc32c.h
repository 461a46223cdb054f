/*
 * crc32c.h - CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of TFRecord framing, with the SSE4.2 `crc32` instruction when
 * the CPU has it and a slicing-by-8 table otherwise.
 */
#ifndef CWI_CRC32C_H
#define CWI_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes and returns the new value, with
 * the usual pre- and post-inversion, so crc32c(crc32c(0, a), b) is the CRC
 * of a followed by b. "123456789" gives 0xE3069283. Thread safe. */
uint32_t cwi_crc32c(uint32_t crc, const void *data, size_t len);

/* The two implementations behind cwi_crc32c, for tests and benchmarks.
 * cwi_crc32c_hw may only be called when cwi_crc32c_hw_available(). */
uint32_t cwi_crc32c_sw(uint32_t crc, const void *data, size_t len);
uint32_t cwi_crc32c_hw(uint32_t crc, const void *data, size_t len);
bool cwi_crc32c_hw_available(void);

/* TFRecord's masked CRC: a CRC stored next to the data it covers is
 * rotated and offset so that CRCs of CRCs do not degenerate. */
static inline uint32_t
cwi_crc32c_mask(uint32_t crc)
{
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static inline uint32_t
cwi_crc32c_unmask(uint32_t masked)
{
	uint32_t rot = masked - 0xa282ead8u;
	return (rot >> 17) | (rot << 15);
}

#endif /* CWI_CRC32C_H */
