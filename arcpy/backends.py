"""The backends: a model opened on a device (`open_device`: CUDA or the NumPy reference, whole or
split over ranks) and an engine over it (`open_engine`). The engine (arcpy/loop/engine.py) takes
the device it is given; this is the one place that builds one for a model.

    with arcpy.open_engine(model, text=text) as engine:
        print(engine.chat([{"role": "user", "content": "Hello!"}]))
"""

from __future__ import annotations

from typing import Mapping, Sequence

from arcpy import _lib
from arcpy.devices.kv_formats import check_kv_form
from arcpy.devices.protocol import DeviceOps
from arcpy.drafting import DEFAULT_DRAFTS
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.loop.prompt import context_of
from arcpy.loop.settings import SETTING_NAMES, EngineSettings
from arcpy.parallel.devices import check_devices

# open_device's keyword arguments besides environ; open_engine hands the rest to Engine
DEVICE_ARGUMENTS = ("max_seq", "graph", "speculate", "devices", "prefill_progress", "kv_cache")
# Engine's collaborators besides environ; the other keywords are its settings (SETTING_NAMES)
ENGINE_ARGUMENTS = ("latch", "step_cost")


def resolve_backend(backend: str) -> str:
    """The backend `backend` names: "auto" is "cuda" where a GPU is usable, else "numpy"."""
    return _lib.auto_backend() if backend == "auto" else backend


def open_device(model, backend: str = "auto", *, max_seq: int | None = None, graph: bool | None = None,
                environ: Mapping[str, str] | None = None, speculate: int | None = None,
                devices: Sequence[int] | None = None, prefill_progress=None, kv_cache: str = "bf16") -> DeviceOps:
    """`model` on `backend`: "cuda", "numpy", or "auto" (resolve_backend). `max_seq` is the
    context to allocate, by default the model's, at most arcpy.loop.prompt's DEFAULT_MAX_SEQ
    (context_of). `graph` None reads ARC_GRAPH (default on); off means the eager forward.
    `speculate` is how many drafts a speculative step verifies (None: DEFAULT_DRAFTS; 0: no
    speculative steps); they are captured where the device loop runs them (cuda, not a mixture of
    experts). `devices` splits the model over that many ranks (tensor parallelism, arcpy/parallel):
    on cuda, the GPUs of those indices, their sums through NCCL in the step graphs; on numpy, ranks
    on the CPU whose partial sums are added in rank order. `prefill_progress(done, total)` hears how
    the chunks of a prefill on numpy go (seconds each; on cuda a prompt takes milliseconds, and it
    is not called). `kv_cache` is the form the KV cache holds its rows in (arcpy/devices/kv_formats.py:
    bf16, q8_0, or on numpy also fp8). The caller owns the device: `close()` frees it."""
    gate.read_all(environ)
    check_kv_form(kv_cache, model.config.head_dim)  # one line, before anything opens
    max_seq = context_of(model.config, max_seq)
    if not (isinstance(max_seq, int) and 0 < max_seq <= model.config.max_seq):
        raise InvalidArgumentError(
            f"max_seq must be in 1..{model.config.max_seq} (the model's context), got {max_seq}")
    backend = resolve_backend(backend)
    use_graph = gate.read_flag(gate.GRAPH, gate.DEFAULTS[gate.GRAPH], environ) if graph is None else graph
    world = check_devices(devices)
    if world and kv_cache != "bf16":
        raise InvalidArgumentError(f"a model split over ranks holds its KV cache in bf16, not {kv_cache}")
    if world and backend == "cuda":
        from arcpy.parallel.cuda import open_tensor_parallel
        return open_tensor_parallel(model, devices, max_seq, use_graph)
    if world and backend == "numpy":
        from arcpy.devices.numpy_device import NumpyDevice
        from arcpy.parallel.reference import TensorParallelReference
        return NumpyDevice(TensorParallelReference(model, world, max_seq), prefill_progress)
    if backend == "cuda":
        from arcpy.devices.cuda import open_cuda_device
        speculate = DEFAULT_DRAFTS if speculate is None else speculate
        return open_cuda_device(model, max_seq, use_graph, speculate=speculate if use_graph else 0, kv_cache=kv_cache)
    if backend == "numpy":
        from arcpy.devices.numpy_device import NumpyDevice
        from arcpy.devices.reference import ReferenceModel
        return NumpyDevice(ReferenceModel(model, max_seq, kv_cache=kv_cache), prefill_progress)
    raise InvalidArgumentError(f"unknown backend {backend!r}: use auto, cuda or numpy")


def open_engine(model, backend: str = "auto", text=None, **arguments) -> Engine:
    """An Engine over `open_device(model, backend, ...)`, with the model's TextSpec `text` (for
    Engine.chat). `arguments`: open_device's keywords (DEVICE_ARGUMENTS), Engine's collaborators
    (ENGINE_ARGUMENTS: latch, step_cost) and the fields of its EngineSettings (burst, device_loop,
    draft_memory, prompt_cache_bytes, ...; arcpy/loop/settings.py); environ goes to both. The
    engine owns the device: `with open_engine(...) as engine:` frees it."""
    environ = arguments.pop("environ", None)
    gate.read_all(environ)
    backend = resolve_backend(backend)
    device = open_device(model, backend, environ=environ,
                         **{k: arguments.pop(k) for k in DEVICE_ARGUMENTS if k in arguments})
    try:
        collaborators = {k: arguments.pop(k) for k in ENGINE_ARGUMENTS if k in arguments}
        unknown = sorted(set(arguments) - SETTING_NAMES)
        if unknown:
            raise TypeError(f"open_engine() got unexpected keyword arguments: {', '.join(unknown)}")
        engine = Engine(device, backend, EngineSettings(**arguments), environ=environ, **collaborators)
    except BaseException:
        device.close()
        raise
    engine.text = text
    return engine
