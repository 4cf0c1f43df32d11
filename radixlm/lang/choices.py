"""Ways to pick one of `select`'s choices from the logprobs of each choice's tokens.

A backend scores every choice in one batched request and hands the token logprobs
(`[(logprob, token_id, text), ...]` per choice, the choice's tokens only) to a method:

- `token_length_normalized` (default): highest mean token logprob.
- `greedy_token_selection`: compare choices token by token, keep the best at each position
  (a shorter choice is padded with its own mean logprob), like greedy decoding would.
- `unconditional_likelihood_normalized`: highest mean of (logprob in context - logprob of the
  same tokens without context); needs `unconditional_token_logprobs` from the backend.

With `temperature > 0` the decision is sampled from softmax(score / temperature) instead of
the argmax (greedy token selection always takes its argmax).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

TokenLogprob = tuple  # (logprob | None, token_id, text | None)


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _values(tokens: list[TokenLogprob]) -> list[float]:
    return [t[0] for t in tokens if t[0] is not None]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _pick(scores: list[float], temperature: float) -> int:
    if temperature <= 1e-6:
        return max(range(len(scores)), key=lambda i: scores[i])
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return random.choices(range(len(scores)), weights=weights)[0]


class ChoicesSamplingMethod:
    """Picks a choice from per-choice token logprobs."""

    requires_unconditional_logprobs: bool = False

    def __call__(
        self,
        choices: list[str],
        input_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
        temperature: float = 0.0,
    ) -> ChoicesDecision:
        raise NotImplementedError


class TokenLengthNormalized(ChoicesSamplingMethod):
    def __call__(self, choices, input_token_logprobs, unconditional_token_logprobs=None,
                 temperature=0.0):
        scores = [_mean(_values(t)) for t in input_token_logprobs]
        best = _pick(scores, temperature)
        return ChoicesDecision(choices[best], {
            "normalized_prompt_logprobs": scores,
            "input_token_logprobs": input_token_logprobs,
        })


class GreedyTokenSelection(ChoicesSamplingMethod):
    def __call__(self, choices, input_token_logprobs, unconditional_token_logprobs=None,
                 temperature=0.0):
        rows = [_values(t) for t in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(choices[remaining[0]], {
            "normalized_prompt_logprobs": [_mean(r) for r in rows],
            "input_token_logprobs": input_token_logprobs,
            "greedy_logprob_matrix": matrix,
        })


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    requires_unconditional_logprobs = True

    def __call__(self, choices, input_token_logprobs, unconditional_token_logprobs=None,
                 temperature=0.0):
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs,
                                strict=True):
            diffs = [
                c[0] - (u[0] if u[0] is not None else 0.0)
                for c, u in zip(cond, uncond, strict=False)
                if c[0] is not None
            ]
            scores.append(_mean(diffs))
        best = _pick(scores, temperature)
        return ChoicesDecision(choices[best], {
            "normalized_prompt_logprobs": [_mean(_values(t)) for t in input_token_logprobs],
            "normalized_unconditional_prompt_logprobs": scores,
            "input_token_logprobs": input_token_logprobs,
            "unconditional_token_logprobs": unconditional_token_logprobs,
        })


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
