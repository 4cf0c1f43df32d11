"""Schema-aware drafts for extraction: a JSON value copied from the prompt's document.

Under a JSON schema, jump-forward already writes the keys and the punctuation, so the steps
left are the values, and in extraction most values are spans of the input. ``ValueLookup``
reads where the output stands (``json_scan``) and drafts, from the prompt's text:

- **inside a string value** whose text so far occurs in the prompt (at a word's start; the
  occurrence after the previous value's, else the latest): the rest of that span up to
  where the value would end (a name ends at its first lowercase word, a phrase at
  punctuation, a number's unit after one word) and the closing quote with the member's end
  (``",`` or ``"}`` from the schema: whether the key is its object's last);
- **at a value's start**, from the key: a number (schema type integer / number) closest to
  the key's words in the document (``"weight_kg"`` -> "weighs 1.2 kilograms"), the text
  after a label (``"next_meeting"`` -> "Next meeting: ..."), a capitalized phrase holding a
  key word (``"street"`` -> "Maple Street"), or for a first ``*name`` value the document's
  first proper name;
- **inside a number**: the rest of the number predicted at its start, where it still
  agrees.

The draft stops at the value's end: jump-forward takes the punctuation after it (the
scheduler cuts a draft where forced text starts, since postprocessing would drop the rest).
Every guess is checked by the model, so a wrong one costs only its verification.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable

from radixlm.runtime.speculative.json_scan import (
    NUMBER,
    STRING,
    JsonScan,
    ValueContext,
    load_schema,
    schema_node,
)

_WORD = re.compile(r"[A-Za-z0-9][\w'.,-]*[\w]|[A-Za-z0-9]")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")
_KEY_SPLIT = re.compile(r"[_\-\s]+|(?<=[a-z])(?=[A-Z])")
_STOP = frozenset("the and for with from into about id ids type value values info data "
                  "number num count total amount list item items".split())
_OPENERS = frozenset("the a an this that it its we our you your he she they in on at "
                     "dear subject hello hi today for".split())
_SENTENCE = re.compile(r"[.!?](?:\s|$)|\n")
NEAR_WORDS = 12  # a number this many words from a key word may be the key's value
MAX_BACK_CHARS = 48  # the most of a value's text searched for in the prompt


def key_words(key: str) -> list[str]:
    """The words of a key (``contact_name`` -> contact, name), lowercase, generic ones out."""
    words = [w.lower() for w in _KEY_SPLIT.split(key) if w]
    return [w for w in words if len(w) >= 3 and w not in _STOP]


def _stem(word: str) -> str:
    return word[:max(4, len(word) - 3)]


class ValueLookup:
    """Drafts of JSON values from one request's prompt (see the module docstring).

    ``codec``: ``text_codec(tokenizer)``; ``n_prompt``: the prompt's length in tokens;
    ``schema``: the request's ``json_schema`` (text or dict; None: values' types and
    closings unknown, strings close with ``",``). ``propose(tokens, k)`` takes prompt +
    output and returns at most ``k`` ids ([] where it has no guess)."""

    __slots__ = ("decode", "encode", "n_prompt", "schema", "scan", "doc", "lower",
                 "words", "starts", "cursor", "name_from", "guess", "_close")

    def __init__(self, codec: tuple[Callable, Callable], n_prompt: int, schema=None) -> None:
        (self.decode, self.encode), self.n_prompt = codec, n_prompt
        self.schema = load_schema(schema)
        self.scan = JsonScan()
        self.doc: str | None = None  # the prompt's text, decoded on the first call
        self.lower = ""
        self.words: list[tuple[int, int]] = []  # (start, end) of every word of the prompt
        self.starts: list[int] = []  # the words' starts, for bisection
        self.cursor = 0  # where in the prompt the last drafted value ended
        self.name_from = 0  # where the document starts (after the schema's text)
        self.guess: tuple[int, str] | None = None  # (value's start, its predicted text)
        self._close: dict[str, list[int]] = {}

    def context(self, tokens: list[int]) -> ValueContext | None:
        """Where the output (``tokens[n_prompt:]``) stands, as ``JsonScan.context``."""
        self.scan.update(self.decode(tokens[self.n_prompt:]))
        return self.scan.context()

    def propose(self, tokens: list[int], k: int,
                ctx: ValueContext | None = None) -> list[int]:
        """Up to ``k`` ids continuing the value being written (``ctx``: ``context(tokens)``
        when the caller has it)."""
        if k <= 0:
            return []
        if self.doc is None:
            self._read_prompt(tokens[:self.n_prompt])
        ctx = ctx if ctx is not None else self.context(tokens)
        if ctx is None:
            return []
        node, last = schema_node(self.schema, ctx.path)
        kind = node.get("type")
        if ctx.kind == STRING:
            text = self._string_rest(ctx)
            if text is None:
                return []
            ids = (self.encode(text) if text else []) + self._closing('"', last, ctx)
        elif ctx.kind == NUMBER or kind in ("integer", "number"):
            text = self._number_rest(ctx, kind)
            if text is None:
                return []
            ids = self.encode(text) + self._closing("", last, ctx)
        else:  # a string's opening quote is jump-forward's; its value drafts inside it
            return []
        return [int(t) for t in ids[:k]]

    def _read_prompt(self, prompt: list[int]) -> None:
        """The prompt's text with the schema's own text (where it is quoted) blanked out,
        so its keys and numbers are not taken for the document's; the cursor starts after
        it."""
        doc = self.decode(prompt)
        if self.schema is not None:
            for form in (json.dumps(self.schema), json.dumps(self.schema, indent=2)):
                at = doc.rfind(form)
                if at >= 0:
                    doc = doc[:at] + "\n" * len(form) + doc[at + len(form):]
                    self.cursor = at + len(form)
                    break
        self.doc, self.lower = doc, doc.lower()
        self.words = [m.span() for m in _WORD.finditer(doc)]
        self.starts = [w[0] for w in self.words]
        self.name_from = self.cursor

    # ------------------------------------------------------------------ strings
    def _string_rest(self, ctx: ValueContext) -> str | None:
        """The rest of the string value being written, "" if it is complete, None if the
        prompt does not hold it."""
        typed = ctx.partial
        if self.guess is None or self.guess[0] != ctx.start:
            self.guess = (ctx.start, self._start_string(ctx) or "")
        predicted = self.guess[1]
        if predicted and predicted.startswith(typed) and len(predicted) > len(typed):
            return predicted[len(typed):]
        piece = typed[-MAX_BACK_CHARS:]
        if len(piece.strip()) < 2:
            return None
        at = self._find(piece, len(typed) > len(piece))
        if at < 0:
            return None
        start = at - (len(typed) - len(piece)) if len(typed) > len(piece) else at
        end = self._span_end(max(start, 0), at + len(piece))
        self.cursor = end
        return self.doc[at + len(piece):end]

    def _find(self, piece: str, inside: bool) -> int:
        """Where ``piece`` occurs in the prompt: at a word's start (unless it is the tail of
        a longer value, ``inside``), the first occurrence after the cursor, else the
        latest; -1 if nowhere."""
        doc, found = self.doc, []
        at = doc.find(piece)
        while at >= 0 and len(found) < 64:
            if inside or at == 0 or not doc[at - 1].isalnum():
                found.append(at)
            at = doc.find(piece, at + 1)
        if not found:
            return -1
        after = [a for a in found if a >= self.cursor]
        return after[0] if after else found[-1]

    def _span_end(self, start: int, at: int) -> int:
        """Where a value that starts at ``start`` in the prompt ends (not before ``at``): a
        capitalized name at its first word that is not capitalized or a number, else at
        punctuation followed by a space or a line's end, a number after one more word."""
        doc, first = self.doc, self.doc[start:start + 1]
        stop = _SENTENCE.search(doc, at)
        limit = stop.start() if stop else len(doc)
        for p in (",", ";", ":", "(", ")", '"'):
            cut = doc.find(p, at, limit)
            while cut >= 0 and p == "," and cut + 1 < len(doc) and doc[cut + 1].isdigit():
                cut = doc.find(p, cut + 1, limit)
            if cut >= 0:
                limit = cut
        max_words = 1 if first.isdigit() else 4
        count, end = 0, start
        for m in _WORD.finditer(doc, start, max(limit, at)):
            if m.start() > start:
                if doc[end:m.start()] != " ":
                    break  # more than a single space between two words
                word = m.group()
                if first.isupper() and not (word[0].isupper() or word[0].isdigit()):
                    break
                count += 1
                if not first.isupper() and count > max_words:
                    break
            end = m.end()
        return min(max(end, at), max(limit, at))

    def _start_string(self, ctx: ValueContext) -> str | None:
        """A string value predicted from its key before any of it is written."""
        words = key_words(ctx.key)
        if not words:
            return None
        label = re.compile(r"[\s_-]*".join(map(re.escape, words)) + r"[ \t]*:[ \t]*")
        for m in label.finditer(self.lower):  # "Next meeting: ..." at a line's start
            before = self.doc[:m.start()].rstrip(" \t")
            if before and not before.endswith(("\n", ".")):
                continue
            end = self.doc.find("\n", m.end())
            value = self.doc[m.end():end if end >= 0 else len(self.doc)].strip()
            if value:
                return value
        for w in words:  # a capitalized phrase holding a key word: "Maple Street"
            for m in re.finditer(r"\b" + re.escape(w) + r"\b", self.lower):
                if self.doc[m.start()].isupper():
                    phrase = self._capitalized_around(m.start(), m.end())
                    if phrase is not None:
                        return phrase
        if "name" in words and self.cursor == self.name_from and not ctx.in_array:
            for s, e in self.words:
                word = self.doc[s:e]
                if s < self.name_from:
                    continue
                if word[0].isupper() and word.lower() not in _OPENERS and ":" not in \
                        self.doc[e:e + 1]:
                    return self.doc[s:self._span_end(s, e)]
        return None

    def _capitalized_around(self, start: int, end: int) -> str | None:
        """The run of capitalized words (and numbers) around ``start:end``, single spaces
        between them; None if it is the one word."""
        doc = self.doc
        i = _word_at(self.starts, start)
        if self.words[i][0] != start:
            return None
        lo = hi = i

        def capital(j: int) -> bool:
            c = doc[self.words[j][0]]
            return c.isupper() or c.isdigit()

        while lo > 0 and capital(lo - 1) and doc[self.words[lo - 1][1]:self.words[lo][0]] == " " \
                and doc[self.words[lo - 1][0]:self.words[lo - 1][1]].lower() not in _OPENERS:
            lo -= 1
        while hi + 1 < len(self.words) and capital(hi + 1) \
                and doc[self.words[hi][1]:self.words[hi + 1][0]] == " ":
            hi += 1
        if lo == hi:
            return None
        return doc[self.words[lo][0]:self.words[hi][1]].rstrip(".,")

    # ------------------------------------------------------------------ numbers
    def _number_rest(self, ctx: ValueContext, kind) -> str | None:
        """The rest of a number value: the document's number closest to the key's words
        (predicted at the value's start and kept for the rest of it)."""
        if self.guess is None or self.guess[0] != ctx.start:
            self.guess = (ctx.start, self._near_number(ctx.key, kind) or "")
        value = self.guess[1]
        if not value or not value.startswith(ctx.partial) or value == ctx.partial:
            return None
        return value[len(ctx.partial):]

    def _near_number(self, key: str, kind) -> str | None:
        stems = [_stem(w) for w in key_words(key)]
        if not stems:
            return None
        starts = self.starts
        hits = [i for i, s in enumerate(starts)
                if any(self.lower.startswith(st, s) for st in stems)]
        if not hits:
            return None
        best, best_score = None, NEAR_WORDS + 1.0
        for m in _NUMBER.finditer(self.doc):
            text = m.group().replace(",", "") if kind == "integer" else m.group()
            if kind == "integer" and "." in text:
                continue
            j = _word_at(starts, m.start())
            for i in hits:
                lo, hi = sorted((i, j))
                score = hi - lo + (0.5 if j < i else 0.0)  # a number after its word first
                if _SENTENCE.search(self.doc, self.words[lo][1], self.words[hi][0]):
                    score += NEAR_WORDS / 2  # across a sentence's end
                if m.start() < self.cursor:
                    score += 1.0  # values tend to follow the document's order
                if score < best_score:
                    best, best_score = text, score
        return best

    # ------------------------------------------------------------------ closing
    def _closing(self, quote: str, last: bool, ctx: ValueContext) -> list[int]:
        """The tokens that end the value: its quote and the member's end (``,`` or, for an
        object's last key, ``}``)."""
        text = quote + ("}" if last and not ctx.in_array else ",")
        ids = self._close.get(text)
        if ids is None:
            ids = self._close[text] = list(self.encode(text))
        return ids


def _word_at(starts: list[int], pos: int) -> int:
    """Index of the word that starts at or before ``pos``."""
    return max(bisect.bisect_right(starts, pos) - 1, 0)

