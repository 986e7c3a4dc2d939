"""`parley` / `parley chat`: the Textual chat app over the in-process engine."""

from __future__ import annotations

import argparse

from parley.engine.params import SPECULATION_MODES, GenerationParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="hub id (org/name[@rev]), local folder or .gguf file; default: this machine's default")
    parser.add_argument("--draft", default=None, help="draft model for speculative decoding (same tokenizer)")
    parser.add_argument("--speculation", choices=SPECULATION_MODES, default="auto",
                        help="speculative decoding mode (changeable live in the sliders panel)")
    parser.add_argument("--quant", choices=("awq", "none"), default="awq",
                        help="awq: INT4 weights (quantized once and cached); none: full precision")
    parser.add_argument("--system", default="", help="system prompt for new conversations")


def run(args: argparse.Namespace) -> int:
    # Imported here so `parley --help` and other subcommands do not pay for Textual and torch.
    from parley.app.chat_app import ParleyApp
    from parley.engine.engine import Engine

    model = getattr(args, "model", None)
    draft = getattr(args, "draft", None)
    quant = getattr(args, "quant", None) or "awq"
    params = GenerationParams(speculation=getattr(args, "speculation", None) or "auto")

    def load(progress):
        return Engine.load(model, quant=quant, draft=draft, progress=progress)

    app = ParleyApp(load, model_ref=model, params=params, system_prompt=getattr(args, "system", "") or "")
    app.run()
    return app.return_code or 0
