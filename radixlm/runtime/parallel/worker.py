"""The tensor-parallel ranks other than 0: how rank 0 starts them, and the loop each runs.

Rank 0 spawns its node's other ranks (`start_group`) and forms the group with them; every
other rank (spawned here, or by another node, see `node.py`) runs `run_worker`: receive the
step plan rank 0 broadcasts, run the same forward on this rank's shard, repeat until told
to stop. The model runner class comes in as an argument (the runner passes itself), so
this package never imports the runner that uses it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback

import torch
import torch.multiprocessing as mp

from radixlm import envs
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.device import pick_device_dtype
from radixlm.runtime.parallel.group import TPGroup, free_port, init_process_group

logger = logging.getLogger(__name__)


def start_group(config: EngineConfig, device: torch.device, model_dir, context_len: int,
                runner_cls: type) -> TPGroup:
    """Rank 0: spawn this node's other ranks (1..tp_per_node-1; each runs `run_worker`
    with ``runner_cls``), then form the group with them (`TPGroup.form`)."""
    size = config.tp_size
    addr, port = config.rendezvous or ("127.0.0.1", free_port())
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_worker,
                         args=(r, size, addr, port, config, model_dir, runner_cls),
                         name=f"radixlm-tp{r}", daemon=True)
             for r in range(1, config.tp_per_node)]
    for p in procs:
        p.start()
    return TPGroup.form(config, device, context_len, procs, (addr, port))


def run_worker(rank: int, size: int, addr: str, port: int, config: EngineConfig, model_dir,
               runner_cls: type) -> None:
    """Entry point of a rank > 0. `config` is this node's own (it picks the device); the
    engine settings every rank uses come from rank 0 once the group is formed; the rank
    builds ``runner_cls(settings, model_dir, context_len, tp=group)`` (the `ModelRunner`)
    and runs its ``run_plan`` on every plan. Exits 0 on rank 0's stop, 1 on any error
    (rank 0 then sees its collectives fail and marks the group failed)."""
    envs.configure_openmp()
    envs.configure_malloc()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides when the group ends
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s tp{rank} %(name)s: %(message)s")
    try:
        device, _ = pick_device_dtype(config)
        if device.type == "cuda":
            torch.cuda.set_device(rank % config.tp_per_node)  # this node's device of the rank
        init_process_group(device, rank, size, addr, port)
        group = TPGroup(rank, size)
        engine_config, context_len = group.recv_plan()  # rank 0's settings (same KV pool)
        if engine_config.tp_size != size:
            raise ValueError(f"node 0 runs tp_size={engine_config.tp_size}, this node "
                             f"tp_size={size}")
        runner = runner_cls(engine_config, model_dir, context_len, tp=group)
        while (plan := group.recv_plan()) is not None:
            runner.run_plan(plan)
    except BaseException:  # noqa: BLE001 - report, then die: rank 0 must see it
        logger.error("tensor-parallel rank %d failed:\n%s", rank, traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # no atexit/destructor work: rank 0 tears the group down
