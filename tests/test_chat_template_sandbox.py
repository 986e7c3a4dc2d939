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
    with pytest.raises(ValueError, match=r"tokenizer_config.json: chat_template: the chat template rejected"):
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


RUNAWAY = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",  # 10^10 empty steps
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",  # 10^10 outputs
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  # unbounded recursion
    "{{ 'x' * 10000000000 }}",  # a 10 GB string
    "{{ (messages * 100000000) | length }}",
    "{{ 7 ** 1000000000 }}",
]


@pytest.mark.parametrize("template", RUNAWAY)
def test_runaway_templates_fail_instead_of_hanging(model_dir, template):
    from parley.models import chat_template

    tok = with_template(model_dir, template)
    with pytest.raises(ValueError, match="chat template"):
        chat_template.render(tok.chat_template, MESSAGES, time_limit_s=2.0)


def test_output_is_capped(model_dir, monkeypatch):
    from parley.models import chat_template

    monkeypatch.setattr(chat_template, "MAX_OUTPUT", 10_000)
    tok = with_template(model_dir, "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}")
    with pytest.raises(ValueError, match="rendered more than 10000 characters"):
        tok.render_chat(MESSAGES)


def test_rendering_is_cancellable(model_dir):
    """A cancel set from another thread stops a render that would otherwise run to its time limit."""
    import threading

    from parley.models import chat_template

    tok = with_template(model_dir, RUNAWAY[0])
    cancel, started = threading.Event(), threading.Event()
    result = []

    def render():
        started.set()
        try:
            chat_template.render(tok.chat_template, MESSAGES, cancel=cancel, time_limit_s=600)
        except BaseException as e:  # noqa: BLE001 (what the render ended with is the result)
            result.append(e)

    worker = threading.Thread(target=render)
    worker.start()
    started.wait(60)
    cancel.set()
    worker.join(60)
    assert not worker.is_alive() and isinstance(result[0], chat_template.RenderCancelled)


def test_oversized_template_fails_at_load_naming_the_file(model_dir):
    from parley.models.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"tokenizer_config.json: chat_template: the model's chat template is "
                                             r"\d+ characters, more than"):
        with_template(model_dir, "x" * (2 << 20))


def test_unparsable_template_fails_at_load_naming_the_file(model_dir):
    from parley.models.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"tokenizer_config.json: chat_template: .*does not parse"):
        with_template(model_dir, "{% for %}")
