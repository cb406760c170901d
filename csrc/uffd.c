/* uffd.c - kernel dirty-page tracking: userfaultfd asynchronous write-protection plus the
 * PAGEMAP_SCAN ioctl of /proc/<pid>/pagemap (Linux 6.7 and later).
 *
 * These are the one documented exception to "no I/O in C": thin system-call wrappers that take
 * and return plain integers (file descriptors, addresses, lengths). They validate their
 * arguments, never touch the tracked memory themselves, and report errno through *err.
 *
 * How the pieces fit (see snapstore.h for the contract of each function):
 *   snap_uffd_open        userfaultfd(2) + UFFDIO_API asking for UFFD_FEATURE_WP_ASYNC (a write
 *                         to a protected page is not reported as an event: the kernel simply
 *                         clears the page's uffd-wp bit and lets the write proceed) and
 *                         UFFD_FEATURE_WP_UNPOPULATED (never-touched pages are protected too,
 *                         through pte markers, so their first write is seen as well);
 *   snap_uffd_register    UFFDIO_REGISTER (mode WP) + UFFDIO_WRITEPROTECT of a range;
 *   snap_pagemap_scan     PAGEMAP_SCAN with PM_SCAN_WP_MATCHING: returns the written ranges and
 *                         write-protects them again in the same page-table walk, atomically per
 *                         page, so a write racing with the scan is either reported now or later;
 *   snap_uffd_unregister  removes protection, then the registration.
 * Transparent huge pages need nothing special: a write to a protected PMD-mapped huge page
 * makes the kernel split the mapping (async mode) and record the write per base page; only a
 * huge page written as a whole since the last scan (e.g. collapsed by khugepaged or
 * MADV_COLLAPSE after being written) is reported as one huge range (SNAP_SCAN_HUGE).
 *
 * The UAPI constants and structs that older system headers lack (Debian 12 ships headers from
 * before Linux 6.7) are defined below from the kernel's documented UAPI
 * (Documentation/admin-guide/mm/pagemap.rst, Documentation/admin-guide/mm/userfaultfd.rst).
 */
#define _GNU_SOURCE 1

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/fs.h>
#include <linux/types.h>
#include <linux/userfaultfd.h>

#include "snapstore.h"

/* ---- UAPI that older headers lack --------------------------------------------------------- */
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif

#ifndef PAGEMAP_SCAN
/* struct page_region and struct pm_scan_arg: Documentation/admin-guide/mm/pagemap.rst. */
struct page_region {
    __u64 start;
    __u64 end;
    __u64 categories;
};

struct pm_scan_arg {
    __u64 size;                 /* sizeof(struct pm_scan_arg) */
    __u64 flags;                /* PM_SCAN_* */
    __u64 start;                /* first address to walk (page aligned) */
    __u64 end;                  /* end of the walk (exclusive) */
    __u64 walk_end;             /* out: where the walk stopped */
    __u64 vec;                  /* struct page_region[vec_len] */
    __u64 vec_len;
    __u64 max_pages;            /* 0: no limit */
    __u64 category_inverted;
    __u64 category_mask;
    __u64 category_anyof_mask;
    __u64 return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)

#define PM_SCAN_WP_MATCHING   (1 << 0)   /* write-protect the pages that match */
#define PM_SCAN_CHECK_WPASYNC (1 << 1)   /* fail (EPERM) unless the range is async-WP tracked */

#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN   (1 << 1)
#define PAGE_IS_FILE      (1 << 2)
#define PAGE_IS_PRESENT   (1 << 3)
#define PAGE_IS_SWAPPED   (1 << 4)
#define PAGE_IS_PFNZERO   (1 << 5)
#define PAGE_IS_HUGE      (1 << 6)
#endif

_Static_assert(sizeof(struct pm_scan_arg) == 12 * 8, "struct pm_scan_arg is twelve u64");
_Static_assert(sizeof(struct page_region) == 3 * 8, "struct page_region is three u64");

#define NEEDED_FEATURES ((uint64_t)(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED))
#define SCAN_BATCH 256u   /* page_region entries per PAGEMAP_SCAN call (6 KiB of stack) */

/* The system page size, or 0 if it cannot be read (then every range is refused). */
static uint64_t sys_page(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (uint64_t)ps : 0;
}

/* start/len describe a nonempty page-aligned range that does not wrap around. */
static int valid_range(uint64_t start, uint64_t len)
{
    uint64_t ps = sys_page();
    return ps && len && start % ps == 0 && len % ps == 0 && start + len > start;
}

static int sys_fail(int *err, int e)
{
    *err = e ? e : EIO;
    return SNAP_ESYS;
}

int snap_uffd_open(int *fd, uint64_t *features, int *user_mode_only, int *err)
{
    if (!fd || !features || !user_mode_only || !err)
        return SNAP_EINVAL;
    *fd = -1;
    *features = 0;
    *user_mode_only = 0;
    *err = 0;

    int umo = 1;
    long r = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (r < 0 && errno == EINVAL) {   /* kernel without UFFD_USER_MODE_ONLY (before 5.11) */
        umo = 0;
        r = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    }
    if (r < 0)
        return sys_fail(err, errno);
    int ufd = (int)r;

    struct uffdio_api api = {0};
    api.api = UFFD_API;
    api.features = NEEDED_FEATURES;
    if (ioctl(ufd, UFFDIO_API, &api) < 0) {
        int e = errno;
        close(ufd);
        return sys_fail(err, e);
    }
    /* The kernel answers with every feature it supports; both asked for must be among them. */
    if ((api.features & NEEDED_FEATURES) != NEEDED_FEATURES ||
        !(api.ioctls & ((uint64_t)1 << _UFFDIO_REGISTER))) {
        close(ufd);
        return sys_fail(err, EOPNOTSUPP);
    }
    *fd = ufd;
    *features = api.features;
    *user_mode_only = umo;
    return SNAP_OK;
}

/* UFFDIO_WRITEPROTECT of [start, start+len): protect (mode WP) or unprotect (mode 0). */
static int writeprotect(int uffd, uint64_t start, uint64_t len, int protect)
{
    struct uffdio_writeprotect wp = {0};
    wp.range.start = start;
    wp.range.len = len;
    wp.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
    return ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) < 0 ? errno : 0;
}

static int unregister(int uffd, uint64_t start, uint64_t len)
{
    struct uffdio_range range = {start, len};
    return ioctl(uffd, UFFDIO_UNREGISTER, &range) < 0 ? errno : 0;
}

int snap_uffd_register(int uffd, uint64_t start, uint64_t len, int *err)
{
    if (!err)
        return SNAP_EINVAL;
    *err = 0;
    if (uffd < 0 || !valid_range(start, len))
        return SNAP_EINVAL;

    struct uffdio_register reg = {0};
    reg.range.start = start;
    reg.range.len = len;
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) < 0)
        return sys_fail(err, errno);
    int e = 0;
    if (!(reg.ioctls & ((uint64_t)1 << _UFFDIO_WRITEPROTECT)))
        e = EOPNOTSUPP;   /* registered, but this memory cannot be write-protected */
    else
        e = writeprotect(uffd, start, len, 1);
    if (e) {
        unregister(uffd, start, len);   /* best effort: leave nothing half set up */
        return sys_fail(err, e);
    }
    return SNAP_OK;
}

int snap_uffd_unregister(int uffd, uint64_t start, uint64_t len, int *err)
{
    if (!err)
        return SNAP_EINVAL;
    *err = 0;
    if (uffd < 0 || !valid_range(start, len))
        return SNAP_EINVAL;
    int e1 = writeprotect(uffd, start, len, 0);   /* protection first, then registration */
    int e2 = unregister(uffd, start, len);
    if (e1 || e2)
        return sys_fail(err, e1 ? e1 : e2);
    return SNAP_OK;
}

int snap_pagemap_scan(int pagemap_fd, uint64_t start, uint64_t end,
                      uint64_t *ranges, size_t max_ranges, size_t *n_ranges,
                      uint64_t *walk_end, int *err)
{
    if (!n_ranges || !walk_end || !err)
        return SNAP_EINVAL;
    *n_ranges = 0;
    *walk_end = start;
    *err = 0;
    uint64_t ps = sys_page();
    if (pagemap_fd < 0 || !ps || start % ps || end % ps || end < start ||
        (max_ranges && !ranges))
        return SNAP_EINVAL;
    if (start == end)
        return SNAP_OK;
    /* vec_len 0 is never passed to the kernel (it crashed kernels before 6.17.y). */
    if (max_ranges == 0)
        return SNAP_ESPACE;

    struct page_region vec[SCAN_BATCH];
    size_t n = 0;
    uint64_t cur = start;
    while (cur < end && n < max_ranges) {
        size_t room = max_ranges - n;
        struct pm_scan_arg arg = {0};
        arg.size = sizeof arg;
        arg.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
        arg.start = cur;
        arg.end = end;
        arg.vec = (uint64_t)(uintptr_t)vec;
        /* Never more regions than fit: each one the kernel returns is already re-protected
         * and must reach the caller. */
        arg.vec_len = room < SCAN_BATCH ? room : SCAN_BATCH;
        arg.category_mask = PAGE_IS_WRITTEN;
        arg.return_mask = PAGE_IS_WRITTEN | PAGE_IS_HUGE;
        long got = ioctl(pagemap_fd, PAGEMAP_SCAN, &arg);
        if (got < 0) {
            /* Pages already walked may have been protected without being reported: the
             * caller cannot vouch for the range any more (documented in snapstore.h). */
            *n_ranges = n;
            *walk_end = cur;
            return sys_fail(err, errno);
        }
        if ((uint64_t)got > arg.vec_len || arg.walk_end <= cur || arg.walk_end > end) {
            *n_ranges = n;
            *walk_end = cur;
            return sys_fail(err, EPROTO);   /* the kernel answered something impossible */
        }
        for (long i = 0; i < got; i++) {
            uint64_t s = vec[i].start, e = vec[i].end;
            uint64_t f = (vec[i].categories & PAGE_IS_HUGE) ? SNAP_SCAN_HUGE : 0;
            if (n && ranges[3 * (n - 1) + 1] == s && ranges[3 * (n - 1) + 2] == f) {
                ranges[3 * (n - 1) + 1] = e;   /* continues the previous range */
                continue;
            }
            ranges[3 * n] = s;
            ranges[3 * n + 1] = e;
            ranges[3 * n + 2] = f;
            n++;
        }
        cur = arg.walk_end;
    }
    *n_ranges = n;
    *walk_end = cur;
    return SNAP_OK;
}
