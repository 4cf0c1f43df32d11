"""Reasoning in responses: the engine's reasoning parser (``--reasoning-parser``) splits each
choice's text into its thinking and its answer, at once or as it streams.

A route asks ``reasoning_setup`` once per request (None: no parser, or the request set
``separate_reasoning`` false and gets the raw text), then ``split_text`` per result, or wraps
its merged stream in ``split_stream``, which yields each chunk with ``text`` cut down to the
answer so far plus the new reasoning text. Where a choice's output starts (inside the
thinking block, in an answer that may open one, in an answer without one) is read off its
prompt exactly as the engine reads it for the grammar, so the split and the grammar's
boundary agree. Tool calls are parsed afterwards,
from the answer only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.constraints.reasoning import (
    ReasoningFormat,
    ReasoningParser,
    get_format,
    output_start,
    prompt_tail,
)
from radixlm.server.state import ServerState


@dataclass(frozen=True)
class ReasoningSetup:
    """How a request's responses are split: the format, and whether reasoning streams as
    it comes (``stream_reasoning``, SGLang's field) or in one delta once it has ended."""

    fmt: ReasoningFormat
    stream_reasoning: bool = True


def reasoning_parser_name(state: ServerState) -> str | None:
    """The engine's reasoning parser, or None."""
    return getattr(getattr(state.engine, "config", None), "reasoning_parser", None)


def reasoning_setup(state: ServerState, separate: bool | None,
                    stream_reasoning: bool = True) -> ReasoningSetup | None:
    """The split of a request's responses: None without a reasoning parser or with
    ``separate`` false (the raw text, thinking included)."""
    name = reasoning_parser_name(state)
    if name is None or separate is False:
        return None
    return ReasoningSetup(get_format(name), stream_reasoning)


def new_parser(setup: ReasoningSetup, state: ServerState, call: Any) -> ReasoningParser:
    """A parser for one call's output, starting where the engine's grammar starts."""
    tail = prompt_tail(state.engine.tokenizer, call.input_ids or [])
    return ReasoningParser(setup.fmt, output_start(setup.fmt, tail))


def split_text(setup: ReasoningSetup | None, state: ServerState, call: Any,
               text: str) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a finished call's text; (None, text) without a setup."""
    if setup is None:
        return None, text
    return new_parser(setup, state, call).parse(text)


def reasoning_tokens(setup: ReasoningSetup | None, state: ServerState, call: Any,
                     output_ids: Sequence[int]) -> int:
    """How many of a call's output tokens were thinking: those before the token that ends
    the thinking block (all of them if it never ended); 0 without a setup or a block.
    A binary search over decoded prefixes (the block has ended in a prefix, or not yet)."""
    if setup is None or not output_ids:
        return 0
    decode = state.engine.tokenizer.decode

    def parser_after(k: int) -> ReasoningParser:
        parser = new_parser(setup, state, call)
        parser.feed(decode(list(output_ids[:k])))
        return parser

    whole = parser_after(len(output_ids))
    if not whole.had_block:
        return 0
    if not whole.in_answer:
        return len(output_ids)
    lo, hi = 1, len(output_ids)  # the smallest prefix in which the block has ended
    while lo < hi:
        mid = (lo + hi) // 2
        if parser_after(mid).in_answer:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


class StreamSplit:
    """One streamed choice: cumulative text in, (new reasoning, answer so far) out."""

    def __init__(self, setup: ReasoningSetup, parser: ReasoningParser) -> None:
        self.setup = setup
        self.parser = parser
        self.seen = 0  # characters of the raw text fed so far
        self.answer = ""
        self.reasoning = ""  # all reasoning text so far
        self.sent = 0  # of which handed out

    def update(self, text: str, final: bool) -> str:
        """Feed the cumulative raw ``text``; returns the reasoning text to send now."""
        thought, answer = self.parser.feed(text[self.seen:])
        self.seen = len(text)
        if final:
            more_thought, more_answer = self.parser.finish()
            thought, answer = thought + more_thought, answer + more_answer
        self.reasoning += thought
        self.answer += answer
        if not self.setup.stream_reasoning and not (final or self.parser.in_answer):
            return ""
        out, self.sent = self.reasoning[self.sent:], len(self.reasoning)
        return out


async def split_stream(setup: ReasoningSetup | None, state: ServerState, calls: Sequence[Any],
                       chunks: AsyncIterator[tuple[int, dict[str, Any]]]
                       ) -> AsyncIterator[tuple[int, dict[str, Any], str]]:
    """(index, chunk, new reasoning text) for each (index, chunk) of ``chunks``: with a
    setup, the chunk's ``text`` is the answer so far and ``reasoning_text`` all reasoning so
    far; without one, chunks pass as they are (and the reasoning is "")."""
    splits: dict[int, StreamSplit] = {}
    async for k, chunk in chunks:
        if setup is None:
            yield k, chunk, ""
            continue
        split = splits.get(k)
        if split is None:
            split = splits[k] = StreamSplit(setup, new_parser(setup, state, calls[k]))
        final = chunk.get("meta_info", {}).get("finish_reason") is not None
        thought = split.update(chunk.get("text", ""), final)
        yield k, {**chunk, "text": split.answer, "reasoning_text": split.reasoning}, thought
