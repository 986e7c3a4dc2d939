// Row operations of a pass, each position's row computed on its own: RMSNorm (one row, or up to 8 rows side by
// side with the same bits), the gated MLP activations on the gate/up product (SiLU, tanh-GELU), the Hadamard
// rotation of the down projection's input, and rotary embedding. A row's result never depends on the pass.

#pragma once
#include "simd.h"

// Sum of squares in one fixed order, the same for every row and every pass: 8 lanes, lane j the serial double sum
// of x[i]^2 over i = j mod 8 (each square rounded, then added: no fused multiply-add), the lanes then added as
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)). Why lanes and not one serial sum: a decode pass norms one row, and one
// chain of n dependent adds (~4 us at n = 4096) held the other threads at the norm's barrier twice a layer.
static inline double lanes_sum(const double* l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// The lanes of rows r0..r0+nr-1 (nr <= 8) of n, advancing side by side; each row's own lanes in ss[r][0..7].
static void square_lanes(const float* x, int nr, int n, double (*ss)[8]) {
    const int nv = n / 8 * 8;
#if PARLEY_VNNI
    __m512d acc[8];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_pd();
    for (int i = 0; i < nv; i += 8)
        for (int r = 0; r < nr; r++) {
            const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + (size_t)r * n + i));
            acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(v, v));
        }
    for (int r = 0; r < nr; r++) _mm512_storeu_pd(ss[r], acc[r]);
#elif PARLEY_AVX2
    __m256d acc[8][2];
    for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_pd();
    for (int i = 0; i < nv; i += 8)
        for (int r = 0; r < nr; r++)
            for (int h = 0; h < 2; h++) {
                const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + (size_t)r * n + i + 4 * h));
                acc[r][h] = _mm256_add_pd(acc[r][h], _mm256_mul_pd(v, v));
            }
    for (int r = 0; r < nr; r++) _mm256_storeu_pd(ss[r], acc[r][0]), _mm256_storeu_pd(ss[r] + 4, acc[r][1]);
#else
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 8; j++) ss[r][j] = 0.0;
    for (int i = 0; i < nv; i++)
        for (int r = 0; r < nr; r++) {
            const double v = x[(size_t)r * n + i];
            ss[r][i % 8] += v * v;
        }
#endif
    for (int i = nv; i < n; i++)  // a ragged end: the same lanes, still in order
        for (int r = 0; r < nr; r++) {
            const double v = x[(size_t)r * n + i];
            ss[r][i % 8] += v * v;
        }
}

// RMSNorm of up to 8 consecutive rows of n (x and out row r at r * n; out may be x); each row's bits do not depend
// on how many rows are normed together.
static void rmsnorm_rows(const float* x, const float* w, float* out, int nr, int n, float eps) {
    double ss[8][8];
    square_lanes(x, nr, n, ss);
    for (int r = 0; r < nr; r++) {
        const float rr = 1.0f / std::sqrt((float)(lanes_sum(ss[r]) / n) + eps);
        for (int i = 0; i < n; i++) out[(size_t)r * n + i] = w[i] * (x[(size_t)r * n + i] * rr);
    }
}

static void rmsnorm_row(const float* x, const float* w, float* out, int n, float eps) {
    rmsnorm_rows(x, w, out, 1, n, eps);
}

// out[j] = silu(gate[j]) * up[j] from the gate/up product: interleaved by 16 columns, or (`split`) the gate's I
// columns then the up's. Columns j0 .. j1 - 1 only (multiples of 16; all of them by default): each column's value
// is its own, so a row split into ranges over the threads gives the same bits.
static void silu_mul_row(const float* r, int I, float* out, bool split, int j0 = 0, int j1 = -1) {
    if (j1 < 0) j1 = I;
#if PARLEY_VNNI
    for (int b = j0 / 16; b < j1 / 16; b++) {
        const float* gp = split ? r + b * 16 : r + b * 32;
        const float* up = split ? r + I + b * 16 : r + b * 32 + 16;
        __m512 g = _mm512_loadu_ps(gp), u = _mm512_loadu_ps(up);
        __m512 e = exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(87.0f)));
        __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + b * 16, _mm512_mul_ps(sg, u));
    }
#elif PARLEY_AVX2  // the same values, lane by lane
    for (int b = j0 / 16; b < j1 / 16; b++)
        for (int h = 0; h < 2; h++) {
            const float* gp = (split ? r + b * 16 : r + b * 32) + 8 * h;
            const float* up = (split ? r + I + b * 16 : r + b * 32 + 16) + 8 * h;
            const __m256 g = _mm256_loadu_ps(gp), u = _mm256_loadu_ps(up);
            const __m256 e = exp256(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(87.0f)));
            const __m256 sg = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(out + b * 16 + 8 * h, _mm256_mul_ps(sg, u));
        }
#else
    for (int j = j0; j < j1; j++) {
        const int blk = j / 16, off = j % 16;
        float g = split ? r[j] : r[blk * 32 + off], u = split ? r[I + j] : r[blk * 32 + 16 + off];
        float e = exp_scalar(std::fmin(-g, 87.0f));
        out[j] = g / (1.0f + e) * u;
    }
#endif
}

// out[j] = gelu_tanh(gate[j]) * up[j] (Gemma's GeGLU), same layouts; PyTorch's tanh approximation.
static void gelu_mul_row(const float* r, int I, float* out, bool split, int j0 = 0, int j1 = -1) {
    if (j1 < 0) j1 = I;
    for (int j = j0; j < j1; j++) {
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
