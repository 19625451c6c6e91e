"""Exec mode: the leader's command, its supervisor, and the keeper that bounds it by the lease."""
