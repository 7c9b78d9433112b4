"""arcpy: batch-1 LLM decode on an NVIDIA GPU without a host wait per token.

`import arcpy` works on any machine; GPU work raises NoDeviceError where there is no GPU. The
engine and the loaders are imported on first use (`arcpy.Engine`), so importing the package stays
light for the C flags and the CLI's help.
"""

from arcpy import _lib
from arcpy.errors import (
    ArcError,
    BadLogitsError,
    ContextLostError,
    DegenerateLogitsError,
    DeviceFaultError,
    FaultWordError,
    HangError,
    InvalidArgumentError,
    LoopFault,
    ModelFileError,
    NoDeviceError,
    NonFiniteLogitsError,
    ShortBurstError,
)

__version__ = "0.1.0"

# Public name -> the module it lives in, imported when first asked for.
_LAZY = {
    "Engine": "arcpy.loop.engine", "EngineSettings": "arcpy.loop.settings", "GenerationStats": "arcpy.loop.stats",
    "FinishReason": "arcpy.loop.stats",
    "Request": "arcpy.loop.request", "Message": "arcpy.loop.request", "Sampling": "arcpy.sampling",
    "load_checkpoint": "arcpy.loading", "load_gguf": "arcpy.loading", "load_model": "arcpy.model",
    "load_text_spec": "arcpy.text", "synthetic_model": "arcpy.model",
    "open_engine": "arcpy.backends", "open_device": "arcpy.backends",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'arcpy' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def cuda_available() -> bool:
    """True when libarc loads and sees at least one CUDA device. cuda_status() says why not."""
    return _lib.cuda_available()[0]


def cuda_status() -> str:
    """One line: the visible devices, or why there is no usable GPU."""
    return _lib.cuda_available()[1]


__all__ = [
    *_LAZY,
    "ArcError",
    "ContextLostError",
    "DeviceFaultError",
    "FaultWordError",
    "HangError",
    "InvalidArgumentError",
    "LoopFault",
    "ModelFileError",
    "NoDeviceError",
    "NonFiniteLogitsError",
    "DegenerateLogitsError",
    "BadLogitsError",
    "ShortBurstError",
    "cuda_available",
    "cuda_status",
]
