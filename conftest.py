"""Fixtures and helpers shared by the test files. Run the tests: python -m pytest -q

A timeout here only catches a hang: every one is minutes, far beyond what a slow, busy machine takes.

The whole suite runs in two lanes, one a core (see "two lanes" below): most tests are one Python process's work.
"""
import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

import gpt
import gpt2
import gpt_numpy
import report
import train

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = dict(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)
SWITCHES = {  # every architecture switch appears on and off
    "llama": dict(),
    "gpt2": dict(norm="layernorm", pos="learned", mlp="gelu", tie_weights=True, bias=True, bigram=0),
    "mix": dict(norm="layernorm", pos="rope", mlp="gelu", tie_weights=False, bias=True, bigram=0),
    "mix2": dict(norm="rmsnorm", pos="learned", mlp="swiglu", tie_weights=False, bias=False),
}
TEXT = Path(HERE, "input.txt").read_text(encoding="utf-8")[:30_000]
FIXTURE = os.path.join(HERE, "fixtures", "tiny_gpt2")
# A limit for a subprocess: it only catches a hang.
HANG = 600


def tiny_model(seed=0, **overrides):
    """A small gpt.GPT, its bigram table (where it has one) moved off its zeros, as training moves it, so that a test
    sees what it adds."""
    torch.manual_seed(seed)
    model = gpt.GPT(gpt.GPTConfig(**{**TINY, **overrides}))
    if model.bigram is not None:
        torch.nn.init.normal_(model.bigram.weight, std=0.02)
    return model


def tiny_train_config(tmp_path, **overrides):
    return gpt.TrainConfig(**{**dict(out_dir=str(tmp_path / "out"), max_iters=8, eval_interval=4, eval_iters=2,
                                     batch_size=4, block_size=16, n_layer=1, n_head=2, n_embd=16, warmup_iters=2,
                                     device="cpu"), **overrides})


def tiny_flags(tmp_path, **overrides):
    """The command line of tiny_train_config, with its text in tmp_path/data.txt."""
    data = tmp_path / "data.txt"
    if not data.exists():
        data.write_text(TEXT, encoding="utf-8")
    tc = tiny_train_config(tmp_path, **overrides)
    defaults = gpt.TrainConfig()
    return ["--data", str(data)] + [f"--{f.name}={getattr(tc, f.name)}" for f in dataclasses.fields(tc)[1:]
                                    if getattr(tc, f.name) != getattr(defaults, f.name)]


def quiet(*args, **kwargs):
    pass


def run_cli(*args, cwd=HERE, env=None, **kwargs):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=HANG,
                          env=None if env is None else {**os.environ, **env}, **kwargs)


def one_line_error(capsys, module, *args):
    """Runs module.main(args) in this process; returns its one-line error, after checking that it is one."""
    with pytest.raises(SystemExit) as exit_info:
        module.main(list(args))
    code = exit_info.value.code
    message = code if isinstance(code, str) else capsys.readouterr().err.strip()
    assert code not in (0, None) and message and "\n" not in message.strip() and "Traceback" not in message, message
    return message


def interrupted(args, after_line, after_file=None, env=None):
    """Runs python args, sends it Ctrl-C once a line of its output starts with after_line and, when after_file is
    given, once a file matching that glob pattern exists (polled, as it appears); returns (exit status, stdout,
    stderr)."""
    proc = subprocess.Popen([sys.executable, *args], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=None if env is None else {**os.environ, **env},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell
    said = ""
    for line in proc.stdout:
        said += line
        if line.startswith(after_line):
            break
    while after_file and not glob.glob(after_file):
        assert proc.poll() is None, "it ended before the file appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=HANG)
    return proc.returncode, said + out, err


class ByteTokenizer:
    """A tokenizer of another kind than gpt.py's: one token per UTF-8 byte."""
    name = "bytes"
    vocab_size = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------------- a trained run
def signal_at(monkeypatch, at):
    """SIGTERM raised at the at-th event of a run where a scheduler's signal can land: a call of gpt.Trainer.batch
    (a step's batch) or of gpt.split_loss (an evaluation reads the train split, then the val split). Returns a
    function that puts both back."""
    real_batch, real_loss, calls = gpt.Trainer.batch, gpt.split_loss, []

    def counted(real):
        def call(*args):
            calls.append(1)
            if len(calls) == at:
                signal.raise_signal(signal.SIGTERM)
            return real(*args)
        return call

    monkeypatch.setattr(gpt.Trainer, "batch", counted(real_batch))
    monkeypatch.setattr(gpt, "split_loss", counted(real_loss))
    return lambda: (monkeypatch.setattr(gpt.Trainer, "batch", real_batch),
                    monkeypatch.setattr(gpt, "split_loss", real_loss))


def signal_after_line(monkeypatch, signum, prefix="iter 3/"):
    """Sends signum to this process once train.py has made its progress line starting with prefix, as a scheduler
    would after it. First it checks that the run holds a handler of its own for the signal: a missing one fails the
    test instead of ending the tests' process."""
    real_line = report.Progress.line

    def line_then_signal(progress, loss):
        said = real_line(progress, loss)
        if said.startswith(prefix):
            assert signal.getsignal(signum) not in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler)
            os.kill(os.getpid(), signum)
        return said

    monkeypatch.setattr(report.Progress, "line", line_then_signal)


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trained")
    train.run(tiny_train_config(tmp_path, max_iters=2), TEXT, quiet)
    return str(tmp_path / "out")


def hand_made(trained_dir, folder, change):
    """A copy of the trained checkpoint, changed by change(ckpt), in folder/ckpt.pt."""
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=True)
    change(ckpt)
    os.makedirs(folder, exist_ok=True)
    torch.save(ckpt, os.path.join(folder, "ckpt.pt"))


def set_in(keys, value):
    def change(ckpt):
        target = ckpt
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


# ---------------------------------------------------------------------------------------------------- GPT-2's fixture
def fixture_weights():
    return gpt2.read_safetensors(os.path.join(FIXTURE, "model.safetensors"))


def fixture_logits():
    """The fixture's fixed ids, and the logits transformers computed for them (fixtures/make_tiny_gpt2.py)."""
    with open(os.path.join(FIXTURE, "logits.json"), encoding="utf-8") as f:
        computed = json.load(f)
    return torch.tensor(computed["ids"]), torch.tensor(computed["logits"])


# ---------------------------------------------------------------------------------------------------- the NumPy twin
TWIN_CONFIGS = {  # B=3, T=7 < block_size=8
    "gpt2": dict(norm="layernorm", pos="learned", mlp="gelu", tie_weights=True, bias=True, bigram=0),
    "llama": dict(norm="rmsnorm", pos="rope", mlp="swiglu", tie_weights=False, bias=False, bigram=40),
    "mix": dict(norm="layernorm", pos="rope", mlp="swiglu", tie_weights=True, bias=True, bigram=0),
    "mix2": dict(norm="rmsnorm", pos="learned", mlp="gelu", tie_weights=False, bias=False, bigram=200),
}


def twin_pair(name, dtype=torch.float64):
    """A torch model with weights moved off their init values, the twin on copies of them, and a batch."""
    config = gpt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, **TWIN_CONFIGS[name])
    model = tiny_model(seed=3, **vars(config)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))  # norm gains away from 1, biases away from 0
    gen = torch.Generator().manual_seed(4)
    idx, targets = torch.randint(0, 5, (3, 7), generator=gen), torch.randint(0, 11, (3, 7), generator=gen)
    assert len(idx.unique()) < idx.numel()  # repeated tokens: their embedding gradients must add up
    twin = gpt_numpy.GPT(config, {n: p.detach().numpy().copy() for n, p in model.named_parameters()})
    return model, twin, idx, targets


def zero_gradient(name, config):
    """Whether name's gradient is zero in exact arithmetic: the keys' bias, with learned positions, adds q.b to every
    score of a query's row, which softmax ignores. The twin and torch hold rounding noise there, which has no scale of
    its own: it is measured against the model's largest gradient entry."""
    return name.endswith("attn.c_k.bias") and config.pos == "learned"


def models_made(monkeypatch):
    """A list that each gpt.GPT made from now on adds itself to: (n_layer, n_embd, the device it was made on)."""
    made = []
    real_init = gpt.GPT.__init__

    def init(model, config):
        made.append((config.n_layer, config.n_embd, torch.empty(0).device.type))
        real_init(model, config)

    monkeypatch.setattr(gpt.GPT, "__init__", init)
    return made


# ---------------------------------------------------------------------------------------------------- two lanes
# python -m pytest with no test named runs these files in a second pytest process, started before this one runs the
# rest, and shows its reports here as its own: most tests are a Python process's work on one core, so the two lanes
# take about half the time of one. The files are split by their measured time, about half each.
SECOND_LANE = ("test_gpt_numpy.py", "test_bench.py", "test_project.py", "test_cli.py")
# Set in the second lane: the file its reports go to, one JSON object a line.
LANE_REPORTS = "GPT_TESTS_LANE_REPORTS"
# The first lane's hold on the second: (its files, its tests, its process, its reports' file, its output, both
# lanes' tests).
LANE = pytest.StashKey()


def two_lanes(config):
    """Whether this run splits in two: the whole suite (no test named), not one to debug or collect, nor a lane, nor
    one given a --basetemp (which each pytest process empties as it starts)."""
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    one = config.option.collectonly or config.option.usepdb or config.option.basetemp
    return not (named or one or os.environ.get(LANE_REPORTS))


class LaneReports:
    """The second lane's plugin: each report also goes, as one line, to the file the first lane reads."""

    def __init__(self, config, path):
        self.config = config
        self.path = path

    def pytest_runtest_logreport(self, report):
        self.write(report)

    def pytest_collectreport(self, report):
        # A test file that fails to import: the first lane shows the error, and the run fails.
        if report.failed:
            self.write(report)

    def write(self, report):
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(data) + "\n")


def pytest_configure(config):
    config.stash[LANE] = None
    if os.environ.get(LANE_REPORTS):
        config.pluginmanager.register(LaneReports(config, os.environ[LANE_REPORTS]))
    if two_lanes(config) or os.environ.get(LANE_REPORTS):
        # One thread a process, the tests' own processes too: two lanes of two threads would outnumber two cores,
        # and torch's waiting threads spin.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Starts the second lane on its files, which this process then leaves to it: last, once -k, -m and the like
    have chosen the tests, as they choose them there."""
    files = sorted({item.path.name for item in items if item.path.name in SECOND_LANE})
    if not (two_lanes(config) and files):
        return
    reports = tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".jsonl", delete=False)
    output = tempfile.TemporaryFile("w+")
    args = [sys.executable, "-m", "pytest", *config.invocation_params.args, *files]
    proc = subprocess.Popen(args, cwd=config.invocation_params.dir, stdout=output, stderr=subprocess.STDOUT,
                            env={**os.environ, LANE_REPORTS: reports.name})
    second = [item for item in items if item.path.name in SECOND_LANE]
    config.stash[LANE] = (files, len(second), proc, reports, output, len(items))
    items[:] = [item for item in items if item.path.name not in SECOND_LANE]


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """This lane's tests, then the second lane's reports, shown as if they ran here. A second lane that ended
    without its reports (killed, or pytest's own error) fails the run, with the end of what it printed."""
    lane = session.config.stash[LANE]
    if lane is None:
        return (yield)
    files, tests, proc, reports, output, collected = lane
    ended = 0
    session.testscollected = collected  # the progress counts the tests of both lanes
    try:
        result = yield
        code = proc.wait()
    finally:
        proc.kill()  # a run stopped here (Ctrl-C, -x) stops the second lane too
        proc.wait()
        os.unlink(reports.name)  # read on through the open file
    hook = session.config.hook
    with reports:
        for line in reports:
            report = hook.pytest_report_from_serializable(config=session.config, data=json.loads(line))
            if isinstance(report, pytest.CollectReport):
                hook.pytest_collectreport(report=report)
                continue
            if report.when == "setup":
                hook.pytest_runtest_logstart(nodeid=report.nodeid, location=report.location)
            hook.pytest_runtest_logreport(report=report)
            if report.when == "teardown":
                hook.pytest_runtest_logfinish(nodeid=report.nodeid, location=report.location)
                ended += 1
    # pytest's codes for tests that all passed, some failed, or none collected; all passed is each test's end
    # reported (a test may end its process with status 0: os._exit(0)).
    if code not in (0, 1, 5) or (code == 0 and ended < tests):
        output.seek(0)
        said = (f"it ended with status {code}, {ended} of its {tests} tests reported; the end of what it printed:\n"
                f"{output.read()[-3000:]}")
        name = f"the second lane ({', '.join(files)})"
        hook.pytest_collectreport(report=pytest.CollectReport(name, "failed", said, []))
    return result
