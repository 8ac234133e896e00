"""GPT-2 in gpt.py's GPT: its weights, from a folder or the Hugging Face hub, and its tokenizer.

    model = gpt2.load("gpt2")                      # or a folder: config.json and model.safetensors
    tokenizer = gpt2.tokenizer()                   # tiktoken's, else transformers'
    model = gpt2.from_state_dict(state_dict)       # transformers' GPT2LMHeadModel.state_dict()

gpt.py's parameters carry GPT-2's own names (wte, wpe, h.0.attn.c_attn, ...), so nothing is renamed
on the way in; only GPT-2's Conv1D weights, stored (in, out), are turned to nn.Linear's (out, in).
Neither tiktoken, transformers nor huggingface_hub is a requirement: each is used when installed.
"""
import json
import math
import os
import struct

import torch

import cli
import gpt

# GPT-2's four sizes, as the Hugging Face hub names them.
SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
# The tensor types of a .safetensors file, by the names its header gives them.
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def from_state_dict(state_dict, n_head=None):
    """A gpt.GPT with GPT-2's block and weights, from the state dict of any GPT-2 size as
    transformers stores it: names with or without "transformer.", Conv1D weights (in, out), the
    output layer tied to the token embedding. The config comes from the tensors; the head count is
    n_embd // 64, as in all four sizes, unless given. Every tensor is used and every parameter
    filled, or a ValueError names the first one amiss (a shape amiss is torch's RuntimeError, which
    names it too)."""
    weights = {}
    for key, w in state_dict.items():
        # GPT-2's Conv1D layers store their weights (in, out); nn.Linear's are (out, in).
        conv1d = key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        # Older files also hold each layer's causal mask: a constant, which attention computes.
        if not key.endswith((".attn.bias", ".attn.masked_bias")):
            weights[key.removeprefix("transformer.")] = w.t() if conv1d else w
    if "wte.weight" not in weights or "wpe.weight" not in weights:
        raise ValueError("not GPT-2's weights: wte.weight or wpe.weight is missing")
    vocab_size, n_embd = weights["wte.weight"].shape
    n_layer = len({key.split(".")[1] for key in weights if key.startswith("h.")})
    config = gpt.GPTConfig(vocab_size=vocab_size, block_size=len(weights["wpe.weight"]),
                           n_layer=n_layer, n_head=n_head or n_embd // 64, n_embd=n_embd,
                           bias=True, norm="layernorm", pos="learned", mlp="gelu")
    model = gpt.GPT(config)
    # The output layer is the token embedding, tied, which some files hold a second time.
    weights["lm_head.weight"] = weights["wte.weight"]
    # assign: the tensors become the parameters, uncopied, so the weights are never held twice. A
    # transposed Conv1D weight keeps the file's (in, out) order in memory under nn.Linear's (out,
    # in) shape, which the one-row products of sampling read faster on a CPU (bench.py --profile
    # measures both orders).
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    model.lm_head.weight = model.wte.weight
    if unexpected:
        raise ValueError(f"not GPT-2's weights: {unexpected[0]} is not one of GPT-2's tensors")
    if missing:
        raise ValueError(f"not GPT-2's weights: {missing[0]} is missing")
    return model


def read_safetensors(path):
    """The tensors of a .safetensors file, read with torch alone. The format: 8 bytes, the header's
    length as a little-endian integer; the header, JSON, {name: {"dtype", "shape", "data_offsets":
    [begin, end]}} with offsets counted from the header's end; then the tensors' bytes."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        (header_size,) = struct.unpack("<Q", f.read(8).ljust(8, b"\xff"))
        if header_size > size - 8:
            raise ValueError(f"{path} is cut short, or not a .safetensors file: its header would end "
                             f"past its {size} bytes")
        header = json.loads(f.read(header_size))
        header.pop("__metadata__", None)
        tensors = {}
        for name, entry in header.items():
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            begin, end = entry["data_offsets"]
            nbytes = math.prod(entry["shape"]) * dtype.itemsize
            if end - begin != nbytes or 8 + header_size + end > size:
                raise ValueError(f"{path} is cut short or damaged: tensor {name} does not fit in it")
            f.seek(8 + header_size + begin)
            tensors[name] = torch.empty(entry["shape"], dtype=dtype)
            # torch.frombuffer needs a writable buffer, and one byte at least.
            if nbytes:
                data = bytearray(f.read(nbytes))
                tensors[name] = torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])
    return tensors


def folder_of(source):
    """The folder of GPT-2's files: source itself, or one of SIZES fetched through huggingface_hub
    when it is installed (into its cache, once)."""
    if os.path.isdir(source):
        return source
    if source not in SIZES:
        raise ValueError(f"--init_from {source}: no such folder, and not one of {', '.join(SIZES)}")
    try:
        import huggingface_hub
    except ImportError:
        raise ValueError(f"--init_from {source} downloads GPT-2 with huggingface_hub, which is not "
                         f"installed: pip install huggingface_hub, or pass the folder of a "
                         f"download (huggingface-cli download {source})") from None
    patterns = ["config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json"]
    try:
        return huggingface_hub.snapshot_download(f"openai-community/{source}", allow_patterns=patterns)
    except Exception as e:
        raise ValueError(f"could not download {source} ({type(e).__name__}: {str(e).strip()[:200]}); "
                         f"pass --init_from the folder of a download instead") from None


def load(source, device=""):
    """GPT-2's weights in a gpt.GPT in eval mode, on device, from source: a folder as transformers'
    save_pretrained or huggingface-cli download leaves it (config.json with model.safetensors or
    pytorch_model.bin), or a name of SIZES. Everything amiss is one line."""
    device = cli.usable_device(str(device))
    folder = folder_of(source)
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        safetensors = os.path.join(folder, "model.safetensors")
        if os.path.isfile(safetensors):
            weights = read_safetensors(safetensors)
        else:
            weights = torch.load(os.path.join(folder, "pytorch_model.bin"), map_location="cpu",
                                 weights_only=True)
        if config.get("model_type") != "gpt2":
            raise ValueError(f"its config.json is of a {config.get('model_type')!r} model, not gpt2")
        model = from_state_dict(weights, n_head=config["n_head"])
        # The tensors set the model; config.json must tell the same story.
        said = {"n_layer": config["n_layer"], "n_embd": config["n_embd"],
                "block_size": config["n_positions"], "vocab_size": config["vocab_size"]}
        differ = [f"{name} {value} (the tensors' {getattr(model.config, name)})"
                  for name, value in said.items() if value != getattr(model.config, name)]
        if differ:
            raise ValueError(f"its config.json disagrees with its weights: {', '.join(differ)}")
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"{folder} holds no GPT-2 this can load ({type(e).__name__}: {first}): pass "
                         f"--init_from a folder with config.json and model.safetensors") from None
    return model.to(device).eval()


class Tokenizer:
    """GPT-2's byte-level BPE, from tiktoken or from transformers, whichever is installed. It loads
    one on its first use, so that a run on ids already made needs neither. name is what a
    checkpoint records of it."""
    name = "gpt2"
    vocab_size = 50257

    def __init__(self, folder=None):
        self.folder = folder
        self.loaded = None

    def encode(self, text):
        return self.backend()[0](text)

    def decode(self, ids):
        return self.backend()[1](ids)

    def backend(self):
        """(encode, decode) of the library found, loaded once; one line if there is none."""
        if self.loaded is None:
            self.loaded = load_tokenizer(self.folder)
        return self.loaded


def tokenizer(folder=None):
    """GPT-2's tokenizer, loaded now (tiktoken's, else transformers', from folder when it holds the
    tokenizer's files), or a ValueError in one line that says what to install."""
    found = Tokenizer(folder)
    found.backend()
    return found


def load_tokenizer(folder=None):
    """(encode, decode) of GPT-2's tokenizer: tiktoken's, else transformers' (from folder when it
    holds the tokenizer's files, else from the hub)."""
    try:
        import tiktoken
    except ImportError:
        tiktoken = None
    if tiktoken is not None:
        try:
            encoding = tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise ValueError(f"tiktoken could not load GPT-2's tokenizer ({type(e).__name__}: "
                             f"{str(e).strip()[:200]})") from None
        return encoding.encode_ordinary, encoding.decode
    try:
        from transformers import GPT2TokenizerFast
    except ImportError:
        raise ValueError("GPT-2's tokens need tiktoken or transformers, and neither is installed: "
                         "pip install tiktoken") from None
    has_files = folder and os.path.isfile(os.path.join(folder, "vocab.json"))
    try:
        found = GPT2TokenizerFast.from_pretrained(folder if has_files else "gpt2")
    except Exception as e:
        raise ValueError(f"transformers could not load GPT-2's tokenizer ({type(e).__name__}: "
                         f"{str(e).strip()[:200]})") from None
    return found.encode, found.decode


def tokenizer_of(ckpt, chars_tokenizer, folder=None):
    """The tokenizer a checkpoint was trained with: its characters', GPT-2's, or None for one it
    only names (the user keeps theirs)."""
    if chars_tokenizer is not None:
        return chars_tokenizer
    if ckpt.get("tokenizer") == Tokenizer.name:
        return Tokenizer(folder)
    return None
