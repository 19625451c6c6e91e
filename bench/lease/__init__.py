"""One lock, one daemon (or two): crash takeover, graceful handoff, idle requests and resources,
start-up (all run by `python -m bench`), and the stand-alone costs of the Lua scripts and the leader
file (`python -m bench.lease.script_cost`, `python -m bench.lease.leader_file_check`)."""
