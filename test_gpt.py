"""Tests for gpt.py, gpt_numpy.py, cli.py, train.py, sample.py, report.py and bench.py.
Run: python -m pytest -q

A timeout here only catches a hang: every one is minutes, far beyond what a slow, busy machine takes.
"""
import ast
import dataclasses
import importlib.util
import io
import json
import math
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tokenize
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import bench
import cli
import gpt
import gpt2
import gpt_numpy
import muon
import report
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
FIXTURE = os.path.join(HERE, "fixtures", "tiny_gpt2")
# A limit for a subprocess: it only catches a hang.
HANG = 600


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
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=HANG,
                          env=None if env is None else {**os.environ, **env}, **kwargs)


def one_line_error(capsys, module, *args):
    """Runs module.main(args) in this process; returns its one-line error, after checking that it is one."""
    with pytest.raises(SystemExit) as exit_info:
        module.main(list(args))
    code = exit_info.value.code
    message = code if isinstance(code, str) else capsys.readouterr().err.strip()
    assert code not in (0, None) and message and "\n" not in message.strip() and "Traceback" not in message, message
    return message


# ---------------------------------------------------------------------------------------------------- the files
def code_lines(source):
    """The lines of code as issue 15 counts them: those holding a token other than a comment, outside the docstrings
    of the module, its classes and functions."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings |= set(range(body[0].lineno, body[0].end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines |= set(range(token.start[0], token.end[0] + 1)) - docstrings
    return lines


def test_code_lines_counts_code_alone():
    source = ('"""doc\nstring"""\n# a comment\nx = 1  # (shape)\n\n'
              'def f():\n    """doc"""\n    return (1,\n            2)\n')
    assert sorted(code_lines(source)) == [4, 6, 8, 9]


# The design card asks for at most 320 lines of code in gpt.py and 480 in all (wc -l). Holding the card's list alone,
# Muon included, with every rule of plain lines, it has 380 and 581: these numbers may only go down.
GPT_PY_CODE_LINES = 380
GPT_PY_LINES = 581


def test_gpt_py_is_plain():
    source = Path(HERE, "gpt.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert len(code_lines(source)) <= GPT_PY_CODE_LINES and len(source.splitlines()) <= GPT_PY_LINES
    # The reference states the size as it is.
    stated = f"`gpt.py` has **{len(code_lines(source))} lines of code** and {len(source.splitlines())} lines in all"
    assert stated in Path(HERE, "docs", "reference.md").read_text(encoding="utf-8")
    packed = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple)]
    assert len(packed) <= 2, packed  # a, b = x, y of unrelated values
    chained = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.IfExp)
               and (isinstance(node.body, ast.IfExp) or isinstance(node.orelse, ast.IfExp))]
    assert not chained, chained
    assert not [i for i, line in enumerate(source.splitlines(), 1) if line.rstrip().endswith("\\")]
    lines = source.splitlines()
    # A comment at the end of a code line is a shape, as after every reshape; any other is a sentence above the code.
    trailing = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT and lines[token.start[0] - 1][:token.start[1]].strip()
                and not token.string.startswith("# (")]
    assert not trailing, trailing
    # A docstring is a line or two.
    long_docstrings = [node.name if hasattr(node, "name") else "the module" for node in ast.walk(tree)
                       if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                       and (ast.get_docstring(node, clean=False) or "").count("\n") >= 2]
    assert not long_docstrings, long_docstrings


def test_lines_are_at_most_100_characters_in_the_files_people_read_and_120_elsewhere():
    for path in sorted(Path(HERE).glob("*.py")) + sorted(Path(HERE, "fixtures").glob("*.py")):
        limit = 100 if path.name in ("gpt.py", "gpt_numpy.py", "muon.py") else 120
        wide = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > limit]
        assert not wide, (path.name, wide)


def test_gpt_py_stands_alone_and_importing_it_does_nothing(tmp_path):
    source = Path(HERE, "gpt.py").read_text(encoding="utf-8")
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
    done = subprocess.run([sys.executable, "-c", code, HERE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=HANG)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stderr
    assert list(tmp_path.iterdir()) == []  # no file written


def test_the_project_speaks_of_itself_alone():
    outside = "/".join(["..", "shared"])  # the folder beside a checkout, which a user does not have
    for path in [*Path(HERE).glob("*.py"), Path(HERE, "README.md"), *Path(HERE, "docs").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        assert outside not in text, path.name
        if path.suffix == ".md":
            assert not re.search(r"\bsessions?\b|was lent|were lent", text), path.name


def test_the_readme_is_read_in_five_minutes_and_the_docs_it_links_to_exist():
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    assert len(readme) <= 15_000
    links = re.findall(r"\]\((docs/[^)]+)\)", readme)
    assert links and all(Path(HERE, link).is_file() for link in links), links


def readme_block(heading):
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", readme[readme.index(heading):], re.S).group(1)


def test_the_readme_block_runs_in_a_folder_with_only_gpt_py_and_input_txt(tmp_path):
    for name in ("gpt.py", "input.txt"):
        shutil.copy(os.path.join(HERE, name), tmp_path / name)
    block = readme_block("## Using it from your own code")
    done = run_cli("-c", block, cwd=tmp_path, env={"PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert re.search(r"iter 100: train loss [\d.]+, val loss [\d.]+ \([\d.]+ bits per character\)\niter 200: ",
                     done.stdout), done.stdout  # trained
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 200  # saved
    sample_text = done.stdout.split("\n", 2)[2]
    assert sample_text.startswith("ROMEO:") and len(sample_text) >= 206  # loaded and sampled
    assert sorted(os.listdir(tmp_path)) == ["gpt.py", "input.txt", "out"]


def test_the_readme_block_on_your_own_tokens_runs_with_gpt_py_alone(tmp_path):
    shutil.copy(os.path.join(HERE, "gpt.py"), tmp_path / "gpt.py")
    block = readme_block("### Your own tokens")
    done = run_cli("-c", block, cwd=tmp_path, env={"PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "iter 100: train loss" in done.stdout and "bits per character" not in done.stdout, done.stdout
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["chars"] is None and ckpt["tokenizer"] == "bytes" and ckpt["config"]["vocab_size"] == 256


# ---------------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip():
    tok = gpt.CharTokenizer("hello world")
    assert tok.chars == " dehlorw" and tok.vocab_size == 8
    assert tok.decode(tok.encode("world hello")) == "world hello"


# ---------------------------------------------------------------------------------------------------- config and model
@pytest.mark.parametrize("bad, message", [
    (dict(n_embd=30, n_head=4, pos="learned"), r"n_embd \(30\) must be a multiple of 4: of n_head \(4\), twice"),
    (dict(n_embd=18, n_head=6), r"n_embd \(18\) must be a multiple of 12: of n_head \(6\), twice that with pos='rope'"),
    (dict(n_head=0), r"n_head must be in \[1, inf\), not 0"),  # not a ZeroDivisionError
    (dict(vocab_size=0), r"vocab_size must be in \[1, inf\), not 0"),  # not an empty model
    (dict(n_layer=float("nan")), "n_layer must be of type int, not nan"),
    (dict(block_size=-3), r"block_size must be in \[1, inf\), not -3"),
    (dict(n_embd=0), r"n_embd must be in \[1, inf\)"),
    (dict(norm="batchnorm"), "norm must be one of rmsnorm, layernorm, not 'batchnorm'$"),
    (dict(pos="alibi"), "pos must be one of"),
    (dict(mlp="relu"), "mlp must be one of"),
    (dict(dropout=float("nan")), r"dropout must be in \[0, 1\), not nan"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\), not 1.0"),
])
def test_a_config_against_the_models_own_invariants_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        gpt.TrainConfig(**{**TINY, **bad})  # GPTConfig's checks, inherited


def test_a_train_config_gives_the_models_config_with_changes():
    tc = gpt.TrainConfig(n_layer=3, pos="learned", max_iters=7)
    config = tc.model_config(vocab_size=99)
    assert type(config) is gpt.GPTConfig and config.vocab_size == 99
    assert (config.n_layer, config.pos, config.block_size) == (3, "learned", tc.block_size)


def test_a_learning_rate_that_stays_flat_is_allowed():
    tc = gpt.TrainConfig(learning_rate=1e-4, min_lr=1e-4, warmup_iters=0, max_iters=10)
    assert [gpt.lr_at(tc, it, 0.0) for it in range(10)] == pytest.approx([1e-4] * 10)


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
    with pytest.raises(ValueError, match=r"13 tokens after 0 cached ones: at most block_size \(12\) in all"):
        model(torch.zeros(1, 13, dtype=torch.long))
    cache = gpt.KVCache(model.config)
    model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="one at a time after a cache$"):
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
    optimizer = gpt.configure_optimizers(model, gpt.TrainConfig(learning_rate=1e-2, weight_decay=0.0))
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
    cache.reset()
    assert cache.pos == 0
    torch.testing.assert_close(model(idx[:, :5], cache=cache)[0], full[:, :5], rtol=1e-5, atol=1e-5)


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
    assert torch.equal(model.generate(idx, 0), idx)  # no new token asked for, none drawn


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")),
                                    dict(temperature=float("inf")), dict(top_k=0), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(top_p=float("nan")), dict(max_new_tokens=-1)])
def test_bad_sampling_arguments_are_refused_before_the_first_token(kwargs):
    kwargs = {"max_new_tokens": 5, **kwargs}
    tokens = tiny_model().stream(torch.zeros(1, 1, dtype=torch.long), **kwargs)
    with pytest.raises(ValueError, match="sampling takes max_new_tokens >= 0, temperature >= 0"):
        next(tokens)


@pytest.mark.parametrize("prompt", [torch.zeros(3, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long),
                                    torch.zeros(0, 3, dtype=torch.long), torch.tensor([[1, 13]]), torch.tensor([[-1]]),
                                    torch.zeros(1, 2, 2, dtype=torch.long)])
def test_a_prompt_that_is_not_batch_by_tokens_of_ids_in_the_vocabulary_says_what_to_do(prompt):
    with pytest.raises(ValueError, match=r"the prompt must be \(batch, tokens\) ids in \[0, 13\)$"):
        tiny_model().generate(prompt, 5)


# ---------------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("name", SWITCHES)
def test_the_attention_weights_times_v_are_what_the_fused_attention_returns(name):
    model = tiny_model(**SWITCHES[name]).eval()
    idx = torch.randint(0, 13, (2, 10))
    inputs, fused = [], []
    for block in model.h:  # what each block's attention was given, and what its fused path returned
        block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[:2]))
        block.attn.c_proj.register_forward_pre_hook(lambda module, args: fused.append(args[0]))
    model(idx)
    maps = report.attention(model, idx)
    assert maps.shape == (2, 2, 2, 10, 10)  # (n_layer, B, n_head, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 2, 10))  # each row a distribution
    assert torch.all(maps.triu(1) == 0)  # none on later positions
    for layer, block in enumerate(model.h):
        _, _, v = report.queries_keys_values(block.attn, *inputs[layer])
        weighted = (maps[layer] @ v).transpose(1, 2).reshape(2, 10, 16)  # (B, T, C)
        torch.testing.assert_close(weighted, fused[layer], rtol=1e-5, atol=1e-6)


def test_the_twin_forms_the_same_attention_weights():
    model, twin, idx, _ = twin_pair("llama")
    twin.forward(idx.numpy(), idx.numpy())
    maps = report.attention(model, idx)
    for layer in range(2):
        np.testing.assert_allclose(twin.saved[f"h.{layer}.attn"].att, maps[layer].numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------------- devices
def test_device_selection():
    assert gpt.get_device("cpu").type == "cpu"
    assert gpt.get_device().type in ("cpu", "cuda", "mps")
    assert cli.usable_device("cpu").type == "cpu"
    for name in ["tpu", "cuda:99", "meta"] + ([] if torch.cuda.is_available() else ["cuda"]):  # meta: no values
        with pytest.raises(ValueError, match="unknown or not on this machine"):
            cli.usable_device(name)


# ---------------------------------------------------------------------------------------------------- gpt.py's loop
def test_training_writes_a_checkpoint_that_loads_with_identical_logits(tmp_path):
    log = []
    _, history = gpt.train(tiny_train_config(tmp_path), TEXT, log=log.append)
    assert [h["iter"] for h in history] == [4, 8]
    assert all(h["lr"] > 0 and h["seconds"] > 0 for h in history)
    assert log == [f"iter {h['iter']}: train loss {h['train']:.4f}, val loss {h['val']:.4f} "
                   f"({h['val'] / math.log(2):.3f} bits per character)" for h in history]
    model, tok, ckpt = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")
    assert ckpt["iter"] == 8 and tok.chars == "".join(sorted(set(TEXT))) and not model.training
    assert ckpt["history"] == history and ckpt["tokenizer"] is None  # a CharTokenizer is recorded by its chars
    fresh = gpt.GPT(model.config)
    fresh.load_state_dict(ckpt["model"])
    idx = torch.tensor([tok.encode("To be, or not")])
    assert torch.equal(model(idx)[0], fresh.eval()(idx)[0])
    assert os.listdir(tmp_path / "out") == ["ckpt.pt"]


def test_the_held_out_split_is_the_last_tenth_of_the_tokens():
    ids = torch.arange(1000) % 7
    trainer = gpt.Trainer(gpt.TrainConfig(out_dir="", block_size=16, vocab_size=7, device="cpu"), ids)
    assert len(trainer.splits["train"]) == 900 and torch.equal(trainer.splits["val"], ids[900:])
    assert trainer.model.config.vocab_size == 7 and trainer.tokenizer is None


def test_an_interrupted_save_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    gpt.save_checkpoint({"a": torch.ones(3)}, path)

    def dies_mid_write(obj, f):
        f.write(b"half a checkpo")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        gpt.save_checkpoint({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_save_checkpoint_makes_a_missing_folder(tmp_path):
    path = tmp_path / "not" / "yet" / "ckpt.pt"
    gpt.save_checkpoint({"a": torch.ones(2)}, str(path))
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(2))


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


@pytest.mark.parametrize("name", SWITCHES)
def test_every_architecture_trains(tmp_path, name):
    tc = tiny_train_config(tmp_path, max_iters=300, eval_interval=300, learning_rate=6e-3, batch_size=16,
                           block_size=32, n_embd=32, out_dir="", **SWITCHES[name])
    _, history = gpt.train(tc, TEXT, log=quiet)
    start = math.log(len(set(TEXT)))  # the loss of a uniform guess, where training starts
    assert history[-1]["val"] < start - 1.5, history


def test_gradient_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    x, y = torch.randint(0, 13, (2, 8, 12)).unbind(0)
    models = [tiny_model(seed=1).double() for _ in range(2)]
    optimizers = [gpt.configure_optimizers(m, gpt.TrainConfig(learning_rate=1e-2, optimizer="adamw")) for m in models]
    for _ in range(3):
        big = gpt.train_step(models[0], optimizers[0], [(x, y)], grad_clip=1.0)
        mean = gpt.train_step(models[1], optimizers[1], [(x[:2], y[:2]), (x[2:4], y[2:4]), (x[4:6], y[4:6]),
                                                        (x[6:], y[6:])], grad_clip=1.0)
        torch.testing.assert_close(mean, big, rtol=1e-12, atol=1e-12)  # the mean of the micro-batches' losses
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


class ByteTokenizer:
    """A tokenizer of another kind than gpt.py's: one token per UTF-8 byte."""
    name = "bytes"
    vocab_size = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_a_tokenizer_of_your_own_trains_saves_loads_and_samples(tmp_path):
    tc = tiny_train_config(tmp_path, max_iters=4, eval_interval=2)
    model, history = gpt.train(tc, TEXT, tokenizer=ByteTokenizer(), log=quiet)
    assert model.config.vocab_size == 256 and len(history) == 2
    loaded, tokenizer, ckpt = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")
    assert tokenizer is None and ckpt["chars"] is None and ckpt["tokenizer"] == "bytes"  # you keep your own
    prompt = torch.tensor([ByteTokenizer().encode("ROMEO:")])
    ids = loaded.generate(prompt, 20, generator=torch.Generator().manual_seed(0))
    assert ByteTokenizer().decode(ids[0].tolist()).startswith("ROMEO:")


def test_a_memmap_of_uint16_ids_trains_without_being_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "train.bin"
    np.array([i % 300 for i in range(20_000)], dtype=np.uint16).tofile(path)
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    read = []
    real = gpt.as_tensor
    monkeypatch.setattr(gpt, "as_tensor", lambda rows: read.append(len(rows)) or real(rows))
    tc = tiny_train_config(tmp_path, vocab_size=300, max_iters=4, eval_interval=4)
    model, history = gpt.train(tc, ids, log=quiet)
    assert model.config.vocab_size == 300 and history[-1]["val"] < math.log(300) + 0.5
    assert max(read) == tc.block_size + 1  # a row at a time: the memmap was never converted whole


@pytest.mark.parametrize("ids, vocab_size, match", [
    (np.array([0, 5, 13] * 400, dtype=np.uint8), 13, r"token ids must be in \[0, 13\), the vocabulary; these go from 0 "
                                                      r"to 13:"),
    (np.array([0, -1, 3] * 400, dtype=np.int32), 13, "these go from -1 to 3"),
    (np.array([0, 2 ** 62], dtype=np.int64), None, "the largest token id, 4,611,686,018,427,387,904, implies a"),
    (np.array([0, 2 ** 32 - 1], dtype=np.uint32), None, "implies a vocabulary of 4,294,967,296, beyond the 1,048,576"),
])
def test_ids_outside_the_vocabulary_or_too_large_for_any_are_refused_in_one_line(ids, vocab_size, match):
    with pytest.raises(ValueError, match=match):
        cli.check_ids(ids, vocab_size or cli.implied_vocab_size(ids))


def test_a_list_of_ids_as_encode_returns_them_trains(tmp_path):
    ids = ByteTokenizer().encode(TEXT[:3000])
    model, history = gpt.train(tiny_train_config(tmp_path, vocab_size=256, out_dir="", max_iters=2,
                                                 eval_interval=2), ids, log=quiet)
    assert model.config.vocab_size == 256 and len(history) == 1


def test_a_new_run_saves_its_start_before_its_first_step(tmp_path, monkeypatch):
    steps = []
    real = gpt.train_step
    monkeypatch.setattr(gpt, "train_step", lambda *args: steps.append(1) or real(*args))

    def save_then_stop(self):
        gpt.Trainer.save(self)
        raise KeyboardInterrupt
    monkeypatch.setattr(train.Run, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train.run(tiny_train_config(tmp_path), TEXT, quiet)
    assert not steps and torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 0


def test_weights_that_turn_nan_are_never_saved(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path)
    trainer = gpt.Trainer(tc, TEXT, log=quiet)
    trainer.save()
    steps = trainer.steps()
    for _ in range(3):
        next(steps)  # three steps: the fourth turns the weights NaN, and the first save follows it
    real = gpt.train_step

    def clipped_inf(model, *args):  # the loss read before an update that turns the weights NaN
        loss = real(model, *args)
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))
        return loss

    monkeypatch.setattr(gpt, "train_step", clipped_inf)
    with pytest.raises(ValueError, match=r"the weights turned NaN or inf at iteration 4, and were not saved"):
        for _ in range(4):
            next(steps)
    kept = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)  # the last good one: the run's start
    assert kept["iter"] == 0 and all(t.isfinite().all() for t in kept["model"].values())


def test_a_checkpoint_holds_all_that_resuming_needs_and_restore_goes_on_exactly(tmp_path):
    tc = tiny_train_config(tmp_path, dropout=0.1)  # dropout: the random states must come back too
    straight = gpt.Trainer(replace(tc, out_dir=""), TEXT, log=quiet)
    for _ in straight.steps():
        pass
    first = gpt.Trainer(tc, TEXT, log=quiet)
    for trainer in first.steps():
        if trainer.it == 5:
            trainer.save()
            break
    model, tokenizer, ckpt = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")
    second = gpt.Trainer(replace(tc, out_dir=""), TEXT, tokenizer, model.train(), log=quiet)
    cli.restore(second, ckpt)
    assert (second.it, second.elapsed, second.history) == (5, first.elapsed, first.history)
    for _ in second.steps():
        pass
    for (name, p), q in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name  # bit for bit the run that was never stopped


def test_a_loaded_state_brings_the_moments_and_keeps_the_runs_own_hyperparameters(tmp_path):
    tc = tiny_train_config(tmp_path)
    first = gpt.Trainer(tc, TEXT, log=quiet)
    next(first.steps())
    first.save()
    second = gpt.Trainer(replace(tc, weight_decay=0.5, beta2=0.9), TEXT, log=quiet)
    cli.restore(second, torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True))
    assert [g["weight_decay"] for g in second.optimizers[0].param_groups] == [0.5, 0.0]
    assert all(g["betas"] == (0.9, 0.9) for g in second.optimizers[0].param_groups)
    moments = second.optimizers[0].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, first.optimizers[0].state_dict()["state"][0]["exp_avg"])


# ---------------------------------------------------------------------------------------------------- the harness
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_ctrl_c_saves_and_resume_continues_exactly_with_either_optimizer(tmp_path, monkeypatch, optimizer):
    tc = tiny_train_config(tmp_path, dropout=0.1, optimizer=optimizer)  # dropout: the RNG must come back too
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
    unclocked = lambda history: [{k: v for k, v in h.items() if k != "seconds"} for h in history]
    assert stopped is None and second.it == 8 and unclocked(second.history) == unclocked(straight.history)
    if optimizer == "muon":  # train.py steps Muon batched (muon.py), as a resumed run does
        assert [type(o) for o in second.optimizers] == [torch.optim.AdamW, muon.BatchedMuon]
    for (name, p), q in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name  # bit for bit the weights of the run that was never stopped


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129),
                                            (signal.SIGUSR1, 138)])
def test_a_signal_saves_the_step_under_way_says_so_and_exits_non_zero(tmp_path, signum, status):
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=2)
    proc = subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("iter 3/"):
            break
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == status, err
    # During a step, the step finishes and the report is written; during an evaluation, that ends at once.
    said = re.search(rf"{signal.Signals(signum).name}: (the evaluation was cut short; )?saved iteration (\d+) to .*; "
                     rf"continue with --resume", out)
    assert said and err == "", (out, err)
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == int(said.group(2)) >= 3
    if not said.group(1):
        assert "<svg class=\"attention\"" in (tmp_path / "out" / "report.html").read_text(encoding="utf-8")


def test_a_second_signal_stops_at_once_and_the_handlers_are_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with train.signals_caught() as caught:
        signal.raise_signal(signal.SIGTERM)
        assert caught == [signal.SIGTERM]  # the first only raises the flag
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("where", ["report", "sample", "last evaluation"])
def test_a_signal_in_the_closing_phase_is_honoured_with_its_exit_status(tmp_path, monkeypatch, capsys, where):
    flags = tiny_flags(tmp_path)
    if where == "last evaluation":
        real = gpt.Trainer.evaluate
        monkeypatch.setattr(gpt.Trainer, "evaluate", lambda self: (self.it == 8 and signal.raise_signal(
            signal.SIGTERM), real(self))[1])
    else:
        name = "loss_by_position" if where == "report" else "closing_sample"
        monkeypatch.setattr(report, name, lambda trainer: signal.raise_signal(signal.SIGTERM))
    with pytest.raises(SystemExit) as exit_info:
        train.main(flags)
    out = capsys.readouterr().out
    assert exit_info.value.code == 143, out
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 8
    said = r"SIGTERM: (the report was cut short; iteration 8 is saved|(the evaluation was cut short; )?saved " \
           r"iteration 8)"
    assert re.search(said, out), out


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    tc = tiny_train_config(tmp_path)
    train.run(tc, TEXT, quiet)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(gpt, "train_step", lambda *args: torch.tensor(float("nan")))
    with pytest.raises(ValueError, match=r"nan at iteration 9: training diverged\. Too high a --learning_rate"):
        # resumed at 8, eval_interval 1: caught before the save that would follow iteration 9
        train.run(tc, TEXT, quiet, resume=True, log_interval=50, given=dict(max_iters=20, eval_interval=1))
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
        assert proc.wait(timeout=HANG) == 0 and proc.stderr.read() == b""
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 200


def test_one_run_at_a_time_trains_in_an_out_dir(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=4)
    os.makedirs(tmp_path / "out")
    held = train.own_out_dir(str(tmp_path / "out"))  # a run training there, in this process
    try:
        done = run_cli("train.py", *flags)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert re.search(rf"out is in use by a training run \(process {os.getpid()} on .+\): wait for it", done.stderr)
        assert not (tmp_path / "out" / "ckpt.pt").exists()
    finally:
        held.close()
    # The lock of a run that crashed is released with it: its file left behind blocks nothing.
    (tmp_path / "out" / "train.lock").write_text("process 1 on a machine that crashed\n")
    assert run_cli("train.py", *flags).returncode == 0


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trained")
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT, quiet)
    return str(tmp_path / "out")


def hand_made(trained_dir, folder, change):
    """A copy of the trained checkpoint, changed by change(ckpt), in folder/ckpt.pt."""
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    change(ckpt)
    os.makedirs(folder, exist_ok=True)
    torch.save(ckpt, os.path.join(folder, "ckpt.pt"))


def set_in(keys, value):
    def change(ckpt):
        target = ckpt
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


@pytest.mark.parametrize("change, match", [
    (set_in(["optimizers"], "x"), "the optimizers' states or the evaluations"),
    (set_in(["optimizers", 0, "state", 0, "exp_avg"], torch.zeros(3, 3)), "optimizers' states"),  # the fused overrun
    (set_in(["optimizers", 0, "state", 0, "exp_avg_sq"], "x"), "optimizers' states"),
    (set_in(["optimizers", 0, "state", 0, "exp_avg"], None), "optimizers' states"),
    (lambda ckpt: ckpt["optimizers"][0]["state"][0].update(exp_avg=ckpt["optimizers"][0]["state"][0]["exp_avg"].double()
                                                           ), "optimizers' states"),  # the right shape, another type
    (set_in(["optimizers", 0, "state", -1], {}), "optimizers' states"),
    (set_in(["optimizers", 0, "param_groups"], []), "optimizers' states"),
    (lambda ckpt: ckpt["optimizers"].append(ckpt["optimizers"][0]), "optimizers' states"),
    (set_in(["iter"], -5), "iteration -5"),
    (set_in(["iter"], 10 ** 30), "iteration 1000000000000000000000000000000"),
    (set_in(["iter"], "8"), "iteration '8'"),
    (set_in(["elapsed"], float("nan")), "nan seconds of training"),
    (set_in(["elapsed"], -1.0), "-1.0 seconds of training"),
    (set_in(["elapsed"], "5"), "'5' seconds of training"),
    (set_in(["history"], [{"iter": 2}]), "the evaluations"),
    (set_in(["history", 0, "val"], float("nan")), "the evaluations"),  # which the report draws
    (set_in(["history", 0, "train"], float("inf")), "the evaluations"),
    (set_in(["history", 0, "lr"], "x"), "the evaluations"),
    (set_in(["history", 0, "seconds"], -1.0), "the evaluations"),
    (set_in(["history", 0, "iter"], True), "the evaluations"),
    (set_in(["history"], 5), "the evaluations"),
    (set_in(["rng", "torch"], torch.zeros(3, dtype=torch.uint8)), "does not fit its model (RuntimeError)"),
])
def test_a_damaged_training_state_is_refused_before_adamw_steps_on_it(tmp_path, capsys, trained_dir, change, match):
    hand_made(trained_dir, tmp_path / "out", change)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert "holds a training state that does not fit its model" in message and match in message, message
    assert "train without --resume" in message


@pytest.mark.parametrize("name, value", [("eval_iters", float("nan")), ("eval_iters", 0), ("grad_clip", "1"),
                                         ("learning_rate", float("inf")), ("bias", 1), ("seed", -1)])
def test_a_recorded_option_no_run_could_have_is_refused_by_resume_and_by_the_report(tmp_path, capsys, trained_dir,
                                                                                     name, value):
    hand_made(trained_dir, tmp_path / "out", set_in(["train_config", name], value))
    says = f"ckpt.pt records {name} = {value!r}, which no run could have: it is damaged or hand-made; "
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert says + "train without --resume" in message, message
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"),
                             "--data", str(tmp_path / "data.txt"))
    assert says + "it can still sample, without --report" in message, message


def test_the_report_of_a_checkpoint_without_its_options_takes_the_models(tmp_path, capsys, trained_dir):
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: ckpt.pop("train_config"))
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    assert "wrote" in capsys.readouterr().out  # not the defaults' block_size of 128 against the model's 16
    assert report_page(tmp_path / "out").count('<svg class="attention"') == 2


def test_resume_trains_with_the_recorded_options_and_those_given(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=4, eval_interval=4, learning_rate=2e-3, min_lr=1e-4)
    train.main(flags)
    trainer, _ = train.run(gpt.TrainConfig(out_dir=str(tmp_path / "out"), max_iters=6, device="cpu"), TEXT, quiet,
                           resume=True, given=dict(max_iters=6, weight_decay=0.5, beta2=0.9))
    assert (trainer.tc.learning_rate, trainer.tc.min_lr, trainer.tc.eval_interval) == (2e-3, 1e-4, 4)  # recorded
    assert [g["weight_decay"] for g in trainer.optimizers[0].param_groups] == [0.5, 0.0]  # given, and applied
    assert all(g["betas"] == (0.9, 0.9) for g in trainer.optimizers[0].param_groups)
    recorded = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["train_config"]
    assert (recorded["weight_decay"], recorded["beta2"], recorded["learning_rate"]) == (0.5, 0.9, 2e-3)


@pytest.mark.parametrize("error", [RuntimeError("std::bad_alloc"), MemoryError(),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 9 bytes.")])
def test_every_kind_of_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch, error):
    def fails(*args):
        raise error

    monkeypatch.setattr(gpt, "train_step", fails)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path))
    assert message.startswith("error: out of memory (") and "use a smaller model" in message, message


def test_ctrl_c_while_torch_is_still_importing_ends_quietly(tmp_path):
    (tmp_path / "numpy.py").write_text("raise KeyboardInterrupt\n")  # the import a Ctrl-C lands in
    for script in ("train.py", "sample.py"):
        done = run_cli(script, env={"PYTHONPATH": str(tmp_path)})
        assert done.returncode == 130 and done.stderr == "", (script, done.stderr)


def ddp_worker(rank, world, port, args, result_dir):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    tc, given = args
    trainer, _ = train.run(tc, TEXT, quiet, resume=True, given=given)
    torch.save({"model": trainer.model.state_dict(), "history": trainer.history},
               os.path.join(result_dir, f"rank{rank}.pt"))


def run_ddp_command_lines(args):
    """Runs train.py once per process as torchrun would, with the environment torchrun sets, each
    process with its own command line; returns each one's (exit status, stderr)."""
    port = free_port()
    processes = []
    for rank, argv in enumerate(args):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(len(args)),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        processes.append(subprocess.Popen([sys.executable, "train.py", *argv], cwd=HERE, env=env, text=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    errors = [p.communicate(timeout=HANG)[1] for p in processes]
    return [(p.returncode, err) for p, err in zip(processes, errors)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_trains_in_step_and_its_checkpoints_interchange_with_single_process(tmp_path):
    tc = tiny_train_config(tmp_path, max_iters=10, eval_interval=10, batch_size=16, block_size=32, n_embd=32,
                           learning_rate=6e-3)
    train.run(tc, TEXT, quiet)  # a single-process checkpoint at iteration 10 ...
    given = dict(max_iters=40, eval_interval=15, grad_accum=2)  # ... resumed by two processes, to 40
    torch.multiprocessing.spawn(ddp_worker, args=(2, free_port(), (tc, given), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, p in ranks[0]["model"].items():
        assert torch.equal(p, ranks[1]["model"][name]), name
    losses = [(h["iter"], h["train"]) for h in ranks[0]["history"]]
    assert [it for it, _ in losses] == [10, 15, 30, 40] and losses[-1][1] < losses[0][1] - 0.1, losses
    # the first process alone wrote, and no temporary file was left
    assert sorted(os.listdir(tc.out_dir)) == ["ckpt.pt", "report.html", "train.lock"]
    model, _, _ = gpt.load_checkpoint(os.path.join(tc.out_dir, "ckpt.pt"), "cpu")  # no DDP prefixes in its names
    for name, p in model.state_dict().items():
        assert torch.equal(p, ranks[0]["model"][name]), name
    trainer, _ = train.run(tc, TEXT, quiet, resume=True, given=dict(max_iters=42))  # and one process resumes it
    assert trainer.it == 42


def test_ddp_averages_gradients_once_per_optimizer_step_with_grad_accum():
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                         world_size=1)
    try:
        idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(0))
        micro_batches = [(idx[:, :-1], idx[:, 1:])] * 3
        averaged = {}
        for grad_accum in (3, 1):
            ddp = train.AccumulatingDDP(tiny_model(), grad_accum)
            calls = []

            def count(state, bucket):  # a communication hook: runs once per bucket that is averaged
                calls.append(1)
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done

            ddp.register_comm_hook(None, count)
            optimizer = gpt.configure_optimizers(ddp.module, gpt.TrainConfig())
            for _ in range(2):
                gpt.train_step(ddp, optimizer, micro_batches)
            averaged[grad_accum] = len(calls)
        # the same buckets, averaged after the last of 3 micro-batches only, against after each of them
        assert averaged[3] > 0 and averaged[1] == 3 * averaged[3], averaged
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("fault, says, who", [
    ("missing", r"error: cannot read the data file .*missing\.txt \(No such file or directory\): pass --data a file "
                r"\(process 1 of 2\)", 1),
    ("new characters", r"error: process 1 of 2 has another vocabulary than process 0 \(its --data has other "
                       r"characters, or another tokenizer\): give every process the same --data", 0),
])
def test_a_fault_in_one_ddp_process_reaches_the_user_in_one_line_from_the_process_that_found_it(
        tmp_path, fault, says, who):
    flags = tiny_flags(tmp_path, max_iters=4)
    other = tmp_path / ("missing.txt" if fault == "missing" else "other.txt")
    if fault == "new characters":
        other.write_text(TEXT + "#", encoding="utf-8")
    args = [flags, [*flags, "--data", str(other)]]  # the second process's --data is not the first's
    ended = run_ddp_command_lines(args)
    assert re.fullmatch(says + "\n", ended[who][1]) and ended[1 - who][1] == "", ended
    assert [code for code, _ in ended] == [1, 1], ended  # not a signal: each ended as it said
    assert not (tmp_path / "out" / "ckpt.pt").exists()


# ---------------------------------------------------------------------------------------------------- command lines
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


def test_train_then_sample_end_to_end(tmp_path):
    trained = run_cli("train.py", *tiny_flags(tmp_path))
    assert trained.returncode == 0 and trained.stderr == "", trained.stderr
    assert "what context buys" in trained.stdout and (tmp_path / "out" / "ckpt.pt").exists()
    assert re.search(r"val loss [\d.]+ \([\d.]+ bits per character\)", trained.stdout)
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
        assert closed.wait(timeout=HANG) in (0, 141) and closed.stderr.read() == b""  # quiet, as cat


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, where every write finds the disk full")
def test_output_to_a_full_disk_is_one_line(trained_dir):
    for args in (["sample.py", "--out_dir", trained_dir], ["gpt_numpy.py", "--check"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, *args], cwd=HERE, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=HANG)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, (args, done.stderr)
        assert "No space left on device" in done.stderr and "Traceback" not in done.stderr, done.stderr


NUMBERS = [name for name in cli.LIMITS if name != "vocab_size"]


@pytest.mark.parametrize("flags, match", [
    *[([f"--{name}", value], name) for name in NUMBERS for value in ("nan", "inf", "-1e30")],
    (["--seed", str(2 ** 63)], "must be in [0, 4294967296)"),
    (["--max_iters", "1e3"], "argument --max_iters: invalid int value"),
    (["--log_interval", "0"], "argument --log_interval: must be at least 1"),
    (["--learning_rate", "1e-4"], "min_lr (0.0003) is above learning_rate (0.0001): lower min_lr too"),
    (["--nonsense", "1"], "unrecognized arguments: --nonsense"),
    (["--resume", "--init_from", "gpt2"], "give one of them"),
    (["--data", "MISSING"], "cannot read the data file"),
    (["--data", "FOLDER"], "(it is a folder): pass --data a file"),
    (["--data", "/dev/zero"], "(it is not a regular file)"),  # which read() would never finish
    (["--data", "BINARY"], "it is not UTF-8 text"),
    (["--data", "EMPTY"], "is empty"),
    (["--data", "ODD.bin"], "not a whole number of uint16 ids"),
    (["--data", "IDS.bin", "--vocab_size", "10"], "must be in [0, 10), the vocabulary; these go from 0 to 3,999"),
    (["--block_size", "5000"], "--block_size 5000 is too long for the 3000 tokens held out"),
    (["--block_size", str(10 ** 8)], "--block_size 100000000 is too long"),  # refused before the model is built
    (["--n_embd", "30", "--n_head", "4"], "n_embd (30) must be a multiple of 8: of n_head (4)"),
    (["--norm", "batchnorm"], "argument --norm: invalid choice: 'batchnorm'"),
    (["--optimizer", "sgd"], "argument --optimizer: invalid choice: 'sgd'"),
    (["--device", "tpu"], "unknown or not on this machine"),
    (["--device", "cuda:7"], "unknown or not on this machine"),
    (["--device", "meta"], "unknown or not on this machine"),
    (["--n_embd", str(2 ** 20), "--n_head", "1"], "out of memory (["),
    (["--out_dir", "DATA/out"], "pass --out_dir a writable folder"),  # a folder inside a file
    (["--out_dir", "DATA"], "data.txt is there, and not a folder): pass --out_dir a writable folder"),
    (["--out_dir", "FOLDER"], "pass --out_dir a writable folder"),  # FOLDER/ckpt.pt is a folder
    (["--out_dir", "/sys/nope"], "cannot write /sys/nope/ckpt.pt ("),  # a read-only file system: its real cause
    (["--resume", "--out_dir", "FOLDER/x"], "no checkpoint file at"),
    (["--resume", "--out_dir", "NO_STATE"], "it can sample, but not resume; train without --resume"),
    (["--resume", "--data", "NEW_CHARS"], "has characters the checkpoint never saw ('#'): use the text it was trained"),
    (["--init_from", "FOLDER"], "holds no GPT-2 this can load (ValueError: cannot read GPT-2's config"),
    ([], "holds an earlier run, which this one would overwrite: continue it with --resume, or start anew in another"),
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
    hand_made(trained_dir, tmp_path / "NO_STATE", lambda ckpt: [ckpt.pop(k) for k in ("optimizers", "rng")])
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    (tmp_path / "NEW_CHARS").write_text(TEXT + "#", encoding="utf-8")
    names = dict(MISSING=tmp_path / "missing.txt", FOLDER=tmp_path / "FOLDER", BINARY=tmp_path / "BINARY",
                 EMPTY=tmp_path / "EMPTY", DATA=data, NO_STATE=tmp_path / "NO_STATE", NEW_CHARS=tmp_path / "NEW_CHARS",
                 ODD=tmp_path / "ODD", IDS=tmp_path / "IDS")
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


@pytest.mark.parametrize("env, match", [
    (dict(WORLD_SIZE="2"), "without torchrun's RANK and LOCAL_RANK"),
    (dict(RANK="1"), "cannot read the data file"),  # a rank set alone: still a single process, which says what
])
def test_a_stray_distributed_environment_is_one_line(tmp_path, env, match):
    done = run_cli("train.py", "--data", str(tmp_path / "missing.txt"), "--out_dir", str(tmp_path), env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr


def test_a_text_of_more_than_256_characters_trains_from_the_command_line(tmp_path, capsys):
    chinese = "".join(chr(0x4E00 + i) for i in range(300))  # 300 characters: ids of two bytes
    (tmp_path / "data.txt").write_text((TEXT[:3000] + chinese) * 4, encoding="utf-8")
    train.main(tiny_flags(tmp_path, max_iters=4))
    ids, chars = cli.encode_file(str(tmp_path / "data.txt"))
    assert ids.dtype == np.uint16 and len(chars) > 256
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["chars"] == chars and ckpt["config"]["vocab_size"] == len(chars)
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--start", chinese[:3], "--max_new_tokens", "20"])
    assert capsys.readouterr().out.startswith(chinese[:3])


def test_a_text_is_encoded_a_chunk_at_a_time_with_the_ids_of_its_characters(tmp_path, monkeypatch):
    text = TEXT[:5000] + "\u00e9\u4e00\U0001f600" * 7  # characters of two, three and four UTF-8 bytes
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(cli, "CHUNK", 1001)  # chunks that cut characters' bytes in two
    ids, chars = cli.encode_file(str(tmp_path / "t.txt"))
    tokenizer = gpt.CharTokenizer(text)
    assert chars == tokenizer.chars and ids.dtype == np.uint8 and ids.tolist() == tokenizer.encode(text)
    larger = gpt.CharTokenizer(chars + "#")  # a checkpoint's vocabulary, with a character this text lacks
    again, _ = cli.encode_file(str(tmp_path / "t.txt"), chars=larger.chars)
    assert again.tolist() == larger.encode(text)


def test_token_ids_in_a_bin_file_train_from_the_command_line_and_sample_py_says_it_cannot_decode_them(
        tmp_path, capsys):
    ids = np.array(gpt.CharTokenizer(TEXT).encode(TEXT), dtype=np.uint16)
    ids.tofile(tmp_path / "train.bin")
    train.main(["--data", str(tmp_path / "train.bin"), *tiny_flags(tmp_path, max_iters=4)[2:]])
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["vocab_size"] == int(ids.max()) + 1 and ckpt["chars"] is None
    assert "bits per character" not in capsys.readouterr().out  # ids, not characters
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert "was trained on token ids of a tokenizer it only names (None), so it cannot be decoded here" in message
    train.main(["--data", str(tmp_path / "train.bin"), *tiny_flags(tmp_path, max_iters=6)[2:], "--resume"])
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 6
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=8), "--resume")
    assert "resume it on the same ids, --data FILE.bin" in message


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
    (["--out_dir", "NAN_WEIGHTS"], "holds weights that are NaN or inf, from a run that diverged"),
    (["--report", "--data", "MISSING"], "cannot read the data file"),
    (["--report", "--init_from", "gpt2"], "--report needs a checkpoint of a run"),
])
def test_bad_sampling_input_is_one_line_and_prints_nothing(tmp_path, trained_dir, capsys, flags, match):
    (tmp_path / "BINARY").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "EMPTY").write_text("")
    os.makedirs(tmp_path / "FOLDER")
    os.makedirs(tmp_path / "CKPT_FOLDER" / "ckpt.pt")
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
    names = "CKPT_FOLDER|FOLDER|BINARY|CORRUPT|MISFIT|EMPTY_CKPT|EMPTY|TRUNCATED|FEW_CHARS|NAN_WEIGHTS|MISSING"
    flags = [re.sub(names, lambda m: str(tmp_path / m.group(0)), f) for f in flags]
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
    (["--device", "meta"], "device 'meta' is unknown or not on this machine"),  # tensors without values
    (["--device", "cuda:99"], "device 'cuda:99' is unknown or not on this machine"),
])
def test_bad_bench_input_is_one_line_before_anything_is_measured(tmp_path, flags, match):
    os.makedirs(tmp_path / "FOLDER")
    os.makedirs(tmp_path / "EXITS")
    (tmp_path / "EXITS" / "model.py").write_text("import sys\nsys.exit(0)\n")
    done = run_cli("bench.py", *[str(tmp_path / f) if f.isupper() else f for f in flags])
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr
    assert "val loss" not in done.stdout


def test_bench_measures_reading_a_text_into_ids(tmp_path):
    figures = __import__("bench").bench_encoding(megabytes=2, source=str(Path(HERE, "input.txt")))
    assert figures["characters"] > 1_900_000 and figures["dtype"] == "uint8" and figures["vocab_size"] == 83
    assert figures["mb_per_s"] > 0 and 0 < figures["bytes_per_char"] < 20


# ---------------------------------------------------------------------------------------------------- the report
def report_page(out_dir):
    return (Path(out_dir) / "report.html").read_text(encoding="utf-8")


def test_train_py_writes_a_report_page_and_sample_py_writes_it_again(tmp_path):
    trained = run_cli("train.py", *tiny_flags(tmp_path, max_iters=12, eval_interval=4, n_layer=2))
    assert trained.returncode == 0 and trained.stderr == "", trained.stderr
    assert f"report: {tmp_path / 'out' / 'report.html'}" in trained.stdout
    page = report_page(tmp_path / "out")
    assert page.count('<svg class="attention"') == 2 * 2  # one picture per layer and head
    for name in ("train", "val", "lr"):  # the curves, with a point per evaluation
        assert page.count(f'<polyline class="series {name}" data-points="3"') == (2 if name != "lr" else 1), name
    assert page.count('<polyline class="series val" data-points="16"') == 1  # a loss at each of 16 positions
    assert "http" not in page and "<script" not in page and "<link" not in page  # it fetches and runs nothing
    assert "bits per character" in page and "data:image/png;base64," in page
    os.remove(tmp_path / "out" / "report.html")
    rebuilt = run_cli("sample.py", "--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt"))
    assert rebuilt.returncode == 0 and rebuilt.stderr == "", rebuilt.stderr
    again = report_page(tmp_path / "out")
    assert again.count('<svg class="attention"') == 4 and again.count('data-points="3"') == 5  # 2 charts' curves


def test_the_report_draws_every_value_inside_its_axes():
    for low, high in ((3.08, 4.41), (0.15, 0.37), (30, 90), (1e-4, 3e-3), (2.0, 2.0), (-1.5, 7.0)):
        ticks = report.nice_ticks(low, high)
        assert ticks[0] <= low and ticks[-1] >= high and 3 <= len(ticks) <= 12, (low, high, ticks)
    png = report.png([[(255, 0, 0), (0, 0, 255)]])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"IHDR" in png and png.endswith(b"IEND\xaeB`\x82")


# ---------------------------------------------------------------------------------------------------- GPT-2
def fixture_weights():
    return gpt2.read_safetensors(os.path.join(FIXTURE, "model.safetensors"))


def fixture_logits():
    """The fixture's fixed ids, and the logits transformers computed for them (fixtures/make_tiny_gpt2.py)."""
    with open(os.path.join(FIXTURE, "logits.json"), encoding="utf-8") as f:
        computed = json.load(f)
    return torch.tensor(computed["ids"]), torch.tensor(computed["logits"])


def test_gpt2_from_state_dict_computes_the_logits_transformers_computed():
    weights = fixture_weights()
    assert "lm_head.weight" not in weights and "transformer.wte.weight" in weights  # tied: stored once
    ids, expected = fixture_logits()
    model = gpt2.from_state_dict(weights, n_head=2).eval()
    assert (model.config.vocab_size, model.config.block_size, model.config.n_layer, model.config.n_embd) == \
           (256, 64, 2, 64)
    assert (model.config.norm, model.config.pos, model.config.mlp, model.config.bias) == \
           ("layernorm", "learned", "gelu", True)
    torch.testing.assert_close(model(ids)[0], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    unprefixed = {k.removeprefix("transformer."): w for k, w in weights.items()}
    assert torch.equal(gpt2.from_state_dict(unprefixed, n_head=2).eval()(ids)[0], model(ids)[0])
    masks = {**weights, "transformer.h.0.attn.bias": torch.ones(1, 1, 64, 64)}  # as older files hold them
    assert torch.equal(gpt2.from_state_dict(masks, n_head=2).eval()(ids)[0], model(ids)[0])
    one_head = gpt2.from_state_dict(weights).eval()  # n_embd // 64: 1 head, not the fixture's 2
    assert not torch.allclose(one_head(ids)[0], expected, atol=1e-3)


@pytest.mark.parametrize("change, match", [
    (lambda w: w.update({"transformer.h.0.mlp.c_gate.weight": torch.zeros(3)}),
     "not GPT-2's weights: h.0.mlp.c_gate.weight is not one of GPT-2's tensors"),
    (lambda w: w.pop("transformer.h.1.ln_2.bias"), "not GPT-2's weights: h.1.ln_2.bias is missing"),
    (lambda w: w.pop("transformer.wpe.weight"), "wte.weight or wpe.weight is missing"),
    (lambda w: w.update({"transformer.h.1.mlp.c_fc.weight": torch.zeros(64, 3)}), "size mismatch"),
])
def test_gpt2_from_state_dict_uses_every_tensor_and_fills_every_parameter(change, match):
    weights = fixture_weights()
    change(weights)
    with pytest.raises((ValueError, RuntimeError), match=match):
        gpt2.from_state_dict(weights, n_head=2)


def test_the_twin_runs_gpt2s_weights():
    model = gpt2.from_state_dict(fixture_weights(), n_head=2).eval()
    twin = gpt_numpy.GPT(model.config, {n: p.detach().numpy() for n, p in model.named_parameters()})  # the README's
    ids, expected = fixture_logits()
    np.testing.assert_allclose(twin.forward(ids.numpy())[0], expected.numpy(), rtol=1e-4,
                               atol=1e-5 * expected.abs().max().item())


@pytest.fixture
def gpt2_tokens(monkeypatch):
    """GPT-2's tokenizer as a byte-level stand-in (the fixture's vocabulary is 256): the tests need no tiktoken."""
    tokenizer = ByteTokenizer()
    monkeypatch.setattr(gpt2.Tokenizer, "backend", lambda self: (tokenizer.encode, tokenizer.decode))
    return tokenizer


def test_train_py_finetunes_gpt2_from_its_folder_on_ids_and_sample_py_samples_the_checkpoint(
        tmp_path, capsys, gpt2_tokens):
    np.array(gpt2_tokens.encode(TEXT), dtype=np.uint16).tofile(tmp_path / "train.bin")
    flags = ["--init_from", FIXTURE, "--out_dir", str(tmp_path / "out"), "--max_iters", "4", "--eval_interval", "2",
             "--eval_iters", "2", "--batch_size", "2", "--block_size", "32", "--device", "cpu"]
    train.main([*flags, "--data", str(tmp_path / "train.bin"), "--learning_rate", "1e-3", "--min_lr", "1e-4"])
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["tokenizer"] == "gpt2" and ckpt["chars"] is None
    assert ckpt["config"] == dataclasses.asdict(gpt2.from_state_dict(fixture_weights(), n_head=2).config)
    assert ckpt["train_config"]["block_size"] == 32 and ckpt["train_config"]["n_head"] == 2  # what ran
    start = fixture_weights()["transformer.h.0.attn.c_attn.weight"].t()[:64]  # the query's rows
    assert not torch.equal(ckpt["model"]["h.0.attn.c_q.weight"], start)  # trained
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--start", "ROMEO", "--max_new_tokens", "20",
                 "--num_samples", "1"])
    assert capsys.readouterr().out.startswith("ROMEO")
    # A text is read in GPT-2's tokens; the defaults for finetuning are small, constant steps.
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    train.main([*flags, "--data", str(tmp_path / "data.txt"), "--out_dir", str(tmp_path / "text")])
    ckpt = torch.load(tmp_path / "text" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["train_config"]["learning_rate"] == ckpt["train_config"]["min_lr"] == 3e-5


def test_sample_py_samples_gpt2_itself(capsys, gpt2_tokens):
    sample.main(["--init_from", FIXTURE, "--start", "Hello", "--max_new_tokens", "12", "--temperature", "0",
                 "--num_samples", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    model = gpt2.from_state_dict(fixture_weights(), n_head=2).eval()
    greedy = model.generate(torch.tensor([gpt2_tokens.encode("Hello")]), 12, temperature=0)
    assert out == gpt2_tokens.decode(greedy[0].tolist()) + "\n"


def test_gpt2s_tokens_without_tiktoken_or_transformers_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # an import of either fails
    monkeypatch.setitem(sys.modules, "transformers", None)
    (tmp_path / "data.txt").write_text(TEXT)
    for module, args in ((sample, ["--init_from", FIXTURE]),
                         (train, ["--init_from", FIXTURE, "--data", str(tmp_path / "data.txt"), "--out_dir",
                                  str(tmp_path / "out"), "--device", "cpu"])):
        message = one_line_error(capsys, module, *args)
        assert "GPT-2's tokens need tiktoken or transformers, and neither is installed: pip install tiktoken" in \
            message, message
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_a_gpt2_name_is_fetched_through_huggingface_hub_when_it_is_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ValueError, match="with huggingface_hub, which is not installed: pip install huggingface_hub"):
        gpt2.folder_of("gpt2-medium")
    asked = []

    class Hub:
        @staticmethod
        def snapshot_download(repo_id, allow_patterns):
            asked.append((repo_id, allow_patterns))
            return FIXTURE

    monkeypatch.setitem(sys.modules, "huggingface_hub", Hub)
    assert gpt2.load("gpt2", "cpu").config.n_layer == 2
    assert asked[0][0] == "openai-community/gpt2" and "model.safetensors" in asked[0][1]
    with pytest.raises(ValueError, match="no such folder, and not one of gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        gpt2.folder_of("gpt3")


def damage_config(**changes):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return change


def as_bin_without(name):
    def change(folder):
        weights = fixture_weights()
        weights.pop(name)
        torch.save(weights, folder / "pytorch_model.bin")
        os.remove(folder / "model.safetensors")
    return change


@pytest.mark.parametrize("damage, match", [
    (lambda folder: os.remove(folder / "config.json"), "config.json (No such file or directory))"),
    (lambda folder: (folder / "config.json").write_text("{not json"), "(JSONDecodeError: "),
    (lambda folder: (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100_000]),
     "model.safetensors is damaged: tensor transformer.h.0.mlp.c_fc.weight lies at bytes"),
    (lambda folder: (folder / "model.safetensors").write_bytes(b"junk" * 100), "is cut short, or not a .safetensors"),
    (damage_config(n_layer=3), "its config.json disagrees with its weights: n_layer 3 (the tensors' 2)"),
    (damage_config(model_type="llama"), "its config.json is of a 'llama' model, not gpt2"),
    (as_bin_without("transformer.h.1.ln_2.bias"), "h.1.ln_2.bias is missing"),
    (lambda folder: os.remove(folder / "model.safetensors"), "pytorch_model.bin"),
])
def test_a_broken_gpt2_folder_is_one_line(tmp_path, capsys, damage, match):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    damage(folder)
    message = one_line_error(capsys, sample, "--init_from", str(folder))
    assert f"{folder} holds no GPT-2 this can load (" in message and match in message, message


def test_bench_gpt2_without_transformers_is_one_line(tmp_path):
    (tmp_path / "transformers.py").write_text("raise ImportError('no transformers here')\n")
    done = run_cli("bench.py", "--gpt2", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1 and done.stderr == "error: --gpt2 times transformers' generate, and transformers " \
                                                   "is not installed: pip install transformers\n", done.stderr


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


def zero_gradient(name, config):
    """Whether name's gradient is zero in exact arithmetic: the keys' bias, with learned positions, adds q.b to every
    score of a query's row, which softmax ignores. The twin and torch hold rounding noise there, which has no scale of
    its own: it is measured against the model's largest gradient entry."""
    return name.endswith("attn.c_k.bias") and config.pos == "learned"


def error_table(pairs):
    rows = [f"{name:32s} {gpt_numpy.rel_error(ours, ref):.3e}" for name, ours, ref in pairs]
    return "\n".join(["tensor                           relative error"] + rows)


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
    largest = max(p.grad.abs().max().item() for p in named.values())
    for tensor_name, ours, ref in pairs:
        assert ours.shape == ref.shape and ours.dtype == np.float64
        scale = largest if zero_gradient(tensor_name, model.config) else None
        assert gpt_numpy.rel_error(ours, ref, scale) <= 1e-10, f"{tensor_name} differs:\n{table}"
    assert abs(twin_loss - loss.item()) <= 1e-12 * abs(loss.item())


@pytest.mark.parametrize("name", TWIN_CONFIGS)
def test_twin_gradients_match_finite_differences(name):
    _, twin, idx, targets = twin_pair(name)
    idx, targets = idx.numpy(), targets.numpy()
    twin.forward(idx, targets)
    grads = twin.backward()
    largest = max(np.abs(g).max() for g in grads.values())
    rng = np.random.default_rng(0)
    for tensor_name, w in twin.params.items():
        entries = [np.unravel_index(i, w.shape) for i in rng.choice(w.size, size=min(3, w.size), replace=False)]
        numeric = gpt_numpy.numerical_gradient(lambda: twin.forward(idx, targets)[1], w, entries, h=1e-5)
        analytic = np.array([grads[tensor_name][i] for i in entries])
        scale = largest if zero_gradient(tensor_name, twin.config) else np.abs(grads[tensor_name]).max()
        assert gpt_numpy.rel_error(analytic, numeric, scale=scale) <= 1e-6, tensor_name


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
    largest = max(p.grad.abs().max().item() for p in model.parameters())
    for n, p in model.named_parameters():
        ref = p.grad.numpy()
        scale = largest if zero_gradient(n, model.config) else np.abs(ref).max()
        np.testing.assert_allclose(grads[n], ref, rtol=1e-4, atol=1e-5 * scale, err_msg=n)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_twin_adamw_steps_match_torch(name):
    model, twin, idx, targets = twin_pair(name)
    optimizer = gpt.configure_optimizers(model, gpt.TrainConfig(learning_rate=1e-2, optimizer="adamw"))
    twin_optimizer = gpt_numpy.AdamW(twin.params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    for _ in range(5):
        loss = gpt.train_step(model, optimizer, [(idx, targets)]).item()
        twin_loss = twin.forward(idx.numpy(), targets.numpy())[1]
        twin_optimizer.step(twin.backward())
        assert abs(twin_loss - loss) <= 1e-10 * loss
    assert loss < 2.0


def test_twin_newton_schulz_brings_every_singular_value_near_1_along_the_gradients_directions(monkeypatch):
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.standard_normal((24, 8)))
    v, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    g = u @ np.diag(np.logspace(0, -2, 8)) @ v.T  # (24, 8), singular values from 1 to 0.01
    for matrix, direction in ((g, u @ v.T), (g.T, v @ u.T)):  # tall and wide
        out = gpt_numpy.newton_schulz(matrix)
        singular_values = np.linalg.svd(out, compute_uv=False)
        assert 0.6 < singular_values.min() and singular_values.max() < 1.25, singular_values
        assert gpt_numpy.rel_error(out, direction) < 0.4
        # torch.optim.Muon's own iterations, in bfloat16: the same to its rounding
        theirs = torch.optim._muon._zeropower_via_newtonschulz(torch.tensor(matrix), (3.4445, -4.7750, 2.0315), 5,
                                                               1e-7)
        assert gpt_numpy.rel_error(out, theirs.double().numpy()) < 0.05
        # and kept in float64, to float64's rounding: the same coefficients, scaling and transposes
        with monkeypatch.context() as patched:
            patched.setattr(torch.Tensor, "bfloat16", lambda tensor: tensor)
            theirs = torch.optim._muon._zeropower_via_newtonschulz(torch.tensor(matrix), (3.4445, -4.7750, 2.0315),
                                                                   5, 1e-7)
        assert theirs.dtype == torch.float64 and gpt_numpy.rel_error(out, theirs.numpy()) < 1e-12


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_twin_muon_and_adamw_steps_match_torch(name, monkeypatch):
    # torch's Newton-Schulz runs in bfloat16 (the test above holds the twin's to it); here it runs the twin's, in
    # float64, so that momentum, Nesterov, the learning rate's scale and the decay are held to float64's rounding.
    twin_iterations = lambda update, *args: torch.from_numpy(gpt_numpy.newton_schulz(update.numpy()))
    monkeypatch.setattr(torch.optim._muon, "_zeropower_via_newtonschulz", twin_iterations)
    model, twin, idx, targets = twin_pair(name)
    optimizers = gpt.configure_optimizers(model, gpt.TrainConfig(learning_rate=1e-2, optimizer="muon"))
    matrices = [n for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2]
    twin_muon = gpt_numpy.Muon({n: twin.params[n] for n in matrices}, lr=0.01, weight_decay=0.1, momentum=0.95)
    rest = {n: w for n, w in twin.params.items() if n not in matrices}
    adamw = gpt_numpy.AdamW(rest, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    before = {n: w.copy() for n, w in twin.params.items()}
    for _ in range(3):
        gpt.train_step(model, optimizers, [(idx, targets)])
        twin.forward(idx.numpy(), targets.numpy())
        grads = twin.backward()
        twin_muon.step(grads)
        adamw.step(grads)
    largest = max(np.abs(p.detach().numpy() - before[n]).max() for n, p in model.named_parameters())
    for n, p in model.named_parameters():
        moved = p.detach().numpy() - before[n]
        scale = largest if zero_gradient(n, model.config) else None  # AdamW's steps on rounding noise
        assert gpt_numpy.rel_error(twin.params[n] - before[n], moved, scale) < 1e-8, n


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
    drawn = lambda seed: twin.generate(data[None, :5], 20, temperature=2.0, top_k=5, top_p=0.9,
                                       generator=np.random.default_rng(seed))  # hot: a trained model may be sure
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


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_twin_hands_back_the_gradient_at_each_activation_as_pytorch_has_it(name):
    model, twin, idx, targets = twin_pair(name)
    outputs = {}
    for name, module in model.named_modules():
        if name.split(".")[-1] in ("wte", "ln_1", "c_q", "c_k", "c_v", "c_proj", "ln_2", "c_fc", "c_gate", "ln_f",
                                   "lm_head"):
            module.register_forward_hook(lambda m, i, out, name=name: outputs.setdefault(name, out).retain_grad())
    model(idx, targets)[1].backward()
    twin.forward(idx.numpy(), targets.numpy())
    _, douts = twin.backward(activations=True)
    assert set(outputs) <= set(douts) and douts["loss"] == 1.0
    for name, out in outputs.items():
        np.testing.assert_allclose(douts[name], out.grad.numpy(), rtol=1e-10, atol=1e-12 * out.grad.abs().max().item())


def test_the_gradient_check_passes_on_the_twin_and_names_every_layer():
    lines = []
    assert gpt_numpy.check(log=lines.append)
    table = "\n".join(lines)
    for layer in ("crossentropy", "linear", "layernorm", "rmsnorm", "gelu", "swiglu", "attention", "attention, rope",
                  "softmax", "rope", "embedding", "model (gpt2): h.1.mlp.c_fc.bias", "model (llama): lm_head.weight"):
        assert f"\n{layer}" in table, layer
    assert not [line for line in lines[:-1] if line.endswith("WRONG")] and lines[-1] == "78 ok, 0 WRONG, 0 ERROR"


def layernorm_without_the_mean(dout, saved, right=gpt_numpy.layernorm_backward):
    xhat, rstd, weight, has_bias = saved
    g = dout * weight
    return rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True)), right(dout, saved)[1]  # the mean's path dropped


def swiglu_without_the_gates_sigmoid(dout, saved):
    gate, up, s = saved
    return (dout * up * s, dout * gate * s), {}  # silu's derivative taken as s alone


@pytest.mark.parametrize("name, broken, first_wrong", [
    ("layernorm_backward", layernorm_without_the_mean, "layernorm: dx"),
    ("crossentropy_backward", lambda dloss, saved: (saved[0] - np.eye(saved[0].shape[-1])[saved[1]], {}),
     "crossentropy: dx"),  # the 1/N dropped
    ("gelu_backward", lambda dout, saved: (dout * 0.5 * (1 + saved[1]), {}), "gelu: dx"),  # half the product rule
    ("swiglu_backward", swiglu_without_the_gates_sigmoid, "swiglu: dgate"),
    ("rope_backward", lambda dout, saved: (gpt_numpy.rope_forward(dout, *saved)[0], {}), "attention, rope: dq"),
])
def test_a_broken_backward_makes_the_check_fail_and_names_its_layer(monkeypatch, name, broken, first_wrong):
    monkeypatch.setattr(gpt_numpy, name, broken)
    lines = []
    assert not gpt_numpy.check(log=lines.append)
    assert re.search(f"WRONG, 0 ERROR: first {re.escape(first_wrong)}$", lines[-1]), lines[-1]


def check_rows(lines):
    """The rows of a --check table that are not ok: {layer row: verdict}, {model: verdict}."""
    rows = {}
    models = {}
    for line in lines[1:-1]:
        name = line[:44].strip()
        verdict = "ERROR" if "  ERROR  " in line else line.split()[-1]
        if verdict != "ok" and name.startswith("model ("):
            models[name[len("model ("):name.index(")")]] = verdict
        elif verdict != "ok":
            rows[name] = verdict
    return rows, models


def broken_twin(tmp_path, change, to):
    """A copy of gpt_numpy.py with one line changed, imported as a module of its own."""
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    assert source.count(change) == 1, change  # the exercise's line is in the file, once
    path = tmp_path / "broken_twin.py"
    path.write_text(source.replace(change, to), encoding="utf-8")
    shutil.copy(Path(HERE, "workbook.json"), tmp_path / "workbook.json")
    spec = importlib.util.spec_from_file_location(f"broken_twin_{abs(hash(to))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("change, to, says", [
    ("return p * (dout - (dout * p).sum(-1, keepdims=True)), {}", "return p * (dout - (dout * p).sum(-1)), {}",
     "ERROR  ValueError: operands could not be broadcast together"),  # a lost keepdims
    ("dq = dscores @ k * scale", "dq = dscores.transpose(0, 1, 3, 2) @ k.transpose(0, 1, 3, 2) * scale",
     "ERROR  ValueError: matmul"),  # a wrong transpose that changes a shape
    ("dx = dx + back(block + \"ln_1\", norm, dh)", "dx = dx + back(block + \"ln_1\", norm, dh) * np.nan", None),
    ("    return dx, dparams\n\n\ndef rmsnorm_forward", "    return dx * np.nan, dparams\n\n\ndef rmsnorm_forward",
     "layernorm: dx                                           inf  WRONG"),  # a NaN gradient is never ok
    ("    return dx, dparams\n\n\ndef rmsnorm_forward", "    return dx * np.inf, dparams\n\n\ndef rmsnorm_forward",
     "layernorm: dx                                           inf  WRONG"),
    ("    return weight[idx], (idx, weight.shape)", "    return weight[idx] * np.nan, (idx, weight.shape)",
     "embedding: dweight                                      inf  WRONG"),  # the reference is NaN: not ok either
])
def test_a_backward_that_raises_or_turns_nan_is_a_row_and_the_table_goes_on_to_its_end(tmp_path, change, to, says):
    twin = broken_twin(tmp_path, change, to)
    lines = []
    assert not twin.check(log=lines.append)
    assert "model (llama): " in lines[-2] and any(line.startswith("embedding: ") for line in lines), lines  # to the end
    assert re.fullmatch(r"\d+ ok, \d+ WRONG, \d+ ERROR: first .+", lines[-1]) and not lines[-1].startswith("78 ok")
    assert says is None or any(says in line for line in lines), lines
    done = run_cli(str(tmp_path / "broken_twin.py"), "--check")
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stdout.count("\n") >= 12, done.stderr


def test_every_exercise_of_the_workbook_turns_the_rows_its_answer_names(tmp_path):
    exercises = gpt_numpy.exercises()
    assert len(exercises) >= 10
    for number, exercise in enumerate(exercises, 1):
        twin = broken_twin(tmp_path, exercise["change"], exercise["to"])
        lines = []
        assert not twin.check(log=lines.append), number
        assert check_rows(lines) == (exercise["rows"], exercise["models"]), (number, exercise["title"])
        answer = gpt_numpy.exercise_text(number, answer=True)
        assert all(name in answer for name in [*exercise["rows"], *exercise["models"]]), answer
        assert exercise["change"] in gpt_numpy.exercise_text(number) and "--answer" in gpt_numpy.exercise_text(number)


def test_the_workbook_from_the_command_line(capsys):
    gpt_numpy.main(["--exercise", "list"])
    listed = capsys.readouterr().out
    assert listed.count("\n") == len(gpt_numpy.exercises()) and "layernorm_backward" in listed
    gpt_numpy.main(["--exercise", "5"])
    question = capsys.readouterr().out
    assert "Predict" in question and "Why" not in question and "gpt2 (WRONG)" not in question
    gpt_numpy.main(["--exercise", "5", "--answer"])
    assert "Why: " in capsys.readouterr().out
    for args, says in ((["--exercise", "0"], "a number from 1 to"), (["--exercise", "x"], "a number from 1 to"),
                       (["--answer"], "--answer goes with --exercise N")):
        with pytest.raises(SystemExit) as exit_info:
            gpt_numpy.main(args)
        message = exit_info.value.code if isinstance(exit_info.value.code, str) else capsys.readouterr().err
        assert says in message and exit_info.value.code != 0, message


def test_check_layer_answers_as_the_table_does():
    x = np.random.default_rng(0).standard_normal((4, 5))
    [right] = gpt_numpy.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * 3 * x ** 2, {}), x)
    [wrong] = gpt_numpy.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * 2 * x ** 2, {}), x)
    [nan] = gpt_numpy.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * np.nan, {}), x)
    [raised] = gpt_numpy.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout.sum(-1), {}), x)
    assert (right.verdict, wrong.verdict, nan.verdict, raised.verdict) == ("ok", "WRONG", "WRONG", "ERROR")
    assert right.error < 1e-8 and wrong.error > 0.1 and nan.error == math.inf
    assert re.fullmatch(r"x: ok \(\d\.\de-\d\d, at most 1e-06\)", repr(right)), repr(right)
    assert repr(wrong).startswith("x: WRONG (") and "shape (4,), not x's (4, 5)" in repr(raised)


def test_check_runs_where_torch_cannot_be_imported():
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['gpt_numpy.py', '--check']; "
            "runpy.run_path('gpt_numpy.py', run_name='__main__')")
    done = run_cli("-c", code)
    assert done.returncode == 0, done.stderr
    assert "model (llama): lm_head.weight" in done.stdout and done.stdout.strip().endswith("78 ok, 0 WRONG, 0 ERROR")
    closed = subprocess.Popen([sys.executable, "gpt_numpy.py", "--check"], cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    closed.stdout.readline()
    closed.stdout.close()  # python gpt_numpy.py --check | head -1
    with closed.stderr:
        assert closed.wait(timeout=HANG) in (0, 141) and closed.stderr.read() == b""


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
    out, err = proc.communicate(timeout=HANG)
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


# ---------------------------------------------------------------------------------------------------- faults, round 4
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


@pytest.mark.parametrize("change", ["cut", "new character", "appended", "same size"])
def test_a_text_that_changes_while_it_is_read_is_refused(tmp_path, monkeypatch, change):
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    real = cli.text_chunks
    readings = []

    def changes_after_the_first_reading(name):
        readings.append(name)
        if len(readings) == 2:
            changed = {"cut": TEXT[:20_000], "new character": TEXT[:-1] + "\u00e9",
                       "appended": TEXT + TEXT[:100], "same size": TEXT[::-1]}[change]
            path.write_text(changed, encoding="utf-8")
            os.utime(path, ns=(time.time_ns() + 10 ** 9,) * 2)
        return real(name)

    monkeypatch.setattr(cli, "text_chunks", changes_after_the_first_reading)
    with pytest.raises(ValueError, match=r"changed while it was read: pass --data a text that stays as it is"):
        cli.encode_file(str(path))


def safetensors_bytes(header, data):
    encoded = json.dumps(header).encode()
    return len(encoded).to_bytes(8, "little") + encoded + data


@pytest.mark.parametrize("header, data, match", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, b"\0" * 8, "outside its 8 bytes of data"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1],
      "data_offsets": [4, 8]}}, b"\0" * 8, "the bytes of tensor b overlap the tensor before them"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "leave a gap after them"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, "its tensors end at byte 4 of its 8"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "8 bytes for 3 values of 4 bytes"),
    ({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, b"\0" * 8, "not a list of whole numbers"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "has no type of the format's"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}, b"\0" * 8, "not two whole numbers"),
    ([1, 2], b"", "its header is not a JSON object"),
])
def test_a_safetensors_file_is_held_to_its_format(tmp_path, header, data, match):
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    with pytest.raises(ValueError, match=re.escape(match)):
        gpt2.read_safetensors(str(path))
    twice = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], ' \
            b'"data_offsets": [0, 4]}}'
    path.write_bytes(len(twice).to_bytes(8, "little") + twice + b"\0" * 4)
    with pytest.raises(ValueError, match="its header is not JSON with unique names .the name 'a' comes twice"):
        gpt2.read_safetensors(str(path))
    path.write_bytes((2 ** 40).to_bytes(8, "little") + b"{}")  # a header length past the file and the 100 MB
    with pytest.raises(ValueError, match="or pass the format's 100 MB"):
        gpt2.read_safetensors(str(path))


def nan_weights(folder):
    weights = fixture_weights()
    weights["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")
    header = {}
    data = b""
    for name, w in weights.items():
        raw = w.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    (folder / "model.safetensors").write_bytes(safetensors_bytes(header, data))


class Malicious:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("damage, match", [
    (nan_weights, "(ValueError: its weights hold NaN or inf: the file is damaged)"),
    (damage_config(n_head=2.0), "(ValueError: its config.json gives n_head = 2.0, not a whole number of at least 1)"),
    (damage_config(n_head=0), "gives n_head = 0, not a whole number"),
    (damage_config(n_head=None), "gives n_head = null, not a whole number"),
    (damage_config(n_head=True), "gives n_head = true, not a whole number"),
    (damage_config(n_positions="64"), "gives n_positions = \"64\", not a whole number"),
    (lambda folder: (folder / "config.json").write_text("[1, 2]"), "its config.json is of a None model, not gpt2"),
    (lambda folder: (os.remove(folder / "model.safetensors"),
                     torch.save({"x": Malicious()}, folder / "pytorch_model.bin")),
     "pytorch_model.bin holds code or objects, or is a plain pickle, not tensors as torch.save writes them"),
    (lambda folder: (os.remove(folder / "model.safetensors"),
                     torch.save(fixture_weights(), folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)),
     None),  # an old raw pickle: loaded, with no warning beside the one line on the missing data
    (lambda folder: (os.remove(folder / "config.json"), os.mkfifo(folder / "config.json")),
     "cannot read GPT-2's config"),  # a FIFO, which would block for good
    (lambda folder: (os.remove(folder / "config.json"), os.symlink("/dev/zero", folder / "config.json")),
     "(it is not a regular file)"),  # which would be read until memory ran out
    (lambda folder: (folder / "config.json").write_text(" " * 1_000_001), "more than the 1,000,000 such a file"),
])
def test_gpt2_files_from_outside_are_checked_like_checkpoints(tmp_path, capsys, damage, match):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    damage(folder)
    message = one_line_error(capsys, train, "--init_from", str(folder), "--data", str(tmp_path / "none.bin"),
                             "--out_dir", str(tmp_path / "out"))
    if match is None:
        assert message.startswith("error: cannot read the file of token ids"), message
    else:
        assert f"{folder} holds no GPT-2 this can load (" in message and match in message, message
    assert "weights_only" not in message and "this ran" not in capsys.readouterr().out
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_a_plain_pickle_of_gpt2s_weights_is_refused_in_one_line_without_torchs_warnings(tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    os.remove(folder / "model.safetensors")
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump(fixture_weights(), f)
    done = run_cli("sample.py", "--init_from", str(folder), "--max_new_tokens", "3")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr  # torch's two warnings not beside it
    assert "or is a plain pickle, not tensors as torch.save writes them, so it is not loaded" in done.stderr
    assert "weights_only" not in done.stderr


def fake_transformers(monkeypatch, encode_to):
    """transformers as an offline machine has it: a GPT2TokenizerFast that records how it was asked."""
    asked = []

    class GPT2TokenizerFast:
        @staticmethod
        def from_pretrained(source, **kwargs):
            asked.append((source, kwargs))
            if encode_to is None:
                raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")
            return types.SimpleNamespace(encode=lambda text: list(encode_to), decode=lambda ids: "")

    monkeypatch.setitem(sys.modules, "tiktoken", None)
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(GPT2TokenizerFast=GPT2TokenizerFast))
    return asked


def test_gpt2s_tokenizer_never_waits_on_a_network_and_refuses_one_that_encodes_nothing(monkeypatch):
    asked = fake_transformers(monkeypatch, encode_to=None)
    with pytest.raises(ValueError, match=r"GPT-2's tokenizer files \(vocab.json, merges.txt\) are not in "
                                         r"transformers' cache: pip install tiktoken, or fetch them"):
        gpt2.tokenizer()
    assert asked == [("gpt2", {"local_files_only": True})]  # nothing downloaded unasked
    fake_transformers(monkeypatch, encode_to=[])  # HF_HUB_OFFLINE=1's empty tokenizer
    with pytest.raises(ValueError, match=r"encodes text to nothing: its files \(vocab.json, merges.txt\) are missing"):
        gpt2.tokenizer()
    asked = fake_transformers(monkeypatch, encode_to=[1, 2])
    folder = Path(FIXTURE)
    assert gpt2.tokenizer(str(folder)).encode("x") == [1, 2]
    assert asked == [("gpt2", {"local_files_only": True})]  # the fixture has no tokenizer files


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


def test_a_report_that_cannot_be_written_says_the_checkpoint_is_saved_and_leaves_no_temporary_file(tmp_path, capsys):
    flags = tiny_flags(tmp_path)
    os.makedirs(tmp_path / "out" / "report.html")  # a folder where the page goes
    message = one_line_error(capsys, train, *flags)
    assert re.search(r"cannot write .*report\.html \(Is a directory\): the report was not written; iteration 8 is "
                     r"saved in .*ckpt\.pt$", message), message
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt", "report.html", "train.lock"]
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"), "--data",
                             str(tmp_path / "data.txt"))
    assert "the report was not written; the checkpoint is as it was" in message, message
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt", "report.html", "train.lock"]


def test_concurrent_report_writers_never_share_a_temporary_file(tmp_path, monkeypatch):
    opened = []
    real_open = open
    monkeypatch.setattr(report, "page", lambda *args: "<html></html>")
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    report.write(None, str(tmp_path / "report.html"), None, None, None)
    assert opened == [str(tmp_path / "report.html.4242.tmp")] and os.listdir(tmp_path) == ["report.html"]


def test_sample_py_with_its_output_closed_says_so(trained_dir):
    done = subprocess.run([sys.executable, "sample.py", "--out_dir", trained_dir], cwd=HERE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=HANG, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1 and done.stderr.startswith("error: standard output is closed"), done.stderr
    assert done.stderr.count("\n") == 1


def test_the_nan_stop_names_what_can_cause_it(tmp_path, capsys):
    message = one_line_error(capsys, train, *tiny_flags(tmp_path), "--weight_decay", "1e10")
    said = r"training diverged\. Too high a --learning_rate 0\.003, --muon_lr 0\.01 or --weight_decay 1e\+10, too " \
           r"short a --warmup_iters 2, or --grad_clip 1 \(0: off\) can cause it"
    assert re.search(said, message), message


@pytest.mark.parametrize("flags, match", [
    (["--data", "HUGE_ID.bin", "--dtype", "int64"], "the largest token id, 4,611,686,018,427,387,904, implies a "
                                                     "vocabulary of 4,611,686,018,427,387,905, beyond the 1,048,576"),
    (["--data", "MAX_U32.bin", "--dtype", "uint32"], "implies a vocabulary of 4,294,967,296, beyond the 1,048,576"),
    (["--data", "NEGATIVE.bin", "--dtype", "int32", "--vocab_size", "10"], "these go from -1 to 5"),
    (["--data", "IDS.bin", "--vocab_size", str(10 ** 12)], "argument --vocab_size: must be in [1, 1048577)"),
])
def test_token_ids_that_would_build_a_vocabulary_beyond_any_run_are_one_line(tmp_path, capsys, flags, match):
    np.array([0, 5, 2 ** 62] * 1000, dtype=np.int64).tofile(tmp_path / "HUGE_ID.bin")
    np.array([0, 5, 2 ** 32 - 1] * 1000, dtype=np.uint32).tofile(tmp_path / "MAX_U32.bin")
    np.array([0, 5, -1] * 1000, dtype=np.int32).tofile(tmp_path / "NEGATIVE.bin")
    np.arange(3000, dtype=np.uint16).tofile(tmp_path / "IDS.bin")
    flags = [str(tmp_path / f) if f.endswith(".bin") else f for f in flags]
    message = one_line_error(capsys, train, *tiny_flags(tmp_path), *flags)
    assert match in message, message


def test_a_long_evaluation_runs_batch_by_batch_and_a_signal_ends_it_at_once(tmp_path, monkeypatch):
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=3, eval_iters=10 ** 9)
    proc = subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("iter 3/"):  # the evaluation of a billion batches begins
            break
    time.sleep(1.0)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 143 and time.time() - sent < 10 and err == "", (out, err)
    assert "SIGTERM: the evaluation was cut short; saved iteration 3 to" in out, out
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 3


def test_under_torchrun_processes_with_other_options_and_a_lost_process_are_one_line(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=4)
    ended = run_ddp_command_lines([flags, [*flags, "--learning_rate", "1e-3", "--grad_clip", "0.5"]])
    assert ended[0] == (1, "error: process 1 of 2 was given other options than process 0 (--learning_rate, "
                           "--grad_clip): give every process the same\n") and ended[1] == (1, ""), ended
    port = free_port()
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=10 ** 5)
    processes = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        processes.append(subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                                          env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for line in processes[0].stdout:
        if line.startswith("iter 5/"):
            break
    processes[1].kill()  # a worker lost mid-training
    processes[1].communicate(timeout=HANG)
    _, err = processes[0].communicate(timeout=HANG)
    assert processes[0].returncode == 1 and err.count("\n") == 1, err
    assert re.fullmatch(r"error: process 0 of 2 lost touch with the others at iteration \d+ \(.+\): another "
                        r"process stopped; the last checkpoint in .*out is as it was\n", err), err


def test_bench_with_another_projects_model_py_is_one_line(tmp_path):
    (tmp_path / "model.py").write_text("class GPTConfig:\n    pass\n\nclass GPT:\n    def __init__(self, config):\n"
                                       "        raise TypeError('this GPT takes no config')\n")
    done = run_cli("bench.py", "--nanogpt", str(tmp_path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: the GPT of {tmp_path}/model.py does not run as nanoGPT's does (TypeError: ")
    os.remove(tmp_path / "model.py")
    os.mkfifo(tmp_path / "model.py")
    done = run_cli("bench.py", "--nanogpt", str(tmp_path))
    assert done.returncode == 1 and "(it is not a regular file)" in done.stderr, done.stderr


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

    def out_of_memory():
        raise RuntimeError("out of memory")

    monkeypatch.setattr(bench, "our_step", lambda *args: out_of_memory)  # an error of this project's own side
    with pytest.raises(RuntimeError, match="out of memory"):
        bench.versus_nanogpt(nano, torch.device("cpu"))


# ---------------------------------------------------------------------------------------------------- the optimizers
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest_on_one_schedule(tmp_path):
    tc = tiny_train_config(tmp_path, optimizer="muon", out_dir="", muon_lr=0.02, learning_rate=4e-3, tie_weights=False)
    trainer = gpt.Trainer(tc, TEXT, log=quiet)
    adamw, matrices = trainer.optimizers
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    muon_names = [names[id(p)] for group in matrices.param_groups for p in group["params"]]
    adamw_names = [names[id(p)] for group in adamw.param_groups for p in group["params"]]
    assert muon_names and all(n.startswith("h.") and n.endswith("weight") and "ln_" not in n for n in muon_names)
    assert sorted(muon_names + adamw_names) == sorted(names.values())  # each parameter in one optimizer
    assert {"wte.weight", "lm_head.weight", "ln_f.weight"} <= set(adamw_names)
    for _ in zip(range(3), trainer.steps()):
        assert all(g["lr"] == trainer.lr for g in adamw.param_groups)
        assert matrices.param_groups[0]["lr"] == pytest.approx(trainer.lr * 0.02 / 4e-3)
    with pytest.raises(ValueError, match="optimizer must be adamw or muon, not 'Muon'"):
        gpt.Trainer(replace(tc, optimizer="Muon"), TEXT, log=quiet)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_both_optimizers_train(tmp_path, optimizer):
    tc = tiny_train_config(tmp_path, optimizer=optimizer, max_iters=200, eval_interval=200, learning_rate=6e-3,
                           batch_size=16, block_size=32, n_embd=32, out_dir="")
    trainer = gpt.Trainer(tc, TEXT, log=quiet)
    for _ in trainer.steps():
        pass
    assert len(trainer.optimizers) == (2 if optimizer == "muon" else 1)
    assert trainer.history[-1]["val"] < math.log(len(set(TEXT))) - 1.2, trainer.history


# Muon's options as torch.optim.Muon takes them, beyond those gpt.configure_optimizers gives.
MUON_OPTIONS = [dict(weight_decay=0.1), dict(nesterov=False, weight_decay=0.0),
                dict(adjust_lr_fn="match_rms_adamw", momentum=0.9, ns_steps=3)]


@pytest.mark.parametrize("options", MUON_OPTIONS)
def test_batched_muon_steps_as_torch_muon_does_on_matrices_of_every_shape(options):
    # Tall, wide and square; three of a shape once the tall are turned wide (one batch), and one alone.
    shapes = [(48, 16), (16, 48), (16, 16), (48, 16), (32, 8)]
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    batched = muon.BatchedMuon(ours, lr=0.02, **options)
    reference = torch.optim.Muon(theirs, lr=0.02, **options)
    start = [p.detach().clone() for p in ours]
    for _ in range(3):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape)
            q.grad = p.grad.clone()
        assert batched.step(lambda: torch.tensor(1.5)) == 1.5  # a closure's loss comes back, as torch's does
        reference.step()
    for p, q, p0 in zip(ours, theirs, start):
        # torch runs the products in bfloat16; a batched product may round otherwise than a lone one, by far less
        # than 2% of what three steps move. Without the Nesterov term, the decay or the shape scale, 15% or more.
        assert torch.linalg.norm(p - q) < 0.02 * torch.linalg.norm(q - p0), p.shape
        assert torch.allclose(batched.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"])


def test_batched_replaces_torch_muon_alone_with_its_options_and_state_and_either_resumes_the_others_state():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY))
    tc = gpt.TrainConfig(optimizer="muon", muon_lr=0.02, muon_momentum=0.9, weight_decay=0.05)
    adamw, plain = gpt.configure_optimizers(model, tc)
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    gpt.train_step(model, [adamw, plain], [(idx, idx)])  # a state to carry
    same_adamw, fast = muon.batched([adamw, plain])
    assert same_adamw is adamw and type(fast) is muon.BatchedMuon
    assert fast.param_groups[0]["params"] == plain.param_groups[0]["params"]
    for option in ("lr", "momentum", "weight_decay", "nesterov", "ns_steps", "ns_coefficients", "eps"):
        assert fast.param_groups[0][option] == plain.param_groups[0][option], option
    for p in plain.param_groups[0]["params"]:
        assert torch.equal(fast.state[p]["momentum_buffer"], plain.state[p]["momentum_buffer"])
    # A checkpoint's Muon state loads into either, and fits either as check_resumable sees it.
    assert cli.state_fits(plain, fast.state_dict()) and cli.state_fits(fast, plain.state_dict())
    plain.load_state_dict(fast.state_dict())
    adamw_state = gpt.configure_optimizers(model, replace(tc, optimizer="adamw"))[0].state_dict()
    assert not cli.state_fits(fast, adamw_state)


def test_a_checkpoint_resumes_with_its_own_optimizer_and_a_forged_muon_state_is_refused(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=2, optimizer="muon")
    train.main(flags)
    message = one_line_error(capsys, train, *flags, "--resume", "--max_iters", "4", "--optimizer", "adamw")
    assert "was trained with --optimizer muon, whose state it holds: resume it with that optimizer" in message
    good = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    buffer = good["optimizers"][1]["state"][0]["momentum_buffer"]
    for forge in (lambda c: c["optimizers"][1]["state"][0].update(momentum_buffer=torch.zeros(3, 3)),
                  lambda c: c["optimizers"][1]["state"][0].update(momentum_buffer=buffer.double()),
                  lambda c: c["optimizers"][1]["state"][0].update(exp_avg=buffer),
                  lambda c: c["optimizers"].reverse(),  # AdamW's state where Muon's goes
                  lambda c: c["optimizers"].pop()):
        ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
        forge(ckpt)
        torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
        message = one_line_error(capsys, train, *flags, "--resume", "--max_iters", "4")
        assert "holds a training state that does not fit its model: the optimizers' states" in message, message
        torch.save(good, tmp_path / "out" / "ckpt.pt")


def test_bench_times_muons_step_one_matrix_at_a_time_and_batched(monkeypatch):
    stepped = []

    def once(fns, *args, **kwargs):  # each step taken once, timed as a second
        for name, fn in fns.items():
            fn()
            stepped.append((name, type(fn.__self__)))
        return dict.fromkeys(fns, 1.0)

    monkeypatch.setattr(bench, "interleaved", once)
    assert bench.bench_muon(torch.device("cpu")) == {"torch.optim.Muon": 1000.0, "muon.BatchedMuon": 1000.0}
    assert stepped == [("torch.optim.Muon", torch.optim.Muon), ("muon.BatchedMuon", muon.BatchedMuon)]


def test_bench_compares_the_optimizers_at_equal_wall_time(tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    runs = bench.bench_optimizers(0.5, str(tmp_path / "t.txt"), n_layer=1, n_embd=16, n_head=2, block_size=16)
    assert set(runs) == {"adamw", "muon"}
    for run in runs.values():
        assert run["iters"] >= 1 and run["ms_per_iter"] > 0 and 0 < run["val_loss"] < 10
