{{/* Labels every object carries. */}}
{{- define "flotilla.labels" -}}
app.kubernetes.io/part-of: flotilla
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of one service's objects; the selector is the name only. */}}
{{- define "flotilla.serviceLabels" -}}
{{ include "flotilla.labels" .root }}
app.kubernetes.io/name: flotilla-{{ .name }}
app.kubernetes.io/component: {{ .name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end }}

{{- define "flotilla.selector" -}}
app.kubernetes.io/name: flotilla-{{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* image: registry/flotilla-<name>:tag, each part overridable. */}}
{{- define "flotilla.image" -}}
{{- $v := index .root.Values .name -}}
{{- $repo := $v.image.repository | default (printf "flotilla-%s" .name) -}}
{{- $reg := .root.Values.global.imageRegistry -}}
{{- $tag := $v.image.tag | default .root.Values.global.imageTag -}}
{{- if $reg }}{{ printf "%s/%s:%s" $reg $repo $tag }}{{ else }}{{ printf "%s:%s" $repo $tag }}{{ end -}}
{{- end }}

{{/* Service address inside the cluster. */}}
{{- define "flotilla.address" -}}
flotilla-{{ .name }}.{{ .root.Release.Namespace }}.svc:{{ .port }}
{{- end }}

{{/* The pod template parts every service shares: scheduling, security,
     probes on the admin port, the shared flags. Called with
     (dict "root" $ "name" "galley" "admin" 15015). */}}
{{- define "flotilla.podCommon" -}}
{{- $v := index .root.Values .name -}}
{{- with .root.Values.global.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- with $v.nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}

{{- define "flotilla.containerCommon" -}}
{{- $v := index .root.Values .name -}}
image: {{ include "flotilla.image" . | quote }}
imagePullPolicy: {{ .root.Values.global.imagePullPolicy }}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
readinessProbe:
  httpGet: {path: /readyz, port: http-monitoring}
  periodSeconds: 2
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: http-monitoring}
  initialDelaySeconds: 5
  periodSeconds: 10
  failureThreshold: 6
resources:
{{ toYaml $v.resources | indent 2 }}
{{- /* No GOMEMLIMIT here: each service gives the Go runtime 90 % of its
container's memory limit itself, read from its cgroup (as istiod does),
which leaves room for what the runtime does not count. */}}
{{- end }}

{{/* The shared flags. */}}
{{- define "flotilla.commonArgs" -}}
- --admin-address=:{{ .admin }}
- --log-level={{ .root.Values.global.logLevel }}
- --log-format={{ .root.Values.global.logFormat }}
{{- end }}

{{/* PodDisruptionBudget and HorizontalPodAutoscaler of a service. */}}
{{- define "flotilla.scaling" -}}
{{- $v := index .root.Values .name -}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: flotilla-{{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
{{ include "flotilla.serviceLabels" . | indent 4 }}
spec:
  minAvailable: {{ $v.podDisruptionBudget.minAvailable }}
  selector:
    matchLabels:
{{ include "flotilla.selector" . | indent 6 }}
{{- if $v.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: flotilla-{{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
{{ include "flotilla.serviceLabels" . | indent 4 }}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: flotilla-{{ .name }}}
  minReplicas: {{ $v.autoscaling.minReplicas }}
  maxReplicas: {{ $v.autoscaling.maxReplicas }}
  metrics:
  - type: Resource
    resource:
      name: cpu
      target: {type: Utilization, averageUtilization: {{ $v.autoscaling.targetCPUUtilizationPercentage }}}
{{- end }}
{{- end }}

{{/* The injection webhook configuration and ConfigMap, per revision. */}}
{{- define "flotilla.injectorWebhookName" -}}
{{- if eq .Values.injector.revision "default" }}flotilla-sidecar-injector{{ else }}flotilla-sidecar-injector-{{ .Values.injector.revision }}{{ end -}}
{{- end }}
{{- define "flotilla.injectionConfigMap" -}}
{{ include "flotilla.injectorWebhookName" . }}
{{- end }}

{{- define "flotilla.validatorName" -}}
flotilla-validator-{{ .Release.Namespace }}
{{- end }}
