/*
 * snapstore.h - the C core of snapstore: byte-crunching loops over caller-owned buffers.
 *
 * Every function is pure: no I/O, no allocation unless stated, no global state, no Python.
 * Buffers are owned by the caller; lengths are in bytes unless stated otherwise.
 * Every function returns SNAP_OK (0) or a negative SNAP_E* code; snap_strerror() names it.
 * Functions never read or write outside the ranges their length arguments describe.
 */
#ifndef SNAPSTORE_H
#define SNAPSTORE_H

#include <stddef.h>
#include <stdint.h>

/* ---- return codes --------------------------------------------------------------------- */
#define SNAP_OK           0
#define SNAP_EINVAL     (-1)   /* an argument is invalid: NULL pointer with nonzero length,
                                  page size not a power of two in [SNAP_PAGE_MIN, SNAP_PAGE_MAX],
                                  CDC sizes out of order or out of range, a range outside the buffer */
#define SNAP_ESPACE     (-2)   /* an output array is too small for the result; nothing usable was
                                  produced (functions document the capacity that always suffices) */
#define SNAP_ESTATE     (-3)   /* an object is not initialised (bad magic) */

/* Returns a static, human-readable description of a return code. Never NULL. */
const char *snap_strerror(int code);

/* ---- pages and fingerprints ---------------------------------------------------------- */
#define SNAP_PAGE_MIN  512u
#define SNAP_PAGE_MAX  (1u << 20)
#define SNAP_FP_BYTES  16u     /* one XXH3-128 digest per page, stored low64 then high64,
                                  each little-endian (the canonical XXH128 layout is NOT used) */

/* Number of pages that cover len bytes: ceil(len / page_size). 0 if page_size is 0. */
size_t snap_page_count(size_t len, size_t page_size);

/* snap_fp_pages: XXH3-128 (seed 0) of every page of buf[0:len]; the last, partial page is
 * hashed over its real length. fps receives snap_page_count(len, page_size) digests.
 *   fps_cap   capacity of fps in bytes; must be >= SNAP_FP_BYTES * page count.
 * Errors: SNAP_EINVAL (bad page size, NULL pointers with nonzero sizes), SNAP_ESPACE (fps_cap). */
int snap_fp_pages(const uint8_t *buf, size_t len, size_t page_size,
                  uint8_t *fps, size_t fps_cap);

/* snap_fp_diff: one pass over buf that compares each page's XXH3-128 against fps (the digests
 * of the previous version, same layout as snap_fp_pages), writes the new digest of every
 * changed page back into fps, and reports the changed pages as coalesced runs.
 *   runs      receives *n_runs pairs (first_page, n_pages), ascending, non-adjacent, non-empty.
 *   max_runs  capacity of runs in pairs; (page_count + 1) / 2 always suffices.
 * The last, partial page is compared over its real length, as snap_fp_pages hashes it.
 * *n_runs is 0 after any error.
 * Errors: SNAP_EINVAL, SNAP_ESPACE (fps_cap too small, or more runs than max_runs: fps is then
 * partly updated and must be recomputed). */
int snap_fp_diff(const uint8_t *buf, size_t len, size_t page_size,
                 uint8_t *fps, size_t fps_cap,
                 uint64_t *runs, size_t max_runs, size_t *n_runs);

/* snap_shadow_diff: exact page compare (memcmp) of buf against shadow (both len bytes).
 * Changed pages are copied into shadow and reported as runs, exactly as snap_fp_diff.
 * buf == shadow is allowed (nothing changes). *n_runs is 0 after any error.
 * Errors: SNAP_EINVAL, SNAP_ESPACE (more runs than max_runs: shadow is then partly updated). */
int snap_shadow_diff(const uint8_t *buf, uint8_t *shadow, size_t len, size_t page_size,
                     uint64_t *runs, size_t max_runs, size_t *n_runs);

/* ---- gather ------------------------------------------------------------------------------ */
/* snap_gather: copy n_ranges byte ranges (pairs offset, length) of buf[0:len], in order, into
 * out back to back. Every range must lie inside buf; their total length must be <= out_cap.
 *   *n_out    receives the number of bytes written (0 after any error).
 * out must not overlap buf. Ranges may overlap each other and may be empty.
 * Errors: SNAP_EINVAL (range outside buf, NULL pointers), SNAP_ESPACE (out_cap too small;
 * nothing is copied). */
int snap_gather(const uint8_t *buf, size_t len, const uint64_t *ranges, size_t n_ranges,
                uint8_t *out, size_t out_cap, size_t *n_out);

/* ---- content-defined chunking (FastCDC, gear hash, normalized chunking level 2) ---------- */
/* For each byte b, with L the length of the open chunk before b:
 *   L <  min_size        b is skipped (not hashed; the hash restarts at 0 for every chunk);
 *   L >= min_size        h = (h << 1) + GEAR[b]; the chunk ends after b if (h & mask) == 0,
 *                        mask = mask_small while L < avg_size, mask_large from avg_size on;
 *   L + 1 == max_size    the chunk ends after b (forced cut).
 * bits = log2(avg_size); mask_small has bits + 2 one-bits, mask_large bits - 2, both in the
 * high bits of the 64-bit hash. GEAR is 256 splitmix64 outputs of seed 0x534E415053544F52
 * (see csrc/fastcdc.c). Cut points are part of the storage format (pinned by tests/golden). */
#define SNAP_CDC_MIN_LIMIT   64u           /* smallest allowed min_size */
#define SNAP_CDC_MAX_LIMIT   (64u << 20)   /* largest allowed max_size */

/* Streaming chunker state. Initialise with snap_cdc_init(); feed pieces with snap_cdc_feed();
 * end with snap_cdc_finish(). Feeding any split of a byte stream yields exactly the cut points
 * of feeding it in one piece. Fields are private. */
typedef struct snap_cdc {
    uint64_t magic;
    uint64_t min_size, avg_size, max_size;
    uint64_t mask_small;   /* used before avg_size: more bits, cuts less likely */
    uint64_t mask_large;   /* used from avg_size on: fewer bits, cuts more likely */
    uint64_t hash;         /* gear hash of the current chunk so far */
    uint64_t chunk_len;    /* bytes of the current (open) chunk seen so far */
    uint64_t offset;       /* stream offset of the next byte to be fed */
} snap_cdc;

/* min_size <= avg_size <= max_size; min_size >= SNAP_CDC_MIN_LIMIT; max_size <=
 * SNAP_CDC_MAX_LIMIT; avg_size a power of two. Errors: SNAP_EINVAL. */
int snap_cdc_init(snap_cdc *c, size_t min_size, size_t avg_size, size_t max_size);

/* Feed data[0:len]. Cut points are absolute stream offsets of chunk ends (exclusive), written
 * to cuts (ascending). Stops early when cuts is full, just before the byte that would end the
 * next chunk: *consumed tells how many bytes of data were taken (at least 1 when len > 0);
 * feed the rest again. len / min_size + 1 cut slots always suffice.
 * Errors: SNAP_EINVAL, SNAP_ESTATE, SNAP_ESPACE (max_cuts == 0 and len > 0). */
int snap_cdc_feed(snap_cdc *c, const uint8_t *data, size_t len,
                  uint64_t *cuts, size_t max_cuts, size_t *n_cuts, size_t *consumed);

/* End of stream: if an open chunk holds bytes, *cut receives its end (the stream length) and
 * *n_cuts is 1, else 0. The chunker is then reset to stream offset 0.
 * Errors: SNAP_EINVAL, SNAP_ESTATE. */
int snap_cdc_finish(snap_cdc *c, uint64_t *cut, size_t *n_cuts);

#endif
