"""A GGUF's tokenizer at the engine's start without transformers: encode, decode and the
special tokens straight from the file's ``tokenizers`` backend, everything else from
transformers' own tokenizer, made the first time such a name is asked for.

``import transformers`` costs ~0.9 s of one core on a 2-core host (its package table is
built by reading every model folder's sources): on the engine's tokenizer thread it was the
longest part of a 1B GGUF's start after torch's import, holding the GIL beside the weights'
placement. What a request needs before its first token is encode and decode; what needs
transformers (``apply_chat_template``, the special ids the grammar backend's vocabulary
reads) is made after ready on the grammar's thread (``runtime/grammar_setup.py``), where
that vocabulary first asks for them.

Exactness: the backend is set up as transformers' ``TokenizersBackend`` sets up a backend it
is given (``transformers_setup``), so encode and decode are its own calls on the same
object: ``tests/test_file_tokenizer.py`` checks the JSON equal to transformers' and the
answers equal over a text set; and once transformers' tokenizer is made here the two JSONs
are compared again, a difference logged as an error and every call handed to transformers'
from then on.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

# the special tokens a GGUF names, in the order transformers adds the missing ones
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def transformers_setup(backend, tokenizer_config: dict) -> None:
    """Set ``backend`` (a ``tokenizers.Tokenizer``) up as ``TokenizersBackend(
    tokenizer_object=backend, **tokenizer_config)`` does (transformers 5): the named special
    tokens that are not added tokens yet added as special ones, and, where the config says
    whether to add BOS / EOS (``add_bos_token`` / ``add_eos_token`` present), the
    post-processor that adds them (its ``update_post_processor``)."""
    from tokenizers import AddedToken, processors

    added = {str(t.content) for t in backend.get_added_tokens_decoder().values()}
    missing = dict.fromkeys(tokenizer_config[name] for name in SPECIAL_NAMES
                            if tokenizer_config.get(name) is not None
                            and tokenizer_config[name] not in added)
    if missing:
        backend.add_tokens([AddedToken(t, special=True) for t in missing])
    if "add_bos_token" not in tokenizer_config and "add_eos_token" not in tokenizer_config:
        return
    bos, eos = tokenizer_config.get("bos_token"), tokenizer_config.get("eos_token")
    add_bos = bool(tokenizer_config.get("add_bos_token")) and bos is not None
    add_eos = bool(tokenizer_config.get("add_eos_token")) and eos is not None
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = (f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1"
            f"{' ' + eos + ':1' if add_eos else ''}")
    special = ([(bos, backend.token_to_id(bos))] if add_bos else []) + (
        [(eos, backend.token_to_id(eos))] if add_eos else [])
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                           special_tokens=special)


class FileTokenizer:
    """The engine's tokenizer of a byte-level GGUF vocabulary before transformers is loaded.

    ``backend``: the file's ``tokenizers.Tokenizer``, already ``transformers_setup``;
    ``tokenizer_config``: its special tokens and chat template as transformers reads them;
    ``make_full(backend)``: transformers' ``TokenizersBackend`` on a copy of it. ``encode``
    of one string and ``decode`` of ids answer from the backend (what ``TokenizersBackend``
    does for them: a test holds it); any other call or attribute goes to ``full``, made on
    first use (thread-safe; in the engine, on the grammar's thread after ready)."""

    def __init__(self, backend, tokenizer_config: dict,
                 make_full: Callable[[object], object]) -> None:
        self.backend_tokenizer = backend
        self._config = dict(tokenizer_config)
        self._chat_template = tokenizer_config.get("chat_template")
        self._make_full = make_full
        self._full = None
        self._exact = True
        self._lock = threading.Lock()

    @property
    def full(self):
        """transformers' tokenizer of this vocabulary (made on first use)."""
        if self._full is None:
            with self._lock:
                if self._full is None:
                    self._full = self._made()
        return self._full

    def _made(self):
        full = self._make_full(copy.deepcopy(self.backend_tokenizer))
        full.chat_template = self._chat_template
        if full.backend_tokenizer.to_str() != self.backend_tokenizer.to_str():
            self._exact = False
            logger.error("the GGUF's tokenizer set up without transformers differs from "
                         "transformers' own; encoding and decoding through transformers' "
                         "from now on")
        return full

    # ------------------------------------------------------------------ what is answered here
    @property
    def chat_template(self):
        return self._chat_template

    @chat_template.setter
    def chat_template(self, value) -> None:
        self._chat_template = value
        if self._full is not None:
            self._full.chat_template = value

    def _special(self, name: str):
        return self._config.get(name)

    def _special_id(self, name: str):
        token = self._config.get(name)
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    bos_token = property(lambda self: self._special("bos_token"))
    eos_token = property(lambda self: self._special("eos_token"))
    unk_token = property(lambda self: self._special("unk_token"))
    pad_token = property(lambda self: self._special("pad_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))

    @property
    def vocab_size(self) -> int:
        """The base vocabulary's size (transformers': without the added tokens)."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def encode(self, text, *args, add_special_tokens: bool = True, **kwargs) -> list[int]:
        """``text``'s ids (one string, no other arguments: the backend's; a pair, a batch or
        other keywords: transformers'). As a batch of one, as transformers encodes: the
        backend's ``encode_batch`` lets go of the GIL while it works and ``encode`` does not
        (a 5 MB prompt held the server's event loop for ~5 s, /health included)."""
        if args or kwargs or not isinstance(text, str) or not self._exact:
            return self.full.encode(text, *args, add_special_tokens=add_special_tokens,
                                    **kwargs)
        return self.backend_tokenizer.encode_batch(
            [text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids, skip_special_tokens: bool = False, **kwargs) -> str:
        """The text of ``token_ids`` (an id or a list of ids: the backend's; a batch, arrays,
        a clean-up asked for or other keywords: transformers'). A fast tokenizer ignores
        ``spaces_between_special_tokens``; so does this."""
        kwargs.pop("spaces_between_special_tokens", None)
        if not kwargs.get("clean_up_tokenization_spaces", True):
            del kwargs["clean_up_tokenization_spaces"]
        if not kwargs and self._exact and type(token_ids) in (int, list, tuple):
            try:  # (a batch, or ids that are not ints, the backend refuses: transformers')
                return self.backend_tokenizer.decode(
                    [token_ids] if type(token_ids) is int else token_ids,
                    skip_special_tokens=skip_special_tokens)
            except TypeError:
                pass
        return self.full.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)

    # ------------------------------------------------------------------ the rest: transformers'
    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_full", "_lock", "_config", "_exact",
                                              "_make_full", "_chat_template"):
            raise AttributeError(name)
        return getattr(self.full, name)

    def __call__(self, *args, **kwargs):
        return self.full(*args, **kwargs)

    def __repr__(self) -> str:
        return (f"FileTokenizer(vocab={len(self)}, "
                f"transformers' {'made' if self._full is not None else 'not made yet'})")
