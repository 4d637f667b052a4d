"""The canary probe: what clients see while a deployment reconfigures, measured from outside.

A `Canary` sends one small real request to one serving target (an engine's inference endpoint, a vLLM
server's `/v1/completions`); a `CanaryRecorder` sends canaries at a steady rate to every serving
target while a job runs, and `probe_figures` turns what it recorded into the job's figures: the
*outage* (`client_outage_ms`: the longest stretch with no successful answer, by the rule of `outage`,
which every client measurer uses) and the *slowest answer* (`client_slowest_answer_ms`: the longest
latency of a canary that succeeded), each with the phase it fell in; canaries sent, failed and late;
p50 latency outside the outage; and per phase p50/p99, the slowest answer and the longest stretch
with no answer. The recorder knows nothing of
any engine; each backend brings its own `Canary` (`reference.ReferenceCanary`: one binary token to an
agent's `/v1/infer`; the vLLM backend's in `app/backends/vllm/canary.py`); `record` turns the figures
into the job's columns and its announcement, alike for both. `job.JobProbe` runs it for a
reference-engine job (`EPCTL_PROBE_*`).
"""

from app.probe.canary import Canary, CanaryResult, CanarySample
from app.probe.figures import PhaseFigures, ProbeFigures, probe_figures
from app.probe.record import figures_changes, outage_summary
from app.probe.recorder import CanaryRecorder, LiveView

__all__ = [
    "Canary",
    "CanaryRecorder",
    "CanaryResult",
    "CanarySample",
    "LiveView",
    "PhaseFigures",
    "ProbeFigures",
    "figures_changes",
    "outage_summary",
    "probe_figures",
]
