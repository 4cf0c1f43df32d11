"""RuntimeEndpoint over real HTTP against the server app with a fake engine (no model):
API key, SSE streaming, select's token boundary, timeouts, a server without a chat template.

The fake engine (tests/server_fakes.py) tokenizes by character and generates "abcd...".
"""

from __future__ import annotations

import time

import pytest
from server_fakes import FakeEngine, ThreadServer

import radixlm as sgl
from radixlm.lang.backend.base import BackendError
from radixlm.lang.chat_template import ChatTemplateError
from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings


@pytest.fixture
def served():
    fake = FakeEngine(context_len=256, step_delay=0.02)
    server = ThreadServer(create_app(fake, ServerSettings(api_key="sekret"))).start()
    yield fake, server
    server.stop()


def test_api_key_is_required_and_sent(served):
    _, server = served
    with pytest.raises(BackendError, match="401"):
        sgl.RuntimeEndpoint(server.base_url)
    endpoint = sgl.RuntimeEndpoint(server.base_url, api_key="sekret")
    assert endpoint.model_info["model_path"] == "/fake/model"
    assert endpoint.flush_cache() is True
    assert isinstance(endpoint.get_server_info(), dict)


@sgl.function
def letters(s):
    s += "xy" + sgl.gen("g", max_tokens=3) + "|" + sgl.gen("h", max_tokens=6, stop="e")


def test_gen_and_stop_over_http(served):
    fake, server = served
    endpoint = sgl.RuntimeEndpoint(server.base_url, api_key="sekret")
    state = letters.run(backend=endpoint, temperature=0)
    assert state.error() is None
    assert (state["g"], state["h"], state.text()) == ("abc", "abcd", "xyabc|abcd")
    assert state.get_meta_info("g")["prompt_tokens"] == 2
    assert fake.calls[1]["text"] == "xyabc|"
    assert fake.calls[1]["sampling_params"]["stop"] == ["e"]


def test_stream_over_http_is_incremental(served):
    _, server = served
    endpoint = sgl.RuntimeEndpoint(server.base_url, api_key="sekret")

    @sgl.function
    def f(s):
        s += "go " + sgl.gen("x", max_tokens=8)

    state = f.run(backend=endpoint, stream=True)
    pieces = list(state.text_iter("x"))
    assert len(pieces) > 2 and "".join(pieces) == "abcdefgh" == state["x"]


def test_select_boundary_over_http(served):
    fake, server = served
    endpoint = sgl.RuntimeEndpoint(server.base_url, api_key="sekret")

    @sgl.function
    def f(s):
        s += "Q:" + sgl.select("c", ["a", "bbb"])

    state = f.run(backend=endpoint)
    meta = state.get_meta_info("c")
    # only the choice's own tokens are scored, found from the token texts
    assert [len(t) for t in meta["input_token_logprobs"]] == [1, 3]
    assert [t[2] for t in meta["input_token_logprobs"][1]] == ["b", "b", "b"]
    # one prefill of the prompt (learns its length, warms the cache), then one batched
    # scoring request (which the server fans out to the engine prompt by prompt)
    assert [c["text"] for c in fake.calls] == ["Q:", "Q:a", "Q:bbb"]
    assert [c["logprob_start_len"] for c in fake.calls[1:]] == [0, 0]


def test_timeout_is_a_state_error_not_a_hang(served):
    _, server = served
    endpoint = sgl.RuntimeEndpoint(server.base_url, api_key="sekret", timeout=0.3)

    @sgl.function
    def slow(s):
        s += "x" + sgl.gen("x", max_tokens=100)

    t0 = time.perf_counter()
    state = slow.run(backend=endpoint)
    assert isinstance(state.error(), BackendError)
    assert "timed out" in str(state.error())
    assert time.perf_counter() - t0 < 5


def test_server_without_chat_template(served):
    fake, server = served

    @sgl.function
    def chat(s):
        s += sgl.user("hi")

    # the fake's template always ends in "<assistant>", so roles cannot be isolated
    state = chat.run(backend=sgl.RuntimeEndpoint(server.base_url, api_key="sekret"))
    assert isinstance(state.error(), ChatTemplateError)
    assert "role 'user'" in str(state.error())
    fake.tokenizer.chat_template = None
    state = chat.run(backend=sgl.RuntimeEndpoint(server.base_url, api_key="sekret"))
    assert isinstance(state.error(), ChatTemplateError)
    assert "reports no chat_template" in str(state.error())
    # an explicit template fixes it
    endpoint = sgl.RuntimeEndpoint(
        server.base_url, api_key="sekret",
        chat_template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>"
                      "{% endfor %}")
    assert chat.run(backend=endpoint).text() == "<user>hi</s>"
