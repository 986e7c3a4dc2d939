// Attention over the KV cache in its stored form: the cache kinds (fp32, bf16, int8, int8 keys with int4
// values) and the writing of a position's K/V into them; the scores, softmax and values of one block of
// ATT_BLOCK keys for the query heads of one kv head (AVX-512: int8 in int16 pair products, float in 16-lane
// trees; AVX2 the same values; portable loops), each block yielding a partial (max, sum, unnormalised weighted
// values); the blocks of several positions that share their keys (`attend_nodes`); and the merge of a
// position's partials in block order (`attend_merge`).
//
// A block's partial depends only on the position and the cache, so a position's attention is the same in any
// pass; blocks are the unit of work, so a long context splits over the threads at decode. Head dims up to 256
// run on the vector paths, up to 512 in the loops; a layer may attend a sliding window of keys.

#pragma once
#include "simd.h"

enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2, KV_K8V4 = 3 };

// One layer's cache, [KVH][L][D] per tensor. int8: value = q * scale[kvh][pos]. k8v4: V packed as bytes
// [KVH][L][D/2] (byte j: d = j low nibble, d = j + D/2 high), value = q * vs + vm per group of 32 dims.
struct KV {
    void* k;
    void* v;
    float* ks;
    float* vs;
    float* vm;
};

struct Cache {
    int32_t kind, max_len;
    const KV* layers;
};

// Key k and value v [D] of kv head `kvh` at slot `pos`, written in the cache's stored form.
static void kv_write(const Cache* c, const KV* kv, int kvh, int pos, int D, const float* k, const float* v) {
    const size_t row = ((size_t)kvh * c->max_len + pos);
    switch (c->kind) {
    case KV_F32:
        std::memcpy((float*)kv->k + row * D, k, D * 4);
        std::memcpy((float*)kv->v + row * D, v, D * 4);
        break;
    case KV_BF16:
        for (int d = 0; d < D; d++) {
            ((uint16_t*)kv->k)[row * D + d] = f32_to_bf16(k[d]);
            ((uint16_t*)kv->v)[row * D + d] = f32_to_bf16(v[d]);
        }
        break;
    default: {
        for (int which = 0; which < 2; which++) {
            const float* src = which ? v : k;
            if (which == 1 && c->kind == KV_K8V4) {
                uint8_t* dst = (uint8_t*)kv->v + row * (D / 2);
                for (int g = 0; g < D / 32; g++) {
                    float lo = src[g * 32], hi = src[g * 32];
                    for (int i = 1; i < 32; i++) {
                        lo = std::fmin(lo, src[g * 32 + i]);
                        hi = std::fmax(hi, src[g * 32 + i]);
                    }
                    float s = (hi - lo) / 15.0f, inv = s > 0 ? 1.0f / s : 0.0f;
                    kv->vs[row * (D / 32) + g] = s;
                    kv->vm[row * (D / 32) + g] = lo;
                    for (int i = 0; i < 32; i++) {
                        int d = g * 32 + i;
                        int q = (int)std::nearbyint((src[d] - lo) * inv);
                        q = q < 0 ? 0 : (q > 15 ? 15 : q);
                        if (d < D / 2) dst[d] = (uint8_t)((dst[d] & 0xf0) | q);
                        else dst[d - D / 2] = (uint8_t)((dst[d - D / 2] & 0x0f) | (q << 4));
                    }
                }
                continue;
            }
            int8_t* dst = (int8_t*)(which ? kv->v : kv->k) + row * D;
#if PARLEY_VNNI  // the same values as the loops below (as quantize_row's), without their libm std::fmax per element
            if (D % 16 == 0) {
                __m512 mv = _mm512_setzero_ps();
                for (int d = 0; d < D; d += 16) mv = _mm512_max_ps(mv, _mm512_abs_ps(_mm512_loadu_ps(src + d)));
                const float s = _mm512_reduce_max_ps(mv) / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
                for (int d = 0; d < D; d += 16) {
                    __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + d), _mm512_set1_ps(inv)));
                    qi = _mm512_max_epi32(_mm512_min_epi32(qi, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
                    _mm_storeu_si128((__m128i*)(dst + d), _mm512_cvtepi32_epi8(qi));
                }
                (which ? kv->vs : kv->ks)[row] = s;
                continue;
            }
#elif PARLEY_AVX2  // the same values again
            if (D % 32 == 0) {
                __m256 mv = _mm256_setzero_ps();
                for (int d = 0; d < D; d += 8) mv = _mm256_max_ps(mv, abs8(_mm256_loadu_ps(src + d)));
                const float s = hmax8(mv) / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
                for (int d = 0; d < D; d += 32) {
                    __m256i qi[4];
                    for (int k = 0; k < 4; k++) {
                        qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + d + 8 * k), _mm256_set1_ps(inv)));
                        qi[k] = _mm256_max_epi32(_mm256_min_epi32(qi[k], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
                    }
                    store_i8x32(dst + d, qi[0], qi[1], qi[2], qi[3]);
                }
                (which ? kv->vs : kv->ks)[row] = s;
                continue;
            }
#endif
            float amax = 0.0f;
            for (int d = 0; d < D; d++) amax = std::fmax(amax, std::fabs(src[d]));
            float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
            for (int d = 0; d < D; d++) {
                int q = (int)std::nearbyint(src[d] * inv);
                dst[d] = (int8_t)(q > 127 ? 127 : (q < -127 ? -127 : q));
            }
            (which ? kv->vs : kv->ks)[row] = s;
        }
    }
    }
}

// Key j of kv head `h` as floats.
static inline void load_k(const Cache* c, const KV* kv, int h, int j, int D, float* out) {
    const size_t row = ((size_t)h * c->max_len + j);
    switch (c->kind) {
    case KV_F32: std::memcpy(out, (const float*)kv->k + row * D, D * 4); break;
    case KV_BF16:
        for (int d = 0; d < D; d++) out[d] = bf16_to_f32(((const uint16_t*)kv->k)[row * D + d]);
        break;
    default: {
        const int8_t* q = (const int8_t*)kv->k + row * D;
        float s = kv->ks[row];
        for (int d = 0; d < D; d++) out[d] = (float)q[d] * s;
    }
    }
}

static inline void load_v(const Cache* c, const KV* kv, int h, int j, int D, float* out) {
    const size_t row = ((size_t)h * c->max_len + j);
    switch (c->kind) {
    case KV_F32: std::memcpy(out, (const float*)kv->v + row * D, D * 4); break;
    case KV_BF16:
        for (int d = 0; d < D; d++) out[d] = bf16_to_f32(((const uint16_t*)kv->v)[row * D + d]);
        break;
    case KV_INT8: {
        const int8_t* q = (const int8_t*)kv->v + row * D;
        float s = kv->vs[row];
        for (int d = 0; d < D; d++) out[d] = (float)q[d] * s;
        break;
    }
    default: {
        const uint8_t* q = (const uint8_t*)kv->v + row * (D / 2);
        const float* s = kv->vs + row * (D / 32);
        const float* mn = kv->vm + row * (D / 32);
        for (int d = 0; d < D / 2; d++) out[d] = (float)(q[d] & 15) * s[d / 32] + mn[d / 32];
        for (int d = D / 2; d < D; d++) out[d] = (float)(q[d - D / 2] >> 4) * s[d / 32] + mn[d / 32];
    }
    }
}

#if PARLEY_VNNI
// 16 dims of key/value row `row` as floats, before any per-row scale.
static inline __m512 load16(const Cache* c, const void* base, size_t row, int D, int d) {
    switch (c->kind) {
    case KV_F32: return _mm512_loadu_ps((const float*)base + row * D + d);
    case KV_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)((const uint16_t*)base + row * D + d))), 16));
    default:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)((const int8_t*)base + row * D + d))));
    }
}
#endif

// Attention is computed in blocks of ATT_BLOCK keys (slots [b*ATT_BLOCK, ...)): each block yields, per query
// head, its own softmax max, sum and unnormalised weighted sum of values; `attend_combine` merges the blocks
// in block order. The blocks are the unit of work (a long context splits across threads at decode) and
// depend only on the position, so a position's result is the same in any pass.
constexpr int ATT_BLOCK = 256;
constexpr int ATT_SCORES = 64;  // score rows of scratch a thread has: up to 8 positions x 8 query heads (G <= 8)
static_assert(ATT_BLOCK <= 512, "int16 weights x int8 values summed in int32 over a block must not overflow");

#if PARLEY_VNNI
template <bool FLOAT>
static inline __m512i add16(__m512i a, __m512i b) {
    if (FLOAT) return _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b)));
    return _mm512_add_epi32(a, b);
}

// 16 vectors -> one vector whose lane i is the sum of v[i]'s lanes: a fixed tree of shuffles and adds,
// of fp32 lanes (FLOAT) or int32 lanes (exact).
template <bool FLOAT>
static inline __m512i transpose_sum16(const __m512i* v) {
    __m512i z[4];
    for (int g = 0; g < 4; g++) {
        __m512i x[2];
        for (int h = 0; h < 2; h++) {
            __m512i a = v[g * 4 + h * 2], b = v[g * 4 + h * 2 + 1];
            x[h] = add16<FLOAT>(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        }
        z[g] = add16<FLOAT>(_mm512_unpacklo_epi64(x[0], x[1]), _mm512_unpackhi_epi64(x[0], x[1]));
    }
    __m512i s01 = add16<FLOAT>(_mm512_shuffle_i32x4(z[0], z[1], 0x88), _mm512_shuffle_i32x4(z[0], z[1], 0xdd));
    __m512i s23 = add16<FLOAT>(_mm512_shuffle_i32x4(z[2], z[3], 0x88), _mm512_shuffle_i32x4(z[2], z[3], 0xdd));
    return add16<FLOAT>(_mm512_shuffle_i32x4(s01, s23, 0x88), _mm512_shuffle_i32x4(s01, s23, 0xdd));
}
#endif

#if PARLEY_VNNI
// Calls f(std::integral_constant<int, nq>) for nq in 1..8: the per-head loops below unroll into registers.
template <class F>
static inline void dispatch_nq(int nq, F&& f) {
    switch (nq) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 5: f(std::integral_constant<int, 5>()); break;
    case 6: f(std::integral_constant<int, 6>()); break;
    case 7: f(std::integral_constant<int, 7>()); break;
    default: f(std::integral_constant<int, 8>()); break;
    }
}

// One query head (64 dims) -> int16 (round to nearest even, as nearbyint) and its scale amax / 32767.
static inline float quantize_q16(const float* q, int16_t* q16) {
    __m512 mv = _mm512_setzero_ps();
    for (int d = 0; d < 64; d += 16) mv = _mm512_max_ps(mv, _mm512_abs_ps(_mm512_loadu_ps(q + d)));
    const float amax = _mm512_reduce_max_ps(mv);
    const __m512 inv = _mm512_set1_ps(amax > 0 ? 32767.0f / amax : 0.0f);
    for (int d = 0; d < 64; d += 16)
        _mm256_storeu_si256((__m256i*)(q16 + d), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + d), inv))));
    return amax / 32767.0f;
}

// int8 keys (head_dim 64): q quantized to int16 per head (relative error 2^-16), int16 pair dot products,
// exact int32 sums, then one float scale per (head, key).
template <int NQ>
static void scores_int8(const Cache* c, const KV* kv, size_t base, int j0, int n, const float* q, float scale, float* s) {
    __m512i qlo[NQ], qhi[NQ];
    float qs[NQ];
    for (int i = 0; i < NQ; i++) {
        alignas(64) int16_t q16[64];
        qs[i] = quantize_q16(q + i * 64, q16);
        qlo[i] = _mm512_load_si512((const void*)q16);
        qhi[i] = _mm512_load_si512((const void*)(q16 + 32));
    }
    const int8_t* K8 = (const int8_t*)kv->k + (base + j0) * 64;
    for (int jb = 0; jb < n; jb += 16) {
        const int cnt = n - jb < 16 ? n - jb : 16;
        const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
        __m512i acc[NQ][16];
        for (int jj = 0; jj < 16; jj++) {
            if (jj >= cnt) {
                for (int i = 0; i < NQ; i++) acc[i][jj] = _mm512_setzero_si512();
                continue;
            }
            const int8_t* kr = K8 + (size_t)(jb + jj) * 64;
            _mm_prefetch((const char*)(kr + 16 * 64), _MM_HINT_T0);  // a row 16 keys on: past a block's end it is the next block's
            const __m512i klo = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)kr));
            const __m512i khi = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(kr + 32)));
            for (int i = 0; i < NQ; i++)
                acc[i][jj] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), klo, qlo[i]), khi, qhi[i]);
        }
        const __m512 ks = _mm512_maskz_loadu_ps(mask, kv->ks + base + j0 + jb);
        for (int i = 0; i < NQ; i++) {
            const __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(transpose_sum16<false>(acc[i])),
                                            _mm512_mul_ps(ks, _mm512_set1_ps(qs[i] * scale)));
            _mm512_mask_storeu_ps(s + (size_t)i * ATT_BLOCK + jb, mask, sc);
        }
    }
}

// int8 values (head_dim 64): the weights e_j * vs_j quantized to int16 per head and block (relative error
// 2^-16 of the block's largest), two keys per instruction (int16 pairs), exact int32 sums.
template <int NQ>
static void values_int8(const Cache* c, const KV* kv, size_t base, int j0, int n, float* s, float* part) {
    alignas(64) int16_t u[NQ][ATT_BLOCK + 32];
    float cq[NQ];
    const float* vs = kv->vs + base + j0;
    for (int i = 0; i < NQ; i++) {
        float* si = s + (size_t)i * ATT_BLOCK;
        __m512 mv = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) {
            const __mmask16 mask = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
            const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, si + j), _mm512_maskz_loadu_ps(mask, vs + j));
            _mm512_storeu_ps(si + j, w);  // s has room for whole vectors (ATT_BLOCK is a multiple of 16)
            mv = _mm512_max_ps(mv, w);
        }
        const float wmax = _mm512_reduce_max_ps(mv);
        cq[i] = wmax / 32767.0f;
        const __m512 inv = _mm512_set1_ps(wmax > 0 ? 32767.0f / wmax : 0.0f);
        for (int j = 0; j < n; j += 16) {
            const __mmask16 mask = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
            const __m512i q = _mm512_maskz_cvtps_epi32(mask, _mm512_mul_ps(_mm512_loadu_ps(si + j), inv));
            _mm256_storeu_si256((__m256i*)(u[i] + j), _mm512_cvtepi32_epi16(q));  // zero past n
        }
        u[i][n] = 0;  // an odd count pairs the last key with a zero weight
    }
    const int8_t* V8 = (const int8_t*)kv->v + (base + j0) * 64;
    __m512i acc[NQ][4];
    for (int i = 0; i < NQ; i++)
        for (int t = 0; t < 4; t++) acc[i][t] = _mm512_setzero_si512();
    for (int j = 0; j < n; j += 2) {
        const int8_t* ra = V8 + (size_t)j * 64;
        _mm_prefetch((const char*)(ra + 16 * 64), _MM_HINT_T0);
        _mm_prefetch((const char*)(ra + 17 * 64), _MM_HINT_T0);
        const __m256i* rb = (const __m256i*)(j + 1 < n ? ra + 64 : ra);  // weight 0 when past the end
        const __m512i alo = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)ra));
        const __m512i ahi = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(ra + 32)));
        const __m512i blo = _mm512_cvtepi8_epi16(_mm256_loadu_si256(rb));
        const __m512i bhi = _mm512_cvtepi8_epi16(_mm256_loadu_si256(rb + 1));
        const __m512i x[4] = {_mm512_unpacklo_epi16(alo, blo), _mm512_unpackhi_epi16(alo, blo),
                              _mm512_unpacklo_epi16(ahi, bhi), _mm512_unpackhi_epi16(ahi, bhi)};
        for (int i = 0; i < NQ; i++) {
            int32_t pair;
            std::memcpy(&pair, u[i] + j, 4);
            const __m512i w = _mm512_set1_epi32(pair);
            for (int t = 0; t < 4; t++) acc[i][t] = _mm512_dpwssd_epi32(acc[i][t], x[t], w);
        }
    }
    // lane e of x[t] holds dim 32 * (t / 2) + 8 * (e / 4) + 4 * (t % 2) + e % 4
    for (int i = 0; i < NQ; i++) {
        alignas(64) int32_t r[4][16];
        for (int t = 0; t < 4; t++) _mm512_store_si512((void*)r[t], acc[i][t]);
        float* o = part + (size_t)i * 66;
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 16; e++) o[32 * (t / 2) + 8 * (e / 4) + 4 * (t % 2) + e % 4] = (float)r[t][e] * cq[i];
    }
}
#endif

#if PARLEY_VNNI
// r[k] lane t -> r[t] lane k: a 16x16 transpose of int32 lanes.
static inline void transpose16(__m512i* r) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

// Positions of a pass that attend one key block: at most this many share each transposed key chunk.
constexpr int ATT_GROUP = 8;

// scores_int8 for the nq query heads of each of np positions (position k's at q[k]) over keys [j0, j0 + n)
// -> s[k * nq + i][j]: 16 keys in the 16 lanes (int16 pairs of dims, transposed once per 16 keys and shared
// by every query of every position), so a score needs no horizontal sum. Each score is the same exact int32
// sum as scores_int8's, scaled by the same float expression: bitwise scores_int8's, whatever np.
static void scores_int8_shared(const KV* kv, size_t base, int j0, int n, int np, int nq, const float* const* q,
                               float scale, float* s) {
    const int Q = np * nq;
    alignas(64) int32_t qp[ATT_GROUP * 8][32];  // int16 pairs of dims
    float qsc[ATT_GROUP * 8];
    for (int k = 0; k < Q; k++) {  // the quantization of scores_int8, query by query
        alignas(64) int16_t q16[64];
        qsc[k] = quantize_q16(q[k / nq] + (k % nq) * 64, q16) * scale;
        std::memcpy(qp[k], q16, 128);
    }
    for (int k = Q; k < (Q + 7) / 8 * 8; k++) std::memset(qp[k], 0, 128);
    const int8_t* K8 = (const int8_t*)kv->k + (base + j0) * 64;
    for (int jb = 0; jb < n; jb += 16) {
        const int cnt = n - jb < 16 ? n - jb : 16;
        const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
        alignas(64) __m512i T[32];  // T[t] lane k: dims 2t, 2t + 1 of key jb + k
        for (int k = 0; k < 16; k++) {
            if (k >= cnt) {
                T[k] = T[16 + k] = _mm512_setzero_si512();
                continue;
            }
            const int8_t* kr = K8 + (size_t)(jb + k) * 64;
            T[k] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)kr));
            T[16 + k] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(kr + 32)));
        }
        transpose16(T);
        transpose16(T + 16);
        const __m512 ks = _mm512_maskz_loadu_ps(mask, kv->ks + base + j0 + jb);
        // 8 queries a sweep: 8 independent chains of 32 `vpdpwssd` (enough to hide its latency), unrolled by 4
        // (rolled, the compiler copies the accumulators between registers every step).
        for (int k0 = 0; k0 < Q; k0 += 8) {
            __m512i acc[8];
            for (int u = 0; u < 8; u++) acc[u] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int t = 0; t < 32; t++) {
                const __m512i kt = T[t];
                for (int u = 0; u < 8; u++) acc[u] = _mm512_dpwssd_epi32(acc[u], _mm512_set1_epi32(qp[k0 + u][t]), kt);
            }
            for (int u = 0; u < 8 && k0 + u < Q; u++) {
                const __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[u]), _mm512_mul_ps(ks, _mm512_set1_ps(qsc[k0 + u])));
                _mm512_mask_storeu_ps(s + (size_t)(k0 + u) * ATT_BLOCK + jb, mask, sc);
            }
        }
    }
}
#endif

#if PARLEY_AVX2
// Attention on AVX2, the AVX-512 path's values: int8 keys and values in the same int16 products with exact int32
// sums (`vpmaddwd`), fp32 / bf16 keys in its 16 lanes (two 8-lane halves) summed in its transpose_sum16 tree,
// values lane by lane in key order, the softmax's sum in its 16 lanes.

// 16 dims of key/value row `row` as floats (two halves of 8), before any per-row scale: the AVX-512 load16.
static inline void load16x2(const Cache* c, const void* base, size_t row, int D, int d, __m256* out) {
    for (int u = 0; u < 2; u++) {
        const size_t i = row * D + d + 8 * u;
        switch (c->kind) {
        case KV_F32: out[u] = _mm256_loadu_ps((const float*)base + i); break;
        case KV_BF16:
            out[u] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)base + i))), 16));
            break;
        default: out[u] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)((const int8_t*)base + i))));
        }
    }
}

// transpose_sum16<true> of 8 vectors of 16 fp32 lanes (lanes 0..7 in lo[k], 8..15 in hi[k]) -> lane k: the sum
// of vector k's lanes, added as that tree adds them: within each quarter (l0 + l2) + (l1 + l3), then the quarters
// (q0 + q1) + (q2 + q3).
static inline __m256 transpose_sum16x8(const __m256* lo, const __m256* hi) {
    __m256 q[2];  // q[0]: q0 + q1 of each vector, q[1]: q2 + q3
    for (int side = 0; side < 2; side++) {
        const __m256* v = side ? hi : lo;
        __m256 z[2];  // z[g]: quarters of vectors 4g .. 4g + 3 (low 128 bits: the first quarter, high: the second)
        for (int g = 0; g < 2; g++) {
            __m256 x[2];
            for (int h = 0; h < 2; h++) {
                const __m256 a = v[g * 4 + h * 2], b = v[g * 4 + h * 2 + 1];
                x[h] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
            }
            const __m256d x0 = _mm256_castps_pd(x[0]), x1 = _mm256_castps_pd(x[1]);
            z[g] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x0, x1)), _mm256_castpd_ps(_mm256_unpackhi_pd(x0, x1)));
        }
        q[side] = _mm256_add_ps(_mm256_permute2f128_ps(z[0], z[1], 0x20), _mm256_permute2f128_ps(z[0], z[1], 0x31));
    }
    return _mm256_add_ps(q[0], q[1]);
}

// 8 vectors of int32 -> lane k: the sum of vector k's lanes (exact).
static inline __m256i transpose_sum8i(const __m256i* v) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// One query head (64 dims) -> int16, and its scale: the AVX-512 quantize_q16's values.
static inline float quantize_q16(const float* q, int16_t* q16) {
    __m256 mv = _mm256_setzero_ps();
    for (int d = 0; d < 64; d += 8) mv = _mm256_max_ps(mv, abs8(_mm256_loadu_ps(q + d)));
    const float amax = hmax8(mv);
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 32767.0f / amax : 0.0f);
    for (int d = 0; d < 64; d += 16) {
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(q + d), inv));
        const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(q + d + 8), inv));
        _mm256_storeu_si256((__m256i*)(q16 + d), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
    }
    return amax / 32767.0f;
}

// int8 keys (head_dim 64) for Q queries (int16, each with its scale times the softmax scale): the AVX-512
// scores_int8's exact int32 sums, 8 keys at a time, each key widened once for every query -> s[k][j].
static void scores_int8_q(const KV* kv, size_t base, int j0, int n, int Q, const int16_t (*q16)[64], const float* qsc,
                          float* s) {
    const int8_t* K8 = (const int8_t*)kv->k + (base + j0) * 64;
    for (int jb = 0; jb < n; jb += 8) {
        const int cnt = n - jb < 8 ? n - jb : 8;
        alignas(32) __m256i kw[8][4];  // key jb + k widened to int16, dims 16u .. 16u + 15
        for (int k = 0; k < 8; k++) {
            const int8_t* kr = K8 + (size_t)(jb + k) * 64;
            _mm_prefetch((const char*)(kr + 16 * 64), _MM_HINT_T0);  // a row 16 keys on, as the AVX-512 path
            for (int u = 0; u < 4; u++)
                kw[k][u] = k < cnt ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(kr + 16 * u))) : _mm256_setzero_si256();
        }
        const __m256i mask = lanes8(cnt);
        const __m256 ks = _mm256_maskload_ps(kv->ks + base + j0 + jb, mask);
        for (int i = 0; i < Q; i++) {
            __m256i qv[4], acc[8];
            for (int u = 0; u < 4; u++) qv[u] = _mm256_loadu_si256((const __m256i*)(q16[i] + 16 * u));
            for (int k = 0; k < 8; k++)
                acc[k] = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(kw[k][0], qv[0]), _mm256_madd_epi16(kw[k][1], qv[1])),
                                          _mm256_add_epi32(_mm256_madd_epi16(kw[k][2], qv[2]), _mm256_madd_epi16(kw[k][3], qv[3])));
            const __m256 sc = _mm256_mul_ps(_mm256_cvtepi32_ps(transpose_sum8i(acc)), _mm256_mul_ps(ks, _mm256_set1_ps(qsc[i])));
            _mm256_maskstore_ps(s + (size_t)i * ATT_BLOCK + jb, mask, sc);
        }
    }
}

static void scores_int8(const KV* kv, size_t base, int j0, int n, int nq, const float* q, float scale, float* s) {
    alignas(32) int16_t q16[8][64];
    float qsc[8];
    for (int i = 0; i < nq; i++) qsc[i] = quantize_q16(q + i * 64, q16[i]) * scale;
    scores_int8_q(kv, base, j0, n, nq, q16, qsc, s);
}

// scores_int8 for the nq query heads of each of np positions (position k's at q[k]) over keys [j0, j0 + n), the
// keys widened once for all of them: the same values, whatever np (as the AVX-512 scores_int8_shared).
constexpr int ATT_GROUP = 8;
static void scores_int8_shared(const KV* kv, size_t base, int j0, int n, int np, int nq, const float* const* q,
                               float scale, float* s) {
    alignas(32) int16_t q16[ATT_GROUP * 8][64];
    float qsc[ATT_GROUP * 8];
    for (int k = 0; k < np * nq; k++) qsc[k] = quantize_q16(q[k / nq] + (k % nq) * 64, q16[k]) * scale;
    scores_int8_q(kv, base, j0, n, np * nq, q16, qsc, s);
}

// int8 values (head_dim 64) for Q queries, query k's weights at s + k * ATT_BLOCK over keys [j0, j0 + n[k]), its
// partial at part[k]: the AVX-512 values_int8's int16 weights (zero past its keys) and exact int32 sums. Pairs of
// value rows interleaved as int16 pairs of each dim, widened once into X for all queries.
static void values_int8_q(const KV* kv, size_t base, int j0, int Q, const int* n, float* s, float* const* part) {
    int nmax = 0;
    for (int k = 0; k < Q; k++) nmax = std::max(nmax, n[k]);
    alignas(32) int16_t u[ATT_GROUP * 8][ATT_BLOCK + 32];
    float cq[ATT_GROUP * 8];
    const float* vs = kv->vs + base + j0;
    for (int k = 0; k < Q; k++) {
        const int nk = n[k];
        float* si = s + (size_t)k * ATT_BLOCK;
        __m256 mv = _mm256_setzero_ps();
        for (int j = 0; j < nk; j += 8) {
            const __m256i mask = lanes8(nk - j);
            const __m256 w = _mm256_mul_ps(_mm256_maskload_ps(si + j, mask), _mm256_maskload_ps(vs + j, mask));
            _mm256_storeu_ps(si + j, w);  // zero past nk; s has room for whole vectors
            mv = _mm256_max_ps(mv, w);
        }
        const float wmax = hmax8(mv);
        cq[k] = wmax / 32767.0f;
        const __m256 inv = _mm256_set1_ps(wmax > 0 ? 32767.0f / wmax : 0.0f);
        int j = 0;
        for (; j < nk; j += 16) {
            const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(si + j), inv));
            const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_maskload_ps(si + j + 8, lanes8(nk - j - 8)), inv));
            _mm256_storeu_si256((__m256i*)(u[k] + j), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));  // zero past nk
        }
        for (j = nk; j <= nmax; j++) u[k][j] = 0;  // and on to the longest query's keys (+1: an odd count's pair)
    }
    const int npairs = (nmax + 1) / 2;
    const int8_t* V8 = (const int8_t*)kv->v + (base + j0) * 64;
    // pair jp widened: X[jp][2v + e] lane l holds dims 16v + 4e + l + 4 (l >= 4) of keys 2jp and 2jp + 1
    auto widen = [&](int jp, int v, __m256i* x) {
        const int8_t* ra = V8 + (size_t)2 * jp * 64;
        const int8_t* rb = 2 * jp + 1 < nmax ? ra + 64 : ra;  // weight 0 when past the end
        const __m256i A = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(ra + 16 * v)));
        const __m256i B = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(rb + 16 * v)));
        x[0] = _mm256_unpacklo_epi16(A, B);
        x[1] = _mm256_unpackhi_epi16(A, B);
    };
    auto store = [&](int k, int dh, const __m256i* acc) {
        alignas(32) int32_t r[4][8];
        for (int t = 0; t < 4; t++) _mm256_store_si256((__m256i*)r[t], acc[t]);
        float* o = part[k];
        for (int t = 0; t < 4; t++) {
            const int v = 2 * dh + t / 2, e = t % 2;
            for (int l = 0; l < 8; l++) o[16 * v + 4 * e + l + (l >= 4 ? 4 : 0)] = (float)r[t][l] * cq[k];
        }
    };
    if (Q <= 3) {  // one sweep: each pair widened as it is used, 32 dims at a time
        for (int dh = 0; dh < 2; dh++) {
            __m256i acc[3][4];
            for (int i = 0; i < 3; i++)
                for (int t = 0; t < 4; t++) acc[i][t] = _mm256_setzero_si256();
            for (int jp = 0; jp < npairs; jp++) {
                if (dh == 0) {
                    _mm_prefetch((const char*)(V8 + (size_t)(2 * jp + 16) * 64), _MM_HINT_T0);
                    _mm_prefetch((const char*)(V8 + (size_t)(2 * jp + 17) * 64), _MM_HINT_T0);
                }
                __m256i x[4];
                widen(jp, 2 * dh, x);
                widen(jp, 2 * dh + 1, x + 2);
                for (int i = 0; i < 3; i++) {
                    if (i >= Q) break;
                    int32_t pair;
                    std::memcpy(&pair, u[i] + 2 * jp, 4);
                    const __m256i w = _mm256_set1_epi32(pair);
                    for (int t = 0; t < 4; t++) acc[i][t] = _mm256_add_epi32(acc[i][t], _mm256_madd_epi16(x[t], w));
                }
            }
            for (int i = 0; i < Q; i++) store(i, dh, acc[i]);
        }
        return;
    }
    alignas(32) __m256i X[ATT_BLOCK / 2][8];
    for (int jp = 0; jp < npairs; jp++) {
        _mm_prefetch((const char*)(V8 + (size_t)(2 * jp + 16) * 64), _MM_HINT_T0);
        _mm_prefetch((const char*)(V8 + (size_t)(2 * jp + 17) * 64), _MM_HINT_T0);
        for (int v = 0; v < 4; v++) widen(jp, v, X[jp] + 2 * v);
    }
    // queries in groups of up to 3, 32 dims at a time: 12 int32 sums in registers
    for (int k0 = 0; k0 < Q; k0 += 3) {
        const int qn = std::min(3, Q - k0);
        int np_g = 0;  // the group's longest keys
        for (int k = k0; k < k0 + qn; k++) np_g = std::max(np_g, (n[k] + 1) / 2);
        for (int dh = 0; dh < 2; dh++) {
            __m256i acc[3][4];
            for (int i = 0; i < 3; i++)
                for (int t = 0; t < 4; t++) acc[i][t] = _mm256_setzero_si256();
            for (int jp = 0; jp < np_g; jp++) {
                const __m256i* x = X[jp] + 4 * dh;
                for (int i = 0; i < 3; i++) {
                    if (i >= qn) break;
                    int32_t pair;
                    std::memcpy(&pair, u[k0 + i] + 2 * jp, 4);
                    const __m256i w = _mm256_set1_epi32(pair);
                    for (int t = 0; t < 4; t++) acc[i][t] = _mm256_add_epi32(acc[i][t], _mm256_madd_epi16(x[t], w));
                }
            }
            for (int i = 0; i < qn; i++) store(k0 + i, dh, acc[i]);
        }
    }
}

static void values_int8(const KV* kv, size_t base, int j0, int n, int nq, float* s, float* part) {
    int nk[8];
    float* pq[8];
    for (int i = 0; i < nq; i++) nk[i] = n, pq[i] = part + (size_t)i * 66;
    values_int8_q(kv, base, j0, nq, nk, s, pq);
}

// values_int8 for the nq heads of each of np positions that start at key j0 together (query k = head k % nq of
// position k / nq, keys [j0, j0 + n[k / nq])): the same values, whatever np (as the AVX-512 values_int8_shared).
static void values_int8_shared(const KV* kv, size_t base, int j0, int np, int nq, const int* n, float* s, float* const* part) {
    int nk[ATT_GROUP * 8];
    for (int k = 0; k < np * nq; k++) nk[k] = n[k / nq];
    values_int8_q(kv, base, j0, np * nq, nk, s, part);
}

// Scores of fp32 / bf16 keys (or int8 ones of another head_dim): the AVX-512 path's 16-lane multiply-adds per
// 16 dims and its tree, 8 keys at a time (key rows converted to floats once for every query).
static void scores_float(const Cache* c, const KV* kv, size_t base, int j0, int n, int D, int nq, const float* q,
                         float scale, float* s) {
    const bool scaled = c->kind >= KV_INT8;
    const int nd = D / 16;
    for (int jb = 0; jb < n; jb += 8) {
        const int cnt = n - jb < 8 ? n - jb : 8;
        alignas(32) __m256 lo[8][8], hi[8][8];  // [query][key]: lanes 0..7 and 8..15 of the 16-lane sums
        for (int k = 0; k < 8; k++) {
            __m256 a[8][2];
            for (int i = 0; i < nq; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
            if (k < cnt)
                for (int t = 0; t < nd; t++) {
                    __m256 kx[2];
                    load16x2(c, kv->k, base + j0 + jb + k, D, t * 16, kx);
                    for (int i = 0; i < nq; i++)
                        for (int u = 0; u < 2; u++) a[i][u] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * D + t * 16 + 8 * u), kx[u], a[i][u]);
                }
            for (int i = 0; i < nq; i++) lo[i][k] = a[i][0], hi[i][k] = a[i][1];
        }
        const __m256i mask = lanes8(cnt);
        const __m256 ks = scaled ? _mm256_maskload_ps(kv->ks + base + j0 + jb, mask) : _mm256_set1_ps(1.0f);
        for (int i = 0; i < nq; i++) {
            const __m256 sc = _mm256_mul_ps(_mm256_mul_ps(transpose_sum16x8(lo[i], hi[i]), ks), _mm256_set1_ps(scale));
            _mm256_maskstore_ps(s + (size_t)i * ATT_BLOCK + jb, mask, sc);
        }
    }
}

// Values lane by lane in key order (the AVX-512 path's multiply-adds, each dim its own lane), NV x 8 dims from
// dim d0 for queries i0 .. i0 + QN - 1. k8v4: v = q s_g + m_g per 32 dims (d0 .. d0 + 31 one group): the
// minimum's share summed per query in key order and added at the end, as there.
template <int QN, int NV>
static inline void values_float_chunk(const Cache* c, const KV* kv, size_t base, int j0, int n, int D, int i0, int d0,
                                      const float* s, float* part) {
    __m256 o[QN][NV];
    for (int i = 0; i < QN; i++)
        for (int t = 0; t < NV; t++) o[i][t] = _mm256_setzero_ps();
    if (c->kind == KV_K8V4) {
        const int g = d0 / 32;
        float msum[QN] = {};
        for (int j = 0; j < n; j++) {
            const size_t row = base + j0 + j;
            const uint8_t* vq = (const uint8_t*)kv->v + row * (D / 2);
            const float vsg = kv->vs[row * (D / 32) + g], vmg = kv->vm[row * (D / 32) + g];
            __m256 vx[NV];
            for (int t = 0; t < NV; t++) {
                const int d = d0 + 8 * t;
                const uint8_t* src = d < D / 2 ? vq + d : vq + d - D / 2;
                __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)src));
                b = d < D / 2 ? _mm256_and_si256(b, _mm256_set1_epi32(15)) : _mm256_srli_epi32(b, 4);
                vx[t] = _mm256_cvtepi32_ps(b);
            }
            for (int i = 0; i < QN; i++) {
                const float sij = s[(size_t)(i0 + i) * ATT_BLOCK + j];
                const __m256 pw = _mm256_set1_ps(sij * vsg);
                for (int t = 0; t < NV; t++) o[i][t] = _mm256_fmadd_ps(pw, vx[t], o[i][t]);
                msum[i] += sij * vmg;
            }
        }
        for (int i = 0; i < QN; i++)
            for (int t = 0; t < NV; t++) o[i][t] = _mm256_add_ps(o[i][t], _mm256_set1_ps(msum[i]));
    } else {
        for (int j = 0; j < n; j++) {
            const size_t row = base + j0 + j;
            const float vsc = c->kind == KV_INT8 ? kv->vs[row] : 1.0f;
            __m256 vx[NV];
            for (int t = 0; t < NV; t += 2) load16x2(c, kv->v, row, D, d0 + 8 * t, vx + t);
            for (int i = 0; i < QN; i++) {
                const __m256 pw = _mm256_set1_ps(s[(size_t)(i0 + i) * ATT_BLOCK + j] * vsc);
                for (int t = 0; t < NV; t++) o[i][t] = _mm256_fmadd_ps(pw, vx[t], o[i][t]);
            }
        }
    }
    for (int i = 0; i < QN; i++)
        for (int t = 0; t < NV; t++) _mm256_storeu_ps(part + (size_t)(i0 + i) * (D + 2) + d0 + 8 * t, o[i][t]);
}

static void values_float(const Cache* c, const KV* kv, size_t base, int j0, int n, int D, int nq, const float* s,
                         float* part) {
    for (int i0 = 0; i0 < nq; i0 += 3) {
        const int qn = std::min(3, nq - i0);
        for (int d0 = 0; d0 < D; d0 += 32) {
            const bool full = d0 + 32 <= D;  // else 16 dims (D % 16 == 0)
            if (qn == 3) full ? values_float_chunk<3, 4>(c, kv, base, j0, n, D, i0, d0, s, part) : values_float_chunk<3, 2>(c, kv, base, j0, n, D, i0, d0, s, part);
            else if (qn == 2) full ? values_float_chunk<2, 4>(c, kv, base, j0, n, D, i0, d0, s, part) : values_float_chunk<2, 2>(c, kv, base, j0, n, D, i0, d0, s, part);
            else full ? values_float_chunk<1, 4>(c, kv, base, j0, n, D, i0, d0, s, part) : values_float_chunk<1, 2>(c, kv, base, j0, n, D, i0, d0, s, part);
        }
    }
}
#endif

// Scaled scores of keys [j0, j1) for nq query heads -> s[i][j - j0].
static void block_scores(const Cache* c, const KV* kv, int h, int j0, int j1, int D, int nq, const float* q,
                         float scale, float* s) {
    const size_t base = (size_t)h * c->max_len;
    const int n = j1 - j0;
#if PARLEY_VNNI
    if (c->kind >= KV_INT8 && D == 64 && nq <= 8) return dispatch_nq(nq, [&](auto k) { scores_int8<decltype(k)::value>(c, kv, base, j0, n, q, scale, s); });
    if (D % 16 == 0 && D <= 256 && nq <= 8) {
        const int nd = D / 16;
        __m512 qv[8][16];
        for (int i = 0; i < nq; i++)
            for (int t = 0; t < nd; t++) qv[i][t] = _mm512_loadu_ps(q + i * D + t * 16);
        const bool scaled = c->kind >= KV_INT8;
        for (int jb = 0; jb < n; jb += 16) {
            const int cnt = n - jb < 16 ? n - jb : 16;
            const __mmask16 mask = (__mmask16)((1u << cnt) - 1);
            __m512i part[8][16];
            for (int jj = 0; jj < 16; jj++) {
                if (jj >= cnt) {
                    for (int i = 0; i < nq; i++) part[i][jj] = _mm512_setzero_si512();
                    continue;
                }
                __m512 acc[8];
                for (int i = 0; i < nq; i++) acc[i] = _mm512_setzero_ps();
                for (int t = 0; t < nd; t++) {
                    __m512 kx = load16(c, kv->k, base + j0 + jb + jj, D, t * 16);
                    for (int i = 0; i < nq; i++) acc[i] = _mm512_fmadd_ps(qv[i][t], kx, acc[i]);
                }
                for (int i = 0; i < nq; i++) part[i][jj] = _mm512_castps_si512(acc[i]);
            }
            const __m512 ks = scaled ? _mm512_maskz_loadu_ps(mask, kv->ks + base + j0 + jb) : _mm512_set1_ps(1.0f);
            for (int i = 0; i < nq; i++) {
                __m512 sc = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(transpose_sum16<true>(part[i])), ks), _mm512_set1_ps(scale));
                _mm512_mask_storeu_ps(s + (size_t)i * ATT_BLOCK + jb, mask, sc);
            }
        }
        return;
    }
#elif PARLEY_AVX2
    if (c->kind >= KV_INT8 && D == 64 && nq <= 8) return scores_int8(kv, base, j0, n, nq, q, scale, s);
    if (D % 16 == 0 && D <= 256 && nq <= 8) return scores_float(c, kv, base, j0, n, D, nq, q, scale, s);
#endif
    float kbuf[512];  // head_dim <= 512 (checked by parley_forward)
    for (int j = 0; j < n; j++) {
        load_k(c, kv, h, j0 + j, D, kbuf);
        for (int i = 0; i < nq; i++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += q[i * D + d] * kbuf[d];
            s[(size_t)i * ATT_BLOCK + j] = acc * scale;
        }
    }
}

// part[i] = {o[D], max, sum} for keys [j0, j1): o = sum_j e^{s_j - max} v_j.
static void attend_scored(const Cache* c, const KV* kv, int h, int j0, int j1, int D, int nq, float* part, float* s);

static void attend_block(const Cache* c, const KV* kv, int h, int j0, int j1, int D, int nq, const float* q,
                         float scale, float* part, float* s /* [nq][ATT_BLOCK] */) {
    block_scores(c, kv, h, j0, j1, D, nq, q, scale, s);
    attend_scored(c, kv, h, j0, j1, D, nq, part, s);
}

// The block's softmax numerators: s[i][j] <- e^{s_ij - max_i} for j < n, and part[i] = {., max_i, sum_i}.
static void block_softmax(int nq, int n, int D, float* s, float* part) {
    for (int i = 0; i < nq; i++) {
        float* si = s + (size_t)i * ATT_BLOCK;
        float mx = -INFINITY, sum = 0.0f;
        int j = 0;
#if PARLEY_VNNI
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(si + j));
        mx = _mm512_reduce_max_ps(mv);
        for (int r = j; r < n; r++) mx = std::fmax(mx, si[r]);
        __m512 vsum = _mm512_setzero_ps();
        for (j = 0; j + 16 <= n; j += 16) {
            const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(si + j), _mm512_set1_ps(mx)));
            _mm512_storeu_ps(si + j, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        sum = hsum(vsum);
#elif PARLEY_AVX2  // the AVX-512 path's 16 lanes as two halves: its max, exps and sum
        __m256 mv = _mm256_set1_ps(-INFINITY);
        for (; j + 16 <= n; j += 16) mv = _mm256_max_ps(mv, _mm256_max_ps(_mm256_loadu_ps(si + j), _mm256_loadu_ps(si + j + 8)));
        mx = hmax8(mv);
        for (int r = j; r < n; r++) mx = std::fmax(mx, si[r]);
        __m256 vsum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (j = 0; j + 16 <= n; j += 16)
            for (int u = 0; u < 2; u++) {
                const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(si + j + 8 * u), _mm256_set1_ps(mx)));
                _mm256_storeu_ps(si + j + 8 * u, e);
                vsum[u] = _mm256_add_ps(vsum[u], e);
            }
        sum = hsum16(vsum[0], vsum[1]);
#else
        for (int r = 0; r < n; r++) mx = std::fmax(mx, si[r]);
#endif
        for (; j < n; j++) {
            si[j] = exp_scalar(si[j] - mx);
            sum += si[j];
        }
        part[(size_t)i * (D + 2) + D] = mx;
        part[(size_t)i * (D + 2) + D + 1] = sum;
    }
}

// The rest of attend_block once s holds the block's scaled scores.
static void attend_scored(const Cache* c, const KV* kv, int h, int j0, int j1, int D, int nq, float* part, float* s) {
    const size_t base = (size_t)h * c->max_len;
    const int n = j1 - j0;
    block_softmax(nq, n, D, s, part);
#if PARLEY_VNNI
    if (c->kind == KV_INT8 && D == 64 && nq <= 8) return dispatch_nq(nq, [&](auto k) { values_int8<decltype(k)::value>(c, kv, base, j0, n, s, part); });
    if (D % 16 == 0 && D <= 256 && nq <= 8) {
        const int nd = D / 16;
        __m512 o[8][16];
        for (int i = 0; i < nq; i++)
            for (int t = 0; t < nd; t++) o[i][t] = _mm512_setzero_ps();
        if (c->kind == KV_K8V4) {
            // v = q * s_g + m_g per 32 dims: the minimum's share is summed per group and added at the end
            float msum[8][8] = {};
            for (int j = 0; j < n; j++) {
                const size_t row = base + j0 + j;
                const uint8_t* vq = (const uint8_t*)kv->v + row * (D / 2);
                const float* vs = kv->vs + row * (D / 32);
                const float* vm = kv->vm + row * (D / 32);
                for (int t = 0; t < nd; t++) {
                    const int d = t * 16, g = d / 32;
                    const uint8_t* src = d < D / 2 ? vq + d : vq + d - D / 2;
                    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)src));
                    b = d < D / 2 ? _mm512_and_si512(b, _mm512_set1_epi32(15)) : _mm512_srli_epi32(b, 4);
                    const __m512 vx = _mm512_cvtepi32_ps(b);
                    for (int i = 0; i < nq; i++)
                        o[i][t] = _mm512_fmadd_ps(_mm512_set1_ps(s[(size_t)i * ATT_BLOCK + j] * vs[g]), vx, o[i][t]);
                }
                for (int i = 0; i < nq; i++)
                    for (int g = 0; g < D / 32; g++) msum[i][g] += s[(size_t)i * ATT_BLOCK + j] * vm[g];
            }
            for (int i = 0; i < nq; i++)
                for (int t = 0; t < nd; t++) o[i][t] = _mm512_add_ps(o[i][t], _mm512_set1_ps(msum[i][t * 16 / 32]));
        } else {
            for (int j = 0; j < n; j++) {
                const size_t row = base + j0 + j;
                const float vsc = c->kind == KV_INT8 ? kv->vs[row] : 1.0f;
                __m512 pw[8];
                for (int i = 0; i < nq; i++) pw[i] = _mm512_set1_ps(s[(size_t)i * ATT_BLOCK + j] * vsc);
                for (int t = 0; t < nd; t++) {
                    const __m512 vx = load16(c, kv->v, row, D, t * 16);
                    for (int i = 0; i < nq; i++) o[i][t] = _mm512_fmadd_ps(pw[i], vx, o[i][t]);
                }
            }
        }
        for (int i = 0; i < nq; i++)
            for (int t = 0; t < nd; t++) _mm512_storeu_ps(part + (size_t)i * (D + 2) + t * 16, o[i][t]);
        return;
    }
#elif PARLEY_AVX2
    if (c->kind == KV_INT8 && D == 64 && nq <= 8) return values_int8(kv, base, j0, n, nq, s, part);
    if (D % 16 == 0 && D <= 256 && nq <= 8) return values_float(c, kv, base, j0, n, D, nq, s, part);
#endif
    float vbuf[512];
    for (int i = 0; i < nq; i++)
        for (int d = 0; d < D; d++) part[(size_t)i * (D + 2) + d] = 0.0f;
    for (int j = 0; j < n; j++) {
        load_v(c, kv, h, j0 + j, D, vbuf);
        for (int i = 0; i < nq; i++) {
            const float p = s[(size_t)i * ATT_BLOCK + j];
            for (int d = 0; d < D; d++) part[(size_t)i * (D + 2) + d] += p * vbuf[d];
        }
    }
}

#if PARLEY_VNNI
// QG queries' weights (int16, pairs of keys) against the widened value pairs X: out[i][t] as values_int8's acc.
template <int QG>
static inline void values_pairs(const __m512i (*X)[4], int npairs, const int16_t (*u)[ATT_BLOCK + 32], int32_t (*out)[4][16]) {
    __m512i acc[QG][4];
    for (int i = 0; i < QG; i++)
        for (int t = 0; t < 4; t++) acc[i][t] = _mm512_setzero_si512();
    for (int jp = 0; jp < npairs; jp++)
        for (int i = 0; i < QG; i++) {
            int32_t pair;
            std::memcpy(&pair, u[i] + 2 * jp, 4);
            const __m512i w = _mm512_set1_epi32(pair);
            for (int t = 0; t < 4; t++) acc[i][t] = _mm512_dpwssd_epi32(acc[i][t], X[jp][t], w);
        }
    for (int i = 0; i < QG; i++)
        for (int t = 0; t < 4; t++) _mm512_store_si512((void*)out[i][t], acc[i][t]);
}

// values_int8 for the nq heads of each of np positions that start at key j0 together (query k = head k % nq of
// position k / nq: weights at s + k * ATT_BLOCK over keys [j0, j0 + n[k / nq]), partial at part[k]): each pair
// of value rows is widened to int16 once for all of them. A query's weights are quantized as values_int8's and
// are zero past its own keys, so each output is the same exact int32 sum, scaled by the same float: bitwise
// values_int8's, whatever np.
static void values_int8_shared(const KV* kv, size_t base, int j0, int np, int nq, const int* n, float* s, float* const* part) {
    const int Q = np * nq;
    int nmax = 0;
    for (int k = 0; k < np; k++) nmax = std::max(nmax, n[k]);
    alignas(64) int16_t u[ATT_GROUP * 8][ATT_BLOCK + 32];
    float cq[ATT_GROUP * 8];
    const float* vs = kv->vs + base + j0;
    for (int k = 0; k < Q; k++) {  // values_int8's quantization of the weights, query by query
        const int nk = n[k / nq];
        float* si = s + (size_t)k * ATT_BLOCK;
        __m512 mv = _mm512_setzero_ps();
        for (int j = 0; j < nk; j += 16) {
            const __mmask16 mask = (__mmask16)(nk - j >= 16 ? 0xffff : (1u << (nk - j)) - 1);
            const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, si + j), _mm512_maskz_loadu_ps(mask, vs + j));
            _mm512_storeu_ps(si + j, w);
            mv = _mm512_max_ps(mv, w);
        }
        const float wmax = _mm512_reduce_max_ps(mv);
        cq[k] = wmax / 32767.0f;
        const __m512 inv = _mm512_set1_ps(wmax > 0 ? 32767.0f / wmax : 0.0f);
        int j = 0;
        for (; j < nk; j += 16) {
            const __mmask16 mask = (__mmask16)(nk - j >= 16 ? 0xffff : (1u << (nk - j)) - 1);
            const __m512i q = _mm512_maskz_cvtps_epi32(mask, _mm512_mul_ps(_mm512_loadu_ps(si + j), inv));
            _mm256_storeu_si256((__m256i*)(u[k] + j), _mm512_cvtepi32_epi16(q));  // zero past nk
        }
        for (; j <= nmax; j++) u[k][j] = 0;  // and on to the longest position's keys (+1: an odd count's pair)
    }
    const int npairs = (nmax + 1) / 2;
    alignas(64) __m512i X[ATT_BLOCK / 2][4];  // pair jp: rows 2jp, 2jp + 1 interleaved as int16 pairs
    const int8_t* V8 = (const int8_t*)kv->v + (base + j0) * 64;
    for (int jp = 0; jp < npairs; jp++) {
        const int8_t* ra = V8 + (size_t)2 * jp * 64;
        const __m256i* rb = (const __m256i*)(2 * jp + 1 < nmax ? ra + 64 : ra);  // weight 0 when past the end
        const __m512i alo = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)ra));
        const __m512i ahi = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(ra + 32)));
        const __m512i blo = _mm512_cvtepi8_epi16(_mm256_loadu_si256(rb));
        const __m512i bhi = _mm512_cvtepi8_epi16(_mm256_loadu_si256(rb + 1));
        X[jp][0] = _mm512_unpacklo_epi16(alo, blo);
        X[jp][1] = _mm512_unpackhi_epi16(alo, blo);
        X[jp][2] = _mm512_unpacklo_epi16(ahi, bhi);
        X[jp][3] = _mm512_unpackhi_epi16(ahi, bhi);
    }
    constexpr int QG = 6;  // queries per sweep: 24 accumulators in registers
    for (int k0 = 0; k0 < Q; k0 += QG) {
        const int qn = std::min(QG, Q - k0);
        int np_g = 0;  // the sweep's longest keys
        for (int k = k0; k < k0 + qn; k++) np_g = std::max(np_g, (n[k / nq] + 1) / 2);
        alignas(64) int32_t r[QG][4][16];
        switch (qn) {
        case 1: values_pairs<1>(X, np_g, u + k0, r); break;
        case 2: values_pairs<2>(X, np_g, u + k0, r); break;
        case 3: values_pairs<3>(X, np_g, u + k0, r); break;
        case 4: values_pairs<4>(X, np_g, u + k0, r); break;
        case 5: values_pairs<5>(X, np_g, u + k0, r); break;
        default: values_pairs<QG>(X, np_g, u + k0, r); break;
        }
        // lane e of X[.][t] holds dim 32 * (t / 2) + 8 * (e / 4) + 4 * (t % 2) + e % 4
        for (int i = 0; i < qn; i++) {
            float* o = part[k0 + i];
            for (int t = 0; t < 4; t++)
                for (int e = 0; e < 16; e++) o[32 * (t / 2) + 8 * (e / 4) + 4 * (t % 2) + e % 4] = (float)r[i][t][e] * cq[k0 + i];
        }
    }
}
#endif

// attend_scored for np positions that start at key j0 together (position k: keys [j0, j1[k]), its nq score rows
// at s + k * nq * ATT_BLOCK, its partials at part[k]): int8 values are read and widened once for all of them.
static void attend_scored_group(const Cache* c, const KV* kv, int h, int j0, int np, const int* j1, int D, int nq,
                                float* const* part, float* s) {
#if PARLEY_VNNI || PARLEY_AVX2
    if (c->kind == KV_INT8 && D == 64 && nq <= 8 && np <= ATT_GROUP) {
        int n[ATT_GROUP];
        float* pq[ATT_GROUP * 8];
        for (int k = 0; k < np; k++) {
            n[k] = j1[k] - j0;
            block_softmax(nq, n[k], D, s + (size_t)k * nq * ATT_BLOCK, part[k]);
            for (int i = 0; i < nq; i++) pq[k * nq + i] = part[k] + (size_t)i * (D + 2);
        }
        values_int8_shared(kv, (size_t)h * c->max_len, j0, np, nq, n, s, pq);
        return;
    }
#endif
    for (int k = 0; k < np; k++) attend_scored(c, kv, h, j0, j1[k], D, nq, part[k], s + (size_t)k * nq * ATT_BLOCK);
}

// out[i] = the softmax-weighted values of query head i from `nblocks` partials, merged in block order.
static void attend_combine(const float* parts, int nblocks, int nq, int D, float* out) {
    const size_t stride = (size_t)nq * (D + 2);
    for (int i = 0; i < nq; i++) {
        float gmax = -INFINITY;
        for (int b = 0; b < nblocks; b++) gmax = std::fmax(gmax, parts[b * stride + (size_t)i * (D + 2) + D]);
        float* o = out + (size_t)i * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        float sum = 0.0f;
        for (int b = 0; b < nblocks; b++) {
            const float* p = parts + b * stride + (size_t)i * (D + 2);
            const float w = exp_scalar(p[D] - gmax);
            sum += p[D + 1] * w;
            for (int d = 0; d < D; d++) o[d] += p[d] * w;
        }
        const float inv = 1.0f / sum;
        for (int d = 0; d < D; d++) o[d] *= inv;
    }
}

// The first key position p attends: p - window + 1 under a sliding window (window > 0), else 0.
static inline int first_key(int p, int window) { return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0; }

// The partials in key block b of kv head h for the nodes ms[0..nm) (ascending positions), reading the keys
// through a view: position j's row of `vkv` is vh * vc->max_len + j - shift. Consecutive nodes that start the
// block at the same key share its int8 keys.
static void attend_nodes(const Cache* vc, const KV* vkv, int vh, int shift, int h, int b, const int* ms, int nm,
                         const int64_t* positions, int KVH, int D, int G, int window, const float* q, int ldq,
                         float scale, int nblk, float* parts, float* s) {
    const size_t part_stride = (size_t)G * (D + 2);
    auto part = [&](int m) { return parts + ((size_t)m * KVH + h) * nblk * part_stride + b * part_stride; };
    for (int i = 0; i < nm; i++) {
        const int m = ms[i], p = (int)positions[m], lo = first_key(p, window);
        if (b * ATT_BLOCK > p || (b + 1) * ATT_BLOCK <= lo) continue;
#if PARLEY_VNNI || PARLEY_AVX2
        if (vc->kind >= KV_INT8 && D == 64 && G <= 8) {  // the following nodes that start here share the keys
            const int j0 = std::max(lo, b * ATT_BLOCK);
            int np = 0, n = 0, mk[ATT_GROUP], j1[ATT_GROUP];
            const float* qs[ATT_GROUP];
            for (int i2 = i; i2 < nm && np < ATT_GROUP; i2++) {
                const int m2 = ms[i2], p2 = (int)positions[m2];
                if (b * ATT_BLOCK > p2 || std::max(first_key(p2, window), b * ATT_BLOCK) != j0) break;
                mk[np] = m2;
                j1[np] = std::min(p2 + 1, (b + 1) * ATT_BLOCK);
                qs[np] = q + (size_t)m2 * ldq + h * G * D;
                n = std::max(n, j1[np++] - j0);
            }
            if (np > 1) {
                scores_int8_shared(vkv, (size_t)vh * vc->max_len, j0 - shift, n, np, G, qs, scale, s);
                float* pk[ATT_GROUP];
                for (int k = 0; k < np; k++) {
                    pk[k] = part(mk[k]);
                    j1[k] -= shift;
                }
                attend_scored_group(vc, vkv, vh, j0 - shift, np, j1, D, G, pk, s);
                i += np - 1;
                continue;
            }
        }
#endif
        attend_block(vc, vkv, vh, std::max(lo, b * ATT_BLOCK) - shift, std::min(p + 1, (b + 1) * ATT_BLOCK) - shift,
                     D, G, q + (size_t)m * ldq + h * G * D, scale, part(m), s);
    }
}

// One position's attention output [H][D] from its partials (`parts` = that position's [KVH][nblk] slots).
static void attend_merge(int KVH, int G, int D, int window, int p, int nblk, const float* parts, float* out) {
    const size_t part_stride = (size_t)G * (D + 2);
    const int b0 = first_key(p, window) / ATT_BLOCK, b1 = p / ATT_BLOCK;
    // The partials were written a whole attention step ago (a long prefill's are megabytes, past L2): ask for all
    // of this position's lines at once, before the first dependent read, so the misses overlap.
    for (int h = 0; h < KVH; h++)
        for (const char* c = (const char*)(parts + ((size_t)h * nblk + b0) * part_stride);
             c < (const char*)(parts + ((size_t)h * nblk + b1 + 1) * part_stride); c += 64)
            __builtin_prefetch(c);
    for (int h = 0; h < KVH; h++)
        attend_combine(parts + ((size_t)h * nblk + b0) * part_stride, b1 - b0 + 1, G, D, out + (size_t)h * G * D);
}
