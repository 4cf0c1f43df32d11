"""The scheduler: one thread that batches requests continuously, composed of parts.

- `scheduler`: the thread, its API for other threads, the loop and one step;
- `state`: the queues and counters the parts share;
- `inbox`: messages from other threads to the scheduler thread;
- `admission`: intake, grammar polling and the choice of an EXTEND step;
- `retraction`: decode slot allocation and priority preemption (retracting requests);
- `speculation`: drafts verified in a step, the step's model call, what verification
  leaves behind;
- `postprocess`: a step's results (tokens, stops, grammar, jump-forward, streaming) and
  the end of a request.
"""

from radixlm.runtime.scheduler.admission import NEW_TOKEN_RATIO
from radixlm.runtime.scheduler.postprocess import DECODE_INSERT_INTERVAL
from radixlm.runtime.scheduler.scheduler import Scheduler

__all__ = ["DECODE_INSERT_INTERVAL", "NEW_TOKEN_RATIO", "Scheduler"]
