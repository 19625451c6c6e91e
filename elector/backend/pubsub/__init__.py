"""Lease announcements: the shared pub/sub connection, its link, and the subscriptions built on it."""
