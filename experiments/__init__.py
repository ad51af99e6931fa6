"""ROI Ladder orchestration: ladder, benchmark, accuracy, gate, tracking."""
from pathlib import Path

from omegaconf import OmegaConf

# `${roi.abspath:...}`: config paths resolved against the CWD, without needing Hydra's runtime config
# (so `roi-ladder ui` and tests can compose the same tree).
if not OmegaConf.has_resolver("roi.abspath"):
    OmegaConf.register_new_resolver("roi.abspath", lambda p: str(Path(p).expanduser().resolve()))
# `${roi.model_name:PATH}`: a model folder's (or GGUF file's) name, the default name of a user's target.
if not OmegaConf.has_resolver("roi.model_name"):
    OmegaConf.register_new_resolver("roi.model_name", lambda p: Path(p).expanduser().resolve().name.removesuffix(".gguf"))
