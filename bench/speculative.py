"""Speculative decoding at temperature 0: plain vs prompt lookup vs suffix match vs suffix trees vs auto vs a draft
model, in one run, with llama.cpp's `llama-lookup` on the same prompts when its build is present.

Scenarios: (a) summarising a ~1,900-token pasted document (assets/speculative/document.md), where
lookup can copy names and phrases; (a2) the same over a public text the project never tuned on (the
Apache-2.0 licence Debian ships, by default); (b) free chat, where drafting mostly cannot land and
must cost ~nothing; a draft model (default: none; e.g. a self-draft, the target's first layers and
head) runs in each when asked for. Every figure comes
from `Session.reply` (the real loop and its `Stats`); runs of a scenario are interleaved and each
starts from an empty cache, so all see the same machine load and the same prefill. The per-pass cost
of the target against the number of tokens it verifies is printed too: it is what speculation trades.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

from ..engine.speculation_pay import ModelledPassCost
from .harness import add_json_argument, emit, median, median_run, peer_env

CHAT_PROMPT = "Give me three tips for keeping a sourdough starter healthy, with a sentence on why each works."
SUMMARY_PROMPT = "Write a detailed summary of the following document, section by section.\n\n"
DOCUMENT_PROMPT = "Summarise the following document, quoting its key commands and terms.\n\n"
PUBLIC_DOCUMENT = "/usr/share/common-licenses/Apache-2.0"
PUBLIC_PROMPT = ("What does this licence let me do with the software, and what do I have to do in return? "
                 "Go through it section by section.\n\n")
MODES = {"plain": "off", "prompt_lookup": "prompt-lookup", "suffix": "suffix", "suffix_tree": "suffix-tree",
         "auto": "auto"}
FIXED = ("prompt_lookup", "suffix", "suffix_tree")  # the fixed drafters `auto` is set against
PEERS = Path.home() / ".cache" / "parley-peers"
PASS_TOKENS = (1, 2, 3, 5, 9, 17)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model ref (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--quant", choices=("none", "awq"), default="none", help="target weights: none (fp32) or awq")
    p.add_argument("--draft", default="none",
                   help="comma-separated draft models to run too: 'self:N' (the target's first N layers), 'awq' "
                        "(the target's INT4 weights, quantized on first use), a model ref; 'none' to skip")
    p.add_argument("--public-document", default=PUBLIC_DOCUMENT,
                   help="a text file the project did not write, for (a2); 'none' to skip")
    p.add_argument("--documents", nargs="?", const="debian", default=None, metavar="DIR",
                   help="summarise each document of DIR instead (left out: a suite of >= 8 texts Debian ships, "
                        "read on this machine), plus the free-chat prompt; per document, median and worst")
    p.add_argument("--prompt-budget", type=int, default=1400,
                   help="with --documents: each document is cut to about this many tokens")
    p.add_argument("--peer", default=str(PEERS),
                   help="llama.cpp peers folder (llama.cpp/build/bin/llama-lookup, smol-Q4_0.gguf): its lookup "
                        "decoding runs on the same prompts when present; 'none' to skip")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--draft-tokens", type=int, default=16, help="upper bound of the adaptive draft length (1..16)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved runs per configuration (median)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="decode exactly --new-tokens tokens (stop tokens do not end a reply)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default=None)
    p.add_argument("--modelled", type=float, default=None, metavar="PER_ROW",
                   help="also a figure the machine's load cannot move: each pass costed as 1 + PER_ROW x (rows - 1) "
                        "one-row passes, and the engine choosing how many guesses to verify by that cost instead "
                        "of the measured one, so at temperature 0 every run gives the same (e.g. 0.19: one more "
                        "row at ~1,400 tokens of context on a 2-core CPU). For comparing drafting policies")
    add_json_argument(p)


def document() -> str:
    return resources.files("parley").joinpath("assets/speculative/document.md").read_text()


def one_reply(engine, messages: list[dict], speculation: str, new_tokens: int, draft_tokens: int,
              per_row: float | None = None) -> dict:
    from ..engine.events import consume
    from ..engine.params import GenerationParams

    engine.reset_cache()
    if engine.draft is not None:
        engine.draft.reset()
    params = GenerationParams(temperature=0, max_new_tokens=new_tokens, speculation=speculation,
                              draft_tokens=draft_tokens)
    reply = consume(engine.session().reply(messages, params))
    stats, done = reply.stats, reply.done
    if done is None or done.reason == "error" or stats is None:
        raise RuntimeError(f"reply failed: {done}")
    out = {"tok_s": round(stats.tokens_per_s, 2), "new_tokens": stats.new_tokens, "proposed": stats.proposed,
           "accepted": stats.accepted, "acceptance": round(stats.acceptance_rate, 3),
           "tokens_per_pass": round(stats.tokens_per_target_pass, 2), "ttft_s": round(stats.ttft_s, 2),
           "drafter": stats.drafter, "note": stats.speculation_note}
    if per_row is not None and stats.tokens_per_target_pass > 0:  # the reply's passes, in modelled one-row passes
        passes = round(stats.new_tokens / stats.tokens_per_target_pass)
        out["modelled_cost"] = round(passes + per_row * stats.proposed, 3)
    return out


def scenario(engine, messages: list[dict], drafts: dict, args: argparse.Namespace) -> dict:
    """Interleaved runs: plain, prompt lookup, suffix match, auto, then each draft model; the median run
    (by tok/s) of each is reported, with its ratio to plain."""
    configs = {**{name: (mode, None) for name, mode in MODES.items()},
               **{f"draft {spec}": ("draft", d) for spec, d in drafts.items()}}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, (mode, draft) in configs.items():
            engine.draft = draft
            runs[name].append(one_reply(engine, messages, mode, args.new_tokens, args.draft_tokens, args.modelled))
    engine.draft = None
    out = {name: median_run(rs, "tok_s") for name, rs in runs.items()}
    for name, rs in runs.items():
        out[name]["tok_s_runs"] = [r["tok_s"] for r in rs]
    for name, r in out.items():
        if name != "plain" and out["plain"]["tok_s"] > 0:
            r["vs_plain"] = round(r["tok_s"] / out["plain"]["tok_s"], 3)
        if "modelled_cost" in r and "modelled_cost" in out["plain"]:  # the same tokens at temperature 0
            r["modelled_vs_plain"] = round(out["plain"]["modelled_cost"] / r["modelled_cost"], 3)
    return out


def pass_cost(engine, context: list[int], repeats: int = 5) -> dict[str, dict[str, float]]:
    """Milliseconds (min of runs) of one target forward over T tokens placed after `context`, and of
    the output projection alone over T rows: what a verification pass of T - 1 guesses costs."""
    import torch

    with torch.inference_mode():
        return _pass_cost(engine, context, repeats)


def _pass_cost(engine, context: list[int], repeats: int) -> dict[str, dict[str, float]]:
    import torch

    engine.reset_cache()
    engine.prefill(context)
    model = engine.model
    x = torch.randn(1, max(PASS_TOKENS), model.config.dim, dtype=model.norm.weight.dtype,
                    device=model.norm.weight.device)
    best = {t: float("inf") for t in PASS_TOKENS}
    head, tree = dict(best), dict(best)
    trees = engine.target.trees
    for _ in range(repeats):
        for t in PASS_TOKENS:
            start = time.perf_counter()
            engine.forward(context[-1:] * t)  # written after the context, never committed
            best[t] = min(best[t], time.perf_counter() - start)
            if trees and t >= 3:  # the same tokens as two branches off the root: what a tree adds to a pass
                half = (t - 1) // 2
                parents = [-1, *range(half), 0, *range(half + 1, t - 1)]
                start = time.perf_counter()
                engine.target.forward_tree(context[-1:] * t, parents)
                tree[t] = min(tree[t], time.perf_counter() - start)
            if engine.native is None:  # the native step's head runs inside its one call: not separable
                start = time.perf_counter()
                model.lm_head(x[:, :t])
                head[t] = min(head[t], time.perf_counter() - start)
    out = {"pass_ms": {str(t): round(s * 1e3, 1) for t, s in best.items()}}
    if trees:
        out["tree_pass_ms"] = {str(t): round(s * 1e3, 1) for t, s in tree.items() if t >= 3}
    if engine.native is None:
        out["head_ms"] = {str(t): round(s * 1e3, 1) for t, s in head.items()}
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from ..engine.engine import Engine
    from ..engine.speculative import load_draft
    from ..models.resolve import resolve

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.load(args.model, quant=args.quant, device=args.device)
    if args.modelled is not None:
        engine.pass_cost = ModelledPassCost(args.modelled)
    if args.ignore_eos:
        engine.tokenizer.stop_ids = frozenset()
    drafts = {}
    for spec in [d.strip() for d in (args.draft or "").split(",") if d.strip() and d.strip() != "none"]:
        drafts[spec] = load_draft(spec, engine.model, resolve(args.model), engine.tokenizer,
                                  native=engine.native is not None, target_step=engine.native)
    peer = find_peer(args.peer)
    if args.documents is not None:
        return emit(suite_results(engine, drafts, peer, args), args.json, lambda results: suite_lines(results, args))
    doc = document()
    cases = {"summarise": [{"role": "user", "content": SUMMARY_PROMPT + doc}]}
    if args.public_document != "none":
        cases["summarise_public"] = [{"role": "user", "content": PUBLIC_PROMPT + public_document(args.public_document)}]
    cases["free_chat"] = [{"role": "user", "content": CHAT_PROMPT}]
    results: dict = {
        "model": engine.model_name, "quantization": engine.quantization, "drafts": list(drafts),
        "threads": torch.get_num_threads(), "new_tokens": args.new_tokens, "draft_tokens": args.draft_tokens,
        "document_tokens": engine.count_tokens(doc),
        "public_document": args.public_document if "summarise_public" in cases else None,
        "prompt_tokens": {key: len(engine.tokenizer.encode_chat(m)) for key, m in cases.items()},
    }
    for key, messages in cases.items():
        results[key] = scenario(engine, messages, drafts, args)
        if peer:
            results[key].update(llama_lookup(peer, engine.tokenizer.render_chat(messages),
                                             results["prompt_tokens"][key], args))
    results["target_cost_by_tokens"] = pass_cost(engine, engine.tokenizer.encode_chat(cases["summarise"]))
    return emit(results, args.json, lambda results: lines(results, args))


def lines(results: dict, args: argparse.Namespace) -> list[str]:
    out = [f"model: {results['model']} ({results['quantization']})  threads: {results['threads']}  "
           f"temperature 0, {args.new_tokens} new tokens, draft length <= {args.draft_tokens}, "
           f"median of {args.repeats}"]
    titles = {"summarise": f"(a) summarise a {results['document_tokens']}-token pasted document",
              "summarise_public": f"(a2) summarise {results['public_document']} (a text the project did not write)",
              "free_chat": "(b) free chat"}
    for key, title in titles.items():
        if key not in results:
            continue
        out.append(f"{title}: {results['prompt_tokens'][key]} prompt tokens")
        for mode, r in results[key].items():
            if "error" in r:
                out.append(f"  {mode:<16} {r['error']}")
                continue
            vs = f"  {r['vs_plain']:.2f}x plain" if "vs_plain" in r else ""
            note = f"  [{r['note']}]" if r.get("note") else ""
            out.append(f"  {mode:<16} {r['tok_s']:6.2f} tok/s{vs:<14}  accepted {r['accepted']}/{r['proposed']} "
                       f"({r['acceptance']:.0%})  {r['tokens_per_pass']:.2f} tokens/pass  "
                       f"{r['new_tokens']} tokens  ttft {r['ttft_s']:.1f}s{note}")
    cost = results["target_cost_by_tokens"]
    one = cost["pass_ms"]["1"]
    out.append("target pass over T tokens at the document's depth: " + "  ".join(
        f"T={t}: {ms:.0f} ms ({ms / one:.2f}x)" for t, ms in cost["pass_ms"].items()))
    if "tree_pass_ms" in cost:
        out.append("  the same T tokens as a tree of two branches: " + "  ".join(
            f"T={t}: {ms:.0f} ms ({ms / cost['pass_ms'][t]:.2f}x the chain)" for t, ms in cost["tree_pass_ms"].items()))
    if "head_ms" in cost:
        out.append("  of which the output projection: " + "  ".join(
            f"T={t}: {ms:.1f} ms" for t, ms in cost["head_ms"].items()))
    return out


def suite_results(engine, drafts: dict, peer, args: argparse.Namespace) -> dict:
    """Every document of the suite (or folder) cut to the prompt budget and summarised, then free chat: each
    mode's figures, and over the documents the median and the worst of each ratio."""
    import torch

    from . import documents

    docs, notes = documents.suite() if args.documents == "debian" else (documents.folder(args.documents), [])
    results: dict = {"model": engine.model_name, "quantization": engine.quantization, "drafts": list(drafts),
                     "threads": torch.get_num_threads(), "new_tokens": args.new_tokens,
                     "draft_tokens": args.draft_tokens, "documents_from": args.documents, "notes": notes,
                     "documents": {}}
    cases = {name: [{"role": "user", "content": DOCUMENT_PROMPT + documents.trim(text, engine.count_tokens,
                                                                                args.prompt_budget)}]
             for name, text in docs}
    cases["free chat"] = [{"role": "user", "content": CHAT_PROMPT}]
    for name, messages in cases.items():
        depth = len(engine.tokenizer.encode_chat(messages))
        figures = scenario(engine, messages, drafts, args)
        if peer:
            figures.update(llama_lookup(peer, engine.tokenizer.render_chat(messages), depth, args))
        for r in figures.values():  # auto against the best fixed drafter of this prompt
            r.setdefault("vs_plain", 1.0)
        for key in ("tok_s", "modelled_vs_plain") if args.modelled is not None else ("tok_s",):
            fixed = [r[key] for mode, r in figures.items() if mode in FIXED]
            best = "vs_best_fixed" if key == "tok_s" else "modelled_vs_best_fixed"
            figures["auto"][best] = round(figures["auto"][key] / max(max(fixed), 1e-9), 3)
        figures["auto"]["vs_best_fixed_held_out"] = round(held_out_ratio(
            figures["auto"]["tok_s_runs"], {m: figures[m]["tok_s_runs"] for m in FIXED if m in figures}), 3)
        results["documents"][name] = {"prompt_tokens": depth, "modes": figures}
    summarised = {n: d for n, d in results["documents"].items() if n != "free chat"}
    modes = list(next(iter(results["documents"].values()))["modes"])
    results["summary"] = {}
    for label, pick in (("median", median), ("worst", min)):
        row = {}
        for mode in modes:
            rs = [d["modes"][mode] for d in summarised.values() if "tok_s" in d["modes"].get(mode, {})]
            if rs:
                row[mode] = {key: round(pick(r[key] for r in rs), 3)
                             for key in ("tok_s", "vs_plain", "tokens_per_pass", "modelled_vs_plain", "vs_best_fixed",
                                         "modelled_vs_best_fixed", "vs_best_fixed_held_out")
                             if all(key in r for r in rs)}
        results["summary"][label] = row
    return results


def held_out_ratio(auto: list[float], fixed: dict[str, list[float]]) -> float:
    """`auto` against the best fixed drafter without the pick's own noise: for each repeat r, the fixed drafter
    with the highest median tok/s over the other repeats, and auto's tok/s over that drafter's in repeat r (the
    two ran one after the other); the median of those ratios. Why: the largest of several noisy medians
    overstates the best drafter's speed (three identical drafters, each median off by a few percent, put an
    identical `auto` a few percent behind "the best"), and a ratio within a repeat cancels the load that moves
    between repeats. With one repeat there is no other to pick from: the plain ratio to the best."""
    n = len(auto)
    if n == 1:
        return auto[0] / max(max(runs[0] for runs in fixed.values()), 1e-9)
    ratios = []
    for r in range(n):
        pick = max(fixed, key=lambda m: median([t for i, t in enumerate(fixed[m]) if i != r]))
        ratios.append(auto[r] / max(fixed[pick][r], 1e-9))
    return median(ratios)


def suite_lines(results: dict, args: argparse.Namespace) -> list[str]:
    """One row per prompt: plain tok/s, then each mode's ratio to plain and tokens per target pass."""
    out = [f"model: {results['model']} ({results['quantization']})  threads: {results['threads']}  "
           f"temperature 0, {args.new_tokens} new tokens, draft length <= {args.draft_tokens}, "
           f"median of {args.repeats}; documents: {results['documents_from']} (~{args.prompt_budget} tokens each)",
           *(f"note: {n}" for n in results["notes"])]
    modes = [m for m in next(iter(results["documents"].values()))["modes"] if m not in ("plain", "llama.cpp plain")]
    out.append(f"{'prompt':<20} {'tokens':>6} {'plain tok/s':>11}  " + "  ".join(f"{m:>16}" for m in modes)
               + "  (ratio to plain / tokens per pass)")

    def cells(figures: dict) -> str:
        return "  ".join(f"{figures[m]['vs_plain']:>9.2f}x/{figures[m]['tokens_per_pass']:<5.2f}"
                         if "tok_s" in figures.get(m, {}) else f"{'-':>16}" for m in modes)

    def versus(auto: dict) -> str:
        modelled = auto.get("modelled_vs_best_fixed")
        return (f"  auto/best fixed {auto['vs_best_fixed']:.2f}, held out {auto['vs_best_fixed_held_out']:.2f}"
                + (f" (modelled {modelled:.3f})" if modelled else ""))

    for name, d in results["documents"].items():
        out.append(f"{name:<20} {d['prompt_tokens']:>6} {d['modes']['plain']['tok_s']:>11.1f}  {cells(d['modes'])}"
                   + versus(d["modes"]["auto"]))
    for label, row in results["summary"].items():
        out.append(f"{label + ' (documents)':<20} {'':>6} {row['plain']['tok_s']:>11.1f}  {cells(row)}"
                   + versus(row["auto"]))
    if args.modelled is not None:
        median_row = results["summary"]["median"]
        out.append(f"modelled (a pass of T rows costs 1 + {args.modelled} x (T - 1) one-row passes), median tokens per "
                   "modelled pass: " + "  ".join(f"{m} {median_row[m]['modelled_vs_plain']:.3f}" for m in modes
                                                 if "modelled_vs_plain" in median_row.get(m, {})))
    return out


def public_document(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"--public-document {path}: cannot read it as UTF-8 text ({e}); give another text file "
                         "or 'none' to skip that case") from None


def find_peer(folder: str) -> tuple[Path, Path] | None:
    """llama.cpp's llama-lookup and llama-bench folder and its Q4_0 model, when built (scripts/llama_cpp.sh build)."""
    if folder == "none":
        return None
    bin_dir, model = Path(folder) / "llama.cpp" / "build" / "bin", Path(folder) / "smol-Q4_0.gguf"
    ok = (bin_dir / "llama-lookup").exists() and (bin_dir / "llama-bench").exists() and model.exists()
    return (bin_dir, model) if ok else None


def llama_lookup(peer: tuple[Path, Path], prompt: str, depth: int, args: argparse.Namespace) -> dict:
    """llama.cpp on the same rendered prompt: `llama-lookup` (n-gram lookup decoding, temperature 0) and
    its plain decode at the prompt's depth (`llama-bench -d`), as rows beside Parley's."""
    bin_dir, model = peer
    threads = str(args.threads or __import__("torch").get_num_threads())
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(prompt)
        f.flush()
        command = [str(bin_dir / "llama-lookup"), "-m", str(model), "-f", f.name, "-n", str(args.new_tokens),
                   "--temp", "0", "-t", threads, "-c", str(depth + args.new_tokens + 64),
                   "-b", str(depth + 64),  # the whole prompt in one batch (past 2,048 tokens it stops)
                   "--spec-draft-n-max", str(args.draft_tokens), *(["--ignore-eos"] if args.ignore_eos else [])]
        run = subprocess.run(command, capture_output=True, text=True, timeout=900, env=peer_env())
    log = run.stdout + run.stderr
    figures = {k: re.search(rf"{k}\s*=\s*([\d.]+)", log) for k in ("n_predict", "n_drafted", "n_accept")}
    speed = re.search(r"decoded\s+\d+\s+tokens in\s+[\d.]+\s+seconds, speed:\s+([\d.]+)", log)
    if run.returncode or speed is None or not all(figures.values()):
        return {"llama.cpp lookup": {"error": f"llama-lookup rc={run.returncode}: {log.strip()[-300:]}"}}
    n, drafted, accepted = (int(float(figures[k].group(1))) for k in ("n_predict", "n_drafted", "n_accept"))
    plain = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(model), "-t", threads, "-p", "0",
                            "-n", str(args.new_tokens), "-d", str(depth), "-r", "1", "-o", "jsonl"],
                           capture_output=True, text=True, timeout=600, env=peer_env())
    plain_tok_s = float(re.search(r'"avg_ts":\s*([\d.]+)', plain.stdout).group(1)) if plain.returncode == 0 else 0.0
    lookup = {"tok_s": float(speed.group(1)), "new_tokens": n, "proposed": drafted, "accepted": accepted,
              "acceptance": round(accepted / drafted, 3) if drafted else 0.0,  # a pass decides its accepts + 1
              "tokens_per_pass": round(n / max(1, n - accepted), 2), "ttft_s": 0.0}
    if plain_tok_s:
        lookup["vs_plain"] = round(lookup["tok_s"] / plain_tok_s, 3)
    return {"llama.cpp plain": {"tok_s": plain_tok_s, "new_tokens": args.new_tokens, "proposed": 0, "accepted": 0,
                                "acceptance": 0.0, "tokens_per_pass": 1.0, "ttft_s": 0.0}, "llama.cpp lookup": lookup}
