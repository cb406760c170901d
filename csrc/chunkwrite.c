/* chunkwrite.c - snap_write_chunks: encode a batch of chunks of items as whole records;
 * snap_raw_record_heads: the heads of raw records of a batch.
 *
 * A checkpoint's hot loop for float buffers: for every chunk (raw bytes in src, its chunk id
 * given) lay out the complete chunk record in out, back to back: the record header (magic,
 * chunk type, codec, zero flags and reserved field, payload length, the XXH3-64 checksum over
 * the first 16 header bytes and the payload), the chunk prefix (chunk id, raw length), then
 * the stored bytes. Byte planes (CODEC_PLANES: the chunk's items rotated left by the caller's
 * rotation, 0..7 bits (writers choose 1 or 3), and split into planes by snap_split_planes;
 * each plane one zstd frame where that frame is shorter than n - n/32 of the plane's n
 * bytes, else the plane as it is) when at least one plane packed and
 * the whole coding is shorter than raw_len - raw_len/32; else the raw bytes (CODEC_RAW). A
 * chunk given a base (the previous version of the same bytes, format 5's CODEC_DELTA_PLANES:
 * planned, not yet written by the engine) is first coded as the planes of its items' zigzag
 * differences to the base's (snap_delta_split_planes, SNAP_DELTA_SUB), behind the base's id
 * and the chunk's depth, by the same rules; where that does not pay, as above. Those
 * are the rules of snapstore/engine/writer.py's encode_chunk, which calls this; the layout is
 * docs/design.md's "Segment files" (SNAP_REC_* mirror snapstore/engine/format.py) and
 * snap_read_chunks reads it back.
 *
 * The zstd profiles (pack_plane): literals only (Huffman, no match search) first, and where
 * that leaves a plane near a bit per byte or unpacked, the profile docs/floatcodec.md
 * measured for planes ("1f": level 1 with a 64-entry hash table, one probe, 7-byte minimum
 * matches); frames that declare their content size either way, so readers are unchanged. snap_raw_record_heads makes the head (header and prefix) of raw records whose bytes
 * stay where they are, for the caller to write after it: incompressible bytes are then
 * checksummed here and copied only by the write. Called without the GIL, both run on as many
 * threads as the caller gives disjoint outputs and scratch areas.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>
#define ZSTD_STATIC_LINKING_ONLY        /* ZSTD_c_literalCompressionMode (libzstd >= 1.5.0) */
#include <zstd.h>
#include <string.h>

#include "internal.h"

/* The match-finding profile: level 1, a 64-entry hash table, one probe, 7-byte matches. */
static ZSTD_CCtx *matching_cctx(void)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    if (c == NULL)
        return NULL;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_hashLog, 6)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_searchLog, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_minMatch, 7)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_targetLength, 0)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0))) {
        ZSTD_freeCCtx(c);
        return NULL;
    }
    return c;
}

/* The literals profile: the same, accelerated past any match search (targetLength is the
 * fast strategy's acceleration), with the literals Huffman-coded all the same (zstd would
 * leave them raw at that acceleration). A float's exponent plane is all literals: its bytes
 * repeat few values, in no long runs; this codes it at 1.6-1.7x the matching profile's
 * speed, and a little smaller (no short matches that cost more than they save). NULL when
 * the library lacks the literals switch (then only the matching profile is used). */
static ZSTD_CCtx *literals_cctx(void)
{
    ZSTD_CCtx *c = matching_cctx();
    if (c == NULL)
        return NULL;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_targetLength, 1 << 16)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_literalCompressionMode,
                                            ZSTD_ps_enable))) {
        ZSTD_freeCCtx(c);
        return NULL;
    }
    return c;
}

typedef struct {
    ZSTD_CCtx *literals;    /* may be NULL */
    ZSTD_CCtx *matching;
} plane_coders;

static size_t frame_or_0(ZSTD_CCtx *c, uint8_t *dst, size_t cap, const uint8_t *src, size_t n)
{
    size_t len = ZSTD_compress2(c, dst, cap, src, n);
    return ZSTD_isError(len) ? 0 : len;
}

/* One plane (n bytes) as a zstd frame shorter than cap, in dst (room for 2 * cap: the second
 * half is the other profile's try): its length, or 0. The literals profile first; where it
 * did not pack, or packed near Huffman's floor of a bit per byte (a plane mostly of one byte,
 * or of repeats, where matches do far better), the matching profile too, the shorter kept. */
static size_t pack_plane(const plane_coders *z, const uint8_t *plane, size_t n, uint8_t *dst,
                         size_t cap)
{
    size_t len = z->literals ? frame_or_0(z->literals, dst, cap, plane, n) : 0;
    if (z->literals && len && len > n / 8 + 64)
        return len;
    size_t other = frame_or_0(z->matching, dst + cap, len ? len - 1 : cap, plane, n);
    if (other == 0)
        return len;
    memcpy(dst, dst + cap, other);
    return other;
}

/* Packs the planes laid out at s + table (the plane table's place; raw_len bytes: k planes
 * of raw_len / k bytes, then the tail) in place: writes the plane table (item size, flags, per
 * plane how stored and its length) at s and returns the section's length. *packed gets the
 * zstd planes' bits. A packed plane's frame (made in scratch) takes the plane's place and what
 * follows moves down: a raw plane is never copied when no plane before it packed (a float's
 * packed plane is its last). */
static size_t pack_laid_planes(const plane_coders *z, uint8_t *s, size_t raw_len, size_t k,
                               unsigned flags, unsigned try_planes, uint8_t *scratch,
                               unsigned *packed)
{
    size_t n = raw_len / k, tail = raw_len % k;
    size_t table = SNAP_REC_PLANES_HEADER + k * SNAP_REC_PLANE_ENTRY;
    uint8_t *laid = s + table;
    *packed = 0;
    s[0] = (uint8_t)k;
    s[1] = (uint8_t)flags;
    size_t pos = table;                 /* never past plane j's own place: <= table + j * n */
    size_t keep = n - n / 32;           /* a zstd plane must be shorter than this */
    for (size_t j = 0; j < k; j++) {
        uint8_t *entry = s + SNAP_REC_PLANES_HEADER + j * SNAP_REC_PLANE_ENTRY;
        const uint8_t *plane = laid + j * n;
        size_t len = 0;
        if ((try_planes >> j & 1u) && keep > 1)
            len = pack_plane(z, plane, n, scratch, keep - 1);
        if (len) {
            entry[0] = SNAP_REC_PLANE_ZSTD;
            *packed |= 1u << j;
            memcpy(s + pos, scratch, len);      /* ends before plane j + 1's place */
        } else {
            entry[0] = SNAP_REC_PLANE_RAW;
            if (s + pos != plane)
                memmove(s + pos, plane, n);
            len = n;
        }
        store_le32(entry + 1, (uint32_t)len);
        pos += len;
    }
    if (tail && s + pos != laid + k * n)
        memmove(s + pos, laid + k * n, tail);
    return pos + tail;
}

/* The stored bytes of the planes coding of chunk[0:raw_len] into s (room for the plane table
 * and raw_len bytes): their length, or 0 when no plane packed or the coding is not shorter
 * than raw_len - raw_len/32 (then s holds garbage). The planes are split straight into their
 * places in s as if all stayed raw, then packed. */
static size_t planes_coding(const plane_coders *z, const uint8_t *chunk, size_t raw_len,
                            size_t k, unsigned try_planes, unsigned rotate, uint8_t *s,
                            uint8_t *scratch, unsigned *packed)
{
    size_t table = SNAP_REC_PLANES_HEADER + k * SNAP_REC_PLANE_ENTRY;
    snap_split_planes(chunk, raw_len, k, SNAP_PLANES_ROTATE_BY(rotate), s + table, raw_len);
    size_t len = pack_laid_planes(z, s, raw_len, k, rotate, try_planes, scratch, packed);
    if (*packed == 0 || len >= raw_len - raw_len / 32)
        return 0;
    return len;
}

/* The stored bytes of the delta planes coding of chunk c against its base into s (room for
 * the delta header, the plane table and raw_len bytes): the base's id and c's depth, then the
 * planes of zigzag(item - base item) (SNAP_DELTA_SUB; the tail XOR the base's) packed as
 * planes_coding packs. Their length, or 0 when the coding is not shorter than raw_len -
 * raw_len/32 (then s holds garbage). */
static size_t delta_coding(const plane_coders *z, const snap_chunk_write *c, size_t k,
                           unsigned try_delta, uint8_t *s, uint8_t *scratch, unsigned *packed)
{
    size_t raw_len = c->raw_len;
    size_t table = SNAP_REC_PLANES_HEADER + k * SNAP_REC_PLANE_ENTRY;
    uint8_t *section = s + SNAP_REC_DELTA_HEADER;
    memcpy(s, c->base_id, SNAP_REC_CHUNK_ID);
    s[SNAP_REC_CHUNK_ID] = c->depth;
    snap_delta_split_planes(c->src, c->base, raw_len, k, SNAP_DELTA_SUB, section + table,
                            raw_len);
    size_t len = SNAP_REC_DELTA_HEADER +
                 pack_laid_planes(z, section, raw_len, k, 0, try_delta, scratch, packed);
    if (*packed == 0 || len >= raw_len - raw_len / 32)
        return 0;
    return len;
}

/* The record header and chunk prefix of chunk c, whose stored bytes (slen of them, after the
 * prefix) are at stored: in rec[0:SNAP_REC_HEADER + SNAP_REC_CHUNK_PREFIX]; c->stored_len
 * set. c->codec is the record's codec. */
static void record_head(uint8_t *rec, snap_chunk_write *c, const uint8_t *stored, size_t slen)
{
    uint8_t *prefix = rec + SNAP_REC_HEADER;
    memcpy(prefix, c->chunk_id, SNAP_REC_CHUNK_ID);
    store_le32(prefix + SNAP_REC_CHUNK_ID, c->raw_len);
    c->stored_len = (uint32_t)(SNAP_REC_CHUNK_PREFIX + slen);
    memcpy(rec, SNAP_REC_MAGIC, 4);
    rec[4] = SNAP_REC_CHUNK;
    rec[5] = c->codec;
    rec[6] = rec[7] = 0;
    store_le32(rec + 8, c->stored_len);
    store_le32(rec + 12, 0);
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, rec, SNAP_REC_CHECKSUMMED);
    XXH3_64bits_update(&state, prefix, SNAP_REC_CHUNK_PREFIX);
    XXH3_64bits_update(&state, stored, slen);
    store_le64(rec + SNAP_REC_CHECKSUMMED, XXH3_64bits_digest(&state));
}

int snap_raw_record_heads(snap_chunk_write *chunks, size_t n, uint8_t *out, size_t out_cap)
{
    if ((n && chunks == NULL) || (out_cap && out == NULL))
        return SNAP_EINVAL;
    for (size_t i = 0; i < n; i++) {
        const snap_chunk_write *c = &chunks[i];
        if ((c->raw_len && c->src == NULL) || c->raw_len > UINT32_MAX - SNAP_REC_RAW_HEAD ||
            overlaps(c->src, c->raw_len, out, out_cap))
            return SNAP_EINVAL;
    }
    if (n > out_cap / SNAP_REC_RAW_HEAD)
        return SNAP_ESPACE;
    for (size_t i = 0; i < n; i++) {
        snap_chunk_write *c = &chunks[i];
        c->codec = SNAP_REC_CODEC_RAW;
        c->packed = 0;
        c->out_off = i * SNAP_REC_RAW_HEAD;
        record_head(out + c->out_off, c, c->src, c->raw_len);
    }
    return SNAP_OK;
}

int snap_write_chunks(snap_chunk_write *chunks, size_t n, size_t itemsize, unsigned try_planes,
                      unsigned rotate, unsigned try_delta, uint8_t *out, size_t out_cap,
                      uint8_t *scratch, size_t scratch_cap, size_t *out_len)
{
    if (out_len == NULL || (n && chunks == NULL) || (out_cap && out == NULL) ||
        (scratch_cap && scratch == NULL))
        return SNAP_EINVAL;
    *out_len = 0;
    if ((itemsize != 2 && itemsize != 4 && itemsize != 8) || try_planes >> itemsize ||
        try_delta >> itemsize || (rotate & ~SNAP_REC_PLANES_ROTATION))
        return SNAP_EINVAL;
    if (overlaps(scratch, scratch_cap, out, out_cap))
        return SNAP_EINVAL;
    size_t need = 0;
    int deltas = 0;
    for (size_t i = 0; i < n; i++) {      /* every chunk fits scratch and leaves out alone */
        const snap_chunk_write *c = &chunks[i];
        if ((c->raw_len && c->src == NULL) || c->raw_len > scratch_cap ||
            c->raw_len > UINT32_MAX - SNAP_REC_WRITE_SLACK ||
            overlaps(c->src, c->raw_len, out, out_cap) ||
            overlaps(c->src, c->raw_len, scratch, scratch_cap))
            return SNAP_EINVAL;
        if (c->base != NULL && (c->depth == 0 || overlaps(c->base, c->raw_len, out, out_cap) ||
                                overlaps(c->base, c->raw_len, scratch, scratch_cap)))
            return SNAP_EINVAL;
        deltas |= c->base != NULL && c->raw_len > 0;
        need += SNAP_REC_WRITE_SLACK + (size_t)c->raw_len;
    }
    if (need > out_cap)
        return SNAP_ESPACE;
    plane_coders z = {NULL, NULL};
    if (n && (try_planes || (try_delta && deltas))) {
        if ((z.matching = matching_cctx()) == NULL)
            return SNAP_ENOMEM;
        z.literals = literals_cctx();
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        snap_chunk_write *c = &chunks[i];
        uint8_t *rec = out + at, *payload = rec + SNAP_REC_HEADER;
        uint8_t *stored = payload + SNAP_REC_CHUNK_PREFIX;
        unsigned packed = 0;
        size_t slen = 0;
        c->codec = SNAP_REC_CODEC_RAW;
        if (c->base != NULL && try_delta && c->raw_len) {
            slen = delta_coding(&z, c, itemsize, try_delta, stored, scratch, &packed);
            if (slen)
                c->codec = SNAP_REC_CODEC_DELTA_PLANES;
        }
        if (slen == 0 && try_planes) {
            slen = planes_coding(&z, c->src, c->raw_len, itemsize, try_planes, rotate, stored,
                                 scratch, &packed);
            if (slen)
                c->codec = SNAP_REC_CODEC_PLANES;
        }
        if (slen == 0) {
            packed = 0;
            if (c->raw_len)
                memcpy(stored, c->src, c->raw_len);
            slen = c->raw_len;
        }
        c->packed = (uint8_t)packed;
        c->out_off = at;
        record_head(rec, c, stored, slen);
        at += SNAP_REC_HEADER + c->stored_len;
    }
    ZSTD_freeCCtx(z.literals);
    ZSTD_freeCCtx(z.matching);
    *out_len = at;
    return SNAP_OK;
}
