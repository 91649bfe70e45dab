"""A comparison's report: plots and a table, as report.md (PNG files beside it) and report.html.

Plots: test accuracy against epoch, against bytes sent per worker (log scale) and against
training time. Table, per method: final accuracy, and the epochs, bytes per worker and seconds
it took to first reach the target accuracy (default: the Allreduce run's final accuracy), and
its speed-up over Allreduce (Allreduce's seconds to target / the method's). Also the machine and
the link the runs had. Two or more comparison directories can be overlaid. Where a run used
EDL-Dist teacher servers, one more plot: its rank 0's soft-label buffer and teachers held over time.
"""

from __future__ import annotations

import base64
import csv
import html
import os
import platform
import tomllib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from lowband.metrics import human_bytes, median, read_metrics  # noqa: E402
from lowband.rundir import RunDir  # noqa: E402

PLOTS = [("acc_epoch", "epoch", "epoch", False), ("acc_bytes", "bytes_sent_per_worker", "bytes sent per worker", True),
         ("acc_time", "train_s", "training time (s)", False)]


def load_runs(folders: list[str]) -> list[dict]:
    """Every run of the comparison directories, with its evaluated epoch records."""
    runs = []
    for folder in folders:
        prefix = f"{os.path.basename(os.path.normpath(folder))}/" if len(folders) > 1 else ""
        with open(os.path.join(folder, "summary.csv")) as f:
            for row in csv.DictReader(f):
                run_dir = row["run_dir"] if os.path.isabs(row["run_dir"]) else os.path.join(folder, os.path.basename(row["run_dir"]))
                records = [r for r in read_metrics(run_dir) if r.get("test_acc") is not None]
                runs.append({"label": prefix + row["label"], "method": row["method"], "workers": row["workers"],
                             "run_dir": run_dir, "records": records})
    return runs


def first_reaching(records: list[dict], target: float) -> dict | None:
    return next((r for r in records if r["test_acc"] >= target), None)


def pick_target(runs: list[dict], target: float | None, reference: str = "allreduce") -> tuple[float | None, str]:
    if target is not None:
        return target, "given"
    ref = next((r for r in runs if r["method"] == reference and r["records"]), None)
    if ref is None:
        return None, "none (no Allreduce run)"
    return ref["records"][-1]["test_acc"], f"final accuracy of {ref['label']}"


def table_rows(runs: list[dict], target: float | None) -> list[dict]:
    ref = next((r for r in runs if r["method"] == "allreduce"), None)
    ref_hit = first_reaching(ref["records"], target) if ref and target is not None else None
    rows = []
    for run in runs:
        last = run["records"][-1] if run["records"] else None
        hit = first_reaching(run["records"], target) if target is not None else None
        speedup = ref_hit["time"]["train_s"] / max(hit["time"]["train_s"], 1e-9) if hit and ref_hit else None
        rows.append({"label": run["label"], "workers": run["workers"],
                     "final_acc": last["test_acc"] if last else None,
                     "bytes_total": last["bytes_sent_per_worker"] if last else None,
                     "epochs_to_target": hit["epoch"] if hit else None,
                     "bytes_to_target": hit["bytes_sent_per_worker"] if hit else None,
                     "seconds_to_target": hit["time"]["train_s"] if hit else None, "speedup": speedup,
                     "samples_per_s": median([r["samples_per_s"] for r in run["records"] if r.get("samples_per_s")])})
    return rows


def distill_timelines(runs: list[dict]) -> list[tuple[str, list[dict]]]:
    """(label, rank 0's distill.rank0.jsonl points) for every run that has one."""
    out = []
    for run in runs:
        points = RunDir(run["run_dir"]).read("distill", rank=0, per_rank=True)
        if points:
            out.append((run["label"], points))
    return out


def plot_distill(timelines: list[tuple[str, list[dict]]], path: str) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=True)
    for label, points in timelines:
        ts = [p["t"] for p in points]
        top.plot(ts, [p["buffer"] for p in points], label=label, linewidth=1)
        bottom.step(ts, [p["teachers"] for p in points], where="post", label=label)
    top.set_ylabel("unused soft labels (batches)")
    bottom.set_ylabel("teachers held")
    bottom.set_ylim(bottom=0, top=max((p["teachers"] for _, pts in timelines for p in pts), default=1) + 1)
    bottom.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    bottom.set_xlabel("time since the reader started (s), rank 0")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot(runs: list[dict], key: str, xlabel: str, log: bool, target: float | None, path: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for run in runs:
        xs = [r["epoch"] if key == "epoch" else (r[key] if key in r else r["time"][key]) for r in run["records"]]
        if log:
            xs = [max(x, 1.0) for x in xs]  # methods that send nothing sit at 1 byte
        ax.plot(xs, [r["test_acc"] for r in run["records"]], marker=".", label=run["label"])
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.4f}")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def machine() -> str:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or "unknown") if os.path.exists("/proc/cpuinfo") else platform.processor()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"{os.cpu_count()} cores ({cpu}), torch {torch.__version__}, GPU {gpu}, Python {platform.python_version()}"


def link_of(runs: list[dict]) -> str:
    from lowband.comm.links import parse_link

    seen = set()
    for run in runs:
        path = os.path.join(run["run_dir"], "config.toml")
        if os.path.exists(path):
            with open(path, "rb") as f:
                link = tomllib.load(f).get("link", {})
            seen.add(f"{parse_link(link.get('rate', '')).describe()} ({link.get('mode', 'model')})")
    return "; ".join(sorted(seen)) or "unknown"


def fmt(v, kind: str) -> str:
    if v is None:
        return "never" if kind in ("epochs", "bytes_t", "secs") else "-"
    return {"acc": f"{v:.4f}", "bytes": human_bytes(v), "bytes_t": human_bytes(v), "epochs": str(v),
            "secs": f"{v:.1f}", "x": f"{v:.2f}x", "rate": f"{v:.0f}"}[kind]


COLUMNS = [("label", "method", None), ("workers", "workers", None), ("final_acc", "final acc", "acc"),
           ("bytes_total", "sent/worker", "bytes"), ("epochs_to_target", "epochs to target", "epochs"),
           ("bytes_to_target", "bytes to target", "bytes_t"), ("seconds_to_target", "seconds to target", "secs"),
           ("speedup", "speed-up vs allreduce", "x"), ("samples_per_s", "samples/s", "rate")]


def cells(row: dict) -> list[str]:
    return [str(row[k]) if kind is None else fmt(row[k], kind) for k, _, kind in COLUMNS]


def build(folders: list[str], out: str | None = None, target: float | None = None) -> str:
    """Write report.md, report.html and the plots into `out` (default: the first folder); returns report.md."""
    out = out or folders[0]
    os.makedirs(out, exist_ok=True)
    runs = load_runs(folders)
    target, why = pick_target(runs, target)
    for name, key, xlabel, log in PLOTS:
        plot(runs, key, xlabel, log, target, os.path.join(out, f"{name}.png"))
    images = [name for name, *_ in PLOTS]
    timelines = distill_timelines(runs)
    if timelines:
        plot_distill(timelines, os.path.join(out, "distill.png"))
        images.append("distill")
    rows = table_rows(runs, target)
    head = [title for _, title, _ in COLUMNS]
    facts = [f"Target accuracy: {'-' if target is None else f'{target:.4f}'} ({why})",
             f"Machine: {machine()}", f"Link: {link_of(runs)}", f"Comparisons: {', '.join(folders)}"]
    md = ["# lowband comparison", "", *[f"- {f}" for f in facts], "", "| " + " | ".join(head) + " |",
          "|" + "---|" * len(head), *["| " + " | ".join(cells(r)) + " |" for r in rows], ""]
    md += [f"![{name}]({name}.png)" for name in images]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    write_html(os.path.join(out, "report.html"), facts, head, [cells(r) for r in rows], out, images)
    return os.path.join(out, "report.md")


def write_html(path: str, facts: list[str], head: list[str], body: list[list[str]], folder: str,
               names: list[str]) -> None:
    images = []
    for name in names:
        with open(os.path.join(folder, f"{name}.png"), "rb") as f:
            images.append(f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(f.read()).decode()}">')
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    page = (f"<!doctype html><meta charset='utf-8'><title>lowband comparison</title>"
            f"<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse}}"
            f"td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}</style>"
            f"<h1>lowband comparison</h1><ul>{''.join(f'<li>{html.escape(x)}</li>' for x in facts)}</ul>"
            f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>{rows}</table>{''.join(images)}")
    with open(path, "w") as f:
        f.write(page)
