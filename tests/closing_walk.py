"""Test helper: random walks through the real postprocessor under a grammar, the way the
scheduler drives it, without a model: each step a token is drawn from the grammar's mask
(EOS rarely) and handed to ``Postprocessor._on_token``, which applies the stop, length,
budget-close and jump-forward rules."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.request import LogprobOptions, Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler.postprocess import Postprocessor
from radixlm.runtime.scheduler.state import SchedulerState


class _Sink:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def put(self, item: dict) -> None:
        self.items.append(item)


class _KV:
    def truncate(self, req, length: int) -> None:  # jump-forward rollback: nothing held
        pass


def allowed_ids(grammar, words: int) -> np.ndarray:
    """The token ids ``grammar``'s mask allows now."""
    row = np.zeros((1, words), dtype=np.int32)
    grammar.fill_bitmask(row, 0)
    bits = np.unpackbits(row[0].view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)


def walk(backend, tokenizer, grammar, max_new_tokens: int, seed: int, *,
         close: bool = True, jump_forward: bool = True, eos_rate: float = 0.05,
         script: list[int] | None = None) -> Req:
    """One walk of at most ``max_new_tokens`` from ``grammar`` (fresh state, consumed):
    draws tokens at random from the mask, or takes ``script``'s tokens in turn (the tokens
    a natural run drew, ``fed``: jump-forward may have retokenized its output since);
    returns the finished request, the tokens it was handed in ``req.fed``."""
    rng = random.Random(seed)
    eos = set(backend.eos_ids)
    params = SamplingParams.from_dict({"max_new_tokens": max_new_tokens, "regex": "x",
                                       "complete_within_max_tokens": close})
    req = Req(rid=f"walk-{seed}", input_ids=[1], params=params, logprob=LogprobOptions(),
              detok=IncrementalDetokenizer(tokenizer), sink=_Sink(), eos_ids=frozenset(eos))
    req.grammar, req.close_within_budget = grammar, close
    config = SimpleNamespace(enable_jump_forward=jump_forward)
    runner = SimpleNamespace(release_generator=lambda r: None)
    pp = Postprocessor(config, SchedulerState(), _KV(), runner, tokenizer, lambda r: None)
    req.fed = []
    while not req.finished:
        if script is not None:
            token = script[len(req.fed)]
        else:
            ids = allowed_ids(grammar, backend.words)
            assert ids.size, "the mask allows nothing"
            is_end = np.isin(ids, list(eos))
            ends, rest = ids[is_end], ids[~is_end]
            pick = ends if ends.size and (not rest.size or rng.random() < eos_rate) else rest
            token = int(pick[rng.randrange(pick.size)])
        req.fed.append(token)
        pp._on_token(req, token, None)
    return req


def assert_masked_every_step(fresh, output_ids: list[int], words: int) -> None:
    """Every token of ``output_ids`` was allowed by the mask of the state before it (the
    steering never writes a token the mask forbids)."""
    for i, token in enumerate(output_ids):
        ids = allowed_ids(fresh, words)
        assert token in set(ids.tolist()), f"token {i} ({token}) is not in the mask"
        assert fresh.accept_token(token)
