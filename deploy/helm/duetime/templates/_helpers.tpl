{{/* Names and labels shared by every template. */}}

{{- define "duetime.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "duetime.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "duetime.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "duetime.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "duetime.labels" -}}
app.kubernetes.io/name: {{ include "duetime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "duetime.selector" -}}
app.kubernetes.io/name: {{ include "duetime.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "duetime.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "duetime.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "duetime.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "duetime.secretName" -}}
{{- default (include "duetime.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{/* A pool's consumer group: DUETIME_WORKER_GROUP's own default for the pool named default. */}}
{{- define "duetime.poolGroup" -}}
{{- if .pool.group -}}
{{- .pool.group -}}
{{- else if eq .pool.name "default" -}}
{{- printf "%sworkers" .root.Values.topicPrefix -}}
{{- else -}}
{{- printf "%sworkers.%s" .root.Values.topicPrefix .pool.name -}}
{{- end -}}
{{- end -}}

{{/* A queue's execution topic of one priority (the queues' naming, duetime/core/topics.py). */}}
{{- define "duetime.execTopic" -}}
{{- if eq .queue "default" -}}
{{- printf "%sexec.%s" .prefix .priority -}}
{{- else -}}
{{- printf "%sexec.%s.%s" .prefix .queue .priority -}}
{{- end -}}
{{- end -}}

{{/* Checks that fail the render with a message naming the value, rather than a cluster
     full of crash-looping pods. */}}
{{- define "duetime.validate" -}}
{{- if not (regexMatch "^[A-Za-z0-9._-]{0,100}$" .Values.topicPrefix) -}}
{{- fail (printf "topicPrefix %q may only hold letters, digits, '.', '_' and '-'" .Values.topicPrefix) -}}
{{- end -}}
{{- if and (not .Values.existingSecret) (not .Values.database.url) -}}
{{- fail "database.url is required (or existingSecret holding DUETIME_DATABASE_URL)" -}}
{{- end -}}
{{- if and (not .Values.existingSecret) (not .Values.api.tokens) (not .Values.api.allowNoAuth) -}}
{{- fail "api.tokens is required: the API refuses to listen beyond loopback without tokens (or set api.allowNoAuth behind a gateway, or existingSecret)" -}}
{{- end -}}
{{- $names := dict -}}
{{- range .Values.workers.pools -}}
{{- if not (regexMatch "^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$" (toString .name)) -}}
{{- fail (printf "workers.pools: name %q must be a DNS label of at most 32 characters" (toString .name)) -}}
{{- end -}}
{{- if hasKey $names .name -}}
{{- fail (printf "workers.pools: the name %q is used twice" .name) -}}
{{- end -}}
{{- $_ := set $names .name true -}}
{{- if not .queues -}}
{{- fail (printf "workers.pools[%s]: queues may not be empty" .name) -}}
{{- end -}}
{{- range .queues -}}
{{- if not (regexMatch "^[a-z0-9][a-z0-9_-]{0,47}$" (toString .)) -}}
{{- fail (printf "workers.pools: queue %q must match ^[a-z0-9][a-z0-9_-]{0,47}$" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- if gt (int .autoscaling.maxReplicas) (int $.Values.partitions) -}}
{{- fail (printf "workers.pools[%s]: maxReplicas %v exceeds the %v partitions of an execution topic (the extra workers would idle)" .name .autoscaling.maxReplicas $.Values.partitions) -}}
{{- end -}}
{{- if gt (int .autoscaling.minReplicas) (int .autoscaling.maxReplicas) -}}
{{- fail (printf "workers.pools[%s]: minReplicas exceeds maxReplicas" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The environment, resources and security of the migration hook's containers. */}}
{{- define "duetime.migrateEnv" -}}
envFrom:
  - configMapRef:
      name: {{ include "duetime.fullname" . }}
  - secretRef:
      name: {{ include "duetime.secretName" . }}
resources:
  {{- toYaml .Values.migrate.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
{{- end -}}
