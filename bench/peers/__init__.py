"""elector against its peers (etcd, ZooKeeper, python-redis-lock, redis-py Lock) on one exec-mode
workload: the benchmark, its systems, trials, probes, report and the candidate processes."""
