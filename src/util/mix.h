/* splitmix64's finalizer (Steele, Lea, Flood 2014): a fast 64-bit bijective mixer, for
 * hash keys and seeded streams. Not cryptographic. */
#ifndef SMELT_UTIL_MIX_H
#define SMELT_UTIL_MIX_H

#include <stdint.h>

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#endif
