#!/usr/bin/env python3
"""Reproduce the project's default model, ``models/tiny-llama``, from scratch.

The checkpoint is a small Llama-architecture model (LlamaForCausalLM) in
Hugging Face format with a byte-level BPE tokenizer, both trained here on the
vendored corpus ``models/corpus/pydoc_topics.txt`` (the text of CPython's
``pydoc_data/topics.py``, PSF licence; see ``models/corpus/README.md``).

Everything is seeded and runs on CPU with plain PyTorch; on 2 cores the
default settings take a few minutes.  The defaults are the settings that
produced the shipped checkpoint.

    python scripts/train_default_model.py --out models/tiny-llama

``--write-corpus`` regenerates the corpus file from the running Python's
``pydoc_data`` (the shipped file came from CPython 3.11.7); training always
reads the file, so the result does not depend on the Python version.

``--preset llama3_8b_kv`` makes instead a model with the KV-cache geometry of
Llama-3-8B (32 layers, 8 KV heads of size 128 under 32 query heads) but a small
hidden size (256) and MLP (704), trained on the same corpus with the tokenizer
of ``models/tiny-llama`` (copied, not retrained: same 3502-token vocabulary),
saved in bfloat16.  It is meant for one GPU (bf16 autocast, a minute or two on
an H200) and stops at a training loss of 0.4 (``--stop-loss``): fully memorised,
this deep model ignores most of a prompt's KV cache.  See
``models/llama3-8b-kv/README.md``:

    python scripts/train_default_model.py --preset llama3_8b_kv --device cuda --out DIR

``--preset tiny_mla`` makes ``models/tiny-mla``: tiny-llama's recipe, corpus and
tokenizer (copied from ``models/tiny-llama``) on a DeepSeek-V3 model
(DeepseekV3ForCausalLM, multi-head latent attention, every layer dense) whose KV
cache is one latent of 512 + 64 (rotary key) values per token and layer, the
width vLLM's CPU MLA backend takes.  See ``models/tiny-mla/README.md``:

    python scripts/train_default_model.py --preset tiny_mla --out models/tiny-mla --seed 0

``--layers --hidden --heads --kv-heads --head-dim --intermediate`` override a
preset's geometry, ``--dtype`` the dtype of the saved weights.  ``--preset tiny`` (the default) on CPU is exactly the
recipe of the shipped ``models/tiny-llama``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO / "models" / "corpus" / "pydoc_topics.txt"
DOC_SEP = "\n\n\x0c\n\n"  # form feed line between topics in the corpus file

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0, 1, 2, 3


def write_corpus(path: Path, max_topic_chars: int = 8000) -> None:
    """Write the topics of pydoc_data.topics shorter than ``max_topic_chars``
    characters, sorted by name, to ``path`` (a small corpus is memorised well
    in a few minutes of CPU training)."""
    from pydoc_data.topics import topics

    keys = [k for k in sorted(topics) if len(topics[k]) < max_topic_chars]
    text = DOC_SEP.join(topics[k].strip("\n") for k in keys) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(keys)} topics, {len(text.encode())} bytes) from Python "
          f"{sys.version.split()[0]}: {' '.join(keys)}")


def read_docs(path: Path) -> tuple[list[str], str]:
    raw = path.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    docs = [d for d in raw.decode("utf-8").split(DOC_SEP) if d.strip()]
    return docs, sha


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id("<s>")
    # Prepend <s> to every encoded text, in transformers and in vLLM alike.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    return tok


def save_tokenizer(tok, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))


# Per-preset defaults; every key but "mla" is also a command-line option (None there: take the preset's).
PRESETS: dict[str, dict] = {
    # The shipped default model (models/tiny-llama): trained on CPU, float32.
    "tiny": {
        "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": 704,
        "max_positions": 4096, "dtype": "float32", "tokenizer_from": None,
        "steps": 800, "batch_size": 4, "lr": 4e-3, "warmup": 50, "stop_loss": 0.0,
    },
    # Llama-3-8B's KV cache (32 layers x 8 KV heads x 128, 128 KiB/token in bf16; 32 query
    # heads, GQA 4 as in the real model) on a small residual stream and MLP, for one GPU.
    "llama3_8b_kv": {
        "layers": 32, "hidden": 256, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 704,
        "max_positions": 32768, "dtype": "bfloat16", "tokenizer_from": "models/tiny-llama",
        "steps": 2000, "batch_size": 16, "lr": 2e-3, "warmup": 100, "stop_loss": 0.4,
    },
    # tiny's geometry and recipe with DeepSeek-V3's multi-head latent attention (models/tiny-mla):
    # the cache holds one latent per token and layer, kv_lora_rank + qk_rope_head_dim = 576 wide
    # (the only width vLLM 0.32's CPU MLA backend takes), no KV heads. head_dim is the per-head
    # size of the non-rotary query/key part and of the values; kv_heads must equal heads (MLA has
    # no GQA). The tokenizer is tiny-llama's, so token ids match those of the default model.
    # tiny's recipe memorises less here: loss (EMA) 2.93 after its 800 steps (tiny: 0.49), 1.49
    # after 2000. A lower lr learns faster (loss EMA at step 250: 4.61 at 4e-3, 3.85 at 1.5e-3,
    # 4.15 at 8e-4; these with 64-dim heads, session 40); training stops once it is as memorised as
    # tiny-llama (loss EMA < 0.5: step 848 with 128-dim heads).
    "tiny_mla": {
        # head_dim 128 (query/key 128 + rotary 64, value 128): DeepSeek-V3's per-head sizes, the only ones
        # vLLM 0.26's CUDA MLA prefill backends take (64 ran on the CPU but no GPU engine started, session 41)
        "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "head_dim": 128, "intermediate": 704,
        # saved in bfloat16 (16 MB, not 32: vLLM needs lm_head apart, below); trained and run in float32
        "max_positions": 4096, "dtype": "bfloat16", "tokenizer_from": "models/tiny-llama",
        "steps": 2000, "batch_size": 4, "lr": 1.5e-3, "warmup": 50, "stop_loss": 0.5,
        "mla": {"kv_lora_rank": 512, "qk_rope_head_dim": 64},
    },
    # tiny's geometry on Qwen3-Next's hybrid layout (models/tiny-hybrid): three Gated DeltaNet
    # (linear attention) layers, each carrying a fixed-size recurrent state per request, then one
    # full-attention layer (2 KV heads of 64), as Qwen3-Next alternates them. vLLM's Qwen3-Next
    # wants at least one MoE layer: the attention layer's MLP is 4 experts (2 per token) and a
    # shared one, the others dense. vLLM 0.32's CPU GDN kernel takes bf16 only: saved and run in
    # bf16, trained in float32.
    "tiny_hybrid": {
        "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": 704,
        "max_positions": 4096, "dtype": "bfloat16", "tokenizer_from": "models/tiny-llama",
        "steps": 2000, "batch_size": 4, "lr": 1.5e-3, "warmup": 50, "stop_loss": 0.5,
        "hybrid": {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
                   "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "full_attention_every": 4,
                   "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                   "shared_expert_intermediate_size": 256},
    },
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def model_config(vocab_size: int, bos_id: int, eos_id: int, pad_id: int, geo: dict | None = None):
    from transformers import DeepseekV3Config, LlamaConfig

    g = geo or PRESETS["tiny"]
    common = {
        "vocab_size": vocab_size,
        "hidden_size": g["hidden"],
        "intermediate_size": g["intermediate"],
        "num_hidden_layers": g["layers"],
        "num_attention_heads": g["heads"],
        "num_key_value_heads": g["kv_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": g["max_positions"],
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": g["dtype"],
    }
    if g.get("hybrid"):
        from transformers import Qwen3NextConfig

        h = dict(g["hybrid"])
        every = h.pop("full_attention_every")
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(g["layers"])]
        common.pop("attention_bias")
        return Qwen3NextConfig(**common, **h, head_dim=g["head_dim"], layer_types=types,
                               mlp_only_layers=[i for i, t in enumerate(types) if t != "full_attention"],
                               decoder_sparse_step=1)
    if not g.get("mla"):
        return LlamaConfig(**common, head_dim=g["head_dim"], rope_theta=10000.0, mlp_bias=False)
    # DeepSeek-V3 (multi-head latent attention) with every layer a dense MLP: the MoE settings are
    # required by DeepseekV3Config (it refuses None) but unused, as first_k_dense_replace is the
    # layer count. Queries are projected directly (q_lora_rank None), as in DeepSeek-V2-Lite.
    return DeepseekV3Config(
        **common,
        first_k_dense_replace=g["layers"],
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        q_lora_rank=None,
        kv_lora_rank=g["mla"]["kv_lora_rank"],
        qk_rope_head_dim=g["mla"]["qk_rope_head_dim"],
        qk_nope_head_dim=g["head_dim"],
        v_head_dim=g["head_dim"],
        rope_interleave=True,  # what vLLM's DeepSeek model applies (rotary pairs (x0, x1), ...)
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},  # no YaRN scaling
    )


def untie_lm_head(model) -> None:
    """vLLM 0.32's DeepseekV3ForCausalLM has no tied lm_head and fails to load a checkpoint
    without lm_head.weight: save the (trained, tied) embedding a second time as lm_head."""
    import torch

    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())


def load_tokenizer(src: Path, out: Path):
    """Copy the tokenizer files of the model directory ``src`` into ``out`` and
    return the tokenizer (a ``tokenizers.Tokenizer``)."""
    import shutil

    from tokenizers import Tokenizer

    if not (src / "tokenizer.json").exists():
        raise SystemExit(f"no tokenizer.json in {src} (--tokenizer-from)")
    for f in TOKENIZER_FILES:
        if (src / f).exists() and (src / f).resolve() != (out / f).resolve():
            shutil.copyfile(src / f, out / f)
    return Tokenizer.from_file(str(src / "tokenizer.json"))


def lr_at(step: int, steps: int, lr: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                    help="model geometry and training defaults: "
                    + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()))
    ap.add_argument("--out", default=None,
                    help="output directory (default: models/tiny-llama for --preset tiny, "
                         "required otherwise)")
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--write-corpus", action="store_true",
                    help="regenerate --corpus from this Python's pydoc_data first")
    ap.add_argument("--max-topic-chars", type=int, default=8000,
                    help="with --write-corpus: keep the topics shorter than this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=4096,
                    help="BPE vocabulary asked for when the tokenizer is trained (--preset tiny)")
    ap.add_argument("--tokenizer-from", default=None,
                    help="copy the tokenizer of this model directory instead of training one "
                         "(default: the preset's; llama3_8b_kv, tiny_mla: models/tiny-llama)")
    geo = ap.add_argument_group("geometry (default: the preset's)")
    geo.add_argument("--layers", type=int)
    geo.add_argument("--hidden", type=int)
    geo.add_argument("--heads", type=int, help="query heads")
    geo.add_argument("--kv-heads", type=int)
    geo.add_argument("--head-dim", type=int)
    geo.add_argument("--intermediate", type=int, help="MLP size")
    geo.add_argument("--max-positions", type=int)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                    help="dtype of the saved weights (tiny: float32, llama3_8b_kv: bfloat16)")
    ap.add_argument("--train-dtype", choices=["float32", "bfloat16"], default=None,
                    help="float32, or bfloat16 autocast over float32 weights (cuda only); "
                         "default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--steps", type=int, default=None, help="tiny: 800, llama3_8b_kv: 2000")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="also stop after this many minutes of training "
                         "(0: no limit; a limit makes the result machine-dependent)")
    ap.add_argument("--stop-loss", type=float, default=None,
                    help="also stop once the training loss (EMA) is below this (0: no limit; "
                         "tiny: 0, llama3_8b_kv: 0.4, as memorised as tiny-llama: a model that "
                         "memorises the corpus fully ignores most of the KV cache)")
    ap.add_argument("--batch-size", type=int, default=None, help="tiny: 4, llama3_8b_kv: 16")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=None, help="tiny: 4e-3, llama3_8b_kv: 2e-3")
    ap.add_argument("--warmup", type=int, default=None, help="tiny: 50, llama3_8b_kv: 100")
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()

    preset = PRESETS[args.preset]
    for k, v in preset.items():  # unset options take the preset's value
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.out is None:
        if args.preset != "tiny":
            ap.error("--out is required with --preset " + args.preset)
        args.out = str(REPO / "models" / "tiny-llama")
    if args.train_dtype is None:
        args.train_dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.train_dtype != "float32" and args.device != "cuda":
        ap.error("--train-dtype bfloat16 needs --device cuda")
    geo = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim",
                                         "intermediate", "max_positions", "dtype")}
    if geo["heads"] % geo["kv_heads"]:
        ap.error(f"--heads {geo['heads']} is not a multiple of --kv-heads {geo['kv_heads']}")
    mla = preset.get("mla")
    if preset.get("hybrid"):
        geo["hybrid"] = preset["hybrid"]
    if mla:
        geo["mla"] = mla
        if geo["kv_heads"] != geo["heads"]:
            ap.error(f"--preset {args.preset}: MLA has no grouped KV heads, --kv-heads must be --heads")

    t_start = time.time()
    corpus = Path(args.corpus)
    if args.write_corpus:
        write_corpus(corpus, args.max_topic_chars)

    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic BPE training
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    import torch
    from transformers import DeepseekV3ForCausalLM, GenerationConfig, LlamaForCausalLM, Qwen3NextForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    # On CUDA a few kernels (attention backward) have no deterministic version: warn only.
    torch.use_deterministic_algorithms(True, warn_only=args.device == "cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    device = torch.device(args.device)

    docs, corpus_sha = read_docs(corpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- tokenizer -------------------------------------------------------
    if args.tokenizer_from:
        tok_src = Path(args.tokenizer_from)
        tok_src = tok_src if tok_src.is_absolute() else REPO / tok_src
        tok = load_tokenizer(tok_src, out)
    else:
        tok = train_tokenizer(docs, args.vocab_size)
        save_tokenizer(tok, out)
    bos_id, eos_id, pad_id = (tok.token_to_id(t) for t in ("<s>", "</s>", "<pad>"))
    vocab = tok.get_vocab_size()
    stream: list[int] = []
    for d in docs:
        stream.extend(tok.encode(d, add_special_tokens=False).ids)
        stream.append(eos_id)
    data = torch.tensor(stream, dtype=torch.long)
    print(f"corpus {corpus.name}: {len(docs)} docs, {corpus.stat().st_size} bytes, "
          f"{len(stream)} tokens, vocab {vocab}, sha256 {corpus_sha}", flush=True)

    # ---- model -----------------------------------------------------------
    cfg = model_config(vocab, bos_id, eos_id, pad_id, geo)
    # initialised on CPU: the same weights whatever the device
    model = (DeepseekV3ForCausalLM if mla else Qwen3NextForCausalLM if geo.get("hybrid") else LlamaForCausalLM)(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    model.to(device)
    if mla:  # one latent (compressed K and V) + one rotary key per token and layer, no KV heads
        # float32 KV, as conf/model/tiny_mla.yaml runs it (its weights are saved in geo["dtype"])
        kv_bytes = geo["layers"] * (mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) * 4
        print(f"preset {args.preset}: DeepSeek-V3 MLA, {geo['layers']} dense layers, hidden "
              f"{geo['hidden']}, {geo['heads']} heads (q/k {geo['head_dim']} + rope "
              f"{mla['qk_rope_head_dim']}, v {geo['head_dim']}), latent {mla['kv_lora_rank']} + rope "
              f"{mla['qk_rope_head_dim']}, MLP {geo['intermediate']}, {kv_bytes} B of float32 "
              f"KV per token; device {args.device}, training in {args.train_dtype}", flush=True)
    elif geo.get("hybrid"):  # KV of the full-attention layers only; the others carry a recurrent state
        attn_layers = geo["layers"] // geo["hybrid"]["full_attention_every"]
        kv_bytes = 2 * attn_layers * geo["kv_heads"] * geo["head_dim"] * 2  # bf16, as the harness runs it
        print(f"preset {args.preset}: Qwen3-Next hybrid, {geo['layers'] - attn_layers} Gated DeltaNet layers and "
              f"{attn_layers} full-attention layer(s) ({geo['kv_heads']} KV heads of {geo['head_dim']}), hidden "
              f"{geo['hidden']}, {kv_bytes} B of bf16 KV per token; device {args.device}, training in "
              f"{args.train_dtype}", flush=True)
    else:
        kv_bytes = 2 * geo["layers"] * geo["kv_heads"] * geo["head_dim"] * torch.finfo(
            getattr(torch, geo["dtype"])).bits // 8
        print(f"preset {args.preset}: {geo['layers']} layers, hidden {geo['hidden']}, {geo['heads']} heads, "
              f"{geo['kv_heads']} KV heads of {geo['head_dim']}, MLP {geo['intermediate']}, "
              f"{kv_bytes} B of {geo['dtype']} KV per token; device {args.device}, "
              f"training in {args.train_dtype}", flush=True)

    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    gen = torch.Generator().manual_seed(args.seed)
    L = args.seq_len
    max_off = len(stream) - L
    bos_col = torch.full((args.batch_size, 1), bos_id, dtype=torch.long)
    ar = torch.arange(L)
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16,
                              enabled=args.train_dtype == "bfloat16")

    model.train()
    t_train = time.time()
    ema = None
    step = 0
    for step in range(args.steps):
        if args.minutes and time.time() - t_train > args.minutes * 60:
            print(f"time limit reached at step {step}", flush=True)
            break
        offs = torch.randint(0, max_off + 1, (args.batch_size,), generator=gen)
        x = torch.cat([bos_col, data[offs[:, None] + ar]], dim=1).to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup, args.min_lr_ratio)
        with autocast:
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        stop = bool(args.stop_loss) and ema < args.stop_loss
        if step % args.log_every == 0 or step == args.steps - 1 or stop:
            print(f"step {step:5d}  loss {lv:.4f}  ema {ema:.4f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {time.time() - t_train:6.1f}s",
                  flush=True)
        if stop:
            print(f"loss (EMA) below --stop-loss {args.stop_loss} at step {step}", flush=True)
            break
    steps_done = step + 1
    train_s = time.time() - t_train

    # ---- evaluate loss on fixed windows, with the weights as saved ----------
    model.to(getattr(torch, geo["dtype"]))
    model.eval()
    eg = torch.Generator().manual_seed(12345)
    offs = torch.randint(0, max_off + 1, (32,), generator=eg)
    with torch.no_grad():
        x = torch.cat([torch.full((32, 1), bos_id), data[offs[:, None] + ar]], dim=1).to(device)
        eval_loss = model(input_ids=x, labels=x).loss.item()
    print(f"eval loss (32 fixed corpus windows, {geo['dtype']} weights): {eval_loss:.4f}", flush=True)

    # ---- save ----------------------------------------------------------------
    if mla or geo.get("hybrid"):
        untie_lm_head(model)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
                     do_sample=False).save_pretrained(str(out))
    total_s = time.time() - t_start
    weight_bytes = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    info = {
        "preset": args.preset,
        "corpus": str(corpus.relative_to(REPO)) if corpus.is_relative_to(REPO) else str(corpus),
        "corpus_sha256": corpus_sha,
        "corpus_tokens": len(stream),
        "vocab_size": vocab,
        "tokenizer": f"copied from {args.tokenizer_from}" if args.tokenizer_from
        else f"trained here (BPE, {args.vocab_size} asked for)",
        "layers": geo["layers"],
        "hidden": geo["hidden"],
        "heads": geo["heads"],
        "kv_heads": geo["kv_heads"],
        "head_dim": geo["head_dim"],
        **({"architecture": "DeepseekV3ForCausalLM", **mla} if mla else {}),
        **({"architecture": "Qwen3NextForCausalLM", **geo["hybrid"]} if geo.get("hybrid") else {}),
        "intermediate": geo["intermediate"],
        "max_positions": geo["max_positions"],
        "kv_bytes_per_token": kv_bytes,
        "parameters": n_params,
        "dtype": geo["dtype"],
        "weight_bytes": weight_bytes,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(device) if args.device == "cuda" else None,
        "train_dtype": args.train_dtype,
        "seed": args.seed,
        "steps": steps_done,
        "steps_planned": args.steps,
        "stop_loss": args.stop_loss,
        "batch_size": args.batch_size,
        "seq_len": L,
        "lr": args.lr,
        "warmup": args.warmup,
        "min_lr_ratio": args.min_lr_ratio,
        "weight_decay": args.weight_decay,
        "threads": args.threads,
        "final_ema_loss": round(ema, 4),
        "eval_loss": round(eval_loss, 4),
        "train_seconds": round(train_s, 1),
        "total_seconds": round(total_s, 1),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    add_compat_keys(out)
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    if args.preset in ("tiny", "tiny_mla", "tiny_hybrid"):
        write_card(out, info)
    else:
        write_results(out, info)
    print(json.dumps(info, indent=2))
    print(f"done in {total_s:.1f}s -> {out}")
    return 0


def add_compat_keys(out: Path) -> None:
    """Add the keys older transformers/vLLM versions read (transformers 5 writes
    `dtype`, `rope_parameters` and the class name `TokenizersBackend`)."""
    p = out / "config.json"
    cfg = json.loads(p.read_text())
    cfg.setdefault("torch_dtype", cfg.get("dtype", "float32"))
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    p = out / "tokenizer_config.json"
    tcfg = json.loads(p.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    p.write_text(json.dumps(tcfg, indent=2, sort_keys=True) + "\n")


CHECK_BEGIN = "<!-- check-results:begin -->"
CHECK_END = "<!-- check-results:end -->"


def write_card(out: Path, info: dict) -> None:
    card = out / "README.md"
    mla = info.get("architecture") == "DeepseekV3ForCausalLM"
    check = (f"{CHECK_BEGIN}\nNot yet checked: run `python scripts/check_default_model.py "
             f"--update-card`.\n{CHECK_END}")
    if mla:  # its transformers half builds a LlamaForCausalLM
        check = (f"{CHECK_BEGIN}\nNot checked: `scripts/check_default_model.py` loads the model "
                 f"with `LlamaForCausalLM`.\n{CHECK_END}")
    if card.exists():  # keep earlier check results if present
        old = card.read_text()
        if CHECK_BEGIN in old and CHECK_END in old:
            check = old[old.index(CHECK_BEGIN):old.index(CHECK_END) + len(CHECK_END)]
    if mla:
        card.write_text(mla_card(info, check))
        return
    if info.get("architecture") == "Qwen3NextForCausalLM":
        card.write_text(hybrid_card(info))
        return
    text = f"""# tiny-llama: the project's default model

A small Llama-architecture causal LM (`LlamaForCausalLM`, 4 layers, hidden 256,
4 attention heads, 2 KV heads, head size 64, MLP 704, tied embeddings,
{info['parameters'] / 1e6:.2f} M parameters, float32 safetensors, max 4096 positions)
with a byte-level BPE tokenizer of {info['vocab_size']} tokens (`<unk>` 0, `<s>` 1,
`</s>` 2, `<pad>` 3; the tokenizer prepends `<s>` to every text; BPE merges need
a pair seen twice, so the vocabulary stops short of the 4096 asked for). Both
were trained from scratch by `scripts/train_default_model.py` on the vendored
corpus `{info['corpus']}` (64 topics of CPython 3.11.7's `pydoc_data/topics.py`,
PSF licence, see `models/corpus/README.md`). It memorises that text (training
windows of {info['seq_len']} tokens at random offsets, each after `<s>`), so it gives confident,
prompt-dependent greedy continuations; it is not a useful language model. It
exists so that benchmarks and correctness tests of the serving stack see real,
input-dependent outputs, which vLLM's `load_format="dummy"` weights do not give.

Made with:

    python scripts/train_default_model.py --out models/tiny-llama --seed {info['seed']}

Two runs on the same machine gave bit-identical files; another torch version or
CPU may change the last bits of the weights.

| | |
| --- | --- |
| corpus sha256 | `{info['corpus_sha256']}` |
| corpus tokens | {info['corpus_tokens']} |
| steps x batch x seq len | {info['steps']} x {info['batch_size']} x {info['seq_len']} (+ `<s>`) |
| optimiser | AdamW, lr {info['lr']}, warmup {info['warmup']}, cosine to {info['min_lr_ratio']} x lr, weight decay {info['weight_decay']} |
| seed, threads | {info['seed']}, {info['threads']} |
| final train loss (EMA) / eval loss | {info['final_ema_loss']} / {info['eval_loss']} |
| training time | {info['train_seconds']} s training, {info['total_seconds']} s in all (torch {info['torch']}, {info['threads']} CPU threads) |

`training_info.json` holds the same numbers. Results of
`scripts/check_default_model.py` (vLLM on CPU):

{check}
"""
    card.write_text(text)


def hybrid_card(info: dict) -> str:
    """The card of models/tiny-hybrid (preset tiny_hybrid)."""
    every = info["full_attention_every"]
    attn = info["layers"] // every
    stopped = (f", stopped by train loss (EMA) < {info['stop_loss']} of {info['steps_planned']} planned"
               if info["steps"] < info["steps_planned"] else "")
    return f"""# tiny-hybrid: the default model's recipe on Qwen3-Next's hybrid layers

A small Qwen3-Next-architecture causal LM (`Qwen3NextForCausalLM`) with {info['layers']} layers:
{info['layers'] - attn} Gated DeltaNet (linear attention) layers and every {every}th a full-attention layer, as
Qwen3-Next alternates them. A Gated DeltaNet layer keeps no KV per token: each request carries a
fixed-size recurrent state (a convolution window and a {info['linear_num_value_heads']} x {info['linear_key_head_dim']} x
{info['linear_value_head_dim']} state matrix per layer) however long its prompt; the full-attention layer
keeps K and V of {info['kv_heads']} heads of {info['head_dim']} per token ({info['kv_bytes_per_token']} B/token in bf16). Hidden
{info['hidden']}, {info['heads']} query heads, dense MLP {info['intermediate']} in the linear layers; the attention layer's
MLP is {info['num_experts']} experts ({info['num_experts_per_tok']} per token) and a shared one, because vLLM's Qwen3-Next
wants at least one MoE layer. {info['parameters'] / 1e6:.2f} M parameters, {info['dtype']} safetensors (trained in
float32; vLLM 0.32's CPU Gated DeltaNet kernel takes bf16 only, so the harness runs it in bf16,
conf/model/tiny_hybrid.yaml). The tokenizer is `models/tiny-llama`'s (copied), so the token ids
are the default model's. It memorises the corpus as tiny-llama does.

Made with:

    python scripts/train_default_model.py --preset tiny_hybrid --out models/tiny-hybrid --seed {info['seed']}

| | |
| --- | --- |
| corpus sha256 | `{info['corpus_sha256']}` |
| steps x batch x seq len | {info['steps']} x {info['batch_size']} x {info['seq_len']} (+ `<s>`){stopped} |
| optimiser | AdamW, lr {info['lr']}, warmup {info['warmup']}, cosine to {info['min_lr_ratio']} x lr |
| seed, threads | {info['seed']}, {info['threads']} |
| final train loss (EMA) / eval loss | {info['final_ema_loss']} / {info['eval_loss']} (bf16 weights) |
| training time | {info['train_seconds']} s (torch {info['torch']}, {info['threads']} CPU threads; transformers' PyTorch Gated DeltaNet) |

`training_info.json` holds the same numbers.
"""


def mla_card(info: dict, check: str) -> str:
    """The card of models/tiny-mla (preset tiny_mla): tiny-llama's, with the MLA geometry."""
    latent, rope, hd = info["kv_lora_rank"], info["qk_rope_head_dim"], info["head_dim"]
    width = latent + rope
    stopped = (f", stopped by train loss (EMA) < {info['stop_loss']} of {info['steps_planned']} planned"
               if info["steps"] < info["steps_planned"] else "")
    return f"""# tiny-mla: the default model's recipe on DeepSeek-V3's latent attention

A small DeepSeek-V3-architecture causal LM (`DeepseekV3ForCausalLM`, multi-head
latent attention, MLA) with {info['layers']} layers, hidden {info['hidden']}, {info['heads']} attention heads,
MLP {info['intermediate']}, tied embeddings, {info['parameters'] / 1e6:.2f} M parameters, {info['dtype']} safetensors
(trained in float32; the harness runs it in float32, conf/model/tiny_mla.yaml),
max {info['max_positions']} positions (RoPE theta 10000, interleaved as DeepSeek's, not scaled).
Every layer is a dense MLP (`first_k_dense_replace` = {info['layers']}): the MoE keys of
`config.json` (`n_routed_experts` 4, ...) are there because `DeepseekV3Config`
refuses None, and nothing uses them.

Attention: queries are projected directly from the hidden state
(`q_lora_rank` null); keys and values come from one latent of
{latent} values per token (`kv_lora_rank`) plus one rotary key of {rope} values
(`qk_rope_head_dim`) shared by all heads; per head, query and key have {hd}
non-rotary + {rope} rotary dims and the value {hd} dims (DeepSeek-V3's sizes: vLLM 0.26's CUDA
MLA prefill backends take no others). The KV cache holds, per
token and layer, only the latent and the rotary key, {latent} + {rope} = {width} values,
and no KV heads: {info['layers']} layers x {width} x 4 bytes = {info['kv_bytes_per_token']} bytes of float32 per token,
against tiny-llama's 4 layers x 2 (K, V) x 2 KV heads x 64 x 4 bytes = 4096
bytes. {width} is the one latent width vLLM 0.32's CPU MLA backend (`CPU_MLA`) takes, and
it takes KV blocks of 16 tokens only (`block_size=16`); vLLM turns off prefix
caching and chunked prefill for MLA on CPU.

vLLM 0.32 on CPU computes this model wrongly unless its `rotary_embedding`
custom op is turned off: the CPU kernel behind it rotates a query of shape
(tokens, heads, 64) with more than one head wrongly (a 2-D query, as Llama
passes, is right), and vLLM's MLA layer passes that shape. Given
`compilation_config={{"custom_ops": ["-rotary_embedding"]}}` (the harness gives it to
every MLA engine on CPU), its prompt log-probabilities and greedy tokens equal transformers'; without it
they are deterministic but not the memorised text. (DeepSeek checkpoints with
YaRN scaling use another rotary class, in plain PyTorch on CPU, and are not hit.)

The tokenizer is tiny-llama's (files copied from `models/tiny-llama`, not
retrained: the same {info['vocab_size']} tokens and token ids; the tokenizer prepends `<s>`).
The model was trained from scratch by `scripts/train_default_model.py` (preset
`tiny_mla`) on the same corpus `{info['corpus']}` (see
`models/tiny-llama/README.md` and `models/corpus/README.md`), with tiny-llama's
recipe but a lower learning rate and a longer schedule: with tiny-llama's (lr
0.004, 800 steps) its loss (EMA) ended at 2.93 (tiny-llama: 0.49), and at 1.49
after 2000 steps; at lr {info['lr']} it learns faster (loss EMA at step 250: 4.61 at
lr 0.004, 3.85 at 0.0015, 4.15 at 0.0008). The cosine schedule spans
{info['steps_planned']} steps and training stops once the loss (EMA) is below {info['stop_loss']}, about
as memorised as tiny-llama. It memorises that text, so it gives confident,
prompt-dependent greedy continuations; it is not a useful language model. It
exists so that the serving stack can be run with real outputs on an MLA KV
cache.

The embeddings are tied in training; `model.safetensors` holds the trained
embedding twice, as `model.embed_tokens.weight` and `lm_head.weight`, with
`tie_word_embeddings: false` in `config.json`, because vLLM 0.32's
`DeepseekV3ForCausalLM` does not tie them and refuses a checkpoint without
`lm_head.weight` ({info['weight_bytes']} bytes of safetensors).

Made with:

    python scripts/train_default_model.py --preset tiny_mla --out models/tiny-mla --seed {info['seed']}

| | |
| --- | --- |
| corpus sha256 | `{info['corpus_sha256']}` |
| corpus tokens | {info['corpus_tokens']} |
| steps x batch x seq len | {info['steps']} x {info['batch_size']} x {info['seq_len']} (+ `<s>`){stopped} |
| optimiser | AdamW, lr {info['lr']}, warmup {info['warmup']}, cosine over {info['steps_planned']} steps to {info['min_lr_ratio']} x lr, weight decay {info['weight_decay']} |
| seed, threads | {info['seed']}, {info['threads']} |
| final train loss (EMA) / eval loss ({info['dtype']} weights) | {info['final_ema_loss']} / {info['eval_loss']} |
| training time | {info['train_seconds']} s training, {info['total_seconds']} s in all (torch {info['torch']}, {info['threads']} CPU threads) |

`training_info.json` holds the same numbers. Checks:

{check}
"""


RESULTS_BEGIN = "<!-- training-results:begin -->"
RESULTS_END = "<!-- training-results:end -->"
# Hand-written model cards of the presets other than tiny (committed without weights).
CARDS = {"llama3_8b_kv": REPO / "models" / "llama3-8b-kv" / "README.md"}


def write_results(out: Path, info: dict) -> None:
    """Presets other than tiny: write the training numbers between the
    training-results markers of OUT/README.md, which starts as a copy of the
    preset's card in the repository (a card without the markers is left alone)."""
    card = out / "README.md"
    template = CARDS.get(info["preset"])
    if not card.exists() and template is not None and template.exists():
        card.write_text(template.read_text())
    if not card.exists():
        return
    text = card.read_text()
    if RESULTS_BEGIN not in text or RESULTS_END not in text:
        print(f"{card} has no {RESULTS_BEGIN} marker: training results not written into it")
        return
    where = info["gpu"] or f"{info['threads']} CPU threads"
    stopped = (f", stopped by train loss (EMA) < {info['stop_loss']} of {info['steps_planned']} planned"
               if info["steps"] < info["steps_planned"] else "")
    block = f"""{RESULTS_BEGIN}
Training results (`training_info.json` holds the same numbers):

| | |
| --- | --- |
| geometry | {info['layers']} layers, hidden {info['hidden']}, {info['heads']} query heads, {info['kv_heads']} KV heads of {info['head_dim']}, MLP {info['intermediate']}, max {info['max_positions']} positions |
| parameters, weights | {info['parameters']} ({info['parameters'] / 1e6:.2f} M), {info['weight_bytes']} bytes of {info['dtype']} safetensors |
| KV cache per token | {info['kv_bytes_per_token']} bytes ({info['dtype']}) |
| corpus sha256, tokens | `{info['corpus_sha256']}`, {info['corpus_tokens']} |
| tokenizer | {info['tokenizer']}, {info['vocab_size']} tokens |
| steps x batch x seq len | {info['steps']} x {info['batch_size']} x {info['seq_len']} (+ `<s>`){stopped} |
| optimiser | AdamW, lr {info['lr']}, warmup {info['warmup']}, cosine over {info['steps_planned']} steps to {info['min_lr_ratio']} x lr, weight decay {info['weight_decay']} |
| seed, device, training dtype | {info['seed']}, {info['device']} ({where}), {info['train_dtype']} |
| final train loss (EMA) / eval loss ({info['dtype']} weights) | {info['final_ema_loss']} / {info['eval_loss']} |
| training time | {info['train_seconds']} s training, {info['total_seconds']} s in all (torch {info['torch']}) |
{RESULTS_END}"""
    text = text[:text.index(RESULTS_BEGIN)] + block + text[text.index(RESULTS_END) + len(RESULTS_END):]
    card.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
