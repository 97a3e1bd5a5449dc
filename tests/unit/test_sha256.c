/* SHA-256 against the FIPS 180-2 / NIST example vectors, and against Python hashlib over
 * every message length 0..1024 (boundary cases at 55/56/63/64 bytes included), one-shot and
 * streamed in random pieces. */
#include "t.h"
#include "util/sha256.h"

static void hex_of(const void *m, size_t n, char out[65]) {
    uint8_t d[32];
    sha256(m, n, d);
    sha256_hex(d, out);
}

static void test_nist_vectors(void) {
    char hx[65];
    hex_of("", 0, hx);
    T_EQ_STR(hx, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, hx);
    T_EQ_STR(hx, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m448, strlen(m448), hx);
    T_EQ_STR(hx, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    hex_of(m896, strlen(m896), hx);
    T_EQ_STR(hx, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

static void test_million_a_streamed(void) {
    /* one million 'a', fed in 1000-byte pieces */
    char buf[1000];
    memset(buf, 'a', sizeof buf);
    struct sha256 s;
    sha256_init(&s);
    for (int i = 0; i < 1000; i++) sha256_update(&s, buf, sizeof buf);
    uint8_t d[32];
    char hx[65];
    sha256_final(&s, d);
    sha256_hex(d, hx);
    T_EQ_STR(hx, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The digests of messages m_n (n = 0..1024, m_n[i] = (31 i + 7 n) & 0xff), concatenated and
 * hashed again. Reference from Python:
 *   outer = hashlib.sha256()
 *   for n in range(1025):
 *       outer.update(hashlib.sha256(bytes(((i*31+n*7)&0xff) for i in range(n))).digest())
 *   outer.hexdigest()
 * Each inner message is hashed one-shot or streamed in random pieces (alternating), so
 * the buffering path is checked at every length too. */
static void test_all_lengths_vs_hashlib(void) {
    static uint8_t msg[1024];
    unsigned long long rng = 0x5eed;
    struct sha256 outer;
    sha256_init(&outer);
    for (size_t n = 0; n <= 1024; n++) {
        for (size_t i = 0; i < n; i++) msg[i] = (uint8_t)((i * 31 + n * 7) & 0xff);
        uint8_t d[32];
        if (n % 2 == 0) {
            sha256(msg, n, d);
        } else {
            struct sha256 s;
            sha256_init(&s);
            size_t off = 0;
            while (off < n) {
                size_t take = 1 + (size_t)(t_rand_u64(&rng) % 100);
                if (take > n - off) take = n - off;
                sha256_update(&s, msg + off, take);
                off += take;
            }
            sha256_final(&s, d);
        }
        sha256_update(&outer, d, sizeof d);
    }
    uint8_t d[32];
    char hx[65];
    sha256_final(&outer, d);
    sha256_hex(d, hx);
    T_EQ_STR(hx, "1b7d9d1f5f7d78c96ab17387558539216ce00c8832f8a490e00c4bf4cb0ba4ad");
}

int main(void) {
    /* every test on both compressions: SHA-NI (when this CPU has it), then portable C */
    bool fast = sha256_use_fast(true);
    printf("sha256: SHA extensions %s\n", fast ? "in use" : "absent: portable only");
    T_RUN(test_nist_vectors);
    T_RUN(test_million_a_streamed);
    T_RUN(test_all_lengths_vs_hashlib);
    sha256_use_fast(false);
    T_RUN(test_nist_vectors);
    T_RUN(test_million_a_streamed);
    T_RUN(test_all_lengths_vs_hashlib);
    return t_done();
}
