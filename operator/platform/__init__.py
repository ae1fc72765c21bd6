"""What every kind uses and none owns: it knows no kind (it imports none of their folders).

Inside: ``kubeapi`` (the one way to the API server: the ``KubeApi`` port, its adapter and the
one status-patch helper), ``spec`` (the base of every spec model, durations, USD amounts,
object metadata, the one ``SpecError``), ``conditions`` (RFC 3339 times and
``metav1.Condition``), ``events`` (the rate-limited Kubernetes Event recorder), ``leadership``
(the leader Lease), ``health`` (the probe endpoints), ``loops`` (the shape of a background
loop), ``rounds`` (keys taken in turn by tenant, then by namespace).
"""
