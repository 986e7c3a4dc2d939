"""The Slider widget on its own: keys, clamping, step snapping, mouse click and drag, Changed messages."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from parley.app.widgets.slider import Slider

pytestmark = pytest.mark.anyio


class SliderApp(App[None]):
    CSS = "Slider { width: 21; height: 1; }"

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[float] = []

    def compose(self) -> ComposeResult:
        yield Slider(0.5, minimum=0.0, maximum=2.0, step=0.1, id="s")

    def on_slider_changed(self, event: Slider.Changed) -> None:
        self.changes.append(event.value)


async def test_keyboard_steps_clamps_and_posts_changed():
    app = SliderApp()
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        slider.focus()
        await pilot.press("right", "right", "left")
        assert slider.value == 0.6
        await pilot.press("end", "right")
        assert slider.value == 2.0  # clamped
        await pilot.press("home")
        assert slider.value == 0.0
        await pilot.press("pageup")
        assert slider.value == 1.0
        await pilot.pause()
        assert app.changes == [0.6, 0.7, 0.6, 2.0, 0.0, 1.0]  # once per change, no repeat at the clamp


async def test_value_snaps_to_step_without_float_noise():
    slider = Slider(0.0, minimum=0.0, maximum=1.0, step=0.05)
    assert slider.validate_value(0.15000000000000002) == 0.15
    assert slider.validate_value(0.33) == 0.35
    assert slider.validate_value(-3) == 0.0
    integer = Slider(3, minimum=1, maximum=16, step=1)
    assert integer.validate_value(7.4) == 7 and isinstance(integer.validate_value(7.4), int)
    with pytest.raises(ValueError):
        Slider(0, minimum=1, maximum=1, step=1)


async def test_mouse_click_and_drag():
    app = SliderApp()
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        await pilot.click(Slider, offset=(20, 0))  # the right end
        assert slider.value == 2.0 and slider.has_focus
        await pilot.click(Slider, offset=(0, 0))
        assert slider.value == 0.0
        await pilot.click(Slider, offset=(10, 0))  # the middle
        assert slider.value == 1.0
        # drag: press at 5, move to 15, release
        await pilot.mouse_down(Slider, offset=(5, 0))
        assert slider.value == 0.5
        await pilot.hover(Slider, offset=(15, 0))
        assert slider.value == 1.5
        await pilot.mouse_up(Slider, offset=(15, 0))
        assert not slider._dragging
