"""MetaShift-style subset distances from a multi-label metadata table (Liang & Zou, ICLR 2022).

For one class, every metadata tag m defines a subset (the rows carrying m). Subsets below
``min_size`` rows are dropped. The meta-graph joins two subsets by their overlap coefficient
|X n Y| / min(|X|, |Y|), dropping edges below ``threshold``; its spectral embedding (eigenvectors
2..K+1 of the unnormalised Laplacian L = D - A, centred and rescaled to max |coordinate| = 1, as
``networkx.spectral_layout`` in the released code) gives the distance between subsets, and
greedy modularity maximisation (``networkx.greedy_modularity_communities``) its communities.

networkx is optional: it is imported only by :func:`subset_distances`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import cdist

from .._results import ResultMixin
from .._validation import check_scalar, non_numeric_columns
from ..errors import InputTypeError, ValidationError

__all__ = ["SubsetDistances", "subset_distances"]


def _import_networkx():
    try:
        import networkx as nx
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "subset_distances needs networkx for the modularity communities; install it with "
            "`pip install networkx`"
        ) from exc
    return nx


def _sorted(values) -> list:
    values = list(values)
    try:
        return sorted(values)
    except TypeError:
        return sorted(values, key=repr)


def _membership(tags) -> pd.DataFrame:
    """Boolean (rows x tags) DataFrame from any accepted ``tags`` form."""
    if tags is None:
        raise ValidationError("tags is required, got None")
    if isinstance(tags, pd.DataFrame):
        if tags.shape[1] == 0 or tags.shape[0] == 0:
            raise ValidationError(f"tags must have rows and tag columns, got shape {tags.shape}")
        if tags.isna().to_numpy().any():
            col = tags.columns[int(np.argmax(tags.isna().to_numpy().any(axis=0)))]
            raise ValidationError(f"tags has missing values (column {col!r}); use False / 0")
        bad = non_numeric_columns(tags)
        if bad:
            raise ValidationError(
                f"tags as a DataFrame must be boolean or 0/1 (rows x tags); non-numeric "
                f"column(s) {bad[:5]}"
            )
        if tags.columns.duplicated().any():
            raise ValidationError("tags has duplicated column names")
        return pd.DataFrame(tags.to_numpy() != 0, index=tags.index, columns=tags.columns)
    if isinstance(tags, np.ndarray) and tags.ndim == 2:
        if tags.dtype.kind not in "biuf":
            raise ValidationError(
                f"tags as an array must be a boolean / 0-1 (rows x tags) matrix, got dtype "
                f"{tags.dtype}"
            )
        if tags.size == 0:
            raise ValidationError(f"tags is empty (shape {tags.shape})")
        if not np.all(np.isfinite(tags)):
            raise ValidationError("tags contains NaN or inf")
        return pd.DataFrame(tags != 0)
    if isinstance(tags, Mapping):
        # tag -> iterable of row ids (the released code's node_name_to_img_id)
        sets = {}
        for tag, rows in tags.items():
            if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
                raise ValidationError(
                    f"tags[{tag!r}] must be an iterable of row ids, got {type(rows).__name__}"
                )
            sets[tag] = set(rows)
        if not sets:
            raise ValidationError("tags is an empty mapping")
        row_ids = _sorted(set().union(*sets.values()))
        if not row_ids:
            raise ValidationError("tags has no rows (every tag maps to an empty set)")
        pos = {r: i for i, r in enumerate(row_ids)}
        mat = np.zeros((len(row_ids), len(sets)), dtype=bool)
        for j, rows in enumerate(sets.values()):
            mat[[pos[r] for r in rows], j] = True
        return pd.DataFrame(mat, index=pd.Index(row_ids, dtype=object),
                            columns=pd.Index(list(sets), dtype=object))
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise InputTypeError(
            "tags must be a boolean DataFrame (rows x tags), a 2-D 0/1 array, a mapping "
            f"tag -> row ids, or a list of tag sets (one per row); got {type(tags).__name__}"
        )
    rows = []
    for i, row in enumerate(tags):
        if isinstance(row, (str, bytes)):
            rows.append({row})
        elif isinstance(row, Iterable):
            rows.append(set(row))
        else:
            raise ValidationError(
                f"tags[{i}] must be a set of tags (one per row), got {type(row).__name__}"
            )
    if not rows:
        raise ValidationError("tags is empty")
    names = _sorted(set().union(*rows))
    if not names:
        raise ValidationError("tags has no tags (every row is empty)")
    col = {t: j for j, t in enumerate(names)}
    mat = np.zeros((len(rows), len(names)), dtype=bool)
    for i, row in enumerate(rows):
        mat[i, [col[t] for t in row]] = True
    return pd.DataFrame(mat, columns=pd.Index(names, dtype=object))


def _overlap(M: np.ndarray) -> np.ndarray:
    """Overlap coefficients |X n Y| / min(|X|, |Y|) of the columns of a boolean matrix."""
    Mf = M.astype(np.float64)
    inter = Mf.T @ Mf
    size = np.diag(inter).copy()
    return inter / np.minimum(size[:, None], size[None, :])


def _laplacian_eigvecs(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Eigenvalues / eigenvectors of L = D - A (ascending), with a fixed null-space basis.

    For a connected graph the first eigenvector is the constant one, as in networkx. With c
    components the null space has dimension c and any basis is an eigenbasis; we fix it to
    [1/sqrt(n), component indicators orthonormalised against it, in component order], so the
    constant vector is the one dropped and results are reproducible.
    """
    L = np.diag(A.sum(axis=1)) - A
    vals, vecs = np.linalg.eigh(L)
    n_comp, comp = connected_components(A != 0, directed=False)
    if n_comp > 1:
        n = A.shape[0]
        basis = np.zeros((n, n_comp))
        basis[:, 0] = 1.0
        for c in range(n_comp - 1):
            basis[:, c + 1] = comp == c
        q, _ = np.linalg.qr(basis)
        vecs = vecs.copy()
        vecs[:, :n_comp] = q * np.sign(q[0, 0] if q[0, 0] != 0 else 1.0)
        vals = vals.copy()
        vals[:n_comp] = 0.0
    return vals, vecs, int(n_comp)


def _layout(vecs: np.ndarray, dim: int) -> np.ndarray:
    """networkx.spectral_layout's post-processing: columns 1..dim, centre, max |x| = 1."""
    pos = np.array(vecs[:, 1:dim + 1], dtype=np.float64, copy=True)
    pos -= pos.mean(axis=0)
    lim = np.abs(pos).max() if pos.size else 0.0
    if lim > 0:
        pos /= lim
    return pos


@dataclass(repr=False)
class SubsetDistances(ResultMixin):
    """Meta-graph, spectral embedding, distances and communities of metadata subsets.

    Attributes
    ----------
    sizes : pandas.Series
        Rows per kept subset (tag), in node order.
    overlap : pandas.DataFrame
        Overlap coefficients |X n Y| / min(|X|, |Y|) (diagonal 1).
    adjacency : pandas.DataFrame
        Meta-graph weights: ``overlap`` with the diagonal and entries below ``threshold`` set
        to 0.
    embedding : pandas.DataFrame
        Spectral embedding, one row per subset, columns ``dim1 .. dimK``
        (K = min(dim, n_subsets - 1)).
    eigenvalues : numpy.ndarray
        Laplacian eigenvalues of the embedding columns.
    distances : pandas.DataFrame
        Euclidean distances between embedding rows.
    communities : list of list
        Modularity communities (largest first), each a list of tags in node order.
    n_components : int
        Connected components of the meta-graph (> 1: distances across components depend on
        the null-space convention, see Notes of :func:`subset_distances`).
    dropped : list
        Tags with fewer than ``min_size`` rows.
    min_size, threshold, dim : parameters used.
    """

    sizes: pd.Series
    overlap: pd.DataFrame
    adjacency: pd.DataFrame
    embedding: pd.DataFrame
    eigenvalues: np.ndarray
    distances: pd.DataFrame
    communities: list
    n_components: int
    dropped: list
    min_size: int
    threshold: float
    dim: int
    community_weight: str | None = None
    _membership: pd.DataFrame | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return (f"SubsetDistances(n_subsets={len(self.sizes)}, dim={self.embedding.shape[1]}, "
                f"threshold={self.threshold}, n_communities={len(self.communities)}, "
                f"n_components={self.n_components})")

    def summary(self) -> str:
        lines = [f"Metadata subsets: {len(self.sizes)} kept (min_size {self.min_size}), "
                 f"{len(self.dropped)} dropped, meta-graph threshold {self.threshold:g}, "
                 f"{self.n_components} connected component(s), "
                 f"{len(self.communities)} communities, embedding dim "
                 f"{self.embedding.shape[1]}"]
        for i, members in enumerate(self.communities[:10]):
            shown = ", ".join(map(str, members[:8])) + (" ..." if len(members) > 8 else "")
            lines.append(f"  community {i}: {shown}")
        return "\n".join(lines)

    def to_frame(self) -> pd.DataFrame:
        """Node table: ``size``, ``community`` (index into ``communities``) and coordinates."""
        comm = {t: i for i, members in enumerate(self.communities) for t in members}
        out = pd.DataFrame({"size": self.sizes,
                            "community": [comm.get(t, -1) for t in self.sizes.index]})
        return pd.concat([out, self.embedding], axis=1)

    def community_of(self, tag) -> int:
        """Index in ``communities`` of the community holding ``tag``."""
        for i, members in enumerate(self.communities):
            if tag in members:
                return i
        raise ValidationError(f"tag {tag!r} is not a node of the meta-graph; nodes: "
                              f"{list(self.sizes.index)[:10]}")

    def _is_node(self, x) -> bool:
        try:
            return x in self.sizes.index
        except TypeError:  # unhashable, e.g. a list
            return False

    def _point(self, part, name: str) -> np.ndarray:
        """Embedding of a node, or size-weighted mean embedding of a collection of nodes."""
        nodes = self.sizes.index
        if self._is_node(part) or isinstance(part, (str, bytes)) or not isinstance(
                part, Iterable):
            members = [part]
        else:
            members = list(part)
            if not members:
                raise ValidationError(f"{name} is an empty collection of subsets")
        for m in members:
            if m not in nodes:
                raise ValidationError(
                    f"{name}: {m!r} is not a node of the meta-graph (dropped: "
                    f"{m in self.dropped}); nodes: {list(nodes)[:10]}"
                )
        w = self.sizes.loc[members].to_numpy(dtype=np.float64)
        X = self.embedding.loc[members].to_numpy()
        return (w[:, None] * X).sum(axis=0) / w.sum()

    def distance(self, train, test) -> float:
        """Distance of a training set made of several parts to a test subset.

        Parameters
        ----------
        train : tag or sequence of parts
            A single node, or a list of parts (e.g. two communities A and B); the distance is
            the mean over parts of d(part, test), the released code's
            (d(A, test) + d(B, test)) / 2. A part that is itself a list / set of nodes is
            represented by the size-weighted mean of their embeddings (the paper's rule for
            merged subsets, Sec. 4.1).
        test : tag or collection of tags
            The test subset (a collection is merged the same way).

        Returns
        -------
        float
        """
        if (self._is_node(train) or isinstance(train, (str, bytes))
                or not isinstance(train, Iterable)):
            parts = [train]
        else:
            parts = list(train)
            if not parts:
                raise ValidationError("train is an empty list of parts")
        t = self._point(test, "test")
        d = [float(np.linalg.norm(self._point(p, f"train[{i}]") - t))
             for i, p in enumerate(parts)]
        return float(np.mean(d))

    def merge(self, groups: Mapping | None = None, *, threshold: float | None = None,
              dim: int | None = None) -> SubsetDistances:
        """Re-build the meta-graph on merged subsets (the released code's route).

        Each merged node is the union of the rows of its member tags; the overlap graph,
        embedding and communities are then recomputed on the merged nodes (``min_size`` is
        not re-applied). This is what the MetaShift code does before measuring the distance
        of e.g. dog(cabinet + bed) to dog(shelf).

        Parameters
        ----------
        groups : mapping name -> iterable of tags, optional
            Merged nodes. Default: the detected ``communities``, each named after its largest
            member.
        threshold, dim : optional
            Overrides of the parameters of this result.

        Returns
        -------
        SubsetDistances
        """
        if self._membership is None:  # pragma: no cover - only for hand-built results
            raise ValidationError("this result keeps no membership table to merge")
        if groups is None:
            groups = {}
            for members in self.communities:
                sizes = self.sizes.loc[members]
                groups[sizes.index[int(np.argmax(sizes.to_numpy()))]] = list(members)
        if not isinstance(groups, Mapping) or not groups:
            raise ValidationError("groups must be a non-empty mapping name -> list of tags")
        M = self._membership
        cols = {}
        for name, members in groups.items():
            members = [members] if isinstance(members, (str, bytes)) else list(members)
            missing = [m for m in members if m not in M.columns]
            if missing or not members:
                raise ValidationError(f"groups[{name!r}] has unknown tags {missing[:5]}")
            cols[name] = M[members].any(axis=1).to_numpy()
        merged = pd.DataFrame(cols, index=M.index)
        return subset_distances(
            merged, min_size=1,
            threshold=self.threshold if threshold is None else threshold,
            dim=self.dim if dim is None else dim, community_weight=self.community_weight,
        )


def subset_distances(tags, *, min_size: int = 25, threshold: float = 0.2, dim: int = 5,
                     community_weight: str | None = None) -> SubsetDistances:
    """MetaShift subsets, meta-graph, spectral-embedding distances and communities.

    Parameters
    ----------
    tags : pandas.DataFrame, numpy.ndarray, mapping or list of sets
        Multi-label metadata of the rows of one class: a boolean / 0-1 DataFrame (rows x
        tags; columns name the tags), a 2-D 0/1 array, a mapping tag -> iterable of row ids,
        or a list with the set of tags of each row.
    min_size : int, default 25
        Subsets with fewer rows are dropped (MetaShift's 25).
    threshold : float, default 0.2
        Edges with overlap below it are dropped (released code 0.2; the paper says 0.1).
    dim : int, default 5
        Embedding dimension K (released code 5); capped at n_subsets - 1.
    community_weight : None or "weight", default None
        Edge attribute used by greedy modularity; ``None`` (unweighted) is what the released
        code does, ``"weight"`` uses the overlaps.

    Returns
    -------
    SubsetDistances

    Notes
    -----
    The embedding follows ``networkx.spectral_layout`` (dense solver): eigenvectors 2..K+1 of
    L = D - A, each column centred, all coordinates divided by the largest absolute one.
    Eigenvectors are unique only up to sign, which does not change any distance. We use the
    symmetric solver ``numpy.linalg.eigh``; networkx uses ``numpy.linalg.eig``, so within a
    repeated eigenvalue (e.g. a disconnected meta-graph) the two may pick different bases.
    For a disconnected graph we fix the null-space basis (constant vector first, then
    component indicators), so nodes of different components are separated along those
    directions; treat distances across components with care (``n_components`` > 1). For two
    or fewer subsets networkx returns a degenerate layout, so at least 3 subsets are
    required. With n_subsets <= dim + 1 every non-constant eigenvector is used and all
    pairwise distances are equal (a ``UserWarning`` says so); more generally, when ``dim``
    reaches the number of well-separated communities minus one the communities sit at the
    corners of a near-regular simplex, and only a smaller ``dim`` orders them by distance.
    """
    md = check_scalar(min_size, "min_size", low=1)
    if md != int(md):
        raise ValidationError(f"min_size must be a positive integer, got {min_size}")
    th = check_scalar(threshold, "threshold", low=0.0, high=1.0)
    dm = check_scalar(dim, "dim", low=1)
    if dm != int(dm):
        raise ValidationError(f"dim must be a positive integer, got {dim}")
    if community_weight is not None and not isinstance(community_weight, str):
        raise InputTypeError("community_weight must be None or an edge attribute name")
    nx = _import_networkx()

    M = _membership(tags)
    sizes_all = M.sum(axis=0).astype(np.int64)
    keep = sizes_all >= int(md)
    dropped = list(sizes_all.index[~keep.to_numpy()])
    kept = M.loc[:, keep.to_numpy()]
    nodes = list(kept.columns)
    if len(nodes) < 3:
        raise ValidationError(
            f"need at least 3 subsets with >= min_size={int(md)} rows, got {len(nodes)} "
            f"(sizes: {dict(sizes_all.sort_values(ascending=False).head(5))}); "
            "lower min_size or pass more tags"
        )
    ov = _overlap(kept.to_numpy())
    A = ov.copy()
    np.fill_diagonal(A, 0.0)
    A[A < th] = 0.0

    if len(nodes) <= int(dm) + 1:
        warnings.warn(
            f"{len(nodes)} subsets and dim={int(dm)}: the embedding uses every non-constant "
            "eigenvector, so all pairwise distances are equal (the rows of an orthogonal "
            "matrix); use dim < n_subsets - 1",
            UserWarning, stacklevel=2,
        )
    vals, vecs, n_comp = _laplacian_eigvecs(A)
    pos = _layout(vecs, int(dm))
    k = pos.shape[1]
    idx = pd.Index(nodes, dtype=object, name="subset")
    emb = pd.DataFrame(pos, index=idx, columns=[f"dim{j + 1}" for j in range(k)])
    dist = pd.DataFrame(cdist(pos, pos), index=idx, columns=idx.rename(None))

    G = nx.Graph()
    G.add_nodes_from(range(len(nodes)))
    iu, ju = np.nonzero(np.triu(A, k=1))
    G.add_weighted_edges_from((int(i), int(j), float(A[i, j])) for i, j in zip(iu, ju))
    if G.number_of_edges() == 0:
        comms = [[i] for i in range(len(nodes))]
    else:
        found = nx.community.greedy_modularity_communities(G, weight=community_weight)
        comms = [sorted(c) for c in found]
    comms.sort(key=lambda c: (-len(c), c[0]))
    communities = [[nodes[i] for i in c] for c in comms]

    return SubsetDistances(
        sizes=pd.Series(sizes_all[keep.to_numpy()].to_numpy(), index=idx, name="size"),
        overlap=pd.DataFrame(ov, index=idx, columns=idx.rename(None)),
        adjacency=pd.DataFrame(A, index=idx, columns=idx.rename(None)),
        embedding=emb, eigenvalues=vals[1:k + 1].copy(), distances=dist,
        communities=communities, n_components=n_comp, dropped=dropped,
        min_size=int(md), threshold=th, dim=int(dm), community_weight=community_weight,
        _membership=M,
    )

