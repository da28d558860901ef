"""The family contract suite: every check vlkit makes of a model family, for a family's own tests to inherit.

    from vlkit.testing import FamilyContract

    class TestMyFamily(FamilyContract):
        family = "myfamily"

pytest collects the ``test_*`` methods of that class (``FamilyContract`` itself is not collected: its name does
not start with ``Test``). Each builds the family's ``preset`` (``tiny``) with `overrides` and checks the contract
of `vlkit.models.base.VLModel` on its `example_batch`: the declaration (`VLModel.check_contract`, the sizes the
data decides, the config's presets), forward equals ``fuse`` of the cached encodings (re-paired too), padding
leaves the real positions alone, the save / load round trip gives identical outputs, every head the family
offers for every task it can serve builds, computes a finite loss on the task's example batch and backprops, and
the family's own pre-training mix (its recipe's ``mix``) does the same with each of its objectives. Its recipe is
checked by the owners of its keys (the trainer preset by `vlkit.train.TrainerConfig`, the objective defaults by
the objectives they set), a family that declares ``keeps_rows`` computes the kept positions exactly, and a training
step of its mix is counted in FLOPs on the meta device (`vlkit.flops.count`, what a comparison's plan counts),
equal to the count of the same step computed. The checks are plain ``assert`` statements (no pytest import), each
naming the family, task or objective at fault.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from vlkit.flops.count import StepShapes, on_meta, pretrain_step_flops
from vlkit.models.base import CONFIG_NAME, DATA_SIZES, WEIGHTS_NAME, VLModel, build_model, from_pretrained
from vlkit.models.recipe import recipe_of
from vlkit.objectives.mix import build_objective, build_pretraining
from vlkit.registry import HEADS, MODELS, TASKS
from vlkit.tasks import IncompatibleTask, build_task
from vlkit.train.trainer import TrainerConfig, TrainerConfigError
from vlkit.types import VLBatch, VLOutput

OUTPUTS = ("text_states", "image_states", "text_pooled", "image_pooled", "joint")


def keep_rows_errors(model: Any, batch: Any, seed: int = 0) -> dict[str, float]:
    """``model.fuse(keep_rows=...)`` against the full fusion of ``batch``, a random 30% of the rows kept: the largest
    difference of the joint vector and of the kept text / image states (``inf`` where an output's shape changes)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        text, image = model.encode_text(batch), model.encode_image(batch)
        full = model.fuse(text, image)
        off = model.image_offset
        keep_t = torch.rand(text.mask.shape, generator=generator) < 0.3
        keep_i = torch.rand((text.mask.shape[0], image.states.shape[1] - off), generator=generator) < 0.3
        kept = model.fuse(text, image, keep_rows=(keep_t, keep_i))
    real_t, real_i = keep_t & text.mask.bool(), keep_i & image.mask[:, off:].bool()
    errors = {}
    for name, pick in (("joint", lambda out: out.joint), ("text_states", lambda out: out.text_states[real_t]),
                       ("image_states", lambda out: out.image_states[:, off:][real_i])):
        if getattr(kept, name).shape != getattr(full, name).shape:
            errors[name] = float("inf")
            continue
        a, b = pick(kept), pick(full)
        errors[name] = (a - b).abs().max().item() if a.numel() else 0.0
    return errors


class FamilyContract:
    """Mixin of the contract tests of the family ``family`` (its registry name), built at ``preset`` with
    ``overrides``; ``batch_size``, ``text_len`` and ``num_regions`` shape the example batches and ``atol`` is the
    tolerance of the re-computations that may round differently (fused vs. forward). Override a method to skip or
    extend one check."""

    family: ClassVar[str | None] = None
    preset: ClassVar[str] = "tiny"
    overrides: ClassVar[Mapping[str, Any]] = {}
    batch_size: ClassVar[int] = 3
    text_len: ClassVar[int] = 9
    num_regions: ClassVar[int] = 7
    atol: ClassVar[float] = 1e-5

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def model_class(self) -> type[VLModel]:
        assert self.family, f"{type(self).__name__}: set `family` to the registered name of the family under test"
        return MODELS.get(self.family)

    def build(self, **overrides: Any) -> VLModel:
        """A fresh model of the family (seeded, eval mode)."""
        torch.manual_seed(0)
        return build_model(self.family, preset=self.preset, **{**self.overrides, **overrides}).eval()

    def example_batch(self, model: VLModel, **kwargs: Any) -> VLBatch:
        defaults = dict(batch_size=self.batch_size, text_len=self.text_len, num_regions=self.num_regions)
        return model.example_batch(**{**defaults, **kwargs})

    def assert_outputs_close(self, got: VLOutput, want: VLOutput, what: str, atol: float | None = None) -> None:
        tol = self.atol if atol is None else atol
        for name in OUTPUTS:
            a, b = getattr(got, name), getattr(want, name)
            assert a.shape == b.shape, f"{self.family}: {what}: {name} has shape {tuple(a.shape)}, not {tuple(b.shape)}"
            diff = (a - b).abs().max().item() if a.numel() else 0.0
            assert diff <= tol, f"{self.family}: {what}: {name} differs by {diff:.3g} (> {tol})"

    def assert_finite_backward(self, loss: torch.Tensor, module: torch.nn.Module, what: str) -> None:
        """``loss`` is a finite scalar whose backward pass reaches ``module``'s weights."""
        assert loss.dim() == 0 and math.isfinite(loss.item()), f"{self.family}: {what}: loss {loss} is not a finite scalar"
        module.zero_grad(set_to_none=True)
        loss.backward()
        reached = [n for n, p in module.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)]
        assert reached, f"{self.family}: {what}: the loss's gradient reaches no weight"
        bad = [n for n, p in module.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        assert not bad, f"{self.family}: {what}: non-finite gradients of {', '.join(bad[:5])}"

    # -- the declaration -------------------------------------------------------------------------
    def test_declares_the_contract(self) -> None:
        cls = self.model_class
        cls.check_contract(self.family)  # raises RegistrationError naming each problem
        assert cls.family == self.family, f"{cls.__name__}.family is {cls.family!r}, registered as {self.family!r}"
        assert self.preset in cls.config_class.presets, \
            f"{self.family}: no preset {self.preset!r} (presets: {', '.join(cls.config_class.presets)})"
        model = self.build()
        config = model.config
        assert type(config)(**config.to_dict()) == config, f"{self.family}: the config does not rebuild from to_dict()"
        taken = DATA_SIZES if cls.image_input == "regions" else ("vocab_size",)
        for size in taken:
            value = model.data_size(size)
            assert value is None or (isinstance(value, int) and value > 0), \
                f"{self.family}: data size {size} (config field {model.data_field(size)}) is {value!r}"
        vocab = model.data_size("vocab_size")  # None: the config takes it otherwise (METER's text tower config)
        assert vocab in (None, model.vocab_size), \
            f"{self.family}: get_input_embeddings() has {model.vocab_size} rows, the config's vocabulary is {vocab}"
        for name in ("text_hidden_size", "image_hidden_size", "joint_size"):
            assert isinstance(getattr(model, name), int), f"{self.family}: {name} is not an int"
        if cls.image_input == "pixels":
            assert model.image_size % model.patch_size == 0, \
                f"{self.family}: image_size {model.image_size} is not a multiple of patch_size {model.patch_size}"

    # -- forward ---------------------------------------------------------------------------------
    def test_example_batch_runs(self) -> None:
        model = self.build()
        batch = self.example_batch(model)
        assert batch.has_regions == (model.image_input == "regions") and batch.has_pixels == (not batch.has_regions)
        with torch.no_grad():
            out = model(batch)
        b, t = batch.input_ids.shape
        assert out.text_states.shape == (b, t, model.text_hidden_size), f"{self.family}: text_states {out.text_states.shape}"
        assert out.joint.shape == (b, model.joint_size), f"{self.family}: joint {tuple(out.joint.shape)}"
        images = batch.region_feats.shape[1] if batch.has_regions else (model.image_size // model.patch_size) ** 2
        assert out.region_states.shape[:2] == (b, images), \
            f"{self.family}: {images} image inputs, {out.region_states.shape[1]} image states after image_offset"
        assert out.image_states.shape[-1] == model.image_hidden_size
        for name in OUTPUTS:
            assert bool(torch.isfinite(getattr(out, name)).all()), f"{self.family}: {name} is not finite"

    def test_forward_equals_fuse_of_the_encodings(self) -> None:
        """``forward == fuse(encode_text, encode_image)``, and encodings re-paired (text i with image j) fuse to
        the forward pass of that pairing: what the caching API (retrieval, shared encodings) relies on."""
        model = self.build()
        batch = self.example_batch(model)
        order = torch.arange(batch.batch_size).roll(1)
        image_keys = [f.name for f in dataclasses.fields(VLBatch) if f.name.startswith(("region_", "pixel_"))
                      and f.name != "region_soft_labels" and getattr(batch, f.name) is not None]
        paired = batch.replace(**{k: getattr(batch, k)[order] for k in image_keys}, region_soft_labels=None)
        with torch.no_grad():
            text, image = model.encode_text(batch), model.encode_image(batch)
            self.assert_outputs_close(model.fuse(text, image), model(batch), "fuse(encode_text, encode_image)", 1e-6)
            self.assert_outputs_close(model.fuse(text, image.index(order)), model(paired), "re-paired encodings", 1e-6)
            pooled = model(batch, pooled_only=True)
        for name in ("text_pooled", "image_pooled", "joint"):
            diff = (getattr(pooled, name) - getattr(model(batch), name)).abs().max().item()
            assert diff <= self.atol, f"{self.family}: pooled_only=True changes {name} by {diff:.3g}"

    def test_padding_leaves_real_positions(self) -> None:
        """More padded tokens (and regions) change no state of the real positions."""
        model = self.build()
        batch = self.example_batch(model, batch_size=1, padded=False)

        def pad(x: torch.Tensor, n: int, value: float = 0) -> torch.Tensor:
            return torch.cat([x, x.new_full((x.shape[0], n, *x.shape[2:]), value)], dim=1)

        fields = dict(input_ids=pad(batch.input_ids, 5), attention_mask=pad(batch.attention_mask, 5))
        if batch.has_regions:
            fields.update(region_feats=pad(batch.region_feats, 4, 0.7), region_boxes=pad(batch.region_boxes, 4, 0.3),
                          region_mask=pad(batch.region_mask, 4), region_soft_labels=None)
        with torch.no_grad():
            plain, padded = model(batch), model(batch.replace(**fields))
        t, n = plain.text_states.shape[1], plain.image_states.shape[1]
        for name, a, b in (("text_states", padded.text_states[:, :t], plain.text_states),
                           ("image_states", padded.image_states[:, :n], plain.image_states),
                           ("joint", padded.joint, plain.joint)):
            diff = (a - b).abs().max().item()
            assert diff <= self.atol, f"{self.family}: padding changes the real positions' {name} by {diff:.3g}"

    def test_keep_rows_computes_the_kept_positions_exactly(self) -> None:
        """A family that declares ``keeps_rows``: ``fuse(keep_rows=...)`` gives the kept token and image positions and
        the joint vector of the full fusion (the pre-training mixture computes only the rows its objectives read)."""
        model = self.build()
        if not model.keeps_rows:
            return  # the declaration matches fuse's signature: test_declares_the_contract
        for name, diff in keep_rows_errors(model, self.example_batch(model, seed=2)).items():
            assert diff <= self.atol, f"{self.family}: fuse(keep_rows=...) changes the kept {name} by {diff:.3g}"

    # -- persistence -----------------------------------------------------------------------------
    def test_save_and_load_round_trip(self) -> None:
        model = self.build()
        batch = self.example_batch(model)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            saved = sorted(p.name for p in Path(tmp).iterdir())
            loaded = from_pretrained(tmp).eval()
        assert saved == sorted([CONFIG_NAME, WEIGHTS_NAME]), f"{self.family}: save_pretrained wrote {saved}"
        assert type(loaded) is type(model) and loaded.config_to_save() == model.config_to_save(), \
            f"{self.family}: from_pretrained gives {type(loaded).__name__} {loaded.config_to_save()}"
        with torch.no_grad():
            self.assert_outputs_close(loaded(batch), model(batch), "save_pretrained / from_pretrained", 0.0)

    # -- its recipe ------------------------------------------------------------------------------
    def test_recipe_keys_belong_to_their_owners(self) -> None:
        """Its recipe's trainer preset is a `TrainerConfig` (keys and values), and each objective it gives defaults
        builds on the family with them (a registered objective, options it takes)."""
        recipe = recipe_of(self.model_class)
        try:
            TrainerConfig.from_cfg(dict(recipe.trainer_preset))
        except TrainerConfigError as err:
            raise AssertionError(f"{self.family}: its recipe's trainer_preset: {err}") from None
        model = self.build()
        for name in recipe.objective_defaults:
            try:
                build_objective(name, model)
            except (LookupError, TypeError, ValueError) as err:
                raise AssertionError(f"{self.family}: its recipe's objective_defaults[{name!r}]: {err}") from None

    # -- what the commands build on the family ---------------------------------------------------
    def test_every_task_head_trains(self) -> None:
        """Each head the family offers (its own or the generic one) for each task it can serve builds, and its
        training loss on the task's example batch is finite and backprops; tasks the family cannot serve refuse
        with `IncompatibleTask`."""
        served = []
        for task in TASKS.names():
            task_cls = TASKS.get(task)
            try:
                task_cls.check(self.model_class)
            except IncompatibleTask:
                continue
            options = task_cls.plan_options({})
            for head in HEADS.names(task, self.family):
                model = self.build()  # a task may change its model (NLVR2's image token types)
                what = f"task {task}, head {head!r}"
                built = build_task(task, model, head=head, **options).train()
                batch = built.example_batch(self.batch_size, self.text_len, self.num_regions)
                self.assert_finite_backward(built(batch).loss, built, what)
                served.append(what)
        assert served, f"{self.family} serves no task"

    def test_default_mix_trains(self) -> None:
        """The family's own pre-training mix (its recipe's ``mix``, `vlkit.models.recipe.recipe_of`) builds, and one
        step of all its objectives at once gives a finite loss that backprops, with each objective's metrics."""
        mix = recipe_of(self.model_class).mix
        assert mix is not None, f"{self.family} declares no pre-training objective mix (its recipe's mix)"
        model = self.build().train()
        pre = build_pretraining(model, mix)
        out = pre(self.example_batch(model), units=pre.units)
        missing = [u.name for u in pre.units if f"objective/{u.name}" not in out.metrics]
        assert not missing, f"{self.family}: its recipe's mix: objectives {', '.join(missing)} computed no loss"
        self.assert_finite_backward(out.loss, pre, "its recipe's mix")

    def test_a_training_step_is_counted_on_the_meta_device(self) -> None:
        """A step of its recipe's mix, counted in FLOPs on the meta device without computing (what a comparison's
        plan does with every unit), equals torch's count of the same step computed (within 1%), per objective."""
        mix = recipe_of(self.model_class).mix
        shapes = StepShapes(self.batch_size, self.text_len, self.num_regions)
        counted = pretrain_step_flops(on_meta(lambda: build_pretraining(self.build(), mix)), shapes)
        computed = pretrain_step_flops(build_pretraining(self.build(), mix), shapes, values=True)
        assert counted["per_step"] > 0, f"{self.family}: a training step of its mix counts no FLOPs"
        for name, flops in computed["per_objective"].items():
            got = counted["per_objective"].get(name)
            assert got is not None and abs(got - flops) <= 0.01 * flops, \
                f"{self.family}: a step of {name} counts {got} FLOPs on the meta device, {flops} computed"
