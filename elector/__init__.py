"""elector: leader election for Kubernetes workloads on a Redis lease."""

__version__ = "0.1.0"
