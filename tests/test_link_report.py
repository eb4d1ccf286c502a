"""The link report (harness/report/link.py) on a frame as load_runs gives it."""

import math

import pandas as pd

from harness.report.link import by_prompt_length, crossovers, link_table, to_markdown, winners


def run(strategy, rate, ttft, lo, hi, kind="veth", n=1024, transport=None):
    """A run whose TTFT overhead and time after the forward pass are the same figures."""
    transport = transport or ("gloo" if rate else "staged")
    return {"run_dir": f"out/{'links' if rate else 'same_machine'}/{strategy}-{rate}-{transport}", "strategy": strategy,
            "transport.kind": transport,
            "workload.prompt_len": n, "model": "tiny-llama", "device": "cpu",
            "link.kind": kind, "link.rate_gbit": rate, "link_ceiling_gbps": None if rate is None else rate / 8 * 0.96,
            "ttft_overhead_ms_p50": ttft, "ttft_overhead_ms_p50_lo": lo, "ttft_overhead_ms_p50_hi": hi,
            "after_forward_ms_p50": ttft, "after_forward_ms_p50_lo": lo, "after_forward_ms_p50_hi": hi,
            "prefill_ttft_overhead_ms_p50": 1.0, "transfer_ms_p50": 2.0, "kv_ms_p50": 3.0, "bytes_p50": 4e6,
            "match_rate": 1.0, "requests": 8, "status": "ok"}


def test_cells_are_ordered_fastest_link_first_and_each_names_its_winner():
    runs = pd.DataFrame([
        run("fused", 1, 40.0, 38.0, 42.0), run("layerwise", 1, 20.0, 18.0, 22.0),
        run("fused", None, 10.0, 9.0, 12.0, kind="none"), run("layerwise", None, 11.0, 9.5, 12.5, kind="none"),
        run("fused", 0.1, 400.0, 390.0, 410.0), run("fused", 0.1, 380.0, 370.0, 385.0, transport="nixl"),
        {**run("fused", None, 5.0, 4.0, 6.0, kind="none"), "run_dir": "elsewhere/sweep/0_fused"},  # not beside a link
    ])
    t = link_table(runs)
    assert list(zip(t["link"], t["strategy"], t["transport"])) == [
        ("same machine", "fused", "staged"), ("same machine", "layerwise", "staged"), ("1 Gbit/s", "layerwise", "gloo"),
        ("1 Gbit/s", "fused", "gloo"), ("0.1 Gbit/s", "fused", "nixl"), ("0.1 Gbit/s", "fused", "gloo")]
    assert math.isinf(t.iloc[0]["link_rate"]) and t.iloc[2]["link_ceiling_gbit"] == 0.96
    assert winners(t) == [
        "tiny-llama cpu 1024 tokens, same machine: fused over staged 10.0 ms, within the noise of layerwise over "
        "staged 11.0 ms",
        "tiny-llama cpu 1024 tokens, 1 Gbit/s: layerwise over gloo 20.0 ms, ahead of fused over gloo 40.0 ms",
        "tiny-llama cpu 1024 tokens, 0.1 Gbit/s: fused over nixl 380.0 ms, ahead of fused over gloo 400.0 ms"]
    # ranked by the time after the forward pass, whatever the TTFT overhead says
    flipped = link_table(runs.assign(ttft_overhead_ms_p50=runs["ttft_overhead_ms_p50"][::-1].to_numpy()))
    assert winners(flipped) == winners(t)
    md = to_markdown(t)
    assert md.count("\n") == 7
    assert ("| 1024 | 1 Gbit/s | 0.96 | layerwise | gloo | 1.0 | 20.0 [18.0, 22.0] | 4000000 | 2.000 | 3.000 | "
            "20.0 [18.0, 22.0] | 1 | ok |") in md


def test_a_benchmark_run_of_several_lengths_gives_a_row_per_length():
    bench = {**run("fused", 10, 99.0, 98.0, 100.0, n=None), "run_dir": "out/g10/fused"}
    requests = pd.DataFrame([{"run_dir": "out/g10/fused", "prompt_len": n, "match": True, "ttft_overhead_ms": ms,
                              "after_forward_ms": ms - 1, "prefill_ttft_overhead_ms": 1.0, "transfer_ms": ms / 2,
                              "kv_ms": 0.5, "bytes": n * 1000} for n, ms in [(2048, 10.0), (2048, 12.0), (8192, 40.0)]])
    same = run("fused", None, 5.0, 4.0, 6.0, kind="none", n=2048) | {"run_dir": "out/same/fused"}  # one length: as is
    t = link_table(by_prompt_length(pd.DataFrame([bench, same]), requests))
    assert list(zip(t["prompt_len"], t["link"], t["requests"])) == [
        (2048, "same machine", 8), (2048, "10 Gbit/s", 2), (8192, "10 Gbit/s", 1)]
    assert t.iloc[1]["ttft_overhead_ms_p50"] == 11.0 and t.iloc[1]["transfer_ms_p50"] == 5.5
    assert (t.iloc[1]["ttft_overhead_ms_p50_lo"], t.iloc[1]["ttft_overhead_ms_p50_hi"]) == (10.0, 12.0)
    assert t.iloc[2]["after_forward_ms_p50"] == 39.0 and t.iloc[2]["bytes_p50"] == 8192000


def test_crossovers_name_the_two_links_between_which_two_strategies_change_order():
    runs = pd.DataFrame([  # same machine over staged, links over gloo: a strategy is one contender across them
        run("fused", None, 10.0, 9.0, 11.0, kind="none"), run("layerwise", None, 12.0, 11.5, 12.5, kind="none"),
        run("fused_int4", None, 30.0, 29.0, 31.0, kind="none"),
        run("fused", 1, 40.0, 38.0, 42.0), run("layerwise", 1, 20.0, 18.0, 22.0),
        run("fused_int4", 1, 41.0, 35.0, 45.0),
        run("fused", 0.1, 400.0, 390.0, 410.0), run("layerwise", 0.1, 300.0, 290.0, 310.0),
        run("fused_int4", 0.1, 90.0, 85.0, 95.0),
    ])
    assert crossovers(link_table(runs)) == [
        "tiny-llama cpu 1024 tokens: layerwise overtakes fused between same machine and 1 Gbit/s "
        "(20.0 against 40.0 ms at 1 Gbit/s)",
        "tiny-llama cpu 1024 tokens: fused_int4 overtakes fused between 1 Gbit/s and 0.1 Gbit/s "
        "(90.0 against 400.0 ms at 0.1 Gbit/s)",
        "tiny-llama cpu 1024 tokens: fused_int4 overtakes layerwise between 1 Gbit/s and 0.1 Gbit/s "
        "(90.0 against 300.0 ms at 0.1 Gbit/s)"]
    # a flip inside both intervals is named as such
    noisy = runs.assign(after_forward_ms_p50_lo=runs["after_forward_ms_p50"] - 500)
    assert all(c.endswith(", within the noise)") for c in crossovers(link_table(noisy)))
    # a strategy over two transports on one link: each transport its own contender (so the same
    # machine's staged runs meet no link's), compared where both are measured
    both = pd.concat([runs, pd.DataFrame([run("fused", 1, 39.0, 38.0, 40.0, transport="nixl")])])
    assert crossovers(link_table(both)) == [
        "tiny-llama cpu 1024 tokens: fused_int4 over gloo overtakes layerwise over gloo between 1 Gbit/s and "
        "0.1 Gbit/s (90.0 against 300.0 ms at 0.1 Gbit/s)",
        "tiny-llama cpu 1024 tokens: fused_int4 over gloo overtakes fused over gloo between 1 Gbit/s and "
        "0.1 Gbit/s (90.0 against 400.0 ms at 0.1 Gbit/s)"]
