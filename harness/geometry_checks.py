"""What a model's KV geometry asks of a run, judged before any engine starts (harness/checks.py
calls check_geometry): the block sizes its attention backend takes, MLA's latent crossing whole
between tensor-parallel degrees, and which strategies move a hybrid model's pages
(transfer_strategies/kv_groups.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from harness.checks import ConfigError
from harness.settings import Settings, tp_degree


def check_geometry(cfg: DictConfig, connector: type | None, settings: Settings) -> None:
    geometry = settings.kv_geometry
    mla = geometry is not None and geometry.kind == "latent"
    check_equal_degrees(cfg, connector, mla)
    check_block_size(cfg.engine.block_size, settings.device, mla)
    if geometry is not None and geometry.state_layers and connector is not None:
        check_hybrid(cfg, connector, settings.device)


def check_hybrid(cfg: DictConfig, connector: type, device: str) -> None:
    """A hybrid model (layers of recurrent state beside attention layers): this project's
    strategies move its pages whole once the prompt is computed (kv_groups.py), with the
    prefill engine computing all but the prompt's last token (vLLM's on_new_request hook,
    0.32), between engines of one worker each, on CPU (vLLM 0.32's layout: every layer's KV
    cache a view of pages, blocks first)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    model, name = cfg.model.name, cfg.strategy.name
    if device != "cpu":
        raise ConfigError(f"model {model} (hybrid): its pages have been moved on CPU only; on {device} its KV "
                          f"cache layout is not checked yet (device=cpu)")
    if connector.codec is not None or not connector.moves_hybrid:
        why = ("compresses KV values per head; a recurrent state is no KV" if connector.codec is not None
               else "streams layer by layer or chunk by chunk; a hybrid model's pages are shared by layers of "
                    "different kinds and its recurrent state is whole only at the prompt's end")
        raise ConfigError(f"strategy {name!r} {why}: on model {model} (hybrid) use strategy=fused, "
                          f"per_request_blocks or full_cache")
    if (tp_degree(cfg, "prefill"), tp_degree(cfg, "decode")) != (1, 1):
        raise ConfigError(f"model {model} (hybrid): tensor parallelism is not built for its pages; use "
                          f"tensor_parallel_size=1 on both engines")
    if "on_new_request" not in vars(KVConnectorBase_V1):
        raise ConfigError(f"model {model} (hybrid): this vLLM has no connector hook on_new_request (0.32 has), "
                          f"through which the prefill engine leaves the prompt's last token to the decode engine")


def check_block_size(block_size: int, device: str, mla: bool = False) -> None:
    """vLLM's attention backends declare the block sizes their kernels take; an engine given
    another one fails at start-up. On CPU the CPU attention backend says (a multiple of 32 in
    vLLM 0.32, of 16 in 0.26; its MLA backend 16 only); on CUDA FlashAttention, FlexAttention and
    Triton attention (what vLLM picks for these models on NVIDIA GPUs) take multiples of 16 in
    0.26 through 0.32."""
    if device == "cpu":
        if mla:
            from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend as backend
        else:
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as backend

        if backend.supports_block_size(block_size):
            return
        takes = [getattr(s, "base", s) for s in backend.get_supported_kernel_block_sizes()]
        nearest = takes[0] if mla else -(-block_size // takes[0]) * takes[0]
        what = "MLA attention takes blocks of" if mla else "attention takes multiples of"
        raise ConfigError(f"engine.block_size={block_size}: vLLM's CPU {what} "
                          f"{' or '.join(map(str, takes))}, e.g. engine.block_size={nearest}")
    if block_size % 16:
        raise ConfigError(f"engine.block_size={block_size}: vLLM's attention on CUDA takes multiples of 16, "
                          f"e.g. engine.block_size={-(-block_size // 16) * 16}")


def check_equal_degrees(cfg: DictConfig, connector: type | None, mla: bool = False) -> None:
    """chunkwise's earlier messages do not carry the count a decode worker joining several prefill
    workers needs: it needs equal tensor-parallel degrees (an MLA latent comes whole from one)."""
    if not getattr(connector, "needs_equal_tp", False) or mla:
        return
    why = "sends messages whose count is known only at the last one"
    p, d = tp_degree(cfg, "prefill"), tp_degree(cfg, "decode")
    if p != d:
        raise ConfigError(f"strategy {cfg.strategy.name!r} {why}, so the prefill and decode engines need equal "
                          f"tensor_parallel_size (got {p} and {d})")


