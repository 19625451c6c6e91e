{{/*
How every template of this library is called: with a dict

  values     the sidecar's values (any key of the including chart, e.g. .Values.leader); merged over
             elector-sidecar.defaults, so an empty dict or a missing key is fine
  context    the including chart's root context `$` (release, chart name, Capabilities, global values)
  overrides  optional: values merged over `values` for this one include (e.g. dict "priority" 10 for the
             preferred one of two Deployments on one lock)
  podPorts   optional, elector-sidecar.container: the ports of the pod's other containers (numbers, or
             their `ports` items); the render fails when the sidecar's port is one of them

Messages of `fail` name the setting as "elector-sidecar: <key>" and never print the Redis URL.
*/}}

{{/*
elector-sidecar.values: the merged, checked values as YAML (`include ... | fromYaml`). Other templates of the
library and the including chart read settings through it (port, redis.url, gateOnLeadership...).
*/}}
{{- define "elector-sidecar.values" -}}
{{- if not (kindIs "map" .) }}
{{- fail "elector-sidecar: call the templates with a dict: (dict \"values\" .Values.<key> \"context\" $)" }}
{{- end }}
{{- if not .context }}
{{- fail "elector-sidecar: the dict needs \"context\" (the root context $)" }}
{{- end }}
{{- $defaults := include "elector-sidecar.defaults" . | fromYaml }}
{{- $merged := include "elector-sidecar.defaults" . | fromYaml }}
{{- range $given := list (.values | default dict) (.overrides | default dict) }}
{{- if not (kindIs "map" $given) }}
{{- fail "elector-sidecar: values and overrides must be maps" }}
{{- end }}
{{- include "elector-sidecar.checkKeys" (dict "given" $given "known" $defaults "path" "") }}
{{- include "elector-sidecar.mergeInto" (dict "base" $merged "over" $given) }}
{{- end }}
{{- $_ := unset $merged "global" }}
{{- include "elector-sidecar.validate" $merged }}
{{- toYaml $merged }}
{{- end }}

{{/* Merges .over into .base in place: maps key by key, anything else (lists, "", 0, false) replaces. */}}
{{- define "elector-sidecar.mergeInto" -}}
{{- $base := .base }}
{{- range $key, $value := .over }}
{{- $current := index $base $key }}
{{- if and (kindIs "map" $value) (kindIs "map" $current) }}
{{- include "elector-sidecar.mergeInto" (dict "base" $current "over" $value) }}
{{- else if kindIs "invalid" $value }}
{{- $_ := unset $base $key }}
{{- else }}
{{- $_ := set $base $key (deepCopy $value) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Fails on keys the defaults do not have (a typo would otherwise be ignored); `global` is Helm's. */}}
{{- define "elector-sidecar.checkKeys" -}}
{{- $known := .known }}
{{- $path := .path }}
{{- $freeForm := include "elector-sidecar.freeFormKeys" . | splitList " " }}
{{- range $key, $value := .given }}
{{- if and (not (hasKey $known $key)) (not (and (eq $path "") (eq $key "global"))) }}
{{- fail (printf "elector-sidecar: unknown value %s%s (the keys are those of elector-sidecar.defaults: %s)" $path $key (keys $known | sortAlpha | join ", ")) }}
{{- end }}
{{- $default := index $known $key }}
{{- if and (kindIs "map" $default) (kindIs "map" $value) (not (and (eq $path "") (has $key $freeForm))) }}
{{- include "elector-sidecar.checkKeys" (dict "given" $value "known" $default "path" (printf "%s%s." $path $key)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Checks of the merged values (the including chart may have no schema for them). */}}
{{- define "elector-sidecar.validate" -}}
{{- $v := . }}
{{- $duration := "^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$" }}
{{- $url := toString $v.redis.url }}
{{- $scheme := include "elector-sidecar.redisScheme" $url }}
{{- if not (has $scheme (list "redis" "rediss" "unix" "redis+sentinel" "rediss+sentinel")) }}
{{- fail "elector-sidecar: redis.url must start with redis://, rediss://, unix://, redis+sentinel:// or rediss+sentinel://" }}
{{- end }}
{{- if ne $scheme "unix" }}
{{- $authority := include "elector-sidecar.redisAuthority" $url }}
{{- if and (contains "@" $authority) (contains ":" (splitList "@" $authority | initial | join "@")) }}
{{- fail "elector-sidecar: redis.url holds a password, which would sit in a plain environment variable; put the password in a Secret and name it in redis.existingSecret (key redis.existingSecretPasswordKey)" }}
{{- end }}
{{- end }}
{{- if not (regexMatch $duration (toString $v.ttl)) }}
{{- fail "elector-sidecar: ttl must be a duration such as 10s, 1m30s or 500ms" }}
{{- end }}
{{- if le (include "elector-sidecar.durationMs" $v.ttl | int) 0 }}
{{- fail "elector-sidecar: ttl must be more than 0" }}
{{- end }}
{{- range $key := list "renewInterval" "renewDeadline" "requestTimeout" "replicasAckTimeout" }}
{{- $value := toString (index $v $key | default "") }}
{{- if and $value (not (regexMatch $duration $value)) }}
{{- fail (printf "elector-sidecar: %s must be empty or a duration such as 2s or 300ms" $key) }}
{{- end }}
{{- end }}
{{- if not (has (toString $v.bindAddress) (list "0.0.0.0" "::")) }}
{{- fail "elector-sidecar: bindAddress must be 0.0.0.0 or :: (the kubelet probes and Prometheus reach the pod's IP)" }}
{{- end }}
{{- if or (lt (int $v.port) 1) (gt (int $v.port) 65535) }}
{{- fail "elector-sidecar: port must be 1..65535" }}
{{- end }}
{{- $compat := $v.leaderElectorCompat | default dict }}
{{- if $compat.enabled }}
{{- if or (lt (int $compat.port) 1) (gt (int $compat.port) 65535) }}
{{- fail "elector-sidecar: leaderElectorCompat.port must be 1..65535" }}
{{- end }}
{{- if eq (int $compat.port) (int $v.port) }}
{{- fail (printf "elector-sidecar: leaderElectorCompat.port and port are both %d; the two listeners need two ports" (int $v.port)) }}
{{- end }}
{{- end }}
{{- if not (has (toString $compat.api) (list "leader-elector" "nais")) }}
{{- fail "elector-sidecar: leaderElectorCompat.api must be leader-elector or nais" }}
{{- end }}
{{- if and $compat.identityFromHostname (not $compat.enabled) }}
{{- fail "elector-sidecar: leaderElectorCompat.identityFromHostname needs leaderElectorCompat.enabled (the host name is the identity the listener reports)" }}
{{- end }}
{{- $app := $v.appHealth | default dict }}
{{- with $app.url }}
{{- if not (regexMatch "^https?://[^/?#@\\s]+(/[^\\s#]*)?$" (toString .)) }}
{{- fail "elector-sidecar: appHealth.url must be an http:// or https:// URL such as http://127.0.0.1:8080/healthz" }}
{{- end }}
{{- end }}
{{- range $key := list "interval" "timeout" "minTerm" }}
{{- $value := toString (index $app $key | default "") }}
{{- if and $value (not (regexMatch $duration $value)) }}
{{- fail (printf "elector-sidecar: appHealth.%s must be empty or a duration such as 1s or 500ms" $key) }}
{{- end }}
{{- end }}
{{- if or (lt (int ($app.failures | default 0)) 0) (gt (int ($app.failures | default 0)) 100) }}
{{- fail "elector-sidecar: appHealth.failures must be 0 (the daemon's default) to 100" }}
{{- end }}
{{- if and (eq (toString $v.gateOnLeadership) "true") (eq (toString $v.gateOnRedis) "true") }}
{{- fail "elector-sidecar: gateOnLeadership and gateOnRedis are both true; pick one readiness (gateOnLeadership: only the leader is ready; gateOnRedis: ready while Redis is reached)" }}
{{- end }}
{{- $tls := $v.redis.tls | default dict }}
{{- if $tls.existingSecret }}
{{- if not (has $scheme (list "rediss" "rediss+sentinel")) }}
{{- fail (printf "elector-sidecar: redis.tls.existingSecret needs a rediss:// or rediss+sentinel:// redis.url (got a %s:// URL)" $scheme) }}
{{- end }}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) }}
{{- fail "elector-sidecar: redis.tls: set certKey and keyKey together (a client certificate needs its key), or both empty" }}
{{- end }}
{{- if and (empty $tls.caKey) (empty $tls.certKey) }}
{{- fail "elector-sidecar: redis.tls.existingSecret is set but caKey, certKey and keyKey are all empty: nothing to mount" }}
{{- end }}
{{- end }}
{{- if and $v.replicasAckTimeout (lt (int ($v.minReplicasAck | default 0)) 1) }}
{{- fail "elector-sidecar: replicasAckTimeout only applies with minReplicasAck 1 or more (the daemon refuses it otherwise)" }}
{{- end }}
{{- with $v.leaderFile }}
{{- if not (regexMatch "^(/[A-Za-z0-9._-]+)+/[A-Za-z0-9._{}-]+$" .) }}
{{- fail "elector-sidecar: leaderFile must be an absolute path below a directory, e.g. /var/run/elector/leader.json" }}
{{- end }}
{{- if has (dir .) (list "/etc/elector/redis" "/etc/elector/redis-tls") }}
{{- fail (printf "elector-sidecar: leaderFile %s: its directory is where the sidecar mounts a Secret; pick another, e.g. /var/run/elector/leader.json" .) }}
{{- end }}
{{- end }}
{{- range $v.extraEnv | default list }}
{{- if eq (toString .name) "ELECTOR_HTTP_ADDRESS" }}
{{- fail "elector-sidecar: extraEnv must not set ELECTOR_HTTP_ADDRESS: set port and bindAddress, which the probes, the port and ELECTOR_LEADER_URL follow" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The scheme of a Redis URL, lower case ("" without "://"). */}}
{{- define "elector-sidecar.redisScheme" -}}
{{- if contains "://" . }}{{ splitList "://" . | first | lower }}{{ end }}
{{- end }}

{{/* The authority of a Redis URL: what lies between "://" and the next "/". */}}
{{- define "elector-sidecar.redisAuthority" -}}
{{- $rest := splitList "://" . | rest | join "://" }}
{{- splitList "/" $rest | first }}
{{- end }}

{{/* A Go duration ("10s", "1m30s", "500ms", "1.5s") in whole milliseconds. */}}
{{- define "elector-sidecar.durationMs" -}}
{{- $total := 0.0 }}
{{- $factor := dict "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" (toString .) -1 }}
{{- $unit := regexFind "(ms|s|m|h)$" . }}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get $factor $unit)) }}
{{- end }}
{{- $total | floor | int }}
{{- end }}

{{/*
elector-sidecar.lock: the lock. values.lock rendered as a template (it may use .Release.Namespace), else
"<namespace>/<full name>" of the including chart, so that releases in two namespaces never share a leader.
Fails when the result is empty or not a lock name the daemon takes. Takes the include dict.
*/}}
{{- define "elector-sidecar.lock" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $ctx := .context }}
{{- $lock := "" }}
{{- if ne (toString ($v.lock | default "")) "" }}
{{- $lock = tpl (toString $v.lock) $ctx | trim }}
{{- if eq $lock "" }}
{{- fail "elector-sidecar: lock is empty after templating; leave it \"\" for the default <namespace>/<full name>, or give a template that yields a name" }}
{{- end }}
{{- else }}
{{- $lock = printf "%s/%s" $ctx.Release.Namespace (include "elector-sidecar.fullname" $ctx) }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$" $lock) }}
{{- fail (printf "elector-sidecar: lock %q is not a lock name: 1-200 characters, letters, digits and . _ : / @ -, starting with a letter or digit" $lock) }}
{{- end }}
{{- $lock }}
{{- end }}

{{/*
elector-sidecar.predecessorLock: the lock's previous name (see the `predecessorLock` default), or "" for none.
"auto" is chart 0.1.0's default lock name when `lock` is empty: the elector chart's full name, which in a
chart that included the 0.1.0 sidecar as a dependency was the `elector` subchart's ("<release>-elector", or the
release name when it contains "elector"). Fails when the name is not a lock name or is the lock itself.
*/}}
{{- define "elector-sidecar.predecessorLock" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $ctx := .context }}
{{- $given := toString ($v.predecessorLock | default "") }}
{{- $name := "" }}
{{- if eq $given "auto" }}
{{- if eq (toString ($v.lock | default "")) "" }}
{{- if eq $ctx.Chart.Name "elector" }}
{{- $name = include "elector-sidecar.fullname" $ctx }}
{{- else if contains "elector" $ctx.Release.Name }}
{{- $name = $ctx.Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name = printf "%s-elector" $ctx.Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- else if ne $given "" }}
{{- $name = tpl $given $ctx | trim }}
{{- end }}
{{- if $name }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$" $name) }}
{{- fail (printf "elector-sidecar: predecessorLock %q is not a lock name: 1-200 characters, letters, digits and . _ : / @ -, starting with a letter or digit" $name) }}
{{- end }}
{{- if eq $name (include "elector-sidecar.lock" .) }}
{{- fail (printf "elector-sidecar: predecessorLock %q is the lock itself; name the lock the previous release used, or \"\" for none" $name) }}
{{- end }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The including chart's usual full name (fullnameOverride, else "<release>-<name>", at most 63). */}}
{{- define "elector-sidecar.fullname" -}}
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

{{/*
elector-sidecar.image: the image reference: [registry/]repository then @digest, else :tag (default: the
library's appVersion). global.imageRegistry of the including chart replaces image.registry; a repository
that names its own registry (ghcr.io/elector-dev/elector, as chart 0.1.0's image.repository) keeps it
unless global.imageRegistry replaces it.
*/}}
{{- define "elector-sidecar.image" -}}
{{- $v := include "elector-sidecar.values" . | fromYaml }}
{{- $global := (.context.Values.global | default dict).imageRegistry }}
{{- $repository := $v.image.repository }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- $ownRegistry := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $registry := $v.image.registry }}
{{- if $global }}
{{- $registry = $global }}
{{- if $ownRegistry }}{{ $repository = rest $parts | join "/" }}{{ end }}
{{- else if $ownRegistry }}
{{- $registry = "" }}
{{- end }}
{{- if $registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}{{ end }}
{{- if $v.image.digest }}
{{- printf "%s@%s" $repository $v.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository ($v.image.tag | default (include "elector-sidecar.appVersion" .)) }}
{{- end }}
{{- end }}
