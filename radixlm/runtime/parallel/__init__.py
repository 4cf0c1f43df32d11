"""Tensor parallelism over torch.distributed (gloo on CPU, NCCL on CUDA).

`sharding` says which slice of each weight a rank holds (applied to the state dict at load
time); `group` is the process group as the model and the runner see it (the collectives,
the step broadcast, starting and stopping the other ranks); `worker` is the loop a
non-zero rank runs. The scheduler, radix cache, grammars and sampler stay on rank 0.
"""

from radixlm.runtime.parallel.group import TPGroup, TPGroupError
from radixlm.runtime.parallel.sharding import check_tp_size, local_hf_config, shard_state_dict

__all__ = ["TPGroup", "TPGroupError", "check_tp_size", "local_hf_config", "shard_state_dict"]
