"""Measures gpt.py on this machine; every figure it prints comes from the run that prints it.

    python bench.py                             # matmul peaks, training steps, Muon's step, sampling,
                                                # the NumPy twin, reading a text into token ids
    python bench.py --nanogpt ~/src/nanoGPT     # the same run beside nanoGPT's model.py, from your
                                                # checkout of it
    python bench.py --gpt2                      # greedy sampling at GPT-2 small's shape beside
                                                # transformers' generate (when it is installed)
    python bench.py --profile                   # where a training and a decode step's time goes
    python bench.py --maps                      # the attention's three maps, or one stacked product
    python bench.py --quality 140 --data tinyshakespeare.txt   # val loss after 140 s of train.py
    python bench.py --quality --nanogpt ~/src/nanoGPT --data tinyshakespeare.txt --runs 3
                                                # nanoGPT's CPU recipe, then ours for its time; medians
    python bench.py --json bench.json           # also write the figures, machine-readable

The settings harness trains a list of settings for SECONDS each, in alternating rounds, on --data,
and compares their val losses on the whole held-out split (--runs: the rounds; --set: an option
of train.py for every run):

    python bench.py --optimizers 90             # AdamW and Muon
    python bench.py --variants 90               # the default block and each variant (--variant)
    python bench.py --candidates 75 --data tinyshakespeare.txt  # the recipe and each candidate
    python bench.py --copier 90                 # gpt.train's step (gpt.Muon) beside train.py's

A machine may be shared and drift in speed, so whatever is compared is timed interleaved, in rounds, and each figure
is the median of its rounds. Machines differ 2-3x in speed: set a figure only beside one from the same run.
"""
import argparse
import collections
import sys

try:
    import contextlib
    import dataclasses
    import functools
    import importlib.util
    import inspect
    import io
    import json
    import math
    import os
    import signal
    import statistics
    import subprocess
    import tempfile
    import time
    import unittest.mock

    # NumPy before torch: a Ctrl-C inside torch's own import of it is swallowed, or breaks it.
    import numpy
    import torch

    import cli
    import data
    import gpt
    import gpt2
    import gpt_numpy
    import report
    import train
# Ctrl-C while torch is still importing: nothing has been measured, so nothing is lost.
except KeyboardInterrupt:
    sys.exit(130)

GPT2_BLOCK = dict(norm="layernorm", pos="learned", mlp="gelu", tie_weights=True, bigram=0)
# nanoGPT's CPU recipe (its README: shakespeare_char at 4 layers, 128 wide, context 64, batch 12, no dropout; bias off),
# trained here with AdamW and one micro-batch a step as nanoGPT trains it, so that a step is set beside its own.
RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, bias=False)
RECIPE_OPTIMIZER = dict(optimizer="adamw", grad_accum=1)
RECIPE_STEPS, RECIPE_EVALS, RECIPE_EVAL_ITERS, RECIPE_BATCH = 2000, 9, 20, 12  # evaluations at 0, 250, ..., 2000
# nanoGPT's shakespeare_char model, the one its README samples from
SAMPLING = dict(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, bias=False)
PROMPT, NEW_TOKENS, PAST_TOKENS = 56, 200, 50  # 56 + 200 fill the 256 context


def shape(config):
    """A model's size as the labels give it: "6x384", layers by width."""
    return f"{config['n_layer']}x{config['n_embd']}"


RECIPE_SHAPE = f"{shape(RECIPE)}, context {RECIPE['block_size']}, batch {RECIPE_BATCH}"


def timed(fn, device):
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()  # GPU work is queued: wait for it before reading the clock
    return time.perf_counter() - t


def interleaved(fns, device, rounds, repeats, warmup=2):
    """{name: median seconds of one call}: each round times every fn in turn, repeats calls each; medians of rounds."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(statistics.median(timed(fn, device) for _ in range(repeats)))
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_peaks(dtypes, device):
    n = 8192 if device.type == "cuda" else 1024
    a = {d: torch.randn(n, n, device=device).to(d) for d in dtypes}
    t = interleaved({d: lambda d=d: a[d] @ a[d] for d in dtypes}, device, rounds=5, repeats=10)
    return n, {dtype_name(d): 2 * n ** 3 / t[d] / 1e9 for d in dtypes}


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def flops_per_token(config):
    """6 per weight for forward and backward through every matmul (the LM head's too), plus attention's scores and
    weighted sum: 12 * n_layer * n_embd * block_size."""
    with torch.device("meta"):
        model = gpt.GPT(config)
    c = config
    n = sum(p.numel() for p in model.parameters()) + (c.vocab_size * c.n_embd if c.tie_weights else 0)
    n -= c.vocab_size * c.n_embd + (c.block_size * c.n_embd if c.pos == "learned" else 0)  # lookups, not matmuls
    return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size


def batches(block_size, batch_size, device, seed=0):
    """An endless stream of random (x, y) batches, each (batch_size, block_size)."""
    data, gen = torch.randint(0, 65, (100_000,)), torch.Generator().manual_seed(seed)
    while True:
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=gen)
        xy = torch.stack([data[i:i + block_size + 1] for i in ix.tolist()]).to(device)
        yield xy[:, :-1].contiguous(), xy[:, 1:].contiguous()  # as nanoGPT's get_batch makes them


def our_step(config, tc, device, amp=contextlib.nullcontext(), compile=False):
    """One optimizer step of gpt.py, as train.py takes it: train_step on tc's micro-batches, with clipping and tc's
    optimizers."""
    torch.manual_seed(0)
    model = gpt.GPT(config).to(device)
    optimizers = gpt.configure_optimizers(model, tc, device.type)
    stepped, data = torch.compile(model) if compile else model, batches(config.block_size, tc.batch_size, device)
    return lambda: gpt.train_step(stepped, optimizers, [next(data) for _ in range(tc.grad_accum)], tc.grad_clip, amp)


def bench_training(device, peaks, bf16):
    """ms per optimizer step at the default shape (also compiled; on CPU its whole windows, the last 40% of a run)
    and at nanoGPT's CPU-recipe shape; MFU."""
    cuda = device.type == "cuda"
    default = gpt.TrainConfig(**(train.CUDA_DEFAULTS if cuda else {}))
    recipe = gpt.TrainConfig(**RECIPE, **GPT2_BLOCK, **RECIPE_OPTIMIZER, batch_size=RECIPE_BATCH)
    runs = {}
    for name, tc in ((f"default {device.type.upper()}", default), ("nanoGPT CPU-recipe shape", recipe)):
        config = tc.model_config(vocab_size=65)
        for dtype in ["fp32"] + (["bf16 autocast"] if bf16 else []):
            amp = torch.autocast(device.type, dtype=torch.bfloat16) if dtype != "fp32" else contextlib.nullcontext()
            runs[name, dtype] = (tc, config, our_step(config, tc, device, amp))
        if tc is default:
            runs[name + " --compile", "fp32"] = (tc, config, our_step(config, tc, device, compile=True))
    t = interleaved({key: step for key, (_, _, step) in runs.items()}, device, rounds=5, repeats=8)
    rows, torch_dtype = [], {"fp32": "float32", "bf16 autocast": "bfloat16"}
    for (name, dtype), (tc, config, _) in runs.items():
        tokens = tc.batch_size * tc.block_size * tc.grad_accum / t[name, dtype]
        rows.append(dict(name=name, dtype=dtype, ms_per_iter=t[name, dtype] * 1000, tokens_per_s=tokens,
                         mfu=tokens * flops_per_token(config) / 1e9 / peaks[torch_dtype[dtype]]))
    return rows


def muon_matrices(optimizer):
    """What one Muon step orthogonalises, read from its parameters: the matrices by shape, and the products of
    gpt.newton_schulz's iterations, one matrix at a time and with the matrices of a shape as one batch, as
    gpt.Muon takes them."""
    shapes = collections.Counter(tuple(p.shape) for group in optimizer.param_groups for p in group["params"])
    steps = inspect.signature(gpt.newton_schulz).parameters["steps"].default
    count = sum(shapes.values())
    each = ", ".join(f"{n} of {rows}x{cols}" for (rows, cols), n in shapes.items())
    # Each iteration takes three products: X X^T, its square, and the polynomial times X.
    return f"{count} matrices ({each}): {3 * steps * count} products, or {3 * steps * len(shapes)} batched"


def bench_muon(device, rounds=5):
    """ms per Muon step on the blocks' matrices of the default model, with the products in gpt.matmul_dtype's
    choice and in float32, interleaved; and what the step orthogonalises (muon_matrices)."""
    tc = gpt.TrainConfig(optimizer="muon")
    torch.manual_seed(0)
    model = gpt.GPT(tc.model_config(vocab_size=65)).to(device)
    muon = gpt.configure_optimizers(model, tc, device.type)[-1]
    for p in model.parameters():
        p.grad = torch.randn_like(p)

    def in_float32():
        with unittest.mock.patch.object(gpt, "matmul_dtype", lambda device: torch.float32):
            muon.step()

    chosen = dtype_name(gpt.matmul_dtype(device))
    t = interleaved({chosen: muon.step, "float32": in_float32}, device, rounds, repeats=20)
    return dict(step_ms={name: seconds * 1000 for name, seconds in t.items()}, matrices=muon_matrices(muon))


def bench_sampling(device, rounds=3):
    """Tokens/s sampling 200 tokens into a 256 context: with the KV cache, and with a full forward per token."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**SAMPLING, **GPT2_BLOCK)).to(device).eval()
    prompt = torch.randint(0, 65, (1, PROMPT), device=device)

    @torch.no_grad()
    def full_forward():
        idx, gen = prompt, torch.Generator(device).manual_seed(0)
        for _ in range(NEW_TOKENS):
            logits, _ = model(idx[:, -SAMPLING["block_size"]:])
            idx = torch.cat([idx, torch.multinomial(logits[:, -1].softmax(-1), 1, generator=gen)], dim=1)

    t = interleaved({"kv_cache": lambda: model.generate(prompt, NEW_TOKENS), "full_forward": full_forward}, device,
                    rounds, repeats=1, warmup=1)
    return {name: NEW_TOKENS / seconds for name, seconds in t.items()}


def bench_twin(rounds=5):
    """One float32 forward+backward at nanoGPT's CPU-recipe shape: the NumPy twin against PyTorch."""
    config = gpt.GPTConfig(**RECIPE, **GPT2_BLOCK)
    torch.manual_seed(0)
    model = gpt.GPT(config)
    twin = gpt_numpy.GPT(config, {n: p.detach().numpy().copy() for n, p in model.named_parameters()})
    x, y = next(batches(config.block_size, RECIPE_BATCH, torch.device("cpu")))

    def torch_step():
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()

    def twin_step():
        twin.forward(x.numpy(), y.numpy())
        twin.backward()

    t = interleaved({"pytorch": torch_step, "numpy": twin_step}, torch.device("cpu"), rounds, repeats=5)
    return {name: seconds * 1000 for name, seconds in t.items()}


ENCODE = """
import sys, time, tracemalloc
import data
start = time.perf_counter()
ids, chars = data.encode_file(sys.argv[1])
seconds = time.perf_counter() - start
del ids
tracemalloc.start()
ids, chars = data.encode_file(sys.argv[1])
peak = tracemalloc.get_traced_memory()[1]
print(len(ids), ids.dtype, len(chars), seconds, peak)
"""


def bench_encoding(megabytes=100, source="input.txt"):
    """Reading a text of about megabytes MB into token ids, as train.py --data does, in a process of
    its own: MB/s, and the most memory it held at once (the ids included, as tracemalloc counts
    NumPy's arrays and Python's objects), in bytes per character."""
    with open(source, "rb") as f:
        piece = f.read()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "text.txt")
        with open(path, "wb") as f:
            for _ in range(max(1, round(megabytes * 1e6 / len(piece)))):
                f.write(piece)
        size = os.path.getsize(path)
        done = subprocess.run([sys.executable, "-c", ENCODE, path], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    if done.returncode:
        raise ValueError(f"encoding failed: {done.stderr.strip().splitlines()[-1]}")
    chars, dtype, vocab, seconds, peak = done.stdout.split()
    return dict(megabytes=size / 1e6, characters=int(chars), dtype=dtype, vocab_size=int(vocab),
                seconds=float(seconds), mb_per_s=size / 1e6 / float(seconds),
                bytes_per_char=int(peak) / int(chars))


# ------------------------------------------------------------------------------------------------ beside nanoGPT
def load_nanogpt(folder):
    """nanoGPT's model.py, imported from folder at run time: it is timed beside this project, never copied into it."""
    path = os.path.join(folder, "model.py")
    if not os.path.exists(path):
        raise ValueError(f"no model.py in {folder}: pass --nanogpt the folder of nanoGPT's model.py")
    data.check_file(path, "nanoGPT's model.py", "--nanogpt the folder of", 16 << 20)
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        module.GPT, module.GPTConfig
    except (Exception, SystemExit) as e:  # SystemExit: a model.py that calls sys.exit() as it loads
        raise ValueError(f"cannot import GPT and GPTConfig from {path} ({type(e).__name__}: {e})") from None
    return module


class TheirFault(Exception):
    """An error raised inside the other project's GPT: its model.py takes other arguments or returns other things."""


def theirs_runs(fn):
    """fn, a call into the other model.py, with its errors raised as TheirFault; errors of this project's own
    calls stay what they are."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        # Out of memory is the machine's limit, not the other model.py's fault.
        except (torch.OutOfMemoryError, MemoryError):
            raise
        # Any error of its code, an assert or a division by zero too.
        except Exception as e:
            raise TheirFault(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    return call


def versus_nanogpt(nano, device, rounds=5):
    """The same run, interleaved: each project's optimizer step at nanoGPT's CPU-recipe shape (its own forward,
    backward, clipping and AdamW set-up), and each project's generate at nanoGPT's shakespeare_char model: filling a
    256 context from a 56-token prompt, then past a full context. Also the wall time of nanoGPT's recipe here."""
    quiet = contextlib.redirect_stdout(io.StringIO())  # nanoGPT prints its parameter count and optimizer groups
    tc = gpt.TrainConfig(**RECIPE, **GPT2_BLOCK, **RECIPE_OPTIMIZER, batch_size=RECIPE_BATCH, learning_rate=1e-3)
    data = batches(RECIPE["block_size"], RECIPE_BATCH, device, seed=1)
    torch.manual_seed(0)
    with quiet:
        theirs = theirs_runs(lambda: nano.GPT(nano.GPTConfig(**RECIPE, dropout=0.0)).to(device))()
        optimizer = theirs_runs(lambda: theirs.configure_optimizers(tc.weight_decay, tc.learning_rate, (0.9, tc.beta2),
                                                                    device.type))()

    @theirs_runs
    def their_step():  # nanoGPT's train.py, one micro-step per optimizer step, as its recipe has it
        _, loss = theirs(*next(data))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @theirs_runs
    @torch.no_grad()
    def their_eval_batch():  # estimate_loss: model(X, Y) in eval mode
        theirs.eval()
        theirs(*next(data))
        theirs.train()

    step = interleaved({"ours": our_step(gpt.GPTConfig(**RECIPE, **GPT2_BLOCK), tc, device), "nanoGPT": their_step,
                        "nanoGPT eval batch": their_eval_batch}, device, rounds=7, repeats=10)
    torch.manual_seed(0)
    ours_model = gpt.GPT(gpt.GPTConfig(**SAMPLING, **GPT2_BLOCK)).to(device).eval()
    with quiet:
        their_model = theirs_runs(lambda: nano.GPT(nano.GPTConfig(**SAMPLING, dropout=0.0)).to(device).eval())()
    their_generate = theirs_runs(lambda idx, new_tokens: their_model.generate(idx, new_tokens))
    fill, full = (torch.randint(0, 65, (1, n), device=device) for n in (PROMPT, SAMPLING["block_size"]))
    sampling = interleaved({
        ("fill", "ours"): lambda: ours_model.generate(fill, NEW_TOKENS),
        ("fill", "nanoGPT"): lambda: their_generate(fill, NEW_TOKENS),
        ("past", "ours"): lambda: ours_model.generate(full, PAST_TOKENS),
        ("past", "nanoGPT"): lambda: their_generate(full, PAST_TOKENS)}, device, rounds, repeats=1, warmup=1)
    recipe_s = RECIPE_STEPS * step["nanoGPT"] + RECIPE_EVALS * 2 * RECIPE_EVAL_ITERS * step["nanoGPT eval batch"]
    return dict(step_ms={"ours": step["ours"] * 1000, "nanoGPT": step["nanoGPT"] * 1000},
                eval_batch_ms=step["nanoGPT eval batch"] * 1000, recipe_seconds=recipe_s,
                fill_tokens_per_s={who: NEW_TOKENS / sampling["fill", who] for who in ("ours", "nanoGPT")},
                past_tokens_per_s={who: PAST_TOKENS / sampling["past", who] for who in ("ours", "nanoGPT")})


def decode_step(device, context=150):
    """One token sampled with the KV cache at nanoGPT's shakespeare_char model, after context or more
    cached positions: a full cache starts again from context cached ones."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**SAMPLING, **GPT2_BLOCK)).to(device).eval()
    cache = gpt.KVCache(model.config)
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    prompt = torch.randint(0, 65, (1, context), device=device)

    @torch.inference_mode()
    def step():
        if cache.pos in (0, model.config.block_size):
            cache.pos = 0
            model(prompt, cache=cache)
        model(token, cache=cache)

    return step


# ------------------------------------------------------------------------------------------- where the time goes
def stacked_heads(attn, x, rope=None):
    """CausalSelfAttention.heads as one product of the three weights stacked: the same q, k and v, a copy of the
    weights each call."""
    maps = (attn.c_q, attn.c_k, attn.c_v)
    bias = None if attn.c_q.bias is None else torch.cat([m.bias for m in maps])
    qkv = torch.nn.functional.linear(x, torch.cat([m.weight for m in maps]), bias)  # (B, T, 3 * C)
    q, k, v = (t.unflatten(-1, (attn.n_head, -1)).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    if rope is None:
        return q, k, v
    return gpt.rope_forward(q, *rope), gpt.rope_forward(k, *rope), v


def with_stacked_heads(fn):
    """fn, run with the attention's three maps taken in one stacked product."""
    def run():
        real = gpt.CausalSelfAttention.heads
        gpt.CausalSelfAttention.heads = stacked_heads
        try:
            return fn()
        finally:
            gpt.CausalSelfAttention.heads = real
    return run


def bench_maps(device, rounds=7, repeats=8):
    """ms per training step at the default CPU shape and at nanoGPT's, and per cached decode step, with the plain maps
    (q = c_q(x), ...) and with the three maps in one stacked product, interleaved in one run."""
    default = gpt.TrainConfig()
    recipe = gpt.TrainConfig(**RECIPE, **GPT2_BLOCK, **RECIPE_OPTIMIZER, batch_size=RECIPE_BATCH)
    steps = {"training step, default CPU shape": our_step(default.model_config(vocab_size=65), default, device),
             "training step, nanoGPT CPU-recipe shape": our_step(recipe.model_config(vocab_size=65), recipe, device),
             f"cached decode step, {shape(SAMPLING)}": decode_step(device)}
    fns = {}
    for name, step in steps.items():
        fns[name, "plain"] = step
        fns[name, "stacked"] = with_stacked_heads(step)
    t = interleaved(fns, device, rounds, repeats)
    return [dict(name=name, plain_ms=t[name, "plain"] * 1000, stacked_ms=t[name, "stacked"] * 1000) for name in steps]


def profile_steps(device, steps=20, rows=8):
    """The ops that take the most time in training steps at nanoGPT's CPU-recipe shape and at the default one, and in
    decode steps with the KV cache: {what: [(op, ms per step, share of the step)]}, from torch.profiler's self time."""
    recipe = gpt.TrainConfig(batch_size=RECIPE_BATCH, **RECIPE_OPTIMIZER)
    runs = {"training, nanoGPT CPU-recipe shape": our_step(gpt.GPTConfig(**RECIPE, **GPT2_BLOCK), recipe, device),
            "training, default CPU": our_step(gpt.GPTConfig(), gpt.TrainConfig(), device),
            f"sampling, a token after 150 with the KV cache ({shape(SAMPLING)})": decode_step(device)}
    tables = {}
    for name, step in runs.items():
        for _ in range(3):
            step()
        with torch.profiler.profile() as prof:
            for _ in range(steps):
                step()
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in ops)
        tables[name] = [(e.key, e.self_cpu_time_total / steps / 1000, e.self_cpu_time_total / total)
                        for e in ops[:rows]]
    return tables


def weight_reads(device, rounds=7):
    """GB/s at which the one-row matmuls of a cached decode step read the sampling model's weights, the same with the
    weights laid out (in, out) in memory as GPT-2's files store them, and a sum over the same tensors: how
    near the step's matmuls come to the speed of this machine's memory."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**SAMPLING, **GPT2_BLOCK)).to(device)
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    rows = {n: torch.randn(1, n, device=device) for n in {w.size(1) for w in weights}}  # one token's input
    # The same shapes, (out, in), laid out (in, out) in memory, as GPT-2's files store them.
    transposed = [w.t().contiguous().t() for w in weights]

    def matmuls():
        for w in weights:
            torch.nn.functional.linear(rows[w.size(1)], w)

    def transposed_matmuls():
        for w in transposed:
            torch.nn.functional.linear(rows[w.size(1)], w)

    def sums():
        for w in weights:
            w.sum()

    t = interleaved({"one-row matmuls": matmuls, "one-row matmuls, (in, out) in memory": transposed_matmuls,
                     "sums": sums}, device, rounds, repeats=10)
    size = sum(w.numel() * w.element_size() for w in weights)
    return dict(megabytes=size / 1e6, **{name: size / seconds / 1e9 for name, seconds in t.items()})


def versus_transformers(rounds=3, prompt_tokens=16, new_tokens=32):
    """Greedy sampling at GPT-2 small's shape (random weights, float32, CPU): gpt2.from_state_dict of
    transformers' own GPT2LMHeadModel, the same weights copied into nn.Linear's own order in memory,
    and that model's generate with its KV cache, in tokens per second, interleaved; and whether all
    drew the same tokens."""
    try:
        import transformers
    except ImportError:
        raise ValueError("--gpt2 times transformers' generate, and transformers is not installed: "
                         "pip install transformers") from None
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = gpt2.from_state_dict(theirs.state_dict()).eval()
    # The same weights copied into nn.Linear's own (out, in) order in memory, as load_state_dict copies them.
    copied = gpt.GPT(ours.config).eval()
    copied.load_state_dict(ours.state_dict())
    prompt = torch.randint(0, 50257, (1, prompt_tokens))
    drawn = {}

    def our_generate():
        drawn["ours"] = ours.generate(prompt, new_tokens, temperature=0)

    def copied_generate():
        drawn["copied"] = copied.generate(prompt, new_tokens, temperature=0)

    @torch.inference_mode()
    def their_generate():
        drawn["transformers"] = theirs.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                do_sample=False, use_cache=True, pad_token_id=0)

    t = interleaved({"ours": our_generate, "copied": copied_generate, "transformers": their_generate},
                    torch.device("cpu"), rounds, repeats=1, warmup=1)
    same = torch.equal(drawn["ours"], drawn["transformers"]) and torch.equal(drawn["copied"], drawn["ours"])
    return dict(tokens_per_s={who: new_tokens / seconds for who, seconds in t.items()},
                same_tokens=same, transformers=transformers.__version__, new_tokens=new_tokens)


# ------------------------------------------------------------------------------------------- the settings harness
@dataclasses.dataclass(frozen=True)
class Setting:
    """A run of the default config as train.py trains it, changed as these fields say."""
    changes: dict = dataclasses.field(default_factory=dict)  # TrainConfig options
    model: object = None  # builds the model from its GPTConfig; None: gpt.GPT, as gpt.Trainer builds it
    lr_at: object = None  # the learning rate's schedule, in place of gpt.lr_at
    train_py: bool = False  # trained by train.run, train.py's own path, not by gpt.Trainer alone
    compile: bool = False  # the step through torch.compile, its compiling on the run's clock
    matmul_dtype: torch.dtype = None  # Muon's products in this dtype, in place of gpt.matmul_dtype's choice
    ns_steps: int = None  # Newton-Schulz iterations a Muon step, in place of gpt.newton_schulz's
    newton_schulz: object = None  # (G) -> G nearly orthogonal, in place of gpt.newton_schulz
    optimizers: object = None  # (model, tc, device_type) -> optimizers, in place of gpt.configure_optimizers
    autocast: object = None  # (device) -> the autocast the steps and evaluations run under, in place of gpt.autocast
    windows: object = None  # (tc, share of the run done) -> a step's (rows, context), in place of short_context's
    batch: object = None  # (trainer, split) -> (x, y), in place of gpt.Trainer.batch


@contextlib.contextmanager
def patched(setting, device="cpu"):
    """gpt.py's schedule, Newton-Schulz iterations, optimizers, batches, autocast and Muon's dtype as setting changes
    them; put back after."""
    # This machine's autocast on device, made before Muon's dtype is patched, which gpt.autocast follows: a setting
    # of Muon's products changes them alone.
    machines = gpt.autocast(torch.device(device))
    with contextlib.ExitStack() as stack:
        if setting.lr_at:
            stack.enter_context(unittest.mock.patch.object(gpt, "lr_at", setting.lr_at))
        if setting.ns_steps:
            fewer = functools.partial(gpt.newton_schulz, steps=setting.ns_steps)
            stack.enter_context(unittest.mock.patch.object(gpt, "newton_schulz", fewer))
        if setting.newton_schulz:
            stack.enter_context(unittest.mock.patch.object(gpt, "newton_schulz", setting.newton_schulz))
        if setting.optimizers:
            stack.enter_context(unittest.mock.patch.object(gpt, "configure_optimizers", setting.optimizers))
        if setting.matmul_dtype:
            stack.enter_context(unittest.mock.patch.object(gpt, "matmul_dtype", lambda device: setting.matmul_dtype))
            stack.enter_context(unittest.mock.patch.object(gpt, "autocast", lambda device: machines))
        if setting.autocast:
            stack.enter_context(unittest.mock.patch.object(gpt, "autocast", setting.autocast))
        if setting.windows:
            stack.enter_context(unittest.mock.patch.object(gpt.Trainer, "batch", windows_batch(setting.windows)))
        if setting.batch:
            stack.enter_context(unittest.mock.patch.object(gpt.Trainer, "batch", setting.batch))
        yield


def vocab_size_of(ids, tokenizer):
    """The vocabulary of a text's tokenizer, or the one token ids imply (a .bin file comes without a tokenizer)."""
    return tokenizer.vocab_size if tokenizer else data.implied_vocab_size(ids)


def trainer_of(setting, tc, ids, tokenizer, vocab_size):
    """The gpt.Trainer of tc on ids, with setting's model and compiled step."""
    model = None
    if setting.model:
        torch.manual_seed(tc.seed)  # as gpt.Trainer seeds before it builds the default model
        model = setting.model(tc.model_config(vocab_size=vocab_size))
    trainer = gpt.Trainer(tc, ids, tokenizer, model, log=lambda *args: None)
    if setting.compile:
        torch._dynamo.reset()
        trainer.wrapped_model = torch.compile(trainer.model)
    return trainer


def train_setting(setting, seconds, ids, tokenizer, device="cpu", on_step=None, **changes):
    """The default run, as train.py trains it, changed as setting says (and by changes), for `seconds` of wall time
    on ids, on_step(trainer) after each step; (the gpt.Trainer, its figures: steps, steps a second, Muon's products'
    dtype and its val loss on the whole held-out split, read in float32 whatever autocast its steps took)."""
    vocab_size = vocab_size_of(ids, tokenizer)
    run = dict(out_dir="", max_iters=gpt.MANY, max_time=seconds, eval_interval=gpt.MANY, eval_iters=1,
               device=str(device), vocab_size=vocab_size)
    tc = gpt.TrainConfig(**{**run, **changes, **setting.changes})
    # train.py's checks of the data, before minutes of training.
    data.check_fits(ids, vocab_size, tc.block_size)
    with patched(setting, device):
        if setting.train_py:
            trainer, _ = train.run(tc, ids, log=lambda *args: None, compile=setting.compile,
                                   given={"vocab_size": vocab_size})
        else:
            trainer = trainer_of(setting, tc, ids, tokenizer, vocab_size)
            for _ in trainer.steps():
                if on_step:
                    on_step(trainer)
        products = "no Muon"
        if any(isinstance(optimizer, gpt.Muon) for optimizer in trainer.optimizers):
            products = dtype_name(gpt.matmul_dtype(trainer.device))
    # The last evaluation read it under the setting's own autocast: read again in float32, every setting alike.
    val_loss = gpt.split_loss(trainer.model.eval(), trainer.splits["val"][:gpt.MAX_EVAL_TOKENS], tc.batch_size)
    return trainer, dict(iters=trainer.it, seconds=trainer.elapsed, steps_per_s=trainer.it / trainer.elapsed,
                         ms_per_iter=trainer.elapsed / trainer.it * 1000, products=products, val_loss=val_loss)


def compare(settings, seconds, path, rounds, device="cpu", log=functools.partial(print, flush=True), steps=None,
            dtype=None, **changes):
    """Each of settings {name: Setting} trained for `seconds` on the text (or ids) at path, one after the other,
    `rounds` times; [{round, setting, and train_setting's figures}], each logged as it ends. With steps, each trains
    that many steps instead, round r from seed + r - 1: equal steps, which a drifting machine cannot blur. dtype: the
    ids' type in a .bin, as train.py --dtype."""
    ids, tokenizer = data.read_data(data.DataFile(path, dtype))
    # The first step in a process pays for setting torch up: taken here, untimed, it falls on no setting.
    tiny = gpt.TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=2)
    our_step(tiny.model_config(vocab_size=65), tiny, torch.device(device))()
    names = list(settings)
    width = max(map(len, names))
    rows = []
    first_seed = changes.get("seed", gpt.TrainConfig.seed)
    for r in range(1, rounds + 1):
        if steps:
            changes = {**changes, "max_iters": steps, "max_time": 0.0, "seed": first_seed + r - 1}
        # Every other round in reverse order: a machine whose speed drifts favours no setting.
        for name in names if r % 2 else names[::-1]:
            _, run = train_setting(settings[name], seconds, ids, tokenizer, device, **changes)
            rows.append(dict(round=r, setting=name, **run))
            log(f"  round {r} {name:{width}s} {run['iters']:6d} steps {run['steps_per_s']:6.2f} steps/s  Muon's "
                f"products {run['products']:8s}  val loss {run['val_loss']:.4f}")
    return rows


def summary(rows):
    """A line for each setting of compare's rows: its mean val loss and the median of its steps a second over the
    rounds, and, after the first setting, its mean minus the first's."""
    names = list(dict.fromkeys(row["setting"] for row in rows))
    width = max(map(len, names))
    mean = {name: statistics.mean(row["val_loss"] for row in rows if row["setting"] == name) for name in names}
    lines = []
    for name in names:
        rate = statistics.median(row["steps_per_s"] for row in rows if row["setting"] == name)
        products = next(row["products"] for row in rows if row["setting"] == name)
        line = f"  {name:{width}s} {rate:6.2f} steps/s  Muon's products {products:8s}  mean val loss {mean[name]:.4f}"
        if name != names[0]:
            line += f", minus {names[0]}'s {mean[name] - mean[names[0]]:+.4f}"
        lines.append(line)
    return lines


def cosine_lr(tc, it, elapsed):
    """gpt.lr_at's warmup, then a cosine to min_lr over the steps, or the seconds with max_time: nanoGPT's
    schedule."""
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / tc.warmup_iters
    done = (elapsed / tc.max_time if tc.max_time
            else (it - tc.warmup_iters) / max(1, tc.max_iters - tc.warmup_iters))
    return tc.min_lr + (1 + math.cos(math.pi * min(done, 1.0))) / 2 * (tc.learning_rate - tc.min_lr)


def cooldown_over(share):
    """gpt.lr_at with its straight line down to min_lr over the last `share` of the run, not 60%."""
    def lr_at(tc, it, elapsed):
        if it < tc.warmup_iters:
            return tc.learning_rate * (it + 1) / tc.warmup_iters
        cooldown = min(1.0, max(0.0, (1 - gpt.progress(tc, it, elapsed)) / share))
        return tc.min_lr + cooldown * (tc.learning_rate - tc.min_lr)
    return lr_at


def sqrt_cooldown(tc, it, elapsed):
    """gpt.lr_at with its last 60% falling as 1 - sqrt(w) of the cooldown's share w gone, not 1 - w: down fast
    from the peak, then long near the end's rate (Hagele et al. 2024, beside the straight line)."""
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / tc.warmup_iters
    gone = min(1.0, max(0.0, (gpt.progress(tc, it, elapsed) - 0.4) / 0.6))
    return tc.min_lr + (1 - math.sqrt(gone)) * (tc.learning_rate - tc.min_lr)


def read_windows(trainer, split, ix, T):
    """The batch (x, y), each (B, T), of the windows of split that start at ix (B, 1), as gpt.Trainer.batch reads
    them."""
    xy = torch.as_tensor(trainer.splits[split][ix + torch.arange(T + 1)]).long().to(trainer.device)  # (B, T + 1)
    return xy[:, :-1], xy[:, 1:]


def windows_batch(windows):
    """gpt.Trainer.batch with each step's rows and context from windows(tc, share of the run done)."""
    def batch(trainer, split):
        B, T = windows(trainer.tc, gpt.progress(trainer.tc, trainer.it, trainer.elapsed))
        ix = torch.randint(len(trainer.splits[split]) - T, (B, 1), generator=trainer.generator)
        return read_windows(trainer, split, ix, T)
    return batch


def context_halved_before(*shares):
    """Windows whose context halves once for each of shares the run has not reached, in as many more rows as keep
    the tokens a step: (short_context) is gpt.Trainer.batch's own."""
    def windows(tc, done):
        T = tc.block_size
        for share in shares:
            if done < share:
                T = max(1, T // 2)
        return tc.batch_size * tc.block_size // T, T
    return windows


def half_the_rows_first(tc, done):
    """The default's windows, with half of its rows a step over the first 20% of the run: a smaller batch while
    the model learns fastest."""
    B, T = context_halved_before(tc.short_context)(tc, done)
    if done < 0.2:
        B = max(1, B // 2)
    return B, T


def whole_windows_first(share):
    """The default's windows with the whole context over the first share of the run too: half the context from
    there until short_context, then the whole again. The model reads windows of its whole context from the start,
    as nanoGPT's loss is measured, before the short windows teach it faster."""
    def windows(tc, done):
        if done < share:
            return tc.batch_size, tc.block_size
        return context_halved_before(tc.short_context)(tc, done)
    return windows


def relu_squared(config):
    """The MLP as nanochat and modded-nanogpt have it: two matrices, 4 * n_embd wide, relu(x)^2 between."""
    model = gpt.GPT(dataclasses.replace(config, mlp="gelu"))
    for block in model.h:
        mlp = block.mlp
        mlp.forward = lambda x, mlp=mlp: torch.nn.functional.dropout(
            mlp.c_proj(torch.relu(mlp.c_fc(x)).square()), mlp.dropout, mlp.training)
    return model


def qk_norm(config):
    """RMSNorm of each head's query and key, without a gain, after their maps and before the rotary turn: QK-norm.
    A rotation keeps a vector's norm, so norming after gpt.py's turn is the same."""
    model = gpt.GPT(config)
    for block in model.h:
        block.attn.heads = functools.partial(normed_heads, block.attn)
    return model


def normed_heads(attn, x, rope=None):
    """The queries, keys and values of gpt.CausalSelfAttention.heads, the queries and keys RMS-normed."""
    q, k, v = gpt.CausalSelfAttention.heads(attn, x, rope)
    rms = functools.partial(torch.nn.functional.rms_norm, normalized_shape=q.shape[-1:], eps=1e-5)
    return rms(q), rms(k), v


def qk_norm_gains(config):
    """QK-norm as OLMo 2 and Qwen3 have it: an RMSNorm with a learned gain a channel of the head, on each query and
    key before the rotary turn; the gains let the attention grow sharper than unit-RMS queries and keys would."""
    model = gpt.GPT(config)
    hs = config.n_embd // config.n_head
    for block in model.h:
        block.attn.q_norm = torch.nn.RMSNorm(hs, eps=1e-5)
        block.attn.k_norm = torch.nn.RMSNorm(hs, eps=1e-5)
        block.attn.heads = functools.partial(gained_heads, block.attn)
    return model


def gained_heads(attn, x, rope=None):
    """gpt.CausalSelfAttention.heads with the queries and keys normed by attn's q_norm and k_norm, then turned."""
    q, k, v = gpt.CausalSelfAttention.heads(attn, x)
    # In float32, as the attention reads them: under bfloat16 autocast the maps give bfloat16, the gains are float32.
    q, k = attn.q_norm(q.float()), attn.k_norm(k.float())
    if rope is None:
        return q, k, v
    return gpt.rope_forward(q, *rope), gpt.rope_forward(k, *rope), v


def gated_attention(config):
    """Each head's output gated by a sigmoid of the attention's input (the normed stream), a gate a channel
    (Qwen3-Next's gated attention): a head can say nothing where it has nothing to add. One more matrix a block, a
    Muon matrix like the maps, with PyTorch's own init of a Linear (uniform within 1/sqrt(n_embd))."""
    model = gpt.GPT(config)
    for block in model.h:
        block.attn.head_gate = torch.nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        block.attn.forward = functools.partial(gated_forward, block.attn)
    return model


def gated_forward(attn, x, rope=None, cache=None):
    """gpt.CausalSelfAttention.forward with the heads' output, before c_proj, times sigmoid(head_gate(x))."""
    q, k, v = attn.heads(x, rope)
    if cache is not None:
        k, v = cache.update(attn.layer_idx, k, v)
    dropout = attn.dropout if attn.training else 0.0
    with torch.autocast("cpu", enabled=False):
        q, k, v = q.to(x.dtype), k.to(x.dtype), v.to(x.dtype)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=q.size(2) > 1)
    y = y.transpose(1, 2).flatten(2)  # (B, T, C)
    y = attn.c_proj(y * torch.sigmoid(attn.head_gate(x)))
    return torch.nn.functional.dropout(y, attn.dropout, attn.training)


def value_residual(config):
    """Each block after the first mixes the first block's values into its own, v = a v + b v_first, a and b learned
    a block from 1/2 each: every layer keeps a path to the tokens' own content (value residual learning, Zhou et al.
    2024, in modded-nanogpt's records). Two numbers a block, with AdamW's other vectors."""
    model = gpt.GPT(config)
    first = {}  # the first block's values of the forward under way
    for block in model.h:
        if block.attn.layer_idx:
            block.attn.value_mix = torch.nn.Parameter(torch.full((2,), 0.5))
        block.attn.heads = functools.partial(mixed_heads, block.attn, first)
    return model


def mixed_heads(attn, first, x, rope=None):
    """gpt.CausalSelfAttention.heads, the values mixed with the first block's (kept in first by that block)."""
    q, k, v = gpt.CausalSelfAttention.heads(attn, x, rope)
    if attn.layer_idx == 0:
        first["v"] = v
        return q, k, v
    a, b = attn.value_mix
    return q, k, a * v + b * first["v"]


def epochs_batch(trainer, split):
    """gpt.Trainer.batch drawing its windows without replacement: the split cut into windows of the step's
    context from a random offset, shuffled, each read once before any is read again (the last of a pass, fewer
    than a batch, are left out)."""
    tc = trainer.tc
    B, T = context_halved_before(tc.short_context)(tc, gpt.progress(tc, trainer.it, trainer.elapsed))
    # The windows each context has left this pass, kept on the trainer: every run starts a pass of its own.
    unread = trainer.__dict__.setdefault("unread", {})
    starts = unread.get((split, T), [])
    if len(starts) < B:
        offset = int(torch.randint(T, (1,), generator=trainer.generator))
        count = (len(trainer.splits[split]) - 1 - offset) // T
        starts = (torch.randperm(count, generator=trainer.generator) * T + offset).tolist()
    unread[(split, T)] = starts[B:]
    return read_windows(trainer, split, torch.tensor(starts[:B]).view(B, 1), T)


def zero_c_proj(config):
    """The output projections of the attention and the MLP start at zero: each block starts as the identity."""
    model = gpt.GPT(config)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            torch.nn.init.zeros_(p)
    return model


class TrigramGPT(gpt.GPT):
    """The default model with a second table beside the bigram one: a vector for each triple (the token two
    before, the one before, the token), its number modulo the rows; zero at first, as the bigram table is. For
    training and evaluation (a cache would need the two last tokens)."""

    def __init__(self, config, rows=16384):
        super().__init__(config)
        self.trigram = torch.nn.Embedding(rows, config.n_embd)
        torch.nn.init.zeros_(self.trigram.weight)

    def embed(self, idx, start=0, cache=None):
        x, rope = super().embed(idx, start, cache)
        v = self.config.vocab_size
        before = torch.nn.functional.pad(idx, (1, 0), value=-1)[:, :-1].long()  # (B, T)
        two_before = torch.nn.functional.pad(idx, (2, 0), value=-1)[:, :-2].long()  # (B, T)
        triples = (two_before * v + before) * v + idx
        return x + self.trigram(triples % self.trigram.num_embeddings), rope


def zero_head(config):
    """The output layer starts at zero: every token equally likely, until it learns otherwise."""
    model = gpt.GPT(config)
    torch.nn.init.zeros_(model.lm_head.weight)
    return model


def wider_init(blocks=None, embedding=None):
    """(config) -> the default model with each block's matrices at std blocks / sqrt(inputs) in place of 0.02 (the
    outputs added to the stream scaled down as gpt.py scales them) and the embedding at std embedding, each where given:
    a Muon update has the size its rate gives it whatever the weights' size, so the start sets how far the first
    updates turn a matrix (nanochat starts its matrices at 1 / sqrt(inputs), its embedding at 1)."""

    def build(config):
        model = gpt.GPT(config)
        for name, p in model.h.named_parameters():
            if blocks is not None and p.dim() == 2:
                scale = 1 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 1.0
                torch.nn.init.normal_(p, std=scale * blocks / math.sqrt(p.size(1)))
        if embedding is not None:
            torch.nn.init.normal_(model.wte.weight, std=embedding)
        return model

    return build


def mlp_wide(ratio):
    """(config) -> the default model with each MLP ratio * n_embd wide, in place of SwiGLU's 8/3 * n_embd rounded up to
    a multiple of 64: fewer units make a step cheaper (its MLP is two thirds of the products), more hold more."""

    def build(config):
        model = gpt.GPT(config)
        hidden = round(ratio * config.n_embd)
        for block in model.h:
            block.mlp.c_fc = torch.nn.Linear(config.n_embd, hidden, bias=config.bias)
            block.mlp.c_gate = torch.nn.Linear(config.n_embd, hidden, bias=config.bias)
            block.mlp.c_proj = torch.nn.Linear(hidden, config.n_embd, bias=config.bias)
        model.init_weights()
        return model

    return build


def norms_without_gains(config):
    """The default model with every RMSNorm without its learned gain, as modded-nanogpt has them: the matrices after
    each norm scale what they read."""
    model = gpt.GPT(config)
    for block in model.h:
        block.ln_1 = torch.nn.RMSNorm(config.n_embd, eps=1e-5, elementwise_affine=False)
        block.ln_2 = torch.nn.RMSNorm(config.n_embd, eps=1e-5, elementwise_affine=False)
    model.ln_f = torch.nn.RMSNorm(config.n_embd, eps=1e-5, elementwise_affine=False)
    return model


class X0Block(torch.nn.Module):
    """A block whose input mixes the residual stream with x0, the token embedding, by two learned weights that
    start at (1, 0): the block as it is, until the embedding proves worth reading again (modded-nanogpt's)."""

    def __init__(self, block, x0):
        super().__init__()
        self.block = block
        self.x0 = x0
        self.lambdas = torch.nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(self, x, rope=None, cache=None):
        return self.block(self.lambdas[0] * x + self.lambdas[1] * self.x0["x"], rope, cache)


def x0_shortcut(config):
    """The token embedding, kept as wte computes it, mixed into every block's input (X0Block)."""
    model = gpt.GPT(config)
    x0 = {}
    model.wte.register_forward_hook(lambda module, args, out: x0.update(x=out))
    model.h = torch.nn.ModuleList(X0Block(block, x0) for block in model.h)
    return model


class SmearGPT(gpt.GPT):
    """The default model with each position's input given a gated share of the position before it, x_t + lam *
    sigmoid(gate(x_t's first 12 channels)) * x_(t-1) (modded-nanogpt's smear gate): what a token was, at once in
    reach of the next. lam learned from 0, so it starts as the default model. For training and evaluation (a cache
    would need the input before)."""

    def __init__(self, config):
        super().__init__(config)
        self.smear_gate = torch.nn.Linear(min(12, config.n_embd), 1, bias=False)
        self.smear_lambda = torch.nn.Parameter(torch.zeros(()))

    def embed(self, idx, start=0, cache=None):
        x, rope = super().embed(idx, start, cache)
        gate = self.smear_lambda * torch.sigmoid(self.smear_gate(x[:, 1:, :self.smear_gate.in_features]))
        return torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1), rope  # (B, T, C)


def backout(config):
    """The stream as the first two thirds of the blocks leave it, times a learned lam from 0, taken from the stream
    before the final norm (modded-nanogpt's backout): the last blocks' own word can outweigh what the early ones
    wrote for their successors. One number, with AdamW's other vectors."""
    model = gpt.GPT(config)
    model.backout_lambda = torch.nn.Parameter(torch.zeros(()))
    kept = {}
    model.h[max(1, 2 * config.n_layer // 3) - 1].register_forward_hook(lambda block, args, out: kept.update(x=out))
    model.ln_f.register_forward_pre_hook(lambda norm, args: (args[0] - model.backout_lambda * kept["x"],))
    return model


class SoftcapHead(torch.nn.Linear):
    """The output layer with its logits squashed into (-cap, cap) by cap * tanh(logits / cap): no logit can run
    far ahead of the others (Gemma 2's and modded-nanogpt's soft-capping)."""

    def __init__(self, head, cap):
        super().__init__(head.in_features, head.out_features, bias=False)
        self.weight = head.weight
        self.cap = cap

    def forward(self, x):
        return self.cap * torch.tanh(super().forward(x) / self.cap)


def softcapped(config, cap=15.0):
    """The default model with its logits soft-capped at cap (SoftcapHead)."""
    model = gpt.GPT(config)
    model.lm_head = SoftcapHead(model.lm_head, cap)
    return model


class ValueEmbeddingGPT(gpt.GPT):
    """The default model with a table of vectors per block, one row per token, added to that block's attention
    values (modded-nanogpt's value embeddings); zero at first, so it starts as the default model. The tables sit
    outside the blocks, so AdamW steps them as it steps the other tables. For training and evaluation."""

    def __init__(self, config):
        super().__init__(config)
        self.value_embeds = torch.nn.ModuleList(torch.nn.Embedding(config.vocab_size, config.n_embd) for _ in self.h)
        for block, table in zip(self.h, self.value_embeds):
            torch.nn.init.zeros_(table.weight)
            block.attn.heads = functools.partial(self.heads_with_values, block.attn, table)

    def embed(self, idx, start=0, cache=None):
        self.idx = idx  # the ids whose values the blocks' attention reads
        return super().embed(idx, start, cache)

    def heads_with_values(self, attn, table, x, rope=None):
        q, k, v = gpt.CausalSelfAttention.heads(attn, x, rope)
        B, T, _ = x.shape
        return q, k, v + table(self.idx).view(B, T, attn.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)


class PairLogitsGPT(gpt.GPT):
    """The default model with a second table of token pairs (the token before, the token), read out at the output:
    each pair's row, vocab_size wide, added to the logits of the next token, so that what a trigram model knows
    reaches the output without the blocks; zero at first. For training and evaluation (a cache would need the
    pairs)."""

    def __init__(self, config):
        super().__init__(config)
        self.pair_logits = torch.nn.Embedding(config.bigram, config.vocab_size)
        torch.nn.init.zeros_(self.pair_logits.weight)
        head = self.lm_head
        self.lm_head = PairLogitsHead(head, self)

    def embed(self, idx, start=0, cache=None):
        before = torch.nn.functional.pad(idx, (1, 0), value=-1)[:, :-1]  # (B, T)
        self.pairs = (before.long() * self.config.vocab_size + idx) % self.config.bigram
        return super().embed(idx, start, cache)


class PairLogitsHead(torch.nn.Linear):
    """The output layer, plus the pair table's row of each position (PairLogitsGPT)."""

    def __init__(self, head, model):
        super().__init__(head.in_features, head.out_features, bias=False)
        self.weight = head.weight
        self.model = [model]  # in a list, so that the model is not a submodule of its own head

    def forward(self, x):
        model = self.model[0]
        return super().forward(x) + model.pair_logits(model.pairs)


# gpt.py's own optimizers, which a Setting's optimizers stands in for while its run trains.
CONFIGURE_OPTIMIZERS = gpt.configure_optimizers


def own_rate(name, lr):
    """gpt.configure_optimizers, with the model's weight `name` (lm_head, bigram) in an AdamW group of its own at
    peak rate lr."""
    def configure(model, tc, device_type="cpu"):
        optimizers = CONFIGURE_OPTIMIZERS(model, tc, device_type)
        weight = getattr(model, name).weight
        for group in optimizers[0].param_groups:
            group["params"] = [p for p in group["params"] if p is not weight]
        optimizers[0].add_param_group({"params": [weight], "lr": lr, "weight_decay": tc.weight_decay})
        return optimizers
    return configure


def adamw_beta1(beta1):
    """gpt.configure_optimizers, with AdamW's momentum beta1 in place of 0.9: a shorter memory of its gradients."""
    def configure(model, tc, device_type="cpu"):
        optimizers = CONFIGURE_OPTIMIZERS(model, tc, device_type)
        for group in optimizers[0].param_groups:
            group["betas"] = (beta1, tc.beta2)
        return optimizers
    return configure


class NorMuon(gpt.Muon):
    """gpt.Muon with each row of an orthogonalised update (a neuron's weights in) divided by the root of a running
    mean of its squares, then the whole update scaled back to its norm before: NorMuon (Li et al., 2025), which
    evens out the rows' steps that orthogonalising leaves uneven. beta2 weighs the running mean."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.0, beta2=0.95):
        super().__init__(params, lr, momentum, weight_decay)
        for group in self.param_groups:
            group["beta2"] = beta2

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            by_shape = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                if "row_squares" not in state:
                    state["row_squares"] = p.new_zeros(p.size(0), 1)
                state["momentum_buffer"].lerp_(p.grad, 1 - group["momentum"])
                by_shape.setdefault(p.shape, []).append((p, p.grad.lerp(state["momentum_buffer"], group["momentum"])))
            for pairs in by_shape.values():
                updates = gpt.newton_schulz(torch.stack([u for _, u in pairs])).float()  # (n, rows, cols)
                for (p, _), update in zip(pairs, updates):
                    squares = self.state[p]["row_squares"]
                    squares.lerp_(update.square().mean(dim=1, keepdim=True), 1 - group["beta2"])
                    normed = update / squares.sqrt().clamp(min=1e-10)
                    normed *= update.norm() / normed.norm().clamp(min=1e-10)
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(normed, alpha=-group["lr"] * math.sqrt(max(1, p.size(0) / p.size(1))))


class PlainOptimizer:
    """Weights in groups, each group's options beside them, a state for each weight, saved as torch.optim saves its
    states, without torch.optim.Optimizer: its first use imports torch._dynamo, about 70 MB of a process's memory.
    No load_state_dict: a run with these cannot --resume."""

    def __init__(self, groups, **defaults):
        self.param_groups = [{**defaults, **group} for group in groups]
        self.state = collections.defaultdict(dict)

    def state_dict(self):
        number = {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        groups = [{**group, "params": [number[id(p)] for p in group["params"]]} for group in self.param_groups]
        return {"state": {number[id(p)]: state for p, state in self.state.items()}, "param_groups": groups}


class PlainAdamW(PlainOptimizer):
    """torch.optim.AdamW(fused=True)'s step, its own kernel, called on each group's weights that have a gradient."""

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            # A group with none (the embedding's, where it is tied to the head) has no step to take.
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p] = dict(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                         exp_avg_sq=torch.zeros_like(p))
            states = [self.state[p] for p in params]
            steps = [state["step"] for state in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adamw_(params, [p.grad for p in params], [state["exp_avg"] for state in states],
                                [state["exp_avg_sq"] for state in states], [], steps, lr=group["lr"], beta1=beta1,
                                beta2=beta2, weight_decay=group["weight_decay"], eps=1e-8, amsgrad=False,
                                maximize=False)


class PlainMuon(PlainOptimizer):
    """gpt.Muon's step on a PlainOptimizer."""
    step = gpt.Muon.step


def plain_optimizers(model, tc, device_type="cpu"):
    """gpt.configure_optimizers' groups, rates and steps (on a CPU, where its AdamW is the fused one), in
    PlainAdamW and PlainMuon: the same run, without torch._dynamo in memory. Its groups are made again here, as
    gpt.configure_optimizers makes them (a test holds the two alike): asking it would make a torch.optim one."""
    if device_type != "cpu":
        raise ValueError("plain_optimizers stands in for the CPU's fused AdamW: train on cpu")
    blocks = [p for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2]
    muon = blocks if tc.optimizer == "muon" else []
    embedding = [] if model.config.tie_weights else [model.wte.weight]
    apart = set(map(id, muon + embedding))
    groups = [{"params": embedding, "lr": tc.embedding_lr, "weight_decay": tc.weight_decay},
              {"params": [p for p in model.parameters() if p.dim() >= 2 and id(p) not in apart],
               "weight_decay": tc.weight_decay},
              {"params": [p for p in model.parameters() if p.dim() < 2]}]
    optimizers = [PlainAdamW(groups, lr=tc.learning_rate, betas=(0.9, tc.beta2), weight_decay=0.0)]
    if muon:
        optimizers.append(PlainMuon([{"params": muon}], lr=tc.muon_lr, momentum=tc.muon_momentum,
                                    weight_decay=tc.weight_decay))
    return optimizers


# The Polar Express's (a, b, c) for each of five iterations, a polynomial of its own each, fitted so that every
# singular value ends near 1 (Amsel, Persson, Musco and Gower, 2025, arXiv:2505.16932; with its 2% safety margin).
POLAR_EXPRESS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                 (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                 (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                 (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                 (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))


def polar_express(G):
    """gpt.newton_schulz with the Polar Express's coefficients, one (a, b, c) an iteration: each singular value s
    becomes a s + b s^3 + c s^5; the matrix first scaled to a norm 2% over 1, the margin its coefficients assume."""
    X = G.to(gpt.matmul_dtype(G.device))
    tall = G.size(-2) > G.size(-1)
    X = X.mT if tall else X
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02).clamp(min=1e-7)
    for a, b, c in POLAR_EXPRESS:
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    return X.mT if tall else X


def half_rope(config):
    """gpt.GPT with rotary turns on half of each head's channel pairs, at rates from 1 to 1/1024 a position, and the
    other half left unturned: channels that match by content at any distance, as modded-nanogpt's records have it."""
    model = gpt.GPT(config)
    hs = config.n_embd // config.n_head
    rates = 1024.0 ** -torch.linspace(0, 1, hs // 4, dtype=torch.float64)
    rates = torch.cat([rates, torch.zeros(hs // 2 - hs // 4, dtype=torch.float64)])
    angles = torch.outer(torch.arange(config.block_size).double(), rates).repeat(1, 2)  # (block_size, hs)
    model.cos.copy_(angles.cos())
    model.sin.copy_(angles.sin())
    return model


def normuon(model, tc, device_type="cpu"):
    """gpt.configure_optimizers with NorMuon in place of gpt.Muon, at the same rates and momentum."""
    optimizers = CONFIGURE_OPTIMIZERS(model, tc, device_type)
    if not isinstance(optimizers[-1], gpt.Muon):
        raise ValueError("NorMuon takes the place of Muon: it needs optimizer muon, not adamw")
    optimizers[-1] = NorMuon(optimizers[-1].param_groups[0]["params"], tc.muon_lr, tc.muon_momentum, tc.weight_decay)
    return optimizers


# The lists the harness takes, {name: Setting}, the first the one the others are set beside.
OPTIMIZERS = {name: Setting(changes=dict(optimizer=name)) for name in cli.FIELDS["optimizer"].metadata["choices"]}
# The default block and a change of it each.
VARIANTS = {"default": Setting(), "relu squared": Setting(model=relu_squared), "qk-norm": Setting(model=qk_norm),
            "zero c_proj": Setting(model=zero_c_proj), "tied": Setting(changes=dict(tie_weights=True))}
# Whole windows of 128 tokens, 8 a step: the windows of the candidates named for older recipes
# (docs/benchmarks.md).
WINDOWS_OF_128 = dict(block_size=128, batch_size=8, short_context=0.0)
# The default recipe and a change of it each: options, a schedule, torch.compile, Muon's products or the model.
CANDIDATES = {
    "default": Setting(),
    "tied, cosine, 100 warmup, 4 layers, momentum flat, decay 0.1, no table": Setting(
        changes=dict(tie_weights=True, warmup_iters=100, n_layer=4, muon_momentum_start=0.95, weight_decay=0.1,
                     bigram=0, **WINDOWS_OF_128), lr_at=cosine_lr),
    "4 layers, embedding at 3e-3, momentum flat, decay 0.1, no table": Setting(
        changes=dict(n_layer=4, embedding_lr=3e-3, muon_momentum_start=0.95, weight_decay=0.1, bigram=0,
                     **WINDOWS_OF_128)),
    "decay 0.1, no table": Setting(changes=dict(weight_decay=0.1, bigram=0, **WINDOWS_OF_128)),
    "no bigram table": Setting(changes=dict(bigram=0, **WINDOWS_OF_128)),
    "context 128, batch 8": Setting(changes=WINDOWS_OF_128),
    "context 64, batch 16": Setting(changes=dict(block_size=64, batch_size=16, short_context=0.0)),
    "compile": Setting(compile=True),
    "Muon in bfloat16": Setting(matmul_dtype=torch.bfloat16),
    "output layer from zero": Setting(model=zero_head),
    "x0 to every block": Setting(model=x0_shortcut),
    "Newton-Schulz, 4 steps": Setting(ns_steps=4),
    "Newton-Schulz, 3 steps": Setting(ns_steps=3),
    "Muon at 0.02": Setting(changes=dict(muon_lr=0.02)),
    "embedding at 0.1": Setting(changes=dict(embedding_lr=0.1)),
    "AdamW at 6e-3": Setting(changes=dict(learning_rate=6e-3, min_lr=6e-4)),
    "Muon's momentum flat": Setting(changes=dict(muon_momentum_start=0.95)),
    "trigram table": Setting(model=TrigramGPT),
    "batch 16": Setting(changes=dict(batch_size=16)),
    "cooldown to zero": Setting(changes=dict(min_lr=0.0)),
    "logits soft-capped at 15": Setting(model=softcapped),
    "value embeddings": Setting(model=ValueEmbeddingGPT),
    "Muon in float32": Setting(matmul_dtype=torch.float32),
    "half the context, twice the rows, for the first 30%": Setting(changes={**WINDOWS_OF_128, "short_context": 0.3}),
    "2 heads": Setting(changes=dict(n_head=2)),
    "8 heads": Setting(changes=dict(n_head=8)),
    "output layer at 0.01": Setting(optimizers=own_rate("lm_head", 0.01)),
    "bigram table at 0.03": Setting(optimizers=own_rate("bigram", 0.03)),
    "pair logits": Setting(model=PairLogitsGPT),
    "pair logits, 2 heads, cooldown to zero": Setting(changes=dict(n_head=2, min_lr=0.0), model=PairLogitsGPT),
    "Muon at 0.007": Setting(changes=dict(muon_lr=0.007)),
    "Muon at 0.005": Setting(changes=dict(muon_lr=0.005)),
    "AdamW at 1.5e-3": Setting(changes=dict(learning_rate=1.5e-3, min_lr=1.5e-4)),
    "Muon's momentum from 0.7": Setting(changes=dict(muon_momentum_start=0.7)),
    "qk-norm": Setting(model=qk_norm),
    "qk-norm with gains": Setting(model=qk_norm_gains),
    "float32 steps": Setting(changes=WINDOWS_OF_128,
                             autocast=lambda device: torch.autocast(device.type, enabled=False)),
    "4 layers": Setting(changes=dict(n_layer=4)),
    "whole windows of 256": Setting(changes=dict(short_context=0.0)),
    "context 512, batch 2": Setting(changes=dict(block_size=512, batch_size=2, short_context=0.0)),
    "no gradient clipping": Setting(changes=dict(grad_clip=0.0)),
    "no clipping, cooldown to zero": Setting(changes=dict(grad_clip=0.0, min_lr=0.0)),
    "no clipping, cooldown to zero, Newton-Schulz 4 steps": Setting(changes=dict(grad_clip=0.0, min_lr=0.0),
                                                                    ns_steps=4),
    "cooldown over the last 40%": Setting(lr_at=cooldown_over(0.4)),
    "cooldown over the last 80%": Setting(lr_at=cooldown_over(0.8)),
    "half the context, twice the rows, for the first 20%": Setting(changes=dict(short_context=0.2)),
    "half the context, twice the rows, for the first 40%": Setting(changes=dict(short_context=0.4)),
    "half the context, twice the rows, for the first 80%": Setting(changes=dict(short_context=0.8)),
    "a quarter of the context for the first 20%, half until 60%": Setting(windows=context_halved_before(0.2, 0.6)),
    "half the rows for the first 20%": Setting(windows=half_the_rows_first),
    "gated attention": Setting(model=gated_attention),
    "windows without replacement": Setting(batch=epochs_batch),
    "NorMuon": Setting(optimizers=normuon),
    "two micro-batches a step": Setting(changes=dict(grad_accum=2)),
    "two micro-batches a step, windows without replacement": Setting(changes=dict(grad_accum=2), batch=epochs_batch),
    "batch 2, four micro-batches a step, windows without replacement": Setting(changes=dict(batch_size=2, grad_accum=4),
                                                                             batch=epochs_batch),
    "windows without replacement, NorMuon": Setting(batch=epochs_batch, optimizers=normuon),
    # Six rows a step where the pair takes eight: micro-batches small enough to stay within the default's memory.
    "two micro-batches of 3 a step, windows without replacement": Setting(changes=dict(batch_size=3, grad_accum=2),
                                                                        batch=epochs_batch),
    "three micro-batches of 2 a step, windows without replacement": Setting(changes=dict(batch_size=2, grad_accum=3),
                                                                          batch=epochs_batch),
    "Polar Express": Setting(newton_schulz=polar_express),
    "half the rotary pairs unturned": Setting(model=half_rope),
    # Muon at the rate that gives the Polar Express's updates the size of the default's: on random matrices of the
    # default model's shapes their norm is 1/0.86 of the default's (test_bench.py).
    "Polar Express, Muon at 0.0086": Setting(changes=dict(muon_lr=0.0086), newton_schulz=polar_express),
    "AdamW's beta1 0.8": Setting(optimizers=adamw_beta1(0.8)),
    "value residual": Setting(model=value_residual),
    "whole windows for the first 15%, half the context until 60%": Setting(windows=whole_windows_first(0.15)),
    "blocks' matrices at 1 / sqrt(inputs)": Setting(model=wider_init(1.0)),
    "blocks' matrices at 0.5 / sqrt(inputs)": Setting(model=wider_init(0.5)),
    "embedding at std 1": Setting(model=wider_init(embedding=1.0)),
    # 8 windows of 128 a step for the first 60% of the run, then 4 of 256, then 2 of 512.
    "windows of 512 for the last 15%": Setting(changes=dict(block_size=512, batch_size=2),
                                               windows=context_halved_before(0.6, 0.85)),
    "windows of 512 for the last 30%": Setting(changes=dict(block_size=512, batch_size=2),
                                               windows=context_halved_before(0.6, 0.7)),
    "smear gate": Setting(model=SmearGPT),
    "backout": Setting(model=backout),
    "cooldown as 1 - sqrt": Setting(lr_at=sqrt_cooldown),
    "AdamW's beta2 0.95": Setting(changes=dict(beta2=0.95)),
    "MLP 2x wide": Setting(model=mlp_wide(2)),
    "MLP 4x wide": Setting(model=mlp_wide(4)),
    "norms without gains": Setting(model=norms_without_gains),
}
# train.py's run (train.run), a copy of gpt.py alone (gpt.train(tc, text)), and AdamW alone, the
# bar the copier's default must clear at equal time.
COPIER = {"train.py": Setting(train_py=True), "gpt.train": Setting(),
          "gpt.train, AdamW alone": Setting(changes=dict(optimizer="adamw"))}
# Each harness's flag: its settings and how many rounds it trains them by default.
HARNESSES = {"optimizers": (OPTIMIZERS, 1), "variants": (VARIANTS, 2), "candidates": (CANDIDATES, 3),
             "copier": (COPIER, 3)}


# ------------------------------------------------------------------------------------------------------- quality
def bench_quality(seconds, path, dtype=None):
    """Trains the default CPU config for `seconds` of wall time, as train.py does; returns its final val loss, on the
    whole held-out split."""
    lines = []
    start = time.time()
    with tempfile.TemporaryDirectory() as out_dir:
        tc = gpt.TrainConfig(out_dir=out_dir, max_iters=gpt.MANY, max_time=seconds, eval_interval=gpt.MANY,
                             device="cpu")
        try:
            trainer, stopped = train.run(tc, data.DataFile(path, dtype), log=lines.append)
        # Ctrl-C before the training loop, which saves and returns on a signal, has begun.
        except KeyboardInterrupt:
            stopped = signal.SIGINT
    if stopped:  # Ctrl-C or another stopping signal, which train.run turns into a save and a return
        print(f"{signal.Signals(stopped).name}: stopped after {time.time() - start:.0f} s, so no val loss",
              file=sys.stderr)
        sys.exit(128 + stopped)
    return dict(seconds=seconds, data=path, iters=trainer.it, val_loss=trainer.history[-1]["val"],
                report=next(line for line in lines if line.startswith("what context buys")))


# nanoGPT's CPU recipe as its README gives it (the shape is RECIPE's): batch 12, AdamW at 1e-3 with beta2 0.99 and
# weight decay 0.1 (on the matrices, by its own configure_optimizers), 100 warmup steps, then a cosine to 1e-4 at
# step 2,000, gradients clipped to 1.0, no dropout.
NANOGPT_RECIPE = dict(steps=RECIPE_STEPS, batch_size=RECIPE_BATCH, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                      beta2=0.99, weight_decay=0.1, grad_clip=1.0)
# Our run's weights are kept this many times, evenly spaced in its time, to find when it reached nanoGPT's loss.
SNAPSHOTS = 40


class AllLogits(torch.nn.Module):
    """nanoGPT's GPT as gpt.split_loss reads a model: forward(idx, targets) -> (the logits of every position, the mean
    loss of the targets other than -100). nanoGPT's forward gives every position's logits only when it is given
    targets (without, the last position's), and leaves out targets -1, not -100. Its lm_head tells split_loss where
    the model is."""

    def __init__(self, nano_model):
        super().__init__()
        self.nano_model = nano_model
        self.config = nano_model.config
        self.lm_head = nano_model.lm_head

    def forward(self, idx, targets):
        logits, _ = self.nano_model(idx, targets.clamp(min=0))
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_nanogpt(nano, train_ids, vocab_size, recipe, seed=0):
    """nanoGPT's model.py trained by its CPU recipe on train_ids (random windows of its context, one micro-batch a
    step, as its train.py draws them); (the model, the seconds its steps took)."""
    quiet = contextlib.redirect_stdout(io.StringIO())  # nanoGPT prints its parameter count and optimizer groups
    torch.manual_seed(seed)
    with quiet:
        model = theirs_runs(lambda: nano.GPT(nano.GPTConfig(**{**RECIPE, "vocab_size": vocab_size}, dropout=0.0)))()
        optimizer = theirs_runs(lambda: model.configure_optimizers(recipe["weight_decay"], recipe["learning_rate"],
                                                                   (0.9, recipe["beta2"]), "cpu"))()
    # Its schedule: a linear warmup, then a cosine to min_lr at the last step.
    schedule = gpt.TrainConfig(learning_rate=recipe["learning_rate"], min_lr=recipe["min_lr"],
                               warmup_iters=recipe["warmup_iters"], max_iters=recipe["steps"])
    T = RECIPE["block_size"]
    generator = torch.Generator().manual_seed(seed)

    @theirs_runs
    def step(it):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(schedule, it, 0.0)
        ix = torch.randint(len(train_ids) - T, (recipe["batch_size"], 1), generator=generator)
        xy = torch.as_tensor(train_ids[ix + torch.arange(T + 1)]).long()  # (B, T + 1)
        _, loss = model(xy[:, :-1].contiguous(), xy[:, 1:].contiguous())  # as its get_batch makes them
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train()
    start = time.perf_counter()
    for it in range(recipe["steps"]):
        step(it)
    return model, time.perf_counter() - start


def ours_for(seconds, ids, tokenizer, snapshots, setting=Setting()):
    """Our default CPU run on ids for `seconds` of wall time, as train.py trains it, changed as setting says; (the
    trainer, [(seconds, weights)] kept evenly spaced in its time)."""
    kept = []

    def keep(trainer):
        if trainer.elapsed >= (len(kept) + 1) * seconds / snapshots and not trainer.done():
            kept.append((trainer.elapsed, {k: v.clone() for k, v in trainer.model.state_dict().items()}))

    trainer, _ = train_setting(setting, seconds, ids, tokenizer, on_step=keep)
    return trainer, kept


def reached_at(trainer, kept, target):
    """The seconds our run took to reach a val loss of target or lower, on the whole held-out split: the first of its
    kept weights that does, found by bisection (the loss falls as the run goes on), or the run's end; None when even
    the end did not."""
    model = trainer.model.eval()
    if gpt.split_loss(model, trainer.splits["val"], trainer.tc.batch_size) > target:
        return None
    end = {k: v.clone() for k, v in model.state_dict().items()}
    low, high = -1, len(kept)  # kept[high], or the end where high == len(kept), reaches the target
    while high - low > 1:
        middle = (low + high) // 2
        model.load_state_dict(kept[middle][1])
        if gpt.split_loss(model, trainer.splits["val"], trainer.tc.batch_size) <= target:
            high = middle
        else:
            low = middle
    model.load_state_dict(end)
    return kept[high][0] if high < len(kept) else trainer.elapsed


def quality_versus_nanogpt(nano, path, recipe, snapshots, log=functools.partial(print, flush=True),
                           candidate="default", dtype=None):
    """nanoGPT's model.py trained by its CPU recipe, timed, then our default (or a candidate of CANDIDATES) for the
    same wall time on the same text, both evaluated on the whole held-out split of it (split_loss, in windows of each
    one's context)."""
    ids, tokenizer = data.read_data(data.DataFile(path, dtype))
    splits = gpt.split(ids)  # our split, for both
    theirs, seconds = train_nanogpt(nano, splits["train"], vocab_size_of(ids, tokenizer), recipe)
    their_loss = theirs_runs(gpt.split_loss)(AllLogits(theirs).eval(), splits["val"], recipe["batch_size"])
    log(f"nanoGPT's CPU recipe: {recipe['steps']} steps in {seconds:.0f} s, val loss {their_loss:.4f}")
    ours, kept = ours_for(seconds, ids, tokenizer, snapshots, CANDIDATES[candidate])
    our_loss = gpt.split_loss(ours.model.eval(), splits["val"], ours.tc.batch_size)
    name = "the default" if candidate == "default" else f"the default with {candidate}"
    log(f"ours, {name} for {seconds:.0f} s: {ours.it} steps, val loss {our_loss:.4f}")
    return dict(seconds=seconds, data=path, steps={"ours": ours.it, "nanoGPT": recipe["steps"]},
                val_loss={"ours": our_loss, "nanoGPT": their_loss}, reached_seconds=reached_at(ours, kept, their_loss))


def versus_line(q):
    """The last line of --quality --nanogpt: both losses, the difference, and how soon ours reached nanoGPT's."""
    ours, theirs = q["val_loss"]["ours"], q["val_loss"]["nanoGPT"]
    line = (f"ours {ours:.4f}, nanoGPT {theirs:.4f}: {abs(theirs - ours):.4f} {'lower' if ours <= theirs else 'higher'}"
            f" in {q['seconds']:.0f} s; nanoGPT's loss ")
    reached = q["reached_seconds"]
    if reached is None:
        return line + "not reached"
    return line + f"reached in {reached:.0f} s ({speedup(q):.1f}x)"


def speedup(q):
    """How many times sooner than nanoGPT our run reached its loss; 0 where it never did."""
    if q["reached_seconds"] is None:
        return 0.0
    return q["seconds"] / max(q["reached_seconds"], 1e-9)


def medians_line(runs):
    """The medians of several runs of --quality --nanogpt: how far below nanoGPT, and how many times sooner."""
    below = statistics.median(q["val_loss"]["nanoGPT"] - q["val_loss"]["ours"] for q in runs)
    sooner = statistics.median(speedup(q) for q in runs)
    return (f"median of {len(runs)} runs: {below:+.4f} below nanoGPT; nanoGPT's loss reached {sooner:.1f}x sooner "
            f"(a run that never reached it counts as 0x)")


# -------------------------------------------------------------------------------------------------- command line
# What a harness sets itself: the time, that the runs write nothing, the data's vocabulary, the optimizer of
# --optimizers.
NOT_SET = ("out_dir", "device", "max_time", "max_iters", "eval_interval", "eval_iters", "optimizer", "vocab_size")


def train_option(text):
    """An argparse type: OPTION=VALUE, an option of TrainConfig and a value its train.py flag takes, held to the same
    rules (cli.option_rule)."""
    name, equals, value = text.partition("=")
    names = [name for name in cli.FIELDS if name not in NOT_SET]
    if name not in names or not equals:
        raise argparse.ArgumentTypeError(f"{text!r}: --set takes OPTION=VALUE, OPTION one of {', '.join(names)}")
    return name, cli.parse_option(name, value)


def names(settings):
    """The settings' names after the first, as --help lists them (a % doubled, as argparse's help is a format)."""
    return " | ".join(list(settings)[1:]).replace("%", "%%")


def make_parser():
    parser = cli.Parser(description="Benchmark gpt.py on this machine.")
    add = parser.add_argument
    add("--nanogpt", metavar="DIR", type=cli.not_empty("the folder of nanoGPT's model.py"),
        help="instead: time this project beside nanoGPT's model.py in DIR")
    add("--profile", action="store_true", help="instead: profile training and decode steps")
    add("--maps", action="store_true",
        help="instead: time steps with the attention's plain maps and with them in one stacked product")
    add("--gpt2", action="store_true", help="instead: greedy sampling at GPT-2 small's shape beside transformers'")
    add("--quality", type=cli.SECONDS, metavar="SECONDS", nargs="?", const=0.0,
        help="instead: train the default CPU config this long and report its val loss on the whole held-out split; "
             "with --nanogpt DIR and no SECONDS, train nanoGPT's model.py by its CPU recipe, then ours for the same "
             "time, and compare their val losses")
    for mode, what in (("optimizers", "with each optimizer"), ("variants", "and each variant of its block"),
                       ("candidates", "and each candidate for its recipe"),
                       ("copier", "through train.py's run and gpt.train, and with AdamW alone")):
        add(f"--{mode}", type=cli.SECONDS, metavar="SECONDS", nargs="?", const=0.0,
            help=f"instead: train the default CPU config {what} this long (or --steps), in alternating rounds "
                 f"({HARNESSES[mode][1]} by default), and compare their val losses on the whole held-out split")
    add("--steps", type=cli.number(int, lambda n: 1 <= n <= gpt.MANY, f"in [1, {gpt.MANY}]"), metavar="N",
        help="with a harness and no SECONDS: train each setting N steps, round r from seed S + r - 1 (S: 1337, or "
             "--set seed=S), and compare at equal steps (each one's steps a second still printed)")
    add("--runs", type=cli.AT_LEAST_1, metavar="N",
        help="with --quality: this many runs, each printed, then their medians; with a harness (--optimizers, "
             "--variants, --candidates, --copier): this many rounds")
    add("--only", choices=list(OPTIMIZERS), help="with --optimizers: run this one alone")
    add("--variant", action="append", choices=list(VARIANTS)[1:], metavar="NAME",
        help=f"with --variants: this one and the default alone; again for more. One of: {names(VARIANTS)}")
    add("--candidate", action="append", choices=list(CANDIDATES)[1:], metavar="NAME",
        help=f"with --candidates: this one and the default alone; again for more; once with --quality --nanogpt: "
             f"ours with a candidate. One of: {names(CANDIDATES)}")
    add("--data", help="text (or .bin ids) for --quality and the harnesses (default: input.txt)")
    add("--dtype", choices=data.ID_DTYPES, help="the integer type of the ids in a .bin --data (default: uint16)")
    add("--set", metavar="OPTION=VALUE", action="append", type=train_option, default=[],
        help="with a harness: an option of train.py for every run, as its flag takes it (--set muon_lr=0.02); "
             "again for more")
    add("--device", default="cpu", help="cpu or cuda; the NumPy twin is timed on CPU runs only (default: %(default)s)")
    add("--json", metavar="PATH", type=cli.not_empty("a file"), help="also write the figures to this JSON file")
    return parser


def asked(args, mode):
    """Whether the flag of mode was given (--quality alone gives 0.0)."""
    value = getattr(args, mode)
    return value is not None and value is not False


def check_args(parser, args):
    """Refuses, in argparse's one line, flags that go with a mode not asked for, and two modes at once."""
    harness = any(asked(args, mode) for mode in HARNESSES)
    # --quality --nanogpt DIR is one mode: the quality run beside nanoGPT's.
    modes = [f"--{mode}" for mode in MODES if asked(args, mode)]
    if args.quality is not None and args.nanogpt is not None:
        modes.remove("--nanogpt")
    if len(modes) > 1:
        parser.error(f"{' and '.join(modes[:2])} are two modes: give one at a time")
    if args.data is not None and not (harness or args.quality is not None):
        parser.error("--data goes with --quality, --optimizers, --variants, --candidates or --copier")
    if args.dtype and args.data is None:
        parser.error("--dtype is the type of the ids in a .bin --data: give --data too")
    if args.data is None:
        args.data = "input.txt"
    if args.quality is not None and bool(args.quality) == bool(args.nanogpt):
        parser.error("--quality takes SECONDS, or with --nanogpt DIR none: nanoGPT's recipe sets the time")
    if args.only and not asked(args, "optimizers"):
        parser.error("--only goes with --optimizers")
    for mode in HARNESSES:
        if asked(args, mode) and bool(getattr(args, mode)) == bool(args.steps):
            parser.error(f"--{mode} takes SECONDS, or with --steps N none")
    if args.steps and not harness:
        parser.error("--steps goes with --optimizers, --variants, --candidates or --copier")
    if args.set and not harness:
        parser.error("--set goes with --optimizers, --variants, --candidates or --copier")
    if args.runs and not (harness or args.quality is not None):
        parser.error("--runs goes with --quality, --optimizers, --variants, --candidates or --copier")
    if args.variant and not asked(args, "variants"):
        parser.error("--variant goes with --variants")
    versus = args.quality == 0.0 and args.nanogpt
    if args.candidate and not (asked(args, "candidates") or versus and len(args.candidate) == 1):
        parser.error("--candidate goes with --candidates, or once with --quality --nanogpt")
    try:  # the options together, as train.py holds them: min_lr at most learning_rate, say
        gpt.TrainConfig(**dict(args.set))
    except ValueError as e:
        parser.error(f"--set: {e}")


def chosen(mode, args):
    """The settings of a harness that the flags pick: --only's alone, or the first and each --variant or
    --candidate, or all."""
    settings = HARNESSES[mode][0]
    if args.only:
        return {args.only: settings[args.only]}
    picked = {"variants": args.variant, "candidates": args.candidate}.get(mode) or list(settings)
    first = next(iter(settings))
    return {name: s for name, s in settings.items() if name == first or name in picked}


def harness_mode(mode, args, device, figures):
    seconds = getattr(args, mode)
    rounds = args.runs or HARNESSES[mode][1]
    seed = dict(args.set).get("seed", gpt.TrainConfig.seed)
    each = f"{args.steps} steps (round r from seed {seed} + r - 1)" if args.steps else f"{seconds:g} s of training"
    print(f"--{mode}: {each} each on {args.data}, in {rounds} round{'s' * (rounds > 1)}, every other one in reverse "
          f"order; each one's loss on the whole held-out split:", flush=True)
    rows = figures[mode] = compare(chosen(mode, args), seconds, args.data, rounds, device, steps=args.steps,
                                   dtype=args.dtype, **dict(args.set))
    print("\n".join(summary(rows)))


def their_fault(folder, error):
    return ValueError(f"the GPT of {folder}/model.py does not run as nanoGPT's does ({error}): pass --nanogpt the "
                      f"folder of nanoGPT's model.py")


def quality_mode(args, device, figures):
    runs = []
    if args.nanogpt:
        nano = load_nanogpt(args.nanogpt)
        for _ in range(args.runs or 1):
            try:
                runs.append(quality_versus_nanogpt(nano, args.data, NANOGPT_RECIPE, SNAPSHOTS,
                                                   candidate=(args.candidate or ["default"])[0], dtype=args.dtype))
            except TheirFault as e:
                raise their_fault(args.nanogpt, e) from None
            print(versus_line(runs[-1]), flush=True)
        figures["quality_versus_nanogpt"] = runs
        if len(runs) > 1:
            print(medians_line(runs))
        return
    for _ in range(args.runs or 1):
        q = bench_quality(args.quality, args.data, args.dtype)
        runs.append(q)
        print(f"{q['seconds']:g} s of training on {q['data']}: {q['iters']} iterations, val loss {q['val_loss']:.4f}")
        print(q["report"], flush=True)
    figures["quality"] = runs
    if len(runs) > 1:
        print(f"median of {len(runs)} runs: val loss {statistics.median(q['val_loss'] for q in runs):.4f}")


def nanogpt_mode(args, device, figures):
    nano = load_nanogpt(args.nanogpt)
    try:
        v = figures["versus_nanogpt"] = versus_nanogpt(nano, device)
    except TheirFault as e:
        raise their_fault(args.nanogpt, e) from None
    print(f"beside nanoGPT's model.py from {args.nanogpt}, interleaved in this run, medians:")
    print(f"{'':58s} {'this project':>13s} {'nanoGPT':>9s} {'ratio':>6s}")
    for label, key, unit, faster in (
            (f"training step, CPU-recipe shape ({RECIPE_SHAPE})", "step_ms", "ms", min),
            (f"sampling {NEW_TOKENS} tokens into a {SAMPLING['block_size']} context, {shape(SAMPLING)} (KV cache)",
             "fill_tokens_per_s", "tok/s", max),
            ("sampling past a full context (a full forward each)", "past_tokens_per_s", "tok/s", max)):
        ours, theirs = v[key]["ours"], v[key]["nanoGPT"]
        ratio = theirs / ours if faster is min else ours / theirs
        print(f"{label[:58]:58s} {ours:8.1f} {unit:5s}{theirs:7.1f} {unit:5s}{ratio:5.2f}x")
    print(f"\nnanoGPT's CPU recipe here: {RECIPE_STEPS} steps x {v['step_ms']['nanoGPT']:.1f} ms + {RECIPE_EVALS} "
          f"evaluations x {2 * RECIPE_EVAL_ITERS} batches x {v['eval_batch_ms']:.1f} ms = "
          f"{v['recipe_seconds']:.0f} s (its data loading and logging left out). The same budget for this project:")
    print(f"  python bench.py --quality {v['recipe_seconds']:.0f} --data tinyshakespeare.txt")


def gpt2_mode(args, device, figures):
    g = figures["versus_transformers"] = versus_transformers()
    ours = g["tokens_per_s"]["ours"]
    theirs = g["tokens_per_s"]["transformers"]
    copied = g["tokens_per_s"]["copied"]
    print(f"greedy sampling of {g['new_tokens']} tokens at GPT-2 small's shape (random weights, "
          f"float32, CPU), interleaved, medians: gpt2.from_state_dict {ours:.1f} tok/s, transformers "
          f"{g['transformers']} generate with its cache {theirs:.1f} tok/s, {ours / theirs:.2f}x; "
          f"the same tokens: {g['same_tokens']}")
    print(f"the same weights copied into nn.Linear's (out, in) order in memory: {copied:.1f} tok/s, "
          f"{copied / theirs:.2f}x transformers")


def maps_mode(args, device, figures):
    figures["maps"] = bench_maps(device)
    print("the attention's q, k and v as three products (gpt.py) or one of the weights stacked, interleaved, medians:")
    for r in figures["maps"]:
        print(f"  {r['name']:42s} plain {r['plain_ms']:7.2f} ms, stacked {r['stacked_ms']:7.2f} ms, "
              f"stacked {r['plain_ms'] / r['stacked_ms'] - 1:+.1%} faster")


def profile_mode(args, device, figures):
    figures["profile"] = profile_steps(device)
    for name, rows in figures["profile"].items():
        print(f"\n{name}: ms per step in each op's own code (torch.profiler, 20 steps)")
        for op, ms, share in rows:
            print(f"  {op[:48]:48s} {ms:7.2f} ms {share:6.1%}")
    r = figures["weight_reads_gb_per_s"] = weight_reads(device)
    print(f"\nreading the {shape(SAMPLING)} model's {r['megabytes']:.0f} MB of weights, as each decode step does: "
          f"one-row matmuls {r['one-row matmuls']:.1f} GB/s, the same with the weights laid out (in, out) in memory "
          f"{r['one-row matmuls, (in, out) in memory']:.1f} GB/s, a sum of each tensor {r['sums']:.1f} GB/s")


def speed_mode(args, device, figures):
    bf16 = gpt.matmul_dtype(device) is torch.bfloat16
    n, peaks = matmul_peaks([torch.float32] + ([torch.bfloat16] if bf16 else []), device)
    figures.update(matmul_gflops=peaks, training=bench_training(device, peaks, bf16),
                   muon=bench_muon(device), sampling_tokens_per_s=bench_sampling(device))
    print(f"Muon's products (gpt.matmul_dtype): {dtype_name(gpt.matmul_dtype(device))}; matmul peak ({n}x{n}): "
          + ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in peaks.items()))
    print(f"\n{'training':34s} {'dtype':14s} {'ms/iter':>8s} {'tok/s':>8s} {'MFU':>6s}")
    for r in figures["training"]:
        print(f"{r['name']:34s} {r['dtype']:14s} {r['ms_per_iter']:8.1f} {r['tokens_per_s']:8.0f} {r['mfu']:6.1%}")
    m = figures["muon"]["step_ms"]
    print(f"\nMuon's step on the default model's {figures['muon']['matrices']}: "
          + ", ".join(f"products in {dtype} {ms:.1f} ms" for dtype, ms in m.items()))
    s = figures["sampling_tokens_per_s"]
    print(f"\nsampling {NEW_TOKENS} tokens into a {SAMPLING['block_size']} context ({SAMPLING['n_layer']} layers, "
          f"{SAMPLING['n_embd']} wide): KV cache {s['kv_cache']:.0f} tok/s, a full forward per token "
          f"{s['full_forward']:.0f} tok/s, {s['kv_cache'] / s['full_forward']:.1f}x")
    if device.type != "cuda":
        t = figures["twin_ms"] = bench_twin()
        print(f"\nforward+backward, nanoGPT CPU-recipe shape, float32: PyTorch {t['pytorch']:.1f} ms, "
              f"NumPy twin {t['numpy']:.1f} ms, {t['numpy'] / t['pytorch']:.2f}x")
    e = figures["encoding"] = bench_encoding()
    print(f"\nreading a {e['megabytes']:.0f} MB text into token ids ({e['vocab_size']} characters, "
          f"{e['dtype']}), as train.py --data does: {e['mb_per_s']:.0f} MB/s, "
          f"{e['bytes_per_char']:.2f} bytes of memory per character")


# The modes, each by the flag that asks for it, looked for in this order; with none of them, speed_mode.
MODES = {"quality": quality_mode, **{mode: functools.partial(harness_mode, mode) for mode in HARNESSES},
         "nanogpt": nanogpt_mode, "gpt2": gpt2_mode, "maps": maps_mode, "profile": profile_mode}


def measure(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    device = cli.usable_device(args.device)
    made = bool(args.json) and not os.path.lexists(args.json)
    if args.json:
        check_json(args.json)
    try:
        measure_mode(args, device)
    # A run that fails or is stopped leaves no empty --json of its own making.
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                os.remove(args.json)
        raise


def check_json(path):
    """--json's file, refused now rather than after minutes of measuring: one that cannot be written, that is no
    regular file (a pipe would block for good), or that holds anything but figures this wrote (it would be lost)."""
    # An empty file holds nothing to lose (touch, or a run killed before it wrote its figures).
    if os.path.lexists(path) and not (os.path.isfile(path) and os.path.getsize(path) == 0):
        if not os.path.isfile(path):
            raise ValueError(f"cannot write {path} (it is no regular file: a folder, a pipe, a device or a broken "
                             f"link): pass --json a file")
        try:
            with open(path, encoding="utf-8") as f:
                figures = json.loads(f.read(10 ** 7))
        # RecursionError: JSON nested past Python's depth ([[[...), no figures of ours either.
        except (OSError, ValueError, RecursionError):
            figures = None
        if not (isinstance(figures, dict) and "date" in figures and "torch" in figures):
            raise ValueError(f"{path} holds something other than figures bench.py wrote, which --json would write "
                             f"over: pass --json a new file (or remove this one)")
    try:
        # The figures are written beside it first: its folder must take a file too.
        open(json_beside(path), "w").close()
        os.remove(json_beside(path))
        open(path, "a").close()  # "a" leaves a file there as it is till the figures are written
    except OSError as e:
        raise ValueError(f"cannot write {path} ({e.strerror}): pass --json a file in a folder that exists and that "
                         f"this user may write in") from None


def measure_mode(args, device):
    """The mode asked for, measured and printed; its figures written to --json."""
    figures = dict(date=time.strftime("%Y-%m-%d"), torch=torch.__version__, threads=torch.get_num_threads(),
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    print(f"torch {figures['torch']} on {figures['device']}, {figures['threads']} CPU threads, {figures['date']}",
          flush=True)
    mode = next((mode for mode in MODES if asked(args, mode)), None)
    MODES.get(mode, speed_mode)(args, device, figures)
    if args.json:
        write_json(args.json, figures)


def json_beside(path):
    """The file report.write writes --json's figures to first, beside the file path names (or the one a link there
    points to), before it renames it over that file."""
    return f"{os.path.realpath(path)}.{os.getpid()}.tmp"


def write_json(path, figures):
    """figures to the file at path (or the one a link there points to) as report.write writes a page, whole or not at
    all: a full disk, a failure or a Ctrl-C leaves the figures of the run before as they were."""
    try:
        report.write(os.path.realpath(path), json.dumps(figures, indent=1))
    except OSError as e:
        kept = "any figures there are as they were"
        raise OSError(e.errno, f"cannot write --json {path} ({e.strerror}); {kept}") from None


def main(argv=None):
    try:
        measure(argv)
    # A bad --data, --device, --nanogpt or --json; out of memory; a full disk under --json.
    # Before OSError, of which it is one: a reader gone away (python bench.py | head -1).
    except BrokenPipeError:
        cli.end_quietly()
    except (ValueError, OSError, RuntimeError, MemoryError) as e:
        cli.fail(cli.one_line(e, "run it on a machine with more memory"))
    except KeyboardInterrupt:  # Ctrl-C: what was measured is printed already
        sys.exit(130)


if __name__ == "__main__":
    main()
