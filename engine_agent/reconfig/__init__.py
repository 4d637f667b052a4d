"""The agent's side of a reconfiguration.

- `steps`: the tables that drive the work, per role (joining/staying/leaving) and strategy;
- `job`: one job, the status board that publishes it, the agent parts the work uses;
- `validate`: a prepare request checked against this engine;
- `prepare`: the steps that build the new generation, and sync;
- `window`: pause, switch, resume, the way back to the old generation, the pause leases;
- `executor`: the public operations (prepare, sync, pause, switch, resume, abort);
- `cleanup`: the background worker that destroys retired groups;
- `faults`: the test-only fault switches; `errors`: how a step fails and how that reads.
"""

from engine_agent.reconfig.cleanup import CleanupWorker, RetiredGeneration
from engine_agent.reconfig.errors import Conflict, InvalidRequest, ReconfigError
from engine_agent.reconfig.executor import ReconfigExecutor
from engine_agent.reconfig.job import ExecutorHooks

__all__ = [
    "CleanupWorker",
    "Conflict",
    "ExecutorHooks",
    "InvalidRequest",
    "ReconfigError",
    "ReconfigExecutor",
    "RetiredGeneration",
]
