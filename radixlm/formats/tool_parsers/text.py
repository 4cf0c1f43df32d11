"""Reading a model's growing output text: where a JSON (or Python) value ends, one call
object ``{"name": ..., "arguments" | "parameters": ...}``, literals that may still be
arriving. Plain Python; every function takes the whole text and a position, so a stream is
read again from its start at each chunk (outputs are short; nothing is carried over)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# a complete string, a bracket, or a quote that opens a string not closed yet
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]|"')
_PY_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|[{}\[\]()]|["\']')
_JSON_LITERAL = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_CALL_HEAD = re.compile(
    r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_WS = re.compile(r"\s*")


@dataclass
class ParsedCall:
    """One tool call read from the output. ``arguments`` is JSON text: the model's own text
    of the arguments object where it wrote one (so a stream's argument fragments join to it),
    else the parsed value re-serialized. ``done``: the arguments are complete. ``stable``:
    nothing that can follow in the text can make this call not a call."""

    name: str
    arguments: str
    done: bool = True
    stable: bool = True


def skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _bracket_end(text: str, i: int, tokens: re.Pattern) -> int | None:
    depth = 0
    for m in tokens.finditer(text, i):
        tok = m.group()
        if tok in ('"', "'"):
            return None  # a string still open at the end
        if tok in "{[(":
            depth += 1
        elif tok in "}])":
            depth -= 1
            if depth == 0:
                return m.end()
    return None


def value_end(text: str, i: int) -> int | None:
    """End of the JSON value that starts at ``text[i]``, or None while it is still open at
    the end of the text. Brackets and strings are matched, nothing else is checked (the
    caller parses the value once it is closed); what is not JSON ends at once."""
    if i >= len(text):
        return None
    if text[i] in "{[":
        return _bracket_end(text, i, _JSON_TOKENS)
    if text[i] == '"':
        m = _JSON_TOKENS.match(text, i)
        return m.end() if m is not None and len(m.group()) > 1 else None
    m = _JSON_LITERAL.match(text, i)
    if m is None:
        return i + 1
    return None if m.end() == len(text) else m.end()


def python_end(text: str, i: int) -> int | None:
    """End of the bracketed Python expression that starts at ``text[i]`` (one of ``[({``),
    or None while it is open at the end of the text."""
    return _bracket_end(text, i, _PY_TOKENS)


def literal_at(text: str, i: int, literal: str, final: bool) -> str:
    """Whether ``literal`` is at ``text[i]``: "yes", "partial" (the text ends inside it and
    more may come) or "no"."""
    if text.startswith(literal, i):
        return "yes"
    if not final and len(text) - i < len(literal) and literal.startswith(text[i:]):
        return "partial"
    return "no"


def held_back(text: str, starts: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` may be the beginning of one of ``starts``
    (held back from a stream until the next chunk tells)."""
    for k in range(min(max(map(len, starts), default=0) - 1, len(text)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in starts):
            return k
    return 0


def read_call(text: str, i: int, final: bool) -> tuple[str, ParsedCall | None, int | None]:
    """The call object at ``text[i]`` as (status, call, end): "done" with the call and the
    end of the object; "open" while the object runs to the end of the text (the call so
    far once its name is known, its arguments the text written so far); "bad" when it is
    not a call object (end: where the bad value ends, None if unknown)."""
    end = value_end(text, i)
    head = _CALL_HEAD.match(text, i)
    if end is None:
        if final or head is None:
            return ("bad" if final else "open"), None, None
        a = head.end()
        v = value_end(text, a)
        return "open", ParsedCall(json.loads(head.group(1)), text[a:v], done=v is not None,
                                  stable=False), None
    try:
        obj = json.loads(text[i:end])
    except ValueError:
        return "bad", None, end
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return "bad", None, end
    key = "arguments" if "arguments" in obj else "parameters"
    args = obj.get(key, {})
    if not isinstance(args, dict):
        return "bad", None, end
    if head is not None:
        raw = text[head.end():value_end(text, head.end())]
    else:
        raw = json.dumps(args, ensure_ascii=False)
    return "done", ParsedCall(obj["name"], raw), end
