"""Tests of gpt.Muon, the copier's step, and of muon.py, train.py's: one algorithm, batched or not."""
import json
import os
from dataclasses import replace

import pytest
import torch

import checkpoint
import gpt
import muon
from conftest import HERE, TINY

# Tall, wide and square; three of a shape once the tall are turned wide (one batch), and one alone.
SHAPES = [(48, 16), (16, 48), (16, 16), (48, 16), (32, 8)]


def stepped(optimizer_class, params, steps=3, **options):
    """params after steps of optimizer_class on the same random gradients, and the optimizer."""
    torch.manual_seed(1)
    optimizer = optimizer_class(params, lr=0.02, **options)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape)
        optimizer.step()
    return params, optimizer


def matrices(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]


@pytest.mark.parametrize("options", [dict(momentum=0.95, weight_decay=0.1), dict(momentum=0.9, weight_decay=0.0)])
def test_gpt_muon_steps_as_torch_muon_does_with_the_products_in_float32(options, monkeypatch):
    # torch.optim.Muon's products are in bfloat16: made float32 there and here, the two part by float32's rounding
    # alone, so any other difference (Nesterov's term, the decay, the shape's scale) shows, on any CPU.
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda tensor: tensor.clone())
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)
    start = [p.detach().clone() for p in matrices()]
    ours, _ = stepped(gpt.Muon, matrices(), **options)
    theirs, _ = stepped(torch.optim.Muon, matrices(), **options)
    for p, q, p0 in zip(ours, theirs, start):
        # Without the Nesterov term, the decay or the shape scale, they part by 15% or more.
        assert torch.linalg.norm(p - q) < 1e-4 * torch.linalg.norm(q - p0), p.shape


def test_gpt_muon_takes_the_products_in_the_dtype_matmul_dtype_gives(monkeypatch):
    seen = []
    real = gpt.newton_schulz
    def recorded(update):
        seen.append(gpt.matmul_dtype(update.device))
        return real(update)
    monkeypatch.setattr(gpt, "newton_schulz", recorded)
    for dtype in (torch.float32, torch.bfloat16):
        monkeypatch.setattr(gpt, "matmul_dtype", lambda device, dtype=dtype: dtype)
        stepped(gpt.Muon, matrices(), steps=1)
        assert seen and set(seen) == {dtype}
        seen.clear()


def test_matmul_dtype_is_bfloat16_where_the_hardware_multiplies_it_and_float32_elsewhere(monkeypatch):
    for bf16, dtype in ((True, torch.bfloat16), (False, torch.float32)):  # a GPU from before bfloat16: float32
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        assert gpt.matmul_dtype(torch.device("cuda")) == dtype
    assert gpt.matmul_dtype(torch.device("mps")) == torch.float32
    for features, dtype in (({}, torch.float32), ({"avx2": True}, torch.float32),
                            ({"avx512_bf16": True}, torch.bfloat16), ({"amx_bf16": True}, torch.bfloat16)):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda features=features: features)
        assert gpt.matmul_dtype(torch.device("cpu")) == dtype, features


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 0.06)])
def test_batched_muon_steps_as_gpt_muon_does_on_matrices_of_every_shape(dtype, tolerance, monkeypatch):
    # The same products in the same dtype; a batched product may round otherwise than a lone one: in bfloat16 by 2% of
    # what three steps move where a CPU's kernel rounds a product before adding to it, in float32 by its rounding.
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: dtype)
    start = [p.detach().clone() for p in matrices()]
    ours, batched = stepped(muon.BatchedMuon, matrices(), weight_decay=0.1)
    theirs, alone = stepped(gpt.Muon, matrices(), weight_decay=0.1)
    for p, q, p0 in zip(ours, theirs, start):
        assert torch.linalg.norm(p - q) < tolerance * torch.linalg.norm(q - p0), (dtype, p.shape)
        assert torch.allclose(batched.state[p]["momentum_buffer"], alone.state[q]["momentum_buffer"])


def test_batched_replaces_gpt_muon_alone_with_its_options_and_state_and_either_resumes_the_others_state():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**TINY))
    tc = gpt.TrainConfig(optimizer="muon", muon_lr=0.02, muon_momentum=0.9, weight_decay=0.05)
    adamw, plain = gpt.configure_optimizers(model, tc)
    assert type(plain) is gpt.Muon
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    gpt.train_step(model, [adamw, plain], [(idx, idx)])  # a state to carry
    same_adamw, fast = muon.batched([adamw, plain])
    assert same_adamw is adamw and type(fast) is muon.BatchedMuon
    assert fast.param_groups[0]["params"] == plain.param_groups[0]["params"]
    for option in ("lr", "momentum", "weight_decay"):
        assert fast.param_groups[0][option] == plain.param_groups[0][option], option
    for p in plain.param_groups[0]["params"]:
        assert torch.equal(fast.state[p]["momentum_buffer"], plain.state[p]["momentum_buffer"])
    # A checkpoint's Muon state loads into either, and fits either as check_resumable sees it.
    assert checkpoint.state_fits(plain, fast.state_dict()) and checkpoint.state_fits(fast, plain.state_dict())
    plain.load_state_dict(fast.state_dict())
    adamw_state = gpt.configure_optimizers(model, replace(tc, optimizer="adamw"))[0].state_dict()
    assert not checkpoint.state_fits(fast, adamw_state)


def test_a_torch_muon_state_from_an_older_checkpoint_loads_into_gpt_muon_and_steps_on():
    params, old = stepped(torch.optim.Muon, matrices(), steps=1)
    ours = gpt.Muon(params, lr=0.02)
    ours.load_state_dict(old.state_dict())
    buffers = [ours.state[p]["momentum_buffer"].clone() for p in params]
    assert all(b.abs().sum() > 0 for b in buffers)  # torch's momentum, carried over
    for p in params:
        p.grad = torch.randn(p.shape)
    ours.step()
    assert all(torch.isfinite(p).all() for p in params)
    assert all(not torch.equal(ours.state[p]["momentum_buffer"], b) for p, b in zip(params, buffers))


# ---------------------------------------------------------------------------------- the copier's step is train.py's
def test_one_step_of_gpt_pys_optimizers_on_the_default_model_is_what_batched_muon_steps(monkeypatch):
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)  # on any CPU, the same dtype both ways
    tc = gpt.TrainConfig()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(gpt.GPT(tc.model_config()))
    ours = gpt.configure_optimizers(models[0], tc)
    theirs = muon.batched(gpt.configure_optimizers(models[1], tc))
    assert [type(o) for o in ours] == [torch.optim.AdamW, gpt.Muon]
    assert [type(o) for o in theirs] == [torch.optim.AdamW, muon.BatchedMuon]
    blocks = [n for n, p in models[0].named_parameters() if n.startswith("h.") and p.dim() == 2]
    assert len(ours[1].param_groups[0]["params"]) == len(blocks)
    start = [p.detach().clone() for p in models[0].parameters()]
    torch.manual_seed(1)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    for optimizer in ours + theirs:
        optimizer.step()
    moved = {id(p): p0 for p, p0 in zip(models[0].parameters(), start)}
    for p, q in zip(ours[1].param_groups[0]["params"], theirs[1].param_groups[0]["params"]):
        assert torch.linalg.norm(p - q) < 1e-4 * torch.linalg.norm(p - moved[id(p)]), p.shape


def test_the_loop_gives_the_losses_it_gave_before_its_code_was_made_plain(monkeypatch):
    # fixtures/losses.json: a few steps of the Llama-style and GPT-2 models with each optimizer, through gpt.py alone
    # and with muon.py's batched step, the products in float32, recorded by the code before gpt.py was rewritten
    # plainly and gained its own Muon. The same model, step and losses, to float32's rounding on any CPU; a changed
    # rate, momentum or initialisation moves them by 1e-2 or more within these steps.
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)
    with open(os.path.join(HERE, "fixtures", "losses.json"), encoding="utf-8") as f:
        known = json.load(f)
    with open(os.path.join(HERE, "input.txt"), encoding="utf-8") as f:
        text = f.read(known["text_chars"])
    for case in known["cases"]:
        tc = gpt.TrainConfig(block_size=32, batch_size=4, n_embd=64, max_iters=8, eval_interval=8, eval_iters=2,
                             warmup_iters=3, out_dir="", device="cpu", optimizer=case["optimizer"], **case["switches"])
        trainer = gpt.Trainer(tc, text, log=lambda line: None)
        if case["batched"]:
            trainer.optimizers = muon.batched(trainer.optimizers)
        losses = [trainer.loss.item() for _ in trainer.steps()]
        assert losses == pytest.approx(case["losses"], abs=1e-3), case["model"]
        assert trainer.history[-1]["val"] == pytest.approx(case["history"][-1]["val"], abs=1e-3), case["model"]


def test_a_matrix_without_a_gradient_is_left_as_it_is_and_the_others_step():
    params = matrices()
    frozen = params[2].detach().clone()
    optimizer = gpt.Muon(params, lr=0.02)
    for i, p in enumerate(params):
        p.grad = None if i == 2 else torch.randn(p.shape)
    optimizer.step()
    assert torch.equal(params[2], frozen) and "momentum_buffer" not in optimizer.state[params[2]]
    assert all(not torch.equal(p, q) for i, (p, q) in enumerate(zip(params, matrices())) if i != 2)
