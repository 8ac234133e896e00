"""Reading the data a run trains on: a UTF-8 text of any size as one token per character, or a file
of token ids (nanoGPT's train.bin), each checked where it arrives so that bad data is refused in one
line before anything is built. Also the checks of a file from outside that checkpoint.py and gpt2.py
share: a regular file (check_file), and a zip file as torch.save writes one (zip_fault)."""
import codecs
import hashlib
import os
import stat
import sys
import zipfile
from dataclasses import dataclass, fields

import numpy as np

import gpt

# The largest vocabulary a run may build, the last gpt.GPTConfig's rule of vocab_size takes: an id
# of 2**32 - 1 would otherwise ask for an embedding of billions of rows.
MAX_VOCAB = next(f for f in fields(gpt.GPTConfig) if f.name == "vocab_size").metadata["max"]


# ---------------------------------------------------------------------------------------------- input
def check_file(path, what, flag, largest=None):
    """The size of the file at path, which every file the project reads from outside passes first:
    refused in one line if it is missing, not a regular file (a folder; a device or a pipe, which
    could be read forever or block for good) or, when largest is given, larger than that."""
    # The advice: pass the flag another file; none for a file inside a folder given (GPT-2's).
    advice = f": pass {flag} a file" if flag else ""
    try:
        found = os.stat(path)
    except OSError as e:
        raise ValueError(f"cannot read {what} {path} ({e.strerror}){advice}") from None
    if not stat.S_ISREG(found.st_mode):
        reason = "it is a folder" if stat.S_ISDIR(found.st_mode) else "it is not a regular file"
        raise ValueError(f"cannot read {what} {path} ({reason}){advice}")
    if largest is not None and found.st_size > largest:
        raise ValueError(f"cannot read {what} {path} (it has {found.st_size:,} bytes, more than the "
                         f"{largest:,} such a file can have){advice}")
    return found.st_size


def read_text(path, what="the data file", flag="--data"):
    """The UTF-8 text at path, whole, or one line that says why not and how to fix it."""
    check_file(path, what, flag)
    try:
        # Its line ends as they are, as a text to train on is read: a CRLF text keeps its "\r".
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {what} {path} ({reason}): pass {flag} a UTF-8 text file") from None
    except MemoryError:
        raise ValueError(f"{what} {path} is more than this machine's memory holds: pass {flag} a smaller "
                         f"text") from None
    if not text:
        raise ValueError(f"{what} {path} is empty: pass {flag} a text with something in it")
    if "\0" in text:
        raise ValueError(binary(what, path, flag))
    return text


def binary(what, path, flag):
    """The refusal of a file with NUL bytes: a text never holds them, binary data does. --data also
    reads token ids."""
    ids = ", or token ids in a file whose name ends in .bin" if flag == "--data" else ""
    return f"{what} {path} holds NUL bytes, so it is binary data, not a text: pass {flag} a UTF-8 text{ids}"


# What a refused text's characters advise on --resume.
RESUME_ADVICE = "use the text it was trained on (--data), or train without --resume"


# UTF-8 read and decoded at a time: a text of any size needs the memory of one chunk beside its ids.
CHUNK = 1 << 25


def zip_fault(path):
    """What is wrong with the zip file at path as torch.save writes one, or None. A record that is
    compressed (torch.save stores each whole: it is hand-made, and could unpack to far more memory
    than the file holds), or one whose checksum fails (torch.load reads none). None too for a file
    that is no whole zip file (torch's older format, or one cut short), which torch.load then reads
    or refuses."""
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return None
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            packed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
            if packed:
                return (f"its record {packed[0]!r} is compressed, which torch.save never does: it is "
                        f"hand-made, and could unpack to far more memory than the file's size")
            # torch.serialization.set_crc32_options(False) writes every checksum as 0: none to check.
            if not any(r.CRC for r in records):
                return None
            damaged = archive.testzip()
    except zipfile.BadZipFile:
        return None
    return None if damaged is None else f"its record {damaged!r} fails its checksum: the file is damaged"


def text_chunks(path):
    """The UTF-8 text at path, as strings of about CHUNK characters: never the whole text at once."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK)
            text = decoder.decode(data, final=not data)
            if text:
                yield text
            if not data:
                return


def code_points(text):
    """The characters of text as a NumPy array of their Unicode numbers, (len(text),): no Python
    object per character."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def smallest_dtype(vocab_size):
    """The smallest unsigned NumPy type that holds every id below vocab_size: uint8 up to 256."""
    return next(np.dtype(t) for t in ("u1", "u2", "u4") if vocab_size <= np.iinfo(t).max + 1)


def encode_file(path, chars=None, what="the data file", flag="--data", advice=RESUME_ADVICE):
    """(ids, chars): the UTF-8 text at path as one token per character, a NumPy array of the
    smallest unsigned type that fits, and its vocabulary: the text's own distinct characters, or
    chars, when given (a checkpoint's), which must hold every character of the text.

    It reads the text twice, a chunk at a time: once to find its characters, once to map them to
    ids through a table indexed by Unicode number. The memory it needs is the ids' and one chunk's.
    A text changed between the two readings is refused, never trained on as a mix of both.
    """
    check_file(path, what, flag)
    changed = f"{what} {path} changed while it was read: pass {flag} a text that stays as it is"
    try:
        before = os.stat(path)
        seen = np.zeros(sys.maxunicode + 1, dtype=bool)
        length = 0
        for text in text_chunks(path):
            seen[code_points(text)] = True
            length += len(text)
            # At the first chunk that has one: a file of gigabytes of zeros is refused at once.
            if seen[0]:
                raise ValueError(binary(what, path, flag))
        found = "".join(map(chr, np.flatnonzero(seen)))
        if len(found) > MAX_VOCAB:
            raise ValueError(f"{what} {path} has {len(found):,} distinct characters, more than the "
                             f"{MAX_VOCAB:,} a run's vocabulary may hold: pass {flag} a text of fewer")
        unknown = "".join(sorted(set(found) - set(chars))) if chars is not None else ""
        if unknown:
            raise ValueError(f"{what} {path} has characters the checkpoint never saw ({unknown!r}): "
                             f"{advice}")
        chars = found if chars is None else chars
        table = np.zeros(sys.maxunicode + 1, dtype=smallest_dtype(len(chars)))
        table[code_points(chars)] = np.arange(len(chars))
        ids = np.empty(length, dtype=table.dtype)
        start = 0
        for text in text_chunks(path):
            points = code_points(text)
            # A character not found the first time would become id 0; more text would not fit.
            if start + len(text) > length or not seen[points].all():
                raise ValueError(changed)
            ids[start:start + len(text)] = table[points]
            start += len(text)
        after = os.stat(path)
        if start != length or (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise ValueError(changed)
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {what} {path} ({reason}): pass {flag} a UTF-8 text file") from None
    if not length:
        raise ValueError(f"{what} {path} is empty: pass {flag} a text with something in it")
    return ids, chars


# The types a file of token ids may hold (--dtype), as NumPy names them.
ID_DTYPES = ("uint8", "uint16", "uint32", "int32", "int64")


def read_ids(path, dtype="uint16", flag="--data"):
    """The token ids in the file at path, raw little-endian integers of dtype one after another
    (nanoGPT's train.bin), as a read-only np.memmap: they stay on disk until a batch reads them."""
    check_file(path, "the file of token ids", flag)
    itemsize = np.dtype(dtype).itemsize
    size = os.path.getsize(path)
    if not size or size % itemsize:
        raise ValueError(f"{path} has {size} bytes, not a whole number of {dtype} ids, one at least: "
                         f"pass --dtype the type its ids were written in")
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")


@dataclass
class DataFile:
    """--data as the command line gives it: read by each process as it sets itself up."""
    path: str
    # None: not given, uint16 for a file of ids; given with a text, it is refused, never dropped.
    dtype: str = None
    # False: --data left out, this its default; a resumed run then takes no other file in silence.
    named: bool = True


# The bytes a file's fingerprint reads at each end: cheap at any size.
FINGERPRINT_BYTES = 1 << 20


def describe(data):
    """What a run's data is, for its checkpoint: how it is read ("text", or its ids' type) and, of a
    file, its size and a fingerprint of its first and last MB: enough to know the same file again."""
    if not isinstance(data, DataFile):
        return {"read_as": "text" if isinstance(data, str) else str(np.asarray(data[:0]).dtype)}
    read_as = (data.dtype or "uint16") if is_ids(data) else "text"
    return {"read_as": read_as, "bytes": os.path.getsize(data.path), "fingerprint": fingerprint(data.path)}


def fingerprint(path):
    """A hash of the first and last FINGERPRINT_BYTES of the file at path, and of its size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(FINGERPRINT_BYTES)
        f.seek(max(0, size - FINGERPRINT_BYTES))
        tail = f.read(FINGERPRINT_BYTES)
    return hashlib.blake2b(str(size).encode() + head + tail, digest_size=16).hexdigest()


def read_data(data, tokenizer=None, advice=RESUME_ADVICE):
    """(data, tokenizer) for gpt.Trainer, from a DataFile, a text or token ids. tokenizer, when
    given, is the run's (a checkpoint's, or GPT-2's) and stays the run's whatever the data: a text
    is read with it (a CharTokenizer's characters, GPT-2's tokens). Without one, a text is one
    token per character of its own. A .bin file is token ids, which stay on disk. advice ends the
    refusal of characters the tokenizer does not have."""
    if is_ids(data):
        ids = read_ids(data.path, data.dtype or "uint16") if isinstance(data, DataFile) else data
        return ids, tokenizer
    if isinstance(data, DataFile) and data.dtype is not None:
        raise ValueError(f"--dtype {data.dtype} is for token ids, and {data.path} is read as a text "
                         f"(only a name ending in .bin holds ids): leave out --dtype, or give the "
                         f"file of ids a name that ends in .bin")
    chars = getattr(tokenizer, "chars", None)
    if tokenizer is not None and chars is None:
        text = read_text(data.path) if isinstance(data, DataFile) else data
        ids = tokenizer.encode(text)
        return np.array(ids, dtype=smallest_dtype(tokenizer.vocab_size)), tokenizer
    if isinstance(data, DataFile):
        ids, chars = encode_file(data.path, chars, advice=advice)
        return ids, gpt.CharTokenizer(chars)
    unknown = "".join(sorted(set(data) - set(chars or data)))
    if unknown:
        raise ValueError(f"the text has characters the checkpoint never saw ({unknown!r}): {advice}")
    return data, gpt.CharTokenizer(chars or data)


def implied_vocab_size(ids):
    """The vocabulary token ids imply, their largest + 1, refused in one line beyond MAX_VOCAB."""
    largest = int(ids.max())
    if largest < 0:
        raise ValueError(f"every token id is negative (the largest is {largest:,}), and ids count from 0: "
                         f"check --dtype, or the file")
    if largest >= MAX_VOCAB:
        raise ValueError(f"the largest token id, {largest:,}, implies a vocabulary of {largest + 1:,}, "
                         f"beyond the {MAX_VOCAB:,} a run may build: check --dtype, or the file")
    return largest + 1


def check_ids(ids, vocab_size):
    """Token ids, refused in one line unless each is in [0, vocab_size): an id beyond the model's
    embedding would end training in an IndexError (on a GPU, a device-side assert)."""
    low = int(ids.min())
    high = int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"token ids must be in [0, {vocab_size}), the vocabulary; these go from {low:,} "
                         f"to {high:,}: check --dtype, or train a new run with --vocab_size above the largest")


def is_ids(data):
    """Whether data is token ids, not a text: a .bin file, or an array or tensor of them."""
    if isinstance(data, DataFile):
        return data.path.lower().endswith(".bin")
    return not isinstance(data, str)


def check_block_size(block_size, data):
    """A block_size beyond the held-out tokens is refused, by its flag's name, before anything is
    built."""
    held_out = len(gpt.split(data)["val"])
    # With 2 tokens or more held out, a shorter context fits too.
    shorter = ", or lower --block_size" if held_out > 1 else ""
    if block_size >= held_out:
        raise ValueError(f"--block_size {block_size} is too long for the {held_out} tokens held out "
                         f"for validation (the last 10% of --data): give {10 * block_size + 1:,} "
                         f"tokens or more{shorter}")


def check_fits(ids, vocab_size, block_size):
    """Data a model of vocab_size and a context of block_size can train on and be evaluated on: a
    text read here is ids of its own characters; token ids from elsewhere are checked."""
    check_block_size(block_size, ids)
    if not isinstance(ids, str):
        check_ids(ids, vocab_size)
