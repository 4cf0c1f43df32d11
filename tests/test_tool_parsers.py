"""Tool-call formats by family (radixlm.formats.tool_parsers), without a model.

Each parser reads its family's real output format (several calls, nested JSON arguments,
unicode, text around the calls); a stream of the same text cut at every byte gives deltas
that join to the one-shot parse; malformed output stays content. Each format's grammar
(llguidance, over a tokenizer that has the family's special tokens) accepts exactly the
family's form with arguments valid under the schema (checked with jsonschema) and refuses
what breaks either. Template detection and the parser names are checked too."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance as llg
import llguidance.hf
import pytest
from tokenizers import AddedToken

from radixlm.formats.tool_parsers import (
    TOOL_CALL_PARSERS,
    ToolCallStream,
    detect_parser,
    get_parser,
    parse_tools,
    resolve_parser,
)
from radixlm.formats.tool_parsers.grammar import build, token_lookup, tool_sampling

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "detail": {"type": "boolean"},
    "opts": {"type": "object", "properties": {"tags": {"type": "array",
                                                       "items": {"type": "string"}}}}},
    "required": ["city"]}
TIME_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
               "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}

# the calls every case below writes, in each family's form
ARGS_1 = {"city": "Zürich", "unit": "celsius", "opts": {"tags": ["a}", "雨 ☔", "[x]"]}}
ARGS_2 = {"city": "東京"}
CALLS = [("get_weather", ARGS_1), ("get_time", ARGS_2)]
A1, A2 = (json.dumps(a, ensure_ascii=False) for a in (ARGS_1, ARGS_2))

DS = {k: f"<｜{k}｜>" for k in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin",
                               "tool▁call▁end", "tool▁sep")}


def _ds_call(name: str, args: str) -> str:
    return (f"{DS['tool▁call▁begin']}function{DS['tool▁sep']}{name}\n```json\n{args}\n```"
            f"{DS['tool▁call▁end']}")


# family -> (the output, its content); all write CALLS
FORMATS = {
    "qwen25": (f'Let me check. <tool_call>\n{{"name": "get_weather", "arguments": {A1}}}\n'
               f'</tool_call>\n<tool_call>\n{{"name": "get_time", "arguments": {A2}}}\n'
               "</tool_call>", "Let me check."),
    "hermes": (f'<tool_call>\n{{"name": "get_weather", "arguments": {A1}}}\n</tool_call>\n'
               f'<tool_call>\n{{"name": "get_time", "arguments": {A2}}}\n</tool_call>', None),
    "llama3": (f'<|python_tag|>{{"name": "get_weather", "parameters": {A1}}}; '
               f'{{"name": "get_time", "parameters": {A2}}}', None),
    "mistral": (f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {A1}}}, '
                f'{{"name": "get_time", "arguments": {A2}}}]', None),
    "pythonic": ('[get_weather(city="Zürich", unit="celsius", opts={"tags": ["a}", "雨 ☔", '
                 '"[x]"]}), get_time(city="東京")]', None),
    "deepseekv3": ("Checking both." + DS["tool▁calls▁begin"] + _ds_call("get_weather", A1)
                   + "\n" + _ds_call("get_time", A2) + DS["tool▁calls▁end"], "Checking both."),
}
# other real spellings each family's parser reads
VARIANTS = {
    "llama3": [(f'{{"name": "get_weather", "parameters": {A1}}};{{"name": "get_time", '
                f'"parameters": {A2}}}', None),
               (f'{{"name": "get_weather", "arguments": {A1}}}; {{"name": "get_time", '
                f'"arguments": {A2}}}', None)],
    "qwen25": [(f'<tool_call>\n{{"arguments": {A1}, "name": "get_weather"}}\n</tool_call>'
                f'<tool_call>{{"name": "get_time", "arguments": {A2}}}</tool_call> Done.',
                "Done.")],
    "mistral": [(f'Sure.[TOOL_CALLS][{{"name": "get_weather", "arguments": {A1}}},'
                 f'{{"name": "get_time", "arguments": {A2}}}]', "Sure.")],
    "pythonic": [("[get_weather(city='Zürich', unit='celsius', opts={'tags': ['a}', '雨 ☔', "
                  "'[x]']}), get_time(city='東京')]", None)],
}
# family -> outputs that are not calls (they stay content, whole)
MALFORMED = {
    "qwen25": ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}\n'
               "</tool_call>",  # one brace short
               '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',
               '<tool_call>\n{"name": "get_time", "arguments": "Oslo"}\n</tool_call>'],
    "llama3": ['{"name": "get_weather", "parameters": {"city": "Oslo"',
               '<|python_tag|>brave_search.call(query="weather")',
               '{"name": "get_time"; "parameters": {}}'],
    "mistral": ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                '[TOOL_CALLS] {"name": "get_time", "arguments": {"city": "Oslo"}}',
                '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}, 42]'],
    "pythonic": ['[get_weather(city=oslo)]', '[get_weather("Oslo")]',
                 '[get_time(city="Oslo")', '[get_time(city="Oslo"), print("x")]'],
    "deepseekv3": [DS["tool▁calls▁begin"] + f"{DS['tool▁call▁begin']}function{DS['tool▁sep']}"
                   'get_time\n{"city": "Oslo"}' + DS["tool▁call▁end"] + DS["tool▁calls▁end"],
                   DS["tool▁calls▁begin"] + _ds_call("get_time", '{"city": "Oslo"')
                   + DS["tool▁calls▁end"]],
}


def _setup(family: str, choice=None, parallel=None, tools=(WEATHER, TIME)):
    return parse_tools(list(tools), choice, parallel, get_parser(family))


def _check_calls(calls: list[dict], expected=CALLS) -> None:
    assert [c["function"]["name"] for c in calls] == [n for n, _ in expected]
    for call, (name, args) in zip(calls, expected, strict=True):
        assert call["type"] == "function" and call["id"]
        value = json.loads(call["function"]["arguments"])
        assert value == args
        jsonschema.validate(value, PARAMS[name])


def _stream(setup, text: str, cuts: list[int], incremental: bool):
    """Feed ``text`` cut at ``cuts`` (byte offsets); joined content and calls."""
    stream = ToolCallStream(setup, incremental)
    data = text.encode()
    content, calls = "", {}
    for i, cut in enumerate([*cuts, len(data)]):
        final = i == len(cuts)
        delta, deltas = stream.feed(data[:cut].decode("utf-8", "ignore"), final)
        content += delta
        for d in deltas:
            entry = calls.setdefault(d["index"], {"id": None, "name": "", "arguments": ""})
            if "id" in d:
                assert entry["id"] is None and d["type"] == "function"
                assert d["function"]["arguments"] == ""  # OpenAI's order: name first
                entry.update(id=d["id"], name=d["function"]["name"])
            entry["arguments"] += d["function"]["arguments"]
    assert list(calls) == list(range(len(calls)))
    return content or None, [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for c in calls.values()]


@pytest.mark.parametrize("family", list(FORMATS))
def test_each_format_parses_its_real_output(family):
    for text, content in [FORMATS[family], *VARIANTS.get(family, [])]:
        got_content, calls = _setup(family).parse(text)
        assert got_content == content, text
        _check_calls(calls)


@pytest.mark.parametrize("family", list(FORMATS))
@pytest.mark.parametrize("incremental", [True, False])
def test_stream_cut_at_every_byte_joins_to_the_one_shot_parse(family, incremental):
    setup = _setup(family)
    for text, _ in [FORMATS[family], *VARIANTS.get(family, [])]:
        whole = setup.parse(text)
        n = len(text.encode())
        streamed = _stream(setup, text, list(range(n)), incremental)
        assert streamed[0] == whole[0]
        assert [c["function"] for c in streamed[1]] == [c["function"] for c in whole[1]]
        rng = random.Random(n)
        for _ in range(5):  # a few coarser chunkings
            cuts = sorted(rng.sample(range(1, n), k=min(8, n - 1)))
            streamed = _stream(setup, text, cuts, incremental)
            assert [c["function"] for c in streamed[1]] == [c["function"] for c in whole[1]]


@pytest.mark.parametrize("family", list(FORMATS))
def test_holdback_stream_never_sends_a_call_that_is_not_one(family):
    """Unconstrained output (outlines "auto"): malformed calls come out as content, in a
    stream as in the one-shot parse, and no call delta is sent for them."""
    setup = _setup(family)
    for text in MALFORMED.get(family, MALFORMED["qwen25"] if family == "hermes" else []):
        text = "Note: " + text
        assert setup.parse(text) == (text, [])
        n = len(text.encode())
        assert _stream(setup, text, list(range(n)), incremental=False) == (text, [])


def test_text_around_and_between_calls_is_content():
    setup = _setup("qwen25")
    text = (f'A <tool_call>\n{{"name": "get_time", "arguments": {A2}}}\n</tool_call> B '
            f'<tool_call>\n{{"name": "get_time", "arguments": {A2}}}\n</tool_call> C')
    content, calls = setup.parse(text)  # the text between calls, a line each
    assert content == "A\nB\nC" and len(calls) == 2 and len({c["id"] for c in calls}) == 2
    assert _stream(setup, text, list(range(len(text))), False)[0] == "A\nB\nC"
    # without a call, the text is the content as it is, whitespace and all
    for plain in ("\n\n  ", " Hi <tool_cal", "Hi\n"):
        assert setup.parse(plain) == (plain, [])
        assert _stream(setup, plain, list(range(len(plain))), False) == (plain, [])
    # parallel_tool_calls false: the first call only
    assert len(_setup("qwen25", parallel=False).parse(text)[1]) == 1
    # a call broken off at the end (max_tokens) is content, not a call
    cut = text[:text.index("</tool_call> B") - 3]
    assert setup.parse(cut) == (cut, [])


def test_mistral_ids_are_nine_alphanumerics():
    calls = _setup("mistral").parse(FORMATS["mistral"][0])[1]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)
    assert all(c["id"].startswith("call_") for c in _setup("qwen25").parse(
        FORMATS["qwen25"][0])[1])


# ------------------------------------------------------------------------------ grammar

@pytest.fixture(scope="module")
def family_tokenizer(model_dir):
    """SmolLM2's tokenizer with every family's markers: special tokens for Llama's, Mistral's
    and DeepSeek's, plain added tokens for Qwen's (as in their own tokenizers)."""
    from radixlm.runtime.weights import load_tokenizer

    tok = load_tokenizer(model_dir)
    tok.add_special_tokens({"additional_special_tokens": [
        "<|python_tag|>", "[TOOL_CALLS]", *DS.values()]})
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<tool_call>", "</tool_call>")])
    ll = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=[tok.eos_token_id])
    return tok, ll


def _accepts(family_tokenizer, grammar: str, text: str) -> bool:
    tok, ll = family_tokenizer
    m = llg.LLMatcher(ll, grammar, log_level=1)
    assert not m.is_error(), m.get_error()
    ids = tok.encode(text, add_special_tokens=False)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


def _grammar(family_tokenizer, setup) -> str:
    tok = family_tokenizer[0]
    return build(setup, token_lookup(lambda t: tok.encode(t, add_special_tokens=False)))


# family -> the exact output form its grammar writes for CALLS (separators of the default
# JSON style), and a one-call form that breaks the form but not the arguments
EXACT = {
    "qwen25": FORMATS["hermes"][0],
    "llama3": (f'{{"name": "get_weather", "parameters": {A1}}};'
               f'{{"name": "get_time", "parameters": {A2}}}'),
    "mistral": FORMATS["mistral"][0],
    "pythonic": FORMATS["pythonic"][0],
    "deepseekv3": (DS["tool▁calls▁begin"] + _ds_call("get_weather", A1) + "\n"
                   + _ds_call("get_time", A2) + DS["tool▁calls▁end"]),
}
WRONG_FORM = {
    "qwen25": f'<tool_call>{{"name": "get_time", "arguments": {A2}}}</tool_call>',
    "llama3": f'{{"name": "get_time", "arguments": {A2}}}',
    "mistral": f'[TOOL_CALLS] {{"name": "get_time", "arguments": {A2}}}',
    "pythonic": '[get_time("東京")]',
    "deepseekv3": DS["tool▁calls▁begin"] + _ds_call("get_time", A2),
}


@pytest.mark.parametrize("family", list(EXACT))
def test_required_grammar_is_the_family_form_with_valid_arguments(family_tokenizer, family):
    text = EXACT[family]
    required = _grammar(family_tokenizer, _setup(family, "required"))
    assert _accepts(family_tokenizer, required, text)
    _check_calls(_setup(family).parse(text)[1])  # and it reads back as the calls
    assert not _accepts(family_tokenizer, required, WRONG_FORM[family])
    assert not _accepts(family_tokenizer, required, "I will not call anything.")
    bad_args = text.replace('"celsius"', '"kelvin"')  # not in the enum
    assert not _accepts(family_tokenizer, required, bad_args)
    # one call only: parallel_tool_calls false, or a named function
    single = _grammar(family_tokenizer, _setup(family, "required", parallel=False))
    assert not _accepts(family_tokenizer, single, text)
    named = _grammar(family_tokenizer, _setup(
        family, {"type": "function", "function": {"name": "get_time"}}))
    one_time = _setup(family).parser.calls_text([("get_time", A2)])
    assert _accepts(family_tokenizer, named, one_time)
    assert not _accepts(family_tokenizer, named, text)


@pytest.mark.parametrize("family", list(EXACT))
def test_auto_grammar_lets_text_or_calls_start(family_tokenizer, family):
    auto = _grammar(family_tokenizer, _setup(family))
    assert _accepts(family_tokenizer, auto, "The weather in Oslo is fine, no call needed.")
    assert _accepts(family_tokenizer, auto, EXACT[family])
    assert _accepts(family_tokenizer, auto, "Let me look. " + EXACT[family])
    bad_args = EXACT[family].replace('"celsius"', '"kelvin"')
    assert not _accepts(family_tokenizer, auto, bad_args)  # once a call starts, it is one


def test_strict_closes_open_objects(family_tokenizer):
    loose = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"opts": {"type": "object"}}, "required": ["opts"]}}}
    strict = {"type": "function", "function": {**loose["function"], "strict": True}}
    extra = '<tool_call>\n{"name": "f", "arguments": {"opts": {"x": 1}}}\n</tool_call>'
    empty = '<tool_call>\n{"name": "f", "arguments": {"opts": {}}}\n</tool_call>'
    g_loose = _grammar(family_tokenizer, _setup("qwen25", "required", tools=[loose]))
    g_strict = _grammar(family_tokenizer, _setup("qwen25", "required", tools=[strict]))
    assert _accepts(family_tokenizer, g_loose, extra)
    assert not _accepts(family_tokenizer, g_strict, extra)
    assert _accepts(family_tokenizer, g_strict, empty)


def test_markers_that_are_special_tokens_keep_special_tokens_in_the_text(family_tokenizer):
    tok = family_tokenizer[0]
    token_of = token_lookup(lambda t: tok.encode(t, add_special_tokens=False))
    assert tool_sampling(_setup("llama3"), token_of)["skip_special_tokens"] is False
    assert "<[" in tool_sampling(_setup("mistral", "required"), token_of)["ebnf"]
    plain = token_lookup(lambda t: [1, 2])  # no marker is one token
    assert "skip_special_tokens" not in tool_sampling(_setup("llama3"), plain)
    assert tool_sampling(_setup("llama3", "none"), token_of) == {}


# ------------------------------------------------------------------------- the names

def test_parser_names_and_template_detection():
    assert set(TOOL_CALL_PARSERS) == {"qwen25", "hermes", "llama3", "mistral", "pythonic",
                                      "deepseekv3"}
    with pytest.raises(ValueError, match="llama3.*pythonic"):
        get_parser("llama4")
    cases = {
        "{{ '<|im_start|>' }}{% if tools %}<tool_call>{% endif %}": "qwen25",
        "{{ bos_token }}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]": "mistral",
        "<|start_header_id|>ipython<|end_header_id|><|python_tag|>": "llama3",
        "<|start_header_id|>user<|end_header_id|>": "llama3",
        "[func_name1(params_name1=params_value1)]<|start_header_id|>": "pythonic",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function": "deepseekv3",
        "<|im_start|>user": "qwen25",
        "[INST] {{ m }} [/INST]": None,
    }
    for template, expected in cases.items():
        assert detect_parser(template) == expected, template
    assert resolve_parser(None, "[INST]").name == "qwen25"  # unrecognised: the generic form
    assert resolve_parser("mistral", "<|im_start|>").name == "mistral"  # the setting wins


def test_unknown_parser_is_a_startup_error_naming_the_choices():
    from radixlm.cli import build_parser, engine_kwargs_from_args
    from radixlm.runtime.config import EngineConfig

    args = build_parser().parse_args(["serve", "--tool-call-parser", "llama3"])
    assert EngineConfig.from_kwargs(**engine_kwargs_from_args(args)).tool_call_parser == "llama3"
    args = build_parser().parse_args(["serve", "--tool-call-parser", "nope"])
    with pytest.raises(ValueError, match="tool_call_parser must be one of qwen25, hermes"):
        EngineConfig.from_kwargs(**engine_kwargs_from_args(args))


@pytest.mark.parametrize("tools, choice, needle", [
    ([WEATHER, WEATHER], None, "'get_weather' is given twice"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "'nope'"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}], None, "function 'f'"),
])
def test_bad_tool_definitions_name_the_function(tools, choice, needle):
    with pytest.raises(ValueError, match=needle):
        parse_tools(tools, choice, None, get_parser("qwen25"))


def test_pythonic_refuses_what_it_cannot_write():
    dashed = {"type": "function", "function": {"name": "get-weather", "parameters": {}}}
    with pytest.raises(ValueError, match="'get-weather' is not a Python identifier"):
        parse_tools([dashed], None, None, get_parser("pythonic"))
    union = {"type": "function", "function": {"name": "f", "parameters": {
        "anyOf": [{"type": "object"}, {"type": "null"}]}}}
    with pytest.raises(ValueError, match="function 'f'"):
        parse_tools([union], None, None, get_parser("pythonic"))
    assert parse_tools([dashed], None, None, get_parser("qwen25")) is not None
