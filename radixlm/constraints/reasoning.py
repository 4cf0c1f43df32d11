"""Reasoning formats and the one parser that splits a reasoning model's thinking from its
answer, for the server (``--reasoning-parser``), the engine (where the answer's grammar
starts) and the DSL (``separate_reasoning``). Plain Python: the frontend imports it.

A format is a pair of tags (``<think>`` ... ``</think>``) and whether the model starts
inside its thinking without writing the start tag (``forced``: DeepSeek-R1, and templates
that open ``<think>`` themselves). The names and tags are SGLang's ``--reasoning-parser``
choices. The rules, one state machine for the one-shot and the streaming parse (so that
streamed deltas always join to the one-shot split, however the text is cut):

- where the output starts (``output_start``): ``REASONING`` (forced formats, and prompts
  that end inside an open block), ``ANSWER`` (prompts that end with a closed block: the
  template turned thinking off) or ``OPENING`` (the others): a thinking block opens only if
  the output begins with the start tag (exactly: no text before it);
- leading start tags of a thinking block are dropped (``(<think>)*reasoning</think>``);
- reasoning runs to the first end tag, which is dropped; everything after it is the answer,
  as written (no stripping);
- without an end tag, all of it is reasoning (cut off while thinking).

Where this differs from SGLang's parsers: SGLang's one-shot parse opens reasoning on a start
tag anywhere in the text while its streaming parse does not, and its Qwen3 parser also ends
reasoning at ``<tool_call>``; here a block opens only at the start of the output and ends
only at the end tag, the same boundary the grammar wrapper (``after_reasoning``) enforces.
"""

from __future__ import annotations

from dataclasses import dataclass

# Tokens a thinking block may not contain under --enable-strict-thinking (SGLang's
# think_excluded_tokens of its Qwen3 parser): the end of the turn and tool-call tags.
QWEN3_EXCLUDED = ("<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class ReasoningFormat:
    """One model family's thinking block: ``start`` ... ``end`` tags, whether its output
    starts inside the block without the start tag (``forced``), and the tokens a thinking
    block may not contain under strict thinking (``excluded``)."""

    name: str
    start: str
    end: str
    forced: bool
    excluded: tuple[str, ...] = ()


FORMATS = {f.name: f for f in (
    ReasoningFormat("deepseek-r1", "<think>", "</think>", forced=True),
    ReasoningFormat("deepseek-v3", "<think>", "</think>", forced=False),
    ReasoningFormat("glm45", "<think>", "</think>", forced=False),
    ReasoningFormat("kimi", "\u25c1think\u25b7", "\u25c1/think\u25b7", forced=False),
    ReasoningFormat("qwen3", "<think>", "</think>", forced=False, excluded=QWEN3_EXCLUDED),
    ReasoningFormat("qwen3-thinking", "<think>", "</think>", forced=True,
                    excluded=QWEN3_EXCLUDED),
    ReasoningFormat("step3", "<think>", "</think>", forced=True),
)}
REASONING_PARSERS = tuple(sorted(FORMATS))


def get_format(name: str | None, what: str = "reasoning parser") -> ReasoningFormat:
    """The format called ``name``; ValueError listing the choices otherwise."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(REASONING_PARSERS)}")
    return fmt


# Where an output starts: inside a thinking block, in an answer that may begin with one, or
# in an answer with no block (the prompt closed it).
REASONING, OPENING, ANSWER = "reasoning", "opening", "answer"


def output_start(fmt: ReasoningFormat, prompt_tail: str) -> str:
    """Where the output of a prompt ending in ``prompt_tail`` starts: the prompt ends with
    the start tag (the template opened the block, e.g. Qwen3-Thinking and DeepSeek-R1
    templates) -> ``REASONING``; with the end tag (the template closed an empty block:
    ``enable_thinking=False``) -> ``ANSWER``; else ``REASONING`` for forced formats and
    ``OPENING`` for the others. Trailing whitespace does not count."""
    tail = prompt_tail.rstrip()
    if tail.endswith(fmt.start):
        return REASONING
    if tail.endswith(fmt.end):
        return ANSWER
    return default_start(fmt)


def default_start(fmt: ReasoningFormat) -> str:
    """Where an output starts when nothing is known of its prompt."""
    return REASONING if fmt.forced else OPENING


PROMPT_TAIL_TOKENS = 16  # what `prompt_tail` decodes: enough for the tags and whitespace


def prompt_tail(tokenizer, prompt_ids: list[int]) -> str:
    """The text of the last few prompt tokens, special tokens kept (for ``output_start``)."""
    return tokenizer.decode(list(prompt_ids[-PROMPT_TAIL_TOKENS:]), skip_special_tokens=False)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Splits one response into (reasoning, answer), at once (``parse``) or as it streams
    (``feed`` each new piece of text, then ``finish``). ``start``: where the output starts
    (``output_start``; default: ``default_start`` of the format).

    ``reasoning`` is None (no thinking block) until a block has opened; ``parse`` and the
    joined deltas of ``feed`` + ``finish`` are always equal."""

    OPENING, LEADING, REASONING, ANSWER = range(4)

    def __init__(self, fmt: ReasoningFormat, start: str | None = None) -> None:
        self.fmt = fmt
        start = default_start(fmt) if start is None else start
        if start not in (REASONING, OPENING, ANSWER):
            raise ValueError(f"start must be {REASONING}, {OPENING} or {ANSWER}, got {start!r}")
        self.state = {REASONING: self.LEADING, OPENING: self.OPENING,
                      ANSWER: self.ANSWER}[start]
        self.had_block = start == REASONING
        self._held = ""  # text that may still turn out to be (part of) a tag

    def parse(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, answer) of a whole response; use a fresh parser."""
        r1, a1 = self.feed(text)
        r2, a2 = self.finish()
        return (r1 + r2 if self.had_block else None), a1 + a2

    def feed(self, piece: str) -> tuple[str, str]:
        """The (reasoning, answer) text that ``piece`` makes certain."""
        text = self._held + piece
        self._held = ""
        reasoning = answer = ""
        while text:
            if self.state == self.ANSWER:
                answer, text = answer + text, ""
            elif self.state in (self.OPENING, self.LEADING):
                tag = self.fmt.start
                if text.startswith(tag):
                    text = text[len(tag):]
                    self.state, self.had_block = self.LEADING, True
                elif tag.startswith(text):  # could still become the tag
                    self._held, text = text, ""
                else:
                    self.state = self.ANSWER if self.state == self.OPENING else self.REASONING
            else:  # REASONING
                cut = text.find(self.fmt.end)
                if cut >= 0:
                    reasoning += text[:cut]
                    text = text[cut + len(self.fmt.end):]
                    self.state = self.ANSWER
                else:
                    keep = _partial_suffix(text, self.fmt.end)
                    reasoning += text[:len(text) - keep]
                    self._held, text = text[len(text) - keep:], ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """What was held back, once the response has ended: a partial start tag is answer
        text when no block had opened, reasoning otherwise; a partial end tag is reasoning."""
        held, self._held = self._held, ""
        if self.state == self.OPENING:
            return "", held
        return held, ""

    @property
    def in_answer(self) -> bool:
        """True once the answer has begun (the thinking block, if any, has ended)."""
        return self.state == self.ANSWER


def split_reasoning(text: str, fmt: ReasoningFormat | str,
                    start: str | None = None) -> tuple[str | None, str]:
    """(reasoning or None, answer) of ``text`` (``ReasoningParser.parse``)."""
    if isinstance(fmt, str):
        fmt = get_format(fmt)
    return ReasoningParser(fmt, start).parse(text)
