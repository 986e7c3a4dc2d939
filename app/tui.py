"""`parley` / `parley chat`: the Textual chat app over the in-process engine."""

from __future__ import annotations

import argparse
import atexit
import os
import sys

from parley.app import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The same model and sampling flags as `parley generate`; the sliders start from these values
    # (or from the values kept from the last run, for flags not given).
    cli.add_model_arguments(parser)
    cli.add_sampling_arguments(parser)
    cli.add_remote_arguments(parser)
    parser.add_argument("--system", default=None,
                        help="system prompt for new conversations (F4 edits it; default: the saved one)")


def build_app(args: argparse.Namespace):
    """The app for these flags, with the engine loaded (and quantized, on first use) in the background."""
    # Imported here so `parley --help` and the other subcommands do not pay for Textual and torch.
    from parley.app.chat_app import ParleyApp
    from parley.app.first_run import CHOICE_KEY, QuantizeInBackground, four_bit_gguf, model_key
    from parley.app.settings import KEPT_PARAMS, Settings

    settings = Settings()
    params = cli.params_from_args(args, base=settings.params())
    model = args.model

    def load(quant: str, progress):
        from parley.app.engine_from_args import engine_from_args

        return engine_from_args(args, progress=progress, quant=quant)

    def load_model(ref: str, progress):
        """Another model, picked in the app (F5): loaded (and quantized, the first time) as the flags say."""
        from parley.app.engine_from_args import engine_from_args

        # the same flags, another model; no draft (a draft belongs to the model it was chosen for)
        return engine_from_args(argparse.Namespace(**{**vars(args), "model": ref, "draft": None}), progress=progress)

    def stand_in() -> str | None:
        from parley.app.first_run import stand_in_fits
        from parley.models.resolve import resolve

        return stand_in_fits(resolve(model))

    # A first run of a .gguf already 4-bit chats on the file's own weights while Parley's INT4 is made
    choices = settings.get(CHOICE_KEY, {})
    loader = QuantizeInBackground(load, "none" if args.server else args.quant,
                                  file_weights=lambda: four_bit_gguf(model),  # a .gguf already 4-bit: offer it
                                  choice=choices.get(model_key(model)) if isinstance(choices, dict) else None,
                                  stand_in=stand_in)
    return ParleyApp(loader.load, upgrade_engine=loader.upgrade, load_model=None if args.server else load_model,
                     model_ref=model, params=params, settings=settings, system_prompt=args.system, first_run=loader,
                     chosen_params=frozenset(n for n in KEPT_PARAMS if getattr(args, n, None) is not None))


def run(args: argparse.Namespace) -> int:
    app = build_app(args)
    app.run()
    if app.return_code is not None:  # it ran and quit (None: it never ran)
        atexit.register(exit_now, app.return_code)
    return app.return_code or 0  # 1 after quitting from the "could not load the model" screen


def exit_now(code: int) -> None:
    """The first exit handler: end the process without the interpreter's teardown. With torch loaded that
    teardown takes seconds on a busy machine (the quit would look hung), and a daemon thread's own deadline
    (a browser tab's, web.py) cannot fire during it. Nothing is lost: the store and the settings are written
    as they change, and every cache write is atomic."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
