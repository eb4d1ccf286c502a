"""Experiment tracking: a no-op by default, wandb when `tracking=wandb` (imported only then)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf


class NoTracking:
    def log_summary(self, summary: dict) -> None:
        pass

    def log_requests(self, rows: list[dict]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


class WandbTracking(NoTracking):
    def __init__(self, cfg: DictConfig, run_dir: Path, run_id: str):
        import wandb

        t = cfg.tracking
        self.wandb = wandb
        self.run = wandb.init(project=t.project, entity=t.entity, group=t.group, tags=list(t.tags), mode=t.mode,
                              name=run_id, id=None, dir=str(run_dir),
                              config=OmegaConf.to_container(cfg, resolve=True))

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
    backend = cfg.get("tracking", {}).get("backend", "none")
    if backend == "none":
        return NoTracking()
    if backend == "wandb":
        return WandbTracking(cfg, run_dir, run_id)
    raise ValueError(f"tracking.backend must be none or wandb, got {backend!r}")
