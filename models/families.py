"""The architecture families Parley knows, in one table: what each is called, and what it switches on.

A family is what a Hugging Face `config.json` calls its `model_type` and a GGUF file its `general.architecture`.
Everything that differs between families is a field of its `Family` here, read where it matters:

- `config.py` turns a config.json or GGUF metadata into a `ModelConfig` with the family's switches (the model
  definition, `transformer.py`, and the native step read only those switches, never the family's name);
- `gguf_weights.py` maps llama.cpp's tensor names (`gguf_names`) and un-permutes q/k (`gguf_permuted_qk`);
- `gguf_tokenizer.py` rebuilds a GGUF vocabulary in Gemma's spelling (`gemma_vocab`);
- `tokenizer.py` gives a model that ships no chat template its family's (`chat_template`);
- `quantize/` rotates the residual stream only where that is exact (`rotatable`);
- `sampling_defaults.py` falls back on the values a family's model cards recommend (`recommended`).

Some families are known for their files only (`runs` false: Gemma 1 and 2): `--tokenizer` may name one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The chat template a Gemma file that ships none gets (base models), as llama.cpp keeps it.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '\n\n' }}"
    "{% else %}{% if not (loop.index0 == 1 and messages[0]['role'] == 'system') %}"
    "{{ '<start_of_turn>' + role + '\n' }}{% endif %}{{ message['content'] | trim + '<end_of_turn>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str  # ModelConfig.arch
    model_types: tuple[str, ...]  # config.json `model_type` values of the family; the first is what Parley writes
    gguf_archs: tuple[str, ...]  # GGUF `general.architecture` values (also the prefix of its metadata keys)
    hf_class: str = ""  # config.json `architectures`, as transformers and vLLM load it
    runs: bool = True  # False: Parley reads its tokenizer and chat template, not its weights

    # The model's switches (ModelConfig fields of the same names; all off is the llama block)
    qkv_bias: bool = False  # q/k/v projections always have biases (else only when config.json's attention_bias)
    qk_norm: bool = False  # an RMSNorm on each head's q and k before rotation
    sandwich_norms: bool = False  # a norm after attention and after the MLP too, before each residual add
    norm_unit_offset: bool = False  # checkpoints store w for a gain of (1 + w)
    mlp_act: str = "silu"  # "gelu_tanh": GeGLU
    embed_scale: bool = False  # embeddings multiplied by sqrt(dim)
    # Read from the config when the family has them:
    sliding_window: bool = False  # local layers of a sliding window with a rope base of their own (layer_types or
    #                               sliding_window_pattern, sliding_window, rope_local_base_freq; per-layer-type
    #                               rope_parameters)
    query_pre_attn_scalar: bool = False  # attention scaled by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5
    text_config: bool = False  # a multimodal config.json holds the text model's settings in `text_config`
    # Defaults when config.json does not say:
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    # GGUF: llama.cpp's block tensor names where they differ from llama's (gguf_weights._BLOCK_NAMES), and whether
    # its converter permuted q/k rows for its adjacent-pair rotary (our Transformer rotates halves)
    gguf_names: dict[str, str] = field(default_factory=dict)
    gguf_permuted_qk: bool = False
    gemma_vocab: bool = False  # a GGUF sentencepiece vocabulary in Gemma's spelling (gguf_tokenizer.py)

    chat_template: str | None = None  # for its files that ship none; None: ChatML
    # Whether every residual read is a plain RMSNorm and every write o_proj / down_proj alone, so the residual
    # stream can be rotated exactly (quantize/rotate.py). qwen3's q/k norms act per head after the projections.
    rotatable: bool = False
    # (pattern matched in the model's name, where the values come from, the values): a model card's sampling
    # values, for a model whose files recommend none (sampling_defaults.py); the first match in table order wins
    recommended: tuple[tuple[str, str, dict[str, float | int]], ...] = ()

    def block_switches(self) -> dict[str, object]:
        """The ModelConfig switches every model of the family has, whatever its config says."""
        return dict(sandwich_norms=self.sandwich_norms, norm_unit_offset=self.norm_unit_offset, mlp_act=self.mlp_act,
                    embed_scale=self.embed_scale)


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), ("llama",), "LlamaForCausalLM", gguf_permuted_qk=True, rotatable=True,
           recommended=((r"smollm2", "SmolLM2's model card", {"temperature": 0.2, "top_p": 0.9}),
                        (r"llama-?3", "Llama 3's model card", {"temperature": 0.6, "top_p": 0.9}))),
    Family("mistral", ("mistral",), ("mistral",), "MistralForCausalLM", rotatable=True),
    Family("qwen2", ("qwen2",), ("qwen2",), "Qwen2ForCausalLM", qkv_bias=True, rotatable=True,
           recommended=((r"qwen2\.?5", "Qwen2.5's model card", {"temperature": 0.7, "top_p": 0.8, "top_k": 20}),)),
    Family("qwen3", ("qwen3",), ("qwen3",), "Qwen3ForCausalLM", qk_norm=True, rotatable=True),
    # Gemma 3: sandwich norms with (1 + w) weights, GeGLU, scaled embeddings, five sliding-window layers to each
    # global one; not rotatable (its sandwich norms and (1 + w) weights do not commute with a rotation)
    Family("gemma3", ("gemma3_text", "gemma3"), ("gemma3",), "Gemma3ForCausalLM", qk_norm=True, sandwich_norms=True,
           norm_unit_offset=True, mlp_act="gelu_tanh", embed_scale=True, sliding_window=True,
           query_pre_attn_scalar=True, text_config=True, rope_theta=1000000.0, tie_embeddings=True,
           gguf_names={"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm"},
           gemma_vocab=True, chat_template=GEMMA_TEMPLATE,
           recommended=((r"gemma-?3", "Gemma 3's model card", {"temperature": 1.0, "top_k": 64, "top_p": 0.95}),)),
    Family("gemma", ("gemma",), ("gemma",), runs=False, gemma_vocab=True, chat_template=GEMMA_TEMPLATE),
    Family("gemma2", ("gemma2",), ("gemma2",), runs=False, gemma_vocab=True, chat_template=GEMMA_TEMPLATE),
)

# The families whose models Parley runs, in table order.
SUPPORTED_ARCHITECTURES = tuple(f.name for f in FAMILIES if f.runs)

_BY_NAME = {f.name: f for f in FAMILIES}
_BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
_BY_GGUF_ARCH = {a: f for f in FAMILIES for a in f.gguf_archs}


def family(name: str) -> Family:
    """The family of a ModelConfig's `arch`."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"architecture {name!r} is not one Parley knows ({', '.join(_BY_NAME)})") from None


def by_model_type(model_type: object) -> Family | None:
    """The family a config.json `model_type` names, or None."""
    return _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def by_gguf_arch(arch: object) -> Family | None:
    """The family a GGUF's `general.architecture` names, or None."""
    return _BY_GGUF_ARCH.get(arch) if isinstance(arch, str) else None


def recommended_sampling() -> list[tuple[str, str, dict[str, float | int]]]:
    """Every family's model-card sampling values, in table order: (name pattern, source, values)."""
    return [entry for f in FAMILIES for entry in f.recommended]
