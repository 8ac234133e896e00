"""Rules over the whole project: its README, its lines, what it speaks of."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import gpt
import train
import conftest
from conftest import HANG, HERE, run_cli


def test_lines_are_at_most_100_characters_in_the_files_people_read_and_120_elsewhere():
    for path in sorted(Path(HERE).glob("*.py")) + sorted(Path(HERE, "fixtures").glob("*.py")):
        limit = 100 if path.name in ("gpt.py", "gpt_numpy.py") else 120
        wide = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > limit]
        assert not wide, (path.name, wide)


def test_the_project_speaks_of_itself_alone():
    outside = "/".join(["..", "shared"])  # the folder beside a checkout, which a user does not have
    for path in [*Path(HERE).glob("*.py"), Path(HERE, "README.md"), *Path(HERE, "docs").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        assert outside not in text, path.name
        if path.suffix == ".md":
            assert not re.search(r"\bsessions?\b|was lent|were lent", text), path.name


def test_the_readme_is_read_in_five_minutes_and_the_docs_it_links_to_exist():
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    assert len(readme) <= 10_000
    links = re.findall(r"\]\((docs/[^)]+)\)", readme)
    assert links and all(Path(HERE, link).is_file() for link in links), links


def readme_block(heading):
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", readme[readme.index(heading):], re.S).group(1)


def test_the_readme_block_runs_in_a_folder_with_only_gpt_py_and_input_txt(tmp_path):
    shutil.copy(os.path.join(HERE, "gpt.py"), tmp_path / "gpt.py")
    # The start of input.txt: the block runs as on all of it, but its last evaluation, of the whole held-out split,
    # reads 10,000 characters, not 480,000.
    text = Path(HERE, "input.txt").read_text(encoding="utf-8")[:100_000]
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    block = readme_block("## Using it from your own code")
    done = run_cli("-c", block, cwd=tmp_path, env={"PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert re.search(r"iter 25: train loss [\d.]+, val loss [\d.]+\niter 50: ",
                     done.stdout), done.stdout  # trained
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter"] == 50  # saved
    sample_text = done.stdout.split("\n", 2)[2]
    assert sample_text.startswith("Romeo.\n") and len(sample_text) >= 206  # loaded and sampled
    assert sorted(os.listdir(tmp_path)) == ["gpt.py", "input.txt", "out"]


def test_the_readme_block_on_your_own_tokens_runs_with_gpt_py_alone(tmp_path):
    shutil.copy(os.path.join(HERE, "gpt.py"), tmp_path / "gpt.py")
    block = readme_block("### Your own tokens")
    done = run_cli("-c", block, cwd=tmp_path, env={"PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "iter 25: train loss" in done.stdout and "bits per character" not in done.stdout, done.stdout
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["chars"] is None and ckpt["tokenizer"] == "bytes" and ckpt["config"]["vocab_size"] == 256


def test_the_model_sizes_and_counts_the_docs_give_are_those_of_the_code_and_input_txt():
    readme = Path(HERE, "README.md").read_text(encoding="utf-8")
    reference = " ".join(Path(HERE, "docs", "reference.md").read_text(encoding="utf-8").split())
    text = Path(HERE, "input.txt").read_text(encoding="utf-8")
    chars = len(set(text))
    sizes = {}
    for name, changes in (("cpu", {}), ("cuda", train.CUDA_DEFAULTS)):
        with torch.device("meta"):  # counted, never allocated
            model = gpt.GPT(gpt.TrainConfig(**changes).model_config(vocab_size=chars))
        sizes[name] = sum(p.numel() for p in model.parameters())
    assert f"trains a {sizes['cpu'] / 1e6:.2f}M-parameter GPT" in readme
    assert f"defaults to a {sizes['cuda'] / 1e6:.1f}M-parameter model" in readme
    table = gpt.GPTConfig().bigram * gpt.GPTConfig().n_embd
    assert f"({table / 1e6:.2f}M of the default model's {sizes['cpu'] / 1e6:.2f}M)" in reference
    assert f"(`input.txt`, the default text, has {chars};" in reference
    held_out = len(gpt.split(text)["val"])
    assert f"all of `input.txt`'s {held_out:,} held-out characters, {held_out - 1:,} of them predicted" in reference


def test_the_two_lanes_report_every_test_and_a_failure_or_a_lost_lane_fails_the_run(tmp_path):
    """python -m pytest with no test named runs conftest.SECOND_LANE's files in a second process: its tests count
    as the first lane's do, and a failure there, or that process lost or ended before its tests did, fails the run."""
    second = conftest.SECOND_LANE[0]
    suites = {  # the second lane's file in each suite; the first lane's fails one test of two
        "killed": "def test_passes():\n    pass\n\n\ndef test_fails():\n    assert 0, 'in the second lane'\n\n\n"
                  "@pytest.mark.skip(reason='a reason')\ndef test_skipped():\n    pass\n\n\n"
                  "def test_lost():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
        "ended": "def test_passes():\n    pass\n\n\ndef test_ends():\n    os._exit(0)\n\n\n"
                 "def test_never_run():\n    pass\n",
    }
    runs = {}
    for name, tests in suites.items():
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(os.path.join(HERE, "conftest.py"), folder)
        os.symlink(os.path.join(HERE, "input.txt"), folder / "input.txt")  # which conftest reads
        (folder / "test_first.py").write_text("def test_passes():\n    pass\n\n\ndef test_fails():\n    assert 0\n")
        (folder / second).write_text("import os\nimport signal\n\nimport pytest\n\n\n" + tests)
        runs[name] = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"],
                                      cwd=folder, env={**os.environ, "PYTHONPATH": HERE}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
    said = {name: run.communicate(timeout=HANG)[0] for name, run in runs.items()}
    assert all(run.returncode == 1 for run in runs.values()), said
    out = said["killed"]
    assert "2 failed, 2 passed, 1 skipped, 1 error in" in out, out
    assert "FAILED test_first.py::test_fails" in out and f"FAILED {second}::test_fails - AssertionError: in the" in out
    assert f"SKIPPED [1] {second}:" in out and ": a reason" in out, out
    assert f"ERROR the second lane ({second})" in out and "it ended with status -9, 3 of its 4 tests reported" in out
    out = said["ended"]
    assert "1 failed, 2 passed, 1 error in" in out and "it ended with status 0, 1 of its 3 tests reported" in out, out
