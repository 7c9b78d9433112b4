"""The tensor table of a config (Hugging Face names and shapes) and the Model that holds them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from arcpy.errors import InvalidArgumentError

from .checks import require

if TYPE_CHECKING:
    from .config import ModelConfig

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def iter_tensors(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor a model of this config stores, (name, shape), in a fixed order.

    A generator, so a reader can stop at the first tensor a file lacks instead of first listing
    all of them for a config that claims a billion layers.
    """
    d, q, kv, f = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    yield EMBED, (cfg.vocab, d)
    for i in range(cfg.n_layers):
        p = layer_prefix(i)
        yield p + "input_layernorm.weight", (d,)
        yield p + "self_attn.q_proj.weight", (q, d)
        yield p + "self_attn.k_proj.weight", (kv, d)
        yield p + "self_attn.v_proj.weight", (kv, d)
        if cfg.qkv_bias:
            yield p + "self_attn.q_proj.bias", (q,)
            yield p + "self_attn.k_proj.bias", (kv,)
            yield p + "self_attn.v_proj.bias", (kv,)
        yield p + "self_attn.o_proj.weight", (d, q)
        yield p + "post_attention_layernorm.weight", (d,)
        yield p + "mlp.gate_proj.weight", (f, d)
        yield p + "mlp.up_proj.weight", (f, d)
        yield p + "mlp.down_proj.weight", (d, f)
    yield FINAL_NORM, (d,)
    if not cfg.tied_embeddings:
        yield LM_HEAD, (cfg.vocab, d)


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config stores, name -> shape, in a fixed order."""
    return dict(iter_tensors(cfg))


class Model:
    """A config and its weights as bf16 words. Weights loaded from files may be read-only mmap views."""

    def __init__(self, config: ModelConfig, tensors: dict[str, np.ndarray], name: str, source: str):
        expected = expected_tensors(config)
        for tname, shape in expected.items():
            t = tensors.get(tname)
            require(t is not None, f"model {name}: missing tensor {tname}")
            require(t.dtype == np.uint16 and t.flags.c_contiguous,
                    f"model {name}: tensor {tname} must be C-contiguous uint16 bf16 words, got {t.dtype}")
            require(t.shape == shape, f"model {name}: tensor {tname} has shape {t.shape}, expected {shape}")
        extra = sorted(set(tensors) - set(expected))
        require(not extra, f"model {name}: unexpected tensor {extra[0] if extra else ''}")
        self.config = config
        self.tensors = dict(tensors)
        self.name = name
        self.source = source

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidArgumentError(f"model {self.name}: no tensor named {name}") from None

    def lm_head(self) -> np.ndarray:
        """The (vocab, dim) output projection: the embedding table when tied."""
        return self.tensors[EMBED] if self.config.tied_embeddings else self.tensors[LM_HEAD]

    def __repr__(self) -> str:
        return f"Model(name={self.name!r}, source={self.source!r}, n_params={self.config.n_params})"
