"""The daemon process: settings, HTTP, metrics, logs, the leader file and exec mode."""
