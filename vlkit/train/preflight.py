"""The preflight: what a run can check before step 1, every problem listed at once.

`pipeline.pretrain_model`, `pipeline.finetune_task` and `vlkit evaluate` (so every command and every
unit of `vlkit compare`) fill a `Preflight` and call `Preflight.finish` before training or evaluating:
it raises `PreflightError` listing every problem found, each naming the file, id or key at fault, or
writes ``<output_dir>/preflight.json`` (what was checked, what was skipped, what was truncated).

Checked fully (cheap whatever the data size: metadata, indexes, configs):

- the output folder: a previous run (a checkpoint) without ``resume=true``, a file in its place, no write
  permission; a run that failed before its first checkpoint does not block its rerun;
- the tokenizer against the model's word embeddings and ``init=``'s saved tokenizer, and against the text: the
  share of its tokens that are ``[UNK]`` (on up to 5,000 texts of each set) above ``data.max_unk_rate``; the mix's masking
  options (known keys; the text policy against the tokenizer: ``whole_word`` needs WordPiece ``##`` tokens);
- ``init=``: the saved model's family against an explicit ``model=``, explicit ``model.<field>`` values
  that the saved model would silently override;
- the objective mix: unknown objectives, objectives the family cannot serve, soft labels (and their
  class count) for MRC / MRC-kl;
- the data against the model: regions vs pixels, the store's feature dimension against the model's
  region projection, every example's image id against the feature store's index or the image
  folder's files; empty texts are refused when the dataset is built; truncated texts are counted.

Sampled (reading images costs I/O): the regions of ``SAMPLES`` images of each training set spread
evenly over it, and of every image of an evaluation set up to ``FULL_EVAL`` images (else a sample of
that size), loaded through the data's image source, which validates them (`vlkit.validate.region_problems`:
finite values, at least one box, boxes inside the image and well-ordered; image files decoded). Images
that were not sampled are validated when they are loaded, under the same ``data.on_error`` policy.
Generated images (the shapes world rendered on the fly) are neither looked up nor sampled.

With ``data.on_error=skip`` an example whose image is missing or fails validation is not a problem:
it is left out and recorded in ``<output_dir>/skipped.jsonl``. Retrieval evaluation sets cannot
leave images out (the gallery would change), so their problems stay problems.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from vlkit.data.images import id_mismatch, image_index
from vlkit.data.tokenizers import TokenizerError, build_tokenizer, run_tokenizer, same_vocabulary
from vlkit.data.unknown import MAX_UNK_RATE, dataset_texts, unknown_tokens
from vlkit.io import atomic_write_text, remove_orphans
from vlkit.models.base import CONFIG_NAME, VLModel
from vlkit.objectives.base import IncompatibleObjective
from vlkit.objectives.corruption import MaskedText, masking_options
from vlkit.objectives.masking import TOKEN_POLICIES
from vlkit.objectives.mix import load_mix, mix_objectives
from vlkit.registry import MODELS, OBJECTIVES, UnknownNameError
from vlkit.train import checkpoint as ckpt
from vlkit.train.resume import SAFE_TO_CHANGE, differences
from vlkit.train.trainer import CHECKPOINTS, TrainerConfig, TrainerConfigError, previous_run
from vlkit.validate import SKIPPED_FILE, DataError, SkipLog, first, nonfinite_parameters, sample_evenly
from vlkit.version import __version__

PREFLIGHT_FILE = "preflight.json"
SAMPLES = 256  # training images whose regions are loaded and validated
FULL_EVAL = 5000  # evaluation sets up to this many images are validated in full
RUN_FILES = ("run.json", "pretraining.safetensors", "task.safetensors", "eval.json", PREFLIGHT_FILE,
             "model/config.json", "model/model.safetensors", "checkpoints/latest")


class PreflightError(DataError):
    """Problems found before step 1; ``problems`` lists them, each naming its culprit."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) found before step 1 (nothing was trained or written):\n{lines}")


def _unwrap(model: Any) -> Any:
    """The `VLModel` of a model or of a training module (`Pretraining`, a task)."""
    while not isinstance(model, VLModel) and hasattr(model, "model"):
        model = model.model
    return model


def read_init(init: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(config.json, its content) of ``init=``: a run's output_dir (``model/config.json``) or a model directory."""
    root = Path(init)
    for path in (root / "model" / CONFIG_NAME, root / CONFIG_NAME):
        if path.is_file():
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
                return path, {"name": meta["family"], **meta["config"]}
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as err:
                raise DataError(f"init={init}: {path} is not a vlkit model config ({type(err).__name__}: {err})") from err
    if not root.exists():
        raise DataError(f"init={init} does not exist")
    raise DataError(f"init={init} is neither a vlkit run (no model/{CONFIG_NAME}) nor a saved model (no {CONFIG_NAME})")


class Preflight:
    """Collects the problems of a run before step 1 (see the module docstring); `finish` reports them."""

    def __init__(self, samples: int = SAMPLES, full_eval: int = FULL_EVAL):
        self.samples, self.full_eval = samples, full_eval
        self.problems: list[str] = []
        self.notes: dict[str, Any] = {}
        self._skips: list[SkipLog] = []
        self._init: Any = None

    def problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    # -- the output folder -------------------------------------------------------------------------
    def check_output_dir(self, output_dir: str | os.PathLike, resume: bool, key: str = "trainer.output_dir") -> None:
        if not str(output_dir).strip():
            self.problem(f"{key} is empty: name the folder the run writes to")
            return
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            self.problem(f"{key}={out} is a file, not a folder")
            return
        saved = previous_run(out)
        if saved is None and (out / "run.json").is_file():  # a converted checkpoint or a saved model: no run in it
            self.problem(f"{key}={out} holds a saved model (run.json without checkpoints, e.g. what vlkit convert "
                         f"writes), not a run{' to continue' if resume else ''}: start from it with init={out} and "
                         f"write to another {key}")
        previous = None if resume else saved
        if previous is not None:
            self.problem(f"{key}={out} already holds a run ({previous}); pass resume=true to continue it or choose "
                         f"another {key}")
        parent = out
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if parent.exists() and not parent.is_dir():
            self.problem(f"{key}={out}: {parent} is a file, not a folder")
        elif parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
            self.problem(f"{key}={out}: {parent} is not writable")
        for name in (CHECKPOINTS, "model"):  # folders the run writes into
            if (out / name).exists() and not (out / name).is_dir():
                self.problem(f"{key}={out}: {out / name} is a file where the run writes a folder; move it away")

    # -- init= ---------------------------------------------------------------------------------------
    def check_init(self, init: str | os.PathLike | None, model_cfg: Mapping[str, Any],
                   explicit: Iterable[str] = ()) -> dict[str, Any] | None:
        """The model config ``init`` holds (None without ``init``); explicit ``model=`` / ``model.<field>=``
        keys it would override are problems."""
        if not init:
            return None
        self._init = init
        try:
            path, saved = read_init(init)
        except DataError as err:
            self.problem(str(err))
            return None
        if not self._known_config(init, path, saved):
            return None
        explicit = set(explicit)
        wanted = dict(model_cfg)
        if "model" in explicit and wanted.get("name") != saved["name"]:
            self.problem(f"model={wanted.get('name')} conflicts with init={init}, a {saved['name']} model ({path}): "
                         f"drop model= (the model comes from init=) or give a {wanted.get('name')} run to init=")
        for key in sorted(k for k in explicit if k.startswith("model.") and k != "model.name"):
            field = key.split(".", 1)[1]
            if field not in saved or wanted.get(field) != saved[field]:
                self.problem(f"{key}={wanted.get(field)} is ignored with init={init}: the model comes from {path}"
                             + (f" ({field}={saved[field]})" if field in saved else "") + f"; drop {key}")
        return saved

    def _known_config(self, init: Any, path: Path, saved: Mapping[str, Any]) -> bool:
        """Whether this vlkit knows the saved model's family and every key of its config (a newer vlkit's run may
        hold keys this one lacks)."""
        import dataclasses

        try:
            config_class = MODELS.get(saved["name"]).config_class
        except UnknownNameError as err:
            self.problem(f"init={init}: {path}: {str(err).strip(chr(39))} (is the plugin that provides it installed?)")
            return False
        fields = {f.name for f in dataclasses.fields(config_class)}
        unknown = sorted(set(saved) - fields - {"name"})
        if unknown:
            self.problem(f"init={init}: {path} holds {saved['name']} config key(s) {', '.join(unknown)} that this "
                         f"vlkit ({__version__}) does not know: it was written by a newer vlkit (upgrade vlkit to "
                         f"load it) or edited by hand")
        return not unknown

    # -- the objective mix ---------------------------------------------------------------------------
    def check_mix(self, model: Any, mix: Any, image_source: Any = None) -> None:
        model = _unwrap(model)
        try:
            names = mix_objectives(mix)
        except (KeyError, TypeError, ValueError, FileNotFoundError) as err:
            self.problem(f"objectives: {str(err).strip(chr(34) + chr(39))}")
            return
        store = _store_of(image_source)
        for name in names:
            try:
                cls = OBJECTIVES.get(name)
                cls.check(model)
            except (UnknownNameError, IncompatibleObjective) as err:
                self.problem(f"objectives: {str(err).strip(chr(34) + chr(39))}")
                continue
            if cls.needs_soft_labels:
                if store is not None and not store.has_soft_labels:
                    self.problem(f"objective {name!r} needs the detector's soft labels (cls_prob), but the feature "
                                 f"store {store.path} has none; drop {name} from the mix or use a store with soft labels")
                elif store is not None and model.region_classes not in (None, store.num_classes):
                    self.problem(f"objective {name!r}: the feature store {store.path} has {store.num_classes} classes, "
                                 f"the model's {model.data_field('region_classes')} is {model.region_classes}")

    # -- the tokenizer -------------------------------------------------------------------------------
    def check_tokenizer(self, tokenizer: Any, name: str, model: Any, run: str | os.PathLike | None = None,
                        key: str = "data.tokenizer") -> None:
        """``tokenizer`` (``key=name``) against the model's word embeddings: more tokens than rows is a problem (an
        IndexError at step 1); with ``run`` (``init=`` / ``checkpoint=``), a tokenizer other than the one the
        run saved (`vlkit.data.tokenizers.run_tokenizer`) is one too, even when it fits (silently wrong ids)."""
        model = _unwrap(model)
        tokens, rows = len(tokenizer), model.vocab_size
        saved = run_tokenizer(run) if run else None
        hint = f"; drop {key} to use the run's own ({saved})" if saved and saved != str(name) else ""
        if tokens > rows:
            self.problem(f"{key}={name} has {tokens} tokens but the {model.family} model's word embeddings have "
                         f"{rows} rows (vocab_size): ids from {rows} up would fail at step 1{hint}")
            return
        if not run or (saved is not None and saved == str(name)):
            return
        if saved is None:
            if tokens != rows:
                self.problem(f"{key}={name} has {tokens} tokens but the {model.family} model of {run} has {rows} "
                             f"word embeddings and {run} saved no tokenizer: give {key} the tokenizer it was "
                             "trained with")
            return
        try:
            same = same_vocabulary(tokenizer, build_tokenizer(saved, key=f"the tokenizer of {run}"))
        except TokenizerError:  # a recorded hub name that cannot be loaded here: the sizes decide
            same = tokens == rows
        if not same:
            self.problem(f"{key}={name} ({tokens} tokens) is not the tokenizer {run} was trained with ({saved}, "
                         f"{rows} word embeddings): its ids would mean other words{hint}")

    def check_masking(self, mix: Any, tokenizer: Any) -> None:
        """The mix's masking options: unknown keys, an unknown ``text_masking.policy``, and ``whole_word`` with a
        tokenizer without WordPiece ``##`` tokens (its word starts come from them)."""
        try:
            cfg = load_mix(mix)
        except (KeyError, TypeError, ValueError, FileNotFoundError):
            return  # check_mix reports an unreadable mix
        for block, known in masking_options().items():
            unknown = sorted(set(cfg.get(block) or {}) - set(known))
            if unknown:
                self.problem(f"objectives: {block} has unknown option(s) {', '.join(unknown)}; it takes "
                             f"{', '.join(known)}")
        policy = (cfg.get(MaskedText.options_key) or {}).get("policy", MaskedText.defaults["policy"])
        if policy not in TOKEN_POLICIES:
            self.problem(f"objectives: text_masking.policy={policy!r} is not one of {', '.join(TOKEN_POLICIES)}")
        elif policy == "whole_word" and not any(t.startswith("##") for t in tokenizer.get_vocab()):
            self.problem("objectives: text_masking.policy=whole_word needs a WordPiece tokenizer (word starts from its "
                         f"'##' continuations); the tokenizer has none ({type(tokenizer).__name__}, {len(tokenizer)} "
                         "tokens): use policy=hf_wwm (every token a word, as HF does without '##') or bernoulli")

    def check_unknown_words(self, name: str, dataset: Any, tokenizer: Any, tokenizer_name: str,
                            max_rate: Any = None, key: str = "data.max_unk_rate") -> None:
        """The share of ``dataset``'s text tokens that ``tokenizer`` maps to ``[UNK]`` (`vlkit.data.unknown`, on a
        sample), noted in preflight.json; above ``max_rate`` (``key``, default 0.05) a problem naming the rate,
        the unknown words, the key and the value that allows it."""
        import math

        max_rate = MAX_UNK_RATE if max_rate is None else max_rate
        if isinstance(max_rate, bool) or not isinstance(max_rate, (int, float)) or not 0 <= max_rate <= 1:
            self.problem(f"{key}={max_rate} must be a number from 0 to 1 (the share of [UNK] tokens accepted)")
            return
        texts = dataset_texts(dataset)
        found = unknown_tokens(tokenizer, texts) if texts else None
        if found is None:
            return
        self.notes.setdefault(name, {})["unknown_tokens"] = found.summary()
        if found.rate <= max_rate:
            return
        words = ", ".join(f"{w!r} ({n}x)" for w, n in found.words.most_common(6))
        allow = math.ceil(found.rate * 100) / 100
        self.problem(f"{name} data: {found.rate:.1%} of the text's tokens ({found.unknown:,} of {found.tokens:,}, in "
                     f"{found.texts_with_unknown:,} of {found.texts:,} texts) are unknown to "
                     f"data.tokenizer={tokenizer_name} and become [UNK]" + (f", e.g. {words}" if words else "") +
                     f"; {key}={max_rate:g} accepts at most {max_rate:.0%}: give a tokenizer that knows these words "
                     f"(data.tokenizer=, e.g. a folder holding a vocab.txt of your own: docs/datasets.md, Tokenizers), "
                     f"or allow it with {key}={allow:g}")

    @staticmethod
    def check_task(task_cls: Any, model: Any) -> None:
        """`IncompatibleTask` at once (naming the task and the family) when the model cannot serve the task:
        nothing else about the run matters then."""
        task_cls.check(_unwrap(model))

    # -- the data ------------------------------------------------------------------------------------
    def check_data(self, name: str, dataset: Any, model: Any, evaluation: bool = False) -> None:
        """``dataset`` (an `ImageTextPairs`, an NLVR2 `ImagePairTexts` or a `RetrievalSet`) against ``model``."""
        source = getattr(dataset, "image_source", None) or getattr(getattr(dataset, "pairs", None), "image_source", None)
        if source is None:
            return
        model = _unwrap(model)
        policy = getattr(getattr(dataset, "pairs", dataset), "on_error", getattr(source, "on_error", "raise"))
        skips = getattr(getattr(dataset, "pairs", dataset), "skips", None)
        if skips is None:
            skips = getattr(source, "skips", None)
        if skips is not None and skips not in self._skips:
            self._skips.append(skips)
        droppable = hasattr(dataset, "drop") and policy == "skip"
        store = _store_of(source)
        if (store is not None) != (model.image_input == "regions"):
            kind = "region features" if store is not None else "pixels"
            self.problem(f"{name} data gives {kind}, {model.family} takes {model.image_input}")
            return
        if store is not None:
            try:
                dim = model.get_region_projection().in_features
            except TypeError:
                dim = None
            if dim is not None and dim != store.feature_dim:
                self.problem(f"{name} data: the feature store {store.path} holds {store.feature_dim}-d features, the "
                             f"{model.family} model takes {dim}-d ({model.data_field('region_feature_size')}); extract with the detector the model "
                             "was trained on, or train a model on this store")
                return
        if not hasattr(dataset, "image_ids"):  # a stream (data=shards): its images are validated as they are read
            self.notes[name] = {"streamed": str(getattr(dataset, "path", "")), "images_validated": 0}
            return
        image_ids = dataset.image_ids() if callable(getattr(dataset, "image_ids", None)) else list(dataset.image_ids)
        example_ids = dataset.example_ids() if callable(getattr(dataset, "example_ids", None)) else list(image_ids)
        index, where = image_index(source)
        bad: dict[str, str] = {}  # image id -> reason
        if index is not None:
            for image_id in dict.fromkeys(image_ids):
                if image_id not in index:
                    bad[image_id] = f"image {image_id!r} is not in the {where}"
        checked = [i for i in dict.fromkeys(image_ids) if i not in bad] if index is not None else []
        limit = self.full_eval if evaluation else self.samples  # generated images (shapes) need no check
        for image_id in sample_evenly(checked, limit):
            try:
                source(image_id)
            except (DataError, KeyError, OSError, RuntimeError) as err:
                bad[image_id] = str(err).strip("'\"") if isinstance(err, KeyError) else str(err)
        self.notes[name] = {"examples": len(example_ids), "images": len(set(image_ids)),
                            "images_validated": min(len(checked), limit),
                            "images_checked_against_index": index is not None}
        truncated = getattr(getattr(dataset, "pairs", dataset), "truncated", None)
        if truncated:
            worst = max(truncated, key=lambda t: t[1])
            self.notes[name]["truncated_texts"] = {"count": len(truncated), "longest": {"id": worst[0], "tokens": worst[1]}}
        if not bad:
            return
        culprits = [(e, i) for e, i in zip(example_ids, image_ids) if i in bad]
        if droppable:
            for example_id, image_id in culprits:
                skips.add("example", example_id, bad[image_id], image_id=image_id)
            dataset.drop([e for e, _ in culprits])
            self.notes[name]["skipped"] = len({e for e, _ in culprits})
            return
        missing = [i for i, r in bad.items() if r.endswith(f"not in the {where}")]
        invalid = {i: r for i, r in bad.items() if i not in missing}
        examples = [e for e, i in culprits if i in missing]
        if missing:
            self.problem(self._missing_images(name, missing, examples, len(set(image_ids)), index, where, policy))
        for image_id, reason in list(invalid.items())[:5]:
            self.problem(f"{name} data: {reason}")
        if len(invalid) > 5:
            self.problem(f"{name} data: {len(invalid) - 5} more invalid image(s): {first(list(invalid)[5:])}")

    def missing_split(self, task: str, split: str, available: list[str], train_files: Any = None,
                      files: bool = True, none: bool = True) -> None:
        """A split to evaluate that the task's data lacks: the problem says how to give it (``files``: the task reads
        files per split, ``task.files.<split>``, shown in the form of ``train_files``) or how to evaluate another
        split, or none (``none``: a fine-tuning may evaluate none, ``vlkit evaluate`` scores at least one)."""
        if isinstance(train_files, Mapping):
            form = "{" + ", ".join(f"{k}: {'FILE' if k != 'image_id_format' else repr(v)}" for k, v in
                                   train_files.items() if not (split == "test" and k == "annotations")) + "}"
        else:
            form = "FILE" if isinstance(train_files, str) else "<its files, as task.files.train gives them>"
        others = [s for s in available if s != "train"]
        give = f"give its files, task.files.{split}={form} (docs/own-dataset.md)" if files else ""
        give += ", or " if give and (others or none) else ""
        nothing = " or none (eval_splits=[])" if none else ""
        choose = (f"evaluate a split it has (split={others[0]}, or eval_splits=[{', '.join(others)}]){nothing}"
                  if others else "evaluate none (eval_splits=[])" if none else "" if give else
                  "give task data that holds it")
        self.problem(f"task {task} has no {split!r} split to evaluate (split= / eval_splits, default [val]); it has "
                     f"{', '.join(available) or 'none'}: {give}{choose}")

    @staticmethod
    def _missing_images(name: str, missing: list[str], examples: list[str], images: int, index: set[str], where: str,
                        policy: str) -> str:
        """The problem of images missing from the source: how many (of all the data names), and when most are
        missing, what the data asks for against what the source holds (a wrong ``image_id_format``, a wrong
        folder), instead of advising to leave the examples out."""
        share = len(missing) / max(images, 1)
        text = (f"{name} data: {len(examples)} example(s) name {len(missing)} image(s) missing from the {where} "
                f"({share:.0%} of its {images} images): images {first(missing)}; examples {first(examples)}")
        if share < 0.5:
            return text + ("" if policy == "skip" else " (data.on_error=skip leaves such examples out)")
        held, kind = sorted(index), " ".join(where.split(" ")[:2])  # "image folder" / "feature store"
        shown = f"holds {first(held, 3)}" if held else "is empty"
        return (f"{text}: the ids do not name what it holds. The data asks for {missing[0]!r} (in a folder: a file "
                f"{missing[0]}.jpg, .png ...), the {kind} {shown}{id_mismatch(missing, index, kind)}; check how the ids "
                "are formed (the task files' image_id_format) and data.image.path")

    # -- the trainer settings, the weights and a resumed checkpoint --------------------------------------
    def check_trainer(self, trainer_cfg: Any, output_dir: str | os.PathLike, seed: int, dataset: Any = None,
                      name: str = "training") -> Any:
        """The run's `TrainerConfig` (None when it has problems): every numeric and path setting (NaN, inf,
        out of range, empty) and a fixed batch larger than the training data (no complete batch to train on)."""
        try:
            config = TrainerConfig.from_cfg(trainer_cfg, output_dir=str(output_dir), seed=seed)
        except TrainerConfigError as err:
            for text in err.problems:
                self.problem(text)
            return None
        try:
            examples = len(dataset) if dataset is not None else None
        except TypeError:  # a stream: its size is unknown before it is read
            examples = None
        if config.batching == "fixed" and config.drop_last and examples is not None and examples < config.batch_size:
            self.problem(f"trainer.batch_size={config.batch_size} is larger than the {examples} example(s) of the "
                         f"{name} data: with trainer.drop_last=true no batch is complete; lower trainer.batch_size "
                         f"to at most {examples} or set trainer.drop_last=false")
        return config

    def check_weights(self, model: Any) -> None:
        """The model's parameters and buffers are finite (weights loaded with ``init=`` may not be)."""
        bad = nonfinite_parameters(model)
        if bad:
            where = f" loaded with init={self._init}" if self._init else ""
            self.problem(f"the model's weights{where} hold NaN or inf before step 1: {first(bad)}; "
                         "train from a run whose weights are finite")

    def check_resume(self, output_dir: str | os.PathLike, config: Any, run: Mapping[str, Any]) -> None:
        """With ``resume=true``, the newest checkpoint's trainer config and run against this run's
        (`vlkit.train.resume.differences`): every difference outside the safe keys is a problem."""
        if config is None or not config.resume:
            return
        path = ckpt.latest_checkpoint(Path(output_dir) / CHECKPOINTS)
        if path is None:
            return
        try:
            saved = ckpt.read_state(path, verify=False)
        except ckpt.CheckpointError as err:
            self.problem(str(err))
            return
        found = differences(saved, {"config": config.to_dict(), "run": dict(run)})
        for text in found:
            self.problem(f"resume=true: {text}, saved in {path}")
        if found:
            self.problem("resume=true continues a run only with the configuration it was saved with: resume with "
                         "the checkpoint's values or start a new run in another trainer.output_dir (safe to change: "
                         f"{', '.join(SAFE_TO_CHANGE)})")

    # -- the report ----------------------------------------------------------------------------------
    def finish(self, output_dir: str | os.PathLike | None = None) -> None:
        """Raise `PreflightError` with every problem; else delete the temporary files a killed run left in
        ``output_dir``, bind the skip logs to ``<output_dir>/skipped.jsonl`` and write ``<output_dir>/preflight.json``."""
        if self.problems:
            raise PreflightError(self.problems)
        if output_dir is None:
            return
        out = Path(output_dir)
        for name in RUN_FILES:  # temporary files of a killed earlier run in this folder
            remove_orphans(out / name)
        for skips in self._skips:
            skips.bind(out / SKIPPED_FILE)
        skipped: dict[str, int] = {}
        for skips in self._skips:
            for kind, n in skips.summary().items():
                skipped[kind] = skipped.get(kind, 0) + n
        report = {"data": self.notes, "skipped": skipped, "samples": self.samples, "full_eval": self.full_eval}
        atomic_write_text(out / PREFLIGHT_FILE, json.dumps(report, indent=2, sort_keys=True))


def _store_of(source: Any) -> Any:
    inner = getattr(source, "source", source)
    return getattr(inner, "store", None)


__all__ = ["Preflight", "PreflightError", "PREFLIGHT_FILE", "read_init"]
