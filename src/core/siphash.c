/*
 * siphash.c - SipHash-2-4 (siphash.h), from the paper's description:
 * the state v0..v3 is the key xored with "somepseudorandomlygeneratedbytes",
 * each 8-byte little-endian word m is absorbed by v3 ^= m, two SipRounds,
 * v0 ^= m; the last word holds the remaining bytes and the length mod 256
 * in its top byte; finalisation is v2 ^= 0xff and four SipRounds, and the
 * result v0 ^ v1 ^ v2 ^ v3.
 */
#include "siphash.h"

static uint64_t
rotl(uint64_t x, unsigned b)
{
	return (x << b) | (x >> (64 - b));
}

static uint64_t
load_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void
sip_round(uint64_t v[4])
{
	v[0] += v[1];
	v[1] = rotl(v[1], 13);
	v[1] ^= v[0];
	v[0] = rotl(v[0], 32);
	v[2] += v[3];
	v[3] = rotl(v[3], 16);
	v[3] ^= v[2];
	v[0] += v[3];
	v[3] = rotl(v[3], 21);
	v[3] ^= v[0];
	v[2] += v[1];
	v[1] = rotl(v[1], 17);
	v[1] ^= v[2];
	v[2] = rotl(v[2], 32);
}

static void
absorb(uint64_t v[4], uint64_t m)
{
	v[3] ^= m;
	sip_round(v);
	sip_round(v);
	v[0] ^= m;
}

uint64_t
cwi_siphash24(const uint8_t key[16], const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
	uint64_t v[4] = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
	    k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
	uint64_t last = (uint64_t)(len & 0xff) << 56;
	size_t whole = len - len % 8;

	for (size_t i = 0; i < whole; i += 8)
		absorb(v, load_le64(p + i));
	for (size_t i = whole; i < len; i++)
		last |= (uint64_t)p[i] << (8 * (i - whole));
	absorb(v, last);
	v[2] ^= 0xff;
	for (int i = 0; i < 4; i++)
		sip_round(v);
	return v[0] ^ v[1] ^ v[2] ^ v[3];
}
