{{/* Labels Helm adds to every object (the tests strip exactly these when comparing with kustomize). */}}
{{- define "gpupilot.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpupilot
{{- end -}}

{{/* One image per service (the Dockerfile's targets): <repository>-<service>:<tag>. */}}
{{- define "gpupilot.image" -}}
{{ .root.Values.image.repository }}-{{ .service }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{/* Container security context shared by every workload. */}}
{{- define "gpupilot.containerSecurity" -}}
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
readOnlyRootFilesystem: true
{{- end -}}

{{/* prometheusAuth as setting name -> value (the flags' names without --prometheus-), for the
adapter's flags and the rightsizer's prometheus_* config fields alike. */}}
{{- define "gpupilot.prometheusAuth" -}}
{{- $a := .Values.prometheusAuth -}}
{{- $dir := "/etc/gpupilot-prometheus-auth" -}}
{{- if $a.tenant }}
tenant: {{ $a.tenant | quote }}
{{- end }}
{{- if $a.tenantHeader }}
tenant-header: {{ $a.tenantHeader | quote }}
{{- end }}
{{- if $a.username }}
username: {{ $a.username | quote }}
{{- end }}
{{- if $a.passwordKey }}
password-file: {{ printf "%s/%s" $dir $a.passwordKey | quote }}
{{- end }}
{{- if $a.bearerTokenKey }}
bearer-token-file: {{ printf "%s/%s" $dir $a.bearerTokenKey | quote }}
{{- else if $a.bearerTokenFile }}
bearer-token-file: {{ $a.bearerTokenFile | quote }}
{{- end }}
{{- if $a.caKey }}
ca-file: {{ printf "%s/%s" $dir $a.caKey | quote }}
{{- end }}
{{- if $a.certKey }}
cert-file: {{ printf "%s/%s" $dir $a.certKey | quote }}
{{- end }}
{{- if $a.keyKey }}
key-file: {{ printf "%s/%s" $dir $a.keyKey | quote }}
{{- end }}
{{- end -}}

{{/* The Secret named by prometheusAuth.secretName, mounted read-only (kubelet-updated on rotation). */}}
{{- define "gpupilot.prometheusAuthMount" -}}
{{- if .Values.prometheusAuth.secretName }}
- name: prometheus-auth
  mountPath: /etc/gpupilot-prometheus-auth
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gpupilot.prometheusAuthVolume" -}}
{{- if .Values.prometheusAuth.secretName }}
- name: prometheus-auth
  secret:
    secretName: {{ .Values.prometheusAuth.secretName }}
{{- end }}
{{- end -}}
