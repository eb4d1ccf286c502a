"""Whether a run's engines fit the GPUs they share, judged before any starts (bad input: exit 2 and
one line). vLLM holds each engine's KV at a fixed size here (engine.kv_cache_gib), so what an
engine takes is its weights, that KV, a margin for activations, CUDA graphs and the CUDA context,
and on a decode engine's GPU the transport's staging buffer (one per prefill instance it joins);
what was refused before this check was an engine dying at start-up (on an 80 GB H100, three
Llama-3-8B-shape engines: the decode engine's 4 GiB staging buffer found 1.03 GiB free).

The offline runner's engines are judged as they run at once (all three with run.overlap_startup,
else the baseline alone, then the prefill and decode engines); runner=serve's instances all at
once, each on its GPU (harness.settings.first_gpu). Tensor-parallel engines, which spread over
several GPUs, are not judged here."""

from __future__ import annotations

import json
from pathlib import Path

from harness.settings import ROLES, Settings, first_gpu, instance_counts
from transfer_strategies.transport import DEFAULT_STAGING_MB

GIB = 2**30
MARGIN_GIB = 2.5  # each engine's activations (a 16k-token prefill of the 8B shape), CUDA graphs, context
USABLE = 0.95  # of the GPU's memory: the driver's and other processes' share
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}


def weight_bytes(model_path: str, dtype: str) -> int | None:
    """The model's weights: its safetensors files where it has them, else counted from a Llama-like
    or DeepSeek-like (MLA) config.json (the shape-only models load dummy weights of that size);
    None where neither is here."""
    local = Path(model_path).expanduser()
    files = sorted(local.glob("*.safetensors")) if local.is_dir() else []
    if files:
        return sum(f.stat().st_size for f in files)
    config = local / "config.json"
    if not config.is_file():
        return None
    c = json.loads(config.read_text())
    try:
        h, layers, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
        heads = c["num_attention_heads"]
    except KeyError:
        return None
    if c.get("kv_lora_rank"):  # DeepSeek's MLA (every layer dense, as the shape models are)
        qk, latent, rope, v = c["qk_nope_head_dim"] + c["qk_rope_head_dim"], c["kv_lora_rank"], c["qk_rope_head_dim"], \
            c["v_head_dim"]
        rank = c.get("q_lora_rank")
        q = h * rank + rank * heads * qk if rank else h * heads * qk
        attention = q + h * (latent + rope) + latent * heads * (qk - rope + v) + heads * v * h
    else:
        kv, hd = c.get("num_key_value_heads", heads), c.get("head_dim") or h // heads
        attention = h * heads * hd * 2 + 2 * h * kv * hd
    per_layer = attention + 3 * h * inter + 2 * h
    params = vocab * h * (1 if c.get("tie_word_embeddings") else 2) + layers * per_layer + h
    return params * DTYPE_BYTES.get(str(dtype), 2)


def demand(s: Settings, gpu_count: int = 1) -> dict[int, list[tuple[str, float]]]:
    """GiB each engine takes on each GPU at the worst moment, by GPU (of gpu_count)."""
    cfg = s.cfg
    weights = weight_bytes(str(cfg.model.path), cfg.engine.dtype)
    if weights is None or any(s.tp_of(role) > 1 for role in ROLES):
        return {}
    staging = (cfg.transport.get("staging_mb") or DEFAULT_STAGING_MB["cuda"]) / 1024
    serve = cfg.runner.name == "serve"
    counts = instance_counts(cfg) if serve else dict.fromkeys(ROLES, 1)

    def engine(role: str, i: int) -> tuple[int, tuple[str, float]]:
        kv = float(s.overrides[role].get("kv_cache_memory_bytes", cfg.engine.kv_cache_gib * GIB)) / GIB
        gib = weights / GIB + kv + MARGIN_GIB
        if role == "decode" and cfg.strategy.module:
            gib += staging * counts["prefill"]
        name = role if counts[role] == 1 else f"{role}{i}"
        return first_gpu(s, role, i) % max(gpu_count, 1), (name, gib)

    sets = [ROLES] if serve or cfg.run.overlap_startup else [("baseline",), ("prefill", "decode")]
    worst: dict[int, list[tuple[str, float]]] = {}
    for roles in sets:
        per_gpu: dict[int, list[tuple[str, float]]] = {}
        for gpu, taken in (engine(role, i) for role in roles for i in range(counts[role])):
            per_gpu.setdefault(gpu, []).append(taken)
        for gpu, taken in per_gpu.items():
            if sum(g for _, g in taken) > sum(g for _, g in worst.get(gpu, [])):
                worst[gpu] = taken
    return worst


def unfit(s: Settings, gpu_gib: dict[int, float]) -> str | None:
    """Why the engines do not fit (one line), or None: gpu_gib is each GPU's memory."""
    for gpu, taken in demand(s, len(gpu_gib)).items():
        have = gpu_gib.get(gpu)
        need = sum(g for _, g in taken)
        if have is None or need <= have * USABLE:
            continue
        parts = " + ".join(f"{role} {g:.1f}" for role, g in taken)
        hint = " or run.overlap_startup=false (the baseline engine stops before the others start)" \
            if s.cfg.runner.name == "offline" and s.cfg.run.overlap_startup and len(taken) == 3 else ""
        return (f"the engines on GPU {gpu} need {need:.1f} GiB at once ({parts}: weights, "
                f"engine.kv_cache_gib={s.cfg.engine.kv_cache_gib}, a {MARGIN_GIB} GiB margin each and the "
                f"decode engine's staging buffer), and it has {have:.1f} GiB ({USABLE:.0%} of it for engines): lower "
                f"engine.kv_cache_gib or transport.staging_mb{hint}")
    return None


def gpu_memory_gib() -> dict[int, float]:
    import torch

    return {i: torch.cuda.get_device_properties(i).total_memory / GIB for i in range(torch.cuda.device_count())}
