/* fingerprint.c - snap_page_count and snap_fp_pages: XXH3-128 (seed 0) of every page.
 *
 * Digest layout (SNAP_FP_BYTES = 16 per page): low64 then high64, each little-endian, written
 * with explicit byte stores so the layout is the same on any host (gcc merges them into
 * plain 64-bit stores on little-endian targets).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <string.h>

#include "internal.h"

size_t snap_page_count(size_t len, size_t page_size)
{
    if (page_size == 0)
        return 0;
    return len / page_size + (len % page_size != 0);
}

int snap_fp_pages(const uint8_t *buf, size_t len, size_t page_size,
                  uint8_t *fps, size_t fps_cap)
{
    if (!page_size_ok(page_size) || (buf == NULL && len != 0) || (fps == NULL && fps_cap != 0))
        return SNAP_EINVAL;
    size_t pages = snap_page_count(len, page_size);
    if (pages > fps_cap / SNAP_FP_BYTES)            /* overflow-safe: pages * 16 > fps_cap */
        return SNAP_ESPACE;

    size_t full = len / page_size;
    for (size_t p = 0; p < full; p++) {
        XXH128_hash_t h = XXH3_128bits(buf + p * page_size, page_size);
        store_le64(fps + p * SNAP_FP_BYTES, h.low64);
        store_le64(fps + p * SNAP_FP_BYTES + 8, h.high64);
    }
    if (full < pages) {                             /* last, partial page: its real length */
        XXH128_hash_t h = XXH3_128bits(buf + full * page_size, len - full * page_size);
        store_le64(fps + full * SNAP_FP_BYTES, h.low64);
        store_le64(fps + full * SNAP_FP_BYTES + 8, h.high64);
    }
    return SNAP_OK;
}
