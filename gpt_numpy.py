"""gpt.py's model in NumPy alone, with every gradient written out by hand: a GPT to learn backprop
from. Read it top to bottom, in the order it is learned:
  1. How a backward is checked: a fake loss and finite differences, with NumPy alone.
  2. The layers, each a *_forward and a *_backward, from the plainest (linear, with the matmul
     rule every product follows) to attention. Above each backward, the maths it follows, with
     the shape of every gradient.
  3. GPT.forward, the model as gpt.py has it, one *_forward call per layer; then GPT.backward, the
     same calls in reverse, one *_backward per layer.
Shapes are named as in gpt.py: B sequences of T tokens, C = n_embd channels, nh = n_head heads of
hs = C / nh channels each, hidden the MLP's width; V is vocab_size.

Two rules do most of the work, and the comments cite them by number:
  Rule 1. A value used twice gets the sum of its gradients: the residual stream, the tied
          embedding, the normed input that c_q, c_k and c_v all map, x in x * x, a table's row
          read at several positions.
  Rule 2. A broadcast in the forward is a sum in the backward, over the axes it was repeated along:
          a bias added at every position, a norm's gain, the position embedding added to every
          sequence.

One calling convention for every layer:
    out, saved = name_forward(x, weight=w, bias=b)  # the layer's parameters as keywords
    dx, dparams = name_backward(dout, saved)        # dparams: {"weight": dw, "bias": db}
  dout is dL/d(out): the gradient of the loss with respect to the layer's output, in out's shape.
  dx has x's shape (None where x is integers: the embedding's indices), each dparams entry its
  parameter's. A layer of several inputs takes them in order, and its dx is a tuple of their
  gradients in the same order: attention's (dq, dk, dv), SwiGLU's (dgate, dup); the loss takes
  integer targets beside the logits, so its dx is dlogits alone. saved holds exactly what the
  backward needs from the forward. The parameters are named as gpt.py names them (wte,
  wpe, h.0.attn.c_q.weight, ...), so that gpt.GPT's weights, GPT-2's too, run here as they are.

The command lines (workbook.py, beside this file, holds them and everything that is not the lesson):
    python gpt_numpy.py --check [NAME]         # every backward, or one layer's (NAME as the table
                                               # prints it), against finite differences
    python gpt_numpy.py --exercise list        # the workbook: write a backward, or break one
    python gpt_numpy.py [PATH] [--seconds N]   # trains a tiny GPT on PATH (input.txt), then samples
"""
import collections
import math
import sys
from dataclasses import dataclass

import numpy as np


# gpt.GPTConfig's fields and defaults (a test holds them equal): either class works here.
@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = False
    # or "layernorm"
    norm: str = "rmsnorm"
    # or "learned"
    pos: str = "rope"
    # or "gelu"
    mlp: str = "swiglu"
    # rows of the token pairs' table; 0, none
    bigram: int = 8192


# ------------------------------------------------------------------------ how a backward is checked
# A layer maps its input x to out, and the loss depends on out in some way the layer cannot know.
# Any way will do for a check. Draw a fixed random array dout of out's shape, and take the
# "fake loss" L = sum(out * dout): its gradient at out is exactly dout, so backward(dout, saved)
# must give dL/dx. And L is a number we can compute for any x: nudge one entry of x by +h, then by
# -h, and (L(x + h) - L(x - h)) / 2h is dL/dx at that entry, to within about h^2: the
# "central finite differences". The two must agree at every entry of every input and parameter.
# In float64, with h = 1e-6, a right gradient agrees to about 1e-9 of its size; a wrong one is
# off by far more.
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


def rel_error(ours, reference, scale=None):
    """The largest entry's error, relative to the gradient's scale: max|ours - reference| /
    scale, scale by default the larger of max|ours| and max|reference|. inf where either holds a
    NaN or an inf: such a gradient is never right."""
    ours = np.asarray(ours, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if not (np.isfinite(ours).all() and np.isfinite(reference).all()):
        return math.inf
    if scale is None:
        scale = max(np.abs(ours).max(), np.abs(reference).max())
    return float(np.abs(ours - reference).max() / scale) if scale > 0 else 0.0


def layer_gradients(forward, backward, inputs, params, seed=0):
    """[(name, backward's gradient, finite differences')] for each of the inputs, {name: array} in
    the order forward takes them, and each of the params, with the fake loss sum(out * dout). For
    a backward of your own, x ** 3 say: forward(x) returns (x ** 3, x) and backward(dout, x)
    returns (dout * 3 * x ** 2, {}); rel_error tells how far each pair of one shape is apart."""

    def run_forward():
        # Fresh copies at every call: a layer that writes into its arrays in place cannot move what
        # the differences measure, nor dout.
        copies = {key: np.copy(value) for key, value in params.items()}
        return forward(*[np.copy(value) for value in inputs.values()], **copies)

    out, saved = run_forward()
    dout = np.random.default_rng(seed).standard_normal(np.shape(out))
    returned = backward(np.copy(dout), saved)
    if not (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], dict)):
        raise ValueError(f"a backward returns a pair, (dx, {{parameter's name: its gradient}}), "
                         f"not a {type(returned).__name__}")
    dx, dparams = returned
    # One input's dx on its own; several inputs' as a tuple.
    dxs = list(dx) if len(inputs) > 1 else [dx]
    if len(dxs) != len(inputs):
        raise ValueError(f"the backward gave {len(dxs)} input gradients for {len(inputs)} inputs")

    def loss():
        return float(np.sum(run_forward()[0] * dout))

    # None for an input without a gradient: the embedding's integer indices. Any other None is
    # a row of its own that says so.
    pairs = [(name, value, grad) for (name, value), grad in zip(inputs.items(), dxs)
             if grad is not None or np.asarray(value).dtype.kind == "f"]
    # A parameter's gradient the backward did not give is None: the check says so on its row.
    pairs += [(key, params[key], dparams.get(key)) for key in params]
    found = []
    for name, value, grad in pairs:
        numeric = numerical_gradient(loss, value, list(np.ndindex(value.shape)))
        found.append((name, grad, numeric.reshape(value.shape)))
    return found


# ------------------------------------------------------------------------------------------ layers
def linear_forward(x, weight, bias=None):
    x2 = x.reshape(-1, x.shape[-1])  # (B*T, in)
    out = (x2 @ weight.T).reshape(*x.shape[:-1], weight.shape[0])  # (B, T, out)
    if bias is not None:
        out = out + bias
    return out, (x, weight, bias is not None)


# The matmul rule, which every matmul's backward below follows. For Y = P Q, Y_ik = sum_j P_ij Q_jk:
# each P_ij reaches every Y_ik of its row i, through Q_jk, so
#   dP_ij = sum_k dY_ik Q_jk,  that is  dP = dY Q^T
#   dQ_jk = sum_i P_ij dY_ik,  that is  dQ = P^T dY
# out = x W^T + b at every position. Flattened to N = B*T rows, it is one matmul, X (N, in) times
# W^T (in, out). With P = X and Q = W^T:
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


def embedding_forward(idx, weight):
    # One row of the table per index.
    return weight[idx], (idx, weight.shape)  # (B, T, C)


# out[i] = weight[idx[i]]: each output row is a copy of one table row, so dweight[r] is the sum
# of dout[i] over every i with idx[i] = r (rule 1: a row used twice gets both gradients).
# np.add.at adds for each repeated index, where dweight[idx] += dout would keep only one. The
# indices are integers: they have no gradient.
def embedding_backward(dout, saved):
    idx, shape = saved
    dweight = np.zeros(shape, dtype=dout.dtype)  # (rows, C): wte's, wpe's or the bigram table's
    np.add.at(dweight, idx, dout)
    return None, {"weight": dweight}


def crossentropy_forward(logits, targets):
    m = logits.max(-1, keepdims=True)
    # log-sum-exp, less the max: stable for large logits.
    logz = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))  # (B, T, 1)
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)  # (B, T, 1)
    # -log p(target) at each position, then its mean over the B*T positions.
    nll = logz - picked  # (B, T, 1)
    loss = nll.mean()
    return loss, (np.exp(logits - logz), targets)


# The forward in reverse, one gradient a line, with p = softmax(logits) = e^(logits - logz):
#   loss = mean of nll over N = B*T:  dnll = dloss / N at each position (a sum forward, a
#                                     broadcast back)
#   nll = logz - picked:              (dlogz, dpicked) = (dnll, -dnll)
#   logz = log sum_j e^logits_j:      d logz / d logits_j = e^logits_j / e^logz = p_j, so every
#                                     logit gets p dlogz (the max, taken out and added back in
#                                     the forward, cancels: it passes no gradient)
#   picked = logits[target]:          the target's logit gets dpicked too (rule 1: it is in both)
# In all, dlogits = (p - onehot(target)) dloss / N.
def crossentropy_backward(dloss, saved):
    probs, targets = saved
    dnll = np.full((*targets.shape, 1), dloss / targets.size, dtype=probs.dtype)  # (B, T, 1)
    dlogz = dnll  # (B, T, 1)
    dpicked = -dnll  # (B, T, 1)
    onehot = np.eye(probs.shape[-1], dtype=probs.dtype)[targets]  # (B, T, vocab_size)
    dlogits = probs * dlogz + onehot * dpicked  # (B, T, vocab_size)
    return dlogits, {}


GELU_K = math.sqrt(2 / math.pi)


def gelu_forward(x):
    t = np.tanh(GELU_K * (x + 0.044715 * x * x * x))  # (B, T, hidden)
    return 0.5 * x * (1 + t), (x, t)


# gelu(x), in the tanh form gpt.py uses, = x/2 (1 + t) with t = tanh(u) and u = k (x + 0.044715
# x^3). The chain rule through t, with tanh'(u) = 1 - tanh(u)^2 = 1 - t^2:
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
# xhat_i reads x_j directly in its own channel alone, and every x_j through mean and var. The gain
# and the bias, each summed over the positions (rule 2):
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
    # The three paths summed: (B, T, C)
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


# Rotary positions (RoPE) tell attention where each token is by turning its query and key, not by
# adding a vector. A head's hs channels go in hs/2 pairs, each pair a point in a plane, and a token
# at position t turns pair j by the angle a = t f_j, where f_j = 10000^(-2j/hs) runs from 1 (fast,
# for near tokens) down to about 1/10000 (slow, for far ones). Turning q at t and k at s, the dot
# product of a pair depends on the angle between them, (t - s) f_j, alone: the scores see how far
# apart two tokens are, not where they stand.
# Channel j pairs with j + hs/2: any pairing would do, as long as queries and keys share it; this
# one, gpt.py's and Hugging Face's Llama's, takes each pair from the two halves of the head, with
# two slices.
def rope_tables(config, dtype):
    hs = config.n_embd // config.n_head
    inv_freq = 10000.0 ** (-np.arange(0, hs, 2) / hs)
    angles = np.outer(np.arange(config.block_size), inv_freq)  # (block_size, hs / 2)
    # Channel j and channel j + hs/2 turn by the same angle.
    angles = np.concatenate([angles, angles], axis=-1)  # (block_size, hs)
    # Rounded to float32 first, as gpt.py's tables are: both models turn by the same angles.
    cos = np.cos(angles).astype(np.float32).astype(dtype)
    sin = np.sin(angles).astype(np.float32).astype(dtype)
    return cos, sin


# A point (x1, x2) turned by a is (x1 cos a - x2 sin a, x2 cos a + x1 sin a)
#   = (x1, x2) cos a + (-x2, x1) sin a,
# and (-x2, x1) is the point turned by a right angle. With x1, x2 the two halves of every head,
# [-x2, x1] turns every pair a right angle at once, and x cos + [-x2, x1] sin turns each by its a.
def rope_forward(x, cos, sin):
    x1, x2 = np.split(x, 2, axis=-1)  # (B, nh, T, hs / 2) each
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


# Backward from the output, each line the matmul rule (dP = dY Q^T, dQ = P^T dY for Y = P Q) or a
# layer's backward:
#   y's heads were put side by side: dout is split into heads again first
#   y = att v:              datt = dy v^T,   dv = att^T dy
#   att = softmax(scores):  dscores = softmax_backward(datt)
#   the mask:               the scores above the diagonal were set to -inf, a constant, so no
#                           gradient may pass there; att is 0 there, and softmax_backward
#                           gives 0 where its output is 0, on its own
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
        dq = rope_backward(dq, rope)[0]  # (B, nh, T, hs)
        dk = rope_backward(dk, rope)[0]  # (B, nh, T, hs)
    dq = dq.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, C)
    dk = dk.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, C)
    dv = dv.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, C)
    return (dq, dk, dv), {}


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
        # Every layer's saved values, keyed by the layer's name (gpt.py's, where it has weights).
        saved = {}
        x, saved["wte"] = embedding_forward(idx, **self.params_of("wte"))  # (B, T, C)
        if cfg.pos == "learned":
            # (T, C): the same rows are added to every sequence, a broadcast over B.
            pos_emb, saved["wpe"] = embedding_forward(np.arange(T), **self.params_of("wpe"))
            x = x + pos_emb
        if cfg.bigram:
            # The bigram table: a second embedding, read by the pair (token before, token) rather
            # than by the token alone, so that each position starts out knowing what came just
            # before it. Pair (a, b) reads row (a V + b) modulo the table's size (pairs share a
            # row when there are more pairs than rows); a window's first token pairs with -1.
            # Its backward is the embedding's: the rows read get the gradient at x (rule 1).
            before = np.pad(idx, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]  # (B, T)
            # In int64, as in gpt.py: a pair's number may pass 2 ** 31.
            pairs = before.astype(np.int64) * cfg.vocab_size + idx  # (B, T)
            rows, saved["bigram"] = embedding_forward(
                pairs % cfg.bigram, **self.params_of("bigram"))  # (B, T, C)
            x = x + rows
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

    # The backward is the forward's calls in reverse, from dL/dL = 1 at the loss: each layer's
    # backward takes the gradient at its output, hands back the one at its input, and adds its
    # parameters' gradients into grads. Three places take more than one call (rule 1 each time):
    #   x = x + f(x):      the residual hands dx down unchanged, plus f's gradient at its input;
    #   maps of the same h (c_q, c_k, c_v; c_gate, c_fc): h's gradient is the sum of theirs;
    #   the tied head:     lm_head and wte are one matrix, and both add into its gradient.
    # With learned positions, the same rows were added to every sequence: a sum over B (rule 2).
    def backward(self, activations=False):
        """The gradient of the last forward's loss for every parameter, named as params. With
        activations=True, also douts, {layer: dL/d(its output)}, keyed like the forward's saved
        values, to compare a whole chain with a reference's, layer by layer."""
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
            dx = dx + back(block + "ln_2", norm, dh)  # (B, T, C)
            dh = back(block + "attn.c_proj", linear_backward, dx)  # (B, T, C)
            dq, dk, dv = back(block + "attn", attention_backward, dh)  # (B, T, C) each
            # q, k and v were three maps of the same h: as at the residual stream, a value used by
            # several paths gets the sum of their gradients (rule 1).
            dh = back(block + "attn.c_v", linear_backward, dv)  # (B, T, C)
            dh = dh + back(block + "attn.c_k", linear_backward, dk)  # (B, T, C)
            dh = dh + back(block + "attn.c_q", linear_backward, dq)  # (B, T, C)
            dx = dx + back(block + "ln_1", norm, dh)  # (B, T, C)
        if cfg.bigram:
            # x = wte (+ wpe) + rows: an addition hands dx to each, here to the rows of the pairs.
            back("bigram", embedding_backward, dx)
        if cfg.pos == "learned":
            # The same rows were added to every sequence (rule 2).
            back("wpe", embedding_backward, dx.sum(0))
        # Tied, this adds to the head's gradient of the same matrix (rule 1).
        back("wte", embedding_backward, dx)
        return (grads, douts) if activations else grads


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
    if config.bigram:
        # From zero, as in gpt.py: it adds nothing until it learns what pairs tell.
        p["bigram.weight"] = np.zeros((config.bigram, C), dtype)

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


if __name__ == "__main__":
    # The command lines live beside the lesson, in workbook.py: they check, teach and train the
    # module run here (this file, or a learner's copy of it).
    try:
        import workbook
    except ModuleNotFoundError as e:
        if e.name not in ("workbook", "gpt_numpy"):
            raise
        sys.exit(f"error: the command lines need workbook.py and gpt_numpy.py beside this file "
                 f"({e.name}.py is not): copy them, and workbook.json, into its folder")
    workbook.run(sys.modules[__name__])
