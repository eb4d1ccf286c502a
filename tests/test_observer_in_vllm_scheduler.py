"""The observer (transfer_strategies/observer.py) beside vLLM's NixlConnector in vLLM's own
scheduler, without engines: the harness's kv_transfer_config for strategy=vllm_nixl builds a real
Scheduler per side (vLLM's MultiConnector, NIXL's scheduler side, the observer's), and the steps a
worker would report are fed back to it, as vLLM's own connector unit tests do. What it proves in
seconds that the engine tests prove in minutes: which blocks each side's worker is told to digest,
and when; the decode side only once NIXL reported the load done, past its own prefix-cache hits."""

import pytest
import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from harness.engine_config import connector_env, transfer_config
from harness.offline.deployment import handoff_params
from harness.records.files import read_jsonl
from harness.settings import settle
from tests.conftest import ROOT, compose_config

BLOCK = 32
PROMPT = list(range(3, 3 + 2 * BLOCK + 5))  # two whole blocks and five tokens


@pytest.fixture
def sides(tmp_path, monkeypatch):
    """A prefill and a decode Scheduler configured as the harness configures the engines."""
    cfg = compose_config("strategy=vllm_nixl", f"engine.block_size={BLOCK}")
    settings = settle(cfg, "cpu")
    init_none_hash(sha256)
    made = {}
    for engine in ("prefill", "decode"):
        for key, value in connector_env(settings, engine).items():
            monkeypatch.setenv(key, value)
        ktc = transfer_config(settings, engine, tmp_path / "kv-channel.port", tmp_path / f"{engine}-transfers.jsonl")
        vc = VllmConfig(model_config=ModelConfig(model=str(ROOT / "models" / "tiny-llama"), dtype="float32", seed=0),
                        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=512,
                                                         is_encoder_decoder=False),
                        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
                        kv_transfer_config=KVTransferConfig(**ktc), device_config=DeviceConfig("cpu"))
        vc.cache_config.num_gpu_blocks = 64
        kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32))])
        made[engine] = Scheduler(vllm_config=vc, kv_cache_config=kv, block_size=BLOCK, log_stats=True,
                                 structured_output_manager=StructuredOutputManager(vc))
    yield cfg, made["prefill"], made["decode"]
    for s in made.values():
        s.shutdown()


def request(tid: str, tokens: list[int], params: dict, max_tokens: int) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, extra_args={"kv_transfer_params": params})
    sampling.update_from_generation_config({}, 2)
    r = Request(request_id=tid, prompt_token_ids=tokens, sampling_params=sampling, pooling_params=None,
                mm_features=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    r.kv_transfer_params = params
    return r


def worker_output(reqs: list[Request], **kv) -> ModelRunnerOutput:
    """What a worker reports after a step: a token for each scheduled request, and (kv) which
    transfers its connectors finished."""
    ids = [r.request_id for r in reqs]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[7] for _ in ids], logprobs=None, prompt_logprobs_dict={},
                             pooler_output=None, kv_connector_output=KVConnectorOutput(**kv) if kv else None)


def digests(out) -> list:
    """The observer's part of a step's metadata (the second of the MultiConnector's)."""
    return out.kv_connector_metadata.metadata[1].digests


def prefill(cfg, sched: Scheduler, tid: str, tokens: list[int], records) -> dict:
    """A prefill request through its one step; its answer (NIXL's kv_transfer_params) and the
    next step's digests."""
    r = request(tid, tokens, handoff_params(cfg.strategy, "prefill", tid, None, records=records), 1)
    sched.add_request(r)
    out = sched.schedule()
    assert digests(out) == []  # the KV is computed in this step: nothing to digest yet
    done = sched.update_from_output(out, worker_output([r]))
    answer = done[0].outputs[0].kv_transfer_params
    return {"kv_transfer_params": answer, "digests": digests(sched.schedule())}


def test_each_side_is_told_to_digest_the_blocks_nixl_moves_and_the_decode_side_only_once_loaded(sides, tmp_path):
    cfg, pre, dec = sides
    sent = prefill(cfg, pre, "t-0", PROMPT, tmp_path / "prefill-transfers.jsonl")
    assert sent["kv_transfer_params"]["transfer_mode"] == "pull"
    (d,) = sent["digests"]  # the prefill's blocks, held until its worker digested them
    assert d.req.block_ids == list(sent["kv_transfer_params"]["remote_block_ids"][0]) and len(d.req.block_ids) == 3
    r = request("t-0", PROMPT, handoff_params(cfg.strategy, "decode", "t-0", sent,
                                              records=tmp_path / "decode-transfers.jsonl"), 4)
    dec.add_request(r)
    for _ in range(2):  # NIXL loads asynchronously: the request waits, and the observer with it
        out = dec.schedule()
        assert out.num_scheduled_tokens == {} and digests(out) == [] and r.status.name == "WAITING_FOR_REMOTE_KVS"
        dec.update_from_output(out, worker_output([]))
    dec.update_from_output(dec.schedule(), worker_output([], finished_recving={"t-0"}))
    out = dec.schedule()  # scheduled once NIXL said the load is done: digested before the forward pass
    (d,) = digests(out)
    (new,) = out.scheduled_new_reqs
    assert out.num_scheduled_tokens == {"t-0": 1} and new.num_computed_tokens == len(PROMPT) - 1
    assert d.at_bind and d.req.block_ids == list(new.block_ids[0]) and d.req.skip_blocks == 0
    assert all(d.times[k] is not None for k in ("t_admitted", "t_load_start", "t_kv_ready", "t_decode_scheduled"))
    for _ in range(4):
        dec.update_from_output(out, worker_output([r]))
        out = dec.schedule()
    assert r.status.name == "FINISHED_LENGTH_CAPPED"
    (account,) = read_jsonl(tmp_path / "decode-transfers.compute.jsonl")
    assert (account["loaded_tokens"], account["computed_tokens"]) == (len(PROMPT) - 1, 1)


def test_the_decode_sides_own_prefix_hits_are_not_the_transfers(sides, tmp_path):
    """A prompt extending one the decode engine holds: vLLM takes its two whole blocks from its
    cache, NIXL loads the rest, and the observer judges only the blocks past those two."""
    cfg, pre, dec = sides
    for tid, tokens in (("t-0", PROMPT), ("t-1", PROMPT + list(range(100, 140)))):
        sent = prefill(cfg, pre, tid, tokens, tmp_path / "prefill-transfers.jsonl")
        r = request(tid, tokens, handoff_params(cfg.strategy, "decode", tid, sent,
                                                records=tmp_path / "decode-transfers.jsonl"), 1)
        dec.add_request(r)
        dec.update_from_output(dec.schedule(), worker_output([], finished_recving={tid}))
        out = dec.schedule()
        (d,) = digests(out)
        dec.update_from_output(out, worker_output([r]))
        dec.schedule()
    assert (d.req.skip_blocks, len(d.req.block_ids)) == (2, 4)
    accounts = read_jsonl(tmp_path / "decode-transfers.compute.jsonl")
    assert accounts[-1]["cached_tokens"] >= 2 * BLOCK and accounts[-1]["computed_tokens"] == 1
    assert accounts[-1]["loaded_tokens"] == len(PROMPT) + 40 - 1 - 2 * BLOCK
