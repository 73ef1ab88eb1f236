"""helpers.flags: every flag has a domain, and a value outside it is a one-line error."""

import argparse

import pytest

from helpers.flags import add_device_flags, check_placement, folder, integer, number


def parser_with(**types):
    parser = argparse.ArgumentParser(prog="script.py")
    for name, kind in types.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind)
    return parser


def refusal(parser, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["--n", "0"], "argument --n: must be an integer >= 1 and <= 8, got 0"),
    (["--n", "9"], "argument --n: must be an integer >= 1 and <= 8, got 9"),
    (["--n", "2.5"], "argument --n: expected an integer, got '2.5'"),
    (["--lr", "0"], "argument --lr: must be a finite number > 0, got 0"),
    (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    (["--p", "1"], "argument --p: must be a finite number >= 0 and < 1, got 1"),
    (["--p", "x"], "argument --p: expected a number, got 'x'"),
])
def test_values_outside_the_domain_are_refused_in_one_line(argv, message, capsys):
    parser = parser_with(n=integer(1, 8), lr=number(above=0), p=number(low=0, below=1))
    assert refusal(parser, argv, capsys) == f"script.py: error: {message}"


def test_values_inside_the_domain_pass_through():
    parser = parser_with(n=integer(1, 8), lr=number(above=0), p=number(low=0, below=1))
    args = parser.parse_args(["--n", "8", "--lr", "1e-3", "--p", "0"])
    assert (args.n, args.lr, args.p) == (8, 1e-3, 0.0)


def test_impossible_device_choice_exits_before_anything_starts(capsys):
    parser = argparse.ArgumentParser(prog="script.py")
    add_device_flags(parser)
    args = parser.parse_args(["--backend", "nccl", "--device", "cpu"])
    with pytest.raises(SystemExit):
        check_placement(parser, args, world_size=2)
    assert "error: backend 'nccl' needs one GPU per rank" in capsys.readouterr().err
    assert check_placement(parser, parser.parse_args(["--device", "cpu"]), 2).device_type == "cpu"


def test_run_folder_is_created_or_refused_in_one_line(tmp_path, capsys):
    parser = parser_with(run_dir=folder)
    assert parser.parse_args(["--run-dir", str(tmp_path / "a" / "b")]).run_dir.is_dir()
    (tmp_path / "a-file").write_text("")  # a folder cannot be made inside a file, on any system, even as root
    bad = tmp_path / "a-file" / "runs"
    assert refusal(parser, ["--run-dir", str(bad)], capsys).startswith(
        f"script.py: error: argument --run-dir: cannot create folder '{bad}'")
