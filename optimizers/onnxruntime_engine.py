"""Engine swap: torch eager -> ONNX Runtime: onnxruntime-genai for a causal LM (exported graph + C++ decode loop),
an exported pooled graph in an InferenceSession for an encoder."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer, leaving_server


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
        if reason := self.machine_check(env):
            return reason
        if cand.recipe.engine == "onnxruntime":
            return "the champion already runs in ONNX Runtime"
        if self.execution_provider not in ("champion", cand.recipe.execution_provider):
            return (f"this rung is set for execution_provider={self.execution_provider}; the champion runs on "
                    f"{cand.recipe.execution_provider} (target.device), and an engine swap does not move the model")
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over to the exported graph, nor a server's own; the device stays the
        # champion's.
        return cand.edited(self.name, engine="onnxruntime", compile="none", cuda_graph=False, **leaving_server(cand))
