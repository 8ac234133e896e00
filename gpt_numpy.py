"""gpt.py's model in NumPy alone, with every gradient written out by hand: a GPT to learn backprop from.

How to read it
  1. GPT.forward, top to bottom: the model as gpt.py has it, one *_forward call per layer.
  2. GPT.backward: the same calls in reverse, one *_backward per layer. Each is handed the gradient of the loss at its
     layer's output and returns the gradients at that layer's input and parameters.
  3. The layers, in the order backprop meets them: crossentropy, linear (the output head), the norms, the MLP's
     activations (gelu, swiglu), attention with its softmax and rope, and last the embedding. Above each backward,
     the maths it follows.
  Two rules do most of the work, everywhere:
  - A value used twice gets the sum of its gradients: the residual stream, the tied embedding, x in x * x.
  - A broadcast in the forward is a sum in the backward, over the axes it was repeated along: a bias added at every
    position, a norm's gain, the position embedding added to every sequence.

One calling convention for every layer:
    out, cache = name_forward(x, weight=w, bias=b)   # the parameters the layer has, as keywords; constants after x
    dx, dparams = name_backward(dout, cache)         # dparams: {"weight": dw, "bias": db}, the same keys
  dout is dL/d(out): the gradient of the loss with respect to the layer's output, in out's shape. dx has x's shape
  (None where x is integers: the embedding's indices), each dparams entry its parameter's. cache holds exactly what
  the backward needs from the forward.

Check every backward with NumPy alone, or one of your own with check_layer (its docstring shows how):
    python gpt_numpy.py --check                # each layer alone, then the whole model, against finite differences
    python gpt_numpy.py [PATH] [--seconds N]   # trains a tiny GPT on PATH (input.txt) for N seconds (60), samples
test_gpt.py also holds every gradient here to PyTorch's autograd.
"""
import argparse
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class GPTConfig:  # gpt.GPTConfig's fields and defaults (a test holds them equal); either class works here
    vocab_size: int = 65
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    norm: str = "rmsnorm"  # or "layernorm"
    pos: str = "rope"      # or "learned"
    mlp: str = "swiglu"    # or "gelu"


# ---------------------------------------------------------------------------------------------------- layers
def crossentropy_forward(logits, targets):
    m = logits.max(-1, keepdims=True)
    logz = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))  # log-sum-exp, stable for large logits
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)
    loss = (logz - picked).mean()  # mean over the B*T positions of -log p(target)
    return loss, (np.exp(logits - logz), targets)


# loss = mean over the N = B*T positions of (logz - logits[target]), where logz = log sum_j e^logits_j, whose
# derivative is softmax(logits) = p. So at each position dlogits = (p - onehot(target)) / N, times dloss (1 at the top).
def crossentropy_backward(dloss, cache):
    probs, targets = cache
    onehot = np.eye(probs.shape[-1], dtype=probs.dtype)[targets]  # (B, T, vocab_size)
    return (probs - onehot) * (dloss / targets.size), {}


def linear_forward(x, weight, bias=None):
    # As one (B*T, in) @ (in, out) product: NumPy would run a (B, T, in) one as B small ones, many times slower.
    out = (x.reshape(-1, x.shape[-1]) @ weight.T).reshape(*x.shape[:-1], weight.shape[0])  # (..., out)
    return (out if bias is None else out + bias), (x, weight, bias is not None)


# out = x W^T + b at every position. The matmul rule: for Y = A B, dA = dY B^T and dB = A^T dY. So
#   dx = dout W,   dW = dout^T x, summed over every position (rule 2),   db = dout summed over positions (rule 2)
def linear_backward(dout, cache):
    x, weight, has_bias = cache
    dout2 = dout.reshape(-1, dout.shape[-1])  # (B*T, out)
    dparams = {"weight": dout2.T @ x.reshape(-1, x.shape[-1])}
    if has_bias:
        dparams["bias"] = dout2.sum(0)
    return (dout2 @ weight).reshape(x.shape), dparams


def layernorm_forward(x, weight, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd  # (B, T, C), zero mean and unit variance over C
    out = xhat * weight
    return (out if bias is None else out + bias), (xhat, rstd, weight, bias is not None)


# xhat = (x - mu) r over the C channels of a position, mu = mean(x), var = mean((x - mu)^2), r = (var + eps)^(-1/2).
# The gain and the bias: dweight = dout * xhat and dbias = dout, both summed over positions (rule 2).
# g = dout * weight is the gradient at xhat, which reaches each x_j along three paths (rule 1 sums them):
#   direct:      d xhat_i / d x_j = r [i = j]                                       -> r g_j
#   through mu:  d mu / d x_j = 1/C and d xhat_i / d mu = -r                        -> -r mean(g)
#   through var: d var / d x_j = 2 (x_j - mu) / C; var's own path through mu vanishes, since the deviations
#                x_i - mu sum to 0. With d r / d var = -r^3 / 2 and d xhat_i / d r = x_i - mu:
#                sum_i g_i (x_i - mu) (-r^3 / 2) 2 (x_j - mu) / C                   -> -r xhat_j mean(g xhat)
#   dx = r (g - mean(g) - xhat mean(g xhat))
def layernorm_backward(dout, cache):
    xhat, rstd, weight, has_bias = cache
    g = dout * weight
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    positions = tuple(range(dout.ndim - 1))
    dparams = {"weight": (dout * xhat).sum(positions)}
    if has_bias:
        dparams["bias"] = dout.sum(positions)
    return dx, dparams


def rmsnorm_forward(x, weight, eps=1e-5):
    rstd = 1 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    xhat = x * rstd  # (B, T, C), unit root-mean-square over C
    return xhat * weight, (xhat, rstd, weight)


# LayerNorm without the mean: xhat = x r with r = (mean(x^2) + eps)^(-1/2). No mu, so no mean(g) path:
#   dx = r (g - xhat mean(g xhat)) with g = dout * weight,   dweight = dout * xhat summed over positions
def rmsnorm_backward(dout, cache):
    xhat, rstd, weight = cache
    g = dout * weight
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, {"weight": (dout * xhat).sum(tuple(range(dout.ndim - 1)))}


GELU_K = math.sqrt(2 / math.pi)


def gelu_forward(x):
    t = np.tanh(GELU_K * (x + 0.044715 * x * x * x))  # x * x * x: NumPy's x ** 3 is far slower
    return 0.5 * x * (1 + t), (x, t)


# gelu(x) = x/2 (1 + t) with t = tanh(u), u = k (x + 0.044715 x^3). The product rule, then the chain rule through t,
# with tanh'(u) = 1 - tanh(u)^2 = 1 - t^2:
#   d gelu/dx = (1 + t)/2 + x/2 dt/dx,   dt/dx = (1 - t^2) du/dx = (1 - t^2) k (1 + 3 * 0.044715 x^2)
def gelu_backward(dout, cache):
    x, t = cache
    return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * 0.044715 * x * x)), {}


def sigmoid(x):
    return 0.5 * (1 + np.tanh(0.5 * x))  # the same as 1 / (1 + e^-x), without overflow for large -x


def swiglu_forward(x):
    gate, up = np.split(x, 2, axis=-1)  # (B, T, hidden) each: c_fc's two halves
    s = sigmoid(gate)
    return gate * s * up, (gate, up, s)


# out = silu(gate) up with silu(gate) = gate s, s = sigmoid(gate) and s' = s (1 - s):
#   dgate = dout up (s + gate s (1 - s)),   dup = dout silu(gate)
# The forward split x in two halves; the backward of a split is the concatenation of the halves' gradients.
def swiglu_backward(dout, cache):
    gate, up, s = cache
    return np.concatenate([dout * up * (s + gate * s * (1 - s)), dout * gate * s], axis=-1), {}


def rope_tables(config, dtype):
    hs = config.n_embd // config.n_head
    inv_freq = 10000.0 ** (-np.arange(0, hs, 2) / hs)
    angles = np.outer(np.arange(config.block_size), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)  # (block_size, hs): channel j pairs with j + hs/2
    # gpt.py builds its tables in float64 and stores float32: round the same way to agree in float32.
    return np.cos(angles).astype(np.float32).astype(dtype), np.sin(angles).astype(np.float32).astype(dtype)


def rope_forward(x, cos, sin):
    x1, x2 = np.split(x, 2, axis=-1)
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin, (cos, sin)


# Each channel pair (x1, x2) = (x_j, x_j+hs/2) turns by its angle a, a rotation R(a):
#   out1 = x1 cos a - x2 sin a
#   out2 = x2 cos a + x1 sin a          R(a) = [[cos a, -sin a], [sin a, cos a]]
# The backward multiplies by R(a)^T, and a rotation's transpose is its inverse R(-a):
#   dx1 = dout1 cos a + dout2 sin a,   dx2 = dout2 cos a - dout1 sin a:   the forward, with sin negated.
def rope_backward(dout, cache):
    cos, sin = cache
    return rope_forward(dout, cos, -sin)[0], {}


def softmax_forward(x):
    e = np.exp(x - x.max(-1, keepdims=True))  # shifting by the max changes nothing but keeps exp from overflowing
    p = e / e.sum(-1, keepdims=True)
    return p, p


# p_i = e^x_i / sum_k e^x_k  =>  dp_i/dx_j = p_i ([i = j] - p_j), so
#   dx_j = sum_i dout_i p_i ([i = j] - p_j) = p_j (dout_j - sum_i dout_i p_i)
def softmax_backward(dout, cache):
    p = cache
    return p * (dout - (dout * p).sum(-1, keepdims=True)), {}


def attention_forward(qkv, n_head, rope=None):
    B, T, C3 = qkv.shape
    hs = C3 // 3 // n_head
    q, k, v = (t.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=-1))  # (B, nh, T, hs)
    if rope is not None:
        q, k = rope_forward(q, *rope)[0], rope_forward(k, *rope)[0]
    scale = 1 / math.sqrt(hs)  # keeps the scores' spread, and so softmax's sharpness, independent of hs
    scores = q @ k.transpose(0, 1, 3, 2) * scale  # (B, nh, T, T)
    # A position may not look ahead: -inf becomes weight exactly 0 after softmax, whatever the other scores are.
    scores = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, scores)
    att, att_cache = softmax_forward(scores)
    y = att @ v  # (B, nh, T, hs)
    return y.transpose(0, 2, 1, 3).reshape(B, T, C3 // 3), (q, k, v, att_cache, scale, rope)


# Backward from the output, each line the matmul rule (dA = dY B^T, dB = A^T dY for Y = A B) or a layer's backward:
#   y = att v:                   datt = dy v^T,   dv = att^T dy
#   att = softmax(scores):       dscores = softmax_backward(datt)
#   the mask: scores above the diagonal were set to -inf, a constant, so no gradient may pass there; att is 0 there,
#             and softmax_backward's p * (...) gives 0 there on its own
#   scores = q k^T scale:        dq = dscores k scale,   dk = dscores^T q scale
#   rope turned q and k:         turn their gradients back with rope_backward
#   q, k, v were split from qkv and their heads from C: the backward concatenates, and reshapes back
def attention_backward(dout, cache):
    q, k, v, att, scale, rope = cache
    B, nh, T, hs = q.shape
    dy = dout.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    dv = att.transpose(0, 1, 3, 2) @ dy
    dscores = softmax_backward(dy @ v.transpose(0, 1, 3, 2), att)[0] * scale
    dq, dk = dscores @ k, dscores.transpose(0, 1, 3, 2) @ q
    if rope is not None:
        dq, dk = rope_backward(dq, rope)[0], rope_backward(dk, rope)[0]
    return np.concatenate([t.transpose(0, 2, 1, 3).reshape(B, T, nh * hs) for t in (dq, dk, dv)], axis=-1), {}


def embedding_forward(idx, weight):
    return weight[idx], (idx, weight.shape)  # (..., C): one row of the table per index


# out[i] = weight[idx[i]]: each output row is a copy of one table row, so dweight[r] = the sum of dout[i] over every
# i with idx[i] = r (rule 1: a row used twice gets both gradients). np.add.at adds for each repeated index, where
# dweight[idx] += dout would keep only one. The indices are integers: they have no gradient.
def embedding_backward(dout, cache):
    idx, shape = cache
    dweight = np.zeros(shape, dtype=dout.dtype)
    np.add.at(dweight, idx, dout)
    return None, {"weight": dweight}


# ---------------------------------------------------------------------------------------------------- model
class GPT:
    """gpt.GPT's forward and backward on a dict of arrays named as gpt.GPT's named_parameters() names them."""

    def __init__(self, config, params):
        if config.dropout > 0:
            raise ValueError("the NumPy twin is deterministic and has no dropout: use a config with dropout=0")
        self.config, self.params = config, params
        self.head = "tok_emb" if config.tie_weights else "lm_head"  # the output layer's weight: the table, if tied
        self.rope = rope_tables(config, params["tok_emb.weight"].dtype) if config.pos == "rope" else None
        self.norm = (rmsnorm_forward, rmsnorm_backward) if config.norm == "rmsnorm" else \
            (layernorm_forward, layernorm_backward)
        self.act = (swiglu_forward, swiglu_backward) if config.mlp == "swiglu" else (gelu_forward, gelu_backward)
        self.cache = None

    def layer(self, name):
        """The parameters of the layer called name, as its forward takes them: {"weight": ..., "bias": ...}."""
        return {key: self.params[f"{name}.{key}"] for key in ("weight", "bias") if f"{name}.{key}" in self.params}

    def forward(self, idx, targets=None):
        cfg, norm, act = self.config, self.norm[0], self.act[0]
        B, T = idx.shape
        if T > cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size ({cfg.block_size})")
        rope = None if self.rope is None else (self.rope[0][:T], self.rope[1][:T])
        c = {}  # every layer's cache, keyed as its parameters are named, for backward
        x, c["tok_emb"] = embedding_forward(idx, **self.layer("tok_emb"))  # (B, T, C)
        if cfg.pos == "learned":
            pos, c["pos_emb"] = embedding_forward(np.arange(T), **self.layer("pos_emb"))  # (T, C)
            x = x + pos  # broadcast over the B sequences
        for i in range(cfg.n_layer):
            blk = f"blocks.{i}."
            h, c[blk + "ln_1"] = norm(x, **self.layer(blk + "ln_1"))
            h, c[blk + "attn.c_attn"] = linear_forward(h, **self.layer(blk + "attn.c_attn"))  # (B, T, 3C): q, k, v
            h, c[blk + "attn"] = attention_forward(h, cfg.n_head, rope)  # (B, T, C)
            h, c[blk + "attn.c_proj"] = linear_forward(h, **self.layer(blk + "attn.c_proj"))
            x = x + h  # the residual stream
            h, c[blk + "ln_2"] = norm(x, **self.layer(blk + "ln_2"))
            h, c[blk + "mlp.c_fc"] = linear_forward(h, **self.layer(blk + "mlp.c_fc"))  # (B, T, hidden; 2x: gate, up)
            h, c[blk + "mlp.act"] = act(h)  # (B, T, hidden)
            h, c[blk + "mlp.c_proj"] = linear_forward(h, **self.layer(blk + "mlp.c_proj"))
            x = x + h
        h, c["ln_f"] = norm(x, **self.layer("ln_f"))
        logits, c["lm_head"] = linear_forward(h, **self.layer(self.head))  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss, c["loss"] = crossentropy_forward(logits, targets)
        self.cache = c if targets is not None else None
        return logits, loss

    def backward(self, activations=False):
        """The gradient of the last forward's loss for every parameter, named as params. With activations=True, also
        {layer: dL/d(its output)}, keyed like the forward's caches, to compare a whole chain layer by layer."""
        if self.cache is None:
            raise RuntimeError("backward() needs a forward(idx, targets) with targets just before it")
        cfg, c, norm, act = self.config, self.cache, self.norm[1], self.act[1]
        grads = {name: np.zeros_like(w) for name, w in self.params.items()}
        d = {}  # the gradient at each layer's output

        def back(name, layer_backward, dout, params=None):
            """One layer's backward: adds its parameter gradients into grads (rule 1: += ), returns dL/d(its input)."""
            d[name] = dout
            dx, dparams = layer_backward(dout, c[name])
            for key, g in dparams.items():
                grads[f"{params or name}.{key}"] += g
            return dx

        dlogits = back("loss", crossentropy_backward, 1.0)  # dL/dL = 1
        dh = back("lm_head", linear_backward, dlogits, params=self.head)
        dx = back("ln_f", norm, dh)
        for i in reversed(range(cfg.n_layer)):
            blk = f"blocks.{i}."
            # x = x + f(x): the residual passes dx on unchanged, and f's gradient at its input is added to it (rule 1)
            dh = back(blk + "mlp.c_proj", linear_backward, dx)
            dh = back(blk + "mlp.act", act, dh)
            dh = back(blk + "mlp.c_fc", linear_backward, dh)
            dx = dx + back(blk + "ln_2", norm, dh)
            dh = back(blk + "attn.c_proj", linear_backward, dx)
            dh = back(blk + "attn", attention_backward, dh)
            dh = back(blk + "attn.c_attn", linear_backward, dh)
            dx = dx + back(blk + "ln_1", norm, dh)
        if cfg.pos == "learned":
            back("pos_emb", embedding_backward, dx.sum(0))  # the same rows were added to every sequence (rule 2)
        back("tok_emb", embedding_backward, dx)  # tied, this adds to the head's gradient of the same matrix (rule 1)
        return (grads, d) if activations else grads

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """gpt.GPT.generate, without a KV cache: each token from a full forward over the last block_size tokens.
        generator: a NumPy random Generator (np.random.default_rng(seed)) to repeat a sample."""
        generator = generator or np.random.default_rng()
        for _ in range(max_new_tokens):
            logits = self.forward(idx[:, -self.config.block_size:])[0][:, -1, :].astype(np.float64)
            if temperature == 0:
                next_id = logits.argmax(-1)
            else:
                logits = (logits - logits.max(-1, keepdims=True)) / max(temperature, 1e-30)  # as gpt.py, for tiny ones
                probs = softmax_forward(filter_logits(logits, top_k, top_p))[0]
                next_id = np.array([generator.choice(len(row), p=row) for row in probs])
            idx = np.concatenate([idx, next_id[:, None]], axis=1)
        return idx


def filter_logits(logits, top_k=None, top_p=None):
    """gpt.filter_logits: -inf for each logit outside the top_k, then outside the nucleus, the fewest likeliest tokens
    whose probability reaches top_p. The likeliest token always stays."""
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[..., -min(top_k, logits.shape[-1]), None]  # (B, 1)
        logits = np.where(logits < kth, -np.inf, logits)
    if top_p is not None:
        order = np.argsort(-logits, axis=-1, kind="stable")  # likeliest first
        probs = np.take_along_axis(softmax_forward(logits)[0], order, axis=-1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # the tokens before this one already reach top_p
        drop_sorted[..., 0] = False  # the likeliest stays
        drop = np.empty(logits.shape, dtype=bool)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        logits = np.where(drop, -np.inf, logits)
    return logits


def init_params(config, seed=0, dtype=np.float32):
    """Weights as gpt.GPT draws them: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer), norms at 1."""
    rng = np.random.default_rng(seed)
    C, proj_std = config.n_embd, 0.02 / math.sqrt(2 * config.n_layer)
    hidden = 64 * math.ceil(8 * C / 3 / 64) if config.mlp == "swiglu" else 4 * C

    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(dtype)

    p = {"tok_emb.weight": normal(config.vocab_size, C)}
    if config.pos == "learned":
        p["pos_emb.weight"] = normal(config.block_size, C)

    def norm(name):
        p[name + ".weight"] = np.ones(C, dtype)
        if config.norm == "layernorm" and config.bias:
            p[name + ".bias"] = np.zeros(C, dtype)

    def linear(name, n_out, n_in, std=0.02):
        p[name + ".weight"] = normal(n_out, n_in, std=std)
        if config.bias:
            p[name + ".bias"] = np.zeros(n_out, dtype)

    for i in range(config.n_layer):
        blk = f"blocks.{i}."
        norm(blk + "ln_1")
        linear(blk + "attn.c_attn", 3 * C, C)
        linear(blk + "attn.c_proj", C, C, std=proj_std)
        norm(blk + "ln_2")
        linear(blk + "mlp.c_fc", 2 * hidden if config.mlp == "swiglu" else hidden, C)
        linear(blk + "mlp.c_proj", C, hidden, std=proj_std)
    norm("ln_f")
    if not config.tie_weights:
        p["lm_head.weight"] = normal(config.vocab_size, C)
    return p


class AdamW:
    """torch.optim.AdamW, step for step, with gpt.py's grouping: weight decay on matrices only."""

    def __init__(self, params, lr, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8):
        self.params, self.lr, self.weight_decay, self.betas, self.eps = params, lr, weight_decay, betas, eps
        self.m = {name: np.zeros_like(w) for name, w in params.items()}
        self.v = {name: np.zeros_like(w) for name, w in params.items()}
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = self.betas
        for name, w in self.params.items():
            g = grads[name]
            if w.ndim >= 2:
                w *= 1 - self.lr * self.weight_decay  # decoupled: shrinks the weight, never enters the moments
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            # Bias correction undoes the moments' start at zero.
            denom = np.sqrt(self.v[name]) / math.sqrt(1 - b2 ** self.t) + self.eps
            w -= self.lr / (1 - b1 ** self.t) * self.m[name] / denom


# ---------------------------------------------------------------------------------------------------- checking
def rel_error(ours, reference):
    """The largest entry's error, relative to the larger gradient's scale: max|a - b| / max(max|a|, max|b|)."""
    scale = max(np.abs(ours).max(), np.abs(reference).max())
    return float(np.abs(ours - reference).max() / scale) if scale > 0 else 0.0


def numerical_gradient(loss, value, entries, h=1e-6):
    """Central differences (loss() at value[i] + h, less at value[i] - h) / 2h, for each entry i; value is changed in
    place and restored."""
    grad = np.zeros(len(entries))
    for n, i in enumerate(entries):
        saved = value[i]
        value[i] = saved + h
        up = loss()
        value[i] = saved - h
        down = loss()
        value[i] = saved
        grad[n] = (up - down) / (2 * h)
    return grad


def check_layer(forward, backward, x, seed=0, **params):
    """{input: max relative error} of backward(dout, cache) against central finite differences of forward, for x and
    each parameter, in float64. The loss is the "fake loss" L = sum(out * dout) for a fixed random dout: its gradient
    at out is exactly dout, so one backward gives every dL/dinput, and finite differences of L check each entry.
    A backward of your own, checked in the same way:

        def cube_forward(x):
            return x ** 3, x
        def cube_backward(dout, x):
            return dout * 3 * x ** 2, {}
        check_layer(cube_forward, cube_backward, np.random.randn(4, 5))   # {'x': 3e-10}: right to rounding
    """
    out, cache = forward(x, **params)
    dout = np.random.default_rng(seed).standard_normal(np.shape(out))
    dx, dparams = backward(dout, cache)
    loss = lambda: float(np.sum(forward(x, **params)[0] * dout))
    inputs = ([("x", x, dx)] if dx is not None else []) + [(key, params[key], dparams[key]) for key in params]
    return {name: rel_error(grad, numerical_gradient(loss, value, list(np.ndindex(value.shape))).reshape(value.shape))
            for name, value, grad in inputs}


def check(tolerance=1e-6, log=print):
    """Checks every layer's backward alone, then the whole model's gradients for a GPT-2 and a Llama block, against
    finite differences in float64. Logs one table (input or tensor, max relative error, ok or WRONG); returns whether
    every one is ok."""
    rng = np.random.default_rng(0)
    randn = lambda *shape: rng.standard_normal(shape)
    B, T, C, nh, V = 2, 5, 8, 2, 7
    config = GPTConfig(vocab_size=V, block_size=T, n_head=nh, n_embd=C)
    cos, sin = (table[:T] for table in rope_tables(config, np.float64))
    targets, idx = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    layers = [  # in the order backprop meets them
        ("crossentropy", lambda x: crossentropy_forward(x, targets), crossentropy_backward, randn(B, T, V), {}),
        ("linear", linear_forward, linear_backward, randn(B, T, C), dict(weight=randn(3, C), bias=randn(3))),
        ("layernorm", layernorm_forward, layernorm_backward, randn(B, T, C), dict(weight=randn(C), bias=randn(C))),
        ("rmsnorm", rmsnorm_forward, rmsnorm_backward, randn(B, T, C), dict(weight=randn(C))),
        ("gelu", gelu_forward, gelu_backward, randn(B, T, C), {}),
        ("swiglu", swiglu_forward, swiglu_backward, randn(B, T, 2 * C), {}),
        ("attention", lambda x: attention_forward(x, nh), attention_backward, randn(B, T, 3 * C), {}),
        ("attention, rope", lambda x: attention_forward(x, nh, (cos, sin)), attention_backward, randn(B, T, 3 * C), {}),
        ("softmax", softmax_forward, softmax_backward, randn(B, T, T), {}),
        ("rope", lambda x: rope_forward(x, cos, sin), rope_backward, randn(B, nh, T, C // nh), {}),
        ("embedding", embedding_forward, embedding_backward, idx, dict(weight=randn(V, C))),
    ]
    rows = []
    for name, forward, backward, x, params in layers:
        rows += [(f"{name}: d{key}", error) for key, error in check_layer(forward, backward, x, **params).items()]
    for block, switches in (("gpt2", dict(norm="layernorm", pos="learned", mlp="gelu", bias=True, tie_weights=True)),
                            ("llama", dict(norm="rmsnorm", pos="rope", mlp="swiglu", bias=False, tie_weights=False))):
        model_config = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=nh, n_embd=C, **switches)
        params = {name: w + 0.3 * randn(*w.shape)  # gains and biases away from 1 and 0, which would hide errors
                  for name, w in init_params(model_config, seed=1, dtype=np.float64).items()}
        model = GPT(model_config, params)
        model.forward(idx, targets)
        grads = model.backward()
        loss = lambda: model.forward(idx, targets)[1]
        for name, w in params.items():
            entries = [np.unravel_index(i, w.shape) for i in rng.choice(w.size, min(w.size, 12), replace=False)]
            numeric = numerical_gradient(loss, w, entries)
            analytic = np.array([grads[name][i] for i in entries])
            error = np.abs(analytic - numeric).max() / max(np.abs(grads[name]).max(), 1e-300)
            rows.append((f"model ({block}): {name}", float(error)))
    log(f"{'layer input, or model tensor':48s} {'max rel. error':>14s}")
    for name, error in rows:
        log(f"{name:48s} {error:14.1e}  {'ok' if error <= tolerance else 'WRONG'}")
    wrong = [name for name, error in rows if not error <= tolerance]
    log(f"{len(rows) - len(wrong)} ok, {len(wrong)} WRONG" + (f": first {wrong[0]}" if wrong else ""))
    return not wrong


# ---------------------------------------------------------------------------------------------------- the demo
class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's message on one line, without the usage block above it
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def seconds_type(text):
    value = float(text)
    if not 0 < value < 1e6:  # written so that NaN fails it too
        raise argparse.ArgumentTypeError(f"must be in (0, 1e6), got {text}")
    return value


def read_text(path, block_size):
    """The text at path, refused in one line unless it is UTF-8 and its last 10% holds one example of block_size."""
    try:
        if not os.path.isfile(path):  # a folder; or a device or a pipe, which could be read forever
            raise OSError(0, "it is not a file" if os.path.exists(path) else "there is no such file")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {path} ({reason}): give the path of a UTF-8 text file") from None
    if len(text) - int(0.9 * len(text)) <= block_size + 1:
        raise ValueError(f"{path} has {len(text)} characters: its last 10%, held out for validation, must hold "
                         f"{block_size + 2}, so give a text of {10 * (block_size + 2) + 10} or more")
    return text


def main(argv=None):
    parser = Parser(description="The NumPy twin: check its gradients, or train a tiny GPT with NumPy alone.")
    parser.add_argument("path", nargs="?", default="input.txt", help="text to train on (default: %(default)s)")
    parser.add_argument("--seconds", type=seconds_type, default=60, help="training time (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="instead: check every gradient by finite differences")
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):  # a character stdout cannot encode prints as an escape, not an error
        sys.stdout.reconfigure(errors="backslashreplace")
    if args.check:
        sys.exit(0 if check() else 1)
    B, T = 16, 64
    try:
        text = read_text(args.path, T)
    except ValueError as e:
        sys.exit(f"error: {e}")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = np.array([stoi[ch] for ch in text], dtype=np.int64)
    n = int(0.9 * len(data))
    config = GPTConfig(vocab_size=len(chars), block_size=T, n_layer=2, n_head=4, n_embd=64)
    model = GPT(config, init_params(config))
    optimizer, rng = AdamW(model.params, lr=3e-3, weight_decay=0.1), np.random.default_rng(0)
    prompt = np.array([[stoi["\n" if "\n" in stoi else chars[0]]]])
    decode = lambda ids: "".join(chars[i] for i in ids)

    def batch(split):
        ix = rng.integers(len(split) - T, size=B)
        xy = np.stack([split[i:i + T + 1] for i in ix])
        return xy[:, :-1], xy[:, 1:]

    print(f"training a {sum(w.size for w in model.params.values()):,}-parameter GPT ({config.n_layer} layers, "
          f"{config.n_embd} wide, context {T}) on {args.path} with NumPy alone, for {args.seconds:g} s")
    print("untrained, it writes: " + repr(decode(model.generate(prompt, 60, generator=rng)[0, 1:])))
    t0, step, last_report = time.time(), 0, 0.0
    try:
        while step == 0 or time.time() - t0 < args.seconds:  # one step at least
            _, loss = model.forward(*batch(data[:n]))
            optimizer.step(model.backward())
            if step == 0:
                print(f"step 0: loss {loss:.3f} (a model that knows nothing scores ln({len(chars)}) = "
                      f"{math.log(len(chars)):.3f})", flush=True)
            step += 1
            elapsed = time.time() - t0
            if elapsed - last_report >= max(args.seconds / 10, 1):
                print(f"{elapsed:.0f} s: step {step}, loss {loss:.3f}, {elapsed / step * 1000:.0f} ms/step", flush=True)
                last_report = elapsed
    except KeyboardInterrupt:  # Ctrl-C ends the training early; what the model has learned is still shown
        print("Ctrl-C: training stopped (a second one quits)")
    ms_per_step = (time.time() - t0) / max(step, 1) * 1000
    val = np.mean([model.forward(*batch(data[n:]))[1] for _ in range(20)])
    print(f"after {step} steps at {ms_per_step:.0f} ms/step: val loss {val:.3f}\nsample:")
    print(decode(model.generate(prompt, 300, temperature=0.8, generator=rng)[0, 1:]))


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the reader went away (python gpt_numpy.py --check | head): end quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except KeyboardInterrupt:  # Ctrl-C outside the training (or a second one): quit without a traceback
        print()
        sys.exit(130)
