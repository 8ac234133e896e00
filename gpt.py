"""A GPT in one file, needing only torch; importing it does nothing: tokenizer, model, sampling, training, saving."""
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


class CharTokenizer:
    """One token per distinct character: no merges to learn, and every text it saw round-trips exactly."""

    def __init__(self, chars):
        self.chars = "".join(sorted(set(chars)))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(unknown)!r}; use those of the training text")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# The range [low, high) of every number in GPTConfig and TrainConfig: NaN fails both comparisons and inf the second.
LIMITS = {**dict.fromkeys(["vocab_size", "block_size", "n_layer", "n_head", "n_embd", "max_iters", "eval_interval",
                           "eval_iters", "batch_size", "grad_accum"], (1, math.inf)),
          **dict.fromkeys(["max_time", "min_lr", "warmup_iters", "weight_decay", "grad_clip"], (0, math.inf)),
          "dropout": (0, 1), "beta2": (0, 1), "learning_rate": (1e-9, 1), "seed": (0, 2 ** 32)}
CHOICES = {"norm": ("rmsnorm", "layernorm"), "pos": ("rope", "learned"), "mlp": ("swiglu", "gelu")}  # GPT-2's second


@dataclass
class GPTConfig:
    """The model. The defaults, a Llama-style block, gave the lowest val loss in 140 s on 2 CPU cores (README)."""
    vocab_size: int = 65  # distinct characters: set by the training text
    block_size: int = 128  # context length in characters
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads
    n_embd: int = 128  # width of the residual stream
    dropout: float = 0.0  # dropout probability
    bias: bool = False  # biases in linear layers and LayerNorm
    tie_weights: bool = True  # share the token embedding with the output layer
    norm: str = "rmsnorm"  # rmsnorm or layernorm (GPT-2's)
    pos: str = "rope"  # rope (rotary) or learned (GPT-2's position embeddings)
    mlp: str = "swiglu"  # swiglu or gelu (GPT-2's)

    def __post_init__(self):  # TrainConfig's too
        for name, (low, high) in LIMITS.items():
            if hasattr(self, name) and not low <= getattr(self, name) < high:
                raise ValueError(f"{name} must be in [{low}, {high}), got {getattr(self, name)}")
        if self.n_embd % (2 * self.n_head if self.pos == "rope" else self.n_head):  # rope turns pairs of channels
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head, and of 2 n_head with rope")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if getattr(self, "min_lr", 0) > getattr(self, "learning_rate", 1):  # TrainConfig's: a decay must not rise
            raise ValueError(f"min_lr ({self.min_lr}) is above learning_rate ({self.learning_rate}): lower min_lr too")


def Norm(config):  # eps 1e-5 for both, LayerNorm's default: RMSNorm's own default would depend on the dtype
    return nn.RMSNorm(config.n_embd, eps=1e-5) if config.norm == "rmsnorm" else \
        nn.LayerNorm(config.n_embd, bias=config.bias)


def rope_tables(config):
    hs = config.n_embd // config.n_head
    # Channels j and j + hs/2 turn by pos * 10000^(-2j/hs): fast pairs tell near positions apart, slow pairs far ones.
    inv_freq = 10000.0 ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64), inv_freq).repeat(1, 2)  # (bs, hs)
    return torch.stack([angles.cos(), angles.sin()]).float()  # (2, block_size, hs): cos, sin


def rope_forward(x, cos, sin):
    # Rotating q and k by angles proportional to their positions makes q.k depend only on their distance.
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class KVCache:
    """Each layer's keys and values so far, written in place: torch.cat would copy the whole cache for every token."""

    def __init__(self, config):
        self.n_layer, self.block_size, self.k, self.v, self.pos = config.n_layer, config.block_size, None, None, 0

    def update(self, layer, k, v):
        if self.k is None:  # typed and placed as the first keys are, under autocast too
            self.k = k.new_empty(self.n_layer, *k.shape[:2], self.block_size, k.size(3))  # (n_layer, B, nh, bs, hs)
            self.v = torch.empty_like(self.k)
        start, end = self.pos, self.pos + k.size(2)  # pos: the positions already filled
        self.k[layer, :, :, start:end], self.v[layer, :, :, start:end] = k, v  # k, v: (B, nh, T, hs)
        if layer == self.n_layer - 1:  # the last layer moves every layer on
            self.pos = end
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, nh, end, hs)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.n_head, self.dropout, self.layer = config.n_head, config.dropout, layer
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x, rope=None, cache=None):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        q, k, v = qkv.unbind(0)  # (B, nh, T, hs) each
        if rope is not None:
            q, k = rope_forward(qkv[:2], *rope).unbind(0)  # q and k turn together; v does not
        if cache is not None:  # sampling: the earlier positions' keys and values join this step's
            k, v = cache.update(self.layer, k, v)  # (B, nh, positions so far, hs)
        # Scores are scaled by 1/sqrt(hs) so their spread, and so softmax's sharpness, does not grow with head size.
        # is_causal sets each query's scores for later keys to -inf, which softmax turns into weight 0. A single new
        # token after a cache is the last position: it may see every key, and needs no mask.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=T > 1)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, nh * hs): the heads side by side again
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        # SwiGLU has three matrices instead of two: 8/3 * n_embd hidden units keep its size that of the 4x GELU MLP.
        hidden = 64 * math.ceil(8 * config.n_embd / 3 / 64) if self.swiglu else 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.swiglu else hidden, bias=config.bias)  # gate, up
        self.c_proj, self.dropout = nn.Linear(hidden, config.n_embd, bias=config.bias), nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, 2 * hidden) for SwiGLU, else (B, T, hidden)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)  # (B, T, hidden) each
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")  # the tanh form, as GPT-2 was trained with
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1, self.attn = Norm(config), CausalSelfAttention(config, layer)
        self.ln_2, self.mlp = Norm(config), MLP(config)

    def forward(self, x, rope=None, cache=None):
        # Pre-norm: the residual stream itself is never normalised, so gradients reach the first layers undamped.
        x = x + self.attn(self.ln_1(x), rope, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.tok_emb = config, nn.Embedding(config.vocab_size, config.n_embd)
        if config.pos == "learned":
            self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        else:  # not saved in checkpoints: they are recomputed from the config
            self.register_buffer("rope", rope_tables(config), persistent=False)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.ln_f, self.lm_head = Norm(config), nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # One matrix reads tokens in and scores them out: fewer parameters, and each row learns from both uses.
            self.lm_head.weight = self.tok_emb.weight
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                # Each block adds two outputs to the residual stream; scaling them by 1/sqrt(2 n_layer) keeps the
                # stream's variance at init independent of depth.
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets=None, cache=None):
        T, start = idx.size(1), 0 if cache is None else cache.pos  # new positions, and those already in the cache
        if start + T > self.config.block_size or start and T > 1:  # see the attention's mask
            raise ValueError(f"{T} tokens after {start} cached ones: a sequence may not be longer than block_size "
                             f"({self.config.block_size}), and after a cached prompt come one token at a time")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.config.pos == "learned":
            x = x + self.pos_emb.weight[start:start + T]  # (T, C), the same for every sequence
        rope = self.rope[:, start:start + T] if self.config.pos == "rope" else None  # (2, T, hs): cos, sin
        for block in self.blocks:
            x = block(x, rope, cache)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """Extends idx (B, T) by max_new_tokens sampled tokens."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, temperature, top_k, top_p, generator)], dim=1)

    @torch.inference_mode()
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """Yields each sampled token (B, 1) as soon as it is drawn; its arguments are checked before the first."""
        if not (0 <= temperature < math.inf and (top_k is None or top_k >= 1) and (top_p is None or 0 < top_p <= 1)
                and idx.size(1)):  # written so that NaN fails
            raise ValueError(f"sampling takes temperature >= 0 (0: greedy), top_k >= 1, top_p in (0, 1] and a prompt "
                             f"of 1 token or more; got {temperature}, {top_k}, {top_p} and {idx.size(1)} tokens")
        block_size, cache, window = self.config.block_size, KVCache(self.config), idx[:, -self.config.block_size:]
        for _ in range(max_new_tokens):
            logits = self(window, cache=cache)[0][:, -1, :].float()  # (B, vocab_size): the last position's
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                # Less the max, temperature at least 1e-30 (float32 rounds less to 0): tiny ones tend to greedy, no NaN
                logits = (logits - logits.max(dim=-1, keepdim=True).values) / max(temperature, 1e-30)
                next_id = torch.multinomial(F.softmax(filter_logits(logits, top_k, top_p), -1), 1, generator=generator)
            yield next_id
            idx, window = torch.cat([idx, next_id], dim=1)[:, -block_size:], next_id  # what a refill would read
            if cache.pos == block_size:
                # Past block_size the window slides: each cached key and value was computed at a position since shifted,
                # with a token now out of view. So the window refills the cache: a full forward per token, as nanoGPT.
                cache.pos, window = 0, idx[:, -block_size:]


def filter_logits(logits, top_k=None, top_p=None):
    """-inf for each logit outside the top_k, then outside the nucleus: the fewest likeliest tokens that reach top_p."""
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # (B, vocab_size) each
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the tokens before this one already reach top_p
        drop[..., 0] = False  # the likeliest stays, also where float32 rounds a tiny top_p to 0
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def get_device(name=""):
    """CUDA, else MPS, else CPU; a name ("cpu", "cuda:1", "mps") overrides, and must be usable here."""
    name = name or ("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu")
    try:
        if torch.device(name).type in ("cpu", "cuda", "mps"):  # not meta, say, whose tensors hold no values
            return torch.empty(0, device=name).device  # only a device this machine has can hold a tensor
    except (RuntimeError, AssertionError):  # AssertionError: this PyTorch was built without CUDA
        pass
    raise ValueError(f"device {name!r} is unknown or not on this machine: use cpu, cuda, cuda:N or mps")


def autocast(device):
    """bf16 autocast on CUDA (fp16 on GPUs without bf16, which then needs a gradient scaler); fp32 elsewhere."""
    return nullcontext() if device.type != "cuda" else \
        torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)


def save_checkpoint(ckpt, path):
    """Writes a temporary file, then renames it over path: a crash mid-write leaves the old checkpoint whole."""
    try:
        torch.save(ckpt, path + ".tmp")
        os.replace(path + ".tmp", path)
    except RuntimeError as e:  # how torch's writer reports a full disk
        raise OSError(f"cannot write {path}: is the disk full? Any file there is left as it was (torch: {e})") from None
    finally:  # a failed write or rename leaves no temporary file behind
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")


def load_checkpoint(path, device=None):
    """(model in eval mode on device, default the best here; tokenizer; the dict, with what a resumed run needs)"""
    device = get_device(str(device or ""))
    # weights_only: a checkpoint is read as tensors and plain data, so a downloaded one cannot run code.
    ckpt = torch.load(path, map_location=device, weights_only=True)
    tokenizer, model = CharTokenizer(ckpt["chars"]), GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), tokenizer, ckpt


@dataclass
class TrainConfig(GPTConfig):
    """The model's options, GPTConfig's, and the training's. The defaults train for 3 to 5 minutes on 2 CPU cores."""
    out_dir: str = "out"  # folder of ckpt.pt, the checkpoint ("" writes none)
    max_iters: int = 4000  # optimizer steps in all
    max_time: float = 0.0  # seconds of wall time to train instead of max_iters (0: off); the lr then decays over time
    eval_interval: int = 500  # evaluate and save every this many steps
    eval_iters: int = 50  # batches per split in an evaluation
    batch_size: int = 8  # sequences per micro-batch: at a fixed time, many small steps beat fewer big ones
    grad_accum: int = 1  # micro-batches per optimizer step
    learning_rate: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the cosine decay
    warmup_iters: int = 100  # steps of linear warmup
    weight_decay: float = 0.1  # AdamW weight decay, on matrices only
    beta2: float = 0.99  # AdamW beta2: a shorter memory than the usual 0.999 suits small batches of characters
    grad_clip: float = 1.0  # clip the gradient norm to this (0: off)
    seed: int = 1337  # random seed
    device: str = ""  # cpu, cuda, cuda:N or mps ("": the best available)


def configure_optimizer(model, learning_rate, weight_decay, beta2, device_type="cpu"):
    # Decay pulls matrices (weights, embeddings) toward zero; on gains and biases it would only fight the norms.
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, beta2), fused=device_type in ("cuda", "cpu"))


def lr_at(tc, it, elapsed):
    """Linear warmup, then cosine decay to min_lr over the iterations, or over the seconds when max_time is set."""
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / tc.warmup_iters
    done = elapsed / tc.max_time if tc.max_time else (it - tc.warmup_iters) / max(1, tc.max_iters - tc.warmup_iters)
    return tc.min_lr + 0.5 * (1 + math.cos(math.pi * min(done, 1.0))) * (tc.learning_rate - tc.min_lr)


def train_step(model, optimizer, batches, grad_clip=0.0, scaler=None, amp=nullcontext()):
    """One optimizer step on the mean loss of equal-sized micro-batches [(x, y), ...], each (B, T); returns it."""
    scaler, mean_loss = scaler or torch.amp.GradScaler(enabled=False), 0.0  # a disabled scaler passes all through
    for i, (x, y) in enumerate(batches):
        with model.no_sync() if hasattr(model, "no_sync") and i < len(batches) - 1 else nullcontext():
            with amp:
                loss = model(x, y)[1] / len(batches)  # the micro-batches' gradients add up to the mean's
            scaler.scale(loss).backward()
        mean_loss += loss.detach()
    scaler.unscale_(optimizer)  # clip the true gradients, not fp16's scaled ones
    if grad_clip:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)  # skipped when fp16 overflowed; the scale then shrinks
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss


class Trainer:
    """A training run on a text: the model (new, or one given with its tokenizer), its AdamW, and where it stands."""

    def __init__(self, tc, text, model=None, tokenizer=None, log=print):
        self.tc, self.log, self.device = tc, log, get_device(tc.device)
        self.tokenizer = tokenizer or CharTokenizer(text)
        data, n = torch.tensor(self.tokenizer.encode(text)), int(0.9 * len(text))  # one token per character
        self.splits = {"train": data[:n], "val": data[n:]}  # the last 10% is held out
        torch.manual_seed(tc.seed)  # the initial weights, then dropout
        config = {**{f.name: getattr(tc, f.name) for f in fields(GPTConfig)}, "vocab_size": self.tokenizer.vocab_size}
        self.model = (model or GPT(GPTConfig(**config))).to(self.device)
        if len(data) - n <= self.model.config.block_size:
            raise ValueError("the text's last 10%, for validation, is too short for one block: give a longer text")
        self.optimizer = configure_optimizer(self.model, tc.learning_rate, tc.weight_decay, tc.beta2, self.device.type)
        self.generator, self.amp = torch.Generator().manual_seed(tc.seed), autocast(self.device)  # generator: batches
        self.scaler = torch.amp.GradScaler(enabled=getattr(self.amp, "fast_dtype", None) == torch.float16)
        self.train_model = self.model  # what steps() runs: train.py may wrap it in torch.compile and DDP
        self.it, self.elapsed, self.loss, self.history = 0, 0.0, None, {"train": [], "val": []}

    def batch(self, split):
        data, T = self.splits[split], self.model.config.block_size
        ix = torch.randint(len(data) - T, (self.tc.batch_size,), generator=self.generator)
        xy = torch.stack([data[i:i + T + 1] for i in ix.tolist()]).to(self.device, non_blocking=True)  # (B, T + 1)
        return xy[:, :-1], xy[:, 1:]  # (B, T) each: y is x shifted by one, so each position predicts the next one

    def done(self):
        return self.elapsed >= self.tc.max_time if self.tc.max_time else self.it >= self.tc.max_iters

    def steps(self):
        """Trains; yields after each step, where the caller may log, check or stop, before it evaluates and saves."""
        t_last = time.time()
        while not self.done():
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.tc, self.it, self.elapsed)
            batches = [self.batch("train") for _ in range(self.tc.grad_accum)]
            self.loss = train_step(self.train_model, self.optimizer, batches, self.tc.grad_clip, self.scaler, self.amp)
            self.it, now = self.it + 1, time.time()
            self.elapsed, t_last = self.elapsed + now - t_last, now  # wall time: evaluations count too
            yield self
            if self.it % self.tc.eval_interval == 0 or self.done():
                self.evaluate()
                self.save()

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        for split in self.splits:
            with self.amp:
                loss = torch.stack([self.model(*self.batch(split))[1] for _ in range(self.tc.eval_iters)]).mean()
            self.history[split].append((self.it, loss.item()))
        self.model.train()
        self.log(f"iter {self.it}: " + ", ".join(f"{split} loss {h[-1][1]:.4f}" for split, h in self.history.items()))

    def save(self):
        if self.tc.out_dir:
            os.makedirs(self.tc.out_dir, exist_ok=True)
            save_checkpoint({"model": self.model.state_dict(), "config": asdict(self.model.config),
                             "chars": self.tokenizer.chars, "optimizer": self.optimizer.state_dict(), "iter": self.it,
                             "elapsed": self.elapsed, "train_config": asdict(self.tc),
                             "rng": {"torch": torch.get_rng_state(), "batches": self.generator.get_state()}},
                            os.path.join(self.tc.out_dir, "ckpt.pt"))


def train(tc, text, log=print):
    """Trains a GPT on text as tc says, saving out_dir/ckpt.pt; returns it and its evaluations (history)."""
    for trainer in Trainer(tc, text, log=log).steps():  # each step yields the trainer, and a new one takes one at least
        pass
    return trainer.model, trainer.history
