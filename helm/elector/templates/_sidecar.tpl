{{/*
elector.sidecar: the elector sidecar container, as one item of a pod's `containers` list.

Usage, in this chart or in a chart that has `elector` as a dependency:

  containers:
    - name: app
      ...
    {{- include "elector.sidecar" (dict "root" $) | nindent 4 }}
  volumes:
    {{- include "elector.sidecarVolumes" (dict "root" $) | nindent 4 }}

Arguments (a dict):
  root              the root context `$` (required). In a parent chart the values and appVersion are
                    taken from the `elector` subchart (its values live under the parent's `elector:` key).
  lock              override of elector.lock (default: elector.lock, else the elector full name)
  priority          override of elector.priority (e.g. a preferred Deployment among several on one lock)
  gateOnLeadership  override of readiness.gateOnLeadership
  resources         override of sidecar.resources
  extraEnv          more EnvVars, appended to sidecar.extraEnv
*/}}

{{/* The context whose values configure the sidecar: the root, or its `elector` subchart. */}}
{{- define "elector.sidecarContext" -}}
{{- $root := .root }}
{{- if and (ne $root.Chart.Name "elector") $root.Subcharts (hasKey $root.Subcharts "elector") }}subchart{{ else }}root{{ end }}
{{- end }}

{{/*
Checks of the sidecar's values the schema cannot express; in the sidecar template so that parent
charts get them too. Each message names the setting (and never prints a URL, which may hold a password).
*/}}
{{- define "elector.sidecarValidate" -}}
{{- $e := .elector }}
{{- $tls := $e.redis.tls | default dict }}
{{- if $tls.existingSecret }}
{{- $scheme := (splitList "://" $e.redis.url | first) }}
{{- if not (has $scheme (list "rediss" "rediss+sentinel")) }}
{{- fail (printf "elector.redis.tls.existingSecret needs a rediss:// or rediss+sentinel:// elector.redis.url (got a %s:// URL)" $scheme) }}
{{- end }}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) }}
{{- fail "elector.redis.tls: set certKey and keyKey together (a client certificate needs its key), or both empty" }}
{{- end }}
{{- if and (empty $tls.caKey) (empty $tls.certKey) }}
{{- fail "elector.redis.tls.existingSecret is set but caKey, certKey and keyKey are all empty: nothing to mount" }}
{{- end }}
{{- end }}
{{- if and $e.replicasAckTimeout (lt (int ($e.minReplicasAck | default 0)) 1) }}
{{- fail "elector.replicasAckTimeout only applies with elector.minReplicasAck 1 or more (the daemon refuses it otherwise)" }}
{{- end }}
{{- with $e.leaderFile }}
{{- if has (dir .) (list "/etc/elector/redis" "/etc/elector/redis-tls") }}
{{- fail (printf "elector.leaderFile %s: its directory is where the sidecar mounts a Secret; pick another, e.g. /var/run/elector/leader.json" .) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "elector.sidecar" -}}
{{- $ctx := .root }}
{{- if eq (include "elector.sidecarContext" .) "subchart" }}
{{- $ctx = index .root.Subcharts "elector" }}
{{- end }}
{{- $v := $ctx.Values }}
{{- include "elector.sidecarValidate" $v }}
{{- $gate := $v.readiness.gateOnLeadership }}
{{- if hasKey . "gateOnLeadership" }}{{ $gate = .gateOnLeadership }}{{ end }}
{{- $priority := $v.elector.priority | default 0 }}
{{- if hasKey . "priority" }}{{ $priority = .priority }}{{ end }}
{{- $tls := $v.elector.redis.tls | default dict }}
{{- $leaderFile := $v.elector.leaderFile | default "" -}}
- name: elector
  image: {{ include "elector.image" $ctx | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args: ["run"]
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: ELECTOR_REDIS_URL
      value: {{ $v.elector.redis.url | quote }}
    - name: ELECTOR_LOCK
      value: {{ .lock | default (include "elector.lock" $ctx) | quote }}
    - name: ELECTOR_TTL
      value: {{ $v.elector.ttl | quote }}
    - name: ELECTOR_HTTP_ADDRESS
      value: {{ printf "0.0.0.0:%d" (int $v.sidecar.port) | quote }}
    - name: ELECTOR_LOG_FORMAT
      value: {{ $v.elector.logFormat | quote }}
    - name: ELECTOR_LOG_LEVEL
      value: {{ $v.elector.logLevel | quote }}
    {{- with $v.elector.renewInterval }}
    - name: ELECTOR_RENEW_INTERVAL
      value: {{ . | quote }}
    {{- end }}
    {{- with $v.elector.renewDeadline }}
    - name: ELECTOR_RENEW_DEADLINE
      value: {{ . | quote }}
    {{- end }}
    {{- with $v.elector.requestTimeout }}
    - name: ELECTOR_REQUEST_TIMEOUT
      value: {{ . | quote }}
    {{- end }}
    {{- if $v.elector.redis.existingSecret }}
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
    {{- if ne (int $priority) 0 }}
    - name: ELECTOR_PRIORITY
      value: {{ int $priority | toString | quote }}
    {{- end }}
    {{- with $leaderFile }}
    - name: ELECTOR_LEADER_FILE
      value: {{ . | quote }}
    {{- end }}
    {{- if gt (int ($v.sidecar.shutdownLingerSeconds | default 0)) 0 }}
    - name: ELECTOR_SHUTDOWN_LINGER
      value: {{ printf "%ds" (int $v.sidecar.shutdownLingerSeconds) | quote }}
    {{- end }}
    {{- if gt (int ($v.elector.minReplicasAck | default 0)) 0 }}
    - name: ELECTOR_MIN_REPLICAS_ACK
      value: {{ int $v.elector.minReplicasAck | toString | quote }}
    {{- end }}
    {{- with $v.elector.replicasAckTimeout }}
    - name: ELECTOR_REPLICAS_ACK_TIMEOUT
      value: {{ . | quote }}
    {{- end }}
    {{- with $v.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with .extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: elector-http
      containerPort: {{ int $v.sidecar.port }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: elector-http
    {{- toYaml $v.sidecar.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: {{ ternary "/leader" "/readyz" $gate }}
      port: elector-http
    {{- toYaml $v.sidecar.readinessProbe | nindent 4 }}
  {{- if gt (int $v.sidecar.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ int $v.sidecar.preStopSleepSeconds | toString | quote }}]
  {{- end }}
  resources:
    {{- toYaml (.resources | default $v.sidecar.resources) | nindent 4 }}
  securityContext:
    {{- toYaml $v.sidecar.securityContext | nindent 4 }}
  {{- if or $v.elector.redis.existingSecret $tls.existingSecret $leaderFile }}
  volumeMounts:
    {{- if $v.elector.redis.existingSecret }}
    - name: elector-redis-password
      mountPath: /etc/elector/redis
      readOnly: true
    {{- end }}
    {{- if $tls.existingSecret }}
    - name: elector-redis-tls
      mountPath: /etc/elector/redis-tls
      readOnly: true
    {{- end }}
    {{- with $leaderFile }}
    # the sidecar writes the file (write-then-rename in this directory); the app container reads it
    - name: elector-leader
      mountPath: {{ dir . | quote }}
    {{- end }}
  {{- end }}
{{- end }}

{{/*
elector.sidecarVolumes: the volumes the sidecar mounts, as items of a pod's `volumes` list: the Redis
password Secret (elector.redis.existingSecret), the TLS Secret (elector.redis.tls.existingSecret) and the
leader file's emptyDir "elector-leader" (elector.leaderFile); renders nothing when none is configured.
Secret files are 0444 because only the sidecar mounts these volumes and the pod may set no fsGroup
(0440 would then hide them from the sidecar's non-root user).
*/}}
{{- define "elector.sidecarVolumes" -}}
{{- include "elector.sidecarVolumeItems" . | trim }}
{{- end }}

{{/* The items of elector.sidecarVolumes, each block starting on a new line (trimmed by the caller). */}}
{{- define "elector.sidecarVolumeItems" -}}
{{- $ctx := .root }}
{{- if eq (include "elector.sidecarContext" .) "subchart" }}
{{- $ctx = index .root.Subcharts "elector" }}
{{- end }}
{{- $e := $ctx.Values.elector }}
{{- $tls := $e.redis.tls | default dict }}
{{- with $e.redis.existingSecret }}
- name: elector-redis-password
  secret:
    secretName: {{ . }}
    defaultMode: 0444
    items:
      - key: {{ $e.redis.existingSecretPasswordKey }}
        path: password
{{- end }}
{{- with $tls.existingSecret }}
- name: elector-redis-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0444
    items:
      {{- with $tls.caKey }}
      - key: {{ . }}
        path: ca.crt
      {{- end }}
      {{- if $tls.certKey }}
      - key: {{ $tls.certKey }}
        path: tls.crt
      - key: {{ $tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- if $e.leaderFile }}
- name: elector-leader
  emptyDir:
    # a few hundred bytes, rewritten at every change of role and every renewal: memory, not the node's disk
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- end }}

{{/*
elector.leaderFileMount: the volumeMount (one item of a container's `volumeMounts` list) through which an
application container reads the leader file, read-only at the same path as the sidecar writes it.
Renders nothing without elector.leaderFile. Takes the same dict as elector.sidecar:

  volumeMounts:
    {{- include "elector.leaderFileMount" (dict "root" $) | nindent 4 }}
*/}}
{{- define "elector.leaderFileMount" -}}
{{- $ctx := .root }}
{{- if eq (include "elector.sidecarContext" .) "subchart" }}
{{- $ctx = index .root.Subcharts "elector" }}
{{- end }}
{{- with $ctx.Values.elector.leaderFile -}}
- name: elector-leader
  mountPath: {{ dir . | quote }}
  readOnly: true
{{- end }}
{{- end }}
