"""Model families: what one (model family, forget tier) gives the pipeline.

A family answers the same four questions whatever it is built from:

* :meth:`~ModelFamily.ids`: the identities of θ0 and θ_ref in store keys, from configuration alone;
* :meth:`~ModelFamily.data_id`: the identity of its data (benchmark source and prompt template);
* :meth:`~ModelFamily.status`: a line for ``panel --dry-run`` (cached, to be built, local or hub);
* :meth:`~ModelFamily.resolve`: loadable θ0, θ_ref and tokenizer locations and the records of each split.

:class:`HFFamily` (``kind: hf`` in ``configs/models``) names θ0 and θ_ref by hub id or local directory and reads
the benchmark's splits from its data source; :class:`margincal.mini.family.MiniFamily` (``kind: mini``) builds
the mini models as store stages and generates the mini splits.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

from margincal.config.settings import DEFAULT_DEVICE, DEFAULT_DTYPE
from margincal.core.artifacts import weights_digest
from margincal.core.errors import InputError
from margincal.data.hub import pinned, split_revision
from margincal.data.records import QARecord
from margincal.data.templates import load_template
from margincal.data.tofu import load_split
from margincal.model.loading import model_context


@dataclasses.dataclass(frozen=True)
class Resolved:
    """Loadable θ0 / θ_ref / tokenizer (paths or hub ids) and ``split(name) → records``."""

    theta0: str
    ref: str
    tokenizer: str
    split: Callable[[str], list[QARecord]]


class ModelFamily(abc.ABC):
    """A model family YAML (``name``, ``kind``, ``dtype``, optional ``template``, ``attn_implementation``,
    ``device_map``) and how to get its models and splits for a forget tier."""

    def __init__(self, spec: dict):
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.get("name", self.spec.get("kind", "?"))

    @property
    def dtype(self) -> str:
        return self.spec.get("dtype", DEFAULT_DTYPE)

    @property
    def template(self) -> str | None:
        """A configs/templates name or YAML file; None: detected from the tokenizer at load time."""
        return self.spec.get("template")

    @property
    def load_options(self) -> dict:
        return {k: self.spec[k] for k in ("attn_implementation", "device_map") if k in self.spec}

    def data_id(self, tier: str) -> dict:
        """Identity of the family's data and prompt template in store keys."""
        return {"template": self.template and dataclasses.asdict(load_template(self.template))}

    @abc.abstractmethod
    def ids(self, tier: str) -> tuple[str, str]:
        """Identities of (θ0, θ_ref) in store keys; raises ValueError for a tier the family does not have."""

    @abc.abstractmethod
    def status(self, tier: str) -> str:
        """One line on where the models of ``tier`` come from (for ``panel --dry-run``)."""

    @abc.abstractmethod
    def resolve(self, tier: str, device: str = DEFAULT_DEVICE) -> Resolved:
        """The models (built or fetched when needed; a build trains on ``device``) and splits of ``tier``."""

    @abc.abstractmethod
    def context(self) -> int | None:
        """Positions θ0 was built for (from its config alone; None when it does not say)."""

    @abc.abstractmethod
    def splits(self) -> Callable[[str], list[QARecord]]:
        """``split(name) → records`` of the family's data, read (or fetched) without loading any model."""

    @abc.abstractmethod
    def tokenizer_source(self, tier: str) -> str:
        """Where the tokenizer is read from without loading a model (a raw-text split's chunk count needs it)."""

    def tokenizer_ready(self, tier: str) -> bool:
        """Whether :meth:`tokenizer_source` can be read now, without building anything (a checkpoint's tokenizer:
        yes; the mini's, a store stage: only once built)."""
        return True

    @abc.abstractmethod
    def local_splits(self) -> Callable[[str], list[QARecord]] | None:
        """``split(name) → records`` without building or fetching any model, when the data is local (generated or
        on disk); None when it would need the hub (checks that read the data then wait for the run)."""


@functools.cache
def _pinned(model: str) -> str:
    """``model`` (a hub id, optionally ``@revision``) pinned to its commit, asked once per process."""
    return pinned(*split_revision(model))


class HFFamily(ModelFamily):
    """``kind: hf``: ``target`` and ``references: {tier: id}`` are hub ids or local directories; the splits come
    from ``source`` (the benchmark's data source or the panel's ``data``)."""

    def __init__(self, spec: dict, source: str | None, benchmark: str, digests: Path | None = None):
        super().__init__(spec)
        self.source, self.benchmark, self.digests = source, benchmark, digests

    def identity(self, model: str) -> str:
        """A hub id pinned to the commit its revision (``org/model@rev``, default main) resolves to
        (:func:`margincal.data.hub.pinned`); a local directory by the digest of its weights, not its path (retraining
        into the same directory gives a new identity, so no stored result or anchor table of the old weights is
        reused; the same weights under another path or working directory keep theirs)."""
        if Path(model).is_dir():
            return f"local@{weights_digest(model, self.digests)}"
        return _pinned(model)

    def ids(self, tier: str) -> tuple[str, str]:
        theta0, ref = self._models(tier)
        return self.identity(theta0), self.identity(ref)

    def data_id(self, tier: str) -> dict:
        return {"source": self.source, **super().data_id(tier)}

    def status(self, tier: str) -> str:
        where = [
            f"{p} ({'local directory' if Path(p).is_dir() else 'hub id, or a missing local directory'})"
            for p in self._models(tier)
        ]
        return f"θ0 {where[0]}, θ_ref {where[1]}"

    def _models(self, tier: str) -> tuple[str, str]:
        """(θ0, θ_ref) as the family YAML names them; an unknown tier or a missing data source stops here."""
        if tier not in self.spec["references"]:
            raise InputError(
                f"model family {self.name!r} has no reference for tier {tier!r}; it has "
                f"{', '.join(self.spec['references'])}"
            )
        if self.source is None:
            raise InputError(f"benchmark {self.benchmark} has no data source; give one (data=DIR or --data DIR)")
        return self.spec["target"], self.spec["references"][tier]

    def resolve(self, tier: str, device: str = DEFAULT_DEVICE) -> Resolved:
        theta0, ref = self._models(tier)
        return Resolved(theta0, ref, theta0, functools.partial(load_split, self.source))

    def context(self) -> int | None:
        return model_context(self.spec["target"])

    def splits(self) -> Callable[[str], list[QARecord]]:
        if self.source is None:
            raise InputError(f"benchmark {self.benchmark} has no data source; give one (data=DIR or --data DIR)")
        return functools.partial(load_split, self.source)

    def tokenizer_source(self, tier: str) -> str:
        return self._models(tier)[0]

    def local_splits(self) -> Callable[[str], list[QARecord]] | None:
        return self.splits() if Path(self.source).exists() else None
