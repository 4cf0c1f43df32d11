"""Where `radixlm run` sends a conversation: an Engine in this process, or a server's OpenAI
chat API over HTTP. Both stream the answer as text pieces; closing the stream (or a
KeyboardInterrupt while waiting on it) stops the generation there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from radixlm.server.streaming import SSE_DONE, StreamError, sse_event


@dataclass
class ChatOptions:
    """The settings `/set` changes (Ollama's names where it has them)."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    system: str | None = None


class ChatError(Exception):
    """A request the backend refused or that failed (the message says why)."""


class ChatBackend(Protocol):
    """A place to chat with. `stream` yields the answer's text in pieces as they are made;
    afterwards `last_finish` says why it ended ("stop", "length", ...)."""

    model_name: str
    last_finish: str | None

    def stream(self, messages: list[dict[str, str]], options: ChatOptions) -> Iterator[str]:
        ...

    def close(self) -> None:
        ...


class EngineBackend:
    """An in-process Engine; the conversation goes through the tokenizer's chat template."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model_name = str(engine.model_name)
        self.last_finish: str | None = None

    def _input_ids(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.engine.tokenizer.apply_chat_template(messages, tokenize=True,
                                                        add_generation_prompt=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]

    def stream(self, messages: list[dict[str, str]], options: ChatOptions) -> Iterator[str]:
        ids = self._input_ids(messages)
        room = int(self.engine.context_len) - len(ids)
        if room < 1:
            raise ChatError(f"the conversation is {len(ids)} tokens and fills the context "
                            f"({self.engine.context_len}); /clear starts afresh")
        params = {"temperature": options.temperature, "top_p": options.top_p,
                  "max_new_tokens": min(options.max_tokens, room)}
        self.last_finish = None
        try:
            chunks = self.engine.generate(input_ids=ids, sampling_params=params, stream=True,
                                          rid=f"run-{uuid.uuid4().hex[:12]}")
        except ValueError as exc:
            raise ChatError(str(exc)) from exc
        sent = 0
        try:  # closing `chunks` before its end aborts the request
            for chunk in chunks:
                text = chunk["text"]
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
                reason = chunk["meta_info"]["finish_reason"]
                if reason is not None:
                    self.last_finish = reason.get("type") if isinstance(reason, dict) \
                        else str(reason)
                    if isinstance(reason, dict) and reason.get("status_code"):
                        raise ChatError(reason.get("message", "the request failed"))
        finally:
            chunks.close()

    def close(self) -> None:
        self.engine.shutdown()


class HttpBackend:
    """A radixlm (or any OpenAI-compatible) server: `/v1/chat/completions`, streamed."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None,
                 timeout: float = 10.0) -> None:
        import requests

        self.url = url.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.last_finish: str | None = None
        self.model_name = model or self._served_model()

    def _check(self, res: Any) -> None:
        if res.status_code == 200:
            return
        try:
            message = res.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = res.text[:300]
        raise ChatError(f"{self.url} answered {res.status_code}: {message}")

    def _served_model(self) -> str:
        import requests

        try:
            res = self.session.get(f"{self.url}/v1/models", timeout=self.timeout)
        except requests.RequestException as exc:
            raise ChatError(f"cannot reach {self.url}: {exc}") from exc
        self._check(res)
        data = res.json().get("data") or [{}]
        return str(data[0].get("id", "default"))

    def stream(self, messages: list[dict[str, str]], options: ChatOptions) -> Iterator[str]:
        import requests

        body = {"model": self.model_name, "messages": messages, "stream": True,
                "temperature": options.temperature, "top_p": options.top_p,
                "max_tokens": options.max_tokens}
        self.last_finish = None
        try:
            res = self.session.post(f"{self.url}/v1/chat/completions", json=body, stream=True,
                                    timeout=(self.timeout, None))
        except requests.RequestException as exc:
            raise ChatError(f"cannot reach {self.url}: {exc}") from exc
        with res:  # leaving early closes the connection: the server aborts the request
            self._check(res)
            for raw in res.iter_lines(chunk_size=None):  # each line as soon as it arrives
                try:
                    event = sse_event(raw.decode("utf-8"))
                except StreamError as exc:
                    raise ChatError(str(exc)) from exc
                if event == SSE_DONE:
                    return
                if not isinstance(event, dict):
                    continue
                for choice in event.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        yield piece
                    if choice.get("finish_reason"):
                        self.last_finish = choice["finish_reason"]

    def close(self) -> None:
        self.session.close()
