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


def model_config(vocab_size: int, bos_id: int, eos_id: int, pad_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )


def lr_at(step: int, steps: int, lr: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "models" / "tiny-llama"))
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--write-corpus", action="store_true",
                    help="regenerate --corpus from this Python's pydoc_data first")
    ap.add_argument("--max-topic-chars", type=int, default=8000,
                    help="with --write-corpus: keep the topics shorter than this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="also stop after this many minutes of training "
                         "(0: no limit; a limit makes the result machine-dependent)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()

    t_start = time.time()
    corpus = Path(args.corpus)
    if args.write_corpus:
        write_corpus(corpus, args.max_topic_chars)

    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic BPE training
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    docs, corpus_sha = read_docs(corpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- tokenizer -------------------------------------------------------
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
    cfg = model_config(vocab, bos_id, eos_id, pad_id)
    model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)

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

    model.train()
    t_train = time.time()
    ema = None
    step = 0
    for step in range(args.steps):
        if args.minutes and time.time() - t_train > args.minutes * 60:
            print(f"time limit reached at step {step}", flush=True)
            break
        offs = torch.randint(0, max_off + 1, (args.batch_size,), generator=gen)
        x = torch.cat([bos_col, data[offs[:, None] + ar]], dim=1)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup, args.min_lr_ratio)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {lv:.4f}  ema {ema:.4f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {time.time() - t_train:6.1f}s",
                  flush=True)
    steps_done = step + 1
    train_s = time.time() - t_train

    # ---- evaluate loss on fixed windows ------------------------------------
    model.eval()
    eg = torch.Generator().manual_seed(12345)
    offs = torch.randint(0, max_off + 1, (32,), generator=eg)
    with torch.no_grad():
        x = torch.cat([torch.full((32, 1), bos_id), data[offs[:, None] + ar]], dim=1)
        eval_loss = model(input_ids=x, labels=x).loss.item()
    print(f"eval loss (32 fixed corpus windows): {eval_loss:.4f}", flush=True)

    # ---- save ----------------------------------------------------------------
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
                     do_sample=False).save_pretrained(str(out))
    total_s = time.time() - t_start
    info = {
        "corpus": str(corpus.relative_to(REPO)) if corpus.is_relative_to(REPO) else str(corpus),
        "corpus_sha256": corpus_sha,
        "corpus_tokens": len(stream),
        "vocab_size": vocab,
        "parameters": n_params,
        "seed": args.seed,
        "steps": steps_done,
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
    write_card(out, info)
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
    check = (f"{CHECK_BEGIN}\nNot yet checked: run `python scripts/check_default_model.py "
             f"--update-card`.\n{CHECK_END}")
    if card.exists():  # keep earlier check results if present
        old = card.read_text()
        if CHECK_BEGIN in old and CHECK_END in old:
            check = old[old.index(CHECK_BEGIN):old.index(CHECK_END) + len(CHECK_END)]
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


if __name__ == "__main__":
    sys.exit(main())
