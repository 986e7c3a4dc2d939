// The whole forward pass of a llama-family decoder on the CPU, for any number of positions at once.
//
// Why one native step: a decode token of a 135M model is ~85 MB of weights, a few milliseconds at memory
// speed, while an eager PyTorch step spends about as long again on ~1,000 small op launches. Here a step is
// one call: INT4 weights times 8-bit activations with integer dot products (AVX-512 VNNI where the CPU has
// it), attention read straight from the cache in its stored form (fp32, bf16, int8 or int8-K/int4-V), and
// OpenMP threads across output columns / heads.
//
// Batch invariance by construction: every per-position quantity (activation quantization, each output
// column's dot product, each head's attention row) is computed by the same sequence of operations whether
// the pass holds 1 position or 512, and whichever thread computes it. Tiles over positions only reuse
// loaded weights; they never reorder a position's arithmetic. So a position's logits are bitwise the same
// in a decode pass, a verification pass or a prefill chunk. Build with -ffp-contract=off.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define PARLEY_VNNI 1
#else
#define PARLEY_VNNI 0
#endif

enum { W_Q4 = 0, W_F32 = 1, W_Q8 = 2 };
enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2, KV_K8V4 = 3 };

// A linear layer y = x W^T (+ bias). Q4: q [N][K/64][32] bytes, byte j of a 64-chunk holds k = j (low
// nibble) and k = j + 32 (high nibble); w = q * s[n][g] + m[n][g] per group of `group` inputs.
// F32: w [N][K]. Q8 (output head): w8 [N][K] int8 stored + 128 as uint8, one scale per row in s.
struct Lin {
    int32_t kind, N, K, group;
    const uint8_t* q;
    const float* s;
    const float* m;
    const float* w;
    const float* bias;
};

struct Layer {
    const float* attn_norm;  // [dim]
    const float* ffn_norm;   // [dim]
    const float* q_norm;     // [head_dim] or null (qwen3)
    const float* k_norm;
    Lin qkv;                 // fused: N = (H + 2 KVH) * D
    Lin o;                   // N = dim
    Lin gate_up;             // fused and interleaved by 16 columns: gate[16], up[16], gate[16], ...
    Lin down;
};

struct Model {
    int32_t dim, n_layers, n_heads, n_kv_heads, head_dim, inter, vocab;
    float eps;
    const float* embed;      // [vocab][dim] fp32
    const float* final_norm;
    const float* rope_cos;   // [max_pos][head_dim/2]
    const float* rope_sin;
    int32_t max_pos;
    Lin head;
    const Layer* layers;
};

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

// ---------------------------------------------------------------------------------------------------
// small helpers

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as torch does
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static void rmsnorm_row(const float* x, const float* w, float* out, int n, float eps) {
    double ss = 0.0;  // a fixed serial order: the same for every row and every pass
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / std::sqrt((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

#if PARLEY_VNNI
static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// exp for x <= 0 (softmax after subtracting the max): Cody-Waite reduction and a degree-6 polynomial,
// ~2 ulp. Deterministic and far faster than calling expf per score.
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(1.428606765330187e-06f)));
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 120));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 24));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 6));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#endif

static inline float exp_scalar(float x) {  // the same polynomial, one lane: used for tails
    if (x < -87.0f) x = -87.0f;
    float n = std::nearbyint(x * 1.44269504089f);
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    std::memcpy(&s, &e, 4);
    return p * s;
}

// ---------------------------------------------------------------------------------------------------
// activations quantized to int8 in blocks of 32, per position (what the integer dot products read)

struct Act {
    int K, G;
    int8_t* q;     // [M][K]
    float* d;      // [M][K/64][16]: each 64-chunk's two block scales, each repeated over its 8 lanes
    float* gsum;   // [M][K/G]: sum of the dequantized activations of each weight group
};

static void quantize_row(const float* x, int K, int G, int8_t* q, float* d16, float* gsum) {
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = std::fmax(amax, std::fabs(x[b * 32 + i]));
        float d = amax / 127.0f;
        float inv = d > 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            int v = (int)std::nearbyint(x[b * 32 + i] * inv);
            q[b * 32 + i] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
        }
        for (int i = 0; i < 8; i++) d16[(b >> 1) * 16 + (b & 1) * 8 + i] = d;
    }
    for (int g = 0; g < K / G; g++) {
        float s = 0.0f;
        for (int b = g * G / 32; b < (g + 1) * G / 32; b++) {
            int sum = 0;
            for (int i = 0; i < 32; i++) sum += q[b * 32 + i];
            s += d16[(b >> 1) * 16 + (b & 1) * 8] * (float)sum;
        }
        gsum[g] = s;
    }
}

static void quantize_acts(const float* x, int M, int K, int G, Act* a) {
    a->K = K;
    a->G = G;
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        quantize_row(x + (size_t)m * K, K, G, a->q + (size_t)m * K, a->d + (size_t)m * (K / 64) * 16,
                     a->gsum + (size_t)m * (K / G));
}

// ---------------------------------------------------------------------------------------------------
// INT4 x int8: R positions x C columns per tile; each (position, column) pair runs the same arithmetic

#if PARLEY_VNNI
template <int R, int C>
static inline void q4_tile(const Lin* L, int n0, const Act* a, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, cpg = G / 64;
    const __m512i lo_mask = _mm512_set1_epi8(0x0f);
    __m512 acc[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512 gacc[R][C];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) gacc[r][c] = _mm512_setzero_ps();
        for (int ci = g * cpg; ci < (g + 1) * cpg; ci++) {
            __m512i w[C];
            for (int c = 0; c < C; c++) {
                __m256i b = _mm256_loadu_si256((const __m256i*)(L->q + ((size_t)(n0 + c) * nc + ci) * 32));
                __m512i wide = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1);
                w[c] = _mm512_and_si512(wide, lo_mask);
            }
            for (int r = 0; r < R; r++) {
                const int m = m0 + r;
                __m512i x = _mm512_loadu_si512((const void*)(a->q + (size_t)m * K + ci * 64));
                __m512 d = _mm512_loadu_ps(a->d + ((size_t)m * nc + ci) * 16);
                for (int c = 0; c < C; c++) {
                    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[c], x);
                    gacc[r][c] = _mm512_add_ps(gacc[r][c], _mm512_mul_ps(_mm512_cvtepi32_ps(p), d));
                }
            }
        }
        for (int c = 0; c < C; c++) {
            __m512 s = _mm512_set1_ps(L->s[(size_t)(n0 + c) * ng + g]);
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(gacc[r][c], s));
        }
    }
    for (int r = 0; r < R; r++) {
        const int m = m0 + r;
        for (int c = 0; c < C; c++) {
            const int n = n0 + c;
            float zsum = 0.0f;
            for (int g = 0; g < ng; g++) zsum += L->m[(size_t)n * ng + g] * a->gsum[(size_t)m * ng + g];
            float v = hsum(acc[r][c]) + zsum;
            if (L->bias) v += L->bias[n];
            y[(size_t)m * ldy + n] = v;
        }
    }
}

// int8 head: the +128 offset of the stored weights is removed with the activations' block sums.
template <int R, int C>
static inline void q8_tile(const Lin* L, int n0, const Act* a, const int32_t* xsum16, int m0, float* y, int ldy) {
    const int K = L->K, nc = K / 64;
    __m512 acc[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int ci = 0; ci < nc; ci++) {
        __m512i w[C];
        for (int c = 0; c < C; c++) w[c] = _mm512_loadu_si512((const void*)(L->q + (size_t)(n0 + c) * K + ci * 64));
        for (int r = 0; r < R; r++) {
            const int m = m0 + r;
            __m512i x = _mm512_loadu_si512((const void*)(a->q + (size_t)m * K + ci * 64));
            __m512i corr = _mm512_loadu_si512((const void*)(xsum16 + ((size_t)m * nc + ci) * 16));
            __m512 d = _mm512_loadu_ps(a->d + ((size_t)m * nc + ci) * 16);
            for (int c = 0; c < C; c++) {
                __m512i p = _mm512_dpbusd_epi32(corr, w[c], x);
                acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(_mm512_cvtepi32_ps(p), d));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = hsum(acc[r][c]) * L->s[n0 + c];
            if (L->bias) v += L->bias[n0 + c];
            y[(size_t)(m0 + r) * ldy + n0 + c] = v;
        }
}

template <int R, int C>
static inline void f32_tile(const Lin* L, int n0, const float* x, int m0, float* y, int ldy) {
    const int K = L->K;
    __m512 acc[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        __m512 w[C];
        for (int c = 0; c < C; c++) w[c] = _mm512_loadu_ps(L->w + (size_t)(n0 + c) * K + k);
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)(m0 + r) * K + k);
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(w[c], xv));
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

// Portable fallbacks (no AVX-512 VNNI): same quantities, plain loops; still batch invariant.
static void q4_col_scalar(const Lin* L, int n, const Act* a, int m, float* y, int ldy) {
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, cpg = G / 64;
    float acc = 0.0f;
    for (int g = 0; g < ng; g++) {
        float gacc = 0.0f;
        for (int ci = g * cpg; ci < (g + 1) * cpg; ci++) {
            const uint8_t* wb = L->q + ((size_t)n * nc + ci) * 32;
            const int8_t* x = a->q + (size_t)m * K + ci * 64;
            int s0 = 0, s1 = 0;
            for (int j = 0; j < 32; j++) {
                s0 += (wb[j] & 15) * x[j];
                s1 += (wb[j] >> 4) * x[j + 32];
            }
            const float* d = a->d + ((size_t)m * nc + ci) * 16;
            gacc += (float)s0 * d[0] + (float)s1 * d[8];
        }
        acc += gacc * L->s[(size_t)n * ng + g];
    }
    float zsum = 0.0f;
    for (int g = 0; g < ng; g++) zsum += L->m[(size_t)n * ng + g] * a->gsum[(size_t)m * ng + g];
    float v = acc + zsum;
    if (L->bias) v += L->bias[n];
    y[(size_t)m * ldy + n] = v;
}

static void q8_col_scalar(const Lin* L, int n, const Act* a, int m, float* y, int ldy) {
    const int K = L->K, nc = K / 64;
    float acc = 0.0f;
    for (int ci = 0; ci < nc; ci++) {
        const uint8_t* wb = L->q + (size_t)n * K + ci * 64;
        const int8_t* x = a->q + (size_t)m * K + ci * 64;
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 32; j++) s0 += ((int)wb[j] - 128) * x[j];
        for (int j = 32; j < 64; j++) s1 += ((int)wb[j] - 128) * x[j];
        const float* d = a->d + ((size_t)m * nc + ci) * 16;
        acc += (float)s0 * d[0] + (float)s1 * d[8];
    }
    float v = acc * L->s[n];
    if (L->bias) v += L->bias[n];
    y[(size_t)m * ldy + n] = v;
}

static void f32_col_scalar(const Lin* L, int n, const float* x, int m, float* y, int ldy) {
    float acc = 0.0f;
    for (int k = 0; k < L->K; k++) acc += L->w[(size_t)n * L->K + k] * x[(size_t)m * L->K + k];
    if (L->bias) acc += L->bias[n];
    y[(size_t)m * ldy + n] = acc;
}

// y [M][N] = x [M][K] W^T. `a` holds x quantized (Q4/Q8); `x` is read by F32.
static void linear(const Lin* L, int M, const float* x, const Act* a, const int32_t* xsum16, float* y) {
    const int N = L->N;
#if PARLEY_VNNI
    const int C = 4;
    const int ntiles = (N + C - 1) / C;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < ntiles; t++) {
        const int n0 = t * C;
        if (n0 + C > N) {  // ragged last columns: one at a time, the same arithmetic per column
            for (int n = n0; n < N; n++)
                for (int m = 0; m < M; m++) {
                    if (L->kind == W_Q4) q4_tile<1, 1>(L, n, a, m, y, N);
                    else if (L->kind == W_Q8) q8_tile<1, 1>(L, n, a, xsum16, m, y, N);
                    else f32_tile<1, 1>(L, n, x, m, y, N);
                }
            continue;
        }
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            if (L->kind == W_Q4) q4_tile<4, 4>(L, n0, a, m, y, N);
            else if (L->kind == W_Q8) q8_tile<4, 4>(L, n0, a, xsum16, m, y, N);
            else f32_tile<4, 4>(L, n0, x, m, y, N);
        }
        for (; m < M; m++) {
            if (L->kind == W_Q4) q4_tile<1, 4>(L, n0, a, m, y, N);
            else if (L->kind == W_Q8) q8_tile<1, 4>(L, n0, a, xsum16, m, y, N);
            else f32_tile<1, 4>(L, n0, x, m, y, N);
        }
    }
#else
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++) {
            if (L->kind == W_Q4) q4_col_scalar(L, n, a, m, y, N);
            else if (L->kind == W_Q8) q8_col_scalar(L, n, a, m, y, N);
            else f32_col_scalar(L, n, x, m, y, N);
        }
#endif
}

// Per 16-lane group of a 64-chunk: 128 * (sum of the 4 activations that lane multiplies), negated: the
// starting value of the head's dot product, which cancels the +128 of the stored weights.
static void head_corrections(const Act* a, int M, int32_t* out) {
    const int K = a->K, nc = K / 64;
    for (int m = 0; m < M; m++)
        for (int ci = 0; ci < nc; ci++)
            for (int l = 0; l < 16; l++) {
                const int8_t* x = a->q + (size_t)m * K + ci * 64 + l * 4;
                out[((size_t)m * nc + ci) * 16 + l] = -128 * (x[0] + x[1] + x[2] + x[3]);
            }
}

// ---------------------------------------------------------------------------------------------------
// the KV cache: write the new positions in the stored form, then attend reading that form

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
            float amax = 0.0f;
            for (int d = 0; d < D; d++) amax = std::fmax(amax, std::fabs(src[d]));
            float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
            int8_t* dst = (int8_t*)(which ? kv->v : kv->k) + row * D;
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

// Attention of `nq` query heads sharing kv head `h`, one position: out[i] = softmax(q_i K^T * scale) V
// over slots 0..pos. Scores, max, exponentials and the weighted sum run in slot order.
static void attend(const Cache* c, const KV* kv, int h, int pos, int D, int nq, const float* q, float scale,
                   float* out, float* scores /* [nq][max_len] */, float* kbuf) {
    const int n = pos + 1;
    for (int j = 0; j < n; j++) {
        load_k(c, kv, h, j, D, kbuf);
        for (int i = 0; i < nq; i++) {
#if PARLEY_VNNI
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < D; d += 16)
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(q + i * D + d), _mm512_loadu_ps(kbuf + d)));
            scores[(size_t)i * c->max_len + j] = hsum(acc) * scale;
#else
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += q[i * D + d] * kbuf[d];
            scores[(size_t)i * c->max_len + j] = acc * scale;
#endif
        }
    }
    float inv_sum[16];
    for (int i = 0; i < nq; i++) {
        float* s = scores + (size_t)i * c->max_len;
        float mx = s[0];
        for (int j = 1; j < n; j++) mx = std::fmax(mx, s[j]);
        float sum = 0.0f;
        int j = 0;
#if PARLEY_VNNI
        __m512 vsum = _mm512_setzero_ps();
        for (; j + 16 <= n; j += 16) {
            __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(mx)));
            _mm512_storeu_ps(s + j, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        sum = hsum(vsum);
#endif
        for (; j < n; j++) {
            s[j] = exp_scalar(s[j] - mx);
            sum += s[j];
        }
        inv_sum[i] = 1.0f / sum;
    }
    for (int i = 0; i < nq * D; i++) out[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        load_v(c, kv, h, j, D, kbuf);
        for (int i = 0; i < nq; i++) {
            const float p = scores[(size_t)i * c->max_len + j];
#if PARLEY_VNNI
            for (int d = 0; d < D; d += 16) {
                __m512 o = _mm512_loadu_ps(out + i * D + d);
                _mm512_storeu_ps(out + i * D + d, _mm512_add_ps(o, _mm512_mul_ps(_mm512_set1_ps(p), _mm512_loadu_ps(kbuf + d))));
            }
#else
            for (int d = 0; d < D; d++) out[i * D + d] += p * kbuf[d];
#endif
        }
    }
    for (int i = 0; i < nq; i++)
        for (int d = 0; d < D; d++) out[i * D + d] *= inv_sum[i];
}

// out[j] = silu(gate[j]) * up[j] from the gate/up product interleaved by 16 columns.
static void silu_mul_row(const float* r, int I, float* out) {
#if PARLEY_VNNI
    for (int b = 0; b < I / 16; b++) {
        __m512 g = _mm512_loadu_ps(r + b * 32), u = _mm512_loadu_ps(r + b * 32 + 16);
        __m512 e = exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(87.0f)));
        __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + b * 16, _mm512_mul_ps(sg, u));
    }
#else
    for (int j = 0; j < I; j++) {
        const int blk = j / 16, off = j % 16;
        float g = r[blk * 32 + off], u = r[blk * 32 + 16 + off];
        float e = exp_scalar(std::fmin(-g, 87.0f));
        out[j] = g / (1.0f + e) * u;
    }
#endif
}

static void rope_row(float* x, int D, const float* cos, const float* sin) {  // halves layout, as HF
    const int h = D / 2;
    for (int i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i] + a * sin[i];
    }
}

// ---------------------------------------------------------------------------------------------------

static void* scratch(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    return p;
}

static int g_threads = 0;  // 0: OpenMP's default

// Threads for the next forward passes (0 = default); set per call because OpenMP's setting is per thread.
extern "C" int parley_threads(int n) {
    if (n >= 0) g_threads = n;
    return g_threads > 0 ? g_threads : omp_get_max_threads();
}

extern "C" int parley_has_vnni(void) { return PARLEY_VNNI; }

// One product y [M][N] = x [M][K] W^T, for tests against an independent reference.
extern "C" int parley_linear(const Lin* L, int M, const float* x, float* y) {
    if (L->K % 64) return -1;
    Act a;
    a.q = (int8_t*)scratch((size_t)M * L->K);
    a.d = (float*)scratch((size_t)M * (L->K / 64) * 16 * 4);
    a.gsum = (float*)scratch((size_t)M * (L->K / 32) * 4);
    int32_t* corr = nullptr;
    if (L->kind != W_F32) quantize_acts(x, M, L->K, L->kind == W_Q4 ? L->group : L->K, &a);
    if (L->kind == W_Q8) {
        corr = (int32_t*)scratch((size_t)M * (L->K / 64) * 16 * 4);
        head_corrections(&a, M, corr);
    }
    linear(L, M, x, &a, corr, y);
    std::free(a.q); std::free(a.d); std::free(a.gsum); std::free(corr);
    return 0;
}

// logits [M or 1][vocab] for `tokens` at `positions`; writes their K/V into `cache` (slots = positions).
// Attention of position p reads slots 0..p. `last_only`: the head for the last position only.
extern "C" int parley_forward(const Model* md, const Cache* cache, int M, const int64_t* tokens, const int64_t* positions,
                   int last_only, float* logits) {
    const int dim = md->dim, H = md->n_heads, KVH = md->n_kv_heads, D = md->head_dim, I = md->inter;
    const int QKV = (H + 2 * KVH) * D, maxK = I > dim ? I : dim;
    if (g_threads > 0) omp_set_num_threads(g_threads);
    for (int m = 0; m < M; m++)
        if (positions[m] < 0 || positions[m] >= cache->max_len || positions[m] >= md->max_pos) return -1;
    float* x = (float*)scratch((size_t)M * dim * 4);
    float* xn = (float*)scratch((size_t)M * maxK * 4);
    float* qkv = (float*)scratch((size_t)M * QKV * 4);
    float* att = (float*)scratch((size_t)M * H * D * 4);
    float* gu = (float*)scratch((size_t)M * 2 * I * 4);
    float* tmp = (float*)scratch((size_t)M * dim * 4);
    Act a;
    a.q = (int8_t*)scratch((size_t)M * maxK);
    a.d = (float*)scratch((size_t)M * (maxK / 64) * 16 * 4);
    a.gsum = (float*)scratch((size_t)M * (maxK / 32) * 4);
    const int nthreads = omp_get_max_threads();
    float* att_scores = (float*)scratch((size_t)nthreads * (H / KVH) * cache->max_len * 4);
    float* att_buf = (float*)scratch((size_t)nthreads * D * 4);
    const float scale = 1.0f / std::sqrt((float)D);

    for (int m = 0; m < M; m++) std::memcpy(x + (size_t)m * dim, md->embed + (size_t)tokens[m] * dim, dim * 4);

    for (int l = 0; l < md->n_layers; l++) {
        const Layer* L = md->layers + l;
        const KV* kv = cache->layers + l;
        for (int m = 0; m < M; m++) rmsnorm_row(x + (size_t)m * dim, L->attn_norm, xn + (size_t)m * dim, dim, md->eps);
        if (L->qkv.kind != W_F32) quantize_acts(xn, M, dim, L->qkv.group, &a);
        linear(&L->qkv, M, xn, &a, nullptr, qkv);
        // per position: q/k norm (qwen3), rotary, then the new K/V into the cache
        for (int m = 0; m < M; m++) {
            float* row = qkv + (size_t)m * QKV;
            const int p = (int)positions[m];
            const float* cs = md->rope_cos + (size_t)p * (D / 2);
            const float* sn = md->rope_sin + (size_t)p * (D / 2);
            for (int h = 0; h < H + KVH; h++) {
                float* v = row + h * D;
                if (L->q_norm) rmsnorm_row(v, h < H ? L->q_norm : L->k_norm, v, D, md->eps);
                rope_row(v, D, cs, sn);
            }
            for (int h = 0; h < KVH; h++)
                kv_write(cache, kv, h, p, D, row + (H + h) * D, row + (H + KVH + h) * D);
        }
        const int G = H / KVH;
#pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < M * KVH; t++) {
            const int m = t / KVH, h = t % KVH, tid = omp_get_thread_num();
            attend(cache, kv, h, (int)positions[m], D, G, qkv + (size_t)m * QKV + h * G * D, scale,
                   att + (size_t)m * H * D + h * G * D, att_scores + (size_t)tid * G * cache->max_len,
                   att_buf + (size_t)tid * D);
        }
        if (L->o.kind != W_F32) quantize_acts(att, M, H * D, L->o.group, &a);
        linear(&L->o, M, att, &a, nullptr, tmp);
        for (size_t i = 0; i < (size_t)M * dim; i++) x[i] += tmp[i];

        for (int m = 0; m < M; m++) rmsnorm_row(x + (size_t)m * dim, L->ffn_norm, xn + (size_t)m * dim, dim, md->eps);
        if (L->gate_up.kind != W_F32) quantize_acts(xn, M, dim, L->gate_up.group, &a);
        linear(&L->gate_up, M, xn, &a, nullptr, gu);
        // SiLU(gate) * up, undoing the 16-column interleave into xn [M][I]
        for (int m = 0; m < M; m++) silu_mul_row(gu + (size_t)m * 2 * I, I, xn + (size_t)m * I);
        if (L->down.kind != W_F32) quantize_acts(xn, M, I, L->down.group, &a);
        linear(&L->down, M, xn, &a, nullptr, tmp);
        for (size_t i = 0; i < (size_t)M * dim; i++) x[i] += tmp[i];
    }
    const int first = last_only ? M - 1 : 0, rows = M - first;
    for (int m = first; m < M; m++)
        rmsnorm_row(x + (size_t)m * dim, md->final_norm, xn + (size_t)(m - first) * dim, dim, md->eps);
    int32_t* corr = nullptr;
    if (md->head.kind == W_Q8) {
        quantize_acts(xn, rows, dim, dim, &a);
        corr = (int32_t*)scratch((size_t)rows * (dim / 64) * 16 * 4);
        head_corrections(&a, rows, corr);
    }
    linear(&md->head, rows, xn, &a, corr, logits);
    std::free(corr);
    std::free(x); std::free(xn); std::free(qkv); std::free(att); std::free(gu); std::free(tmp);
    std::free(a.q); std::free(a.d); std::free(a.gsum); std::free(att_scores); std::free(att_buf);
    return 0;
}

