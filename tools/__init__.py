"""Maintenance of the repository's committed results tree (results/cpu, results/gpu): its index
(results_index.py), its headline figures checked against their records (results_findings.py) and
what a committed run directory keeps (results_slim.py). Not part of the harness: nothing in
harness/ or transfer_strategies/ imports it. Its commands are scripts/results_index.py and
scripts/slim_results.py."""
