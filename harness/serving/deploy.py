"""python -m harness.serving.deploy [overrides]: a P/D deployment left running for any OpenAI client.

    python -m harness.serving.deploy strategy=fused                       # prefill + decode behind the router
    python -m harness.serving.deploy strategy=layerwise serve.prefill_instances=2 serve.deploy_baseline=true

The same instances, engine arguments, connector configuration and router as runner=serve (whose
settings it takes: `serve.*`, `engine*`, `model`, `device`, `link`, ...), started, then left
serving until Ctrl-C or SIGTERM. It prints the router's URL (the P/D endpoint, an
OpenAI-compatible /v1/completions and /v1/chat/completions), each instance's, and where the
logs and the connectors' transfer records go (servers.json lists them): every request through
the router is moved by the strategy and its blocks digested on both sides, as in a run.
`serve.deploy_baseline=true` also starts the colocated baseline behind a router of its own.
Every instance and router is stopped on every way out. Exit codes: 0 (stopped by the user),
2 bad input (before anything starts), 3 an instance died.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import PROJECT_ROOT
from harness.checks import ConfigError, checked_inputs
from harness.records.files import write_json
from harness.serving.checks import check_instances
from harness.serving.deployment import ServingDeployment
from harness.serving.instances import InstanceDied
from harness.serving.load import LoadError
from harness.startup import stop_on_signals  # also the entry points' logging and resolvers
from harness.workload import WorkloadError


def deploy(cfg: DictConfig, run_dir: Path) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if cfg.runner.name != "serve":
            raise ConfigError(f"python -m harness.serving.deploy starts runner=serve's deployment, "
                              f"got runner={cfg.runner.name}")
        check_instances(cfg)
        if cfg.serve.endpoints.baseline is not None or cfg.serve.endpoints.disagg is not None:
            raise ConfigError("serve.endpoints: python -m harness.serving.deploy starts a deployment; "
                              "it has nothing to do with one that is already running")
        settings, _ = checked_inputs(cfg)
    except (ConfigError, WorkloadError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    deployment = ServingDeployment(settings, run_dir, baseline=bool(cfg.serve.deploy_baseline))
    code = 0
    try:
        t0 = time.monotonic()
        deployment.start(cfg.run.startup_timeout_s)
        write_json(run_dir / "endpoints.json", deployment.urls)
        lines = [f"[deploy] strategy={cfg.strategy.name}, model={cfg.model.name}, device={settings.device}: up in "
                 f"{time.monotonic() - t0:.0f} s", f"[deploy] P/D endpoint (the router): {deployment.urls['disagg']}"]
        if "baseline" in deployment.urls:
            lines.append(f"[deploy] colocated baseline: {deployment.urls['baseline']}")
        lines += [f"[deploy]   {name}: {server.url}" for name, server in deployment.servers.items()
                  if not name.endswith("router")]
        lines.append(f"[deploy] logs and transfer records in {run_dir}; Ctrl-C stops everything")
        print("\n".join(lines), flush=True)
        asyncio.run(deployment.watchdog())  # returns only by raising: an instance died
    except KeyboardInterrupt:
        print("\n[deploy] stopping", file=sys.stderr, flush=True)
    except InstanceDied as e:
        print(f"error: {e}", file=sys.stderr)
        code = 3
    finally:
        deployment.stop(grace_s=10)
    return code


@hydra.main(version_base="1.3", config_path=str(PROJECT_ROOT / "conf"), config_name="config")
def main(cfg: DictConfig) -> None:
    stop_on_signals()
    code = deploy(cfg, Path(HydraConfig.get().runtime.output_dir))
    if code:
        sys.exit(code)


if __name__ == "__main__":
    if not any(a.startswith(("runner=", "+runner=")) for a in sys.argv[1:]):
        sys.argv.insert(1, "runner=serve")
    main()
