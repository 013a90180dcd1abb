"""The tiny models of SGLang's rehearsal, built offline in seconds (no hub, no network).

    python make_tiny_models.py OUT
    OUT/target   4 layers, hidden 128, bf16: the model served (SGLang's CPU kernels take bf16),
                 and its own STANDALONE draft: a drafter that agrees with it (acceptance > 1)
    OUT/eagle3   an EAGLE-3 drafter for `target` (LlamaForCausalLMEagle3), random weights:
                 the architecture a trained one has, acceptance near 1

The tokenizer and the Llama builder are the vLLM fixture's (scripts/vllm_cpu/), so prompts
mean the same to both engines. Four layers, not two: an EAGLE-3 drafter reads three of the
target's hidden states, taken (sglang/srt/models/llama.py set_eagle3_layers_to_capture) at
the inputs of layers `id + 1` for the ids in its `eagle_aux_hidden_state_layer_ids`; layer 0's
input has no residual yet, so ids 0, 1, 2 need layers 1, 2, 3.

The output layer is drawn 10x wider than the vLLM fixture's (std 2.0): logits far apart, so
greedy choices do not flip between SGLang's decode and extend kernels, whose bf16 sums differ
(measured: with std 0.2, SGLang's AMX decode and its extend path chose different tokens from
the first decode step on, and the target drafting for itself had 2 of 87 drafts accepted).
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vllm_cpu"))

import torch  # noqa: E402
from make_tiny_models import llama, tokenizer  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HIDDEN, HEADS, KV_HEADS, LAYERS = 128, 4, 2, 4
AUX_LAYERS = [0, 1, 2]


def save_bf16(model, tok, path: str) -> None:
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    print(f"saved {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")


def eagle3(target_config, path: str, seed: int) -> None:
    """One decoder layer whose attention reads [embedding, fc(3 target states)] (2x hidden),
    with the weight names of the published EAGLE-3 checkpoints (`midlayer.*`, `fc`, `d2t`)."""
    g = torch.Generator().manual_seed(seed)
    vocab, head_dim = target_config.vocab_size, HIDDEN // HEADS

    def w(*shape: int, std: float = 0.08) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    ones = torch.ones(HIDDEN, dtype=torch.bfloat16)
    tensors = {
        "fc.weight": w(HIDDEN, HIDDEN * len(AUX_LAYERS)),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "midlayer.self_attn.q_proj.weight": w(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w(KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w(KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
        "midlayer.mlp.gate_proj.weight": w(2 * HIDDEN, HIDDEN),
        "midlayer.mlp.up_proj.weight": w(2 * HIDDEN, HIDDEN),
        "midlayer.mlp.down_proj.weight": w(HIDDEN, 2 * HIDDEN),
        "norm.weight": ones.clone(),
        "lm_head.weight": w(vocab, HIDDEN, std=0.2),
        "d2t": torch.zeros(vocab, dtype=torch.int64),  # draft id + d2t = target id: the same
        "t2d": torch.ones(vocab, dtype=torch.bool),
    }
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target_config.rms_norm_eps,
        "max_position_embeddings": target_config.max_position_embeddings,
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "target_hidden_size": HIDDEN,
        "tie_word_embeddings": False,
        "bos_token_id": target_config.bos_token_id,
        "eos_token_id": target_config.eos_token_id,
        "pad_token_id": target_config.pad_token_id,
        "rope_theta": 10000.0,
        "dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_LAYERS},
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(f"saved {path}: EAGLE-3 drafter, aux layers {AUX_LAYERS}")


def main(out: str) -> None:
    tok = tokenizer()
    target = llama(tok, layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, seed=11)
    with torch.no_grad():
        target.lm_head.weight.normal_(0.0, 2.0, generator=torch.Generator().manual_seed(13))
    save_bf16(target, tok, os.path.join(out, "target"))
    eagle3(target.config, os.path.join(out, "eagle3"), seed=12)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-models")
