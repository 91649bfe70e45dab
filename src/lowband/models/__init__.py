"""Models. Each exposes `features(x)` (input of the final linear layer) and `head(features)`."""

from lowband.models.base import Classifier, build_model, features_of
from lowband.models import small, resnet, cifar_cnns  # noqa: F401  (fill the registry)

__all__ = ["Classifier", "build_model", "features_of"]
