"""The one error the loader raises: a model Parley cannot load, and what to do about it."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model reference, file or download Parley cannot use.

    The message names the file, value or hub id at fault and the fix, so the UI and CLI can show it
    as is, without a traceback.
    """
