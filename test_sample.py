"""Tests of sample.py."""
import atexit
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import gpt
import sample
import train
from conftest import (HERE, TEXT, HANG, tiny_model, tiny_train_config, tiny_flags, quiet, run_cli, one_line_error,
                      hand_made, set_in)


def test_train_then_sample_end_to_end(tmp_path, capsys):
    trained = run_cli("train.py", *tiny_flags(tmp_path))
    assert trained.returncode == 0 and trained.stderr == "", trained.stderr
    assert "what context buys" in trained.stdout and (tmp_path / "out" / "ckpt.pt").exists()
    # The run's last line of figures: the whole held-out split's loss, in bits per character too.
    held_out = len(gpt.split(TEXT)["val"]) - 1
    assert re.search(rf"\nval loss [\d.]+ on the whole held-out split \({held_out:,} tokens\), [\d.]+ bits per "
                     rf"character\n", trained.stdout), trained.stdout
    sampled = run_cli("sample.py", f"--out_dir={tmp_path / 'out'}", "--temperature", "0.8", "--max_new_tokens", "40",
                      "--start", "ROMEO", "--num_samples", "2")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.count("ROMEO") == 2 and len(sampled.stdout) >= 2 * (5 + 40)
    failed = one_line_error(capsys, sample, f"--out_dir={tmp_path / 'out'}", "--start", "\u00e9t\u00e9")
    assert failed == "error: characters not in the vocabulary: '\u00e9'; use those of the training text"
    closed = subprocess.Popen([sys.executable, "sample.py", f"--out_dir={tmp_path / 'out'}"], cwd=HERE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    closed.stdout.read(50)
    closed.stdout.close()  # python sample.py | head -c 50
    with closed.stderr:
        assert closed.wait(timeout=HANG) in (0, 141) and closed.stderr.read() == b""  # quiet, as cat


@pytest.mark.parametrize("flags, match", [
    # The sampling arguments are gpt.GPT.stream's to check: one line that names them, before anything is printed.
    *[([f"--{name}", value], name) for name in ("temperature", "top_p") for value in ("nan", "inf", "-1")],
    *[(["--temperature", value], f"argument --temperature: must be a number from 0 to 3.4e38, float32's largest, "
                                  f"got {value}") for value in ("-inf", "-Infinity")],
    (["--temperature", "1e308"], "argument --temperature: must be a number from 0 to 3.4e38"),  # finite, not in float32
    (["--top_p", "-1e-3"], "top_p must be in (0, 1], not -0.001"),
    (["--top_p", "0"], "top_p"),
    (["--top_p", "1.2"], "top_p"),
    (["--top_p", "1e-300", "--start", "\u00e9"], "not in the vocabulary"),  # a tiny top_p is accepted
    (["--top_k", "0"], "top_k"),
    (["--top_k", "2.5"], "argument --top_k: invalid int value"),
    (["--num_samples", "0"], "argument --num_samples: must be at least 1"),
    (["--max_new_tokens", "-5"], "argument --max_new_tokens: must be at least 1"),
    (["--seed", str(2 ** 63)], "argument --seed: seed must be in [0, 4294967295], not 9223372036854775808"),
    (["--start", "\u00e9"], "characters not in the vocabulary: '\u00e9'"),
    (["--start", ""], "--start is empty: give it a character or more"),
    # Bytes the locale did not read come as surrogates: é's two under LC_ALL=C with PYTHONUTF8=0, and bytes that are
    # no UTF-8 under any locale.
    (["--start", "RO\udcc3\udca9"], "characters not in the vocabulary: '\u00e9'"),
    (["--start", "RO\udced\udca0\udc80"], "--start is not UTF-8 text (its bytes from byte 3 are no character)"),
    (["--start", "FILE:/no/such/file"], "cannot read the prompt file /no/such/file (No such file"),
    (["--start", "FILE:FOLDER"], "cannot read the prompt file"),
    (["--start", "FILE:BINARY"], "(it is not UTF-8 text): pass --start FILE:path to a UTF-8 text file"),
    (["--start", "FILE:/dev/zero"], "(it is not a regular file)"),
    (["--start", "FILE:EMPTY"], "the prompt file"),
    (["--start", "FILE:"], "--start FILE: names no file: give --start FILE:path, the path of a text"),
    # Read as it is, as a text to train on is: a carriage return this model never saw is refused, not made a newline.
    (["--start", "FILE:CR"], "characters not in the vocabulary: '\\r'"),
    (["--start", "FILE:NULS"], "holds NUL bytes, so it is binary data, not a text: pass --start FILE:path to a UTF-8 "
                               "text"),  # a prompt is never token ids
    (["--device", "tpu"], "unknown or not on this machine"),
    (["--out_dir", "FOLDER"], "no checkpoint file at"),
    (["--out_dir", "CKPT_FOLDER"], "ckpt.pt (it is a folder, not a file): pass --out_dir the folder of a run"),
    (["--out_dir", "CKPT_PIPE"], "ckpt.pt (it is a pipe, not a file)"),  # read, it would hang
    (["--out_dir", "CKPT_DEVICE"], "ckpt.pt (it is a device or a socket, not a file)"),
    # torch's message cut to its first sentence: the rest suggests weights_only=False, no help for a file of junk
    (["--out_dir", "CORRUPT"], "can load (UnpicklingError: Weights only load failed.); train a new one"),
    (["--out_dir", "MISFIT"], "is not a checkpoint this gpt.py can load (RuntimeError: Error(s) in loading "
                              "state_dict for GPT: size mismatch for wte.weight: copying a param with shape"),
    (["--out_dir", "TRUNCATED"], "is not a checkpoint this gpt.py can load ("),
    (["--out_dir", "EMPTY_CKPT"], "can load (EOFError); train a new one"),
    (["--out_dir", "FEW_CHARS"], "(ValueError: 5 characters for a vocab_size of"),
    (["--out_dir", "NAN_WEIGHTS"], "holds weights that are NaN or inf, from a run that diverged"),
    # Finite, but too large for float32's products: no token can be drawn, greedy or not.
    (["--out_dir", "HUGE_WEIGHTS"], "error: logits of NaN or +inf, from weights that overflow: no token to draw"),
    (["--out_dir", "HUGE_WEIGHTS", "--temperature", "0"], "error: logits of NaN or +inf, from weights that overflow"),
    (["--report", "--data", "MISSING"], "cannot read the data file"),
    (["--report", "--data", ""], "argument --data: is empty: give a file"),
    (["--report", "--init_from", "gpt2"], "--report needs a checkpoint of a run"),
    # The test gives --out_dir too: one model or the other would be dropped without a word.
    (["--init_from", "gpt2"], "--out_dir names a run's checkpoint to sample, and --init_from GPT-2's weights: give "
                              "one of them"),
    # The report draws its own sample: another's options are refused, never dropped.
    (["--report", "--data", "MISSING", "--temperature", "0.5", "--seed", "3"], "--temperature, --seed are for "
                                                                               "sampling, and --report draws its own"),
    (["--report", "--data", "MISSING", "--start", "ROMEO"], "--start is for sampling, and --report draws its own "
                                                            "sample (temperature 0.8, seed 0): leave it out"),
    (["--report", "--data", "MISSING", "--top_k", "3"], "--top_k is for sampling"),
])
def test_bad_sampling_input_is_one_line_and_prints_nothing(tmp_path, trained_dir, capsys, flags, match):
    (tmp_path / "BINARY").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "EMPTY").write_text("")
    (tmp_path / "NULS").write_text("ROMEO\0")
    (tmp_path / "CR").write_bytes(b"ROMEO\rROMEO")
    os.makedirs(tmp_path / "FOLDER")
    os.makedirs(tmp_path / "CKPT_FOLDER" / "ckpt.pt")
    for name in ("CKPT_PIPE", "CKPT_DEVICE"):
        os.makedirs(tmp_path / name)
    os.mkfifo(tmp_path / "CKPT_PIPE" / "ckpt.pt")
    os.symlink("/dev/zero", tmp_path / "CKPT_DEVICE" / "ckpt.pt")
    os.makedirs(tmp_path / "CORRUPT")
    (tmp_path / "CORRUPT" / "ckpt.pt").write_bytes(b"not a checkpoint")
    hand_made(trained_dir, tmp_path / "MISFIT", set_in(["config", "n_embd"], 32))  # the weights no longer fit
    for name in ("TRUNCATED", "EMPTY_CKPT"):
        os.makedirs(tmp_path / name)
    whole = Path(trained_dir, "ckpt.pt").read_bytes()
    (tmp_path / "TRUNCATED" / "ckpt.pt").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "EMPTY_CKPT" / "ckpt.pt").write_bytes(b"")
    hand_made(trained_dir, tmp_path / "FEW_CHARS", lambda ckpt: ckpt.update(chars=ckpt["chars"][:5]))
    hand_made(trained_dir, tmp_path / "NAN_WEIGHTS", lambda ckpt: ckpt["model"]["wte.weight"].fill_(float("nan")))
    hand_made(trained_dir, tmp_path / "HUGE_WEIGHTS",
              lambda ckpt: [w.fill_(3e38) for name, w in ckpt["model"].items() if "c_fc" in name])
    names = ("CKPT_FOLDER|CKPT_PIPE|CKPT_DEVICE|FOLDER|BINARY|CORRUPT|MISFIT|EMPTY_CKPT|EMPTY|TRUNCATED|FEW_CHARS|"
             "NAN_WEIGHTS|HUGE_WEIGHTS|MISSING|NULS|CR")
    flags = [re.sub(names, lambda m: str(tmp_path / m.group(0)), f) for f in flags]
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, *flags)
    # Only --data reads token ids from a .bin: no other option's refusal suggests one.
    assert match in message and (".bin" not in message or "--data" in message), message
    assert capsys.readouterr().out == ""  # refused before printing anything


def test_sampling_needs_no_prompt_when_the_text_had_no_newline(tmp_path, capsys):
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT.replace("\n", " "), quiet)
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--max_new_tokens", "20", "--temperature", "1e-300"])
    done = capsys.readouterr()
    assert done.err == "" and len(done.out) > 20, done.err


def test_sampling_costs_the_same_per_token_at_any_length(tmp_path, monkeypatch, capsys, trained_dir):
    decoded = []
    real = gpt.CharTokenizer.decode
    monkeypatch.setattr(gpt.CharTokenizer, "decode", lambda self, ids: decoded.append(len(ids)) or real(self, ids))
    sample.main(["--out_dir", trained_dir, "--max_new_tokens", "300", "--num_samples", "1", "--start", "T"])
    assert len(capsys.readouterr().out) >= 301 and max(decoded) <= sample.HELD_BACK  # never the whole sample again


def test_gpt2_tokens_split_inside_a_character_print_whole(monkeypatch, capsys):
    text = "caf\u00e9 \u20ac\U0001f600!"
    pieces = [bytes([b]) for b in text.encode("utf-8")]  # one token per byte: characters split across tokens

    class Bytes:
        vocab_size = 256

        def encode(self, text):
            return list(text.encode("utf-8"))

        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    model = tiny_model(vocab_size=256)
    script = iter([torch.tensor([[b[0]]]) for b in pieces])
    monkeypatch.setattr(model, "stream", lambda *args, **kwargs: script)
    args = types.SimpleNamespace(num_samples=1, max_new_tokens=len(pieces), temperature=1.0, top_k=None, top_p=None,
                                 seed=0)
    sample.print_samples(model, Bytes(), "x", args, torch.device("cpu"))
    assert capsys.readouterr().out == "x" + text + "\n"


def test_sample_py_with_its_output_closed_says_so(trained_dir):
    done = subprocess.run([sys.executable, "sample.py", "--out_dir", trained_dir], cwd=HERE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=HANG, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1 and done.stderr.startswith("error: standard output is closed"), done.stderr
    assert done.stderr.count("\n") == 1


def test_the_report_needs_the_runs_data_and_holds_it_to_train_pys_checks(tmp_path, capsys, trained_dir):
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, "--report")
    assert "--report evaluates the model on the text it was trained on: give that text" in message
    short = tmp_path / "short.txt"
    short.write_text(TEXT[:50], encoding="utf-8")
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, "--report", "--data", str(short))
    assert "--block_size 16 is too long for the 5 tokens held out" in message
    other = tmp_path / "other.txt"
    other.write_text(TEXT + "#", encoding="utf-8")
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, "--report", "--data", str(other))
    assert "never saw ('#'): give --data the text it was trained on" in message and "--resume" not in message
    ids = tmp_path / "ids.bin"
    np.full(1000, 60000, dtype=np.uint16).tofile(ids)
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, "--report", "--data", str(ids))
    assert "token ids must be in [0," in message


def test_data_and_dtype_without_report_are_refused(capsys, trained_dir):
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, "--dtype", "uint8")
    assert "--data and --dtype are for --report" in message


def test_a_samples_controls_print_as_escapes_and_never_drive_the_terminal(tmp_path, capsys):
    # A text's characters, and so a checkpoint's, may be any: a terminal's escape, a bell, a mark that turns the line.
    (tmp_path / "data.txt").write_text("\x1b\x07\u202e" * 300, encoding="utf-8")
    train.main(tiny_flags(tmp_path, max_iters=2))
    closing = capsys.readouterr().out.split("sample:\n")[1]  # train.py's closing sample
    assert re.match(r"(\\x1b|\\x07|\\u202e){20}", closing), closing
    sample.main(["--out_dir", str(tmp_path / "out"), "--max_new_tokens", "30", "--num_samples", "1"])
    assert re.fullmatch(r"(\\x1b|\\x07|\\u202e){31}\n", capsys.readouterr().out)  # the prompt, then 30 drawn


def test_the_seed_help_speaks_of_the_draws_sampling_takes(capsys):
    """sample.py's --seed takes training's rule, and its own help: it seeds the draws, never weights or batches."""
    with pytest.raises(SystemExit):
        sample.parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split("options:")[1].split())
    seed = said[said.index("--seed SEED"):said.index("--device DEVICE")]
    assert "draws" in seed and "batches" not in seed and "(default: 1337)" in seed, seed


def test_a_prompt_is_read_as_the_locale_gave_it_and_a_prompt_file_by_any_name(tmp_path, trained_dir, capsys):
    """Only bytes the locale could not read (surrogates) are read again as UTF-8: a character a Latin-1 locale read
    stays itself, and a FILE: path is a file's name, which need not be UTF-8."""
    assert sample.typed("RO\u00e9") == "RO\u00e9" and sample.typed("RO\udcc3\udca9") == "RO\u00e9"
    path = os.path.join(os.fsencode(tmp_path), b"prompt \xe9.txt")  # a Latin-1 name
    Path(os.fsdecode(path)).write_text("ROMEO:", encoding="utf-8")
    sample.main(["--out_dir", trained_dir, "--start", "FILE:" + os.fsdecode(path), "--max_new_tokens", "3",
                 "--num_samples", "1"])
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_ctrl_c_while_sampling_ignores_a_second_as_python_shuts_down(trained_dir, monkeypatch, capsys):
    """A second Ctrl-C just after the first landed in torch's exit hooks as a traceback: at the interpreter's exit,
    before them, Ctrl-C is ignored; a caller that goes on (here, the tests) keeps its handler."""
    at_exit = []
    monkeypatch.setattr(atexit, "register", lambda *call: at_exit.append(call))
    before = signal.getsignal(signal.SIGINT)

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(sample, "print_samples", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--out_dir", trained_dir])
    assert exit_info.value.code == 130 and signal.getsignal(signal.SIGINT) is before
    assert at_exit == [(signal.signal, signal.SIGINT, signal.SIG_IGN)], at_exit
