"""`radixlm run`: a streaming chat in the terminal, in the manner of `ollama run`.

The conversation is kept until exit. Commands: `/bye` exits, `/clear` forgets the
conversation, `/set NAME VALUE` changes temperature, top_p, max_tokens or system (`/set`
alone shows them), `/?` lists the commands. Ctrl-C stops the answer being written (what was
written stays in the conversation) and at the prompt only says how to leave; Ctrl-D leaves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import TextIO

from radixlm.chat.backends import ChatBackend, ChatError, ChatOptions

PROMPT = ">>> "
HELP = """Commands:
  /set                  show the settings
  /set temperature 0.2  sampling temperature (0: greedy)
  /set top_p 0.9        nucleus sampling
  /set max_tokens 256   the longest answer, in tokens
  /set system TEXT      the system prompt (/set system with no text removes it)
  /clear                forget the conversation
  /bye                  exit (so does Ctrl-D)
Ctrl-C stops an answer."""


def parse_setting(name: str, value: str) -> tuple[str, float | int | str | None]:
    """(field, value) for `/set NAME VALUE`; ValueError naming what is wrong."""
    key = name.lower().replace("-", "_")
    if key == "system":
        return key, value or None
    if key not in ("temperature", "top_p", "max_tokens"):
        raise ValueError(f"unknown setting {name!r}; settings: temperature, top_p, "
                         "max_tokens, system")
    try:
        number = int(value) if key == "max_tokens" else float(value)
    except ValueError:
        raise ValueError(f"{key} takes a number, got {value!r}") from None
    if key == "temperature" and not 0 <= number <= 100:
        raise ValueError(f"temperature must be in [0, 100], got {value}")
    if key == "top_p" and not 0 < number <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {value}")
    if key == "max_tokens" and number < 1:
        raise ValueError(f"max_tokens must be >= 1, got {value}")
    return key, number


class Repl:
    """The read-answer loop over one backend. `read` is `input` (tests pass their own)."""

    def __init__(self, backend: ChatBackend, options: ChatOptions | None = None,
                 out: TextIO = sys.stdout, read: Callable[[str], str] = input) -> None:
        self.backend = backend
        self.options = options or ChatOptions()
        self.out = out
        self.read = read
        self.history: list[dict[str, str]] = []

    def say(self, text: str, end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    def run(self) -> int:
        """Until /bye or end of input; returns the exit code."""
        self.say(f"Chatting with {self.backend.model_name}. /? for help, /bye to exit.")
        while True:
            try:
                line = self.read(PROMPT)
            except EOFError:
                self.say("")
                return 0
            except KeyboardInterrupt:
                self.say("\nUse /bye or Ctrl-D to exit.")
                continue
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not self.command(text):
                    return 0
                continue
            self.answer(line)

    def command(self, text: str) -> bool:
        """Run one /command; False means exit."""
        word, _, rest = text.partition(" ")
        word = word.lower()
        if word in ("/bye", "/exit", "/quit"):
            return False
        if word == "/clear":
            self.history.clear()
            self.say("Cleared the conversation.")
        elif word in ("/?", "/help"):
            self.say(HELP)
        elif word == "/set":
            self.set(rest.strip())
        else:
            self.say(f"Unknown command {word!r}; /? lists the commands.")
        return True

    def set(self, args: str) -> None:
        if not args:
            for key, value in asdict(self.options).items():
                self.say(f"  {key} = {value!r}")
            return
        name, _, value = args.partition(" ")
        try:
            key, parsed = parse_setting(name, value.strip())
        except ValueError as exc:
            self.say(f"Cannot set that: {exc}")
            return
        setattr(self.options, key, parsed)
        self.say(f"Set {key} to {parsed!r}.")

    def messages(self, user_text: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.options.system}] \
            if self.options.system else []
        return [*system, *self.history, {"role": "user", "content": user_text}]

    def answer(self, user_text: str) -> None:
        """Stream the answer to `user_text`; keep the exchange unless it failed."""
        pieces: list[str] = []
        stream = self.backend.stream(self.messages(user_text), self.options)
        try:
            for piece in stream:
                pieces.append(piece)
                self.out.write(piece)
                self.out.flush()
        except KeyboardInterrupt:
            self.say("\n[stopped]")
        except ChatError as exc:
            self.say(("\n" if pieces else "") + f"Error: {exc}")
            return
        else:
            if pieces and not pieces[-1].endswith("\n"):
                self.say("")
        finally:
            stream.close()  # type: ignore[attr-defined]
        self.history += [{"role": "user", "content": user_text},
                         {"role": "assistant", "content": "".join(pieces)}]
