"""The reference engines' liveness: one controller over one record, in the shape of a Kubernetes
controller's reconcile (and of `app/scale/desired.py` + `stabilize.py`). Each pass, per deployment:

    observe   what the record says (engines as their heartbeats left them, the active and newest jobs,
              what the coordinator hears at all), then what I/O adds (a gone process's refused
              connection, a starting coordinator's questions): a `DeploymentView` of plain values
    judge     one pure function of that view and `now`: each engine's fate (lost, link-lost, stalled,
              cut-off, fenced at start, written-off), the status and its reason, at most one action (a
              self-heal job to N with its reason, or why not): a `Verdict`
    act       the verdict through the one writers (the status writer with its event and incident, the
              job service, the outbox), only if the record is still what was observed

Collaborators that depend one way:

controller  the passes: memory between them, the probes, the launchers that stop what was written off
adoption    a starting coordinator asks every recorded member (`/v1/info`)
observe     the views, from the record
probes      is an engine's process gone? (only a refused connection says so)
judge       the rules in their order (answers, gone, stalled, silence, health, heal)
engines     evidence about one engine from its peers: stalled, vouched for (pure)
health      whole or not, and why (pure)
heal        at most one self-heal job, by `on_engine_loss` (pure)
reach       the largest set of engines that reach one another on the data network (pure)
board       the judge's working copy of a view; verdict, view: the values in and out
act         the writes
reported    a member's first report that its group broke: the status, in that heartbeat's transaction
canaries    what clients saw during an incident (a periodic task beside the passes)

The rules are rows of tests/runner/test_liveness_rules.py, each with a fixed `now`.
"""
