"""Which strategy wins on which link: from run directories of strategies on the same machine and
across shaped links (link=veth sweeps), one row per model, device, prompt length, link and
strategy with the TTFT overhead a user feels [95% interval], the prefill's own token, the
transfer, and the KV's arrival in the decode engine's blocks from the end of the prefill's
forward pass (kv_ms: negative where it came before the pass ended), against the link's ceiling;
the winner of each prompt length and link by the time after the forward pass (RANK: the lowest
median, and whether its interval clears the next one's); the crossovers, where two strategies
change order between adjacent link speeds; and the figure of both against link speed.
scripts/link_report.py draws them.

A link's label is its set rate ("1 Gbit/s"), "veth, unshaped" for an unshaped one and "same machine" for
a run without a link; rows are ordered fastest link first. Each row names its transport (staged,
gloo, nixl): a strategy over two transports is two rows, and two lines in the figure.
Only runs beside a link run are read: under the same directory two levels up as one (a sweep
across links and a sweep on the same machine side by side, as scripts/link_report.py shows), so
that unrelated runs of the same prompt length do not join a cell.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from harness.records.fields import Field
from harness.records.schema import shown_in
from harness.records.stats import Column, format_table, p50_with_interval

KEYS = ["model", "device", "prompt_len", "link"]


def metrics() -> list[Field]:
    """The medians a row shows (fields.py's "link" view), each with its interval: from a run's
    summary, or per prompt length from its requests where it has several (by_prompt_length)."""
    return shown_in("link")


def columns() -> list[str]:
    return ["model", "device", "prompt_len", "link", "link_ceiling_gbit", "strategy", "transport", "requests",
            *(f"{f.name}_p50{end}" for f in metrics() for end in ("", "_lo", "_hi")), "match_rate", "status"]

# what ranks strategies: the TTFT overhead less its prefill part (the prefill's forward pass done ->
# the decode engine's first token), free of the forward pass's own run-to-run spread, which on a
# 2-core machine running three engines moves the baseline's TTFT 2x between runs; it leaves out what
# a strategy costs the forward pass itself (layerwise's sends: the prefill's token column)
RANK = "after_forward_ms"


def _link(row) -> tuple[str, float]:
    """(label, Gbit/s: inf on the same machine) of a run's link, from its config."""
    kind = row.get("link.kind")
    if not isinstance(kind, str) or kind == "none":
        return "same machine", math.inf
    rate = row.get("link.rate_gbit")
    if rate is None or rate != rate:
        return f"{kind}, unshaped", 1e6  # slower than shared memory, faster than any shaped link
    return f"{rate:g} Gbit/s", float(rate)


def by_prompt_length(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """runs (load_runs) with one row per prompt length for a run whose requests have several (a
    benchmark's run, scripts/bench_strategies.py, covers every length in one run): that length's
    medians with their intervals from its requests (load_requests); a run of one length keeps its
    summary's figures."""
    if requests.empty or "prompt_len" not in requests:
        return runs
    out = []
    for r in runs.to_dict("records"):
        mine = requests[requests["run_dir"] == r["run_dir"]]
        lengths = sorted(mine["prompt_len"].dropna().unique())
        if len(lengths) < 2:
            out.append(r)
            continue
        for n in lengths:
            g = mine[mine["prompt_len"] == n]
            row = {**r, "workload.prompt_len": int(n), "requests": len(g),
                   "match_rate": float(g["match"].map(lambda v: v is True or v == 1).mean())}
            for f in metrics():
                row.update(p50_with_interval(pd.to_numeric(g[f.name], errors="coerce"), f"{f.name}_p50"))
            out.append(row)
    return pd.DataFrame(out)


def link_table(runs: pd.DataFrame) -> pd.DataFrame:
    """runs: load_runs' frame (by_prompt_length's where a run has several lengths). Runs of one
    cell (model, device, prompt length, link, strategy) are pooled by their medians' mean (the
    interval of the first: a cell is one run here)."""
    df = runs.copy()
    if "run_dir" in df:
        linked = df.get("link.kind", pd.Series(None, index=df.index)).fillna("none") != "none"
        roots = {Path(d).parent.parent for d in df.loc[linked, "run_dir"]}
        df = df[df["run_dir"].map(lambda d: Path(d).parent.parent in roots)]
    df["prompt_len"] = df.get("workload.prompt_len")
    df["transport"] = df.get("transport.kind", pd.Series(None, index=df.index)).fillna("staged")
    links = [_link(r) for r in df.to_dict("records")]
    df["link"], df["link_rate"] = [lbl for lbl, _ in links], [g for _, g in links]
    ceiling = df.get("link_ceiling_gbps", pd.Series(None, index=df.index))
    df["link_ceiling_gbit"] = pd.to_numeric(ceiling, errors="coerce") * 8
    for col in columns():
        if col not in df:
            df[col] = None
    numeric = [c for c in columns() if c not in (*KEYS, "strategy", "transport", "status", "requests")]
    for c in numeric:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    agg = dict.fromkeys(numeric, "mean")
    agg.update(requests="sum", link_rate="first",
               status=lambda s: "ok" if (s == "ok").all() else ",".join(sorted(set(map(str, s)) - {"ok"})))
    out = df.groupby([*KEYS, "strategy", "transport"], dropna=False).agg(agg).reset_index()
    out = out.sort_values(["model", "device", "prompt_len", "link_rate", f"{RANK}_p50"],
                          ascending=[True, True, True, False, True], ignore_index=True)
    return out[[*columns(), "link_rate"]]


def _name(row) -> str:
    return f"{row['strategy']} over {row['transport']}"


def winners(table: pd.DataFrame, metric: str = RANK) -> list[str]:
    """One line per model, device, prompt length and link: the strategy with the lowest median of
    `metric`, and whether its interval lies below the runner-up's (else: within the noise)."""
    lines = []
    for (model, device, n, link), g in table.groupby(KEYS, sort=False):
        g = g.dropna(subset=[f"{metric}_p50"]).sort_values(f"{metric}_p50")
        if g.empty:
            continue
        best = g.iloc[0]
        line = f"{model} {device} {int(n)} tokens, {link}: {_name(best)} {best[f'{metric}_p50']:.1f} ms"
        if len(g) > 1:
            second = g.iloc[1]
            clear = best[f"{metric}_p50_hi"] < second[f"{metric}_p50_lo"]
            line += (f", {'ahead of' if clear else 'within the noise of'} {_name(second)} "
                     f"{second[f'{metric}_p50']:.1f} ms")
        lines.append(line)
    return lines


def crossovers(table: pd.DataFrame, metric: str = RANK) -> list[str]:
    """Where the order of two strategies flips as the link slows: one line per model, device,
    prompt length and pair whose medians of `metric` change order between two adjacent links
    (fastest first), naming both links, both medians on the slower one and whether their intervals
    part there (else: within the noise). A pair measured on only one of the two links is not
    compared across them."""
    lines = []
    for (model, device, n), g in table.groupby(KEYS[:3], sort=False):
        g = g.dropna(subset=[f"{metric}_p50"])
        links = g.drop_duplicates("link").sort_values("link_rate", ascending=False)["link"].tolist()
        # a strategy is one contender across links whose transports differ (staged on the same machine,
        # gloo on a link), unless some link has it over two transports (then each pair is one)
        name = _name if g.groupby(["link", "strategy"]).size().max() > 1 else (lambda r: r["strategy"])
        cells = {(r["link"], name(r)): r for r in g.to_dict("records")}
        names = list(dict.fromkeys(name(r) for r in g.to_dict("records")))
        for fast, slow in zip(links, links[1:], strict=False):
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    if not all((link, x) in cells for link in (fast, slow) for x in (a, b)):
                        continue
                    before = cells[fast, a][f"{metric}_p50"] - cells[fast, b][f"{metric}_p50"]
                    after = cells[slow, a][f"{metric}_p50"] - cells[slow, b][f"{metric}_p50"]
                    if before * after >= 0:
                        continue
                    win, lose = (cells[slow, b], cells[slow, a]) if after > 0 else (cells[slow, a], cells[slow, b])
                    clear = win[f"{metric}_p50_hi"] < lose[f"{metric}_p50_lo"]
                    lines.append(f"{model} {device} {int(n)} tokens: {name(win)} overtakes {name(lose)} between "
                                 f"{fast} and {slow} ({win[f'{metric}_p50']:.1f} against "
                                 f"{lose[f'{metric}_p50']:.1f} ms at {slow}{'' if clear else ', within the noise'})")
    return lines


def to_markdown(table: pd.DataFrame) -> str:
    """The table in Markdown: the cell, then each declared metric's median [95% interval]."""
    rows = table.assign(prompt=table["prompt_len"].map(lambda n: "-" if n != n else str(int(n))))
    columns = [Column("prompt"), Column("link"), Column("link ceiling Gbit/s", "link_ceiling_gbit"),
               Column("strategy"), Column("transport"),
               *(Column(f"{f.header} [95%]", f"{f.name}_p50", f.spec, interval=True) for f in metrics()),
               Column("match", "match_rate"), Column("status")]
    return format_table(rows.to_dict("records"), columns, markdown=True)


def plot_ttft_against_link(table: pd.DataFrame, axes=None):
    """The TTFT overhead and the time after the forward pass (medians with their intervals)
    against the link's set rate, one line per strategy and prompt length; the same machine drawn
    at the right edge. Returns the axes."""
    import matplotlib.pyplot as plt

    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(12, 4))[1]
    finite = table["link_rate"][table["link_rate"] < 1e5]
    right = (finite.max() if len(finite) else 1.0) * 4
    for ax, metric, label in ((axes[0], "ttft_overhead_ms", "TTFT overhead"),
                              (axes[1], RANK, "after the forward pass")):
        for (strategy, transport, n), g in table.groupby(["strategy", "transport", "prompt_len"]):
            g = g.sort_values("link_rate")
            x = g["link_rate"].where(g["link_rate"] < 1e5, right)
            y = g[f"{metric}_p50"]
            err = [y - g[f"{metric}_p50_lo"], g[f"{metric}_p50_hi"] - y]
            ax.errorbar(x, y, yerr=err, fmt="o-", capsize=2, label=f"{strategy} over {transport} ({int(n)} tokens)")
        ax.set_xscale("log")
        ax.set_xlabel(f"link rate, Gbit/s (same machine drawn at {right:g})")
        ax.set_ylabel(f"{label}, ms (median, 95% interval)")
    axes[0].set_title("TTFT overhead against the link")
    axes[1].set_title("prefill's forward pass done -> first token (ranks them)")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    return axes
