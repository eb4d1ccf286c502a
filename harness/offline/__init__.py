"""runner=offline (run.py): the baseline, prefill and decode engines in this process's children.
Shares harness/'s core with the serving runner (harness/serving/) and imports nothing of it."""
