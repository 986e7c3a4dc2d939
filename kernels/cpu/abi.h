// The kernels' entry points (extern "C", typed in kernels/native.py): the thread count of the next passes,
// which flavour this build is, one product (`parley_linear`) and one layer's attention (`parley_attention`) for
// tests against independent references, the Hadamard rotation of one row, the profile build's per-phase sums,
// the core's VNNI peak and the read-bandwidth probe that `parley bench` sets its figures beside, and the K/V
// move after a tree pass; then the kernels' part of the struct layout table.
//
// These are operations, not a model: the translation unit that includes this (models/native_forward.cpp) adds
// the forward pass over a model's layers, its entry points and the rest of the layout table.

#pragma once
#include <cstddef>
#include "attention_plan.h"
#include "products.h"
#include "rows.h"
#include "tree.h"

static int g_threads = 0;  // 0: OpenMP's default

// Threads for the next forward passes (0 = default); set per call because OpenMP's setting is per thread.
extern "C" int parley_threads(int n) {
    if (n >= 0) g_threads = n;
    return g_threads > 0 ? g_threads : omp_get_max_threads();
}

extern "C" int parley_has_vnni(void) { return PARLEY_VNNI; }

// Which flavour this build runs: 3 AVX-512 VNNI with AMX tiles, 2 AVX-512 VNNI, 1 AVX2 + FMA, 0 the portable loops.
extern "C" int parley_simd(void) {
#if PARLEY_AMX
    if (amx_ready()) return 3;
#endif
    return PARLEY_VNNI ? 2 : (PARLEY_AVX2 ? 1 : 0);
}

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
// passes` sets the products' speed beside. 0 without VNNI. 12 chains: enough to cover `vpdpbusd`'s latency at
// two a cycle (8 stay latency-bound), and few enough that the compiler keeps every accumulator in a register
// (with 16 it puts one on the stack, and every round then waits on a store and a reload: not the peak).
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
// as 4 interleaved sub-streams: one stream a thread reads slower than torch's sum, 4 faster. (The products keep
// one contiguous stream a thread: in a pass, sub-streams and a dynamic schedule run slower; docs/cpu-step.md,
// "Tried and not kept".)
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

// The layout table: every struct the library takes as this compiler lays it out, for the ctypes mirror to be
// checked against (tests/test_native_structs_match_the_library.py). PARLEY_KERNEL_LAYOUT holds the entries of
// the kernels' structs (Lin, KV, Cache); the translation unit that defines the others appends theirs and exports
// the table as `parley_layout` (through layout_entry). A field added to a struct is added to its entries.
struct FieldLayout { const char* type; const char* field; int offset, size; };  // field "": the whole struct
#define PARLEY_STRUCT(S) {#S, "", 0, (int)sizeof(S)}
#define PARLEY_FIELD(S, F) {#S, #F, (int)offsetof(S, F), (int)sizeof(((S*)nullptr)->F)}
#define PARLEY_KERNEL_LAYOUT                                                                                        \
    PARLEY_STRUCT(Lin), PARLEY_FIELD(Lin, kind), PARLEY_FIELD(Lin, N), PARLEY_FIELD(Lin, K),                        \
    PARLEY_FIELD(Lin, group), PARLEY_FIELD(Lin, q), PARLEY_FIELD(Lin, s), PARLEY_FIELD(Lin, s16),                   \
    PARLEY_FIELD(Lin, z), PARLEY_FIELD(Lin, w), PARLEY_FIELD(Lin, bias), PARLEY_FIELD(Lin, act_block),              \
    PARLEY_FIELD(Lin, m16),                                                                                         \
    PARLEY_STRUCT(KV), PARLEY_FIELD(KV, k), PARLEY_FIELD(KV, v), PARLEY_FIELD(KV, ks), PARLEY_FIELD(KV, vs),        \
    PARLEY_FIELD(KV, vm),                                                                                           \
    PARLEY_STRUCT(Cache), PARLEY_FIELD(Cache, kind), PARLEY_FIELD(Cache, max_len), PARLEY_FIELD(Cache, layers)

// Entry i of `table` (0 past its end): struct name, field name ("" for the struct), offset, size.
template <size_t N>
static int layout_entry(const FieldLayout (&table)[N], int i, const char** type, const char** field, int* offset,
                        int* size) {
    if (i < 0 || i >= (int)N) return 0;
    const FieldLayout& e = table[i];
    *type = e.type; *field = e.field; *offset = e.offset; *size = e.size;
    return 1;
}
