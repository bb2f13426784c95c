"""A tiny random Llama, built offline in about a second, for tests and first trials.

A byte-level BPE tokenizer trained with the `tokenizers` library on a small built-in
text, a ChatML chat template, and a `LlamaConfig` with hidden size 64 and 2 layers.
Its weights are random: it learns, measurably, but says nothing sensible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from finetune_studio.child.chat_template import CHATML_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """
Fine-tuning adapts a pretrained language model to a task with a small dataset.
LoRA trains two low-rank matrices beside each frozen weight, so only a few
parameters change and the adapter is small enough to share. The learning rate,
the batch size and the number of steps decide how far the weights move.
user assistant system instruction input output question answer
What is the capital of France? The capital of France is Paris.
What is two plus two? Two plus two is four.
Translate hello into Spanish. Hola.
Write a haiku about the sea. Waves fold into foam, the tide keeps its patient time,
salt wind on the stones.
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000
Summarize: the meeting moved to Tuesday because the room was booked.
The meeting is on Tuesday.
"""


TINY_SHAPE: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def build_tiny_model(
    directory: Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    shape: Optional[dict[str, Any]] = None,
    dtype: Optional[str] = None,
) -> Path:
    """Write a random Llama (config, safetensors weights, tokenizer) into directory.

    Tiny by default; `shape` sets other LlamaConfig sizes (the GPU benchmark builds
    a 1B one), and `dtype` ("bfloat16", say) the dtype its weights are saved in.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.model_max_length = 4096
    tokenizer.save_pretrained(directory)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **(shape or TINY_SHAPE),
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    return directory
