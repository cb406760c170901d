/* gather.c - snap_gather: copy byte ranges of a buffer back to back into an output buffer.
 *
 * Two passes over the range list: the first validates every range and the total (nothing is
 * copied on error), the second is a plain memcpy per range, so the copy runs at memcpy speed.
 */
#include <string.h>

#include "snapstore.h"

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
    int too_big = 0;
    for (size_t i = 0; i < n_ranges; i++) {
        uint64_t off = ranges[2 * i], n = ranges[2 * i + 1];
        if (off > (uint64_t)len || n > (uint64_t)len - off)     /* overflow-safe bounds */
            return SNAP_EINVAL;
        if (n > UINT64_MAX - total)
            too_big = 1;
        else
            total += n;
    }
    if (too_big || total > (uint64_t)out_cap)
        return SNAP_ESPACE;

    uint8_t *dst = out;
    for (size_t i = 0; i < n_ranges; i++) {
        size_t n = (size_t)ranges[2 * i + 1];
        if (n != 0) {                   /* n == 0 may come with out == NULL: skip memcpy */
            memcpy(dst, buf + ranges[2 * i], n);
            dst += n;
        }
    }
    *n_out = (size_t)total;
    return SNAP_OK;
}
