"""Tests for gpt.py, gpt_numpy.py, train.py and sample.py. Run: python -m pytest -q"""
import ast
import math
import os
import signal
import socket
import subprocess
import sys
from dataclasses import replace

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
    "gpt2": dict(),
    "llama": dict(norm="rmsnorm", pos="rope", mlp="swiglu", tie_weights=False, bias=False),
    "mix": dict(norm="layernorm", pos="rope", mlp="gelu", tie_weights=False, bias=True),
    "mix2": dict(norm="rmsnorm", pos="learned", mlp="swiglu", tie_weights=True, bias=True),
}
TEXT = open(os.path.join(HERE, "input.txt"), encoding="utf-8").read()[:30_000]


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return gpt.GPT(gpt.GPTConfig(**{**TINY, **overrides}))


def tiny_train_config(tmp_path, **overrides):
    data = tmp_path / "data.txt"
    if not data.exists():
        data.write_text(TEXT, encoding="utf-8")
    return gpt.TrainConfig(**{**dict(data=str(data), out_dir=str(tmp_path / "out"), max_iters=8, eval_interval=4,
                                     eval_iters=2, log_interval=1, batch_size=4, block_size=16, n_layer=1, n_head=2,
                                     n_embd=16, warmup_iters=2, device="cpu"), **overrides})


def quiet(*args, **kwargs):
    pass


# ---------------------------------------------------------------------------------------------------- files
def test_imports_stand_alone_and_importing_does_nothing(tmp_path):
    for name, allowed in (("gpt.py", {"torch"}), ("gpt_numpy.py", {"numpy"})):
        tree = ast.parse(open(os.path.join(HERE, name), encoding="utf-8").read())
        modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert modules - sys.stdlib_module_names <= allowed, (name, modules)
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); state = lambda: (torch.get_default_dtype(), "
            "torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32, torch.initial_seed()); "
            "before = state(); import gpt; assert state() == before")
    done = subprocess.run([sys.executable, "-c", code, HERE], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stderr
    assert list(tmp_path.iterdir()) == []  # no file written


# ---------------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip_and_unknown_characters():
    tok = gpt.CharTokenizer("hello world")
    assert tok.chars == " dehlorw" and tok.vocab_size == 8
    assert tok.decode(tok.encode("world hello")) == "world hello"
    with pytest.raises(ValueError, match="'Qz'"):
        tok.encode("hello Qz")


# ---------------------------------------------------------------------------------------------------- config and model
@pytest.mark.parametrize("bad, message", [
    (dict(n_embd=30, n_head=4), "multiple of n_head"),
    (dict(n_embd=18, n_head=6, pos="rope"), "must be even"),
    (dict(norm="batchnorm"), "norm must be one of"),
    (dict(pos="alibi"), "pos must be one of"),
    (dict(mlp="relu"), "mlp must be one of"),
    (dict(n_layer=0), "n_layer must be at least 1"),
    (dict(vocab_size=0), "vocab_size must be at least 1"),
    (dict(dropout=1.0), "dropout"),
])
def test_bad_config_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        gpt.GPTConfig(**{**TINY, **bad})


def test_gpt2_small_has_the_published_parameter_count():
    with torch.device("meta"):  # the shapes without the memory
        model = gpt.GPT(gpt.GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    assert model.num_params() == 124_439_808
    assert model.num_params(non_embedding=True) == 124_439_808 - 50257 * 768 - 1024 * 768


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


def test_sequence_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="longer than block_size"):
        tiny_model()(torch.zeros(1, 13, dtype=torch.long))


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
    kv_cache = [[] for _ in model.blocks]
    steps = [model(idx[:, :5], kv_cache=kv_cache)[0]]  # a prompt, then one token at a time
    steps += [model(idx[:, t:t + 1], kv_cache=kv_cache)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_equals_a_loop_of_full_forwards_past_block_size(name):
    model = tiny_model(**SWITCHES[name]).eval()
    idx = torch.randint(0, 13, (2, 3))
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
    assert kept(top_p=1.0) == [True] * 5
    assert kept(top_k=3, top_p=0.5) == [False, True, False, True, False]


def test_temperature_zero_is_greedy_and_seeded_sampling_is_reproducible():
    model = tiny_model().eval()
    idx = torch.randint(0, 13, (1, 4))
    greedy = model.generate(idx, 8, temperature=0)
    logits, _ = model(greedy[:, :-1])
    assert torch.equal(greedy[0, 4:], logits[0, 3:].argmax(-1))
    draw = lambda seed: model.generate(idx, 30, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "temperature"), (dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
])
def test_bad_sampling_arguments_are_refused_before_sampling(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model().stream(torch.zeros(1, 1, dtype=torch.long), 5, **kwargs)


# ---------------------------------------------------------------------------------------------------- devices
def test_device_selection():
    assert gpt.get_device("cpu").type == "cpu"
    assert gpt.get_device().type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="unknown device"):
        gpt.get_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            gpt.get_device("cuda")


# ---------------------------------------------------------------------------------------------------- checkpoints and training
def test_training_writes_a_checkpoint_that_loads_with_identical_logits(tmp_path):
    _, history = gpt.train(tiny_train_config(tmp_path), log=quiet)
    assert [it for it, _ in history["train"]] == list(range(1, 9)) and len(history["val"]) == 2
    model, tok = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 8 and tok.chars == "".join(sorted(set(TEXT)))
    fresh = gpt.GPT(model.config)
    fresh.load_state_dict(ckpt["model"])
    idx = torch.tensor([tok.encode("To be, or not")])
    assert torch.equal(model(idx)[0], fresh.eval()(idx)[0])
    assert not (tmp_path / "out" / "ckpt.pt.tmp").exists()


def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    gpt.save_checkpoint({"a": torch.ones(3)}, path)

    def dies_mid_write(obj, f):
        open(f, "wb").write(b"half a checkpo")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        gpt.save_checkpoint({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))


def test_ctrl_c_saves_and_resume_continues_exactly(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path, dropout=0.1)  # dropout: the resumed run must restore the RNG too
    _, straight = gpt.train(replace(tc, out_dir=str(tmp_path / "straight")), log=quiet)

    real_get_batch, calls = gpt.get_batch, []

    def ctrl_c_in_step_six(*args):
        calls.append(1)
        if len(calls) == 6 + 2 * 2:  # six training batches and one evaluation of two batches per split
            signal.raise_signal(signal.SIGINT)
        return real_get_batch(*args)

    monkeypatch.setattr(gpt, "get_batch", ctrl_c_in_step_six)
    _, first = gpt.train(tc, log=quiet)
    assert [it for it, _ in first["train"]] == list(range(1, 7))
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 6
    monkeypatch.setattr(gpt, "get_batch", real_get_batch)
    _, second = gpt.train(replace(tc, resume=True), log=quiet)
    assert first["train"] + second["train"] == straight["train"]
    assert second["val"] == straight["val"][1:]


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path)
    gpt.train(tc, log=quiet)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(gpt, "train_step", lambda *args: torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="nan at iteration 1: training diverged"):
        gpt.train(tc, log=quiet)
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("name", SWITCHES)
def test_every_architecture_trains(tmp_path, name):
    tc = tiny_train_config(tmp_path, max_iters=300, eval_interval=300, log_interval=10, learning_rate=6e-3,
                           batch_size=16, block_size=32, n_embd=32, **SWITCHES[name])
    _, history = gpt.train(tc, log=quiet)
    start = math.log(len(set(TEXT)))  # the loss of a uniform guess, where training starts
    assert history["val"][-1][1] < start - 1.5, history


def test_gradient_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    x, y = torch.randint(0, 13, (2, 8, 12)).unbind(0)
    models = [tiny_model(seed=1).double() for _ in range(2)]
    optimizers = [gpt.configure_optimizer(m, 1e-2, 0.1, 0.99) for m in models]
    for _ in range(3):
        gpt.train_step(models[0], optimizers[0], [(x, y)], grad_clip=1.0)
        gpt.train_step(models[1], optimizers[1], [(x[:2], y[:2]), (x[2:4], y[2:4]), (x[4:6], y[4:6]), (x[6:], y[6:])],
                       grad_clip=1.0)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def ddp_worker(rank, world, port, tc, result_dir):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    model, history = gpt.train(tc, log=quiet)
    torch.save({"model": model.state_dict(), "history": history}, os.path.join(result_dir, f"rank{rank}.pt"))


def test_ddp_trains_in_step_and_its_checkpoints_interchange_with_single_process(tmp_path):
    tc = tiny_train_config(tmp_path, max_iters=10, eval_interval=10, log_interval=5, batch_size=16, block_size=32,
                           n_embd=32, learning_rate=6e-3)
    gpt.train(tc, log=quiet)  # a single-process checkpoint at iteration 10 ...
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ddp_tc = replace(tc, resume=True, max_iters=40, grad_accum=2)  # ... resumed by two processes, to 40
    torch.multiprocessing.spawn(ddp_worker, args=(2, port, ddp_tc, str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, p in ranks[0]["model"].items():
        assert torch.equal(p, ranks[1]["model"][name]), name
    losses = [loss for _, loss in ranks[0]["history"]["train"]]
    assert [it for it, _ in ranks[0]["history"]["train"]] == [15, 20, 25, 30, 35, 40]
    assert losses[-1] < losses[0] - 0.2, losses
    assert os.listdir(tc.out_dir) == ["ckpt.pt"]  # rank 0 alone wrote, and no temporary file was left
    model, _ = gpt.load_checkpoint(os.path.join(tc.out_dir, "ckpt.pt"), "cpu")  # no DDP prefixes in its names
    for name, p in model.state_dict().items():
        assert torch.equal(p, ranks[0]["model"][name]), name
    _, history = gpt.train(replace(tc, resume=True, max_iters=42), log=quiet)  # and one process resumes it
    assert [it for it, _ in history["train"]] == [42]


# ---------------------------------------------------------------------------------------------------- command lines
def run_main(module, monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", [module.__name__ + ".py", *args])
    module.main()


def test_train_help_lists_every_option_with_its_default(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_main(train, monkeypatch, "--help")
    help_text = capsys.readouterr().out
    for name in gpt.TrainConfig.__dataclass_fields__:
        assert f"--{name}" in help_text
    assert help_text.count("(default:") == len(gpt.TrainConfig.__dataclass_fields__)


def test_train_then_sample_end_to_end(tmp_path):
    tc = tiny_train_config(tmp_path)
    flags = [f"--{k}={v}" for k, v in vars(tc).items() if k not in ("resume", "compile")]
    run = lambda *cmd: subprocess.run([sys.executable, *cmd], cwd=HERE, capture_output=True, text=True, timeout=120)
    trained = run("train.py", *flags)
    assert trained.returncode == 0, trained.stderr
    assert "what context buys" in trained.stdout and (tmp_path / "out" / "ckpt.pt").exists()
    sampled = run("sample.py", f"--out_dir={tc.out_dir}", "--temperature", "0.8", "--max_new_tokens", "40",
                  "--start", "ROMEO", "--num_samples", "2")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.count("ROMEO") == 2 and len(sampled.stdout) >= 2 * (5 + 40)
    failed = run("sample.py", f"--out_dir={tc.out_dir}", "--start", "\u00e9t\u00e9")
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert failed.stderr.strip() == "error: characters not in the vocabulary: '\u00e9'; use only characters of the " \
                                    "training text"


def expect_one_line_error(capsys, run, match):
    with pytest.raises(SystemExit) as exit_info:
        run()
    message = str(exit_info.value.code)
    assert exit_info.value.code != 0 and message.startswith("error: ") and "\n" not in message
    assert match in message, message


@pytest.mark.parametrize("flags, match", [
    (["--data", "missing.txt"], "cannot read the data file"),
    (["--data", "EMPTY"], "is empty"),
    (["--block_size", "5000"], "split of"),
    (["--n_embd", "30", "--n_head", "4"], "multiple of n_head"),
    (["--norm", "batchnorm"], "norm must be one of"),
    (["--device", "tpu"], "unknown device"),
    (["--device", "cuda:7"], "not available"),
    (["--batch_size", "0"], "batch_size must be > 0"),
    (["--out_dir", "DATA/out"], "pass --out_dir a writable one"),  # a folder inside a file
])
def test_bad_training_input_is_one_line_and_overwrites_nothing(tmp_path, monkeypatch, capsys, flags, match):
    tc = tiny_train_config(tmp_path)
    gpt.train(tc, log=quiet)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    (tmp_path / "EMPTY").write_text("")
    flags = [f.replace("EMPTY", str(tmp_path / "EMPTY")).replace("DATA", tc.data) for f in flags]
    expect_one_line_error(capsys, lambda: run_main(train, monkeypatch, "--data", tc.data, "--out_dir", tc.out_dir,
                                                   "--max_iters", "2", "--block_size", "16", *flags), match)
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == before


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trained")
    tc = tiny_train_config(tmp_path, max_iters=2)
    gpt.train(tc, log=quiet)
    return tc.out_dir


@pytest.mark.parametrize("flags, match", [
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top_k", "0"], "top_k must be at least 1"),
    (["--top_p", "0"], "top_p must be in (0, 1]"),
    (["--top_p", "1.2"], "top_p must be in (0, 1]"),
    (["--start", "\u00e9"], "characters not in the vocabulary: '\u00e9'"),
    (["--start", ""], "the prompt is empty"),
    (["--start", "FILE:/no/such/file"], "No such file"),
    (["--device", "tpu"], "unknown device"),
])
def test_bad_sampling_input_is_one_line(trained_dir, monkeypatch, capsys, flags, match):
    expect_one_line_error(capsys, lambda: run_main(sample, monkeypatch, "--out_dir", trained_dir, *flags), match)
    assert capsys.readouterr().out == ""  # refused before printing anything


def test_missing_corrupt_and_incompatible_checkpoints_are_one_line(tmp_path, monkeypatch, capsys, trained_dir):
    expect_one_line_error(capsys, lambda: run_main(sample, monkeypatch, "--out_dir", str(tmp_path)),
                          "train one first with python train.py")
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    expect_one_line_error(capsys, lambda: run_main(sample, monkeypatch, "--out_dir", str(tmp_path)),
                          "is not a checkpoint this gpt.py can load")
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    ckpt["config"]["n_embd"] = 32  # the weights no longer fit the model
    torch.save(ckpt, tmp_path / "ckpt.pt")
    expect_one_line_error(capsys, lambda: run_main(sample, monkeypatch, "--out_dir", str(tmp_path)),
                          "is not a checkpoint this gpt.py can load (RuntimeError")


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
    assert set("".join(chars[i] for i in out[0]).split()) <= set(text.split())


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
