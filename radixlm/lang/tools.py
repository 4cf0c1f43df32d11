"""Tool use from programs: ``gen("call", tools=[...], tool_choice=...)``.

The backend says which tool-call format its model speaks (``Backend.tool_parser``: the
server's ``--tool-call-parser``, else the one its chat template shows) and tokenizes the
format's markers; the gen then runs with that format's grammar (``ebnf``, the same Lark the
OpenAI API uses: "required" / named, the output is calls with arguments valid under each
function's ``parameters``; "auto", free text in which the format's marker starts calls), and
its text is parsed into OpenAI ``tool_calls`` in ``<name>_tool_calls``. The variable
``<name>`` keeps the text as generated, so the program's prompt goes on with it. The prompt
is the program's: describe the tools in it (a system message) as the model expects.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from radixlm.formats.tool_parsers import get_parser, parse_tools
from radixlm.formats.tool_parsers.grammar import check_functions, token_lookup, tool_sampling
from radixlm.formats.tool_parsers.setup import ToolSetup


def tool_calls_var(name: str | None) -> str:
    """The variable that receives the parsed calls of gen ``name``."""
    if not name:
        raise ValueError("gen(tools=...) needs a name (its calls go to <name>_tool_calls)")
    return f"{name}_tool_calls"


def check_tool_fields(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> None:
    """The checks of the OpenAI API on the fields, where the program is written (the
    format's own checks come when the gen runs); ValueError naming the problem."""
    try:
        parse_tools(tools, tool_choice, parallel_tool_calls, get_parser("qwen25"))
    except ValueError as exc:
        raise ValueError(f"gen: {exc}") from None


def tool_params(backend: Any, params: Any) -> tuple[Any, ToolSetup | None]:
    """``params`` (GenArgs) with the tool fields turned into the backend format's grammar,
    and the setup that parses the output (None with no tools or tool_choice "none")."""
    setup = parse_tools(params.tools, params.tool_choice, params.parallel_tool_calls,
                        backend.tool_parser())
    plain = dataclasses.replace(params, tools=None, tool_choice=None, parallel_tool_calls=None)
    if setup is None or not setup.active:
        return plain, None
    check_functions(setup, backend.check_grammar)
    sampling = tool_sampling(setup, token_lookup(backend.token_ids))
    skip = params.skip_special_tokens
    return dataclasses.replace(plain, ebnf=sampling["ebnf"], skip_special_tokens=(
        skip if skip is not None else sampling.get("skip_special_tokens"))), setup


def parse_calls(setup: ToolSetup | None, value: Any) -> Any:
    """The calls of a gen's value (a list of call lists for ``n`` samples)."""
    if isinstance(value, list):
        return [parse_calls(setup, v) for v in value]
    return [] if setup is None else setup.parse(value)[1]
