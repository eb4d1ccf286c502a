"""The configs, without engines: every command the README and docs/*.md show and every override
the configs' comments show composes as written (Hydra's compose API on conf/, as `python -m
harness` composes it, a sweep's comma lists expanded into its jobs), and passes the harness's own
checks of values; the namespaces (strategy params, check, transport) reach the connectors as agreed."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import harness.benchmark as bench
from harness import resolvers
from harness.checks import ConfigError, check_parallelism, check_settings
from harness.engine_config import transfer_config
from harness.engine_process import VLLM_ON_CPU
from harness.offline.deployment import handoff_params
from harness.resolvers import built_in_strategies
from harness.settings import settle
from tests.helpers.config import compose_job
from transfer_strategies.connector_config import ConnectorConfig, ObserverParams, TransportSettings

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
resolvers.register()



def jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of a command line: one, or one per point of a sweep's comma lists."""
    choices = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            choices.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(job) for job in itertools.product(*choices)]


def missing(cfg) -> list[str]:
    """The values still ??? (Hydra's own are filled in when it runs), found without resolving."""
    def walk(node, prefix):
        if isinstance(node, dict):
            return [k for key, v in node.items() if key != "hydra" for k in walk(v, f"{prefix}{key}.")]
        return [prefix[:-1]] if node == "???" else []

    return walk(OmegaConf.to_container(cfg, resolve=False), "")


# ---------------------------------------------------------------------- what the docs show
# The README and the reference pages show their commands in indented code (4 spaces); fenced
# blocks are for code in other languages (test_the_docs_show_commands_in_indented_code_only).
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_lines(doc: Path) -> list[str]:
    """A document's indented code lines, continuation lines joined."""
    text = doc.read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.startswith("    ")]


def without_comment(line: str) -> str:
    return line.split(" #", 1)[0]


def shown(pattern: str) -> list[tuple[str, list[str]]]:
    """(document, arguments) for each code line of the README and docs/ that runs what `pattern`
    matches: the arguments are what follows the match, its comment left out."""
    return [(doc.relative_to(ROOT).as_posix(), shlex.split(without_comment(m.group(1))))
            for doc in DOCS for line in code_lines(doc) if (m := re.search(pattern, line))]


def harness_commands() -> list[tuple[str, list[str]]]:
    """`python -m harness` (or python3) lines, not harness.serving.*: below."""
    return [(doc, [a for a in args if a not in ("-m", "--multirun")])
            for doc, args in shown(r"python3? -m harness(?![.\w])(.*)")]


def router_commands() -> list[tuple[str, list[str]]]:
    return shown(r"python3? -m harness\.serving\.router\b(.*)")


def test_the_docs_show_commands_in_indented_code_only():
    """The tests here read indented code lines: a command in a fenced shell block would go
    unchecked, so a fence opens only a block of another language (docs/strategies.md's Python)."""
    for doc in DOCS:
        fence = None
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = line.strip()[3:] if fence is None else None
                assert fence is None or fence == "python", f"{doc.relative_to(ROOT)}:{n}: {line.strip()}"


def test_every_documented_router_command_is_accepted():
    from harness.serving.router import argument_parser

    assert router_commands()
    for _, args in router_commands():
        a = argument_parser().parse_args(args)
        assert a.prefill and a.decode


def test_every_documented_deploy_command_composes_as_runner_serve_and_passes_the_checks():
    """python -m harness.serving.deploy: runner=serve's configuration (the entry point puts runner=serve
    first), its instance counts checked as deploy checks them; the test deployment of
    tests/test_serve_deployment.py runs the README's 2P2D one."""
    from harness.serving.checks import check_instances
    from tests.helpers.serving import DEPLOY

    commands = [args for _, args in shown(r"python3? -m harness\.serving\.deploy\b(.*)")]
    assert len(commands) >= 2 and list(DEPLOY) in commands
    for args in commands:
        cfg = compose_job(["runner=serve", *args])
        assert cfg.runner.name == "serve" and not missing(cfg)
        check_settings(cfg)
        check_instances(cfg)


def bench_commands() -> list[tuple[str, str, list[str], bool]]:
    commands = []
    for doc, args in shown(r"scripts/bench_strategies\.py\b(.*)"):
        a = bench.argument_parser().parse_args(args)
        commands.append((doc, a.experiment, a.overrides, a.two_gpus))
    return commands


def context(path: Path) -> list[str]:
    """The overrides that select a config file, so that what its comments show applies to it."""
    parts = path.relative_to(CONF).with_suffix("").parts
    if len(parts) == 1:
        return []
    if parts[0] == "experiment" and len(parts) == 3:  # an experiment's settings for one strategy
        return [f"experiment={parts[1]}", f"strategy={parts[2]}"]
    return ["/".join(parts[:-1]) + "=" + parts[-1]]


def clean(token: str) -> str:
    token = token.strip("`").rstrip(".,;:")
    for open_, close in ("()", "[]"):  # prose around an override: "(device.decode_gpu=1)", "[workload.field=prompt]"
        if token.startswith(open_) and (token.endswith(close) or token.count(open_) > token.count(close)):
            token = token[1:]
        if token.endswith(close) and token.count(close) > token.count(open_):
            token = token[:-1]
    return token


def yaml_comment_overrides() -> list[tuple[str, list[str]]]:
    """(where, overrides): each `python -m harness` command in a comment as it stands, and each
    other key=value a comment shows with the overrides that select its file."""
    found = []
    for path in sorted(CONF.rglob("*.yaml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "#" not in line:
                continue
            comment = line.split("#", 1)[1]
            where = f"{path.relative_to(ROOT)}:{n}"
            command = re.match(r"\s*python -m harness(\s.*|$)", comment)
            if command:
                found.append((where, [a for a in shlex.split(command.group(1)) if a not in ("-m", "--multirun")]))
                continue
            for token in comment.split():
                if "=" in token and not token.startswith("-"):
                    found.append((where, [*context(path), clean(token)]))
    return found


DOC_COMMANDS = harness_commands()
YAML_OVERRIDES = yaml_comment_overrides()


def test_the_docs_show_what_is_composed_below():
    """The extraction itself: it finds what the README, docs/ and the configs document."""
    flat = [" ".join(c) for _, c in DOC_COMMANDS]
    assert len(DOC_COMMANDS) >= 8 and any("transport=gloo" in c for c in flat)
    assert any("check.corrupt=true" in c for c in flat) and any("hydra/launcher=slurm" in c for c in flat)
    assert {"README.md", "docs/configuration.md", "docs/strategies.md", "docs/serving.md",
            "docs/transports.md"} <= {doc for doc, _ in DOC_COMMANDS}
    in_comments = {o[-1] for _, o in YAML_OVERRIDES}
    assert {"strategy.params.granularity=block", "tracking.mode=online", "check.corrupt=true",
            "transport.staging_mb=1024", "bench.lengths=[32,2048]", "hydra.launcher.gpus_per_node=2"} <= in_comments
    assert len(bench_commands()) >= 3 and {"README.md", "docs/benchmarking.md"} <= {c[0] for c in bench_commands()}


@pytest.mark.parametrize("doc,overrides", DOC_COMMANDS, ids=[f"{d}: {' '.join(o)}" for d, o in DOC_COMMANDS])
def test_every_documented_command_composes_and_passes_the_checks(doc, overrides):
    for job in jobs(overrides):
        cfg = compose_job(job)
        assert not missing(cfg), f"a command {doc} shows must be complete"
        check_settings(cfg)
        check_parallelism(cfg)


@pytest.mark.parametrize("where,overrides", YAML_OVERRIDES, ids=[w for w, _ in YAML_OVERRIDES])
def test_every_override_in_the_configs_comments_composes(where, overrides):
    for job in jobs(overrides):
        cfg = compose_job(job)
        if not missing(cfg):  # e.g. an override shown for strategy=custom, whose module is the user's
            check_settings(cfg)


@pytest.mark.parametrize("doc,experiment,overrides,two_gpus", bench_commands())
def test_every_documented_benchmark_command_composes(doc, experiment, overrides, two_gpus):
    plan = bench.Plan.compose(experiment, overrides, two_gpus)
    assert plan.lengths and plan.strategies
    for strategy in plan.strategies:
        check_settings(compose_job(plan.harness_overrides(strategy, Path("/tmp/prompts.jsonl"))))


def test_the_wandb_sweep_grid_composes():
    sweep = OmegaConf.to_container(OmegaConf.load(CONF / "wandb_sweep.yaml"), resolve=False)  # ${env}: wandb's
    fixed = [a for a in sweep["command"] if "=" in a]
    grid = [[f"{k}={v}" for v in p["values"]] for k, p in sweep["parameters"].items()]
    assert sweep["parameters"]["strategy"]["values"] == built_in_strategies()  # wandb reads no resolver
    for point in itertools.product(*grid):
        check_settings(compose_job([*fixed, *point]))


def test_an_override_that_does_not_compose_fails_here():
    """The tests above fail on a documented override that does not compose (as the README's own
    `strategy.params.transport=gloo` once did)."""
    with pytest.raises(Exception, match="strategy.params.transport"):
        compose_job(["strategy.params.transport=gloo"])


# ---------------------------------------------------------------------- namespaces
def test_each_strategy_declares_its_params():
    for path in sorted((CONF / "strategy").glob("*.yaml")):
        cfg = compose_job([f"strategy={path.stem}"] + (["strategy.module=m", "strategy.connector=C"]
                                                        if path.stem == "custom" else []))
        assert OmegaConf.is_dict(cfg.strategy.params) or path.stem == "custom", path.name
        assert "verify" not in cfg.strategy, "digests are check.digests now"
    assert compose_job(["strategy=per_request_blocks"]).strategy.params.granularity == "layer"


def test_our_connectors_get_harness_strategy_and_transport_sections(tmp_path):
    cfg = compose_job(["strategy=per_request_blocks", "strategy.params.granularity=block", "transport=gloo",
                       "check.corrupt=true", "run.transfer_timeout_s=7"])
    kv = transfer_config(settle(cfg, "cpu"), "decode", tmp_path / "port", tmp_path / "decode.jsonl")
    assert kv["kv_role"] == "kv_consumer" and kv["kv_connector_module_path"] == "transfer_strategies.per_request_blocks"
    extra = kv["kv_connector_extra_config"]
    assert extra["strategy"] == {"granularity": "block"}
    assert extra["transport"] == {"kind": "gloo", "staging_mb": None, "address": None, "ifname": None,
                                  "buffer_device": None}
    assert extra["harness"] == {"rendezvous": str(tmp_path / "port"), "host": "127.0.0.1",
                                "stats_path": str(tmp_path / "decode.jsonl"), "verify": True,
                                "checksums": False, "timeout_s": 7.0, "startup_timeout_s": 600.0,
                                "decode_submit": "early", "prefill_tp": 1, "decode_tp": 1}
    staged = transfer_config(settle(compose_job(["transport.staging_mb=64", "check.digests=false"]), "cpu"), "prefill",
                             tmp_path / "p", tmp_path / "s")["kv_connector_extra_config"]
    assert staged["transport"] == {"kind": "staged", "staging_mb": 64, "address": None, "ifname": None,
                                   "buffer_device": None}
    assert staged["harness"]["verify"] is False


def test_a_fault_scenario_reaches_the_requests_and_vllms_failure_policy_both_engines(tmp_path):
    cfg = compose_job(["scenario=fault_flip"])
    prefill, decode = (transfer_config(settle(cfg, "cpu"), e, tmp_path / "p", tmp_path / "s")
                       for e in ("prefill", "decode"))
    # the fault travels with each faulted prefill request (tests/test_faults.py), not in the engines'
    # configuration: the same engine pair serves the real and the faulted runs
    plain = compose_job(["check.checksums=true", "run.transfer_timeout_s=5", "run.kv_load_failure_policy=recompute"])
    assert prefill == transfer_config(settle(plain, "cpu"), "prefill", tmp_path / "p", tmp_path / "s")
    assert prefill["kv_load_failure_policy"] == decode["kv_load_failure_policy"] == "recompute"
    assert decode["kv_connector_extra_config"]["harness"]["checksums"] is True


def test_vllm_connectors_get_their_params_flat(tmp_path):
    cfg = compose_job(["strategy=vllm_nixl", "check.digests=false"])
    kv = transfer_config(settle(cfg, "cpu"), "prefill", tmp_path / "p", tmp_path / "s")
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {}}


def test_an_observed_vllm_connector_goes_first_beside_the_observer(tmp_path):
    """strategy=vllm_nixl with check.digests (the default), offline: vLLM's MultiConnector loads
    through NIXL (first, its params flat as above) and calls the observer beside it, which takes
    this project's harness section and writes the records as the side it is on."""
    cfg = compose_job(["strategy=vllm_nixl"])
    for engine, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        kv = transfer_config(settle(cfg, "cpu"), engine, tmp_path / "p", tmp_path / engine)
        nixl, observer = kv["kv_connector_extra_config"]["connectors"]
        assert kv["kv_connector"] == "MultiConnector" and kv["kv_role"] == "kv_both"
        assert nixl == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {}}
        assert observer["kv_connector"] == "KVObserver" and observer["kv_role"] == role
        config = ConnectorConfig.parse(observer["kv_connector_extra_config"], ObserverParams)
        assert config.strategy.observed == "NixlConnector" and config.harness.stats_path == str(tmp_path / engine)
    unchecked = compose_job(["strategy=vllm_nixl", "check.digests=false"])  # nothing to observe for
    assert transfer_config(settle(unchecked, "cpu"), "decode", tmp_path / "p", tmp_path / "s")["kv_connector"] == \
        "NixlConnector"


def test_mooncake_starts_through_its_cpu_class_and_decode_requests_name_the_prefill_engine(tmp_path):
    """strategy=vllm_mooncake: on the CPU vLLM loads MooncakeConnector from vllm_on_cpu (first in
    the MultiConnector, whose own class is vLLM's), elsewhere from its registry; the prefill engine
    has the id decode requests name, beside its bootstrap server's address (handoff bootstrap)."""
    cfg = compose_job(["strategy=vllm_mooncake"])
    prefill, decode = (transfer_config(settle(cfg, "cpu"), e, tmp_path / "p", tmp_path / e)
                       for e in ("prefill", "decode"))
    mooncake = prefill["kv_connector_extra_config"]["connectors"][0]
    assert "kv_connector_module_path" not in prefill and prefill["engine_id"] == "prefill"
    assert "engine_id" not in mooncake
    assert mooncake["kv_connector_module_path"] == "transfer_strategies.vllm_on_cpu" == VLLM_ON_CPU
    assert mooncake["kv_connector_extra_config"] == {"mooncake_protocol": "tcp", "num_workers": 2}
    assert "engine_id" not in decode
    assert decode["kv_connector_extra_config"]["connectors"][0]["kv_role"] == "kv_consumer"
    on_gpu = transfer_config(settle(cfg, "cuda"), "prefill", tmp_path / "p", tmp_path / "s")
    assert "kv_connector_module_path" not in on_gpu["kv_connector_extra_config"]["connectors"][0]
    asked = handoff_params(cfg.strategy, "decode", "t-1", None, records=tmp_path / "d", bootstrap="http://127.0.0.1:9")
    assert asked["remote_engine_id"] == "prefill" and asked["remote_bootstrap_addr"] == "http://127.0.0.1:9"
    assert asked["do_remote_prefill"] is True and asked["transfer_id"] == "t-1"
    assert handoff_params(cfg.strategy, "prefill", "t-1", None)["do_remote_decode"] is True


@pytest.mark.parametrize("overrides,message", [
    (["+strategy.params.corrupt=true"], "use check.corrupt"),
    (["+strategy.params.transport=gloo"], "use transport=staged|gloo"),
    (["strategy=per_request_blocks", "+strategy.params.timeout_s=5"], "use run.transfer_timeout_s"),
    (["+strategy.params.rendezvous=/x"], "the harness sets it"),
    (["strategy=vllm_example", "check.corrupt=true"], "vLLM's own ExampleConnector"),
    (["sampling.max_tokens=0"], "sampling.max_tokens must be an integer >= 1"),
    (["sampling.max_tokens=-1"], "sampling.max_tokens must be an integer >= 1"),
    (["engine.block_size=0"], "engine.block_size must be a positive integer"),
    (["engine.kv_cache_gib=0"], "engine.kv_cache_gib must be > 0"),
    (["transport.staging_mb=0"], "transport.staging_mb must be a positive integer"),
    (["run.warmup_requests=-1"], "run.warmup_requests must be an integer >= 0"),
])
def test_values_the_harness_refuses(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_settings(compose_job(overrides))


def test_a_gpu_run_over_gloo_is_refused_before_any_engine_starts():
    from harness.checks import check_transport

    with pytest.raises(ConfigError, match=re.escape("on cuda use transport=staged (CUDA IPC, one host) or "
                                                    "transport=nixl")):
        check_transport(compose_job(["transport=gloo", "link=veth"]), "cuda")
    check_transport(compose_job(["transport=gloo"]), "cpu")
    check_transport(compose_job(["transport=nixl", "link=veth"]), "cuda")
    check_transport(compose_job(["strategy=vllm_nixl", "transport=gloo"]), "cuda")  # vLLM's own: not our channel
    with pytest.raises(ConfigError, match="transport.buffer_device=cuda puts NIXL's buffers on a GPU"):
        check_transport(compose_job(["transport=nixl", "transport.buffer_device=cuda"]), "cpu")


def test_ucx_is_told_tcp_on_the_links_interface_with_cuda_copy_on_a_gpu(monkeypatch):
    from harness.engine_config import engine_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what a GPU engine's env is built from
    cfg = compose_job(["transport=nixl", "transport.ifname=kv0"])
    assert engine_env(cfg, "cpu", 0, "decode")["UCX_TLS"] == "tcp"
    cuda = engine_env(cfg, "cuda", 0, "prefill")
    assert (cuda["UCX_TLS"], cuda["UCX_NET_DEVICES"], cuda["GLOO_SOCKET_IFNAME"]) == ("tcp,cuda_copy", "kv0", "kv0")
    # no link: UCX picks
    assert "UCX_TLS" not in engine_env(compose_job(["transport=nixl"]), "cuda", 0, "prefill")


def test_nixl_buffers_are_pinned_host_memory_where_a_gpus_kv_crosses_a_link():
    from transfer_strategies.transport import nixl_on_host

    link, here = TransportSettings("nixl", ifname="kv0"), TransportSettings("nixl")
    assert nixl_on_host(link, "cuda") and not nixl_on_host(here, "cuda")  # UCX's TCP moves GPU memory slowly
    assert not nixl_on_host(link, "cpu")  # the KV is in host memory already
    assert not nixl_on_host(TransportSettings("nixl", ifname="kv0", buffer_device="cuda"), "cuda")
    assert nixl_on_host(TransportSettings("nixl", buffer_device="cpu"), "cuda")


def test_a_vllm_connector_may_take_any_param_name():
    check_settings(compose_job(["strategy=vllm_nixl", "+strategy.params.timeout_s=5"]))


def test_transport_and_check_defaults():
    cfg = compose_job([])
    assert cfg.transport == {"kind": "staged", "staging_mb": None, "address": None, "ifname": None}
    assert cfg.check == {"digests": True, "corrupt": False, "checksums": False, "max_accuracy_drop": None}
    assert compose_job(["transport=gloo"]).transport.kind == "gloo"


def test_layerwise_asks_for_piecewise_graphs_only_where_a_decode_step_loads_while_it_runs():
    from harness.engine_config import transfer_config
    from transfer_strategies.layerwise import LayerwiseConnector

    for submit, piecewise in (("early", False), ("after_prefill", True)):
        cfg = compose_job(["strategy=layerwise", f"run.decode_submit={submit}"])
        for engine in ("prefill", "decode"):
            extra = transfer_config(settle(cfg, "cpu"), engine, Path("/tmp/port"), Path("/tmp/stats.jsonl"))
            extra = extra["kv_connector_extra_config"]
            assert extra["harness"]["decode_submit"] == submit
            assert LayerwiseConnector.requires_piecewise_for_cudagraph(extra) is piecewise


def test_a_kv_cache_dtype_other_than_the_baselines_makes_a_run_lossy():
    from harness.settings import stored_kv_dtype

    assert stored_kv_dtype(compose_job([])) is None
    assert stored_kv_dtype(compose_job(["engines.decode={kv_cache_dtype:fp8}"])) == "fp8"
    assert stored_kv_dtype(compose_job(["engine.extra={kv_cache_dtype:fp8}"])) is None  # the baseline's too
