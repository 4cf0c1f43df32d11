"""The playground's server side: the page and its assets (served without the key), and
`GET /radix_tree` (bounded in nodes and bytes, behind the key, prompt text only when the
server allows it and the client is on loopback). A fake engine whose tree is a real
RadixCache for the bounds; the shared real server for a tree grown by real requests."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeEngine, ThreadServer

from radixlm.cli import main as cli_main
from radixlm.radix import RadixCache
from radixlm.server.app import create_app
from radixlm.server.playground import MAX_NODES
from radixlm.server.state import ServerSettings

KEY = {"Authorization": "Bearer k"}


class TreeEngine(FakeEngine):
    """The fake engine with a real radix tree behind `radix_tree_view`."""

    def __init__(self, cache: RadixCache) -> None:
        super().__init__()
        self.cache = cache

    def radix_tree_view(self, max_nodes: int = 256, max_ids: int = 16,
                        timeout: float = 10.0) -> Any:
        return self.cache.view(max_nodes, max_ids)


def wide_tree(leaves: int = 300, shared: str = "You are a helpful assistant. ") -> RadixCache:
    """A shared prefix (as characters: the fake tokenizer's ids are code points) with
    `leaves` branches of 37 tokens each, told apart by their first; most of them CJK (3
    UTF-8 bytes each)."""
    cache = RadixCache(lambda slots: None)
    head = [ord(c) for c in shared]
    slot = 0
    for i in range(leaves):
        tail = [0x100 + i] + [ord(c) for c in " question"] + [0x4E2D] * 20 + [0x6587] * 7
        ids = head + tail
        cache.insert(ids, list(range(slot, slot + len(ids))))
        slot += len(ids)
    return cache


def test_page_and_assets_need_no_key_but_the_tree_does() -> None:
    client = TestClient(create_app(TreeEngine(wide_tree(3)), ServerSettings(api_key="k")))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for testid in ("prompt", "send", "schema", "radix-tree", "metrics", "api-key", "regex"):
        assert f'data-testid="{testid}"' in page.text, testid
    assert "http://" not in page.text and "https://" not in page.text  # nothing off-host
    js = client.get("/playground/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "innerHTML" not in js.text and "Authorization" in js.text
    assert client.get("/playground/app.css").headers["content-type"].startswith("text/css")
    assert client.get("/playground/secrets.txt").status_code == 401  # not an open path
    assert client.get("/playground/secrets.txt", headers=KEY).status_code == 404
    refused = client.get("/radix_tree")
    assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
    assert client.get("/radix_tree", headers={"Authorization": "Bearer no"}).status_code == 401
    ok = client.get("/radix_tree", headers=KEY)
    assert ok.status_code == 200 and ok.json()["num_nodes"] == 4


def test_tree_shows_counts_and_ids_and_no_text_by_default() -> None:
    cache = wide_tree(3)
    client = TestClient(create_app(TreeEngine(cache)))
    body = client.get("/radix_tree").json()
    assert body["enabled"] and not body["show_text"] and not body["truncated"]
    assert body["num_nodes"] == 4 and body["returned"] == 5
    assert body["total_tokens"] == cache.total_size and body["cache_hit_rate"] == 0.25
    root, shared, *leaves = body["nodes"]
    assert root["parent"] is None and shared["parent"] == root["id"]
    prefix = "You are a helpful assistant. "
    assert shared["tokens"] == shared["prefix_len"] == len(prefix) and shared["children"] == 3
    assert shared["ids"] == [ord(c) for c in prefix[:16]]
    assert [leaf["tokens"] for leaf in leaves] == [37] * 3
    assert sorted(leaf["ids"][0] for leaf in leaves) == [0x100, 0x101, 0x102]
    assert all(n["parent"] == shared["id"] and n["tier"] == "device" for n in leaves)
    assert all("text" not in n for n in body["nodes"])
    assert all(not n["locked"] and n["evictable"] for n in body["nodes"][1:])


def test_tree_is_bounded_in_nodes_and_bytes() -> None:
    client = TestClient(create_app(TreeEngine(wide_tree(300)),
                                   ServerSettings(radix_tree_max_bytes=64 * 1024)))
    by_nodes = client.get("/radix_tree", params={"max_nodes": 10}).json()
    assert by_nodes["returned"] == len(by_nodes["nodes"]) == 10
    assert by_nodes["truncated"] and by_nodes["truncated_by"] == "max_nodes"
    assert by_nodes["num_nodes"] == 301
    default = TestClient(create_app(TreeEngine(wide_tree(300)))).get("/radix_tree").json()
    assert len(default["nodes"]) == 256 and default["truncated_by"] == "max_nodes"
    for cap in (1024, 5000, 20_000):
        r = client.get("/radix_tree", params={"max_nodes": MAX_NODES, "max_bytes": cap})
        assert r.status_code == 200 and len(r.content) <= cap
        body = r.json()
        assert body["truncated_by"] == "max_bytes" and body["returned"] == len(body["nodes"])
        ids = {n["id"] for n in body["nodes"]}
        assert all(n["parent"] is None or n["parent"] in ids for n in body["nodes"])
        assert len(r.content) > cap - 400  # filled up to about one node's size
    whole = client.get("/radix_tree", params={"max_nodes": 400}).content
    assert len(whole) <= 64 * 1024  # the server's cap is the default bound
    for params, name in [({"max_nodes": 0}, "max_nodes"), ({"max_nodes": MAX_NODES + 1},
                         "max_nodes"), ({"max_bytes": 1000}, "max_bytes"),
                         ({"max_bytes": 64 * 1024 + 1}, "max_bytes")]:
        bad = client.get("/radix_tree", params=params)
        assert bad.status_code == 400 and name in bad.json()["error"]["message"], params
    assert client.get("/radix_tree", params={"max_nodes": "many"}).status_code == 400


def test_text_only_when_allowed_and_asked_from_loopback() -> None:
    cache = wide_tree(2)
    app = create_app(TreeEngine(cache), ServerSettings(playground_show_text=True))
    with ThreadServer(app) as server:
        body = httpx.get(server.base_url + "/radix_tree").json()
    assert body["show_text"]
    shared, *leaves = body["nodes"][1:]
    assert shared["text"] == "You are a helpful assistant. "
    assert sorted(n["text"] for n in leaves) == [chr(0x100 + i) + " question" + "中" * 20
                                                 + "文" * 7 for i in range(2)]
    # the same server seen from a client that is not on loopback: no text
    remote = TestClient(app).get("/radix_tree").json()  # TestClient's client is "testclient"
    assert not remote["show_text"] and all("text" not in n for n in remote["nodes"])


def test_show_text_needs_a_keyless_loopback_server() -> None:
    with pytest.raises(ValueError, match="playground-show-text"):
        ServerSettings(playground_show_text=True, api_key="k")
    with pytest.raises(ValueError, match="loopback"):
        ServerSettings(playground_show_text=True, host="0.0.0.0")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert ServerSettings(playground_show_text=True, host=host).playground_show_text
    assert cli_main(["serve", "--host", "0.0.0.0", "--playground-show-text"]) == 2
    assert cli_main(["serve", "--api-key", "k", "--playground-show-text"]) == 2


def test_an_engine_without_a_tree_view_is_501() -> None:
    r = TestClient(create_app(FakeEngine())).get("/radix_tree")
    assert r.status_code == 501 and "radix tree" in r.json()["error"]["message"]


def test_real_server_tree_grows_and_a_second_request_reuses_the_first(real_server,
                                                                       tokenizer) -> None:
    url = real_server.url
    assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200
    empty = httpx.get(url + "/radix_tree", timeout=60).json()
    assert empty["num_nodes"] == 0 and len(empty["nodes"]) == 1
    system = {"role": "system", "content": "You answer in one short sentence."}
    first = [system, {"role": "user", "content": "Name a colour of the sky."}]

    def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
        r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "model": "m", "messages": messages, "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()

    chat(first)
    one = httpx.get(url + "/radix_tree", timeout=60).json()
    ids = tokenizer.apply_chat_template(first, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    chain = one["nodes"][1:]  # one path: the prompt (inserted by prefill), then the answer
    assert [n["parent"] for n in chain] == [n["id"] for n in one["nodes"][:-1]]
    assert chain[0]["ids"] == list(ids[:min(16, chain[0]["tokens"])])
    assert chain[-1]["prefix_len"] >= len(ids) and one["total_tokens"] == chain[-1]["prefix_len"]
    assert all(n["hits"] == 0 and not n["locked"] and "text" not in n for n in chain)
    second = chat([system, {"role": "user", "content": "Name a colour of grass."}])
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 10  # the system prompt and the template's head
    two = httpx.get(url + "/radix_tree", timeout=60).json()
    # the path the second request reused, split where the two part
    shared = max((n for n in two["nodes"] if n["hits"] >= 1), key=lambda n: n["prefix_len"])
    assert shared["prefix_len"] == cached and shared["children"] == 2
    assert two["num_nodes"] > one["num_nodes"]
    assert two["cache_hit_rate"] > 0 and json.dumps(two).count('"text"') == 0
