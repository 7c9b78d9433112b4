"""Engine: admit (batch 1), prefill, generate (streaming) and step(), over one DeviceOps.

Two paths produce tokens (docs/ARCHITECTURE.md, section 1):
- the device loop: bursts of graph launch, sampler (argmax, or a seeded draw) and commit,
  drained from the ring by BurstDriver with no host wait per token (admitted by gate.py);
- the host path: one forward, then the argmax (or the logits) to pinned memory, a poll until
  the stream is idle, and the token chosen on the host. It is the fallback and the path for
  verification.

Both draw a sampled token by arcpy.sampling's definition, from the seed and the position the
token will occupy, so a seed gives the same tokens on either path, across bursts and fallbacks.

The prompt goes through the model in one forward where the device has a prefill; its logits give
the first token, through the first burst's commit on the device loop (no host wait between prompt
and answer) or through the host's argmax or draw on the host path.

A burst may produce tokens the consumer of step() has not asked for yet: they are parked and
handed out by later step() calls. Parked tokens are not part of the sequence until handed out,
and they are cleared whenever a sequence finishes, is preempted, or falls back.

A prompt that begins with tokens an earlier prefill took prefills only the rest (prefix.py).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Iterable, Iterator, Mapping

from arcpy.devices.protocol import Counters, DeviceOps
from arcpy.devices.sequence import SequenceSpec
from arcpy.drafting import DraftMemory
from arcpy.errors import (
    ArcError,
    ContextLostError,
    DeviceFaultError,
    HangError,
    InvalidArgumentError,
    LoopFault,
)
from arcpy.loop import gate
from arcpy.loop.burst import BurstDriver
from arcpy.loop.constrain import Constrained, matcher_for
from arcpy.loop.host import HostPath
from arcpy.loop.prefix import PrefixCache
from arcpy.loop.plan import Plan, Settings, plan_sequence, sequence_spec, with_loop
from arcpy.loop.prompt import Piece, request_ids, request_stop_ids
from arcpy.loop.request import DEFAULT_MAX_NEW_TOKENS, Request
from arcpy.loop.sequence import SequenceState as _Sequence
from arcpy.loop.settings import EngineSettings
from arcpy.loop.speculate import StepCost, burst, speculation
from arcpy.loop.stats import DEVICE_LOOP, HOST, STOP_ID, FinishReason, GenerationStats
from arcpy.sampling import Sampler, Sampling
from arcpy.text import TextStream

class Engine(HostPath):
    """Decodes on one DeviceOps, as `settings` say (arcpy/loop/settings.py; None: the defaults).
    `environ` is where the gates are read (None: the process's environment), `latch` the fallback
    latch, `step_cost` the seconds a step of each kind takes, shared across sequences."""

    def __init__(self, device: DeviceOps, backend: str, settings: EngineSettings | None = None, *,
                 environ: Mapping[str, str] | None = None, latch: gate.FallbackLatch = gate.LATCH,
                 step_cost: StepCost | None = None):
        settings = EngineSettings() if settings is None else settings
        self.settings = settings
        self.device = device
        self.prefill = settings.prefill  # off: the prompt goes through the decode step token by token
        self.speculate = settings.speculate  # off: never a speculative step, even where the device has one
        self.step_cost = step_cost or StepCost()  # seconds a step of each kind takes, across sequences
        # Earlier sequences the drafts also come from (off: each sequence drafts from itself alone).
        self.memory = DraftMemory() if settings.draft_memory else None
        self.backend = backend
        self.burst = settings.burst
        self.environ = environ
        self.latch = latch
        self.device_loop = settings.device_loop
        # Every gate is read now, on every backend: a bad value is reported at start-up.
        gate.read_all(environ)
        verify = settings.verify
        if verify is None:
            verify = gate.read_flag(gate.VERIFY_ALWAYS, gate.DEFAULTS[gate.VERIFY_ALWAYS], environ)
        self.verify = verify
        self.max_spins = settings.max_spins
        self.driver = BurstDriver(device, settings.max_spins) if device.supports_loop else None
        self.parked: deque[int] = deque()
        self.pending_logprobs: deque = deque()  # the produced tokens' log-probabilities, in order
        self.logprob = None  # the last handed-out token's
        self.seq: _Sequence | None = None
        self.stats: GenerationStats | None = None
        self.poisoned: str | None = None
        self.path_reason = ""
        self._t0 = 0.0
        self._c0 = Counters()
        self.text = None  # the model's TextSpec (arcpy.text), for chat(); set by arcpy.backends.open_engine
        self.prefix = PrefixCache(settings.prefix_cache)  # .clear(): the next prompt is prefilled whole
        # A store of earlier prefixes in device memory: `prompt_cache_bytes` (None: the device's default).
        self.prefix.reserve(device, settings.prompt_cache_bytes)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the sequence and free the device (its GPU memory, its context)."""
        self._finish("cancelled")
        self.device.close()

    # -- admission and start ---------------------------------------------------------------

    def admit(self, batch_size: int) -> None:
        """Batch 1 only: a burst straddling sequences with different stop conditions is a
        problem this engine does not take on."""
        if batch_size != 1:
            raise InvalidArgumentError(f"batch size {batch_size} is not supported: arcpy decodes at batch 1")

    def start(self, prompt_ids: Iterable[int], max_new_tokens: int, stop_ids: Iterable[int] = (),
              sampling: Sampling | None = None, batch_size: int = 1, matcher=None, logprobs: int | None = None,
              logit_bias: tuple = ()) -> None:
        """Begin a sequence (begin(), with the SequenceSpec these arguments make); a sequence
        still running is preempted."""
        self._usable()
        self.admit(batch_size)
        self._finish("preempted")
        self._run(self.plan(sequence_spec(prompt_ids, max_new_tokens, stop_ids, sampling, matcher, logprobs,
                                          logit_bias)))

    def begin(self, spec: SequenceSpec) -> None:
        """Begin the sequence `spec` asks for; a sequence still running is preempted. The prompt
        goes through the model in one forward where the device has a prefill (unless the engine
        has EngineSettings.prefill False, or verifies every step), and its first token is drawn from
        that forward's logits: on the device loop by the first burst's commit, with no host wait
        between prompt and answer. Otherwise the prompt goes through the decode step one token at
        a time, again with no host wait between its steps. A matcher (arcpy.text.grammar)
        constrains the answer: each step's logits masked by it (arcpy.loop.constrain): on the
        device loop by the step itself, the host writing each next mask as the tokens land (a
        device with masks), else on the host path."""
        self._usable()
        self._finish("preempted")
        self._run(self.plan(spec))

    def plan(self, spec: SequenceSpec) -> Plan:
        """What `spec` runs as on this engine's device (arcpy/loop/plan.py); no device work."""
        dev = self.device
        settings = Settings(self.device_loop, self.verify, self.prefill, self.speculate, self.environ, self.latch)
        caps = with_loop(dev.capabilities, self.driver is not None)
        return plan_sequence(spec, caps, dev.vocab, dev.max_seq, settings)

    def _usable(self) -> None:
        if self.poisoned:
            raise DeviceFaultError(f"the GPU context is unusable: {self.poisoned}")

    def _run(self, plan: Plan) -> None:
        """Start `plan` on the device: the sequence's start in one begin_sequence (through the
        burst driver on the device loop), the prefix store's copies, then the prompt."""
        spec, dev = plan.spec, self.device
        prompt = list(spec.prompt)
        sampler = Sampler(spec.sampling)
        constrained = (spec.matcher and Constrained(spec.matcher, dev.vocab)) or None
        self.stats = GenerationStats(self.backend, DEVICE_LOOP if plan.loop else HOST, len(prompt),
                                     seed=None if sampler.greedy else sampler.params.seed)
        self.path_reason = plan.reason
        memory = self.memory.layout() if self.memory is not None else []
        policy = speculation(dev, plan.speculate, plan.loop, prompt, self.step_cost, self.stats, memory)
        granule = dev.capabilities.prefix_granule if plan.prefill else 0
        start = plan.device_start(None if sampler.greedy else sampler.params,
                                  None if policy is None else memory, restored=self.prefix.restores(prompt, granule))
        self._t0, self._c0 = time.perf_counter(), dev.counters()
        try:
            if plan.loop:
                self.driver.host_waits = 0
                self.driver.begin_sequence(start, self.pending_logprobs, constrained)
                self.stats.setup_waits = self.driver.host_waits
            else:
                dev.begin_sequence(start)
            cached = self.prefix.prepare(prompt, dev, granule)  # rows are rewritten from here
            if plan.prefill:
                dev.enqueue_prefill(prompt[cached:], cached)
                self.prefix.prefilled(prompt, cached, granule, dev)
                self.stats.cached_tokens = cached
            else:
                for i, tok in enumerate(prompt[:-1]):
                    dev.set_input(tok, i)
                    dev.enqueue_forward()
                if plan.loop:
                    dev.set_input(prompt[-1], len(prompt) - 1)
        except DeviceFaultError as exc:
            self._poison(str(exc))
            raise
        self.seq = _Sequence(prompt[-1], len(prompt) - 1, plan.max_new, frozenset(spec.stop_ids), sampler,
                             plan.loop, budget_reason=plan.budget_reason, prefilled=plan.prefill, policy=policy,
                             logprobs=spec.logprobs, bias=spec.logit_bias, bias_on_device=plan.bias_on_device,
                             constrained=constrained)
        self.stats.prefill = plan.prefill
        if self.seq.max_new == 0:
            self._finish(self.seq.budget_reason)

    # -- the ways to consume -----------------------------------------------------------------

    def stream(self, request: Request) -> Iterator[Piece]:
        """Answer `request` as it is produced: one Piece per token handed out, with the text that
        token made final (on the device loop, as each lands in the ring, while the rest of its
        burst is still running), then a Piece without a token for text held back to the end.
        A stop id ends the answer and is not handed out; no part of a stop string is shown.
        `stats.finish_reason` says why it ended."""
        return self._stream(request, decode=True)

    def generate(self, prompt, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, stop_ids: Iterable[int] = (),
                 sampling: Sampling | None = None) -> Iterator[int]:
        """Yield the answer's token ids as they are produced. `prompt` is a Request, or token ids
        (the other arguments then complete the request)."""
        request = prompt if isinstance(prompt, Request) else Request(
            prompt_ids=prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids, sampling=sampling or Sampling())
        for piece in self._stream(request, decode=bool(request.stop)):
            if piece.token is not None:
                yield piece.token

    def chat(self, messages, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, sampling: Sampling | None = None,
             stop=(), stop_ids: Iterable[int] = ()) -> Iterator[str]:
        """Answer `messages` (a Request, or dicts with "role" and "content"), rendered through the
        model's chat template: yield the answer's text as it becomes final."""
        request = messages if isinstance(messages, Request) else Request(
            messages=messages, max_new_tokens=max_new_tokens, stop_ids=stop_ids, stop=stop,
            sampling=sampling or Sampling())
        for piece in self.stream(request):
            if piece.text:
                yield piece.text

    def _stream(self, request: Request, decode: bool) -> Iterator[Piece]:
        if not isinstance(request, Request):
            raise InvalidArgumentError(f"expected an arcpy Request, got {type(request).__name__}")
        text = self.text
        ids = request_ids(text, request)
        stops = request_stop_ids(text, request)
        matcher = matcher_for(text, self.device.vocab, request)
        words = TextStream(text, request.stop) if decode and text is not None else None
        with contextlib.closing(self._tokens(ids, request.max_new_tokens, stops, request.sampling, matcher,
                                             request.logprobs, request.logit_bias)) as tokens:
            for tok in tokens:
                piece, hit = words.push(tok) if words is not None else ("", False)
                yield Piece(tok, piece, self.logprob)
                if hit:
                    self._finish(FinishReason.STOP_STRING)
                    return
        rest = words.finish() if words is not None else ""
        if rest:
            yield Piece(None, rest)

    def _tokens(self, prompt_ids: Iterable[int], max_new_tokens: int, stop_ids: Iterable[int],
                sampling: Sampling | None, matcher=None, logprobs: int | None = None,
                logit_bias=()) -> Iterator[int]:
        self.start(prompt_ids, max_new_tokens, stop_ids, sampling, matcher=matcher, logprobs=logprobs,
                   logit_bias=logit_bias)
        seq = self.seq
        reason = "cancelled"
        try:
            while not seq.finished:
                for tok in self._produce():
                    self.logprob = self.pending_logprobs.popleft() if self.pending_logprobs else None
                    if self._hand_out(tok):
                        yield tok
                    if seq.finished:
                        break
        except ArcError:
            reason = "fault"
            raise
        finally:
            if self.seq is seq:
                self._finish(reason)

    def step(self) -> int | None:
        """The next token of the current sequence, or None once it has finished (a stop id
        finishes it and is not handed out)."""
        seq = self.seq
        if seq is None or seq.finished:
            return None
        if not self.parked:
            try:
                for tok in self._produce():
                    self.parked.append(tok)
            except ArcError:
                self._finish("fault")
                raise
        tok = self.parked.popleft()
        return tok if self._hand_out(tok) else None

    def finish(self) -> None:
        """End the current sequence early (preemption by the caller)."""
        self._finish("cancelled")

    # -- producing tokens --------------------------------------------------------------------

    def _produce(self) -> Iterator[int]:
        """The tokens that follow the last handed-out one: one burst, or one host step. A loop
        failure with the context intact falls back to the host path; a lost context or a hang
        poisons the engine."""
        seq = self.seq
        try:
            if seq.loop:
                first_commit, seq.prefilled = seq.prefilled, False
                try:
                    yield from burst(self.driver, seq.policy, self.stats, self.step_cost, self.burst,
                                     seq.max_new - seq.produced, first_commit)
                    return
                except LoopFault as exc:
                    self._fall_back(str(exc))
            yield self._host_step()
        except (ContextLostError, HangError) as exc:
            self._poison(str(exc))
            raise

    # -- bookkeeping -------------------------------------------------------------------------

    def _hand_out(self, tok: int) -> bool:
        """Move the sequence past `tok`; False when it is a stop id, which ends the sequence and
        is not handed out."""
        seq = self.seq
        seq.last_token, seq.position = tok, seq.position + 1
        seq.produced += 1
        if tok in seq.stop_ids:
            self.stats.stop_id = tok
            self._finish(STOP_ID)
            return False
        if seq.produced >= seq.max_new:
            self._finish(seq.budget_reason)
        return True

    def _fall_back(self, reason: str) -> None:
        """The device loop failed with the context intact: latch it off for the process, drop
        what was parked (the host path recomputes from the last handed-out token; a grammar's
        matcher steps back over those tokens, and the steps in flight pass unmasked)."""
        self.latch.trip(reason)
        if self.driver.guide is not None:
            self.driver.release()
            self.seq.constrained.rollback(len(self.parked))
        self.parked.clear()
        self.seq.loop = False
        self.stats.fallback = reason
        self.stats.path = f"{DEVICE_LOOP}+{HOST}"

    def _poison(self, reason: str) -> None:
        self.poisoned = reason
        self.prefix.clear()
        self.latch.trip(reason)
        self._finish("fault")

    def _finish(self, reason: str) -> None:
        seq = self.seq
        if self.driver is not None:
            self.driver.release()  # a masked burst's steps still in flight must not wait for masks
        self.parked.clear()
        self.pending_logprobs.clear()
        if seq is None or seq.finished:
            return
        seq.finished = True
        if seq.policy is not None and self.memory is not None and reason != "fault":
            self.memory.remember(seq.policy.prompt, seq.policy.answer)
        st = self.stats
        st.finish_reason = reason
        st.tokens = seq.produced
        st.seconds = time.perf_counter() - self._t0
        try:
            c = self.device.counters() - self._c0
        except ArcError:
            c = Counters()
        st.graph_launches, st.cuda_calls = c.graph_launches, c.cuda_calls
