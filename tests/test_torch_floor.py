"""The PyTorch floor: ``helpers`` refuses an older torch in one line, at import."""

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import helpers
from helpers.system import Unsupported

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("installed", ["2.10.1", "2.9.0", "2.10.0+cu128", "1.13.1"])
def test_a_torch_below_the_floor_is_refused_in_one_line(installed):
    with pytest.raises(SystemExit) as stopped:
        helpers.check_torch(installed)
    assert stopped.value.code == (f"PyTorch {installed} is older than {helpers.TORCH_FLOOR}, the oldest the course "
                                  f"is tested with: pip install -U 'torch>={helpers.TORCH_FLOOR}' (the README's "
                                  "'Which PyTorch' says more)")


@pytest.mark.parametrize("installed", ["2.11", "2.11.0+cu130", "2.14.1", "2.15.0.dev20261101", "3.0.0"])
def test_the_floor_and_newer_pass(installed):
    assert helpers.check_torch(installed) == installed


def test_in_a_notebook_the_refusal_is_one_line_without_traceback(monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    with pytest.raises(Unsupported) as stopped:
        helpers.check_torch("2.10.0")
    (line,) = stopped.value._render_traceback_()  # what IPython prints instead of a traceback
    assert line.startswith("Unsupported: PyTorch 2.10.0 is older than")


def test_the_installed_torch_passes():
    assert helpers.check_torch() == version("torch")


def test_pyproject_asks_for_the_floor_helpers_checks():
    asked = re.findall(r'"torch>=([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert asked == [helpers.TORCH_FLOOR]


def _pin(path, package):
    (pin,) = re.findall(rf"^{package}==(\S+)$", (ROOT / path).read_text(), flags=re.M)
    return pin


def test_make_test_floor_installs_the_floor_and_make_test_a_newer_pin():
    floor = helpers._release(helpers.TORCH_FLOOR)
    assert helpers._release(_pin("constraints-floor.txt", "torch"))[:2] == floor[:2]
    assert helpers._release(_pin("constraints.txt", "torch")) >= floor
    # torchvision of the same release as each torch (0.N+15 goes with 2.N)
    for path in ("constraints.txt", "constraints-floor.txt"):
        torch_minor = helpers._release(_pin(path, "torch"))[1]
        assert helpers._release(_pin(path, "torchvision"))[1] == torch_minor + 15, path


def test_environment_yml_and_readme_name_the_floor():
    assert f"torch>={helpers.TORCH_FLOOR}" in (ROOT / "environment.yml").read_text()
    readme = (ROOT / "README.md").read_text()
    assert f"`torch>={helpers.TORCH_FLOOR}`" in readme and f"| {_pin('constraints-floor.txt', 'torch')} |" in readme


@pytest.mark.skipif(helpers._release(version("torch"))[:2] != helpers._release(helpers.TORCH_FLOOR)[:2],
                    reason="runs in make test-floor, with the floor's torch installed")
def test_the_floor_run_has_the_floors_torch_and_torchvision():
    for package in ("torch", "torchvision"):
        assert helpers._release(version(package)) == helpers._release(_pin("constraints-floor.txt", package))


def test_importing_helpers_with_an_old_torch_stops_with_only_that_line(tmp_path):
    # a torch 2.3.0 as far as the installed packages' metadata says, found before the real one
    info = tmp_path / "torch-2.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.3.0\n")
    done = subprocess.run([sys.executable, "-c", "import helpers"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)])))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"PyTorch 2.3.0 is older than {helpers.TORCH_FLOOR}, the oldest the course "
                                        f"is tested with: pip install -U 'torch>={helpers.TORCH_FLOOR}' (the "
                                        "README's 'Which PyTorch' says more)"]
