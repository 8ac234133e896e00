"""Trains a GPT on a text file: python train.py [--option value ...]; python train.py --help lists every option.
Data-parallel over GPUs or CPU processes: torchrun --standalone --nproc_per_node=N train.py [...]

gpt.py holds the model and the training loop, gpt.Trainer.steps(). This file is the command line around that loop and
what a long run needs: DDP, resuming, saving on Ctrl-C and the signals schedulers send, the NaN stop, progress lines
with an ETA, and a closing report with a sample.
"""
import argparse
import contextlib
import dataclasses
import inspect
import math
import os
import re
import signal
import stat
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gpt

# A GPU trains a larger model in minutes: on CUDA these replace the CPU defaults of the options not given.
CUDA_DEFAULTS = dict(max_iters=5000, batch_size=64, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.1,
                     learning_rate=1e-3, min_lr=1e-4, eval_iters=100)
# What a user, a terminal or a scheduler sends to stop a run (SLURM's --signal sends SIGUSR1 or 2, CPU-time limits
# SIGXCPU): each saves the step under way, then exits with 128 + the signal's number, as a shell reports such an end.
STOPS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGXCPU")
         if hasattr(signal, name)]
MODEL_OPTIONS = [f.name for f in dataclasses.fields(gpt.GPTConfig) if f.name != "vocab_size"]  # kept on --resume


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's message on one line, without the usage block above it
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def number(kind, ok, rule):
    """An argparse type: a number of that kind for which ok(number) holds, written so that NaN fails it."""
    def parse(text):
        value = kind(text)  # a ValueError here becomes argparse's own "invalid int value"
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def parse_bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_args(argv=None):
    """Returns this file's own options, and the TrainConfig options given as {name: value} (the rest keep defaults)."""
    parser = Parser(description="Train a character-level GPT on a text; writes out_dir/ckpt.pt.")
    parser.add_argument("--data", default="input.txt",
                        help="training text, UTF-8; its last 10%% is held out for validation (default: %(default)s)")
    flag = dict(type=parse_bool, nargs="?", const=True, metavar="BOOL")  # --resume alone means --resume true
    parser.add_argument("--resume", default=False, **flag,
                        help="continue from out_dir/ckpt.pt, keeping its model and characters (default: %(default)s)")
    parser.add_argument("--log_interval", type=number(int, lambda n: n >= 1, "at least 1"), default=100,
                        help="print progress every this many steps (default: %(default)s)")
    parser.add_argument("--compile", default=False, **flag,
                        help="torch.compile the model: faster steps after compiling for a while (default: %(default)s)")
    # The help of every other option is its comment in gpt.py, so it is written once, beside the option itself.
    helps = dict(re.findall(r"^    (\w+): \w+ = .*?  # (.*)$", inspect.getsource(gpt.GPTConfig) +
                            inspect.getsource(gpt.TrainConfig), re.M))
    defaults = gpt.TrainConfig()
    for field in dataclasses.fields(gpt.TrainConfig)[1:]:  # all but vocab_size, which the text sets
        shown = repr(getattr(defaults, field.name)) + (f", on CUDA {CUDA_DEFAULTS[field.name]!r}"
                                                        if field.name in CUDA_DEFAULTS else "")
        text = f"{helps[field.name]} (default: {shown})".replace("%", "%%")
        parser.add_argument(f"--{field.name}", help=text, **(flag if field.type is bool else dict(type=field.type)))
    args = parser.parse_args(argv)
    own = ("data", "resume", "log_interval", "compile")
    return args, {name: value for name, value in vars(args).items() if value is not None and name not in own}


def read_text(path, what="the data file", flag="--data"):
    """The UTF-8 text at path, or one line that says why not and how to fix it."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # a folder; or a device or a pipe, which could be read forever
            raise OSError(0, "it is a folder" if stat.S_ISDIR(mode) else "it is not a regular file")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {what} {path} ({reason}): pass {flag} a UTF-8 text file") from None
    if not text:
        raise ValueError(f"{what} {path} is empty: pass {flag} a text with something in it")
    return text


def load(path, device=""):
    """gpt.load_checkpoint, with one line that says what is wrong when path holds no checkpoint it can read."""
    device = gpt.get_device(str(device))
    if not os.path.isfile(path):  # missing, or a folder, a device or a pipe
        raise ValueError(f"no checkpoint file at {path}: train one first with python train.py")
    try:
        model, tokenizer, ckpt = gpt.load_checkpoint(path, device)
        if tokenizer.vocab_size != model.config.vocab_size:  # else decoding a sampled token would fail
            raise ValueError(f"{tokenizer.vocab_size} characters for a vocab_size of {model.config.vocab_size}")
        return model, tokenizer, ckpt
    except Exception as e:
        first = re.split(r"(?<=\.)\s|\n", str(e).strip())[0]  # torch's own messages go on for lines
        raise ValueError(f"{path} is not a checkpoint this gpt.py can load ({type(e).__name__}"
                         f"{': ' + first if first else ''}); train a new one with python train.py") from None


def default_prompt(tokenizer):
    """A newline, where lines begin, if the training text had one; else its first character."""
    return "\n" if "\n" in tokenizer.stoi else tokenizer.chars[0]


def printable_stdout():
    """A character stdout cannot encode (an ASCII terminal, a Windows pipe) prints as an escape, \\xe9, not an error."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def silence_stdout():
    """Points stdout at /dev/null, so that later prints, and the flush at exit, no longer fail."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def printer(*args):
    """print, but when stdout goes away (python train.py | head) training goes on without it."""
    try:
        print(*args, flush=True)
    except OSError:  # BrokenPipeError, or a full disk
        silence_stdout()


def end_quietly():
    """For a reader gone away (python sample.py | head): no traceback, and the exit status of cat in its place."""
    silence_stdout()
    sys.exit(141)


def distributed():
    """(rank, local rank, world size) as torchrun sets them; (0, 0, 1) in a single process."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), world) if world > 1 else (0, 0, 1)
    except (KeyError, ValueError):
        raise ValueError(f"WORLD_SIZE is {os.environ.get('WORLD_SIZE')!r} without torchrun's RANK and LOCAL_RANK: "
                         f"launch with torchrun --nproc_per_node=N train.py, or unset WORLD_SIZE") from None


def check_out_dir(out_dir):
    """An unusable --out_dir fails now, not at the first save after minutes of training."""
    path = os.path.join(out_dir, "ckpt.pt")
    try:
        os.makedirs(out_dir, exist_ok=True)
        if os.path.exists(path) and not os.path.isfile(path):
            raise IsADirectoryError(0, "it is not a file")
    except OSError as e:  # makedirs says "File exists" of a file where the folder should be
        reason = f"{out_dir} is there, and not a folder" if isinstance(e, FileExistsError) else e.strerror
        raise ValueError(f"cannot write {path} ({reason}): pass --out_dir a writable folder") from None


def resumed(tc, text, path, given, rank, log):
    """A Trainer that goes on where the checkpoint at path stopped: its model and characters, AdamW's moments, the
    iteration, the clock and the random states. Model options given that differ from the checkpoint's are named as
    ignored, and the options it records say which model it holds."""
    model, tokenizer, ckpt = load(path, tc.device)
    ignored = [f"--{name} {given[name]}" for name in MODEL_OPTIONS
               if name in given and given[name] != getattr(model.config, name)]
    if ignored:
        log(f"--resume keeps the checkpoint's model, so these are ignored: {', '.join(ignored)}")
    tc = dataclasses.replace(tc, **{name: getattr(model.config, name) for name in MODEL_OPTIONS})
    missing = [key for key in ("optimizer", "iter", "elapsed", "rng") if key not in ckpt]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}: it can sample, but not resume; train without --resume")
    unknown = "".join(sorted(set(text) - tokenizer.stoi.keys()))
    if unknown:
        raise ValueError(f"the text has characters {path} never saw ({unknown!r}): resume on the text it was trained "
                         f"on (--data), or train without --resume")
    trainer = gpt.Trainer(process_config(tc, rank), text, model.train(), tokenizer, log)
    try:
        trainer.optimizer.load_state_dict(ckpt["optimizer"])
        trainer.it, trainer.elapsed = int(ckpt["iter"]), float(ckpt["elapsed"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        trainer.generator.set_state(ckpt["rng"]["batches"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path} holds a training state that does not fit its model ({type(e).__name__}); "
                         f"train without --resume") from None
    if rank:  # only the first process's random states are saved: the others draw new streams of their own
        trainer.generator.manual_seed(trainer.tc.seed + 1_000_003 * trainer.it)
        torch.manual_seed(trainer.tc.seed + 1_000_003 * trainer.it)
    log(f"resuming {path} at iteration {trainer.it}")
    return trainer


def process_config(tc, rank):
    """Each process draws its own batches (DDP starts every copy of the model from the first one's weights), and only
    the first writes checkpoints."""
    return dataclasses.replace(tc, seed=tc.seed + rank, out_dir=tc.out_dir if rank == 0 else "")


@contextlib.contextmanager
def signals_caught():
    """While training, a stopping signal only joins the list this yields, so the step under way finishes whole and
    can be saved; a second one stops at once, unsaved (the last checkpoint stays as it was). Handlers can be set only
    in the main thread; elsewhere the signals keep theirs."""
    caught = []

    def on_signal(signum, frame):
        if caught:
            raise KeyboardInterrupt  # the second: do not wait for the step
        caught.append(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.signal(s, on_signal) for s in STOPS} if main_thread else {}
    try:
        yield caught
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def agree(trainer, stop, world):
    """Under DDP, every process must stop at the same step and read the same clock (max_time), or the others wait
    forever in the next all-reduce: each takes the largest stop signal and clock of them all."""
    if world == 1:
        return stop
    flags = torch.tensor([stop, trainer.elapsed], dtype=torch.float64, device=trainer.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    trainer.elapsed = flags[1].item()
    return int(flags[0])


class Progress:
    """The progress line: loss, learning rate, the steps' own time (the evaluations between them left out), and ETA."""

    def __init__(self, trainer, tokens_per_step):
        self.trainer, self.tokens_per_step = trainer, tokens_per_step
        self.t_step = self.t_line = time.time()
        self.it_line, self.timed, self.timed_steps = trainer.it, 0.0, 0

    def step(self):
        """Called after each step: it counts unless an evaluation ran since the step before."""
        now = time.time()
        if (self.trainer.it - 1) % self.trainer.tc.eval_interval:
            self.timed, self.timed_steps = self.timed + now - self.t_step, self.timed_steps + 1
        self.t_step = now

    def line(self, loss):
        trainer, tc, it = self.trainer, self.trainer.tc, self.trainer.it
        dt = max(self.timed / self.timed_steps if self.timed_steps else
                 (self.t_step - self.t_line) / max(1, it - self.it_line), 1e-9)  # seconds per step
        left = tc.max_time - trainer.elapsed if tc.max_time else (tc.max_iters - it) * dt
        self.t_line, self.it_line, self.timed, self.timed_steps = self.t_step, it, 0.0, 0
        return (f"iter {it}" + ("" if tc.max_time else f"/{tc.max_iters}") + f" | loss {loss:.4f} | lr "
                f"{trainer.optimizer.param_groups[0]['lr']:.2e} | {self.tokens_per_step} tok/step | {dt * 1000:.1f} "
                f"ms/iter | {self.tokens_per_step / dt / 1000:.1f}k tok/s | ETA {max(left, 0) / 60:.1f} min")


@torch.no_grad()
def loss_by_position(trainer):
    """Mean val loss at each position of eval_iters batches, (T,): what each character more of context buys."""
    trainer.model.eval()
    losses = []
    for _ in range(trainer.tc.eval_iters):
        x, y = trainer.batch("val")
        with trainer.amp:
            logits = trainer.model(x)[0].float()  # (B, T, vocab_size)
        losses.append(F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(0))  # (T,)
    return torch.stack(losses).mean(0)


def run(tc, text, log=print, resume=False, log_interval=100, compile=False, given=()):
    """Trains as tc says, around gpt.Trainer.steps(); under torchrun, data-parallel. Returns the trainer and the
    signal that stopped it, or None when it ran to the end. given: the options the user set, for --resume."""
    rank, local_rank, world = distributed()
    if world == 1:
        return _run(tc, text, log, resume, log_interval, compile, given, 0, 1)
    if gpt.get_device(tc.device).type == "cuda":
        tc = dataclasses.replace(tc, device=f"cuda:{local_rank}")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if tc.device.startswith("cuda") else "gloo")
    try:
        return _run(tc, text, log if rank == 0 else lambda *args: None, resume, log_interval, compile, given, rank,
                    world)
    finally:
        dist.destroy_process_group()


def _run(tc, text, log, resume, log_interval, compile, given, rank, world):
    path = os.path.join(tc.out_dir, "ckpt.pt")
    if tc.out_dir and rank == 0:
        check_out_dir(tc.out_dir)
    trainer = resumed(tc, text, path, given, rank, log) if resume else \
        gpt.Trainer(process_config(tc, rank), text, log=log)
    if tc.out_dir and not resume and os.path.isfile(path):  # checked last, so that other mistakes are named first
        raise ValueError(f"{path} holds an earlier run, which this one would overwrite: continue it with --resume, "
                         f"or start anew in another --out_dir (or remove it)")
    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if compile:
        trainer.train_model = torch.compile(trainer.train_model)
    if world > 1:
        trainer.train_model = torch.nn.parallel.DistributedDataParallel(
            trainer.train_model, device_ids=[trainer.device.index] if cuda else None)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    log(f"{n_params / 1e6:.2f}M parameters on {trainer.device}" + (f", {world} processes" if world > 1 else ""))
    progress = Progress(trainer, tc.batch_size * trainer.model.config.block_size * tc.grad_accum * world)
    with signals_caught() as caught:
        for _ in trainer.steps():
            progress.step()
            it, stop = trainer.it, agree(trainer, max(caught, default=0), world)
            last = stop or trainer.done()
            if it % log_interval == 0 or it % tc.eval_interval == 0 or last:  # and so before every save
                loss = trainer.loss.item()
                if not math.isfinite(loss):
                    raise ValueError(f"the training loss is {loss} at iteration {it}: training diverged; lower "
                                     f"--learning_rate or raise --warmup_iters (the last good checkpoint in "
                                     f"{tc.out_dir} is left as it was)")
                if it % log_interval == 0 or last:
                    log(progress.line(loss))
            if stop:
                trainer.save()
                log(f"{signal.Signals(stop).name}: " + (f"saved iteration {it} to {path}; continue with --resume"
                                                        if tc.out_dir else f"stopped at iteration {it}, unsaved"))
                return trainer, stop
    if rank == 0 and trainer.history["val"]:
        report(trainer, path, log)
    elif rank == 0:
        log(f"nothing to train: {path} is at iteration {trainer.it}; raise --max_iters or --max_time to go on")
    return trainer, None


def report(trainer, path, log):
    log(f"saved {path} ({trainer.elapsed:.0f} s of training)" if trainer.tc.out_dir else "trained; no --out_dir")
    by_position = loss_by_position(trainer)
    log(f"what context buys: val loss {by_position[0]:.3f} at position 0 (one character of context, all a bigram "
        f"model has) against {by_position[-1]:.3f} at position {len(by_position) - 1}")
    tok = trainer.tokenizer
    prompt = torch.tensor([tok.encode(default_prompt(tok))], device=trainer.device)
    with trainer.amp:
        sample = trainer.model.eval().generate(prompt, 300, temperature=0.8,
                                               generator=torch.Generator(trainer.device).manual_seed(0))
    log("sample:\n" + tok.decode(sample[0, 1:].tolist()))


def main(argv=None):
    args, given = parse_args(argv)
    world = 1
    printable_stdout()
    try:
        world = distributed()[2]
        defaults = CUDA_DEFAULTS if gpt.get_device(given.get("device", "")).type == "cuda" else {}
        tc = gpt.TrainConfig(**{**defaults, **given})
        text = read_text(args.data)
        _, stopped = run(tc, text, printer, args.resume, args.log_interval, args.compile, given)
    except KeyboardInterrupt:  # before the training loop, or a second signal in it: nothing more to save
        sys.exit(130)
    except (ValueError, OSError, RuntimeError) as e:
        # Under torchrun every process meets the same error; the first one says it.
        sys.exit(f"error: {one_line(e)}" if world == 1 or os.environ.get("RANK") == "0" else 1)
    if stopped:
        sys.exit(128 + stopped)


def one_line(error, advice="use a smaller model, --batch_size or --block_size"):
    """What the error says, its first line; a failed torch.compile or out of memory, with advice. Any other
    RuntimeError is a bug, raised again with its traceback, which helps to find it."""
    first = (str(error).strip().splitlines() or [""])[0]
    if isinstance(error, (ValueError, OSError)):
        return first
    if type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):  # torch.compile's (--compile)
        return f"torch.compile failed ({first}): train without --compile"
    if "memory" not in str(error):
        raise error
    return f"out of memory ({first}): {advice}"


if __name__ == "__main__":
    main()
