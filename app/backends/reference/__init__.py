"""The `reference` backend: epctl's own agents, driven call by call through the protocol. Collaborators
that depend one way:

backend    the `Backend` the runner calls: a job's flow or recovery, cleanup, a deleted deployment
flow       one reconfiguration: the rule of each call per strategy (the calls are the protocol's)
launching  who takes part: agents' info, engines launched where missing, the plan
endings    roll back / resume all / fail and degrade / finish (shared by flow and recovery)
recovery   ends a job a dead coordinator left, from what the agents report
confirm    after the switch: every member serves the new generation
fanout     one call on every engine at once (no database)
record     everything a running job writes
cleanup    the engines' background cleanup followed onto the job, and an operator's resolution of it
fencing    a job's new generation, granted once
planner    who is in the new generation, where experts go (pure)
downtime   the union of the engines' pauses (pure)
job        the in-memory `JobRun` (pure)
"""
