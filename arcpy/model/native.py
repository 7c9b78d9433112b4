"""A model as libarc describes it: its config as an arc_model_config, its tensor table, its layer
program.

Both tables are written once, in libarc, and read from there by every backend:
- the tensor table (arc.h: arc_tensor_shape) gives each arc_tensor's shape and whether a config
  has it. Here each tensor only gets its Hugging Face name; shapes, presence and the checks of a
  file's tensors all follow libarc's answer.
- the layer program (arc.h: arc_layer_op, arc_layer_program) is the sequence of one decoder
  layer: the CUDA forwards run it, and the NumPy reference runs each op in its own form.
libarc.so loads without a GPU, so the NumPy backend reads the same tables. An install built
without libarc.so (ARC_CUDA_ARCHS=none) reads them from arcpy.model.table, their Python reading;
where a library that should load does not, describing a model is the NoDeviceError that says why.
Every `cfg` here is a ModelConfig (arcpy.model.config, which reads its tensor table from here).
"""

from __future__ import annotations

from collections.abc import Iterator

from arcpy import _lib
from arcpy.codes import ACT_SWIGLU_LIMIT, ACTIVATIONS, OP_NAMES, ROUTINGS
from arcpy.errors import InvalidArgumentError
from arcpy.model import gemma4, table

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"

# arc_tensor ids by Hugging Face name: the global tensors, and a layer's by the suffix after
# layer_prefix, in the order files list them (the norms after attention are norm_names').
_GLOBAL_IDS = {EMBED: "ARC_TENSOR_EMBED", FINAL_NORM: "ARC_TENSOR_FINAL_NORM", LM_HEAD: "ARC_TENSOR_LM_HEAD",
               **dict(gemma4.PLE_GLOBAL_IDS)}
_ATTENTION_IDS = (
    ("input_layernorm.weight", "ARC_TENSOR_ATTN_NORM"),
    ("self_attn.q_norm.weight", "ARC_TENSOR_Q_NORM"),
    ("self_attn.k_norm.weight", "ARC_TENSOR_K_NORM"),
    ("self_attn.q_proj.weight", "ARC_TENSOR_WQ"),
    ("self_attn.k_proj.weight", "ARC_TENSOR_WK"),
    ("self_attn.v_proj.weight", "ARC_TENSOR_WV"),
    ("self_attn.q_proj.bias", "ARC_TENSOR_BQ"),
    ("self_attn.k_proj.bias", "ARC_TENSOR_BK"),
    ("self_attn.v_proj.bias", "ARC_TENSOR_BV"),
    ("self_attn.o_proj.weight", "ARC_TENSOR_WO"),
    ("self_attn.o_proj.bias", "ARC_TENSOR_BO"),  # gpt-oss's, and each query head's sink logit
    ("self_attn.sinks", "ARC_TENSOR_SINKS"),
)
_NORM_IDS = {"ffn": "ARC_TENSOR_MLP_NORM", "post_attn": "ARC_TENSOR_POST_ATTN_NORM",
             "post_ffn": "ARC_TENSOR_POST_FFN_NORM"}
_FFN_IDS = (
    ("mlp.gate_proj.weight", "ARC_TENSOR_W_GATE"),
    ("mlp.up_proj.weight", "ARC_TENSOR_W_UP"),
    ("mlp.down_proj.weight", "ARC_TENSOR_W_DOWN"),
    # A mixture of experts' layer: the router, and each expert's matrix of the three stacked in one
    # tensor, expert e's rows after expert e-1's (arc.h; llama.cpp's ffn_*_exps); the shared expert.
    # gpt-oss's biases follow the matrix each adds to (expert e's values after expert e-1's).
    ("mlp.gate.weight", "ARC_TENSOR_MOE_ROUTER"),
    ("mlp.gate.bias", "ARC_TENSOR_MOE_ROUTER_BIAS"),
    ("mlp.experts.gate_proj.weight", "ARC_TENSOR_MOE_GATE"),
    ("mlp.experts.gate_proj.bias", "ARC_TENSOR_MOE_GATE_BIAS"),
    ("mlp.experts.up_proj.weight", "ARC_TENSOR_MOE_UP"),
    ("mlp.experts.up_proj.bias", "ARC_TENSOR_MOE_UP_BIAS"),
    ("mlp.experts.down_proj.weight", "ARC_TENSOR_MOE_DOWN"),
    ("mlp.experts.down_proj.bias", "ARC_TENSOR_MOE_DOWN_BIAS"),
    ("mlp.shared_expert_gate.weight", "ARC_TENSOR_SHARED_ROUTER"),
    ("mlp.shared_expert.gate_proj.weight", "ARC_TENSOR_SHARED_GATE"),
    ("mlp.shared_expert.up_proj.weight", "ARC_TENSOR_SHARED_UP"),
    ("mlp.shared_expert.down_proj.weight", "ARC_TENSOR_SHARED_DOWN"),
)
# A gated DeltaNet layer's tensors after its input norm (arcpy/model/hybrid.py), in file order: its
# attention's are absent (the table gives them no rows there).
_DELTANET_IDS = (
    ("linear_attn.A_log", "ARC_TENSOR_DN_A_LOG"),
    ("linear_attn.conv1d.weight", "ARC_TENSOR_DN_CONV"),
    ("linear_attn.dt_bias", "ARC_TENSOR_DN_DT_BIAS"),
    ("linear_attn.in_proj_a.weight", "ARC_TENSOR_DN_A"),
    ("linear_attn.in_proj_b.weight", "ARC_TENSOR_DN_B"),
    ("linear_attn.in_proj_qkv.weight", "ARC_TENSOR_DN_QKV"),
    ("linear_attn.in_proj_z.weight", "ARC_TENSOR_DN_Z"),
    ("linear_attn.norm.weight", "ARC_TENSOR_DN_NORM"),
    ("linear_attn.out_proj.weight", "ARC_TENSOR_DN_OUT"),
)
_CONV = "linear_attn.conv1d.weight"  # (channels, 1, kernel) in the files, as torch's Conv1d; (channels, kernel) in the table
_Q_PROJ = "self_attn.q_proj.weight"
ROUTERS = ("mlp.gate.weight", "mlp.shared_expert_gate.weight", gemma4.ROUTER)  # rank 2, never quantized
# The matrix tensors: what the GEMVs read, and what may be held quantized (arc.h's arc_format).
_DN_MATRICES = ("ARC_TENSOR_DN_QKV", "ARC_TENSOR_DN_Z", "ARC_TENSOR_DN_B", "ARC_TENSOR_DN_A", "ARC_TENSOR_DN_OUT")
_MATRIX_SUFFIXES = (tuple(suffix for suffix, _ in _ATTENTION_IDS + _FFN_IDS if suffix.endswith("proj.weight"))
                    + tuple(suffix for suffix, tensor in _DELTANET_IDS if tensor in _DN_MATRICES))
_RANK2_SUFFIXES = _MATRIX_SUFFIXES + ROUTERS + gemma4.PLE_MATRICES


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def norm_names(cfg) -> dict[str, str]:
    """The layer's norms after attention, by role, under their Hugging Face names: the FFN's input
    norm ("ffn"), and with post_norms the attention's and the FFN's output norms. Gemma names its
    FFN input norm pre_feedforward_layernorm and its attention output norm post_attention_layernorm,
    the name Llama gives its FFN input norm."""
    if not cfg.post_norms:
        return {"ffn": "post_attention_layernorm.weight"}
    return {"ffn": "pre_feedforward_layernorm.weight", "post_attn": "post_attention_layernorm.weight",
            "post_ffn": "post_feedforward_layernorm.weight"}


_LAYER_SCALAR_ID = (("layer_scalar", "ARC_TENSOR_LAYER_SCALAR"),)  # Gemma 4's, the layer's last


def _layer_ids(cfg) -> tuple[tuple[str, str], ...]:
    """(suffix, arc_tensor name) of every tensor a layer may hold, in file order."""
    norms = tuple((name, _NORM_IDS[role]) for role, name in norm_names(cfg).items())
    # Gemma 4's experts beside its FFN, and its per-layer input
    ffn = _FFN_IDS[:3] + gemma4.MOE_IDS + gemma4.PLE_IDS if cfg.gemma4_layer else _FFN_IDS
    return _ATTENTION_IDS[:1] + _DELTANET_IDS + _ATTENTION_IDS[1:] + norms + ffn + _LAYER_SCALAR_ID


def is_matrix(name: str) -> bool:
    """A per-layer projection or the lm_head: a tensor a quantized format may hold."""
    return name == LM_HEAD or (name.startswith("model.layers.") and name.endswith(_MATRIX_SUFFIXES))


def config_values(cfg, max_seq: int | None = None) -> dict:
    """arc_model_config's fields holding cfg, by name (max_seq: the context to allocate, else the
    config's): what native_config writes, and what arcpy.model.table reads without libarc."""
    if cfg.gemma4_layer:  # libarc's Gemma 4 layer: its fields, without what only the reference runs
        base = gemma4.native_base(cfg)
        return {**config_values(base, max_seq), **gemma4.native_fields(cfg)}
    dense, linear = [0, 0, 0, 0], [0, 0, 0, 0]
    for layer in cfg.mlp_only_layers:  # below 128: ModelConfig checks it
        dense[layer // 32] |= 1 << (layer % 32)
    for layer in range(cfg.n_layers):  # a hybrid's layers: 128 at most (ModelConfig checks it)
        if cfg.is_linear_layer(layer):
            linear[layer // 32] |= 1 << (layer % 32)
    return dict(
        dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        ffn_dim=cfg.ffn_dim, vocab=cfg.vocab, max_seq=cfg.max_seq if max_seq is None else max_seq,
        rms_eps=cfg.rms_eps, tied_embeddings=int(cfg.tied_embeddings), qkv_bias=int(cfg.qkv_bias),
        qk_norm=int(cfg.qk_norm), rope_dim=cfg.rope_dim, rope_factor=cfg.rope_attention_factor,
        post_norms=int(cfg.post_norms),
        activation=ACT_SWIGLU_LIMIT if cfg.swiglu_limit > 0 else ACTIVATIONS.index(cfg.activation),
        # Unset, the scores' factor is libarc's own 1/sqrt(head_dim), rounded once from double.
        embed_scale=cfg.embed_scale, attn_scale=cfg.attn_scale if cfg.attn_scale is not None else 0.0,
        sliding_window=cfg.sliding_window, window_pattern=cfg.window_pattern, norm_plus_one=int(cfg.norm_plus_one),
        n_experts=cfg.n_experts, n_experts_used=cfg.n_experts_used, expert_ffn_dim=cfg.expert_ffn_dim,
        routing=ROUTINGS.index(cfg.routing), norm_topk=int(cfg.norm_topk_prob),
        shared_ffn_dim=cfg.shared_expert_ffn_dim, moe_every=cfg.moe_every, dense_layers=dense,
        attn_gate=int(cfg.attn_output_gate), dn_k_heads=cfg.linear_n_k_heads, dn_v_heads=cfg.linear_n_v_heads,
        dn_head_dim=cfg.linear_k_head_dim, dn_conv_kernel=cfg.linear_conv_kernel, dn_layers=linear,
        attn_sinks=int(cfg.attn_sinks), o_bias=int(cfg.o_bias), expert_bias=int(cfg.expert_bias),
        global_head_dim=0, global_n_kv_heads=0, v_norm=0, layer_scalar=0, final_softcap=0.0, experts_beside=0,
        ple_dim=0, ple_vocab=0, kv_shared_layers=0, double_wide_ffn=0)


def native_config(ffi, cfg, max_seq: int | None = None, kv_cache: int = 0):
    """A new arc_model_config * holding cfg (max_seq: the context to allocate, else the config's;
    kv_cache: the cache's arc_kv_form, bf16 by default)."""
    c = ffi.new("arc_model_config *")
    c.kv_cache = kv_cache
    for name, value in config_values(cfg, max_seq).items():
        if name in ("dense_layers", "dn_layers"):
            getattr(c, name)[0:len(value)] = value
        else:
            setattr(c, name, value)
    return c


class _Table:
    """libarc's tensor table for one config: shape(id name, layer) -> its shape, or None where the
    config has no such tensor. Rank 2 for the embedding and the matrices, 1 for the rest."""

    def __init__(self, cfg):
        self.values = config_values(cfg) if _lib.not_built() else None
        if self.values is None:
            self.ffi, self.lib = _lib.load()
            self.config = native_config(self.ffi, cfg)
            self.rows, self.cols = self.ffi.new("int64_t *"), self.ffi.new("int64_t *")

    def shape(self, tensor: str, layer: int, matrix: bool) -> tuple[int, ...] | None:
        if self.values is not None:
            rows, cols = table.tensor_shape(self.values, tensor, layer)
        else:
            _lib.check(self.lib.arc_tensor_shape(self.config, getattr(self.lib, tensor), layer, self.rows,
                                                 self.cols))
            rows, cols = int(self.rows[0]), int(self.cols[0])
        if rows == 0:
            return None
        return (rows, cols) if matrix else (cols,)


def iter_tensors(cfg) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor a model of this config stores, (name, shape), in a fixed order: libarc's table
    under the Hugging Face names.

    A generator, so a reader can stop at the first tensor a file lacks instead of first listing
    all of them for a config that claims a billion layers. A Gemma 4 config's: libarc's table less
    what its files do not hold (arcpy.model.gemma4.tensors).
    """
    if cfg.gemma4_layer:
        yield from gemma4.tensors(cfg, _table_tensors(cfg))
        return
    yield from _table_tensors(cfg)


def _table_tensors(cfg) -> Iterator[tuple[str, tuple[int, ...]]]:
    """libarc's table of cfg under the Hugging Face names."""
    table = _Table(cfg)
    yield EMBED, table.shape(_GLOBAL_IDS[EMBED], 0, True)
    for name, tensor in gemma4.PLE_GLOBAL_IDS:  # Gemma 4's per-layer embeddings
        shape = table.shape(tensor, 0, name != gemma4.PLE_NORM)
        if shape is not None:
            yield name, shape
    layer_ids = _layer_ids(cfg)
    for i in range(cfg.n_layers):
        p = layer_prefix(i)
        for suffix, tensor in layer_ids:
            shape = table.shape(tensor, i, suffix in _RANK2_SUFFIXES or suffix == _CONV)
            if shape is None:
                continue
            if suffix == _Q_PROJ and cfg.attn_output_gate:
                shape = (2 * shape[0], shape[1])  # each query head's rows, then its gate's (ARC_TENSOR_WQ_GATE)
            elif suffix == _CONV:
                shape = (shape[0], 1, shape[1])
            yield p + suffix, shape
    yield FINAL_NORM, table.shape(_GLOBAL_IDS[FINAL_NORM], 0, False)
    lm_head = table.shape(_GLOBAL_IDS[LM_HEAD], 0, True)
    if lm_head is not None:
        yield LM_HEAD, lm_head


def expected_tensors(cfg) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config stores, name -> shape, in a fixed order."""
    return dict(iter_tensors(cfg))


def place(name: str, cfg) -> tuple[str, int]:
    """(arc_tensor name, layer) of a tensor of a model of cfg, by its Hugging Face name."""
    if name in _GLOBAL_IDS:
        return _GLOBAL_IDS[name], 0
    layer_s, _, suffix = name[len("model.layers."):].partition(".")
    ids = dict(_layer_ids(cfg))
    if not (name.startswith("model.layers.") and layer_s.isdigit() and suffix in ids
            and name == layer_prefix(int(layer_s)) + suffix):
        raise InvalidArgumentError(f"tensor {name} has no place in the model")
    return ids[suffix], int(layer_s)


def layer_program(cfg, layer: int) -> list[int]:
    """The ops (arc_layer_op ids) that layer `layer` of a model of cfg runs, in order."""
    if _lib.not_built():
        return table.layer_program(config_values(cfg), layer)
    ffi, lib = _lib.load()
    ops, count = ffi.new("int32_t[]", lib.ARC_MAX_LAYER_OPS), ffi.new("int32_t *")
    _lib.check(lib.arc_layer_program(native_config(ffi, cfg), layer, ops, count))
    return [int(op) for op in ops[0:count[0]]]


def describe(program: list[int]) -> str:
    """The program's op names, as arc.h spells them without the ARC_OP_ prefix."""
    return " ".join(OP_NAMES.get(op, f"op{op}") for op in program)
