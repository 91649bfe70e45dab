"""A comparison's words: the sentences of its report and the console's verdict (which method is fastest on
each link class, what compute each spent, how time was projected) and the facts above them (machine,
model, text, link, budget), from the figures lowband.comparison.report_figures computes.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from lowband import config as C
from lowband.comparison import projection, table
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.plan import REFERENCE
from lowband.comparison.report_figures import bytes_at_goal, projected, read_config, spent
from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import TableRow
from lowband.net.links import LinkSpec, parse_link
from lowband.run.metrics import human_bytes


def compute_note(rows: list[TableRow], cap: float | None) -> list[str]:
    """Under a target budget, one line on how much compute each method spent to reach the target."""
    ratios = spent(rows) if cap is not None else {}
    if not ratios:
        return []
    ref = next(r.label for r in rows if r.is_reference)
    never = [r.label for r in rows if r.samples_to_target is None]
    return ["", f"Compute to the target (training samples over all workers, against {ref}'s whole run, whose final "
                f"figure is the target; each method stopped there or at {cap:g}x): "
                + ", ".join(f"{label} {x:.2f}x" for label, x in ratios.items())
                + (f"; never within {cap:g}x: {', '.join(never)}" if never else "") + "."]


def link_sentences(rows: list[TableRow], groups: dict[str, list[SummaryRow]], goals: dict[str, int | None],
                   latency_s: float, has_target: bool, on_dedicated: bool = False,
                   spent: dict[str, float] | None = None) -> list[str]:
    """One sentence per link class: the fastest label to target there, and the one with fewest bytes;
    with `spent` (a target budget: each label's samples to target over the reference's), what the fastest
    spent in compute when it is not the reference."""
    goal = "to target" if has_target else "to finish training"
    reach = [r for r in rows if goals[r.label] is not None]
    by_bytes = min(reach, key=lambda r: bytes_at_goal(r, groups, goals), default=None)
    ref = next((r.label for r in reach if r.is_reference), None)
    out = []
    for name, rate in projection.LINK_CLASSES.items():
        link = LinkSpec(rate, latency_s)
        secs = {r.label: projected(groups[r.label], goals[r.label], link, on_dedicated) for r in reach}
        if not secs:
            out.append(f"At {name} no method reaches the target.")
            continue
        best = min(secs, key=lambda label: secs[label] or 0.0)
        versus = f"; {ref} {secs[ref]:.1f} s" if ref is not None and ref != best else ""
        if spent and best in spent and best != ref:
            versus += f"; {spent[best]:.2f}x {ref or 'the reference'}'s training samples"
        out.append(f"At {name} the fastest {goal} is {best} ({secs[best]:.1f} s{versus}), the fewest bytes "
                   f"{by_bytes.label if by_bytes else '-'} "
                   f"({human_bytes(bytes_at_goal(by_bytes, groups, goals))} per worker){_team(reach, best, secs)}.")
    return out


def _team(reach: list[TableRow], best: str, secs: dict[str, float | None]) -> str:
    """When the fastest is one worker: the fastest of the methods that use all the workers, for a user
    whose data or job cannot sit on one machine ('' when the fastest already uses them, or none reaches)."""
    widest = max((r.workers for r in reach), default=1)
    if next(r.workers for r in reach if r.label == best) == widest:
        return ""
    team = min((r.label for r in reach if r.workers == widest), key=lambda label: secs[label] or 0.0)
    return f"; on all {widest} workers (when one machine cannot hold the data or the job) {team} ({secs[team]:.1f} s)"


def machine() -> str:
    import torch

    lines = Path("/proc/cpuinfo").read_text().splitlines() if os.path.exists("/proc/cpuinfo") else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
               platform.processor() or "unknown")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"{os.cpu_count()} cores ({cpu}), torch {torch.__version__}, GPU {gpu}, Python {platform.python_version()}"


def link_of(runs: list[SummaryRow]) -> str:
    seen = set()
    for run in runs:
        config = read_config(run.run_dir)
        if config is not None:
            link = config.link
            seen.add(f"{parse_link(link.rate).describe()} ({link.mode})" + _sites_of(run, link))
    return "; ".join(sorted(seen)) or "unknown"


def _sites_of(run: SummaryRow, link: C.LinkConfig) -> str:
    """', between 2 sites, unlimited inside' for a run with sites (lowband.net.sites), else ''."""
    if run.sites <= 1:
        return ""
    return f" between {run.sites} sites, {parse_link(link.intra).describe()} inside"


def facts(runs: list[SummaryRow], folders: list[str], target: float | None, why: str) -> list[str]:
    budget = budgets(folders)
    return [table.describe_target(target, why, table.metric_of(runs)), f"Machine: {machine()}", *model_facts(runs),
            *corpus_facts(runs), f"Link: {link_of(runs)}",
            *([f"Budget: {budget}"] if budget else []), f"Comparisons: {', '.join(map(str, folders))}"]


def model_facts(runs: list[SummaryRow]) -> list[str]:
    """'Model: NAME (its size or options)' of the runs (a built-in's or a user's `package.module:factory`), from
    their configs; a warning when they trained different models."""
    seen = {shown_model(cfg.model, run.records[-1].params if run.records else None)
            for run in runs if run.run_dir and (cfg := read_config(run.run_dir))}
    if not seen:
        return []
    return [("Model: " if len(seen) == 1 else "Model (WARNING: the runs trained different models): ")
            + "; ".join(sorted(seen))]


def shown_model(model: C.ModelConfig, params: int | None = None) -> str:
    """'gpt (size tiny), 220,544 parameters': the model, its options, and its size when the records say it."""
    detail = [f"size {model.size}"] if model.name == "gpt" else []
    detail += [f"{k}={v}" for k, v in sorted((model.kwargs or {}).items())]
    return (model.name + (f" ({', '.join(detail)})" if detail else "")
            + (f", {params:,} parameters" if params else ""))


def corpus_facts(runs: list[SummaryRow]) -> list[str]:
    """'Text: sha256 ... (N bytes)' for language-model runs; a warning when they trained on different text."""
    seen = {(r.records[-1].corpus_sha256, r.records[-1].corpus_bytes) for r in runs
            if r.records and r.records[-1].corpus_sha256}
    if not seen:
        return []
    shown = "; ".join(f"sha256 {h} ({n:,} bytes)" for h, n in sorted(seen, key=str))
    return [("Text: " if len(seen) == 1 else "Text (WARNING: the runs trained on different text): ") + shown]


BUDGET_WORDS = {"target": "to the target: REFERENCE (the reference) ran train.epochs, every other method until its "
                          "validation figure reached REFERENCE's final one, or at most FACTOR x its samples",
                "epochs": "equal epochs over each worker's own data",
                "steps": "equal optimizer steps per worker (Allreduce's in train.epochs)",
                "samples": "equal training samples over all workers (Allreduce's in train.epochs)"}


def budgets(folders: list[str]) -> str:
    """What every method was given equally, from each comparison's plan.json (older ones: equal epochs; empty
    when a plan.json is damaged)."""
    seen = []
    for folder in folders:
        where = ComparisonDir.of(folder)
        budget = where.budget()
        if budget is None:
            return ""
        words = BUDGET_WORDS.get(budget, budget)
        seen.append(words.replace("REFERENCE", where.reference() or REFERENCE))
    return "; ".join(dict.fromkeys(seen))


def nothing_finished(rows: list[TableRow]) -> list[str]:
    """A sentence when no run finished: every one diverged or failed (each run's status says which)."""
    if any(r.status == "ok" for r in rows):
        return []
    return ["No run finished: every run diverged or failed (the table's status column; each run directory's "
            "diverged.rank*.txt or train.log says why), so there is nothing to compare.", ""]


def how_projected(on_dedicated: bool, latency_s: float) -> str:
    latency = f"{latency_s * 1e3:g} ms latency per message" if latency_s else "no latency"
    if on_dedicated:
        return ("These sentences and the plot are for dedicated machines: every worker is charged the step time "
                "measured for one worker alone (same model, batch and threads; calibration.json) for each step it "
                f"took, plus the link's transfer time for the bytes and messages it counted (bytes × 8 / rate, "
                f"{latency}); `single` is one such machine. A method's extra compute per step (a peer's "
                "forward pass, soft labels) is not charged.")
    return (f"Projected from each run's compute seconds and messages as the modelled link charges them "
            f"(bytes × 8 / rate, {latency}); the measured link's transfer time is taken out first. "
            "Methods that overlap messages with computing are projected as if they did not (an upper bound). "
            "The workers shared this machine's cores, so their compute seconds are not a dedicated machine's.")


def measured_note(rows: list[TableRow], groups: dict[str, list[SummaryRow]], goals: dict[str, int | None],
                  latency_s: float, on_dedicated: bool) -> list[str]:
    """With dedicated figures, one line on what the seconds measured here (shared cores) would have said."""
    if not on_dedicated:
        return []
    link = LinkSpec(projection.LINK_CLASSES["10 mbit"], latency_s)
    secs = {r.label: projected(groups[r.label], goals[r.label], link) for r in rows
            if goals[r.label] is not None}
    known = {k: v for k, v in secs.items() if v is not None}
    if not known:
        return []
    best = min(known, key=lambda k: known[k])
    return ["", f"From the seconds measured here instead (workers sharing {os.cpu_count()} cores), the fastest at "
                f"10 mbit would be {best} ({known[best]:.1f} s): those seconds charge each worker its neighbours' work."]
