"""Shortest legal close: from a grammar's current state, the bytes of a short valid way to
finish the document, found on a byte-level twin of the request's llguidance matcher.

The twin is an ``LLMatcher`` of the same grammar over a 257-token vocabulary (the 256 bytes
and an EOS), so one step of the search is one byte and a mask costs a few microseconds (a
full-vocabulary mask costs ~100x that). ``ByteTwin`` keeps it fed with the bytes of the tokens
the request's grammar accepted (``sync``: rolled back to the longest common token prefix and
fed the rest, so jump-forward and speculative rollback need no bookkeeping of their own).

``close`` searches in two passes, both capped:

1. Greedy: at each byte, a byte after which the grammar accepts, else the first byte of a
   fixed preference (closers ``] } ) "``; separators; the shortest values ``0``, ``""``,
   ``{}``; letters; ...) after which the mask changes (``]`` is a closer only outside a
   string), else the first allowed byte of the whole preference; forced bytes are taken
   as they come. For JSON this is the close a person would write: end the string, close the
   brackets, fill required keys with their smallest values. A mask met again and again
   (a loop: a pattern such as ``[a-z]+@...``, where the preferred letter never ends the
   run) turns its choice to the next preferred byte every few visits. In a loop the
   grammar's *hints* are tried first: a short string matching each ``pattern`` of a JSON
   schema (``grammar_hints``), which is how a string under an unanchored pattern
   (``"\\d{4}-\\d{2}..."``, whose mask stays "any character" until the pattern matched) is
   ended at all.
2. Breadth-first over bytes, one child per byte class (each non-alphanumeric byte alone, one
   lower-case letter, one upper-case letter, one digit, one non-ASCII byte), a state's mask
   standing for the state (a child whose mask was seen is not expanded again): shortest in
   bytes up to those merges, and loops are cut by them.

The result is a valid close (every byte was accepted by the twin, which ends accepting), not
always the globally shortest: its length is an upper bound of the true minimum, which is what
the budget needs (closing starts no later than needed). None when both passes fail within
their caps; the caller treats that as a grammar it cannot close.
"""

from __future__ import annotations

import json
import re
import re._compiler as sre_compile
import re._constants as sre_c
import re._parser as sre_parse
from collections import deque

import llguidance as llg
import numpy as np

EOS_BYTE = 256  # the twin's EOS token id

_LOWER = bytes(range(ord("a"), ord("z") + 1))
_UPPER = bytes(range(ord("A"), ord("Z") + 1))
_DIGITS = b"0123456789"
# Preference of the greedy pass (first allowed wins); every byte appears once.
_HEAD = b']})"' + b",:0{[a" + b"tnfe" + b"1-.+" + b" "
PREFERENCE = _HEAD + bytes(b for b in (_LOWER + _DIGITS + _UPPER + bytes(range(33, 127))
                                       + bytes(range(128, 256)) + bytes(range(0, 33))
                                       + b"\x7f") if b not in _HEAD)
PREFERENCE = bytes(dict.fromkeys(PREFERENCE))  # (each byte once, order kept)
assert sorted(PREFERENCE) == list(range(256))

MAX_GREEDY_BYTES = 2048  # a greedy close longer than this is taken for a loop
MAX_START_BYTES = 16384  # the same for the close of a grammar's start (searched once)
MAX_HINTS = 32  # pattern samples a grammar keeps
MAX_BFS_NODES = 4000  # states the breadth-first pass may expand
MAX_BFS_DEPTH = 512
LOOP_TURNS = 4  # greedy: visits of one mask before its choice moves on
LOOP_PERIOD = 8  # greedy: the longest period of a run of masks taken for a loop
ESCAPE_NODES = 64  # greedy: states a loop's escape may expand
ESCAPE_TRIES = 8  # greedy: failed escapes before it stops trying
HINT_TRIES = 16  # greedy: loops at which the hints are tried
BRANCH_WIDTH = 8  # greedy: the most choices a branch's lookahead weighs
_BRANCH_BYTES = frozenset(_LOWER + _UPPER + b'"_$@')
ESCAPE_DEPTH = 8  # greedy: the longest escape


class _ByteTokenizer:
    """The 256 bytes and an EOS, in the shape ``llguidance.TokenizerWrapper`` reads."""

    eos_token_id = EOS_BYTE
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<|eos|>"]
    special_token_ids = [EOS_BYTE]

    def __call__(self, text):
        return list(text.encode() if isinstance(text, str) else text)


_BYTE_TOKENIZER: llg.LLTokenizer | None = None


def byte_tokenizer() -> llg.LLTokenizer:
    """The byte vocabulary (built once per process)."""
    global _BYTE_TOKENIZER
    if _BYTE_TOKENIZER is None:
        _BYTE_TOKENIZER = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()), slices=[])
    return _BYTE_TOKENIZER


def byte_matcher(grammar: str, limits: llg.LLParserLimits | None = None) -> llg.LLMatcher:
    """A byte-level matcher of ``grammar`` (an llguidance grammar text); ValueError when
    llguidance refuses it."""
    kwargs = {"limits": limits} if limits is not None else {}
    m = llg.LLMatcher(byte_tokenizer(), grammar, log_level=0, **kwargs)
    if m.is_error():
        raise ValueError(f"byte-level matcher: {m.get_error()[:300]}")
    return m


def allowed_bytes(m: llg.LLMatcher) -> np.ndarray:
    """The bytes ``m`` allows next (EOS excluded), as a bool array of 256."""
    words = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(words, bitorder="little")[:256].astype(bool)


def _accepting(m: llg.LLMatcher) -> bool:
    return m.is_accepting() or m.is_stopped()


def greedy_close(m: llg.LLMatcher, max_bytes: int = MAX_GREEDY_BYTES,
                 lookahead: bool = True, hints: tuple[bytes, ...] = ()) -> bytes | None:
    """Pass 1 (module docstring) from ``m``'s state; ``m`` is left where it was. Two loop
    breakers: a run of masks that repeats with a short period (``}.}.}.`` in an e-mail's
    local part, where each preferred byte changes the mask and none ends it) is left by the
    shortest bytes to a mask not met before (``_escape``: ``@``); and a mask met for the
    ``LOOP_TURNS``-th time without a preferred head byte moves its choice on to the next
    preferred byte (so ``}}}}`` in an unanchored pattern turns into ``]]]]``, ...).
    ``lookahead``: at a choice among a few letters or quotes (which key of an object comes
    next, which enum value), the one whose own greedy close is shortest (``_branch_byte``:
    an optional key is skipped for the next required one). ``hints``: byte strings tried
    first at a loop (``_try_hints``)."""
    out = bytearray()
    turns: dict[bytes, int] = {}
    sigs: list[bytes] = []  # the mask before each byte of ``out``
    stuck: set[bytes] = set()  # masks a loop's escape failed from
    hint_tries = 0  # loops the hints were tried at
    try:
        while not _accepting(m):
            if len(out) >= max_bytes or m.is_error():
                return None
            allowed = allowed_bytes(m)
            sig = allowed.tobytes()
            sigs.append(sig)
            path = None
            if sig not in stuck and len(stuck) < ESCAPE_TRIES and _periodic(sigs):
                if hints and hint_tries < HINT_TRIES:
                    hint_tries += 1
                    path = _try_hints(m, hints, sig)
                path = path or _escape(m, set(sigs))
                if not path:
                    stuck.add(sig)  # (not tried again from this mask)
            if path:
                sigs.extend([b""] * (len(path) - 1))  # (a loop's masks are not repeated)
                out.extend(path)
                continue
            choice = (_branch_byte(m, allowed, max_bytes - len(out), hints) if lookahead
                      else None)
            if choice is None:
                choice = _head_byte(m, allowed)
            if choice is None:
                ranked = [b for b in PREFERENCE if allowed[b]]
                if not ranked:
                    return None
                seen = turns.get(sig, 0)
                turns[sig] = seen + 1
                choice = ranked[(seen // LOOP_TURNS) % len(ranked)]
            if m.try_consume_tokens([choice]) != 1:
                return None
            out.append(choice)
        return bytes(out)
    finally:
        if out:
            m.rollback(len(out))


def _branch_byte(m: llg.LLMatcher, allowed: np.ndarray, max_bytes: int,
                 hints: tuple[bytes, ...] = ()) -> int | None:
    """At a branch (2 to ``BRANCH_WIDTH`` allowed bytes, all letters or quotes, none of which
    ends the document): the byte whose greedy close (without lookahead) is shortest; None
    elsewhere."""
    picks = np.flatnonzero(allowed)
    if not 2 <= picks.size <= BRANCH_WIDTH or not all(b in _BRANCH_BYTES for b in picks):
        return None
    best, best_len = None, max_bytes
    for b in sorted(picks.tolist(), key=PREFERENCE.index):
        if m.try_consume_tokens([b]) != 1:
            continue
        rest = greedy_close(m, best_len, lookahead=False, hints=hints)
        m.rollback(1)
        if rest is not None and len(rest) + 1 < best_len:
            best, best_len = b, len(rest) + 1
    return best


def _periodic(sigs: list[bytes], max_period: int = LOOP_PERIOD) -> bool:
    """Whether the last masks repeat with a period of at most ``max_period`` bytes, three
    times over."""
    n = len(sigs)
    return any(n >= 3 * k and sigs[n - k:] == sigs[n - 2 * k:n - k] == sigs[n - 3 * k:n - 2 * k]
               for k in range(1, max_period + 1))


def _try_hints(m: llg.LLMatcher, hints: tuple[bytes, ...], sig: bytes) -> bytes | None:
    """The first hint ``m`` takes whole after which it accepts or shows another mask than
    ``sig`` (the loop's: a string under an unanchored pattern allows ``"`` once the
    pattern matched); it is consumed on ``m``. None (``m`` unchanged) when none does."""
    for hint in hints:
        took = m.try_consume_tokens(list(hint))
        if took == len(hint) and not m.is_error() and (
                _accepting(m) or allowed_bytes(m).tobytes() != sig):
            return hint
        if took:
            m.rollback(took)
    return None


def _escape(m: llg.LLMatcher, seen: set[bytes]) -> bytes | None:
    """The shortest bytes (one per byte class, breadth-first, capped) from ``m``'s state to
    an accepting state or a mask not in ``seen``; they are consumed on ``m``. None (``m``
    unchanged) when the cap is reached first."""
    frontier = deque([(m.deep_copy(), b"")])
    expanded = 0
    while frontier and expanded < ESCAPE_NODES:
        node, path = frontier.popleft()
        expanded += 1
        for b in _children(allowed_bytes(node)):
            child = node.deep_copy()
            if child.try_consume_tokens([b]) != 1 or child.is_error():
                continue
            step = path + bytes([b])
            sig = allowed_bytes(child).tobytes()
            if _accepting(child) or sig not in seen:
                if m.try_consume_tokens(list(step)) != len(step):
                    raise RuntimeError("the matcher refused a path its copy took")
                return step
            if len(step) < ESCAPE_DEPTH:
                frontier.append((child, step))
    return None


def _head_byte(m: llg.LLMatcher, allowed: np.ndarray) -> int | None:
    """In one pass over the preference head: the first allowed byte after which ``m``
    accepts, else the first after which the mask changes (``]`` closes an array but is only
    a character inside a string, where ``"`` is the closer), else None."""
    progress = None
    for b in _HEAD:
        if allowed[b] and m.try_consume_tokens([b]) == 1:
            done = _accepting(m)
            moved = progress is None and not done and not np.array_equal(allowed_bytes(m),
                                                                          allowed)
            m.rollback(1)
            if done:
                return b
            if moved:
                progress = b
    return progress


def _children(allowed: np.ndarray) -> list[int]:
    """One byte per class of the allowed bytes (module docstring, pass 2)."""
    picks = [b for b in PREFERENCE if allowed[b] and not (
        97 <= b <= 122 or 65 <= b <= 90 or 48 <= b <= 57 or b >= 128)]
    for lo, hi in ((97, 122), (65, 90), (48, 57), (128, 255)):
        hit = np.flatnonzero(allowed[lo:hi + 1])
        if hit.size:
            picks.append(lo + int(hit[0]))
    return picks


def bfs_close(m: llg.LLMatcher, max_nodes: int = MAX_BFS_NODES,
              max_depth: int = MAX_BFS_DEPTH) -> bytes | None:
    """Pass 2 (module docstring) from ``m``'s state; ``m`` is not changed (the search runs
    on copies)."""
    if _accepting(m):
        return b""
    seen = {allowed_bytes(m).tobytes()}
    frontier = deque([(m.deep_copy(), b"")])
    expanded = 0
    while frontier and expanded < max_nodes:
        node, path = frontier.popleft()
        expanded += 1
        if len(path) >= max_depth:
            continue
        for b in _children(allowed_bytes(node)):
            child = node.deep_copy()
            if child.try_consume_tokens([b]) != 1 or child.is_error():
                continue
            if _accepting(child):
                return path + bytes([b])
            sig = allowed_bytes(child).tobytes()
            if sig in seen:
                continue
            seen.add(sig)
            frontier.append((child, path + bytes([b])))
    return None


def close_bytes(m: llg.LLMatcher, hints: tuple[bytes, ...] = (),
                long: bool = False) -> bytes | None:
    """A short valid close of ``m``'s document (greedy, else breadth-first), or None.
    ``long`` (the start of a document, searched once a grammar): first a greedy close
    without the branch lookahead (whose cost grows with the square of the close's length)
    up to ``MAX_START_BYTES``, kept when it is longer than ``MAX_GREEDY_BYTES`` or no
    longer than the usual greedy close (whose search it bounds)."""
    quick = greedy_close(m, MAX_START_BYTES, lookahead=False, hints=hints) if long else None
    if quick is not None and len(quick) > MAX_GREEDY_BYTES:
        return quick
    found = greedy_close(m, MAX_GREEDY_BYTES if quick is None else len(quick), hints=hints)
    found = quick if found is None else found
    return found if found is not None else bfs_close(m)


# ------------------------------------------------------------------------------ hints

_CATEGORY_SAMPLE = {
    sre_c.CATEGORY_DIGIT: "0", sre_c.CATEGORY_NOT_DIGIT: "a", sre_c.CATEGORY_WORD: "a",
    sre_c.CATEGORY_NOT_WORD: "-", sre_c.CATEGORY_SPACE: " ", sre_c.CATEGORY_NOT_SPACE: "a"}
_PROBES = "a0A-_. " + "".join(map(chr, range(33, 127)))


def _one_char(state, item) -> str | None:
    """A character the one-character regex item (a class, ``.``, a category, a negated
    literal) matches: the first of a few plain ones that does."""
    op, av = item
    if op is sre_c.LITERAL:
        return chr(av)
    if op is sre_c.CATEGORY:
        return _CATEGORY_SAMPLE.get(av)
    one = sre_compile.compile(sre_parse.SubPattern(state, [item]), 0)
    return next((c for c in _PROBES if one.fullmatch(c)), None)


def _sample(state, items) -> str | None:
    """A short string the parsed regex ``items`` matches (anchors and lookarounds read as
    empty, a repeat at its least, a branch at its shortest sample); None when unsure."""
    out = []
    for op, av in items:
        if op in (sre_c.AT, sre_c.ASSERT, sre_c.ASSERT_NOT):
            continue
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT):
            lo, _, sub = av
            part = _sample(state, sub) if lo else ""
            part = None if part is None else part * lo
        elif op is sre_c.SUBPATTERN:
            part = _sample(state, av[-1])
        elif op is sre_c.ATOMIC_GROUP:
            part = _sample(state, av)
        elif op is sre_c.BRANCH:
            parts = [p for p in (_sample(state, alt) for alt in av[1]) if p is not None]
            part = min(parts, key=len) if parts else None
        elif op in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.ANY, sre_c.IN, sre_c.CATEGORY):
            part = _one_char(state, (op, av))
        else:  # a back reference, a conditional: not sampled
            return None
        if part is None:
            return None
        out.append(part)
    return "".join(out)


def pattern_sample(pattern: str) -> str | None:
    """A short string that ``pattern`` (a JSON-schema ``pattern``, read as Python reads it)
    matches, or None."""
    try:
        parsed = sre_parse.parse(pattern)
        text = _sample(parsed.state, parsed.data)
        return text if text is not None and re.search(pattern, text) else None
    except (re.error, RecursionError, OverflowError, TypeError, ValueError):
        return None


def _patterns(schema) -> list[str]:
    """Every ``pattern`` string and ``patternProperties`` key in a JSON schema."""
    out, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                out.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                out.extend(node["patternProperties"])
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
    return out


def grammar_hints(grammar: str) -> tuple[bytes, ...]:
    """Hints of the greedy pass (module docstring) for an llguidance grammar text: for the
    JSON schemas in it, a sample of each pattern as it is written inside a JSON string,
    shortest first (at most ``MAX_HINTS``); none for other grammars."""
    try:
        parts = json.loads(grammar).get("grammars", [])
    except (ValueError, AttributeError):
        return ()
    found = set()
    for part in parts:
        schema = part.get("json_schema") if isinstance(part, dict) else None
        for pattern in _patterns(schema) if schema is not None else ():
            text = pattern_sample(pattern)
            if text:
                found.add(json.dumps(text)[1:-1].encode())
    return tuple(sorted(found, key=lambda h: (len(h), h))[:MAX_HINTS])


class ByteTwin:
    """A request's byte-level matcher, kept at the bytes of the tokens its grammar accepted.

    ``template``: a fresh byte matcher of the grammar (deep-copied here); ``spell(token)``:
    a token's bytes; ``hints``: the grammar's (``grammar_hints``)."""

    def __init__(self, template: llg.LLMatcher, spell, hints: tuple[bytes, ...] = ()) -> None:
        self.m = template.deep_copy()
        self.spell = spell
        self.hints = hints
        self.fed: list[int] = []  # tokens fed, in order
        self.lens: list[int] = []  # their byte counts

    def sync(self, tokens: list[int]) -> bool:
        """Bring the twin to ``tokens`` (the grammar's accepted tokens); False when the twin
        refuses a byte the grammar took (it then stays where it could go)."""
        common = 0
        for a, b in zip(self.fed, tokens):
            if a != b:
                break
            common += 1
        drop = sum(self.lens[common:])
        if drop:
            self.m.rollback(drop)
        del self.fed[common:], self.lens[common:]
        for t in tokens[common:]:
            data = self.spell(t)
            took = self.m.try_consume_tokens(list(data)) if data else 0
            if took != len(data):
                if took:
                    self.m.rollback(took)
                return False
            self.fed.append(t)
            self.lens.append(len(data))
        return True

    def close(self, lookahead: bool = True) -> bytes | None:
        """``close_bytes`` from here; ``lookahead=False``: its greedy pass alone, without
        the branch lookahead (a longer close at a fraction of the cost)."""
        if not lookahead:
            return greedy_close(self.m, lookahead=False, hints=self.hints)
        return close_bytes(self.m, hints=self.hints)

    def closes_with(self, data: bytes) -> bool:
        """Whether ``data`` closes the document from here (the twin is left where it was)."""
        took = self.m.try_consume_tokens(list(data)) if data else 0
        done = took == len(data) and _accepting(self.m)
        if took:
            self.m.rollback(took)
        return done

    def copy(self) -> ByteTwin:
        twin = ByteTwin.__new__(ByteTwin)
        twin.m, twin.spell, twin.hints = self.m.deep_copy(), self.spell, self.hints
        twin.fed, twin.lens = list(self.fed), list(self.lens)
        return twin
