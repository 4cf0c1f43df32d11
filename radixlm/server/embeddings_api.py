"""Embeddings: OpenAI's `POST /v1/embeddings` and SGLang's native `POST /encode`.

Each input is one engine encode request (`Engine.async_encode`: prefilled like any request,
no token generated; the mean of the final-normed last hidden states over its positions,
L2-normalised). They take the same way as a generation (`generation.admit` / `run_calls`):
tokenized off the event loop, checked against the context, one queue place per input (429
when full), aborted when the client leaves.

`/v1/embeddings`: `input` a string, a list of strings, a list of token ids or a list of
such lists; `dimensions` keeps the first that many entries, renormalised; `encoding_format`
"float" or "base64" (the vector's little-endian float32 bytes, which the `openai` client
asks for by default and decodes); `model` and `user` are accepted (one model is served).
`/encode`: `text` (a string or a list) or `input_ids` (ids or a list of id lists); the answer
is SGLang's: `{"embedding", "meta_info"}`, a list of them for a batch (an input aborted
before its end: `embedding` null, its `finish_reason` says why).
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictInt, field_validator

from radixlm.server.errors import ApiError
from radixlm.server.generation import GenCall, admit, run_calls
from radixlm.server.state import ServerState, get_state

router = APIRouter()

TokenIds = list[StrictInt]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def check_input_shape(value: Any) -> Any:
    """A string, a list of strings, token ids or a list of token-id lists (else ValueError:
    one message for the field, not one per union branch)."""
    if isinstance(value, str) or _is_ids(value) or (isinstance(value, list) and (
            all(isinstance(x, str) for x in value) or all(_is_ids(x) for x in value))):
        return value
    raise ValueError("must be a string, a list of strings, a list of token ids (integers) or "
                     "a list of such lists")


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings body."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[str] | TokenIds | list[TokenIds]
    model: str | None = None
    dimensions: StrictInt | None = None
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None

    _shape = field_validator("input", mode="before")(check_input_shape)


class EncodeRequest(BaseModel):
    """SGLang's `/encode` body (its `EmbeddingReqInput`: text or token ids, and a rid)."""

    model_config = ConfigDict(extra="forbid")

    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    rid: str | list[str] | None = None

    @field_validator("text", "input_ids", mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        return value if value is None else check_input_shape(value)


def _inputs(value: Any, param: str) -> list[tuple[str | None, list[int] | None]]:
    """(text, token ids) per input; ApiError 400 naming ``param`` for an empty one."""
    if isinstance(value, str) or (value and _is_ids(value)):
        value = [value]
    if not value:
        raise ApiError(400, f"'{param}' is empty: give at least one input", param=param)
    out: list[tuple[str | None, list[int] | None]] = []
    for i, item in enumerate(value):
        where = param if len(value) == 1 else f"{param}[{i}]"
        if not item:
            kind = "string" if isinstance(item, str) else "list of token ids"
            raise ApiError(400, f"'{where}' is an empty {kind}", param=param)
        out.append((item, None) if isinstance(item, str) else (None, list(item)))
    return out


def check_dimensions(state: ServerState, dimensions: int | None) -> None:
    """ApiError 400 naming `dimensions` unless None or in [1, the model's hidden size]."""
    hidden = getattr(getattr(state.engine, "hf_config", None), "hidden_size", None)
    if dimensions is None:
        return
    if dimensions < 1 or (hidden is not None and dimensions > hidden):
        raise ApiError(400, f"'dimensions' must be between 1 and {hidden} (the model's hidden "
                            f"size), got {dimensions}", param="dimensions")


async def _embed(state: ServerState, request: Request,
                 inputs: list[tuple[str | None, list[int] | None]], rids: list[str] | None,
                 dimensions: int | None = None) -> list[dict[str, Any]]:
    calls = [GenCall(text, ids, {"max_new_tokens": 0}, encode=True, dimensions=dimensions)
             for text, ids in inputs]
    for call, rid in zip(calls, rids or [], strict=False):
        call.rid = rid
    await admit(state, calls)
    return await run_calls(state, calls, request)


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # little-endian float32, as the openai client decodes
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    """OpenAI's embeddings: one vector per input, in order, with the prompt tokens used."""
    state = get_state(request)
    check_dimensions(state, body.dimensions)
    results = await _embed(state, request, _inputs(body.input, "input"), None, body.dimensions)
    for i, out in enumerate(results):
        if out["embedding"] is None:  # aborted (/abort_request, shutdown) before its end
            reason = out["meta_info"].get("finish_reason") or {}
            raise ApiError(500, f"input {i} was not embedded: {reason.get('message', reason)}",
                           code="aborted")
    tokens = sum(int(out["meta_info"]["prompt_tokens"]) for out in results)
    return {"object": "list",
            "data": [{"object": "embedding", "index": i,
                      "embedding": _encoded(out["embedding"], body.encoding_format)}
                     for i, out in enumerate(results)],
            "model": body.model or state.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@router.post("/encode")
async def encode(body: EncodeRequest, request: Request) -> Any:
    """SGLang's `/encode`: `{"embedding", "meta_info"}`, or a list of them for a batch."""
    state = get_state(request)
    if (body.text is None) == (body.input_ids is None):
        raise ApiError(400, "give exactly one of 'text' and 'input_ids'", param="text")
    param = "text" if body.text is not None else "input_ids"
    value = body.text if body.text is not None else body.input_ids
    inputs = _inputs(value, param)
    batch = not isinstance(value, str) and not (value and _is_ids(value))
    rids = body.rid if isinstance(body.rid, list) else None
    if rids is not None and len(rids) != len(inputs):
        raise ApiError(400, f"'rid' has {len(rids)} entries for {len(inputs)} inputs",
                       param="rid")
    if isinstance(body.rid, str):
        rids = [body.rid] if not batch else [f"{body.rid}-{i}" for i in range(len(inputs))]
    results = await _embed(state, request, inputs, rids)
    return results if batch else results[0]
