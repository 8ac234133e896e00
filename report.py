"""The report of a training run: one self-contained HTML page, out_dir/report.html, to open in any
browser or print. It shows the train and val loss against steps and seconds with the learning rate,
the val loss at each position of the context (what each token of context buys), the attention maps
of every layer and head for one line of the held-out text, the closing sample, the model and the
run's figures. While a run trains, its progress line (Progress) reports it on the terminal.

train.py writes it when a run ends (a run a signal stops leaves it to python sample.py --report,
which rebuilds it from any evaluated checkpoint and its text). The pictures are inline SVG written here, the
attention maps in them small PNG images: the page fetches nothing and runs no script.
"""
import base64
import contextlib
import html
import math
import os
import shutil
import struct
import time
import zlib

import torch
import torch.nn.functional as F

import cli
import gpt

# The most tokens of a line the attention maps show: each map is this many cells square.
MAP_TOKENS = 32
COLOURS = {"train": "#1f77b4", "val": "#d62728", "lr": "#7f7f7f"}


# ---------------------------------------------------------------------------------------------- figures
@torch.no_grad()
def loss_by_position(model, val, tc):
    """The mean loss of model at each position of eval_iters batches of the held-out ids val,
    (block_size,): what each token more of context buys. The windows are spread evenly over val, so
    that the figure is the same each time it is drawn; never more than val holds back to back, nor
    more than gpt.MAX_EVAL_TOKENS of tokens in all."""
    T = tc.block_size
    device = next(model.parameters()).device
    windows = min(tc.eval_iters * tc.batch_size, (len(val) - 1) // T, max(1, gpt.MAX_EVAL_TOKENS // T))
    starts = torch.linspace(0, len(val) - T - 1, max(1, windows)).long()
    model.eval()
    # A running sum: the memory of one batch, however many there are.
    total = torch.zeros(T, device=device)
    for ix in starts.split(tc.batch_size):
        xy = torch.as_tensor(val[ix[:, None] + torch.arange(T + 1)]).long().to(device)  # (B, T + 1)
        with gpt.autocast(device):
            logits, _ = model(xy[:, :-1])
        total += F.cross_entropy(logits.float().transpose(1, 2), xy[:, 1:], reduction="none").sum(0)
    return (total / len(starts)).cpu()


@torch.no_grad()
def attention(model, idx):
    """The attention weights of every layer and head of model, a gpt.GPT, for the ids idx (B, T):
    (n_layer, B, n_head, T, T), each row a probability distribution over the positions it may see.
    Training and sampling run the fused attention, which never forms them; here they are spelled
    out from the model's own modules, softmax(q k^T / sqrt(hs)) under the causal mask, in eval
    mode."""
    training = model.training
    model.eval()
    # What each layer's attention is given, (its input, rope), seen during one forward of the model.
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[:2]))
             for block in model.h]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(training)
    T = idx.size(1)
    # Above the diagonal are the later positions: -inf there becomes weight 0.
    later = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
    maps = []
    for block, (x, rope) in zip(model.h, inputs):
        q, k, _ = block.attn.heads(x, rope)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, T, T)
        maps.append(scores.masked_fill(later, float("-inf")).softmax(dim=-1))
    return torch.stack(maps)


def default_prompt(tokenizer, val=None):
    """The ids a sample starts from when no prompt is given: a newline, where lines begin, if the
    tokenizer has one; else the first held-out token, or (none given) the vocabulary's first."""
    if tokenizer is not None and "\n" in getattr(tokenizer, "stoi", {"\n": None}):
        try:
            return tokenizer.encode("\n")
        except ValueError:
            pass
    return [0 if val is None else int(val[0])]


def decode(tokenizer, ids):
    """The text of ids, or the ids themselves where there is no tokenizer here to decode them, or
    one cannot (an id past its vocabulary, which a model of a larger one may draw)."""
    try:
        return tokenizer.decode(ids)
    except (AttributeError, ValueError, KeyError, IndexError):
        return " ".join(map(str, ids))


def sampling_autocast(device):
    """gpt.autocast on a GPU; float32 on a CPU, which decodes a row at a time and there bf16's casts
    cost more than its products save (2.5 against 1.9 ms a token, the default model, AVX512-BF16)."""
    if device.type == "cuda":
        return gpt.autocast(device)
    return torch.autocast(device.type, enabled=False)


@torch.no_grad()
def closing_sample(model, tokenizer, val, tokens=300):
    """300 tokens drawn at temperature 0.8 after default_prompt, with a seeded generator."""
    device = next(model.parameters()).device
    prompt = torch.tensor([default_prompt(tokenizer, val)], device=device)
    generator = torch.Generator(device).manual_seed(0)
    with sampling_autocast(device):
        sample = model.eval().generate(prompt, tokens, temperature=0.8, generator=generator)
    return decode(tokenizer, sample[0, prompt.size(1):].tolist())


def attention_line(tokenizer, val, block_size, device):
    """Token ids (1, T) of one line of the held-out ids val, T at most MAP_TOKENS: the tokens after
    its first newline, or its first tokens."""
    T = min(MAP_TOKENS, block_size)
    start = 0
    newline = default_prompt(tokenizer, val)
    head = [int(i) for i in val[:4 * T]]
    if len(newline) == 1 and newline[0] in head[:3 * T]:
        start = head.index(newline[0]) + 1
    # A newline near the held-out text's end has no line after it to show.
    if len(head) - start < min(T, start):
        start = 0
    return torch.tensor([head[start:start + T]], device=device)


def visible(text):
    """text with each character cli.hidden says written as its escape, as \\x1b: its controls but a
    line's end and the tab, lone surrogates, non-characters, the marks that turn a line and tags."""
    return "".join(c.encode("unicode_escape").decode("ascii") if cli.hidden(c) else c for c in text)


def printer(*args):
    """cli.printer, each argument with its controls and marks written as visible() writes them: a path
    given, or a text's characters, may hold a terminal's escape."""
    cli.printer(*(visible(str(arg)) for arg in args))


def labels(tokenizer, ids):
    """What each token looks like on an axis: its text, with a newline, a space and a tab drawn."""
    shown = []
    for i in ids:
        text = decode(tokenizer, [i]) if tokenizer is not None else str(i)
        text = text.replace("\n", "\u21b5").replace(" ", "\u2423").replace("\t", "\u21e5")
        shown.append(visible(text[:8]))
    return shown


# ---------------------------------------------------------------------------------------------- drawing
def nice_ticks(low, high, count=5):
    """About count round numbers, 1, 2 or 5 times a power of ten apart, from at most low to at
    least high."""
    # A span too small to tell apart beside its values (5e-324 beside 0 among them) is drawn as flat.
    if not high - low > 1e-9 * max(1, abs(low), abs(high)):
        high = low + abs(low) * 0.1 + 1e-9
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step + 1e-9) * step
    last = math.ceil(high / step - 1e-9) * step
    # Rounded, so that 3 * 0.05 is 0.15, not 0.15000000000000002.
    return [round(first + i * step, 12) for i in range(round((last - first) / step) + 1)]


# The most points a chart's line is drawn through, and the most that get a dot each.
MAX_DRAWN = 1000
MAX_DOTS = 200


def thinned(placed):
    """placed, [(px, py)] in x's order, through MAX_DRAWN points at most: of each run of them, the
    highest and the lowest, in order, so that no spike is lost; the last always. A run evaluated
    every step draws a page of kilobytes, not of its evaluations' count."""
    if len(placed) <= MAX_DRAWN:
        return placed
    size = math.ceil(2 * len(placed) / MAX_DRAWN)
    kept = []
    for run in (placed[i:i + size] for i in range(0, len(placed), size)):
        heights = [py for _, py in run]
        extremes = {heights.index(min(heights)), heights.index(max(heights))}
        kept += [run[j] for j in sorted(extremes)]
    return kept if kept[-1] == placed[-1] else kept + [placed[-1]]


def numbers(ticks):
    """The ticks as the axis writes them: four significant digits, or as many more as tell them apart
    (4.17430 beside 4.17440)."""
    for digits in range(4, 16):
        said = [f"{t:.{digits}g}" for t in ticks]
        if len(set(said)) == len(said):
            break
    return said


def chart(title, x_label, y_label, series, right=None, right_label="", right_scale=None,
          width=520, height=300):
    """An SVG line chart. series: [(name, [(x, y), ...])], a dot at every point (but where there are
    more than MAX_DOTS), coloured as COLOURS; right: one more series on a scale of its own, on the
    right; right_scale instead labels the right axis with the left's values times it (bits beside
    nats)."""
    left, top, bottom, gap = 58, 28, 42, 58
    plot_w = width - left - gap
    plot_h = height - top - bottom
    points = [p for _, ps in series for p in ps]
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(min(ys), max(ys))
    x_lo, x_hi = x_ticks[0], x_ticks[-1]
    y_lo, y_hi = y_ticks[0], y_ticks[-1]

    def place(x, y, lo, hi):
        px = left + (x - x_lo) / ((x_hi - x_lo) or 1) * plot_w
        py = top + plot_h - (y - lo) / ((hi - lo) or 1) * plot_h
        return px, py

    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{left}" y="16" class="title">{html.escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    for t, said in zip(x_ticks, numbers(x_ticks)):
        px, _ = place(t, y_lo, y_lo, y_hi)
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + plot_h}" class="grid"/>')
        out.append(f'<text x="{px:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">'
                   f'{said}</text>')
    for t, said in zip(y_ticks, numbers(y_ticks)):
        _, py = place(x_lo, t, y_lo, y_hi)
        out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{left + plot_w}" y2="{py:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{py + 4:.1f}" class="tick" text-anchor="end">{said}</text>')
    if right_scale:
        # Round numbers of the right axis's own unit, placed where the left axis has them.
        ticks = nice_ticks(y_lo * right_scale, y_hi * right_scale)
        for t, said in zip(ticks, numbers(ticks)):
            if y_lo <= t / right_scale <= y_hi:
                _, py = place(x_lo, t / right_scale, y_lo, y_hi)
                out.append(f'<text x="{left + plot_w + 6}" y="{py + 4:.1f}" class="tick">{said}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" class="label" text-anchor="middle">'
               f'{html.escape(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + plot_h / 2}) rotate(-90)" class="label" '
               f'text-anchor="middle">{html.escape(y_label)}</text>')
    drawn = [(name, ps, y_lo, y_hi) for name, ps in series]
    if right:
        name, ps = right
        r_ticks = nice_ticks(min(y for _, y in ps), max(y for _, y in ps))
        r_lo, r_hi = r_ticks[0], r_ticks[-1]
        drawn.append((name, ps, r_lo, r_hi))
        for t, said in zip(r_ticks, numbers(r_ticks)):
            _, py = place(x_lo, t, r_lo, r_hi)
            out.append(f'<text x="{left + plot_w + 6}" y="{py + 4:.1f}" class="tick" '
                       f'fill="{COLOURS[name]}">{said}</text>')
    if right or right_scale:
        out.append(f'<text transform="translate({width - 10} {top + plot_h / 2}) rotate(90)" '
                   f'class="label" text-anchor="middle">{html.escape(right_label)}</text>')
    for i, (name, ps, lo, hi) in enumerate(drawn):
        placed = [place(x, y, lo, hi) for x, y in ps]
        colour = COLOURS.get(name, "#333")
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in thinned(placed))
        dash = ' stroke-dasharray="5 3"' if right and i == len(drawn) - 1 else ""
        out.append(f'<polyline class="series {name}" data-points="{len(ps)}" points="{path}" '
                   f'stroke="{colour}"{dash}/>')
        if len(placed) <= MAX_DOTS:
            out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}"/>' for px, py in placed]
        out.append(f'<text x="{left + plot_w - 8 - 48 * (len(drawn) - 1 - i)}" y="16" class="legend" '
                   f'fill="{colour}" text-anchor="end">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def png(rows):
    """A PNG image of rows of (r, g, b) pixels, written with zlib: the format's signature, then its
    IHDR, IDAT and IEND chunks."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    height = len(rows)
    width = len(rows[0])
    # Each row starts with its filter, 0: none.
    raw = b"".join(b"\x00" + bytes(c for pixel in row for c in pixel) for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def shade(weight):
    """The colour of an attention weight in [0, 1]: white for 0, dark blue for 1. The square root
    lets weights of a few percent show."""
    w = math.sqrt(max(0.0, min(1.0, weight)))
    return int(255 - 225 * w), int(255 - 190 * w), int(255 - 90 * w)


def attention_map(weights, names, title, cell=8):
    """One head's map as SVG: weights (T, T), row i the weights query i gives each key; the causal
    mask's cells above the diagonal in grey. names: the tokens, along both axes."""
    T = len(names)
    rows = [[shade(weights[i][j]) if j <= i else (236, 236, 236) for j in range(T)] for i in range(T)]
    image = base64.b64encode(png(rows)).decode()
    margin = 12 + 6 * max(len(n) for n in names)
    size = margin + T * cell + 4
    out = [f'<svg class="attention" width="{size}" height="{size + 16}" viewBox="0 0 {size} '
           f'{size + 16}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{margin}" y="11" class="title">{html.escape(title)}</text>',
           f'<image x="{margin}" y="{margin + 16}" width="{T * cell}" height="{T * cell}" '
           f'preserveAspectRatio="none" style="image-rendering:pixelated" '
           f'href="data:image/png;base64,{image}"/>']
    for i, name in enumerate(names):
        y = margin + 16 + i * cell + cell - 2
        out.append(f'<text x="{margin - 3}" y="{y}" class="token" text-anchor="end">{html.escape(name)}</text>')
        x = margin + i * cell + cell - 2
        out.append(f'<text transform="translate({x} {margin + 13}) rotate(-90)" class="token">'
                   f'{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 24px auto;
       max-width: 1240px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
p.note { color: #555; margin-top: 0; }
table { border-collapse: collapse; } td, th { padding: 2px 12px 2px 0; text-align: left; vertical-align: top; }
th { font-weight: 600; color: #444; }
.row { display: flex; flex-wrap: wrap; gap: 12px 24px; align-items: flex-start; }
.layer { margin: 10px 0 4px; font-weight: 600; }
pre { background: #f6f6f6; padding: 10px 12px; white-space: pre-wrap; font-size: 13px; }
svg text { font-family: system-ui, sans-serif; }
svg .title { font-size: 13px; font-weight: 600; } svg .tick { font-size: 11px; fill: #555; }
svg .label { font-size: 12px; fill: #333; } svg .legend { font-size: 12px; font-weight: 600; }
svg .token { font: 8px ui-monospace, "DejaVu Sans Mono", monospace; fill: #333; }
svg .frame { fill: none; stroke: #bbb; } svg .grid { stroke: #eee; }
svg polyline { fill: none; stroke-width: 1.8; }
@media print { body { margin: 0; max-width: none; } .row { break-inside: avoid; } }
"""


def table(rows):
    return "<table>" + "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                               for k, v in rows) + "</table>"


def page(model, tokenizer, history, val, tc, by_position, sample, figures):
    """The report's HTML."""
    config = model.config
    # Where the run stood at its last evaluation.
    it = history[-1]["iter"]
    elapsed = history[-1]["seconds"]
    n_params = sum(p.numel() for p in model.parameters())
    steps = [(h["iter"], h) for h in history]
    losses = [(split, [(it, h[split]) for it, h in steps]) for split in ("train", "val")]
    by_seconds = [(split, [(h["seconds"], h[split]) for h in history]) for split in ("train", "val")]
    per_position = [(i, float(v)) for i, v in enumerate(by_position)]
    # Read over the steps since the evaluation before the last: a resume may have changed the tokens a
    # step, and figures give the last ones.
    since = {"iter": 0, "seconds": 0.0}
    # A hand-made history may stand still or run back: then the whole run.
    if len(history) > 1 and history[-2]["iter"] < it and history[-2]["seconds"] < elapsed:
        since = history[-2]
    steps_read = it - since["iter"]
    tokens_per_s = figures["tokens_per_step"] * steps_read / max(elapsed - since["seconds"], 1e-9)
    processes = f"{figures['processes']} process{'es' if figures['processes'] > 1 else ''}"
    stretch = f"the last {steps_read:,} steps" if steps_read > 1 else "the last step"
    run_rows = [("steps", f"{it:,}"), ("training time", f"{elapsed:.0f} s"),
                ("tokens per second", f"{tokens_per_s:,.0f} over {stretch} ({processes})"),
                ("parameters", f"{n_params:,}"), ("last val loss", f"{history[-1]['val']:.4f}")]
    if getattr(tokenizer, "chars", None) is not None:
        run_rows.append(("bits per character", f"{history[-1]['val'] / math.log(2):.3f}"))
    line = attention_line(tokenizer, val, tc.block_size, next(model.parameters()).device)
    names = labels(tokenizer, line[0].tolist())
    maps = attention(model, line)[:, 0].float().cpu()  # (n_layer, n_head, T, T)
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>GPT training report</title><style>{STYLE}</style></head><body>",
             "<h1>GPT training report</h1>",
             f"<p class=\"note\">{config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, "
             f"a context of {config.block_size} tokens ({config.norm}, {config.pos} positions, "
             f"{config.mlp}); trained {it:,} steps in {elapsed:.0f} s. Written by "
             f"train.py; python sample.py --report writes it again from the checkpoint.</p>",
             "<h2>Loss</h2><div class=\"row\">",
             chart("Loss against steps", "step", "loss (nats)", losses,
                   right=("lr", [(it, h["lr"]) for it, h in steps]), right_label="learning rate"),
             chart("Loss against seconds", "seconds of training", "loss (nats)", by_seconds),
             "</div>",
             "<h2>What context buys</h2>"
             "<p class=\"note\">The val loss at each position of the context: the first position "
             "knows one token, as a bigram model does; each one after knows one more.</p>",
             chart("Val loss at each position", "position in the context", "loss (nats)",
                   [("val", per_position)], right_scale=1 / math.log(2), right_label="bits"),
             "<h2>Attention</h2>",
             "<p class=\"note\">Where each token of one held-out line looks: row i is the weights "
             "token i gives the tokens up to it, from white (0) to dark blue (1); grey cells are "
             "later tokens, which it may not see. From report.attention(model, ids), shape "
             "(n_layer, B, n_head, T, T).</p>"]
    for layer in range(maps.size(0)):
        parts.append(f"<div class=\"layer\">layer {layer}</div><div class=\"row\">")
        parts += [attention_map(maps[layer, head].tolist(), names, f"layer {layer}, head {head}")
                  for head in range(maps.size(1))]
        parts.append("</div>")
    model_rows = [(f.replace("_", " "), v) for f, v in vars(config).items()]
    train_rows = [(k, getattr(tc, k)) for k in ("batch_size", "short_context", "grad_accum",
                                                "learning_rate", "min_lr", "warmup_iters", "weight_decay",
                                                "beta2", "grad_clip", "max_iters", "max_time", "seed")]
    parts += ["<h2>Sample</h2>", f"<pre>{html.escape(visible(sample))}</pre>",
              "<h2>The run</h2><div class=\"row\">", table(run_rows), table(model_rows),
              table(train_rows), "</div></body></html>"]
    return "\n".join(parts)


def write(path, text):
    """Writes the page text to path, whole or not at all: a temporary file of this process's own
    name, so that two writers never share one, renamed over path, and removed if anything fails.
    A file already at path keeps its permissions (one kept private stays private). Returns path."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        # As far as the file system lets it: one that takes no chmod still takes the page.
        with contextlib.suppress(OSError):
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def make(model, tokenizer, history, val, tc, out_dir, figures, log):
    """The closing report of a run, from its model, its tokenizer, its evaluations (history), its
    held-out ids (val) and its options (tc): what context buys and a sample, each told to log, and
    the page, out_dir/report.html (none for ""), whose path it returns. An OSError says the page was
    not written. The model is left in eval mode."""
    by_position = loss_by_position(model, val, tc)
    # Hand-made weights may give a next token no chance at all, or overflow (NaN): no loss to draw.
    if not by_position.isfinite().all():
        at = int((~by_position.isfinite()).nonzero()[0])
        why = "its outputs overflow" if by_position[at].isnan() else "it gives some next token no chance at all"
        raise ValueError(f"the model's val loss at position {at} is {float(by_position[at])}: {why}, so the "
                         f"report cannot draw it")
    log(f"what context buys: val loss {by_position[0]:.3f} at position 0 (one token of context, all "
        f"a bigram model has) against {by_position[-1]:.3f} at position {len(by_position) - 1}")
    sample = closing_sample(model, tokenizer, val)
    # A text's controls would drive the terminal (a checkpoint's characters may hold any).
    log("sample:\n" + visible(sample))
    if not out_dir:
        return None
    path = os.path.join(out_dir, "report.html")
    try:
        return write(path, page(model, tokenizer, history, val, tc, by_position, sample, figures))
    except OSError as e:
        raise OSError(e.errno, f"cannot write {path} ({e.strerror}): the report was not written") from None


# ------------------------------------------------------------------------------------ the progress line
def diverged(trainer):
    """What a loss that is not finite says: where, and each option that can make training diverge,
    without guessing which one did."""
    tc = trainer.tc
    muon = f", --muon_lr {tc.muon_lr:g}" if tc.optimizer == "muon" else ""
    kept = f"; the last checkpoint in {tc.out_dir} is left as it was" if tc.out_dir else ""
    return (f"the training loss is {trainer.loss.item()} at iteration {trainer.it}: training diverged. "
            f"Too high a --learning_rate {tc.learning_rate:g}{muon} or --weight_decay "
            f"{tc.weight_decay:g}, too short a --warmup_iters {tc.warmup_iters}, --grad_clip "
            f"{tc.grad_clip:g} (0: off), or starting weights too large (a checkpoint's, GPT-2's) can "
            f"cause it{kept}")


class Progress:
    """The progress line: loss, learning rate, the steps' own time (the evaluations between them
    left out), and the ETA."""

    def __init__(self, trainer, tokens_per_step):
        self.trainer = trainer
        self.tokens_per_step = tokens_per_step
        self.t_step = time.time()
        self.t_line = self.t_step
        self.it_line = trainer.it
        self.timed = 0.0
        self.timed_steps = 0

    def step(self):
        """Called after each step: it counts unless an evaluation ran since the step before."""
        now = time.time()
        if (self.trainer.it - 1) % self.trainer.tc.eval_interval:
            self.timed += now - self.t_step
            self.timed_steps += 1
        self.t_step = now

    def line(self, loss):
        trainer = self.trainer
        tc = trainer.tc
        it = trainer.it
        if self.timed_steps:
            dt = self.timed / self.timed_steps
        else:
            dt = (self.t_step - self.t_line) / max(1, it - self.it_line)
        dt = max(dt, 1e-9)
        if tc.max_time:
            left = tc.max_time - trainer.elapsed
        else:
            left = (tc.max_iters - it) * dt
        self.t_line = self.t_step
        self.it_line = it
        self.timed = 0.0
        self.timed_steps = 0
        return (f"iter {it}" + ("" if tc.max_time else f"/{tc.max_iters}") + f" | loss {loss:.4f} | lr "
                f"{trainer.lr:.2e} | {self.tokens_per_step} tok/step | {dt * 1000:.1f} ms/iter | "
                f"{self.tokens_per_step / dt / 1000:.1f}k tok/s | ETA {max(left, 0) / 60:.1f} min")
