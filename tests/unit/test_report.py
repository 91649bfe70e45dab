"""The report from fixed, small comparison folders (two seeds per label): its answer per link class,
its table (the comparison table's), every plot, tuning, and overlays named by --labels."""

from __future__ import annotations

import csv
import json

import pytest

from lowband.comparison.report import build, load_runs
from lowband.data.metric import ACCURACY, BITS_PER_BYTE
from lowband.errors import UsageError


def record(epoch, val, sent_per_epoch, secs_per_epoch, compute_per_epoch, calls_per_epoch=10):
    sent = sent_per_epoch * epoch
    return {"epoch": epoch, "val_acc": val, "test_acc": val - 0.01, "val_acc_L": val, "test_acc_L": val - 0.01,
            "samples": 3000 * epoch, "bytes_sent_per_worker": sent,
            "bytes": {"grad": {"sent": sent, "recv": sent, "calls": calls_per_epoch * epoch}} if sent else {},
            "time": {"train_s": secs_per_epoch * epoch, "epoch_train_s": secs_per_epoch,
                     "compute_s": compute_per_epoch}}


def seeds(vals_by_seed, sent, secs, compute):
    return [[record(e, v, sent, secs, compute) for e, v in enumerate(vals, 1)] for vals in vals_by_seed]


# allreduce: 1 MB and 10 s an epoch; mean curve .5 .8 .91 -> the target is 0.91, reached at epoch 3
# local SGD: 10 kB and 5 s an epoch; mean curve .6 .92 .93 -> reaches at epoch 2
# single: sends nothing, never reaches
RUNS = {
    "allreduce": seeds([[0.5, 0.8, 0.90], [0.5, 0.8, 0.92]], 1e6, 10, 2),
    "local_sgd:tau=16": seeds([[0.6, 0.91, 0.92], [0.6, 0.93, 0.94]], 1e4, 5, 5),
    "single": seeds([[0.4, 0.7, 0.85], [0.4, 0.7, 0.85]], 0.0, 8, 8),
}


def make_comparison(folder, runs=RUNS, link="unlimited", with_seed=True, tuning=None, workers=None):
    folder.mkdir()
    rows = []
    for label, per_seed in runs.items():
        for seed, records in enumerate(per_seed):
            run_dir = folder / f"{label.replace(':', '_')}-seed{seed}"
            run_dir.mkdir()
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            (run_dir / "config.toml").write_text(f'[link]\nrate = "{link}"\nmode = "model"\n')
            rows.append({"label": label, "method": label.split(":")[0], "seed": seed,
                         "workers": (workers or {}).get(label, 4),
                         "status": "ok", "run_dir": str(run_dir)})
    fields = ["label", "method", "seed", "workers", "status", "run_dir"]
    write_csv(folder / "summary.csv", rows, fields if with_seed else [f for f in fields if f != "seed"])
    if tuning:
        write_csv(folder / "tuning.csv", tuning, ["label", "field", "value", "val_acc", "chosen"])
    return folder


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def table(md: str, title: str = "| method | seeds |") -> dict[str, list[str]]:
    start = md.index(title)
    lines = []
    for line in md[start:].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


def test_report_answers_per_link_class_from_two_seeds(tmp_path):
    folder = make_comparison(tmp_path / "cmp")
    md = read(build([str(folder)]))
    assert "Target accuracy (validation): 0.9100 (mean final validation accuracy of allreduce over 2 seeds)" in md
    # 1 mbit: allreduce 3 x 10 s + 3 MB x 8 / 1e6 = 54 s; local SGD 2 x 5 s + 20 kB x 8 / 1e6 = 10.16 s
    assert ("At 1 mbit the fastest to target is local_sgd:tau=16 (10.2 s; allreduce 54.0 s), the fewest bytes "
            "local_sgd:tau=16 (20.00 kB per worker).") in md
    assert "At 10 gbit the fastest to target is local_sgd:tau=16 (10.0 s; allreduce 30.0 s)" in md
    rows = table(md)
    assert rows["allreduce"][:6] == ["allreduce", "2", "4", "0.9100 ± 0.0141", "0.9000 ± 0.0141",
                                     "+0.00 pts (within noise)"]
    assert rows["allreduce"][6:] == ["9.00k", "3.00 MB", "30.0 ± 0.0", "3", "3.00 MB", "30.0", "1.00x"]
    assert rows["local_sgd:tau=16"][3] == "0.9300 ± 0.0141" and rows["local_sgd:tau=16"][9:] == [
        "2", "20.00 kB", "10.0", "3.00x"]
    assert rows["single"][5] == "-6.00 pts" and rows["single"][7] == "0 B" and rows["single"][9:] == [
        "never", "never", "never", "-"]
    for name in ("time_link", "pareto", "acc_epoch", "acc_bytes", "acc_time"):
        png = folder / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000 and f"({name}.png)" in md
    page = (folder / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5 and "<td>0.9300 ± 0.0141</td>" in page
    assert "## Tuning" not in md


def test_when_one_worker_is_fastest_the_answer_also_names_the_fastest_on_all_workers(tmp_path):
    # single (1 worker): 3 s an epoch, reaches 0.91 at epoch 2 (6 s, no bytes); local SGD as above (10.2 s at 1 mbit)
    runs = {**RUNS, "single": seeds([[0.8, 0.95, 0.96], [0.8, 0.95, 0.96]], 0.0, 3, 3)}
    md = read(build([str(make_comparison(tmp_path / "c", runs, workers={"single": 1}))]))
    assert ("At 1 mbit the fastest to target is single (6.0 s; allreduce 54.0 s), the fewest bytes single (0 B per "
            "worker); on all 4 workers (when one machine cannot hold the data or the job) local_sgd:tau=16 (10.2 s).") in md
    assert "At 10 gbit the fastest to target is single (6.0 s; allreduce 30.0 s)" in md and md.count("on all 4 workers") == 5
    plain = read(build([str(make_comparison(tmp_path / "d"))]))  # the fastest already uses every worker: no clause
    assert "on all 4 workers" not in plain


def test_the_projection_takes_the_measured_links_transfer_out(tmp_path):
    # the same runs measured on a 1 mbit link: allreduce's 10 s epochs held 8 s of transfer
    folder = make_comparison(tmp_path / "slow", link="1mbit")
    md = read(build([str(folder)]))
    assert "Link: 1 mbit/s (model)" in md
    # at 10 gbit allreduce: 3 x max(10 - 8, compute 2) = 6 s; local SGD: 2 x max(5 - 0.08, 5) = 10 s
    assert "At 10 gbit the fastest to target is allreduce (6.0 s)" in md


def test_a_summary_without_seeds_and_a_given_target(tmp_path):
    runs = {label: per_seed[:1] for label, per_seed in RUNS.items()}
    md = read(build([str(make_comparison(tmp_path / "c", runs, with_seed=False))], target=0.7))
    assert "Target accuracy (validation): 0.7000 (given)" in md
    rows = table(md)
    assert rows["single"][1] == "1" and rows["single"][3] == "0.8500" and rows["single"][9] == "2"
    # at 0.7 every label reaches at epoch 2: allreduce 20 s + 2 MB at 1 mbit, local SGD 10.16 s, single 16 s
    assert ("At 1 mbit the fastest to target is local_sgd:tau=16 (10.2 s; allreduce 36.0 s), the fewest bytes "
            "single (0 B per worker).") in md
    assert "At 10 gbit the fastest to target is local_sgd:tau=16 (10.0 s; allreduce 20.0 s)" in md


def test_tuning_table_shows_values_tried_and_the_chosen_one(tmp_path):
    tuning = [{"label": "local_sgd:tau=16", "field": "optim.lr", "value": v, "val_acc": a, "chosen": c}
              for v, a, c in (("0.05", "0.81", "false"), ("0.1", "0.905", "true"), ("0.2", "nan-ish", "false"))]
    md = read(build([str(make_comparison(tmp_path / "c", tuning=tuning))]))
    rows = table(md, "| method | setting |")
    assert rows["local_sgd:tau=16"] == ["local_sgd:tau=16", "optim.lr", "0.05 (0.8100), 0.1 (0.9050), 0.2 (-)", "0.1"]


def test_two_comparisons_overlay_with_the_names_given(tmp_path):
    a = make_comparison(tmp_path / "compare-20261122-101010")
    b = make_comparison(tmp_path / "compare-20261122-111111", link="10mbit,20ms")
    md = read(build([str(a), str(b)], out=str(tmp_path / "both"), labels=["base", "tuned"]))
    rows = table(md)
    assert set(rows) == {f"{p}/{m}" for p in ("base", "tuned") for m in RUNS}
    assert "unlimited (model)" in md and "10 mbit/s, 20 ms latency (model)" in md
    assert "mean final validation accuracy of base/allreduce" in md
    named = read(build([str(a), str(b)], out=str(tmp_path / "plain")))
    assert "compare-20261122-111111/single" in table(named)
    with pytest.raises(UsageError, match="--labels='base' names 1 comparisons; give one non-empty name per"):
        build([str(a), str(b)], out=str(tmp_path / "bad"), labels=["base"])


def test_report_command_names_overlays_and_checks_latency(tmp_path, capsys):
    from lowband.cli import main

    a, b = make_comparison(tmp_path / "a"), make_comparison(tmp_path / "b")
    out = tmp_path / "o"
    assert main(["report", str(a), str(b), "--labels", "base,tuned", "--out", str(out), "--latency", "20ms"]) == 0
    md = (out / "report.md").read_text()
    assert "tuned/local_sgd:tau=16" in md and "20 ms latency per message" in md
    # 1 mbit with 20 ms a message: local SGD 10.16 s + 20 messages x 0.02 s
    assert "fastest to target is base/local_sgd:tau=16 (10.6 s" in md
    assert main(["report", str(a), "--latency", "soon"]) == 2
    assert "--latency='soon' does not parse" in capsys.readouterr().err


def test_zero_bytes_sit_a_decade_left_of_the_rest_and_the_front_is_non_dominated():
    from lowband.comparison.plots import pareto_front, short_bytes, zero_position

    assert zero_position([0.0, 2.5e4, 3e6]) == pytest.approx(1e3) and zero_position([0.0]) == 1e3
    assert pareto_front([(1e3, 0.85), (2e4, 0.93), (3e6, 0.91), (5e5, 0.95)]) == [(1e3, 0.85), (2e4, 0.93),
                                                                                (5e5, 0.95)]
    assert [short_bytes(v) for v in (1e3, 1e5, 2.5e6, 100)] == ["1 kB", "100 kB", "2.5 MB", "100 B"]


@pytest.mark.parametrize("name", ["quick", "afsd", "ecdnn", "rdpsgd", "edl", "sites", "demo", "lm", "lm-small"])
def test_built_in_suites_resolve_to_valid_configs(name):
    from lowband.comparison.plan import make_plan
    from lowband.comparison.request import load_suite

    suite = load_suite(name)
    plan = make_plan(suite["methods"], suite["config"], {}, "F", suite=suite)
    assert plan.labels == suite["methods"]  # make_plan raises on any invalid option, setting or world size


def test_user_suite_files_and_unknown_suites(tmp_path):
    from lowband.comparison.request import load_suite
    from lowband.errors import ConfigError, UsageError

    good = tmp_path / "mine.toml"
    good.write_text('methods = ["allreduce", "local_sgd:tau=4"]\n[config.train]\nepochs = 2\n')
    assert load_suite(path=str(good))["config"] == {"train": {"epochs": 2}}
    bad = tmp_path / "bad.toml"
    bad.write_text("methods = []\n")
    with pytest.raises(ConfigError, match="a suite needs methods"):
        load_suite(path=str(bad))
    with pytest.raises(UsageError, match="unknown suite 'nope'; known: afsd, demo, ecdnn, edl, lm, lm-small, quick, rdpsgd"):
        load_suite("nope")


def test_edl_runs_add_the_buffer_and_teachers_plot(tmp_path):
    folder = make_comparison(tmp_path / "c")
    assert "distill.png" not in read(build([str(folder)]))
    points = [{"epoch": 1, "t": 0.25 * i, "buffer": i % 5, "teachers": 1 + i // 4, "sending": True, "inflight": 2}
              for i in range(12)]
    (folder / "single-seed0" / "distill.rank0.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    with open(build([str(folder)])) as f:
        assert "(distill.png)" in f.read()
    assert (folder / "distill.png").stat().st_size > 5000
    assert "data:image/png;base64" in (folder / "report.html").read_text().split("distill")[-1]


def test_a_target_budget_reports_samples_to_target_never_within_f_and_projects_to_the_target(tmp_path):
    from lowband.comparison import plan as P
    from lowband.comparison.folder import ComparisonDir

    # the target is Allreduce's mean final 0.91; local SGD reached it at epoch 2 and its records stop there;
    # single ran to its cap (2x) without reaching it
    runs = {"allreduce": RUNS["allreduce"], "local_sgd:tau=16": [r[:2] for r in RUNS["local_sgd:tau=16"]],
            "single": seeds([[0.4, 0.7, 0.8, 0.84, 0.85, 0.85]] * 2, 0.0, 8, 8)}
    folder = make_comparison(tmp_path / "c", runs=runs)
    configs = {label: {"method": {"name": label.split(":")[0]}} for label in runs}
    ComparisonDir(str(folder)).save_plan(P.Plan(list(runs), configs, budget="target", factor=2.0, reference="allreduce"))
    md = read(build([str(folder)]))
    head = next(line for line in md.splitlines() if line.startswith("| method | seeds |"))
    rows = table(md)
    column = [c.strip() for c in head.strip("|").split("|")].index("samples to target")
    assert rows["allreduce"][column] == "9.00k" and rows["local_sgd:tau=16"][column] == "6.00k"
    assert rows["single"][column] == "never within 2x"
    # at 1 mbit local SGD's two epochs (not a third it never ran) against Allreduce's three, as in the
    # equal-epochs report above (Allreduce 3 x (10 s + 8 s for 1 MB)); it spent 6,000 of its 9,000 samples
    assert ("At 1 mbit the fastest to target is local_sgd:tau=16 (10.2 s; allreduce 54.0 s; 0.67x allreduce's "
            "training samples)") in md
    assert "local_sgd:tau=16 0.67x; never within 2x: single." in md
    assert "Budget: to the target" in md


def test_a_run_whose_config_cannot_be_read_keeps_its_records_metric(tmp_path, capsys):
    folder = make_comparison(tmp_path / "cmp", runs={"allreduce": [[record(1, 0.5, 1e6, 10, 2)]]})
    run_dir = next(p for p in folder.iterdir() if p.is_dir())
    (run_dir / "config.toml").write_text("[nosuchtable]\nx = 1\n")  # another version's, or damaged
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    text = [json.dumps({**json.loads(line), "val_bpb": 2.5, "test_bpb": 2.6}) for line in lines]
    (run_dir / "metrics.jsonl").write_text("\n".join(text) + "\n")
    (run,) = load_runs([str(folder)])
    assert run.metric is BITS_PER_BYTE and "nosuchtable" in capsys.readouterr().err
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert load_runs([str(folder)])[0].metric is ACCURACY  # no bits per byte anywhere: accuracy


def test_a_comparison_whose_reference_is_not_allreduce_names_it_in_the_table_and_the_sentences(tmp_path):
    """The plan's reference (the suite's `target`: here single) sets the target, the speed-ups' base and the
    link sentences' comparison; no figure falls back to Allreduce."""
    from lowband.comparison import plan as P
    from lowband.comparison.folder import ComparisonDir

    folder = make_comparison(tmp_path / "c")
    configs = {label: {"method": {"name": label.split(":")[0]}} for label in RUNS}
    ComparisonDir(str(folder)).save_plan(P.Plan(list(RUNS), configs, reference="single"))
    md = read(build([str(folder)]))
    assert "Target accuracy (validation): 0.8500 (mean final validation accuracy of single over 2 seeds)" in md
    head = next(line for line in md.splitlines() if line.startswith("| method | seeds |"))
    assert "speed-up vs single" in head and "allreduce" not in head
    rows = table(md)
    # single reaches its own 0.85 at epoch 3 (24 s), local SGD at epoch 2 (10 s), Allreduce at epoch 3 (30 s)
    assert rows["single"][5] == "+0.00 pts" and rows["single"][-1] == "1.00x"
    assert rows["local_sgd:tau=16"][-1] == "2.40x" and rows["allreduce"][-1] == "0.80x"
    assert "At 1 mbit the fastest to target is local_sgd:tau=16 (10.2 s; single 24.0 s)" in md


def test_a_language_models_report_says_how_the_gaps_move_with_size(tmp_path):
    """A comparison on bits per byte quotes the packaged scale ladder and the size its model is nearest;
    one on accuracy does not."""
    folder = make_comparison(tmp_path / "c")
    assert "Model size:" not in read(build([str(folder)]))
    for run_dir in (p for p in folder.iterdir() if p.is_dir()):
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        text = [json.dumps({**json.loads(line), "val_bpb": 2.5, "test_bpb": 2.6, "params": 800_000}) for line in lines]
        (run_dir / "metrics.jsonl").write_text("\n".join(text) + "\n")
        (run_dir / "config.toml").write_text('[data]\nname = "text"\n' + (run_dir / "config.toml").read_text())
    md = read(build([str(folder)]))
    line = next(x for x in md.splitlines() if x.startswith("Model size: the scale ladder"))
    assert "small (834,304 parameters): sparseloco" in line
    assert line.endswith("This comparison's model has 800,000 parameters, nearest to small.")
