"""The embedded shapes world: determinism, rendering, and that every annotation is true of its scene."""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from vlkit.data.shapes import (ATTRIBUTES, COLORS, FILES, KINDS, OBJECT_CLASSES, PALETTE, SIZES, ShapesWorld,
                               shape_mask, shapes_tokenizer, shapes_vocab, write_shapes)


NUM_IMAGES = 40  # the size of the `world` fixture


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- determinism ----------------------------------------------------------------------------
def test_same_seed_same_bytes_any_order():
    a, b = ShapesWorld(seed=7, num_images=30), ShapesWorld(seed=7, num_images=30)
    order = [13, 2, 29, 0, 13]
    for i in order:
        assert a.png_bytes(i) == b.png_bytes(i)
        assert a.scene(i) == b.scene(i)
    for i in reversed(order):  # random access: nothing depends on what was generated before
        assert a.captions(i) == b.captions(i) and a.vqa(i) == b.vqa(i) and a.refexps(i) == b.refexps(i)
        assert a.nlvr2(i) == b.nlvr2(i) and a.snli_ve(i) == b.snli_ve(i)


def test_different_seeds_differ():
    a, b = ShapesWorld(seed=0, num_images=10), ShapesWorld(seed=1, num_images=10)
    assert sum(a.png_bytes(i) != b.png_bytes(i) for i in range(10)) >= 9


def test_world_size_does_not_change_scenes():
    assert ShapesWorld(0, 10).scene(3) == ShapesWorld(0, 500).scene(3)


def test_make_shapes_cli_matches_in_process_write(tmp_path, shapes_dir):
    out = tmp_path / "cli"
    subprocess.run([sys.executable, "-m", "vlkit.cli", "make-shapes", f"out={out}", f"num_images={NUM_IMAGES}",
                    "seed=0"], check=True, capture_output=True, cwd=Path(__file__).resolve().parents[2])
    assert _tree_bytes(out) == _tree_bytes(shapes_dir)


# ---- scenes and rendering -------------------------------------------------------------------
def test_label_spaces():
    assert len(KINDS) >= 5 and 6 <= len(COLORS) <= 8 and SIZES == ("small", "medium", "large")
    assert OBJECT_CLASSES[0] == "__background__" and OBJECT_CLASSES[1:] == KINDS
    assert ATTRIBUTES[0] == "__no_attribute__" and ATTRIBUTES[1:] == COLORS + SIZES


def test_objects_render_with_tight_boxes_and_stay_visible(world):
    counts = Counter()
    for i in range(NUM_IMAGES):
        scene = world.scene(i)
        assert 1 <= len(scene.objects) <= 5 and scene.image_id == str(i)
        pixels = np.asarray(world.image(i))
        assert pixels.shape == (128, 128, 3)
        masks = [shape_mask(o.kind, o.box, scene.width, scene.height) for o in scene.objects]
        for k, (o, mask) in enumerate(zip(scene.objects, masks)):
            counts[o.kind] += 1
            ys, xs = np.nonzero(mask)
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == o.box, "box is not tight"
            assert OBJECT_CLASSES[o.class_id] == o.kind
            assert [ATTRIBUTES[a] for a in o.attribute_ids] == [o.color, o.size]
            side = o.box[2] - o.box[0]
            assert 14 <= side <= 48
            visible = mask & ~np.any(masks[k + 1:], axis=0) if k + 1 < len(masks) else mask
            assert visible.sum() >= 0.6 * mask.sum(), "an object lost more than 40% of its pixels"
            assert (pixels[visible] == PALETTE[o.color]).all()
        background = ~np.any(masks, axis=0)
        assert (pixels[background] == scene.background).all()
    assert set(counts) == set(KINDS)


def test_splits_are_karpathy_style():
    w = ShapesWorld(0, 100)
    splits = [w.split(i) for i in range(100)]
    assert splits == ["train"] * 80 + ["val"] * 10 + ["test"] * 10
    assert list(w.indices("val")) == list(range(80, 90))
    with pytest.raises(IndexError, match="out of range"):
        w.scene(100)


# ---- annotations are true of their scenes ---------------------------------------------------
def _check_question(reader, scene, q, margin):
    text, answer = q["question"], q["multiple_choice_answer"]
    if m := re.fullmatch(r"what color is (.+)\?", text):
        assert reader.resolve(scene, m.group(1), margin).color == answer
    elif m := re.fullmatch(r"what shape is (.+)\?", text):
        assert reader.resolve(scene, m.group(1), margin).kind == answer
    elif m := re.fullmatch(r"how many (.+) are there\?", text):
        size, color, kind, _ = reader.parse_phrase(m.group(1))
        assert str(len(reader.matching(scene, size, color, kind))) == answer
    elif m := re.fullmatch(r"is there (.+)\?", text):
        size, color, kind, _ = reader.parse_phrase(m.group(1))
        assert answer == ("yes" if reader.matching(scene, size, color, kind) else "no")
    elif m := re.fullmatch(r"is (.+?) to the left or to the right of (.+)\?", text):
        a, b = reader.resolve(scene, m.group(1), margin), reader.resolve(scene, m.group(2), margin)
        assert abs(a.center[0] - b.center[0]) >= margin
        assert answer == ("left" if a.center[0] < b.center[0] else "right")
    elif m := re.fullmatch(r"is (.+?) above or below (.+)\?", text):
        a, b = reader.resolve(scene, m.group(1), margin), reader.resolve(scene, m.group(2), margin)
        assert abs(a.center[1] - b.center[1]) >= margin
        assert answer == ("above" if a.center[1] < b.center[1] else "below")
    elif m := re.fullmatch(r"is (.+?) (to the left of|to the right of|above|below) (.+)\?", text):
        a, b = reader.resolve(scene, m.group(1), margin), reader.resolve(scene, m.group(3), margin)
        axis = 0 if "left" in m.group(2) or "right" in m.group(2) else 1
        d = a.center[axis] - b.center[axis]
        assert abs(d) >= margin
        assert answer == ("yes" if (d < 0) == (m.group(2) in ("to the left of", "above")) else "no")
    else:
        pytest.fail(f"unexpected question {text!r}")


def test_every_vqa_answer_is_true_of_its_scene(world, reader):
    qids = set()
    for i in range(NUM_IMAGES):
        for q in world.vqa(i):
            _check_question(reader, world.scene(i), q, world.margin)
            answers = [a["answer"] for a in q["answers"]]
            assert len(answers) == 10 and Counter(answers).most_common(1)[0] == (q["multiple_choice_answer"],
                                                                                  answers.count(q["multiple_choice_answer"]))
            assert answers.count(q["multiple_choice_answer"]) >= 7
            assert [a["answer_id"] for a in q["answers"]] == list(range(1, 11))
            assert q["image_id"] == i and q["answer_type"] in ("yes/no", "number", "other")
            qids.add(q["question_id"])
    assert len(qids) == 5 * NUM_IMAGES


def test_vqa_needs_the_image():
    w = ShapesWorld(seed=5, num_images=400)
    answers = Counter(q["multiple_choice_answer"] for i in range(400) for q in w.vqa(i))
    total = sum(answers.values())
    assert answers.most_common(1)[0][1] / total < 0.25
    kinds = Counter(q["question"].split()[0] + " " + q["question"].split()[1] for i in range(400) for q in w.vqa(i))
    assert {"what color", "what shape", "how many", "is there", "is the"} <= set(kinds)
    assert set(COLORS) | set(KINDS) | {"yes", "no", "0", "1", "2"} <= set(answers)


_TEMPLATES = {"color": r"what color is .+", "shape": r"what shape is .+", "count": r"how many .+",
              "exist": r"is there .+", "side_h": r"is .+ to the left or to the right of .+", "side_v": r"is .+ above or below .+",
              "relation": r"is .+ (to the left of|to the right of|above|below) .+"}


def _template(question: str) -> str:
    return next(name for name, pattern in _TEMPLATES.items() if re.fullmatch(pattern + r"\?", question))


def _attributes_named(question: str) -> tuple[bool, bool, bool]:
    words = set(question.rstrip("?").split())
    return (bool(words & {*KINDS, *(k + "s" for k in KINDS), "crosses"}), bool(words & set(COLORS)), bool(words & set(SIZES)))


@pytest.fixture(scope="module", params=[1, 4], ids=["rounds1", "rounds4"])
def balanced(request):
    """The default comparison's world: 600 training, 400 evaluation images (1 or 4 rounds of questions each)."""
    w = ShapesWorld(seed=0, num_images=600, val_images=400, eval_rounds=request.param, train_rounds=request.param)
    return w, {s: [q for i in w.indices(s) for q in w.vqa(i)] for s in ("train", "val")}


def test_vqa_answers_balanced_per_template_and_attributes(balanced):
    """VQA v2's balancing: each template's answers equally likely on each split, also given the attributes the
    question names (what a question-only model could read), so yes/no is 50/50 and counts uniform over 0..3."""
    w, splits = balanced
    for split, questions in splits.items():
        by_template: dict[str, Counter] = {}
        by_named: dict[tuple, Counter] = {}
        for q in questions:
            t = _template(q["question"])
            by_template.setdefault(t, Counter())[q["multiple_choice_answer"]] += 1
            if t in ("exist", "count"):
                by_named.setdefault((t, _attributes_named(q["question"])), Counter())[q["multiple_choice_answer"]] += 1
        expected = {"color": set(COLORS), "shape": set(KINDS), "count": {"0", "1", "2", "3"}, "exist": {"yes", "no"},
                    "relation": {"yes", "no"}, "side_h": {"left", "right"}, "side_v": {"above", "below"}}
        for t, counts in by_template.items():
            assert set(counts) == expected[t], (split, t, counts)
            least, most = min(counts.values()), max(counts.values())
            assert least >= (0.7 if t == "count" else 0.9) * most, (split, t, counts)  # count 3 is the rarest scene
        for t in ("exist", "relation"):
            assert abs(by_template[t]["yes"] - by_template[t]["no"]) <= 2, (split, by_template[t])
        for key, counts in by_named.items():
            if sum(counts.values()) >= 40:
                share = max(counts.values()) / sum(counts.values())
                assert share <= (0.6 if key[0] == "exist" else 0.4), (split, key, counts)
    if w.eval_rounds == 1:
        assert len(splits["val"]) == 5 * 400


def test_rounds_ask_more_questions_of_each_split_on_its_own(balanced):
    """Later rounds ask each image new questions (and NLVR2 statements), as long as every answer stays within 10%
    of its template's rarest; a split's annotations depend on its own rounds only (eval_rounds: val and test,
    train_rounds: train)."""
    w, splits = balanced
    held_out_only = ShapesWorld(seed=0, num_images=600, val_images=400, eval_rounds=w.eval_rounds)
    one = ShapesWorld(seed=0, num_images=600, val_images=400)
    assert all(w.vqa(i) == held_out_only.vqa(i) and w.nlvr2(i) == held_out_only.nlvr2(i) for i in w.indices("val"))
    assert all(held_out_only.vqa(i) == one.vqa(i) and held_out_only.nlvr2(i) == one.nlvr2(i)
               for i in w.indices("train"))
    for split in ("train", "val"):
        for i in w.indices(split):
            questions = [q["question"] for q in w.vqa(i)]
            assert len(set(questions)) >= len(questions) - 1  # the first round may repeat its count question
            later = questions[5:]  # after the first round's five
            assert len(set(later)) == len(later) and not set(later) & set(questions[:5])
            assert [q["question_id"] for q in w.vqa(i)] == [i * 1000 + k for k in range(len(questions))]
            statements = w.nlvr2(i)
            assert len({s["sentence"] for s in statements}) == len(statements) <= w.rounds(i)
            assert [s["identifier"] for s in statements] == [f"{split}-{i}-0-{r}" for r in range(len(statements))]
        nlvr2 = [s for i in w.indices(split) for s in w.nlvr2(i)]
        images = len(w.indices(split))
        if w.rounds(w.indices(split)[0]) == 1:
            assert len(splits[split]) == 5 * images and len(nlvr2) == images
        else:  # 2.7x the questions and 2.8x the statements of one round on the default world
            assert len(splits[split]) > 2.5 * 5 * images and len(nlvr2) > 2.5 * images
            labels = Counter(s["label"] for s in nlvr2)
            assert abs(labels["True"] - labels["False"]) <= 0.02 * len(nlvr2)


@pytest.mark.parametrize("name", ["eval_rounds", "train_rounds"])
def test_rounds_must_be_positive(name):
    with pytest.raises(ValueError, match=f"{name} must be >= 1, got 0"):
        ShapesWorld(seed=0, num_images=10, **{name: 0})


def test_balancer_asks_a_question_of_complementary_images():
    from vlkit.data.shapes.balance import AnswerBalancer, Candidate

    balancer = AnswerBalancer({"exist": ("yes", "no")})

    def image(*answers):  # one image's candidates, in preference order: (key, answer)
        return [Candidate("exist", key, answer, f"{key}={answer}") for key, answer in answers]

    assert balancer.pick(image(("red", "yes"), ("blue", "no"))).annotation == "red=yes"
    # "red" was answered yes: another image where it is yes is asked "blue" (no) instead ...
    assert balancer.pick(image(("red", "yes"), ("blue", "no"))).annotation == "blue=no"
    # ... and one where it is no is asked it: the same question on complementary images
    assert balancer.pick(image(("blue", "yes"), ("red", "no"))).annotation == "blue=yes"
    assert balancer.pick(image(("blue", "yes"), ("red", "no"))).annotation == "red=no"  # the template wants a no
    assert balancer.pick(image(("red", "yes"))).annotation == "red=yes"
    # nothing keeps both balanced: the least harm, to the key first ("red": yes 2, no 1), the template second
    assert balancer.pick(image(("red", "yes"), ("blue", "yes"))).annotation == "blue=yes"
    assert balancer.pick(image(("red", "maybe"))) is None  # outside the template's answers
    assert dict(balancer.counts["template", "exist"]) == {"yes": 4, "no": 2}
    # with slack (a later round's question), none rather than a yes given more than 1.1 x as often as no
    assert balancer.pick(image(("green", "yes")), slack=0.1) is None
    assert balancer.pick(image(("green", "yes"), ("green", "no")), slack=0.1).annotation == "green=no"
    assert dict(balancer.counts["template", "exist"]) == {"yes": 4, "no": 3}


def test_vqa_balancing_is_per_split_and_order_free(balanced):
    w, splits = balanced
    again = ShapesWorld(seed=0, num_images=600, val_images=400, eval_rounds=w.eval_rounds, train_rounds=w.train_rounds)
    assert [again.vqa(i) for i in reversed(w.indices("val"))][::-1] == [w.vqa(i) for i in w.indices("val")]
    # one balancer per split, in index order: an image's questions depend on the images before it in its split
    # only, so neither another split's size nor the images after it change them
    other = ShapesWorld(seed=0, num_images=600, val_images=100, eval_rounds=w.eval_rounds, train_rounds=w.train_rounds)
    assert [other.vqa(i) for i in range(700)] == [w.vqa(i) for i in range(700)]


def test_refexp_referents_stand_among_objects_like_them(world):
    """RefCOCO refers to objects among others of their category: of the objects a unique description picks
    out, the referents are the most confusable ones (another object of the same kind and colour, else of the
    same kind or colour)."""
    def confusable(scene, k):
        others = [o for j, o in enumerate(scene.objects) if j != k]
        target = scene.objects[k]
        if any(o.kind == target.kind and o.color == target.color for o in others):
            return 2
        return int(any(o.kind == target.kind or o.color == target.color for o in others))

    among_alike = 0
    for i in range(NUM_IMAGES):
        scene, refs = world.scene(i), world.refexps(i)
        describable = world._unique_refs(scene, positional=True)
        scores = sorted((confusable(scene, k) for k in describable), reverse=True)
        assert [confusable(scene, r["object_index"]) for r in refs] == scores[:len(refs)], i
        among_alike += bool(refs) and confusable(scene, refs[0]["object_index"]) > 0
    assert among_alike >= NUM_IMAGES // 3


def test_every_refexp_box_is_its_objects_box(world, reader):
    n_refs = 0
    for i in range(NUM_IMAGES):
        scene = world.scene(i)
        for ref in world.refexps(i):
            n_refs += 1
            x, y, w, h = ref["bbox"]
            target = scene.objects[ref["object_index"]]
            assert (x, y, x + w, y + h) == target.box and ref["category_id"] == target.class_id
            assert ref["split"] == world.split(i) and 1 <= len(ref["sentences"]) <= 3
            for sent in ref["sentences"]:
                assert reader.resolve(scene, sent["sent"], world.margin) is target
                assert sent["tokens"] == sent["raw"].split()
    assert n_refs >= NUM_IMAGES


def test_captions_name_every_object_by_colour_and_kind(world, reader):
    other_fits = checked = 0
    for i in range(NUM_IMAGES):
        caps = world.captions(i)
        scene = world.scene(i)
        assert len(caps) == 5
        expected = sorted(f"{o.color} {o.kind}" for o in scene.objects)
        for cap in caps:
            listing, _, detail = cap.partition(". ")
            named = re.findall(r"\b(?:a|an) (\w+ (?:circle|square|triangle|diamond|cross))\b", listing)
            assert listing.startswith("a picture of ") and sorted(named) == expected, f"{cap!r} does not list scene {i}"
            if m := re.fullmatch(r"there (?:is|are) (\w+) shapes?\.", detail):
                assert ("zero", "one", "two", "three", "four", "five").index(m.group(1)) == len(scene.objects)
            elif m := re.fullmatch(r"the (largest|smallest) shape is (?:a|an) (.+)\.", detail):
                extent = [o.extent for o in scene.objects]
                obj = scene.objects[extent.index(max(extent) if m.group(1) == "largest" else min(extent))]
                assert m.group(2) == f"{obj.color} {obj.kind}"
            elif detail:
                assert re.fullmatch(r"the .+ is (to the left of|to the right of|above|below) the .+\.", detail), cap
        # a caption is (almost) never true of another image: the multiset of colour + kind differs
        for j in range(NUM_IMAGES):
            if j != i:
                checked += 1
                other_fits += sorted(f"{o.color} {o.kind}" for o in world.scene(j).objects) == expected
    assert other_fits / checked < 0.01


NLVR2_PATTERNS = {"count_side": r"the (left|right) image contains exactly .+\.", "has_side": r"the (left|right) image contains .+\.",
                  "both": r"both images contain .+\.", "total": r"the two images contain .+ in total\.",
                  "more": r"the left image has more .+", "fewer": r"the left image has fewer .+",
                  "only_one": r"only one image contains .+\.", "neither": r"neither image contains .+\."}


def test_nlvr2_pairs_and_balanced_labels(reader):
    w = ShapesWorld(seed=2, num_images=300)
    labels, per_template = Counter(), {}
    for j in range(300):
        [rec] = w.nlvr2(j)
        left, right = int(rec["left_image"]), int(rec["right_image"])
        assert left == j and right != j and w.split(right) == w.split(j)
        assert rec["identifier"].startswith(w.split(j) + "-")
        labels[rec["label"]] += 1
        template = next(t for t, pattern in NLVR2_PATTERNS.items() if re.fullmatch(pattern, rec["sentence"]))
        per_template.setdefault(template, Counter())[rec["label"]] += 1
        if m := re.fullmatch(r"the (left|right) image contains (a|an) (.+)\.", rec["sentence"]):
            scene = w.scene(left if m.group(1) == "left" else right)
            size, color, kind, _ = reader.parse_phrase(m.group(3))
            assert (rec["label"] == "True") == bool(reader.matching(scene, size, color, kind))
        if rec["sentence"] == "the left image has more shapes than the right image.":
            assert (rec["label"] == "True") == (len(w.scene(left).objects) > len(w.scene(right).objects))
    assert set(labels) == {"True", "False"} and abs(labels["True"] - 150) < 30
    for template, counts in per_template.items():  # balanced per statement template, not only overall
        assert abs(counts["True"] - counts["False"]) <= max(3, 0.1 * sum(counts.values())), (template, counts)


def test_snli_ve_balanced_and_true(world, reader):
    labels = Counter()
    for i in range(NUM_IMAGES):
        scene = world.scene(i)
        for rec in world.snli_ve(i):
            labels[rec["gold_label"]] += 1
            assert rec["Flickr30K_ID"] == str(i) and rec["sentence1"] in world.captions(i)
            if m := re.fullmatch(r"there is (a|an) (.+)\.", rec["sentence2"]):
                size, color, kind, _ = reader.parse_phrase(m.group(2))
                assert (rec["gold_label"] == "entailment") == bool(reader.matching(scene, size, color, kind))
            if m := re.fullmatch(r"there is no (.+)\.", rec["sentence2"]):
                size, color, kind, _ = reader.parse_phrase(m.group(1))
                assert (rec["gold_label"] == "entailment") == (not reader.matching(scene, size, color, kind))
    assert labels == {"entailment": NUM_IMAGES, "neutral": NUM_IMAGES, "contradiction": NUM_IMAGES}


def test_tokenizer_covers_every_generated_text(world):
    tok = shapes_tokenizer()
    vocab = shapes_vocab()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(set(vocab)) == len(vocab)
    assert tok.pad_token_id == 0 and tok.mask_token_id == 4 and len(tok) == len(vocab)
    texts = []
    for i in range(NUM_IMAGES):
        texts += world.captions(i) + [q["question"] for q in world.vqa(i)]
        texts += [q["multiple_choice_answer"] for q in world.vqa(i)]
        texts += [s["sent"] for r in world.refexps(i) for s in r["sentences"]]
        texts += [r["sentence"] for r in world.nlvr2(i)] + [h["sentence2"] for h in world.snli_ve(i)]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids, text
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok("The RED Circle")["input_ids"] == tok("the red circle")["input_ids"]


# ---- files on disk --------------------------------------------------------------------------
def test_written_files_and_manifest(shapes_dir, world):
    manifest = json.loads((shapes_dir / FILES["manifest"]).read_text())
    assert manifest["complete"] and manifest["params"] == {"seed": 0, "num_images": NUM_IMAGES, "image_size": 128,
                                                        "split_sizes": list(world.split_sizes)}
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((shapes_dir / rel).read_bytes()).hexdigest() == digest
    written = {str(p.relative_to(shapes_dir)) for p in shapes_dir.rglob("*") if p.is_file()}
    assert written == set(manifest["files"]) | {FILES["manifest"]}
    assert (shapes_dir / "images" / "3.png").read_bytes() == world.png_bytes(3)
    for split in ("train", "val", "test"):
        for key in ("vqa_questions", "vqa_annotations", "nlvr2", "snli_ve"):
            assert FILES[key].format(split=split) in manifest["files"]
    assert manifest["counts"]["images"] == {"train": 32, "val": 4, "test": 4}
    assert (shapes_dir / FILES["vocab"]).read_text().split("\n")[:-1] == shapes_vocab()
    boxes = json.loads((shapes_dir / FILES["boxes"]).read_text())
    assert boxes["classes"] == list(OBJECT_CLASSES)
    assert [tuple(b) for b in boxes["images"][5]["boxes"]] == [o.box for o in world.scene(5).objects]


class _Renders:
    """Counts (and optionally interrupts) the renders of a world."""

    def __init__(self, world, fail_at=None):
        self.calls, self.fail_at, self._png = 0, fail_at, world.png_bytes
        world.png_bytes = self

    def __call__(self, i):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return self._png(i)


def test_rerun_skips_complete_files_and_resumes_after_interruption(tmp_path, shapes_dir):
    out = tmp_path / "resume"
    world = ShapesWorld(seed=0, num_images=NUM_IMAGES)
    renders = _Renders(world, fail_at=25)
    with pytest.raises(KeyboardInterrupt):
        write_shapes(world, out, flush_every=10)
    partial = json.loads((out / FILES["manifest"]).read_text())
    assert not partial["complete"] and len(partial["files"]) == 20
    assert not list(out.rglob("*.tmp")), "an interrupted write left a temporary file"

    world2 = ShapesWorld(seed=0, num_images=NUM_IMAGES)
    renders = _Renders(world2)
    write_shapes(world2, out, flush_every=10)
    assert renders.calls == NUM_IMAGES - 20
    assert _tree_bytes(out) == _tree_bytes(shapes_dir)

    (out / "images" / "7.png").unlink()
    (out / "images" / "8.png").write_bytes(b"corrupt")
    world3 = ShapesWorld(seed=0, num_images=NUM_IMAGES)
    renders = _Renders(world3)
    write_shapes(world3, out)
    assert renders.calls == 2
    assert _tree_bytes(out) == _tree_bytes(shapes_dir)

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    world4 = ShapesWorld(seed=0, num_images=NUM_IMAGES)
    renders = _Renders(world4)
    assert write_shapes(world4, out)["complete"]
    assert renders.calls == 0 and stamps == {p: p.stat().st_mtime_ns for p in out.rglob("*")}


def test_other_params_refuse_to_overwrite(tmp_path):
    out = tmp_path / "w"
    write_shapes(ShapesWorld(seed=0, num_images=12), out)
    before = _tree_bytes(out)
    with pytest.raises(ValueError, match=r"manifest\.json.*seed"):
        write_shapes(ShapesWorld(seed=1, num_images=12), out)
    assert _tree_bytes(out) == before


def test_evaluation_splits_sized_on_their_own():
    world = ShapesWorld(seed=0, num_images=30, val_images=12)
    assert world.num_images == 42 and len(world.indices("train")) == 30
    assert list(world.indices("val")) == list(range(30, 42)) and len(world.indices("test")) == 0
    assert world.split(35) == "val" and "val_images=12" in repr(world)
    # the training images are the same scenes as in a world without the evaluation images
    assert all(world.captions(i) == ShapesWorld(seed=0, num_images=30).captions(i) for i in (0, 7, 29))
    with pytest.raises(ValueError, match="val_images"):
        ShapesWorld(seed=0, num_images=30, val_images=-1)


def test_shared_world_is_one_instance_per_configuration():
    """Every family's environment in a process reads one world per data config (its balanced annotations are
    drawn once), the same annotations as a world of its own."""
    from vlkit.data.shapes import shared_world

    cfg = {"name": "shapes", "seed": 3, "num_images": 30, "val_images": 10, "eval_rounds": 2}
    world = shared_world(cfg)
    assert shared_world({**cfg, "split": "val"}) is world and shared_world({**cfg, "seed": 4}) is not world
    alone = ShapesWorld.from_cfg(cfg)
    assert [world.vqa(i) for i in range(40)] == [alone.vqa(i) for i in range(40)]
