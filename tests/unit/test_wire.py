"""The tensor framing: exact round trips, and every malformed frame rejected before allocation."""

import contextlib
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


def _padded_header(size: int, tensors: int = 1) -> bytes:
    """A valid header of exactly `size` bytes (padded inside meta) announcing `tensors` empty tensors."""
    specs = [{"dtype": "float32", "shape": [0]}] * tensors
    bare = json.dumps({"kind": "x", "id": 0, "meta": {"pad": ""}, "tensors": specs}, separators=(",", ":"))
    raw = json.dumps({"kind": "x", "id": 0, "meta": {"pad": "a" * (size - len(bare))}, "tensors": specs},
                     separators=(",", ":")).encode()
    assert len(raw) == size
    return wire.PREFIX.pack(wire.MAGIC, size) + raw


def test_header_limit_is_exact():
    limits = wire.Limits(max_header=200)
    assert wire.decode(_padded_header(200), limits).meta["pad"]  # at the limit: accepted
    with pytest.raises(wire.WireError, match="header of 201 bytes exceeds the limit of 200"):
        wire.decode(_padded_header(201), limits)
    default = wire.Limits().max_header
    wire.decode(_padded_header(default))
    with pytest.raises(wire.WireError, match="exceeds the limit"):
        wire.decode(_padded_header(default + 1))


def test_tensor_count_limit_is_exact():
    limits = wire.Limits(max_tensors=16)
    assert len(wire.decode(wire.encode("x", 0, [torch.zeros(1)] * 16), limits).tensors) == 16
    with pytest.raises(wire.WireError, match="17 tensors exceed the limit of 16"):
        wire.decode(wire.encode("x", 0, [torch.zeros(1)] * 17), limits)
    with pytest.raises(wire.WireError, match="exceed the limit"):
        wire.decode(wire.encode("x", 0, [torch.zeros(1)] * (wire.Limits().max_tensors + 1)))


def test_socket_reader_refuses_an_oversized_header_before_reading_it():
    import socket

    a, b = socket.socketpair()
    try:
        a.sendall(wire.PREFIX.pack(wire.MAGIC, 201))  # announces 201 bytes and sends none of them
        b.settimeout(5)
        with pytest.raises(wire.WireError, match="header of 201 bytes"):
            wire.recv(b, wire.Limits(max_header=200))  # without the limit it would block on the read
        a.sendall(_padded_header(200))
        assert wire.recv(b, wire.Limits(max_header=200))[1] == 8 + 200
    finally:
        a.close()
        b.close()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_survives_any_bytes(data):
    with contextlib.suppress(wire.WireError):
        wire.decode(data, wire.Limits(max_payload=1 << 16))


# ---- frames with a valid prefix, so that the header parser is what the fuzzer exercises ------------
LIMITS = wire.Limits(max_header=2048, max_payload=4096, max_tensors=4, max_dims=3)
plain = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=6)
specs = st.fixed_dictionaries({"dtype": st.sampled_from([*wire.DTYPES, "object", 3]),
                               "shape": st.lists(st.integers(-1, 12), max_size=4) | plain})
good_specs = st.fixed_dictionaries({"dtype": st.sampled_from(list(wire.DTYPES)),
                                    "shape": st.lists(st.integers(0, 6), max_size=3)})
good_headers = st.fixed_dictionaries({"kind": st.text(max_size=5), "id": st.integers(-3, 3),
                                      "meta": st.dictionaries(st.text(max_size=3), plain, max_size=3),
                                      "tensors": st.lists(good_specs, max_size=4)})
headers = good_headers | st.fixed_dictionaries({  # about half well formed, half broken somewhere
    "kind": st.text(max_size=5) | plain, "id": st.integers(-3, 3) | plain,
    "meta": st.dictionaries(st.text(max_size=3), plain, max_size=3) | plain,
    "tensors": st.lists(specs | plain, max_size=5) | plain})


def valid_layout(h) -> list[tuple[str, list[int]]] | None:
    """What a correct decoder accepts, from the format's definition (None: reject)."""
    if not (isinstance(h["kind"], str) and type(h["id"]) is int and isinstance(h["meta"], dict)
            and isinstance(h["tensors"], list) and len(h["tensors"]) <= LIMITS.max_tensors):
        return None
    out = []
    for spec in h["tensors"]:
        if not (isinstance(spec, dict) and set(spec) == {"dtype", "shape"} and spec["dtype"] in wire.DTYPES
                and isinstance(spec["shape"], list) and len(spec["shape"]) <= LIMITS.max_dims
                and all(type(s) is int and s >= 0 for s in spec["shape"])):
            return None
        out.append((spec["dtype"], spec["shape"]))
    return out


@settings(max_examples=300, deadline=None)
@given(headers, st.integers(-8, 8), st.data())
def test_decoder_accepts_exactly_the_well_formed_headers(header, payload_delta, data):
    raw = json.dumps(header).encode()
    layout = valid_layout(header)
    sizes = [torch.empty(0, dtype=wire.DTYPES[d]).element_size() * int(torch.tensor(s).prod()) for d, s in layout or []]
    fits = layout is not None and sum(sizes) <= LIMITS.max_payload
    size = max(0, sum(sizes) + payload_delta) if fits else data.draw(st.integers(0, 64))
    frame = wire.PREFIX.pack(wire.MAGIC, len(raw)) + raw + bytes(size)
    try:
        got = wire.decode(frame, LIMITS)
    except wire.WireError:
        assert not (fits and payload_delta == 0), header
        return
    assert fits and sum(sizes) == size, header
    assert [(wire.NAMES[t.dtype], list(t.shape)) for t in got.tensors] == layout
    assert (got.kind, got.id, got.meta) == (header["kind"], header["id"], header["meta"])


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


@pytest.mark.parametrize("text, depth", [
    (b'{"a":1}', 1), (b'{"a":[1,{"b":[]}]}', 4), (b'"[[[["', 0), (b'{"a":"\\\\"}', 1),
    (b'{"a":"\\"[[["}', 1), (b"[" * 5 + b"]" * 5, 5),
])
def test_json_depth_matches_an_independent_count(text, depth):
    assert wire.json_depth(text) == depth
    value = json.loads(text)

    def deep(v):
        return 1 + max(map(deep, v.values() if isinstance(v, dict) else v), default=0) if isinstance(v, (dict, list)) else 0
    assert deep(value) == depth


def test_deeply_nested_header_is_refused_before_parsing():
    header = b'{"kind":"hello","id":0,"meta":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b'},"tensors":[]}'
    frame = wire.PREFIX.pack(wire.MAGIC, len(header)) + header
    with pytest.raises(wire.WireError, match="nests deeper"):
        wire.decode(frame, wire.Limits(max_header=len(header)))


def test_reading_a_frame_that_stalls_times_out_and_idle_waits_are_bounded():
    import socket

    a, b = socket.socketpair()
    with a, b:
        frame = wire.encode("infer", 1, [torch.zeros(4, 4)])
        a.sendall(frame[:20])  # begun, never finished
        with pytest.raises(TimeoutError):
            wire.recv(b, wire.Limits(), idle_s=5.0, frame_s=0.2)
    a, b = socket.socketpair()
    with a, b, pytest.raises(TimeoutError):
        wire.recv(b, wire.Limits(), idle_s=0.2, frame_s=5.0)


@pytest.mark.parametrize("offered, token, same", [
    ("s3crét", "s3crét", True), ("s3cret", "s3crét", False), ("", "s3crét", False), ("ключ", "ключ", True),
    ("sesame", "sesame", True), ("\udcff", "x", False),
])
def test_tokens_compare_as_utf8_bytes(offered, token, same):
    from lowband.distill.teacher import same_token

    assert same_token(offered, token) is same
