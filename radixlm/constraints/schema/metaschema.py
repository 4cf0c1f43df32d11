"""Is it a JSON schema at all: a schema checked against its draft's metaschema, and the
whitespace pattern of a JSON spec checked to match only JSON whitespace. Run before any
translation, on the caller's thread; each raises ``ValueError`` naming the problem."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import jsonschema_rs

from radixlm.constraints.specs import check_depth


def check_schema(schema: Any) -> type:
    """Validate ``schema`` against its metaschema (``jsonschema``); returns the validator
    class of its draft."""
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"json_schema must be an object or a boolean, got {type(schema).__name__}")
    check_depth(schema, "the schema")  # (jsonschema's walk is recursive)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        ptr = "/" + "/".join(str(p) for p in exc.path)
        raise ValueError(f"invalid JSON schema: {exc.message} at JSON pointer '{ptr or '/'}'") \
            from None
    return cls


def meta_check(schema: Any) -> None:
    """The schema is a valid JSON Schema (its ``$schema`` draft, else 2020-12): checked by
    jsonschema-rs (~1000x faster than ``jsonschema`` on large schemas, whose metaschema walk
    took up to a second), falling back to ``check_schema`` for what jsonschema-rs can't load.
    ValueError names the first problem."""
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        raise ValueError(f"invalid JSON schema: {str(exc).splitlines()[0]}") from None
    except Exception:  # noqa: BLE001 - e.g. an unknown $schema: let jsonschema decide
        check_schema(schema)


def check_whitespace_pattern(pattern: str) -> None:
    """The whitespace regex may only ever match JSON whitespace (space, tab, CR, LF)."""
    try:
        compiled = re.compile(pattern)
    except (re.error, RecursionError) as exc:
        raise ValueError(f"invalid whitespace_pattern {pattern!r}: {exc}") from exc
    body = re.sub(r"\\[ tnr]|\\x(?:09|0A|0D|20)|\{\d+(,\d*)?\}|[ ?*+()|\[\]]", "", pattern)
    if body or compiled.fullmatch("x"):
        raise ValueError(f"whitespace_pattern {pattern!r} may match non-whitespace")
