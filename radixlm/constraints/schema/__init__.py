"""JSON Schema for the grammar backends, in parts:

- ``analysis``: what a schema says (types, value sets, ``$ref`` targets, disjointness),
  shared by the two consumers below;
- ``metaschema``: a schema checked against its draft, and the whitespace pattern;
- ``regex_translator`` (with ``regex_keywords``, ``regex_oneof``): schema -> regex, the
  outlines backend's language and the llguidance backend's fallback;
- ``llg_rewrite`` (with ``llg_oneof``, ``llg_negation``): the schema handed to llguidance's
  JSON compiler, with the keywords it refuses rewritten where an exact rewrite exists.

The checks the engine and server run on a request's schema are importable from here.
"""

from radixlm.constraints.schema.metaschema import check_schema, check_whitespace_pattern

__all__ = ["check_schema", "check_whitespace_pattern"]
