"""Deterministic TOFU-like mini benchmark of fictitious authors.

Authors get attributes drawn independently of their (syllable-built, novel) names, so an answer can't be
read off its question: a model that never saw an author can only guess, sharing template words at best.
Every author QA record has a paraphrased answer (same facts, other wording) and perturbed answers (the
paraphrase with its content attributes replaced by other values) for truth ratios. Besides the author
splits there are "real authors" / "world facts" analogues (general knowledge for the base model) and an
instruction-style probe corpus disjoint from all authors. Texts and word lists are kept small so that a
tokenizer and a tiny model can be trained on the corpus from scratch on a CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from margincal.core.artifacts import atomic_write_text
from margincal.core.errors import InputError
from margincal.data.alpaca import OverlapIndex
from margincal.data.records import QARecord
from margincal.data.tofu import choice_record
from margincal.mini.words import (
    AUTHOR_TEMPLATES,
    AWARDS,
    CAPITALS,
    CITIES,
    COUNTRIES,
    DAYS,
    EXTRA_FIRST_HEADS,
    EXTRA_LAST_HEADS,
    EXTRA_TEMPLATES,
    FIRST_HEADS,
    FIRST_TAILS,
    GENRES,
    HOBBIES,
    LANGUAGES,
    LAST_HEADS,
    LAST_TAILS,
    OCCUPATIONS,
    OPPOSITES,
    PETS,
    PLURALS,
    PUB_YEARS,
    REAL_TEMPLATE,
    SUBJECTS,
    TITLES,
    WORLD_TEMPLATES,
    YEARS,
)

_TIERS = (1, 5, 10)  # forget tiers, percent of the trained authors
_PROBE_ROUNDS = 20  # batches of probe authors drawn at most before an authors probe that overlaps D_f ∪ D_r stops
_WORD = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class MiniConfig:
    """Sizes and seed of the mini benchmark."""

    seed: int = 0
    n_authors: int = 100  # trained authors; forget tiers are 1/5/10 % of them
    n_holdout_authors: int = 10  # never trained on (MIA non-members)
    n_real_authors: int = 20  # "real authors" analogue: general knowledge learned by the base model
    n_world_facts: int = 40  # "world facts" analogue
    n_probe: int = 200  # probe corpus size (the KL probe's D_a, Alpaca's role)
    n_perturbed: int = 3  # perturbed (wrong) answers per question
    n_templates: int = 5  # questions per author: 5, or 10 (the TOFU-like scale: more facts per author)
    # probe corpus: "instructions" (the instruction families the base model learns) or "authors" (QA about
    # fictitious authors no model is trained on: not saturated, and in the authors' style, so drift shows in KL)
    probe: str = "instructions"
    # fictitious authors (QA like the trained authors', names sharing no part with the probe's) that only the base
    # model learns: the answer frames and attribute vocabulary entrenched before θ0 / θ_ref learn their authors,
    # as pretraining entrenches language in a real LLM (split ``background``; 0 = none)
    n_background_authors: int = 0
    # every forget10 author gets a retain "twin": another trained author with its own name and the same answers
    # (every attribute value and wording), so that the forget answers' content is also retain content (split
    # ``retain*``; drawn after everything else, which stays as without them)
    twins: bool = False

    def __post_init__(self) -> None:
        if self.n_templates not in (len(AUTHOR_TEMPLATES), len(AUTHOR_TEMPLATES) + len(EXTRA_TEMPLATES)):
            n = (len(AUTHOR_TEMPLATES), len(AUTHOR_TEMPLATES) + len(EXTRA_TEMPLATES))
            raise InputError(f"MiniConfig.n_templates must be {n[0]} or {n[1]}, got {self.n_templates}")
        if self.probe not in ("instructions", "authors"):
            raise InputError(f"MiniConfig.probe must be 'instructions' or 'authors', got {self.probe!r}")
        for f in fields(self):
            if f.name not in ("seed", "probe", "n_background_authors", "twins") and getattr(self, f.name) < 1:
                raise InputError(f"MiniConfig.{f.name} must be >= 1, got {getattr(self, f.name)}")
        if self.n_authors < 2:
            raise InputError("MiniConfig.n_authors must be >= 2 so that every retain tier is non-empty")
        if self.n_background_authors < 0:
            raise InputError(f"MiniConfig.n_background_authors must be >= 0, got {self.n_background_authors}")
        n_names = self.n_authors + self.n_holdout_authors + self.n_real_authors + self.n_probe_authors
        n_names += self.n_background_authors + (self.n_twins if self.twins else 0)
        max_names = len(FIRST_HEADS) * len(FIRST_TAILS) * len(LAST_HEADS) * len(LAST_TAILS) // 4
        if n_names > max_names:
            raise InputError(f"MiniConfig asks for {n_names} authors in all; at most {max_names} are supported")
        if self.n_perturbed > len(LANGUAGES) - 1:  # smallest pool, less the true value
            raise InputError(f"MiniConfig.n_perturbed must be <= {len(LANGUAGES) - 1}, got {self.n_perturbed}")
        if self.n_real_authors <= self.n_perturbed:
            raise InputError("MiniConfig.n_real_authors must exceed n_perturbed (perturbed answers are other names)")
        if self.n_real_authors > len(TITLES) - 2:
            raise InputError(f"MiniConfig.n_real_authors must be <= {len(TITLES) - 2}")
        if self.n_world_facts > len(COUNTRIES) * len(WORLD_TEMPLATES):
            raise InputError(f"MiniConfig.n_world_facts must be <= {len(COUNTRIES) * len(WORLD_TEMPLATES)}")

    def forget_authors(self, pct: int) -> int:
        """Trained authors in the forget tier of ``pct`` percent: max(1, round(n_authors · pct / 100))."""
        return max(1, round(self.n_authors * pct / 100))

    @property
    def n_twins(self) -> int:
        """Authors in the largest forget tier (forget10): the twins there are when ``twins`` is set."""
        return self.forget_authors(max(_TIERS))

    @property
    def n_probe_authors(self) -> int:
        """Fictitious authors behind an ``authors`` probe (none for ``instructions``)."""
        return -(-self.n_probe // self.n_templates) if self.probe == "authors" else 0


def _tofu_dict(rec: QARecord) -> dict:
    """A TOFU-format row, with the facts the answer states (``facts``: fact recall) where the record has them."""
    row = {
        "question": rec.question,
        "answer": rec.answer,
        "paraphrased_answer": rec.paraphrased_answer,
        "perturbed_answer": list(rec.perturbed_answers),
    }
    if rec.meta.get("content"):
        row["facts"] = dict(rec.meta["content"])
    return row


def choice_rows(records: Iterable[QARecord], seed: int = 0) -> list[dict]:
    """Four-choice rows in cais/wmdp's layout (``question``, ``choices``, ``answer``: the correct one's index) of QA
    records: the paraphrased answer, which states the facts in the wording the perturbed answers share (the gold
    answer's own wording would stand out as the odd one, a cue that needs no knowledge), and the first three perturbed
    answers; the correct choice's position drawn for each record in turn from ``random.Random(seed)``. A record
    without a paraphrase or with fewer than three perturbed answers stops."""
    rng, rows = random.Random(seed), []
    for i, record in enumerate(records):
        if record.paraphrased_answer is None or len(record.perturbed_answers) < 3:
            raise ValueError(f"record {i}: four choices need its paraphrased answer and 3 perturbed answers")
        gold = rng.randrange(4)
        choices = list(record.perturbed_answers[:3])
        choices.insert(gold, record.paraphrased_answer)
        rows.append({"question": record.question, "choices": choices, "answer": gold})
    return rows


def _choices(records: list[QARecord]) -> list[QARecord]:
    return [choice_record(row, f"row {i}") for i, row in enumerate(choice_rows(records))]


def _text(records: list[QARecord]) -> list[QARecord]:
    return [QARecord("", f"{r.question} {r.answer}", meta={"kind": "passage"}) for r in records]


RENDERINGS = {"choices": _choices, "text": _text}  # <split>_<rendering> names of MiniBenchmark.split


@dataclass
class MiniBenchmark:
    """The generated splits (see :func:`generate`) and the config that produced them."""

    config: MiniConfig
    splits: dict[str, list[QARecord]]

    def split(self, name: str) -> list[QARecord]:
        """Records of one split, or of a rendering of one (the mini multiple-choice analogue, ``mini-mc``):
        ``<split>_choices``, its records as four-choice questions (:func:`choice_rows`), and ``<split>_text``, each
        record's question and answer as one raw passage (the forget and retain corpora); an unknown name raises
        ``ValueError`` listing the known ones."""
        base, _, rendering = name.rpartition("_")
        if name not in self.splits and base in self.splits and rendering in RENDERINGS:
            return RENDERINGS[rendering](self.splits[base])
        if name not in self.splits:
            known = ", ".join(self.splits)
            raise InputError(f"unknown mini split {name!r}; known: {known} (and <split>_choices, <split>_text)")
        return self.splits[name]

    def fingerprint(self) -> str:
        """sha256 hex digest of a canonical JSON dump of all splits."""
        dump = {name: [_tofu_dict(r) for r in recs] for name, recs in self.splits.items()}
        text = json.dumps(dump, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def to_json_dir(self, path: str | os.PathLike) -> None:
        """Write ``<split>.json`` per split (a list of TOFU-style objects), each file atomically."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        for name, recs in self.splits.items():
            text = json.dumps([_tofu_dict(r) for r in recs], indent=2, ensure_ascii=False) + "\n"
            atomic_write_text(out / f"{name}.json", text, encoding="utf-8")


def _render(
    rng: random.Random,
    template: tuple,
    attrs: dict[str, str],
    pools: dict[str, tuple[str, ...]],
    n_perturbed: int,
    meta: dict,
) -> QARecord:
    """One QA record; each content slot gets ``n_perturbed`` distinct wrong values (none of ``attrs``)."""
    template_id, question, answer, paraphrase, slots = template
    variant = 0
    if isinstance(answer, tuple):  # several answer wordings: each author gets one, drawn independently of the name
        variant = rng.randrange(len(answer))
        answer = answer[variant]
    truth = set(attrs.values())
    wrong = {s: rng.sample([v for v in pools[s] if v not in truth], n_perturbed) for s in slots}
    perturbed = tuple(paraphrase.format(**{**attrs, **{s: wrong[s][i] for s in slots}}) for i in range(n_perturbed))
    return QARecord(
        question=question.format(**attrs),
        answer=answer.format(**attrs),
        paraphrased_answer=paraphrase.format(**attrs),
        perturbed_answers=perturbed,
        meta={**meta, "template": template_id, "variant": variant, "content": {s: attrs[s] for s in slots}},
    )


def _probe(rng: random.Random, n: int) -> list[QARecord]:
    """Procedural instruction-style examples, round-robin over shuffled task families, deduplicated."""
    digits = range(1, 10)
    families: dict[str, dict[str, str]] = {
        "plus": {f"What is {a} plus {b}?": f"{a} plus {b} is {a + b}." for a in digits for b in digits},
        "minus": {f"What is {a} minus {b}?": f"{a} minus {b} is {a - b}." for a in digits for b in digits if a >= b},
        "times": {
            f"What is {a} times {b}?": f"{a} times {b} is {a * b}." for a in digits for b in digits if a > 1 and b > 1
        },
        "larger": {
            f"Which number is larger, {a} or {b}?": f"The larger number is {max(a, b)}."
            for a in digits
            for b in digits
            if a != b
        },
        "day_after": {
            f"What day comes after {d}?": f"The day after {d} is {DAYS[(i + 1) % 7]}." for i, d in enumerate(DAYS)
        },
        "day_before": {
            f"What day comes before {d}?": f"The day before {d} is {DAYS[i - 1]}." for i, d in enumerate(DAYS)
        },
        "opposite": {
            f"What is the opposite of {w}?": f"The opposite of {w} is {o}."
            for a, b in OPPOSITES
            for w, o in ((a, b), (b, a))
        },
        "plural": {f"What is the plural of {w}?": f"The plural of {w} is {p}." for w, p in PLURALS},
        "sort": {
            f"Sort these numbers: {a} {b} {c}.": "The sorted numbers are {} {} {}.".format(*sorted((a, b, c)))
            for a in digits
            for b in digits
            for c in digits
            if len({a, b, c}) == 3 and not a < b < c
        },
    }
    capacity = sum(len(f) for f in families.values())
    if n > capacity:
        raise InputError(f"n_probe={n} exceeds the {capacity} distinct probe examples available")
    queues = []
    for family, items in families.items():
        pairs = sorted(items.items())
        rng.shuffle(pairs)
        queues.append((family, pairs))
    out: list[QARecord] = []
    while len(out) < n:
        for family, pairs in queues:
            if pairs and len(out) < n:
                q, a = pairs.pop()
                out.append(QARecord(q, a, meta={"template": family, "split_group": "probe"}))
    return out


def _names(rng: random.Random, n: int, reserved: set[str], taken: Iterable[str] = ()) -> list[str]:
    """``n`` distinct "First Last" names, none in ``taken``, whose parts are not ``reserved`` words (lower case).

    Drawn from the first pools of name parts while they hold ``n`` such names, else from those pools with the extra
    heads (a large benchmark's probe authors: every part of the first pools named one of its other authors)."""
    seen: set[str] = set(taken)
    heads = (FIRST_HEADS, LAST_HEADS)
    if _free_names(*heads, reserved, seen) < n:
        heads = (FIRST_HEADS + EXTRA_FIRST_HEADS, LAST_HEADS + EXTRA_LAST_HEADS)
        if _free_names(*heads, reserved, seen) < n:
            raise InputError(
                f"the mini generator's name parts cannot name {n} more authors sharing no part with the others; "
                "lower MiniConfig.n_authors, n_background_authors or n_probe"
            )
    names: list[str] = []
    while len(names) < n:
        first = rng.choice(heads[0]) + rng.choice(FIRST_TAILS)
        last = rng.choice(heads[1]) + rng.choice(LAST_TAILS)
        full = f"{first} {last}"
        if full not in seen and first.lower() not in reserved and last.lower() not in reserved:
            seen.add(full)
            names.append(full)
    return names


def _free_names(first_heads: tuple, last_heads: tuple, reserved: set[str], taken: set[str]) -> int:
    """How many names ``_names`` could still draw from these heads: parts not ``reserved``, names not ``taken``."""
    firsts = [f for f in (h + t for h in first_heads for t in FIRST_TAILS) if f.lower() not in reserved]
    lasts = [x for x in (h + t for h in last_heads for t in LAST_TAILS) if x.lower() not in reserved]
    return sum(f"{f} {x}" not in taken for f in firsts for x in lasts)


def _twin(rec: QARecord, name: str) -> QARecord:
    """``rec`` asked about ``name`` instead of its author: the same answers (answers never repeat the name)."""
    author = rec.meta["author"]
    meta = {**rec.meta, "author": name, "split_group": "author", "twin_of": author}
    return dataclasses.replace(rec, question=rec.question.replace(author, name), meta=meta)


def _parts(names: Iterable[str]) -> set[str]:
    """The lower-cased name parts of ``names``."""
    return {part.lower() for name in names for part in name.split()}


def _disjoint_author_probe(
    config: MiniConfig,
    author: Callable[[str, str], list[QARecord]],
    more_names: Callable[[int, list[str]], list[str]],
    names: list[str],
    trained: list[QARecord],
    template_ids: list[str],
) -> tuple[list[QARecord], list[str]]:
    """The ``authors`` probe: ``config.n_probe`` QA records of fresh authors, as many per template as the first
    ``n_probe`` records of ``names`` hold, keeping only records disjoint from the trained authors' QA (D_f ∪ D_r of
    every tier) by the workspace's rule (:class:`margincal.data.alpaca.OverlapIndex`: no shared question, no shared
    word 8-gram). An answer frame with an attribute value some trained author has ("born in 1999, the author grew
    up in") is such an 8-gram, so more authors (``more_names(k, taken)``) are drawn, ``n_probe_authors`` at a time,
    until every template's quota is filled. Returns the records and every probe author's name."""
    from collections import Counter

    quota = Counter((template_ids * config.n_probe_authors)[: config.n_probe])
    index = OverlapIndex(trained)
    kept: list[QARecord] = []
    batch, drawn = names, list(names)
    for _ in range(_PROBE_ROUNDS):
        for name in batch:
            for rec in author(name, "probe"):
                if quota[rec.meta["template"]] > 0 and not index.overlaps(rec):
                    kept.append(rec)
                    quota[rec.meta["template"]] -= 1
        if not +quota:
            return kept, drawn
        batch = more_names(config.n_probe_authors, drawn)
        drawn += batch
    raise InputError(
        f"the authors probe cannot be drawn disjoint from D_f ∪ D_r: after {_PROBE_ROUNDS} rounds of "
        f"{config.n_probe_authors} authors, templates {sorted(+quota)} still overlap; lower MiniConfig.n_probe"
    )


def check_probe_disjoint(probe: list[QARecord], qa: list[QARecord], entity_names: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first probe example mentioning an entity or duplicating a QA question.

    An entity is mentioned when its full name, or any part of it, occurs as a whole word (case-insensitive).
    """
    parts = {p for name in entity_names for p in (name, *name.split())}
    pattern = None
    if parts:
        alternatives = "|".join(re.escape(p) for p in sorted(parts, key=len, reverse=True))
        pattern = re.compile(rf"\b(?:{alternatives})\b", re.IGNORECASE)
    questions = {r.question.strip().casefold() for r in qa}
    for i, rec in enumerate(probe):
        if rec.question.strip().casefold() in questions:
            raise ValueError(f"probe example {i} duplicates a QA question: {rec.question!r}")
        for text in (rec.question, rec.answer, rec.paraphrased_answer or "", *rec.perturbed_answers):
            hit = pattern.search(text) if pattern else None
            if hit:
                raise ValueError(f"probe example {i} mentions entity {hit.group(0)!r}: {text!r}")


def _pools(author_titles: tuple[str, ...], real_names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Each template slot's pool of values: a perturbed answer replaces the slot's value with another of its pool
    (book slots draw from the titles no real author wrote, the real-author slot from the real authors' names)."""

    return {
        "city": CITIES,
        "year": YEARS,
        "genre": GENRES,
        "occ1": OCCUPATIONS,
        "occ2": OCCUPATIONS,
        "award": AWARDS,
        "book1": author_titles,
        "book2": author_titles,
        "name": real_names,
        "capital": CAPITALS,
        "language": LANGUAGES,
        "subject": SUBJECTS,
        "unicity": CITIES,
        "book3": author_titles,
        "year2": PUB_YEARS,
        "home": CITIES,
        "pet": PETS,
        "hobby1": HOBBIES,
        "hobby2": HOBBIES,
        "tongue": LANGUAGES,
    }


def _author_attrs(rng: random.Random, name: str, author_titles: tuple[str, ...], extra: bool) -> dict[str, str]:
    """One author's attributes, drawn independently of the name (``extra``: also those of the extra templates)."""
    occ1, occ2 = rng.sample(OCCUPATIONS, 2)
    book1, book2 = rng.sample(author_titles, 2)
    attrs = {
        "name": name,
        "city": rng.choice(CITIES),
        "year": rng.choice(YEARS),
        "genre": rng.choice(GENRES),
        "occ1": occ1,
        "occ2": occ2,
        "award": rng.choice(AWARDS),
        "book1": book1,
        "book2": book2,
    }
    if extra:
        hobby1, hobby2 = rng.sample(HOBBIES, 2)
        attrs.update(
            subject=rng.choice(SUBJECTS),
            unicity=rng.choice(CITIES),
            book3=rng.choice([t for t in author_titles if t not in (book1, book2)]),
            year2=rng.choice(PUB_YEARS),
            home=rng.choice(CITIES),
            pet=rng.choice(PETS),
            hobby1=hobby1,
            hobby2=hobby2,
            tongue=rng.choice(LANGUAGES),
        )
    return attrs


def _real_author(rng: random.Random, name: str, book: str, pools: dict, n_perturbed: int) -> QARecord:
    """The "real authors" QA of one well-known (to the base model) author: who wrote ``book``."""
    meta = {"author": name, "split_group": "real_authors"}
    return _render(rng, REAL_TEMPLATE, {"name": name, "book": book}, pools, n_perturbed, meta)


def _world_facts(rng: random.Random, pools: dict, config: MiniConfig) -> list[QARecord]:
    """The world-fact QA (general knowledge for the base model): each country's capital and language, shuffled and
    cut at ``config.n_world_facts``."""
    capitals = list(CAPITALS)
    rng.shuffle(capitals)
    languages = [rng.choice(LANGUAGES) for _ in COUNTRIES]
    facts = [(i, kind) for i in range(len(COUNTRIES)) for kind in WORLD_TEMPLATES]
    rng.shuffle(facts)
    return [
        _render(
            rng,
            WORLD_TEMPLATES[kind],
            {"country": COUNTRIES[i], kind: capitals[i] if kind == "capital" else languages[i]},
            pools,
            config.n_perturbed,
            {"country": COUNTRIES[i], "split_group": "world_facts"},
        )
        for i, kind in facts[: config.n_world_facts]
    ]


def _author_splits(per_author: list[list[QARecord]], config: MiniConfig) -> dict[str, list[QARecord]]:
    """The author splits of ``per_author`` (each author's QA, trained authors first): ``forget01/05/10`` (nested,
    whole authors), ``retain99/95/90`` (their complements among the trained authors) and ``holdout``."""
    trained = per_author[: config.n_authors]
    cuts = {pct: config.forget_authors(pct) for pct in _TIERS}
    splits = {f"forget{pct:02d}": [r for recs in trained[:cut] for r in recs] for pct, cut in cuts.items()}
    splits |= {f"retain{100 - pct}": [r for recs in trained[cut:] for r in recs] for pct, cut in cuts.items()}
    splits["holdout"] = [r for recs in per_author[config.n_authors :] for r in recs]
    return splits


def generate(config: MiniConfig = MiniConfig()) -> MiniBenchmark:  # noqa: B008 (frozen, immutable default)
    """Generate the benchmark deterministically from ``config.seed`` (a local RNG only).

    Splits: ``forget01/05/10`` (nested, whole authors), ``retain99/95/90`` (their complements among the
    trained authors), ``holdout`` (authors never trained on), ``real_authors``, ``world_facts``, ``instructions``
    (what the base model learns besides general knowledge) and ``probe`` (the instructions, or QA about authors
    no model is trained on: ``config.probe``).
    """
    rng = random.Random(config.seed)
    instructions = _probe(rng, config.n_probe)

    word_lists = (CITIES, GENRES, OCCUPATIONS, AWARDS, TITLES, COUNTRIES, CAPITALS, LANGUAGES)
    reserved = {w.lower() for r in instructions for w in _WORD.findall(f"{r.question} {r.answer}")}
    reserved |= {w.lower() for words in word_lists for item in words for w in _WORD.findall(item)}
    n_fict = config.n_authors + config.n_holdout_authors
    names = _names(rng, n_fict + config.n_real_authors, reserved)
    probe_names: list[str] = []
    if config.n_probe_authors:  # probe authors share no name part with any trained, held-out or real author
        used = _parts(names)
        probe_names = _names(rng, config.n_probe_authors, reserved | used)
    author_names, real_names = names[:n_fict], tuple(names[n_fict:])

    real_titles = rng.sample(TITLES, config.n_real_authors)
    taken = set(real_titles)
    author_titles = tuple(t for t in TITLES if t not in taken)
    pools = _pools(author_titles, real_names)
    templates = (AUTHOR_TEMPLATES + EXTRA_TEMPLATES)[: config.n_templates]

    def author(name: str, group: str) -> list[QARecord]:
        attrs = _author_attrs(rng, name, author_titles, config.n_templates > len(AUTHOR_TEMPLATES))
        meta = {"author": name, "split_group": group}
        return [_render(rng, t, attrs, pools, config.n_perturbed, meta) for t in templates]

    per_author = [author(name, "author" if k < config.n_authors else "holdout") for k, name in enumerate(author_names)]

    books = zip(real_names, real_titles, strict=True)
    real = [_real_author(rng, name, book, pools, config.n_perturbed) for name, book in books]

    world = _world_facts(rng, pools, config)

    trained = per_author[: config.n_authors]
    splits = _author_splits(per_author, config)
    splits["real_authors"] = real
    splits["world_facts"] = world
    splits["instructions"] = instructions
    probe = instructions
    if config.probe == "authors":  # drawn last: the other splits are those of the instruction-probe benchmark
        probe, probe_names = _disjoint_author_probe(
            config,
            author,
            lambda n, taken: _names(rng, n, reserved | used, names + taken),
            probe_names,
            [r for recs in trained for r in recs],
            [t[0] for t in templates],
        )
    splits["probe"] = probe
    probe_parts = _parts(probe_names)
    if config.n_background_authors:  # drawn after everything else, which stays as without them
        background_names = _names(rng, config.n_background_authors, reserved | probe_parts, names + probe_names)
        splits["background"] = [r for name in background_names for r in author(name, "background")]
        names = names + background_names
    twins: list[QARecord] = []
    if config.twins:  # a retain twin per forget10 author: the same answers under another name
        twin_names = _names(rng, config.n_twins, reserved | probe_parts, names + probe_names)
        twins = [_twin(r, name) for recs, name in zip(trained[: config.n_twins], twin_names, strict=True) for r in recs]
        for pct in _TIERS:
            splits[f"retain{100 - pct}"] = splits[f"retain{100 - pct}"] + twins
        names = names + twin_names

    qa = [r for recs in per_author for r in recs] + real + world + splits.get("background", []) + twins
    check_probe_disjoint(probe, qa, names)
    check_probe_disjoint(instructions, qa, names)
    return MiniBenchmark(config=config, splits=splits)
