"""Tests of cli.py, what the command lines share: options, numbers, errors in one line, output."""
import argparse
import dataclasses
import os
import re
import subprocess
import sys

import pytest

import cli
import gpt
import train
from conftest import HERE, TEXT, HANG, tiny_train_config, tiny_flags, quiet, run_cli, one_line_error


def test_train_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    help_text = capsys.readouterr().out
    options = [f.name for f in dataclasses.fields(gpt.TrainConfig)] + ["data", "dtype", "init_from", "resume",
                                                                        "log_interval", "compile"]
    entries = {entry.split()[0]: entry for entry in re.split(r"\n  (?=--)", help_text.split("\noptions:\n")[1])}
    for name in options:
        assert "(default:" in entries[f"--{name}"], name  # each option's own help says its default
    assert help_text.count("(default:") == len(options)
    assert "Seconds of wall time to train instead of max_iters (0: off); the learning rate then decays over time" \
        in " ".join(help_text.split())  # a comment of two lines in gpt.py, whole


@pytest.mark.parametrize("name", [name for name in cli.LIMITS])
@pytest.mark.parametrize("value", ["nan", "inf", "-1e9"])
def test_every_number_of_train_config_refuses_nan_inf_and_out_of_range_on_the_command_line(capsys, name, value):
    message = one_line_error(capsys, train, f"--{name}", value)
    assert f"argument --{name}: " in message, message


@pytest.mark.parametrize("error", [RuntimeError("std::bad_alloc"), MemoryError(),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 9 bytes.")])
def test_every_kind_of_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch, error):
    def fails(*args):
        raise error

    monkeypatch.setattr(gpt, "train_step", fails)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    assert message.startswith("error: out of memory (") and "use a smaller model" in message, message


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, where every write finds the disk full")
def test_output_to_a_full_disk_is_one_line(trained_dir):
    for args in (["sample.py", "--out_dir", trained_dir], ["gpt_numpy.py", "--check"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, *args], cwd=HERE, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=HANG)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, (args, done.stderr)
        assert "No space left on device" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_character_the_terminal_cannot_show_prints_as_an_escape(tmp_path):
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT.replace("e", "\u00e9"), quiet)
    done = run_cli("sample.py", "--out_dir", str(tmp_path / "out"), "--start", "\u00e9", "--max_new_tokens", "200",
                   env=dict(PYTHONIOENCODING="ascii"))  # an ASCII terminal
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("\\xe9"), done.stderr


def test_every_option_has_its_rule_in_one_place_and_a_field_without_help_still_gets_a_flag(capsys, monkeypatch):
    assert set(cli.HELP) == set(cli.OPTION_TYPES) == {f.name for f in dataclasses.fields(gpt.TrainConfig)}
    assert all(cli.HELP[name].endswith(".") for name in cli.HELP)
    # The same rule refuses a value on the command line, in bench.py --set and in a checkpoint's records.
    assert cli.allowed("muon_lr", 0.02) and not cli.allowed("muon_lr", 2.0) and not cli.allowed("n_layer", True)
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be in \[1e-09, 1\), got 2"):
        cli.parse_option("muon_lr", "2")
    monkeypatch.delitem(cli.HELP, "beta2")
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "--beta2 BETA2" in capsys.readouterr().out
