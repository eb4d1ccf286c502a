"""What the project's router adds to TTFT (issue 13's target: at most 1 ms at p50): the same
requests sent straight to one `vllm serve` instance and through `python -m harness.serving.router` in
front of it, alternated request by request in one run so that both see the same machine.

    python scripts/bench_router.py [--requests 64] [--prompt-len 128] [--max-tokens 8] [--out DIR] [overrides ...]

Prints TTFT and E2E medians per path with their 95% bootstrap intervals, and the median of the
per-pair differences (router minus direct) with its interval; writes them with every pair to
results/bench/router_<time>/router.json (or DIR/router.json). The overrides choose the engine as for the harness
(default: the CPU, tiny-llama); one request in flight at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import harness.startup  # noqa: E402,F401 - the config's resolvers
from harness.checks import checked_inputs  # noqa: E402
from harness.engine_config import engine_args, engine_env  # noqa: E402
from harness.records.files import write_json  # noqa: E402
from harness.records.meta import versions  # noqa: E402
from harness.records.stats import Column, format_table, p50_with_interval  # noqa: E402
from harness.serving.instances import instance_behind_router  # noqa: E402
from harness.serving.load import ScheduledRequest, send_one  # noqa: E402


async def measure(direct: str, routed: str, model: str, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    pairs = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for i, prompt in enumerate(prompts):
            req = ScheduledRequest(i, i, prompt, 0.0)
            order = [("direct", direct), ("router", routed)]
            if i % 2:  # neither path always goes first
                order.reverse()
            pair = {"request": i}
            for name, url in order:
                r = await send_one(session, url, model, req, max_tokens, f"bench-{name}-{i}", time.monotonic())
                if r.status != "ok":
                    raise RuntimeError(f"request {i} via {name} failed: {r.error}")
                pair[f"{name}_ttft_ms"], pair[f"{name}_e2e_ms"] = r.t_first * 1e3, r.t_done * 1e3
            pair["ttft_diff_ms"] = pair["router_ttft_ms"] - pair["direct_ttft_ms"]
            pair["e2e_diff_ms"] = pair["router_e2e_ms"] - pair["direct_e2e_ms"]
            pairs.append(pair)
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: results/bench/router_<time>)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["workload=synthetic", f"workload.prompt_len={a.prompt_len}",
                                           f"workload.num_prompts={a.requests}", *a.overrides])
    OmegaConf.resolve(cfg)
    settings, workload = checked_inputs(cfg)
    out = a.out or ROOT / "results" / "bench" / time.strftime("router_%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    env = engine_env(cfg, settings.device, cfg.device.baseline_gpu)
    with instance_behind_router(engine_args(settings), env, out, cfg.run.startup_timeout_s) as (instance, router):
        prompts = [p.token_ids for p in workload.prompts]
        model = str(cfg.model.path)
        asyncio.run(measure(instance.url, router.url, model, prompts[:4], a.max_tokens))  # first use of both
        pairs = asyncio.run(measure(instance.url, router.url, model, prompts, a.max_tokens))
    figures = {}
    for key in ("direct_ttft_ms", "router_ttft_ms", "ttft_diff_ms", "direct_e2e_ms", "router_e2e_ms", "e2e_diff_ms"):
        figures.update(p50_with_interval([p[key] for p in pairs], f"{key}_p50"))
    rows = [{"what": name, **{f"p50{e}": figures[f"{name}_p50{e}"] for e in ("", "_lo", "_hi")}}
            for name in ("direct_ttft_ms", "router_ttft_ms", "ttft_diff_ms", "direct_e2e_ms", "router_e2e_ms",
                         "e2e_diff_ms")]
    print(format_table(rows, [Column("what"), Column("p50 ms", "p50", ".3f", interval=True)]))
    write_json(out / "router.json", {"command": " ".join(["python scripts/bench_router.py", *sys.argv[1:]]),
                                     "versions": versions(settings.device), "device": settings.device,
                                     "requests": len(pairs),
                                     "prompt_len": a.prompt_len, "max_tokens": a.max_tokens, **figures,
                                     "pairs": pairs})
    print(f"router adds {figures['ttft_diff_ms_p50']:.3f} ms to TTFT at p50 "
          f"[{figures['ttft_diff_ms_p50_lo']:.3f}, {figures['ttft_diff_ms_p50_hi']:.3f}] over {len(pairs)} pairs; "
          f"{out / 'router.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
