{{/* Labels Helm adds to every object (the tests strip exactly these when comparing with kustomize). */}}
{{- define "gpupilot.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpupilot
{{- end -}}

{{/* One image per service (the Dockerfile's targets): <repository>-<service>:<tag>, or
<repository>-<service>@<digest> when image.digest.<service> is set. */}}
{{- define "gpupilot.image" -}}
{{- $image := .root.Values.image -}}
{{- $digest := dig .service "" ($image.digest | default dict) -}}
{{- if $digest -}}
{{ $image.repository }}-{{ .service }}@{{ $digest }}
{{- else -}}
{{ $image.repository }}-{{ .service }}:{{ $image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets of every pod: global.imagePullSecrets then imagePullSecrets, each a name or
{name: …}, duplicates dropped; nothing when both are empty. */}}
{{- define "gpupilot.imagePullSecrets" -}}
{{- $names := list -}}
{{- $global := dig "imagePullSecrets" list (.Values.global | default dict) -}}
{{- range concat ($global | default list) (.Values.imagePullSecrets | default list) -}}
{{- $name := . -}}
{{- if not (kindIs "string" .) }}{{ $name = dig "name" "" . }}{{ end -}}
{{- if and $name (not (has $name $names)) -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- end -}}
{{- with $names }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* A pod's placement from its component's values (.v): nodeSelector, tolerations, affinity,
topologySpreadConstraints, priorityClassName, each only when set. */}}
{{- define "gpupilot.placement" -}}
{{- with .v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A pod template's metadata: podAnnotations, then podLabels under the selector labels (.labels,
which win). */}}
{{- define "gpupilot.podMetadata" -}}
{{- with .v.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
labels:
  {{- toYaml (merge (deepCopy .labels) (.v.podLabels | default dict)) | nindent 2 }}
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
{{- else if $a.caFile }}
ca-file: {{ $a.caFile | quote }}
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

{{/* The adapter's serving certificate and the APIServices' trust in it, as YAML:
  mode: cert-manager | existing | provided | generated
  secretName: the Secret the adapter mounts (tls.crt, tls.key; ca.crt for the ServiceMonitor)
  caBundle: base64 PEM of the CA (empty with cert-manager: its CA injector fills it in)
  crt, key: base64 PEM of the serving certificate and key (generated only)
  caCrt, caKey: base64 PEM of the CA and its key (generated only: kept in a Secret of their own,
    which the adapter does not mount)
  notAfter, caNotAfter: when each expires (RFC 3339, UTC; generated only)
Generated: Helm cannot parse X.509, so each Secret records its certificate's expiry in the
annotation gpupilot.io/not-after when the chart makes it. On an upgrade (Helm's lookup; empty under
`helm template`) a pair with more than 30 days left is kept; else a new serving certificate
(adapter.generatedCertDays, 365 by default) is signed by the kept CA, so the APIServices' caBundle
stays the same; the CA (10 years) is replaced only when it has 30 days left itself. Called once per
render: each call without Secrets to read makes new ones. */}}
{{- define "gpupilot.adapterTLS" -}}
{{- $a := .Values.adapter -}}
{{- if and $a.existingSecret $a.certManager.enabled -}}
{{- fail "adapter.existingSecret and adapter.certManager.enabled: choose one (cert-manager makes the Secret itself)" -}}
{{- end -}}
{{- if $a.certManager.enabled -}}
mode: cert-manager
secretName: {{ $a.tlsSecretName | quote }}
{{- else if $a.existingSecret -}}
mode: existing
secretName: {{ $a.existingSecret | quote }}
caBundle: {{ $a.caBundle | quote }}
{{- else if $a.caBundle -}}
mode: provided
secretName: {{ $a.tlsSecretName | quote }}
caBundle: {{ $a.caBundle | quote }}
{{- else -}}
{{- $layout := "2006-01-02T15:04:05Z" -}}
{{- $soon := now | dateModify "+720h" | unixEpoch | atoi -}}
{{- $secretName := include "gpupilot.rename" (dict "root" . "text" (printf " %s" $a.tlsSecretName)) | trim -}}
{{- $oldCA := lookup "v1" "Secret" .Release.Namespace (printf "%s-ca" $secretName) | default dict -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace $secretName | default dict -}}
{{- $caData := dig "data" dict $oldCA -}}
{{- $data := dig "data" dict $old -}}
{{- $caLeft := dig "metadata" "annotations" "gpupilot.io/not-after" "" $oldCA -}}
{{- $left := dig "metadata" "annotations" "gpupilot.io/not-after" "" $old -}}
{{- $caCrt := "" -}}{{- $caKey := "" -}}{{- $caNotAfter := "" -}}
{{- $ca := dict -}}
{{- if and (hasKey $caData "tls.crt") (hasKey $caData "tls.key") $caLeft (gt (toDate $layout $caLeft | unixEpoch | atoi) $soon) -}}
{{- $caCrt = index $caData "tls.crt" -}}{{- $caKey = index $caData "tls.key" -}}{{- $caNotAfter = $caLeft -}}
{{- $ca = buildCustomCert $caCrt $caKey -}}
{{- else -}}
{{- $ca = genCA "gpupilot-adapter-ca" 3650 -}}
{{- $caCrt = $ca.Cert | b64enc -}}{{- $caKey = $ca.Key | b64enc -}}
{{- $caNotAfter = dateInZone $layout (now | dateModify "+87600h") "UTC" -}}
{{- end }}
mode: generated
secretName: {{ $a.tlsSecretName | quote }}
caBundle: {{ $caCrt | quote }}
caCrt: {{ $caCrt | quote }}
caKey: {{ $caKey | quote }}
caNotAfter: {{ $caNotAfter | quote }}
{{- if and (hasKey $data "tls.crt") (hasKey $data "tls.key") (eq (index $data "ca.crt" | default "") $caCrt) $left (gt (toDate $layout $left | unixEpoch | atoi) $soon) }}
crt: {{ index $data "tls.crt" | quote }}
key: {{ index $data "tls.key" | quote }}
notAfter: {{ $left | quote }}
{{- else }}
{{- $svc := printf "%s-adapter.%s.svc" (include "gpupilot.fullname" .) .Release.Namespace }}
{{- $cert := genSignedCert $svc nil (list $svc (printf "%s.cluster.local" $svc)) (int $a.generatedCertDays) $ca }}
crt: {{ $cert.Cert | b64enc | quote }}
key: {{ $cert.Key | b64enc | quote }}
notAfter: {{ dateInZone $layout (now | dateModify (printf "+%dh" (mul (int $a.generatedCertDays) 24))) "UTC" | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The Prometheus URL of a component: its own override, else prometheus.url. */}}
{{- define "gpupilot.prometheusUrl" -}}
{{- .own | default .root.Values.prometheus.url -}}
{{- end -}}

{{/* The rightsizer's serve --config, as a map: the chart's files/rightsizer.yaml with the values put
in (Prometheus URL and prometheusAuth, time zone, report schedule, window, price and retention,
the operator namespace, the MIG ConfigMap, autoApply.enabled, leader election with more than one
replica), then rightsizer.config (YAML text or a map) merged over it key by key; a key set to null
there removes the chart's. Rendered with toYaml (YAML text with its comments would be lost anyway). */}}
{{- define "gpupilot.rightsizerConfig" -}}
{{- $r := .Values.rightsizer -}}
{{- $c := .Files.Get "files/rightsizer.yaml" | fromYaml -}}
{{- $_ := set $c "prometheus_url" (include "gpupilot.prometheusUrl" (dict "own" $r.prometheusUrl "root" .)) -}}
{{- range $k, $v := include "gpupilot.prometheusAuth" . | fromYaml -}}
{{- $_ := set $c (printf "prometheus_%s" ($k | replace "-" "_")) $v -}}
{{- end -}}
{{- $_ = set $c "timezone" ($r.timezone | default "UTC") -}}
{{- $rv := $r.report | default dict -}}
{{- $report := get $c "report" | default dict -}}
{{- with $rv.schedule }}{{ $_ = set $report "schedule" . }}{{ end -}}
{{- with $rv.window }}{{ $_ = set $report "window" . }}{{ end -}}
{{- if not (kindIs "invalid" $rv.pricePerGpuHour) }}{{ $_ = set $report "price_per_gpu_hour" (float64 $rv.pricePerGpuHour) }}{{ end -}}
{{- with $rv.retention }}
{{- $keep := dict -}}
{{- with .count }}{{ $_ = set $keep "count" (int .) }}{{ end -}}
{{- with .maxAge }}{{ $_ = set $keep "max_age" . }}{{ end -}}
{{- if $keep }}{{ $_ = set $report "retention" $keep }}{{ end -}}
{{- end -}}
{{- with $rv.push }}
{{- $push := dict -}}
{{- if dig "webhook" "secretName" "" . }}
{{- $_ = set $push "webhook_url_file" (printf "/etc/gpupilot-report-webhook/%s" (dig "webhook" "key" "url" .)) -}}
{{- $_ = set $push "format" (dig "webhook" "format" "slack" .) -}}
{{- end }}
{{- with .link }}{{ $_ = set $push "link" . }}{{ end -}}
{{- if dig "copyTo" "existingClaim" "" . }}{{ $_ = set $push "copy_to" "/var/lib/gpupilot-report-archive" }}{{ end -}}
{{- if or (hasKey $push "webhook_url_file") (hasKey $push "copy_to") }}{{ $_ = set $report "push" $push }}{{ end -}}
{{- end }}
{{- $_ = set $c "report" $report -}}
{{- $auto := get $c "auto_apply" | default dict -}}
{{- $_ = set $auto "enabled" $r.autoApply.enabled -}}
{{- $_ = set $auto "operator_namespace" $r.gpuOperatorNamespace -}}
{{- $_ = set $auto "mig_configmap" $r.migConfigMap -}}
{{- if $r.autoApply.paused }}{{ $_ = set $auto "paused" true }}{{ end -}}
{{- /* The emergency stop's annotations: on the rightsizer's own config ConfigMap. */ -}}
{{- $_ = set $auto "stop_signal" (dict "namespace" .Release.Namespace "configmap" "gpupilot-rightsizer") -}}
{{- if gt (int ($r.replicas | default 1)) 1 -}}
{{- $_ = set $auto "leader_election" (dict "namespace" .Release.Namespace) -}}
{{- end -}}
{{- $_ = set $c "auto_apply" $auto -}}
{{- $own := $r.config | default dict -}}
{{- if kindIs "string" $own -}}
{{- $own = fromYaml $own -}}
{{- if hasKey $own "Error" -}}
{{- fail (printf "rightsizer.config is not YAML: %s" (get $own "Error")) -}}
{{- end -}}
{{- end -}}
{{- $c = mergeOverwrite $c (deepCopy $own) -}}
{{- range $k, $v := $own -}}
{{- if kindIs "invalid" $v }}{{ $_ = unset $c $k }}{{ end -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{/* A component's (.v) log flags: only what differs from the services' defaults (text, info). */}}
{{- define "gpupilot.logArgs" -}}
{{- if and .v.logFormat (ne .v.logFormat "text") }}
- --log-format={{ .v.logFormat }}
{{- end }}
{{- if and .v.logLevel (ne .v.logLevel "info") }}
- --log-level={{ .v.logLevel }}
{{- end }}
{{- end -}}

{{/* A component's (.v) extraArgs, quoted. */}}
{{- define "gpupilot.extraArgs" -}}
{{- range .v.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* A list value of a component (.v, key .key), as items of a list already open in the template. */}}
{{- define "gpupilot.extraList" -}}
{{- with (get .v .key) }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A security context: the chart's (.default, YAML text) with the component's value (.own, a map)
merged over it, key by key. */}}
{{- define "gpupilot.securityContext" -}}
{{- toYaml (mergeOverwrite (.default | fromYaml) (deepCopy (.own | default dict))) -}}
{{- end -}}

{{/* A component's ServiceAccount annotations (.v.serviceAccount.annotations), when set. */}}
{{- define "gpupilot.serviceAccountAnnotations" -}}
{{- with dig "serviceAccount" "annotations" dict .v }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A ServiceMonitor's extra labels and an endpoint's relabelings/metricRelabelings appended to
the chart's (.relabelings, .metricRelabelings: lists; .sm: the component's serviceMonitor values). */}}
{{- define "gpupilot.monitorEndpointRelabel" -}}
{{- $r := concat (.relabelings | default list) (.sm.relabelings | default list) -}}
{{- $m := concat (.metricRelabelings | default list) (.sm.metricRelabelings | default list) -}}
{{- with $r }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The prefix of every object's name: "gpupilot" (so a release of any name keeps the names of
earlier releases), fullnameOverride when set, or <release>-<nameOverride> (the release name alone
when it already holds nameOverride). A second release in a cluster needs one of the two. */}}
{{- define "gpupilot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if .Values.nameOverride -}}
{{- if contains .Values.nameOverride .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- else -}}
gpupilot
{{- end -}}
{{- end -}}

{{/* Rendered text (.text) with the chart's object names under the release's prefix (.root):
gpupilot-exporter… → <fullname>-exporter… wherever a name stands (after a space, a quote, a colon,
a bracket, an equals sign), never in a path, an image or a label key (after / . - or a letter), nor
the names the services give objects they make at run time (their Leases, the ledger, the in-flight
record) or the commands the containers run, which stay fixed. The identity for the default prefix. */}}
{{- define "gpupilot.rename" -}}
{{- $fn := include "gpupilot.fullname" .root -}}
{{- if eq $fn "gpupilot" -}}
{{- .text -}}
{{- else -}}
{{- $text := .text -}}
{{- $fixed := list "\"gpupilot-rightsizer-leader\"" "\"gpupilot-rightsizer-ledger\"" "\"gpupilot-rightsizer-in-flight\"" "resourceNames: [\"gpupilot-rightsizer-apply\"]" "command: [\"gpupilot-exporter\"]" "command: [\"gpupilot-adapter\"]" "command: [\"gpupilot-rightsizer\"]" -}}
{{- range $i, $f := $fixed -}}
{{- $text = replace $f (printf "@@FIXED%d@@" $i) $text -}}
{{- end -}}
{{- $text = regexReplaceAll "(^|[^./A-Za-z0-9_-])gpupilot-(exporter|adapter|rightsizer|prometheus-reader)" $text (printf "${1}%s-${2}" $fn) -}}
{{- range $i, $f := $fixed -}}
{{- $text = replace (printf "@@FIXED%d@@" $i) $f $text -}}
{{- end -}}
{{- $text -}}
{{- end -}}
{{- end -}}
