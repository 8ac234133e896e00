"""gpt.Muon's step, faster: the Newton-Schulz iterations of all the matrices of one shape run as
one batch. train.py and bench.py step with it; a copy of gpt.py alone steps with gpt.Muon.

    trainer = gpt.Trainer(tc, data)
    trainer.optimizers = muon.batched(trainer.optimizers)

gpt.Muon orthogonalises one matrix at a time: each product is too small to keep a CPU busy. The
blocks' matrices come in a few shapes (the attention's maps are square, the MLP's are wide or
tall), so stacking the matrices of one shape turns many small products into a few batched ones.
The algorithm is gpt.Muon's, through the same gpt.newton_schulz in the same precision
(gpt.matmul_dtype): the momentum, the iteration, the learning rate scaled by the matrix's shape,
the decoupled weight decay and the state it keeps, so a checkpoint's state moves either way.
"""
import math

import torch

import gpt


def orthogonalize(updates):
    """gpt.newton_schulz of each 2-D update, those of one shape (tall ones turned wide) as one
    batch; a list like updates."""
    tall = [u.size(0) > u.size(1) for u in updates]
    wide = [u.mT if t else u for u, t in zip(updates, tall)]
    by_shape = {}
    for i, w in enumerate(wide):
        by_shape.setdefault(tuple(w.shape), []).append(i)
    out = [None] * len(updates)
    for ids in by_shape.values():
        stacked = gpt.newton_schulz(torch.stack([wide[i] for i in ids]))  # (n, rows, cols)
        for j, i in enumerate(ids):
            out[i] = stacked[j].mT if tall[i] else stacked[j]
    return out


class BatchedMuon(gpt.Muon):
    """gpt.Muon, whose step orthogonalises the matrices of one shape together."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
            grads = [p.grad for p in params]
            buffers = [self.state[p]["momentum_buffer"] for p in params]
            momentum = group["momentum"]
            # buffer = momentum * buffer + (1 - momentum) * grad, all at once.
            torch._foreach_lerp_(buffers, grads, 1 - momentum)
            updates = orthogonalize([g.lerp(b, momentum) for g, b in zip(grads, buffers)])
            lr = group["lr"]
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            for p, update in zip(params, updates):
                p.add_(update, alpha=-lr * math.sqrt(max(1, p.size(0) / p.size(1))))


def batched(optimizers):
    """optimizers, each gpt.Muon among them replaced by a BatchedMuon over the same parameters,
    with the same options and state."""
    out = []
    for optimizer in optimizers:
        if type(optimizer) is gpt.Muon:
            fast = BatchedMuon([dict(group) for group in optimizer.param_groups],
                               **optimizer.defaults)
            fast.load_state_dict(optimizer.state_dict())
            optimizer = fast
        out.append(optimizer)
    return out
