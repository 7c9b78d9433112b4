"""Model: a config and its weights, under the names of the config's tensor table."""

from __future__ import annotations

import numpy as np

from arcpy.checks import require
from arcpy.errors import InvalidArgumentError
from arcpy.model.config import EMBED, LM_HEAD, ModelConfig, expected_tensors


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
