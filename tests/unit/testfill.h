/* testfill.h: deterministic test bytes, the same in every unit test that
 * writes files (xorshift64 from a seed: distinct per seed, cheap to
 * regenerate for the comparison). Header-only: each test executable is one
 * translation unit. */
#ifndef MTCFS_TESTS_UNIT_TESTFILL_H
#define MTCFS_TESTS_UNIT_TESTFILL_H

#include <stddef.h>
#include <stdint.h>

static inline void fill(void *buf, size_t len, uint32_t seed)
{
	uint8_t *p = buf;
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < len; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		p[i] = (uint8_t)s;
	}
}

#endif
