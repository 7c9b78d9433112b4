"""SmolLM3: the Llama layer, some layers without RoPE (every 4th by default)."""

from __future__ import annotations

from typing import Mapping

from arcpy.checks import is_int
from arcpy.errors import ModelFileError
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import Family
from arcpy.model.families.hf_values import integer

_NO_ROPE_EVERY = 4  # layers i with (i + 1) % 4 == 0 have no RoPE, as llama.cpp runs them


class SmolLM3(Family):
    name = "smollm3"
    hf_classes = ("SmolLM3ForCausalLM",)
    gguf_arch = "smollm3"
    gguf_permuted = True

    def holds(self, cfg: ModelConfig) -> bool:
        return bool(cfg.no_rope_layers)

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        """The layers without RoPE: the no_rope_layers list (1 rotates, 0 does not), else every
        no_rope_layer_interval-th layer (4 by default)."""
        flags = d.get("no_rope_layers")
        if flags is None:
            every = integer(d, "no_rope_layer_interval", source, _NO_ROPE_EVERY)
            if every <= 0:
                raise ModelFileError(f"{source}: key 'no_rope_layer_interval' must be positive, got {every}")
            return {"no_rope_layers": tuple(i for i in range(n_layers) if (i + 1) % every == 0)}
        if not isinstance(flags, list) or len(flags) < n_layers or not all(f in (0, 1) and is_int(f) for f in flags):
            raise ModelFileError(f"{source}: key 'no_rope_layers' must list 0 or 1 for each of the {n_layers} layers")
        return {"no_rope_layers": tuple(i for i in range(n_layers) if flags[i] == 0)}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d["no_rope_layers"] = [int(i not in cfg.no_rope_layers) for i in range(cfg.n_layers)]

    def gguf_fields(self, m, a: str, dims: tuple[int, int, int], window: int) -> dict:
        return {"no_rope_layers": tuple(i for i in range(m.integer(a + "block_count"))
                                        if (i + 1) % _NO_ROPE_EVERY == 0)}


SMOLLM3 = SmolLM3()
