"""Answers balanced over a split, as VQA v2 balanced VQA v1 (Goyal et al., 2017): the same question is asked
of complementary images, so that no answer of a question's kind is more likely than another and a
question-only model learns nothing beyond the question's type."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Candidate:
    """One possible annotation of an image: its balancing ``key`` (what a question-only model can read from
    the text: the template and the attributes it names), the ``answer`` it has on this image, and the
    annotation itself."""

    template: str
    key: Hashable
    answer: str
    annotation: Any


class AnswerBalancer:
    """Counts the answers given so far per key and per template over one split. `pick` takes, of an image's
    candidates in preference order, the first whose answer is among the least given ones of its key and of
    its template (over the template's answer range); when none is, the one that unbalances them least (its
    key first). With ``slack``, none rather than one whose answer would then exceed the least given answer of
    its key or of its template by more than one and by more than ``slack`` times that answer's count."""

    def __init__(self, answer_ranges: Mapping[str, Sequence[str]]):
        self.ranges = answer_ranges
        self.counts: dict[Hashable, Counter] = defaultdict(Counter)

    def _least(self, group: Hashable, candidate: Candidate) -> int:
        """How often the least given answer of ``candidate``'s template was given in ``group``."""
        return min(self.counts[group][a] for a in self.ranges[candidate.template])

    def _excess(self, group: Hashable, candidate: Candidate) -> int:
        return self.counts[group][candidate.answer] - self._least(group, candidate)

    def _within(self, group: Hashable, candidate: Candidate, slack: float) -> bool:
        """Whether ``group`` stays balanced within ``slack`` once ``candidate`` is given."""
        least = self._least(group, candidate)
        return self.counts[group][candidate.answer] + 1 <= max(least + 1, (1 + slack) * least)

    def pick(self, candidates: Iterable[Candidate], slack: float | None = None) -> Candidate | None:
        best, best_excess = None, None
        for candidate in candidates:
            if candidate.answer not in self.ranges[candidate.template]:
                continue
            excess = (self._excess(("key", candidate.key), candidate),
                      self._excess(("template", candidate.template), candidate))
            if best_excess is None or excess < best_excess:
                best, best_excess = candidate, excess
            if excess <= (0, 0):
                break
        if best is None:
            return None
        if slack is not None and not all(self._within(group, best, slack) for group in (("key", best.key),
                                                                                      ("template", best.template))):
            return None
        self.counts["key", best.key][best.answer] += 1
        self.counts["template", best.template][best.answer] += 1
        return best
