"""Every strategy over a range of prompt lengths, against the machine's copy bandwidth measured
in the same run.

    python scripts/bench_strategies.py [--experiment cpu_bench] [--two-gpus] [--out DIR] [--round K]
        [-- harness overrides ...]

(This module is the benchmark; scripts/bench_strategies.py runs its main.)

An experiment (conf/experiment/) says what to run: its model, device and engine settings, and
bench.lengths, bench.per_length and bench.strategies; harness overrides after -- change any of
them (-- bench.lengths=[32,2048] bench.strategies=[fused]). A strategy's own engine settings
(full_cache's smaller cache) come from its config, or from the experiment's
conf/experiment/<experiment>/<strategy>.yaml.

One harness run per strategy (its prompts cover every length, one request in flight at a
time), bench.engine_starts times (each its own engine start: the runs of a round interleave
the strategies, as an A/B does; with several, <strategy>/start<k>/), then one table per strategy
and prompt length (medians, each with its 95% bootstrap interval where the requests differ; with
several starts, the mean of the starts' medians with its t-interval over the starts, which is
what a rerun's start is expected in; --round K runs start K only, into the same --out as the
other rounds, for a benchmark longer than one sitting):
  transfer ms     the sender starts gathering -> the last byte is in the decode engine's memory
                  (on a GPU: on the GPU's clock, CUDA events)
  host clock ms   the same on the host's clock
  GB/s, of ceiling  KV bytes / transfer ms, and that as a share of the ceiling
  notify ms       -> the decode worker has been told (doorbell latency; not in transfer ms)
  KV ready ms     the sender starts -> the KV is in the decode engine's own blocks
  KV e2e ms       the prefill's forward pass done -> the KV in the decode engine's own blocks
  TTFT overhead   the first token from the decode engine, against the colocated baseline
  prefill TTFT overhead  the first token as the prefill engine returns it (the KV has left by
                  then): what a client sees when a router streams the prefill's token
  overhead parts  the mean TTFT overhead cut into its parts (prefill, send, delivery, pickup,
                  scatter, check, decode: results/README.md), which add up to the mean overhead
bench.decode_submit lists when the decode request goes (early, after_prefill; default: the
harness's default): each strategy runs once per entry, as <strategy>-<entry>.
The ceiling: a large tensor copy (bytes copied / time) on the same device, or from GPU 0 to
GPU 1 with --two-gpus, measured before and after the runs (each sitting's: bench.json); the
highest is used. Writes table.md and rows.csv next to the runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from harness import PROJECT_ROOT
from harness.ceiling import copy_ceiling_gbps
from harness.records.kv_geometry import kv_geometry
from harness.report.benchmark import replot, write_tables
from harness.workload import bench_prompts

ROOT = PROJECT_ROOT


def argument_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="cpu_bench", help="a conf/experiment/ config with a bench section")
    ap.add_argument("--two-gpus", action="store_true",
                    help="prefill on GPU 0, decode on GPU 1; the ceiling is a GPU 0 -> GPU 1 peer copy")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replot", default=None, metavar="DIR",
                    help="only redraw DIR/figure.png from DIR/rows.csv (and figure-X.png from each rows-X.csv), "
                         "titled by the table's first line: committed benchmarks keep rows.csv, not the figure")
    ap.add_argument("--retable", default=None, metavar="DIR",
                    help="only write DIR's table.md, rows.csv and figure.png again from its runs' records "
                         "(after the table gained a column), with the ceiling measured when it ran")
    ap.add_argument("--round", type=int, default=None, metavar="K",
                    help="run only engine start K of each strategy (of bench.engine_starts), into an --out directory "
                         "that may hold this benchmark's other rounds: a benchmark longer than one sitting (a GPU "
                         "machine's call) run round by round; the tables cover every round there")
    ap.add_argument("overrides", nargs="*", help="harness overrides, after --")
    return ap


def main() -> int:
    args = argument_parser().parse_args()
    if args.replot:
        replot(Path(args.replot))
        return 0
    if args.retable:
        out = Path(args.retable)
        if (out / "bench.json").exists():  # what it ran and the ceilings measured around each sitting
            state = json.loads((out / "bench.json").read_text())
            labels = [label for label, _, _ in state["benchmark"]["runs"]]
            ceiling = max(max(pair) for pair in state["ceilings_gbps"].values())
        else:  # written before bench.json was: the ceiling from the table's shares
            before = pd.read_csv(out / "rows.csv")
            labels = list(dict.fromkeys(before["strategy"]))
            ceiling = float((before["gbps"] / before["ceiling_share"]).dropna().median())
        labels = [s for s in labels if (out / s).is_dir()]
        print(write_tables(out, labels, ceiling, (out / "table.md").read_text().splitlines()[0]))
        return 0
    plan = Plan.compose(args.experiment, args.overrides, args.two_gpus)  # bad input stops here, before any run
    if plan.device == "cuda" and not cuda_available():  # before the ceiling is measured on it
        print(f"error: --experiment {args.experiment} runs on CUDA, and torch sees no GPU here", file=sys.stderr)
        return 2
    rounds = range(1, plan.starts + 1) if args.round is None else [args.round]
    if not all(1 <= k <= plan.starts for k in rounds):
        print(f"error: --round {args.round}: bench.engine_starts is {plan.starts}", file=sys.stderr)
        return 2
    out = Path(args.out or ROOT / "results" / "bench" / time.strftime("strategies_%Y-%m-%d_%H-%M-%S"))
    ledger = Ledger(out, plan, args.two_gpus)
    refused = ledger.refused(rounds)  # the harness appends to its records: never mix two benchmarks
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    ledger.open()
    ceiling_of = "GPU 0 -> GPU 1 peer copy" if args.two_gpus else f"{plan.device} copy"

    def ceiling_now() -> float:
        if args.two_gpus:
            return copy_ceiling_gbps("cuda:0", to_device="cuda:1")
        return copy_ceiling_gbps(plan.device)

    ceiling_before = ceiling_now()
    print(f"copy ceiling before: {ceiling_before:.2f} GB/s", flush=True)

    codes = []
    for start in rounds:  # each start round runs every strategy once, as an A/B does
        for label, strategy, submit in plan.runs:
            run_dir = ledger.run_dir(label, start)
            cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}",
                   *plan.harness_overrides(strategy, out / "prompts.jsonl", submit)]
            print(f"--- {label}, engine start {start} of {plan.starts}: {' '.join(cmd[2:])}", flush=True)
            codes.append(subprocess.run(cmd, cwd=ROOT).returncode)
            if codes[-1] == 2:  # bad input (the harness said why in one line): every run would be refused
                print(f"error: the harness refused {label}'s run (above); nothing measured", file=sys.stderr)
                return 2

    ceiling_after = ceiling_now()
    print(f"copy ceiling after: {ceiling_after:.2f} GB/s", flush=True)
    ceilings = ledger.add_ceilings(rounds, ceiling_before, ceiling_after)
    ceiling = max(max(pair) for pair in ceilings.values())
    around = "; ".join(f"{'' if len(ceilings) == 1 else f'round {k}: '}before {b:.2f}, after {a:.2f}"
                       for k, (b, a) in sorted(ceilings.items()))
    title = f"{device_name(plan.device)}; {plan.model}; ceiling ({ceiling_of}, same run): {ceiling:.2f} GB/s ({around})"
    print(write_tables(out, [label for label, _, _ in plan.runs], ceiling, title))
    print(f"\nwritten: {out / 'table.md'}, {out / 'rows.csv'}, {out / 'figure.png'}")
    return 0 if all(c == 0 for c in codes) else 1


class Ledger:
    """A benchmark's --out directory: its prompts, its runs (<label>/ or <label>/start<k>/) and
    bench.json (what it runs, and the copy ceiling measured around each round), which a later
    --round checks before adding its runs."""

    def __init__(self, out: Path, plan: Plan, two_gpus: bool):
        self.out, self.plan = out, plan
        self.what = {"experiment": plan.experiment, "overrides": plan.overrides, "two_gpus": two_gpus,
                     "lengths": plan.lengths, "per_length": plan.per_length, "runs": plan.runs,
                     "engine_starts": plan.starts}
        self.path = out / "bench.json"

    def run_dir(self, label: str, start: int) -> Path:
        return self.out / label / f"start{start}" if self.plan.starts > 1 else self.out / label

    def refused(self, rounds) -> str | None:
        """Why these rounds cannot run into out, or None."""
        if not self.out.exists() or not any(self.out.iterdir()):
            return None
        if not self.path.exists():
            return f"{self.out} already holds results; give a new --out directory"
        before = json.loads(self.path.read_text())["benchmark"]
        if before != json.loads(json.dumps(self.what)):
            return (f"{self.out} holds another benchmark ({before['experiment']}, "
                    f"{' '.join(before['overrides']) or 'no overrides'}); give a new --out directory")
        done = [f"{label}'s start {k}" for k in rounds for label, _, _ in self.plan.runs
                if self.run_dir(label, k).exists()]
        if done:
            return f"{self.out} already holds {', '.join(done)}: run another --round, or into a new --out"
        return None

    def open(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "prompts.jsonl").write_text(bench_prompts(self.plan.lengths, self.plan.per_length))
        if not self.path.exists():
            self.path.write_text(json.dumps({"benchmark": self.what, "ceilings_gbps": {}}, indent=1) + "\n")

    def add_ceilings(self, rounds, before: float, after: float) -> dict[str, tuple[float, float]]:
        """The copy ceiling (before, after) measured around each sitting, by its rounds ("1,2,3")."""
        state = json.loads(self.path.read_text())
        state["ceilings_gbps"][",".join(map(str, rounds))] = [before, after]
        self.path.write_text(json.dumps(state, indent=1) + "\n")
        return {k: tuple(v) for k, v in state["ceilings_gbps"].items()}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def device_name(device: str) -> str:
    """What the table's rows ran on: the GPU's name (every row of a table on one kind), or the CPU."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    import platform

    return f"CPU ({platform.processor() or platform.machine()})"


class Plan:
    """What one benchmark runs: the experiment, the overrides after --, and what its config
    (composed as the harness composes it) says about lengths, strategies and device."""

    def __init__(self, experiment: str, overrides: list[str], lengths: list[int], per_length: int,
                 strategies: list[str], device: str, submits: list[str | None] | None = None, starts: int = 1,
                 model: str = ""):
        """model: the model and its KV geometry, for the table's first line (rows of different
        geometries compare per byte)."""
        self.experiment, self.overrides, self.model = experiment, overrides, model
        self.lengths, self.per_length, self.strategies, self.device = lengths, per_length, strategies, device
        self.submits = submits or [None]
        self.starts = starts  # bench.engine_starts: each strategy's engines started this many times

    @property
    def runs(self) -> list[tuple[str, str, str | None]]:
        """(run directory name, strategy, run.decode_submit) of each harness run."""
        return [(s if m is None or len(self.submits) == 1 else f"{s}-{m}", s, m)
                for s in self.strategies for m in self.submits]

    @classmethod
    def compose(cls, experiment: str, overrides: list[str], two_gpus: bool = False) -> Plan:
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from harness import resolvers

        resolvers.register()
        if two_gpus:
            overrides = ["device=cuda", "device.prefill_gpu=0", "device.decode_gpu=1", "device.baseline_gpu=0",
                         *overrides]
        try:
            with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
                cfg = compose("config", overrides=[f"experiment={experiment}", *overrides])
            bench = cfg.get("bench")
            if bench is None:
                raise ValueError(f"experiment {experiment!r} has no bench section (lengths, per_length, strategies)")
            starts = bench.get("engine_starts", 1)
            if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
                raise ValueError(f"bench.engine_starts must be a whole number >= 1, got {starts!r}")
            geometry = kv_geometry(str(cfg.model.path), str(cfg.engine.dtype))
            model = cfg.model.name + (f" (KV: {geometry.describe()})" if geometry else "")
            plan = cls(experiment, list(overrides), [int(n) for n in bench.lengths], int(bench.per_length),
                       list(bench.strategies), cfg.device.type, list(bench.get("decode_submit") or []), starts,
                       model)
        except (HydraException, OmegaConfBaseException, ValueError, TypeError) as e:
            print(f"error: --experiment {experiment} -- {' '.join(overrides)}: {str(e).splitlines()[0]}",
                  file=sys.stderr)
            sys.exit(2)
        if plan.device == "auto":
            import torch

            plan.device = "cuda" if torch.cuda.is_available() else "cpu"
        return plan

    def harness_overrides(self, strategy: str, prompts: Path, submit: str | None = None) -> list[str]:
        """One strategy's harness run: the experiment, the benchmark's prompts, then the overrides after --."""
        return [f"experiment={self.experiment}", f"strategy={strategy}", "workload=jsonl", f"workload.path={prompts}",
                f"engine.max_model_len={max(self.lengths) + 64}", "sampling.max_tokens=4",
                *([f"run.decode_submit={submit}"] if submit else []), *self.overrides]
