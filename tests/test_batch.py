"""rlforge.batch.Batch: equal-length tensor and list columns."""

from __future__ import annotations

import pytest
import torch

from rlforge.batch import Batch


def _batch(n: int = 4) -> Batch:
    return Batch(
        {"x": torch.arange(n * 2).reshape(n, 2), "s": torch.arange(n, dtype=torch.float32)},
        {"uid": [f"u{i}" for i in range(n)], "info": [{"i": i} for i in range(n)]},
        {"step": 1},
    )


def test_len_columns_contains_getitem() -> None:
    b = _batch()
    assert len(b) == 4
    assert set(b.columns()) == {"x", "s", "uid", "info"}
    assert "x" in b and "uid" in b and "nope" not in b
    assert b["uid"][2] == "u2"
    assert b["x"].shape == (4, 2)
    with pytest.raises(KeyError, match="no column 'nope'"):
        b["nope"]


def test_empty_batch() -> None:
    assert len(Batch()) == 0
    assert len(Batch(lists={"uid": [1, 2]})) == 2


def test_constructor_length_mismatch() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        Batch({"a": torch.zeros(3)}, {"u": [1, 2]})
    with pytest.raises(ValueError, match="different lengths"):
        Batch({"a": torch.zeros(3), "b": torch.zeros(2, 5)})


def test_setitem_adds_and_moves_columns() -> None:
    b = _batch()
    b["adv"] = torch.ones(4, 2)
    assert "adv" in b.tensors
    b["adv"] = [0, 1, 2, 3]  # a list replaces the tensor column
    assert "adv" in b.lists and "adv" not in b.tensors
    b["t"] = (9, 8, 7, 6)
    assert b["t"] == [9, 8, 7, 6]


def test_setitem_wrong_length_list() -> None:
    b = _batch()
    with pytest.raises(ValueError, match="length"):
        b["bad"] = [1, 2]


def test_setitem_wrong_length_tensor() -> None:
    b = _batch()
    with pytest.raises(ValueError, match="length"):
        b["bad"] = torch.zeros(3)


def test_setitem_wrong_length_tensor_on_list_only_batch() -> None:
    b = Batch(lists={"uid": [1, 2, 3]})
    with pytest.raises(ValueError):
        b["x"] = torch.zeros(2)


def test_setitem_replacing_first_column_with_wrong_length() -> None:
    b = Batch({"a": torch.zeros(3), "b": torch.zeros(3)})
    with pytest.raises(ValueError):
        b["a"] = torch.zeros(2)


def test_rejected_setitem_leaves_batch_unchanged() -> None:
    b = _batch()
    with pytest.raises(ValueError):
        b["bad"] = [1, 2]
    assert "bad" not in b


def test_select_list_keeps_order() -> None:
    b = _batch()
    s = b.select([3, 1])
    assert len(s) == 2
    assert s["uid"] == ["u3", "u1"]
    assert s["info"] == [{"i": 3}, {"i": 1}]
    assert s["x"].tolist() == [[6, 7], [2, 3]]
    assert s["s"].tolist() == [3.0, 1.0]
    assert s.meta == {"step": 1}


def test_select_bool_mask_and_long_tensor() -> None:
    b = _batch()
    s = b.select(torch.tensor([True, False, True, False]))
    assert s["uid"] == ["u0", "u2"]
    assert s["x"].tolist() == [[0, 1], [4, 5]]
    s = b.select(torch.tensor([2, 2]))
    assert s["uid"] == ["u2", "u2"]


def test_select_all_false_mask_gives_empty_batch() -> None:
    s = _batch().select(torch.zeros(4, dtype=torch.bool))
    assert len(s) == 0
    assert s["uid"] == []
    assert s["x"].shape == (0, 2)


def test_select_empty_list_gives_empty_batch() -> None:
    s = _batch().select([])
    assert len(s) == 0
    assert s["x"].shape == (0, 2)


def test_select_does_not_alias_lists() -> None:
    b = _batch()
    s = b.select([0, 1])
    s["uid"][0] = "changed"
    assert b["uid"][0] == "u0"


def test_split() -> None:
    b = _batch(5)
    parts = list(b.split(2))
    assert [len(p) for p in parts] == [2, 2, 1]
    assert [p["uid"] for p in parts] == [["u0", "u1"], ["u2", "u3"], ["u4"]]
    assert parts[2]["x"].tolist() == [[8, 9]]
    assert [len(p) for p in b.split(5)] == [5]
    assert [len(p) for p in b.split(10)] == [5]


def test_repeat_interleave() -> None:
    b = Batch({"x": torch.tensor([[1, 1], [2, 2]])}, {"uid": ["a", "b"]})
    r = b.repeat_interleave(3)
    assert len(r) == 6
    assert r["uid"] == ["a", "a", "a", "b", "b", "b"]
    assert r["x"][:, 0].tolist() == [1, 1, 1, 2, 2, 2]
    assert len(b.repeat_interleave(1)) == 2


def test_concat_same_width() -> None:
    a, b = _batch(2), _batch(3)
    c = Batch.concat([a, b])
    assert len(c) == 5
    assert c["uid"] == ["u0", "u1", "u0", "u1", "u2"]
    assert c["s"].tolist() == [0, 1, 0, 1, 2]
    assert c["x"].shape == (5, 2)


def test_concat_pads_narrower_tensors_with_zeros() -> None:
    a = Batch({"r": torch.tensor([[1, 2, 3]]), "v": torch.tensor([5])}, {"uid": ["a"]})
    b = Batch({"r": torch.tensor([[4], [6]]), "v": torch.tensor([7, 8])}, {"uid": ["b", "c"]})
    c = Batch.concat([a, b])
    assert c["r"].tolist() == [[1, 2, 3], [4, 0, 0], [6, 0, 0]]
    assert c["v"].tolist() == [5, 7, 8]
    assert c["uid"] == ["a", "b", "c"]


def test_concat_empty_list() -> None:
    assert len(Batch.concat([])) == 0


def test_split_then_concat_roundtrip() -> None:
    b = _batch(7)
    c = Batch.concat(list(b.split(3)))
    assert c["uid"] == b["uid"]
    assert torch.equal(c["x"], b["x"])
    assert torch.equal(c["s"], b["s"])


def test_to_device_keeps_lists() -> None:
    b = _batch().to("cpu")
    assert b["uid"] == ["u0", "u1", "u2", "u3"]
    assert b["x"].device.type == "cpu"


def test_a_copy_shares_the_columns_and_sets_its_own() -> None:
    batch = Batch({"x": torch.ones(2)}, {"uid": ["a", "b"]})
    other = batch.copy()
    other["x"] = torch.zeros(2)
    assert batch["x"].tolist() == [1.0, 1.0] and other["uid"] is batch["uid"]
