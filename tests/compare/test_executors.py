"""Issue 20: the executors. submitit (its local executor: the same code path as SLURM) and Ray (a
local instance started on 127.0.0.1) reproduce the local executor's records; the sbatch script of a
2-node x 8-GPU unit asks for its resources and launches one task per GPU; a dry run prints the plan."""
import os
import re
import subprocess

import pytest

from vlkit.cli import main
from vlkit.runtime import free_port

from compare_helpers import records, untimed

SMALL = ["compare=smoke", "compare.seeds=[0]", "compare.tasks=[vqa,nlvr2]", "progress=false"]  # threads: the default
# the executors' runs: one family's 5 units (a pre-training, its 2 fine-tunings and 2 scratch ones), two at a time
ONE_RUN = [*SMALL, "compare.runs=[{name: uniter, model: {name: uniter, preset: tiny}, objectives: uniter}]"]


@pytest.fixture(scope="module")
def local_records(tmp_path_factory):
    root = tmp_path_factory.mktemp("executors")
    assert main(["compare", *ONE_RUN, f"output_dir={root / 'local'}", f"cache_dir={root / 'cache'}", "workers=2"]) == 0
    return root, [untimed(r) for r in records(root / "local")]


def test_every_unit_runs_on_one_torch_thread_by_default(local_records):
    """A spawned worker starts with torch's default (every core): two of them on two cores, each with two
    threads, ran the default comparison many times slower. `threads` null means one per unit."""
    root, _ = local_records
    logs = [p.read_text() for p in (root / "local" / "runs").glob("*/*/*/unit.log")]
    assert logs and all(re.search(r"^--- .*: attempt \d+, pid \d+, 1 torch thread\(s\)$", log, re.M) for log in logs)


@pytest.mark.slow
def test_submitit_local_executor_reproduces_the_local_records(local_records):
    root, expected = local_records
    out = root / "slurm"
    assert main(["compare", *ONE_RUN, f"output_dir={out}", f"cache_dir={root / 'cache'}", "compare.executor=slurm",
                 "compare.slurm.cluster=local", "compare.slurm.array_parallelism=2", "compare.slurm.timeout_min=30"]) == 0
    assert [untimed(r) for r in records(out)] == expected
    assert list((out / "slurm").glob("*/*_result.pkl"))  # submitit's own job folders: the jobs really ran there


@pytest.mark.slow
def test_ray_executor_reproduces_the_local_records(local_records):
    ray = pytest.importorskip("ray")
    root, expected = local_records
    port = free_port()
    # Ray >= 2.60: a local ray.init() writes a token to ~/.ray and turns token auth on, `ray start` does when one
    # is there, and a driver given an address sends it only under RAY_AUTH_MODE=token: keep auth off, $HOME as is
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    started = subprocess.run(["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                              "--include-dashboard=false", "--disable-usage-stats"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        out = root / "ray"
        assert main(["compare", *ONE_RUN, f"output_dir={out}", f"cache_dir={root / 'cache'}", "compare.executor=ray",
                     f"compare.ray.address=127.0.0.1:{port}", "compare.ray.max_concurrent=2"]) == 0
        assert [untimed(r) for r in records(out)] == expected
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_sbatch_script_of_a_two_node_eight_gpu_unit(tmp_path, monkeypatch):
    """The script submitit hands to sbatch for one unit (a stand-in sbatch keeps it): its resources, the
    requeue signal and one task per GPU launched by srun."""
    from vlkit.compare.executors import ExecutorSettings, SlurmExecutor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/submitted.sh\necho "Submitted batch job 4242"\n')
    for tool in ("srun", "scancel", "sacct", "squeue"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    cfg = {"threads": 4, "workers": 1, "compare": {"gpus_per_unit": 8, "slurm": {
        "partition": "learnfair", "nodes": 2, "gpus_per_node": 8, "cpus_per_task": 10, "mem_gb": 480,
        "timeout_min": 4320, "account": "vl", "qos": "high", "constraint": "volta32gb", "array_parallelism": 16}}}
    executor = SlurmExecutor(plan, ExecutorSettings(cfg))
    executor.submit("uniter/seed0/pretrain")
    script = (tmp_path / "submitted.sh").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --cpus-per-task=10", "#SBATCH --mem=480GB", "#SBATCH --time=4320",
                 "#SBATCH --partition=learnfair", "#SBATCH --account=vl", "#SBATCH --qos=high",
                 "#SBATCH --constraint=volta32gb", "#SBATCH --signal=USR2@90", "#SBATCH --job-name=vlkit-compare"):
        assert line in script, (line, script)
    launch = [line for line in script.splitlines() if line.startswith("srun")]
    assert len(launch) == 1 and "-m submitit.core._submit" in launch[0], script
    assert executor.slots == 16


def test_unknown_slurm_key_is_refused():
    from vlkit.compare.executors import ExecutorSettings, slurm_parameters

    with pytest.raises(KeyError, match="compare.slurm: unknown key.s. partiton"):
        slurm_parameters(ExecutorSettings({"compare": {"slurm": {"partiton": "x"}}}))


def test_dry_run_prints_every_unit_and_the_cost_per_executor(capsys, cache, monkeypatch):
    from vlkit.train import pipeline

    precisions, batches = [], {"pretrain_model": set(), "finetune_task": set()}
    for name in ("pretrain_model", "finetune_task"):
        def spy(env, model, what, trainer, *args, real=getattr(pipeline, name), name=name, **kwargs):
            precisions.append(trainer["mixed_precision"])
            batches[name].add(trainer["batch_size"])
            return real(env, model, what, trainer, *args, **kwargs)
        monkeypatch.setattr(pipeline, name, spy)
    import torch

    from vlkit.compare import estimate

    monkeypatch.setattr(estimate, "gemm_gflops", lambda: 123.4)
    args = ["compare", *SMALL, f"cache_dir={cache}", "dry_run=true", "compare.plan.method=probe",
            "+compare.trainer.common.mixed_precision=bf16",
            "compare.probe.batch_size=4", "compare.probe.finetune_batch_size=2", "compare.probe.warmup_steps=2",
            "compare.probe.steps=3", "compare.seeds=[0,1]", "compare.until=decided", "compare.max_seeds=3",
            "+compare.claims=[{claim: a, a: vilbert, b: uniter, metric: vqa, expect: higher}]"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # a bf16 comparison is probed in fp32 on a CPU (its bf16 matmul can be a reference kernel)
    assert len(precisions) >= 4 and set(precisions) == {"no"} and ", in fp32)" in out
    assert batches == {"pretrain_model": {4}, "finetune_task": {2}}  # each stage at its own probe batch
    assert "median of 3 timed steps after 2 untimed, pre-trainings at batch 4 and fine-tunings at batch 2, scaled" \
        " linearly" in out
    for key in ("vilbert/seed0/pretrain", "uniter/seed0/pretrained-vqa", "meter/seed0/scratch-nlvr2"):
        assert f"| {key} |" in out
    assert "| uniter/seed0/pretrained-nlvr2 | uniter/seed0/pretrain | 3 |" in out
    assert "s/step" in out and "CPU-thread-hours" in out
    assert f"This machine's speed at the probe: 123 GFLOPS (fp32 1024² GEMM on {torch.get_num_threads()} thread(s))" in out
    for name in ("local", "slurm", "ray"):
        assert f"executor {name}:" in out
    # compare.until=decided: every look priced from the probe's step times, as the FLOP plan prices them
    assert "Seeds until decided: looks after [2, 3] seeds" in out and "At most: " in out
    assert "CPU-thread-hours (every claim undecided to the last look)" in out


def test_probe_is_the_median_step_after_the_untimed_ones(cache, monkeypatch, tmp_path):
    """Each probe trains warmup_steps + steps and gives the median ``step_s`` of the steps after the warm-up
    (the trainer's own step times, here replaced: a slow warm-up and one slowed step must not count)."""
    from types import SimpleNamespace

    from vlkit.cli import compose
    from vlkit.compare import Comparison, resolve_config
    from vlkit.compare.estimate import probe
    from vlkit.train import pipeline

    asked = []

    def fake(trainer):
        asked.append(trainer["max_steps"])
        return SimpleNamespace(history=[{"step_s": t} for t in [100.0, 100.0, 1.0, 2.0, 30.0]])
    monkeypatch.setattr(pipeline, "pretrain_model", lambda env, model, mix, trainer, *a, **k: (model, fake(trainer)))
    monkeypatch.setattr(pipeline, "finetune_task", lambda env, model, task, trainer, *a, **k: (0, 0, fake(trainer), {}))
    cfg = resolve_config(compose("compare", [*SMALL, f"cache_dir={cache}"]))
    seconds = probe(Comparison(cfg, tmp_path, progress=False), steps=3, warmup_steps=2)
    assert set(seconds) == {f"{m}_tiny {k}" for m in ("vilbert", "uniter", "meter") for k in (m, "vqa", "nlvr2")}
    assert set(seconds.values()) == {2.0} and set(asked) == {5}
    assert len(asked) == len(seconds)


def test_local_executor_gives_each_worker_its_own_gpus(monkeypatch, tmp_path):
    from vlkit.compare.executors import ExecutorSettings, LocalExecutor

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    one = LocalExecutor(tmp_path / "plan.json", ExecutorSettings({"compare": {"gpus_per_unit": 1}}))
    assert one.slots == 8 and [e["CUDA_VISIBLE_DEVICES"] for e in one.envs] == [str(i) for i in range(8)]
    assert one.launch is None
    four = LocalExecutor(tmp_path / "plan.json", ExecutorSettings({"compare": {"gpus_per_unit": 4}}))
    assert [e["CUDA_VISIBLE_DEVICES"] for e in four.envs] == ["0,1,2,3", "4,5,6,7"]
    assert four.launch[1:6] == ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "4"]
    assert four.launch[-2:] == ["-m", "vlkit.compare.worker"]
    with pytest.raises(ValueError, match="gpus_per_unit=16, but this machine shows 8"):
        LocalExecutor(tmp_path / "plan.json", ExecutorSettings({"compare": {"gpus_per_unit": 16}}))


class _Scripted:
    """An executor whose units end as the script says (one outcome per attempt)."""

    slots = 2

    def __init__(self, script):
        self.script, self.started, self.pending = script, [], []

    def submit(self, key):
        self.started.append(key)
        self.pending.append(key)

    def wait(self, timeout):
        key = self.pending.pop(0)
        return [(key, {"state": self.script[key].pop(0), "error": "boom"})]


def test_a_worker_reuses_its_recent_machine_speed_probe(monkeypatch):
    """A unit records the machine's speed just after it; a probe under a minute old on as many threads stands
    for the next unit too (it costs as much as a smoke unit), an older one or other threads probe again."""
    import time

    import torch

    from vlkit.compare import worker

    rates = iter([80.0, 70.0])  # a third probe would raise
    monkeypatch.setattr(worker, "gemm_gflops", lambda: next(rates))
    threads = torch.get_num_threads()
    monkeypatch.setattr(worker, "_PROBES", {threads: (time.monotonic() - worker.PROBE_REUSE_S + 30, 90.0)})
    try:
        assert worker.machine_speed() == {**worker.machine_speed(), "gemm_gflops": 90.0, "threads": threads}
        worker._PROBES[threads] = (time.monotonic() - worker.PROBE_REUSE_S, 90.0)
        assert [worker.machine_speed()["gemm_gflops"] for _ in range(2)] == [80.0, 80.0]
        torch.set_num_threads(threads + 1)
        assert worker.machine_speed() == {**worker.machine_speed(), "gemm_gflops": 70.0, "threads": threads + 1}
    finally:
        torch.set_num_threads(threads)


def test_drive_retries_a_died_unit_but_never_a_failed_one_and_skips_dependents():
    import threading

    from vlkit.compare.scheduler import drive

    script = {"a": ["died", "finished"], "b": ["failed"], "a1": ["finished"], "b1": ["finished"], "c": ["died", "died"],
              "r1": ["finished"]}
    executor = _Scripted(script)
    ended = []
    outcomes = drive(["a", "b", "c", "a1", "b1", "r1"], {"a1": "a", "b1": "b", "r1": "r"}, executor, 1,
                     lambda key, state, note: ended.append((key, state)), threading.Event())
    assert {k: o["state"] for k, o in outcomes.items()} == {"a": "finished", "b": "failed", "c": "died",
                                                             "a1": "finished", "b1": "skipped", "r1": "finished"}
    assert executor.started.count("a") == 2 and executor.started.count("b") == 1 and executor.started.count("c") == 2
    assert "b1" not in executor.started and ("a", "retrying") in ended  # r: finished before, not scheduled


@pytest.mark.slow
def test_a_worker_killed_by_the_system_is_retried(local_records, tmp_path):
    """A worker process SIGKILLed in the middle of a unit (as the OOM killer does): with compare.retries=1
    the unit runs again and the records are those of an undisturbed run."""
    import json
    import signal
    import threading
    import time

    root, expected = local_records
    out = tmp_path / "retried"
    killed = []

    def kill_first_running_unit():
        deadline = time.monotonic() + 600
        while not killed and time.monotonic() < deadline:
            for path in (out / "runs").glob("*/*/pretrain/unit.json"):
                state = json.loads(path.read_text())
                log = path.with_name("unit.log")
                # the worker marks its unit running, then writes the attempt's first log line: kill after both
                if state["state"] == "running" and log.exists() and "attempt 1" in log.read_text():
                    os.kill(state["pid"], signal.SIGKILL)
                    killed.append(state["unit"])
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=kill_first_running_unit, daemon=True)
    thread.start()
    assert main(["compare", *ONE_RUN, f"output_dir={out}", f"cache_dir={root / 'cache'}", "workers=2",
                 "compare.retries=1"]) == 0
    thread.join()
    assert killed
    assert [untimed(r) for r in records(out)] == expected
    log = (out / "runs" / killed[0] / "unit.log").read_text()
    assert "attempt 1" in log and "attempt 2" in log


def test_an_executor_registration_is_checked():
    """Issue 45: the executor contract is code (`vlkit.Executor`), checked when an executor registers."""
    from vlkit import EXECUTORS, Executor, register_executor
    from vlkit.registry import RegistrationError

    class NotOne:
        def submit(self, key): ...

    class Half(Executor):
        def submit(self, key): ...

    class Stray(Executor):
        config = {"queue": None}
        resume_safe = ("queues",)
        submit = wait = close = lambda self, *a: None

    for cls, rule in ((NotOne, "it must subclass vlkit.compare.executor_base.Executor"), (Half, "define close, wait"),
                      (Stray, "name key.s. queues that its config lacks")):
        with pytest.raises(RegistrationError, match=rule):
            register_executor("probe_" + cls.__name__.lower())(cls)
        assert "probe_" + cls.__name__.lower() not in EXECUTORS


def test_the_settings_and_the_resume_keys_derive_from_the_registry():
    from vlkit.compare.executor_base import run_keys, unit_nodes
    from vlkit.compare.executors import ExecutorSettings

    settings = ExecutorSettings({"compare": {"slurm": {"nodes": 2}}})
    assert settings.block("slurm")["nodes"] == 2 and settings.block("ray") == {"address": None, "num_cpus": None,
                                                                                 "max_concurrent": None}
    assert unit_nodes({"slurm": {"nodes": 2}}) == 2 and unit_nodes({}) == 1
    assert {"compare.slurm", "compare.ray"} <= set(run_keys())
    with pytest.raises(KeyError, match=r"compare.ray: unknown key\(s\) adress; known: address, max_concurrent, num_cpus"):
        ExecutorSettings({"compare": {"ray": {"adress": "auto"}}})
