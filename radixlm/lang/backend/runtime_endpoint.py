"""`RuntimeEndpoint`: backend over HTTP to `radixlm serve` (or SGLang's server; same native API).

Uses POST /generate (text or input_ids + sampling_params, logprob options, SSE streaming),
GET /get_model_info (its `chat_template` field renders roles), POST /flush_cache,
GET /get_server_info (its `tool_call_parser`) and POST /tokenize (tool-call markers).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from radixlm.formats.tool_parsers import ToolCallParser, resolve_parser
from radixlm.lang.backend.base import (
    DEFAULT_TIMEOUT_S,
    Backend,
    BackendError,
    ChoiceLogprobs,
    Prompt,
)
from radixlm.lang.chat_template import ChatTemplate, ChatTemplateError
from radixlm.lang.gen_args import GenArgs

_CONNECT_TIMEOUT_S = 5.0


class RuntimeEndpoint(Backend):
    """Backend for a server at `base_url` speaking SGLang's native API.

    The constructor fetches /get_model_info, so an unreachable server fails here with
    BackendError. `chat_template` overrides the template the server reports.
    """

    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, chat_template: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=256)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.model_info = self._request("GET", "/get_model_info")
        self._template_source = chat_template or self.model_info.get("chat_template")
        self._chat_template: ChatTemplate | None = None
        self._tool_parser: ToolCallParser | None = None
        # a radixlm server with a reasoning parser splits the thinking off /generate's text
        # unless asked not to; a program reads the raw text (separate_reasoning splits it)
        self._raw = {"separate_reasoning": False} if self.model_info.get("reasoning_parser") \
            else {}

    # ---- HTTP ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, payload: Any = None,
                 stream: bool = False) -> Any:
        url = self.base_url + path
        try:
            resp = self.session.request(method, url, json=payload, stream=stream,
                                        timeout=(_CONNECT_TIMEOUT_S, self.timeout))
        except requests.Timeout as e:
            raise BackendError(f"{method} {url} timed out after {self.timeout:g} s") from e
        except requests.RequestException as e:
            raise BackendError(f"cannot reach the server at {self.base_url}: {e}") from e
        if resp.status_code >= 400:
            raise BackendError(f"{method} {url} failed with HTTP {resp.status_code}: "
                               f"{resp.text[:500]}")
        if stream:
            return resp
        try:
            return resp.json()
        except ValueError as e:
            raise BackendError(f"{method} {url} returned non-JSON: {resp.text[:200]!r}") from e

    def _generate(self, payload: dict[str, Any]) -> Any:
        out = self._request("POST", "/generate", payload)
        for item in out if isinstance(out, list) else [out]:
            reason = item.get("meta_info", {}).get("finish_reason")
            if isinstance(reason, dict) and reason.get("type") == "abort":
                raise BackendError(f"request aborted: {reason.get('message')}")
        return out

    # ---- Backend ---------------------------------------------------------------------------

    def get_chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            source = self._template_source or self._template_from_local_tokenizer()
            if not source:
                raise ChatTemplateError(
                    f"the server at {self.base_url} reports no chat_template in "
                    "/get_model_info; pass RuntimeEndpoint(..., chat_template=...)")
            info = self.model_info
            self._chat_template = ChatTemplate(source, {
                "bos_token": info.get("bos_token"), "eos_token": info.get("eos_token")})
        return self._chat_template

    def _template_from_local_tokenizer(self) -> str | None:
        """SGLang's server does not report the template; read it from the tokenizer the
        server names, if that path exists on this machine."""
        path = self.model_info.get("tokenizer_path") or self.model_info.get("model_path")
        if not path:
            return None
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception:
            return None
        self.model_info.setdefault("bos_token", tok.bos_token)
        self.model_info.setdefault("eos_token", tok.eos_token)
        return tok.chat_template

    def generate(self, prompt: Prompt, params: GenArgs) -> tuple[Any, Any]:
        out = self._generate({"text": prompt.text, **params.wire_request(), **self._raw})
        if isinstance(out, list):  # n > 1: one result per sample
            return [o["text"] for o in out], [o["meta_info"] for o in out]
        return out["text"], out["meta_info"]

    def generate_stream(self, prompt: Prompt,
                        params: GenArgs) -> Iterator[tuple[str, dict[str, Any]]]:
        resp = self._request("POST", "/generate", {
            "text": prompt.text, **params.wire_request(), **self._raw, "stream": True},
            stream=True)
        sent = ""
        try:
            for line in resp.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise BackendError(f"stream failed: {chunk['error']}")
                text = chunk.get("text", "")
                yield text[len(sent):], chunk.get("meta_info", {})
                sent = text
        except requests.RequestException as e:
            raise BackendError(f"stream from {self.base_url} broke: {e}") from e
        finally:
            resp.close()

    def choice_logprobs(self, prompt: str, choices: list[str]) -> list[ChoiceLogprobs]:
        """Prefill the prompt (caching it and learning its token count), then read all
        choices in one batched request whose logprobs start two tokens before the choice."""
        first = self._generate({"text": prompt, "sampling_params": {"max_new_tokens": 0}})
        start = max(first["meta_info"]["prompt_tokens"] - 2, 0)
        outs = self._generate({
            "text": [prompt + c for c in choices],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": start,
            "return_text_in_logprobs": True})
        return [ChoiceLogprobs(o["meta_info"]["input_token_logprobs"], meta_info=o["meta_info"])
                for o in outs]

    def unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list]:
        outs = self._generate({
            "input_ids": token_ids, "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0})
        return [o["meta_info"]["input_token_logprobs"] for o in outs]

    def cache_prefix(self, prefix: str) -> None:
        self._generate({"text": prefix, "sampling_params": {"max_new_tokens": 0}})

    def flush_cache(self) -> bool:
        url = self.base_url + "/flush_cache"
        try:
            resp = self.session.post(url, timeout=(_CONNECT_TIMEOUT_S, self.timeout))
        except requests.RequestException as e:
            raise BackendError(f"cannot reach the server at {self.base_url}: {e}") from e
        return resp.status_code == 200

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")

    def tool_parser(self) -> ToolCallParser:
        """The server's `tool_call_parser`, else the format its chat template shows."""
        if self._tool_parser is None:
            name = self.get_server_info().get("tool_call_parser")
            self._tool_parser = resolve_parser(name, self._template_source)
        return self._tool_parser

    def token_ids(self, text: str) -> list[int]:
        return list(self._request("POST", "/tokenize", {"prompt": text})["tokens"])

    def shutdown(self) -> None:
        self.session.close()
