"""Fault-injection suite: real exec-mode daemons, journaling children, a checker.

See docs/_draft_faults.md.
"""
