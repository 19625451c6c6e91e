{{/*
Names, labels and small helpers. Every helper takes the chart's root context (`.`), or a subchart's
context when the elector chart is a dependency of another chart.
*/}}

{{/* Chart name, or nameOverride. */}}
{{- define "elector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else "<release>-<name>" (just "<release>" when it already contains the
name). Truncated to 63 characters, the limit of DNS labels.
*/}}
{{- define "elector.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "elector.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels of every object. */}}
{{- define "elector.labels" -}}
helm.sh/chart: {{ include "elector.chart" . }}
{{ include "elector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the example workload's pods (immutable in a Deployment's selector). */}}
{{- define "elector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the workload runs as. */}}
{{- define "elector.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elector.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The elector image: repository@digest, else repository:tag (tag defaults to the appVersion). */}}
{{- define "elector.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The lock name: elector.lock, else the full name. */}}
{{- define "elector.lock" -}}
{{- default (include "elector.fullname" .) .Values.elector.lock }}
{{- end }}

{{/* True when the monitoring.coreos.com/v1 API is served (or a monitoring object is forced). */}}
{{- define "elector.monitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* Checks of value combinations the schema cannot express; called from the workload template. */}}
{{- define "elector.validate" -}}
{{- if and .Values.podDisruptionBudget.enabled (ne (toString .Values.podDisruptionBudget.minAvailable) "") (ne (toString .Values.podDisruptionBudget.maxUnavailable) "") }}
{{- fail "podDisruptionBudget: set only one of minAvailable and maxUnavailable" }}
{{- end }}
{{- if lt (int .Values.workload.terminationGracePeriodSeconds) (add (int .Values.sidecar.preStopSleepSeconds) (int (.Values.sidecar.shutdownLingerSeconds | default 0)) 10 | int) }}
{{- fail "workload.terminationGracePeriodSeconds must be at least sidecar.preStopSleepSeconds + sidecar.shutdownLingerSeconds + 10, so the leader drains its work, releases the lease and is scraped once more before it is killed" }}
{{- end }}
{{- end }}

{{/*
Operator: its Deployment, ServiceAccount and RBAC are under templates/operator/, rendered only with
operator.enabled; the LeaderElection CRD is in crds/.
*/}}

{{/*
"true" when the LeaderElection for the example workload renders: leaderElection.enabled true, or auto with
this release's operator (Helm values cannot default on each other; a template can).
*/}}
{{- define "elector.leaderElection.enabled" -}}
{{- $mode := toString .Values.leaderElection.enabled }}
{{- if and .Values.workload.enabled (or (eq $mode "true") (and (eq $mode "auto") .Values.operator.enabled)) }}true{{ end }}
{{- end }}

{{/*
Checks of the LeaderElection the schema cannot express (it is read by the operator's pod, not the sidecar).
Messages name the setting and never print the URL, which may hold a password.
*/}}
{{- define "elector.leaderElection.validate" -}}
{{- $url := .Values.elector.redis.url }}
{{- $scheme := splitList "://" $url | first }}
{{- $authority := splitList "://" $url | last | splitList "/" | first }}
{{- if eq $scheme "unix" }}
{{- fail "leaderElection: elector.redis.url is a unix:// socket, which the operator's pod cannot reach; use a TCP URL, or set leaderElection.enabled=false" }}
{{- end }}
{{- if contains "@" $authority }}
{{- fail "leaderElection: elector.redis.url holds credentials, which the LeaderElection refuses (anyone who may read it would see them); put the password in the Secret elector.redis.existingSecret" }}
{{- end }}
{{- if and .Values.operator.enabled (not .Values.operator.clusterWide) .Values.operator.namespaces (not (has .Release.Namespace .Values.operator.namespaces)) (ne (toString .Values.leaderElection.enabled) "true") }}
{{- fail (printf "leaderElection: operator.namespaces does not include the release namespace %s, so this release's operator would never see its LeaderElection; add it, or set leaderElection.enabled=false" .Release.Namespace) }}
{{- end }}
{{- end }}
