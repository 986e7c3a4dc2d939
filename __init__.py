"""Parley: a local chat app for LLMs on your own machine."""

import os as _os

# OpenMP settings, here because libgomp reads them once, when torch loads it (the native step shares torch's
# libgomp). libgomp cuts its barrier spin from 300,000 rounds to 1,000 once more OpenMP threads exist than
# cores, and every thread that ever ran a parallel region keeps a team of its own: the thread that loaded the
# model and the scheduler's thread that decodes already make four on two cores, so each of a pass's barriers
# would sleep and wake (a 2-thread decode pass of the embedded model: 1.75 ms from the main thread,
# 6 ms from a second one). ACTIVE with libgomp's own default count makes the throttled spin the normal one.
# A value the user set stands.
OPENMP_SET = tuple(k for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k not in _os.environ)  # peers run without
_os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
_os.environ.setdefault("GOMP_SPINCOUNT", "300000")
# Transparent huge pages for torch's CPU allocations of 2 MB and more (the packed weights, the KV pool), read by
# torch at its first allocation. A decode pass streams every weight once, so with 4 KB pages it walks the page
# tables every 4 KB of each stream; with 2 MB pages one thread reads nearer the bandwidth (Llama-3.2-1B shape,
# one thread: 45.6 against 44.1 tok/s, 80.7% against 78.4% of the read bandwidth, six alternated pairs) and
# quantizing takes fewer page faults. It only asks (madvise), where the kernel's THP setting is `madvise`.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
