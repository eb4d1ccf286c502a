"""One-off: turn the committed results of schema version 1 (renamed copies of each run's files,
results/cpu/<date>/<strategy>-requests.jsonl, results/gpu/session*/...) into whole run
directories that harness.report.load loads. Reads the old files from git at SOURCE (the last
commit with the old layout), so it can be re-run and checked:

    python scripts/convert_v1_results.py [--out results]

Each run directory gets the run's requests.jsonl as it was written (byte for byte), its
summary.json where one was kept (else recomputed by harness.records.summary.summarize and marked
"recomputed": true), and a meta.json written here, marked "reconstructed": the git sha and
the command from the results READMEs and the git history, the versions from gpu.txt or
pyproject.toml, and the config composed from conf/ at that sha with the command's overrides.
The benchmark's table.md and rows.csv go next to its run directories, as
scripts/bench_strategies.py writes them (its figure.png is not committed: `bench_strategies.py
--replot DIR` draws it from rows.csv). The directories are named as results/ names them now
(results/gpu/<date>-s<session>/...; results/INDEX.md maps the old names).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness.records.files import read_jsonl, write_json  # noqa: E402
from harness.records.summary import run_summary  # noqa: E402

SOURCE = "96b65116c15a8886eada1f07d11b8c6a8463c6a5"  # the last commit with the old layout
CPU = {"vllm": "0.32.0", "torch": "2.13.0+cpu", "device": "cpu", "device_name": "2-core x86 VM"}
GPU = {"vllm": "0.26.0", "torch": "2.11.0+cu130", "device": "cuda", "device_name": "NVIDIA H200"}
GPU_BENCH = ["model=llama3_8b_shape", "engine.gpu_memory_utilization=0.28", "engine.kv_cache_gib=16"]
TWO_GPUS = ["device.prefill_gpu=0", "device.decode_gpu=1", "device.baseline_gpu=0"]
CHECK = ["device=cuda", "workload=synthetic", "workload.prompt_len=300", "workload.num_prompts=6",
         "workload.concurrency=2"]


@dataclass
class Run:
    """One harness run: where its files were in SOURCE, where its directory goes."""
    dest: str
    strategy: str
    requests: str | None  # path in SOURCE
    summary: str | None
    overrides: list[str]


@dataclass
class Bench:
    """A group of runs made by one command, with the files that command wrote beside them."""
    dest: str
    sha: str
    versions: dict
    command: str
    source_note: str
    runs: list[Run]
    files: dict[str, str] = field(default_factory=dict)  # new name -> path in SOURCE


def bench_runs(dest: str, src: str, strategies: list[str], lengths: list[int], overrides: list[str],
               requests: str = "{s}-requests.jsonl", summary: str | None = None,
               per_strategy: dict[str, list[str]] | None = None) -> list[Run]:
    """The harness runs of scripts/bench_strategies.py (its command line for each strategy)."""
    common = ["workload=jsonl", "workload.path=prompts.jsonl", f"engine.max_model_len={max(lengths) + 64}",
              "sampling.max_tokens=4"]
    def overrides_of(s):  # as the script's --set did: a strategy's own value replaces the common one
        own = (per_strategy or {}).get(s, [])
        keys = {o.split("=", 1)[0] for o in own}
        return [o for o in overrides if o.split("=", 1)[0] not in keys] + own

    return [Run(f"{dest}/{s}", s, f"{src}/{requests.format(s=s)}", summary and f"{src}/{summary.format(s=s)}",
                [f"strategy={s}", *common, *overrides_of(s)]) for s in strategies]


def check_runs(dest: str, src: str, name: str, dest_name: str = "check-{s}") -> list[Run]:
    """The harness runs of `scripts/gpu_run.sh check`: only their summaries were kept."""
    return [Run(f"{dest}/{dest_name.format(s=s)}", s, None, f"{src}/{name.format(s=s)}.summary.json",
                [f"strategy={s}", *CHECK]) for s in ("fused", "per_request_blocks", "layerwise")]


CPU_LENGTHS = [32, 128, 256, 512, 1024, 2048]
CPU_STRATEGIES = ["full_cache", "per_request_blocks", "fused", "layerwise"]
GPU_LENGTHS = [512, 2048, 8192, 16384]
BENCHES = [
    Bench("cpu/2026-11-30-s2", "5faa815c828b7a5316a46cc5233e004e81c48d84", CPU,
          "python scripts/bench_strategies.py", "results/cpu/strategies.md (second session: code at the commit that "
          "added the table)",
          bench_runs("cpu/2026-11-30-s2", "results/cpu/2026-11-30", CPU_STRATEGIES, CPU_LENGTHS, ["device=cpu"]),
          {"table.md": "results/cpu/2026-11-30/table.md", "rows.csv": "results/cpu/2026-11-30/rows.csv",
           "figure.png": "results/cpu/2026-11-30/figure.png"}),
    Bench("cpu/2026-11-30-s3", "0447046a91379a550cd4f90368cb4d7832fe044c", CPU,
          "python scripts/bench_strategies.py", "results/cpu/strategies.md (third session, with the cheaper digests of "
          "this commit; the commits after it up to the results touched results/ only)",
          bench_runs("cpu/2026-11-30-s3", "results/cpu/2026-11-30-s3", CPU_STRATEGIES, CPU_LENGTHS, ["device=cpu"]),
          {n: f"results/cpu/2026-11-30-s3/{n}" for n in ("table.md", "rows.csv", "figure.png", "copy-probe.txt")}),
    Bench("gpu/2026-11-30-s1/h200-1gpu", "51aac42cbed78af41d77a277b90384b1dcd6c2dd", GPU,
          "bash scripts/gpu_run.sh bench engine.kv_cache_gib=16  # = python3 scripts/bench_strategies.py --device cuda "
          "--lengths 512,2048,8192 --per-length 3 --strategies fused,layerwise,per_request_blocks -- "
          + " ".join(GPU_BENCH),
          "results/gpu/session1/README.md (code and results in one commit); per_request_blocks' requests were not kept",
          bench_runs("gpu/2026-11-30-s1/h200-1gpu", "results/gpu/session1", ["fused", "layerwise"], [512, 2048, 8192],
                     ["device=cuda", *GPU_BENCH]),
          {"table.md": "results/gpu/session1/h200-1gpu-llama3-8b-shape.md",
           "rows.csv": "results/gpu/session1/h200-1gpu-llama3-8b-shape.csv"}),
    Bench("gpu/2026-11-30-s1/h200-1gpu-full_cache", "51aac42cbed78af41d77a277b90384b1dcd6c2dd", GPU,
          "python3 scripts/bench_strategies.py --device cuda --lengths 512,2048,8192 --per-length 1 --strategies "
          "full_cache -- model=llama3_8b_shape engine.gpu_memory_utilization=0.28 engine.kv_cache_gib=2",
          "results/gpu/session1/README.md; only the table was kept", [],
          {"table.md": "results/gpu/session1/h200-1gpu-llama3-8b-shape-full_cache.md"}),
    Bench("gpu/2026-11-30-s1", "51aac42cbed78af41d77a277b90384b1dcd6c2dd", GPU, "bash scripts/gpu_run.sh check",
          "results/gpu/session1/README.md; only the summaries were kept",
          check_runs("gpu/2026-11-30-s1", "results/gpu/session1", "h200-check-tiny-llama-{s}")),
    Bench("gpu/2026-11-30-s2/h200-1gpu", "a8abac77c9ab46041e2badcc00e5da71d79fbbe2", GPU,
          "bash scripts/gpu_run.sh bench  # = python3 scripts/bench_strategies.py --device cuda --lengths "
          "512,2048,8192,16384 --per-length 2 --strategies fused,layerwise,per_request_blocks -- "
          + " ".join(GPU_BENCH),
          "results/gpu/README.md ('session2 (code a8abac7)')",
          bench_runs("gpu/2026-11-30-s2/h200-1gpu", "results/gpu/session2",
                     ["fused", "layerwise", "per_request_blocks"], GPU_LENGTHS, ["device=cuda", *GPU_BENCH],
                     requests="bench-{s}-requests.jsonl"),
          {"table.md": "results/gpu/session2/h200-1gpu-table.md", "rows.csv": "results/gpu/session2/h200-1gpu-rows.csv",
           "figure.png": "results/gpu/session2/h200-1gpu-figure.png"}),
    Bench("gpu/2026-11-30-s2/h200-2gpu", "a8abac77c9ab46041e2badcc00e5da71d79fbbe2", GPU,
          "STRATEGIES=fused LENGTHS=2048,8192,16384 bash scripts/gpu_run.sh bench2  # = python3 "
          "scripts/bench_strategies.py --device cuda --two-gpus --lengths 2048,8192,16384 --per-length 2 --strategies "
          "fused -- " + " ".join(GPU_BENCH),
          "results/gpu/README.md ('session2 (code a8abac7)'); strategies and lengths as in the kept rows",
          bench_runs("gpu/2026-11-30-s2/h200-2gpu", "results/gpu/session2", ["fused"], [2048, 8192, 16384],
                     ["device=cuda", *TWO_GPUS, *GPU_BENCH], requests="bench2-{s}-requests.jsonl"),
          {"table.md": "results/gpu/session2/h200-2gpu-table.md", "rows.csv": "results/gpu/session2/h200-2gpu-rows.csv",
           "figure.png": "results/gpu/session2/h200-2gpu-figure.png"}),
    Bench("gpu/2026-11-30-s2", "a8abac77c9ab46041e2badcc00e5da71d79fbbe2", GPU, "bash scripts/gpu_run.sh check",
          "results/gpu/README.md ('session2 (code a8abac7)'); only the summaries were kept",
          check_runs("gpu/2026-11-30-s2", "results/gpu/session2", "check-{s}")),
    Bench("gpu/2026-11-30-s3/h200-1gpu", "4594e90d9e1e4b12cb71651026870c04159471de", GPU,
          "bash scripts/gpu_run.sh bench  # = python3 scripts/bench_strategies.py --device cuda --lengths "
          "512,2048,8192,16384 --per-length 2 --strategies fused,layerwise,per_request_blocks,full_cache "
          "--set full_cache:engine.kv_cache_gib=2.5 -- " + " ".join(GPU_BENCH),
          "results/gpu/README.md (the tables 'were taken one step before' e9e7475: transfer_ms on the host's clock)",
          bench_runs("gpu/2026-11-30-s3/h200-1gpu", "results/gpu/session3", CPU_STRATEGIES, GPU_LENGTHS,
                     ["device=cuda", *GPU_BENCH], requests="h200-1gpu-{s}-requests.jsonl",
                     summary="h200-1gpu-{s}-summary.json", per_strategy={"full_cache": ["engine.kv_cache_gib=2.5"]}),
          {"table.md": "results/gpu/session3/h200-1gpu-table.md", "rows.csv": "results/gpu/session3/h200-1gpu-rows.csv",
           "figure.png": "results/gpu/session3/h200-1gpu-figure.png"}),
    Bench("gpu/2026-11-30-s3/h200-2gpu", "4594e90d9e1e4b12cb71651026870c04159471de", GPU,
          "bash scripts/gpu_run.sh bench2  # = the one-GPU bench with --two-gpus",
          "results/gpu/README.md (the tables 'were taken one step before' e9e7475: transfer_ms on the host's clock)",
          bench_runs("gpu/2026-11-30-s3/h200-2gpu", "results/gpu/session3", CPU_STRATEGIES, GPU_LENGTHS,
                     ["device=cuda", *TWO_GPUS, *GPU_BENCH], requests="h200-2gpu-{s}-requests.jsonl",
                     summary="h200-2gpu-{s}-summary.json", per_strategy={"full_cache": ["engine.kv_cache_gib=2.5"]}),
          {"table.md": "results/gpu/session3/h200-2gpu-table.md", "rows.csv": "results/gpu/session3/h200-2gpu-rows.csv",
           "figure.png": "results/gpu/session3/h200-2gpu-figure.png"}),
    Bench("gpu/2026-11-30-s3/h200-1gpu-fused-events", "e9e74753d520ac30173708c7c524c6f614142b65", GPU,
          "STRATEGIES=fused LENGTHS=2048,8192,16384 bash scripts/gpu_run.sh bench",
          "results/gpu/README.md ('The fused rerun on one GPU ... uses the final definition'); lengths as in the rows",
          bench_runs("gpu/2026-11-30-s3/h200-1gpu-fused-events", "results/gpu/session3", ["fused"], [2048, 8192, 16384],
                     ["device=cuda", *GPU_BENCH], requests="h200-1gpu-fused-events-requests.jsonl"),
          {"table.md": "results/gpu/session3/h200-1gpu-fused-events-table.md",
           "rows.csv": "results/gpu/session3/h200-1gpu-fused-events-rows.csv",
           "figure.png": "results/gpu/session3/h200-1gpu-fused-events-figure.png"}),
    Bench("gpu/2026-11-30-s3", "0244fd130492f9ca0c066431b4bc3830180efbea", GPU, "bash scripts/gpu_run.sh check",
          "results/gpu/README.md ('The checks ran at commit 0244fd1'); only the summaries were kept",
          check_runs("gpu/2026-11-30-s3", "results/gpu/session3", "check-1gpu-{s}", "check-1gpu-{s}")),
]


def git_show(path: str) -> bytes:
    return subprocess.run(["git", "show", f"{SOURCE}:{path}"], cwd=ROOT, capture_output=True, check=True).stdout


def compose_config(sha: str, overrides: list[str]) -> dict:
    """The config as the harness at `sha` composed it (conf/ of that commit); the project root
    the run saw is not known, so ${project_root:} stays a placeholder."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("project_root", lambda: "<project root>", replace=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", sha, "conf"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(Path(tmp) / "conf"), version_base="1.3"):
            return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


def convert(bench: Bench, out: Path) -> None:
    for name, src in bench.files.items():
        if name == "figure.png":  # made again from rows.csv, not committed (tools/results_slim.py)
            continue
        (out / bench.dest).mkdir(parents=True, exist_ok=True)
        (out / bench.dest / name).write_bytes(git_show(src))
    for run in bench.runs:
        d = out / run.dest
        d.mkdir(parents=True, exist_ok=True)
        if run.requests:
            (d / "requests.jsonl").write_bytes(git_show(run.requests))
        rows = read_jsonl(d / "requests.jsonl")
        if run.summary:
            (d / "summary.json").write_bytes(git_show(run.summary))
            summary = json.loads((d / "summary.json").read_text())
        else:
            first = rows[0]
            failed = any(not r["match"] or r.get("digest_match") is False for r in rows)
            summary = {**run_summary(rows, status="mismatch" if failed else "ok", error=None, run_id=first["run_id"],
                                     strategy=first["strategy"], model=first["model"], workload=first["workload"],
                                     device=first["device"], copy_ceiling_gbps=None, timings={}, engine_pids={}),
                       "recomputed": True}
            write_json(d / "summary.json", summary)
        versions = {"python": None, **bench.versions, "host": None, "git_sha": bench.sha}
        config = compose_config(bench.sha, run.overrides)
        write_json(d / "meta.json", {
            "run_id": summary.get("run_id") or run.strategy, "versions": versions,
            "strategy": config["strategy"]["name"], "model": config["model"]["name"],
            "workload": config["workload"]["name"],
            "num_prompts": len(rows) or summary.get("requests"),
            "command": bench.command, "overrides": run.overrides, "config": config,
            "reconstructed": (f"written by scripts/convert_v1_results.py, not by the run (whose meta.json was not "
                              f"kept): git_sha and command from {bench.source_note}; versions from gpu.txt "
                              "(GPU) or pyproject.toml's cpu extra (CPU); python and host unknown; config composed "
                              "from conf/ at git_sha with the overrides (workload.path: the benchmark's "
                              "prompts.jsonl, not kept; scripts/bench_strategies.py at git_sha regenerates it from "
                              "its seed)"
                              + ("" if run.summary else "; summary.json recomputed from requests.jsonl "
                                 "(copy_ceiling_gbps and timings were not kept)")),
        })


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "results"))
    out = Path(ap.parse_args().out)
    for bench in BENCHES:
        convert(bench, out)
        print(f"{bench.dest}: {len(bench.runs)} runs, {len(bench.files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
