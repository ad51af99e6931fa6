"""One folder per backend (pytorch, onnxruntime, openvino), each with a module per target kind it serves
(causal_lm.py, encoder.py); every engine is built as cls(candidate, threads, artefact_root)."""
