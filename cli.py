"""What the command lines (train.py, sample.py, bench.py) share: argparse with one-line errors, checked
numbers and devices, reading texts and token ids, loading and resuming checkpoints with errors of one
line, and the output's edge cases.

Bad input is refused here, where it arrives, in one line that says what is wrong and what to do;
gpt.py keeps only the checks that guard the model itself.
"""
import argparse
import codecs
import dataclasses
import math
import os
import re
import stat
import sys
from dataclasses import dataclass

import numpy as np
import torch

import gpt


class Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's message on one line, without the usage block above it.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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


# The largest vocabulary a run may build: GPT-2's 50,257 tokens and Llama 3's 128,256 with room to
# spare; an id of 2**32 - 1 would otherwise ask for an embedding of billions of rows.
MAX_VOCAB = 1 << 20


# The range [low, high) of each number of TrainConfig: NaN fails both comparisons, and inf the
# second. train.py's command line refuses any other value before a config is built, and a
# checkpoint's recorded options are held to the same.
LIMITS = {**dict.fromkeys(["block_size", "n_layer", "n_head", "n_embd", "max_iters",
                           "eval_interval", "eval_iters", "batch_size", "grad_accum"], (1, 2 ** 53)),
          **dict.fromkeys(["max_time", "min_lr", "warmup_iters", "weight_decay", "grad_clip"],
                          (0, math.inf)),
          "dropout": (0, 1), "beta2": (0, 1), "learning_rate": (1e-9, 1), "seed": (0, 2 ** 32),
          "vocab_size": (1, MAX_VOCAB + 1), "muon_lr": (1e-9, 1), "muon_momentum": (0, 1)}


# The values of each option that names one: the model's switches, and the optimizer.
CHOICES = {**gpt.CHOICES, "optimizer": ("adamw", "muon")}


# ---------------------------------------------------------------------------------------------- input
def check_file(path, what, flag, largest=None):
    """The size of the file at path, which every file the project reads from outside passes first:
    refused in one line if it is missing, not a regular file (a folder; a device or a pipe, which
    could be read forever or block for good) or, when largest is given, larger than that."""
    # The advice: pass the flag another file; none for a file inside a folder given (GPT-2's).
    advice = f": pass {flag} a file" if flag else ""
    try:
        found = os.stat(path)
    except OSError as e:
        raise ValueError(f"cannot read {what} {path} ({e.strerror}){advice}") from None
    if not stat.S_ISREG(found.st_mode):
        reason = "it is a folder" if stat.S_ISDIR(found.st_mode) else "it is not a regular file"
        raise ValueError(f"cannot read {what} {path} ({reason}){advice}")
    if largest is not None and found.st_size > largest:
        raise ValueError(f"cannot read {what} {path} (it has {found.st_size:,} bytes, more than the "
                         f"{largest:,} such a file can have){advice}")
    return found.st_size


def read_text(path, what="the data file", flag="--data"):
    """The UTF-8 text at path, whole, or one line that says why not and how to fix it."""
    check_file(path, what, flag)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {what} {path} ({reason}): pass {flag} a UTF-8 text file") from None
    if not text:
        raise ValueError(f"{what} {path} is empty: pass {flag} a text with something in it")
    return text


# UTF-8 read and decoded at a time: a text of any size needs the memory of one chunk beside its ids.
CHUNK = 1 << 25


def text_chunks(path):
    """The UTF-8 text at path, as strings of about CHUNK characters: never the whole text at once."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK)
            text = decoder.decode(data, final=not data)
            if text:
                yield text
            if not data:
                return


def code_points(text):
    """The characters of text as a NumPy array of their Unicode numbers, (len(text),): no Python
    object per character."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def smallest_dtype(vocab_size):
    """The smallest unsigned NumPy type that holds every id below vocab_size: uint8 up to 256."""
    return next(np.dtype(t) for t in ("u1", "u2", "u4") if vocab_size <= np.iinfo(t).max + 1)


def encode_file(path, chars=None, what="the data file", flag="--data"):
    """(ids, chars): the UTF-8 text at path as one token per character, a NumPy array of the
    smallest unsigned type that fits, and its vocabulary: the text's own distinct characters, or
    chars, when given (a checkpoint's), which must hold every character of the text.

    It reads the text twice, a chunk at a time: once to find its characters, once to map them to
    ids through a table indexed by Unicode number. The memory it needs is the ids' and one chunk's.
    A text changed between the two readings is refused, never trained on as a mix of both.
    """
    check_file(path, what, flag)
    changed = f"{what} {path} changed while it was read: pass {flag} a text that stays as it is"
    try:
        before = os.stat(path)
        seen = np.zeros(sys.maxunicode + 1, dtype=bool)
        length = 0
        for text in text_chunks(path):
            seen[code_points(text)] = True
            length += len(text)
        found = "".join(map(chr, np.flatnonzero(seen)))
        unknown = "".join(sorted(set(found) - set(chars))) if chars is not None else ""
        if unknown:
            raise ValueError(f"{what} {path} has characters the checkpoint never saw ({unknown!r}): "
                             f"use the text it was trained on, or train without --resume")
        chars = found if chars is None else chars
        table = np.zeros(sys.maxunicode + 1, dtype=smallest_dtype(len(chars)))
        table[code_points(chars)] = np.arange(len(chars))
        ids = np.empty(length, dtype=table.dtype)
        start = 0
        for text in text_chunks(path):
            points = code_points(text)
            # A character not found the first time would become id 0; more text would not fit.
            if start + len(text) > length or not seen[points].all():
                raise ValueError(changed)
            ids[start:start + len(text)] = table[points]
            start += len(text)
        after = os.stat(path)
        if start != length or (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise ValueError(changed)
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {what} {path} ({reason}): pass {flag} a UTF-8 text file") from None
    if not length:
        raise ValueError(f"{what} {path} is empty: pass {flag} a text with something in it")
    return ids, chars


# The types a file of token ids may hold (--dtype), as NumPy names them.
ID_DTYPES = ("uint8", "uint16", "uint32", "int32", "int64")


def read_ids(path, dtype="uint16", flag="--data"):
    """The token ids in the file at path, raw little-endian integers of dtype one after another
    (nanoGPT's train.bin), as a read-only np.memmap: they stay on disk until a batch reads them."""
    check_file(path, "the file of token ids", flag)
    itemsize = np.dtype(dtype).itemsize
    size = os.path.getsize(path)
    if not size or size % itemsize:
        raise ValueError(f"{path} has {size} bytes, not a whole number of {dtype} ids, one at least: "
                         f"pass --dtype the type its ids were written in")
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")


def load(path, device=""):
    """gpt.load_checkpoint, with one line that says what is wrong when path holds no checkpoint it
    can use."""
    device = usable_device(str(device))
    if not os.path.isfile(path):
        raise ValueError(f"no checkpoint file at {path}: train one first with python train.py")
    try:
        model, tokenizer, ckpt = gpt.load_checkpoint(path, device)
        # Else decoding a sampled token would fail, or give other characters than the training's.
        if tokenizer and tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"{tokenizer.vocab_size} characters for a vocab_size of "
                             f"{model.config.vocab_size}")
    except Exception as e:
        # torch's own messages go on for lines, and advise weights_only=False, no help here.
        first = re.split(r"(?<=\.)\s|\n", str(e).strip())[0]
        raise ValueError(f"{path} is not a checkpoint this gpt.py can load ({type(e).__name__}"
                         f"{': ' + first if first else ''}); train a new one with python train.py") from None
    if not all(w.isfinite().all() for w in ckpt["model"].values()):
        raise ValueError(f"{path} holds weights that are NaN or inf, from a run that diverged: train "
                         f"anew, with a lower --learning_rate")
    return model, tokenizer, ckpt


@dataclass
class DataFile:
    """--data as the command line gives it: read by each process as it sets itself up."""
    path: str
    dtype: str = "uint16"


class Named:
    """The tokenizer of a checkpoint that records only its name (one of the user's own): a run
    resumed on its token ids keeps the name for its next checkpoint; nothing here can use it."""

    def __init__(self, name, vocab_size):
        self.name = name
        self.vocab_size = vocab_size
        self.absent = (f"the tokenizer {name!r} is the user's own, not here: give its token ids "
                       f"(--data FILE.bin), or use it from Python")

    def encode(self, text):
        raise ValueError(self.absent)

    def decode(self, ids):
        raise ValueError(self.absent)


def read_data(data, tokenizer=None):
    """(data, tokenizer) for gpt.Trainer, from a DataFile, a text or token ids. tokenizer, when
    given, is the run's (a checkpoint's, or GPT-2's) and stays the run's whatever the data: a text
    is read with it (a CharTokenizer's characters, GPT-2's tokens). Without one, a text is one
    token per character of its own. A .bin file is token ids, which stay on disk."""
    if is_ids(data):
        ids = read_ids(data.path, data.dtype) if isinstance(data, DataFile) else data
        return ids, tokenizer
    chars = getattr(tokenizer, "chars", None)
    if tokenizer is not None and chars is None:
        text = read_text(data.path) if isinstance(data, DataFile) else data
        ids = tokenizer.encode(text)
        return np.array(ids, dtype=smallest_dtype(tokenizer.vocab_size)), tokenizer
    if isinstance(data, DataFile):
        ids, chars = encode_file(data.path, chars)
        return ids, gpt.CharTokenizer(chars)
    unknown = "".join(sorted(set(data) - set(chars or data)))
    if unknown:
        raise ValueError(f"the text has characters the checkpoint never saw ({unknown!r}): resume on "
                         f"the text it was trained on (--data), or train without --resume")
    return data, gpt.CharTokenizer(chars or data)


def implied_vocab_size(ids):
    """The vocabulary token ids imply, their largest + 1, refused in one line beyond MAX_VOCAB."""
    largest = int(ids.max())
    if largest >= MAX_VOCAB:
        raise ValueError(f"the largest token id, {largest:,}, implies a vocabulary of {largest + 1:,}, "
                         f"beyond the {MAX_VOCAB:,} a run may build: check --dtype, or the file")
    return largest + 1


def check_ids(ids, vocab_size):
    """Token ids, refused in one line unless each is in [0, vocab_size): an id beyond the model's
    embedding would end training in an IndexError (on a GPU, a device-side assert)."""
    low = int(ids.min())
    high = int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"token ids must be in [0, {vocab_size}), the vocabulary; these go from {low:,} "
                         f"to {high:,}: give --vocab_size above the largest, or the right --dtype")


def is_ids(data):
    """Whether data is token ids, not a text: a .bin file, or an array or tensor of them."""
    if isinstance(data, DataFile):
        return data.path.endswith(".bin")
    return not isinstance(data, str)


# A step count that no run reaches: anything beyond is a damaged or hand-made checkpoint.
MAX_ITER = 2 ** 53


# The model's options: --resume and --init_from keep the model's own and name those given that
# differ. block_size is the training's context too, which may be shorter than the model's.
MODEL_OPTIONS = [f.name for f in dataclasses.fields(gpt.GPTConfig) if f.name != "block_size"]


def finite(value, low=-math.inf):
    """Whether value is a number (an int or a float, not a bool) from low up, and not NaN or inf."""
    return type(value) in (int, float) and low <= value < math.inf


def recorded_options(ckpt, path, advice):
    """The TrainConfig options a checkpoint recorded, but out_dir and device (those are the new
    run's), each held to the rule of its flag: a value no run could have recorded is refused in one
    line that ends with advice."""
    recorded = ckpt.get("train_config", {})
    if not isinstance(recorded, dict):
        raise ValueError(f"{path} records its options as {type(recorded).__name__}, not a dict: "
                         f"it is damaged or hand-made; {advice}")
    types = {f.name: f.type for f in dataclasses.fields(gpt.TrainConfig)}
    options = {}
    for name, value in recorded.items():
        if name not in types or name in ("out_dir", "device"):
            continue
        # A float option may have been recorded as a whole number.
        if types[name] is float and type(value) is int:
            value = float(value)
        low, high = LIMITS.get(name, (None, None))
        in_range = low is None or (type(value) is not str and low <= value < high)
        allowed = value in CHOICES.get(name, (value,))
        if type(value) is not types[name] or not in_range or not allowed:
            raise ValueError(f"{path} records {name} = {value!r}, which no run could have: it is "
                             f"damaged or hand-made; {advice}")
        options[name] = value
    return options


def keep_model_options(tc, config, given, why, log):
    """tc with the model options of config, naming those given that differ as ignored; the
    training's block_size may be the model's or shorter."""
    ignored = [f"--{name} {given[name]}" for name in MODEL_OPTIONS
               if name in given and given[name] != getattr(config, name)]
    if ignored:
        log(f"{why} keeps the model's options, so these are ignored: {', '.join(ignored)}")
    block_size = min(tc.block_size, config.block_size) if "block_size" not in given else tc.block_size
    if block_size > config.block_size:
        raise ValueError(f"--block_size {block_size} is beyond the model's context of "
                         f"{config.block_size}: give at most that")
    options = {name: getattr(config, name) for name in MODEL_OPTIONS}
    return dataclasses.replace(tc, **options, block_size=block_size)


def restore(trainer, ckpt):
    """Puts trainer where the checkpoint's run stood: each optimizer's state (AdamW's moments,
    Muon's momentum) comes back, while their hyperparameters (learning rate, weight decay, betas)
    stay this run's, as trainer.tc sets them; then the step, the clock, the evaluations and the
    random states."""
    for optimizer, saved in zip(trainer.optimizers, ckpt["optimizers"], strict=True):
        own = optimizer.state_dict()["param_groups"]
        optimizer.load_state_dict({"state": saved["state"], "param_groups": own})
    trainer.it = ckpt["iter"]
    trainer.elapsed = ckpt["elapsed"]
    trainer.history = ckpt["history"]
    torch.set_rng_state(ckpt["rng"]["torch"])
    trainer.generator.set_state(ckpt["rng"]["batches"])


# What each kind of optimizer keeps for a parameter (muon.BatchedMuon is a torch.optim.Muon): the
# names of its state, each True when it has the parameter's shape and type, False for a number (a
# tensor of no dimension).
OPTIMIZER_STATE = {torch.optim.AdamW: {"exp_avg": True, "exp_avg_sq": True, "step": False},
                   torch.optim.Muon: {"momentum_buffer": True}}


def state_fits(optimizer, saved):
    """Whether saved, an optimizer's state_dict() as a checkpoint holds it, is one that optimizer
    can step on: a state for some of its parameters, each of the names, shapes and types it keeps."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    kept = next(kept for kind, kept in OPTIMIZER_STATE.items() if isinstance(optimizer, kind))
    ids = [i for group in saved["param_groups"] for i in group["params"]]
    if sorted(ids) != list(range(len(params))) or not set(saved["state"]) <= set(ids):
        return False
    for i, state in saved["state"].items():
        if sorted(state) != sorted(kept):
            return False
        for name, like_param in kept.items():
            shape = params[i].shape if like_param else ()
            dtype = params[i].dtype if like_param else state[name].dtype
            if not (torch.is_tensor(state[name]) and state[name].is_floating_point()
                    and state[name].shape == shape and state[name].dtype == dtype):
                return False
    return True


def check_resumable(ckpt, trainer, path, advice="train without --resume"):
    """What a checkpoint brings to resume (or to rebuild its report), checked against the model
    before an optimizer ever steps on it: a moment of the wrong shape makes the fused AdamW write
    out of bounds. A message that refuses it ends with advice."""
    missing = [key for key in ("optimizers", "iter", "elapsed", "rng", "history") if key not in ckpt]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}: it can sample, but not resume; "
                         f"{advice}")
    wrong = f"{path} holds a training state that does not fit its model"
    iteration = ckpt["iter"]
    if not (type(iteration) is int and 0 <= iteration < MAX_ITER):
        raise ValueError(f"{wrong}: iteration {iteration!r}; {advice}")
    if not finite(ckpt["elapsed"], 0):
        raise ValueError(f"{wrong}: {ckpt['elapsed']!r} seconds of training; {advice}")
    try:
        saved = ckpt["optimizers"]
        fits = len(saved) == len(trainer.optimizers) and all(
            state_fits(optimizer, state) for optimizer, state in zip(trainer.optimizers, saved))
        # Each evaluation: its step, its clock and learning rate, and its finite losses, which the
        # report draws.
        fits = fits and all(type(h["iter"]) is int and 0 <= h["iter"] < MAX_ITER
                            and finite(h["seconds"], 0) and finite(h["lr"], 0)
                            and finite(h["train"]) and finite(h["val"]) for h in ckpt["history"])
    except (KeyError, TypeError, AttributeError, IndexError):
        fits = False
    if not fits:
        raise ValueError(f"{wrong}: the optimizers' states or the evaluations; {advice}")


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
    """What the error says, its first line; out of memory or a failed torch.compile, with advice.
    Any other RuntimeError is a bug, raised again with its traceback, which helps to find it."""
    text = str(error).strip()
    first = (text.splitlines() or [""])[0]
    # MemoryError is Python's; torch reports "... can't allocate memory", "CUDA out of memory" or
    # C++'s std::bad_alloc.
    if isinstance(error, MemoryError) or "memory" in text.lower() or "bad_alloc" in text:
        return f"out of memory ({first or type(error).__name__}): {advice}"
    # An OSError made here, (errno, message): the message, without its "[Errno N]".
    if isinstance(error, OSError) and error.strerror and error.filename is None:
        return error.strerror.splitlines()[0]
    if isinstance(error, (ValueError, OSError)):
        return first
    # torch.compile's, with --compile.
    if type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return f"torch.compile failed ({first}): train without --compile"
    raise error
