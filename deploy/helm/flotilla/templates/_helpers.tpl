{{/* Labels every object carries. */}}
{{- define "flotilla.labels" -}}
app.kubernetes.io/part-of: flotilla
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The release's revision (Istio's istio.io/rev): "default" when none
     is given. */}}
{{- define "flotilla.revision" -}}
{{ .Values.revision | default "default" }}
{{- end }}

{{/* Whether a service (by its short name) runs once per revision:
     discovery and the injector; galley and ca are shared by every
     revision (internal/controlplane). */}}
{{- define "flotilla.revisioned" -}}
{{ has . (list "discovery" "injector") }}
{{- end }}

{{/* The services this release installs, as a JSON list of short names:
     discovery and the injector always (this revision's), galley and ca
     unless turned off (a second revision shares another release's). */}}
{{- define "flotilla.services" -}}
{{- $out := list -}}
{{- range $name := list "galley" "discovery" "ca" "injector" -}}
{{- if or (eq (include "flotilla.revisioned" $name) "true") (index $.Values $name).enabled -}}
{{- $out = append $out $name -}}
{{- end -}}
{{- end -}}
{{ toJson $out }}
{{- end }}

{{/* A service's objects' name (its Deployment, ServiceAccount, Service):
     flotilla-<name>, and -<revision> for a revisioned service of a
     revision other than the default (internal/controlplane.Name).
     Called with (dict "root" $ "name" "discovery"). */}}
{{- define "flotilla.fullname" -}}
{{- $rev := include "flotilla.revision" .root -}}
flotilla-{{ .name }}{{ if and (eq (include "flotilla.revisioned" .name) "true") (ne $rev "default") }}-{{ $rev }}{{ end }}
{{- end }}

{{/* Labels of one service's objects; the selector is the name only.
     A revisioned service's carry its revision (istio.io/rev), as
     istiod-<revision>'s do. */}}
{{- define "flotilla.serviceLabels" -}}
{{ include "flotilla.labels" .root }}
app.kubernetes.io/name: flotilla-{{ .name }}
app.kubernetes.io/component: {{ .name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- if eq (include "flotilla.revisioned" .name) "true" }}
istio.io/rev: {{ include "flotilla.revision" .root }}
{{- end }}
{{- end }}

{{- define "flotilla.selector" -}}
app.kubernetes.io/name: flotilla-{{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* image: registry/flotilla-<name>:tag, each part overridable; the tag
     defaults to the chart's appVersion, the release the chart is of. */}}
{{- define "flotilla.image" -}}
{{- $v := index .root.Values .name -}}
{{- $repo := $v.image.repository | default (printf "flotilla-%s" .name) -}}
{{- $reg := .root.Values.global.imageRegistry -}}
{{- $tag := $v.image.tag | default .root.Values.global.imageTag | default .root.Chart.AppVersion -}}
{{- if $reg }}{{ printf "%s/%s:%s" $reg $repo $tag }}{{ else }}{{ printf "%s:%s" $repo $tag }}{{ end -}}
{{- end }}

{{/* Service address inside the cluster (this release's revision's, for
     a revisioned service). */}}
{{- define "flotilla.address" -}}
{{ include "flotilla.fullname" . }}.{{ .root.Release.Namespace }}.svc:{{ .port }}
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
{{- with (include "flotilla.scheduling" (dict "root" .root "v" $v "key" .name "selector" (fromYaml (include "flotilla.selector" .))) | trim) }}
{{ . }}
{{- end }}
{{- end }}

{{/* Where a service's or gateway's pods run: nodeSelector, tolerations,
     affinity with the anti-affinity preset, topology spread, priority.
     Called with (dict "root" $ "v" <its values> "key" <its values' path>
     "selector" <its pods' selector labels>). */}}
{{- define "flotilla.scheduling" -}}
{{- $v := .v -}}
{{- with $v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with (include "flotilla.affinity" .) }}
affinity:
{{ . | indent 2 }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range . }}
{{- /* A constraint without a labelSelector counts this Deployment's pods. */}}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}{{ $_ := set $c "labelSelector" (dict "matchLabels" $.selector) }}{{ end }}
- {{ toJson $c }}
{{- end }}
{{- end }}
{{- end }}

{{/* affinity: the values' own, plus the podAntiAffinityPreset (soft: prefer
     nodes without another pod of the same Deployment, so one node's loss
     takes one replica; hard: require it; none). A preset and an own
     podAntiAffinity together are refused: one would silently win. */}}
{{- define "flotilla.affinity" -}}
{{- $v := .v -}}
{{- $aff := deepCopy ($v.affinity | default dict) -}}
{{- $preset := $v.podAntiAffinityPreset | default "soft" -}}
{{- if ne $preset "none" -}}
{{- if hasKey $aff "podAntiAffinity" -}}
{{- fail (printf "%s.affinity.podAntiAffinity is set and so is %s.podAntiAffinityPreset=%s: set %s.podAntiAffinityPreset=none to use your own" .key .key $preset .key) -}}
{{- end -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" .selector) -}}
{{- if eq $preset "hard" -}}
{{- $_ := set $aff "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- else -}}
{{- $_ := set $aff "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- end -}}
{{- end -}}
{{- if $aff }}{{ toYaml $aff }}{{ end -}}
{{- end }}

{{/* The pod template's labels and annotations: the chart's, then the
     values' podLabels and podAnnotations. A pod label may not replace one
     the chart sets (the selector and the Service select on them); the
     control plane's pods are never injected. Prometheus scrape
     annotations name the metrics port and path (podAnnotations may
     change them, or set prometheus.io/scrape: "false"). Called with
     (dict "v" <its values> "key" <path> "labels" <the chart's labels>
     "metricsPort" <port> "metricsPath" <path>). */}}
{{- define "flotilla.podMetadata" -}}
{{- $labels := deepCopy .labels -}}
{{- range $k, $val := (.v.podLabels | default dict) -}}
{{- if hasKey $.labels $k -}}
{{- fail (printf "%s.podLabels.%s: the chart sets that label (the Deployment's selector and the Service select on it)" $.key $k) -}}
{{- end -}}
{{- $_ := set $labels $k $val -}}
{{- end -}}
{{- $ann := dict "prometheus.io/scrape" "true" "prometheus.io/port" (toString .metricsPort) "prometheus.io/path" .metricsPath -}}
{{- range $k, $val := (.v.podAnnotations | default dict) -}}
{{- if eq $k "sidecar.istio.io/inject" -}}
{{- fail (printf "%s.podAnnotations.%s: the control plane's and gateways' pods are never injected" $.key $k) -}}
{{- end -}}
{{- $_ := set $ann $k $val -}}
{{- end -}}
{{- $_ := set $ann "sidecar.istio.io/inject" "false" -}}
labels:
{{ toYaml $labels | indent 2 }}
annotations:
{{ toYaml $ann | indent 2 }}
{{- end }}

{{/* A Deployment's replicas and rollout: replicaCount when the service has
     no autoscaler; with one, the autoscaler alone decides, and a
     replicaCount given too is refused rather than silently dropped.
     Rollouts surge as Istio's do (maxSurge 100 %, maxUnavailable 25 %)
     unless rollingUpdate says otherwise. Called with (dict "v" <its
     values> "key" <path>). */}}
{{- define "flotilla.replicasAndStrategy" -}}
{{- $v := .v -}}
{{- if $v.autoscaling.enabled -}}
{{- if hasKey $v "replicaCount" -}}
{{- fail (printf "%s.replicaCount=%v is set, but %s.autoscaling.enabled is true, so the autoscaler decides the replicas (%s.autoscaling.minReplicas to maxReplicas): set %s.autoscaling.enabled=false to fix the count, or set minReplicas" .key $v.replicaCount .key .key .key) -}}
{{- end -}}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) -}}
{{- fail (printf "%s.autoscaling.minReplicas=%v is above maxReplicas=%v" .key $v.autoscaling.minReplicas $v.autoscaling.maxReplicas) -}}
{{- end -}}
{{- else }}
replicas: {{ include "flotilla.replicaCount" $v }}
{{- end }}
{{- /* Set key by key: merge would take a 0 for unset. */ -}}
{{- $ru := dict "maxSurge" "100%" "maxUnavailable" "25%" }}
{{- range $k, $val := ($v.rollingUpdate | default dict) }}{{ $_ := set $ru $k $val }}{{ end }}
{{- if and (has (toString $ru.maxSurge) (list "0" "0%")) (has (toString $ru.maxUnavailable) (list "0" "0%")) }}
{{- fail (printf "%s.rollingUpdate: maxSurge and maxUnavailable are both 0, so a rollout could never start: allow one of them" .key) }}
{{- end }}
strategy:
  type: RollingUpdate
  rollingUpdate: {{ toJson $ru }}
{{- end }}

{{/* A service's or gateway's replicaCount (called with its values):
     2 when not given. */}}
{{- define "flotilla.replicaCount" -}}
{{ .replicaCount | default 2 }}
{{- end }}

{{/* The fewest replicas a service runs: replicaCount, or the autoscaler's
     minReplicas. */}}
{{- define "flotilla.minReplicas" -}}
{{- if .v.autoscaling.enabled }}{{ .v.autoscaling.minReplicas }}{{ else }}{{ include "flotilla.replicaCount" .v }}{{ end -}}
{{- end }}

{{/* The values' env (name: value) as container env, sorted; a name the
     chart sets for the container (.set) is refused. */}}
{{- define "flotilla.extraEnv" -}}
{{- $env := .v.env | default dict -}}
{{- range $k := keys $env | sortAlpha }}
{{- if has $k ($.set | default list) -}}
{{- fail (printf "%s.env.%s: the chart sets that variable" $.key $k) -}}
{{- end }}
- {name: {{ $k | quote }}, value: {{ index $env $k | toString | quote }}}
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
{{- with (include "flotilla.extraEnv" (dict "v" $v "key" .name)) }}
env:
{{- . }}
{{- end }}
{{- /* No GOMEMLIMIT here: each service gives the Go runtime 90 % of its
container's memory limit itself, read from its cgroup (as istiod does),
which leaves room for what the runtime does not count; env may set one. */}}
{{- end }}

{{/* The shared flags. */}}
{{- define "flotilla.commonArgs" -}}
- --admin-address=:{{ .admin }}
- --log-level={{ .root.Values.global.logLevel }}
- --log-format={{ .root.Values.global.logFormat }}
{{- end }}

{{/* PodDisruptionBudget and HorizontalPodAutoscaler of a service. */}}
{{- define "flotilla.scaling" -}}
{{ include "flotilla.budgetAndAutoscaler" (dict "root" .root "v" (index .root.Values .name) "key" .name "object" (include "flotilla.fullname" .) "labels" (include "flotilla.serviceLabels" .) "selector" (fromYaml (include "flotilla.selector" .))) }}
{{- end }}

{{/* PodDisruptionBudget and HorizontalPodAutoscaler of a Deployment.
     Called with (dict "root" $ "v" <its values> "key" <path> "object"
     <the Deployment's name> "labels" <metadata labels, YAML> "selector"
     <its pods' selector labels>). */}}
{{- define "flotilla.budgetAndAutoscaler" -}}
{{- $v := .v -}}
{{- $pdb := $v.podDisruptionBudget -}}
{{- if $pdb.enabled }}
{{- include "flotilla.checkBudget" . }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .object }}
  namespace: {{ .root.Release.Namespace }}
  labels:
{{ .labels | indent 4 }}
spec:
  {{- if hasKey $pdb "maxUnavailable" }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- else }}
  minAvailable: {{ $pdb.minAvailable }}
  {{- end }}
  selector:
    matchLabels:
{{ toYaml .selector | indent 6 }}
{{- end }}
{{- if $v.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ .object }}
  namespace: {{ .root.Release.Namespace }}
  labels:
{{ .labels | indent 4 }}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: {{ .object }}}
  minReplicas: {{ $v.autoscaling.minReplicas }}
  maxReplicas: {{ $v.autoscaling.maxReplicas }}
  metrics:
  - type: Resource
    resource:
      name: cpu
      target: {type: Utilization, averageUtilization: {{ $v.autoscaling.targetCPUUtilizationPercentage }}}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget no eviction can ever satisfy blocks every node
     drain (kubectl drain, cluster upgrades, the autoscaler's scale-down)
     for as long as it exists: refused. minAvailable percentages round up
     and maxUnavailable ones too, as the disruption controller counts
     them. maxUnavailable, when set, replaces minAvailable. */}}
{{- define "flotilla.checkBudget" -}}
{{- $pdb := .v.podDisruptionBudget -}}
{{- $min := int (include "flotilla.minReplicas" .) -}}
{{- $hint := printf "every node drain would be blocked: run more replicas (%s.replicaCount, or %s.autoscaling.minReplicas), allow one down with %s.podDisruptionBudget.maxUnavailable=1, or set %s.podDisruptionBudget.enabled=false" .key .key .key .key -}}
{{- if hasKey $pdb "maxUnavailable" -}}
{{- $m := toString $pdb.maxUnavailable -}}
{{- if or (eq $m "0") (eq $m "0%") -}}
{{- fail (printf "%s.podDisruptionBudget.maxUnavailable=%s: %s" .key $m $hint) -}}
{{- end -}}
{{- else -}}
{{- $m := toString $pdb.minAvailable -}}
{{- $blocks := false -}}
{{- if hasSuffix "%" $m -}}
{{- $p := int (trimSuffix "%" $m) -}}
{{- $blocks = gt (mul $min $p) (mul 100 (sub $min 1)) -}}
{{- else -}}
{{- $blocks = ge (int $m) $min -}}
{{- end -}}
{{- if $blocks -}}
{{- fail (printf "%s.podDisruptionBudget.minAvailable=%s with %d replica(s) at the fewest: %s" .key $m $min $hint) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The injection webhook configuration and ConfigMap, per revision
     (internal/inject.RevisionName). */}}
{{- define "flotilla.injectorWebhookName" -}}
{{- $rev := include "flotilla.revision" . -}}
flotilla-sidecar-injector{{ if ne $rev "default" }}-{{ $rev }}{{ end -}}
{{- end }}
{{- define "flotilla.injectionConfigMap" -}}
{{ include "flotilla.injectorWebhookName" . }}
{{- end }}

{{- define "flotilla.validatorName" -}}
flotilla-validator-{{ .Release.Namespace }}
{{- end }}

{{/* Istio's name for the revision's discovery Service (istiod, or
     istiod-<revision>: Istio's chart), which Istio's proxyv2 sidecars
     and pilot-agent's defaults connect to
     (internal/inject.IstiodAddress). */}}
{{- define "flotilla.istiodName" -}}
{{- $rev := include "flotilla.revision" . -}}
istiod{{ if ne $rev "default" }}-{{ $rev }}{{ end }}
{{- end }}

{{/* Whether the istiod Service is rendered: always when the injector
     adds Istio's proxyv2 sidecar (its pods connect to nothing else),
     else when discovery.istiodService.enabled asks for it. */}}
{{- define "flotilla.istiodService" -}}
{{- if or (eq .Values.injector.sidecar "proxyv2") .Values.discovery.istiodService.enabled }}true{{ end -}}
{{- end }}
