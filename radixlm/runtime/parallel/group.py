"""The tensor-parallel process group as one rank sees it.

Rank 0 (the engine's process) spawns its node's other ranks (`worker.start_group`:
torch.multiprocessing spawn; a free local port unless a rendezvous address is configured),
then `TPGroup.form` joins the group with them (and with the ranks other nodes start, see
`node.py`) and sends every rank the engine settings. Every step rank 0 broadcasts the
step's plan (plain Python, see `ModelRunner.run_plan`); all ranks then run the same
forward, whose collectives are `all_reduce` (after the row-parallel o/down projections and
the vocab-parallel embedding) and `gather_logits`.

Failure contract: once any collective on rank 0 raises, or a worker process is found dead,
the group is *failed*: the workers are killed, `error` says why, and every later step
raises `TPGroupError` at once (never a hang on a missing peer). Collectives also time out
after ``RADIXLM_TP_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from radixlm import envs

if TYPE_CHECKING:
    from radixlm.runtime.config import EngineConfig

logger = logging.getLogger(__name__)


class TPGroupError(RuntimeError):
    """The tensor-parallel group has failed (a rank died or a collective raised)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(device: torch.device, rank: int, size: int, addr: str, port: int) -> None:
    """Join the group of `size` ranks rendezvousing on `addr`:`port` (rank 0 listens there)."""
    dist.init_process_group(backend_for(device), init_method=f"tcp://{addr}:{port}",
                            rank=rank, world_size=size,
                            timeout=timedelta(seconds=envs.tp_timeout_s()))


class TPGroup:
    """Collectives for the model, the step broadcast, and (on rank 0) the worker processes."""

    def __init__(self, rank: int, size: int, procs: list | None = None) -> None:
        self.rank, self.size = rank, size
        self.vocab_size = 0  # the full vocabulary; set when the weights are sharded
        self.procs = procs or []  # rank 0: the worker processes of ranks 1..size-1
        self.error: str | None = None
        # enable_deterministic_inference: sums over the ranks in rank order (set by the
        # runner); 2 ranks' a + b is one rounding in either order already
        self.fixed_order = False

    # ------------------------------------------------------------------ rank 0 lifecycle
    @classmethod
    def form(cls, config: EngineConfig, device: torch.device, context_len: int, procs: list,
             rendezvous: tuple[str, int]) -> TPGroup:
        """Rank 0, once this node's other ranks are spawned (``procs``, see
        `worker.start_group`): join the group on ``rendezvous`` (waiting for the other
        nodes' ranks when ``config.nnodes > 1``) and send every rank the engine settings
        (`config` with the KV pool size fixed, `context_len`) so that all ranks build the
        same pool."""
        size = config.tp_size
        addr, port = rendezvous
        group = cls(0, size, procs)
        if config.nnodes > 1:
            logger.info("tensor parallel over %d nodes: waiting on %s:%d for ranks %d..%d of "
                        "nodes 1..%d", config.nnodes, addr, port, config.tp_per_node, size - 1,
                        config.nnodes - 1)
        # rendezvous in a thread so that a worker dying before it joins ends the wait
        failure: list[BaseException] = []

        def join() -> None:
            try:
                init_process_group(device, 0, size, addr, port)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)

        joiner = threading.Thread(target=join, name="radixlm-tp-rendezvous", daemon=True)
        joiner.start()
        while joiner.is_alive() and group.poll() is None:
            joiner.join(0.1)
        if not failure and group.error is None:
            try:
                group.broadcast_plan((config, context_len))
            except Exception as exc:  # noqa: BLE001 - a rank died right after joining
                failure.append(exc)
        if failure or group.error is not None:
            group.fail(f"cannot form the tensor-parallel group: {failure[0] if failure else ''}")
            raise TPGroupError(group.error)
        logger.info("tensor parallel: %d ranks (%s), local workers %s", size,
                    backend_for(device), [p.pid for p in procs])
        return group

    def poll(self) -> str | None:
        """Rank 0: the failure, if any (checks that every worker process is alive)."""
        if self.error is None:
            for rank, p in enumerate(self.procs, start=1):
                if not p.is_alive():
                    self.fail(f"tensor-parallel rank {rank} (pid {p.pid}) exited with code "
                              f"{p.exitcode}")
                    break
        return self.error

    def diagnose(self, wait_s: float = 2.0) -> str | None:
        """Rank 0, after a collective raised: give a worker that is dying up to `wait_s`
        to be seen dead (the peer's socket closes before its exit is reaped), so the
        failure names it."""
        deadline = time.monotonic() + wait_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.error

    def check(self) -> None:
        """Raise TPGroupError if the group has failed."""
        if self.poll() is not None:
            raise TPGroupError(self.error)

    def fail(self, reason: str) -> None:
        """Mark the group failed and kill the workers (they may be stuck in a collective)."""
        if self.error is None:
            self.error = reason
            logger.error("tensor-parallel group failed: %s", reason)
        self._kill()

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=10)

    def shutdown(self) -> None:
        """Rank 0: tell the workers to exit, wait for them, leave the group. Idempotent."""
        if self.error is None and self.size > 1 and dist.is_initialized():
            # the stop message in a thread: a worker stuck elsewhere must not hold us for
            # the collective timeout (it is killed below instead)
            stop = threading.Thread(target=self._send_stop, daemon=True)
            stop.start()
            stop.join(timeout=10)
            for p in self.procs:
                p.join(timeout=15)
        self.error = self.error or "shut down"
        self._kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.procs = []

    def barrier(self) -> None:
        """Every rank: wait until all ranks get here (rank 0: a rank that died on the way
        makes this raise TPGroupError and fails the group)."""
        if self.rank != 0:
            dist.barrier()
            return
        try:
            self.check()
            dist.barrier()
        except Exception as exc:
            self.fail(self.error or f"a tensor-parallel rank failed to start: {exc}")
            raise TPGroupError(self.error) from exc

    def _send_stop(self) -> None:
        try:
            self.broadcast_plan(None)
        except Exception as exc:  # noqa: BLE001 - a worker already gone
            logger.warning("tensor-parallel shutdown: %s", exc)

    # ------------------------------------------------------------------ step traffic
    def broadcast_plan(self, plan: Any) -> None:
        """Rank 0: send this step's plan (None: stop) to every rank."""
        dist.broadcast_object_list([plan], src=0)

    def recv_plan(self) -> Any:
        """Ranks > 0: the plan rank 0 broadcast (None: stop)."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ------------------------------------------------------------------ model collectives
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks (in place). With ``fixed_order`` and more than 2 ranks
        every element is summed rank 0 first, then 1, 2, ... (the ranks' shares gathered),
        not in the ring's order, which depends on where its chunk boundaries fall."""
        if not self.fixed_order or self.size <= 2:
            dist.all_reduce(x)
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        total = parts[0]
        for part in parts[1:]:
            total += part
        return x.copy_(total)

    def embed(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: this rank holds rows [rank*n, (rank+1)*n) of the
        table; ids outside them contribute zeros, and the sum over ranks is the lookup."""
        per = weight.shape[0]
        local = ids - self.rank * per
        outside = (local < 0) | (local >= per)
        h = F.embedding(local.masked_fill(outside, 0), weight)
        h.masked_fill_(outside[:, None], 0)
        return self.all_reduce(h)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel head: the ranks' column blocks side by side, padding trimmed."""
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous())
        return torch.cat(parts, dim=-1)[:, :self.vocab_size]
