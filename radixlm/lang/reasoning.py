"""`separate_reasoning`: split a reasoning model's thinking from its answer.

The model types, their markers and the split are the server's reasoning parsers
(``radixlm.constraints.reasoning``, SGLang's ``--reasoning-parser`` names). A program's
variables get both parts stripped of surrounding whitespace (the answer is what the chat
history keeps); without an end marker all of the text is reasoning (cut off while thinking).
"""

from __future__ import annotations

from radixlm.constraints.reasoning import FORMATS, ReasoningFormat, get_format
from radixlm.constraints.reasoning import split_reasoning as _split

__all__ = ["FORMATS", "ReasoningFormat", "check_model_type", "reasoning_var", "split_reasoning"]


def check_model_type(model_type: str | None) -> ReasoningFormat:
    """The format of ``model_type``; ValueError naming the known ones otherwise."""
    try:
        return get_format(model_type, what="model_type")
    except ValueError as e:
        raise ValueError(f"separate_reasoning: {e}") from None


def split_reasoning(text: str, model_type: str) -> tuple[str, str]:
    """(reasoning, answer) of ``text`` under ``model_type``'s format, each stripped."""
    reasoning, answer = _split(text, check_model_type(model_type))
    return (reasoning or "").strip(), answer.strip()


def reasoning_var(name: str | None) -> str:
    """The variable that receives the reasoning of variable ``name``."""
    if not name:
        raise ValueError("separate_reasoning: the gen/select needs a name")
    return f"{name}_reasoning_content"
