"""Disaggregated-serving harness: real vLLM prefill and decode engines, KV moved by a pluggable
transfer strategy, every output checked against a colocated baseline."""
