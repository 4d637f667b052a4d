"""The coordinator <-> agent protocol: request and response models shared by both sides, one module per
job (`bounds`, `engine`, `reconfig`, `membership`, `keys`), every name importable from here.

This module must stay importable without torch: the coordinator imports it.

Flow of one reconfiguration, as the coordinator drives it (every POST answers 202 with the agent's
`ReconfigStatus`, at once or, given `wait_s`, once the step's own phase is reached; see the bounded
long-poll below):

    background strategy: prepare -> sync -> pause -> switch          (cleanup runs after switch)
    blocking strategy:   prepare -> pause -> sync -> switch          (prepare's work runs inside pause)

(The table of calls and phases, which call moves an agent from which phase to which and in what order,
is `engine_agent.choreography`: re-exported here, so that both sides read it through the protocol.)

`prepare` goes to every participant (old members and new members). `pause` is the first half of the
two-step commit: every member of the old generation stops at the same step boundary (the serving
loop agrees on it through its per-step control all-reduce), deferred warm-up runs, and the agent
reports `paused`. Only when all participants are `paused` does the coordinator send `switch`, which
swaps groups and expert map together and resumes serving. `resume` (or `abort`) instead of `switch`
puts a paused agent back on its old generation. A paused agent that hears nothing within
`pause_lease_s` resumes on its old generation by itself.

The engine-agreed commit (`POST /v1/reconfig/arm`, `ArmRequest`, instead of pause and switch): after
sync every participant is armed for the new generation; the serving loops agree on the first step
boundary at which every member of the old generation is armed and pause, switch and resume there with
no coordinator exchange (phases: armed -> paused -> switching -> committed).

Bounded long-poll (so one phase costs one HTTP exchange per engine): `GET /v1/reconfig?job_id=J&
until=paused,committed&wait_s=S` answers as soon as job J is in one of `until` or in a terminal phase
(or reports an error), else after S seconds with the current status. Every action POST takes
`?wait_s=S` too (and an optional `until`, default the action's own end phase: prepare -> prepared,
sync -> synced, pause -> paused, switch -> committed, resume -> resumed, abort -> aborted), so one call
carries "do it and tell me when done". S defaults to 0 (answer at once) and is capped at `MAX_WAIT_S`.
An agent marks its reconfig answers with the `LONG_POLL_HEADER` header (its value is the cap); a caller
that does not see it (an agent older than the long-poll) falls back to polling.

Every machine-readable code (`AgentError.type`, a problem's `code`) is kebab-case: see
`engine_agent.problems`.
"""

from __future__ import annotations

from engine_agent.choreography import ACCEPTS as ACCEPTS
from engine_agent.choreography import ARMED_ONWARD as ARMED_ONWARD
from engine_agent.choreography import CALLS as CALLS
from engine_agent.choreography import COMMITTING as COMMITTING
from engine_agent.choreography import ENGINES_FINISHING as ENGINES_FINISHING
from engine_agent.choreography import MOVES as MOVES
from engine_agent.choreography import RECOVERING_PHASES as RECOVERING_PHASES
from engine_agent.choreography import ROLLED_BACK as ROLLED_BACK
from engine_agent.choreography import STEPS_COMPLETE as STEPS_COMPLETE
from engine_agent.choreography import STOPPED as STOPPED
from engine_agent.choreography import TERMINAL_PHASES as TERMINAL_PHASES
from engine_agent.choreography import CommitMode as CommitMode
from engine_agent.choreography import Move as Move
from engine_agent.choreography import Operation as Operation
from engine_agent.choreography import ReconfigPhase as ReconfigPhase
from engine_agent.choreography import Strategy as Strategy
from engine_agent.choreography import calls_for as calls_for
from engine_agent.protocol.bounds import LONG_POLL_HEADER as LONG_POLL_HEADER
from engine_agent.protocol.bounds import MAX_CONTROL_BODY_BYTES as MAX_CONTROL_BODY_BYTES
from engine_agent.protocol.bounds import MAX_JOB_TIMEOUT_S as MAX_JOB_TIMEOUT_S
from engine_agent.protocol.bounds import MAX_PAUSE_LEASE_S as MAX_PAUSE_LEASE_S
from engine_agent.protocol.bounds import MAX_PREPARE_BODY_BYTES as MAX_PREPARE_BODY_BYTES
from engine_agent.protocol.bounds import MAX_SERVING_COLLECTIVE_S as MAX_SERVING_COLLECTIVE_S
from engine_agent.protocol.bounds import MAX_WAIT_S as MAX_WAIT_S
from engine_agent.protocol.bounds import PROTOCOL_VERSION as PROTOCOL_VERSION
from engine_agent.protocol.engine import DEFAULT_GRAPH_BUCKETS as DEFAULT_GRAPH_BUCKETS
from engine_agent.protocol.engine import MAX_GRAPH_BUCKET as MAX_GRAPH_BUCKET
from engine_agent.protocol.engine import AgentState as AgentState
from engine_agent.protocol.engine import EngineConfig as EngineConfig
from engine_agent.protocol.engine import InferRequest as InferRequest
from engine_agent.protocol.engine import InferResponse as InferResponse
from engine_agent.protocol.engine import Platform as Platform
from engine_agent.protocol.engine import graph_buckets as graph_buckets
from engine_agent.protocol.keys import KEY_CHECK_CONTEXT as KEY_CHECK_CONTEXT
from engine_agent.protocol.keys import MAX_KEY_OVERLAP_S as MAX_KEY_OVERLAP_S
from engine_agent.protocol.keys import MIN_KEY_OVERLAP_S as MIN_KEY_OVERLAP_S
from engine_agent.protocol.keys import AgentKeyRotated as AgentKeyRotated
from engine_agent.protocol.keys import AgentKeyRotation as AgentKeyRotation
from engine_agent.protocol.keys import key_check as key_check
from engine_agent.protocol.membership import AgentHeartbeat as AgentHeartbeat
from engine_agent.protocol.membership import AgentInfo as AgentInfo
from engine_agent.protocol.membership import AgentRegistration as AgentRegistration
from engine_agent.protocol.membership import FaultInjection as FaultInjection
from engine_agent.protocol.membership import GenerationBroken as GenerationBroken
from engine_agent.protocol.membership import GenerationBrokenAnswer as GenerationBrokenAnswer
from engine_agent.protocol.membership import ResidentRows as ResidentRows
from engine_agent.protocol.membership import SpareHeld as SpareHeld
from engine_agent.protocol.reconfig import AgentError as AgentError
from engine_agent.protocol.reconfig import ArmRequest as ArmRequest
from engine_agent.protocol.reconfig import CleanupRecord as CleanupRecord
from engine_agent.protocol.reconfig import CleanupState as CleanupState
from engine_agent.protocol.reconfig import CleanupStatus as CleanupStatus
from engine_agent.protocol.reconfig import DeviceMemory as DeviceMemory
from engine_agent.protocol.reconfig import DowntimeOverrun as DowntimeOverrun
from engine_agent.protocol.reconfig import GraphCapture as GraphCapture
from engine_agent.protocol.reconfig import JobRef as JobRef
from engine_agent.protocol.reconfig import LeavePolicy as LeavePolicy
from engine_agent.protocol.reconfig import Member as Member
from engine_agent.protocol.reconfig import PauseInterval as PauseInterval
from engine_agent.protocol.reconfig import PauseRequest as PauseRequest
from engine_agent.protocol.reconfig import PrepareRequest as PrepareRequest
from engine_agent.protocol.reconfig import ReconfigStatus as ReconfigStatus
from engine_agent.protocol.reconfig import Role as Role
from engine_agent.protocol.reconfig import Settlement as Settlement
from engine_agent.protocol.reconfig import StoreAddress as StoreAddress
from engine_agent.protocol.reconfig import Timeouts as Timeouts
from engine_agent.protocol.reconfig import TransferBackend as TransferBackend
from engine_agent.protocol.reconfig import WarmupPolicy as WarmupPolicy
from engine_agent.protocol.reconfig import is_settled as is_settled
from engine_agent.protocol.reconfig import layer_placements as layer_placements
