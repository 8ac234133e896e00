"""Fixtures and helpers shared by the test files. Run the tests: python -m pytest -q

A timeout here only catches a hang: every one is minutes, far beyond what a slow, busy machine takes.

The whole suite runs in two lanes, one a core (see "two lanes" below): most tests are one Python process's work.
"""
import contextlib
import dataclasses
import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile
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


def assert_greedy(model, tokens, prompt_length):
    """Each of tokens (B, T) past the prompt is the likeliest next token by a full forward over the ones before it
    (the last block_size of them): what greedy sampling through the KV cache must give. Two tokens within float32's
    rounding of each other may go either way, as the cache and a full forward sum in other orders on other CPUs."""
    context = model.config.block_size
    with torch.no_grad():
        for t in range(prompt_length, tokens.size(1)):
            logits = model(tokens[:, max(0, t - context):t])[0][:, -1].float()  # (B, vocab_size)
            picked = logits.gather(-1, tokens[:, t:t + 1])[:, 0]
            slack = 1e-5 * (1 + logits.abs().max())
            assert (picked >= logits.max(-1).values - slack).all(), (t, picked, logits.max(-1))


def compressed(path):
    """The zip file torch.save wrote at path, written again with every record deflated, as only a hand-made file has
    them: each could unpack to far more than its bytes."""
    with zipfile.ZipFile(path) as archive:
        records = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in records:
            archive.writestr(name, content)


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
# python -m pytest with no test named runs these files in a second pytest process, started as this one starts the
# rest, and replays its reports here as its own: most tests are a Python process's work on one core, so the two
# lanes take about half the time of one. The files are split by their measured time, about half each.
SECOND_LANE = ("test_gpt_numpy.py", "test_bench.py", "test_project.py", "test_cli.py")
# Set for the second lane: the file descriptor its records go to, pickled one after another, and the first lane's
# process id.
LANE_REPORTS = "GPT_TESTS_LANE_REPORTS"
# The first lane's hold on the second: (its files' paths, how many of its tests run), or None.
LANE = pytest.StashKey()


def two_lanes(config):
    """Whether this run splits in two: the whole suite, no test named, run straight through: not to debug, step,
    stop at a failure (-x), rerun the last failures, show setups, print or log as it goes (-s, tee-sys, live logs),
    nor given a --basetemp (each pytest process empties it); on a POSIX system, whose process groups and inherited
    files the lanes use."""
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    alone = ("collectonly", "usepdb", "trace", "setupplan", "setuponly", "setupshow", "basetemp", "maxfail",
             "stepwise", "stepwise_skip", "lf", "failedfirst", "debug", "log_cli_level")
    shown = config.option.capture in ("no", "tee-sys") or config.getini("log_cli")
    one = named or shown or any(config.getoption(name, None) for name in alone)
    return os.name == "posix" and not one


def in_second_lane(item):
    return item.path.parent == Path(HERE) and item.path.name in SECOND_LANE


class LaneRecords:
    """The second lane's plugin: each report, and the run's end, also go to the first lane, pickled."""

    def __init__(self, config, fd):
        self.config = config
        self.file = os.fdopen(fd, "wb")

    def pytest_runtest_logreport(self, report):
        self.write("report", self.config.hook.pytest_report_to_serializable(config=self.config, report=report))

    def pytest_collectreport(self, report):
        if report.failed:
            self.write("report", self.config.hook.pytest_report_to_serializable(config=self.config, report=report))

    def pytest_warning_recorded(self, warning_message, when, nodeid, location):
        # Those of collecting and configuring, the first lane met as well.
        if when != "runtest":
            return
        w = warning_message
        category = (w.category.__module__, w.category.__qualname__)
        self.write("warning", dict(text=str(w.message), category=category, filename=w.filename, lineno=w.lineno,
                                   when=when, nodeid=nodeid, location=location))

    def pytest_sessionfinish(self, session, exitstatus):
        self.write("end", int(exitstatus))

    def write(self, kind, data):
        pickle.dump((kind, data), self.file)
        self.file.flush()


def watch_first_lane(first):
    """In the second lane: once the first lane is gone (killed, so it could not stop this one), ends this lane and
    every process its tests started."""
    while os.getppid() == first:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)


def pytest_configure(config):
    config.stash[LANE] = None
    # Taken out of the environment, so that a pytest a test starts is no lane of this run.
    second = os.environ.pop(LANE_REPORTS, None)
    if second is not None:
        fd, first = map(int, second.split())
        os.set_inheritable(fd, False)  # the tests' own processes hold no records
        config.pluginmanager.register(LaneRecords(config, fd))
        threading.Thread(target=watch_first_lane, args=(first,), daemon=True).start()
    if second is not None or two_lanes(config):
        # One thread a process, the tests' own processes too: two lanes of two threads would outnumber two cores,
        # and torch's waiting threads spin.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Leaves the second lane's tests to it: last, once -k, -m and the like have chosen them, as they choose them
    there."""
    second = [item for item in items if in_second_lane(item)]
    if not (two_lanes(config) and second):
        return
    paths = sorted({str(item.path) for item in second})
    config.stash[LANE] = (paths, len(second))
    items[:] = [item for item in items if not in_second_lane(item)]


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """Starts the second lane, runs this one's tests, then replays the second's reports as if they ran here (those it
    wrote before a Ctrl-C too). A second lane that ended otherwise than its reports say (killed, a test's os._exit,
    pytest's own error) fails the run, with the end of what it printed."""
    config = session.config
    lane = config.stash[LANE]
    # A file that failed to import stops the run before its tests: no second lane to start.
    if lane is None or (session.testsfailed and not config.option.continue_on_collection_errors):
        return (yield)
    paths, tests = lane
    session.testscollected += tests  # the progress counts the tests of both lanes
    records = tempfile.TemporaryFile()
    output = tempfile.TemporaryFile()
    # Python's own options (-W, -X dev, -O) as this process has them: the helper multiprocessing uses.
    python = [sys.executable, *subprocess._args_from_interpreter_flags()]
    args = [*python, "-m", "pytest", *config.invocation_params.args, f"--rootdir={config.rootpath}", *paths]
    # A session of its own: its tests' processes end with it.
    proc = subprocess.Popen(args, cwd=config.invocation_params.dir, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, pass_fds=(records.fileno(),), start_new_session=True,
                            env={**os.environ, LANE_REPORTS: f"{records.fileno()} {os.getpid()}"})
    try:
        result = yield
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a run stopped here (Ctrl-C, -x) stops the second lane too
        proc.wait()
        end, ended, failed = replay(session, records)
        records.close()
    if end not in (0, 1, 5) or (end == 0 and ended < tests) or (end == 1 and not failed) or (end == 5 and tests):
        output.seek(0)
        said = (f"it ended with status {proc.returncode}, {ended} of its {tests} tests reported; the end of what it "
                f"printed:\n{output.read()[-3000:].decode(errors='replace')}")
        name = f"the second lane ({', '.join(os.path.basename(path) for path in paths)})"
        config.hook.pytest_collectreport(report=pytest.CollectReport(name, "failed", said, []))
    output.close()
    return result


def replay(session, records):
    """The second lane's records through this run's hooks; (the status it ended with, or None where it wrote none,
    how many of its tests it reported to their end, whether any failed)."""
    hook = session.config.hook
    end, ended, failed = None, 0, False
    records.seek(0)
    while True:
        try:
            kind, data = pickle.load(records)
        # The end of the records, or one cut short as its process was killed.
        except (EOFError, pickle.UnpicklingError):
            return end, ended, failed
        if kind == "end":
            end = data
            continue
        if kind == "warning":
            hook.pytest_warning_recorded.call_historic(kwargs=dict(
                warning_message=warning_of(data), when=data["when"], nodeid=data["nodeid"], location=data["location"]))
            continue
        report = hook.pytest_report_from_serializable(config=session.config, data=data)
        failed = failed or report.failed
        if isinstance(report, pytest.CollectReport):
            hook.pytest_collectreport(report=report)
            continue
        if report.when == "setup":
            hook.pytest_runtest_logstart(nodeid=report.nodeid, location=report.location)
        hook.pytest_runtest_logreport(report=report)
        if report.when == "teardown":
            hook.pytest_runtest_logfinish(nodeid=report.nodeid, location=report.location)
            ended += 1


def warning_of(data):
    """The warnings.WarningMessage the second lane recorded, its category found here (or UserWarning)."""
    module, name = data["category"]
    category = getattr(sys.modules.get(module), name, None)
    if not (isinstance(category, type) and issubclass(category, Warning)):
        category = UserWarning
    return warnings.WarningMessage(category(data["text"]), category, data["filename"], data["lineno"])
