"""What the command lines (train.py, sample.py, bench.py) share: argparse with one-line errors, a
flag for each option of gpt.TrainConfig made from the rule and help gpt.option() declared beside
it (so that a flag refuses exactly what the config does), the device check and the output's
edge cases. Bad input is refused where it arrives, in one line that says what is wrong and what
to do.
"""
import argparse
import dataclasses
import errno
import os
import re
import sys
import unicodedata

import torch

import gpt


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Numbers argparse would take for options (-1e-3, -inf): no option here starts with a minus and a digit.
        self._negative_number_matcher = re.compile(r"-(\.?\d|inf$|infinity$|nan$)", re.IGNORECASE)

    def error(self, message):
        # argparse's message on one line, without its usage block; under torchrun, from the first
        # process alone (every process reads the same command line), and from any not torchrun's.
        ranks = torchrun_ranks()
        self.exit(2, None if ranks is not None and ranks[0] > 0 else f"{self.prog}: error: {message} (see --help)\n")


def torchrun_ranks():
    """(rank, local rank, world size) as torchrun sets them ((0, 0, 1): one process), or None where they are not so."""
    if os.environ.get("WORLD_SIZE", "1") == "1":
        return 0, 0, 1
    told = [os.environ.get(name, "") for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")]
    ranks = tuple(map(int, told)) if all(n.isdecimal() for n in told) else None
    return ranks if ranks is not None and 0 <= ranks[1] <= ranks[0] < ranks[2] <= gpt.MANY else None


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


def not_empty(what):
    """argparse's type for a path or a name, of which "" is none (and would be read as not given):
    refused, saying to give what."""
    def given(text):
        if not text:
            raise argparse.ArgumentTypeError(f"is empty: give {what}")
        return text
    return given


def shown(value, text=None):
    """value as a message shows it: text (by default its repr), or what it is where that would fill
    the line (an integer may have 4,300 digits)."""
    text = repr(value) if text is None else text
    if len(text) <= 40:
        return text
    if isinstance(value, int):
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{text[:30]}... ({len(text)} characters)"


def parse_bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# An option that is a switch: --compile alone, or --compile false.
FLAG = dict(type=parse_bool, nargs="?", const=True, metavar="BOOL")
# Seconds to train or time for, and a count: one rule each, for every command line that takes them.
SECONDS = number(float, lambda s: 0 < s < 1e6, "in (0, 1e6)")
AT_LEAST_1 = number(int, lambda n: n >= 1, "at least 1")


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


# Each option of TrainConfig, a dataclasses.Field whose rule and help gpt.option() declared.
FIELDS = {f.name: f for f in dataclasses.fields(gpt.TrainConfig)}


def option_rule(name):
    """argparse's keywords for the TrainConfig option name, from its field: a type that reads the
    text and checks it by gpt.check_option, and its help. --help shows the default after the help,
    which the caller adds."""
    f = FIELDS[name]
    kind = type(f.default)
    if kind is bool:
        return dict(help=f.metadata["help"], **FLAG)

    def parse(text):
        # A ValueError of kind(text) becomes argparse's own "invalid int value".
        value = kind(text)
        try:
            return gpt.check_option(f, value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = kind.__name__
    rule = dict(help=f.metadata["help"], type=parse)
    # An option of choices shows them, not its type's name.
    if f.metadata.get("choices"):
        rule["metavar"] = "{" + ",".join(f.metadata["choices"]) + "}"
    return rule


def parse_option(name, text):
    """The value text gives the TrainConfig option name, by the rule of its flag; an
    argparse.ArgumentTypeError says what is wrong."""
    if name not in FIELDS:
        raise argparse.ArgumentTypeError(f"no option {name}: see python train.py --help")
    try:
        return option_rule(name)["type"](text)
    except ValueError:
        kind = type(FIELDS[name].default).__name__
        raise argparse.ArgumentTypeError(f"{name} must be {kind}, got {text}") from None


# Muon's own options, which an AdamW run has no use for.
MUON_OPTIONS = ("muon_lr", "muon_momentum", "muon_momentum_start")


def check_used(tc, given):
    """Options given that the run tc would not use are refused, never dropped: Muon's without Muon,
    the embedding's own rate where the output layer shares its weights."""
    muon_given = [f"--{name}" for name in MUON_OPTIONS if name in given]
    if muon_given and tc.optimizer != "muon":
        raise ValueError(f"{', '.join(muon_given)} set Muon's steps, and this run trains with --optimizer "
                         f"{tc.optimizer} alone: leave {'it' if len(muon_given) == 1 else 'them'} out, or "
                         f"give --optimizer muon to a new run")
    if "embedding_lr" in given and tc.tie_weights:
        raise ValueError("--embedding_lr is the rate of an embedding of its own, and this model ties its "
                         "embedding to the output layer (tie_weights): leave it out, as --learning_rate "
                         "sets their rate")


# ---------------------------------------------------------------------------------------------- output
# Unicode's controls, lone surrogates and non-characters, which a page would act on or fail to parse, and
# the marks that turn a line's direction, which would show a text other than it is.
UNSEEN = ("Cc", "Cs", "Cn")
TURNS = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def hidden(c):
    """Whether a page or a terminal shows c as its escape (report.visible): tags hide text in plain sight."""
    if c in "\n\r\t":
        return False
    return c in TURNS or unicodedata.category(c) in UNSEEN or "\U000e0000" <= c <= "\U000e007f"


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
    # Python's MemoryError, an ENOMEM, or torch's RuntimeError (never a message made here, which may name memory.txt).
    said = ("memory", "bad_alloc", "size calculation overflow")
    torch_says = isinstance(error, RuntimeError) and any(s in text.lower() for s in said)
    if isinstance(error, MemoryError) or getattr(error, "errno", None) == errno.ENOMEM or torch_says:
        return f"out of memory ({first or type(error).__name__}): {advice}"
    # A full disk under what is printed (python sample.py > file): the write names no file, and the
    # system's words are all it says (an error made here with ENOSPC has words of its own).
    if isinstance(error, OSError) and error.filename is None and error.strerror == os.strerror(errno.ENOSPC):
        return "no space left on the device the output goes to: free some, or send it elsewhere"
    # An OSError made here, (errno, message): the message, without its "[Errno N]".
    if isinstance(error, OSError) and error.strerror and error.filename is None:
        text = error.strerror
    # A path or a name given with a line's end or what hidden() says (a terminal's escape, a mark that
    # turns the line) is shown escaped: the message stays one line, and the terminal is not driven.
    if isinstance(error, (ValueError, OSError)):
        return "".join(c.encode("unicode_escape").decode("ascii") if hidden(c) or c in "\n\r\t" else c
                       for c in text)
    # torch.compile's, with --compile.
    if type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return f"torch.compile failed ({first}): train without --compile"
    raise error
