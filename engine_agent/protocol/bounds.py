"""The protocol's bounds: what one side may ask of the other (an agent refuses more with 422, as the
coordinator does for its fields), and how big a control body may be."""

from __future__ import annotations

PROTOCOL_VERSION = 1

MAX_WAIT_S = 30.0  # the longest one long-poll (or action POST with wait_s) is held open
# Bounds of the agent's own inputs: a pause lease is what a caller can hold serving stopped for;
# deadlines a job can set.
MAX_PAUSE_LEASE_S = 300.0
MAX_JOB_TIMEOUT_S = 3600.0
MAX_SERVING_COLLECTIVE_S = 600.0
LONG_POLL_HEADER = "Epctl-Wait-Max-S"  # on reconfig answers of an agent that supports wait_s

# Control bodies are read only after the key is checked, and never past these bounds (413): a prepare
# request lists every member and every layer's placement (DeepSeek-V3's 58 layers x 288 slots at 128
# ranks is ~0.2 MB); every other control body is a job id and a few numbers.
MAX_PREPARE_BODY_BYTES = 1_048_576
MAX_CONTROL_BODY_BYTES = 65_536
