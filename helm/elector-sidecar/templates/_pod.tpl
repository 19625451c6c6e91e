{{/*
Pod-level pieces that go with elector-sidecar.container; each takes the same dict.

  spec:
    imagePullSecrets:
      {{- include "elector-sidecar.imagePullSecrets" (dict "values" .Values.leader "context" $) | nindent 6 }}
    containers:
      - name: app
        env:
          {{- include "elector-sidecar.appEnv" (dict "values" .Values.leader "context" $) | nindent 10 }}
        volumeMounts:
          {{- include "elector-sidecar.leaderFileMount" (dict "values" .Values.leader "context" $) | nindent 10 }}
      {{- include "elector-sidecar.container" (dict "values" .Values.leader "context" $) | nindent 6 }}
    volumes:
      {{- include "elector-sidecar.volumes" (dict "values" .Values.leader "context" $) | nindent 6 }}

An empty `volumes:`, `volumeMounts:` or `imagePullSecrets:` (nothing configured) is valid Kubernetes.
*/}}

{{/*
elector-sidecar.volumes: the volumes the sidecar mounts, as items of a pod's `volumes` list: the Redis
password Secret (redis.existingSecret), the TLS Secret (redis.tls.existingSecret) and the leader file's
emptyDir "elector-leader" (leaderFile); nothing when none is configured. Secret files are 0444: only the
sidecar mounts them, and the pod may set no fsGroup (0440 would hide them from the sidecar's user).
*/}}
{{- define "elector-sidecar.volumes" -}}
{{- include "elector-sidecar.volumeItems" . | trim }}
{{- end }}

{{- define "elector-sidecar.volumeItems" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $tls := $v.redis.tls | default dict }}
{{- if $v.enabled }}
{{- with $v.redis.existingSecret }}
- name: elector-redis-password
  secret:
    secretName: {{ . }}
    defaultMode: 0444
    items:
      - key: {{ $v.redis.existingSecretPasswordKey }}
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
{{- if $v.leaderFile }}
- name: elector-leader
  emptyDir:
    # a few hundred bytes, rewritten at every change of role and every renewal: memory, not the node's disk
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- end }}
{{- end }}

{{/*
elector-sidecar.leaderUrl: the URL of the sidecar's /leader for a container of the same pod, on the
sidecar's port and address family (127.0.0.1, or [::1] with bindAddress ::).
*/}}
{{- define "elector-sidecar.leaderUrl" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- printf "http://%s:%d/leader" (ternary "[::1]" "127.0.0.1" (eq $v.bindAddress "::")) (int $v.port) }}
{{- end }}

{{/*
elector-sidecar.appEnv: `env` items for an application container: ELECTOR_LEADER_URL (200 on the leader,
503 elsewhere) and, with leaderFile, ELECTOR_LEADER_FILE.
*/}}
{{- define "elector-sidecar.appEnv" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml -}}
{{- if $v.enabled -}}
- name: ELECTOR_LEADER_URL
  value: {{ include "elector-sidecar.leaderUrl" . | quote }}
{{- with $v.leaderFile }}
- name: ELECTOR_LEADER_FILE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
elector-sidecar.leaderFileMount: the volumeMount through which an application container reads the leader
file, read-only at the directory the sidecar writes it in; nothing without leaderFile.
*/}}
{{- define "elector-sidecar.leaderFileMount" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- if $v.enabled }}
{{- with $v.leaderFile -}}
- name: elector-leader
  mountPath: {{ dir . | quote }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/*
elector-sidecar.imagePullSecrets: items of a pod's `imagePullSecrets`: global.imagePullSecrets, then
image.pullSecrets, then the dict's optional "extra" list (names or {name: ...}), each name once.
*/}}
{{- define "elector-sidecar.imagePullSecrets" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $global := .context.Values.global | default dict }}
{{- $names := list }}
{{- range concat ($global.imagePullSecrets | default list) ($v.image.pullSecrets | default list) (.extra | default list) }}
{{- $name := "" }}
{{- if kindIs "map" . }}{{ $name = toString (.name | default "") }}{{ else }}{{ $name = toString . }}{{ end }}
{{- if and $name (not (has $name $names)) }}{{ $names = append $names $name }}{{ end }}
{{- end }}
{{- range $names }}
- name: {{ . }}
{{- end }}
{{- end }}

{{/*
elector-sidecar.redisPorts: the TCP ports the sidecar connects to, comma-separated, from redis.url: its
port (default 6379), every Sentinel's port (default 26379) plus the dict's "sentinelMasterPorts" (the
master's and replicas' ports, which only the sentinels know); nothing for unix:// or with enabled false. Fails when a port
cannot be derived.
*/}}
{{- define "elector-sidecar.redisPorts" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $url := toString $v.redis.url }}
{{- $scheme := include "elector-sidecar.redisScheme" $url }}
{{- if and $v.enabled (ne $scheme "unix") }}
{{- $sentinel := hasSuffix "+sentinel" $scheme }}
{{- $authority := include "elector-sidecar.redisAuthority" $url | splitList "@" | last }}
{{- if not $authority }}
{{- fail "elector-sidecar: redis.url names no host, so the Redis ports for a NetworkPolicy cannot be derived" }}
{{- end }}
{{- $ports := list }}
{{- range $address := splitList "," $authority }}
{{- $port := "" }}
{{- if hasPrefix "[" $address }}
{{- $port = splitList "]" $address | last | trimPrefix ":" }}
{{- else if contains ":" $address }}
{{- $port = splitList ":" $address | last }}
{{- end }}
{{- if eq $port "" }}{{ $port = ternary "26379" "6379" $sentinel }}{{ end }}
{{- if or (not (regexMatch "^[1-9][0-9]{0,4}$" $port)) (lt (int $port) 1) (gt (int $port) 65535) }}
{{- fail "elector-sidecar: a port in redis.url is not a number 1..65535, so the Redis ports for a NetworkPolicy cannot be derived" }}
{{- end }}
{{- $ports = append $ports (printf "%05d" (int $port)) }}
{{- end }}
{{- if $sentinel }}
{{- if not .sentinelMasterPorts }}
{{- fail "elector-sidecar: redis.url is a Sentinel URL: the sentinels' ports come from it, but the port of the master they name does not; list it in sentinelMasterPorts (helm/elector: networkPolicy.egress.sentinelMasterPorts, e.g. [6379])" }}
{{- end }}
{{- range .sentinelMasterPorts }}
{{- if or (not (regexMatch "^[1-9][0-9]{0,4}$" (toString .))) (lt (int .) 1) (gt (int .) 65535) }}
{{- fail "elector-sidecar: sentinelMasterPorts must be port numbers 1..65535" }}
{{- end }}
{{- $ports = append $ports (printf "%05d" (int .)) }}
{{- end }}
{{- end }}
{{- $sorted := list }}
{{- range $ports | uniq | sortAlpha }}{{ $sorted = append $sorted (regexReplaceAll "^0+" . "" | int) }}{{ end }}
{{- $sorted | join "," }}
{{- end }}
{{- end }}

{{/*
elector-sidecar.redisEgressPorts: the ports of elector-sidecar.redisPorts as items of a NetworkPolicy egress
rule's `ports` (TCP); nothing for unix://. Takes the same dict (with "sentinelMasterPorts" for Sentinel).
*/}}
{{- define "elector-sidecar.redisEgressPorts" -}}
{{- $ports := include "elector-sidecar.redisPorts" . }}
{{- if $ports }}
{{- range splitList "," $ports }}
- port: {{ int . }}
  protocol: TCP
{{- end }}
{{- end }}
{{- end }}
