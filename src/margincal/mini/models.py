"""The mini benchmark's models, built as store stages through the shared training loop.

* ``mini-tokenizer``: byte-level BPE trained on the generated corpus (``tokenizers``), wrapped as a
  ``PreTrainedTokenizerFast`` with a chat template;
* ``mini-base`` = random ``LlamaForCausalLM`` → general knowledge (real-author and world-fact analogues) + the
  instruction families (+ the background authors, where the benchmark has them);
* ``mini-theta0`` = base → all trained authors (forget ∪ retain) + replay of the general data;
* ``mini-ref`` = base → the retain authors of one tier + the same replay (the retain-only oracle θ_ref).

Each stage is a :class:`~margincal.store.stage_store.Store` entry keyed by its settings, the keys of its inputs and
:data:`BUILD_VERSION` (the version of what the build makes), so the models are content-addressed like every other
stage: an interrupted build resumes at the first missing stage, and a model retrained with other settings gets a new
key instead of overwriting the old one. The tokenizer, θ0 and θ_ref of the settings in
:data:`margincal.mini.shipped.SETS` (the demo's, the tests' smoke sizes) ship with margincal as finished entries
(:data:`SHIPPED`): a store that lacks them copies them under the same keys instead of training (every CPU then
starts from the same mini weights); any other setting builds its own. After building, the models go through the
same loading code as a hub model (``save_pretrained``, safetensors).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from margincal.config.settings import DEFAULT_DEVICE, TrainConfig
from margincal.config.typed import AT_LEAST_1, ConfigError, check_fields
from margincal.core.artifacts import config_key
from margincal.core.errors import InputError
from margincal.core.inputs import read_json
from margincal.data.benchmarks import retain_split
from margincal.data.records import CHOICE_LETTERS, QARecord, cycle, encode_qa
from margincal.evaluation.wmdp import encode_choices
from margincal.mini.data import MiniBenchmark, MiniConfig, generate
from margincal.model.loading import load_model, load_tokenizer, save_model, save_tokenizer
from margincal.store.stage_store import Store
from margincal.training.loop import nll_objective, train

log = logging.getLogger(__name__)

GENERAL_SPLITS = ("real_authors", "world_facts", "instructions")
CHOICE_GENERAL = ("real_authors", "world_facts")  # general splits with perturbed answers: four-choice renderable


def choice_splits(tier: str) -> dict[str, tuple[str, ...]]:
    """The multiple-choice analogue: per fine-tuning stage, the splits it also trains on as four-choice questions
    (``<split>_choices``): its own authors' and the general knowledge both models keep."""
    return {
        STAGES[2]: ("forget10", "retain90", *CHOICE_GENERAL),
        STAGES[3]: (retain_split(tier), *CHOICE_GENERAL),
    }


STAGES = ("mini-tokenizer", "mini-base", "mini-theta0", "mini-ref")

MINI_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|> {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|> {{ message['content'] }}<|eot|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MINI_SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eot|>", "<|user|>", "<|assistant|>"]


@dataclass(frozen=True)
class MiniArch:
    """Shape of the mini Llama (a few hundred thousand to a few million parameters)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    max_position_embeddings: int = 128

    def __post_init__(self) -> None:
        check_fields(
            self,
            vocab_size=AT_LEAST_1,
            hidden_size=AT_LEAST_1,
            intermediate_size=AT_LEAST_1,
            num_layers=AT_LEAST_1,
            num_heads=AT_LEAST_1,
            max_position_embeddings=AT_LEAST_1,
        )
        if self.hidden_size % (2 * self.num_heads):  # rotary embeddings rotate pairs of each head's dimensions
            what = f"must be a multiple of 2 × num_heads = {2 * self.num_heads} (an even head size)"
            raise ConfigError("hidden_size", f"{what}, got {self.hidden_size}")


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` with ``special_tokens`` first in the vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def train_mini_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE trained on ``texts``, wrapped as ``PreTrainedTokenizerFast`` with a chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(texts, vocab_size, MINI_SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eot|>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    fast.chat_template = MINI_CHAT_TEMPLATE
    return fast


def new_mini_model(arch: MiniArch, tokenizer, seed: int) -> torch.nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` of the mini shape (tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_heads,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@dataclass
class MiniModelConfig:
    """Everything that determines the mini models (it enters their store keys)."""

    data: MiniConfig = dataclasses.field(default_factory=MiniConfig)
    arch: MiniArch = dataclasses.field(default_factory=MiniArch)
    max_length: int = 96
    base: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=300, batch_size=32, lr=3e-3, weight_decay=0.0, warmup_ratio=0.05, scheduler="cosine"
        )
    )
    finetune: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(
            steps=600, batch_size=32, lr=3e-3, weight_decay=0.0, warmup_ratio=0.05, scheduler="cosine"
        )
    )
    # the multiple-choice analogue (mini-mc): θ0 and θ_ref are also fine-tuned on their QA records and the general
    # splits rendered as four-choice questions (MiniBenchmark.split's <split>_choices) in lm-eval's zero-shot format
    choices: bool = False

    def __post_init__(self) -> None:
        positions = self.arch.max_position_embeddings
        check_fields(
            self, max_length=(lambda v: 1 <= v <= positions, f"in [1, arch.max_position_embeddings = {positions}]")
        )


# The version of what the build makes. It enters every mini model's store key in place of the code version the
# other stages use, so that the models shipped with margincal (SHIPPED, margincal.mini.shipped) keep their keys
# across refactors of the code around the build. Raise it whenever the build would make other models from the same
# settings: tests/unit/mini/test_mini_shipped.py compares a tiny build with the fingerprint the shipped set recorded,
# and `python -m margincal.mini.shipped` rebuilds the shipped models.
BUILD_VERSION = 1
SHIPPED = Path(__file__).with_name("shipped")  # finished store entries of the shipped settings (package data)
SHIPPED_MANIFEST = "shipped.json"  # under SHIPPED: the build version, fingerprint, sets and every file's SHA-256


def shipped_digests(source: Path, stage: str, key: str) -> dict[str, str]:
    """The SHA-256 of every file of the shipped entry ``stage/key`` under ``source``, as its manifest records them:
    a copy of margincal whose shipped weights changed (one flipped byte) is refused when adopted. A manifest without
    them is refused too (:func:`margincal.mini.shipped.rebuild` writes them)."""
    manifest = read_json(source / SHIPPED_MANIFEST) if (source / SHIPPED_MANIFEST).is_file() else {}
    digests = manifest.get("digests", {}).get(f"{stage}/{key}") if isinstance(manifest, dict) else None
    if not isinstance(digests, dict):
        raise InputError(f"{source / SHIPPED_MANIFEST} records no digests of {stage}/{key}: reinstall margincal")
    return digests


def stage_keys(cfg: MiniModelConfig, tier: str) -> dict[str, str]:
    """Stage → store key of the models of ``tier``, from configuration alone (no model is built): the settings,
    the keys of the stage's inputs and :data:`BUILD_VERSION`."""
    retain_split(tier)  # an unknown tier stops here
    asdict, build = dataclasses.asdict, BUILD_VERSION
    mc = {"choices": True} if cfg.choices else {}  # the multiple-choice analogue's models are other models
    tokenizer = config_key(
        STAGES[0],
        {"data": asdict(cfg.data), "vocab_size": cfg.arch.vocab_size, "max_length": cfg.max_length, "build": build}
        | mc,
    )
    base = config_key(STAGES[1], {"arch": asdict(cfg.arch), "train": asdict(cfg.base), "build": build}, (tokenizer,))
    theta0 = config_key(STAGES[2], {"train": asdict(cfg.finetune), "build": build, **mc}, (base,))
    ref = config_key(STAGES[3], {"tier": tier, "train": asdict(cfg.finetune), "build": build, **mc}, (base,))
    return dict(zip(STAGES, (tokenizer, base, theta0, ref), strict=True))


@dataclass(frozen=True)
class MiniModels:
    """Directories of one tier's mini models (tokenizer, θ0, θ_ref)."""

    tokenizer: Path
    theta0: Path
    ref: Path


def model_keys(cfg: MiniModelConfig, tier: str) -> dict[str, str]:
    """:func:`stage_keys` of what a tier's models are used as: the tokenizer, θ0 and θ_ref (the base model is only
    built to build them)."""
    return {stage: key for stage, key in stage_keys(cfg, tier).items() if stage != STAGES[1]}


def built(cfg: MiniModelConfig, tier: str, store: Store) -> bool:
    """Whether θ0 and θ_ref of ``tier`` (and their tokenizer) are in ``store``."""
    return all(store.done(stage, key) for stage, key in model_keys(cfg, tier).items())


def shipped(cfg: MiniModelConfig, tier: str, source: Path = SHIPPED) -> bool:
    """Whether θ0 and θ_ref of ``tier`` (and their tokenizer) are among the shipped entries under ``source``."""
    return all((source / stage / key).is_dir() for stage, key in model_keys(cfg, tier).items())


def build_mini_models(
    cfg: MiniModelConfig,
    tier: str,
    store: Store,
    bench: MiniBenchmark | None = None,
    source: Path | None = SHIPPED,
    device: str = DEFAULT_DEVICE,
) -> MiniModels:
    """The tokenizer, θ0 and θ_ref(tier) in ``store``: each one missing there is copied from the shipped entries
    under ``source`` when they hold its key (None: never), else built (the base model too, then) by fp32 training
    on ``device``; return their directories. The device is not in the key: a GPU build of the same settings is
    the same recipe with other rounding (a store holds the models of the machine that built them)."""
    bench = bench or generate(cfg.data)
    if bench.config != cfg.data:
        raise ValueError("the benchmark was generated with a different MiniConfig than the model config")
    keys = stage_keys(cfg, tier)
    settings = {"mini": dataclasses.asdict(cfg), "tier": tier}

    def stage(name: str, build) -> Path:  # a damaged entry is copied or built again, never handed out
        if source is not None and (source / name / keys[name]).is_dir():
            return store.adopt(name, keys[name], source / name / keys[name], shipped_digests(source, name, keys[name]))
        return store.run(name, keys[name], settings, build, verify=True)

    def tokenizer_stage(tmp: Path) -> dict:
        tok = train_mini_tokenizer(_corpus_texts(bench, cfg.choices), cfg.arch.vocab_size)
        tok.model_max_length = cfg.max_length
        save_tokenizer(tok, tmp / "tokenizer")
        return {"vocab_size": len(tok)}

    tok_dir = stage(STAGES[0], tokenizer_stage) / "tokenizer"
    tokenizer = load_tokenizer(tok_dir)
    general = [r for name in GENERAL_SPLITS for r in bench.split(name)]

    @functools.cache
    def base() -> Path:  # only when θ0 or θ_ref is built here
        def base_stage(tmp: Path) -> dict:
            model = new_mini_model(cfg.arch, tokenizer, seed=cfg.base.seed).to(device)
            background = bench.splits.get("background", [])
            return _train(model, tokenizer, general + background, cfg, cfg.base, "mini base", tmp)

        return store.run(STAGES[1], keys[STAGES[1]], settings, base_stage) / "model"

    authors = bench.split("forget10") + bench.split("retain90")
    retain = bench.split(retain_split(tier))
    finetunes = {STAGES[2]: (authors, "mini θ0"), STAGES[3]: (retain, f"mini θ_ref {tier}")}
    out = {}
    for name, (records, desc) in finetunes.items():
        names = choice_splits(tier)[name] if cfg.choices else ()
        choices = [r for split in names for r in bench.split(f"{split}_choices")]

        def finetune_stage(tmp: Path, records=records, desc=desc, choices=choices) -> dict:
            model = load_model(base(), device=device)
            return _train(model, tokenizer, records + general, cfg, cfg.finetune, desc, tmp, choices)

        out[name] = stage(name, finetune_stage) / "model"
    return MiniModels(tok_dir, out[STAGES[2]], out[STAGES[3]])


def _corpus_texts(bench: MiniBenchmark, choices: bool = False) -> list[str]:
    """The tokenizer's training texts: every record's question and answers (and, for the multiple-choice analogue,
    every four-choice question with each letter after it)."""
    texts = []
    for records in bench.splits.values():
        for r in records:
            texts += [r.question, r.answer, r.paraphrased_answer or "", *r.perturbed_answers]
    if choices:  # every split a tier's models could train on as four-choice questions
        names = [n for n, rs in bench.splits.items() if rs and all(r.paraphrased_answer for r in rs)]
        texts += [f"{r.question} {c}" for n in names for r in bench.split(f"{n}_choices") for c in CHOICE_LETTERS]
    return [" " + t for t in texts if t]  # leading space: words tokenize as they appear after the prompt


def _train(
    model,
    tokenizer,
    records: list[QARecord],
    cfg: MiniModelConfig,
    tc: TrainConfig,
    desc: str,
    tmp: Path,
    choices: list[QARecord] = (),
):
    """Train ``model`` on ``records`` (NLL of the answers) and on four-choice ``choices`` (NLL of the correct letter
    after lm-eval's zero-shot prompt, encoded as the WMDP evaluator scores it) and save it under ``tmp/model``."""
    log.info("training %s: %d steps on %d examples", desc, tc.steps, len(records) + len(choices))
    examples = encode_qa(tokenizer, records, cfg.max_length)
    if choices:
        for i, example in enumerate(encode_choices(tokenizer, choices, "", cfg.max_length), start=len(examples)):
            examples.append(dataclasses.replace(example, index=i, choices=None))  # the letter's NLL over the vocabulary
    stream = cycle(examples, tc.batch_size, tokenizer.pad_token_id, seed=tc.seed)
    model, result = train(model, nll_objective, stream, tc, desc=desc)
    save_model(model, tokenizer, tmp / "model")
    return {"steps": tc.steps, "examples": len(examples), "final_nll": result.last("nll"), "seconds": result.seconds}
