"""The trajectory API: ``kubectl agentrun logs`` authorised by Kubernetes RBAC.

An aggregated API server (``trajectory.agentrun.dev/v1alpha1``, resource
``agentruntrajectories``) that the kube-apiserver proxies to: ``access`` holds its pure
decisions (front-proxy authentication, SubjectAccessReview verdicts, paths, bodies), ``budget``
the bytes of events every connection holds together, ``server`` the HTTPS server and its
Kubernetes and NATS calls, ``main`` the ``agentrun-trajectory`` entry point. See
docs/trajectory-api.md.
"""
