"""Perplexity of one INT4 quantization variant of the embedded model, the quantization alone (weights dequantized
once, fp head), on `assets/heldout` and GPL-3: how docs/quantization.md's rows on tried ideas were measured.

    PYTHONPATH=<dir holding parley> python scripts/int4_variants.py VARIANT [--chunks 12]

VARIANT joins with `+` any of: `base` (the shipped first-run method, with its rotated down_proj), `nohd` (the
standard folder's down_proj alone, what transformers runs), `hd<BLOCK>` (the runtime rotation of down_proj's input
with blocks of BLOCK: models/quantize/hadamard.py; 256 ships), `hdg<SIZE>` (the rotated down_proj's own group
size; measured, not shipped), `downscale` (an AWQ scale for down_proj too, as
shipped before issue 21's fifth round), `nodownscale` (none: shipped), `vrot[SEED]` (each attention head's values
rotated by one orthogonal matrix, folded into v_proj's rows and o_proj's columns: an offline, exact change),
`rs<SEED>` (the residual rotation's seed), `g<SIZE>` (the group size; 64 ships), `nodistill` (no end-to-end
distillation of the scales and norms: models/quantize/distill.py, shipped in issue 21's sixth round), `de<EPOCHS>`
(its passes over the calibration sequences; 2 ship). (The second round's `had<BLOCK>`,
the same rotation before it shipped, is `nodownscale+hd<BLOCK>` now, with other signs.) Prints one JSON line
(perplexities with fp activations, and `*_act8` with every linear's input rounded to int8 in blocks as the native
step rounds it; the quantization's CPU seconds; the fp logits' change from the variant's folds) and appends it to
/tmp/int4_variants.jsonl. One thread, ~4-5 minutes of CPU per variant (the distillation is half of it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import Tensor

from parley.bench.quality import HELDOUT_DIR, dequantized, perplexity
from parley.models.loading import load_model
from parley.models.quantize import awq, hadamard
from parley.models.quantize.calibration import builtin_files, load_calibration
from parley.models.quantize.int4_linear import decoder_linears
from parley.models.quantize.methods import DISTILL_SAMPLES, evenly, first_run_settings
from parley.models.quantize.rotate import random_rotation
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

GPL3 = Path("/usr/share/common-licenses/GPL-3")


def int8_blocks(x: Tensor, block: int) -> Tensor:
    """x rounded as the native step quantizes a product's input: int8 per `block` inputs, scale max|x| / 127."""
    xb = x.reshape(*x.shape[:-1], -1, block)
    d = xb.abs().amax(-1, keepdim=True) / 127
    return (torch.round(xb / torch.where(d > 0, d, 1)).clamp(-127, 127) * d).reshape(x.shape)


@torch.no_grad()
def rotate_values(model, seed: int) -> None:
    hd = model.config.head_dim
    r = random_rotation(hd, seed)
    for block in model.layers:
        a = block.self_attn
        v = a.v_proj.weight.double().view(a.n_kv_heads, hd, -1)
        a.v_proj.weight.copy_((r.t() @ v).reshape(a.v_proj.weight.shape))  # each head's values v -> v R
        if a.v_proj.bias is not None:
            a.v_proj.bias.copy_((a.v_proj.bias.double().view(a.n_kv_heads, hd) @ r).reshape(-1))
        o = a.o_proj.weight.double().view(-1, a.n_heads, hd)
        a.o_proj.weight.copy_((o @ r).reshape(a.o_proj.weight.shape))  # ... and o_proj undoes it per head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant")
    parser.add_argument("--chunks", type=int, default=12, help="chunks of 512 tokens per text")
    parser.add_argument("--proxy", action="store_true", help="also the perplexity on the built-in calibration corpus")
    args = parser.parse_args()
    torch.set_num_threads(1)
    files = resolve(None)
    model = load_model(files, dtype=torch.float32, device="cpu")
    tok = load_tokenizer(files)

    def chunks(paths: list[Path], t: int = 512) -> Tensor:
        ids = [i for p in paths for i in tok.encode(p.read_text(encoding="utf-8").strip() + "\n\n")]
        n = min(args.chunks, len(ids) // t)
        return torch.tensor(ids[: n * t]).view(n, t)

    def logits(row: Tensor) -> Tensor:
        cache = model.new_cache(row.numel())
        cache.window = row.numel()
        with torch.inference_mode():
            return model(row[None], torch.arange(row.numel())[None], cache)[0]

    texts = {"heldout": chunks(sorted(HELDOUT_DIR.glob("*.txt"))), "gpl3": chunks([GPL3])}
    if args.proxy:  # what a first run could judge a quantization by: the built-in calibration corpus itself
        texts["builtin"] = chunks(builtin_files())
    before = logits(texts["heldout"][0])
    settings = first_run_settings(64, torch.device("cpu"))
    for part in args.variant.split("+"):
        if part.startswith("vrot"):
            rotate_values(model, int(part[4:] or 1))
        elif part.startswith("hdg"):  # the rotated down_proj's own group size
            settings.hadamard_group = int(part[3:])
        elif part.startswith("hd"):  # the shipped runtime rotation (models/quantize/hadamard.py), AWQ scale kept
            settings.hadamard_down = int(part[2:] or 256)
        elif part == "nohd":
            settings.hadamard_down = 0
        elif part == "nodownscale":
            settings.scale_down = False
        elif part == "downscale":
            settings.scale_down = True
        elif part.startswith("g") and part[1:].isdigit():
            settings.group_size = int(part[1:])
        elif part == "nodistill":
            settings.distill = None
        elif part.startswith("de"):  # the distillation's passes over its calibration sequences
            settings.distill.epochs = float(part[2:])
        elif part.startswith("rs"):
            settings.rotation_seed = int(part[2:])
        elif part != "base":
            raise SystemExit(f"unknown variant part {part!r}")
    fp_change = (logits(texts["heldout"][0]) - before).abs().max().item()
    calibration = load_calibration(tok.encode, 32 * (DISTILL_SAMPLES if settings.distill else 1), 256, "builtin")
    cpu = time.process_time()
    report = awq.awq_quantize(model, evenly(calibration.tokens, 32), settings, distill_tokens=calibration.tokens)
    if report.rotated_down:
        hadamard.install(model, report.rotated_down, report.down_diag, report.down_block)
    result = {"variant": args.variant, "quantize_cpu_s": round(time.process_time() - cpu, 1),
              "fp_max_logit_change": fp_change}
    dequantized(model)
    result.update({name: round(perplexity(model, c), 3) for name, c in texts.items()})
    for _, name, lin in decoder_linears(model):  # then int8 activations, as the native step quantizes them
        lin.register_forward_pre_hook(lambda _m, args, b=32 if name == "down_proj" else 64: (int8_blocks(args[0], b),))
    result.update({f"{name}_act8": round(perplexity(model, c), 3) for name, c in texts.items()})
    print(json.dumps(result), flush=True)
    with open("/tmp/int4_variants.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
