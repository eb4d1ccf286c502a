"""The warm-up's prompts (harness/workload.py warmup_workload): every measured request's shape
taken once before measuring (issue 47: first-use costs of 309-333 ms in an uncovered length)."""

from harness.workload import Prompt, Workload, is_warmup, warmup_lengths, warmup_workload


def workload(lengths, concurrency=1):
    return Workload("w", [Prompt(i, list(range(10, 10 + n))) for i, n in enumerate(lengths)], concurrency)


def test_each_power_of_two_range_of_lengths_is_warmed_by_its_longest():
    assert warmup_lengths(workload([2048] * 8 + [8192] * 8 + [16384] * 8)) == [16384, 8192, 2048]
    assert warmup_lengths(workload([1, 5, 32, 31, 33, 64, 65, 150])) == [150, 65, 64, 32, 5, 1]


def test_a_warm_up_round_fills_a_batch_of_the_workloads_concurrency():
    w = warmup_workload(workload([2048, 8192], concurrency=4), 1)
    assert [len(p.token_ids) for p in w.prompts] == [8192, 2048, 8192, 2048] and w.concurrency == 4
    assert len(warmup_workload(workload([2048, 8192]), 2).prompts) == 4  # two rounds of two lengths
    assert len(warmup_workload(workload([100]), 1, batch=3).prompts) == 3  # runner=serve: a request per instance


def test_warm_up_prompts_share_no_prefix_with_the_measured_ones_nor_each_other():
    measured = workload([64, 64, 256])
    w = warmup_workload(measured, 1, batch=4)
    firsts = {tuple(p.token_ids[:16]) for p in w.prompts}
    assert len(firsts) == len(w.prompts)
    assert not firsts & {tuple(p.token_ids[:16]) for p in measured.prompts}
    assert all(p.index < 0 and is_warmup(f"run-{p.index}") for p in w.prompts)
    assert not is_warmup("run-3") and not is_warmup("run-0")
