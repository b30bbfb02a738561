"""Which forget records an attack trains on: seeded D_rel draws, and a searched audit's one split of D_f into a relearn
pool, a selection set and a report set (torch-free: an audit resolves its split before any model is loaded)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from margincal.core.errors import InputError


def relearn_draw(n: int, k: int, seed: int) -> list[int]:
    """Seeded draw of ``k`` positions of ``range(n)``, sorted: the first ``k`` of a seeded shuffle."""
    if not 0 < k <= n:
        raise InputError(f"relearn budget K={k} must be in [1, {n}] for a pool of {n} records")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[:k])


def relearn_split(n: int, k: int, seed: int, pool: Sequence[int] = ()) -> tuple[list[int], list[int]]:
    """Seeded disjoint split of ``range(n)`` into D_rel (k items) and the held-out rest. D_rel is
    :func:`relearn_draw` of ``range(n)``, or, given a ``pool`` (a searched attack's relearn pool,
    :func:`search_split`), of the pool's positions: D_rel = {pool[i] : i ∈ relearn_draw(|pool|, k, seed)}."""
    if not 0 < k < n:
        raise InputError(f"relearn budget K={k} must be in [1, {n - 1}] for a forget set of {n} samples")
    if pool and not all(0 <= i < n for i in pool):
        raise InputError(f"the relearn pool names records outside the forget set's {n}")
    rel = sorted(pool[i] for i in relearn_draw(len(pool), k, seed)) if pool else relearn_draw(n, k, seed)
    return rel, sorted(set(range(n)) - set(rel))


@dataclasses.dataclass(frozen=True)
class SearchSplit:
    """D_f's records split once for a searched audit (:func:`search_split`): the ``pool`` every searched draw of a
    family that trains on D_f takes D_rel from, the ``selection`` set every trial is scored on and the ``report``
    set the card reports on. Pairwise disjoint, together all of D_f; ``seed`` is the shuffle's."""

    seed: int
    pool: tuple[int, ...]
    selection: tuple[int, ...]
    report: tuple[int, ...]

    def selecting(self, trains_on_forget: bool) -> tuple[int, ...]:
        """The records a family's trials are scored on: the selection set; a family whose D_rel is not drawn from
        D_f (retain or probe data, the format probe, a corpus) also the pool, which none of its draws trains on."""
        return self.selection if trains_on_forget else tuple(sorted(self.selection + self.pool))


def search_split(n: int, k_pool: int, seed: int) -> SearchSplit:
    """Split ``range(n)`` once by a seeded shuffle (``seed``: one no D_rel draw uses) into the relearn pool (its first
    ``k_pool`` records: the largest K a searched family draws from D_f, 0 when none does), then the rest into the
    selection set (its first ⌈(n − k_pool)/2⌉) and the report set (the other ⌊(n − k_pool)/2⌋). Every trial is
    selected on the same records and every reported draw leaves the report set whole: neither ever holds a record
    some D_rel trains on, since every D_rel ⊂ pool."""
    if not 0 <= k_pool <= n - 2:
        raise InputError(
            f"a searched audit splits the forget set into a relearn pool of K = {k_pool}, a selection set and a "
            f"report set; {n} records leave no room for both (lower K to at most {n - 2})"
        )
    order = list(range(n))
    random.Random(seed).shuffle(order)
    rest = order[k_pool:]
    cut = (len(rest) + 1) // 2
    return SearchSplit(seed, tuple(sorted(order[:k_pool])), tuple(sorted(rest[:cut])), tuple(sorted(rest[cut:])))
