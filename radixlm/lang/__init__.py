"""The frontend language: programs of gen/select/roles/fork run against a backend."""

from radixlm.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    image,
    select,
    separate_reasoning,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixlm.lang.backend.base import Backend, BackendError
from radixlm.lang.chat_template import ChatTemplate, ChatTemplateError
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.global_config import GlobalConfig, global_config
from radixlm.lang.interpreter import ProgramError
from radixlm.lang.program import SglFunction
from radixlm.lang.state import ProgramState, ProgramStateGroup

__all__ = [
    "Backend", "BackendError", "ChatTemplate", "ChatTemplateError", "GlobalConfig",
    "ProgramError",
    "ProgramState", "ProgramStateGroup", "SglFunction", "assistant", "assistant_begin",
    "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string",
    "get_default_backend", "get_server_info", "global_config", "greedy_token_selection",
    "image", "select", "separate_reasoning", "set_default_backend", "system", "system_begin",
    "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]
