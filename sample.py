"""Samples text from a trained GPT: python sample.py --temperature 0.8. See python sample.py --help."""
import argparse
import os
import sys

import torch

import gpt


def main():
    parser = argparse.ArgumentParser(description="Sample text from out_dir/ckpt.pt, printed as it is drawn.")
    parser.add_argument("--out_dir", default="out", help="folder of ckpt.pt (default: %(default)s)")
    parser.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from a file "
                                                      "(default: a newline)")
    parser.add_argument("--num_samples", type=int, default=2, help="samples to draw (default: %(default)s)")
    parser.add_argument("--max_new_tokens", type=int, default=500, help="characters per sample (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="below 1 is safer, above 1 wilder, 0 always takes the likeliest (default: %(default)s)")
    parser.add_argument("--top_k", type=int, default=None, help="sample only from the k likeliest (default: all)")
    parser.add_argument("--top_p", type=float, default=None,
                        help="sample only from the likeliest whose probability reaches p (default: all)")
    parser.add_argument("--seed", type=int, default=1337, help="random seed (default: %(default)s)")
    parser.add_argument("--device", default="", help="cpu, cuda, cuda:N or mps (default: the best available)")
    args = parser.parse_args()
    try:
        device = gpt.get_device(args.device)
        model, tokenizer = gpt.load_checkpoint(os.path.join(args.out_dir, "ckpt.pt"), device)
        start = args.start
        if start.startswith("FILE:"):
            with open(start[5:], encoding="utf-8") as f:
                start = f.read()
        prompt = torch.tensor([tokenizer.encode(start)], dtype=torch.long, device=device)
        generator = torch.Generator(device).manual_seed(args.seed)
        for i in range(args.num_samples):
            tokens = model.stream(prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, generator)
            print(("" if i == 0 else "\n---------------\n") + start, end="", flush=True)
            with gpt.autocast(device):
                for token in tokens:
                    print(tokenizer.decode(token[0].tolist()), end="", flush=True)
        print()
    except KeyboardInterrupt:  # stop sampling without a traceback
        print()
        sys.exit(130)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
