/* Early writeback of a file range (Linux sync_file_range with SYNC_FILE_RANGE_WRITE): the log
 * asks the kernel to start writing bytes it just appended, so that the fdatasync that later
 * makes them durable finds most of them on the device already. A hint only: it gives no
 * durability, and where the system lacks it the call reports SNAP_ESYS with ENOSYS. */
#define _GNU_SOURCE 1

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>

#include "snapstore.h"

int snap_start_writeback(int fd, uint64_t offset, uint64_t len, int *err)
{
    if (!err)
        return SNAP_EINVAL;
    *err = 0;
    if (fd < 0 || offset > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - offset)
        return SNAP_EINVAL;
#ifdef SYNC_FILE_RANGE_WRITE
    if (sync_file_range(fd, (off64_t)offset, (off64_t)len, SYNC_FILE_RANGE_WRITE) != 0) {
        *err = errno ? errno : EIO;
        return SNAP_ESYS;
    }
    return SNAP_OK;
#else
    *err = ENOSYS;
    return SNAP_ESYS;
#endif
}
