"""Settings that survive a restart: sampling values, speculation, max tokens, system prompt, theme.

One JSON file in the platform's config folder (PARLEY_CONFIG_DIR overrides it), written atomically (a temporary
file renamed over the old one: parley.cache_files), so a crash mid-write never leaves half a file. A damaged file
is reported once and replaced by defaults, never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from platformdirs import user_config_dir

from parley.cache_files import write_json_atomic
from parley.engine.params import GenerationParams

# The GenerationParams fields kept (seed is per-run on purpose: a fixed seed surprises on the next start).
KEPT_PARAMS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "speculation", "draft_tokens",
               "repeat_penalty", "repeat_last_n", "frequency_penalty", "presence_penalty")


def default_path() -> Path:
    folder = os.environ.get("PARLEY_CONFIG_DIR") or user_config_dir("parley", appauthor=False)
    return Path(folder) / "settings.json"


def params_values(params: GenerationParams) -> dict[str, object]:
    return {name: getattr(params, name) for name in KEPT_PARAMS if hasattr(params, name)}


def apply_values(params: GenerationParams, values: dict[str, object]) -> list[str]:
    """Set the kept values on `params` (only those that validate); the names of the rejected ones."""
    rejected = []
    for name, value in values.items():
        if name not in KEPT_PARAMS:
            continue
        old = getattr(params, name, None)
        if old is not None and type(value) is not type(old) and not (isinstance(old, float) and type(value) is int):
            rejected.append(name)
            continue
        setattr(params, name, value)
        try:
            params.validate()
        except ValueError:
            rejected.append(name)
            if old is None:
                delattr(params, name)
            else:
                setattr(params, name, old)
    return rejected


class Settings:
    """The settings file: `values` is its JSON object, `save()` writes it back atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.problem: str | None = None  # why the file could not be read or written, for the UI
        self.values: dict[str, object] = {}
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            self.problem = f"Settings file {self.path} could not be read ({e}); using defaults"
            return
        except RecursionError:
            self.problem = f"Settings file {self.path} nests too deeply to read; using defaults"
            return
        if isinstance(loaded, dict):
            self.values = loaded
        else:
            self.problem = f"Settings file {self.path} is not a JSON object; using defaults"

    def get(self, key: str, default: object = None) -> object:
        return self.values.get(key, default)

    def set(self, key: str, value: object) -> None:
        self.values[key] = value
        self.save()

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self.values, indent=2, sort_keys=True)
        except OSError as e:
            self.problem = f"Settings could not be saved to {self.path} ({e})"

    def params(self) -> GenerationParams:
        """Defaults with the saved sampling values applied."""
        params = GenerationParams()
        saved = self.values.get("params")
        if isinstance(saved, dict):
            apply_values(params, saved)
        return params

    def save_params_values(self, values: dict[str, object]) -> None:
        self.set("params", dict(values))

    def chosen_params(self) -> set[str]:
        """The sampling values the user set: they win over a model's recommended ones. For a file written
        before this was kept, the saved values that differ from the engine's defaults."""
        chosen = self.values.get("params_chosen")
        if isinstance(chosen, list):
            return {name for name in chosen if isinstance(name, str)}
        saved, defaults = self.values.get("params"), GenerationParams()
        if not isinstance(saved, dict):
            return set()
        return {name for name, value in saved.items() if name in KEPT_PARAMS and getattr(defaults, name, None) != value}

    def set_chosen_params(self, names: set[str]) -> None:
        self.set("params_chosen", sorted(names))
