"""The engines the coordinator drives, one backend per kind (`base.py`: the interface, the flow errors
and the registry; `registry.py`: the built-in ones): `reference` (epctl's agents) and `vllm`."""
