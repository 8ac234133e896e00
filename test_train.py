"""Tests of train.py: its runs, resuming them, signals, and how it stops."""
import atexit
import errno
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import unicodedata
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

import checkpoint
import data
import gpt
import report
import sample
import train
from conftest import (HERE, TEXT, HANG, tiny_train_config, tiny_flags, quiet, run_cli, one_line_error, ByteTokenizer,
                      hand_made, set_in, signal_at, signal_after_line)


# ---------------------------------------------------------------------------------------------------- runs and resumes
def test_a_new_run_saves_its_start_before_its_first_step(tmp_path, monkeypatch):
    steps = []
    real = gpt.train_step
    monkeypatch.setattr(gpt, "train_step", lambda *args: steps.append(1) or real(*args))

    real_save = gpt.Trainer.save

    def save_then_stop(self):
        real_save(self)
        raise KeyboardInterrupt
    monkeypatch.setattr(gpt.Trainer, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train.run(tiny_train_config(tmp_path), TEXT, quiet)
    assert not steps and torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 0


def test_the_first_line_says_when_the_steps_run_under_bf16_autocast(tmp_path, monkeypatch):
    for dtype, said in ((torch.bfloat16, True), (torch.float32, False)):
        monkeypatch.setattr(gpt, "matmul_dtype", lambda device, dtype=dtype: dtype)
        lines = []
        trainer, _ = train.run(tiny_train_config(tmp_path, out_dir="", max_iters=1), TEXT, lines.append)
        assert trainer.amp._enabled == said and (" on cpu (bf16 autocast); " in lines[0]) == said, lines[0]


def test_resume_trains_with_the_recorded_options_and_those_given(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=4, learning_rate=2e-3, min_lr=1e-4)
    train.main(flags)
    trainer, _ = train.run(gpt.TrainConfig(out_dir=str(tmp_path / "out"), max_iters=6, device="cpu"), TEXT, quiet,
                           resume=True, given=dict(max_iters=6, weight_decay=0.5, beta2=0.9))
    assert (trainer.tc.learning_rate, trainer.tc.min_lr, trainer.tc.eval_interval) == (2e-3, 1e-4, 4)  # recorded
    assert [g["weight_decay"] for g in trainer.optimizers[0].param_groups] == [0.5, 0.5, 0.0]  # given, and applied
    assert all(g["betas"] == (0.9, 0.9) for g in trainer.optimizers[0].param_groups)
    recorded = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["train_config"]
    assert (recorded["weight_decay"], recorded["beta2"], recorded["learning_rate"]) == (0.5, 0.9, 2e-3)


def test_resume_says_which_model_options_it_ignores_and_records_the_model_it_kept(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=4)
    train.main(flags)
    train.main(flags + ["--resume", "--max_iters", "6", "--n_layer", "3", "--n_embd", "64", "--pos", "learned",
                        "--n_head", "2"])  # n_head 2: as the checkpoint has it, so not ignored
    out = capsys.readouterr().out
    assert "--resume keeps the model's options, so these are ignored: --n_layer 3, --n_embd 64, --pos learned\n" in out
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 6
    assert {k: ckpt["train_config"][k] for k in ("n_layer", "n_embd", "pos")} == \
           {k: ckpt["config"][k] for k in ("n_layer", "n_embd", "pos")} == dict(n_layer=1, n_embd=16, pos="rope")


def test_a_vocab_size_given_with_a_text_is_named_as_ignored(tmp_path, capsys):
    train.main(tiny_flags(tmp_path, max_iters=2, eval_interval=2) + ["--vocab_size", "5"])
    out = capsys.readouterr().out
    chars = len(set(TEXT))
    assert f"--vocab_size 5 is ignored: a text's vocabulary is its tokenizer's ({chars} tokens)\n" in out, out
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["config"]["vocab_size"] == chars


def test_a_resume_keeps_the_checkpoints_tokenizer_whatever_its_data(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=2)
    train.main(flags)
    chars = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["chars"]
    # The .bin of the model's own ids, as nanoGPT's character preparation writes it.
    np.array(gpt.CharTokenizer(chars).encode(TEXT), dtype=np.uint16).tofile(tmp_path / "chars.bin")
    train.main([*flags, "--data", str(tmp_path / "chars.bin"), "--resume", "--max_iters", "6"])
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 6 and ckpt["chars"] == chars  # not dropped: sample.py decodes, the text resumes
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--max_new_tokens", "5", "--num_samples", "1"])
    train.main([*flags, "--resume", "--max_iters", "8"])
    # A tokenizer of the user's own, which a checkpoint knows by its name: kept on a resume on its ids.
    bytes_ids = np.array(ByteTokenizer().encode(TEXT), dtype=np.uint16)
    bytes_ids.tofile(tmp_path / "bytes.bin")
    gpt.train(tiny_train_config(tmp_path, out_dir=str(tmp_path / "own"), max_iters=2, eval_interval=2), bytes_ids,
              tokenizer=ByteTokenizer(), log=quiet)
    train.main(["--data", str(tmp_path / "bytes.bin"), "--out_dir", str(tmp_path / "own"), "--resume",
                "--max_iters", "4", "--device", "cpu"])
    ckpt = torch.load(tmp_path / "own" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["tokenizer"] == "bytes"


def test_a_resume_with_data_left_out_takes_input_txt_only_where_the_run_trained_on_it(tmp_path, capsys, monkeypatch):
    # Without --data and --out_dir, which are given here as a user types them, from the folder of input.txt.
    flags = [flag for flag in tiny_flags(tmp_path, max_iters=2, eval_interval=2)[2:] if "--out_dir" not in flag]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "input.txt").write_text(TEXT[:len(TEXT) // 2] * 2, encoding="utf-8")  # the same characters
    train.main([*flags, "--out_dir", "out", "--data", "mine.txt"])
    kept = (tmp_path / "out" / "ckpt.pt").read_bytes()
    message = one_line_error(capsys, train, *flags, "--out_dir", "out", "--resume", "--max_iters", "4")
    assert message == ("error: out/ckpt.pt was not trained on input.txt as it is now (another file, or this one "
                       "since changed), which --data reads when it is left out: give --data the file it trained on "
                       "(or --data input.txt to go on with this one)"), message
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == kept
    capsys.readouterr()
    train.main([*flags, "--out_dir", "out", "--resume", "--max_iters", "4", "--data", "input.txt"])  # named: taken
    assert ("out/ckpt.pt was not trained on input.txt as it is now (another file, or this one since changed): it goes "
            "on with this one\n") in capsys.readouterr().out  # and said
    train.main([*flags, "--out_dir", "out", "--resume", "--max_iters", "6", "--data", "mine.txt"])
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 6
    train.main([*flags, "--out_dir", "own"])  # a run of input.txt resumes without --data
    train.main([*flags, "--out_dir", "own", "--max_iters", "4", "--resume"])
    assert torch.load(tmp_path / "own" / "ckpt.pt", weights_only=True)["iter"] == 4


def test_resume_and_report_read_a_bin_as_the_run_read_it_and_refuse_another_type_for_the_same_file(tmp_path,
                                                                                                   capsys):
    ids = tmp_path / "ids.bin"
    np.tile(np.arange(40, dtype=np.int32), 200).tofile(ids)  # read as uint16, every other id would be a 0
    flags = ["--data", str(ids), "--dtype", "int32", "--out_dir", str(tmp_path / "out"), "--device", "cpu",
             "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1", "--block_size", "16", "--n_layer", "1",
             "--n_embd", "16", "--n_head", "2", "--batch_size", "2"]
    train.main(flags)
    recorded = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["data"]
    assert recorded["read_as"] == "int32" and recorded["bytes"] == 32000 and recorded["fingerprint"]
    trainer, _ = train.run(gpt.TrainConfig(out_dir=str(tmp_path / "out"), device="cpu"), data.DataFile(str(ids)),
                           quiet, resume=True, given=dict(max_iters=4))  # no --dtype: the checkpoint's
    assert trainer.splits["train"].dtype == np.int32 and trainer.it == 4
    without_dtype = [f for f in flags if f not in ("--dtype", "int32")]
    message = one_line_error(capsys, train, *without_dtype, "--resume", "--max_iters", "6", "--dtype", "uint16")
    assert message.endswith("ids.bin is the file " + str(tmp_path / "out" / "ckpt.pt") + " was trained on, read then "
                            "as int32 ids and now as uint16 ids: leave out --dtype"), message
    capsys.readouterr()
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(ids)])
    assert "wrote" in capsys.readouterr().out
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"), "--data", str(ids),
                             "--dtype", "uint8")
    assert "read then as int32 ids and now as uint8 ids: leave out --dtype" in message, message
    # Another file is other data: --dtype reads it as given.
    np.tile(np.arange(40, dtype=np.uint16), 400).tofile(tmp_path / "other.bin")
    train.main([*without_dtype, "--data", str(tmp_path / "other.bin"), "--dtype", "uint16", "--resume",
                "--max_iters", "6"])
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["data"]["read_as"] == "uint16"


def test_the_rule_tying_min_lr_to_learning_rate_holds_the_options_the_run_really_uses(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=2, learning_rate=2e-3, min_lr=1e-5)
    train.main(flags)
    # Resumed at a rate below the default min_lr (3e-4), above the run's own: it trains.
    train.main([*tiny_flags(tmp_path), "--resume", "--max_iters", "4", "--learning_rate", "1e-4"])
    recorded = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["train_config"]
    assert (recorded["learning_rate"], recorded["min_lr"]) == (1e-4, 1e-5)
    # Below the run's own min_lr: refused, by the options the run would use.
    message = one_line_error(capsys, train, *tiny_flags(tmp_path), "--resume", "--max_iters", "6", "--learning_rate",
                             "1e-6")
    assert message.endswith("min_lr 1e-05 is above learning_rate 1e-06, so the rate would rise: lower min_lr"), message
    # A model option given on --resume is kept from the checkpoint, so no rule ties it to the defaults' others.
    train.main([*tiny_flags(tmp_path), "--resume", "--max_iters", "6", "--n_head", "3"])
    # --init_from's constant rate: a --learning_rate below its default min_lr is the rate throughout.
    tc = train.first_config({}, dict(learning_rate=1e-5, n_head=5), init_from="gpt2")
    assert (tc.learning_rate, tc.min_lr, tc.optimizer) == (1e-5, 1e-5, "adamw")
    assert train.first_config({}, dict(learning_rate=1e-2), init_from="gpt2").min_lr == 1e-2
    assert train.first_config({}, dict(min_lr=1e-6), init_from="gpt2").learning_rate == 3e-5
    with pytest.raises(ValueError, match=r"min_lr 0.0003 is above learning_rate 0.0001, so the rate would rise"):
        train.first_config({}, dict(learning_rate=1e-4))  # a new run: the defaults are what it uses


def test_the_last_evaluation_and_the_report_read_a_bounded_share_of_a_large_held_out_split(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.setattr(gpt, "MAX_EVAL_TOKENS", 1000)  # TEXT holds out 3,000 tokens
    real_loss, read = gpt.split_loss, []
    monkeypatch.setattr(gpt, "split_loss", lambda model, ids, batch_size: read.append(len(ids)) or real_loss(
        model, ids, batch_size))
    real_forward, rows = gpt.GPT.forward, []

    def counted(model, idx, targets=None, cache=None):
        rows.append(idx.size(0) if cache is None and idx.size(1) == 16 else 0)
        return real_forward(model, idx, targets, cache)

    monkeypatch.setattr(gpt.GPT, "forward", counted)
    train.main(tiny_flags(tmp_path, max_iters=2, eval_interval=2, eval_iters=100))  # 6,400 tokens a split
    out = capsys.readouterr().out
    assert read and max(read) == 1000, read  # every evaluation, the last one too
    assert re.search(r"\nval loss [\d.]+ on the first 1,000 of 3,000 held-out tokens, [\d.]+ bits per character\n",
                     out), out
    # The report's loss at each position: at most MAX_EVAL_TOKENS of windows, never more than the split holds.
    trainer_tc = tiny_train_config(tmp_path, eval_iters=100)  # 400 windows
    model = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")[0]
    val = gpt.split(np.arange(30_000) % model.config.vocab_size)["val"]
    for bound, windows in ((1000, 1000 // 16), (10 ** 6, 2999 // 16)):
        monkeypatch.setattr(gpt, "MAX_EVAL_TOKENS", bound)
        rows.clear()
        report.loss_by_position(model, val, trainer_tc)
        assert sum(rows) == windows, (bound, sum(rows))


def test_train_py_trains_the_weights_a_copy_of_gpt_py_alone_trains(tmp_path):
    # The same model and optimizer step: what gpt.train gives a copier is what python train.py trains.
    tc = tiny_train_config(tmp_path, max_iters=4)
    ours, _ = train.run(tc, TEXT, quiet)
    theirs, _ = gpt.train(replace(tc, out_dir=""), TEXT, log=quiet)
    assert [type(o) for o in ours.optimizers] == [torch.optim.AdamW, gpt.Muon]
    for (name, p), q in zip(ours.model.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_ctrl_c_saves_and_resume_continues_exactly_with_either_optimizer(tmp_path, monkeypatch, optimizer):
    tc = tiny_train_config(tmp_path, dropout=0.1, optimizer=optimizer)  # dropout: the RNG must come back too
    straight, _ = train.run(replace(tc, out_dir=str(tmp_path / "straight")), TEXT, quiet)
    real_batch, train_batches = gpt.Trainer.batch, []

    def ctrl_c_in_step_six(self, split):
        train_batches.append(split == "train")
        if sum(train_batches) == 6 and split == "train":  # the sixth step's (evaluations read no batch)
            signal.raise_signal(signal.SIGINT)
        return real_batch(self, split)

    monkeypatch.setattr(gpt.Trainer, "batch", ctrl_c_in_step_six)
    first, stopped = train.run(tc, TEXT, quiet)
    assert stopped == signal.SIGINT and first.it == 6
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 6
    monkeypatch.setattr(gpt.Trainer, "batch", real_batch)
    second, stopped = train.run(tc, TEXT, quiet, resume=True)
    unclocked = lambda history: [{k: v for k, v in h.items() if k != "seconds"} for h in history]
    assert stopped is None and second.it == 8 and unclocked(second.history) == unclocked(straight.history)
    if optimizer == "muon":  # train.py steps with gpt.py's own Muon, as a resumed run does
        assert [type(o) for o in second.optimizers] == [torch.optim.AdamW, gpt.Muon]
    # Bit for bit the weights of the run that was never stopped, on one machine: there the same products round
    # alike. Resumed on another machine, a run may part from it by rounding.
    for (name, p), q in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129),
                                            (signal.SIGUSR1, 138)])
def test_a_signal_saves_the_step_under_way_says_so_and_exits_non_zero(tmp_path, monkeypatch, capsys, signum, status):
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=2)
    if signum == signal.SIGTERM:  # one signal from outside, to a process of its own, as a scheduler sends it
        proc = subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if line.startswith("iter 3/"):
                break
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=HANG)
        code = proc.returncode
    else:  # the others to this process, after the progress line of step 3, by the same handlers
        signal_after_line(monkeypatch, signum)
        with pytest.raises(SystemExit) as exit_info:
            train.main([*flags, "--log_interval", "1"])
        out, err = capsys.readouterr()
        code = exit_info.value.code
    assert code == status, err
    # During a step, the step finishes and is saved; during an evaluation, that ends at once. The report is left
    # to sample.py --report, which rebuilds it from the checkpoint.
    said = re.search(rf"{signal.Signals(signum).name}: (the evaluation was cut short; )?saved iteration (\d+) to .*; "
                     rf"continue with --resume", out)
    assert said and err == "", (out, err)
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == int(said.group(2)) >= 3
    assert not (tmp_path / "out" / "report.html").exists()
    if signum == signal.SIGTERM:  # the report is rebuilt alike after any of them
        sample.main(["--out_dir", str(tmp_path / "out"), "--report", "--data", flags[1]])
        assert "<svg class=\"attention\"" in (tmp_path / "out" / "report.html").read_text(encoding="utf-8")


def test_a_second_signal_stops_at_once_and_the_handlers_are_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with train.signals_caught() as caught:
        signal.raise_signal(signal.SIGTERM)
        assert caught == [signal.SIGTERM]  # the first only raises the flag
        with pytest.raises(train.Stopped) as stopped:
            signal.raise_signal(signal.SIGINT)
        assert stopped.value.signum == signal.SIGINT  # the second stops at once, with its own status
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("where", ["report", "sample", "last evaluation"])
def test_a_signal_in_the_closing_phase_is_honoured_with_its_exit_status(tmp_path, monkeypatch, capsys, where):
    flags = tiny_flags(tmp_path)
    if where == "last evaluation":
        real = gpt.Trainer.evaluate
        monkeypatch.setattr(gpt.Trainer, "evaluate", lambda self, whole=False: (self.it == 8 and signal.raise_signal(
            signal.SIGTERM), real(self, whole))[1])
    else:
        name = "loss_by_position" if where == "report" else "closing_sample"
        monkeypatch.setattr(report, name, lambda *args: signal.raise_signal(signal.SIGTERM))
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    out = capsys.readouterr().out
    assert exit_info.value.code == 143, out
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 8
    # The report, cut short, can be written later from the checkpoint: the line says how.
    later = r"the report was cut short; saved iteration 8 to .*ckpt.pt: python sample.py --report --out_dir .* --data"
    said = rf"SIGTERM: ({later}|(the evaluation was cut short; )?saved iteration 8)"
    assert re.search(said, out), out


@pytest.mark.parametrize("where", ["report", "evaluation"])
def test_a_signal_in_a_run_without_out_dir_says_that_nothing_is_saved(tmp_path, monkeypatch, capsys, where):
    flags = [*tiny_flags(tmp_path), "--out_dir", ""]
    if where == "report":
        monkeypatch.setattr(report, "loss_by_position", lambda *args: signal.raise_signal(signal.SIGTERM))
    else:  # in an evaluation's first forward, which ends at once
        forward = gpt.GPT.forward
        monkeypatch.setattr(gpt.GPT, "forward", lambda model, *args, **kwargs: (
            model.training or signal.raise_signal(signal.SIGTERM), forward(model, *args, **kwargs))[1])
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    out = capsys.readouterr().out
    assert exit_info.value.code == 143, out
    cut = "the report was cut short" if where == "report" else "the evaluation was cut short"
    assert re.search(rf"\nSIGTERM: {cut}; no --out_dir, so nothing is saved\n", out), out
    assert "ckpt.pt" not in out and "--resume" not in out and "sample.py" not in out, out


def test_a_long_evaluation_runs_batch_by_batch_and_a_signal_ends_it_at_once(tmp_path, monkeypatch, capsys):
    forward = gpt.GPT.forward
    evaluated = []

    def signalled_in_the_evaluation(model, *args, **kwargs):
        if not model.training:  # an evaluation's batch: the first one sends the signal, as a scheduler would
            evaluated.append(1)
            assert len(evaluated) < 100, "the evaluation went on after the signal"
            if len(evaluated) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        return forward(model, *args, **kwargs)

    monkeypatch.setattr(gpt.GPT, "forward", signalled_in_the_evaluation)
    # A billion batches would take days: the message below says the evaluation was cut short, not finished.
    with pytest.raises(SystemExit) as exit_info:
        train.main([*tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=3, eval_iters=10 ** 9),
                    "--log_interval", "1"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 143 and len(evaluated) == 1, out
    assert "SIGTERM: the evaluation was cut short; saved iteration 3 to" in out, out
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 3


def test_ctrl_c_while_torch_is_still_importing_ends_quietly(tmp_path):
    (tmp_path / "numpy.py").write_text("raise KeyboardInterrupt\n")  # the import a Ctrl-C lands in
    for script in ("train.py", "sample.py"):
        done = run_cli(script, env={"PYTHONPATH": str(tmp_path)})
        assert done.returncode == 130 and done.stderr == "", (script, done.stderr)


# ---------------------------------------------------------------------------------------------------- faults
def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path)
    train.run(tc, TEXT, quiet)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(gpt, "train_step", lambda *args: torch.tensor(float("nan")))
    with pytest.raises(ValueError, match=r"nan at iteration 9: training diverged\. Too high a --learning_rate"):
        # resumed at 8, eval_interval 1: caught before the save that would follow iteration 9
        train.run(tc, TEXT, quiet, resume=True, log_interval=50, given=dict(max_iters=20, eval_interval=1))
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == before


def test_the_nan_stop_names_what_can_cause_it(tmp_path, capsys):
    message = one_line_error(capsys, train, *tiny_flags(tmp_path), "--weight_decay", "1e9")
    said = r"training diverged\. Too high a --learning_rate 0\.003, --muon_lr 0\.01 or --weight_decay 1e\+09, too " \
           r"short a --warmup_iters 2, --grad_clip 1 \(0: off\), or starting weights too large \(a checkpoint's, " \
           r"GPT-2's\) can cause it; the last checkpoint in .*out is left as it was$"
    assert re.search(said, message), message


def test_a_resumed_checkpoint_whose_weights_overflow_names_the_starting_weights(tmp_path, capsys):
    train.main(tiny_flags(tmp_path, max_iters=2))
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    for name, weight in ckpt["model"].items():
        if "c_fc" in name:
            weight.fill_(3e38)  # finite, but no float32 product of them is
    torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert "training diverged" in message and "or starting weights too large (a checkpoint's" in message, message


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, where every write finds the disk full")
def test_a_full_disk_is_one_line_and_leaves_the_last_checkpoint(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=1)
    train.main(flags)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    os.symlink("/dev/full", tmp_path / "out" / "ckpt.pt.tmp")  # the next save writes there
    message = one_line_error(capsys, train, *flags, "--resume", "--max_iters", "3")
    assert re.search(r"cannot write .*ckpt.pt \(No space left on device\); any file there is as it was", message), \
        message
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == before


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs a file-size limit (ulimit -f)")
def test_a_save_past_a_file_size_limit_is_one_line_and_leaves_the_last_checkpoint(tmp_path):
    import resource
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=1)
    train.main(flags)
    path = tmp_path / "out" / "ckpt.pt"
    before = path.read_bytes()
    limit = len(before) // 2  # ulimit -f: the next save stops halfway; SIGXFSZ must not kill the run

    # Python ignores SIGXFSZ, which would kill the process: the write fails with EFBIG, inside torch's writer.
    done = run_cli("train.py", *flags, "--resume", "--max_iters", "3",
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert re.fullmatch(r"error: cannot write .*ckpt\.pt \(File too large\); any file there is as it was\n",
                        done.stderr), done.stderr
    assert path.read_bytes() == before and not (tmp_path / "out" / "ckpt.pt.tmp").exists()


def test_a_save_that_fails_inside_torchs_writer_is_one_line_with_its_cause(tmp_path, capsys, monkeypatch):
    # torch.save raises a RuntimeError ("[enforce fail at inline_container.cc]") whose context is the OSError.
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=2)
    real_save, saves = torch.save, []

    def fails_the_second_time(obj, f, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            try:
                raise OSError(errno.EFBIG, "File too large")
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fails_the_second_time)
    message = one_line_error(capsys, train, *flags)
    assert re.search(r"cannot write .*ckpt.pt \(File too large\); any file there is as it was$", message), message
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 0


def test_a_save_that_fails_after_a_signal_is_one_line(tmp_path, capsys, monkeypatch):
    flags = tiny_flags(tmp_path)
    real_save = gpt.Trainer.save
    put_back = signal_at(monkeypatch, 6)  # during the evaluation after step 4: cut short, then saved

    def full_after_the_start(self):
        if self.it:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(self)

    monkeypatch.setattr(gpt.Trainer, "save", full_after_the_start)
    message = one_line_error(capsys, train, *flags)
    put_back()
    assert re.search(r"cannot write .*ckpt.pt \(No space left on device\); any file there is as it was$", message)
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 0


def test_a_failed_save_is_one_line_and_leaves_the_last_checkpoint_and_no_temporary_file(tmp_path, capsys,
                                                                                         monkeypatch):
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=2)
    real_fsync = os.fsync
    calls = []

    def fails_the_second_time(fd):  # the first save, of the starting weights, lands; the one at step 2 does not
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fails_the_second_time)
    message = one_line_error(capsys, train, *flags)
    assert re.search(r"cannot write .*ckpt.pt \(Input/output error\); any file there is as it was", message), message
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt", "train.lock"]  # the half-written ckpt.pt.tmp is gone
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 0


def test_a_failed_torch_compile_is_one_line(tmp_path):
    env = dict(CXX="/no/compiler", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))  # nothing compiled is reused
    done = run_cli("train.py", *tiny_flags(tmp_path, max_iters=2), "--compile", env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert re.fullmatch(r"error: torch\.compile failed \(.+\): train without --compile\n", done.stderr), done.stderr
    assert done.stdout.startswith("torch.compile: the first steps wait on it"), done.stdout  # said before they do


def test_output_going_away_neither_stops_nor_loses_training(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=30, eval_interval=15)
    proc = subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stdout.readline(), proc.stdout.readline()
    proc.stdout.close()  # python train.py | head -2
    with proc.stderr:
        assert proc.wait(timeout=HANG) == 0 and proc.stderr.read() == b""
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 30


@pytest.mark.parametrize("name", ["train.lock", "ckpt.pt.tmp", "report.html", "ckpt.pt"])
def test_data_that_is_a_file_the_run_writes_in_its_out_dir_is_refused_and_kept(tmp_path, capsys, name):
    os.makedirs(tmp_path / "out")
    text = tmp_path / "out" / name
    text.write_text(TEXT, encoding="utf-8")
    os.symlink(text, tmp_path / "data.txt")  # another name of it
    message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    assert re.search(rf"--data .*data\.txt is .*out/{re.escape(name)}, a file this run writes: keep the data outside "
                     rf"--out_dir", message), message
    assert text.read_text(encoding="utf-8") == TEXT


def test_one_run_at_a_time_trains_in_an_out_dir(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=4)
    os.makedirs(tmp_path / "out")
    held = checkpoint.own_out_dir(str(tmp_path / "out"))  # a run training there, in this process
    try:
        done = run_cli("train.py", *flags)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert re.search(rf"out is in use by a training run \(process {os.getpid()} on .+\): wait for it", done.stderr)
        assert not (tmp_path / "out" / "ckpt.pt").exists()
    finally:
        held.close()
    # The lock of a run that crashed is released with it: its file left behind blocks nothing.
    (tmp_path / "out" / "train.lock").write_text("process 1 on a machine that crashed\n")
    train.main(flags)
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 4


NUMBERS = [f.name for f in fields(gpt.TrainConfig) if type(f.default) in (int, float) and f.name != "vocab_size"]


@pytest.mark.parametrize("flags, match", [
    *[([f"--{name}", value], name) for name in NUMBERS for value in ("nan", "inf", "-1e30")],
    (["--seed", str(2 ** 63)], "seed must be in [0, 4294967295], not 9223372036854775808"),
    (["--max_iters", "1e3"], "argument --max_iters: invalid int value"),
    (["--log_interval", "0"], "argument --log_interval: must be at least 1"),
    (["--learning_rate", "1e-4"], "min_lr 0.0003 is above learning_rate 0.0001, so the rate would rise: lower min_lr"),
    (["--nonsense", "1"], "unrecognized arguments: --nonsense"),
    (["--resume", "--init_from", "gpt2"], "give one of them"),
    (["--data", "MISSING"], "cannot read the data file"),
    (["--data", "FOLDER"], "(it is a folder): pass --data a file"),
    (["--data", "/dev/zero"], "(it is not a regular file)"),  # which read() would never finish
    (["--data", "BINARY"], "it is not UTF-8 text"),
    (["--data", "EMPTY"], "is empty"),
    (["--data", ""], "argument --data: is empty: give a file"),
    (["--data", "ODD.bin"], "not a whole number of uint16 ids"),
    (["--data", "IDS.bin", "--vocab_size", "10"], "must be in [0, 10), the vocabulary; these go from 0 to 3,999"),
    (["--block_size", "5000"], "--block_size 5000 is too long for the 3000 tokens held out"),
    (["--block_size", str(2 ** 20)], "--block_size 1048576 is too long"),  # refused before the model is built
    (["--n_embd", "30", "--n_head", "4"], "n_embd must be a multiple of n_head, twice that for rope: 8 here"),
    (["--norm", "batchnorm"], "argument --norm: norm must be one of rmsnorm, layernorm, not 'batchnorm'"),
    (["--optimizer", "sgd"], "argument --optimizer: optimizer must be one of muon, adamw, not 'sgd'"),
    (["--device", "tpu"], "unknown or not on this machine"),
    (["--optimizer", "adamw", "--muon_lr", "0.02", "--muon_momentum", "0.9"],
     "--muon_lr, --muon_momentum set Muon's steps, and this run trains with --optimizer adamw alone: leave them out"),
    (["--tie_weights", "--embedding_lr", "0.01"], "--embedding_lr is the rate of an embedding of its own, and this "
                                                  "model ties its embedding to the output layer (tie_weights)"),
    (["--device", "cuda:7"], "unknown or not on this machine"),
    (["--device", "meta"], "unknown or not on this machine"),
    (["--n_embd", str(2 ** 16), "--n_head", "1", "--bigram", str(2 ** 24)], "out of memory (["),  # 4 TB of table
    (["--out_dir", "DATA/out"], "pass --out_dir a writable folder"),  # a folder inside a file
    (["--out_dir", "DATA"], "data.txt is there, and not a folder): pass --out_dir a writable folder"),
    (["--out_dir", "FOLDER"], "pass --out_dir a writable folder"),  # FOLDER/ckpt.pt is a folder
    (["--out_dir", "/sys/nope"], "cannot write /sys/nope/ckpt.pt ("),  # a read-only file system: its real cause
    (["--out_dir", "/sys/kernel"], "cannot write /sys/kernel/train.lock ("),  # a folder this process cannot write in
    (["--out_dir", "LOOP"], "LOOP is a loop of symbolic links): pass --out_dir a writable folder"),
    (["--out_dir", "NOWHERE"], "NOWHERE is a link to "),
    (["--out_dir", "FOLDER" + "/d" * 1100], "folders to make than Python's os.makedirs goes down): make them first"),
    (["--max_time", "3"], "--max_time trains for seconds, --max_iters for steps: give one of them"),  # beside 2
    (["--max_time", "1e9"], "give one of them"),
    (["--resume", "--out_dir", ""], '--out_dir "" names none: give the --out_dir it was trained with'),
    (["--resume", "--out_dir", "TIMED"], "is a run timed by --max_time 60, which --max_iters does not change: give "
                                         "a longer --max_time, or --max_time 0 --max_iters 2 to train by steps"),
    (["--resume", "--out_dir", "FOLDER/x/y"], "no checkpoint file at"),  # and no folder made (below)
    (["--resume", "--out_dir", "NO_STATE"], "it can sample, but not resume; train without --resume"),
    (["--resume", "--data", "NEW_CHARS"], "has characters the checkpoint never saw ('#'): use the text it was trained"),
    (["--init_from", "FOLDER"], "holds no GPT-2 this can load (ValueError: cannot read GPT-2's config"),
    ([], "holds an earlier run, which this one would overwrite: continue it with --resume, or start anew"),
])
def test_bad_training_input_is_one_line_and_overwrites_nothing(tmp_path, capsys, trained_dir, flags, match):
    if "/sys/nope" in flags and not os.path.isdir("/sys/kernel"):
        pytest.skip("needs /sys, where nothing can be made")
    before = {p: Path(trained_dir, p).read_bytes() for p in os.listdir(trained_dir)}
    (tmp_path / "EMPTY").write_text("")
    (tmp_path / "BINARY").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "ODD.bin").write_bytes(b"\x00" * 4001)
    np.arange(4000, dtype=np.uint16).tofile(tmp_path / "IDS.bin")
    os.makedirs(tmp_path / "FOLDER" / "ckpt.pt")
    os.symlink(tmp_path / "LOOP", tmp_path / "LOOP")
    os.symlink(tmp_path / "gone", tmp_path / "NOWHERE")
    hand_made(trained_dir, tmp_path / "TIMED", set_in(["train_config", "max_time"], 60.0))
    hand_made(trained_dir, tmp_path / "NO_STATE", lambda ckpt: [ckpt.pop(k) for k in ("optimizers", "rng")])
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    (tmp_path / "NEW_CHARS").write_text(TEXT + "#", encoding="utf-8")
    names = dict(MISSING=tmp_path / "missing.txt", FOLDER=tmp_path / "FOLDER", BINARY=tmp_path / "BINARY",
                 EMPTY=tmp_path / "EMPTY", DATA=data, NO_STATE=tmp_path / "NO_STATE", NEW_CHARS=tmp_path / "NEW_CHARS",
                 ODD=tmp_path / "ODD", IDS=tmp_path / "IDS", LOOP=tmp_path / "LOOP", NOWHERE=tmp_path / "NOWHERE",
                 TIMED=tmp_path / "TIMED")
    flags = [re.sub("|".join(names), lambda m: str(names[m.group(0)]), f) for f in flags]
    message = one_line_error(capsys, train, "--data", str(data), "--out_dir", trained_dir, "--max_iters", "2",
                             "--block_size", "16", *flags)
    assert match in message, message
    assert {p: Path(trained_dir, p).read_bytes() for p in os.listdir(trained_dir)} == before
    assert not (tmp_path / "FOLDER" / "ckpt.pt.tmp").exists()
    assert not (tmp_path / "FOLDER" / "x").exists()  # a mistyped folder to resume in is not made


@pytest.mark.parametrize("where", ["in the step before an evaluation", "in the step an evaluation follows",
                                   "during the evaluation"])
def test_resume_is_exact_wherever_the_signal_lands(tmp_path, monkeypatch, where):
    # Bit for bit within one machine and one process, as docs/reference.md promises.
    tc = tiny_train_config(tmp_path, dropout=0.1)  # eval_interval 4: steps 1-4, an evaluation's two splits, ...
    straight, _ = train.run(replace(tc, out_dir=str(tmp_path / "straight")), TEXT, quiet)
    # The event the signal comes in: in step 3, in step 4, or in the evaluation after step 4 (its val split).
    at = {"in the step before an evaluation": 3, "in the step an evaluation follows": 4,
          "during the evaluation": 6}[where]
    put_back = signal_at(monkeypatch, at)
    first, stopped = train.run(tc, TEXT, quiet)
    assert stopped == signal.SIGTERM and first.it == min(at, 4)
    put_back()
    second, stopped = train.run(tc, TEXT, quiet, resume=True)
    unclocked = lambda history: [{k: v for k, v in h.items() if k != "seconds"} for h in history]
    assert stopped is None and [h["iter"] for h in second.history] == [4, 8]
    assert unclocked(second.history) == unclocked(straight.history)
    for (name, p), q in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("where", ["in the last step", "during the last evaluation"])
def test_a_run_stopped_in_its_last_step_or_evaluation_ends_on_resume_as_it_would_have(tmp_path, monkeypatch, capsys,
                                                                                        where):
    flags = tiny_flags(tmp_path)  # max_iters 8, eval_interval 4: 4 steps, an evaluation's two splits, 4 steps, ...
    at = {"in the last step": 10, "during the last evaluation": 12}[where]  # the event, as signal_at counts them
    put_back = signal_at(monkeypatch, at)
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    assert exit_info.value.code == 143
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 8
    assert not (tmp_path / "out" / "report.html").exists()
    put_back()
    capsys.readouterr()
    train.main([*flags, "--resume"])
    out = capsys.readouterr().out
    assert "nothing to train" not in out, out
    # The evaluation, what context buys, the sample and the report, as a run that was never stopped ends.
    assert re.search(r"iter 8: train loss [\d.]+, val loss [\d.]+\nsaved iteration 8 to .*\nval loss [\d.]+ on the "
                     r"whole held-out split .*\nwhat context buys: .*\nreport: .*report\.html", out, re.S), out
    assert [h["iter"] for h in torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["history"]] == [4, 8]
    assert (tmp_path / "out" / "report.html").exists()
    capsys.readouterr()
    train.main([*flags, "--resume"])  # ended now: nothing more to train
    assert "nothing to train: " in capsys.readouterr().out


def test_a_finished_run_says_which_bound_to_raise(tmp_path, capsys, trained_dir):
    def timed_out(ckpt):  # a run timed by --max_time 1, its clock past it
        ckpt["train_config"]["max_time"] = 1.0
        ckpt["elapsed"] = 2.0
    hand_made(trained_dir, tmp_path / "timed", timed_out)
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    train.main(["--resume", "--out_dir", str(tmp_path / "timed"), "--data", str(tmp_path / "data.txt")])
    out = capsys.readouterr().out
    assert re.search(r"nothing to train: .*timed/ckpt\.pt is at iteration 2; raise --max_time to go on\n", out), out
    hand_made(trained_dir, tmp_path / "steps", lambda ckpt: None)  # a run by steps, at its --max_iters
    train.main(["--resume", "--out_dir", str(tmp_path / "steps"), "--data", str(tmp_path / "data.txt")])
    out = capsys.readouterr().out
    assert re.search(r"nothing to train: .*steps/ckpt\.pt is at iteration 2; raise --max_iters or --max_time to go "
                     r"on\n", out), out


def test_a_device_named_with_its_index_trains_resumes_and_samples(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=2, device="cpu:0")
    train.main(flags)
    train.main([*flags, "--resume", "--max_iters", "4"])
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 4
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--device", "cpu:0", "--start", "ROMEO", "--max_new_tokens", "5"])
    assert capsys.readouterr().out.startswith("ROMEO")
    model, _, _ = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu:0")
    assert next(model.parameters()).device.type == "cpu"


def test_a_stop_is_bounded_it_saves_the_step_and_leaves_the_report_to_sample_py(tmp_path, monkeypatch, capsys):
    # A long evaluation (eval_iters 10**6) would take hours: after the signal none runs, and no report is made.
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=10 ** 5, eval_iters=10 ** 6)
    signal_after_line(monkeypatch, signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        train.main([*flags, "--log_interval", "1"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 143 and err == "", err
    # Stopped before its first evaluation: sample.py --report has no evaluation to draw, so it is not offered.
    assert re.search(r"SIGTERM: saved iteration \d+ to .*; continue with --resume; no report\n", out), out
    assert "val loss" not in out and not (tmp_path / "out" / "report.html").exists()
    message = one_line_error(capsys, sample, "--report", "--data", str(tmp_path / "data.txt"), "--out_dir",
                             str(tmp_path / "out"))
    assert "holds no evaluation yet: its run evaluates every eval_interval steps; go on with python train.py --resume" \
        in message, message
    # The command it offers trains the run on, here to an end near at hand, with a short evaluation, and its report.
    train.main([*shlex.split(message.split("python train.py ")[1]), "--max_iters", "6", "--eval_iters", "2"])
    assert "val loss" in capsys.readouterr().out and (tmp_path / "out" / "report.html").exists()


def test_a_run_stopped_after_an_evaluation_offers_the_report_that_sample_py_then_writes(tmp_path, monkeypatch, capsys):
    flags = tiny_flags(tmp_path)  # max_iters 8, eval_interval 4
    put_back = signal_at(monkeypatch, 8)  # in step 6, after iteration 4's evaluation
    out_dir = tmp_path / "its out"  # a folder sample.py does not default to, and a name the shell splits
    with pytest.raises(SystemExit):
        train.main([*flags, "--out_dir", str(out_dir)])
    out = capsys.readouterr().out
    said = re.search(r"SIGTERM: saved iteration 6 to .*; continue with --resume; no report: (python sample.py "
                     r"--report .* --data DATA) writes it\n", out)
    assert said, out
    # The command as offered, in the shell's words, with the text it trained on.
    command = [str(tmp_path / "data.txt") if word == "DATA" else word for word in shlex.split(said.group(1))]
    sample.main(command[2:])
    assert (out_dir / "report.html").exists()
    # With no --out_dir there is no checkpoint to write it from: not offered either.
    put_back()
    signal_at(monkeypatch, 8)
    with pytest.raises(SystemExit):
        train.main([*flags, "--out_dir", ""])
    assert re.search(r"SIGTERM: no --out_dir, so nothing is saved; no report\n", capsys.readouterr().out)


def test_a_second_signal_exits_at_once_with_its_own_status_and_leaves_the_checkpoint(tmp_path, monkeypatch, capsys):
    flags = tiny_flags(tmp_path, max_iters=6)
    real_step, steps = gpt.train_step, []

    def two_signals_in_step_five(*args):
        steps.append(1)
        if len(steps) == 5:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)  # raises at once, out of the step under way
        return real_step(*args)

    monkeypatch.setattr(gpt, "train_step", two_signals_in_step_five)
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    assert exit_info.value.code == 143
    assert re.search("SIGTERM, a second signal: stopped at once; the last checkpoint in .* is as it was",
                     capsys.readouterr().out)
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 4  # the evaluation's save


@pytest.mark.parametrize("where", ["in the stop's save", "in the save of an evaluation cut short"])
def test_a_second_signal_inside_torch_save_is_a_second_signal_not_a_traceback(tmp_path, monkeypatch, capsys, where):
    # Raised in the file's write, called from torch.save's C++ code, the second signal's Stopped can come out of it
    # as the RuntimeError of its writer, cut short; torch.save writes the checkpoint's .tmp, so the last checkpoint
    # is as it was.
    real_save = torch.save

    class SignalOnWrite:
        def __init__(self, f):
            self.f = f
            self.writes = 0

        def write(self, b):
            self.writes += 1
            if self.writes == 3:  # past the header's writes, as a signal mid-save comes
                signal.raise_signal(signal.SIGINT)
            return self.f.write(b)

    def save(obj, f, *args, **kwargs):
        later = obj["iter"] > 0
        return real_save(obj, SignalOnWrite(f) if later else f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    if where == "in the stop's save":
        flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=10 ** 5)
        signal_after_line(monkeypatch, signal.SIGINT)
        flags.append("--log_interval=1")
    else:
        flags = tiny_flags(tmp_path)  # max_iters 8, eval_interval 4: the first signal in iteration 4's evaluation
        signal_at(monkeypatch, 5)
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 130 and err == "", err
    assert re.search("SIGINT, a second signal: stopped at once; the last checkpoint in .* is as it was\n$", out), out
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 0


def test_a_signal_while_the_end_is_said_exits_with_its_status_not_a_traceback(tmp_path, monkeypatch, capsys):
    real_printer = report.printer

    def printer(*args):
        real_printer(*args)
        if str(args[0]).startswith("saved iteration"):  # the run is saved; its last lines are being said
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(report, "printer", printer)
    with pytest.raises(SystemExit) as exit_info:
        train.main(tiny_flags(tmp_path))
    assert exit_info.value.code == 143 and capsys.readouterr().err == ""
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 8


def test_a_seed_given_on_resume_is_named_as_ignored_and_the_checkpoint_records_the_seed_that_ran(tmp_path):
    tc = tiny_train_config(tmp_path, max_iters=4, seed=7)
    train.run(tc, TEXT, quiet)
    said = []
    trainer, _ = train.run(replace(tc, max_iters=8, seed=99), TEXT, said.append, resume=True,
                           given=dict(max_iters=8, seed=99))
    assert "--resume goes on with the run's random streams, so these are ignored: --seed 99" in said
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert trainer.tc.seed == 7 and ckpt["train_config"]["seed"] == 7 and ckpt["iter"] == 8


def test_a_model_too_large_for_any_memory_is_one_line(tmp_path, capsys):
    ids = tmp_path / "ids.bin"
    np.arange(100, dtype=np.uint16).repeat(50).tofile(ids)
    message = one_line_error(capsys, train, "--data", str(ids), "--out_dir", str(tmp_path / "out"),
                             "--vocab_size", str(2 ** 20), "--n_embd", str(2 ** 16), "--n_head", "1")  # 256 GB
    assert message.startswith("error: out of memory"), message


@pytest.mark.parametrize("name", ["train.lock", "ckpt.pt.tmp", "report.html"])
def test_a_folder_where_the_run_writes_a_file_is_refused_before_training(tmp_path, capsys, name):
    (tmp_path / "out" / name).mkdir(parents=True)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    written = "report.html" if name == "report.html" else "ckpt.pt"
    assert f"cannot write {tmp_path / 'out' / written} ({tmp_path / 'out' / name} is a folder): remove it, or pass " \
           f"--out_dir a writable folder" in message, message
    assert not (tmp_path / "out" / "ckpt.pt").exists() and "iter 1" not in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["a pipe", "a link to nothing", "a link to a file", "another name of a file"])
def test_a_lock_that_is_not_a_file_of_its_own_is_refused_before_training(tmp_path, capsys, kind):
    lock = tmp_path / "out" / "train.lock"
    lock.parent.mkdir()
    elsewhere = tmp_path / "another run's ckpt.pt"
    elsewhere.write_bytes(b"weights")
    if kind == "a pipe":
        os.mkfifo(lock)
    elif kind == "a link to nothing":
        lock.symlink_to(tmp_path / "nowhere")
    elif kind == "a link to a file":
        lock.symlink_to(elsewhere)  # the lock, cut back to its holder's line, would cut the file it names
    else:
        os.link(elsewhere, lock)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    if "file" in kind:
        assert (f"({lock} is a link to a file elsewhere, or another name of one, as a copy made by cp -al holds): "
                f"remove it, a run makes it anew") in message, message
    else:
        assert f"({lock} is there, and not a file): remove it, or pass --out_dir a writable folder" in message
    assert not (tmp_path / "out" / "ckpt.pt").exists() and elsewhere.read_bytes() == b"weights"


OVER = "a link to a file elsewhere, which a save would write over"


@pytest.mark.parametrize("kind, what", [("a pipe", "a pipe or a socket"), ("a socket", "a pipe or a socket"),
                                        ("a link to nothing", "a link to nothing, or a loop of links"),
                                        ("a loop of links", "a link to nothing, or a loop of links"),
                                        ("a link to a file", OVER), ("another name of a file", OVER)])
def test_what_a_save_cannot_write_through_is_refused_before_training(tmp_path, capsys, monkeypatch, kind, what):
    tmp = tmp_path / "out" / "ckpt.pt.tmp"
    tmp.parent.mkdir()
    if kind == "a pipe":
        os.mkfifo(tmp)
    elif kind == "a socket":
        monkeypatch.chdir(tmp.parent)  # a socket's path has room for about 100 bytes
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(tmp.name)
    elif kind == "a link to a file":
        tmp.symlink_to(tmp_path / "another run's ckpt.pt")  # the first save would write over it
        (tmp_path / "another run's ckpt.pt").write_bytes(b"weights")
    elif kind == "another name of a file":
        (tmp_path / "another run's ckpt.pt").write_bytes(b"weights")
        os.link(tmp_path / "another run's ckpt.pt", tmp)
    else:
        tmp.symlink_to(tmp_path / "no" / "folder" if kind == "a link to nothing" else tmp)
    # Unchecked, the first save would wait on the pipe for a reader: one comes after a minute, so that
    # the test fails instead of hanging.
    reader = threading.Timer(60, lambda: Path(tmp).read_bytes())
    reader.daemon = True
    reader.start()
    try:
        message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    finally:
        reader.cancel()
    assert f"({tmp} is {what}): remove it, or pass --out_dir a writable folder" in message
    assert not (tmp_path / "out" / "ckpt.pt").exists() and "iter 1" not in capsys.readouterr().out
    if "file" in kind:
        assert (tmp_path / "another run's ckpt.pt").read_bytes() == b"weights"


@pytest.mark.parametrize("name, shown", [("a\nb", "a\\nb"), ("a\rb\x1b[31mc", "a\\rb\\x1b[31mc")])
def test_a_path_with_a_control_character_keeps_the_reason_and_the_advice(tmp_path, capsys, name, shown):
    # A carriage return would write the line over its own start, a terminal's escape turn it red.
    folder = tmp_path / name
    folder.mkdir()
    message = one_line_error(capsys, train, "--data", str(folder), "--out_dir", str(tmp_path / "out"))
    assert message.endswith("(it is a folder): pass --data a file") and shown in message, message
    assert not any(unicodedata.category(c) == "Cc" for c in message), message


def test_a_run_that_ends_its_process_ignores_a_further_ctrl_c_as_python_shuts_down(tmp_path, monkeypatch):
    """A second Ctrl-C just after a stop landed in torch's exit hooks as a traceback: at the interpreter's exit,
    before them, Ctrl-C is ignored; a caller that goes on (here, the tests) keeps its handler."""
    at_exit = []
    monkeypatch.setattr(atexit, "register", lambda *call: at_exit.append(call))
    before = signal.getsignal(signal.SIGINT)
    signal_at(monkeypatch, 3)
    with pytest.raises(SystemExit) as exit_info:
        train.main(tiny_flags(tmp_path))
    assert exit_info.value.code == 143 and signal.getsignal(signal.SIGINT) is before
    assert at_exit == [(signal.signal, signal.SIGINT, signal.SIG_IGN)], at_exit


def test_a_stop_in_the_last_save_offers_no_resume_and_a_second_signal_in_the_first_save_says_nothing_is_saved(
        tmp_path, monkeypatch, capsys):
    """A run whose last evaluation is saved is done: nothing to resume. A second signal that cuts a run's first save
    short leaves no checkpoint, which its line says, not that the last one is as it was."""
    real = gpt.Trainer.save

    def signalled_save(self, at, times):
        if self.it == at:
            for _ in range(times):
                signal.raise_signal(signal.SIGTERM)
        real(self)

    monkeypatch.setattr(gpt.Trainer, "save", lambda self: signalled_save(self, 8, 1))  # the last save, once
    with pytest.raises(SystemExit) as exit_info:
        train.main(tiny_flags(tmp_path))  # max_iters 8
    out = capsys.readouterr().out
    assert exit_info.value.code == 143 and re.search(r"\nSIGTERM: saved iteration 8 to .*ckpt.pt; no report: python "
                                                     r"sample.py --report", out), out
    assert "--resume" not in out and torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 8
    monkeypatch.setattr(gpt.Trainer, "save", lambda self: signalled_save(self, 0, 2))  # the first save, twice
    with pytest.raises(SystemExit) as exit_info:
        train.main([*tiny_flags(tmp_path), "--out_dir", str(tmp_path / "first")])
    out = capsys.readouterr().out
    assert exit_info.value.code == 143 and out.endswith("SIGTERM, a second signal: stopped at once; nothing is saved "
                                                        "yet\n"), out
    assert not (tmp_path / "first" / "ckpt.pt").exists()
