"""The host path's step (Engine's, arcpy/loop/engine.py): one forward, then the argmax (or the
logits) to pinned memory, a poll until the stream is idle, and the token chosen on the host; with
ARC_GRAPH_VERIFY_ALWAYS, the replayed graph checked against the eager forward at every step. Also
the prompt's own log-probabilities (an echoed prompt's), from one prefill."""

from __future__ import annotations

import numpy as np

from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.devices.protocol import spin_until
from arcpy.errors import DegenerateLogitsError, DeviceFaultError, InvalidArgumentError, NonFiniteLogitsError
from arcpy.loop.prompt import check_prompt
from arcpy.sampling import TokenLogprob, token_logprob


class HostPath:
    """What Engine does on the host path; it reads the engine's `seq`, `device`, `stats`,
    `verify`, `pending_logprobs` and `max_spins`."""

    def _host_step(self) -> int:
        seq, dev = self.seq, self.device
        self.stats.weight_reads += 1
        if seq.prefilled:
            seq.prefilled = False  # the prefill left this step's logits
        else:
            dev.set_input(seq.last_token, seq.position)
            dev.enqueue_forward()
        bias = seq.bias_on_device  # the device adds the logit bias before the logits are read
        if seq.constrained is not None:  # the mask is computed while the forward runs
            dev.enqueue_logits_to_host(bias)
            seq.constrained.fill()
            self._wait_idle()
            logits = self._biased(dev.host_logits())
            tok = seq.constrained.consume(self._drawn(logits, seq.constrained))
        elif self.verify:
            tok, logits = self._verified_token()
        elif seq.sampler.greedy and seq.logprobs is None and not (seq.bias and not seq.bias_on_device):
            dev.enqueue_argmax(bias)
            self._wait_idle()
            tok, value, low = dev.sampled()
            self._require_usable(value, low)
        else:
            dev.enqueue_logits_to_host(bias)
            self._wait_idle()
            logits = self._biased(dev.host_logits())
            tok = self._drawn(logits)
        if seq.logprobs is not None:  # from the logits on the host, as the loop's from its own
            self.pending_logprobs.append(token_logprob(logits[:dev.vocab], tok, seq.logprobs))
        return self._checked(tok)

    def prompt_logprobs(self, prompt_ids, top_n: int) -> list[TokenLogprob]:
        """Each prompt token's log-probability given the tokens before it, with its `top_n`
        likeliest alternatives, from the model's raw logits as a step's are: one entry per token
        after the first (which has none). The prompt goes through the device's prefill from
        position 0, which also ranks every row's logits (on a GPU in the same kernels as the
        loop's log-probabilities), then one host wait: for an echoed prompt, not for decoding. Its
        KV rows are a cold prefill's, so the prefix cache holds them for the request after."""
        if self.poisoned:
            raise DeviceFaultError(f"the GPU context is unusable: {self.poisoned}")
        if not (isinstance(top_n, int) and 0 <= top_n <= MAX_TOP_LOGPROBS):
            raise InvalidArgumentError(f"top_n must be an integer in 0..{MAX_TOP_LOGPROBS}, got {top_n!r}")
        dev, prompt = self.device, [int(t) for t in prompt_ids]
        if not 1 <= len(prompt) <= dev.max_seq:
            raise InvalidArgumentError(f"a prompt of {len(prompt)} tokens to score: give 1 to max_seq {dev.max_seq}")
        check_prompt(prompt, dev.vocab, len(prompt) + 1)  # its ids; the length was checked above
        caps = dev.capabilities
        if not caps.prefill:
            raise InvalidArgumentError(f"{caps.name} has no prefill to score a prompt with")
        self._finish("preempted")
        if len(prompt) == 1:
            return []
        self.prefix.prepare(prompt, dev, caps.prefix_granule)  # the held rows are stored before they go
        dev.enqueue_prompt_logprobs(prompt, top_n)
        spin_until(dev.stream_query, self.max_spins, "prompt log-probabilities: waiting for the prefill")
        self.prefix.rewritten(prompt, caps.prefix_granule, dev)
        return dev.read_prompt_logprobs()

    def _biased(self, logits: np.ndarray) -> np.ndarray:
        """The logits with the request's bias added on the host, where the device did not add it."""
        if self.seq.bias and not self.seq.bias_on_device:
            ids, values = zip(*self.seq.bias)
            logits[list(ids)] += np.asarray(values, dtype=np.float32)
        return logits

    def _drawn(self, logits: np.ndarray, constrained=None) -> int:
        """The host's draw from the forward's logits: the valid ids only (a padded lm_head is
        wider), for the position the token will occupy, as the device loop draws it. The logits are
        checked whole, so a mask neither hides a NaN nor makes the ids it allows look flat; with
        `constrained`, the draw is over the ids it allows (an index of them)."""
        valid = logits[:self.device.vocab]
        self._require_usable(valid.max(), valid.min())
        if constrained is not None:
            valid = constrained.masked(valid)
        return self.seq.sampler.sample(valid, self.seq.position + 1)

    def _require_usable(self, top_logit, low_logit) -> None:
        """As the commit checks the logits: the largest (NaN counts as largest) must be finite
        (no NaN anywhere, no +inf, not all -inf), and must differ from the smallest."""
        if not np.isfinite(top_logit):
            raise NonFiniteLogitsError(self.seq.position, "host path")
        if top_logit == low_logit and self.device.vocab > 1:
            raise DegenerateLogitsError(self.seq.position, "host path")

    def _verified_token(self) -> tuple[int, np.ndarray]:
        """ARC_GRAPH_VERIFY_ALWAYS: the replayed graph and the eager forward must write the
        same logits, bit for bit, at every step. The token, and the logits it came from."""
        seq, dev = self.seq, self.device
        dev.enqueue_logits_to_host()
        self._wait_idle()
        replayed = dev.host_logits()
        dev.set_input(seq.last_token, seq.position)
        dev.enqueue_forward(eager=True)
        dev.enqueue_logits_to_host()
        self._wait_idle()
        eager = dev.host_logits()
        if not np.array_equal(replayed, eager, equal_nan=True):
            diff = float(np.nanmax(np.abs(replayed.astype(np.float64) - eager)))
            raise DeviceFaultError(
                f"graph replay and eager forward disagree at position {seq.position}: max |diff| {diff:.3g}")
        replayed = self._biased(replayed)
        if not seq.sampler.greedy:
            return self._checked(self._drawn(replayed)), replayed
        self._require_usable(replayed.max(), replayed[:self.device.vocab].min())
        return self._checked(seq.sampler.sample(replayed, seq.position + 1)), replayed

    def _checked(self, tok: int) -> int:
        if not 0 <= tok < self.device.vocab:
            raise DeviceFaultError(
                f"host path: token {tok} at position {self.seq.position + 1} is outside the vocabulary "
                f"[0, {self.device.vocab})")
        return tok

    def _wait_idle(self) -> None:
        self.stats.host_waits += 1
        spin_until(self.device.stream_query, self.max_spins, "host path: waiting for the forward")
