"""Tests of gpt2.py: GPT-2's weights, files and tokens."""
import dataclasses
import json
import os
import pickle
import re
import shutil
import signal
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import gpt
import gpt2
import sample
import train
from conftest import (TEXT, FIXTURE, run_cli, one_line_error, ByteTokenizer, fixture_weights, fixture_logits,
                      models_made, compressed)


def test_gpt2_from_state_dict_computes_the_logits_transformers_computed():
    weights = fixture_weights()
    assert "lm_head.weight" not in weights and "transformer.wte.weight" in weights  # tied: stored once
    ids, expected = fixture_logits()
    model = gpt2.from_state_dict(weights, n_head=2).eval()
    assert (model.config.vocab_size, model.config.block_size, model.config.n_layer, model.config.n_embd) == \
           (256, 64, 2, 64)
    assert (model.config.norm, model.config.pos, model.config.mlp, model.config.bias) == \
           ("layernorm", "learned", "gelu", True)
    torch.testing.assert_close(model(ids)[0], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    unprefixed = {k.removeprefix("transformer."): w for k, w in weights.items()}
    assert torch.equal(gpt2.from_state_dict(unprefixed, n_head=2).eval()(ids)[0], model(ids)[0])
    masks = {**weights, "transformer.h.0.attn.bias": torch.ones(1, 1, 64, 64)}  # as older files hold them
    assert torch.equal(gpt2.from_state_dict(masks, n_head=2).eval()(ids)[0], model(ids)[0])
    one_head = gpt2.from_state_dict(weights).eval()  # n_embd // 64: 1 head, not the fixture's 2
    assert not torch.allclose(one_head(ids)[0], expected, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpt2s_c_attn_is_split_into_dense_float32_parameters_of_their_own_whatever_the_files_precision(
        tmp_path, dtype):
    weights = {name: w.to(dtype) for name, w in fixture_weights().items()}
    shutil.copy(os.path.join(FIXTURE, "config.json"), tmp_path / "config.json")
    torch.save(weights, tmp_path / "pytorch_model.bin")  # a folder of half precision, as some downloads are
    assert all(p.dtype == torch.float32 for p in gpt2.load(str(tmp_path), "cpu").parameters())
    model = gpt2.from_state_dict(weights, n_head=2)
    c_attn = weights["transformer.h.1.attn.c_attn.weight"]  # Conv1D: (in, out), q, k, v side by side in columns
    bias = weights["transformer.h.1.attn.c_attn.bias"]
    attn = model.h[1].attn
    for i, linear in enumerate((attn.c_q, attn.c_k, attn.c_v)):
        assert torch.equal(linear.weight, c_attn[:, i * 64:(i + 1) * 64].t().float())
        assert torch.equal(linear.bias, bias[i * 64:(i + 1) * 64].float())
    # Every parameter dense, float32, in memory of its own (the tied output layer is the embedding itself): a fused
    # optimizer steps each as if it were dense, and training and its checkpoints keep float32.
    storages = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(storages)) == len(storages) == len(list(model.named_parameters()))
    given = {w.untyped_storage().data_ptr() for w in weights.values()}
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.is_contiguous() and p.untyped_storage().nbytes() == p.numel() * 4, name
        assert p.untyped_storage().data_ptr() not in given, name  # a copy: the caller's tensors stay theirs


def test_one_fused_adamw_step_on_gpt2s_weights_moves_none_beyond_adams_bound():
    """Adam's first step moves each weight by at most the learning rate (m / sqrt(v) is +-1); a fused step on a
    view of c_attn moved c_q, c_k and c_v three times that."""
    model = gpt2.from_state_dict(fixture_weights(), n_head=2)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tc = gpt.TrainConfig(**{**train.INIT_FROM_DEFAULTS, "learning_rate": 1e-3, "min_lr": 1e-3})
    optimizers = gpt.configure_optimizers(model, tc, "cpu")
    assert optimizers[0].defaults["fused"]
    ids, _ = fixture_logits()
    gpt.train_step(model, optimizers, [(ids[:, :-1], ids[:, 1:])])
    for name, p in model.named_parameters():
        moved = (p.detach() - before[name]).abs()
        # Beyond the learning rate by no more than the rounding of the weight itself.
        rounding = 2 * torch.finfo(torch.float32).eps * torch.maximum(p.detach().abs(), before[name].abs())
        assert moved.max() > 0 and (moved <= 1e-3 * (1 + 1e-5) + rounding).all(), (name, moved.max().item())


def test_a_gpt2_finetune_stopped_and_resumed_equals_the_straight_run(tmp_path, gpt2_tokens):
    np.array(gpt2_tokens.encode(TEXT[:5000]), dtype=np.uint16).tofile(tmp_path / "train.bin")
    flags = ["--init_from", FIXTURE, "--data", str(tmp_path / "train.bin"), "--eval_interval", "3", "--eval_iters",
             "1", "--batch_size", "2", "--block_size", "16", "--device", "cpu", "--learning_rate", "1e-3", "--min_lr",
             "1e-3"]
    train.main([*flags, "--out_dir", str(tmp_path / "straight"), "--max_iters", "6"])
    train.main([*flags, "--out_dir", str(tmp_path / "stopped"), "--max_iters", "3"])
    # --device is not a run's option but the machine's: a resume on a machine with a GPU would take it unless told.
    train.main(["--resume", "--data", str(tmp_path / "train.bin"), "--out_dir", str(tmp_path / "stopped"),
                "--max_iters", "6", "--device", "cpu"])
    straight, resumed = (torch.load(tmp_path / name / "ckpt.pt", weights_only=True) for name in ("straight", "stopped"))
    assert straight["iter"] == resumed["iter"] == 6
    for name, w in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("change, match", [
    (lambda w: w.update({"transformer.h.0.mlp.c_gate.weight": torch.zeros(3)}),
     "not GPT-2's weights: h.0.mlp.c_gate.weight is not one of GPT-2's tensors"),
    (lambda w: w.pop("transformer.h.1.ln_2.bias"), "not GPT-2's weights: h.1.ln_2.bias is missing"),
    (lambda w: w.pop("transformer.wpe.weight"), "wte.weight or wpe.weight is missing"),
    (lambda w: w.update({"transformer.h.1.mlp.c_fc.weight": torch.zeros(64, 3)}), "size mismatch"),
    (lambda w: w.update({"wte.weight": w["transformer.wte.weight"] + 1}),
     "wte.weight comes twice, with and without transformer."),
    (lambda w: w.update({"transformer.h.0.attn.c_q.weight": torch.zeros(3)}),
     "h.0.attn holds both c_attn.weight and c_q.weight"),
    (lambda w: w.update({"lm_head.weight": w["transformer.wte.weight"] + 1}),
     "lm_head.weight is not wte.weight, and GPT-2 ties the two"),
])
def test_gpt2_from_state_dict_uses_every_tensor_and_fills_every_parameter(change, match):
    weights = fixture_weights()
    change(weights)
    with pytest.raises((ValueError, RuntimeError), match=match):
        gpt2.from_state_dict(weights, n_head=2)


@pytest.fixture
def gpt2_tokens(monkeypatch):
    """GPT-2's tokenizer as a byte-level stand-in (the fixture's vocabulary is 256): the tests need no tiktoken."""
    tokenizer = ByteTokenizer()
    monkeypatch.setattr(gpt2.Tokenizer, "backend", lambda self: (tokenizer.encode, tokenizer.decode))
    monkeypatch.setattr(gpt2.Tokenizer, "vocab_size", tokenizer.vocab_size)
    return tokenizer


def test_train_py_finetunes_gpt2_from_its_folder_on_ids_and_sample_py_samples_the_checkpoint(
        tmp_path, capsys, gpt2_tokens):
    np.array(gpt2_tokens.encode(TEXT), dtype=np.uint16).tofile(tmp_path / "train.bin")
    flags = ["--init_from", FIXTURE, "--out_dir", str(tmp_path / "out"), "--max_iters", "4", "--eval_interval", "2",
             "--eval_iters", "2", "--batch_size", "2", "--block_size", "32", "--device", "cpu"]
    train.main([*flags, "--data", str(tmp_path / "train.bin"), "--learning_rate", "1e-3", "--min_lr", "1e-4"])
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["tokenizer"] == "gpt2" and ckpt["chars"] is None
    assert ckpt["config"] == dataclasses.asdict(gpt2.from_state_dict(fixture_weights(), n_head=2).config)
    assert ckpt["train_config"]["block_size"] == 32 and ckpt["train_config"]["n_head"] == 2  # what ran
    start = fixture_weights()["transformer.h.0.attn.c_attn.weight"].t()[:64]  # the query's rows
    assert not torch.equal(ckpt["model"]["h.0.attn.c_q.weight"], start)  # trained
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--start", "ROMEO", "--max_new_tokens", "20",
                 "--num_samples", "1"])
    assert capsys.readouterr().out.startswith("ROMEO")
    # A text is read in GPT-2's tokens; the defaults for finetuning are small, constant steps.
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    train.main([*flags, "--data", str(tmp_path / "data.txt"), "--out_dir", str(tmp_path / "text")])
    ckpt = torch.load(tmp_path / "text" / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["train_config"]["learning_rate"] == ckpt["train_config"]["min_lr"] == 3e-5


def test_sample_py_samples_gpt2_itself(capsys, gpt2_tokens):
    sample.main(["--init_from", FIXTURE, "--start", "Hello", "--max_new_tokens", "12", "--temperature", "0",
                 "--num_samples", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    model = gpt2.from_state_dict(fixture_weights(), n_head=2).eval()
    greedy = model.generate(torch.tensor([gpt2_tokens.encode("Hello")]), 12, temperature=0)
    assert out == gpt2_tokens.decode(greedy[0].tolist()) + "\n"


def test_sample_py_draws_only_ids_its_gpt2_tokenizer_reads(capsys, monkeypatch, gpt2_tokens):
    model = gpt2.from_state_dict(fixture_weights(), n_head=2).eval()  # 256 tokens, the tokenizer's 200 below
    sample.draw_below(model, 200)  # as nanoGPT pads GPT-2's 50,257 to 50,304
    drawn = model.generate(torch.zeros(4, 1, dtype=torch.long), 100, temperature=3.0)
    assert drawn.max() < 200 and drawn[:, 1:].unique().numel() > 50  # drawn from all the others
    monkeypatch.setattr(gpt2.Tokenizer, "vocab_size", 200)
    sample.main(["--init_from", FIXTURE, "--start", "Hi", "--max_new_tokens", "5", "--num_samples", "1", "--device",
                 "cpu"])
    assert capsys.readouterr().out.startswith("Hi")
    monkeypatch.setattr(gpt2.Tokenizer, "vocab_size", 300)  # more than the model has rows for
    message = one_line_error(capsys, sample, "--init_from", FIXTURE, "--device", "cpu")
    assert message.endswith("the model has a vocabulary of 256 tokens, fewer than GPT-2's tokenizer's 300: sample "
                            "it from Python on ids below 256 (model.generate)"), message


@pytest.mark.parametrize("module", [train, sample])
def test_an_empty_init_from_is_refused_not_read_as_none_given(capsys, module):
    message = one_line_error(capsys, module, "--init_from", "")
    assert "argument --init_from: is empty: give a folder, or a name such as gpt2" in message, message


def test_a_header_of_many_names_is_checked_in_one_pass():
    names = [f"z{i}" for i in range(100_000)]
    # Name by name, counting each in all of them, would take minutes: an alarm makes that a failure.
    before = signal.signal(signal.SIGALRM, lambda *args: pytest.fail("a header of 100,000 names took over 60 s"))
    signal.alarm(60)
    try:
        assert len(json.loads(json.dumps(dict.fromkeys(names, 0)), object_pairs_hook=gpt2.unique_names)) == 100_000
        with pytest.raises(ValueError, match="the name 'z7' comes twice"):
            json.loads("{" + ", ".join(f'"{n}": 0' for n in [*names, "z7"]) + "}", object_pairs_hook=gpt2.unique_names)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_gpt2s_tokens_without_tiktoken_or_transformers_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # an import of either fails
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr(gpt2.Tokenizer, "vocab_size", 256)  # the fixture's, standing for GPT-2's 50,257
    (tmp_path / "data.txt").write_text(TEXT)
    for module, args in ((sample, ["--init_from", FIXTURE]),
                         (train, ["--init_from", FIXTURE, "--data", str(tmp_path / "data.txt"), "--out_dir",
                                  str(tmp_path / "out"), "--device", "cpu"])):
        message = one_line_error(capsys, module, *args)
        assert "GPT-2's tokens need tiktoken or transformers, and neither is installed: pip install tiktoken" in \
            message, message
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_a_gpt2_name_is_fetched_through_huggingface_hub_when_it_is_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ValueError, match="with huggingface_hub, which is not installed: pip install huggingface_hub"):
        gpt2.folder_of("gpt2-medium")
    asked = []

    class Hub:
        @staticmethod
        def snapshot_download(repo_id, allow_patterns):
            asked.append((repo_id, allow_patterns))
            return FIXTURE

    monkeypatch.setitem(sys.modules, "huggingface_hub", Hub)
    assert gpt2.load("gpt2", "cpu").config.n_layer == 2
    assert asked[0][0] == "openai-community/gpt2" and "model.safetensors" in asked[0][1]
    with pytest.raises(ValueError, match="no such folder, and not one of gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        gpt2.folder_of("gpt3")


def fake_transformers(monkeypatch, encode_to):
    """transformers as an offline machine has it: a GPT2TokenizerFast that records how it was asked."""
    asked = []

    class GPT2TokenizerFast:
        @staticmethod
        def from_pretrained(source, **kwargs):
            asked.append((source, kwargs))
            if encode_to is None:
                raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")
            return types.SimpleNamespace(encode=lambda text: list(encode_to), decode=lambda ids: "")

    monkeypatch.setitem(sys.modules, "tiktoken", None)
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(GPT2TokenizerFast=GPT2TokenizerFast))
    return asked


def test_gpt2s_tokenizer_never_waits_on_a_network_and_refuses_one_that_encodes_nothing(monkeypatch):
    asked = fake_transformers(monkeypatch, encode_to=None)
    with pytest.raises(ValueError, match=r"GPT-2's tokenizer files \(vocab.json, merges.txt\) are not in "
                                         r"transformers' cache: pip install tiktoken, or fetch them"):
        gpt2.tokenizer()
    assert asked == [("gpt2", {"local_files_only": True})]  # nothing downloaded unasked
    fake_transformers(monkeypatch, encode_to=[])  # HF_HUB_OFFLINE=1's empty tokenizer
    with pytest.raises(ValueError, match=r"encodes text to nothing: its files \(vocab.json, merges.txt\) are missing"):
        gpt2.tokenizer()
    asked = fake_transformers(monkeypatch, encode_to=[1, 2])
    folder = Path(FIXTURE)
    assert gpt2.tokenizer(str(folder)).encode("x") == [1, 2]
    assert asked == [("gpt2", {"local_files_only": True})]  # the fixture has no tokenizer files


# --------------------------------------------------------------------------------------------------- files from outside
def damage_config(**changes):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return change


def as_bin_with(change):
    def damage(folder):
        weights = fixture_weights()
        change(weights)
        torch.save(weights, folder / "pytorch_model.bin")
        os.remove(folder / "model.safetensors")
    return damage


def as_bin_without(name):
    def change(folder):
        weights = fixture_weights()
        weights.pop(name)
        torch.save(weights, folder / "pytorch_model.bin")
        os.remove(folder / "model.safetensors")
    return change


def bin_of(change):
    """(folder) -> the folder with a pytorch_model.bin of the fixture's weights, changed by change, in place of its
    model.safetensors."""
    def damage(folder):
        os.remove(folder / "model.safetensors")
        torch.save(change(fixture_weights()), folder / "pytorch_model.bin")
    return damage


def compressed_bin(folder):
    """A pytorch_model.bin of the fixture's weights, its records compressed as a hand-made file's may be."""
    torch.save(fixture_weights(), folder / "pytorch_model.bin")
    compressed(folder / "pytorch_model.bin")


@pytest.mark.parametrize("damage, match", [
    (lambda folder: os.remove(folder / "config.json"), "config.json (No such file or directory))"),
    (lambda folder: (folder / "config.json").write_text("{not json"), "(JSONDecodeError: "),
    (lambda folder: (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100_000]),
     "model.safetensors is damaged: tensor transformer.h.0.mlp.c_fc.weight lies at bytes"),
    (lambda folder: (folder / "model.safetensors").write_bytes(b"junk" * 100), "is cut short, or not a .safetensors"),
    (damage_config(n_layer=3), "its config.json disagrees with its weights: n_layer 3 (the tensors' 2)"),
    (damage_config(model_type="llama"), 'its config.json is of a "llama" model, not gpt2'),
    (as_bin_without("transformer.h.1.ln_2.bias"), "h.1.ln_2.bias is missing"),
    (lambda folder: os.remove(folder / "model.safetensors"), "pytorch_model.bin"),
    (damage_config(activation_function="relu"), "asks for another block than GPT-2's: activation_function \"relu\""),
    (damage_config(layer_norm_epsilon=10 ** 400), "layer_norm_epsilon an integer of 401 digits"),
    (damage_config(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx true"),  # as JSON has it
    (damage_config(layer_norm_epsilon=0.5), "layer_norm_epsilon 0.5"),
    (as_bin_with(lambda w: w.update({"transformer.h.1.mlp.c_fc.weight": torch.zeros(64, 3)})),
     "size mismatch for h.1.mlp.c_fc.weight: copying a param with shape torch.Size([3, 64])"),
    # Loaded as they are, a complex weight would lose its imaginary part and an integer one train as no weight does.
    (as_bin_with(lambda w: w.update({"transformer.ln_f.weight": w["transformer.ln_f.weight"].to(torch.complex64)})),
     '"transformer.ln_f.weight" is not a dense tensor of real floats (torch.complex64, torch.strided)'),
    (as_bin_with(lambda w: w.update({"transformer.ln_f.bias": w["transformer.ln_f.bias"].long()})),
     "(torch.int64, torch.strided)"),
    (as_bin_with(lambda w: w.update({"transformer.ln_f.bias": w["transformer.ln_f.bias"].to_sparse()})),
     "(torch.float32, torch.sparse_coo)"),
    # Finite in float64, inf in the float32 the model holds.
    (as_bin_with(lambda w: w.update({"transformer.h.0.mlp.c_fc.bias": torch.full_like(
        w["transformer.h.0.mlp.c_fc.bias"], 1e300, dtype=torch.float64)})),
     "its weights hold NaN or inf (in float32): the file is damaged"),
])
def test_a_broken_gpt2_folder_is_one_line(tmp_path, capsys, damage, match):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    damage(folder)
    message = one_line_error(capsys, sample, "--init_from", str(folder))
    assert f"{folder} holds no GPT-2 this can load (" in message and match in message, message


def test_weights_that_name_a_larger_model_than_they_fill_are_refused_before_that_model_is_made(monkeypatch):
    # A few bytes may name a model of gigabytes: its width from wte, its layers from the names alone.
    weights = {"wte.weight": torch.zeros(1, 256), "wpe.weight": torch.zeros(1, 256),
               **{f"h.{i}.x": torch.zeros(0) for i in range(3)}}
    made = models_made(monkeypatch)
    with pytest.raises(ValueError, match="h.0.x is not one of GPT-2's tensors"):
        gpt2.from_state_dict(weights)
    assert made == [(3, 256, "meta")]
    made.clear()
    assert isinstance(gpt2.from_state_dict(fixture_weights()), gpt.GPT)
    assert [device for *_, device in made] == ["meta", "cpu"]


def safetensors_bytes(header, data):
    encoded = json.dumps(header).encode()
    return len(encoded).to_bytes(8, "little") + encoded + data


@pytest.mark.parametrize("header, data, match", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, b"\0" * 8, "outside its 8 bytes of data"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1],
      "data_offsets": [4, 8]}}, b"\0" * 8, "the bytes of tensor b overlap the tensor before them"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "leave a gap after them"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, "its tensors end at byte 4 of its 8"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "8 bytes for 3 values of 4 bytes"),
    ({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, b"\0" * 8, "not at most 8 whole numbers"),
    ({"a": {"dtype": "F32", "shape": [0, 10 ** 30], "data_offsets": [0, 0]}}, b"", "the shape [0, 1000000000000"),
    ({"a": {"dtype": "F32", "shape": [0, 2 ** 39, 2 ** 39], "data_offsets": [0, 0]}}, b"", "a product below 2**60"),
    ({"a": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, b"\0" * 4, "not at most 8 whole numbers"),
    ({"__metadata__": [1], "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4,
     "its __metadata__ is not a JSON object"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8,
     "tensor a has the type \"Q4\", none this reads (F64, F32, F16, BF16, I64"),
    ({"a": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "has the type [\"F32\"], none"),
    ({"a": [1, 2]}, b"", "is damaged: tensor a is described by [1, 2], not a JSON object"),
    ({"a": {"dtype": "U16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "has the type \"U16\", none"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}, b"\0" * 8, "not two whole numbers"),
    ([1, 2], b"", "its header is not a JSON object"),
])
def test_a_safetensors_file_is_held_to_its_format(tmp_path, header, data, match):
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    with pytest.raises(ValueError, match=re.escape(match)):
        gpt2.read_safetensors(str(path))
    twice = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], ' \
            b'"data_offsets": [0, 4]}}'
    path.write_bytes(len(twice).to_bytes(8, "little") + twice + b"\0" * 4)
    with pytest.raises(ValueError, match="its header is not JSON with unique names .the name 'a' comes twice"):
        gpt2.read_safetensors(str(path))
    path.write_bytes((2 ** 40).to_bytes(8, "little") + b"{}")  # a header length past the file and the 100 MB
    with pytest.raises(ValueError, match="or pass the format's 100 MB"):
        gpt2.read_safetensors(str(path))


def nan_weights(folder):
    weights = fixture_weights()
    weights["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")
    header = {}
    data = b""
    for name, w in weights.items():
        raw = w.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    (folder / "model.safetensors").write_bytes(safetensors_bytes(header, data))


class Malicious:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("damage, match", [
    (nan_weights, "(ValueError: its weights hold NaN or inf (in float32): the file is damaged)"),
    (damage_config(n_head=2.0), "(ValueError: its config.json gives n_head = 2.0, not a whole number of at least 1)"),
    (damage_config(n_head=0), "gives n_head = 0, not a whole number"),
    (damage_config(n_head=None), "gives n_head = null, not a whole number"),
    (damage_config(n_head=True), "gives n_head = true, not a whole number"),
    (damage_config(n_positions="64"), "gives n_positions = \"64\", not a whole number"),
    (lambda folder: (folder / "config.json").write_text("[1, 2]"), "its config.json holds a list, not an object"),
    (damage_config(model_type=None), "its config.json is of a null model, not gpt2"),
    (lambda folder: (folder / "config.json").write_text('{"n_layer": 2, "n_layer": 3}'),
     "the name 'n_layer' comes twice"),
    (damage_config(n_embd=10 ** 400), "disagrees with its weights: n_embd an integer of 401 digits"),
    (damage_config(n_embd=-10 ** 400), "n_embd = an integer of 401 digits, not a whole number"),
    (lambda folder: (folder / "config.json").write_text('{"model_type": "gpt2", "n_embd": ' + "9" * 5000 + "}"),
     "(ValueError: its config.json holds a whole number of 5,000 digits, past the 4,300 Python reads)"),
    (lambda folder: (folder / "config.json").write_text('{"model_type": "gpt2", "n_layer": 0}', encoding="utf-8-sig"),
     "n_layer = 0, not a whole number of at least 1"),  # read past its byte-order mark
    (lambda folder: (os.remove(folder / "model.safetensors"),
                     torch.save({"x": Malicious()}, folder / "pytorch_model.bin")),
     "pytorch_model.bin holds code or objects, or is a plain pickle, not tensors as torch.save writes them"),
    (bin_of(lambda w: {**w, 7: w["transformer.wte.weight"]}), "its weights are named by int keys, not by names"),
    (bin_of(lambda w: {**w, "transformer.wte.weight": w["transformer.wte.weight"][0]}),
     "wte.weight has the shape (64,), not (rows, n_embd)"),
    (bin_of(lambda w: {**w, "transformer.wpe.weight": torch.tensor(1.0)}), "wpe.weight has the shape (), not"),
    # Without an lm_head a file's NaN is said as one, not as a head that is not its embedding.
    (bin_of(lambda w: {k: v.fill_(float("nan")) if "wte" in k else v for k, v in w.items() if "lm_head" not in k}),
     "its weights hold NaN or inf"),
    (bin_of(lambda w: {**w, "lm_head.weight": w["transformer.wte.weight"].fill_(float("nan")).clone()}),
     "its weights hold NaN or inf"),  # the same NaN in a head of its own
    (lambda folder: (os.remove(folder / "model.safetensors"), (folder / "pytorch_model.bin").write_text("e" * 50)),
     "pytorch_model.bin is no file torch.save writes (IndexError reading it)"),
    (lambda folder: (os.remove(folder / "model.safetensors"), (folder / "pytorch_model.bin").write_bytes(b"")),
     "pytorch_model.bin is no file torch.save writes (EOFError reading it)"),
    (lambda folder: (os.remove(folder / "model.safetensors"), compressed_bin(folder)),
     "pytorch_model.bin is not loaded: its record 'pytorch_model/data.pkl' is compressed, which torch.save"),
    (lambda folder: (os.remove(folder / "model.safetensors"),
                     torch.save(fixture_weights(), folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)),
     None),  # an old raw pickle: loaded, with no warning beside the one line on the missing data
    (lambda folder: (os.remove(folder / "config.json"), os.mkfifo(folder / "config.json")),
     "cannot read GPT-2's config"),  # a FIFO, which would block for good
    (lambda folder: (os.remove(folder / "config.json"), os.symlink("/dev/zero", folder / "config.json")),
     "(it is not a regular file)"),  # which would be read until memory ran out
    (lambda folder: (folder / "config.json").write_text(" " * 1_000_001), "more than the 1,000,000 such a file"),
])
def test_gpt2_files_from_outside_are_checked_like_checkpoints(tmp_path, capsys, damage, match):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    damage(folder)
    message = one_line_error(capsys, train, "--init_from", str(folder), "--data", str(tmp_path / "none.bin"),
                             "--out_dir", str(tmp_path / "out"))
    if match is None:
        assert message.startswith("error: cannot read the file of token ids"), message
    else:
        assert f"{folder} holds no GPT-2 this can load (" in message and match in message, message
    assert "weights_only" not in message and "this ran" not in capsys.readouterr().out
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_a_plain_pickle_of_gpt2s_weights_is_refused_in_one_line_without_torchs_warnings(tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    os.remove(folder / "model.safetensors")
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump(fixture_weights(), f)
    done = run_cli("sample.py", "--init_from", str(folder), "--max_new_tokens", "3")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr  # torch's two warnings not beside it
    assert "or is a plain pickle, not tensors as torch.save writes them, so it is not loaded" in done.stderr
    assert "weights_only" not in done.stderr


@pytest.mark.parametrize("link", ["missing", "loop"])
def test_a_gpt2_folder_whose_weights_are_a_broken_link_says_so(tmp_path, capsys, link):
    folder = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, folder)
    (folder / "model.safetensors").unlink()
    if link == "missing":
        os.symlink(tmp_path / "blobs" / "gone", folder / "model.safetensors")
    else:
        os.symlink(folder / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ValueError) as error:
        gpt2.load(str(folder), "cpu")
    assert "model.safetensors" in str(error.value) and "pytorch_model.bin" not in str(error.value), error.value


def test_gpt2s_tokenizer_files_that_are_there_but_damaged_are_named_as_damaged(tmp_path, monkeypatch):
    (tmp_path / "vocab.json").write_text('{"a": 0, ', encoding="utf-8")  # cut short
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")

    class GPT2TokenizerFast:
        @staticmethod
        def from_pretrained(source, **kwargs):
            raise ValueError("Expecting property name enclosed in double quotes: line 1 column 10")

    monkeypatch.setitem(sys.modules, "tiktoken", None)
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(GPT2TokenizerFast=GPT2TokenizerFast))
    with pytest.raises(ValueError) as error:
        gpt2.tokenizer(str(tmp_path))
    assert f"GPT-2's tokenizer files in {tmp_path} (vocab.json, merges.txt) could not be read (ValueError: " \
           f"Expecting property name" in str(error.value) and "they are damaged" in str(error.value)
    assert "not in" not in str(error.value)
