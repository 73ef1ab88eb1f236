"""helpers.data: the shipped MNIST subset is real, balanced and documented; the source is announced."""

import hashlib
import os
import re
import shutil

import numpy as np
import pytest

from helpers.data import DATA_DIR, SUBSET, load_mnist


def test_shipped_subset_matches_its_documented_checksum():
    readme = (DATA_DIR / "README.md").read_text()
    documented = re.search(r"sha256 `([0-9a-f]{64})`", readme).group(1)
    assert hashlib.sha256((DATA_DIR / SUBSET).read_bytes()).hexdigest() == documented


def test_offline_subset_is_balanced_real_digits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_OFFLINE", "1")
    shutil.copy(DATA_DIR / SUBSET, tmp_path)
    mnist = load_mnist(tmp_path)
    assert capsys.readouterr().out.startswith("MNIST: offline subset mnist_subset.npz (4000 train / 1000 test")
    (x, y), (tx, ty) = mnist.train.tensors, mnist.test.tensors
    assert x.shape == (4000, 1, 28, 28) and tx.shape == (1000, 1, 28, 28)
    assert np.bincount(y.numpy()).tolist() == [400] * 10 and np.bincount(ty.numpy()).tolist() == [100] * 10
    raw = np.load(tmp_path / SUBSET)["train_images"]
    # Handwriting, not noise: mostly black background, a few bright strokes, ink near the centre.
    assert 0.7 < (raw == 0).mean() < 0.9 and (raw > 128).mean() > 0.05
    ink = raw.mean(axis=0)
    assert ink[10:18, 10:18].mean() > 5 * ink[:4, :].mean()
    assert abs(x.mean().item()) < 0.2, "normalised with MNIST's mean and std"


def test_quiet_load_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_OFFLINE", "1")
    load_mnist(download=False, verbose=False)
    assert capsys.readouterr().out == ""


def test_missing_data_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data folder .*missing.* does not exist"):
        load_mnist(tmp_path / "missing")


def test_offline_load_does_not_import_torchvision(tmp_path):
    import subprocess
    import sys

    shutil.copy(DATA_DIR / SUBSET, tmp_path)
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)  # what an earlier failed download leaves
    probe = (f"import sys; from helpers.data import load_mnist; d = load_mnist({str(tmp_path)!r}, verbose=False); "
             "print(len(d.train), 'torchvision' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COURSE_OFFLINE": "1"})
    assert done.stdout.split() == ["4000", "False"], done.stdout + done.stderr
