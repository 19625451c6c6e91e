{{/*
elector-sidecar.container: the sidecar, one item of a pod's `containers` list.

  containers:
    - name: app
      ...
    {{- include "elector-sidecar.container" (dict "values" .Values.leader "context" $) | nindent 4 }}

One container named "elector" with the port "elector-http", liveness GET /healthz, readiness GET /healthz
(/leader with gateOnLeadership, /readyz with gateOnRedis) timed from the ttl, POD_NAME from the downward
API (the daemon's identity), the ELECTOR_* environment, resources, a restricted security context and the
mounts of elector-sidecar.volumes (render those in the pod's `volumes`). Nothing with enabled false.
The dict's optional "podPorts" (the other containers' ports) makes a port clash a render error.
*/}}
{{- define "elector-sidecar.container" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml -}}
{{- if $v.enabled }}
{{- include "elector-sidecar.checkPodPorts" . }}
- name: elector
  image: {{ include "elector-sidecar.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args: ["run"]
  env:
    {{- include "elector-sidecar.env" . | nindent 4 }}
  {{- with $v.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: elector-http
      containerPort: {{ int $v.port }}
      protocol: TCP
    {{- if $v.leaderElectorCompat.enabled }}
    - name: elector-compat
      containerPort: {{ int $v.leaderElectorCompat.port }}
      protocol: TCP
    {{- end }}
  livenessProbe:
    {{- include "elector-sidecar.livenessProbe" . | nindent 4 }}
  {{- if $v.readinessProbe.enabled }}
  readinessProbe:
    {{- include "elector-sidecar.readinessProbe" . | nindent 4 }}
  {{- end }}
  {{- if gt (int $v.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ int $v.preStopSleepSeconds | toString | quote }}]
  {{- end }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  {{- with include "elector-sidecar.volumeMounts" . | trim }}
  volumeMounts:
    {{- . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
Fails when the sidecar's port (or leaderElectorCompat's) is one of the dict's "podPorts": the other
containers of the pod share its network namespace, so one of the two would fail to bind at run time.
*/}}
{{- define "elector-sidecar.checkPodPorts" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $mine := list (int $v.port) }}
{{- if $v.leaderElectorCompat.enabled }}{{ $mine = append $mine (int $v.leaderElectorCompat.port) }}{{ end }}
{{- range .podPorts | default list }}
{{- $port := 0 }}
{{- if kindIs "map" . }}{{ $port = int (.containerPort | default 0) }}{{ else }}{{ $port = int . }}{{ end }}
{{- if has $port $mine }}
{{- fail (printf "elector-sidecar: port %d is also a port of another container of the pod, and only one of the two can bind it; set the sidecar's port (or leaderElectorCompat.port) to another one" $port) }}
{{- end }}
{{- end }}
{{- end }}

{{/* elector-sidecar.env: the sidecar's `env` items. */}}
{{- define "elector-sidecar.env" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $tls := $v.redis.tls | default dict -}}
{{- $compat := $v.leaderElectorCompat -}}
{{- if not (and $compat.enabled $compat.identityFromHostname) }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
- name: ELECTOR_REDIS_URL
  value: {{ $v.redis.url | quote }}
- name: ELECTOR_LOCK
  value: {{ include "elector-sidecar.lock" . | quote }}
{{- with include "elector-sidecar.predecessorLock" . }}
- name: ELECTOR_PREDECESSOR_LOCK
  value: {{ . | quote }}
{{- end }}
- name: ELECTOR_TTL
  value: {{ $v.ttl | quote }}
- name: ELECTOR_HTTP_ADDRESS
  value: {{ include "elector-sidecar.httpAddress" . | quote }}
- name: ELECTOR_LOG_FORMAT
  value: {{ $v.logFormat | quote }}
- name: ELECTOR_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
{{- with $v.renewInterval }}
- name: ELECTOR_RENEW_INTERVAL
  value: {{ . | quote }}
{{- end }}
{{- with $v.renewDeadline }}
- name: ELECTOR_RENEW_DEADLINE
  value: {{ . | quote }}
{{- end }}
{{- with $v.requestTimeout }}
- name: ELECTOR_REQUEST_TIMEOUT
  value: {{ . | quote }}
{{- end }}
{{- if $v.redis.existingSecret }}
- name: ELECTOR_REDIS_PASSWORD_FILE
  value: /etc/elector/redis/password
{{- end }}
{{- if $tls.existingSecret }}
{{- if $tls.caKey }}
- name: ELECTOR_REDIS_TLS_CA
  value: /etc/elector/redis-tls/ca.crt
{{- end }}
{{- if $tls.certKey }}
- name: ELECTOR_REDIS_TLS_CERT
  value: /etc/elector/redis-tls/tls.crt
- name: ELECTOR_REDIS_TLS_KEY
  value: /etc/elector/redis-tls/tls.key
{{- end }}
{{- end }}
{{- if ne (int ($v.priority | default 0)) 0 }}
- name: ELECTOR_PRIORITY
  value: {{ int $v.priority | toString | quote }}
{{- end }}
{{- with $v.leaderFile }}
- name: ELECTOR_LEADER_FILE
  value: {{ . | quote }}
{{- end }}
{{- if gt (int ($v.shutdownLingerSeconds | default 0)) 0 }}
- name: ELECTOR_SHUTDOWN_LINGER
  value: {{ printf "%ds" (int $v.shutdownLingerSeconds) | quote }}
{{- end }}
{{- if gt (int ($v.minReplicasAck | default 0)) 0 }}
- name: ELECTOR_MIN_REPLICAS_ACK
  value: {{ int $v.minReplicasAck | toString | quote }}
{{- end }}
{{- with $v.replicasAckTimeout }}
- name: ELECTOR_REPLICAS_ACK_TIMEOUT
  value: {{ . | quote }}
{{- end }}
{{- if $compat.enabled }}
- name: ELECTOR_COMPAT_HTTP_ADDRESS
  value: {{ include "elector-sidecar.hostPort" (dict "host" $v.bindAddress "port" $compat.port) | quote }}
{{- if ne (toString $compat.api) "leader-elector" }}
- name: ELECTOR_COMPAT_API
  value: {{ $compat.api | quote }}
{{- end }}
{{- end }}
{{- with $v.appHealth.url }}
- name: ELECTOR_APP_HEALTH_URL
  value: {{ . | quote }}
{{- with $v.appHealth.interval }}
- name: ELECTOR_APP_HEALTH_INTERVAL
  value: {{ . | quote }}
{{- end }}
{{- if gt (int ($v.appHealth.failures | default 0)) 0 }}
- name: ELECTOR_APP_HEALTH_FAILURES
  value: {{ int $v.appHealth.failures | toString | quote }}
{{- end }}
{{- with $v.appHealth.timeout }}
- name: ELECTOR_APP_HEALTH_TIMEOUT
  value: {{ . | quote }}
{{- end }}
{{- with $v.appHealth.minTerm }}
- name: ELECTOR_APP_HEALTH_MIN_TERM
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* ELECTOR_HTTP_ADDRESS: <bindAddress>:<port>, [::]:<port> for IPv6. */}}
{{- define "elector-sidecar.httpAddress" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- include "elector-sidecar.hostPort" (dict "host" $v.bindAddress "port" $v.port) }}
{{- end }}

{{/* host:port from (dict "host" .. "port" ..), [host]:port for an IPv6 host. */}}
{{- define "elector-sidecar.hostPort" -}}
{{- if contains ":" .host }}
{{- printf "[%s]:%d" .host (int .port) }}
{{- else }}
{{- printf "%s:%d" .host (int .port) }}
{{- end }}
{{- end }}

{{/* elector-sidecar.livenessProbe: GET /healthz on elector-http, with livenessProbe's timing. */}}
{{- define "elector-sidecar.livenessProbe" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml -}}
httpGet:
  path: /healthz
  port: elector-http
{{- range $key := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "failureThreshold" }}
{{- with index $v.livenessProbe $key }}
{{ $key }}: {{ int . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
elector-sidecar.readinessProbe: GET /healthz (the daemon serves and its election loop runs, whatever Redis
does), /leader with gateOnLeadership, /readyz with gateOnRedis. periodSeconds and failureThreshold left at
0: with gateOnLeadership derived from the ttl, so that a leader that stepped down (GET /leader answers 503)
turns unready within ttl/3, at least one 1-second probe; otherwise Kubernetes' own 10 s and 3, since
/healthz and /readyz read the daemon's memory and change only when it is stuck or Redis is gone for a ttl
(a probe every second of every replica is kubelet work for nothing).
*/}}
{{- define "elector-sidecar.readinessProbe" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $probe := $v.readinessProbe | default dict }}
{{- $gate := eq (toString $v.gateOnLeadership) "true" }}
{{- $budgetMs := div (include "elector-sidecar.durationMs" $v.ttl | int) 3 }}
{{- $period := int ($probe.periodSeconds | default 0) }}
{{- if le $period 0 }}{{ $period = ternary (max 1 (div $budgetMs 2000) | int) 10 $gate }}{{ end }}
{{- $threshold := int ($probe.failureThreshold | default 0) }}
{{- if le $threshold 0 }}{{ $threshold = ternary (max 1 (div $budgetMs (mul $period 1000)) | int) 3 $gate }}{{ end }}
{{- $path := "/healthz" }}
{{- if eq (toString $v.gateOnLeadership) "true" }}{{ $path = "/leader" }}
{{- else if eq (toString $v.gateOnRedis) "true" }}{{ $path = "/readyz" }}{{ end -}}
httpGet:
  path: {{ $path }}
  port: elector-http
{{- with $probe.initialDelaySeconds }}
initialDelaySeconds: {{ int . }}
{{- end }}
periodSeconds: {{ $period }}
{{- with $probe.timeoutSeconds }}
timeoutSeconds: {{ int . }}
{{- end }}
failureThreshold: {{ $threshold }}
{{- end }}

{{/* The sidecar's volumeMounts items (nothing when it mounts nothing). */}}
{{- define "elector-sidecar.volumeMounts" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $tls := $v.redis.tls | default dict }}
{{- if $v.redis.existingSecret }}
- name: elector-redis-password
  mountPath: /etc/elector/redis
  readOnly: true
{{- end }}
{{- if $tls.existingSecret }}
- name: elector-redis-tls
  mountPath: /etc/elector/redis-tls
  readOnly: true
{{- end }}
{{- with $v.leaderFile }}
# the sidecar writes the file (write-then-rename in this directory); the app container reads it
- name: elector-leader
  mountPath: {{ dir . | quote }}
{{- end }}
{{- with $v.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}
