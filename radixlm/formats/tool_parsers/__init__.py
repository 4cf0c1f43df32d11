"""Tool-call formats by model family, behind one interface (``base.ToolCallParser``), under
SGLang's ``--tool-call-parser`` names: ``qwen25`` / ``hermes``, ``llama3``, ``mistral``,
``pythonic``, ``deepseekv3``. Plain Python (no torch, no grammar engine): the server and the
frontend both use it.

Which format a model speaks (``resolve_parser``): the ``tool_call_parser`` setting, else
the one its chat template shows (``detect_parser``), else ``qwen25``'s (the generic
``<tool_call>`` form, what ChatML models and unknown templates get).
"""

from __future__ import annotations

from radixlm.formats.tool_parsers.base import ToolCallParser
from radixlm.formats.tool_parsers.deepseekv3 import DeepSeekV3Parser
from radixlm.formats.tool_parsers.hermes import HermesParser, NousHermesParser
from radixlm.formats.tool_parsers.llama3 import Llama3Parser
from radixlm.formats.tool_parsers.mistral import MistralParser
from radixlm.formats.tool_parsers.pythonic import PythonicParser
from radixlm.formats.tool_parsers.setup import ToolSetup, parse_tools
from radixlm.formats.tool_parsers.stream import ToolCallStream

PARSERS: dict[str, type[ToolCallParser]] = {
    "qwen25": HermesParser, "hermes": NousHermesParser, "llama3": Llama3Parser,
    "mistral": MistralParser, "pythonic": PythonicParser, "deepseekv3": DeepSeekV3Parser,
}
TOOL_CALL_PARSERS = tuple(PARSERS)
DEFAULT_PARSER = "qwen25"

# (what the template holds, the format): the first that matches wins. Tool-call markers
# first, then a family's turn markers (a template without a tools branch still tells the
# family, whose documented format is then used).
_TEMPLATE_SIGNS: tuple[tuple[str, str], ...] = (
    ("<｜tool▁calls▁begin｜>", "deepseekv3"),
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "qwen25"),
    ("[func_name1(", "pythonic"),  # the pythonic templates' instruction (Llama 3.2 / 4)
    ("<|python_tag|>", "llama3"),
    ("<|start_header_id|>", "llama3"),
    ("<|im_start|>", "qwen25"),
)


def check_parser_name(name: str | None) -> None:
    """ValueError naming the choices unless ``name`` is a parser (or None: automatic)."""
    if name is not None and name not in PARSERS:
        raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)} "
                         f"(or unset: picked from the chat template), got {name!r}")


def get_parser(name: str) -> ToolCallParser:
    """The parser called ``name``; ValueError listing the choices otherwise."""
    check_parser_name(name)
    return PARSERS[name]()


def detect_parser(template: str | None) -> str | None:
    """The format a chat template's source shows, or None if it shows none of them."""
    for sign, name in _TEMPLATE_SIGNS:
        if sign in (template or ""):
            return name
    return None


def resolve_parser(name: str | None, template: str | None) -> ToolCallParser:
    """``name``'s parser; without one, the template's (``detect_parser``), else qwen25's."""
    return get_parser(name or detect_parser(template) or DEFAULT_PARSER)


__all__ = ["DEFAULT_PARSER", "PARSERS", "TOOL_CALL_PARSERS", "ToolCallParser",
           "ToolCallStream", "ToolSetup", "check_parser_name", "detect_parser", "get_parser",
           "parse_tools", "resolve_parser"]
