"""One SamplingParams contract: the /generate body model is derived from its fields, the
OpenAI names map onto them through one table, and the server validates a call's parameters
once into the object the engine takes as it is (fake engine, fast)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeEngine

from radixlm.runtime.sampling_params import ALIASES, UNSUPPORTED, SamplingParams
from radixlm.server.app import create_app
from radixlm.server.protocol import OPENAI_SAMPLING, CompletionRequest
from radixlm.server.sampling_body import SamplingParamsBody

FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]


def test_body_model_is_the_fields_plus_sglang_extras() -> None:
    body = list(SamplingParamsBody.model_fields)
    assert [k for k in body if k in FIELDS] == FIELDS  # all of them, in declaration order
    assert set(body) - set(FIELDS) == set(ALIASES) | set(UNSUPPORTED)


def test_openai_names_are_fields() -> None:
    assert set(OPENAI_SAMPLING.values()) <= set(FIELDS)
    assert set(OPENAI_SAMPLING) <= set(CompletionRequest.model_fields)
    assert OPENAI_SAMPLING["min_tokens"] == "min_new_tokens"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[SamplingParams]:
    """Every SamplingParams that `validate` ran on (one entry per run)."""
    runs: list[SamplingParams] = []
    validate = SamplingParams.validate

    def counting(self: SamplingParams) -> None:
        runs.append(self)
        validate(self)

    monkeypatch.setattr(SamplingParams, "validate", counting)
    return runs


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    handed: list[Any] = []
    generate = FakeEngine.async_generate

    async def spy(self: FakeEngine, *args: Any, **kwargs: Any) -> Any:
        handed.append(kwargs.get("sampling_params"))
        return await generate(self, *args, **kwargs)

    monkeypatch.setattr(FakeEngine, "async_generate", spy)
    return handed


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3, "n": 2, "seed": 1}}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3, "n": 2, "seed": 1}),
])
def test_server_validates_once_and_hands_the_object_over(
        monkeypatch: pytest.MonkeyPatch, counted: list[SamplingParams], path: str,
        body: dict[str, Any]) -> None:
    handed = _spy(monkeypatch)
    r = TestClient(create_app(FakeEngine())).post(path, json=body)
    assert r.status_code == 200, r.text
    assert all(isinstance(p, SamplingParams) and p.validated for p in handed)
    assert [p.seed for p in handed] == [1, 2] and [p.n for p in handed] == [1, 1]
    assert len(counted) == 2  # one validation per engine request
    for p in handed:  # what the engine does with it: no second validation
        assert SamplingParams.from_dict(p) is p
    assert len(counted) == 2


def test_engine_path_validates_dicts_and_fresh_objects(counted: list[SamplingParams]) -> None:
    params = SamplingParams.from_dict({"temperature": 0.5, "seed": 3})
    assert params.validated and len(counted) == 1
    assert SamplingParams.from_dict(params) is params and len(counted) == 1
    sample = params.with_seed(4)
    assert sample.validated and sample.seed == 4 and sample.temperature == 0.5
    fresh = SamplingParams(temperature=-1.0)
    assert not fresh.validated
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_dict(fresh)
