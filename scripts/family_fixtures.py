"""Small random checkpoints of the model families arcpy's loaders are gaining, each in Hugging Face
safetensors and in GGUF, with transformers' float32 logits as the golden output.

    python scripts/family_fixtures.py tests/data/families            # build, then check
    python scripts/family_fixtures.py tests/data/families --check    # check what is there

For each family (FAMILIES below) it writes OUTDIR/<family>/:
- config.json, model.safetensors: a tiny model of the family's transformers class, random weights
  (fixed seed) stored as bf16, tensor names as transformers has them;
- tokenizer.json, tokenizer_config.json (and tokenizer.model for gemma3): a tiny vocabulary of the
  family's kind (byte-level BPE, or SentencePiece with byte fallback for gemma3) with its special
  tokens and a chat template in the family's turn format;
- model.gguf: the same weights under llama.cpp's architecture name, metadata keys and tensor
  names, transformed as llama.cpp's convert_hf_to_gguf.py does for the family (Q/K rows permuted
  for llama's interleaved RoPE on the llama-type archs, Gemma's norms stored with +1, Phi-3's
  fused attn_qkv and gate+up ffn_up kept fused, rope factor tensors); norms and other 1-D tensors
  F32, matrices BF16 (bit-exact to the safetensors); model-q8_0.gguf: the same with every matrix
  in Q8_0 (as convert_hf_to_gguf.py --outtype q8_0 writes it);
- golden.npz: tokens (int32: n_prompt random ids, then the 64 ids transformers picks greedily in
  float32), n_prompt, logits (float32 (n_prompt + 64, vocab): one forward over the whole sequence,
  the bf16 weights upcast to float32), margin (top-1 minus top-2 at each position);
- golden-q8_0.npz: the same tokens, logits and margins with model-q8_0.gguf's weights dequantized;
- gemma3 only, golden-gguf.npz and golden-gguf-q8_0.npz: the goldens of llama.cpp's reading of its
  GGUF, which has no query_pre_attn_scalar (see gguf_attention_scale_note in build_family);
- golden.json: the versions used and every configuration fact a loader needs, plus how far the
  logits move when each of the family's features is switched off (so each one is shown active).

The checks: the safetensors hold the model's weights; every GGUF tensor, read back with
gguf.GGUFReader and its transform undone, equals the safetensors tensor (Q8_0: within half a
quantization step); the GGUF metadata says what the config says; the goldens recompute; the
tokenizers load; and, for the archs transformers can load from GGUF (qwen3, gemma3, phi3),
transformers' models from the GGUF files give the golden logits.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import shutil
import struct
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")     # everything here is local
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gguf
import safetensors
import tokenizers
import transformers
from safetensors.torch import load_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

N_GEN = 64          # greedy tokens after the prompt
VOCAB = 288         # every fixture's vocabulary size (its tokenizer's size)
MIN_MARGIN = 0.05   # least top-1/top-2 logit margin of every greedy step (see golden_run)
MAX_ATTEMPTS = 500

# ---------------------------------------------------------------------------------------------
# families

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
PHI_TEMPLATE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
MISTRAL_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
                    "{{ '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
                    "{% elif message['role'] == 'user' %}{{ '[INST]' + message['content'] + '[/INST]' }}"
                    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
GEMMA_TEMPLATE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
                  "{% set first = messages[0]['content'] + '\\n\\n' %}{% set loop_messages = messages[1:] %}"
                  "{% else %}{% set first = '' %}{% set loop_messages = messages %}{% endif %}"
                  "{% for message in loop_messages %}"
                  "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
                  "{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + (message['content'] | trim)"
                  " + '<end_of_turn>\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")

# the pre-tokenizer regexes of tokenizer.json for llama.cpp's tokenizer.ggml.pre names
# (llama.cpp's llama-vocab.cpp quotes each as "original regex from tokenizer.json")
PRE_REGEX = {
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "tekken": (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "gpt-4o": (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|"
        r"'t|'re|'ve|'m|'ll|'d)?|"
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|"
        r"'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|"
        r"\s+"
    ),
}

# Each family: the transformers class and config, llama.cpp's arch, the tokenizer, the prompt.
# tok["specials"]: (text, role) in id order; "first" puts them before the 256 byte tokens (ids 0..),
# otherwise they take the last ids. Roles name the ids config.json and tokenizer_config.json give.
def _qwen3_config(rope_parameters: dict) -> dict:
    """The two Qwen3 fixtures' config, which differ in their RoPE alone."""
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6,
                rope_parameters=rope_parameters, tie_word_embeddings=False, attention_bias=False,
                use_sliding_window=False)


def _qwen3_tok() -> dict:
    return dict(kind="bpe", pre="qwen2", cls="Qwen2Tokenizer", template=CHATML, add_bos=False,
                specials=[("<|endoftext|>", "bos pad"), ("<|im_start|>", ""), ("<|im_end|>", "eos")])


FAMILIES = {
    "qwen3": dict(
        hf_class="Qwen3ForCausalLM", config_class="Qwen3Config", arch="QWEN3", seed=1001, q_gain=3.0, n_prompt=32,
        config=_qwen3_config({"rope_type": "default", "rope_theta": 1000000.0}), tok=_qwen3_tok(),
        about="Qwen3: QK-norm (q_norm/k_norm over each head), head_dim 32 != hidden/heads 16, GQA 4:2, "
              "untied output, NEOX RoPE theta 1e6"),
    "qwen3-yarn": dict(
        hf_class="Qwen3ForCausalLM", config_class="Qwen3Config", arch="QWEN3", seed=1002, q_gain=3.0, n_prompt=80,
        config=_qwen3_config({"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                              "original_max_position_embeddings": 64}), tok=_qwen3_tok(),
        about="Qwen3 as above with YaRN RoPE scaling (factor 4, original context 64; the prompt alone is "
              "80 tokens)"),
    "gemma3": dict(
        hf_class="Gemma3ForCausalLM", config_class="Gemma3TextConfig", arch="GEMMA3", seed=1003, q_gain=2.0,
        n_prompt=40,
        config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=12, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                    sliding_window=16,
                    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(12)],
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                    query_pre_attn_scalar=32, final_logit_softcapping=None, attn_logit_softcapping=None,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False),
        tok=dict(kind="spm", cls="GemmaTokenizer", template=GEMMA_TEMPLATE, add_bos=True,
                 specials=[("<pad>", "pad"), ("<eos>", "eos"), ("<bos>", "bos"), ("<unk>", "unk"), ("<mask>", "mask"),
                           ("<start_of_turn>", ""), ("<end_of_turn>", "")]),
        about="Gemma 3 text: 12 layers, sliding window 16 on layers 0-4 and 6-10, global layers 5 and 11; "
              "local RoPE theta 1e4, global theta 1e6 with linear scaling 8; query_pre_attn_scalar 32 "
              "!= head_dim 16; GQA 4:2; QK-norm; post-attention and post-FFN norms; "
              "GELU-tanh; embeddings scaled by sqrt(hidden); tied; no logit softcapping (as Gemma-3-4B)"),
    "phi3": dict(
        hf_class="Phi3ForCausalLM", config_class="Phi3Config", arch="PHI3", seed=1004, q_gain=2.0, n_prompt=72,
        config=dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=64,
                    rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                     "short_factor": [1.0, 1.0, 1.02, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8],
                                     "long_factor": [1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0],
                                     "original_max_position_embeddings": 64}),
        tok=dict(kind="bpe", pre="gpt-4o", cls="GPT2Tokenizer", template=PHI_TEMPLATE, add_bos=False,
                 specials=[("<|endoftext|>", "bos eos pad"), ("<|system|>", ""), ("<|user|>", ""),
                           ("<|assistant|>", ""), ("<|end|>", "")]),
        about="Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, partial rotary 0.75 (24 of 32 dims, NEOX), "
              "LongRoPE with short/long factors (original context 64, max 256), GQA 4:2, tied"),
    "smollm3": dict(
        hf_class="SmolLM3ForCausalLM", config_class="SmolLM3Config", arch="SMOLLM3", seed=1005, q_gain=1.5,
        n_prompt=32,
        config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
                    no_rope_layer_interval=4, use_sliding_window=False, tie_word_embeddings=True,
                    attention_bias=False, mlp_bias=False),
        tok=dict(kind="bpe", pre="llama-bpe", cls="PreTrainedTokenizerFast", template=CHATML, add_bos=False,
                 specials=[("<|begin_of_text|>", "bos"), ("<|end_of_text|>", "pad"), ("<|im_start|>", ""),
                           ("<|im_end|>", "eos")]),
        about="SmolLM3: 8 layers, no RoPE on every 4th (layers 3 and 7), GQA 4:2, llama RoPE theta 5e6, tied"),
    "mistral3": dict(
        hf_class="MistralForCausalLM", config_class="MistralConfig", arch="MISTRAL3", seed=1006, q_gain=3.0, n_prompt=32,
        config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0},
                    sliding_window=None, tie_word_embeddings=False),
        tok=dict(kind="bpe", pre="tekken", cls="PreTrainedTokenizerFast", template=MISTRAL_TEMPLATE, add_bos=True,
                 first=True,
                 specials=[("<unk>", "unk"), ("<s>", "bos"), ("</s>", "eos"), ("[INST]", ""), ("[/INST]", ""),
                           ("[SYSTEM_PROMPT]", ""), ("[/SYSTEM_PROMPT]", "")]),
        about="Mistral Small 3.x text model: head_dim 32 != hidden/heads 16, GQA 4:2, llama RoPE theta 1e9, "
              "untied; GGUF arch mistral3 as convert_hf_to_gguf.py writes Mistral3ForConditionalGeneration"),
}

# llama.cpp archs whose RoPE is llama's interleaved kind (LLAMA_ROPE_TYPE_NORM): convert_hf_to_gguf.py
# permutes the rows of q_proj/k_proj for them (LlamaModel.permute); NEOX archs keep them as they are.
PERMUTE_QK = {"SMOLLM3", "MISTRAL3"}

TRAIN_TEXT = (
    "the quick brown fox jumps over the lazy dog. then the dog sleeps in the sun and the fox runs "
    "into the woods. there is a small house near the river where an old man lives with his cat. "
    "every morning he walks to the market, buys bread and tea, and talks with the people there. "
    "in the evening the wind comes in from the sea and the lights of the town turn on one by one."
)

# ---------------------------------------------------------------------------------------------
# tokenizers


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def train_merges(words: list[list[str]], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE on the symbol lists `words`: the most frequent adjacent pair each round, ties to
    the smallest pair; deterministic."""
    words = [list(w) for w in words]
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        counts: dict[tuple[str, str], int] = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                else:
                    i += 1
    return merges


def build_bpe_vocab(tok: dict) -> dict:
    """Byte-level BPE: 256 byte tokens, merges learned from TRAIN_TEXT, the specials; VOCAB in all."""
    b2u = bytes_to_unicode()
    specials = [s for s, _ in tok["specials"]]
    n_merges = VOCAB - 256 - len(specials)
    words = [[b2u[b] for b in w.encode()] for w in re.findall(r" ?[a-z]+| ?[^\sa-z]+|\s+", TRAIN_TEXT)]
    merges = train_merges(words, n_merges)
    assert len(merges) == n_merges, "training text too short for the vocabulary"
    regular = [b2u[b] for b in range(256)] + [a + b for a, b in merges]
    assert len(set(regular)) == len(regular)
    tokens = (specials + regular) if tok.get("first") else (regular + specials)
    return dict(tokens=tokens, merges=merges, specials=specials)


def build_spm_vocab(tok: dict) -> dict:
    """SentencePiece BPE with byte fallback, Gemma's layout: the specials, <0x00>..<0xFF>, then
    pieces ('\u2581' for a space) learned from TRAIN_TEXT; VOCAB in all."""
    specials = [s for s, _ in tok["specials"]]
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    text = TRAIN_TEXT.replace(" ", "\u2581")
    chars = sorted(set(text), key=lambda c: (-text.count(c), c))
    n_free = VOCAB - len(specials) - 256
    base = [c for c in chars if c == "\u2581" or c.isalpha()][:20]
    words = []
    for w in re.findall("\u2581?[^\u2581]+|\u2581", text):
        if all(c in base for c in w):
            words.append(list(w))
    merges = train_merges(words, n_free - len(base))
    assert len(merges) == n_free - len(base)
    normal = base + [a + b for a, b in merges]
    assert len(set(normal)) == len(normal)
    return dict(tokens=specials + byte_pieces + normal, merges=merges, specials=specials,
                n_fixed=len(specials) + 256, base=base)


SPM_NORMAL, SPM_UNKNOWN, SPM_CONTROL, SPM_USER_DEFINED, SPM_UNUSED, SPM_BYTE = 1, 2, 3, 4, 5, 6


def spm_piece_types(voc: dict, tok: dict) -> tuple[list[int], list[float]]:
    types, scores = [], []
    roles = dict(tok["specials"])
    for i, t in enumerate(voc["tokens"]):
        if i < len(voc["specials"]):
            types.append(SPM_UNKNOWN if "unk" in roles[t].split() else
                         SPM_CONTROL if roles[t] else SPM_USER_DEFINED)
            scores.append(0.0)
        elif i < voc["n_fixed"]:
            types.append(SPM_BYTE)
            scores.append(0.0)
        else:
            types.append(SPM_NORMAL)
            scores.append(-float(i - voc["n_fixed"]))
    return types, scores


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb_int(field: int, v: int) -> bytes:
    return _varint(field << 3) + _varint(v)


def _pb_bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _pb_float(field: int, f: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", f)


def spm_model_proto(voc: dict, tok: dict) -> bytes:
    """sentencepiece's ModelProto (sentencepiece_model.proto) written field by field: pieces (1),
    trainer_spec (2: model_type BPE, vocab_size, byte_fallback, unk/bos/eos/pad ids and pieces), normalizer_spec
    (3: identity, no dummy prefix, spaces kept and escaped to U+2581), as Gemma's tokenizer.model."""
    types, scores = spm_piece_types(voc, tok)
    ids = special_ids(voc, tok)
    out = b""
    for t, ty, sc in zip(voc["tokens"], types, scores):
        out += _pb_bytes(1, _pb_bytes(1, t.encode()) + _pb_float(2, sc) + _pb_int(3, ty))
    trainer = (_pb_int(3, 2) + _pb_int(4, len(voc["tokens"])) + _pb_int(35, 1) + _pb_int(40, ids["unk"]) +
               _pb_int(41, ids["bos"]) + _pb_int(42, ids["eos"]) + _pb_int(43, ids["pad"]) +
               b"".join(_pb_bytes(f, voc["tokens"][ids[r]].encode())
                        for f, r in ((45, "unk"), (46, "bos"), (47, "eos"), (48, "pad"))))
    normalizer = _pb_bytes(1, b"identity") + _pb_int(3, 0) + _pb_int(4, 0) + _pb_int(5, 1)
    return out + _pb_bytes(2, trainer) + _pb_bytes(3, normalizer)


def special_ids(voc: dict, tok: dict) -> dict[str, int]:
    ids = {}
    for text, roles in tok["specials"]:
        for r in roles.split():
            ids[r] = voc["tokens"].index(text)
    return ids


def write_tokenizer(fam: dict, voc: dict, d: Path) -> None:
    tok = fam["tok"]
    ids = special_ids(voc, tok)
    vocab = {t: i for i, t in enumerate(voc["tokens"])}
    if tok["kind"] == "bpe":
        t = Tokenizer(models.BPE(vocab=vocab, merges=voc["merges"], ignore_merges=False))
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_REGEX[tok["pre"]]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        t.decoder = decoders.ByteLevel()
    else:
        # all splits of each merged piece into two pieces, in the merged piece's rank order (what
        # transformers' SentencePiece converter derives from a BPE tokenizer.model)
        rank = {p: i for i, p in enumerate(voc["tokens"])}
        merges = []
        for p in voc["tokens"][voc["n_fixed"]:]:
            splits = [(p[:k], p[k:]) for k in range(1, len(p)) if p[:k] in rank and p[k:] in rank]
            merges += sorted(splits, key=lambda s: (rank[s[0]], rank[s[1]]))
        t = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        t.normalizer = normalizers.Replace(" ", "\u2581")
        t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    if tok["add_bos"]:
        bos = voc["tokens"][ids["bos"]]
        t.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B:1",
                                                         special_tokens=[(bos, ids["bos"])])
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in voc["specials"]])
    t.save(str(d / "tokenizer.json"))

    cfg = {"tokenizer_class": tok["cls"], "model_max_length": fam["config"]["max_position_embeddings"],
           "add_bos_token": tok["add_bos"], "add_eos_token": False, "clean_up_tokenization_spaces": False}
    for role in ("bos", "eos", "unk", "pad") + (("mask",) if "mask" in ids else ()):
        cfg[f"{role}_token"] = voc["tokens"][ids[role]] if role in ids else None
    cfg["chat_template"] = tok["template"]
    cfg["added_tokens_decoder"] = {
        str(vocab[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for s in voc["specials"]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    if tok["kind"] == "spm":
        (d / "tokenizer.model").write_bytes(spm_model_proto(voc, tok))


# ---------------------------------------------------------------------------------------------
# models


def make_config(fam: dict, voc: dict):
    ids = special_ids(voc, fam["tok"])
    kw = copy.deepcopy(fam["config"])
    kw.update(vocab_size=VOCAB, bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"))
    cfg = getattr(transformers, fam["config_class"])(**kw)
    cfg.architectures = [fam["hf_class"]]
    return cfg


def random_weights(model: torch.nn.Module, seed: int, zero_centered_norms: bool, tied: bool, q_gain: float,
                   q_rows: int) -> None:
    """Every parameter drawn anew (fixed seed), then rounded to bf16. Matrices N(0, 1/fan_in); norm
    weights 1 + N(0, 0.1^2), as Gemma's zero-centred ones store them (w such that 1 + w is that).
    Untied embeddings and output N(0, 0.5^2). Tied embeddings N(0, 0.1^2) with the final norm's
    weights 5 (1 + N(0, 0.1^2)) instead: the logits keep their spread while the input embedding stays
    small beside what the layers add (a large tied embedding makes the model repeat a token). The
    queries are scaled by q_gain (q_norm's weights, or q_proj's rows, or qkv_proj's first q_rows
    rows), so that attention is sharp: soft attention averages the positions together, and a random
    model then says the same thing everywhere and the positional features hardly matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
                if tied and name == "model.norm.weight":
                    w = 5.0 * w
                if name.endswith("self_attn.q_norm.weight"):
                    w = q_gain * w
                if zero_centered_norms:
                    w = w - 1.0
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                w = (0.1 if tied else 0.5) * torch.randn(p.shape, generator=g)
            else:
                w = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1])
                if name.endswith("self_attn.q_proj.weight"):
                    w = q_gain * w
                if name.endswith("self_attn.qkv_proj.weight"):
                    w[:q_rows] *= q_gain
            p.copy_(w.to(torch.bfloat16).to(torch.float32))


def build_model(fam: dict, cfg):
    model = new_model(fam, cfg)
    has_qk_norm = fam["arch"] in ("QWEN3", "GEMMA3")
    assert has_qk_norm == any(n.endswith("q_norm.weight") for n, _ in model.named_parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    random_weights(model, fam["seed"], zero_centered_norms=fam["arch"] == "GEMMA3", tied=cfg.tie_word_embeddings,
                   q_gain=fam["q_gain"], q_rows=cfg.num_attention_heads * head_dim)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def forward_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long)[None], use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


def greedy(model, prompt: list[int], min_margin: float) -> list[int] | None:
    """The prompt and N_GEN greedy ids (a full forward over the sequence so far each step); None as
    soon as a step's top-1 leads its top-2 by less than min_margin."""
    seq = list(prompt)
    for _ in range(N_GEN):
        last = forward_logits(model, np.array(seq))[-1]
        top2 = np.sort(last)[-2:]
        if top2[1] - top2[0] < min_margin:
            return None
        seq.append(int(np.argmax(last)))
    return seq


def prompt_range(fam: dict, voc: dict) -> tuple[int, int]:
    """Prompt ids are drawn from [lo, hi): every id but the special tokens."""
    if fam["tok"].get("first") or fam["tok"]["kind"] == "spm":
        return len(voc["specials"]), VOCAB
    return 0, VOCAB - len(voc["specials"])


def golden_run(models: list, fam: dict, voc: dict) -> tuple[int, list[dict]]:
    """The golden sequences and logits, one for each of `models` (the same weights; gemma3 has a
    second model, llama.cpp's reading of its GGUF). The prompt, shared: n_prompt ids drawn with
    numpy's default_rng([seed, attempt]) for attempt 0, 1, ..., the first for which every model's
    64 greedy steps all have a top-1/top-2 margin of at least MIN_MARGIN (so that the greedy ids
    do not hang on rounding). Returns the attempt's number and the goldens."""
    lo, hi = prompt_range(fam, voc)
    n = fam["n_prompt"]
    for attempt in range(MAX_ATTEMPTS):
        prompt = [int(x) for x in np.random.default_rng([fam["seed"], attempt]).integers(lo, hi, size=n)]
        out = []
        for model in models:
            seq = greedy(model, prompt, MIN_MARGIN)
            if seq is None:
                break
            tokens = np.array(seq, dtype=np.int32)
            lm = logits_and_margin(model, tokens)
            if not np.array_equal(np.argmax(lm["logits"][n - 1:-1], axis=1), tokens[n:]) or \
                    lm["margin"][n - 1:-1].min() < MIN_MARGIN:
                break       # the one forward disagrees with the steps (not above the margin, in practice)
            out.append(dict(tokens=tokens, n_prompt=np.int32(n), **lm))
        if len(out) == len(models):
            return attempt, out
    raise RuntimeError(f"no prompt in {MAX_ATTEMPTS} attempts has every greedy margin >= {MIN_MARGIN}")


def ablations(fam: dict, cfg, model, tokens: np.ndarray, logits: np.ndarray) -> dict:
    """How much the logits move when one feature of the family is switched off (same weights):
    max |logit difference| and the positions whose top-1 changes. Nothing here enters the golden."""
    out = {}
    sd = model.state_dict()

    def with_config(**changes):
        c = copy.deepcopy(cfg)
        for k, v in changes.items():
            setattr(c, k, v)
        return new_model(fam, c, sd)

    def record(key, m):
        l2 = forward_logits(m, tokens)
        out[key] = {"max_abs_logit_diff": round(float(np.abs(l2 - logits).max()), 4),
                    "top1_changes": int((np.argmax(l2, 1) != np.argmax(logits, 1)).sum())}

    arch = fam["arch"]
    if arch in ("QWEN3", "GEMMA3"):
        m = copy.deepcopy(model)
        for layer in m.model.layers:
            layer.self_attn.q_norm = torch.nn.Identity()
            layer.self_attn.k_norm = torch.nn.Identity()
        record("without_qk_norm", m)
    if fam["config"].get("rope_parameters", {}).get("rope_type") == "yarn":
        rp = dict(cfg.rope_parameters)
        rp = {"rope_type": "default", "rope_theta": rp["rope_theta"]}
        record("without_yarn", with_config(rope_parameters=rp))
    if arch == "GEMMA3":
        record("without_sliding_window", with_config(sliding_window=100000))
        rp = copy.deepcopy(cfg.rope_parameters)
        rp["sliding_attention"]["rope_theta"] = rp["full_attention"]["rope_theta"]
        record("local_rope_theta_as_global", with_config(rope_parameters=rp))
        rp = copy.deepcopy(cfg.rope_parameters)
        rp["full_attention"] = {"rope_type": "default", "rope_theta": rp["full_attention"]["rope_theta"]}
        record("without_global_linear_scaling", with_config(rope_parameters=rp))
        record("query_pre_attn_scalar_as_head_dim", with_config(query_pre_attn_scalar=cfg.head_dim))
        m = copy.deepcopy(model)
        for layer in m.model.layers:
            layer.post_attention_layernorm = torch.nn.Identity()
            layer.post_feedforward_layernorm = torch.nn.Identity()
        record("without_post_norms", m)
        m = copy.deepcopy(model)
        m.model.embed_tokens.embed_scale.fill_(1.0)
        record("without_embed_scale", m)
    if arch == "PHI3":
        rp = copy.deepcopy(cfg.rope_parameters)
        rp["long_factor"] = list(rp["short_factor"])
        record("short_factors_instead_of_long", with_config(rope_parameters=rp))
    if arch == "SMOLLM3":
        record("rope_on_every_layer", with_config(no_rope_layers=[1] * cfg.num_hidden_layers))
    if arch in ("MISTRAL3", "SMOLLM3", "QWEN3", "PHI3"):
        rp = copy.deepcopy(cfg.rope_parameters)
        rp["rope_theta"] = 10000.0 if rp["rope_theta"] != 10000.0 else 500000.0
        record(f"rope_theta_{rp['rope_theta']:g}", with_config(rope_parameters=rp))
    return out


# ---------------------------------------------------------------------------------------------
# GGUF, as llama.cpp's convert_hf_to_gguf.py writes it


def permute_qk(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half row order -> llama's interleaved."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(fam: dict, hf: dict, d: Path) -> list[tuple[str, torch.Tensor]]:
    """(GGUF name, float32 tensor) in the GGUF's order, from the safetensors `hf`."""
    arch = getattr(gguf.MODEL_ARCH, fam["arch"])
    n_layer = hf["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, n_layer)
    sd = {k: v.to(torch.float32) for k, v in load_file(str(d / "model.safetensors")).items()}
    out = []
    if fam["arch"] == "PHI3":       # Phi3MiniModel.generate_extra_tensors
        rp = hf["rope_parameters"]
        rope_dims = int(rp.get("partial_rotary_factor", 1.0) * hf["hidden_size"]) // hf["num_attention_heads"]
        assert len(rp["long_factor"]) == len(rp["short_factor"]) == rope_dims // 2
        out.append((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight",
                    torch.tensor(rp["long_factor"], dtype=torch.float32)))
        out.append((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight",
                    torch.tensor(rp["short_factor"], dtype=torch.float32)))

    def order(k):
        m = re.match(r"model\.layers\.(\d+)\.", k)
        return (0 if "embed_tokens" in k else 1 if m else 2 if k.startswith("model.norm") else 3,
                int(m.group(1)) if m else 0, k)

    for k in sorted(sd, key=order):
        t = sd[k]
        if fam["arch"] in PERMUTE_QK:
            if k.endswith("q_proj.weight"):
                t = permute_qk(t, hf["num_attention_heads"], hf["num_attention_heads"])
            elif k.endswith("k_proj.weight"):
                t = permute_qk(t, hf["num_attention_heads"], hf["num_key_value_heads"])
        if fam["arch"] == "GEMMA3" and k.endswith("norm.weight"):
            t = t + 1.0     # Gemma3RMSNorm computes x * (1 + w); llama.cpp's norm multiplies by w
        new = names.get_name(k, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"no GGUF name for {k}")
        out.append((new, t))
    return out


def tensor_qtype(name: str, t: torch.Tensor, matrix_type) -> "gguf.GGMLQuantizationType":
    """convert_hf_to_gguf.py's choice: 1-D tensors and *_norm.weight F32, matrices the file type."""
    if t.ndim <= 1 or name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    return matrix_type


def write_vocab(w: "gguf.GGUFWriter", fam: dict, voc: dict, d: Path) -> None:
    tok = fam["tok"]
    if tok["kind"] == "bpe":        # TextModel._set_vocab_gpt2 (get_vocab_base) and SpecialVocab
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(tok["pre"])
        w.add_token_list(voc["tokens"])
        w.add_token_types([gguf.TokenType.CONTROL if t in voc["specials"] else gguf.TokenType.NORMAL
                           for t in voc["tokens"]])
        gguf.SpecialVocab(d, load_merges=True).add_to_gguf(w)
    else:                           # TextModel._set_vocab_sentencepiece (_create_vocab_sentencepiece)
        types, scores = spm_piece_types(voc, tok)
        for i, t in enumerate(voc["tokens"]):
            if t in voc["specials"]:  # tokenizer_config.json's added_tokens_decoder, all special
                types[i], scores[i] = SPM_CONTROL, -1000.0
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list([t.encode() for t in voc["tokens"]])
        w.add_token_scores(scores)
        w.add_token_types(types)
        gguf.SpecialVocab(d, n_vocab=len(voc["tokens"])).add_to_gguf(w)
        w.add_add_space_prefix(False)   # Gemma3Model.set_vocab


def write_params(w: "gguf.GGUFWriter", fam: dict, hf: dict) -> None:
    """The hyperparameter keys, as the family's class in convert_hf_to_gguf.py writes them."""
    arch = fam["arch"]
    rp = hf.get("rope_parameters") or {}
    if arch == "PHI3":              # Phi3MiniModel.set_gguf_parameters (no TextModel part)
        n_embd, n_head = hf["hidden_size"], hf["num_attention_heads"]
        w.add_context_length(hf["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(hf["intermediate_size"])
        w.add_block_count(hf["num_hidden_layers"])
        w.add_head_count(n_head)
        w.add_head_count_kv(hf["num_key_value_heads"])
        w.add_layer_norm_rms_eps(hf["rms_norm_eps"])
        w.add_rope_dimension_count(int(rp.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
        w.add_rope_freq_base(rp["rope_theta"])
        w.add_sliding_window(hf.get("sliding_window") or 0)
        scale = hf["max_position_embeddings"] / rp["original_max_position_embeddings"]
        attn = math.sqrt(1 + math.log(scale) / math.log(rp["original_max_position_embeddings"])) if scale > 1 else 1.0
        w.add_rope_scaling_attn_factors(attn)
        return
    # TextModel.set_gguf_parameters
    w.add_block_count(hf["num_hidden_layers"])
    w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(hf["hidden_size"])
    w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(hf["num_attention_heads"])
    w.add_head_count_kv(hf["num_key_value_heads"])
    full = rp.get("full_attention", rp)
    if full.get("rope_type") == "linear" and full.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    elif full.get("rope_type") == "yarn" and full.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(full["factor"])
        w.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        if full.get("extrapolation_factor") is not None:
            w.add_rope_scaling_yarn_ext_factor(full["extrapolation_factor"])
        if full.get("attention_factor", full.get("attn_factor")) is not None:
            w.add_rope_scaling_yarn_attn_factor(full.get("attention_factor", full.get("attn_factor")))
        if full.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(full["beta_fast"])
        if full.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(full["beta_slow"])
    else:
        assert full.get("rope_type") in (None, "default"), full
    if full.get("rope_theta") is not None:
        w.add_rope_freq_base(full["rope_theta"])
    if rp.get("sliding_attention", {}).get("rope_theta") is not None:
        w.add_rope_freq_base_swa(rp["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    if hf.get("head_dim") is not None:
        w.add_key_length(hf["head_dim"])
        w.add_value_length(hf["head_dim"])
    if arch in ("SMOLLM3", "MISTRAL3"):     # LlamaModel.set_gguf_parameters
        w.add_vocab_size(hf["vocab_size"])
        w.add_rope_dimension_count(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
    if arch == "GEMMA3":                    # Gemma3Model.set_gguf_parameters
        assert hf.get("attn_logit_softcapping") is None
        if hf.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hf["final_logit_softcapping"])
        if hf.get("sliding_window_pattern") != 1:
            w.add_sliding_window(hf["sliding_window"])


def write_gguf(fam: dict, voc: dict, d: Path, path: Path, q8: bool) -> None:
    hf = json.loads((d / "config.json").read_text())
    arch = getattr(gguf.MODEL_ARCH, fam["arch"])
    matrix = gguf.GGMLQuantizationType.Q8_0 if q8 else gguf.GGMLQuantizationType.BF16
    ftype = gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_BF16
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("arcpy test fixture")  # no family name: llama.cpp keys Phi-3 token quirks on "phi3" in it
    write_params(w, fam, hf)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_vocab(w, fam, voc, d)
    for name, t in gguf_tensors(fam, hf, d):
        qtype = tensor_qtype(name, t, matrix)
        data = gguf.quants.quantize(t.numpy(), qtype)   # QuantError if a row is not whole blocks
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------
# checks


def gguf_kv(reader: "gguf.GGUFReader") -> dict:
    out = {}
    for k, f in reader.fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = f.contents()
    return out


def gguf_as_hf(fam: dict, hf: dict, path: Path, hf_names: list[str]) -> tuple[dict, dict, dict]:
    """A GGUF read back (gguf.GGUFReader) under the HF names, its transforms undone (Q/K rows
    unpermuted, Gemma's norms less 1; fused tensors stay fused, as the HF model has them):
    (metadata, {HF name: (float32 array, GGML type)}, {rope factor tensor: array})."""
    arch = getattr(gguf.MODEL_ARCH, fam["arch"])
    names = gguf.get_tensor_name_map(arch, hf["num_hidden_layers"])
    to_hf = {names.get_name(k, try_suffixes=(".weight", ".bias")): k for k in hf_names}
    r = gguf.GGUFReader(str(path))
    out, extra = {}, {}
    for t in r.tensors:
        qt = gguf.GGMLQuantizationType(t.tensor_type)
        x = gguf.quants.dequantize(t.data, qt).astype(np.float32)
        x = x.reshape([int(n) for n in reversed(t.shape)])    # ggml's ne is numpy's shape reversed
        if t.name.startswith("rope_factors_"):
            extra[t.name] = x
            continue
        k = to_hf[t.name]
        if fam["arch"] in PERMUTE_QK and k.endswith("q_proj.weight"):
            x = unpermute_qk(x, hf["num_attention_heads"])
        if fam["arch"] in PERMUTE_QK and k.endswith("k_proj.weight"):
            x = unpermute_qk(x, hf["num_key_value_heads"])
        if fam["arch"] == "GEMMA3" and k.endswith("norm.weight"):
            x = x - 1.0     # exact: the GGUF holds fl(1 + w)
        out[k] = (x, qt)
    return gguf_kv(r), out, extra


def new_model(fam: dict, cfg, state: dict | None = None):
    m = getattr(transformers, fam["hf_class"])(cfg).float().eval()
    m.config._attn_implementation = "eager"
    if state is not None:
        missing, unexpected = m.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)
        assert not unexpected and set(missing) <= ({"lm_head.weight"} if cfg.tie_word_embeddings else set()), \
            (missing, unexpected)
    return m


def logits_and_margin(model, tokens: np.ndarray) -> dict:
    logits = forward_logits(model, tokens)
    top2 = np.sort(logits, axis=1)[:, -2:]
    return dict(logits=logits.astype(np.float32), margin=(top2[:, 1] - top2[:, 0]).astype(np.float32))


def q8_golden(fam: dict, cfg, d: Path, tokens: np.ndarray, n_prompt: int) -> dict:
    """transformers' float32 logits over `tokens` (teacher-forced) with model-q8_0.gguf's weights,
    dequantized and put back under the HF names."""
    hf = json.loads((d / "config.json").read_text())
    names = list(load_file(str(d / "model.safetensors")))
    _, sd, _ = gguf_as_hf(fam, hf, d / "model-q8_0.gguf", names)
    m = new_model(fam, cfg, {k: v for k, (v, _) in sd.items()})
    return dict(tokens=tokens, n_prompt=np.int32(n_prompt), **logits_and_margin(m, tokens))


def check_family(name: str, fam: dict, d: Path, report: list[str]) -> None:
    hf = json.loads((d / "config.json").read_text())
    g = np.load(d / "golden.npz")
    st = {k: v.to(torch.float32).numpy() for k, v in load_file(str(d / "model.safetensors")).items()}
    with safetensors.safe_open(str(d / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}, dtypes
    tied = hf.get("tie_word_embeddings", False)
    assert ("lm_head.weight" in st) == (not tied), "lm_head.weight present iff untied"

    # the HF model from the directory gives the golden logits
    model = getattr(transformers, fam["hf_class"]).from_pretrained(d, dtype=torch.float32,
                                                                 attn_implementation="eager").eval()
    err = float(np.abs(forward_logits(model, g["tokens"]) - g["logits"]).max())
    assert err < 1e-4, f"{name}: from_pretrained logits differ by {err}"
    n = int(g["n_prompt"])
    assert np.array_equal(np.argmax(g["logits"][n - 1:-1], 1), g["tokens"][n:])

    n_head, n_kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    arch = getattr(gguf.MODEL_ARCH, fam["arch"])
    for fname, q8 in (("model.gguf", False), ("model-q8_0.gguf", True)):
        kv, back, extra = gguf_as_hf(fam, hf, d / fname, list(st))
        a = kv["general.architecture"]
        assert a == gguf.MODEL_ARCH_NAMES[arch]
        assert kv[f"{a}.block_count"] == hf["num_hidden_layers"]
        assert kv[f"{a}.embedding_length"] == hf["hidden_size"]
        assert kv[f"{a}.feed_forward_length"] == hf["intermediate_size"]
        assert kv[f"{a}.attention.head_count"] == n_head
        assert kv[f"{a}.attention.head_count_kv"] == n_kv
        assert kv[f"{a}.context_length"] == hf["max_position_embeddings"]
        assert abs(kv[f"{a}.attention.layer_norm_rms_epsilon"] - hf["rms_norm_eps"]) < 1e-12
        assert len(kv["tokenizer.ggml.tokens"]) == hf["vocab_size"]
        assert set(back) == set(st), set(back) ^ set(st)
        assert set(extra) == ({"rope_factors_long.weight", "rope_factors_short.weight"} if fam["arch"] == "PHI3"
                              else set())
        for t, x in extra.items():
            key = "long_factor" if t.startswith("rope_factors_long") else "short_factor"
            assert np.array_equal(x, np.array(hf["rope_parameters"][key], dtype=np.float32))
        for k, (x, qt) in back.items():
            ref = st[k]
            assert x.shape == ref.shape, (k, x.shape, ref.shape)
            if ref.ndim == 1:
                assert qt == gguf.GGMLQuantizationType.F32, k
                assert np.array_equal(x, ref), k
            elif not q8:
                assert qt == gguf.GGMLQuantizationType.BF16, k
                assert np.array_equal(x, ref), k
            else:
                assert qt == gguf.GGMLQuantizationType.Q8_0, k
                blocks = np.abs(ref.reshape(-1, 32)).max(1) / 127.0
                step = np.repeat(blocks, 32).reshape(ref.shape)
                # |error| <= half a step, plus the step's own rounding to fp16 (2^-11 relative) times |q| <= 127
                assert np.all(np.abs(x - ref) <= step * (0.5 + 127 * 2.0 ** -11) + 1e-12), k
    cfg = transformers.AutoConfig.from_pretrained(d)
    q = np.load(d / "golden-q8_0.npz")
    again = q8_golden(fam, cfg, d, g["tokens"], n)
    assert np.array_equal(q["tokens"], g["tokens"])
    assert float(np.abs(again["logits"] - q["logits"]).max()) < 1e-4
    if (d / "golden-gguf.npz").exists():
        gg = np.load(d / "golden-gguf.npz")
        c2 = copy.deepcopy(cfg)
        c2.query_pre_attn_scalar = c2.head_dim
        m2 = new_model(fam, c2, {k: v for k, v in st.items()})
        assert float(np.abs(forward_logits(m2, gg["tokens"]) - gg["logits"]).max()) < 1e-4
        q2 = q8_golden(fam, c2, d, gg["tokens"], n)
        assert float(np.abs(q2["logits"] - np.load(d / "golden-gguf-q8_0.npz")["logits"]).max()) < 1e-4
    report.append(f"{name}: safetensors, HF reload, golden tokens, GGUF metadata and every GGUF tensor "
                  f"(bf16 exact, q8_0 within half a step), the q8_0 goldens check out")

    # tokenizers load; the SentencePiece model and tokenizer.json agree
    tk = transformers.AutoTokenizer.from_pretrained(d)
    assert len(tk) == hf["vocab_size"], (len(tk), hf["vocab_size"])
    text = "the fox runs to the market."
    ids = tk(text)["input_ids"]
    assert tk.decode(ids, skip_special_tokens=True) == text, (tk.decode(ids), text)
    chat = tk.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "hi" in chat
    if fam["tok"]["kind"] == "spm":
        import sentencepiece
        sp = sentencepiece.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        assert sp.vocab_size() == hf["vocab_size"]
        for s in (text, "an old man walks with his cat!", "Zebra 123 ~"):
            a = [sp.bos_id()] + sp.encode(s)
            b = tk(s)["input_ids"]
            assert a == b, (s, a, b)
            assert sp.decode(sp.encode(s)) == s


def check_transformers_gguf(name: str, fam: dict, d: Path, report: list[str]) -> None:
    """transformers' own GGUF loader (supported archs only): from the GGUF alone, and with the
    directory's config.json, against the golden logits (model-q8_0.gguf: against golden-q8_0.npz)."""
    goldens = {"model.gguf": np.load(d / "golden.npz"), "model-q8_0.gguf": np.load(d / "golden-q8_0.npz")}
    cls = getattr(transformers, fam["hf_class"])
    ours = transformers.AutoConfig.from_pretrained(d).to_dict()
    theirs = transformers.AutoConfig.from_pretrained(d, gguf_file="model.gguf").to_dict()
    skip = {"transformers_version", "_name_or_path", "_model_name_or_path", "dtype", "architectures",
            "unk_token_id", "rms_norm_eps"}   # rms_norm_eps: the GGUF's float32 of 1e-6
    lost = {k: (theirs.get(k), ours.get(k)) for k in sorted(set(ours) | set(theirs))
            if k not in skip and theirs.get(k) != ours.get(k)}
    report.append(f"{name}: transformers' config from model.gguf differs from config.json in "
                  + ("; ".join(f"{k}: {a!r} (config.json {b!r})" for k, (a, b) in lost.items()) or "nothing"))
    for fname in ("model.gguf", "model-q8_0.gguf"):
        for how in ("gguf config", "config.json"):
            kw = {} if how == "gguf config" else {"config": transformers.AutoConfig.from_pretrained(d)}
            try:
                m = cls.from_pretrained(d, gguf_file=fname, dtype=torch.float32, attn_implementation="eager",
                                        **kw).eval()
                g = goldens[fname]
                lg = forward_logits(m, g["tokens"])
                err = float(np.abs(lg - g["logits"]).max())
                top1 = int((np.argmax(lg, 1) != np.argmax(g["logits"], 1)).sum())
                which = "golden.npz" if fname == "model.gguf" else "golden-q8_0.npz"
                report.append(f"{name}: transformers from {fname} ({how}) against {which}: max |logit diff| "
                              f"{err:.3g}, top-1 changes {top1} of {len(lg)}")
            except Exception as e:      # noqa: BLE001 (what transformers cannot load is reported)
                report.append(f"{name}: transformers from {fname} ({how}): not loadable: "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")


# ---------------------------------------------------------------------------------------------


def config_facts(fam: dict, cfg, hf: dict) -> dict:
    facts = {k: hf.get(k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
        "rope_parameters", "bos_token_id", "eos_token_id", "pad_token_id")}
    facts["head_dim"] = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    facts["hidden_act"] = getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None)
    lt = getattr(cfg, "layer_types", None)
    facts["layer_types"] = list(lt) if lt else ["full_attention"] * cfg.num_hidden_layers
    arch = fam["arch"]
    if arch == "GEMMA3":
        facts.update(sliding_window=cfg.sliding_window, query_pre_attn_scalar=cfg.query_pre_attn_scalar,
                     attention_scale=cfg.query_pre_attn_scalar ** -0.5,
                     final_logit_softcapping=cfg.final_logit_softcapping,
                     attn_logit_softcapping=cfg.attn_logit_softcapping,
                     embed_scale=math.sqrt(cfg.hidden_size), norm="x * (1 + w) (zero-centred weights in HF)",
                     rope_dims=facts["head_dim"])
    elif arch == "PHI3":
        rp = cfg.rope_parameters
        rot = int(facts["head_dim"] * rp["partial_rotary_factor"])
        seq = fam["n_prompt"] + N_GEN
        facts.update(rope_dims=rot, partial_rotary_factor=rp["partial_rotary_factor"],
                     original_max_position_embeddings=rp["original_max_position_embeddings"],
                     longrope_attention_factor=math.sqrt(
                         1 + math.log(cfg.max_position_embeddings / rp["original_max_position_embeddings"]) /
                         math.log(rp["original_max_position_embeddings"])),
                     factors_in_effect="long" if fam["n_prompt"] > rp["original_max_position_embeddings"] else "short",
                     factors_rule="transformers: long when the sequence (max position + 1) exceeds "
                                  "original_max_position_embeddings, at every step here since the prompt alone "
                                  f"does ({fam['n_prompt']} > {rp['original_max_position_embeddings']}; whole "
                                  f"sequence {seq}); llama.cpp: long when the context size exceeds it",
                     fused="qkv_proj rows [q | k | v]; gate_up_proj rows [gate | up]")
    elif arch == "SMOLLM3":
        facts.update(no_rope_layers=list(cfg.no_rope_layers), rope_dims=facts["head_dim"],
                     no_rope_rule="layer i uses RoPE iff no_rope_layers[i] == 1, here iff (i + 1) % 4 != 0")
    else:
        facts["rope_dims"] = facts["head_dim"]
    if arch == "QWEN3":
        facts["qk_norm"] = "RMSNorm over each head's head_dim (q_norm, k_norm), before RoPE"
        rp = cfg.rope_parameters
        if rp.get("rope_type") == "yarn":
            facts["yarn_attention_factor"] = 0.1 * math.log(rp["factor"]) + 1.0
    facts["rope_style"] = ("neox (rotate half)" if arch in ("QWEN3", "GEMMA3", "PHI3") else
                           "llama: HF rotate-half; the GGUF's Q/K rows permuted to llama.cpp's interleaved pairs")
    return facts


def build_family(name: str, fam: dict, outdir: Path) -> None:
    d = outdir / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    torch.manual_seed(fam["seed"])
    voc = build_spm_vocab(fam["tok"]) if fam["tok"]["kind"] == "spm" else build_bpe_vocab(fam["tok"])
    assert len(voc["tokens"]) == VOCAB
    cfg = make_config(fam, voc)
    model = build_model(fam, cfg)
    models = [model]
    if fam["arch"] == "GEMMA3":     # see gguf_attention_scale_note below
        c2 = copy.deepcopy(cfg)
        c2.query_pre_attn_scalar = cfg.head_dim
        models.append(new_model(fam, c2, model.state_dict()))
    attempt, goldens = golden_run(models, fam, voc)
    gold = goldens[0]

    bf = copy.deepcopy(model).to(torch.bfloat16)
    bf.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        (d / extra).unlink(missing_ok=True)
    sd = load_file(str(d / "model.safetensors"))
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and cfg.tie_word_embeddings:
            assert k not in sd
            continue
        assert k in sd and sd[k].dtype == torch.bfloat16 and torch.equal(sd[k].float(), v), k
    write_tokenizer(fam, voc, d)
    hf = json.loads((d / "config.json").read_text())

    np.savez(d / "golden.npz", **gold)
    write_gguf(fam, voc, d, d / "model.gguf", q8=False)
    write_gguf(fam, voc, d, d / "model-q8_0.gguf", q8=True)
    q8 = q8_golden(fam, cfg, d, gold["tokens"], fam["n_prompt"])
    np.savez(d / "golden-q8_0.npz", **q8)

    kv = gguf_kv(gguf.GGUFReader(str(d / "model.gguf")))
    meta = {k: v for k, v in kv.items() if not k.startswith("tokenizer.ggml.") or k.endswith(("_id", "model", "pre"))
            or k.startswith("tokenizer.ggml.add_")}
    meta["tokenizer.ggml.tokens"] = f"[{len(kv['tokenizer.ggml.tokens'])} tokens]"
    if "tokenizer.ggml.merges" in kv:
        meta["tokenizer.ggml.merges"] = f"[{len(kv['tokenizer.ggml.merges'])} merges]"
    meta["tokenizer.ggml.token_type"] = "[per token]"
    if "tokenizer.ggml.scores" in kv:
        meta["tokenizer.ggml.scores"] = "[per token]"
    meta["tokenizer.chat_template"] = kv.get("tokenizer.chat_template")
    n = fam["n_prompt"]
    info = {
        "family": name, "about": fam["about"], "hf_class": fam["hf_class"],
        "gguf_arch": gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, fam["arch"])],
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
                     "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
                     "tokenizers": tokenizers.__version__, "numpy": np.__version__},
        "seed": fam["seed"], "prompt_attempt": attempt,
        "prompt_rule": "tokens[:n_prompt] = numpy.random.default_rng([seed, prompt_attempt]).integers(%d, %d, "
                       "n_prompt): the first attempt whose greedy steps all have margin >= %g"
                       % (*prompt_range(fam, voc), MIN_MARGIN),
        "n_prompt": n, "n_generated": N_GEN, "n_tokens": n + N_GEN,
        "golden": "logits[i] are the float32 logits after tokens[0..i]; tokens[n_prompt + k] = argmax "
                  "logits[n_prompt - 1 + k]; one eager forward, bf16 weights upcast to float32, CPU",
        "min_margin_generated": round(float(gold["margin"][n - 1:-1].min()), 5),
        "golden_q8_0": "golden-q8_0.npz: tokens (golden.npz's), n_prompt, logits, margin of one forward with "
                       "model-q8_0.gguf's weights dequantized (teacher-forced: its top-1 may differ from the "
                       "next token)",
        "golden_q8_0_top1_changes": int((np.argmax(q8["logits"], 1) != np.argmax(gold["logits"], 1)).sum()),
        "golden_q8_0_max_abs_logit_diff": round(float(np.abs(q8["logits"] - gold["logits"]).max()), 4),
        "config": config_facts(fam, cfg, hf),
        "gguf_matrices": {"model.gguf": "BF16", "model-q8_0.gguf": "Q8_0"},
        "gguf_f32": "1-D tensors (norms, rope factors)",
        "gguf_transforms": gguf_transforms(fam),
        "gguf_metadata": meta,
        "feature_off": ablations(fam, cfg, model, gold["tokens"], gold["logits"]),
    }
    if fam["arch"] == "GEMMA3":
        info["gguf_attention_scale_note"] = (
            "llama.cpp's gemma3 has no metadata key for query_pre_attn_scalar: it scales queries by "
            "1/sqrt(head_dim) (1/sqrt(hidden/heads) only for the 62-layer 27B), so this model.gguf as "
            "llama.cpp reads it scales by 1/sqrt(16), not 1/sqrt(32). golden-gguf.npz holds what "
            "transformers gives with query_pre_attn_scalar = head_dim: the same weights and prompt, its own "
            "greedy continuation and logits; golden-gguf-q8_0.npz the same with model-q8_0.gguf's weights")
        g2 = goldens[1]
        np.savez(d / "golden-gguf.npz", **g2)
        np.savez(d / "golden-gguf-q8_0.npz", **q8_golden(fam, c2, d, g2["tokens"], n))
        info["golden_gguf_min_margin_generated"] = round(float(g2["margin"][fam["n_prompt"] - 1:-1].min()), 5)
    (d / "golden.json").write_text(json.dumps(info, indent=1, default=_json_default) + "\n")
    print(f"{name}: written ({sum(f.stat().st_size for f in d.iterdir()) / 1e6:.2f} MB)", flush=True)


def gguf_transforms(fam: dict) -> list[str]:
    arch = fam["arch"]
    t = ["tensor names: gguf.get_tensor_name_map(arch, n_layer) of the HF names"]
    if arch in PERMUTE_QK:
        t.append("attn_q/attn_k rows permuted for llama's interleaved RoPE: w.reshape(n_head, 2, head_dim/2, "
                 "n_embd).swapaxes(1, 2) (n_head_kv for attn_k)")
    else:
        t.append("no Q/K permutation (NEOX RoPE)")
    if arch == "GEMMA3":
        t.append("every *norm.weight stored as 1 + w (F32), incl. attn_q_norm/attn_k_norm, post norms, output_norm")
        t.append("no output.weight (tied)")
    if arch == "PHI3":
        t.append("attn_qkv = qkv_proj as is; ffn_up = gate_up_proj as is ([gate | up] rows, 2 * n_ff)")
        t.append("rope_factors_long.weight / rope_factors_short.weight: the long/short factors, F32")
        t.append("no output.weight (tied)")
    if arch == "SMOLLM3":
        t.append("no output.weight (tied); no key for the RoPE-less layers: llama.cpp's smollm3 fixes "
                 "n_no_rope_layer_step = 4 (layer il has no RoPE iff (il + 1) % 4 == 0)")
    if arch == "QWEN3" or arch == "MISTRAL3":
        t.append("output.weight = lm_head (untied)")
    return t


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:      # noqa: BLE001
        return None


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, bytes):
        return o.decode()
    raise TypeError(type(o))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--check", action="store_true", help="only check the fixtures already in OUTDIR")
    ap.add_argument("--only", nargs="*", default=None, help="families (default: all)")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    names = args.only or list(FAMILIES)
    if not args.check:
        for name in names:
            build_family(name, FAMILIES[name], args.outdir)
    report: list[str] = []
    for name in names:
        check_family(name, FAMILIES[name], args.outdir / name, report)
    for name in names:
        if FAMILIES[name]["arch"] in ("QWEN3", "GEMMA3", "PHI3"):    # transformers' GGUF archs among ours
            check_transformers_gguf(name, FAMILIES[name], args.outdir / name, report)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
