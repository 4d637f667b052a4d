"""Engine backends the coordinator drives besides its own reference engine agents (`backend: vllm`)."""
