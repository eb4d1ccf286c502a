"""runner=offline (run.py): the baseline, prefill and decode engines in this process's children
(deployment.py), prompts driven through them (pipeline.py), a row per prompt (rows.py). Shares
harness/'s core with the serving runner (harness/serving/) and imports nothing of it."""
