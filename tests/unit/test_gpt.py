"""The GPT (lowband.models.gpt): causal, tied head, the named sizes' parameter counts, the model
contract, one-line refusals, and a few steps that learn a repeated text."""

from __future__ import annotations

import math
import typing

import pytest
import torch
import torch.nn.functional as F

from lowband.config import GptSize, ModelConfig, build
from lowband.errors import ConfigError
from lowband.models import build_model
from lowband.models.gpt import SIZES

VOCAB, CONTEXT = 256, 128
EXPECTED = {"nano": 23_712, "tiny": 224_640, "small": 842_496, "medium": 2_743_296, "large": 31_721_472}


def gpt(size: str = "nano", window: int = 32, **options) -> torch.nn.Module:
    """A GPT built as lowband builds it for text windows of `window` bytes."""
    torch.manual_seed(0)
    return build_model(ModelConfig(name="gpt", size=size, **options), (window,), VOCAB, input_dtype=torch.int64,
                       per_position=True)


def tokens(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def by_hand(n_layer: int, n_embd: int, vocab: int = VOCAB, context: int = CONTEXT) -> int:
    """Embeddings, then per block two LayerNorms, qkv, its projection and the MLP, then the final LayerNorm;
    the head has none of its own (tied, no bias)."""
    d = n_embd
    block = 2 * (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return vocab * d + context * d + n_layer * block + 2 * d


def test_no_logit_depends_on_a_later_position():
    model, x = gpt().eval(), tokens(2, 32)
    t = 13
    changed = x.clone()
    changed[:, t] = (changed[:, t] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(x), model(changed)
    assert torch.allclose(before[:, :t], after[:, :t], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, t], after[:, t])  # position t itself sees its own token


def test_the_head_is_the_token_embedding_and_has_no_bias_or_weight_of_its_own():
    model = gpt()
    f = torch.randn(2, 5, SIZES["nano"].n_embd)
    assert torch.equal(model.head(f), f @ model.wte.weight.T)
    vocab_matrices = [k for k, v in model.state_dict().items() if v.shape == (VOCAB, SIZES["nano"].n_embd)]
    assert vocab_matrices == ["wte.weight"]
    model.head(f).sum().backward()
    assert model.wte.weight.grad is not None and model.wte.weight.grad.abs().sum() > 0
    with torch.no_grad():
        model.wte.weight.zero_()
    assert torch.equal(model.head(f), torch.zeros(2, 5, VOCAB))


@pytest.mark.parametrize("size", list(EXPECTED))
def test_named_sizes_have_the_counted_parameters(size):
    shape = SIZES[size]
    model = gpt(size, window=CONTEXT)
    assert sum(p.numel() for p in model.parameters()) == by_hand(shape.n_layer, shape.n_embd) == EXPECTED[size]


def test_the_config_names_exactly_the_sizes_the_model_knows():
    assert set(typing.get_args(GptSize)) == set(SIZES)


def test_features_then_head_is_forward_for_any_length_up_to_the_context():
    model = gpt().eval()
    for t in (1, 7, 32):
        x = tokens(3, t)
        with torch.no_grad():
            f = model.features(x)
            assert f.shape == (3, t, SIZES["nano"].n_embd)
            assert torch.equal(model.head(f), model(x)) and model(x).shape == (3, t, VOCAB)


def test_gpt2_initialisation():
    model = gpt("tiny")
    scaled = 0.02 / math.sqrt(2 * SIZES["tiny"].n_layer)
    for block in model.blocks:
        for proj in (block.attn.proj, block.mlp.proj):
            assert abs(proj.weight.std().item() - scaled) < 0.1 * scaled and not proj.bias.any()
        assert abs(block.attn.qkv.weight.std().item() - 0.02) < 0.002
        assert torch.equal(block.ln1.weight, torch.ones(64)) and not block.ln1.bias.any()
    assert abs(model.wte.weight.std().item() - 0.02) < 0.002


def test_options_override_the_named_size():
    model = gpt("nano", n_layer=3, n_head=4, n_embd=32, context=40)
    assert len(model.blocks) == 3 and model.wte.weight.shape == (VOCAB, 32) and model.wpe.weight.shape == (40, 32)


@pytest.mark.parametrize("options, field, fragment", [
    ({"n_embd": 100, "n_head": 3}, "model.n_embd", "model.n_embd=100 is invalid: must be divisible by model.n_head=3"),
    ({"n_head": 5}, "model.n_embd", "model.n_embd=24 is invalid: must be divisible by model.n_head=5"),
    ({"context": 16}, "model.context", "must be >= the data's window of 32 tokens"),
    ({"size": "huge"}, "model.size", "must be one of 'nano', 'tiny', 'small', 'medium', 'large'"),
    ({"dropout": 1.0}, "model.dropout", "must be in [0, 1)"),
])
def test_bad_options_are_one_config_error(options, field, fragment):
    with pytest.raises(ConfigError) as e:
        gpt(**options)
    assert e.value.field == field and fragment in str(e.value)


def test_a_toml_size_is_checked_against_the_known_ones():
    with pytest.raises(ConfigError, match="model.size='huge' is invalid: must be one of 'nano'"):
        build(ModelConfig, {"name": "gpt", "size": "huge"}, "model")


def test_build_model_checks_the_data_it_is_given():
    with pytest.raises(ConfigError, match="needs token windows"):
        build_model(ModelConfig(name="gpt"), (1, 40), 10)
    with pytest.raises(ConfigError, match="does not accept inputs of shape"):  # float inputs: not tokens
        build_model(ModelConfig(name="gpt", size="nano"), (32,), VOCAB)
    with pytest.raises(ConfigError, match=r"gives outputs \(2, 256\), expected \(batch, 32, 256\)"):
        build_model(ModelConfig(name="mlp", hidden=8), (32,), VOCAB, per_position=True)
    build_model(ModelConfig(name="cnn1d"), (1, 40), 10)  # classification callers are unchanged


def test_dropout_is_off_by_default_and_only_in_training():
    x = tokens(2, 16)
    plain, dropping = gpt().train(), gpt(dropout=0.5).train()
    assert torch.equal(plain(x), plain(x)) and not torch.equal(dropping(x), dropping(x))
    dropping.eval()
    assert torch.equal(dropping(x), dropping(x))


def test_a_few_adamw_steps_learn_a_repeated_text():
    torch.manual_seed(0)
    text = torch.tensor(list(b"to be or not to be, that is the question. " * 8))
    context = 16
    windows = text.unfold(0, context + 1, context)
    x, y = windows[:, :-1], windows[:, 1:]
    model = gpt(window=context)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 0.9 * math.log(VOCAB) and losses[-1] < 0.5 * losses[0]
