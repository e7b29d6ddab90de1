{{/*
Names. With the release "kvroute" every object has the kustomize base's name (kvroute,
kvroute-gossip, kvroute-cluster-secret, kvroute-dashboard); other releases prefix theirs, so two
releases fit in one namespace without sharing a mesh.
*/}}
{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Short enough that "<fullname>-sidecar-patch" (the longest suffix) stays a valid name. */}}
{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pods' identity: selectors of the Services, the PDB, the NetworkPolicy and the PodMonitor. */}}
{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvroute.labels" -}}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "kvroute.gossipService" -}}
{{- printf "%s-gossip" (include "kvroute.fullname" .) -}}
{{- end -}}

{{- define "kvroute.secretName" -}}
{{- default (printf "%s-cluster-secret" (include "kvroute.fullname" .)) .Values.clusterSecret.existingSecret -}}
{{- end -}}

{{- define "kvroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}

{{/*
The KV-event wiring, fixed on both sides: vLLM binds tcp://*:5557 (replay 5558) and the sidecar
dials 127.0.0.1; the topic starts with the sidecar's --kv-events-topic. Written out rather than
built with toJson, which would reorder the keys and so differ from the kustomize base.
*/}}
{{- define "kvroute.kvEventsConfig" -}}
--kv-events-config={"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@$(POD_NAME)@$(MODEL)"}
{{- end -}}

{{/* Pod labels and annotations, shared by the Deployment and the sidecar patch. */}}
{{- define "kvroute.podLabels" -}}
{{ include "kvroute.selectorLabels" . }}
{{- with .Values.deployment.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kvroute.podAnnotations" -}}
{{- $a := dict -}}
{{- if .Values.metrics.podAnnotations -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" "9090" -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- $a = merge (deepCopy .Values.deployment.podAnnotations) $a -}}
{{- if $a }}{{ toYaml $a }}{{ end -}}
{{- end -}}

{{/*
The native sidecar: an init container with restartPolicy Always, started before vLLM and stopped
after it, so it finishes the streams it proxies to peers. One definition for the Deployment and
the patch, so an injected sidecar is exactly the chart's own.
*/}}
{{- define "kvroute.sidecar" -}}
{{- $full := include "kvroute.fullname" . -}}
{{- $args := list "serve" "--listen=:8000" "--admin-listen=:9090" "--vllm-url=http://127.0.0.1:8001"
  "--kv-events-endpoint=tcp://127.0.0.1:5557" "--kv-events-replay-endpoint=tcp://127.0.0.1:5558"
  "--kv-events-topic=kv@$(POD_NAME)@" "--node-name=$(POD_NAME)" "--advertise-addr=$(POD_IP)"
  "--gossip-port=7946"
  (printf "--join=%s.$(POD_NAMESPACE).svc:7946" (include "kvroute.gossipService" .))
  "--cluster-secret-file=/etc/kvroute/cluster/secret"
  (printf "--cluster-label=kvroute/$(POD_NAMESPACE)/%s" $full)
  (printf "--drain-timeout=%s" .Values.sidecar.drainTimeout) -}}
{{- $args = concat $args .Values.sidecar.extraArgs -}}
- name: kvroute
  image: {{ include "kvroute.image" .Values.sidecar.image }}
  {{- with .Values.sidecar.image.pullPolicy }}
  imagePullPolicy: {{ . }}
  {{- end }}
  restartPolicy: Always
  args:
  {{- toYaml $args | nindent 2 }}
  env:
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  - name: GOMEMLIMIT
    valueFrom:
      resourceFieldRef:
        containerName: kvroute
        resource: limits.memory
  - name: KVROUTE_LOG_LEVEL
    value: {{ .Values.sidecar.logLevel | quote }}
  {{- with .Values.sidecar.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  ports:
  - name: http
    containerPort: 8000
    protocol: TCP
  - name: admin
    containerPort: 9090
    protocol: TCP
  - name: gossip-tcp
    containerPort: 7946
    protocol: TCP
  - name: gossip-udp
    containerPort: 7946
    protocol: UDP
  # Liveness is the process and its HTTP loop only, never vLLM, ZMQ or peers. No startupProbe:
  # vLLM starts as soon as the sidecar has started.
  livenessProbe:
    httpGet:
      path: /livez
      port: admin
    periodSeconds: 10
    timeoutSeconds: 2
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: 5
    timeoutSeconds: 2
    failureThreshold: 2
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  # kube-proxy drops a terminating pod from the Services a moment after the deletion: keep
  # listening, so the last connections still find a sidecar, which sends them to a peer.
  lifecycle:
    preStop:
      sleep:
        seconds: 5
  volumeMounts:
  - name: cluster-secret
    mountPath: /etc/kvroute/cluster
    readOnly: true
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
{{- end -}}

{{/*
vLLM's preStop: the sidecar drains on this GET (an httpGet hook can only GET). The port is a
number because the kubelet resolves a named port in the hook's own container.
*/}}
{{- define "kvroute.drainHook" -}}
preStop:
  httpGet:
    path: /drain/prestop
    port: 9090
{{- end -}}

{{/* Not optional: without the secret the pod does not start, rather than run an open mesh. */}}
{{- define "kvroute.secretVolume" -}}
- name: cluster-secret
  secret:
    secretName: {{ include "kvroute.secretName" . }}
    optional: false
    defaultMode: 0440
    items:
    - key: {{ .Values.clusterSecret.key }}
      path: secret
{{- end -}}

{{/* Settings that only make sense together; the schema checks each value alone. */}}
{{- define "kvroute.validate" -}}
{{- if and (not .Values.deployment.create) (not .Values.existingDeployment.name) -}}
{{- fail "deployment.create=false needs existingDeployment.name: the vLLM Deployment to inject the sidecar into" -}}
{{- end -}}
{{- if and .Values.plainService.enabled (eq .Values.plainService.name (include "kvroute.fullname" .)) -}}
{{- fail "plainService.name must differ from the kvroute Service's name" -}}
{{- end -}}
{{- $drain := .Values.sidecar.drainTimeout | trimSuffix "s" | int -}}
{{- if lt (int .Values.deployment.terminationGracePeriodSeconds) (add $drain 30) -}}
{{- fail (printf "deployment.terminationGracePeriodSeconds=%v must cover sidecar.drainTimeout=%s plus 30 s for vLLM's and the sidecar's exits" .Values.deployment.terminationGracePeriodSeconds .Values.sidecar.drainTimeout) -}}
{{- end -}}
{{- end -}}

{{/*
The patch for existingDeployment. Strategic merge keys containers and volumes by name, so the
vLLM container keeps its image, args and env and only gains the hook.
*/}}
{{- define "kvroute.sidecarPatch" -}}
spec:
  template:
    metadata:
      labels:
        {{- include "kvroute.podLabels" . | nindent 8 }}
      {{- with include "kvroute.podAnnotations" . }}
      annotations:
        {{- . | nindent 8 }}
      {{- end }}
    spec:
      terminationGracePeriodSeconds: {{ .Values.deployment.terminationGracePeriodSeconds }}
      securityContext:
        fsGroup: 65532
      initContainers:
      # Removes the sidecar that an earlier application injected, then adds this one whole:
      # merged, its ports would pair by number and the two gossip ports (7946 TCP and UDP)
      # would collapse into one, and settings an upgrade removed would stay.
      - name: kvroute
        $patch: delete
      {{- include "kvroute.sidecar" . | nindent 6 }}
      containers:
      - name: {{ .Values.existingDeployment.container }}
        # Replaces a preStop hook of the container's own (a hook has one handler): the drain
        # must run before vLLM stops. ($patch: replace would drop a hook the container lacks.)
        lifecycle:
          preStop:
            exec: null
            sleep: null
            tcpSocket: null
            {{- include "kvroute.drainHook" . | trimPrefix "preStop:\n" | nindent 10 }}
      volumes:
      {{- include "kvroute.secretVolume" . | nindent 6 }}
{{- end -}}

{{/* The NetworkPolicy's "from" for the API: nothing (every pod) or the kvroute pods plus apiFrom. */}}
{{- define "kvroute.apiFrom" -}}
{{- with .Values.networkPolicy.apiFrom -}}
from:
- podSelector:
    matchLabels:
      {{- include "kvroute.selectorLabels" $ | nindent 6 }}
{{ toYaml . }}
{{- end -}}
{{- end -}}
