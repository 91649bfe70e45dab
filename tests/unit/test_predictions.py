"""Prediction servers (codistillation's exchange=server): answers encoded and decoded against a direct
computation, versions served as asked, and hostile or stale clients refused."""

from __future__ import annotations

import time

import pytest
import torch

from lowband.comm.value_codecs import parse_codec
from lowband.distill import wire
from lowband.distill.predictions import PredictionClient, PredictionServer, decode_answer, encode_answer

IN_SHAPE, CLASSES = (6,), 5


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, CLASSES))


def roundtrip(out: torch.Tensor, codec: str, topk: int) -> torch.Tensor:
    """`out` encoded, framed as on the wire, parsed and decoded."""
    tensors, meta = encode_answer(out, parse_codec(codec), topk)
    return decode_answer(wire.decode(wire.encode("answer", 1, tensors, meta)), parse_codec(codec))


@pytest.mark.parametrize("shape", [(4, CLASSES), (3, 7, 256)])
def test_full_answers_come_back_as_sent(shape):
    out = torch.randn(shape)
    assert torch.equal(roundtrip(out, "fp32", 0), out)
    assert torch.equal(roundtrip(out, "fp16", 0), out.half().float())
    int8 = roundtrip(out, "int8", 0)
    assert (int8 - out).abs().max() <= out.abs().max() / 127 / 2 * 1.0001


def test_topk_keeps_each_rows_largest_and_the_rest_reads_as_probability_zero():
    out = torch.randn(3, 7, 256)
    back = roundtrip(out, "fp32", 8)
    kept = torch.isfinite(back)
    assert kept.sum(-1).eq(8).all()
    values, index = out.topk(8, dim=-1)
    assert torch.equal(back.gather(-1, index), values)
    assert torch.softmax(back, -1)[~kept].eq(0).all()
    tensors, _ = encode_answer(out, parse_codec("fp16"), 8)
    assert tensors[1].dtype == torch.uint8 and sum(t.numel() * t.element_size() for t in tensors) == 3 * 7 * 8 * 3


def test_indices_that_do_not_fit_are_refused():
    tensors, meta = encode_answer(torch.randn(2, CLASSES), parse_codec("fp32"), 2)
    tensors[1][0, 0] = CLASSES  # out of range
    with pytest.raises(wire.WireError):
        decode_answer(wire.Frame("answer", 1, meta, tensors), parse_codec("fp32"))


@pytest.fixture
def server():
    s = PredictionServer(model(0), IN_SHAPE, CLASSES, wait_s=0.5, read_timeout_s=5)
    s.start()
    yield s
    s.close()


def client(server, codec: str = "fp32") -> PredictionClient:
    return PredictionClient(server.address(), codec, site=0, timeout_s=5)


def test_answers_are_the_served_models_output_at_the_version_asked_for(server):
    x = torch.randn(4, *IN_SHAPE)
    ask = client(server)
    out, version, moved = ask.ask(x, 0)
    assert version == 0 and torch.equal(out, model(0)(x).detach()) and moved.sent > 0 and moved.recv > 0
    server.publish(10, model(1).state_dict())
    assert ask.ask(x, 10)[1] == 10 and torch.equal(ask.ask(x, 10)[0], model(1)(x).detach())
    assert torch.equal(ask.ask(x, 0)[0], model(0)(x).detach())  # a peer one exchange behind gets its version
    server.publish(20, model(2).state_dict())
    out, version, _ = ask.ask(x, 0)  # no longer held: the newest
    assert version == 20 and torch.equal(out, model(2)(x).detach())
    answered_bytes = server.take_bytes()
    assert answered_bytes[0] > 0 and answered_bytes[1] > 0 and server.take_bytes() == (0, 0, 0)


def test_a_version_not_yet_published_waits_for_it_then_takes_the_newest(server):
    out, version, _ = client(server).ask(torch.randn(2, *IN_SHAPE), 30)  # waits wait_s = 0.5 s
    assert version == 0


def test_a_wrong_token_or_a_wrong_input_is_refused(server):
    bad = PredictionClient({**server.address(), "token": "nope"}, "fp32", 0, 5)
    with pytest.raises(ConnectionError):
        bad.connect()
    ask = client(server)
    with pytest.raises(ConnectionError):
        ask.ask(torch.randn(2, 7), 0)  # the wrong shape: an error frame, and the connection closes
    assert ask.sock is None
    assert ask.ask(torch.randn(2, *IN_SHAPE), 0)[1] == 0  # it connects again


def test_a_stopped_server_fails_fast_and_one_on_its_port_answers_again(server):
    ask = client(server)
    ask.ask(torch.randn(2, *IN_SHAPE), 0)
    server.close()
    with pytest.raises((ConnectionError, OSError)):
        ask.ask(torch.randn(2, *IN_SHAPE), 0)
    again = PredictionServer(model(3), IN_SHAPE, CLASSES, port=server.port, token=server.token)
    again.start()
    try:
        out, _, _ = ask.ask(x := torch.randn(2, *IN_SHAPE), 0)
        assert torch.equal(out, model(3)(x).detach())
    finally:
        again.close()


def test_the_server_binds_loopback_by_default(server):
    assert server.address()["host"] == "127.0.0.1" and server.sock.getsockname()[0] == "127.0.0.1"


class SlowCounter(PredictionServer):
    """A server whose byte count takes 0.3 s: an answer counted after it was sent would reach the asker
    before its bytes are in the count."""

    def answered(self, frame, request_bytes, reply_bytes):
        time.sleep(0.3)
        super().answered(frame, request_bytes, reply_bytes)


def test_an_answers_bytes_are_counted_before_the_asker_holds_it():
    """A rank takes its server's count right after its peers' last answers (a barrier); an answer counted
    after it was sent would be missing from it."""
    s = SlowCounter(model(0), IN_SHAPE, CLASSES, wait_s=0.5, read_timeout_s=5)
    s.start()
    try:
        ask = client(s)
        for _ in range(2):
            _, _, moved = ask.ask(torch.randn(3, *IN_SHAPE), 0)
            counted = s.take_bytes()  # at once: no sleep gives a late count its chance
            assert (counted.sent, counted.recv) == (moved.recv, moved.sent) and moved.recv > 0
    finally:
        s.close()
