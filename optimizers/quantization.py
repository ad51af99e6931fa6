"""Weight quantization of the decoder layers (the tied embedding stays as it is), in the champion's engine:

| scheme | onnxruntime (CPU or CUDA)           | openvino (CPU)      | torch on CPU        | torch on CUDA                       |
|--------|-------------------------------------|---------------------|---------------------|-------------------------------------|
| int8   | MatMulNBits 8-bit (builder -p int8) | NNCF INT8_ASYM      | dynamic int8 Linear | torchao Int8WeightOnly              |
|        |                                     |                     | (fp32 champion only)|                                     |
| int4   | MatMulNBits 4-bit (builder -p int4) | NNCF INT4_SYM, g32  | no kernel: n/a      | torchao Int4WeightOnly, tinygemm    |
|        |                                     |                     |                     | layout (bf16 champion only)         |
| fp8    | no FP8 path: not applicable         | no FP8 path: n/a    | no kernel: n/a      | torchao float8 (compute cap >= 8.9) |
"""
from optimizers.base import Candidate, Env, Optimizer

SCHEMES = ("int8", "int4", "fp8")
FP8_MIN_CAPABILITY = (8, 9)


def torch_refusal(scheme: str, precision: str, device_type: str) -> str | None:
    """Why torch cannot quantize a model held at `precision` on `device_type` with `scheme`, or None. The rung's
    check and the engine both ask this, so a recipe that slips past the check still fails with the reason."""
    if scheme == "int8" and device_type == "cpu" and precision != "fp32":
        return (f"torch's dynamic int8 Linear quantizes fp32 weights and takes fp32 activations; the champion runs "
                f"{precision} (its other layers would feed it {precision}): int8 in torch on CPU needs an fp32 "
                f"champion (ONNX Runtime and OpenVINO quantize from the fp32 export)")
    if scheme == "int4" and device_type == "cuda" and precision != "bf16":
        return (f"torchao's int4 kernel here (tinygemm, tile-packed layout) computes in bf16 only; the champion "
                f"runs {precision}: set the half_precision rung's cuda_dtype: bf16")
    return None


class WeightQuantization(Optimizer):
    cost = "mid"

    def __init__(self, scheme: str):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        self.scheme = scheme
        self.name = scheme

    def machine_check(self, env: Env) -> str | None:
        if self.scheme != "fp8":
            return None
        if not env.cuda:
            return "FP8 needs a CUDA device (torchao float8 kernels): none is present"
        if env.cuda_capability and tuple(env.cuda_capability) < FP8_MIN_CAPABILITY:
            return f"FP8 needs compute capability >= 8.9; this GPU has {env.cuda_capability}"
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := self.machine_check(env):   # the machine rules it out, whatever the champion is
            return reason
        if recipe.quantization != "none":
            return f"the champion is already quantized ({recipe.quantization})"
        if recipe.engine not in ("torch", "onnxruntime", "openvino"):
            return f"no weight quantization path for engine {recipe.engine!r}"
        on_cuda = recipe.execution_provider == "cuda"
        if self.scheme == "fp8":
            if recipe.engine == "onnxruntime":
                return "onnxruntime-genai has no FP8 weight path"
            if recipe.engine == "openvino":
                return "the OpenVINO engine compresses weights to int8/int4 (NNCF) only; FP8 here is torchao on CUDA"
            if not on_cuda:
                return "FP8 needs a CUDA device (torchao float8 kernels); the champion runs on CPU"
        if self.scheme == "int4" and recipe.engine == "torch" and not on_cuda:
            return "torchao Int4WeightOnly has no CPU kernel here; INT4 on CPU runs in onnxruntime (MatMulNBits)"
        if recipe.engine == "torch" and on_cuda and not cand.target.decodes:
            return "the torch encoder quantizes on CPU only (dynamic int8); torchao's CUDA path is built for decoders"
        if recipe.engine == "torch" and recipe.compile == "tensorrt":
            return "the TensorRT champion quantizes inside TensorRT, not with these schemes"
        if recipe.engine == "torch":
            return torch_refusal(self.scheme, recipe.precision, "cuda" if on_cuda else "cpu")
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, quantization=self.scheme)
