"""Every model: features -> head composes to forward; the input shape is checked up front."""

from __future__ import annotations

import pytest
import tomllib
import torch

from lowband.catalog import load_all
from lowband.config import ModelConfig
from lowband.errors import ConfigError
from lowband.models import build_model
from lowband.registry import MODELS

load_all()

SHAPES = {"mlp": (1, 40), "cnn1d": (1, 40), "cnn2d": (1, 28, 28), "resnet20": (3, 32, 32),
          "resnet32": (3, 32, 32), "vgg16": (3, 32, 32), "nin": (3, 32, 32), "cnn13": (3, 32, 32)}


LANGUAGE_MODELS = {"gpt"}  # per-position logits over tokens: tests/unit/test_gpt.py


def test_every_registered_model_is_covered():
    assert set(SHAPES) | LANGUAGE_MODELS == set(MODELS.names())


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("resnet") else n
                                  for n in sorted(SHAPES)])
def test_features_then_head_equals_forward(name):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name), SHAPES[name], 7).eval()
    x = torch.randn(3, *SHAPES[name])
    with torch.no_grad():
        f = model.features(x)
        assert f.ndim == 2 and f.shape[0] == 3
        assert model.fc.in_features == f.shape[1]  # the features are the input of the final linear layer
        out = model(x)
        assert out.shape == (3, 7)
        torch.testing.assert_close(model.head(f), out)
        torch.testing.assert_close(model.fc(f), out)


def test_nin_pool_then_linear_equals_class_conv_then_pool():
    """Our NiN pools before its final linear map; a 1x1 conv followed by pooling is the same function."""
    model = build_model(ModelConfig(name="nin"), (3, 32, 32), 10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        maps = model.body[:-2](x)  # before global pooling
        conv = torch.nn.functional.conv2d(maps, model.fc.weight[:, :, None, None], model.fc.bias)
        torch.testing.assert_close(conv.mean(dim=(2, 3)), model(x), rtol=1e-4, atol=1e-5)


def test_wrong_input_shape_is_a_config_error():
    with pytest.raises(ConfigError, match="needs 1D signals"):
        build_model(ModelConfig(name="cnn1d"), (1, 28, 28), 10)
    with pytest.raises(ConfigError, match="does not accept inputs"):
        build_model(ModelConfig(name="vgg16"), (1, 8, 8), 10)


def test_user_model_plugs_in_by_factory_path():
    model = build_model(ModelConfig(name="tests.distributed.helpers:bn_mlp"), (1, 40), 10)
    assert model(torch.randn(4, 1, 40)).shape == (4, 10)
    with pytest.raises(ConfigError, match="could not import"):
        build_model(ModelConfig(name="tests.nowhere:factory"), (1, 40), 10)


def test_model_kwargs_reach_a_user_factory_and_the_saved_config(tmp_path, monkeypatch):
    from lowband import config as C
    from lowband.training.runconfig import method_configs

    (tmp_path / "widefactory.py").write_text(
        "import torch\n"
        "def make(in_shape, num_classes, width=4, depth=1):\n"
        "    layers = [torch.nn.Flatten(), torch.nn.Linear(in_shape[-1], width)]\n"
        "    layers += [torch.nn.Linear(width, width) for _ in range(depth - 1)]\n"
        "    return torch.nn.Sequential(*layers, torch.nn.Linear(width, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = C.from_dict({"method": {"name": "single"}, "model": {"name": "widefactory:make", "kwargs": {"width": 7}}},
                      method_configs())
    model = build_model(cfg.model, (1, 40), 10)
    assert model[1].out_features == 7 and len(model) == 3  # width given, depth its default
    again = C.from_dict(tomllib.loads(C.to_toml(cfg)), method_configs())
    assert again.model.kwargs == {"width": 7}  # what load_model rebuilds from
    assert "kwargs = {width = 7}" in C.describe(cfg)
    assert build_model(ModelConfig(name="widefactory:make"), (1, 40), 10)[1].out_features == 4


class _SmallVocab(torch.nn.Module):
    """A language model whose factory ignores the data's vocabulary: 16 tokens, not 256."""

    def __init__(self, width: int = 8):
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.emb, self.out = torch.nn.Embedding(16, width), torch.nn.Linear(width, 256)

    def forward(self, x):
        return self.out(self.emb(x))


def small_vocab(in_shape, num_classes, width: int = 8):
    return _SmallVocab(width)


def test_a_factory_that_ignores_the_vocabulary_is_refused_before_any_worker():
    """It once died in a worker with IndexError on the first byte above 15."""
    from lowband.models import build_for_task

    with pytest.raises(ConfigError, match=r"^model.name=.* with tokens 0..255 \(its embedding needs vocab_size=256\)"):
        build_for_task(ModelConfig(name=f"{__name__}:small_vocab"), (32,), 256, "lm")


def test_a_bad_kwargs_value_is_blamed_on_model_kwargs_not_model_name():
    with pytest.raises(ConfigError, match=r"^model.kwargs=\{'width': 0\} is invalid: .*ValueError: width must be"):
        build_model(ModelConfig(name=f"{__name__}:small_vocab", kwargs={"width": 0}), (32,), 256)
