"""Issue 20: a comparison on real data files runs like one on shapes. The files are written in their
publishers' formats (`vlkit make-shapes`: Karpathy's caption json, VQA v2 questions and annotations, NLVR2
jsonl, RefCOCO refs and instances, PNG images), region features extracted from the images into a store,
and every task reads its own files (``task.source=files``); the pixel family reads the image folder."""
import pytest

from vlkit.cli import main

from compare_helpers import records


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    assert main(["make-shapes", f"out={root}", "num_images=24", "val_images=8", "test_images=4"]) == 0
    assert main(["extract-features", f"images={root / 'images'}", f"out={root / 'feats.h5'}", "device=cpu",
                 "batch_size=8", "progress=false"]) == 0
    return root


def _comparison(root, data_args, second):
    split = {"train": "train", "val": "val"}
    vqa = {s: {"questions": str(root / f"v2_OpenEnded_mscoco_{s}_questions.json"),
               "annotations": str(root / f"v2_mscoco_{s}_annotations.json")} for s in split}
    nlvr2 = {s: str(root / f"{s}.json") for s in split}
    path = root / f"runs-{data_args[0].split('=')[1]}.yaml"
    path.write_text(f"""# @package _global_
defaults:
  - smoke
  - _self_
compare:
  seeds: [0]
  zero_shot: false
  tasks: [vqa, retrieval, nlvr2, refexp]
  itm_pairs: 16
  task_overrides:
    vqa: {{source: files, files: {vqa}}}
    retrieval: {{source: files, path: {root / 'dataset_shapes.json'}, options: {{eval_mode: rerank, rerank_k: 4}}}}
    nlvr2: {{source: files, files: {nlvr2}}}
    refexp: {{source: files, refs: "{root / 'refs(unc).json'}", instances: {root / 'instances.json'}}}
  runs:
    - {{name: uniter, model: {{name: uniter, preset: tiny}}, objectives: uniter}}
    - {second}
""")
    return [f"compare={path}", *data_args, "threads=1", "progress=false", "workers=2"]


@pytest.mark.slow
@pytest.mark.parametrize("data", ["coco", "shards"])
def test_a_comparison_on_real_data_files(files, tmp_path, data):
    if data == "coco":
        data_args = ["data=coco", f"data.path={files / 'dataset_shapes.json'}", "data.split=[train]",
                     f"data.image.path={files / 'feats.h5'}", "data.tokenizer=shapes", "data.max_len=40"]
        images = files / "images"
        second = "{name: meter, model: {name: meter, preset: tiny}, objectives: meter, " \
                 "data: {image: {source: folder, path: " + str(images) + "}}}"
    else:
        shards = tmp_path / "shards"
        assert main(["make-shards", "source=jsonl", f"path={files / 'captions.jsonl'}", f"images={files / 'images'}",
                     f"out={shards}", "shard_size=40"]) == 0
        data_args = ["data=shards", f"data.path={shards}", "data.image.source=features",
                     f"data.image.path={files / 'feats.h5'}", "compare.trainer.common.group_by_length=0",
                     "compare.itm_pairs=0"]  # a stream has no held-out split to score ITM on
        # the tasks read images by id: the pixel family's shards carry them in the streamed rows only
        second = "{name: vilbert, model: {name: vilbert, preset: tiny}, objectives: vilbert}"
    out = tmp_path / "out"
    assert main(["compare", *_comparison(files, data_args, second), f"output_dir={out}", f"cache_dir={tmp_path}"]) == 0
    rows = {(r["run"], r["variant"]): r for r in records(out)}
    second = "meter" if data == "coco" else "vilbert"
    assert set(rows) == {(run, variant) for run in ("uniter", second) for variant in ("pretrained", "scratch")}
    for (run, _), r in rows.items():
        assert {"vqa", "ir_r1", "tr_r1", "nlvr2"} <= set(r) and 0 <= r["vqa"] <= 1
        assert ("refexp" in r) == (run != "meter")  # METER has no region head
    assert ("itm_acc" in rows[("uniter", "pretrained")]) == (data == "coco")


def test_a_task_left_on_the_shapes_world_is_refused_before_any_work(files, tmp_path):
    """data=coco with the tasks' default source (the shapes world): refused before the plan, a pre-training
    or the dry run's probe, naming the run and the tasks."""
    args = ["compare", "compare=smoke", "compare.seeds=[0]", "compare.tasks=[vqa,retrieval]", "data=coco",
            f"data.path={files / 'dataset_shapes.json'}", "data.split=[train]", f"data.image.path={files / 'feats.h5'}",
            "data.tokenizer=shapes", "progress=false"]
    for extra in ([f"output_dir={tmp_path / 'out'}"], ["dry_run=true"]):
        with pytest.raises(ValueError, match=r"run vilbert reads data=coco, but task\(s\) vqa, retrieval read the shapes"):
            main([*args, *extra])
    assert not (tmp_path / "out").exists()
