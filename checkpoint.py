"""A saved run, from the command lines' side. gpt.py writes out_dir/ckpt.pt (gpt.Trainer.save) and
reads its model back (gpt.load_checkpoint); this file is the one that opens any checkpoint a user
hands over and reads its keys: it checks it (finite weights, the model's shapes, the optimizers'
states, the evaluations), restores a gpt.Trainer from it, gives the options it recorded and the
tokenizer it needs, and keeps the run's folder (writable, one run at a time).

    model, tokenizer, ckpt = checkpoint.load(checkpoint.path_in("out"), "cpu")
    options = checkpoint.resumed_options(tc, ckpt, path, given, print)
    checkpoint.resume(trainer, ckpt, path)
"""
import contextlib
import dataclasses
import errno
import math
import os
import re
import shlex
import stat
import warnings

import torch

import cli
import data
import gpt
import gpt2


def path_in(out_dir):
    """The checkpoint of the run in out_dir."""
    return os.path.join(out_dir, gpt.CHECKPOINT)


# What a run without an out_dir says of its checkpoint.
NOTHING_SAVED = "no --out_dir, so nothing is saved"


def saved(trainer, go_on=""):
    """What a run that ends or stops says of its checkpoint: the iteration saved and where, then
    go_on, how to go on from it, where anything is left to do."""
    if not trainer.tc.out_dir:
        return NOTHING_SAVED
    # A run done, its last evaluation saved, has nothing left to go on with.
    if trainer.done() and not evaluation_pending(trainer):
        go_on = ""
    return f"saved iteration {trainer.it} to {path_in(trainer.tc.out_dir)}{go_on}"


def as_it_was(trainer):
    """What a run stopped at once, a save cut short, says it left: its last checkpoint, or none."""
    if not trainer.tc.out_dir:
        return NOTHING_SAVED
    if not os.path.exists(path_in(trainer.tc.out_dir)):
        return "nothing is saved yet"
    return f"the last checkpoint in {trainer.tc.out_dir} is as it was"


def report_later(out_dir):
    """The command that writes the report of the run in out_dir later, from its checkpoint."""
    return f"python sample.py --report --out_dir {shlex.quote(out_dir)} --data DATA"


# ---------------------------------------------------------------------------------------------- loading
def need_checkpoint(path):
    """Refuses, in one line, a path that holds no checkpoint's file."""
    if os.path.isfile(path):
        return
    if not os.path.exists(path):
        raise ValueError(f"no checkpoint file at {path}: train one first with python train.py")
    what = "a device or a socket"
    if os.path.isdir(path):
        what = "a folder"
    elif stat.S_ISFIFO(os.stat(path).st_mode):
        what = "a pipe"
    raise ValueError(f"no checkpoint file at {path} (it is {what}, not a file): pass --out_dir the folder of a run")


def load(path, device):
    """(model in eval mode on device, its tokenizer, the checkpoint) from gpt.load_checkpoint, with
    one line that says what is wrong when path holds no checkpoint that can be used. The tokenizer
    is the one it was trained with: its characters', GPT-2's, a Named for one of the user's own, or
    None for ids of no tokenizer."""
    need_checkpoint(path)
    try:
        # Read here, to the CPU (torch.load maps no cpu:0; the random states stay CPU tensors), so
        # that a checkpoint of the layout before each map had a weight of its own is brought to
        # today's before gpt.load_checkpoint builds its model on device.
        # torch.load reads no checksum: a bit flipped on the disk would load, train and be saved
        # again; nor does it bound what a compressed record unpacks to.
        fault = data.zip_fault(path)
        if fault:
            raise ValueError(fault)
        # torch warns of a pickle it did not write in lines of their own, before it reads or refuses it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        # A tensor or a list, indexed by name below, would warn in lines before it failed.
        if not isinstance(ckpt, dict):
            raise TypeError(f"it holds a {type(ckpt).__name__}, not a dict")
        # Values a run never writes would overflow the stack, or take hours, in a message that shows them.
        unshowable = unwieldy(ckpt)
        if unshowable:
            raise ValueError(unshowable)
        # gpt.CharTokenizer sorts the characters it is given: any others would map ids to others.
        chars = ckpt.get("chars")
        if chars and not (isinstance(chars, str) and list(chars) == sorted(set(chars))):
            raise ValueError("its characters are not a string of distinct ones in order")
        # A lone surrogate is no character a text can hold, nor one that can be printed.
        if chars and any("\ud800" <= c <= "\udfff" for c in chars):
            raise ValueError("its characters hold a lone surrogate")
        # A checkpoint from before the bigram table has none.
        ckpt["config"] = {"bigram": 0, **ckpt["config"]}
        # Any other field it lacks would take today's default: a model of another block, in silence.
        missing = [f.name for f in dataclasses.fields(gpt.GPTConfig) if f.name not in ckpt["config"]]
        if missing:
            raise ValueError(f"its config lacks {', '.join(missing)}")
        check_weights(ckpt["model"])
        split = split_maps(ckpt["model"], ckpt["config"])
        # Marked, in memory alone, for resume, which cuts the optimizers' states likewise.
        ckpt[OLD_LAYOUT] = split is not ckpt["model"]
        ckpt["model"] = split
        # The model is made first where it takes no memory: a small file's config may ask for
        # gigabytes, and weights that do not fit it are refused before any are taken.
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # copying into a meta weight does nothing, and says so
            gpt.GPT(gpt.GPTConfig(**ckpt["config"])).load_state_dict(ckpt["model"])
        model, tokenizer, ckpt = gpt.load_checkpoint(ckpt, str(device))
        # Else decoding a sampled token would fail, or give other characters than the training's.
        if tokenizer and tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"{tokenizer.vocab_size} characters for a vocab_size of "
                             f"{model.config.vocab_size}")
    # A file this process may not read is no fault of the checkpoint's; torch.load says "Invalid
    # argument" of one cut short.
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise ValueError(f"cannot read {path} ({e.strerror}): give this process read access to "
                             f"it") from None
        raise ValueError(f"cannot read {path} ({e.strerror}): it is cut short or damaged, not a whole "
                         f"checkpoint; train a new one with python train.py") from None
    except Exception as e:
        # torch's own messages go on for lines, and advise weights_only=False, no help here; a
        # state_dict's says on its second line which weight does not fit.
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        first = re.split(r"(?<=\.)\s", lines[0])[0] if lines else ""
        if first.endswith(":") and len(lines) > 1:
            first = f"{first} {lines[1][:200]}"
        raise ValueError(f"{path} is not a checkpoint this gpt.py can load ({type(e).__name__}"
                         f"{': ' + first if first else ''}); train a new one with python train.py") from None
    if not all(w.isfinite().all() for w in ckpt["model"].values()):
        raise ValueError(f"{path} holds weights that are NaN or inf, from a run that diverged: train "
                         f"anew, with a lower --learning_rate")
    name = ckpt.get("tokenizer")
    if not isinstance(name, (str, type(None))):
        raise ValueError(f"{path} records its tokenizer as a {type(name).__name__}, not a name: it is damaged or "
                         f"hand-made; train a new one with python train.py")
    if tokenizer is None and name == gpt2.Tokenizer.name:
        tokenizer = gpt2.Tokenizer()
    elif tokenizer is None and name is not None:
        tokenizer = Named(name, model.config.vocab_size)
    return model, tokenizer, ckpt


# Deeper, and more, than the dicts, lists and tuples of any checkpoint a run writes: its optimizers'
# states nest 7 deep, and each evaluation it records is one dict.
MAX_NESTING = 32
MAX_CONTAINERS = 10 ** 6
CONTAINERS = (dict, list, tuple)


def unwieldy(value):
    """What makes value's dicts, lists and tuples more than a message can show, or None: nested
    past MAX_NESTING, or past MAX_CONTAINERS counted as written out. Walked without recursion: a
    hand-made file may nest them thousands deep, hold one in itself, or share one many times over
    (a list of the same list twice, 30 times nested, writes out a billion)."""
    stack = [(value, 1)]
    containers = 0
    while stack:
        value, depth = stack.pop()
        containers += 1
        if depth > MAX_NESTING:
            return f"its values nest more than {MAX_NESTING} deep"
        if containers > MAX_CONTAINERS:
            return f"its values hold more than {MAX_CONTAINERS:,} dicts, lists and tuples, written out"
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items if isinstance(item, CONTAINERS))
    return None


# The floats a weight may be stored in: float8's have no arithmetic to check them with.
REAL_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_weights(state):
    """Refuses a state dict that is not one of dense tensors of real floats: a complex weight would
    load with its imaginary part dropped, with no more than a warning."""
    if not isinstance(state, dict):
        raise TypeError(f"its model is a {type(state).__name__}, not a state dict of weights")
    for name, w in state.items():
        if not (torch.is_tensor(w) and w.dtype in REAL_FLOATS and w.layout == torch.strided):
            kind = f"a {type(w).__name__}"
            if torch.is_tensor(w):
                kind = f"a tensor of {str(w.dtype).removeprefix('torch.')}"
            if torch.is_tensor(w) and w.layout != torch.strided:
                kind = f"a {str(w.layout).removeprefix('torch.')} tensor"
            raise TypeError(f"its weight {cli.shown(name)} is {kind}, not a dense tensor of real floats")


class Named:
    """The tokenizer of a checkpoint that records only its name (one of the user's own): a run
    resumed on its token ids keeps the name for its next checkpoint; nothing here can use it."""

    def __init__(self, name, vocab_size):
        self.name = name
        self.vocab_size = vocab_size
        self.absent = (f"the tokenizer {cli.shown(name)} is the user's own, not here: give its token ids "
                       f"(--data FILE.bin), or use it from Python")

    def encode(self, text):
        raise ValueError(self.absent)

    def decode(self, ids):
        raise ValueError(self.absent)


def usable(tokenizer):
    """Whether tokenizer can encode and decode here: not None (ids of no tokenizer), nor a Named."""
    return tokenizer is not None and not isinstance(tokenizer, Named)


def needs_tokenizer(tokenizer, path, advice):
    """Refuses a checkpoint whose tokenizer is not usable here, in one line that ends with advice
    (which begins with its own punctuation)."""
    if not usable(tokenizer):
        named = None if tokenizer is None else cli.shown(tokenizer.name, tokenizer.name)
        which = "no tokenizer" if tokenizer is None else f"a tokenizer it only names ({named})"
        raise ValueError(f"{path} was trained on token ids of {which}{advice}")


# ---------------------------------------------------------------------------------------------- the old layout
# Before each map had a weight of its own, attn.c_attn held the query, key and value maps stacked by
# rows, and SwiGLU's mlp.c_fc its gate, then its up projection: each new weight is a block of rows of
# an old one, (old module, the new modules in the order of their rows).
STACKED = {"attn.c_attn": ("attn.c_q", "attn.c_k", "attn.c_v"), "mlp.c_fc": ("mlp.c_gate", "mlp.c_fc")}
# The key load() marks a checkpoint of the old layout with.
OLD_LAYOUT = "split from the old layout"


def piece_of(name, config):
    """(the old layout's name of the weight that the weight name comes from, which block of its rows,
    how many blocks)."""
    module, _, leaf = name.rpartition(".")
    for old, new in STACKED.items():
        if old == "mlp.c_fc" and config["mlp"] != "swiglu":
            continue
        for i, part in enumerate(new):
            if module.endswith("." + part):
                return f"{module[:-len(part)]}{old}.{leaf}", i, len(new)
    return name, 0, 1


def split_maps(state, config):
    """A model's state dict in today's layout: one of the old layout has each stacked weight cut into
    its maps; any other is returned as it is."""
    if not any(name.endswith(".attn.c_attn.weight") for name in state):
        return state
    pieces = {}
    for name in state:
        module, _, leaf = name.rpartition(".")
        for old, new in STACKED.items():
            if module.endswith("." + old) and (old != "mlp.c_fc" or config["mlp"] == "swiglu"):
                pieces.update({f"{module[:-len(old)]}{part}.{leaf}": name for part in new})
    out = {name: w for name, w in state.items() if name not in pieces.values()}
    for name in pieces:
        source, i, n = piece_of(name, config)
        out[name] = state[source].chunk(n)[i].clone()
    return out


def split_states(trainer, saved_optimizers):
    """The optimizers' states of a checkpoint of the old layout, for trainer's optimizers: each
    state of a stacked weight cut as the weight is. The old order of the parameters is today's with
    the maps of each stacked weight taken as that weight, where it stood."""
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    config = dataclasses.asdict(trainer.model.config)
    out = []
    for optimizer, saved in zip(trainer.optimizers, saved_optimizers):
        new = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        sources = [piece_of(name, config) for name in new]
        old = list(dict.fromkeys(source for source, _, _ in sources))
        state = {}
        for j, (source, i, n) in enumerate(sources):
            kept = saved["state"].get(old.index(source))
            # A number (AdamW's step) is cloned too: AdamW counts each parameter's steps in place.
            if kept is not None:
                state[j] = {key: value.chunk(n)[i].clone() if value.dim() else value.clone()
                            for key, value in kept.items()}
        # Today's groups (the embedding's apart), their parameters numbered in today's order:
        # restore() keeps the trainer's hyperparameters and reads only these numbers of them.
        sizes = [len(group["params"]) for group in optimizer.param_groups]
        starts = [sum(sizes[:g]) for g in range(len(sizes))]
        groups = [{**group, "params": list(range(start, start + size))}
                  for group, start, size in zip(optimizer.state_dict()["param_groups"], starts, sizes)]
        out.append({"state": state, "param_groups": groups})
    return out


# ---------------------------------------------------------------------------------------------- options
# The model's options: --resume and --init_from keep the model's own and name those given that
# differ. block_size is the training's context too, which may be shorter than the model's.
MODEL_OPTIONS = [f.name for f in dataclasses.fields(gpt.GPTConfig) if f.name != "block_size"]
# A resumed run goes on with its recorded random streams, so a seed given then would be recorded
# without being used: it is named as ignored, like the model's options.
KEPT_ON_RESUME = ["seed"]


def recorded_options(ckpt, path, advice):
    """The TrainConfig options a checkpoint recorded, but out_dir and device (those are the new
    run's), each held to the rule of its flag: a value no run could have recorded is refused in one
    line that ends with advice."""
    recorded = ckpt.get("train_config", {})
    if not isinstance(recorded, dict):
        raise ValueError(f"{path} records its options as {type(recorded).__name__}, not a dict: "
                         f"it is damaged or hand-made; {advice}")
    options = {}
    for name, value in recorded.items():
        if name not in cli.FIELDS or name in ("out_dir", "device"):
            continue
        try:
            gpt.check_option(cli.FIELDS[name], value)
        # OverflowError: an integer too large for a float option (float() cannot take 10 ** 400).
        except (ValueError, OverflowError) as e:
            rule = cli.FIELDS[name].metadata
            reason = f"{name} must be in [{rule['min']}, {rule['max']}]"
            reason = str(e) if isinstance(e, ValueError) and len(str(e)) <= 100 else reason
            raise ValueError(f"{path} records {name} = {cli.shown(value)}, which no run could have ({reason}): "
                             f"it is damaged or hand-made; {advice}") from None
        # A float option may have been recorded as a whole number.
        options[name] = float(value) if type(cli.FIELDS[name].default) is float else value
    # Each alone within its rule, but gpt.TrainConfig refuses a rising rate.
    if options.get("min_lr", 0.0) > options.get("learning_rate", math.inf):
        raise ValueError(f"{path} records min_lr = {options['min_lr']} above its learning_rate "
                         f"{options['learning_rate']}, a rate that would rise, which no run of this "
                         f"gpt.py trains with; {advice}")
    # A run recorded before these options goes on as it trained: its embedding at its learning_rate,
    # Muon's momentum flat from the start...
    for name, before in (("embedding_lr", "learning_rate"), ("muon_momentum_start", "muon_momentum")):
        if before in options and name not in recorded:
            options[name] = options[before]
    # ... and on whole windows from the first step.
    if options and "short_context" not in recorded:
        options["short_context"] = 0.0
    return options


def model_options(block_size, config, given, why, log):
    """The model options of config, for a run of that block_size, naming those given that differ as
    ignored; the training's block_size may be the model's or shorter."""
    ignored = [f"--{name} {given[name]}" for name in MODEL_OPTIONS
               if name in given and given[name] != getattr(config, name)]
    if ignored:
        log(f"{why} keeps the model's options, so these are ignored: {', '.join(ignored)}")
    block_size = min(block_size, config.block_size) if "block_size" not in given else block_size
    if block_size > config.block_size:
        raise ValueError(f"--block_size {block_size} is beyond the model's context of "
                         f"{config.block_size}: give at most that")
    return {**{name: getattr(config, name) for name in MODEL_OPTIONS}, "block_size": block_size}


def resumed_options(tc, ckpt, path, given, log):
    """The options a resumed run trains with, beside those of tc: those the checkpoint recorded,
    then those given (recorded in the next checkpoint, as they run). The model's own options and
    the seed stay, and those given that differ are named as ignored."""
    recorded = recorded_options(ckpt, path, "train without --resume")
    # The optimizers' states in the checkpoint are those of the optimizer it recorded.
    optimizer = recorded.get("optimizer", "adamw")
    if given.get("optimizer", optimizer) != optimizer:
        raise ValueError(f"{path} was trained with --optimizer {optimizer}, whose state it holds: "
                         f"resume it with that optimizer (leave out --optimizer), or train anew")
    ignored = [f"--{name} {given[name]}" for name in KEPT_ON_RESUME
               if name in given and name in recorded and given[name] != recorded[name]]
    if ignored:
        log(f"--resume goes on with the run's random streams, so these are ignored: "
            f"{', '.join(ignored)}")
    given = {k: v for k, v in given.items() if k not in KEPT_ON_RESUME or k not in recorded}
    options = {**recorded, **given}
    # A timed run stops on its clock, which a --max_iters given would leave unused.
    if options.get("max_time") and "max_iters" in given:
        raise ValueError(f"{path} is a run timed by --max_time {options['max_time']:g}, which "
                         f"--max_iters does not change: give a longer --max_time, or --max_time 0 "
                         f"--max_iters {given['max_iters']} to train by steps")
    block_size = options.get("block_size", tc.block_size)
    config = gpt.GPTConfig(**ckpt["config"])
    return {**options, **model_options(block_size, config, given, "--resume", log)}


def recorded_config(ckpt, path, config, device, advice):
    """The TrainConfig of the run that wrote the checkpoint, to evaluate its model (config) again
    on device without writing anything: its recorded options, its model's own, a context no longer
    than its own."""
    options = recorded_options(ckpt, path, advice)
    block_size = options.get("block_size", gpt.TrainConfig.block_size)
    model = model_options(block_size, config, {}, "--report", print)
    return gpt.TrainConfig(**{**options, **model, "out_dir": "", "device": str(device)})


# ---------------------------------------------------------------------------------------------- the data
def data_as_recorded(ckpt, data_file, path, advice, its_own=False, log=None):
    """data_file (a data.DataFile) read as the run of the checkpoint at path read its data: a .bin
    given without --dtype in the ids' type the checkpoint records. The file the run trained on (its
    size and fingerprint) read otherwise is refused in one line that ends with advice; with its_own
    (a report), any other file too. Another file named by --data is said to log, where given."""
    recorded = ckpt.get("data")
    if recorded is None or not isinstance(data_file, data.DataFile):
        return data_file
    kinds = ("text", *data.ID_DTYPES)
    if not (isinstance(recorded, dict) and recorded.get("read_as") in kinds):
        raise ValueError(f"{path} records its data as {cli.shown(recorded)}: it is damaged or hand-made; "
                         f"{advice}")
    # Before its fingerprint is read: a pipe there would wait for a writer for ever.
    data.check_file(data_file.path, "the data file", "--data")
    was = recorded["read_as"]
    other = "bytes" in recorded and not same_file(data_file.path, recorded)
    not_its_own = f"{path} was not trained on {data_file.path} as it is now (another file, or this one since changed)"
    # --data left out reads input.txt: a run trained on another file would go on with it in silence.
    if other and not data_file.named:
        raise ValueError(f"{not_its_own}, which --data reads when it is left out: give --data the file it "
                         f"trained on (or --data {data_file.path} to go on with this one)")
    # A report's figures of another text would stand beside the run's own losses, as if its own.
    if other and its_own:
        raise ValueError(f"{not_its_own}: give --data the file it trained on, as it was then")
    # A run may go on with other data, as a user asks; never without saying so.
    if other and log is not None:
        log(f"{not_its_own}: it goes on with this one")
    if data.is_ids(data_file) and data_file.dtype is None and was in data.ID_DTYPES:
        data_file = dataclasses.replace(data_file, dtype=was)
    now = (data_file.dtype or "uint16") if data.is_ids(data_file) else "text"
    if now != was and same_file(data_file.path, recorded):
        shown = {"text": "a text"}
        raise ValueError(f"{data_file.path} is the file {path} was trained on, read then as "
                         f"{shown.get(was, was + ' ids')} and now as {shown.get(now, now + ' ids')}: "
                         + ("leave out --dtype" if was in data.ID_DTYPES else "give it under its own name"))
    return data_file


def same_file(file, recorded):
    """Whether the file at file is the one recorded (data.describe): the same size and fingerprint."""
    try:
        return (os.path.getsize(file) == recorded.get("bytes")
                and data.fingerprint(file) == recorded.get("fingerprint"))
    except OSError:
        return False


def record_data(trainer, record):
    """Makes every checkpoint trainer writes record what its data was (record, data.describe's)."""
    trainer.record["data"] = record


# ---------------------------------------------------------------------------------------------- resuming
# A step count that no run reaches: anything beyond is a damaged or hand-made checkpoint.
MAX_ITER = 2 ** 53


# Past any loss, rate or clock a run records (1e15 seconds is 30 million years), and far enough
# from float64's largest that a chart's arithmetic on it cannot overflow.
LARGEST = 1e15


def finite(value, low=-LARGEST):
    """Whether value is a number (an int or a float, not a bool) from low up to LARGEST."""
    return type(value) in (int, float) and low <= value <= LARGEST


# What each kind of optimizer keeps for a parameter: the names of its state, each True when it has
# the parameter's shape and type, False for a number (a tensor of no dimension).
OPTIMIZER_STATE = {torch.optim.AdamW: {"exp_avg": True, "exp_avg_sq": True, "step": False},
                   gpt.Muon: {"momentum_buffer": True}}


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
                    and state[name].layout == torch.strided
                    and state[name].shape == shape and state[name].dtype == dtype):
                return False
    return True


def evaluations_fit(history):
    """Whether each evaluation has its step, its clock and learning rate, and its finite losses,
    which the report draws."""
    # A list, as the run appends to it.
    if type(history) is not list:
        return False
    return all(type(h["iter"]) is int and 0 <= h["iter"] < MAX_ITER and finite(h["seconds"], 0)
               and finite(h["lr"], 0) and finite(h["train"]) and finite(h["val"]) for h in history)


def evaluations(ckpt, path, advice):
    """The checkpoint's evaluations (its history), all a report needs of its training state."""
    try:
        if evaluations_fit(ckpt["history"]):
            return ckpt["history"]
    except (KeyError, TypeError, AttributeError, IndexError):
        pass
    raise ValueError(f"{path} has no evaluations a report can draw: it is damaged or hand-made; "
                     f"{advice}")


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
        raise ValueError(f"{wrong}: its iteration is {cli.shown(iteration)}; {advice}")
    if not finite(ckpt["elapsed"], 0):
        raise ValueError(f"{wrong}: its seconds of training are {cli.shown(ckpt['elapsed'])}; {advice}")
    try:
        saved = ckpt["optimizers"]
        fits = len(saved) == len(trainer.optimizers) and all(
            state_fits(optimizer, state) for optimizer, state in zip(trainer.optimizers, saved))
        fits = fits and evaluations_fit(ckpt["history"])
    except (KeyError, TypeError, AttributeError, IndexError):
        fits = False
    if not fits:
        raise ValueError(f"{wrong}: the optimizers' states or the evaluations; {advice}")
    unsound = unsound_state(saved)
    if unsound:
        raise ValueError(f"{path} holds an optimizer state that no step leaves ({unsound}): it is "
                         f"damaged or hand-made, and would turn the weights NaN; {advice}")


# The least value of each state that has one: a second moment is a mean of squares, and AdamW
# divides by 1 - beta ** step, 0 before the first step.
STATE_LOWEST = {"exp_avg_sq": 0, "step": 1}


def unsound_state(saved_optimizers):
    """What is wrong with optimizers' states that fit their model, or "": a value NaN or inf, or one
    below the least it can have."""
    for saved in saved_optimizers:
        for state in saved["state"].values():
            for name, value in state.items():
                if not value.isfinite().all():
                    return f"{name} holds NaN or inf"
                if name in STATE_LOWEST and (value < STATE_LOWEST[name]).any():
                    return f"{name} holds values below {STATE_LOWEST[name]}"
    return ""


def restore(trainer, ckpt):
    """Puts trainer where the checkpoint's run stood: each optimizer's state (AdamW's moments,
    Muon's momentum) comes back, while their hyperparameters (learning rate, weight decay, betas)
    stay this run's, as trainer.tc sets them; then the step, the clock, the evaluations and the
    random states."""
    for optimizer, saved in zip(trainer.optimizers, ckpt["optimizers"], strict=True):
        own = optimizer.state_dict()["param_groups"]
        optimizer.load_state_dict({"state": own_tensors(saved["state"]), "param_groups": own})
    trainer.it = ckpt["iter"]
    trainer.elapsed = ckpt["elapsed"]
    trainer.history = ckpt["history"]
    torch.set_rng_state(ckpt["rng"]["torch"])
    trainer.generator.set_state(ckpt["rng"]["batches"])


def own_tensors(states):
    """Optimizer states, each a dense tensor with memory of its own, as an optimizer keeps them: a
    hand-made one may spread one value over a tensor (stride 0, which the fused AdamW would overrun)
    or give several weights one memory (each one's step would write it). Only those are copied."""
    seen = set()
    owned = {}
    for i, kept in states.items():
        owned[i] = {}
        for name, value in kept.items():
            memory = value.untyped_storage().data_ptr()
            if memory in seen or not value.is_contiguous():
                value = value.clone(memory_format=torch.contiguous_format)
            seen.add(memory)
            owned[i][name] = value
    return owned


def resume(trainer, ckpt, path, advice="train without --resume"):
    """Checks the checkpoint's training state against trainer, then restores it; one line that
    ends with advice when it does not fit."""
    # A run of the old layout goes on in today's, its optimizers' states cut as its weights were.
    if ckpt.get(OLD_LAYOUT) and isinstance(ckpt.get("optimizers"), list):
        try:
            ckpt["optimizers"] = split_states(trainer, ckpt["optimizers"])
        except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError):
            pass
    check_resumable(ckpt, trainer, path, advice)
    try:
        restore(trainer, ckpt)
    except (RuntimeError, TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{path} holds a training state that does not fit its model "
                         f"({type(e).__name__}); {advice}") from None


def evaluation_pending(trainer):
    """Whether the run stopped after a step that evaluates and before its evaluation (a signal in
    that step, or during the evaluation): resuming runs it first, as the run would have, and a run
    stopped so in its last step has not ended: it ends then, with its report."""
    tc = trainer.tc
    due = trainer.it % tc.eval_interval == 0 or trainer.done()
    done = trainer.history and trainer.history[-1]["iter"] == trainer.it
    return trainer.it > 0 and due and not done


# ---------------------------------------------------------------------------------------------- out_dir
def check_out_dir(out_dir, resume=False, data_path=None):
    """What gpt.Trainer's own check of out_dir (made, and takes a file) cannot say: what stands where
    the folder, the checkpoint, its temporary file or the lock should be, by name, before the lock
    is taken in it, and a data_path that is one of the files the run writes there. "" (which only
    --resume passes) is refused: a resumed run goes on in its own folder, which holds its checkpoint
    (a mistyped one is refused, never made)."""
    if not out_dir:
        raise ValueError('--resume goes on in the folder of the run, and --out_dir "" names none: '
                         'give the --out_dir it was trained with')
    path = path_in(out_dir)
    if resume:
        need_checkpoint(path)
    try:
        os.makedirs(out_dir, exist_ok=True)
        report = os.path.join(out_dir, "report.html")
        # Found at the start, not when the run ends and writes its report.
        for name in (path, path + ".tmp", os.path.join(out_dir, "train.lock"), report):
            if os.path.isdir(name):
                target = report if name == report else path
                raise ValueError(f"cannot write {target} ({name} is a folder): remove it, or pass "
                                 f"--out_dir a writable folder")
        # The lock, a save or the report would write over the text, which would be lost.
        written = [path, path + ".tmp", os.path.join(out_dir, "train.lock"), report]
        clash = [name for name in written if data_path and one_file(data_path, name)]
        if clash:
            raise ValueError(f"--data {data_path} is {clash[0]}, a file this run writes: keep the data outside "
                             f"--out_dir, or pass another --out_dir")
        what = unsavable(path + ".tmp")
        if what:
            raise ValueError(f"cannot write {path} ({path}.tmp is {what}): remove it, or pass "
                             f"--out_dir a writable folder")
        # The lock is read and cut back to its holder's line: a pipe, a device or a link to
        # nothing there would hang the run or fail in words of its own.
        lock = os.path.join(out_dir, "train.lock")
        if os.path.lexists(lock) and not os.path.isfile(lock):
            raise ValueError(f"cannot lock {out_dir} ({lock} is there, and not a file): remove it, or "
                             f"pass --out_dir a writable folder")
        # A run cuts its lock back to its own line, and would cut the file elsewhere with it.
        if os.path.lexists(lock) and linked(lock):
            raise ValueError(f"cannot lock {out_dir} ({lock} is a link to a file elsewhere, or another "
                             f"name of one, as a copy made by cp -al holds): remove it, a run makes it anew")
    except OSError as e:
        # makedirs says only "File exists" of a file, a loop of links or a link to nothing where
        # the folder should be.
        reason = not_a_folder(out_dir) if isinstance(e, FileExistsError) else e.strerror
        raise ValueError(f"cannot write {path} ({reason}): pass --out_dir a writable folder") from None
    # os.makedirs calls itself once a folder it makes: a path of 1,000 folders to make is past Python's depth.
    except RecursionError:
        raise ValueError(f"cannot make {out_dir} (more folders to make than Python's os.makedirs goes "
                         f"down): make them first, or pass --out_dir a shallower folder") from None


def one_file(a, b):
    """Whether paths a and b both exist and name one file (through a link, or as two names of it)."""
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def unsavable(name):
    """What stands at name that a save cannot write through, or "": a save opens it for writing,
    where a pipe waits for a reader for ever, and a socket, a link to nothing or a loop of links
    fail the first save, after the steps before it. A device is let through (a full one fails the
    write as a full disk does)."""
    if not os.path.lexists(name):
        return ""
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return "a link to nothing, or a loop of links"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "a pipe or a socket"
    if stat.S_ISREG(mode) and linked(name):
        return "a link to a file elsewhere, which a save would write over"
    return ""


def linked(name):
    """Whether the file at name is also elsewhere: a link to it, or one of its several names. Opened
    for writing there, it would be written over where it also is (another run's checkpoint)."""
    return os.path.islink(name) or os.stat(name).st_nlink > 1


def check_new(path):
    """A new run would overwrite the checkpoint of an earlier one at path: refused."""
    if os.path.isfile(path):
        raise ValueError(f"{path} holds an earlier run, which this one would overwrite: continue it "
                         f"with --resume, or start anew in another --out_dir (or remove it)")


def not_a_folder(path):
    """What path, which is there, is instead of a folder: a loop of links, a link to nothing, or a
    file."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{path} is a loop of symbolic links"
        if e.errno == errno.ENOENT and os.path.islink(path):
            return f"{path} is a link to {os.readlink(path)}, which is not there"
    return f"{path} is there, and not a folder"


def write_failure(error):
    """The OSError behind a failed write, or None: error itself, or the one torch's writer met (a
    full disk, a file-size limit), which the RuntimeError it raises keeps as its context."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def remove_partial(out_dir):
    """Takes away the temporary file of a save that failed or was cut short (gpt.save_checkpoint
    leaves it): the checkpoint beside it is whole. Called while the lock is held."""
    tmp = path_in(out_dir) + ".tmp"
    if os.path.isfile(tmp) and not os.path.islink(tmp):
        with contextlib.suppress(OSError):
            os.remove(tmp)


def own_out_dir(out_dir):
    """Locks out_dir/train.lock for as long as this process lives, so that one run at a time trains
    there. The operating system releases the lock of a process that ends, a crashed one too."""
    try:
        import fcntl
    # Windows has no fcntl: runs there are not kept apart.
    except ImportError:
        return None
    path = os.path.join(out_dir, "train.lock")
    try:
        lock = open(path, "a+")
    # A folder there, but one this process may not write in.
    except OSError as e:
        raise ValueError(f"cannot write {path} ({e.strerror}): pass --out_dir a writable folder") from None
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

