{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "singleton-controller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, suffixed with the chart name unless it already contains it. */}}
{{- define "singleton-controller.fullname" -}}
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

{{- define "singleton-controller.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "singleton-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "singleton-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "singleton-controller.labels" -}}
helm.sh/chart: {{ include "singleton-controller.chart" . }}
{{ include "singleton-controller.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: singleton-controller
{{- end }}

{{- define "singleton-controller.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "singleton-controller.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Lease: named after the release (docs/design.md), in the release namespace. */}}
{{- define "singleton-controller.leaseName" -}}
{{- default .Release.Name .Values.leaderElection.leaseName }}
{{- end }}

{{- define "singleton-controller.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The namespaces served: "" (all, with ClusterRoles) or the one entry of watchNamespaces.
The controller watches one namespace or all of them; values.schema.json also caps the list at one.
*/}}
{{- define "singleton-controller.watchNamespace" -}}
{{- if gt (len .Values.watchNamespaces) 1 }}
{{- fail (printf "watchNamespaces: the controller watches one namespace or all of them today; got %d (%s). Install one release per namespace instead." (len .Values.watchNamespaces) (join ", " .Values.watchNamespaces)) }}
{{- end }}
{{- if .Values.watchNamespaces }}{{ first .Values.watchNamespaces }}{{ end }}
{{- end }}

{{/* Refuses combinations that would break the guarantees. */}}
{{- define "singleton-controller.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: without a Lease every replica would act" }}
{{- end }}
{{- $le := .Values.leaderElection }}
{{- if and $le.enabled (ge (float64 $le.renewDeadlineSeconds) (float64 $le.leaseDurationSeconds)) }}
{{- fail "leaderElection.renewDeadlineSeconds must be less than leaseDurationSeconds" }}
{{- end }}
{{- if and $le.enabled (le (float64 $le.renewDeadlineSeconds) (mulf 1.2 $le.retryPeriodSeconds)) }}
{{- fail "leaderElection.renewDeadlineSeconds must be greater than 1.2 x retryPeriodSeconds" }}
{{- end }}
{{- $c := .Values.controller }}
{{- if lt (int $c.prepareMaxLeadSeconds) (int $c.prepareLeadSeconds) }}
{{- fail (printf "controller.prepareMaxLeadSeconds (%d) must not be below controller.prepareLeadSeconds (%d): the controller would refuse to start" (int $c.prepareMaxLeadSeconds) (int $c.prepareLeadSeconds)) }}
{{- end }}
{{- end }}
