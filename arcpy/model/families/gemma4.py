"""Gemma 4 (text; arcpy/model/gemma4.py describes its layer): Gemma 3's layer with whole norm
factors, v norms, unscaled scores, full-attention layers of their own head width and kv heads under
proportional RoPE, layer scalars and capped logits; the 26B-A4B's experts beside the dense FFN; the
E2B/E4B's per-layer embeddings and K/V shared by their last layers. The checkpoints of
Gemma4ForConditionalGeneration hold the text model's config under text_config and its weights under
model.language_model (the readers take the text model alone; the vision and audio towers are not
read)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.config import LinearScaling, ModelConfig
from arcpy.model.families.family import BY_LAYER, GGUF_LAYER_NAMES, Family, nested_text_config
from arcpy.model.families.gemma3 import windows
from arcpy.model.families.hf_values import flag, integer, number, size, value
from arcpy.model.gemma4 import (EXPERT_SCALE, LAYER_SCALAR, PLE_EMBED, PLE_NORM, PLE_PROJECTION, ROUTER_SCALE,
                                global_dims)

# llama.cpp's names (its gemma4): a layer's modules, and the tensors it names whole (the experts'
# gate and up matrices are one tensor there, ffn_gate_up_exps, each expert's gate rows then its up
# rows, which arcpy.model.gguf splits); the per-layer embeddings' tensors outside the layers.
_GGUF_NAMES = {**GGUF_LAYER_NAMES, "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
               "pre_feedforward_layernorm_2": "pre_ffw_norm_2", "post_feedforward_layernorm_1": "post_ffw_norm_1",
               "post_feedforward_layernorm_2": "post_ffw_norm_2", "router.proj": "ffn_gate_inp",
               "mlp.experts.gate_proj": "ffn_gate_up_exps", "mlp.experts.up_proj": "ffn_gate_up_exps",
               "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj",
               "post_per_layer_input_norm": "post_norm",
               ROUTER_SCALE: "ffn_gate_inp.scale", EXPERT_SCALE: "ffn_down_exps.scale",
               LAYER_SCALAR: "layer_output_scale.weight"}
_GGUF_GLOBAL_NAMES = {PLE_EMBED: "per_layer_token_embd.weight", PLE_PROJECTION: "per_layer_model_proj.weight",
                      PLE_NORM: "per_layer_proj_norm.weight"}
_GLOBAL_HEAD_DIM, _PLE_VOCAB = 512, 262144  # transformers' defaults where config.json names none
_OVERRIDES = {"head_dim", "num_key_value_heads"}  # what per_layer_config may change of a full-attention layer


def _global_overrides(d: Mapping, source: str, full: list[int]) -> dict | None:
    """The full-attention layers' overrides in per_layer_config (transformers' own saved form), or
    None where config.json has none. They must be the same for every full-attention layer, and
    name no other layer."""
    per_layer = d.get("per_layer_config")
    if per_layer is None:
        return None
    if not isinstance(per_layer, dict) or not all(isinstance(v, dict) and set(v) <= _OVERRIDES
                                                  for v in per_layer.values()):
        raise ModelFileError(f"{source}: key 'per_layer_config' must map layers to their head_dim and "
                             "num_key_value_heads")
    layers = sorted(int(k) for k in per_layer if str(k).isdigit())
    kinds = [per_layer[k] for k in per_layer]
    if layers != full or len(layers) != len(per_layer) or any(k != kinds[0] for k in kinds):
        raise ModelFileError(f"{source}: per_layer_config must give every full-attention layer ({full}) the same "
                             f"overrides and no other layer any, got {quoted(per_layer)}")
    return kinds[0] if kinds else {}


class Gemma4(Family):
    name = "gemma4"
    hf_classes = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
    qk_norm = True
    window = BY_LAYER
    softcaps_logits = True
    hf_constants = {"attention_bias": False}
    hf_packed_experts = "experts"
    gguf_arch = "gemma4"
    gguf_names = _GGUF_NAMES
    gguf_global_names = _GGUF_GLOBAL_NAMES

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.gemma4_layer

    def text_config(self, d: Mapping) -> Mapping:
        """text_config's keys where config.json nests them; the embedding tied unless it says not
        (transformers' default)."""
        out = dict(nested_text_config(d))
        out.setdefault("tie_word_embeddings", True)
        return out

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        if d.get("use_bidirectional_attention") == "all":
            raise ModelFileError(f"{source}: use_bidirectional_attention='all' is not supported (a decoder attends "
                                 "causally)")
        dim = size(d, "hidden_size", source)
        out = {"gemma4_layer": True, "post_norms": True, "embed_scale": math.sqrt(dim), "attn_scale": 1.0,
               **windows(d, source, n_layers)}
        full = [i for i in range(n_layers) if not out.get("sliding_window")
                or i % out["window_pattern"] == out["window_pattern"] - 1]
        k_eq_v = flag(d, "attention_k_eq_v", source, False)
        overrides = _global_overrides(d, source, full)
        if overrides is None:
            global_head_dim = integer(d, "global_head_dim", source, _GLOBAL_HEAD_DIM)
            n = value(d, "num_global_key_value_heads", source, None)
            global_kv = integer(d, "num_global_key_value_heads", source) if n is not None and k_eq_v else 0
        else:
            global_head_dim = integer(overrides, "head_dim", source, head_dim)
            global_kv = integer(overrides, "num_key_value_heads", source, 0)
        out.update(global_head_dim=global_head_dim, global_n_kv_heads=global_kv, k_eq_v=k_eq_v)
        out.update(self._rope(d, source, global_head_dim))
        cap = value(d, "final_logit_softcapping", source, None)
        out["final_softcap"] = 0.0 if cap is None else number(d, "final_logit_softcapping", source)
        ple = value(d, "hidden_size_per_layer_input", source, 0)
        if ple:
            out.update(ple_dim=integer(d, "hidden_size_per_layer_input", source),
                       ple_vocab=integer(d, "vocab_size_per_layer_input", source, _PLE_VOCAB))
        out.update(kv_shared_layers=integer(d, "num_kv_shared_layers", source, 0),
                   double_wide_mlp=flag(d, "use_double_wide_mlp", source, False))
        if flag(d, "enable_moe_block", source, False):
            out.update(n_experts=integer(d, "num_experts", source), n_experts_used=integer(d, "top_k_experts", source),
                       expert_ffn_dim=integer(d, "moe_intermediate_size", source), norm_topk_prob=True)
        return out

    @staticmethod
    def _rope(d: Mapping, source: str, global_head_dim: int) -> dict:
        """rope_parameters by layer kind: the sliding layers' base (default RoPE over whole heads),
        the full-attention layers' base, rotated share (proportional) and linear factor."""
        params = d.get("rope_parameters")
        if not (isinstance(params, dict) and isinstance(params.get("full_attention"), dict)
                and isinstance(params.get("sliding_attention"), dict)):
            raise ModelFileError(f"{source}: key 'rope_parameters' must give full_attention's and "
                                 "sliding_attention's rope")
        local, glob = params["sliding_attention"], params["full_attention"]
        if local.get("rope_type", "default") != "default":
            raise ModelFileError(f"{source}: rope_parameters.sliding_attention must be the default rope, got "
                                 f"{quoted(local.get('rope_type'))}")
        kind = glob.get("rope_type", "default")
        if kind not in ("default", "proportional"):
            raise ModelFileError(f"{source}: rope_parameters.full_attention must be the default or the proportional "
                                 f"rope, got {quoted(kind)}")
        out = {"rope_local_theta": number(local, "rope_theta", source, 10000.0),
               "rope_theta": number(glob, "rope_theta", source, 1000000.0), "rope_scaling": None}
        if kind == "proportional":
            share = number(glob, "partial_rotary_factor", source, 1.0)
            if not 0 < share <= 1:
                raise ModelFileError(f"{source}: key 'partial_rotary_factor' must be in (0, 1], got {share}")
            turning = int(share * global_head_dim // 2)  # the pairs that turn, as transformers counts them
            if turning == 0:
                raise ModelFileError(f"{source}: partial_rotary_factor {share} turns no pair of a head of "
                                     f"{global_head_dim}")
            out["global_rope_dim"] = 0 if 2 * turning == global_head_dim else 2 * turning
            factor = number(glob, "factor", source, 1.0)
            if factor != 1.0:
                out["rope_scaling"] = LinearScaling(factor)
        return out

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        """As transformers' Gemma4ForCausalLM reads it (the text model's keys at the top)."""
        gh, gkv = global_dims(cfg)
        full = {"rope_type": "proportional", "rope_theta": cfg.rope_theta,
                "partial_rotary_factor": (cfg.global_rope_dim or gh) / gh}
        if cfg.rope_scaling is not None:
            full["factor"] = cfg.rope_scaling.factor
        d.update(model_type="gemma4_text", hidden_activation=d.pop("hidden_act"),
                 sliding_window=cfg.sliding_window or None,
                 layer_types=["sliding_attention" if cfg.window(i) else "full_attention" for i in range(cfg.n_layers)],
                 rope_parameters={"sliding_attention": {"rope_type": "default",
                                                        "rope_theta": cfg.rope_local_theta or 10000.0},
                                  "full_attention": full},
                 global_head_dim=gh, attention_k_eq_v=cfg.k_eq_v, final_logit_softcapping=cfg.final_softcap or None,
                 hidden_size_per_layer_input=cfg.ple_dim, vocab_size_per_layer_input=cfg.ple_vocab or cfg.vocab,
                 num_kv_shared_layers=cfg.kv_shared_layers, use_double_wide_mlp=cfg.double_wide_mlp,
                 enable_moe_block=cfg.n_experts > 0)
        del d["rope_theta"], d["rope_scaling"]
        if cfg.k_eq_v:
            d["num_global_key_value_heads"] = gkv
        if cfg.n_experts:
            d.update(num_experts=cfg.n_experts, top_k_experts=cfg.n_experts_used,
                     moe_intermediate_size=cfg.expert_ffn_dim)

    def gguf_experts(self, m, a: str, n: int) -> dict:
        """As llama.cpp reads them: expert_used_count of n, each expert_feed_forward_length wide."""
        return {"n_experts": n, "n_experts_used": m.integer(a + "expert_used_count"),
                "expert_ffn_dim": m.integer(a + "expert_feed_forward_length"), "norm_topk_prob": True}

    def gguf_config(self, f, a: str, vocab: int, experts: dict) -> ModelConfig:
        """As llama.cpp's converter writes gemma4 files: sliding_window_pattern (true: sliding) by
        layer; key_length the full-attention layers' head width, key_length_swa the others';
        head_count_kv and feed_forward_length a number or one by layer; the full-attention layers'
        proportional RoPE as rope_freqs (1 for a pair that turns, 1e30 for one that does not);
        k = v where their layers hold no attn_v; the norms' factors whole."""
        m, path = f.meta, f.path
        n, dim = m.integer(a + "block_count"), m.integer(a + "embedding_length")
        sliding = [bool(v) for v in m.numbers(a + "attention.sliding_window_pattern", n, "iub")]
        doc = {"layer_types": ["sliding_attention" if v else "full_attention" for v in sliding],
               "sliding_window": m.integer(a + "attention.sliding_window")}
        out = windows(doc, str(path), n)
        first_global = next((i for i, v in enumerate(sliding) if not v), 0)
        first_sliding = next((i for i, v in enumerate(sliding) if v), 0)
        kv, ffn = self._by_layer(m, a + "attention.head_count_kv", n), self._by_layer(m, a + "feed_forward_length", n)
        shared = m.integer(a + "attention.shared_kv_layers", 0)
        gh = m.integer(a + "attention.key_length")
        ple, ple_vocab = m.integer(a + "embedding_length_per_layer_input", 0), 0
        if ple:
            table = f.tensors.get(_GGUF_GLOBAL_NAMES[PLE_EMBED])
            if table is None:
                raise ModelFileError(f"{path}: missing tensor {quoted(_GGUF_GLOBAL_NAMES[PLE_EMBED])}")
            ple_vocab = table.shape[0]
        fields = dict(
            dim=dim, n_layers=n, n_heads=m.integer(a + "attention.head_count"), n_kv_heads=kv[first_sliding],
            head_dim=m.integer(a + "attention.key_length_swa", gh), ffn_dim=ffn[0], vocab=vocab,
            max_seq=m.integer(a + "context_length"), rms_eps=m.number(a + "attention.layer_norm_rms_epsilon", 1e-6),
            rope_theta=m.number(a + "rope.freq_base", 1000000.0),
            rope_local_theta=m.number(a + "rope.freq_base_swa", 10000.0),
            tied_embeddings="output.weight" not in f.tensors, qk_norm=True, post_norms=True, activation="gelu_tanh",
            embed_scale=math.sqrt(dim), attn_scale=1.0, gemma4_layer=True, global_head_dim=gh,
            global_n_kv_heads=kv[first_global] if kv[first_global] != kv[first_sliding] else 0,
            global_rope_dim=self._turning(f, gh), k_eq_v=f"blk.{first_global}.attn_v.weight" not in f.tensors,
            final_softcap=m.number(a + "final_logit_softcapping", 0.0), ple_dim=ple, ple_vocab=ple_vocab,
            kv_shared_layers=shared, double_wide_mlp=bool(shared) and ffn[-1] == 2 * ffn[0], **out, **experts)
        try:
            return ModelConfig(**fields)
        except InvalidArgumentError as e:
            raise ModelFileError(f"{path}: {e}") from None

    @staticmethod
    def _by_layer(m, key: str, n: int) -> list[int]:
        """A key holding one integer, or one by layer."""
        v = m.values.get(key)
        if isinstance(v, np.ndarray):
            return [int(x) for x in m.numbers(key, n, "iu")]
        return [m.integer(key)] * n

    @staticmethod
    def _turning(f, head_dim: int) -> int:
        """The elements of a full-attention head that turn (0: all), from rope_freqs."""
        info = f.tensors.get("rope_freqs.weight")
        if info is None:
            return 0
        if info.shape != (head_dim // 2,):
            raise ModelFileError(f"{f.path}: tensor 'rope_freqs.weight' has shape {quoted(list(info.shape))}, "
                                 f"config expects [{head_dim // 2}]")
        f.check_types([info])
        factors = f.values(info)
        turning = int(np.sum(factors == 1.0))
        if not (np.all(factors[:turning] == 1.0) and np.all(factors[turning:] >= 1e29)) or turning == 0:
            raise ModelFileError(f"{f.path}: tensor 'rope_freqs.weight' must be 1 for the pairs that turn, then "
                                 "1e30 for those that do not (proportional RoPE)")
        return 0 if 2 * turning == head_dim else 2 * turning


GEMMA4 = Gemma4()
