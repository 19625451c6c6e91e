"""Benchmarks of `elector run` as real processes, with etcd as a peer: `python -m bench`.

Measurements, never pass/fail: each benchmark prints a table and `docs/benchmarks.md` is rewritten
with the command, the date, machine facts and every table. See bench/__main__.py.
"""
