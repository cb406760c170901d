/* chunkread.c - snap_read_chunks: check and decode a run of chunk records in one call.
 *
 * A restore's hot loop: for every chunk record of a read (records as they lie in a segment,
 * the index's expectations beside them) check the record (magic, type, codec, zero flags and
 * reserved field, the payload length the index records, the XXH3-64 checksum over the first
 * 16 header bytes and the payload), its chunk prefix (the expected chunk id and raw length),
 * then decode its stored bytes into the destination: raw bytes are copied; a zstd frame
 * (exactly one, declaring exactly the raw length) is decompressed; byte planes (each raw or one
 * such zstd frame, lengths that add up) are rebuilt and joined (snap_join_planes); delta planes
 * (format 5, planned) are rebuilt the same way and added in place to the base's bytes, which
 * the caller put in the destination and names (the read's base_id; snap_delta_join_planes). The record
 * layout is docs/design.md's "Segment files"; SNAP_REC_* in snapstore.h mirror
 * snapstore/engine/format.py (tests/unit/test_native_records.py holds them equal).
 *
 * A record is checked completely before any byte of its destination is written; the first
 * record that fails stops the call (SNAP_EDATA, reads[i].status says why), so the caller can
 * redo it on its authoritative path, which names what is wrong. Called without the GIL, it
 * runs on as many threads as the caller gives it disjoint destinations.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>
#include <string.h>

#include "internal.h"

/* One zstd frame, exactly len bytes, that declares exactly want bytes, into out[0:want]. */
static int unzstd(ZSTD_DCtx **dctx, const uint8_t *p, size_t len, uint8_t *out, size_t want)
{
    unsigned long long declared = ZSTD_getFrameContentSize(p, len);
    if (declared == ZSTD_CONTENTSIZE_UNKNOWN || declared == ZSTD_CONTENTSIZE_ERROR ||
        declared != want)
        return SNAP_READ_FRAME;
    size_t frame = ZSTD_findFrameCompressedSize(p, len);
    if (ZSTD_isError(frame) || frame != len)
        return SNAP_READ_FRAME;
    if (*dctx == NULL && (*dctx = ZSTD_createDCtx()) == NULL)
        return SNAP_READ_NOMEM;
    size_t got = ZSTD_decompressDCtx(*dctx, out, want, p, len);
    if (ZSTD_isError(got) || got != want)
        return SNAP_READ_FRAME;
    return SNAP_OK;
}

/* A plane section (PLANES_HEADER, itemsize PLANE_ENTRYs, planes, tail; flags within
 * allowed_flags) of exactly slen bytes -> its raw_len bytes of planes laid out in scratch;
 * *k and *flags get its item size and flags. */
static int lay_planes(ZSTD_DCtx **dctx, const uint8_t *s, size_t slen, size_t raw_len,
                      unsigned allowed_flags, uint8_t *scratch, size_t *k_out, unsigned *flags_out)
{
    if (slen < SNAP_REC_PLANES_HEADER)
        return SNAP_READ_PLANES;
    size_t k = s[0];
    unsigned flags = s[1];
    if ((k != 2 && k != 4 && k != 8) || (flags & ~allowed_flags))
        return SNAP_READ_PLANES;
    size_t n = raw_len / k, tail = raw_len % k;
    size_t table = SNAP_REC_PLANES_HEADER + k * SNAP_REC_PLANE_ENTRY;
    if (slen < table)
        return SNAP_READ_PLANES;
    size_t total = table + tail;
    for (size_t j = 0; j < k; j++)
        total += load_le32(s + SNAP_REC_PLANES_HEADER + j * SNAP_REC_PLANE_ENTRY + 1);
    if (total != slen)
        return SNAP_READ_PLANES;
    size_t pos = table;
    for (size_t j = 0; j < k; j++) {
        const uint8_t *entry = s + SNAP_REC_PLANES_HEADER + j * SNAP_REC_PLANE_ENTRY;
        size_t len = load_le32(entry + 1);
        if (entry[0] == SNAP_REC_PLANE_RAW) {
            if (len != n)
                return SNAP_READ_PLANES;
            memcpy(scratch + j * n, s + pos, n);
        } else if (entry[0] == SNAP_REC_PLANE_ZSTD) {
            int rc = unzstd(dctx, s + pos, len, scratch + j * n, n);
            if (rc != SNAP_OK)
                return rc;
        } else {
            return SNAP_READ_PLANES;
        }
        pos += len;
    }
    memcpy(scratch + k * n, s + pos, tail);
    *k_out = k;
    *flags_out = flags;
    return SNAP_OK;
}

/* Byte planes (CODEC_PLANES' stored bytes; flags: the rotation, 0..7) -> dst[0:raw_len], the
 * planes laid out in scratch first. */
static int unplanes(ZSTD_DCtx **dctx, const uint8_t *s, size_t slen, uint8_t *dst,
                    size_t raw_len, uint8_t *scratch)
{
    size_t k;
    unsigned flags;
    int rc = lay_planes(dctx, s, slen, raw_len, SNAP_REC_PLANES_ROTATION, scratch, &k, &flags);
    if (rc != SNAP_OK)
        return rc;
    return snap_join_planes(scratch, raw_len, k, SNAP_PLANES_ROTATE_BY(flags), dst,
                            raw_len) == SNAP_OK ? SNAP_OK : SNAP_READ_PLANES;
}

/* Delta planes (CODEC_DELTA_PLANES' stored bytes: the base's id, the depth, then a plane
 * section with flags 0) applied in place to dst[0:raw_len], which holds the base's raw bytes:
 * the record must name base_id, the base the caller put there. */
static int undelta(ZSTD_DCtx **dctx, const uint8_t *s, size_t slen, uint8_t *dst,
                   size_t raw_len, uint8_t *scratch, const uint8_t *base_id)
{
    static const uint8_t none[SNAP_REC_CHUNK_ID];
    if (slen < SNAP_REC_DELTA_HEADER)
        return SNAP_READ_PLANES;
    if (memcmp(base_id, none, SNAP_REC_CHUNK_ID) == 0 ||
        memcmp(s, base_id, SNAP_REC_CHUNK_ID) != 0)
        return SNAP_READ_BASE;
    if (s[SNAP_REC_CHUNK_ID] == 0)
        return SNAP_READ_PLANES;
    size_t k;
    unsigned flags;
    int rc = lay_planes(dctx, s + SNAP_REC_DELTA_HEADER, slen - SNAP_REC_DELTA_HEADER, raw_len,
                        0, scratch, &k, &flags);
    if (rc != SNAP_OK)
        return rc;
    return snap_delta_join_planes(scratch, dst, raw_len, k, SNAP_DELTA_SUB, dst,
                                  raw_len) == SNAP_OK ? SNAP_OK : SNAP_READ_PLANES;
}

static int read_one(ZSTD_DCtx **dctx, const uint8_t *rec, const snap_chunk_read *r,
                    uint8_t *dst, uint8_t *scratch, size_t scratch_cap)
{
    if (memcmp(rec, SNAP_REC_MAGIC, 4) != 0 || rec[4] != SNAP_REC_CHUNK ||
        rec[6] != 0 || rec[7] != 0 || load_le32(rec + 12) != 0)
        return SNAP_READ_HEADER;
    if (load_le32(rec + 8) != r->stored_len)
        return SNAP_READ_LENGTH;
    const uint8_t *payload = rec + SNAP_REC_HEADER;
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, rec, SNAP_REC_CHECKSUMMED);
    XXH3_64bits_update(&state, payload, r->stored_len);
    if (XXH3_64bits_digest(&state) != load_le64(rec + SNAP_REC_CHECKSUMMED))
        return SNAP_READ_CHECKSUM;
    if (r->stored_len < SNAP_REC_CHUNK_PREFIX)
        return SNAP_READ_PREFIX;
    if (memcmp(payload, r->chunk_id, SNAP_REC_CHUNK_ID) != 0 ||
        load_le32(payload + SNAP_REC_CHUNK_ID) != r->raw_len)
        return SNAP_READ_PREFIX;
    const uint8_t *stored = payload + SNAP_REC_CHUNK_PREFIX;
    size_t slen = r->stored_len - SNAP_REC_CHUNK_PREFIX, raw_len = r->raw_len;
    switch (rec[5]) {
    case SNAP_REC_CODEC_RAW:
        if (slen != raw_len)
            return SNAP_READ_LENGTH;
        memcpy(dst, stored, raw_len);
        return SNAP_OK;
    case SNAP_REC_CODEC_ZSTD:
    case SNAP_REC_CODEC_PLANES:
    case SNAP_REC_CODEC_DELTA_PLANES: {
        if (raw_len > scratch_cap)
            return SNAP_READ_SCRATCH;
        int rc;
        if (rec[5] == SNAP_REC_CODEC_ZSTD) {
            rc = unzstd(dctx, stored, slen, scratch, raw_len);
            if (rc == SNAP_OK)
                memcpy(dst, scratch, raw_len);
        } else if (rec[5] == SNAP_REC_CODEC_PLANES) {
            rc = unplanes(dctx, stored, slen, dst, raw_len, scratch);
        } else {
            rc = undelta(dctx, stored, slen, dst, raw_len, scratch, r->base_id);
        }
        return rc;
    }
    default:
        return SNAP_READ_HEADER;
    }
}

int snap_read_chunks(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                     snap_chunk_read *reads, size_t n, uint8_t *scratch, size_t scratch_cap,
                     size_t *n_done)
{
    if (n_done == NULL || (n && reads == NULL) || (src_len && src == NULL) ||
        (dst_len && dst == NULL) || (scratch_cap && scratch == NULL))
        return SNAP_EINVAL;
    *n_done = 0;
    for (size_t i = 0; i < n; i++) {      /* every place inside its buffer, before any work */
        const snap_chunk_read *r = &reads[i];
        if (r->src_off > src_len || src_len - r->src_off < SNAP_REC_HEADER ||
            src_len - r->src_off - SNAP_REC_HEADER < r->stored_len ||
            r->dst_off > dst_len || dst_len - r->dst_off < r->raw_len)
            return SNAP_EINVAL;
    }
    if (overlaps(scratch, scratch_cap, dst, dst_len) || overlaps(scratch, scratch_cap, src, src_len) ||
        overlaps(dst, dst_len, src, src_len))
        return SNAP_EINVAL;
    ZSTD_DCtx *dctx = NULL;
    int rc = SNAP_OK;
    size_t i;
    for (i = 0; i < n; i++) {
        snap_chunk_read *r = &reads[i];
        r->status = read_one(&dctx, src + r->src_off, r, dst + r->dst_off, scratch, scratch_cap);
        if (r->status != SNAP_OK) {
            rc = SNAP_EDATA;
            break;
        }
    }
    ZSTD_freeDCtx(dctx);
    *n_done = i;
    return rc;
}
