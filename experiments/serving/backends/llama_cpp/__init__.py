"""llama.cpp: its native `llama-server` for GGUF weights on CPUs, compiled here from the sources PyPI carries."""
