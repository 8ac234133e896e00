"""Tests of gpt.Muon, the step of train.py and of a copy of gpt.py alone."""
import json
import os
from dataclasses import replace

import pytest
import torch

import gpt
from conftest import HERE, TINY

# Tall, wide and square; two of one shape (one batch), and one alone.
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
        X = real(update)
        seen.append(X.dtype)  # the products' dtype: the result is in the dtype they were taken in
        return X
    monkeypatch.setattr(gpt, "newton_schulz", recorded)
    for dtype in (torch.float32, torch.bfloat16):
        monkeypatch.setattr(gpt, "matmul_dtype", lambda device, dtype=dtype: dtype)
        stepped(gpt.Muon, matrices(), steps=1)
        assert seen and set(seen) == {dtype}
        seen.clear()


def test_matmul_dtype_is_bfloat16_where_the_hardware_multiplies_it_and_float32_elsewhere(monkeypatch):
    # A GPU with bfloat16 in hardware; one from before it (a T4), on which torch emulates it: float32.
    for native, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, native=native: native or including_emulation)
        assert gpt.matmul_dtype(torch.device("cuda")) == dtype
    assert gpt.matmul_dtype(torch.device("mps")) == torch.float32
    for features, dtype in (({}, torch.float32), ({"avx2": True}, torch.float32),
                            ({"avx512_bf16": True}, torch.bfloat16), ({"amx_bf16": True}, torch.bfloat16)):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda features=features: features)
        assert gpt.matmul_dtype(torch.device("cpu")) == dtype, features


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


def test_the_loop_gives_the_losses_it_gave_before_its_code_was_made_plain(monkeypatch):
    # fixtures/losses.json: a few steps of the Llama-style and GPT-2 models with each optimizer, through gpt.py alone
    # and with a step that batched the matrices of every shape, the products in float32, recorded by the code before
    # gpt.py was rewritten plainly and gained its own Muon (every case is now stepped by gpt.Muon), on whole
    # windows throughout (short_context 0). The same model, step and losses, to float32's rounding on any CPU; a
    # changed rate, momentum or initialisation moves them by 1e-2 or more within these steps.
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.float32)
    with open(os.path.join(HERE, "fixtures", "losses.json"), encoding="utf-8") as f:
        known = json.load(f)
    with open(os.path.join(HERE, "input.txt"), encoding="utf-8") as f:
        text = f.read(known["text_chars"])
    for case in known["cases"]:
        tc = gpt.TrainConfig(block_size=32, batch_size=4, n_embd=64, max_iters=8, eval_interval=8, eval_iters=2,
                             warmup_iters=3, short_context=0.0, out_dir="", device="cpu", optimizer=case["optimizer"],
                             **case["switches"])
        trainer = gpt.Trainer(tc, text, log=lambda line: None)
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
