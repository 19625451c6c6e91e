"""`elector operator`: a kopf operator for LeaderElection resources (the `kube` extra).

It watches each LeaderElection's lock in Redis and keeps the cluster in line with it: the leader
label on the candidate pods, Events on transitions, the resource's status, handoffs asked for by
annotation, and Prometheus metrics. See docs/kubernetes.md.

Modules: `resource` (the CRD's spec and status, no I/O), `reconcile` (labels, Events, status of
a transition), `watcher` (the per-object loop), `pods` (the candidates, from one shared watch),
`lease_mirror` (the Kubernetes Lease), `handoff_annotation` (the annotation), `kubeapi` (a small
API client on kopf's credentials), `metrics`, `handlers` (the kopf registry), `runner` (the hot-
standby operator process) and `command` (what `elector operator` runs). Nothing here imports kopf on package
import: `elector.cli.main` offers the command without it.
"""
