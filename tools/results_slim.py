"""What a committed results tree (results/cpu, results/gpu) keeps, and the slimming that gets it
there: a run directory is committed with what cannot be made again, compressed. This, not a budget
raised as sessions add runs, is what holds results/ to its 15 MB: what is left of each run stays
within tools/results_index.py's RUN_BUDGET_BYTES (256 KiB; tests/test_results_index.py checks both),
and a session that would pass the total archives superseded runs instead.

Each rule names files that are made again or that never mean anything once the run has ended
(`leftovers` finds them, `slim` deals with them; tests/test_results_index.py holds the committed
tree free of them):

    scratch     example-connector-kv/: the KV that vLLM's ExampleConnector (strategy=vllm_example)
                stored on disk as its transport: 60 MB for 10 prompts of 512 and 2048 tokens (removed)
    rendezvous  kv-channel*.port[.p<i>d<j>|.relay<j>]: the port a prefill worker bound, for the decode
                worker to find while the run lasted (removed)
    prompts     a benchmark's prompts.jsonl that bench_prompts makes again byte for byte from the
                runs' bench.lengths and bench.per_length (removed; `write_prompts` makes it again)
    figures     figure<X>.png beside the rows<X>.csv it is drawn from (removed;
                `python scripts/bench_strategies.py --replot DIR` draws it again)
    hydra       .hydra/ of a run whose meta.json holds the resolved config: the loader's config
                is the same without it; its overrides (overrides.yaml) and config group choices
                (hydra.yaml) move into meta.json as `overrides` and `choices` (removed)
    empty_logs  log files of 0 bytes (removed)
    digests     a transfer record's per-block digests (one 16-hex-digit sum per block and KV head:
                most of a long prompt's record, 80 kB at 16k tokens of the Llama-3-8B shape),
                whose verdict requests.jsonl keeps (digest_match): replaced by one fingerprint
                (`digests_sha256`, the SHA-256 of the digests as JSON with sorted keys, first 16
                hex digits), so two records' digests can still be told equal or not
    gzip        every *.jsonl is kept as *.jsonl.gz (harness.records.files.read_jsonl reads either)
    log_paths   absolute paths of the machine a run ran on, in its logs (*.log, *.log.gz,
                *.out.gz), written as placeholders: <venv>/ (a virtualenv), <repo>/ (the
                checkout under /work), <tmp>/, <home>/, <opt>/

    python scripts/slim_results.py results/gpu/<date>-s<session>   # before committing a session's runs
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

RULES = ("scratch", "rendezvous", "prompts", "figures", "hydra", "empty_logs", "digests", "gzip", "log_paths")
TRANSFER_RECORDS = re.compile(r"^(prefill|decode)-transfers.*\.jsonl(\.gz)?$")
RENDEZVOUS = re.compile(r"^kv-channel.*\.port(\.p\d+d\d+|\.relay\d+)?$")
LOG_SUFFIXES = (".log", ".log.gz", ".out.gz")
# in order: a virtualenv anywhere, then the checkout (/work/<name>), then the rest
PLACEHOLDERS = [
    (re.compile(r"(?<![\w.>-])(?:/work/[\w.+-]+|/opt/[\w.+-]+|/home/[\w.+-]+|/root)/\.venv(?=[/\s'\":]|$)"), "<venv>"),
    (re.compile(r"(?<![\w.>-])/work/[\w.+-]+(?=[/\s'\":]|$)"), "<repo>"),
    (re.compile(r"(?<![\w.>-])/tmp(?=/)"), "<tmp>"),
    (re.compile(r"(?<![\w.>-])(?:/home/[\w.+-]+|/root)(?=[/\s'\":]|$)"), "<home>"),
    (re.compile(r"(?<![\w.>-])/opt(?=/)"), "<opt>"),
]
MACHINE_PATH = re.compile(r"(?<![\w.>-])/(?:work|opt|home|root|tmp)(?=/)")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def _runs_under(d: Path) -> list[Path]:
    from harness.report.load import find_runs
    return find_runs(d)


# --- prompts ----------------------------------------------------------------------------------

def bench_shape(bench: Path) -> tuple[list[int], int] | None:
    """(bench.lengths, bench.per_length) of the benchmark in `bench`: from its runs' meta.json
    (every run the same), else from their requests (prompt_len by prompt_idx: each length in turn,
    per_length times, as scripts/bench_strategies.py makes them); None when they say neither."""
    from harness.records.files import read_jsonl
    from harness.report.load import _meta

    runs = _runs_under(bench)
    shapes = {json.dumps([b.get("lengths"), b.get("per_length")])
              for b in ((_meta(r).get("config") or {}).get("bench") for r in runs) if b}
    if len(shapes) == 1:
        lengths, per_length = json.loads(shapes.pop())
        return list(lengths), int(per_length)
    if shapes:
        return None
    by_idx: dict[int, int] = {}
    for r in runs:
        for row in read_jsonl(r / "requests.jsonl"):
            if by_idx.setdefault(row["prompt_idx"], row["prompt_len"]) != row["prompt_len"]:
                return None
    if not by_idx or sorted(by_idx) != list(range(len(by_idx))):
        return None
    seq = [by_idx[i] for i in range(len(by_idx))]
    lengths = list(dict.fromkeys(seq))
    per_length = len(seq) // len(lengths)
    if [n for n in lengths for _ in range(per_length)] != seq:
        return None
    return lengths, per_length


def regenerated_prompts(bench: Path) -> str | None:
    """The benchmark's prompts.jsonl made again, or None when its shape is not known."""
    from harness.workload import bench_prompts

    shape = bench_shape(bench)
    return bench_prompts(*shape) if shape else None


def write_prompts(bench: Path) -> Path:
    """Write a committed benchmark's prompts.jsonl again (what its runs read as workload.path)."""
    text = regenerated_prompts(bench)
    if text is None:
        raise ValueError(f"{bench}: no bench.lengths and bench.per_length in its runs to make prompts.jsonl from")
    (bench / "prompts.jsonl").write_text(text)
    return bench / "prompts.jsonl"


# --- hydra ------------------------------------------------------------------------------------

def hydra_extras(run: Path) -> dict:
    """What .hydra/ holds that meta.json's config does not: the overrides and the config group
    choices (Hydra's own groups left out)."""
    from omegaconf import OmegaConf

    extras = {}
    overrides = run / ".hydra" / "overrides.yaml"
    if overrides.exists():
        extras["overrides"] = list(OmegaConf.to_container(OmegaConf.load(overrides)) or [])
    hydra = run / ".hydra" / "hydra.yaml"
    if hydra.exists():
        choices = OmegaConf.to_container(OmegaConf.load(hydra), resolve=False).get("hydra", {}) \
            .get("runtime", {}).get("choices", {})
        extras["choices"] = {k: v for k, v in choices.items() if not k.startswith("hydra/")}
    return extras


def _hydra_droppable(run: Path) -> bool:
    from harness.report.load import _meta
    return bool(_meta(run).get("config"))


def drop_hydra(run: Path) -> None:
    """Move .hydra/'s overrides and choices into meta.json and remove .hydra/, checking that the
    loader's config of the run is the same after."""
    from harness.report.load import _meta, run_config

    before = run_config(run)
    meta = _meta(run)
    for k, v in hydra_extras(run).items():
        if k in meta and meta[k] != v:
            raise ValueError(f"{run}: meta.json's {k} {meta[k]!r} differs from .hydra's {v!r}")
        meta[k] = v
    backup = run / ".hydra.bak"
    (run / ".hydra").rename(backup)
    after = run_config(run)
    if json.dumps(after, sort_keys=True, default=str) != json.dumps(before, sort_keys=True, default=str):
        backup.rename(run / ".hydra")
        raise ValueError(f"{run}: the config differs without .hydra/: kept")
    ending = "\n" if (run / "meta.json").read_text().endswith("\n") else ""
    (run / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + ending)  # as records.files.write_json
    shutil.rmtree(backup)


# --- logs -------------------------------------------------------------------------------------

def without_machine_paths(text: str) -> str:
    for pattern, placeholder in PLACEHOLDERS:
        text = pattern.sub(placeholder, text)
    return text


def _log_text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.name.endswith(".gz") else data).decode(errors="surrogateescape")


def _write_log(path: Path, text: str) -> None:
    data = text.encode(errors="surrogateescape")
    path.write_bytes(gzip.compress(data, 9, mtime=0) if path.name.endswith(".gz") else data)


def _is_log(p: Path) -> bool:
    return p.name.endswith(LOG_SUFFIXES)


# --- the rules --------------------------------------------------------------------------------

def _find_prompts(root: Path) -> list[Path]:
    return [p for p in _files(root) if p.name == "prompts.jsonl" and regenerated_prompts(p.parent) == p.read_text()]


def _find_figures(root: Path) -> list[Path]:
    return [p for p in _files(root) if re.fullmatch(r"figure.*\.png", p.name)
            and (p.parent / f"rows{p.name.removeprefix('figure').removesuffix('.png')}.csv").exists()]


def _with_digests(p: Path) -> bool:
    return any(json.loads(line).get("digests") for line in _log_text(p).splitlines() if line.strip())


def digests_fingerprint(digests) -> str:
    return hashlib.sha256(json.dumps(digests, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _fingerprint_digests(p: Path) -> None:
    out = []
    for line in _log_text(p).splitlines():
        r = json.loads(line) if line.strip() else None
        if r and r.get("digests"):
            r["digests_sha256"], r["digests"] = digests_fingerprint(r["digests"]), None
        out.append(line if r is None else json.dumps(r))
    _write_log(p, "\n".join(out) + "\n")


def _find_hydra(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob(".hydra") if p.is_dir() and _hydra_droppable(p.parent))


FIND: dict[str, Callable[[Path], list[Path]]] = {
    "scratch": lambda root: sorted(p for p in Path(root).rglob("example-connector-kv") if p.is_dir()),
    "rendezvous": lambda root: [p for p in _files(root) if RENDEZVOUS.match(p.name)],
    "prompts": _find_prompts,
    "figures": _find_figures,
    "hydra": _find_hydra,
    "empty_logs": lambda root: [p for p in _files(root) if _is_log(p) and p.stat().st_size == 0],
    "digests": lambda root: [p for p in _files(root) if TRANSFER_RECORDS.match(p.name) and _with_digests(p)],
    "gzip": lambda root: [p for p in _files(root) if p.name.endswith(".jsonl")],
    "log_paths": lambda root: [p for p in _files(root) if _is_log(p) and MACHINE_PATH.search(_log_text(p))],
}


def _gzip(p: Path) -> None:
    zipped = p.with_name(p.name + ".gz")
    if zipped.exists():
        raise ValueError(f"{p}: {zipped.name} is there too")
    zipped.write_bytes(gzip.compress(p.read_bytes(), 9, mtime=0))
    p.unlink()


APPLY: dict[str, Callable[[Path], None]] = {
    "scratch": shutil.rmtree,
    "rendezvous": Path.unlink,
    "prompts": Path.unlink,
    "figures": Path.unlink,
    "hydra": lambda p: drop_hydra(p.parent),
    "empty_logs": Path.unlink,
    "digests": _fingerprint_digests,
    "gzip": _gzip,
    "log_paths": lambda p: _write_log(p, without_machine_paths(_log_text(p))),
}


def leftovers(root: Path, rules: tuple[str, ...] = RULES) -> dict[str, list[Path]]:
    """The files (for hydra: the .hydra directories) under root that a rule would still change."""
    return {rule: FIND[rule](Path(root)) for rule in rules}


def slim(root: Path, rules: tuple[str, ...] = RULES, dry_run: bool = False) -> dict[str, list[Path]]:
    """Apply the rules under root, in order; what each changed."""
    done = {}
    for rule in rules:
        found = FIND[rule](Path(root))
        if not dry_run:
            for p in found:
                APPLY[rule](p)
        done[rule] = found
    return done
