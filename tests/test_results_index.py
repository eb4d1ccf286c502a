"""The committed results stay navigable and lean: results/INDEX.md and results/FINDINGS.md are what
scripts/results_index.py writes, every headline figure of results/headlines.yaml is what its run
directory's records give (and the check says so when one is not), no run directory passes its
size budget nor results/ its total, and nothing the slimming rules make again or leave out
(tools/results_slim.py) is committed. Fast: no engines."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.records.files import read_jsonl
from harness.report.load import load_requests, run_config
from tools import results_findings, results_index
from tools.results_slim import RULES, digests_fingerprint, leftovers, regenerated_prompts, slim

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = [ROOT / "results" / "cpu", ROOT / "results" / "gpu"]

# the prompts.jsonl files removed from the benchmarks (git show 18f0b0e:results/<old path>): made
# again, each is the same byte for byte
REMOVED_PROMPTS = {
    "cpu/2026-11-30-s4-before": "f9f22da6485507d1d1ce12d56f0613639813c1c2b724ad0351b65e616ea359ef",
    "cpu/2026-11-30-s4": "f9f22da6485507d1d1ce12d56f0613639813c1c2b724ad0351b65e616ea359ef",
    "cpu/2026-11-30-s5": "427f66e39c4c533d0d1df0ebf3c7b3a3ba5174129f0e8c1ed6e9b72ec0a45658",
    **{f"cpu/2026-12-01-s11-tp/{d}": "c3259f02654e2d00e28ece901f9d5dad1ddda2287847b1bc2cb45a510f213ae4"
       for d in ("gloo-local", "gloo-netns", "p1d1", "p1d2", "p2d1", "p2d2")},
    "gpu/2026-11-30-s4/h200-1gpu": "4372fd51f9f0f69d86b860b7b0e8b8857f3072564942e771c8b392bbfa2a3a32",
    "gpu/2026-11-30-s4/h200-2gpu": "23460a41d07806ae667f084a2310fec378d89380366cfa62dea5cc9f846d710a",
    "gpu/2026-11-30-s5/ttft-early": "3c20a03423f80524151f7e1e88273189c822e7d8080c22babd0da1b1f0aed371",
    "gpu/2026-11-30-s5/ttft-handoff": "3c20a03423f80524151f7e1e88273189c822e7d8080c22babd0da1b1f0aed371",
    "gpu/2026-11-30-s6/ttft-early": "79f4ce8c97fa33fd6c07589b5cbdcbfb6601ed74529d8c9f2ff3f247a09aace4",
    "gpu/2026-11-30-s6/ttft-nodigests": "6eff7b78fa9b8c54dbb0c0de7a3e4876c059108f613c4ba4968ae515cf36991a",
    "gpu/2026-11-30-s6/ttft2-early": "ba0a4b4ac59f112602d647d7109ad6a751ae8a2ff66c76a8787d4a5d0d267a07",
}


def tracked() -> set[str] | None:
    """The files git holds or would take under results/ (tracked, or new and not ignored; relative to
    the project root), or None outside a checkout: what is committed, not what a run or --replot
    left beside it (git-ignored)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "results"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {p for p in out.decode().split("\0") if p}


def test_index_and_findings_are_what_the_script_writes():
    assert results_index.problems() == [], "python scripts/results_index.py"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_index.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_every_headline_is_what_its_records_give():
    headlines = results_findings.load()
    assert len(headlines) >= 20
    assert results_findings.check(headlines=headlines) == []
    done, _ = results_findings.evaluate(headlines)
    # FINDINGS.md shows each figure as its records give it, in its run directory's row
    findings = (ROOT / results_findings.FINDINGS).read_text()
    assert all(f"| {h['text']} | [`{h['run']}/`]({h['run']}/) |" in findings for h in done)


def _changed(index: int, **changes) -> list[dict]:
    headlines = copy.deepcopy(results_findings.load())
    headlines[index].update(changes)
    return headlines


def test_a_headline_whose_figure_disagrees_with_its_records_fails():
    headlines = copy.deepcopy(results_findings.load())
    h = next(h for h in headlines if h["run"] == "gpu/2026-12-04-s23/ttft")
    h["values"]["overhead"]["value"] = 13.7  # the records give 13.6 at .1f
    h["values"]["transfer"]["value"] = 0.5111  # the same as the records at the stated .3f: holds
    errors = results_findings.check(headlines=headlines)
    number = headlines.index(h) + 1
    assert errors == [f"headline {number} ('GPU, fused: TTFT overhead at 8k tokens, one H200 (code ba72303)'): "
                      "overhead: its records give +13.6 ms [9.0, 17.6], results/headlines.yaml states +13.7 ms "
                      "[9.0, 17.6]"]
    h["values"]["overhead"].update(value=13.6, interval=[9.0, 17.5])  # an interval's end counts too
    assert "states +13.6 ms [9.0, 17.5]" in results_findings.check(headlines=headlines)[0]
    with pytest.raises(ValueError, match="its records give"):
        results_findings.render(headlines=headlines)


def test_a_headline_whose_run_directory_is_gone_fails():
    errors = results_findings.check(headlines=_changed(0, run="gpu/no-such-session/ttft"))
    assert len(errors) == 1 and errors[0].endswith("its run directory results/gpu/no-such-session/ttft does not exist")
    headlines = copy.deepcopy(results_findings.load())
    headlines[0]["values"]["overhead"]["from"] = "no-such-run"
    assert f"overhead: results/{headlines[0]['run']}/no-such-run does not exist" in \
        results_findings.check(headlines=headlines)[0]


def test_a_headline_that_cannot_be_read_says_why():
    bad = _changed(0, figure="{overhead} and {missing}", note="x")
    bad[0]["values"]["overhead"]["stat"] = "p99"
    errors = results_findings.check(headlines=bad)
    assert "unknown key 'note'" in errors[0] and "figure names 'missing', which values lacks" in errors[1]
    assert any("stat 'p99' is not one of" in e for e in errors)
    json_where = copy.deepcopy(results_findings.load())
    h = next(h for h in json_where if h["run"] == "cpu/2026-12-01-s8-router")
    h["values"]["added"]["where"] = {"prompt_len": 128}  # a JSON file has no rows to pick
    assert any("added: results/cpu/2026-12-01-s8-router/router.json: stat is for requests, where for requests and "
               "CSV rows" in e for e in results_findings.check(headlines=json_where))


def test_the_check_reads_each_kind_of_record_and_finds_a_stale_findings_file(tmp_path, monkeypatch):
    monkeypatch.setattr(results_index, "RENAMED", {})  # the committed tree's, not this one's
    bench = tmp_path / "results" / "cpu" / "2026-01-02-s3-bench"
    (tmp_path / "results" / "gpu").mkdir(parents=True)
    for name, ms in (("fused", [1.0, 2.0, 3.0, 4.0, 9.0]), ("layerwise", [5.0, 6.0, 7.0, 8.0, 9.0])):
        (bench / name).mkdir(parents=True)
        rows = [{"run_id": name, "strategy": name, "prompt_idx": i, "prompt_len": 64 * (1 + i % 2),
                 "transfer_ms": v, "schema_version": 10} for i, v in enumerate(ms)]
        (bench / name / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (bench / name / "summary.json").write_text(json.dumps({"status": "ok", "p": {"x": 2.5, "x_lo": 1, "x_hi": 4}}))
    (bench / "rows.csv").write_text("strategy,prompt_len,share\nfused,64,0.91\nfused,128,0.42\n")
    (bench / "wall_s.txt").write_text("54.1\n")
    headlines = [{"what": "every kind", "run": "cpu/2026-01-02-s3-bench", "measured": "python x.py",
                  "figure": "{p50}; {mean}; {json}; {csv}; {txt}; {minus}; {over}",
                  "values": {
                      "p50": {"from": "fused", "where": {"prompt_len": 64}, "key": "transfer_ms", "stat": "p50",
                              "format": ".1f", "unit": "ms", "value": 3.0, "interval": [1.0, 9.0]},
                      "mean": {"from": "layerwise", "key": "transfer_ms", "stat": "mean", "format": ".1f",
                               "value": 7.0},
                      "json": {"from": "fused/summary.json", "key": "p.x", "format": ".1f", "value": 2.5,
                               "interval": [1, 4]},
                      "csv": {"from": "rows.csv", "where": {"strategy": "fused", "prompt_len": 128}, "key": "share",
                              "format": ".2f", "value": 0.42},
                      "txt": {"from": "wall_s.txt", "format": ".0f", "unit": "s", "value": 54},
                      "minus": {"from": "layerwise", "key": "transfer_ms", "stat": "max",
                                "minus": {"from": "fused", "key": "transfer_ms", "stat": "min"},
                                "format": "+.0f", "value": 8},
                      "over": {"from": "layerwise", "key": "transfer_ms", "stat": "p50",
                               "over": {"from": ".", "key": "transfer_ms", "stat": "p50"}, "format": ".3g",
                               "value": 1.27}}}]
    (tmp_path / results_findings.HEADLINES).write_text(yaml.safe_dump(headlines))
    assert results_findings.check(tmp_path) == []
    results_index.write(tmp_path)
    assert results_index.problems(tmp_path) == []
    findings = (tmp_path / results_findings.FINDINGS).read_text()
    assert "| 3.0 ms [1.0, 9.0]; 7.0; 2.5 [1.0, 4.0]; 0.42; 54 s; +8; 1.27 |" in findings
    assert "cpu/2026-01-02-s3-bench" in (tmp_path / results_index.INDEX).read_text()  # cited by FINDINGS.md

    (tmp_path / results_findings.FINDINGS).write_text(findings.replace("54 s", "55 s"))  # edited by hand
    assert results_index.problems(tmp_path) == [
        "results/FINDINGS.md is not what results/headlines.yaml and the records write: python scripts/results_index.py"]
    (bench / "wall_s.txt").write_text("56.0\n")  # measured again, the YAML not updated
    assert results_index.problems(tmp_path) == [
        "headline 1 ('every kind'): txt: its records give 56 s, results/headlines.yaml states 54 s"]
    (bench / "rows.csv").unlink()
    assert "csv: results/cpu/2026-01-02-s3-bench/rows.csv does not exist" in results_index.problems(tmp_path)[0]


def test_every_run_directory_is_within_its_size_budget():
    assert results_index.over_budget() == {}, f"over {results_index.RUN_BUDGET_BYTES} bytes: slim or archive"


def test_results_are_within_the_total_budget():
    files = tracked()
    if files is None:
        total = results_index.results_bytes()
    else:
        total = sum((ROOT / p).stat().st_size for p in files if (ROOT / p).exists())
    assert total < results_index.TOTAL_BUDGET_BYTES, total


def test_nothing_made_again_or_left_out_is_committed():
    files = tracked()
    for rule, paths in {r: [p for d in COMMITTED for p in leftovers(d, (r,))[r]] for r in RULES}.items():
        rel = [p.relative_to(ROOT).as_posix() for p in paths]
        if files is not None:  # a .hydra/ directory counts when git holds a file in it
            rel = [p for p in rel if p in files or any(f.startswith(p + "/") for f in files)]
        assert rel == [], f"{rule}: python scripts/slim_results.py --rule {rule} DIR ({rel[:5]})"


@pytest.mark.parametrize("bench", sorted(REMOVED_PROMPTS))
def test_a_removed_prompts_file_is_made_again_byte_for_byte(bench):
    text = regenerated_prompts(ROOT / "results" / bench)
    assert text is not None and hashlib.sha256(text.encode()).hexdigest() == REMOVED_PROMPTS[bench]
    lengths = {r["prompt_idx"]: r["prompt_len"] for r in load_requests(ROOT / "results" / bench).to_dict("records")}
    made = [len(json.loads(line)["prompt"]) for line in text.splitlines()]
    assert all(made[i] == n for i, n in lengths.items())  # every run's prompts, as long as its requests say


def test_citations_read_paths_from_a_document_and_the_directories_above(tmp_path):
    for d in ("results/gpu/2026-01-02-s3/ttft/fused", "results/gpu/2026-01-02-s3/check-1gpu-fused",
              "results/cpu/2026-01-02-s3/fused", "results/cpu/2026-01-05-s4-soak/fused"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "README.md").write_text("see `results/gpu/2026-01-02-s3/ttft/table.md` and **bold**\n")
    (tmp_path / "results" / "gpu" / "README.md").write_text("`2026-01-02-s3/check-1gpu-*/summary.json`.\n")
    (tmp_path / "results" / "cpu" / "2026-01-05-s4-soak" / "README.md").write_text("fused ran first\n")
    runs = ["results/gpu/2026-01-02-s3/ttft/fused", "results/gpu/2026-01-02-s3/check-1gpu-fused",
            "results/cpu/2026-01-02-s3/fused", "results/cpu/2026-01-05-s4-soak/fused"]
    assert results_index.citations(runs, tmp_path) == {
        runs[0]: ["README.md"],  # a file in the run's benchmark directory names the directory
        runs[1]: ["results/gpu/README.md"],  # relative to the document, a glob within a component
        runs[2]: [],  # the GPU README's 2026-01-02-s3 is its own device's, not the CPU's of the same name
        runs[3]: ["results/cpu/2026-01-05-s4-soak/README.md"],  # a bare name beside the document
    }


def test_slimming_a_run_directory_keeps_what_the_loader_reads(tmp_path):
    run = tmp_path / "results" / "gpu" / "2026-01-02-s3" / "bench" / "fused"
    (run / ".hydra").mkdir(parents=True)
    rows = [{"run_id": "fused", "strategy": "fused", "prompt_idx": i, "prompt_len": n, "schema_version": 10}
            for i, n in enumerate([4, 4, 8, 8])]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"strategy": {"name": "fused"}, "bench": {"lengths": [4, 8], "per_length": 2}}
    (run / "meta.json").write_text(json.dumps({"run_id": "fused", "config": config}, indent=2) + "\n")
    (run / ".hydra" / "config.yaml").write_text("strategy:\n  name: fused\n")
    (run / ".hydra" / "overrides.yaml").write_text("- strategy=fused\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  runtime:\n    cwd: /work/main\n    choices:\n"
                                               "      strategy: fused\n      hydra/launcher: basic\n")
    (run / "kv-channel.port").write_text("41234")
    (run / "example-connector-kv" / "0c85").mkdir(parents=True)  # vllm_example's KV on disk
    (run / "example-connector-kv" / "0c85" / "model.layers.0.self_attn.attn.safetensors").write_bytes(b"kv")
    (run / "kv-channel.port.p0d1").write_text("41235")
    (run / "__main__.log").write_text("")
    (run / "prefill.log").write_text("/work/main/.venv/lib/python3.12/x.py:1: warning; logs in /tmp/runs/a\n")
    sent = [{"transfer_id": "t0", "side": "send", "digests": {"0": ["00ab", "ff01"]}},
            {"transfer_id": "t1", "side": "send", "digests": None, "error": "dropped"}]
    (run / "prefill-transfers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sent))
    bench = run.parent
    from harness.workload import bench_prompts
    (bench / "prompts.jsonl").write_text(bench_prompts([4, 8], 2))
    (bench / "rows.csv").write_text("strategy\nfused\n")
    (bench / "figure.png").write_bytes(b"png")
    before = run_config(run)

    done = slim(tmp_path / "results" / "gpu")
    assert {rule: len(paths) for rule, paths in done.items()} == {
        "scratch": 1, "rendezvous": 2, "prompts": 1, "figures": 1, "hydra": 1, "empty_logs": 1, "digests": 1, "gzip": 2,
        "log_paths": 1}
    assert leftovers(tmp_path / "results" / "gpu") == {rule: [] for rule in RULES}
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "prefill-transfers.jsonl.gz", "prefill.log",
                                                     "requests.jsonl.gz"]
    # the digests' verdict is in the requests; a fingerprint of them stays, nothing else changes
    assert read_jsonl(run / "prefill-transfers.jsonl") == [
        {**sent[0], "digests": None, "digests_sha256": digests_fingerprint({"0": ["00ab", "ff01"]})}, sent[1]]
    assert run_config(run) == before and read_jsonl(run / "requests.jsonl") == rows
    meta = json.loads((run / "meta.json").read_text())
    assert meta["overrides"] == ["strategy=fused"] and meta["choices"] == {"strategy": "fused"}
    assert (run / "prefill.log").read_text() == "<venv>/lib/python3.12/x.py:1: warning; logs in <tmp>/runs/a\n"
    assert gzip.decompress((run / "requests.jsonl.gz").read_bytes()).decode().count("\n") == 4
    assert regenerated_prompts(bench) == bench_prompts([4, 8], 2)  # the prompts come back from the runs
