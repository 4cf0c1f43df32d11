"""Each family's chat template through the chat paths: a program's role text (the
``ChatTemplate`` segments the interpreter writes) must be what ``apply_chat_template``
renders, the template's special tokens must reach the engine as single tokens, and the
end-of-turn token listed in ``generation_config.json`` must stop generation.

The templates are the families' own (Qwen2.5's without its tools branch; Gemma 3's without
its image branch), on a tiny random Llama whose tokenizer carries their special tokens.
"""

from __future__ import annotations

import json

import pytest
import torch

import radixlm.lang as sgl
from radixlm.lang.backend.runtime_engine import Runtime
from radixlm.lang.chat_template import ChatTemplate, ChatTemplateError

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}")
GEMMA3 = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set "
    "first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- set loop_messages = "
    "messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set "
    "loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    "
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ "
    "raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") "
    "}}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set "
    "role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    "
    "{%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if "
    "loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        "
    "{{ message['content'] | trim }}\n    {%- endif -%}\n    "
    "{{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    "
    "{{'<start_of_turn>model\n'}}\n{%- endif -%}\n")
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}\n{%- else %}\n    {{- '<|im_start|>system"
    "\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or "
    "(message.role == \"system\" and not loop.first) or (message.role == \"assistant\") %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    "
    "{{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")
# family -> (template, its end-of-turn token, whether it takes a system message)
TEMPLATES = {"llama3": (LLAMA3, "<|eot_id|>", True), "gemma2": (GEMMA2, "<end_of_turn>", False),
             "gemma3": (GEMMA3, "<end_of_turn>", True), "phi3": (PHI3, "<|end|>", True),
             "qwen2.5": (QWEN25, "<|im_end|>", True)}
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<start_of_turn>", "<end_of_turn>", "<|system|>", "<|user|>", "<|assistant|>",
           "<|end|>"]


def tiny_llama_dir(out, tokenizer, special: list[str], end_of_turn: list[str],
                   plain: tuple[str, ...] = ()):
    """A tiny random Llama in ``out`` whose tokenizer is ``tokenizer`` with ``special``
    added as special tokens and ``plain`` as plain added ones, and whose
    generation_config.json lists ``end_of_turn`` as end-of-sequence tokens (as the families'
    own do). Returns the saved tokenizer."""
    from safetensors.torch import save_file
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, LlamaConfig

    tokenizer.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": special})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    tok.bos_token = "<|begin_of_text|>"
    tok.save_pretrained(out)
    vocab = len(tok)
    LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                tie_word_embeddings=True, eos_token_id=tok.eos_token_id).save_pretrained(out)
    eot = [tok.convert_tokens_to_ids(t) for t in end_of_turn]
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tok.eos_token_id, *eot]}))
    gen = torch.Generator().manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(vocab, 32, generator=gen),
             "model.norm.weight": torch.ones(32)}
    for name, shape in [("input_layernorm", (32,)), ("post_attention_layernorm", (32,)),
                        ("self_attn.q_proj", (32, 32)), ("self_attn.k_proj", (16, 32)),
                        ("self_attn.v_proj", (16, 32)), ("self_attn.o_proj", (32, 32)),
                        ("mlp.gate_proj", (64, 32)), ("mlp.up_proj", (64, 32)),
                        ("mlp.down_proj", (32, 64))]:
        w = torch.ones(shape) if len(shape) == 1 else torch.randn(*shape, generator=gen) * 0.1
        state[f"model.layers.0.{name}.weight"] = w
    save_file(state, str(out / "model.safetensors"))
    return tok


@pytest.fixture(scope="module")
def chat_engine(tmp_path_factory, tokenizer):
    """A tiny random Llama whose tokenizer knows every family's special tokens and whose
    generation_config.json lists every end-of-turn token (as the families' own do)."""
    from radixlm.runtime.engine import Engine

    out = tmp_path_factory.mktemp("chat-llama")
    tiny_llama_dir(out, tokenizer, SPECIAL, [t for _, t, _ in TEMPLATES.values()])
    with Engine(str(out), dtype="float32", max_total_tokens=2048, log_level="warning") as engine:
        yield engine


@sgl.function
def _chat(s):
    s += sgl.user("Hello there")
    s += sgl.assistant("Hi! How can I help?")
    s += sgl.user("Say something")
    s += sgl.assistant(sgl.gen("answer", max_tokens=4, temperature=0))


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_family_chat_template_in_programs_and_engine(chat_engine, family):
    source, end_of_turn, takes_system = TEMPLATES[family]
    tok = chat_engine.tokenizer
    tok.chat_template = source
    messages = [{"role": "user", "content": "Hello there"},
                {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Say something"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    state = _chat.run(backend=Runtime(chat_engine))
    assert state.error() is None
    answer = state["answer"]
    assert state.text().startswith(prompt + answer)  # the role text the template renders
    suffix = ChatTemplate.from_tokenizer(tok).segments("assistant")[1]
    assert state.text() == prompt + answer + suffix
    # the template's markers are single special tokens, and its end of turn stops generation
    ids = tok.encode(prompt, add_special_tokens=False)
    assert tok.convert_tokens_to_ids(end_of_turn) in ids
    assert tok.convert_tokens_to_ids(end_of_turn) in chat_engine.eos_ids
    if not takes_system:  # Gemma 2 refuses a system message by name
        with pytest.raises(ChatTemplateError, match="System role not supported"):
            ChatTemplate.from_tokenizer(tok).segments("system")


def test_gemma3_system_prompt_is_not_taken_for_the_user_prefix():
    t = ChatTemplate(GEMMA3, {"bos_token": "<bos>"})
    assert t.segments("user") == ("<start_of_turn>user\n", "<end_of_turn>\n")
    assert t.segments("assistant") == ("<start_of_turn>model\n", "<end_of_turn>\n")
    assert t.leading_text == "<bos>" and t.preamble == "" and t.default_system_prompt is None


def test_phi3_end_of_chat_eos_is_not_part_of_a_segment():
    t = ChatTemplate(PHI3, {"eos_token": "<|endoftext|>"})
    assert t.trailer == "<|endoftext|>"
    assert t.segments("system") == ("<|system|>\n", "<|end|>\n")
    assert t.segments("user") == ("<|user|>\n", "<|end|>\n")
    assert t.segments("assistant") == ("<|assistant|>\n", "<|end|>\n")


@pytest.mark.parametrize("family, parser_name, call_text, result", [
    ("llama3", "llama3", '{"name": "get_time", "parameters": {"city": "Oslo"}}',
     "<|start_header_id|>ipython<|end_header_id|>\n\n12:00<|eot_id|>"),
    ("qwen2.5", "qwen25",
     '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>"),
])
def test_templates_without_tools_get_the_family_documented_format(chat_engine, family,
                                                                   parser_name, call_text,
                                                                   result):
    """A family template without a tools branch: the parser is still the family's (from its
    turn markers), the functions are listed in the family's documented system text, earlier
    calls are written in the family's form and results in its result turn; a required call
    generated under it reads back."""
    from radixlm.formats.tool_parsers import parse_tools
    from radixlm.formats.tool_parsers.grammar import token_lookup, tool_sampling
    from radixlm.server.protocol import ChatMessage
    from radixlm.server.tool_calls import (
        message_dicts,
        render_messages,
        server_parser,
        template_reads_tools,
    )

    tok = chat_engine.tokenizer
    tok.chat_template = TEMPLATES[family][0]
    parser = server_parser(chat_engine)
    assert parser.name == parser_name and not template_reads_tools(tok)
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"]}}}
    setup = parse_tools([tool], "required", False, parser)
    history = [ChatMessage(**m) for m in [
        {"role": "user", "content": "Time in Oslo?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_time", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "user", "content": "And in Rome?"}]]
    messages = render_messages(message_dicts(history), parser, setup, native=False)
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert parser.tools_prompt(setup.functions) in prompt and '"get_time"' in prompt
    assert call_text in prompt and result in prompt
    params = {**tool_sampling(setup, token_lookup(
        lambda t: tok.encode(t, add_special_tokens=False))), "max_new_tokens": 60,
        "temperature": 0}
    out = chat_engine.generate(prompt=prompt, sampling_params=params)
    content, calls = setup.parse(out["text"])
    assert content is None and [c["function"]["name"] for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)
