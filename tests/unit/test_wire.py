"""The tensor framing: exact round trips, and every malformed frame rejected before allocation."""

import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowband.distill import wire


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_round_trip_is_exact(dtype):
    x = (torch.randn(3, 4, 5) * 10).to(dtype)
    frame = wire.decode(wire.encode("infer", 7, [x, torch.zeros(0, 2)], meta={"a": [1, "b"]}))
    assert (frame.kind, frame.id, frame.meta) == ("infer", 7, {"a": [1, "b"]})
    assert frame.tensors[0].dtype == dtype and torch.equal(frame.tensors[0], x)
    assert frame.tensors[1].shape == (0, 2)


def test_non_contiguous_tensors_are_sent_in_c_order():
    x = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(wire.decode(wire.encode("x", 0, [x])).tensors[0], x)


def _frame(header: dict, payload: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return wire.PREFIX.pack(wire.MAGIC, len(raw)) + raw + payload


GOOD = {"kind": "infer", "id": 1, "meta": {}, "tensors": [{"dtype": "float32", "shape": [2]}]}


@pytest.mark.parametrize("data, why", [
    (b"XXXX" + struct.pack("<I", 2) + b"{}", "bad magic"),
    (wire.PREFIX.pack(wire.MAGIC, 10**9), "header of"),
    (wire.PREFIX.pack(wire.MAGIC, 3) + b"\xff\xfe\x00", "not JSON"),
    (_frame({**GOOD, "extra": 1}, bytes(8)), "exactly"),
    (_frame({**GOOD, "id": "1"}, bytes(8)), "wrong types"),
    (_frame({**GOOD, "tensors": [{"dtype": "object", "shape": [2]}]}, bytes(8)), "not allowed"),
    (_frame({**GOOD, "tensors": [{"dtype": "float32", "shape": [1] * 9}]}, bytes(4)), "at most"),
    (_frame({**GOOD, "tensors": [{"dtype": "float32", "shape": [-1]}]}), "non-negative"),
    (_frame({**GOOD, "tensors": [{"dtype": "float32", "shape": [2**20, 2**20]}]}), "exceeds the limit"),
    (_frame(GOOD, bytes(7)), "announces"),
])
def test_malformed_frames_are_rejected_with_a_reason(data, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode(data)


def test_payload_limit_applies_to_the_sum_of_tensors():
    limits = wire.Limits(max_payload=100)
    x = torch.zeros(20)  # 80 bytes: one fits, two do not
    wire.decode(wire.encode("x", 0, [x]), limits)
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.decode(wire.encode("x", 0, [x, x]), limits)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_survives_any_bytes(data):
    try:
        wire.decode(data, wire.Limits(max_payload=1 << 16))
    except wire.WireError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_decoder_survives_mutated_valid_frames(data):
    good = bytearray(wire.encode("infer", 3, [torch.randn(2, 3)], meta={"token": "t"}))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(good) - 1))
        good[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    try:
        frame = wire.decode(bytes(good[:cut]), wire.Limits(max_payload=1 << 16))
        assert sum(t.numel() * t.element_size() for t in frame.tensors) <= 1 << 16
    except wire.WireError:
        pass
