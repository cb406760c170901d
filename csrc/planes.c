/* planes.c - byte planes ("shuffle") of fixed-size items, plain or delta-coded against a
 * reference: the transforms that make dense float state compressible (docs/floatcodec.md).
 *
 * A buffer of len bytes is n = len / itemsize items and t = len % itemsize tail bytes.
 * Plane j (0 <= j < itemsize) holds byte j of every item, in item order; the planes are laid
 * back to back, then the tail bytes follow (see snapstore.h for the exact layout). Float
 * bytes of one significance are alike (sign and exponent bytes repeat a few values; low
 * mantissa bytes are noise), so an entropy coder sees each kind on its own.
 *
 * SNAP_PLANES_ROTATE_BY(r) rotates each item, read as a little-endian word, left by r bits
 * (1..7) before the split. r = 1 (SNAP_PLANES_ROTATE) moves an IEEE float's sign bit to bit 0,
 * so the top byte of a float32 or bfloat16 is exactly its 8-bit exponent, one symbol of low
 * entropy, instead of the sign and 7 exponent bits with the exponent's last bit left among
 * the mantissa's noise (+0.35 points saved on float32 weights, +0.7 on bfloat16; float16's
 * 5-bit exponent gains nothing). r = 3 also moves the exponent's two top bits (constant for
 * weights under 2 in magnitude) down into the low byte, and the top byte becomes the
 * exponent's 6 low bits and the mantissa's 2 top bits, which Huffman codes closer to their
 * entropy: +0.2-0.4 points more on float32 weights, +0.45 on bfloat16; float16 loses 5
 * (docs/floatcodec.md, "The rotation" and "Built (stop 47)").
 *
 * Delta coding replaces each item by its difference to the same item of a reference (the
 * previous version of the buffer) before the split:
 *   SNAP_DELTA_XOR  item XOR ref item (byte-wise, any item size);
 *   SNAP_DELTA_SUB  zigzag(item - ref item), little-endian unsigned words of 1, 2, 4 or 8
 *                   bytes, mod 2^(8 itemsize); zigzag(d) = (d << 1) ^ -(d >> (bits - 1)) maps
 *                   small differences of either sign to small numbers, so the high planes
 *                   are mostly zero. For same-sign IEEE floats the integer difference of the
 *                   bit patterns is the distance in ulps, so a small relative change of a
 *                   weight becomes a small number: it saved 1-7 points more than XOR on
 *                   Adam-like updates (benchmarks/bench_floatcodec.py), at the same speed.
 *
 * Speed: every kernel is one pass of portable C that gcc -O3 vectorises: the item size is a
 * compile-time constant in each specialised loop (the switch in dispatch()), so the per-item
 * byte loop unrolls into shuffles. On x86-64 (gcc/clang, ELF) dispatch() is also built for
 * AVX2 and the copy to run is picked once at load time (target_clones; about +10-15% over the
 * SSE2 baseline; define SNAP_NO_CLONES to build the baseline only). Measured on 256 MiB, in
 * GB/s of the buffer's length (memcpy: 20): split 19 / 13 / 5.5 for 2- / 4- / 8-byte items,
 * join 19-20 / 19 / 17; delta split and join 12 / 8-9 / 4.5-7 -- far above any entropy coder
 * that follows (benchmarks/bench_floatcodec.py prints them). The delta join may run in place
 * (dst == ref): it then goes through a stack tile of TILE items, so no output byte is written
 * before its reference byte is read, and the restrict-qualified loops stay valid.
 */
#include <string.h>

#include "internal.h"

#define TILE 2048u   /* items per tile of the delta join (TILE * 8 bytes of stack) */

/* ---- little-endian word access (the on-disk layout is the same on every host) --------- */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE16(v) __builtin_bswap16(v)
#define LE32(v) __builtin_bswap32(v)
#define LE64(v) __builtin_bswap64(v)
#else
#define LE16(v) (v)
#define LE32(v) (v)
#define LE64(v) (v)
#endif

static inline uint8_t ld_w8(const uint8_t *p) { return *p; }
static inline void st_w8(uint8_t *p, uint8_t v) { *p = v; }
static inline uint16_t ld_w16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return LE16(v); }
static inline void st_w16(uint8_t *p, uint16_t v) { v = LE16(v); memcpy(p, &v, 2); }
static inline uint32_t ld_w32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return LE32(v); }
static inline void st_w32(uint8_t *p, uint32_t v) { v = LE32(v); memcpy(p, &v, 4); }
static inline uint64_t ld_w64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return LE64(v); }
static inline void st_w64(uint8_t *p, uint64_t v) { v = LE64(v); memcpy(p, &v, 8); }

/* ---- the loops; K is a literal at every call, so each inlined copy is specialised ------- */
/* Planes have stride `stride` bytes (plane j starts at planes + j * stride); items i < n. */

static inline void split_k(const uint8_t *restrict src, size_t n, size_t K,
                           uint8_t *restrict planes, size_t stride)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < K; j++)
            planes[j * stride + i] = src[K * i + j];
}

static inline void join_k(const uint8_t *restrict planes, size_t stride, size_t n, size_t K,
                          uint8_t *restrict dst)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < K; j++)
            dst[K * i + j] = planes[j * stride + i];
}

static inline void xor_split_k(const uint8_t *restrict cur, const uint8_t *restrict ref,
                               size_t n, size_t K, uint8_t *restrict planes, size_t stride)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < K; j++)
            planes[j * stride + i] = (uint8_t)(cur[K * i + j] ^ ref[K * i + j]);
}

static inline void xor_join_k(const uint8_t *restrict planes, size_t stride,
                              const uint8_t *restrict ref, size_t n, size_t K,
                              uint8_t *restrict dst)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < K; j++)
            dst[K * i + j] = (uint8_t)(planes[j * stride + i] ^ ref[K * i + j]);
}

/* zigzag(cur - ref) split and its inverse, one pair per word size T of BITS bits. */
#define SUB_KERNELS(BITS, T)                                                                  \
    static void sub_split_##BITS(const uint8_t *restrict cur, const uint8_t *restrict ref,    \
                                 size_t n, uint8_t *restrict planes, size_t stride)           \
    {                                                                                         \
        for (size_t i = 0; i < n; i++) {                                                      \
            T d = (T)(ld_w##BITS(cur + sizeof(T) * i) - ld_w##BITS(ref + sizeof(T) * i));     \
            T z = (T)((T)(d << 1) ^ (T)(0u - (T)(d >> (BITS - 1))));                          \
            for (size_t j = 0; j < sizeof(T); j++)                                            \
                planes[j * stride + i] = (uint8_t)(z >> (8 * j));                             \
        }                                                                                     \
    }                                                                                         \
    static void sub_join_##BITS(const uint8_t *restrict planes, size_t stride,                \
                                const uint8_t *restrict ref, size_t n, uint8_t *restrict dst) \
    {                                                                                         \
        for (size_t i = 0; i < n; i++) {                                                      \
            T z = 0;                                                                          \
            for (size_t j = 0; j < sizeof(T); j++)                                            \
                z = (T)(z | (T)((T)planes[j * stride + i] << (8 * j)));                       \
            T d = (T)((T)(z >> 1) ^ (T)(0u - (T)(z & 1u)));                                   \
            st_w##BITS(dst + sizeof(T) * i, (T)(ld_w##BITS(ref + sizeof(T) * i) + d));       \
        }                                                                                     \
    }

SUB_KERNELS(8, uint8_t)
SUB_KERNELS(16, uint16_t)
SUB_KERNELS(32, uint32_t)
SUB_KERNELS(64, uint64_t)

/* rotl-r split (the word rotated left by r bits, 1 <= r < BITS: its top r bits become its
 * low r bits) and its inverse. */
#define ROT_KERNELS(BITS, T)                                                                  \
    static void rot_split_##BITS(const uint8_t *restrict src, size_t n, unsigned r,           \
                                 uint8_t *restrict planes, size_t stride)                     \
    {                                                                                         \
        for (size_t i = 0; i < n; i++) {                                                      \
            T w = ld_w##BITS(src + sizeof(T) * i);                                            \
            T z = (T)((T)(w << r) | (T)(w >> (BITS - r)));                                    \
            for (size_t j = 0; j < sizeof(T); j++)                                            \
                planes[j * stride + i] = (uint8_t)(z >> (8 * j));                             \
        }                                                                                     \
    }                                                                                         \
    static void rot_join_##BITS(const uint8_t *restrict planes, size_t stride, size_t n,      \
                                unsigned r, uint8_t *restrict dst)                            \
    {                                                                                         \
        for (size_t i = 0; i < n; i++) {                                                      \
            T z = 0;                                                                          \
            for (size_t j = 0; j < sizeof(T); j++)                                            \
                z = (T)(z | (T)((T)planes[j * stride + i] << (8 * j)));                       \
            st_w##BITS(dst + sizeof(T) * i, (T)((T)(z >> r) | (T)(z << (BITS - r))));        \
        }                                                                                     \
    }

ROT_KERNELS(8, uint8_t)
ROT_KERNELS(16, uint16_t)
ROT_KERNELS(32, uint32_t)
ROT_KERNELS(64, uint64_t)

/* ---- dispatch: one specialised copy of each loop per item size -------------------------- */
enum op { OP_SPLIT, OP_JOIN, OP_XOR_SPLIT, OP_XOR_JOIN, OP_SUB_SPLIT, OP_SUB_JOIN,
          OP_ROT_SPLIT, OP_ROT_JOIN };

/* a: the item-ordered input (split) or the planes (join); b: the reference (delta ops);
 * out: planes (split) or items (join). stride: plane stride; n items; r: the rotation (rot
 * ops: 1 <= r < 8 k). */
#define CASE_K(K)                                                                             \
    case K:                                                                                   \
        switch (op) {                                                                         \
        case OP_SPLIT: split_k(a, n, K, out, stride); break;                                  \
        case OP_JOIN: join_k(a, stride, n, K, out); break;                                    \
        case OP_XOR_SPLIT: xor_split_k(a, b, n, K, out, stride); break;                       \
        case OP_XOR_JOIN: xor_join_k(a, stride, b, n, K, out); break;                         \
        default: break;                                                                       \
        }                                                                                     \
        break;

#if defined(__GNUC__) && defined(__x86_64__) && defined(__ELF__) && !defined(SNAP_NO_CLONES)
/* One copy per target, picked once at load time (an ifunc): AVX2's wider shuffles. */
__attribute__((target_clones("avx2", "default")))
#endif
static void dispatch(enum op op, const uint8_t *restrict a, const uint8_t *restrict b,
                     size_t n, size_t k, size_t stride, unsigned r, uint8_t *restrict out)
{
    if (op == OP_SUB_SPLIT || op == OP_SUB_JOIN) {
        int split = op == OP_SUB_SPLIT;
        switch (k) {
        case 1: split ? sub_split_8(a, b, n, out, stride) : sub_join_8(a, stride, b, n, out); break;
        case 2: split ? sub_split_16(a, b, n, out, stride) : sub_join_16(a, stride, b, n, out); break;
        case 4: split ? sub_split_32(a, b, n, out, stride) : sub_join_32(a, stride, b, n, out); break;
        case 8: split ? sub_split_64(a, b, n, out, stride) : sub_join_64(a, stride, b, n, out); break;
        default: break;   /* refused by the callers */
        }
        return;
    }
    if (op == OP_ROT_SPLIT || op == OP_ROT_JOIN) {
        int split = op == OP_ROT_SPLIT;
        switch (k) {
        case 1: split ? rot_split_8(a, n, r, out, stride) : rot_join_8(a, stride, n, r, out); break;
        case 2: split ? rot_split_16(a, n, r, out, stride) : rot_join_16(a, stride, n, r, out); break;
        case 4: split ? rot_split_32(a, n, r, out, stride) : rot_join_32(a, stride, n, r, out); break;
        case 8: split ? rot_split_64(a, n, r, out, stride) : rot_join_64(a, stride, n, r, out); break;
        default: break;   /* refused by the callers */
        }
        return;
    }
    switch (k) {
    CASE_K(1)
    CASE_K(2)
    CASE_K(3)
    CASE_K(4)
    CASE_K(5)
    CASE_K(6)
    CASE_K(7)
    CASE_K(8)
    default: break;
    }
}

/* ---- argument checks --------------------------------------------------------------------- */

static int itemsize_ok(size_t itemsize)
{
    return itemsize >= 1 && itemsize <= SNAP_ITEMSIZE_MAX;
}

static int word_size(size_t itemsize)
{
    return itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
}

/* The delta mode and item size go together: SUB needs a word size. */
static int delta_ok(int mode, size_t itemsize)
{
    if (!itemsize_ok(itemsize))
        return 0;
    if (mode == SNAP_DELTA_XOR)
        return 1;
    return mode == SNAP_DELTA_SUB && word_size(itemsize);
}

/* Split flags: a rotation r (SNAP_PLANES_ROTATE_BY(r), 0 <= r <= 7; r > 0 for a word size
 * only); no other bit. Every r is below a word's 8 bits or more. */
static int flags_ok(unsigned flags, size_t itemsize)
{
    return itemsize_ok(itemsize) && (flags & ~SNAP_PLANES_ROTATION) == 0 &&
           (flags == 0 || word_size(itemsize));
}

/* ---- the public functions ----------------------------------------------------------------- */
int snap_split_planes(const uint8_t *src, size_t len, size_t itemsize, unsigned flags,
                      uint8_t *planes, size_t planes_cap)
{
    if (!flags_ok(flags, itemsize) || (src == NULL && len != 0) ||
        (planes == NULL && planes_cap != 0) || overlaps(src, len, planes, planes_cap))
        return SNAP_EINVAL;
    if (planes_cap < len)
        return SNAP_ESPACE;
    if (len == 0)
        return SNAP_OK;
    size_t n = len / itemsize, body = n * itemsize;
    dispatch(flags ? OP_ROT_SPLIT : OP_SPLIT, src, NULL, n, itemsize, n,
             flags & SNAP_PLANES_ROTATION, planes);
    memcpy(planes + body, src + body, len - body);
    return SNAP_OK;
}

int snap_join_planes(const uint8_t *planes, size_t len, size_t itemsize, unsigned flags,
                     uint8_t *dst, size_t dst_cap)
{
    if (!flags_ok(flags, itemsize) || (planes == NULL && len != 0) ||
        (dst == NULL && dst_cap != 0) || overlaps(planes, len, dst, dst_cap))
        return SNAP_EINVAL;
    if (dst_cap < len)
        return SNAP_ESPACE;
    if (len == 0)
        return SNAP_OK;
    size_t n = len / itemsize, body = n * itemsize;
    dispatch(flags ? OP_ROT_JOIN : OP_JOIN, planes, NULL, n, itemsize, n,
             flags & SNAP_PLANES_ROTATION, dst);
    memcpy(dst + body, planes + body, len - body);
    return SNAP_OK;
}

int snap_delta_split_planes(const uint8_t *cur, const uint8_t *ref, size_t len, size_t itemsize,
                            int mode, uint8_t *planes, size_t planes_cap)
{
    if (!delta_ok(mode, itemsize) || ((cur == NULL || ref == NULL) && len != 0) ||
        (planes == NULL && planes_cap != 0) || overlaps(cur, len, planes, planes_cap) ||
        overlaps(ref, len, planes, planes_cap))
        return SNAP_EINVAL;
    if (planes_cap < len)
        return SNAP_ESPACE;
    if (len == 0)
        return SNAP_OK;
    size_t n = len / itemsize, body = n * itemsize;
    dispatch(mode == SNAP_DELTA_SUB ? OP_SUB_SPLIT : OP_XOR_SPLIT, cur, ref, n, itemsize, n, 0,
             planes);
    for (size_t i = body; i < len; i++)
        planes[i] = (uint8_t)(cur[i] ^ ref[i]);
    return SNAP_OK;
}

int snap_delta_join_planes(const uint8_t *planes, const uint8_t *ref, size_t len,
                           size_t itemsize, int mode, uint8_t *dst, size_t dst_cap)
{
    if (!delta_ok(mode, itemsize) || ((planes == NULL || ref == NULL) && len != 0) ||
        (dst == NULL && dst_cap != 0) || overlaps(planes, len, dst, dst_cap) ||
        (dst != ref && overlaps(ref, len, dst, dst_cap)))
        return SNAP_EINVAL;
    if (dst_cap < len)
        return SNAP_ESPACE;
    if (len == 0)
        return SNAP_OK;
    size_t n = len / itemsize, body = n * itemsize;
    enum op op = mode == SNAP_DELTA_SUB ? OP_SUB_JOIN : OP_XOR_JOIN;
    if (dst != ref) {
        dispatch(op, planes, ref, n, itemsize, n, 0, dst);
    } else {
        /* in place: each tile of the reference is copied out before it is overwritten */
        uint8_t tile[TILE * SNAP_ITEMSIZE_MAX];
        for (size_t i = 0; i < n; i += TILE) {
            size_t m = n - i < TILE ? n - i : TILE;
            memcpy(tile, ref + i * itemsize, m * itemsize);
            dispatch(op, planes + i, tile, m, itemsize, n, 0, dst + i * itemsize);
        }
    }
    for (size_t i = body; i < len; i++)    /* byte-wise: safe in place too */
        dst[i] = (uint8_t)(planes[i] ^ ref[i]);
    return SNAP_OK;
}
