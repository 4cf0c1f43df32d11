"""The one error type routes raise, answered in OpenAI's error shape (`ApiError`), and its
variants in Anthropic's shape for the Messages API (`AnthropicError`) and in Ollama's for
the routes under `/api/` (`OllamaError`)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}` (OpenAI shape,
    which also satisfies SGLang clients that read `error.message`)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        """OpenAI's error type for the status code."""
        return {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 413: "invalid_request_error",
                429: "rate_limit_error", 504: "timeout_error"}.get(
                    self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code if self.code is not None else self.status}}


# Anthropic's error type per status (its API's names; 503 is overloaded, which clients retry)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


class AnthropicError(ApiError):
    """An ApiError answered in Anthropic's error shape, `{"type": "error", "error": {"type",
    "message"}}` (the Messages API's routes raise these; the app's handler sends `body()`)."""

    @classmethod
    def of(cls, exc: ApiError) -> AnthropicError:
        """``exc`` (status, message, param, code, headers kept) in Anthropic's shape."""
        if isinstance(exc, AnthropicError):
            return exc
        return cls(exc.status, exc.message, param=exc.param, code=exc.code,
                   headers=exc.headers)

    @property
    def type(self) -> str:
        """Anthropic's error type for the status code."""
        return _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500
                                    else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


class OllamaError(ApiError):
    """An ApiError answered in Ollama's error shape, `{"error": "message"}` with the HTTP
    status (the routes under `/api/` raise these; the app's handler sends `body()`)."""

    @classmethod
    def of(cls, exc: ApiError) -> OllamaError:
        """``exc`` (status, message, param, code, headers kept) in Ollama's shape."""
        if isinstance(exc, OllamaError):
            return exc
        return cls(exc.status, exc.message, param=exc.param, code=exc.code,
                   headers=exc.headers)

    def body(self) -> dict[str, Any]:
        return {"error": self.message}
