"""Weight quantization of the decoder layers (the tied embedding stays as it is), in the champion's engine:

| scheme | onnxruntime (CPU or CUDA)           | openvino (CPU)      | torch on CPU        | torch on CUDA                       |
|--------|-------------------------------------|---------------------|---------------------|-------------------------------------|
| int8   | MatMulNBits 8-bit (builder -p int8) | NNCF INT8_ASYM      | dynamic int8 Linear | torchao Int8WeightOnly              |
|        |                                     |                     | (fp32 champion only)|                                     |
| int4   | MatMulNBits 4-bit (builder -p int4) | NNCF INT4_SYM, g32  | no kernel: n/a      | torchao Int4WeightOnly, tinygemm    |
|        |                                     |                     |                     | layout (bf16 champion only)         |
| fp8    | no FP8 path: not applicable         | no FP8 path: n/a    | no kernel: n/a      | torchao float8 (compute cap >= 8.9) |
"""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer

SCHEMES = ("int8", "int4", "fp8")
FP8_MIN_CAPABILITY = (8, 9)


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
        if reason := self.machine_check(env):   # the machine rules it out, whatever the champion is
            return reason
        if cand.recipe.quantization != "none":
            return f"the champion is already quantized ({cand.recipe.quantization})"
        if cand.recipe.compile == "tensorrt":
            return "the TensorRT champion quantizes inside TensorRT, not with these schemes"
        return refusal(self.apply(cand))   # the champion's engine says whether it builds this scheme

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, quantization=self.scheme)
