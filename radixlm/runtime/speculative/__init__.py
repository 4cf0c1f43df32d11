"""Speculative decoding without a draft model: where drafts come from.

- `base`: the `Drafter` interface (its contract) and the algorithm names;
- `ngram`: `NgramDrafter`, drafts from the radix tree's cached continuations, prompt
  lookup over the request's own tokens (`lookup`: its n-gram index) and over its prompt's
  text (`text`), and for a request under a JSON schema the value being written, copied
  from the prompt's document (`values`, over `json_scan`: where the document stands);
  `policy`: draft length from acceptance history;
- `cost`: step times by tokens per step, and how many draft tokens a step may verify.

The scheduler's `speculation` part asks a drafter for drafts, verifies them in the batch's
step and keeps what the model agrees with (`radixlm/runtime/scheduler/speculation.py`).
"""

from __future__ import annotations

from radixlm.runtime.speculative.base import Drafter, resolve_algorithm
from radixlm.runtime.speculative.ngram import NgramDrafter


def create_drafter(config, cache, native_steps: bool, tokenizer=None) -> Drafter | None:
    """The drafter of the algorithm the engine runs (``resolve_algorithm``; None:
    speculation off), given the radix cache to read other requests' sequences from and the
    tokenizer for lookup by text (None: token lookup only)."""
    quantized_kv = config.kv_cache_dtype != "auto"
    if resolve_algorithm(config.speculative_algorithm, native_steps, quantized_kv) is None:
        return None
    return NgramDrafter(cache, max_draft_tokens=config.speculative_num_draft_tokens,
                        min_match=config.speculative_ngram_min_match_window_size,
                        max_match=config.speculative_ngram_max_match_window_size,
                        tokenizer=tokenizer)
