"""What every entry point does first (python -m harness, python -m harness.serving.deploy): vLLM's
log level in this process (it imports vLLM only to check the strategy; the engines' lines belong
to their own logs), the config's resolvers, and the signals that end a run as Ctrl-C does."""

import os
import signal

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from harness import resolvers  # noqa: E402 - after the log level, which vLLM reads when imported

resolvers.register()


def _terminated(signum, frame):
    # SIGTERM (a scheduler's, timeout's, kill's) ends a run as Ctrl-C does: engines stopped, the
    # records so far kept, a link's namespaces removed (the default action would leave them); a
    # second one ends the process at once
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_signals() -> None:
    """SIGTERM as Ctrl-C (_terminated), and Ctrl-C itself even where the process was started
    with SIGINT ignored (a background job of a non-interactive shell: Python then leaves it
    ignored, and a deployment outlived the test that pressed Ctrl-C)."""
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)
