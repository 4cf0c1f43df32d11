"""The reasoning parsers (``radixlm.constraints.reasoning``, SGLang's ``--reasoning-parser``
names) on exact strings, streamed at every cut, and where a prompt leaves the output.

Expected splits are written out by hand from the formats' documented behaviour (SGLang's
docs: DeepSeek-R1 may omit ``<think>``, Qwen3 writes it unless thinking is off, Qwen3-Thinking
templates open it themselves); the streaming parse must join to the one-shot parse for every
way of cutting the text, at every UTF-8 byte.
"""

from __future__ import annotations

import codecs
import random

import pytest

from radixlm.constraints.reasoning import (
    ANSWER,
    FORMATS,
    OPENING,
    REASONING,
    REASONING_PARSERS,
    ReasoningParser,
    get_format,
    output_start,
    split_reasoning,
)

# (parser, text, reasoning (None: no thinking block), answer)
CASES = [
    ("qwen3", "<think>add them</think>\n\n42", "add them", "\n\n42"),
    ("qwen3", "<think>\nadd them\n</think>\n\n42", "\nadd them\n", "\n\n42"),
    ("qwen3", "42", None, "42"),  # no start tag: all answer
    ("qwen3", " <think>x</think>y", None, " <think>x</think>y"),  # opens only at the start
    ("qwen3", "<think>cut off while thinking", "cut off while thinking", ""),
    ("qwen3", "<think><think>twice</think>ok", "twice", "ok"),  # leading start tags dropped
    ("qwen3", "<think>a</think>b</think>c", "a", "b</think>c"),  # the first end tag ends it
    ("qwen3", "<think>nested <think> text</think>done", "nested <think> text", "done"),
    ("qwen3", "<think>", "", ""),
    ("qwen3", "<thi", None, "<thi"),  # a partial start tag, then the end: answer text
    ("qwen3", "<think>x</thi", "x</thi", ""),  # a partial end tag: still reasoning
    ("qwen3", "", None, ""),
    ("qwen3", "<think>数学 ≠ 😀</think>答え: 42 ✓", "数学 ≠ 😀", "答え: 42 ✓"),
    ("qwen3-thinking", "add them</think>\n\n42", "add them", "\n\n42"),
    ("qwen3-thinking", "still thinking", "still thinking", ""),
    ("qwen3-thinking", "<think>also with the tag</think>ok", "also with the tag", "ok"),
    ("qwen3-thinking", "", "", ""),
    ("deepseek-r1", "add them</think> 42", "add them", " 42"),
    ("deepseek-r1", "<think>R1-0528 writes the tag</think>42", "R1-0528 writes the tag", "42"),
    ("deepseek-r1", "still thinking", "still thinking", ""),
    ("deepseek-r1", "x <think> y</think>z", "x <think> y", "z"),
    ("kimi", "\u25c1think\u25b7hm\u25c1/think\u25b7ok", "hm", "ok"),
]


@pytest.mark.parametrize("name, text, reasoning, answer", CASES)
def test_one_shot_split(name, text, reasoning, answer):
    assert split_reasoning(text, name) == (reasoning, answer)


def _stream(name: str, pieces: list[str], start: str | None = None):
    parser = ReasoningParser(get_format(name), start)
    r, a = "", ""
    for piece in pieces:
        dr, da = parser.feed(piece)
        r, a = r + dr, a + da
    dr, da = parser.finish()
    return (r + dr if parser.had_block else None), a + da


def _cut_bytes(text: str, cuts: list[int]) -> list[str]:
    """``text``'s UTF-8 cut at byte offsets ``cuts``, decoded incrementally (an incomplete
    character waits for its next bytes, as a detokenizer's text does)."""
    data, out, decoder, last = text.encode(), [], codecs.getincrementaldecoder("utf-8")(), 0
    for cut in [*cuts, len(text.encode())]:
        out.append(decoder.decode(data[last:cut], final=cut == len(data)))
        last = cut
    return out


@pytest.mark.parametrize("name, text, reasoning, answer", CASES)
def test_stream_cut_at_every_byte_joins_to_the_one_shot_split(name, text, reasoning, answer):
    size = len(text.encode())
    for cut in range(size + 1):  # every single cut
        assert _stream(name, _cut_bytes(text, [cut])) == (reasoning, answer), cut
    assert _stream(name, _cut_bytes(text, list(range(size)))) == (reasoning, answer)  # byte
    rng = random.Random(size)
    for _ in range(30):  # several cuts at once
        cuts = sorted(rng.sample(range(size + 1), min(size + 1, rng.randint(1, 5))))
        assert _stream(name, _cut_bytes(text, cuts)) == (reasoning, answer), cuts


def test_stream_hands_out_text_as_soon_as_it_is_certain():
    parser = ReasoningParser(get_format("qwen3"))
    assert parser.feed("<th") == ("", "")  # may still be the start tag
    assert parser.feed("ink>I think") == ("I think", "")
    assert parser.feed(" so</") == (" so", "")  # "</" may start the end tag
    assert not parser.in_answer
    assert parser.feed("think>The answer") == ("", "The answer")
    assert parser.in_answer
    assert parser.feed(" <think>is 4</think>") == ("", " <think>is 4</think>")
    assert parser.finish() == ("", "")


def test_where_the_output_starts_overrides_the_format_default():
    assert split_reasoning("thinking</think>answer", "qwen3", REASONING) == (
        "thinking", "answer")
    assert split_reasoning("answer only", "deepseek-r1", OPENING) == (None, "answer only")
    assert split_reasoning("<think>x</think>y", "deepseek-r1", OPENING) == ("x", "y")
    # thinking turned off by the prompt: no block opens, whatever the output says
    assert split_reasoning("<think>x</think>y", "qwen3", ANSWER) == (None, "<think>x</think>y")
    for cut in range(len("<think>x</think>y") + 1):
        text = "<think>x</think>y"
        assert _stream("qwen3", [text[:cut], text[cut:]], ANSWER) == (None, text)


@pytest.mark.parametrize("name, tail, expected", [
    ("qwen3", "<|im_start|>assistant\n", OPENING),  # Qwen3 writes <think> itself
    ("qwen3", "<|im_start|>assistant\n<think>\n", REASONING),  # the template opened it
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", ANSWER),  # thinking off
    ("qwen3-thinking", "<|im_start|>assistant\n", REASONING),
    ("deepseek-r1", "<｜Assistant｜>", REASONING),
    ("deepseek-r1", "<｜Assistant｜><think>\n", REASONING),
    ("deepseek-r1", "<｜Assistant｜><think>\n\n</think>\n\n", ANSWER),
    # an earlier turn's closed block is not the end of the prompt
    ("deepseek-r1", "<think>a</think>b<｜User｜>hi<｜Assistant｜>", REASONING),
])
def test_where_a_prompt_leaves_the_output(name, tail, expected):
    assert output_start(get_format(name), tail) == expected


def test_unknown_parser_lists_the_choices():
    with pytest.raises(ValueError, match="unknown reasoning parser 'qwen9'; choose one of "
                                         "deepseek-r1, deepseek-v3, .*qwen3, qwen3-thinking"):
        get_format("qwen9")
    assert {"qwen3", "deepseek-r1", "qwen3-thinking"} <= set(REASONING_PARSERS)
    assert FORMATS["deepseek-r1"].forced and FORMATS["qwen3-thinking"].forced
    assert not FORMATS["qwen3"].forced


def test_dsl_separate_reasoning_uses_the_same_parser_and_strips():
    from radixlm.lang.reasoning import split_reasoning as dsl_split

    for name, text, reasoning, answer in CASES:
        assert dsl_split(text, name) == ((reasoning or "").strip(), answer.strip())
