"""The drafter interface the speculative step talks to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixlm.runtime.request import Req


class Drafter(Protocol):
    def propose(self, req: Req, max_tokens: int) -> list[int]:
        """Up to max_tokens draft token ids continuing req.input_ids + req.output_ids
        (empty: no draft this step). Plain Python, no torch; must not mutate req."""

    def observe(self, req: Req, num_drafted: int, num_accepted: int) -> None:
        """After a verification: how many of the proposed tokens the model accepted."""

    def release(self, req: Req) -> None:
        """The request finished or was aborted: drop its state."""
