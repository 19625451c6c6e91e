{{/*
Names, labels and checks of the elector-operator chart. Every helper takes the chart's root context (`.`).
*/}}

{{/* Chart name, or nameOverride. */}}
{{- define "elector-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else "<release>-<name>" (just "<release>" when it already contains the
name). Truncated to 63 characters, the limit of DNS labels.
*/}}
{{- define "elector-operator.fullname" -}}
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

{{/* "<full name>-<suffix>", at most 63 characters. Call with (list $ "suffix"). */}}
{{- define "elector-operator.suffixed" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "elector-operator.fullname" $root | trunc (int (sub 62 (len (index . 1))))) (index . 1) | trimSuffix "-" }}
{{- end }}

{{/* Standard labels of every object. */}}
{{- define "elector-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "elector-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: elector
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the operator's pods (immutable in a Deployment's selector). */}}
{{- define "elector-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elector-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "elector-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elector-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: name the existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from (dict "image" <registry/repository/tag/digest> "root" $): [registry/]repository,
then @digest, else :tag (tag defaults to the appVersion). The registry is global.imageRegistry, else
image.registry; a repository that names its own registry (its first part has a "." or ":" or is
localhost, as Docker reads it) keeps it unless global.imageRegistry replaces it.
*/}}
{{- define "elector-operator.imageRef" -}}
{{- $root := .root }}
{{- $repository := .image.repository }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- $ownRegistry := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $registry := .image.registry | default "" }}
{{- $global := ($root.Values.global | default dict).imageRegistry }}
{{- if $global }}
{{- $registry = $global }}
{{- if $ownRegistry }}{{ $repository = rest $parts | join "/" }}{{ end }}
{{- else if $ownRegistry }}
{{- $registry = "" }}
{{- end }}
{{- if $registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}{{ end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.image.tag | default $root.Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The operator's image. */}}
{{- define "elector-operator.image" -}}
{{- include "elector-operator.imageRef" (dict "image" .Values.image "root" .) }}
{{- end }}

{{/*
imagePullSecrets of a pod: global.imagePullSecrets, then imagePullSecrets (names, or {name: ...}), each
name once (YAML, or nothing).
*/}}
{{- define "elector-operator.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) }}
{{- $name := "" }}
{{- if kindIs "map" . }}{{ $name = toString (.name | default "") }}{{ else }}{{ $name = toString . }}{{ end }}
{{- if and $name (not (has $name $names)) }}{{ $names = append $names $name }}{{ end }}
{{- end }}
{{- with $names }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The operator replicas' own lock: lock, else "elector-operator/<release namespace>/<release name>". One
release's replicas share it; another release (another team's operator, for other namespaces) has its own.
*/}}
{{- define "elector-operator.lock" -}}
{{- .Values.lock | default (printf "elector-operator/%s/%s" .Release.Namespace .Release.Name) }}
{{- end }}

{{/* The namespaces it watches, comma-separated: namespaces, else the release's. */}}
{{- define "elector-operator.namespaces" -}}
{{- if .Values.namespaces }}{{ join "," .Values.namespaces }}{{ else }}{{ .Release.Namespace }}{{ end }}
{{- end }}

{{/* The scheme of redis.url ("redis", "rediss", "rediss+sentinel", ...). */}}
{{- define "elector-operator.redisScheme" -}}
{{- splitList "://" .Values.redis.url | first }}
{{- end }}

{{/*
Checks of value combinations the schema cannot express. Messages name the setting and never print the
URL, which may hold a password.
*/}}
{{- define "elector-operator.validate" -}}
{{- $authority := splitList "://" .Values.redis.url | last | splitList "/" | first }}
{{- if contains "@" $authority }}
{{- fail "redis.url holds credentials, which would land in a plain environment variable; put the password in the Secret named by redis.existingSecret" }}
{{- end }}
{{- $tls := .Values.redis.tls }}
{{- if $tls.existingSecret }}
{{- $scheme := include "elector-operator.redisScheme" . }}
{{- if not (has $scheme (list "rediss" "rediss+sentinel")) }}
{{- fail (printf "redis.tls.existingSecret needs a rediss:// or rediss+sentinel:// redis.url (got a %s:// URL)" $scheme) }}
{{- end }}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) }}
{{- fail "redis.tls: set certKey and keyKey together (a client certificate needs its key), or both empty" }}
{{- end }}
{{- if and (empty $tls.caKey) (empty $tls.certKey) }}
{{- fail "redis.tls.existingSecret is set but caKey, certKey and keyKey are all empty: nothing to mount" }}
{{- end }}
{{- end }}
{{- /* The NetworkPolicy must let the operator reach the Redis of its own lease (each host of a Sentinel URL). */}}
{{- if and .Values.networkPolicy.enabled (ne (include "elector-operator.redisScheme" .) "unix") }}
{{- $defaultPort := ternary "26379" "6379" (contains "sentinel" (include "elector-operator.redisScheme" .)) }}
{{- range splitList "," $authority }}
{{- $hostPort := regexReplaceAll "^\\[[^\\]]*\\]" . "" | splitList ":" }}
{{- $port := ternary $defaultPort (last $hostPort) (eq (len $hostPort) 1) }}
{{- $ports := list }}
{{- range $.Values.networkPolicy.redis.ports }}{{ $ports = append $ports (toString (int .)) }}{{ end }}
{{- if not (has $port $ports) }}
{{- fail (printf "networkPolicy.redis.ports has no %s, the port of redis.url: the operator could not reach the Redis of its own lease; add it (or set networkPolicy.enabled false)" $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.podDisruptionBudget.enabled }}
{{- $min := toString .Values.podDisruptionBudget.minAvailable }}
{{- $max := toString .Values.podDisruptionBudget.maxUnavailable }}
{{- if and (ne $min "") (ne $max "") }}
{{- fail "podDisruptionBudget: set only one of minAvailable and maxUnavailable" }}
{{- end }}
{{- if and (eq $min "") (eq $max "") }}
{{- fail "podDisruptionBudget: set one of minAvailable and maxUnavailable" }}
{{- end }}
{{- if has $max (list "0" "0%") }}
{{- fail "podDisruptionBudget.maxUnavailable 0 never allows an eviction, so every node drain blocks; use 1 (or disable the PodDisruptionBudget)" }}
{{- end }}
{{- if or (eq $min "100%") (and (regexMatch "^[0-9]+$" $min) (ge (atoi $min) (int .Values.replicas))) }}
{{- fail (printf "podDisruptionBudget.minAvailable %s with %d replicas never allows an eviction, so every node drain blocks; use at most replicas - 1, or maxUnavailable 1" $min (int .Values.replicas)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the ValidatingAdmissionPolicy renders: enabled, and the cluster serves the v1 API (>= 1.30). */}}
{{- define "elector-operator.admissionPolicy.enabled" -}}
{{- if and .Values.admissionPolicy.enabled (or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version)) }}true{{ end }}
{{- end }}

{{/*
checkov's inline skips of the operator's Deployment and the pre-delete Job (annotations checkov.io/skipN:
ID=reason), each with why the chart does it on purpose; tests/helm/test_checkov.py runs checkov over every
ci value set.
*/}}
{{- define "elector-operator.checkovSkips" -}}
checkov.io/skip1: "CKV_K8S_11=No CPU limit on purpose: CFS throttling can hold the operator's own lease renewal past its deadline; CPU requests are set"
checkov.io/skip2: "CKV_K8S_15=pullPolicy IfNotPresent: release tags are immutable; pin image.digest, or set image.pullPolicy Always"
checkov.io/skip3: "CKV_K8S_43=The default image is a release tag (the chart's appVersion); image.digest pins it by digest"
checkov.io/skip4: "CKV_K8S_38=It talks to the Kubernetes API (LeaderElections, pods, Leases, Events): it needs its ServiceAccount token"
checkov.io/skip5: "CKV_K8S_40=No fixed UID on purpose: the image runs as UID 10001, and OpenShift's restricted SCC assigns one from the namespace's range; set securityContext.runAsUser to pin one"
{{- end }}

{{/*
checkov's skip of CKV2_K8S_6 (pods without a NetworkPolicy): the operator's pods have one unless
networkPolicy.enabled is false; the pre-delete hook's Job (a pod for the length of `helm uninstall`) has none.
Call with (list $ "deployment") or (list $ "job").
*/}}
{{- define "elector-operator.checkovNetworkPolicySkip" -}}
{{- $root := index . 0 }}
{{- if eq (index . 1) "job" }}
checkov.io/skip6: "CKV2_K8S_6=The pre-delete hook's Job lives for the length of helm uninstall and only talks to the API server; its ServiceAccount may do nothing else"
{{- else if not $root.Values.networkPolicy.enabled }}
checkov.io/skip6: "CKV2_K8S_6=networkPolicy.enabled is false: the operator reaches the API server and every Redis the LeaderElections name; add a NetworkPolicy of your own"
{{- end }}
{{- end }}
