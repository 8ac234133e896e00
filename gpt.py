"""A GPT in one file: character tokenizer, model, sampling with a KV cache, training loop and checkpoints.

Needs only PyTorch. Importing it does nothing, so it can be copied into any project.
"""
import math
import os
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------------- tokenizer
class CharTokenizer:
    """One token per distinct character: no merges to learn, and every text it saw round-trips exactly."""

    def __init__(self, chars):
        self.chars = "".join(sorted(set(chars)))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(unknown)!r}; "
                             f"use only characters of the training text")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# ---------------------------------------------------------------------------------------------------- model
@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    norm: str = "layernorm"  # or "rmsnorm"
    pos: str = "learned"     # or "rope"
    mlp: str = "gelu"        # or "swiglu"

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}): change one of them")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"rope rotates pairs of channels, so the head size n_embd/n_head "
                             f"({self.n_embd // self.n_head}) must be even: change n_embd or n_head")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name, allowed in (("norm", ("layernorm", "rmsnorm")), ("pos", ("learned", "rope")),
                              ("mlp", ("gelu", "swiglu"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")


def Norm(config):
    return nn.RMSNorm(config.n_embd, eps=1e-5) if config.norm == "rmsnorm" else \
        nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)


def rope_tables(config):
    hs = config.n_embd // config.n_head
    # Channel pair i turns by pos * 10000^(-2i/hs): fast pairs tell near positions apart, slow pairs far ones.
    inv_freq = 10000.0 ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # (block_size, hs): channel j pairs with channel j + hs/2
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    # Rotating q and k by angles proportional to their positions makes q.k depend only on their distance.
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.dropout = config.n_head, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rope=None, kv=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if kv is not None:  # sampling: this step's keys and values join those of the tokens before it
            if kv:
                k, v = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)
            kv[:] = [k, v]
        # Scores are scaled by 1/sqrt(hs) so their spread, and so softmax's sharpness, does not grow with head size.
        # is_causal sets each query's scores for later keys to -inf, which softmax turns into weight 0. One new token
        # attending to a cache is the last position: it may see every key, and needs no mask.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=T > 1)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        # SwiGLU has three matrices instead of two: 8/3 * n_embd hidden units keep its size that of the 4x GELU MLP.
        hidden = 64 * math.ceil(8 * config.n_embd / 3 / 64) if self.swiglu else 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.swiglu else hidden, bias=config.bias)  # gate, up
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")  # the tanh form, as GPT-2 was trained with
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = Norm(config), CausalSelfAttention(config)
        self.ln_2, self.mlp = Norm(config), MLP(config)

    def forward(self, x, rope=None, kv=None):
        # Pre-norm: the residual stream itself is never normalised, so gradients reach the first layers undamped.
        x = x + self.attn(self.ln_1(x), rope, kv)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        if config.pos == "learned":
            self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        else:  # not saved in checkpoints: they are recomputed from the config
            cos, sin = rope_tables(config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = Norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # One matrix reads tokens in and scores them out: fewer parameters, and each row learns from both uses.
            self.lm_head.weight = self.tok_emb.weight
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                # Each block adds two outputs to the residual stream; scaling them by 1/sqrt(2 n_layer) keeps the
                # stream's variance at init independent of depth.
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def num_params(self, non_embedding=False):
        """Parameters, a tied weight counted once; non_embedding leaves out the token and position tables."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + (self.pos_emb.weight.numel() if self.config.pos == "learned" else 0)
        return n

    def forward(self, idx, targets=None, kv_cache=None):
        B, T = idx.shape
        start = kv_cache[0][0].size(2) if kv_cache and kv_cache[0] else 0  # positions already in the cache
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size ({self.config.block_size})")
        x = self.tok_emb(idx)  # (B, T, C)
        rope = None
        if self.config.pos == "learned":
            x = x + self.pos_emb(torch.arange(start, start + T, device=idx.device))
        else:
            rope = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, rope, None if kv_cache is None else kv_cache[i])
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    # ------------------------------------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """Extends idx (B, T) by max_new_tokens sampled tokens."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, temperature, top_k, top_p, generator)], dim=1)

    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        """Yields each sampled token (B, 1) as soon as it is drawn. Checks its arguments before the first."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if idx.size(1) == 0:
            raise ValueError("the prompt is empty: give at least one token")
        return self._stream(idx, max_new_tokens, temperature, top_k, top_p, generator)

    @torch.no_grad()
    def _stream(self, idx, max_new_tokens, temperature, top_k, top_p, generator):
        block_size, kv_cache = self.config.block_size, None
        for _ in range(max_new_tokens):
            if kv_cache is None or idx.size(1) > block_size:
                # Past block_size the window slides: every cached key and value was computed at a position that has
                # shifted, with a token now out of the window in view. So the cache is rebuilt from the last
                # block_size tokens, and each such step costs a full forward pass, as in nanoGPT.
                kv_cache = [[] for _ in self.blocks]
                logits, _ = self(idx[:, -block_size:], kv_cache=kv_cache)
            else:
                logits, _ = self(idx[:, -1:], kv_cache=kv_cache)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                probs = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
                next_id = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, next_id], dim=1)
            yield next_id


def filter_logits(logits, top_k=None, top_p=None):
    """Sets to -inf every logit outside the top_k, then outside the nucleus: the fewest most likely tokens whose
    probability reaches top_p. The most likely token always stays."""
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the tokens before this one already reach top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


# ---------------------------------------------------------------------------------------------------- devices
def get_device(name=""):
    """CUDA, else MPS, else CPU; a name ("cpu", "cuda:1", "mps") overrides, and must be usable here."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if torch.backends.mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use cpu, cuda, cuda:N or mps") from None
    usable = {"cpu": True, "cuda": torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count(),
              "mps": torch.backends.mps.is_available()}
    if not usable.get(device.type, False):
        raise ValueError(f"device {name!r} is not available on this machine: use --device cpu, or leave it out")
    return device


def autocast(device):
    """bf16 autocast on CUDA (fp16 on GPUs without bf16, which then needs a gradient scaler); fp32 elsewhere."""
    if device.type != "cuda":
        return nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)


# ---------------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(ckpt, path):
    """Writes a temporary file, then renames it over path: a crash mid-write leaves the old checkpoint whole."""
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, device=None):
    """Returns (model, tokenizer) from a checkpoint, the model on device (default: the best here), in eval mode."""
    model, tokenizer, _ = _load(path, get_device(str(device or "")))
    return model.eval(), tokenizer


def _load(path, device):
    if not os.path.exists(path):
        raise ValueError(f"no checkpoint at {path}: train one first with python train.py")
    try:
        # weights_only: a checkpoint is read as tensors and plain data, so a downloaded one cannot run code.
        ckpt = torch.load(path, map_location=device, weights_only=True)
        tokenizer, model = CharTokenizer(ckpt["chars"]), GPT(GPTConfig(**ckpt["config"]))
        if tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"{tokenizer.vocab_size} characters for a vocabulary of {model.config.vocab_size}")
        model.load_state_dict(ckpt["model"])
    except Exception as e:
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"{path} is not a checkpoint this gpt.py can load ({type(e).__name__}: {first_line}); "
                         f"train a new one with python train.py") from None
    return model.to(device), tokenizer, ckpt


# ---------------------------------------------------------------------------------------------------- training
@dataclass
class TrainConfig:
    """Every option of a training run. The defaults are the CPU ones: on 2 cores they train for about 3 minutes and
    gave the lowest val loss in a fixed time of the settings tried (README)."""
    data: str = "input.txt"
    out_dir: str = "out"
    resume: bool = False
    max_iters: int = 4000
    max_time: float = 0.0  # seconds of wall time; when set, it replaces max_iters as the length of training
    eval_interval: int = 500
    eval_iters: int = 50
    log_interval: int = 100
    batch_size: int = 8  # small batches: at a fixed time, more steps beat bigger ones
    grad_accum: int = 1
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    norm: str = "rmsnorm"
    pos: str = "rope"
    mlp: str = "swiglu"
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.99  # a shorter memory than the usual 0.999 suits small batches of characters
    grad_clip: float = 1.0
    seed: int = 1337
    device: str = ""
    compile: bool = False

    def __post_init__(self):
        for name in ("max_iters", "max_time", "warmup_iters", "weight_decay", "grad_clip", "min_lr"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("eval_interval", "eval_iters", "log_interval", "batch_size", "grad_accum", "learning_rate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


# A GPU trains a larger model in minutes: these replace TrainConfig's CPU defaults when train.py runs on CUDA.
CUDA_DEFAULTS = dict(max_iters=5000, batch_size=64, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.1,
                     learning_rate=1e-3, min_lr=1e-4, eval_iters=100)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the data file {path} ({e.strerror if isinstance(e, OSError) else e}): "
                         f"pass --data PATH to a UTF-8 text file") from None
    if not text:
        raise ValueError(f"the data file {path} is empty: pass --data PATH to a text with something in it")
    return text


def get_batch(data, block_size, batch_size, generator, device):
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    xy = torch.stack([data[i:i + block_size + 1] for i in ix.tolist()])  # (B, T+1)
    x, y = xy[:, :-1], xy[:, 1:]  # y is x shifted by one: every position predicts the next character
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def configure_optimizer(model, learning_rate, weight_decay, beta2, device_type="cpu"):
    # Decay pulls matrices (weights, embeddings) toward zero; on gains and biases it would only fight the norms.
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # The fused kernel updates every tensor in one pass; it exists for CUDA and CPU.
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, beta2), fused=device_type in ("cuda", "cpu"))


def lr_at(tc, it, elapsed):
    """Linear warmup, then cosine decay to min_lr over the iterations, or over the seconds when max_time is set."""
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / tc.warmup_iters
    done = elapsed / tc.max_time if tc.max_time else (it - tc.warmup_iters) / max(1, tc.max_iters - tc.warmup_iters)
    return tc.min_lr + 0.5 * (1 + math.cos(math.pi * min(done, 1.0))) * (tc.learning_rate - tc.min_lr)


def train_step(model, optimizer, batches, grad_clip=0.0, scaler=None, amp=nullcontext()):
    """One optimizer step on the mean loss of equal-sized micro-batches (x, y); returns the last one's loss.
    Under DDP, gradients are all-reduced once, on the last micro-batch."""
    for i, (x, y) in enumerate(batches):
        sync = model.no_sync() if isinstance(model, nn.parallel.DistributedDataParallel) and i < len(batches) - 1 \
            else nullcontext()
        with sync:
            with amp:
                _, loss = model(x, y)
            loss = loss / len(batches)
            (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    if grad_clip:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if scaler:
        scaler.step(optimizer)  # skipped when fp16 overflowed; the scale then shrinks
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach() * len(batches)


@torch.no_grad()
def estimate_loss(model, splits, tc, block_size, generator, device, amp):
    """Mean loss over eval_iters batches of each split; also the mean loss at each position of the val batches."""
    model.eval()
    out = {}
    for name, data in splits.items():
        losses = []
        for _ in range(tc.eval_iters):
            x, y = get_batch(data, block_size, tc.batch_size, generator, device)
            with amp:
                logits, _ = model(x)
            losses.append(F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").mean(0))  # (T,)
        out[name] = torch.stack(losses).mean(0)
    model.train()
    return {name: per_pos.mean().item() for name, per_pos in out.items()}, out["val"]


def train(tc, log=print):
    """Trains as tc says, writing out_dir/ckpt.pt; returns the model and the logged losses {"train": [(iter, loss)],
    "val": [...]}. Under torchrun, runs data-parallel."""
    ddp = int(os.environ.get("WORLD_SIZE", 1)) > 1
    device = get_device(tc.device)
    if not ddp:
        return _train(tc, device, 0, 1, log)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return _train(tc, device, rank, dist.get_world_size(), log if rank == 0 else lambda *a, **k: None)
    finally:
        dist.destroy_process_group()


def _train(tc, device, rank, world, log):
    ckpt_path = os.path.join(tc.out_dir, "ckpt.pt")
    text = read_text(tc.data)
    ckpt = None
    if tc.resume:
        model, tokenizer, ckpt = _load(ckpt_path, device)
        config = model.config
    else:
        tokenizer = CharTokenizer(text)
        config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=tc.block_size, n_layer=tc.n_layer,
                           n_head=tc.n_head, n_embd=tc.n_embd, dropout=tc.dropout, bias=tc.bias,
                           tie_weights=tc.tie_weights, norm=tc.norm, pos=tc.pos, mlp=tc.mlp)
    data = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}
    for name, split in splits.items():
        if len(split) <= config.block_size:
            raise ValueError(f"the {name} split of {tc.data} has {len(split)} characters, but one example needs "
                             f"block_size + 1 = {config.block_size + 1}: use a longer text or a smaller --block_size")
    try:  # an unusable out_dir fails now, not at the first save
        os.makedirs(tc.out_dir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot make the folder {tc.out_dir} ({e.strerror}): pass --out_dir a writable one") from None
    if ckpt is None:
        torch.manual_seed(tc.seed)  # the same initial weights on every rank
        model = GPT(config).to(device)
    optimizer = configure_optimizer(model, tc.learning_rate, tc.weight_decay, tc.beta2, device.type)
    generator = torch.Generator().manual_seed(tc.seed + rank)  # each rank draws its own batches
    torch.manual_seed(tc.seed + rank)  # dropout
    it, best_val, elapsed = 0, float("inf"), 0.0
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        it, best_val, elapsed = ckpt["iter"], ckpt["best_val"], ckpt["elapsed"]
        if rank == 0:
            torch.set_rng_state(ckpt["rng"]["torch"])
            generator.set_state(ckpt["rng"]["batches"])
        else:  # only rank 0's states were saved; the others start fresh streams that differ from rank 0's
            generator.manual_seed(tc.seed + rank + 1_000_003 * it)
        log(f"resuming from {ckpt_path} at iteration {it}, with its model: {config}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp = autocast(device)
    scaler = torch.amp.GradScaler("cuda") if device.type == "cuda" and not torch.cuda.is_bf16_supported() else None
    raw_model = model  # what is saved: no compile or DDP wrapper names in the state dict
    if tc.compile:
        model = torch.compile(model)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def save():
        if rank == 0:
            save_checkpoint({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                             "config": asdict(config), "chars": tokenizer.chars, "iter": it, "best_val": best_val,
                             "elapsed": elapsed, "train_config": asdict(tc),
                             "rng": {"torch": torch.get_rng_state(), "batches": generator.get_state()}}, ckpt_path)

    def check_finite(loss, what):
        if not math.isfinite(loss):
            raise ValueError(f"the {what} loss is {loss} at iteration {it}: training diverged; lower --learning_rate "
                             f"or raise --warmup_iters (the last good checkpoint in {tc.out_dir} is left as it was)")

    def evaluate():
        nonlocal best_val
        losses, per_pos = estimate_loss(raw_model, splits, tc, config.block_size, generator, device, amp)
        check_finite(losses["val"], "val")
        best_val = min(best_val, losses["val"])
        history["val"].append((it, losses["val"]))
        log(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        return per_pos

    interrupted = []  # Ctrl-C only raises this flag, so the step under way finishes and is saved whole
    catch = threading.current_thread() is threading.main_thread()
    old_handler = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True)) if catch else None
    history = {"train": [], "val": []}
    tokens_per_step = tc.batch_size * config.block_size * tc.grad_accum * world
    log(f"{raw_model.num_params() / 1e6:.2f}M parameters on {device}" + (f", {world} processes" if world > 1 else ""))
    try:
        t_start, elapsed_before = time.time(), elapsed
        t_last, it_last = t_start, it
        while (elapsed < tc.max_time) if tc.max_time else (it < tc.max_iters):
            lr = lr_at(tc, it, elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batches = [get_batch(splits["train"], config.block_size, tc.batch_size, generator, device)
                       for _ in range(tc.grad_accum)]
            loss = train_step(model, optimizer, batches, tc.grad_clip, scaler, amp)
            it += 1
            elapsed = elapsed_before + time.time() - t_start
            stop = 2 if interrupted else 1 if tc.max_time and elapsed >= tc.max_time else 0
            if world > 1:  # every rank must stop at the same step, or the others wait forever in all-reduce
                flag = torch.tensor([stop], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stop = flag.item()
            last = stop or (it == tc.max_iters and not tc.max_time)
            if it % tc.log_interval == 0 or last:
                lossf = loss.item()
                check_finite(lossf, "training")
                history["train"].append((it, lossf))
                dt = (time.time() - t_last) / (it - it_last)
                left = tc.max_time - elapsed if tc.max_time else (tc.max_iters - it) * dt
                log(f"iter {it}" + ("" if tc.max_time else f"/{tc.max_iters}") + f" | loss {lossf:.4f} | lr {lr:.2e} | "
                    f"{tokens_per_step} tok/step | {dt * 1000:.1f} ms/iter | {tokens_per_step / dt / 1000:.1f}k tok/s | "
                    f"ETA {max(left, 0) / 60:.1f} min")
                t_last, it_last = time.time(), it
            if stop == 2:
                save()
                log(f"interrupted: saved iteration {it} to {ckpt_path}; continue with --resume")
                return raw_model, history
            if stop:
                break
            if it % tc.eval_interval == 0 and not last:
                if rank == 0:
                    evaluate()
                save()
                t_last = time.time()  # keep the evaluation out of ms/iter
        per_pos = evaluate() if rank == 0 else None
        save()
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
    if rank == 0:
        log(f"saved {ckpt_path} ({elapsed:.0f} s of training)")
        log(f"what context buys: val loss {per_pos[0]:.3f} at position 0 (one character of context, all a bigram "
            f"model has) against {per_pos[-1]:.3f} at position {len(per_pos) - 1}")
        prompt = torch.tensor([tokenizer.encode("\n" if "\n" in tokenizer.stoi else text[0])], device=device)
        raw_model.eval()
        with amp:
            sample = raw_model.generate(prompt, 300, temperature=0.8, generator=torch.Generator(device).manual_seed(0))
        log("sample:\n" + tokenizer.decode(sample[0, 1:].tolist()))
    return raw_model, history
