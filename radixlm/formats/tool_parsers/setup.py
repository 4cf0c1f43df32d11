"""A request's tools: the OpenAI fields ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
checked once (``parse_tools``) into a ``ToolSetup`` that knows its format, the functions'
grammar schemas and how to read an output back into OpenAI ``tool_calls``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from radixlm.formats.tool_parsers.base import ToolCallParser
from radixlm.formats.tool_parsers.text import ParsedCall

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# (not inside `not`, `if`, `contains`, `propertyNames`: closing those would change what
# they reject, not what the arguments may hold)
_SUBSCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "then", "else")


@dataclass
class ToolSetup:
    """What a request's tool fields mean for one call, in the server's format ``parser``.

    ``functions``: [{"name", "parameters", "description"?, "strict", "where"}], where
    ``where`` names the entry in errors (``tools[i]``)."""

    functions: list[dict[str, Any]]
    choice: str  # "none" | "auto" | "required" | "named"
    parser: ToolCallParser
    parallel: bool = True
    named: str | None = None
    openai_tools: list[dict[str, Any]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.choice != "none" and bool(self.functions)

    @property
    def whole_output_is_call(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def selected(self) -> list[dict[str, Any]]:
        """The functions the output may call."""
        if self.choice == "named":
            return [f for f in self.functions if f["name"] == self.named]
        return self.functions

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f["name"] for f in self.selected)

    @property
    def max_calls(self) -> int | None:
        """1 when only one call may be made, else None."""
        return 1 if self.choice == "named" or not self.parallel else None

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of a finished output, calls in OpenAI's shape with new ids.
        Text that does not read as calls stays content (all of the text when there is no
        call; None when there are calls and nothing else)."""
        if not self.active:
            return text, []
        scan = self.parser.scan(text, True, self.names)
        calls = [self.openai_call(c) for c in scan.calls[: self.max_calls]]
        return (scan.content or None) if calls else scan.content, calls

    def openai_call(self, call: ParsedCall, call_id: str | None = None) -> dict[str, Any]:
        return {"id": call_id or self.parser.new_call_id(), "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}


def parse_tools(tools: list[dict[str, Any]] | None, tool_choice: Any,
                parallel_tool_calls: bool | None, parser: ToolCallParser) -> ToolSetup | None:
    """Validate a request's tool fields (ValueError naming the problem; the API answers 400).
    None when the request has no tools and no tool_choice."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ValueError("'tool_choice' needs 'tools'")
        if tools is not None:
            raise ValueError("'tools' must not be empty")
        return None
    if not isinstance(tools, list):
        raise ValueError("'tools' must be a list of {'type': 'function', 'function': {...}}")
    functions: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = _parse_function(f"tools[{i}]", tool, functions)
        parser.check_function(f"tools[{i}]", fn)
        functions.append(fn)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ValueError("'parallel_tool_calls' must be a bool")
    choice, named = _parse_tool_choice(tool_choice, functions)
    return ToolSetup(functions, choice, parser, parallel_tool_calls is not False, named,
                     list(tools))


def _parse_function(where: str, tool: Any, functions: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry of `tools` (at `where`) as {"name", "parameters", "description"?, "strict",
    "where"}; the name must not be among `functions`, the ones before it."""
    from radixlm.constraints.schema import check_schema

    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ValueError(f"{where}.type must be 'function'")
    extra = sorted(set(tool) - {"type", "function"})
    if extra:
        raise ValueError(f"{where}: unknown field(s) {extra}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be an object")
    unknown = set(fn) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise ValueError(f"{where}.function: unknown field(s) {sorted(unknown)}")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{where}.function.name must match ^[A-Za-z0-9_-]{{1,64}}$, "
                         f"got {name!r}")
    if any(f["name"] == name for f in functions):
        raise ValueError(f"{where}.function.name {name!r} is given twice (function names "
                         "must be unique)")
    if "description" in fn and not isinstance(fn["description"], str | type(None)):
        raise ValueError(f"{where}.function.description must be a string")
    if "strict" in fn and not isinstance(fn["strict"], bool | type(None)):
        raise ValueError(f"{where}.function.strict must be a bool")
    params = fn.get("parameters")
    params = {"type": "object", "properties": {}} if params is None else params
    if not isinstance(params, dict):
        raise ValueError(f"{where}.function.parameters (function {name!r}) must be a JSON "
                         "schema object")
    try:
        check_schema(params)
    except ValueError as exc:
        raise ValueError(f"{where}.function.parameters (function {name!r}): {exc}") from None
    return {"name": name, "parameters": params, "strict": bool(fn.get("strict")),
            "where": where, **({"description": fn["description"]} if fn.get("description")
                               else {})}


def _parse_tool_choice(tool_choice: Any,
                       functions: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(choice, named function or None) of `tool_choice` over the parsed `functions`."""
    if tool_choice is None or tool_choice == "auto":
        return "auto", None
    if tool_choice in ("none", "required"):
        return tool_choice, None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if (tool_choice.get("type") != "function" or not isinstance(fn, dict)
                or set(tool_choice) - {"type", "function"} or set(fn) - {"name"}):
            raise ValueError("'tool_choice' must be 'none', 'auto', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}")
        named = fn.get("name")
        if named not in [f["name"] for f in functions]:
            raise ValueError(f"'tool_choice' names function {named!r}, which is not in 'tools'")
        return "named", named
    raise ValueError(f"'tool_choice' must be 'none', 'auto', 'required' or a named "
                     f"function, got {tool_choice!r}")


def strict_schema(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that leaves it
    open (``strict: true``: the arguments are exactly the listed properties). ``allOf``
    members are left as they are: closing them would reject what the others allow."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    objectish = out.get("type") == "object" or (isinstance(out.get("type"), list)
                                                and "object" in out["type"]) \
        or "properties" in out
    if objectish and "additionalProperties" not in out and "allOf" not in out \
            and "$ref" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: strict_schema(s) for k, s in out[key].items()}
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    return out
