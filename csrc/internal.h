/*
 * internal.h - small helpers shared by the C core's files (not part of the public API).
 */
#ifndef SNAPSTORE_INTERNAL_H
#define SNAPSTORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "snapstore.h"

/* Little-endian 64-bit store/load with explicit bytes: the same layout on any host (gcc merges
 * them into plain 64-bit accesses on little-endian targets). */
static inline void store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A page size snapstore accepts: a power of two in [SNAP_PAGE_MIN, SNAP_PAGE_MAX]. */
static inline int page_size_ok(size_t page_size)
{
    return page_size >= SNAP_PAGE_MIN && page_size <= SNAP_PAGE_MAX &&
           (page_size & (page_size - 1)) == 0;
}

#endif
