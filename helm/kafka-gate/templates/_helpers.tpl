{{/* Names and labels. */}}
{{- define "kafka-gate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-gate.fullname" -}}
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

{{- define "kafka-gate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-gate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kafka-gate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kafka-gate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gate
{{- end }}

{{- define "kafka-gate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka-gate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kafka-gate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The chart's own Secret holds the values given inline; existingSecret replaces each. */}}
{{- define "kafka-gate.secretName" -}}
{{- printf "%s-secrets" (include "kafka-gate.fullname" .) }}
{{- end }}

{{- define "kafka-gate.ownSecretNeeded" -}}
{{- if or (and .Values.apiToken.value (not .Values.apiToken.existingSecret)) (and .Values.redis.enabled .Values.redis.password (not .Values.redis.existingSecret)) }}true{{- end }}
{{- end }}

{{- define "kafka-gate.apiTokenSet" -}}
{{- if or .Values.apiToken.value .Values.apiToken.existingSecret }}true{{- end }}
{{- end }}

{{/* The gate's configuration file, rendered from the values (no secrets in it). */}}
{{- define "kafka-gate.config" -}}
{{- $kafka := dict "bootstrap.servers" (required "kafka.bootstrapServers is required" .Values.kafka.bootstrapServers) }}
{{- range $key, $value := .Values.kafka.properties }}
{{- $_ := set $kafka $key $value }}
{{- end }}
{{- $gates := dict }}
{{- if not .Values.gates }}
{{- fail "gates: no gate is configured; the chart deploys exactly the gates you set. Set gates.<name>.topics and gates.<name>.dependsOn in your values (the chart's examples/values-example.yaml is one; see docs/deploy.md)" }}
{{- end }}
{{- range $name, $gate := .Values.gates }}
{{- $spec := dict "topics" $gate.topics "depends_on" $gate.dependsOn }}
{{- if $gate.group }}{{ $_ := set $spec "group" $gate.group }}{{ end }}
{{- $_ := set $gates $name $spec }}
{{- end }}
{{- $http := dict "host" "0.0.0.0" "port" (int .Values.service.port) "cors_origins" .Values.http.corsOrigins "max_wait_s" .Values.http.maxWaitSeconds "max_batch" (int .Values.http.maxBatch) "max_body_bytes" (int .Values.http.maxBodyBytes) "rate_limit_per_s" .Values.http.rateLimitPerSecond }}
{{- $status := dict "stall_after_ms" (int .Values.status.stallAfterMs) "lag_window_ms" (int .Values.status.lagWindowMs) "behind_after_ms" (int .Values.status.behindAfterMs) "rewind_window_ms" (int .Values.status.rewindWindowMs) "rewind_policy" .Values.status.rewindPolicy "metrics_group_partitions_max" (int .Values.status.metricsGroupPartitionsMax) }}
{{- $config := dict "kafka" $kafka "poll_interval_ms" (int .Values.pollIntervalMs) "idle_poll_interval_ms" (int .Values.idlePollIntervalMs) "poller_niceness" (int .Values.pollerNiceness) "metadata_interval_ms" (int .Values.metadataIntervalMs) "request_timeout_ms" (int .Values.requestTimeoutMs) "heartbeat_ms" (int .Values.heartbeatMs) "gates" $gates "http" $http "status" $status }}
{{- if .Values.redis.enabled }}
{{- $_ := set $config "redis" (dict "url" (required "redis.url is required when redis.enabled" .Values.redis.url) "prefix" .Values.redis.prefix) }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/* The container's environment: secrets by reference only, then extraEnv. */}}
{{- define "kafka-gate.env" -}}
{{- if include "kafka-gate.apiTokenSet" . }}
- name: GATE_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ default (include "kafka-gate.secretName" .) .Values.apiToken.existingSecret }}
      key: {{ .Values.apiToken.existingSecretKey }}
{{- end }}
{{- if and .Values.redis.enabled (or .Values.redis.password .Values.redis.existingSecret) }}
- name: GATE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ default (include "kafka-gate.secretName" .) .Values.redis.existingSecret }}
      key: {{ .Values.redis.existingSecretKey }}
{{- end }}
{{- range $property, $ref := .Values.kafka.secretProperties }}
- name: {{ printf "GATE_KAFKA_%s" ($property | replace "." "_" | upper) }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.secretName }}
      key: {{ $ref.key }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
