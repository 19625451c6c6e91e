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
  gateOnLeadership  override of readiness.gateOnLeadership
  resources         override of sidecar.resources
  extraEnv          more EnvVars, appended to sidecar.extraEnv
*/}}

{{/* The context whose values configure the sidecar: the root, or its `elector` subchart. */}}
{{- define "elector.sidecarContext" -}}
{{- $root := .root }}
{{- if and (ne $root.Chart.Name "elector") $root.Subcharts (hasKey $root.Subcharts "elector") }}subchart{{ else }}root{{ end }}
{{- end }}

{{- define "elector.sidecar" -}}
{{- $ctx := .root }}
{{- if eq (include "elector.sidecarContext" .) "subchart" }}
{{- $ctx = index .root.Subcharts "elector" }}
{{- end }}
{{- $v := $ctx.Values }}
{{- $gate := $v.readiness.gateOnLeadership }}
{{- if hasKey . "gateOnLeadership" }}{{ $gate = .gateOnLeadership }}{{ end -}}
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
  {{- if $v.elector.redis.existingSecret }}
  volumeMounts:
    - name: elector-redis-password
      mountPath: /etc/elector/redis
      readOnly: true
  {{- end }}
{{- end }}

{{/*
elector.sidecarVolumes: the volumes the sidecar mounts, as items of a pod's `volumes` list (the Redis
password Secret, when elector.redis.existingSecret is set); renders nothing otherwise.
*/}}
{{- define "elector.sidecarVolumes" -}}
{{- $ctx := .root }}
{{- if eq (include "elector.sidecarContext" .) "subchart" }}
{{- $ctx = index .root.Subcharts "elector" }}
{{- end }}
{{- with $ctx.Values.elector.redis.existingSecret -}}
- name: elector-redis-password
  secret:
    secretName: {{ . }}
    defaultMode: 0444
    items:
      - key: {{ $ctx.Values.elector.redis.existingSecretPasswordKey }}
        path: password
{{- end }}
{{- end }}
