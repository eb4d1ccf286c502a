"""Entry point: python -m harness [overrides]. See conf/config.yaml."""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness import PROJECT_ROOT
from harness.startup import stop_on_signals


# An absolute path: relative ones resolve against the calling module, which for the console
# script (disagg-harness) is a package, not this file
@hydra.main(version_base="1.3", config_path=str(PROJECT_ROOT / "conf"), config_name="config")
def main(cfg: DictConfig) -> int:
    from pathlib import Path

    stop_on_signals()

    if cfg.runner.name == "serve":
        from harness.serving.serve import run
    else:
        from harness.offline.run import run

    hc = HydraConfig.get()
    if hc.mode == RunMode.RUN:
        code = run(cfg, Path(hc.runtime.output_dir))
        if code:
            sys.exit(code)
        return code
    # In a sweep, one failed job must not stop the others: it shows as failed in its summary,
    # and the sweep exits 1 after its table (harness.report.sweep.SweepSummary). Ctrl-C stops the sweep.
    try:
        code = run(cfg, Path(hc.runtime.output_dir))
        if code == 130:
            sys.exit(code)
        return code
    except Exception as e:  # noqa: BLE001
        import json
        import traceback

        traceback.print_exc()
        (Path(hc.runtime.output_dir) / "summary.json").write_text(json.dumps({"status": "crashed", "error": repr(e)}))
        return 4


if __name__ == "__main__":
    main()
