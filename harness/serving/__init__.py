"""runner=serve (serve.py): `vllm serve` instances behind routers (deployment.py, instances.py,
router.py) under a load generator's arrival schedule (load.py), summarized by harness/records/
(serve_summary.py); deploy.py leaves the deployment running. Shares harness/'s core with the
offline runner (harness/offline/) and imports nothing of it."""
