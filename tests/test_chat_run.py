"""`radixlm run` and `radixlm list`: the REPL's commands on a scripted backend, the model
listing (GGUF header read against gguf's own reader, the history file), an unknown model,
the real thing in a terminal under tmux (streamed, `/set temperature 0` gives the server's
greedy answer, Ctrl-C stops an answer and not the program, `/bye` exits) and `--url`."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from radixlm.chat import models
from radixlm.chat.backends import ChatError, ChatOptions
from radixlm.chat.repl import PROMPT, Repl, parse_setting

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class ScriptedBackend:
    """Answers from a list; records what it was sent and how much output was written
    before each piece it yields (so a test sees the REPL write piece by piece)."""

    model_name = "scripted"

    def __init__(self, out: io.StringIO, answers: list[list[str] | Exception]) -> None:
        self.out, self.answers = out, answers
        self.sent: list[tuple[list[dict[str, str]], ChatOptions]] = []
        self.written_before: list[int] = []
        self.closed = 0
        self.last_finish = None

    def stream(self, messages, options) -> Iterator[str]:
        self.sent.append(([dict(m) for m in messages], ChatOptions(**vars(options))))
        answer = self.answers.pop(0)
        try:
            for piece in answer:
                if isinstance(piece, BaseException):
                    raise piece
                self.written_before.append(len(self.out.getvalue()))
                yield piece
        finally:
            self.closed += 1

    def close(self) -> None:
        pass


def run_repl(lines: list[str | BaseException], answers) -> tuple[int, str, ScriptedBackend]:
    out = io.StringIO()
    backend = ScriptedBackend(out, answers)
    feed = iter(lines)

    def read(prompt: str) -> str:
        out.write(prompt)
        item = next(feed, EOFError())
        if isinstance(item, BaseException):
            raise item
        return item

    code = Repl(backend, ChatOptions(), out=out, read=read).run()
    return code, out.getvalue(), backend


def test_repl_streams_pieces_keeps_history_and_obeys_commands() -> None:
    code, out, backend = run_repl(
        ["Hi", "/set temperature 0", "/set system Be brief.", "/set top-p 0.5",
         "/set max_tokens 7", "Again", "/clear", "Fresh", "/bye", "never read"],
        [["Hel", "lo", "!"], ["Sure"], ["New"]])
    assert code == 0 and "never read" not in out
    assert "Hello!\n" in out
    # each piece was written (and flushed) before the next was asked for
    assert backend.written_before[1] > backend.written_before[0]
    assert backend.written_before[2] == backend.written_before[1] + 2
    (m1, o1), (m2, o2), (m3, o3) = backend.sent
    assert m1 == [{"role": "user", "content": "Hi"}] and o1.temperature == 0.7
    assert m2 == [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Again"}]
    assert (o2.temperature, o2.top_p, o2.max_tokens) == (0.0, 0.5, 7)
    assert m3 == [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Fresh"}]
    assert "Set temperature to 0.0." in out and "Cleared the conversation." in out


def test_repl_ctrl_c_stops_the_answer_not_the_program() -> None:
    code, out, backend = run_repl(
        ["Tell me a story", KeyboardInterrupt(), "Next", "Boom"],
        [["Once", " upon", KeyboardInterrupt()], ["Fine"], [ChatError("the server said no")]])
    assert code == 0  # ended by end of input
    assert "Once upon\n[stopped]" in out and "Use /bye or Ctrl-D to exit." in out
    assert backend.closed == 3  # every stream closed (an interrupted one aborts its request)
    # the stopped answer stays in the conversation as far as it got; a failed one does not
    assert backend.sent[1][0][1] == {"role": "assistant", "content": "Once upon"}
    assert "Error: the server said no" in out
    assert out.count(PROMPT) == 5


@pytest.mark.parametrize("args,message", [
    (("temperature", "hot"), "takes a number"), (("top_p", "0"), "(0, 1]"),
    (("max_tokens", "0"), ">= 1"), (("seed", "1"), "unknown setting 'seed'"),
    (("temperature", "-1"), "[0, 100]")])
def test_bad_settings_are_refused_by_name(args, message) -> None:
    with pytest.raises(ValueError) as err:
        parse_setting(*args)
    assert message in str(err.value)
    code, out, _ = run_repl([f"/set {args[0]} {args[1]}", "/set", "/nope"], [])
    assert "Cannot set that:" in out and "temperature = 0.7" in out
    assert "Unknown command '/nope'" in out


def test_gguf_header_read_gives_the_file_type(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["a", "bb", "ccc"] * 50)  # string arrays to skip before the key
    w.add_array("test.ints", [1, 2, 3])
    w.add_float32("test.f", 1.5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert models.gguf_quantization(path) == "Q8_0"
    embedded = models.known_models()[0]  # (its header against GGUFReader: test_gguf_file)
    assert embedded.quantization == "Q4_1"
    assert embedded.size_bytes == embedded.path.stat().st_size
    (tmp_path / "not.gguf").write_bytes(b"nope")
    assert models.gguf_quantization(tmp_path / "not.gguf") == "unknown"


def test_list_shows_the_embedded_model_the_cache_and_paths_given_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    hf_dir = tmp_path / "my-model"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    (hf_dir / "model.safetensors").write_bytes(b"x" * 1234)
    gone = tmp_path / "gone"
    gone.mkdir()
    models.remember(str(gone))
    models.remember(str(hf_dir))
    shutil.rmtree(gone)
    models.remember("smollm2-135m-instruct")  # an alias, not a path: not recorded
    assert models.read_history() == [str(hf_dir.resolve())]
    cached = tmp_path / "cache" / "models" / model_dir.name
    shutil.copytree(model_dir, cached, ignore=shutil.ignore_patterns("*.safetensors"))
    entries = {e.name: e for e in models.known_models()}
    assert entries["smollm2-135m-instruct"].kind == "embedded"
    mine = entries[str(hf_dir.resolve())]
    assert (mine.kind, mine.quantization) == ("history", "bfloat16")
    assert mine.size_bytes == 1234 + len('{"torch_dtype": "bfloat16"}')
    assert entries[str(cached)].quantization == "float32 (from Q4_1 GGUF)"
    out = subprocess.run([sys.executable, "-m", "radixlm.cli", "list"], capture_output=True,
                         text=True, env={**ENV, "RADIXLM_CACHE_DIR": str(tmp_path / "cache")},
                         timeout=120, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "SIZE", "QUANTIZATION"]
    assert any(line.startswith("smollm2-135m-instruct") and "Q4_1" in line and "MB" in line
               for line in lines)
    assert any(str(hf_dir.resolve()) in line and "history" in line for line in lines)


def test_unknown_model_lists_what_it_can_load() -> None:
    r = subprocess.run([sys.executable, "-m", "radixlm.cli", "run", "no-such-model"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2
    assert "cannot load model 'no-such-model'" in r.stderr
    assert "Models it can load:" in r.stderr and "smollm2-135m-instruct  (embedded" in r.stderr


# ---------------------------------------------------------------------- the real thing


def server_answer(url: str, question: str, max_tokens: int) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": "m", "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


class Tmux:
    """One detached tmux session running a command; the pane read with capture-pane."""

    def __init__(self, command: str) -> None:
        self.name = f"radixlm-test-{uuid.uuid4().hex[:8]}"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", "200", "-y", "50",
                        command], check=True, env=ENV)

    def screen(self) -> str:
        r = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-200", "-t", self.name],
                           capture_output=True, text=True)
        return r.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.name],
                              capture_output=True).returncode == 0

    def wait_for(self, predicate, what: str, limit_s: float = 300,
                 interval: float = 0.02) -> str:
        deadline = time.time() + limit_s  # a hang guard, not a timing test
        while time.time() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(interval)
        raise AssertionError(f"waited {limit_s} s for {what}; the pane:\n{self.screen()}")

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def prompts(screen: str) -> int:
    return sum(line.startswith(PROMPT.rstrip()) for line in screen.splitlines())


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_run_in_a_terminal_streams_and_obeys_commands(real_server, tmp_path: Path) -> None:
    question = "What is the capital of France?"
    expected = server_answer(real_server.url, question, 40)
    log = tmp_path / "stderr.log"
    tmux = Tmux(f"cd {ROOT} && {sys.executable} -m radixlm.cli run --max-tokens 40 "
                f"--context-length 512 --max-total-tokens 4096 2>{log}")
    try:
        # (the program loads its engine meanwhile: polls 10 times a second leave it the CPU)
        tmux.wait_for(lambda s: prompts(s) == 1, "the first prompt", interval=0.1)
        tmux.keys("/set temperature 0", "Enter")
        tmux.wait_for(lambda s: "Set temperature to 0.0." in s and prompts(s) == 2, "/set")
        tmux.keys(question, "Enter")
        partial = set()
        screen = tmux.wait_for(
            lambda s: partial.add(s.split(question, 1)[-1].strip()) or prompts(s) == 3,
            "the answer")
        answer = screen.split(question, 1)[1].rsplit(PROMPT.rstrip(), 1)[0].strip()
        assert answer == expected.strip()
        growing = sorted(p for p in partial if p and expected.strip().startswith(p))
        assert len(growing) >= 2, partial  # seen part-way: streamed, not printed at the end
        tmux.keys("/set max_tokens 300", "Enter")
        tmux.keys("/set temperature 0.8", "Enter")
        tmux.wait_for(lambda s: prompts(s) == 5, "two more /set")
        tmux.keys("Write a long story about a dragon.", "Enter")
        tmux.wait_for(lambda s: len(s.split("dragon.", 1)[-1].strip()) > 20, "a few words")
        tmux.keys("C-c")
        tmux.wait_for(lambda s: "[stopped]" in s and prompts(s) == 6, "the stop")
        tmux.keys("/bye", "Enter")
        deadline = time.time() + 120
        while tmux.alive() and time.time() < deadline:
            time.sleep(0.1)
        assert not tmux.alive()  # /bye ended the program (and so the session)
    finally:
        tmux.kill()


def test_run_against_a_server_with_url(real_server) -> None:
    question = "Name a large animal."
    expected = server_answer(real_server.url, question, 24)
    r = subprocess.run([sys.executable, "-m", "radixlm.cli", "run", "--url", real_server.url,
                        "--max-tokens", "24"], input=f"/set temperature 0\n{question}\n/bye\n",
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{PROMPT}{expected}" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "radixlm.cli", "run", "--url",
                          "http://127.0.0.1:9"], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert bad.returncode == 2 and "cannot reach http://127.0.0.1:9" in bad.stderr
