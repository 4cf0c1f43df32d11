"""Ollama's embeddings: `POST /api/embed` and the older `POST /api/embeddings` (the `ollama`
client's `embed` and `embeddings`).

Each input is one engine encode request, as for `/v1/embeddings` (`embeddings_api.py`): the
same tokens (no special tokens added), so the same vector, the mean of the final-normed
last hidden states, L2-normalised; generation's admission (the API key, one queue place per
input, 429 when full, an abort when the client leaves).

`/api/embed`: `input` a string or a list of strings; `truncate` (default true) keeps an
input's first tokens up to the context (false: an input over it is a 400 naming it);
`dimensions` keeps the first that many entries, renormalised (0, Go's unset: all);
`options.num_ctx` is the context to fit (up to the server's), the options that change
loading are checked as for chat (their neutral values only), the generation options have
no effect on an embedding and are a 400 naming them; `keep_alive` is checked and inert. The
answer: `{"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"}`,
durations in nanoseconds (`load_duration`: the time before the engine). `/api/embeddings`:
`prompt` one string, no truncation, the answer `{"embedding"}`, the same unit vector (Ollama
sends this route's vector unnormalised; the directions, so cosine similarities, agree).
An empty input or string is a 400 naming it, as is an unknown field.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from radixlm.server.embeddings_api import check_dimensions
from radixlm.server.errors import OllamaError
from radixlm.server.generation import GenCall, admit, run_calls
from radixlm.server.ollama_messages import bad
from radixlm.server.ollama_request import Options, check_keep_alive, ollama_name
from radixlm.server.state import ServerState
from radixlm.server.validation import check_text


class _EmbedCommon(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    options: Options | None = None
    keep_alive: str | float | None = None

    @model_validator(mode="after")
    def _check_common(self) -> _EmbedCommon:
        check_keep_alive(self.keep_alive)
        unused = self.options.generation_options() if self.options else []
        if unused:
            raise ValueError(f"options.{unused[0]}: has no effect on an embedding (it changes "
                             "only generation)")
        return self


class EmbedBody(_EmbedCommon):
    """Body of POST /api/embed."""

    input: str | list[str]
    truncate: bool = True
    dimensions: StrictInt | None = Field(default=None, ge=0)  # 0: all (Go's unset)

    @field_validator("input", mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list)
                                      and all(isinstance(x, str) for x in value)):
            return value
        raise ValueError("input: must be a string or a list of strings")


class EmbeddingsBody(_EmbedCommon):
    """Body of POST /api/embeddings (Ollama's older route: one `prompt`)."""

    prompt: str


def _context(state: ServerState, options: Options | None) -> int:
    """The tokens an input may take: the server's context, or `options.num_ctx` below it."""
    num_ctx = options.num_ctx if options else None
    if num_ctx is not None and num_ctx > state.context_len:
        raise bad("options.num_ctx", f"{num_ctx} is over this server's context length "
                  f"({state.context_len} tokens)")
    return num_ctx or state.context_len


def _tokenize(texts: list[str], where: list[str], tokenizer: Any, max_bytes: int,
              limit: int, truncate: bool) -> list[list[int]]:
    """Each text's token ids (as `/v1/embeddings` tokenizes it), cut to ``limit`` with
    ``truncate``, else a 400 naming an input over it. Runs on a prep worker."""
    out = []
    for text, name in zip(texts, where, strict=True):
        if truncate:  # max_bytes characters are as many bytes at least: over the context
            text = text[:max_bytes]
        check_text(text, name, None if truncate else max_bytes)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            raise bad(name, "has no tokens")
        if len(ids) > limit and not truncate:
            raise bad(name, f"has {len(ids)} tokens, over the context length ({limit}; "
                      "truncate: true keeps the first ones)")
        out.append(ids[:limit])
    return out


async def embed_inputs(state: ServerState, request: Request, texts: list[str], param: str,
                       options: Options | None, truncate: bool,
                       dimensions: int | None = None) -> list[dict[str, Any]]:
    """The engine's results for ``texts``, in order; OllamaError naming ``param`` (or
    ``param[i]``) for an empty input or one over the context without ``truncate``."""
    if not texts:
        raise bad(param, "is empty: give at least one input")
    where = [param if len(texts) == 1 else f"{param}[{i}]" for i in range(len(texts))]
    for text, name in zip(texts, where, strict=True):
        if not text:
            raise bad(name, "is an empty string")
    check_dimensions(state, dimensions)
    limit, tokenizer = _context(state, options), state.engine.tokenizer
    max_bytes = state.max_prompt_bytes
    ids = await state.prep.run(lambda: _tokenize(texts, where, tokenizer, max_bytes, limit,
                                                 truncate))
    calls = [GenCall(None, x, {"max_new_tokens": 0}, encode=True, dimensions=dimensions)
             for x in ids]
    await admit(state, calls)
    results = await run_calls(state, calls, request)
    for name, out in zip(where, results, strict=True):
        if out["embedding"] is None:  # aborted (/abort_request, shutdown) before its end
            raise OllamaError(503, f"{name} was not embedded: the request was aborted by the "
                              "server", code="aborted")
    return results


def embed_answer(state: ServerState, results: list[dict[str, Any]],
                 t0: float) -> dict[str, Any]:
    """`/api/embed`'s answer (``t0``: when the request came); the engine's time is its
    longest input's, the rest of the total is `load_duration`."""
    total = time.perf_counter() - t0
    engine_s = max(float(out["meta_info"].get("e2e_latency", 0.0) or 0.0) for out in results)

    def ns(seconds: float) -> int:
        return max(int(seconds * 1e9), 0)

    return {"model": ollama_name(state), "embeddings": [out["embedding"] for out in results],
            "total_duration": ns(total), "load_duration": ns(total - engine_s),
            "prompt_eval_count": sum(int(out["meta_info"]["prompt_tokens"])
                                     for out in results)}
