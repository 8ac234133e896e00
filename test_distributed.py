"""Tests of train.py under torchrun: DDP in step with one process, and its faults."""
import contextlib
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

import cli
import distributed
import gpt
import train
from conftest import HERE, TEXT, HANG, tiny_model, tiny_train_config, tiny_flags, quiet, run_cli


def ddp_worker(rank, world, args, result_dir):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    # A file for the processes to meet at, not a port, which another program could take meanwhile; train.py joins
    # the group it finds.
    torch.distributed.init_process_group("gloo", init_method=f"file://{result_dir}/store", rank=rank, world_size=world)
    torch.set_num_threads(1)
    tc, given = args
    trainer, _ = train.run(tc, TEXT, quiet, resume=True, given=given)
    torch.save({"model": trainer.model.state_dict(), "history": trainer.history},
               os.path.join(result_dir, f"rank{rank}.pt"))


def run_ddp_command_lines(args):
    """Runs train.py once per process as torchrun would, with the environment torchrun sets, each
    process with its own command line; returns each one's (exit status, stderr)."""
    with held_port() as port:
        processes = []
        for rank, argv in enumerate(args):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(len(args)),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            processes.append(subprocess.Popen([sys.executable, "train.py", *argv], cwd=HERE, env=env, text=True,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        errors = [p.communicate(timeout=HANG)[1] for p in processes]
    return [(p.returncode, err) for p, err in zip(processes, errors)]


@contextlib.contextmanager
def held_port():
    """A free port, held until the processes are done with it: bound, not listening, with SO_REUSEADDR, which the
    first process's TCPStore sets too, so that it can bind the port meanwhile and no other program is given it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_ddp_trains_in_step_and_its_checkpoints_interchange_with_single_process(tmp_path):
    tc = tiny_train_config(tmp_path, max_iters=10, eval_interval=10, batch_size=16, block_size=32, n_embd=32,
                           learning_rate=6e-3)
    train.run(tc, TEXT, quiet)  # a single-process checkpoint at iteration 10 ...
    given = dict(max_iters=40, eval_interval=15, grad_accum=2)  # ... resumed by two processes, to 40
    torch.multiprocessing.spawn(ddp_worker, args=(2, (tc, given), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    # In step bit for bit: the processes share one machine and each averaged gradient, so they round alike.
    for name, p in ranks[0]["model"].items():
        assert torch.equal(p, ranks[1]["model"][name]), name
    losses = [(h["iter"], h["train"]) for h in ranks[0]["history"]]
    assert [it for it, _ in losses] == [10, 15, 30, 40] and losses[-1][1] < losses[0][1] - 0.1, losses
    # the first process alone wrote, and no temporary file was left
    assert sorted(os.listdir(tc.out_dir)) == ["ckpt.pt", "report.html", "train.lock"]
    model, _, _ = gpt.load_checkpoint(os.path.join(tc.out_dir, "ckpt.pt"), "cpu")  # no DDP prefixes in its names
    for name, p in model.state_dict().items():
        assert torch.equal(p, ranks[0]["model"][name]), name
    trainer, _ = train.run(tc, TEXT, quiet, resume=True, given=dict(max_iters=42))  # and one process resumes it
    assert trainer.it == 42


def test_ddp_averages_gradients_once_per_optimizer_step_with_grad_accum(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                                         world_size=1)
    try:
        idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(0))
        micro_batches = [(idx[:, :-1], idx[:, 1:])] * 3
        averaged = {}
        for grad_accum in (3, 1):
            ddp = distributed.AccumulatingDDP(tiny_model(), grad_accum)
            calls = []

            def count(state, bucket):  # a communication hook: runs once per bucket that is averaged
                calls.append(1)
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done

            ddp.register_comm_hook(None, count)
            optimizer = gpt.configure_optimizers(ddp.module, gpt.TrainConfig())
            for _ in range(2):
                gpt.train_step(ddp, optimizer, micro_batches)
            averaged[grad_accum] = len(calls)
        # the same buckets, averaged after the last of 3 micro-batches only, against after each of them
        assert averaged[3] > 0 and averaged[1] == 3 * averaged[3], averaged
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("fault, says, who", [
    ("missing", r"error: cannot read the data file .*missing\.txt \(No such file or directory\): pass --data a file "
                r"\(process 1 of 2\)", 1),
    ("new characters", r"error: process 1 of 2 has another vocabulary than process 0 \(its --data has other "
                       r"characters, or another tokenizer\): give every process the same --data", 0),
])
def test_a_fault_in_one_ddp_process_reaches_the_user_in_one_line_from_the_process_that_found_it(
        tmp_path, fault, says, who):
    flags = tiny_flags(tmp_path, max_iters=4)
    other = tmp_path / ("missing.txt" if fault == "missing" else "other.txt")
    if fault == "new characters":
        other.write_text(TEXT + "#", encoding="utf-8")
    args = [flags, [*flags, "--data", str(other)]]  # the second process's --data is not the first's
    ended = run_ddp_command_lines(args)
    assert re.fullmatch(says + "\n", ended[who][1]) and ended[1 - who][1] == "", ended
    assert [code for code, _ in ended] == [1, 1], ended  # not a signal: each ended as it said
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_under_torchrun_processes_with_other_options_and_a_lost_process_are_one_line(tmp_path):
    flags = tiny_flags(tmp_path, max_iters=4)
    ended = run_ddp_command_lines([flags, [*flags, "--learning_rate", "1e-3", "--grad_clip", "0.5"]])
    assert ended[0] == (1, "error: process 1 of 2 was given other options than process 0 (--learning_rate, "
                           "--grad_clip): give every process the same\n") and ended[1] == (1, ""), ended
    flags = tiny_flags(tmp_path, max_iters=10 ** 6, eval_interval=10 ** 5)
    processes = []
    with held_port() as port:
        for rank in range(2):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            processes.append(subprocess.Popen([sys.executable, "train.py", *flags, "--log_interval", "1"], cwd=HERE,
                                              env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for line in processes[0].stdout:
            if line.startswith("iter 5/"):
                break
        processes[1].kill()  # a worker lost mid-training
        processes[1].communicate(timeout=HANG)
        _, err = processes[0].communicate(timeout=HANG)
    assert processes[0].returncode == 1 and err.count("\n") == 1, err
    assert re.fullmatch(r"error: process 0 of 2 lost touch with the others at iteration \d+ \(.+\): another "
                        r"process stopped; the last checkpoint in .*out is as it was\n", err), err


def test_a_process_lost_while_the_processes_set_up_is_one_line_and_any_other_error_stays_itself(monkeypatch):
    def closed(*args):  # as Gloo's all_gather meets a peer killed while it loaded its data or weights
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                           "[127.0.0.1]:5555")

    monkeypatch.setattr(distributed.dist, "all_gather_object", closed)
    with pytest.raises(distributed.Failed) as failed:
        distributed.agree_on_setup(None, None, 1, 2)
    assert str(failed.value) == ("process 1 of 2 lost touch with the others while setting up (Connection closed by "
                                 "peer [127.0.0.1]:5555): another process stopped") and failed.value.shown
    with pytest.raises(ValueError, match="^its own fault$"):  # a process's own fault is still its to say
        distributed.agree_on_setup(ValueError("its own fault"), None, 1, 2)
    def bug(*args):
        raise RuntimeError("a bug's own words")

    monkeypatch.setattr(distributed.dist, "all_gather_object", bug)
    with pytest.raises(RuntimeError, match="^a bug's own words$"):  # a bug is no lost process
        distributed.agree_on_setup(None, None, 1, 2)


@pytest.mark.parametrize("env, expected", [
    ({}, (0, 0, 1)),
    ({"RANK": "1"}, (0, 0, 1)),  # a rank set alone: a single process
    ({"WORLD_SIZE": "1", "RANK": "3", "LOCAL_RANK": "3"}, (0, 0, 1)),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, (1, 1, 2)),
    ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, (3, 1, 4)),  # the second node's second process
    # Else each would wait for peers that never come, or train as one process in silence.
    ({"WORLD_SIZE": "2", "RANK": "5", "LOCAL_RANK": "0"}, "WORLD_SIZE '2', RANK '5', LOCAL_RANK '0': not as torchrun"),
    ({"WORLD_SIZE": "2", "RANK": "-1", "LOCAL_RANK": "0"}, "RANK '-1'"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "1"}, "LOCAL_RANK '1': not as torchrun"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE '0', RANK not set, LOCAL_RANK not set: not as torchrun sets them (whole "
                          "numbers, 0 <= LOCAL_RANK <= RANK < WORLD_SIZE <= 1,000,000,000): launch with torchrun"),
    ({"WORLD_SIZE": "abc", "RANK": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE 'abc'"),
    # Past what torch's store takes (a traceback), or past any run's processes (a wait for peers that never come).
    ({"WORLD_SIZE": str(2 ** 31), "RANK": "0", "LOCAL_RANK": "0"}, "< WORLD_SIZE <= 1,000,000,000): launch with"),
    ({"WORLD_SIZE": "9" * 20, "RANK": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE '99999999999999999999'"),
    ({"WORLD_SIZE": "2", "RANK": "1"}, "LOCAL_RANK not set"),
    ({"WORLD_SIZE": "2", "RANK": "\u00b2", "LOCAL_RANK": "1"}, "RANK '\u00b2'"),  # a digit, and no number int() reads
    ({"WORLD_SIZE": " 2", "RANK": "1", "LOCAL_RANK": "1"}, "WORLD_SIZE ' 2'"),  # int() reads it; torchrun never sets it
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "5"}, "LOCAL_RANK '5': not as torchrun"),
])
def test_torchruns_variables_are_read_as_it_sets_them_or_refused_in_one_line(monkeypatch, env, expected):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # cli reads them by the same rule (its parser leaves argparse's errors to the first process): a process that is
    # not torchrun's says what is wrong with its command line itself, never silenced as a second.
    assert cli.torchrun_ranks() == (expected if isinstance(expected, tuple) else None)
    if isinstance(expected, tuple):
        assert distributed.ranks() == expected
    else:
        with pytest.raises(ValueError, match=re.escape(expected)):
            distributed.ranks()


@pytest.mark.parametrize("env, match", [
    ({"MASTER_ADDR": "localhost", "MASTER_PORT": "abc"}, "at MASTER_ADDR 'localhost', MASTER_PORT 'abc' (invalid"),
    ({"MASTER_PORT": "29555"}, "at MASTER_ADDR not set, MASTER_PORT '29555' ("),
])
def test_a_rendezvous_address_torchrun_would_not_set_is_named_in_one_line(monkeypatch, env, match):
    # torch's words ("invalid literal for int() with base 10") name neither variable.
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **env}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(f"cannot join torchrun's job {match}")) as refused:
        with distributed.process_group(2, 0, "cpu"):
            pass
    assert str(refused.value).endswith("launch with torchrun --nproc_per_node=N train.py, which sets them")


@pytest.mark.parametrize("env, match", [
    (dict(WORLD_SIZE="2"), "WORLD_SIZE '2', RANK not set, LOCAL_RANK not set: not as torchrun sets them"),
    (dict(RANK="1"), "cannot read the data file"),  # a rank set alone: still a single process, which says what
])
def test_a_stray_distributed_environment_is_one_line(tmp_path, env, match):
    done = run_cli("train.py", "--data", str(tmp_path / "missing.txt"), "--out_dir", str(tmp_path), env=env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr


@pytest.mark.parametrize("argv, status, says", [
    (["--device", "tpu"], 1, "error: device 'tpu' is unknown or not on this machine"),
    (["--n_embd", "30", "--n_head", "4"], 1, "error: n_embd must be a multiple of n_head, twice that for rope: 8 here"),
    (["--max_iters", "0"], 2, "error: argument --max_iters: max_iters must be in [1, 1000000000], not 0"),
])
def test_under_torchrun_a_fault_every_process_finds_before_they_join_is_said_once_by_the_first(
        monkeypatch, capsys, argv, status, says):
    monkeypatch.setattr(os, "_exit", sys.exit)  # a DDP process's end ends this call, not the tests
    said = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv)
        said.append(capsys.readouterr().err)
        assert exit_info.value.code == status, said
    assert says in said[0] and said[0].count("\n") <= 1 and said[1] == "", said
