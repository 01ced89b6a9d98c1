/* The fixed runtime of a compiled softswitch program: arithmetic with the Python path's semantics,
 * bit access to frames, bmv2's hash algorithms, table lookups over the flat arrays the control plane
 * builds (softswitch/native/state.py), and the random source. The program's own code is generated
 * (softswitch/native/) and follows this text, then io.h. */
#define _GNU_SOURCE /* recvmmsg, sendmmsg (io.h) */
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef __int128 i128;
typedef unsigned __int128 u128;

/* Python ints are unbounded; expressions here are computed modulo 2^128, which gives the same value
 * after p4c's masks for every operation the generator lets through with a wider intermediate (x_),
 * or over int64_t where every value of a subexpression stays below 2^62 in magnitude (cexpr's
 * NARROW_BITS: nothing overflows, so the results are the exact ones; x64_). T is the type, U its
 * unsigned twin (wrapping arithmetic), B its bits. */
#define ARITHMETIC(T, U, B, P) \
    static inline T P##shl(T a, T b) { return b >= B ? 0 : (T)((U)a << (int)b); } \
    static inline T P##shr(T a, T b) { return b >= B - 1 ? (a < 0 ? -1 : 0) : a >> (int)b; } \
    static inline T P##div(T a, T b) { return (b > 0 && a >= 0) ? a / b : 0; } \
    static inline T P##mod(T a, T b) { return (b > 0 && a >= 0) ? a % b : 0; } \
    static inline T P##min(T a, T b) { return a < b ? a : b; } \
    static inline T P##max(T a, T b) { return a > b ? a : b; } \
    static inline T P##add(T a, T b) { return (T)((U)a + (U)b); } \
    static inline T P##sub(T a, T b) { return (T)((U)a - (U)b); } \
    static inline T P##mul(T a, T b) { return (T)((U)a * (U)b); }
ARITHMETIC(i128, u128, 128, x_)
ARITHMETIC(int64_t, uint64_t, 64, x64_)
#define N64(v) ((i128)(int64_t)(v)) /* an int64_t subexpression where an i128 is expected */
/* c ? a : b without a branch (both arms are pure: cexpr), and << modulo 2^64 (cexpr's `modular`) */
static inline int64_t x64_sel(int c, int64_t a, int64_t b) { int64_t m = -(int64_t)c; return (a & m) | (b & ~m); }
static inline uint64_t u64_sel(int c, uint64_t a, uint64_t b) { uint64_t m = -(uint64_t)c; return (a & m) | (b & ~m); }
static inline uint64_t u64_shl(uint64_t a, int64_t b) { return b >= 64 ? 0 : a << (int)b; }
static inline i128 x_hmod(i128 h, i128 size) { return size > 0 ? h % size : h; }

/* width bits at bit offset `bit` of p, big-endian (width <= 64). A whole byte-aligned 8, 16, 32 or
 * 64 bits is one load (the generator's offsets and widths are constants, so the test folds away):
 * a chunk's K elements are such fields, and the byte loop below cost them most of a frame's time. */
static inline uint64_t get_bits(const uint8_t *p, int64_t bit, int width) {
    if ((bit & 7) == 0) {
        const uint8_t *b = p + (bit >> 3);
        if (width == 8) return b[0];
        if (width == 16) { uint16_t v; memcpy(&v, b, 2); return __builtin_bswap16(v); }
        if (width == 32) { uint32_t v; memcpy(&v, b, 4); return __builtin_bswap32(v); }
        if (width == 64) { uint64_t v; memcpy(&v, b, 8); return __builtin_bswap64(v); }
    }
    const uint8_t *q = p + (bit >> 3);
    int lead = (int)(bit & 7);
    int nbytes = (lead + width + 7) >> 3;
    u128 v = 0;
    for (int i = 0; i < nbytes; i++) v = (v << 8) | q[i];
    v >>= nbytes * 8 - lead - width;
    return (uint64_t)(v & (((u128)1 << width) - 1));
}

/* value's low `width` bits (<= 64) written at bit offset `bit` of p, big-endian (one store for a
 * whole byte-aligned 8, 16, 32 or 64 bits, as get_bits) */
static inline void put_bits(uint8_t *p, int64_t bit, int width, uint64_t value) {
    if ((bit & 7) == 0) {
        uint8_t *b = p + (bit >> 3);
        if (width == 8) { b[0] = (uint8_t)value; return; }
        if (width == 16) { uint16_t v = __builtin_bswap16((uint16_t)value); memcpy(b, &v, 2); return; }
        if (width == 32) { uint32_t v = __builtin_bswap32((uint32_t)value); memcpy(b, &v, 4); return; }
        if (width == 64) { uint64_t v = __builtin_bswap64(value); memcpy(b, &v, 8); return; }
    }
    uint8_t *q = p + (bit >> 3);
    int lead = (int)(bit & 7);
    int nbytes = (lead + width + 7) >> 3;
    int tail = nbytes * 8 - lead - width;
    u128 mask = ((((u128)1 << width) - 1) << tail);
    u128 old = 0;
    for (int i = 0; i < nbytes; i++) old = (old << 8) | q[i];
    u128 v = (old & ~mask) | (((u128)(value & (width == 64 ? ~0ULL : ((1ULL << width) - 1)))) << tail);
    for (int i = nbytes - 1; i >= 0; i--) { q[i] = (uint8_t)v; v >>= 8; }
}

/* A whole byte-aligned field: what get_bits and put_bits do for one, where the offset is a loop's
 * (cparser's per-element fields) and not a constant they could test. */
#define BYTES(W, T, SWAP) \
    static inline uint64_t get_be##W(const uint8_t *b) { T v; memcpy(&v, b, sizeof v); return SWAP(v); } \
    static inline void put_be##W(uint8_t *b, uint64_t value) { T v = SWAP((T)value); memcpy(b, &v, sizeof v); }
#define NO_SWAP(v) (v)
BYTES(8, uint8_t, NO_SWAP)
BYTES(16, uint16_t, __builtin_bswap16)
BYTES(32, uint32_t, __builtin_bswap32)
BYTES(64, uint64_t, __builtin_bswap64)

/* A bit string built MSB first for a calculation's inputs. */
typedef struct { uint8_t b[512]; int64_t n; } bits_t;
static inline void bits_put(bits_t *s, int width, uint64_t value) {
    if (s->n + width > (int64_t)sizeof s->b * 8) return; /* the generator keeps inputs far below */
    if ((s->n & 7) == 0 && (width & 7) == 0) {
        for (int i = width - 8; i >= 0; i -= 8) s->b[s->n >> 3] = (uint8_t)(value >> i), s->n += 8;
        return;
    }
    if ((s->n & 7) == 0) s->b[s->n >> 3] = 0;
    int64_t end = s->n + width;
    for (int64_t i = ((s->n + 7) >> 3); i < ((end + 7) >> 3); i++) s->b[i] = 0;
    put_bits(s->b, s->n, width, value);
    s->n = end;
}

static uint32_t crc32_table[256];
static uint16_t crc16_table[256];
static void hash_tables_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc32_table[i] = c;
        uint16_t d = (uint16_t)i;
        for (int k = 0; k < 8; k++) d = d & 1 ? (uint16_t)((d >> 1) ^ 0xA001) : (uint16_t)(d >> 1);
        crc16_table[i] = d;
    }
}
static i128 h_crc32(const uint8_t *b, int64_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (int64_t i = 0; i < n; i++) c = crc32_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return (i128)(c ^ 0xFFFFFFFFu);
}
static i128 h_crc16(const uint8_t *b, int64_t n) {
    uint16_t c = 0;
    for (int64_t i = 0; i < n; i++) c = (uint16_t)((c >> 8) ^ crc16_table[(c ^ b[i]) & 0xFF]);
    return (i128)c;
}
static i128 h_csum16(const uint8_t *b, int64_t n) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i += 2) s += ((uint64_t)b[i] << 8) | (i + 1 < n ? b[i + 1] : 0);
    while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
    return (i128)(~s & 0xFFFF);
}
static i128 h_xor16(const uint8_t *b, int64_t n) {
    uint32_t x = 0;
    for (int64_t i = 0; i < n; i += 2) x ^= ((uint32_t)b[i] << 8) | (i + 1 < n ? b[i + 1] : 0);
    return (i128)x;
}
static i128 h_identity(const uint8_t *b, int64_t n) { /* n <= 15: the generator checks */
    u128 v = 0;
    for (int64_t i = 0; i < n; i++) v = (v << 8) | b[i];
    return (i128)v;
}

/* One table as state.py flattens it (all arrays owned by Python, rebuilt between batches).
 * Exact tables: rows found through an open-addressing index `slots` (hcap entries, -1 empty) over
 * `vals` (nk words a row). Other tables: rows in priority order, a row matches when every
 * (key & masks) == vals and lo <= key <= hi. */
typedef struct {
    int64_t nrows, nk, nargs, hcap;
    const uint64_t *masks, *vals, *lo, *hi;
    const int64_t *slots;
    const int64_t *aid;
    const uint64_t *args;
    const uint64_t *ctr; /* per row: address of the entry's (packets, bytes) cells, or 0 */
    int64_t miss_aid;
    const uint64_t *miss_args;
} mtable_t;

static inline uint64_t key_hash(const uint64_t *k, int64_t nk) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int64_t i = 0; i < nk; i++) { h ^= k[i]; h *= 0xBF58476D1CE4E5B9ULL; h ^= h >> 31; }
    return h;
}

/* the row a key hits, or -1 */
static int64_t table_lookup(const mtable_t *t, const uint64_t *k) {
    if (t->hcap) {
        uint64_t m = (uint64_t)t->hcap - 1;
        for (uint64_t s = key_hash(k, t->nk) & m;; s = (s + 1) & m) {
            int64_t r = t->slots[s];
            if (r < 0) return -1;
            if (!memcmp(t->vals + r * t->nk, k, (size_t)t->nk * 8)) return r;
        }
    }
    for (int64_t r = 0; r < t->nrows; r++) {
        const uint64_t *m = t->masks + r * t->nk, *v = t->vals + r * t->nk;
        int64_t i = 0;
        for (; i < t->nk; i++)
            if ((k[i] & m[i]) != v[i] || k[i] < t->lo[r * t->nk + i] || k[i] > t->hi[r * t->nk + i]) break;
        if (i == t->nk) return r;
    }
    return -1;
}

/* multicast groups: gid[g], first[g]..first[g+1] index port[] and rid[] */
typedef struct {
    int64_t ngroups, most;
    const int64_t *gid, *first, *port, *rid;
} pre_t;

static inline int64_t pre_find(const pre_t *p, i128 g) {
    for (int64_t i = 0; i < p->ngroups; i++) if (p->gid[i] == g) return i;
    return -1;
}

static inline int64_t now_us(int64_t t0_ns) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec - t0_ns) / 1000;
}

static uint64_t rng_state = 0x853C49E6748FEA9BULL;
static inline uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* uniform in [lo, max(lo, hi)], as random.randint */
static inline i128 rng_uniform(i128 lo, i128 hi) {
    if (hi <= lo) return lo;
    u128 span = (u128)(hi - lo) + 1;
    u128 r = ((u128)rng_next() << 64) | rng_next();
    return lo + (i128)(span ? r % span : r);
}
