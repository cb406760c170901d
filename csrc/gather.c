/* gather.c - snap_gather: copy byte ranges of a buffer back to back into an output buffer.
 *
 * Two passes over the range list: the first validates every range and the total (nothing is
 * copied on error), the second copies.
 *
 * The copy is tuned for the common case, many page-sized ranges scattered over a large
 * buffer (the dirty pages of a checkpoint):
 *   - four ranges are copied in lockstep, 128 bytes of each in turn, so four independent
 *     streams of cache misses are in flight; one range at a time leaves the memory system
 *     mostly idle at every jump (hardware prefetchers restart at each new page);
 *   - while a group of four is copied, the next group's bytes are prefetched (into L2),
 *     at the same pace (about +10-15% on scattered pages, cold or warm);
 *   - mid-sized ranges use a plain 128-byte loop of fixed-size memcpy()s that the compiler
 *     turns into vector moves: on some x86 CPUs glibc's memcpy switches to `rep movsb` for
 *     a few KiB, which is several times slower there;
 *   - small (< 256 B) and large (>= 64 KiB) ranges go to memcpy(), which is best at both ends.
 * out must not overlap buf.
 *
 * snap_gather_fp is snap_gather with the page fingerprints of what it copied (a capture's
 * staging: invariant 6 wants the digests of the staged bytes): it copies about FP_TILE bytes
 * at a time and fingerprints the pages just copied while they are still in the cache, so
 * the staged bytes are not read from memory a second time.
 */
#include <string.h>

#include "internal.h"

#define SMALL_RANGE 256u
#define LARGE_RANGE 65536u
#define STEP 128u

/* 128 bytes through a temporary: two 64-byte block copies the compiler vectorises. */
static inline void copy_step(uint8_t *dst, const uint8_t *src)
{
    uint8_t t[STEP];
    memcpy(t, src, STEP);
    memcpy(dst, t, STEP);
}

/* Copies n bytes: STEP-sized blocks, then the tail. */
static inline void copy_loop(uint8_t *dst, const uint8_t *src, size_t n)
{
    size_t k = 0;
    for (; k + STEP <= n; k += STEP)
        copy_step(dst + k, src + k);
    if (k < n)
        memcpy(dst + k, src + k, n - k);
}

static inline void copy_one(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n < SMALL_RANGE || n >= LARGE_RANGE)
        memcpy(dst, src, n);
    else
        copy_loop(dst, src, n);
}

static inline int mid_sized(uint64_t n)
{
    return n >= SMALL_RANGE && n < LARGE_RANGE;
}

/* Four consecutive ranges (r[0..7]) that go through the lockstep copy. */
static inline int mid_group(const uint64_t *r)
{
    return mid_sized(r[1]) && mid_sized(r[3]) && mid_sized(r[5]) && mid_sized(r[7]);
}

static inline uint64_t min4(const uint64_t *r)
{
    uint64_t m = r[1];
    m = r[3] < m ? r[3] : m;
    m = r[5] < m ? r[5] : m;
    return r[7] < m ? r[7] : m;
}

/* The total length of the ranges into *total: SNAP_EINVAL when one is not inside buf[0:len]
 * (whatever the others), else SNAP_ESPACE when they hold more than out_cap bytes. */
static int ranges_total(size_t len, const uint64_t *ranges, size_t n_ranges, size_t out_cap,
                        uint64_t *total)
{
    int too_big = 0;
    *total = 0;
    for (size_t i = 0; i < n_ranges; i++) {
        uint64_t off = ranges[2 * i], n = ranges[2 * i + 1];
        if (off > (uint64_t)len || n > (uint64_t)len - off)     /* overflow-safe bounds */
            return SNAP_EINVAL;
        if (n > UINT64_MAX - *total)
            too_big = 1;
        else
            *total += n;
    }
    return too_big || *total > (uint64_t)out_cap ? SNAP_ESPACE : SNAP_OK;
}

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 2)
#else
#define PREFETCH(p) ((void)(p))
#endif

int snap_gather(const uint8_t *buf, size_t len, const uint64_t *ranges, size_t n_ranges,
                uint8_t *out, size_t out_cap, size_t *n_out)
{
    if (n_out == NULL)
        return SNAP_EINVAL;
    *n_out = 0;
    if ((buf == NULL && len != 0) || (ranges == NULL && n_ranges != 0) ||
        (out == NULL && out_cap != 0))
        return SNAP_EINVAL;

    uint64_t total = 0;
    int rc = ranges_total(len, ranges, n_ranges, out_cap, &total);
    if (rc != SNAP_OK)
        return rc;

    /* Every range is inside buf and the total fits out: all sizes below fit size_t. */
    uint8_t *dst = out;
    size_t i = 0;
    while (i < n_ranges) {
        const uint64_t *r = ranges + 2 * i;
        if (i + 4 <= n_ranges && mid_group(r)) {
            const uint8_t *s0 = buf + r[0], *s1 = buf + r[2], *s2 = buf + r[4], *s3 = buf + r[6];
            size_t n0 = (size_t)r[1], n1 = (size_t)r[3], n2 = (size_t)r[5], n3 = (size_t)r[7];
            uint8_t *d0 = dst, *d1 = d0 + n0, *d2 = d1 + n1, *d3 = d2 + n2;
            size_t m = (size_t)min4(r);
            /* The next group, prefetched STEP bytes of each range per step, up to its own
             * shortest range (all inside buf: the ranges were validated above). */
            const uint8_t *p0 = buf, *p1 = buf, *p2 = buf, *p3 = buf;
            size_t pm = 0;
            if (i + 8 <= n_ranges && mid_group(r + 8)) {
                p0 = buf + r[8];
                p1 = buf + r[10];
                p2 = buf + r[12];
                p3 = buf + r[14];
                pm = (size_t)min4(r + 8);
            }
            size_t k = 0;
            for (; k + STEP <= m; k += STEP) {
                if (k + STEP <= pm) {
                    PREFETCH(p0 + k);
                    PREFETCH(p0 + k + 64);
                    PREFETCH(p1 + k);
                    PREFETCH(p1 + k + 64);
                    PREFETCH(p2 + k);
                    PREFETCH(p2 + k + 64);
                    PREFETCH(p3 + k);
                    PREFETCH(p3 + k + 64);
                }
                copy_step(d0 + k, s0 + k);
                copy_step(d1 + k, s1 + k);
                copy_step(d2 + k, s2 + k);
                copy_step(d3 + k, s3 + k);
            }
            copy_loop(d0 + k, s0 + k, n0 - k);
            copy_loop(d1 + k, s1 + k, n1 - k);
            copy_loop(d2 + k, s2 + k, n2 - k);
            copy_loop(d3 + k, s3 + k, n3 - k);
            dst = d3 + n3;
            i += 4;
        } else {
            size_t n = (size_t)r[1];
            if (n != 0) {               /* n == 0 may come with out == NULL: skip the copy */
                copy_one(dst, buf + r[0], n);
                dst += n;
            }
            i++;
        }
    }
    *n_out = (size_t)total;
    return SNAP_OK;
}

#define FP_TILE ((size_t)256 << 10)     /* bytes copied between two fingerprint passes (L2) */

/* Fingerprints out's whole pages from *hashed up to written (partial: the last page too). */
static void fp_upto(const uint8_t *out, size_t written, size_t page_size, uint8_t *fps,
                    size_t *hashed, int partial)
{
    size_t upto = partial ? written : written / page_size * page_size;
    if (upto <= *hashed)
        return;
    size_t first = *hashed / page_size;
    /* room checked by the caller: snap_page_count(total) digests */
    (void)snap_fp_pages(out + *hashed, upto - *hashed, page_size, fps + first * SNAP_FP_BYTES,
                        snap_page_count(upto - *hashed, page_size) * SNAP_FP_BYTES);
    *hashed = upto;
}

int snap_gather_fp(const uint8_t *buf, size_t len, const uint64_t *ranges, size_t n_ranges,
                   uint8_t *out, size_t out_cap, size_t *n_out,
                   size_t page_size, uint8_t *fps, size_t fps_cap)
{
    if (n_out == NULL)
        return SNAP_EINVAL;
    *n_out = 0;
    if ((buf == NULL && len != 0) || (ranges == NULL && n_ranges != 0) ||
        (out == NULL && out_cap != 0) || (fps == NULL && fps_cap != 0) ||
        !page_size_ok(page_size))
        return SNAP_EINVAL;
    uint64_t total = 0;
    int rc = ranges_total(len, ranges, n_ranges, out_cap, &total);
    if (rc != SNAP_OK)
        return rc;
    if (snap_page_count((size_t)total, page_size) > fps_cap / SNAP_FP_BYTES)
        return SNAP_ESPACE;
    if (total == 0)
        return SNAP_OK;

    size_t written = 0, hashed = 0, got = 0;
    size_t i = 0;
    while (i < n_ranges) {
        size_t n = (size_t)ranges[2 * i + 1];
        if (n >= FP_TILE) {                         /* a large range: a tile at a time */
            const uint8_t *src = buf + ranges[2 * i];
            for (size_t k = 0; k < n; k += FP_TILE) {
                size_t m = n - k < FP_TILE ? n - k : FP_TILE;
                memcpy(out + written, src + k, m);
                written += m;
                fp_upto(out, written, page_size, fps, &hashed, 0);
            }
            i++;
            continue;
        }
        size_t j = i, group = 0;                    /* smaller ones: about a tile together */
        while (j < n_ranges && group < FP_TILE && (size_t)ranges[2 * j + 1] < FP_TILE)
            group += (size_t)ranges[2 * j++ + 1];
        (void)snap_gather(buf, len, ranges + 2 * i, j - i, out + written, out_cap - written,
                          &got);                    /* checked above: cannot fail */
        written += got;
        fp_upto(out, written, page_size, fps, &hashed, 0);
        i = j;
    }
    fp_upto(out, written, page_size, fps, &hashed, 1);
    *n_out = written;
    return SNAP_OK;
}

