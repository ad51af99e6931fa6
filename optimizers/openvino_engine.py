"""Engine swap: torch eager -> OpenVINO, for targets with an OpenVINO engine, converted with plain `openvino`
(encoders: the fp32 ONNX export; causal LMs: the torch model traced as one decode step over an explicit KV cache),
weights compressed by NNCF at the quantization rungs."""
from importlib.util import find_spec

from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer, leaving_server


class OpenVinoSwap(Optimizer):
    name = "openvino"
    cost = "zero"

    def machine_check(self, env: Env) -> str | None:
        if find_spec("openvino") is None:
            return "openvino is not installed: pip install -e . (openvino==2026.4.1 and nncf==3.4.0)"
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := self.machine_check(env):
            return reason
        if recipe.engine == "openvino":
            return "the champion already runs in OpenVINO"
        if recipe.compile != "none" or recipe.cuda_graph:
            # the swap would drop the compilation the ladder already accepted
            return "the champion is compiled or replays a CUDA graph (a torch-only path); the swap would drop it"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over to the converted graph; `check` let only a CPU champion through.
        return cand.edited(self.name, engine="openvino", compile="none", cuda_graph=False, **leaving_server(cand))
