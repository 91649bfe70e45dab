"""A comparison directory and every file in it, with one owner: `ComparisonDir`.

    plan.json            the plan's inputs; `compare --resume DIR` re-plans the same runs from it
    done.jsonl           one line per finished run ({key, run_dir, code}): a resume skips them
    prepare/N/           a suite's preparation commands (e.g. training a teacher)
    tune/LABEL/trial-NNN/  tuning trials (tune/LABEL_FIELD-V/ in older comparisons); LABEL/ (or
                         LABEL_seed-S/): the full runs, each a run directory
    tuning.db            the Optuna studies, one per label (SQLite; lowband.comparison.tuning)
    tuning.csv           one row per tuning trial (lowband.comparison.summary.TuningRow), the chosen one marked
    summary.csv          one row per full run (lowband.comparison.summary.SummaryRow)
    calibration.json     one worker's step measured alone (lowband.comparison.calibrate)
    report.md, report.html, *.png   the report (lowband.comparison.report)

Whole files (plan.json, the CSVs) are written atomically; done.jsonl is appended a line at a time, so a
comparison killed during that write leaves its last line cut: `repair_done` drops it (the run it
recorded is looked at again), and every other reader skips a damaged line with a warning.
"""

from __future__ import annotations

import csv
import functools
import json
import os

from lowband.atomic import write_atomic, write_text_atomic
from lowband.comparison.plan import Plan
from lowband.comparison.summary import SummaryRow, TuningRow
from lowband.errors import UsageError
from lowband.run.rundir import read_jsonl, warn

SUMMARY_NEEDS = ("run_dir", "label", "method", "workers")  # a summary.csv row without these cannot be reported


class ComparisonDir:
    """The files of one comparison directory."""

    PLAN, DONE, SUMMARY, TUNING, CALIBRATION = "plan.json", "done.jsonl", "summary.csv", "tuning.csv", "calibration.json"
    STUDY = "tuning.db"

    def __init__(self, path: str):
        self.path = os.fspath(path)

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    @classmethod
    def of(cls, folder: str | ComparisonDir) -> ComparisonDir:
        """`folder` as a ComparisonDir (itself when it is one already: its plan is read once)."""
        return folder if isinstance(folder, ComparisonDir) else cls(folder)

    def file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    @property
    def summary_path(self) -> str:
        return self.file(self.SUMMARY)

    @property
    def tuning_path(self) -> str:
        return self.file(self.TUNING)

    @property
    def study_path(self) -> str:
        """tuning.db: the Optuna studies (SQLite)."""
        return self.file(self.STUDY)

    def write_summary(self, rows: list[SummaryRow]) -> None:
        """summary.csv: one row per full run."""
        write_csv_atomic(self.summary_path, SummaryRow.columns(), [r.csv_row() for r in rows])

    def read_summary(self) -> list[SummaryRow]:
        """summary.csv's usable rows; a row without its run directory, label, method or workers is skipped
        with a warning naming its line; UsageError when the file is missing or unreadable."""
        path = self.summary_path
        try:
            with open(path, encoding="utf-8", newline="") as f:
                rows = list(csv.DictReader(f))
        except FileNotFoundError:
            raise UsageError(f"{path}: no such file (is this a `lowband compare` directory?)") from None
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise UsageError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
        usable = []
        for line, row in enumerate(rows, 2):
            missing = [k for k in SUMMARY_NEEDS if not row.get(k)]
            if missing:
                warn(f"skipping {path} line {line}: no {', '.join(missing)}")
            else:
                usable.append(SummaryRow.from_csv(row))
        return usable

    def write_tuning(self, rows: list[TuningRow]) -> None:
        """tuning.csv: one row per trial, and besides `field` / `value` (the fields and values space-separated,
        as older files have them) one column per tuned field, to plot or filter by."""
        tuned = list(dict.fromkeys(f for r in rows for f in r.field.split()))
        write_csv_atomic(self.tuning_path, TuningRow.columns() + tuned, [{**r.csv_row(), **r.values} for r in rows])

    def read_tuning(self) -> list[TuningRow]:
        """tuning.csv's rows ([] without one; the oldest files name the figure val_acc)."""
        if not os.path.exists(self.tuning_path):
            return []
        with open(self.tuning_path, encoding="utf-8", newline="") as f:
            return [TuningRow.from_csv({**row, "val": row.get("val") or row.get("val_acc") or ""})
                    for row in csv.DictReader(f)]

    @property
    def calibration_path(self) -> str:
        return self.file(self.CALIBRATION)

    def report_path(self, kind: str) -> str:
        """report.md or report.html (`kind`: md, html)."""
        return self.file(f"report.{kind}")

    def plot_path(self, name: str) -> str:
        """NAME.png, a plot the report shows."""
        return self.file(f"{name}.png")

    def is_comparison(self) -> bool:
        """Whether the directory holds a comparison's results (its summary.csv)."""
        return os.path.isfile(self.summary_path)

    # ---- the plan and the runs done -------------------------------------------------------------
    def save_plan(self, plan: Plan) -> None:
        os.makedirs(self.path, exist_ok=True)
        write_text_atomic(self.file(self.PLAN), json.dumps(plan.to_json(), indent=1))
        self.__dict__.pop("_saved", None)  # read again when next asked

    def load_plan(self) -> Plan:
        """The saved plan; a directory without one, or with a damaged one, is a UsageError naming --resume."""
        path = self.file(self.PLAN)
        if not os.path.isfile(path):
            raise UsageError(f"--resume {self.path}: not a comparison directory with a plan (no {self.PLAN})")
        try:
            with open(path, encoding="utf-8") as f:
                return Plan.from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # UnicodeDecodeError is a ValueError
            raise UsageError(f"--resume {self.path}: {self.PLAN} is damaged ({type(e).__name__}: {e}); "
                             "the runs cannot be planned again: start the comparison afresh") from None

    @functools.cached_property
    def _saved(self) -> tuple[Plan | None, bool]:
        """plan.json, read once for this directory: (the plan or None, whether a file there is damaged)."""
        if not os.path.isfile(self.file(self.PLAN)):
            return None, False
        try:
            return self.load_plan(), False
        except UsageError:
            return None, True

    def reference(self) -> str | None:
        """The label of the comparison's reference (the suite's target method, Allreduce by default) from its
        plan.json; None without one (an older plan without a target budget: the table takes Allreduce)."""
        return self._saved[0].reference if self._saved[0] is not None else None

    def budget(self) -> str | None:
        """What the plan gave every method equally (older comparisons, without a plan: epochs; None, with a
        warning, when plan.json is damaged)."""
        plan, damaged = self._saved
        if damaged:
            warn(f"{self.file(self.PLAN)} is damaged: the report leaves out what the plan gave every method")
            return None
        return plan.budget if plan is not None else "epochs"

    def tuning_seeds(self) -> tuple[int, list[int]] | None:
        """(the training seed of its tuning trials, the seeds of its full runs) of a comparison that tuned;
        None for one that did not, or without a readable plan.json."""
        from lowband.comparison.plan import tuning_seed

        plan = self._saved[0]
        if plan is None or plan.tune is None:
            return None
        return tuning_seed(plan, next(iter(plan.configs.values()), None)), list(plan.seeds or [])

    def cap(self) -> float | None:
        """A target budget's FACTOR (a method stopped at FACTOR x the reference's samples); None: another budget,
        or a plan.json that is missing or damaged (`budget()` warns of that)."""
        plan = self._saved[0]
        return plan.factor if plan is not None and plan.budget == "target" else None

    def finished(self) -> dict[str, dict]:
        """done.jsonl: the last completion record of each key ({key, run_dir, code}); a damaged line is
        skipped with a warning."""
        records = read_jsonl(self.file(self.DONE), _done_problem)
        return {r["key"]: r for r in records}

    def repair_done(self) -> None:
        """Drop a cut last line of done.jsonl (a comparison killed while appending it), with a note."""
        path = self.file(self.DONE)
        if not os.path.isfile(path):
            return
        with open(path, "rb") as f:
            data = f.read()
        if not data or data.endswith(b"\n"):
            return
        keep = data[:data.rfind(b"\n") + 1]
        warn(f"{path}: dropped a cut last line ({len(data) - len(keep)} bytes; the comparison stopped while "
             "writing it): that run is looked at again")
        with open(path, "r+b") as f:
            f.truncate(len(keep))

    def mark(self, key: str, run_dir: str, code: int) -> None:
        """Record that the run `key` finished with exit code `code`."""
        self.repair_done()
        with open(self.file(self.DONE), "a") as f:
            f.write(json.dumps({"key": key, "run_dir": run_dir, "code": code}) + "\n")


def write_csv_atomic(path: str, columns: list[str], rows: list[dict]) -> None:
    """A CSV file with a header, written whole or not at all."""
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    write_atomic(path, write)


def _done_problem(record: dict) -> str | None:
    """Why a done.jsonl record cannot be used (None: it can)."""
    if not isinstance(record.get("key"), str) or not isinstance(record.get("code"), int):
        return "no key and exit code"
    return None
