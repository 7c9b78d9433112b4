"""The GPU device: libarc through cffi.

Start-up is one sequence, `open_cuda_device`: a context, the weights validated and uploaded, the
loop's state, one warm-up forward, the graphs captured. What it creates has one owner: the
CudaDevice frees the graphs, the loop, the forward and (when it created it) the context on
`close()`, and is a context manager.

- Context (context.py): one device, one non-blocking stream (arc_context).
- CudaModel (cuda_model.py): a forward on a context: one model's weights, KV cache, activations.
- CudaDevice: DeviceOps over a forward, with the host path, the device loop (greedy, and sampled
  by libarc's draw), the prefix store (kv_store.py), a prompt's scoring (prompt_scores.py) and the
  drafts' history and memory (draft_staging.py).
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from arcpy import _lib
from arcpy.codes import MAX_TOP_LOGPROBS, RING_CAPACITY
from arcpy.devices.context import IDLE_SPINS, Context
from arcpy.devices.cuda_model import CudaModel, check_kv_cache, check_supported
from arcpy.devices.draft_staging import DraftStaging
from arcpy.devices.kv_store import KVStore
from arcpy.devices.mask_block import MaskBlock
from arcpy.devices.prompt_scores import PromptScores
from arcpy.devices.protocol import Capabilities, Counters, RingState, spin_until
from arcpy.devices.sequence_writes import SequenceWrites
from arcpy.drafting import DEFAULT_DRAFTS
from arcpy.errors import InvalidArgumentError
from arcpy.model import Model
from arcpy.sampling import TokenLogprob, logprob_entries


class Forward(Protocol):
    """What CudaDevice needs of a forward: enqueue it, and where its logits are. A forward with
    `supports_prefill` also takes a prompt in one pass."""

    logits: object   # device pointer to float32 logits[width]
    width: int
    max_seq: int
    supports_prefill: bool

    def enqueue(self, loop) -> None: ...  # one forward reading the loop's token and position
    def enqueue_greedy(self, loop) -> None: ...  # the forward, then the argmax committed to the loop
    def prefill(self, tokens, n: int, start: int) -> None: ...  # tokens: a device-readable int32 pointer
    def score(self, tokens, n: int, vocab: int, top_n: int, logprob, top_ids, top_values) -> None: ...
    def close(self) -> None: ...


class CudaDevice(KVStore, PromptScores, DraftStaging, SequenceWrites):
    """DeviceOps over a forward on a context. The host path replays the forward's graph (or
    enqueues it eagerly); the device loop replays a step graph: the forward, then the argmax whose
    last block commits (greedy), or the draw whose deciding thread commits (sampled, with the
    parameters of the sequence's start, sequence_writes.py). The device owns the forward, and the context when
    `owns_context`."""

    def __init__(self, ctx: Context, forward: Forward, vocab: int | None = None,
                 ring_capacity: int = RING_CAPACITY, owns_context: bool = False):
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        self.forward = forward
        self.owns_context = owns_context
        self.loop = self.graph = self.step_graph = self.draw_graph = self.spec_graph = self.spec_draw_graph = None
        # The step graphs by (draw, log-probabilities, logit bias, mask); all False is step_graph.
        self.steps: dict[tuple[bool, bool, bool, bool], object] = {}
        self.supports_loop = self.supports_sampling = self.supports_logprobs = self.supports_masks = False
        self._masking, self._mask = False, None  # SequenceStart.masked chose the masked step graphs; the MaskBlock
        self.supports_logit_bias = True  # on the host path an eager kernel; the loop's graphs in capture()
        self._top_logprobs, self._bias = None, False  # SequenceStart.logprobs (None: off); its bias gave pairs
        self.speculate_k, self.speculate_ngram, self.speculation_refused = 0, 0, ""  # refused: why not captured
        self.supports_prefill = forward.supports_prefill
        # A prefill row's bits do not depend on the chunk it is computed in (every product's row is
        # the same at any row count, attention walks its keys in tiles at fixed positions:
        # tests/test_gpu_prefill_rows.py), so a prefill may resume at any position; docs/USAGE.md, Prefix reuse.
        # A DeltaNet layer's state resumes from a copy of it (save_state, load_state).
        self.prefix_granule = 1 if self.supports_prefill else 0
        planes, runs = getattr(forward, "kv_planes", ()), getattr(forward, "kv_runs", ())
        head_dim = getattr(forward, "kv_head_dim", 1)
        self.prefix_row_bytes = (sum(row * hd // head_dim for _, row, _ in planes for hd in runs)
                                 if self.prefix_granule else 0)  # a position's KV bytes
        _, layers, _, floats = getattr(forward, "state", (None, 0, 0, 0))
        self.prefix_state_bytes = layers * floats * 4 if self.prefix_granule else 0  # the states at a position
        self._store = None  # the store of earlier prefixes (device memory; reserve_prefix_store)
        self._scores = self._scored = None  # enqueue_prompt_logprobs's arrays, and what it last scored
        self._drawing = False  # SequenceStart.sampling chose the sampled step graph
        # stream_query() saw the stream idle after the last enqueue; a prefill may still read the pinned prompt
        self._idle = self._prompt_in_use = False
        self._memory, self._memory_sent, self._memory_in_use = None, None, False  # DraftStaging's
        self.name = ""
        try:
            self.name = ctx.name()  # kept: the capabilities still name the GPU once the context is closed
            vocab = forward.width if vocab is None else vocab
            if not 0 < vocab <= forward.width:
                raise InvalidArgumentError(f"vocab {vocab} must be in 1..{forward.width} (the logits' width)")
            self.vocab, self.max_seq = vocab, forward.max_seq
            pp = self.ffi.new("arc_loop **")
            _lib.check(self.lib.arc_loop_create(ctx.ptr, vocab, self.max_seq, ring_capacity, pp))
            self.loop = pp[0]
            self._host_logits, _ = ctx.pinned((forward.width,), np.float32)
            self._sampled, self._sampled_dev = ctx.pinned((1,), np.int32)
            self._sampled_value, self._sampled_value_dev = ctx.pinned((2,), np.float32)  # the argmax's, the smallest
            self._tokens = self.ffi.new("int32_t[]", ring_capacity)
            top = ring_capacity * MAX_TOP_LOGPROBS
            self._lp = (self.ffi.new("float[]", ring_capacity), self.ffi.new("int32_t[]", top), self.ffi.new("float[]", top))
            if self.supports_prefill:
                prompt, prompt_dev = ctx.pinned((self.max_seq,), np.int32)
                self._prompt, self._prompt_dev = prompt, self.ffi.cast("int32_t *", prompt_dev)
            self._state = self.ffi.new("arc_ring_state *")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "CudaDevice":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- start-up ----------------------------------------------------------------------------

    def warm_up(self) -> None:
        """One forward outside any capture: the first launches load the kernels' modules."""
        self.set_input(0, 0)
        self.forward.enqueue(self.loop)
        self.ctx.wait_idle()

    def capture(self) -> None:
        """The host path's graph (the forward) and the device loop's: forward + argmax-and-commit
        (the forward's `enqueue_greedy`), and forward + draw-and-commit where the draw holds the
        vocabulary."""
        fwd = self.forward
        self.graph = self._capture(lambda: fwd.enqueue(self.loop))
        most = self.ffi.new("int32_t *")
        _lib.check(self.lib.arc_sample_max_vocab(self.ctx.ptr, most))
        draws = (False, True) if self.vocab <= most[0] else (False,)
        # Steps with the log-probabilities, a logit bias or a mask are captured apart, so that a
        # sequence without them runs the plain graphs unchanged.
        _lib.check(self._begin(top_logprobs=0))  # allocates the log-probability ring, outside any capture
        self._mask = MaskBlock(self.ffi, self.lib, self.loop, self.vocab)
        flags = (False, True)
        for key in ((d, lp, b, m) for d in draws for lp in flags for b in flags for m in flags):
            self.steps[key] = self._capture(lambda: self._enqueue_step_graph(*key))
        self.step_graph, self.draw_graph = self.steps[False, False, False, False], self.steps.get((True, False, False, False))
        self.supports_loop = self.supports_logprobs = self.supports_masks = True
        self.supports_sampling = True in draws

    def _enqueue_step_graph(self, draw: bool, logprobs: bool, bias: bool, mask: bool) -> None:
        """What a step graph holds: the forward, the logit bias, the mask, the sampler and its
        commit (the greedy step's argmax inside the lm_head's kernel where nothing comes between),
        then the log-probabilities of the token it published."""
        fwd = self.forward
        if not (draw or bias or mask):
            fwd.enqueue_greedy(self.loop)
        else:
            fwd.enqueue(self.loop)
            self._enqueue_sampler(draw, bias, mask)
        if logprobs:
            _lib.check(self.lib.arc_loop_enqueue_logprobs(self.loop, fwd.logits, fwd.width))

    def capture_speculation(self, k: int, ngram: int) -> None:
        """The speculative steps' graphs: draft, verify forward of k + 1 rows, accept and commit,
        greedy and (where the loop draws) sampled. Refused (InvalidArgumentError) by a forward
        without one, or with quantized weights."""
        fwd = self.forward
        if not hasattr(fwd, "enqueue_speculate"):
            raise InvalidArgumentError("this device's forward has no speculative step")
        fwd.reserve_speculation(k)
        self._reserve_draft_memory()
        self.spec_graph = self._capture(lambda: fwd.enqueue_speculate(self.loop, ngram))
        if self.supports_sampling:
            self.spec_draw_graph = self._capture(lambda: fwd.enqueue_speculate(self.loop, ngram, draw=True))
        self.speculate_k, self.speculate_ngram = k, ngram

    def _capture(self, enqueue: Callable[[], None]):
        _lib.check(self.lib.arc_graph_capture_begin(self.ctx.ptr))
        try:
            enqueue()
        finally:
            gp = self.ffi.new("arc_graph **")
            status = self.lib.arc_graph_capture_end(self.ctx.ptr, gp)
        _lib.check(status)
        return gp[0]

    # -- both paths ---------------------------------------------------------------------------

    def stream_query(self) -> bool:
        idle = self.ctx.query()
        if idle:
            self._idle = True
            self._prompt_in_use = self._memory_in_use = False
        return idle

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(self.name, loop=self.supports_loop, sampling=self.supports_sampling,
                            prefill=self.supports_prefill, graphs=self.graph is not None,
                            speculate_k=self.speculate_k, speculate_ngram=self.speculate_ngram,
                            speculation_refused=self.speculation_refused, memory_report=True,
                            logprobs=self.supports_logprobs, logit_bias=self.supports_logit_bias,
                            prefix_granule=self.prefix_granule, prefix_row_bytes=self.prefix_row_bytes,
                            prefix_state_bytes=self.prefix_state_bytes,
                            masks=self.supports_masks)

    def memory_report(self) -> str:
        """One line: what the model takes on the device and what is left."""
        gb = 1e9
        free, total = self.ctx.memory()
        parts = self.forward.memory() if hasattr(self.forward, "memory") else None
        form = getattr(self.forward, "kv_cache", "bf16")
        held = "" if parts is None else (f"weights {parts[0] / gb:.2f} GB, KV cache {parts[1] / gb:.2f} GB ({form}), "
                                         f"activations {parts[2] / gb:.2f} GB; ")
        return f"on {self.ctx.name()}: {held}{free / gb:.1f} of {total / gb:.1f} GB left"

    def counters(self) -> Counters:
        return self.ctx.counters()

    # -- host path ----------------------------------------------------------------------------

    def _require_idle(self, what: str) -> None:
        # The forward's logits are overwritten by the next launch: what the host reads must come
        # from work that has retired, never from steps still in flight.
        if not self._idle:
            raise InvalidArgumentError(
                f"{what} is read only once stream_query() reports the stream idle; work is in flight")

    def enqueue_prefill(self, tokens, start: int) -> None:
        """The prompt in one forward (chunk by chunk), reading its ids from pinned memory. They are
        rewritten only once no earlier prefill can still read them: the stream was seen idle since
        the last one (at a sequence's start it has been: the ring reset or the host path's last
        step waited for it), else this waits for it."""
        if not self.supports_prefill:
            raise InvalidArgumentError("this device's forward has no prefill")
        n = len(tokens)
        if not (n >= 1 and 0 <= start and start + n <= self.max_seq):
            raise InvalidArgumentError(f"a prefill of {n} tokens at position {start} does not fit max_seq "
                                       f"{self.max_seq}")
        self._stage_prompt(tokens)
        self.forward.prefill(self._prompt_dev, n, start)
        if self.speculate_k:  # the prompt is the history the drafts are looked up in
            _lib.check(self._begin(history=(self._prompt_dev, n), history_start=start))

    def _stage_prompt(self, tokens) -> None:
        if self._prompt_in_use:
            spin_until(self.stream_query, IDLE_SPINS, "prefill: waiting for the previous prompt's forward")
        self._prompt[:len(tokens)] = tokens
        self._idle = False
        self._prompt_in_use = True

    def enqueue_forward(self, eager: bool = False) -> None:
        self._idle = False
        if self.graph is not None and not eager:
            _lib.check(self.lib.arc_graph_launch(self.graph))
        else:
            self.forward.enqueue(self.loop)

    def enqueue_argmax(self, bias: bool = False) -> None:
        if bias:
            self._enqueue_logit_bias()
        self._idle = False
        _lib.check(self.lib.arc_argmax(self.ctx.ptr, self.forward.logits, self.forward.width,
                                       self._sampled_dev, self._sampled_value_dev,
                                       self.ffi.cast("float *", self._sampled_value_dev) + 1))

    def sampled(self) -> tuple[int, float, float]:
        self._require_idle("the sampled token")
        return int(self._sampled[0]), float(self._sampled_value[0]), float(self._sampled_value[1])

    def enqueue_logits_to_host(self, bias: bool = False) -> None:
        if bias:
            self._enqueue_logit_bias()
        self._idle = False
        self.ctx.download_async(self._host_logits, self.forward.logits)

    def host_logits(self) -> np.ndarray:
        self._require_idle("the logits")
        return self._host_logits.copy()

    # -- device loop --------------------------------------------------------------------------

    def _enqueue_logit_bias(self) -> None:
        self._idle = False
        _lib.check(self.lib.arc_loop_enqueue_logit_bias(self.loop, self.forward.logits, self.forward.width))

    def read_logprobs(self, first: int, count: int) -> list[TokenLogprob]:
        lp, ids, values = self._lp
        _lib.check(self.lib.arc_ring_read_logprobs(self.loop, first, count, lp, ids, values))
        width = count * MAX_TOP_LOGPROBS
        return logprob_entries(self.ffi.unpack(lp, count), self.ffi.unpack(ids, width), self.ffi.unpack(values, width),
                               self._top_logprobs or 0)

    def enqueue_step(self, burst_id: int) -> None:
        self._idle = False
        graph = self.steps[self._drawing, self._top_logprobs is not None, self._bias, self._masking]
        _lib.check(self.lib.arc_loop_enqueue_step(self.loop, graph, burst_id))

    def enqueue_commit(self, burst_id: int) -> None:
        """A step of the burst without its forward: the sampler the step graphs capture (argmax, or
        the draw) and its commit, launched on the logits a prefill left."""
        self._idle = False
        fwd = self.forward
        _lib.check(self.lib.arc_loop_begin_burst(self.loop, burst_id))
        self._enqueue_sampler(self._drawing, self._bias, self._masking)
        if self._top_logprobs is not None:
            _lib.check(self.lib.arc_loop_enqueue_logprobs(self.loop, fwd.logits, fwd.width))

    def _enqueue_sampler(self, draw: bool, bias: bool, mask: bool) -> None:
        """After a forward or a prefill: the logit bias, the mask, then the sampler and its commit."""
        fwd = self.forward
        if bias:
            self._enqueue_logit_bias()
        if mask:
            _lib.check(self.lib.arc_loop_enqueue_mask(self.loop, fwd.logits, fwd.width))
        commit = self.lib.arc_loop_enqueue_draw_commit if draw else self.lib.arc_loop_enqueue_sample_commit
        _lib.check(commit(self.loop, fwd.logits, fwd.width))

    def write_mask(self, n: int, words) -> None:
        self._mask.write(n, words)

    def release_masks(self) -> None:
        if self._mask is not None and self._masking:
            self._mask.release()

    def begin_burst(self, burst_id: int, max_tokens: int) -> None:
        self._idle = False
        _lib.check(self.lib.arc_loop_begin_burst_limit(self.loop, burst_id, max_tokens))

    def enqueue_spec_step(self, burst_id: int) -> None:
        graph = self.spec_draw_graph if self._drawing else self.spec_graph
        if graph is None:
            raise InvalidArgumentError("this device has no speculative step of this kind (capture_speculation)")
        self._idle = False
        _lib.check(self.lib.arc_loop_enqueue_step(self.loop, graph, burst_id))

    def poll_ring(self) -> RingState:
        s = self._state
        self.lib.arc_ring_poll(self.loop, s)
        return RingState(s.published, s.fault, s.fault_token, s.fault_pos, s.stopped, s.steps, s.logprobs)

    def read_ring(self, first: int, count: int) -> list[int]:
        _lib.check(self.lib.arc_ring_read(self.loop, first, count, self._tokens))
        return list(self._tokens[0:count])

    def inject_lost_step(self, n: int) -> None:
        """Test hook: the n-th commit from now does nothing, as if its launch were lost."""
        self._idle = False
        _lib.check(self.lib.arc_loop_inject_lost_step(self.loop, n))

    # -- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Free everything the device owns; safe to call twice, and on a half-built device."""
        for g in (self.graph, self.spec_graph, self.spec_draw_graph, *self.steps.values()):
            if g is not None:
                self.lib.arc_graph_destroy(g)
        self.graph = self.step_graph = self.draw_graph = self.spec_graph = self.spec_draw_graph = None
        self.steps = {}
        self.supports_loop = self.supports_sampling = self.supports_logprobs = self.supports_masks = False
        self.speculate_k, self._mask = 0, None  # the mask block goes with the loop
        if self.loop is not None:
            self.lib.arc_loop_destroy(self.loop)
            self.loop = None
        if self._store is not None:
            self.ctx.device_free(self._store)
            self._store = None
        if self.forward is not None:
            self.forward.close()
            self.forward = None
        if self.owns_context:
            self.ctx.close()


def open_cuda_device(model: Model, max_seq: int | None = None, use_graph: bool = True,
                     vocab_limit: int | None = None, speculate: int = DEFAULT_DRAFTS, ngram: int = 3,
                     kv_cache: str = "bf16") -> CudaDevice:
    """Load `model` onto GPU 0, in order: a context; the config validated and the weights uploaded;
    the loop's state; one warm-up forward; the graphs captured (unless `use_graph` is off: the
    eager forward, no device loop). `vocab_limit` narrows the valid token ids below the lm_head's
    width, as a padded head does. `speculate` > 0 (by default DEFAULT_DRAFTS) also captures the
    speculative step with that many drafts, looked up by n-grams of up to `ngram` tokens. `kv_cache`:
    the form the KV cache holds its rows in (bf16 or q8_0: arcpy/devices/kv_formats.py). The device
    owns all of it: close it, or use it in a `with`."""
    check_supported(model.config)  # before the context: a refused model allocates nothing
    check_kv_cache(model.config, kv_cache)
    ctx = Context(0)
    try:
        forward = CudaModel(ctx, model, max_seq or model.config.max_seq, kv_cache)
    except BaseException:
        ctx.close()
        raise
    device = CudaDevice(ctx, forward, vocab_limit, owns_context=True)
    try:
        device.warm_up()
        if use_graph:
            device.capture()
            if speculate and model.config.n_experts:
                device.speculation_refused = "the model is a mixture of experts; speculative steps do not route rows yet"
            elif speculate:
                device.capture_speculation(speculate, ngram)
    except BaseException:
        device.close()
        raise
    return device
