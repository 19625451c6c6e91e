"""Processes the peers benchmark starts: the work command (work.py) that every system runs as its
CMD, and the candidate script (candidate.py) that wraps the Python lock libraries in exec mode.

Both run as scripts by file path (not as modules of `bench`), so that they start with nothing of
the bench or of elector imported.
"""
