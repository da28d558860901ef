"""Catalogue: what the preflight finds before step 1 (every problem at once, each naming its culprit),
the bad-example policy and evaluation that never scores NaN. Commands run through the console script."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reliability_helpers import FEAT, captions, jsonl_data, raw_store, regions, run_args, shapes_store

from vlkit.data.collate import VLCollator
from vlkit.data.images import build_image_source
from vlkit.data.pairs import ImageTextPairs
from vlkit.data.tokenizers import build_tokenizer
from vlkit.validate import DataError, SkipLog


def _nothing_written(out) -> bool:
    return not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_caption_with_missing_image_fails_before_step_1_and_rerun_works(tmp_path, data, vlkit_console):
    store, caps, ids = data(extra_captions=[{"image_id": "ghost_img", "caption": "a red circle"}])
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out))
    assert code == 1 and "1 example(s) name 1 image(s) missing from the feature store" in err
    assert "'ghost_img'" in err and "'ghost_img#0'" in err and str(store) in err and "Traceback" not in err
    assert _nothing_written(out)
    fixed = captions(tmp_path / "fixed.jsonl", ids)
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(fixed, store), *run_args(out, steps=1))
    assert code == 0, err  # no leftover blocks the rerun


def test_skip_policy_runs_and_records_every_skipped_example(tmp_path, vlkit_console):
    images = {f"img{k}": regions(k) for k in range(6)}
    images["img3"]["features"][:, 0] = np.nan  # a bad entry of an old store (sampled by the preflight)
    store = raw_store(tmp_path / "s.h5", images)
    caps = captions(tmp_path / "c.jsonl", list(images), extra=[{"image_id": "ghost_img", "caption": "a red circle"}])
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), "data.on_error=skip",
                                 *run_args(out))
    assert code == 0, err
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in skipped) == ["ghost_img#0", "img3#0", "img3#1", "img3#2"]
    assert all(r["kind"] == "example" and r["image_id"] in r["reason"] for r in skipped)
    report = json.loads((out / "preflight.json").read_text())
    assert report["skipped"] == {"example": 4} and report["data"]["pre-training"]["skipped"] == 4


def test_mrc_on_a_store_without_soft_labels(tmp_path, data, vlkit_console):
    store, caps, _ = data(soft=False)
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm_itm_mrc", *jsonl_data(caps, store),
                                 *run_args(out))
    assert code == 1 and "objective 'mrc' needs the detector's soft labels" in err and str(store) in err
    assert _nothing_written(out)


def test_every_problem_at_once(tmp_path, data, vlkit_console):
    store, caps, ids = data(soft=False, extra_captions=[{"image_id": "ghost_img", "caption": "a red circle"}])
    out = tmp_path / "run"
    (out / "checkpoints" / "step_3").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    code, _, err = vlkit_console("pretrain", "model=uniter", "objectives=uniter_mlm_itm_mrc", *jsonl_data(caps, store),
                                 *run_args(out))
    assert code == 1 and "3 problem(s) found before step 1" in err
    assert "already holds a run" in err and "'mrc' needs" in err and "'ghost_img'" in err
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'  # nothing already written is lost


def test_wrong_feature_dimension_and_family_mismatch_with_init(tmp_path, data, vlkit_console):
    store, caps, _ = data()
    pre = tmp_path / "pre"
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(pre, 1))[0] == 0
    other, other_caps, _ = data(name="other.h5", feat=8)
    code, _, err = vlkit_console("pretrain", f"init={pre}", *jsonl_data(other_caps, other), *run_args(tmp_path / "a"))
    assert code == 1 and f"the feature store {other} holds 8-d features, the uniter model takes {FEAT}-d" in err
    code, _, err = vlkit_console("pretrain", "model=meter", f"init={pre}", *jsonl_data(caps, store),
                                 *run_args(tmp_path / "b"))
    assert code == 1 and f"model=meter conflicts with init={pre}, a uniter model" in err
    code, _, err = vlkit_console("pretrain", "model.hidden_size=128", f"init={pre}", *jsonl_data(caps, store),
                                 *run_args(tmp_path / "c"))
    assert code == 1 and "model.hidden_size=128 is ignored with init=" in err and "(hidden_size=64)" in err
    assert all(_nothing_written(tmp_path / d) for d in "abc")


def test_objectives_the_family_cannot_serve_and_unknown_ones(tmp_path, vlkit_console):
    shapes = ["data.num_images=20", f"cache_dir={tmp_path / 'cache'}"]
    code, _, err = vlkit_console("pretrain", "model=meter", "objectives=uniter", *shapes, *run_args(tmp_path / "a"))
    assert code == 1 and "objective 'mrfr' needs region features; meter takes pixels" in err
    assert "objective 'mrc_kl' needs region features" in err  # every one, not only the first
    mix = tmp_path / "mix.yaml"
    mix.write_text("sampling: per_batch\nobjectives:\n  mlm: {ratio: 1}\n  itmm: {ratio: 1}\n")
    code, _, err = vlkit_console("pretrain", "model=meter", f"objectives={mix}", *shapes, *run_args(tmp_path / "b"))
    assert code == 1 and "unknown objective 'itmm' (did you mean 'itm'?)" in err
    assert _nothing_written(tmp_path / "a") and _nothing_written(tmp_path / "b")


def _shapes_store(tmp_path, num_images: int, poison_split: str | None = None):
    return shapes_store(tmp_path / "shapes.h5", num_images, poison_split)


def test_nan_features_in_the_val_split_are_never_scored(tmp_path, vlkit_console):
    store, poisoned = _shapes_store(tmp_path, 20, "val")
    out = tmp_path / "ft"
    code, stdout, err = vlkit_console("finetune", "task=vqa", "model=uniter", "data.num_images=20",
                                      "data.image.source=features", f"data.image.path={store}", *run_args(out))
    assert code == 1 and "val/vqa" not in stdout and _nothing_written(out)
    assert "vqa val data" in err and f"image '{poisoned[0]}'" in err and "features hold NaN or inf" in err


def test_evaluation_refuses_nan_inputs_and_nan_weights(tmp_path):
    import vlkit
    from vlkit.tasks.base import eval_batches
    from vlkit.train.pipeline import evaluate_task

    model = vlkit.build_model("uniter", preset="tiny")
    task = vlkit.build_task("vqa", model, num_answers=3)
    batch = model.example_batch(2)
    batch.region_feats[1, 0, 0] = float("nan")
    batch.ids, batch.image_ids = ["q1", "q2"], ["im1", "im2"]
    with pytest.raises(DataError, match=r"NaN or inf in the evaluation inputs: region_feats of example 'q2' \(image 'im2'\)"):
        list(eval_batches(task, [batch], "test"))
    name, weight = next((n, p) for n, p in task.named_parameters() if n.startswith(task.head_name))
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match=rf"weights hold NaN or inf \({name}\)"):
        evaluate_task(task, None, ("val",))


def test_load_time_policy_for_images_the_preflight_did_not_sample(tmp_path):
    images = {f"img{k}": regions(k) for k in range(3)}
    images["img1"]["boxes"][0] = [80, 20, 10, 30]
    store = raw_store(tmp_path / "s.h5", images)
    records = [{"id": f"ex{k}", "image_id": f"img{k}", "caption": "a red circle"} for k in range(3)]
    tokenizer = build_tokenizer("shapes")
    strict = ImageTextPairs(records, tokenizer, build_image_source({"path": str(store)}))
    with pytest.raises(DataError, match=r"s\.h5: image 'img1': box 0 \[80, 20, 10, 30\] is not ordered"):
        strict[1]
    skips = SkipLog(tmp_path / "skipped.jsonl")
    lenient = ImageTextPairs(records, tokenizer, build_image_source({"path": str(store)}, on_error="skip", skips=skips))
    assert lenient[1] is None
    batch = VLCollator()([lenient[k] for k in range(3)])
    assert batch.ids == ["ex0", "ex2"] and skips.ids == ["ex1"]
    assert [len(x) for x in lenient.lengths()] == [2, 2, 2]  # batching by units does not fail on it either
    with pytest.raises(DataError, match="all 1 examples of a batch were skipped"):
        VLCollator()([lenient[1]])


@pytest.mark.parametrize("setting, message", [
    ("trainer.grad_clip=nan", "trainer.grad_clip=nan is not a finite number"),
    ("trainer.lr=inf", "trainer.lr=inf is not a finite number"),
    ("trainer.output_dir=", "trainer.output_dir is empty: name the folder the run writes to"),
    ("trainer.batch_size=64", "trainer.batch_size=64 is larger than the 18 example(s) of the pre-training data"),
    ("trainer.betas=[0.9,1.5]", "trainer.betas=[0.9, 1.5]: each must be in [0, 1)"),
])
def test_trainer_settings_nan_inf_empty_and_impossible_are_refused_before_step_1(tmp_path, data, vlkit_console,
                                                                                 monkeypatch, setting, message):
    store, caps, _ = data()
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # an empty output_dir would have written the run into the current folder
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out), setting)
    assert code == 1 and message in err and "Traceback" not in err, err
    assert _nothing_written(out) and _nothing_written(tmp_path) and not (tmp_path / "preflight.json").exists()
    code, _, err = vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(out))
    assert code == 0, err  # nothing left blocks the rerun


def test_init_weights_holding_nan_are_refused_before_step_1(tmp_path, data, vlkit_console):
    from safetensors.torch import load_file, save_file

    store, caps, _ = data()
    pre = tmp_path / "pre"
    assert vlkit_console("pretrain", "model=uniter", *jsonl_data(caps, store), *run_args(pre, 1))[0] == 0
    weights = pre / "model" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(k for k in tensors if tensors[k].is_floating_point())[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt", "family": "uniter"})
    out = tmp_path / "run"
    code, _, err = vlkit_console("pretrain", f"init={pre}", *jsonl_data(caps, store), *run_args(out))
    assert code == 1 and f"the model's weights loaded with init={pre} hold NaN or inf before step 1" in err
    assert repr(name) in err and "lr" not in err.split("hold NaN")[1] and _nothing_written(out)
