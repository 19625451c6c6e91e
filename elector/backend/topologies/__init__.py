"""Sentinel, Cluster and Redlock, and the factory that picks the shape from the settings."""
