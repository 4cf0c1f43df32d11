"""`python -m radixlm.launch_server --model-path ... --port ...`: SGLang's launch command."""

import sys

from radixlm.cli import launch_server_main

if __name__ == "__main__":
    sys.exit(launch_server_main())
