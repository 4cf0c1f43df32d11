"""`sgl.global_config`: SGLang's process-wide frontend settings, with SGLang's names.

- `default_backend`: the backend programs run on without `backend=` (same as
  `set_default_backend`);
- `verbosity`: 2 prints a program's final text after every `run`;
- `enable_precache_with_tracing`: `run_batch` caches the program's traced constant prefix
  first (its `precache=` argument overrides it per call);
- `skip_special_tokens_in_output`, `spaces_between_special_tokens_in_out`: detokenization
  of generated text (sent with every gen);
- `enable_parallel_encoding`: SGLang joins `concate_and_append` forks by concatenating their
  K/V where the backend can; radixlm's backends join them by text (as SGLang does on
  backends without that support), so this setting changes nothing here.

The default backend itself is kept in `backend/default.py`.
"""

from __future__ import annotations

from typing import Any

from radixlm.lang.backend import default


class GlobalConfig:
    """Mutable frontend settings (one instance: `global_config`)."""

    def __init__(self) -> None:
        self.verbosity = 0
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True

    @property
    def default_backend(self) -> Any:
        return default.get_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        if backend is None:
            default.clear_default_backend()
        else:
            default.set_default_backend(backend)


global_config = GlobalConfig()
