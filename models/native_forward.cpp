// The whole forward pass of a llama-family decoder on the CPU, for any number of positions at once.
//
// Why one native step: a decode token of a 135M model is ~85 MB of weights, a few milliseconds at memory
// speed, while an eager PyTorch step spends about as long again on ~1,000 small op launches. Here a step is
// one call: INT4 weights times 8-bit activations with integer dot products (AVX-512 VNNI where the CPU has
// it, else AVX2), attention read straight from the cache in its stored form (fp32, bf16, int8 or int8-K/int4-V),
// and OpenMP threads across output columns / heads.
//
// Three flavours, by what the compiler may target (-march=native; `parley_simd` says which): AVX-512 VNNI
// (PARLEY_VNNI), AVX2 + FMA + F16C (PARLEY_AVX2: CPUs without AVX-512, most laptops) and portable loops. The
// AVX2 flavour computes the VNNI path's values bit for bit: the same exact int32 sum per activation block (its
// `vpmaddubsw` int16 pairs cannot saturate, see q4_tile), the same float operations in the same order, its
// 16-lane sums and trees on two 8-lane halves (tests/test_native_portable_loops.py compares the two builds'
// logits); a change to one's float arithmetic is a change to the other's. The portable loops compute the same
// quantities in other orders. Every flavour is batch invariant as below.
//
// Batch invariance by construction: every per-position quantity (activation quantization, each output
// column's dot product, each head's attention row) is computed by the same sequence of operations whether
// the pass holds 1 position or 512, and whichever thread computes it. Tiles over positions only reuse
// loaded weights; they never reorder a position's arithmetic. So a position's logits are bitwise the same
// in a decode pass, a verification pass or a prefill chunk. Build with -ffp-contract=off.
//
// Sections: an optional per-phase timer (-DPARLEY_PROFILE builds only); small helpers (AVX2: 8-lane sums,
// exp256); activation quantization (int8 per 64 or 32 inputs); the products (VNNI: INT4 / int8-head tiles of
// 1..8 positions x 16 columns, INT4 and int8-head pair tiles of 4 or 8 positions x 32 columns; AVX2: tiles of
// 1..8 positions (the head 1..4) x 8 columns, a 16-column block as two halves; portable loops; `linear`); the KV
// cache (writes in stored form, attention in 256-key blocks with an optional per-layer sliding window, head_dim
// up to 256 on the vector paths; AVX2: int8 scores and values in `vpmaddwd`, fp32 / bf16 / k8v4 in the VNNI
// path's float order); the rest of a pass (SiLU / GeGLU, the Hadamard rotation, rope); the entry points
// (`parley_forward`, `parley_linear` / `parley_attention` for tests against independent references, and
// `parley_read_gbs`, the bandwidth probe of `parley bench decode`).
#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <omp.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define PARLEY_VNNI 1
#define PARLEY_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PARLEY_VNNI 0
#define PARLEY_AVX2 1
#else
#define PARLEY_VNNI 0
#define PARLEY_AVX2 0
#endif

// Optional per-phase timer, for finding where a pass's threads wait (build with PARLEY_NATIVE_FLAGS=-DPARLEY_PROFILE;
// never in the shipped build, where both macros below are empty). Each `omp for` of a pass then drops its
// implicit barrier (PARLEY_NOWAIT) and the phase ends in `prof_phase`: the thread's time since its previous
// phase ended counts as that phase's work, its time in the barrier as its wait. `parley_profile` reads and
// resets the sums (seconds per thread and phase; app/bench/passes.py --profile prints them).
enum { PH_NORM, PH_QKV, PH_ROPE, PH_ATTEND, PH_MERGE, PH_O, PH_NORM2, PH_GATE_UP, PH_SILU, PH_DOWN, PH_POST,
       PH_HEAD_QUANT, PH_HEAD, PH_COUNT };
#ifdef PARLEY_PROFILE
#define PARLEY_NOWAIT nowait
constexpr int PROF_THREADS = 16;
static double g_prof[PROF_THREADS][PH_COUNT][2];  // [thread][phase]: work, wait (seconds)
static thread_local double t_prof_last;
static inline double prof_now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline void prof_start() { t_prof_last = prof_now(); }
static inline void prof_phase(int ph) {
    const double t0 = prof_now();
#pragma omp barrier
    const double t1 = prof_now();
    const int th = omp_get_thread_num();
    if (th < PROF_THREADS) g_prof[th][ph][0] += t0 - t_prof_last, g_prof[th][ph][1] += t1 - t0;
    t_prof_last = t1;
}
#else
#define PARLEY_NOWAIT
static inline void prof_start() {}
static inline void prof_phase(int) {}
#endif

enum { W_Q4 = 0, W_F32 = 1, W_Q8 = 2, W_BF16 = 3 };
enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2, KV_K8V4 = 3 };

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

struct Layer {
    const float* attn_norm;  // [dim]
    const float* ffn_norm;   // [dim]
    const float* q_norm;     // [head_dim] or null (qwen3)
    const float* k_norm;
    Lin qkv;                 // fused: N = (H + 2 KVH) * D
    Lin o;                   // N = dim
    Lin gate_up;             // fused and interleaved by 16 columns: gate[16], up[16], gate[16], ...
    Lin down;
    int32_t window;          // 0: global attention; else position p attends to keys j with p - window < j <= p
    // Gemma 3 (null / unused elsewhere):
    const float* post_attn_norm;  // [dim]: norms the attention output before the residual add
    const float* post_ffn_norm;   // [dim]: norms the MLP output before the residual add
    const float* rope_cos;        // [max_pos][head_dim/2]: this layer's own table (sliding layers), or null
    const float* rope_sin;
    // An online rotation of the down projection's input (models/quantize/hadamard.py), or null: each product
    // row times diag(down_diag), then the unnormalised Hadamard transform of each block of down_block.
    const float* down_diag;  // [inter]
    int32_t down_block;
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
    float embed_scale;       // embeddings times this (Gemma: sqrt(dim)); 0: not scaled
    float attn_scale;        // softmax scale of q.k; 0: 1/sqrt(head_dim)
    int32_t act;             // the MLP's gate activation: 0 SiLU (SwiGLU), 1 tanh-approximated GELU (GeGLU)
    int32_t embed_bf16;      // embed holds bf16 bits (a bf16 model's table, widened row by row), else fp32
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

static inline float half_to_f32(uint16_t h) {  // IEEE fp16 -> fp32, exact (the fallback's cvtph)
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (e == 0) {
        f = std::ldexp((float)mant, -24);  // zero and subnormals
    } else if (e == 31) {
        const uint32_t u = 0x7f800000u | (mant << 13);
        std::memcpy(&f, &u, 4);
    } else {
        const uint32_t u = ((e + 112) << 23) | (mant << 13);
        std::memcpy(&f, &u, 4);
    }
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
}

static void rmsnorm_row(const float* x, const float* w, float* out, int n, float eps) {
    double ss = 0.0;  // a fixed serial order: the same for every row and every pass
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / std::sqrt((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

// rmsnorm_row of up to 8 consecutive rows of n (x and out row r at r * n; out may be x), bit for bit: each row's
// sum of squares is the same serial double sum, but the rows' sums advance side by side (AVX-512: lane r of one
// vector is row r's sum, 8 inputs of 8 rows transposed per step), so a long pass waits on one chain of n dependent
// adds per 8 rows instead of per row. 512 rows of 576: 0.19 -> 0.045 ms (~3% of a 512-token prefill).
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

#if PARLEY_AVX2
// AVX2 + FMA (CPUs without AVX-512: most laptops): 8 float or int32 lanes, 16 registers. Horizontal sums in a
// fixed tree, so a lane's result depends only on its inputs.
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

static inline int32_t hsum8i(__m256i v) {  // exact
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

static inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// Lanes 0 .. cnt - 1 set (cnt may be <= 0 or >= 8): the mask of the masked loads and stores.
static inline __m256i lanes8(int cnt) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 4 vectors of 8 int32 in [-128, 127] -> 32 int8 in order, at dst.
static inline void store_i8x32(int8_t* dst, __m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    _mm256_storeu_si256((__m256i*)dst, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// exp512's polynomial on 8 lanes: each lane bitwise exp_scalar's.
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.428606765330187e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
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
// activations quantized to int8 per position, in blocks of 64 or 32 inputs (what the integer dot products read)
//
// One scale per 64 inputs, the INT4 weights' own chunk (and the embedded model's group): a product then
// converts and scales one exact int32 sum per (position, 64 inputs), not two. Blocks of 32 where 64 cost
// accuracy (`parley bench quality --kernels auto`, 4 chunks, AWQ perplexity 21.404 with 32 everywhere): 64
// everywhere 21.517 (+0.5%), 64 but 32 for the MLP's down projection (its input, the SwiGLU output, has the
// outliers) and the int8 head 21.413 (+0.04%): the packer's choice (Lin.act_block), llama.cpp's K-quant
// path uses blocks of 256 (Q8_K).

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

static void quantize_row(const float* x, int K, int bs, const Act* a, int m) {
    const int nv = bs / 16;
    int8_t* q = a->q + (size_t)m * K;
    float* d = a->d + (size_t)m * (K / bs);
    int32_t* xs = a->xs + (size_t)m * (K / bs);
    for (int b = 0; b < K / bs; b++) {
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

// ---------------------------------------------------------------------------------------------------
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
// of a thread's columns are contiguous, so it runs on into the next block). +~14% at 8 rows on one thread; 4 KB
// rather than 2: a whole pass on one thread, the two interleaved in one process, 0.95x at 1 token and 0.97x at
// 8 (gate/up at 1 token 0.86 -> 0.80 ms, the down projection at 8 0.94 -> 0.81; 8 and 16 KB no better). The
// int8 head at 1 row measured slower with it (0.81-1.00 ms -> 0.87-1.17 ms; again in a pass, 0.75 -> 0.83), so
// q8_block has none; its pair tiles (more arithmetic per byte) prefetch the next pair.
constexpr int PREFETCH_BYTES = 4096;

template <int R, int AB>
static inline void q4_block(const Lin* L, int nb, const Act* a, int m0, float* y, int ldy) {
    // groups of 32 (GGUF's Q4 formats; blocks of 32 only): two groups per chunk, hf's own below
    const int K = L->K, nc = K / 64, G = L->group, ng = K / G, cpg = G >= 64 ? G / 64 : 1;
    // independent partial sums per position (short dependency chains); blocks of 32: low and high apart
    constexpr int P = AB == 32 ? 2 : (R <= 2 ? 4 : (R < 6 ? 2 : 1));
    const uint8_t* wq = L->q + (size_t)nb * nc * 512;
    const uint16_t* S = L->s16 + (size_t)nb * ng * 16;
    const uint8_t* Z = L->z + (size_t)nb * ng * 16;
    const uint16_t* Mn = L->m16 ? L->m16 + (size_t)nb * ng * 16 : nullptr;
    const __m512i hi = _mm512_set1_epi8((char)0xf0);
    __m512 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    __m512i zn = _mm512_setzero_si512();  // the group's -16 z as int16 in the low half of each lane
    __m512 s_16 = _mm512_setzero_ps();    // the group's s / 16 (exact)
    // the same for each half of the chunk (groups of 32), and each half's minimum (zero without one)
    __m512i zh[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    __m512 sh[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, mh[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int ci = 0; ci < nc; ci++) {
        if (ci % cpg == 0) {
            for (int hf = 0; hf < (G == 32 ? 2 : 1); hf++) {
                const int g = G == 32 ? 2 * ci + hf : ci / cpg;
                const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(Z + (size_t)g * 16)));
                zn = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(z, 4)), _mm512_set1_epi32(0xffff));
                s_16 = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(S + (size_t)g * 16))), _mm512_set1_ps(0.0625f));
                zh[hf] = zn, sh[hf] = s_16;
                if (Mn) mh[hf] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(Mn + (size_t)g * 16)));
            }
            if (G != 32) zh[1] = zh[0], sh[1] = sh[0], mh[1] = mh[0];
        }
        __m512i ib[R][P];
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) ib[r][p] = _mm512_setzero_si512();
        const uint8_t* w = wq + (size_t)ci * 512;
        if constexpr (AB == 32) {
            // Blocks of 32 (the MLP's down projection): two live sums per position, 2R accumulators. Left to
            // itself the compiler kept this loop rolled and 2 of them on the stack, each `vpdpbusd` then waiting
            // on a store and a reload (180 GMAC/s at 512 rows against 261 unrolled; /tmp A/B, one thread).
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                _mm_prefetch((const char*)(w + PREFETCH_BYTES + t * 64), _MM_HINT_T0);
                const __m512i v = _mm512_loadu_si512((const void*)(w + t * 64));
                const __m512i l = _mm512_and_si512(_mm512_slli_epi16(v, 4), hi), h = _mm512_and_si512(v, hi);
                for (int r = 0; r < R; r++) {
                    const int8_t* x = a->q + (size_t)(m0 + r) * K + ci * 64 + 4 * t;
                    ib[r][0] = _mm512_dpbusd_epi32(ib[r][0], l, _mm512_set1_epi32(load_i32(x)));
                    ib[r][1] = _mm512_dpbusd_epi32(ib[r][1], h, _mm512_set1_epi32(load_i32(x + 32)));
                }
            }
        } else {
            for (int t = 0; t < 8; t++) {
                _mm_prefetch((const char*)(w + PREFETCH_BYTES + t * 64), _MM_HINT_T0);
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
                    const __m512i b = _mm512_dpwssd_epi32(ib[r][hf], zh[hf], _mm512_set1_epi32(a->xs[blk]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), sh[hf]), acc[r]);
                    // the minimum's share: m times the block's sum of x (d times its exact integer sum)
                    if (Mn) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a->d[blk] * (float)a->xs[blk]), mh[hf], acc[r]);
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
// per block. Why: on this core (Zen 5) a broadcast from memory costs nearly what a `vpdpbusd` does, so one block
// at a time (a broadcast per `vpdpbusd`) runs well short of the peak; a /tmp loop of 12 chains measured
// 350-390 GMAC/s register-only, 245-290 with a broadcast per instruction, 290-310 with one per two. R = 4
// positions for a prefill: the tile's 8 int32 and 8 float sums, 4 unpacked weight vectors and 2 broadcasts stay
// in registers (2 x 8 positions spilled every float sum to the stack each chunk and ran 5-20% slower than one
// block at 512 rows); R = 8 for short passes, where the weights stream from memory (see quant_block). Each (position, column) sums the same exact int32 per 64 inputs and meets its scale in
// the same float operations, in input order: the same bits as `q4_block`. The down projection (blocks of 32)
// measured slower paired (0.92-0.95x at 512 rows) and stays on `q4_block`.
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
    __m512 acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int ci = 0; ci < nc; ci++) {
        const uint8_t* w = wq + (size_t)ci * 1024;
        for (int half = 0; half < 2; half++) {
            __m512i ib[R][P];
            for (int r = 0; r < R; r++)
                for (int p = 0; p < P; p++) ib[r][p] = _mm512_setzero_si512();
            for (int t = 0; t < 8; t++) {
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
// same float multiply-add in input order as q8_block: the same bits. Why: at 8 rows q8_block issued one
// broadcast per `vpdpbusd` and the head of an 8-token pass ran at ~155 GMAC/s a core, a quarter of its time.
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
// in input order), reduced as _mm512_reduce_add_ps reduces (halves, quarters, then pairs): its bits.
static inline float hsum16(__m256 lo, __m256 hi) { return hsum8(_mm256_add_ps(hi, lo)); }

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
// tile keep 16 float sums on the stack (a store and a reload each per 64 inputs) but read each vector once:
// one thread, an 8-token pass at depth 0, the previous build and this one interleaved in one process: the int8
// head 1.83 -> 1.33 ms, the INT4 products 4.33 -> 4.05 ms. A prefill keeps 4: with 512 rows the 8-position
// tile measured up to 13% slower on gate/up (docs/cpu-step.md, "Tried and not kept").
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
            for (int m = t / nun * 64; m < m1; m += 8) {  // tiles of up to 8 positions share each weight vector
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
            int8_t* dst = (int8_t*)(which ? kv->v : kv->k) + row * D;
#if PARLEY_VNNI  // the same values as the loops below (as quantize_row's): std::fmax was a libm call per element
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
        // 8 queries a sweep: 8 independent chains of 32 `vpdpwssd` (4 before), unrolled by 4 (rolled, the compiler
        // copied the accumulators between registers every step): attention of 512 positions, one layer, one
        // thread, 1.68 -> 1.55 ms (with kv_write's vector quantization, from 2.05-2.37 ms; /tmp A/B, same bits).
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

// ---------------------------------------------------------------------------------------------------
// tree passes: several draft candidates verified in one pass
//
// Node 0 of a tree pass sits at position `base`; every other node's parent is an earlier node and its position
// is its parent's + 1 (rotary and the attention range use it). Node m writes its K/V to slot base + m and
// attends, below `base`, the cache as is and, from `base` on, its ancestors. The nodes of the chain (node m at
// depth m, each the child of the one before it: what a linear pass holds) find their ancestors at slot ==
// position, so they read the cache exactly as a linear pass does. Every other node belongs to one branch (the
// path of a leaf, its nodes in index order = depth order); in each key block that holds an ancestor of the
// branch off the chain, the block's rows are gathered in stored form into a one-head scratch cache at the same
// offsets in the block and attended by the same code. Blocks stay blocks of positions, so a node's logits are
// bitwise those of the linear pass over its path.

struct Tree {
    int base;             // position (and slot) of node 0
    const int* group;     // per node: -1 on the chain, else its branch
    int ngroups;
    const int* offsets;   // [ngroups + 1]: branch g's nodes are members[offsets[g] .. offsets[g + 1])
    const int* members;
    const int* fork;      // per branch: the first depth at which its leaf's path leaves the chain
    const int* path;      // [ngroups][stride]: the node at each depth of the branch's leaf path
    const int* depth;     // per branch: its leaf's depth
    int stride;
    char* scratch;        // per thread: scratch_bytes of gathered rows
    size_t scratch_bytes;
};

// Bytes of one row of each cache tensor (k, v, ks, vs, vm) in the stored form; 0: the kind has no such tensor.
static void row_bytes(int kind, int D, size_t* b) {
    const size_t e = kind == KV_F32 ? 4 : (kind == KV_BF16 ? 2 : 1);
    b[0] = D * e;
    b[1] = kind == KV_K8V4 ? D / 2 : D * e;
    b[2] = kind >= KV_INT8 ? 4 : 0;
    b[3] = kind == KV_INT8 ? 4 : (kind == KV_K8V4 ? (size_t)(D / 32) * 4 : 0);
    b[4] = kind == KV_K8V4 ? (size_t)(D / 32) * 4 : 0;
}

// n consecutive rows from row `src` of `from` to row `dst` of `to` (rows of one layout, all tensors).
static void copy_rows(int kind, int D, const KV* from, size_t src, const KV* to, size_t dst, int n) {
    size_t b[5];
    row_bytes(kind, D, b);
    const void* f[5] = {from->k, from->v, from->ks, from->vs, from->vm};
    void* t[5] = {to->k, to->v, to->ks, to->vs, to->vm};
    for (int i = 0; i < 5; i++)
        if (b[i]) std::memmove((char*)t[i] + dst * b[i], (const char*)f[i] + src * b[i], (size_t)n * b[i]);
}

// Scratch for one head's block of ATT_BLOCK rows of every tensor.
static size_t gather_bytes(int kind, int D) {
    size_t b[5], total = 0;
    row_bytes(kind, D, b);
    for (int i = 0; i < 5; i++) total += (b[i] * ATT_BLOCK + 63) / 64 * 64;
    return total;
}

// Rows [j0, j1) of block b of kv head h as branch g sees them, into the one-head cache `out` (max_len ATT_BLOCK,
// position j at row j - b * ATT_BLOCK) laid out in `mem`.
static void gather_block(const Cache* c, const KV* kv, int h, int D, const Tree* t, int g, int b, int j0, int j1,
                         char* mem, KV* out) {
    size_t rb[5];
    row_bytes(c->kind, D, rb);
    void** dst[5] = {&out->k, &out->v, (void**)&out->ks, (void**)&out->vs, (void**)&out->vm};
    for (int i = 0; i < 5; i++) {
        *dst[i] = rb[i] ? (void*)mem : nullptr;
        mem += (rb[i] * ATT_BLOCK + 63) / 64 * 64;
    }
    const size_t row0 = (size_t)h * c->max_len, shift = (size_t)b * ATT_BLOCK;
    const int fork = t->base + t->fork[g];  // positions from here on are the branch's own nodes
    if (j0 < fork) copy_rows(c->kind, D, kv, row0 + j0, out, j0 - shift, std::min(j1, fork) - j0);
    for (int j = std::max(j0, fork); j < j1; j++)
        copy_rows(c->kind, D, kv, row0 + t->base + t->path[(size_t)g * t->stride + j - t->base], out, j - shift, 1);
}

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

// One sequence's rows of a pass: rows [m0, m0 + M), written to and attending its own cache `c`, whose positions
// reach `blocks` key blocks; `tree`: null for a linear pass. The rest is attend_blocks' plan (plan_attention).
struct Seg {
    const Cache* c;
    int m0, M, blocks;
    const Tree* tree;
    int gs, mgroups, ngroups, first;  // positions per group, groups of positions in turn, all groups, first item
};

// Work items of a pass are (sequence, kv head, key block, up to 32 of its positions in turn, or one branch of a
// tree), so a block is read once for those positions; a short pass with few items for the threads (an 8-token
// pass at depth 0: 3 kv heads x 1 block) splits its positions into smaller groups, so that no thread waits at the
// end for the other's second item. Returns the number of items; each segment's `first` is its first.
static int plan_attention(Seg* segs, int nseg, int KVH, int nt) {
    int blocks = 0, items = 0;
    for (int s = 0; s < nseg; s++) blocks += KVH * segs[s].blocks;
    const int split = blocks >= 2 * nt ? 1 : (2 * nt + blocks - 1) / blocks;  // groups wanted
    for (int s = 0; s < nseg; s++) {
        Seg& g = segs[s];
        g.gs = std::min(32, std::max((g.M + split - 1) / split, 1));
        g.mgroups = (g.M + g.gs - 1) / g.gs;
        g.ngroups = g.mgroups + (g.tree ? g.tree->ngroups : 0);
        g.first = items;
        items += KVH * g.blocks * g.ngroups;
    }
    return items;
}

// Every (kv head, key block, position) partial of a pass: parts [M][KVH][nblk][G][D + 2], slot b of position m
// holding keys [max(b * ATT_BLOCK, first key), min((b + 1) * ATT_BLOCK, p + 1)) of its sequence's cache, layer
// `layer`. A partial depends only on its position and its sequence's cache (and, in a tree, the path to it),
// never on the pass, the other sequences or its group. Queries: head i of position m at q + m * ldq + i * D.
// Inside a parallel region.
static void attend_blocks(const Seg* segs, int nseg, int items, int layer, const int64_t* positions, int H, int KVH,
                          int D, int window, const float* q, int ldq, float scale, int nblk, float* parts,
                          float* scores) {
    const int G = H / KVH;
    const size_t row_parts = (size_t)KVH * nblk * G * (D + 2);  // one position's partials
#pragma omp for schedule(dynamic, 1) PARLEY_NOWAIT
    for (int t = 0; t < items; t++) {
        int si = 0;
        while (si + 1 < nseg && segs[si + 1].first <= t) si++;
        const Seg& sg = segs[si];
        const Cache* c = sg.c;
        const KV* kv = c->layers + layer;
        const Tree* tree = sg.tree;
        const int M = sg.M, gs = sg.gs, mgroups = sg.mgroups, ngroups = sg.ngroups, u = t - sg.first;
        const int h = u / (sg.blocks * ngroups), b = u / ngroups % sg.blocks, g = u % ngroups;
        const int64_t* pos = positions + sg.m0;
        const float* qs = q + (size_t)sg.m0 * ldq;
        float* ps = parts + (size_t)sg.m0 * row_parts;
        float* s = scores + (size_t)omp_get_thread_num() * ATT_SCORES * ATT_BLOCK;
        int ms[32], nm = 0;
        if (g < mgroups) {  // positions in turn (a tree's chain nodes)
            for (int m = g * gs; m < std::min(M, g * gs + gs); m++)
                if (!tree || tree->group[m] < 0) ms[nm++] = m;
            attend_nodes(c, kv, h, 0, h, b, ms, nm, pos, KVH, D, G, window, qs, ldq, scale, nblk, ps, s);
            continue;
        }
        const int br = g - mgroups, *mem = tree->members + tree->offsets[br];
        const int n = tree->offsets[br + 1] - tree->offsets[br];
        const int leaf_p = tree->base + tree->depth[br], fork = tree->base + tree->fork[br];
        const int j0 = std::max(b * ATT_BLOCK, first_key((int)pos[mem[0]], window));
        const int j1 = std::min(leaf_p + 1, (b + 1) * ATT_BLOCK);
        if (j1 <= j0) continue;
        if (j1 <= fork) {  // this block holds none of the branch's own nodes: the cache as is
            attend_nodes(c, kv, h, 0, h, b, mem, n, pos, KVH, D, G, window, qs, ldq, scale, nblk, ps, s);
            continue;
        }
        Cache view = {c->kind, ATT_BLOCK, nullptr};
        KV rows;
        gather_block(c, kv, h, D, tree, br, b, j0, j1, tree->scratch + (size_t)omp_get_thread_num() * tree->scratch_bytes,
                     &rows);
        attend_nodes(&view, &rows, 0, b * ATT_BLOCK, h, b, mem, n, pos, KVH, D, G, window, qs, ldq, scale, nblk,
                     ps, s);
    }
}

// One position's attention output [H][D] from its partials (`parts` = that position's [KVH][nblk] slots).
static void attend_merge(int KVH, int G, int D, int window, int p, int nblk, const float* parts, float* out) {
    const size_t part_stride = (size_t)G * (D + 2);
    const int b0 = first_key(p, window) / ATT_BLOCK, b1 = p / ATT_BLOCK;
    // The partials were written a whole attention step ago (a 512-token prefill's are 2.4 MB, past L2): ask for
    // all of this position's lines at once, before the first dependent read (attention of 512 positions, one
    // layer, one thread, with its merge: -3 to -9%, min of 30, builds alternated 4 times).
    for (int h = 0; h < KVH; h++)
        for (const char* c = (const char*)(parts + ((size_t)h * nblk + b0) * part_stride);
             c < (const char*)(parts + ((size_t)h * nblk + b1 + 1) * part_stride); c += 64)
            __builtin_prefetch(c);
    for (int h = 0; h < KVH; h++)
        attend_combine(parts + ((size_t)h * nblk + b0) * part_stride, b1 - b0 + 1, G, D, out + (size_t)h * G * D);
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

// ---------------------------------------------------------------------------------------------------

static void* scratch(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    return p;
}

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

static int g_threads = 0;  // 0: OpenMP's default

// Threads for the next forward passes (0 = default); set per call because OpenMP's setting is per thread.
extern "C" int parley_threads(int n) {
    if (n >= 0) g_threads = n;
    return g_threads > 0 ? g_threads : omp_get_max_threads();
}

extern "C" int parley_has_vnni(void) { return PARLEY_VNNI; }

// Which flavour this build is: 2 AVX-512 VNNI, 1 AVX2 + FMA, 0 the portable loops.
extern "C" int parley_simd(void) { return PARLEY_VNNI ? 2 : (PARLEY_AVX2 ? 1 : 0); }

// The rotation before the down projection on one row, for the tests to compare bit for bit with PyTorch's.
extern "C" void parley_hadamard_row(float* x, int n, const float* diag, int block) { hadamard_row(x, n, diag, block); }

// The profile build's sums into out [threads][PH_COUNT][2] (work, wait; seconds), then zeroed; -1 elsewhere.
extern "C" int parley_profile(double* out, int threads) {
#ifdef PARLEY_PROFILE
    for (int t = 0; t < threads && t < PROF_THREADS; t++)
        for (int p = 0; p < PH_COUNT; p++)
            for (int k = 0; k < 2; k++) out[((size_t)t * PH_COUNT + p) * 2 + k] = g_prof[t][p][k], g_prof[t][p][k] = 0;
    return PH_COUNT;
#else
    (void)out, (void)threads;
    return -1;
#endif
}

// The core's int8 multiply-add peak (one thread): `iters` rounds of 12 independent vpdpbusd chains (64 MACs
// each), in GMAC/s of this thread's CPU time (a busy machine's preemptions do not count). What `parley bench
// passes` sets the products' speed beside. 0 without VNNI. 12, not 16: GCC 12 kept one of 16 accumulators on
// the stack, so every round waited on a store and a reload and the "peak" read 245-270 GMAC/s on the 2-core
// EPYC where 12 chains (no spill) read 410-500 (2 `vpdpbusd` a cycle); 8 chains read ~390 (latency-bound).
extern "C" double parley_vnni_peak_gmacs(int iters) {
#if PARLEY_VNNI
    __m512i acc[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (int it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    __m512i sum = acc[0];
    for (int i = 1; i < 12; i++) sum = _mm512_add_epi32(sum, acc[i]);
    volatile int sink = _mm512_reduce_add_epi32(sum);  // keeps the loop
    (void)sink;
    return (double)iters * 12 * 64 / dt / 1e9;
#else
    (void)iters;
    return 0.0;
#endif
}

// The machine's read bandwidth: `threads` threads (0: the step's own count) each read a contiguous share of
// `bytes` (a buffer far past the caches), `reps` times; GB/s of the fastest rep, in wall time. One of the two
// readers `parley bench decode` sets a decode step's bytes beside (the other is torch's sum; it keeps the
// better, so that the probe does not under-read and the step's share read high). Each thread reads its share
// as 4 interleaved sub-streams: on the 2-core EPYC one stream a thread read 0.97x torch's sum (median of 20
// interleaved pairs, 2 threads), 4 read 1.08x. (The products keep one stream a thread: 2 or 4 measured
// 1.03-1.38x slower in a pass, a dynamic schedule 1.07-1.28x.)
extern "C" double parley_read_gbs(const void* buf, size_t bytes, int reps, int threads) {
    const int nt = threads > 0 ? threads : (g_threads > 0 ? g_threads : omp_get_max_threads());
    const size_t lines = bytes / 64;
    double best = 0.0;
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
#pragma omp parallel num_threads(nt) reduction(^ : sink)
        {
            const int t = omp_get_thread_num(), n = omp_get_num_threads();
            const uint8_t* p = (const uint8_t*)buf + lines * t / n * 64;
            const uint8_t* end = (const uint8_t*)buf + lines * (t + 1) / n * 64;
#if PARLEY_VNNI
            __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                              _mm512_setzero_si512()};
            const size_t q = (size_t)(end - p) / 4 / 64 * 64;  // 4 sub-streams a thread: see above
            for (size_t i = 0; i < q; i += 64)
                for (int u = 0; u < 4; u++)
                    acc[u] = _mm512_xor_si512(acc[u], _mm512_load_si512((const void*)(p + u * q + i)));
            p += 4 * q;
            for (; p < end; p += 64) acc[0] = _mm512_xor_si512(acc[0], _mm512_load_si512((const void*)p));
            acc[0] = _mm512_xor_si512(_mm512_xor_si512(acc[0], acc[1]), _mm512_xor_si512(acc[2], acc[3]));
            sink ^= (uint64_t)_mm512_reduce_or_epi64(acc[0]);
#elif PARLEY_AVX2  // the same 4 sub-streams, 2 vectors of 32 bytes a line
            __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                              _mm256_setzero_si256()};
            const size_t q = (size_t)(end - p) / 4 / 64 * 64;
            for (size_t i = 0; i < q; i += 64)
                for (int u = 0; u < 4; u++)
                    acc[u] = _mm256_xor_si256(acc[u], _mm256_xor_si256(_mm256_load_si256((const __m256i*)(p + u * q + i)),
                                                                      _mm256_load_si256((const __m256i*)(p + u * q + i + 32))));
            p += 4 * q;
            for (; p < end; p += 64)
                acc[0] = _mm256_xor_si256(acc[0], _mm256_xor_si256(_mm256_load_si256((const __m256i*)p),
                                                                  _mm256_load_si256((const __m256i*)(p + 32))));
            acc[0] = _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]), _mm256_xor_si256(acc[2], acc[3]));
            alignas(32) uint64_t r[4];
            _mm256_store_si256((__m256i*)r, acc[0]);
            sink ^= r[0] | r[1] | r[2] | r[3];
#else
            uint64_t x = 0;
            for (; p < end; p += 8) {
                uint64_t v;
                std::memcpy(&v, p, 8);
                x ^= v;
            }
            sink ^= x;
#endif
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        best = std::max(best, (double)(lines * 64) / dt / 1e9);
    }
    volatile uint64_t keep = sink;  // the reads are not dead
    (void)keep;
    return best;
}

// One product y [M][N] = x [M][K] W^T, for tests against an independent reference.
extern "C" int parley_linear(const Lin* L, int M, const float* x, float* y) {
    if (L->K % 64) return -1;
    if (g_threads > 0) omp_set_num_threads(g_threads);
    Act a = new_act(M, L->K);
#pragma omp parallel
    {
        prof_start();
        if (quantized(L)) quantize_acts(x, M, L->K, lin_block(L), &a);
        prof_phase(PH_HEAD_QUANT);
        linear(L, M, x, &a, y);
        prof_phase(PH_HEAD);
    }
    free_act(&a);
    return 0;
}

// One layer's attention alone, for tests against an independent reference: writes k, v [M][KVH][D] of the M
// positions into `layer` of the cache (their stored form), then out [M][H][D] = attention of q [M][H][D].
extern "C" int parley_attention(const Cache* cache, int layer, int M, const int64_t* positions, int H, int KVH, int D,
                                int window, const float* q, const float* k, const float* v, float* out) {
    if (D > 512 || D % 32 || H % KVH || H / KVH > 8) return -2;
    int max_p = 0;
    for (int m = 0; m < M; m++) {
        if (positions[m] < 0 || positions[m] >= cache->max_len) return -1;
        max_p = std::max(max_p, (int)positions[m]);
    }
    if (g_threads > 0) omp_set_num_threads(g_threads);
    const KV* kv = cache->layers + layer;
    const int nblk = max_p / ATT_BLOCK + 1, G = H / KVH;
    const size_t part_stride = (size_t)G * (D + 2);
    float* parts = (float*)scratch((size_t)M * KVH * nblk * part_stride * 4);
    float* scores = (float*)scratch((size_t)omp_get_max_threads() * ATT_SCORES * ATT_BLOCK * 4);
    const float scale = 1.0f / std::sqrt((float)D);
    Seg seg = {cache, 0, M, nblk, nullptr, 0, 0, 0, 0};
    const int items = plan_attention(&seg, 1, KVH, omp_get_max_threads());
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++)
            for (int h = 0; h < KVH; h++)
                kv_write(cache, kv, h, (int)positions[m], D, k + ((size_t)m * KVH + h) * D, v + ((size_t)m * KVH + h) * D);
        attend_blocks(&seg, 1, items, layer, positions, H, KVH, D, window, q, H * D, scale, nblk, parts, scores);
        prof_phase(PH_ATTEND);
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++)
            attend_merge(KVH, G, D, window, (int)positions[m], nblk, parts + (size_t)m * KVH * nblk * part_stride,
                         out + (size_t)m * H * D);
    }
    std::free(parts);
    std::free(scores);
    return 0;
}

// The branches of a tree pass from its parents (parents[0] = -1, 0 <= parents[m] < m, positions[m] =
// positions[parents[m]] + 1), in `buf` (ints, sized by tree_ints). False when `parents` is not such a tree.
static size_t tree_ints(int M) { return (size_t)M * (M + 8) + 8; }

static bool build_tree(int M, const int64_t* positions, const int64_t* parents, int* buf, Tree* t) {
    if (M < 1 || parents[0] != -1) return false;
    int *depth = buf, *group = buf + M, *has_child = buf + 2 * M, *offsets = buf + 3 * M, *members = buf + 4 * M + 1;
    int *fork = buf + 5 * M + 1, *leaf_depth = buf + 6 * M + 1, *path = buf + 7 * M + 1;
    depth[0] = 0;
    for (int m = 0; m < M; m++) has_child[m] = 0, group[m] = -1;
    for (int m = 1; m < M; m++) {
        const int64_t pa = parents[m];
        if (pa < 0 || pa >= m || positions[m] != positions[pa] + 1) return false;
        depth[m] = depth[pa] + 1;
        has_child[pa] = 1;
    }
    for (int m = 1; m < M; m++)  // with parents before children, depth m means the path 0, 1, ..., m: the chain
        if (depth[m] != m) group[m] = -2;
    int ng = 0, nmem = 0;
    for (int leaf = 0; leaf < M; leaf++) {  // each off-chain leaf's path is a branch; a node joins the first
        if (has_child[leaf] || group[leaf] != -2) continue;
        int* pth = path + (size_t)ng * M;
        for (int m = leaf; m >= 0; m = (int)parents[m]) pth[depth[m]] = m;
        int d = 0;
        while (pth[d] == d) d++;
        fork[ng] = d, leaf_depth[ng] = depth[leaf], offsets[ng] = nmem;
        for (int k = d; k <= depth[leaf]; k++)
            if (group[pth[k]] == -2) group[pth[k]] = ng, members[nmem++] = pth[k];
        ng++;
    }
    offsets[ng] = nmem;
    for (int m = 0; m < M; m++) if (group[m] == -2) return false;
    t->base = (int)positions[0];
    t->group = group, t->ngroups = ng, t->offsets = offsets, t->members = members, t->fork = fork, t->path = path;
    t->depth = leaf_depth, t->stride = M;
    return true;
}

// Whether rows [0, M) of `parents` (indices within the segment) are a chain: each row follows the one before.
static bool is_chain(int M, const int64_t* parents) {
    for (int m = 0; m < M; m++)
        if (parents[m] != m - 1) return false;
    return true;
}

// One pass over the rows of `nseq` sequences: sequence s has rows[s] consecutive rows of `tokens` / `positions`,
// writes their K/V into caches[s] and attends only that cache. The products see all rows as one matrix (each row's
// arithmetic is its own: see the top of this file), so a row's logits are those of its sequence's pass alone.
// `parents` null: every sequence's pass is linear (slots = positions; position p attends slots 0..p, or its layer's
// window of them). Else, per row, the index within its sequence of the row it follows (-1 for the first): a
// sequence whose rows are not a chain is a tree pass (see Tree; node m writes slot positions[first] + m).
// logits [n_out][vocab] for rows out_rows[0..n_out) (ascending); out_rows null: the last n_out rows.
static int forward_pass(const Model* md, int nseq, const Cache* const* caches, const int* seq_rows,
                        const int64_t* tokens, const int64_t* positions, const int64_t* parents, int n_out,
                        const int* out_rows, float* logits) {
    const int dim = md->dim, H = md->n_heads, KVH = md->n_kv_heads, D = md->head_dim, I = md->inter;
    const int QKV = (H + 2 * KVH) * D;
    const int maxK = std::max(std::max(I, dim), H * D);
    if (g_threads > 0) omp_set_num_threads(g_threads);
    if (D > 512 || (H / KVH) > 8 || H % KVH) return -2;
    if (nseq < 1) return -4;
    int M = 0;
    for (int s = 0; s < nseq; s++) {
        if (seq_rows[s] < 1 || !caches[s]) return -4;
        M += seq_rows[s];
    }
    if (n_out < 0 || n_out > M) return -4;
    for (int i = 0; i < n_out; i++)
        if (out_rows && (out_rows[i] < 0 || out_rows[i] >= M || (i > 0 && out_rows[i] <= out_rows[i - 1]))) return -4;
    Seg* segs = (Seg*)scratch((size_t)nseq * sizeof(Seg));
    Tree* trees = (Tree*)scratch((size_t)nseq * sizeof(Tree));
    int** tree_bufs = (int**)std::calloc(nseq, sizeof(int*));
    int* seq_of = (int*)scratch((size_t)M * sizeof(int));
    size_t gather = 0;
    int rc = 0;
    for (int s = 0, m0 = 0; s < nseq; m0 += seq_rows[s++]) {
        const Cache* c = caches[s];
        const int n = seq_rows[s];
        int max_p = 0;
        for (int m = m0; m < m0 + n; m++) {
            if (positions[m] < 0 || positions[m] >= c->max_len || positions[m] >= md->max_pos) rc = -1;
            max_p = std::max(max_p, (int)positions[m]);
            seq_of[m] = s;
        }
        segs[s] = {c, m0, n, max_p / ATT_BLOCK + 1, nullptr, 0, 0, 0, 0};
        if (rc || !parents || is_chain(n, parents + m0)) continue;
        if (positions[m0] + n > c->max_len) {
            rc = -1;
            continue;
        }
        tree_bufs[s] = (int*)scratch(tree_ints(n) * sizeof(int));
        if (!build_tree(n, positions + m0, parents + m0, tree_bufs[s], &trees[s])) {
            rc = -3;
            continue;
        }
        segs[s].tree = &trees[s];
        gather = std::max(gather, gather_bytes(c->kind, D));
    }
    char* gather_scratch = gather ? (char*)scratch((size_t)omp_get_max_threads() * gather) : nullptr;
    for (int s = 0; s < nseq; s++)
        if (segs[s].tree) trees[s].scratch = gather_scratch, trees[s].scratch_bytes = gather;
    auto release = [&]() {
        for (int s = 0; s < nseq; s++) std::free(tree_bufs[s]);
        std::free(tree_bufs);
        std::free(trees);
        std::free(segs);
        std::free(seq_of);
        std::free(gather_scratch);
    };
    if (rc) {
        release();
        return rc;
    }
    float* x = (float*)scratch((size_t)M * dim * 4);
    float* xn = (float*)scratch((size_t)M * maxK * 4);
    float* qkv = (float*)scratch((size_t)M * QKV * 4);
    float* att = (float*)scratch((size_t)M * H * D * 4);
    float* gu = (float*)scratch((size_t)M * 2 * I * 4);
    float* tmp = (float*)scratch((size_t)M * dim * 4);
    Act a = new_act(M, maxK);
    const int nthreads = omp_get_max_threads();
    int nblk = 1;  // the partials' stride: the key blocks of the deepest sequence
    for (int s = 0; s < nseq; s++) nblk = std::max(nblk, segs[s].blocks);
    const int G = H / KVH, items = plan_attention(segs, nseq, KVH, nthreads);
    const size_t part_stride = (size_t)G * (D + 2);  // one block's partial for one kv head
    float* parts = (float*)scratch((size_t)M * KVH * nblk * part_stride * 4);
    float* att_scores = (float*)scratch((size_t)nthreads * ATT_SCORES * ATT_BLOCK * 4);
    const float scale = md->attn_scale > 0 ? md->attn_scale : 1.0f / std::sqrt((float)D);

    for (int m = 0; m < M; m++) {
        if (md->embed_bf16) {
            const uint16_t* e = (const uint16_t*)md->embed + (size_t)tokens[m] * dim;
            for (int i = 0; i < dim; i++) x[(size_t)m * dim + i] = bf16_to_f32(e[i]);
        } else {
            std::memcpy(x + (size_t)m * dim, md->embed + (size_t)tokens[m] * dim, dim * 4);
        }
        if (md->embed_scale != 0.0f)
            for (int i = 0; i < dim; i++) x[(size_t)m * dim + i] *= md->embed_scale;
    }
    const int rows = n_out;
    auto out_row = [&](int i) { return out_rows ? out_rows[i] : M - n_out + i; };

    // One parallel region for the whole pass: each step below splits its rows / columns / heads over the
    // threads and ends at the barrier of its `omp for`.
#pragma omp parallel
    for (int l = 0; l < md->n_layers; l++) {
        if (l == 0) prof_start();
        // Rows normed together: 8 (rmsnorm_rows' vector path), but a short pass's rows split over the threads
        // (8 rows on one thread left the other waiting ~2 us a norm, 60 norms a pass); the same bits either way.
        const int nrn = std::min(8, std::max(1, (M + omp_get_num_threads() - 1) / omp_get_num_threads()));
        const Layer* L = md->layers + l;
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m0 = 0; m0 < M; m0 += nrn) {  // (the previous layer's residual) + norm + activation quantization
            const int nr = std::min(nrn, M - m0);  // rows normed together (rmsnorm_rows)
            if (l > 0)
                for (int i = 0; i < nr * dim; i++) x[(size_t)m0 * dim + i] += tmp[(size_t)m0 * dim + i];
            rmsnorm_rows(x + (size_t)m0 * dim, L->attn_norm, xn + (size_t)m0 * dim, nr, dim, md->eps);
            if (quantized(&L->qkv))
                for (int m = m0; m < m0 + nr; m++) quantize_row(xn + (size_t)m * dim, dim, lin_block(&L->qkv), &a, m);
        }
        prof_phase(PH_NORM);
        linear(&L->qkv, M, xn, &a, qkv);
        prof_phase(PH_QKV);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m = 0; m < M; m++) {  // q/k norm (qwen3), rotary, then the new K/V into the cache
            float* row = qkv + (size_t)m * QKV;
            const int p = (int)positions[m];
            const float* cs = (L->rope_cos ? L->rope_cos : md->rope_cos) + (size_t)p * (D / 2);
            const float* sn = (L->rope_sin ? L->rope_sin : md->rope_sin) + (size_t)p * (D / 2);
            for (int h = 0; h < H + KVH; h++) {
                float* v = row + h * D;
                if (L->q_norm) rmsnorm_row(v, h < H ? L->q_norm : L->k_norm, v, D, md->eps);
                rope_row(v, D, cs, sn);
            }
            const Seg& sg = segs[seq_of[m]];
            const int slot = sg.tree ? sg.tree->base + (m - sg.m0) : p;
            for (int h = 0; h < KVH; h++)
                kv_write(sg.c, sg.c->layers + l, h, slot, D, row + (H + h) * D, row + (H + KVH + h) * D);
        }
        prof_phase(PH_ROPE);
        attend_blocks(segs, nseq, items, l, positions, H, KVH, D, L->window, qkv, QKV, scale, nblk, parts, att_scores);
        prof_phase(PH_ATTEND);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m = 0; m < M; m++) {  // merge the blocks, then quantize for the output projection
            attend_merge(KVH, G, D, L->window, (int)positions[m], nblk, parts + (size_t)m * KVH * nblk * part_stride,
                         att + (size_t)m * H * D);
            if (quantized(&L->o)) quantize_row(att + (size_t)m * H * D, H * D, lin_block(&L->o), &a, m);
        }
        prof_phase(PH_MERGE);
        linear(&L->o, M, att, &a, tmp);
        prof_phase(PH_O);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m0 = 0; m0 < M; m0 += nrn) {
            const int nr = std::min(nrn, M - m0);
            float* t = tmp + (size_t)m0 * dim;
            if (L->post_attn_norm) rmsnorm_rows(t, L->post_attn_norm, t, nr, dim, md->eps);
            for (int i = 0; i < nr * dim; i++) x[(size_t)m0 * dim + i] += t[i];
            rmsnorm_rows(x + (size_t)m0 * dim, L->ffn_norm, xn + (size_t)m0 * dim, nr, dim, md->eps);
            if (quantized(&L->gate_up))
                for (int m = m0; m < m0 + nr; m++) quantize_row(xn + (size_t)m * dim, dim, lin_block(&L->gate_up), &a, m);
        }
        prof_phase(PH_NORM2);
        linear(&L->gate_up, M, xn, &a, gu);
        prof_phase(PH_GATE_UP);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m = 0; m < M; m++) {  // SiLU(gate) * up (or GeGLU), undoing the 16-column interleave, then quantized
            const bool split = split_gate_up(&L->gate_up);
            if (md->act == 1) gelu_mul_row(gu + (size_t)m * 2 * I, I, xn + (size_t)m * I, split);
            else silu_mul_row(gu + (size_t)m * 2 * I, I, xn + (size_t)m * I, split);
            if (L->down_diag) hadamard_row(xn + (size_t)m * I, I, L->down_diag, L->down_block);
            if (quantized(&L->down))
                quantize_row(xn + (size_t)m * I, I, lin_block(&L->down), &a, m);
        }
        prof_phase(PH_SILU);
        linear(&L->down, M, xn, &a, tmp);
        prof_phase(PH_DOWN);
        if (L->post_ffn_norm) {
#pragma omp for schedule(static) PARLEY_NOWAIT
            for (int m0 = 0; m0 < M; m0 += nrn)
                rmsnorm_rows(tmp + (size_t)m0 * dim, L->post_ffn_norm, tmp + (size_t)m0 * dim, std::min(nrn, M - m0),
                             dim, md->eps);
            prof_phase(PH_POST);
        }
    }
    for (int i = 0; i < rows; i++) {  // only the rows whose logits are wanted go through the head
        const int m = out_row(i);
        float* xr = x + (size_t)m * dim;
        for (int j = 0; j < dim; j++) xr[j] += tmp[(size_t)m * dim + j];
        rmsnorm_row(xr, md->final_norm, xn + (size_t)i * dim, dim, md->eps);
    }
    if (rows > 0) {
#pragma omp parallel
        {
            prof_start();
            if (quantized(&md->head))
                quantize_acts(xn, rows, dim, lin_block(&md->head), &a);
            prof_phase(PH_HEAD_QUANT);
            linear(&md->head, rows, xn, &a, logits);
            prof_phase(PH_HEAD);
        }
    }
    std::free(x); std::free(xn); std::free(qkv); std::free(att); std::free(gu); std::free(tmp);
    free_act(&a);
    std::free(att_scores);
    std::free(parts);
    release();
    return 0;
}

// logits [M or 1][vocab] for one sequence's `tokens` at `positions`; writes their K/V into `cache` (slots =
// positions; position p attends slots 0..p, or its layer's window of them). `last_only`: the last row's only.
extern "C" int parley_forward(const Model* md, const Cache* cache, int M, const int64_t* tokens, const int64_t* positions,
                              int last_only, float* logits) {
    return forward_pass(md, 1, &cache, &M, tokens, positions, nullptr, last_only ? 1 : M, nullptr, logits);
}

// A tree pass (see Tree): -3 when `parents` is not a tree whose positions follow it.
extern "C" int parley_forward_tree(const Model* md, const Cache* cache, int M, const int64_t* tokens,
                                   const int64_t* positions, const int64_t* parents, int last_only, float* logits) {
    if (M < 1 || parents[0] != -1) return -3;
    return forward_pass(md, 1, &cache, &M, tokens, positions, parents, last_only ? 1 : M, nullptr, logits);
}

// Several sequences in one pass (see forward_pass): the engine's step. -1: a position outside a cache or the
// model; -3: a sequence's parents are not a tree its positions follow; -4: malformed rows or out_rows.
extern "C" int parley_forward_batch(const Model* md, int nseq, const Cache* const* caches, const int* seq_rows,
                                    const int64_t* tokens, const int64_t* positions, const int64_t* parents,
                                    int n_out, const int* out_rows, float* logits) {
    return forward_pass(md, nseq, caches, seq_rows, tokens, positions, parents, n_out, out_rows, logits);
}

// After a tree pass: move the K/V of slots src[i] to dst[i], i in order, in every layer and kv head (the accepted
// path's nodes to the positions they now hold). Each dst[i] <= src[i] and no dst[i] is a later src.
extern "C" int parley_kv_move(const Cache* cache, int n_layers, int KVH, int D, int n, const int64_t* src,
                              const int64_t* dst) {
    for (int i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= cache->max_len || dst[i] < 0 || dst[i] >= cache->max_len) return -1;
    for (int l = 0; l < n_layers; l++)
        for (int h = 0; h < KVH; h++)
            for (int i = 0; i < n; i++)
                if (src[i] != dst[i])
                    copy_rows(cache->kind, D, cache->layers + l, (size_t)h * cache->max_len + src[i], cache->layers + l,
                              (size_t)h * cache->max_len + dst[i], 1);
    return 0;
}


// ---------------------------------------------------------------------------------------------------
// The structs' layout as this compiler lays them out, for the ctypes mirrors in kernels/native.py (Lin, KV, Cache)
// and models/native_forward.py (Layer, Model) to be checked against (tests/test_native_structs_match_the_library.py).
// A field added to a struct is added here.
#include <cstddef>

struct FieldLayout { const char* type; const char* field; int offset, size; };  // field "": the whole struct
#define PARLEY_STRUCT(S) {#S, "", 0, (int)sizeof(S)}
#define PARLEY_FIELD(S, F) {#S, #F, (int)offsetof(S, F), (int)sizeof(((S*)nullptr)->F)}
static const FieldLayout parley_layout_table[] = {
    PARLEY_STRUCT(Lin), PARLEY_FIELD(Lin, kind), PARLEY_FIELD(Lin, N), PARLEY_FIELD(Lin, K),
    PARLEY_FIELD(Lin, group), PARLEY_FIELD(Lin, q), PARLEY_FIELD(Lin, s), PARLEY_FIELD(Lin, s16),
    PARLEY_FIELD(Lin, z), PARLEY_FIELD(Lin, w), PARLEY_FIELD(Lin, bias), PARLEY_FIELD(Lin, act_block), PARLEY_FIELD(Lin, m16),
    PARLEY_STRUCT(Layer), PARLEY_FIELD(Layer, attn_norm), PARLEY_FIELD(Layer, ffn_norm),
    PARLEY_FIELD(Layer, q_norm), PARLEY_FIELD(Layer, k_norm), PARLEY_FIELD(Layer, qkv), PARLEY_FIELD(Layer, o),
    PARLEY_FIELD(Layer, gate_up), PARLEY_FIELD(Layer, down), PARLEY_FIELD(Layer, window),
    PARLEY_FIELD(Layer, post_attn_norm), PARLEY_FIELD(Layer, post_ffn_norm), PARLEY_FIELD(Layer, rope_cos),
    PARLEY_FIELD(Layer, rope_sin), PARLEY_FIELD(Layer, down_diag), PARLEY_FIELD(Layer, down_block),
    PARLEY_STRUCT(Model), PARLEY_FIELD(Model, dim), PARLEY_FIELD(Model, n_layers), PARLEY_FIELD(Model, n_heads),
    PARLEY_FIELD(Model, n_kv_heads), PARLEY_FIELD(Model, head_dim), PARLEY_FIELD(Model, inter),
    PARLEY_FIELD(Model, vocab), PARLEY_FIELD(Model, eps), PARLEY_FIELD(Model, embed),
    PARLEY_FIELD(Model, final_norm), PARLEY_FIELD(Model, rope_cos), PARLEY_FIELD(Model, rope_sin),
    PARLEY_FIELD(Model, max_pos), PARLEY_FIELD(Model, head), PARLEY_FIELD(Model, layers),
    PARLEY_FIELD(Model, embed_scale), PARLEY_FIELD(Model, attn_scale), PARLEY_FIELD(Model, act),
    PARLEY_FIELD(Model, embed_bf16),
    PARLEY_STRUCT(KV), PARLEY_FIELD(KV, k), PARLEY_FIELD(KV, v), PARLEY_FIELD(KV, ks), PARLEY_FIELD(KV, vs),
    PARLEY_FIELD(KV, vm),
    PARLEY_STRUCT(Cache), PARLEY_FIELD(Cache, kind), PARLEY_FIELD(Cache, max_len), PARLEY_FIELD(Cache, layers),
};

// Entry i of the table (0 past its end): struct name, field name ("" for the struct), offset, size.
extern "C" int parley_layout(int i, const char** type, const char** field, int* offset, int* size) {
    if (i < 0 || i >= (int)(sizeof(parley_layout_table) / sizeof(parley_layout_table[0]))) return 0;
    const FieldLayout& e = parley_layout_table[i];
    *type = e.type; *field = e.field; *offset = e.offset; *size = e.size;
    return 1;
}
