"""Tests of cli.py, what the command lines share: options, numbers, errors in one line, output."""
import argparse
import dataclasses
import errno
import math
import os
import re
import subprocess
import sys

import pytest

import bench
import checkpoint
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
    flat = " ".join(help_text.split())
    for f in dataclasses.fields(gpt.TrainConfig):  # each option's help, as gpt.option() declared it, whole
        assert f.metadata["help"].endswith(".") and f"{f.metadata['help']} (default:" in flat, f.name


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(gpt.TrainConfig)
                                  if type(f.default) in (int, float)])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1e9"])
def test_every_number_of_train_config_refuses_nan_inf_and_out_of_range_on_the_command_line(capsys, name, value):
    message = one_line_error(capsys, train, f"--{name}", value)
    # The option's own rule refuses it, not argparse's "expected one argument" (which would take -1e9 for an option).
    assert f"argument --{name}: " in message and "expected one argument" not in message, message


def edges(f):
    """Values at and around the edges of the config field f's rule (its bounds included), and values of other
    types; an integer of 400 digits for every number, beyond any bound."""
    kind = type(f.default)
    rule = f.metadata
    if kind is bool:
        return [True, False, 1, "yes"]
    if kind is str:
        return [*(rule["choices"] or ()), "", "other", 1]
    low, high = rule["min"], rule["max"]
    huge = int("9" * 400)
    if kind is int:
        return [f.default, low - 1, low, low + 1, high - 1, high, high + 1, huge, -huge, True, 2.5, float(low)]
    inside = [low, math.nextafter(low, math.inf), math.nextafter(high, -math.inf), high]
    return [*inside, math.nextafter(low, -math.inf), math.nextafter(high, math.inf), math.nan, math.inf, -math.inf,
            int(low), True]


def text_of(value):
    return repr(value) if type(value) is float else str(value)


def accepted(build):
    try:
        build()
        return True
    except (ValueError, SystemExit, argparse.ArgumentTypeError):
        return False


@pytest.mark.parametrize("f", dataclasses.fields(gpt.TrainConfig), ids=lambda f: f.name)
def test_the_api_the_command_line_bench_set_and_a_resume_accept_and_refuse_the_same_values(f, capsys):
    """Every option's edges, through gpt.TrainConfig, train.py's flags (as main builds the config), bench.py --set
    and a checkpoint's recorded options (as a resume builds the config): one rule for each, in gpt.py."""
    verdicts = []
    for value in edges(f):
        api = accepted(lambda: gpt.TrainConfig(**{f.name: value}))
        flag = [f"--{f.name}={text_of(value)}"]
        cli_ok = accepted(lambda: gpt.TrainConfig(**train.parse_args(["--data", "x"] + flag)[1]))
        assert cli_ok == api or type(value) is not type(f.default) and not api, (f.name, value, api, cli_ok)
        if f.name not in bench.NOT_SET:
            bench_ok = accepted(lambda: gpt.TrainConfig(**dict([bench.train_option(f"{f.name}={text_of(value)}")])))
            assert bench_ok == cli_ok, (f.name, value)
        if f.name not in ("out_dir", "device"):
            ckpt = {"train_config": {f.name: value}}
            resumed = accepted(lambda: gpt.TrainConfig(**checkpoint.recorded_options(ckpt, "ckpt.pt", "")))
            assert resumed == api, (f.name, value)
        verdicts.append(api)
    capsys.readouterr()
    # Each option's edges include values it takes and values it refuses.
    assert any(verdicts) and not all(verdicts), f.name


def test_the_rules_that_tie_options_and_the_bounds_each_entry_point_shares():
    for bad in (dict(muon_momentum=1.0), dict(min_lr=0.01), dict(learning_rate=1e-4), dict(seed=2 ** 70),
                dict(learning_rate=1.01), dict(beta2=1.0), dict(n_embd=20, n_head=4)):
        with pytest.raises(ValueError):
            gpt.TrainConfig(**bad)
        flags = [f"--{name}={value}" for name, value in bad.items()]
        with pytest.raises(ValueError):  # the flags parse alone; the config that main builds refuses them together
            gpt.TrainConfig(**train.parse_args(["--data", "x"] + flags)[1]) if accepted(
                lambda: train.parse_args(["--data", "x"] + flags)) else gpt.TrainConfig(**bad)
    gpt.TrainConfig(learning_rate=1e-4, min_lr=1e-4)  # a constant rate, as --init_from's
    with pytest.raises(SystemExit):
        bench.measure(["--optimizers", "1", "--set", "learning_rate=1e-4"])  # a rising schedule, as train.py says


@pytest.mark.parametrize("error", [RuntimeError("std::bad_alloc"), MemoryError(),
                                   OSError(errno.ENOMEM, "Cannot allocate memory"),  # np.memmap's, or a fork's
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 9 bytes.")])
def test_every_kind_of_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch, error):
    def fails(*args):
        raise error

    monkeypatch.setattr(gpt, "train_step", fails)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    assert message.startswith("error: out of memory (") and "use a smaller model" in message, message


def test_a_path_that_names_memory_is_not_said_to_be_out_of_memory(tmp_path, capsys):
    message = one_line_error(capsys, train, "--data", str(tmp_path / "memory.txt"), "--out_dir", str(tmp_path / "out"))
    assert message.startswith("error: cannot read the data file") and "out of memory" not in message, message


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, where every write finds the disk full")
def test_output_to_a_full_disk_is_one_line(trained_dir):
    for args in (["sample.py", "--out_dir", trained_dir], ["gpt_numpy.py", "--check"], ["workbook.py", "--help"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, *args], cwd=HERE, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=HANG)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, (args, done.stderr)
        own = "no space left on the device the output goes to: free some, or send it elsewhere"
        says = own if args[0] == "sample.py" else "No space left on device"  # the twin imports numpy alone
        assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_character_the_terminal_cannot_show_prints_as_an_escape(tmp_path):
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT.replace("e", "\u00e9"), quiet)
    done = run_cli("sample.py", "--out_dir", str(tmp_path / "out"), "--start", "\u00e9", "--max_new_tokens", "200",
                   env=dict(PYTHONIOENCODING="ascii"))  # an ASCII terminal
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("\\xe9"), done.stderr


def test_a_field_a_copier_adds_gets_a_flag_and_gpt_pys_check(capsys, monkeypatch):
    fields = {**cli.FIELDS, "beta3": gpt.option(0.5, 0, 1)}
    for name, f in fields.items():
        f.name = name
    monkeypatch.setattr(cli, "FIELDS", fields)
    with pytest.raises(argparse.ArgumentTypeError, match=r"beta3 must be in \[0, 1\], not 2.0"):
        cli.parse_option("beta3", "2")
    assert cli.parse_option("beta3", "0.25") == 0.25
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    assert "--beta3 BETA3" in capsys.readouterr().out  # no help declared, still a flag


def test_a_message_shows_a_names_controls_and_format_characters_as_escapes():
    # A name from a file (a tokenizer's, a weight's) may hold a terminal's escape, a line break or a mark that turns
    # the line; the message stays one line, and shows what is there.
    said = cli.one_line(ValueError("tokenizer ev\u202eil\x1b[2J\nname\U000e0041"))
    assert said == "tokenizer ev\\u202eil\\x1b[2J\\nname\\U000e0041", said
