"""The servers the benchmarks run beside Redis, and how they are found or installed: one apt-get
helper (install.py) for `python -m bench.servers.setup` (`make bench-setup`) and for etcd's own check;
private etcd and ZooKeeper servers on free ports."""
