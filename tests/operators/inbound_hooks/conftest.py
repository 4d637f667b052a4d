"""The inbound hook tests' fixtures: inbound secrets configured, an anonymous client, deployment d1, an
Alertmanager's token (defined in `support`, where other operators' tests import them too)."""

from tests.operators.inbound_hooks.support import (  # noqa: F401  (fixtures)
    alertmanager_headers,
    anonymous,
    d1,
    settings_with_inbound_secrets,
)
