"""The one error type routes raise, answered in OpenAI's error shape."""

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
