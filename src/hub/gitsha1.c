/* SHA-1 (FIPS 180-4), only to check a non-LFS file against its git blob id: the hub's ETag
 * for a file kept in git itself (not LFS) is sha1("blob <size>\0" <bytes>). Such files are
 * small (the hub moves anything large to LFS), so the file is hashed from disk after the
 * download rather than while streaming. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "hub/hub_internal.h"

struct sha1 {
    uint32_t h[5];
    uint64_t nbytes;
    uint8_t block[64];
    size_t nblock;
};

static inline uint32_t rol(uint32_t x, unsigned n) { return (x << n) | (x >> (32 - n)); }

static void sha1_block(uint32_t h[5], const uint8_t *p) {
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) |
               ((uint32_t)p[4 * i + 2] << 8) | p[4 * i + 3];
    for (int i = 16; i < 80; i++) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (b & c) | (~b & d);
            k = 0x5a827999;
        } else if (i < 40) {
            f = b ^ c ^ d;
            k = 0x6ed9eba1;
        } else if (i < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8f1bbcdc;
        } else {
            f = b ^ c ^ d;
            k = 0xca62c1d6;
        }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = rol(b, 30);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

static void sha1_init(struct sha1 *s) {
    static const uint32_t iv[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    memcpy(s->h, iv, sizeof iv);
    s->nbytes = 0;
    s->nblock = 0;
}

static void sha1_update(struct sha1 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->nbytes += n;
    while (n) {
        size_t take = 64 - s->nblock;
        if (take > n) take = n;
        memcpy(s->block + s->nblock, p, take);
        s->nblock += take;
        p += take;
        n -= take;
        if (s->nblock == 64) {
            sha1_block(s->h, s->block);
            s->nblock = 0;
        }
    }
}

static void sha1_final_hex(struct sha1 *s, char out[41]) {
    uint64_t bits = s->nbytes * 8;
    uint8_t pad[72] = {0x80};
    size_t npad = (s->nblock < 56) ? 56 - s->nblock : 120 - s->nblock;
    for (int i = 0; i < 8; i++) pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha1_update(s, pad, npad + 8);
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 20; i++) {
        uint8_t b = (uint8_t)(s->h[i / 4] >> (24 - 8 * (i % 4)));
        out[2 * i] = hx[b >> 4];
        out[2 * i + 1] = hx[b & 15];
    }
    out[40] = 0;
}

void hub_git_blob_sha1_mem(const void *data, size_t n, char out[41]) {
    struct sha1 s;
    sha1_init(&s);
    char hdr[32];
    int hl = snprintf(hdr, sizeof hdr, "blob %zu", n);
    sha1_update(&s, hdr, (size_t)hl + 1); /* with the NUL */
    sha1_update(&s, data, n);
    sha1_final_hex(&s, out);
}

smelt_status hub_git_blob_sha1_file(const char *path, char out[41], struct err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(e, SMELT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fseeko(f, 0, SEEK_END) != 0) goto ioerr;
    off_t size = ftello(f);
    if (size < 0 || fseeko(f, 0, SEEK_SET) != 0) goto ioerr;
    struct sha1 s;
    sha1_init(&s);
    char hdr[32];
    int hl = snprintf(hdr, sizeof hdr, "blob %lld", (long long)size);
    sha1_update(&s, hdr, (size_t)hl + 1);
    char buf[16384];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) sha1_update(&s, buf, got);
    if (ferror(f)) goto ioerr;
    fclose(f);
    sha1_final_hex(&s, out);
    return SMELT_OK;
ioerr:
    fclose(f);
    return err_set(e, SMELT_ERR_IO, "cannot read %s", path);
}
