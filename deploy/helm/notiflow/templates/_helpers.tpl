{{- define "notiflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "notiflow.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "notiflow.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "notiflow.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "notiflow.labels" -}}
app.kubernetes.io/name: {{ include "notiflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "send-p1") */}}
{{- define "notiflow.selector" -}}
app.kubernetes.io/name: {{ include "notiflow.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "notiflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "notiflow.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "notiflow.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The ConfigMap's data; secrets are refused. */}}
{{- define "notiflow.configData" -}}
{{- range $key, $value := .Values.config }}
{{- if regexMatch "(TOKEN|PASSWORD|SECRET|DLQ_KEY|RECIPIENT_HASH_KEY|CORRELATION_KEY|BINDING__KEYS|ENCRYPTION__KEYS|TENANTS|AUTH|PRIVATE)" (upper $key) }}
{{- fail (printf "config.%s looks like a secret: put it in the Secret named by secretName" $key) }}
{{- end }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* env, envFrom, volumes shared by every notiflow container */}}
{{- define "notiflow.envFrom" -}}
- configMapRef:
    name: {{ include "notiflow.fullname" . }}
{{- if not .Values.secretReload }}
- secretRef:
    name: {{ required "secretName: the Secret with NOTIFLOW_TENANTS, NOTIFLOW_DLQ_KEY and provider credentials" .Values.secretName }}
{{- end }}
{{- end -}}

{{- define "notiflow.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: NOTIFLOW_STACK_DIR
  value: /var/lib/notiflow
{{- if .Values.secretReload }}
- name: NOTIFLOW_SECRETS_DIR
  value: /run/secrets/notiflow
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "notiflow.podSpecCommon" -}}
serviceAccountName: {{ include "notiflow.serviceAccountName" . }}
{{ include "notiflow.podSpecBase" . }}
{{- end -}}

{{/* for hooks, which run before the chart's ServiceAccount exists */}}
{{- define "notiflow.podSpecBase" -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* a container's image, securityContext, env; (dict "root" $ "name" "api") */}}
{{- define "notiflow.containerCommon" -}}
name: {{ .name }}
image: {{ include "notiflow.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .root.Values.containerSecurityContext | nindent 2 }}
envFrom:
  {{- include "notiflow.envFrom" .root | nindent 2 }}
env:
  {{- include "notiflow.env" .root | nindent 2 }}
{{- end -}}

{{- define "notiflow.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /var/lib/notiflow
{{- if .Values.secretReload }}
- name: secrets
  mountPath: /run/secrets/notiflow
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "notiflow.volumes" -}}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
{{- if .Values.secretReload }}
- name: secrets
  secret:
    secretName: {{ required "secretName: the Secret with NOTIFLOW_TENANTS, NOTIFLOW_DLQ_KEY and provider credentials" .Values.secretName }}
    defaultMode: 0440
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* the checksum that rolls pods when the configuration changes */}}
{{- define "notiflow.configChecksum" -}}
checksum/config: {{ include "notiflow.configData" . | sha256sum }}
{{- end -}}
