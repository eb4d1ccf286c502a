"""Bad input stops before any engine starts: exit 2, one line on stderr that says what to do,
summary.json status bad_input. (Hydra's own refusals, such as an unknown group choice, exit 1.)

Each case runs the harness's run in this process (conftest.refused_in_process: the composed
config, the runner's own code, stderr captured, any engine start a failure): a `python -m
harness` process a case cost 1.5 s where the config is judged before vLLM is imported and 17-39
s where a connector is loaded, 446 s for this file on the 2-core machine. The command line's
contract (Hydra's parsing, the exit code, one line on stderr) is proven by the subprocess tests
at the end, and by test_entry_point.py for the console script."""

import json
import os
import shutil

import psutil
import pytest
from hydra.errors import MissingConfigException

from tests.conftest import ROOT, compose_config, refused_in_process, run_harness, write_token_prompts
from tests.helpers.runs import assert_bad_input, no_engine_started

# vLLM is imported once, in this process (a connector's checks load it)
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("override,choice", [("strategy=nope", "fused"), ("model=nope", "tiny_llama"),
                                             ("workload=nope", "synthetic")])
def test_an_unknown_choice_lists_the_choices(override, choice):
    with pytest.raises(MissingConfigException) as refused:
        compose_config(override)
    assert choice in str(refused.value) and override.split("=")[1] in str(refused.value)


def test_missing_model_path(tmp_path):
    assert_bad_input(refused_in_process(tmp_path / "r", "model=hf", f"model.path={tmp_path}/no-such-model"),
                     "does not exist", "model.path")


def test_model_directory_without_weights(tmp_path):
    """models/llama3-8b-kv commits everything but its weights (made on the GPU machine)."""
    model = tmp_path / "no-weights"
    model.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        shutil.copy(ROOT / "models" / "llama3-8b-kv" / f, model / f)
    assert_bad_input(refused_in_process(tmp_path / "r", "model=llama3_8b_kv", f"model.path={model}"),
                     f"model directory {model} has no weights", "README.md says how to make them",
                     "model.load_format=dummy")
    # its committed config still serves the checks that read it: 8 KV heads
    assert_bad_input(refused_in_process(tmp_path / "s", "model=llama3_8b_kv", f"model.path={model}",
                                 "engines.decode={tensor_parallel_size:3}"), "the model's 8 KV heads")


def test_prompt_longer_than_max_model_len(tmp_path):
    prompts = write_token_prompts(tmp_path / "p.jsonl", [[5] * 10, [7] * 200])
    run = refused_in_process(tmp_path / "r", "workload=jsonl", f"workload.path={prompts}", "engine.max_model_len=128")
    assert run.code == 2
    assert "prompt 1" in run.stderr and "engine.max_model_len" in run.stderr
    assert no_engine_started(run)


def test_custom_strategy_module_missing(tmp_path):
    run = refused_in_process(tmp_path / "r", "strategy=custom", "strategy.module=no_such_pkg.mod",
                             "strategy.connector=X")
    assert run.code == 2 and "no_such_pkg.mod" in run.stderr


def test_strategy_package_not_installed(tmp_path):
    run = refused_in_process(tmp_path / "r", "strategy=vllm_nixl", "strategy.requires=[no_such_package_xyz]")
    assert run.code == 2 and "no_such_package_xyz" in run.stderr and "make setup" in run.stderr
    assert no_engine_started(run)


@pytest.mark.parametrize("overrides,words", [
    (["workload=jsonl"], ["workload.path"]),                                    # not given
    (["workload=jsonl", "workload.path=/no/such/prompts.jsonl"], ["not found", "workload.path"]),
    (["workload=synthetic", "workload.num_prompts=0"], ["workload.num_prompts", "got 256 and 0"]),
    (["workload=smoke", "workload.prompt_len=0"], ["workload.prompt_len must be >= 1"]),
    (["workload.concurrency=0"], ["workload.concurrency must be >= 1"]),
    (["workload=multiturn", "workload.turns=0"], ["workload.turns", "must be >= 1"]),
    (["workload=multiturn", "workload.turns=20", "engine.max_model_len=256"],
     ["conversation 0", "engine.max_model_len >= ", "workload.turns"]),
])
def test_workload_errors_raised_inside_hydras_instantiate(tmp_path, overrides, words):
    """The builders run inside Hydra's instantiate, which wraps what they raise."""
    assert_bad_input(refused_in_process(tmp_path / "r", *overrides), *words)


@pytest.mark.parametrize("rows,words", [
    ('{"prompt": [5, 6]}\n{"prompt": [7, \n', ["p.jsonl:2", "JSON object"]),         # malformed line
    ('{"prompt": [5, 6]}\n{"text": "hi"}\n', ["p.jsonl:2", "'prompt' field"]),    # a row without the field
    ('{"prompt": [5, -1]}\n', ["p.jsonl:1", "token ids"]),                         # not token ids
    ("\n\n", ["has no prompts"]),                                                  # empty
])
def test_malformed_jsonl(tmp_path, rows, words):
    (tmp_path / "p.jsonl").write_text(rows)
    run = refused_in_process(tmp_path / "r", "workload=jsonl", f"workload.path={tmp_path / 'p.jsonl'}")
    assert_bad_input(run, *words)


@pytest.mark.parametrize("max_tokens", ["0", "-1"])
def test_max_tokens_below_one(tmp_path, max_tokens):
    assert_bad_input(refused_in_process(tmp_path / "r", f"sampling.max_tokens={max_tokens}"), "sampling.max_tokens",
                     f"got {max_tokens}")


def test_a_block_size_vllm_refuses(tmp_path):
    """vLLM 0.32's CPU attention takes multiples of 32 (16 in 0.26): 16 would fail in all three engines."""
    assert_bad_input(refused_in_process(tmp_path / "r", "engine.block_size=16"), "engine.block_size=16",
                     "multiples of 32", "engine.block_size=32")


def test_vllm_example_with_a_prompt_under_one_block(tmp_path):
    """vLLM's ExampleConnector keys its files by whole blocks: the seed's short prompts have none."""
    assert_bad_input(refused_in_process(tmp_path / "r", "strategy=vllm_example"), "prompt 0", "strategy 'vllm_example'",
                     "at least 34")
    prompts = write_token_prompts(tmp_path / "p.jsonl", [[5] * 40, [6] * 33])
    assert_bad_input(refused_in_process(tmp_path / "s", "strategy=vllm_example", "workload=jsonl",
                                        f"workload.path={prompts}"), "prompt 1", "has 33 tokens")


@pytest.mark.parametrize("overrides,words", [
    (["+strategy.params.corrupt=true"], ["strategy.params.corrupt", "check.corrupt"]),
    (["+strategy.params.transport=gloo"], ["strategy.params.transport", "transport="]),
    # checked against the class's Params (was an engine dying at its first send, exit 3)
    (["strategy=per_request_blocks", "strategy.params.granularity=x"],
     ["strategy.params.granularity must be one of 'layer', 'block'", "'x'"]),
    (["strategy=vllm_example", "check.corrupt=true", "workload=synthetic"], ["check.corrupt", "ExampleConnector"]),
    # the observer that would damage NIXL's KV digests it: not there without digests
    (["strategy=vllm_nixl", "check.corrupt=true", "check.digests=false"], ["check.corrupt", "unobserved here"]),
    (["model=hf"], ["model.path has no value"]),
    (["strategy=vllm_nixl", "run.decode_submit=early"], ["run.decode_submit=early", "after_prefill"]),
    (["strategy=vllm_lmcache"], ["strategy 'vllm_lmcache' is not available", "CUDA", "docs/strategies.md"]),
    (["strategy=vllm_nixl", "strategy.handoff=pull"], ["handoff 'pull' is one of push", "relay", "bootstrap"]),
    # a package whose native module does not load (Mooncake's engine without libibverbs): named, before any engine
    (["strategy=vllm_mooncake", "strategy.requires=[json.no_such_module]"],
     ["'json.no_such_module'", "does not import"]),
    (["run.decode_submit=later"], ["run.decode_submit must be early, after_prefill or null", "'later'"]),
    (["run.kv_load_failure_policy=retry"], ["run.kv_load_failure_policy must be fail, recompute or null"]),
    (["run.keep_engine_sets=0"], ["run.keep_engine_sets must be an integer >= 1", "got 0"]),
    (["scenario=fault_drop", "scenario.fault.kind=lose"], ["scenario.fault.kind must be one of", "'lose'"]),
    (["scenario=fault_drop", "scenario.fault.every=0"], ["scenario.fault.every must be an integer >= 1"]),
    (["scenario=fault_drop", "strategy=vllm_nixl"], ["scenario.fault is injected by this project's connectors"]),
    (["scenario=fault_drop", "runner=serve", "serve.endpoints.baseline=http://127.0.0.1:9",
      "serve.endpoints.disagg=http://127.0.0.1:9"], ["scenario=fault_drop", "serve.endpoints has none"]),
    (["scenario=aborts", "scenario.aborts.fraction=1.5"], ["scenario.aborts needs a fraction in (0, 1]"]),
    (["scenario=fault_drop", "scenario.expect.faults_injected=at least one"],
     ["scenario.expect.faults_injected", "is not a condition"]),
    (["engines.decode={tensor_parallel_size:3}"], ["decode engine", "tensor_parallel_size=3 does not divide the "
                                                   "model's 2 KV heads"]),
    (["engines.prefill={pipeline_parallel_size:2}"], ["pipeline_parallel_size=2 on the prefill engine"]),
    (["engines.decode={block_size:64}"], ["block_size differs between the prefill engine (32) and the decode engine "
                                          "(64)", "engine.block_size"]),
    (["engines.prefill={dtype:bfloat16}"], ["dtype differs"]),
    (["check.max_accuracy_drop=2"], ["check.max_accuracy_drop must be a number from 0 to 1", "got 2"]),
    (["strategy=chunkwise", "engines.prefill={tensor_parallel_size:2}"],
     ["strategy 'chunkwise' sends messages whose count is known only at the last one", "(got 2 and 1)"]),
    (["strategy=fused_fp8", "strategy.params.scale=layer"], ["strategy.params.scale must be one of 'block', 'token'"]),
    (["strategy=fused_int4", "strategy.params.channels=-2"], ["strategy.params.channels must be >= 0"]),
    (["transport.kind=bogus"], ["transport.kind must be one of 'staged', 'gloo', 'nixl'", "'bogus'"]),
    (["workload=trace", f"workload.path={ROOT / 'tests' / 'data' / 'trace.jsonl'}"],
     ["workload 'trace' replays its arrival times and output lengths", "runner=serve"]),
])
def test_settings_that_moved_or_do_not_apply(tmp_path, overrides, words):
    assert_bad_input(refused_in_process(tmp_path / "r", *overrides), *words)


def test_an_unknown_group_choice_is_hydras_exit_1(tmp_path):
    run = run_harness(tmp_path / "r", "transport=nope", subprocess_only=True)
    assert run.code == 1 and "Could not find 'transport/nope'" in run.stderr and "staged" in run.stderr
    assert not (tmp_path / "r" / "summary.json").exists()


# ---------------------------------------------------------------- the command line's contract, in a process each
def test_bad_input_on_the_command_line_is_exit_2_and_one_line(tmp_path):
    run = run_harness(tmp_path / "r", "sampling.max_tokens=0", subprocess_only=True)
    assert_bad_input(run, "sampling.max_tokens")
    assert json.loads((run.run_dir / "summary.json").read_text())["error"].startswith("sampling.max_tokens")


def started_under(tag: str) -> list[str]:
    """Processes on this machine whose environment carries HARNESS_TEST_TAG=tag: a run started with
    it and everything it started (the engines' server inherits it), and no other run's."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.environ().get("HARNESS_TEST_TAG") == tag:
                found.append(" ".join(p.info["cmdline"] or ()) or str(p.pid))
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def test_a_refusal_after_the_engines_server_started_leaves_no_process(tmp_path):
    """On CPU the server the engines are forked from starts while the run is checked, its import of
    vLLM beside the checks' own (engine_config.start_engine_server); a refusal known only after that
    (a prompt too long for the engine, once the tokenizer is loaded) still leaves nothing running:
    the server, importing for seconds more, is stopped as the process exits. Only this run's
    processes are looked for (its tag): other runs on the machine may start and stop servers."""
    tag = f"refusal-{os.getpid()}-{tmp_path.name}"
    prompts = write_token_prompts(tmp_path / "p.jsonl", [[7] * 200])
    run = run_harness(tmp_path / "r", "workload=jsonl", f"workload.path={prompts}", "engine.max_model_len=128",
                      env={"HARNESS_TEST_TAG": tag})
    assert_bad_input(run, "engine.max_model_len")
    assert started_under(tag) == []


def test_bad_input_is_judged_before_vllm_is_imported(tmp_path):
    """vLLM's import took 4.6 of the 6.7 s a bad-input run took, for one constant (the early
    submission's kv_transfer_params key): those keys live in transfer_strategies/kv_transfer_params.py."""
    run = run_harness(tmp_path / "r", "engine.block_size=-3", env={"PYTHONPROFILEIMPORTTIME": "1"})
    imported = [line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]
    assert run.code == 2 and "engine.block_size" in run.stderr
    assert "harness.offline.run" in imported and not [m for m in imported if m == "vllm" or m.startswith("vllm.")]


def test_a_hybrid_model_takes_strategies_that_move_its_pages_whole(tmp_path):
    """models/tiny-hybrid (Gated DeltaNet layers beside attention): a strategy that streams by
    layer or chunk, or compresses, and tensor parallelism are refused (transfer_strategies/kv_groups.py)."""
    hybrid = ["model=tiny_hybrid"]
    assert_bad_input(refused_in_process(tmp_path / "l", *hybrid, "strategy=layerwise"),
                     "strategy 'layerwise' streams", "use strategy=fused")
    assert_bad_input(refused_in_process(tmp_path / "c", *hybrid, "strategy=fused_int8"),
                     "strategy 'fused_int8' compresses", "(hybrid)")
    assert_bad_input(refused_in_process(tmp_path / "t", *hybrid, "engines.decode={tensor_parallel_size:2}"),
                     "tensor parallelism is not built", "tensor_parallel_size=1")


def test_an_mla_model_on_the_cpu_takes_blocks_of_16(tmp_path):
    """vLLM 0.32's CPU MLA kernel takes blocks of 16 only (the default is 32)."""
    model = tmp_path / "mla"
    model.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "models" / "tiny-llama" / f, model / f)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 256, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64}))
    mla = ["model=hf", f"model.path={model}", "model.load_format=dummy", "model.dtype=float32"]
    assert_bad_input(refused_in_process(tmp_path / "r", *mla, "engines.decode={tensor_parallel_size:2}"),
                     "engine.block_size=32", "CPU MLA attention takes blocks of 16", "engine.block_size=16")
