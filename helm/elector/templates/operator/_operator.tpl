{{/* The operator's resource name. */}}
{{- define "elector.operator.fullname" -}}
{{- printf "%s-operator" (include "elector.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels selecting the operator's pods. */}}
{{- define "elector.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elector.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The namespaces it watches: operator.namespaces, else the release's. */}}
{{- define "elector.operator.namespaces" -}}
{{- if .Values.operator.namespaces }}{{ join "," .Values.operator.namespaces }}{{ else }}{{ .Release.Namespace }}{{ end }}
{{- end }}

{{/* The Redis of the operator's own lease and its password Secret (defaults: elector.redis). */}}
{{- define "elector.operator.redisUrl" -}}
{{- default .Values.elector.redis.url .Values.operator.redis.url }}
{{- end }}
{{- define "elector.operator.redisSecret" -}}
{{- if .Values.operator.redis.url }}{{ .Values.operator.redis.existingSecret }}{{ else }}{{ .Values.elector.redis.existingSecret }}{{ end }}
{{- end }}
{{- define "elector.operator.redisSecretKey" -}}
{{- if .Values.operator.redis.url }}{{ .Values.operator.redis.existingSecretPasswordKey }}{{ else }}{{ .Values.elector.redis.existingSecretPasswordKey }}{{ end }}
{{- end }}
