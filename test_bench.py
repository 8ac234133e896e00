"""Tests of bench.py."""
import errno
import importlib.abc
import json
import math
import os
import re
import signal
import subprocess
import sys
import types
import unittest.mock
import warnings
from pathlib import Path

import pytest
import torch

import bench
import data
import gpt
import train
from conftest import (HERE, HANG, SWITCHES, TEXT, TINY, interrupted, one_line_error, run_cli, tiny_model,
                      assert_greedy)


@pytest.mark.parametrize("flags, match", [
    (["--quality", "1", "--json", "FOLDER"], "cannot write"),  # before the run, not after it has measured for minutes
    # A file of the user's, which the figures would write over: a text, or JSON that is no figures of bench.py's.
    (["--quality", "1", "--json", "TEXT"], "holds something other than figures bench.py wrote, which --json would "
                                           "write over: pass --json a new file"),
    (["--quality", "1", "--json", "CONFIG"], "holds something other than figures bench.py wrote"),
    (["--quality", "1", "--json", "NESTED"], "holds something other than figures bench.py wrote"),  # [[[... too deep
    (["--candidates", "1", "--data", ""], "cannot read the data file"),  # "" is no file, not input.txt
    (["--nanogpt", "FOLDER"], "no model.py in"),
    (["--nanogpt", "EXITS"], "cannot import GPT and GPTConfig from"),
    (["--device", "meta"], "device 'meta' is unknown or not on this machine"),  # tensors without values
    (["--device", "cuda:99"], "device 'cuda:99' is unknown or not on this machine"),
])
def test_bad_bench_input_is_one_line_before_anything_is_measured(tmp_path, capsys, flags, match):
    os.makedirs(tmp_path / "FOLDER")
    os.makedirs(tmp_path / "EXITS")
    (tmp_path / "EXITS" / "model.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "TEXT").write_text(TEXT, encoding="utf-8")
    (tmp_path / "CONFIG").write_text('{"model_type": "gpt2"}', encoding="utf-8")
    (tmp_path / "NESTED").write_text("[" * 100_000, encoding="utf-8")
    message = one_line_error(capsys, bench, *[str(tmp_path / f) if f.isupper() else f for f in flags])
    assert message.startswith("error: ") and match in message, message  # sys.exit("error: ..."): status 1
    assert (tmp_path / "TEXT").read_text(encoding="utf-8") == TEXT
    said = capsys.readouterr()
    assert said.err == "" and "val loss" not in said.out


def test_a_pipe_as_json_is_refused_before_it_can_block(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")

    def stuck(signum, frame):
        raise TimeoutError("bench.py waited 30 s for a reader of the pipe")

    before = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(30)
    try:
        message = one_line_error(capsys, bench, "--quality", "1", "--json", str(tmp_path / "fifo"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert "(it is no regular file: a folder, a pipe, a device or a broken link): pass --json a file" in message


def test_an_empty_json_file_is_written_and_empty_paths_are_refused_by_name(tmp_path, capsys):
    # A file of no bytes holds nothing to lose: made by touch, or left by a run killed before it wrote its figures.
    (tmp_path / "empty.json").write_text("")
    bench.check_json(str(tmp_path / "empty.json"))
    message = one_line_error(capsys, bench, "--quality", "1", "--json", "")
    assert message.endswith("error: argument --json: is empty: give a file (see --help)"), message
    message = one_line_error(capsys, bench, "--nanogpt", "")  # not "no model.py in :"
    assert message.endswith("error: argument --nanogpt: is empty: give the folder of nanoGPT's model.py (see --help)")


def test_a_run_that_fails_leaves_no_json_of_its_own_making(tmp_path, capsys):
    message = one_line_error(capsys, bench, "--nanogpt", str(tmp_path / "missing"), "--json", str(tmp_path / "b.json"))
    assert "missing" in message and not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("link", [False, True])
def test_figures_that_cannot_be_written_whole_leave_those_of_the_run_before(tmp_path, capsys, monkeypatch, link):
    before = '{"date": "2026-12-04", "torch": "2.13.0", "figures": "of the run before"}'
    (tmp_path / "bench.json").write_text(before)
    path = tmp_path / "bench.json"
    if link:  # the figures go to the file a link points to, and the link stays one
        os.symlink(path, tmp_path / "link.json")
        path = tmp_path / "link.json"
    monkeypatch.setattr(bench, "speed_mode", lambda args, device, figures: figures.update(speed="measured"))

    def full_disk(written, path):  # the figures written beside, then the disk fails them
        assert json.loads(open(written).read())["speed"] == "measured"
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full_disk)
    message = one_line_error(capsys, bench, "--json", str(path))
    assert message == (f"error: cannot write --json {path} (No space left on device); any figures there are as "
                       f"they were"), message
    assert (tmp_path / "bench.json").read_text() == before and sorted(os.listdir(tmp_path)) == sorted(
        ["bench.json"] + (["link.json"] if link else []))
    monkeypatch.undo()
    monkeypatch.setattr(bench, "speed_mode", lambda args, device, figures: figures.update(speed="measured"))
    bench.main(["--json", str(path)])
    assert json.loads((tmp_path / "bench.json").read_text())["speed"] == "measured" and path.is_symlink() == link


def test_a_json_that_cannot_be_written_beside_is_refused_before_measuring_and_none_is_left(tmp_path, capsys,
                                                                                          monkeypatch):
    measured = []
    monkeypatch.setattr(bench, "speed_mode", lambda args, device, figures: measured.append(1))
    path = tmp_path / "bench.json"
    beside = tmp_path / f"bench.json.{os.getpid()}.tmp"
    beside.mkdir()  # where the figures would be written first: as a folder in which this user may not write would
    message = one_line_error(capsys, bench, "--json", str(path))
    assert message.startswith(f"error: cannot write {path} (Is a directory): pass --json a file") and not measured
    beside.rmdir()
    assert os.listdir(tmp_path) == []
    # An error that is not the disk's, or a Ctrl-C, while the figures are written leaves no file beside.
    monkeypatch.setattr(os, "replace", lambda written, path: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bench.main(["--json", str(path)])
    assert os.listdir(tmp_path) == [] and measured == [1]


def test_bench_with_another_projects_model_py_is_one_line(tmp_path, capsys):
    (tmp_path / "model.py").write_text("class GPTConfig:\n    pass\n\nclass GPT:\n    def __init__(self, config):\n"
                                       "        raise TypeError('this GPT takes no config')\n")
    message = one_line_error(capsys, bench, "--nanogpt", str(tmp_path))
    assert message.startswith(f"error: the GPT of {tmp_path}/model.py does not run as nanoGPT's does (TypeError: ")
    assert capsys.readouterr().err == ""
    os.remove(tmp_path / "model.py")
    os.mkfifo(tmp_path / "model.py")
    message = one_line_error(capsys, bench, "--nanogpt", str(tmp_path))
    assert message.startswith("error: ") and "(it is not a regular file)" in message, message


def test_bench_gpt2_without_transformers_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    message = one_line_error(capsys, bench, "--gpt2")
    assert message == "error: --gpt2 times transformers' generate, and transformers is not installed: " \
                      "pip install transformers", message
    assert capsys.readouterr().err == ""


def test_ctrl_c_ends_bench_quality_in_one_line_and_leaves_the_last_json(tmp_path):
    (tmp_path / "text").write_text(TEXT, encoding="utf-8")
    before = '{"date": "2026-12-04", "torch": "2.13.0", "figures": "of the run before"}'
    (tmp_path / "bench.json").write_text(before)
    os.makedirs(tmp_path / "tmp")
    # Signalled once the run has saved its first weights, in a temporary folder of its own: training has begun.
    status, out, err = interrupted(["bench.py", "--quality", "600", "--data", str(tmp_path / "text"),
                                    "--json", str(tmp_path / "bench.json")], "torch ",
                                   after_file=str(tmp_path / "tmp" / "*" / "ckpt.pt"),
                                   env=dict(TMPDIR=str(tmp_path / "tmp")))
    assert status == 130 and re.fullmatch(r"SIGINT: stopped after \d+ s, so no val loss\n", err), err
    assert (tmp_path / "bench.json").read_text() == before


def test_bench_measures_reading_a_text_into_ids(tmp_path):
    figures = __import__("bench").bench_encoding(megabytes=2, source=str(Path(HERE, "input.txt")))
    assert figures["characters"] > 1_900_000 and figures["dtype"] == "uint8" and figures["vocab_size"] == 83
    piece = Path(HERE, "input.txt").read_bytes()  # repeated to about 2 MB
    assert figures["characters"] == max(1, round(2e6 / len(piece))) * len(piece.decode("utf-8"))
    assert figures["mb_per_s"] == pytest.approx(figures["megabytes"] / figures["seconds"])
    assert 1 <= figures["bytes_per_char"] < 20  # the uint8 ids alone take a byte a character


class NanoGPTConfig:
    def __init__(self, **options):
        self.__dict__.update(options)


class NanoGPTThatCannotSample(torch.nn.Module):
    """nanoGPT's interface, whose generate fails as another project's model.py might."""

    def __init__(self, config):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x, y=None):
        return None, (self.w * 0).sum() + 1.0

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.SGD(self.parameters(), lr=learning_rate)

    def generate(self, idx, max_new_tokens):
        raise IndexError("index out of range in self")


def test_bench_times_steps_with_either_optimizer_and_blames_the_other_model_py_for_its_own_errors_alone(monkeypatch):
    for optimizer in ("muon", "adamw"):  # the default's step and nanoGPT's recipe's
        tc = gpt.TrainConfig(optimizer=optimizer, batch_size=2, block_size=16)
        step = bench.our_step(tc.model_config(vocab_size=65, n_layer=1, n_head=2, n_embd=32), tc, torch.device("cpu"))
        assert math.isfinite(step().item()) and step().item() < math.log(65) + 1

    def once(fns, *args, **kwargs):  # each timed call made once, timed as a second
        for fn in fns.values():
            fn()
        return dict.fromkeys(fns, 1.0)

    monkeypatch.setattr(bench, "interleaved", once)
    nano = types.SimpleNamespace(GPT=NanoGPTThatCannotSample, GPTConfig=NanoGPTConfig)
    with pytest.raises(bench.TheirFault, match="^IndexError: index out of range in self$"):
        bench.versus_nanogpt(nano, torch.device("cpu"))
    divides = types.SimpleNamespace(GPT=lambda config: 1 / 0, GPTConfig=NanoGPTConfig)  # any error of its own
    with pytest.raises(bench.TheirFault, match="^ZeroDivisionError: division by zero$"):
        bench.versus_nanogpt(divides, torch.device("cpu"))

    def full():
        raise MemoryError

    with pytest.raises(MemoryError):  # the machine's limit, not their fault
        bench.theirs_runs(full)()

    def out_of_memory():
        raise RuntimeError("out of memory")

    monkeypatch.setattr(bench, "our_step", lambda *args: out_of_memory)  # an error of this project's own side
    with pytest.raises(RuntimeError, match="out of memory"):
        bench.versus_nanogpt(nano, torch.device("cpu"))


def test_bench_times_muons_step_in_its_own_dtype_and_in_float32(monkeypatch):
    dtypes = []

    def once(fns, *args, **kwargs):  # each step taken once, timed as a second
        for fn in fns.values():
            real = gpt.newton_schulz
            monkeypatch.setattr(gpt, "newton_schulz", lambda G: dtypes.append(real(G).dtype) or real(G))
            fn()
            monkeypatch.setattr(gpt, "newton_schulz", real)
        return dict.fromkeys(fns, 1.0)

    monkeypatch.setattr(bench, "interleaved", once)
    # bfloat16 chosen on any CPU, so that the two rows are two dtypes everywhere (bench_muon patches float32 in).
    chosen = torch.bfloat16
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: chosen)
    figures = bench.bench_muon(torch.device("cpu"))
    assert figures["step_ms"] == {str(chosen)[6:]: 1000.0, "float32": 1000.0}
    # One batch for each shape of the default model: square, tall and wide.
    assert dtypes == [dtype for dtype in (chosen, torch.float32) for _ in range(3)]
    # The default model's matrices, counted from it: a block's four attention maps and three of SwiGLU's.
    layers = gpt.TrainConfig().n_layer
    assert figures["matrices"].startswith(f"{7 * layers} matrices (")


def test_bench_prints_the_speed_rows_and_muons_matrices_as_the_default_model_has_them(monkeypatch, capsys):
    def once(fns, *args, **kwargs):  # each timed call made once, timed as a millisecond
        for fn in fns.values():
            fn()
        return dict.fromkeys(fns, 1e-3)

    monkeypatch.setattr(bench, "interleaved", once)
    monkeypatch.setattr(bench, "bench_training", lambda device, peaks, bf16: [dict(
        name="default CPU", dtype="fp32", ms_per_iter=60.0, tokens_per_s=17000.0, mfu=0.5)])
    monkeypatch.setattr(bench, "bench_sampling", lambda device: dict(kv_cache=200.0, full_forward=30.0))
    monkeypatch.setattr(bench, "bench_encoding", lambda: dict(megabytes=2.0, vocab_size=83, dtype="uint8",
                                                              mb_per_s=60.0, bytes_per_char=4.0))
    bench.main([])
    out = capsys.readouterr().out
    dtype = str(gpt.matmul_dtype(torch.device("cpu")))[6:]
    assert f"\nMuon's products (gpt.matmul_dtype): {dtype}; matmul peak (1024x1024): float32 " in out, out
    matrices = 7 * gpt.TrainConfig().n_layer
    assert re.search(rf"\nMuon's step on the default model's {matrices} matrices \(.*\): {15 * matrices} products, "
                     rf"or \d+ batched: products in {dtype} 1.0 ms(, products in float32 1.0 ms)?\n", out), out
    assert "\nforward+backward, nanoGPT CPU-recipe shape, float32: PyTorch 1.0 ms, NumPy twin 1.0 ms" in out, out


def test_what_muons_step_orthogonalises_is_read_from_the_model():
    tc = gpt.TrainConfig(n_layer=2, n_embd=16, n_head=2)
    model = gpt.GPT(tc.model_config(vocab_size=13))
    optimizer = gpt.configure_optimizers(model, tc)[-1]
    # SwiGLU's width: 8/3 of 16, rounded up to 64. A batch for each of the three shapes, 3 products each of
    # 5 iterations.
    assert bench.muon_matrices(optimizer) == "14 matrices (8 of 16x16, 4 of 64x16, 2 of 16x64): 210 products, or 45 " \
                                             "batched"
    assert bench.muon_matrices(gpt.configure_optimizers(gpt.GPT(gpt.GPTConfig(n_layer=1)), tc)[-1]).startswith(
        "7 matrices")


def test_bench_compares_the_optimizers_at_equal_wall_time(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT[:6000], encoding="utf-8")
    seen = []
    rows = bench.compare(bench.OPTIMIZERS, 0.2, str(tmp_path / "t.txt"), 1, log=seen.append, n_layer=1, n_embd=16,
                         n_head=2, block_size=16)
    assert [row["setting"] for row in rows] == ["muon", "adamw"] and len(seen) == 2
    uniform = math.log(gpt.CharTokenizer(TEXT[:6000]).vocab_size)  # the loss of a guess that knows nothing
    for row in rows:
        assert row["iters"] >= 1 and row["steps_per_s"] > 0 and row["val_loss"] < uniform + 0.2, row
    assert [row["products"] for row in rows] == [str(gpt.matmul_dtype(torch.device("cpu")))[6:], "no Muon"]
    lines = bench.summary(rows)
    assert len(lines) == 2 and "minus" not in lines[0] and re.search(r"minus muon's [+-]\d\.\d{4}$", lines[1])


def test_bench_help_names_every_candidate_and_variant(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines at spaces and hyphens
    assert exit_info.value.code == 0
    for name in [*list(bench.CANDIDATES)[1:], *list(bench.VARIANTS)[1:]]:
        assert "".join(name.split()) in out, name


def test_the_harness_reads_a_bin_in_the_ids_type_given(tmp_path, monkeypatch):
    torch.randint(0, 50, (6000,), generator=torch.Generator().manual_seed(0)).to(torch.int32).numpy().tofile(
        tmp_path / "ids.bin")
    read = []
    real = data.read_data
    monkeypatch.setattr(data, "read_data", lambda file, *args: read.append(file.dtype) or real(file, *args))
    options = dict(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=2)
    rows = bench.compare({"default": bench.Setting()}, 0.0, str(tmp_path / "ids.bin"), 1, log=lambda line: None,
                         steps=2, dtype="int32", **options)
    assert read == ["int32"] and rows[0]["iters"] == 2 and rows[0]["val_loss"] < math.log(50) + 1


def test_the_harness_at_equal_steps_trains_each_setting_those_steps_from_a_seed_a_round(tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text(TEXT[:6000], encoding="utf-8")
    options = dict(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=2)
    settings = {name: bench.CANDIDATES[name] for name in ("default", "logits soft-capped at 15")}
    rows = bench.compare(settings, 0.0, str(tmp_path / "t.txt"), 2, log=lambda line: None, steps=3, **options)
    assert [(row["round"], row["iters"]) for row in rows] == [(1, 3), (1, 3), (2, 3), (2, 3)]
    # Round 1 from the default seed, round 2 from the next: the same setting parts; run again, it repeats exactly.
    again = bench.compare(settings, 0.0, str(tmp_path / "t.txt"), 1, log=lambda line: None, steps=3, **options)
    assert again[0]["val_loss"] == rows[0]["val_loss"] != rows[3]["val_loss"]
    seeded = bench.compare({"default": settings["default"]}, 0.0, str(tmp_path / "t.txt"), 1, log=lambda line: None,
                           steps=3, seed=1338, **options)
    assert seeded[0]["val_loss"] == rows[3]["val_loss"]
    # Each round's seed counts up from the first, however many rounds.
    seen = []

    def train_setting(*args, **changes):
        seen.append(changes)
        return None, dict(iters=3, steps_per_s=1.0, products="float32", val_loss=1.0)

    monkeypatch.setattr(bench, "train_setting", train_setting)
    bench.compare(settings, 0.0, str(tmp_path / "t.txt"), 4, log=lambda line: None, steps=3, seed=7, **options)
    expected = [(seed, 3, 0.0) for seed in (7, 7, 8, 8, 9, 9, 10, 10)]
    assert [(c["seed"], c["max_iters"], c["max_time"]) for c in seen] == expected


@pytest.mark.parametrize("flags, match", [
    (["--data", "TEXT", "--set", "block_size=5000"], "--block_size 5000 is too long for the 3000 tokens"),
    (["--data", "SHORT"], "--block_size 256 is too long for the 30 tokens"),
])
def test_bench_optimizers_holds_its_data_to_train_pys_checks(tmp_path, capsys, flags, match):
    (tmp_path / "short.txt").write_text(TEXT[:300], encoding="utf-8")
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    paths = {"SHORT": str(tmp_path / "short.txt"), "TEXT": str(tmp_path / "text.txt")}
    flags = [paths.get(flag, flag) for flag in flags]
    message = one_line_error(capsys, bench, "--optimizers", "1", *flags)
    assert message.startswith("error: ") and match in message, message
    said = capsys.readouterr()
    assert said.err == "" and "val loss" not in said.out


def test_ctrl_c_while_torch_is_still_importing_ends_bench_quietly(tmp_path):
    (tmp_path / "numpy.py").write_text("raise KeyboardInterrupt\n")  # the import a Ctrl-C lands in
    done = run_cli("bench.py", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 130 and done.stderr == "", done.stderr


def test_bench_into_a_reader_gone_away_ends_quietly(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text(TEXT, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "bench.py", "--optimizers", "0.5", "--only", "adamw", "--data",
                             str(short)], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # gone before bench prints its first line
    err = proc.stderr.read()
    assert proc.wait(timeout=HANG) == 141 and err == "", err


@pytest.mark.parametrize("build", {s.model for s in [*bench.VARIANTS.values(), *bench.CANDIDATES.values()]} - {None},
                         ids=lambda build: build.__name__)
def test_every_model_a_variant_or_candidate_builds_trains(build):
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = build(config)
    idx = torch.randint(0, 13, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_each_candidate_trains_as_it_says_in_alternating_rounds_and_gpt_py_is_put_back(tmp_path, monkeypatch):
    (tmp_path / "text.txt").write_text(TEXT[:12_000], encoding="utf-8")
    # As on a CPU without native bfloat16, so that the candidate in bfloat16 differs from the default.
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)
    real = (gpt.lr_at, gpt.newton_schulz, gpt.matmul_dtype)
    iterations = []

    def counted(G, steps=5):
        iterations.append(steps)
        return real[1](G, steps)

    monkeypatch.setattr(gpt, "newton_schulz", counted)
    seen = []
    real_steps = gpt.Trainer.steps

    def steps(trainer):  # what each run trains with: its options, the schedule and Muon's products as patched
        seen.append((trainer.tc.tie_weights, trainer.tc.warmup_iters, trainer.tc.n_layer, trainer.tc.embedding_lr,
                     trainer.tc.muon_momentum_start, trainer.tc.bigram, trainer.tc.max_time, gpt.lr_at,
                     gpt.matmul_dtype(torch.device("cpu"))))
        iterations.clear()
        yield from real_steps(trainer)
        seen[-1] += (set(iterations),)

    monkeypatch.setattr(gpt.Trainer, "steps", steps)
    names = ["default", "tied, cosine, 100 warmup, 4 layers, momentum flat, decay 0.1, no table",
             "4 layers, embedding at 3e-3, momentum flat, decay 0.1, no table", "Muon in bfloat16",
             "Newton-Schulz, 3 steps"]
    rows = bench.compare({name: bench.CANDIDATES[name] for name in names}, 0.1, str(tmp_path / "text.txt"), 2,
                         log=lambda line: None, n_embd=16, n_head=2, block_size=16, batch_size=2)
    assert [(r["round"], r["setting"]) for r in rows] == [(1, n) for n in names] + [(2, n) for n in reversed(names)]
    assert all(r["iters"] >= 1 and math.isfinite(r["val_loss"]) for r in rows)
    default = (False, 20, 3, 0.03, 0.85, 8192, 0.1, real[0], torch.float32, {5})
    assert seen[:5] == [default, (True, 100, 4, 0.03, 0.95, 0, 0.1, bench.cosine_lr, *default[-2:]),
                        (False, 20, 4, 3e-3, 0.95, 0, *default[-4:]), (*default[:-2], torch.bfloat16, {5}),
                        (*default[:-1], {3})]
    assert (gpt.lr_at, gpt.newton_schulz, gpt.matmul_dtype) == (real[0], counted, real[2])  # put back after each run
    assert [r["products"] for r in rows[:5]] == ["float32", "float32", "float32", "bfloat16", "float32"]


def test_a_windows_candidate_draws_the_rows_and_context_it_names_at_each_share_of_the_run(tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text(TEXT[:6000], encoding="utf-8")
    real_batch = gpt.Trainer.batch
    real_windows_batch = bench.windows_batch
    shapes = []

    def recorded(windows):  # the shape of each batch drawn
        batch = real_windows_batch(windows)

        def drawn(trainer, split):
            x, y = batch(trainer, split)
            shapes.append(tuple(x.shape))
            return x, y
        return drawn

    monkeypatch.setattr(bench, "windows_batch", recorded)
    options = dict(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=2, log=lambda line: None, steps=10)
    quarter = bench.CANDIDATES["a quarter of the context for the first 20%, half until 60%"].windows
    last_30 = bench.CANDIDATES["windows of 512 for the last 30%"].windows
    whole_first = bench.CANDIDATES["whole windows for the first 15%, half the context until 60%"].windows
    own = bench.context_halved_before(gpt.TrainConfig.short_context)  # gpt.Trainer.batch's
    for windows in (own, quarter, bench.half_the_rows_first, last_30, whole_first):
        shapes.clear()
        rows = bench.compare({"windows": bench.Setting(windows=windows)}, 0.0, str(tmp_path / "t.txt"), 1, **options)
        assert math.isfinite(rows[0]["val_loss"]) and gpt.Trainer.batch is real_batch
        assert shapes[:10] == {own: [(4, 8)] * 6 + [(2, 16)] * 4,
                               quarter: [(8, 4)] * 2 + [(4, 8)] * 4 + [(2, 16)] * 4,
                               bench.half_the_rows_first: [(2, 8)] * 2 + [(4, 8)] * 4 + [(2, 16)] * 4,
                               last_30: [(8, 4)] * 6 + [(4, 8)] + [(2, 16)] * 3,
                               whole_first: [(2, 16)] * 2 + [(4, 8)] * 4 + [(2, 16)] * 4}[windows]


def test_float32_steps_leave_autocast_off_and_a_setting_of_muons_products_leaves_the_steps_autocast(monkeypatch):
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.bfloat16)  # as on a CPU with native bfloat16
    seen = []
    real_steps = gpt.Trainer.steps

    def steps(trainer):
        seen.append((trainer.amp._enabled, gpt.matmul_dtype(trainer.device)))
        return real_steps(trainer)

    monkeypatch.setattr(gpt.Trainer, "steps", steps)
    real_autocast = gpt.autocast
    for name in ("default", "float32 steps", "Muon in float32"):
        _, run = bench.train_setting(bench.CANDIDATES[name], 0.05, torch.arange(3000) % 13,
                                     gpt.CharTokenizer("abcdefghijklm"), n_layer=1, n_embd=16, n_head=2, block_size=16,
                                     batch_size=2)
        assert math.isfinite(run["val_loss"])
    assert seen == [(True, torch.bfloat16), (False, torch.bfloat16), (True, torch.float32)]
    assert gpt.autocast is real_autocast


def test_the_copiers_rows_train_gpt_train_s_weights_through_train_py_and_gpt_train(tmp_path):
    """train.py's row runs train.run, the copier's gpt.Trainer as gpt.train does: the same weights."""
    options = dict(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=2, max_time=0.0, max_iters=3,
                   eval_iters=2, out_dir="", device="cpu")
    text = TEXT[:6000]
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    ids, tokenizer = data.read_data(data.DataFile(str(tmp_path / "text.txt"), None))
    expected, _ = gpt.train(gpt.TrainConfig(**options), text, log=lambda line: None)
    trained = {}
    for name, setting in bench.COPIER.items():
        trainer, run = bench.train_setting(setting, 1.0, ids, tokenizer, **options)
        trained[name] = trainer.model.state_dict()
        last = {"train.py": gpt.Muon, "gpt.train": gpt.Muon, "gpt.train, AdamW alone": torch.optim.AdamW}[name]
        assert run["iters"] == 3 and [type(o) for o in trainer.optimizers][-1] is last
    ran = []
    real_run = train.run
    with unittest.mock.patch.object(train, "run", lambda *args, **kwargs: ran.append(1) or real_run(*args, **kwargs)):
        bench.train_setting(bench.COPIER["train.py"], 1.0, ids, tokenizer, **options)
    assert ran == [1]
    for name, p in expected.state_dict().items():
        assert torch.equal(trained["gpt.train"][name], p), name
        torch.testing.assert_close(trained["train.py"][name], p, rtol=1e-5, atol=1e-6)


def test_bench_copier_prints_its_rows_with_steps_a_second_val_loss_and_the_dtype(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT[:6000], encoding="utf-8")
    bench.main(["--copier", "0.2", "--runs", "1", "--data", str(tmp_path / "text.txt"), "--set", "n_layer=1",
                "--set", "n_embd=16", "--set", "n_head=2", "--set", "block_size=16"])
    out = capsys.readouterr().out
    dtype = str(gpt.matmul_dtype(torch.device("cpu")))[6:]
    for name, products in (("train.py", dtype), ("gpt.train", dtype),
                           ("gpt.train, AdamW alone", "no Muon")):
        assert re.search(rf"^  round 1 {re.escape(name)} +\d+ steps +\d+\.\d\d steps/s  Muon's products {products} +"
                         rf"val loss \d\.\d{{4}}$", out, re.M), out
        assert re.search(rf"^  {re.escape(name)} +\d+\.\d\d steps/s  Muon's products {products} +mean val loss "
                         rf"\d\.\d{{4}}", out, re.M), out
    assert re.search(r"mean val loss \d\.\d{4}, minus train.py's [+-]\d\.\d{4}$", out, re.M), out


def test_bench_quality_reads_its_data_as_train_py_does(monkeypatch):
    given = []

    def run(tc, data_file, log):  # train.py's own run, which reads a DataFile as --data and --dtype say
        given.append(data_file)
        log("what context buys: ...")
        return types.SimpleNamespace(it=3, history=[{"val": 1.5}]), None

    monkeypatch.setattr(train, "run", run)
    q = bench.bench_quality(0.5, "ids.bin", "uint32")
    assert given == [data.DataFile("ids.bin", "uint32")] and (q["iters"], q["val_loss"]) == (3, 1.5)


def test_bench_quality_runs_again_when_asked_and_prints_the_median(monkeypatch, capsys):
    losses = iter([1.7, 1.5, 1.6])
    monkeypatch.setattr(bench, "bench_quality", lambda seconds, path, dtype: dict(
        seconds=seconds, data=path, iters=10, val_loss=next(losses), report="what context buys: ..."))
    bench.main(["--quality", "2", "--runs", "3"])
    out = capsys.readouterr().out
    assert re.findall(r"val loss (\d\.\d{4})", out) == ["1.7000", "1.5000", "1.6000", "1.6000"], out
    assert out.rstrip().endswith("median of 3 runs: val loss 1.6000"), out


@pytest.mark.parametrize("flags, match", [
    (["--candidate", "compile"], "--candidate goes with --candidates, or once with --quality --nanogpt"),
    (["--quality", "--nanogpt", "x", "--candidate", "compile", "--candidate", "compile"], "or once with --quality"),
    (["--candidates", "0"], "must be in (0, 1e6), got 0"),
    (["--copier", "1e6"], "must be in (0, 1e6), got 1e6"),
    (["--candidates", "1", "--candidate", "nope"], "invalid choice: 'nope'"),
    (["--variant", "tied"], "--variant goes with --variants"),
    (["--only", "adamw", "--copier", "1"], "--only goes with --optimizers"),
    (["--set", "muon_lr=0.02"], "--set goes with --optimizers, --variants, --candidates or --copier"),
    (["--runs", "2", "--maps"], "--runs goes with --quality, --optimizers"),
    (["--copier", "1", "--runs", "0"], "must be at least 1, got 0"),
    (["--candidates", "5", "--steps", "10"], "--candidates takes SECONDS, or with --steps N none"),
    (["--variants"], "--variants takes SECONDS, or with --steps N none"),
    (["--steps", "10"], "--steps goes with --optimizers, --variants, --candidates or --copier"),
    (["--copier", "--steps", "0"], "must be in [1, 1000000000], got 0"),
    (["--copier", "--steps", "10000000000"], "--steps: must be in [1, 1000000000], got 10000000000"),  # not max_iters
    (["--candidates", "1", "--set", "seed"], "'seed': --set takes OPTION=VALUE"),  # not "seed must be int, got "
    (["--profile", "--maps"], "--maps and --profile are two modes: give one at a time"),  # else one would be dropped
    (["--candidates", "1", "--nanogpt", "x"], "--candidates and --nanogpt are two modes"),
    (["--data", "x.txt"], "--data goes with --quality, --optimizers"),  # the speed benchmark reads none
    (["--maps", "--data", "x.txt"], "--data goes with --quality, --optimizers"),
    (["--quality", "--nanogpt", ""], "argument --nanogpt: is empty: give the folder"),  # "" is no folder
    (["--candidates", "1", "--dtype", "uint32"], "--dtype is the type of the ids in a .bin --data: give --data too"),
])
def test_the_harness_flags_are_refused_in_one_line_before_anything_runs(capsys, flags, match):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and match in err and err.count("\n") <= 2, err


def test_the_cosine_candidate_is_nanogpts_schedule_and_gpt_py_holds_the_peak_then_cools_down():
    tc = gpt.TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=110)
    assert bench.cosine_lr(tc, 0, 0.0) == pytest.approx(1e-4) and bench.cosine_lr(tc, 9, 0.0) == pytest.approx(1e-3)
    assert bench.cosine_lr(tc, 60, 0.0) == pytest.approx(5.5e-4)
    assert bench.cosine_lr(tc, 110, 0.0) == pytest.approx(1e-4)
    # gpt.lr_at now holds the peak until 40% of the steps, then falls in a straight line to min_lr.
    assert gpt.lr_at(tc, 40, 0.0) == pytest.approx(1e-3) and gpt.lr_at(tc, 77, 0.0) == pytest.approx(5.5e-4, rel=0.05)
    assert gpt.lr_at(tc, 110, 0.0) == pytest.approx(1e-4)


def test_a_cooldown_over_a_share_is_gpt_pys_at_60_percent_and_holds_the_peak_until_its_share():
    tc = gpt.TrainConfig()
    at_60, at_40 = bench.cooldown_over(0.6), bench.cooldown_over(0.4)
    assert [at_60(tc, it, 0.0) for it in range(0, 4001, 25)] == [gpt.lr_at(tc, it, 0.0) for it in range(0, 4001, 25)]
    assert at_40(tc, 5, 0.0) == gpt.lr_at(tc, 5, 0.0) < tc.learning_rate  # the same warmup
    assert at_40(tc, 2400, 0.0) == tc.learning_rate > gpt.lr_at(tc, 2400, 0.0)  # the peak held to 60%
    assert at_40(tc, 3200, 0.0) == pytest.approx((tc.learning_rate + tc.min_lr) / 2)
    assert at_40(tc, 4000, 0.0) == pytest.approx(tc.min_lr)
    timed = gpt.TrainConfig(max_time=100.0, max_iters=gpt.MANY)
    assert at_40(timed, 50, 80.0) == pytest.approx((timed.learning_rate + timed.min_lr) / 2)  # by the seconds


def test_the_qk_norm_variant_norms_each_heads_query_and_key_and_is_otherwise_gpt_pys_attention():
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    attn = bench.qk_norm(config).h[0].attn
    x = 10 * torch.randn(2, 16, 16)  # large beside RMSNorm's eps
    rope = gpt.rope_tables(config)
    q, k, v = attn.heads(x, rope)
    for t in (q, k):  # a turn keeps each head's norm: a mean square of 1 after the RMSNorm
        torch.testing.assert_close(t.pow(2).mean(-1), torch.ones(2, 2, 16), rtol=0, atol=1e-3)
    assert not torch.allclose(v.pow(2).mean(-1), torch.ones(2, 2, 16), atol=0.1)  # v is not normed
    # gpt.py's attention, on the normed queries and keys: the variant changes nothing else.
    q0, k0, v0 = gpt.CausalSelfAttention.heads(attn, x, rope)
    torch.testing.assert_close(v, v0)
    torch.testing.assert_close(q, q0 / q0.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt())
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
    torch.testing.assert_close(attn(x, rope), attn.c_proj(y), rtol=1e-5, atol=1e-6)


def test_qk_norm_with_gains_norms_queries_and_keys_before_the_turn_and_its_gains_learn_with_adamw():
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = bench.qk_norm_gains(config)
    attn = model.h[0].attn
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2.0)  # gains that differ by channel, which a turn does not commute with
    x = 10 * torch.randn(2, 16, 16)
    rope = gpt.rope_tables(config)
    q, k, v = attn.heads(x, rope)
    q0, k0, v0 = gpt.CausalSelfAttention.heads(attn, x)  # unturned
    rms = q0.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
    torch.testing.assert_close(q, gpt.rope_forward(q0 / rms * attn.q_norm.weight, *rope))
    torch.testing.assert_close(v, v0)
    # Turned after the norm: the normed, ungained keys keep a mean square of 1.
    torch.testing.assert_close(k.pow(2).mean(-1), torch.ones(2, 2, 16), rtol=0, atol=1e-3)
    # The gains are vectors: AdamW's, never Muon's.
    adamw, muon = gpt.configure_optimizers(model, gpt.TrainConfig())
    in_adamw = {id(p) for group in adamw.param_groups for p in group["params"]}
    assert id(attn.q_norm.weight) in in_adamw and id(attn.k_norm.weight) in in_adamw
    assert all(p.dim() == 2 for group in muon.param_groups for p in group["params"])
    # Under bfloat16 autocast, as a CPU with AVX512-BF16 trains it: normed in float32, torch warns of no dtype mismatch.
    with warnings.catch_warnings(record=True) as caught, torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        q, k, v = attn.heads(x, rope)
    assert not caught and q.dtype == k.dtype == torch.float32, [str(w.message) for w in caught]


@pytest.mark.parametrize("overrides", [dict(), dict(bias=True, pos="learned")])
def test_bench_maps_times_the_stacked_product_on_the_same_q_k_v_and_puts_the_plain_maps_back(overrides):
    model = tiny_model(**overrides)
    attn, x = model.h[0].attn, torch.randn(2, 5, model.config.n_embd)
    rope = None if model.wpe else (model.cos[:5], model.sin[:5])
    for mine, theirs in zip(bench.stacked_heads(attn, x, rope), attn.heads(x, rope)):
        torch.testing.assert_close(mine, theirs)
    inside = []
    bench.with_stacked_heads(lambda: inside.append(gpt.CausalSelfAttention.heads))()
    assert inside == [bench.stacked_heads] and gpt.CausalSelfAttention.heads is not bench.stacked_heads


# A stand-in for nanoGPT's model.py with its interface: GPTConfig's fields, GPT(config), forward(idx, targets=None)
# giving every position's logits and the loss (targets -1 left out) with targets and the last position's without, and
# configure_optimizers(weight_decay, learning_rate, betas, device_type). A bigram model, which trains in moments.
NANOGPT_STAND_IN = '''
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MADE = []


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.lm_head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.calls = []
        MADE.append(self)

    def forward(self, idx, targets=None):
        assert idx.size(1) <= self.config.block_size
        self.calls.append((self.training, targets is not None))
        logits = self.lm_head(self.wte(idx))
        if targets is None:
            return logits[:, [-1], :], None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        self.optimizer_args = (weight_decay, learning_rate, betas, device_type)
        optimizer = torch.optim.AdamW([{"params": [self.wte.weight, self.lm_head.weight],
                                        "weight_decay": weight_decay}], lr=learning_rate, betas=betas)
        self.rates = []
        step = optimizer.step
        optimizer.step = lambda: (self.rates.append(optimizer.param_groups[0]["lr"]), step())
        return optimizer
'''


def beside_the_default(build):
    """(build's model, the default model with the weights the same seed gives, ids (2, 6)), both of TINY's config."""
    torch.manual_seed(0)
    model = build(gpt.GPTConfig(**TINY))
    torch.manual_seed(0)
    plain = gpt.GPT(gpt.GPTConfig(**TINY))
    return model, plain, torch.randint(0, TINY["vocab_size"], (2, 6))


def test_the_trigram_candidate_adds_the_token_two_before_through_its_own_table():
    model, plain, idx = beside_the_default(bench.TrigramGPT)
    # Zero at first: the default model's embedding, its other weights as the default seeds them.
    assert torch.equal(model.embed(idx)[0], plain.embed(idx)[0])
    torch.nn.init.normal_(model.trigram.weight)
    changed = idx.clone()
    changed[:, 0] = (idx[:, 0] + 1) % TINY["vocab_size"]
    moved = (model.embed(changed)[0] != model.embed(idx)[0]).any(dim=-1).any(dim=0)  # (T,)
    # The token itself at 0, the bigram and trigram tables at 1, the trigram table alone at 2.
    assert moved.tolist() == [True, True, True, False, False, False]


def test_the_soft_capped_head_bounds_every_logit_and_keeps_their_order():
    model, plain, idx = beside_the_default(lambda config: bench.softcapped(config, cap=20.0))
    with torch.no_grad():
        for m in (model, plain):
            m.lm_head.weight.mul_(300)  # logits far past the cap
    capped, uncapped = model(idx)[0], plain(idx)[0]
    assert uncapped.abs().max() > 30 and capped.abs().max() <= 20.0
    assert torch.equal(capped.argmax(dim=-1), uncapped.argmax(dim=-1))
    assert torch.allclose(capped, 20.0 * torch.tanh(uncapped / 20.0), atol=1e-5)


def test_the_value_embeddings_start_as_the_default_model_add_to_each_blocks_values_and_step_with_adamw():
    model, plain, idx = beside_the_default(bench.ValueEmbeddingGPT)
    assert torch.equal(model(idx)[0], plain(idx)[0])  # the tables are zero at first
    torch.nn.init.normal_(model.value_embeds[1].weight)
    x = torch.randn(2, 6, TINY["n_embd"])
    model(idx)  # the ids the blocks' values read
    for i, block in enumerate(model.h):
        v = block.attn.heads(x)[2]
        v_plain = gpt.CausalSelfAttention.heads(block.attn, x)[2]
        assert torch.equal(v, v_plain) == (i == 0)
    optimizers = gpt.configure_optimizers(model, gpt.TrainConfig(**TINY))
    muon = {id(p) for p in optimizers[-1].param_groups[0]["params"]}
    assert isinstance(optimizers[-1], gpt.Muon) and not muon & {id(t.weight) for t in model.value_embeds}


@pytest.mark.parametrize("name", ["lm_head", "bigram"])
def test_a_weight_at_its_own_rate_is_in_one_adamw_group_alone_at_that_rate(name):
    model = gpt.GPT(gpt.GPTConfig(**TINY))
    optimizers = bench.own_rate(name, 0.123)(model, gpt.TrainConfig(**TINY))
    weight = getattr(model, name).weight
    holding = [g for o in optimizers for g in o.param_groups if any(p is weight for p in g["params"])]
    assert len(holding) == 1 and holding[0]["params"] == [weight] and holding[0]["lr"] == 0.123
    everything = [p for o in optimizers for g in o.param_groups for p in g["params"]]
    assert len(everything) == len(list(model.parameters()))  # every weight stepped, once


def test_the_pair_logits_start_as_the_default_model_and_add_each_pairs_row_to_the_next_tokens_logits():
    model, plain, idx = beside_the_default(bench.PairLogitsGPT)
    assert torch.equal(model(idx)[0], plain(idx)[0])  # the table is zero at first
    torch.nn.init.normal_(model.pair_logits.weight)
    v, rows = TINY["vocab_size"], model.config.bigram
    pairs = (torch.cat([torch.full((2, 1), -1), idx[:, :-1]], dim=1) * v + idx) % rows  # (B, T)
    assert torch.allclose(model(idx)[0] - plain(idx)[0], model.pair_logits.weight[pairs], atol=1e-5)
    assert "pair_logits.weight" in dict(model.named_parameters()) and "lm_head.model" not in str(model)


def test_bench_quality_trains_a_candidates_model_beside_nanogpt_when_asked(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(NANOGPT_STAND_IN)
    (tmp_path / "text.txt").write_text(TEXT[:20_000], encoding="utf-8")
    monkeypatch.setattr(bench, "NANOGPT_RECIPE", dict(bench.NANOGPT_RECIPE, steps=20, warmup_iters=2))
    built = []
    monkeypatch.setitem(bench.CANDIDATES, "x0 to every block",
                        bench.Setting(model=lambda config: built.append(bench.x0_shortcut(config)) or built[-1]))
    bench.main(["--quality", "--nanogpt", str(tmp_path), "--data", str(tmp_path / "text.txt"), "--candidate",
                "x0 to every block", "--runs", "2"])
    out = capsys.readouterr().out
    # Ours is the candidate's model, trained: its weights of x0 have moved from zero.
    assert out.count("\nours, the default with x0 to every block for ") == 2 and len(built) == 2
    assert all(block.lambdas[1] != 0 for block in built[0].h)
    # Each run's line, then their medians.
    lines = out.strip().splitlines()
    assert lines[-5].startswith("ours ") and lines[-2].startswith("ours "), out
    assert re.fullmatch(r"median of 2 runs: [+-]\d\.\d{4} below nanoGPT; nanoGPT's loss reached \d+\.\dx sooner "
                        r"\(a run that never reached it counts as 0x\)", lines[-1]), lines[-1]


def test_bench_quality_trains_nanogpts_model_py_by_its_recipe_then_ours_for_its_time_and_evaluates_both_alike(
        tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(NANOGPT_STAND_IN)
    text = TEXT[:20_000]
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    loaded = []
    real_load = bench.load_nanogpt
    monkeypatch.setattr(bench, "load_nanogpt", lambda folder: loaded.append(real_load(folder)) or loaded[-1])
    ran = []  # our run: (trainer, kept weights)
    real_ours_for = bench.ours_for
    monkeypatch.setattr(bench, "ours_for", lambda *args: ran.append(real_ours_for(*args)) or ran[-1])
    # A shortened recipe: 60 steps, 6 of them warmup, the rest as nanoGPT's.
    monkeypatch.setattr(bench, "NANOGPT_RECIPE", dict(bench.NANOGPT_RECIPE, steps=60, warmup_iters=6))
    bench.main(["--quality", "--nanogpt", str(tmp_path), "--data", str(tmp_path / "text.txt"),
                "--json", str(tmp_path / "bench.json")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    found = re.fullmatch(r"ours (\d\.\d{4}), nanoGPT (\d\.\d{4}): (\d\.\d{4}) (lower|higher) in (\d+) s; nanoGPT's "
                         r"loss (reached in (\d+) s \((\d+\.\d)x\)|not reached)", last)
    assert found, last
    [figures] = json.loads((tmp_path / "bench.json").read_text())["quality_versus_nanogpt"]
    ours, theirs = figures["val_loss"]["ours"], figures["val_loss"]["nanoGPT"]
    assert found[3] == f"{abs(theirs - ours):.4f}" and (found[4] == "lower") == (ours <= theirs)
    reached = figures["reached_seconds"]
    assert (reached is None) == (found[6] == "not reached") and (ours <= theirs) == (reached is not None)
    # Read off our own run: one of the times it kept its weights, or its end (past nanoGPT's time by its last step).
    [(ours_run, kept)] = ran
    assert ours_run.elapsed >= figures["seconds"] and all(t < figures["seconds"] for t, _ in kept)  # its time
    assert reached is None or reached in [t for t, _ in kept] + [ours_run.elapsed]
    # nanoGPT's model by its recipe: its shape, its optimizer's options, the schedule, one step each.
    model = loaded[0].MADE[-1]
    vocab = sorted(set(text))
    assert vars(model.config) == dict(block_size=64, vocab_size=len(vocab), n_layer=4, n_head=4, n_embd=128,
                                      dropout=0.0, bias=False)
    assert model.optimizer_args == (0.1, 1e-3, (0.9, 0.99), "cpu") and len(model.rates) == 60
    assert model.rates[:6] == pytest.approx([1e-3 * (i + 1) / 6 for i in range(6)])  # the warmup, then the cosine
    assert model.rates[5:] == sorted(model.rates[5:], reverse=True) and model.rates[-1] == pytest.approx(1e-4, rel=0.01)
    assert [c for c in model.calls if c[0]] == [(True, True)] * 60  # trained with targets, 60 steps
    # Evaluated in eval mode, always with targets (without, nanoGPT gives the last position's logits alone), on
    # the whole held-out split: for a bigram model, the mean loss of every held-out character after the first.
    assert all(c == (False, True) for c in model.calls[60:]) and len(model.calls) > 60
    ids = torch.tensor([vocab.index(c) for c in text[int(0.9 * len(text)):]])
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model.lm_head(model.wte(ids[:-1])), ids[1:]).item()
    assert theirs == pytest.approx(expected, rel=1e-5)


def test_the_seconds_ours_took_to_reach_nanogpts_loss_are_the_first_kept_weights_that_reach_it(monkeypatch):
    class Weights(torch.nn.Module):
        """A model whose whole-split loss is what its state says: 1.4 at the run's end."""
        loss = torch.tensor(1.4)

        def state_dict(self):
            return {"loss": self.loss}

        def load_state_dict(self, state):
            self.loss = state["loss"]

    monkeypatch.setattr(gpt, "split_loss", lambda model, ids, batch_size: model.loss.item())
    losses = [3.0, 2.5, 2.6, 2.0, 1.9, 1.7, 1.5]  # kept every 10 s; the end, at 75 s: 1.4
    kept = [(10.0 * (i + 1), {"loss": torch.tensor(loss)}) for i, loss in enumerate(losses)]
    trainer = types.SimpleNamespace(model=Weights(), splits={"val": None}, tc=types.SimpleNamespace(batch_size=8),
                                    elapsed=75.0)
    assert bench.reached_at(trainer, kept, 2.0) == 40.0
    assert bench.reached_at(trainer, kept, 1.45) == 75.0  # the end alone
    assert bench.reached_at(trainer, kept, 9.0) == 10.0
    assert bench.reached_at(trainer, kept, 1.3) is None
    assert trainer.model.loss.item() == pytest.approx(1.4)  # the end's weights put back


def test_the_new_candidates_change_what_they_say_and_nothing_else():
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16)
    idx = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    plain = gpt.GPT(config)
    builds = {name: bench.CANDIDATES[name].model for name in ("output layer from zero", "x0 to every block")}
    models = {}
    for name, build in builds.items():
        torch.manual_seed(0)
        models[name] = build(config)
    assert not models["output layer from zero"].lm_head.weight.any()
    # x0's weights start at (1, 0): the default model's logits, until they learn.
    assert torch.allclose(models["x0 to every block"](idx)[0], plain(idx)[0])
    model = models["x0 to every block"]
    _, loss = model(idx, idx)
    loss.backward()
    assert all(block.lambdas.grad[1] != 0 for block in model.h)


def test_the_mlp_widths_and_the_norms_without_gains_change_those_alone():
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=24)
    idx = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    plain = gpt.GPT(config)
    for ratio, name in ((2, "MLP 2x wide"), (4, "MLP 4x wide")):
        model = bench.CANDIDATES[name].model(config)
        for block in model.h:
            shapes = [tuple(m.weight.shape) for m in (block.mlp.c_fc, block.mlp.c_gate, block.mlp.c_proj)]
            assert shapes == [(ratio * 24, 24), (ratio * 24, 24), (24, ratio * 24)]
        # Started as gpt.py starts the default's: std 0.02, the outputs to the stream 0.02 / sqrt(2 n_layer).
        assert model.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.15)
        assert model.h[0].mlp.c_proj.weight.std().item() == pytest.approx(0.01, rel=0.15)
    torch.manual_seed(0)
    model = bench.CANDIDATES["norms without gains"].model(config)
    names = {name for name, _ in model.named_parameters()}
    assert names == {name for name, _ in plain.named_parameters() if "ln_" not in name}
    # gpt.py's gains start at 1: without them, the same logits at the start.
    assert torch.allclose(model(idx)[0], plain(idx)[0])


def test_wider_init_starts_the_weights_it_names_at_their_std_and_leaves_the_others_as_gpt_py_starts_them():
    config = gpt.GPTConfig(vocab_size=50, n_layer=2, n_head=4, n_embd=256)
    torch.manual_seed(0)
    plain = dict(gpt.GPT(config).named_parameters())
    both = dict(bench.wider_init(0.5, embedding=1.0)(config).named_parameters())
    blocks = dict(bench.wider_init(0.5)(config).named_parameters())
    embedding = dict(bench.wider_init(embedding=1.0)(config).named_parameters())
    for name, p in both.items():
        if name.startswith("h.") and p.dim() == 2:
            scale = 0.5 if name.endswith("c_proj.weight") else 1.0  # 1 / sqrt(2 n_layer), as gpt.py scales it
            assert abs(p.std() / (scale * 0.5 / p.size(1) ** 0.5) - 1) < 0.05, name
            assert abs(embedding[name].std() / plain[name].std() - 1) < 0.05, name  # left at gpt.py's start
    assert abs(both["wte.weight"].std() - 1.0) < 0.05 and abs(embedding["wte.weight"].std() - 1.0) < 0.05
    assert abs(blocks["wte.weight"].std() / plain["wte.weight"].std() - 1) < 0.05
    assert all(torch.equal(both[n], plain[n]) for n in plain if plain[n].dim() == 1)  # the norms' gains stay 1


@pytest.mark.parametrize("name", [n for n, c in bench.CANDIDATES.items() if c.changes])
def test_a_candidate_of_other_options_trains_with_them(monkeypatch, name):
    seen = []
    real_steps = gpt.Trainer.steps

    def steps(trainer):
        seen.append(trainer.tc)
        return real_steps(trainer)

    monkeypatch.setattr(gpt.Trainer, "steps", steps)
    ids = torch.arange(6000) % 13  # over 10 windows of the longest context a candidate names
    bench.train_setting(bench.CANDIDATES[name], 0.05, ids, gpt.CharTokenizer("abcdefghijklm"), n_layer=1, n_embd=16,
                        n_head=2, block_size=16, batch_size=2)
    changes = bench.CANDIDATES[name].changes
    assert {key: getattr(seen[0], key) for key in changes} == changes


def with_the_defaults_weights(build, own, n_layer):
    """A small model of a candidate's build, and the default model with its weights but those named with own."""
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=n_layer, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = build(config)
    plain = gpt.GPT(config)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if own not in k})
    return model, plain


def assert_cache_samples_as_full_forwards(model, start, tokens=8):
    """Greedy sampling through the KV cache gives the tokens a full forward of all so far picks, one at a time."""
    assert_greedy(model, model.generate(start, tokens, temperature=0.0), start.size(1))


def test_gated_attention_with_its_gate_at_zero_is_the_default_model_with_half_of_each_heads_output():
    gated, plain = with_the_defaults_weights(bench.gated_attention, "head_gate", n_layer=2)
    for block, plain_block in zip(gated.h, plain.h):
        torch.nn.init.zeros_(block.attn.head_gate.weight)  # sigmoid(0) = 1/2 on every channel
        plain_block.attn.c_proj.weight.data /= 2
    idx = torch.randint(0, 13, (2, 16))
    torch.testing.assert_close(gated(idx)[0], plain(idx)[0])
    # Sampled through the KV cache, the gated model gives what a full forward per token gives.
    torch.manual_seed(1)
    for block in gated.h:
        torch.nn.init.normal_(block.attn.head_gate.weight)
    assert_cache_samples_as_full_forwards(gated, idx[:1, :3])


def test_windows_without_replacement_read_every_window_of_an_epoch_once_before_any_again(tmp_path):
    tc = gpt.TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2, short_context=0.0,
                         max_iters=100, out_dir="", device="cpu")
    trainer = gpt.Trainer(tc, torch.arange(1000) % 13, gpt.CharTokenizer("abcdefghijklm"), log=lambda *a: None)
    trainer.splits["train"] = torch.arange(201)  # each token its position: a window's first token is its start
    starts = [int(x[0]) for _ in range(25) for x in bench.epochs_batch(trainer, "train")[0]]
    # The windows of 8 after the pass's offset, as many as whole batches of 2 take.
    epoch = len(range(starts[0] % 8, 200 - 8 + 1, 8)) // 2 * 2
    assert len(set(starts[:epoch])) == epoch and {s % 8 for s in starts[:epoch]} == {starts[0] % 8}
    x, y = bench.epochs_batch(trainer, "train")
    assert torch.equal(y, x + 1) and x.shape == (2, 8)
    # As a candidate, it trains in place of gpt.Trainer.batch, which is put back after.
    (tmp_path / "t.txt").write_text(TEXT[:6000], encoding="utf-8")
    real_batch = gpt.Trainer.batch
    rows = bench.compare({"epochs": bench.CANDIDATES["windows without replacement"]}, 0.0, str(tmp_path / "t.txt"), 1,
                         log=lambda line: None, steps=3, n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=2)
    assert math.isfinite(rows[0]["val_loss"]) and gpt.Trainer.batch is real_batch


def test_the_windows_of_gpt_py_s_own_schedule_draw_what_gpt_trainer_batch_draws():
    tc = gpt.TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=2, max_iters=10, out_dir="",
                         device="cpu")
    trainers = [gpt.Trainer(tc, torch.arange(3000) % 13, gpt.CharTokenizer("abcdefghijklm"), log=lambda *a: None)
                for _ in range(2)]
    own = bench.windows_batch(bench.context_halved_before(tc.short_context))
    for it in (0, 5, 6, 9):  # half the context before 60% of the run, all of it after
        for trainer in trainers:
            trainer.it = it
        for theirs, ours in zip(gpt.Trainer.batch(trainers[0], "train"), own(trainers[1], "train")):
            assert torch.equal(theirs, ours)


@pytest.mark.parametrize("rows, cols", [(24, 8), (8, 24)])
def test_normuon_moves_each_row_as_muon_does_evened_out_by_a_running_mean_of_its_squares(rows, cols):
    torch.manual_seed(0)
    grads = [torch.randn(rows, cols) * torch.linspace(0.1, 3, rows).view(-1, 1) for _ in range(2)]  # uneven rows
    moved, params, optimizers = {}, {}, {}
    for name, kind in (("muon", gpt.Muon), ("normuon", bench.NorMuon)):
        params[name] = torch.nn.Parameter(torch.zeros(rows, cols))
        optimizers[name] = kind([params[name]], lr=0.1, momentum=0.9)
        params[name].grad = grads[0].clone()
        optimizers[name].step()
        moved[name] = -params[name].detach().clone()
    # The first step: each row as Muon's, pointing its way, all of one size, and the whole of Muon's size.
    row_norms = moved["normuon"].norm(dim=1)
    assert row_norms.max() / row_norms.min() < 1.01 < moved["muon"].norm(dim=1).max() / moved["muon"].norm(dim=1).min()
    assert torch.nn.functional.cosine_similarity(moved["normuon"], moved["muon"], dim=1).min() > 0.999
    torch.testing.assert_close(moved["normuon"].norm(), moved["muon"].norm(), rtol=1e-3, atol=0)
    # The second: the running mean weighs the new squares by 1 - beta2 = 0.05.
    params["normuon"].grad = grads[1].clone()
    optimizers["normuon"].step()
    buffer = 0.1 * grads[0]
    updates = [grads[0].lerp(buffer, 0.9)]
    buffer = buffer.lerp(grads[1], 0.1)
    updates.append(grads[1].lerp(buffer, 0.9))
    squares = [gpt.newton_schulz(u[None]).float()[0].square().mean(dim=1, keepdim=True) for u in updates]
    expected = 0.95 * (0.05 * squares[0]) + 0.05 * squares[1]
    torch.testing.assert_close(optimizers["normuon"].state[params["normuon"]]["row_squares"], expected)


def test_normuon_takes_muons_place_with_its_rate_momentum_and_decay_and_steps_the_blocks():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY))
    tc = gpt.TrainConfig(**TINY, muon_momentum=0.9, weight_decay=0.1)
    optimizers = bench.normuon(model, tc)
    plain = gpt.configure_optimizers(model, tc)
    group = optimizers[-1].param_groups[0]
    assert type(optimizers[-1]) is bench.NorMuon and group["params"] == plain[-1].param_groups[0]["params"]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (tc.muon_lr, 0.9, 0.1)
    before = [p.detach().clone() for p in group["params"]]
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    gpt.train_step(model, optimizers, [(idx, idx)])
    assert all(not torch.equal(p, q) for p, q in zip(group["params"], before))
    with pytest.raises(ValueError, match="needs optimizer muon"):
        bench.normuon(model, gpt.TrainConfig(**TINY, optimizer="adamw"))


@pytest.mark.parametrize("changes", [dict(), dict(optimizer="adamw"), dict(**SWITCHES["gpt2"], weight_decay=0.1)])
def test_plain_optimizers_step_as_gpts_own_and_keep_their_states_in_its_layout(changes):
    tc = gpt.TrainConfig(**TINY, **changes)
    torch.manual_seed(0)
    models = [gpt.GPT(tc.model_config()) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    plain, own = bench.plain_optimizers(models[0], tc), gpt.configure_optimizers(models[1], tc)
    names = [{id(p): n for n, p in model.named_parameters()} for model in models]
    for ours, theirs in zip(plain, own, strict=True):
        for a, b in zip(ours.param_groups, theirs.param_groups, strict=True):
            assert [names[0][id(p)] for p in a["params"]] == [names[1][id(p)] for p in b["params"]]
            assert {key: a[key] for key in a if key != "params"}.items() <= b.items()
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    for _ in range(3):
        gpt.train_step(models[0], plain, [(idx, idx)], grad_clip=1.0)
        gpt.train_step(models[1], own, [(idx, idx)], grad_clip=1.0)
    # The same kernels on the same numbers: a slip in a rate, a beta or eps moves weights by far more.
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    for ours, theirs in zip(plain, own):
        saved, expected = ours.state_dict()["state"], theirs.state_dict()["state"]
        assert saved.keys() == expected.keys()
        for i in saved:
            assert saved[i].keys() == expected[i].keys()
            for key in saved[i]:
                torch.testing.assert_close(saved[i][key], expected[i][key])


class NoDynamo(importlib.abc.MetaPathFinder):
    """An import of torch._dynamo, refused."""

    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo":
            raise ImportError("torch._dynamo imported")


def test_plain_optimizers_train_without_torch_dynamo_which_torch_optim_imports(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)  # this process has it: imported again, refused
    monkeypatch.setattr(sys, "meta_path", [NoDynamo(), *sys.meta_path])
    tc = gpt.TrainConfig(**TINY, out_dir="")
    model = gpt.GPT(tc.model_config())
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    gpt.train_step(model, bench.plain_optimizers(model, tc), [(idx, idx)])
    # torch.optim's AdamW imports it at every step (torch 2.13): what the plain classes are measured against.
    with pytest.raises(ImportError, match="torch._dynamo imported"):
        gpt.train_step(model, gpt.configure_optimizers(model, tc), [(idx, idx)])


def test_our_step_takes_as_many_micro_batches_as_its_config_a_step(monkeypatch):
    taken = []
    monkeypatch.setattr(gpt, "train_step", lambda model, optimizers, batches, *args: taken.append(len(batches)))
    for micro_batches in (1, 3):
        tc = gpt.TrainConfig(**TINY, grad_accum=micro_batches)
        bench.our_step(tc.model_config(), tc, torch.device("cpu"))()
    assert taken == [1, 3]


def test_polar_express_keeps_each_matrixs_singular_vectors_and_ends_its_singular_values_nearer_one(monkeypatch):
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)  # every CPU alike
    G = torch.randn(2, 16, 48, generator=torch.Generator().manual_seed(0))
    for M in (G, G.mT):  # wide and tall
        U, _, Vh = torch.linalg.svd(M.double(), full_matrices=False)
        express, plain = bench.polar_express(M), gpt.newton_schulz(M)
        assert express.shape == M.shape and express.dtype == torch.float32
        s, s_plain = torch.linalg.svdvals(express.double()), torch.linalg.svdvals(plain.double())
        assert 0.8 < s.min() and s.max() < 1.2
        assert s_plain.min() < s.min()  # torch.optim.Muon's coefficients leave the smallest further below 1
        # The same directions: U^T X V is diagonal.
        inner = U.mT @ express.double() @ Vh.mT
        off = inner - torch.diag_embed(torch.diagonal(inner, dim1=-2, dim2=-1))
        assert off.abs().max() < 1e-3
    with bench.patched(bench.CANDIDATES["Polar Express"]):
        assert gpt.newton_schulz is bench.polar_express
    assert gpt.newton_schulz is not bench.polar_express


def test_half_the_rotary_pairs_unturned_turns_the_first_quarter_of_channels_and_leaves_the_rest():
    config = gpt.GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=32)  # head size 16: 8 pairs
    model = bench.half_rope(config)
    angles = torch.atan2(model.sin, model.cos)  # (block_size, head size), each pair's angle twice
    torch.testing.assert_close(angles[:, :8], angles[:, 8:])
    torch.testing.assert_close(angles[:, :4][1], 1024.0 ** -torch.linspace(0, 1, 4))  # position 1: the rates
    assert (model.cos[:, 4:8] == 1).all() and (model.sin[:, 4:8] == 0).all()
    # The rates' ends: a turn of 1 a position and of 1/1024.
    torch.testing.assert_close(angles[3, [0, 3]], torch.tensor([3.0, 3 / 1024]))


def test_muon_at_0_0086_gives_the_polar_express_updates_the_size_of_the_defaults(monkeypatch):
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)
    generator = torch.Generator().manual_seed(0)
    squares = {"default": 0.0, "Polar Express": 0.0}
    for shape in [(4, 128, 128), (2, 384, 128), (1, 128, 384)]:  # the default model's matrices, by shape
        G = torch.randn(*shape, generator=generator)
        squares["default"] += gpt.newton_schulz(G).square().sum()
        squares["Polar Express"] += bench.polar_express(G).square().sum()
    rate = 0.01 * (squares["default"] / squares["Polar Express"]).sqrt()
    assert rate == pytest.approx(0.0086, abs=0.0002)
    setting = bench.CANDIDATES["Polar Express, Muon at 0.0086"]
    assert (setting.changes, setting.newton_schulz) == ({"muon_lr": 0.0086}, bench.polar_express)


def test_adamw_beta1_sets_every_adamw_groups_momentum_and_leaves_muon():
    tc = gpt.TrainConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=13)
    model = gpt.GPT(tc.model_config())
    adamw, muon = bench.CANDIDATES["AdamW's beta1 0.8"].optimizers(model, tc)
    assert len(adamw.param_groups) > 1 and all(g["betas"] == (0.8, tc.beta2) for g in adamw.param_groups)
    assert isinstance(muon, gpt.Muon) and all("betas" not in g for g in muon.param_groups)


def test_value_residual_mixes_the_first_blocks_values_into_the_others_and_samples_through_the_cache():
    mixed, plain = with_the_defaults_weights(bench.value_residual, "value_mix", n_layer=3)
    idx = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(mixed(idx)[0], plain(idx)[0])  # from (1/2, 1/2): mixed
    with torch.no_grad():
        for block in mixed.h[1:]:
            block.attn.value_mix.copy_(torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(mixed(idx)[0], plain(idx)[0])  # (1, 0): the default model
    with torch.no_grad():
        for block in mixed.h[1:]:
            block.attn.value_mix.copy_(torch.tensor([0.3, 0.9]))
    _, loss = mixed(idx, idx)
    loss.backward()
    assert all(block.attn.value_mix.grad.abs().min() > 0 for block in mixed.h[1:])
    # Sampled through the KV cache, the mixed model gives what a full forward per token gives.
    assert_cache_samples_as_full_forwards(mixed, idx[:1, :3])
