"""Chat templates are untrusted code: they render in Jinja's immutable sandbox, with transformers' helpers."""

import datetime
import json

import pytest
from tiny_models import reference_model, tiny_config, write_model_dir

from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = tiny_config("llama")
    return write_model_dir(tmp_path_factory.mktemp("tpl"), reference_model(cfg), cfg)


def with_template(model_dir, template):
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": template}))
    return load_tokenizer(resolve(str(model_dir)))


MESSAGES = [{"role": "user", "content": "héllo 😀"}]


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set _ = messages.append({'role': 'x'}) %}{{ messages }}",
    "{{ messages[0].update({'content': 'pwned'}) }}",
])
def test_escapes_and_mutation_are_refused(model_dir, template):
    tok = with_template(model_dir, template)
    with pytest.raises(ValueError, match="chat template"):
        tok.render_chat(MESSAGES)


def test_raise_exception_reaches_the_caller(model_dir):
    tok = with_template(model_dir, "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}"
                                   "{% endif %}")
    with pytest.raises(ValueError, match="system first"):
        tok.render_chat(MESSAGES)


def test_transformers_helpers(model_dir):
    tok = with_template(model_dir, "{{ strftime_now('%Y') }}|{{ messages | tojson }}|{{ eos_token }}|"
                                   "{% for m in messages %}{% if loop.first %}{% break %}{% endif %}{% endfor %}")
    year = str(datetime.date.today().year)
    assert tok.render_chat(MESSAGES) == f'{year}|[{{"role": "user", "content": "héllo 😀"}}]|<|im_end|>|'


def test_named_templates_use_default(model_dir):
    tok = with_template(model_dir, [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "D"}])
    assert tok.render_chat(MESSAGES) == "D"


def test_no_template_falls_back_to_chatml(model_dir):
    tok = with_template(model_dir, None)
    assert not tok.has_chat_template
    assert tok.render_chat(MESSAGES) == "<|im_start|>user\nhéllo 😀<|im_end|>\n<|im_start|>assistant\n"
