{{/* The objects' name: the release's, or "<release>-hubbub" when it does not say hubbub. */}}
{{- define "hubbub.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* What selects this release's pods. */}}
{{- define "hubbub.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hubbub.labels" -}}
{{ include "hubbub.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
Memory per pod in MiB, by the arithmetic of k8s/base/deployment.yaml: per worker
maxConnections x 23 KiB (measured in make bench) + 100 MiB of its own + its outbox, plus the
gunicorn master (60 MiB) and the memory-backed /tmp (64 MiB); times 1.4 for headroom, rounded up
to a multiple of 128 MiB. The defaults give 1280.
*/}}
{{- define "hubbub.memoryMi" -}}
{{- $sockets := div (mul (int64 .Values.maxConnections) 23) 1024 -}}
{{- $outbox := div (int64 .Values.workerOutboxMaxBytes) 1048576 -}}
{{- $total := add (mul (int64 .Values.workers) (add $sockets 100 $outbox)) 124 -}}
{{- $headroom := div (mul $total 140) 100 -}}
{{- mul (div (add $headroom 127) 128) 128 -}}
{{- end -}}

{{- define "hubbub.resources" -}}
{{- if .Values.resources -}}
{{ toYaml .Values.resources }}
{{- else -}}
{{- $memory := printf "%sMi" (include "hubbub.memoryMi" .) -}}
requests:
  cpu: {{ max 1 (div (int64 .Values.workers) 2) | quote }}
  memory: {{ $memory }}
limits:
  cpu: {{ .Values.workers | int64 | quote }}
  memory: {{ $memory }}
{{- end -}}
{{- end -}}
