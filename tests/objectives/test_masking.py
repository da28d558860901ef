import pytest
import torch

from vlkit.objectives.masking import (
    IGNORE_INDEX,
    mask_patches,
    mask_regions,
    mask_tokens,
    word_starts_from_tokens,
)
from vlkit.types import VLBatch

PAD, CLS, SEP, MASK, VOCAB = 0, 101, 102, 103, 1000
SPECIALS = (PAD, CLS, SEP, MASK)
TEXT = dict(mask_token_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, random_range_start=200)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _text(batch=6, length=12, seed=0):
    """[CLS] words [SEP] pad... with random lengths (ids in [200, 1000))."""
    g = _gen(seed)
    ids = torch.full((batch, length), PAD)
    lengths = torch.randint(1, length - 1, (batch,), generator=g)
    for b, n in enumerate(lengths.tolist()):
        ids[b, 0], ids[b, 1:n + 1], ids[b, n + 1] = CLS, torch.randint(200, VOCAB, (n,), generator=g), SEP
    return ids, (ids != PAD).long()


def _batch(batch=6, regions=10, seed=0):
    g = _gen(seed)
    ids, attn = _text(batch, seed=seed)
    n_real = torch.randint(1, regions + 1, (batch,), generator=g)
    region_mask = torch.arange(regions) < n_real[:, None]
    boxes = torch.rand(batch, regions, 4, generator=g).sort(-1).values  # x1 <= y1 <= x2 <= y2: valid xyxy
    return VLBatch(input_ids=ids, attention_mask=attn, region_feats=torch.rand(batch, regions, 8, generator=g) + 0.1,
                   region_boxes=boxes, region_mask=region_mask.long())


def _eligible(ids, attn):
    return attn.bool() & ~torch.isin(ids, torch.tensor(SPECIALS))


@pytest.mark.parametrize("policy", ["bernoulli", "whole_word", "hf_wwm"])
def test_tokens_never_mask_padding_or_specials(policy):
    ids, attn = _text(batch=16, length=20)
    starts = torch.rand(ids.shape, generator=_gen(9)) < 0.6  # arbitrary words
    for seed in range(20):
        masked, labels = mask_tokens(ids, attn, generator=_gen(seed), policy=policy, prob=0.5,
                                     word_starts=starts, **TEXT)
        chosen = labels != IGNORE_INDEX
        assert not (chosen & ~_eligible(ids, attn)).any()
        assert (labels[chosen] == ids[chosen]).all()
        assert (masked[~chosen] == ids[~chosen]).all()


@pytest.mark.parametrize("policy", ["bernoulli", "whole_word"])
def test_at_least_one_token_per_sample(policy):
    ids, attn = _text(batch=32)
    starts = torch.rand(ids.shape, generator=_gen(9)) < 0.5
    masked, labels = mask_tokens(ids, attn, generator=_gen(1), policy=policy, prob=1e-4, word_starts=starts, **TEXT)
    chosen = labels != IGNORE_INDEX
    assert chosen.any(1).all()
    # UNITER forces the first eligible token (word) to [MASK]
    first = _eligible(ids, attn).long().argmax(1)
    assert (masked[torch.arange(32), first] == MASK).all()
    _, labels = mask_tokens(ids, attn, generator=_gen(1), prob=1e-4, force_one=False, **TEXT)
    assert (labels == IGNORE_INDEX).all()  # ViLBERT does not force


def test_80_10_10_and_rate():
    ids, attn = _text(batch=256, length=64)
    eligible = _eligible(ids, attn)
    counts = torch.zeros(3)
    n_chosen = 0
    for seed in range(4):
        masked, labels = mask_tokens(ids, attn, generator=_gen(seed), **TEXT)
        chosen = labels != IGNORE_INDEX
        n_chosen += int(chosen.sum())
        is_mask = masked[chosen] == MASK
        is_kept = masked[chosen] == ids[chosen]
        counts += torch.tensor([is_mask.sum(), (~is_mask & ~is_kept).sum(), is_kept.sum()], dtype=torch.float)
        assert ((masked[chosen & (masked != MASK) & (masked != ids)] >= 200)).all()  # random ids in range
    share = counts / counts.sum()
    assert abs(share[0] - 0.8) < 0.02 and abs(share[1] - 0.1) < 0.015 and abs(share[2] - 0.1) < 0.015
    assert abs(n_chosen / (4 * int(eligible.sum())) - 0.15) < 0.01


def test_tokens_inputs_unchanged_and_deterministic():
    ids, attn = _text()
    ids0, attn0 = ids.clone(), attn.clone()
    a = mask_tokens(ids, attn, generator=_gen(5), **TEXT)
    b = mask_tokens(ids, attn, generator=_gen(5), **TEXT)
    c = mask_tokens(ids, attn, generator=_gen(6), **TEXT)
    assert torch.equal(ids, ids0) and torch.equal(attn, attn0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])
    state = torch.random.get_rng_state()
    mask_tokens(ids, attn, generator=_gen(5), **TEXT)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched


def test_whole_word_masks_whole_words():
    tokens = [["[CLS]", "play", "##ing", "##s", "fast", "##er", "dog", "[SEP]"]] * 64
    ids = torch.tensor([[CLS, 300, 301, 302, 400, 401, 500, SEP]] * 64)
    starts = word_starts_from_tokens(tokens)
    assert starts[0].tolist() == [True, True, False, False, True, False, True, True]
    _, labels = mask_tokens(ids, torch.ones_like(ids), generator=_gen(0), policy="whole_word", prob=0.3,
                            word_starts=starts, **TEXT)
    chosen = labels != IGNORE_INDEX
    for group in ([1, 2, 3], [4, 5], [6]):
        sub = chosen[:, group]
        assert (sub.all(1) | ~sub.any(1)).all()
    assert chosen[:, 1].any() and not chosen[:, 1].all()
    with pytest.raises(ValueError, match="word_starts"):
        mask_tokens(ids, torch.ones_like(ids), generator=_gen(0), policy="whole_word", **TEXT)


def test_hf_wwm_candidate_count_rule():
    # No pads or specials: exactly round(T * 0.15) positions (Python's round: 7.5 -> 8, 4.5 -> 4, 1.5 -> 2).
    for length, expected in [(50, 8), (30, 4), (10, 2), (3, 1)]:
        ids = torch.randint(200, VOCAB, (40, length), generator=_gen(length))
        _, labels = mask_tokens(ids, torch.ones_like(ids), generator=_gen(1), policy="hf_wwm", **TEXT)
        assert ((labels != IGNORE_INDEX).sum(1) == expected).all(), length
    # METER: captions padded to 50, so 8 draws over all 50 positions, then pads / specials dropped.
    ids = torch.full((4000, 50), PAD)
    ids[:, 0], ids[:, 1:11], ids[:, 11] = CLS, 500, SEP
    _, labels = mask_tokens(ids, (ids != PAD).long(), generator=_gen(2), policy="hf_wwm", **TEXT)
    per_row = (labels != IGNORE_INDEX).sum(1).float()
    assert abs(per_row.mean() - 8 * 10 / 50) < 0.05 and (per_row == 0).any()
    # hf_length: a batch padded only to T behaves as if padded to 50 (the same positions are chosen)
    ids = torch.randint(200, VOCAB, (400, 20), generator=_gen(3))
    _, labels = mask_tokens(ids, torch.ones_like(ids), generator=_gen(1), policy="hf_wwm", hf_length=50, **TEXT)
    padded = torch.cat([ids, torch.full((400, 30), PAD)], dim=1)
    _, padded_labels = mask_tokens(padded, (padded != PAD).long(), generator=_gen(1), policy="hf_wwm", **TEXT)
    assert torch.equal(labels != IGNORE_INDEX, padded_labels[:, :20] != IGNORE_INDEX)
    assert abs((labels != IGNORE_INDEX).sum(1).float().mean() - 8 * 20 / 50) < 0.3


def test_hf_wwm_whole_words_and_skip_ids():
    # words of 3 tokens; num_to_predict = round(12 * 0.25) = 3 -> exactly one whole word per row
    ids = torch.randint(200, VOCAB, (50, 12), generator=_gen(4))
    starts = (torch.arange(12) % 3 == 0).expand(50, 12)
    _, labels = mask_tokens(ids, torch.ones_like(ids), generator=_gen(0), policy="hf_wwm", prob=0.25,
                            word_starts=starts, **TEXT)
    chosen = (labels != IGNORE_INDEX).view(50, 4, 3)
    assert (chosen.sum((1, 2)) == 3).all() and (chosen.all(2).sum(1) == 1).all()
    # skipped ids are never candidates, so the count goes entirely to the other tokens
    ids = torch.tensor([[CLS] + [500] * 8 + [SEP]] * 30)
    _, labels = mask_tokens(ids, torch.ones_like(ids), generator=_gen(0), policy="hf_wwm", prob=0.2,
                            hf_skip_ids=(CLS, SEP), **TEXT)
    assert ((labels != IGNORE_INDEX).sum(1) == 2).all()


def test_regions_masking_rules():
    batch = _batch(batch=64, regions=10)
    feats0, boxes0, mask0 = batch.region_feats.clone(), batch.region_boxes.clone(), batch.region_mask.clone()
    new, masked = mask_regions(batch, generator=_gen(0), prob=0.01)
    assert torch.equal(batch.region_feats, feats0) and batch.region_masked is None  # input untouched
    real = mask0.bool()
    assert not (masked & ~real).any() and masked.any(1).all()  # >= 1 per sample, never a pad
    assert torch.equal(new.region_masked, masked) and torch.equal(new.region_boxes, boxes0)
    assert (new.region_feats[masked] == 0).all() and torch.equal(new.region_feats[~masked], feats0[~masked])
    new, masked = mask_regions(batch, generator=_gen(0), prob=0.5, min_masked=3)
    assert (masked.sum(1) >= real.sum(1).clamp(max=3)).all()
    # ViLBERT: 90% of the chosen zeroed, 10% keep their feature
    zeroed = kept = 0
    for seed in range(20):
        new, masked = mask_regions(batch, generator=_gen(seed), zero_prob=0.9)
        is_zero = (new.region_feats == 0).all(-1)
        assert not (is_zero & ~masked).any()
        zeroed, kept = zeroed + int((is_zero & masked).sum()), kept + int((~is_zero & masked).sum())
    assert abs(zeroed / (zeroed + kept) - 0.9) < 0.04
    rows = torch.arange(64) % 2 == 0
    _, masked = mask_regions(batch, generator=_gen(1), sample_mask=rows)
    assert not masked[~rows].any() and masked[rows].any(1).all()
    with pytest.raises(ValueError, match="no regions"):
        mask_regions(VLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask), generator=_gen(0))


def test_region_rate():
    batch = _batch(batch=200, regions=36)
    _, masked = mask_regions(batch, generator=_gen(3), min_masked=0)
    assert abs(masked.sum() / batch.region_mask.sum() - 0.15) < 0.02


def test_patches_row_major_and_counts():
    pixels = torch.rand(3, 3, 8, 12, generator=_gen(0)) + 0.1
    original = pixels.clone()
    out, masked = mask_patches(pixels, 4, generator=_gen(1), prob=0.3)
    assert torch.equal(pixels, original) and masked.shape == (3, 6) and masked.any(1).all()
    for b in range(3):
        for i in range(6):
            r, c = divmod(i, 3)
            rows, cols = slice(4 * r, 4 * r + 4), slice(4 * c, 4 * c + 4)
            expected = torch.zeros(3, 4, 4) if masked[b, i] else original[b, :, rows, cols]
            assert torch.equal(out[b, :, rows, cols], expected)
    _, masked = mask_patches(torch.zeros(5, 3, 32, 32), 4, generator=_gen(2), prob=0.4, exact=True)
    assert (masked.sum(1) == round(0.4 * 64)).all()
    _, masked = mask_patches(torch.zeros(2, 3, 8, 8), 4, generator=_gen(2), prob=0.0, min_masked=2)
    assert (masked.sum(1) == 2).all()
    with pytest.raises(ValueError, match="multiple of patch_size"):
        mask_patches(torch.zeros(1, 3, 10, 8), 4, generator=_gen(0))
