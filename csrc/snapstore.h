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
#define SNAP_ESYS       (-4)   /* a system call failed; *err holds errno (only the kernel
                                  dirty-tracking wrappers below return it) */
#define SNAP_EDATA      (-5)   /* input bytes fail their checks (snap_read_chunks: a damaged
                                  chunk record; the read's status says why) */
#define SNAP_ENOMEM     (-6)   /* a library's context could not be allocated (zstd) */

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

/* snap_fp_diff_runs: snap_fp_diff restricted to the pages listed in in_runs, n_in pairs
 * (first_page, n_pages): ascending, non-overlapping (adjacent is fine), non-empty, inside the
 * buffer's snap_page_count(len, page_size) pages. Only those pages are read and compared with
 * fps (laid out as by snap_fp_pages for the whole buffer); a changed page gets its new digest
 * in fps and is reported in runs, coalesced as by snap_fp_diff. Other pages and their digests
 * are not touched. (csrc/fprefine.c; used to refine kernel-reported dirty pages.)
 *   max_runs  capacity of runs in pairs; the number of listed pages always suffices.
 * *n_runs is 0 after any error.
 * Errors: SNAP_EINVAL (bad page size, NULL pointers with nonzero sizes, an input run empty,
 * out of order, overlapping or outside the buffer: then nothing is read or updated),
 * SNAP_ESPACE (fps_cap smaller than the buffer's digests, or more runs than max_runs: fps is
 * then partly updated and must be recomputed). */
int snap_fp_diff_runs(const uint8_t *buf, size_t len, size_t page_size,
                      uint8_t *fps, size_t fps_cap,
                      const uint64_t *in_runs, size_t n_in,
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

/* snap_gather_fp: snap_gather, and the page fingerprints of the bytes it wrote: fps receives
 * snap_page_count(total, page_size) digests laid out as snap_fp_pages(out, total, page_size)
 * lays them out (the same values), computed while each copied piece is still in the cache.
 * Errors as snap_gather's, plus SNAP_EINVAL (bad page size, fps NULL with a capacity) and
 * SNAP_ESPACE (fps_cap too small); nothing is written on error. fps must not overlap buf or
 * out. */
int snap_gather_fp(const uint8_t *buf, size_t len, const uint64_t *ranges, size_t n_ranges,
                   uint8_t *out, size_t out_cap, size_t *n_out,
                   size_t page_size, uint8_t *fps, size_t fps_cap);

/* ---- byte diff (csrc/bytediff.c) --------------------------------------------------------- */
/* snap_diff_bytes: where a[0:len] and b[0:len] differ. runs receives *n_runs pairs (offset,
 * length), ascending, non-empty: the maximal differing runs, with runs fewer than max(gap, 1)
 * equal bytes apart merged into one (gap 0 or 1: only touching runs merge, i.e. exact runs).
 * *n_changed receives the exact number of differing bytes (not the merged runs' total).
 *   max_runs  capacity of runs in pairs; len / (max(gap, 1) + 1) + 1 always suffices.
 * a == b is allowed. *n_runs and *n_changed are 0 after any error.
 * Errors: SNAP_EINVAL (NULL pointers with nonzero sizes, NULL n_runs or n_changed),
 * SNAP_ESPACE (more runs than max_runs). */
int snap_diff_bytes(const uint8_t *a, const uint8_t *b, size_t len, size_t gap,
                    uint64_t *runs, size_t max_runs, size_t *n_runs, uint64_t *n_changed);

/* ---- byte planes of fixed-size items (csrc/planes.c; docs/floatcodec.md) ------------------
 * A buffer of len bytes holds n = len / itemsize items of itemsize bytes and t = len % itemsize
 * tail bytes. Its planes are len bytes laid out as:
 *   [plane 0: byte 0 of items 0..n-1][plane 1: byte 1 of every item] ... [plane itemsize-1]
 *   [the t tail bytes]
 * i.e. planes[j * n + i] = item i's byte j (the byte at offset itemsize * i + j), and
 * planes[itemsize * n + r] = the tail's byte r. itemsize 1 is a plain copy. Every byte string
 * is accepted, float or not (NaN payloads, denormals, -0.0 are bytes like any other).
 * itemsize is 1..SNAP_ITEMSIZE_MAX. Output and input must not overlap (except dst == ref in
 * snap_delta_join_planes); no function allocates. Every function writes exactly len bytes of
 * its output on success and nothing on error.
 * Common errors: SNAP_EINVAL (itemsize out of range, a NULL pointer with a nonzero length or
 * capacity, overlapping buffers, a bad delta mode), SNAP_ESPACE (output capacity < len). */
#define SNAP_ITEMSIZE_MAX 8u

/* Delta modes: how an item is coded against the same item of a reference buffer.
 *   SNAP_DELTA_XOR  item XOR reference item; any itemsize.
 *   SNAP_DELTA_SUB  zigzag(item - reference item) over unsigned little-endian words of
 *                   itemsize bytes (1, 2, 4 or 8 only), mod 2^(8 itemsize), where
 *                   zigzag(d) = (d << 1) XOR (all ones if d's top bit is set, else 0):
 *                   differences 0, -1, 1, -2, ... become 0, 1, 2, 3, ... For IEEE floats of the
 *                   same sign this is the distance in ulps: small changes give small numbers.
 * The tail bytes are coded by XOR in both modes. */
#define SNAP_DELTA_XOR 1
#define SNAP_DELTA_SUB 2

/* Split flags: a rotation.
 *   SNAP_PLANES_ROTATE_BY(r)  (0 <= r <= 7; 0: none) each item, read as an unsigned
 *                       little-endian word of itemsize bytes (1, 2, 4 or 8 only), is rotated
 *                       left by r bits before the split: (w << r) | (w >> (8 itemsize - r)).
 *                       The tail bytes are not rotated.
 *   SNAP_PLANES_ROTATE  r = 1: an IEEE float's sign bit becomes bit 0, so plane itemsize-1 of
 *                       float32 or bfloat16 holds exactly the exponents.
 *   SNAP_PLANES_ROTATION  the bits of the flags that hold r (no other bit may be set). */
#define SNAP_PLANES_ROTATION 7u
#define SNAP_PLANES_ROTATE_BY(r) ((unsigned)(r) & SNAP_PLANES_ROTATION)
#define SNAP_PLANES_ROTATE 1u

/* snap_split_planes: src[0:len] -> planes[0:len] as above ("byte shuffle").
 *   flags       0, or SNAP_PLANES_ROTATE_BY(r).
 *   planes_cap  capacity of planes in bytes; must be >= len.
 * Errors: SNAP_EINVAL (also: unknown flags, a rotation with itemsize not 1, 2, 4 or 8),
 * SNAP_ESPACE. */
int snap_split_planes(const uint8_t *src, size_t len, size_t itemsize, unsigned flags,
                      uint8_t *planes, size_t planes_cap);

/* snap_join_planes: the exact inverse: planes[0:len] (made by snap_split_planes with the same
 * itemsize and flags) -> dst[0:len].
 *   dst_cap  capacity of dst in bytes; must be >= len.
 * Errors: SNAP_EINVAL (as snap_split_planes), SNAP_ESPACE. */
int snap_join_planes(const uint8_t *planes, size_t len, size_t itemsize, unsigned flags,
                     uint8_t *dst, size_t dst_cap);

/* snap_delta_split_planes: the planes of the delta of cur[0:len] against ref[0:len] (the
 * previous version of the same buffer, same length), in one pass: plane j holds byte j of
 * delta(item i of cur, item i of ref) for every i (delta per mode, above); the tail holds
 * cur's tail XOR ref's tail. cur and ref may overlap each other (cur == ref gives zeros).
 * Errors: SNAP_EINVAL (also: mode not a SNAP_DELTA_* value, SNAP_DELTA_SUB with itemsize not
 * 1, 2, 4 or 8, planes overlapping cur or ref), SNAP_ESPACE (planes_cap < len). */
int snap_delta_split_planes(const uint8_t *cur, const uint8_t *ref, size_t len, size_t itemsize,
                            int mode, uint8_t *planes, size_t planes_cap);

/* snap_delta_join_planes: the exact inverse: given ref[0:len] and the planes made by
 * snap_delta_split_planes with the same itemsize and mode, rebuilds cur into dst[0:len].
 * dst == ref is allowed (rebuild in place over the reference); any other overlap of dst with
 * ref or planes is not.
 * Errors: SNAP_EINVAL (as snap_delta_split_planes), SNAP_ESPACE (dst_cap < len). */
int snap_delta_join_planes(const uint8_t *planes, const uint8_t *ref, size_t len,
                           size_t itemsize, int mode, uint8_t *dst, size_t dst_cap);

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

/* ---- early writeback (csrc/writeback.c) -----------------------------------------------------
 * snap_start_writeback: sync_file_range(fd, offset, len, SYNC_FILE_RANGE_WRITE): starts
 * writing [offset, offset+len) of the file to the device without waiting for it. A hint: no
 * durability. Errors: SNAP_EINVAL (fd < 0, a range past INT64_MAX, err NULL), SNAP_ESYS (*err:
 * errno; ENOSYS where the system lacks the call). */
int snap_start_writeback(int fd, uint64_t offset, uint64_t len, int *err);

/* ---- prefaulting a destination (csrc/prefault.c) --------------------------------------------
 * snap_prefault_write: the whole pages inside [addr, addr+len) made present and writable with
 * one madvise(MADV_POPULATE_WRITE), unless a sample of up to 16 of them (mincore) are all
 * resident already. Never reads or writes the memory's bytes. *populated: 1 when the madvise
 * ran. Errors: SNAP_EINVAL (a range past UINT64_MAX, a NULL pointer), SNAP_ESYS (*err: errno;
 * EINVAL where the kernel lacks MADV_POPULATE_WRITE, ENOMEM for an unmapped range, EFAULT). */
int snap_prefault_write(uint64_t addr, uint64_t len, int *populated, int *err);

/* ---- kernel dirty-page tracking (Linux >= 6.7; csrc/uffd.c) ------------------------------
 * The one documented exception to "no I/O": thin system-call wrappers over userfaultfd
 * asynchronous write-protection (UFFD_FEATURE_WP_ASYNC) and the PAGEMAP_SCAN ioctl of
 * /proc/self/pagemap. They take and return plain integers (file descriptors, addresses,
 * lengths in bytes); they never read or write the tracked memory. Every one takes int *err:
 * 0 on success and after SNAP_EINVAL/SNAP_ESPACE, errno after SNAP_ESYS; err must not be NULL.
 * "Page" here means the system page (sysconf(_SC_PAGESIZE)); ranges must be page aligned.
 * The file descriptors are the caller's to close; after fork() they still refer to the
 * parent's memory: a child must not use inherited ones (see snapstore/dirty.py). */

/* snap_uffd_open: a userfaultfd (O_CLOEXEC|O_NONBLOCK|UFFD_USER_MODE_ONLY; opened again without
 * UFFD_USER_MODE_ONLY only if the kernel refuses that flag with EINVAL) set up by UFFDIO_API
 * with UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED.
 *   *fd              receives the descriptor (-1 after any error; nothing stays open).
 *   *features        receives every feature the kernel reported (0 after any error).
 *   *user_mode_only  receives 1 if UFFD_USER_MODE_ONLY was used, else 0.
 * Errors: SNAP_EINVAL (a NULL pointer), SNAP_ESYS (userfaultfd(2) or UFFDIO_API failed, e.g.
 * EPERM when unprivileged userfaultfd is disabled, ENOSYS; *err = EOPNOTSUPP when the kernel
 * lacks one of the two features). */
int snap_uffd_open(int *fd, uint64_t *features, int *user_mode_only, int *err);

/* snap_uffd_register: UFFDIO_REGISTER of [start, start+len) in mode WP, then UFFDIO_WRITEPROTECT
 * of the whole range: from now on the kernel records every write to it (see snap_pagemap_scan).
 * start and len: page aligned, len > 0, no wrap-around. The range must be mapped.
 * Errors: SNAP_EINVAL (uffd < 0, bad range), SNAP_ESYS (EINVAL: not mapped or memory that
 * cannot be registered; EBUSY: registered with another userfaultfd; EOPNOTSUPP: registered but
 * not write-protectable). After SNAP_ESYS nothing stays registered. */
int snap_uffd_register(int uffd, uint64_t start, uint64_t len, int *err);

/* snap_uffd_unregister: removes write protection of [start, start+len) (UFFDIO_WRITEPROTECT
 * mode 0), then the registration (UFFDIO_UNREGISTER). Both are attempted even if the first
 * fails; afterwards writes to the range never involve the userfaultfd.
 * Errors: SNAP_EINVAL (uffd < 0, bad range), SNAP_ESYS (errno of the first failing step). */
int snap_uffd_unregister(int uffd, uint64_t start, uint64_t len, int *err);

/* snap_pagemap_scan: PAGEMAP_SCAN over [start, end) of the process whose pagemap_fd
 * (/proc/<pid>/pagemap, opened O_RDONLY) is given, with PM_SCAN_WP_MATCHING |
 * PM_SCAN_CHECK_WPASYNC and category_mask = PAGE_IS_WRITTEN: reports the ranges written since
 * they were last protected and write-protects them again in the same walk.
 *   ranges      receives *n_ranges triples (first address, end address, flags): ascending,
 *               non-overlapping, page aligned; adjacent ranges with equal flags are merged.
 *               flags: SNAP_SCAN_HUGE if the range was mapped by a transparent huge page
 *               (written as a whole since the last scan, e.g. after a collapse; a
 *               single write to a protected huge page splits it and is reported per page).
 *   max_ranges  capacity of ranges in triples; (end - start) / page always suffices.
 *   *walk_end   receives where the walk stopped: end when [start, end) was scanned completely;
 *               less when ranges filled up: scan again from *walk_end (nothing is lost: pages
 *               from *walk_end on were neither reported nor re-protected).
 * The whole range must be registered (snap_uffd_register) with this process's userfaultfd.
 * start == end returns at once (*n_ranges 0, *walk_end start).
 * Errors: SNAP_EINVAL (pagemap_fd < 0, unaligned or reversed range, NULL pointers),
 * SNAP_ESPACE (max_ranges == 0 with start < end; the kernel is not called), SNAP_ESYS
 * (EPERM: part of the range is not tracked by async write-protection; EPROTO: the kernel
 * answered with an impossible walk position). After SNAP_ESYS the ranges reported so far are
 * in ranges[0:*n_ranges] but pages walked in the failing call may have been re-protected
 * without being reported: the caller can no longer vouch for [*walk_end, end). */
#define SNAP_SCAN_HUGE 1u
int snap_pagemap_scan(int pagemap_fd, uint64_t start, uint64_t end,
                      uint64_t *ranges, size_t max_ranges, size_t *n_ranges,
                      uint64_t *walk_end, int *err);

/* ---- chunk records ------------------------------------------------------------------------
 * The segment record layout of snapstore/engine/format.py (docs/design.md "Segment files"),
 * mirrored for snap_read_chunks and snap_write_chunks; tests/unit/test_native_records.py
 * holds the two equal. */
#define SNAP_REC_MAGIC          "SREC"
#define SNAP_REC_HEADER         24u  /* magic, type, codec, flags, length, reserved, checksum */
#define SNAP_REC_CHECKSUMMED    16u  /* header bytes the XXH3-64 covers, then the payload */
#define SNAP_REC_CHUNK          1u   /* the chunk record type */
#define SNAP_REC_CHUNK_ID       32u
#define SNAP_REC_CHUNK_PREFIX   36u  /* chunk id, u32 raw length */
#define SNAP_REC_CODEC_RAW      0u
#define SNAP_REC_CODEC_ZSTD     1u
#define SNAP_REC_CODEC_PLANES   2u
#define SNAP_REC_PLANES_HEADER  2u   /* item size, flags */
#define SNAP_REC_PLANE_ENTRY    5u   /* how stored, u32 stored length */
#define SNAP_REC_PLANES_ROTATE  1u   /* the flags of format 4 and 5's planes: rotated 1 bit */
#define SNAP_REC_PLANES_ROTATION 7u  /* the flags hold the rotation, 0..7 (format 6 writes 1, 3) */
#define SNAP_REC_PLANE_RAW      0u
#define SNAP_REC_PLANE_ZSTD     1u
/* Delta planes (CODEC_DELTA_PLANES, format 5, planned: no segment version may hold it yet;
 * docs/floatcodec.md "Decided (stop 37)"): the stored bytes open with the base chunk's id and
 * the chunk's depth (1: its base is stored whole), then a plane table and planes laid out as
 * CODEC_PLANES', flags 0, whose planes are snap_delta_split_planes(chunk, base, SNAP_DELTA_SUB). */
#define SNAP_REC_CODEC_DELTA_PLANES 3u
#define SNAP_REC_DELTA_HEADER   33u  /* base chunk id, u8 depth */

/* Why a read failed (snap_chunk_read.status after SNAP_EDATA). */
#define SNAP_READ_HEADER    1   /* bad magic, not a chunk record, unknown codec, flags/reserved set */
#define SNAP_READ_LENGTH    2   /* payload or raw length not the one expected */
#define SNAP_READ_CHECKSUM  3   /* the record's checksum does not match */
#define SNAP_READ_PREFIX    4   /* another chunk id or raw length in the prefix, or no prefix */
#define SNAP_READ_FRAME     5   /* not exactly one zstd frame of exactly the expected size */
#define SNAP_READ_PLANES    6   /* bad plane table (item size, flags, kinds, lengths) */
#define SNAP_READ_SCRATCH   7   /* scratch smaller than the chunk's raw length */
#define SNAP_READ_NOMEM     8   /* zstd could not allocate its decompression context */
#define SNAP_READ_BASE      9   /* a delta record whose base is not the one the read names */

/* One chunk record to read: where it lies in src, where its bytes go in dst, and what the
 * index says it is. */
typedef struct snap_chunk_read {
    uint64_t src_off;        /* the record header's offset in src */
    uint64_t dst_off;        /* where the chunk's raw_len bytes go in dst */
    uint32_t stored_len;     /* the record's payload length (chunk prefix + stored bytes) */
    uint32_t raw_len;        /* the chunk's raw length */
    uint8_t chunk_id[32];
    uint8_t base_id[32];     /* a delta record's base: the chunk whose raw bytes the caller put
                                at dst[dst_off:dst_off + raw_len] already (all zero: none, and
                                a delta record there fails with SNAP_READ_BASE) */
    int32_t status;          /* out: SNAP_OK, or a SNAP_READ_* reason */
} snap_chunk_read;

/* snap_read_chunks: checks and decodes reads[0:n] in order (see chunkread.c for the checks):
 * each record's raw bytes go to dst[dst_off:dst_off + raw_len], written only once that record
 * passed every check; a delta record's are rebuilt in place over its base's bytes there (an
 * earlier read of the same call may have put them). Stops at the first record that fails: SNAP_EDATA, *n_done its index and
 * its status the reason (the reads before it are done). Allocates a zstd context per call.
 *   scratch      work space of scratch_cap bytes, at least the largest raw_len of a coded
 *                (zstd or planes) chunk; may be NULL when scratch_cap is 0.
 * Errors: SNAP_EINVAL (a NULL pointer with a nonzero length, a read's record or destination
 * outside src or dst, scratch, src and dst overlapping; nothing is done), SNAP_EDATA. */
int snap_read_chunks(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                     snap_chunk_read *reads, size_t n, uint8_t *scratch, size_t scratch_cap,
                     size_t *n_done);

/* Room a chunk record may need in snap_write_chunks' out beyond the chunk's raw length: the
 * record header, the chunk prefix, a delta header and a plane table of 8 planes. */
#define SNAP_REC_WRITE_SLACK    (SNAP_REC_HEADER + SNAP_REC_CHUNK_PREFIX + \
                                 SNAP_REC_DELTA_HEADER + SNAP_REC_PLANES_HEADER + \
                                 8u * SNAP_REC_PLANE_ENTRY)

/* One chunk to encode: its raw bytes and id in, where its record went and how it is coded
 * out. */
typedef struct snap_chunk_write {
    const uint8_t *src;      /* the chunk's raw_len bytes */
    const uint8_t *base;     /* NULL, or raw_len bytes of the base chunk to code a delta against */
    uint64_t out_off;        /* out: its record's offset in out */
    uint32_t raw_len;
    uint32_t stored_len;     /* out: the record's payload length (chunk prefix + stored bytes) */
    uint8_t chunk_id[32];    /* the BLAKE3-256 of the raw bytes (written into the prefix) */
    uint8_t base_id[32];     /* with base: the base chunk's id (written, not checked) */
    uint8_t codec;           /* out: SNAP_REC_CODEC_DELTA_PLANES, _PLANES or _RAW */
    uint8_t packed;          /* out: bit j set when plane j is stored as a zstd frame */
    uint8_t depth;           /* with base: the chunk's depth, 1 + the base's (1..255) */
    uint8_t reserved[5];
} snap_chunk_write;

/* snap_write_chunks: encodes chunks[0:n] (items of itemsize bytes, 2, 4 or 8, aligned to each
 * chunk's start) as complete chunk records laid back to back in out, in order (see
 * chunkwrite.c for the coding rules): for a chunk with a base, CODEC_DELTA_PLANES with the
 * delta planes of bits try_delta tried as zstd frames where that pays; else CODEC_PLANES with
 * the planes of bits try_planes tried, or CODEC_RAW (always, when try_planes is 0 and no delta
 * paid). *out_len gets the bytes used.
 *   rotate       the rotation of CODEC_PLANES records (0..7; the plane header's flags): their
 *                items are split with SNAP_PLANES_ROTATE_BY(rotate).
 *   out_cap      at least the sum of SNAP_REC_WRITE_SLACK + raw_len over the chunks.
 *   scratch      work space of at least the largest raw_len.
 * Allocates zstd contexts per call (when try_planes or try_delta is nonzero).
 * Errors: SNAP_EINVAL (a NULL pointer with a nonzero length, an item size other than 2, 4 or 8,
 * try_planes or try_delta bits at or above itemsize, a rotate above 7, a chunk larger than
 * scratch, a chunk or base overlapping out or scratch, out and scratch overlapping, a base
 * with depth 0),
 * SNAP_ESPACE (out_cap too small), SNAP_ENOMEM; nothing is written then. */
int snap_write_chunks(snap_chunk_write *chunks, size_t n, size_t itemsize, unsigned try_planes,
                      unsigned rotate, unsigned try_delta, uint8_t *out, size_t out_cap,
                      uint8_t *scratch, size_t scratch_cap, size_t *out_len);

/* snap_raw_record_heads: for each of chunks[0:n] (src, raw_len, chunk_id given) the head of its
 * raw chunk record, SNAP_REC_RAW_HEAD bytes at out + i * SNAP_REC_RAW_HEAD (= out_off): the
 * record header, its checksum over the chunk's bytes included, and the chunk prefix. The whole
 * record is that head followed by the raw_len bytes at src, which are read, not copied. Sets
 * stored_len, codec (SNAP_REC_CODEC_RAW), packed (0) and out_off.
 * Errors: SNAP_EINVAL (a NULL pointer with a nonzero length, a chunk of 4 GiB or more, a chunk
 * overlapping out), SNAP_ESPACE (out_cap under n * SNAP_REC_RAW_HEAD); nothing is written
 * then. */
#define SNAP_REC_RAW_HEAD       (SNAP_REC_HEADER + SNAP_REC_CHUNK_PREFIX)
int snap_raw_record_heads(snap_chunk_write *chunks, size_t n, uint8_t *out, size_t out_cap);

#endif
