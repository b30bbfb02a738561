"""``margincal audit``: will an unlearned checkpoint relearn? A robustness card for any checkpoint.

:mod:`~margincal.auditing.plan` resolves the inputs once into an audit plan (checkpoints by content digest or pinned
hub revision, the budget's attacks and quantizers, the floor θ_ref and ceiling θ0); :mod:`~margincal.auditing.prepare`
checks every input before the first forward pass and resolves the plan and its workspace, whose nodes run through
the same stage functions, runner and store as a panel's; :mod:`~margincal.auditing.card` reads the
stored results into ``card.json`` / ``card.md`` and figures; :mod:`~margincal.auditing.population` ranks many
checkpoints and tests pre-attack signals (Δ among them) as predictors of the recovered fraction;
:mod:`~margincal.auditing.interop` reads and writes open-unlearning's evaluation logs.
"""
