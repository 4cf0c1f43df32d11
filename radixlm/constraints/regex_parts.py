"""Regex building blocks for JSON output, each one *sound*: every string it matches is valid
JSON text for the value it stands for, and means what the JSON-Schema keyword asks.

All regexes here use only syntax that Rust's ``regex`` crate (outlines-core), Python's ``re``
and ``interegular`` (jump-forward) read the same way: ``(?:...)``, classes with ``\\xHH`` /
``\\uHHHH`` / ``\\UHHHHHHHH`` escapes, counted repeats. No ``\\d`` (Unicode in Rust).
"""

from __future__ import annotations

import math
import re
import re._constants as sre_c
import re._parser as sre_parse

# One character inside a JSON string: anything but quote, backslash and control characters,
# or a two-character escape (each counts as one character after decoding).
STRING_CHAR = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
STRING = f'"{STRING_CHAR}*"'
# Unescaped characters only: for counted repeats. ``(?:class|\\escape){0,n}`` makes
# outlines-core's index build time explode with n (5 s at n=16), the bare class does not.
PLAIN_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'
BOOLEAN = r"(?:true|false)"
NULL = r"null"
INTEGER = r"(?:-?(?:0|[1-9][0-9]*))"
NUMBER = r"(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"

_TWO = r"(?:[01][0-9]|2[0-3])"
_SIXTY = r"[0-5][0-9]"
# Calendar-exact dates (no Feb 29: a subset, never an invalid date).
_DATE = (
    r"[0-9]{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
)
_TIME = rf"{_TWO}:{_SIXTY}:{_SIXTY}(?:\.[0-9]{{1,6}})?(?:Z|[+-]{_TWO}:{_SIXTY})"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?"

# format name -> regex of the whole JSON string (quotes included). Formats outside this
# table that the JSON-Schema format checker knows are rejected (see schema.py).
FORMATS: dict[str, str] = {
    "date": f'"{_DATE}"',
    "time": f'"{_TIME}"',
    "date-time": f'"{_DATE}T{_TIME}"',
    "uuid": r'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"',
    "email": rf'"[a-z0-9][a-z0-9._+-]{{0,30}}@{_LABEL}(?:\.{_LABEL}){{1,3}}"',
    "ipv4": rf'"{_OCTET}(?:\.{_OCTET}){{3}}"',
    "uri": rf'"https?://{_LABEL}(?:\.{_LABEL}){{0,3}}(?:/[A-Za-z0-9._~-]{{0,20}}){{0,4}}"',
    "hostname": rf'"{_LABEL}(?:\.{_LABEL}){{0,3}}"',
    "duration": r'"P[1-9][0-9]{0,2}[DWMY]"',
    "json-pointer": r'"(?:/[a-z0-9_]{0,20}){0,5}"',
    "regex": r'"[a-z0-9]{0,20}"',
    "color": r'"#[0-9a-f]{6}"',
}
for _alias in ("url", "uri-reference", "iri", "iri-reference"):
    FORMATS[_alias] = FORMATS["uri"]

_META = set("\\.+*?()|[]{}^$#&-~")


def escape_char(cp: int) -> str:
    """A regex atom for one code point, safe in a class or outside one."""
    ch = chr(cp)
    if ch.isascii() and (ch.isalnum() or ch in " _!%',/:;<=>@`\"") and cp >= 0x20:
        return ch
    if ch in _META:
        return "\\" + ch
    if cp <= 0xFF:
        return f"\\x{cp:02X}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def literal_regex(text: str) -> str:
    """Regex matching exactly ``text``."""
    return "".join(escape_char(ord(c)) for c in text)


# --------------------------------------------------------------------------- integer ranges


def _nonneg_range(lo: int, hi: int) -> list[str]:
    """Alternatives matching the decimal forms (no leading zeros) of lo..hi, 0 <= lo <= hi."""
    if lo > hi:
        return []
    if len(str(lo)) != len(str(hi)):
        mid = 10 ** len(str(lo)) - 1
        return _nonneg_range(lo, mid) + _nonneg_range(mid + 1, hi)
    return _same_len(str(lo), str(hi))


def _same_len(lo: str, hi: str) -> list[str]:
    """Regex alternatives for equal-length digit strings lo..hi (lo <= hi)."""
    if len(lo) == 1:
        return [lo if lo == hi else f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + r for r in _same_len(lo[1:], hi[1:])]
    n = len(lo) - 1
    out = [lo[0] + r for r in _same_len(lo[1:], "9" * n)]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        first = str(a) if a == b else f"[{a}-{b}]"
        out.append(f"{first}[0-9]{{{n}}}")
    out += [hi[0] + r for r in _same_len("0" * n, hi[1:])]
    return out


def _nonneg_regex(lo: int, hi: int | None) -> list[str]:
    """Alternatives for lo..hi (hi None = unbounded), lo >= 0."""
    if hi is not None:
        return _nonneg_range(lo, hi)
    digits = len(str(lo))
    return _nonneg_range(lo, 10**digits - 1) + [f"[1-9][0-9]{{{digits},}}"]


def int_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex for the JSON integers n with lo <= n <= hi (None = unbounded); never ``-0``.

    Raises ValueError if the range is empty."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    alts: list[str] = []
    if lo is None or lo < 0:  # negative part: -(1..)
        neg_hi = -lo if lo is not None else None  # magnitude bound
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        alts += ["-" + a for a in _nonneg_regex(neg_lo, neg_hi)]
    if hi is None or hi >= 0:
        alts += _nonneg_regex(max(lo, 0) if lo is not None else 0, hi)
    return "(?:" + "|".join(alts) + ")"


def _bounds(schema: dict, draft4: bool) -> tuple[tuple[float, bool] | None, ...]:
    """(value, exclusive) lower and upper bounds, draft-4 boolean exclusive forms included."""
    lo = hi = None
    mn, mx = schema.get("minimum"), schema.get("maximum")
    emn, emx = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if mn is not None:
        lo = (mn, draft4 and emn is True)
    if mx is not None:
        hi = (mx, draft4 and emx is True)
    if not draft4:
        if isinstance(emn, (int, float)) and not isinstance(emn, bool):
            if lo is None or emn >= lo[0]:
                lo = (emn, True)
        if isinstance(emx, (int, float)) and not isinstance(emx, bool):
            if hi is None or emx <= hi[0]:
                hi = (emx, True)
    return lo, hi


def _int_lo(lo: tuple[float, bool] | None) -> int | None:
    """Smallest integer satisfying the lower bound."""
    if lo is None:
        return None
    v, excl = lo
    return math.floor(v) + 1 if excl else math.ceil(v)


def _int_hi(hi: tuple[float, bool] | None) -> int | None:
    if hi is None:
        return None
    v, excl = hi
    return math.ceil(v) - 1 if excl else math.floor(v)


def integer_bounds(schema: dict, draft4: bool) -> tuple[int | None, int | None]:
    """Inclusive integer bounds from minimum/maximum/exclusive*."""
    lo, hi = _bounds(schema, draft4)
    return _int_lo(lo), _int_hi(hi)


def number_bounded_regex(schema: dict, draft4: bool) -> str:
    """Regex for JSON numbers within minimum/maximum/exclusive*: the integers in range, plus
    decimals ``n.ddd`` whose whole interval (n, n+1) or (-(m+1), -m] lies in range. Never an
    exponent. Raises ValueError for an empty range."""
    lo, hi = _bounds(schema, draft4)
    alts = []
    ilo, ihi = _int_lo(lo), _int_hi(hi)
    if ilo is None or ihi is None or ilo <= ihi:
        alts.append(int_range_regex(ilo, ihi))
    frac = r"\.[0-9]+"
    # n.ddd with n >= 0 lies in [n, n+1): need n >= ilo and n + 1 <= hi.
    n_lo = max(ilo, 0) if ilo is not None else 0
    n_hi = None if hi is None else math.floor(hi[0]) - 1
    if n_hi is None or n_lo <= n_hi:
        alts.append(int_range_regex(n_lo, n_hi) + frac)
    # -m.ddd with m >= 0 lies in (-(m+1), -m]: need -(m+1) >= lo and -m <= hi (< if excl).
    m_lo = 0 if hi is None else max(0, (math.floor(-hi[0]) + 1) if hi[1] else math.ceil(-hi[0]))
    m_hi = None if lo is None else math.floor(-lo[0]) - 1
    if m_hi is None or m_lo <= m_hi:
        alts.append("-" + int_range_regex(m_lo, m_hi) + frac)
    # An exclusive integer bound b itself, with a non-zero fraction: x strictly beyond b.
    nonzero = r"\.[0-9]*[1-9][0-9]*"
    if lo is not None and lo[1] and lo[0] == int(lo[0]) and lo[0] >= 0:
        b = int(lo[0])
        if hi is None or b + 1 <= hi[0]:
            alts.append(f"{b}{nonzero}")
    if hi is not None and hi[1] and hi[0] == int(hi[0]) and hi[0] <= 0:
        b = -int(hi[0])
        if lo is None or -(b + 1) >= lo[0]:
            alts.append(f"-{b}{nonzero}")
    if not alts:
        raise ValueError("empty numeric range")
    return "(?:" + "|".join(alts) + ")"


# --------------------------------------------------------------------------- string patterns

_UNSAFE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x9F)]
_UNIVERSE = [(0x20, 0x10FFFF)]
# Category tables: (subset used in a positive class, superset used when excluding).
_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: ([(48, 57)], [(48, 57), (0x80, 0x10FFFF)]),
    sre_c.CATEGORY_WORD: (
        [(48, 57), (65, 90), (95, 95), (97, 122)],
        [(48, 57), (65, 90), (95, 95), (97, 122), (0x80, 0x10FFFF)],
    ),
    sre_c.CATEGORY_SPACE: ([(32, 32)], [(9, 13), (28, 32), (0x80, 0x10FFFF)]),
}
_NOT_CATEGORIES = {
    sre_c.CATEGORY_NOT_DIGIT: sre_c.CATEGORY_DIGIT,
    sre_c.CATEGORY_NOT_WORD: sre_c.CATEGORY_WORD,
    sre_c.CATEGORY_NOT_SPACE: sre_c.CATEGORY_SPACE,
}


def _norm(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in _norm(a):
        cur = lo
        for blo, bhi in _norm(b):
            if bhi < cur or blo > hi:
                continue
            if blo > cur:
                out.append((cur, blo - 1))
            cur = max(cur, bhi + 1)
        if cur <= hi:
            out.append((cur, hi))
    return out


def _class(ranges: list[tuple[int, int]]) -> str:
    ranges = _minus(ranges, _UNSAFE)
    if not ranges:
        raise _PatternError("a character class with no JSON-safe character")
    parts = [escape_char(lo) if lo == hi else f"{escape_char(lo)}-{escape_char(hi)}"
             for lo, hi in ranges]
    return "[" + "".join(parts) + "]"


class _PatternError(Exception):
    pass


def _literal_in_json(cp: int) -> str:
    """Regex for how code point ``cp`` appears inside a JSON string."""
    escapes = {0x22: '\\\\"', 0x5C: "\\\\\\\\", 0x08: "\\\\b", 0x0C: "\\\\f", 0x0A: "\\\\n",
               0x0D: "\\\\r", 0x09: "\\\\t"}
    if cp in escapes:
        return escapes[cp]
    if cp < 0x20 or 0x7F <= cp <= 0x9F:
        raise _PatternError(f"the control character U+{cp:04X}")
    return escape_char(cp)


def _in_class(items: list) -> str:
    negate = bool(items) and items[0][0] == sre_c.NEGATE
    ranges: list[tuple[int, int]] = []
    for op, arg in items[1:] if negate else items:
        if op == sre_c.LITERAL:
            ranges.append((arg, arg))
        elif op == sre_c.RANGE:
            ranges.append(arg)
        elif op == sre_c.CATEGORY and arg in _CATEGORIES:
            ranges += _CATEGORIES[arg][1 if negate else 0]
        elif op == sre_c.CATEGORY and arg in _NOT_CATEGORIES:
            sub, sup = _CATEGORIES[_NOT_CATEGORIES[arg]]
            ranges += _minus(_UNIVERSE, sub if negate else sup)
        else:
            raise _PatternError(f"the class item {op}")
    return _class(_minus(_UNIVERSE, ranges) if negate else ranges)


def _emit(seq: list, at_start: bool = False, at_end: bool = False) -> str:
    """Emit a parsed sequence; anchors are allowed only at the very start/end."""
    items = list(seq)
    if at_start and items and items[0] == (sre_c.AT, sre_c.AT_BEGINNING):
        items = items[1:]
    if at_end and items and items[-1][0] == sre_c.AT and items[-1][1] in (
        sre_c.AT_END, sre_c.AT_END_STRING
    ):
        items = items[:-1]
    out = []
    for i, (op, arg) in enumerate(items):
        first, last = at_start and i == 0, at_end and i == len(items) - 1
        if op == sre_c.LITERAL:
            out.append(_literal_in_json(arg))
        elif op == sre_c.NOT_LITERAL:
            out.append(_in_class([(sre_c.NEGATE, None), (sre_c.LITERAL, arg)]))
        elif op == sre_c.ANY:
            out.append(_class([(0x20, 0x10FFFF)]))
        elif op == sre_c.IN:
            out.append(_in_class(arg))
        elif op == sre_c.BRANCH:
            out.append("(?:" + "|".join(_emit(b, first, last) for b in arg[1]) + ")")
        elif op == sre_c.SUBPATTERN:
            _, add_flags, del_flags, sub = arg
            if add_flags or del_flags:
                raise _PatternError("inline flags")
            out.append("(?:" + _emit(sub, first, last) + ")")
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = arg
            body = "(?:" + _emit(sub) + ")"
            if hi == sre_c.MAXREPEAT:
                out.append(body + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"))
            else:
                out.append(body + f"{{{lo},{hi}}}")
        else:
            raise _PatternError(f"{str(op).lower()} ({arg})" if op == sre_c.AT else str(op))
    return "".join(out)


def pattern_to_json_string_regex(pattern: str) -> str:
    """Regex for JSON strings (quotes included) whose decoded value ``re.search``-matches
    ``pattern``: the full-match language of the pattern, restricted to characters that need
    no JSON escape (a subset: sound, not complete). Raises ValueError for constructs we can't
    translate exactly (lookaround, backreferences, flags, anchors inside the pattern)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError) as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from exc
    if parsed.state.flags & ~sre_c.SRE_FLAG_UNICODE:
        raise ValueError(f"pattern {pattern!r}: flags are not supported")
    try:
        body = _emit(list(parsed), True, True)
    except _PatternError as exc:
        raise ValueError(f"pattern {pattern!r}: unsupported construct: {exc}") from exc
    return f'"{body}"'
