"""A model's KV geometry, read from its config.json before any engine starts, so that runs of
different models can be compared per byte: how many layers hold KV, what one token holds in
each (a K and a V per KV head, or DeepSeek's one latent plus its rotary part), and the bytes a
token costs. meta.json records it, the run's first line says it, and the results loader gives it
as columns (harness/report/load.py)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class KVGeometry:
    layers: int
    dtype: str
    kv_heads: int | None = None  # heads: a K and a V of head_dim per KV head and token
    head_dim: int | None = None
    latent: int | None = None  # MLA: one latent (kv_lora_rank) and a rotary part per token, no heads
    rope: int | None = None
    state_layers: int = 0  # hybrid models: layers holding a recurrent state per request, no KV per token
    # their state's bytes per request, all those layers (Gated DeltaNet, as vLLM holds it: the convolution
    # window in the model's dtype, the state matrices in float32); None where the config does not say
    state_bytes: int | None = None

    @property
    def kind(self) -> str:
        return "latent" if self.latent else "heads"

    @property
    def values_per_token_layer(self) -> int:
        return self.latent + self.rope if self.latent else 2 * self.kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.values_per_token_layer * DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        per_layer = (f"latent {self.latent} + rope {self.rope}" if self.latent
                     else f"K,V x {self.kv_heads} heads x {self.head_dim}")
        size = f", {self.state_bytes} B" if self.state_bytes else ""
        state = f" (+ {self.state_layers} layers of recurrent state per request{size})" if self.state_layers else ""
        return f"{self.layers} layers x {per_layer}{state}, {self.bytes_per_token} B/token ({self.dtype})"

    def as_record(self) -> dict:
        """meta.json's `kv_geometry`."""
        return {**asdict(self), "kind": self.kind, "bytes_per_token": self.bytes_per_token,
                "describe": self.describe()}


def kv_geometry(model_path: str, dtype: str) -> KVGeometry | None:
    """None where the model is not a local folder, or its config names no attention geometry."""
    path = Path(str(model_path)).expanduser() / "config.json"
    if not path.is_file():
        return None
    c = json.loads(path.read_text())
    c = c.get("text_config", c)
    dtype = dtype if dtype in DTYPE_BYTES else str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    try:
        layers, heads = c["num_hidden_layers"], c["num_attention_heads"]
    except KeyError:
        return None
    if dtype not in DTYPE_BYTES:
        return None
    if c.get("kv_lora_rank") is not None:
        return KVGeometry(layers, dtype, latent=c["kv_lora_rank"], rope=c["qk_rope_head_dim"])
    # hybrid models name each layer's kind (Qwen3-Next/3.5: layer_types; Jamba, Falcon-H1: layers_block_type):
    # only the attention layers hold KV per token
    kinds = c.get("layer_types") or c.get("layers_block_type")
    attention = layers if not isinstance(kinds, list) else sum("attention" in k and "linear" not in k for k in kinds)
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return KVGeometry(attention, dtype, kv_heads=c.get("num_key_value_heads") or heads, head_dim=head_dim,
                      state_layers=layers - attention, state_bytes=_gdn_state_bytes(c, layers - attention, dtype))


def _gdn_state_bytes(c: dict, n_layers: int, dtype: str) -> int | None:
    """Gated DeltaNet layers' state per request (Qwen3-Next's linear_* keys), as vLLM 0.32 holds
    it: a convolution window of kernel - 1 steps over the keys, queries and values (model dtype)
    and a key x value matrix per value head (float32)."""
    try:
        k_heads, v_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
        k_dim, v_dim, kernel = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    except KeyError:
        return None
    conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim) * DTYPE_BYTES[dtype]
    return n_layers * (conv + v_heads * k_dim * v_dim * 4)
