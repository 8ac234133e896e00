"""Tests of muon.py: BatchedMuon against torch.optim.Muon."""
from dataclasses import replace

import pytest
import torch

import checkpoint
import gpt
import muon
from conftest import TINY


# Muon's options as torch.optim.Muon takes them, beyond those gpt.configure_optimizers gives.
MUON_OPTIONS = [dict(weight_decay=0.1), dict(nesterov=False, weight_decay=0.0),
                dict(adjust_lr_fn="match_rms_adamw", momentum=0.9, ns_steps=3)]


# BatchedMuon is held to torch.optim.Muon twice. In bfloat16, as both run their products, a batched product may
# round otherwise than a lone one: the same bits here, but 2% of what three steps move apart where a CPU's kernel
# rounds a product before adding to it. With the products in float32 they part by float32's rounding alone, under
# 0.001%, so that any other difference shows, on any CPU.
PRODUCTS = [("bfloat16", 0.06), ("float32", 1e-4)]


def products_in(products, monkeypatch):
    monkeypatch.setattr(muon, "products_dtype", lambda device: getattr(torch, products))
    if products == "float32":
        # A copy, as bfloat16() makes one: torch's iteration divides it in place.
        monkeypatch.setattr(torch.Tensor, "bfloat16", lambda tensor: tensor.clone())


@pytest.mark.parametrize("options", MUON_OPTIONS)
def test_batched_muon_steps_as_torch_muon_does_on_matrices_of_every_shape(options, monkeypatch):
    # Tall, wide and square; three of a shape once the tall are turned wide (one batch), and one alone.
    shapes = [(48, 16), (16, 48), (16, 16), (48, 16), (32, 8)]
    for products, tolerance in PRODUCTS:
        with monkeypatch.context() as patched:
            products_in(products, patched)
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
            # Without the Nesterov term, the decay or the shape scale, they part by 15% or more.
            assert torch.linalg.norm(p - q) < tolerance * torch.linalg.norm(q - p0), (products, p.shape)
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
    assert checkpoint.state_fits(plain, fast.state_dict()) and checkpoint.state_fits(fast, plain.state_dict())
    plain.load_state_dict(fast.state_dict())
    adamw_state = gpt.configure_optimizers(model, replace(tc, optimizer="adamw"))[0].state_dict()
    assert not checkpoint.state_fits(fast, adamw_state)


# ---------------------------------------------------------------------------------- muon.batched on gpt.py's optimizers
def test_one_step_of_gpt_pys_optimizers_on_the_default_model_is_what_batched_muon_steps(monkeypatch):
    monkeypatch.setattr(muon, "products_dtype", lambda device: torch.bfloat16)  # as torch's, on any CPU
    tc = gpt.TrainConfig()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(gpt.GPT(tc.model_config()))
    ours = gpt.configure_optimizers(models[0], tc)
    theirs = muon.batched(gpt.configure_optimizers(models[1], tc))
    assert [type(o) for o in ours] == [torch.optim.AdamW, torch.optim.Muon]
    assert [type(o) for o in theirs] == [torch.optim.AdamW, muon.BatchedMuon]
    assert len(ours[1].param_groups[0]["params"]) == 3 * 7  # q, k, v, the attention's c_proj; up, gate, c_proj
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


def test_the_products_are_bfloat16_where_the_hardware_has_it_and_float32_on_a_cpu_that_would_emulate_it(monkeypatch):
    monkeypatch.setattr(muon, "native_bf16", lambda: None)
    assert muon.products_dtype(torch.device("cpu")) == torch.float32
    assert muon.products_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(muon, "native_bf16", lambda: "avx512_bf16")
    assert muon.products_dtype(torch.device("cpu")) == torch.bfloat16
    # The step runs its products in what products_dtype says for the parameters' device.
    seen = []
    real = muon.orthogonalize
    monkeypatch.setattr(muon, "orthogonalize", lambda *args: seen.append(args[-1]) or real(*args))
    p = torch.nn.Parameter(torch.randn(8, 4))
    p.grad = torch.randn(8, 4)
    for native, dtype in ((None, torch.float32), ("amx_bf16", torch.bfloat16)):
        monkeypatch.setattr(muon, "native_bf16", lambda native=native: native)
        muon.BatchedMuon([p], lr=0.01).step()
        assert seen.pop() == dtype
