"""Tests of report.py: the page train.py and sample.py write, and the progress line of a run."""
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import checkpoint
import gpt
import report
import sample
import train
import workbook
from conftest import HANG, HERE, SWITCHES, TEXT, tiny_model, tiny_flags, one_line_error, hand_made


def report_page(out_dir):
    return (Path(out_dir) / "report.html").read_text(encoding="utf-8")


def test_train_py_writes_a_report_page_and_sample_py_writes_it_again(tmp_path, capsys):
    train.main(tiny_flags(tmp_path, max_iters=12, eval_interval=4, n_layer=2))
    out, err = capsys.readouterr()
    assert err == "" and f"report: {tmp_path / 'out' / 'report.html'}" in out, err
    page = report_page(tmp_path / "out")
    assert page.count('<svg class="attention"') == 2 * 2  # one picture per layer and head
    for name in ("train", "val", "lr"):  # the curves, with a point per evaluation
        assert page.count(f'<polyline class="series {name}" data-points="3"') == (2 if name != "lr" else 1), name
    assert page.count('<polyline class="series val" data-points="16"') == 1  # a loss at each of 16 positions
    assert "http" not in page and "<script" not in page and "<link" not in page  # it fetches and runs nothing
    assert "bits per character" in page and "data:image/png;base64," in page
    os.remove(tmp_path / "out" / "report.html")
    capsys.readouterr()
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    assert capsys.readouterr().err == ""
    again = report_page(tmp_path / "out")
    assert again.count('<svg class="attention"') == 4 and again.count('data-points="3"') == 5  # 2 charts' curves
    # Another text (or this one changed) would give figures of other data beside the run's own losses.
    (tmp_path / "other.txt").write_text((tmp_path / "data.txt").read_text(encoding="utf-8")[::-1], encoding="utf-8")
    with open(tmp_path / "data.txt", "a", encoding="utf-8") as f:
        f.write("a line more")
    for text in ("other.txt", "data.txt"):
        message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"), "--data",
                                 str(tmp_path / text))
        assert message == (f"error: {tmp_path / 'out' / 'ckpt.pt'} was not trained on {tmp_path / text} as it is now "
                           f"(another file, or this one since changed): give --data the file it trained on, as it "
                           f"was then"), message
    assert report_page(tmp_path / "out") == again  # the run's own page stays


def test_sampling_runs_in_float32_on_a_cpu_with_bfloat16_and_under_gpt_autocast_on_a_gpu(monkeypatch):
    monkeypatch.setattr(gpt, "matmul_dtype", lambda device: torch.bfloat16)  # as on a CPU with AVX512-BF16
    assert gpt.autocast(torch.device("cpu"))._enabled and not report.sampling_autocast(torch.device("cpu"))._enabled
    monkeypatch.setattr(gpt, "autocast", lambda device: ("gpt.autocast", device.type))
    assert report.sampling_autocast(torch.device("cuda")) == ("gpt.autocast", "cuda")


def test_the_report_draws_every_value_inside_its_axes():
    for low, high in ((3.08, 4.41), (0.15, 0.37), (30, 90), (1e-4, 3e-3), (2.0, 2.0), (-1.5, 7.0)):
        ticks = report.nice_ticks(low, high)
        assert ticks[0] <= low and ticks[-1] >= high and 3 <= len(ticks) <= 12, (low, high, ticks)
    # A span too small to tell apart beside its values (5e-324 is the least float above 0) is drawn flat.
    for low, high in ((0.0, 5e-324), (1.0, 1.0 + 1e-12), (-5e-324, 0.0), (198069061234443.75, 198069061234443.78)):
        ticks = report.nice_ticks(low, high)
        assert ticks[0] <= low + 1e-9 and ticks[-1] >= high - 1e-9 and 2 <= len(ticks) <= 12, (low, high, ticks)
    png = report.png([[(255, 0, 0), (0, 0, 255)]])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"IHDR" in png and png.endswith(b"IEND\xaeB`\x82")


@pytest.mark.parametrize("name", SWITCHES)
def test_the_attention_weights_times_v_are_what_the_fused_attention_returns(name):
    model = tiny_model(**SWITCHES[name]).eval()
    idx = torch.randint(0, 13, (2, 10))
    inputs, fused = [], []
    for block in model.h:  # what each block's attention was given, and what its fused path returned
        block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[:2]))
        block.attn.c_proj.register_forward_pre_hook(lambda module, args: fused.append(args[0]))
    model(idx)
    maps = report.attention(model, idx)
    assert maps.shape == (2, 2, 2, 10, 10)  # (n_layer, B, n_head, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 2, 10))  # each row a distribution
    assert torch.all(maps.triu(1) == 0)  # none on later positions
    for layer, block in enumerate(model.h):
        _, _, v = block.attn.heads(*inputs[layer])
        weighted = (maps[layer] @ v).transpose(1, 2).reshape(2, 10, 16)  # (B, T, C)
        torch.testing.assert_close(weighted, fused[layer], rtol=1e-5, atol=1e-6)


def test_the_report_of_a_checkpoint_without_its_optimizers_states_is_drawn_from_its_model_and_evaluations(
        tmp_path, capsys, trained_dir):
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: [ckpt.pop(key) for key in ("optimizers", "rng", "elapsed")])
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    assert "wrote" in capsys.readouterr().out
    assert report_page(tmp_path / "out").count('<svg class="attention"') == 2


def test_the_report_draws_evaluations_from_the_least_float_above_zero_to_the_largest_a_checkpoint_may_hold(
        tmp_path, capsys, trained_dir):
    extremes = dict(train=1e15, val=5e-324, lr=5e-324, seconds=1e15)
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: ckpt["history"][0].update(extremes))
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    assert "wrote" in capsys.readouterr().out and report_page(tmp_path / "out").count("<svg") >= 2


def test_the_report_of_a_checkpoint_without_its_options_takes_the_models(tmp_path, capsys, trained_dir):
    hand_made(trained_dir, tmp_path / "out", lambda ckpt: ckpt.pop("train_config"))
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    assert "wrote" in capsys.readouterr().out  # not the defaults' block_size of 128 against the model's 16
    assert report_page(tmp_path / "out").count('<svg class="attention"') == 2


def test_a_report_that_cannot_be_written_says_the_checkpoint_is_saved_and_leaves_no_temporary_file(tmp_path, capsys,
                                                                                                    monkeypatch):
    flags = tiny_flags(tmp_path)
    checked = checkpoint.check_out_dir

    def then_a_folder(*args, **kwargs):  # one there at the start is refused then
        checked(*args, **kwargs)
        os.makedirs(tmp_path / "out" / "report.html")  # a folder where the page goes, made while the run trains

    monkeypatch.setattr(checkpoint, "check_out_dir", then_a_folder)
    message = one_line_error(capsys, train, *flags)
    assert re.search(r"cannot write .*report\.html \(Is a directory\): the report was not written; iteration 8 is "
                     r"saved in .*ckpt\.pt$", message), message
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt", "report.html", "train.lock"]
    message = one_line_error(capsys, sample, "--report", "--out_dir", str(tmp_path / "out"), "--data",
                             str(tmp_path / "data.txt"))
    assert "the report was not written; the checkpoint is as it was" in message, message
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt", "report.html", "train.lock"]


def test_tokens_per_second_are_read_over_the_last_stretch_of_the_run(tmp_path, capsys, trained_dir):
    def resumed(ckpt):  # 400 steps of 1 token in 1 s; then, resumed with 2,048 tokens a step, 10 in 0.5 s
        ckpt["train_config"].update(batch_size=16, block_size=16, grad_accum=8)
        ckpt["history"] = [dict(ckpt["history"][-1], iter=400, seconds=1.0),
                           dict(ckpt["history"][-1], iter=410, seconds=1.5)]
    hand_made(trained_dir, tmp_path / "out", resumed)
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    page = report_page(tmp_path / "out")
    assert "<th>tokens per second</th><td>40,960 over the last 10 steps (1 process)</td>" in page, page


def test_a_run_of_many_evaluations_draws_a_page_of_bounded_size(tmp_path, capsys, trained_dir):
    last = {}

    def evaluated_every_step(ckpt):
        last.update(ckpt["history"][-1])
        ckpt["history"] = [dict(last, iter=i, seconds=i / 100, train=2 + 1 / i, val=2.1 + 1 / i)
                           for i in range(1, 20_001)]
    hand_made(trained_dir, tmp_path / "out", evaluated_every_step)
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    sample.main(["--report", "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data.txt")])
    page = report_page(tmp_path / "out")
    # Train and val by step and by time, and the rate beside them: each through 1,001 points at most, the last
    # evaluation's among them, and no dot.
    assert len(page) < 1_000_000 and page.count('data-points="20000"') == 5, len(page)
    lines = re.findall(r'data-points="20000" points="([^"]*)"', page)
    xs = [[float(point.split(",")[0]) for point in points.split()] for points in lines]
    assert all(len(x) <= report.MAX_DRAWN + 1 and x[-1] == max(x) > x[-2] for x in xs), [len(x) for x in xs]
    assert page.count("<circle") < report.MAX_DOTS  # the loss by position's alone
    # No spike is thinned away: the highest and lowest of each run of points are kept.
    flat = [(x, 2.0) for x in range(3000)]
    flat[1234] = (1234, 9.0)
    assert (1234, 9.0) in report.thinned(flat) and len(report.thinned(flat)) <= report.MAX_DRAWN + 1


def test_an_axis_writes_its_ticks_with_as_many_digits_as_tell_them_apart():
    assert report.numbers([0.5, 1.0, 1.5]) == ["0.5", "1", "1.5"]
    ticks = report.nice_ticks(4.17430, 4.17445)
    assert len(set(report.numbers(ticks))) == len(ticks) > 2, report.numbers(ticks)
    ticks = report.nice_ticks(123456789, 123456799)
    assert report.numbers(ticks)[:2] == ["123456788", "123456790"], report.numbers(ticks)
    svg = report.chart("t", "x", "y", [("val", [(0, 4.17430), (1, 4.17445)])])
    said = re.findall(r'class="tick" text-anchor="end">([^<]*)<', svg)
    assert len(set(said)) == len(said) > 2, said


def test_the_attention_maps_line_is_the_first_tokens_where_the_held_out_texts_one_newline_ends_it():
    tokenizer = gpt.CharTokenizer("abcdefghijklmnop\n")
    val = torch.tensor(tokenizer.encode("abcdefghijklmnop\n"))  # nothing after its newline
    line = report.attention_line(tokenizer, val, 16, torch.device("cpu"))
    assert line.tolist() == [tokenizer.encode("abcdefghijklmnop")]
    val = torch.tensor(tokenizer.encode("abc\ndefg"))  # a line after it: that line
    assert report.attention_line(tokenizer, val, 16, torch.device("cpu")).tolist() == [tokenizer.encode("defg")]


def test_a_model_that_gives_a_token_no_chance_has_no_report_and_says_so_in_one_line(tmp_path, capsys, trained_dir,
                                                                                  monkeypatch):
    real = report.loss_by_position
    def infinite_at_3(*args):
        return real(*args).index_fill(0, torch.tensor([3]), math.inf)

    monkeypatch.setattr(report, "loss_by_position", infinite_at_3)
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    message = one_line_error(capsys, sample, "--report", "--out_dir", trained_dir, "--data", str(tmp_path / "data.txt"))
    assert message.endswith("the model's val loss at position 3 is inf: it gives some next token no chance at all, "
                            "so the report cannot draw it"), message


def test_a_page_written_over_a_file_keeps_that_files_permissions(tmp_path):
    path = tmp_path / "report.html"
    path.write_text("old", encoding="utf-8")
    for mode in (0o600, 0o640):  # a page kept private stays private when it is written again
        os.chmod(path, mode)
        report.write(str(path), f"<html>{mode}</html>")
        assert path.read_text(encoding="utf-8") == f"<html>{mode}</html>"
        assert os.stat(path).st_mode & 0o777 == mode
    assert os.listdir(tmp_path) == ["report.html"]


WRITER = """
import sys
sys.path.insert(0, {here!r})
import report
for _ in range(200):
    report.write({path!r}, "<html>" + {char!r} * 200_000 + "</html>")
"""


def test_concurrent_report_writers_leave_one_whole_page_and_no_temporary_file(tmp_path):
    path = str(tmp_path / "report.html")
    texts = ["<html>" + c * 200_000 + "</html>" for c in "ab"]  # large enough that a write takes a while
    writers = [subprocess.Popen([sys.executable, "-c", WRITER.format(here=HERE, path=path, char=c)]) for c in "ab"]
    assert [w.wait(timeout=HANG) for w in writers] == [0, 0]
    assert Path(path).read_text(encoding="utf-8") in texts and os.listdir(tmp_path) == ["report.html"]


def test_the_progress_line_times_the_steps_alone_leaving_out_each_one_an_evaluation_ran_before(monkeypatch):
    tc = gpt.TrainConfig(eval_interval=2, max_iters=604)
    trainer = types.SimpleNamespace(it=0, tc=tc, elapsed=0.0, lr=1e-3)
    # Made at 100 s; steps 1 to 4 end at these times, an evaluation of 5 s run after step 2.
    clock = iter([100.0, 100.5, 100.6, 105.7, 105.8])
    monkeypatch.setattr(report, "time", types.SimpleNamespace(time=lambda: next(clock)))
    progress = report.Progress(trainer, tokens_per_step=1000)
    for _ in range(4):
        trainer.it += 1
        progress.step()
    # Step 1 follows the evaluation at step 0 and step 3 the one at step 2: steps 2 and 4 are timed, 0.1 s each.
    assert progress.line(1.5) == ("iter 4/604 | loss 1.5000 | lr 1.00e-03 | 1000 tok/step | 100.0 ms/iter | "
                                  "10.0k tok/s | ETA 1.0 min")
    # No step timed since the last line: the time since it, by the steps since it.
    clock = iter([106.2])
    trainer.it += 1
    progress.step()
    assert "| 400.0 ms/iter |" in progress.line(1.5)


def test_ids_a_tokenizer_cannot_decode_are_shown_as_ids():
    class Short:
        def decode(self, ids):
            return {1: "a", 2: "b"}[ids[-1]]  # as tiktoken's KeyError for an id past its vocabulary
    assert report.decode(Short(), [1, 2]) == "b" and report.decode(Short(), [1, 50300]) == "1 50300"
    assert report.decode(None, [3, 4]) == "3 4"


def test_the_page_shows_controls_and_marks_that_turn_text_as_escapes(tmp_path, capsys):
    (tmp_path / "data.txt").write_text(TEXT.replace("e", "\x1b").replace("o", "\u202e"), encoding="utf-8")
    train.main(tiny_flags(tmp_path, max_iters=4, eval_interval=4))
    page = report_page(tmp_path / "out")
    assert "\x1b" not in page and "\u202e" not in page  # an escape to a terminal; a line turned right to left
    assert "\\x1b" in page and "\\u202e" in page  # in the sample and the attention maps' labels
    assert report.visible("a\tb\r\nc\ud800\ufffe\u00e9") == "a\tb\r\nc\\ud800\\ufffe\u00e9"
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # joined as one: a mark of text, not of direction
    assert report.visible(family) == family and report.labels(None, [5]) == ["5"]
    # Tag characters, which hide text in plain sight, are shown; the format characters of words (a zero-width space
    # between Thai words, a byte-order mark, a soft hyphen, a non-joiner) are not.
    hiding = "a\U000e0041\U000e007fb\u200bc\ufeffd\u00ade\u200cf"
    assert report.visible(hiding) == "a\\U000e0041\\U000e007fb\u200bc\ufeffd\u00ade\u200cf"
    assert workbook.visible(hiding) == report.visible(hiding) and workbook.visible(family) == family


def test_train_py_and_the_report_show_an_out_dirs_controls_as_escapes(tmp_path, capsys):
    # A path given may hold a terminal's escape: printed as one, it would drive the terminal.
    out_dir = str(tmp_path / "out\x1b[31m")
    train.main(tiny_flags(tmp_path, max_iters=4, eval_interval=2, out_dir=out_dir))
    said = capsys.readouterr().out
    assert "\x1b" not in said and f"saved iteration 4 to {tmp_path}/out\\x1b[31m/ckpt.pt" in said, said
    assert f"report: {tmp_path}/out\\x1b[31m/report.html" in said
    sample.main(["--report", "--out_dir", out_dir, "--data", str(tmp_path / "data.txt")])
    assert capsys.readouterr().out == f"wrote {tmp_path}/out\\x1b[31m/report.html: open it in a browser\n"
