"""Tensor parallelism over torch.distributed (gloo on CPU, NCCL on CUDA).

`sharding` says which slice of each weight a rank holds (applied to the state dict at load
time); `group` is the process group as the model and the runner see it (the collectives,
the step broadcast, forming the group and stopping the other ranks); `worker` starts the
other ranks and is the loop each of them runs. The scheduler, radix cache, grammars and
sampler stay on rank 0.
"""

from radixlm.runtime.parallel.group import TPGroup, TPGroupError
from radixlm.runtime.parallel.sharding import check_tp_size, local_hf_config, shard_state_dict
from radixlm.runtime.parallel.worker import start_group

__all__ = ["TPGroup", "TPGroupError", "check_tp_size", "local_hf_config", "shard_state_dict",
           "start_group"]
