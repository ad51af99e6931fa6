"""ONNX Runtime: onnxruntime-genai for causal LMs, an ONNX export for encoders; one module per target kind."""
