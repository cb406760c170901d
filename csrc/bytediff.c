/* bytediff.c - snap_diff_bytes: the differing byte runs of two equal-length buffers, coalesced,
 * and the exact number of differing bytes (the kernel of `snapstore diff`).
 *
 * One sequential pass over both buffers: equal 256-byte blocks are skipped with one memcmp
 * (libc's vectorised one); in a differing block each differing 8-byte word is resolved with
 * bit tricks (its differing-byte mask, popcount, first and last differing byte), byte by byte
 * only when gap < 8 needs the exact inner runs. So it runs at about memory bandwidth whatever fraction of bytes differs.
 */
#include <string.h>

#include "internal.h"

/* The open run is [start, end); open == 0 means none. */
typedef struct {
    uint64_t *runs;
    size_t max_runs, n, gap;
    size_t start, end;
    int open;
} byterun;

/* Closes the open run into runs. Returns 0, or -1 when runs is full. */
static inline int byterun_flush(byterun *r)
{
    if (r->open) {
        if (r->n == r->max_runs)
            return -1;
        r->runs[2 * r->n] = r->start;
        r->runs[2 * r->n + 1] = r->end - r->start;
        r->n++;
        r->open = 0;
    }
    return 0;
}

/* Bytes [lo, hi) differ (lo >= every earlier byte reported). Merges into the open run when
 * fewer than gap bytes (at least touching) separate them. Returns 0, or -1 when runs is full. */
static inline int byterun_add(byterun *r, size_t lo, size_t hi)
{
    if (r->open && lo - r->end < r->gap) {
        r->end = hi;
        return 0;
    }
    if (byterun_flush(r) != 0)
        return -1;
    r->start = lo;
    r->end = hi;
    r->open = 1;
    return 0;
}

/* One bit (the low bit of each byte) per nonzero byte of x. */
static inline uint64_t nonzero_bytes(uint64_t x)
{
    x |= x >> 4;
    x |= x >> 2;
    x |= x >> 1;
    return x & 0x0101010101010101ULL;
}

/* Word at byte offset `at` whose XOR x is nonzero (little-endian: byte i is bits 8i..8i+7). */
static inline int word_diff(byterun *r, uint64_t x, size_t at, uint64_t *changed)
{
    uint64_t m = nonzero_bytes(x);
    *changed += (m * 0x0101010101010101ULL) >> 56;     /* popcount of the byte bits */
    if (r->gap >= 8) {       /* bytes inside one word are < 8 apart: always one run */
        size_t first = (size_t)__builtin_ctzll(m) / 8, last = 7 - (size_t)__builtin_clzll(m) / 8;
        return byterun_add(r, at + first, at + last + 1);
    }
    while (m) {
        size_t i = (size_t)__builtin_ctzll(m) / 8;
        if (byterun_add(r, at + i, at + i + 1) != 0)
            return -1;
        m &= m - 1;
    }
    return 0;
}

/* Native-endian 64-bit load read as little-endian (byte i of memory = bits 8i..8i+7). */
static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

#define DIFF_BLOCK 256   /* equal blocks of this size are skipped with one memcmp */

int snap_diff_bytes(const uint8_t *a, const uint8_t *b, size_t len, size_t gap,
                    uint64_t *runs, size_t max_runs, size_t *n_runs, uint64_t *n_changed)
{
    if (n_runs == NULL || n_changed == NULL)
        return SNAP_EINVAL;
    *n_runs = 0;
    *n_changed = 0;
    if (((a == NULL || b == NULL) && len != 0) || (runs == NULL && max_runs != 0))
        return SNAP_EINVAL;

    byterun r = { runs, max_runs, 0, gap > 1 ? gap : 1, 0, 0, 0 };
    uint64_t changed = 0;
    size_t i = 0;
    while (i + DIFF_BLOCK <= len) {
        if (memcmp(a + i, b + i, DIFF_BLOCK) != 0) {
            for (size_t k = i; k < i + DIFF_BLOCK; k += 8) {
                uint64_t x = load64(a + k) ^ load64(b + k);
                if (x && word_diff(&r, x, k, &changed) != 0)
                    return SNAP_ESPACE;
            }
        }
        i += DIFF_BLOCK;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t x = load64(a + i) ^ load64(b + i);
        if (x && word_diff(&r, x, i, &changed) != 0)
            return SNAP_ESPACE;
    }
    for (; i < len; i++) {
        if (a[i] != b[i]) {
            changed++;
            if (byterun_add(&r, i, i + 1) != 0)
                return SNAP_ESPACE;
        }
    }
    if (byterun_flush(&r) != 0)
        return SNAP_ESPACE;
    *n_runs = r.n;
    *n_changed = changed;
    return SNAP_OK;
}
