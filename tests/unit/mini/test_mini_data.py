"""Tests of the mini benchmark generator."""

import json
from collections import Counter

import pytest

from margincal.core.errors import InputError
from margincal.data.alpaca import overlapping
from margincal.data.records import QARecord, evaluated_fields
from margincal.data.tofu import load_split, record_from_row
from margincal.mini.data import MiniBenchmark, MiniConfig, check_probe_disjoint, generate

SPLITS = (
    "forget01",
    "forget05",
    "forget10",
    "retain99",
    "retain95",
    "retain90",
    "holdout",
    "real_authors",
    "world_facts",
    "instructions",
    "probe",
)
AUTHOR_SPLITS = ("forget10", "retain90", "holdout")


@pytest.fixture(scope="module")
def bench() -> MiniBenchmark:
    return generate()


def authors(records: list[QARecord]) -> set[str]:
    return {r.meta["author"] for r in records}


def test_split_sizes(bench):
    sizes = {name: len(recs) for name, recs in bench.splits.items()}
    assert sizes == {
        "forget01": 5,
        "forget05": 25,
        "forget10": 50,
        "retain99": 495,
        "retain95": 475,
        "retain90": 450,
        "holdout": 50,
        "real_authors": 20,
        "world_facts": 40,
        "instructions": 200,
        "probe": 200,
    }
    assert tuple(bench.splits) == SPLITS


def test_tier_sizes_round_with_floor_of_one():
    small = generate(MiniConfig(n_authors=20, n_holdout_authors=2, n_probe=20))
    assert [len(authors(small.split(f"forget{p:02d}"))) for p in (1, 5, 10)] == [1, 1, 2]
    assert len(authors(small.split("retain90"))) == 18


def test_forget_tiers_nested_whole_authors_and_complemented(bench):
    trained = authors(bench.split("forget10")) | authors(bench.split("retain90"))
    assert len(trained) == 100
    previous: set[QARecord] = set()
    for pct, n_authors in ((1, 1), (5, 5), (10, 10)):
        forget = bench.split(f"forget{pct:02d}")
        retain = bench.split(f"retain{100 - pct}")
        assert len(authors(forget)) == n_authors
        assert previous < set(forget)
        assert authors(forget).isdisjoint(authors(retain))
        assert authors(forget) | authors(retain) == trained
        assert len(forget) + len(retain) == 500
        for recs in (forget, retain):  # whole authors: 5 records (one per template) per author
            assert all(sum(r.meta["author"] == a for r in recs) == 5 for a in authors(recs))
        previous = set(forget)


def test_holdout_and_real_authors_disjoint_from_trained(bench):
    trained = authors(bench.split("forget10")) | authors(bench.split("retain90"))
    holdout = authors(bench.split("holdout"))
    real = authors(bench.split("real_authors"))
    assert len(holdout) == 10 and len(real) == 20
    assert trained.isdisjoint(holdout) and trained.isdisjoint(real) and holdout.isdisjoint(real)
    assert {r.meta["split_group"] for r in bench.split("retain90")} == {"author"}
    assert {r.meta["split_group"] for r in bench.split("holdout")} == {"holdout"}


def test_author_records_shape(bench):
    for split in AUTHOR_SPLITS:
        for r in bench.split(split):
            assert r.meta["template"] in {"birth", "genre", "parents", "award", "book"}
            assert r.meta["author"] in r.question and r.meta["author"] not in r.answer  # no name copying
            assert 6 <= len(r.question.split()) <= 14
            assert 4 <= len(r.answer.split()) <= 20
    questions = [r.question for s in AUTHOR_SPLITS for r in bench.split(s)]
    assert len(set(questions)) == len(questions)


def test_paraphrase_keeps_facts_and_perturbed_change_them(bench):
    splits = (*AUTHOR_SPLITS, "real_authors", "world_facts")
    for r in (r for s in splits for r in bench.split(s)):
        content = r.meta["content"].values()
        assert r.paraphrased_answer and r.paraphrased_answer != r.answer
        assert all(v in r.answer and v in r.paraphrased_answer for v in content)
        assert len(r.perturbed_answers) == 3
        assert len(set(r.perturbed_answers)) == 3
        for p in r.perturbed_answers:
            assert p not in (r.answer, r.paraphrased_answer)
            assert not any(v in p for v in content)


def test_answer_content_not_readable_from_question(bench):
    splits = (*AUTHOR_SPLITS, "real_authors", "world_facts")
    for r in (r for s in splits for r in bench.split(s)):
        assert not any(v in r.question for v in r.meta["content"].values())
    # attributes are drawn independently of names: the first letter of a name does not determine the city
    city_by_letter: dict[str, set[str]] = {}
    for r in bench.split("retain90"):
        if r.meta["template"] == "birth":
            city_by_letter.setdefault(r.meta["author"][0], set()).add(r.meta["content"]["city"])
    assert any(len(cities) > 1 for cities in city_by_letter.values())


def test_names_unique_and_two_part(bench):
    names = [r.meta["author"] for s in (*AUTHOR_SPLITS, "real_authors") for r in bench.split(s)]
    distinct = set(names)
    assert len(distinct) == 130
    assert all(len(n.split()) == 2 for n in distinct)


def test_probe_disjoint_and_deduplicated(bench):
    probe = bench.split("probe")
    assert len({r.question for r in probe}) == 200
    assert all(r.paraphrased_answer is None and r.perturbed_answers == () for r in probe)
    qa = [r for s in (*AUTHOR_SPLITS, "real_authors", "world_facts") for r in bench.split(s)]
    names = {r.meta["author"] for r in qa if "author" in r.meta}
    check_probe_disjoint(probe, qa, names)


def test_probe_disjoint_rejects_names_and_duplicates(bench):
    qa = bench.split("retain90")
    name = qa[0].meta["author"]
    first, last = name.split()
    ok = [QARecord("What is 1 plus 1?", "1 plus 1 is 2.")]
    check_probe_disjoint(ok, qa, [name])
    for bad in (
        QARecord(f"Tell me about {name}.", "No."),
        QARecord("Who is that?", f"That is {first.lower()}."),
        QARecord(f"Is {last.upper()} here?", "Yes."),
    ):
        with pytest.raises(ValueError, match="probe example 1"):
            check_probe_disjoint([*ok, bad], qa, [name])
    with pytest.raises(ValueError, match="duplicates a QA question"):
        check_probe_disjoint([QARecord(qa[3].question, "x")], qa, [])
    # whole words only: a name part inside a longer word is not a mention
    check_probe_disjoint([QARecord(f"What is {first}x?", "Nothing.")], qa, [name])


def test_determinism_and_seed(bench, tmp_path):
    again = generate()
    assert again.fingerprint() == bench.fingerprint()
    assert len(bench.fingerprint()) == 64
    bench.to_json_dir(tmp_path / "a")
    again.to_json_dir(tmp_path / "b")
    for name in SPLITS:
        assert (tmp_path / "a" / f"{name}.json").read_bytes() == (tmp_path / "b" / f"{name}.json").read_bytes()
    other = generate(MiniConfig(seed=1))
    assert other.fingerprint() != bench.fingerprint()
    assert authors(other.split("forget10")) != authors(bench.split("forget10"))


def test_generation_uses_no_global_rng(bench):
    import random

    random.seed(123)
    state = random.getstate()
    generate()
    assert random.getstate() == state


def test_to_json_dir_tofu_fields(bench, tmp_path):
    bench.to_json_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{s}.json" for s in SPLITS)
    for name in SPLITS:
        rows = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
        assert len(rows) == len(bench.split(name))
        fields = {"question", "answer", "paraphrased_answer", "perturbed_answer"}
        assert all(set(row) - {"facts"} == fields for row in rows)
        first = bench.split(name)[0]
        facts = {"facts": first.meta["content"]} if first.meta.get("content") else {}
        assert rows[0] == {
            "question": first.question,
            "answer": first.answer,
            "paraphrased_answer": first.paraphrased_answer,
            "perturbed_answer": list(first.perturbed_answers),
            **facts,
        }
        # read back: every field an evaluation reads survives (the facts feed fact recall)
        read = load_split(str(tmp_path), name)
        assert [evaluated_fields(r) for r in read] == [evaluated_fields(r) for r in bench.split(name)]
    assert "facts" in json.loads((tmp_path / "forget10.json").read_text(encoding="utf-8"))[0]
    bench.to_json_dir(tmp_path)  # overwriting in place works and leaves no temporary files
    assert len(list(tmp_path.iterdir())) == len(SPLITS)


def test_unknown_split_raises(bench):
    with pytest.raises(ValueError, match="forget10"):
        bench.split("forget20")


def test_config_validation():
    with pytest.raises(ValueError, match="n_perturbed"):
        MiniConfig(n_perturbed=0)
    with pytest.raises(ValueError, match="n_real_authors"):
        MiniConfig(n_real_authors=3)
    with pytest.raises(ValueError, match="n_world_facts"):
        MiniConfig(n_world_facts=1000)


def test_tofu_like_scale_and_author_probe():
    cfg = MiniConfig(n_authors=40, n_holdout_authors=2, n_templates=10, probe="authors", n_probe=30)
    bench = generate(cfg)
    assert len(bench.split("forget10")) == 4 * 10 and len(bench.split("probe")) == 30
    probe = bench.split("probe")  # 3 records per template, none sharing an 8-gram with D_f ∪ D_r (more authors drawn)
    per_template = Counter(r.meta["template"] for r in probe)
    assert len(per_template) == 10 and set(per_template.values()) == {3} and len(authors(probe)) > cfg.n_probe_authors
    assert overlapping(probe, bench.split("forget10") + bench.split("retain90")) == []
    assert bench.split("instructions") == generate(MiniConfig(n_authors=40, n_holdout_authors=2, n_probe=30)).split(
        "instructions"
    )
    templates = {r.meta["template"] for r in bench.split("forget10")}
    assert len(templates) == 10 and {"education", "debut", "home", "hobby", "tongue"} <= templates
    parts = {p for r in bench.split("forget10") + bench.split("retain90") for p in r.meta["author"].split()}
    assert not parts & {p for r in bench.split("probe") for p in r.meta["author"].split()}
    for rec in bench.split("forget10"):  # every content value is stated in the answer (fact recall's gold)
        assert all(v in rec.answer for v in rec.meta["content"].values())


def test_background_authors_leave_every_other_split_as_it_was():
    kw = dict(n_authors=40, n_holdout_authors=2, n_templates=10, probe="authors", n_probe=30)
    plain, bench = generate(MiniConfig(**kw)), generate(MiniConfig(**kw, n_background_authors=5))
    assert "background" not in plain.splits and all(bench.splits[k] == v for k, v in plain.splits.items())
    background = bench.split("background")
    assert len(background) == 50 and {r.meta["split_group"] for r in background} == {"background"}
    names = authors(background)
    others = {r.meta["author"] for s in plain.splits.values() for r in s if "author" in r.meta}
    assert len(names) == 5 and not names & others
    probe_parts = {p for r in bench.split("probe") for p in r.meta["author"].split()}
    assert not {p for n in names for p in n.split()} & probe_parts
    with pytest.raises(ValueError, match="n_background_authors"):
        MiniConfig(n_background_authors=-1)


def test_twins_repeat_every_forget10_answer_under_a_new_retain_name():
    kw = dict(n_authors=40, n_holdout_authors=2, n_templates=5, n_background_authors=3)
    plain, bench = generate(MiniConfig(**kw)), generate(MiniConfig(**kw, twins=True))
    forget = bench.split("forget10")
    assert MiniConfig(**kw).n_twins == 4 and len(forget) == 20
    for tier in ("retain99", "retain95", "retain90"):  # the twins are appended; every other record is as it was
        assert bench.split(tier)[: len(plain.split(tier))] == plain.split(tier)
        twins = bench.split(tier)[len(plain.split(tier)) :]
        assert [(t.answer, t.paraphrased_answer, t.meta["twin_of"]) for t in twins] == [
            (f.answer, f.paraphrased_answer, f.meta["author"]) for f in forget
        ]
    assert all(bench.splits[k] == v for k, v in plain.splits.items() if not k.startswith("retain"))
    twin_names = authors(twins)
    assert len(twin_names) == 4 and not twin_names & {
        r.meta["author"] for s in plain.splits.values() for r in s if "author" in r.meta
    }
    assert all(
        t.question == f.question.replace(f.meta["author"], t.meta["author"]) for t, f in zip(twins, forget, strict=True)
    )


@pytest.mark.parametrize("kwargs", [{"n_templates": 7}, {"probe": "alpaca"}])
def test_scale_settings_are_checked(kwargs):
    with pytest.raises(ValueError, match="n_templates|probe"):
        MiniConfig(**kwargs)


@pytest.mark.parametrize("facts", [["Corvenna"], {}, {"city": 3}, {"city": ""}, {"city": None}, "Corvenna"])
def test_a_row_with_bad_facts_stops_naming_the_field(facts):
    row = {"question": "q", "answer": "a", "facts": facts}
    with pytest.raises(ValueError, match="'facts' must map attribute names to non-empty strings"):
        record_from_row(row, "x.json row 0")


def test_names_take_the_extra_heads_only_when_the_first_pools_are_used_up():
    """A benchmark whose other authors use every part of the first pools (the GPU testbed: 400 + 40 + 20 names) gets
    its probe authors from the extra heads instead of drawing forever; one the first pools can name draws as before
    (the shipped sets' fingerprint holds that); none left is one line."""
    import random

    from margincal.mini import data as d

    firsts = {(h + t).lower() for h in d.FIRST_HEADS for t in d.FIRST_TAILS}
    lasts = {(h + t).lower() for h in d.LAST_HEADS for t in d.LAST_TAILS}
    names = d._names(random.Random(0), 5, firsts | lasts)
    assert len(set(names)) == 5
    assert all(
        n.split()[0].startswith(d.EXTRA_FIRST_HEADS) and n.split()[1].startswith(d.EXTRA_LAST_HEADS) for n in names
    )
    assert d._names(random.Random(0), 5, set()) == d._names(random.Random(0), 5, set(), taken=["Nobody Here"])
    extra = {(h + t).lower() for h in d.EXTRA_FIRST_HEADS for t in d.FIRST_TAILS}
    with pytest.raises(InputError, match="cannot name 5 more authors"):
        d._names(random.Random(0), 5, firsts | lasts | extra)
