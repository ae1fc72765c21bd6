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

{{/* The agentrun image: repository@digest when image.digest is set, else repository:tag. */}}
{{- define "agentrun.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The workers' image: worker.image's digest or tag when set (an upgrade rolls the operator
first), else the agentrun image. */}}
{{- define "agentrun.workerImage" -}}
{{- $worker := .Values.worker.image | default dict -}}
{{- if $worker.digest -}}
{{- printf "%s@%s" .Values.image.repository $worker.digest -}}
{{- else if $worker.tag -}}
{{- printf "%s:%s" .Values.image.repository $worker.tag -}}
{{- else -}}
{{- include "agentrun.image" . -}}
{{- end -}}
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

{{/* The NATS image of the in-cluster server (nats.install). */}}
{{- define "agentrun.natsImage" -}}
{{- $image := .Values.nats.install.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}
{{- end -}}

{{/* Name of the in-cluster NATS Service and StatefulSet. */}}
{{- define "agentrun.natsName" -}}
{{- printf "%s-nats" (include "agentrun.fullname" .) -}}
{{- end -}}

{{/*
The NATS URL the operator and the workers use (AGENTRUN_NATS_URL): the in-cluster server's
Service when nats.install.enabled, else nats.url (an existing NATS with JetStream).
*/}}
{{- define "agentrun.natsURL" -}}
{{- if .Values.nats.install.enabled -}}
{{- printf "%s://%s.%s.svc:4222" (ternary "tls" "nats" .Values.nats.tls.enabled) (include "agentrun.natsName" .) .Release.Namespace -}}
{{- else -}}
{{- required "nats.url is required unless nats.install.enabled" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/*
host:port of the NATS monitoring endpoint (/jsz), which KEDA's nats-jetstream scaler reads:
the in-cluster server's Service, else nats.monitoringEndpoint.
*/}}
{{- define "agentrun.natsMonitoringEndpoint" -}}
{{- if .Values.nats.install.enabled -}}
{{- printf "%s-monitor.%s.svc:8222" (include "agentrun.natsName" .) .Release.Namespace -}}
{{- else -}}
{{- required "nats.monitoringEndpoint (host:port of the NATS monitoring port) is required for worker.autoscaling.keda unless nats.install.enabled" .Values.nats.monitoringEndpoint -}}
{{- end -}}
{{- end -}}

{{/* Whether an autoscaler owns the worker Deployment's replica count. */}}
{{- define "agentrun.workerAutoscaled" -}}
{{- if and .Values.worker.autoscaling.keda.enabled .Values.worker.autoscaling.hpa.enabled -}}
{{- fail "worker.autoscaling: enable keda or hpa, not both (both would scale the same Deployment)" -}}
{{- end -}}
{{- if or .Values.worker.autoscaling.keda.enabled .Values.worker.autoscaling.hpa.enabled -}}true{{- end -}}
{{- end -}}

{{/*
The closed bus (nats.auth, nats.tls). Secrets: <natsName>-keys (the seeds, mounted nowhere),
<natsName>-server (the installed server's auth.conf and account.pub), <natsName>-operator and
<natsName>-worker (each role's nats.creds), made by the bootstrap hook; <natsName>-tls (tls.crt,
tls.key, ca.crt), made by the chart or cert-manager. Each may be brought instead.
*/}}
{{- define "agentrun.natsCredsSecret" -}}
{{- $given := index .root.Values.nats.auth (printf "%sSecret" .role) -}}
{{- default (printf "%s-%s" (include "agentrun.natsName" .root) .role) $given -}}
{{- end -}}

{{- define "agentrun.natsTLSSecret" -}}
{{- default (printf "%s-tls" (include "agentrun.natsName" .)) .Values.nats.tls.existingSecret -}}
{{- end -}}

{{/*
Name of the installed NATS server's auth Secret (auth.conf, account.pub): nats.auth.serverSecret,
else <natsName>-server, made by the bootstrap hook.
*/}}
{{- define "agentrun.natsServerSecret" -}}
{{- default (printf "%s-server" (include "agentrun.natsName" .)) .Values.nats.auth.serverSecret -}}
{{- end -}}

{{/*
Whether the bootstrap hook runs: auth on and a Secret the release mounts not given (a role's
credentials, or the installed server's auth configuration). A server Secret brought without
both roles' credentials is refused: the hook would mint users its keys' server cannot trust.
*/}}
{{- define "agentrun.natsBootstrap" -}}
{{- $auth := .Values.nats.auth -}}
{{- $rolesGiven := and $auth.operatorSecret $auth.workerSecret -}}
{{- if and $auth.enabled .Values.nats.install.enabled $auth.serverSecret (not $rolesGiven) -}}
{{- fail "nats.auth.serverSecret: bring nats.auth.operatorSecret and nats.auth.workerSecret with it, made by the same `agentrun nats bootstrap` (the server trusts only the users of the keys that made its auth.conf)" -}}
{{- end -}}
{{- $serverMissing := and .Values.nats.install.enabled (not $auth.serverSecret) -}}
{{- if and $auth.enabled (or (not $rolesGiven) $serverMissing) -}}true{{- end -}}
{{- end -}}

{{/* The DNS names the NATS server's certificate carries. */}}
{{- define "agentrun.natsDNSNames" -}}
{{- $name := include "agentrun.natsName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.cluster.local" $name $ns) (printf "*.%s-headless.%s.svc" $name $ns) (printf "*.%s-headless.%s.svc.cluster.local" $name $ns) | toJson -}}
{{- end -}}

{{/*
The NATS credentials and CA of a role's pods: env entries, volume mounts and volumes. Call with
(dict "root" $ "role" "operator"|"worker").
*/}}
{{- define "agentrun.natsEnv" -}}
{{- if .root.Values.nats.auth.enabled }}
- name: AGENTRUN_NATS_CREDS_FILE
  value: /var/run/agentrun/nats/nats.creds
{{- end }}
{{- if .root.Values.nats.tls.enabled }}
- name: AGENTRUN_NATS_CA_FILE
  value: /var/run/agentrun/nats-ca/ca.crt
{{- end }}
{{- end -}}

{{- define "agentrun.natsMounts" -}}
{{- if .root.Values.nats.auth.enabled }}
- name: nats-creds
  mountPath: /var/run/agentrun/nats
  readOnly: true
{{- end }}
{{- if .root.Values.nats.tls.enabled }}
- name: nats-ca
  mountPath: /var/run/agentrun/nats-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "agentrun.natsVolumes" -}}
{{- if .root.Values.nats.auth.enabled }}
- name: nats-creds
  secret:
    secretName: {{ include "agentrun.natsCredsSecret" . }}
{{- end }}
{{- if .root.Values.nats.tls.enabled }}
- name: nats-ca
  secret:
    secretName: {{ include "agentrun.natsTLSSecret" .root }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}

{{/*
The Secret KEDA reads the workers' account from (its key account.pub), when the closed bus
(nats.auth) leaves worker.autoscaling.keda.account at "$G": agentrun.natsServerSecret, which
the bootstrap hook writes (whenever it runs, with or without nats.install) or which is brought
as nats.auth.serverSecret. KEDA resolves it through a TriggerAuthentication each time it builds
the scaler, so no render has to find it. Empty: the account given (or "$G", right for an open
bus) goes in the trigger's metadata. For an existing NATS with its credentials brought, the
Secret must be named (nats.auth.serverSecret) or found under agentrun.natsServerSecret's name
(`agentrun nats bootstrap --prefix <fullname>-nats` makes it so, and earlier charts read it
there); else the render fails, naming both ways.
*/}}
{{- define "agentrun.kedaAccountSecret" -}}
{{- $auth := .Values.nats.auth -}}
{{- if and $auth.enabled (eq .Values.worker.autoscaling.keda.account "$G") -}}
{{- $known := or .Values.nats.install.enabled $auth.serverSecret (include "agentrun.natsBootstrap" .) -}}
{{- if not (or $known (lookup "v1" "Secret" .Release.Namespace (include "agentrun.natsServerSecret" .))) -}}
{{- fail (printf "worker.autoscaling.keda.account: with an existing NATS server and its credentials brought, give the public key of the account agentrun's streams are in (account.pub of the Secrets `agentrun nats bootstrap` made), or name its -server Secret in nats.auth.serverSecret (or keep it as %s in this namespace) for KEDA to read account.pub from" (include "agentrun.natsServerSecret" .)) -}}
{{- end -}}
{{- include "agentrun.natsServerSecret" . -}}
{{- end -}}
{{- end -}}

{{/*
What a component's pod template adds from its values (operator, worker): labels beside the
chart's, annotations, priorityClassName, topology spread (each constraint's labelSelector
defaults to the component's own pods). Call with (dict "root" $ "component" "worker").
*/}}
{{- define "agentrun.podLabels" -}}
{{- with (index .root.Values .component).podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "agentrun.podScheduling" -}}
{{- $values := index .root.Values .component -}}
{{- with $values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
{{- $own := dict "labelSelector" (dict "matchLabels" (include "agentrun.selectorLabels" (dict "root" $.root "component" $.component) | fromYaml)) }}
{{- $constraints := list }}
{{- range . }}
{{- $constraints = append $constraints (ternary . (merge (deepCopy .) $own) (hasKey . "labelSelector")) }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The workers' egress rules (NetworkPolicyEgressRule list) when networkPolicy.workerEgress
is enabled: DNS, NATS (the installed server, else networkPolicy.workerEgress.nats on the port
of nats.url), the scripted model, the API server's endpoints, then extraRules.
*/}}
{{- define "agentrun.workerEgressRules" -}}
{{- $egress := .Values.networkPolicy.workerEgress -}}
{{- if not $egress.apiServer.cidrs -}}
{{- fail "networkPolicy.workerEgress.apiServer.cidrs: list the API server's endpoint addresses (kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes), or the workers cannot read AgentModels and Secrets" -}}
{{- end -}}
{{- if $egress.dns }}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end }}
{{- if .Values.nats.install.enabled }}
- to:
    - podSelector:
        matchLabels:
          {{- include "agentrun.selectorLabels" (dict "root" . "component" "nats") | nindent 10 }}
  ports:
    - port: 4222
      protocol: TCP
{{- else }}
{{- if not $egress.nats -}}
{{- fail "networkPolicy.workerEgress.nats: name the peers of the NATS at nats.url (e.g. [{ipBlock: {cidr: 10.0.0.5/32}}] or a namespaceSelector), or the workers cannot reach it" -}}
{{- end }}
{{- $hostPort := (urlParse .Values.nats.url).host }}
- to:
    {{- toYaml $egress.nats | nindent 4 }}
  ports:
    - port: {{ regexFind "[0-9]+$" (regexFind ":[0-9]+$" $hostPort) | default "4222" | int }}
      protocol: TCP
{{- end }}
{{- if .Values.mockModel.enabled }}
- to:
    - podSelector:
        matchLabels:
          {{- include "agentrun.selectorLabels" (dict "root" . "component" "mock-model") | nindent 10 }}
  ports:
    - port: {{ int .Values.mockModel.port }}
      protocol: TCP
{{- end }}
- to:
    {{- range $egress.apiServer.cidrs }}
    - ipBlock:
        cidr: {{ . | quote }}
    {{- end }}
  ports:
    - port: {{ int $egress.apiServer.port }}
      protocol: TCP
{{- with $egress.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The JetStream file store's size in bytes, for the store-filling alert
(AGENTRUN_JETSTREAM_STORE_BYTES): nats.install.maxFileStore in NATS's units (1K = 1000,
1KB = 1024, up to T/TB) when the chart runs NATS, else nats.storeBytes; 0 when unknown.
*/}}
{{- define "agentrun.natsStoreBytes" -}}
{{- if .Values.nats.install.enabled -}}
{{- $text := upper (toString .Values.nats.install.maxFileStore) -}}
{{- $digits := regexFind "^[0-9]+" $text -}}
{{- $unit := trimPrefix $digits $text -}}
{{- $powers := dict "" 0 "K" 1 "M" 2 "G" 3 "T" 4 -}}
{{- if or (not $digits) (not (hasKey $powers (trimSuffix "B" $unit))) -}}
{{- fail (printf "nats.install.maxFileStore %q: a number with an optional unit K, KB, M, MB, G, GB, T or TB" .Values.nats.install.maxFileStore) -}}
{{- end -}}
{{- $bytes := int64 $digits -}}
{{- $base := ternary 1024 1000 (hasSuffix "B" $unit) -}}
{{- range until (int (get $powers (trimSuffix "B" $unit))) }}{{ $bytes = mul $bytes $base }}{{ end -}}
{{- $bytes -}}
{{- else -}}
{{- int64 .Values.nats.storeBytes -}}
{{- end -}}
{{- end -}}

{{/*
The run-signing keys (runSigning): <fullname>-signing (signing.json, the operator's private
keys) and <fullname>-trust (trust.json, the public keys every process trusts), made by the
run-signing hook unless both are brought. One brought without the other is refused: the hook
would make keys the brought one does not hold.
*/}}
{{- define "agentrun.signingSecret" -}}
{{- default (printf "%s-signing" (include "agentrun.fullname" .)) .Values.runSigning.signingSecret -}}
{{- end -}}

{{- define "agentrun.trustSecret" -}}
{{- default (printf "%s-trust" (include "agentrun.fullname" .)) .Values.runSigning.trustSecret -}}
{{- end -}}

{{- define "agentrun.runSigningBootstrap" -}}
{{- $given := .Values.runSigning -}}
{{- if and (or $given.signingSecret $given.trustSecret) (not (and $given.signingSecret $given.trustSecret)) -}}
{{- fail "runSigning: bring signingSecret and trustSecret together, made by the same `agentrun signing bootstrap` (the trust file must hold every signing key)" -}}
{{- end -}}
{{- if not $given.signingSecret -}}true{{- end -}}
{{- end -}}

{{/* The run-signing env and mounts: the trust file for every process, the signing file for
the operator (role "operator"). */}}
{{- define "agentrun.runKeysEnv" -}}
- name: AGENTRUN_RUN_TRUST_FILE
  value: /var/run/agentrun/run-trust/trust.json
{{- if eq .role "operator" }}
- name: AGENTRUN_RUN_SIGNING_FILE
  value: /var/run/agentrun/run-signing/signing.json
{{- end }}
{{- end -}}

{{- define "agentrun.runKeysMounts" -}}
- name: run-trust
  mountPath: /var/run/agentrun/run-trust
  readOnly: true
{{- if eq .role "operator" }}
- name: run-signing
  mountPath: /var/run/agentrun/run-signing
  readOnly: true
{{- end }}
{{- end -}}

{{- define "agentrun.runKeysVolumes" -}}
- name: run-trust
  secret:
    secretName: {{ include "agentrun.trustSecret" .root }}
    items:
      - key: trust.json
        path: trust.json
{{- if eq .role "operator" }}
- name: run-signing
  secret:
    secretName: {{ include "agentrun.signingSecret" .root }}
    items:
      - key: signing.json
        path: signing.json
{{- end }}
{{- end -}}

{{/*
The maxConcurrentTurns of tenants that set none: operator.defaultMaxConcurrentTurns, or three
quarters of the workers' slots (worker.concurrency × replicas), at least 1. With KEDA, which
scales on the turns held, the slots at maxReplicas; with the CPU-based HPA, which does not
scale for turns that wait on tool calls, the slots at minReplicas.
*/}}
{{- define "agentrun.defaultTurnCap" -}}
{{- $given := .Values.operator.defaultMaxConcurrentTurns -}}
{{- if kindIs "invalid" $given -}}
{{- $scaling := .Values.worker.autoscaling -}}
{{- $replicas := int .Values.worker.replicas -}}
{{- if $scaling.keda.enabled -}}
{{- $replicas = int $scaling.keda.maxReplicas -}}
{{- else if $scaling.hpa.enabled -}}
{{- $replicas = int $scaling.hpa.minReplicas -}}
{{- end -}}
{{- max 1 (div (mul $replicas (int .Values.worker.concurrency) 3) 4) -}}
{{- else -}}
{{- int $given -}}
{{- end -}}
{{- end -}}

{{/*
Servers that keep each stream and KV bucket (AGENTRUN_NATS_REPLICAS): nats.jetstream.replicas,
or when it is 0, the installed servers (nats.install.replicas, at most 3) or 1 with nats.url.
More than the installed servers fails the render.
*/}}
{{- define "agentrun.natsReplicas" -}}
{{- $install := .Values.nats.install -}}
{{- $servers := ternary (int $install.replicas) 0 $install.enabled -}}
{{- $replicas := int .Values.nats.jetstream.replicas -}}
{{- if eq $replicas 0 -}}
{{- $replicas = ternary (min $servers 3) 1 $install.enabled -}}
{{- else if and $install.enabled (gt $replicas $servers) -}}
{{- fail (printf "nats.jetstream.replicas %d: more than the %d NATS servers of nats.install.replicas (JetStream refuses a stream kept by more servers than it has)" $replicas $servers) -}}
{{- end -}}
{{- $replicas -}}
{{- end -}}

{{/*
The installed NATS servers' route URLs, one per pod (nats-route://route:<password>@<pod>.<headless
Service>.<namespace>.svc:6222), as a JSON list. Call with (dict "root" $ "password" $password).
*/}}
{{- define "agentrun.natsRoutes" -}}
{{- $name := include "agentrun.natsName" .root -}}
{{- $routes := list -}}
{{- range $i := until (int .root.Values.nats.install.replicas) -}}
{{- $routes = append $routes (printf "nats-route://route:%s@%s-%d.%s-headless.%s.svc:6222" $.password $name $i $name $.root.Release.Namespace) -}}
{{- end -}}
{{- $routes | toJson -}}
{{- end -}}

{{/* True when the chart runs NATS as a cluster (nats.install with more than one server). */}}
{{- define "agentrun.natsClustered" -}}
{{- if and .Values.nats.install.enabled (gt (int .Values.nats.install.replicas) 1) -}}true{{- end -}}
{{- end -}}
