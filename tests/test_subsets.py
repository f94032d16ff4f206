"""Tests of otstab.subsets: MetaShift meta-graph, spectral distances and communities."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import cdist

import otstab
from otstab.errors import InputTypeError, ValidationError
from otstab.shift._subsets import _laplacian_eigvecs, _layout

nx = pytest.importorskip("networkx")


def block_rows(n_blocks=6, tags_per_block=5, rows_per_block=60, p_tag=0.7, bridge=20, seed=0):
    """Rows of a tag table with a chain of blocks.

    Tags of block b are "b<b>_<j>"; each row of block b carries each of its block's tags with
    probability ``p_tag``. ``bridge`` extra rows carry the first tag of two consecutive blocks,
    so consecutive blocks are joined by one weak edge and the meta-graph is a chain of blocks.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(n_blocks):
        tags = [f"b{b}_{j}" for j in range(tags_per_block)]
        for _ in range(rows_per_block):
            row = {t for t in tags if rng.random() < p_tag}
            rows.append(row or {tags[0]})
    for b in range(n_blocks - 1):
        rows.extend({f"b{b}_0", f"b{b + 1}_0"} for _ in range(bridge))
    return rows


def block_of(tag: str) -> int:
    return int(tag[1:].split("_")[0])


def test_block_structure_recovered_and_distances_ordered():
    res = otstab.subset_distances(block_rows())
    assert res.n_components == 1
    assert res.embedding.shape == (30, 5)
    # communities are exactly the blocks
    got = sorted(sorted(c) for c in res.communities)
    want = sorted(sorted(f"b{b}_{j}" for j in range(5)) for b in range(6))
    assert got == want
    assert [len(c) for c in res.communities] == [5] * 6
    # every within-block distance is below every between-block distance
    D = res.distances
    blocks = np.array([block_of(t) for t in D.index])
    same = blocks[:, None] == blocks[None, :]
    off = ~np.eye(len(blocks), dtype=bool)
    assert D.to_numpy()[same & off].max() < D.to_numpy()[~same].min()
    # the layout is centred and scaled to max |coordinate| = 1
    assert np.abs(res.embedding.to_numpy()).max() == pytest.approx(1.0)
    np.testing.assert_allclose(res.embedding.mean().to_numpy(), 0.0, atol=1e-12)
    assert res.to_frame().loc["b3_2", "community"] == res.community_of("b3_2")


def test_distance_grows_along_the_chain_of_blocks():
    # With dim = 1 the embedding is the Fiedler vector, monotone along a chain of blocks, so
    # the distance from block 0 to block b grows with b.
    res = otstab.subset_distances(block_rows(), dim=1)
    comm = {block_of(c[0]): c for c in res.communities}
    test = "b0_1"
    d = [res.distance([comm[b]], test) for b in range(1, 6)]
    assert all(x < y for x, y in zip(d, d[1:])), d
    # a training set of two communities: mean of the two distances (released code)
    two = res.distance([comm[1], comm[4]], test)
    assert two == pytest.approx((d[0] + d[3]) / 2)
    # the paper's merged embedding (size-weighted mean) of a node collection
    X = res.embedding.loc[comm[2]].to_numpy()
    w = res.sizes.loc[comm[2]].to_numpy()
    centre = (w[:, None] * X).sum(0) / w.sum()
    assert res.distance([comm[2]], test) == pytest.approx(
        np.linalg.norm(centre - res.embedding.loc[test].to_numpy()))
    assert res.distance("b2_3", test) == pytest.approx(res.distances.loc["b2_3", test])


def test_matches_networkx_spectral_layout_up_to_sign():
    res = otstab.subset_distances(block_rows(seed=3))
    G = nx.from_pandas_adjacency(res.adjacency)
    pos = nx.spectral_layout(G, dim=5)
    X = np.array([pos[t] for t in res.adjacency.index])
    np.testing.assert_allclose(cdist(X, X), res.distances.to_numpy(), atol=1e-8)
    # coordinates agree column by column up to the sign of each eigenvector
    E = res.embedding.to_numpy()
    signs = np.sign((X * E).sum(axis=0))
    np.testing.assert_allclose(X * signs, E, atol=1e-8)


def test_sign_flips_of_eigenvectors_do_not_change_distances():
    res = otstab.subset_distances(block_rows(seed=1))
    _, vecs, _ = _laplacian_eigvecs(res.adjacency.to_numpy())
    base = cdist(_layout(vecs, 5), _layout(vecs, 5))
    np.testing.assert_allclose(base, res.distances.to_numpy(), atol=1e-12)
    patterns = [np.eye(vecs.shape[1])[j] for j in range(1, 6)] + [np.ones(vecs.shape[1])]
    for flip in patterns:  # flip each embedding eigenvector alone, then all of them
        flipped = vecs * (1.0 - 2.0 * flip)
        pos = _layout(flipped, 5)
        assert not np.allclose(pos, _layout(vecs, 5))  # the coordinates did change
        np.testing.assert_allclose(cdist(pos, pos), base, atol=1e-12)


def test_overlap_threshold_and_min_size_by_hand():
    # tags: a on rows 0-9, b on rows 5-9 (overlap 5/5 = 1), c on rows 8-19 (|a n c| = 2,
    # min(10, 12) = 10 -> 0.2; |b n c| = 2 / 5 = 0.4), d on rows 0-2 (3 rows, dropped).
    M = np.zeros((20, 4), dtype=bool)
    M[0:10, 0] = True
    M[5:10, 1] = True
    M[8:20, 2] = True
    M[0:3, 3] = True
    tags = pd.DataFrame(M, columns=list("abcd"))
    res = otstab.subset_distances(tags, min_size=5, threshold=0.2, dim=1)
    assert res.dropped == ["d"]
    assert res.sizes.to_dict() == {"a": 10, "b": 5, "c": 12}
    assert res.overlap.loc["a", "b"] == 1.0
    assert res.overlap.loc["a", "c"] == pytest.approx(0.2)
    assert res.overlap.loc["b", "c"] == pytest.approx(0.4)
    assert np.all(np.diag(res.overlap) == 1.0) and np.all(np.diag(res.adjacency) == 0.0)
    assert res.adjacency.loc["a", "c"] == pytest.approx(0.2)  # kept: edges >= threshold stay
    res = otstab.subset_distances(tags, min_size=5, threshold=0.25, dim=1)
    assert res.adjacency.loc["a", "c"] == 0.0
    with pytest.warns(UserWarning, match="distances are equal"):
        res = otstab.subset_distances(tags, min_size=5)
    assert res.embedding.shape == (3, 2)  # dim capped at n_subsets - 1


def test_input_forms_agree():
    rows = block_rows(n_blocks=3, rows_per_block=40, seed=2)
    ref = otstab.subset_distances(rows, min_size=10)
    names = sorted(set().union(*rows))
    frame = pd.DataFrame([[t in r for t in names] for r in rows], columns=names)
    mapping = {t: [i for i, r in enumerate(rows) if t in r] for t in names}
    for form in [frame, frame.astype(int), mapping]:
        res = otstab.subset_distances(form, min_size=10)
        pd.testing.assert_frame_equal(res.distances, ref.distances, atol=1e-12)
        assert res.communities == ref.communities


def test_disconnected_graph_is_deterministic():
    rows = block_rows(n_blocks=3, bridge=0, seed=4)
    a = otstab.subset_distances(rows)
    b = otstab.subset_distances(list(reversed(rows)))
    assert a.n_components == 3
    pd.testing.assert_frame_equal(a.distances, b.distances, atol=1e-10)
    blocks = np.array([block_of(t) for t in a.distances.index])
    same = blocks[:, None] == blocks[None, :]
    assert a.distances.to_numpy()[~same].min() > 0


def test_merge_rebuilds_the_graph_on_communities():
    rows = block_rows(seed=5)
    res = otstab.subset_distances(rows)
    merged = res.merge(dim=3)
    assert len(merged.sizes) == 6
    for name, members in zip(merged.sizes.index, res.communities):
        assert name in members
        assert merged.sizes[name] == sum(1 for r in rows if r & set(members))
    custom = res.merge({"left": ["b0_0", "b1_0"], "mid": ["b2_1"], "right": ["b5_2", "b4_4"],
                        "far": ["b5_0"]}, threshold=0.0, dim=2)
    assert list(custom.sizes.index) == ["left", "mid", "right", "far"]
    assert custom.distance(["left", "mid"], "right") == pytest.approx(
        (custom.distances.loc["left", "right"] + custom.distances.loc["mid", "right"]) / 2)
    with pytest.raises(ValidationError, match="unknown tags"):
        res.merge({"x": ["nope"]})


def test_errors():
    rows = block_rows(n_blocks=2, tags_per_block=1, rows_per_block=30)
    with pytest.raises(ValidationError, match="at least 3 subsets"):
        otstab.subset_distances(rows)
    with pytest.raises(ValidationError, match="min_size"):
        otstab.subset_distances(block_rows(), min_size=0)
    with pytest.raises(ValidationError, match="threshold"):
        otstab.subset_distances(block_rows(), threshold=1.5)
    with pytest.raises(ValidationError, match="dim"):
        otstab.subset_distances(block_rows(), dim=2.5)
    with pytest.raises(InputTypeError, match="tags must be"):
        otstab.subset_distances(42)
    with pytest.raises(ValidationError, match="missing"):
        otstab.subset_distances(pd.DataFrame({"a": [True, None, True]}))
    with pytest.raises(ValidationError, match="non-numeric"):
        otstab.subset_distances(pd.DataFrame({"a": ["x", "y"]}))
    res = otstab.subset_distances(block_rows())
    with pytest.raises(ValidationError, match="not a node"):
        res.distance("b0_1", "nope")
    with pytest.raises(ValidationError, match="empty"):
        res.distance([], "b0_1")


def test_missing_networkx_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "networkx", None)
    with pytest.raises(ImportError, match="pip install networkx"):
        otstab.subset_distances(block_rows())


def test_dim_too_large_makes_all_distances_equal():
    # With dim >= n - 1 the embedding is the orthogonal eigenvector matrix minus its constant
    # column, whose rows are all sqrt(2) apart before the common rescaling: every distance
    # is the same, whatever the graph. A warning says so.
    rows = block_rows(n_blocks=2, tags_per_block=2, rows_per_block=50)
    with pytest.warns(UserWarning, match="all pairwise distances are equal"):
        res = otstab.subset_distances(rows, dim=3)
    off = res.distances.to_numpy()[~np.eye(4, dtype=bool)]
    np.testing.assert_allclose(off, off[0], rtol=1e-10)
    res = otstab.subset_distances(rows, dim=1)  # informative: the two blocks separate
    assert res.distances.loc["b0_0", "b0_1"] < res.distances.loc["b0_0", "b1_1"]
