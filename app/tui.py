"""`parley` / `parley chat`: the Textual chat app over the in-process engine."""

from __future__ import annotations

import argparse

from parley.app import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The same model and sampling flags as `parley generate`; the sliders start from these values.
    cli.add_model_arguments(parser)
    cli.add_sampling_arguments(parser)
    cli.add_remote_arguments(parser)
    parser.add_argument("--system", default="", help="system prompt for new conversations (F4 edits it)")


def run(args: argparse.Namespace) -> int:
    # Imported here so `parley --help` and the other subcommands do not pay for Textual and torch.
    from parley.app.chat_app import ParleyApp
    from parley.engine.engine import Engine

    params = cli.params_from_args(args)
    model, device = args.model, getattr(args, "device", None)

    def load(progress):
        if args.server:  # an OpenAI-compatible server instead of the in-process engine
            return cli.connect_remote(args, progress)
        kwargs = {"device": device} if device else {}
        return Engine.load(model, quant=args.quant, draft=args.draft, progress=progress,
                           compile=getattr(args, "compile", None), **kwargs)

    app = ParleyApp(load, model_ref=model, params=params, system_prompt=args.system or "")
    app.run()
    return app.return_code or 0
