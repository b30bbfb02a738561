"""MC from your own Hugging Face Trainer: unlearn with a user-written NPO Trainer, polish it with MC, watch Δ.

    margincal mini export runs/mini-data        # the mini benchmark's θ0, θ_ref and TOFU-format split files
    python examples/hf_trainer_mc.py --data runs/mini-data --out runs/hf-example

``--theta0`` / ``--ref`` take any causal LM (HF id or directory) and ``--data`` a directory of TOFU-format files
(``<tier>.json``, ``retain<100-pct>.json``, ``probe.json``, ``holdout.json``, ``real_authors.json`` and
``world_facts.json`` as the utility records); after ``mini export`` the directory names its models. On a 2-core
CPU the mini run takes a few minutes. The defaults are margincal's mini-scale NPO (configs/methods/npo.yaml) and MC
(configs/mc.yaml); at real scale pass the paper's (``--unlearn-lr 1e-5 --polish-lr 1e-4``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import Trainer, TrainingArguments

from margincal.data.templates import template_of
from margincal.data.tofu import load_qa_json
from margincal.integrations.hf import ForgetRetainCollator, ForgetRetainDataset, monitors_for, watch, with_mc
from margincal.mc.loss import AnchorTable
from margincal.model.loading import load_model, load_tokenizer
from margincal.model.margin import diagnose
from margincal.model.scoring import score_dataset


class NPOTrainer(Trainer):
    """NPO (Zhang et al. 2024) as open-unlearning writes it: −(2/β) E_f[log σ(−β (log p_θ(y|x) − log p_ref(y|x)))]
    on the forget batch (summed answer log-likelihoods) plus the retain NLL."""

    def __init__(self, *args, ref_model, beta: float = 0.1, alpha: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.ref_model, self.beta, self.alpha = ref_model.eval().requires_grad_(False), beta, alpha

    @staticmethod
    def loglik(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        labels = batch["labels"][:, 1:]
        nll = F.cross_entropy(logits.transpose(1, 2).float(), labels, ignore_index=-100, reduction="none")
        return -nll.sum(1)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        forget, retain = inputs["forget"], inputs["retain"]
        with torch.no_grad():
            ref = self.loglik(self.ref_model, forget)
        npo = -2 / self.beta * F.logsigmoid(-self.beta * (self.loglik(model, forget) - ref)).mean()
        r = retain
        retain_nll = model(input_ids=r["input_ids"], attention_mask=r["attention_mask"], labels=r["labels"]).loss
        loss = npo + self.alpha * retain_nll
        return (loss, None) if return_outputs else loss


def arguments(out: Path, steps: int, lr: float, batch: int, **extra) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out), max_steps=steps, learning_rate=lr, per_device_train_batch_size=batch,
        remove_unused_columns=False, save_strategy="no", report_to=[], logging_steps=10, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(), seed=0, **extra,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="directory of TOFU-format split files (mini export)")
    parser.add_argument("--theta0", help="the model to unlearn (default: the data directory's mini.json)")
    parser.add_argument("--ref", help="the retain-only reference θ_ref (default: the data directory's mini.json)")
    parser.add_argument("--tier", default="forget10")
    parser.add_argument("--unlearn-steps", type=int, default=60)
    parser.add_argument("--unlearn-lr", type=float, default=1e-4)
    parser.add_argument("--polish-steps", type=int, default=80)
    parser.add_argument("--polish-lr", type=float, default=2e-3)
    parser.add_argument("--every", type=int, default=10, help="monitor every N polish steps")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    data, out = Path(args.data), Path(args.out)
    mini = json.loads((data / "mini.json").read_text()) if (data / "mini.json").exists() else {}
    theta0, ref_path = args.theta0 or mini["theta0"], args.ref or mini["ref"]
    pct = int(args.tier.removeprefix("forget"))
    split = {name: load_qa_json(data / f"{name}.json") for name in (args.tier, "probe", "holdout")}
    forget, probe, holdout = split[args.tier], split["probe"], split["holdout"]
    retain = load_qa_json(data / f"retain{100 - pct}.json")
    utility = load_qa_json(data / "real_authors.json") + load_qa_json(data / "world_facts.json")

    tokenizer = load_tokenizer(theta0)
    model, ref = load_model(theta0), load_model(ref_path).eval()
    examples = ForgetRetainDataset.from_records(tokenizer, forget, retain, probe)
    collator = ForgetRetainCollator(tokenizer.pad_token_id)

    # 1. unlearn: the user's own NPO Trainer (full-parameter)
    trainer = NPOTrainer(model=model, args=arguments(out / "unlearn", args.unlearn_steps, args.unlearn_lr, 8,
                                                      warmup_steps=args.unlearn_steps // 10, weight_decay=0.01),
                         train_dataset=examples, data_collator=collator, ref_model=ref)  # fmt: skip
    trainer.train()

    # 2. the margin diagnostic: θ_ref's m(D_f), and the anchor table (what `margincal anchors` writes)
    encoded = examples.streams["forget"]
    m_ref = diagnose(score_dataset(ref, encoded, tokenizer.pad_token_id)).m
    before = diagnose(score_dataset(model, encoded, tokenizer.pad_token_id), m_ref)
    table = AnchorTable.build(ref, encoded, tokenizer, template_of(tokenizer).name, anchor_model=ref_path)

    # 3. MC: the same NPO Trainer with the mixin, a LoRA polish, monitors on held-out records
    lora = LoraConfig(r=32, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    polish_args = arguments(out / "polish", args.polish_steps, args.polish_lr, 1, lr_scheduler_type="constant")
    polisher = with_mc(NPOTrainer)(model=get_peft_model(model, lora), args=polish_args, train_dataset=examples,
                                   data_collator=collator, ref_model=ref, mc_table=table, mc_anchor=ref)  # fmt: skip
    monitors = monitors_for(tokenizer, forget, holdout, utility, m_ref, reference=ref)
    callback = watch(polisher, monitors, every=args.every, stop_delta=0.0, select="delta")
    polisher.train()

    polished = polisher.model.merge_and_unload()
    after = diagnose(score_dataset(polished, encoded, tokenizer.pad_token_id), m_ref)
    if not polisher.is_world_process_zero():  # under torchrun / accelerate launch, one process writes
        return
    table.save(out / "anchors.safetensors")
    polished.save_pretrained(out / "model")  # safetensors
    tokenizer.save_pretrained(out / "model")
    summary = {"m_ref": m_ref, "delta_unlearned": before.delta, "delta_polished": after.delta,
               "released_step": callback.selected, "processes": polisher.args.world_size,
               "trace": callback.trace}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"Δ on D_f: unlearned {before.delta:+.3f} → MC {after.delta:+.3f} (released step {callback.selected}; "
          f"m_ref {m_ref:+.3f}); written to {out}")  # fmt: skip


if __name__ == "__main__":
    main()
