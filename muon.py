"""Muon for gpt.py's models: torch.optim.Muon's update, with the Newton-Schulz products of all the
matrices of one shape taken as one batch. train.py and bench.py step with it; gpt.py, which is read
alone, keeps torch's.

    trainer = gpt.Trainer(tc, data)
    trainer.optimizers = muon.batched(trainer.optimizers)

torch.optim.Muon orthogonalises one matrix at a time: five iterations of three small products
each, 420 products a step for the 28 matrices of the default model's blocks, each too small to keep
the CPU busy. Stacking the matrices of one shape gives a few batched products (torch.bmm) an
iteration instead, large enough to keep the CPU busy. The default model (n_embd 128, a
SwiGLU hidden width of 384) has matrices of two shapes once the tall ones are turned wide: 16 of
(128, 128), the attention's c_q, c_k, c_v and c_proj, and 12 of (128, 384), the MLP's c_fc, c_gate
and c_proj; two batches, six batched products an iteration.

Each weight of gpt.py is one map (the query, key and value maps, and SwiGLU's gate and up
projection, have weights of their own), so orthogonalising weight by weight is orthogonalising map
by map. Everything else is torch's Muon: the momentum, the quintic iteration and its coefficients,
the learning rate scaled by the matrix's shape, the decoupled weight decay, and the state it keeps,
so a checkpoint's optimizer state moves between the two either way.

The products are in bfloat16, as torch's are, where the hardware multiplies bfloat16 itself: a GPU,
or a CPU with AMX or AVX512-BF16. Other CPUs emulate it, and there float32 products are faster (a
step of the default model's Muon took 55 ms in bfloat16 and 19 ms in float32 on a 2-core Xeon
without either): the same iteration, rounded less.
"""
import functools
import math

import torch


@functools.cache
def native_bf16():
    """The CPU feature that runs bf16 natively (AMX or AVX512-BF16), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read().split()
    except OSError:
        return None
    return next((name for name in ("amx_bf16", "avx512_bf16") if name in flags), None)


def products_dtype(device):
    """bfloat16 where device multiplies it natively (CUDA, or a CPU with native_bf16()), else
    float32."""
    return torch.bfloat16 if device.type == "cuda" or native_bf16() else torch.float32


def orthogonalize(updates, coefficients, steps, eps, dtype=torch.bfloat16):
    """Each 2-D update made nearly orthogonal, as torch.optim.Muon's Newton-Schulz iteration makes
    it, the updates of one shape as one batch, the products in dtype; a list like updates, in
    dtype."""
    a, b, c = coefficients
    # Wide: the products then go through the smaller Gram matrix, X X^T.
    tall = [u.size(0) > u.size(1) for u in updates]
    wide = [u.mT if t else u for u, t in zip(updates, tall)]
    by_shape = {}
    for i, w in enumerate(wide):
        by_shape.setdefault(w.shape, []).append(i)
    out = [None] * len(updates)
    for ids in by_shape.values():
        X = torch.stack([wide[i] for i in ids]).to(dtype)  # (n, rows, cols), rows <= cols
        # Each matrix scaled to a norm of 1, so that its singular values start at most 1.
        X = X / X.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            A = X @ X.mT  # (n, rows, rows)
            B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A A
            X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
        for j, i in enumerate(ids):
            out[i] = X[j].mT if tall[i] else X[j]
    return out


def lr_scale(shape, adjust_lr_fn):
    """How much a matrix of this shape scales the learning rate, by torch.optim.Muon's rule."""
    rows, cols = shape
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon, whose step orthogonalises the matrices of one shape together."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            buffers = [self.state[p]["momentum_buffer"] for p in params]
            momentum = group["momentum"]
            # buffer = momentum * buffer + (1 - momentum) * grad, all at once.
            torch._foreach_lerp_(buffers, grads, 1 - momentum)
            updates = buffers
            if group["nesterov"]:
                updates = [g.lerp(buf, momentum) for g, buf in zip(grads, buffers)]
            updates = orthogonalize(updates, group["ns_coefficients"], group["ns_steps"],
                                    group["eps"], products_dtype(params[0].device))
            lr = float(group["lr"])
            # Decoupled weight decay, then the step, each scaled by its matrix's shape.
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            for p, update in zip(params, updates):
                p.add_(update, alpha=-lr * lr_scale(p.shape, group["adjust_lr_fn"]))
        return loss


def batched(optimizers):
    """optimizers, each torch.optim.Muon among them replaced by a BatchedMuon over the same
    parameters, with the same options and state."""
    out = []
    for optimizer in optimizers:
        if type(optimizer) is torch.optim.Muon:
            fast = BatchedMuon([dict(group) for group in optimizer.param_groups],
                               **optimizer.defaults)
            fast.load_state_dict(optimizer.state_dict())
            optimizer = fast
        out.append(optimizer)
    return out
