"""Engine swap: torch eager -> ONNX Runtime: onnxruntime-genai for a causal LM (exported graph + C++ decode loop),
an exported pooled graph in an InferenceSession for an encoder."""
from optimizers.base import Candidate, Env, Optimizer


class OnnxRuntimeSwap(Optimizer):
    name = "onnxruntime"
    cost = "zero"

    def __init__(self, execution_provider: str = "cpu"):
        if execution_provider not in ("cpu", "cuda"):
            raise ValueError(f"execution_provider must be cpu or cuda, got {execution_provider!r}")
        self.execution_provider = execution_provider

    def machine_check(self, env: Env) -> str | None:
        if self.execution_provider == "cuda" and not env.cuda:
            return "execution_provider=cuda but no CUDA device is present"
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        from experiments.serving import ENGINES

        if (cand.target.kind, "onnxruntime") not in ENGINES:
            return f"no ONNX Runtime engine for a {cand.target.kind} target"
        if reason := self.machine_check(env):
            return reason
        if cand.recipe.engine == "onnxruntime":
            return "the champion already runs in ONNX Runtime"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over to the exported graph.
        return cand.edited(self.name, engine="onnxruntime", execution_provider=self.execution_provider,
                           compile="none", cuda_graph=False)
