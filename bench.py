"""Measures this machine and gpt.py on it; prints one table, every figure from this run.

    python bench.py                      # matmul peaks, training, sampling, the NumPy twin
    python bench.py --quality 140 --data ../shared/data/tinyshakespeare.txt   # val loss after 140 s of training
    python bench.py --json bench.json    # the same figures, machine-readable

The machine may be shared and drift in speed, so the configurations are timed interleaved, in rounds, and each
figure is a median.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext

import torch

import gpt
import gpt_numpy
import train

NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)  # nanoGPT's CPU recipe
SAMPLING = dict(vocab_size=65, n_layer=6, n_head=6, n_embd=384, block_size=256)  # nanoGPT's shakespeare_char model


def native_bf16():
    """The CPU feature that runs bf16 natively (AMX or AVX512-BF16), or None."""
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        return None
    return next((name for name in ("amx_bf16", "avx512_bf16") if name in flags), None)


def median_time(fn, repeats, warmup=2, device=torch.device("cpu")):
    def timed():
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()  # GPU work is queued: wait for it before reading the clock
        return time.perf_counter() - t

    for _ in range(warmup):
        timed()
    return statistics.median(timed() for _ in range(repeats))


def matmul_peaks(dtypes, device, rounds=5):
    n = 8192 if device.type == "cuda" else 1024
    a = {d: torch.randn(n, n, device=device).to(d) for d in dtypes}
    times = {d: [] for d in dtypes}
    for _ in range(rounds):
        for d in dtypes:  # interleaved
            times[d].append(median_time(lambda: a[d] @ a[d], repeats=10, device=device))
    return n, {str(d).split(".")[1]: 2 * n ** 3 / statistics.median(times[d]) / 1e9 for d in dtypes}


def flops_per_token(model):
    """6 per weight for forward and backward through every matmul (the LM head's included, even when tied), plus
    attention's scores and weighted sum: 12 * n_layer * n_embd * block_size."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - (0 if c.tie_weights else c.vocab_size * c.n_embd)
    n -= c.block_size * c.n_embd if c.pos == "learned" else 0
    return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size


def get_batch(data, block_size, batch_size, generator, device):
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    xy = torch.stack([data[i:i + block_size + 1] for i in ix.tolist()]).to(device)
    return xy[:, :-1], xy[:, 1:]


def bench_training(shapes, peaks, device, rounds=5, steps=8):
    """Median ms per optimizer step of each (name, TrainConfig, use_bf16) in shapes, timed in interleaved rounds."""
    runs = []
    for name, tc, bf16, compile in shapes:
        torch.manual_seed(0)
        config = gpt.GPTConfig(vocab_size=65, block_size=tc.block_size, n_layer=tc.n_layer, n_head=tc.n_head,
                               n_embd=tc.n_embd, bias=tc.bias, tie_weights=tc.tie_weights, norm=tc.norm, pos=tc.pos,
                               mlp=tc.mlp)
        model = gpt.GPT(config).to(device)
        optimizer = gpt.configure_optimizer(model, tc.learning_rate, tc.weight_decay, tc.beta2, device.type)
        data = torch.randint(0, 65, (100_000,))
        gen = torch.Generator().manual_seed(0)
        amp = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
        step = (lambda m=torch.compile(model) if compile else model, o=optimizer, t=tc, a=amp:
                gpt.train_step(m, o, [get_batch(data, t.block_size, t.batch_size, gen, device)],
                               t.grad_clip, None, a))
        runs.append(dict(name=name, tc=tc, bf16=bf16, model=model, step=step, times=[]))
    for _ in range(rounds):
        for run in runs:
            run["times"].append(median_time(run["step"], repeats=steps, device=device))
    rows = []
    for run in runs:
        tc, dt = run["tc"], statistics.median(run["times"])
        tokens = tc.batch_size * tc.block_size / dt
        peak = peaks["bfloat16" if run["bf16"] else "float32"]
        rows.append(dict(name=run["name"], dtype="bf16 autocast" if run["bf16"] else "fp32",
                         params=sum(p.numel() for p in run["model"].parameters()), ms_per_iter=dt * 1000,
                         tokens_per_s=tokens,
                         mfu=tokens * flops_per_token(run["model"]) / 1e9 / peak))
    return rows


def bench_sampling(device, new_tokens=200, rounds=3):
    """Tokens/s for new_tokens sampled until the context is full, with the KV cache and with a full forward per
    token as nanoGPT samples."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**SAMPLING, norm="layernorm", pos="learned", mlp="gelu", bias=True)).to(device).eval()
    prompt = torch.randint(0, 65, (1, SAMPLING["block_size"] - new_tokens), device=device)

    def with_cache():
        model.generate(prompt, new_tokens, generator=torch.Generator(device).manual_seed(0))

    @torch.no_grad()
    def full_forward():
        idx, gen = prompt, torch.Generator(device).manual_seed(0)
        for _ in range(new_tokens):
            logits, _ = model(idx[:, -SAMPLING["block_size"]:])
            next_id = torch.multinomial(logits[:, -1].softmax(-1), 1, generator=gen)
            idx = torch.cat([idx, next_id], dim=1)

    times = {"kv_cache": [], "full_forward": []}
    for _ in range(rounds):
        times["kv_cache"].append(median_time(with_cache, repeats=1, warmup=1, device=device))
        times["full_forward"].append(median_time(full_forward, repeats=1, warmup=0, device=device))
    return {name: new_tokens / statistics.median(t) for name, t in times.items()}


def bench_twin(rounds=5):
    """One float32 forward+backward at nanoGPT's CPU-recipe shape: the NumPy twin against PyTorch."""
    config = gpt.GPTConfig(vocab_size=65, norm="layernorm", pos="learned", mlp="gelu",
                           **{k: v for k, v in NANOGPT_CPU.items() if k != "batch_size"})
    torch.manual_seed(0)
    model = gpt.GPT(config)
    twin = gpt_numpy.GPT(config, {n: p.detach().numpy().copy() for n, p in model.named_parameters()})
    x, y = torch.randint(0, 65, (2, NANOGPT_CPU["batch_size"], config.block_size)).unbind(0)
    xn, yn = x.numpy(), y.numpy()

    def torch_step():
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()

    def twin_step():
        twin.forward(xn, yn)
        twin.backward()

    times = {"pytorch": [], "numpy": []}
    for _ in range(rounds):
        times["pytorch"].append(median_time(torch_step, repeats=5))
        times["numpy"].append(median_time(twin_step, repeats=5))
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def bench_quality(seconds, data):
    """Trains the default CPU config for `seconds` of wall time; returns the final val loss."""
    lines = []
    with tempfile.TemporaryDirectory() as out_dir:
        tc = gpt.TrainConfig(out_dir=out_dir, max_iters=10 ** 9, max_time=seconds, eval_interval=10 ** 9,
                             eval_iters=100, device="cpu")
        trainer, _ = train.run(tc, train.read_text(data), log=lines.append)
        history = dict(train=[(trainer.it, trainer.loss.item())], val=trainer.history["val"])
    return dict(seconds=seconds, data=data, iters=history["train"][-1][0], val_loss=history["val"][-1][1],
                report=[line for line in lines if line.startswith("what context buys")][0])


def main():
    parser = argparse.ArgumentParser(description="Benchmark gpt.py on this machine.")
    parser.add_argument("--quality", type=float, metavar="SECONDS",
                        help="instead: train the default CPU config this long and report its val loss")
    parser.add_argument("--data", default="input.txt", help="text for --quality (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda; the NumPy twin is timed on CPU runs only "
                                                        "(default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    args = parser.parse_args()
    device = gpt.get_device(args.device)
    figures = dict(date=time.strftime("%Y-%m-%d"), torch=torch.__version__, threads=torch.get_num_threads(),
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    if args.quality:
        q = figures["quality"] = bench_quality(args.quality, args.data)
        print(f"{q['seconds']:.0f} s of training on {q['data']}: {q['iters']} iterations, val loss {q['val_loss']:.4f}")
        print(q["report"])
    else:
        cuda = device.type == "cuda"
        bf16 = ("cuda" if torch.cuda.is_bf16_supported() else None) if cuda else native_bf16()
        dtypes = [torch.float32] + ([torch.bfloat16] if bf16 else [])
        n, peaks = matmul_peaks(dtypes, device)
        figures["matmul_gflops"] = peaks
        default = gpt.TrainConfig(**(train.CUDA_DEFAULTS if cuda else {}))
        nano = gpt.TrainConfig(bias=False, norm="layernorm", pos="learned", mlp="gelu", **NANOGPT_CPU)
        shapes = [(name, tc, use_bf16, False) for name, tc in ((f"default {device.type.upper()}", default),
                                                        ("nanoGPT CPU recipe", nano))
                  for use_bf16 in ([False, True] if bf16 else [False])]
        shapes.append((f"default {device.type.upper()} --compile", default, False, True))
        figures["training"] = bench_training(shapes, peaks, device)
        figures["sampling_tokens_per_s"] = bench_sampling(device)
        if not cuda:
            figures["twin_ms"] = bench_twin()

        print(f"torch {figures['torch']} on {figures['device']}, {figures['threads']} CPU threads, "
              f"native bf16: {bf16 or 'none found'}")
        print(f"matmul peak ({n}x{n}): " + ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in peaks.items()))
        print(f"\n{'training':30s} {'dtype':14s} {'params':>8s} {'ms/iter':>8s} {'tok/s':>8s} {'MFU':>6s}")
        for r in figures["training"]:
            print(f"{r['name']:30s} {r['dtype']:14s} {r['params'] / 1e6:7.2f}M {r['ms_per_iter']:8.1f} "
                  f"{r['tokens_per_s']:8.0f} {r['mfu']:6.1%}")
        s = figures["sampling_tokens_per_s"]
        print(f"\nsampling 200 tokens into a full {SAMPLING['block_size']}-token context "
              f"({SAMPLING['n_layer']} layers, {SAMPLING['n_embd']} wide):")
        print(f"  KV cache {s['kv_cache']:.0f} tok/s, full forward per token {s['full_forward']:.0f} tok/s, "
              f"{s['kv_cache'] / s['full_forward']:.1f}x")
        t = figures.get("twin_ms")
        if t:
            print(f"\nforward+backward, nanoGPT CPU-recipe shape, float32: PyTorch {t['pytorch']:.1f} ms, "
                  f"NumPy twin {t['numpy']:.1f} ms, {t['numpy'] / t['pytorch']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # a bad --data or --device
        sys.exit(f"error: {e}")
