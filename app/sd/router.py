"""`GET /v1/sd/agents`: Prometheus HTTP service discovery of the agents' `/metrics` (viewer token).

```yaml
scrape_configs:
  - job_name: epctl-agents
    http_sd_configs:
      - url: http://coordinator:8000/v1/sd/agents
        refresh_interval: 30s
        authorization: {type: Bearer, credentials_file: /etc/prometheus/epctl-viewer.token}
```
"""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import DatabaseDep, Reader
from app.api.params import DeploymentFilterQuery
from app.core.problems import problem_responses
from app.sd.service import TargetGroup, agent_targets

router = APIRouter(prefix="/v1/sd", tags=["service-discovery"], responses=problem_responses(401, 403, 422))


@router.get("/agents", name="agents")
async def list_agent_targets(
    db: DatabaseDep, _: Reader, deployment: DeploymentFilterQuery = None
) -> list[TargetGroup]:
    """Serving (and paused) agents as Prometheus HTTP SD target groups: `targets` is the agent's
    `host:port`, `labels` carry `__metrics_path__`, `__scheme__`, `deployment`, `engine_id`, `dp_rank`,
    `platform` and `device`. Engines that left or are unreachable are not listed."""
    return await db.run(lambda session: agent_targets(session, deployment=deployment))
