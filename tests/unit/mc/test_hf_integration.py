"""MC and the monitors from a Hugging Face Trainer (margincal.integrations.hf) equal margincal's own polish and
diagnostic; the anchor-table file refuses another tokenizer or template."""

import itertools

import pytest
import torch
from conftest import RECORDS, make_workspace
from transformers import Trainer, TrainingArguments

from margincal.config.settings import LoraSpec, MCConfig, MonitorConfig, TrainConfig
from margincal.data.records import encode_qa
from margincal.integrations.hf import (
    ForgetRetainCollator,
    ForgetRetainDataset,
    monitors_for,
    watch,
    with_mc,
)
from margincal.mc.loss import AnchorTable, answer_span
from margincal.mc.polish import polish, polish_input, polish_pool
from margincal.methods import get_method
from margincal.model.loading import clone_model, merge_lora
from margincal.model.scoring import score_dataset
from margincal.training.loop import attach_lora
from margincal.training.monitors import delta_check
from margincal.training.streams import zip_streams

STEPS = 5


class GradDiffTrainer(Trainer):
    """A user-written unlearning Trainer with open-unlearning's contract: nested forget/retain batches, and a
    ``compute_loss`` without ``num_items_in_batch`` (as written for transformers 4.45). GradDiff: −NLL_f + NLL_r."""

    def compute_loss(self, model, inputs, return_outputs=False):
        def nll(b):
            return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss

        loss = -nll(inputs["forget"]) + nll(inputs["retain"])
        return (loss, None) if return_outputs else loss


class Batches(torch.utils.data.Dataset):
    """Pre-collated batches, served in order one per step (the same stream margincal's polish draws)."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


def anchor_model(model):
    """A frozen anchor that differs from the start model (seeded noise on every weight)."""
    ref = clone_model(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return ref.eval()


LORA = LoraSpec(r=2, alpha=2)


def mc_config(grad_accum: int = 1, lora: LoraSpec | None = LORA) -> MCConfig:
    """Full-parameter runs without weight decay: the Trainer exempts norm weights and biases from it, margincal's
    loop decays every trained parameter (a LoRA trains neither)."""
    decay = 0.01 if lora is not None else 0.0
    train = TrainConfig(steps=STEPS, batch_size=1, lr=5e-3, scheduler="constant", lora=lora, grad_accum=grad_accum,
                        weight_decay=decay)  # fmt: skip
    return MCConfig(train=train, kl_weight=0.3)


# the batches in the order margincal's polish draws them (transformers 5's option; 4.x: see hf_polish)
SEQUENTIAL = (
    {"train_sampling_strategy": "sequential"}
    if "train_sampling_strategy" in TrainingArguments.__dataclass_fields__
    else {}
)


def hf_polish(model, ref, ws, cfg: MCConfig, trainer_class=GradDiffTrainer, tmp_path=None, before=None, **mc):
    """The same polish through a Hugging Face Trainer with the MC mixin, on the batches margincal's polish draws."""
    seed, pad = cfg.train.seed, ws.tokenizer.pad_token_id
    pool = polish_pool(ws.train["forget"], cfg.n_pool, seed)
    splits = {"forget": pool, "retain": ws.train["retain"], "probe": ws.train["probe"]}
    stream = zip_streams(splits, {"forget": 1, "retain": 1, "probe": 1}, pad, seed)
    batches = list(itertools.islice(stream, cfg.train.steps * cfg.train.grad_accum))
    torch.manual_seed(seed)  # margincal's training loop seeds before attaching the LoRA
    peft_model = clone_model(model) if cfg.train.lora is None else attach_lora(clone_model(model), cfg.train.lora)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=cfg.train.steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=cfg.train.grad_accum, learning_rate=cfg.train.lr,
        weight_decay=cfg.train.weight_decay, lr_scheduler_type=cfg.train.scheduler,
        max_grad_norm=cfg.train.max_grad_norm, optim="adamw_torch", remove_unused_columns=False,
        save_strategy="no", report_to=[], use_cpu=True, seed=seed, logging_steps=1, disable_tqdm=True, **SEQUENTIAL,
    )  # fmt: skip
    table = AnchorTable.build(ref, pool, ws.tokenizer, "test")
    trainer = with_mc(trainer_class)(
        model=peft_model, args=args, train_dataset=Batches(batches), data_collator=lambda items: items[0],
        mc_table=table, **({"mc_anchor": ref, "mc_kl_weight": cfg.kl_weight} | mc),
    )  # fmt: skip
    if not SEQUENTIAL:  # transformers 4.x has no sampling option: the Trainer's random sampler is replaced
        trainer._get_train_sampler = lambda *args, **kwargs: torch.utils.data.SequentialSampler(trainer.train_dataset)
    if before is not None:
        before(trainer)
    trainer.train()
    return (trainer.model if cfg.train.lora is None else merge_lora(trainer.model)), trainer


def own_polish(model, ref, ws, cfg: MCConfig):
    method = get_method("GradDiff")
    method.prepare(model, ws.train["forget"], ws.tokenizer)
    pad = ws.tokenizer.pad_token_id
    train = ws.train
    inp = polish_input(method, cfg, {"ref": (ref, "ref")}, train["forget"], train["retain"], train["probe"], pad)
    return polish(clone_model(model), inp)


def step_losses(trainer, grad_accum: int) -> list[float]:
    calls = [row["loss"] for row in trainer.mc_history]
    return [sum(calls[i : i + grad_accum]) / grad_accum for i in range(0, len(calls), grad_accum)]


@pytest.mark.parametrize(("grad_accum", "lora"), [(1, LORA), (2, LORA), (1, None)])
def test_mc_through_a_trainer_equals_margincals_polish(tiny_model, tiny_tokenizer, tmp_path, grad_accum, lora):
    """LoRA and full-parameter, with and without gradient accumulation."""
    ws = make_workspace(tiny_model, tiny_tokenizer)
    ref, cfg = anchor_model(tiny_model), mc_config(grad_accum, lora)
    own, result = own_polish(tiny_model, ref, ws, cfg)
    hf, trainer = hf_polish(tiny_model, ref, ws, cfg, tmp_path=tmp_path)
    assert step_losses(trainer, grad_accum) == pytest.approx([r["loss"] for r in result.history], rel=1e-5)
    if grad_accum == 1:  # every term, step by step: the native loss and the KL probe are both in
        for mine, theirs in zip(trainer.mc_history, result.history, strict=True):
            assert (mine["native"], mine["hinge"], mine["kl"]) == pytest.approx(
                (theirs["native"], theirs["hinge"], theirs["kl"]), abs=1e-5
            )  # absolute: the native GradDiff loss is a difference of two NLLs
    for (name, a), b in zip(own.state_dict().items(), hf.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=2e-5), name  # float32 sums in another order, through AdamW
    check = delta_check(tiny_tokenizer, ws.benchmark, RECORDS, 0.0)
    assert check(hf) == pytest.approx(check(own), abs=1e-4)
    logged = [row for row in trainer.state.log_history if "mc/hinge" in row]
    assert len(logged) == STEPS and {"mc/native", "mc/kl"} <= set(logged[0])


class NoNative(GradDiffTrainer):
    def compute_loss(self, model, inputs, return_outputs=False):
        return torch.zeros((), requires_grad=True)


@pytest.mark.parametrize("broken", ["native dropped", "KL dropped"])
def test_the_equivalence_fails_when_the_mixin_drops_a_term(tiny_model, tiny_tokenizer, tmp_path, broken):
    ws = make_workspace(tiny_model, tiny_tokenizer)
    ref, cfg = anchor_model(tiny_model), mc_config()
    _, result = own_polish(tiny_model, ref, ws, cfg)
    if broken == "native dropped":
        _, trainer = hf_polish(tiny_model, ref, ws, cfg, NoNative, tmp_path)
    else:
        _, trainer = hf_polish(tiny_model, ref, ws, cfg, tmp_path=tmp_path, mc_kl_weight=0.0, mc_anchor=None)
    assert step_losses(trainer, 1) != pytest.approx([r["loss"] for r in result.history], rel=1e-5)


def test_the_mixin_refuses_stripped_columns_and_a_missing_anchor(tiny_model, tiny_tokenizer, tmp_path):
    table = AnchorTable.build(tiny_model, encode_qa(tiny_tokenizer, RECORDS, 64), tiny_tokenizer, "test")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)  # remove_unused_columns=True
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        with_mc(GradDiffTrainer)(model=tiny_model, args=args, mc_table=table, mc_anchor=tiny_model)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, remove_unused_columns=False)
    with pytest.raises(ValueError, match="needs mc_anchor"):
        with_mc(GradDiffTrainer)(model=tiny_model, args=args, mc_table=table)


def test_the_mixins_mc_defaults_are_mcconfigs_and_are_checked(tiny_model, tiny_tokenizer, tmp_path):
    """The mixin states no MC default of its own (each is None, filled from MCConfig), and a value MCConfig refuses
    (κ = 0 would divide by zero in the hinge) stops before the Trainer is built, naming the argument."""
    import inspect

    from margincal.config.settings import MCConfig
    from margincal.integrations.hf import MCMixin, mc_settings

    defaults = inspect.signature(MCMixin.__init__).parameters
    assert [defaults[f"mc_{k}"].default for k in ("kappa", "kl_weight", "token_weights")] == [None, None, None]
    assert mc_settings(None, None, None) == MCConfig()
    assert (mc_settings(2.0, 0.0, "top8").kappa, mc_settings(2.0, 0.0, "top8").token_weights) == (2.0, "top8")
    table = AnchorTable.build(tiny_model, encode_qa(tiny_tokenizer, RECORDS, 64), tiny_tokenizer, "test")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, remove_unused_columns=False)
    for bad, message in ((dict(mc_kappa=0), "mc_kappa must be a positive number, got 0"),
                         (dict(mc_kl_weight=-1.0), "mc_kl_weight must be"),
                         (dict(mc_token_weights="x"), "mc_token_weights must be one of uniform")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^MCMixin: {message}"):
            with_mc(GradDiffTrainer)(model=tiny_model, args=args, mc_table=table, mc_anchor=tiny_model, **bad)


def test_an_anchor_table_file_states_its_tokenizer_and_refuses_another(tiny_model, tiny_tokenizer, tmp_path):
    from margincal.mini.models import train_mini_tokenizer

    examples = encode_qa(tiny_tokenizer, RECORDS, 64)
    table = AnchorTable.build(tiny_model, examples, tiny_tokenizer, "mini", anchor_model="tiny")
    path = table.save(tmp_path / "table.safetensors")
    loaded = AnchorTable.load(path, tiny_tokenizer)
    assert loaded.meta["template"] == "mini" and loaded.meta["anchor_model"] == "tiny"
    stats = score_dataset(tiny_model, examples, tiny_tokenizer.pad_token_id)
    assert torch.equal(loaded.tables["margin"][stats.index], stats.margin)
    assert loaded.tokens[0, : len(examples[0].answer_ids)].tolist() == examples[0].answer_ids
    other = train_mini_tokenizer(["a different corpus entirely"] * 20, 120)
    with pytest.raises(ValueError, match="was made with tokenizer"):
        AnchorTable.load(path, other)
    (tmp_path / "x.safetensors").write_bytes(b"not a table")
    with pytest.raises(Exception, match="not a margincal anchor table|header"):
        AnchorTable.load(tmp_path / "x.safetensors")


def test_a_batch_encoded_another_way_fails_the_token_check(tiny_model, tiny_tokenizer):
    from margincal.data.records import collate
    from margincal.mc.loss import batch_stats

    examples = encode_qa(tiny_tokenizer, RECORDS, 64)
    table = AnchorTable.build(tiny_model, examples, tiny_tokenizer, "mini")
    batch = collate(examples, tiny_tokenizer.pad_token_id)
    table.check(batch_stats(tiny_model, {k: v for k, v in batch.items() if k not in ("answer_start", "answer_len")}))
    other = encode_qa(tiny_tokenizer, [RECORDS[1], RECORDS[0], *RECORDS[2:]], 64)  # another file's record order
    with pytest.raises(ValueError, match="record 0's answer tokens differ"):
        table.check(batch_stats(tiny_model, collate(other, tiny_tokenizer.pad_token_id)))


def test_answer_span_reads_hf_labels():
    labels = torch.tensor([[-100, -100, 5, 6, -100], [-100, 7, 8, 9, 3]])
    start, length = answer_span(labels)
    assert start.tolist() == [2, 1] and length.tolist() == [2, 4]
    with pytest.raises(ValueError, match="contiguous"):
        answer_span(torch.tensor([[-100, 5, -100, 6]]))


def test_the_dataset_and_collator_give_nested_batches(tiny_tokenizer):
    data = ForgetRetainDataset.from_records(tiny_tokenizer, RECORDS[:2], RECORDS[2:], RECORDS, max_length=64, seed=3)
    assert len(data) == 2 and data[1] == data[1]  # draws depend on (seed, index) only
    batch = ForgetRetainCollator(tiny_tokenizer.pad_token_id)([data[0], data[1]])
    assert set(batch) == {"forget", "retain", "probe"} and batch["forget"]["index"].tolist() == [0, 1]
    assert (batch["forget"]["labels"] != -100).sum(1).tolist() == batch["forget"]["answer_len"].tolist()


def test_the_callback_delta_equals_the_diagnostic_and_it_stops_and_selects(tiny_model, tiny_tokenizer, tmp_path):
    from margincal.model.margin import diagnose

    ws = make_workspace(tiny_model, tiny_tokenizer)
    ref, cfg = anchor_model(tiny_model), mc_config()
    examples = encode_qa(tiny_tokenizer, RECORDS, 64)
    m_ref = diagnose(score_dataset(ref, examples, tiny_tokenizer.pad_token_id)).m
    monitors = monitors_for(tiny_tokenizer, RECORDS, RECORDS[:2], RECORDS[2:], m_ref, ref, MonitorConfig(n=8))
    expected = diagnose(score_dataset(tiny_model, examples, tiny_tokenizer.pad_token_id), m_ref).delta
    assert monitors(tiny_model)["delta"] == pytest.approx(expected, abs=1e-6)
    watching = {}

    def attach(trainer):
        watching["callback"] = watch(trainer, monitors, every=2, stop_delta=expected - 1e-3, select="delta")

    _, trainer = hf_polish(tiny_model, ref, ws, cfg, tmp_path=tmp_path, before=attach)
    callback = watching["callback"]
    steps = [row["step"] for row in callback.trace]
    assert steps[0] == 0 and all(s % 2 == 0 or s == trainer.state.global_step for s in steps)
    stopped = [row for row in callback.trace if row.get("stop_reason") == "delta"]
    assert (not stopped) or stopped[-1]["step"] == trainer.state.global_step
    best = min(callback.trace, key=lambda r: (abs(r["delta"]), r["step"]))
    assert callback.selected == best["step"]
    assert any("monitor/delta" in row for row in trainer.state.log_history)


def test_the_mixin_takes_its_table_anchor_and_probe_as_files(tiny_model, tiny_tokenizer, tmp_path):
    """open-unlearning's route: method_args from YAML are strings; batches carry only forget and retain."""
    import json

    from margincal.model.loading import save_model

    examples = encode_qa(tiny_tokenizer, RECORDS, 64)
    ref = anchor_model(tiny_model)
    AnchorTable.build(ref, examples, tiny_tokenizer, "mini").save(tmp_path / "t.safetensors")
    save_model(ref, tiny_tokenizer, tmp_path / "ref")
    (tmp_path / "probe.json").write_text(json.dumps([{"question": r.question, "answer": r.answer} for r in RECORDS]))
    data = ForgetRetainDataset(examples, examples)
    args = TrainingArguments(output_dir=str(tmp_path / "o"), max_steps=2, per_device_train_batch_size=2,
                             remove_unused_columns=False, report_to=[], use_cpu=True, save_strategy="no")  # fmt: skip
    trainer = with_mc(GradDiffTrainer)(
        model=attach_lora(clone_model(tiny_model), LoraSpec(r=2, alpha=2)), args=args, train_dataset=data,
        data_collator=ForgetRetainCollator(tiny_tokenizer.pad_token_id), processing_class=tiny_tokenizer,
        mc_table=str(tmp_path / "t.safetensors"), mc_anchor=str(tmp_path / "ref"),
        mc_probe=str(tmp_path / "probe.json"),
    )  # fmt: skip
    trainer.train()
    assert len(trainer.mc_history) == 2 and all(row["kl"] > 0 for row in trainer.mc_history)
    with pytest.raises(ValueError, match="has no ref_model"):
        with_mc(GradDiffTrainer)(model=tiny_model, args=args, mc_table=str(tmp_path / "t.safetensors"), mc_kl_weight=0,
                                 processing_class=tiny_tokenizer, mc_native_ref=str(tmp_path / "ref"))  # fmt: skip
