{{/* Names, labels, and the gateway config the ConfigMap holds (one definition: its checksum rolls the pods). */}}

{{- define "gw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gw.redisName" -}}
{{- printf "%s-redis" (include "gw.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "gw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "gw.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end -}}

{{- define "gw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gw.secretName" -}}
{{- default (include "gw.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The seconds a SIGTERM'd pod may take: the preStop sleep, the WebSocket/HTTP drain
     (config.limits.ws_drain_seconds, the gateway's default 10), then a margin. */}}
{{- define "gw.drainSeconds" -}}
{{- dig "limits" "ws_drain_seconds" 10 .Values.config | ceil | int -}}
{{- end -}}

{{- define "gw.terminationGracePeriodSeconds" -}}
{{- add (int .Values.lifecycle.preStopSleepSeconds) (include "gw.drainSeconds" . | int) (int .Values.lifecycle.shutdownMarginSeconds) -}}
{{- end -}}

{{/* Refuse values that would ship secrets in a ConfigMap, or a gateway that cannot start or
     cannot share state across pods. */}}
{{- define "gw.checks" -}}
{{- $cfg := .Values.config -}}
{{- $auth := dig "auth" (dict) $cfg -}}
{{- range $i, $k := (dig "api_keys" (list) $auth) -}}
{{- if hasKey $k "key" -}}
{{- fail (printf "config.auth.api_keys[%d] is a plain key: give its sha256 digest here, or put it in secrets.apiKeys" $i) -}}
{{- end -}}
{{- end -}}
{{- range $i, $k := (dig "admin" "api_keys" (list) $cfg) -}}
{{- if hasKey $k "key" -}}
{{- fail (printf "config.admin.api_keys[%d] is a plain key: give its sha256 digest here, or put it in secrets.adminKeys" $i) -}}
{{- end -}}
{{- end -}}
{{- if dig "compaction" "keys" (list) $cfg -}}
{{- fail "config.compaction.keys are secrets: put them in secrets.compactionKeys" -}}
{{- end -}}
{{- range $name, $p := (dig "providers" (dict) $cfg) -}}
{{- if hasKey $p "api_key" -}}
{{- fail (printf "config.providers.%s.api_key is a secret: set api_key_env and put the key in secrets.providerKeys" $name) -}}
{{- end -}}
{{- end -}}
{{- if dig "state" "redis_url" "" $cfg -}}
{{- fail "config.state.redis_url: give redis.url (or secrets.redisUrl) instead" -}}
{{- end -}}
{{- $existing := .Values.secrets.existingSecret -}}
{{- if and (dig "api_keys" (list) $auth) .Values.secrets.apiKeys -}}
{{- fail "client keys in both config.auth.api_keys and secrets.apiKeys: the environment's list would replace the file's; give them in one place" -}}
{{- end -}}
{{- if not (or (dig "api_keys" (list) $auth) .Values.secrets.apiKeys $existing (dig "anonymous" false $auth)) -}}
{{- fail "no client keys: set secrets.apiKeys, config.auth.api_keys (sha256 digests) or secrets.existingSecret (with GATEWAY_AUTH__API_KEYS); config.auth.anonymous: true serves without keys on purpose" -}}
{{- end -}}
{{- if not (or .Values.secrets.compactionKeys $existing) -}}
{{- fail "no compaction keys: set secrets.compactionKeys (head -c 32 /dev/urandom | base64) or secrets.existingSecret (with GATEWAY_COMPACTION__KEYS); without them each process has its own key and compacted items do not travel between pods" -}}
{{- end -}}
{{- $mode := .Values.redis.mode -}}
{{- if and .Values.redis.internal.enabled (ne $mode "standalone") -}}
{{- fail (printf "redis.mode %s needs an external Redis: set redis.internal.enabled=false" $mode) -}}
{{- end -}}
{{- if and (eq $mode "sentinel") (not (and .Values.redis.sentinels .Values.redis.sentinelMaster)) -}}
{{- fail "redis.mode sentinel needs redis.sentinels and redis.sentinelMaster" -}}
{{- end -}}
{{- if not (or .Values.redis.internal.enabled .Values.redis.url .Values.secrets.redisUrl $existing) -}}
{{- fail "no Redis: set redis.url (or secrets.redisUrl; in sentinel mode it gives the credentials, db and scheme), or redis.internal.enabled=true" -}}
{{- end -}}
{{- if and .Values.secrets.sentinelPassword (ne $mode "sentinel") -}}
{{- fail "secrets.sentinelPassword is only used with redis.mode sentinel" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (kindIs "invalid" .Values.metrics.port) -}}
{{- fail "serviceMonitor.enabled needs metrics.port: /metrics on the API port asks for an admin key once auth is on" -}}
{{- end -}}
{{- end -}}

{{/* The gateway config file: `config` plus what the chart owns (state's Redis, metrics.port). */}}
{{- define "gw.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $state := dig "state" (dict) $cfg -}}
{{- $mode := .Values.redis.mode -}}
{{- if ne $mode "standalone" -}}
{{- $_ := set $state "redis_mode" $mode -}}
{{- end -}}
{{- if eq $mode "sentinel" -}}
{{- $_ := set $state "sentinels" .Values.redis.sentinels -}}
{{- $_ := set $state "sentinel_master" .Values.redis.sentinelMaster -}}
{{- end -}}
{{- if .Values.secrets.redisUrl -}}
{{- else if .Values.redis.url -}}
{{- $_ := set $state "redis_url" .Values.redis.url -}}
{{- else if and .Values.redis.internal.enabled (eq $mode "standalone") -}}
{{- $_ := set $state "redis_url" (printf "redis://%s:6379/0" (include "gw.redisName" .)) -}}
{{- end -}}
{{- $_ := set $cfg "state" $state -}}
{{- if not (kindIs "invalid" .Values.metrics.port) -}}
{{- $metrics := dig "metrics" (dict) $cfg -}}
{{- $_ := set $metrics "port" (int .Values.metrics.port) -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The Secret's variables (when the chart makes it): JSON for the gateway's list settings. */}}
{{- define "gw.secretData" -}}
{{- with .Values.secrets.apiKeys }}
GATEWAY_AUTH__API_KEYS: {{ toJson . | b64enc | quote }}
{{- end }}
{{- with .Values.secrets.adminKeys }}
GATEWAY_ADMIN__API_KEYS: {{ toJson . | b64enc | quote }}
{{- end }}
{{- with .Values.secrets.compactionKeys }}
GATEWAY_COMPACTION__KEYS: {{ toJson . | b64enc | quote }}
{{- end }}
{{- with .Values.secrets.redisUrl }}
GATEWAY_STATE__REDIS_URL: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.secrets.sentinelPassword }}
GATEWAY_STATE__SENTINEL_PASSWORD: {{ . | b64enc | quote }}
{{- end }}
{{- range $name, $value := .Values.secrets.providerKeys }}
{{ $name }}: {{ $value | toString | b64enc | quote }}
{{- end }}
{{- end -}}

{{- define "gw.metricsPortName" -}}
{{- if kindIs "invalid" .Values.metrics.port -}}http{{- else -}}metrics{{- end -}}
{{- end -}}
