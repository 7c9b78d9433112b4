"""The CPU backend: DeviceOps over the NumPy reference forward (the host path without a GPU).

Work completes when it is enqueued, so the stream is always idle; there is no device loop.
"""

from __future__ import annotations

import numpy as np

from arcpy.devices.protocol import Counters
from arcpy.devices.reference import ReferenceModel


class NumpyDevice:
    supports_loop = supports_sampling = False
    supports_prefill = True
    # A prefill's rows do not depend on what else its chunk holds (tests/test_prefix_cache.py
    # checks the KV rows bit for bit): a prefix is reused to the token.
    prefix_granule = 1
    speculate_k = speculate_ngram = 0

    def __init__(self, reference: ReferenceModel):
        self.ref = reference
        self.vocab, self.max_seq = reference.config.vocab, reference.max_seq
        self.token, self.position = 0, 0
        self.logits = np.zeros(self.vocab, np.float32)

    def set_input(self, token: int, position: int) -> None:
        self.token, self.position = token, position

    def stream_query(self) -> bool:
        return True

    def counters(self) -> Counters:
        return Counters()

    def close(self) -> None:
        pass

    def enqueue_prefill(self, tokens, start: int) -> None:
        self.logits = self.ref.prefill(list(tokens), start)

    def enqueue_forward(self, eager: bool = False) -> None:
        self.logits = self.ref.forward(self.token, self.position)

    def enqueue_argmax(self) -> None:
        pass

    def enqueue_logits_to_host(self) -> None:
        pass

    def sampled(self) -> tuple[int, float]:
        token = int(np.argmax(self.logits))
        return token, float(self.logits[token])

    def host_logits(self) -> np.ndarray:
        return self.logits
