"""Trains a GPT on a text file: python train.py [--option value ...]. See python train.py --help.

Runs data-parallel too: torchrun --standalone --nproc_per_node=N train.py [...]
"""
import argparse
import dataclasses
import os
import sys

import gpt

HELP = {
    "data": "training text; its last 10%% is held out for validation",
    "out_dir": "folder of ckpt.pt, the checkpoint",
    "resume": "continue from out_dir/ckpt.pt; its model and characters are kept, training options come from here",
    "max_iters": "optimizer steps in all",
    "max_time": "train for this many seconds of wall time instead of max_iters (0: off); the learning rate then "
                "decays over time",
    "eval_interval": "evaluate and save every this many steps",
    "eval_iters": "batches per evaluation",
    "log_interval": "print progress every this many steps",
    "batch_size": "sequences per micro-batch (per process under torchrun)",
    "grad_accum": "micro-batches per optimizer step",
    "block_size": "context length in characters",
    "n_layer": "transformer blocks",
    "n_head": "attention heads",
    "n_embd": "width of the residual stream",
    "dropout": "dropout probability",
    "bias": "biases in linear layers and LayerNorm",
    "tie_weights": "share the token embedding with the output layer",
    "norm": "layernorm or rmsnorm",
    "pos": "learned (positions as embeddings) or rope (rotary)",
    "mlp": "gelu or swiglu",
    "learning_rate": "peak learning rate",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup_iters": "steps of linear warmup",
    "weight_decay": "AdamW weight decay, on matrices only",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the gradient norm to this (0: off)",
    "seed": "random seed",
    "device": "cpu, cuda, cuda:N or mps",
    "compile": "torch.compile the model",
}


def parse_bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main():
    parser = argparse.ArgumentParser(description="Train a character-level GPT; writes out_dir/ckpt.pt.")
    cpu = gpt.TrainConfig()
    for field in dataclasses.fields(gpt.TrainConfig):
        default = getattr(cpu, field.name)
        shown = repr(default) if default != "" else "the best available"
        if field.name in gpt.CUDA_DEFAULTS:
            shown += f", on CUDA {gpt.CUDA_DEFAULTS[field.name]!r}"
        kind = {bool: dict(type=parse_bool, nargs="?", const=True, metavar="BOOL")}.get(field.type, dict(type=field.type))
        parser.add_argument(f"--{field.name}", default=None, help=f"{HELP[field.name]} (default: {shown})", **kind)
    given = {name: value for name, value in vars(parser.parse_args()).items() if value is not None}
    try:
        device = gpt.get_device(given.get("device", ""))
        defaults = gpt.CUDA_DEFAULTS if device.type == "cuda" else {}
        gpt.train(gpt.TrainConfig(**{**defaults, **given}))
    except KeyboardInterrupt:  # outside the training loop, which saves and returns on its own
        sys.exit(130)
    except (ValueError, OSError) as e:
        # Under torchrun every process meets the same error; one line of it is enough.
        sys.exit(f"error: {e}" if os.environ.get("RANK", "0") == "0" else 1)


if __name__ == "__main__":
    main()
