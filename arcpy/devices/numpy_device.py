"""The CPU backend: DeviceOps over the NumPy reference forward (the host path without a GPU).

Work completes when it is enqueued, so the stream is always idle; there is no device loop.
"""

from __future__ import annotations

import numpy as np

from arcpy.devices.protocol import Capabilities, Counters
from arcpy.devices.reference import ReferenceModel
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import InvalidArgumentError
from arcpy.sampling import TokenLogprob, token_logprob

PREFILL_CHUNK = 64  # prompt tokens a pass of the prefill takes


class HostPathDevice:
    """DeviceOps of the host path alone, for a forward on the host: work completes when it is
    enqueued, so the stream is always idle and the logits are already the host's. A subclass
    writes `self.logits` in `enqueue_prefill` and `enqueue_forward`."""

    supports_loop = supports_sampling = False
    supports_prefill = True
    prefix_granule = 0
    speculate_k = speculate_ngram = 0

    def __init__(self, vocab: int, max_seq: int):
        self.vocab, self.max_seq = vocab, max_seq
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

    def begin_sequence(self, start: SequenceStart) -> bool:
        """No loop, no logit bias, no drafts: only the input."""
        if start.input is not None:
            self.set_input(*start.input)
        return True

    def enqueue_argmax(self, bias: bool = False) -> None:
        pass

    def enqueue_logits_to_host(self, bias: bool = False) -> None:
        pass

    def sampled(self) -> tuple[int, float, float]:
        token = int(np.argmax(self.logits))
        return token, float(self.logits[token]), float(self.logits.min())

    def host_logits(self) -> np.ndarray:
        return self.logits


class NumpyDevice(HostPathDevice):
    # The prefill goes chunk by chunk (chunks start at multiples of PREFILL_CHUNK): NumPy's products
    # may sum a row in another order when the row count differs, so a prefix is reused in whole
    # chunks, and a prefill that resumes after them runs the very chunks a cold one runs.
    prefix_granule = PREFILL_CHUNK

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities("CPU (NumPy reference backend)", prefill=True, prefix_granule=self.prefix_granule,
                            prefix_row_bytes=self.prefix_row_bytes, prefix_state_bytes=self.prefix_state_bytes)

    def __init__(self, reference: ReferenceModel, prefill_progress=None):
        super().__init__(reference.config.vocab, reference.max_seq)
        self.ref = reference
        self.prefill_progress = prefill_progress  # progress(chunks done, chunks) as a prefill goes, or None
        k = reference.k_cache
        self.prefix_row_bytes = 2 * k.shape[0] * k.shape[1] * k.shape[3] * k.itemsize  # a position's k and v rows
        self.store = np.zeros(0, k.dtype)  # the store of earlier prefixes (reserve_prefix_store)
        # The DeltaNet layers' states (float32, as the store holds them), and the copy of them a
        # prefill took at the end of its last whole chunk: (position, flat floats), or None.
        self.prefix_state_bytes = 4 * sum(st.conv.size + st.s.size for st in reference.deltanet_state.values())
        self._checkpoint: tuple[int, np.ndarray] | None = None
        self.scored: list[TokenLogprob] = []  # what enqueue_prompt_logprobs computed

    # The store of earlier prefixes (arcpy/loop/prefix.py): here host memory, a copy per prefix.
    def default_prefix_store_bytes(self) -> int:
        # Only when asked for (the host's memory is not spare the way a GPU's is), but for the
        # held prefix's state, without which a recurrent model reuses nothing.
        return self.prefix_state_bytes

    def reserve_prefix_store(self, nbytes: int) -> int:
        self.store = np.zeros(nbytes // self.ref.k_cache.itemsize, self.ref.k_cache.dtype)
        return nbytes

    def _stored(self, offset: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        # As the GPU's store lays them out: k then v, (layer, head, the n saved positions, head_dim).
        shape = (*self.ref.k_cache.shape[:2], n, self.ref.k_cache.shape[3])
        at, size = offset // self.ref.k_cache.itemsize, int(np.prod(shape))
        return self.store[at:at + size].reshape(shape), self.store[at + size:at + 2 * size].reshape(shape)

    def save_prefix(self, offset: int, n: int) -> None:
        k, v = self._stored(offset, n)
        k[...], v[...] = self.ref.k_cache[:, :, :n], self.ref.v_cache[:, :, :n]

    def load_prefix(self, offset: int, n: int, saved: int) -> None:
        k, v = self._stored(offset, saved)
        self.ref.k_cache[:, :, :n], self.ref.v_cache[:, :, :n] = k[:, :, :n], v[:, :, :n]

    def save_state(self, offset: int, position: int) -> None:
        if self._checkpoint is None or self._checkpoint[0] != position:
            raise InvalidArgumentError(f"no state was kept at position {position} (the last prefill's whole chunks)")
        flat = self._checkpoint[1]
        self.store[offset // 4:offset // 4 + flat.size] = flat

    def load_state(self, offset: int, position: int) -> None:
        at = offset // 4
        for st in self.ref.deltanet_state.values():
            for part in (st.conv, st.s):
                part[...] = self.store[at:at + part.size].reshape(part.shape)
                at += part.size
            st.position = position

    def move_stored(self, to: int, source: int, nbytes: int) -> None:
        self.store[to // 4:(to + nbytes) // 4] = self.store[source // 4:(source + nbytes) // 4].copy()

    def _prefill(self, tokens: list[int], start: int, every_row: bool = False) -> np.ndarray:
        """ReferenceModel.prefill in PREFILL_CHUNK chunks; with DeltaNet layers it stops at the
        last whole chunk's end to copy their states (the checkpoint save_state stores), which
        changes no bits: the chunks are the same."""
        if not self.ref.deltanet_state:
            return self.ref.prefill(tokens, start, chunk=PREFILL_CHUNK, every_row=every_row,
                                    progress=self.prefill_progress)
        end = (start + len(tokens)) // PREFILL_CHUNK * PREFILL_CHUNK
        out = []
        for i, (part, at) in enumerate([(tokens[:end - start], start), (tokens[end - start:], end)]):
            if part:
                out.append(self.ref.prefill(part, at, chunk=PREFILL_CHUNK, every_row=every_row,
                                            progress=self.prefill_progress))
            if i == 0:  # the states at `end`
                states = [x for st in self.ref.deltanet_state.values() for x in (st.conv.ravel(), st.s.ravel())]
                self._checkpoint = (end, np.concatenate(states))
        return np.concatenate(out) if every_row else out[-1]

    def enqueue_prefill(self, tokens, start: int) -> None:
        self.logits = self._prefill(list(tokens), start)

    def enqueue_prompt_logprobs(self, tokens, top_n: int) -> None:
        """The prefill of `tokens` from position 0, in the chunks a cold prefill takes, and each
        token after the first scored against the row before it (float64, as a step's)."""
        rows = self._prefill(list(tokens), 0, every_row=True)
        self.logits = rows[-1]
        self.scored = [token_logprob(rows[i], tokens[i + 1], top_n) for i in range(len(tokens) - 1)]

    def read_prompt_logprobs(self) -> list[TokenLogprob]:
        return self.scored

    def enqueue_forward(self, eager: bool = False) -> None:
        self.logits = self.ref.forward(self.token, self.position)
