"""results/FINDINGS.md: the headline figures, each read again from the records of the run directory
results/headlines.yaml names, so that the figure a document points readers to is the one its
records give, and a figure measured again (or a run directory archived) cannot leave a stale one
behind. tools/results_index.py writes and checks it with INDEX.md (scripts/results_index.py).

results/headlines.yaml is a list of headlines, each:

    what      what the figure says
    run       the run directory it comes from, relative to results/
    measured  the command that made it (as the run's command.txt, meta.json or notes give it)
    figure    the figure's text, with {name} where each value goes
    values    {name: how to read it from the records, and what it is}:
      from      relative to `run` (default: `run` itself): a directory (the requests of every run
                under it: harness.report.load.load_requests), or a file the run wrote: .json (`key`
                a dotted path), .csv (`where` picks one row, `key` the column) or .txt (one number)
      where     {column: value, or a list of values}: the requests (or the CSV row) kept
      key       a request field, the JSON key or the CSV column
      stat      of the requests' values: p50 (their median, with the 95% bootstrap interval the
                benchmark tables give: harness.records.stats.p50_with_interval), mean, min, max
      minus, over  another value read the same way (from, where, key, stat): the figure is the
                difference or the ratio of the two
      format    the precision stated: a Python format spec (".1f", "+.1f", ".3g", ".0%")
      unit      written after the value
      value     the figure at that precision
      interval  [lo, hi] at that precision: a p50's bootstrap interval, a JSON or CSV value's
                <key>_lo and <key>_hi beside it

A value holds when its records, formatted as stated, give the value (and interval) stated;
FINDINGS.md is written from what the records give, so it never shows a figure they do not.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

from harness import PROJECT_ROOT

HEADLINES = Path("results") / "headlines.yaml"
FINDINGS = Path("results") / "FINDINGS.md"
HEADLINE_KEYS = {"what", "run", "measured", "figure", "values"}
SOURCE_KEYS = {"from", "where", "key", "stat"}
VALUE_KEYS = SOURCE_KEYS | {"minus", "over", "format", "unit", "value", "interval"}
STATS = ("p50", "mean", "min", "max")


class Unreadable(ValueError):
    """A value its records cannot give: a file or column missing, no request left by `where`."""


@dataclass
class Reading:
    value: float
    lo: float | None = None
    hi: float | None = None


# --- the YAML ---------------------------------------------------------------------------------

def load(root: Path = PROJECT_ROOT) -> list[dict]:
    import yaml

    path = Path(root) / HEADLINES
    try:
        headlines = yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError as e:
        raise ValueError(f"{HEADLINES}: {e}") from None
    if not isinstance(headlines, list):
        raise ValueError(f"{HEADLINES}: not a list of headlines")
    return headlines


def schema_errors(h: dict) -> list[str]:
    """What keeps a headline from being read at all: keys missing or unknown, a figure naming a
    value that is not there (or the other way round), a stat or format that is not one."""
    if not isinstance(h, dict):
        return ["not a mapping"]
    errors = [f"missing {k!r}" for k in sorted(HEADLINE_KEYS - set(h))]
    errors += [f"{k} is not text" for k in ("what", "run", "measured", "figure") if k in h and
               not isinstance(h[k], str)]
    errors += [f"unknown key {k!r}" for k in sorted(set(h) - HEADLINE_KEYS)]
    values = h.get("values") or {}
    if not isinstance(values, dict) or not values:
        return [*errors, "values: not a mapping of names to values"]
    try:
        named = {f for _, f, _, _ in string.Formatter().parse(str(h.get("figure", ""))) if f is not None}
    except ValueError as e:
        return [*errors, f"figure: {e}"]
    errors += [f"figure names {n!r}, which values lacks" for n in sorted(named - set(values))]
    errors += [f"values: {n!r} is not in the figure" for n in sorted(set(values) - named)]
    for name, v in values.items():
        if not isinstance(v, dict):
            errors.append(f"{name}: not a mapping")
            continue
        errors += [f"{name}: unknown key {k!r}" for k in sorted(set(v) - VALUE_KEYS)]
        errors += [f"{name}: missing {k!r}" for k in ("key", "format", "value") if k not in v and
                   not (k == "key" and str(v.get("from", "")).endswith(".txt"))]
        for part in ("minus", "over"):
            if part in v and (not isinstance(v[part], dict) or set(v[part]) - SOURCE_KEYS):
                errors.append(f"{name}: {part} takes only {sorted(SOURCE_KEYS)}")
        if "minus" in v and "over" in v:
            errors.append(f"{name}: minus or over, not both")
        for s in (v, v.get("minus") or {}, v.get("over") or {}):
            if isinstance(s, dict) and s.get("stat", "p50") not in STATS:
                errors.append(f"{name}: stat {s.get('stat')!r} is not one of {', '.join(STATS)}")
        number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
        if "value" in v and not number(v["value"]):
            errors.append(f"{name}: value {v['value']!r} is not a number")
        if "interval" in v and (not isinstance(v["interval"], list) or len(v["interval"]) != 2
                                or not all(map(number, v["interval"]))):
            errors.append(f"{name}: interval is not [lo, hi]")
        for s in (v, v.get("minus") or {}, v.get("over") or {}):
            if isinstance(s, dict) and not isinstance(s.get("where") or {}, dict):
                errors.append(f"{name}: where is not a mapping of columns to values")
        try:
            _fmt(0.0, v.get("format", ""))
        except (ValueError, TypeError):
            errors.append(f"{name}: format {v.get('format')!r} is not a format spec")
    return errors


# --- reading the records ----------------------------------------------------------------------

class Records:
    """The records read so far, each file or directory once per check."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self._cache: dict[Path, object] = {}

    def _get(self, path: Path, read):
        if path not in self._cache:
            self._cache[path] = read(path)
        return self._cache[path]

    def read(self, run: str, source: dict) -> Reading:
        path = self.base / run / str(source.get("from", "."))
        where = source.get("where") or {}
        shown = (Path(run) / str(source.get("from", "."))).as_posix()
        if not path.exists():
            raise Unreadable(f"results/{shown} does not exist")
        if "key" not in source and path.suffix != ".txt":
            raise Unreadable(f"results/{shown}: no key to read")
        if path.is_dir():
            return self._requests(path, shown, where, source["key"], source.get("stat", "p50"))
        if "stat" in source or (where and path.suffix != ".csv"):  # said, but nothing would heed it
            raise Unreadable(f"results/{shown}: stat is for requests, where for requests and CSV rows")
        if path.suffix == ".json":
            return self._json(path, shown, source["key"])
        if path.suffix == ".csv":
            return self._csv(path, shown, where, source["key"])
        if path.suffix == ".txt":
            try:
                return Reading(float(path.read_text().strip()))
            except ValueError:
                raise Unreadable(f"results/{shown} does not hold one number") from None
        raise Unreadable(f"results/{shown}: not a directory, .json, .csv or .txt file")

    def _requests(self, path: Path, shown: str, where: dict, key: str, stat: str) -> Reading:
        from harness.records.stats import measured, p50_with_interval
        from harness.report.load import load_requests

        df = _kept(self._get(path, load_requests), where, f"the requests under results/{shown}")
        if key not in df:
            raise Unreadable(f"the requests under results/{shown} have no field {key!r}")
        vals = measured(df[key])
        if not len(vals):
            raise Unreadable(f"no {key} measured in the requests under results/{shown} where {where}")
        if stat == "p50":
            r = p50_with_interval(vals, "v")
            return Reading(r["v"], r["v_lo"], r["v_hi"])
        return Reading(float({"mean": vals.mean, "min": vals.min, "max": vals.max}[stat]()))

    def _json(self, path: Path, shown: str, key: str) -> Reading:
        parent, node, last = None, self._get(path, lambda p: json.loads(p.read_text())), ""
        for part in str(key).split("."):
            parent, last = node, part
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise Unreadable(f"results/{shown} has no {key!r}") from None
        if not isinstance(node, (int, float)) or isinstance(node, bool):
            raise Unreadable(f"results/{shown}: {key!r} is not a number ({node!r})")
        lo, hi = (parent.get(f"{last}_{end}") if isinstance(parent, dict) else None for end in ("lo", "hi"))
        return Reading(float(node), lo, hi)

    def _csv(self, path: Path, shown: str, where: dict, key: str) -> Reading:
        import pandas as pd

        df = _kept(self._get(path, pd.read_csv), where, f"results/{shown}")
        if len(df) != 1:
            raise Unreadable(f"results/{shown}: {len(df)} rows where {where}, not one")
        if key not in df:
            raise Unreadable(f"results/{shown} has no column {key!r}")
        row = df.iloc[0]
        return Reading(float(row[key]), *(float(row[f"{key}_{e}"]) if f"{key}_{e}" in df else None
                                          for e in ("lo", "hi")))


def _kept(df, where: dict, what: str):
    for column, wanted in where.items():
        if column not in df:
            raise Unreadable(f"{what} have no {column!r} to select by")
        df = df[df[column].isin(wanted if isinstance(wanted, list) else [wanted])]
    return df


def reading(records: Records, run: str, v: dict) -> Reading:
    """The value its records give, a difference or ratio of two where it says so."""
    r = records.read(run, {k: v[k] for k in SOURCE_KEYS if k in v})
    for part in ("minus", "over"):
        if part in v:
            other = records.read(run, v[part])
            if part == "over" and not other.value:
                raise Unreadable("over: the value it is divided by is 0")
            value = r.value - other.value if part == "minus" else r.value / other.value
            r = Reading(value)  # no interval: the two spreads do not combine into one
    return r


# --- the figures ------------------------------------------------------------------------------

def _fmt(x: float, spec: str) -> str:
    return format(float(x), spec)


def _shown(x: float, lo: float | None, hi: float | None, v: dict) -> str:
    plain = v["format"].replace("+", "")
    text = _fmt(x, v["format"]) + (f" {v['unit']}" if v.get("unit") else "")
    if lo is not None:
        text += f" [{_fmt(lo, plain)}, {_fmt(hi, plain)}]"
    return text


def evaluate(headlines: list[dict], root: Path = PROJECT_ROOT) -> tuple[list[dict], list[str]]:
    """Each headline with its figure written from its records (key `text`), and what does not hold:
    a headline that cannot be read, a run directory that is gone, a value its records give
    otherwise than stated (at the stated precision)."""
    records = Records(Path(root) / "results")
    out, errors = [], []
    for i, h in enumerate(headlines, 1):
        name = f"headline {i} ({h.get('what', '?')!r})" if isinstance(h, dict) else f"headline {i}"
        problems = schema_errors(h)
        if problems:
            errors += [f"{HEADLINES}: {name}: {p}" for p in problems]
            continue
        if not (records.base / h["run"]).is_dir():
            errors.append(f"{name}: its run directory results/{h['run']} does not exist")
            continue
        shown, ok = {}, True
        for key, v in h["values"].items():
            try:
                r = reading(records, h["run"], v)
            except Unreadable as e:
                errors.append(f"{name}: {key}: {e}")
                ok = False
                continue
            stated = list(v.get("interval") or [])
            if stated and (r.lo is None or r.hi is None):
                errors.append(f"{name}: {key}: an interval is stated, but its records give none")
                ok = False
                continue
            lo, hi = (r.lo, r.hi) if stated else (None, None)
            got, want = _shown(r.value, lo, hi, v), _shown(v["value"], *(stated or [None, None]), v)
            if got != want:
                errors.append(f"{name}: {key}: its records give {got}, {HEADLINES} states {want}")
                ok = False
            shown[key] = got
        if ok:
            out.append({**h, "text": h["figure"].format(**shown)})
    return out, errors


def check(root: Path = PROJECT_ROOT, headlines: list[dict] | None = None) -> list[str]:
    """Every headline that does not hold, one line each (nothing: all hold)."""
    try:
        headlines = load(root) if headlines is None else headlines
    except ValueError as e:
        return [str(e)]
    return evaluate(headlines, root)[1]


# --- FINDINGS.md ------------------------------------------------------------------------------

def _cell(v) -> str:
    return " ".join(str(v).split()).replace("|", "\\|")


def _source(v: dict) -> str:
    """How a value is read, in a few words."""
    def one(s: dict) -> str:
        where = ", ".join(f"{k}={'/'.join(map(str, w)) if isinstance(w, list) else w}"
                          for k, w in (s.get("where") or {}).items())
        where = f" ({where})" if where else ""
        src = str(s.get("from", ".")).rstrip("/")
        if src.endswith(".txt"):
            return f"the number in `{src}`"
        if src.endswith((".json", ".csv")):
            return f"{s['key']} of `{src}`{where}"
        requests = "the requests" if src in (".", "") else f"the requests in `{src}/`"
        return f"{s.get('stat', 'p50')} of {s['key']} of {requests}{where}"

    text = one(v)
    if "minus" in v:
        text += ", minus " + one(v["minus"])
    if "over" in v:
        text += ", over " + one(v["over"])
    if v.get("interval") and str(v.get("from", "")).endswith((".json", ".csv")):
        text += f"; its interval {v['key']}_lo, {v['key']}_hi"
    return text


def render(root: Path = PROJECT_ROOT, headlines: list[dict] | None = None) -> str:
    """FINDINGS.md's text; raises ValueError (every line check gives) when a headline does not hold."""
    headlines = load(root) if headlines is None else headlines
    done, errors = evaluate(headlines, root)
    if errors:
        raise ValueError("\n".join(errors))
    out = [
        "# Headline figures",
        "",
        "Written by `python scripts/results_index.py` (tools/results_findings.py) from",
        "[headlines.yaml](headlines.yaml), each figure read again from the records of its run directory; do",
        "not edit it by hand. `python scripts/results_index.py --check` (and tests/test_results_index.py)",
        "fails when a run directory is gone, when its records give a figure other than headlines.yaml",
        "states (at the precision it states), or when this file is not what it writes. A new headline, or",
        "one measured again: edit headlines.yaml (its run directory, the command, where each value is read",
        "from and what it is), then run the script. Every committed run directory: [INDEX.md](INDEX.md).",
        "",
        "A median with `[lo, hi]` is the p50 of the requests with its 95% bootstrap interval (1000",
        "resamples, seed 0: harness/records/stats.py), as the benchmark tables and summaries give it.",
        "",
        "| | what | figure | run directory | measured by |",
        "| ---: | --- | --- | --- | --- |",
    ]
    out += [f"| {i} | {_cell(h['what'])} | {_cell(h['text'])} | [`{h['run']}/`]({h['run']}/) | "
            f"`{_cell(h['measured'])}` |" for i, h in enumerate(done, 1)]
    out += ["", "## Where each value is read", "",
            "Paths relative to the headline's run directory; a request field is a column of",
            "`harness.report.load.load_requests` (results/README.md lists them).", "",
            "| | value | read as |", "| ---: | --- | --- |"]
    for i, h in enumerate(done, 1):
        for name, v in h["values"].items():
            out.append(f"| {i} | {name} | {_cell(_source(v))} |")
    return "\n".join(out) + "\n"


def write(root: Path = PROJECT_ROOT) -> Path:
    path = Path(root) / FINDINGS
    path.write_text(render(root))
    return path


def is_current(root: Path = PROJECT_ROOT) -> bool:
    path = Path(root) / FINDINGS
    return path.exists() and path.read_text() == render(root)
