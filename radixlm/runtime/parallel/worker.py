"""The loop of a tensor-parallel rank other than 0: receive the step plan rank 0
broadcasts, run the same forward on this rank's shard, repeat until told to stop."""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback

logger = logging.getLogger(__name__)


def run_worker(rank: int, size: int, addr: str, port: int, config, model_dir) -> None:
    """Entry point of a spawned rank. `config` is this node's own (it picks the device);
    the engine settings every rank uses come from rank 0 once the group is formed. Exits 0
    on rank 0's stop, 1 on any error (rank 0 then sees its collectives fail and marks the
    group failed)."""
    from radixlm import envs

    envs.configure_openmp()
    envs.configure_malloc()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides when the group ends
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s tp{rank} %(name)s: %(message)s")
    try:
        import torch

        from radixlm.runtime.model_runner import ModelRunner, pick_device_dtype
        from radixlm.runtime.parallel.group import TPGroup, init_process_group

        device, _ = pick_device_dtype(config)
        if device.type == "cuda":
            torch.cuda.set_device(rank % config.tp_per_node)  # this node's device of the rank
        init_process_group(device, rank, size, addr, port)
        group = TPGroup(rank, size)
        engine_config, context_len = group.recv_plan()  # rank 0's settings (same KV pool)
        if engine_config.tp_size != size:
            raise ValueError(f"node 0 runs tp_size={engine_config.tp_size}, this node "
                             f"tp_size={size}")
        runner = ModelRunner(engine_config, model_dir, context_len, tp=group)
        while (plan := group.recv_plan()) is not None:
            runner.run_plan(plan)
    except BaseException:  # noqa: BLE001 - report, then die: rank 0 must see it
        logger.error("tensor-parallel rank %d failed:\n%s", rank, traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # no atexit/destructor work: rank 0 tears the group down
