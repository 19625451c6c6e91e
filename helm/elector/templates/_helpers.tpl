{{/*
Names, labels and small helpers of the example chart. Every helper takes the chart's root context (`.`).
The sidecar's templates are the elector-sidecar library's (a dependency of this chart): this chart
passes them its `elector:` values explicitly, like any chart that includes the sidecar.
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
app.kubernetes.io/version: {{ .Values.elector.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
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

{{/*
The `elector:` values as given to the library (YAML): Helm deletes a key set to null from this chart's
values, so a securityContext field of the library's defaults that `elector.securityContext` lacks is passed
as an explicit null, which the library leaves out (runAsUser: null for OpenShift's restricted SCC).
*/}}
{{- define "elector.sidecarInput" -}}
{{- $given := deepCopy .Values.elector }}
{{- $defaults := include "elector-sidecar.defaults" . | fromYaml }}
{{- if kindIs "map" $given.securityContext }}
{{- $context := $given.securityContext }}
{{- range $key, $_ := $defaults.securityContext }}
{{- if not (hasKey $context $key) }}{{ $_ := set $context $key nil }}{{ end }}
{{- end }}
{{- end }}
{{- toYaml $given }}
{{- end }}

{{/* The sidecar's merged and checked values (the library's defaults under `elector:`), as YAML. */}}
{{- define "elector.sidecarValues" -}}
{{- include "elector-sidecar.values" (dict "values" (include "elector.sidecarInput" . | fromYaml) "context" .) }}
{{- end }}

{{/* The lock name: the library's (elector.lock templated, else "<namespace>/<full name>"). */}}
{{- define "elector.lock" -}}
{{- include "elector-sidecar.lock" (dict "values" (include "elector.sidecarInput" . | fromYaml) "context" .) }}
{{- end }}

{{/*
The application image: [registry/]repository:tag, where registry is global.imageRegistry, else
workload.image.registry, except that a repository naming its own registry (its first part has a "." or
":" or is localhost, as Docker reads it: ghcr.io/acme/orders) keeps it when global.imageRegistry is empty.
So a repository written for chart 0.1.0 (no `registry` key) still pulls from where it did.
*/}}
{{- define "elector.workloadImage" -}}
{{- $image := .Values.workload.image }}
{{- $global := (.Values.global | default dict).imageRegistry }}
{{- $repository := $image.repository }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- $ownRegistry := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $registry := $image.registry }}
{{- if $global }}
{{- $registry = $global }}
{{- if $ownRegistry }}{{ $repository = rest $parts | join "/" }}{{ end }}
{{- else if $ownRegistry }}
{{- $registry = "" }}
{{- end }}
{{- if $registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}{{ end }}
{{- printf "%s:%s" $repository (toString $image.tag) }}
{{- end }}

{{/* True when the monitoring.coreos.com/v1 API is served (or a monitoring object is forced). */}}
{{- define "elector.monitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* Checks of value combinations the schema cannot express; called from the workload template. */}}
{{- define "elector.validate" -}}
{{- if .Values.workload.enabled }}
{{- $sidecar := include "elector.sidecarValues" . | fromYaml }}
{{- if lt (int .Values.workload.terminationGracePeriodSeconds) (add (int $sidecar.preStopSleepSeconds) (int ($sidecar.shutdownLingerSeconds | default 0)) 10 | int) }}
{{- fail "workload.terminationGracePeriodSeconds must be at least elector.preStopSleepSeconds + elector.shutdownLingerSeconds + 10, so the leader drains its work, releases the lease and is scraped once more before it is killed" }}
{{- end }}
{{- include "elector.pdb.validate" (dict "root" . "gate" $sidecar.gateOnLeadership) }}
{{- end }}
{{- end }}

{{/*
The PodDisruptionBudget's checks. Kubernetes allows an eviction while (healthy pods - desired healthy) >= 1,
where desired is minAvailable, or replicas - maxUnavailable (percentages of the replicas, rounded up). A
budget whose desired count is at least the number of pods that can ever be ready at once never allows one:
every node drain would block. Without gateOnLeadership that number is the replicas; with it, only the
leader is ready, so desired must be 0 (unready followers are evicted through unhealthyPodEvictionPolicy).
*/}}
{{- define "elector.pdb.validate" -}}
{{- $root := .root }}
{{- $pdb := $root.Values.podDisruptionBudget }}
{{- if $pdb.enabled }}
{{- $min := toString $pdb.minAvailable }}
{{- $max := toString $pdb.maxUnavailable }}
{{- if and (ne $min "") (ne $max "") }}
{{- fail "podDisruptionBudget: set only one of minAvailable and maxUnavailable" }}
{{- end }}
{{- if and (eq $min "") (eq $max "") }}
{{- fail "podDisruptionBudget: set one of minAvailable and maxUnavailable (or enabled: false)" }}
{{- end }}
{{- $replicas := int $root.Values.workload.replicaCount }}
{{- if gt $replicas 0 }}
{{- $desired := 0 }}
{{- if ne $min "" }}
{{- $desired = include "elector.pdb.scaled" (dict "value" $min "replicas" $replicas) | int }}
{{- else }}
{{- $desired = sub $replicas (include "elector.pdb.scaled" (dict "value" $max "replicas" $replicas) | int) | int }}
{{- end }}
{{- $setting := ternary (printf "minAvailable %s" $min) (printf "maxUnavailable %s" $max) (ne $min "") }}
{{- if eq (toString .gate) "true" }}
{{- if gt $desired 0 }}
{{- fail (printf "podDisruptionBudget: with elector.gateOnLeadership only the leader is ready, so %s (of %d replicas) never allows evicting it and a drain of its node would block; set podDisruptionBudget.minAvailable: 0 (and maxUnavailable empty) or maxUnavailable: 100%%, or podDisruptionBudget.enabled: false (unready followers stay evictable through unhealthyPodEvictionPolicy AlwaysAllow)" $setting $replicas) }}
{{- end }}
{{- else if ge $desired $replicas }}
{{- fail (printf "podDisruptionBudget: %s with %d replicas never allows an eviction, so every node drain would block; allow one pod at least (e.g. maxUnavailable: 1), or podDisruptionBudget.enabled: false" $setting $replicas) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* An int-or-percent of a PDB scaled to the replicas, rounded up as Kubernetes does. */}}
{{- define "elector.pdb.scaled" -}}
{{- $value := toString .value }}
{{- if hasSuffix "%" $value }}
{{- ceil (divf (mulf (float64 (trimSuffix "%" $value)) .replicas) 100) | int }}
{{- else }}
{{- int $value }}
{{- end }}
{{- end }}

{{/*
Operator: its Deployment, RBAC and the LeaderElection CRD are the elector-operator chart's
(helm/elector-operator); this chart renders only the example workload's LeaderElection.
*/}}

{{/*
"true" when the LeaderElection for the example workload renders: leaderElection.enabled true, or auto with
the LeaderElection API served (the elector-operator chart's CRD is installed).
*/}}
{{- define "elector.leaderElection.enabled" -}}
{{- $mode := toString .Values.leaderElection.enabled }}
{{- if and .Values.workload.enabled (or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "elector.io/v1alpha1"))) }}true{{ end }}
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
{{- end }}

{{/*
checkov's inline skips of the example Deployment (annotations checkov.io/skipN: ID=reason), each with why
the chart does it on purpose; tests/helm/test_checkov.py runs checkov over every ci value set.
*/}}
{{- define "elector.checkovSkips" -}}
checkov.io/skip1: "CKV_K8S_11=No CPU limit on purpose: CFS throttling of the sidecar can hold a lease renewal past its deadline; CPU requests are set (elector.resources)"
checkov.io/skip2: "CKV_K8S_15=pullPolicy IfNotPresent: release tags are immutable; pin elector.image.digest, or set pullPolicy Always"
checkov.io/skip3: "CKV_K8S_43=The default images are release tags (the chart's appVersion); elector.image.digest pins the sidecar by digest, workload.image is your application's"
checkov.io/skip4: "CKV_K8S_8=The example app container (pause) serves nothing to probe; your application brings its own probes; the sidecar has a liveness probe"
checkov.io/skip5: "CKV_K8S_9=The example app container (pause) serves nothing to probe; the sidecar has a readiness probe"
{{- end }}
