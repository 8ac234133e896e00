"""Trains a GPT: python train.py [--option value ...]; python train.py --help lists every option.
Data-parallel over GPUs or CPU processes: torchrun --standalone --nproc_per_node=N train.py [...]

The command line that drives gpt.py's loop, gpt.Trainer.steps(), top to bottom: the options, the
config resolved once (a new run, a resume or GPT-2's weights), the data, the trainer, the steps with
what a long run needs (progress, the NaN stop, saving on a signal), the report."""
import sys

try:
    import contextlib
    import dataclasses
    import math
    import signal
    import threading

    import torch

    import checkpoint
    import cli
    import data
    import distributed
    import gpt
    import gpt2
    import report
# Ctrl-C while torch is still importing: nothing has started, so nothing is lost.
except KeyboardInterrupt:
    sys.exit(130)

# A GPU trains a larger model in minutes: on CUDA these replace the CPU defaults of the options not
# given. The optimizer stays AdamW there, the embedding at the others' rate, the decay at 0.1, no
# bigram table and whole windows throughout: Muon, the embedding's own rate, no decay, the table and
# short windows first won at equal time on 2 CPU cores (docs/benchmarks.md), unmeasured on a GPU.
CUDA_DEFAULTS = dict(max_iters=5000, batch_size=64, block_size=256, n_layer=6, n_head=6, n_embd=384,
                     dropout=0.1, learning_rate=1e-3, embedding_lr=1e-3, min_lr=1e-4, eval_iters=100,
                     weight_decay=0.1, bigram=0, optimizer="adamw", short_context=0.0)
# Finetuning GPT-2 (--init_from) takes small, constant steps: a learning rate for training from
# scratch would wreck what it knows in a few steps.
INIT_FROM_DEFAULTS = dict(learning_rate=3e-5, min_lr=3e-5, warmup_iters=0, weight_decay=0.0,
                          batch_size=4, max_iters=200, eval_interval=50, eval_iters=10,
                          optimizer="adamw", short_context=0.0)
# What a user, a terminal or a scheduler sends to stop a run (SLURM's --signal sends SIGUSR1 or 2,
# CPU-time limits SIGXCPU): each saves the step under way, then exits with 128 + the signal's
# number, as a shell reports such an end.
STOPS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2",
                                            "SIGXCPU") if hasattr(signal, name)]


# ---------------------------------------------------------------------------------------------- options
def parse_args(argv=None):
    """This file's own options, and the TrainConfig options given, {name: value}; the others keep
    their defaults. Every number is checked here, NaN and inf included."""
    parser = cli.Parser(description="Train a GPT on a text or on token ids; writes out_dir/ckpt.pt "
                                    "and out_dir/report.html.")
    parser.add_argument("--data", type=cli.not_empty("a file"),
                        help="a UTF-8 text, one token per character; or, with a name ending in .bin, "
                             "token ids as --dtype integers one after another (nanoGPT's train.bin). "
                             "The last 10%% is held out for validation (default: input.txt)")
    parser.add_argument("--dtype", choices=data.ID_DTYPES,
                        help="the integer type of the ids in a .bin --data (default: uint16)")
    parser.add_argument("--init_from", metavar="GPT2", type=cli.not_empty("a folder, or a name such as gpt2"),
                        help="start from GPT-2's weights: a folder with config.json and "
                             "model.safetensors, or one of gpt2, gpt2-medium, gpt2-large, gpt2-xl "
                             "(downloaded with huggingface_hub); a text is then read in GPT-2's "
                             "tokens (tiktoken or transformers) (default: a new model)")
    parser.add_argument("--resume", default=False, **cli.FLAG,
                        help="continue from out_dir/ckpt.pt with its model, characters, seed and "
                             "options; other options given replace those it recorded (default: "
                             "%(default)s)")
    parser.add_argument("--log_interval", type=cli.AT_LEAST_1,
                        default=100, help="print progress every this many steps (default: %(default)s)")
    parser.add_argument("--compile", default=False, **cli.FLAG,
                        help="torch.compile the model: steps up to 1.3x as fast on 2 CPU cores, for "
                             "70-80 MB more memory, after 20-45 s of compiling the first time (cached "
                             "after); pays on runs of minutes once cached (default: %(default)s)")
    for name in cli.FIELDS:
        rule = cli.option_rule(name)
        shown = repr(cli.FIELDS[name].default)
        if name in CUDA_DEFAULTS:
            shown += f", on CUDA {CUDA_DEFAULTS[name]!r}"
        if name == "optimizer":
            shown += " until Muon is measured on a GPU"
        if name in INIT_FROM_DEFAULTS:
            shown += f", with --init_from {INIT_FROM_DEFAULTS[name]!r}"
        if name == "vocab_size":
            shown = "the text's characters; for a .bin, its largest id + 1"
        rule["help"] = f"{rule['help']} (default: {shown})".replace("%", "%%")
        parser.add_argument(f"--{name}", **rule)
    args = parser.parse_args(argv)
    own = ("data", "dtype", "init_from", "resume", "log_interval", "compile")
    given = {name: value for name, value in vars(args).items() if value is not None and name not in own}
    if args.resume and args.init_from:
        parser.error("--resume continues a run, --init_from starts one from GPT-2: give one of them")
    if given.get("max_time") and "max_iters" in given:
        parser.error("--max_time trains for seconds, --max_iters for steps: give one of them")
    return args, given


def first_config(defaults, given, resume=False, init_from=None):
    """The TrainConfig a run starts from, before set_up resolves the one it trains with. A resumed
    run trains with its checkpoint's options and those given, which set_up checks together (the
    rules that tie two options too): here it takes only its folder and device. --init_from keeps
    GPT-2's model options, and its constant rate: min_lr follows a --learning_rate given alone."""
    if resume:
        return gpt.TrainConfig(**defaults, **{k: given[k] for k in ("out_dir", "device") if k in given})
    if not init_from:
        return gpt.TrainConfig(**{**defaults, **given})
    options = {**defaults, **INIT_FROM_DEFAULTS}
    if "learning_rate" in given:
        options["min_lr"] = given["learning_rate"]
    kept = [name for name in given if name not in checkpoint.MODEL_OPTIONS]
    return gpt.TrainConfig(**{**options, **{name: given[name] for name in kept}})


# ---------------------------------------------------------------------------------------------- set-up
def set_up(tc, device, data_file, given, resume, init_from, rank, log):
    """The Trainer this process trains with: new, resumed, or from GPT-2's weights. The config is
    resolved here, once: the options of tc, those the checkpoint or GPT-2's model implies, the
    vocabulary, the device and the process's own, all checked before the first step."""
    path = checkpoint.path_in(tc.out_dir)
    model = None
    tokenizer = None
    implied = {}
    if resume:
        model, tokenizer, ckpt = checkpoint.load(path, device)
        implied = checkpoint.resumed_options(tc, ckpt, path, given, log)
    elif init_from:
        model = gpt2.load(init_from, device)
        implied = checkpoint.model_options(tc.block_size, model.config, given, "--init_from", log)
        tokenizer = gpt2.Tokenizer(gpt2.folder_of(init_from))
    # The run keeps its checkpoint's tokenizer, whatever its data: a text needs one that is here.
    if resume and not data.is_ids(data_file):
        checkpoint.needs_tokenizer(tokenizer, path, ": resume it on the same ids, --data FILE.bin")
    if resume:
        data_file = checkpoint.data_as_recorded(ckpt, data_file, path, "train without --resume", log=log)
    ids, tokenizer = data.read_data(data_file, tokenizer)
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
        vocab_size = given.get("vocab_size") or data.implied_vocab_size(ids)
    options = {**dataclasses.asdict(tc), **implied, "vocab_size": vocab_size, "device": device}
    tc = gpt.TrainConfig(**{**options, **distributed.process_options(options, rank)})
    cli.check_used(tc, given)
    data.check_fits(ids, tc.vocab_size, tc.block_size)
    # This process holds out_dir's lock, and resumes its checkpoint or refuses it (check_new).
    trainer = gpt.Trainer(tc, ids, tokenizer, model and model.train(), log, owner=True)
    # What the data was, so that a resume or a report reads it as this run did.
    checkpoint.record_data(trainer, data.describe(data_file))
    if resume:
        checkpoint.resume(trainer, ckpt, path)
        distributed.reseed(trainer, rank)
        log(f"resuming {path} at iteration {trainer.it}")
    elif tc.out_dir:
        checkpoint.check_new(path)
    return trainer


# ---------------------------------------------------------------------------------------------- signals
class Stopped(Exception):
    """A stop that cannot wait for the step to end: one during an evaluation or the report, or a second."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_caught(urgent=lambda: False):
    """While training, a stopping signal only joins the list this yields, so that the step under way finishes
    whole and can be saved. A second one, or one while urgent() (an evaluation, the report), raises Stopped
    at once. Handlers can be set only in the main thread; elsewhere the signals keep theirs."""
    caught = []

    def on_signal(signum, frame):
        caught.append(signum)
        if len(caught) > 1 or urgent():
            raise Stopped(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.signal(s, on_signal) for s in STOPS} if main_thread else {}
    try:
        yield caught
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


# ---------------------------------------------------------------------------------------------- the run
def run(tc, data_file, log=print, resume=False, log_interval=100, compile=False, given=(),
        init_from=None, ranks=None):
    """Trains as tc says, data-parallel under torchrun, on data_file (a data.DataFile, a text, or ids);
    returns the trainer and the signal that stopped it, or None. given: the options the user set, for
    --resume and --init_from; ranks: distributed.ranks(), when the caller has them."""
    rank, local_rank, world = ranks or distributed.ranks()
    with distributed.process_group(world, local_rank, tc.device) as device_name:
        say = log if rank == 0 else lambda *args: None
        lock = None
        trainer = None
        error = None
        try:
            if (tc.out_dir or resume) and rank == 0:
                checkpoint.check_out_dir(tc.out_dir, resume, getattr(data_file, "path", None))
                lock = checkpoint.own_out_dir(tc.out_dir)
            trainer = set_up(tc, device_name, data_file, dict(given), resume, init_from, rank, say)
        # Every process's error, a bug's too, goes to the agreement, so that none waits for another.
        except Exception as e:
            error = e
        try:
            distributed.agree_on_setup(error, trainer, rank, world)
            return trainer, drive(trainer, say, log_interval, compile, rank, world)
        # However the run ends, its out_dir is free for the next, and holds no half-written file.
        finally:
            if lock is not None:
                checkpoint.remove_partial(tc.out_dir)
                lock.close()


def prepare(trainer, log, compile, world):
    """What the steps run on: TF32 on CUDA, torch.compile, DDP; and the run's opening lines."""
    if trainer.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if compile:
        trainer.wrapped_model = torch.compile(trainer.wrapped_model)
        log("torch.compile: the first steps wait on its compiling (20-45 s on 2 CPU cores the first "
            "time, seconds once cached)")
    distributed.wrap(trainer, world)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    # The bigram table's rows are read one per token: said apart, as they are most of a small model's count.
    bigram = trainer.model.bigram
    table = f" ({bigram.weight.numel() / 1e6:.2f}M in the bigram table)" if bigram is not None else ""
    processes = f", {world} processes" if world > 1 else ""
    bf16 = " (bf16 autocast)" if gpt.matmul_dtype(trainer.device) == torch.bfloat16 else ""
    log(f"{n_params / 1e6:.2f}M parameters{table} on {trainer.device}{bf16}{processes}; "
        f"{len(trainer.splits['train']):,} tokens to train on, {len(trainer.splits['val']):,} held out")


def drive(trainer, log, log_interval, compile, rank, world):
    """Runs trainer.steps() with what a long run needs: progress lines, the NaN stop, saving on a
    signal, the closing report. Returns the signal that stopped the run, or None."""
    tc = trainer.tc
    prepare(trainer, log, compile, world)
    tokens_per_step = tc.batch_size * tc.block_size * tc.grad_accum * world
    progress = report.Progress(trainer, tokens_per_step)
    ended = trainer.done() and not checkpoint.evaluation_pending(trainer)
    stop = 0
    closing = False
    # An evaluation, whose model is in eval mode, and the report end at once on a signal.
    with signals_caught(lambda: closing or not trainer.model.training) as caught:
        try:
            # A new run saves its first weights; a resumed one runs the evaluation a stop cut short.
            if trainer.it == 0:
                trainer.save()
            elif checkpoint.evaluation_pending(trainer):
                # The learning rate of the step before, which the evaluation records.
                trainer.lr = gpt.lr_at(tc, trainer.it - 1, trainer.elapsed)
                trainer.evaluate(whole=trainer.done())
                trainer.save()
            for _ in trainer.steps():
                progress.step()
                last = trainer.done()
                logged = trainer.it % log_interval == 0 or last
                check = logged or trainer.it % tc.eval_interval == 0
                stop, diverged = distributed.agree(trainer, max(caught, default=0), world,
                                                   check or world > 1)
                if diverged:
                    raise distributed.Failed(report.diverged(trainer), shown=rank == 0)
                if logged or stop:
                    log(progress.line(trainer.loss.item()))
                if stop:
                    trainer.save()
                    break
        except (Stopped, OSError, RuntimeError) as e:
            if not isinstance(e, Stopped) and len(caught) < 2:
                raise failure(e, trainer, rank, world) from None
            return cut_short(trainer, caught, log)
        # A signal during the last evaluation and save, after the last step: the save is done.
        stop = stop or max(caught, default=0)
        closing = True
        if rank == 0:
            return close(trainer, ended, stop, tokens_per_step, world, log)
        return stop or None


def cut_short(trainer, caught, log):
    """A second signal leaves the last checkpoint as it was (inside torch.save it may come out as the
    RuntimeError of its writer, cut short); one during an evaluation saves the run as it stood before
    it (an evaluation reads fixed windows, drawing no batch). Returns the signal."""
    if len(caught) > 1:
        log(f"{signal.Signals(caught[-1]).name}, a second signal: stopped at once; {checkpoint.as_it_was(trainer)}")
        return caught[-1]
    try:
        trainer.save()
    except (Stopped, OSError, RuntimeError) as e:
        if len(caught) > 1:
            return cut_short(trainer, caught, log)
        raise failure(e, trainer) from None
    saved = checkpoint.saved(trainer, "; continue with --resume, which runs it first")
    log(f"{signal.Signals(caught[-1]).name}: the evaluation was cut short; {saved}")
    return caught[-1]


def failure(error, trainer, rank=0, world=1):
    """A failed save (a full disk, a file-size limit, a folder that turned read-only), in one line
    that names the file and the cause; or, under torchrun, a collective's RuntimeError as another
    process stopped. Else error."""
    lost = distributed.lost_peer(error, trainer, rank, world)
    if lost:
        return lost
    cause = checkpoint.write_failure(error)
    if cause is None:
        return error
    return OSError(cause.errno, f"cannot write {checkpoint.path_in(trainer.tc.out_dir)} "
                                f"({cause.strerror}); any file there is as it was")


def close(trainer, ended, stop, tokens_per_step, world, log):
    """The end of a run in its first process: what was saved, and the report of a run not stopped."""
    tc = trainer.tc
    path = checkpoint.path_in(tc.out_dir)
    if ended:
        bound = "--max_time" if tc.max_time else "--max_iters or --max_time"
        log(f"nothing to train: {path} is at iteration {trainer.it}; raise {bound} to go on")
        return None
    saved = checkpoint.saved(trainer)
    # A stop is bounded: sample.py --report writes the report later, from an evaluated checkpoint.
    later = f": {checkpoint.report_later(tc.out_dir)} writes it" if trainer.history and tc.out_dir else ""
    if stop:
        kept = checkpoint.saved(trainer, "; continue with --resume")
        log(f"{signal.Signals(stop).name}: {kept}; no report{later}")
        return stop
    log(f"{saved} ({trainer.elapsed:.0f} s of training)")
    # The report shows the evaluations: a run stopped before its first has none to show.
    if not trainer.history:
        return None
    # The last evaluation's val loss is of the held-out split, up to gpt.MAX_EVAL_TOKENS of it: the
    # run's figure. A character model's also in bits per character, the unit results are given in.
    val = trainer.history[-1]["val"]
    chars = isinstance(trainer.tokenizer, gpt.CharTokenizer)
    bits = f", {val / math.log(2):.3f} bits per character" if chars else ""
    log(f"val loss {val:.4f} on {held_out_read(len(trainer.splits['val']))}{bits}")
    try:
        figures = dict(tokens_per_step=tokens_per_step, processes=world)
        page = report.make(trainer.model, trainer.tokenizer, trainer.history,
                           trainer.splits["val"], tc, tc.out_dir, figures, log)
    except Stopped as e:
        log(f"{e}: the report was cut short; {saved}{later}")
        return e.signum
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}; iteration {trainer.it} is saved in {path}") from None
    if page:
        log(f"report: {page}")
    return None


def held_out_read(held_out):
    """What a run's last evaluation reads of its held_out tokens, as its last line says it."""
    if held_out <= gpt.MAX_EVAL_TOKENS:
        return f"the whole held-out split ({held_out - 1:,} tokens)"
    return f"the first {gpt.MAX_EVAL_TOKENS:,} of {held_out:,} held-out tokens"


def main(argv=None):
    args, given = parse_args(argv)
    cli.printable_stdout()
    rank = 0
    world = 1
    joining = False
    try:
        ranks = distributed.ranks()
        rank, _, world = ranks
        device_type = cli.usable_device(given.get("device", "")).type
        defaults = CUDA_DEFAULTS if device_type == "cuda" else {}
        tc = first_config(defaults, given, args.resume, args.init_from)
        named = args.data is not None
        data_file = data.DataFile(args.data if named else "input.txt", args.dtype, named)
        joining = True
        _, stopped = run(tc, data_file, report.printer, args.resume, args.log_interval, args.compile,
                         given, args.init_from, ranks)
        code = 128 + stopped if stopped else 0
    # Before the training loop, nothing to save; a signal while a stop or the end is said, saved.
    except (KeyboardInterrupt, Stopped) as e:
        code = 128 + getattr(e, "signum", signal.SIGINT)
    except distributed.Failed as e:
        code = f"error: {e}" if e.shown else 1
    except (ValueError, OSError, RuntimeError, MemoryError) as e:
        # Every process finds a fault before they join, which the first says; later, each its own.
        where = "" if rank == 0 else f" (process {rank})"
        code = f"error: {cli.one_line(e)}{where}" if joining or rank == 0 else 1
    distributed.end(code, world)


if __name__ == "__main__":
    main()
