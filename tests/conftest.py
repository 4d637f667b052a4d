"""Suite-wide defaults.

In-process coordinator apps (TestClient, ASGI transport) do not run the job runner, so API tests see
jobs stay `pending` until they move them. The runner is exercised in `tests/e2e/` against real
coordinator processes, which set `EPCTL_RUNNER_ENABLED=true` explicitly.
"""

from __future__ import annotations

import os

os.environ.setdefault("EPCTL_RUNNER_ENABLED", "false")
