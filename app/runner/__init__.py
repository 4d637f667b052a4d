"""Running reconfiguration jobs (the record of a job is `app.jobs`; what a job does on its engines, and
how its engines' liveness is judged, is its deployment's backend's, `app.backends`). Collaborators that
depend one way:

loop            claims jobs (leases), hands each to its backend in a task of its own, ticks the
                scheduled work (its own and the backends'), starts and stops what the backends run
leases          the claim / renew / release queries
scheduled       desired sizes, retention
lifespan        starts the runner with the coordinator

It names no backend (an import-linter contract): the registry (`app.backends.registry`) is its seam.
"""
