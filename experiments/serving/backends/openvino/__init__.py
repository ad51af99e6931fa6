"""OpenVINO: the IR compiled for the CPU, for causal LMs and encoders; one module per target kind."""
