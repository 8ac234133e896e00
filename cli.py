"""What the command lines (train.py, sample.py, bench.py) share: argparse with one-line errors, the
rules of every option (its type, limits and help, in one place), the device check, and the output's
edge cases.

Bad input is refused here, where it arrives, in one line that says what is wrong and what to do;
gpt.py keeps only the checks that guard the model itself.
"""
import argparse
import dataclasses
import math
import os
import sys

import torch

import data
import gpt


class Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's message on one line, without the usage block above it; under torchrun, from
        # the first process alone, as every process reads the same command line.
        self.exit(2, None if other_process() else f"{self.prog}: error: {message} (see --help)\n")


def other_process():
    """Whether this is a process of a torchrun job other than the first (RANK 1 and on)."""
    rank = os.environ.get("RANK", "0")
    return os.environ.get("WORLD_SIZE", "1") != "1" and rank.isdigit() and int(rank) > 0


def number(kind, ok, rule):
    """An argparse type: a number of that kind for which ok(number) holds, written so that NaN
    fails it."""
    def parse(text):
        # A ValueError here becomes argparse's own "invalid int value".
        value = kind(text)
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


# An option that is a switch: --compile alone, or --compile false.
FLAG = dict(type=parse_bool, nargs="?", const=True, metavar="BOOL")


def usable_device(name=""):
    """gpt.get_device(name), refused in one line unless this machine can compute on it."""
    try:
        found = gpt.get_device(name)
        # Meta's tensors hold no values: nothing can train or sample there.
        if found.type in ("cpu", "cuda", "mps"):
            # Only a device this machine has can hold a tensor.
            torch.empty(0, device=found)
            return found
    # AssertionError: this PyTorch was built without CUDA.
    except (RuntimeError, AssertionError):
        pass
    raise ValueError(f"device {name!r} is unknown or not on this machine: use cpu, cuda, cuda:N or mps")



# The range [low, high) of each number of TrainConfig: NaN fails both comparisons, and inf the
# second. The command lines refuse any other value before a config is built, and a checkpoint's
# recorded options are held to the same.
LIMITS = {**dict.fromkeys(["block_size", "n_layer", "n_head", "n_embd", "max_iters",
                           "eval_interval", "eval_iters", "batch_size", "grad_accum"], (1, 2 ** 53)),
          **dict.fromkeys(["max_time", "min_lr", "warmup_iters", "weight_decay", "grad_clip"],
                          (0, math.inf)),
          "dropout": (0, 1), "beta2": (0, 1), "learning_rate": (1e-9, 1), "seed": (0, 2 ** 32),
          "vocab_size": (1, data.MAX_VOCAB + 1), "muon_lr": (1e-9, 1), "muon_momentum": (0, 1)}
# The values of each option that names one: the model's switches and the optimizer, gpt.py's.
CHOICES = gpt.CHOICES
# Each option's help, which --help shows with its default.
HELP = {
    "vocab_size": "Tokens in the vocabulary.",
    "block_size": "The context: the most tokens the model reads at once.",
    "n_layer": "Transformer blocks.",
    "n_head": "Attention heads.",
    "n_embd": "Width of the residual stream.",
    "dropout": "Dropout probability.",
    "bias": "Biases in the linear layers and LayerNorm.",
    "tie_weights": "Share the token embedding with the output layer.",
    "norm": "rmsnorm or layernorm (GPT-2's).",
    "pos": "rope (rotary) or learned (GPT-2's position embeddings).",
    "mlp": "swiglu or gelu (GPT-2's).",
    "out_dir": 'Folder of ckpt.pt, the checkpoint, and report.html ("" writes none).',
    "max_iters": "Optimizer steps in all.",
    "max_time": "Seconds of wall time to train instead of max_iters (0: off); the learning rate "
                "then decays over time.",
    "eval_interval": "Evaluate and save every this many steps.",
    "eval_iters": "Batches per split in an evaluation.",
    "batch_size": "Sequences per micro-batch: at a fixed time, many small steps beat fewer big ones.",
    "grad_accum": "Micro-batches per optimizer step.",
    "learning_rate": "Peak learning rate (AdamW's).",
    "min_lr": "Learning rate at the end of the cosine decay.",
    "warmup_iters": "Steps of linear warmup.",
    "weight_decay": "Weight decay, on matrices only.",
    "beta2": "AdamW's beta2: a shorter memory than the usual 0.999 suits small batches of characters.",
    "optimizer": "adamw, or muon: Muon for the blocks' matrices, AdamW for the embeddings, gains "
                 "and biases.",
    "muon_lr": "Muon's peak learning rate, on learning_rate's schedule.",
    "muon_momentum": "Muon's momentum.",
    "grad_clip": "Clip the gradient norm to this (0: off).",
    "seed": "Random seed: the initial weights, the batches and dropout.",
    "device": 'cpu, cuda, cuda:N or mps ("": the best available).',
}
# The type of each TrainConfig option.
OPTION_TYPES = {f.name: f.type for f in dataclasses.fields(gpt.TrainConfig)}


def allowed(name, value):
    """Whether value is one the option name can take: of its type (a whole number for a float),
    within its limits, one of its choices."""
    kind = OPTION_TYPES[name]
    if kind is float and type(value) is int:
        value = float(value)
    low, high = LIMITS.get(name, (None, None))
    in_range = low is None or (type(value) is not str and low <= value < high)
    return type(value) is kind and in_range and value in CHOICES.get(name, (value,))


def option_rule(name):
    """argparse's keywords for the TrainConfig option name: its type, limits or choices, and help.
    --help shows the default after the help, which the caller adds."""
    kind = OPTION_TYPES[name]
    rule = dict(help=HELP.get(name, ""))
    if kind is bool:
        return {**rule, **FLAG}
    if name in CHOICES:
        return {**rule, "choices": CHOICES[name]}
    low, high = LIMITS.get(name, (-math.inf, math.inf))
    return {**rule, "type": number(kind, lambda v: allowed(name, v), f"in [{low}, {high})")}


def parse_option(name, text):
    """The value text gives the TrainConfig option name, by the rule of its flag; an
    argparse.ArgumentTypeError says what is wrong."""
    if name not in OPTION_TYPES:
        raise argparse.ArgumentTypeError(f"no option {name}: see python train.py --help")
    rule = option_rule(name)
    if "choices" in rule:
        if text not in rule["choices"]:
            raise argparse.ArgumentTypeError(f"{name} must be one of {', '.join(rule['choices'])}, "
                                             f"got {text}")
        return text
    try:
        return rule["type"](text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be {OPTION_TYPES[name].__name__}, got {text}")



# ---------------------------------------------------------------------------------------------- output
def printable_stdout():
    """A character stdout cannot encode (an ASCII terminal, a Windows pipe) prints as an escape,
    \\xe9, not an error."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def silence_stdout():
    """Flushes what stdout can still take, then points it at /dev/null, so that later prints, and
    the flush at exit, no longer fail (a reader gone away, a full disk)."""
    # Started with stdout closed (python sample.py >&-): there is nothing to silence.
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except OSError:
        pass
    # Where stdout is no file (a test's capture), there is nothing to point elsewhere.
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)


def printer(*args):
    """print, but when stdout goes away (python train.py | head) training goes on without it."""
    try:
        print(*args, flush=True)
    except OSError:
        silence_stdout()


def end_quietly():
    """For a reader gone away (python sample.py | head): no traceback, and the exit status of cat
    in its place."""
    silence_stdout()
    sys.exit(141)


def fail(message):
    """Ends the program with message on stderr and status 1; stdout's own failure, if that is the
    error (a full disk), is not reported a second time at exit."""
    silence_stdout()
    sys.exit(f"error: {message}")


def one_line(error, advice="use a smaller model, --batch_size or --block_size"):
    """What the error says, on one line; out of memory or a failed torch.compile, with advice. Any
    other RuntimeError is a bug, raised again with its traceback, which helps to find it."""
    text = str(error).strip()
    first = (text.splitlines() or [""])[0]
    # MemoryError is Python's; torch reports "... can't allocate memory", "CUDA out of memory",
    # C++'s std::bad_alloc, or, for sizes beyond any memory, an overflowed storage size.
    if isinstance(error, MemoryError) or any(s in text.lower() for s in ("memory", "bad_alloc",
                                                                         "size calculation overflow")):
        return f"out of memory ({first or type(error).__name__}): {advice}"
    # An OSError made here, (errno, message): the message, without its "[Errno N]".
    if isinstance(error, OSError) and error.strerror and error.filename is None:
        text = error.strerror
    # Messages made here are one line, but for a path or a name given with a newline in it, which
    # is shown escaped so that the reason and the advice after it stay.
    if isinstance(error, (ValueError, OSError)):
        return text.replace("\n", "\\n")
    # torch.compile's, with --compile.
    if type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return f"torch.compile failed ({first}): train without --compile"
    raise error
