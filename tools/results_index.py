"""results/INDEX.md: every committed run directory (results/cpu, results/gpu) in one table, so that
a reader finds any run, what wrote it and which documents cite it; and results/FINDINGS.md, the
headline figures read again from their records (tools/results_findings.py, from
results/headlines.yaml), which INDEX.md links.

    python scripts/results_index.py           # write results/FINDINGS.md and results/INDEX.md
    python scripts/results_index.py --check   # exit 1, one line per problem, when either is not what this
                                              # writes or a headline does not hold

A run directory is what harness.report.load.find_runs finds (a directory holding summary.json or
requests.jsonl[.gz]); its row gives its date (its session directory's, results/<device>/
<date>-s<session>[-<topic>]), device, model, strategy, status, schema version and git sha from its
summary.json and meta.json, and the documents citing it: a README (or FINDINGS.md, a page of docs/,
CHANGELOG.md, TIERS.md) cites a run when it names the run's path or a path above it, below the device directory
(`results/gpu/2026-12-03-s18/ttft-early/`, `gpu/2026-12-03-s18/`, or relative to the document's
own directory; `*` matches within one path component).

The archived directories (tools/results_archived.py: removed from the tree, restored from the
commit named) and the renamed ones (RENAMED, here) are checked when the index is written, as are
the size budgets that keep git lean (tests/test_results_index.py holds the tree to them).
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
from pathlib import Path

from harness import PROJECT_ROOT
from tools import results_findings
from tools.results_archived import ARCHIVED, BEFORE_SLIMMING

DEVICES = ("cpu", "gpu")
INDEX = Path("results") / "INDEX.md"
SESSION = re.compile(r"^(\d{4}-\d{2}-\d{2})-s(\d+)(?:-(.+))?$")  # <date>-s<session>[-<topic>]

# What keeps git lean is a rule about what each run keeps, not a budget raised when results/ grows: a
# committed run directory keeps what cannot be made again, compressed (tools/results_slim.py's rules),
# and its own files (not those of runs below it) stay within RUN_BUDGET_BYTES (a 1,000-request soak,
# 0.92 MiB, did not fit and was archived). results/ stays within TOTAL_BUDGET_BYTES (what git holds):
# a session whose runs would pass it archives runs a later one supersedes (ARCHIVED) rather than
# raising it. A run allowed more than RUN_BUDGET_BYTES is listed in OVER_BUDGET_ALLOWED with the reason.
RUN_BUDGET_BYTES = 256 << 10
TOTAL_BUDGET_BYTES = 15_000_000
OVER_BUDGET_ALLOWED: dict[str, str] = {}

# the GPU sessions' old names (until issue 27): records and notes written then still use them
RENAMED = {f"gpu/session{n}": f"gpu/{d}-s{n}" for n, d in [
    (1, "2026-11-30"), (2, "2026-11-30"), (3, "2026-11-30"), (4, "2026-11-30"), (5, "2026-11-30"),
    (6, "2026-11-30"), (8, "2026-12-01"), (9, "2026-12-01"), (10, "2026-12-01"), (11, "2026-12-01"),
    (12, "2026-12-01"), (13, "2026-12-01"), (14, "2026-12-02"), (15, "2026-12-02"), (16, "2026-12-03"),
    (18, "2026-12-03")]}


# --- what cites what --------------------------------------------------------------------------

def citing_docs(root: Path = PROJECT_ROOT) -> list[Path]:
    """The documents whose citations INDEX.md lists: the READMEs, docs/, the changelog, the
    headline figures, the test tiers, results/'s notes."""
    root = Path(root)
    docs = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").rglob("*.md")),
            root / "tests" / "TIERS.md", root / "results" / "README.md", root / results_findings.FINDINGS]
    docs += sorted(root.glob("models/*/README.md")) + sorted(root.glob("scripts/**/README.md"))
    for device in DEVICES:
        d = root / "results" / device
        docs += sorted(p for name in ("README.md", "strategies.md") for p in d.rglob(name))
    return [p for p in dict.fromkeys(docs) if p.is_file()]


def _dirs(root: Path) -> set[str]:
    """Every directory under results/<device>, as a path relative to the project root."""
    out = set()
    for device in DEVICES:
        base = root / "results" / device
        out.update(p.relative_to(root).as_posix() for p in base.rglob("*") if p.is_dir())
    return out


def cited_dirs(doc: Path, root: Path = PROJECT_ROOT, dirs: set[str] | None = None) -> set[str]:
    """The directories under results/<device> (relative to the project root) a document names:
    each path-like word, read from the document's directory (and those above it, for a document
    in results/), the project root, results/ or a device directory, up to its longest leading part
    that is a directory (the base giving the longest one wins; `*` within a component that names
    something, as in `check-*`)."""
    root = Path(root)
    dirs = _dirs(root) if dirs is None else dirs
    here = doc.parent.relative_to(root).as_posix()
    bases = [here]
    while here.startswith("results/") and here.count("/") > 1:
        here = posixpath.dirname(here)
        bases.append(here)
    bases = list(dict.fromkeys([*bases, "", "results", *(f"results/{d}" for d in DEVICES)]))
    found = set()
    for word in set(re.findall(r"[\w.*/-]+", doc.read_text())):
        parts = [p for p in word.strip("./").split("/") if p]
        if not parts or any(("*" in p or "?" in p) and not re.search(r"\w", p) for p in parts):
            continue
        best: tuple[int, set[str]] = (0, set())
        for base in bases:
            for k in range(len(parts), best[0], -1):
                candidate = posixpath.normpath(posixpath.join(base, *parts[:k]))
                if "*" in candidate or "?" in candidate:
                    depth = candidate.count("/")
                    hits = {d for d in dirs if d.count("/") == depth and fnmatch.fnmatchcase(d, candidate)}
                else:
                    hits = {candidate} & dirs
                if hits:
                    best = (k, hits)
                    break
        found |= best[1]
    return found


def citations(paths: list[str], root: Path = PROJECT_ROOT, below: bool = False) -> dict[str, list[str]]:
    """For each directory (relative to the project root), the documents citing it or a directory
    above it (with below: or one under it, as for a session directory)."""
    root = Path(root)
    dirs = _dirs(root)
    cited = {doc.relative_to(root).as_posix(): cited_dirs(doc, root, dirs) for doc in citing_docs(root)}

    def cites(ds: set[str], path: str) -> bool:
        return any(path == d or path.startswith(d + "/") or (below and d.startswith(path + "/")) for d in ds)

    return {path: [doc for doc, ds in cited.items() if cites(ds, path)] for path in paths}


# --- the runs ---------------------------------------------------------------------------------

def run_dirs(root: Path = PROJECT_ROOT) -> list[Path]:
    from harness.report.load import find_runs
    return find_runs(*(Path(root) / "results" / d for d in DEVICES))


def session_of(run: Path, root: Path = PROJECT_ROOT) -> Path:
    """results/<device>/<session directory> holding the run."""
    rel = run.relative_to(Path(root) / "results")
    return Path(root) / "results" / rel.parts[0] / rel.parts[1]


def run_bytes(run: Path, runs: list[Path]) -> int:
    """The bytes of the run's own files: those under it, less those of runs below it."""
    nested = [r for r in runs if r != run and run in r.parents]
    return sum(p.stat().st_size for p in run.rglob("*")
               if p.is_file() and not any(r in p.parents for r in nested))


def results_bytes(root: Path = PROJECT_ROOT) -> int:
    """Every file of results/ but the git-ignored run outputs (results/runs, sweeps, bench, tests)."""
    base = Path(root) / "results"
    files = [p for p in base.iterdir() if p.is_file()]
    files += [p for d in DEVICES for p in (base / d).rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _session_key(name: str) -> tuple:
    match = SESSION.match(name)
    return (match.group(1), int(match.group(2)), match.group(3) or "") if match else ("", 0, name)


def run_row(run: Path, root: Path = PROJECT_ROOT) -> dict:
    summary, meta = _read(run / "summary.json"), _read(run / "meta.json")
    versions = meta.get("versions") or {}
    sha = versions.get("git_sha") or ""
    session = SESSION.match(session_of(run, root).name)
    strategy = summary.get("strategy") or meta.get("strategy") or ""
    if (summary.get("runner") or meta.get("runner")) == "serve":
        strategy += " (serve)"
    return {
        "run": run.relative_to(Path(root) / "results").as_posix(),
        "date": session.group(1) if session else "",
        "session": int(session.group(2)) if session else 0,
        "device": versions.get("device") or summary.get("device") or "",
        "model": meta.get("model") or summary.get("model") or "",
        "strategy": strategy,
        "status": summary.get("status") or "(no summary)",
        "schema": summary.get("schema_version", 1),
        "git_sha": sha[:7] + ("-dirty" if sha.endswith("-dirty") else ""),
    }


# --- INDEX.md ---------------------------------------------------------------------------------

def check_tree(root: Path = PROJECT_ROOT) -> list[str]:
    """What is wrong with ARCHIVED and RENAMED: an archived directory still there, a new name gone."""
    root = Path(root)
    errors = [f"archived results/{a.path} is still in the tree" for a in ARCHIVED
              if (root / "results" / a.path).exists()]
    archived = {a.path for a in ARCHIVED}  # renamed once, archived since
    errors += [f"renamed results/{new} does not exist" for new in RENAMED.values()
               if not (root / "results" / new).is_dir() and new not in archived]
    return errors


def _cell(v) -> str:
    return str(v).replace("|", "\\|")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _bench_prompts(root: Path) -> list[tuple[str, str]]:
    """The committed benchmarks whose prompts are made again: (directory, lengths x per_length)."""
    from tools.results_slim import bench_shape

    out = []
    for d in DEVICES:
        for rows in sorted((Path(root) / "results" / d).rglob("rows*.csv")):
            bench = rows.parent
            if any(b[0] == bench.relative_to(Path(root) / "results").as_posix() for b in out):
                continue
            metas = [_read(r / "meta.json") for r in run_dirs(root) if bench in r.parents]
            if not metas or any((m.get("config") or {}).get("workload", {}).get("name") != "jsonl" for m in metas):
                continue
            shape = bench_shape(bench)
            if shape:
                out.append((bench.relative_to(Path(root) / "results").as_posix(),
                            f"{', '.join(map(str, shape[0]))} tokens x {shape[1]}"))
    return out


def render(root: Path = PROJECT_ROOT) -> str:
    """INDEX.md's text; raises ValueError when an archived or a renamed entry is wrong."""
    root = Path(root)
    errors = check_tree(root)
    if errors:
        raise ValueError("\n".join(errors))
    runs = run_dirs(root)
    rows = sorted((run_row(r, root) for r in runs), key=lambda r: (r["run"].split("/")[0], r["date"], r["session"],
                                                                    r["run"]))
    cites = citations([f"results/{r['run']}" for r in rows], root)
    session_dirs = sorted((p for d in DEVICES for p in (root / "results" / d).iterdir() if p.is_dir()),
                          key=lambda p: (p.parent.name, *_session_key(p.name)))
    session_cites = citations([p.relative_to(root).as_posix() for p in session_dirs], root, below=True)
    sessions = []
    for p in session_dirs:
        rel = p.relative_to(root / "results").as_posix()
        match = SESSION.match(p.name)
        sessions.append([f"[`{rel}/`]({rel}/)", match.group(1) if match else "",
                         sum(r["run"].startswith(rel + "/") for r in rows),
                         ", ".join(session_cites[f"results/{rel}"]) or "-"])

    out = [
        "# Committed results: the index",
        "",
        "Written by `python scripts/results_index.py` (tools/results_index.py) from the run directories under",
        "`results/cpu` and `results/gpu`; `python scripts/results_index.py --check` (and tests/test_results_index.py)",
        "fails when this file is not what it writes. Do not edit it by hand: the archived directories are kept",
        "in tools/results_archived.py, the renamed ones in tools/results_index.py. The headline figures, each",
        "read again from its run directory's records: [FINDINGS.md](FINDINGS.md) (from",
        "[headlines.yaml](headlines.yaml)). What each",
        "file of a run directory holds, and what is kept out of git: [README.md](README.md).",
        "",
        "## Sessions",
        "",
        "One directory per session and device, `results/<device>/<date>-s<session>[-<topic>]`: the session",
        "number counts this project's working sessions (CPU and GPU alike), the date is the session's. A",
        "GPU session holds each benchmark it brought back as a subdirectory.",
        "",
        _table(["session directory", "date", "run directories", "cited by (it or a directory in it)"], sessions),
        "",
        "## Run directories",
        "",
        "Every directory the loader reads (`harness.report.load.load_runs(\"results/cpu\", \"results/gpu\")`), with",
        "its summary.json and meta.json: status and schema version as the run wrote them, the git sha it ran",
        "(short; `-dirty`: with uncommitted changes, which its meta.json describes). \"cited by\": the documents",
        "naming its path or a path above it.",
        "",
        _table(["run directory", "date", "device", "model", "strategy", "status", "schema", "git sha", "cited by"],
               [[f"[`{r['run']}`]({r['run']}/)", r["date"], r["device"], r["model"], r["strategy"], r["status"],
                 r["schema"], r["git_sha"], ", ".join(cites[f"results/{r['run']}"]) or "-"] for r in rows]),
        "",
        "## Made again, not committed",
        "",
        "tools/results_slim.py lists what a committed run directory leaves out and `python",
        "scripts/slim_results.py DIR` slims a session's directory before it is committed (.gitignore keeps",
        "the rest out). What the committed runs leave out since the commit after "
        f"`{BEFORE_SLIMMING[:7]}`, and how to have each again:",
        "",
        "- a benchmark's `prompts.jsonl` (scripts/bench_strategies.py's seeded prompts, which its runs read as",
        "  workload.path): `python scripts/slim_results.py --prompts DIR`, from the runs' bench.lengths and",
        "  bench.per_length (or their requests' lengths); the 16 files removed come back byte for byte (a test",
        "  holds their hashes), the other benchmarks' were never committed:",
        "",
        _table(["benchmark", "prompts"], [[f"`{b}`", shape] for b, shape in _bench_prompts(root)]),
        "",
        "- the benchmarks' `figure*.png`: `python scripts/bench_strategies.py --replot DIR` (from rows*.csv);",
        "- `.hydra/`: meta.json holds the resolved config (the loader reads it) and, moved there, the overrides",
        "  and the config group choices;",
        "- `kv-channel*.port*` (the workers' rendezvous) and empty logs: nothing to have again;",
        "- records (`*.jsonl`) are committed gzipped (`*.jsonl.gz`), read by `harness.records.files.read_jsonl`;",
        "  machine paths in logs are written `<venv>/`, `<repo>/`, `<tmp>/`, `<home>/`.",
        "",
        f"Any removed file: `git show {BEFORE_SLIMMING[:12]}:results/<old path>` (old names below).",
        "",
        "## Size budgets",
        "",
        f"results/ stays within {TOTAL_BUDGET_BYTES / 1e6:g} MB (what git holds) by what each run keeps, not by",
        "raising the budget (tests/test_results_index.py holds the tree to it):",
        "",
        "- a committed run directory keeps what cannot be made again, compressed, and nothing the slimming",
        "  rules leave out (above; `python scripts/slim_results.py DIR` before committing a session);",
        f"- its own files (not those of runs below it) stay within {RUN_BUDGET_BYTES >> 10} KiB"
        + (": allowed more: " + "; ".join(f"`{k}` ({v})" for k, v in OVER_BUDGET_ALLOWED.items())
           if OVER_BUDGET_ALLOWED else "; no run is allowed more") + ";",
        f"- a session whose runs would take results/ past {TOTAL_BUDGET_BYTES / 1e6:g} MB archives what a later run",
        "  supersedes (below) instead.",
        "",
        "## Archived",
        "",
        "Runs that no document or test cites, removed from the tree. Each comes back with",
        "`git checkout <commit> -- results/<path>` (or `git show <commit>:results/<path>/<file>`).",
        "",
        (_table(["directory (at that commit)", "commit", "why"],
                [[f"`{a.path}`", f"`{a.commit[:12]}`", a.why] for a in ARCHIVED]) if ARCHIVED else
         "None so far: every committed run directory is cited by a document (the table above), so all stay."),
        "",
        "## Renamed",
        "",
        "The GPU sessions' directories until issue 27 (records and notes written then, such as meta.json's",
        "notes, command.txt and compare-*.txt, keep the old names):",
        "",
        _table(["old", "new"], [[f"`results/{old}/`", f"[`results/{new}/`]({new}/)"] for old, new in RENAMED.items()]),
        "",
    ]
    return "\n".join(out)


def write(root: Path = PROJECT_ROOT) -> list[Path]:
    """FINDINGS.md, then INDEX.md (whose citations read FINDINGS.md)."""
    findings = results_findings.write(root)
    path = Path(root) / INDEX
    path.write_text(render(root))
    return [findings, path]


def is_current(root: Path = PROJECT_ROOT) -> bool:
    path = Path(root) / INDEX
    return results_findings.is_current(root) and path.exists() and path.read_text() == render(root)


def problems(root: Path = PROJECT_ROOT) -> list[str]:
    """Every reason the committed FINDINGS.md and INDEX.md are not what the script writes, one line
    each: a headline that does not hold, an archived or renamed entry that is wrong, a file stale."""
    root = Path(root)
    out = results_findings.check(root)
    if not out and not results_findings.is_current(root):
        out.append(f"{results_findings.FINDINGS} is not what {results_findings.HEADLINES} and the records write: "
                   "python scripts/results_index.py")
    tree = check_tree(root)
    out += tree
    if not tree and not ((root / INDEX).exists() and (root / INDEX).read_text() == render(root)):
        out.append(f"{INDEX} is not current: python scripts/results_index.py")
    return out


def over_budget(root: Path = PROJECT_ROOT) -> dict[str, int]:
    """The run directories (relative to results/) whose own files pass RUN_BUDGET_BYTES, unless allowed."""
    runs = run_dirs(root)
    sizes = {r.relative_to(Path(root) / "results").as_posix(): run_bytes(r, runs) for r in runs}
    return {r: n for r, n in sizes.items() if n > RUN_BUDGET_BYTES and r not in OVER_BUDGET_ALLOWED}

