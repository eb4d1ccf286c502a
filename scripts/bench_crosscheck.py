"""vLLM's own client (`vllm bench serve`) and the harness's on the same load at the same time
(issue 13's cross-check): do they time TTFT and TPOT alike?

    python scripts/bench_crosscheck.py [--requests 48] [--vllm-requests 16] [--prompt-len 256] [--max-tokens 32]
                                       [--out DIR] [overrides ...]

One `vllm serve` instance (prefix caching off, so that no prompt is answered from the cache of
an earlier pass) behind the project's router. The harness (runner=serve, this deployment as its
endpoints) sends its reference pass, then its measured pass; as the measured pass begins, vLLM's
client (imported beforehand) starts too. Each sends one request at a time with the same lengths,
asking for the same work (log-probabilities and token ids), so their requests share the engine's
steps and see the same machine: run one after the other, on 2 shared CPU cores vLLM's client
alone moved by a factor of 2 between runs. Compared: vLLM's medians against those of the
harness's requests sent while vLLM's ran, and the TTFT's 25th percentiles (both computed here
from each request's TTFT): on 2 shared cores either client's requests may wait out stalls of the
machine (in one make test, vLLM's TTFT median was 218 ms against the harness's 41 ms at the same
time, their 25th percentiles alike), while a slip in what is timed moves the fast requests too.
Prints both and their ratios; writes them to
DIR/crosscheck.json beside the harness's run and vLLM's result (default DIR:
results/bench/crosscheck_<time>). The overrides choose the engine as for the harness (default:
the CPU, tiny-llama). tests/test_serve_deployment.py runs `crosscheck` against its deployment.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYS = (("ttft_ms", "median_ttft_ms"), ("tpot_ms", "median_tpot_ms"))
FAST_QUANTILE = 25  # the TTFT percentile compared beside the median (the fastest quarter's edge)


def crosscheck(url: str, reference_url: str, model: str, out: Path, n_ours: int = 48, n_theirs: int = 16,
               prompt_len: int = 256, out_len: int = 32, overrides: tuple[str, ...] = ()) -> dict:
    """Both clients against `url`; the harness's reference pass goes to reference_url (another
    instance, or the same one without a prefix cache). Returns the medians, their ratios and
    how many of the harness's requests ran while vLLM's did."""
    run_dir, bench_dir = out / "harness", out / "vllm-bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    bench_args = ["bench", "serve", "--backend", "vllm", "--base-url", url, "--model", model,
                  "--dataset-name", "random", "--random-input-len", str(prompt_len), "--random-output-len",
                  str(out_len), "--random-range-ratio", "0", "--num-prompts", str(n_theirs), "--request-rate", "inf",
                  "--max-concurrency", "1", "--ignore-eos", "--seed", "1", "--save-result", "--save-detailed",
                  # what the harness's client asks for too: the same work on the server
                  "--logprobs", "1", "--extra-body", json.dumps({"return_token_ids": True}),
                  "--result-dir", str(bench_dir), "--result-filename", "vllm-bench-serve.json",
                  "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    # vLLM's CLI imported before the harness's measured pass begins, then let go with one line
    bench = subprocess.Popen(
        [sys.executable, "-c", "import sys, harness.vllm_cli, vllm.benchmarks.serve\n"
         "from vllm.entrypoints.cli.main import main\n"
         f"sys.stdin.readline(); sys.argv = ['vllm', *{bench_args!r}]; sys.exit(main())"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ours = subprocess.Popen(
        [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", "runner=serve",
         f"serve.endpoints.baseline={reference_url}", f"serve.endpoints.disagg={url}",
         "workload=synthetic", f"workload.prompt_len={prompt_len}", f"workload.num_prompts={n_ours}",
         f"serve.num_requests={n_ours}", "serve.request_rate=inf", "serve.max_concurrency=1",
         "serve.baseline_repeat=false", f"sampling.max_tokens={out_len}", *overrides],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        reference = run_dir / "baseline.jsonl"
        while not (reference.exists() and reference.read_text().count("\n") == n_ours):
            if ours.poll() is not None:
                raise RuntimeError(f"the harness ended before its measured pass: {ours.stdout.read()[-3000:]}")
            time.sleep(0.02)
        t_measured = time.monotonic()  # the harness's measured pass begins (its clock: time.monotonic)
        bench.stdin.write("go\n")
        bench.stdin.flush()
        bench_out, _ = bench.communicate(timeout=900)
        ours_out, _ = ours.communicate(timeout=900)
    finally:
        for p in (bench, ours):
            p.kill()
    if bench.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {bench_out[-3000:]}")
    if ours.returncode != 0:
        raise RuntimeError(f"the harness failed: {ours_out[-3000:]}")
    theirs = json.loads((bench_dir / "vllm-bench-serve.json").read_text())
    if theirs["completed"] != n_theirs or theirs["failed"]:
        raise RuntimeError(f"vllm bench serve: {theirs['completed']} of {n_theirs} requests completed")
    # vLLM's start times are time.perf_counter(), the same clock as time.monotonic() on Linux;
    # vLLM 0.26 saves no latencies: TTFT plus the inter-token gaps
    latencies = theirs.get("latencies") or [t + sum(gaps) for t, gaps in zip(theirs["ttfts"], theirs["itls"],
                                                                             strict=True)]
    begin = min(theirs["start_times"]) - t_measured
    end = max(t + lat for t, lat in zip(theirs["start_times"], latencies, strict=True)) - t_measured
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    during = [r for r in rows
              if r["status"] == "ok" and begin <= r["sent_s"] and r["sent_s"] + r["e2e_ms"] / 1e3 <= end]
    result = {"harness_requests": len(rows), "harness_requests_during": len(during), "vllm_requests": n_theirs,
              "outputs_match": all(r["status"] == "ok" and r["match"] for r in rows),
              "prompt_len": prompt_len, "max_tokens": out_len,
              "vllm_window_s": [begin, end]}  # on the harness's measured pass's clock (its rows' sent_s)
    for key, theirs_key in KEYS:
        ours_median = float(np.median([r[key] for r in during])) if during else float("nan")
        result[f"harness_{key}_p50"], result[f"vllm_{key}_p50"] = ours_median, theirs[theirs_key]
        result[f"{key}_ratio"] = ours_median / theirs[theirs_key]
    q = f"ttft_ms_p{FAST_QUANTILE}"
    result[f"harness_{q}"] = float(np.percentile([r["ttft_ms"] for r in during], FAST_QUANTILE)) if during \
        else float("nan")
    result[f"vllm_{q}"] = float(np.percentile(np.array(theirs["ttfts"]) * 1e3, FAST_QUANTILE))
    result[f"{q}_ratio"] = result[f"harness_{q}"] / result[f"vllm_{q}"]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=48, help="the harness's (its measured pass outlasts vLLM's)")
    ap.add_argument("--vllm-requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: results/bench/crosscheck_<time>)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import harness.startup  # noqa: F401 - the config's resolvers
    from harness.checks import ConfigError, checked_inputs
    from harness.engine_config import engine_args, engine_env
    from harness.records.files import write_json
    from harness.records.meta import versions
    from harness.serving.instances import instance_behind_router
    from harness.workload import WorkloadError

    overrides = ["engine.prefix_caching=false", *a.overrides]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        # as the harness will compose it: bad input ends here, before the instance starts
        cfg = compose("config", overrides=["runner=serve", "workload=synthetic", f"workload.prompt_len={a.prompt_len}",
                                           f"workload.num_prompts={a.requests}", f"sampling.max_tokens={a.max_tokens}",
                                           *overrides])
    OmegaConf.resolve(cfg)
    try:
        settings, _ = checked_inputs(cfg)
    except (ConfigError, WorkloadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = a.out or ROOT / "results" / "bench" / time.strftime("crosscheck_%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    env = engine_env(cfg, settings.device, cfg.device.baseline_gpu)
    with instance_behind_router(engine_args(settings), env, out, cfg.run.startup_timeout_s) as (_, router):
        result = crosscheck(router.url, router.url, str(cfg.model.path), out, a.requests, a.vllm_requests,
                            a.prompt_len, a.max_tokens, (f"device={settings.device}", *overrides))
    write_json(out / "crosscheck.json", {"command": " ".join(["python scripts/bench_crosscheck.py", *sys.argv[1:]]),
                                         "versions": versions(settings.device), "device": settings.device, **result})
    for key, _ in KEYS:
        print(f"{key} p50: harness {result[f'harness_{key}_p50']:.2f} ms "
              f"({result['harness_requests_during']} requests while vLLM's ran), "
              f"vllm bench {result[f'vllm_{key}_p50']:.2f} ms ({result['vllm_requests']}): "
              f"ratio {result[f'{key}_ratio']:.3f}")
    q = f"ttft_ms_p{FAST_QUANTILE}"
    print(f"{q}: harness {result[f'harness_{q}']:.2f} ms, vllm bench {result[f'vllm_{q}']:.2f} ms: "
          f"ratio {result[f'{q}_ratio']:.3f}")
    print(f"outputs match the reference pass: {result['outputs_match']}; {out / 'crosscheck.json'}")
    if not result["harness_requests_during"]:
        print("error: no request of the harness's ran while vLLM's did (vLLM's client takes a few seconds to "
              "begin): raise --requests", file=sys.stderr)
        return 1
    return 0 if result["outputs_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
