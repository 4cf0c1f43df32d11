"""The HTTP shapes of `SamplingParams`, derived from its fields instead of restating them.

- `sampling_field(name, ...)`: the pydantic (annotation, Field) of SamplingParams field
  `name` in a request body: what `SamplingParams.from_dict` accepts for it, or null (null
  means the default), with the field's bounds. A route that documents other limits (OpenAI's
  temperature range) passes them instead.
- `SamplingParamsBody`: `sampling_params` of /generate: every SamplingParams field in
  declaration order, plus SGLang's `sampling_seed` (its spelling of `seed`) and the SGLang
  keys the engine refuses by name, so that the refusal names them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ConfigDict, Field, create_model

from radixlm.runtime.sampling_params import ALIASES, UNSUPPORTED, SamplingParams

_FIELDS = {f.name: f for f in dataclasses.fields(SamplingParams)}
# SGLang's aliases stand just before this field in the body (the document's property order)
_ALIASES_BEFORE = "logit_bias"


def sampling_field(name: str, *, accepts: Any = None,
                   bounds: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(annotation, Field) of SamplingParams field `name` in a body, null by default;
    `accepts` / `bounds` replace the field's own where given."""
    meta = _FIELDS[name].metadata
    accepts = meta["accepts"] if accepts is None else accepts
    bounds = meta["bounds"] if bounds is None else bounds
    limits = {k: v for k, v in bounds.items() if k != "finite"}
    if bounds.get("finite"):
        limits["allow_inf_nan"] = False
    annotation = accepts if accepts is Any else accepts | None
    return annotation, Field(default=None, **limits)


def _body_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in _FIELDS:
        if name == _ALIASES_BEFORE:
            fields.update({alias: sampling_field(target) for alias, target in ALIASES.items()})
        fields[name] = sampling_field(name)
    fields.update({name: (Any, None) for name in UNSUPPORTED})
    return fields


SamplingParamsBody = create_model(
    "SamplingParamsBody",
    __config__=ConfigDict(extra="forbid"),
    __doc__="`sampling_params` of /generate (SGLang's SamplingParams; None means the default).",
    __module__=__name__,
    **_body_fields(),
)
