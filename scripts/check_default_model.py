#!/usr/bin/env python3
"""Check that the default model gives confident, prompt-dependent output in vLLM.

Runs vLLM (and transformers, for the KV perturbation and the agreement check)
on a fixed set of prompts of mixed lengths and prints, with PASS/FAIL against
the targets of the default-model issue:

* the share of prompt pairs whose 16-token greedy continuations differ (>= 90%);
* the median (>= 1 nat) and 10th percentile of the gap between the top-1 and
  top-2 log-probabilities along the greedy paths (vLLM's logprobs);
* the share of prompts whose continuation changes when the K and V of one KV
  block (the last full block of the prompt, or the only one for prompts shorter
  than a block) are zeroed in every layer (transformers, >= 90%); for
  information also with the first block zeroed, and in vLLM with the prompt
  truncated (first block dropped, or the first half of prompts shorter than
  two blocks; `<s>` is kept);
* the share of prompts whose 16 greedy tokens from vLLM and transformers agree
  (both float32 unless --dtype says otherwise; for information).

Exits 1 when a target is missed.

    python scripts/check_default_model.py [--model models/tiny-llama] [--update-card]

Another model, on a GPU (vLLM there, and transformers too with --hf-device cuda):

    python scripts/check_default_model.py --model DIR --device cuda --hf-device cuda
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from itertools import combinations
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Fixed prompts: generic English, short Python-documentation-like prompts, and
# verbatim excerpts of the training corpus (models/corpus/pydoc_topics.txt)
# cut to a range of lengths.  Token counts include the <s> the tokenizer adds.
PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
    "Once upon a time, there was a",
    "My favourite programming language is",
    "The weather today is",
    "In the beginning",
    "The \"while\" statement is used for",
    "A list comprehension",
    "The \"import\" statement",
    "Dictionaries can be created by",
    "The \"global\" statement is a declaration which",
    "Strings are immutable sequences of",
    "The quick brown fox jumps over the lazy dog. The five boxing wizards jump "
    "quickly. Pack my box with five dozen liquor jugs, and then",
    "When I was a child, I spent every summer at my grandmother's house by the "
    "sea. In the mornings we walked along the beach, and in the afternoons she",
    "Machine learning systems are trained on large amounts of data, and the way "
    "that data is collected, cleaned and labelled has a large effect on how the "
    "resulting model behaves when it is deployed in the real world. For example,",
    "Class definition blocks and arguments to \"exec()\" and \"eval()\" are\nspecial in the context of name resolution. A class definition is an\nexecutable statement that may use",  # 36 tokens
    "A class definition is an executable statement.  The inheritance list\nusually gives a list of base classes (see Metaclasses for more\nadvanced uses), so each item in the list",  # 40 tokens
    "The following table summarizes the operator precedence in Python, from\nhighest precedence (most binding) to lowest precedence (least\nbinding).  Operators in the same box have the",  # 44 tokens
    "A function definition may be wrapped by one or more *decorator*\nexpressions. Decorator expressions are evaluated when the function is\ndefined, in the scope that contains the function definition.  The\nresult must be a callable,",  # 48 tokens
    "**Programmer\u2019s note:** Variables defined in the class definition are\nclass attributes; they are shared by instances.  Instance attributes\ncan be set in a method with \"self.name = value\".  Both class and\ninstance attributes are",  # 52 tokens
    "For user-defined classes which do not define \"__contains__()\" but do\ndefine \"__iter__()\", \"x in y\" is \"True\" if some value \"z\", for which\nthe expression \"x is z or x == z\" is true, is produced while",  # 56 tokens
    "Exceptions are identified by class instances.  The \"except\" clause is\nselected depending on the class of the instance: it must reference the\nclass of the instance or a *non-virtual base class* thereof. The\ninstance can be received by the handler and can",  # 59 tokens
    "The *value* of some objects can change.  Objects whose value can\nchange are said to be *mutable*; objects whose value is unchangeable\nonce they are created are called *immutable*. (The value of an\nimmutable container object that contains a reference to a mutable\nobject can change",  # 62 tokens
    "Exceptions are a means of breaking out of the normal flow of control\nof a code block in order to handle errors or other exceptional\nconditions.  An exception is *raised* at the point where the error is\ndetected; it may be *handled* by the surrounding code block or by any\ncode block that",  # 70 tokens
    "The formal syntax makes no special provision for negative indices in\n*sequences*. However, built-in sequences all provide a \"__getitem__()\"\nmethod that interprets negative indices by adding the length of the\nsequence to the index so that, for example, \"x[-1]\" selects the last\nitem of \"x\". The resulting value must be a nonnegative integer",  # 77 tokens
    "The \"nonlocal\" statement causes the listed identifiers to refer to\npreviously bound variables in the nearest enclosing scope excluding\nglobals. This is important because the default behavior for binding is\nto search the local namespace first.  The statement allows\nencapsulated code to rebind variables outside of the local scope\nbesides the global (module) scope.\n\nNames listed in a \"nonlocal\" statement, unlike those listed in",  # 86 tokens
    "The \"global\" statement is a declaration which holds for the entire\ncurrent code block.  It means that the listed identifiers are to be\ninterpreted as globals.  It would be impossible to assign to a global\nvariable without \"global\", although free variables may refer to\nglobals without being declared global.\n\nNames listed in a \"global\" statement must not be used in the same code\nblock textually preceding that \"global\"",  # 96 tokens
    "An object\u2019s type determines the operations that the object supports\n(e.g., \u201cdoes it have a length?\u201d) and also defines the possible values\nfor objects of that type.  The \"type()\" function returns an object\u2019s\ntype (which is an object itself).  Like its identity, an object\u2019s\n*type* is also unchangeable. [1]\n\nThe *value* of some objects can change.  Objects whose value can\nchange are said to be *mutable*; objects whose value is unchangeable\nonce they are",  # 120 tokens
    "There is ambiguity in the formal syntax here: anything that looks like\nan expression list also looks like a slice list, so any subscription\ncan be interpreted as a slicing.  Rather than further complicating the\nsyntax, this is disambiguated by defining that in this case the\ninterpretation as a subscription takes priority over the\ninterpretation as a slicing (this is the case if the slice list\ncontains no proper slice).\n\nThe semantics for a slicing are as follows.  The primary is indexed\n(using the same \"__getitem__()\" method as normal subscription) with a\nkey that is constructed from the slice list, as follows.  If the",  # 138 tokens
    "If a comma-separated sequence of dict items is given, they are\nevaluated from left to right to define the entries of the dictionary:\neach key object is used as a key into the dictionary to store the\ncorresponding value.  This means that you can specify the same key\nmultiple times in the dict item list, and the final dictionary\u2019s value\nfor that key will be the last one given.\n\nA double asterisk \"**\" denotes *dictionary unpacking*. Its operand\nmust be a *mapping*.  Each mapping item is added to the new\ndictionary.  Later values replace values already set by earlier dict\nitems and earlier dictionary unpackings.\n\nNew in version 3.5: Unpacking into dictionary displays, originally\nproposed by",  # 159 tokens
    "When one or more *parameters* have the form *parameter* \"=\"\n*expression*, the function is said to have \u201cdefault parameter values.\u201d\nFor a parameter with a default value, the corresponding *argument* may\nbe omitted from a call, in which case the parameter\u2019s default value is\nsubstituted.  If a parameter has a default value, all following\nparameters up until the \u201c\"*\"\u201d must also have a default value \u2014 this is\na syntactic restriction that is not expressed by the grammar.\n\n**Default parameter values are evaluated from left to right when the\nfunction definition is executed.** This means that the expression is\nevaluated once, when the function is defined, and that the same \u201cpre-\ncomputed\u201d value is used for each call.  This is especially important\nto understand when a default parameter value is a mutable object, such\nas a list or a dictionary: if the function modifies the object",  # 200 tokens
    "Objects are never explicitly destroyed; however, when they become\nunreachable they may be garbage-collected.  An implementation is\nallowed to postpone garbage collection or omit it altogether \u2014 it is a\nmatter of implementation quality how garbage collection is\nimplemented, as long as no objects are collected that are still\nreachable.\n\n**CPython implementation detail:** CPython currently uses a reference-\ncounting scheme with (optional) delayed detection of cyclically linked\ngarbage, which collects most objects as soon as they become\nunreachable, but is not guaranteed to collect garbage containing\ncircular references.  See the documentation of the \"gc\" module for\ninformation on controlling the collection of cyclic garbage. Other\nimplementations act differently and CPython may change. Do not depend\non immediate finalization of objects when they become unreachable (so\nyou should always close files explicitly).\n\nNote that the use of the implementation\u2019s tracing or debugging\nfacilities may keep",  # 230 tokens
    "Parameters may have an *annotation* of the form \u201c\": expression\"\u201d\nfollowing the parameter name.  Any parameter may have an annotation,\neven those of the form \"*identifier\" or \"**identifier\".  Functions may\nhave \u201creturn\u201d annotation of the form \u201c\"-> expression\"\u201d after the\nparameter list.  These annotations can be any valid Python expression.\nThe presence of annotations does not change the semantics of a\nfunction.  The annotation values are available as values of a\ndictionary keyed by the parameters\u2019 names in the \"__annotations__\"\nattribute of the function object.  If the \"annotations\" import from\n\"__future__\" is used, annotations are preserved as strings at runtime\nwhich enables postponed evaluation.  Otherwise, they are evaluated\nwhen the function definition is executed.  In this case annotations\nmay be evaluated in a different order than they appear in the source\ncode.\n\nIt is also possible to create anonymous functions (functions not bound\nto a name), for immediate use in expressions.  This uses lambda\nexpressions, described in section Lambdas.  Note that the lambda\nexpression is merely a shorthand for a simplified function definition;\na",  # 260 tokens
    "object.__iadd__(self, other)\nobject.__isub__(self, other)\nobject.__imul__(self, other)\nobject.__imatmul__(self, other)\nobject.__itruediv__(self, other)\nobject.__ifloordiv__(self, other)\nobject.__imod__(self, other)\nobject.__ipow__(self, other[, modulo])\nobject.__ilshift__(self, other)\nobject.__irshift__(self, other)\nobject.__iand__(self, other)\nobject.__ixor__(self, other)\nobject.__ior__(self, other)\n\n   These methods are called to implement the augmented arithmetic\n   assignments (\"+=\", \"-=\", \"*=\", \"@=\", \"/=\", \"//=\", \"%=\", \"**=\",\n   \"<<=\", \">>=\", \"&=\", \"^=\", \"|=\").  These methods should attempt to\n   do the operation in-place (modifying *self*) and return the result\n   (which could be, but does not have to be, *self*).  If a specific\n   method is not defined, the augmented assignment falls back to the\n   normal methods.  For instance, if *x* is an instance of a class\n   with an \"__iadd__()\" method, \"x += y\" is equivalent to \"x =\n   x.__iadd__(y)\" . Otherwise, \"x.__add__(y)\" and \"y.__radd__(x)\" are\n   considered, as with the evaluation of \"x",  # 300 tokens
]

TARGET_PAIR_DIFF = 0.90
TARGET_MEDIAN_MARGIN = 1.0
TARGET_KV_ZERO = 0.90


def pct(values, q):
    """q-th percentile (0-100) with linear interpolation."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def last_full_block(n, bs):
    """Positions [s, e) of the last full KV block of an n-token prompt, or of the
    only (partial) block when n < bs; clipped to the n-1 cached positions."""
    if n >= bs:
        k = n // bs - 1
        return bs * k, min(bs * k + bs, n - 1)
    return 0, n - 1


def truncate(ids, bs):
    """Drop the first KV block of the prompt (or the first half of the text of
    a prompt shorter than two blocks), keeping <s> at the front."""
    if len(ids) >= 2 * bs:
        return [ids[0]] + ids[bs:]
    text = ids[1:]
    return [ids[0]] + text[len(text) // 2:]


def hf_runs(model_dir, prompt_ids, n_new, bs, threads, device="cpu", dtype="float32"):
    """Greedy continuations from transformers: plain, last block zeroed, first
    block zeroed.  The prompt minus its last token is prefilled, the cache is
    perturbed, then the last prompt token is fed and n_new tokens decoded."""
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    torch.set_num_threads(threads)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    model.eval()

    @torch.no_grad()
    def greedy(ids, zero=None):
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:-1]], device=device), past_key_values=cache, use_cache=True)
        if zero is not None:
            s, e = zero
            for layer in cache.layers:
                layer.keys[:, :, s:e] = 0
                layer.values[:, :, s:e] = 0
        tok, out = ids[-1], []
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=cache,
                           use_cache=True).logits[0, -1]
            tok = int(logits.argmax())
            out.append(tok)
        return out

    plain, zlast, zfirst = [], [], []
    for ids in prompt_ids:
        plain.append(greedy(ids))
        zlast.append(greedy(ids, last_full_block(len(ids), bs)))
        zfirst.append(greedy(ids, (0, min(bs, len(ids) - 1))))
    if device != "cpu":  # give the GPU memory back before vLLM measures what is free
        del model
        torch.cuda.empty_cache()
    return plain, zlast, zfirst


def vllm_runs(args, prompt_ids, n_new):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    max_len = max(len(i) for i in prompt_ids) + n_new
    max_len = max(512, -(-max_len // args.block_size) * args.block_size)
    t0 = time.time()
    llm = LLM(model=args.model, tokenizer=args.model, dtype=args.dtype,
              block_size=args.block_size, enforce_eager=True, seed=0,
              max_model_len=max_len, max_num_seqs=64)
    start_s = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=n_new, logprobs=2, ignore_eos=True)
    t0 = time.time()
    base = llm.generate(PROMPTS, sp, use_tqdm=False)  # vLLM tokenizes the text itself
    trunc = llm.generate([TokensPrompt(prompt_token_ids=truncate(i, args.block_size))
                          for i in prompt_ids], sp, use_tqdm=False)
    gen_s = time.time() - t0
    toks, margins, tok_ok = [], [], True
    for o, ids in zip(base, prompt_ids):
        if list(o.prompt_token_ids) != ids:
            tok_ok = False
        c = o.outputs[0]
        toks.append(list(c.token_ids))
        m = []
        for t, lp in zip(c.token_ids, c.logprobs):
            by_rank = {v.rank: v.logprob for v in lp.values()}
            m.append(by_rank[1] - by_rank[2])
            if lp[t].rank != 1:
                raise SystemExit(f"greedy token {t} is not rank 1")
        margins.append(m)
    trunc_toks = [list(o.outputs[0].token_ids) for o in trunc]
    del llm
    return toks, margins, trunc_toks, tok_ok, start_s, gen_s


def share(flags):
    return sum(flags) / len(flags)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "tiny-llama"))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where vLLM runs (transformers: see --hf-device)")
    ap.add_argument("--hf-device", default="cpu", choices=["cpu", "cuda"],
                    help="where transformers runs")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="compute dtype of vLLM and transformers (the weights are cast to it)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for transformers")
    ap.add_argument("--update-card", action="store_true",
                    help="write the results into MODEL/README.md")
    args = ap.parse_args()
    t_all = time.time()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

    from transformers import AutoTokenizer

    bs, n_new = args.block_size, args.max_tokens
    tok = AutoTokenizer.from_pretrained(args.model)
    prompt_ids = [tok(p).input_ids for p in PROMPTS]
    lens = [len(i) for i in prompt_ids]

    t0 = time.time()
    hf_plain, hf_zlast, hf_zfirst = hf_runs(args.model, prompt_ids, n_new, bs, args.threads,
                                            args.hf_device, args.dtype)
    hf_s = time.time() - t0
    v_toks, v_margins, v_trunc, tok_ok, start_s, gen_s = vllm_runs(args, prompt_ids, n_new)

    lines = []
    p = lines.append
    shown = Path(args.model).resolve()
    shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
    p(f"model: {shown}   prompts: {len(PROMPTS)}   block size: {bs}   "
      f"greedy tokens: {n_new}   vLLM device: {args.device}"
      + (f"   transformers device: {args.hf_device}" if args.hf_device != "cpu" else "")
      + (f"   dtype: {args.dtype}" if args.dtype != "float32" else ""))
    p(f"prompt lengths (tokens incl. <s>): min {min(lens)}, median {statistics.median(lens)}, "
      f"max {max(lens)}; <{bs}: {sum(n < bs for n in lens)}, {bs}-{2 * bs - 1}: "
      f"{sum(bs <= n < 2 * bs for n in lens)}, >={2 * bs}: {sum(n >= 2 * bs for n in lens)}, "
      f">=200: {sum(n >= 200 for n in lens)}")
    p(f"vLLM tokenization == transformers tokenization: {tok_ok}")
    p("")
    p(f"{'#':>2} {'len':>4} {'min-gap':>7} {'med-gap':>7} {'trunc':>5} {'z-last':>6} {'z-first':>7} {'hf=vllm':>7}  continuation (vLLM)")
    for i, ids in enumerate(prompt_ids):
        cont = tok.decode(v_toks[i]).replace("\n", "\\n")
        p(f"{i:>2} {len(ids):>4} {min(v_margins[i]):7.2f} "
          f"{statistics.median(v_margins[i]):7.2f} {str(v_trunc[i] != v_toks[i]):>5} "
          f"{str(hf_zlast[i] != hf_plain[i]):>6} {str(hf_zfirst[i] != hf_plain[i]):>7} "
          f"{str(hf_plain[i] == v_toks[i]):>7}  {cont[:64]!s}")
    p("")

    pairs = list(combinations(range(len(PROMPTS)), 2))
    pair_diff = share([v_toks[a] != v_toks[b] for a, b in pairs])
    allm = [m for ms in v_margins for m in ms]
    med, p10 = statistics.median(allm), pct(allm, 10)
    trunc_changed = share([a != b for a, b in zip(v_trunc, v_toks)])
    zlast_changed = share([a != b for a, b in zip(hf_zlast, hf_plain)])
    zfirst_changed = share([a != b for a, b in zip(hf_zfirst, hf_plain)])
    agree = share([a == b for a, b in zip(hf_plain, v_toks)])

    def row(name, value, target, ok):
        verdict = "info" if ok is None else ("PASS" if ok else "FAIL")
        p(f"  {name:<62} {value:>9}  {target:<10} {verdict}")
        return ok

    p(f"  {'metric':<62} {'value':>9}  {'target':<10} verdict")
    results = [
        row("prompt pairs whose continuations differ (vLLM)", f"{pair_diff:.1%}",
            f">= {TARGET_PAIR_DIFF:.0%}", pair_diff >= TARGET_PAIR_DIFF),
        row("top-1 - top-2 logprob gap along greedy paths, median (vLLM)", f"{med:.2f} nat",
            f">= {TARGET_MEDIAN_MARGIN:g} nat", med >= TARGET_MEDIAN_MARGIN),
        row("top-1 - top-2 logprob gap, 10th percentile (vLLM)", f"{p10:.2f} nat", "", None),
        row("prompts changed by zeroing last full KV block (transformers)", f"{zlast_changed:.1%}",
            f">= {TARGET_KV_ZERO:.0%}", zlast_changed >= TARGET_KV_ZERO),
        row("prompts changed by zeroing first KV block (transformers)", f"{zfirst_changed:.1%}", "", None),
        row("prompts changed by truncating the prompt (vLLM)", f"{trunc_changed:.1%}", "", None),
        row(f"prompts whose {n_new} greedy tokens agree, vLLM vs transformers", f"{agree:.1%}", "", None),
    ]
    total_s = time.time() - t_all
    p("")
    p(f"time: {total_s:.1f} s in all (transformers {hf_s:.1f} s, vLLM engine start "
      f"{start_s:.1f} s, vLLM generation {gen_s:.1f} s)")
    failed = [r for r in results if r is False]
    p(f"RESULT: {'FAIL' if failed or not tok_ok else 'PASS'}")
    report = "\n".join(lines)
    print(report, flush=True)

    if args.update_card:
        card = Path(args.model) / "README.md"
        begin, end = "<!-- check-results:begin -->", "<!-- check-results:end -->"
        text = card.read_text()
        if begin in text and end in text:
            import vllm
            cmd = "python scripts/check_default_model.py"
            if Path(args.model).resolve() != (REPO / "models" / "tiny-llama").resolve():
                cmd += f" --model {shown}"
            for opt, default in (("device", "cpu"), ("hf_device", "cpu"), ("dtype", "float32"),
                                 ("block_size", 32), ("max_tokens", 16)):
                if getattr(args, opt) != default:
                    cmd += f" --{opt.replace('_', '-')} {getattr(args, opt)}"
            new = (f"{begin}\n`{cmd}` (vLLM {vllm.__version__}, device {args.device}):\n\n"
                   f"```\n{report}\n```\n{end}")
            text = text[:text.index(begin)] + new + text[text.index(end) + len(end):]
            card.write_text(text)
            print(f"updated {card}")
    return 1 if failed or not tok_ok else 0


if __name__ == "__main__":
    sys.exit(main())
