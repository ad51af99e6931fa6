"""FP16 / BF16 weights and activations: bf16 on CPU, bf16 or fp16 on a GPU (both set in the rung's YAML). bf16 on a
GPU by default: torchao's int4 kernel computes in bf16 only, and bf16 keeps fp32's range."""
from optimizers.base import Candidate, Env, Optimizer

HALF = ("bf16", "fp16")


class HalfPrecision(Optimizer):
    name = "half_precision"
    cost = "zero"

    def __init__(self, cpu_dtype: str = "bf16", cuda_dtype: str = "bf16"):
        if cpu_dtype not in HALF or cuda_dtype not in HALF:
            raise ValueError(f"cpu_dtype and cuda_dtype must be one of {HALF}, got {cpu_dtype!r}, {cuda_dtype!r}")
        self.cpu_dtype, self.cuda_dtype = cpu_dtype, cuda_dtype

    def dtype(self, cand: Candidate) -> str:
        return self.cuda_dtype if cand.recipe.execution_provider == "cuda" else self.cpu_dtype

    def check(self, env: Env, cand: Candidate) -> str | None:
        dtype, recipe = self.dtype(cand), cand.recipe
        if recipe.precision in HALF:
            return f"the champion already runs {recipe.precision}"
        if recipe.quantization != "none":
            return f"the champion's weights are {recipe.quantization}; half precision comes before quantization"
        if recipe.engine == "onnxruntime" and not cand.target.decodes:
            return "the ONNX Runtime encoder engine runs its fp32 export only; bf16 runs in the torch engine"
        if recipe.engine == "openvino":
            return ("the OpenVINO engines here compute in f32 (its precision hint, for parity with torch); their "
                    "weights shrink at the quantization rungs (NNCF)")
        if recipe.engine == "onnxruntime" and recipe.execution_provider == "cpu" and dtype == "bf16":
            return ("ONNX Runtime's CPU kernels cannot run the bf16 export (no bf16 Where kernel); set "
                    "cpu_dtype: fp16 to try ONNX Runtime fp16, or run bf16 in the torch engine")
        if recipe.engine == "torch" and recipe.execution_provider == "cpu" and dtype == "fp16":
            return "torch has few fp16 CPU kernels; use cpu_dtype: bf16"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, precision=self.dtype(cand))
