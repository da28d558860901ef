"""The shapes world's language: templates and the descriptions of scene objects, the annotations built
from them (captions, VQA questions, referring expressions, NLVR2 statements, SNLI-VE hypotheses), and
the closed-vocabulary tokenizer over every word they can produce."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from vlkit.data.shapes.balance import AnswerBalancer, Candidate
from vlkit.data.shapes.scenes import COLORS, KINDS, SIZES, Scene, ShapeObject, _MARGIN

_PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles", "diamond": "diamonds",
           "cross": "crosses", "shape": "shapes", "object": "objects"}
_NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_POSITIONS = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom"}
_RELATIONS = {"left": "to the left of", "right": "to the right of", "above": "above", "below": "below"}

# Text templates. Every literal word of the world's language appears in one of the tuples below
# (or in the constants above), which is how `shapes_tokenizer` builds its closed vocabulary.
# Every caption lists every object of its scene by colour and kind, in a random order, so a caption is
# almost never true of another image: image-text matching has something to learn at a small scale.
# A second sentence sometimes adds the count, the largest / smallest shape or a relation. (Templates that
# moved the listing around, with counts and sizes inside it, made ITM emerge two to three times slower.)
_CAPTION_TEMPLATES = ("a picture of {listing}.",)
_CAPTION_DETAILS = {  # what a caption's second sentence says
    "count": "there {be} {n} {things}",
    "relation": "{ref} is {relation} {ref2}",
    "largest": "the largest shape is {a_obj}",
    "smallest": "the smallest shape is {a_obj}",
}
CAPTION_DETAIL_PROB = 0.5
_VQA_TEMPLATES = {
    "color": "what color is {ref}?",
    "shape": "what shape is {ref}?",
    "count": "how many {things} are there?",
    "exist": "is there {a_obj}?",
    "relation": "is {ref} {relation} {ref2}?",
    "side_h": "is {ref} to the left or to the right of {ref2}?",
    "side_v": "is {ref} above or below {ref2}?",
}
_NLVR2_TEMPLATES = {
    "count_side": "the {side} image contains exactly {count}.",
    "has_side": "the {side} image contains {a_obj}.",
    "both": "both images contain {a_obj}.",
    "total": "the two images contain {count} in total.",
    "more": "the left image has more shapes than the right image.",
    "fewer": "the left image has fewer shapes than the right image.",
    "only_one": "only one image contains {a_obj}.",
    "neither": "neither image contains {a_obj}.",
}
_VE_TEMPLATES = {
    "exist": "there is {a_obj}.",
    "absent": "there is no {obj}.",
    "count": "there are exactly {n} {things}.",
    "relation": "{ref} is {relation} {ref2}.",
    "all_color": "all the shapes are {color}.",
}
_NEUTRAL_TEMPLATES = (
    "{ref} is made of {material}.",
    "{ref} was drawn by {person}.",
    "{ref} is {temperature}.",
    "the picture was made {time}.",
    "someone is looking at {ref}.",
)
_NEUTRAL_FILLERS = {
    "material": ("wood", "paper", "plastic", "metal", "glass"),
    "person": ("a child", "a teacher", "an artist", "a robot"),
    "temperature": ("warm", "cold", "heavy", "light", "soft"),
    "time": ("yesterday", "last year", "in the morning", "at night"),
}
_ANSWER_WORDS = ("yes", "no", "left", "right", "above", "below")
_OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}
_PATTERNS = tuple((k, c, z) for k in (False, True) for c in (False, True) for z in (False, True))
MAX_COUNT = 3  # count answers range over 0..MAX_COUNT
# Every template's answers, each equally likely over a split (`vlkit.data.shapes.balance`)
VQA_ANSWER_RANGES = {"color": COLORS, "shape": KINDS, "count": tuple(str(n) for n in range(MAX_COUNT + 1)),
                     "exist": ("yes", "no"), "relation": ("yes", "no"), "side_h": ("left", "right"),
                     "side_v": ("above", "below")}
NLVR2_LABEL_RANGES = {name: ("True", "False") for name in _NLVR2_TEMPLATES}
ROUND_SLACK = 0.1  # a later round's question may not make its answer more than 10% more frequent than the rarest
DRAWS = 24  # candidate annotations drawn per image and slot, in preference order, for the balancer


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _phrase(kind: str | None, color: str | None = None, size: str | None = None, plural: bool = False,
            noun: str = "shape") -> str:
    """"large red circle", "red shapes": the attributes given, then the kind (or ``noun``)."""
    head = kind or noun
    return " ".join(w for w in (size, color, _PLURAL[head] if plural else head) if w)


# --------------------------------------------------------------------------------------------
# Referring to objects
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ref:
    """A description "the [size] [color] kind|noun [position]" of one object of a scene."""

    size: str | None
    color: str | None
    kind: str | None
    position: str | None = None

    def phrase(self, noun: str = "shape") -> str:
        return _phrase(self.kind, self.color, self.size, noun=noun) + \
            (" " + _POSITIONS[self.position] if self.position else "")

    def the(self, noun: str = "shape") -> str:
        return "the " + self.phrase(noun)


def _extreme(objs: Sequence[ShapeObject], position: str, margin: float) -> ShapeObject | None:
    """The object of two that is clearly on the ``position`` side of the other, else None."""
    axis = 0 if position in ("left", "right") else 1
    a, b = sorted(objs, key=lambda o: o.center[axis])
    if b.center[axis] - a.center[axis] < margin:
        return None
    return a if position in ("left", "top") else b


def _referring(scene: Scene, idx: int, exclude: Iterable[str] = (), positional: bool = True,
               margin: float = _MARGIN) -> list[_Ref]:
    """Every description that picks out object ``idx`` alone (attributes in ``exclude`` unused)."""
    target = scene.objects[idx]
    refs = []
    for use_size in (False, True):
        for use_color in (False, True):
            for use_kind in (False, True):
                ref = _Ref(target.size if use_size else None, target.color if use_color else None,
                           target.kind if use_kind else None)
                if any(getattr(ref, a) is not None for a in exclude):
                    continue
                same = [o for o in scene.objects if o.matches(ref.kind, ref.color, ref.size)]
                if len(same) == 1:
                    refs.append(ref)
                elif positional and len(same) == 2:
                    refs += [_Ref(ref.size, ref.color, ref.kind, p) for p in _POSITIONS
                             if _extreme(same, p, margin) is target]
    return refs


def _relation_holds(a: ShapeObject, b: ShapeObject, relation: str, margin: float) -> bool | None:
    """Whether ``a`` is ``relation`` ``b``; None when the centres are too close to tell."""
    axis = 0 if relation in ("left", "right") else 1
    d = a.center[axis] - b.center[axis]
    if abs(d) < margin:
        return None
    return (d < 0) == (relation in ("left", "above"))


def _confusable(scene: Scene, k: int) -> int:
    """How hard object ``k`` is to pick out: 2 when another object shares its kind and colour, 1 its kind or
    its colour, else 0 (RefCOCO's referents stand among objects of their own category)."""
    target, others = scene.objects[k], [o for j, o in enumerate(scene.objects) if j != k]
    if any(o.kind == target.kind and o.color == target.color for o in others):
        return 2
    return int(any(o.kind == target.kind or o.color == target.color for o in others))


def _count_phrase(n: int, kind: str | None = None, color: str | None = None, size: str | None = None) -> str:
    """"two red circles", "one large shape", "no squares"."""
    return f"{_NUMBER_WORDS[n]} {_phrase(kind, color, size, plural=n != 1)}"


class ShapesLanguage:
    """The annotations of a world of scenes (``scene(i)``, ``_rng(stream, i)``, ``margin``, ``image_id``,
    ``num_images`` come from `vlkit.data.shapes.scenes.ShapeScenes`)."""

    # ---- text helpers -----------------------------------------------------------------------
    def _unique_refs(self, scene: Scene, exclude: Iterable[str] = (), positional: bool = False) -> dict[int, list[_Ref]]:
        """Object index -> its unique descriptions (objects without one are left out)."""
        out = {}
        for k in range(len(scene.objects)):
            refs = _referring(scene, k, exclude, positional, self.margin)
            if refs:
                out[k] = refs
        return out

    @staticmethod
    def _pick(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
        return seq[int(rng.integers(len(seq)))]

    def _clear_pairs(self, scene: Scene, refs: dict[int, list[_Ref]]) -> list[tuple[int, int, str]]:
        """(a, b, relation) for uniquely describable objects (``refs``: `_unique_refs`) whose relation is clear."""
        out = []
        for a in refs:
            for b in refs:
                if a != b:
                    out += [(a, b, r) for r in _RELATIONS
                            if _relation_holds(scene.objects[a], scene.objects[b], r, self.margin)]
        return out

    def _random_attrs(self, rng: np.random.Generator, scene: Scene, from_scene: bool) -> tuple[str | None, ...]:
        """(kind, color, size) with a random subset set (at least one), from a scene object or at random."""
        return self._values(rng, scene, self._pattern(rng), from_scene)

    @staticmethod
    def _a_obj(kind: str | None, color: str | None, size: str | None) -> str:
        return _article(_phrase(kind, color, size))

    # ---- captions ---------------------------------------------------------------------------
    def captions(self, i: int) -> list[str]:
        """Five captions, each true of the scene: every object by colour and kind, sometimes followed by a
        second sentence on the count, the largest / smallest shape or one spatial relation."""
        scene, rng = self.scene(i), self._rng("captions", i)
        names = [self._a_obj(o.kind, o.color, None) for o in scene.objects]
        return [self._caption(rng, scene, names) for _ in range(5)]

    def _caption(self, rng: np.random.Generator, scene: Scene, names: list[str]) -> str:
        parts = [names[k] for k in rng.permutation(len(names))]
        listing = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        text = _CAPTION_TEMPLATES[int(rng.integers(len(_CAPTION_TEMPLATES)))].format(listing=listing)
        detail = self._detail(rng, scene) if rng.random() < CAPTION_DETAIL_PROB else None
        return text if detail is None else f"{text} {detail}."

    def _detail(self, rng: np.random.Generator, scene: Scene) -> str | None:
        """A sentence on the scene's count, its largest / smallest shape or a clear relation (None if none holds)."""
        kind = list(_CAPTION_DETAILS)[int(rng.integers(len(_CAPTION_DETAILS)))]
        template, objs, n = _CAPTION_DETAILS[kind], scene.objects, len(scene.objects)
        if kind == "count":
            return template.format(be="is" if n == 1 else "are", n=_NUMBER_WORDS[n],
                                   things=_PLURAL["shape"] if n > 1 else "shape")
        if kind == "relation":
            refs = self._unique_refs(scene)
            pairs = self._clear_pairs(scene, refs)
            if not pairs:
                return None
            a, b, r = self._pick(rng, pairs)
            return template.format(ref=self._pick(rng, refs[a]).the(), relation=_RELATIONS[r],
                                   ref2=self._pick(rng, refs[b]).the())
        extent = [o.extent for o in objs]
        best = max(extent) if kind == "largest" else min(extent)
        if n < 2 or extent.count(best) > 1:
            return None
        obj = objs[extent.index(best)]
        return template.format(a_obj=self._a_obj(obj.kind, obj.color, None))

    # ---- VQA --------------------------------------------------------------------------------
    def vqa(self, i: int) -> list[dict]:
        """VQA v2 style questions with 10 answers each (question and annotation fields merged): one colour,
        shape, count, existence and spatial question per image and round (`rounds`), balanced over the
        image's split; ``question_id`` is ``image index x 1000 + k``, as VQA v2's."""
        return self._balanced("vqa", i)

    @functools.cached_property
    def _balanced_cache(self) -> dict[tuple[str, str], dict[int, Any]]:
        return {}

    def _balanced(self, stream: str, i: int) -> Any:
        """Annotation ``stream`` of image ``i``, made for the images of its split in index order by one
        `AnswerBalancer` (so a question is asked of complementary images and every answer in its range is
        equally likely); cached per split."""
        i, cache = self._check(i), self._balanced_cache
        split = self.split(i)
        if (stream, split) not in cache:
            make, ranges = {"vqa": (self._vqa_of, VQA_ANSWER_RANGES), "nlvr2": (self._nlvr2_of, NLVR2_LABEL_RANGES)}[stream]
            balancer = AnswerBalancer(ranges)
            cache[stream, split] = {k: make(k, balancer) for k in self.indices(split)}
        return cache[stream, split][i]

    def _vqa_of(self, i: int, balancer: AnswerBalancer) -> list[dict]:
        scene, rng = self.scene(i), self._rng("vqa", i)
        out: list[dict] = []
        for r in range(self.rounds(i)):  # a later round: new questions that keep the split balanced, no counts
            asked = {q["question"] for q in out} if r else ()  # (too few scenes hold 3 of a kind to balance them)
            makers = (self._q_color, self._q_shape, self._q_count, self._q_exist, self._q_relation)
            slots = [make(rng, scene) for make in makers if r == 0 or make != self._q_count]
            for candidates in slots:
                if r == 0:  # a slot without candidates (no unique reference, no clear pair) asks a count
                    candidates = candidates or self._q_count(rng, scene)
                chosen = balancer.pick((c for c in candidates if c.annotation[0] not in asked),
                                       slack=ROUND_SLACK if r else None)
                if chosen is None:
                    continue
                question, answer, answer_type, question_type, distractors = chosen.annotation
                out.append({
                    "question_id": int(i) * 1000 + len(out), "image_id": int(i), "question": question,
                    "answers": self._human_answers(rng, answer, distractors),
                    "multiple_choice_answer": answer, "answer_type": answer_type, "question_type": question_type,
                })
        return out

    @staticmethod
    def _human_answers(rng: np.random.Generator, answer: str, distractors: Sequence[str]) -> list[dict]:
        """Ten simulated annotators: most give ``answer``, up to three give a plausible wrong one."""
        n_wrong = int(rng.choice([0, 0, 0, 1, 1, 2, 3]))
        wrong_at = set(rng.choice(10, size=n_wrong, replace=False).tolist())
        answers = []
        for k in range(10):
            wrong = k in wrong_at and distractors
            answers.append({"answer": distractors[int(rng.integers(len(distractors)))] if wrong else answer,
                            "answer_confidence": "maybe" if wrong else "yes", "answer_id": k + 1})
        return answers

    def _pattern(self, rng: np.random.Generator) -> tuple[bool, bool, bool]:
        """Which of (kind, color, size) a question names: each with its own probability, at least one."""
        keep = rng.random(3) < (0.7, 0.6, 0.3)
        if not keep.any():
            keep[int(rng.integers(2))] = True
        return tuple(bool(k) for k in keep)

    def _values(self, rng: np.random.Generator, scene: Scene, pattern: Sequence[bool],
                from_scene: bool) -> tuple[str | None, ...]:
        """(kind, color, size) of a scene object or drawn at random, with the attributes ``pattern`` leaves out None."""
        source = self._pick(rng, scene.objects) if from_scene and scene.objects else None
        values = (source.kind, source.color, source.size) if source else \
            (self._pick(rng, KINDS), self._pick(rng, COLORS), self._pick(rng, SIZES))
        return tuple(v if k else None for v, k in zip(values, pattern))

    def _q_attribute(self, rng, scene, attr: str, template: str, qtype: str, values: Sequence[str]) -> list[Candidate]:
        refs = self._unique_refs(scene, exclude=(attr,))
        out = []
        for _ in range(DRAWS if refs else 0):
            k = self._pick(rng, sorted(refs))
            answer = getattr(scene.objects[k], attr)
            question = _VQA_TEMPLATES[template].format(ref=self._pick(rng, refs[k]).the("object"))
            out.append(Candidate(template, template, answer,
                                 (question, answer, "other", qtype, [v for v in values if v != answer])))
        return out

    def _q_color(self, rng, scene):
        return self._q_attribute(rng, scene, "color", "color", "what color is the", COLORS)

    def _q_shape(self, rng, scene):
        return self._q_attribute(rng, scene, "kind", "shape", "what shape is the", KINDS)

    def _q_count(self, rng, scene) -> list[Candidate]:
        """Counts of attributes drawn as a question's would be, then of every attribute set of the scene's
        objects (so that the rarer large counts are there when the balancer needs them)."""
        draws = []
        for _ in range(DRAWS):
            pattern = (False, False, False) if rng.random() < 0.15 else self._pattern(rng)  # "how many shapes"
            draws.append(self._values(rng, scene, pattern, from_scene=rng.random() < 0.6))
        present = sorted({tuple(v if k else None for v, k in zip((o.kind, o.color, o.size), pattern))
                          for o in scene.objects for pattern in _PATTERNS}, key=str)
        out = []
        for kind, color, size in draws + [present[k] for k in rng.permutation(len(present))]:
            n = scene.count(kind, color, size)
            question = _VQA_TEMPLATES["count"].format(things=_phrase(kind, color, size, plural=True))
            out.append(Candidate("count", ("count", (kind is not None, color is not None, size is not None)), str(n),
                                 (question, str(n), "number", "how many", [str(m) for m in (n - 1, n + 1) if m >= 0])))
        return out

    def _q_exist(self, rng, scene) -> list[Candidate]:
        out = []
        for _ in range(DRAWS):
            pattern, want = self._pattern(rng), bool(rng.random() < 0.5)
            for _ in range(10):  # "no": values of no object of the scene
                kind, color, size = self._values(rng, scene, pattern, from_scene=want)
                if (scene.count(kind, color, size) > 0) == want:
                    break
            answer = "yes" if scene.count(kind, color, size) > 0 else "no"
            question = _VQA_TEMPLATES["exist"].format(a_obj=self._a_obj(kind, color, size))
            out.append(Candidate("exist", ("exist", pattern), answer,
                                 (question, answer, "yes/no", "is there a", ["no" if answer == "yes" else "yes"])))
        return out

    def _q_relation(self, rng, scene) -> list[Candidate]:
        """"Is A <relation> B?" (yes / no) and "is A to the left or to the right of B?" questions."""
        refs = self._unique_refs(scene)
        pairs = self._clear_pairs(scene, refs)
        out = []
        for _ in range(DRAWS if pairs else 0):
            a, b, rel = self._pick(rng, pairs)
            ref, ref2 = self._pick(rng, refs[a]).the("object"), self._pick(rng, refs[b]).the("object")
            if rng.random() < 0.5:
                asked = self._pick(rng, list(_RELATIONS))
                holds = _relation_holds(scene.objects[a], scene.objects[b], asked, self.margin)
                if holds is None:  # the other axis is unclear
                    continue
                answer = "yes" if holds else "no"
                question = _VQA_TEMPLATES["relation"].format(ref=ref, relation=_RELATIONS[asked], ref2=ref2)
                out.append(Candidate("relation", ("relation", asked), answer,
                                     (question, answer, "yes/no", "is the", ["no" if holds else "yes"])))
            else:
                template = "side_h" if rel in ("left", "right") else "side_v"
                other = _OPPOSITE[rel]
                question = _VQA_TEMPLATES[template].format(ref=ref, ref2=ref2)
                qtype = "left or right" if template == "side_h" else "above or below"
                out.append(Candidate(template, template, rel, (question, rel, "other", qtype, [other])))
        return out

    # ---- referring expressions --------------------------------------------------------------
    def refexps(self, i: int) -> list[dict]:
        """RefCOCO-style refs: up to two objects, each with up to three unique descriptions."""
        scene, rng = self.scene(i), self._rng("refexp", i)
        refs = self._unique_refs(scene, positional=True)
        chosen = sorted(refs)
        rng.shuffle(chosen)
        chosen.sort(key=lambda k: -_confusable(scene, k))  # stable: at random among equally confusable ones
        out = []
        for k in chosen[:2]:
            options = list(refs[k])
            rng.shuffle(options)
            ref_id = int(i) * 10 + len(out)
            sents = []
            for s, r in enumerate(options[:3]):
                text = r.the() if rng.random() < 0.7 else r.phrase()
                sents.append({"tokens": text.split(), "raw": text, "sent_id": ref_id * 10 + s, "sent": text})
            x0, y0, x1, y1 = scene.objects[k].box
            out.append({
                "ref_id": ref_id, "ann_id": int(i) * 10 + k, "image_id": int(i), "split": self.split(i),
                "file_name": f"{i}.png", "sent_ids": [s["sent_id"] for s in sents], "sentences": sents,
                "category_id": scene.objects[k].class_id, "object_index": k, "bbox": [x0, y0, x1 - x0, y1 - y0],
            })
        return out

    # ---- NLVR2 ------------------------------------------------------------------------------
    def nlvr2_partner(self, j: int) -> int:
        """The right image of statement ``j`` (its left image is ``j``): another image of the same split."""
        pool = self.indices(self.split(j))
        if len(pool) == 1:
            return int(j)
        k = int(self._rng("nlvr2_pair", j).integers(len(pool) - 1))
        k += pool.start
        return k + 1 if k >= j else k

    def nlvr2(self, j: int) -> list[dict]:
        """Statements about images (j, partner) with a True/False label, one per round (`rounds`), balanced
        per template over the split; identifiers ``<split>-<j>-0-<k>`` (NLVR2's ``split-set-pair-sentence``)."""
        return self._balanced("nlvr2", j)

    def _nlvr2_of(self, j: int, balancer: AnswerBalancer) -> list[dict]:
        right, split = self.nlvr2_partner(j), self.split(j)
        scenes, rng = (self.scene(j), self.scene(right)), self._rng("nlvr2", j)
        out: list[dict] = []
        for r in range(self.rounds(j)):
            said = {s["sentence"] for s in out}
            candidates = []
            for _ in range(2 * DRAWS):
                template, key, sentence, label = self._nlvr2_statement(rng, *scenes)
                if sentence not in said:
                    candidates.append(Candidate(template, key, str(label), sentence))
            chosen = balancer.pick(candidates, slack=ROUND_SLACK if r else None)
            if chosen is not None:
                out.append({"identifier": f"{split}-{j}-0-{len(out)}", "left_image": str(j), "right_image": str(right),
                            "sentence": chosen.annotation, "label": chosen.answer})
        return out

    def _nlvr2_statement(self, rng, left: Scene, right: Scene) -> tuple[str, tuple, str, bool]:
        """(template, balancing key: the template, the attributes named and the number said, statement, truth)."""
        name = self._pick(rng, list(_NLVR2_TEMPLATES))
        t = _NLVR2_TEMPLATES[name]
        both = (left, right)
        kind, color, size = self._random_attrs(rng, self._pick(rng, both), from_scene=rng.random() < 0.6)
        a_obj, named = self._a_obj(kind, color, size), tuple(v is not None for v in (kind, color, size))
        has = [s.count(kind, color, size) > 0 for s in both]
        if name in ("count_side", "has_side"):
            side = self._pick(rng, ("left", "right"))
            scene = both[side == "right"]
            if name == "has_side":
                return name, (name, named), t.format(side=side, a_obj=a_obj), has[side == "right"]
            n = int(rng.integers(1, 4))
            return name, (name, named, n), t.format(side=side, count=_count_phrase(n, kind, color, size)), \
                scene.count(kind, color, size) == n
        if name == "total":
            n = int(rng.integers(0, 6))
            truth = sum(s.count(kind, color, size) for s in both) == n
            return name, (name, named, n), t.format(count=_count_phrase(n, kind, color, size)), truth
        if name in ("more", "fewer"):
            d = len(left.objects) - len(right.objects)
            return name, (name,), t, d > 0 if name == "more" else d < 0
        truth = {"both": all(has), "only_one": sum(has) == 1, "neither": not any(has)}[name]
        return name, (name, named), t.format(a_obj=a_obj), truth

    # ---- SNLI-VE ----------------------------------------------------------------------------
    def snli_ve(self, i: int) -> list[dict]:
        """Three hypotheses about image ``i``: one entailed, one neutral, one contradicted (SNLI-VE fields)."""
        scene, rng = self.scene(i), self._rng("snli_ve", i)
        premise = self.captions(i)[0]
        out = []
        for k, label in enumerate(("entailment", "neutral", "contradiction")):
            if label == "neutral":
                hyp = self._ve_neutral(rng, scene)
            else:
                for _ in range(60):
                    hyp, truth = self._ve_claim(rng, scene)
                    if truth == (label == "entailment"):
                        break
                else:
                    raise RuntimeError(f"{self!r}: no {label} hypothesis found for image {i}")
            out.append({"Flickr30K_ID": str(i), "captionID": f"{i}.png#0", "pairID": f"{i}.png#0r{k}{label[0]}",
                        "sentence1": premise, "sentence2": hyp, "gold_label": label,
                        "annotator_labels": [label]})
        return out

    def _ve_claim(self, rng, scene: Scene) -> tuple[str, bool]:
        name = self._pick(rng, list(_VE_TEMPLATES))
        refs = self._unique_refs(scene) if name == "relation" else {}
        pairs = self._clear_pairs(scene, refs)
        if name == "relation" and not pairs:
            name = "exist"
        t = _VE_TEMPLATES[name]
        kind, color, size = self._random_attrs(rng, scene, from_scene=rng.random() < 0.5)
        n_match = scene.count(kind, color, size)
        if name == "exist":
            return t.format(a_obj=self._a_obj(kind, color, size)), n_match > 0
        if name == "absent":
            return t.format(obj=_phrase(kind, color, size)), n_match == 0
        if name == "count":
            n = int(rng.integers(2, 6))
            return t.format(n=_NUMBER_WORDS[n], things=_phrase(kind, color, size, plural=True)), n_match == n
        if name == "all_color":
            c = self._pick(rng, COLORS)
            return t.format(color=c), len(scene.objects) > 1 and scene.count(color=c) == len(scene.objects)
        a, b, rel = self._pick(rng, pairs)
        asked = self._pick(rng, list(_RELATIONS))
        holds = _relation_holds(scene.objects[a], scene.objects[b], asked, self.margin)
        if holds is None:
            asked, holds = rel, True
        text = t.format(ref=self._pick(rng, refs[a]).the(), relation=_RELATIONS[asked],
                        ref2=self._pick(rng, refs[b]).the())
        return text, holds

    def _ve_neutral(self, rng, scene: Scene) -> str:
        refs = self._unique_refs(scene)
        t = self._pick(rng, _NEUTRAL_TEMPLATES)
        fields = {k: self._pick(rng, v) for k, v in _NEUTRAL_FILLERS.items()}
        if refs:
            fields["ref"] = self._pick(rng, refs[self._pick(rng, sorted(refs))]).the()
        elif "{ref}" in t:
            t = _NEUTRAL_TEMPLATES[3]
        return t.format(**fields)


# --------------------------------------------------------------------------------------------
# Tokenizer over the world's closed vocabulary
# --------------------------------------------------------------------------------------------
_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_PUNCTUATION = ("!", "'", ",", "-", ".", ":", ";", "?")


def shapes_vocab() -> list[str]:
    """The WordPiece vocabulary: special tokens ([PAD]=0), punctuation, digits, then every word
    the world's templates and fillers can produce, sorted."""
    texts: list[str] = [*_CAPTION_TEMPLATES, *_CAPTION_DETAILS.values(), *_VQA_TEMPLATES.values(),
                        *_NLVR2_TEMPLATES.values(),
                        *_VE_TEMPLATES.values(), *_NEUTRAL_TEMPLATES, *_POSITIONS.values(), *_RELATIONS.values(),
                        *(w for ws in _NEUTRAL_FILLERS.values() for w in ws), *_NUMBER_WORDS, *_PLURAL,
                        *_PLURAL.values(), *KINDS, *COLORS, *SIZES, *_ANSWER_WORDS, "a an the and"]
    words = set()
    for t in texts:
        words.update(re.findall(r"[a-z]+", re.sub(r"\{[a-z_0-9]*\}", " ", t)))
    return [*_SPECIAL_TOKENS, *_PUNCTUATION, *(str(d) for d in range(10)), *sorted(words)]


@functools.lru_cache(maxsize=1)
def shapes_tokenizer():
    """A lower-casing `BertTokenizerFast` over `shapes_vocab` (built in memory, no download)."""
    from transformers import BertTokenizerFast

    vocab = {tok: k for k, tok in enumerate(shapes_vocab())}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=512)
