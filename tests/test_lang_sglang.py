"""SGLang's frontend names with SGLang's behaviour (python/sglang/lang/interpreter.py, api.py):
gen(n=...), gen(stop_regex=...), join("concate_and_append"), s.copy(), separate_reasoning,
global_config, text_async_iter(return_meta_data=...), image/video. A fake backend pins the
interpreter down; gen(n) and stop_regex also run on the engine (tiny random model)."""

from __future__ import annotations

import asyncio

import pytest
from test_lang_unit import FakeBackend

import radixlm as sgl
from radixlm.lang.reasoning import split_reasoning


class SamplesBackend(FakeBackend):
    """FakeBackend that answers n > 1 with n different texts, as the real backends do."""

    def generate(self, prompt, params):
        text, meta = super().generate(prompt, params)
        if (params.n or 1) > 1:
            return [f"{text}{j}" for j in range(params.n)], [dict(meta, j=j)
                                                             for j in range(params.n)]
        return text, meta


@pytest.fixture
def fake():
    return SamplesBackend()


def test_gen_n_gives_a_list_and_the_text_continues_with_the_first(fake):
    @sgl.function
    def f(s):
        s += "Q:" + sgl.gen("a", max_tokens=2, n=3) + "|"

    state = f.run(backend=fake)
    assert state["a"] == ["xx0", "xx1", "xx2"]
    assert state.text() == "Q:xx0|"
    assert [m["j"] for m in state.get_meta_info("a")] == [0, 1, 2]
    assert fake.calls[-1][2].engine_sampling_params()["n"] == 3
    streamed = f.run(backend=fake, stream=True)
    streamed.sync()
    assert isinstance(streamed.error(), ValueError) and "cannot stream" in str(streamed.error())
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        sgl.gen("a", n=0)


def test_stop_regex_reaches_the_request(fake):
    @sgl.function
    def f(s):
        s += sgl.gen("a", max_tokens=3, stop_regex=r"\d+")
        s += sgl.gen("b", max_tokens=3, stop_regex=["x", "y+"])

    f.run(backend=fake)
    sent = [c[2].engine_sampling_params()["stop_regex"] for c in fake.calls]
    assert sent == [[r"\d+"], ["x", "y+"]]
    with pytest.raises(ValueError, match="invalid regex"):
        sgl.gen("a", stop_regex="(")


def test_join_concate_and_append_appends_fork_texts_in_order(fake):
    @sgl.function
    def f(s, mode):
        s += "P:"
        forks = s.fork(3)
        forks += lambda i: f"<{i}>" + sgl.gen("g", max_tokens=1)
        forks.join(mode)
        s += "|"

    assert f.run("concate_and_append", backend=fake).text() == "P:<0>x<1>x<2>x|"
    assert f.run("concate_join", backend=fake).text() == "P:<0>x<1>x<2>x|"
    with pytest.raises(ValueError, match="unknown join mode"):
        f.run("sideways", backend=fake)


def test_copy_is_a_one_state_fork_joined_back(fake):
    @sgl.function
    def f(s):
        s += "base "
        with s.copy() as c:
            c += "draft " + sgl.gen("draft", max_tokens=2)
            s["seen"] = c.text()
        s += "final"

    state = f.run(backend=fake)
    assert state["seen"] == "base draft xx"
    assert state["draft"] == ["xx"]  # gathered as a list, as a join does
    assert state.text() == "base final"


@pytest.mark.parametrize("model_type, text, reasoning, answer", [
    ("qwen3", "<think>add them</think>\n\n42", "add them", "42"),
    ("qwen3", "42", "", "42"),  # no start marker: all answer
    ("deepseek-r1", "add them</think> 42", "add them", "42"),  # forced: no start marker needed
    ("deepseek-r1", "still thinking", "still thinking", ""),  # cut off while reasoning
    ("kimi", "\u25c1think\u25b7hm\u25c1/think\u25b7ok", "hm", "ok"),
])
def test_split_reasoning_rules(model_type, text, reasoning, answer):
    assert split_reasoning(text, model_type) == (reasoning, answer)


def test_separate_reasoning_splits_the_variable_and_the_text():
    backend = FakeBackend(answer_fn=lambda prompt, params: "<think>2+2 is 4</think> Four.")

    @sgl.function
    def f(s):
        s += sgl.user("2+2?")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", max_tokens=9),
                                                  model_type="qwen3"))
        s += sgl.user("and " + s["answer"])

    state = f.run(backend=backend)
    assert state["answer"] == "Four."
    assert state["answer_reasoning_content"] == "2+2 is 4"
    assert "<think>" not in state.text() and "Four.<|im_end|>" in state.text()
    assert state.messages()[-2] == {"role": "assistant", "content": "Four."}
    assert state.messages()[-1]["content"] == "and Four."
    with pytest.raises(ValueError, match="unknown model_type"):
        sgl.separate_reasoning(sgl.gen("a"), model_type="nope")
    with pytest.raises(ValueError, match="needs a name"):
        @sgl.function
        def g(s):
            s += sgl.separate_reasoning(sgl.gen(max_tokens=1), model_type="qwen3")
        g.run(backend=backend)


def test_global_config(fake, capsys):
    from radixlm.lang import api

    @sgl.function
    def f(s, q):
        s += "A long constant prefix that the tracer sees before the argument. " * 3
        s += q + sgl.gen("a", max_tokens=1)

    saved = api.get_default_backend()
    try:
        sgl.global_config.default_backend = fake
        assert sgl.get_default_backend() is fake
        sgl.global_config.verbosity = 2
        f.run("q1")  # no backend=: the default one
        assert capsys.readouterr().out.strip().endswith("q1x")
        sgl.global_config.verbosity = 0
        sgl.global_config.enable_precache_with_tracing = False
        f.run_batch([{"q": "a"}, {"q": "b"}], progress_bar=False)
        assert fake.cached == []
        sgl.global_config.enable_precache_with_tracing = True
        f.run_batch([{"q": "a"}, {"q": "b"}], progress_bar=False)
        assert len(fake.cached) == 1
        sgl.global_config.skip_special_tokens_in_output = False
        f.run("q2")
        assert fake.calls[-1][2].engine_sampling_params()["skip_special_tokens"] is False
    finally:
        sgl.global_config.verbosity = 0
        sgl.global_config.skip_special_tokens_in_output = True
        sgl.global_config.enable_precache_with_tracing = True
        sgl.global_config.default_backend = saved


def test_text_async_iter_with_meta_data(fake):
    @sgl.function
    def f(s):
        s += sgl.gen("x", max_tokens=4)

    async def collect(**kw):
        state = f.run(backend=fake, stream=True)
        return [p async for p in state.text_async_iter("x", **kw)]

    pairs = asyncio.run(collect(return_meta_data=True))
    assert "".join(p for p, _ in pairs) == "xxxx" and len(pairs) > 1
    assert all(isinstance(m, dict) and "prompt_tokens" in m for _, m in pairs)
    assert "".join(asyncio.run(collect())) == "xxxx"

    async def no_var():
        state = f.run(backend=fake, stream=True)
        return [p async for p in state.text_async_iter(return_meta_data=True)]

    with pytest.raises(ValueError, match="needs var_name"):
        asyncio.run(no_var())


@pytest.mark.parametrize("media", [lambda: sgl.image("cat.png"),
                                   lambda: sgl.video("cat.mp4", num_frames=4)])
def test_image_and_video_say_the_model_has_no_vision_input(fake, media):
    @sgl.function
    def f(s):
        s += sgl.user(media() + "What is this?")

    with pytest.raises(ValueError, match="this model has no vision input"):
        f.run(backend=fake)


def test_gen_n_and_stop_regex_on_the_engine(tiny_model_dir):
    from radixlm.runtime.engine import Engine

    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                log_level="warning") as engine:
        backend = sgl.Runtime(engine)

        @sgl.function
        def f(s):
            s += "Numbers:" + sgl.gen("a", max_tokens=6, n=3, temperature=50.0) + "|"

        state = f.run(backend=backend)
        assert isinstance(state["a"], list) and len(state["a"]) == 3
        assert len(set(state["a"])) > 1  # independent samples
        assert state.text() == "Numbers:" + state["a"][0] + "|"
        assert [m["completion_tokens"] for m in state.get_meta_info("a")] == [6, 6, 6]

        free = engine.generate("Numbers:", {"temperature": 0, "max_new_tokens": 8,
                                            "ignore_eos": True})["text"]
        cut = free[: max(len(free) // 2, 1)]

        @sgl.function
        def g(s):
            s += "Numbers:" + sgl.gen("a", max_tokens=8, temperature=0, ignore_eos=True,
                                      stop_regex=__import__("re").escape(cut[-1]))

        out = g.run(backend=backend)["a"]
        assert out == free[: free.index(cut[-1])]  # stopped at the first match, trimmed
