"""Write the README screenshots (SVG) of the chat app, driven by Pilot over the scripted fake engine.

    .venv/bin/python scripts/screenshots.py            # -> assets/screenshots/*.svg
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from app_support import make_app, ready, send, wait_until  # noqa: E402
from fake_engine import FakeEngine, loader  # noqa: E402

from parley.models.progress import Progress  # noqa: E402

OUT = ROOT / "assets" / "screenshots"

REPLY = (
    "Speculative decoding lets a cheap **drafter** guess the next few tokens; the big model then checks "
    "all of them in *one* forward pass and keeps the longest prefix it agrees with.\n\n"
    "```python\nfor token, p, q in zip(draft, p_target, q_draft):\n"
    "    if random() < min(1, p[token] / q[token]):\n        accept(token)\n    else:\n"
    "        resample(normalize(max(0, p - q)))\n        break\n```\n\n"
    "The output distribution is exactly the target model's: only the speed changes."
)


async def chat_with_sliders(path: Path, size: tuple[int, int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app, engine = make_app(Path(tmp), FakeEngine(replies=[REPLY], delay=0.05))
        async with app.run_test(size=size) as pilot:
            await ready(app, pilot)
            app.prompt.cursor_blink = False
            await send(app, pilot, "How does speculative decoding stay exact?")
            # Mid-reply: move the temperature slider and catch the panel saying where it applies.
            await wait_until(lambda: len(engine.calls[0].shown) > 200, timeout=20)
            await pilot.press("f2", "right", "right", "right", "right")
            await pilot.pause(0.15)
            app.save_screenshot(filename=path.name, path=str(path.parent))
            await pilot.press("escape")


async def first_run(path: Path, size: tuple[int, int]) -> None:
    gate = threading.Event()
    engine = FakeEngine()
    script = [
        Progress("download", 1.9e9, 3.4e9, "B", "model-00001-of-00002.safetensors"),
        Progress("quantize", 7, 28, "layer", eta_s=95.0),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        app, _ = make_app(Path(tmp), engine, load=loader(engine, script, block=gate), model_ref="Qwen/Qwen2.5-1.5B")
        try:
            async with app.run_test(size=size) as pilot:
                await wait_until(lambda: "layer 7" in str(app.screen.query_one("#quantize-detail").render()))
                await pilot.pause()
                app.save_screenshot(filename=path.name, path=str(path.parent))
        finally:
            gate.set()


async def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    await chat_with_sliders(OUT / "chat-sliders.svg", (120, 36))
    await chat_with_sliders(OUT / "chat-sliders-80x24.svg", (80, 24))
    await first_run(OUT / "first-run.svg", (100, 24))
    for svg in sorted(OUT.glob("*.svg")):
        print(svg.relative_to(ROOT))


if __name__ == "__main__":
    asyncio.run(main())
