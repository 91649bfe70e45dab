"""The report from a fixed, small set of metrics files: every plot, and table values from the input."""

from __future__ import annotations

import csv
import json

import pytest

from lowband.report import build


def record(epoch, acc, sent, secs):
    return {"epoch": epoch, "test_acc": acc, "bytes_sent_per_worker": sent, "time": {"train_s": secs}}


RUNS = {
    "allreduce": [record(1, 0.5, 1e6, 10), record(2, 0.8, 2e6, 20), record(3, 0.9, 3e6, 30)],
    "local_sgd:tau=16": [record(1, 0.6, 1e5, 5), record(2, 0.91, 2e5, 10), record(3, 0.92, 3e5, 15)],
    "single": [record(1, 0.4, 0, 8), record(2, 0.7, 0, 16), record(3, 0.85, 0, 24)],
}
for _r, _rate in zip(RUNS["single"], (900.0, 1000.0, 5000.0)):
    _r["samples_per_s"] = _rate  # the table shows the median


def make_comparison(folder, runs=RUNS, link="10mbit,20ms"):
    folder.mkdir()
    rows = []
    for label, records in runs.items():
        run_dir = folder / label.replace(":", "_")
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run_dir / "config.toml").write_text(f'[link]\nrate = "{link}"\nmode = "model"\n')
        rows.append({"label": label, "method": label.split(":")[0], "workers": 4, "run_dir": str(run_dir)})
    with open(folder / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["label", "method", "workers", "run_dir"])
        writer.writeheader()
        writer.writerows(rows)
    return folder


def table(md: str) -> dict[str, list[str]]:
    lines = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}


def test_report_has_every_plot_and_the_input_values(tmp_path):
    folder = make_comparison(tmp_path / "cmp")
    md = open(build([str(folder)])).read()
    for name in ("acc_epoch", "acc_bytes", "acc_time"):
        png = folder / f"{name}.png"
        assert png.exists() and png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
        assert f"({name}.png)" in md
    assert "Target accuracy: 0.9000 (final accuracy of allreduce)" in md
    assert "Link: 10 mbit/s, 20 ms latency (model)" in md and "cores" in md and "torch" in md
    rows = table(md)
    # method, workers, final acc, sent/worker, epochs to target, bytes to target, seconds to target, speed-up
    assert rows["allreduce"] == ["allreduce", "4", "0.9000", "3.00 MB", "3", "3.00 MB", "30.0", "1.00x", "-"]
    assert rows["local_sgd:tau=16"] == ["local_sgd:tau=16", "4", "0.9200", "300.00 kB", "2", "200.00 kB", "10.0",
                                        "3.00x", "-"]
    assert rows["single"][4:] == ["never", "never", "never", "-", "1000"]  # samples/s: the median
    page = (folder / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "local_sgd:tau=16" in page


def test_two_comparisons_overlay_with_their_names(tmp_path):
    a = make_comparison(tmp_path / "fast", link="unlimited")
    b = make_comparison(tmp_path / "slow")
    out = tmp_path / "both"
    md = open(build([str(a), str(b)], out=str(out))).read()
    rows = table(md)
    assert "fast/allreduce" in rows and "slow/local_sgd:tau=16" in rows and len(rows) == 6
    assert "unlimited (model)" in md and "10 mbit/s" in md


def test_given_target_overrides_allreduce(tmp_path):
    md = open(build([str(make_comparison(tmp_path / "c"))], target=0.7)).read()
    assert table(md)["single"][4] == "2" and "Target accuracy: 0.7000 (given)" in md


@pytest.mark.parametrize("name", ["quick", "afsd", "ecdnn", "rdpsgd", "edl"])
def test_built_in_suites_resolve_to_valid_configs(name):
    from lowband import config as C
    from lowband.compare import load_suite, with_method
    from lowband.runs import method_configs, world_size

    suite = load_suite(name)
    base = C.from_dict({**suite["config"], "method": {"name": "allreduce"}}, method_configs())
    for spec in suite["methods"]:
        world_size(with_method(base, spec, suite["method_defaults"]))  # raises on any invalid option or world size


def test_user_suite_files_and_unknown_suites(tmp_path):
    from lowband.compare import load_suite
    from lowband.errors import ConfigError, UsageError

    good = tmp_path / "mine.toml"
    good.write_text('methods = ["allreduce", "local_sgd:tau=4"]\n[config.train]\nepochs = 2\n')
    assert load_suite(path=str(good))["config"] == {"train": {"epochs": 2}}
    bad = tmp_path / "bad.toml"
    bad.write_text("methods = []\n")
    with pytest.raises(ConfigError, match="a suite needs methods"):
        load_suite(path=str(bad))
    with pytest.raises(UsageError, match="unknown suite 'nope'; known: afsd, ecdnn, edl, quick, rdpsgd"):
        load_suite("nope")


def test_edl_runs_add_the_buffer_and_teachers_plot(tmp_path):
    folder = make_comparison(tmp_path / "c")
    assert "distill.png" not in open(build([str(folder)])).read()
    points = [{"epoch": 1, "t": 0.25 * i, "buffer": i % 5, "teachers": 1 + i // 4, "sending": True, "inflight": 2}
              for i in range(12)]
    (folder / "single" / "distill.rank0.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    with open(build([str(folder)])) as f:
        assert "(distill.png)" in f.read()
    assert (folder / "distill.png").stat().st_size > 5000
    assert "data:image/png;base64" in (folder / "report.html").read_text().split("distill")[-1]
