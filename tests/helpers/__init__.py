"""What more than one test module uses, by what it is about: KV caches built in memory (kv), harness
runs and the checks on them (runs), the KV channel between two processes (transport), serving's
config, rows and summary (serving), the composed config as a Hydra job (config), a tokenizer
without files (tokenizer). The fixtures and run_harness stay in tests/conftest.py; no test module
imports another (tests/test_layout.py). Their asserts are rewritten as a test module's are
(tests/conftest.py registers this package with pytest), so a failing check shows its values."""
