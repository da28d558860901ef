"""The training loop: bit-exact resume, NaN stop, metrics.jsonl, accumulation, evaluation,
mixed precision, dynamic batching, trackers and the Hydra config."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from vlkit.train import NonFiniteLossError, Trainer, TrainerConfig, read_metrics, trainer_config


def _fit(tiny, pairs, module=None, eval_fn=None, as_list=False, **cfg):
    """``as_list``: feed a plain list of batches instead of the DataLoader."""
    tiny.reset_accelerate()
    trainer = Trainer(module if module is not None else tiny.make_module(), tiny.base_config(**cfg), eval_fn=eval_fn)
    loader = trainer.loader(pairs)
    return trainer.fit(list(loader) if as_list else loader)


@pytest.mark.parametrize("batching, save_every, crash_step, as_list",
                         [("fixed", 3, 4, False), ("units", 2, 5, False), ("fixed", 2, 3, True)])
def test_resume_is_bit_exact(tmp_path, tiny, pairs, batching, save_every, crash_step, as_list):
    """Stop mid-run (a crash after a checkpoint) and resume: same per-step losses and weights as a
    straight run, with dropout on, gradient accumulation and epochs rolling over."""
    cfg = dict(max_steps=7, grad_accum=2, batching=batching, max_units=160, size_multiple=2, save_every=save_every,
               as_list=as_list)
    straight = _fit(tiny, pairs, output_dir=tmp_path / "straight", **cfg)
    assert straight.history[-1]["epoch"] >= 1  # the data wrapped around at least once

    crashing = tiny.make_module()
    crashing.faults = {crash_step: "crash"}
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(tiny, pairs, module=crashing, output_dir=tmp_path / "resumed", **cfg)
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")] == list(range(1, crash_step + 1))

    resumed = _fit(tiny, pairs, module=tiny.make_module(seed=123), output_dir=tmp_path / "resumed", resume=True,
                   **cfg)
    first_resumed = crash_step // save_every * save_every + 1
    assert [r["step"] for r in resumed.history] == list(range(first_resumed, 8))
    records = read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in records] == list(range(1, 8))
    assert tiny.losses(records) == tiny.losses(straight)  # exactly, not approximately
    assert [r["acc"] for r in records] == [r["acc"] for r in straight.history]
    a = load_file(tmp_path / "straight" / "checkpoints" / "step_7" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "checkpoints" / "step_7" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_from_a_corrupt_checkpoint_names_the_file(tmp_path, tiny, pairs):
    from vlkit.train import CheckpointError

    _fit(tiny, pairs, output_dir=tmp_path, max_steps=4, save_every=2)
    weights = tmp_path / "checkpoints" / "step_4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="step_4/model.safetensors is truncated"):
        _fit(tiny, pairs, output_dir=tmp_path, max_steps=6, save_every=2, resume=True)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]  # nothing lost


def test_nan_loss_stops_with_the_step(tmp_path, tiny, pairs):
    module = tiny.make_module()
    module.faults = {2: "nan"}
    with pytest.raises(NonFiniteLossError, match=r"step 3: the loss is nan on rank 0, micro-batch 0 \(examples \['ex"):
        _fit(tiny, pairs, module=module, output_dir=tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_metrics_every_step_and_log_every(tmp_path, tiny, pairs):
    result = _fit(tiny, pairs, output_dir=tmp_path / "a", max_steps=5)
    records = read_metrics(tmp_path / "a")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    for r in records:
        assert {"step", "loss", "lr", "padding", "units", "examples", "acc", "epoch", "step_s"} <= set(r)
        assert math.isfinite(r["loss"]) and 0.0 <= r["padding"] < 1.0 and r["examples"] == 8
        assert r["step_s"] > 0.0  # the step's own wall seconds
    assert records == result.history
    assert records[0]["lr"] == 0.0 and records[1]["lr"] == pytest.approx(5e-4)  # warm-up of 2 steps
    assert (tmp_path / "a" / "checkpoints" / "step_5").is_dir()
    _fit(tiny, pairs, output_dir=tmp_path / "b", max_steps=5, log_every=2)
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [2, 4, 5]


def test_refuses_to_overwrite_a_run(tmp_path, tiny, pairs):
    _fit(tiny, pairs, output_dir=tmp_path, max_steps=3)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="resume=true"):
        _fit(tiny, pairs, output_dir=tmp_path, max_steps=3)
    assert (tmp_path / "metrics.jsonl").read_text() == before
    done = _fit(tiny, pairs, output_dir=tmp_path, max_steps=3, resume=True)  # nothing left to do
    assert done.step == 3 and done.history == []


def test_resume_without_checkpoint_starts_fresh(tmp_path, tiny, pairs):
    fresh = _fit(tiny, pairs, output_dir=tmp_path / "a", max_steps=3)
    resumed = _fit(tiny, pairs, output_dir=tmp_path / "b", max_steps=3, resume=True)
    assert tiny.losses(resumed) == tiny.losses(fresh)


def test_gradient_accumulation_matches_a_full_batch(tmp_path, tiny, pairs):
    """Two half batches accumulated == one batch (dropout off); the halves come from the same order."""
    full = _fit(tiny, pairs, module=tiny.make_module(dropout=0.0), output_dir=tmp_path / "a", batch_size=8)
    halves = _fit(tiny, pairs, module=tiny.make_module(dropout=0.0), output_dir=tmp_path / "b", batch_size=4,
                  grad_accum=2)
    assert tiny.losses(halves) == pytest.approx(tiny.losses(full), abs=1e-6)
    assert [r["grad_norm"] for r in halves.history] == pytest.approx([r["grad_norm"] for r in full.history], rel=1e-5)


def test_eval_fn_logged_and_rng_untouched(tmp_path, tiny, pairs):
    calls = []

    def eval_fn(module):
        assert not module.training and not torch.is_grad_enabled()
        calls.append(torch.rand(1).item())  # draws from the global RNG: must not change training
        return {"score": float(len(calls))}

    plain = _fit(tiny, pairs, output_dir=tmp_path / "a", max_steps=5)
    evaluated = _fit(tiny, pairs, output_dir=tmp_path / "b", max_steps=5, eval_every=2, eval_fn=eval_fn)
    assert tiny.losses(evaluated) == tiny.losses(plain)
    assert len(calls) == 3 and evaluated.eval == {"score": 3.0}
    scored = {r["step"]: r["eval/score"] for r in read_metrics(tmp_path / "b") if "eval/score" in r}
    assert scored == {2: 1.0, 4: 2.0, 5: 3.0}


def test_every_step_trains_in_train_mode(tmp_path, tiny, pairs):
    """The trainer sets the train mode once per fit: a module handed over in eval mode trains in train mode, and
    so does every step after an evaluation (which restores the mode it found), down to the leaf modules."""
    module = tiny.make_module().eval()
    modes = []
    module.register_forward_pre_hook(lambda m, args: modes.append(all(x.training for x in m.modules())))
    _fit(tiny, pairs, module=module, output_dir=tmp_path / "run", max_steps=5, eval_every=2,
         eval_fn=lambda m: {"score": 1.0})
    assert modes == [True] * 5


def test_bf16_mixed_precision(tmp_path, tiny, pairs):
    fp32 = _fit(tiny, pairs, module=tiny.make_module(dropout=0.0), output_dir=tmp_path / "a", max_steps=3)
    bf16 = _fit(tiny, pairs, module=tiny.make_module(dropout=0.0), output_dir=tmp_path / "b", max_steps=3,
                mixed_precision="bf16")
    assert all(math.isfinite(x) for x in tiny.losses(bf16))
    assert tiny.losses(bf16) != tiny.losses(fp32)
    assert tiny.losses(bf16) == pytest.approx(tiny.losses(fp32), abs=0.05)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_warns(tmp_path, tiny, monkeypatch, caplog, native):
    from vlkit import runtime

    monkeypatch.setattr(runtime, "native_cpu_bf16", lambda: native)
    tiny.reset_accelerate()
    with caplog.at_level("WARNING"):
        Trainer(tiny.make_module(), tiny.base_config(output_dir=tmp_path, mixed_precision="bf16"))
    assert ("reference kernel" in caplog.text) is not native, caplog.text


def test_activation_checkpointing_and_adamw_options(tmp_path, tiny, pairs):
    """Checkpointed blocks recompute the same dropout masks: the same losses; the official AdamW rule and
    torch's differ (eps and decay placement) but both train."""
    plain_module, hf_module = tiny.make_module(), tiny.make_module()
    plain = _fit(tiny, pairs, module=plain_module, output_dir=tmp_path / "a", max_steps=3)
    ckpt = _fit(tiny, pairs, output_dir=tmp_path / "b", max_steps=3, activation_checkpointing=True)
    assert tiny.losses(ckpt) == tiny.losses(plain)
    hf = _fit(tiny, pairs, module=hf_module, output_dir=tmp_path / "c", max_steps=3, adamw_rule="hf",
              adamw_impl="foreach")
    # the rules differ by a few ulp per step: in the weights (a 3-step loss may round to the same float)
    assert tiny.losses(hf)[0] == tiny.losses(plain)[0] and all(math.isfinite(x) for x in tiny.losses(hf))
    assert any(not torch.equal(a, b) for a, b in zip(plain_module.state_dict().values(),
                                                      hf_module.state_dict().values()))
    with pytest.raises(ValueError, match="adamw_rule"):
        TrainerConfig(adamw_rule="sgd")


def test_dynamic_batching_reports_less_padding(tmp_path, tiny, pairs):
    fixed = _fit(tiny, pairs, output_dir=tmp_path / "a", max_steps=4)
    units = _fit(tiny, pairs, output_dir=tmp_path / "b", max_steps=4, batching="units", max_units=120,
                 size_multiple=2, bucket_size=48)
    assert all(r["units"] <= 120 for r in units.history)
    assert len({r["examples"] for r in units.history}) > 1  # batch sizes follow the lengths
    mean = lambda rs: sum(r["padding"] for r in rs) / len(rs)  # noqa: E731
    assert mean(units.history) < mean(fixed.history)


def test_tensorboard_tracker(tmp_path, tiny, pairs):
    pytest.importorskip("tensorboard")
    _fit(tiny, pairs, output_dir=tmp_path, max_steps=3, trackers=["auto"])
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_hydra_presets_and_top_level_resume(tmp_path):
    from hydra import compose, initialize_config_dir

    from vlkit.cli import CONF_DIR
    from vlkit.train import register_hydra_configs

    (tmp_path / "run.yaml").write_text(
        "defaults:\n  - trainer: default\n  - _self_\nresume: false\n"
        f"hydra:\n  searchpath:\n    - file://{CONF_DIR}\n")
    register_hydra_configs()
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        default = trainer_config(compose("run"))
        meter = trainer_config(compose("run", ["trainer=meter", "trainer.max_steps=50", "resume=true"]))
    assert default == TrainerConfig()
    assert (meter.lr, meter.lr_mult, meter.lr_mult_head, meter.schedule, meter.no_decay) == \
        (1e-5, 5.0, 5.0, "polynomial", "bert_timm")
    assert meter.max_steps == 50 and meter.resume is True
    uniter = TrainerConfig.from_preset("uniter")
    assert (uniter.eps, uniter.grad_clip, uniter.warmup, uniter.schedule_offset) == (1e-6, 5.0, 10000, 1)
    with pytest.raises(ValueError, match="trainer.mixed_precision"):
        TrainerConfig.from_cfg({"mixed_precision": "fp8"})


def test_resume_with_another_config_is_refused_before_loading(tmp_path, tiny, pairs):
    """The Python API checks what the commands' preflight checks: the checkpoint's trainer config and run."""
    from vlkit.train.resume import ResumeMismatchError

    _fit(tiny, pairs, output_dir=tmp_path / "run", max_steps=3, save_every=3)
    with pytest.raises(ResumeMismatchError, match=r"trainer.grad_accum=2 \(the checkpoint has 1\)"):
        _fit(tiny, pairs, output_dir=tmp_path / "run", max_steps=5, save_every=3, grad_accum=2, resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]  # nothing truncated or rewritten
    resumed = _fit(tiny, pairs, output_dir=tmp_path / "run", max_steps=4, save_every=3, resume=True)
    assert resumed.step == 4  # max_steps is a safe change
