"""Engine API on the real model: bad input, stop conditions, logprobs, seeds, streaming."""

from __future__ import annotations

import asyncio

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 24}
PROMPT = "Write one sentence about the ocean."


@pytest.mark.parametrize("kwargs, field", [
    ({"prompt": ""}, "empty"),
    ({"prompt": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"prompt": "hi", "sampling_params": {"max_new_tokens": 10**6}}, "max_new_tokens"),
    ({"prompt": "hi", "sampling_params": {"top_p": 0.0}}, "top_p"),
    ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"prompt": "hi", "sampling_params": {"temperature": -0.5}}, "temperature"),
    ({"prompt": "hi", "sampling_params": {"bogus_key": 1}}, "bogus_key"),
    ({"prompt": "hi", "sampling_params": {"max_new_tokens": "ten"}}, "max_new_tokens"),
    ({"prompt": "hi", "sampling_params": {"stop": 5}}, "stop"),
    ({"prompt": "hi", "sampling_params": {"regex": "a", "choices": ["a"]}}, "constraint"),
    ({"prompt": 42}, "prompt"),
    ({"input_ids": [1, "x"]}, "input_ids"),
    ({"input_ids": [10**7]}, "token id"),
    ({"prompt": "hi", "input_ids": [1]}, "exactly one"),
])
def test_bad_input_raises_value_error_naming_the_field(engine_default, kwargs, field):
    with pytest.raises(ValueError, match=field):
        engine_default.generate(**kwargs)
    engine_default.check_integrity()


def test_prompt_longer_than_context(engine_default):
    with pytest.raises(ValueError, match="context"):
        engine_default.generate(input_ids=[100] * (engine_default.context_len + 1))


def test_stop_string_across_token_boundary_is_trimmed(engine_default, tokenizer):
    base = engine_default.generate(PROMPT, GREEDY)
    ids = base["output_ids"]
    # a stop string that starts inside token 3 and ends inside token 4
    t3, t4 = tokenizer.decode(ids[3:4]), tokenizer.decode(ids[4:5])
    assert len(t3) >= 2 and len(t4) >= 2, (t3, t4)
    stop = t3[-2:] + t4[:2]
    prefix = tokenizer.decode(ids[:3]) + t3[:-2]
    out = engine_default.generate(PROMPT, {**GREEDY, "stop": [stop]})
    assert out["text"] == base["text"][: base["text"].index(stop)]
    assert out["text"].startswith(prefix)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = engine_default.generate(PROMPT, {**GREEDY, "stop": stop, "no_stop_trim": True})
    assert kept["text"].endswith(stop)


def test_stop_token_ids_stop_regex_min_and_max_tokens(engine_default):
    base = engine_default.generate(PROMPT, GREEDY)
    ids = base["output_ids"]
    out = engine_default.generate(PROMPT, {**GREEDY, "stop_token_ids": [ids[5]]})
    assert out["output_ids"] == ids[:6]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[5]}
    word = base["text"].split()[3]
    out = engine_default.generate(PROMPT, {**GREEDY, "stop_regex": [rf"\b{word}\b"]})
    assert word not in out["text"].split()[3:] and out["meta_info"]["finish_reason"]["type"] == \
        "stop"
    short = engine_default.generate(PROMPT, {**GREEDY, "max_new_tokens": 3})
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert short["output_ids"] == ids[:3]
    # without min_new_tokens this chat prompt stops early at <|im_end|>
    chat = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"
    free = engine_default.generate(chat, {"temperature": 0, "max_new_tokens": 40})
    assert free["meta_info"]["finish_reason"]["type"] == "stop"
    n_free = free["meta_info"]["completion_tokens"]
    forced = engine_default.generate(chat, {"temperature": 0, "max_new_tokens": 40,
                                         "min_new_tokens": n_free + 5})
    assert forced["meta_info"]["completion_tokens"] >= n_free + 5


def test_prefill_only_and_prompt_logprobs_from_start_len(engine_default, tokenizer):
    ids = tokenizer.encode("The sun rises in the east and sets in the west.")
    full = engine_default.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                                return_logprob=True, logprob_start_len=0)
    meta = full["meta_info"]
    assert full["output_ids"] == [] and meta["finish_reason"]["type"] == "length"
    assert len(meta["input_token_logprobs"]) == len(ids)
    assert meta["input_token_logprobs"][0][0] is None
    assert all(lp <= 0 for lp, _, _ in meta["input_token_logprobs"][1:])
    part = engine_default.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                                return_logprob=True, logprob_start_len=5, top_logprobs_num=3,
                                return_text_in_logprobs=True)
    pm = part["meta_info"]
    assert [t for _, t, _ in pm["input_token_logprobs"]] == ids[5:]
    for (lp, _, text), (lp_full, _, _) in zip(pm["input_token_logprobs"],
                                              meta["input_token_logprobs"][5:]):
        assert lp == pytest.approx(lp_full, abs=1e-4) and isinstance(text, str)
    assert all(len(t) == 3 for t in pm["input_top_logprobs"])


def test_output_logprobs_shapes(engine_default):
    out = engine_default.generate(PROMPT, {**GREEDY, "max_new_tokens": 5}, return_logprob=True,
                               top_logprobs_num=4)
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(len(t) == 4 and t[0][1] == tok for t, tok in
               zip(meta["output_top_logprobs"], out["output_ids"]))  # greedy: top-1 chosen
    assert meta["input_token_logprobs"] == []


def test_seed_reproducible_across_batches_and_n(engine_default):
    params = {"temperature": 1.0, "max_new_tokens": 12, "seed": 1234}
    alone = engine_default.generate(PROMPT, params)
    batch = engine_default.generate(["Hello there", PROMPT, "Name a fruit."],
                                 [{"temperature": 1.0, "max_new_tokens": 9}, params,
                                  {"temperature": 0.7, "max_new_tokens": 5}])
    assert batch[1]["output_ids"] == alone["output_ids"]
    many = engine_default.generate(PROMPT, {**params, "n": 3})
    assert len(many) == 3 and many[0]["output_ids"] == alone["output_ids"]
    assert len({tuple(m["output_ids"]) for m in many}) > 1


def test_stream_concatenates_to_final_and_async(engine_default):
    final = engine_default.generate(PROMPT, GREEDY)
    chunks = list(engine_default.generate(PROMPT, GREEDY, stream=True))
    assert len(chunks) > 3
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
    assert texts[-1] == final["text"] and chunks[-1]["meta_info"]["finish_reason"]

    async def run():
        single = await engine_default.async_generate(PROMPT, GREEDY)
        it = await engine_default.async_generate(PROMPT, GREEDY, stream=True)
        streamed = [c async for c in it]
        return single, streamed

    single, streamed = asyncio.run(run())
    assert single["text"] == final["text"] and streamed[-1]["text"] == final["text"]


def test_async_generate_tokenizes_off_the_event_loop(engine_default, monkeypatch):
    """A text prompt through async_generate is tokenized on a worker thread, not on the
    caller's loop (which a long prompt would hold); the result is the same."""
    import threading

    threads = []
    encode = engine_default.tokenizer.encode

    def spy(*a, **kw):
        threads.append(threading.current_thread())
        return encode(*a, **kw)

    monkeypatch.setattr(engine_default.tokenizer, "encode", spy)

    async def run():
        return threading.current_thread(), await engine_default.async_generate(PROMPT, GREEDY)

    loop_thread, out = asyncio.run(run())
    assert threads and all(t is not loop_thread for t in threads)
    assert out["text"] == engine_default.generate(PROMPT, GREEDY)["text"]


def test_abort_running_request(engine_default):
    it = engine_default.generate(PROMPT, {"temperature": 0, "max_new_tokens": 400,
                                       "ignore_eos": True}, stream=True, rid="to-abort")
    first = next(it)
    engine_default.abort("to-abort")
    rest = list(it)
    last = (rest or [first])[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 400
    engine_default.check_integrity()


def test_detokenizer_never_emits_broken_utf8(engine_default, tokenizer):
    from radixlm.runtime.detokenizer import IncrementalDetokenizer

    text = "Emoji 🎉🚀 and 漢字かな, café — done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    seen = []
    for i in range(1, len(ids) + 1):
        detok.update(ids[:i])
        seen.append(detok.text)
        assert "\ufffd" not in detok.text
    assert seen[-1] == text
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))
