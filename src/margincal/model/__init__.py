"""The model layer: loading and saving, the one scoring pass, margins, generation, per-sample gradients, quantized
loads."""
