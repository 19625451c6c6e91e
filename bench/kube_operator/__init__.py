"""Benchmarks of `elector operator` against the kmock Kubernetes API emulator."""
