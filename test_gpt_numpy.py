"""Tests of gpt_numpy.py on its own: its gradients, training, check table, workbook and demo.
Its agreement with PyTorch is in test_gpt.py.
"""
import importlib.util
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import gpt2
import gpt_numpy
from conftest import (HERE, TINY, TEXT, HANG, run_cli, interrupted, fixture_weights, fixture_logits, TWIN_CONFIGS,
                      twin_pair, zero_gradient)


# ---------------------------------------------------------------------------------------------------- the twin
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


def test_the_twin_runs_gpt2s_weights():
    model = gpt2.from_state_dict(fixture_weights(), n_head=2).eval()
    twin = gpt_numpy.GPT(model.config, {n: p.detach().numpy() for n, p in model.named_parameters()})  # the README's
    ids, expected = fixture_logits()
    np.testing.assert_allclose(twin.forward(ids.numpy())[0], expected.numpy(), rtol=1e-4,
                               atol=1e-5 * expected.abs().max().item())


# ---------------------------------------------------------------------------------------------------- the check table
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


# ---------------------------------------------------------------------------------------------------- the workbook
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


# ---------------------------------------------------------------------------------------------------- the demo
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


def test_ctrl_c_ends_the_twin_demo_early_and_it_still_shows_what_it_learned(tmp_path):
    (tmp_path / "text").write_text(TEXT, encoding="utf-8")
    status, out, err = interrupted(["gpt_numpy.py", str(tmp_path / "text"), "--seconds", "600"], "step 0: loss")
    assert status == 0 and err == "", err
    assert re.search(r"Ctrl-C: training stopped .*\nafter \d+ steps at \d+ ms/step: val loss \d\.\d+\nsample:\n.{20}",
                     out, re.S), out


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
