"""Tests of gpt_numpy.py on its own: its layout, gradients, training, check table (in-place writes included),
workbook and demo.
Its agreement with PyTorch is in test_gpt.py.
"""
import concurrent.futures
import importlib.util
import json
import multiprocessing
import tempfile
import math
import ast
import fnmatch
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import gpt2
import gpt_numpy
import workbook
from conftest import (HERE, TINY, TEXT, HANG, run_cli, interrupted, fixture_weights, fixture_logits, TWIN_CONFIGS,
                      twin_pair, zero_gradient)


def run_main(capsys, *args, twin=gpt_numpy):
    """workbook.main(args) on twin in this process, as python gpt_numpy.py args would run it: its exit status,
    stdout and stderr (a sys.exit message printed to stderr, exit status 1, as Python does)."""
    try:
        workbook.main(list(args), twin=twin)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    if isinstance(code, str):
        code, err = 1, err + code + "\n"
    return subprocess.CompletedProcess(args, code or 0, out, err)


@pytest.fixture(scope="module")
def reference_table():
    """The lines of the whole check table of gpt_numpy.py as it is, and whether it passed."""
    lines = []
    return workbook.check(log=lines.append), tuple(lines)


@pytest.fixture(scope="module")
def reference_models():
    """The lines of --check model of gpt_numpy.py as it is, and whether it passed."""
    lines = []
    return workbook.check(log=lines.append, only="model"), tuple(lines)


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
    optimizer = workbook.AdamW(twin.params, lr=1e-2)
    rng = np.random.default_rng(0)
    for step in range(200):
        ix = rng.integers(len(data) - 17, size=8)
        xy = np.stack([data[i:i + 17] for i in ix])
        _, loss = twin.forward(xy[:, :-1], xy[:, 1:])
        optimizer.step(twin.backward())
    assert loss < 0.25 * math.log(len(chars)), loss
    out = workbook.generate(twin, data[None, :5], 40, temperature=0)
    drawn = lambda seed: workbook.generate(twin, data[None, :5], 20, temperature=2.0, top_k=5, top_p=0.9,
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


# ---------------------------------------------------------------------------------------------------- the lesson
def test_gpt_numpy_is_the_lesson_alone_read_in_the_order_it_is_learned():
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    assert len(lines) <= 650
    # The two rules, numbered where they are stated, and cited by those numbers alone.
    assert "Rule 1. A value used twice gets the sum of its gradients" in source
    assert "Rule 2. A broadcast in the forward is a sum in the backward" in source
    cited = re.findall(r"\brule (\d)", source)
    assert len(cited) >= 8 and set(cited) == {"1", "2"}, cited
    # How a backward is checked (the fake loss, finite differences) before the first layer, the layers before the model,
    # the model's forward before its backward.
    order = [source.index(text) for text in ('"fake loss"', '"central finite', "def numerical_gradient",
                                             "def layer_gradients", "def linear_forward", "def softmax_backward",
                                             "def rope_forward", "def attention_backward", "class GPT:",
                                             "def forward(self", "def backward(self")]
    assert order == sorted(order)
    # RoPE's forward explained: why channel j pairs with j + hs/2, why [-x2, x1] is a turn.
    above_rope = source[source.index("# Rotary positions"):source.index("def rope_forward")]
    assert "Channel j pairs with j + hs/2" in above_rope and "[-x2, x1] turns every pair a right angle" in above_rope
    # A derivation above each backward, and the shape of each gradient it makes beside it (or just above).
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.endswith("backward"):
            assert lines[node.lineno - 2].lstrip().startswith("#"), node.name
            for number in range(node.body[0].lineno, node.end_lineno + 1):
                line = lines[number - 1]
                if re.match(r"\s*d(?!outs\b)\w+ \+?= ", line):
                    assert "# (" in line or lines[number - 2].strip().endswith(")"), (node.name, line)
    # What is not the lesson is in workbook.py: sampling, the optimizers, the check's table, the workbook, the demo.
    for name in ("generate", "filter_logits", "AdamW", "Muon", "newton_schulz", "Row", "check", "check_model",
                 "exercises", "main"):
        assert hasattr(workbook, name) and not hasattr(gpt_numpy, name), name
    assert not hasattr(gpt_numpy.GPT, "generate")
    # The bigram table explained where the forward reads it; the asides on speed and on PyTorch beside the lesson.
    forward = source[source.index("def forward(self"):source.index("def backward(self")]
    assert "The bigram table: a second embedding, read by the pair (token before, token)" in forward
    assert not re.search(r"slower|faster|bit for bit|PyTorch", source), re.findall(r".*(?:slower|PyTorch).*", source)
    assert "x ** 3 is far slower" in Path(HERE, "workbook.py").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------ a weight for each map
GPT2 = TWIN_CONFIGS["gpt2"]
LLAMA = TWIN_CONFIGS["llama"]


def twin_of(switches, seed=0, **overrides):
    """A twin in float64 with its weights moved off their init values (gains off 1, biases off 0)."""
    config = gpt_numpy.GPTConfig(**{**dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16), **switches,
                                    **overrides})
    rng = np.random.default_rng(seed)
    params = {n: w + 0.2 * rng.standard_normal(w.shape)
              for n, w in gpt_numpy.init_params(config, seed=seed, dtype=np.float64).items()}
    idx = rng.integers(0, config.vocab_size, (3, 7))
    targets = rng.integers(0, config.vocab_size, (3, 7))
    return gpt_numpy.GPT(config, params), idx, targets


def test_every_map_has_a_weight_of_its_own():
    C = 48  # GELU's hidden width 4 C = 192, SwiGLU's 64 * ceil(8 C / 3 / 64) = 128: they differ
    for switches, hidden in ((GPT2, 192), (LLAMA, 128)):
        config = gpt_numpy.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=C, **switches)
        block = {n: w.shape for n, w in gpt_numpy.init_params(config).items() if n.startswith("h.0.")}
        weights = {"attn.c_q": (C, C), "attn.c_k": (C, C), "attn.c_v": (C, C), "attn.c_proj": (C, C),
                   "mlp.c_fc": (hidden, C), "mlp.c_proj": (C, hidden)}
        if switches["mlp"] == "swiglu":
            weights["mlp.c_gate"] = (hidden, C)
        expected = {f"h.0.{n}.weight": shape for n, shape in weights.items()}
        expected.update({f"h.0.{n}.bias": (shape[0],) for n, shape in weights.items() if switches["bias"]})
        norms = ("ln_1", "ln_2")
        expected.update({f"h.0.{n}.weight": (C,) for n in norms})
        expected.update({f"h.0.{n}.bias": (C,) for n in norms if switches["norm"] == "layernorm"})
        assert block == expected


@pytest.mark.parametrize("switches", [GPT2, LLAMA])
def test_the_block_computes_from_its_maps_as_gpt_py_does(switches):
    twin, idx, targets = twin_of(switches)
    twin.forward(idx, targets)
    saved = twin.saved
    p = twin.params
    # The same normed input reaches the three maps of the attention.
    h = saved["h.0.attn.c_q"][0]
    assert saved["h.0.attn.c_k"][0] is h and saved["h.0.attn.c_v"][0] is h
    v = (h @ p["h.0.attn.c_v.weight"].T + p.get("h.0.attn.c_v.bias", 0)).reshape(3, 7, 2, 8).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(saved["h.0.attn"].v, v, rtol=1e-12, atol=1e-12)
    h = saved["h.0.mlp.c_fc"][0]
    up = h @ p["h.0.mlp.c_fc.weight"].T + p.get("h.0.mlp.c_fc.bias", 0)
    if switches["mlp"] == "swiglu":
        assert saved["h.0.mlp.c_gate"][0] is h
        gate = h @ p["h.0.mlp.c_gate.weight"].T
        expected = gate / (1 + np.exp(-gate)) * up  # silu(c_gate(x)) * c_fc(x)
    else:
        expected = 0.5 * up * (1 + np.tanh(math.sqrt(2 / math.pi) * (up + 0.044715 * up ** 3)))
    np.testing.assert_allclose(saved["h.0.mlp.c_proj"][0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("switches", [GPT2, LLAMA])
def test_an_input_read_by_several_maps_gets_the_sum_of_their_gradients(switches):
    twin, idx, targets = twin_of(switches)
    twin.forward(idx, targets)
    _, douts = twin.backward(activations=True)
    maps = {"ln_1": ["attn.c_q", "attn.c_k", "attn.c_v"]}
    if switches["mlp"] == "swiglu":
        maps["ln_2"] = ["mlp.c_fc", "mlp.c_gate"]
    for block in ("h.0.", "h.1."):
        for norm, readers in maps.items():
            parts = [gpt_numpy.linear_backward(douts[block + r], twin.saved[block + r])[0] for r in readers]
            # The gradient at the norm's output, as its backward received it.
            np.testing.assert_allclose(douts[block + norm], sum(parts), rtol=1e-12, atol=1e-15)
            for part in parts:
                assert gpt_numpy.rel_error(part, douts[block + norm]) > 0.01  # no one path alone


def test_the_keys_bias_has_a_gradient_of_zero_with_learned_positions_and_not_with_rope():
    for pos, zero in (("learned", True), ("rope", False)):
        twin, idx, targets = twin_of({**GPT2, "pos": pos})
        twin.forward(idx, targets)
        grads = twin.backward()
        largest = max(np.abs(g).max() for g in grads.values())
        for block in ("h.0.", "h.1."):
            keys_bias = np.abs(grads[block + "attn.c_k.bias"]).max()
            # Softmax ignores a shift every key of a row shares; rope turns the bias by each position's angle.
            assert (keys_bias <= 1e-12 * largest) == zero, (pos, keys_bias, largest)
            assert np.abs(grads[block + "attn.c_q.bias"]).max() > 1e-3 * largest


# ---------------------------------------------------------------------------------------------------- the check table
def test_the_gradient_check_passes_on_the_twin_and_names_every_layer(reference_table):
    passed, lines = reference_table
    assert passed
    table = "\n".join(lines)
    for layer in ("crossentropy", "linear", "layernorm", "rmsnorm", "gelu", "swiglu", "attention", "attention, rope",
                  "softmax", "rope", "embedding", "model (gpt2): h.1.mlp.c_fc.bias", "model (llama): lm_head.weight",
                  "model (llama): bigram.weight"):
        assert f"\n{layer}" in table, layer
    assert not [line for line in lines[:-1] if line.endswith("WRONG")] and lines[-1] == "83 ok, 0 WRONG, 0 ERROR"


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
    # the piece, checked before the attention that calls it
    ("rope_backward", lambda dout, saved: (gpt_numpy.rope_forward(dout, *saved)[0], {}), "rope: dx"),
])
def test_a_broken_backward_makes_the_check_fail_and_names_its_layer(monkeypatch, name, broken, first_wrong):
    monkeypatch.setattr(gpt_numpy, name, broken)
    lines = []
    # The layer's rows and those of the layers that call it (rope's, attention's after it); the models' rows turn
    # in the workbook's exercises.
    assert not workbook.check(log=lines.append, only=name[:-len("_backward")], models=False)
    assert re.search(f"WRONG, 0 ERROR: first {re.escape(first_wrong)}$", lines[-1]), lines[-1]


def verdicts(lines):
    """{row name: ok, WRONG or ERROR} of a --check table."""
    return {line[:44].strip(): line[61:].split()[0] for line in lines[1:-1]}


def check_rows(lines):
    """The rows of a --check table that are not ok: {layer row: verdict}, {model: verdict}."""
    rows = {}
    models = {}
    for name, verdict in verdicts(lines).items():
        if verdict != "ok" and name.startswith("model ("):
            models[name[len("model ("):name.index(")")]] = verdict
        elif verdict != "ok":
            rows[name] = verdict
    return rows, models


def with_the_workbook(folder):
    """folder, given workbook.py, the gpt_numpy.py it imports and the known logits it reads (not workbook.json)."""
    for name in ("workbook.py", "gpt_numpy.py"):
        shutil.copy(Path(HERE, name), folder / name)
    (folder / "fixtures").mkdir(exist_ok=True)
    shutil.copy(Path(HERE, "fixtures", "twin_logits.json"), folder / "fixtures" / "twin_logits.json")
    return folder


def imported(path):
    """The Python file at path, imported as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"twin_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    # From its text as it is now: a bytecode cache of a rewrite of the same size in the same second would be stale.
    exec(compile(Path(path).read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module


def broken_twin(tmp_path, change, to):
    """A copy of gpt_numpy.py with one line changed, imported as a module of its own."""
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    assert source.count(change) == 1, change  # the line to change is in the file, once
    path = with_the_workbook(tmp_path) / "broken_twin.py"
    path.write_text(source.replace(change, to), encoding="utf-8")
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
def test_a_backward_that_raises_or_turns_nan_is_a_row_and_the_table_goes_on_to_its_end(tmp_path, capsys, change, to,
                                                                                      says):
    twin = broken_twin(tmp_path, change, to)
    # python broken_twin.py --check: a raise or a NaN ends in no traceback, and the check fails.
    done = run_main(capsys, "--check", twin=twin)
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert "model (llama): " in lines[-2] and any(line.startswith("embedding: ") for line in lines), lines  # to the end
    assert re.fullmatch(r"\d+ ok, \d+ WRONG, \d+ ERROR: first .+", lines[-1]) and not lines[-1].startswith("83 ok")
    assert says is None or any(says in line for line in lines), lines


def test_check_layer_answers_as_the_table_does():
    x = np.random.default_rng(0).standard_normal((4, 5))
    [right] = workbook.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * 3 * x ** 2, {}), x)
    [wrong] = workbook.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * 2 * x ** 2, {}), x)
    [nan] = workbook.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout * np.nan, {}), x)
    [raised] = workbook.check_layer(lambda x: (x ** 3, x), lambda dout, x: (dout.sum(-1), {}), x)
    assert (right.verdict, wrong.verdict, nan.verdict, raised.verdict) == ("ok", "WRONG", "WRONG", "ERROR")
    assert right.error < 1e-8 and wrong.error > 0.1 and nan.error == math.inf
    assert re.fullmatch(r"x: ok \(\d\.\de-\d\d, at most 1e-06\)", repr(right)), repr(right)
    assert repr(wrong).startswith("x: WRONG (") and "shape (4,), not x's (4, 5)" in repr(raised)
    [unpaired] = workbook.check_layer(lambda x: (x ** 3, x), lambda dout, x: dout * 3 * x ** 2, x)  # no dparams
    said = "ERROR (ValueError: a backward returns a pair, (dx, {parameter's name: its gradient}), not a ndarray ("
    assert said in repr(unpaired), repr(unpaired)


def test_check_runs_where_torch_cannot_be_imported():
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['gpt_numpy.py', '--check']; "
            "runpy.run_path('gpt_numpy.py', run_name='__main__')")
    done = run_cli("-c", code)
    assert done.returncode == 0, done.stderr
    assert "model (llama): lm_head.weight" in done.stdout and done.stdout.strip().endswith("83 ok, 0 WRONG, 0 ERROR")
    closed = subprocess.Popen([sys.executable, "gpt_numpy.py", "--check"], cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    closed.stdout.readline()
    closed.stdout.close()  # python gpt_numpy.py --check | head -1
    with closed.stderr:
        assert closed.wait(timeout=HANG) in (0, 141) and closed.stderr.read() == b""


def test_the_check_has_a_row_for_each_input_and_each_weight_and_every_one_is_ok(reference_table):
    passed, lines = reference_table
    assert passed
    rows = verdicts(lines)
    assert set(rows.values()) == {"ok"} and lines[-1] == f"{len(rows)} ok, 0 WRONG, 0 ERROR"
    for name in ("swiglu: dgate", "swiglu: dup", "attention: dq", "attention: dk", "attention: dv",
                 "attention, rope: dq", "attention, rope: dk", "attention, rope: dv", "linear: dweight"):
        assert name in rows, name
    for block, switches in (("gpt2", GPT2), ("llama", LLAMA)):
        config = gpt_numpy.GPTConfig(vocab_size=7, block_size=5, n_layer=2, n_head=2, n_embd=8, **switches)
        tensors = {name[len(f"model ({block}): "):] for name in rows if name.startswith(f"model ({block}): ")}
        assert tensors == set(gpt_numpy.init_params(config))


def test_a_model_gradient_of_zeros_is_wrong_where_the_true_one_is_not(tmp_path):
    # Every gradient of the model zero: no scale of its own, yet never ok against finite differences that are not.
    twin = broken_twin(tmp_path, 'grads[f"{params or name}.{key}"] += g', 'grads[f"{params or name}.{key}"] += 0 * g')
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    rows = verdicts(lines)
    model = {name: v for name, v in rows.items() if name.startswith("model (")}
    # The keys' bias of GPT-2's block aside, whose true gradient is zero too.
    assert len(model) > 50 and all(v == "WRONG" for n, v in model.items() if not n.endswith("attn.c_k.bias")), model
    assert all(v == "ok" for name, v in rows.items() if name not in model)


def test_a_backward_that_raises_names_its_layer_and_line_on_every_row_it_touches_and_the_rest_run(tmp_path):
    change = "return p * (dout - (dout * p).sum(-1, keepdims=True)), {}"
    twin = broken_twin(tmp_path, change, "return p * (dout - (dout * p).sum(-1)), {}")  # a lost keepdims
    source = Path(twin.__file__).read_text(encoding="utf-8")
    line = source.split(change.replace(", keepdims=True", ""))[0].count("\n") + 1
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    rows = verdicts(lines)
    assert len(rows) == 83 and lines[-1].endswith("ERROR: first softmax: dx")  # every row, the piece first
    where = f"ValueError: operands could not be broadcast together with shapes (3,5,5) (3,5) (in softmax_backward, " \
            f"broken_twin.py:{line})"
    assert any(row.startswith("softmax: dx") and row.endswith(where) for row in lines), lines
    raised = [row for row in lines if row[61:].startswith("ERROR")]
    assert all(f"(in softmax_backward, broken_twin.py:{line})" in row for row in raised)
    # What does not call softmax runs and passes; each model tensor gets its own ERROR row.
    assert {name for name, v in rows.items() if v == "ERROR"} == {"softmax: dx"} | {
        name for name in rows if name.startswith(("attention", "model ("))}
    assert all(v == "ok" for name, v in rows.items() if name.startswith(("linear", "layernorm", "rope:", "forward")))


@pytest.mark.parametrize("name, broken, says", [
    ("crossentropy_backward", lambda dloss, saved: ((saved[0] - np.eye(saved[0].shape[-1])[saved[1]]) * dloss, {}),
     "crossentropy: dx .* WRONG  15 times the right one$"),  # the 1/N of N = 15 positions dropped
    ("softmax_backward", lambda dout, p: (-p * (dout - (dout * p).sum(-1, keepdims=True)), {}),
     "softmax: dx .* WRONG  the sign flipped$"),
    ("gelu_backward", lambda dout, saved, right=gpt_numpy.gelu_backward: (0.5 * right(dout, saved)[0], {}),
     "gelu: dx .* WRONG  0.5 times the right one$"),
    ("rmsnorm_backward", lambda dout, saved: (2 * saved[1] * dout * saved[2],
                                              {"weight": (dout * saved[0]).sum((0, 1))}),
     r"rmsnorm: dx .* WRONG  \d+ of 120 entries differ, the most at \[\d, \d, \d\]: ours -?[\d.]+(e[-+]\d+)? vs "
     r"finite differences -?\d"),
])
def test_a_wrong_row_says_its_constant_factor_or_where_it_differs(monkeypatch, name, broken, says):
    monkeypatch.setattr(gpt_numpy, name, broken)
    lines = []
    assert not workbook.check(log=lines.append, only=name[:-len("_backward")], models=False)  # the layer's rows
    assert any(re.search(says, row) for row in lines), "\n".join(lines)


def test_check_name_runs_one_layers_rows_then_what_calls_it_and_the_models_that_use_it(capsys):
    for name, layers, blocks in (("layernorm", ["layernorm"], ["gpt2"]),
                                 ("softmax", ["softmax", "attention", "attention, rope"], ["gpt2", "llama"]),
                                 ("rope", ["rope", "attention, rope"], ["llama"]), ("model", [], ["gpt2", "llama"])):
        lines = []
        assert workbook.check(log=lines.append, only=name)
        rows = list(verdicts(lines))
        layer_rows = [row for row in rows if "(" not in row]
        # The layer's rows first, then those of the layers that call it, then the models'.
        assert list(dict.fromkeys(row.split(": ")[0] for row in layer_rows)) == layers
        assert rows[:len(layer_rows)] == layer_rows
        assert {row[row.index("(") + 1:row.index(")")] for row in rows if "(" in row} == set(blocks)
    with pytest.raises(SystemExit) as exit_info:
        workbook.main(["--check", "layernorm"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("layer input")
    with pytest.raises(SystemExit) as exit_info:
        workbook.main(["--check", "layer_norm"])
    message = capsys.readouterr().err
    assert exit_info.value.code == 2 and message.count("\n") == 1
    assert "'layernorm'" in message and "'layer_norm'" in message


@pytest.mark.parametrize("change, to, wrong", [
    ("k=1)", "k=2)", {"forward (gpt2): causality", "forward (gpt2): known logits", "forward (llama): causality",
                      "forward (llama): known logits"}),  # each position sees the next token
    ("scale = 1 / math.sqrt(hs)", "scale = 1 / hs", {"forward (gpt2): known logits", "forward (llama): known logits"}),
])
def test_a_forward_that_has_left_gpt_py_fails_the_forward_rows(tmp_path, change, to, wrong):
    twin = broken_twin(tmp_path, change, to)
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    # Every gradient still agrees with finite differences of this forward: only the forward's rows can see it.
    assert {name for name, v in verdicts(lines).items() if v != "ok"} == wrong
    assert lines[-1].endswith(f"first {sorted(wrong)[0]}") and "vs gpt.py's" in "\n".join(lines)


def test_the_first_wrong_row_names_the_piece_not_what_calls_it(monkeypatch):
    half = lambda dout, p: (0.5 * p * (dout - (dout * p).sum(-1, keepdims=True)), {})
    monkeypatch.setattr(gpt_numpy, "softmax_backward", half)
    lines = []
    assert not workbook.check(log=lines.append)
    rows = verdicts(lines)
    assert rows["attention: dq"] == rows["attention, rope: dk"] == "WRONG"  # the callers turn too
    assert lines[-1].endswith("first softmax: dx")


# ------------------------------------------------------------------------------------ the check against in-place writes
def cube_forward(x):
    return x * x * x, x


def test_check_layer_is_not_fooled_by_a_backward_that_writes_into_its_arrays():
    x = np.random.default_rng(0).standard_normal((4, 5))

    def scales_dout(dout, x):
        dout *= 2
        return dout * 3 * x ** 2, {}  # twice the gradient

    def adds_to_x(dout, x):
        x += 1
        return dout * 3 * x ** 2, {}  # the gradient at x + 1

    for backward in (scales_dout, adds_to_x):
        [row] = workbook.check_layer(cube_forward, backward, x)
        assert row.verdict == "WRONG" and row.error > 0.1, (backward.__name__, row)


def test_check_layer_passes_a_right_gradient_whatever_the_forward_writes_in_place():
    x = np.random.default_rng(0).standard_normal((4, 5))
    kept = x.copy()

    def cube_in_place(x):
        saved = x.copy()
        x *= x * x  # out is the input array itself
        return x, saved

    [row] = workbook.check_layer(cube_in_place, lambda dout, x: (dout * 3 * x ** 2, {}), x)
    assert row.verdict == "ok", row
    assert np.array_equal(x, kept)  # the caller's array as it was


def test_a_right_backward_that_writes_into_dout_or_what_was_saved_is_named_at_its_own_rows():
    x = np.random.default_rng(0).standard_normal((4, 5))

    def right_in_place(dout, x):
        dout *= 3 * x ** 2
        return dout, {}

    def spoils_x(dout, x):
        dx = dout * 3 * x ** 2
        x += 1  # after use
        return dx, {}

    def scale_forward(x, weight):
        return x * weight, (x, weight)

    def spoils_the_weight(dout, saved):
        x, weight = saved
        dx = dout * weight
        weight += 5  # after use
        return dx, {"weight": (dout * x).sum(0)}

    for forward, backward, params, says in (
            (cube_forward, right_in_place, {}, "right_in_place changed dout in place"),
            (cube_forward, spoils_x, {}, "spoils_x changed x, which its forward saved, in place"),
            (scale_forward, spoils_the_weight, dict(weight=np.linspace(1, 2, 5)),
             "spoils_the_weight changed weight, which its forward saved, in place")):
        rows = workbook.check_layer(forward, backward, x, **params)
        # The gradients are right, and each row of the layer says what the backward changed.
        assert all(row.error < 1e-8 and row.verdict == "WRONG" and says in str(row) for row in rows), rows
    # Written into a copy, the same backward passes.
    [row] = workbook.check_layer(cube_forward, lambda dout, x: right_in_place(dout.copy(), x), x)
    assert row.verdict == "ok", row


LINEAR_DOUT = "    dout2 = dout.reshape(-1, dout.shape[-1])  # (B*T, out)\n"
LINEAR_END = "        dparams[\"bias\"] = dout2.sum(0)  # (out,)\n    return dx, dparams\n"


@pytest.mark.parametrize("change, to, wrong", [
    (LINEAR_DOUT, LINEAR_DOUT + "    dout2 *= 2\n", {"linear: dx", "linear: dweight", "linear: dbias"}),
    (LINEAR_DOUT, "    dout *= 2\n" + LINEAR_DOUT, {"linear: dx", "linear: dweight", "linear: dbias"}),
    (LINEAR_DOUT, LINEAR_DOUT + "    x += 1\n", {"linear: dx", "linear: dweight", "linear: dbias"}),
])
def test_an_in_place_write_in_linear_backward_turns_its_rows(tmp_path, change, to, wrong):
    twin = broken_twin(tmp_path, change, to)
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    weight = np.random.default_rng(2).standard_normal((3, 8))
    rows = workbook.check_layer(twin.linear_forward, twin.linear_backward, x, weight=weight, bias=np.ones(3),
                                 twin=twin)
    assert {f"linear: d{row.name}" for row in rows if row.verdict == "WRONG"} == wrong, rows
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    rows = verdicts(lines)
    assert {name for name, v in rows.items() if v != "ok" and not name.startswith("model (")} == wrong
    assert rows["model (gpt2): h.0.attn.c_q.weight"] == rows["model (llama): h.0.attn.c_q.weight"] == "WRONG"


@pytest.mark.parametrize("change, to, says", [
    (LINEAR_END, LINEAR_END.replace("    return", "    weight *= 1.5\n    return"),
     "linear_backward changed weight, which its forward saved, in place"),  # the model's own weight, after use
    (LINEAR_END, LINEAR_END.replace("    return", "    dout[...] = 0\n    return"),
     "linear_backward changed dout in place"),  # the residual's gradient, which GPT.backward reads again
])
def test_a_backward_that_writes_in_place_after_use_is_named_at_its_own_row_first(tmp_path, change, to, says):
    twin = broken_twin(tmp_path, change, to)
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    rows = verdicts(lines)
    said = [line for line in lines if says in line]
    # The layer's own rows say it, first in the table and in the summary; the models' wrong rows say it too.
    assert lines[-1].endswith("first linear: dx") and said[:3] == [line for line in lines if line.startswith("linear")]
    assert all(says in line for line in lines if line.startswith("model (") and rows[line[:44].strip()] == "WRONG")


@pytest.mark.parametrize("name", ["gelu_backward", "rmsnorm_backward"])
def test_the_tables_row_turns_for_a_layer_that_scales_dout_in_place(monkeypatch, name):
    right = getattr(gpt_numpy, name)

    def scales_dout(dout, saved):
        dout *= 2
        return right(dout, saved)

    monkeypatch.setattr(gpt_numpy, name, scales_dout)
    lines = []
    layer = name[:-len("_backward")]
    assert not workbook.check(log=lines.append, only=layer, models=False)
    assert verdicts(lines)[f"{layer}: dx"] == "WRONG"


# ------------------------------------------------------------------------------------ the check points at the slip
HEAD = '        dh = back("lm_head", linear_backward, dlogits, params=self.head)  # (B, T, C)\n'


def test_a_slip_in_one_row_of_one_tensor_turns_that_tensor_alone_and_says_the_row(tmp_path, reference_models):
    twin = broken_twin(tmp_path, HEAD, HEAD + '        grads[self.head + ".weight"][2] *= 2\n')
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    assert {n for n, v in verdicts(lines).items() if v != "ok"} == {"model (gpt2): wte.weight",
                                                                    "model (llama): lm_head.weight"}
    assert re.search(r"model \(llama\): lm_head.weight .* WRONG  rows 2 of 7 differ, the most at \[2, \d\]: ours "
                     r"-?[\d.]+ vs finite differences -?[\d.]+$", "\n".join(lines), re.M), lines
    assert reference_models[0]  # the right one passes


@pytest.fixture(scope="module")
def right_llama_rows():
    """The rows of check_model for the Llama block of gpt_numpy.py as it is, on the inputs of seed 0."""
    return tuple(workbook.check_model("llama", workbook.LLAMA, np.random.default_rng(0)))


@pytest.mark.parametrize("name, entry", [("lm_head.weight", (6, 7)), ("h.0.mlp.c_fc.weight", (63, 0)),
                                         ("h.1.ln_2.weight", (5,)), ("bigram.weight", (9, 3))])
def test_a_slip_in_any_one_entry_of_a_model_gradient_is_wrong(monkeypatch, right_llama_rows, name, entry):
    right = gpt_numpy.GPT.backward

    def off_at_one_entry(self, activations=False):
        grads = right(self, activations)
        grads[name][entry] += 1e-3 * np.abs(grads[name]).max()
        return grads

    monkeypatch.setattr(gpt_numpy.GPT, "backward", off_at_one_entry)
    rows = workbook.check_model("llama", workbook.LLAMA, np.random.default_rng(0))
    assert [row.name for row in rows if row.verdict != "ok"] == [f"model (llama): {name}"], rows
    assert all(row.verdict == "ok" for row in right_llama_rows)  # the right one, on the same inputs, passes


@pytest.mark.parametrize("change, to, wrong", [
    # Right only where the sequence is as long as the block.
    ('back("wpe", embedding_backward, dx.sum(0))', 'grads["wpe.weight"] += dx.sum(0)', ("model (gpt2): ",)),
    # Right only where the batch is as large as the number of heads.
    ("    B, nh, T, hs = q.shape\n", "    nh, B, T, hs = q.shape\n", ("attention", "model (")),
])
def test_the_check_runs_a_sequence_shorter_than_the_block_and_a_batch_unlike_the_heads(tmp_path, change, to, wrong):
    twin = broken_twin(tmp_path, change, to)
    lines = []
    assert not workbook.check(log=lines.append, twin=twin)
    assert {n for n, v in verdicts(lines).items() if v != "ok"} == {n for n in verdicts(lines) if n.startswith(wrong)}


def in_float32(backward):
    """backward, computed in float32 from float32 copies of its dout and saved arrays."""

    def float32(value):
        if isinstance(value, np.ndarray) and value.dtype == np.float64:
            return value.astype(np.float32)
        if isinstance(value, tuple):
            return type(value)(*map(float32, value)) if hasattr(value, "_fields") else tuple(map(float32, value))
        return np.float32(value) if isinstance(value, float) else value

    return lambda dout, saved: backward(float32(dout), float32(saved))


def test_a_right_backward_in_float32_passes_every_row_and_a_slip_in_float32_does_not(monkeypatch):
    for name in [n for n in dir(gpt_numpy) if n.endswith("_backward")]:
        monkeypatch.setattr(gpt_numpy, name, in_float32(getattr(gpt_numpy, name)))
    lines = []
    assert workbook.check(log=lines.append), "\n".join(line for line in lines if re.search("  (WRONG|ERROR)", line))
    # Each gradient's row is judged to float32's tolerance, and says so; the forward's rows, in float64, are not.
    said = f"(in float32: to {workbook.FLOAT32_TOLERANCE:.1e})"
    assert all(line.endswith(said) != line.startswith("forward (") for line in lines[1:-1]), lines
    # The keys' bias of GPT-2's block, zero in exact arithmetic, holds float32's rounding noise and passes.
    assert verdicts(lines)["model (gpt2): h.1.attn.c_k.bias"] == "ok"
    right = gpt_numpy.linear_backward

    def averaged_bias(dout, saved):
        dx, dparams = right(dout, saved)
        if "bias" in dparams:
            dparams["bias"] = dparams["bias"] / 15  # a mean over the 15 positions, not their sum
        return dx, dparams

    backward = gpt_numpy.GPT.backward

    def swapped(self, activations=False):  # and the gradients of c_k and c_v swapped, in the same run
        grads = backward(self)
        grads["h.1.attn.c_k.weight"], grads["h.1.attn.c_v.weight"] = grads["h.1.attn.c_v.weight"], grads[
            "h.1.attn.c_k.weight"]
        return grads

    monkeypatch.setattr(gpt_numpy, "linear_backward", averaged_bias)
    monkeypatch.setattr(gpt_numpy.GPT, "backward", swapped)
    lines = []
    assert not workbook.check(log=lines.append, only="linear")
    rows = verdicts(lines)
    assert rows["linear: dbias"] == "WRONG" and rows["model (gpt2): h.1.attn.c_q.bias"] == "WRONG"
    assert rows["model (gpt2): h.1.attn.c_k.bias"] == "ok"  # zero, averaged or summed
    # A swap is named in float32 too, and only where there is one.
    named = {line[:44].strip(): line.split("its values are ")[1].split("'s")[0] for line in lines if "swapped" in line}
    assert named == {f"model ({block}): h.1.attn.c_{a}.weight": f"h.1.attn.c_{b}.weight" for block in ("gpt2", "llama")
                     for a, b in ("kv", "vk")}, lines


def test_a_float64_gradient_is_held_to_1e_6_and_one_computed_in_float32_to_float32s_rounding(tmp_path, monkeypatch):
    assert workbook.tolerance_for(1e-6, [np.zeros(3), np.float64(1), 1.0, None]) == 1e-6
    assert workbook.tolerance_for(1e-6, [np.zeros(3), np.zeros(3, np.float32)]) == workbook.FLOAT32_TOLERANCE
    assert 1e-4 < workbook.FLOAT32_TOLERANCE < 2e-4  # a thousand of float32's roundings
    off = lambda factor: linear_like(lambda d: {"weight": d["weight"] * factor, "bias": d["bias"]})
    # Off by 1e-5 of itself: a slip in float64, where 1e-6 holds; within float32's rounding in float32.
    rows = check_linear(off(1 + 1e-5))
    assert [(r.verdict, r.tolerance) for r in rows.values()] == [("ok", 1e-6), ("WRONG", 1e-6), ("ok", 1e-6)]
    rows = check_linear(in_float32(off(1 + 1e-5)))
    assert [(r.verdict, r.tolerance) for r in rows.values()] == [("ok", workbook.FLOAT32_TOLERANCE)] * 3
    # Off by 1%: a slip in float32 too.
    rows = check_linear(in_float32(off(1.01)))
    assert rows["weight"].verdict == "WRONG" and "1.01 times the right one" in str(rows["weight"]), rows
    # GPT.backward's intermediates computed in float32 are close to the reference's; a sign in float32 differs.
    twin = imported(with_the_workbook(tmp_path) / "gpt_numpy.py")
    for name in [n for n in dir(twin) if n.endswith("_backward")]:
        monkeypatch.setattr(twin, name, in_float32(getattr(twin, name)))
    lines = []
    assert workbook.intermediates("gpt2", GPT2, twin, log=lines.append) is None, lines
    assert sum(" close " in line for line in lines) > 20 and lines[-1] == "every intermediate exact or close"
    right = twin.crossentropy_backward
    monkeypatch.setattr(twin, "crossentropy_backward", lambda dloss, saved: (-right(dloss, saved)[0], {}))
    assert workbook.intermediates("gpt2", GPT2, twin, log=lines.append) == "loss: dx"


def test_a_gradient_within_the_tolerance_of_zero_is_never_named_as_swapped():
    # In a layer: dx, all zeros, is wrong, though dy's right gradient is all zeros; dz's values are dx's.
    found = [("x", np.zeros(4), np.ones(4)), ("y", np.zeros(4), np.zeros(4)), ("z", np.ones(4), np.full(4, 2.0))]
    rows = [str(row) for row in workbook.layer_rows(found, [], 1e-6, 0.1)]
    assert rows[0].endswith("WRONG  it is all zeros") and rows[1].endswith("ok"), rows
    assert rows[2].endswith("WRONG  its values are dx's: the two are swapped"), rows
    # In a model: a.bias's gradient, wrong, is along b.bias's direction what b.bias's should be, rounding noise near
    # zero; along c.bias's, what c.bias's should be.
    params = {name: np.zeros(3) for name in ("a.bias", "b.bias", "c.bias")}
    grads = {name: np.full(3, 0.5) for name in params}
    numeric = {"a.bias": np.array([1.0]), "b.bias": np.array([1e-9]), "c.bias": np.array([2.0])}
    scales = dict.fromkeys(params, 1.0)
    for along_c, says in ((5.0, "3 of 3 entries differ"),
                          (2.0, "its values are c.bias's gradient: the two are swapped")):
        along = {"b.bias": np.array([1e-9]), "c.bias": np.array([along_c])}
        detail = workbook.model_detail("a.bias", np.array([1e-9]), numeric["a.bias"], params, grads, numeric, scales,
                                       lambda name, other: along[other], 1e-6, lambda: 0.0)
        assert detail.startswith(says), detail


def linear_like(dparams_of):
    """A linear backward whose parameters' gradients are dparams_of(the right ones)."""
    return lambda dout, saved: (lambda dx, dparams: (dx, dparams_of(dparams)))(*gpt_numpy.linear_backward(dout, saved))


def check_linear(backward):
    rng = np.random.default_rng(1)  # not the seed of the check's dout: x and dout differ
    return {row.name: row for row in workbook.check_layer(gpt_numpy.linear_forward, backward,
                                                          rng.standard_normal((3, 5, 4)),
                                                          weight=rng.standard_normal((4, 4)),
                                                          bias=rng.standard_normal(4))}


def test_a_missing_or_unexpected_gradient_is_named_and_the_other_rows_still_checked():
    rows = check_linear(linear_like(lambda d: {"wieght": d["weight"], "bias": d["bias"]}))
    assert [(n, r.verdict) for n, r in rows.items()] == [("x", "ok"), ("weight", "ERROR"), ("bias", "ok"),
                                                          ("wieght", "ERROR")]
    assert rows["weight"].raised == "no gradient for weight; the backward gave wieght, bias"
    assert "a gradient for wieght, which the layer does not have (its parameters: weight, bias)" in str(rows["wieght"])
    rows = check_linear(linear_like(lambda d: {"weight": d["weight"]}))  # a forgotten bias
    assert [(n, r.verdict) for n, r in rows.items()] == [("x", "ok"), ("weight", "ok"), ("bias", "ERROR")]
    assert rows["bias"].raised == "no gradient for bias; the backward gave weight"
    assert all(r.verdict == "ok" for r in check_linear(gpt_numpy.linear_backward).values())


def test_a_misspelt_or_missing_model_gradient_is_a_row_naming_it_and_the_other_tensors_still_checked(
        tmp_path, monkeypatch, reference_models):
    slip = 'grads["wte.wieght"] += embedding_backward(dx, self.saved["wte"])[1]["weight"]'
    twin = broken_twin(tmp_path, '        back("wte", embedding_backward, dx)\n', f"        {slip}\n")
    lines = []
    assert not workbook.check(log=lines.append, twin=twin, only="model")
    rows = verdicts(lines)
    for block in ("gpt2", "llama"):
        assert rows.pop(f"model ({block}): wte.weight") == "ERROR"
        assert f"model ({block}): wte.weight".ljust(61) + "ERROR  no gradient for wte.weight; got wte.wieght" in lines
    assert set(rows.values()) == {"ok"} and len(rows) > 40, rows
    # A dict of gradients with a key renamed, and one without a tensor's key at all.
    right = gpt_numpy.GPT.backward
    for renamed, says in (("lm_head.wieght", "got lm_head.wieght"), (None, "GPT.backward gave no key lm_head.weight")):
        def backward(self, activations=False, renamed=renamed):
            grads = right(self)
            if renamed and "lm_head.weight" in grads:
                grads[renamed] = grads["lm_head.weight"]
            return {n: g for n, g in grads.items() if n != "lm_head.weight"}
        monkeypatch.setattr(gpt_numpy.GPT, "backward", backward)
        lines = []
        assert not workbook.check(log=lines.append, only="model")
        bad = {n: v for n, v in verdicts(lines).items() if v != "ok"}
        assert bad == {"model (llama): lm_head.weight": "ERROR"}, bad  # gpt2 ties it to wte: no lm_head
        assert any(line.endswith(f"no gradient for lm_head.weight; {says}") for line in lines), lines
        monkeypatch.undo()
    assert reference_models[0]


def test_intermediates_show_the_slipped_layers_gradient_first_to_differ(tmp_path, twin_dir, capsys):
    lines = []
    assert workbook.intermediates("gpt2", workbook.GPT2, log=lines.append) is None
    said = [line.split()[:3] for line in lines[1:-1]]
    assert said[0] == ["loss:", "dout", "exact"] and said[1] == ["loss:", "dx", "exact"], said
    assert ["h.1.mlp.act:", "dx", "exact"] in said and said[-1] == ["wte:", "dout", "exact"]
    # A right body written another way is close; a slip in GELU's is the first to differ, at its own dx.
    slip = ("    dgelu_dx = 0.5 * (1 + t) + 0.5 * x * dt_dx", "    dgelu_dx = (1 + t + x * dt_dx) / 2",
            "    dgelu_dx = 0.5 * (1 + t)")
    twin = broken_twin(tmp_path, slip[0], slip[1])
    lines = []
    assert workbook.intermediates("gpt2", workbook.GPT2, twin, log=lines.append) is None
    assert {line.split()[2] for line in lines[1:-1]} <= {"exact", "close"}, lines
    twin = broken_twin(tmp_path, slip[0], slip[2])
    lines = []
    assert workbook.intermediates("gpt2", workbook.GPT2, twin, log=lines.append) == "h.1.mlp.act: dx"
    verdicts_ = [line.split()[2] for line in lines[1:-1]]
    first = verdicts_.index("DIFFERS")
    assert lines[1 + first].split()[:2] == ["h.1.mlp.act:", "dx"] and set(verdicts_[:first]) == {"exact"}
    assert lines[-1] == "first to differ: h.1.mlp.act: dx"
    # From the command line (its main, run here), beside the table; the slip fails it, the reference passes.
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    (twin_dir / "exercise_19.py").write_text(source.replace(slip[0], slip[2]), encoding="utf-8")
    done = run_main(capsys, "--check", "gelu", "--intermediates", twin=imported(twin_dir / "exercise_19.py"))
    assert done.returncode == 1 and "first to differ: h.1.mlp.act: dx" in done.stdout, done.stdout
    assert "intermediates (llama)" not in done.stdout  # gelu's check runs the GPT-2 model alone
    done = run_main(capsys, "--check", "model", "--intermediates")
    assert done.returncode == 0 and done.stdout.count("every intermediate exact or close") == 2, done.stdout
    done = run_main(capsys, "--intermediates")
    assert done.returncode == 2 and "--intermediates goes with --check" in done.stderr


def test_a_swap_is_named_in_a_layer_and_in_the_model(tmp_path, monkeypatch):
    rows = check_linear(linear_like(lambda d: {"weight": d["weight"].T, "bias": d["bias"]}))
    assert rows["weight"].verdict == "WRONG" and "its values are" not in str(rows["weight"])  # a transpose: no swap
    rows = check_linear(linear_like(lambda d: {"weight": d["bias"], "bias": d["weight"]}))
    said = "dweight has the shape (4,), not weight's (4, 4); it is dbias's: the two are swapped"
    assert rows["weight"].raised == said
    assert rows["bias"].raised.endswith("it is dweight's: the two are swapped") and rows["x"].verdict == "ok"
    rng = np.random.default_rng(0)
    qkv = {name: rng.standard_normal((3, 5, 8)) for name in "qkv"}
    right = gpt_numpy.attention_backward
    swapped = lambda dout, saved: (lambda d, p: ((d[0], d[2], d[1]), p))(*right(dout, saved))
    rows = {r.name: r for r in workbook.check_layer(lambda q, k, v: gpt_numpy.attention_forward(q, k, v, 2), swapped,
                                                    qkv)}
    assert "its values are dv's: the two are swapped" in str(rows["k"]) and "dk's" in str(rows["v"])
    assert rows["q"].verdict == "ok"
    twin = broken_twin(tmp_path, 'dh = back(block + "attn.c_v", linear_backward, dv)',
                       'dh = back(block + "attn.c_v", linear_backward, dk)')
    lines = []
    assert not workbook.check(log=lines.append, twin=twin, only="model")
    said = [line for line in lines if "the two are swapped" in line]
    assert said and said[0].startswith("model (gpt2): h.1.attn.c_v.weight") and \
        said[0].endswith("its values are h.1.attn.c_k.weight's gradient: the two are swapped"), lines


def test_the_model_rows_go_from_the_loss_back_so_the_summary_names_the_wrong_tensor_nearest_it(tmp_path,
                                                                                             reference_models):
    passed, lines = reference_models
    assert passed
    tensors = [name[len("model (llama): "):] for name in verdicts(lines) if name.startswith("model (llama): ")]
    assert tensors[:3] == ["lm_head.weight", "ln_f.weight", "h.1.mlp.c_proj.weight"] and tensors[-1] == "wte.weight"
    assert set(tensors) == set(gpt_numpy.init_params(workbook.model_config(gpt_numpy, LLAMA)))
    # A slip at block 1's MLP turns everything below it: the summary names the tensor the slip reaches first.
    twin = broken_twin(tmp_path, 'dh = back(block + "mlp.c_fc", linear_backward, dup)',
                       'dh = back(block + "mlp.c_fc", linear_backward, dgate)')
    lines = []
    assert not workbook.check(log=lines.append, twin=twin, only="model")
    assert lines[-1].endswith("first model (llama): h.1.mlp.c_fc.weight"), lines[-1]


def test_an_error_in_a_helper_is_located_at_the_learners_line_that_called_it(tmp_path):
    twin = imported(with_the_workbook(tmp_path) / "gpt_numpy.py")
    number = next(n for n, ex in enumerate(workbook.exercises(), 1) if ex.get("check") == "model")
    path, _ = workbook.start_exercise(number, twin)
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    body = workbook.blanked(source, "GPT.backward")[1]
    change = 'dh = back(block + "attn.c_v", linear_backward, dv)'
    blank = Path(path).read_text(encoding="utf-8")
    hole = re.search(r"\n( *raise NotImplementedError\(.*\)\n)", blank).group(1)
    Path(path).write_text(blank.replace(hole, body.replace(change, change.replace("dv)", "dv[..., :-1])"))),
                          encoding="utf-8")
    line = Path(path).read_text(encoding="utf-8").split("dv[..., :-1])")[0].count("\n") + 1
    lines = []
    assert not workbook.check(twin=imported(path), only="model", log=lines.append)
    raised = [row for row in lines[1:-1] if row[61:].startswith("ERROR")]
    assert raised and all(row.endswith(f"(in linear_backward, called from backward, exercise_{number}.py:{line})")
                          for row in raised), raised


# ---------------------------------------------------------------------------------------------------- the workbook
def turning(said, tensors):
    """The tensors an answer says turn: "all", "all but PATTERN, ...", "PATTERN, ..." or nothing."""
    if said in ("", "all"):
        return set(tensors) if said else set()
    patterns = said.removeprefix("all but ").split(", ")
    named = {t for t in tensors if any(fnmatch.fnmatchcase(t, p) for p in patterns)}
    assert all(any(fnmatch.fnmatchcase(t, p) for t in tensors) for p in patterns), said  # each pattern names one
    return set(tensors) - named if said.startswith("all but ") else named


def broken_table(change_to):
    """Whether the whole check passes on gpt_numpy.py with one line changed, and the lines of its table."""
    with tempfile.TemporaryDirectory() as folder:
        lines = []
        return workbook.check(log=lines.append, twin=broken_twin(Path(folder), *change_to)), lines


def broken_tables(changes):
    """broken_table of each (change, to), the checks run side by side on the CPU's cores."""
    workers = min(2, os.cpu_count() or 1, len(changes))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(broken_table, changes))


def test_every_exercise_of_the_workbook_turns_the_rows_and_tensors_its_answer_names():
    exercises = [(number, ex) for number, ex in enumerate(workbook.exercises(), 1) if "check" not in ex]
    assert len(exercises) >= 18
    tables = broken_tables([(ex["change"], ex["to"]) for _, ex in exercises])
    for (number, exercise), (passed, lines) in zip(exercises, tables):
        assert not passed, number
        assert check_rows(lines) == (exercise["rows"], exercise["models"]), (number, exercise["title"])
        answer = workbook.exercise_text(number, answer=True)
        assert all(name in answer for name in [*exercise["rows"], *exercise["models"]]), answer
        assert exercise["change"] in workbook.exercise_text(number) and "--answer" in workbook.exercise_text(number)
        # Which tensors of each model turn, as the answer says, and why.
        rows = verdicts(lines)
        for block, switches in (("gpt2", GPT2), ("llama", LLAMA)):
            tensors = gpt_numpy.init_params(workbook.model_config(gpt_numpy, switches))
            turned = {t for t in tensors if rows[f"model ({block}): {t}"] != "ok"}
            said = exercise["tensors"].get(block, "")
            assert turned == turning(said, tensors), (number, block, sorted(turned))
            assert not said or f"{block}: {said}" in " ".join(answer.split()), answer
        assert exercise["tensors_why"] in " ".join(answer.split()), answer


# A realistic wrong answer to each write exercise, easiest to hardest: a change to the reference body, and the row
# of --check that must turn WRONG.
WRONG_ANSWERS = {
    "gelu_backward": ("0.5 * (1 + t) + 0.5 * x * dt_dx", "0.5 * (1 + t)", "gelu: dx"),  # the product rule's half
    "swiglu_backward": ("dout * up * (s + gate * s * (1 - s))", "dout * up * s", "swiglu: dgate"),  # silu' as s
    "linear_backward": ("dout2.T @ x.reshape(-1, x.shape[-1])", "dout[0].T @ x[0]", "linear: dweight"),  # no sum
    "embedding_backward": ("np.add.at(dweight, idx, dout)", "dweight[idx] = dout", "embedding: dweight"),
    "crossentropy_backward": ("dloss / targets.size", "dloss", "crossentropy: dx"),  # no 1/N
    "softmax_backward": ("p * (dout - (dout * p).sum(-1, keepdims=True))", "p * dout", "softmax: dx"),  # a term lost
    "rope_backward": ("rope_forward(dout, cos, -sin)", "rope_forward(dout, cos, sin)", "rope: dx"),  # no transpose
    "rmsnorm_backward": ("rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))", "rstd * g", "rmsnorm: dx"),
    "layernorm_backward": ("g - g.mean(-1, keepdims=True) - xhat", "g - xhat", "layernorm: dx"),  # the mean's path
    "attention_backward": ("dscores.transpose(0, 1, 3, 2) @ q", "dscores @ q", "attention: dk"),  # no transpose
    "GPT.backward": ('dx = dx + back(block + "ln_1", norm, dh)', 'dx = back(block + "ln_1", norm, dh)',
                     "model (gpt2): wte.weight"),  # the residual's own path dropped
}


def code_lines(text):
    """text's lines, each without its comment and with no whitespace at all; the short ones left out."""
    lines = ("".join(line.split("#")[0].split()) for line in text.splitlines())
    return [line for line in lines if len(line) >= 8]


def comment_lines(text):
    """text's comment lines, whitespace normalised, the short ones left out."""
    lines = (" ".join(line.split()) for line in text.splitlines() if line.strip().startswith("#"))
    return [line for line in lines if len(line) >= 12]


def leaked(source, copy, functions):
    """The lines of functions' bodies and derivations in source that copy, an exercise's file, holds more often
    than source does elsewhere."""
    answer = "".join(workbook.derivation(source, f) + workbook.blanked(source, f)[1] for f in functions)
    found = []
    for split in (code_lines, comment_lines):
        for line in set(split(answer)):
            if split(copy).count(line) > split(source).count(line) - split(answer).count(line):
                found.append(line)
    return found


def test_the_exercise_file_holds_no_line_of_the_blanked_body_nor_its_derivation(monkeypatch):
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    writes = [ex for ex in workbook.exercises() if "check" in ex]
    for ex in writes:
        functions = [ex["function"], *ex.get("with", [])]
        copy = workbook.blanked(source, ex["function"], ex.get("with", []), "{name}: yours")[0]
        assert not leaked(source, copy, functions), (ex["function"], leaked(source, copy, functions))
    # The final formulas of the derivations are among what must go.
    assert "# dx = rstd (g - xhat mean(g xhat))" in comment_lines(workbook.derivation(source, "rmsnorm_backward"))
    # LayerNorm's finished backward beside RMSNorm's would give the method away: both are blanked.
    pairs = {ex["function"]: set(ex.get("with", [])) for ex in writes}
    assert pairs["rmsnorm_backward"] == {"layernorm_backward"} and pairs["layernorm_backward"] == {"rmsnorm_backward"}
    assert pairs["gelu_backward"] == {"swiglu_backward"} and pairs["swiglu_backward"] == {"gelu_backward"}
    # A blanking that keeps the derivation above the body, or a body's own line, is caught.
    kept = workbook.blanked(source, "rmsnorm_backward", ["layernorm_backward"])[0]
    monkeypatch.setattr(workbook, "above", lambda lines, node: node.lineno - 1)
    with_derivation = workbook.blanked(source, "rmsnorm_backward", ["layernorm_backward"])[0]
    monkeypatch.undo()
    assert "# dx = rstd (g - xhat mean(g xhat))" in leaked(source, with_derivation, ["rmsnorm_backward"])
    line = "    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))  # (B, T, C)\n"
    assert leaked(source, kept.replace("def rope_tables", line + "def rope_tables"), ["rmsnorm_backward"])


def test_a_write_exercise_blanks_a_body_its_check_grades_the_learners_and_the_answer_passes():
    writes = [(number, ex) for number, ex in enumerate(workbook.exercises(), 1) if "check" in ex and "lines" not in ex]
    assert [ex["function"] for _, ex in writes] == list(WRONG_ANSWERS)  # every backward, the model's last
    # Each exercise in a folder of its own, side by side on the CPU's cores; a failed assert fails the test.
    workers = min(2, os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        assert list(pool.map(write_exercise_graded, writes)) == [True] * len(writes)


def write_exercise_graded(number_ex):
    """Write exercise number: blanked, graded unwritten, with its answer and with a wrong answer (asserts each)."""
    number, ex = number_ex
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        tmp_path = Path(folder)
        twin = imported(with_the_workbook(tmp_path) / "gpt_numpy.py")
        path, made = workbook.start_exercise(number, twin)
        assert made and path == str(tmp_path / f"exercise_{number}.py")
        blank = on_disk = Path(path).read_text(encoding="utf-8")
        hole = re.search(rf'\n( *raise NotImplementedError\("{re.escape(ex["function"])}: .*\)\n)', blank).group(1)
        body = workbook.blanked(source, ex["function"])[1]
        # The body and the derivation above it are gone, and so are those of a function that would give the
        # method away; nothing else.
        functions = [ex["function"], *ex.get("with", [])]
        assert not leaked(source, blank, functions), (number, leaked(source, blank, functions))
        assert len(blank.splitlines()) < len(source.splitlines()) and "--hint" in blank
        for other in ex.get("with", []):
            other_hole = f'raise NotImplementedError("{other}: its body is yours to write")\n'
            blank = blank.replace(" " * 4 + other_hole, workbook.blanked(source, other)[1])
        # Unwritten, it raises: each of its rows says where, in one line, and the others still run.
        lines = []
        assert not workbook.check(twin=imported(path), only=ex["check"], log=lines.append)
        line = on_disk[:on_disk.index(hole)].count("\n") + 1
        raised = [row for row in lines[1:-1] if row[61:].startswith("ERROR")]
        assert raised and all(f"NotImplementedError: {ex['function']}: its body is yours to write (in "
                              f"{ex['function'].split('.')[-1]}, exercise_{number}.py:{line})" in row
                              for row in raised), lines
        # The answer shows the reference body, and it passes.
        assert textwrap.indent(textwrap.dedent(body), "    ").rstrip() in workbook.exercise_text(number, answer=True)
        Path(path).write_text(blank.replace(hole, body), encoding="utf-8")
        lines = []
        assert workbook.check(twin=imported(path), only=ex["check"], log=lines.append), lines
        # A realistic wrong answer is WRONG at its row.
        change, to, row = WRONG_ANSWERS[ex["function"]]
        assert body.count(change) == 1, change
        Path(path).write_text(blank.replace(hole, body.replace(change, to)), encoding="utf-8")
        lines = []
        assert not workbook.check(twin=imported(path), only=ex["check"], log=lines.append,
                                  models=ex["check"] == "model")
        assert verdicts(lines)[row] == "WRONG", (number, lines)
        assert re.search(f"first {re.escape(row)}$", lines[-1]) or ex["check"] == "model", lines[-1]
        # The learner's work is never written over.
        assert workbook.start_exercise(number, twin) == (path, False)
        assert body.replace(change, to) in Path(path).read_text(encoding="utf-8")
    return True


# Each stage exercise: a line of the rest of the body, kept; slips in its lines, each (line, slip, the first row that
# turns); a line of it written another way, right.
STAGES = [("dv = dv.transpose(0, 2, 1, 3)",
           [("datt = dy @ v.transpose(0, 1, 3, 2)", "datt = 2 * dy @ v.transpose(0, 1, 3, 2)",
             "attention: datt (intermediate)")],
           ("datt = dy @ v.transpose(0, 1, 3, 2)", 'datt = np.einsum("bhtd,bhsd->bhts", dy, v)')),
          ("dv = dv.transpose(0, 2, 1, 3)",
           [("dscores = softmax_backward(datt, att)[0]", "dscores = att * datt", "attention: dscores (intermediate)")],
           ("dscores = softmax_backward(datt, att)[0]",
            "dscores = att * (datt - (datt * att).sum(-1, keepdims=True))")),
          ("dv = dv.transpose(0, 2, 1, 3)",
           [("dk = dscores.transpose(0, 1, 3, 2) @ q * scale", "dk = dscores @ q * scale",
             "attention: dk (intermediate)")],
           ("dk = dscores.transpose(0, 1, 3, 2) @ q * scale", "dk = np.swapaxes(dscores, -1, -2) @ (q * scale)")),
          # Cross-entropy through logsumexp: a sign, and a factor (the mean's 1/N lost), each named at its own line.
          ("return dlogits, {}",
           [("dpicked = -dnll", "dpicked = dnll", "crossentropy: dpicked (intermediate)"),
            ("dloss / targets.size", "dloss", "crossentropy: dnll (intermediate)")],
           ("dlogits = probs * dlogz + onehot * dpicked",
            "dlogits = probs * dlogz + np.eye(probs.shape[-1])[targets] * dpicked"))]


def test_a_stage_exercise_blanks_its_lines_alone_and_grades_its_intermediate_first(tmp_path):
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    twin = imported(with_the_workbook(tmp_path) / "gpt_numpy.py")
    stages = [(n, ex) for n, ex in enumerate(workbook.exercises(), 1) if ex.get("lines")]
    assert [ex["lines"] for _, ex in stages] == [["datt", "dv"], ["dscores"], ["dq", "dk"],
                                                 ["dnll", "dlogz", "dpicked", "dlogits"]]
    assert [n for n, _ in stages] == [30, 31, 32, 33]  # after the others, whose numbers stay
    for (number, ex), (kept, slips, (line, other)) in zip(stages, STAGES):
        name, function = ex["check"], ex["function"]
        path, made = workbook.start_exercise(number, twin)
        blank = Path(path).read_text(encoding="utf-8")
        hole = re.search(rf'\n( *raise NotImplementedError\("{function}: .* are yours to write"\)\n)', blank).group(1)
        assert line not in blank and kept in blank  # its lines gone, the rest kept
        assert not leaked(source, blank, []) and line not in workbook.listing()
        lines = []
        assert not workbook.check(twin=imported(path), only=name, log=lines.append, models=False)
        assert lines[1].startswith(f"{name}: {ex['lines'][0]} (intermediate)") and "ERROR" in lines[1], lines
        stage = workbook.blanked(source, function, names=ex["lines"])[1]
        assert line in stage and "return" not in stage
        bodies = [(stage, None), (stage.replace(line, other), None)]
        bodies += [(stage.replace(change, slip), row) for change, slip, row in slips if stage.count(change) == 1]
        assert len(bodies) == 2 + len(slips)
        for body, row in bodies:
            Path(path).write_text(blank.replace(hole, body), encoding="utf-8")
            lines = []
            assert workbook.check(twin=imported(path), only=name, log=lines.append, models=False) == (row is None)
            names = [n for n in verdicts(lines) if n.endswith("(intermediate)")]
            assert names == [f"{name}: {var} (intermediate)" for var in ex["lines"]], lines
            if row is not None:
                assert lines[-1].endswith(f"first {row}") and verdicts(lines)[row] == "WRONG", (number, lines)
        assert " " * 4 + line in source


def test_the_learners_loop_from_the_command_line_as_the_readme_shows_it(twin_dir):
    shutil.copy(Path(HERE, "workbook.json"), twin_dir / "workbook.json")
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\n(.*?)```", readme[readme.index("**The workbook**"):], re.S).group(1)
    commands = [line.split("#")[0].split()[1:] for line in block.splitlines()]
    assert [c[0] for c in commands] == ["gpt_numpy.py", "gpt_numpy.py", "exercise_24.py", "gpt_numpy.py"], commands
    listed = run_cli(*commands[0], cwd=twin_dir).stdout
    # 18 to break a line, then 11 to write a body.
    kinds = ["check" in ex for ex in workbook.exercises()]
    assert re.findall(r"^ ?\d+\. ", listed, re.M) == [f"{n:2d}. " for n in range(1, 34)] and len(kinds) == 33
    # Then 3 that write attention's backward a stage at a time, and 1 cross-entropy's.
    assert kinds == [False] * 18 + [True] * 15 and "\n24. write the body of softmax_backward\n" in listed
    started = run_cli(*commands[1], cwd=twin_dir)
    assert started.returncode == 0 and "python exercise_24.py --check softmax" in started.stdout, started
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    assert (twin_dir / "exercise_24.py").read_text(encoding="utf-8") == workbook.exercise_source(source, 24)
    graded = run_cli(*commands[2], cwd=twin_dir)
    assert graded.returncode == 1 and "Traceback" not in graded.stderr, graded.stderr
    assert re.search(r"softmax: dx +ERROR  NotImplementedError: .* \(in softmax_backward, exercise_24.py:\d+\)\n",
                     graded.stdout), graded.stdout
    assert graded.stdout.rstrip().endswith("ERROR: first softmax: dx")
    answer = run_cli(*commands[3], cwd=twin_dir)
    body = "    return p * (dout - (dout * p).sum(-1, keepdims=True)), {}"
    assert answer.returncode == 0 and body in answer.stdout, answer
    # The body written as the answer has it, the same check passes.
    again = run_cli(*commands[1], cwd=twin_dir)
    assert again.returncode == 0 and "is there already, your work in it: it is kept" in again.stdout
    mine = twin_dir / "exercise_24.py"
    mine.write_text(mine.read_text(encoding="utf-8").replace(
        '    raise NotImplementedError("softmax_backward: its body is yours to write")\n', f"    p = saved\n{body}\n"))
    graded = run_cli(*commands[2], cwd=twin_dir)
    assert graded.returncode == 0 and graded.stdout.rstrip().endswith("ok, 0 WRONG, 0 ERROR"), graded.stdout


def test_the_workbook_from_the_command_line(capsys):
    workbook.main(["--exercise", "list"])
    listed = capsys.readouterr().out
    assert len(re.findall(r"^ ?\d+\. ", listed, re.M)) == len(workbook.exercises()) and "layernorm_backward" in listed
    workbook.main(["--exercise", "5"])
    question = capsys.readouterr().out
    assert "Predict" in question and "Why" not in question and "gpt2 (WRONG)" not in question
    workbook.main(["--exercise", "5", "--answer"])
    assert "Why: " in capsys.readouterr().out
    for args, says in ((["--exercise", "0"], "a number from 1 to"), (["--exercise", "x"], "a number from 1 to"),
                       (["--exercise", "\u00b2", "--hint"], "a number from 1 to"),  # a digit, but no number to int()
                       (["--answer"], "--answer goes with --exercise N")):
        with pytest.raises(SystemExit) as exit_info:
            workbook.main(args)
        message = exit_info.value.code if isinstance(exit_info.value.code, str) else capsys.readouterr().err
        assert says in message and exit_info.value.code != 0, message


def answers(ex):
    """Every line a listing or a hint must not print of an exercise: a write exercise's body and derivation
    (its paired function's too), a break exercise's title (its slip), its change and its answer's texts."""
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    if "check" not in ex:
        return [" ".join(ex[field].split()) for field in ("title", "change", "to", "why")]
    functions = [ex["function"], *ex.get("with", [])]
    text = "".join(workbook.derivation(source, f) + workbook.blanked(source, f)[1] for f in functions)
    return code_lines(text)


def test_the_list_names_each_exercise_and_prints_nothing_of_an_answer(capsys, monkeypatch):
    workbook.main(["--exercise", "list"])
    listed = capsys.readouterr().out
    flat = " ".join(listed.split())
    bare = "".join(listed.split())
    for number, ex in enumerate(workbook.exercises(), 1):
        assert f"{number:2d}. " in listed and ex["function"] in listed
        for line in answers(ex):
            assert line not in (flat if "check" not in ex else bare), (number, line)
        for hint in ex.get("hints", []):
            assert " ".join(hint.split()) not in flat, number
    # A listing that prints each exercise's title, as one did, names a slip: caught.
    monkeypatch.setattr(workbook, "listing", lambda: "\n".join(
        f"{n}. {ex['function']}: {ex['title']}" for n, ex in enumerate(workbook.exercises(), 1)))
    workbook.main(["--exercise", "list"])
    flat = " ".join(capsys.readouterr().out.split())
    assert any(line in flat for ex in workbook.exercises() if "check" not in ex for line in answers(ex))


def test_no_hint_holds_a_line_of_its_answer():
    for number, ex in enumerate(workbook.exercises(), 1):
        if "check" not in ex:
            continue
        assert len(ex["hints"]) >= 3, number
        # The shapes first, then the rule, then a sketch in words.
        assert [h.split(":")[0] for h in ex["hints"][:3]] == ["Shapes", "The rule" + "s" * ex["hints"][1].startswith(
            "The rules"), "Sketch in words"], number
        for hint in ex["hints"]:
            bare = "".join(hint.split())
            assert not [line for line in answers(ex) if line in bare], (number, hint)
    # A hint that gives a line of the body is caught.
    ex = next(ex for ex in workbook.exercises() if ex["function"] == "softmax_backward" and "check" in ex)
    slip = "Sketch: return p * (dout - (dout * p).sum(-1, keepdims=True)), {}"
    assert [line for line in answers(ex) if line in "".join(slip.split())]


def test_hints_come_one_more_each_time_they_are_asked(twin_dir):
    shutil.copy(Path(HERE, "workbook.json"), twin_dir / "workbook.json")
    hints = workbook.exercises()[25]["hints"]
    assert run_cli("gpt_numpy.py", "--exercise", "26", cwd=twin_dir).returncode == 0
    said = [run_cli(*args, cwd=twin_dir) for args in (("gpt_numpy.py", "--exercise", "26", "--hint"),
                                                      ("exercise_26.py", "--hint"),
                                                      ("gpt_numpy.py", "--exercise", "26", "--hint"),
                                                      ("exercise_26.py", "--hint"))]
    for asked, done in enumerate(said, 1):
        flat = " ".join(done.stdout.split())
        assert done.returncode == 0 and f"hint {min(asked, len(hints))} of {len(hints)}" in flat, done
        shown = [" ".join(h.split()) in flat for h in hints]
        assert shown == [i < asked for i in range(len(hints))], (asked, flat)
    assert "No more hints" in said[-1].stdout and "--answer" in said[-1].stdout
    # --hint K: the first K, and the count starts from there.
    one = run_cli("exercise_26.py", "--hint", "1", cwd=twin_dir).stdout
    assert " ".join(hints[0].split()) in " ".join(one.split()) and "hint 1 of" in one
    assert "hint 2 of" in run_cli("exercise_26.py", "--hint", cwd=twin_dir).stdout
    # A break exercise has none, and --hint alone in the lesson names no exercise.
    assert_one_line(run_cli("gpt_numpy.py", "--exercise", "3", "--hint", cwd=twin_dir), "has no hints")
    done = run_cli("gpt_numpy.py", "--hint", cwd=twin_dir)
    assert done.returncode == 2 and "--hint goes with --exercise N" in done.stderr


@pytest.fixture
def twin_dir(tmp_path):
    """A folder holding a copy of gpt_numpy.py and workbook.py, and no workbook.json."""
    return with_the_workbook(tmp_path)


def assert_one_line(done, *says, code=1):
    assert done.returncode == code and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and all(s in done.stderr for s in says), done.stderr


def beside(monkeypatch, folder):
    """workbook, in this process, reading the workbook.json in folder, as a copy of workbook.py there does."""
    monkeypatch.setattr(workbook, "HERE", str(folder))


def test_a_missing_workbook_is_one_line_naming_it_in_every_mode_that_reads_it(twin_dir, capsys, monkeypatch):
    path = str(twin_dir / "workbook.json")
    says = (f"cannot read the workbook {path} (it is missing)", "put back the workbook.json")
    assert_one_line(run_cli("gpt_numpy.py", "--exercise", "list", cwd=twin_dir), *says)  # from the command line
    beside(monkeypatch, twin_dir)
    for args in (["--exercise", "list"], ["--exercise", "1"], ["--exercise", "1", "--answer"]):
        done = run_main(capsys, *args)
        assert_one_line(done, *says)
        assert "cannot write" not in done.stderr


def without(number, field):
    exercises = json.loads(Path(HERE, "workbook.json").read_text(encoding="utf-8"))
    del exercises[number - 1][field]
    return json.dumps(exercises).encode()


def changed(number, field, value):
    exercises = json.loads(Path(HERE, "workbook.json").read_text(encoding="utf-8"))
    exercises[number - 1][field] = value
    return json.dumps(exercises).encode()


WORKBOOK = Path(HERE, "workbook.json").read_bytes()


@pytest.mark.parametrize("content, says", [
    pytest.param("FOLDER", "(it is not a file)", id="folder"),
    pytest.param(b"", "(it is empty)", id="empty"),
    pytest.param(bytes(range(256)) * 4, "(it is not UTF-8 text)", id="binary"),
    pytest.param(WORKBOOK[:len(WORKBOOK) // 2], "is not valid JSON (", id="cut short"),
    pytest.param(b"[" * 100_000, "nest too deep", id="deep"),
    pytest.param(b"[" + b" " * 2_000_000 + b"]", "(it has 2,000,002 bytes, where the workbook has a few thousand)",
                 id="huge"),
    pytest.param(b'{"title": "x"}', "is broken (it holds an object, not a list of exercises)", id="an object"),
    pytest.param(b"[]", "is broken (it holds no exercises)", id="no exercise"),
    pytest.param(b"[3]", "is broken (exercise 1 is a number, not an object of fields)", id="a number"),
    pytest.param(without(2, "title"), 'is broken (exercise 2 has no "title")', id="no title"),
    pytest.param(changed(3, "rows", []), 'is broken (exercise 3\'s "rows" is a list, not an object)', id="rows"),
    pytest.param(changed(4, "why", None), 'is broken (exercise 4\'s "why" is null, not text)', id="why"),
    pytest.param(changed(19, "function", "gelu_backwards"),
                 'exercise 19\'s "function": gpt_numpy.py has no function gelu_backwards', id="function"),
    pytest.param(changed(19, "check", "layer_norm"),
                 "exercise 19's \"check\" is 'layer_norm', not a name --check takes", id="check"),
    pytest.param(changed(33, "lines", ["dnll", "bogus"]),
                 'exercise 33\'s "function": crossentropy_backward has no line that sets bogus', id="lines"),
    pytest.param(changed(5, "models", {"gpt2": "wrong"}), "gives gpt2 the verdict 'wrong', not \"WRONG\" or \"ERROR\"",
                 id="verdict"),
])
def test_a_bad_workbook_is_one_line_naming_it_and_what_is_wrong(tmp_path, capsys, monkeypatch, content, says):
    path = tmp_path / "workbook.json"
    if content == "FOLDER":
        path.mkdir()
    else:
        path.write_bytes(content)
    beside(monkeypatch, tmp_path)
    for args in (["--exercise", "list"], ["--exercise", "2", "--answer"]):
        assert_one_line(run_main(capsys, *args), f"the workbook {path}", says, "put back the workbook.json")


def test_the_workbook_as_it_comes_passes_its_own_shape_check():
    exercises = workbook.exercises()
    assert workbook.workbook_problem(exercises) is None and len(exercises) >= 18


# ----------------------------------------------------------------------------- a workbook that trusts nothing unchecked
def test_a_copy_made_before_the_lesson_changed_is_one_line_saying_what_to_do(twin_dir):
    source = (twin_dir / "gpt_numpy.py").read_text(encoding="utf-8")
    field = "    # rows of the token pairs' table; 0, none\n    bigram: int = 8192\n"
    assert source.count(field) == 1
    (twin_dir / "exercise_24.py").write_text(source.replace(field, ""), encoding="utf-8")
    done = run_cli("exercise_24.py", "--check", "softmax", cwd=twin_dir)
    assert_one_line(done, "exercise_24.py was made from an older gpt_numpy.py (its GPTConfig has no field bigram): "
                          "rename it, run python gpt_numpy.py --exercise 24 for a new copy")
    (twin_dir / "exercise_24.py").write_text(source, encoding="utf-8")  # a copy as the lesson is now: checked
    assert run_cli("exercise_24.py", "--check", "softmax", cwd=twin_dir).returncode == 0


@pytest.mark.parametrize("alone", ["gpt_numpy.py", "exercise_24.py"])
def test_the_lesson_copied_without_the_workbook_says_so_in_one_line(tmp_path, alone):
    shutil.copy(Path(HERE, "gpt_numpy.py"), tmp_path / alone)
    for args in (["--check"], ["--exercise", "list"], []):
        done = run_cli(alone, *args, cwd=tmp_path)
        assert_one_line(done, "the command lines need workbook.py and gpt_numpy.py beside this file (")


def test_a_body_that_calls_sys_exit_is_an_error_row_and_never_a_pass(twin_dir):
    source = (twin_dir / "gpt_numpy.py").read_text(encoding="utf-8")
    body = "    return p * (dout - (dout * p).sum(-1, keepdims=True)), {}\n"
    copy = twin_dir / "exercise_24.py"
    copy.write_text(source.replace(body, "    sys.exit(0)\n"), encoding="utf-8")
    line = copy.read_text(encoding="utf-8").split("    sys.exit(0)\n")[0].count("\n") + 1
    done = run_cli("exercise_24.py", "--check", "softmax", cwd=twin_dir)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(rf"\nsoftmax: dx +ERROR  SystemExit: 0 \(in softmax_backward, exercise_24.py:{line}\)\n",
                     done.stdout), done.stdout
    assert re.search(r"\n\d+ ok, 0 WRONG, [1-9]\d* ERROR: first softmax: dx\n$", done.stdout), done.stdout
    copy.write_text(source, encoding="utf-8")
    assert run_cli("exercise_24.py", "--check", "softmax", cwd=twin_dir).returncode == 0


def grade_as_printed(printed, cwd):
    """Runs the grading command an exercise printed, from cwd."""
    command = next(line.strip() for line in printed.splitlines() if "--check" in line and line.startswith("    "))
    args = shlex.split(command)
    assert args[0] == "python", command
    return run_cli(*args[1:], cwd=cwd)


def test_an_exercise_started_from_another_folder_prints_a_command_that_runs_there(twin_dir, tmp_path_factory):
    shutil.copy(Path(HERE, "workbook.json"), twin_dir / "workbook.json")
    other = tmp_path_factory.mktemp("elsewhere")
    started = run_cli(str(twin_dir / "gpt_numpy.py"), "--exercise", "24", cwd=other)
    assert started.returncode == 0 and (twin_dir / "exercise_24.py").exists(), started.stderr
    graded = grade_as_printed(started.stdout, other)
    assert graded.returncode == 1 and "(in softmax_backward, exercise_24.py:" in graded.stdout, graded
    # Where the lesson's folder is read-only, the copy goes into the current folder, and its command runs there.
    (twin_dir / "exercise_24.py").unlink()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import workbook; workbook.writable = lambda folder: "
            "folder != sys.argv[1]; workbook.main(['--exercise', '24'])")
    started = run_cli("-c", code, str(twin_dir), cwd=other)
    assert started.returncode == 0 and (other / "exercise_24.py").exists(), started.stderr
    assert not (twin_dir / "exercise_24.py").exists() and "workbook.py exercise_24.py --check softmax" in started.stdout
    graded = grade_as_printed(started.stdout, other)
    assert graded.returncode == 1 and "(in softmax_backward, exercise_24.py:" in graded.stdout, graded
    mine = other / "exercise_24.py"
    mine.write_text(Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8"), encoding="utf-8")  # the body written
    graded = grade_as_printed(started.stdout, other)
    assert graded.returncode == 0 and graded.stdout.rstrip().endswith("ok, 0 WRONG, 0 ERROR"), graded
    # Neither folder writable: one line.
    mine.unlink()
    code = code.replace("folder != sys.argv[1]", "False")
    assert_one_line(run_cli("-c", code, str(twin_dir), cwd=other), "cannot write exercise_24.py in ",
                    "(it is read-only): run it from a folder you may write to")


def test_train_runs_the_learners_backward_beside_the_references_and_fails_where_its_loss_does_not_fall(
        twin_dir, capsys):
    source = (twin_dir / "gpt_numpy.py").read_text(encoding="utf-8")
    copy = twin_dir / "exercise_23.py"
    copy.write_text(source, encoding="utf-8")  # cross-entropy's body written right
    done = run_main(capsys, "--train", twin=imported(copy))  # python exercise_23.py --train, run here
    assert done.returncode == 0 and done.stderr == "", done.stderr
    steps = re.findall(r"step +(\d+): loss yours (\d\.\d+), reference (\d\.\d+)", done.stdout)
    assert len(steps) >= 10 and all(yours == ref for _, yours, ref in steps), done.stdout  # the same, step for step
    assert float(steps[-1][2]) < 0.5 * float(steps[0][2]) and "gpt2: your gradients train" in done.stdout
    # A wrong sign climbs the loss; a factor of 2 trains, but otherwise than the reference: both are named.
    for change in ("-dloss / targets.size", "2 * dloss / targets.size"):
        copy.write_text(source.replace("dloss / targets.size", change), encoding="utf-8")
        done = run_main(capsys, "--train", twin=imported(copy))
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert re.search(r"gpt2: your loss parted from the reference's at step \d+ \(-?\d+\.\d+ against \d\.\d+; "
                         r".*\): --check crossentropy says where", done.stdout), done.stdout
    assert_one_line(run_main(capsys, "--train", "--check", twin=imported(copy)), "--check and --train are two modes",
                    code=2)


def test_train_of_an_exercise_of_two_bodies_trains_every_block_either_is_in(twin_dir, capsys):
    # "write RMSNorm's backward" blanks LayerNorm's too (its derivation holds RMSNorm's): a slip in either fails.
    number = next(n for n, ex in enumerate(workbook.exercises(), 1)
                  if ex["function"] == "rmsnorm_backward" and "layernorm_backward" in ex.get("with", []))
    source = (twin_dir / "gpt_numpy.py").read_text(encoding="utf-8")
    right = "    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))"
    assert source.count(right) == 1
    copy = twin_dir / f"exercise_{number}.py"
    copy.write_text(source.replace(right, "    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))"),
                    encoding="utf-8")  # RMSNorm's right, LayerNorm's without its mean's path
    done = run_main(capsys, "--train", twin=imported(copy))
    assert done.returncode == 1 and "llama: your gradients train as the reference's do" in done.stdout, done.stdout
    assert re.search(r"gpt2: your loss parted .*: --check layernorm says where", done.stdout), done.stdout


def test_train_of_a_backward_in_less_precision_says_so_and_never_blames_a_slip(twin_dir, capsys):
    source = (twin_dir / "gpt_numpy.py").read_text(encoding="utf-8")
    made = "    dweight = np.zeros(shape, dtype=dout.dtype)"
    assert source.count(made) == 1
    copy = twin_dir / "exercise_22.py"  # write the embedding's backward
    assert workbook.exercises()[21]["function"] == "embedding_backward"
    for dtype in ("float16", "float32"):
        copy.write_text(source.replace(made, made.replace("dout.dtype", f"np.{dtype}")), encoding="utf-8")
        done = run_main(capsys, "--train", twin=imported(copy))
        assert "says where" not in done.stdout and "Traceback" not in done.stderr, done.stdout
        # float16's rounding parts the run on any CPU; float32's may stay within float64's rounding of it.
        said = f"your backward returns {dtype} arrays, whose rounding alone parts a run from the float64 reference's"
        if dtype == "float16" or done.returncode == 1:
            assert done.returncode == 1 and said in done.stdout, done.stdout


def test_intermediates_are_matched_by_name_and_a_backward_without_them_is_said_so(tmp_path):
    # The same right backward, its three maps' gradients taken in another order: every intermediate still matches.
    order = ['            dh = back(block + "attn.c_v", linear_backward, dv)  # (B, T, C)',
             '            dh = dh + back(block + "attn.c_k", linear_backward, dk)  # (B, T, C)',
             '            dh = dh + back(block + "attn.c_q", linear_backward, dq)  # (B, T, C)']
    reordered = [order[2].replace("dh = dh + ", "dh = "), order[1], order[0].replace("dh = ", "dh = dh + ")]
    twin = broken_twin(tmp_path, "\n".join(order), "\n".join(reordered))
    lines = []
    assert workbook.intermediates("llama", workbook.LLAMA, twin, log=lines.append) is None, lines
    # A key more, of the learner's own: the layers are still found by theirs.
    twin = broken_twin(tmp_path, "        return (grads, douts) if activations else grads",
                       "        douts['debug'] = 0.0\n        return (grads, douts) if activations else grads")
    lines = []
    assert workbook.intermediates("llama", workbook.LLAMA, twin, log=lines.append) is None, lines
    # No douts: each row says it has none, the loss's first; no pair at all: one line.
    twin = broken_twin(tmp_path, "return (grads, douts) if activations else grads", "return (grads, {})")
    lines = []
    assert workbook.intermediates("gpt2", workbook.GPT2, twin, log=lines.append) == "loss: dout"
    assert "yours has none (douts keyed by layer" in lines[1], lines
    twin = broken_twin(tmp_path, "return (grads, douts) if activations else grads", "return grads")
    lines = []
    assert workbook.intermediates("gpt2", workbook.GPT2, twin, log=lines.append) == "GPT.backward (gpt2)"
    assert lines == ["intermediates (gpt2): GPT.backward(activations=True) raised TypeError: what it returned is a "
                     "dict, not the pair (grads, douts) that activations=True asks for"], lines


# ---------------------------------------------------------------------------------------- the demo and its command line
@pytest.mark.parametrize("content, match", [
    (None, "No such file or directory"), ("FOLDER", "it is not a file"), ("/dev/zero", "it is not a file"),
    (bytes(range(256)) * 40, "it is not UTF-8 text"),
    (b"\0" * 2000 + TEXT[:2000].encode(), "holds NUL bytes, so it is binary data, not a text"),  # valid UTF-8
    (b"", "has 0 characters"), (b"a", "has 1 characters"), (b"hello world", "has 11 characters"),
], ids=["missing", "folder", "device", "binary", "NULs", "empty", "one character", "eleven characters"])
def test_the_twin_demo_refuses_bad_text_in_one_line_before_training(tmp_path, capsys, content, match):
    path = tmp_path / "text"
    if content == "/dev/zero":
        path = content
    elif content == "FOLDER":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    done = run_main(capsys, str(path), "--seconds", "30")
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1 and match in done.stderr, \
        done.stderr


@pytest.mark.parametrize("bad", ["nan", "inf", "0", "-1", "-1e-3", "-inf", "-Infinity"])
def test_the_twin_demo_refuses_seconds_that_are_not_a_positive_number(capsys, bad):
    refused = run_main(capsys, "--seconds", bad)
    # A number with a minus reaches the rule, not argparse's "expected one argument".
    assert refused.returncode == 2 and f"argument --seconds: must be in (0, 1e6), got {bad}" in refused.stderr
    assert refused.stdout == ""


def test_ctrl_c_ends_the_twin_demo_early_and_it_still_shows_what_it_learned(tmp_path):
    (tmp_path / "text").write_text(TEXT, encoding="utf-8")
    status, out, err = interrupted(["gpt_numpy.py", str(tmp_path / "text"), "--seconds", "600"], "step 0: loss")
    assert status == 0 and err == "", err
    assert re.search(r"Ctrl-C: training stopped .*\nafter \d+ steps at \d+ ms/step: val loss \d\.\d+\nsample:\n.{20}",
                     out, re.S), out


def test_the_twin_demo_speaks_as_it_trains_and_needs_no_newline(tmp_path, capsys):
    (tmp_path / "text").write_text(TEXT[:3000].replace("\n", " "), encoding="utf-8")
    done = run_main(capsys, str(tmp_path / "text"), "--seconds", "1")  # its last step ends past 1 s: a line
    assert done.returncode == 0, done.stderr
    assert run_main(capsys, str(tmp_path / "text"), "--seconds", "1e-9").returncode == 0  # one step at least
    out = done.stdout
    assert re.search(r"untrained, it writes: (['\"]).+\1\nstep 0: loss (\d\.\d+) \(a model that knows nothing scores "
                     r"ln\(\d+\) = \d\.\d+\)", out), out
    assert re.search(r"\d+ s: step \d+, loss \d\.\d+, \d+ ms/step", out), out
    assert re.search(r"after \d+ steps at \d+ ms/step: val loss \d\.\d+\nsample:\n.{20}", out, re.S), out


def test_the_twin_demo_reads_a_texts_line_ends_as_train_py_does(tmp_path, capsys):
    text = TEXT[:3000].replace("\n", "\r\n")  # a text written on Windows
    (tmp_path / "text").write_bytes(text.encode("utf-8"))
    done = run_main(capsys, str(tmp_path / "text"), "--seconds", "1e-9")
    assert done.returncode == 0, done.stderr
    assert f"scores ln({len(set(text))})" in done.stdout, done.stdout  # "\r" is a character of its own


def test_the_twin_demo_shows_a_texts_and_a_paths_escapes_and_marks_escaped(tmp_path, capsys):
    # A text of few characters, a terminal's escape and a mark that turns the text among them: the sample holds them.
    path = tmp_path / "a\x1b[2Jtext\u202e"
    path.write_text("ab\x1b\u202e\n" * 500, encoding="utf-8")
    done = run_main(capsys, str(path), "--seconds", "1e-9")
    assert done.returncode == 0, done.stderr
    sample = done.stdout.split("sample:\n")[1]
    assert "\\x1b" in sample and "\\u202e" in sample and "\n" in sample.strip(), sample  # a line's end kept
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout, done.stdout
    assert f"on {tmp_path}/a\\x1b[2Jtext\\u202e with NumPy alone" in done.stdout, done.stdout
    path.write_text("short", encoding="utf-8")
    assert_one_line(run_main(capsys, str(path)), f"{tmp_path}/a\\x1b[2Jtext\\u202e has 5 characters")


def test_check_takes_a_layer_by_its_functions_name_too(capsys):
    by_table = run_main(capsys, "--check", "rmsnorm")
    assert by_table.returncode == 0 and "rmsnorm: dx" in by_table.stdout, by_table.stdout
    assert run_main(capsys, "--check", "RMSNorm_backward").stdout == by_table.stdout


def test_a_mode_refuses_an_input_it_would_ignore(capsys):
    for args, says in ((["--check", str(Path(HERE, "input.txt"))], "--check trains nothing"),
                       (["--check", ""], "table names it ('linear', "),  # an empty name is no check, nor all of them
                       (["--check", "attn"], "--check checks every row, or a layer's named as its table names it ("),
                       (["--exercise", "1", "--seconds", "5"], "--exercise trains nothing"),
                       (["--check", "--exercise", "1"], "--check and --exercise are two modes: give one")):
        assert_one_line(run_main(capsys, *args), says, code=2)


def test_a_text_that_is_a_pipe_a_broken_link_a_loop_of_links_or_no_path_is_one_line(twin_dir, capsys):
    pipe = twin_dir / "pipe"
    os.mkfifo(pipe)
    link = twin_dir / "link"
    link.symlink_to(twin_dir / "gone")
    cut = twin_dir / "cut"
    cut.write_bytes("é".encode() * 2000 + "é".encode()[:1])  # its last character cut in half
    loop = twin_dir / "loop"
    loop.symlink_to(loop)
    for path, says in ((pipe, "it is not a file"), (link, "No such file or directory"), (cut, "it is not UTF-8 text"),
                       (loop, "Too many levels of symbolic links")):
        assert_one_line(run_main(capsys, str(path), "--seconds", "1"), f"cannot read {path} ({says})")
    assert_one_line(run_main(capsys, "", "--seconds", "1"), "the path of the text is empty: give the path of a UTF-8")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and sets RLIMIT_AS")
def test_a_text_too_big_for_the_memory_is_one_line(twin_dir):
    import resource
    # The address space the twin takes once imported, before it reads a text; 64 MB more is its limit here.
    probe = run_cli("-c", "import gpt_numpy; print(open('/proc/self/status').read())", cwd=twin_dir)
    peak = int(re.search(r"VmPeak:\s+(\d+) kB", probe.stdout).group(1)) * 1024
    limit = peak + 64 * 2 ** 20
    text = twin_dir / "big.txt"
    with open(text, "wb") as f:
        f.truncate(256 * 2 ** 20)  # 256 MB of NULs, none of them written to the disk
    done = run_cli("gpt_numpy.py", str(text), "--seconds", "1", cwd=twin_dir,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert_one_line(done, f"error: out of memory reading {text}: give a smaller text")


@pytest.mark.parametrize("dx, says", [
    (lambda right: right + 1j, "dx holds complex128 values, not real floats"),
    (lambda right: right.tolist(), "dx is a list, not a plain NumPy array"),
    (lambda right: np.ma.masked_array(right, mask=right > 0), "dx is a MaskedArray, not a plain NumPy array"),
    (lambda right: right.astype(str), "dx holds <U"),
    (lambda right: None, "dx is None")])
def test_a_gradient_that_is_no_array_of_real_floats_is_an_error_at_its_own_row_and_no_pass(dx, says):
    # Compared as they are, a complex one would be cast to its real part and pass; the others would fail in the
    # check's own code.
    rows = check_linear(lambda dout, saved: (lambda d, p: (dx(d), p))(*gpt_numpy.linear_backward(dout, saved)))
    assert [(n, r.verdict) for n, r in rows.items()] == [("x", "ERROR"), ("weight", "ok"), ("bias", "ok")]
    assert rows["x"].raised.startswith(says), rows["x"].raised
    rows = check_linear(linear_like(lambda d: {**d, "weight": d["weight"] + 1j}))
    assert rows["weight"].raised == "dweight holds complex128 values, not real floats"


def test_a_model_gradient_that_is_no_array_of_real_floats_or_under_no_name_is_an_error_row(monkeypatch):
    right = gpt_numpy.GPT.backward
    for slip, row, says in ((lambda g: {**g, "wte.weight": g["wte.weight"] + 1j}, "wte.weight",
                             "the gradient of wte.weight holds complex128 values, not real floats"),
                            (lambda g: {**g, "wte.weight": g["wte.weight"].tolist()}, "wte.weight",
                             "the gradient of wte.weight is a list, not a plain NumPy array"),
                            (lambda g: {**g, 5: g["wte.weight"]}, "5",
                             "a gradient for 5, which the model does not have")):
        monkeypatch.setattr(gpt_numpy.GPT, "backward", lambda self, activations=False, slip=slip: slip(right(self)))
        lines = []
        assert not workbook.check(log=lines.append, only="model")
        bad = {n: v for n, v in verdicts(lines).items() if v != "ok"}
        assert bad == {f"model ({block}): {row}": "ERROR" for block in ("gpt2", "llama")}, bad
        assert sum(line.endswith(says) for line in lines) == 2, lines


def test_an_exercise_copy_cut_short_is_not_kept_and_a_folder_in_its_place_is_not_work(twin_dir):
    shutil.copy(Path(HERE, "workbook.json"), twin_dir / "workbook.json")
    import resource
    # A file size limit stands in for a full disk: the copy is cut short, and goes.
    done = subprocess.run([sys.executable, "gpt_numpy.py", "--exercise", "23"], cwd=twin_dir, capture_output=True,
                          text=True, timeout=HANG, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                                        (8192, 8192)))
    assert_one_line(done, "cannot write exercise_23.py", "(File too large)")
    assert not (twin_dir / "exercise_23.py").exists()
    assert "Exercise 23 of" in run_cli("gpt_numpy.py", "--exercise", "23", cwd=twin_dir).stdout
    (twin_dir / "exercise_24.py").mkdir()
    assert_one_line(run_cli("gpt_numpy.py", "--exercise", "24", cwd=twin_dir),
                    "exercise_24.py is there and is not a file: move it away, then run --exercise 24 again")
    os.mkfifo(twin_dir / "exercise_21.hint")  # reading it would wait for a writer for ever
    assert_one_line(run_cli("gpt_numpy.py", "--exercise", "21", "--hint", cwd=twin_dir),
                    "exercise_21.hint is there and is not a file")


def test_workbook_py_alone_says_what_it_takes(twin_dir):
    assert_one_line(run_cli("workbook.py", cwd=twin_dir), "takes the path of your copy of gpt_numpy.py first")
    done = run_cli("workbook.py", "--help", cwd=twin_dir)
    assert done.returncode == 0 and done.stdout.startswith("usage: python workbook.py exercise_N.py"), done


def test_the_demo_of_a_copy_that_raises_is_one_line_naming_its_line(twin_dir):
    shutil.copy(Path(HERE, "workbook.json"), twin_dir / "workbook.json")
    assert run_cli("gpt_numpy.py", "--exercise", "24", cwd=twin_dir).returncode == 0  # its body not written
    (twin_dir / "text.txt").write_text(TEXT[:20_000], encoding="utf-8")
    done = run_cli("exercise_24.py", "text.txt", "--seconds", "1", cwd=twin_dir)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.fullmatch(r"error: the model raised NotImplementedError: softmax_backward: .* \(in softmax_backward, "
                        r"exercise_24\.py:\d+\): python exercise_24\.py --check finds the first wrong piece\n",
                        done.stderr), done.stderr


def test_an_endless_loop_in_a_backward_is_an_error_row_and_the_check_goes_on(monkeypatch):
    monkeypatch.setattr(workbook, "BACKWARD_SECONDS", 0.5)
    # As where no debugger traces: a coverage tool's trace under pytest would hold the limit off for good.
    monkeypatch.setattr(sys, "gettrace", lambda: None)

    def endless(dout, saved):
        while True:
            pass

    def swallowing(dout, saved):
        while True:
            try:
                pass
            except Exception:  # as a learner's loop may: the limit's end is no Exception
                pass

    for backward in (endless, swallowing):
        rows = check_linear(backward)
        assert [(n, r.verdict) for n, r in rows.items()] == [("x", "ERROR"), ("weight", "ERROR"), ("bias", "ERROR")]
        said = rows["x"].raised
        assert said.startswith(f"TimeoutError: {backward.__name__} ran for over 0.5 s: an endless loop?"), said
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no limit left behind
    monkeypatch.setattr(workbook, "BACKWARD_SECONDS", 10)
    assert all(r.verdict == "ok" for r in check_linear(gpt_numpy.linear_backward).values())


def test_a_debugger_in_a_backward_is_never_cut_short():
    if signal.getitimer(signal.ITIMER_REAL)[0]:
        pytest.skip("another tool's timer holds SIGALRM, and the limit stands aside for it")

    def stepped_through(dout, saved):
        # As pdb at a breakpoint() traces the body: the limit's alarm, arriving then, waits.
        traced = sys.gettrace()
        sys.settrace(lambda frame, event, arg: None)
        try:
            signal.raise_signal(signal.SIGALRM)
            time.sleep(0)  # the alarm's handler runs by here
        finally:
            sys.settrace(traced)
        return gpt_numpy.linear_backward(dout, saved)

    assert all(r.verdict == "ok" for r in check_linear(stepped_through).values())


def test_an_intermediate_that_is_no_array_of_real_floats_is_an_error_at_its_row(tmp_path):
    source = Path(HERE, "gpt_numpy.py").read_text(encoding="utf-8")
    twin = imported(with_the_workbook(tmp_path) / "gpt_numpy.py")
    shutil.copy(Path(HERE, "workbook.json"), tmp_path / "workbook.json")
    number, ex = next((n, ex) for n, ex in enumerate(workbook.exercises(), 1) if "dnll" in ex.get("lines", []))
    path, _ = workbook.start_exercise(number, twin)
    blank = Path(path).read_text(encoding="utf-8")
    hole = re.search(rf'\n( *raise NotImplementedError\("{ex["function"]}: .* are yours to write"\)\n)', blank).group(1)
    stage = workbook.blanked(source, ex["function"], names=ex["lines"])[1]
    line = next(line for line in stage.splitlines() if line.strip().startswith("dnll = "))
    for slip, says in (("dnll = dnll + 1j", "dnll holds complex128 values, not real floats"),
                       ("dnll = dnll.tolist()", "dnll is a list, not a plain NumPy array")):
        body = stage.replace(line, f"{line}\n{line[:len(line) - len(line.lstrip())]}{slip}")
        Path(path).write_text(blank.replace(hole, body), encoding="utf-8")
        lines = []
        assert not workbook.check(twin=imported(path), only=ex["check"], log=lines.append, models=False)
        assert lines[1].startswith(f"{ex['check']}: dnll (intermediate)") and lines[1].endswith(f"ERROR  {says}"), lines


def test_known_logits_that_are_no_regular_file_are_a_row_that_says_so_and_never_wait(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "twin_logits.json")  # reading it would wait for a writer for ever
    monkeypatch.setattr(workbook, "KNOWN_LOGITS", str(tmp_path / "twin_logits.json"))
    rows = {row.name: row for row in workbook.check_forward("gpt2", workbook.GPT2)}
    said = rows["forward (gpt2): known logits"].raised
    assert said.endswith("twin_logits.json: it is not a regular file: put the project's fixtures/twin_logits.json in "
                         "its place"), said
