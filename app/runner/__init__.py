"""Running reconfiguration jobs (the record of a job is `app.jobs`). Collaborators that depend one way:

loop       claims jobs (leases), spawns one flow (or recovery) per job, ticks scheduled tasks
leases     the claim / renew / release queries
flow       one reconfiguration: the step table per strategy and each step's failure rule
launching  who takes part: agents' info, engines launched where missing, the plan
endings    roll back / resume all / fail and degrade / finish (shared by flow and recovery)
recovery   ends a job a dead coordinator left, from what the agents report
fanout     one step on every engine at once (no database)
record     everything a running job writes
scheduled  cleanup outcomes, heartbeat expiry (and the retention slot)
planner    who is in the new generation, where experts go (pure)
downtime   the union of the engines' pauses (pure)
job        the in-memory `JobRun` and the failures that end it (pure)
settings   `EPCTL_RUNNER_*`
lifespan   starts the runner with the coordinator
"""
