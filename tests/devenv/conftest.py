"""Registers the `prometheus_support` plugin for tests/devenv if the root conftest has not.

Once ``tests/conftest.py`` says ``pytest_plugins = ["prometheus_support"]`` this is a no-op
and can be deleted.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register ``tests/prometheus_support.py`` as the plugin ``prometheus_support``, once."""
    if not config.pluginmanager.has_plugin("prometheus_support"):
        import prometheus_support

        config.pluginmanager.register(prometheus_support, "prometheus_support")
