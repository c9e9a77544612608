"""A tiny Llama-style causal LM and a character-level tokenizer, built in code (no downloads).

``char_tokenizer`` returns a ``transformers`` fast tokenizer over a fixed character set (one token per
character, plus ``<pad>``/``<bos>``/``<eos>``/``<unk>``), saved by ``save_pretrained`` as a plain
``tokenizer.json`` so ``AutoTokenizer.from_pretrained(dir)`` loads it like any other tokenizer.
``tiny_llama`` returns a randomly initialized ``LlamaForCausalLM`` (``nn.Linear`` projections, so LoRA
and per-user adapter gradients apply unchanged). ``scripts/build_tiny_lm.py`` trains it by supervised
fine-tuning on public data and saves it in the ``save_pretrained`` layout that ``policy.path`` loads.
"""
from __future__ import annotations

SPECIAL = ("<pad>", "<bos>", "<eos>", "<unk>")


def char_tokenizer(chars: str):
    """A character-level ``PreTrainedTokenizerFast`` (left padding, so batched generation lines up)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(list(SPECIAL) + sorted(set(chars)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def tiny_llama(tokenizer, *, hidden: int = 64, layers: int = 2, heads: int = 4, intermediate: int = 256,
               context: int = 32):
    """A small ``LlamaForCausalLM`` for ``tokenizer`` (about 133k parameters at the defaults).

    Initialization uses torch's global generator: seed it first (the caller's seed must matter).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=context, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    return LlamaForCausalLM(config)
