"""Multi-host tensor parallel (`--nnodes`, `--node-rank`, `--dist-init-addr`), on loopback:
bad node settings refused before any process starts; where the ranks meet (the flag, else
torch.distributed's MASTER_ADDR/MASTER_PORT); then two real `radixlm serve` processes as
node 0 and node 1 of a tp=2 group (one rank each) on 127.0.0.1: greedy text identical to
the tp=1 engine, node 1 serving no HTTP, node 0 stopping (or dying) ends node 1, and node 1
dying takes its rank with it and makes node 0's request fail with an error and its /health
answer 503. No process is left behind."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from server_fakes import STARTUP_POLL_S, free_port, health_ok, pid_alive, wait_until

from radixlm.cli import main as cli_main
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.parallel.group import backend_for
from radixlm.runtime.parallel.node import node_ranks
from radixlm.runtime.parallel.sharding import check_tp_size

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Q: What is 12 times 12?\nA:"]


@pytest.fixture
def no_master_env(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)


@pytest.mark.parametrize("argv,message", [
    (["--tp", "3", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:5000"],
     "tp_size=3 is not divisible by nnodes=2"),
    (["--tp", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:5000"],
     "node_rank=2 is out of range for nnodes=2"),
    (["--tp", "2", "--nnodes", "2", "--node-rank", "-1", "--dist-init-addr", "h:1"],
     "node_rank=-1 is out of range"),
    (["--tp", "2", "--node-rank", "1"], "node_rank=1 is out of range for nnodes=1"),
    (["--tp", "2", "--nnodes", "2", "--node-rank", "1"],
     "nnodes=2 needs the rendezvous address of node 0"),
    (["--tp", "2", "--nnodes", "2", "--dist-init-addr", "localhost"],
     "dist_init_addr must be HOST:PORT"),
    (["--tp", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:70000"],
     "dist_init_addr must be HOST:PORT with a port in 1..65535"),
    (["--tp", "2", "--nnodes", "0"], "nnodes must be >= 1"),
    (["--dp", "2", "--tp", "2", "--nnodes", "2", "--dist-init-addr", "h:1"],
     "--dp-size > 1 with --nnodes > 1 is not supported"),
])
def test_bad_node_settings_fail_before_any_process(argv, message, capsys, no_master_env) -> None:
    assert cli_main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err
    assert multiprocessing.active_children() == []


def test_an_engine_is_never_built_on_a_node_other_than_0(no_master_env) -> None:
    from radixlm.runtime.engine import Engine

    with pytest.raises(ValueError, match="node_rank=1 runs tensor-parallel ranks only"):
        Engine(tp_size=2, nnodes=2, node_rank=1, dist_init_addr="127.0.0.1:5000",
               log_level="warning")
    assert multiprocessing.active_children() == []


def test_the_rendezvous_is_the_flag_then_torch_env_then_local(monkeypatch, no_master_env) -> None:
    assert EngineConfig(tp_size=2).rendezvous is None  # one host: rank 0 picks a port
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    env = EngineConfig(tp_size=4, nnodes=2)  # the env stands in for --dist-init-addr
    assert env.rendezvous == ("10.0.0.7", 29500)
    flag = EngineConfig(tp_size=4, nnodes=2, dist_init_addr="node0.example:1234")
    assert flag.rendezvous == ("node0.example", 1234)
    assert EngineConfig(dist_init_addr="[fd00::1]:29500").rendezvous == ("fd00::1", 29500)
    monkeypatch.setenv("MASTER_PORT", "not-a-port")
    with pytest.raises(ValueError, match="MASTER_ADDR:MASTER_PORT must be HOST:PORT"):
        EngineConfig(tp_size=4, nnodes=2)


def test_each_node_runs_its_own_block_of_ranks() -> None:
    def ranks(tp: int, nnodes: int, node: int) -> list[int]:
        cfg = EngineConfig(tp_size=tp, nnodes=nnodes, node_rank=node, dist_init_addr="h:1")
        assert cfg.tp_per_node == tp // nnodes
        return list(node_ranks(cfg))

    assert [ranks(4, 2, n) for n in (0, 1)] == [[0, 1], [2, 3]]
    assert [ranks(6, 3, n) for n in (0, 1, 2)] == [[0, 1], [2, 3], [4, 5]]
    assert ranks(2, 2, 1) == [1]


def test_host_limits_count_the_ranks_of_this_node_only(model_dir) -> None:
    from transformers import LlamaConfig

    cores = os.cpu_count() or 1
    big = LlamaConfig(vocab_size=64, hidden_size=4 * 2 * cores, intermediate_size=64 * cores,
                      num_hidden_layers=1, num_attention_heads=2 * cores,
                      num_key_value_heads=2 * cores, head_dim=4)
    with pytest.raises(ValueError, match=f"tp_size={2 * cores} exceeds this host's"):
        check_tp_size(big, 2 * cores, "cpu")
    check_tp_size(big, 2 * cores, "cpu", nnodes=2)  # cores ranks here, cores on the other
    if torch.cuda.device_count() == 0:
        with pytest.raises(ValueError, match=r"\(1 per node over 2 nodes\) needs 1 CUDA"):
            check_tp_size(big, 2, "cuda", nnodes=2)


def test_nccl_on_cuda_gloo_on_cpu() -> None:
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"


# ---------------------------------------------------------------- two nodes on loopback
class TwoNodes:
    """`radixlm serve --tp-size 2 --nnodes 2` as node 0 (HTTP on `url`) and node 1, each
    its own process group, meeting on 127.0.0.1."""

    def __init__(self, tmp: Path, model: Path | None = None) -> None:
        rendezvous, self.port = f"127.0.0.1:{free_port()}", free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        common = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", rendezvous,
                  *(["--model", str(model)] if model is not None else []),
                  "--dtype", "float32", "--context-length", "512", "--max-total-tokens", "2048",
                  "--log-level", "info"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.logs = [tmp / "node0.log", tmp / "node1.log"]
        self.procs: list[subprocess.Popen] = []
        for rank, extra in ((0, ["--port", str(self.port)]), (1, [])):
            with open(self.logs[rank], "w") as out:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "radixlm.cli", "serve", *common, "--node-rank",
                     str(rank), *extra], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                    env=env, start_new_session=True))

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def node1_rank_pids(self) -> list[int]:
        found = re.search(r"ranks \[1\] \(pids \[([\d, ]+)\]\)", self.log(1))
        return [int(p) for p in found.group(1).split(",")] if found else []

    def wait_serving(self) -> None:
        def up() -> bool:
            for rank, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise AssertionError(f"node {rank} exited {p.returncode}:\n"
                                         f"{self.log(rank)[-3000:]}")
            return health_ok(self.url, timeout=2)

        wait_until(up, "node 0 to serve with node 1's rank", limit_s=240,
                   interval=STARTUP_POLL_S)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs] + self.node1_rank_pids()

    def kill_all(self) -> None:
        for pid in self.pids():
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=30)


def _serving(tmp: Path, model: Path | None = None) -> Iterator[TwoNodes]:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("two tensor-parallel nodes need 2 CPU cores")
    nodes = TwoNodes(tmp, model)
    try:
        nodes.wait_serving()
        yield nodes
    finally:
        nodes.kill_all()


@pytest.fixture
def two_nodes(tmp_path) -> Iterator[TwoNodes]:
    """Two nodes on the embedded model (its text compared with tp=1's)."""
    yield from _serving(tmp_path)


@pytest.fixture
def two_tiny_nodes(tmp_path, tiny_model_dir) -> Iterator[TwoNodes]:
    """Two nodes on conftest's tiny random model, for the tests of a node's failure (they
    need a cluster, not its text; it starts in ~2/3 of the embedded model's time)."""
    yield from _serving(tmp_path, tiny_model_dir)


def _generate(url: str, text: str, max_new_tokens: int = 12) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={
        "text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}})
    assert r.status_code == 200, r.text
    return r.json()


def test_two_nodes_match_tp1_and_node0_stopping_ends_node1(two_nodes, engine_fp32) -> None:
    outs = [_generate(two_nodes.url, p) for p in PROMPTS]
    ref = engine_fp32.generate(PROMPTS, {"temperature": 0, "max_new_tokens": 12})
    assert [o["text"] for o in outs] == [r["text"] for r in ref]
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in ref]
    info = httpx.get(two_nodes.url + "/get_server_info").json()
    assert (info["tp_size"], info["dp_size"], info["nnodes"], info["node_rank"]) == (2, 1, 2, 0)
    assert "serving no HTTP" in two_nodes.log(1) and "Uvicorn" not in two_nodes.log(1)
    pids = two_nodes.pids()
    assert len(pids) == 3 and all(pid_alive(p) for p in pids)

    node0, node1 = two_nodes.procs
    node0.send_signal(signal.SIGTERM)
    assert node0.wait(timeout=60) == 0
    assert node1.wait(timeout=60) == 0, two_nodes.log(1)[-2000:]  # told to stop, not crashed
    assert "node 0 stopped the group" in two_nodes.log(1)
    wait_until(lambda: not any(pid_alive(p) for p in pids), "every process to end", limit_s=10)


def test_node1_killed_fails_the_request_on_node0(two_tiny_nodes) -> None:
    two_nodes = two_tiny_nodes
    assert _generate(two_nodes.url, "Hello", 2)["meta_info"]["completion_tokens"] == 2
    (rank_pid,) = two_nodes.node1_rank_pids()
    node0, node1 = two_nodes.procs
    node1.kill()  # no goodbye; its rank dies with it
    node1.wait(timeout=30)
    wait_until(lambda: not pid_alive(rank_pid), "node 1's rank to die with it", limit_s=10)
    start = time.monotonic()
    r = httpx.post(two_nodes.url + "/generate", timeout=120, json={
        "text": "Tell me a story.", "sampling_params": {"max_new_tokens": 8}})
    assert time.monotonic() - start < 60  # an error, never a hang
    assert r.status_code == 500 and "step failed on rank 0" in r.text, r.text
    health = httpx.get(two_nodes.url + "/health", timeout=10)
    assert health.status_code == 503 and "step failed on rank 0" in health.text
    node0.send_signal(signal.SIGTERM)
    node0.wait(timeout=60)
    assert not any(pid_alive(p) for p in two_nodes.pids())


def test_node0_killed_ends_node1(two_tiny_nodes) -> None:
    two_nodes = two_tiny_nodes
    pids = two_nodes.pids()
    node0, node1 = two_nodes.procs
    node0.kill()  # no goodbye: node 1's rank sees the connection close
    node0.wait(timeout=30)
    assert node1.wait(timeout=60) == 1  # its rank failed on the closed connection
    assert "rank process radixlm-tp1 exited with code 1" in two_nodes.log(1)
    wait_until(lambda: not any(pid_alive(p) for p in pids), "node 1's rank to end", limit_s=10)
