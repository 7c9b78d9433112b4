"""arcpy: batch-1 LLM decode on an NVIDIA GPU without a host wait per token.

`import arcpy` works on any machine; GPU work raises NoDeviceError where there is no GPU.
"""

from arcpy import _lib
from arcpy.errors import (
    ArcError,
    ContextLostError,
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


def cuda_available() -> bool:
    """True when libarc loads and sees at least one CUDA device. cuda_status() says why not."""
    return _lib.cuda_available()[0]


def cuda_status() -> str:
    """One line: the visible devices, or why there is no usable GPU."""
    return _lib.cuda_available()[1]


__all__ = [
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
    "ShortBurstError",
    "cuda_available",
    "cuda_status",
]
