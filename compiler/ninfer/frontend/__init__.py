"""Frontend: a Hugging Face checkpoint directory -> typed ModelGraph."""

from ninfer.frontend.checkpoint import Checkpoint, open_checkpoint
from ninfer.frontend.config import FrontendError, ModelConfig

__all__ = ["Checkpoint", "FrontendError", "ModelConfig", "open_checkpoint"]
