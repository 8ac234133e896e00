"""train.py's Muon step: gpt.Muon's update, through the same gpt.newton_schulz in the same dtype
(gpt.matmul_dtype), with the momentum of every matrix stepped at once (torch's foreach ops) and the
tall matrices turned wide to join the wide ones' batch. train.py and bench.py step with it:

    trainer = gpt.Trainer(tc, data)
    trainer.optimizers = muon.batched(trainer.optimizers)

gpt.Muon batches the matrices of one shape too, so a copy of gpt.py alone steps about as fast
(python bench.py --copier measures both); the state is the same, so a checkpoint's moves either way.
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
