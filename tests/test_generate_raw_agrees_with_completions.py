"""`parley generate --raw` continues the text exactly as `parley serve`'s /v1/completions does (one session
code, BOS first when the model wants it); a model without a chat template gets its family's (Gemma's turns),
said once; `--chat-template FILE` replaces any model's template."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
from serve_support import running_server
from tiny_models import write_model_dir

from parley.app import cli, generate
from parley.engine.engine import Engine
from parley.engine.events import Notice
from parley.engine.params import GenerationParams

transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=259, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=1, head_dim=32, max_position_embeddings=256, sliding_window=8,
              layer_types=["sliding_attention", "full_attention"], bos_token_id=256)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    torch.manual_seed(0)
    path = write_model_dir(tmp_path_factory.mktemp("gemma3"),
                           transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**CONFIG)),
                           {"tie_word_embeddings": True})
    (path / "tokenizer_config.json").write_text(json.dumps(  # a base model: no chat template, BOS first
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": True}))
    return Engine.load(str(path), quant="none")


def test_raw_generate_equals_completions(engine, monkeypatch, capsys):
    prompt = "Once upon a time"
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: engine))
    args = cli.build_parser().parse_args(["generate", "--raw", "--temperature", "0", "--max-new-tokens", "12",
                                          "--speculation", "off", prompt])
    assert generate.run(args) == 0
    generated = capsys.readouterr().out.removesuffix("\n")
    assert engine.tokenizer.encode_raw(prompt)[0] == engine.tokenizer.bos_id
    with running_server(engine) as (_server, base):
        body = json.dumps({"prompt": prompt, "max_tokens": 12, "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            served = json.loads(r.read())["choices"][0]["text"]
    assert generated and generated == served


def test_family_template_said_once_and_a_template_file_overrides(engine, tmp_path):
    tok = engine.tokenizer
    assert tok.render_chat([{"role": "user", "content": "Hi"}]) == \
        "<|endoftext|><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    params = GenerationParams(temperature=0.0, max_new_tokens=2)
    notices = [[ev for ev in engine.session().reply([{"role": "user", "content": "Hi"}], params, None)
                if isinstance(ev, Notice)] for _ in range(2)]
    assert [len(n) for n in notices] == [1, 0] and "gemma3" in notices[0][0].text
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    tok.use_template(template.read_text(), str(template))
    assert tok.render_chat([{"role": "user", "content": "Hi"}]) == "[Hi]"
