"""Reports over run directories, apart from running them: the loader (load.py), the strategy
benchmark's tables (benchmark.py), the compare gate (compare.py), the link, accuracy and sweep
reports. Each reads run directories and the metric declarations (harness/records/fields.py,
figures.py), never a runner."""
