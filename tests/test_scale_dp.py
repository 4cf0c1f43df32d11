"""Data parallel end to end: `radixlm serve --dp-size 2` (two real replicas of the default
model behind SGLang's own router, cache-aware policy) on loopback. Checks that both
replicas serve, that a fork program sharing one prefix lands on one replica (its cached
tokens show the sharing), that a dead replica leaves the other serving, and that shutdown
leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from server_fakes import STARTUP_POLL_S, free_port, pid_alive, wait_until

import radixlm as sgl
from radixlm.server.data_parallel import replica_command, router_available

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not router_available(),
                                reason="sglang-router not installed (pip install radixlm[dp])")


def test_replica_command_replaces_port_host_and_dp() -> None:
    argv = ["--model", "m", "--port", "1", "--dp-size", "2", "--host=0.0.0.0",
            "--router-policy", "round_robin", "--tp-size", "2"]
    cmd = replica_command(argv, 4242)
    tail = cmd[cmd.index("serve") + 1:]
    assert tail == ["--model", "m", "--tp-size", "2", "--host", "127.0.0.1", "--port", "4242",
                    "--dp-size", "1"]


class DPServer:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def replicas(self) -> list[tuple[str, int]]:
        """(url, pid) of each replica, from the launcher's log."""
        found = re.findall(r"replica \d+: (http://\S+) \(pid (\d+)\)", self.log.read_text())
        return [(u, int(p)) for u, p in found]

    def router_pid(self) -> int:
        return int(re.search(r"router \(\w+, pid (\d+)\)", self.log.read_text()).group(1))

    def stats(self) -> list[dict]:
        return [httpx.get(u + "/get_server_info", timeout=30).json()["stats"]
                for u, _ in self.replicas()]


@pytest.fixture(scope="module")
def dp() -> Iterator[DPServer]:
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"radixlm-dp-{port}.log"
    cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--dp-size", "2", "--port", str(port),
           "--context-length", "512", "--max-total-tokens", "4096", "--max-running-requests",
           "8", "--log-level", "info"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    server = DPServer(proc, f"http://127.0.0.1:{port}", log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"launcher exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        return "serving with dp_size=2" in log.read_text()

    try:
        wait_until(up, "replicas and router to start", limit_s=300, interval=STARTUP_POLL_S)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        log.unlink(missing_ok=True)


def _generate(url: str, text: str, max_new_tokens: int = 4) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={
        "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                            "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def test_both_replicas_serve(dp: DPServer) -> None:
    assert len(dp.replicas()) == 2
    before = [s["num_requests_total"] for s in dp.stats()]
    # no shared prefix, sent at once: the cache-aware policy falls back to the less loaded
    # replica (equal load ties go to the first, so sequential requests would all go there)
    topics = ["Volcanoes erupt when", "Quantum tunnelling lets", "My grandmother's bread",
              "Penguins huddle together", "Zebra stripes might", "In 1492, sailors"]
    with ThreadPoolExecutor(len(topics)) as pool:
        outs = list(pool.map(lambda t: _generate(dp.url, t, 16), topics))
    assert all(o["meta_info"]["completion_tokens"] == 16 for o in outs)
    served = [s["num_requests_total"] - b for s, b in zip(dp.stats(), before)]
    assert sum(served) == len(topics) and all(n > 0 for n in served), served
    info = httpx.get(dp.replicas()[0][0] + "/get_server_info").json()
    assert info["tp_size"] == 1 and info["dp_size"] == 1  # each replica is one dp rank
    assert "radixlm_tp_size 1.0" in httpx.get(dp.replicas()[0][0] + "/metrics").text


def test_what_the_router_reports_of_tp_and_dp(dp: DPServer) -> None:
    """sglang-router 0.3.x answers /get_server_info itself (its RouterManager never forwards
    it): the replica count is its `workers_count`, and each worker's `tp_size`/`dp_size`
    (read from the replica's /server_info when it registered) are listed under /workers.
    /metrics is not on the router's port; /engine_metrics gathers every replica's /metrics
    with a `worker_addr` label."""
    info = httpx.get(dp.url + "/get_server_info", timeout=30).json()
    assert info["router_manager"] is True and info["workers_count"] == 2
    workers = httpx.get(dp.url + "/workers", timeout=30).json()["workers"]
    urls = sorted(u for u, _ in dp.replicas())
    assert sorted(w["url"] for w in workers) == urls
    for w in workers:
        own = httpx.get(w["url"] + "/get_server_info", timeout=30).json()
        assert (w["metadata"]["tp_size"], w["metadata"]["dp_size"]) == (
            str(own["tp_size"]), str(own["dp_size"])) == ("1", "1")
    assert httpx.get(dp.url + "/metrics", timeout=30).status_code == 404
    metrics = httpx.get(dp.url + "/engine_metrics", timeout=30).text
    for name in ("radixlm_tp_size", "radixlm_dp_size"):
        assert sorted(re.findall(name + r'\{worker_addr="([^"]+)"\} 1(?:\.0)?\n', metrics)) == urls


PREFIX = ("You are a meticulous museum guide. The museum has four wings: ancient Egypt, "
          "Renaissance painting, natural history with dinosaur skeletons, and modern design. "
          "Visitors ask short questions; answer each in one short sentence. ") * 3


@sgl.function
def tour(s):
    s += PREFIX
    forks = s.fork(4)
    forks += lambda i: f"Question {i + 1}: what is in wing {i + 1}? Answer:" + sgl.gen(
        "answer", max_tokens=4, temperature=0)
    forks.join()


def test_fork_program_lands_on_one_replica(dp: DPServer) -> None:
    before = dp.stats()
    state = tour.run(backend=sgl.RuntimeEndpoint(dp.url))
    assert len(state["answer"]) == 4
    after = dp.stats()
    requests = [a["num_requests_total"] - b["num_requests_total"] for a, b in zip(after, before)]
    cached = [a["cached_tokens_total"] - b["cached_tokens_total"] for a, b in zip(after, before)]
    assert sorted(requests)[0] == 0 and sorted(requests)[1] >= 4, requests
    home = requests.index(max(requests))
    tokenized = httpx.post(dp.replicas()[0][0] + "/tokenize", json={"prompt": PREFIX}).json()
    prefix_tokens = len(tokenized["tokens"])
    # every branch after the first reuses the shared prefix on the replica that holds it
    assert cached[home] >= 3 * (prefix_tokens - 4), (cached, prefix_tokens)
    for meta in state.get_meta_info("answer")[1:]:
        assert meta["cached_tokens"] >= prefix_tokens - 4, meta


def test_openai_client_through_the_router(dp: DPServer) -> None:
    import openai

    client = openai.OpenAI(base_url=dp.url + "/v1", api_key="none")
    model = httpx.get(dp.replicas()[0][0] + "/v1/models").json()["data"][0]["id"]
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4,
        temperature=0)
    assert out.choices[0].message.content and out.usage.completion_tokens <= 4


def test_a_dead_replica_leaves_the_other_serving(dp: DPServer) -> None:
    (_, victim), (survivor_url, _) = dp.replicas()
    before = httpx.get(survivor_url + "/get_server_info").json()["stats"]["num_requests_total"]
    os.kill(victim, signal.SIGKILL)
    ok = 0
    deadline = time.monotonic() + 60
    while ok < 3 and time.monotonic() < deadline:
        r = httpx.post(dp.url + "/generate", timeout=60, json={
            "text": f"Count to {ok + 3}:", "sampling_params": {"max_new_tokens": 2}})
        ok += r.status_code == 200  # a request routed to the dead one fails, never hangs
    assert ok == 3
    after = httpx.get(survivor_url + "/get_server_info").json()["stats"]["num_requests_total"]
    assert after - before >= 3


def test_shutdown_leaves_no_process(dp: DPServer) -> None:
    pids = [p for _, p in dp.replicas()] + [dp.router_pid()]
    dp.proc.send_signal(signal.SIGTERM)
    assert dp.proc.wait(timeout=90) == 0
    assert [p for p in pids if pid_alive(p)] == []
    with pytest.raises(httpx.TransportError):
        httpx.get(dp.url + "/health", timeout=5)
