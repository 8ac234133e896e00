"""Tests for gpt.py, gpt_numpy.py, train.py and sample.py. Run: python -m pytest -q"""
import ast
import dataclasses
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import gpt
import gpt_numpy
import sample
import train

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = dict(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)
SWITCHES = {  # every architecture switch appears on and off
    "llama": dict(),
    "gpt2": dict(norm="layernorm", pos="learned", mlp="gelu", tie_weights=True, bias=True),
    "mix": dict(norm="layernorm", pos="rope", mlp="gelu", tie_weights=False, bias=True),
    "mix2": dict(norm="rmsnorm", pos="learned", mlp="swiglu", tie_weights=False, bias=False),
}
TEXT = Path(HERE, "input.txt").read_text(encoding="utf-8")[:30_000]


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return gpt.GPT(gpt.GPTConfig(**{**TINY, **overrides}))


def tiny_train_config(tmp_path, **overrides):
    return gpt.TrainConfig(**{**dict(out_dir=str(tmp_path / "out"), max_iters=8, eval_interval=4, eval_iters=2,
                                     batch_size=4, block_size=16, n_layer=1, n_head=2, n_embd=16, warmup_iters=2,
                                     device="cpu"), **overrides})


def tiny_flags(tmp_path, **overrides):
    """The command line of tiny_train_config, with its text in tmp_path/data.txt."""
    data = tmp_path / "data.txt"
    if not data.exists():
        data.write_text(TEXT, encoding="utf-8")
    tc = tiny_train_config(tmp_path, **overrides)
    defaults = gpt.TrainConfig()
    return ["--data", str(data)] + [f"--{f.name}={getattr(tc, f.name)}" for f in dataclasses.fields(tc)[1:]
                                    if getattr(tc, f.name) != getattr(defaults, f.name)]


def quiet(*args, **kwargs):
    pass


def run_cli(*args, cwd=HERE, env=None, **kwargs):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env}, **kwargs)


def one_line_error(capsys, module, *args):
    """Runs module.main(args) in this process; returns its one-line error, after checking that it is one."""
    with pytest.raises(SystemExit) as exit_info:
        module.main(list(args))
    code = exit_info.value.code
    message = code if isinstance(code, str) else capsys.readouterr().err.strip()
    assert code not in (0, None) and message and "\n" not in message.strip() and "Traceback" not in message, message
    return message


# ---------------------------------------------------------------------------------------------------- files
def test_gpt_py_is_small_stands_alone_and_importing_it_does_nothing(tmp_path):
    source = Path(HERE, "gpt.py").read_text(encoding="utf-8")
    assert sum(1 for line in source.splitlines() if line.strip()) <= 330
    assert max(len(line) for line in source.splitlines()) <= 120
    for name, allowed in (("gpt.py", {"torch"}), ("gpt_numpy.py", {"numpy"})):
        tree = ast.parse(Path(HERE, name).read_text(encoding="utf-8"))
        modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert modules - sys.stdlib_module_names <= allowed, (name, modules)
    assert not re.search(r"distributed|signal|threading", source)  # nothing a copy did not ask for
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); state = lambda: (torch.get_default_dtype(), "
            "torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32, torch.initial_seed()); "
            "before = state(); import gpt; assert state() == before")
    done = subprocess.run([sys.executable, "-c", code, HERE], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stderr
    assert list(tmp_path.iterdir()) == []  # no file written


def readme_block(heading):
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", readme[readme.index(heading):], re.S).group(1)


def test_the_readme_block_runs_in_a_folder_with_only_gpt_py_and_input_txt(tmp_path):
    for name in ("gpt.py", "input.txt"):
        shutil.copy(os.path.join(HERE, name), tmp_path / name)
    block = readme_block("## Using it from your own code")
    done = run_cli("-c", block, cwd=tmp_path, env={"PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert re.search(r"iter 100: train loss [\d.]+, val loss [\d.]+\niter 200: ", done.stdout), done.stdout  # trained
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 200  # saved
    sample_text = done.stdout.split("\n", 2)[2]
    assert sample_text.startswith("ROMEO:") and len(sample_text) >= 206  # loaded and sampled
    assert sorted(os.listdir(tmp_path)) == ["gpt.py", "input.txt", "out"]


# ---------------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip_and_unknown_characters():
    tok = gpt.CharTokenizer("hello world")
    assert tok.chars == " dehlorw" and tok.vocab_size == 8
    assert tok.decode(tok.encode("world hello")) == "world hello"
    with pytest.raises(ValueError, match="'Qz'"):
        tok.encode("hello Qz")


# ---------------------------------------------------------------------------------------------------- config and model
@pytest.mark.parametrize("bad, message", [
    (dict(n_embd=30, n_head=4, pos="learned"), "multiple of n_head"),
    (dict(n_embd=18, n_head=6), "2 n_head with rope"),
    (dict(norm="batchnorm"), "norm must be one of"),
    (dict(pos="alibi"), "pos must be one of"),
    (dict(mlp="relu"), "mlp must be one of"),
    (dict(n_layer=0), r"n_layer must be in \[1, inf\)"),
    (dict(vocab_size=0), "vocab_size must be in"),
    (dict(dropout=1.0), "dropout must be in"),
    (dict(dropout=float("nan")), "dropout must be in"),
    (dict(learning_rate=1e-4), r"min_lr \(0.0003\) is above learning_rate \(0.0001\): lower min_lr too"),
])
def test_bad_config_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        gpt.TrainConfig(**{**TINY, **bad})  # GPTConfig's checks, and the training's


def test_a_learning_rate_that_stays_flat_is_allowed():
    tc = gpt.TrainConfig(learning_rate=1e-4, min_lr=1e-4, warmup_iters=0, max_iters=10)
    assert [gpt.lr_at(tc, it, 0.0) for it in range(10)] == pytest.approx([1e-4] * 10)


@pytest.mark.parametrize("name", [name for name in gpt.LIMITS if name not in TINY and name != "dropout"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e9])
def test_every_number_of_train_config_refuses_nan_inf_and_out_of_range(name, value):
    with pytest.raises(ValueError, match=f"{name} must be in"):
        gpt.TrainConfig(**{name: value})


def test_the_twin_config_has_the_fields_and_defaults_of_gpt_config():
    ours = [(f.name, f.type, f.default) for f in dataclasses.fields(gpt_numpy.GPTConfig)]
    assert ours == [(f.name, f.type, f.default) for f in dataclasses.fields(gpt.GPTConfig)]


def test_gpt2_small_has_the_published_parameter_count():
    with torch.device("meta"):  # the shapes without the memory
        model = gpt.GPT(gpt.GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                                      **SWITCHES["gpt2"]))
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # the tied matrix counted once


@pytest.mark.parametrize("name", SWITCHES)
def test_logits_shape_and_causality(name):
    model = tiny_model(**SWITCHES[name]).eval()
    idx = torch.randint(0, 13, (2, 10))
    logits, loss = model(idx)
    assert logits.shape == (2, 10, 13) and loss is None
    changed = idx.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 13
    logits2, _ = model(changed)
    torch.testing.assert_close(logits2[:, :6], logits[:, :6], rtol=0, atol=0)
    assert not torch.allclose(logits2[:, 6:], logits[:, 6:])


def test_a_sequence_longer_than_block_size_and_a_cache_fed_two_tokens_at_once_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="13 tokens after 0 cached ones: a sequence may not be longer than block_size"):
        model(torch.zeros(1, 13, dtype=torch.long))
    cache = gpt.KVCache(model.config)
    model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="after a cached prompt come one token at a time"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)  # a mask aligned to the top left would be wrong


def test_loss_at_init_is_that_of_a_uniform_guess():
    model = tiny_model(vocab_size=65, n_embd=32)
    idx = torch.randint(0, 65, (8, 12))
    _, loss = model(idx, torch.randint(0, 65, (8, 12)))
    assert abs(loss.item() - math.log(65)) < 0.1


def test_overfits_one_batch():
    model = tiny_model()
    idx = torch.randint(0, 13, (4, 12), generator=torch.Generator().manual_seed(0))
    idx[:, 0] = torch.arange(4)  # distinct first tokens: every position's context is unique, so loss can reach 0
    optimizer = gpt.configure_optimizer(model, 1e-2, 0.0, 0.99)
    for _ in range(300):
        loss = gpt.train_step(model, optimizer, [(idx[:, :-1], idx[:, 1:])])
    assert loss.item() < 0.05


# ---------------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("name", SWITCHES)
def test_kv_cache_logits_equal_full_forward(name):
    model = tiny_model(**SWITCHES[name]).eval()
    idx = torch.randint(0, 13, (2, 12))
    full, _ = model(idx)
    cache = gpt.KVCache(model.config)
    steps = [model(idx[:, :5], cache=cache)[0]]  # a prompt, then one token at a time
    steps += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.pos == 12


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_generation_equals_a_loop_of_full_forwards_past_block_size(name):
    model = tiny_model(**SWITCHES[name]).eval()
    for prompt_length in (3, 12, 15):  # shorter than the context, filling it, and past it
        idx = torch.randint(0, 13, (2, prompt_length))
        expected = idx
        for _ in range(20):  # nanoGPT's way: a full forward over the last block_size tokens for every new token
            logits, _ = model(expected[:, -12:])
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(model.generate(idx, 20, temperature=0), expected)


def test_top_k_and_top_p_keep_exactly_the_right_tokens():
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])
    logits = probs.log()
    kept = lambda **kw: torch.isfinite(gpt.filter_logits(logits, **kw))[0].tolist()
    assert kept(top_k=2) == [False, True, False, True, False]
    assert kept(top_k=99) == [True] * 5  # clamped to the vocabulary
    assert kept(top_p=0.7) == [False, True, False, True, False]  # 0.4 + 0.3 reaches 0.7
    assert kept(top_p=0.71) == [False, True, False, True, True]
    assert kept(top_p=0.01) == [False, True, False, False, False]  # the likeliest always stays
    assert kept(top_p=1e-300) == [False, True, False, False, False]  # also where float32 rounds top_p to 0
    assert kept(top_p=1.0) == [True] * 5
    assert kept(top_k=3, top_p=0.5) == [False, True, False, True, False]


def test_temperature_zero_is_greedy_a_tiny_one_tends_to_it_and_seeded_sampling_is_reproducible():
    model = tiny_model().eval()
    idx = torch.randint(0, 13, (1, 4))
    greedy = model.generate(idx, 8, temperature=0)
    logits, _ = model(greedy[:, :-1])
    assert torch.equal(greedy[0, 4:], logits[0, 3:].argmax(-1))
    for tiny in (1e-40, 1e-300, 5e-324):  # the limit, not an overflow to inf and NaN
        assert torch.equal(model.generate(idx, 8, temperature=tiny, generator=torch.Generator().manual_seed(0)), greedy)
    draw = lambda seed: model.generate(idx, 30, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")),
                                    dict(temperature=float("inf")), dict(top_k=0), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(top_p=float("nan"))])
def test_bad_sampling_arguments_are_refused_before_the_first_token(kwargs):
    tokens = tiny_model().stream(torch.zeros(1, 1, dtype=torch.long), 5, **kwargs)
    with pytest.raises(ValueError, match="sampling takes temperature >= 0"):
        next(tokens)


# ---------------------------------------------------------------------------------------------------- devices
def test_device_selection():
    assert gpt.get_device("cpu").type == "cpu"
    assert gpt.get_device().type in ("cpu", "cuda", "mps")
    for name in ["tpu", "cuda:99", "meta"] + ([] if torch.cuda.is_available() else ["cuda"]):  # meta: no values
        with pytest.raises(ValueError, match="unknown or not on this machine"):
            gpt.get_device(name)


# ---------------------------------------------------------------------------------------------------- gpt.py's loop
def test_training_writes_a_checkpoint_that_loads_with_identical_logits(tmp_path):
    log = []
    _, history = gpt.train(tiny_train_config(tmp_path), TEXT, log=log.append)
    assert [it for it, _ in history["train"]] == [it for it, _ in history["val"]] == [4, 8]
    assert log == [f"iter {it}: train loss {t:.4f}, val loss {v:.4f}"
                   for (it, t), (_, v) in zip(history["train"], history["val"])]
    model, tok, ckpt = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")
    assert ckpt["iter"] == 8 and tok.chars == "".join(sorted(set(TEXT))) and not model.training
    fresh = gpt.GPT(model.config)
    fresh.load_state_dict(ckpt["model"])
    idx = torch.tensor([tok.encode("To be, or not")])
    assert torch.equal(model(idx)[0], fresh.eval()(idx)[0])
    assert os.listdir(tmp_path / "out") == ["ckpt.pt"]


def test_an_interrupted_save_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    gpt.save_checkpoint({"a": torch.ones(3)}, path)

    def dies_mid_write(obj, f):
        Path(f).write_bytes(b"half a checkpo")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        gpt.save_checkpoint({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, where every write finds the disk full")
def test_a_full_disk_is_one_line_and_leaves_the_last_checkpoint(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=1)
    train.main(flags)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    os.symlink("/dev/full", tmp_path / "out" / "ckpt.pt.tmp")  # the next save writes there
    message = one_line_error(capsys, train, *flags, "--resume", "--max_iters", "3")
    assert "ckpt.pt: is the disk full? Any file there is left as it was (torch: " in message, message
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("name", SWITCHES)
def test_every_architecture_trains(tmp_path, name):
    tc = tiny_train_config(tmp_path, max_iters=300, eval_interval=300, learning_rate=6e-3, batch_size=16,
                           block_size=32, n_embd=32, out_dir="", **SWITCHES[name])
    _, history = gpt.train(tc, TEXT, log=quiet)
    start = math.log(len(set(TEXT)))  # the loss of a uniform guess, where training starts
    assert history["val"][-1][1] < start - 1.5, history


def test_gradient_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    x, y = torch.randint(0, 13, (2, 8, 12)).unbind(0)
    models = [tiny_model(seed=1).double() for _ in range(2)]
    optimizers = [gpt.configure_optimizer(m, 1e-2, 0.1, 0.99) for m in models]
    for _ in range(3):
        big = gpt.train_step(models[0], optimizers[0], [(x, y)], grad_clip=1.0)
        mean = gpt.train_step(models[1], optimizers[1], [(x[:2], y[:2]), (x[2:4], y[2:4]), (x[4:6], y[4:6]),
                                                        (x[6:], y[6:])], grad_clip=1.0)
        torch.testing.assert_close(mean, big, rtol=1e-12, atol=1e-12)  # the mean of the micro-batches' losses
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_a_text_too_short_for_one_block_is_refused():
    with pytest.raises(ValueError, match="too short for one block"):
        gpt.Trainer(gpt.TrainConfig(block_size=16, out_dir=""), "abcdefghij" * 10)


# ---------------------------------------------------------------------------------------------------- the harness
def test_ctrl_c_saves_and_resume_continues_exactly(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path, dropout=0.1)  # dropout: the resumed run must restore the RNG too
    straight, _ = train.run(replace(tc, out_dir=str(tmp_path / "straight")), TEXT, quiet)
    real_batch, train_batches = gpt.Trainer.batch, []

    def ctrl_c_in_step_six(self, split):
        train_batches.append(split == "train")
        if sum(train_batches) == 6 + 2 and split == "train":  # six steps' and an evaluation's two
            signal.raise_signal(signal.SIGINT)
        return real_batch(self, split)

    monkeypatch.setattr(gpt.Trainer, "batch", ctrl_c_in_step_six)
    first, stopped = train.run(tc, TEXT, quiet)
    assert stopped == signal.SIGINT and first.it == 6
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 6
    monkeypatch.setattr(gpt.Trainer, "batch", real_batch)
    second, stopped = train.run(tc, TEXT, quiet, resume=True)
    assert stopped is None and second.it == 8 and second.history["val"] == straight.history["val"][1:]
    for (name, p), q in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name  # bit for bit the weights of the run that was never stopped


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129),
                                            (signal.SIGUSR1, 138)])
def test_a_signal_saves_the_step_under_way_says_so_and_exits_non_zero(tmp_path, signum, status):
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=10 ** 6)
    proc = subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("iter 3/"):
            break
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    said = re.search(rf"{signal.Signals(signum).name}: saved iteration (\d+) to .*; continue with --resume", out)
    assert said and err == "", (out, err)
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == int(said.group(1)) >= 3


def test_a_second_signal_stops_at_once_and_the_handlers_are_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with train.signals_caught() as caught:
        signal.raise_signal(signal.SIGTERM)
        assert caught == [signal.SIGTERM]  # the first only raises the flag
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path)
    train.run(tc, TEXT, quiet)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(gpt, "train_step", lambda *args: torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="nan at iteration 9: training diverged; lower --learning_rate"):
        # resumed at 8, eval_interval 1: caught before the save that would follow iteration 9
        train.run(replace(tc, max_iters=20, eval_interval=1), TEXT, quiet, resume=True, log_interval=50)
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == before


def test_a_failed_torch_compile_is_one_line(tmp_path):
    env = dict(CXX="/no/compiler", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))  # nothing compiled is reused
    done = run_cli("train.py", *tiny_flags(tmp_path, max_iters=2), "--compile", env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert re.fullmatch(r"error: torch\.compile failed \(.+\): train without --compile\n", done.stderr), done.stderr


def test_output_going_away_neither_stops_nor_loses_training(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=200, eval_interval=100)
    proc = subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stdout.readline(), proc.stdout.readline()
    proc.stdout.close()  # python train.py | head -2
    with proc.stderr:
        assert proc.wait(timeout=120) == 0 and proc.stderr.read() == b""
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 200


def ddp_worker(rank, world, port, tc, result_dir):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    trainer, _ = train.run(tc, TEXT, quiet, resume=True)
    torch.save({"model": trainer.model.state_dict(), "history": trainer.history},
               os.path.join(result_dir, f"rank{rank}.pt"))


def test_ddp_trains_in_step_and_its_checkpoints_interchange_with_single_process(tmp_path):
    tc = tiny_train_config(tmp_path, max_iters=10, eval_interval=10, batch_size=16, block_size=32, n_embd=32,
                           learning_rate=6e-3)
    train.run(tc, TEXT, quiet)  # a single-process checkpoint at iteration 10 ...
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ddp_tc = replace(tc, max_iters=40, eval_interval=15, grad_accum=2)  # ... resumed by two processes, to 40
    torch.multiprocessing.spawn(ddp_worker, args=(2, port, ddp_tc, str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, p in ranks[0]["model"].items():
        assert torch.equal(p, ranks[1]["model"][name]), name
    losses = ranks[0]["history"]["train"]
    assert [it for it, _ in losses] == [15, 30, 40] and losses[-1][1] < losses[0][1] - 0.1, losses
    assert os.listdir(tc.out_dir) == ["ckpt.pt"]  # the first process alone wrote, and no temporary file was left
    model, _, _ = gpt.load_checkpoint(os.path.join(tc.out_dir, "ckpt.pt"), "cpu")  # no DDP prefixes in its names
    for name, p in model.state_dict().items():
        assert torch.equal(p, ranks[0]["model"][name]), name
    trainer, _ = train.run(replace(tc, max_iters=42), TEXT, quiet, resume=True)  # and one process resumes it
    assert trainer.it == 42


# ---------------------------------------------------------------------------------------------------- command lines
def test_train_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    help_text = capsys.readouterr().out
    options = [f.name for f in dataclasses.fields(gpt.TrainConfig)[1:]] + ["data", "resume", "log_interval", "compile"]
    entries = {entry.split()[0]: entry for entry in re.split(r"\n  (?=--)", help_text.split("\noptions:\n")[1])}
    for name in options:
        assert "(default:" in entries[f"--{name}"], name  # each option's own help says its default
    assert help_text.count("(default:") == len(options)


def test_train_then_sample_end_to_end(tmp_path):
    trained = run_cli("train.py", *tiny_flags(tmp_path))
    assert trained.returncode == 0 and trained.stderr == "", trained.stderr
    assert "what context buys" in trained.stdout and (tmp_path / "out" / "ckpt.pt").exists()
    sampled = run_cli("sample.py", f"--out_dir={tmp_path / 'out'}", "--temperature", "0.8", "--max_new_tokens", "40",
                      "--start", "ROMEO", "--num_samples", "2")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.count("ROMEO") == 2 and len(sampled.stdout) >= 2 * (5 + 40)
    failed = run_cli("sample.py", f"--out_dir={tmp_path / 'out'}", "--start", "\u00e9t\u00e9")
    assert failed.returncode != 0 and failed.stderr == "error: characters not in the vocabulary: '\u00e9'; use those " \
                                                       "of the training text\n"
    closed = subprocess.Popen([sys.executable, "sample.py", f"--out_dir={tmp_path / 'out'}"], cwd=HERE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    closed.stdout.read(50)
    closed.stdout.close()  # python sample.py | head -c 50
    with closed.stderr:
        assert closed.wait(timeout=60) in (0, 141) and closed.stderr.read() == b""  # quiet, as cat


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trained")
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT, quiet)
    return str(tmp_path / "out")


NUMBERS = [name for name in gpt.LIMITS if name != "vocab_size"]


@pytest.mark.parametrize("flags, match", [
    *[([f"--{name}", value], name) for name in NUMBERS for value in ("nan", "inf", "-1e30")],
    (["--seed", str(2 ** 63)], "seed must be in"),
    (["--max_iters", "1e3"], "argument --max_iters: invalid int value"),
    (["--log_interval", "0"], "argument --log_interval: must be at least 1"),
    (["--learning_rate", "1e-4"], "min_lr (0.0003) is above learning_rate (0.0001): lower min_lr too"),
    (["--nonsense", "1"], "unrecognized arguments: --nonsense"),
    (["--data", "MISSING"], "cannot read the data file"),
    (["--data", "FOLDER"], "(it is a folder): pass --data a UTF-8 text file"),
    (["--data", "/dev/zero"], "(it is not a regular file)"),  # which read() would never finish
    (["--data", "BINARY"], "it is not UTF-8 text"),
    (["--data", "EMPTY"], "is empty"),
    (["--block_size", "5000"], "too short for one block"),
    (["--n_embd", "30", "--n_head", "4"], "multiple of n_head"),
    (["--norm", "batchnorm"], "norm must be one of"),
    (["--device", "tpu"], "unknown or not on this machine"),
    (["--device", "cuda:7"], "unknown or not on this machine"),
    (["--device", "meta"], "unknown or not on this machine"),
    (["--n_embd", str(2 ** 20), "--n_head", "1"], "out of memory (["),
    (["--out_dir", "DATA/out"], "pass --out_dir a writable folder"),  # a folder inside a file
    (["--out_dir", "DATA"], "data.txt is there, and not a folder): pass --out_dir a writable folder"),
    (["--out_dir", "FOLDER"], "pass --out_dir a writable folder"),  # FOLDER/ckpt.pt is a folder
    (["--resume", "--out_dir", "FOLDER/x"], "no checkpoint file at"),
    (["--resume", "--out_dir", "NO_STATE"], "it can sample, but not resume; train without --resume"),
    (["--resume", "--data", "NEW_CHARS"], "never saw ('#'): resume on the text it was trained on (--data)"),
    ([], "holds an earlier run, which this one would overwrite: continue it with --resume, or start anew in another"),
])
def test_bad_training_input_is_one_line_and_overwrites_nothing(tmp_path, capsys, trained_dir, flags, match):
    before = {p: Path(trained_dir, p).read_bytes() for p in os.listdir(trained_dir)}
    (tmp_path / "EMPTY").write_text("")
    (tmp_path / "BINARY").write_bytes(bytes(range(256)) * 40)
    os.makedirs(tmp_path / "FOLDER" / "ckpt.pt")
    os.makedirs(tmp_path / "NO_STATE")
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    torch.save({k: v for k, v in ckpt.items() if k not in ("optimizer", "rng")}, tmp_path / "NO_STATE" / "ckpt.pt")
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    (tmp_path / "NEW_CHARS").write_text(TEXT + "#", encoding="utf-8")
    names = dict(MISSING=tmp_path / "missing.txt", FOLDER=tmp_path / "FOLDER", BINARY=tmp_path / "BINARY",
                 EMPTY=tmp_path / "EMPTY", DATA=data, NO_STATE=tmp_path / "NO_STATE", NEW_CHARS=tmp_path / "NEW_CHARS")
    flags = [re.sub("|".join(names), lambda m: str(names[m.group(0)]), f) for f in flags]
    message = one_line_error(capsys, train, "--data", str(data), "--out_dir", trained_dir, "--max_iters", "2",
                             "--block_size", "16", *flags)
    assert match in message, message
    assert {p: Path(trained_dir, p).read_bytes() for p in os.listdir(trained_dir)} == before
    assert not (tmp_path / "FOLDER" / "ckpt.pt.tmp").exists()


def test_resume_says_which_model_options_it_ignores_and_records_the_model_it_kept(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=4)
    train.main(flags)
    train.main(flags + ["--resume", "--max_iters", "6", "--n_layer", "3", "--n_embd", "64", "--pos", "learned",
                        "--n_head", "2"])  # n_head 2: as the checkpoint has it, so not ignored
    out = capsys.readouterr().out
    assert "so these are ignored: --n_layer 3, --n_embd 64, --pos learned\n" in out
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 6
    assert {k: ckpt["train_config"][k] for k in ("n_layer", "n_embd", "pos")} == \
           {k: ckpt["config"][k] for k in ("n_layer", "n_embd", "pos")} == dict(n_layer=1, n_embd=16, pos="rope")


@pytest.mark.parametrize("env, match", [
    (dict(WORLD_SIZE="2"), "without torchrun's RANK and LOCAL_RANK"),
    (dict(RANK="1"), "cannot read the data file"),  # a rank set alone: still a single process, which says what
])
def test_a_stray_distributed_environment_is_one_line(tmp_path, env, match):
    done = run_cli("train.py", "--data", str(tmp_path / "missing.txt"), "--out_dir", str(tmp_path), env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr


@pytest.mark.parametrize("flags, match", [
    *[([f"--{name}", value], f"argument --{name}: ") for name in ("temperature", "top_p")
      for value in ("nan", "inf", "-1")],
    (["--top_p", "0"], "argument --top_p: must be in (0, 1], got 0"),
    (["--top_p", "1.2"], "argument --top_p: must be in (0, 1]"),
    (["--top_p", "1e-300", "--start", "\u00e9"], "not in the vocabulary"),  # a tiny top_p is accepted
    (["--top_k", "0"], "argument --top_k: must be at least 1"),
    (["--num_samples", "0"], "argument --num_samples: must be at least 1"),
    (["--max_new_tokens", "-5"], "argument --max_new_tokens: must be at least 1"),
    (["--seed", str(2 ** 63)], "argument --seed: must be in [0, 2**32)"),
    (["--start", "\u00e9"], "characters not in the vocabulary: '\u00e9'"),
    (["--start", ""], "--start is empty: give it a character or more"),
    (["--start", "FILE:/no/such/file"], "cannot read the prompt file /no/such/file (No such file"),
    (["--start", "FILE:FOLDER"], "cannot read the prompt file"),
    (["--start", "FILE:BINARY"], "(it is not UTF-8 text): pass --start FILE:path to a UTF-8 text file"),
    (["--start", "FILE:/dev/zero"], "(it is not a regular file)"),
    (["--start", "FILE:EMPTY"], "the prompt file"),
    (["--device", "tpu"], "unknown or not on this machine"),
    (["--out_dir", "FOLDER"], "no checkpoint file at"),
    (["--out_dir", "CKPT_FOLDER"], "no checkpoint file at"),  # ckpt.pt is a folder
    # torch's message cut to its first sentence: the rest suggests weights_only=False, no help for a file of junk
    (["--out_dir", "CORRUPT"], "can load (UnpicklingError: Weights only load failed.); train a new one"),
    (["--out_dir", "MISFIT"], "is not a checkpoint this gpt.py can load (RuntimeError"),
    (["--out_dir", "TRUNCATED"], "is not a checkpoint this gpt.py can load ("),
    (["--out_dir", "EMPTY_CKPT"], "can load (EOFError); train a new one"),
    (["--out_dir", "FEW_CHARS"], "(ValueError: 5 characters for a vocab_size of"),
])
def test_bad_sampling_input_is_one_line_and_prints_nothing(tmp_path, trained_dir, capsys, flags, match):
    (tmp_path / "BINARY").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "EMPTY").write_text("")
    os.makedirs(tmp_path / "FOLDER")
    os.makedirs(tmp_path / "CKPT_FOLDER" / "ckpt.pt")
    os.makedirs(tmp_path / "CORRUPT")
    (tmp_path / "CORRUPT" / "ckpt.pt").write_bytes(b"not a checkpoint")
    os.makedirs(tmp_path / "MISFIT")
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    ckpt["config"]["n_embd"] = 32  # the weights no longer fit the model
    torch.save(ckpt, tmp_path / "MISFIT" / "ckpt.pt")
    for name in ("TRUNCATED", "EMPTY_CKPT", "FEW_CHARS"):
        os.makedirs(tmp_path / name)
    whole = Path(trained_dir, "ckpt.pt").read_bytes()
    (tmp_path / "TRUNCATED" / "ckpt.pt").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "EMPTY_CKPT" / "ckpt.pt").write_bytes(b"")
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    ckpt["chars"] = ckpt["chars"][:5]  # too few characters for the model's vocabulary
    torch.save(ckpt, tmp_path / "FEW_CHARS" / "ckpt.pt")
    flags = [re.sub("CKPT_FOLDER|FOLDER|BINARY|CORRUPT|MISFIT|EMPTY_CKPT|EMPTY|TRUNCATED|FEW_CHARS",
                    lambda m: str(tmp_path / m.group(0)), f) for f in flags]
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, *flags)
    assert match in message, message
    assert capsys.readouterr().out == ""  # refused before printing anything


def test_a_character_the_terminal_cannot_show_prints_as_an_escape(tmp_path):
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT.replace("e", "\u00e9"), quiet)
    done = run_cli("sample.py", "--out_dir", str(tmp_path / "out"), "--start", "\u00e9", "--max_new_tokens", "200",
                   env=dict(PYTHONIOENCODING="ascii"))  # an ASCII terminal
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("\\xe9"), done.stderr


def test_sampling_needs_no_prompt_when_the_text_had_no_newline(tmp_path):
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT.replace("\n", " "), quiet)
    done = run_cli("sample.py", "--out_dir", str(tmp_path / "out"), "--max_new_tokens", "20", "--temperature", "1e-300")
    assert done.returncode == 0 and done.stderr == "" and len(done.stdout) > 20, done.stderr


@pytest.mark.parametrize("flags, match", [
    (["--quality", "1", "--json", "FOLDER"], "cannot write"),  # before the run, not after it has measured for minutes
    (["--nanogpt", "FOLDER"], "no model.py in"),
    (["--nanogpt", "EXITS"], "cannot import GPT and GPTConfig from"),
])
def test_bad_bench_input_is_one_line_before_anything_is_measured(tmp_path, flags, match):
    os.makedirs(tmp_path / "FOLDER")
    os.makedirs(tmp_path / "EXITS")
    (tmp_path / "EXITS" / "model.py").write_text("import sys\nsys.exit(0)\n")
    done = run_cli("bench.py", *[str(tmp_path / f) if f.isupper() else f for f in flags])
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr
    assert "val loss" not in done.stdout


# ---------------------------------------------------------------------------------------------------- the NumPy twin
TWIN_CONFIGS = {  # B=3, T=7 < block_size=8
    "gpt2": dict(norm="layernorm", pos="learned", mlp="gelu", tie_weights=True, bias=True),
    "llama": dict(norm="rmsnorm", pos="rope", mlp="swiglu", tie_weights=False, bias=False),
    "mix": dict(norm="layernorm", pos="rope", mlp="swiglu", tie_weights=True, bias=True),
    "mix2": dict(norm="rmsnorm", pos="learned", mlp="gelu", tie_weights=False, bias=False),
}


def twin_pair(name, dtype=torch.float64):
    """A torch model with weights moved off their init values, the twin on copies of them, and a batch."""
    config = gpt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, **TWIN_CONFIGS[name])
    model = tiny_model(seed=3, **vars(config)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))  # norm gains away from 1, biases away from 0
    gen = torch.Generator().manual_seed(4)
    idx, targets = torch.randint(0, 5, (3, 7), generator=gen), torch.randint(0, 11, (3, 7), generator=gen)
    assert len(idx.unique()) < idx.numel()  # repeated tokens: their embedding gradients must add up
    twin = gpt_numpy.GPT(config, {n: p.detach().numpy().copy() for n, p in model.named_parameters()})
    return model, twin, idx, targets


def error_table(pairs):
    rows = [f"{name:32s} {np.abs(ours - ref).max() / np.abs(ref).max():.3e}" for name, ours, ref in pairs]
    return "\n".join(["tensor                           max|diff| / max|ref|"] + rows)


@pytest.mark.parametrize("name", TWIN_CONFIGS)
def test_twin_equals_pytorch_in_float64(name):
    model, twin, idx, targets = twin_pair(name)
    logits, loss = model(idx, targets)
    loss.backward()
    twin_logits, twin_loss = twin.forward(idx.numpy(), targets.numpy())
    grads = twin.backward()
    named = dict(model.named_parameters())
    assert set(grads) == set(named)
    pairs = [("logits", twin_logits, logits.detach().numpy())]
    pairs += [(n, grads[n], p.grad.numpy()) for n, p in named.items()]
    table = error_table(pairs)
    for tensor_name, ours, ref in pairs:
        assert ours.shape == ref.shape and ours.dtype == np.float64
        assert np.abs(ours - ref).max() <= 1e-10 * np.abs(ref).max(), f"{tensor_name} differs:\n{table}"
    assert abs(twin_loss - loss.item()) <= 1e-12 * abs(loss.item())


@pytest.mark.parametrize("name", TWIN_CONFIGS)
def test_twin_gradients_match_finite_differences(name):
    _, twin, idx, targets = twin_pair(name)
    idx, targets = idx.numpy(), targets.numpy()
    twin.forward(idx, targets)
    grads = twin.backward()
    rng, h = np.random.default_rng(0), 1e-5
    for tensor_name, w in twin.params.items():
        for flat in rng.choice(w.size, size=min(3, w.size), replace=False):
            i = np.unravel_index(flat, w.shape)
            saved = w[i]
            w[i] = saved + h
            up = twin.forward(idx, targets)[1]
            w[i] = saved - h
            down = twin.forward(idx, targets)[1]
            w[i] = saved
            fd, analytic = (up - down) / (2 * h), grads[tensor_name][i]
            assert abs(fd - analytic) <= 1e-5 * (abs(fd) + abs(analytic)) + 1e-8, (tensor_name, i, fd, analytic)


@pytest.mark.parametrize("name", TWIN_CONFIGS)
def test_twin_agrees_in_float32(name):
    model, twin, idx, targets = twin_pair(name, torch.float32)
    logits, loss = model(idx, targets)
    loss.backward()
    twin_logits, twin_loss = twin.forward(idx.numpy(), targets.numpy())
    grads = twin.backward()
    assert twin_logits.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    ref = logits.detach().numpy()
    np.testing.assert_allclose(twin_logits, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    for n, p in model.named_parameters():
        ref = p.grad.numpy()
        np.testing.assert_allclose(grads[n], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(), err_msg=n)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_twin_adamw_steps_match_torch(name):
    model, twin, idx, targets = twin_pair(name)
    optimizer = gpt.configure_optimizer(model, 1e-2, 0.1, 0.99)
    twin_optimizer = gpt_numpy.AdamW(twin.params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    for _ in range(5):
        loss = gpt.train_step(model, optimizer, [(idx, targets)]).item()
        twin_loss = twin.forward(idx.numpy(), targets.numpy())[1]
        twin_optimizer.step(twin.backward())
        assert abs(twin_loss - loss) <= 1e-10 * loss
    assert loss < 2.0


def test_twin_trains_and_samples():
    text = "to be or not to be that is the question. " * 20
    chars = sorted(set(text))
    data = np.array([chars.index(c) for c in text])
    config = gpt_numpy.GPTConfig(vocab_size=len(chars), block_size=16, n_layer=1, n_head=2, n_embd=32, bias=False)
    twin = gpt_numpy.GPT(config, gpt_numpy.init_params(config, seed=0, dtype=np.float64))
    optimizer = gpt_numpy.AdamW(twin.params, lr=1e-2)
    rng = np.random.default_rng(0)
    for step in range(200):
        ix = rng.integers(len(data) - 17, size=8)
        xy = np.stack([data[i:i + 17] for i in ix])
        _, loss = twin.forward(xy[:, :-1], xy[:, 1:])
        optimizer.step(twin.backward())
    assert loss < 0.25 * math.log(len(chars)), loss
    out = twin.generate(data[None, :5], 40, temperature=0)
    drawn = lambda seed: twin.generate(data[None, :5], 20, top_k=5, top_p=0.9, generator=np.random.default_rng(seed))
    assert np.array_equal(drawn(3), drawn(3)) and not np.array_equal(drawn(3), drawn(4))
    assert set("".join(chars[i] for i in out[0]).split()[:-1]) <= set(text.split())  # the last word may be cut


def test_twin_refuses_dropout_and_a_backward_without_forward():
    config = gpt_numpy.GPTConfig(**TINY)
    with pytest.raises(ValueError, match="dropout"):
        gpt_numpy.GPT(replace(config, dropout=0.1), gpt_numpy.init_params(config))
    twin = gpt_numpy.GPT(config, gpt_numpy.init_params(config))
    with pytest.raises(RuntimeError, match="needs a forward"):
        twin.backward()
    twin.forward(np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(RuntimeError, match="needs a forward"):
        twin.backward()


def test_twin_init_matches_gpt_names_and_shapes():
    for overrides in SWITCHES.values():
        config = gpt.GPTConfig(**{**TINY, **overrides})
        ours = gpt_numpy.init_params(config)
        theirs = dict(gpt.GPT(config).named_parameters())
        assert {n: w.shape for n, w in ours.items()} == {n: tuple(p.shape) for n, p in theirs.items()}


def test_twin_filter_logits_keeps_what_gpt_keeps():
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for kwargs in (dict(top_k=3), dict(top_p=0.5), dict(top_p=0.95), dict(top_k=10, top_p=0.8), dict(top_p=1.0),
                   dict(top_p=1e-300)):
        ours = np.isfinite(gpt_numpy.filter_logits(logits.numpy(), **kwargs))
        assert np.array_equal(ours, torch.isfinite(gpt.filter_logits(logits, **kwargs)).numpy()), kwargs


def test_twin_hands_back_the_gradient_at_each_activation_as_pytorch_has_it():
    model, twin, idx, targets = twin_pair("gpt2")
    outputs = {}
    for name, module in model.named_modules():
        if name.split(".")[-1] in ("tok_emb", "ln_1", "c_attn", "c_proj", "ln_2", "c_fc", "ln_f", "lm_head"):
            module.register_forward_hook(lambda m, i, out, name=name: outputs.setdefault(name, out).retain_grad())
    model(idx, targets)[1].backward()
    twin.forward(idx.numpy(), targets.numpy())
    _, d = twin.backward(activations=True)
    assert set(outputs) <= set(d) and d["loss"] == 1.0
    for name, out in outputs.items():
        np.testing.assert_allclose(d[name], out.grad.numpy(), rtol=1e-10, atol=1e-12 * out.grad.abs().max().item())


def test_the_gradient_check_passes_on_the_twin_and_names_every_layer():
    lines = []
    assert gpt_numpy.check(log=lines.append)
    table = "\n".join(lines)
    for layer in ("crossentropy", "linear", "layernorm", "rmsnorm", "gelu", "swiglu", "attention", "attention, rope",
                  "softmax", "rope", "embedding", "model (gpt2): blocks.1.mlp.c_fc.bias",
                  "model (llama): lm_head.weight"):
        assert f"\n{layer}" in table, layer
    assert not [line for line in lines[:-1] if line.endswith("WRONG")] and lines[-1].endswith(" ok, 0 WRONG")


def layernorm_without_the_mean(dout, cache, right=gpt_numpy.layernorm_backward):
    xhat, rstd, weight, has_bias = cache
    g = dout * weight
    return rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True)), right(dout, cache)[1]  # the mean's path dropped


@pytest.mark.parametrize("name, broken, first_wrong", [
    ("layernorm_backward", layernorm_without_the_mean, "layernorm: dx"),
    ("crossentropy_backward", lambda dloss, cache: (cache[0] - np.eye(cache[0].shape[-1])[cache[1]], {}),
     "crossentropy: dx"),  # the 1/N dropped
    ("gelu_backward", lambda dout, cache: (dout * 0.5 * (1 + cache[1]), {}), "gelu: dx"),  # half the product rule
    ("rope_backward", lambda dout, cache: (gpt_numpy.rope_forward(dout, *cache)[0], {}), "attention, rope: dx"),
])
def test_a_broken_backward_makes_the_check_fail_and_names_its_layer(monkeypatch, name, broken, first_wrong):
    monkeypatch.setattr(gpt_numpy, name, broken)
    lines = []
    assert not gpt_numpy.check(log=lines.append)
    assert lines[-1].endswith(f"WRONG: first {first_wrong}"), lines[-1]


def test_check_layer_checks_a_learners_own_backward():
    x = np.random.default_rng(0).standard_normal((4, 5))
    right = gpt_numpy.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * 3 * x ** 2, {}), x)
    wrong = gpt_numpy.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * 2 * x ** 2, {}), x)
    assert right["x"] < 1e-8 and wrong["x"] > 0.1


def test_check_runs_where_torch_cannot_be_imported():
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['gpt_numpy.py', '--check']; "
            "runpy.run_path('gpt_numpy.py', run_name='__main__')")
    done = run_cli("-c", code)
    assert done.returncode == 0, done.stderr
    assert "model (llama): lm_head.weight" in done.stdout and done.stdout.strip().endswith(" ok, 0 WRONG")
    closed = subprocess.Popen([sys.executable, "gpt_numpy.py", "--check"], cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    closed.stdout.readline()
    closed.stdout.close()  # python gpt_numpy.py --check | head -1
    with closed.stderr:
        assert closed.wait(timeout=60) in (0, 141) and closed.stderr.read() == b""


@pytest.mark.parametrize("content, match", [
    (None, "there is no such file"), ("FOLDER", "it is not a file"), ("/dev/zero", "it is not a file"),
    (bytes(range(256)) * 40, "it is not UTF-8 text"),
    (b"", "has 0 characters"), (b"a", "has 1 characters"), (b"hello world", "has 11 characters"),
])
def test_the_twin_demo_refuses_bad_text_in_one_line_before_training(tmp_path, content, match):
    path = tmp_path / "text"
    if content == "/dev/zero":
        path = content
    elif content == "FOLDER":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    done = run_cli("gpt_numpy.py", str(path), "--seconds", "30")
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1 and match in done.stderr, \
        done.stderr
    for bad in ("nan", "inf", "0", "-1"):
        refused = run_cli("gpt_numpy.py", "--seconds", bad)
        assert refused.returncode == 2 and "argument --seconds: " in refused.stderr and refused.stdout == ""


def interrupted(args, after_line, after_seconds=0.0):
    """Runs python args, sends it Ctrl-C once a line of its output starts with after_line (then after_seconds more);
    returns (exit status, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, *args], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell
    said = ""
    for line in proc.stdout:
        said += line
        if line.startswith(after_line):
            break
    time.sleep(after_seconds)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, said + out, err


def test_ctrl_c_ends_the_twin_demo_early_and_it_still_shows_what_it_learned(tmp_path):
    (tmp_path / "text").write_text(TEXT, encoding="utf-8")
    status, out, err = interrupted(["gpt_numpy.py", str(tmp_path / "text"), "--seconds", "600"], "step 0: loss")
    assert status == 0 and err == "", err
    assert re.search(r"Ctrl-C: training stopped .*\nafter \d+ steps at \d+ ms/step: val loss \d\.\d+\nsample:\n.{20}",
                     out, re.S), out


def test_ctrl_c_ends_bench_quality_in_one_line_and_leaves_the_last_json(tmp_path):
    (tmp_path / "text").write_text(TEXT, encoding="utf-8")
    (tmp_path / "bench.json").write_text('{"figures": "of the run before"}')
    status, out, err = interrupted(["bench.py", "--quality", "600", "--data", str(tmp_path / "text"),
                                    "--json", str(tmp_path / "bench.json")], "torch ", 3.0)
    assert status == 130 and re.fullmatch(r"SIGINT: stopped after \d+ s, so no val loss\n", err), err
    assert (tmp_path / "bench.json").read_text() == '{"figures": "of the run before"}'


def test_the_twin_demo_speaks_as_it_trains_and_needs_no_newline(tmp_path):
    (tmp_path / "text").write_text(TEXT[:3000].replace("\n", " "), encoding="utf-8")
    done = run_cli("gpt_numpy.py", str(tmp_path / "text"), "--seconds", "3")
    assert done.returncode == 0, done.stderr
    assert run_cli("gpt_numpy.py", str(tmp_path / "text"), "--seconds", "1e-9").returncode == 0  # one step at least
    out = done.stdout
    assert re.search(r"untrained, it writes: (['\"]).+\1\nstep 0: loss (\d\.\d+) \(a model that knows nothing scores "
                     r"ln\(\d+\) = \d\.\d+\)", out), out
    assert re.search(r"\d+ s: step \d+, loss \d\.\d+, \d+ ms/step", out), out
    assert re.search(r"after \d+ steps at \d+ ms/step: val loss \d\.\d+\nsample:\n.{20}", out, re.S), out
