/* fprefine.c - snap_fp_diff_runs: snap_fp_diff restricted to listed pages.
 *
 * Used by kernel dirty-page tracking (snapstore/dirty.py, mode "uffd"): the kernel reports
 * written system pages, which, when the buffer does not start on a system-page boundary (a
 * numpy array's data sits 16 bytes into its malloc'ed block), straddle two pages of the
 * buffer's own page grid. Comparing just those candidate pages against their fingerprints
 * reports only the grid pages whose contents changed, instead of both neighbours.
 * Pure: no allocation, no I/O; reads only the listed pages of buf.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

#define PREFETCH_AHEAD 2u   /* pages in flight: the one being hashed and the next */

int snap_fp_diff_runs(const uint8_t *buf, size_t len, size_t page_size,
                      uint8_t *fps, size_t fps_cap,
                      const uint64_t *in_runs, size_t n_in,
                      uint64_t *runs, size_t max_runs, size_t *n_runs)
{
    if (n_runs == NULL)
        return SNAP_EINVAL;
    *n_runs = 0;
    if (page_size < SNAP_PAGE_MIN || page_size > SNAP_PAGE_MAX ||
        (page_size & (page_size - 1)) != 0 || (buf == NULL && len != 0) ||
        (fps == NULL && fps_cap != 0) || (in_runs == NULL && n_in != 0) ||
        (runs == NULL && max_runs != 0))
        return SNAP_EINVAL;
    size_t pages = len / page_size + (len % page_size != 0);
    if (pages > fps_cap / SNAP_FP_BYTES)
        return SNAP_ESPACE;
    /* Validate every input run first: nothing is read or updated on SNAP_EINVAL. */
    uint64_t next_free = 0;
    for (size_t i = 0; i < n_in; i++) {
        uint64_t first = in_runs[2 * i], count = in_runs[2 * i + 1];
        if (count == 0 || first < next_free || first >= pages || count > pages - first)
            return SNAP_EINVAL;
        next_free = first + count;
    }

    runlist r = { runs, max_runs, 0, 0, 0 };
    /* prefetch cursor: run pf_i, page pf_p; pf_left pages prefetched but not yet hashed */
    size_t pf_i = 0, pf_left = 0;
    uint64_t pf_p = n_in ? in_runs[0] : 0;
    for (size_t i = 0; i < n_in; i++) {
        uint64_t first = in_runs[2 * i], end = first + in_runs[2 * i + 1];
        for (uint64_t p = first; p < end; p++) {
            size_t off = (size_t)p * page_size;
            size_t plen = len - off < page_size ? len - off : page_size;
            /* Listed pages are usually scattered and hardware prefetchers stop at page
             * boundaries: fetch the page PREFETCH_AHEAD places further while hashing this one. */
            while (pf_i < n_in && pf_left < PREFETCH_AHEAD) {
                if (pf_p >= in_runs[2 * pf_i] + in_runs[2 * pf_i + 1]) {
                    if (++pf_i < n_in)
                        pf_p = in_runs[2 * pf_i];
                    continue;
                }
                const uint8_t *nx = buf + (size_t)pf_p * page_size;
                size_t nlen = len - (size_t)pf_p * page_size;
                if (nlen > page_size)
                    nlen = page_size;
                for (size_t k = 0; k < nlen; k += 64)
                    __builtin_prefetch(nx + k, 0, 2);
                pf_p++;
                pf_left++;
            }
            pf_left--;
            uint8_t *fp = fps + (size_t)p * SNAP_FP_BYTES;
            XXH128_hash_t h = XXH3_128bits(buf + off, plen);
            if (h.low64 == load_le64(fp) && h.high64 == load_le64(fp + 8))
                continue;
            store_le64(fp, h.low64);
            store_le64(fp + 8, h.high64);
            if (run_add(&r, (size_t)p) != 0)
                return SNAP_ESPACE;
        }
    }
    if (run_flush(&r) != 0)
        return SNAP_ESPACE;
    *n_runs = r.n;
    return SNAP_OK;
}
