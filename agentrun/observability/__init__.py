"""Observability helpers shared by the chart's dashboard and alert files and their tests.

`agentrun.observability.promql` reads the PromQL of ``charts/agentrun/dashboards/*.json`` and
``charts/agentrun/alerts/*.rules.yaml``, turns Grafana templates into plain PromQL and looks
inside expressions (metric names, label matchers, the series behind an alert condition).
"""
