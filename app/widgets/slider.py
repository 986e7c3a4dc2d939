"""A small focusable slider. Textual core has none, and the published one is GPL, so we own this one."""

from __future__ import annotations

from decimal import Decimal

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget


class Slider(Widget, can_focus=True):
    """A value in [minimum, maximum], snapped to `step`; keyboard and mouse; posts `Slider.Changed`."""

    BINDINGS = [
        Binding("left,h", "nudge(-1)", "Less", show=False),
        Binding("right,l", "nudge(1)", "More", show=False),
        Binding("pagedown", "nudge(-10)", show=False),
        Binding("pageup", "nudge(10)", show=False),
        Binding("home", "to_end(0)", show=False),
        Binding("end", "to_end(1)", show=False),
    ]
    COMPONENT_CLASSES = {"slider--fill", "slider--thumb", "slider--track"}

    value: reactive[float] = reactive(0.0, init=False)

    class Changed(Message):
        """The value changed (by key, mouse or code)."""

        def __init__(self, slider: Slider, value: float) -> None:
            super().__init__()
            self.slider = slider
            self.value = value

        @property
        def control(self) -> Slider:
            return self.slider

    def __init__(
        self,
        value: float,
        *,
        minimum: float,
        maximum: float,
        step: float,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        if maximum <= minimum or step <= 0:
            raise ValueError(f"Slider needs minimum < maximum and step > 0, got {minimum}, {maximum}, {step}")
        super().__init__(name=name, id=id, classes=classes)
        self.minimum = minimum
        self.maximum = maximum
        self.step = step
        # Decimal places of the step, so 0.05 * 3 shows as 0.15 and not 0.15000000000000002.
        self._places = max(0, -Decimal(str(step)).as_tuple().exponent)
        self._dragging = False
        self.set_reactive(Slider.value, self.validate_value(value))

    def validate_value(self, value: float) -> float:
        value = min(self.maximum, max(self.minimum, value))
        snapped = self.minimum + round((value - self.minimum) / self.step) * self.step
        snapped = round(min(self.maximum, snapped), self._places)
        return int(snapped) if self._places == 0 else snapped

    def watch_value(self, value: float) -> None:
        self.post_message(self.Changed(self, value))

    @property
    def fraction(self) -> float:
        return (self.value - self.minimum) / (self.maximum - self.minimum)

    def render(self) -> Text:
        width = max(3, self.content_size.width)
        thumb = round(self.fraction * (width - 1))
        text = Text(no_wrap=True, overflow="crop")
        text.append("━" * thumb, self.get_component_rich_style("slider--fill"))
        text.append("●", self.get_component_rich_style("slider--thumb"))
        text.append("─" * (width - thumb - 1), self.get_component_rich_style("slider--track"))
        return text

    def action_nudge(self, steps: int) -> None:
        self.value = self.value + steps * self.step

    def action_to_end(self, which: int) -> None:
        self.value = self.maximum if which else self.minimum

    def _value_at(self, x: int) -> float:
        width = max(2, self.content_size.width)
        return self.minimum + (self.maximum - self.minimum) * min(1.0, max(0.0, x / (width - 1)))

    def on_mouse_down(self, event: events.MouseDown) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        self.focus()
        self._dragging = True
        self.capture_mouse()
        self.value = self._value_at(offset.x)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        if self._dragging:
            # While captured, x may run past the ends: _value_at clamps.
            self.value = self._value_at(event.x - self.gutter.left)

    def on_mouse_up(self, event: events.MouseUp) -> None:
        if self._dragging:
            self._dragging = False
            self.release_mouse()
