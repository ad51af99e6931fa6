"""SGLang: its OpenAI-compatible server (`python -m sglang.launch_server`), in an environment of its own; CUDA only."""
