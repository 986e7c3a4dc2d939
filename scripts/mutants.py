"""Mutation testing: plant each bug of a fixed list in a copy of the tree, run the tests meant to catch it.

    python scripts/mutants.py                 # every mutant, one at a time
    python scripts/mutants.py verify-99 sse   # only the mutants whose name contains one of these words
    python scripts/mutants.py --list
    python scripts/mutants.py --check         # only check that every mutant applies and its tests collect

Each mutant replaces one exact piece of source text (it must occur exactly once, or the mutant is reported
STALE: the code moved, update the mutant) in a temporary copy of the files git knows about, then runs only
its tests there (`pytest -x`, one process, its own cache folder). KILLED: a test failed. SURVIVED: every test
passed, which is a hole in the tests. ERROR: pytest could not run them (the mutant broke an import, or a
test file is missing), which proves nothing. The working tree is never modified. Exit status 0 only when
every mutant was killed.

To add one: append a `Mutant(name, file, old, new, tests)` to MUTANTS below: a plausible bug (an off-by-one,
a swapped operand, a dropped check), the smallest `old` text that pins the place, and the few test files
(or `file::test` ids) that should catch it. Run `python scripts/mutants.py NAME` and see it KILLED.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600  # one mutant's test run; a mutant that hangs its tests this long counts as killed (timeout)


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS: list[Mutant] = [
    # -- the four that an audit found surviving (issue 25) --
    Mutant("serve-key-prefix", "app/server/api.py",
           'if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):',
           'if not given.startswith(f"Bearer {key}"):',
           ("tests/test_serve_api_key.py",)),
    Mutant("verify-99-accepts-outright", "engine/speculative.py",
           "if qx > 0 and float(torch.rand((), generator=generator)) * qx < px:",
           "if qx > 0 and (px >= 0.99 * qx or float(torch.rand((), generator=generator)) * qx < px):",
           ("tests/test_speculative_verify_acceptance_rate.py",)),
    Mutant("native-merge-max-first-block", "kernels/cpu/attention.h",
           "for (int b = 0; b < nblocks; b++) gmax = std::fmax(gmax,",
           "for (int b = 0; b < 1; b++) gmax = std::fmax(gmax,",
           ("tests/test_native_step_sharp_attention.py",)),
    Mutant("native-qwen3-k-with-q-norm", "models/native_forward.cpp",
           "rmsnorm_row(k, L->k_norm, k, D, md->eps);",
           "rmsnorm_row(k, L->q_norm, k, D, md->eps);",
           ("tests/test_native_step_matches_pytorch_every_arch.py",)),
    # -- sampling --
    Mutant("sampling-top-k-drops-ties", "engine/sampling.py",
           'logits = logits.masked_fill(logits < kth, float("-inf"))',
           'logits = logits.masked_fill(logits <= kth, float("-inf"))',
           ("tests/test_sampling_probs.py", "tests/test_sampling_matches_float64_reference.py")),
    Mutant("sampling-top-p-inclusive", "engine/sampling.py",
           "kept = (before < top_p).sum(-1, keepdim=True)",
           "kept = (before <= top_p).sum(-1, keepdim=True)",
           ("tests/test_sampling_probs.py", "tests/test_sampling_nucleus_over_large_vocabularies.py",
            "tests/test_sampling_matches_float64_reference.py")),
    Mutant("sampling-min-p-absolute", "engine/sampling.py",
           "p = p.masked_fill(p < params.min_p * p.amax(-1, keepdim=True), 0.0)",
           "p = p.masked_fill(p < params.min_p, 0.0)",
           ("tests/test_sampling_probs.py", "tests/test_sampling_matches_float64_reference.py")),
    Mutant("sampling-repeat-penalty-inverted", "engine/sampling.py",
           "new = torch.where(old > 0, old / params.repeat_penalty, old * params.repeat_penalty)",
           "new = torch.where(old > 0, old * params.repeat_penalty, old / params.repeat_penalty)",
           ("tests/test_sampling_penalties.py",)),
    Mutant("sampling-presence-penalty-dropped", "engine/sampling.py",
           "new = new - counts * params.frequency_penalty - (counts > 0) * params.presence_penalty",
           "new = new - counts * params.frequency_penalty",
           ("tests/test_sampling_penalties.py",)),
    # -- verification --
    Mutant("verify-lookup-guess-taken-undrawn", "engine/speculative.py",
           "            out.append(sample(p[i], generator))\n            if out[-1] != x:\n                return out",
           "            out.append(x)",
           ("tests/test_speculative_verify_acceptance_rate.py",)),
    Mutant("verify-residual-from-p", "engine/speculative.py",
           "residual = (p[i] - q[i]).clamp_min(0.0)",
           "residual = p[i].clone()",
           ("tests/test_speculative_distribution_is_target.py::test_draft_model_verify_draws_follow_target",)),
    Mutant("verify-no-bonus-token", "engine/speculative.py",
           "    out.append(sample(p[len(draft)], generator))\n    return out",
           "    return out",
           ("tests/test_speculative_greedy_equals_plain.py",)),
    # -- prefix reuse --
    Mutant("prefix-one-token-too-many", "engine/prefix.py",
           "            hi = mid\n    return lo",
           "            hi = mid\n    return min(lo + 1, n)",
           ("tests/test_prefix_reuse_after_an_edit_matches_fresh.py",)),
    # -- drafting: the suffix trie and whether speculation pays --
    Mutant("shared-prefix-copies-one-position-short", "engine/cached_model.py",
           "self.cache.copy_positions(donor.cache, have, n)",
           "self.cache.copy_positions(donor.cache, have + 1, n)",
           ("tests/test_replies_sharing_a_prompt_prefix_copy_its_kv.py",)),
    Mutant("shared-prefix-never-waited-for", "engine/scheduler.py",
           "            if waited <= 2 * saved:\n                return True\n",
           "            if waited <= 2 * saved:\n                return False\n",
           ("tests/test_replies_sharing_a_prompt_prefix_copy_its_kv.py",)),
    Mutant("torch-shared-pass-sized-by-its-rows", "engine/cached_model.py",
           "spans, ROW_TILE, head=head)",
           "spans, len(tokens), head=head)",
           ("tests/test_torch_path_shared_passes_equal_solo.py",)),
    Mutant("torch-tiles-leave-prefill-alone", "engine/cached_model.py",
           "        if not model.row_tile:\n",
           "        if not model.row_tile or wanted >= len(tokens) - 1:\n",
           ("tests/test_torch_path_shared_passes_equal_solo.py::"
            "test_a_prompt_read_in_any_pieces_holds_the_same_kv_and_logits[none-int8]",)),
    Mutant("shared-pass-span-attends-in-one-product", "models/transformer.py",
           "        if self._triton(q):\n            return self._attend(q, k, v, None, pos, cache)\n",
           "        if True:\n"
           "            slots = torch.arange(-(-(int(pos.max()) + 1) // 256) * 256, device=q.device)\n"
           "            return self._attend(q, k, v, (slots <= pos[:, None])[None, None], pos, cache)\n",
           ("tests/test_torch_path_shared_passes_equal_solo.py::"
            "test_a_prompt_read_in_any_pieces_holds_the_same_kv_and_logits[none-int8]",)),
    Mutant("shared-pass-spans-ignore-sliding-windows", "models/transformer.py",
           "lo = max(0, p + 1 - self.window) if self.window else 0",
           "lo = 0",
           ("tests/test_forward_spans_rows_equal_their_sequence_alone.py",)),
    Mutant("suffix-trie-truncate-keeps-count", "engine/suffix_trie.py",
           "                count[c] -= 1\n",
           "",
           ("tests/test_suffix_trie_counts.py",)),
    Mutant("suffix-trie-bulk-nodes-forget-the-newest-follower", "engine/suffix_trie.py",
           "            best[b0:b1] = newest[b0:b1] = [token] * (b1 - b0)\n",
           "            best[b0:b1] = [token] * (b1 - b0)\n",
           ("tests/test_suffix_trie_counts.py",)),
    Mutant("suffix-trie-new-child-drops-its-siblings", "engine/suffix_trie.py",
           "self._next.extend([first[node] for node in older])",
           "self._next.extend([-1 for node in older])",
           ("tests/test_suffix_trie_counts.py",)),
    Mutant("speculation-pay-slope-off-by-one", "engine/speculation_pay.py",
           "median((seconds - base) / (tokens - 1) for",
           "median((seconds - base) / tokens for",
           ("tests/test_speculation_pay_choices.py",)),
    Mutant("speculation-pay-verdict-over-whole-reply", "engine/speculation_pay.py",
           "self._recent: deque[tuple[int, int]] = deque(maxlen=window)",
           "self._recent: deque[tuple[int, int]] = deque()",
           ("tests/test_speculation_pay_choices.py",)),
    # issue 33: a stall must move neither the pass-cost fit nor the verdict
    Mutant("speculation-pay-base-is-a-mean", "engine/speculation_pay.py",
           "return median(self._ones) if self._ones else None",
           "return sum(self._ones) / len(self._ones) if self._ones else None",
           ("tests/test_speculation_pay_choices.py",)),
    Mutant("speculation-pay-drafting-is-a-mean", "engine/speculation_pay.py",
           "drafting = median(self._drafting) if self._drafting else overhead",
           "drafting = sum(self._drafting) / len(self._drafting) if self._drafting else overhead",
           ("tests/test_speculation_pay_choices.py", "tests/test_auto_speculation_pauses_and_resumes.py")),
    Mutant("auto-judges-a-cheap-drafter", "engine/speculation_pay.py",
           'if params.speculation == "auto" and not drafter.cheap and (',
           'if params.speculation == "auto" and (',
           ("tests/test_auto_speculation_pauses_and_resumes.py",)),
    Mutant("scored-drafter-ramped-like-prompt-lookup", "engine/speculation_pay.py",
           "if drafter.scored and self.length.k:",
           "if False and drafter.scored and self.length.k:",
           ("tests/test_adaptive_draft_length.py",)),
    Mutant("scored-drafter-drafts-while-paused", "engine/speculation_pay.py",
           "if drafter.scored and self.length.k:",
           "if drafter.scored:",
           ("tests/test_adaptive_draft_length.py",)),
    Mutant("greedy-verify-skips-the-draw", "engine/speculative.py",
           "        uniform(generator)\n        out.append(x)",
           "        out.append(x)",
           ("tests/test_greedy_verification_equals_one_hot_sampling.py",)),
    Mutant("greedy-verify-keeps-a-missed-guess", "engine/speculative.py",
           "if i == len(draft) or x != draft[i]:",
           "if i == len(draft):",
           ("tests/test_greedy_verification_equals_one_hot_sampling.py",)),
    Mutant("openmp-spin-set-after-torch", "__init__.py",
           '_os.environ.setdefault("GOMP_SPINCOUNT", "300000")',
           'pass',
           ("tests/test_openmp_keeps_spinning_with_several_teams.py",)),
    Mutant("declined-guesses-never-reset-the-rest", "engine/speculation_pay.py",
           "            return\n        self._next_decline = 1\n",
           "            return\n",
           ("tests/test_adaptive_draft_length.py",)),
    Mutant("a-long-match-ends-declined-rests-too", "engine/speculation_pay.py",
           "return bool(self._pause) and not self._resting",
           "return bool(self._pause)",
           ("tests/test_adaptive_draft_length.py",)),
    Mutant("a-long-match-never-ends-a-pause", "engine/speculation_pay.py",
           "            self.length.resume()\n",
           "            pass\n",
           ("tests/test_adaptive_draft_length.py",)),
    # -- the native step --
    Mutant("native-causal-mask-sees-next", "kernels/cpu/attention.h",
           "std::min(p + 1, (b + 1) * ATT_BLOCK)",
           "std::min(p + 2, (b + 1) * ATT_BLOCK)",
           ("tests/test_native_step_matches_pytorch_every_arch.py",)),
    Mutant("native-sliding-window-one-key-too-many", "kernels/cpu/attention.h",
           "return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;",
           "return window > 0 && p - window > 0 ? p - window : 0;",
           ("tests/test_native_step_gemma3.py", "tests/test_native_step_matches_pytorch_every_arch.py")),
    Mutant("native-rope-sign", "kernels/cpu/rows.h",
           "x[i] = a * cos[i] - b * sin[i];",
           "x[i] = a * cos[i] + b * sin[i];",
           ("tests/test_native_step_matches_pytorch_every_arch.py",)),
    Mutant("native-ffn-norm-is-attn-norm", "models/native_forward.cpp",
           "rmsnorm_rows(x + (size_t)m0 * dim, L->ffn_norm, xn + (size_t)m0 * dim, nr, dim, md->eps);",
           "rmsnorm_rows(x + (size_t)m0 * dim, L->attn_norm, xn + (size_t)m0 * dim, nr, dim, md->eps);",
           ("tests/test_native_step_matches_pytorch_every_arch.py",)),
    # tiles that must not reorder a position's arithmetic (the AVX-512 paths: run on a VNNI machine)
    Mutant("native-down-tile-of-8-adds-halves-swapped", "kernels/cpu/products.h",
           "ib[r][1]: 32..63\n                for (int hf = 0; hf < 2; hf++) {",
           "ib[r][1]: 32..63\n                for (int hf0 = 0; hf0 < 2; hf0++) {"
           " const int hf = R == 8 ? 1 - hf0 : hf0;",
           ("tests/test_native_step_batch_invariance.py",)),
    Mutant("native-pair-tile-rounds-the-product-twice", "kernels/cpu/products.h",
           "_mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), s_16[c]), acc[c][r])",
           "_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(b),"
           " _mm512_mul_ps(_mm512_set1_ps(a->d[blk]), s_16[c])), acc[c][r])",
           ("tests/test_native_step_batch_invariance.py",)),
    Mutant("native-head-pair-tile-rounds-the-product-twice", "kernels/cpu/products.h",
           "acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(a->d[blk]), acc[c][r]);",
           "acc[c][r] = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(a->d[blk])), acc[c][r]);",
           ("tests/test_native_step_batch_invariance.py",)),
    # AMX tile multiplies (run on a CPU with AMX: elsewhere the code is not compiled and these survive)
    Mutant("amx-second-column-block-reads-the-firsts-zero-point", "kernels/cpu/products.h",
           "(const void*)sums[u][j][r]), zn[j][0], xs);",
           "(const void*)sums[u][j][r]), zn[0][0], xs);",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("amx-second-half-reads-first-half-zero-point", "kernels/cpu/products.h",
           "_mm512_dpwssd_epi32(t, zn[j][hf], _mm512_set1_epi32(a->xs[blk]));",
           "_mm512_dpwssd_epi32(t, zn[j][0], _mm512_set1_epi32(a->xs[blk]));",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("amx-minimum-rounded-twice", "kernels/cpu/products.h",
           "v = _mm512_fmadd_ps(_mm512_set1_ps(a->d[blk] * (float)a->xs[blk]), mn[j][hf], v);",
           "v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(a->d[blk] * (float)a->xs[blk]), mn[j][hf]), v);",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("amx-second-tile-of-positions-reads-the-first", "kernels/cpu/products.h",
           "if (two) _tile_loadd(3, x + (size_t)16 * K, K);",
           "if (two) _tile_loadd(3, x, K);",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("amx-high-nibbles-in-reverse-rows", "kernels/cpu/products.h",
           "_mm512_store_si512((void*)wb[8 + t], _mm512_and_si512(u, hi));",
           "_mm512_store_si512((void*)wb[15 - t], _mm512_and_si512(u, hi));",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("amx-tile-shapes-loaded-once-per-thread", "kernels/cpu/products.h",
           "static void amx_config(int ab) {\n    struct alignas(64) {",
           "static void amx_config(int ab) {\n    static thread_local int loaded = 0;\n    if (loaded == ab) return;\n"
           "    loaded = ab;\n    struct alignas(64) {",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("amx-tail-positions-skipped", "kernels/cpu/products.h",
           "m += (m1 - m) / 16 * 16;",
           "m += (m1 - m + 15) / 16 * 16;",
           ("tests/test_native_product_rows_equal_alone_every_kind.py",)),
    Mutant("native-norm-of-8-rows-sums-in-float", "kernels/cpu/rows.h",
           "            acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(v, v));",
           "            acc[r] = nr < 8 ? _mm512_add_pd(acc[r], _mm512_mul_pd(v, v))\n"
           "                : _mm512_cvtps_pd(_mm512_cvtpd_ps(_mm512_add_pd(acc[r], _mm512_mul_pd(v, v))));",
           ("tests/test_native_step_batch_invariance.py",)),
    Mutant("native-shared-scores-first-sweeps-scales", "kernels/cpu/attention.h",
           "_mm512_set1_ps(qsc[k0 + u])",
           "_mm512_set1_ps(qsc[u])",
           ("tests/test_native_step_batch_invariance.py",)),
    Mutant("bench-decode-share-against-one-probe", "bench/decode.py",
           "runs.append((rate, None if before is None else (before + probe()) / 2))",
           "runs.append((rate, before))",
           ("tests/test_bench_decode_share_per_run.py",)),
    # -- AWQ packing --
    Mutant("awq-pack-natural-order", "models/quantize/pack.py",
           "AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)\nMAX_INT",
           "AWQ_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)\nMAX_INT",
           ("tests/test_awq_pack_roundtrip.py",)),
    Mutant("awq-zero-point-subtracted", "models/quantize/pack.py",
           "q = (torch.round(g / scales[..., None]) + zeros[..., None]).clamp(0, MAX_INT)",
           "q = (torch.round(g / scales[..., None]) - zeros[..., None]).clamp(0, MAX_INT)",
           ("tests/test_awq_pack_roundtrip.py",)),
    # -- the server --
    Mutant("serve-stop-string-not-held-back", "app/server/api.py",
           "keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)",
           "keep = 0",
           ("tests/test_serve_stop_strings.py",)),
    Mutant("serve-queue-one-too-many", "app/server/api.py",
           "if len(self._waiting) >= self.size and (self._running >= self.parallel or self._waiting):",
           "if len(self._waiting) > self.size and (self._running >= self.parallel or self._waiting):",
           ("tests/test_serve_queue_429.py",)),
    # -- continuous batching (issue 34) --
    Mutant("batch-row-attends-the-first-sequence", "kernels/cpu/attention_plan.h",
           "        const Cache* c = sg.c;\n",
           "        const Cache* c = segs[0].c;\n",
           ("tests/test_native_batch_pass_rows_equal_their_sequence_alone.py",)),
    Mutant("batch-slot-never-given-back", "engine/scheduler.py",
           "            self.pool.give_back(seq.slot)\n",
           "",
           ("tests/test_engine_replies_run_side_by_side.py",)),
    Mutant("batch-old-slot-tokens-taken-as-prefix", "engine/session.py",
           "        reused = common_prefix(target.ids, ids)\n",
           "        reused = min(len(target.ids), len(ids))\n",
           ("tests/test_batched_replies_equal_solo_replies.py",)),
    Mutant("batch-every-guess-verified", "engine/scheduler.py",
           "        if (tokens - neg) / more <= tokens / now:\n            break\n",
           "",
           ("tests/test_speculation_backs_off_as_the_batch_grows.py",)),
    Mutant("serve-surrogates-unchecked", "app/server/api.py",
           '        _text(content, f"messages[{i}].content")\n',
           "",
           ("tests/test_serve_hostile_requests.py",)),
    Mutant("serve-tokenize-before-admission", "app/server/api.py",
           'engine, "messages" if chat else "prompt")\n    return req',
           'engine, "messages" if chat else "prompt")\n    check_length(req, engine)\n    return req',
           ("tests/test_serve_hostile_requests.py",)),
    Mutant("serve-no-socket-timeout", "app/server/api.py",
           "self.timeout = self.server.timeout_s",
           "self.timeout = None",
           ("tests/test_serve_hostile_requests.py::test_half_sent_requests_are_dropped",)),
    Mutant("serve-internal-text-in-500", "app/server/api.py",
           '"internal error: the server could not answer this request "\n'
           '                                       "(the details are in its log)"',
           'f"internal error: {type(e).__name__}: {e}"',
           ("tests/test_serve_hostile_requests.py",)),
    Mutant("serve-end-of-input-is-gone", "app/server/api.py",
           "                self._gone = True\n        return self._gone",
           "                self._gone = True\n        return True",
           ("tests/test_serve_half_closed_and_gone_clients.py",)),
    Mutant("serve-no-reset-probe", "app/server/api.py",
           '                self.wfile.write(b"HTTP/1.1 100 Continue\\r\\n\\r\\n")',
           "                pass",
           ("tests/test_serve_half_closed_and_gone_clients.py",)),
    Mutant("serve-whole-reply-unwatched", "app/server/api.py",
           "reply = consume(watched())",
           "reply = consume(events)",
           ("tests/test_serve_half_closed_and_gone_clients.py",)),
    # -- the SSE parser and the remote backend --
    Mutant("sse-multiline-data-glued", "engine/remote.py",
           'payload = "\\n".join(data)\n                data, size = [], 0',
           'payload = "".join(data)\n                data, size = [], 0',
           ("tests/test_remote_sse_parsing.py",)),
    Mutant("sse-space-after-colon-kept", "engine/remote.py",
           'data.append(line[5:].removeprefix(" "))',
           "data.append(line[5:])",
           ("tests/test_remote_sse_parsing.py",)),
    Mutant("sse-lines-unbounded", "engine/remote.py",
           "if len(pending) > max_line or any(len(line) > max_line for line in lines):",
           "if False:",
           ("tests/test_remote_hostile_servers.py::test_event_stream_lines_are_bounded",)),
    Mutant("remote-max-tokens-not-enforced", "engine/remote.py",
           "                    if figures.new_tokens >= params.max_new_tokens:",
           "                    if False:",
           ("tests/test_remote_hostile_servers.py",)),
    Mutant("remote-event-type-unchecked", "engine/remote.py",
           '        _expect(chunk, dict, "the event")\n',
           "",
           ("tests/test_remote_hostile_servers.py",)),
    # -- loading and templates --
    Mutant("loading-nan-weights-accepted", "models/loading.py",
           "if finite and not packed and not tensor.is_meta and not _all_finite(tensor):",
           "if False:",
           ("tests/test_bad_model_files_named.py",)),
    Mutant("loading-unverified-folder-not-scanned", "models/loading.py",
           "group_size, check_values=not files.verified",
           "group_size, check_values=False",
           ("tests/test_bad_model_files_named.py", "tests/test_hostile_model_files_one_line.py")),
    Mutant("template-concat-unbounded", "models/chat_template.py",
           "for concat in list(tree.find_all(nodes.Concat)):",
           "for concat in []:",
           ("tests/test_chat_template_memory_bounded.py",)),
    Mutant("tree-gather-wrong-ancestor", "kernels/cpu/tree.h",
           "row0 + t->base + t->path[(size_t)g * t->stride + j - t->base], out",
           "row0 + j, out",
           ("tests/test_native_tree_pass_equals_linear_paths.py",)),
    Mutant("tree-kept-path-not-moved", "engine/cached_model.py",
           "        if moved:",
           "        if False:",
           ("tests/test_native_tree_pass_equals_linear_paths.py",)),
    Mutant("tree-verify-row-by-depth", "engine/session.py",
           "logits[node : node + 1], params, history=[*context, *emitted]",
           "logits[len(emitted) : len(emitted) + 1], params, history=[*context, *emitted]",
           ("tests/test_speculative_tree_output_law.py",)),
    Mutant("tree-verify-penalty-without-path", "engine/session.py",
           "logits[node : node + 1], params, history=[*context, *emitted]",
           "logits[node : node + 1], params, history=context",
           ("tests/test_speculative_tree_output_law.py",)),
    # -- issue 21, fifth round: the online rotation before down_proj --
    Mutant("native-hadamard-half-block", "models/native_forward.cpp",
           "hadamard_row(h + j0, j1 - j0, L->down_diag + j0, L->down_block);",
           "hadamard_row(h + j0, j1 - j0, L->down_diag + j0, L->down_block / 2);",
           ("tests/test_down_hadamard_rotation_is_exact.py",)),
    Mutant("hadamard-stale-file-trusted", "models/quantize/hadamard.py",
           'if meta.get("model_sha256") != _weights_sha256(folder):',
           'if meta.get("model_sha256") is None:',
           ("tests/test_down_hadamard_folder_stays_standard.py",)),
    Mutant("hadamard-native-layout-shared", "models/native_step.py",
           "rotated = model.layers[0].mlp.down_diag is not None",
           "rotated = False",
           ("tests/test_native_layout_cache.py",)),
    Mutant("gguf-embedding-rows-out-of-order", "models/native_step.py",
           "rows = self._lookup(ids).to(torch.float32).contiguous()",
           "rows = self._lookup(ids.sort().values).to(torch.float32).contiguous()",
           ("tests/test_gguf_embedding_read_on_use.py",)),
    Mutant("native-given-rows-read-by-token", "models/native_forward.cpp",
           "std::memcpy(xm, (const float*)md->embed + (size_t)m * dim, dim * 4);",
           "std::memcpy(xm, (const float*)md->embed + (size_t)(tokens[m] % M) * dim, dim * 4);",
           ("tests/test_gguf_embedding_read_on_use.py",)),
    Mutant("gguf-embedding-lookup-unchecked", "models/loading.py",
           '_checked_block("embed_tokens.weight", table.lookup, source)',
           "table.lookup",
           ("tests/test_gguf_embedding_read_on_use.py",)),
    Mutant("tied-head-read-whole", "models/native_step.py",
           "if blocks and isinstance(module, WeightOnUse) and",
           "if blocks and isinstance(module, nn.Linear) and",
           ("tests/test_gguf_embedding_read_on_use.py",)),
    Mutant("gguf-layout-keyed-by-path-alone", "models/native_cache.py",
           "return Place(folder, _digest(ident), readers=",
           "return Place(folder, _digest(where), readers=",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("native-layout-stale-variant-kept", "models/native_cache.py",
           "            other.with_suffix(\".safetensors\").unlink(missing_ok=True)\n            other.unlink()\n",
           "            pass\n",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("gguf-layout-not-cached", "models/native_cache.py",
           "return gguf_place(files) if int4_gguf else None",
           "return None",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("safetensors-writer-tensors-unaligned", "cache_files.py",
           "order = sorted(flat, key=lambda k: (-flat[k].element_size(), k))",
           "order = sorted(flat)",
           ("tests/test_cache_files_atomic.py",)),
    Mutant("safetensors-writer-header-unpadded", "cache_files.py",
           'text += b" " * (-len(text) % 8)',
           'text += b""',
           ("tests/test_cache_files_atomic.py",)),
    Mutant("safetensors-writer-hashes-on-a-pool", "cache_files.py",
           "    hashing = threading.Thread(target=lambda: [h.update(c) for c in chunks"
           " if not (stop and stop.is_set())],\n"
           '                               name="parley-hash")\n'
           "    hashing.start()\n",
           "    from concurrent.futures import ThreadPoolExecutor\n"
           "    pool = ThreadPoolExecutor(1)\n"
           "    futures = [pool.submit(h.update, c) for c in chunks]\n"
           '    hashing = type("Join", (), {"join": lambda self: [f.result() for f in futures]})()\n',
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("cli-leaves-the-layout-write-to-the-interpreter", "app/cli.py",
           "    if not _finish_writes():\n",
           "    if False:\n",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("cancelled-layout-write-goes-on", "cache_files.py",
           "                if stop is not None and stop.is_set():",
           "                if False:",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("packing-heap-still-mmaps", "kernels/native.py",
           "    libc.mallopt(M_MMAP_MAX, 0)\n",
           "",
           ("tests/test_native_packing_reuses_the_heap.py",)),
    Mutant("packing-heap-trimmed", "kernels/native.py",
           "    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # an int: the largest power of two it takes\n",
           "",
           ("tests/test_native_packing_reuses_the_heap.py",)),
    Mutant("packing-heap-left-on", "kernels/native.py",
           "        libc.mallopt(M_MMAP_MAX, 65536)  # glibc's default\n",
           "",
           ("tests/test_native_packing_reuses_the_heap.py",)),
    Mutant("native-gate-up-packed-blocks-swapped", "models/native_step.py",
           "return {k: _interleave16(a[k], b[k], rows=1) for k in a}",
           "return {k: _interleave16(b[k], a[k], rows=1) for k in a}",
           ("tests/test_gguf_int4_weights_read_on_use.py", "tests/test_native_step_matches_pytorch_every_arch.py")),
    Mutant("native-gate-up-interleaved-by-16-blocks", "models/native_step.py",
           "return {k: _interleave16(a[k], b[k], rows=1) for k in a}",
           "return {k: _interleave16(a[k], b[k]) for k in a}",
           ("tests/test_gguf_int4_weights_read_on_use.py", "tests/test_native_step_matches_pytorch_every_arch.py")),
    Mutant("native-layout-saved-before-the-step-runs", "models/native_step.py",
           "native_cache.save_later(place, key, step.packed,",
           "native_cache.save(place, key, step.packed,",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("native-layout-read-before-its-write-ends", "models/native_cache.py",
           "        writing.wait()\n",
           "        pass\n",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("orphan-temporaries-kept", "models/native_cache.py",
           "        remove_orphans(place.folder)\n",
           "",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("orphan-removal-takes-a-running-writers-file", "cache_files.py",
           "if m and not pid_running(int(m.group(1))):",
           "if m:",
           ("tests/test_gguf_layout_cache.py",)),
    Mutant("distill-rest-outcome-dropped", "models/quantize/distill.py",
           "(logp - mine_k)).sum(-1) + rest.exp() * (rest - mine_rest)",
           "(logp - mine_k)).sum(-1)",
           ("tests/test_distill_kl_is_the_coarsened_kl.py",)),
    Mutant("distill-scales-not-stored", "models/quantize/distill.py",
           "            tuned.store()\n",
           "            pass\n",
           ("tests/test_distill_tunes_scales_and_norms_only.py",)),
    Mutant("distill-earlier-sequences-grads-dropped", "models/quantize/distill.py",
           "            for part in idx.split(micro):",
           "            for part in idx.split(micro):\n                opt.zero_grad(set_to_none=True)",
           ("tests/test_distill_tunes_scales_and_norms_only.py",)),
    Mutant("distill-standard-down-tuned", "models/quantize/awq.py",
           "    if report.rotated_down:\n        hadamard.install(",
           "    if False:\n        hadamard.install(",
           ("tests/test_distill_tunes_scales_and_norms_only.py",)),
    Mutant("rotated-gram-unsigned", "models/quantize/hadamard.py",
           "hd = h * diag.to(h.dtype)[:, None] * diag.to(h.dtype)[None, :]",
           "hd = h * diag.to(h.dtype)[:, None].abs() * diag.to(h.dtype)[None, :].abs()",
           ("tests/test_down_hadamard_rotation_is_exact.py::test_the_rotated_gram_matrix_is_the_gram_matrix_of_the_rotated_inputs",)),
    # -- hostile input (issue 36) --
    Mutant("serve-any-host", "app/server/api.py",
           "if name is None or not self.server.host_ok(name):",
           "if name is None:",
           ("tests/test_serve_refuses_web_pages_and_ambiguous_framing.py",)),
    Mutant("serve-second-content-length", "app/server/api.py",
           "if len(lengths) > 1 or (lengths and not lengths[0].strip().isdigit()):",
           "if lengths and not lengths[0].strip().isdigit():",
           ("tests/test_serve_refuses_web_pages_and_ambiguous_framing.py",)),
    Mutant("serve-text-plain-runs", "app/server/api.py",
           'if kind != "application/json":',
           'if kind not in ("application/json", "text/plain"):',
           ("tests/test_serve_refuses_web_pages_and_ambiguous_framing.py",)),
    Mutant("config-value-shown-whole", "models/config.py",
           "    return printable(_REPR.repr(value))",
           "    return repr(value)",
           ("tests/test_fuzz_hostile_inputs.py::test_fuzzed_inputs_end_cleanly[config]",)),
    Mutant("template-format-width-unchecked", "models/chat_template.py",
           "            _size_in_format(obj)  # which `call` cannot see through: the width is checked here",
           "            pass",
           ("tests/test_chat_template_memory_bounded.py",)),
    Mutant("template-nested-text-unsized", "models/chat_template.py",
           "                         finalize=_flat_size)",
           "                         )",
           ("tests/test_chat_template_memory_bounded.py",)),
    Mutant("gguf-kv-count-unchecked", "models/gguf_weights.py",
           '    room(n_kv, _MIN_KV, "the metadata")\n',
           "",
           ("tests/test_hostile_model_files_one_line.py::test_one_line_naming_the_file_and_what_to_do",)),
    Mutant("remote-no-progress-deadline", "engine/remote.py",
           "                        deadline.extend(PROGRESS_TIMEOUT_S, \"no text\")\n"
           "                        text += piece",
           "                        text += piece",
           ("tests/test_remote_reads_are_bounded.py",)),
    Mutant("remote-gzip-inflated", "engine/remote.py",
           'if encoding not in ("", "identity"):',
           'if encoding not in ("", "identity", "gzip"):',
           ("tests/test_remote_reads_are_bounded.py",)),
    # GGUF 4-bit import (--quant gguf): the blocks' layout, and the kernels' groups of 32 and minimums
    Mutant("gguf-q4-nibbles-swapped", "models/gguf_int4.py",
           "    torch.bitwise_and(t, 0xF, out=out[..., :16])\n    torch.bitwise_right_shift(t, 4, out=out[..., 16:])\n",
           "    torch.bitwise_and(t, 0xF, out=out[..., 16:])\n    torch.bitwise_right_shift(t, 4, out=out[..., :16])\n",
           ("tests/test_gguf_int4_import_is_exact.py",)),
    Mutant("gguf-q4k-high-scale-bits-dropped", "models/gguf_int4.py",
           "sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)", "sc[..., 4:] = s[..., 8:12] & 0xF",
           ("tests/test_gguf_int4_import_is_exact.py",)),
    Mutant("cpu-op-minimum-dropped", "kernels/cpu_int4.py",
           "offset = offset + torch.nn.functional.pad(mins.float(), (0, pad))", "offset = offset",
           ("tests/test_gguf_int4_import_is_exact.py",)),
    Mutant("native-minimum-dropped", "kernels/cpu/products.h",
           "if (L->m16) acc += (d[per * ci + k] * (float)xs[per * ci + k]) * half_to_f32(L->m16[i]);", "",
           ("tests/test_native_linear_reads_gguf_groups.py",)),
    Mutant("native-group32-one-group-per-chunk", "kernels/cpu/products.h",
           "(ci * 64 + k * 32) / G) * 16 + c;", "(ci * 64) / G) * 16 + c;",
           ("tests/test_native_linear_reads_gguf_groups.py",)),
    Mutant("random-gguf-qk-not-permuted", "bench/random_weights.py",
           "t = permute_rotary(t, config.n_kv_heads)", "t = t",
           ("tests/test_random_checkpoint_formats.py",)),
    Mutant("quant-none-fp32-whatever-it-needs", "models/weights_dtype.py",
           "if available is None or need + HEADROOM <= available:", "if True:",
           ("tests/test_quant_none_weights_fit.py",)),
    Mutant("quant-none-dtype-unused", "engine/engine.py",
           "dtype = weights_dtype(config, dev, str(files.path), files)",
           "weights_dtype(config, dev, str(files.path), files)",
           ("tests/test_quant_none_weights_fit.py",)),
    # -- issue 37: every route to the same weights finds the same INT4 folder --
    Mutant("quant-key-holds-the-name", "models/quantize/cache.py",
           'ident: dict[str, Any] = {"kind": files.kind}',
           'ident: dict[str, Any] = {"kind": files.kind, "ref": files.ref}',
           ("tests/test_quant_cache_same_weights_same_folder.py",)),
    Mutant("quant-key-path-unresolved", "models/quantize/cache.py",
           "ident.update(path=str(Path(files.path).resolve()),\n",
           "ident.update(path=str(files.path),\n",
           ("tests/test_quant_cache_same_weights_same_folder.py",)),
    Mutant("model-defaults-override-the-user", "app/conversation.py",
           "if name not in self.chosen and (name in values or name in before)}",
           "if (name in values or name in before)}",
           ("tests/test_app_sampling_defaults_from_the_model.py",)),
    Mutant("document-dropped-without-asking", "app/conversation.py",
           "        if documents and not checked:\n",
           "        if False:\n",
           ("tests/test_app_document_dropped_only_by_choice.py",)),
    # -- the streaming quantizer (issue 32) --
    Mutant("stream-resume-trusts-unhashed", "models/quantize/stream.py",
           "if Path(str(name)).name != name or not path.is_file() or file_sha256(path) != digest:",
           "if Path(str(name)).name != name or not path.is_file():",
           ("tests/test_quantize_resumes_after_a_kill.py::test_a_damaged_layer_file_is_not_trusted",)),
    Mutant("stream-state-before-layer-file", "models/quantize/stream.py",
           "        state.files[layer_file(i)] = save_safetensors_atomic(work / layer_file(i), tensors)\n",
           "        state.files[layer_file(i)] = ''\n        state.save(work)\n"
           "        state.files[layer_file(i)] = save_safetensors_atomic(work / layer_file(i), tensors)\n",
           ("tests/test_quantize_resumes_after_a_kill.py::test_a_half_written_layer_is_redone",)),
    Mutant("stream-carried-rows-skip-the-layer", "models/quantize/stream.py",
           "x_rest = run.block(block, x[others]) if bool(others.any()) else None",
           "x_rest = x[others] if bool(others.any()) else None",
           ("tests/test_quantize_answers_are_the_fp_models.py",)),
    Mutant("stream-head-norm-not-folded", "models/quantize/stream.py",
           '"lm_head.weight": _rows_rotated(head, q, norm)})',
           '"lm_head.weight": _rows_rotated(head, q)})',
           ("tests/test_quantize_answers_are_the_fp_models.py",)),
    # -- the thread tuner beside a busy core --
    Mutant("greedy-draws-skipped-when-seeded", "engine/session.py",
           "generator if params.seed is not None else None)",
           "None)",
           ("tests/test_greedy_verification_equals_one_hot_sampling.py",)),
    Mutant("start-count-own-cpu-counted-as-others", "engine/threads.py",
           "busy = (now.ticks[0] - since.ticks[0]) / hz - (now.own - since.own)",
           "busy = (now.ticks[0] - since.ticks[0]) / hz",
           ("tests/test_thread_tuner_follows_a_busy_machine.py",)),
    Mutant("start-count-iowait-busy", "engine/threads.py",
           "busy += f[0] + f[1] + f[2] + f[5] + f[6] + f[7]",
           "busy += f[0] + f[1] + f[2] + f[4] + f[5] + f[6] + f[7]",
           ("tests/test_thread_tuner_follows_a_busy_machine.py",)),
    Mutant("tuner-hopeless-probe-runs-its-steps", "engine/threads.py",
           "hopeless = n != self.current and usual is not None and seconds > self.hopeless * usual",
           "hopeless = False",
           ("tests/test_thread_tuner_follows_a_busy_machine.py",)),
    Mutant("tuner-probe-judged-per-token", "engine/threads.py",
           "if 2 * len(rel) >= len(steps):",
           "if False:",
           ("tests/test_thread_tuner_follows_a_busy_machine.py",)),
    Mutant("int4-release-keeps-the-copy", "models/read_on_use.py",
           "        if self.__dict__.get(\"_read\") is None:\n            return",
           "        if True:\n            return",
           ("tests/test_int4_weights_read_on_use.py",)),
    Mutant("int4-read-on-use-unchecked", "models/loading.py",
           "                _check_values(name, tensor, source, check_values)\n                if tensor.is_float",
           "                if tensor.is_float",
           ("tests/test_int4_weights_read_on_use.py",)),
    Mutant("int4-read-at-load", "engine/engine.py",
           "                           int4_on_use=native)",
           "                           int4_on_use=False)",
           ("tests/test_int4_weights_read_on_use.py",)),
    Mutant("native-fp16-embedding-read-as-bf16", "models/native_step.py",
           "torch.bfloat16: 1, torch.float16: 2}",
           "torch.bfloat16: 1, torch.float16: 1}",
           ("tests/test_int4_weights_read_on_use.py",)),
    Mutant("int4-embedding-widened-at-load", "models/loading.py",
           "        if tensor.is_floating_point() and not narrow:",
           "        if tensor.is_floating_point():",
           ("tests/test_int4_weights_read_on_use.py",)),
    Mutant("gguf-int4-decoded-at-load", "models/loading.py",
           "            readers = {}  # the decoder's",
           "            readers = None  # the decoder's",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("gguf-read-on-use-unchecked", "models/loading.py",
           "_attach_readers(model, {name: _checked(name, read, source) for name, read in readers.items()},",
           "_attach_readers(model, readers,",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("gguf-rows-read-unchecked", "models/loading.py",
           "{name: _checked_rows(name, read.rows, source) for name, read in readers.items()",
           "{name: read.rows for name, read in readers.items()",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("gguf-rows-q-not-unpermuted", "models/gguf_int4.py",
           "    q, scales, zeros, mins = (None if t is None else reorder(t) for t in q4_groups(kind, data))\n"
           "    return q, zeros, scales, mins",
           "    q, scales, zeros, mins = (None if t is None else reorder(t) for t in q4_groups(kind, data))\n"
           "    return q4_groups(kind, data)[0], zeros, scales, mins",
           ("tests/test_gguf_int4_import_is_exact.py",)),
    Mutant("gguf-rows-rounded-linear-unpermuted", "models/gguf_int4.py",
           "        w = reorder(fp)\n        scales, zeros = group_params(w, GROUP)",
           "        w = fp\n        scales, zeros = group_params(w, GROUP)",
           ("tests/test_gguf_int4_import_is_exact.py::test_a_linear_of_another_type_is_its_fp_weight_rounded",)),
    Mutant("q4-block-group-a-chunk-late", "kernels/cpu/products.h",
           "            left = cpg - 1;",
           "            left = cpg;",
           ("tests/test_native_linear_matches_reference.py",)),
    Mutant("q4-block-second-half-reads-first-half-scale", "kernels/cpu/products.h",
           "_mm512_mul_ps(_mm512_set1_ps(a->d[blk]), hf ? sh1 : sh0)",
           "_mm512_mul_ps(_mm512_set1_ps(a->d[blk]), sh0)",
           ("tests/test_native_linear_reads_gguf_groups.py",)),
    Mutant("gguf-head-row-blocks-unchecked", "models/loading.py",
           '{name: _checked_block(f"{name}.weight", read.row_block, source)',
           "{name: read.row_block",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("head-row-blocks-each-reads-the-first-rows", "models/read_on_use.py",
           "        return self._read(start, stop)",
           "        return self._read(0, stop - start)",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("int4-rows-minimums-dropped", "models/quantize/int4_linear.py",
           "return q, z, s, self.mins.t() if self.has_mins else None",
           "return q, z, s, None",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("native-fused-minimums-dropped-where-one-has-none", "models/native_step.py",
           "parts = [(q, z, s, torch.zeros_like(s) if mn is None else mn)",
           "parts = [(q, z, s, torch.zeros_like(s))",
           ("tests/test_gguf_int4_weights_read_on_use.py",)),
    Mutant("finite-check-skips-the-first-block", "models/loading.py",
           "for i in range(0, flat.numel(), block))",
           "for i in range(block, flat.numel(), block))",
           ("tests/test_bad_model_files_named.py",)),
    Mutant("gguf-dequantize-skips-a-row-block", "models/gguf_weights.py",
           "for r in range(0, data.shape[0] if data.ndim > 1 else 0, DEQUANT_ROWS):",
           "for r in range(DEQUANT_ROWS, data.shape[0] if data.ndim > 1 else 0, DEQUANT_ROWS):",
           ("tests/test_gguf_dequantize_in_row_blocks.py",)),
    Mutant("q8-head-last-block-unpadded", "kernels/native.py",
           "        n = (len(q) + 15) // 16 * 16\n",
           "        n = len(q)\n",
           ("tests/test_native_q8_head_packs_in_row_blocks.py",)),
    Mutant("self-draft-view-of-the-last-layers", "models/native_step.py",
           "(*self.layers[:n])",
           "(*self.layers[len(self.layers) - n:])",
           ("tests/test_self_draft_shares_the_targets_native_layers.py",)),
    Mutant("tuner-stale-usual", "engine/threads.py",
           "deque(maxlen=5)",
           "deque(maxlen=9)",
           ("tests/test_thread_tuner_follows_a_busy_machine.py",)),
    Mutant("tuner-hopeless-at-twice", "engine/threads.py",
           "hopeless: float = 2.5",
           "hopeless: float = 2.0",
           ("tests/test_thread_tuner_follows_a_busy_machine.py",)),
    Mutant("resting-reply-probes-its-match", "engine/speculation_pay.py",
           "if self.length.resumable and match is not None",
           "if self.length.k == 0 and match is not None",
           ("tests/test_adaptive_draft_length.py",)),
    Mutant("suffix-link-one-step-only", "engine/suffix_trie.py",
           "        while length and out[node] == 0:",
           "        if length and out[node] == 0:",
           ("tests/test_suffix_trie_draft_follows_the_longest_match.py",)),
    Mutant("suffix-link-to-the-new-node", "engine/suffix_trie.py",
           "self._link.extend(suffixes[seen : seen + m])",
           "self._link.extend(suffixes[seen + 1 : seen + m + 1])",
           ("tests/test_suffix_trie_draft_follows_the_longest_match.py",)),
    Mutant("row-cost-env-ignored", "engine/engine.py",
           "        self.pass_cost = pass_cost_from_env()",
           "        self.pass_cost = __import__('parley.engine.speculation_pay').engine.speculation_pay.PassCost()",
           ("tests/test_row_cost_env_fixes_the_pass_cost.py",)),
    Mutant("probe-buffer-a-few-times-the-l3", "bench/decode.py",
           "    return min(4096, max(1024, 32 * largest_kb // 1024))",
           "    return 256",
           ("tests/test_bench_decode_probe_reads_past_the_cache.py",)),
    Mutant("decode-split-rotation-reads-the-first-signs", "models/native_forward.cpp",
           "hadamard_row(h + j0, j1 - j0, L->down_diag + j0, L->down_block);",
           "hadamard_row(h + j0, j1 - j0, L->down_diag, L->down_block);",
           ("tests/test_native_decode_step_splits_rows_over_threads.py",)),
    Mutant("decode-split-keys-rotated-twice", "models/native_forward.cpp",
           "k0 = KVH * g / nsplit,",
           "k0 = 0,",
           ("tests/test_native_decode_step_splits_rows_over_threads.py",)),
    Mutant("decode-split-silu-range-off-by-a-block", "models/native_forward.cpp",
           "            else silu_mul_row(gu + (size_t)m * 2 * I, I, h, split, j0, j1);",
           "            else silu_mul_row(gu + (size_t)m * 2 * I, I, h, split, j0, j1 > j0 + 16 ? j1 - 16 : j1);",
           ("tests/test_native_decode_step_splits_rows_over_threads.py",)),
    Mutant("rmsnorm-one-row-drops-a-lane", "kernels/cpu/rows.h",
           "        const float rr = 1.0f / std::sqrt((float)(lanes_sum(ss[r]) / n) + eps);",
           "        const float rr = 1.0f / std::sqrt((float)((lanes_sum(ss[r]) - (nr == 1 ? ss[r][7] : 0.0)) / n)"
           " + eps);",
           ("tests/test_native_step_batch_invariance.py",)),
    Mutant("modelled-cost-not-given-to-the-engine", "bench/speculative.py",
           "        engine.pass_cost = ModelledPassCost(args.modelled)",
           "        pass",
           ("tests/test_bench_speculative_json.py",)),
    Mutant("modelled-cost-ignores-per-row", "engine/speculation_pay.py",
           "        return 1 + self.per_row * (tokens - 1)",
           "        return 1 + 0.2 * (tokens - 1)",
           ("tests/test_bench_speculative_json.py",)),
    Mutant("reset-cache-keeps-drafter-indexes", "engine/engine.py",
           "            slot.drafters.clear()\n",
           "",
           ("tests/test_reset_cache_forgets_the_drafters_indexes.py",)),
    Mutant("no-huge-pages-asked", "__init__.py",
           '_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")\n',
           "",
           ("tests/test_importing_parley_asks_for_huge_pages.py",)),
    Mutant("gptq-error-stays-out-of-its-block", "models/quantize/gptq.py",
           "            wb[j:].sub_(torch.outer(hb[j, j:], e))\n",
           "",
           ("tests/test_gptq_matches_the_column_by_column_reference.py",)),
    Mutant("bench-held-out-pick-sees-its-own-repeat", "bench/speculative.py",
           "median([t for i, t in enumerate(fixed[m]) if i != r])",
           "median(fixed[m])",
           ("tests/test_bench_auto_vs_best_fixed_is_held_out.py",)),
    Mutant("bench-held-out-ratio-across-repeats", "bench/speculative.py",
           "ratios.append(auto[r] / max(fixed[pick][r], 1e-9))",
           "ratios.append(auto[r] / max(median(fixed[pick]), 1e-9))",
           ("tests/test_bench_auto_vs_best_fixed_is_held_out.py",)),
]


def tree_files() -> list[str]:
    """The files git tracks plus the untracked ones it does not ignore: what a clean checkout would hold."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def stale(m: Mutant) -> str | None:
    """Why the mutant no longer applies (its file or text moved, a test file is gone), or None."""
    if not (ROOT / m.file).is_file():
        return f"{m.file} does not exist"
    count = (ROOT / m.file).read_text().count(m.old)
    if count != 1:
        return f"{m.file}: the text to replace occurs {count} times, not once"
    missing = [t for t in m.tests if not (ROOT / t.split("::")[0]).is_file()]
    return f"no test file {', '.join(missing)}" if missing else None


def pytest_in_copy(files: list[str], args: list[str], python: str, mutant: Mutant | None = None,
                   ) -> subprocess.CompletedProcess[str]:
    """Run pytest with `args` in a temporary copy of the tree (with `mutant` planted, if given)."""
    with tempfile.TemporaryDirectory(prefix=f"parley-mutant-{mutant.name if mutant else 'check'}-") as tmp:
        tree = Path(tmp) / "parley"  # the repository root is the `parley` package
        for f in files:
            dst = tree / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst)
        if mutant is not None:
            (tree / mutant.file).write_text((ROOT / mutant.file).read_text().replace(mutant.old, mutant.new))
        env = {**os.environ, "PYTHONPATH": tmp, "PARLEY_CACHE_DIR": str(Path(tmp) / "cache"),
               "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PARLEY_NATIVE_DIR", None)  # a mutated native source must be built, never taken from a cache
        return subprocess.run([python, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", *args],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def run_one(m: Mutant, files: list[str], python: str) -> tuple[str, float, str]:
    """(outcome, seconds, the last lines of pytest's output)."""
    why = stale(m)
    if why:
        return "STALE", 0.0, why
    start = time.monotonic()
    try:
        r = pytest_in_copy(files, ["-q", "-x", *m.tests], python, m)
    except subprocess.TimeoutExpired:
        return "KILLED (timeout)", time.monotonic() - start, ""
    seconds = time.monotonic() - start
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-3:])
    outcome = {0: "SURVIVED", 1: "KILLED"}.get(r.returncode, f"ERROR (pytest exit {r.returncode})")
    return outcome, seconds, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("only", nargs="*", help="run only the mutants whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--check", action="store_true", help="only check that each mutant applies; run nothing")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(w in m.name for w in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name:40} {m.file:32} {' '.join(m.tests)}")
        return 0
    if args.check:
        problems = [(m.name, why) for m in chosen if (why := stale(m))]
        for name, why in problems:
            print(f"STALE {name}: {why}")
        tests = sorted({t for m in chosen for t in m.tests if (ROOT / t.split("::")[0]).is_file()})
        collected = pytest_in_copy(tree_files(), ["-q", "--collect-only", *tests], args.python)
        if collected.returncode != 0:  # a test file that no longer imports: its mutants could only ERROR
            errors = [line for line in collected.stdout.splitlines() if line.startswith(("ERROR", "E "))]
            print("the mutants' tests do not collect:\n    " + "\n    ".join(errors[:20]))
        print(f"{len(chosen) - len(problems)} of {len(chosen)} mutants apply; their tests "
              f"{'collect' if collected.returncode == 0 else 'do NOT collect'}")
        return 1 if problems or collected.returncode != 0 else 0
    if not chosen:
        print(f"no mutant matches {args.only}; see --list", file=sys.stderr)
        return 2
    files = tree_files()
    killed = 0
    print(f"{'mutant':40} {'outcome':26} seconds")
    for m in chosen:
        outcome, seconds, tail = run_one(m, files, args.python)
        killed += outcome.startswith("KILLED")
        print(f"{m.name:40} {outcome:26} {seconds:7.1f}", flush=True)
        if not outcome.startswith("KILLED"):
            print("    " + tail.replace("\n", "\n    "), flush=True)
    print(f"{killed} of {len(chosen)} killed, {len(chosen) - killed} survived or could not run")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
