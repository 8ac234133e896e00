"""Data-parallel training under torchrun, for train.py: joining the process group, each process's
config, the processes' agreement on their set-up and on when to stop, DDP's gradient averaging once
per optimizer step, and a lost process reported in one line.

    torchrun --standalone --nproc_per_node=N train.py [options]
"""
import atexit
import contextlib
import dataclasses
import math
import os
import re
import signal
import sys

import torch
import torch.distributed as dist

import checkpoint
import cli
import gpt


class Failed(ValueError):
    """An error every process of a DDP run knows of, which one of them has already been chosen to
    show: shown says whether this one is it."""

    def __init__(self, message, shown):
        super().__init__(message)
        self.shown = shown


def ranks():
    """(rank, local rank, world size) as torchrun sets them; (0, 0, 1) in a single process. Others
    are refused in one line: a rank past the world would wait for its peers for good."""
    found = cli.torchrun_ranks()
    if found is None:
        raise ValueError(f"{told('WORLD_SIZE', 'RANK', 'LOCAL_RANK')}: not as torchrun sets them (whole numbers, "
                         f"0 <= LOCAL_RANK <= RANK < WORLD_SIZE <= {gpt.MANY:,}): launch with torchrun "
                         f"--nproc_per_node=N train.py, or unset WORLD_SIZE")
    return found


def told(*names):
    """The environment's variables of names, as a message shows them."""
    return ", ".join(f"{name} {cli.shown(os.environ[name]) if name in os.environ else 'not set'}" for name in names)


def agree_on_setup(error, trainer, rank, world):
    """Under DDP each process reads its data and builds its model (trainer) alone, or fails to
    (error); here they compare, so that a fault found by one process alone reaches the user in one
    line from it, and the processes do not train on texts whose ids mean different characters, nor
    with different options (a step or a clock of their own would leave the others waiting in a
    collective for good)."""
    if world == 1:
        if error is not None:
            raise error
        return
    message = None if error is None else describe(error)
    vocabulary = None if trainer is None else vocabulary_of(trainer)
    options = None if trainer is None else options_of(trainer)
    told = [None] * world
    try:
        dist.all_gather_object(told, (message, vocabulary, options))
        # Every process has what all of them told before any raises, and leaves the group.
        dist.barrier()
    except RuntimeError as e:
        # This process's own fault is its to say, whatever became of the others.
        if error is not None:
            raise error from None
        # A process that stopped while setting up (killed, out of memory loading its weights).
        lost = lost_peer(e, None, rank, world)
        if lost is None:
            raise
        raise lost from None
    failed = [r for r, (m, _, _) in enumerate(told) if m is not None]
    if failed:
        first = failed[0]
        where = "" if first == 0 else f" (process {first} of {world})"
        raise Failed(f"{told[first][0]}{where}", shown=rank == first)
    differ = [r for r, (_, v, _) in enumerate(told) if v != told[0][1]]
    if differ:
        raise Failed(f"process {differ[0]} of {world} has another vocabulary than process 0 (its "
                     f"--data has other characters, or another tokenizer): give every process the "
                     f"same --data", shown=rank == 0)
    for r, (_, _, theirs) in enumerate(told):
        names = [name for name in options if theirs[name] != options[name]]
        if names:
            raise Failed(f"process {r} of {world} was given other options than process {rank} "
                         f"({', '.join(f'--{name}' for name in names)}): give every process the same",
                         shown=rank == 0)


class AccumulatingDDP(torch.nn.parallel.DistributedDataParallel):
    """DDP whose processes average their gradients once per optimizer step, in the backward of its
    last micro-batch: gpt.train_step runs grad_accum forwards and backwards a step, and each of the
    others only adds to the gradients here. The same as DDP's no_sync(), without gpt.py knowing of
    DDP."""

    def __init__(self, module, grad_accum, **kwargs):
        super().__init__(module, **kwargs)
        self.grad_accum = grad_accum
        self.micro_batches = 0

    def forward(self, *args, **kwargs):
        self.micro_batches += 1
        # DDP reads it at each forward: the backward after it averages across the processes or not.
        self.require_backward_grad_sync = self.micro_batches % self.grad_accum == 0
        return super().forward(*args, **kwargs)


def describe(error):
    """The one line an error is shown as; a bug's type and message, for the process that saw it."""
    try:
        return cli.one_line(error)
    except Exception:
        return f"{type(error).__name__}: {error}"


def agree(trainer, stop, world, check_loss):
    """Under DDP every process must stop at the same step and read the same clock (max_time), or the
    others wait forever in the next all-reduce: each takes the largest stop signal and clock of
    them all, and the loss is checked on all of them at once. Returns (stop, diverged)."""
    if world == 1:
        return stop, check_loss and not math.isfinite(trainer.loss.item())
    flags = torch.stack([torch.tensor(float(stop)), torch.tensor(trainer.elapsed),
                         (~torch.isfinite(trainer.loss.detach().cpu())).double()])
    flags = flags.double().to(trainer.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    stop, elapsed, diverged = flags.tolist()
    trainer.elapsed = elapsed
    return int(stop), check_loss and bool(diverged)


@contextlib.contextmanager
def process_group(world, local_rank, device_name):
    """Joins the torchrun job's process group, when there is one and it is not joined yet (a test
    may spawn the processes itself); NCCL on GPUs, Gloo on CPUs. Yields the device name to use."""
    if world == 1 or dist.is_initialized():
        yield device_name
        return
    if cli.usable_device(device_name).type == "cuda":
        device_name = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    try:
        dist.init_process_group("nccl" if device_name.startswith("cuda") else "gloo")
    # torch's words on a MASTER_ADDR or MASTER_PORT missing or not a port ("invalid literal for int()") name neither.
    except ValueError as e:
        raise ValueError(f"cannot join torchrun's job at {told('MASTER_ADDR', 'MASTER_PORT')} ({e}): launch with "
                         f"torchrun --nproc_per_node=N train.py, which sets them") from None
    try:
        yield device_name
    finally:
        dist.destroy_process_group()


def options_of(trainer):
    """The options every process of a DDP run must share: all but those process_options sets apart
    (the seed, out_dir) and the device, which is each process's own GPU."""
    options = dataclasses.asdict(trainer.tc)
    return {name: value for name, value in options.items() if name not in ("seed", "out_dir", "device")}


def vocabulary_of(trainer):
    """What the processes of a DDP run must agree on: the characters, or the tokenizer's name, and
    the vocabulary's size."""
    tokenizer = trainer.tokenizer
    name = getattr(tokenizer, "chars", None) or getattr(tokenizer, "name", None)
    return name, trainer.model.config.vocab_size


def process_options(options, rank):
    """This process's own options of a run's (a dict): each process draws its own batches (DDP
    starts every copy of the model from the first one's weights), and only the first writes
    checkpoints. The seed stays one a config takes."""
    return {"seed": (options["seed"] + rank) % 2 ** 32, "out_dir": options["out_dir"] if rank == 0 else ""}


def reseed(trainer, rank):
    """After a resume, a process other than the first draws new random streams of its own: only the
    first one's are saved."""
    if rank:
        seed = (trainer.tc.seed + 1_000_003 * trainer.it) % 2 ** 63
        trainer.generator.manual_seed(seed)
        torch.manual_seed(seed)


def wrap(trainer, world):
    """Has the trainer's steps run through DDP, with more than one process."""
    if world > 1:
        cuda = trainer.device.type == "cuda"
        trainer.wrapped_model = AccumulatingDDP(trainer.wrapped_model, trainer.tc.grad_accum,
                                                device_ids=[trainer.device.index] if cuda else None)


def lost_peer(error, trainer, rank, world):
    """error as the one line of a lost process, when it is a collective's failure under DDP, as
    Gloo and NCCL report a process of the run that has stopped (killed, out of memory); else None.
    trainer is None while the processes set up."""
    text = str(error)
    if not (world > 1 and (isinstance(error, dist.DistError) or "gloo" in text or "NCCL" in text)):
        return None
    when = "while setting up" if trainer is None else f"at iteration {trainer.it}"
    kept = "" if trainer is None else f"; {checkpoint.as_it_was(trainer)}"
    # Gloo's line, less the source file it names and the advice after its first sentence.
    reason = re.sub(r"^\[[^\]]*\]\s*", "", text.strip()).split(". ")[0][:160]
    return Failed(f"process {rank} of {world} lost touch with the others {when} ({reason}): another process "
                  f"stopped{kept}", shown=True)


def end(code, world):
    """Ends the process with code (a status, or a message for stderr and status 1), or returns for
    a single process that ran to its end. A process of a DDP run, its work done and its process
    group left, ends at once: Gloo's threads, torn down with the interpreter, aborted it now and
    then (SIGABRT) after a fault all processes had agreed on."""
    if world == 1:
        # A Ctrl-C (a second, after a stop) while Python shuts the process down would break into
        # torch's exit hooks with a traceback. Registered last, this runs first of them, and only
        # as the interpreter ends: a caller that goes on keeps its Ctrl-C.
        atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
        if isinstance(code, str):
            cli.silence_stdout()
        if code:
            sys.exit(code)
        return
    cli.silence_stdout()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    sys.stderr.flush()
    os._exit(code)
