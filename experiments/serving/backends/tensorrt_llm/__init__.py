"""TensorRT-LLM: `trtllm-serve`, NVIDIA's OpenAI-compatible server; CUDA only, and its TensorRT wheels come from
NVIDIA's own package index."""
