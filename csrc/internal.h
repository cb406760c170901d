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

/* Little-endian 32-bit store/load, the same way (the record layout's u32 fields). */
static inline void store_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Do [p, p + n) and [q, q + m) share a byte? (Empty ranges never overlap; addresses compared
 * as integers, so unrelated buffers are fine.) */
static inline int overlaps(const uint8_t *p, size_t n, const uint8_t *q, size_t m)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return n != 0 && m != 0 && a < b + m && b < a + n;
}

/* A page size snapstore accepts: a power of two in [SNAP_PAGE_MIN, SNAP_PAGE_MAX]. */
static inline int page_size_ok(size_t page_size)
{
    return page_size >= SNAP_PAGE_MIN && page_size <= SNAP_PAGE_MAX &&
           (page_size & (page_size - 1)) == 0;
}

/* Run list: changed pages coalesced into (first_page, n_pages) pairs written to runs. The open
 * run is (start, count); count == 0 means none is open. */
typedef struct {
    uint64_t *runs;
    size_t max_runs, n;
    size_t start, count;
} runlist;

/* Stores the open run, if any. Returns 0, or -1 when runs is full. */
static inline int run_flush(runlist *r)
{
    if (r->count != 0) {
        if (r->n == r->max_runs)
            return -1;
        r->runs[2 * r->n] = r->start;
        r->runs[2 * r->n + 1] = r->count;
        r->n++;
        r->count = 0;
    }
    return 0;
}

/* Page p changed (pages come in ascending order). Returns 0, or -1 when runs is full. */
static inline int run_add(runlist *r, size_t p)
{
    if (r->count != 0 && r->start + r->count == p) {
        r->count++;
        return 0;
    }
    if (run_flush(r) != 0)
        return -1;
    r->start = p;
    r->count = 1;
    return 0;
}

#endif
