"""What the election tells operators, shared by the daemon and the library: its Prometheus series
(metrics.py) and what each cycle's outcome says in the logs (outcome_log.py).

Below both users and above the election: it reads the election's outcome values, never drives it.
"""
