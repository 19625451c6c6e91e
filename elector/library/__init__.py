"""The library: leader election inside a program, without the daemon.

`elector` and `elector.sync` are its public faces and re-export what users import; the modules
here are organised by purpose. Those without a leading `_` define public names (`elector.py`, the
`Elector`; `term.py`, one term of leadership; `watch.py`, who leads without contending;
`errors.py`; `signals.py`, `run`; `fencing.py`, fenced writes); those marked `_` are private and
may change at any time.
"""
