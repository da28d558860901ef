"""Catalogue: processes end cleanly. The two-process gloo run itself is
``tests/train/test_distributed.py::test_two_gloo_processes_match_one``; its worker used to exit with a
live process group and aborted now and then ("terminate called without an active exception", exit
code -6). `vlkit.train.distributed.shutdown` (barrier, then ``destroy_process_group``) ends the group
while the interpreter is alive; the worker and the console script call it."""
from __future__ import annotations

import torch


def test_shutdown_ends_a_gloo_process_group(tmp_path):
    import torch.distributed as dist

    from vlkit.runtime import shutdown

    shutdown()  # no group: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        shutdown()
    assert not dist.is_initialized()


def test_console_ends_the_process_group_even_when_the_command_fails(tmp_path, monkeypatch, vlkit_console):
    import torch.distributed as dist

    import vlkit.features.commands as commands

    def failing(cfg):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
        raise FileNotFoundError(f"{tmp_path / 'images'}: no images")

    monkeypatch.setattr(commands, "extract_features", failing)
    code, _, err = vlkit_console("extract-features", f"images={tmp_path / 'images'}", f"out={tmp_path / 'f.h5'}")
    assert code == 1 and "no images" in err and not dist.is_initialized()


def test_fit_releases_the_prepared_model_so_the_process_group_can_end(tmp_path, data):
    """A DDP wrapper's reducer holds the gloo process group: while the trainer or its accelerator keeps the
    wrapper, ``destroy_process_group`` cannot end the group and it is torn down at interpreter exit instead,
    where it aborts now and then. After `Trainer.fit` neither holds it, and evaluation still works."""
    import vlkit
    from vlkit.data.images import build_image_source
    from vlkit.data.pairs import ImageTextPairs
    from vlkit.data.tokenizers import build_tokenizer
    from vlkit.objectives import build_pretraining
    from vlkit.train import Trainer, TrainerConfig

    store, _, ids = data()
    records = [{"id": f"e{k}", "image_id": ids[k % len(ids)], "caption": "a red circle"} for k in range(8)]
    pairs = ImageTextPairs(records, build_tokenizer("shapes"), build_image_source({"path": str(store)}))
    model = vlkit.build_model("uniter", preset="tiny", vocab_size=len(build_tokenizer("shapes")), v_feature_size=16,
                              v_target_size=5)
    module = build_pretraining(model, "uniter_mlm")
    trainer = Trainer(module, TrainerConfig(output_dir=str(tmp_path / "run"), max_steps=1, warmup=0, batch_size=4,
                                            progress=False, trackers=[]), eval_fn=lambda m: {"one": 1.0})
    trainer.fit(trainer.loader(pairs, pairs.collator()))
    assert trainer._model is None and trainer.accelerator._models == [] and trainer.accelerator._optimizers == []
    assert trainer.evaluate() == {"one": 1.0}


WATCHER = """
import sys, time
from vlkit.runtime import exit_with, watched_exited
exit_with(int(sys.argv[1]))
print(watched_exited(), flush=True)
sys.stdin.readline()  # the parent's go: it has been killed
print(watched_exited(), flush=True)  # printed only when the watcher had not yet ended this process
time.sleep(60)
"""


def test_a_worker_ends_the_moment_its_session_does_and_knows_it_before_recording():
    """`exit_with`: a worker whose session (here a `sleep`) is SIGKILLed exits at once, not a poll later; until it
    does, `watched_exited` says the session is gone (a unit is then never recorded as finished)."""
    import contextlib
    import subprocess
    import sys
    import time

    session = subprocess.Popen(["sleep", "120"])
    worker = subprocess.Popen([sys.executable, "-c", WATCHER, str(session.pid)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "False"
        session.kill()
        session.wait()
        killed = time.monotonic()
        with contextlib.suppress(BrokenPipeError):  # it may be gone already
            worker.stdin.write("go\n")
            worker.stdin.flush()
        assert worker.wait(timeout=30) == 1
        assert time.monotonic() - killed < 10
        assert worker.stdout.read().strip() in ("", "True")  # never "False" after the kill
    finally:
        session.kill()
        worker.kill()
