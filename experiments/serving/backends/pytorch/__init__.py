"""torch: the eager model, torch.compile, TensorRT via torch-tensorrt, CUDA graphs, torchao/dynamic quantization; one module per target kind."""
