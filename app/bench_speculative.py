"""Speculative decoding at temperature 0: plain vs prompt lookup vs a draft model, in one run.

Scenarios: (a) summarising a ~1,900-token pasted document (assets/speculative/document.md), where
lookup can copy names and phrases; (b) free chat, where it mostly cannot and must cost ~nothing;
(c) a draft model (default: a self-draft, the target's first layers and head). Every figure comes
from `Session.reply` (the real loop and its `Stats`); runs of a scenario are interleaved and each
starts from an empty cache, so all see the same machine load and the same prefill. The per-pass cost
of the target against the number of tokens it verifies is printed too: it is what speculation trades.
"""

from __future__ import annotations

import argparse
import time
from importlib import resources

from .bench_harness import add_json_argument, emit, median_run

CHAT_PROMPT = "Give me three tips for keeping a sourdough starter healthy, with a sentence on why each works."
SUMMARY_PROMPT = "Write a detailed summary of the following document, section by section.\n\n"
PASS_TOKENS = (1, 2, 3, 5, 9, 17)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model ref (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--quant", choices=("none", "awq"), default="none", help="target weights: none (fp32) or awq")
    p.add_argument("--draft", default="self:15,awq",
                   help="comma-separated drafts for (c): 'self:N' (the target's first N layers), 'awq' (the "
                        "target's INT4 weights, quantized on first use), a model ref; 'none' to skip")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--draft-tokens", type=int, default=16, help="upper bound of the adaptive draft length (1..16)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved runs per configuration (median)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="decode exactly --new-tokens tokens (stop tokens do not end a reply)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default=None)
    add_json_argument(p)


def document() -> str:
    return resources.files("parley").joinpath("assets/speculative/document.md").read_text()


def one_reply(engine, messages: list[dict], speculation: str, new_tokens: int, draft_tokens: int) -> dict:
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
    return {"tok_s": round(stats.tokens_per_s, 2), "new_tokens": stats.new_tokens, "proposed": stats.proposed,
            "accepted": stats.accepted, "acceptance": round(stats.acceptance_rate, 3),
            "tokens_per_pass": round(stats.tokens_per_target_pass, 2), "ttft_s": round(stats.ttft_s, 2)}


def scenario(engine, messages: list[dict], drafts: dict, args: argparse.Namespace) -> dict:
    """Interleaved runs: plain, prompt lookup, then each draft model; the median run (by tok/s) of each
    is reported, with its ratio to plain."""
    configs = {"plain": ("off", None), "prompt_lookup": ("prompt-lookup", None),
               **{f"draft {spec}": ("draft", d) for spec, d in drafts.items()}}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, (mode, draft) in configs.items():
            engine.draft = draft
            runs[name].append(one_reply(engine, messages, mode, args.new_tokens, args.draft_tokens))
    engine.draft = None
    out = {name: median_run(rs, "tok_s") for name, rs in runs.items()}
    for name, r in out.items():
        if name != "plain" and out["plain"]["tok_s"] > 0:
            r["vs_plain"] = round(r["tok_s"] / out["plain"]["tok_s"], 3)
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
    head = dict(best)
    for _ in range(repeats):
        for t in PASS_TOKENS:
            start = time.perf_counter()
            engine.forward(context[-1:] * t)  # written after the context, never committed
            best[t] = min(best[t], time.perf_counter() - start)
            if engine.native is None:  # the native step's head runs inside its one call: not separable
                start = time.perf_counter()
                model.lm_head(x[:, :t])
                head[t] = min(head[t], time.perf_counter() - start)
    out = {"pass_ms": {str(t): round(s * 1e3, 1) for t, s in best.items()}}
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
    if args.ignore_eos:
        engine.tokenizer.stop_ids = frozenset()
    drafts = {}
    for spec in [d.strip() for d in (args.draft or "").split(",") if d.strip() and d.strip() != "none"]:
        drafts[spec] = load_draft(spec, engine.model, resolve(args.model), engine.tokenizer,
                                  native=engine.native is not None)
    doc = document()
    summarise = [{"role": "user", "content": SUMMARY_PROMPT + doc}]
    chat = [{"role": "user", "content": CHAT_PROMPT}]
    results: dict = {
        "model": engine.model_name, "quantization": engine.quantization, "drafts": list(drafts),
        "threads": torch.get_num_threads(), "new_tokens": args.new_tokens, "draft_tokens": args.draft_tokens,
        "document_tokens": engine.count_tokens(doc),
        "prompt_tokens": {"summarise": len(engine.tokenizer.encode_chat(summarise)),
                          "free_chat": len(engine.tokenizer.encode_chat(chat))},
    }
    for key, messages in (("summarise", summarise), ("free_chat", chat)):
        results[key] = scenario(engine, messages, drafts, args)
    results["target_cost_by_tokens"] = pass_cost(engine, engine.tokenizer.encode_chat(summarise))
    return emit(results, args.json, lambda results: lines(results, args))


def lines(results: dict, args: argparse.Namespace) -> list[str]:
    out = [f"model: {results['model']} ({results['quantization']})  threads: {results['threads']}  "
           f"temperature 0, {args.new_tokens} new tokens, draft length <= {args.draft_tokens}, "
           f"median of {args.repeats}"]
    for key, title in (("summarise", f"(a) summarise a {results['document_tokens']}-token pasted document"),
                       ("free_chat", "(b) free chat")):
        out.append(title)
        for mode, r in results[key].items():
            vs = f"  {r['vs_plain']:.2f}x plain" if "vs_plain" in r else ""
            out.append(f"  {mode:<16} {r['tok_s']:6.2f} tok/s{vs:<14}  accepted {r['accepted']}/{r['proposed']} "
                       f"({r['acceptance']:.0%})  {r['tokens_per_pass']:.2f} tokens/pass  "
                       f"{r['new_tokens']} tokens  ttft {r['ttft_s']:.1f}s")
    cost = results["target_cost_by_tokens"]
    one = cost["pass_ms"]["1"]
    out.append("target pass over T tokens at the document's depth: " + "  ".join(
        f"T={t}: {ms:.0f} ms ({ms / one:.2f}x)" for t, ms in cost["pass_ms"].items()))
    if "head_ms" in cost:
        out.append("  of which the output projection: " + "  ".join(
            f"T={t}: {ms:.1f} ms" for t, ms in cost["head_ms"].items()))
    return out
