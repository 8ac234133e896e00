"""Tests of reading texts and token ids into a run."""
import io
import os
import re
import time

import numpy as np
import pytest
import torch

import data
import gpt
import sample
import train
from conftest import TEXT, tiny_flags, one_line_error


def test_a_text_is_encoded_a_chunk_at_a_time_with_the_ids_of_its_characters(tmp_path, monkeypatch):
    text = TEXT[:5000] + "\u00e9\u4e00\U0001f600" * 7  # characters of two, three and four UTF-8 bytes
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(data, "CHUNK", 1001)  # chunks that cut characters' bytes in two
    ids, chars = data.encode_file(str(tmp_path / "t.txt"))
    tokenizer = gpt.CharTokenizer(text)
    assert chars == tokenizer.chars and ids.dtype == np.uint8 and ids.tolist() == tokenizer.encode(text)
    larger = gpt.CharTokenizer(chars + "#")  # a checkpoint's vocabulary, with a character this text lacks
    again, _ = data.encode_file(str(tmp_path / "t.txt"), chars=larger.chars)
    assert again.tolist() == larger.encode(text)


@pytest.mark.parametrize("change", ["cut", "new character", "appended", "same size"])
def test_a_text_that_changes_while_it_is_read_is_refused(tmp_path, monkeypatch, change):
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    real = data.text_chunks
    readings = []

    def changes_after_the_first_reading(name):
        readings.append(name)
        if len(readings) == 2:
            changed = {"cut": TEXT[:20_000], "new character": TEXT[:-1] + "\u00e9",
                       "appended": TEXT + TEXT[:100], "same size": TEXT[::-1]}[change]
            path.write_text(changed, encoding="utf-8")
            os.utime(path, ns=(time.time_ns() + 10 ** 9,) * 2)
        return real(name)

    monkeypatch.setattr(data, "text_chunks", changes_after_the_first_reading)
    with pytest.raises(ValueError, match=r"changed while it was read: pass --data a text that stays as it is"):
        data.encode_file(str(path))


def test_a_text_of_more_than_256_characters_trains_from_the_command_line(tmp_path, capsys):
    chinese = "".join(chr(0x4E00 + i) for i in range(300))  # 300 characters: ids of two bytes
    (tmp_path / "data.txt").write_text((TEXT[:3000] + chinese) * 4, encoding="utf-8")
    train.main(tiny_flags(tmp_path, max_iters=4))
    ids, chars = data.encode_file(str(tmp_path / "data.txt"))
    assert ids.dtype == np.uint16 and len(chars) > 256
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["chars"] == chars and ckpt["config"]["vocab_size"] == len(chars)
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--start", chinese[:3], "--max_new_tokens", "20"])
    assert capsys.readouterr().out.startswith(chinese[:3])


def test_token_ids_in_a_bin_file_train_from_the_command_line_and_sample_py_says_it_cannot_decode_them(
        tmp_path, capsys):
    ids = np.array(gpt.CharTokenizer(TEXT).encode(TEXT), dtype=np.uint16)
    ids.tofile(tmp_path / "train.bin")
    train.main(["--data", str(tmp_path / "train.bin"), *tiny_flags(tmp_path, max_iters=4)[2:]])
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["vocab_size"] == int(ids.max()) + 1 and ckpt["chars"] is None
    assert "bits per character" not in capsys.readouterr().out  # ids, not characters
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert "was trained on token ids of no tokenizer, so it cannot be decoded here: sample it from Python" in message
    train.main(["--data", str(tmp_path / "train.bin"), *tiny_flags(tmp_path, max_iters=6)[2:], "--resume"])
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 6
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=8), "--resume")
    assert "was trained on token ids of no tokenizer: resume it on the same ids, --data FILE.bin" in message


@pytest.mark.parametrize("ids, vocab_size, match", [
    # The advice fits every command that reads ids: sample.py --report has no --vocab_size to give.
    (np.array([0, 5, 13] * 400, dtype=np.uint8), 13, r"token ids must be in \[0, 13\), the vocabulary; these go from 0 "
                                                      r"to 13: check --dtype, or train a new run with --vocab_size"),
    (np.array([0, -1, 3] * 400, dtype=np.int32), 13, "these go from -1 to 3"),
    (np.array([0, 2 ** 62], dtype=np.int64), None, "the largest token id, 4,611,686,018,427,387,904, implies a"),
    (np.array([0, 2 ** 32 - 1], dtype=np.uint32), None, "implies a vocabulary of 4,294,967,296, beyond the 1,048,576"),
    # Their largest + 1 was the vocabulary: "vocab_size must be in [1, 1048576], not -4".
    (np.full(1200, -5, dtype=np.int32), None, r"every token id is negative \(the largest is -5\), and ids count"),
])
def test_ids_outside_the_vocabulary_or_too_large_for_any_are_refused_in_one_line(ids, vocab_size, match):
    with pytest.raises(ValueError, match=match):
        data.check_ids(ids, vocab_size or data.implied_vocab_size(ids))


@pytest.mark.parametrize("flags, match", [
    (["--data", "HUGE_ID.bin", "--dtype", "int64"], "the largest token id, 4,611,686,018,427,387,904, implies a "
                                                     "vocabulary of 4,611,686,018,427,387,905, beyond the 1,048,576"),
    (["--data", "MAX_U32.bin", "--dtype", "uint32"], "implies a vocabulary of 4,294,967,296, beyond the 1,048,576"),
    (["--data", "NEGATIVE.bin", "--dtype", "int32", "--vocab_size", "10"], "these go from -1 to 5"),
    (["--data", "ALL_NEGATIVE.bin", "--dtype", "int32"], "every token id is negative (the largest is -5)"),
    (["--data", "IDS.bin", "--vocab_size", str(10 ** 12)],
     "argument --vocab_size: vocab_size must be in [1, 1048576], not 1000000000000"),
])
def test_token_ids_that_would_build_a_vocabulary_beyond_any_run_are_one_line(tmp_path, capsys, flags, match):
    np.array([0, 5, 2 ** 62] * 1000, dtype=np.int64).tofile(tmp_path / "HUGE_ID.bin")
    np.array([0, 5, 2 ** 32 - 1] * 1000, dtype=np.uint32).tofile(tmp_path / "MAX_U32.bin")
    np.array([0, 5, -1] * 1000, dtype=np.int32).tofile(tmp_path / "NEGATIVE.bin")
    np.full(3000, -5, dtype=np.int32).tofile(tmp_path / "ALL_NEGATIVE.bin")
    np.arange(3000, dtype=np.uint16).tofile(tmp_path / "IDS.bin")
    flags = [str(tmp_path / f) if f.endswith(".bin") else f for f in flags]
    message = one_line_error(capsys, train, *tiny_flags(tmp_path), *flags)
    assert match in message, message


def test_a_bin_file_is_ids_whatever_the_case_of_its_extension(tmp_path):
    path = tmp_path / "train.BIN"
    np.arange(300, dtype=np.uint16).tofile(path)
    ids, tokenizer = data.read_data(data.DataFile(str(path), "uint16"))
    assert tokenizer is None and ids.dtype == np.uint16 and list(ids[:3]) == [0, 1, 2]


def test_a_dtype_given_with_a_text_is_refused_never_dropped(tmp_path, capsys):
    text = tmp_path / "data.txt"
    text.write_text(TEXT, encoding="utf-8")
    message = one_line_error(capsys, train, "--data", str(text), "--dtype", "uint16", "--out_dir", str(tmp_path / "o"))
    assert "--dtype uint16 is for token ids, and" in message and "is read as a text" in message


@pytest.mark.parametrize("read", [lambda path: data.encode_file(path), lambda path: data.read_text(path)])
def test_binary_data_is_never_taken_for_a_text(tmp_path, read):
    path = tmp_path / "ids.dat"
    np.arange(1, 100, dtype=np.uint16).repeat(10).tofile(path)  # ids below 128: valid UTF-8, a NUL in each
    with pytest.raises(ValueError, match="holds NUL bytes, so it is binary data, not a text"):
        read(str(path))


def test_a_text_with_a_nul_is_refused_at_the_chunk_that_holds_it_and_one_of_too_many_characters_by_name(
        tmp_path, monkeypatch):
    path = tmp_path / "zeros.txt"
    with open(path, "wb") as f:
        f.write(b"ab\0")
        f.truncate(10_000_000)  # a file of zeros, as a disk image holds: read to its end, it would take seconds a GB
    read = []
    chunks = data.text_chunks
    monkeypatch.setattr(data, "text_chunks", lambda path: (read.append(len(chunk)) or chunk for chunk in chunks(path)))
    monkeypatch.setattr(data, "CHUNK", 1 << 16)
    with pytest.raises(ValueError, match="holds NUL bytes, so it is binary data, not a text"):
        data.encode_file(str(path))
    assert len(read) == 1, read
    monkeypatch.undo()
    monkeypatch.setattr(data, "MAX_VOCAB", 10)
    (tmp_path / "t.txt").write_text("abcdefghijk", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^the data file .*t.txt has 11 distinct characters, more than the 10 a "
                                         r"run's vocabulary may hold: pass --data a text of fewer$"):
        data.encode_file(str(tmp_path / "t.txt"))


@pytest.mark.parametrize("n, block_size", [(100, 10), (10, 1), (10, 256), (2560, 256), (0, 1)])
def test_a_context_too_long_for_the_held_out_tokens_is_refused_with_the_fixes_that_work(n, block_size):
    """The message names the least data that fits the context, which does fit it; and lowering --block_size only
    where 2 tokens or more are held out, as a context of 1 needs."""
    with pytest.raises(ValueError, match=f"--block_size {block_size} is too long for the ") as raised:
        data.check_block_size(block_size, list(range(n)))
    least = int(re.search(r"give ([\d,]+) tokens or more", str(raised.value)).group(1).replace(",", ""))
    data.check_block_size(block_size, list(range(least)))
    with pytest.raises(ValueError):
        data.check_block_size(block_size, list(range(least - 1)))
    assert str(raised.value).endswith(", or lower --block_size") == (len(gpt.split(list(range(n)))["val"]) > 1)


def test_a_text_larger_than_the_memory_is_refused_by_name_not_as_the_model_s_fault(tmp_path, trained_dir, monkeypatch,
                                                                                     capsys):
    """A --start FILE: of 40 GB ended in sample.py's advice for a model too large ("sample on another --device")."""
    path = tmp_path / "huge.txt"
    path.write_text("ROMEO", encoding="utf-8")

    class Huge(io.StringIO):
        def read(self, *args):
            raise MemoryError
    # data.py's own open: this file reads as too large for the memory, every other file as it is.
    monkeypatch.setattr(data, "open", lambda file, *args, **kwargs: Huge() if str(file) == str(path) else open(
        file, *args, **kwargs), raising=False)
    message = one_line_error(capsys, sample, "--out_dir", trained_dir, "--start", f"FILE:{path}")
    assert message == f"error: the prompt file {path} is more than this machine's memory holds: pass --start " \
                      f"FILE:path to a smaller text", message
