"""Whether a run's engines fit the GPUs they share, judged before any starts (bad input: exit 2 and
one line). vLLM holds each engine's KV at a fixed size here (engine.kv_cache_gib), so what an
engine takes is its weights, that KV, a margin for activations, CUDA graphs and the CUDA context,
and on the decode engine's GPU the transport's staging buffer; what was refused before this
check was an engine dying at start-up (on an 80 GB H100, three Llama-3-8B-shape engines: the
decode engine's 4 GiB staging buffer found 1.03 GiB free).

The offline runner only (runner=serve's instances share GPUs as serve.*_instances say, and
tensor-parallel engines spread over several: neither is judged here)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.settings import Settings
from transfer_strategies.transport import DEFAULT_STAGING_MB

GIB = 2**30
MARGIN_GIB = 2.5  # each engine's activations (a 16k-token prefill of the 8B shape), CUDA graphs, context
USABLE = 0.95  # of the GPU's memory: the driver's and other processes' share
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}


def weight_bytes(model_path: str, dtype: str) -> int | None:
    """The model's weights: its safetensors files where it has them, else counted from a Llama-like
    config.json (the shape-only models load dummy weights of that size); None where neither is here."""
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
    kv, hd = c.get("num_key_value_heads", heads), c.get("head_dim") or h // heads
    per_layer = h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * inter + 2 * h
    params = vocab * h * (1 if c.get("tie_word_embeddings") else 2) + layers * per_layer + h
    return params * DTYPE_BYTES.get(str(dtype), 2)


def demand(s: Settings) -> dict[int, list[tuple[str, float]]]:
    """GiB each engine takes on each GPU at once, by GPU: the baseline beside the prefill and decode
    engines where run.overlap_startup starts all three together, else apart (the larger set)."""
    cfg = s.cfg
    weights = weight_bytes(str(cfg.model.path), cfg.engine.dtype)
    if weights is None or max(s.tp) > 1 or s.tp_of("baseline") > 1:
        return {}
    staging = cfg.transport.get("staging_mb") or DEFAULT_STAGING_MB["cuda"]

    def engine(role: str) -> tuple[int, tuple[str, float]]:
        gib = weights / GIB + float(s.overrides[role].get("kv_cache_memory_bytes", cfg.engine.kv_cache_gib * GIB)
                                    ) / GIB + MARGIN_GIB
        if role == "decode" and cfg.strategy.module:
            gib += staging / 1024
        return cfg.device[f"{role}_gpu"], (role, gib)

    sets = [("baseline", "prefill", "decode")] if cfg.run.overlap_startup else [("baseline",), ("prefill", "decode")]
    worst: dict[int, list[tuple[str, float]]] = {}
    for roles in sets:
        per_gpu: dict[int, list[tuple[str, float]]] = {}
        for gpu, taken in map(engine, roles):
            per_gpu.setdefault(gpu, []).append(taken)
        for gpu, taken in per_gpu.items():
            if sum(g for _, g in taken) > sum(g for _, g in worst.get(gpu, [])):
                worst[gpu] = taken
    return worst


def unfit(s: Settings, gpu_gib: dict[int, float]) -> str | None:
    """Why the engines do not fit (one line), or None: gpu_gib is each GPU's memory."""
    for gpu, taken in demand(s).items():
        have = gpu_gib.get(gpu)
        need = sum(g for _, g in taken)
        if have is None or need <= have * USABLE:
            continue
        parts = " + ".join(f"{role} {g:.1f}" for role, g in taken)
        hint = " or run.overlap_startup=false (the baseline engine stops before the others start)" \
            if s.cfg.run.overlap_startup and len(taken) == 3 else ""
        return (f"the engines on GPU {gpu} need {need:.1f} GiB at once ({parts}: weights, "
                f"engine.kv_cache_gib={s.cfg.engine.kv_cache_gib}, a {MARGIN_GIB} GiB margin each and the "
                f"decode engine's staging buffer), and it has {have:.1f} GiB: lower engine.kv_cache_gib or "
                f"transport.staging_mb{hint}")
    return None


def gpu_memory_gib() -> dict[int, float]:
    import torch

    return {i: torch.cuda.get_device_properties(i).total_memory / GIB for i in range(torch.cuda.device_count())}
