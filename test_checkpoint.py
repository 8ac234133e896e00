"""Tests of loading, checking and restoring a saved run."""
import os
import pickle
import re
import shutil
import sys
import threading
import warnings
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import checkpoint
import cli
import data
import gpt
import sample
import train
from conftest import (HERE, TEXT, run_cli, tiny_train_config, tiny_flags, quiet, one_line_error, hand_made, set_in,
                      models_made, compressed)


def test_a_checkpoint_holds_all_that_resuming_needs_and_restore_goes_on_exactly(tmp_path):
    tc = tiny_train_config(tmp_path, dropout=0.1)  # dropout: the random states must come back too
    straight = gpt.Trainer(replace(tc, out_dir=""), TEXT, log=quiet)
    for _ in straight.steps():
        pass
    first = gpt.Trainer(tc, TEXT, log=quiet)
    for trainer in first.steps():
        if trainer.it == 5:
            trainer.save()
            break
    model, tokenizer, ckpt = gpt.load_checkpoint(str(tmp_path / "out" / "ckpt.pt"), "cpu")
    second = gpt.Trainer(replace(tc, out_dir=""), TEXT, tokenizer, model.train(), log=quiet)
    checkpoint.restore(second, ckpt)
    assert (second.it, second.elapsed, second.history) == (5, first.elapsed, first.history)
    for _ in second.steps():
        pass
    # Bit for bit the run that was never stopped, on one machine: there the same products round alike.
    # Resumed on another machine, a run may part from it by rounding.
    for (name, p), q in zip(straight.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name


def test_each_restored_optimizer_state_is_a_dense_tensor_of_its_own(tmp_path, trained_dir):
    # A hand-made checkpoint may spread one value over a moment (stride 0: the fused AdamW would overrun it) or give
    # several weights one momentum buffer (each one's step would write it, in silence).
    model, tokenizer, ckpt = checkpoint.load(os.path.join(trained_dir, "ckpt.pt"), "cpu")
    adamw, muon = (saved["state"] for saved in ckpt["optimizers"])
    for state in adamw.values():
        state["exp_avg"] = torch.zeros(1).expand(state["exp_avg"].shape)
    shared = muon[0]["momentum_buffer"]  # the first attention map's: those of its block are of its shape
    for state in muon.values():
        if state["momentum_buffer"].shape == shared.shape:
            state["momentum_buffer"] = shared
    trainer = gpt.Trainer(tiny_train_config(tmp_path, out_dir=""), TEXT, tokenizer, model.train(), log=quiet)
    checkpoint.resume(trainer, ckpt, "ckpt.pt")
    states = [value for optimizer in trainer.optimizers for state in optimizer.state.values()
              for value in state.values() if value.dim()]
    assert len(states) == len(adamw) * 2 + len(muon) > 3
    assert all(value.is_contiguous() for value in states)
    assert len({value.data_ptr() for value in states}) == len(states)
    for _ in trainer.steps():  # and the run goes on
        pass
    # A state as the optimizer saved it is taken as it is, not copied: a large model's would take twice the memory.
    _, _, ckpt = checkpoint.load(os.path.join(trained_dir, "ckpt.pt"), "cpu")
    saved = ckpt["optimizers"][1]["state"]
    assert all(checkpoint.own_tensors(saved)[i]["momentum_buffer"] is saved[i]["momentum_buffer"] for i in saved)


def test_a_loaded_state_brings_the_moments_and_keeps_the_runs_own_hyperparameters(tmp_path):
    tc = tiny_train_config(tmp_path)
    first = gpt.Trainer(tc, TEXT, log=quiet)
    next(first.steps())
    first.save()
    second = gpt.Trainer(replace(tc, weight_decay=0.5, beta2=0.9, out_dir=""), TEXT, log=quiet)
    checkpoint.restore(second, torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True))
    assert [g["weight_decay"] for g in second.optimizers[0].param_groups] == [0.5, 0.5, 0.0]
    assert all(g["betas"] == (0.9, 0.9) for g in second.optimizers[0].param_groups)
    moments = second.optimizers[0].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, first.optimizers[0].state_dict()["state"][0]["exp_avg"])


@pytest.mark.parametrize("change, match", [
    (set_in(["optimizers"], "x"), "the optimizers' states or the evaluations"),
    (set_in(["optimizers", 0, "state", 0, "exp_avg"], torch.zeros(3, 3)), "optimizers' states"),  # the fused overrun
    (set_in(["optimizers", 0, "state", 0, "exp_avg_sq"], "x"), "optimizers' states"),
    (set_in(["optimizers", 0, "state", 0, "exp_avg"], None), "optimizers' states"),
    (lambda ckpt: ckpt["optimizers"][0]["state"][0].update(exp_avg=ckpt["optimizers"][0]["state"][0]["exp_avg"]
                                                           .to_sparse()), "optimizers' states"),  # not a traceback
    (lambda ckpt: ckpt["optimizers"][0]["state"][0].update(exp_avg=ckpt["optimizers"][0]["state"][0]["exp_avg"].double()
                                                           ), "optimizers' states"),  # the right shape, another type
    (set_in(["optimizers", 0, "state", -1], {}), "optimizers' states"),
    (set_in(["optimizers", 0, "param_groups"], []), "optimizers' states"),
    (lambda ckpt: ckpt["optimizers"].append(ckpt["optimizers"][0]), "optimizers' states"),
    (set_in(["iter"], -5), "its iteration is -5"),
    (set_in(["iter"], 10 ** 30), "its iteration is 1000000000000000000000000000000"),
    (set_in(["iter"], "8"), "its iteration is '8'"),
    (set_in(["elapsed"], float("nan")), "its seconds of training are nan"),
    (set_in(["elapsed"], -1.0), "its seconds of training are -1.0"),
    (set_in(["elapsed"], "5"), "its seconds of training are '5'"),
    (set_in(["history"], [{"iter": 2}]), "the evaluations"),
    (set_in(["history", 0, "val"], float("nan")), "the evaluations"),  # which the report draws
    (set_in(["history", 0, "train"], float("inf")), "the evaluations"),
    (set_in(["history", 0, "lr"], "x"), "the evaluations"),
    (set_in(["history", 0, "seconds"], -1.0), "the evaluations"),
    (set_in(["history", 0, "iter"], True), "the evaluations"),
    (set_in(["history"], 5), "the evaluations"),
    (lambda ckpt: ckpt.update(history=tuple(ckpt["history"])), "the evaluations"),  # the run appends to it
    # Finite, but so large that the report's charts would overflow drawing them.
    (set_in(["history", 0, "train"], 1.7e308), "the evaluations"),
    (set_in(["history", 0, "lr"], 1e300), "the evaluations"),
    (set_in(["elapsed"], 1e300), "its seconds of training are 1e+300"),
    (set_in(["elapsed"], 10 ** 400), "its seconds of training are an integer of 401 digits"),  # not 401 digits
    (set_in(["iter"], 10 ** 400), "its iteration is an integer of 401 digits"),
    (set_in(["rng", "torch"], torch.zeros(3, dtype=torch.uint8)), "does not fit its model (RuntimeError)"),
])
def test_a_damaged_training_state_is_refused_before_adamw_steps_on_it(tmp_path, capsys, trained_dir, change, match):
    hand_made(trained_dir, tmp_path / "out", change)
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert "holds a training state that does not fit its model" in message and match in message, message
    assert "train without --resume" in message


def spoil(optimizer, name, how):
    """A change of a checkpoint: the state name of the first parameter of optimizer (0: AdamW, 1: Muon) spoiled."""
    def change(ckpt):
        state = ckpt["optimizers"][optimizer]["state"][0]
        state[name] = how(state[name].clone())
    return change


@pytest.mark.parametrize("change, match", [
    (spoil(0, "exp_avg_sq", lambda v: v - 1), "exp_avg_sq holds values below 0"),
    (spoil(0, "exp_avg_sq", lambda v: v.index_fill_(0, torch.tensor([0]), float("inf"))),
     "exp_avg_sq holds NaN or inf"),
    (spoil(0, "exp_avg", lambda v: v.index_fill_(0, torch.tensor([1]), float("nan"))), "exp_avg holds NaN or inf"),
    (spoil(0, "step", lambda v: v.fill_(float("nan"))), "step holds NaN or inf"),
    (spoil(0, "step", lambda v: v.fill_(0)), "step holds values below 1"),
    (spoil(1, "momentum_buffer", lambda v: v.fill_(float("-inf"))), "momentum_buffer holds NaN or inf"),
])
def test_optimizer_states_no_step_leaves_are_refused_before_the_first_step(tmp_path, capsys, trained_dir, change,
                                                                            match):
    hand_made(trained_dir, tmp_path / "out", change)
    before = (tmp_path / "out" / "ckpt.pt").read_bytes()
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert f"holds an optimizer state that no step leaves ({match}): it is damaged or hand-made" in message, message
    assert message.endswith("train without --resume") and (tmp_path / "out" / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("name, value", [("eval_iters", float("nan")), ("eval_iters", 0), ("grad_clip", "1"),
                                         ("learning_rate", float("inf")), ("bias", 1), ("seed", -1),
                                         ("max_iters", 10 ** 400), ("learning_rate", 10 ** 400)])  # 401 digits
def test_a_recorded_option_no_run_could_have_is_refused_by_resume_and_by_the_report(tmp_path, capsys, trained_dir,
                                                                                     name, value):
    hand_made(trained_dir, tmp_path / "out", set_in(["train_config", name], value))
    shown = repr(value) if len(repr(value)) <= 40 else "an integer of 401 digits"
    says = f"ckpt.pt records {name} = {shown}, which no run could have ({name} must be "  # gpt.py's own rule
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert says in message and message.endswith("): it is damaged or hand-made; train without --resume"), message
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"),
                             "--data", str(tmp_path / "data.txt"))
    assert says in message and message.endswith("it can still sample, without --report"), message


def test_a_recorded_rate_that_would_rise_is_refused_by_resume_and_by_the_report(tmp_path, capsys, trained_dir):
    hand_made(trained_dir, tmp_path / "out", set_in(["train_config", "min_lr"], 0.5))  # each alone within its rule
    says = "ckpt.pt records min_lr = 0.5 above its learning_rate 0.003, a rate that would rise, which no run of"
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert says in message and message.endswith("this gpt.py trains with; train without --resume"), message
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"),
                             "--data", str(tmp_path / "data.txt"))
    assert says in message and message.endswith("it can still sample, without --report"), message


@pytest.mark.parametrize("chars, reason", [
    (lambda chars: chars[::-1], "its characters are not a string of distinct ones in order"),  # ids would map elsewhere
    (lambda chars: chars + chars[-1], "its characters are not a string of distinct ones in order"),
    (lambda chars: list(chars), "its characters are not a string of distinct ones in order"),
    (lambda chars: chars[:-1] + "\ud800", "its characters hold a lone surrogate"),  # past every other character
])
def test_a_checkpoints_characters_are_held_to_what_a_char_tokenizer_saves(tmp_path, capsys, trained_dir, chars,
                                                                          reason):
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: ckpt.update(chars=chars(ckpt["chars"])))
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"), "--max_new_tokens", "5")
    assert f"is not a checkpoint this gpt.py can load (ValueError: {reason}); train a new one" in message, message


def test_a_checkpoint_resumes_with_its_own_optimizer_and_a_forged_muon_state_is_refused(tmp_path, capsys):
    flags = tiny_flags(tmp_path, max_iters=2, eval_interval=2, optimizer="muon")
    train.main(flags)
    message = one_line_error(capsys, train, *flags, "--resume", "--max_iters", "4", "--optimizer", "adamw")
    assert "was trained with --optimizer muon, whose state it holds: resume it with that optimizer" in message
    good = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    buffer = good["optimizers"][1]["state"][0]["momentum_buffer"]
    for forge in (lambda c: c["optimizers"][1]["state"][0].update(momentum_buffer=torch.zeros(3, 3)),
                  lambda c: c["optimizers"][1]["state"][0].update(momentum_buffer=buffer.double()),
                  lambda c: c["optimizers"][1]["state"][0].update(exp_avg=buffer),
                  lambda c: c["optimizers"].reverse(),  # AdamW's state where Muon's goes
                  lambda c: c["optimizers"].pop()):
        ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
        forge(ckpt)
        torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
        message = one_line_error(capsys, train, *flags, "--resume", "--max_iters", "4")
        assert "holds a training state that does not fit its model: the optimizers' states" in message, message
        torch.save(good, tmp_path / "out" / "ckpt.pt")


BEFORE_SPLIT = os.path.join(HERE, "fixtures", "ckpt_before_split")


def test_a_checkpoint_from_before_each_map_had_a_weight_loads_to_its_logits(tmp_path):
    ckpt = torch.load(os.path.join(BEFORE_SPLIT, "ckpt.pt"), weights_only=True)
    saved = torch.load(os.path.join(BEFORE_SPLIT, "logits.pt"), weights_only=True)
    assert "h.0.attn.c_attn.weight" in ckpt["model"]  # the old layout, as it was saved
    with pytest.raises(RuntimeError, match="c_attn"):  # gpt.py alone does not take it
        gpt.load_checkpoint(os.path.join(BEFORE_SPLIT, "ckpt.pt"), "cpu")
    model, tokenizer, _ = checkpoint.load(os.path.join(BEFORE_SPLIT, "ckpt.pt"), "cpu")
    assert tokenizer.encode("Before we go") == saved["prompt"][0].tolist()
    torch.testing.assert_close(model(saved["prompt"])[0], saved["logits"], rtol=1e-5, atol=1e-6)
    # Each map is its block of rows: the query's the first n_embd of c_attn, SwiGLU's gate the first half of c_fc.
    state = model.state_dict()
    assert torch.equal(state["h.1.attn.c_v.weight"], ckpt["model"]["h.1.attn.c_attn.weight"][32:])
    assert torch.equal(state["h.0.mlp.c_gate.weight"], ckpt["model"]["h.0.mlp.c_fc.weight"][:64])
    assert torch.equal(state["h.0.mlp.c_fc.weight"], ckpt["model"]["h.0.mlp.c_fc.weight"][64:])


def test_a_checkpoint_from_before_each_map_had_a_weight_samples_and_resumes(tmp_path):
    out = tmp_path / "out"
    shutil.copytree(BEFORE_SPLIT, out)
    text = tmp_path / "text.txt"
    text.write_text(Path(HERE, "input.txt").read_text(encoding="utf-8")[:1000], encoding="utf-8")
    proc = run_cli("sample.py", "--out_dir", str(out), "--max_new_tokens", "10", "--num_samples", "1")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    trainer, stopped = train.run(gpt.TrainConfig(out_dir=str(out), device="cpu"), data.DataFile(str(text)), quiet,
                                 resume=True, given=dict(max_iters=6))
    assert stopped is None and trainer.it == 6 and [h["iter"] for h in trainer.history] == [4, 6]
    new = torch.load(out / "ckpt.pt", weights_only=True)
    assert "h.0.attn.c_q.weight" in new["model"] and "h.0.attn.c_attn.weight" not in new["model"]


def test_a_run_recorded_before_the_embeddings_rate_the_rising_momentum_and_short_windows_goes_on_as_it_trained(
        tmp_path):
    tc = tiny_train_config(tmp_path, learning_rate=2e-3, muon_momentum=0.9)
    trainer = gpt.Trainer(tc, TEXT, log=quiet)
    next(trainer.steps())
    trainer.save()
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    recorded = checkpoint.recorded_options(ckpt, "ckpt.pt", "")
    assert (recorded["embedding_lr"], recorded["short_context"]) == (tc.embedding_lr, tc.short_context) == (0.03, 0.6)
    for name in ("embedding_lr", "muon_momentum_start", "short_context"):
        del ckpt["train_config"][name]
    options = checkpoint.recorded_options(ckpt, "ckpt.pt", "")
    assert (options["embedding_lr"], options["muon_momentum_start"], options["short_context"]) == (2e-3, 0.9, 0.0)
    # A checkpoint that records no options (hand-made) takes the defaults, not a run's from before.
    assert checkpoint.recorded_options({}, "ckpt.pt", "") == {}


def test_a_checkpoint_from_before_the_bigram_table_loads_and_resumes_without_one(tmp_path):
    trainer = gpt.Trainer(tiny_train_config(tmp_path, bigram=0), TEXT, log=quiet)
    next(trainer.steps())
    trainer.save()
    path = str(tmp_path / "out" / "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    del ckpt["config"]["bigram"], ckpt["train_config"]["bigram"]
    torch.save(ckpt, path)
    model, _, loaded = checkpoint.load(path, "cpu")
    assert model.bigram is None and loaded["config"]["bigram"] == 0
    assert checkpoint.resumed_options(gpt.TrainConfig(), loaded, path, {}, quiet)["bigram"] == 0
    assert gpt.load_checkpoint(path, "cpu")[0].bigram is None  # gpt.py alone loads it too


def test_the_optimizers_states_of_the_old_layout_are_cut_as_its_weights_are(tmp_path):
    ckpt = torch.load(os.path.join(BEFORE_SPLIT, "ckpt.pt"), weights_only=True)
    model, tokenizer, loaded = checkpoint.load(os.path.join(BEFORE_SPLIT, "ckpt.pt"), "cpu")
    tc = gpt.TrainConfig(**{**checkpoint.recorded_options(ckpt, "ckpt.pt", ""), "out_dir": "", "device": "cpu"})
    trainer = gpt.Trainer(tc, "Before we go" * 20, tokenizer, model.train(), log=quiet)
    checkpoint.resume(trainer, loaded, "ckpt.pt")
    names = {id(p): n for n, p in model.named_parameters()}
    muon_state = {names[id(p)]: s["momentum_buffer"] for p, s in trainer.optimizers[1].state.items()}
    old = ckpt["optimizers"][1]["state"][0]["momentum_buffer"]  # the first Muon weight: h.0.attn.c_attn
    assert torch.equal(muon_state["h.0.attn.c_q.weight"], old[:16])
    assert torch.equal(muon_state["h.0.attn.c_k.weight"], old[16:32])
    assert len(muon_state) == 14  # 7 maps a layer, 2 layers



def old_layout(ckpt):
    """A checkpoint of today's layout as gpt.py wrote it before each map had a weight of its own: each stacked
    weight, and each optimizer's state of it, its maps' stacked by rows, where the first of its maps stood."""
    config = ckpt["config"]

    def stack(parts):
        """The maps' tensors {row block: tensor}, or their states {row block: {key: tensor}}, stacked by rows; a
        number (AdamW's step) is the first map's, as all of them count alike."""
        first = parts[0]
        if isinstance(first, dict):
            return {key: stack({i: part[key] for i, part in parts.items()}) if first[key].dim() else first[key]
                    for key in first}
        return torch.cat([parts[i] for i in sorted(parts)])

    def stacked(names, value_of):
        """{old name: its maps' values stacked}, in the order of each old name's first map among names."""
        pieces = {}
        for name in names:
            source, i, _ = checkpoint.piece_of(name, config)
            pieces.setdefault(source, {})[i] = value_of(name)
        return {source: stack(parts) for source, parts in pieces.items()}

    ckpt["model"] = stacked(list(ckpt["model"]), ckpt["model"].get)
    model = gpt.GPT(gpt.GPTConfig(**config))
    tc = gpt.TrainConfig(**{**ckpt["train_config"], "device": "cpu", "out_dir": ""})
    names = {id(p): name for name, p in model.named_parameters()}
    for optimizer, saved in zip(gpt.configure_optimizers(model, tc), ckpt["optimizers"], strict=True):
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        saved["state"] = dict(enumerate(stacked(order, lambda name: saved["state"][order.index(name)]).values()))
        sizes = [len({checkpoint.piece_of(names[id(p)], config)[0] for p in group["params"]})
                 for group in optimizer.param_groups]
        saved["param_groups"] = [{**group, "params": list(range(sum(sizes[:g]), sum(sizes[:g + 1])))}
                                 for g, group in enumerate(saved["param_groups"])]
    return ckpt


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_an_old_checkpoint_resumes_to_the_weights_of_the_same_state_in_todays_layout(tmp_path, optimizer):
    """AdamW counts its steps in a tensor for each parameter: the maps cut from one stacked weight must not share
    one, or each step counts three times for the query, key and value (twice for SwiGLU's gate and up)."""
    tc = tiny_train_config(tmp_path, n_layer=2, bias=True, optimizer=optimizer, max_iters=3)
    train.run(tc, TEXT, quiet)
    today = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert any(s["step"].dim() == 0 for s in today["optimizers"][0]["state"].values())  # AdamW's counts
    old = old_layout(today)
    assert "h.0.attn.c_attn.weight" in old["model"] and "h.0.attn.c_attn.bias" in old["model"]
    (tmp_path / "old").mkdir()
    torch.save(old, tmp_path / "old" / "ckpt.pt")
    resumed = {}
    for folder in ("out", "old"):
        trainer, stopped = train.run(replace(tc, out_dir=str(tmp_path / folder)), TEXT, quiet, resume=True,
                                     given=dict(max_iters=6))
        assert stopped is None and trainer.it == 6
        resumed[folder] = torch.load(tmp_path / folder / "ckpt.pt", weights_only=True)
    for name, w in resumed["out"]["model"].items():
        torch.testing.assert_close(resumed["old"]["model"][name], w, rtol=0, atol=1e-6, msg=name)
    for kept, today_kept in zip(resumed["old"]["optimizers"], resumed["out"]["optimizers"]):
        for i, state in today_kept["state"].items():
            for key, value in state.items():
                torch.testing.assert_close(kept["state"][i][key], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("record", ["uint16", {"read_as": "float32"}, {"bytes": 5}, {"read_as": "x" * 200_000}])
def test_a_damaged_record_of_the_data_is_refused_by_resume_and_by_the_report(tmp_path, capsys, trained_dir, record):
    hand_made(trained_dir, tmp_path / "out", set_in(["data"], record))
    message = one_line_error(capsys, train, *tiny_flags(tmp_path, max_iters=4), "--resume")
    assert len(message) < 300, len(message)  # a record of any size is shown short
    assert (f"ckpt.pt records its data as {cli.shown(record)}: it is damaged or hand-made; train without --resume"
            in message)
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"),
                             "--data", str(tmp_path / "data.txt"))
    assert message.endswith("it is damaged or hand-made; it can still sample, without --report"), message


@pytest.mark.parametrize("held", [torch.zeros(3), [1, 2]], ids=["a tensor", "a list"])
def test_a_checkpoint_of_something_else_than_a_dict_is_one_line_without_torchs_warnings(tmp_path, capsys, held):
    (tmp_path / "out").mkdir()
    torch.save(held, tmp_path / "out" / "ckpt.pt")
    with warnings.catch_warnings(record=True) as caught:  # torch warned of indexing a tensor by name, in 2 lines
        warnings.simplefilter("always")
        message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert not caught and message == (
        f"error: {tmp_path / 'out' / 'ckpt.pt'} is not a checkpoint this gpt.py can load (TypeError: it holds a "
        f"{type(held).__name__}, not a dict); train a new one with python train.py")


def with_weight(name, make):
    return lambda ckpt: ckpt["model"].__setitem__(name, make(ckpt["model"][name]))


@pytest.mark.parametrize("change, match", [
    # Loaded as they are, a complex weight would lose its imaginary part with no more than a warning.
    (with_weight("ln_f.weight", lambda w: w.to(torch.complex64)),
     "its weight 'ln_f.weight' is a tensor of complex64, not a dense tensor of real floats"),
    (with_weight("ln_f.weight", lambda w: w.long()), "'ln_f.weight' is a tensor of int64, not a dense"),
    # A float8 weight has no arithmetic to check it with (isfinite), nor one to train it.
    (with_weight("ln_f.weight", lambda w: w.to(torch.float8_e4m3fn)), "'ln_f.weight' is a tensor of float8_e4m3fn"),
    (with_weight("ln_f.weight", lambda w: w.to_sparse()), "'ln_f.weight' is a sparse_coo tensor, not a dense"),
    (with_weight("ln_f.weight", lambda w: w.tolist()), "'ln_f.weight' is a list, not a dense"),
    (lambda ckpt: ckpt.__setitem__("model", list(ckpt["model"])), "its model is a list, not a state dict"),
])
def test_a_checkpoints_weights_are_dense_tensors_of_real_floats(tmp_path, capsys, trained_dir, change, match):
    hand_made(trained_dir, tmp_path / "out", change)
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert "is not a checkpoint this gpt.py can load (TypeError: its " in message and match in message, message


def test_a_config_of_a_larger_model_than_the_weights_is_refused_before_that_model_is_made(
        tmp_path, capsys, trained_dir, monkeypatch):
    # A small file may name a model of gigabytes: it is made first where it takes no memory.
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: ckpt["config"].update(n_layer=3, n_embd=256))
    made = models_made(monkeypatch)
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert "(RuntimeError: Error(s) in loading state_dict for GPT: Missing key(s)" in message, message
    assert made == [(3, 256, "meta")]


def test_a_checkpoint_this_process_may_not_read_is_said_so_not_called_corrupt(trained_dir, monkeypatch):
    def refused(*args, **kwargs):  # as torch.load meets a file of mode 000 (root reads any file, so it is faked)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(torch, "load", refused)
    path = os.path.join(trained_dir, "ckpt.pt")
    with pytest.raises(ValueError, match=rf"^cannot read {re.escape(path)} \(Permission denied\): give this process "
                                         r"read access to it$"):
        checkpoint.load(path, "cpu")


def test_a_checkpoint_cut_short_anywhere_is_called_so_never_a_matter_of_read_access(trained_dir, tmp_path):
    whole = Path(trained_dir, "ckpt.pt").read_bytes()
    path = tmp_path / "ckpt.pt"
    said = set()
    for length in range(1, len(whole), len(whole) // 40):  # torch.load fails in several ways by where the cut is
        path.write_bytes(whole[:length])
        with pytest.raises(ValueError) as refused:
            checkpoint.load(str(path), "cpu")
        message = str(refused.value)
        assert "read access" not in message and message.endswith("train a new one with python train.py"), message
        said.add("cut short or damaged" in message)
    assert said == {True, False}  # torch's "Invalid argument" among its ways, said as the file's fault


def test_a_pipe_given_as_data_to_a_resume_is_refused_before_its_fingerprint_is_read(tmp_path, capsys, trained_dir):
    # A record of a file of 0 bytes (a run on a file of /proc) has the fingerprint looked for in any file of 0.
    # Read as another type than the record's, the file is looked for by its fingerprint.
    hand_made(trained_dir, tmp_path / "out", set_in(["data"], {"read_as": "uint8", "bytes": 0, "fingerprint": "x"}))
    os.mkfifo(tmp_path / "pipe.bin")
    unblocked = []  # a writer after a minute: without the check, the test fails instead of hanging
    writer = threading.Timer(60, lambda: unblocked.append(1) or (tmp_path / "pipe.bin").write_text("unblocked"))
    writer.daemon = True
    writer.start()
    try:
        flags = [f for f in tiny_flags(tmp_path, max_iters=4)[2:]]
        message = one_line_error(capsys, train, *flags, "--data", str(tmp_path / "pipe.bin"), "--dtype", "uint16",
                                 "--resume")
    finally:
        writer.cancel()
    assert message.endswith("pipe.bin (it is not a regular file): pass --data a file") and not unblocked, message


@pytest.mark.parametrize("field", ["norm", "n_head", "tie_weights"])
def test_a_checkpoint_whose_config_lacks_a_field_is_refused_not_given_todays_default(tmp_path, capsys, trained_dir,
                                                                                    field):
    # Its weights may fit today's default as well (RMSNorm's gain is LayerNorm's, 4 heads divide the width as 2 do):
    # the model would be another, in silence.
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: ckpt["config"].pop(field))
    for module, flags in ((sample, ["--max_new_tokens", "5"]), (train, ["--resume", "--max_iters", "4"])):
        message = one_line_error(capsys, module, "--out_dir", str(tmp_path / "out"), *flags)
        assert f"is not a checkpoint this gpt.py can load (ValueError: its config lacks {field})" in message, message


def nested(levels):
    deep = []
    for _ in range(levels):
        deep = [deep]
    return deep


def shared(levels):
    wide = []
    for _ in range(levels):
        wide = [wide, wide]  # pickled once a level: 2 ** levels lists written out
    return wide


def itself():
    loop = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize("keys, value, says", [
    (["train_config", "seed"], nested(5000), "nest more than 32 deep"),
    (["data"], nested(5000), "nest more than 32 deep"),
    (["iter"], nested(5000), "nest more than 32 deep"),
    (["tokenizer"], nested(5000), "nest more than 32 deep"),
    (["data"], itself(), "nest more than 32 deep"),
    (["train_config", "seed"], shared(25), "hold more than 1,000,000 dicts, lists and tuples, written out"),
], ids=["seed", "data", "iter", "tokenizer", "a list in itself", "one list shared, 25 deep"])
def test_values_a_message_cannot_show_are_one_line_not_a_recursion_error_or_a_hang(tmp_path, capsys, trained_dir, keys,
                                                                                 value, says):
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)  # for torch.save's pickler alone: the commands run at Python's own limit
    try:
        hand_made(trained_dir, tmp_path / "out", set_in(keys, value))
    finally:
        sys.setrecursionlimit(limit)
    out = str(tmp_path / "out")
    says = f"is not a checkpoint this gpt.py can load (ValueError: its values {says})"
    for module, args in [(train, [*tiny_flags(tmp_path, max_iters=4), "--resume"]), (sample, ["--out_dir", out]),
                         (sample, ["--report", "--out_dir", out, "--data", str(tmp_path / "data.txt")])]:
        message = one_line_error(capsys, module, *args)
        assert says in message, message


def test_a_checkpoint_of_compressed_records_is_refused_before_any_is_unpacked(tmp_path, capsys, trained_dir,
                                                                              monkeypatch):
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "ckpt.pt"
    shutil.copy(os.path.join(trained_dir, "ckpt.pt"), path)
    compressed(path)
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: pytest.fail("torch.load unpacked it"))
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert f"{path} is not a checkpoint this gpt.py can load (ValueError: its record 'archive/data.pkl' is " \
           f"compressed, which torch.save never does" in message, message


def test_a_byte_changed_on_the_disk_is_refused_by_its_records_checksum(tmp_path, capsys, trained_dir):
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "ckpt.pt"
    shutil.copy(os.path.join(trained_dir, "ckpt.pt"), path)
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    raw = bytearray(path.read_bytes())
    # A record's bytes follow its local header: 30 bytes, its name, and an extra field whose length is at 28.
    start = record.header_offset + 30 + len(record.filename.encode()) + int.from_bytes(
        raw[record.header_offset + 28:record.header_offset + 30], "little")
    raw[start + record.file_size // 2] ^= 0x10  # one bit of a weight: it would still load and train
    path.write_bytes(raw)
    says = f"{path} is not a checkpoint this gpt.py can load (ValueError: its record {record.filename!r} fails its "
    for module, args in [(train, [*tiny_flags(tmp_path, max_iters=4), "--resume"]),
                         (sample, ["--out_dir", str(tmp_path / "out")])]:
        message = one_line_error(capsys, module, *args)
        assert says in message, message


@pytest.mark.parametrize("protocol", [4, 5])
def test_a_pickle_torch_did_not_write_is_one_line_without_torchs_warnings(tmp_path, capsys, protocol):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(pickle.dumps({"model": {}}, protocol=protocol))
    with warnings.catch_warnings(record=True) as caught:  # torch warned of the pickle's protocol, in 2 lines
        warnings.simplefilter("always")
        message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert not caught and "is not a checkpoint this gpt.py can load" in message, message


@pytest.mark.parametrize("name", [5, ["bytes"], "b" * 1_000_000], ids=["an int", "a list", "a long name"])
def test_a_recorded_tokenizer_is_a_name_and_is_shown_short(tmp_path, capsys, trained_dir, name):
    def own_tokenizer(ckpt):
        del ckpt["chars"]
        ckpt["tokenizer"] = name

    hand_made(trained_dir, tmp_path / "out", own_tokenizer)
    message = one_line_error(capsys, sample, "--out_dir", str(tmp_path / "out"))
    assert len(message) < 300, len(message)
    if isinstance(name, str):
        assert f"trained on token ids of a tokenizer it only names ({name[:30]}... (1000000 characters))" in message
    else:
        assert (f"records its tokenizer as a {type(name).__name__}, not a name: it is damaged or hand-made" in message)


@pytest.mark.parametrize("how", ["without checksums", "in torch's older format"])
def test_a_checkpoint_torch_loads_with_no_checksum_to_read_is_not_called_damaged(tmp_path, capsys, trained_dir, how):
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "ckpt.pt"
    if how == "without checksums":
        writes_them = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)  # every record's checksum written as 0
        try:
            torch.save(ckpt, path)
        finally:
            torch.serialization.set_crc32_options(writes_them)
    else:
        torch.save(ckpt, path, _use_new_zipfile_serialization=False)
    assert data.zip_fault(str(path)) is None
    capsys.readouterr()
    sample.main(["--out_dir", str(tmp_path / "out"), "--start", "RO", "--max_new_tokens", "3", "--num_samples", "1"])
    assert capsys.readouterr().out.startswith("RO")
