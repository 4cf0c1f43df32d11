"""A node other than 0 of a multi-host tensor-parallel group (`radixlm serve --nnodes N
--node-rank r`, r > 0): it runs only its own ranks, ``r * tp_per_node ..
(r + 1) * tp_per_node - 1``, which join node 0's rendezvous and then follow rank 0's step
broadcasts. It serves no HTTP (node 0 does, as in SGLang).

Lifetime: the node ends when its ranks end. Node 0 stopping the group makes them exit 0
(the node returns 0); node 0 dying, or one of this node's ranks failing, makes them exit
with an error (the node kills the rest and returns 1). SIGTERM/SIGINT kill the ranks, which
node 0 then sees as a failed group; so does the node process dying (its ranks die with it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import torch.multiprocessing as mp

from radixlm.runtime.config import EngineConfig

logger = logging.getLogger(__name__)


def node_ranks(config: EngineConfig) -> range:
    """The tensor-parallel ranks node `config.node_rank` runs."""
    per = config.tp_per_node
    return range(config.node_rank * per, (config.node_rank + 1) * per)


def _rank_main(parent_pid: int, *worker_args) -> None:
    """A rank of this node: dies with the node process (Linux), then `run_worker` (with
    the `ModelRunner` class to build)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the node died before prctl took effect
            os._exit(1)
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.parallel.worker import run_worker

    run_worker(*worker_args, ModelRunner)


def run_node(config: EngineConfig) -> int:
    """Run this node's ranks until they end or a signal arrives; return the exit code.
    Bad settings raise ValueError before any process starts."""
    from radixlm.runtime.device import pick_device_dtype
    from radixlm.runtime.parallel.sharding import check_tp_size
    from radixlm.runtime.weights import load_hf_config, resolve_model

    if config.node_rank < 1:
        raise ValueError("run_node is for node_rank >= 1; node 0 runs the Engine")
    model_dir = resolve_model(config.model)
    device, _ = pick_device_dtype(config)
    check_tp_size(load_hf_config(model_dir), config.tp_size, device.type, nnodes=config.nnodes)
    addr, port = config.rendezvous  # set: EngineConfig refuses nnodes > 1 without one
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(os.getpid(), r, config.tp_size, addr, port,
                                                  config, model_dir), name=f"radixlm-tp{r}")
             for r in node_ranks(config)]
    stopping: list[int] = []
    old = {s: signal.signal(s, lambda sig, _f: stopping.append(sig))
           for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in procs:
            p.start()
        logger.info("node %d/%d: tensor-parallel ranks %s (pids %s) joining %s:%d; serving "
                    "no HTTP (node 0 does)", config.node_rank, config.nnodes,
                    list(node_ranks(config)), [p.pid for p in procs], addr, port)
        while not stopping:
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                logger.error("node %d: rank process %s exited with code %s; stopping the "
                             "node", config.node_rank, failed[0].name, failed[0].exitcode)
                return 1
            if all(p.exitcode == 0 for p in procs):
                logger.info("node %d: node 0 stopped the group", config.node_rank)
                return 0
            time.sleep(0.2)
        logger.info("node %d: signal %s, killing its ranks", config.node_rank, stopping[0])
        return 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=10)
        for s, h in old.items():
            signal.signal(s, h)
