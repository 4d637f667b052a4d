"""Make a tiny Mixtral-style MoE model with random weights (fixed seed) and a byte-level BPE tokenizer
trained here, so a real vLLM server can serve it on CPU without downloading anything.

Runs in the vLLM venv (`.venv-vllm/bin/python tests/vllm/make_tiny_model.py OUT_DIR`), 6-10 s.
Sizes matter: vLLM's CPU attention supports head_dim 32 (not 16), and a size left out falls back to
the 7B default, so every one is given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512
CORPUS = [
    "Elastic expert parallelism changes the data-parallel size of a mixture-of-experts deployment.",
    "The coordinator prepares new groups while the old configuration serves, then switches.",
    "Hello world. The quick brown fox jumps over the lazy dog. 0123456789",
    "Canary requests measure the downtime that clients see while an engine scales.",
]


def make(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 8, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)

    torch.manual_seed(SEED)
    config = MixtralConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = MixtralForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    (out / "epctl-tiny-model.json").write_text(json.dumps({"seed": SEED, "vocab_size": VOCAB_SIZE}))


if __name__ == "__main__":
    make(Path(sys.argv[1]))
