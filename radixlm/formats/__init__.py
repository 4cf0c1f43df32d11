"""Model formats, plain Python used by the server, the DSL, the CLI and the intake: tool-call
formats by model family (``tool_parsers``: prompt text, grammar, parsing back) and named chat
templates (``chat_templates``, ``--chat-template``).

Beside ``radixlm.constraints`` (the tool grammars borrow its schema checks and rewrites, which
load no grammar engine); imports no torch, runtime, server or DSL module.
"""
