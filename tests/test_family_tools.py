"""Tool calling end to end per model family, through the official `openai` client against a
real server on loopback: a tiny random Llama whose tokenizer carries Llama 3.1's, Mistral
v0.3's and Qwen 2.5's tokens, under each family's chat template with its tools branch (the
server picks the parser from the template). `tool_choice` required and named give calls in
the family's form whose arguments validate (jsonschema); streamed deltas join to the same
calls; `auto` with free text stays content; the tools, earlier calls and tool results
reach the prompt exactly as transformers' `apply_chat_template(tools=...)` renders them.
Bad messages and tool definitions are 400s naming the field or the function."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from server_fakes import ThreadServer
from test_family_chat import tiny_llama_dir

import radixlm.lang as sgl
from radixlm.formats.tool_parsers import get_parser, parse_tools
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.lang.backend.runtime_engine import Runtime
from radixlm.server.app import create_app

QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}{{- '# Tools\\n\\nYou may call one or "
    "more functions to assist with the user query.\\n\\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools>\\n\\nFor each function "
    "call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0].content + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if message.role == 'user' or "
    "(message.role == 'system' and not loop.first) or (message.role == 'assistant' and not "
    "message.tool_calls) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>\\n' }}{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + "
    "message.role }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{\"name\": "
    "\"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson "
    "}}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif message.role == "
    "'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if "
    "add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA31 = (
    "{{- bos_token }}{%- if messages[0].role == 'system' %}{%- set system_message = "
    "messages[0].content | trim %}{%- set messages = messages[1:] %}{%- else %}{%- set "
    "system_message = '' %}{%- endif %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' "
    "}}{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}{{- 'Cutting Knowledge "
    "Date: December 2023\\n\\n' }}{{- system_message }}{{- '<|eot_id|>' }}{%- if tools %}"
    "{%- set first_user_message = messages[0].content | trim %}{%- set messages = "
    "messages[1:] %}{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}{{- 'Given the "
    "following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt.\\n\\n' }}{{- 'Respond in the format "
    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.' "
    "}}{{- 'Do not use variables.\\n\\n' }}{%- for t in tools %}{{- t | tojson(indent=4) }}"
    "{{- '\\n\\n' }}{%- endfor %}{{- first_user_message + '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'ipython' or message.role == "
    "'tool' or 'tool_calls' in message) %}{{- '<|start_header_id|>' + message.role + "
    "'<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}{%- elif "
    "'tool_calls' in message %}{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{{- '{\"name\": \"' + "
    "tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}"
    "{{- '}' }}{{- '<|eot_id|>' }}{%- else %}{{- '<|start_header_id|>ipython<|end_header_id|>"
    "\\n\\n' }}{{- message.content }}{{- '<|eot_id|>' }}{%- endif %}{%- endfor %}{%- if "
    "add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
MISTRAL03 = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']"
    " %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}{%- set user_messages = loop_messages | selectattr('role', 'equalto', "
    "'user') | list %}{{- bos_token }}{%- for message in loop_messages %}{%- if "
    "message['role'] == 'user' %}{%- if tools and (message == user_messages[-1]) %}"
    "{{- '[AVAILABLE_TOOLS] [' }}{%- for tool in tools %}{{- tool | tojson }}{%- if not "
    "loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- '][/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- if loop.last and system_message is defined %}{{- '[INST] ' + system_message + "
    "'\\n\\n' + message['content'] + '[/INST]' }}{%- else %}{{- '[INST] ' + "
    "message['content'] + '[/INST]' }}{%- endif %}{%- elif message.tool_calls is defined and "
    "message.tool_calls is not none %}{{- '[TOOL_CALLS] [' }}{%- for tool_call in "
    "message.tool_calls %}{%- set out = tool_call.function | tojson %}{{- out[:-1] }}"
    "{%- if not tool_call.id is defined or tool_call.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}{{- ', \"id\": \"' + tool_call.id + '\"}' }}{%- if not loop.last %}"
    "{{- ', ' }}{%- else %}{{- ']' + eos_token }}{%- endif %}{%- endfor %}{%- elif "
    "message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + eos_token }}"
    "{%- elif message['role'] == 'tool' %}{{- '[TOOL_RESULTS] {\"content\": ' + "
    "message.content | string + ', ' }}{%- if message.tool_call_id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}{{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}"
    "{%- endif %}{%- endfor %}")
# family -> (chat template, the token that starts a call in "auto")
FAMILIES = {"qwen25": (QWEN25, "<tool_call>"), "llama3": (LLAMA31, "<|python_tag|>"),
            "mistral": (MISTRAL03, "[TOOL_CALLS]")}
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|eom_id|>", "<|python_tag|>", "[INST]", "[/INST]", "[TOOL_CALLS]",
           "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
PLAIN = ("<tool_call>", "</tool_call>")  # Qwen 2.5's are added tokens, not special ones

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"]}
TIME_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
               "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "description": "Weather of a city",
                                            "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}
TOOLS = [WEATHER, TIME]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tokenizer):
    from radixlm.runtime.engine import Engine

    out = tmp_path_factory.mktemp("tools-llama")
    tiny_llama_dir(out, tokenizer, SPECIAL, ["<|eot_id|>", "<|eom_id|>"], PLAIN)
    with Engine(str(out), dtype="float32", max_total_tokens=8192, context_length=1024,
                log_level="warning") as eng:
        yield eng


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with ThreadServer(create_app(engine)) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(params=list(FAMILIES))
def family(request, engine) -> Iterator[str]:
    """Serve under this family's chat template (the parser follows it)."""
    tok = engine.tokenizer
    saved = tok.chat_template
    tok.chat_template = FAMILIES[request.param][0]
    try:
        yield request.param
    finally:
        tok.chat_template = saved


def _check(call, name: str | None = None) -> dict:
    assert call.type == "function" and call.id
    assert call.function.name in PARAMS and (name is None or call.function.name == name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS[call.function.name])
    return args


def _prompt_len(engine, messages, tools=TOOLS) -> int:
    """What transformers' own rendering of the conversation tokenizes to."""
    ids = engine.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                               add_generation_prompt=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _joined_stream(client, **kwargs) -> tuple[str, dict[int, dict], str | None]:
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
                if d.id:
                    assert entry["id"] is None and d.type == "function"
                    entry.update(id=d.id, name=d.function.name)
                entry["args"] += (d.function.arguments or "") if d.function else ""
            finish = ch.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_time"}}])
def test_required_and_named_give_valid_calls_streamed_alike(client, engine, family, choice):
    kwargs = {"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": choice,
              "parallel_tool_calls": False, "max_tokens": 120, "temperature": 0}
    out = client.chat.completions.create(**kwargs)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert len(c.message.tool_calls) == 1
    args = _check(c.message.tool_calls[0], None if choice == "required" else "get_time")
    if family == "mistral":  # the only ids Mistral's template takes back
        assert len(c.message.tool_calls[0].id) == 9
    assert out.usage.prompt_tokens == _prompt_len(engine, ASK)  # the template's rendering
    content, calls, finish = _joined_stream(client, **kwargs)
    assert finish == "tool_calls" and not content and list(calls) == [0]
    assert calls[0]["name"] == c.message.tool_calls[0].function.name
    assert calls[0]["args"] == c.message.tool_calls[0].function.arguments
    assert json.loads(calls[0]["args"]) == args


def test_parallel_required_calls_all_validate(client, family):
    out = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                         tool_choice="required", max_tokens=300, temperature=0)
    c = out.choices[0]
    assert c.message.tool_calls and c.finish_reason in ("tool_calls", "length")
    for call in c.message.tool_calls:
        _check(call)
    assert len({call.id for call in c.message.tool_calls}) == len(c.message.tool_calls)


def test_auto_with_free_text_stays_content(client, engine, family):
    trigger = engine.tokenizer.convert_tokens_to_ids(FAMILIES[family][1])
    kwargs = {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": 24,
              "temperature": 0, "logit_bias": {str(trigger): -100}}
    out = client.chat.completions.create(**kwargs)
    c = out.choices[0]
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length")
    assert c.message.content and FAMILIES[family][1] not in c.message.content
    assert out.usage.prompt_tokens == _prompt_len(engine, ASK)
    content, calls, finish = _joined_stream(client, **kwargs)
    assert content == c.message.content and not calls and finish == c.finish_reason


def test_auto_call_started_by_the_family_marker_is_parsed(client, engine, family):
    trigger = engine.tokenizer.convert_tokens_to_ids(FAMILIES[family][1])
    kwargs = {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": 120,
              "temperature": 0, "parallel_tool_calls": False,
              "logit_bias": {str(trigger): 100}}  # the model starts a call at once
    out = client.chat.completions.create(**kwargs)
    c = out.choices[0]
    assert c.message.tool_calls and len(c.message.tool_calls) == 1
    args = _check(c.message.tool_calls[0])
    assert c.finish_reason in ("tool_calls", "length")
    content, calls, _ = _joined_stream(client, **kwargs)
    assert json.loads(calls[0]["args"]) == args and (content or None) == c.message.content


def test_calls_and_results_go_back_through_the_template(client, engine, family):
    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=120, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "12 C, clear"}]
    second = client.chat.completions.create(model="m", messages=history, tools=TOOLS,
                                            tool_choice="none", max_tokens=4, temperature=0)
    assert second.choices[0].message.tool_calls is None
    expected = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{
        "id": call.id, "type": "function", "function": {
            "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "12 C, clear"}]
    # tool_choice "none": no tools in the prompt, the calls and results still rendered
    assert second.usage.prompt_tokens == _prompt_len(engine, expected, tools=None)


@pytest.mark.parametrize("messages, param", [
    ([{"role": "tool"}], "messages[0].content"),
    ([{"role": "tool", "content": "21 C"}], "messages[0].tool_call_id"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "system"}, {"role": "user", "content": "x"}], "messages[0].content"),
    ([{"role": "user", "content": "x"}, {"role": "assistant"}], "messages[1].content"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{
        "id": "a", "type": "function", "function": {"name": "get_time",
                                                     "arguments": {"city": "Oslo"}}}]}],
     "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{
        "id": "a", "type": "function", "function": {"name": "get_time",
                                                     "arguments": "{city: Oslo}"}}]}],
     "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{
        "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}],
     "messages[1].tool_calls[0].id"),
    ([{"role": "user", "content": "x", "tool_call_id": "a"}], "messages[0].tool_call_id"),
])
def test_bad_message_shapes_are_400_naming_the_field(url, messages, param):
    r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": messages,
                                                       "max_tokens": 2}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


@pytest.mark.parametrize("tools, choice, needle", [
    ([TIME, TIME], None, "'get_time' is given twice"),
    (TOOLS, {"type": "function", "function": {"name": "get_date"}}, "'get_date'"),
    ([TIME, {"type": "function", "function": {"name": "check", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "not": {
            "pattern": "^x"}}}}}}], "required", "function 'check'"),
])
def test_bad_tools_are_400_naming_the_function(client, tools, choice, needle):
    with pytest.raises(openai.BadRequestError, match=needle):
        client.chat.completions.create(model="m", messages=ASK, tools=tools,
                                       tool_choice=choice, max_tokens=4)


# --------------------------------------------------------------------------- the DSL

@sgl.function
def _agent(s, tools, choice):
    s += sgl.user("What is the weather in Oslo?")
    s += sgl.assistant(sgl.gen("call", tools=tools, tool_choice=choice, max_tokens=120,
                               temperature=0, parallel_tool_calls=False))


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_time"}}])
def test_dsl_tool_use_in_process_and_over_http(engine, url, family, choice):
    """`gen(tools=...)` in a program: the same calls from the in-process engine and from the
    server, in the family's form, arguments valid, parsed into `call_tool_calls`."""
    texts = []
    for backend in (Runtime(engine), RuntimeEndpoint(url)):
        state = _agent.run(tools=TOOLS, choice=choice, backend=backend)
        assert state.error() is None, state.error()
        calls = state["call_tool_calls"]
        assert len(calls) == 1 and calls[0]["type"] == "function"
        name = calls[0]["function"]["name"]
        assert choice == "required" or name == "get_time"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), PARAMS[name])
        reread = parse_tools(TOOLS, None, None, get_parser(family)).parse(state["call"])[1]
        assert [c["function"] for c in reread] == [c["function"] for c in calls]
        assert state["call"] in state.text()  # the program goes on with the text
        texts.append(state["call"])
    assert texts[0] == texts[1]


def test_dsl_tool_fields_are_checked_where_the_program_is_written(engine):
    with pytest.raises(ValueError, match="'get_time' is given twice"):
        sgl.gen("x", tools=[TIME, TIME])
    with pytest.raises(ValueError, match="at most one constraint"):
        sgl.gen("x", tools=TOOLS, regex="a+")
    with pytest.raises(ValueError, match="not in 'tools'"):
        sgl.gen("x", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "z"}})

    @sgl.function
    def nameless(s):
        s += sgl.gen(tools=TOOLS)

    with pytest.raises(ValueError, match="needs a name"):
        nameless.run(backend=Runtime(engine))

    @sgl.function
    def no_tools(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a", tools=TOOLS, tool_choice="none", max_tokens=3))

    state = no_tools.run(backend=Runtime(engine))
    assert state.error() is None and state["a_tool_calls"] == []


def test_outlines_backend_runs_auto_unconstrained_and_refuses_required():
    from types import SimpleNamespace

    from radixlm.server.tool_calls import request_sampling, request_tools

    engine = SimpleNamespace(
        config=SimpleNamespace(grammar_backend="outlines", tool_call_parser="llama3",
                               json_whitespace=None),
        tokenizer=SimpleNamespace(chat_template=QWEN25))
    auto = request_tools(engine, TOOLS, None, None)
    assert auto.parser.name == "llama3"  # the setting wins over the template
    assert request_sampling(engine, auto, None) == ({}, False)  # parsed, held back
    with pytest.raises(ValueError, match="needs the llguidance grammar backend"):
        request_sampling(engine, request_tools(engine, TOOLS, "required", None), None)
