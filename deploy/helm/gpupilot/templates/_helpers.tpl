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
