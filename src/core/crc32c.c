/*
 * crc32c.c - CRC-32C: slicing-by-8 tables (built once) and the SSE4.2
 * instruction, chosen at run time.
 */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void
crc_table_build(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1u) != 0 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^
			    crc_table[0][crc_table[t - 1][i] & 0xffu];
}

static inline uint64_t
load_le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);
#endif
	return v;
}

uint32_t
cwi_crc32c_sw(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint32_t c = ~crc;

	pthread_once(&crc_table_once, crc_table_build);
	while (len > 0 && ((uintptr_t)p & 7u) != 0) {
		c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xffu];
		len--;
	}
	while (len >= 8) {
		uint64_t v = load_le64(p) ^ c;
		c = crc_table[7][v & 0xffu] ^ crc_table[6][(v >> 8) & 0xffu] ^
		    crc_table[5][(v >> 16) & 0xffu] ^
		    crc_table[4][(v >> 24) & 0xffu] ^
		    crc_table[3][(v >> 32) & 0xffu] ^
		    crc_table[2][(v >> 40) & 0xffu] ^
		    crc_table[1][(v >> 48) & 0xffu] ^ crc_table[0][v >> 56];
		p += 8;
		len -= 8;
	}
	while (len-- > 0)
		c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xffu];
	return ~c;
}

#if defined(__x86_64__)

__attribute__((target("sse4.2"))) uint32_t
cwi_crc32c_hw(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t c = ~crc;

	while (len > 0 && ((uintptr_t)p & 7u) != 0) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		len--;
	}
	while (len >= 8) {
		uint64_t v;
		memcpy(&v, p, sizeof(v));
		c = __builtin_ia32_crc32di(c, v);
		p += 8;
		len -= 8;
	}
	while (len-- > 0)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return ~(uint32_t)c;
}

bool
cwi_crc32c_hw_available(void)
{
	return __builtin_cpu_supports("sse4.2");
}

#else

uint32_t
cwi_crc32c_hw(uint32_t crc, const void *data, size_t len)
{
	return cwi_crc32c_sw(crc, data, len);
}

bool
cwi_crc32c_hw_available(void)
{
	return false;
}

#endif

uint32_t
cwi_crc32c(uint32_t crc, const void *data, size_t len)
{
#if defined(__x86_64__)
	if (__builtin_cpu_supports("sse4.2"))
		return cwi_crc32c_hw(crc, data, len);
#endif
	return cwi_crc32c_sw(crc, data, len);
}
