"""DSpark speculative decoding (``dspark.md``): the drafter, its drafting round and training."""

from deepinfer_spec.dspark.config import DSparkConfig
from deepinfer_spec.dspark.generate import DSparkOutput, dspark_generate
from deepinfer_spec.dspark.model import DSparkDrafter

__all__ = ["DSparkConfig", "DSparkDrafter", "DSparkOutput", "dspark_generate"]
