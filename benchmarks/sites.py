"""Sites: what crosses the slow link between sites, and what it costs in time, per method.

Runs methods on 4 workers in 2 sites (ranks 0-1 and 2-3) with a modelled inter-site link
(`--link`, default 10 mbit/s, 20 ms) and an unlimited link inside each site, on MNIST-1D / cnn1d,
all in one `lowband compare` so the runs share the machine's state. Prints per method: bytes sent
per worker, of those the bytes that crossed sites, training seconds, validation accuracy, and the
flat and hierarchical Allreduce side by side (their inter-site bytes and seconds as ratios).

With `--modes model,netns` (root) the same methods run again on real shaped links (a bridge per
site, one tc-shaped uplink per site; tbf cannot add latency, so give a rate only) and a column
gives modelled / real training seconds per method (goal: within 15%).

Run: python benchmarks/sites.py [--epochs 2] [--link 10mbit,20ms] [--modes model,netns] [--seed 0]
(about 6 minutes on 2 cores at the defaults; twice that with both modes)
"""

import argparse
import tempfile

from common import commit, run_compare

METHODS = ["allreduce", "allreduce:hierarchical=true", "local_sgd:tau=16", "diloco:tau=16",
           "diloco:tau=16:group_size=2", "codistill:group_size=2:interval=50"]


def run_mode(mode: str, args) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as out:
        rows = run_compare(["--methods", ",".join(METHODS), "--workers", "4", "--epochs", str(args.epochs),
                            "--seed", str(args.seed), "--dataset", "mnist1d", "--model", "cnn1d",
                            "--link", args.link, "--link-mode", mode, "--sites", "2"], out)
    return {r["label"]: r for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--link", default="10mbit,20ms", help="the inter-site link: RATE[,LATENCY] (netns: no latency)")
    ap.add_argument("--modes", default="model", help="model, or model,netns (root): also on real shaped links "
                                                      "(a bridge per site, one shaped uplink each), with the ratio")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    modes = args.modes.split(",")
    by = {mode: run_mode(mode, args) for mode in modes}
    print(f"4 workers in 2 sites, inter-site link {args.link} ({' and '.join(modes)}), {args.epochs} epochs, "
          f"seed {args.seed}, commit {commit()}")
    real = "netns" in by and "model" in by
    print(f"{'method':<38}{'sent/worker':>14}{'inter-site/worker':>19}{'train s':>10}{'val acc':>9}"
          + (f"{'netns s':>10}{'model/real':>12}" if real else "") + "  status")
    for label, r in by[modes[0]].items():
        line = (f"{label:<38}{float(r['bytes_sent_per_worker']) / 1e6:>11.4f} MB"
                f"{float(r['bytes_inter_per_worker']) / 1e6:>16.4f} MB{float(r['train_s']):>10.1f}"
                f"{float(r['val_acc'] or 'nan'):>9.4f}")
        if real and label in by["netns"]:
            t = float(by["netns"][label]["train_s"])
            line += f"{t:>10.1f}{float(r['train_s']) / t:>12.3f}"
        print(line + f"  {r['status']}")
    rows = by[modes[0]]
    flat, tree = rows.get("allreduce"), rows.get("allreduce:hierarchical=true")
    if flat and tree and float(flat["bytes_inter_per_worker"]) and float(flat["train_s"]):
        print(f"hierarchical / flat allreduce: inter-site bytes "
              f"{float(tree['bytes_inter_per_worker']) / float(flat['bytes_inter_per_worker']):.3f}, "
              f"train seconds {float(tree['train_s']) / float(flat['train_s']):.3f}")


if __name__ == "__main__":
    main()
