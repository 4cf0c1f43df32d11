"""`separate_reasoning`: split a reasoning model's thinking from its answer.

Model types and their markers follow SGLang's reasoning parsers. Rules (SGLang's
non-streaming parse): the text is reasoning if it holds the start marker, or always for
models that may omit it (`forced`); markers are removed and the text stripped; without an
end marker all of it is reasoning (cut off while thinking); otherwise reasoning is what
precedes the end marker and the answer what follows it (stripped).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    forced: bool  # the model starts inside its reasoning (the template opened it)


FORMATS = {
    "deepseek-r1": ReasoningFormat("<think>", "</think>", forced=True),
    "deepseek-v3": ReasoningFormat("<think>", "</think>", forced=False),
    "qwen3": ReasoningFormat("<think>", "</think>", forced=False),
    "qwen3-thinking": ReasoningFormat("<think>", "</think>", forced=True),
    "glm45": ReasoningFormat("<think>", "</think>", forced=False),
    "step3": ReasoningFormat("<think>", "</think>", forced=True),
    "kimi": ReasoningFormat("\u25c1think\u25b7", "\u25c1/think\u25b7", forced=False),
}


def check_model_type(model_type: str | None) -> ReasoningFormat:
    """The format of ``model_type``; ValueError naming the known ones otherwise."""
    if model_type not in FORMATS:
        raise ValueError(f"separate_reasoning: unknown model_type {model_type!r}; known: "
                         f"{', '.join(sorted(FORMATS))}")
    return FORMATS[model_type]


def split_reasoning(text: str, model_type: str) -> tuple[str, str]:
    """(reasoning, answer) of ``text`` under ``model_type``'s format."""
    fmt = check_model_type(model_type)
    if not fmt.forced and fmt.start not in text:
        return "", text
    body = text.replace(fmt.start, "").strip()
    if fmt.end not in body:
        return body, ""
    reasoning, answer = body.split(fmt.end, 1)
    return reasoning, answer.strip()


def reasoning_var(name: str | None) -> str:
    """The variable that receives the reasoning of variable ``name``."""
    if not name:
        raise ValueError("separate_reasoning: the gen/select needs a name")
    return f"{name}_reasoning_content"
