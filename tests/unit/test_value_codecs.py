"""Value codecs against a NumPy reference: round-trip error, exact payload sizes, spec errors,
and error feedback's residual identity."""

import math

import numpy as np
import pytest
import torch

from lowband.comm.value_codecs import QUANT_CHUNK, TOPK_CHUNK, ErrorFeedback, parse_codec
from lowband.errors import ConfigError

SIZES = [1, 7, 1024, 1500, 4096, 10_001]


def vector(n, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(n).astype(np.float32))


def numpy_quantize(x: np.ndarray, bits: int) -> np.ndarray:
    """Reference: per chunk of 1024, scale = max|x| / (2^(b-1)-1), round half to even, clip."""
    top = 2 ** (bits - 1) - 1
    out = np.empty_like(x)
    for a in range(0, len(x), QUANT_CHUNK):
        chunk = x[a:a + QUANT_CHUNK]
        scale = np.float32(np.abs(chunk).max()) / np.float32(top)
        out[a:a + QUANT_CHUNK] = 0 if scale == 0 else np.clip(np.round(chunk / scale), -top, top) * scale
    return out


def numpy_topk(x: np.ndarray, fraction: float) -> np.ndarray:
    k = max(1, round(fraction * TOPK_CHUNK))
    out = np.zeros_like(x)
    for a in range(0, len(x), TOPK_CHUNK):
        chunk = x[a:a + TOPK_CHUNK]
        keep = np.argsort(-np.abs(chunk), kind="stable")[:k]
        out[a + keep] = chunk[keep]
    return out


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_int_codecs_match_numpy_and_their_byte_count(n, bits):
    codec = parse_codec(f"int{bits}")
    x = vector(n)
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8
    assert payload.numel() == codec.payload_bytes(n) == 4 * math.ceil(n / 1024) + math.ceil(n * bits / 8)
    np.testing.assert_allclose(codec.decode(payload, n).numpy(), numpy_quantize(x.numpy(), bits), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_stochastic_rounding_is_unbiased_and_within_one_level(bits):
    x = vector(2048, seed=3)
    codec = parse_codec(f"int{bits}:stochastic", seed=1)
    top = 2 ** (bits - 1) - 1
    scale = torch.from_numpy(np.abs(x.numpy()).reshape(2, 1024).max(axis=1) / top).repeat_interleave(1024)
    trials = torch.stack([codec.roundtrip(x) for _ in range(400)])
    assert torch.all((trials - x).abs() <= scale * 1.0001 + 1e-6)  # within one level
    # the mean of 400 draws is within 5 standard errors (sd <= scale / 2) of x
    assert torch.all((trials.mean(0) - x).abs() < 5 * scale / 2 / math.sqrt(400))


@pytest.mark.parametrize("spec,dtype", [("fp16", np.float16), ("bf16", None)])
@pytest.mark.parametrize("n", SIZES)
def test_half_codecs(spec, dtype, n):
    codec, x = parse_codec(spec), vector(n)
    assert codec.encode(x).numel() == codec.payload_bytes(n) == 2 * n
    out = codec.roundtrip(x).numpy()
    if dtype is not None:
        np.testing.assert_array_equal(out, x.numpy().astype(dtype).astype(np.float32))
    else:  # bf16 keeps 8 significant bits: relative error <= 2^-8
        assert np.all(np.abs(out - x.numpy()) <= np.abs(x.numpy()) * 2 ** -8)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fraction", [0.01, 0.1, 1.0])
def test_topk_keeps_the_largest_per_chunk(n, fraction):
    codec, x = parse_codec(f"topk:{fraction}"), vector(n, seed=2)
    payload = codec.encode(x)
    k = max(1, round(fraction * TOPK_CHUNK))
    count = math.ceil(n / TOPK_CHUNK) * k
    assert payload.numel() == codec.payload_bytes(n) == 3 * math.ceil(count / 2) + 4 * count
    np.testing.assert_array_equal(codec.decode(payload, n).numpy(), numpy_topk(x.numpy(), fraction))


def test_topk_with_quantized_values():
    codec, x = parse_codec("topk:0.02+int2"), vector(9000, seed=4)
    count = 3 * 82
    assert codec.payload_bytes(9000) == 3 * 123 + 4 * 1 + math.ceil(count * 2 / 8)
    out = codec.roundtrip(x).numpy()
    kept = numpy_topk(x.numpy(), 0.02)
    assert set(np.flatnonzero(out)) <= set(np.flatnonzero(kept))
    # 2-bit values are sign * scale of their chunk (levels -1, 0, +1)
    assert np.all(np.sign(out[out != 0]) == np.sign(kept[out != 0]))


def test_fp32_is_lossless():
    codec, x = parse_codec("fp32"), vector(100)
    assert codec.lossless and torch.equal(codec.roundtrip(x), x)


@pytest.mark.parametrize("spec", ["topk:1.5", "topk:0", "topk", "topk:x", "int3", "int8:up", "fp16+int8",
                                  "topk:0.1+topk:0.1", "", "zip", "topk:0.1+int8+fp16", "fp32:stochastic"])
def test_malformed_specs_name_the_field(spec):
    with pytest.raises(ConfigError) as err:
        parse_codec(spec, field="method.codec")
    assert str(err.value).startswith("method.codec=")


@pytest.mark.parametrize("spec", ["int2", "topk:0.05", "topk:0.05+int4"])
def test_error_feedback_residual_identity(spec):
    codec = parse_codec(spec)
    fb = ErrorFeedback(codec)
    previous = torch.zeros(5000)
    for step in range(3):
        x = vector(5000, seed=10 + step)
        compensated = fb.compensate(x)
        sent = codec.roundtrip(compensated)
        fb.remember(compensated, sent)
        torch.testing.assert_close(sent + fb.residual, x + previous, rtol=0, atol=1e-6)
        previous = fb.residual.clone()


def test_error_feedback_transmits_everything_eventually():
    """A constant vector sent through top-1% with feedback: the running sum of what was sent
    approaches the running sum of the inputs (the residual stays bounded)."""
    codec, x = parse_codec("topk:0.01"), vector(4096, seed=5)
    fb, total = ErrorFeedback(codec), torch.zeros(4096)
    for _ in range(300):
        compensated = fb.compensate(x)
        sent = codec.roundtrip(compensated)
        fb.remember(compensated, sent)
        total += sent
    # every coordinate goes out about every 1 / 0.01 steps, so what is held back stays under 1/3
    assert fb.residual.norm() < 0.3 * (300 * x).norm()
    torch.testing.assert_close(total + fb.residual, 300 * x, rtol=1e-4, atol=1e-3)


def test_ec_dnn_takes_only_codecs_for_whole_models():
    from lowband.methods.ec_dnn import ECDNNConfig

    assert ECDNNConfig(codec="int8").codec == "int8"
    with pytest.raises(ConfigError, match=r"method.codec='topk:0.1' is invalid: must be a dense codec: .*"
                                          r"\(ec_dnn gathers whole models\)"):
        ECDNNConfig(codec="topk:0.1")


@pytest.mark.parametrize("spec", ["int4:stochastic", "topk:0.1+int2:stochastic"])
def test_a_stochastic_codec_resumes_its_random_stream(spec):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(5))
    going = parse_codec(spec, seed=7)
    going.encode(x)
    saved = going.state_dict()
    assert saved  # a stochastic codec has state to save
    expected = going.encode(x)
    resumed = parse_codec(spec, seed=99)  # a fresh codec, as a restarted worker builds it
    resumed.load_state_dict(saved)
    assert torch.equal(resumed.encode(x), expected)
    assert not torch.equal(parse_codec(spec, seed=99).encode(x), expected)  # the state is what made it equal


@pytest.mark.parametrize("spec", ["fp32", "fp16", "int8", "topk:0.1+int4"])
def test_deterministic_codecs_have_no_state(spec):
    codec = parse_codec(spec, seed=1)
    assert codec.state_dict() == {}
    codec.load_state_dict({})


def np_binned(x: np.ndarray, levels: int) -> np.ndarray:
    """Per 1,024 values: cut by rank into `levels` equal shares, each value replaced by its share's mean."""
    out = np.empty_like(x)
    for a in range(0, len(x), QUANT_CHUNK):
        chunk = x[a:a + QUANT_CHUNK]
        bins = np.argsort(np.argsort(chunk, kind="stable"), kind="stable") * levels // len(chunk)
        for b in range(levels):
            if (bins == b).any():
                out[a:a + QUANT_CHUNK][bins == b] = chunk[bins == b].mean()
    return out


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 5, 1024, 3000])
def test_lut_codec_matches_a_numpy_reference_and_keeps_every_chunk_sum(bits, n):
    x = np.random.default_rng(n + bits).standard_normal(n).astype(np.float32)
    codec = parse_codec(f"lut{bits}")
    payload = codec.encode(torch.from_numpy(x))
    got = codec.decode(payload, n).numpy()
    np.testing.assert_allclose(got, np_binned(x.astype(np.float64), 1 << bits), rtol=1e-5, atol=1e-6)
    assert payload.numel() == codec.payload_bytes(n) == 4 * (1 << bits) * math.ceil(n / QUANT_CHUNK) + math.ceil(n * bits / 8)
    for a in range(0, n, QUANT_CHUNK):
        assert got[a:a + QUANT_CHUNK].sum() == pytest.approx(x[a:a + QUANT_CHUNK].sum(), rel=1e-4, abs=1e-4)


def test_lut2_loses_less_than_int2_on_gaussian_values():
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(4096).astype(np.float32))
    err = {s: float((parse_codec(s).roundtrip(x) - x).norm() / x.norm()) for s in ("lut2", "int2")}
    assert err["lut2"] < 0.5 < err["int2"]


def test_error_feedback_decays_the_residual_before_adding_it():
    ef = ErrorFeedback(parse_codec("int2"), decay=0.5)
    ef.residual = torch.tensor([2.0, -4.0])
    assert torch.equal(ef.compensate(torch.tensor([1.0, 1.0])), torch.tensor([2.0, -1.0]))
