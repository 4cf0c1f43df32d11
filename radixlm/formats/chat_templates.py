"""`--chat-template`: replace the tokenizer's chat template by a named one or a file.

Names follow SGLang's `--chat-template` names for the common formats. A file is a Jinja
template (any extension), or JSON holding a `chat_template` string (a
`tokenizer_config.json`). The result is a Jinja string for `tokenizer.chat_template`, so the
OpenAI chat API, `/get_model_info` and the frontend's roles all use it.
"""

from __future__ import annotations

import json
from pathlib import Path

_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")

_LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = '<<SYS>>\\n' + messages[0]['content']"
    " + '\\n<</SYS>>\\n\\n' %}{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}"
    "{% set msgs = messages %}{% endif %}"
    "{% for m in msgs %}{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "(sys if loop.first else '') + m['content'] + ' [/INST]' }}"
    "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

_MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] in ('user', 'system') %}"
    "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% elif m['role'] == 'assistant' %}"
    "{{ m['content'] + eos_token }}{% endif %}{% endfor %}")

_GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant'"
    " else 'user' %}{{ '<start_of_turn>' + role + '\\n' + m['content'] | trim + "
    "'<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")

_VICUNA = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + ' ' }}"
    "{% elif m['role'] == 'user' %}{{ 'USER: ' + m['content'] + ' ' }}"
    "{% else %}{{ 'ASSISTANT: ' + m['content'] + eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")

NAMED: dict[str, str] = {
    "chatml": _CHATML, "qwen": _CHATML, "llama-3-instruct": _LLAMA3, "llama-2-chat": _LLAMA2,
    "mistral": _MISTRAL, "gemma-it": _GEMMA, "vicuna_v1.1": _VICUNA,
}


def load_chat_template(name_or_path: str) -> str:
    """The Jinja source for a template name or file; ValueError naming what is wrong."""
    if name_or_path in NAMED:
        return NAMED[name_or_path]
    source = _read(name_or_path)
    import jinja2

    try:
        jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat_template {name_or_path!r} is not valid Jinja: {e}") from e
    return source


def _read(name_or_path: str) -> str:
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ValueError(f"chat_template {name_or_path!r} is neither a file nor a known name "
                         f"({', '.join(sorted(NAMED))})")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            source = json.loads(text).get("chat_template")
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"chat_template file {str(path)!r} is not a JSON object: {e}") from e
        if not isinstance(source, str) or not source:
            raise ValueError(f"chat_template file {str(path)!r} has no 'chat_template' string")
        return source
    if not text.strip():
        raise ValueError(f"chat_template file {str(path)!r} is empty")
    return text
