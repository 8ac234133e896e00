"""gpt.py's model in NumPy alone, with the backward pass written out by hand.

Every layer is a pair: `*_forward(...) -> (out, cache)` keeps exactly what the backward needs, and
`*_backward(dout, cache)` returns the gradient of the loss with respect to each input, parameters included.
Above each backward, the maths it follows. GPT.backward is GPT.forward read in reverse.
test_gpt.py checks every gradient against PyTorch's autograd to 1e-10.

    python gpt_numpy.py   # trains a tiny GPT on input.txt for a minute, with no framework at all
"""
import math
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
def embedding_forward(idx, w):
    return w[idx], (idx, w.shape)  # (..., C)


# out[i] = w[idx[i]]  =>  dw[r] = sum of dout[i] over every i with idx[i] = r.
# A token that appears twice gets both rows added: np.add.at accumulates, where dw[idx] += dout would keep one.
def embedding_backward(dout, cache):
    idx, shape = cache
    dw = np.zeros(shape, dtype=dout.dtype)
    np.add.at(dw, idx, dout)
    return dw


def linear_forward(x, w, b=None):
    # As one (B*T, in) @ (in, out) product: NumPy would run a (B, T, in) one as B small ones, many times slower.
    out = (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])  # (..., out)
    return (out if b is None else out + b), (x, w, b is not None)


# out = x w^T + b  =>  dx = dout w,  dw = dout^T x (summed over every row of the batch),  db = sum of dout's rows.
def linear_backward(dout, cache):
    x, w, has_bias = cache
    dout2 = dout.reshape(-1, dout.shape[-1])  # (B*T, out)
    dx = (dout2 @ w).reshape(x.shape)
    dw = dout2.T @ x.reshape(-1, x.shape[-1])
    return dx, dw, dout2.sum(0) if has_bias else None


def layernorm_forward(x, w, b=None, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd  # (B, T, C), zero mean and unit variance over C
    out = xhat * w
    return (out if b is None else out + b), (xhat, rstd, w, b is not None)


# xhat = (x - mu) r with r = (var + eps)^-1/2;  g = dout * w is the gradient at xhat. Through x, mu and r:
#   dx = r (g - mean(g) - xhat mean(g xhat))
# the first term is the direct path, the second comes through mu, the third through var (d var/dx = 2 (x - mu) / C).
def layernorm_backward(dout, cache):
    xhat, rstd, w, has_bias = cache
    g = dout * w
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    sum_bt = tuple(range(dout.ndim - 1))
    return dx, (dout * xhat).sum(sum_bt), dout.sum(sum_bt) if has_bias else None


def rmsnorm_forward(x, w, eps=1e-5):
    rstd = 1 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    xhat = x * rstd  # (B, T, C), unit root-mean-square over C
    return xhat * w, (xhat, rstd, w)


# LayerNorm without the mean: xhat = x r with r = (mean(x^2) + eps)^-1/2, g = dout * w.
#   dx = r (g - xhat mean(g xhat))
def rmsnorm_backward(dout, cache):
    xhat, rstd, w = cache
    g = dout * w
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dout * xhat).sum(tuple(range(dout.ndim - 1))), None  # no bias


GELU_K = math.sqrt(2 / math.pi)


def gelu_forward(x):
    t = np.tanh(GELU_K * (x + 0.044715 * x * x * x))  # x * x * x: NumPy's x ** 3 is far slower
    return 0.5 * x * (1 + t), (x, t)


# gelu(x) = x/2 (1 + t),  t = tanh(u),  u = k (x + 0.044715 x^3)
#   d gelu/dx = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 * 0.044715 x^2)
def gelu_backward(dout, cache):
    x, t = cache
    return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * GELU_K * (1 + 3 * 0.044715 * x ** 2))


def sigmoid(x):
    return 0.5 * (1 + np.tanh(0.5 * x))  # the same as 1 / (1 + e^-x), without overflow for large -x


def swiglu_forward(h):
    gate, up = np.split(h, 2, axis=-1)  # (B, T, hidden) each
    s = sigmoid(gate)
    return gate * s * up, (gate, up, s)


# out = silu(a) b with silu(a) = a s(a) and s' = s (1 - s):
#   da = dout b (s + a s (1 - s)),   db = dout silu(a)
def swiglu_backward(dout, cache):
    gate, up, s = cache
    return np.concatenate([dout * up * (s + gate * s * (1 - s)), dout * gate * s], axis=-1)


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


# Each channel pair (x1, x2) is rotated by its angle a: out = R(a) x. A rotation's transpose is its inverse,
# so dx = R(a)^T dout = R(-a) dout: the backward is the forward with sin negated.
def rope_backward(dout, cache):
    cos, sin = cache
    return rope_forward(dout, cos, -sin)[0]


def softmax_forward(x):
    e = np.exp(x - x.max(-1, keepdims=True))  # shifting by the max changes nothing but keeps exp from overflowing
    p = e / e.sum(-1, keepdims=True)
    return p, p


# p_i = e^x_i / sum_j e^x_j  =>  dp_i/dx_j = p_i (delta_ij - p_j), so
#   dx_j = sum_i g_i p_i (delta_ij - p_j) = p_j (g_j - sum_i g_i p_i)
def softmax_backward(dout, p):
    return p * (dout - (dout * p).sum(-1, keepdims=True))


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


# y = A v,  A = softmax(S),  S = q k^T scale:   dv = A^T dy,  dA = dy v^T,  dS = softmax_backward(dA),
#   dq = dS k scale,  dk = dS^T q scale.  Masked scores have A = 0, so dS is 0 there too.
def attention_backward(dout, cache):
    q, k, v, att_cache, scale, rope = cache
    B, nh, T, hs = q.shape
    dy = dout.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    dv = att_cache.transpose(0, 1, 3, 2) @ dy
    dscores = softmax_backward(dy @ v.transpose(0, 1, 3, 2), att_cache) * scale
    dq, dk = dscores @ k, dscores.transpose(0, 1, 3, 2) @ q
    if rope is not None:
        dq, dk = rope_backward(dq, rope), rope_backward(dk, rope)
    return np.concatenate([t.transpose(0, 2, 1, 3).reshape(B, T, nh * hs) for t in (dq, dk, dv)], axis=-1)


def crossentropy_forward(logits, targets):
    m = logits.max(-1, keepdims=True)
    logz = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))  # log-sum-exp, stable for large logits
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)
    loss = (logz - picked).mean()  # mean over B*T of -log p(target)
    return loss, (np.exp(logits - logz), targets)


# loss = mean over the N = B*T positions of (logz - x_target), and d logz/dx = softmax(x) = p:
#   dx = (p - onehot(target)) / N
def crossentropy_backward(dloss, cache):
    probs, targets = cache
    onehot = np.eye(probs.shape[-1], dtype=probs.dtype)[targets]  # (B, T, vocab_size)
    return (probs - onehot) * (dloss / targets.size)


# ---------------------------------------------------------------------------------------------------- model
class GPT:
    """gpt.GPT's forward and backward on a dict of arrays named as gpt.GPT's named_parameters() names them."""

    def __init__(self, config, params):
        if config.dropout > 0:
            raise ValueError("the NumPy twin is deterministic and has no dropout: use a config with dropout=0")
        self.config, self.params = config, params
        self.head = "tok_emb.weight" if config.tie_weights else "lm_head.weight"
        dtype = params["tok_emb.weight"].dtype
        self.rope = rope_tables(config, dtype) if config.pos == "rope" else None
        self.cache = None

    def _norm_forward(self, x, name):
        w, b = self.params[name + ".weight"], self.params.get(name + ".bias")
        return rmsnorm_forward(x, w) if self.config.norm == "rmsnorm" else layernorm_forward(x, w, b)

    def _norm_backward(self, dout, cache, name, grads):
        dx, dw, db = (rmsnorm_backward if self.config.norm == "rmsnorm" else layernorm_backward)(dout, cache)
        self._accumulate(grads, name, dw, db)
        return dx

    def _linear_forward(self, x, name):
        return linear_forward(x, self.params[name + ".weight"], self.params.get(name + ".bias"))

    def _linear_backward(self, dout, cache, name, grads):
        dx, dw, db = linear_backward(dout, cache)
        self._accumulate(grads, name, dw, db)
        return dx

    @staticmethod
    def _accumulate(grads, name, dw, db):
        grads[name + ".weight"] += dw
        if db is not None:
            grads[name + ".bias"] += db

    def forward(self, idx, targets=None):
        cfg, p = self.config, self.params
        B, T = idx.shape
        if T > cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size ({cfg.block_size})")
        rope = None if self.rope is None else (self.rope[0][:T], self.rope[1][:T])
        c = {}  # every cache, by name, for backward
        x, c["tok"] = embedding_forward(idx, p["tok_emb.weight"])  # (B, T, C)
        if cfg.pos == "learned":
            pos, c["pos"] = embedding_forward(np.arange(T), p["pos_emb.weight"])  # (T, C)
            x = x + pos
        for l in range(cfg.n_layer):
            b = f"blocks.{l}."
            h, c[b + "ln_1"] = self._norm_forward(x, b + "ln_1")
            h, c[b + "c_attn"] = self._linear_forward(h, b + "attn.c_attn")  # (B, T, 3C)
            h, c[b + "attn"] = attention_forward(h, cfg.n_head, rope)  # (B, T, C)
            h, c[b + "attn.c_proj"] = self._linear_forward(h, b + "attn.c_proj")
            x = x + h
            h, c[b + "ln_2"] = self._norm_forward(x, b + "ln_2")
            h, c[b + "c_fc"] = self._linear_forward(h, b + "mlp.c_fc")  # (B, T, hidden or 2 hidden)
            h, c[b + "act"] = swiglu_forward(h) if cfg.mlp == "swiglu" else gelu_forward(h)  # (B, T, hidden)
            h, c[b + "mlp.c_proj"] = self._linear_forward(h, b + "mlp.c_proj")
            x = x + h
        h, c["ln_f"] = self._norm_forward(x, "ln_f")
        logits, c["head"] = linear_forward(h, p[self.head])  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss, c["loss"] = crossentropy_forward(logits, targets)
        self.cache = c if targets is not None else None
        return logits, loss

    def backward(self):
        if self.cache is None:
            raise RuntimeError("backward() needs a forward(idx, targets) with targets just before it")
        cfg, c = self.config, self.cache
        grads = {name: np.zeros_like(w) for name, w in self.params.items()}
        dlogits = crossentropy_backward(1.0, c["loss"])
        dh, dw, _ = linear_backward(dlogits, c["head"])
        grads[self.head] += dw  # tied: the embedding's own gradient is added to this one below
        dx = self._norm_backward(dh, c["ln_f"], "ln_f", grads)
        for l in reversed(range(cfg.n_layer)):
            b = f"blocks.{l}."
            # x = x + f(x): the residual passes dx through unchanged, and f's gradient is added to it
            dh = self._linear_backward(dx, c[b + "mlp.c_proj"], b + "mlp.c_proj", grads)
            dh = swiglu_backward(dh, c[b + "act"]) if cfg.mlp == "swiglu" else gelu_backward(dh, c[b + "act"])
            dh = self._linear_backward(dh, c[b + "c_fc"], b + "mlp.c_fc", grads)
            dx = dx + self._norm_backward(dh, c[b + "ln_2"], b + "ln_2", grads)
            dh = self._linear_backward(dx, c[b + "attn.c_proj"], b + "attn.c_proj", grads)
            dh = attention_backward(dh, c[b + "attn"])
            dh = self._linear_backward(dh, c[b + "c_attn"], b + "attn.c_attn", grads)
            dx = dx + self._norm_backward(dh, c[b + "ln_1"], b + "ln_1", grads)
        if cfg.pos == "learned":
            grads["pos_emb.weight"] += embedding_backward(dx.sum(0), c["pos"])  # every sequence uses the same rows
        grads["tok_emb.weight"] += embedding_backward(dx, c["tok"])
        return grads

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, rng=None):
        """Extends idx (B, T) by max_new_tokens tokens, each from a full forward over the last block_size."""
        rng = rng or np.random.default_rng()
        for _ in range(max_new_tokens):
            logits = self.forward(idx[:, -self.config.block_size:])[0][:, -1, :].astype(np.float64)
            if temperature == 0:
                next_id = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1]), None]
                    logits = np.where(logits < kth, -np.inf, logits)
                probs = softmax_forward(logits)[0]
                next_id = np.array([rng.choice(len(row), p=row) for row in probs])
            idx = np.concatenate([idx, next_id[:, None]], axis=1)
        return idx


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

    for l in range(config.n_layer):
        b = f"blocks.{l}."
        norm(b + "ln_1")
        linear(b + "attn.c_attn", 3 * C, C)
        linear(b + "attn.c_proj", C, C, std=proj_std)
        norm(b + "ln_2")
        linear(b + "mlp.c_fc", 2 * hidden if config.mlp == "swiglu" else hidden, C)
        linear(b + "mlp.c_proj", C, hidden, std=proj_std)
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


def main(path="input.txt", seconds=60):
    """Trains a tiny GPT on a text with NumPy alone for about `seconds`, then samples from it."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = np.array([stoi[ch] for ch in text], dtype=np.int64)
    n = int(0.9 * len(data))
    config = GPTConfig(vocab_size=len(chars), block_size=64, n_layer=2, n_head=4, n_embd=64, bias=False)
    model = GPT(config, init_params(config))
    optimizer = AdamW(model.params, lr=3e-3, weight_decay=0.1)
    rng = np.random.default_rng(0)
    B, T = 16, config.block_size

    def batch(split):
        ix = rng.integers(len(split) - T, size=B)
        xy = np.stack([split[i:i + T + 1] for i in ix])
        return xy[:, :-1], xy[:, 1:]

    print(f"training a {sum(w.size for w in model.params.values()):,}-parameter GPT with NumPy for {seconds} s; "
          f"a model that knows nothing scores ln({len(chars)}) = {math.log(len(chars)):.2f}")
    t0, step = time.time(), 0
    while time.time() - t0 < seconds:
        _, loss = model.forward(*batch(data[:n]))
        optimizer.step(model.backward())
        step += 1
        if step % 250 == 0:
            print(f"step {step}: loss {loss:.3f} ({(time.time() - t0) / step * 1000:.0f} ms/step)", flush=True)
    val = np.mean([model.forward(*batch(data[n:]))[1] for _ in range(20)])
    print(f"val loss after {step} steps: {val:.3f}\nsample:")
    out = model.generate(np.array([[stoi["\n"]]]), 300, temperature=0.8, rng=rng)
    print("".join(chars[i] for i in out[0, 1:]))


if __name__ == "__main__":
    main(*sys.argv[1:2])
