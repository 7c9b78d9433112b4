"""What the host-side control logic may ask of a GPU: the DeviceOps protocol.

DeviceOps is what BurstDriver and Engine are written against. It has no synchronize method: the
logic above it cannot block on the stream because it is not given a way to. Completion is learnt
by polling: `stream_query()` (never blocks) and the ring (`poll_ring()`).

The devices that answer it live in modules of their own:
- arcpy.devices.cuda: libarc through cffi (a context, a loop, a forward captured into graphs);
- arcpy.devices.scripted: the same CudaDevice over libarc's scripted stand-in forward (loop tests);
- arcpy.devices.numpy_device: the NumPy reference forward, the host path on a machine without a GPU;
- arcpy.devices.fake: a scripted GPU for the control-logic tests, on a simulated clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from arcpy.codes import FAULT_NONE, MAX_STOP_IDS
from arcpy.devices.sequence import SequenceSpec, SequenceStart
from arcpy.errors import HangError
from arcpy.sampling import TokenLogprob


@dataclass(frozen=True)
class RingState:
    published: int
    fault: int = FAULT_NONE
    fault_token: int = 0
    fault_pos: int = 0
    stopped: int = 0
    steps: int = 0  # speculative steps whose commit ran since the ring was reset
    logprobs: int = 0  # log-probability entries written (at most `published`; SequenceStart.logprobs)


@dataclass(frozen=True)
class Counters:
    cuda_calls: int = 0
    graph_launches: int = 0

    def __sub__(self, other: "Counters") -> "Counters":
        return Counters(self.cuda_calls - other.cuda_calls, self.graph_launches - other.graph_launches)


@dataclass(frozen=True)
class Capabilities:
    """What a device can do, as the device states it: the only way the layers above it learn
    (a record, so that no caller asks a device with getattr). A device builds it from its state
    when asked: capturing a step graph, or closing, changes what it can do."""

    name: str                      # the device, in words: the GPU's name, or the CPU backend
    loop: bool = False             # the device loop: steps enqueued in bursts, tokens read from the ring
    sampling: bool = False         # the device loop draws non-greedy tokens (arcpy.sampling's definition)
    prefill: bool = False          # a prompt goes through the model in one forward (enqueue_prefill)
    graphs: bool = False           # the forward is replayed from captured CUDA graphs
    speculate_k: int = 0           # drafts a speculative step verifies (0: the device has no such step)
    speculate_ngram: int = 0       # the longest n-gram its draft looks up
    speculation_refused: str = ""  # why speculative steps were asked for and not captured
    memory_report: bool = False    # memory_report() says what the model takes on the device
    logprobs: bool = False         # log-probabilities of the chosen tokens land in the ring
    logit_bias: bool = False       # a logit bias is added on the device (SequenceStart.logit_bias)
    prefix_granule: int = 0        # a prefill may resume after an earlier one's rows at multiples of this (0: never)
    prefix_row_bytes: int = 0      # bytes a position's KV rows take in the prefix store (0: no store)
    prefix_state_bytes: int = 0    # bytes of the recurrent state a prefix needs at its end (0: none kept)
    masks: bool = False            # a token mask (constrained output) applies on the device

    def admits(self, spec: SequenceSpec) -> tuple[bool, str]:
        """(admitted, reason): whether this device's loop runs `spec`; the reason names the first
        thing it lacks. The environment's gates and the fallback latch are arcpy/loop/gate.py's."""
        if not self.loop:
            return False, "the backend has no captured graph (eager forward or CPU)"
        if not spec.sampling.is_greedy() and not self.sampling:
            return False, "non-greedy sampling: this backend's device loop has no sampler, only the argmax"
        if len(spec.stop_ids) > MAX_STOP_IDS:
            return False, f"{len(spec.stop_ids)} stop ids; the commit kernel holds at most {MAX_STOP_IDS}"
        if spec.logprobs is not None and not self.logprobs:
            return False, "log-probabilities: this device loop writes none"
        if spec.logit_bias and not self.logit_bias:
            return False, "logit_bias: this device loop adds none"
        if spec.matcher is not None and not self.masks:
            return False, "constrained output: this device loop applies no token mask"
        return True, "admitted"


class DeviceOps(Protocol):
    vocab: int
    max_seq: int
    capabilities: Capabilities  # what follows, as one record, for the layers above
    supports_loop: bool
    supports_sampling: bool  # the device loop can draw non-greedy tokens (arcpy.sampling's definition)
    supports_prefill: bool   # a prompt can go through the model in one forward (enqueue_prefill)
    prefix_granule: int      # a prefill may resume after rows of an earlier one at multiples of this (0: never)
    speculate_k: int         # drafts a speculative step verifies (0: the device has no such step)
    speculate_ngram: int     # the longest n-gram its draft looks up

    # Both paths
    def set_input(self, token: int, position: int) -> None: ...  # what the next forward reads
    def stream_query(self) -> bool: ...  # True when idle; raises DeviceFaultError on a fault
    def counters(self) -> Counters: ...
    def close(self) -> None: ...
    # A sequence's start, one call (arcpy/devices/sequence.py says what and in which order): False,
    # with nothing written, while steps are in flight and `start.loop` asks for the ring's reset.
    # Stream-ordered: steps enqueued later draw with its parameters.
    def begin_sequence(self, start: SequenceStart) -> bool: ...
    # The forward over `tokens` at positions start.., all at once: the KV cache written for each,
    # the logits of the last left where the host path and the commit read them. Stream-ordered.
    # With speculative steps, the tokens also go into the drafts' history.
    def enqueue_prefill(self, tokens: Sequence[int], start: int) -> None: ...
    # The same from position 0 (capabilities.prefill), with every token after the first scored:
    # its log-probability given the row before it and `top_n` alternatives, as a step's; read by
    # read_prompt_logprobs once the stream is idle.
    def enqueue_prompt_logprobs(self, tokens: Sequence[int], top_n: int) -> None: ...
    def read_prompt_logprobs(self) -> list[TokenLogprob]: ...

    # Host path. `bias`: the sequence's logit bias (capabilities.logit_bias) is added to the
    # forward's logits first.
    def enqueue_forward(self, eager: bool = False) -> None: ...
    def enqueue_argmax(self, bias: bool = False) -> None: ...
    def enqueue_logits_to_host(self, bias: bool = False) -> None: ...
    def sampled(self) -> tuple[int, float, float]: ...  # the argmax, its logit, the smallest logit, once idle
    def host_logits(self) -> np.ndarray: ...

    # Device loop
    def enqueue_step(self, burst_id: int) -> None: ...
    # A step of burst `burst_id` without its forward: the sampler and the commit on the logits a
    # prefill left, so the prompt's next token lands in the ring like every other.
    def enqueue_commit(self, burst_id: int) -> None: ...
    # The commits enqueued after this belong to burst `burst_id`, which publishes at most
    # `max_tokens` tokens.
    def begin_burst(self, burst_id: int, max_tokens: int) -> None: ...
    # Speculative steps (speculate_k > 0; greedy, or drawn with the sequence's sampling): the
    # drafts look up the history (the prefill's tokens, SequenceStart.history, the commits') and
    # the memory of earlier sequences (arcpy.drafting.DraftMemory.layout(), kept across sequences).
    def enqueue_spec_step(self, burst_id: int) -> None: ...
    def poll_ring(self) -> RingState: ...
    def read_ring(self, first: int, count: int) -> list[int]: ...
    # Log-probabilities in the loop (capabilities.logprobs, SequenceStart.logprobs): later steps
    # write each token's entry beside it; read once RingState.logprobs covers them.
    supports_logprobs: bool
    supports_logit_bias: bool
    def read_logprobs(self, first: int, count: int) -> list[TokenLogprob]: ...
    # Token masks on the device (capabilities.masks, SequenceStart.masked: the masked step graphs).
    # write_mask(n, words) gives the mask of the sequence's token n (n tokens published so far;
    # int32 words, bit i % 32 of word i / 32 allows id i); a masked step waits on the device for
    # it. release_masks() lets every step in flight pass unmasked: a sequence abandoned mid-burst.
    def write_mask(self, n: int, words) -> None: ...
    def release_masks(self) -> None: ...


def spin_until(ready: Callable[[], bool], max_spins: int, what: str) -> int:
    """Poll `ready` until it returns True; the number of polls that said no. A host wait: used at
    start-up, at a sequence's start and on the host path, never per token of the device loop.
    Raises HangError after `max_spins` polls that said no."""
    for spins in range(max_spins):
        if ready():
            return spins
    raise HangError(f"{what}: no progress in {max_spins} polls")
