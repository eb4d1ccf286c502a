"""Experiment tracking, chosen like a workload: each `conf/tracking/*.yaml` names its tracker
class as `_target_`; `make_tracker` builds it for one run. wandb is imported only when chosen."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


class NoTracking:
    """`tracking=none`: results stay in the run directory only."""

    def __init__(self, run_dir: Path, run_id: str, config: dict):
        pass

    def log_summary(self, summary: dict) -> None:
        pass

    def log_requests(self, rows: list[dict]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


class WandbTracking(NoTracking):
    """`tracking=wandb`: the resolved config, the summary's metrics and the per-request table."""

    def __init__(self, run_dir: Path, run_id: str, config: dict, mode: str = "offline",
                 project: str = "disagg-harness", entity: str | None = None, group: str | None = None,
                 tags: list[str] = ()):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=project, entity=entity, group=group, tags=list(tags), mode=mode,
                              name=run_id, id=None, dir=str(run_dir), config=config)

    def log_summary(self, summary: dict) -> None:
        flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
        flat.update({f"timings/{k}": v for k, v in summary.get("timings", {}).items() if isinstance(v, (int, float))})
        self.run.summary.update(flat)
        self.run.log({k: v for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})

    def log_requests(self, rows: list[dict]) -> None:
        if not rows:
            return
        cols = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
        self.run.log({"requests": self.wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def make_tracker(cfg: DictConfig, run_dir: Path, run_id: str) -> NoTracking:
    """The tracker `cfg.tracking` names, for the run in `run_dir` (the whole config logged with it)."""
    from hydra.utils import instantiate

    # partial: the run's values go straight to the class, not through instantiate (which would
    # instantiate every `_target_` inside the config being logged)
    build = instantiate(cfg.tracking, _partial_=True)
    return build(run_dir=run_dir, run_id=run_id, config=OmegaConf.to_container(cfg, resolve=True))


def track(cfg: DictConfig, run_dir: Path, run_id: str, summary: dict, rows: list[dict], failed: bool) -> None:
    """Both runners' copy of a finished run to the tracker: config, summary, the per-request
    table (runner=serve: every path's rows, told apart by `path`). Tracking never costs the
    results already on disk: a failure is one warning."""
    try:
        tracker = make_tracker(cfg, run_dir, run_id)
        tracker.log_summary(summary)
        tracker.log_requests(rows)
        tracker.finish(failed=failed)
    except Exception as e:  # noqa: BLE001 - whatever the tracker raises
        print(f"warning: tracking failed ({e}); results are in {run_dir}", file=sys.stderr)
