"""Text <-> token ids for a model, its chat template, its stop tokens, and streaming detokenisation.

Three sources, one interface: `tokenizer.json` (through `tokenizers`), `tokenizer.model` (through
`sentencepiece`) and a GGUF's metadata (rebuilt as a `tokenizers` BPE). Token ids never carry added
BOS/EOS here: chat templates write the special tokens a model wants, as transformers'
`apply_chat_template` assumes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from . import chat_template, families
from .errors import ModelLoadError
from .resolve import ModelFiles

# Tokens that end an assistant turn in the common chat formats; those present in a vocabulary stop generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>",
                      "<end_of_turn>", "<|end|>", "</s>")


class Backend(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...
    def vocab(self) -> dict[str, int]: ...


class HFBackend:
    """A `tokenizers.Tokenizer` (from tokenizer.json or rebuilt from GGUF)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def vocab(self) -> dict[str, int]:
        return self.tok.get_vocab(with_added_tokens=True)


class SentencePieceBackend:
    """A sentencepiece model, with the added/special tokens of tokenizer_config matched whole in the text."""

    def __init__(self, path: Path, added: dict[int, str], special: set[int]) -> None:
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self.added = added  # id -> content, matched before sentencepiece sees the text
        control = {i for i in range(self.sp.get_piece_size()) if self.sp.is_control(i)}  # <s>, </s>
        self.by_content = {**{self.sp.id_to_piece(i): i for i in control}, **{c: i for i, c in added.items()}}
        self._special = special | control
        names = sorted(self.by_content, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None

    def encode(self, text: str) -> list[int]:
        pieces = self.split.split(text) if self.split else [text]
        ids: list[int] = []
        for piece in pieces:
            if piece in self.by_content:
                ids.append(self.by_content[piece])
            elif piece:
                ids += self.sp.encode(piece)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        out, run = [], []
        for i in ids:
            if i in self.added or (i in self._special and not skip_special_tokens):
                out.append(self.sp.decode(run))
                run = []
                if not (skip_special_tokens and i in self._special):
                    out.append(self.added.get(i) or self.sp.id_to_piece(i))
            elif i not in self._special:
                run.append(i)
        out.append(self.sp.decode(run))
        return "".join(out)

    def vocab(self) -> dict[str, int]:
        return {**{self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}, **self.by_content}


class StreamDecoder:
    """Turns ids, one at a time, into text deltas that never split a UTF-8 character.

    A token can hold part of a character (byte-level BPE spells an emoji in up to four tokens), so text
    is released only once decoding no longer ends in U+FFFD. Decoding a short window (from the last
    release point) rather than the whole reply keeps each step cheap, and decoding that window
    with one token of context before it keeps word-leading spaces right for sentencepiece.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] is context already shown
        self.read = 0  # ids[read:] are not shown yet

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tok.decode(self.ids[start:end], skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        shown = self._text(self.prefix, self.read)
        text = self._text(self.prefix)
        if len(text) <= len(shown) or text.endswith("\ufffd"):
            return ""  # an incomplete character (or nothing visible) so far
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(shown):]

    def flush(self) -> str:
        """What is left at the end of a reply, incomplete bytes included (as U+FFFD)."""
        shown = self._text(self.prefix, self.read)
        text = self._text(self.prefix)
        self.prefix = self.read = len(self.ids)
        return text[len(shown):]


class Tokenizer:
    def __init__(self, backend: Backend, chat_template_source: str | None, special_tokens: dict[str, str],
                 eos_id: int | None, extra_stop_ids: Iterable[int] = (),
                 template_origin: str = "the model's chat template", arch: str | None = None,
                 add_bos: bool = False) -> None:
        self.backend = backend
        self.has_chat_template = chat_template_source is not None
        # No template of its own: the family's known one (as llama.cpp does; families.py), else ChatML;
        # `template_note` says which, for the app to show once. `arch`: the family's name (ModelConfig.arch).
        family = families.family(arch).chat_template if arch and chat_template_source is None else None
        self.template_note: str | None = None
        if chat_template_source is None:
            self.template_note = (f"the model has no chat template; using the {arch} family's" if family else
                                  "the model has no chat template; using ChatML")
            template_origin = f"Parley's {'built-in ' + arch if family else 'ChatML'} template"
        self.chat_template = chat_template_source or family or chat_template.FALLBACK_TEMPLATE
        self.template_origin = template_origin  # named in rendering errors: the file the template came from
        self.add_bos = add_bos  # raw completion starts with BOS when the model was trained so (Gemma, Llama)
        self.special_tokens = special_tokens  # bos_token, eos_token, ... as the template sees them
        self._vocab = backend.vocab()
        self.vocab_size = max(self._vocab.values()) + 1
        if eos_id is None and special_tokens.get("eos_token") in self._vocab:
            eos_id = self._vocab[special_tokens["eos_token"]]
        self.eos_id = eos_id
        self.bos_id: int | None = self._vocab.get(special_tokens.get("bos_token") or "")
        stops = {self._vocab[t] for t in END_OF_TURN_TOKENS if t in self._vocab} | set(extra_stop_ids)
        if eos_id is not None:
            stops.add(eos_id)
        self.stop_ids: frozenset[int] = frozenset(stops)

    def encode(self, text: str) -> list[int]:
        """Ids for `text` as written (special tokens in it are matched whole; no BOS/EOS is added)."""
        return self.backend.encode(text)

    def encode_raw(self, text: str) -> list[int]:
        """Ids for a raw completion prompt (no chat template): BOS first when the model wants it."""
        bos = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        ids = self.encode(text)
        return ids if ids[:1] == bos else bos + ids

    def use_template(self, source: str, origin: str) -> None:
        """Render chats with `source` (a --chat-template file) instead of the model's; checked now."""
        self.chat_template = _checked_template(source, origin) or source
        self.template_origin, self.has_chat_template, self.template_note = origin, True, None

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens)

    def vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    cancel: threading.Event | None = None) -> str:
        """The prompt text; ValueError from a failing or runaway template, RenderCancelled once `cancel` is set."""
        return chat_template.render(self.chat_template, messages, add_generation_prompt, self.special_tokens,
                                    cancel, origin=self.template_origin)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    cancel: threading.Event | None = None) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt, cancel))

    def stream(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)


def load_tokenizer(files: ModelFiles) -> Tokenizer:
    """The tokenizer of a resolved model: its GGUF metadata, or tokenizer.json / tokenizer.model in its directory."""
    if files.kind == "gguf":
        return _from_gguf(files.path)
    return _from_dir(files.path)


def _from_gguf(path: Path) -> Tokenizer:
    from . import gguf_tokenizer, tokenizer_cache
    from .gguf_weights import open_gguf

    meta = open_gguf(path).metadata
    tokens = meta.get("tokenizer.ggml.tokens") or []
    special = {}
    for name in ("bos", "eos", "unk", "pad"):
        i = meta.get(f"tokenizer.ggml.{name}_token_id")
        if i is not None and 0 <= i < len(tokens):
            special[f"{name}_token"] = tokens[i]
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    extra = [meta["tokenizer.ggml.eot_token_id"]] if "tokenizer.ggml.eot_token_id" in meta else []
    where = f"{path}: metadata tokenizer.chat_template"
    template = _checked_template(meta.get("tokenizer.chat_template"), where)
    family = families.by_gguf_arch(meta.get("general.architecture"))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama"))
    built = tokenizer_cache.load_or_build(path, lambda: gguf_tokenizer.build(meta, path))
    return Tokenizer(HFBackend(built), template, special, eos_id, extra, where,
                     arch=family.name if family is not None else None, add_bos=add_bos)


def _checked_template(template: Any, where: str) -> str | None:
    """The chat template, compiled once now so a broken or oversized one fails at load, naming its file."""
    if template is None:
        return None
    if not isinstance(template, str):
        raise ModelLoadError(f"{where}: the chat template is a {type(template).__name__}, not text; fix it or "
                             "re-download the model")
    try:
        chat_template.compile_template(template)
    except ModelLoadError as e:
        raise ModelLoadError(f"{where}: {e}") from None
    return template


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ModelLoadError(f"{path}: nests too deeply to be a tokenizer file; re-download the model") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e}); re-download the model") from None
    return value if isinstance(value, dict) else {}


def _added_tokens(decoder: Any, where: Path) -> tuple[dict[int, str], set[int]]:
    """tokenizer_config.json's added_tokens_decoder ({"id": {"content": ..., "special": ...}}), checked."""
    added: dict[int, str] = {}
    flagged: set[int] = set()
    if decoder is None:
        return added, flagged
    for key, token in (decoder or {}).items() if isinstance(decoder, dict) else [(None, decoder)]:
        if not (isinstance(key, str) and key.isdigit() and isinstance(token, dict)
                and isinstance(token.get("content"), str)):
            raise ModelLoadError(f"{where}: added_tokens_decoder entry {key!r}: expected \"id\": {{\"content\": "
                                 "text, ...}}; fix or re-download the file")
        added[int(key)] = token["content"]
        if token.get("special"):
            flagged.add(int(key))
    return added, flagged


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config spells it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _from_dir(path: Path) -> Tokenizer:
    config = _read_json(path / "tokenizer_config.json")
    special_map = _read_json(path / "special_tokens_map.json")
    special = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        text = _token_text(config.get(name)) or _token_text(special_map.get(name))
        if text is not None:
            special[name] = text
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer as HFTokenizer

        try:
            backend: Backend = HFBackend(HFTokenizer.from_file(str(path / "tokenizer.json")))
        except Exception as e:  # the Rust side reports bad JSON and unknown models as plain Exceptions
            raise ModelLoadError(
                f"{path / 'tokenizer.json'}: cannot be read ({e}); re-download the model"
            ) from None
    elif (path / "tokenizer.model").is_file():
        added, flagged = _added_tokens(config.get("added_tokens_decoder"), path / "tokenizer_config.json")
        try:
            backend = SentencePieceBackend(path / "tokenizer.model", added, flagged)
        except (RuntimeError, OSError) as e:
            raise ModelLoadError(f"{path / 'tokenizer.model'}: cannot be read ({e}); re-download the model") from None
    else:
        raise ModelLoadError(f"{path}: no tokenizer.json or tokenizer.model; Parley needs one of them")
    if not backend.vocab():
        raise ModelLoadError(f"{path}: the tokenizer's vocabulary is empty; re-download the model")
    template = chat_template.pick_template(config.get("chat_template"))
    where = f"{path / 'tokenizer_config.json'}: chat_template"
    if template is None and (path / "chat_template.jinja").is_file():
        where = str(path / "chat_template.jinja")
        try:
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{where}: cannot be read ({e}); re-download the model") from None
    template = _checked_template(template, where)
    generation = _read_json(path / "generation_config.json")
    eos = generation.get("eos_token_id")
    extra = [e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)]
    family = families.by_model_type(_read_json(path / "config.json").get("model_type"))
    return Tokenizer(backend, template, special, None, extra, where, arch=family.name if family else None,
                     add_bos=bool(config.get("add_bos_token", False)))
