"""GPT-2 in gpt.py's GPT: its weights, from a folder or the Hugging Face hub, and its tokenizer.

    model = gpt2.load("gpt2")                      # or a folder: config.json and model.safetensors
    tokenizer = gpt2.tokenizer()                   # tiktoken's, else transformers'
    model = gpt2.from_state_dict(state_dict)       # transformers' GPT2LMHeadModel.state_dict()

gpt.py's parameters carry GPT-2's own names (wte, wpe, h.0.mlp.c_fc, ...), with one change: GPT-2's
c_attn, which computes the query, key and value side by side, is split on the way in into c_q, c_k
and c_v, a weight for each map. GPT-2's Conv1D weights, stored (in, out), are turned to nn.Linear's
(out, in).
Neither tiktoken, transformers nor huggingface_hub is a requirement: each is used when installed.
"""
import collections
import json
import math
import os
import pickle
import struct
import sys
import warnings

import torch

import cli
import data
import gpt

# What a file of weights that are not all finite numbers is refused with.
NOT_FINITE = "its weights hold NaN or inf (in float32): the file is damaged"
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
        if not isinstance(key, str):
            raise ValueError(f"its weights are named by {type(key).__name__} keys, not by names")
        # GPT-2's Conv1D layers store their weights (in, out); nn.Linear's are (out, in).
        conv1d = key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        # Older files also hold each layer's causal mask: a constant, which attention computes.
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        # A complex tensor would lose its imaginary part, an integer one train as no weight does.
        if not (w.is_floating_point() and w.layout == torch.strided):
            raise ValueError(f"{shown(key)} is not a dense tensor of real floats ({w.dtype}, {w.layout})")
        name = key.removeprefix("transformer.")
        # The same weight named with and without "transformer.", perhaps with two values: refused.
        if name in weights:
            raise ValueError(f"{name} comes twice, with and without transformer.")
        weights[name] = w.t() if conv1d else w
    # c_attn's output is q, k and v side by side: its rows once turned (out, in), and its bias, in
    # thirds.
    for key in [key for key in weights if ".attn.c_attn." in key]:
        layer, kind = key.split(".c_attn.")
        for name, part in zip(("c_q", "c_k", "c_v"), weights.pop(key).chunk(3)):
            if f"{layer}.{name}.{kind}" in weights:
                raise ValueError(f"{layer} holds both c_attn.{kind} and {name}.{kind}")
            weights[f"{layer}.{name}.{kind}"] = part
    # Each parameter dense, in its own memory, in float32, as training keeps them: a fused optimizer
    # steps a tensor as if it were dense (a view such as a third of c_attn turned moves wrong), the
    # saved moments keep a parameter's strides, and a half-precision file would train in half
    # precision into a checkpoint that no longer fits its model.
    weights = {key: w.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
               for key, w in weights.items()}
    if "wte.weight" not in weights or "wpe.weight" not in weights:
        raise ValueError("not GPT-2's weights: wte.weight or wpe.weight is missing")
    # A table of rows each: the model's sizes are read off them.
    for name in ("wte.weight", "wpe.weight"):
        if weights[name].ndim != 2:
            raise ValueError(f"not GPT-2's weights: {name} has the shape {tuple(weights[name].shape)}, not "
                             f"(rows, n_embd)")
    vocab_size, n_embd = weights["wte.weight"].shape
    n_layer = len({key.split(".")[1] for key in weights if key.startswith("h.")})
    config = gpt.GPTConfig(vocab_size=vocab_size, block_size=len(weights["wpe.weight"]),
                           n_layer=n_layer, n_head=n_head or n_embd // 64, n_embd=n_embd,
                           bias=True, norm="layernorm", pos="learned", mlp="gelu", tie_weights=True,
                           bigram=0)
    # The output layer is the token embedding, tied, which some files hold a second time.
    wte = weights["wte.weight"]
    head = weights.get("lm_head.weight", wte)
    if head is not wte and not (head.shape == wte.shape and torch.equal(head, wte)):
        # A NaN is unequal even to itself: said as what it is, not as a head untied.
        if not (head.isfinite().all() and wte.isfinite().all()):
            raise ValueError(NOT_FINITE)
        raise ValueError("lm_head.weight is not wte.weight, and GPT-2 ties the two")
    weights["lm_head.weight"] = weights["wte.weight"]
    # First where a model takes no memory: a small file's names and shapes may make a config of
    # gigabytes, refused there before any are taken.
    for device in ("meta", "cpu"):
        with torch.device(device):
            model = gpt.GPT(config)
        # assign: the copies above become the parameters, without a copy more.
        missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
        model.lm_head.weight = model.wte.weight
        if unexpected:
            raise ValueError(f"not GPT-2's weights: {unexpected[0]} is not one of GPT-2's tensors")
        if missing:
            raise ValueError(f"not GPT-2's weights: {missing[0]} is missing")
    return model


# The largest header a .safetensors file may have, by the format's own rule.
HEADER_LIMIT = 100_000_000
# GPT-2's config.json has a few hundred bytes, its tokenizer's files a few MB.
CONFIG_LIMIT = 1_000_000
TOKENIZER_LIMIT = 100_000_000


def unique_names(pairs):
    """json.loads' object_pairs_hook: a dict, refused when a name comes twice (JSON keeps the last)."""
    kept = dict(pairs)
    # Counted in one pass: a header may hold a million names.
    if len(kept) < len(pairs):
        counts = collections.Counter(name for name, _ in pairs)
        raise ValueError(f"the name {min(n for n, c in counts.items() if c > 1)!r} comes twice")
    return kept


def whole_number(text):
    """json.load's parse_int for config.json: int(text), with a number past the digits Python reads said
    as such (Python's own words advise sys.set_int_max_str_digits)."""
    try:
        return int(text)
    except ValueError:
        digits = len(text.lstrip("-"))
        largest = sys.get_int_max_str_digits()
        raise ValueError(f"its config.json holds a whole number of {digits:,} digits, past the {largest:,} "
                         f"Python reads") from None


def read_safetensors(path):
    """The tensors of a .safetensors file, read with torch alone. The format: 8 bytes, the header's
    length as a little-endian integer; the header, JSON, {name: {"dtype", "shape", "data_offsets":
    [begin, end]}} with offsets counted from the header's end; then the tensors' bytes, which must
    follow each other without a gap or an overlap and fill the rest of the file. Each rule broken
    is a ValueError of one line."""
    size = data.check_file(path, "GPT-2's weights", None)
    with open(path, "rb") as f:
        start = f.read(8)
        header_size = struct.unpack("<Q", start)[0] if len(start) == 8 else size
        if header_size > min(size - 8, HEADER_LIMIT):
            raise ValueError(f"{path} is cut short, or not a .safetensors file: its header would end "
                             f"past its {size:,} bytes, or pass the format's 100 MB")
        try:
            header = json.loads(f.read(header_size), object_pairs_hook=unique_names)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is damaged: its header is not JSON with unique names ({e})")
        if not isinstance(header, dict):
            raise ValueError(f"{path} is damaged: its header is not a JSON object")
        # The format's metadata: names to texts, of no use here.
        if not isinstance(header.pop("__metadata__", {}), dict):
            raise ValueError(f"{path} is damaged: its __metadata__ is not a JSON object")
        data_size = size - 8 - header_size
        spans = []
        for name, entry in header.items():
            spans.append((*tensor_span(path, name, entry, data_size), name))
        # Sorted by where they begin, each tensor's bytes start where the one before ends.
        spans.sort(key=lambda span: span[:2])
        end_before = 0
        for begin, end, dtype, shape, name in spans:
            if begin != end_before:
                where = "overlap the tensor before" if begin < end_before else "leave a gap after"
                raise ValueError(f"{path} is damaged: the bytes of tensor {name} {where} them")
            end_before = end
        if end_before != data_size:
            raise ValueError(f"{path} is cut short or damaged: its tensors end at byte "
                             f"{end_before:,} of its {data_size:,} bytes of data")
        tensors = {}
        for begin, end, dtype, shape, name in spans:
            f.seek(8 + header_size + begin)
            tensors[name] = torch.empty(shape, dtype=dtype)
            # torch.frombuffer needs a writable buffer, and one byte at least.
            if end > begin:
                raw = bytearray(f.read(end - begin))
                tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
    return tensors


def tensor_span(path, name, entry, data_size):
    """(begin, end, dtype, shape) of the tensor name of a .safetensors header, held to the format:
    a type it has, a shape of whole numbers, and a byte range inside the data whose length is the
    shape's size times the type's."""
    damaged = f"{path} is damaged: tensor {name}"
    if not isinstance(entry, dict):
        raise ValueError(f"{damaged} is described by {shown(entry)}, not a JSON object")
    kind = entry.get("dtype")
    # A str: a list or a dict would be no key to look up.
    if not (isinstance(kind, str) and kind in SAFETENSORS_DTYPES):
        raise ValueError(f"{path}: tensor {name} has the type {shown(kind)}, none this reads "
                         f"({', '.join(SAFETENSORS_DTYPES)})")
    dtype = SAFETENSORS_DTYPES[kind]
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    whole = isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int and n >= 0 for n in shape)
    # Bounded, so that a shape with a 0 in it cannot ask torch for strides it cannot count.
    if not (whole and math.prod(max(n, 1) for n in shape) < 2 ** 60):
        raise ValueError(f"{damaged} has the shape {shown(shape)}, not at most 8 whole numbers of a product "
                         f"below 2**60")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)):
        raise ValueError(f"{damaged} has the offsets {offsets!r}, not two whole numbers")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise ValueError(f"{damaged} lies at bytes {begin} to {end}, outside its {data_size:,} bytes "
                         f"of data")
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{damaged} has {end - begin:,} bytes for {math.prod(shape):,} values of "
                         f"{dtype.itemsize} bytes")
    return begin, end, dtype, shape


def folder_of(source):
    """The folder of GPT-2's files: source itself, or one of SIZES fetched through huggingface_hub
    when it is installed (into its cache, once)."""
    if os.path.isdir(source):
        return source
    if source not in SIZES:
        what = "there, and not a folder" if os.path.lexists(source) else "no such folder"
        raise ValueError(f"--init_from {source}: {what}, and not one of {', '.join(SIZES)}")
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


def config_size(config, name):
    """The number config.json gives for name, refused unless a whole number of at least 1 (not 2.0,
    null or true)."""
    value = config.get(name)
    if type(value) is not int or value < 1:
        raise ValueError(f"its config.json gives {name} = {shown(value)}, not a whole number of at least 1")
    return value


def shown(value):
    """value as config.json writes it, shortened as cli.shown shortens a value."""
    return cli.shown(value, json.dumps(value))


def read_weights(folder):
    """The state dict in folder's model.safetensors, else its pytorch_model.bin, read as tensors
    alone: a .bin that holds code or other objects is not loaded."""
    safetensors = os.path.join(folder, "model.safetensors")
    # lexists: a link to a missing file (a Hugging Face cache without its blob) or a loop of links
    # is the file meant, and check_file says what is wrong with it.
    if os.path.lexists(safetensors):
        return read_safetensors(safetensors)
    path = os.path.join(folder, "pytorch_model.bin")
    data.check_file(path, "GPT-2's weights", None)
    fault = data.zip_fault(path)
    if fault:
        raise ValueError(f"{path} is not loaded: {fault}")
    try:
        # A plain pickle brings warnings of torch's own: the one line below says all there is.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weights = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{path} holds code or objects, or is a plain pickle, not tensors as "
                         f"torch.save writes them, so it is not loaded") from None
    # What torch.load's unpickler says of a text, or of an empty file.
    except (EOFError, LookupError, ValueError, TypeError) as e:
        raise ValueError(f"{path} is no file torch.save writes ({type(e).__name__} reading it), so it is "
                         f"not loaded") from None
    if not (isinstance(weights, dict) and all(torch.is_tensor(w) for w in weights.values())):
        raise ValueError(f"{path} holds no state dict of tensors")
    return weights


# config.json's switches that change what a block computes, and the values of this model's block (tanh's GELU,
# LayerNorm's eps of 1e-5, scores over sqrt(head size) in every layer).
SAME_BLOCK = {"activation_function": ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate"),
              "layer_norm_epsilon": (1e-5,),
              "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,)}


def load(source, device=""):
    """GPT-2's weights in a gpt.GPT in eval mode, on device, from source: a folder as transformers'
    save_pretrained or huggingface-cli download leaves it (config.json with model.safetensors or
    pytorch_model.bin), or a name of SIZES. Its files are held to their formats, and everything
    amiss is one line."""
    device = gpt.get_device(str(device))
    folder = folder_of(source)
    try:
        path = os.path.join(folder, "config.json")
        data.check_file(path, "GPT-2's config", None, CONFIG_LIMIT)
        # utf-8-sig: an editor may have put a byte-order mark first.
        with open(path, encoding="utf-8-sig") as f:
            config = json.load(f, object_pairs_hook=unique_names, parse_int=whole_number)
        if not isinstance(config, dict):
            raise ValueError(f"its config.json holds a {type(config).__name__}, not an object of names")
        if config.get("model_type") != "gpt2":
            raise ValueError(f"its config.json is of a {shown(config.get('model_type'))} model, not gpt2")
        # The tensors set the model; config.json must tell the same story.
        keys = {"n_layer": "n_layer", "n_embd": "n_embd", "block_size": "n_positions",
                "vocab_size": "vocab_size"}
        said = {name: config_size(config, key) for name, key in keys.items()}
        other = [f"{key} {shown(config[key])}" for key, kept in SAME_BLOCK.items()
                 if key in config and config[key] not in kept]
        if other:
            raise ValueError(f"its config.json asks for another block than GPT-2's: {other[0]}")
        n_head = config_size(config, "n_head")
        model = from_state_dict(read_weights(folder), n_head=n_head)
        # In float32, as the model holds them: a float64 of 1e300 is inf there.
        if not all(w.isfinite().all() for w in model.parameters()):
            raise ValueError(NOT_FINITE)
        differ = [f"{name} {shown(value)} (the tensors' {getattr(model.config, name)})"
                  for name, value in said.items() if value != getattr(model.config, name)]
        if differ:
            raise ValueError(f"its config.json disagrees with its weights: {', '.join(differ)}")
    except Exception as e:
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [""]
        first = lines[0]
        # A state dict's error says on its second line which weight does not fit.
        if first.endswith(":") and len(lines) > 1:
            first = f"{first} {lines[1][:200]}"
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
    """GPT-2's tokenizer, loaded now: tiktoken's, else transformers' from folder's files or its own
    cache; or a ValueError of one line that says what to install or fetch."""
    found = Tokenizer(folder)
    found.backend()
    return found


def load_tokenizer(folder=None):
    """(encode, decode) of GPT-2's tokenizer: tiktoken's, else transformers', from the files in
    folder or else in transformers' cache. Nothing is downloaded that was not asked for: a name
    given to gpt2.load (or --init_from) fetches the tokenizer's files with the weights."""
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
        return checked(encoding.encode_ordinary, encoding.decode, "tiktoken's")
    try:
        from transformers import GPT2TokenizerFast
    except ImportError:
        raise ValueError("GPT-2's tokens need tiktoken or transformers, and neither is installed: "
                         "pip install tiktoken") from None
    files = [os.path.join(folder or "", name) for name in ("vocab.json", "merges.txt")]
    has_files = folder is not None and all(os.path.lexists(path) for path in files)
    for path in files if has_files else []:
        data.check_file(path, "GPT-2's tokenizer", None, TOKENIZER_LIMIT)
    where = folder if has_files else "transformers' cache"
    try:
        found = GPT2TokenizerFast.from_pretrained(folder if has_files else "gpt2",
                                                  local_files_only=True)
    except Exception as e:
        if has_files:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise ValueError(f"GPT-2's tokenizer files in {folder} (vocab.json, merges.txt) could not "
                             f"be read ({type(e).__name__}: {first}): they are damaged; fetch them "
                             f"again with huggingface-cli download gpt2 vocab.json merges.txt") from None
        raise ValueError(f"GPT-2's tokenizer files (vocab.json, merges.txt) are not in {where}: pip "
                         f"install tiktoken, or fetch them with huggingface-cli download gpt2 "
                         f"vocab.json merges.txt") from None
    return checked(found.encode, found.decode, f"transformers' from {where}")


def checked(encode, decode, which):
    """(encode, decode), refused in one line when encode turns a text into nothing, as a tokenizer
    whose files are missing can."""
    if not encode("To be, or not to be"):
        raise ValueError(f"GPT-2's tokenizer ({which}) encodes text to nothing: its files "
                         f"(vocab.json, merges.txt) are missing or empty")
    return encode, decode

