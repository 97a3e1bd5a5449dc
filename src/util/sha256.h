/* SHA-256 (FIPS 180-4), streaming. Used to verify downloaded blobs against the hub's LFS
 * etag (the hex sha256 of the file). x86 SHA extensions when the CPU has them, else
 * portable C (sha256.c has the figures).
 *
 *   struct sha256 s; sha256_init(&s); sha256_update(&s, p, n); ...; sha256_final(&s, digest);
 */
#ifndef SMELT_UTIL_SHA256_H
#define SMELT_UTIL_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_LEN 32
#define SHA256_HEX_LEN 64

struct sha256 {
    uint32_t h[8];
    uint64_t nbytes;     /* message length so far */
    uint8_t block[64];   /* pending partial block */
    size_t nblock;       /* bytes in block, < 64 */
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t n);
/* Writes the 32-byte digest. s must be re-initialised before reuse. */
void sha256_final(struct sha256 *s, uint8_t out[SHA256_DIGEST_LEN]);
/* One-shot digest of a buffer. */
void sha256(const void *data, size_t n, uint8_t out[SHA256_DIGEST_LEN]);
/* Picks the compression: on = the CPU's SHA extensions when it has them (the default),
 * off = portable C. Returns whether the fast path is in use. For tests and benchmarks. */
bool sha256_use_fast(bool on);
/* Lower-case hex of a digest; out gets 64 chars and a NUL. */
void sha256_hex(const uint8_t digest[SHA256_DIGEST_LEN], char out[SHA256_HEX_LEN + 1]);

#endif
