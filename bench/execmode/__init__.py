"""Exec mode: what the keeper costs (`python -m bench.execmode.keeper_cost`)."""
