"""Many locks in one daemon: the benchmark (benchmark.py) and the process it measures (daemon.py)."""
