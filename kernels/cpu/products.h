// The weight products y = x W^T (+ bias) of the native CPU step, in every layout it reads and every flavour.
//
// `Lin` describes one product (INT4 in groups, the int8 output head, F32, BF16); `quantize_row` / `quantize_acts`
// turn a row of activations into int8 per block of 64 or 32 inputs, what the integer products read; then the
// products: VNNI (INT4 / int8-head tiles of 1..8 positions x 16 columns, INT4 and int8-head pair tiles of 4 or 8
// positions x 32 columns, F32 / BF16 tiles of 4 x 4), AVX2 (tiles of 1..8 positions, the head 1..4, x 8 columns,
// a 16-column block as two halves), the portable loops, and `linear`, which splits one product over the threads
// of the caller's parallel region.
//
// Batch invariance by construction: every (position, column) is computed by the same sequence of operations
// whether the pass holds 1 position or 512, and whichever thread computes it. Tiles over positions only reuse
// loaded weights; they never reorder a position's arithmetic.

#pragma once
#include "profile.h"
#include "simd.h"

enum { W_Q4 = 0, W_F32 = 1, W_Q8 = 2, W_BF16 = 3 };

// A linear layer y = x W^T (+ bias). Q4: 4-bit q with w = (q - z) * s per group of `group` inputs, s fp16
// (the checkpoint's own scales, bits in s16) and z uint8, in the column-block layout described at
// q4_block. Q8 (output head): int8 with one fp32 scale per output column in s. F32: w [N][K]. BF16: w [N][K]
// as bf16 bits (a bf16 checkpoint held as it is stored), widened to fp32 as it is read: the F32 product's
// arithmetic on the same values, at half the bytes.
// act_block: the block of inputs its activations are quantized in, 64 or 32 (Q4; the packer's choice, see
// `lin_block`); the int8 head always reads 32.
struct Lin {
    int32_t kind, N, K, group;
    const uint8_t* q;
    const float* s;
    const uint16_t* s16;
    const uint8_t* z;
    const float* w;
    const float* bias;
    int32_t act_block;
    // Q4 only, or null: a float minimum per group, w = (q - z) * s + m (GGUF's Q4_1 and Q4_K: scale and
    // minimum per 32 inputs), fp16 bits [N/16][K/G][16] as s16. Products with one read blocks of 32.
    const uint16_t* m16;
};

// Activations quantized to int8 per position, in blocks of 64 or 32 inputs (what the integer dot products read).
//
// One scale per 64 inputs, the INT4 weights' own chunk (and the embedded model's group): a product then
// converts and scales one exact int32 sum per (position, 64 inputs), not two. Blocks of 32 where 64 costs
// accuracy: the MLP's down projection (its input, the SwiGLU output, has the outliers) and the int8 head
// (`parley bench quality` compares the choices; docs/cpu-step.md). Which block a product reads is the packer's
// choice (Lin.act_block).

struct Act {  // rows of K inputs; which K and block size a product reads is its own (Lin.K, lin_block)
    int8_t* q;     // [M][K]
    float* d;      // [M][K/bs]: block scales
    int32_t* xs;   // [M][K/bs]: block sums of q (the zero points' share, and the +128 of the int8 head's weights)
};

// The activation block a product reads: 32 for the int8 head and INT4 products packed so, else 64.
static inline int lin_block(const Lin* L) { return L->kind == 2 /* W_Q8 */ || L->act_block == 32 ? 32 : 64; }
// Products that read 8-bit activations (INT4 and the int8 head); F32 and BF16 read the fp32 rows themselves.
static inline bool quantized(const Lin* L) { return L->kind == 0 /* W_Q4 */ || L->kind == 2 /* W_Q8 */; }
// Float products (F32, BF16) keep gate and up as two halves [gate; up] (each module's rows, read in place);
// the INT4 packer interleaves them by 16 columns.
static inline bool split_gate_up(const Lin* L) { return !quantized(L); }

// Blocks b0 .. b1 - 1 of the row (all of them by default): each block's values are its own, so a row split
// into ranges of blocks over the threads quantizes to the same bits.
static void quantize_row(const float* x, int K, int bs, const Act* a, int m, int b0 = 0, int b1 = -1) {
    const int nv = bs / 16;
    int8_t* q = a->q + (size_t)m * K;
    float* d = a->d + (size_t)m * (K / bs);
    int32_t* xs = a->xs + (size_t)m * (K / bs);
    if (b1 < 0) b1 = K / bs;
    for (int b = b0; b < b1; b++) {
        const float* xb = x + b * bs;
#if PARLEY_VNNI  // the same values as the loop below: max and integer sums are exact, x * inv rounds to even
        __m512 xv[4];
        __m512 mv = _mm512_setzero_ps();
        for (int u = 0; u < nv; u++) {
            xv[u] = _mm512_loadu_ps(xb + 16 * u);
            mv = _mm512_max_ps(mv, _mm512_abs_ps(xv[u]));
        }
        const float amax = _mm512_reduce_max_ps(mv);
        const float db = amax / 127.0f, inv = db > 0 ? 1.0f / db : 0.0f;
        const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
        __m512i sum = _mm512_setzero_si512();
        for (int u = 0; u < nv; u++) {
            __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(xv[u], _mm512_set1_ps(inv)));
            qi = _mm512_max_epi32(_mm512_min_epi32(qi, lim), nlim);
            _mm_storeu_si128((__m128i*)(q + b * bs + 16 * u), _mm512_cvtepi32_epi8(qi));
            sum = _mm512_add_epi32(sum, qi);
        }
        d[b] = db;
        xs[b] = _mm512_reduce_add_epi32(sum);
#elif PARLEY_AVX2  // the same values again
        __m256 xv[8];
        __m256 mv = _mm256_setzero_ps();
        for (int u = 0; u < 2 * nv; u++) {
            xv[u] = _mm256_loadu_ps(xb + 8 * u);
            mv = _mm256_max_ps(mv, abs8(xv[u]));
        }
        const float amax = hmax8(mv);
        const float db = amax / 127.0f, inv = db > 0 ? 1.0f / db : 0.0f;
        const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
        __m256i sum = _mm256_setzero_si256();
        for (int u = 0; u < 2 * nv; u += 4) {
            __m256i qi[4];
            for (int k = 0; k < 4; k++) {
                qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(xv[u + k], _mm256_set1_ps(inv)));
                qi[k] = _mm256_max_epi32(_mm256_min_epi32(qi[k], lim), nlim);
                sum = _mm256_add_epi32(sum, qi[k]);
            }
            store_i8x32(q + b * bs + 8 * u, qi[0], qi[1], qi[2], qi[3]);
        }
        d[b] = db;
        xs[b] = hsum8i(sum);
#else
        float amax = 0.0f;
        for (int i = 0; i < bs; i++) amax = std::fmax(amax, std::fabs(xb[i]));
        const float db = amax / 127.0f, inv = db > 0 ? 1.0f / db : 0.0f;
        int sum = 0;
        for (int i = 0; i < bs; i++) {
            int v = (int)std::nearbyint(xb[i] * inv);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            q[b * bs + i] = (int8_t)v;
            sum += v;
        }
        d[b] = db;
        xs[b] = sum;
#endif
    }
}

// Called inside a parallel region (an orphaned `omp for`: the threads split the rows, then meet).
static void quantize_acts(const float* x, int M, int K, int bs, const Act* a) {
#pragma omp for schedule(static) PARLEY_NOWAIT
    for (int m = 0; m < M; m++) quantize_row(x + (size_t)m * K, K, bs, a, m);
}

// Products over blocks of 16 output columns, the 16 columns in the 16 lanes of a vector: one VNNI
// instruction multiplies 4 inputs of one position (broadcast) by the same 4 inputs' weights of 16
// columns. Sums within an activation block (64 inputs, or 32: `lin_block`) are exact int32; each block then
// adds once, in float, to the column's sum, in input order. No horizontal sums, and every (position, column)
// runs the same arithmetic whatever the tile of positions it is computed in.
//
// Q4 layout, per 16-column block and 64-input chunk: 8 vectors of 64 bytes; byte 4n + j of vector t holds
// q[n][4t + j] (low nibble) and q[n][32 + 4t + j] (high nibble). s16, z: [N/16][K/G][16]. Both nibbles are
// used as 16 x their value (`v & 0xf0`, and `(v << 4) & 0xf0`), so one int32 accumulator per position holds
// 16 x the chunk's sum of q * x; the zero point enters in the same integers (- 16 z * the activations' block
// sum, one `vpdpwssd`), and the exact sum 16 sum (q - z) x (< 2^21) meets d * s / 16 once: one conversion and
// one multiply-add per (position, 64 inputs).
// Q8 layout (head): 16 vectors of 64 bytes per chunk; byte 4n + j of vector t is w[n][4t + j] + 128.

static inline int32_t load_i32(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

#if PARLEY_VNNI
// INT4 weights stream from memory once per pass: each vector loaded asks for the one this far ahead (the blocks
// of a thread's columns are contiguous, so it runs on into the next block). 4 KB ahead runs faster than 2, and
// 8 or 16 no faster (docs/cpu-step.md, "Tried and not kept"). The int8 head a block at a time runs slower with
// it, so q8_block has none at 2 positions or more; its pair tiles (more arithmetic per byte) prefetch the next
// pair. A 1-position block (decode) asks for none into L1: on AMD Zen 4 the hardware prefetcher alone streams a
// thread's blocks faster (8-12% on a 1-thread 1B or 8B decode, the same on 2 threads), while 4 positions run
// 35% slower without it on the down projection.
constexpr int PREFETCH_BYTES = 4096;

// A decode step (1 position) on an Intel CPU, INT4 and the int8 head, asks for each vector's successor 8 KB
// ahead into L2: its cores stream much more of the read bandwidth with it (a 2-core Xeon with AMX: the 8B
// shape's products 28-29 against 24 GB/s on two threads, the 1B shape's decode 37.5 against 31 tok/s; into L1
// instead, no gain; docs/performance-sizes.md). On AMD Zen 4 neither pays (L2 prefetches: no gain on two
// threads, slower on one; docs/cpu-step.md, "Tried and not kept"), so there the hardware prefetcher streams
// decode alone.
constexpr int DECODE_PREFETCH_BYTES = 8192;
static bool decode_l2_prefetch() {
    static const bool intel = __builtin_cpu_is("intel");
    return intel;
}

template <int R, int AB>
static inline void q4_block(const Lin* L, int nb, const Act* a, int m0, float* y, int ldy) {
    // groups of 32 (GGUF's Q4 formats; blocks of 32 only): two groups per chunk, hf's own below
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, cpg = G >= 64 ? G / 64 : 1;
    // independent partial sums per position (short dependency chains); blocks of 32: low and high apart, and at
    // 1-2 positions each split again by even and odd vectors (ib[r][2], ib[r][3]; 10% faster on the down
    // projection of a 1-thread decode, whose chains were otherwise 8 `vpdpbusd` deep a chunk)
    constexpr int P = R <= 2 ? 4 : (AB == 32 || R < 6 ? 2 : 1);
    const uint8_t* wq = L->q + (size_t)nb * nc * 512;
    const uint16_t* S = L->s16 + (size_t)nb * ng * 16;
    const uint8_t* Z = L->z + (size_t)nb * ng * 16;
    const uint16_t* Mn = L->m16 ? L->m16 + (size_t)nb * ng * 16 : nullptr;
    const __m512i hi = _mm512_set1_epi8((char)0xf0);
    const bool l2_prefetch = R == 1 && decode_l2_prefetch();
    __m512 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    // the group's -16 z as int16 in the low half of each lane, and its s / 16 (exact); for each half of the
    // chunk (zh0/sh0: inputs 0..31, zh1/sh1: 32..63; the same group unless groups are of 32), and each half's
    // minimum (zero without one). Named registers, not arrays indexed by half: those the compiler keeps on
    // the stack, reloaded every chunk.
    __m512i zh0 = _mm512_setzero_si512(), zh1 = zh0;
    __m512 sh0 = _mm512_setzero_ps(), sh1 = sh0, mh0 = sh0, mh1 = sh0;
    auto group = [&](int g, __m512i& zn, __m512& s_16, __m512& mn) {
        const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(Z + (size_t)g * 16)));
        zn = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(z, 4)), _mm512_set1_epi32(0xffff));
        s_16 = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(S + (size_t)g * 16))), _mm512_set1_ps(0.0625f));
        if (Mn) mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(Mn + (size_t)g * 16)));
    };
    // chunks left in the current group (a count, not ci % cpg: an integer division every chunk)
    for (int ci = 0, left = 0, g = 0; ci < nc; ci++) {
        if (G == 32) {
            group(2 * ci, zh0, sh0, mh0);
            group(2 * ci + 1, zh1, sh1, mh1);
        } else if (left-- == 0) {
            group(g++, zh0, sh0, mh0);
            zh1 = zh0, sh1 = sh0, mh1 = mh0;
            left = cpg - 1;
        }
        const __m512i zn = zh0;
        const __m512 s_16 = sh0;
        __m512i ib[R][P];
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) ib[r][p] = _mm512_setzero_si512();
        const uint8_t* w = wq + (size_t)ci * 512;
        if constexpr (AB == 32) {
            // Blocks of 32 (the MLP's down projection): two or four live sums per position. Unrolled
            // here because, left to itself, the compiler keeps this loop rolled and 2 of them on the stack, each
            // `vpdpbusd` then waiting on a store and a reload.
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                if constexpr (R > 1) _mm_prefetch((const char*)(w + PREFETCH_BYTES + t * 64), _MM_HINT_T0);
                else if (l2_prefetch) _mm_prefetch((const char*)(w + DECODE_PREFETCH_BYTES + t * 64), _MM_HINT_T1);
                const __m512i v = _mm512_loadu_si512((const void*)(w + t * 64));
                const __m512i l = _mm512_and_si512(_mm512_slli_epi16(v, 4), hi), h = _mm512_and_si512(v, hi);
                for (int r = 0; r < R; r++) {
                    const int8_t* x = a->q + (size_t)(m0 + r) * K + ci * 64 + 4 * t;
                    const int j = P == 4 && t % 2 ? 2 : 0;
                    ib[r][j] = _mm512_dpbusd_epi32(ib[r][j], l, _mm512_set1_epi32(load_i32(x)));
                    ib[r][j + 1] = _mm512_dpbusd_epi32(ib[r][j + 1], h, _mm512_set1_epi32(load_i32(x + 32)));
                }
            }
            if constexpr (P == 4)
                for (int r = 0; r < R; r++)
                    ib[r][0] = _mm512_add_epi32(ib[r][0], ib[r][2]), ib[r][1] = _mm512_add_epi32(ib[r][1], ib[r][3]);
        } else {
            for (int t = 0; t < 8; t++) {
                if constexpr (R > 1) _mm_prefetch((const char*)(w + PREFETCH_BYTES + t * 64), _MM_HINT_T0);
                else if (l2_prefetch) _mm_prefetch((const char*)(w + DECODE_PREFETCH_BYTES + t * 64), _MM_HINT_T1);
                const __m512i v = _mm512_loadu_si512((const void*)(w + t * 64));
                const __m512i l = _mm512_and_si512(_mm512_slli_epi16(v, 4), hi), h = _mm512_and_si512(v, hi);
                for (int r = 0; r < R; r++) {
                    const int8_t* x = a->q + (size_t)(m0 + r) * K + ci * 64 + 4 * t;
                    ib[r][2 * t % P] = _mm512_dpbusd_epi32(ib[r][2 * t % P], l, _mm512_set1_epi32(load_i32(x)));
                    ib[r][(2 * t + 1) % P] = _mm512_dpbusd_epi32(ib[r][(2 * t + 1) % P], h, _mm512_set1_epi32(load_i32(x + 32)));
                }
            }
        }
        for (int r = 0; r < R; r++) {
            if constexpr (AB == 32) {  // ib[r][0]: inputs 0..31 of the chunk (low nibbles), ib[r][1]: 32..63
                for (int hf = 0; hf < 2; hf++) {
                    const size_t blk = (size_t)(m0 + r) * 2 * nc + 2 * ci + hf;
                    const __m512i b = _mm512_dpwssd_epi32(ib[r][hf], hf ? zh1 : zh0, _mm512_set1_epi32(a->xs[blk]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), hf ? sh1 : sh0), acc[r]);
                    // the minimum's share: m times the block's sum of x (d times its exact integer sum)
                    if (Mn) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a->d[blk] * (float)a->xs[blk]), hf ? mh1 : mh0, acc[r]);
                }
                continue;
            }
            __m512i b = ib[r][0];
            if (P == 4) b = _mm512_add_epi32(_mm512_add_epi32(b, ib[r][2]), _mm512_add_epi32(ib[r][1], ib[r][3]));
            if (P == 2) b = _mm512_add_epi32(b, ib[r][1]);
            const size_t blk = (size_t)(m0 + r) * nc + ci;
            b = _mm512_dpwssd_epi32(b, zn, _mm512_set1_epi32(a->xs[blk]));  // |block sum| <= 64 * 127: an int16
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), s_16), acc[r]);
        }
    }
    const int n0 = nb * 16, cnt = L->N - n0 < 16 ? L->N - n0 : 16;
    const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
    for (int r = 0; r < R; r++) {
        __m512 v = acc[r];
        if (L->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, L->bias + n0));
        _mm512_mask_storeu_ps(y + (size_t)(m0 + r) * ldy + n0, mask, v);
    }
}

// Two column blocks x 4 positions (blocks of 64 inputs): each broadcast activation feeds two `vpdpbusd`, one
// per block. Why: on Zen 5 a broadcast from memory costs nearly what a `vpdpbusd` does, so one block at a time
// (a broadcast per `vpdpbusd`) runs well short of the core's peak, and one broadcast per two instructions
// recovers part of it. R = 4 positions for a prefill: the tile's 8 int32 and 8 float sums, 4 unpacked weight
// vectors and 2 broadcasts stay in registers (2 x 8 positions would spill every float sum to the stack each
// chunk); R = 8 for short passes, where the weights stream from memory (see quant_block). Each (position,
// column) sums the same exact int32 per 64 inputs and meets its scale in the same float operations, in input
// order: the same bits as `q4_block`. The down projection (blocks of 32) runs slower paired and stays on
// `q4_block` (docs/cpu-step.md, "Tried and not kept").
template <int R>
static inline void q4_pair(const Lin* L, int nb, const Act* a, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, cpg = G / 64;
    const uint8_t* wq = L->q + (size_t)nb * nc * 512;  // block nb + 1 follows at + nc * 512
    const uint16_t* S = L->s16 + (size_t)nb * ng * 16;  // and its scales / zero points at + ng * 16
    const uint8_t* Z = L->z + (size_t)nb * ng * 16;
    const __m512i hi = _mm512_set1_epi8((char)0xf0);
    __m512 acc[2][R];
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps();
    __m512i zn[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    __m512 s_16[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int ci = 0; ci < nc; ci++) {
        if (ci % cpg == 0) {
            const int g = ci / cpg;
            for (int c = 0; c < 2; c++) {
                const size_t o = ((size_t)c * ng + g) * 16;
                const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(Z + o)));
                zn[c] = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(z, 4)), _mm512_set1_epi32(0xffff));
                s_16[c] = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(S + o))), _mm512_set1_ps(0.0625f));
            }
        }
        const uint8_t* w0 = wq + (size_t)ci * 512;
        const uint8_t* w1 = w0 + (size_t)nc * 512;
        __m512i ib[2][R];
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < R; r++) ib[c][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            // the same place in the next pair of blocks (the thread's next work item): PREFETCH_BYTES ahead
            // of each block would land in the other block of this pair, already being read
            _mm_prefetch((const char*)(w0 + 2 * nc * 512 + t * 64), _MM_HINT_T0);
            _mm_prefetch((const char*)(w1 + 2 * nc * 512 + t * 64), _MM_HINT_T0);
            const __m512i v0 = _mm512_loadu_si512((const void*)(w0 + t * 64));
            const __m512i v1 = _mm512_loadu_si512((const void*)(w1 + t * 64));
            const __m512i l0 = _mm512_and_si512(_mm512_slli_epi16(v0, 4), hi), h0 = _mm512_and_si512(v0, hi);
            const __m512i l1 = _mm512_and_si512(_mm512_slli_epi16(v1, 4), hi), h1 = _mm512_and_si512(v1, hi);
            for (int r = 0; r < R; r++) {
                const int8_t* x = a->q + (size_t)(m0 + r) * K + ci * 64 + 4 * t;
                const __m512i xl = _mm512_set1_epi32(load_i32(x)), xh = _mm512_set1_epi32(load_i32(x + 32));
                ib[0][r] = _mm512_dpbusd_epi32(ib[0][r], l0, xl);
                ib[1][r] = _mm512_dpbusd_epi32(ib[1][r], l1, xl);
                ib[0][r] = _mm512_dpbusd_epi32(ib[0][r], h0, xh);
                ib[1][r] = _mm512_dpbusd_epi32(ib[1][r], h1, xh);
            }
        }
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < R; r++) {  // as q4_block: the zero point in the integers, then one multiply-add
                const size_t blk = (size_t)(m0 + r) * nc + ci;
                const __m512i b = _mm512_dpwssd_epi32(ib[c][r], zn[c], _mm512_set1_epi32(a->xs[blk]));
                acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), s_16[c]), acc[c][r]);
            }
    }
    for (int c = 0; c < 2; c++) {
        const int n0 = (nb + c) * 16, cnt = L->N - n0 < 16 ? L->N - n0 : 16;
        const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
        for (int r = 0; r < R; r++) {
            __m512 v = acc[c][r];
            if (L->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, L->bias + n0));
            _mm512_mask_storeu_ps(y + (size_t)(m0 + r) * ldy + n0, mask, v);
        }
    }
}

template <int R>
static inline void q8_block(const Lin* L, int nb, const Act* a, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64;
    constexpr int P = R < 4 ? 2 : 1;
    const uint8_t* wq = L->q + (size_t)nb * nc * 1024;
    const bool l2_prefetch = R == 1 && decode_l2_prefetch();
    __m512 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int ci = 0; ci < nc; ci++) {
        const uint8_t* w = wq + (size_t)ci * 1024;
        for (int half = 0; half < 2; half++) {
            __m512i ib[R][P];
            for (int r = 0; r < R; r++)
                for (int p = 0; p < P; p++) ib[r][p] = _mm512_setzero_si512();
            for (int t = 0; t < 8; t++) {
                if (l2_prefetch) _mm_prefetch((const char*)(w + DECODE_PREFETCH_BYTES + (half * 8 + t) * 64), _MM_HINT_T1);
                const __m512i v = _mm512_loadu_si512((const void*)(w + (half * 8 + t) * 64));
                for (int r = 0; r < R; r++) {
                    const int8_t* x = a->q + (size_t)(m0 + r) * K + ci * 64 + half * 32 + 4 * t;
                    ib[r][t % P] = _mm512_dpbusd_epi32(ib[r][t % P], v, _mm512_set1_epi32(load_i32(x)));
                }
            }
            for (int r = 0; r < R; r++) {
                __m512i b = ib[r][0];
                if (P == 2) b = _mm512_add_epi32(b, ib[r][P - 1]);
                const size_t blk = (size_t)(m0 + r) * (K / 32) + 2 * ci + half;
                b = _mm512_sub_epi32(b, _mm512_set1_epi32(128 * a->xs[blk]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(a->d[blk]), acc[r]);
            }
        }
    }
    const int n0 = nb * 16, cnt = L->N - n0 < 16 ? L->N - n0 : 16;
    const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(mask, L->s + n0);
    for (int r = 0; r < R; r++) {
        __m512 v = _mm512_mul_ps(acc[r], s);
        if (L->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, L->bias + n0));
        _mm512_mask_storeu_ps(y + (size_t)(m0 + r) * ldy + n0, mask, v);
    }
}

// The int8 head in pair tiles: two column blocks x R (4 or 8) positions, each broadcast activation word feeding
// one `vpdpbusd` per block (the reason, as for q4_pair: a broadcast costs nearly what a `vpdpbusd` does on this
// core). Per (position, column) the same exact int32 sum per 32 inputs, the same `- 128 x` correction and the
// same float multiply-add in input order as q8_block: the same bits. Why: q8_block issues one broadcast per
// `vpdpbusd`, which leaves the head, a large share of a short pass, far below the core's peak.
template <int R>
static inline void q8_pair(const Lin* L, int nb, const Act* a, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64;
    const uint8_t* wq = L->q + (size_t)nb * nc * 1024;  // block nb + 1 follows at + nc * 1024
    __m512 acc[2][R];
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps();
    for (int ci = 0; ci < nc; ci++) {
        const uint8_t* w0 = wq + (size_t)ci * 1024;
        const uint8_t* w1 = w0 + (size_t)nc * 1024;
        for (int half = 0; half < 2; half++) {
            __m512i ib[2][R];
            for (int c = 0; c < 2; c++)
                for (int r = 0; r < R; r++) ib[c][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                // the same place in the next pair (the thread's next work item), as q4_pair: in a pass the head
                // streams from memory, and without this the pair's two streams left the tile waiting on them
                _mm_prefetch((const char*)(w0 + 2 * nc * 1024 + (half * 8 + t) * 64), _MM_HINT_T0);
                _mm_prefetch((const char*)(w1 + 2 * nc * 1024 + (half * 8 + t) * 64), _MM_HINT_T0);
                const __m512i v0 = _mm512_loadu_si512((const void*)(w0 + (half * 8 + t) * 64));
                const __m512i v1 = _mm512_loadu_si512((const void*)(w1 + (half * 8 + t) * 64));
                for (int r = 0; r < R; r++) {
                    const __m512i x = _mm512_set1_epi32(load_i32(a->q + (size_t)(m0 + r) * K + ci * 64 + half * 32 + 4 * t));
                    ib[0][r] = _mm512_dpbusd_epi32(ib[0][r], v0, x);
                    ib[1][r] = _mm512_dpbusd_epi32(ib[1][r], v1, x);
                }
            }
            for (int c = 0; c < 2; c++)
                for (int r = 0; r < R; r++) {  // as q8_block
                    const size_t blk = (size_t)(m0 + r) * (K / 32) + 2 * ci + half;
                    const __m512i b = _mm512_sub_epi32(ib[c][r], _mm512_set1_epi32(128 * a->xs[blk]));
                    acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(a->d[blk]), acc[c][r]);
                }
        }
    }
    for (int c = 0; c < 2; c++) {
        const int n0 = (nb + c) * 16, cnt = L->N - n0 < 16 ? L->N - n0 : 16;
        const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
        const __m512 s = _mm512_maskz_loadu_ps(mask, L->s + n0);
        for (int r = 0; r < R; r++) {
            __m512 v = _mm512_mul_ps(acc[c][r], s);
            if (L->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, L->bias + n0));
            _mm512_mask_storeu_ps(y + (size_t)(m0 + r) * ldy + n0, mask, v);
        }
    }
}

static inline __m512 load_bf16x16(const uint16_t* p) {  // 16 bf16 -> fp32, exact
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

template <int R, int C, bool BF16 = false>
static inline void f32_tile(const Lin* L, int n0, const float* x, int m0, float* y, int ldy) {
    const int K = L->K;
    __m512 acc[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        __m512 w[C];
        for (int c = 0; c < C; c++)
            w[c] = BF16 ? load_bf16x16((const uint16_t*)L->w + (size_t)(n0 + c) * K + k)
                        : _mm512_loadu_ps(L->w + (size_t)(n0 + c) * K + k);
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)(m0 + r) * K + k);
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(w[c], xv, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = hsum(acc[r][c]);
            if (L->bias) v += L->bias[n0 + c];
            y[(size_t)(m0 + r) * ldy + n0 + c] = v;
        }
}
#endif

#if PARLEY_AVX2
// The products on AVX2: the same packed layouts, a 16-column block as two halves of 8 columns (bytes 0..31 and
// 32..63 of each 64-byte vector), the 8 columns in the 8 int32 lanes. `vpmaddubsw` multiplies the unsigned
// weight bytes by a broadcast word of 4 signed activations and adds adjacent pairs to int16; `vpmaddwd` by ones
// then adds the pairs to one int32 per column. INT4: a nibble (0..15) times an activation (|x| <= 127) is at
// most 1,905, a pair 3,810, so the int16 pairs of 8 words (32 inputs) add up exactly (<= 30,480) before one
// `vpmaddwd` per 32 inputs; the zero point enters as - z x the block sum (`vpmaddwd` of -z by it, |sum| <=
// 8,128). Every sum per activation block is the exact int32 of the AVX-512 path (which holds 16 x it, its
// scale / 16), met by its scale in one multiply-add in input order: per (position, column) the same float
// operations whatever the tile, and for INT4 and the int8 head the AVX-512 path's own values.
constexpr int PREFETCH_BYTES = 4096;  // as the AVX-512 path's

// The sum as it stands, in a register: GCC reassociates a chain of integer adds into a tree of all the products
// (exact either way), keeping each product on the stack until the tree sums them; this keeps the chain.
static inline __m256i chain(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}

template <int R, int AB, int NH>
static inline void q4_tile(const Lin* L, int nb, int h0, const Act* a, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, cpg = G >= 64 ? G / 64 : 1;
    const uint8_t* wq = L->q + (size_t)nb * nc * 512 + 32 * h0;
    const uint16_t* S = L->s16 + (size_t)nb * ng * 16 + 8 * h0;
    const uint8_t* Z = L->z + (size_t)nb * ng * 16 + 8 * h0;
    const uint16_t* Mn = L->m16 ? L->m16 + (size_t)nb * ng * 16 + 8 * h0 : nullptr;
    const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[R][NH];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH; h++) acc[r][h] = _mm256_setzero_ps();
    // per half of the chunk (groups of 32; else both the chunk's group): -z as int16 in the low half of each
    // lane, the scale, the minimum (zero without one)
    __m256i zn[2][NH];
    __m256 sc[2][NH], mn[2][NH];
    for (int hf = 0; hf < 2; hf++)
        for (int h = 0; h < NH; h++) zn[hf][h] = _mm256_setzero_si256(), sc[hf][h] = mn[hf][h] = _mm256_setzero_ps();
    for (int ci = 0; ci < nc; ci++) {
        if (ci % cpg == 0) {
            for (int hf = 0; hf < (G == 32 ? 2 : 1); hf++) {
                const int g = G == 32 ? 2 * ci + hf : ci / cpg;
                for (int h = 0; h < NH; h++) {
                    const size_t o = (size_t)g * 16 + 8 * h;
                    const __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(Z + o)));
                    zn[hf][h] = _mm256_and_si256(_mm256_sub_epi32(_mm256_setzero_si256(), z), _mm256_set1_epi32(0xffff));
                    sc[hf][h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(S + o)));
                    if (Mn) mn[hf][h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(Mn + o)));
                }
            }
            if (G != 32)
                for (int h = 0; h < NH; h++) zn[1][h] = zn[0][h], sc[1][h] = sc[0][h], mn[1][h] = mn[0][h];
        }
        const uint8_t* w = wq + (size_t)ci * 512;
        // The low nibbles (inputs 0..31 of the chunk), then the high ones (32..63): one int16 sum per position in
        // registers, so a tile holds 8 positions (both at once spilled sums to the stack at 4).
        __m256i part[2][R][NH];
        if constexpr (R == 1) {  // one position: both nibbles of each vector as it is loaded (4 sums)
            __m256i acc16[2][NH];
            for (int hf = 0; hf < 2; hf++)
                for (int h = 0; h < NH; h++) acc16[hf][h] = _mm256_setzero_si256();
            for (int t0 = 0; t0 < 8; t0 += 2)
                for (int t = t0; t < t0 + 2; t++) {
                    _mm_prefetch((const char*)(w + PREFETCH_BYTES + t * 64), _MM_HINT_T0);
                    const int8_t* x = a->q + (size_t)m0 * K + ci * 64 + 4 * t;
                    const __m256i xl = _mm256_set1_epi32(load_i32(x)), xh = _mm256_set1_epi32(load_i32(x + 32));
                    for (int h = 0; h < NH; h++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i*)(w + t * 64 + 32 * h));
                        acc16[0][h] = chain(_mm256_add_epi16(acc16[0][h], _mm256_maddubs_epi16(_mm256_and_si256(v, lo4), xl)));
                        acc16[1][h] = chain(_mm256_add_epi16(acc16[1][h], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), xh)));
                    }
                }
            for (int hf = 0; hf < 2; hf++)
                for (int h = 0; h < NH; h++) part[hf][0][h] = _mm256_madd_epi16(acc16[hf][h], ones);
        } else
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) {
            __m256i acc16[R][NH];
            for (int r = 0; r < R; r++)
                for (int h = 0; h < NH; h++) acc16[r][h] = _mm256_setzero_si256();
            for (int t0 = 0; t0 < 8; t0 += 2)  // two steps a round: rolled one at a time, GCC copied every sum between registers
                for (int t = t0; t < t0 + 2; t++) {
                    if (hf == 0) _mm_prefetch((const char*)(w + PREFETCH_BYTES + t * 64), _MM_HINT_T0);
                    __m256i wt[NH];
                    for (int h = 0; h < NH; h++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i*)(w + t * 64 + 32 * h));
                        wt[h] = _mm256_and_si256(hf ? _mm256_srli_epi16(v, 4) : v, lo4);
                    }
                    for (int r = 0; r < R; r++) {
                        const __m256i xb = _mm256_set1_epi32(load_i32(a->q + (size_t)(m0 + r) * K + ci * 64 + 32 * hf + 4 * t));
                        for (int h = 0; h < NH; h++) acc16[r][h] = chain(_mm256_add_epi16(acc16[r][h], _mm256_maddubs_epi16(wt[h], xb)));
                    }
                }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < NH; h++) part[hf][r][h] = _mm256_madd_epi16(acc16[r][h], ones);
        }
        for (int r = 0; r < R; r++)
            for (int h = 0; h < NH; h++) {
                const __m256i bl = part[0][r][h], bh = part[1][r][h];
                if constexpr (AB == 32) {  // the two blocks of the chunk apart, each with its own group
                    for (int hf = 0; hf < 2; hf++) {
                        const size_t blk = (size_t)(m0 + r) * 2 * nc + 2 * ci + hf;
                        const __m256i b = _mm256_add_epi32(hf ? bh : bl, _mm256_madd_epi16(zn[hf][h], _mm256_set1_epi32(a->xs[blk])));
                        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_mul_ps(_mm256_set1_ps(a->d[blk]), sc[hf][h]), acc[r][h]);
                        if (Mn) acc[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(a->d[blk] * (float)a->xs[blk]), mn[hf][h], acc[r][h]);
                    }
                } else {
                    const size_t blk = (size_t)(m0 + r) * nc + ci;
                    const __m256i b = _mm256_add_epi32(_mm256_add_epi32(bl, bh), _mm256_madd_epi16(zn[0][h], _mm256_set1_epi32(a->xs[blk])));
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_mul_ps(_mm256_set1_ps(a->d[blk]), sc[0][h]), acc[r][h]);
                }
            }
    }
    for (int h = 0; h < NH; h++) {
        const int n0 = nb * 16 + 8 * (h0 + h), cnt = L->N - n0;
        if (cnt <= 0) break;
        const __m256i mask = lanes8(cnt);
        for (int r = 0; r < R; r++) {
            __m256 v = acc[r][h];
            if (L->bias) v = _mm256_add_ps(v, _mm256_maskload_ps(L->bias + n0, mask));
            float* dst = y + (size_t)(m0 + r) * ldy + n0;
            if (cnt >= 8) _mm256_storeu_ps(dst, v);
            else _mm256_maskstore_ps(dst, mask, v);
        }
    }
}

// The int8 head: signed weights w = byte - 128 (the layout's +128 undone), |w| <= 128 unsigned times
// sign(x, w) (|x| <= 127): w x exactly, a pair at most 32,512, no int16 saturation; `vpmaddwd` by ones each
// word. The exact int32 per 32 inputs of the AVX-512 path (its - 128 x block sum done here in the bytes).
template <int R, int NH>
static inline void q8_tile(const Lin* L, int nb, int h0, const Act* a, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64;
    const uint8_t* wq = L->q + (size_t)nb * nc * 1024 + 32 * h0;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[R][NH];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH; h++) acc[r][h] = _mm256_setzero_ps();
    for (int ci = 0; ci < nc; ci++) {
        const uint8_t* w = wq + (size_t)ci * 1024;
        for (int half = 0; half < 2; half++) {
            __m256i ib[R][NH];
            for (int r = 0; r < R; r++)
                for (int h = 0; h < NH; h++) ib[r][h] = _mm256_setzero_si256();
            for (int t0 = 0; t0 < 8; t0 += 2)  // unrolled whole, GCC kept every product on the stack to sum later
                for (int t = t0; t < t0 + 2; t++) {
                    __m256i ws[NH], wa[NH];
                    for (int h = 0; h < NH; h++) {
                        ws[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(w + (half * 8 + t) * 64 + 32 * h)), flip);
                        wa[h] = _mm256_abs_epi8(ws[h]);
                    }
                    for (int r = 0; r < R; r++) {
                        const __m256i x = _mm256_set1_epi32(load_i32(a->q + (size_t)(m0 + r) * K + ci * 64 + half * 32 + 4 * t));
                        for (int h = 0; h < NH; h++)
                            ib[r][h] = chain(_mm256_add_epi32(ib[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(x, ws[h])), ones)));
                    }
                }
            for (int r = 0; r < R; r++) {
                const size_t blk = (size_t)(m0 + r) * (K / 32) + 2 * ci + half;
                for (int h = 0; h < NH; h++)
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib[r][h]), _mm256_set1_ps(a->d[blk]), acc[r][h]);
            }
        }
    }
    for (int h = 0; h < NH; h++) {
        const int n0 = nb * 16 + 8 * (h0 + h), cnt = L->N - n0;
        if (cnt <= 0) break;
        const __m256i mask = lanes8(cnt);
        const __m256 s = _mm256_maskload_ps(L->s + n0, mask);
        for (int r = 0; r < R; r++) {
            __m256 v = _mm256_mul_ps(acc[r][h], s);
            if (L->bias) v = _mm256_add_ps(v, _mm256_maskload_ps(L->bias + n0, mask));
            float* dst = y + (size_t)(m0 + r) * ldy + n0;
            if (cnt >= 8) _mm256_storeu_ps(dst, v);
            else _mm256_maskstore_ps(dst, mask, v);
        }
    }
}

// Positions m0 .. m0 + R - 1 (R <= 8) of column block nb: one position reads both halves of each weight vector
// at once (one pass over the block's bytes, which stream from memory), more a half at a time (their sums and
// the weights stay within the 16 registers).
template <int R>
static inline void quant_tile(const Lin* L, int nb, const Act* a, int m0, float* y) {
    constexpr int NH = R == 1 ? 2 : 1;
    if constexpr (R > 4) {
        if (L->kind == W_Q8) {  // the head's int32 sums: 4 positions fill the registers
            quant_tile<4>(L, nb, a, m0, y);
            quant_tile<R - 4>(L, nb, a, m0 + 4, y);
            return;
        }
    }
    for (int h0 = 0; h0 < 2; h0 += NH) {
        if (L->kind == W_Q8) q8_tile<(R > 4 ? 4 : R), NH>(L, nb, h0, a, m0, y, L->N);
        else if (lin_block(L) == 32) q4_tile<R, 32, NH>(L, nb, h0, a, m0, y, L->N);
        else q4_tile<R, 64, NH>(L, nb, h0, a, m0, y, L->N);
    }
}

// fp32 weights: the AVX-512 path's f32_tile on two 8-lane halves of its 16 lanes (lane l sums inputs k = l mod 16
// in input order), the halves reduced by hsum16 as _mm512_reduce_add_ps reduces: its bits.
static inline __m256 load_bf16x8(const uint16_t* p) {  // 8 bf16 -> fp32, exact
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

template <int R, int C, bool BF16 = false>
static inline void f32_tile8(const Lin* L, int n0, const float* x, int m0, float* y, int ldy) {
    const int K = L->K;
    __m256 acc[R][C][2];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        __m256 w[C][2];
        for (int c = 0; c < C; c++)
            for (int u = 0; u < 2; u++)
                w[c][u] = BF16 ? load_bf16x8((const uint16_t*)L->w + (size_t)(n0 + c) * K + k + 8 * u)
                               : _mm256_loadu_ps(L->w + (size_t)(n0 + c) * K + k + 8 * u);
        for (int r = 0; r < R; r++)
            for (int u = 0; u < 2; u++) {
                const __m256 xv = _mm256_loadu_ps(x + (size_t)(m0 + r) * K + k + 8 * u);
                for (int c = 0; c < C; c++) acc[r][c][u] = _mm256_fmadd_ps(w[c][u], xv, acc[r][c][u]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = hsum16(acc[r][c][0], acc[r][c][1]);
            if (L->bias) v += L->bias[n0 + c];
            y[(size_t)(m0 + r) * ldy + n0 + c] = v;
        }
}

// F32 / BF16 weights on AVX2: tiles of 2 positions x 2 columns, each column's sum in one fixed order.
template <bool BF16>
static void float_tiles8(const Lin* L, int M, const float* x, float* y) {
    const int N = L->N, C = 4;
    const int ntiles = (N + C - 1) / C;
#pragma omp for schedule(static) PARLEY_NOWAIT
    for (int t = 0; t < ntiles; t++) {
        const int n0 = t * C;
        if (n0 + C > N) {  // ragged last columns: one at a time, the same arithmetic per column
            for (int n = n0; n < N; n++)
                for (int m = 0; m < M; m++) f32_tile8<1, 1, BF16>(L, n, x, m, y, N);
            continue;
        }
        int m = 0;
        for (; m + 2 <= M; m += 2)
            f32_tile8<2, 2, BF16>(L, n0, x, m, y, N), f32_tile8<2, 2, BF16>(L, n0 + 2, x, m, y, N);
        for (; m < M; m++) f32_tile8<1, 4, BF16>(L, n0, x, m, y, N);
    }
}
#endif

// Portable fallbacks (no AVX-512 VNNI): the same layouts and quantities, plain loops; still batch invariant.
static void q4_col_scalar(const Lin* L, int n, const Act* a, int m, float* y, int ldy) {
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, nb = n / 16, c = n % 16;
    const uint8_t* wq = L->q + (size_t)nb * nc * 512;
    const int8_t* x = a->q + (size_t)m * K;
    const int nbl = K / lin_block(L), per = 64 / lin_block(L);  // activation blocks per row, per chunk
    const float* d = a->d + (size_t)m * nbl;
    const int32_t* xs = a->xs + (size_t)m * nbl;
    float acc = 0.0f;
    for (int ci = 0; ci < nc; ci++) {
        int dot[2] = {0, 0};  // inputs 0..31 (low nibbles), 32..63 (high)
        for (int t = 0; t < 8; t++)
            for (int j = 0; j < 4; j++) {
                const uint8_t b = wq[(size_t)ci * 512 + t * 64 + 4 * c + j];
                dot[0] += (b & 15) * x[ci * 64 + 4 * t + j];
                dot[1] += (b >> 4) * x[ci * 64 + 32 + 4 * t + j];
            }
        if (per == 1) dot[0] += dot[1];
        for (int k = 0; k < per; k++) {
            const size_t i = ((size_t)nb * ng + (ci * 64 + k * 32) / G) * 16 + c;  // groups of 32: one per half
            const int b16 = 16 * (dot[k] - (int)L->z[i] * xs[per * ci + k]);  // the vector path's exact int32
            acc += (float)b16 * (d[per * ci + k] * (half_to_f32(L->s16[i]) * 0.0625f));
            if (L->m16) acc += (d[per * ci + k] * (float)xs[per * ci + k]) * half_to_f32(L->m16[i]);
        }
    }
    float v = acc;
    if (L->bias) v += L->bias[n];
    y[(size_t)m * ldy + n] = v;
}

static void q8_col_scalar(const Lin* L, int n, const Act* a, int m, float* y, int ldy) {
    const int K = L->K, nc = K / 64, nb = n / 16, c = n % 16;
    const uint8_t* wq = L->q + (size_t)nb * nc * 1024;
    const int8_t* x = a->q + (size_t)m * K;
    float acc = 0.0f;
    for (int b = 0; b < K / 32; b++) {
        int s = 0;
        for (int t = 0; t < 8; t++)
            for (int j = 0; j < 4; j++) s += ((int)wq[(size_t)(b / 2) * 1024 + ((b % 2) * 8 + t) * 64 + 4 * c + j] - 128) * x[b * 32 + 4 * t + j];
        acc += (float)s * a->d[(size_t)m * (K / 32) + b];
    }
    float v = acc * L->s[n];
    if (L->bias) v += L->bias[n];
    y[(size_t)m * ldy + n] = v;
}

static void f32_col_scalar(const Lin* L, int n, const float* x, int m, float* y, int ldy) {
    float acc = 0.0f;
    if (L->kind == W_BF16) {
        const uint16_t* w = (const uint16_t*)L->w + (size_t)n * L->K;
        for (int k = 0; k < L->K; k++) acc += bf16_to_f32(w[k]) * x[(size_t)m * L->K + k];
    } else {
        for (int k = 0; k < L->K; k++) acc += L->w[(size_t)n * L->K + k] * x[(size_t)m * L->K + k];
    }
    if (L->bias) acc += L->bias[n];
    y[(size_t)m * ldy + n] = acc;
}

#if PARLEY_VNNI
// Column blocks nb .. nb + nblocks - 1 (1 or 2) of positions m0 .. m0 + R - 1: INT4 with blocks of 64 and the
// int8 head in pair tiles (q4_pair, q8_pair) of 4 positions, or of 8 when WIDE; what is left (1-3 positions, a
// lone last block, the down projection) a block at a time.
//
// WIDE (passes of up to WIDE_PASS positions: decode verification): in a pass the weights stream from memory,
// and a pair tile of 4 positions read each pair from memory for positions 0-3 (waiting on it, with half the
// arithmetic to hide the wait) and again from L1 for 4-7 (no memory traffic to overlap). 8 positions per
// tile keep 16 float sums on the stack (a store and a reload each per 64 inputs) but read each vector once,
// which is what a pass whose weights stream from memory waits on. A prefill keeps 4, where the 8-position tile
// runs slower (docs/cpu-step.md, "Tried and not kept").
constexpr int WIDE_PASS = 32;

template <int R, bool WIDE = false>
static inline void quant_block(const Lin* L, int nb, int nblocks, const Act* a, int m0, float* y) {
    if constexpr (R >= 4) {
        if (nblocks == 2 && (L->kind == W_Q8 || lin_block(L) == 64)) {
            constexpr int RP = WIDE && R == 8 ? 8 : 4;
            if (L->kind == W_Q8) q8_pair<RP>(L, nb, a, m0, y, L->N);
            else q4_pair<RP>(L, nb, a, m0, y, L->N);
            if constexpr (R > RP) quant_block<R - RP>(L, nb, nblocks, a, m0 + RP, y);
            return;
        }
    }
    for (int b = nb; b < nb + nblocks; b++) {
        if (L->kind == W_Q4) {
            if (lin_block(L) == 32) q4_block<R, 32>(L, b, a, m0, y, L->N);
            else q4_block<R, 64>(L, b, a, m0, y, L->N);
        }
        else q8_block<R>(L, b, a, m0, y, L->N);
    }
}
#if PARLEY_AMX
// AMX: the INT4 products of 16 positions at a time as tile multiplies. One `tdpbsud` multiplies a tile of 16
// positions x 64 (or 32) signed int8 activations, read in place from the quantized rows, by a tile of the same
// inputs' unsigned weights for 16 columns, into 16 x 16 exact int32 sums: the sums the VNNI loops form per
// (position, column, activation block). The weight tile's row t holds inputs 4t .. 4t + 3 of the 16 columns,
// byte 4n + j for column n: the layout's own vectors with each nibble as 16 x its value, low nibbles in rows
// 0-7 and high in 8-15. Each sum is then stored and met by its zero point and scale in the VNNI loops' own
// vector operations, in input order, so every (position, column) gets the VNNI flavour's bits
// (tests/test_native_product_rows_equal_alone_every_kind.py; tests/test_native_portable_loops.py compares the
// two builds' logits). The int8 head stays on the VNNI loops: its sums per 32 inputs leave the tiles too little
// to do for what their epilogue costs (level at 64 positions, 8% faster at 512, 27% slower at 16).
//
// Tiles: 0, 1, 6, 7 the sums, 2-3 activations, 4-5 weights, shaped per activation block (`amx_config`). Two
// tiles of positions go together, four independent multiplies: one after another, each multiply would wait on
// the one before it (a tile's store waits for its multiply, the next activations for the tile register).

// The kernel hands the tile registers' state to a process only on request (Linux 5.16+); asked once.
static bool amx_ready() {
    static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ok;
}

// This thread's tile shapes for activation blocks of `ab` (64 or 32) inputs. Loaded at every call, not once per
// thread: other code in the process releases the tiles (oneDNN, which torch's CPU matmuls run, ends its AMX
// kernels with `tilerelease`), and a tile load after that is an illegal instruction.
static void amx_config(int ab) {
    struct alignas(64) {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } c{};
    c.palette = 1;
    for (int t : {0, 1, 6, 7}) c.rows[t] = 16, c.colsb[t] = 64;  // sums: 16 positions x 16 int32
    for (int t : {2, 3}) c.rows[t] = 16, c.colsb[t] = ab;        // activations: 16 positions x ab int8
    for (int t : {4, 5}) c.rows[t] = ab / 4, c.colsb[t] = 64;    // weights: ab / 4 rows x 16 columns x 4
    // not _tile_loadconfig: GCC 12's tells the compiler that it reads 8 bytes, and the stores of the shapes
    // are then dropped as dead (the first tile load faults as an illegal instruction)
    __asm__ volatile("ldtilecfg %0" : : "m"(c));
}

// A column block's zero point (-16 z, int16 in each lane's low half) and s / 16 for group g: q4_block's values.
static inline void amx_group(const Lin* L, int nb, int g, __m512i& zn, __m512& s_16, __m512& mn) {
    const size_t o = ((size_t)nb * (L->K / L->group) + g) * 16;
    const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(L->z + o)));
    zn = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(z, 4)), _mm512_set1_epi32(0xffff));
    s_16 = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(L->s16 + o))), _mm512_set1_ps(0.0625f));
    mn = L->m16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(L->m16 + o))) : _mm512_setzero_ps();
}

// Column block b's chunk ci of INT4 weights as a weight tile's rows: 16 x each nibble, low nibbles in rows 0-7
// (inputs 0..31), high in rows 8-15 (inputs 32..63).
static inline void amx_unpack(const Lin* L, int b, int ci, uint8_t (*wb)[64]) {
    const uint8_t* v = L->q + ((size_t)b * (L->K / 64) + ci) * 512;
    const __m512i hi = _mm512_set1_epi8((char)0xf0);
    for (int t = 0; t < 8; t++) {
        const __m512i u = _mm512_loadu_si512((const void*)(v + t * 64));
        _mm512_store_si512((void*)wb[t], _mm512_and_si512(_mm512_slli_epi16(u, 4), hi));
        _mm512_store_si512((void*)wb[8 + t], _mm512_and_si512(u, hi));
    }
}

// Which INT4 product (a constant, so that the epilogue's loops carry no tests): blocks of 64, blocks of 32,
// blocks of 32 with a minimum per group.
enum { AMX_Q4 = 0, AMX_Q4_32 = 1, AMX_Q4_32_MIN = 2 };

// Column blocks nb .. nb + nbl - 1 (1 or 2) of positions m0 .. m0 + 16 T - 1 (T <= 4 tiles: the positions of
// one work item). acc [position][16 x block] carries the float sums across chunks, as the VNNI tiles'
// registers do. Blocks of 64: each activation tile against both column blocks' weight tiles; blocks of 32 (the
// down projection, GGUF's groups of 32): a column block at a time, its two halves' weights in the two weight
// tiles.

template <int V>
static void amx_block(const Lin* L, int nb, int nbl, const Act* a, int m0, int T, float* y) {
    constexpr int ab = V == AMX_Q4 ? 64 : 32;
    const int K = L->K, nc = K / 64, G = L->group, cpg = G >= 64 ? G / 64 : 1;
    amx_config(ab);
    alignas(64) uint8_t wb[2][16][64];
    alignas(64) int32_t sums[2][2][16][16];  // [position tile of the two][column block or half][position][column]
    alignas(64) float acc[64][32];
    for (int r = 0; r < 16 * T; r++)
        for (int c = 0; c < 32; c += 16) _mm512_store_ps(acc[r] + c, _mm512_setzero_ps());
    __m512i zn[2][2];
    __m512 s_16[2][2], mn[2][2];
    auto groups = [&](int j, int ci) {  // each half's group (the same one unless groups are of 32)
        const int g0 = G == 32 ? 2 * ci : ci / cpg, g1 = G == 32 ? 2 * ci + 1 : g0;
        amx_group(L, nb + j, g0, zn[j][0], s_16[j][0], mn[j][0]);
        amx_group(L, nb + j, g1, zn[j][1], s_16[j][1], mn[j][1]);
    };
    const int8_t* x0 = a->q + (size_t)m0 * K;
    for (int ci = 0; ci < nc; ci++) {
        if constexpr (ab == 64) {
            for (int j = 0; j < nbl; j++) groups(j, ci), amx_unpack(L, nb + j, ci, wb[j]);
            _tile_loadd(4, wb[0], 64);
            if (nbl == 2) _tile_loadd(5, wb[1], 64);
            for (int p = 0; p < T; p += 2) {
                const bool two = p + 1 < T;
                _tile_loadd(2, x0 + (size_t)16 * p * K + ci * 64, K);
                if (two) _tile_loadd(3, x0 + (size_t)16 * (p + 1) * K + ci * 64, K);
                _tile_zero(0);
                _tile_dpbsud(0, 2, 4);
                if (nbl == 2) { _tile_zero(1); _tile_dpbsud(1, 2, 5); }
                if (two) { _tile_zero(6); _tile_dpbsud(6, 3, 4); }
                if (two && nbl == 2) { _tile_zero(7); _tile_dpbsud(7, 3, 5); }
                _tile_stored(0, sums[0][0], 64);
                if (nbl == 2) _tile_stored(1, sums[0][1], 64);
                if (two) _tile_stored(6, sums[1][0], 64);
                if (two && nbl == 2) _tile_stored(7, sums[1][1], 64);
                for (int u = 0; u < 1 + two; u++) {  // q4_block's blocks of 64, per position and column block
                    const size_t blk0 = (size_t)(m0 + 16 * (p + u)) * nc + ci;
                    for (int r = 0; r < 16; r++) {
                        const __m512 d = _mm512_set1_ps(a->d[blk0 + (size_t)r * nc]);
                        const __m512i xs = _mm512_set1_epi32(a->xs[blk0 + (size_t)r * nc]);
                        float* out = acc[16 * (p + u) + r];
                        for (int j = 0; j < nbl; j++) {
                            const __m512i s = _mm512_dpwssd_epi32(_mm512_load_si512((const void*)sums[u][j][r]), zn[j][0], xs);
                            _mm512_store_ps(out + 16 * j, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, s_16[j][0]),
                                                                         _mm512_load_ps(out + 16 * j)));
                        }
                    }
                }
            }
            continue;
        }
        for (int j = 0; j < nbl; j++) {
            groups(j, ci);
            amx_unpack(L, nb + j, ci, wb[0]);
            _tile_loadd(4, wb[0][0], 64);
            _tile_loadd(5, wb[0][8], 64);
            for (int p = 0; p < T; p += 2) {
                const bool two = p + 1 < T;
                const int8_t* x = x0 + (size_t)16 * p * K + ci * 64;
                _tile_loadd(2, x, K);
                if (two) _tile_loadd(3, x + (size_t)16 * K, K);
                _tile_zero(0);
                _tile_dpbsud(0, 2, 4);
                if (two) { _tile_zero(1); _tile_dpbsud(1, 3, 4); }
                _tile_loadd(2, x + 32, K);
                if (two) _tile_loadd(3, x + (size_t)16 * K + 32, K);
                _tile_zero(6);
                _tile_dpbsud(6, 2, 5);
                if (two) { _tile_zero(7); _tile_dpbsud(7, 3, 5); }
                _tile_stored(0, sums[0][0], 64);
                _tile_stored(6, sums[0][1], 64);
                if (two) { _tile_stored(1, sums[1][0], 64); _tile_stored(7, sums[1][1], 64); }
                for (int u = 0; u < 1 + two; u++)
                    for (int r = 0; r < 16; r++) {
                        const size_t blk0 = (size_t)(m0 + 16 * (p + u) + r) * 2 * nc + 2 * ci;
                        float* out = acc[16 * (p + u) + r] + 16 * j;
                        __m512 v = _mm512_load_ps(out);
                        for (int hf = 0; hf < 2; hf++) {
                            const size_t blk = blk0 + hf;
                            const __m512i t = _mm512_load_si512((const void*)sums[u][hf][r]);
                            const __m512i s = _mm512_dpwssd_epi32(t, zn[j][hf], _mm512_set1_epi32(a->xs[blk]));
                            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), s_16[j][hf]), v);
                            if constexpr (V == AMX_Q4_32_MIN) v = _mm512_fmadd_ps(_mm512_set1_ps(a->d[blk] * (float)a->xs[blk]), mn[j][hf], v);
                        }
                        _mm512_store_ps(out, v);
                    }
            }
        }
    }
    for (int j = 0; j < nbl; j++) {
        const int n0 = (nb + j) * 16, cnt = L->N - n0 < 16 ? L->N - n0 : 16;
        const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
        const __m512 bias = L->bias ? _mm512_maskz_loadu_ps(mask, L->bias + n0) : _mm512_setzero_ps();
        for (int r = 0; r < 16 * T; r++) {
            __m512 v = _mm512_load_ps(acc[r] + 16 * j);
            if (L->bias) v = _mm512_add_ps(v, bias);
            _mm512_mask_storeu_ps(y + (size_t)(m0 + r) * L->N + n0, mask, v);
        }
    }
}
#endif

#endif


// y [M][N] = x [M][K] W^T. `a` holds x quantized (Q4/Q8); `x` is read by F32 and BF16. Inside a parallel region.
template <bool BF16>
static void float_linear(const Lin* L, int M, const float* x, float* y);

static void linear(const Lin* L, int M, const float* x, const Act* a, float* y) {
    const int N = L->N;
#if PARLEY_VNNI
    if (L->kind == W_F32 || L->kind == W_BF16) {
        if (L->kind == W_BF16) float_linear<true>(L, M, x, y);
        else float_linear<false>(L, M, x, y);
        return;
    }
    {
        // Work items: (chunk of up to 64 positions, cw 16-column blocks: two for INT4 in blocks of 64 and the
        // int8 head, see q4_pair), chunk-major, so that a long pass (prefill) keeps one chunk's activations in L2 while each
        // thread's weight blocks cycle, instead of streaming all its positions' activations again for every block.
        const int cw = L->kind == W_Q8 || lin_block(L) == 64 ? 2 : 1;
        const int nbs = (N + 15) / 16, nmc = (M + 63) / 64, nun = (nbs + cw - 1) / cw;
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int t = 0; t < nmc * nun; t++) {
            const int nb = t % nun * cw, nbl = std::min(cw, nbs - nb), m1 = std::min(M, (t / nun + 1) * 64);
            int m = t / nun * 64;
#if PARLEY_AMX
            if (L->kind == W_Q4 && m1 - m >= 16 && amx_ready()) {  // tiles of 16 positions, the rest below
                const int T = (m1 - m) / 16;
                if (lin_block(L) == 64) amx_block<AMX_Q4>(L, nb, nbl, a, m, T, y);
                else if (L->m16) amx_block<AMX_Q4_32_MIN>(L, nb, nbl, a, m, T, y);
                else amx_block<AMX_Q4_32>(L, nb, nbl, a, m, T, y);
                m += (m1 - m) / 16 * 16;
            }
#endif
            for (; m < m1; m += 8) {  // tiles of up to 8 positions share each weight vector
                switch (std::min(8, m1 - m)) {
                case 1: quant_block<1>(L, nb, nbl, a, m, y); break;
                case 2: quant_block<2>(L, nb, nbl, a, m, y); break;
                case 3: quant_block<3>(L, nb, nbl, a, m, y); break;
                case 4: quant_block<4>(L, nb, nbl, a, m, y); break;
                case 5: quant_block<5>(L, nb, nbl, a, m, y); break;
                case 6: quant_block<6>(L, nb, nbl, a, m, y); break;
                case 7: quant_block<7>(L, nb, nbl, a, m, y); break;
                default:
                    if (M <= WIDE_PASS) quant_block<8, true>(L, nb, nbl, a, m, y);
                    else quant_block<8>(L, nb, nbl, a, m, y);
                    break;
                }
            }
        }
    }
#elif PARLEY_AVX2
    if (L->kind == W_BF16) float_tiles8<true>(L, M, x, y);
    else if (L->kind == W_F32) float_tiles8<false>(L, M, x, y);
    else {
        // Work items: (chunk of up to 64 positions, one 16-column block), chunk-major, as the AVX-512 path's.
        const int nbs = (N + 15) / 16, nmc = (M + 63) / 64;
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int t = 0; t < nmc * nbs; t++) {
            const int nb = t % nbs, m1 = std::min(M, (t / nbs + 1) * 64);
            for (int m = t / nbs * 64; m < m1; m += 8) {  // tiles of up to 8 positions share each weight vector
                switch (std::min(8, m1 - m)) {
                case 1: quant_tile<1>(L, nb, a, m, y); break;
                case 2: quant_tile<2>(L, nb, a, m, y); break;
                case 3: quant_tile<3>(L, nb, a, m, y); break;
                case 4: quant_tile<4>(L, nb, a, m, y); break;
                case 5: quant_tile<5>(L, nb, a, m, y); break;
                case 6: quant_tile<6>(L, nb, a, m, y); break;
                case 7: quant_tile<7>(L, nb, a, m, y); break;
                default: quant_tile<8>(L, nb, a, m, y); break;
                }
            }
        }
    }
#else
#pragma omp for schedule(static) PARLEY_NOWAIT
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++) {
            if (L->kind == W_Q4) q4_col_scalar(L, n, a, m, y, N);
            else if (L->kind == W_Q8) q8_col_scalar(L, n, a, m, y, N);
            else f32_col_scalar(L, n, x, m, y, N);
        }
#endif
}

#if PARLEY_VNNI
// F32 / BF16 weights: tiles of 4 positions x 4 columns, each column's sum in one fixed order (16 lanes, then
// the lanes' sum), so a position's outputs do not depend on the pass.
template <bool BF16>
static void float_linear(const Lin* L, int M, const float* x, float* y) {
    const int N = L->N, C = 4;
    const int ntiles = (N + C - 1) / C;
#pragma omp for schedule(static) PARLEY_NOWAIT
    for (int t = 0; t < ntiles; t++) {
        const int n0 = t * C;
        if (n0 + C > N) {  // ragged last columns: one at a time, the same arithmetic per column
            for (int n = n0; n < N; n++)
                for (int m = 0; m < M; m++) f32_tile<1, 1, BF16>(L, n, x, m, y, N);
            continue;
        }
        int m = 0;
        for (; m + 4 <= M; m += 4) f32_tile<4, 4, BF16>(L, n0, x, m, y, N);
        for (; m < M; m++) f32_tile<1, 4, BF16>(L, n0, x, m, y, N);
    }
}
#endif

static Act new_act(int M, int maxK) {
    Act a;
    a.q = (int8_t*)scratch((size_t)M * maxK);
    a.d = (float*)scratch((size_t)M * (maxK / 32) * 4);
    a.xs = (int32_t*)scratch((size_t)M * (maxK / 32) * 4);
    return a;
}

static void free_act(Act* a) {
    std::free(a->q);
    std::free(a->d);
    std::free(a->xs);
}
