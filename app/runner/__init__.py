"""Running reconfiguration jobs (the record of a job is `app.jobs`; what a job does on its engines is its
deployment's backend's, `app.backends`). Collaborators that depend one way:

loop            claims jobs (leases), hands each to its backend in a task of its own, ticks the
                scheduled work (its own and the backends')
leases          the claim / renew / release queries
scheduled       heartbeat expiry and the health pass, desired sizes, retention
selfheal        a deployment that lost an engine forms a new generation by itself
stalls          an engine that froze, fenced on its peers' evidence
adoption        a starting coordinator checks that the recorded engines still serve
incident_probe  what clients saw during an incident (canaries)
lifespan        starts the runner with the coordinator
"""
