"""Why the modelled link over-charges the hierarchical Allreduce: one DDP training step, flat ring
against hierarchy, with no link and with a modelled one.

4 workers in 2 sites (0,0,1,1), cnn1d on random batches of 16, 20 steps per measurement, each
measured twice (the second is reported); the modelled link is 10 mbit/s between sites, unlimited
inside. Prints milliseconds per step and the inter-site bytes each leader sends per step, and the
wire time those bytes take at the link's rate.

Run: python benchmarks/hierarchy_step.py [--rate-mbit 10] [--steps 20]
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

STEPS_DEFAULT = 20


def worker(out: str, mode: str, rate_mbit: str, steps: str) -> None:
    from lowband.comm import Communicator
    from lowband.comm.hierarchy import Hierarchy
    from lowband.config import ModelConfig
    from lowband.models import build_model
    from lowband.net.links import LinkSpec

    torch.set_num_threads(1)
    link = LinkSpec(float(rate_mbit) * 1e6) if mode == "model" else None
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=120, link=link, sites=lambda w: [0, 0, 1, 1])
    x, y = torch.randn(16, 1, 40), torch.randint(0, 10, (16,))
    result = {}
    for name in ("flat", "hier", "flat", "hier"):
        torch.manual_seed(0)
        model = build_model(ModelConfig(name="cnn1d"), (1, 40), 10)
        ddp = comm.data_parallel(model, tag=name, reducer=Hierarchy(comm) if name == "hier" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        before = comm.ledger.stats[name].inter
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(int(steps)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        comm.barrier()
        result[name] = {"ms": 1000 * (time.perf_counter() - t0) / int(steps),
                        "inter": (comm.ledger.stats[name].inter - before) / int(steps)}
    with open(os.path.join(out, f"{mode}{comm.rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate-mbit", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=STEPS_DEFAULT)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))  # the workers
    from common import commit
    from lowband.run import launch

    rows = {}
    with tempfile.TemporaryDirectory() as out:
        for mode in ("none", "model"):
            code = launch.run("hierarchy_step:worker", [out, mode, str(args.rate_mbit), str(args.steps)], 4, out)
            if code:
                raise SystemExit(f"workers failed with exit code {code}")
            rows[mode] = [json.loads(Path(out, f"{mode}{r}.json").read_text()) for r in range(4)]
    print(f"one DDP step of cnn1d, 4 workers in 2 sites, {args.steps} steps, commit {commit()}")
    print(f"{'reducer':<8}{'no link ms':>12}{'modelled ms':>13}{'inter B/step (max rank)':>25}{'wire ms':>9}")
    for name in ("flat", "hier"):
        none = max(r[name]["ms"] for r in rows["none"])
        model = max(r[name]["ms"] for r in rows["model"])
        inter = max(r[name]["inter"] for r in rows["model"])
        print(f"{name:<8}{none:>12.1f}{model:>13.1f}{inter:>25.0f}{inter * 8 / (args.rate_mbit * 1e6) * 1000:>9.1f}")


if __name__ == "__main__":
    main()
