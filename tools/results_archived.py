"""The run directories removed from results/ to keep it within its budget (tools/results_index.py's
TOTAL_BUDGET_BYTES), each with why and a commit that still holds it; results/INDEX.md lists them."""

from __future__ import annotations

from dataclasses import dataclass

# the commit before results/ was slimmed and renamed (issue 27): every removed file is there
BEFORE_SLIMMING = "18f0b0e919a9177a8fb57e0a96426a0cfc496ab4"


@dataclass(frozen=True)
class Archived:
    path: str  # relative to results/, at `commit`
    why: str
    commit: str = BEFORE_SLIMMING  # a commit that holds it


# runs no document or test cites, removed from the tree (git show/checkout brings them back)
ARCHIVED: list[Archived] = [
    Archived("cpu/2026-12-01-s10-soak", "session 10's 1,000-request soak of every strategy on CPU (issue 14; code "
             "b9ee97f): no document but its own README cited it; 3.8 MB, archived in session 27 when results/ "
             "reached its budget", "b5a0ecd3ebc819747cbd2085b3e5fe2cb3afc387"),
    Archived("cpu/2026-12-03-s16-engine-reuse", "session 16's sweep with and without engine reuse (issue 24), "
             "superseded by session 19's (cpu/2026-12-03-s19-engine-reuse); only CHANGELOG.md cited it; 0.38 MB, "
             "archived in session 39 (over budget)", "6ffff48bddb4e2cb0e4ab6a7b3a087bd82f1075f"),
    Archived("cpu/2026-12-04-s21-lossy", "session 21's lossy strategies on the CPU, superseded by session 22's "
             "(cpu/2026-12-04-s22-lossy, the same accuracy columns); only CHANGELOG.md cited it; 0.63 MB, archived in "
             "session 39 with the one above", "6ffff48bddb4e2cb0e4ab6a7b3a087bd82f1075f"),
    *(Archived(path, f"{why}; archived in session 41 (over budget)", "ab4285ce4fc58cca8e925ab78b7a7f9aa5a64ead")
      for path, why in [("cpu/2026-12-06-s32-ab", "session 32's A/B of a refactor; CHANGELOG.md cited it"),
                        ("cpu/2026-12-04-s21-ab-fused", "session 21's A/B of fused; CHANGELOG.md cited it"),
                        ("gpu/2026-12-01-s12", "session 12's TP check of the 8B-KV model; uncited"),
                        ("cpu/2026-12-07-s40-mla", "tiny-mla with 64-dim heads; superseded by s41-mla")]),
    Archived("gpu/2026-12-05-s25", "session 25's codec kernels in engines, FP8 check wrong (rerun in session 26); "
             "CHANGELOG.md cited it; archived in session 42", "d8599e28d0cf26c46c9c41b956ce28c7b35379f2"),
    *(Archived(path, f"{why}; archived in session 43 for the selective router's sweep (over budget)",
               "df673fe4f87faba9cf32ddd27df1c267c8e3d555")
      for path, why in [("gpu/2026-12-01-s10", "session 10's int64 digests, cross-check and scenarios on CUDA, each "
                         "run again later (s13, s14, s18); CHANGELOG.md and results/gpu/README.md cited it"),
                        ("gpu/2026-12-01-s11", "session 11's per-head digests on CUDA and the 8B-KV model's training "
                         "info; CHANGELOG.md and results/gpu/README.md cited it"),
                        ("gpu/2026-12-03-s16/tests-gpu", "session 16's GPU tests, run again by every later GPU "
                         "session; CHANGELOG.md and results/gpu/README.md cited it"),
                        ("gpu/2026-12-04-s20", "session 20's TTFT rerun after issue 27 and its A/B, superseded by "
                         "the later TTFT runs (s23 to s32); CHANGELOG.md and results/gpu/README.md cited it"),
                        ("gpu/2026-12-04-s22/ttft", "session 22's fused TTFT at 2k/8k/16k, superseded by the later "
                         "TTFT runs (s23 to s32); results/gpu/README.md cited it"),
                        ("cpu/2026-12-07-s42-interference", "session 42's one-start interference run, superseded "
                         "by s43-selective's (12 starts); CHANGELOG.md and docs/serving.md cited it")]),
]
