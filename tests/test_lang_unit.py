"""Frontend language on a fake backend: interpreter semantics, errors, tracer, choices.

No model: `FakeBackend` answers deterministically and records what it was asked, so these
tests pin down the interpreter (ordering, concurrency, streaming, errors) in milliseconds.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

import radixlm as sgl
from radixlm.lang.backend.base import (
    Backend,
    BackendError,
    ChoiceScores,
    Prompt,
    call_with_timeout,
    split_choice_logprobs,
)
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.gen_args import GenArgs as SamplingParams

SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


class FakeBackend(Backend):
    """Generates `answer_fn(prompt, params)` (default "x" * max_new_tokens) after `delay` s."""

    def __init__(self, delay: float = 0.0, answer_fn=None, fail_on: str | None = None):
        self.delay = delay
        self.answer_fn = answer_fn or (lambda prompt, params: "x" * (params.max_new_tokens or 1))
        self.fail_on = fail_on
        self.calls: list[tuple[str, Prompt, SamplingParams | None]] = []
        self.cached: list[str] = []
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.template = ChatTemplate(SMOL_TEMPLATE)

    def get_chat_template(self) -> ChatTemplate:
        return self.template

    def generate(self, prompt, params):
        with self.lock:
            self.calls.append(("gen", prompt, params))
        if self.fail_on is not None and self.fail_on in prompt.text:
            raise BackendError("server went away")
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        return self.answer_fn(prompt, params), {"prompt_tokens": len(prompt.text)}

    def generate_stream(self, prompt, params):
        text, meta = self.generate(prompt, params)
        for ch in text:
            time.sleep(0.01)
            yield ch, meta

    def score_choices(self, prompt, choices, need_unconditional):
        self.calls.append(("select", prompt, None))
        # Prefers the choice that appears in the prompt; a per-token logprob list per choice.
        scored = [[(-0.1 if c in prompt.text else -2.0, i, c)] for i, c in enumerate(choices)]
        uncond = [[(None, i, c)] for i, c in enumerate(choices)] if need_unconditional else None
        return ChoiceScores(scored, uncond)

    def cache_prefix(self, prefix):
        self.cached.append(prefix)


@pytest.fixture
def fake():
    return FakeBackend()


# ---- chat template -------------------------------------------------------------------------

def test_chat_template_segments_and_default_system_prompt():
    t = ChatTemplate(SMOL_TEMPLATE)
    assert t.segments("user") == ("<|im_start|>user\n", "<|im_end|>\n")
    assert t.segments("assistant") == ("<|im_start|>assistant\n", "<|im_end|>\n")
    assert t.segments("system") == ("<|im_start|>system\n", "<|im_end|>\n")
    assert t.default_system_prompt.startswith("You are a helpful AI assistant named SmolLM")
    assert t.leading_text == ""


def test_chat_template_with_bos_is_written_once():
    t = ChatTemplate(LLAMA3_LIKE, {"bos_token": "<|begin_of_text|>"})
    assert t.leading_text == "<|begin_of_text|>"
    assert t.segments("user")[0] == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert t.default_system_prompt is None and t.preamble == ""


@pytest.mark.parametrize("source,special", [(SMOL_TEMPLATE, {}),
                                            (LLAMA3_LIKE, {"bos_token": "<B>"})])
def test_program_text_equals_rendered_conversation(source, special):
    backend = FakeBackend(answer_fn=lambda p, params: "reply")
    backend.template = ChatTemplate(source, special)

    @sgl.function
    def chat(s):
        s += sgl.user("hello")
        s += sgl.assistant(sgl.gen("a", max_tokens=3))
        with s.user():
            s += "second"
        s += sgl.assistant_begin() + "fixed" + sgl.assistant_end()

    state = chat.run(backend=backend)
    assert state.error() is None
    msgs = [m for m in state.messages() if m["role"] != "system"]
    assert msgs == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "reply"},
                    {"role": "user", "content": "second"},
                    {"role": "assistant", "content": "fixed"}]
    assert state.text() == backend.template.render(msgs)
    # gen saw the prompt ending with the assistant prefix, like add_generation_prompt=True
    gen_prompt = backend.calls[0][1].text
    assert gen_prompt == backend.template.render(msgs[:1], add_generation_prompt=True)


def test_system_message_suppresses_default_prompt(fake):
    @sgl.function
    def f(s):
        s += sgl.system("Be brief.")
        s += sgl.user("hi")

    state = f.run(backend=fake)
    assert "SmolLM" not in state.text()
    assert state.messages()[0] == {"role": "system", "content": "Be brief."}
    assert state.messages()[1]["role"] == "user"


# ---- primitives and parameters -------------------------------------------------------------

def test_run_level_defaults_and_per_gen_overrides(fake):
    @sgl.function
    def f(s):
        s += "A" + sgl.gen("a") + sgl.gen("b", max_tokens=2, temperature=0.5, stop="\n")

    state = f.run(backend=fake, max_new_tokens=4, temperature=0.0, top_p=0.9)
    p_a, p_b = fake.calls[0][2], fake.calls[1][2]
    assert (p_a.max_new_tokens, p_a.temperature, p_a.top_p) == (4, 0.0, 0.9)
    assert (p_b.max_new_tokens, p_b.temperature, p_b.top_p, p_b.stop) == (2, 0.5, 0.9, ["\n"])
    assert state["a"] == "xxxx" and state["b"] == "xx" and state.text() == "Axxxxxx"
    assert fake.calls[1][1].text == "Axxxx"  # the second gen sees the first one's output
    assert state.get_meta_info("a") == {"prompt_tokens": 1}


@pytest.mark.parametrize("stream", [False, True])
def test_gen_int_and_float_drop_the_whitespace_they_stopped_on(stream):
    answers = iter(["42\n", "2.5 ", "no space"])
    backend = FakeBackend(answer_fn=lambda p, params: next(answers))

    @sgl.function
    def f(s):
        s += "n=" + sgl.gen_int("n") + ";x=" + sgl.gen("x", dtype=float) + ";"
        s += sgl.gen("free", max_tokens=3)

    state = f.run(backend=backend, stream=stream)
    state.text()  # waits for the end of a streamed run
    assert state.error() is None
    assert (state["n"], state["x"], state["free"]) == ("42", "2.5", "no space")
    assert state.text() == "n=42;x=2.5;no space"


def test_gen_params_reach_engine_dict():
    expr = sgl.gen("x", max_tokens=5, regex=r"\d+", stop=["a"], top_k=3)
    d = expr.params.merged_over(SamplingParams(temperature=0.0)).engine_sampling_params()
    assert d == {"max_new_tokens": 5, "stop": ["a"], "temperature": 0.0, "top_k": 3,
                 "regex": r"\d+"}
    assert sgl.gen_int("n").params.dtype == "int"
    assert sgl.gen_string("n").params.dtype == "str"
    assert isinstance(sgl.gen("c", choices=["a", "b"]), type(sgl.select("c", ["a"])))


def test_json_schema_forms_are_normalized():
    import json

    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    from_model = json.loads(sgl.gen("p", json_schema=Person).params.json_schema)
    assert from_model["required"] == ["name", "age"]
    from_str = sgl.gen("p", json_schema='{"type": "object"}').params.json_schema
    assert json.loads(from_str) == {"type": "object"}


def test_select_picks_best_and_records_meta(fake):
    @sgl.function
    def f(s):
        s += "The answer is blue. Colour: " + sgl.select("c", ["red", "blue", "green"])

    state = f.run(backend=fake)
    assert state["c"] == "blue"
    assert state.text().endswith("Colour: blue")
    assert state.get_meta_info("c")["normalized_prompt_logprobs"] == [-2.0, -0.1, -2.0]


def test_var_scope_and_set_var(fake):
    @sgl.function
    def f(s):
        with s.var_scope("block"):
            s += "abc" + sgl.gen(max_tokens=2)
        s["manual"] = 7

    state = f.run(backend=fake)
    assert state["block"] == "abcxx"
    assert state["manual"] == 7


def test_bind_positional_args_and_composition(fake):
    @sgl.function
    def inner(s, word):
        s += f"[{word}]"

    @sgl.function
    def outer(s, a, b="B"):
        s += a
        inner(s, word=b)

    assert outer.run("A", backend=fake).text() == "A[B]"
    assert outer.bind(b="Z").run(a="A", backend=fake).text() == "A[Z]"


# ---- fork / join ---------------------------------------------------------------------------

def test_fork_runs_children_concurrently_and_join_gathers(fake):
    fake.delay = 0.3

    @sgl.function
    def f(s):
        s += "Question: why is the sky blue? " * 4
        forks = s.fork(4)
        forks += lambda i: f"Draft {i}: " + sgl.gen("draft", max_tokens=i + 1)
        forks.join()
        s += "Summary: " + sgl.gen("summary", max_tokens=1)

    state = f.run(backend=fake)
    assert state.error() is None
    assert state["draft"] == ["x", "xx", "xxx", "xxxx"]
    assert len(state.get_meta_info("draft")) == 4
    assert fake.max_in_flight == 4  # the four drafts were generating at the same time
    assert fake.cached == ["Question: why is the sky blue? " * 4]  # prefix committed once
    draft_prompts = sorted(c[1].text for c in fake.calls if "Draft" in c[1].text)
    assert draft_prompts[0].startswith("Question:") and draft_prompts[0].endswith("Draft 0: ")


def test_concate_join_and_fork_failure_reaches_parent():
    backend = FakeBackend(fail_on="BAD")

    @sgl.function
    def f(s):
        s += "P:"
        forks = s.fork(2)
        forks += ["one", "two"]
        forks.join("concate_join")
        s += "|"
        bad = s.fork(2)
        bad += ["ok" + sgl.gen("g", max_tokens=1), "BAD" + sgl.gen("g", max_tokens=1)]
        s["from_fork"] = bad[1]["g"]  # raises ProgramError: that fork failed

    state = f.run(backend=backend)
    assert state.text() == "P:onetwo|"
    assert isinstance(state.error(), BackendError)


def test_fork_list_and_iteration(fake):
    @sgl.function
    def f(s):
        forks = s.fork(2)
        forks += ["a", "b"]
        for fork in forks:
            fork += "!"
        s["texts"] = [fk.text() for fk in forks]

    assert f.run(backend=fake)["texts"] == ["a!", "b!"]


# ---- streaming -----------------------------------------------------------------------------

def test_stream_text_iter_is_incremental(fake):
    @sgl.function
    def f(s):
        s += "Start " + sgl.gen("x", max_tokens=6) + " end"

    state = f.run(backend=fake, stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) > 2
    assert "".join(pieces) == "Start xxxxxx end" == state.text()

    state = f.run(backend=fake, stream=True)
    var_pieces = list(state.text_iter("x"))
    assert len(var_pieces) > 2 and "".join(var_pieces) == "xxxxxx"


def test_a_streamed_program_is_read_after_its_function_has_run(fake):
    """``run(stream=True)`` returns while the function still runs: its state's ``text``,
    ``error`` and variables wait for it (the function below has not submitted a step when
    the caller reads), not only for the steps queued so far; a variable already submitted
    is read as soon as it is set."""
    gate = threading.Event()

    @sgl.function
    def late(s):
        gate.wait(5)
        s += "A" + sgl.gen("x", max_tokens=2)
        s += sgl.gen("y", max_tokens=2, n=2)  # (gen(n) cannot stream: the program fails)

    state = late.run(backend=fake, stream=True)
    threading.Timer(0.2, gate.set).start()
    assert state["x"] == "xx"
    assert isinstance(state.error(), ValueError) and "cannot stream" in str(state.error())
    assert state.text() == "Axx"

    gate.clear()
    state = late.run(backend=fake, stream=True)
    threading.Timer(0.2, gate.set).start()
    assert isinstance(state.error(), ValueError)


def test_stream_async_iter(fake):
    @sgl.function
    def f(s):
        s += sgl.gen("x", max_tokens=5)

    async def collect():
        state = f.run(backend=fake, stream=True)
        return [p async for p in state.text_async_iter("x")]

    pieces = asyncio.run(collect())
    assert "".join(pieces) == "xxxxx" and len(pieces) > 1


# ---- run_batch and tracing -----------------------------------------------------------------

FEW_SHOT = "Q: 1+1?\nA: 2\nQ: 2+2?\nA: 4\nQ: 3+3?\nA: 6\nQ: 10+10?\nA: 20\n"


@sgl.function
def few_shot_program(s, question):
    s += sgl.system("You answer arithmetic.")
    s += sgl.user(FEW_SHOT + "Q: " + question + "\nA:")
    s += sgl.assistant(sgl.gen("answer", max_tokens=2))


def test_trace_prefix_stops_at_argument(fake):
    prefix = few_shot_program.trace_prefix(backend=fake)
    assert prefix == ("<|im_start|>system\nYou answer arithmetic.<|im_end|>\n"
                      "<|im_start|>user\n" + FEW_SHOT + "Q: ")


def test_run_batch_precaches_prefix_and_keeps_order(fake):
    fake.answer_fn = lambda p, params: p.text.split("Q: ")[-1].split("?")[0]
    states = few_shot_program.run_batch(
        [{"question": f"{i}+{i}?"} for i in range(6)], backend=fake, progress_bar=False)
    assert [s["answer"] for s in states] == [f"{i}+{i}" for i in range(6)]
    assert fake.cached == [few_shot_program.trace_prefix(backend=fake)]
    assert all(c[1].text.startswith(fake.cached[0]) for c in fake.calls)


def test_trace_keeps_prefix_when_primitive_params_are_arguments(fake):
    @sgl.function
    def mc(s, question, options, n):
        s += FEW_SHOT + question + sgl.select("answer", options)
        s += sgl.gen("more", max_tokens=n)

    assert mc.trace_prefix(backend=fake) == FEW_SHOT
    state = mc.run(question="Q: 5+5?\nA: ", options=["10", "11"], n=2, backend=fake)
    assert state["answer"] == "10" and state["more"] == "xx"


def test_trace_follows_inline_subprograms_without_running_them(fake):
    @sgl.function
    def header(s, title):
        s += "=== " + title + " ===\n"

    @sgl.function
    def doc(s, body):
        header(s, title="A constant title that is long enough to be worth caching")
        s += body + sgl.gen("x", max_tokens=1)

    assert doc.trace_prefix(backend=fake).startswith("=== A constant title")
    assert fake.calls == [] and fake.cached == []


def test_untraceable_program_still_runs(fake):
    @sgl.function
    def f(s, items):
        for item in items:  # iteration over a placeholder stops the trace
            s += item
        s += sgl.gen("x", max_tokens=1)

    assert f.trace_prefix(backend=fake) == ""
    states = f.run_batch([{"items": ["a", "b"]}, ("c",)], backend=fake, progress_bar=False)
    assert [s.text() for s in states] == ["abx", "cx"]
    assert fake.cached == []


# ---- errors --------------------------------------------------------------------------------

def test_first_parameter_must_be_state():
    with pytest.raises(TypeError, match="first parameter must be the program state"):
        sgl.function(lambda: None)
    with pytest.raises(TypeError, match="first parameter"):
        sgl.function(lambda *, s: None)


def test_bad_arguments_raise_before_running(fake):
    with pytest.raises(TypeError, match="few_shot_program"):
        few_shot_program.run(backend=fake, nonsense=1)
    with pytest.raises(TypeError, match="unknown arguments"):
        few_shot_program.bind(nope=1)
    assert fake.calls == []


def test_reused_gen_name_raises(fake):
    @sgl.function
    def f(s):
        s += sgl.gen("x", max_tokens=1)
        s += sgl.select("x", ["a", "b"])

    with pytest.raises(ValueError, match="'x' is already used"):
        f.run(backend=fake)


@pytest.mark.parametrize("make,match", [
    (lambda: sgl.gen("x", regex="([a-z"), "invalid regex"),
    (lambda: sgl.gen("x", regex="(" * 3000 + "a" + ")" * 3000), "invalid regex.*recursion"),
    (lambda: sgl.gen("x", json_schema={"type": "objekt"}), "invalid json_schema"),
    (lambda: sgl.gen("x", json_schema="{not json"), "not valid JSON"),
    (lambda: sgl.gen("x", regex="a", dtype=int), "at most one constraint"),
    (lambda: sgl.gen("x", dtype="complex"), "dtype"),
    (lambda: sgl.gen("x", max_tokens=-1), "max_tokens"),
    (lambda: sgl.select("x", []), "non-empty"),
    (lambda: sgl.select("x", ["a", ""]), "non-empty str"),
])
def test_bad_primitives_raise_where_written(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_fork_zero_and_nested_roles_raise(fake):
    @sgl.function
    def bad_fork(s):
        s.fork(0)

    with pytest.raises(ValueError, match="fork size"):
        bad_fork.run(backend=fake)

    @sgl.function
    def nested(s):
        s += sgl.user_begin()
        s += sgl.assistant("x")

    with pytest.raises(ValueError, match="roles cannot nest"):
        nested.run(backend=fake)


def test_backend_failure_goes_to_state_error_without_hang():
    backend = FakeBackend(fail_on="BOOM")

    @sgl.function
    def f(s):
        s += "BOOM " + sgl.gen("x", max_tokens=1)
        s += "after " + sgl.gen("y", max_tokens=1)
        s["seen"] = s["y"]  # reading a variable that was never set ends the program

    t0 = time.perf_counter()
    state = f.run(backend=backend)
    assert time.perf_counter() - t0 < 2
    assert isinstance(state.error(), BackendError)
    assert "server went away" in str(state.error())
    with pytest.raises(sgl.ProgramError, match="'x' was not set"):
        state["x"]
    assert len(backend.calls) == 1  # nothing after the failure was sent


def test_no_backend_is_a_clear_error():
    sgl.set_default_backend(FakeBackend())
    import radixlm.lang.backend.default as api

    api._default_backend = None
    with pytest.raises(RuntimeError, match="set_default_backend"):
        few_shot_program.run(question="1?")


def test_timeout_helper_raises_backend_error():
    aborted = []
    with pytest.raises(BackendError, match="timed out"):
        call_with_timeout(lambda: time.sleep(2), 0.2, "slow call",
                          on_timeout=lambda: aborted.append(True))
    assert aborted == [True]


def test_endpoint_down_is_a_clear_error():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match="cannot reach"):
        sgl.RuntimeEndpoint(f"http://127.0.0.1:{port}")
    assert time.perf_counter() - t0 < 10


def test_openai_backend_down_is_a_state_error():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = sgl.OpenAI("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=5)

    @sgl.function
    def chat(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("x", max_tokens=2))

    state = chat.run(backend=backend)
    assert isinstance(state.error(), BackendError)
    assert "cannot reach" in str(state.error())

    @sgl.function
    def not_after_assistant(s):
        s += sgl.user("hi" + sgl.gen("x", max_tokens=2))

    state = not_after_assistant.run(backend=backend)
    assert "right after an assistant role begins" in str(state.error())


# ---- choices methods -----------------------------------------------------------------------

def test_choice_methods_differ_as_documented():
    choices = ["long answer", "short"]
    # long: a confident first token then weak ones; short: one medium token
    logprobs = [[(-0.1, 1, "long"), (-3.0, 2, " answer")], [(-1.0, 3, "short")]]
    assert token_length_normalized(choices, logprobs).decision == "short"  # mean -1.55 vs -1
    assert greedy_token_selection(choices, logprobs).decision == "long answer"  # -0.1 > -1
    uncond = [[(None, 1, "long"), (-9.0, 2, " answer")], [(None, 3, "short")]]
    # long: mean(-0.1 - 0, -3 + 9) = 2.95 beats short: -1
    decision = unconditional_likelihood_normalized(choices, logprobs, uncond)
    assert decision.decision == "long answer"
    # temperature > 0 samples; with a huge gap it still picks the clear winner
    clear = [[(-0.01, 1, "a")], [(-50.0, 2, "b")]]
    assert token_length_normalized(["a", "b"], clear, temperature=1.0).decision == "a"


def test_split_choice_logprobs_keeps_boundary_token():
    # prompt "Answer:" + choice " yes": tokens "Answer", ":", " yes"
    entries = [(-1.0, 1, "Answer"), (-2.0, 2, ":"), (-0.5, 3, " yes")]
    assert split_choice_logprobs("Answer:", "Answer: yes", entries) == [entries[2]]
    # a token that straddles the boundary (prompt "Answer: y" + "es") is kept
    merged = [(-1.0, 1, "Answer"), (-2.0, 2, ":"), (-0.5, 3, " yes")]
    assert split_choice_logprobs("Answer: y", "Answer: yes", merged) == [merged[2]]


# ---- package surface -----------------------------------------------------------------------

def test_import_radixlm_is_light_and_exports_dsl():
    code = ("import sys, radixlm as sgl\n"
            "names = ['function','gen','gen_int','gen_string','select','system','user',"
            "'assistant','system_begin','system_end','user_begin','user_end','assistant_begin',"
            "'assistant_end','set_default_backend','flush_cache','get_server_info',"
            "'RuntimeEndpoint','Runtime','OpenAI']\n"
            "missing = [n for n in names if not hasattr(sgl, n)]\n"
            "assert not missing, missing\n"
            "print('torch' in sys.modules)\n"
            "from radixlm.runtime.engine import Engine\n"
            "assert sgl.Engine is Engine\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # the DSL and its HTTP backends need no torch


def test_set_default_backend_accepts_an_engine():
    class Engine:  # stands in for radixlm.runtime.engine.Engine (matched by name)
        tokenizer = None

        def generate(self, **kwargs):
            return {"text": "ok", "meta_info": {"finish_reason": {"type": "length"}}}

    engine = Engine()
    sgl.set_default_backend(engine)
    backend = sgl.get_default_backend()
    assert isinstance(backend, sgl.Runtime) and backend.engine is engine
    @sgl.function
    def plain(s):
        s += "1+1=" + sgl.gen("answer", max_tokens=1)

    assert plain.run()["answer"] == "ok"
    backend.shutdown()  # does not own the engine: nothing to shut down
    with pytest.raises(TypeError, match="not a backend"):
        sgl.set_default_backend(object())
