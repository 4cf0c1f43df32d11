"""Frontend backends: in-process `Runtime`, HTTP `RuntimeEndpoint`, `OpenAI`-compatible."""

from radixlm.lang.backend.base import Backend, BackendError, ChoiceScores, Prompt

__all__ = ["Backend", "BackendError", "ChoiceScores", "Prompt"]
