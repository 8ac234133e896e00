"""A GPT in one file of PyTorch: a character tokenizer, the model, sampling through a KV cache, one
training loop, checkpoints and device choice. It imports only torch; importing it does nothing."""
import math
import os
import tempfile
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


def option(default, *rule, help=""):
    """A config field, its rule ([low, high) of a number, which NaN fails; a str's values), help."""
    return field(default=default, metadata={"rule": rule, "help": help})


def check_option(f, value):
    """A ValueError unless value has the type of field f's default and meets its option() rule."""
    kind = type(f.default)
    rule = f.metadata.get("rule")
    # type(), not isinstance(): True is an int. An int serves for a float.
    if "rule" in f.metadata and type(value) not in (kind, int if kind is float else kind):
        raise ValueError(f"{f.name} must be of type {kind.__name__}, not {value!r}")
    if rule and not (value in rule if kind is str else rule[0] <= value < rule[1]):
        allowed = f"one of {', '.join(rule)}" if kind is str else f"in [{rule[0]}, {rule[1]})"
        raise ValueError(f"{f.name} must be {allowed}, not {value!r}")


@dataclass(frozen=True)
class GPTConfig:
    """The model's options: Llama's block and a bigram table (GPT-2's: norm="layernorm",
    pos="learned", mlp="gelu", bias=True, tie_weights=True, bigram=0). Checked when made, frozen."""
    vocab_size: int = option(65, 1, 2 ** 20 + 1, help="Tokens in the vocabulary.")
    block_size: int = option(128, 1, math.inf, help="The context: the most tokens read at once.")
    n_layer: int = option(3, 1, math.inf, help="Transformer blocks.")
    n_head: int = option(4, 1, math.inf, help="Attention heads.")
    n_embd: int = option(128, 1, math.inf, help="Width of the residual stream.")
    dropout: float = option(0.0, 0, 1, help="Dropout probability.")
    bias: bool = option(False, help="Biases in the linear layers and LayerNorm.")
    tie_weights: bool = option(False, help="Share the token embedding with the output layer.")
    norm: str = option("rmsnorm", "rmsnorm", "layernorm", help="RMSNorm or LayerNorm.")
    pos: str = option("rope", "rope", "learned", help="Rotary or learned position embeddings.")
    mlp: str = option("swiglu", "swiglu", "gelu", help="SwiGLU or GELU's MLP.")
    bigram: int = option(8192, 0, 2 ** 24, help="Rows of the token pairs' table (0: none).")

    def __post_init__(self):
        """Each option as its rule says, then the rules that tie two options."""
        for f in fields(self):
            check_option(f, getattr(self, f.name))
        # Rotary positions turn pairs of channels within each head.
        if self.n_embd % (2 * self.n_head if self.pos == "rope" else self.n_head):
            raise ValueError(f"n_embd must be a multiple of n_head ({self.n_head}), twice for rope")
        # TrainConfig's: no rising decay (learning_rate=1e-4 alone is below the default min_lr).
        if getattr(self, "min_lr", 0) > getattr(self, "learning_rate", 1):
            raise ValueError(f"min_lr must be at most learning_rate ({self.learning_rate})")


def make_norm(config):
    """RMSNorm (Llama's) or LayerNorm (GPT-2's), both with eps 1e-5."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


def rope_tables(config):
    """cos and sin of every position's angles, (block_size, head size) each."""
    hs = config.n_embd // config.n_head
    # Pair (j, j+hs/2) turns by pos * 10000^(-2j/hs): fast pairs part near positions, slow ones far.
    inv_freq = 10000.0 ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(config.block_size).double(), inv_freq).repeat(1, 2)
    return angles.cos().float(), angles.sin().float()


def rope_forward(x, cos, sin):
    """Turns each channel pair (x_j, x_j+hs/2) by its angle: q.k then depends on their distance."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class KVCache:
    """Keys and values of each layer so far, allocated once to block_size and written in place (a
    cat would copy all every token). pos: positions filled (0 starts again); last: last ids read."""

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
        # Scores are scaled by 1/sqrt(hs), so that softmax's sharpness does not grow with the head
        # size. is_causal gives later keys weight 0, by a mask aligned top left (query i sees keys
        # 0 to i): the one query after a cache, the last position, goes without it and sees all.
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=q.size(2) > 1)
        y = y.transpose(1, 2).flatten(2)  # (B, T, nh * hs): the heads side by side again
        return F.dropout(self.c_proj(y), self.dropout, self.training)

    def heads(self, x, rope=None):
        """q, k and v of x (B, T, C), (B, nh, T, hs) each; q and k turned by rope's (cos, sin)."""
        # Each head reads its own hs = C // nh channels: the heads become a batch dimension.
        maps = (self.c_q, self.c_k, self.c_v)
        # (B, nh, T, hs) each
        q, k, v = (m(x).unflatten(-1, (self.n_head, -1)).transpose(1, 2) for m in maps)
        return (q, k, v) if rope is None else (rope_forward(q, *rope), rope_forward(k, *rope), v)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        self.dropout = config.dropout
        # SwiGLU has three matrices instead of two: 8/3 * n_embd hidden units keep the size of
        # GELU's 4 * n_embd, rounded up to a multiple of 64, a width matrix products run fast at.
        hidden = 64 * math.ceil(8 * config.n_embd / 3 / 64) if self.swiglu else 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_gate = nn.Linear(config.n_embd, hidden, bias=config.bias) if self.swiglu else None
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, hidden)
        # SwiGLU: silu of the gate times the up projection. GELU: the tanh form, GPT-2's.
        h = F.silu(self.c_gate(x)) * h if self.swiglu else F.gelu(h, approximate="tanh")
        return F.dropout(self.c_proj(h), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, cache=None):
        # Pre-norm: the residual stream is never normalised, so gradients reach early layers whole.
        x = x + self.attn(self.ln_1(x), rope, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        # GPT-2's names: wte, the token embedding; wpe, learned positions (None: rope); h, blocks.
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = None if config.pos == "rope" else nn.Embedding(config.block_size, config.n_embd)
        # A vector for each pair (token before, token), added to the embedding: what a bigram model
        # knows, from the first step. 8192 rows hold every pair of 90 tokens; more share rows.
        self.bigram = nn.Embedding(config.bigram, config.n_embd) if config.bigram else None
        # The rotary tables (unused with learned positions), not saved: the config makes them again.
        for name, table in zip(("cos", "sin"), rope_tables(config)):
            self.register_buffer(name, table, persistent=False)
        self.h = nn.ModuleList(Block(config, layer_idx) for layer_idx in range(config.n_layer))
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # One matrix reads tokens in and scores them out: fewer parameters, each row used twice.
            self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            # Biases and the bigram table start at zero: the table adds nothing until it learns.
            if name.endswith("bias") or name.startswith("bigram"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                # Each block adds two outputs to the residual stream; scaling them by
                # 1/sqrt(2 n_layer) keeps the stream's variance at init independent of depth.
                residual = name.endswith("c_proj.weight")
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer) if residual else 0.02)

    def forward(self, idx, targets=None, cache=None):
        """Logits (B, T, vocab_size) of int64 ids (B, T); the loss for targets (B, T), else None."""
        T = idx.size(1)
        # With a cache, these positions follow those it holds, one at a time (see the attention).
        start = 0 if cache is None else cache.pos
        if start + T > self.config.block_size or (start and T > 1):
            raise ValueError(f"{start} cached + {T} tokens: at most block_size, one after a cache")
        # Positions: GPT-2 adds a learned vector to each token; rope turns q and k in every layer.
        rope = None if self.wpe else (self.cos[start:start + T], self.sin[start:start + T])
        x = self.wte(idx) + (self.wpe.weight[start:start + T] if self.wpe else 0)  # (B, T, C)
        if self.bigram:
            # The token before each: the cache's last, or -1 before a window's first, which has none
            # in view. A pair's row is its number modulo the rows: with -1, the table's last rows.
            before = cache.last if start else F.pad(idx, (1, 0), value=-1)[:, :-1]  # (B, T)
            x = x + self.bigram((before * self.config.vocab_size + idx) % self.config.bigram)
        if cache is not None:
            cache.last = idx[:, -1:]
        for block in self.h:
            x = block(x, rope, cache)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def generate(self, idx, max_new_tokens, **sampling):
        """idx (B, T), then max_new_tokens drawn by stream(): (B, T + max_new_tokens)."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, **sampling)], dim=1)

    @torch.inference_mode()
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """Yields each sampled token (B, 1) as it is drawn: temperature 0 is greedy, top_k and top_p
        filter, a seeded torch.Generator repeats a sample."""
        # Only a tensor has a torch dtype. Counts by type(), as True is no count; floats for the
        # rest. NaN fails every comparison.
        verdicts = {
            "idx": getattr(idx, "dtype", None) in (torch.int64, torch.int32) and idx.ndim == 2
            and idx.numel() and 0 <= idx.min() <= idx.max() < self.config.vocab_size,
            "max_new_tokens": type(max_new_tokens) is int and max_new_tokens >= 0,
            "temperature": isinstance(temperature, (int, float)) and 0 <= temperature < math.inf,
            "top_k": top_k is None or type(top_k) is int and top_k >= 1,
            "top_p": top_p is None or isinstance(top_p, (int, float)) and 0 < top_p <= 1}
        wrong = [name for name, ok in verdicts.items() if not ok]
        if wrong:
            raise ValueError(f"bad {wrong[0]}: idx (B, T) int64 in [0, vocab_size), max_new_tokens"
                             " an int >= 0, temperature >= 0, top_k an int >= 1, top_p in (0, 1]")
        cache = KVCache(self.config)
        # The tokens the model conditions on: the last block_size of the prompt and the samples, in
        # int64 (a pair's number, token before x vocab_size + token, may not fit in int32).
        context = idx[:, -self.config.block_size:].long()
        for _ in range(max_new_tokens):
            # An empty cache reads the whole context; a filled one, the newest token alone. The last
            # position predicts the next token; in float32, as bfloat16 ties close logits.
            logits = self(context[:, -1:] if cache.pos else context, cache=cache)[0][:, -1].float()
            # Less their max, the logits are at most 0: a tiny temperature sends them to -inf, not
            # inf (below 1e-30, float32 would round the temperature to 0, and 0 / 0 is NaN).
            logits = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, 1e-30)
            probs = F.softmax(filter_logits(logits, top_k, top_p), dim=-1)
            # Temperature 0 is greedy: the likeliest token, the first of any tied, with no draw.
            next_id = (torch.multinomial(probs, 1, generator=generator) if temperature
                       else probs.argmax(dim=-1, keepdim=True))  # (B, 1)
            yield next_id
            context = torch.cat([context, next_id], dim=1)[:, -self.config.block_size:]
            if cache.pos == self.config.block_size:
                # Past block_size the context slides and cached keys sit at stale positions: the
                # cache starts again, in the memory it has.
                cache.pos = 0


def filter_logits(logits, top_k=None, top_p=None):
    """-inf outside the top_k, then outside the nucleus: the likeliest tokens that reach top_p."""
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        # From the likeliest down, a token goes when those before it reach top_p; the first stays
        # (float32 may round a tiny top_p to 0). Each verdict then goes back to its token's place.
        probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # (B, vocab_size) each
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop_sorted[..., 0] = False
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits


def get_device(name=None):
    """The device name ("cuda:1", a torch.device), or for "" or None the best: CUDA, MPS, CPU."""
    fallback = "mps" if torch.backends.mps.is_available() else "cpu"
    return torch.device(name or ("cuda" if torch.cuda.is_available() else fallback))


def autocast(device):
    """bf16 autocast on a GPU that has bf16; fp32 elsewhere (fp16 would need a gradient scaler)."""
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return torch.autocast(device.type, torch.bfloat16, enabled=bf16)


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
    """The model in eval mode on device, its CharTokenizer (or None), the checkpoint: path's, or
    path itself, a checkpoint read already."""
    # weights_only: a downloaded checkpoint cannot run code. To the CPU: torch.load maps no cpu:0.
    ckpt = path if type(path) is dict else torch.load(path, map_location="cpu", weights_only=True)
    # A checkpoint from before the bigram table has none.
    model = GPT(GPTConfig(**{"bigram": 0, **ckpt["config"]}))
    model.load_state_dict(ckpt["model"])
    tokenizer = None if ckpt.get("chars") is None else CharTokenizer(ckpt["chars"])
    return model.to(get_device(device)).eval(), tokenizer, ckpt


@dataclass(frozen=True)
class TrainConfig(GPTConfig):
    """The run's options and the model's; the defaults train for 3 to 5 minutes on 2 cores."""
    out_dir: str = option("out", help='Folder of ckpt.pt and report.html ("" writes none).')
    max_iters: int = option(4000, 1, math.inf, help="Optimizer steps in all.")
    max_time: float = option(0.0, 0, math.inf, help="Seconds to train instead (0: off).")
    eval_interval: int = option(500, 1, math.inf, help="Evaluate and save every this many steps.")
    eval_iters: int = option(50, 1, math.inf, help="Batches per split in an evaluation.")
    batch_size: int = option(8, 1, math.inf, help="Sequences per micro-batch.")
    grad_accum: int = option(1, 1, math.inf, help="Micro-batches per optimizer step.")
    learning_rate: float = option(3e-3, 1e-9, 1, help="Peak learning rate (AdamW's).")
    embedding_lr: float = option(0.03, 1e-9, 1, help="The token embedding's peak rate, if untied.")
    min_lr: float = option(3e-4, 0, 1, help="Learning rate at the end, at most learning_rate.")
    warmup_iters: int = option(20, 0, math.inf, help="Steps of linear warmup.")
    weight_decay: float = option(0.0, 0, math.inf, help="Weight decay, on matrices only.")
    beta2: float = option(0.99, 0, 1, help="AdamW's beta2: a shorter memory suits small batches.")
    optimizer: str = option("muon", "muon", "adamw", help="Muon and AdamW, or AdamW alone.")
    muon_lr: float = option(0.01, 1e-9, 1, help="Muon's peak learning rate, on the same schedule.")
    muon_momentum: float = option(0.95, 0, 1, help="Muon's momentum (at 1, nothing would move).")
    muon_momentum_start: float = option(0.85, 0, 1, help="It rises from this by 0.1 per 300 steps.")
    grad_clip: float = option(1.0, 0, math.inf, help="Clip the gradient norm to this (0: off).")
    seed: int = option(1337, 0, 2 ** 32, help="Seed of the initial weights, the batches, dropout.")
    device: str = option("", help='cpu, cuda, cuda:N or mps ("": the best available).')

    def model_config(self, **changes):
        return GPTConfig(**({f.name: getattr(self, f.name) for f in fields(GPTConfig)} | changes))


def configure_optimizers(model, tc, device_type="cpu"):
    """[AdamW], or with tc.optimizer "muon" [AdamW, Muon]: Muon for the blocks' matrices."""
    # Muon moves all of a matrix's directions alike; tables of rows (wte, lm_head, bigram): AdamW.
    blocks = [p for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2]
    muon = blocks if tc.optimizer == "muon" else []
    # A row of the embedding moves only when its token is read: it learns faster at a higher rate.
    embedding = [] if model.config.tie_weights else [model.wte.weight]
    # Decay pulls matrices toward zero; on gains and biases it would only fight the norms. Muon's
    # matrices are known by id, as == compares tensors by value.
    apart = set(map(id, muon + embedding))
    matrices = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in apart]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": embedding, "lr": tc.embedding_lr, "weight_decay": tc.weight_decay},
              {"params": matrices, "weight_decay": tc.weight_decay}, {"params": vectors}]
    # fused: one kernel for all the tensors, on CPU and CUDA.
    optimizers = [torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(0.9, tc.beta2),
                                    weight_decay=0.0, fused=device_type in ("cuda", "cpu"))]
    if muon:
        optimizers.append(torch.optim.Muon(muon, lr=tc.muon_lr, weight_decay=tc.weight_decay,
                                           momentum=tc.muon_momentum))
    return optimizers


def lr_at(tc, it, elapsed):
    """Linear warmup, then the peak rate held, then a straight line down to min_lr over the last 60%
    of the steps, or of the seconds with max_time."""
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / tc.warmup_iters
    done = elapsed / tc.max_time if tc.max_time else it / tc.max_iters
    # Held high, the rate learns fast; cooled, the weights settle (it beat a cosine at equal time).
    return tc.min_lr + min(1.0, max(0.0, (1 - done) / 0.6)) * (tc.learning_rate - tc.min_lr)


def train_step(model, optimizers, batches, grad_clip=0.0, amp=torch.autocast("cpu", enabled=False)):
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


@torch.no_grad()
def split_loss(model, data, batch_size):
    """The mean loss of model (in eval mode) over data, every id after the first predicted once, in
    windows of its context back to back, batch_size a forward: the same for the same weights."""
    T = model.config.block_size
    total = 0.0
    for i in range(0, len(data) - 1, batch_size * T):
        # Read by index, as batch() reads: a copy of these ids (a memmap's slice is read-only).
        pos = torch.arange(i, min(i + batch_size * T + 1, len(data)))
        xy = torch.as_tensor(data[pos]).long().to(model.lm_head.weight.device)
        # The last window is padded: causal attention hides the padding from the tokens before it,
        # and cross_entropy leaves out targets -100.
        x, y = (F.pad(t, (0, -len(t) % T), value=-100).view(-1, T) for t in (xy[:-1], xy[1:]))
        total += model(x.clamp(min=0), y)[1].item() * (y >= 0).sum().item()
    return total / (len(data) - 1)


class Trainer:
    """A run: the model, its optimizers, the data, where the run stands. data is a text (encoded by
    tokenizer, by default a CharTokenizer) or 1-D token ids; its last 10% is held out."""

    def __init__(self, tc, data, tokenizer=None, model=None, log=print, owner=False):
        if isinstance(data, str):
            tokenizer = tokenizer or CharTokenizer(data)
            data = tokenizer.encode(data)
        try:
            # A tensor, an array or a memmap stays, read batch by batch; a list becomes a tensor.
            ids = data if hasattr(data, "__array__") else torch.tensor(data)
            # iinfo refuses a type not of integers, a bool's too; an empty selection reads no id.
            integers = torch.iinfo(torch.as_tensor(ids[[]]).dtype).bits and ids.ndim == 1
        except (TypeError, ValueError, RuntimeError, IndexError, AttributeError):
            integers = False
        # Over 10 x block_size ids, the held-out 10% holds a window of block_size and the next id.
        if not integers or len(ids) <= 10 * tc.block_size:
            raise ValueError("data must be a text or 1-D integer ids, over 10 * block_size tokens")
        self.splits = split(ids)
        if tc.out_dir:
            # An out_dir that cannot take a checkpoint fails here, an OSError naming it, not at the
            # first save: the folder is made and takes a file with no name (on Linux), no one's.
            os.makedirs(tc.out_dir, exist_ok=True)
            tempfile.TemporaryFile(dir=tc.out_dir).close()
            # Never over another run's checkpoint, nor into a folder train.py's lock keeps (owner:
            # the caller holds the lock and has checked the checkpoint there, as train.py does).
            taken = sorted({CHECKPOINT, "train.lock"} & set(os.listdir(tc.out_dir)))
            if taken and not owner:
                raise ValueError(f"{tc.out_dir} has another run's {taken[0]}: pass another out_dir")
        self.tc = tc
        self.log = log
        self.device = get_device(tc.device)
        self.tokenizer = tokenizer
        # The seed sets the initial weights and, in training, dropout's masks.
        torch.manual_seed(tc.seed)
        vocab_size = tc.vocab_size if tokenizer is None else tokenizer.vocab_size
        self.model = (model or GPT(tc.model_config(vocab_size=vocab_size))).to(self.device)
        self.optimizers = configure_optimizers(self.model, tc, self.device.type)
        # The batches come from a generator of their own, which a resumed run restores.
        self.generator = torch.Generator().manual_seed(tc.seed)
        self.amp = autocast(self.device)
        # What the steps run: the model, or what train.py wraps around it (torch.compile, DDP).
        self.wrapped_model = self.model
        self.it = 0
        self.elapsed = 0.0
        # The learning rate and the loss of the last step.
        self.lr = None
        self.loss = None
        self.history = []

    def batch(self, split):
        """A random batch of the split, (x, y), each (batch_size, block_size)."""
        data = self.splits[split]
        T = self.tc.block_size
        ix = torch.randint(len(data) - T, (self.tc.batch_size, 1), generator=self.generator)
        # Each row's positions, (B, 1) + (T + 1) -> (B, T + 1): a memmap reads these alone.
        xy = torch.as_tensor(data[ix + torch.arange(T + 1)]).long().to(self.device)
        # The target at each position is the token after it.
        return xy[:, :-1], xy[:, 1:]  # (B, T) each

    def done(self):
        tc = self.tc
        return self.elapsed >= tc.max_time if tc.max_time else self.it >= tc.max_iters

    def steps(self):
        """Trains, yielding after each step to the caller, who may log, check or stop; evaluates
        and saves every eval_interval steps and at the end."""
        tc = self.tc
        # The clock goes on from where a resumed run stood.
        t0 = time.time() - self.elapsed
        while not self.done():
            self.lr = lr_at(tc, self.it, self.elapsed)
            # One schedule for all, each group from its peak: learning_rate, embedding_lr, muon_lr.
            for group in [g for optimizer in self.optimizers for g in optimizer.param_groups]:
                peak = group.setdefault("initial_lr", group["lr"])
                group["lr"] = peak * self.lr / tc.learning_rate
                if "momentum" in group:
                    # Muon's momentum rises to muon_momentum by 0.1 per 300 steps: a shorter memory
                    # while the weights move fast.
                    start = tc.muon_momentum_start
                    group["momentum"] = min(tc.muon_momentum, start + self.it / 3000)
            batches = [self.batch("train") for _ in range(tc.grad_accum)]
            model = self.wrapped_model
            self.loss = train_step(model, self.optimizers, batches, tc.grad_clip, self.amp)
            self.it += 1
            # Wall time, the evaluations' included: max_time is what a clock on the wall says.
            self.elapsed = time.time() - t0
            yield self
            if self.it % tc.eval_interval == 0 or self.done():
                self.evaluate(whole=self.done())
                self.save()

    def evaluate(self, whole=False):
        """The loss of each split's first eval_iters batches of windows, logged and kept in history;
        with whole (at the end of a run), the val loss is of every held-out token."""
        self.model.eval()
        # The same windows at every evaluation, so that the curve shows the model, not the draw.
        n = self.tc.eval_iters * self.tc.batch_size * self.tc.block_size
        with self.amp:
            losses = {name: split_loss(self.model, ids if whole and name == "val" else ids[:n + 1],
                                       self.tc.batch_size) for name, ids in self.splits.items()}
        self.model.train()
        self.history.append(dict(iter=self.it, seconds=self.elapsed, lr=self.lr, **losses))
        self.log(f"iter {self.it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    def save(self):
        """Writes out_dir/ckpt.pt ("": none): all a resume needs, and never weights NaN or inf."""
        if not self.tc.out_dir:
            return
        if not all(p.isfinite().all() for p in self.model.parameters()):
            raise ValueError(f"NaN or inf weights at iteration {self.it}: lower learning_rate")
        ckpt = dict(model=self.model.state_dict(), config=asdict(self.model.config), iter=self.it,
                    train_config=asdict(self.tc), chars=getattr(self.tokenizer, "chars", None),
                    tokenizer=getattr(self.tokenizer, "name", None), elapsed=self.elapsed,
                    history=self.history, optimizers=[o.state_dict() for o in self.optimizers],
                    rng={"torch": torch.get_rng_state(), "batches": self.generator.get_state()})
        save_checkpoint(ckpt, os.path.join(self.tc.out_dir, CHECKPOINT))


def train(tc, data, tokenizer=None, log=print):
    """Trains a new GPT on data as tc says; returns the model and its evaluations (history)."""
    trainer = Trainer(tc, data, tokenizer, log=log)
    for _ in trainer.steps():
        pass
    return trainer.model, trainer.history
