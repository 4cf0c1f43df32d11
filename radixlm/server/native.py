"""SGLang-compatible native API: /generate, /health*, /get_model_info, /get_server_info,
/flush_cache, /abort_request. SGLang clients (e.g. its RuntimeEndpoint) work unmodified."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict

from radixlm.constraints.reasoning import get_format, split_reasoning
from radixlm.runtime.request_rules import fan_out_samples
from radixlm.server.errors import ApiError
from radixlm.server.generation import (
    GenCall,
    abandon,
    admit,
    clean_sampling,
    merge_streams,
    open_streams,
    run_calls,
)
from radixlm.server.protocol import GenerateRequest
from radixlm.server.reasoning import (
    ReasoningSetup,
    reasoning_parser_name,
    reasoning_setup,
    split_stream,
    split_text,
)
from radixlm.server.state import ServerState, get_state
from radixlm.server.streaming import SSEResponse
from radixlm.server.validation import check_text

router = APIRouter()


def _per_prompt(value: Any, i: int, count: int, name: str) -> Any:
    """A per-prompt value: the same for all prompts, or a list with one entry per prompt."""
    if isinstance(value, list):
        if len(value) != count:
            raise ApiError(400, f"'{name}' has {len(value)} entries for {count} prompts",
                           param=name)
        return value[i]
    return value


def build_native_calls(req: GenerateRequest, request_id: str) -> list[GenCall]:
    """One GenCall per prompt and sample (`n` is fanned out here; sample j of a prompt whose
    rid is R gets rid `R-j` and, when a seed is given, seed + j). Without a rid, the
    server's request id is the rid (prompt i of a batch: `<request_id>-i`)."""
    prompts = req.prompts
    count = len(prompts)
    if count == 0:
        raise ApiError(400, "the batch of prompts is empty", param="text")
    calls = []
    for i, (text, ids) in enumerate(prompts):
        params = _per_prompt(req.sampling_params, i, count, "sampling_params")
        if params is not None and not isinstance(params, dict | BaseModel):
            raise ApiError(400, "'sampling_params' must be an object", param="sampling_params")
        params = clean_sampling(params.model_dump() if isinstance(params, BaseModel)
                                else params)
        if "sampling_seed" in params and params.get("seed", params["sampling_seed"]) == \
                params["sampling_seed"]:  # SGLang's spelling; one key, so seed + j below works
            params["seed"] = params.pop("sampling_seed")
        n = params.pop("n", 1)
        if not isinstance(n, int) or n < 1:
            raise ApiError(400, f"sampling_params.n must be an integer >= 1, got {n!r}",
                           param="n")
        rid = _per_prompt(req.rid, i, count, "rid") if isinstance(req.rid, list) else req.rid
        if rid is None:
            rid = f"{request_id}-{i}" if req.is_batch else request_id
        elif isinstance(req.rid, str) and req.is_batch:
            rid = f"{rid}-{i}"  # a string rid on a batch is a prefix, as in SGLang
        start = _per_prompt(req.logprob_start_len, i, count, "logprob_start_len")
        top = _per_prompt(req.top_logprobs_num, i, count, "top_logprobs_num")
        for sub_rid, seed in fan_out_samples(rid, n, params.get("seed")):
            sampling = dict(params)
            if seed is not None:
                sampling["seed"] = seed
            calls.append(GenCall(
                text=text, input_ids=ids, sampling=sampling, rid=sub_rid,
                return_logprob=bool(_per_prompt(req.return_logprob, i, count,
                                                "return_logprob")),
                logprob_start_len=-1 if start is None else int(start),
                top_logprobs_num=0 if top is None else int(top),
                return_text_in_logprobs=req.return_text_in_logprobs, priority=req.priority,
                log_metrics=req.log_metrics))
    return calls


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request) -> Response:
    """SGLang's /generate: a dict for one prompt and n == 1, else a list (prompt-major)."""
    state = get_state(request)
    calls = build_native_calls(body, request.state.request_id)
    await admit(state, calls)
    single = not body.is_batch and len(calls) == 1
    reasoning = reasoning_setup(state, body.separate_reasoning)
    if body.stream:
        streams = await open_streams(state, calls)
        return SSEResponse(_native_stream(state, calls, streams, single, reasoning),
                           on_close=lambda: abandon(state, calls),
                           stall_timeout=state.settings.stream_stall_timeout)
    results = await run_calls(state, calls, request)
    if reasoning is not None:  # the answer in text, the thinking in reasoning_text
        for call, r in zip(calls, results, strict=True):
            thought, r["text"] = split_text(reasoning, state, call, r["text"])
            r["reasoning_text"] = thought
    return JSONResponse(results[0] if single else results)


async def _native_stream(state: ServerState, calls: list[GenCall], streams: list[Any],
                         single: bool, reasoning: ReasoningSetup | None = None
                         ) -> AsyncIterator[dict[str, Any]]:
    merged = merge_streams(state, calls, streams)
    async for index, chunk, _ in split_stream(reasoning, state, calls, merged):
        yield chunk if single else {**chunk, "index": index}


class SeparateReasoningRequest(BaseModel):
    """Body of POST /separate_reasoning (SGLang's)."""

    model_config = ConfigDict(extra="forbid")
    text: str
    reasoning_parser: str


@router.post("/separate_reasoning")
async def separate_reasoning(body: SeparateReasoningRequest) -> dict[str, Any]:
    """SGLang's: split ``text`` (an output that starts as the parser's format starts) into
    ``reasoning_text`` and ``text`` (the answer)."""
    try:
        fmt = get_format(body.reasoning_parser)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="reasoning_parser") from exc
    thought, answer = split_reasoning(body.text, fmt)
    return {"text": answer, "reasoning_text": thought or ""}


@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness: 200 without touching the engine; 503 while shutting down or once the
    engine reports a fatal error (e.g. a tensor-parallel worker died) or its scheduler
    thread has died."""
    state = get_state(request)
    if state.shutting_down or not state.engine_alive:
        return Response(status_code=503)
    error = getattr(state.engine, "fatal_error", None)
    if error is not None:
        return PlainTextResponse(f"unhealthy: {error}", status_code=503)
    return Response(status_code=200)


@router.get("/get_load")
async def get_load(request: Request) -> list[dict[str, Any]]:
    """Load as SGLang reports it (one entry per data-parallel rank of this server; the
    router's load monitor reads `num_tokens`)."""
    stats = await asyncio.to_thread(get_state(request).engine.get_stats)
    return [{"dp_rank": 0, "num_reqs": stats.get("num_running", 0) + stats.get("num_waiting", 0),
             "num_waiting_reqs": stats.get("num_waiting", 0),
             "num_tokens": stats.get("kv_used_tokens", 0)}]


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Readiness: 200 when a one-token generation completes, else 503."""
    state = get_state(request)
    call = GenCall(text=None, input_ids=[_health_token(state)],
                   sampling={"max_new_tokens": 1, "temperature": 0.0},
                   rid=f"health-{uuid.uuid4().hex}")
    try:
        await run_calls(state, [call], request)
    except ApiError as exc:
        return PlainTextResponse(f"unhealthy: {exc.message}", status_code=503)
    return Response(status_code=200)


def _health_token(state: ServerState) -> int:
    tok = state.engine.tokenizer
    for tid in (tok.bos_token_id, tok.eos_token_id, 0):
        if tid is not None:
            return int(tid)
    return 0


@router.get("/get_model_info")
@router.get("/model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    """Model path, tokenizer path, and what a client needs to format chats itself."""
    state = get_state(request)
    engine, tok = state.engine, state.engine.tokenizer
    return {
        "model_path": str(engine.model_path),
        "tokenizer_path": str(engine.model_path),
        "model_name": state.model_id,
        "is_generation": True,
        "preferred_sampling_params": None,
        "context_length": state.context_len,
        "chat_template": getattr(tok, "chat_template", None),
        "default_system_prompt": default_system_prompt(tok),
        "bos_token": getattr(tok, "bos_token", None),
        "eos_token": getattr(tok, "eos_token", None),
        "eos_token_id": getattr(tok, "eos_token_id", None),
        # with one, /generate splits the thinking off unless told `separate_reasoning: false`
        "reasoning_parser": reasoning_parser_name(state),
    }


def default_system_prompt(tok: Any) -> str | None:
    """The system prompt the chat template inserts when none is given, or None.

    Renders the template with and without a sentinel system message: with one it reads
    P + SYS + Q + USER + ...; without one, P + D + Q + USER + ... means D is the default."""
    sys_s, user_s = "\x00SYS\x00", "\x00USER\x00"
    try:
        with_sys = tok.apply_chat_template(
            [{"role": "system", "content": sys_s}, {"role": "user", "content": user_s}],
            tokenize=False)
        without = tok.apply_chat_template([{"role": "user", "content": user_s}], tokenize=False)
    except Exception:  # noqa: BLE001 - no template, or one without a system role
        return None
    if sys_s not in with_sys or user_s not in with_sys:
        return None
    prefix, rest = with_sys.split(sys_s, 1)
    between = rest.split(user_s, 1)[0]
    if not prefix or not without.startswith(prefix) or between + user_s not in without:
        return None
    return without[len(prefix):without.index(between + user_s)]


@router.get("/get_server_info")
@router.get("/server_info")
@router.get("/get_server_args")
async def get_server_info(request: Request) -> dict[str, Any]:
    """Engine config, server settings (the API key redacted), engine stats, and the
    weights and activations that run (``weights``, ``activations``)."""
    state = get_state(request)
    config = getattr(state.engine, "config", None)
    info: dict[str, Any] = (dataclasses.asdict(config)
                            if dataclasses.is_dataclass(config) else dict(vars(config or {})))
    settings = dataclasses.asdict(state.settings)
    settings["api_key"] = None if settings["api_key"] is None else "<redacted>"
    info.update(server=settings, stats=await asyncio.to_thread(state.engine.get_stats),
                context_length=state.context_len, model_path=str(state.engine.model_path),
                version=_version())
    # which weights and activations run (e.g. "gguf q4_1, head q8_0"; "bf16")
    runner = getattr(state.engine, "runner", None)
    info.update(getattr(runner, "precision", None) or {})
    # whether a token's numbers are the same bits in any batch, chunking or cache state
    info["batch_invariant"] = bool(getattr(runner, "batch_invariant", False))
    pool = getattr(runner, "pool", None)
    if pool is not None:  # SGLang's name for the tokens the KV pool holds
        info["max_total_num_tokens"] = int(pool.capacity) - 1
    return info


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("radixlm")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


@router.post("/flush_cache", operation_id="flush_cache")
@router.get("/flush_cache", operation_id="flush_cache_get")  # SGLang answers GET too
async def flush_cache(request: Request, tier: str | None = None) -> Response:
    """Empty the radix cache, every tier of it, or only ``?tier=device|host|storage`` (the
    hierarchical cache's tiers); 400 (nothing done) while requests are running (the device
    tier and a full flush only) or for a tier this server lacks."""
    unknown = sorted(set(request.query_params) - {"tier"})
    if unknown:
        raise ApiError(400, f"unknown query parameter(s) of /flush_cache: {', '.join(unknown)} "
                            "(it takes tier=device|host|storage)", param=unknown[0])
    try:
        done = await asyncio.to_thread(get_state(request).engine.flush_cache, tier)
    except ValueError as e:
        raise ApiError(400, str(e), param="tier") from None
    if done:
        return PlainTextResponse(f"Cache flushed{f' ({tier} tier)' if tier else ''}.\n")
    return PlainTextResponse("Cache not flushed: requests are running or waiting.\n",
                             status_code=400)


class AbortRequest(BaseModel):
    """Body of POST /abort_request."""

    model_config = ConfigDict(extra="forbid")
    rid: str | None = None
    abort_all: bool = False


@router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> dict[str, Any]:
    """Abort a request by rid (and the samples `rid-j` the server fanned it out into)."""
    state = get_state(request)
    if body.abort_all:
        rids = sorted(state.inflight)
    elif body.rid:
        rids = [body.rid] + sorted(r for r in state.inflight if r.startswith(body.rid + "-"))
    else:
        raise ApiError(400, "give 'rid' or set 'abort_all'", param="rid")
    for rid in rids:
        state.abort(rid)
    return {"aborted": rids}


class TokenizeRequest(BaseModel):
    """Body of POST /tokenize."""

    model_config = ConfigDict(extra="forbid")
    prompt: str | list[str]
    add_special_tokens: bool = False


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    """Token ids of a prompt (a list for a list of prompts), as the engine tokenizes them."""
    state = get_state(request)
    enc = state.engine.tokenizer.encode
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    for p in prompts:  # tokenizing text longer than this is work for nothing
        check_text(p, "prompt", state.max_prompt_bytes)
    tokens: Any = await state.prep.run(
        lambda: [enc(p, add_special_tokens=body.add_special_tokens) for p in prompts])
    count: Any = [len(t) for t in tokens]
    if isinstance(body.prompt, str):
        tokens, count = tokens[0], count[0]
    return {"tokens": tokens, "count": count, "max_model_len": state.context_len}


class DetokenizeRequest(BaseModel):
    """Body of POST /detokenize."""

    model_config = ConfigDict(extra="forbid")
    tokens: list[int]


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    """Text of a list of token ids."""
    tok = get_state(request).engine.tokenizer
    try:
        return {"text": tok.decode(body.tokens)}
    except Exception as exc:  # noqa: BLE001 - e.g. ids outside the vocabulary
        raise ApiError(400, f"cannot decode the tokens: {exc}", param="tokens") from exc
