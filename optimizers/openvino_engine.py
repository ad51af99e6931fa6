"""Engine swap: torch eager -> OpenVINO, for targets with an OpenVINO engine, converted with plain `openvino`
(encoders: the fp32 ONNX export; causal LMs: the torch model traced as one decode step over an explicit KV cache),
weights compressed by NNCF at the quantization rungs."""
from importlib.util import find_spec

from optimizers.base import Candidate, Env, Optimizer


class OpenVinoSwap(Optimizer):
    name = "openvino"
    cost = "zero"

    def machine_check(self, env: Env) -> str | None:
        if find_spec("openvino") is None:
            return "openvino is not installed: pip install -e . (openvino==2026.4.1 and nncf==3.4.0)"
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        from experiments.serving import ENGINES

        recipe = cand.recipe
        if (cand.target.kind, "openvino") not in ENGINES:
            kinds = ", ".join(sorted(kind for kind, engine in ENGINES if engine == "openvino"))
            return f"OpenVINO here runs {kinds} targets, not {cand.target.kind}"
        if reason := self.machine_check(env):
            return reason
        if recipe.engine == "openvino":
            return "the champion already runs in OpenVINO"
        if recipe.execution_provider != "cpu":
            return (f"the OpenVINO engines here run on its CPU plugin; the champion runs on "
                    f"{recipe.execution_provider} (target.device), and an engine swap does not move the model")
        if recipe.precision != "fp32" or recipe.quantization not in ("none", "int8", "int4"):
            return (f"the OpenVINO engines here run fp32 activations with none/int8/int4 weights; the champion runs "
                    f"{recipe.precision}/{recipe.quantization}")
        if cand.target.decodes and recipe.batching in ("static", "dynamic"):
            return "static and dynamic batching of a causal LM drive onnxruntime-genai's Engine; OpenVINO has none here"
        if recipe.batching == "continuous" or recipe.compile != "none" or recipe.cuda_graph:
            return ("the champion batches continuously or is compiled (a torch-only path); "
                    "OpenVINO serves one request or a padded batch per forward pass")
        return None

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over to the converted graph; `check` let only a CPU champion through.
        return cand.edited(self.name, engine="openvino", compile="none", cuda_graph=False)
