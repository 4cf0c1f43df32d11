"""The interface of a tool-call format (``ToolCallParser``) and the scanning they share.

A format knows three things about one model family: the prompt (how tools, earlier calls
and tool results are written for a chat template that does not render tools itself), the
grammar (the exact text of its calls, as Lark rules for llguidance, built by
``grammar.build``) and parsing back (``scan``: content and calls of an output, finished or
still growing).

A format's output is free text with *sections*: a section begins where ``start_re``
matches and holds one or more calls in the family's form (``section`` reads one). Text
outside sections is content; a section that does not read as calls is content too (never
dropped). While a stream grows, the tail that may still become a section start
(``hold_prefixes``) and a section still open are held back from content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from radixlm.formats.tool_parsers.text import ParsedCall, held_back


@dataclass
class Section:
    """One section as a format read it. ``end``: where the text after it starts; None while
    it runs to the end of the text (open; at the end of the output it is decided). ``ok``
    False: it is not a call section, and ``text[start:end]`` is content."""

    calls: list[ParsedCall]
    end: int | None
    ok: bool = True


@dataclass
class Scan:
    """An output read by a format: the content (text outside calls; in a growing text, only
    what can no longer become a call; whitespace that touches a call is not content) and
    the calls in order."""

    content: str
    calls: list[ParsedCall]


BAD_OPEN = Section([], None, ok=False)


class LarkText:
    """What a format needs to write its grammar: ``marker(text)`` is the Lark term of a
    marker (``<[id]>`` where the tokenizer has it as one token, as llguidance matches
    special tokens only by id; a quoted literal otherwise); ``args(k)`` the rule name of
    function k's arguments (JSON under its schema; defined by ``grammar.build``)."""

    def __init__(self, token_of: Any) -> None:
        self._token_of = token_of

    def marker(self, text: str) -> str:
        tid = self._token_of(text)
        return f"<[{tid}]>" if tid is not None else lit(text)

    def has_token(self, text: str) -> bool:
        return self._token_of(text) is not None

    @staticmethod
    def args(k: int) -> str:
        return f"args_{k}"


def lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


class ToolCallParser:
    """One family's tool-call format (SGLang's ``--tool-call-parser`` names).

    Contract: ``scan(text, final=True)`` is the one-shot parse; for every prefix p of a
    text, the content and the calls' arguments of ``scan(p, final=False)`` are prefixes of
    those of ``scan(text, final=True)`` (stable calls exactly, unstable ones while the text
    has the family's form), so a stream built from successive scans joins to the one-shot
    result.
    """

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()  # texts that may be single (special) tokens
    opener: ClassVar[str] = ""  # the literal a section starts with (the default start_re)
    one_section: ClassVar[bool] = True  # all calls in one section (else one per call)
    json_arguments: ClassVar[bool] = True  # arguments are a JSON object (rules args_k)

    # ---------------------------------------------------------------- parsing back

    def start_re(self, names: frozenset[str]) -> re.Pattern:
        """Where a section may begin (by default: at ``opener``)."""
        return re.compile(re.escape(self.opener))

    def hold_prefixes(self, names: frozenset[str]) -> tuple[str, ...]:
        """Literal section starts whose beginning, at the end of a growing text, is held."""
        return (self.opener,)

    def section(self, text: str, start: int, final: bool, names: frozenset[str]) -> Section:
        """Read the section whose start ``start_re`` matched at ``start``; calls of
        functions not in ``names`` make it not a call section."""
        raise NotImplementedError

    def scan(self, text: str, final: bool, names: frozenset[str]) -> Scan:
        """Content and calls of ``text`` (``final``: the whole output)."""
        start_re = self.start_re(names)
        pieces = [""]  # the text between call sections
        calls: list[ParsedCall] = []
        pos = 0
        while True:
            m = start_re.search(text, pos)
            if m is None:
                tail = text[pos:]
                keep = len(tail) if final else len(tail) - held_back(tail,
                                                                     self.hold_prefixes(names))
                pieces[-1] += tail[:keep]
                break
            pieces[-1] += text[pos:m.start()]
            sec = self.section(text, m.start(), final, names)
            if sec.ok:
                calls.extend(sec.calls)
                pieces.append("")
            else:
                pieces[-1] += text[m.start():sec.end]
            if sec.end is None:
                break
            pos = max(sec.end, m.start() + 1)
        return Scan(_content(pieces), calls)

    # ---------------------------------------------------------------------- prompt

    def tools_prompt(self, functions: list[dict[str, Any]]) -> str:
        """The family's documented system text listing ``functions`` and the call form
        (for chat templates that do not render ``tools`` themselves)."""
        raise NotImplementedError

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        """The exact output text of ``calls`` ((name, arguments JSON text) pairs): how an
        earlier assistant turn's calls are written back into the prompt."""
        raise NotImplementedError

    def result_message(self, content: str) -> dict[str, str]:
        """The chat message carrying a tool result, for templates without a tool role."""
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}

    def new_call_id(self) -> str:
        return "call_" + uuid.uuid4().hex[:24]

    def check_function(self, where: str, fn: dict[str, Any]) -> None:
        """ValueError (naming ``where``) for a function this format cannot express."""

    # --------------------------------------------------------------------- grammar

    def call_rules(self, fns: list[dict[str, Any]], g: LarkText) -> list[str]:
        """Lark rules ``call_k`` (one complete call of function k) and their helpers."""
        raise NotImplementedError

    def required_rule(self, g: LarkText, many: bool) -> str:
        """The body of ``start`` when the output must be calls (rule ``call`` is any one
        call); ``many``: one or more calls, else exactly one."""
        raise NotImplementedError

    def auto_segments(self, fns: list[dict[str, Any]], g: LarkText,
                      many: bool) -> list[tuple[str, str]]:
        """(trigger, body) pairs: free text in which ``trigger`` starts a section written
        by ``body`` (what follows the trigger)."""
        raise NotImplementedError


def _content(pieces: list[str]) -> str:
    """The content of text pieces split by call sections: with no section the text as it
    is; otherwise the pieces without the whitespace that touches a section, one per line."""
    if len(pieces) == 1:
        return pieces[0]
    last = len(pieces) - 1
    parts = [(p.lstrip() if i else p) if i == last else (p.lstrip() if i else p).rstrip()
             for i, p in enumerate(pieces)]
    return "\n".join(p for p in parts if p)


def calls_rule(many: bool, sep: str) -> str:
    """``call``, or ``call (sep call)*``."""
    return f"call ({lit(sep)} call)*" if many else "call"


def json_call(g: LarkText, k: int, name: str, key: str = "arguments") -> str:
    """Lark for ``{"name": "<name>", "<key>": <arguments of function k>}``."""
    head = '{"name": ' + json.dumps(name) + f', "{key}": '
    return f'{lit(head)} {g.args(k)} "}}"'


def call_json_text(name: str, arguments: str, key: str = "arguments") -> str:
    """``{"name": ..., "<key>": ...}`` with the arguments text as given."""
    return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{key}": {arguments}}}'


def public_function(fn: dict[str, Any]) -> dict[str, Any]:
    """A parsed function as the prompt lists it (OpenAI's fields)."""
    return {k: fn[k] for k in ("name", "description", "parameters") if k in fn}
