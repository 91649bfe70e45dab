"""The model contract: `features(x)` is the input of the final linear layer, `head` maps it to logits."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from lowband.config import ModelConfig
from lowband.errors import ConfigError, UsageError
from lowband.registry import MODELS
from lowband.registry.plugins import import_factory


class Classifier(nn.Module):
    """Base class: subclasses set `self.body` (x -> flat features) and `self.fc` (features -> logits)."""

    body: nn.Module
    fc: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_model(cfg: ModelConfig, in_shape: tuple[int, ...], num_classes: int, *,
                input_dtype: torch.dtype = torch.float32, per_position: bool = False) -> nn.Module:
    """Build `cfg.name` (a registered name or `package.module:factory`) and check it fits the data:
    inputs of `input_dtype` (int64 for text: data.x_train.dtype), and logits (batch, num_classes),
    or (batch, T, num_classes) when every position has a target (`per_position`: data.task == "lm")."""
    if ":" in cfg.name:
        model = _call_factory(cfg.name, in_shape, num_classes, cfg.kwargs, per_position)
    else:
        model = MODELS.get(cfg.name)(cfg, in_shape, num_classes)
    _check_fits(model, cfg.name, in_shape, num_classes, input_dtype, per_position)
    return model


def build_for_task(cfg: ModelConfig, in_shape: tuple[int, ...], num_classes: int, task: str) -> nn.Module:
    """`build_model` for a workload: a language model ("lm") takes int64 bytes and predicts every position."""
    lm = task == "lm"
    return build_model(cfg, in_shape, num_classes, input_dtype=torch.int64 if lm else torch.float32, per_position=lm)


def _call_factory(spec: str, in_shape, num_classes: int, kwargs: dict | None = None,
                  per_position: bool = False) -> nn.Module:
    """factory(in_shape=..., num_classes=..., **model.kwargs), whose failure or non-module result is one line.
    For text (`per_position`) a factory that names them also gets vocab_size= (num_classes) and context=
    (the window, in_shape[0]). A model whose output carries `.logits` (a Hugging Face model) is wrapped
    so that it gives the logits alone (`LogitsOf`)."""
    factory = import_factory(spec, "model.name")
    kwargs = kwargs or {}
    text = {k: v for k, v in (("vocab_size", num_classes), ("context", in_shape[0]))
            if per_position and k not in kwargs and _takes(factory, k)}
    try:
        model = factory(in_shape=in_shape, num_classes=num_classes, **text, **kwargs)
    except TypeError as e:
        field, value = ("model.kwargs", kwargs) if kwargs else ("model.name", spec)
        raise ConfigError(field, value, f"factory(in_shape=, num_classes=, **model.kwargs) failed (TypeError: {e})") from None
    except Exception as e:  # noqa: BLE001 - user code; with model.kwargs given, they are what the user can change
        field, value = ("model.kwargs", kwargs) if kwargs else ("model.name", spec)
        raise ConfigError(field, value, f"factory(in_shape=, num_classes=, **model.kwargs) failed "
                                        f"({type(e).__name__}: {e})") from None
    if not isinstance(model, nn.Module):
        raise ConfigError("model.name", spec, f"factory returned {type(model).__name__}, expected a torch.nn.Module")
    return LogitsOf(model) if _gives_logits_field(model, in_shape, per_position) else model


def _takes(factory, name: str) -> bool:
    """Whether `factory` accepts a keyword `name` (by name, or through **kwargs)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class LogitsOf(nn.Module):
    """A model whose output holds its logits in `.logits` (a Hugging Face model's ModelOutput), giving them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def _gives_logits_field(model: nn.Module, in_shape, per_position: bool) -> bool:
    """Whether `model`'s output is not a tensor but has `.logits` (one forward of two zero inputs)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, *in_shape, dtype=torch.int64 if per_position else torch.float32))
    except Exception:  # noqa: BLE001 - _check_fits says what is wrong, in one line
        return False
    finally:
        model.train(was_training)
    return not isinstance(out, torch.Tensor) and isinstance(getattr(out, "logits", None), torch.Tensor)


def _check_fits(model: nn.Module, name: str, in_shape, num_classes: int, input_dtype: torch.dtype = torch.float32,
                per_position: bool = False) -> None:
    expected = (2, *in_shape[:1], num_classes) if per_position else (2, num_classes)
    was_training = model.training
    model.eval()
    x = torch.zeros(2, *in_shape, dtype=input_dtype)
    if not input_dtype.is_floating_point:
        x[1] = num_classes - 1  # the largest token the data holds: an embedding built for fewer fails here
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as e:  # noqa: BLE001 - user code
        kind = "" if input_dtype == torch.float32 else f" {str(input_dtype).removeprefix('torch.')}"
        vocab = "" if input_dtype.is_floating_point else f" with tokens 0..{num_classes - 1} (its embedding needs " \
                                                         f"vocab_size={num_classes})"
        raise ConfigError("model.name", name, f"does not accept{kind} inputs of shape {tuple(in_shape)}{vocab} "
                                              f"({e})") from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise ConfigError("model.name", name, f"gives {type(out).__name__}, expected a tensor of logits")
    if tuple(out.shape) != expected:
        shown = ", ".join(map(str, expected[1:]))
        raise ConfigError("model.name", name, f"gives outputs {tuple(out.shape)}, expected (batch, {shown})")


def features_of(model: nn.Module) -> nn.Module:
    """The model itself, after checking it has `features` and `head` (methods that distill need both)."""
    inner = getattr(model, "module", model)
    if not (hasattr(inner, "features") and hasattr(inner, "head")):
        raise UsageError(f"model {type(inner).__name__} must define features(x) and head(features) for this method")
    return inner
