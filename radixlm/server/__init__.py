"""HTTP server: SGLang-compatible native API, OpenAI-compatible API, Prometheus metrics.

`create_app(engine, settings)` builds the FastAPI app; `launch.serve(...)` runs it (what
`radixlm serve` does). See README.md in this folder.
"""

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings

__all__ = ["ServerSettings", "create_app"]
