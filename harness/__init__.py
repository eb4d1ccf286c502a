"""Disaggregated-serving harness: real vLLM prefill and decode engines, KV moved by a pluggable
transfer strategy, every output checked against a colocated baseline."""

from pathlib import Path

# where conf/, models/ and results/ are: paths hang off the project, never off the current directory
PROJECT_ROOT = Path(__file__).resolve().parent.parent
