"""Sparsification microbenchmark on a ResNet-50-sized vector (25,557,032 float32 values).

Prints, for p in {0.01, 0.1, 0.5}: index generation time, geometric skips versus one Bernoulli
draw per coordinate (the RD-PSGD paper: 0.432 s -> 0.056 s); random-k extraction + expansion
versus TopK selection; and the bytes one node sends per neighbour and step for each index mode,
against D-PSGD's dense vector (the paper's Fig. 6). Goals: geometric >= 7x faster than Bernoulli
at p = 0.01, random-k >= 10x faster than TopK at p = 0.1.

Run: python benchmarks/sparsify.py [--numel 25557032] [--repeats 5]
"""

import argparse
import math
import os
import statistics
import time

import torch

from lowband.comm.index_codecs import GapsIndex
from lowband.comm.masks import random_indices


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--numel", type=int, default=25_557_032)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    d = a.numel
    x = torch.randn(d, generator=torch.Generator().manual_seed(0))
    print(f"vector of {d:,} float32, {a.threads} thread(s), {os.cpu_count()} cores, torch {torch.__version__}; "
          f"median of {a.repeats}\n")
    print("| p | geometric s | bernoulli s | speed-up | random-k extract+expand s | topk select s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for frac in (0.01, 0.1, 0.5):
        gen = torch.Generator()
        geo = timed(lambda frac=frac, gen=gen: random_indices(d, frac, gen.manual_seed(1), "geometric"), a.repeats)
        ber = timed(lambda frac=frac, gen=gen: random_indices(d, frac, gen.manual_seed(1), "bernoulli"), a.repeats)
        idx = random_indices(d, frac, gen.manual_seed(1), "geometric")
        y = x.clone()

        def extract_expand(idx=idx, y=y):
            values = x[idx]
            y[idx] = values

        k = len(idx)
        rk = timed(extract_expand, a.repeats)
        tk = timed(lambda k=k: torch.topk(x.abs(), k, sorted=False), max(1, a.repeats // 2))
        print(f"| {frac} | {geo:.4f} | {ber:.4f} | {ber / geo:.1f}x | {rk:.4f} | {tk:.4f} | {tk / rk:.1f}x |")

    print("\nbytes sent per neighbour per step, relative to D-PSGD's dense vector (4 d bytes)\n")
    print("| p | seed | gaps | bitmask | gaps bytes/index |")
    print("|---|---|---|---|---|")
    dense = 4 * d
    for frac in (0.01, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0):
        idx = random_indices(d, frac, torch.Generator().manual_seed(2), "geometric")
        values = 4 * len(idx)
        gaps = GapsIndex().payload_bytes(idx, d) + 8  # + the length header
        bitmask = math.ceil(d / 8) + 8
        print(f"| {frac} | {values / dense:.3f} | {(values + gaps) / dense:.3f} | {(values + bitmask) / dense:.3f} | "
              f"{gaps / max(len(idx), 1):.2f} |")


if __name__ == "__main__":
    main()
