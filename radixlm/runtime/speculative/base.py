"""The drafter interface: where speculative decoding's draft tokens come from.

A drafter proposes tokens that a request is likely to generate next (no draft model: n-gram
lookup over the request's own tokens and the prefix cache's sequences). The scheduler's
speculation part verifies them in one step of the model together with the request's last
sampled token, keeps the longest prefix the model agrees with plus one token of the model's
own, and tells the drafter how it went. Verification is exact, so a drafter only decides
speed: a bad draft costs a little compute and never changes an output.

Contract (what the scheduler guarantees and expects):

- every call comes from the scheduler thread, between model steps; no locking is needed;
- ``propose(req, max_tokens)`` sees the request's tokens as ``req.input_ids +
  req.output_ids`` (prompt, then what it generated; the last output token is the one the
  draft continues) and returns at most ``max_tokens`` token ids, or ``[]`` for no draft this
  step. ``max_tokens`` is the scheduler's decision (0: do not speculate now, return ``[]``).
  Plain Python (no torch), fast (it runs once per request per step), and it must not mutate
  ``req``;
- ``observe(req, num_drafted, num_accepted)`` follows every verification of a draft from
  ``propose``: ``num_drafted`` tokens went into the step (the scheduler may have cut the
  proposal: at the first token the request's grammar forbids, at its remaining token
  budget, or to fit the KV it could reserve) and the model accepted the first
  ``num_accepted`` of them (0 <= num_accepted <= num_drafted). Not every proposal is
  verified: a request given no draft in a step may be asked for one token only to compare
  it with the token the step samples (a probe of its acceptance rate; not observed);
- optionally, ``expected_rate(req)`` (None, or a float in 0..1) before a step's budgets
  are planned, for a constrained request in a step of a few candidates: the acceptance per
  token its next draft is expected to have, where the drafter knows better than the
  request's record (a JSON value copied from the prompt); a ``propose`` for the same
  sequence follows only if the plan gives the request a budget;
- ``release(req)`` is called once when the request finishes or is aborted; a retracted
  request is not released (it resumes with the same tokens);
- ids returned must be ints in the model's vocabulary; anything else is the drafter's bug,
  and the scheduler drops such a draft.

``create_drafter`` (``speculative/__init__.py``) builds the engine's drafter from its
``EngineConfig`` (``speculative_num_draft_tokens``, ``speculative_ngram_*``) and the radix
cache (``radixlm.radix``), which the drafter may read (``continuation``) but must not
change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixlm.runtime.request import Req

# SGLang's --speculative-algorithm values: the ones radixlm runs, and the rest (which need a
# draft model or heads this engine does not have).
SUPPORTED_ALGORITHMS = ("NGRAM",)
OTHER_SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "LOOKAHEAD")


class Drafter(Protocol):
    """Proposes draft tokens for requests (see the module docstring for the contract)."""

    def propose(self, req: Req, max_tokens: int) -> list[int]:
        """Up to max_tokens draft token ids continuing req.input_ids + req.output_ids
        (empty: no draft this step). Plain Python, no torch; must not mutate req."""
        ...

    def observe(self, req: Req, num_drafted: int, num_accepted: int) -> None:
        """After a verification: how many of the proposed tokens the model accepted."""
        ...

    def release(self, req: Req) -> None:
        """The request finished or was aborted: drop its state."""
        ...


def normalize_algorithm(value: str | None) -> str | None:
    """The canonical spelling of a setting: None (unset: the engine's default, see
    ``resolve_algorithm``), "none" (off) or a supported name; ValueError naming the setting
    and the supported values for anything else."""
    if value is None:
        return None
    name = str(value).strip().upper()
    if name in ("", "NONE"):
        return "none"
    if name in SUPPORTED_ALGORITHMS:
        return name
    kind = ("needs a draft model, which radixlm does not run"
            if name in OTHER_SGLANG_ALGORITHMS else "is unknown")
    raise ValueError(f"speculative_algorithm={value!r} {kind}; supported: "
                     f"{', '.join(SUPPORTED_ALGORITHMS)} or none")


def resolve_algorithm(setting: str | None, native_steps: bool,
                      quantized_kv: bool = False) -> str | None:
    """The algorithm an engine runs (None: speculation off). Unset, NGRAM where the native
    CPU library runs the decode steps (a small step there is bound by reading the weights,
    so verifying a few more tokens costs little: measured 1.7x single-stream on a rewrite
    prompt, 1.0-1.3x on free chat, on a 2-core Xeon), off elsewhere (not measured) and
    with an int8 KV pool (``quantized_kv``: rounding K/V to int8 turns the tiny differences
    between a k-token and a one-token step into whole quantization steps, so greedy text
    could part from decoding without drafts on a near-tie; asked for by name, it runs)."""
    if setting is None:
        return "NGRAM" if native_steps and not quantized_kv else None
    return None if setting == "none" else setting
