// Row operations of a pass, each position's row computed on its own: RMSNorm (one row, or up to 8 rows side by
// side with the same bits), the gated MLP activations on the gate/up product (SiLU, tanh-GELU), the Hadamard
// rotation of the down projection's input, and rotary embedding. A row's result never depends on the pass.

#pragma once
#include "simd.h"

static void rmsnorm_row(const float* x, const float* w, float* out, int n, float eps) {
    double ss = 0.0;  // a fixed serial order: the same for every row and every pass
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / std::sqrt((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

// rmsnorm_row of up to 8 consecutive rows of n (x and out row r at r * n; out may be x), bit for bit: each row's
// sum of squares is the same serial double sum, but the rows' sums advance side by side (AVX-512: lane r of one
// vector is row r's sum, 8 inputs of 8 rows transposed per step), so a long pass waits on one chain of n dependent
// adds per 8 rows instead of per row.
static void rmsnorm_rows(const float* x, const float* w, float* out, int nr, int n, float eps) {
    double ss[8] = {};
#if PARLEY_VNNI
    if (nr == 8 && n % 8 == 0) {
        __m512d acc = _mm512_setzero_pd();
        for (int i = 0; i < n; i += 8) {
            __m512d r[8], t[8], u[8];
            for (int k = 0; k < 8; k++) r[k] = _mm512_cvtps_pd(_mm256_loadu_ps(x + (size_t)k * n + i));
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm512_unpacklo_pd(r[k], r[k + 1]);
                t[k + 1] = _mm512_unpackhi_pd(r[k], r[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) {  // u[k..k+3]: inputs {0, 4}, {2, 6}, {1, 5}, {3, 7} of rows k..k+3
                u[k] = _mm512_shuffle_f64x2(t[k], t[k + 2], 0x88);
                u[k + 1] = _mm512_shuffle_f64x2(t[k], t[k + 2], 0xdd);
                u[k + 2] = _mm512_shuffle_f64x2(t[k + 1], t[k + 3], 0x88);
                u[k + 3] = _mm512_shuffle_f64x2(t[k + 1], t[k + 3], 0xdd);
            }
            const __m512d c[8] = {  // c[j] lane r: input i + j of row r
                _mm512_shuffle_f64x2(u[0], u[4], 0x88), _mm512_shuffle_f64x2(u[2], u[6], 0x88),
                _mm512_shuffle_f64x2(u[1], u[5], 0x88), _mm512_shuffle_f64x2(u[3], u[7], 0x88),
                _mm512_shuffle_f64x2(u[0], u[4], 0xdd), _mm512_shuffle_f64x2(u[2], u[6], 0xdd),
                _mm512_shuffle_f64x2(u[1], u[5], 0xdd), _mm512_shuffle_f64x2(u[3], u[7], 0xdd)};
            for (int j = 0; j < 8; j++) acc = _mm512_add_pd(acc, _mm512_mul_pd(c[j], c[j]));
        }
        _mm512_storeu_pd(ss, acc);
    } else
#elif PARLEY_AVX2
    if (nr >= 4 && n % 4 == 0) {
        // groups of 4 rows, lane r of a double vector row r's sum (4 inputs of 4 rows transposed per step); two
        // groups side by side when there are 8 rows; rows past the last group of 4 in the loop below
        const int ng = nr / 4;
        __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
        for (int i = 0; i < n; i += 4)
            for (int gi = 0; gi < ng; gi++) {
                __m256d r[4];
                for (int k = 0; k < 4; k++) r[k] = _mm256_cvtps_pd(_mm_loadu_ps(x + (size_t)(4 * gi + k) * n + i));
                const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
                const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
                const __m256d c[4] = {_mm256_permute2f128_pd(t0, t2, 0x20), _mm256_permute2f128_pd(t1, t3, 0x20),
                                      _mm256_permute2f128_pd(t0, t2, 0x31), _mm256_permute2f128_pd(t1, t3, 0x31)};
                for (int j = 0; j < 4; j++) acc[gi] = _mm256_add_pd(acc[gi], _mm256_mul_pd(c[j], c[j]));
            }
        for (int gi = 0; gi < ng; gi++) _mm256_storeu_pd(ss + 4 * gi, acc[gi]);
        for (int i = 0; i < n; i++)
            for (int r = 4 * ng; r < nr; r++) ss[r] += (double)x[(size_t)r * n + i] * x[(size_t)r * n + i];
    } else
#endif
    {
        for (int i = 0; i < n; i++)
            for (int r = 0; r < nr; r++) ss[r] += (double)x[(size_t)r * n + i] * x[(size_t)r * n + i];
    }
    for (int r = 0; r < nr; r++) {
        const float rr = 1.0f / std::sqrt((float)(ss[r] / n) + eps);
        for (int i = 0; i < n; i++) out[(size_t)r * n + i] = w[i] * (x[(size_t)r * n + i] * rr);
    }
}

// out[j] = silu(gate[j]) * up[j] from the gate/up product: interleaved by 16 columns, or (`split`) the gate's I
// columns then the up's.
static void silu_mul_row(const float* r, int I, float* out, bool split) {
#if PARLEY_VNNI
    for (int b = 0; b < I / 16; b++) {
        const float* gp = split ? r + b * 16 : r + b * 32;
        const float* up = split ? r + I + b * 16 : r + b * 32 + 16;
        __m512 g = _mm512_loadu_ps(gp), u = _mm512_loadu_ps(up);
        __m512 e = exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(87.0f)));
        __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + b * 16, _mm512_mul_ps(sg, u));
    }
#elif PARLEY_AVX2  // the same values, lane by lane
    for (int b = 0; b < I / 16; b++)
        for (int h = 0; h < 2; h++) {
            const float* gp = (split ? r + b * 16 : r + b * 32) + 8 * h;
            const float* up = (split ? r + I + b * 16 : r + b * 32 + 16) + 8 * h;
            const __m256 g = _mm256_loadu_ps(gp), u = _mm256_loadu_ps(up);
            const __m256 e = exp256(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(87.0f)));
            const __m256 sg = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(out + b * 16 + 8 * h, _mm256_mul_ps(sg, u));
        }
#else
    for (int j = 0; j < I; j++) {
        const int blk = j / 16, off = j % 16;
        float g = split ? r[j] : r[blk * 32 + off], u = split ? r[I + j] : r[blk * 32 + 16 + off];
        float e = exp_scalar(std::fmin(-g, 87.0f));
        out[j] = g / (1.0f + e) * u;
    }
#endif
}

// out[j] = gelu_tanh(gate[j]) * up[j] (Gemma's GeGLU), same layouts; PyTorch's tanh approximation.
static void gelu_mul_row(const float* r, int I, float* out, bool split) {
    for (int j = 0; j < I; j++) {
        const int blk = j / 16, off = j % 16;
        const float g = split ? r[j] : r[blk * 32 + off], u = split ? r[I + j] : r[blk * 32 + 16 + off];
        const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[j] = 0.5f * g * (1.0f + std::tanh(inner)) * u;
    }
}

// x[j] *= diag[j], then the fast Walsh-Hadamard transform of each block of `block` (a power of two) in place,
// butterflies in the order of MLP.forward's `block_hadamard` (same additions, so the same bits).
#if PARLEY_VNNI
// One block of 16 * NV floats held in NV registers: the butterflies of h < 16 within each vector (lane l pairs
// with l ^ h: a + b below, a - b above), then those of h = 16, 32, ... between vectors; one load and one store.
template <int NV>
static void hadamard_block(float* x, const float* diag) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 v[NV];
#pragma GCC unroll 16
    for (int t = 0; t < NV; t++) {
        v[t] = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * t), _mm512_loadu_ps(diag + 16 * t));
#pragma GCC unroll 4
        for (int h = 1; h < 16; h *= 2) {
            const __m512i hv = _mm512_set1_epi32(h);
            const __m512 p = _mm512_permutexvar_ps(_mm512_xor_si512(lane, hv), v[t]);
            v[t] = _mm512_mask_blend_ps(_mm512_test_epi32_mask(lane, hv), _mm512_add_ps(v[t], p), _mm512_sub_ps(p, v[t]));
        }
    }
#pragma GCC unroll 4
    for (int h = 1; h < NV; h *= 2)
#pragma GCC unroll 16
        for (int t = 0; t < NV; t++)
            if (!(t & h)) {
                const __m512 a = v[t], b = v[t + h];
                v[t] = _mm512_add_ps(a, b);
                v[t + h] = _mm512_sub_ps(a, b);
            }
#pragma GCC unroll 16
    for (int t = 0; t < NV; t++) _mm512_storeu_ps(x + 16 * t, v[t]);
}
#endif

static void hadamard_row(float* x, int n, const float* diag, int block) {
#if PARLEY_VNNI
    if (block >= 16 && block <= 256) {  // n % 16 == 0 (the step's intermediate size)
        for (int b = 0; b < n; b += block) {
            switch (block) {
                case 16: hadamard_block<1>(x + b, diag + b); break;
                case 32: hadamard_block<2>(x + b, diag + b); break;
                case 64: hadamard_block<4>(x + b, diag + b); break;
                case 128: hadamard_block<8>(x + b, diag + b); break;
                default: hadamard_block<16>(x + b, diag + b); break;
            }
        }
        return;
    }
#elif PARLEY_AVX2
    if (block >= 8 && n % 8 == 0) {
        // the butterflies of h = 1, 2, 4 within each vector of 8 (a + b below, a - b above, as the loops below),
        // then those of h >= 8 between vectors: the same additions
        for (int j = 0; j < n; j += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(diag + j));
            __m256 p = _mm256_permute_ps(v, 0xb1);
            v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xaa);
            p = _mm256_permute_ps(v, 0x4e);
            v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xcc);
            p = _mm256_permute2f128_ps(v, v, 0x01);
            v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xf0);
            _mm256_storeu_ps(x + j, v);
        }
        for (int h = 8; h < block; h *= 2)
            for (int i = 0; i < n; i += 2 * h)
                for (int j = i; j < i + h; j += 8) {
                    const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                    _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                    _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
                }
        return;
    }
#endif
    for (int j = 0; j < n; j++) x[j] *= diag[j];
    for (int h = 1; h < block; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

static void rope_row(float* x, int D, const float* cos, const float* sin) {  // halves layout, as HF
    const int h = D / 2;
    int i = 0;
#if PARLEY_AVX2  // the same products and sums, 8 at a time
    for (; i + 8 <= h; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + h);
        const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
        _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(x + i + h, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
    }
#endif
    for (; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i] + a * sin[i];
    }
}
