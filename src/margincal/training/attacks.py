"""Relearn attackers behind one registry, and their evaluation on the held-out forget set.

A relearn attack trains on D_rel ⊂ D_f (|D_rel| = K, drawn with a seed) and is evaluated on the held-out
D_f \\ D_rel (paper Sec. 4.1). Every attacker is ``(model, d_rel, AttackConfig, tokenizer) -> attacked model``,
runs through the shared training loop and leaves its input untouched:

* ``lora``: LoRA (rank ``train.lora.r``) fine-tuning of the answer NLL, merged for evaluation;
* ``fpft``: full-parameter fine-tuning of the answer NLL;
* ``soft_prompt``: ``n_soft`` trainable virtual tokens (peft prompt tuning, started from a real prompt's token
  embeddings), every weight frozen;
* ``adaptive``: LoRA that directly ascends the β-smoothed margin diagnostic m_β at each D_rel answer's
  diagnostic position (positions frozen at the attacked model), the paper's defense-aware attacker;
* ``in_context``: no training; the K D_rel QA pairs are placed before every held-out question (in-context
  relearning);
* ``format_probe``: no training; every forget question asked in K wordings, each record's best answer kept;
* ``linear_probe``: retrains only the unembedding (the linear map from last-layer hidden states to the
  vocabulary, untied from the input embeddings) on D_rel: is the forgotten content still linearly decodable
  from the final representations? Its metric is the same held-out ROUGE-L and margin flips as every attacker.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from margincal.config.settings import ATTACKER_KINDS, AttackConfig
from margincal.core.errors import InputError
from margincal.core.registry import Registry
from margincal.data.records import cycle
from margincal.model.loading import clone_model, merge_lora
from margincal.model.margin import diagnostic_positions, smoothed_margin
from margincal.model.scoring import forward_answer, score_dataset
from margincal.training.loop import nll_objective, train

Attacker = Callable[..., torch.nn.Module]  # (model, d_rel, AttackConfig, tokenizer, hook=None) -> attacked model
ATTACKERS: Registry[Attacker] = Registry("attacker", "attackers")


def register_attacker(name: str):
    """Register an attacker under ``name``, one of :data:`margincal.config.settings.ATTACKER_KINDS` (the list config
    checks presets against, without importing this module)."""
    if name not in ATTACKER_KINDS:
        raise ValueError(f"attacker kind {name!r} is not in margincal.config.settings.ATTACKER_KINDS; add it there")
    return ATTACKERS.register(name)


def get_attacker(name: str) -> Attacker:
    """The attacker registered as ``name``; an unknown name stops with the known ones."""
    return ATTACKERS.lookup(name)


def _fit(model, objective, d_rel, cfg: AttackConfig, tokenizer, desc: str, hook=None, lora: bool = False):
    """Train ``model`` on seeded D_rel batches through the shared loop; LoRA attackers need ``train.lora`` and are
    merged, the others train their own trainable parameters (``train.lora`` ignored). ``hook`` runs at the start and
    after every step (instrumentation)."""
    from dataclasses import replace

    if lora and cfg.train.lora is None:
        raise InputError(f"the {desc} attacker needs attack.train.lora (rank, alpha)")
    stream = cycle(d_rel, min(cfg.train.batch_size, len(d_rel)), tokenizer.pad_token_id, seed=cfg.train.seed)
    tc = cfg.train if lora else replace(cfg.train, lora=None)
    extra = {"hook": hook, "hook_every": 1, "hook_at_start": True} if hook is not None else {}
    attacked, _ = train(model, objective, stream, tc, desc, **extra)
    return merge_lora(attacked) if lora else attacked


@register_attacker("lora")
def lora_relearn(model, d_rel, cfg: AttackConfig, tokenizer, hook=None) -> torch.nn.Module:
    """LoRA fine-tuning (answer NLL) on D_rel for ``cfg.train.steps`` steps, merged for evaluation."""
    return _fit(clone_model(model), nll_objective, d_rel, cfg, tokenizer, "lora", hook, lora=True)


@register_attacker("fpft")
def full_finetune(model, d_rel, cfg: AttackConfig, tokenizer, hook=None) -> torch.nn.Module:
    """Full-parameter fine-tuning (answer NLL) on D_rel; ``train.lora`` is ignored."""
    attacked = clone_model(model)
    for p in attacked.parameters():
        p.requires_grad = True
    return _fit(attacked, nll_objective, d_rel, cfg, tokenizer, "fpft", hook)


class SoftPrompted(torch.nn.Module):
    """A peft prompt-tuning model whose logits drop the virtual-token positions (so answers stay aligned). It has no
    ``generate``: its answers are decoded by :func:`margincal.model.generation.generate_answers` (peft's own
    ``generate`` does not decode greedily under prompt tuning: ``benchmarks/RESULTS.md``, issue 76)."""

    def __init__(self, peft_model: torch.nn.Module, n_virtual: int):
        super().__init__()
        self.peft_model, self.n_virtual = peft_model, n_virtual

    @property
    def config(self):
        return self.peft_model.config

    @property
    def active_peft_config(self):
        """The prompt-tuning config (``models.is_prompt_learning`` reads it: no shared-prompt scoring or static
        generation cache, whose lengths would leave out the virtual tokens)."""
        return self.peft_model.active_peft_config

    def forward(self, **kwargs):
        out = self.peft_model(**kwargs)
        out.logits = out.logits[:, self.n_virtual :]
        return out


# The soft prompt's starting text (peft's TEXT initialisation, Lester et al. 2021: virtual tokens start as the
# embeddings of a real prompt's tokens, repeated or cut to n_soft). Chosen before any soft-prompt card was read
# (issue 41): tokens sampled from the vocabulary made θ0's own held-out answers collapse on the mini.
SOFT_PROMPT_TEXT = "Answer the question about the author."


def text_init_ids(tokenizer, n_virtual: int, text: str = SOFT_PROMPT_TEXT) -> list[int]:
    """The token ids of ``text`` (special tokens as the tokenizer adds them), repeated and cut to ``n_virtual``."""
    ids = tokenizer(text)["input_ids"]
    return (ids * math.ceil(n_virtual / len(ids)))[:n_virtual]


@register_attacker("soft_prompt")
def soft_prompt(model, d_rel, cfg: AttackConfig, tokenizer, hook=None) -> torch.nn.Module:
    """Prompt tuning: ``cfg.n_soft`` virtual-token embeddings, initialised from the embeddings of
    :data:`SOFT_PROMPT_TEXT`'s tokens (:func:`text_init_ids`, as peft's TEXT initialisation), trained on D_rel; the
    model's weights stay frozen."""
    from peft import PromptTuningConfig, PromptTuningInit, TaskType, get_peft_model

    torch.manual_seed(cfg.train.seed)
    spec = PromptTuningConfig(
        task_type=TaskType.CAUSAL_LM, num_virtual_tokens=cfg.n_soft, prompt_tuning_init=PromptTuningInit.RANDOM
    )
    peft_model = get_peft_model(clone_model(model), spec)
    embeddings = peft_model.get_input_embeddings()
    ids = torch.tensor(text_init_ids(tokenizer, cfg.n_soft), device=embeddings.weight.device)
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.copy_(embeddings(ids).float())
    return _fit(SoftPrompted(peft_model, cfg.n_soft), nll_objective, d_rel, cfg, tokenizer, "soft_prompt", hook)


def margin_ascent_objective(positions: dict[int, int], beta: float):
    """−mean m_β at each sample's frozen diagnostic position (the adaptive attacker ascends the diagnostic)."""

    def objective(model, batch):
        logits, targets, _, _ = forward_answer(model, batch)
        rows = torch.arange(logits.size(0), device=logits.device)
        cols = torch.tensor([positions[int(i)] for i in batch["index"]], device=logits.device)
        m_beta = smoothed_margin(logits[rows, cols], targets[rows, cols], beta).mean()
        return -m_beta, {"m_beta": m_beta.item()}

    return objective


@register_attacker("adaptive")
def adaptive(model, d_rel, cfg: AttackConfig, tokenizer, hook=None) -> torch.nn.Module:
    """LoRA ascent of the β-smoothed diagnostic margin on D_rel at positions frozen at the attacked model."""
    stats = score_dataset(model, d_rel, tokenizer.pad_token_id)
    positions = dict(zip(stats.index.tolist(), diagnostic_positions(stats).tolist(), strict=True))
    objective = margin_ascent_objective(positions, cfg.beta)
    return _fit(clone_model(model), objective, d_rel, cfg, tokenizer, "adaptive", hook, lora=True)


@register_attacker("linear_probe")
def linear_probe(model, d_rel, cfg: AttackConfig, tokenizer, hook=None) -> torch.nn.Module:
    """Retrain only the (untied) unembedding on D_rel with the answer NLL; the rest of the model is frozen."""
    attacked = clone_model(model)
    head = attacked.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # untie from the input embeddings
    attacked.config.tie_word_embeddings = False
    for p in attacked.parameters():
        p.requires_grad = False
    head.weight.requires_grad = True
    return _fit(attacked, nll_objective, d_rel, cfg, tokenizer, "linear_probe", hook)


@register_attacker("in_context")
@register_attacker("format_probe")
def unchanged(model, d_rel, cfg: AttackConfig, tokenizer, hook=None) -> torch.nn.Module:
    """The attackers that change no weight: :func:`margincal.pipeline.stages.attack_stage` places the K D_rel QA pairs
    before every held-out question (``in_context``) or asks every forget question in K other wordings and keeps each
    record's worst case (``format_probe``), so the model itself is returned as it is."""
    return model


def margin_flips(before: Sequence[float], after: Sequence[float], rouge: Sequence[float]) -> dict:
    """Held-out samples split by whether the attack turns their diagnostic margin positive.

    ``flipped``: margin ≤ 0 before and > 0 after; ``stayed``: ≤ 0 before and after; ``already``: > 0 before.
    Each group reports its count and mean post-attack ROUGE-L (paper App. "Depth probes ... margin flips").
    """
    groups: dict[str, list[float]] = {"flipped": [], "stayed": [], "already": []}
    for b, a, r in zip(before, after, rouge, strict=True):
        groups["already" if b > 0 else "flipped" if a > 0 else "stayed"].append(r)
    return {name: {"n": len(v), "mean_rouge_l": (sum(v) / len(v)) if v else None} for name, v in groups.items()}


ATTACKERS.freeze()  # every attacker is registered above
