"""EDL-Dist's teacher sources in one process: what each yields, feeds and counts."""

from __future__ import annotations

import torch

from lowband.comm import Communicator
from lowband.comm.ledger import Traffic
from lowband.data import Batch
from lowband.distill.sources import InProcessTeacher, NoTeacher, RemoteTeachers


class Loader:
    """Two 3-sample minibatches per epoch; the ids say which epoch they belong to."""

    def epoch(self, epoch: int):
        for step in range(2):
            ids = torch.arange(3) + 100 * epoch + 10 * step
            yield Batch(ids.float().unsqueeze(1), ids % 2, ids)


class FakeReader:
    """What RemoteTeachers uses of a DistilReader: feed, get, byte counters, the timeline."""

    def __init__(self):
        self.fed, self.links, self.closed = [], ["a", "b"], 0
        self.stats = {"resent": 1, "teacher_failures": 0, "batches_sent": 4, "starved_s": 0.25}
        self.moved = [0, 0]
        self.queue: dict[tuple[int, int], Batch] = {}

    def feed(self, epoch, batches):
        self.fed.append(epoch)
        for step, b in enumerate(batches):
            self.queue[(epoch, step)] = b

    def get(self, epoch, step):
        self.moved[0] += 100
        self.moved[1] += 30
        b = self.queue.pop((epoch, step))
        return b, -b.x.repeat(1, 4)

    def take_bytes(self):
        moved, self.moved = Traffic(*self.moved), [0, 0]
        return moved

    def take_timeline(self):
        return [{"buffer": 2, "teachers": 1}, {"buffer": 6, "teachers": 2}]

    def close(self):
        self.closed += 1


def test_no_teacher_yields_the_batches_untouched():
    got = list(NoTeacher().batches(1, Loader()))
    assert [b.ids.tolist() for b in got] == [[100, 101, 102], [110, 111, 112]] and all(b.logits is None for b in got)
    assert NoTeacher().end_epoch() == ({}, [])


def test_in_process_teacher_answers_each_batch_with_its_forward_pass():
    teacher = torch.nn.Linear(1, 4)
    for b in InProcessTeacher(teacher).batches(2, Loader()):
        torch.testing.assert_close(b.logits, teacher(b.x).detach())
        assert not b.logits.requires_grad


def test_remote_teachers_prefetch_the_next_epoch_count_every_byte_and_report():
    reader, comm = FakeReader(), Communicator()
    source = RemoteTeachers(reader, comm, steps_per_epoch=2, last_epoch=2, device=torch.device("cpu"))
    first = list(source.batches(1, Loader()))
    assert reader.fed == [1, 2]  # epoch 2's batches go out before epoch 1 ends
    assert [b.ids.tolist() for b in first] == [[100, 101, 102], [110, 111, 112]]
    torch.testing.assert_close(first[0].logits, -first[0].x.repeat(1, 4))
    list(source.batches(2, Loader()))
    assert reader.fed == [1, 2, 2]  # the last epoch prefetches nothing more
    s = comm.ledger.stats["soft-labels"]
    assert (s.sent, s.recv, s.inter, s.calls) == (400, 120, 400, 4)  # each byte once, all across sites
    figures, timeline = source.end_epoch()
    assert figures == {"distill": {"teachers": 2, "teachers_max": 2, "buffer_mean": 4.0, "buffer_max": 6, "resent": 1,
                                   "teacher_failures": 0, "batches_sent": 4, "starved_s": 0.25}}
    assert len(timeline) == 2
    source.close()
    assert reader.closed == 1


def test_a_modelled_link_holds_the_student_to_the_links_rate(monkeypatch):
    from lowband.net.links import LinkModel, LinkSpec

    waited = []
    monkeypatch.setattr(LinkModel, "wait_until", staticmethod(waited.append))
    comm = Communicator()
    comm.ledger.link = LinkModel(LinkSpec(8000.0, latency_s=5.0))  # 1000 bytes/s; the latency is hidden by the prefetch
    source = RemoteTeachers(FakeReader(), comm, steps_per_epoch=2, last_epoch=1, device=torch.device("cpu"))
    list(source.batches(1, Loader()))
    # 100 bytes out per batch (30 back, on the other direction's queue): 0.1 s of wire each, queued
    assert len(waited) == 2 and 0.099 < waited[1] - waited[0] < 0.101
    assert waited[-1] == comm.link.free_at["teachers-out"]  # the rate only: no 5 s latency per batch
