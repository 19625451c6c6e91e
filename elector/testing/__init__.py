"""Helpers for tests and the demo: a private, throw-away redis-server."""
