"""The `vllm` backend: drives a vLLM API server's own elastic EP endpoint (`/scale_elastic_ep`) with the
same job record, rules and events as the reference engines. `backend.py` is what the runner and the
deployments API call; `flow.py` runs a job, `checks.py` looks at
the engine around the call, `outcomes.py` maps vLLM's answers, `discovery.py` reads its state,
`launcher.py` runs servers locally, `engine_service.py` and `router.py` give operators the live view
and the remedies, `recovery.py` finishes a job a dead coordinator left."""
