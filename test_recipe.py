"""Tests for a weight of its own for each map (q, k, v; SwiGLU's gate and up), Muon's step on them, the checks
gpt.py's configs and Trainer make of what a Python caller gives them, and the checkpoint's write to the disk.
Run: python -m pytest -q test_recipe.py
"""
import dataclasses
import inspect
import math
import os
import stat
import time
from pathlib import Path

import pytest
import torch

import gpt
import gpt2
import muon
import report

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = Path(HERE, "input.txt").read_text(encoding="utf-8")[:20_000]
TINY = dict(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)


def quiet(*args, **kwargs):
    pass


def tiny_train_config(tmp_path, **overrides):
    return gpt.TrainConfig(**{**dict(out_dir=str(tmp_path / "out"), max_iters=4, eval_interval=4, eval_iters=1,
                                     batch_size=2, block_size=16, n_layer=1, n_head=2, n_embd=16, warmup_iters=1,
                                     device="cpu"), **overrides})


# ---------------------------------------------------------------------------------------------- a weight for each map
@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_each_map_has_a_weight_of_its_own(mlp):
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY, mlp=mlp, bias=True))
    hidden = 64  # SwiGLU's 8/3 * 16 rounded up to a multiple of 64, as GELU's 4 * 16
    shapes = {n.removeprefix("h.0."): tuple(p.shape) for n, p in model.named_parameters() if n.startswith("h.0.")}
    expected = {"attn.c_q.weight": (16, 16), "attn.c_k.weight": (16, 16), "attn.c_v.weight": (16, 16),
                "attn.c_proj.weight": (16, 16), "mlp.c_fc.weight": (hidden, 16), "mlp.c_proj.weight": (16, hidden)}
    if mlp == "swiglu":
        expected["mlp.c_gate.weight"] = (hidden, 16)
    assert {n: s for n, s in shapes.items() if n.endswith("weight") and "ln_" not in n} == expected
    assert all(not p.any() for n, p in model.named_parameters() if n.endswith("bias"))  # biases start at 0
    mlp_block = model.h[0].mlp
    x = torch.randn(2, 5, 16)
    if mlp == "swiglu":  # silu of the gate times the up projection
        expected_out = mlp_block.c_proj(torch.nn.functional.silu(mlp_block.c_gate(x)) * mlp_block.c_fc(x))
    else:
        expected_out = mlp_block.c_proj(torch.nn.functional.gelu(mlp_block.c_fc(x), approximate="tanh"))
    torch.testing.assert_close(mlp_block(x), expected_out)


def test_the_initial_weights_are_normal_with_the_residual_outputs_scaled_down():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(n_layer=8, n_embd=256, n_head=4))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * 8) if name.endswith("c_proj.weight") else 0.02
            assert abs(p.std().item() - std) < 0.1 * std, name  # not nn.Linear's own uniform init


def test_rotary_turns_the_query_and_the_key_each_after_its_own_map():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY)).eval()
    attn = model.h[0].attn
    x = torch.randn(1, 6, 16)
    rope = (model.cos[:6], model.sin[:6])
    split = lambda y: y.view(1, 6, 2, 8).transpose(1, 2)  # (B, nh, T, hs)
    q = gpt.rope_forward(split(attn.c_q(x)), *rope)
    k = gpt.rope_forward(split(attn.c_k(x)), *rope)
    weights = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(torch.ones(6, 6).triu(1).bool(), -math.inf)
    y = (weights.softmax(-1) @ split(attn.c_v(x))).transpose(1, 2).reshape(1, 6, 16)
    torch.testing.assert_close(attn(x, rope), attn.c_proj(y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack(report.queries_keys_values(attn, x, rope)[:2]), torch.stack([q, k]))


def test_gpt2s_c_attn_is_split_into_views_of_the_weights_given():
    weights = gpt2.read_safetensors(os.path.join(HERE, "fixtures", "tiny_gpt2", "model.safetensors"))
    model = gpt2.from_state_dict(weights, n_head=2)
    c_attn = weights["transformer.h.1.attn.c_attn.weight"]  # Conv1D: (in, out), q, k, v side by side in columns
    bias = weights["transformer.h.1.attn.c_attn.bias"]
    attn = model.h[1].attn
    for i, linear in enumerate((attn.c_q, attn.c_k, attn.c_v)):
        assert torch.equal(linear.weight, c_attn[:, i * 64:(i + 1) * 64].t())
        assert torch.equal(linear.bias, bias[i * 64:(i + 1) * 64])
        assert linear.weight.untyped_storage().data_ptr() == c_attn.untyped_storage().data_ptr()  # not copied


# ---------------------------------------------------------------------------------------------- Muon
def test_one_step_of_gpt_pys_optimizers_on_the_default_model_is_what_batched_muon_steps():
    tc = gpt.TrainConfig()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(gpt.GPT(tc.model_config()))
    ours = gpt.configure_optimizers(models[0], tc)
    theirs = muon.batched(gpt.configure_optimizers(models[1], tc))
    assert [type(o) for o in ours] == [torch.optim.AdamW, torch.optim.Muon]
    assert [type(o) for o in theirs] == [torch.optim.AdamW, muon.BatchedMuon]
    assert len(ours[1].param_groups[0]["params"]) == 4 * 7  # q, k, v, the attention's c_proj; up, gate, c_proj
    start = [p.detach().clone() for p in models[0].parameters()]
    torch.manual_seed(1)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    for optimizer in ours + theirs:
        optimizer.step()
    moved = {id(p): p0 for p, p0 in zip(models[0].parameters(), start)}
    for p, q in zip(ours[1].param_groups[0]["params"], theirs[1].param_groups[0]["params"]):
        step = torch.linalg.norm(p - moved[id(p)])
        # Both run the products in bfloat16; a batched product may round otherwise than a lone one.
        assert torch.linalg.norm(p - q) < 0.02 * step, p.shape


def test_muon_batched_takes_the_optimizers_alone_and_nothing_stacks_maps_any_more():
    assert list(inspect.signature(muon.batched).parameters) == ["optimizers"]
    assert not hasattr(muon, "pieces")
    assert "pieces" not in inspect.signature(muon.BatchedMuon).parameters


# ---------------------------------------------------------------------------------------------- the configs' checks
def bad_values(field):
    """Values of the wrong type or outside the range, for a field of TrainConfig (GPTConfig's included)."""
    if field.type is int:
        low = 0 if field.name in ("warmup_iters", "seed") else 1
        return [True, 2.0, "3", None, low - 1]
    if field.type is float:
        return [math.nan, math.inf, -math.inf, -1.0, True, "0.1", None]
    if field.type is bool:
        return ["no", 1, 0, None]
    return [None, 3, b"x"]  # str


@pytest.mark.parametrize("field", dataclasses.fields(gpt.TrainConfig), ids=lambda f: f.name)
def test_every_option_of_the_wrong_type_or_outside_its_range_is_refused_by_name(field):
    for value in bad_values(field):
        with pytest.raises(ValueError, match=rf"^{field.name} must be "):
            gpt.TrainConfig(**{field.name: value})
    if field.name in {f.name for f in dataclasses.fields(gpt.GPTConfig)}:
        with pytest.raises(ValueError, match=rf"^{field.name} must be "):
            gpt.GPTConfig(**{field.name: bad_values(field)[0]})


@pytest.mark.parametrize("changes, message", [
    (dict(bias="no"), "bias must be of type bool, not 'no'$"),  # today: a non-empty string, so biases
    (dict(n_layer=True), "n_layer must be of type int, not True$"),  # today: one layer
    (dict(n_head=4.0), "n_head must be of type int, not 4.0$"),
    (dict(grad_accum=0), r"grad_accum must be in \[1, inf\), not 0$"),  # today: a loss of 0.0 and never a step
    (dict(eval_interval=0), r"eval_interval must be in \[1, inf\), not 0$"),  # today: a ZeroDivisionError
    (dict(eval_iters=0), r"eval_iters must be in \[1, inf\), not 0$"),  # today: a ZeroDivisionError
    (dict(max_iters=0), r"max_iters must be in \[1, inf\), not 0$"),  # today: no step, no evaluation
    (dict(warmup_iters=-1), r"warmup_iters must be in \[0, inf\), not -1$"),
    (dict(seed=-1), r"seed must be in \[0, inf\), not -1$"),
    (dict(learning_rate=math.nan), r"learning_rate must be in \[1e-09, inf\), not nan$"),
    (dict(learning_rate=0.0), r"learning_rate must be in \[1e-09, inf\), not 0.0$"),  # the schedule divides by it
    (dict(muon_lr=0), r"muon_lr must be in \[1e-09, inf\), not 0$"),
    (dict(max_time=math.inf), r"max_time must be in \[0, inf\), not inf$"),  # a loop that never ends
    (dict(grad_clip=-1.0), r"grad_clip must be in \[0, inf\), not -1.0$"),  # today: a step against the gradient
    (dict(dropout=1.0), r"dropout must be in \[0, 1\), not 1.0$"),
    (dict(norm="batchnorm"), "norm must be one of rmsnorm, layernorm, not 'batchnorm'$"),
    (dict(device=None), "device must be of type str, not None$"),
])
def test_a_value_that_would_quietly_mean_something_else_is_one_clear_error(changes, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        gpt.TrainConfig(**changes)


def test_the_checks_take_every_value_that_makes_sense():
    tc = gpt.TrainConfig(learning_rate=1, min_lr=0, max_time=90, dropout=0.1, warmup_iters=0, seed=0, grad_clip=0,
                         weight_decay=0, out_dir="", device="cpu", bias=True, tie_weights=False)
    assert tc.learning_rate == 1 and tc.model_config().bias is True


def test_a_trainer_checks_a_config_changed_after_it_was_made(tmp_path):
    tc = tiny_train_config(tmp_path, out_dir="")
    tc.grad_accum = 0
    with pytest.raises(ValueError, match=r"^grad_accum must be in \[1, inf\), not 0$"):
        gpt.Trainer(tc, TEXT, log=quiet)


# ---------------------------------------------------------------------------------------------- the run's folder
def test_an_out_dir_that_names_a_file_fails_before_the_first_step(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    steps = []
    monkeypatch.setattr(gpt, "train_step", lambda *args: steps.append(1))
    tc = tiny_train_config(tmp_path, out_dir=str(tmp_path / "a_file"))
    with pytest.raises(ValueError, match=r"^cannot write a checkpoint in out_dir '.*a_file' \(File exists\): use a "
                                         r"writable folder, or '' for none$"):
        gpt.train(tc, TEXT, log=quiet)
    nested = tiny_train_config(tmp_path, out_dir=str(tmp_path / "a_file" / "run"))
    with pytest.raises(ValueError, match=r"cannot write a checkpoint in out_dir .* \(Not a directory\)"):
        gpt.Trainer(nested, TEXT, log=quiet)
    assert steps == []


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs /sys, where nothing can be made")
def test_an_out_dir_that_cannot_be_written_fails_in_gpt_train_at_once(tmp_path, monkeypatch):
    steps = []
    monkeypatch.setattr(gpt, "train_step", lambda *args: steps.append(1))
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"cannot write a checkpoint in out_dir '/sys/nope' \(.+\): use a"):
        gpt.train(tiny_train_config(tmp_path, out_dir="/sys/nope", max_iters=10 ** 6), TEXT, log=quiet)
    assert steps == [] and time.monotonic() - started < 5


@pytest.mark.skipif(os.name == "nt" or os.geteuid() == 0, reason="a read-only folder is writable to root")
def test_a_read_only_out_dir_fails_before_the_first_step(tmp_path):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(ValueError, match=r"\(Permission denied\)"):
            gpt.Trainer(tiny_train_config(tmp_path, out_dir=str(folder)), TEXT, log=quiet)
    finally:
        folder.chmod(stat.S_IRWXU)


def test_a_trainer_makes_its_out_dir_and_leaves_nothing_else_there_and_no_out_dir_means_no_folder(
        tmp_path, monkeypatch):
    gpt.Trainer(tiny_train_config(tmp_path, out_dir=str(tmp_path / "new" / "run")), TEXT, log=quiet)
    assert os.listdir(tmp_path / "new" / "run") == []
    monkeypatch.chdir(tmp_path)
    trainer = gpt.Trainer(tiny_train_config(tmp_path, out_dir=""), TEXT, log=quiet)
    for _ in trainer.steps():
        pass
    assert sorted(os.listdir(tmp_path)) == ["new"]


def test_save_checkpoint_puts_the_file_on_the_disk_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync = os.fsync
    real_replace = os.replace

    def fsync(fd):
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append(("fsync", kind))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    gpt.save_checkpoint({"a": torch.ones(3)}, str(tmp_path / "ckpt.pt"))
    folder = [] if os.name == "nt" else [("fsync", "folder")]  # Windows cannot open a folder
    assert events == [("fsync", "file"), ("replace", "ckpt.pt.tmp", "ckpt.pt"), *folder]
    assert torch.equal(torch.load(tmp_path / "ckpt.pt", weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_failed_fsync_leaves_the_last_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    gpt.save_checkpoint({"a": torch.ones(3)}, path)

    def fails(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(OSError, match="Input/output error"):
        gpt.save_checkpoint({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_load_checkpoint_takes_a_device_by_name_or_as_a_torch_device(tmp_path):
    gpt.train(tiny_train_config(tmp_path, max_iters=1, eval_interval=1), TEXT, log=quiet)
    path = str(tmp_path / "out" / "ckpt.pt")
    for device in ("cpu", torch.device("cpu"), None, ""):
        model, _, _ = gpt.load_checkpoint(path, device)
        assert next(model.parameters()).device.type == gpt.get_device(device).type


# ---------------------------------------------------------------------------------------------- training
def test_the_default_model_still_learns_in_a_few_steps(tmp_path):
    tc = tiny_train_config(tmp_path, out_dir="", max_iters=60, eval_interval=60, eval_iters=4, batch_size=8,
                           block_size=32, n_layer=2, n_embd=32, warmup_iters=5)
    model, history = gpt.train(tc, TEXT, log=quiet)
    assert history[-1]["val"] < math.log(len(set(TEXT))) - 0.9, history
