"""Muon for gpt.py's models: torch.optim.Muon's update with the Newton-Schulz products of all the
matrices of one shape taken as one batch (faster), and each weight that stacks several maps side by
side orthogonalised map by map (better). train.py and bench.py step with it; gpt.py, which is read
alone, keeps torch's.

    trainer = gpt.Trainer(tc, data)
    trainer.optimizers = muon.batched(trainer.optimizers, trainer.model)

torch.optim.Muon orthogonalises one matrix at a time: five iterations of three small products
each, 240 products a step for the 16 matrices of the default model, each too small to keep the CPU
busy. Stacking the matrices of one shape gives a few batched products (torch.bmm) an iteration
instead, large enough for the CPU's bfloat16 units.

gpt.py's c_attn holds the attention's query, key and value maps in one weight, and SwiGLU's c_fc
its gate and up projection: three maps and two, which torch's Muon orthogonalises as one matrix.
Given the model, batched() has them orthogonalised one map at a time, as if each were a weight of
its own, its learning rate scaled by its own shape. In 90 s of training on input.txt this took the
default model's val loss from 1.578 to 1.538 at the same step time (docs/benchmarks.md, block 11).
The maps then come in two shapes, (128, 128) and (128, 352) once turned wide: six batched products
an iteration.

Everything else is torch's Muon: the momentum, the quintic iteration and its coefficients, the
bfloat16 products, the learning rate scaled by the matrix's shape, the decoupled weight decay, and
the state it keeps, so a checkpoint's optimizer state moves between the two either way. Without
the model, the update is torch's.
"""
import math

import torch

import gpt


def orthogonalize(updates, coefficients, steps, eps):
    """Each 2-D update made nearly orthogonal, as torch.optim.Muon's Newton-Schulz iteration makes
    it (in bfloat16), the updates of one shape as one batch; a list like updates, in bfloat16."""
    a, b, c = coefficients
    # Wide: the products then go through the smaller Gram matrix, X X^T.
    tall = [u.size(0) > u.size(1) for u in updates]
    wide = [u.mT if t else u for u, t in zip(updates, tall)]
    by_shape = {}
    for i, w in enumerate(wide):
        by_shape.setdefault(w.shape, []).append(i)
    out = [None] * len(updates)
    for ids in by_shape.values():
        X = torch.stack([wide[i] for i in ids]).bfloat16()  # (n, rows, cols), rows <= cols
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


def pieces(model):
    """{weight: how many maps it stacks} for a gpt.GPT's weights that hold several maps in one (also
    inside torch.compile or DDP): the attention's c_attn (query, key and value) and SwiGLU's c_fc
    (gate and up projection)."""
    stacked = {}
    for module in model.modules():
        if isinstance(module, gpt.CausalSelfAttention):
            stacked[module.c_attn.weight] = 3
        elif isinstance(module, gpt.MLP) and module.swiglu:
            stacked[module.c_fc.weight] = 2
    return stacked


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon, whose step orthogonalises the matrices of one shape together; pieces, as
    pieces() gives them, names the weights that stack several maps, each orthogonalised alone."""

    def __init__(self, params, pieces=None, **options):
        super().__init__(params, **options)
        self.pieces = pieces or {}

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
            # A weight of k stacked maps is k matrices of its rows / k, one after the other.
            counts = [self.pieces.get(p, 1) for p in params]
            matrices = [m for update, k in zip(updates, counts) for m in update.chunk(k)]
            matrices = orthogonalize(matrices, group["ns_coefficients"], group["ns_steps"],
                                     group["eps"])
            lr = float(group["lr"])
            # Decoupled weight decay, then the step, each map's scaled by its own shape.
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            start = 0
            for p, k in zip(params, counts):
                maps = matrices[start:start + k]
                start += k
                scale = lr_scale(maps[0].shape, group["adjust_lr_fn"])
                p.add_(torch.cat(maps), alpha=-lr * scale)
        return loss


def batched(optimizers, model=None):
    """optimizers, each torch.optim.Muon among them replaced by a BatchedMuon over the same
    parameters, with the same options and state; given the model, one that orthogonalises each of
    its stacked maps alone."""
    stacked = pieces(model) if model is not None else {}
    out = []
    for optimizer in optimizers:
        if type(optimizer) is torch.optim.Muon:
            fast = BatchedMuon([dict(group) for group in optimizer.param_groups], stacked,
                               **optimizer.defaults)
            fast.load_state_dict(optimizer.state_dict())
            optimizer = fast
        out.append(optimizer)
    return out
