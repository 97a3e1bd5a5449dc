/* UTF-8: decoding, validation and repair.
 *
 * "Valid" means well-formed UTF-8 as the Unicode standard defines it: no overlong forms,
 * no surrogates (U+D800..U+DFFF), nothing above U+10FFFF. Invalid input is repaired by
 * "substitution of maximal subparts" (Unicode ch. 3, U+FFFD substitution): each maximal
 * prefix of a well-formed sequence that cannot be completed, and each byte that cannot
 * start one, becomes one U+FFFD. This is what Python's bytes.decode(errors="replace"),
 * Rust's String::from_utf8_lossy and the WHATWG decoder do, so outputs can be checked
 * against them.
 */
#ifndef SMELT_UTIL_UTF8_H
#define SMELT_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT 0xFFFDu
/* U+FFFD encoded. */
#define UTF8_REPLACEMENT_STR "\xEF\xBF\xBD"

/* Length of the well-formed sequence starting at s[0] (1..4), limited to the n bytes
 * available, or 0 when s[0..n) does not start with one. On success *cp is the code point.
 * n == 0 returns 0. */
size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* How many bytes of s[0..n) form the longest prefix that could still become a
 * well-formed sequence (0..3 when incomplete). Used by streaming decoders to hold back
 * the bytes of a character split across chunks. Returns 0 when s[0] cannot start one. */
size_t utf8_incomplete_len(const uint8_t *s, size_t n);

/* Length (0..3) of the incomplete character at the end of s[0..n): the start of a
 * well-formed sequence that the end cut off. n minus it is where a text cut at n bytes may
 * end without splitting a character. */
size_t utf8_tail_len(const uint8_t *s, size_t n);

/* Writes cp (must be <= 0x10FFFF and not a surrogate) as UTF-8 into out (room for 4);
 * returns the number of bytes. */
size_t utf8_encode(uint32_t cp, uint8_t *out);

/* Byte offset of the first invalid byte, or n when all of s[0..n) is valid. */
size_t utf8_validate(const uint8_t *s, size_t n);

/* Length of the repaired copy of s[0..n) (see the header note), for sizing the output
 * of utf8_repair. */
size_t utf8_repaired_len(const uint8_t *s, size_t n);

/* Copies s[0..n) into out, replacing each maximal invalid subpart with U+FFFD. out must
 * hold utf8_repaired_len(s, n) bytes; returns the bytes written. */
size_t utf8_repair(const uint8_t *s, size_t n, uint8_t *out);

#endif
