"""Catalogue, class "resume": ``resume=true`` continues only the run its checkpoint saved; every other
difference is refused before anything is loaded or written, each key named with both values."""
from __future__ import annotations

from reliability_helpers import captions, jsonl_data, run_args

from vlkit.train.resume import SAFE_TO_CHANGE, differences


def _first_run(tmp_path, data, vlkit_console):
    store, caps, ids = data()
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out))
    assert code == 0, err
    return store, caps, ids, out


def _snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_resume_refuses_another_batch_size_lr_and_data_naming_both_values(tmp_path, data, vlkit_console):
    store, caps, ids, out = _first_run(tmp_path, data, vlkit_console)
    before = _snapshot(out)
    more = captions(tmp_path / "more.jsonl", ids, per_image=4)  # other data: 24 captions instead of 18
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(more, store), *run_args(out, steps=4),
                                 "resume=true", "trainer.batch_size=2", "trainer.lr=0.01")
    assert code == 1 and "Traceback" not in err
    assert "trainer.batch_size=2 (the checkpoint has 4)" in err
    assert "trainer.lr=0.01 (the checkpoint has 0.001)" in err
    assert f"data.path={str(more)!r} (the checkpoint has {str(caps)!r})" in err
    assert "data.examples=24 (the checkpoint has 18)" in err and "checkpoints/step_2" in err
    assert "trainer.max_steps" not in err.split("safe to change")[0]  # a safe change is not a problem
    assert _snapshot(out) == before  # nothing loaded, truncated or rewritten (run.json keeps the run's data)


def test_resume_with_another_model_family_says_so(tmp_path, data, vlkit_console):
    store, caps, _, out = _first_run(tmp_path, data, vlkit_console)
    code, _, err = vlkit_console("pretrain", "model=vilbert", "objectives=uniter", *jsonl_data(caps, store),
                                 *run_args(out), "resume=true")
    assert code == 1 and "model=vilbert: the checkpoint holds a uniter model (resume with model=uniter)" in err
    assert "missing key" not in err and "model.hidden_size" not in err  # one difference, not one per field


def test_resume_accepts_the_documented_safe_changes(tmp_path, data, vlkit_console):
    store, caps, _, out = _first_run(tmp_path, data, vlkit_console)
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out, steps=3),
                                 "resume=true", "trainer.save_every=2", "trainer.log_every=3")
    assert code == 0, err
    assert (out / "checkpoints" / "step_3").is_dir()


def test_differences_ignore_what_an_older_checkpoint_did_not_record():
    saved = {"config": {"lr": 1e-3, "batch_size": 4}}  # an older checkpoint: no run record, fewer trainer keys
    current = {"config": {"lr": 1e-3, "batch_size": 4, "new_key": 1},
               "run": {"model": {"family": "uniter"}, "data": {"name": "jsonl"}}}
    assert differences(saved, current) == []
    assert differences({**saved, "run": {"objectives": {"mlm": 1, "itm": 1}}},
                       {**current, "run": {"objectives": {"mlm": 1}}}) == ["objectives.itm=<not set> (the checkpoint has 1)"]
    assert "trainer.max_steps" in SAFE_TO_CHANGE and "trainer.batch_size" not in SAFE_TO_CHANGE
