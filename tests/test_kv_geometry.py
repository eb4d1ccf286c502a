"""A model's KV geometry from its config.json (harness/records/kv_geometry.py): what a token costs
in each layer, by heads or, for DeepSeek's MLA, one latent and its rotary part; no engine."""

import json

import pytest

from harness.records.kv_geometry import kv_geometry
from tests.conftest import ROOT


def test_a_llama_token_holds_a_k_and_a_v_per_kv_head():
    tiny = kv_geometry(str(ROOT / "models" / "tiny-llama"), "float32")
    assert (tiny.kind, tiny.layers, tiny.kv_heads, tiny.head_dim) == ("heads", 4, 2, 64)
    assert tiny.bytes_per_token == 4 * 2 * 2 * 64 * 4
    big = kv_geometry(str(ROOT / "models" / "llama3-8b-kv"), "bfloat16")
    assert big.bytes_per_token == 128 * 1024  # Llama-3-8B: 32 layers x 8 KV heads x 128, K and V, bf16
    assert big.describe() == "32 layers x K,V x 8 heads x 128, 131072 B/token (bfloat16)"


def test_an_mla_token_holds_one_latent_and_its_rotary_part_whatever_the_heads(tmp_path):
    """DeepSeek-V3's published shape: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64, 128 heads."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16"}))
    v3 = kv_geometry(str(tmp_path), "auto")  # the dtype from the config
    assert (v3.kind, v3.latent, v3.rope, v3.kv_heads, v3.dtype) == ("latent", 512, 64, None, "bfloat16")
    assert v3.bytes_per_token == 61 * 576 * 2
    assert v3.as_record()["describe"] == "61 layers x latent 512 + rope 64, 70272 B/token (bfloat16)"


def test_a_hybrid_models_linear_attention_layers_hold_no_kv_per_token(tmp_path):
    """Qwen3-Next's layout: three Gated DeltaNet layers (a recurrent state per request) to each full-attention one."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}))
    g = kv_geometry(str(tmp_path), "bfloat16")
    assert (g.layers, g.state_layers, g.bytes_per_token, g.state_bytes) == (1, 3, 2 * 2 * 64 * 2, None)
    assert g.describe() == ("1 layers x K,V x 2 heads x 64 (+ 3 layers of recurrent state per request), "
                            "512 B/token (bfloat16)")
    # models/tiny-hybrid: vLLM 0.32 holds each Gated DeltaNet layer's state as a (3, 512) bf16 window
    # and a (4, 64, 64) float32 matrix (its MambaSpec's shapes): 68608 B
    h = kv_geometry(str(ROOT / "models" / "tiny-hybrid"), "bfloat16")
    assert (h.layers, h.state_layers, h.bytes_per_token, h.state_bytes) == (1, 3, 512, 3 * 68608)
    assert h.describe().endswith("(+ 3 layers of recurrent state per request, 205824 B), 512 B/token (bfloat16)")


@pytest.mark.parametrize("config", [None, {"architectures": ["Odd"]}])
def test_a_model_without_a_local_config_has_no_geometry(tmp_path, config):
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    assert kv_geometry(str(tmp_path), "float32") is None
