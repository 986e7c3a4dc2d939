"""The one error the loader raises: a model Parley cannot load, and what to do about it."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model reference, file or download Parley cannot use.

    The message names the file, value or hub id at fault and the fix, so the UI and CLI can show it
    as is, without a traceback.
    """


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (0x09,)}
_CONTROL_BUT_LINES = {c: v for c, v in _CONTROL.items() if c not in (0x0A, 0x0D)}


def printable(text: object, limit: int | None = None, lines: bool = False) -> str:
    """`text` safe to print on a terminal or in a log: control characters (ESC and the C1 codes that start
    ANSI/OSC sequences, CR, BEL, ...) written as `\\xNN`; cut to `limit` characters with an ellipsis.

    For text from outside (a server's error message, a request line, a file's field): printed raw, it could
    clear the screen, set the window title or forge log lines. `lines` keeps newlines (a reply's text)."""
    out = str(text)
    if limit is not None and len(out) > limit:
        out = out[:limit] + "…"
    return out.translate(_CONTROL_BUT_LINES if lines else _CONTROL)
