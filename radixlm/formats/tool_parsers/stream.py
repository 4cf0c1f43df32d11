"""A growing output as OpenAI chat-completion deltas (``ToolCallStream``)."""

from __future__ import annotations

from typing import Any

from radixlm.formats.tool_parsers.setup import ToolSetup


class ToolCallStream:
    """One choice's output, fed its whole text at each chunk, as OpenAI deltas: content
    pieces, and per call a first delta with ``id``, ``type`` and ``function.name`` (empty
    ``arguments``), then ``function.arguments`` fragments. Joined, the content pieces are
    the one-shot ``ToolSetup.parse`` content and each call's fragments its ``arguments``.

    ``incremental``: the output is constrained to the format (a tool grammar), so a call is
    streamed while it is written; otherwise a call is sent once nothing can undo it (its
    section closed), and text that turns out not to be a call goes out as content."""

    def __init__(self, setup: ToolSetup, incremental: bool) -> None:
        self.setup = setup
        self.incremental = incremental
        self.content_sent = 0
        self.sent: list[tuple[str, str]] = []  # per call: (id, arguments sent so far)

    @property
    def called(self) -> bool:
        """Whether any call has been sent."""
        return bool(self.sent)

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content delta, tool-call deltas) for the output's text so far."""
        setup = self.setup
        scan = setup.parser.scan(text, final, setup.names)
        # trailing whitespace waits: it is not content if a call follows it
        content = scan.content if final else scan.content.rstrip()
        delta = content[self.content_sent:] if len(content) > self.content_sent else ""
        self.content_sent = max(self.content_sent, len(content))
        out: list[dict[str, Any]] = []
        for i, call in enumerate(scan.calls[: setup.max_calls]):
            if not (self.incremental or call.stable):
                break
            if i == len(self.sent):
                self.sent.append((setup.parser.new_call_id(), ""))
                out.append({"index": i, "id": self.sent[i][0], "type": "function",
                            "function": {"name": call.name, "arguments": ""}})
            call_id, args = self.sent[i]
            if len(call.arguments) > len(args) and call.arguments.startswith(args):
                out.append({"index": i, "function": {"arguments": call.arguments[len(args):]}})
                self.sent[i] = (call_id, call.arguments)
        return delta, out
