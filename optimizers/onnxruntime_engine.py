"""Engine swap: torch eager -> ONNX Runtime: onnxruntime-genai for a causal LM (exported graph + C++ decode loop),
an exported pooled graph in an InferenceSession for an encoder."""
from optimizers.base import Candidate, Env, Optimizer


class OnnxRuntimeSwap(Optimizer):
    name = "onnxruntime"
    cost = "zero"

    def __init__(self, execution_provider: str = "champion"):
        """execution_provider: champion (the device target.device chose; default), or cpu / cuda to run this
        rung only where the champion already runs there: a swap never moves the model to another device."""
        if execution_provider not in ("champion", "cpu", "cuda"):
            raise ValueError(f"execution_provider must be champion, cpu or cuda, got {execution_provider!r}")
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
        if cand.target.decodes and cand.recipe.execution_provider == "cuda" and cand.recipe.cuda_device != 0:
            return (f"onnxruntime-genai places the model on the first CUDA device it sees, not cuda:"
                    f"{cand.recipe.cuda_device}: run with CUDA_VISIBLE_DEVICES={cand.recipe.cuda_device} and "
                    f"target.device=cuda")
        if self.execution_provider not in ("champion", cand.recipe.execution_provider):
            return (f"this rung is set for execution_provider={self.execution_provider}; the champion runs on "
                    f"{cand.recipe.execution_provider} (target.device), and an engine swap does not move the model")
        return None

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over to the exported graph; the device stays the champion's.
        return cand.edited(self.name, engine="onnxruntime", compile="none", cuda_graph=False)
