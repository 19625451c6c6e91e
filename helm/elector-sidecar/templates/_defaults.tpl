{{/*
elector-sidecar.defaults: the defaults of the sidecar's values, merged under the values each template is
given (a given key wins, also when it is "", 0 or false; maps merge key by key; lists are replaced).
This is the reference of every key; helm/elector's values.yaml documents the same keys under `elector:`
(tests/helm/test_parent_chart.py keeps the two equal).
*/}}
{{- define "elector-sidecar.defaults" -}}
# false: every template of the library renders nothing (no container, volumes, env or ports), so a parent
# chart can switch the sidecar off with the usual `<alias>.enabled=false` (also as a dependency condition).
enabled: true
# The elector image. global.imageRegistry, when set, replaces `registry`.
image:
  # Registry of the image (empty: `repository` is used as is).
  registry: ghcr.io
  # Repository inside the registry (one that names its own registry, ghcr.io/..., keeps it).
  repository: elector-dev/elector
  # Tag. Empty: the library's appVersion.
  tag: ""
  # Digest (sha256:...). When set it pins the image and wins over the tag.
  digest: ""
  # Pull policy.
  pullPolicy: IfNotPresent
  # Pull secrets (names, or {name: ...}) that elector-sidecar.imagePullSecrets adds to global.imagePullSecrets.
  pullSecrets: []
# Name of the lock the replicas compete for (ELECTOR_LOCK), a template (it may use .Release.Namespace).
# Empty: "<namespace>/<full name>" of the including chart (full name: "<release>-<chart name>", or its
# fullnameOverride / nameOverride), at most 63 + 1 + 63 = 127 characters (the daemon takes 200), so two
# namespaces never share a leader. Name one lock without the namespace only to share it on purpose.
# A value empty after templating is refused.
lock: ""
# The name the previous release gave the lock (ELECTOR_PREDECESSOR_LOCK): a replica leads only while it holds
# that lock too, so old and new pods of a rolling update that renames the lock (and of its rollback) exclude each
# other, whatever renders the chart (helm upgrade, helm template, Argo CD, Flux). "auto": chart 0.1.0's default
# name when `lock` is empty ("<full name>"; in a chart that included the 0.1.0 sidecar, "<release>-elector"), none
# when `lock` is set. "": none. Anything else: that name (a template). Set it to "" once no 0.1.0 pod can come
# back (docs/upgrades.md): until then two releases of one name in two namespaces on one Redis exclude each other
# as they did in 0.1.0.
predecessorLock: auto
# The Redis server holding the lock.
redis:
  # ELECTOR_REDIS_URL: redis://host:port/db, rediss:// for TLS, unix:///path, or
  # redis+sentinel://s1:26379,s2:26379/MASTER[/db] (rediss+sentinel:// for TLS). No password in it (it would
  # sit in a plain env var; the render fails): use existingSecret. A user name alone (redis://user@host) is fine.
  url: redis://redis:6379/0
  # Existing Secret holding the Redis password, mounted read-only at /etc/elector/redis and passed as
  # ELECTOR_REDIS_PASSWORD_FILE. Empty: no password.
  existingSecret: ""
  # Key of the password inside existingSecret.
  existingSecretPasswordKey: password
  # TLS files of a rediss:// or rediss+sentinel:// URL from an existing Secret, mounted read-only at
  # /etc/elector/redis-tls (a cert-manager Certificate's Secret has exactly these keys).
  tls:
    # Name of the Secret. Empty: no files (the server is checked against the image's CAs).
    existingSecret: ""
    # Key of the CA bundle (ELECTOR_REDIS_TLS_CA). Empty: the image's CAs.
    caKey: ca.crt
    # Key of the client certificate (ELECTOR_REDIS_TLS_CERT). Empty together with keyKey: no client certificate.
    certKey: tls.crt
    # Key of its private key (ELECTOR_REDIS_TLS_KEY).
    keyKey: tls.key
# Lease time to live (ELECTOR_TTL). The readiness probe's default timing is derived from it.
ttl: 10s
# ELECTOR_RENEW_INTERVAL. Empty: the daemon's default (0.3 x ttl).
renewInterval: ""
# ELECTOR_RENEW_DEADLINE. Empty: the daemon's default (2/3 of the ttl).
renewDeadline: ""
# ELECTOR_REQUEST_TIMEOUT. Empty: the daemon's default.
requestTimeout: ""
# ELECTOR_LOG_LEVEL: debug, info, warning or error.
logLevel: info
# ELECTOR_LOG_FORMAT: json, console or auto.
logFormat: json
# ELECTOR_PRIORITY (preferred leaders). 0: not passed.
priority: 0
# ELECTOR_LEADER_FILE: an absolute path whose directory becomes the emptyDir volume "elector-leader".
# Empty: no file.
leaderFile: ""
# ELECTOR_MIN_REPLICAS_ACK (WAIT for Redis replicas). 0: not passed.
minReplicasAck: 0
# ELECTOR_REPLICAS_ACK_TIMEOUT, only with minReplicasAck >= 1. Empty: the daemon's default.
replicasAckTimeout: ""
# Readiness (the sidecar's readiness is the pod's: a pod is ready only when all its containers are). Default:
# GET /healthz, ready once the daemon serves and its election loop runs, whatever Redis does, so a Redis
# outage never takes the application out of its Service. Redis reachability shows in /readyz's body, the
# metrics (elector_redis_up) and the alerts (ElectorRedisUnreachable).
# gateOnLeadership true: GET /leader, only the leader is ready. COST: a Service over the pods reaches the
# leader alone, but followers count as unavailable for rollouts (maxUnavailable 0 waits for a new pod to
# win the lock) and PodDisruptionBudgets, and a Redis outage makes every pod unready.
gateOnLeadership: false
# gateOnRedis true: GET /readyz, ready only while the daemon reached Redis within the ttl. COST: about one
# ttl into a Redis outage EVERY replica leaves its Service, and new pods never become ready until Redis
# is back: the whole application goes down with Redis. Only for pods whose every request needs the lock.
gateOnRedis: false
# Port of the sidecar's HTTP endpoint (/healthz, /readyz, /leader, /metrics), named "elector-http". 9809 and
# not the daemon's own 8080: 8080 is the most common application port (and 9090, 9100 are Prometheus's and the
# node exporter's); 9809 is in no well-known list and no common framework's default. Two containers of a pod cannot
# both bind it (the render refuses a port equal to one given in the include's "podPorts").
port: 9809
# Address the endpoint listens on: 0.0.0.0 (IPv4) or :: (IPv6 clusters). ELECTOR_HTTP_ADDRESS is
# <bindAddress>:<port>, and elector-sidecar.appEnv's ELECTOR_LEADER_URL follows both.
bindAddress: 0.0.0.0
# Resources of the sidecar container.
resources:
  requests:
    cpu: 10m
    memory: 48Mi
  limits:
    memory: 128Mi
# Security context of the sidecar container (Pod Security Standard "restricted"). Merged key by key over these
# defaults; a key set to null is left out (runAsUser: null for OpenShift's restricted SCC, which assigns
# its own UID). helm/elector passes its whole `elector.securityContext`: a field it lacks is left out.
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
# Liveness probe timing (GET /healthz, which fails only when the election loop is stuck).
livenessProbe:
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
# Readiness probe (GET /healthz; /leader with gateOnLeadership, /readyz with gateOnRedis). enabled false: no
# readiness probe. periodSeconds and failureThreshold 0: with gateOnLeadership derived from the ttl, so that a
# leader that stepped down turns unready within ttl/3 (at least 1 s): period max(1, ttl/6 s), threshold
# max(1, (ttl/3) / period); otherwise 10 s and 3 (what /healthz and /readyz answer changes only when the
# daemon is stuck or Redis is gone for a ttl: a probe a second would be kubelet work for nothing).
readinessProbe:
  enabled: true
  initialDelaySeconds: 1
  periodSeconds: 0
  timeoutSeconds: 1
  failureThreshold: 0
# Seconds of the preStop `sleep` before the sidecar gets SIGTERM and releases the lease (the application
# stops its leader work meanwhile). 0: no hook.
preStopSleepSeconds: 5
# ELECTOR_SHUTDOWN_LINGER: seconds /metrics stays up after the release at shutdown. 0: not passed.
shutdownLingerSeconds: 0
# A listener compatible with the retired Kubernetes contrib leader-elector sidecar: it answers
# {"name":"<leader>"}, any path or method (ELECTOR_COMPAT_HTTP_ADDRESS, <bindAddress>:<port>, container port "elector-compat"),
# so an application that asks http://localhost:4040/ moves to elector by changing the sidecar only.
leaderElectorCompat:
  # Open the listener. false: not passed (the daemon's default: off).
  enabled: false
  # Its port (leader-elector's conventional --http=localhost:4040).
  port: 4040
  # ELECTOR_COMPAT_API: leader-elector (that image's answers: every path and method, {"name":"<leader>"}) or
  # nais (nais/elector's: "last_update" in the body, /sse streaming leader changes).
  api: leader-elector
  # true (with enabled): the daemon's identity, hence the name the listener reports, is the pod's host name, as
  # leader-elector's `--id=$(hostname)`: POD_NAME is not set. For apps that compare the name with their host
  # name where it differs from the pod's name (spec.hostname, names over 63 characters).
  identityFromHostname: false
# Leadership follows the application: the sidecar checks the app's own health URL and contends only while it
# answers 2xx; a leader whose app fails hands over at once (docs/helm.md, "Leadership follows the app").
appHealth:
  # ELECTOR_APP_HEALTH_URL as the sidecar reaches the app, e.g. http://127.0.0.1:8080/healthz (the path of the
  # app's own probe). Empty: off.
  url: ""
  # ELECTOR_APP_HEALTH_INTERVAL. Empty: the daemon's default (1s).
  interval: ""
  # ELECTOR_APP_HEALTH_FAILURES: failed checks in a row that make the app unhealthy. 0: the daemon's default (3).
  failures: 0
  # ELECTOR_APP_HEALTH_TIMEOUT of one check. Empty: the daemon's default (half the interval, at most 1s).
  timeout: ""
  # ELECTOR_APP_HEALTH_MIN_TERM, the hysteresis: a leader hands over for its app only after leading this long.
  # Empty: the daemon's default (the ttl).
  minTerm: ""
# More environment variables of the sidecar (list of EnvVar); ELECTOR_HTTP_ADDRESS is refused (set port and
# bindAddress instead).
extraEnv: []
# envFrom of the sidecar (list of EnvFromSource: ConfigMaps or Secrets of ELECTOR_* settings).
envFrom: []
# More volumeMounts of the sidecar (their volumes are the pod's: add them next to elector-sidecar.volumes).
extraVolumeMounts: []
{{- end }}

{{/* The library's appVersion: the image tag when image.tag is empty (a test keeps it equal to Chart.yaml). */}}
{{- define "elector-sidecar.appVersion" -}}
0.2.0
{{- end }}

{{/* Keys of the defaults whose values are free-form Kubernetes objects (not checked for unknown keys). */}}
{{- define "elector-sidecar.freeFormKeys" -}}
resources securityContext
{{- end }}
