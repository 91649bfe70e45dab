"""Does the suite still catch real bugs? Plant each bug of a fixed list in a copy of the code, run the
tests that should notice it, and print which failed.

Each plant replaces one exact piece of source text with a wrong one (a bug a tired hand could write): the
sparse top-k, the error buffer's decay, the tau schedule, the tuning's trial choice, the target budget's
stop, the done.jsonl repair, the ring's byte count, the placement rule, a forked worker's exit code, the
decay schedule, the trainer's rate at a step's place, an elastic worker's figures per round, an elastic
joiner's fragments, SparseLoCo's flush over fragments, the epoch at target, a pruned trial run again; and issue 65's item 6:
samples a second, a prediction reply's count, a streaming receiver's fragments and residual, an aborted
elastic round, wrap's hook and byte count, the tuning seed's bound. A plant
whose text is not in the tree is reported as absent and fails the script (exit 1), as an uncaught one does:
a plant that names code no longer there tests nothing (--allow-absent, for a --tree at an older commit).
A plant is caught when at least one of its tests fails; the tests named are those a developer would run
for that code (the whole suite catches at least as much).

Run: python benchmarks/planted_bugs.py [--tree DIR] [--only NAME,...]
     (--tree: a clone at another commit, to compare before and after a change to the tests)
About a minute a plant on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

# (name, file, exact old text, new text, test paths)
PLANTS = [
    ("sparse top-k by value, not magnitude", "src/lowband/comm/value_codecs.py",
     "pos = chunks.abs().topk(", "pos = chunks.topk(",
     ["tests/unit/test_value_codecs.py", "tests/distributed/test_sparseloco.py"]),
    ("error buffer never decays", "src/lowband/comm/value_codecs.py",
     "x + self.decay * self.residual.to(x.device)", "x + self.residual.to(x.device)",
     ["tests/unit/test_value_codecs.py", "tests/distributed/test_sparseloco.py"]),
    ("tau schedule takes its first phase", "src/lowband/methods/outer.py",
     "for t, f in reversed(self.phases) if done >= f", "for t, f in self.phases if done >= f",
     ["tests/unit/test_schedule.py", "tests/unit/test_outer.py", "tests/distributed/test_sparseloco.py"]),
    ("tuning chooses the worst trial", "src/lowband/comparison/tuning.py",
     "key=lambda r: (-(r.val or 0.0) if metric.higher_is_better else r.val or 0.0)",
     "key=lambda r: ((r.val or 0.0) if metric.higher_is_better else -(r.val or 0.0))",
     ["tests/unit/test_compare.py", "tests/distributed/test_tuning.py"]),
    ("a target is reached one margin early", "src/lowband/data/metric.py",
     "return value <= target * (1.0 + self.margin)", "return value <= target * (1.0 + 2 * self.margin)",
     ["tests/unit/test_metric.py", "tests/distributed/test_language_model.py"]),
    ("done.jsonl repair keeps the cut line", "src/lowband/comparison/folder.py",
     "keep = data[:data.rfind(b\"\\n\") + 1]", "keep = data",
     ["tests/unit/test_damaged_runs.py", "tests/unit/test_compare.py"]),
    ("the ring allreduce counts half its bytes", "src/lowband/comm/ledger.py",
     "size = 2 * (world - 1) / world * nbytes", "size = (world - 1) / world * nbytes",
     ["tests/unit/test_ledger.py", "tests/distributed/test_allreduce.py"]),
    ("auto picks NCCL for workers sharing a GPU", "src/lowband/comm/placement.py",
     "    if gpus >= local_world:\n", "    if gpus >= 1:\n", ["tests/unit/test_placement.py"]),
    ("a forked worker always exits 0", "src/lowband/run/workers.py",
     "        code = worker_main([entry, *args])\n", "        worker_main([entry, *args])\n        code = 0\n",
     ["tests/unit/test_launch.py", "tests/faults/test_processes.py"]),
    ("the decay schedule runs backwards", "src/lowband/methods/sparseloco.py",
     "(c.ef_decay_end - c.ef_decay) * min(done, 1.0)", "(c.ef_decay_end - c.ef_decay) * (1.0 - min(done, 1.0))",
     ["tests/distributed/test_sparseloco.py"]),
    ("the trainer sets the rate of a later place", "src/lowband/training/trainer.py",
     "            self.schedule.apply(self.optimizer, place)\n", "            self.schedule.apply(self.optimizer, place + 0.5)\n",
     ["tests/unit/test_trainer_team.py"]),
    ("an elastic worker's round figures never restart", "src/lowband/training/elastic/plan.py",
     "        h = self.now = Handout.of(q)\n        self.round_at = self.progress()\n",
     "        h = self.now = Handout.of(q)\n",
     ["tests/faults/test_elastic_equal.py"]),
    # issue 56: the kinds of plants that passed the whole suite before its tests
    ("an elastic joiner takes one fragment of θ_global", "src/lowband/methods/diloco.py",
     "for frag, state in zip(self.fragments, shared[\"fragments\"], strict=True):\n            frag.load_shared(state)",
     "for frag, state in zip(self.fragments[:1], shared[\"fragments\"][:1], strict=True):\n            frag.load_shared(state)",
     ["tests/faults/test_elastic.py::test_a_joiner_of_a_streaming_job_receives_every_fragment"]),
    ("SparseLoCo's flush reaches the first fragment alone", "src/lowband/methods/sparseloco.py",
     "        for frag in self.fragments:\n            if self.group.rank == 0:\n"
     "                flush(frag, rnd, codec, self._divisor(rnd))",
     "        for frag in self.fragments[:1]:\n            if self.group.rank == 0:\n"
     "                flush(frag, rnd, codec, self._divisor(rnd))",
     ["tests/distributed/test_sparseloco.py"]),
    ("the epoch at target moves when the run goes on past it", "src/lowband/training/trainer.py",
     "if self.reached_target is None and found is not None:", "if found is not None:",
     ["tests/unit/test_trainer_team.py"]),
    ("a pruned trial's values run again", "src/lowband/comparison/tuning.py",
     "    earlier = next((t for t in study.trials if t.state.is_finished() and t.params == values",
     "    earlier = next((t for t in study.trials if t.value is not None and t.params == values",
     ["tests/unit/test_tuning.py"]),
    # issue 65, item 6: what users would notice and the suite on 4ce807b did not
    ("samples a second count one rank's samples", "src/lowband/training/ranks.py",
     "        return Made(record, sum(r.samples for r in ranks))\n", "        return Made(record, mine.samples)\n",
     ["tests/distributed/test_train_cli.py::test_allreduce_run_writes_records_bytes_and_equal_checkpoints"]),
    ("a prediction reply is counted after it was sent", "src/lowband/distill/teacher.py",
     "                self.answered(got[0], got[1], len(reply))  # counted before the asker can hold it\n"
     "                wire.send(conn, reply)\n",
     "                wire.send(conn, reply)\n                self.answered(got[0], got[1], len(reply))\n",
     ["tests/unit/test_predictions.py"]),
    ("a Streaming DiLoCo receiver merges only the fragment in flight", "src/lowband/methods/diloco.py",
     "            frag.load_shared(state)\n            frag.merge(1.0)\n",
     "            frag.load_shared(state)\n            if frag.apply_at is not None:\n                frag.merge(1.0)\n",
     ["tests/unit/test_receive.py"]),
    ("an aborted elastic round's exchange is kept", "src/lowband/comm/elastic_quorum.py",
     "            if saved is not None:\n                state.restore(saved)\n", "",
     ["tests/contract/test_round_undo.py"]),
    ("wrap runs the gradient hook after the optimizer step", "src/lowband/wrapping.py",
     "optimizer.register_step_pre_hook(", "optimizer.register_step_post_hook(",
     ["tests/unit/test_wrap_checks.py"]),
    ("wrap counts bookkeeping tags in bytes_sent", "src/lowband/wrapping.py",
     "return sum(s.sent for tag, s in self.comm.ledger.stats.items() if tag not in BOOKKEEPING_TAGS)",
     "return sum(s.sent for tag, s in self.comm.ledger.stats.items())",
     ["tests/unit/test_wrap_checks.py"]),
    ("wrap leaves its hook on the optimizer after close()", "src/lowband/wrapping.py",
     "        self._hook.remove()\n", "",
     ["tests/unit/test_wrap_checks.py"]),
    ("a receiver keeps its error-feedback residual", "src/lowband/methods/outer.py",
     "        if self.feedback is not None:\n            self.feedback.residual = None\n", "",
     ["tests/unit/test_receive.py"]),
    ("--tune-seed accepts 2**32", "src/lowband/comparison/space.py",
     'bounds=f"[0, {2**32})", note=" (the samplers\' seed)"', 'bounds=f"[0, {2**32}]", note=" (the samplers\' seed)"',
     ["tests/unit/test_wrap_checks.py", "tests/unit/test_plan.py"]),
    ("an elastic round's outer step ignores the workers it lost", "src/lowband/methods/diloco.py",
     "            return max(rnd.contributors, self.ctx.cfg.train.workers)\n",
     "            return rnd.contributors\n", ["tests/unit/test_quorum_rates.py"]),
]


def plant(tree: str, name: str, path: str, old: str, new: str, tests: list[str]) -> str:
    """Apply one plant, run its tests, restore the file; 'caught by ...', 'NOT CAUGHT' or 'absent'."""
    full = os.path.join(tree, path)
    if not os.path.isfile(full):
        return "absent (its file is not in this tree)"
    with open(full) as f:
        original = f.read()
    if old not in original:
        return "absent (its code is not in this tree)"
    planted = original.replace(old, new, 1)
    try:
        with open(full, "w") as f:
            f.write(planted)
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
                              *tests], cwd=tree, capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(tree, "src"), tree])})
        failed = re.findall(r"^FAILED (\S+)", out.stdout, re.M) or re.findall(r"^ERROR (\S+)", out.stdout, re.M)
        took = f"{time.time() - t0:.0f} s"
        return f"caught by {failed[0]} ({took})" if out.returncode else f"NOT CAUGHT ({took})"
    finally:
        with open(full, "w") as f:
            f.write(original)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--only", default="", help=f"comma-separated plant numbers, 1 to {len(PLANTS)} (default: all)")
    p.add_argument("--allow-absent", action="store_true", help="a plant whose code is not in the tree does not fail "
                   "the script (a --tree at an older commit)")
    p.add_argument("--check", action="store_true", help="only check that every plant's code is in the tree (fast)")
    args = p.parse_args()
    items = [i.strip() for i in args.only.split(",") if i.strip()]
    if not all(i.isdigit() and 1 <= int(i) <= len(PLANTS) for i in items):
        p.error(f"--only {args.only!r}: must be comma-separated plant numbers from 1 to {len(PLANTS)}")
    only = {int(i) for i in items}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.tree, capture_output=True, text=True,
                            check=False).stdout.strip()
    print(f"tree {args.tree} at {commit or 'unknown'}\n")
    if args.check:
        gone = [(i, name) for i, (name, path, old, _, _) in enumerate(PLANTS, 1) if not present(args.tree, path, old)]
        for i, name in gone:
            print(f"plant {i} ({name}): its code is not in this tree")
        sys.exit(1 if gone and not args.allow_absent else 0)
    print("| # | planted bug | where | result |\n|---|---|---|---|")
    failed = 0
    for i, (name, path, old, new, tests) in enumerate(PLANTS, 1):
        if only and i not in only:
            continue
        result = plant(args.tree, name, path, old, new, tests)
        failed += result.startswith("NOT CAUGHT") or (result.startswith("absent") and not args.allow_absent)
        print(f"| {i} | {name} | `{path}` | {result} |", flush=True)
    sys.exit(1 if failed else 0)


def present(tree: str, path: str, old: str) -> bool:
    """Whether the plant's exact text is in the tree's file."""
    full = os.path.join(tree, path)
    if not os.path.isfile(full):
        return False
    with open(full) as f:
        return old in f.read()


if __name__ == "__main__":
    main()
