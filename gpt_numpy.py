"""gpt.py's model in NumPy alone, with every gradient written out by hand: a GPT to learn backprop
from.

How to read it
  1. GPT.forward, top to bottom: the model as gpt.py has it, one *_forward call per layer.
  2. GPT.backward: the same calls in reverse, one *_backward per layer. Each is handed the gradient
     of the loss at its layer's output and returns the gradients at that layer's input and
     parameters.
  3. The layers, in the order backprop meets them: crossentropy, linear (the output head), the
     norms, the MLP's activations (gelu, swiglu), attention with its softmax and rope, and last the
     embedding. Above each backward, the maths it follows.
  Two rules do most of the work, everywhere:
  - A value used twice gets the sum of its gradients: the residual stream, the tied embedding, the
    normed input that c_q, c_k and c_v all map, x in x * x.
  - A broadcast in the forward is a sum in the backward, over the axes it was repeated along: a
    bias added at every position, a norm's gain, the position embedding added to every sequence.

One calling convention for every layer:
    out, saved = name_forward(x, weight=w, bias=b)  # the layer's parameters as keywords
    dx, dparams = name_backward(dout, saved)        # dparams: {"weight": dw, "bias": db}
  dout is dL/d(out): the gradient of the loss with respect to the layer's output, in out's shape.
  dx has x's shape (None where x is integers: the embedding's indices), each dparams entry its
  parameter's. A layer of several inputs takes them in order, and its dx is a tuple of their
  gradients in the same order: attention's (dq, dk, dv), SwiGLU's (dgate, dup). saved holds exactly
  what the backward needs from the forward. The parameters are named as gpt.py names them (wte,
  wpe, h.0.attn.c_q.weight, ...), so that gpt.GPT's weights, GPT-2's too, run here as they are.

Check every backward with NumPy alone, or one of your own with check_layer (its docstring shows
how):
    python gpt_numpy.py --check                # each layer alone, then the whole model, against
                                               # finite differences: every row ok, WRONG or ERROR
    python gpt_numpy.py --exercise list        # the workbook: break a line of a backward, predict
                                               # the rows that turn, run the check (--exercise N)
    python gpt_numpy.py [PATH] [--seconds N]   # trains a tiny GPT on PATH (input.txt) for N
                                               # seconds (60), then samples
test_gpt.py also holds every gradient here to PyTorch's autograd.
"""
import argparse
import collections
import json
import math
import os
import sys
import textwrap
import time
from dataclasses import dataclass

import numpy as np


# gpt.GPTConfig's fields and defaults (a test holds them equal): either class works here.
@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    # or "layernorm"
    norm: str = "rmsnorm"
    # or "learned"
    pos: str = "rope"
    # or "gelu"
    mlp: str = "swiglu"


# ----------------------------------------------------------------------------------------- layers
def crossentropy_forward(logits, targets):
    m = logits.max(-1, keepdims=True)
    # log-sum-exp, less the max: stable for large logits.
    logz = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))  # (B, T, 1)
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)  # (B, T, 1)
    # The mean over the B*T positions of -log p(target).
    loss = (logz - picked).mean()
    return loss, (np.exp(logits - logz), targets)


# loss = mean over the N = B*T positions of (logz - logits[target]), where
# logz = log sum_j e^logits_j, whose derivative is softmax(logits) = p. So at each position
# dlogits = (p - onehot(target)) / N, times dloss (1 at the top).
def crossentropy_backward(dloss, saved):
    probs, targets = saved
    onehot = np.eye(probs.shape[-1], dtype=probs.dtype)[targets]  # (B, T, vocab_size)
    dlogits = (probs - onehot) * (dloss / targets.size)  # (B, T, vocab_size)
    return dlogits, {}


def linear_forward(x, weight, bias=None):
    # As one (B*T, in) @ (in, out) product: NumPy would run a (B, T, in) one as B small ones, many
    # times slower.
    x2 = x.reshape(-1, x.shape[-1])  # (B*T, in)
    out = (x2 @ weight.T).reshape(*x.shape[:-1], weight.shape[0])  # (B, T, out)
    if bias is not None:
        out = out + bias
    return out, (x, weight, bias is not None)


# The matmul rule, which every matmul's backward below follows. For Y = A B, Y_ik = sum_j A_ij B_jk:
# each A_ij reaches every Y_ik of its row i, through B_jk, so
#   dA_ij = sum_k dY_ik B_jk,  that is  dA = dY B^T
#   dB_jk = sum_i A_ij dY_ik,  that is  dB = A^T dY
# out = x W^T + b at every position. Flattened to N = B*T rows, it is one matmul, X (N, in) times
# W^T (in, out). With A = X and B = W^T:
#   dx = dout W                         (N, out) @ (out, in)
#   dW = (d(W^T))^T = (x^T dout)^T = dout^T x    (out, N) @ (N, in): its inner sum, over the N
#                                       rows, is rule 2's sum over every position
#   db = dout, summed over every position (rule 2)
# Where several maps read the same x (c_q, c_k and c_v; SwiGLU's c_gate and c_fc), each backward
# hands back its own dx, and x's gradient is their sum: rule 1, as at the residual stream.
def linear_backward(dout, saved):
    x, weight, has_bias = saved
    dout2 = dout.reshape(-1, dout.shape[-1])  # (B*T, out)
    dx = (dout2 @ weight).reshape(x.shape)  # (B, T, in)
    dparams = {"weight": dout2.T @ x.reshape(-1, x.shape[-1])}  # (out, in)
    if has_bias:
        dparams["bias"] = dout2.sum(0)  # (out,)
    return dx, dparams


def layernorm_forward(x, weight, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdims=True)  # (B, T, 1)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)  # (B, T, 1)
    # Zero mean and unit variance over the C channels of each position.
    xhat = (x - mean) * rstd  # (B, T, C)
    out = xhat * weight
    if bias is not None:
        out = out + bias
    return out, (xhat, rstd, weight, bias is not None)


# xhat = (x - mean) rstd over the C channels of a position, with mean = mean_j(x_j),
# var = mean_j((x_j - mean)^2) and rstd = (var + eps)^(-1/2). [i = j] is 1 when i = j, else 0:
# x_i depends on x_j only when they are the same channel. The gain and the bias, each summed over
# the positions (rule 2):
#   dweight = dout * xhat,   dbias = dout
# g = dout * weight is the gradient at xhat, which reaches each x_j along three paths (rule 1):
#   direct:        d xhat_i / d x_j = rstd [i = j]                    -> rstd g_j
#   through mean:  d mean / d x_j = 1/C and d xhat_i / d mean = -rstd -> -rstd mean(g)
#   through var:   d var / d x_j = 2 (x_j - mean) / C (var's own path through mean vanishes, since
#                  the deviations x_i - mean sum to 0), d rstd / d var = -rstd^3 / 2, and
#                  d xhat_i / d rstd = x_i - mean. Summed over i:
#                  sum_i g_i (x_i - mean) (-rstd^3 / 2) 2 (x_j - mean) / C
#                  = -rstd^3 (x_j - mean) mean_i(g_i (x_i - mean))
#                  = -rstd ((x_j - mean) rstd) mean_i(g_i (x_i - mean) rstd)
#                  = -rstd xhat_j mean(g xhat)                        since (x - mean) rstd = xhat
#   dx = rstd (g - mean(g) - xhat mean(g xhat))
def layernorm_backward(dout, saved):
    xhat, rstd, weight, has_bias = saved
    positions = tuple(range(dout.ndim - 1))
    g = dout * weight  # (B, T, C)
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    dparams = {"weight": (dout * xhat).sum(positions)}  # (C,)
    if has_bias:
        dparams["bias"] = dout.sum(positions)  # (C,)
    return dx, dparams


def rmsnorm_forward(x, weight, eps=1e-5):
    rstd = 1 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)  # (B, T, 1)
    # Unit root-mean-square over the C channels of each position.
    xhat = x * rstd  # (B, T, C)
    return xhat * weight, (xhat, rstd, weight)


# LayerNorm without the mean: xhat = x rstd, with ms = mean_j(x_j^2) and rstd = (ms + eps)^(-1/2).
# g = dout * weight reaches each x_j along two paths (rule 1):
#   direct:      d xhat_i / d x_j = rstd [i = j]                      -> rstd g_j
#   through ms:  d ms / d x_j = 2 x_j / C, d rstd / d ms = -rstd^3 / 2 and d xhat_i / d rstd = x_i.
#                Summed over i:
#                sum_i g_i x_i (-rstd^3 / 2) 2 x_j / C = -rstd^3 x_j mean_i(g_i x_i)
#                = -rstd (x_j rstd) mean_i(g_i x_i rstd) = -rstd xhat_j mean(g xhat)
#   dx = rstd (g - xhat mean(g xhat))
#   dweight = dout * xhat, summed over the positions (rule 2)
def rmsnorm_backward(dout, saved):
    xhat, rstd, weight = saved
    g = dout * weight  # (B, T, C)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))  # (B, T, C)
    dweight = (dout * xhat).sum(tuple(range(dout.ndim - 1)))  # (C,)
    return dx, {"weight": dweight}


GELU_K = math.sqrt(2 / math.pi)


def gelu_forward(x):
    # x * x * x: NumPy's x ** 3 is far slower.
    t = np.tanh(GELU_K * (x + 0.044715 * x * x * x))  # (B, T, hidden)
    return 0.5 * x * (1 + t), (x, t)


# gelu(x) = x/2 (1 + t) with t = tanh(u) and u = k (x + 0.044715 x^3). The chain rule through t,
# with tanh'(u) = 1 - tanh(u)^2 = 1 - t^2:
#   dt/dx = (1 - t^2) du/dx = (1 - t^2) k (1 + 3 * 0.044715 x^2)
# then the product rule:
#   d gelu/dx = (1 + t)/2 + x/2 dt/dx
def gelu_backward(dout, saved):
    x, t = saved
    dt_dx = (1 - t * t) * GELU_K * (1 + 3 * 0.044715 * x * x)  # (B, T, hidden)
    dgelu_dx = 0.5 * (1 + t) + 0.5 * x * dt_dx  # (B, T, hidden)
    return dout * dgelu_dx, {}


def sigmoid(x):
    # The same as 1 / (1 + e^-x), without an overflow for large -x.
    return 0.5 * (1 + np.tanh(0.5 * x))


def swiglu_forward(gate, up):
    # gate: c_gate's output, up: c_fc's, (B, T, hidden) each.
    s = sigmoid(gate)
    return gate * s * up, (gate, up, s)


# out = silu(gate) up, with silu(gate) = gate s, s = sigmoid(gate) and s' = s (1 - s). The product
# rule, one input at a time:
#   dgate = dout up (s + gate s (1 - s))
#   dup = dout silu(gate)
def swiglu_backward(dout, saved):
    gate, up, s = saved
    dgate = dout * up * (s + gate * s * (1 - s))  # (B, T, hidden)
    dup = dout * gate * s  # (B, T, hidden)
    return (dgate, dup), {}


def rope_tables(config, dtype):
    hs = config.n_embd // config.n_head
    inv_freq = 10000.0 ** (-np.arange(0, hs, 2) / hs)
    angles = np.outer(np.arange(config.block_size), inv_freq)  # (block_size, hs / 2)
    # Channel j pairs with j + hs/2.
    angles = np.concatenate([angles, angles], axis=-1)  # (block_size, hs)
    # gpt.py builds its tables in float64 and stores float32: rounding the same way, the two agree
    # in float32.
    cos = np.cos(angles).astype(np.float32).astype(dtype)
    sin = np.sin(angles).astype(np.float32).astype(dtype)
    return cos, sin


def rope_forward(x, cos, sin):
    x1, x2 = np.split(x, 2, axis=-1)
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin, (cos, sin)


# Each channel pair (x1, x2) = (x_j, x_j+hs/2) turns by its angle a, a rotation R(a):
#   out1 = x1 cos a - x2 sin a
#   out2 = x2 cos a + x1 sin a          R(a) = [[cos a, -sin a], [sin a, cos a]]
# The backward multiplies by R(a)^T, and a rotation's transpose is its inverse R(-a):
#   dx1 = dout1 cos a + dout2 sin a
#   dx2 = dout2 cos a - dout1 sin a:    the forward, with sin negated.
def rope_backward(dout, saved):
    cos, sin = saved
    return rope_forward(dout, cos, -sin)[0], {}


def softmax_forward(x):
    # Shifting by the max changes nothing, but keeps exp from overflowing.
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p, p


# p_i = e^x_i / sum_k e^x_k. With [i = j] 1 when i = j, else 0, the quotient rule gives
# dp_i/dx_j = p_i ([i = j] - p_j): x_j raises its own p_j and, through the sum, lowers them all.
#   dx_j = sum_i dout_i p_i ([i = j] - p_j) = p_j (dout_j - sum_i dout_i p_i)
def softmax_backward(dout, saved):
    p = saved
    return p * (dout - (dout * p).sum(-1, keepdims=True)), {}


# What attention_forward keeps for its backward, by name: q, k and v, (B, nh, T, hs) each, after
# rope; att, the attention weights, (B, nh, T, T), each row a probability distribution over the
# positions it may see; scale, 1/sqrt(hs); rope, the (cos, sin) tables or None.
AttentionSaved = collections.namedtuple("AttentionSaved", "q k v att scale rope")


def attention_forward(q, k, v, n_head, rope=None):
    """Causal self-attention of n_head heads on q, k and v, (B, T, C) each: (y, AttentionSaved)."""
    B, T, C = q.shape
    hs = C // n_head
    # Each head its own slice of hs channels.
    q = q.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    k = k.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    v = v.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    if rope is not None:
        q = rope_forward(q, *rope)[0]
        k = rope_forward(k, *rope)[0]
    # Keeps the scores' spread, and so softmax's sharpness, independent of the head size.
    scale = 1 / math.sqrt(hs)
    scores = q @ k.transpose(0, 1, 3, 2) * scale  # (B, nh, T, T)
    # A position may not look ahead: -inf becomes weight exactly 0 after softmax, whatever the
    # other scores are.
    later = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores = np.where(later, -np.inf, scores)
    att, _ = softmax_forward(scores)  # (B, nh, T, T)
    y = att @ v  # (B, nh, T, hs)
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C): the heads side by side again
    return y, AttentionSaved(q, k, v, att, scale, rope)


# Backward from the output, each line the matmul rule (dA = dY B^T, dB = A^T dY for Y = A B) or a
# layer's backward:
#   y = att v:              datt = dy v^T,   dv = att^T dy
#   att = softmax(scores):  dscores = softmax_backward(datt)
#   the mask:               the scores above the diagonal were set to -inf, a constant, so no
#                           gradient may pass there; att is 0 there, and softmax_backward's
#                           p * (...) gives 0 there on its own
#   scores = q k^T scale:   dq = dscores (k^T)^T scale = dscores k scale, and d(k^T) = q^T dscores
#                           scale, so dk = (d(k^T))^T = dscores^T q scale
#   rope turned q and k:    turn their gradients back with rope_backward
#   the heads were split from C: the backward puts them side by side again
def attention_backward(dout, saved):
    q, k, v, att, scale, rope = saved
    B, nh, T, hs = q.shape
    dy = dout.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    datt = dy @ v.transpose(0, 1, 3, 2)  # (B, nh, T, T)
    dv = att.transpose(0, 1, 3, 2) @ dy  # (B, nh, T, hs)
    dscores = softmax_backward(datt, att)[0]  # (B, nh, T, T)
    dq = dscores @ k * scale  # (B, nh, T, hs)
    dk = dscores.transpose(0, 1, 3, 2) @ q * scale  # (B, nh, T, hs)
    if rope is not None:
        dq = rope_backward(dq, rope)[0]
        dk = rope_backward(dk, rope)[0]
    dq = dq.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, C)
    dk = dk.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, C)
    dv = dv.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, C)
    return (dq, dk, dv), {}


def embedding_forward(idx, weight):
    # One row of the table per index.
    return weight[idx], (idx, weight.shape)  # (B, T, C)


# out[i] = weight[idx[i]]: each output row is a copy of one table row, so dweight[r] is the sum
# of dout[i] over every i with idx[i] = r (rule 1: a row used twice gets both gradients).
# np.add.at adds for each repeated index, where dweight[idx] += dout would keep only one. The
# indices are integers: they have no gradient.
def embedding_backward(dout, saved):
    idx, shape = saved
    dweight = np.zeros(shape, dtype=dout.dtype)  # (vocab_size, C)
    np.add.at(dweight, idx, dout)
    return None, {"weight": dweight}


# ------------------------------------------------------------------------------------------ model
class GPT:
    """gpt.GPT's forward and backward on a dict of arrays, named as gpt.GPT's named_parameters()
    names them: {n: p.detach().numpy() for n, p in model.named_parameters()}."""

    def __init__(self, config, params):
        if config.dropout > 0:
            raise ValueError("the NumPy twin is deterministic and has no dropout: use a config "
                             "with dropout=0")
        self.config = config
        self.params = params
        # The output layer's weight: the token embedding's table, when they are tied.
        self.head = "wte" if config.tie_weights else "lm_head"
        self.rope = None
        if config.pos == "rope":
            self.rope = rope_tables(config, params["wte.weight"].dtype)
        self.norm = (layernorm_forward, layernorm_backward)
        if config.norm == "rmsnorm":
            self.norm = (rmsnorm_forward, rmsnorm_backward)
        # What the last forward saved for the backward, by layer.
        self.saved = None

    def params_of(self, name):
        """The parameters of the layer called name, as its forward takes them: weight, bias."""
        keys = ("weight", "bias")
        return {key: self.params[f"{name}.{key}"] for key in keys if f"{name}.{key}" in self.params}

    def forward(self, idx, targets=None):
        cfg = self.config
        norm = self.norm[0]
        B, T = idx.shape
        if T > cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size ({cfg.block_size})")
        rope = None
        if self.rope is not None:
            rope = (self.rope[0][:T], self.rope[1][:T])
        # Every layer's saved values, keyed as its parameters are named, for the backward.
        saved = {}
        x, saved["wte"] = embedding_forward(idx, **self.params_of("wte"))  # (B, T, C)
        if cfg.pos == "learned":
            pos, saved["wpe"] = embedding_forward(np.arange(T), **self.params_of("wpe"))  # (T, C)
            # The same rows are added to every sequence: a broadcast over B.
            x = x + pos
        for i in range(cfg.n_layer):
            # The names of block i's layers begin with b.
            b = f"h.{i}."
            h, saved[b + "ln_1"] = norm(x, **self.params_of(b + "ln_1"))
            # Three maps of the same h: the queries, the keys and the values, (B, T, C) each.
            q, saved[b + "attn.c_q"] = linear_forward(h, **self.params_of(b + "attn.c_q"))
            k, saved[b + "attn.c_k"] = linear_forward(h, **self.params_of(b + "attn.c_k"))
            v, saved[b + "attn.c_v"] = linear_forward(h, **self.params_of(b + "attn.c_v"))
            h, saved[b + "attn"] = attention_forward(q, k, v, cfg.n_head, rope)  # (B, T, C)
            h, saved[b + "attn.c_proj"] = linear_forward(h, **self.params_of(b + "attn.c_proj"))
            # The residual stream.
            x = x + h
            h, saved[b + "ln_2"] = norm(x, **self.params_of(b + "ln_2"))
            if cfg.mlp == "swiglu":
                # Two maps of the same h, (B, T, hidden) each: silu(gate) scales up, unit by unit.
                gate, saved[b + "mlp.c_gate"] = linear_forward(
                    h, **self.params_of(b + "mlp.c_gate"))
                up, saved[b + "mlp.c_fc"] = linear_forward(h, **self.params_of(b + "mlp.c_fc"))
                h, saved[b + "mlp.act"] = swiglu_forward(gate, up)  # (B, T, hidden)
            else:
                h, saved[b + "mlp.c_fc"] = linear_forward(h, **self.params_of(b + "mlp.c_fc"))
                h, saved[b + "mlp.act"] = gelu_forward(h)  # (B, T, hidden)
            h, saved[b + "mlp.c_proj"] = linear_forward(h, **self.params_of(b + "mlp.c_proj"))
            x = x + h
        h, saved["ln_f"] = norm(x, **self.params_of("ln_f"))
        logits, saved["lm_head"] = linear_forward(h, **self.params_of(self.head))  # (B, T, V)
        loss = None
        if targets is not None:
            loss, saved["loss"] = crossentropy_forward(logits, targets)
        self.saved = saved if targets is not None else None
        return logits, loss

    def backward(self, activations=False):
        """The gradient of the last forward's loss for every parameter, named as params. With
        activations=True, also douts, {layer: dL/d(its output)}, keyed like the forward's saved
        values, to compare a whole chain with PyTorch's layer by layer."""
        if self.saved is None:
            raise RuntimeError("backward() needs a forward(idx, targets), with targets, before it")
        cfg = self.config
        norm = self.norm[1]
        grads = {name: np.zeros_like(w) for name, w in self.params.items()}
        # The gradient at each layer's output.
        douts = {}

        def back(name, layer_backward, dout, params=None):
            """One layer's backward: adds its parameter gradients into grads (rule 1: +=), and
            returns dL/d(its input)."""
            douts[name] = dout
            dx, dparams = layer_backward(dout, self.saved[name])
            for key, g in dparams.items():
                grads[f"{params or name}.{key}"] += g
            return dx

        # dL/dL = 1.
        dlogits = back("loss", crossentropy_backward, 1.0)  # (B, T, vocab_size)
        dh = back("lm_head", linear_backward, dlogits, params=self.head)  # (B, T, C)
        dx = back("ln_f", norm, dh)  # (B, T, C)
        for i in reversed(range(cfg.n_layer)):
            block = f"h.{i}."
            # x = x + f(x): the residual passes dx on unchanged, and f's gradient at its input is
            # added to it (rule 1).
            dh = back(block + "mlp.c_proj", linear_backward, dx)  # (B, T, hidden)
            if cfg.mlp == "swiglu":
                dgate, dup = back(block + "mlp.act", swiglu_backward, dh)  # (B, T, hidden) each
                # gate and up were maps of the same h: h's gradient is the sum of theirs (rule 1).
                dh = back(block + "mlp.c_fc", linear_backward, dup)  # (B, T, C)
                dh = dh + back(block + "mlp.c_gate", linear_backward, dgate)  # (B, T, C)
            else:
                dh = back(block + "mlp.act", gelu_backward, dh)  # (B, T, hidden)
                dh = back(block + "mlp.c_fc", linear_backward, dh)  # (B, T, C)
            dx = dx + back(block + "ln_2", norm, dh)
            dh = back(block + "attn.c_proj", linear_backward, dx)  # (B, T, C)
            dq, dk, dv = back(block + "attn", attention_backward, dh)  # (B, T, C) each
            # q, k and v were three maps of the same h: as at the residual stream, a value used by
            # several paths gets the sum of their gradients (rule 1).
            dh = back(block + "attn.c_v", linear_backward, dv)  # (B, T, C)
            dh = dh + back(block + "attn.c_k", linear_backward, dk)  # (B, T, C)
            dh = dh + back(block + "attn.c_q", linear_backward, dq)  # (B, T, C)
            dx = dx + back(block + "ln_1", norm, dh)
        if cfg.pos == "learned":
            # The same rows were added to every sequence (rule 2).
            back("wpe", embedding_backward, dx.sum(0))
        # Tied, this adds to the head's gradient of the same matrix (rule 1).
        back("wte", embedding_backward, dx)
        return (grads, douts) if activations else grads

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                 generator=None):
        """gpt.GPT.generate without a KV cache: each token from a full forward over the last
        block_size tokens. generator: a NumPy random Generator (np.random.default_rng(seed)), to
        repeat a sample."""
        generator = generator or np.random.default_rng()
        for _ in range(max_new_tokens):
            window = idx[:, -self.config.block_size:]
            logits = self.forward(window)[0][:, -1, :].astype(np.float64)  # (B, vocab_size)
            if temperature == 0:
                next_id = logits.argmax(-1)
            else:
                # As gpt.py: less the max, over a temperature of at least 1e-30.
                logits = (logits - logits.max(-1, keepdims=True)) / max(temperature, 1e-30)
                probs = softmax_forward(filter_logits(logits, top_k, top_p))[0]
                next_id = np.array([generator.choice(len(row), p=row) for row in probs])
            idx = np.concatenate([idx, next_id[:, None]], axis=1)
        return idx


def filter_logits(logits, top_k=None, top_p=None):
    """gpt.filter_logits: -inf for each logit outside the top_k, then outside the nucleus, the
    fewest likeliest tokens whose probability reaches top_p. The likeliest token always stays."""
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[..., -min(top_k, logits.shape[-1]), None]  # (B, 1)
        logits = np.where(logits < kth, -np.inf, logits)
    if top_p is not None:
        # The likeliest first.
        order = np.argsort(-logits, axis=-1, kind="stable")
        probs = np.take_along_axis(softmax_forward(logits)[0], order, axis=-1)
        # A token goes when those before it already reach top_p; the likeliest stays.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop_sorted[..., 0] = False
        drop = np.empty(logits.shape, dtype=bool)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        logits = np.where(drop, -np.inf, logits)
    return logits


def init_params(config, seed=0, dtype=np.float32):
    """Weights as gpt.GPT draws them: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer),
    norms at 1."""
    rng = np.random.default_rng(seed)
    C = config.n_embd
    proj_std = 0.02 / math.sqrt(2 * config.n_layer)
    hidden = 64 * math.ceil(8 * C / 3 / 64) if config.mlp == "swiglu" else 4 * C

    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(dtype)

    p = {"wte.weight": normal(config.vocab_size, C)}
    if config.pos == "learned":
        p["wpe.weight"] = normal(config.block_size, C)

    def norm(name):
        p[name + ".weight"] = np.ones(C, dtype)
        if config.norm == "layernorm" and config.bias:
            p[name + ".bias"] = np.zeros(C, dtype)

    def linear(name, n_out, n_in, std=0.02):
        p[name + ".weight"] = normal(n_out, n_in, std=std)
        if config.bias:
            p[name + ".bias"] = np.zeros(n_out, dtype)

    for i in range(config.n_layer):
        block = f"h.{i}."
        norm(block + "ln_1")
        linear(block + "attn.c_q", C, C)
        linear(block + "attn.c_k", C, C)
        linear(block + "attn.c_v", C, C)
        linear(block + "attn.c_proj", C, C, std=proj_std)
        norm(block + "ln_2")
        linear(block + "mlp.c_fc", hidden, C)
        if config.mlp == "swiglu":
            linear(block + "mlp.c_gate", hidden, C)
        linear(block + "mlp.c_proj", C, hidden, std=proj_std)
    norm("ln_f")
    if not config.tie_weights:
        p["lm_head.weight"] = normal(config.vocab_size, C)
    return p


class AdamW:
    """torch.optim.AdamW, step for step, with gpt.py's grouping: weight decay on matrices only."""

    def __init__(self, params, lr, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.betas = betas
        self.eps = eps
        self.m = {name: np.zeros_like(w) for name, w in params.items()}
        self.v = {name: np.zeros_like(w) for name, w in params.items()}
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = self.betas
        for name, w in self.params.items():
            g = grads[name]
            # Decoupled: the decay shrinks the weight, and never enters the moments.
            if w.ndim >= 2:
                w *= 1 - self.lr * self.weight_decay
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            # Bias correction undoes the moments' start at zero.
            denom = np.sqrt(self.v[name]) / math.sqrt(1 - b2 ** self.t) + self.eps
            w -= self.lr / (1 - b1 ** self.t) * self.m[name] / denom


def newton_schulz(g, steps=5):
    """About U V^T for g = U S V^T: g's directions, each singular value pushed to about 1. Muon's
    update, as torch.optim.Muon computes it (in bfloat16 there, in g's own type here)."""
    # A gradient matrix is dominated by a few directions, its largest singular values, and momentum
    # SGD moves the weights mostly along those. Muon moves along every direction the gradient names
    # by about the same amount. An SVD per step would be slow. An odd polynomial of x,
    # a x + b (x x^T) x + c (x x^T)^2 x, acts on each singular value s alone: a s + b s^3 + c s^5.
    # Five rounds of this one carry every s between 0.003 and 1 (after the scaling below) to
    # between 0.68 and 1.2: not exactly 1, which does no harm, in a few matrix products.
    a, b, c = 3.4445, -4.7750, 2.0315
    wide = g.shape[0] <= g.shape[1]
    # (m, n) with m <= n, so that x x^T is the smaller of the two products.
    x = g if wide else g.T
    # The Frobenius norm is at least the largest singular value: every s starts in [0, 1].
    x = x / max(np.linalg.norm(x), 1e-7)
    for _ in range(steps):
        gram = x @ x.T  # (m, m)
        x = a * x + (b * gram + c * gram @ gram) @ x  # (m, n)
    return x if wide else x.T


class Muon:
    """torch.optim.Muon, step for step (Nesterov momentum, its default), for the matrices gpt.py
    gives it: the blocks' 2-D weights. The rest stays with AdamW."""

    def __init__(self, params, lr=0.01, weight_decay=0.1, momentum=0.95):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.buf = {name: np.zeros_like(w) for name, w in params.items()}

    def step(self, grads):
        mu = self.momentum
        for name, w in self.params.items():
            g = grads[name]
            self.buf[name] = mu * self.buf[name] + (1 - mu) * g
            # Nesterov: the step looks ahead, along the gradient mixed once more with the momentum.
            update = newton_schulz((1 - mu) * g + mu * self.buf[name])
            # Scaled by sqrt(rows / columns) where taller than wide, the update's entries are about
            # 1 / sqrt(columns) in size, whatever the matrix's shape.
            lr = self.lr * math.sqrt(max(1, w.shape[0] / w.shape[1]))
            w *= 1 - self.lr * self.weight_decay
            w -= lr * update


# --------------------------------------------------------------------------------------- checking
def rel_error(ours, reference, scale=None):
    """The largest entry's error, relative to the gradient's scale: max|a - b| / scale, where scale
    is by default the larger of max|a| and max|b|. inf where either holds a NaN or an inf: such a
    gradient is never right."""
    ours = np.asarray(ours, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if not (np.isfinite(ours).all() and np.isfinite(reference).all()):
        return math.inf
    if scale is None:
        scale = max(np.abs(ours).max(), np.abs(reference).max())
    return float(np.abs(ours - reference).max() / scale) if scale > 0 else 0.0


class Row:
    """One row of the check: a gradient's name and its largest relative error against finite
    differences, ok when at most the tolerance, else WRONG; or ERROR, with the one line of the
    exception its forward or backward raised."""

    def __init__(self, name, error=math.inf, tolerance=1e-6, raised=None):
        self.name = name
        self.error = error
        self.tolerance = tolerance
        self.raised = raised

    @property
    def verdict(self):
        if self.raised is not None:
            return "ERROR"
        return "ok" if self.error <= self.tolerance else "WRONG"

    def __str__(self):
        if self.raised is not None:
            return f"{self.name:44s} {'':14s}  ERROR  {self.raised}"
        return f"{self.name:44s} {self.error:14.1e}  {self.verdict}"

    def __repr__(self):
        if self.raised is not None:
            return f"{self.name}: ERROR ({self.raised})"
        return f"{self.name}: {self.verdict} ({self.error:.1e}, at most {self.tolerance:g})"


def one_line(error):
    """An exception as the table shows it: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def numerical_gradient(loss, value, entries, h=1e-6):
    """Central differences, (loss() at value[i] + h, less loss() at value[i] - h) / 2h, for each
    entry i; value is changed in place, and restored."""
    grad = np.zeros(len(entries))
    for n, i in enumerate(entries):
        kept = value[i]
        value[i] = kept + h
        up = loss()
        value[i] = kept - h
        down = loss()
        value[i] = kept
        grad[n] = (up - down) / (2 * h)
    return grad


# A broken backward's NaN or overflow makes a WRONG row, and no warning beside it.
@np.errstate(all="ignore")
def check_layer(forward, backward, x, seed=0, tolerance=1e-6, **params):
    """[Row for x, then for each parameter]: backward(dout, saved) against central finite
    differences of forward, in float64, each row ok or WRONG with its largest relative error and
    the tolerance; one ERROR row if forward or backward raises. The loss is the "fake loss"
    L = sum(out * dout) for a fixed random dout: its gradient at out is exactly dout, so one
    backward gives every dL/dinput, and finite differences of L check each entry. A backward of
    your own, checked so:

        def cube_forward(x):
            return x ** 3, x
        def cube_backward(dout, x):
            return dout * 3 * x ** 2, {}
        check_layer(cube_forward, cube_backward, np.random.randn(4, 5))   # [x: ok (3.0e-10, ...)]

    A layer of several inputs gets them as a dict, {"gate": g, "up": u}, in the order its forward
    takes them; its backward's dx is then the tuple of their gradients, and each gets a row."""
    names = list(x) if isinstance(x, dict) else ["x"]
    values = list(x.values()) if isinstance(x, dict) else [x]

    def run_forward():
        # Copies at every call, of the inputs and of dout below: a forward or backward that
        # writes into its arrays in place changes neither the arrays the finite differences move
        # nor dout, so it cannot make a wrong gradient pass, or a right one fail.
        copies = {key: np.copy(value) for key, value in params.items()}
        return forward(*[np.copy(value) for value in values], **copies)

    try:
        out, saved = run_forward()
        dout = np.random.default_rng(seed).standard_normal(np.shape(out))
        dx, dparams = backward(np.copy(dout), saved)
        # One input's dx on its own; several inputs' as a tuple.
        dxs = list(dx) if isinstance(x, dict) else [dx]
        if len(dxs) != len(values):
            raise ValueError(f"the backward gave {len(dxs)} input gradients for {len(values)} "
                             f"inputs")

        def loss():
            return float(np.sum(run_forward()[0] * dout))

        inputs = [(key, params[key], dparams[key]) for key in params]
        # None for an input without a gradient: the embedding's integer indices.
        inputs[:0] = [row for row in zip(names, values, dxs) if row[2] is not None]
        rows = []
        for name, value, grad in inputs:
            # A gradient of another shape could broadcast against the reference, unnoticed.
            if np.shape(grad) != value.shape:
                raise ValueError(f"d{name} has the shape {np.shape(grad)}, not {name}'s "
                                 f"{value.shape}")
            numeric = numerical_gradient(loss, value, list(np.ndindex(value.shape)))
            rows.append(Row(name, rel_error(grad, numeric.reshape(value.shape)), tolerance))
        return rows
    except Exception as e:
        return [Row("backward", raised=one_line(e))]


@np.errstate(all="ignore")
def check_model(block, switches, rng, tolerance=1e-6):
    """Rows for every tensor of a 2-layer GPT of that block: 12 entries of each gradient against
    finite differences, measured against the scale of its whole gradient, or a hundredth of the
    model's largest entry where that is more; one ERROR row if the model's forward or backward
    raises."""
    B, T, C, nh, V = 2, 5, 8, 2, 7
    targets = rng.integers(0, V, (B, T))
    idx = rng.integers(0, V, (B, T))
    config = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=nh, n_embd=C, **switches)
    # Gains and biases away from 1 and 0, where they would hide errors.
    params = {name: w + 0.3 * rng.standard_normal(w.shape)
              for name, w in init_params(config, seed=1, dtype=np.float64).items()}

    def fresh():
        # Copies for each model: a layer that writes into the weights, the indices or the targets
        # in place cannot move what the finite differences measure.
        return GPT(config, {name: w.copy() for name, w in params.items()})

    rows = []
    try:
        model = fresh()
        model.forward(idx.copy(), targets.copy())
        grads = model.backward()
        # In GPT-2's block the keys' bias has a gradient of zero: it adds q.b to every score of a
        # query's row, and softmax ignores a shift the whole row shares (rope turns b by another
        # angle at each position, and so gives it a gradient). Its finite differences are
        # rounding noise alone, with no scale of their own to be relative to.
        floor = max(np.abs(g).max() for g in grads.values()) / 100

        def loss():
            return fresh().forward(idx.copy(), targets.copy())[1]

        for name, w in params.items():
            picked = rng.choice(w.size, min(w.size, 12), replace=False)
            entries = [np.unravel_index(i, w.shape) for i in picked]
            numeric = numerical_gradient(loss, w, entries)
            analytic = np.array([grads[name][i] for i in entries])
            # With numeric's own scale: a gradient of zeros is never right where it is not.
            scale = max(np.abs(grads[name]).max(), np.abs(numeric).max(), floor)
            error = rel_error(analytic, numeric, scale=scale)
            rows.append(Row(f"model ({block}): {name}", error, tolerance))
    except Exception as e:
        rows.append(Row(f"model ({block}): backward", raised=one_line(e)))
    return rows


def check(tolerance=1e-6, log=print):
    """Checks every layer's backward alone, then the whole model's gradients for a GPT-2 and a Llama
    block, against finite differences in float64. Logs one table, every row to the end whatever
    breaks: input or tensor, max relative error, ok, WRONG or ERROR. Returns whether every one is
    ok."""
    rng = np.random.default_rng(0)

    def randn(*shape):
        return rng.standard_normal(shape)

    B, T, C, nh, V = 2, 5, 8, 2, 7
    config = GPTConfig(vocab_size=V, block_size=T, n_head=nh, n_embd=C)
    cos, sin = (table[:T] for table in rope_tables(config, np.float64))
    targets = rng.integers(0, V, (B, T))
    idx = rng.integers(0, V, (B, T))
    # In the order backprop meets them.
    layers = [
        ("crossentropy", lambda x: crossentropy_forward(x, targets), crossentropy_backward,
         randn(B, T, V), {}),
        ("linear", linear_forward, linear_backward, randn(B, T, C),
         dict(weight=randn(3, C), bias=randn(3))),
        ("layernorm", layernorm_forward, layernorm_backward, randn(B, T, C),
         dict(weight=randn(C), bias=randn(C))),
        ("rmsnorm", rmsnorm_forward, rmsnorm_backward, randn(B, T, C), dict(weight=randn(C))),
        ("gelu", gelu_forward, gelu_backward, randn(B, T, C), {}),
        ("swiglu", swiglu_forward, swiglu_backward, dict(gate=randn(B, T, C), up=randn(B, T, C)),
         {}),
        ("attention", lambda q, k, v: attention_forward(q, k, v, nh), attention_backward,
         dict(q=randn(B, T, C), k=randn(B, T, C), v=randn(B, T, C)), {}),
        ("attention, rope", lambda q, k, v: attention_forward(q, k, v, nh, (cos, sin)),
         attention_backward, dict(q=randn(B, T, C), k=randn(B, T, C), v=randn(B, T, C)), {}),
        ("softmax", softmax_forward, softmax_backward, randn(B, T, T), {}),
        ("rope", lambda x: rope_forward(x, cos, sin), rope_backward, randn(B, nh, T, C // nh), {}),
        ("embedding", embedding_forward, embedding_backward, idx, dict(weight=randn(V, C))),
    ]
    log(f"{'layer input, or model tensor':44s} {'max rel. error':>14s}")
    rows = []

    def show(new_rows):
        for row in new_rows:
            log(str(row))
        rows.extend(new_rows)

    for name, forward, backward, x, params in layers:
        layer_rows = check_layer(forward, backward, x, tolerance=tolerance, **params)
        for row in layer_rows:
            row.name = f"{name}: d{row.name}" if row.raised is None else f"{name}: {row.name}"
        show(layer_rows)
    gpt2 = dict(norm="layernorm", pos="learned", mlp="gelu", bias=True, tie_weights=True)
    llama = dict(norm="rmsnorm", pos="rope", mlp="swiglu", bias=False, tie_weights=False)
    for block, switches in (("gpt2", gpt2), ("llama", llama)):
        show(check_model(block, switches, rng, tolerance))
    bad = [row for row in rows if row.verdict != "ok"]
    wrong = sum(row.verdict == "WRONG" for row in rows)
    errors = sum(row.verdict == "ERROR" for row in rows)
    first = f": first {bad[0].name}" if bad else ""
    log(f"{len(rows) - len(bad)} ok, {wrong} WRONG, {errors} ERROR{first}")
    return not bad


# --------------------------------------------------------------------------------------- workbook
# Each exercise's fields, and what each holds.
EXERCISE_FIELDS = {"title": str, "function": str, "change": str, "to": str, "rows": dict,
                   "models": dict, "why": str}


def exercises():
    """The workbook, workbook.json beside this file: each exercise names a function here, a line of
    it to change and how; its answer, the rows of --check that turn WRONG or ERROR, and why. A
    workbook that is missing, unreadable or not of that shape raises a ValueError of one line."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workbook.json")
    fix = "put back the workbook.json that came with gpt_numpy.py"
    try:
        if not os.path.isfile(path):
            raise OSError(0, "it is not a file" if os.path.exists(path) else "it is missing")
        size = os.path.getsize(path)
        if size == 0:
            raise OSError(0, "it is empty")
        # The workbook has a few thousand bytes: a far larger file is not it, and is not read.
        if size > 1_000_000:
            raise OSError(0, f"it has {size:,} bytes, where the workbook has a few thousand")
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read the workbook {path} ({e.strerror}): {fix}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read the workbook {path} (it is not UTF-8 text): {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"the workbook {path} is not valid JSON ({e.msg} at line {e.lineno}, "
                         f"column {e.colno}): {fix}") from None
    except RecursionError:
        raise ValueError(f"the workbook {path} is not the workbook (its lists or objects nest "
                         f"too deep to read): {fix}") from None
    problem = workbook_problem(found)
    if problem is not None:
        raise ValueError(f"the workbook {path} is broken ({problem}): {fix}")
    return found


def workbook_problem(found):
    """What is wrong with the shape of a workbook as JSON reads it, in a few words; None if
    nothing."""
    # Python's types by JSON's names for them.
    kinds = {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
             bool: "true or false", type(None): "null"}
    if not isinstance(found, list):
        return f"it holds {kinds[type(found)]}, not a list of exercises"
    if not found:
        return "it holds no exercises"
    for number, ex in enumerate(found, 1):
        if not isinstance(ex, dict):
            return f"exercise {number} is {kinds[type(ex)]}, not an object of fields"
        for field, kind in EXERCISE_FIELDS.items():
            if field not in ex:
                return f'exercise {number} has no "{field}"'
            if not isinstance(ex[field], kind):
                held = kinds[type(ex[field])]
                return f'exercise {number}\'s "{field}" is {held}, not {kinds[kind]}'
        for field in ("rows", "models"):
            for name, verdict in ex[field].items():
                if verdict not in ("WRONG", "ERROR"):
                    return (f'exercise {number}\'s "{field}" gives {name} the verdict '
                            f'{verdict!r}, not "WRONG" or "ERROR"')
    return None


def exercise_text(number, answer=False):
    """Exercise number (from 1) as a learner reads it: what to change and the question; or, with
    answer, which rows turn and why."""
    found = exercises()
    if not 1 <= number <= len(found):
        raise ValueError(f"there are exercises 1 to {len(found)}")
    ex = found[number - 1]
    if not answer:
        question = ("Predict, before you run it: which layer rows of python gpt_numpy.py --check "
                    "turn WRONG (or ERROR), and which of the two models, gpt2 and llama, get rows "
                    "that do? Then run the check on your copy.")
        return (f"Exercise {number} of {len(found)}: {ex['title']}\n\n"
                f"In your copy of gpt_numpy.py, in {ex['function']}, change the line\n"
                f"    {ex['change']}\nto\n    {ex['to']}\n\n{textwrap.fill(question, 96)}\n"
                f"The answer: python gpt_numpy.py --exercise {number} --answer")
    rows = ", ".join(f"{name} ({verdict})" for name, verdict in ex["rows"].items()) or "none"
    models = ", ".join(f"{name} ({verdict})" for name, verdict in ex["models"].items()) or "neither"
    why = textwrap.fill(f"Why: {ex['why']}.", 96)
    return (f"Exercise {number}: {ex['title']}\nLayer rows that turn: {rows}.\n"
            f"Models with rows that turn: {models}.\n{why}")


# --------------------------------------------------------------------------------------- the demo
class Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's message on one line, without the usage block above it.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def seconds_type(text):
    value = float(text)
    # Written so that NaN fails it too.
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be in (0, 1e6), got {text}")
    return value


def read_text(path, block_size):
    """The text at path, refused in one line unless it is UTF-8 and its last 10% holds one example
    of block_size."""
    try:
        # A folder; or a device or a pipe, which could be read forever.
        if not os.path.isfile(path):
            reason = "it is not a file" if os.path.exists(path) else "there is no such file"
            raise OSError(0, reason)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {path} ({reason}): give the path of a UTF-8 text "
                         f"file") from None
    if len(text) - int(0.9 * len(text)) <= block_size + 1:
        least = 10 * (block_size + 2) + 10
        raise ValueError(f"{path} has {len(text)} characters: its last 10%, held out for "
                         f"validation, must hold {block_size + 2}: give a text of {least} or more")
    return text


def main(argv=None):
    parser = Parser(description="The NumPy twin: check its gradients, or train a tiny GPT with "
                                "NumPy alone.")
    # No defaults here: None tells that --check or --exercise was given a training input.
    parser.add_argument("path", nargs="?", help="text to train on (default: input.txt)")
    parser.add_argument("--seconds", type=seconds_type, help="training time (default: 60)")
    parser.add_argument("--check", action="store_true",
                        help="instead: check every gradient by finite differences")
    parser.add_argument("--exercise", metavar="N",
                        help="instead: show exercise N of the workbook (break a line of a "
                             "backward, predict the rows of --check that turn), or list them: "
                             "--exercise list")
    parser.add_argument("--answer", action="store_true", help="with --exercise N: its answer")
    args = parser.parse_args(argv)
    if args.answer and args.exercise in (None, "list"):
        parser.error("--answer goes with --exercise N")
    if args.check and args.exercise is not None:
        parser.error("--check and --exercise are two modes: give one")
    mode = "--check" if args.check else "--exercise" if args.exercise is not None else None
    if mode is not None and (args.path is not None or args.seconds is not None):
        parser.error(f"{mode} trains nothing: a text and --seconds go with the training alone")
    if args.exercise is not None:
        try:
            found = exercises()
        except ValueError as e:
            sys.exit(f"error: {e}")
        if args.exercise == "list":
            for number, ex in enumerate(found, 1):
                print(f"{number:2d}. {ex['function']}: {ex['title']}")
            return
        try:
            number = int(args.exercise)
        except ValueError:
            number = 0
        if not 1 <= number <= len(found):
            sys.exit(f"error: --exercise takes a number from 1 to {len(found)}, or list; not "
                     f"{args.exercise!r}")
        print(exercise_text(number, args.answer))
        return
    # A character stdout cannot encode prints as an escape, not an error.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    if args.check:
        sys.exit(0 if check() else 1)
    path = "input.txt" if args.path is None else args.path
    seconds = 60 if args.seconds is None else args.seconds
    B, T = 16, 64
    try:
        text = read_text(path, T)
        chars = sorted(set(text))
        stoi = {ch: i for i, ch in enumerate(chars)}
        # Straight into the array: a list of the ids first would take twice the memory.
        data = np.fromiter(map(stoi.__getitem__, text), dtype=np.int64, count=len(text))
    except ValueError as e:
        sys.exit(f"error: {e}")
    except MemoryError:
        sys.exit(f"error: out of memory reading {path}: give a smaller text (a few MB is "
                 f"more than a minute's training reads)")
    n = int(0.9 * len(data))
    config = GPTConfig(vocab_size=len(chars), block_size=T, n_layer=2, n_head=4, n_embd=64)
    model = GPT(config, init_params(config))
    optimizer = AdamW(model.params, lr=3e-3, weight_decay=0.1)
    rng = np.random.default_rng(0)
    prompt = np.array([[stoi["\n" if "\n" in stoi else chars[0]]]])

    def decode(ids):
        return "".join(chars[i] for i in ids)

    def batch(split):
        ix = rng.integers(len(split) - T, size=B)
        xy = np.stack([split[i:i + T + 1] for i in ix])  # (B, T + 1)
        return xy[:, :-1], xy[:, 1:]

    n_params = sum(w.size for w in model.params.values())
    print(f"training a {n_params:,}-parameter GPT ({config.n_layer} layers, {config.n_embd} wide, "
          f"context {T}) on {path} with NumPy alone, for {seconds:g} s")
    print("untrained, it writes: " + repr(decode(model.generate(prompt, 60, generator=rng)[0, 1:])))
    t0 = time.time()
    step = 0
    last_report = 0.0
    try:
        # One step at least.
        while step == 0 or time.time() - t0 < seconds:
            _, loss = model.forward(*batch(data[:n]))
            optimizer.step(model.backward())
            if step == 0:
                print(f"step 0: loss {loss:.3f} (a model that knows nothing scores "
                      f"ln({len(chars)}) = {math.log(len(chars)):.3f})", flush=True)
            step += 1
            elapsed = time.time() - t0
            if elapsed - last_report >= max(seconds / 10, 1):
                ms = elapsed / step * 1000
                print(f"{elapsed:.0f} s: step {step}, loss {loss:.3f}, {ms:.0f} ms/step",
                      flush=True)
                last_report = elapsed
    # Ctrl-C ends the training early; what the model has learned is still shown.
    except KeyboardInterrupt:
        print("Ctrl-C: training stopped (a second one quits)")
    ms_per_step = (time.time() - t0) / max(step, 1) * 1000
    val = np.mean([model.forward(*batch(data[n:]))[1] for _ in range(20)])
    print(f"after {step} steps at {ms_per_step:.0f} ms/step: val loss {val:.3f}\nsample:")
    print(decode(model.generate(prompt, 300, temperature=0.8, generator=rng)[0, 1:]))


def quiet_stdout():
    """Points stdout at /dev/null, so that the flush at exit does not fail a second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    try:
        main()
    # The reader went away (python gpt_numpy.py --check | head): end quietly, as cat does.
    except BrokenPipeError:
        quiet_stdout()
        sys.exit(141)
    # The output cannot be written (a full disk): one line, not a traceback.
    except OSError as e:
        quiet_stdout()
        sys.exit(f"error: cannot write the output ({e.strerror or e})")
    # Ctrl-C outside the training (or a second one): quit without a traceback.
    except KeyboardInterrupt:
        print()
        sys.exit(130)
