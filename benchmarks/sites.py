"""Sites: what crosses the slow link between sites, and what it costs in time, per method.

Runs methods on 4 workers in 2 sites (ranks 0-1 and 2-3) with a modelled inter-site link
(`--link`, default 10 mbit/s, 20 ms) and an unlimited link inside each site, on MNIST-1D / cnn1d,
all in one `lowband compare` so the runs share the machine's state. Prints per method: bytes sent
per worker, of those the bytes that crossed sites, training seconds, validation accuracy, and the
flat and hierarchical Allreduce side by side (their inter-site bytes and seconds as ratios).

Run: python benchmarks/sites.py [--epochs 2] [--link 10mbit,20ms] [--seed 0]
(about 6 minutes on 2 cores at the defaults)
"""

import argparse
import tempfile

from common import commit, run_compare

METHODS = ["allreduce", "allreduce:hierarchical=true", "local_sgd:tau=16", "diloco:tau=16",
           "diloco:tau=16:group_size=2", "codistill:group_size=2:interval=50"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--link", default="10mbit,20ms", help="the inter-site link: RATE[,LATENCY]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        rows = run_compare(["--methods", ",".join(METHODS), "--workers", "4", "--epochs", str(args.epochs),
                            "--seed", str(args.seed), "--dataset", "mnist1d", "--model", "cnn1d",
                            "--link", args.link, "--link-mode", "model", "--sites", "2"], out)
    print(f"4 workers in 2 sites, inter-site link {args.link} (modelled), {args.epochs} epochs, seed {args.seed}, "
          f"commit {commit()}")
    print(f"{'method':<38}{'sent/worker':>14}{'inter-site/worker':>19}{'train s':>10}{'val acc':>9}  status")
    by = {}
    for r in rows:
        by[r["label"]] = r
        print(f"{r['label']:<38}{float(r['bytes_sent_per_worker']) / 1e6:>11.4f} MB"
              f"{float(r['bytes_inter_per_worker']) / 1e6:>16.4f} MB{float(r['train_s']):>10.1f}"
              f"{float(r['val_acc'] or 'nan'):>9.4f}  {r['status']}")
    flat, tree = by.get("allreduce"), by.get("allreduce:hierarchical=true")
    if flat and tree and float(flat["bytes_inter_per_worker"]) and float(flat["train_s"]):
        print(f"hierarchical / flat allreduce: inter-site bytes "
              f"{float(tree['bytes_inter_per_worker']) / float(flat['bytes_inter_per_worker']):.3f}, "
              f"train seconds {float(tree['train_s']) / float(flat['train_s']):.3f}")


if __name__ == "__main__":
    main()
