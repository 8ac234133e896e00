"""Samples text from a trained GPT, printed as it is drawn: python sample.py --temperature 0.8.

    python sample.py --init_from gpt2 --start "..."   # GPT-2 itself (needs tiktoken or transformers)
    python sample.py --report --data input.txt        # writes out_dir/report.html again
See --help for every option.
"""
import sys

try:
    import atexit
    import itertools
    import math
    import os
    import shlex
    import signal

    # NumPy before torch: a Ctrl-C inside torch's own import of it is swallowed, or breaks it.
    import numpy
    import torch

    import checkpoint
    import cli
    import data
    import gpt
    import gpt2
    import report
# Ctrl-C while torch is still importing: nothing has started, so nothing is lost.
except KeyboardInterrupt:
    sys.exit(130)

# A temperature past float32's largest (inf among them) would flatten every distribution to a
# uniform draw, or to NaN: no use, and a slip.
TEMPERATURE = cli.number(float, lambda t: 0 <= t <= torch.finfo(torch.float32).max,
                         "a number from 0 to 3.4e38, float32's largest")


# What a sample is drawn with where its flag is not given.
SAMPLING = dict(num_samples=2, max_new_tokens=500, temperature=0.8, seed=cli.FIELDS["seed"].default)


def parse_args(argv=None):
    parser = cli.Parser(description="Sample text from out_dir/ckpt.pt (or GPT-2), printed as it is "
                                    "drawn; or write its report page.")
    parser.add_argument("--out_dir", help="folder of ckpt.pt (default: out)")
    parser.add_argument("--init_from", metavar="GPT2", type=cli.not_empty("a folder, or a name such as gpt2"),
                        help="sample GPT-2 instead: a folder with config.json and model.safetensors, "
                             "or gpt2, gpt2-medium, gpt2-large or gpt2-xl (downloaded with "
                             "huggingface_hub)")
    parser.add_argument("--start", default=None,
                        help="prompt text, or FILE:path to read it from a file (default: a newline, "
                             "else the vocabulary's first token)")
    parser.add_argument("--num_samples", type=cli.AT_LEAST_1,
                        help=f"samples to draw (default: {SAMPLING['num_samples']})")
    parser.add_argument("--max_new_tokens", type=cli.AT_LEAST_1,
                        help=f"tokens per sample: characters, for a character model (default: "
                             f"{SAMPLING['max_new_tokens']})")
    # The sampling arguments' limits are gpt.GPT.stream's, which refuses what they do not take.
    parser.add_argument("--temperature", type=TEMPERATURE,
                        help=f"below 1 is safer, above 1 wilder, 0 always takes the likeliest (default: "
                             f"{SAMPLING['temperature']})")
    parser.add_argument("--top_k", type=int, default=None,
                        help="sample only from the k likeliest (default: all)")
    parser.add_argument("--top_p", type=float, default=None,
                        help="sample only from the likeliest whose probability reaches p (default: all)")
    # The seed and the device take what training's do.
    rule = cli.option_rule("seed")
    parser.add_argument("--seed", **{**rule, "help": f"seed of the draws: the same seed and options draw the "
                                                     f"same samples (default: {SAMPLING['seed']})"})
    rule = cli.option_rule("device")
    parser.add_argument("--device", default="", **{**rule, "help": f"{rule['help']} (default: '')"})
    parser.add_argument("--report", action="store_true",
                        help="instead: write out_dir/report.html from the checkpoint and --data")
    parser.add_argument("--data", type=cli.not_empty("a file"),
                        help="for --report, which needs it: the text (or .bin of token ids) the "
                             "checkpoint was trained on, whose last 10%% is held out")
    parser.add_argument("--dtype", choices=data.ID_DTYPES,
                        help="for --report on a .bin --data: its ids' type (default: uint16)")
    args = parser.parse_args(argv)
    given = [f"--{name}" for name in ("start", *SAMPLING, "top_k", "top_p") if getattr(args, name) is not None]
    # The report draws its own sample, the same each time: options of another are refused, never dropped.
    if args.report and given:
        parser.error(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for sampling, and --report draws "
                     f"its own sample (temperature 0.8, seed 0): leave {'it' if len(given) == 1 else 'them'} out, "
                     f"or sample without --report")
    # Each names the model to sample: one of them would be dropped without a word.
    if args.init_from is not None and args.out_dir is not None and not args.report:
        parser.error("--out_dir names a run's checkpoint to sample, and --init_from GPT-2's weights: give one "
                     "of them")
    args.out_dir = "out" if args.out_dir is None else args.out_dir
    for name, default in SAMPLING.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def typed(text):
    """A command line's text as typed. Bytes the locale did not read (all but ASCII under LC_ALL=C
    with PYTHONUTF8=0; bytes that are no UTF-8 under a UTF-8 locale) reach Python as surrogates,
    which give the bytes back: read as UTF-8, or refused."""
    if not any("\udc80" <= c <= "\udcff" for c in text):
        return text
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeError as e:
        raise ValueError(f"--start is not UTF-8 text (its bytes from byte {e.start + 1} are no character): "
                         f"give it UTF-8, or a file of it, --start FILE:path") from None


def encode_prompt(tokenizer, start):
    """The prompt's ids; for a character model, one line naming the characters it never saw."""
    unknown = "".join(sorted(set(start) - set(tokenizer.chars))) if hasattr(tokenizer, "chars") else ""
    if unknown:
        raise ValueError(f"characters not in the vocabulary: {unknown!r}; use those of the training text")
    return tokenizer.encode(start)


def draw_below(model, n):
    """Makes model draw only ids below n, those GPT-2's tokenizer reads: a vocabulary padded past it
    (nanoGPT pads 50,257 to 50,304) gets logits of -inf there. One of fewer, which would take a
    prompt's ids it has no row for, is refused."""
    V = model.config.vocab_size
    if V < n:
        raise ValueError(f"the model has a vocabulary of {V:,} tokens, fewer than GPT-2's tokenizer's "
                         f"{n:,}: sample it from Python on ids below {V:,} (model.generate)")
    if V > n:
        padded = torch.arange(n, V, device=model.lm_head.weight.device)
        model.lm_head.register_forward_hook(lambda module, args, logits: logits.index_fill(-1, padded, -math.inf))


# The most tokens held back while their text ends inside a character: a few bytes' worth.
HELD_BACK = 8


def print_samples(model, tokenizer, start, args, device):
    """Streams num_samples samples after start. Each token's text is printed as soon as it is whole,
    at the same cost per token at any length: one of GPT-2's tokens may end inside a character's
    UTF-8 bytes, which the next one completes, so such tokens wait for it."""
    prompt = torch.tensor([encode_prompt(tokenizer, start)], dtype=torch.long, device=device)
    generator = torch.Generator(device).manual_seed(args.seed)
    for i in range(args.num_samples):
        tokens = model.stream(prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                              generator)
        with report.sampling_autocast(device):
            # The arguments are checked here, before anything is printed.
            first = next(tokens)
            # Controls are shown as escapes, never sent (a checkpoint's characters may hold any).
            print(("" if i == 0 else "\n---------------\n") + report.visible(start), end="", flush=True)
            # The tokens drawn and not yet printed.
            waiting = []
            for token in itertools.chain([first], tokens):
                waiting += token[0].tolist()
                text = tokenizer.decode(waiting)
                if not text.endswith("\ufffd") or len(waiting) >= HELD_BACK:
                    print(report.visible(text), end="", flush=True)
                    waiting = []
            print(report.visible(tokenizer.decode(waiting)), end="", flush=True)
    print(flush=True)


def write_report(model, tokenizer, ckpt, path, args, device):
    """Rebuilds the report of the run that wrote the checkpoint at path, on --data's held-out part,
    with the checks train.py holds the data to: its model, tokenizer, evaluations and options are
    all it needs."""
    advice = "it can still sample, without --report"
    if args.data is None:
        raise ValueError("--report evaluates the model on the text it was trained on: give that "
                         "text, or its .bin of token ids, with --data")
    tc = checkpoint.recorded_config(ckpt, path, model.config, device, advice)
    history = checkpoint.evaluations(ckpt, path, advice)
    if not history:
        raise ValueError(f"{path} holds no evaluation yet: its run evaluates every eval_interval steps; go "
                         f"on with python train.py --resume --out_dir {shlex.quote(args.out_dir)} --data "
                         f"{shlex.quote(args.data)}")
    if not data.is_ids(data.DataFile(args.data)):
        checkpoint.needs_tokenizer(tokenizer, path, ": give --data its .bin of token ids")
    data_file = checkpoint.data_as_recorded(ckpt, data.DataFile(args.data, args.dtype), path, advice, its_own=True)
    ids, tokenizer = data.read_data(data_file, tokenizer, advice="give --data the text it was trained on")
    data.check_fits(ids, tc.vocab_size, tc.block_size)
    figures = dict(tokens_per_step=tc.batch_size * tc.block_size * tc.grad_accum, processes=1)
    try:
        page = report.make(model, tokenizer, history, gpt.split(ids)["val"], tc, args.out_dir, figures,
                           log=lambda *a: None)
    except OSError as e:
        raise ValueError(f"{e.strerror}; the checkpoint is as it was") from None
    print(f"wrote {report.visible(page)}: open it in a browser")


def main(argv=None):
    # A Ctrl-C (a second, after a first) while Python shuts the process down would break into
    # torch's exit hooks with a traceback. Registered last, this runs first of them, and only as
    # the interpreter ends: a caller that goes on keeps its Ctrl-C.
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
    args = parse_args(argv)
    # Started with its output closed (python sample.py >&-), print() would print nothing, silently.
    if sys.stdout is None and not args.report:
        sys.exit("error: standard output is closed, so the samples have nowhere to go: run sample.py "
                 "with its output open (to a file: > samples.txt)")
    cli.printable_stdout()
    try:
        # Options that cannot apply are refused, never dropped.
        if not args.report and (args.data or args.dtype):
            raise ValueError("--data and --dtype are for --report, which evaluates the model on its "
                             "text: give --report, or leave them out to sample")
        device = cli.usable_device(args.device)
        path = checkpoint.path_in(args.out_dir)
        ckpt = {}
        if args.init_from:
            if args.report:
                raise ValueError("--report needs a checkpoint of a run: leave out --init_from")
            model = gpt2.load(args.init_from, device)
            tokenizer = gpt2.Tokenizer(gpt2.folder_of(args.init_from))
        else:
            model, tokenizer, ckpt = checkpoint.load(path, device)
        if args.report:
            return write_report(model, tokenizer, ckpt, path, args, device)
        if isinstance(tokenizer, gpt2.Tokenizer):
            draw_below(model, tokenizer.vocab_size)
        checkpoint.needs_tokenizer(tokenizer, path, ", so it cannot be decoded here: sample it from "
                                   "Python with your tokenizer (the README shows how)")
        start = tokenizer.decode(report.default_prompt(tokenizer)) if args.start is None else args.start
        if start == "FILE:":
            raise ValueError("--start FILE: names no file: give --start FILE:path, the path of a text")
        if start.startswith("FILE:"):
            start = data.read_text(start[5:], "the prompt file", "--start FILE:path to")
        else:
            start = typed(start)
        if not start:
            raise ValueError("--start is empty: give it a character or more, or leave it out for the "
                             "default prompt")
        print_samples(model, tokenizer, start, args, device)
    # Stop sampling without a traceback.
    except KeyboardInterrupt:
        print()
        sys.exit(130)
    except BrokenPipeError:
        cli.end_quietly()
    except (ValueError, OSError, RuntimeError, MemoryError) as e:
        cli.fail(cli.one_line(e, "sample on another --device, or from a smaller model"))


if __name__ == "__main__":
    main()
