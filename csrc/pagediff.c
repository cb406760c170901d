/* pagediff.c - snap_fp_diff (XXH3-128 page fingerprints) and snap_shadow_diff (memcmp against
 * a shadow copy): find the pages of a buffer that changed and report them as coalesced runs.
 *
 * Both make one sequential pass over the buffer, so they run at about memory read bandwidth
 * (plus the shadow read for snap_shadow_diff). Runs are pairs (first_page, n_pages) in
 * ascending order; adjacent changed pages always merge into one run, so runs are non-adjacent.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <string.h>

#include "internal.h"

/* Compares the XXH3-128 of buf[off:off+n] with the stored digest at fp; on a mismatch stores
 * the new digest and returns 1. */
static inline int page_changed(const uint8_t *page, size_t n, uint8_t *fp)
{
    XXH128_hash_t h = XXH3_128bits(page, n);
    if (h.low64 == load_le64(fp) && h.high64 == load_le64(fp + 8))
        return 0;
    store_le64(fp, h.low64);
    store_le64(fp + 8, h.high64);
    return 1;
}

int snap_fp_diff(const uint8_t *buf, size_t len, size_t page_size,
                 uint8_t *fps, size_t fps_cap,
                 uint64_t *runs, size_t max_runs, size_t *n_runs)
{
    if (n_runs == NULL)
        return SNAP_EINVAL;
    *n_runs = 0;
    if (!page_size_ok(page_size) || (buf == NULL && len != 0) ||
        (fps == NULL && fps_cap != 0) || (runs == NULL && max_runs != 0))
        return SNAP_EINVAL;
    size_t pages = len / page_size + (len % page_size != 0);
    if (pages > fps_cap / SNAP_FP_BYTES)
        return SNAP_ESPACE;

    runlist r = { runs, max_runs, 0, 0, 0 };
    size_t full = len / page_size;
    for (size_t p = 0; p < full; p++) {
        if (page_changed(buf + p * page_size, page_size, fps + p * SNAP_FP_BYTES) &&
            run_add(&r, p) != 0)
            return SNAP_ESPACE;
    }
    if (full < pages &&
        page_changed(buf + full * page_size, len - full * page_size, fps + full * SNAP_FP_BYTES) &&
        run_add(&r, full) != 0)
        return SNAP_ESPACE;
    if (run_flush(&r) != 0)
        return SNAP_ESPACE;
    *n_runs = r.n;
    return SNAP_OK;
}

int snap_shadow_diff(const uint8_t *buf, uint8_t *shadow, size_t len, size_t page_size,
                     uint64_t *runs, size_t max_runs, size_t *n_runs)
{
    if (n_runs == NULL)
        return SNAP_EINVAL;
    *n_runs = 0;
    if (!page_size_ok(page_size) || ((buf == NULL || shadow == NULL) && len != 0) ||
        (runs == NULL && max_runs != 0))
        return SNAP_EINVAL;
    if (len == 0)
        return SNAP_OK;

    runlist r = { runs, max_runs, 0, 0, 0 };
    size_t pages = len / page_size + (len % page_size != 0);
    for (size_t p = 0; p < pages; p++) {
        size_t off = p * page_size;
        size_t n = len - off < page_size ? len - off : page_size;
        if (memcmp(buf + off, shadow + off, n) != 0) {
            memmove(shadow + off, buf + off, n);    /* memmove: tolerate overlapping callers */
            if (run_add(&r, p) != 0)
                return SNAP_ESPACE;
        }
    }
    if (run_flush(&r) != 0)
        return SNAP_ESPACE;
    *n_runs = r.n;
    return SNAP_OK;
}
