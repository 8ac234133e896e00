"""Trains a GPT: python train.py [--option value ...]; python train.py --help lists every option.
Data-parallel over GPUs or CPU processes: torchrun --standalone --nproc_per_node=N train.py [...]

gpt.py holds the model and the training loop, gpt.Trainer.steps(). This file is the command line
around that loop and what a long run needs: reading a text of any size, DDP, resuming, starting from
GPT-2's weights, saving on Ctrl-C and the signals schedulers send, the NaN stop, progress lines with
an ETA, Muon's batched step with q, k and v apart (muon.py), and a closing report
(out_dir/report.html) with a sample.
"""
import sys

try:
    import contextlib
    import dataclasses
    import inspect
    import math
    import os
    import re
    import signal
    import threading
    import time

    import torch
    import torch.distributed as dist

    import cli
    import gpt
    import gpt2
    import muon
    import report
# Ctrl-C while torch is still importing: nothing has started, so nothing is lost.
except KeyboardInterrupt:
    sys.exit(130)

# A GPU trains a larger model in minutes: on CUDA these replace the CPU defaults of the options not
# given.
# The optimizer stays AdamW there: Muon won at equal time on 2 CPU cores (docs/benchmarks.md), and
# has not been measured on a GPU.
CUDA_DEFAULTS = dict(max_iters=5000, batch_size=64, block_size=256, n_layer=6, n_head=6, n_embd=384,
                     dropout=0.1, learning_rate=1e-3, min_lr=1e-4, eval_iters=100, optimizer="adamw")
# Finetuning GPT-2 (--init_from) takes small, constant steps: a learning rate for training from
# scratch would wreck what it knows in a few steps.
INIT_FROM_DEFAULTS = dict(learning_rate=3e-5, min_lr=3e-5, warmup_iters=0, weight_decay=0.0,
                          batch_size=4, max_iters=200, eval_interval=50, eval_iters=10,
                          optimizer="adamw")
# What a user, a terminal or a scheduler sends to stop a run (SLURM's --signal sends SIGUSR1 or 2,
# CPU-time limits SIGXCPU): each saves the step under way, then exits with 128 + the signal's
# number, as a shell reports such an end.
STOPS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2",
                                            "SIGXCPU") if hasattr(signal, name)]


# ---------------------------------------------------------------------------------------------- options
def option_helps():
    """{option: its help}: the comment above each field of GPTConfig and TrainConfig in gpt.py, so
    that it is written once, beside the option itself."""
    source = inspect.getsource(gpt.GPTConfig) + inspect.getsource(gpt.TrainConfig)
    found = re.findall(r"((?:^    # .*\n)+)^    (\w+): \w+ = ", source, re.M)
    return {name: " ".join(line.strip()[2:] for line in comment.splitlines()) for comment, name in found}


def parse_args(argv=None):
    """This file's own options, and the TrainConfig options given, {name: value}; the others keep
    their defaults. Every number is checked here, NaN and inf included."""
    parser = cli.Parser(description="Train a GPT on a text or on token ids; writes out_dir/ckpt.pt "
                                    "and out_dir/report.html.")
    parser.add_argument("--data", default="input.txt",
                        help="a UTF-8 text, one token per character; or, with a name ending in .bin, "
                             "token ids as --dtype integers one after another (nanoGPT's train.bin). "
                             "The last 10%% is held out for validation (default: %(default)s)")
    parser.add_argument("--dtype", choices=cli.ID_DTYPES, default="uint16",
                        help="the integer type of the ids in a .bin --data (default: %(default)s)")
    parser.add_argument("--init_from", metavar="GPT2",
                        help="start from GPT-2's weights: a folder with config.json and "
                             "model.safetensors, or one of gpt2, gpt2-medium, gpt2-large, gpt2-xl "
                             "(downloaded with huggingface_hub); a text is then read in GPT-2's "
                             "tokens (tiktoken or transformers) (default: a new model)")
    flag = dict(type=cli.parse_bool, nargs="?", const=True, metavar="BOOL")
    parser.add_argument("--resume", default=False, **flag,
                        help="continue from out_dir/ckpt.pt with its model, characters and options; "
                             "options given replace those it recorded (default: %(default)s)")
    parser.add_argument("--log_interval", type=cli.number(int, lambda n: n >= 1, "at least 1"),
                        default=100, help="print progress every this many steps (default: %(default)s)")
    parser.add_argument("--compile", default=False, **flag,
                        help="torch.compile the model: faster steps after compiling for a while "
                             "(default: %(default)s)")
    helps = option_helps()
    defaults = gpt.TrainConfig()
    for field in dataclasses.fields(gpt.TrainConfig):
        shown = repr(getattr(defaults, field.name))
        if field.name in CUDA_DEFAULTS:
            shown += f", on CUDA {CUDA_DEFAULTS[field.name]!r}"
        if field.name == "optimizer":
            shown += " until Muon is measured on a GPU"
        if field.name in INIT_FROM_DEFAULTS:
            shown += f", with --init_from {INIT_FROM_DEFAULTS[field.name]!r}"
        if field.name == "vocab_size":
            shown = "the text's characters; for a .bin, its largest id + 1"
        text = f"{helps[field.name]} (default: {shown})".replace("%", "%%")
        if field.type is bool:
            kind = flag
        elif field.name in cli.CHOICES:
            kind = dict(choices=cli.CHOICES[field.name])
        elif field.name in cli.LIMITS:
            low, high = cli.LIMITS[field.name]
            kind = dict(type=cli.number(field.type, lambda v, low=low, high=high: low <= v < high,
                                        f"in [{low}, {high})"))
        else:
            kind = dict(type=field.type)
        parser.add_argument(f"--{field.name}", help=text, **kind)
    args = parser.parse_args(argv)
    own = ("data", "dtype", "init_from", "resume", "log_interval", "compile")
    given = {name: value for name, value in vars(args).items() if value is not None and name not in own}
    if args.resume and args.init_from:
        parser.error("--resume continues a run, --init_from starts one from GPT-2: give one of them")
    return args, given


def check_schedule(tc):
    """A decay that would rise is refused: --learning_rate 1e-4 alone is below the default min_lr."""
    if tc.min_lr > tc.learning_rate:
        raise ValueError(f"min_lr ({tc.min_lr}) is above learning_rate ({tc.learning_rate}): lower "
                         f"min_lr too")


# ---------------------------------------------------------------------------------------------- data
def check_block_size(tc, data):
    """A block_size beyond the held-out tokens is refused, by its flag's name, before anything is
    built."""
    held_out = len(data) - int(0.9 * len(data))
    if tc.block_size >= held_out:
        raise ValueError(f"--block_size {tc.block_size} is too long for the {held_out} tokens held out "
                         f"for validation (the last 10% of --data): lower --block_size, or give more")


# ---------------------------------------------------------------------------------------------- out_dir
def check_out_dir(out_dir):
    """An --out_dir that cannot be written fails now, by its real cause, not at the first save
    after minutes of training."""
    path = os.path.join(out_dir, "ckpt.pt")
    try:
        os.makedirs(out_dir, exist_ok=True)
        if os.path.exists(path) and not os.path.isfile(path):
            raise IsADirectoryError(0, "it is there, and not a file")
        with open(path + ".probe", "wb"):
            pass
        os.remove(path + ".probe")
    except OSError as e:
        # makedirs says only "File exists" of a file where the folder should be.
        reason = f"{out_dir} is there, and not a folder" if isinstance(e, FileExistsError) else e.strerror
        raise ValueError(f"cannot write {path} ({reason}): pass --out_dir a writable folder") from None


def own_out_dir(out_dir):
    """Locks out_dir/train.lock for as long as this process lives, so that one run at a time trains
    there. The operating system releases the lock of a process that ends, a crashed one too."""
    try:
        import fcntl
    # Windows has no fcntl: runs there are not kept apart.
    except ImportError:
        return None
    lock = open(os.path.join(out_dir, "train.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise ValueError(f"{out_dir} is in use by a training run ({holder}): wait for it to end, or "
                         f"pass another --out_dir") from None
    lock.truncate(0)
    lock.write(f"process {os.getpid()} on {os.uname().nodename}\n")
    lock.flush()
    return lock


# ---------------------------------------------------------------------------------------------- resume
def resumed_config(tc, ckpt, given, log):
    """The options a resumed run trains with: those the checkpoint recorded, then those given
    (recorded in the next checkpoint, as they run); the model's own options stay, and those given
    that differ are named as ignored."""
    path = os.path.join(tc.out_dir, "ckpt.pt")
    recorded = cli.recorded_options(ckpt, path, "train without --resume")
    # The optimizers' states in the checkpoint are those of the optimizer it recorded.
    optimizer = recorded.get("optimizer", "adamw")
    if given.get("optimizer", optimizer) != optimizer:
        raise ValueError(f"{path} was trained with --optimizer {optimizer}, whose state it holds: "
                         f"resume it with that optimizer (leave out --optimizer), or train anew")
    kept = {k: v for k, v in recorded.items() if k not in given}
    tc = dataclasses.replace(tc, **kept, **given)
    return cli.keep_model_options(tc, gpt.GPTConfig(**ckpt["config"]), given, "--resume", log)


# ---------------------------------------------------------------------------------------------- DDP
class Failed(ValueError):
    """An error every process of a DDP run knows of, which one of them has already been chosen to
    show: shown says whether this one is it."""

    def __init__(self, message, shown):
        super().__init__(message)
        self.shown = shown


def distributed():
    """(rank, local rank, world size) as torchrun sets them; (0, 0, 1) in a single process."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), world
        return 0, 0, 1
    except (KeyError, ValueError):
        raise ValueError(f"WORLD_SIZE is {os.environ.get('WORLD_SIZE')!r} without torchrun's RANK and "
                         f"LOCAL_RANK: launch with torchrun --nproc_per_node=N train.py, or unset "
                         f"WORLD_SIZE") from None


def agree_on_setup(error, vocabulary, options, rank, world):
    """Under DDP each process reads its data and builds its model alone; here they compare, so that
    a fault found by one process alone reaches the user in one line from it, and the processes do
    not train on texts whose ids mean different characters, nor with different options (a step or
    a clock of their own would leave the others waiting in a collective for good)."""
    if world == 1:
        if error is not None:
            raise error
        return
    message = None if error is None else describe(error)
    told = [None] * world
    dist.all_gather_object(told, (message, vocabulary, options))
    # Every process has what all of them told before any raises, and leaves the group.
    dist.barrier()
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
    dist.init_process_group("nccl" if device_name.startswith("cuda") else "gloo")
    try:
        yield device_name
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- signals
class Stopped(Exception):
    """A stopping signal outside the training steps: in the closing report, nothing is left to save."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_caught():
    """While training, a stopping signal only joins the list this yields, so that the step under way
    finishes whole and can be saved. Once the list's .urgent is set (the closing report), or for a
    second signal, it raises at once: Stopped, or KeyboardInterrupt, which leaves the last
    checkpoint as it was. Handlers can be set only in the main thread; elsewhere the signals keep
    theirs."""
    caught = SignalList()

    def on_signal(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signum)
        if caught.urgent:
            raise Stopped(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.signal(s, on_signal) for s in STOPS} if main_thread else {}
    try:
        yield caught
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


class SignalList(list):
    """The signals caught so far; urgent: whether the next one stops at once."""
    urgent = False


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
        left = tc.max_time - trainer.elapsed if tc.max_time else (tc.max_iters - it) * dt
        self.t_line = self.t_step
        self.it_line = it
        self.timed = 0.0
        self.timed_steps = 0
        lr = trainer.lr
        return (f"iter {it}" + ("" if tc.max_time else f"/{tc.max_iters}") + f" | loss {loss:.4f} | lr "
                f"{lr:.2e} | {self.tokens_per_step} tok/step | {dt * 1000:.1f} ms/iter | "
                f"{self.tokens_per_step / dt / 1000:.1f}k tok/s | ETA {max(left, 0) / 60:.1f} min")


# ---------------------------------------------------------------------------------------------- the run
def process_config(tc, rank):
    """Each process draws its own batches (DDP starts every copy of the model from the first one's
    weights), and only the first writes checkpoints."""
    return dataclasses.replace(tc, seed=tc.seed + rank, out_dir=tc.out_dir if rank == 0 else "")


class Run(gpt.Trainer):
    """gpt.Trainer as this command line runs it: a signal during an evaluation, which may be long,
    ends it at once (the step before it is saved); a save that fails says which file, and that the
    checkpoint there is as it was."""
    # The stopping signals caught so far: drive() sets its list here.
    signals = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Muon's products batched by the matrices' shapes, a faster step, and each of the stacked
        # maps (q, k and v; gate and up) orthogonalised alone, a better one.
        self.optimizers = muon.batched(self.optimizers, self.model)

    def evaluate(self):
        if self.signals is None:
            return super().evaluate()
        self.signals.urgent = True
        try:
            super().evaluate()
        finally:
            self.signals.urgent = False

    def save(self):
        try:
            super().save()
        # A full disk above all: the OS's message names neither the checkpoint nor what is left.
        except OSError as e:
            path = os.path.join(self.tc.out_dir, "ckpt.pt")
            raise OSError(e.errno, f"cannot write {path} ({e.strerror}); any file there is as it "
                                   f"was") from None


def set_up(tc, data, log, resume, given, init_from, rank):
    """The Trainer this process trains with: new, resumed from out_dir/ckpt.pt, or from GPT-2's
    weights. Everything that can be checked is checked here, before the first step."""
    path = os.path.join(tc.out_dir, "ckpt.pt")
    model = None
    tokenizer = None
    ckpt = None
    if resume:
        model, chars_tokenizer, ckpt = cli.load(path, tc.device)
        tc = resumed_config(tc, ckpt, given, log)
        # The run keeps its checkpoint's tokenizer, whatever its data: the characters, GPT-2's, or
        # the name of one of the user's own.
        tokenizer = gpt2.tokenizer_of(ckpt, chars_tokenizer)
    elif init_from:
        model = gpt2.load(init_from, tc.device)
        tc = cli.keep_model_options(tc, model.config, given, "--init_from", log)
        tokenizer = gpt2.Tokenizer(gpt2.folder_of(init_from))
    check_schedule(tc)
    unusable = tokenizer is None or isinstance(tokenizer, cli.Named)
    if resume and unusable and not cli.is_ids(data):
        raise ValueError(f"{path} was trained on token ids of a tokenizer it only names "
                         f"({ckpt.get('tokenizer')}): resume it on the same ids, --data FILE.bin")
    data, tokenizer = cli.read_data(data, tokenizer)
    # The vocabulary: the model's; a text's tokenizer's, which makes a --vocab_size given ignored, as
    # the model options are on --resume; else --vocab_size, or the largest id + 1.
    if model is not None:
        vocab_size = model.config.vocab_size
    elif tokenizer is not None:
        vocab_size = tokenizer.vocab_size
        if given.get("vocab_size", vocab_size) != vocab_size:
            log(f"--vocab_size {given['vocab_size']} is ignored: a text's vocabulary is its "
                f"tokenizer's ({vocab_size} tokens)")
    else:
        vocab_size = given.get("vocab_size") or cli.implied_vocab_size(data)
    tc = dataclasses.replace(tc, vocab_size=vocab_size)
    check_block_size(tc, data)
    # A text read here is ids of its own characters; token ids from elsewhere are checked.
    if not isinstance(data, str):
        cli.check_ids(data, vocab_size)
    trainer = Run(process_config(tc, rank), data, tokenizer, model and model.train(), log)
    if resume:
        cli.check_resumable(ckpt, trainer, path)
        try:
            cli.restore(trainer, ckpt)
        except (RuntimeError, TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{path} holds a training state that does not fit its model "
                             f"({type(e).__name__}); train without --resume") from None
        # Only the first process's random states are saved: the others draw new streams of their own.
        if rank:
            seed = (trainer.tc.seed + 1_000_003 * trainer.it) % 2 ** 63
            trainer.generator.manual_seed(seed)
            torch.manual_seed(seed)
        log(f"resuming {path} at iteration {trainer.it}")
    elif tc.out_dir and os.path.isfile(path):
        raise ValueError(f"{path} holds an earlier run, which this one would overwrite: continue it "
                         f"with --resume, or start anew in another --out_dir (or remove it)")
    return trainer


def run(tc, data, log=print, resume=False, log_interval=100, compile=False, given=(), init_from=None):
    """Trains as tc says, around gpt.Trainer.steps(); under torchrun, data-parallel. data: a text,
    token ids, or a cli.DataFile to read. Returns the trainer and the signal that stopped it, or None
    when it ran to the end. given: the options the user set, for --resume and --init_from."""
    rank, local_rank, world = distributed()
    with process_group(world, local_rank, tc.device) as device_name:
        tc = dataclasses.replace(tc, device=device_name)
        say = log if rank == 0 else lambda *args: None
        lock = None
        trainer = None
        error = None
        try:
            if tc.out_dir and rank == 0:
                check_out_dir(tc.out_dir)
                lock = own_out_dir(tc.out_dir)
            trainer = set_up(tc, data, say, resume, dict(given), init_from, rank)
        # Every process's error, a bug's too, goes to the agreement, so that none waits for another.
        except Exception as e:
            error = e
        vocabulary = None if trainer is None else vocabulary_of(trainer)
        options = None if trainer is None else options_of(trainer)
        try:
            agree_on_setup(error, vocabulary, options, rank, world)
            return drive(trainer, say, log_interval, compile, rank, world)
        finally:
            if lock is not None:
                lock.close()


def options_of(trainer):
    """The options every process of a DDP run must share: all but those process_config sets apart
    (the seed, out_dir) and the device, which is each process's own GPU."""
    options = dataclasses.asdict(trainer.tc)
    return {name: value for name, value in options.items() if name not in ("seed", "out_dir", "device")}


def vocabulary_of(trainer):
    """What the processes of a DDP run must agree on: the characters, or the tokenizer's name, and
    the vocabulary's size."""
    tokenizer = trainer.tokenizer
    name = getattr(tokenizer, "chars", None) or getattr(tokenizer, "name", None)
    return name, trainer.model.config.vocab_size


def drive(trainer, log, log_interval, compile, rank, world):
    """Runs trainer.steps() with what a long run needs around them: DDP and torch.compile, progress
    lines, the NaN stop, saving on a signal, and the closing report."""
    tc = trainer.tc
    path = os.path.join(tc.out_dir, "ckpt.pt")
    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if compile:
        trainer.wrapped_model = torch.compile(trainer.wrapped_model)
    if world > 1:
        trainer.wrapped_model = AccumulatingDDP(trainer.wrapped_model, tc.grad_accum,
                                                device_ids=[trainer.device.index] if cuda else None)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    processes = f", {world} processes" if world > 1 else ""
    log(f"{n_params / 1e6:.2f}M parameters on {trainer.device}{processes}; "
        f"{len(trainer.splits['train']):,} tokens to train on, {len(trainer.splits['val']):,} held out")
    tokens_per_step = tc.batch_size * tc.block_size * tc.grad_accum * world
    progress = Progress(trainer, tokens_per_step)
    figures = dict(tokens_per_step=tokens_per_step, processes=world)
    start = trainer.it
    stop = 0
    # A new run saves its first weights before its first step: an out_dir that cannot be written
    # fails now, not after the training.
    if start == 0:
        trainer.save()
    with signals_caught() as caught:
        trainer.signals = caught
        try:
            for _ in trainer.steps():
                progress.step()
                it = trainer.it
                last = trainer.done()
                check = it % log_interval == 0 or it % tc.eval_interval == 0 or last
                stop, diverged = agree(trainer, max(caught, default=0), world, check or world > 1)
                if diverged:
                    raise Failed(diverged_message(trainer), shown=rank == 0)
                if it % log_interval == 0 or last or stop:
                    log(progress.line(trainer.loss.item()))
                if stop:
                    trainer.save()
                    break
        # Under torchrun, a collective that fails: another process stopped (killed, out of memory).
        except RuntimeError as e:
            if not lost_peer(e, world):
                raise
            kept = f"; the last checkpoint in {tc.out_dir} is as it was" if tc.out_dir else ""
            # Gloo's line, less the source file it names and the advice after its first sentence.
            reason = re.sub(r"^\[[^\]]*\]\s*", "", str(e).strip()).split(". ")[0][:160]
            raise Failed(f"process {rank} of {world} lost touch with the others at iteration "
                         f"{trainer.it} ({reason}): another process stopped{kept}", shown=True) from None
        # A signal during an evaluation ended it: its step is saved, and there is no report to make.
        except Stopped as e:
            trainer.signals = None
            trainer.save()
            log(f"{e}: the evaluation was cut short; saved iteration {trainer.it} to {path}; continue "
                f"with --resume")
            return trainer, e.signum
        # A signal during the last evaluation and save, after the last step: the save is done.
        stop = stop or max(caught, default=0)
        caught.urgent = True
        if rank:
            return trainer, stop or None
        if trainer.it == start:
            log(f"nothing to train: {path} is at iteration {trainer.it}; raise --max_iters or "
                f"--max_time to go on")
            return trainer, None
        saved = f"saved iteration {trainer.it} to {path}" if tc.out_dir else "trained; no --out_dir"
        if stop:
            go_on = "; continue with --resume" if tc.out_dir else ""
            log(f"{signal.Signals(stop).name}: {saved}{go_on}")
        else:
            log(f"{saved} ({trainer.elapsed:.0f} s of training)")
        # The report shows the evaluations: a run stopped before its first has none to show.
        if not trainer.history:
            return trainer, stop or None
        try:
            close(trainer, log, figures)
        except Stopped as e:
            log(f"{e}: the report was cut short; iteration {trainer.it} is saved in {path}")
            return trainer, e.signum
    return trainer, stop or None


def lost_peer(error, world):
    """Whether error is a collective's failure under DDP, as Gloo and NCCL report a process of the
    run that has stopped."""
    text = str(error)
    return world > 1 and (isinstance(error, dist.DistError) or "gloo" in text or "NCCL" in text)


def diverged_message(trainer):
    """What a loss that is not finite says: where, and each option that can make training diverge,
    without guessing which one did."""
    tc = trainer.tc
    rates = f"--learning_rate {tc.learning_rate:g}"
    if tc.optimizer == "muon":
        rates += f", --muon_lr {tc.muon_lr:g}"
    kept = f"; the last good checkpoint in {tc.out_dir} is left as it was" if tc.out_dir else ""
    return (f"the training loss is {trainer.loss.item()} at iteration {trainer.it}: training diverged. "
            f"Too high a {rates} or --weight_decay {tc.weight_decay:g}, too short a --warmup_iters "
            f"{tc.warmup_iters}, or --grad_clip {tc.grad_clip:g} (0: off) can cause it{kept}")


def close(trainer, log, figures):
    """The closing report: what context buys, a sample, and out_dir/report.html."""
    by_position = report.loss_by_position(trainer)
    log(f"what context buys: val loss {by_position[0]:.3f} at position 0 (one token of context, all "
        f"a bigram model has) against {by_position[-1]:.3f} at position {len(by_position) - 1}")
    sample = report.closing_sample(trainer)
    log("sample:\n" + sample)
    if trainer.tc.out_dir:
        path = os.path.join(trainer.tc.out_dir, "report.html")
        try:
            page = report.write(trainer, path, by_position, sample, figures)
        except OSError as e:
            saved = os.path.join(trainer.tc.out_dir, "ckpt.pt")
            raise OSError(e.errno, f"cannot write {path} ({e.strerror}): the report was not written; "
                                   f"iteration {trainer.it} is saved in {saved}") from None
        log(f"report: {page}")


def main(argv=None):
    args, given = parse_args(argv)
    cli.printable_stdout()
    rank = 0
    world = 1
    code = 0
    try:
        rank, _, world = distributed()
        device_type = cli.usable_device(given.get("device", "")).type
        defaults = CUDA_DEFAULTS if device_type == "cuda" else {}
        if args.init_from:
            defaults = {**defaults, **INIT_FROM_DEFAULTS}
        tc = gpt.TrainConfig(**{**defaults, **given})
        data = cli.DataFile(args.data, args.dtype)
        _, stopped = run(tc, data, cli.printer, args.resume, args.log_interval, args.compile, given,
                         args.init_from)
        code = 128 + stopped if stopped else 0
    # Before the training loop, or a second signal in it: nothing more to save.
    except KeyboardInterrupt:
        code = 130
    except Failed as e:
        code = f"error: {e}" if e.shown else 1
    except (ValueError, OSError, RuntimeError, MemoryError) as e:
        # Outside DDP's agreement (a fault in the middle of training), each process says its own.
        where = "" if rank == 0 else f" (process {rank})"
        code = f"error: {cli.one_line(e)}{where}"
    end(code, world)


def end(code, world):
    """Ends the process with code (a status, or a message for stderr and status 1), or returns for
    a single process that ran to its end. A process of a DDP run, its work done and its process
    group left, ends at once: Gloo's threads, torn down with the interpreter, aborted it now and
    then (SIGABRT) after a fault all processes had agreed on."""
    if world == 1:
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


if __name__ == "__main__":
    main()
