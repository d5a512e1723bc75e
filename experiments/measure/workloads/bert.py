"""BERT workloads from transformers' BertConfig (random init): BERT-base pre-training and a tiny BERT."""
from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig, BertForPreTraining

TINY = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128)

MODELS = {
    "bert-base": lambda: BertForPreTraining(BertConfig()),  # 110 M parameters, the paper's BERT
    "bert-tiny": lambda: BertForPreTraining(BertConfig(**TINY)),
}


def make_batch(model: nn.Module, batch_size: int, image_size: int, seq_len: int, generator: torch.Generator) -> dict:
    """Random token ids with masked-LM and next-sentence labels (image_size is unused here)."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=generator)
    return {
        "input_ids": ids,
        "labels": ids.clone(),
        "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=generator),
    }


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Pre-training loss: masked LM plus next-sentence prediction."""
    return model(**batch).loss
