"""The command line: `elector run`, `status`, `handoff`, `demo`, `leader-file`, `operator`."""
