// The optional per-phase timer of a pass, for finding where its threads wait (build with
// PARLEY_NATIVE_FLAGS=-DPARLEY_PROFILE; never in the shipped build, where both macros below are empty).
//
// Each `omp for` of a pass (the products' and attention's own, and the forward pass's steps between them) then
// drops its implicit barrier (PARLEY_NOWAIT) and the phase ends in `prof_phase`: the thread's time since its
// previous phase ended counts as that phase's work, its time in the barrier as its wait. `parley_profile` (abi.h)
// reads and resets the sums (seconds per thread and phase; bench/passes.py --profile prints them, in the
// order of the PH_* phases below).

#pragma once
#include "simd.h"

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
