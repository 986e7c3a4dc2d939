// The vector flavour of the native CPU kernels and the helpers they all share: which instruction set this
// build targets, bf16 / fp16 conversions, horizontal sums, the softmax's exp polynomial, aligned scratch.
//
// Three flavours, by what the compiler may target (-march=native; `parley_simd` says which): AVX-512 VNNI
// (PARLEY_VNNI; on CPUs with AMX its INT4 products of 16 positions or more run as tile multiplies: PARLEY_AMX),
// AVX2 + FMA + F16C (PARLEY_AVX2: CPUs without AVX-512, most laptops) and portable loops. The AMX products and
// the AVX2 flavour compute the VNNI path's values bit for bit: the same exact int32 sum per activation block
// (AVX2's `vpmaddubsw` int16 pairs cannot saturate, see q4_tile in products.h), the same float operations in the
// same order, AVX2's 16-lane sums and trees on two 8-lane halves (tests/test_native_portable_loops.py compares
// the builds' logits); a change to one's float arithmetic is a change to the others'. The portable loops compute
// the same quantities in other orders.
//
// The kernels under kernels/cpu/ are headers of one translation unit (models/native_forward.cpp includes them
// in dependency order: simd, profile, products, rows, attention, tree, attention_plan, abi), so the compiler sees
// every call and inlines across them as within one file. Build with -ffp-contract=off.

#pragma once
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
// AMX (Intel Sapphire Rapids and later): the VNNI flavour's integer products of 16 positions or more run as
// tile multiplies, the same exact int32 sums (products.h, "AMX"). Used once the kernel lets this process use
// the tile registers (`amx_ready`); without that, or with -mno-amx-int8, the VNNI loops run.
#if PARLEY_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define PARLEY_AMX 1
#else
#define PARLEY_AMX 0
#endif

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

// A 16-lane float sum held as two 8-lane halves, reduced as _mm512_reduce_add_ps reduces (halves, quarters, then
// pairs): the AVX-512 path's bits.
static inline float hsum16(__m256 lo, __m256 hi) { return hsum8(_mm256_add_ps(hi, lo)); }
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

// Scratch aligned to a 64-byte line (aligned_alloc takes a multiple of the alignment); freed with std::free.
static void* scratch(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    return p;
}
