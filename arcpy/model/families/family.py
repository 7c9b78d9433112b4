"""Family: what one family of decoders changes in reading its files. The readers (arcpy.model.hf,
gguf_config, gguf, checkpoint) do the rest, once for every family; each family module subclasses
Family, setting the class attributes that differ and overriding the hooks it needs."""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from arcpy.model.config import ModelConfig
from arcpy.model.native import EMBED, FINAL_NORM, LM_HEAD

# How a family windows its attention: not at all (an active window in config.json is refused), on
# every layer (a context no longer than the window is then exact: max_seq is capped at it), or on
# the layers the family's own fields name (Gemma 3's; its hooks read them).
NO_WINDOW, EVERY_LAYER, BY_LAYER = "none", "every layer", "by layer"

GGUF_OUTPUT = "output.weight"  # the lm_head; a tied file has none
# Hugging Face names (arcpy.model) -> GGUF names: the tensors outside the layers, and a layer's
# modules (model.layers.N.<module>.weight -> blk.N.<name>.weight), as llama.cpp names them.
GGUF_GLOBAL_NAMES = {EMBED: "token_embd.weight", FINAL_NORM: "output_norm.weight", LM_HEAD: GGUF_OUTPUT}
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp", "mlp.experts.gate_proj": "ffn_gate_exps", "mlp.experts.up_proj": "ffn_up_exps",
    "mlp.experts.down_proj": "ffn_down_exps", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}
# An expert's matrices as the Hugging Face files of most families name them (mlp.experts.E.<name>).
EXPERT_NAMES = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


class Made(NamedTuple):
    """A tensor of the table a family makes from its files' tensors (Family.hf_tensors): its
    shape, and its reader, which takes the files' mappings (a dict, as read_bf16_words does) and
    returns its bf16 words."""

    shape: tuple[int, ...]
    read: Callable[[dict], object]
def nested_text_config(d: Mapping) -> Mapping:
    """The text model's keys of a multimodal class's config.json: text_config's where it has one,
    the outer file's architectures and tie_word_embeddings kept; else `d` itself."""
    inner = d.get("text_config")
    if not isinstance(inner, dict):
        return d
    out = dict(inner)
    for key in ("architectures", "tie_word_embeddings"):
        if key in d:
            out[key] = d[key]
    return out


class Family:
    """A family of decoders, as its Hugging Face config.json and its GGUF metadata describe it.

    Every attribute and hook has the Llama layer's value; a family module overrides what its
    family changes. The hooks return ModelConfig fields (a dict) that the reader adds to, or
    puts in place of, the fields every family shares.
    """

    name = ""                    # config.json's model_type naming the family
    hf_classes: tuple[str, ...] = ()  # config.json's architectures naming it (the first is written)
    gguf_arch: str | None = None  # general.architecture of llama.cpp's files of this family
    qkv_bias = False             # q, k and v have biases
    qk_norm = False              # q and k heads are RMS-normed before RoPE
    window = NO_WINDOW           # NO_WINDOW, EVERY_LAYER or BY_LAYER
    norms_less_one = False       # config.json's files store each norm's factor less one
    # config.json keys of a fixed value that config_to_hf writes for the family.
    hf_constants: Mapping[str, object] = {"attention_bias": False}
    hf_fused: Mapping[str, tuple[str, ...]] = {}  # a layer's fused tensor -> the parts it stacks
    hf_expert_block = "mlp"      # model.layers.N.<block>.experts.E.<name>.weight, <block>.gate the router
    hf_expert_names: Mapping[str, str] = EXPERT_NAMES  # the model's matrix name -> the files' <name>
    hf_packed_experts = ""       # the files pack a layer's experts: model.layers.N.<this>.gate_up_proj, .down_proj
    gguf_permuted = False        # llama.cpp's converter reorders the q/k rows (gguf.py's docstring)
    gguf_names: Mapping[str, str] = GGUF_LAYER_NAMES  # a layer's module -> llama.cpp's name
    gguf_global_names: Mapping[str, str] = {}  # the family's own tensors outside the layers -> llama.cpp's names
    gguf_float: tuple[str, ...] = ()  # tensors (by name's end) gguf_tensor takes as float32 values, not words
    gguf_unpacked: tuple[str, ...] = ()  # matrices (by name's end) never kept quantized: gguf_tensor moves columns
    gguf_dense_ffn = True        # the GGUF files give feed_forward_length (else the experts' width stands in)
    gguf_yarn_truncate = True    # YaRN's ramp of the GGUF files truncated to whole pairs, as llama.cpp's
    softcaps_logits = False      # the family reads config.json's final_logit_softcapping (else refused)

    def holds(self, cfg: ModelConfig) -> bool:
        """Whether config.json of this family can say what cfg holds (config_to_hf asks the
        families in the registry's order of writing)."""
        return False

    def text_config(self, d: Mapping) -> Mapping:
        """The keys of config.json `d` that describe the text model (a multimodal class's file
        nests them; every other family's are `d` itself)."""
        return d

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        """The ModelConfig fields of the family's own keys in config.json `d`."""
        return {}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        """Write into config.json `d` (the keys every family shares, already there) the keys of
        the family's own fields of cfg."""

    def hf_tensors(self, entries: Mapping, cfg: ModelConfig) -> tuple[dict, dict[str, Made]]:
        """The files' tensors (name -> TensorEntry) as the table names them: (the entries read as
        they are, the tensors the family makes from others by name). Most families' are as stored."""
        return dict(entries), {}

    def hf_written(self, tensors: Mapping, cfg: ModelConfig) -> dict | None:
        """The model's tensors (bf16 words) under the names and in the layout of the family's
        files, where they differ from the table's but for the experts split one tensor per expert
        (what save_model writes otherwise); None: no layout of the family's own."""
        return None

    def gguf_experts(self, m, a: str, n: int) -> dict | None:
        """A mixture of n experts' fields from the GGUF metadata `m` (keys prefixed `a`); None
        where the family's files have no experts."""
        return None

    def gguf_config(self, f, a: str, vocab: int, experts: dict) -> ModelConfig | None:
        """The whole config of the GGUF file `f` (keys prefixed `a`; `vocab` tokens; `experts` the
        gguf_experts fields), for a family whose metadata the shared reader cannot read (arrays by
        layer); None where the shared reader and gguf_fields read it."""
        return None

    def gguf_fields(self, m, a: str, dims: tuple[int, int, int], window: int) -> dict:
        """The family's own ModelConfig fields from the GGUF metadata `m` (keys prefixed `a`),
        given (dim, n_heads, head_dim) and the attention.sliding_window read (0: none)."""
        return {}

    def gguf_shape(self, hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape llama.cpp's files give a tensor of the table's `shape`."""
        return shape

    def gguf_tensor(self, hf_name: str, words, cfg: ModelConfig):
        """A tensor read from llama.cpp's file (bf16 words of its gguf_shape; float32 values where
        gguf_float names it; a QuantTensor where a matrix stays quantized) as the model holds it."""
        return words

    def gguf_fused(self, cfg: ModelConfig) -> dict[str, tuple[tuple[str, int], ...]]:
        """A layer's fused tensors in llama.cpp's files -> their parts and each one's rows."""
        return {}
