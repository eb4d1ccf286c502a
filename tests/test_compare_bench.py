"""scripts/compare_bench.py, the GPU TTFT benchmark's regression guard: its verdicts on synthetic
benchmark directories written with the real row schema, and a committed benchmark against itself.
No engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness.report.compare as guard
from harness.records.schema import SCHEMA_VERSION, RequestRow
from harness.records.stats import p50_with_interval
from harness.report.compare import REFERENCES

ROOT = Path(__file__).resolve().parent.parent

REFERENCE = ROOT / "results" / "gpu" / "2026-12-02-s14" / "ttft-early"  # the docs' reference (scripts/gpu_run.sh)


def write_bench(out: Path, shift_ms: float = 0.0, lengths=(2048, 8192), submit: str = "early",
                names: dict[str, str] | None = None, missing: tuple[str, ...] = (),
                starts: tuple[float, ...] | None = None) -> Path:
    """A benchmark directory as scripts/bench_strategies.py leaves it: one run directory per
    strategy (named as given in names), its requests.jsonl of RequestRow rows and its summary.json
    (the decode_submit that applied). Every metric is 10 ms with the same seeded noise in every
    call, plus shift_ms: two calls differ by exactly the shift; metrics in missing have no value.
    starts: one engine start per entry (<label>/start<k>/), each shifted by its entry again."""
    names = names or {"fused": "fused", "layerwise": "layerwise"}
    unset = dict.fromkeys(RequestRow.names())
    for strategy, label in names.items():
        for k, start_ms in enumerate(starts or (0.0,), 1):
            run = out / label / f"start{k}" if starts else out / label
            run.mkdir(parents=True)
            rng = np.random.default_rng(0)
            rows = []
            for n in lengths:
                for i in range(12):
                    row = RequestRow(**{**unset, "run_id": label, "strategy": strategy, "prompt_idx": i,
                                        "prompt_len": n, "output_len": 4, "match": True})
                    for m in guard.metrics():
                        row[m] = None if m in missing else 10.0 + float(rng.normal(0, 0.3)) + shift_ms + start_ms
                    rows.append(row)
            (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            summary = {"schema_version": SCHEMA_VERSION, "status": "ok", "decode_submit": submit}
            (run / "summary.json").write_text(json.dumps(summary))
    return out


def run_guard(capsys, new: Path, ref: Path, *args: str) -> tuple[int, str, str]:
    code = guard.main([str(new), str(ref), *args])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(out: str) -> set[str]:
    """The verdict column of the table's rows (a row: strategy, decode_submit, length, metric, ...)."""
    rows = [line.split() for line in out.splitlines()]
    return {r[-1] for r in rows if len(r) > 4 and r[3] in guard.metrics()}


def interval_widths(bench: Path) -> list[float]:
    """Each cell and metric's 95% interval width in a benchmark."""
    widths = []
    for g in guard.load_cells(bench).values():
        for m in guard.metrics():
            p = p50_with_interval(g[m], "p50")
            widths.append(p["p50_hi"] - p["p50_lo"])
    return widths


def test_the_same_data_passes(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    new = write_bench(tmp_path / "new")
    code, out, _ = run_guard(capsys, new, ref, "--slack-ms", "0")
    assert code == 0
    assert verdicts(out) == {"same"}
    assert "no cell slower" in out


def test_a_clearly_slower_run_fails_and_names_the_cells(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    new = write_bench(tmp_path / "new", shift_ms=5.0)
    code, out, _ = run_guard(capsys, new, ref)
    assert code == 1
    assert verdicts(out) == {"slower"}
    slower = next(line for line in out.splitlines() if line.startswith("SLOWER:"))
    assert "fused early 2048 ttft_overhead_ms" in slower
    assert "layerwise early 8192 overhead_decode_ms" in slower


def test_only_the_slower_cell_is_named(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    new = write_bench(tmp_path / "new", names={"fused": "fused"})
    write_bench(new, shift_ms=5.0, names={"layerwise": "layerwise"})
    code, out, _ = run_guard(capsys, new, ref)
    assert code == 1
    slower = next(line for line in out.splitlines() if line.startswith("SLOWER:"))
    assert "layerwise early 2048" in slower and "fused" not in slower


def test_a_faster_run_passes_and_says_faster(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    new = write_bench(tmp_path / "new", shift_ms=-5.0)
    code, out, _ = run_guard(capsys, new, ref)
    assert code == 0
    assert verdicts(out) == {"faster"}


def test_overlapping_intervals_pass(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    # the same noise, so each new interval is the reference's moved by the shift: less than its width
    shift = min(interval_widths(ref)) / 2
    new = write_bench(tmp_path / "new", shift_ms=shift)
    code, out, _ = run_guard(capsys, new, ref, "--slack-ms", "0")
    assert code == 0
    assert verdicts(out) == {"same"}


def test_intervals_apart_by_less_than_the_slack_pass(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    # the same noise, so each new interval is its reference moved: the narrowest misses it by 0.4 ms, the rest by less
    new = write_bench(tmp_path / "new", shift_ms=min(interval_widths(ref)) + 0.4)
    assert run_guard(capsys, new, ref, "--slack-ms", "0")[0] == 1
    code, out, _ = run_guard(capsys, new, ref, "--slack-ms", "0.5")
    assert code == 0
    assert verdicts(out) == {"same"}


def test_a_metric_without_values_is_na_not_failed(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref")
    new = write_bench(tmp_path / "new", missing=("transfer_ms",))
    code, out, _ = run_guard(capsys, new, ref)
    assert code == 0
    assert all(line.split()[-1] == "n/a" for line in out.splitlines() if " transfer_ms " in line)
    assert "n/a 4" in out


def test_cells_on_one_side_are_listed_not_failed(tmp_path, capsys):
    ref = write_bench(tmp_path / "ref", lengths=(2048, 8192, 16384))
    new = write_bench(tmp_path / "new", lengths=(2048, 8192))
    code, out, _ = run_guard(capsys, new, ref)
    assert code == 0
    assert "only in ref (not compared): fused early 16384, layerwise early 16384" in out


def test_runs_meet_by_strategy_and_decode_submit_not_by_directory_name(tmp_path, capsys):
    # bench.decode_submit=[early] names the run fused; [early,after_prefill] names it fused-early
    ref = write_bench(tmp_path / "ref")
    new = write_bench(tmp_path / "new", names={"fused": "fused-early", "layerwise": "layerwise-early"})
    code, out, _ = run_guard(capsys, new, ref)
    assert code == 0
    assert "only in" not in out
    assert len(verdicts(out)) == 1 and "fused early 8192" in out


@pytest.mark.parametrize("case", ["missing", "empty", "run_dir", "session_dir", "no_common_cell", "not_a_time",
                                  "two_runs_of_one_strategy"])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, case):
    ref = write_bench(tmp_path / "ref")
    new, args = tmp_path / "new", []
    if case == "missing":
        pass
    elif case == "empty":
        new.mkdir()
    elif case == "run_dir":
        new = ref / "fused"
    elif case == "session_dir":
        new = tmp_path  # holds benchmarks, not runs
    elif case == "no_common_cell":
        write_bench(new, submit="after_prefill")
    elif case == "not_a_time":
        new, args = write_bench(new), ["--metrics", "ttft_overhead_ms,gbps"]
    elif case == "two_runs_of_one_strategy":
        write_bench(new, names={"fused": "fused-a"})
        write_bench(new, names={"fused": "fused-b"})
    code, out, err = run_guard(capsys, new, ref, *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_each_committed_reference_against_itself_passes():
    assert REFERENCES["NVIDIA H200"] == str(REFERENCE.relative_to(ROOT))  # the docs' and gpu_run.sh's
    for reference, cells in ((REFERENCE, 42), (ROOT / REFERENCES["NVIDIA H100 80GB HBM3"], 70)):
        # without REF_DIR: the reference of the GPU the benchmark ran on, here itself
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_bench.py"), str(reference)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert f"ref: {reference}" in p.stdout
        assert f"slower 0, faster 0, same {cells}, n/a 0" in p.stdout  # strategies x 2 lengths x 7 metrics
        assert "no cell slower" in p.stdout


def test_benchmarks_of_two_gpus_are_not_compared(capsys):
    h100 = ROOT / REFERENCES["NVIDIA H100 80GB HBM3"]
    code, out, err = run_guard(capsys, h100, REFERENCE)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "ran on NVIDIA H100 80GB HBM3" in err and "--any-gpu" in err
    code, out, _ = run_guard(capsys, h100, REFERENCE, "--any-gpu")
    assert code in (0, 1) and "slower" in out


def test_with_several_engine_starts_a_change_is_judged_by_the_interval_over_the_starts(tmp_path, capsys):
    """Starts 2 ms apart: a new benchmark 1 ms slower lies within them (the request-level intervals of
    one start would have called it slower: each is under a millisecond wide); one 20 ms slower does not."""
    ref = write_bench(tmp_path / "ref", starts=(0.0, 2.0, 4.0))
    new = write_bench(tmp_path / "new", shift_ms=1.0, starts=(0.0, 2.0, 4.0))
    code, out, _ = run_guard(capsys, new, ref, "--slack-ms", "0")
    assert code == 0 and verdicts(out) == {"same"} and "starts" in out and "requests" not in out.split("SLOWER")[0]
    cells = guard.load_cells(ref)
    assert {int(g["start"].nunique()) for g in cells.values()} == {3}
    row = guard.compare_cell(guard.load_cells(new)[("fused", "early", 2048)], cells[("fused", "early", 2048)],
                             ("fused", "early", 2048), "transfer_ms", 0.0)
    assert row["interval"] == "starts" and row["new"] - row["ref"] == pytest.approx(1.0)
    assert row["ref_lo"] < row["ref"] - 2 and row["ref_hi"] > row["ref"] + 2  # the t-interval of 3 start medians
    much = write_bench(tmp_path / "much", shift_ms=20.0, starts=(0.0, 2.0, 4.0))
    assert run_guard(capsys, much, ref)[0] == 1


def test_the_table_of_several_starts_gives_each_starts_median_and_their_interval(tmp_path):
    from harness.report.benchmark import strategy_rows, strategy_table
    from harness.report.load import load_requests

    bench = write_bench(tmp_path / "b", starts=(0.0, 2.0, 4.0), names={"fused": "fused"})
    rows = strategy_rows(load_requests(bench), ["fused"], ceiling=1.0)
    assert [r["starts"] for r in rows] == [3, 3]
    medians = [float(v) for v in rows[0]["transfer_ms_starts"].split(";")]
    assert len(medians) == 3 and rows[0]["transfer_ms_across"] == pytest.approx(sum(medians) / 3, rel=1e-6)
    assert medians[1] - medians[0] == pytest.approx(2.0, abs=1e-6)
    table = strategy_table(rows)
    assert table.splitlines()[0].startswith("| strategy | prompt | starts |") and "| 3 |" in table
