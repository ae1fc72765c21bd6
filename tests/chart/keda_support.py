"""KEDA's nats-jetstream scaler read in Python, to check the chart's ScaledObject against real
nats-servers without running KEDA (imported by name; pytest puts this folder on sys.path).

What belongs here: what KEDA (``chart_support.KEDA_VERSION``, ``pkg/scalers/
nats_jetstream_scaler.go`` and the builder in ``pkg/scaling``) does with a ``nats-jetstream``
trigger — the authParams it resolves from a TriggerAuthentication's ``secretTargetRef`` when
it builds the scaler, the metadata it parses, the URLs it builds, the JSON fields it decodes,
how it finds the consumer's leader on a cluster and keeps it between polls, the lag and
activity it reports — and the replica count the HorizontalPodAutoscaler that KEDA makes
derives from that lag. HTTP and Secrets
are injected (`Fetch`, `ReadSecret`), so a test decides what each URL reaches (the pod network
KEDA's pod would see) and which Secrets exist (an API server). No KEDA code runs here:
`SOURCE_FACTS` are the statements of KEDA's source this module follows, which a test finds in
that source, so a KEDA upgrade that changes one of them fails there.

How KEDA builds the scaler (``buildScalers``, ``resolveAuthRef``; built again at every poll or
reconcile that finds none built, so a Secret made after the ScaledObject is read then): the
trigger's ``authenticationRef`` names a TriggerAuthentication in the ScaledObject's namespace;
each of its ``secretTargetRef`` entries sets the authParam ``parameter`` to the named Secret's
``key`` ("" when the Secret, the key or the TriggerAuthentication is missing: KEDA logs it and
goes on). A parameter whose tag says ``order=authParams;triggerMetadata`` (account, accountID,
natsServerMonitoringEndpoint) takes the first of the two that is non-empty once trimmed.
Neither account nor accountID: the build fails, "no account name or id given".

What KEDA's scaler does, for one poll (``GetMetricsAndActivity``):

1. GET ``<scheme>://<natsServerMonitoringEndpoint>/jsz?acc=<accountID>&config=true&consumers=true``
   (``accountID`` defaults to ``account``; scheme ``https`` with ``useHttps``), or the consumer
   leader's URL of that form once one is known.
2. In the answer, the account whose ``id`` is accountID or whose ``name`` is account, its
   ``stream_detail`` entry named ``stream`` and that stream's ``consumer_detail`` entry named
   ``consumer``; ``meta_cluster.cluster_size`` is kept.
3. A leader known from the last poll and named again by this answer: done. Else, on a cluster
   (``cluster_size`` above 1): GET ``/varz`` of the endpoint, then for each of its
   ``connect_urls`` (the servers' client URLs; when empty, its ``cluster.urls``) take the
   host before the first ``:``, GET ``/varz`` of that host on the endpoint's port for its
   ``server_name`` and ``/jsz`` (the same query) there; the first server whose own answer names
   it the consumer's ``cluster.leader`` is the leader: its answer is used and its URL kept for
   the next poll. None: the poll fails, "leader node not found for consumer <consumer>".
4. The lag is that consumer's ``num_pending + num_ack_pending``: TurnRequests not yet
   delivered plus those delivered and not yet acknowledged. Active: lag above
   ``activationLagThreshold``. The metric (an external metric, in milli-units) goes to an HPA
   whose target is an ``AverageValue`` of ``lagThreshold``.
"""

from __future__ import annotations

import dataclasses
import math
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Fetch = Callable[[str], Any]
"""GET a URL and decode its JSON body (``(url) -> decoded JSON``); raises OSError when the URL
cannot be reached, ValueError when the body is not JSON."""

ReadSecret = Callable[[str, str], Mapping[str, str] | None]
"""``(namespace, name) -> the Secret's data`` (each key's value decoded), None when the Secret
does not exist: what KEDA's client gets from the API server."""

DEFAULT_LAG_THRESHOLD = 10
"""``lagThreshold`` when the trigger sets none (KEDA's ``default=10``)."""

SCALER_SOURCE = "pkg/scalers/nats_jetstream_scaler.go"

SCALER_FACTS = (
    # the trigger's metadata and its defaults
    'Account string `keda:"name=account, order=authParams;triggerMetadata, optional"`',
    'AccountID string `keda:"name=accountID, order=authParams;triggerMetadata, optional"`',
    'Stream string `keda:"name=stream, order=triggerMetadata"`',
    'Consumer string `keda:"name=consumer, order=triggerMetadata"`',
    'LagThreshold int64 `keda:"name=lagThreshold, order=triggerMetadata, default=10"`',
    'ActivationLagThreshold int64 `keda:"name=activationLagThreshold, order=triggerMetadata,'
    ' default=0"`',
    'UseHTTPS bool `keda:"name=useHttps, optional, order=triggerMetadata, default=false"`',
    'NatsServerEndpoint string `keda:"name=natsServerMonitoringEndpoint,'
    ' order=authParams;triggerMetadata"`',
    "if meta.AccountID == `` { meta.AccountID = meta.Account }",
    # the URLs
    'params.Set("acc", id) params.Set("consumers", "true") params.Set("config", "true")',
    'Path: "/jsz", RawQuery: params.Encode(),',
    'return fmt.Sprintf("%s://%s/varz", jsURL.Scheme, host), nil',
    'nodeHostname := strings.Split(clusterURL, ":")[0]',
    'node = strings.Split(clusterURL, ".")[0]',
    'Host: fmt.Sprintf("%s.%s", node, jsURL.Host),',
    'if port := jsURL.Port(); port != "" { nodeHostname = net.JoinHostPort(nodeHostname, port) }',
    # the JSON it decodes
    'Accounts []accountDetail `json:"account_details"`',
    'MetaCluster metaCluster `json:"meta_cluster"`',
    'ConnectUrls []string `json:"connect_urls"`',
    'Cluster jetStreamCluster `json:"cluster"`',
    'ServerName string `json:"server_name"`',
    'HostUrls []string `json:"urls"`',
    'ID string `json:"id"` Name string `json:"name"`'
    ' Streams []*streamDetail `json:"stream_detail"`',
    'ClusterSize int `json:"cluster_size"`',
    'Consumers []consumerDetail `json:"consumer_detail"`',
    'NumAckPending int `json:"num_ack_pending"`',
    'NumPending int `json:"num_pending"`',
    'Leader string `json:"leader"`',
    # which server it believes, and what it keeps between polls
    'if s.metadata.monitoringLeaderURL != "" { monitoringURL = s.metadata.monitoringLeaderURL }',
    'if cachedConsumerLeader != "" && !consumerFound {'
    " s.invalidateNATSJetStreamCachedMonitoringData() }",
    's.metadata.consumerLeader = "" s.metadata.monitoringLeaderURL = "" s.stream = nil',
    "stream: &streamDetail{},",
    'if consumerFound && cachedConsumerLeader != "" &&'
    " cachedConsumerLeader == s.metadata.consumerLeader { return nil }",
    "if s.metadata.clusterSize > 1 {",
    "if len(clusterUrls) == 0 { isNodeAdvertised = false",
    "if node == consumer.Cluster.Leader {"
    " s.setNATSJetStreamMonitoringData(jetStreamAccountResp, natsJetStreamMonitoringNodeURL)"
    " return nil }",
    'return fmt.Errorf("leader node not found for consumer %s", s.metadata.Consumer)',
    "return account.ID == metadata.AccountID || account.Name == metadata.Account",
    # the lag and the activity
    "return int64(consumer.NumPending + consumer.NumAckPending), nil",
    'return []external_metrics.ExternalMetricValue{}, false, errors.New("stream not found")',
    "return []external_metrics.ExternalMetricValue{metric}, totalLag >"
    " s.metadata.ActivationLagThreshold, nil",
    # no account from either source
    "if meta.Account == `` && meta.AccountID == `` {"
    " return natsJetStreamMetadata{}, fmt.Errorf(`no account name or id given`) }",
)
"""Statements of KEDA's nats-jetstream scaler this module does as written."""

BUILD_FACTS = {
    # the authParams of a TriggerAuthentication's secretTargetRef
    "pkg/scaling/resolver/scale_resolvers.go": (
        'logger.Error(err, "error getting triggerAuth",'
        ' "triggerAuthRef.Name", triggerAuthRef.Name)',
        'case "", "TriggerAuthentication": triggerAuth := &kedav1alpha1.TriggerAuthentication{}'
        " err := client.Get(ctx, types.NamespacedName{Name: triggerAuthRef.Name,"
        " Namespace: namespace}, triggerAuth)",
        "return &triggerAuth.Spec, namespace, nil",
        "if triggerAuthSpec.SecretTargetRef != nil {"
        " for _, e := range triggerAuthSpec.SecretTargetRef {"
        " result[e.Parameter] = resolveAuthSecret(ctx, client, logger, e.Name, triggerNamespace,"
        " e.Key, authClientSet.SecretLister) } }",
        'if name == "" || namespace == "" || key == "" {',
        "err = client.Get(ctx, types.NamespacedName{Name: name, Namespace: namespace}, secret)",
        'logger.Error(err, "error trying to get secret from namespace", "Secret.Namespace",'
        ' resolvedNamespace, "Secret.Name", name) return ""',
        'result := secret.Data[key] if result == nil { return "" } return string(result)',
    ),
    # which source a parameter comes from
    "pkg/scalers/scalersconfig/typed_config.go": (
        "for _, po := range params.Order {",
        "case AuthParams: m = sc.AuthParams",
        'param, ok := m[key] param = strings.TrimSpace(param) if ok && param != "" {'
        " return param, true }",
    ),
    # built with the trigger's authParams, and built again while none is built
    "pkg/scaling/scalers_builder.go": (
        "authParams, podIdentity, err := resolver.ResolveAuthRefAndPodIdentity(factoryCtx,"
        " h.client, logger, trigger.AuthenticationRef, podTemplateSpec, withTriggers.Namespace,"
        " h.authClientSet)",
        "config.AuthParams = authParams",
    ),
    "pkg/scaling/scale_handler.go": (
        "scalers, err := h.buildScalers(ctx, withTriggers, podTemplateSpec, containerName,"
        " asMetricSource) if err != nil { return nil, err }",
    ),
}
"""Statements of KEDA's scaler builder this module does as written, by file."""

SOURCE_FACTS: dict[str, tuple[str, ...]] = {SCALER_SOURCE: SCALER_FACTS, **BUILD_FACTS}
"""Every statement this module follows, by file of KEDA's module (compared with runs of
whitespace collapsed to one space)."""


class ScalerError(Exception):
    """A poll KEDA would fail: the scaler returns an error and reports no metric (the HPA
    then keeps the replica count it has; KEDA counts the failure toward the ScaledObject's
    ``fallback``, which the chart does not set)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Trigger:
    """A ``nats-jetstream`` trigger's metadata as KEDA parses it
    (``parseNATSJetStreamMetadata``)."""

    endpoint: str
    """``natsServerMonitoringEndpoint``: host:port of a NATS monitoring port."""
    account: str
    """``account``: the account's name (may be empty when accountID is given)."""
    account_id: str
    """``accountID``, else ``account``: what ``/jsz?acc=`` asks for."""
    stream: str
    consumer: str
    lag_threshold: int = DEFAULT_LAG_THRESHOLD
    """Target lag per replica (messages)."""
    activation_lag_threshold: int = 0
    """Lag above which the scaler reports itself active (messages)."""
    use_https: bool = False

    @classmethod
    def from_config(cls, metadata: Mapping[str, str], *, auth_params: Mapping[str, str]) -> Trigger:
        """The trigger of a ScaledObject's ``triggers[].metadata`` (string values) and the
        authParams KEDA resolved for it (`resolve_auth_params`; ``{}`` without an
        ``authenticationRef``): account, accountID and natsServerMonitoringEndpoint from the
        authParams first, then the metadata; every value trimmed, an empty one absent.

        Raises ScalerError, as KEDA's build of the scaler fails, when ``stream``, ``consumer``
        or ``natsServerMonitoringEndpoint`` is missing, neither ``account`` nor ``accountID``
        is given ("no account name or id given"), or a threshold is not an integer or
        ``useHttps`` not a boolean.
        """
        either = (auth_params, metadata)
        endpoint = _param("natsServerMonitoringEndpoint", either)
        stream, consumer = _param("stream", (metadata,)), _param("consumer", (metadata,))
        missing = [
            key
            for key, value in (
                ("natsServerMonitoringEndpoint", endpoint),
                ("stream", stream),
                ("consumer", consumer),
            )
            if not value
        ]
        if missing:
            raise ScalerError(f"missing required parameter(s) {missing}")
        account, account_id = _param("account", either), _param("accountID", either)
        if not account and not account_id:
            raise ScalerError("no account name or id given")
        try:
            lag = int(_param("lagThreshold", (metadata,)) or DEFAULT_LAG_THRESHOLD)
            activation = int(_param("activationLagThreshold", (metadata,)) or 0)
        except ValueError as err:
            raise ScalerError(f"a lag threshold is not an integer: {err}") from err
        https = (_param("useHttps", (metadata,)) or "false").lower()
        if https not in ("true", "false"):
            raise ScalerError(f"useHttps {https!r} is not a boolean")
        return cls(
            endpoint=endpoint,
            account=account,
            account_id=account_id or account,
            stream=stream,
            consumer=consumer,
            lag_threshold=lag,
            activation_lag_threshold=activation,
            use_https=https == "true",
        )


def resolve_auth_params(
    reference: Mapping[str, str] | None,
    *,
    authentications: Mapping[str, Mapping[str, Any]],
    namespace: str,
    read_secret: ReadSecret,
) -> dict[str, str]:
    """The authParams KEDA resolves for a trigger (``resolveAuthRef``): each ``secretTargetRef``
    entry ``{parameter, name, key}`` of the TriggerAuthentication its ``authenticationRef``
    (`reference`) names sets ``parameter`` to the value of ``key`` in Secret ``name`` of
    `namespace`, "" when the Secret or the key is missing. No `reference`: ``{}``; a
    TriggerAuthentication not in `authentications` (those of `namespace`, by name): ``{}``, as
    KEDA logs "error getting triggerAuth" and goes on.

    Raises ValueError for what this reader does not model: a ClusterTriggerAuthentication, a
    TriggerAuthentication with anything but ``secretTargetRef``.
    """
    if not reference or not reference.get("name"):
        return {}
    if reference.get("kind", "") not in ("", "TriggerAuthentication"):
        raise ValueError(f"authenticationRef kind {reference['kind']!r} is not modelled")
    found = authentications.get(reference["name"])
    if found is None:
        return {}
    spec = found.get("spec") or {}
    if set(spec) - {"secretTargetRef"}:
        raise ValueError(f"TriggerAuthentication sources {sorted(spec)} are not all modelled")
    params = {}
    for ref in spec.get("secretTargetRef") or []:
        name, key = ref.get("name", ""), ref.get("key", "")
        data = read_secret(namespace, name) if name and key else None
        params[ref["parameter"]] = (data or {}).get(key, "")
    return params


def build_trigger(
    scaled_object: Mapping[str, Any],
    *,
    authentications: Mapping[str, Mapping[str, Any]],
    read_secret: ReadSecret,
) -> Trigger:
    """The trigger KEDA builds the scaler of a ScaledObject's one ``nats-jetstream`` trigger
    with (``buildScalers``): its authParams resolved in the ScaledObject's namespace
    (`resolve_auth_params`), then `Trigger.from_config`.

    Raises ScalerError as that build fails (KEDA builds again at its next poll or reconcile),
    ValueError for a ScaledObject with another trigger or several, or an authentication this
    reader does not model.
    """
    triggers = scaled_object["spec"]["triggers"]
    if len(triggers) != 1 or triggers[0]["type"] != "nats-jetstream":
        raise ValueError(f"not one nats-jetstream trigger: {triggers}")
    [trigger] = triggers
    auth_params = resolve_auth_params(
        trigger.get("authenticationRef"),
        authentications=authentications,
        namespace=scaled_object["metadata"]["namespace"],
        read_secret=read_secret,
    )
    return Trigger.from_config(trigger.get("metadata") or {}, auth_params=auth_params)


def monitoring_url(trigger: Trigger) -> str:
    """The ``/jsz`` URL KEDA asks first (``getNATSJetStreamMonitoringURL``): the query's keys
    sorted and escaped as Go's ``url.Values.Encode`` does (``$G`` is ``%24G``)."""
    scheme = "https" if trigger.use_https else "http"
    query = _encode([("acc", trigger.account_id), ("consumers", "true"), ("config", "true")])
    return f"{scheme}://{trigger.endpoint}/jsz?{query}"


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """One poll's result."""

    lag: int
    """``num_pending + num_ack_pending`` of the trigger's consumer (messages)."""
    active: bool
    """Lag above ``activationLagThreshold``: KEDA scales a ScaledObject at zero replicas up."""


def lag_of(answer: Any, trigger: Trigger) -> int | None:
    """The lag a ``/jsz`` answer gives the trigger's consumer (its ``num_pending +
    num_ack_pending``, messages), None when the answer does not hold it: what KEDA computes
    from whichever server's answer it keeps."""
    for stream in _streams(answer, trigger):
        consumer = _consumer(stream, trigger)
        if consumer is not None:
            return int(consumer.get("num_pending", 0)) + int(consumer.get("num_ack_pending", 0))
    return None


class Scaler:
    """One trigger's scaler between polls, as KEDA keeps it (``natsJetStreamScaler``): the
    cluster size, the consumer's leader and the leader's ``/jsz`` URL last found, and the
    stream entry the lag is read from. Not thread-safe (KEDA polls one scaler at a time)."""

    def __init__(self, trigger: Trigger, fetch: Fetch) -> None:
        self.trigger = trigger
        self.fetch = fetch
        self.url = monitoring_url(trigger)
        self.cluster_size = 0
        self.consumer_leader = ""
        """The consumer's leader (a ``server_name``) last read; "" before the first read."""
        self.leader_url = ""
        """The leader's ``/jsz`` URL, once found on a cluster; "" until then."""
        self.stream: dict[str, Any] | None = {}
        """The trigger's stream entry last read; KEDA starts from an empty one and drops it
        (None) when a known leader's server no longer holds the consumer."""

    def poll(self) -> Reading:
        """Read the lag as KEDA does once per polling interval (``GetMetricsAndActivity``).

        Raises ScalerError where KEDA's poll fails: a server not reached or answering no JSON,
        no leader found on a cluster, the stream or the consumer not in the answer kept.
        """
        self._refresh()
        if self.stream is None:
            raise ScalerError("stream not found")
        consumer = _consumer(self.stream, self.trigger)
        if consumer is None:
            raise ScalerError(
                f"consumer {self.trigger.consumer!r} not found in stream {self.trigger.stream!r}"
            )
        lag = int(consumer.get("num_pending", 0)) + int(consumer.get("num_ack_pending", 0))
        return Reading(lag=lag, active=lag > self.trigger.activation_lag_threshold)

    def _refresh(self) -> None:
        """``getNATSJetstreamMonitoringData``: ask the known leader (else the endpoint); on a
        cluster, look for the leader again unless this answer names the same one."""
        cached = self.consumer_leader
        found = self._keep(self._get(self.leader_url or self.url), leader_url="")
        if cached and not found:
            self.consumer_leader, self.leader_url, self.stream = "", "", None
        if found and cached and cached == self.consumer_leader:
            return
        if self.cluster_size > 1:
            self._find_leader()

    def _find_leader(self) -> None:
        """Ask each server the endpoint's ``/varz`` lists for its name and its ``/jsz``; keep
        the answer of the first one that its own answer names the consumer's leader."""
        varz = self._get(self._varz_url(""))
        urls = list(varz.get("connect_urls") or [])
        advertised = bool(urls)
        if not advertised:
            urls = list((varz.get("cluster") or {}).get("urls") or [])
        for client_url in urls:
            if advertised:
                hostname = client_url.split(":")[0]
                node = str(self._get(self._varz_url(hostname)).get("server_name", ""))
                node_url = self._with_host(_join_host_port(hostname, self._port()))
            else:
                node = client_url.split(".")[0]
                node_url = self._with_host(f"{node}.{urllib.parse.urlsplit(self.url).netloc}")
            answer = self._get(node_url)
            if node in _leaders(answer, self.trigger):
                self._keep(answer, leader_url=node_url)
                return
        raise ScalerError(f"leader node not found for consumer {self.trigger.consumer}")

    def _keep(self, answer: Any, *, leader_url: str) -> bool:
        """``setNATSJetStreamMonitoringData``: keep the answer's cluster size, its trigger
        stream entry and its consumer's leader (and `leader_url`, when given); whether the
        consumer was in it."""
        self.cluster_size = int((answer.get("meta_cluster") or {}).get("cluster_size", 0))
        for stream in _streams(answer, self.trigger):
            self.stream = stream
            consumer = _consumer(stream, self.trigger)
            if consumer is not None:
                self.consumer_leader = str((consumer.get("cluster") or {}).get("leader", ""))
                if leader_url:
                    self.leader_url = leader_url
                return True
        return False

    def _get(self, url: str) -> Any:
        try:
            answer = self.fetch(url)
        except (OSError, ValueError) as err:
            raise ScalerError(f"GET {url}: {err}") from err
        if not isinstance(answer, dict):
            raise ScalerError(f"GET {url}: not a JSON object: {answer!r}")
        return answer

    def _port(self) -> str:
        """The endpoint's port as Go's ``URL.Port`` gives it ("" when it names none)."""
        netloc = urllib.parse.urlsplit(self.url).netloc
        host, _, port = netloc.rpartition(":")
        return port if host and port.isdigit() and not netloc.endswith("]") else ""

    def _varz_url(self, hostname: str) -> str:
        """``getNATSJetStreamMonitoringServerURL``: ``/varz`` of the endpoint, or of
        `hostname` on the endpoint's port."""
        parts = urllib.parse.urlsplit(self.url)
        host = _join_host_port(hostname, self._port()) if hostname else parts.netloc
        return f"{parts.scheme}://{host}/varz"

    def _with_host(self, host: str) -> str:
        """The endpoint's ``/jsz`` URL on `host` (host[:port]), its query encoded again."""
        parts = urllib.parse.urlsplit(self.url)
        query = _encode(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        return f"{parts.scheme}://{host}{parts.path}?{query}"


def hpa_bounds(scaled_object: Mapping[str, Any]) -> tuple[int, int]:
    """(minReplicas, maxReplicas) of the HPA KEDA makes for a ScaledObject: its
    ``minReplicaCount`` when above 0, else 1; its ``maxReplicaCount``, else 100 (KEDA's
    ``GetHPAMinReplicas``, ``GetHPAMaxReplicas``). Raises KeyError without a ``spec``."""
    spec = scaled_object["spec"]
    low = int(spec.get("minReplicaCount") or 0)
    return (low if low > 0 else 1), int(spec.get("maxReplicaCount", 100))


def desired_replicas(
    lag: int,
    *,
    lag_threshold: int,
    current: int,
    bounds: tuple[int, int],
    tolerance: float = 0.1,
) -> int:
    """The replica count the HPA asks for given the scaler's lag (messages), before its
    scaling policies limit the step and its stabilization window delays a scale-in.

    The HPA's rule for an external metric with an ``AverageValue`` target (Kubernetes,
    "Horizontal Pod Autoscaling", Algorithm details, kubernetes.io/docs/tasks/
    run-application/horizontal-pod-autoscale/#algorithm-details; kube-controller-manager's
    ``ReplicaCalculator.GetExternalPerPodMetricReplicas``): with ``ratio = lag /
    (lag_threshold × current)``, the count stays `current` while ``1 − tolerance ≤ ratio ≤ 1 +
    tolerance`` (``--horizontal-pod-autoscaler-tolerance``, 0.1 by default), else becomes
    ``ceil(lag / lag_threshold)``; then it is held within `bounds` (``hpa_bounds``). KEDA's
    metric is the lag itself (``GenerateMetricInMili``: milli-units, the same ratio) and its
    target ``lagThreshold`` (``GetMetricTarget``, ``AverageValue`` by default).

    Raises ValueError when `current` or `lag_threshold` is below 1 (the HPA does not compute at
    zero replicas: KEDA itself scales from and to zero, on the activity).
    """
    if current < 1 or lag_threshold < 1:
        raise ValueError(f"current {current} and lag_threshold {lag_threshold} must be >= 1")
    ratio = lag / (lag_threshold * current)
    wanted = current if 1 - tolerance <= ratio <= 1 + tolerance else math.ceil(lag / lag_threshold)
    low, high = bounds
    return min(max(wanted, low), high)


def _param(name: str, sources: tuple[Mapping[str, str], ...]) -> str:
    """``configParamValue``: the first of `sources` (in the tag's order) holding `name` with a
    value not empty once trimmed, that value trimmed; "" when none does."""
    for source in sources:
        value = source.get(name, "").strip()
        if value:
            return value
    return ""


def _streams(answer: Any, trigger: Trigger) -> Iterator[dict[str, Any]]:
    """The answer's stream entries named ``trigger.stream`` in the accounts KEDA's
    ``IsAccount`` takes (``id`` is the accountID or ``name`` the account), in answer order."""
    for account in answer.get("account_details") or []:
        if account.get("id", "") == trigger.account_id or account.get("name", "") == (
            trigger.account
        ):
            for stream in account.get("stream_detail") or []:
                if stream.get("name", "") == trigger.stream:
                    yield stream


def _consumer(stream: Mapping[str, Any], trigger: Trigger) -> dict[str, Any] | None:
    """The stream entry's consumer named ``trigger.consumer``, None if it has none."""
    for consumer in stream.get("consumer_detail") or []:
        if consumer.get("name", "") == trigger.consumer:
            return dict(consumer)
    return None


def _leaders(answer: Any, trigger: Trigger) -> set[str]:
    """The leaders the answer names for the trigger's consumer (one per matching entry)."""
    return {
        str((consumer.get("cluster") or {}).get("leader", ""))
        for stream in _streams(answer, trigger)
        for consumer in stream.get("consumer_detail") or []
        if consumer.get("name", "") == trigger.consumer
    }


def _join_host_port(host: str, port: str) -> str:
    """Go's ``net.JoinHostPort`` when `port` is given (an IPv6 host in brackets), else `host`."""
    if not port:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _encode(pairs: list[tuple[str, str]]) -> str:
    """Go's ``url.Values.Encode``: sorted by key, each part query-escaped."""
    return urllib.parse.urlencode(sorted(pairs, key=lambda pair: pair[0]))
