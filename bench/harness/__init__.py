"""What every benchmark shares: results, tables, statistics, child processes and daemons (common), the
run's context (options, scratch directory, venvs, etcd, machine facts), the report that rewrites
docs/benchmarks.md, and its plots."""
