"""Tiny random Hugging Face model directories for loader tests: config.json, safetensors (one file or
shards with an index), a byte-level tokenizer.json and tokenizer_config.json with a chat template.

The reference model comes from transformers, so a test can compare our logits with its logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_config(model_type: str = "llama", tied: bool = False) -> dict:
    return dict(model_type=model_type, vocab_size=256 + len(SPECIALS), hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied)


def reference_model(config: dict, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(**config)
    return transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").eval()


def tokenizer_json() -> str:
    """A byte-level BPE with one token per byte and no merges, plus ChatML's special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in SPECIALS])
    return tok.to_str()


def write_model_dir(path: Path, model, config: dict, shards: int = 1) -> Path:
    """Save `model` as Hugging Face does: safetensors (split into `shards` files with an index if > 1)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_dict()))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    names = sorted(state)
    if shards == 1:
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(shards):
            part = names[i::shards]
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: state[k] for k in part}, str(path / fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, fname))
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "tokenizer.json").write_text(tokenizer_json())
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 256]}))
    return path


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}


# Our parameter names (minus `model.`) -> llama.cpp's, as convert_hf_to_gguf writes them.
GGUF_NAMES = {
    "embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf's q/k row order for llama: the halves of each head interleaved in pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, config: dict, override_type: dict | None = None,
               rope_freqs: torch.Tensor | None = None, linears_as=None, linear_kinds=None, embedding_as=None
               ) -> Path:
    """`model` as llama.cpp's converter would write it (F32 tensors), with a byte-level tokenizer.

    `override_type` maps a GGUF tensor name to a GGMLQuantizationType to store it as raw bytes of that
    type instead (to test types Parley cannot read). `rope_freqs`: the per-frequency divisors the converter
    writes for llama3-style rope scaling. `linears_as`: a GGMLQuantizationType the decoder's linears are
    quantized to by gguf.quants (e.g. Q4_0, Q4_1), as a quantized GGUF stores them; `linear_kinds` maps a
    projection's name ("v_proj") to the type it is stored in instead (a file that mixes types, as Q4_K_M does).
    `embedding_as`: the type the embedding table is quantized to (Q8_0, Q4_0: as llama.cpp's files store it).
    """
    import gguf
    import numpy as np
    from tokenizers import Tokenizer

    arch = config["model_type"]
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if getattr(c, "head_dim", None):
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    vocab = Tokenizer.from_str(tokenizer_json()).get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_chat_template(CHATML)
    for name, t in model.state_dict().items():
        name = name.removeprefix("model.")
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        stem, kind = name.rsplit(".", 1)
        if stem.startswith("layers."):
            _, i, rest = stem.split(".", 2)
            gname = f"blk.{i}.{GGUF_NAMES[rest]}.{kind}"
        else:
            gname = f"{GGUF_NAMES[stem]}.{kind}"
        t = t.float()
        if arch == "llama" and rest_is(stem, "self_attn.q_proj"):
            t = llama_cpp_permute(t, c.num_attention_heads)
        elif arch == "llama" and rest_is(stem, "self_attn.k_proj"):
            t = llama_cpp_permute(t, c.num_key_value_heads)
        qtype = (override_type or {}).get(gname)
        if linears_as is not None and stem.startswith("layers.") and stem.endswith("_proj") and kind == "weight":
            as_kind = (linear_kinds or {}).get(stem.rsplit(".", 1)[1], linears_as)
            w.add_tensor(gname, gguf.quants.quantize(t.numpy(), as_kind), raw_dtype=as_kind)
        elif embedding_as is not None and stem == "embed_tokens":
            w.add_tensor(gname, gguf.quants.quantize(t.numpy(), embedding_as), raw_dtype=embedding_as)
        elif qtype is None:
            w.add_tensor(gname, t.numpy())
        else:
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((*t.shape[:-1], t.shape[-1] // block * block_bytes), dtype=np.uint8)
            w.add_tensor(gname, raw, raw_dtype=qtype)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rest_is(stem: str, suffix: str) -> bool:
    return stem.endswith("." + suffix)
