"""The front door of a deployment: the rank-set feed any router can follow, and the HAProxy keeper that
follows it (its first consumer, not a special case).

- `rules`: pure rules deriving each engine's front-door state (`ready`, `draining`, `out` with a reason)
  from the deployment, its engines and its active job;
- `models`, `service`: the feed's record (a version per change, kept so a watch sees every change once, in
  order) and the front door's own record (its URL, its keeper, the version it applied);
- `router`: `GET /v1/deployments/{name}/endpoints` and its long-poll watch;
- `haproxy`, `keeper`: HAProxy's runtime API over its stats socket, and the task that keeps it in step.
"""
