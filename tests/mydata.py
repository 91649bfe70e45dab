"""Data factories for tests of `--dataset package.module:factory`."""

import numpy as np
import torch


def blobs(n=300, seed=0):
    """Two well-separated classes of 8 features; 3/4 train, 1/4 test."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 1, 8, generator=g) + 3.0 * y.view(-1, 1, 1).float()
    k = n * 3 // 4
    return x[:k], y[:k], x[k:], y[k:]


def as_dict():
    x_tr, y_tr, x_te, y_te = blobs()
    return {"x_train": x_tr.numpy(), "y_train": y_tr.numpy(), "x_test": x_te.numpy(), "y_test": y_te.numpy()}


def raises():
    raise RuntimeError("disk on fire")


def three_things():
    return 1, 2, 3


def float_labels():
    x_tr, y_tr, x_te, y_te = blobs()
    return x_tr, y_tr.float(), x_te, y_te


NOT_CALLABLE = np.zeros(3)


class Pairs:
    """A map-style data set of (numpy x, int y) items, as a user's torch Dataset would give."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i].numpy(), int(self.y[i])


def datasets():
    x_tr, y_tr, x_te, y_te = blobs()
    return torch.utils.data.TensorDataset(x_tr, y_tr), Pairs(x_te, y_te)


def datasets_dict():
    train, test = datasets()
    return {"train": train, "test": test}


def bad_items():
    return Pairs(torch.zeros(4, 1, 2), torch.arange(4)), [1, 2, 3]


def token_windows(n=240, context=8, vocab=5, seed=0):
    """A user's own corpus as token windows: x (N, context) tokens and y the next token at every position
    (a cycle 0, 1, ..., vocab - 1 from a random start), 3/4 train, 1/4 test."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    x = (start + torch.arange(context)) % vocab
    y = (x + 1) % vocab
    k = n * 3 // 4
    return x[:k], y[:k], x[k:], y[k:]
