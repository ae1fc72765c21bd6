{{/*
Prefix of every object name. Not derived from the release name: the chart is installed once
per cluster, and other components find the operator and workers as agentrun-operator and
agentrun-worker.
*/}}
{{- define "agentrun.fullname" -}}
{{- default "agentrun" .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentrun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: agentrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrun
{{- end -}}

{{/* Selector labels; call with (dict "root" $ "component" "operator"). */}}
{{- define "agentrun.selectorLabels" -}}
app.kubernetes.io/name: agentrun
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "agentrun.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "agentrun.operatorServiceAccountName" -}}
{{- if .Values.serviceAccount.operator.create -}}
{{- default (printf "%s-operator" (include "agentrun.fullname" .)) .Values.serviceAccount.operator.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.operator.name -}}
{{- end -}}
{{- end -}}

{{- define "agentrun.workerServiceAccountName" -}}
{{- if .Values.serviceAccount.worker.create -}}
{{- default (printf "%s-worker" (include "agentrun.fullname" .)) .Values.serviceAccount.worker.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.worker.name -}}
{{- end -}}
{{- end -}}
