"""The model shapes every benchmark script builds, in one table (imported by ``cell_speed.py``, ``eval_speed.py`` and
``gpu/acceptance.py``, which run with this folder on ``sys.path``).

``mini``, ``20m`` and ``100m`` take their vocabulary from the tokenizer a script uses (:data:`MINI_VOCAB` where it has
none); the real bases carry their own: Hugging Face ``config.json`` of meta-llama/Llama-3.2-1B-Instruct, -3B and
Llama-3.1-8B.
"""

MINI_VOCAB = 1024  # the mini tokenizer's size (its BPE target): a shape built without a tokenizer uses it

SHAPES = {
    "mini": dict(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    ),
    "20m": dict(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "100m": dict(
        hidden_size=768,
        intermediate_size=2688,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
        rope_theta=500000.0,
    ),
    "llama-3.2-3b": dict(
        vocab_size=128256,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        tie_word_embeddings=True,
        rope_theta=500000.0,
    ),
    "llama-3.1-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
        rope_theta=500000.0,
    ),
}
