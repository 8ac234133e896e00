"""A GPT in one file of PyTorch: a character tokenizer, a config with switches, the model, sampling
through a KV cache, Muon, one training loop, checkpoints, device choice. Imports only torch."""
import contextlib
import math
import numbers
import os
import time
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


class CharTokenizer:
    """One token per character seen. Any tokenizer with encode, decode and vocab_size fits."""

    def __init__(self, chars):
        self.chars = "".join(sorted(set(chars)))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text):
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# The most steps, seconds or batches any run takes: a bound that refuses a slip like 1e400.
MANY = 10 ** 9


def option(default, min=None, max=None, choices=None, help=""):
    """A config field with its rule: a number in [min, max] (bounds included), or a str among
    choices; help is what train.py --help says of it."""
    return field(default=default, metadata=dict(min=min, max=max, choices=choices, help=help))


def check_option(f, value):
    """value in the type of field f's default, if it meets f's rule; else a ValueError."""
    kind = type(f.default)
    # A NumPy number is a number too. A bool is an int to Python, but never a count or a rate.
    accepted = {int: numbers.Integral, float: numbers.Real}.get(kind, kind)
    if not isinstance(value, accepted) or isinstance(value, bool) != (kind is bool):
        raise ValueError(f"{f.name} must be of type {kind.__name__}, not {value!r}")
    rule = f.metadata
    if rule["choices"] and value not in rule["choices"]:
        raise ValueError(f"{f.name} must be one of {', '.join(rule['choices'])}, not {value!r}")
    # A number option has both bounds. NaN fails every comparison, so it fails the rule too.
    if rule["min"] is not None and not rule["min"] <= value <= rule["max"]:
        raise ValueError(f"{f.name} must be in [{rule['min']}, {rule['max']}], not {value!r}")
    return kind(value)


@dataclass(frozen=True)
class GPTConfig:
    """The model's options: Llama's block and a bigram table by default; GPT-2's block is
    norm="layernorm", pos="learned", mlp="gelu", bias=True, tie_weights=True, bigram=0."""
    vocab_size: int = option(65, min=1, max=2 ** 20, help="Tokens in the vocabulary.")
    block_size: int = option(256, min=1, max=2 ** 20, help="The most tokens read at once.")
    n_layer: int = option(3, min=1, max=1024, help="Transformer blocks.")
    n_head: int = option(4, min=1, max=1024, help="Attention heads.")
    n_embd: int = option(128, min=1, max=2 ** 16, help="Width of the residual stream.")
    dropout: float = option(0.0, min=0, max=0.99, help="Dropout probability.")
    bias: bool = option(False, help="Biases in the linear layers and LayerNorm.")
    tie_weights: bool = option(False, help="Share the token embedding with the output layer.")
    norm: str = option("rmsnorm", choices=("rmsnorm", "layernorm"), help="RMSNorm or LayerNorm.")
    pos: str = option("rope", choices=("rope", "learned"), help="Rotary or learned positions.")
    mlp: str = option("swiglu", choices=("swiglu", "gelu"), help="SwiGLU or GELU's MLP.")
    bigram: int = option(8192, min=0, max=2 ** 24, help="Rows of the token pairs' table (0: none).")

    def __post_init__(self):
        # Each option made by option() (a copier's own fields may not be) held to its rule,
        # and kept in its own type: a NumPy number would not load back from a checkpoint.
        for f in fields(self):
            if "help" in f.metadata:
                object.__setattr__(self, f.name, check_option(f, getattr(self, f.name)))
        # Rotary positions turn pairs of channels within each head.
        per_head = 2 if self.pos == "rope" else 1
        if self.n_embd % (per_head * self.n_head):
            raise ValueError(f"n_embd must be a multiple of n_head, twice that for rope: "
                             f"{per_head * self.n_head} here")


def make_norm(config):
    """RMSNorm (Llama's) or LayerNorm (GPT-2's), both with eps 1e-5."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


def rope_tables(config):
    """cos and sin of every position's angles, (block_size, head size) each."""
    hs = config.n_embd // config.n_head
    # Pair (j, j+hs/2) turns by pos * 10000^(-2j/hs): fast pairs part near
    # positions, slow ones far.
    inv_freq = 10000.0 ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(config.block_size).double(), inv_freq).repeat(1, 2)
    return angles.cos().float(), angles.sin().float()


def rope_forward(x, cos, sin):
    """Turns each channel pair (x_j, x_j+hs/2) by its angle: q.k then depends on their distance."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., hs / 2) each
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin  # (..., hs)


class KVCache:
    """Keys and values of each layer so far, allocated once to block_size and written in place (a
    cat would copy all every token). pos: the positions filled; last: the newest ids (GPT.embed)."""

    def __init__(self, config):
        self.config = config
        self.kv = None
        self.pos = 0

    def update(self, layer_idx, k, v):
        """Writes k and v (B, nh, T, hs) after the positions filled; returns all of them so far."""
        if self.kv is None:
            # (n_layer, 2, B, nh, block_size, hs), typed and placed as the first keys are.
            shape = (self.config.n_layer, 2, *k.shape[:2], self.config.block_size, k.size(3))
            self.kv = k.new_empty(shape)
        end = self.pos + k.size(2)
        self.kv[layer_idx, :, :, :, self.pos:end] = torch.stack([k, v])
        # Every layer fills the same positions: the last one moves the cache on.
        if layer_idx == self.config.n_layer - 1:
            self.pos = end
        return self.kv[layer_idx, :, :, :, :end].unbind(0)  # (B, nh, end, hs) each


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.layer_idx = layer_idx
        # A weight for each map, as Llama has them: Muon then orthogonalises each map by itself.
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_k = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x, rope=None, cache=None):
        q, k, v = self.heads(x, rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, nh, positions so far, hs)
        # Scores are scaled by 1/sqrt(hs), so that softmax's sharpness does not grow with the
        # head size. is_causal lets query i see keys 0 to i, right when q and k start together;
        # the one query after a cache is the newest position and must see every key: unmasked.
        dropout = self.dropout if self.training else 0.0
        # A CPU's bf16 attention steps backward slower than its fp32: there it runs in x's dtype,
        # out of the CPU's autocast. A GPU's autocast casts q, k, v back to bf16, its fast kind.
        with torch.autocast("cpu", enabled=False):
            q, k, v = q.to(x.dtype), k.to(x.dtype), v.to(x.dtype)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=q.size(2) > 1)
        y = y.transpose(1, 2).flatten(2)  # (B, T, nh * hs): the heads side by side again
        return F.dropout(self.c_proj(y), self.dropout, self.training)

    def heads(self, x, rope=None):
        """q, k and v of x (B, T, C), (B, nh, T, hs) each; q and k turned by rope's (cos, sin)."""
        B, T, C = x.shape
        # Each head reads its own hs = C // nh channels: the heads become a batch dimension.
        q = self.c_q(x).view(B, T, self.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
        k = self.c_k(x).view(B, T, self.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
        v = self.c_v(x).view(B, T, self.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
        if rope is None:
            return q, k, v
        return rope_forward(q, *rope), rope_forward(k, *rope), v


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        self.dropout = config.dropout
        # SwiGLU has three matrices, not two: 8/3 * n_embd hidden units keep GELU's
        # parameters (two matrices of 4 * n_embd), rounded up to a multiple of 64,
        # a width products run fast at.
        hidden = 64 * math.ceil(8 * config.n_embd / 3 / 64) if self.swiglu else 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_gate = nn.Linear(config.n_embd, hidden, bias=config.bias) if self.swiglu else None
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, hidden)
        if self.swiglu:
            # SwiGLU: the up projection, gated by silu of a second one.
            h = F.silu(self.c_gate(x)) * h
        else:
            # GELU in its tanh form, as GPT-2 has it.
            h = F.gelu(h, approximate="tanh")
        return F.dropout(self.c_proj(h), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, cache=None):
        # Pre-norm: the residual stream is never normalised, so gradients reach
        # early layers whole.
        x = x + self.attn(self.ln_1(x), rope, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        # GPT-2's names: wte, the token embedding; wpe, learned positions (None:
        # rope); h, blocks.
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        learned = config.pos == "learned"
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if learned else None
        # A vector for each pair (token before, token), added to the embedding:
        # what a bigram model knows, from the first step. 8192 rows hold every pair
        # of 90 tokens; more share rows.
        self.bigram = nn.Embedding(config.bigram, config.n_embd) if config.bigram else None
        # The rotary tables (unused with learned positions), not saved: the config
        # makes them again.
        for name, table in zip(("cos", "sin"), rope_tables(config)):
            self.register_buffer(name, table, persistent=False)
        self.h = nn.ModuleList(Block(config, layer_idx) for layer_idx in range(config.n_layer))
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # One matrix reads tokens in and scores them out: fewer parameters,
            # each row used twice.
            self.lm_head.weight = self.wte.weight
        self.init_weights()

    def init_weights(self):
        """GPT-2's initialisation: normal, std 0.02, smaller for the outputs added to the stream."""
        for name, p in self.named_parameters():
            # Biases and the bigram table start at zero: the table adds nothing until it learns.
            if name.endswith("bias") or name.startswith("bigram"):
                nn.init.zeros_(p)
            elif name.endswith("c_proj.weight"):
                # Each block adds two outputs to the residual stream; scaling them by
                # 1/sqrt(2 n_layer) keeps the stream's variance at init independent of depth.
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets=None, cache=None):
        """Logits (B, T, vocab_size) of integer ids (B, T), and the loss for targets (B, T)."""
        # With a cache, these positions follow those it holds, one at a time (see the attention).
        start = 0 if cache is None else cache.pos
        if start and idx.size(1) > 1:
            raise ValueError("after a cache, one token at a time")
        x, rope = self.embed(idx, start, cache)
        for block in self.h:
            x = block(x, rope, cache)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def embed(self, idx, start=0, cache=None):
        """The first block's input (B, T, C) for ids idx (B, T) at positions from start, and rope's
        (cos, sin) there (None for learned positions). With a cache, it keeps idx's last ids."""
        T = idx.size(1)
        x = self.wte(idx)  # (B, T, C)
        # Positions: GPT-2 adds a learned vector to each token; rope turns q and k
        # in every layer.
        rope = None
        if self.wpe is None:
            rope = (self.cos[start:start + T], self.sin[start:start + T])
        else:
            x = x + self.wpe.weight[start:start + T]
        if self.bigram is not None:
            # The token before each: -1 for a window's first (none in view), or after a cache the
            # last token it read. In int64, as a pair's number may pass 2 ** 31.
            before = cache.last if start else F.pad(idx, (1, 0), value=-1)[:, :-1]  # (B, T)
            pairs = before.long() * self.config.vocab_size + idx
            # A pair's row is its number modulo the rows; -1's pairs take the table's last rows.
            x = x + self.bigram(pairs % self.config.bigram)
        if cache is not None:
            cache.last = idx[:, -1:]
        return x, rope

    def generate(self, idx, max_new_tokens, **sampling):
        """idx (B, T), then max_new_tokens drawn by stream(): (B, T + max_new_tokens)."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, **sampling)], dim=1)

    @torch.inference_mode()
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """Yields each sampled token (B, 1) as it is drawn: temperature 0 is greedy, top_k and top_p
        filter, a seeded torch.Generator repeats a sample."""
        # Ids not (B, T) would fail further on, in words that do not say why
        # (float ids torch refuses clearly, at the embedding).
        if idx.ndim != 2:
            raise ValueError(f"idx must be integer ids (B, T), not {idx.dtype} {tuple(idx.shape)}")
        cache = KVCache(self.config)
        # The tokens the model conditions on: the last block_size of the prompt and the samples.
        context = idx[:, -self.config.block_size:]
        for _ in range(max_new_tokens):
            # An empty cache reads the whole context; after that, the newest token alone.
            new = context[:, -1:] if cache.pos else context
            logits, _ = self(new, cache=cache)
            # The last position predicts the next token.
            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)  # (B, 1)
            yield next_id
            context = torch.cat([context, next_id], dim=1)[:, -self.config.block_size:]
            if cache.pos == self.config.block_size:
                # Past block_size the window slides and cached keys sit at the
                # wrong positions: the cache is emptied, and from here on every
                # token reads the whole window again.
                cache.pos = 0


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """A token (B, 1) for logits (B, vocab_size): the likeliest at temperature 0 (the first of any
    tied, with no draw), else drawn from the softmax of logits / temperature, filtered."""
    # A negative temperature would turn the distribution upside down, and one past float32's
    # largest (inf among them) make every logit 0 or NaN; NaN fails this as well.
    if not 0 <= temperature <= torch.finfo(torch.float32).max:
        raise ValueError(f"temperature must be at least 0 and finite in float32: {temperature}")
    # In float32, as bfloat16 ties close logits. Temperature 0 would make the largest logit
    # 0 / 0: less their max and over 1e-30, the largest stays 0 and every other falls below it.
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, 1e-30)
    # A NaN or +inf logit (weights too large for float32) leaves NaN: argmax would say token 0.
    if logits.isnan().any():
        raise ValueError("logits of NaN or +inf, from weights that overflow: no token to draw")
    probs = F.softmax(filter_logits(logits, top_k, top_p), dim=-1)
    if temperature == 0:
        return probs.argmax(dim=-1, keepdim=True)
    return torch.multinomial(probs, 1, generator=generator)


def filter_logits(logits, top_k=None, top_p=None):
    """-inf outside the top_k, then outside the nucleus: the likeliest tokens that reach top_p."""
    if top_k is not None:
        # True would pass as top_k 1, quietly greedy.
        if isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"top_k must be an int of at least 1, not {top_k!r}")
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        # NaN would drop no token, quietly no filter at all.
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {top_p!r}")
        # From the likeliest down, a token goes when those before it reach top_p;
        # the first stays (float32 may round a tiny top_p to 0). Each verdict then
        # goes back to its token's place.
        probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # (B, vocab_size) each
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, vocab_size), as logits
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def get_device(name=None):
    """torch.device(name) for a name such as "cuda:1"; for "" or None the best: CUDA, MPS, CPU."""
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    fallback = "mps" if torch.backends.mps.is_available() else "cpu"
    return torch.device(fallback)


def matmul_dtype(device):
    """bfloat16 where device multiplies it in hardware (a GPU, but for one that emulates it as a T4
    does; a CPU with AVX512-BF16 or AMX), float32 elsewhere: emulated bfloat16 runs slower."""
    cpu = torch.cpu.get_capabilities() if device.type == "cpu" else {}
    native = cpu.get("avx512_bf16", False) or cpu.get("amx_bf16", False)
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if native else torch.float32


def autocast(device):
    """bf16 autocast where matmul_dtype is bf16 (fp16 would need a gradient scaler), else fp32."""
    bf16 = matmul_dtype(device) == torch.bfloat16
    return torch.autocast(device.type, torch.bfloat16, enabled=bf16)


def newton_schulz(G, steps=5):
    """G (n, rows, cols) made nearly orthogonal, each matrix of the batch alike: its singular values
    pushed toward 1 (0.7 to 1.2, but for those far below the largest), its singular vectors kept."""
    X = G.to(matmul_dtype(G.device))
    # Worked on wide, so that the Gram matrix X X^T is the smaller one.
    tall = G.size(-2) > G.size(-1)
    X = X.mT if tall else X  # (n, m, k), m <= k
    # Scaled to a norm of 1, so that every singular value starts at most 1.
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)
    for _ in range(steps):
        A = X @ X.mT  # (n, m, m)
        # Each singular value s becomes 3.4445 s - 4.7750 s^3 + 2.0315 s^5 (torch.optim.Muon's
        # coefficients): small ones grow fast, and all end between about 0.7 and 1.2. B is
        # -4.7750 A + 2.0315 A A, then X is 3.4445 X + B X: each a product and a sum in one pass.
        B = torch.baddbmm(A, A, A, beta=-4.7750, alpha=2.0315)
        X = torch.baddbmm(X, B, X, beta=3.4445)
    return X.mT if tall else X  # (n, rows, cols)


class Muon(torch.optim.Optimizer):
    """Muon, for 2-D weights: SGD with Nesterov's momentum, each update orthogonalised so that every
    direction of a matrix moves alike, and decoupled weight decay: torch.optim.Muon's algorithm."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            # The matrices of one shape are orthogonalised as one batch: their small products one
            # at a time would leave the CPU waiting on each.
            by_shape = {}
            for p in group["params"]:
                # A weight that took no part in the loss (a frozen one) has no gradient to step on.
                if p.grad is None:
                    continue
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                buffer = self.state[p]["momentum_buffer"]
                buffer.lerp_(p.grad, 1 - group["momentum"])
                # Nesterov's look ahead: the gradient, moved toward the momentum.
                update = p.grad.lerp(buffer, group["momentum"])
                by_shape.setdefault(p.shape, []).append((p, update))
            for pairs in by_shape.values():
                updates = newton_schulz(torch.stack([u for _, u in pairs]))  # (n, rows, cols)
                for (p, _), update in zip(pairs, updates):
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    # An orthogonal matrix's entries have an RMS of 1/sqrt(max(rows, cols)): the
                    # factor gives a tall one's the size of 1/sqrt(cols).
                    p.add_(update, alpha=-group["lr"] * math.sqrt(max(1, p.size(0) / p.size(1))))


# A run's checkpoint in its out_dir.
CHECKPOINT = "ckpt.pt"


def save_checkpoint(ckpt, path):
    """Writes path.tmp to the disk, then renames it to path: a crash or a failed write leaves a
    whole checkpoint there, this one or the one before (and path.tmp, which a save replaces)."""
    with open(path + ".tmp", "wb") as f:
        # torch.save flushes Python's buffer to the system; fsync, the system's to the disk.
        torch.save(ckpt, f)
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def load_checkpoint(path, device=None):
    """(the model in eval mode on device, its CharTokenizer or None, the checkpoint), path a
    checkpoint's file or a checkpoint read already."""
    ckpt = path
    if not isinstance(path, dict):
        # weights_only: a downloaded checkpoint cannot run code. To the CPU, which always exists.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    # A config that names no bigram table is of a model without one.
    model = GPT(GPTConfig(**{"bigram": 0, **ckpt["config"]}))
    model.load_state_dict(ckpt["model"])
    tokenizer = CharTokenizer(ckpt["chars"]) if ckpt.get("chars") else None
    return model.to(get_device(device)).eval(), tokenizer, ckpt


@dataclass(frozen=True)
class TrainConfig(GPTConfig):
    """The run's options and the model's; the defaults train for 3 to 5 minutes on 2 cores."""
    out_dir: str = option("out", help='Folder of ckpt.pt and report.html ("" writes none).')
    max_iters: int = option(4000, min=1, max=MANY, help="Optimizer steps in all.")
    max_time: float = option(0.0, min=0, max=MANY, help="Seconds to train instead (0: off).")
    eval_interval: int = option(500, min=1, max=MANY, help="Evaluate and save every this many.")
    eval_iters: int = option(50, min=1, max=MANY, help="Batches per split in an evaluation.")
    batch_size: int = option(4, min=1, max=MANY, help="Sequences per micro-batch.")
    grad_accum: int = option(1, min=1, max=2 ** 16, help="Micro-batches per optimizer step.")
    short_context: float = option(0.6, min=0, max=1, help="Share of the run at half the context.")
    learning_rate: float = option(3e-3, min=1e-9, max=1, help="Peak learning rate (AdamW's).")
    embedding_lr: float = option(0.03, min=1e-9, max=1, help="The untied embedding's peak rate.")
    min_lr: float = option(3e-4, min=0, max=1, help="Rate at the end, at most learning_rate.")
    warmup_iters: int = option(20, min=0, max=MANY, help="Steps of linear warmup.")
    weight_decay: float = option(0.0, min=0, max=MANY, help="Weight decay, on matrices only.")
    beta2: float = option(0.99, min=0, max=0.9999, help="AdamW's beta2: short for small batches.")
    optimizer: str = option("muon", choices=("muon", "adamw"), help="Muon for matrices, or AdamW.")
    muon_lr: float = option(0.01, min=1e-9, max=1, help="Muon's peak learning rate.")
    muon_momentum: float = option(0.95, min=0, max=0.9999, help="Muon's momentum.")
    muon_momentum_start: float = option(0.85, min=0, max=0.9999, help="It rises to muon_momentum.")
    grad_clip: float = option(1.0, min=0, max=MANY, help="Clip the gradient norm to this (0: off).")
    seed: int = option(1337, min=0, max=2 ** 32 - 1, help="Seed of the weights, batches, dropout.")
    device: str = option("", help='cpu, cuda, cuda:N or mps ("": the best available).')

    def __post_init__(self):
        super().__post_init__()
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr {self.min_lr} is above learning_rate "
                             f"{self.learning_rate}, so the rate would rise: lower min_lr")

    def model_config(self, **changes):
        """The GPTConfig of these options, with changes."""
        return GPTConfig(**({f.name: getattr(self, f.name) for f in fields(GPTConfig)} | changes))


def configure_optimizers(model, tc, device_type="cpu"):
    """[AdamW], or with tc.optimizer "muon" [AdamW, Muon]: Muon for the blocks' matrices."""
    # Muon moves all of a matrix's directions alike; tables of rows (wte, lm_head,
    # bigram): AdamW.
    blocks = [p for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2]
    muon = blocks if tc.optimizer == "muon" else []
    # A row of the embedding moves only when its token is read: it learns faster at
    # a higher rate.
    embedding = [] if model.config.tie_weights else [model.wte.weight]
    # Decay pulls matrices toward zero; on gains and biases it would only fight the
    # norms. Muon's matrices are known by id, as == compares tensors by value.
    apart = set(map(id, muon + embedding))
    matrices = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in apart]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": embedding, "lr": tc.embedding_lr, "weight_decay": tc.weight_decay},
              {"params": matrices, "weight_decay": tc.weight_decay},
              {"params": vectors}]
    # fused: one kernel for all the tensors, on CPU and CUDA.
    optimizers = [torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(0.9, tc.beta2),
                                    weight_decay=0.0, fused=device_type in ("cuda", "cpu"))]
    if muon:
        optimizers.append(Muon(muon, tc.muon_lr, tc.muon_momentum, tc.weight_decay))
    return optimizers


def progress(tc, it, elapsed):
    """The share of the run done: of its steps, or of its seconds with max_time."""
    return elapsed / tc.max_time if tc.max_time else it / tc.max_iters


def lr_at(tc, it, elapsed):
    """Linear warmup, then the peak rate held, then a straight line down to min_lr over the last 60%
    of the steps, or of the seconds with max_time."""
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / tc.warmup_iters
    done = progress(tc, it, elapsed)
    # Held high, the rate learns fast; cooled at the end, the weights settle.
    cooldown = min(1.0, max(0.0, (1 - done) / 0.6))
    return tc.min_lr + cooldown * (tc.learning_rate - tc.min_lr)


def train_step(model, optimizers, batches, grad_clip=0.0, amp=contextlib.nullcontext()):
    """One step of each optimizer on the mean loss of micro-batches [(x, y), ...]; returns it."""
    mean_loss = 0.0
    for x, y in batches:
        # The micro-batches' gradients add up to those of their mean loss.
        with amp:
            loss = model(x, y)[1] / len(batches)
        loss.backward()
        mean_loss += loss.detach()
    if grad_clip:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    for optimizer in optimizers:
        optimizer.step()
    model.zero_grad(set_to_none=True)
    return mean_loss


def split(data):
    """{"train": data's first 90%, "val": its last 10%, held out}."""
    n = int(0.9 * len(data))
    return {"train": data[:n], "val": data[n:]}


# The most tokens an evaluation reads of a split: at the end of a run, the whole
# held-out split up to this many, in a time that does not grow with the corpus.
MAX_EVAL_TOKENS = 2_000_000


@torch.no_grad()
def split_loss(model, data, batch_size):
    """The mean loss of model (in eval mode) over data in back-to-back windows of block_size (or
    of all data), batch_size a forward: every id but the first predicted once, each time alike."""
    T = min(model.config.block_size, len(data) - 1)
    total = 0.0
    for i in range(0, len(data) - 1, batch_size * T):
        # Read by index, as batch() reads: a copy of these ids (a memmap's slice is read-only).
        pos = torch.arange(i, min(i + batch_size * T + 1, len(data)))
        ids = torch.as_tensor(data[pos]).long().to(model.lm_head.weight.device)
        # The last window is padded to T: causal attention hides the padding from
        # the tokens before it, and cross_entropy leaves out targets of -100.
        pad = -(len(ids) - 1) % T
        x = F.pad(ids[:-1], (0, pad)).view(-1, T)  # (windows, T)
        y = F.pad(ids[1:], (0, pad), value=-100).view(-1, T)  # (windows, T)
        total += model(x, y)[1].item() * (y >= 0).sum().item()
    return total / (len(data) - 1)


INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32,
            torch.int64, torch.uint64)


def token_ids(data, tc, vocab_size):
    """data as 1-D integer ids (a list becomes a tensor; a tensor, an array, a memmap stay as they
    are), or a ValueError where training on it would go wrong."""
    ids = data if hasattr(data, "__array__") else torch.tensor(data)
    # Float ids would be cut to integers, and 2-D ones fail at the first step in words of sizes.
    # ids[[]], an empty copy, gives the torch dtype of a tensor and of an array alike.
    if ids.ndim != 1 or torch.as_tensor(ids[[]]).dtype not in INTEGERS:
        raise ValueError(f"data must be a text or 1-D integer ids, not {ids.dtype} {ids.shape}")
    # Over 10 x block_size ids, the held-out 10% holds a window and the id after it.
    if len(ids) <= 10 * tc.block_size:
        raise ValueError(f"data has {len(ids)} tokens: more than 10 * block_size are needed")
    # An id past the vocabulary, or below 0, would fail at the first step that reads it.
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"data has ids {low} to {high}, not all in [0, {vocab_size})")
    return ids


def claim(out_dir, owner=False):
    """Makes out_dir, refused (a ValueError) where another run's checkpoint or train.py's lock is
    (owner: the caller holds that lock and checked that checkpoint, as train.py does). "": none."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    taken = sorted({CHECKPOINT, "train.lock"} & set(os.listdir(out_dir)))
    if taken and not owner:
        raise ValueError(f"{out_dir} has another run's {taken[0]}: pass another out_dir")


class Trainer:
    """A run: the model, its optimizers, the data, where the run stands. data is a text (encoded by
    tokenizer, by default a CharTokenizer) or 1-D token ids; its last 10% is held out."""

    def __init__(self, tc, data, tokenizer=None, model=None, log=print, owner=False):
        if isinstance(data, str):
            tokenizer = tokenizer or CharTokenizer(data)
            data = tokenizer.encode(data)
        vocab_size = tc.vocab_size if tokenizer is None else tokenizer.vocab_size
        self.splits = split(token_ids(data, tc, vocab_size))
        claim(tc.out_dir, owner)
        self.tc = tc
        self.log = log
        self.device = get_device(tc.device)
        self.tokenizer = tokenizer
        # The seed sets the initial weights and, in training, dropout's masks.
        torch.manual_seed(tc.seed)
        if model is None:
            model = GPT(tc.model_config(vocab_size=vocab_size))
        self.model = model.to(self.device)
        self.optimizers = configure_optimizers(self.model, tc, self.device.type)
        # The batches come from a generator of their own, which a resumed run restores.
        self.generator = torch.Generator().manual_seed(tc.seed)
        self.amp = autocast(self.device)
        # What the steps run: the model, or what train.py wraps around it (torch.compile, DDP).
        self.wrapped_model = self.model
        # Where the run stands: its steps, its seconds, the last step's rate and loss, evaluations.
        self.it = 0
        self.elapsed = 0.0
        self.lr = None
        self.loss = None
        self.history = []
        # More a caller keeps in every checkpoint (train.py: what its data was).
        self.record = {}

    def batch(self, split):
        """A random batch of the split, (x, y), each (batch_size, block_size); over the first
        short_context of the run, half the context in as many more windows as keep the tokens."""
        data = self.splits[split]
        T = self.tc.block_size
        # Early on a model uses little context: more windows, each shorter, teach it faster.
        if progress(self.tc, self.it, self.elapsed) < self.tc.short_context:
            T = max(1, T // 2)
        B = self.tc.batch_size * self.tc.block_size // T
        ix = torch.randint(len(data) - T, (B, 1), generator=self.generator)
        # Each row's positions, (B, 1) + (T + 1) -> (B, T + 1): a memmap reads these alone.
        xy = torch.as_tensor(data[ix + torch.arange(T + 1)]).long().to(self.device)
        # The target at each position is the token after it.
        return xy[:, :-1], xy[:, 1:]  # (B, T) each

    def done(self):
        tc = self.tc
        return self.elapsed >= tc.max_time if tc.max_time else self.it >= tc.max_iters

    def set_schedule(self):
        """Sets each group's rate for this step, and Muon's momentum."""
        tc = self.tc
        self.lr = lr_at(tc, self.it, self.elapsed)
        # Muon's momentum rises by 0.1 per 300 steps: a shorter memory while the
        # weights move fast.
        momentum = min(tc.muon_momentum, tc.muon_momentum_start + self.it / 3000)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                # One schedule, each group from its own peak: learning_rate,
                # embedding_lr, muon_lr.
                peak = group.setdefault("initial_lr", group["lr"])
                group["lr"] = peak * self.lr / tc.learning_rate
                if "momentum" in group:
                    group["momentum"] = momentum

    def steps(self):
        """Trains, yielding after each step to the caller, who may log, check or stop; evaluates
        and saves every eval_interval steps and at the end."""
        tc = self.tc
        # Windows past the model's context (a model given to __init__) would fail when the short
        # ones end, late in the run: refused before the first step.
        if self.model.config.block_size < tc.block_size:
            raise ValueError(f"block_size {tc.block_size} is past the model's context, "
                             f"{self.model.config.block_size}")
        # The clock goes on from where a resumed run stood.
        t0 = time.time() - self.elapsed
        while not self.done():
            self.set_schedule()
            batches = [self.batch("train") for _ in range(tc.grad_accum)]
            self.loss = train_step(self.wrapped_model, self.optimizers, batches, tc.grad_clip,
                                   self.amp)
            self.it += 1
            # Wall time, the evaluations' included: max_time is what a clock on the wall says.
            self.elapsed = time.time() - t0
            yield self
            if self.it % tc.eval_interval == 0 or self.done():
                self.evaluate(whole=self.done())
                self.save()

    def evaluate(self, whole=False):
        """The loss of each split's first eval_iters batches of windows, logged and kept in history;
        with whole (at a run's end), the val loss of the held-out split, up to MAX_EVAL_TOKENS."""
        tc = self.tc
        # The same windows every time, so that the curve shows the model, not the draw.
        n = min(tc.eval_iters * tc.batch_size * tc.block_size + 1, MAX_EVAL_TOKENS)
        val = MAX_EVAL_TOKENS if whole else n
        read = {"train": n, "val": val}
        self.model.eval()
        losses = {}
        with self.amp:
            for name, ids in self.splits.items():
                losses[name] = split_loss(self.model, ids[:read[name]], tc.batch_size)
        self.model.train()
        self.history.append(dict(iter=self.it, seconds=self.elapsed, lr=self.lr, **losses))
        self.log(f"iter {self.it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    def save(self):
        """Writes out_dir/ckpt.pt ("": none): all a resume needs, and never weights NaN or inf."""
        if not self.tc.out_dir:
            return
        if not all(p.isfinite().all() for p in self.model.parameters()):
            raise ValueError(f"NaN or inf weights at iteration {self.it}: lower learning_rate")
        # load_checkpoint makes a CharTokenizer of chars again: those of another tokenizer
        # would come back sorted, each id read as another character.
        chars = self.tokenizer.chars if isinstance(self.tokenizer, CharTokenizer) else None
        ckpt = dict(model=self.model.state_dict(), config=asdict(self.model.config),
                    train_config=asdict(self.tc), iter=self.it, elapsed=self.elapsed,
                    chars=chars, tokenizer=getattr(self.tokenizer, "name", None),
                    history=self.history, optimizers=[o.state_dict() for o in self.optimizers],
                    rng={"torch": torch.get_rng_state(), "batches": self.generator.get_state()},
                    **self.record)
        save_checkpoint(ckpt, os.path.join(self.tc.out_dir, CHECKPOINT))


def train(tc, data, tokenizer=None, log=print):
    """Trains a new GPT on data as tc says; returns it, in eval mode, and its evaluations."""
    trainer = Trainer(tc, data, tokenizer, log=log)
    for _ in trainer.steps():
        pass
    return trainer.model.eval(), trainer.history
