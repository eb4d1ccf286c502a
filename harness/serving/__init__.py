"""runner=serve (serve.py): `vllm serve` instances behind routers (deployment.py, instances.py,
router.py) under a load generator's arrival schedule (load.py), summarized in serve_summary.py.
Shares harness/'s core with the offline runner (harness/offline/) and imports nothing of it."""
