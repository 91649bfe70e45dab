"""Models, registered by name (base: the Classifier shape and the builders): small (MLP, ConvBase, a 2D
CNN), cifar_cnns and resnet for images, gpt (the byte-level transformer, in one file); flat turns a model
into one vector for exchanging it. Each exposes `features(x)` (input of the final linear layer) and
`head(features)`."""

from lowband.models import cifar_cnns, gpt, resnet, small  # noqa: F401  (fill the registry)
from lowband.models.base import Classifier, build_for_task, build_model, features_of

__all__ = ["Classifier", "build_for_task", "build_model", "features_of"]
