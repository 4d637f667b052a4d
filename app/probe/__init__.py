"""The canary probe: what clients see while a deployment reconfigures, measured from outside.

A `Canary` sends one small real request to one serving target (an engine's inference endpoint, a vLLM
server's `/v1/completions`); a `CanaryRecorder` sends canaries at a steady rate to every serving
target while a job runs, and `probe_figures` turns what it recorded into the job's figures:
`client_downtime_ms` (the longest window in which no canary succeeded), canaries sent and failed,
p50 latency outside that window, and p99 latency and the longest gap per phase against the baseline
before the job. The recorder knows nothing of any engine; each backend brings its own `Canary`
(`reference.ReferenceCanary`: one binary token to an agent's `/v1/infer`; the vLLM backend's in
`app/backends/vllm/canary.py`). `job.JobProbe` runs it for a reference-engine job (`EPCTL_PROBE_*`).
"""

from app.probe.canary import Canary, CanaryResult, CanarySample
from app.probe.figures import PhaseFigures, ProbeFigures, probe_figures
from app.probe.recorder import CanaryRecorder, LiveView

__all__ = [
    "Canary",
    "CanaryRecorder",
    "CanaryResult",
    "CanarySample",
    "LiveView",
    "PhaseFigures",
    "ProbeFigures",
    "probe_figures",
]
