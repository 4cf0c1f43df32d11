"""The engine's tokenizer of a byte-level GGUF before transformers is loaded
(``radixlm/native/file_tokenizer.py``): its backend is the one transformers' own tokenizer
holds (the same JSON) under every rule that class applies, and what it answers itself
(encode, decode, special tokens, sizes) is transformers' answer; the rest is transformers'
tokenizer, made on first use, with the chat template the engine set; a difference found when
that one is made hands every call to it; and an engine's start on such a file imports no
transformers at all."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from radixlm.native.file_tokenizer import FileTokenizer, transformers_setup
from radixlm.native.gguf_file import read_gguf
from radixlm.native.gguf_model import GGUFModelInfo, _tokenizer_inputs
from radixlm.native.gguf_tokenizer import RENAMES, byte_level_backend
from radixlm.runtime.weights import alias_paths, load_tokenizer, start_tokenizer
from radixlm.server.validation import max_prompt_bytes

EMBEDDED = alias_paths()["smollm2-135m-instruct"]
TEXTS = ["Hello world", " leading space", "  two  spaces\n\nnew lines\t tab ",
         "unicode: héllo wörld — ✓ 你好 🙂", "<|im_start|>user\nhi<|im_end|>\n", "",
         "end <|endoftext|> mid", "1234567 numbers 3.14", "can't won't I'M", "Hello Hello"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
_INPUTS: list = []


def _inputs() -> tuple[dict, dict]:
    """The embedded file's (tokenizer dict, tokenizer config), as the engine reads them."""
    if not _INPUTS:
        keys = [f"tokenizer.{k}" for group in RENAMES.values() for k in group]
        _INPUTS.extend(_tokenizer_inputs(read_gguf(EMBEDDED, keys)[0], EMBEDDED))
    return dict(_INPUTS[0]), dict(_INPUTS[1])


def _pair(**config_edits) -> tuple[FileTokenizer, TokenizersBackend]:
    """Ours and transformers' class on the same vocabulary, each on a backend of its own,
    with the tokenizer config edited (None drops a key)."""
    tokenizer_dict, config = _inputs()
    config.update(config_edits)
    config = {k: v for k, v in config.items() if v is not None}
    backend = byte_level_backend(tokenizer_dict)
    transformers_setup(backend, config)
    ours = FileTokenizer(backend, config, lambda b: TokenizersBackend(
        tokenizer_object=b, added_tokens_decoder={}, name_or_path="x", **config))
    theirs = TokenizersBackend(tokenizer_object=byte_level_backend(tokenizer_dict),
                               added_tokens_decoder={}, name_or_path="x", **config)
    return ours, theirs


def _same_answers(ours: FileTokenizer, theirs) -> None:
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id",
                 "eos_token_id", "unk_token_id", "pad_token_id", "vocab_size"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == \
                theirs.encode(text, add_special_tokens=special), text
        ids = theirs.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                theirs.decode(ids, skip_special_tokens=skip), text
        if ids:
            assert ours.decode(ids[0]) == theirs.decode(ids[0])
        for spaces in (False, True):  # (the detokenizer's keywords)
            kw = {"clean_up_tokenization_spaces": False, "spaces_between_special_tokens": spaces}
            assert ours.decode(ids, **kw) == theirs.decode(ids, **kw), text


# (the embedded file's config; BOS / EOS added or not, said or unsaid; a named special token
# that is not among the file's added tokens; one missing; a special token named twice)
EDITS = {
    "as-is": {},
    "bos-added": {"add_bos_token": True},
    "eos-added": {"add_eos_token": True, "add_bos_token": None},
    "both-added": {"add_bos_token": True, "add_eos_token": True},
    "unsaid": {"add_bos_token": None},
    "bos-plain-token": {"bos_token": "Hello", "add_bos_token": True},
    "no-bos": {"bos_token": None, "add_bos_token": True},
    "pad-is-unk-plain": {"pad_token": "world", "unk_token": "world"},
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_the_backend_and_answers_are_transformers(edit):
    ours, theirs = _pair(**EDITS[edit])
    _same_answers(ours, theirs)
    assert ours._full is None  # (nothing above needed transformers' tokenizer)


def test_a_long_text_is_encoded_while_other_threads_run():
    """The server tokenizes on a worker thread: its event loop (/health) must go on meanwhile.
    The backend's ``encode`` held the GIL throughout (a 5 MB prompt: ~5 s of a stalled
    loop); the batch call lets go of it. The main thread ticks while a thread encodes ~1 MB;
    ticks inside the encode's middle 80% are counted (holding the GIL: none)."""
    ours, theirs = _pair()
    text = "a " * 400_000
    span: dict = {}

    def encode():
        span["start"] = time.perf_counter()
        span["ids"] = ours.encode(text, add_special_tokens=False)
        span["end"] = time.perf_counter()

    worker, ticks = threading.Thread(target=encode), []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    lo, hi = span["start"], span["end"]
    inside = [t for t in ticks if lo + 0.1 * (hi - lo) < t < hi - 0.1 * (hi - lo)]
    assert len(inside) > 10, (len(inside), hi - lo)
    assert span["ids"] == theirs.encode(text, add_special_tokens=False)


def test_the_rest_is_transformers_own_made_once_with_the_template_set():
    ours, theirs = _pair()
    ours.chat_template = theirs.chat_template = "{{ messages[0]['content'] }}!"
    assert ours._full is None
    assert ours.apply_chat_template(CHAT, tokenize=False) == "Be brief.!"
    full = ours.full
    assert isinstance(full, TokenizersBackend) and ours.full is full
    assert full.backend_tokenizer is not ours.backend_tokenizer  # (a copy of its own)
    ours.chat_template = "{{ messages[1]['content'] }}"  # (set after: reaches it too)
    assert full.apply_chat_template(CHAT, tokenize=False) == "Hi there"
    assert ours.all_special_ids == theirs.all_special_ids
    assert dict(ours("Hello world")) == dict(theirs("Hello world"))
    assert ours.decode([[1, 2], [3]]) == theirs.decode([[1, 2], [3]])  # (a batch: theirs)
    assert ours.encode("Hello", " world") == theirs.encode("Hello", " world")  # (a pair)
    _same_answers(ours, theirs)


def test_a_backend_that_differs_from_transformers_hands_every_call_over(caplog):
    """Where the set-up here and transformers' disagree (a rule of a later transformers),
    the difference is logged once transformers' tokenizer is made and every call is its."""
    tokenizer_dict, config = _inputs()
    backend = byte_level_backend(tokenizer_dict)
    transformers_setup(backend, config)

    def theirs(b):
        made = TokenizersBackend(tokenizer_object=b, added_tokens_decoder={}, **config)
        made.add_tokens(["Hello world"])  # (one more rule than ours knows)
        return made

    ours = FileTokenizer(backend, config, theirs)
    before = ours.encode("Hello world")
    with caplog.at_level(logging.ERROR):
        full = ours.full
    assert "differs from transformers' own" in caplog.text
    assert ours.encode("Hello world") == full.encode("Hello world") != before
    ids = full.encode("Hello world")
    assert ours.decode(ids) == "Hello world"


def test_the_engine_tokenizer_of_a_file_equals_load_tokenizers():
    """``start_tokenizer`` (the engine's) of the embedded file against ``load_tokenizer``
    (transformers' class, as before): the same answers and chat rendering."""
    ours, theirs = start_tokenizer(EMBEDDED), load_tokenizer(EMBEDDED)
    assert isinstance(ours, FileTokenizer) and isinstance(theirs, TokenizersBackend)
    _same_answers(ours, theirs)
    assert ours.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
        theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert GGUFModelInfo.from_path(EMBEDDED).start_tokenizer()._full is None


def test_the_servers_prompt_bound_needs_no_transformers_tokenizer():
    """``max_prompt_bytes`` (the server's byte bound before tokenizing, computed at its first
    request on the event loop) reads the spellings from the backend: the bound transformers'
    tokenizer gives with every id converted, and transformers' half is not made for it."""
    ours, theirs = start_tokenizer(EMBEDDED), load_tokenizer(EMBEDDED)
    spellings = theirs.convert_ids_to_tokens(list(range(len(theirs))))
    longest = max(len(t.encode("utf-8")) for t in spellings if t)
    assert max_prompt_bytes(ours, 100) == max_prompt_bytes(theirs, 100) == 100 * longest
    assert ours._full is None


def test_an_engine_start_on_a_byte_level_gguf_imports_no_transformers():
    """Ready without transformers: the engine's tokenizer is a ``FileTokenizer`` whose
    transformers' half is not made, and nothing imported transformers (the grammar backend,
    made after ready on a thread, is held back here so that what is checked is the start);
    a generation then runs, and a chat template rendered brings transformers in."""
    code = textwrap.dedent(f"""
        import os, sys
        from radixlm.runtime import engine as E
        E.GrammarSetup = lambda *a, **k: None  # (made after ready: not part of the start)
        engine = E.Engine({str(EMBEDDED)!r}, log_level="warning")
        at_ready = "transformers" in sys.modules
        out = engine.generate("Hello", {{"max_new_tokens": 4, "temperature": 0}})
        after_generate = "transformers" in sys.modules
        engine.tokenizer.apply_chat_template([{{"role": "user", "content": "hi"}}],
                                             tokenize=False)
        print(type(engine.tokenizer).__name__, at_ready, after_generate,
              "transformers" in sys.modules, len(out["output_ids"]), flush=True)
        os._exit(0)  # (no grammar backend to shut down)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "FileTokenizer False False True 4"
