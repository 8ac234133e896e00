"""Samples text from a trained GPT, printed as it is drawn: python sample.py --temperature 0.8. See --help."""
import math
import os
import sys

import torch

import gpt
import train

AT_LEAST_1 = train.number(int, lambda n: n >= 1, "at least 1")


def main(argv=None):
    parser = train.Parser(description="Sample text from out_dir/ckpt.pt, printed as it is drawn.")
    parser.add_argument("--out_dir", default="out", help="folder of ckpt.pt (default: %(default)s)")
    parser.add_argument("--start", default=None, help="prompt text, or FILE:path to read it from a file "
                                                      "(default: a newline, else the text's first character)")
    parser.add_argument("--num_samples", type=AT_LEAST_1, default=2, help="samples to draw (default: %(default)s)")
    parser.add_argument("--max_new_tokens", type=AT_LEAST_1, default=500,
                        help="characters per sample (default: %(default)s)")
    parser.add_argument("--temperature", type=train.number(float, lambda t: 0 <= t < math.inf, "a number >= 0"),
                        default=0.8,
                        help="below 1 is safer, above 1 wilder, 0 always takes the likeliest (default: %(default)s)")
    parser.add_argument("--top_k", type=AT_LEAST_1, default=None,
                        help="sample only from the k likeliest (default: all)")
    parser.add_argument("--top_p", type=train.number(float, lambda p: 0 < p <= 1, "in (0, 1]"), default=None,
                        help="sample only from the likeliest whose probability reaches p (default: all)")
    parser.add_argument("--seed", type=train.number(int, lambda s: 0 <= s < 2 ** 32, "in [0, 2**32)"), default=1337,
                        help="random seed (default: %(default)s)")
    parser.add_argument("--device", default="", help="cpu, cuda, cuda:N or mps (default: the best available)")
    args = parser.parse_args(argv)
    train.printable_stdout()
    try:
        device = gpt.get_device(args.device)
        model, tokenizer, _ = train.load(os.path.join(args.out_dir, "ckpt.pt"), device)
        start = train.default_prompt(tokenizer) if args.start is None else args.start
        if start.startswith("FILE:"):
            start = train.read_text(start[5:], "the prompt file", "--start FILE:path to")
        if not start:
            raise ValueError("--start is empty: give it a character or more, or leave it out for the default prompt")
        prompt = torch.tensor([tokenizer.encode(start)], dtype=torch.long, device=device)
        generator = torch.Generator(device).manual_seed(args.seed)
        for i in range(args.num_samples):
            tokens = model.stream(prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, generator)
            with gpt.autocast(device):
                first = next(tokens)  # the arguments are checked here, before anything is printed
                print(("" if i == 0 else "\n---------------\n") + start + tokenizer.decode(first[0].tolist()),
                      end="", flush=True)
                for token in tokens:
                    print(tokenizer.decode(token[0].tolist()), end="", flush=True)
        print(flush=True)
    except KeyboardInterrupt:  # stop sampling without a traceback
        print()
        sys.exit(130)
    except BrokenPipeError:
        train.end_quietly()
    except (ValueError, OSError, RuntimeError) as e:
        sys.exit(f"error: {train.one_line(e, 'sample on another --device, or from a smaller model')}")


if __name__ == "__main__":
    main()
