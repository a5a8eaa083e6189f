import pytest
import torch

from attn_core.tasks import TASKS, get_task


@pytest.mark.parametrize("name", list(TASKS))
def test_task_batches_are_seeded_and_well_formed(name):
    t = TASKS[name]
    a, b, c = t.sample(32, 5), t.sample(32, 5), t.sample(32, 6)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert a.tokens.shape == (32, t.n_ctx) == a.targets.shape == a.mask.shape
    assert a.mask.any(dim=1).all(), "every sequence has a scored position"
    assert int(a.tokens.max()) < t.d_vocab and int(a.targets.max()) < t.d_vocab
    assert torch.equal(a.tokens[:, 1:], a.targets[:, :-1]), "targets are the next tokens"


def test_induction_targets_follow_from_the_earlier_repeat():
    b = TASKS["induction"].sample(64, 0)
    for seq, tgt, m in zip(b.tokens, b.targets, b.mask):
        for t in torch.nonzero(m).flatten().tolist():
            earlier = [i for i in range(t) if seq[i] == seq[t]]
            assert earlier and tgt[t] == seq[earlier[-1] + 1]


def test_recall_answers_are_the_paired_values():
    t = TASKS["recall"]
    b = t.sample(64, 0)
    for seq, tgt, m in zip(b.tokens, b.targets, b.mask):
        pairs = dict(zip(seq[0:12:2].tolist(), seq[1:12:2].tolist()))
        for pos in torch.nonzero(m).flatten().tolist():
            assert pairs[int(seq[pos])] == int(tgt[pos])


def test_sort_reverse_modadd_answers():
    s = TASKS["sort"].sample(16, 0)
    full = torch.cat([s.tokens[:, :1], s.targets], 1)
    assert torch.equal(full[:, 7:], full[:, :6].sort(1).values)
    r = TASKS["reverse"].sample(16, 0)
    full = torch.cat([r.tokens[:, :1], r.targets], 1)
    assert torch.equal(full[:, 9:], full[:, :8].flip(1))
    m = TASKS["modadd"].sample(64, 0)
    assert torch.equal(m.targets[:, -1], (m.tokens[:, 0] + m.tokens[:, 1]) % 23)


def test_modadd_train_and_test_pairs_are_disjoint():
    t = TASKS["modadd"]
    train = {tuple(x) for x in t.sample(4000, 0, "train").tokens[:, :2].tolist()}
    test = {tuple(x) for x in t.sample(4000, 0, "test").tokens[:, :2].tolist()}
    assert train and test and not (train & test)


def test_encode_and_bad_input():
    t = TASKS["induction"]
    assert t.encode("a b c") == [0, 1, 2]
    with pytest.raises(ValueError, match="vocabulary"):
        t.encode("a B c")
    with pytest.raises(ValueError, match="no tokens"):
        t.encode("   ")
    with pytest.raises(ValueError, match="context"):
        t.encode(" ".join("a" * 30))
    with pytest.raises(ValueError, match="known tasks"):
        get_task("nope")
    with pytest.raises(ValueError, match="positive"):
        t.sample(0)
