/* fastcdc.c - snap_cdc_*: streaming content-defined chunking (FastCDC with a gear hash and
 * normalized chunking level 2).
 *
 * The chunking rule, per byte b of the stream, where L is the length of the open chunk
 * before b (0 for the first byte of a chunk):
 *   - L <  min_size          b is skipped: not hashed (the hash restarts at 0 for every chunk);
 *   - L >= min_size          h = (h << 1) + GEAR[b] (mod 2^64) and the chunk ends after b when
 *                            (h & mask) == 0, with mask = mask_small while L < avg_size and
 *                            mask = mask_large from L >= avg_size on;
 *   - L + 1 == max_size      the chunk ends after b whatever the hash (forced cut).
 * With bits = log2(avg_size), mask_small has bits + 2 one-bits and mask_large bits - 2
 * one-bits, both in the HIGH bits of the 64-bit hash (bit k of a gear hash depends on the
 * last k + 1 bytes only, so the high bits carry the most history). The last chunk of a
 * stream ends at the stream's end (snap_cdc_finish).
 *
 * Streaming: the whole state (hash, open chunk length, stream offset) lives in snap_cdc, and
 * the rule above only looks at one byte at a time, so any split of the input into pieces
 * gives the same cut points as one piece.
 *
 * GEAR: 256 64-bit values of splitmix64 seeded with 0x534E415053544F52 ("SNAPSTOR"), in
 * generation order. The table below was printed by this script (tests/reference.py builds
 * the same table the same way, and the golden tests pin cut points that depend on it):
 *
 *   M = (1 << 64) - 1
 *   def splitmix64(seed):
 *       s = seed
 *       while True:
 *           s = (s + 0x9E3779B97F4A7C15) & M
 *           z = s
 *           z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
 *           z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
 *           yield z ^ (z >> 31)
 *   g = splitmix64(0x534E415053544F52)
 *   t = [next(g) for _ in range(256)]
 *   for i in range(0, 256, 4):
 *       print("    " + ", ".join("0x%016xULL" % v for v in t[i:i+4]) + ",")
 */
#include "snapstore.h"

#define CDC_MAGIC 0x534E4150434443ULL   /* "SNAPCDC" */

static const uint64_t GEAR[256] = {
    0x834624eb92ef2a13ULL, 0x9292d4e8fe372372ULL, 0x3812f3b49f6b1667ULL, 0xad47c15304815514ULL,
    0xdef792a9d5af3940ULL, 0xac620eac7191c345ULL, 0xc275afe1b6684a9eULL, 0x803e0cf5e6ddb191ULL,
    0x94e0dd71267e00e5ULL, 0x27be55b826b8a2fdULL, 0x90be3e8177de0329ULL, 0x4b948af3f6307cd0ULL,
    0x22024c5c2d413e8bULL, 0x447fab531fe42a79ULL, 0x9f6883c8846f4b4bULL, 0x9567c18ce2f4b6f7ULL,
    0xf5bb5cf1f9be1b9eULL, 0x586db7112c7fd404ULL, 0xb0b000f28def4da1ULL, 0x6bf45695b1ad5a25ULL,
    0x2c1e183e9d175e29ULL, 0xc2fc8d58acd098afULL, 0x52317253dcb3efe4ULL, 0x0e583d6843ccf3dcULL,
    0x74164f43755327c1ULL, 0xc9e7527e97c7aac5ULL, 0xa906a62a3daffd59ULL, 0x3f32cf48a465673bULL,
    0x63d8674172a2c8e9ULL, 0x62521535cc3044a2ULL, 0xc1efbb6694e96e90ULL, 0xdd199768d3d0233bULL,
    0x1d92608f36ab865cULL, 0xc0dd1a8123573a4fULL, 0x16c7ef94c75a780bULL, 0x126243321bdbb1f4ULL,
    0xb522b0ef077392d2ULL, 0xb634888fa65bdc55ULL, 0x57ea6b0dea71a5f2ULL, 0x6006f127f3539ddfULL,
    0xe7d6ffcf46305be8ULL, 0x74124a8c293c70f3ULL, 0x908bcfaff0d4c2efULL, 0xd32e9acbc462cce0ULL,
    0xeb20893959c5f97eULL, 0xd10aa537f2e247c3ULL, 0x31d80fc5496624c9ULL, 0x12e062a97a141cbfULL,
    0x43903ca8c328077dULL, 0x71dbd72bcd3c715eULL, 0xd59994268181db44ULL, 0x0d54b028954ab1f6ULL,
    0xe19926c655b62065ULL, 0x922c5343e00dc98eULL, 0xbff1843f9aed7ce1ULL, 0x313ef4e85305a262ULL,
    0x2ae4032d7b3b55cdULL, 0x4c2522c1655caccbULL, 0xbb94f7ead4424e3eULL, 0x3b87c405b136d47dULL,
    0x44e6e0746d025cdcULL, 0x00ca148452734dbeULL, 0x4524e21603acece7ULL, 0x48f7f2984629177cULL,
    0xe6c59f7d8893c8c0ULL, 0xd18847549831b487ULL, 0x7a34aff3cabe5150ULL, 0x8ef0ecd5cb727395ULL,
    0x51c7f72b8574feacULL, 0xdf54c98b3b7e8e34ULL, 0xb0a787f17502c4b6ULL, 0xc5693efbd11417e0ULL,
    0x6b180e1800c59841ULL, 0x79f3d0afe690ababULL, 0x12c5eaa3858292e4ULL, 0x59d240888c3d24ccULL,
    0xc7be05fbe7b2a86aULL, 0xe7a78709a1ee895dULL, 0x7e42cd806813af87ULL, 0x6c23a4617a76e894ULL,
    0xe2c24e97c80a54b1ULL, 0x05fe300b16c4e9d1ULL, 0x5232768c26ee6c44ULL, 0xb1b5869bde01aa97ULL,
    0x1e96fe3580a8dcc7ULL, 0x2c5c3c773dbdf45aULL, 0xe5a7ae325a81bb2cULL, 0x0f5ad51f64bfacf0ULL,
    0x12a607d6c66764bdULL, 0xb577985931abdedfULL, 0x6e4d25cf68c79f1fULL, 0x78208139816fcac3ULL,
    0x7b0548bb284b7481ULL, 0x0a871f9506f96265ULL, 0xac5897aca82fd3a4ULL, 0x0321885ee9062cb7ULL,
    0x1063eb0ac683dca6ULL, 0x707902cec4bce354ULL, 0x8a76301a3e1bcf13ULL, 0x612152db44ff2e9cULL,
    0x2357fecb817a43d9ULL, 0xd190816cb0d65887ULL, 0xdc94173db4bb6aa0ULL, 0xabd6b55aebda5f88ULL,
    0x54c3f230b36eca6bULL, 0xbfc39547a817c2bcULL, 0x2a1bdd6ee2b8a365ULL, 0x1bc908a89e29c6a1ULL,
    0xe3a6f03ed5d366acULL, 0x3f6177176e7b1cfcULL, 0x4f857258f661bc4aULL, 0xd78a586f52a4a8f7ULL,
    0x70edb7bb469338caULL, 0xcd110a3d9aa09152ULL, 0x68e28e801895f9adULL, 0xd8d4b9ea728d65dcULL,
    0xec8f584b7e8c2edeULL, 0x3b9b5a7b878ac470ULL, 0x8c58d6e13e004fc0ULL, 0xc744f201d341910bULL,
    0xb25523dab48892a3ULL, 0xdc45671960111157ULL, 0xd3f2be8cbc02c046ULL, 0xda862c25b04aa7d8ULL,
    0x09fc21876cccc8e0ULL, 0x4ddb795aae29a0a4ULL, 0x8ae19c1dd9930ca2ULL, 0xea092ff12f03e112ULL,
    0xb2af4664ae0e7aedULL, 0x8d482f353fd9d940ULL, 0x8d9ff3e881815a37ULL, 0xfd6190c1d89cf95cULL,
    0x949a686fbadf1d5cULL, 0x2c1f45d64e382768ULL, 0xa5deae8b9d592ecaULL, 0x521bc0eefd9e2350ULL,
    0x7cb357f4e4689580ULL, 0xab0e59d539208f2aULL, 0x82e2f4c5747f710dULL, 0x9b80bb604b0b33acULL,
    0xe38433e3ff7c7543ULL, 0x510b18c3f67e0b61ULL, 0xae52753e93fd4c66ULL, 0x52e45d6b0140b543ULL,
    0xe4dd3f4e1452f033ULL, 0x40e16c8cd342e2dcULL, 0x01cd500e51977287ULL, 0x63514c2a9bdc64bcULL,
    0x09ba44ffea92d23eULL, 0x41cb88725523628fULL, 0x58a07f228e2f31d6ULL, 0x0f490bf0ac1d2207ULL,
    0x67061560b0ef292eULL, 0x82ded10ef849f7eaULL, 0xadd696a46ed3ae31ULL, 0x0903dadb53beeaf9ULL,
    0x745fea1540356d95ULL, 0x72bbb8875e9baf79ULL, 0x6beb592385e07cc2ULL, 0xa8919dda451c5887ULL,
    0xcbbb3dfe04c45e3cULL, 0xbc20df0c9f5393a3ULL, 0xb9a5d57ae4b39fffULL, 0x8945417544508d51ULL,
    0xfaccb9955a530b0dULL, 0xc8bcda5485944231ULL, 0xbbeac2d2d0ea425fULL, 0xc4e217420d94e71fULL,
    0x1126396201f2d0bcULL, 0x4f81922b55396c0eULL, 0x2aac915236319d6eULL, 0x0615428be290feabULL,
    0xa21644540f8a6fd7ULL, 0xe9c43c3c86ad9cefULL, 0xe5706413263815efULL, 0xdf25f265363b7b1bULL,
    0x7f2edbc89947910aULL, 0x5a5f466afad2f448ULL, 0x70b6143ac72f17e8ULL, 0x07c70a29bd7a4a23ULL,
    0xb663cdab78989bf5ULL, 0x150724f03b31c4a3ULL, 0x8132dd077fe93e51ULL, 0xe5bdd10991bc8b86ULL,
    0x4302c6bf07b9eaf3ULL, 0xe0535df893eb3658ULL, 0xbe4a6bcf06663d5bULL, 0xf1134da20684eeb5ULL,
    0xc71d3fbc44495682ULL, 0x68eba663ebb5ebc0ULL, 0xbee62f70e3dca6fdULL, 0x3df758c78efb1e45ULL,
    0x8092a54ecbea8c37ULL, 0xd6133e535101bde0ULL, 0x5aa2f849c8c02ba1ULL, 0x9c8685867ff7979cULL,
    0xfbc2e505c475dda4ULL, 0xd610c68e426f2ef4ULL, 0xbd28072eb8a5587aULL, 0xe91af37e5c70b0a0ULL,
    0xa7f00e159ccd72f8ULL, 0x911c5956a851bc78ULL, 0xbc9e0671514aaf98ULL, 0x0e7becde7ea16435ULL,
    0x68bc9d875aeae847ULL, 0x36de25c4da50adc9ULL, 0xa4a3c833b86b3e2bULL, 0x0185d5fbe6916a99ULL,
    0x1ea5a4e4b6f16c02ULL, 0x65c25b5ecbc0ee31ULL, 0xc69cba122c4e2d2bULL, 0x0506721edba1fa0bULL,
    0x6c46f3487fddb381ULL, 0x8a95d895f3e352edULL, 0x5f70e6bc010779a6ULL, 0x7f35da88e3c0eb74ULL,
    0x53de491bb587bc57ULL, 0x24ca387b43c40396ULL, 0xb9fd7f02b931d405ULL, 0xe2fc7877d2035ff9ULL,
    0x258bd94d320e34f3ULL, 0x28e364a104518594ULL, 0xc74e3e75fcce1c9eULL, 0xe9f3a841744263feULL,
    0xdf42cda3d60ab7e8ULL, 0x744c0b5112c2c53dULL, 0x3da4613879692899ULL, 0x1d39ad9a36c43e44ULL,
    0x630a6c408e176596ULL, 0x059ff1cc84caa918ULL, 0xf0b29081db8d0250ULL, 0x141b9372424e2422ULL,
    0xe002618fae5aac7bULL, 0xdc884d2cc5e3c4e2ULL, 0xe50e743c14e04603ULL, 0x26efb9cade80b225ULL,
    0x27f92cf3390dc9b3ULL, 0x459e421ed1b28ad3ULL, 0x037889fac98a5e75ULL, 0x38291f74c53b831dULL,
    0x641092a9855c448fULL, 0x30c971c0559b1e3dULL, 0x9333595a155c548eULL, 0x1d29775e1e6e55d1ULL,
    0x74e263363b5c7f74ULL, 0xb63da1f24e456d83ULL, 0x7b8758aa6c43b615ULL, 0xd6029db00da65d45ULL,
    0x41d7d7c1f9aec743ULL, 0x211789275364a460ULL, 0xb44dcf758199340eULL, 0x2a1d608f55fc29e0ULL,
    0x08c06547e833c9a2ULL, 0xc365544682c6e96cULL, 0x553fdc552f108677ULL, 0xafb2fee5cc24204bULL,
};

static inline int is_pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

static inline unsigned log2_u64(uint64_t v)     /* v a power of two */
{
    unsigned b = 0;
    while (v > 1) {
        v >>= 1;
        b++;
    }
    return b;
}

/* HIGH-bit mask with n one-bits, 1 <= n <= 63. */
static inline uint64_t high_mask(unsigned n)
{
    return ~(uint64_t)0 << (64 - n);
}

int snap_cdc_init(snap_cdc *c, size_t min_size, size_t avg_size, size_t max_size)
{
    if (c == NULL)
        return SNAP_EINVAL;
    c->magic = 0;
    if (min_size < SNAP_CDC_MIN_LIMIT || max_size > SNAP_CDC_MAX_LIMIT ||
        min_size > avg_size || avg_size > max_size || !is_pow2(avg_size))
        return SNAP_EINVAL;
    unsigned bits = log2_u64(avg_size);  /* 6 <= bits <= 26 given the limits above */
    c->min_size = min_size;
    c->avg_size = avg_size;
    c->max_size = max_size;
    c->mask_small = high_mask(bits + 2);
    c->mask_large = high_mask(bits - 2);
    c->hash = 0;
    c->chunk_len = 0;
    c->offset = 0;
    c->magic = CDC_MAGIC;
    return SNAP_OK;
}

static int cdc_state_ok(const snap_cdc *c)
{
    return c->magic == CDC_MAGIC && c->min_size >= SNAP_CDC_MIN_LIMIT &&
           c->min_size <= c->avg_size && c->avg_size <= c->max_size &&
           c->max_size <= SNAP_CDC_MAX_LIMIT && c->chunk_len < c->max_size;
}

/* Hashes p[0:n] into *h; returns the index of the first byte after which (h & mask) == 0
 * (that byte is NOT folded into *h), or n when there is none (all n bytes folded in). */
static inline size_t gear_scan(const uint8_t *p, size_t n, uint64_t *hp, uint64_t mask)
{
    uint64_t h = *hp;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint64_t h0 = (h << 1) + GEAR[p[i]];
        if (!(h0 & mask)) { *hp = h; return i; }
        uint64_t h1 = (h0 << 1) + GEAR[p[i + 1]];
        if (!(h1 & mask)) { *hp = h0; return i + 1; }
        uint64_t h2 = (h1 << 1) + GEAR[p[i + 2]];
        if (!(h2 & mask)) { *hp = h1; return i + 2; }
        uint64_t h3 = (h2 << 1) + GEAR[p[i + 3]];
        if (!(h3 & mask)) { *hp = h2; return i + 3; }
        h = h3;
    }
    for (; i < n; i++) {
        uint64_t h0 = (h << 1) + GEAR[p[i]];
        if (!(h0 & mask)) { *hp = h; return i; }
        h = h0;
    }
    *hp = h;
    return n;
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

int snap_cdc_feed(snap_cdc *c, const uint8_t *data, size_t len,
                  uint64_t *cuts, size_t max_cuts, size_t *n_cuts, size_t *consumed)
{
    if (c == NULL || n_cuts == NULL || consumed == NULL)
        return SNAP_EINVAL;
    *n_cuts = 0;
    *consumed = 0;
    if ((data == NULL && len != 0) || (cuts == NULL && max_cuts != 0))
        return SNAP_EINVAL;
    if (!cdc_state_ok(c))
        return SNAP_ESTATE;
    if (max_cuts == 0 && len != 0)
        return SNAP_ESPACE;

    /* Chunk-length thresholds: bytes with L < skip_end are skipped, L < small_end use
     * mask_small, L < large_end use mask_large, and the byte at L == max_size - 1 is a
     * forced cut. */
    const uint64_t last = c->max_size - 1;
    const uint64_t skip_end = min_u64(c->min_size, last);
    const uint64_t small_end = min_u64(c->avg_size, last);
    uint64_t L = c->chunk_len, h = c->hash;
    size_t pos = 0, nc = 0;

    while (pos < len) {
        size_t avail = len - pos;
        if (L < skip_end) {
            uint64_t take = min_u64(skip_end - L, avail);
            L += take;
            pos += (size_t)take;
            continue;
        }
        if (L < small_end) {
            size_t n = (size_t)min_u64(small_end - L, avail);
            size_t i = gear_scan(data + pos, n, &h, c->mask_small);
            L += i;
            pos += i;
            if (i == n)
                continue;
        } else if (L < last) {
            size_t n = (size_t)min_u64(last - L, avail);
            size_t i = gear_scan(data + pos, n, &h, c->mask_large);
            L += i;
            pos += i;
            if (i == n)
                continue;
        }
        /* data[pos] ends the chunk (hash match, or L == max_size - 1). */
        if (nc == max_cuts)
            break;                      /* no slot: stop before it; the caller feeds the rest */
        pos++;
        cuts[nc++] = c->offset + pos;
        L = 0;
        h = 0;
    }
    c->chunk_len = L;
    c->hash = h;
    c->offset += pos;
    *n_cuts = nc;
    *consumed = pos;
    return SNAP_OK;
}

int snap_cdc_finish(snap_cdc *c, uint64_t *cut, size_t *n_cuts)
{
    if (c == NULL || cut == NULL || n_cuts == NULL)
        return SNAP_EINVAL;
    *n_cuts = 0;
    if (!cdc_state_ok(c))
        return SNAP_ESTATE;
    if (c->chunk_len != 0) {
        *cut = c->offset;
        *n_cuts = 1;
    }
    c->hash = 0;
    c->chunk_len = 0;
    c->offset = 0;
    return SNAP_OK;
}
