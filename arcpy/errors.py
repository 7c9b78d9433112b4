"""The exceptions arcpy raises: one base class, and the few subclasses people catch.

    ArcError
    ├── NoDeviceError          no driver, no GPU, or libarc.so cannot be loaded
    ├── InvalidArgumentError   an argument out of range or inconsistent (also a ValueError)
    ├── ModelFileError         a model directory, config or weight file missing, corrupt, unsupported
    ├── BadLogitsError         no token can be chosen from the forward's logits:
    │   ├── NonFiniteLogitsError   NaN or infinite (bad weights, overflow)
    │   └── DegenerateLogitsError  every one equal (zero or saturated weights)
    └── DeviceFaultError       the GPU did not do what it was asked
        ├── ContextLostError   a sticky asynchronous fault: the CUDA context is unusable
        ├── HangError          no progress and no error within the polling budget
        └── LoopFault          the device loop failed, the context is intact: fall back
            ├── FaultWordError     the commit kernel latched a range fault
            └── ShortBurstError    idle-but-short: steps retired without publishing
"""

from __future__ import annotations

from arcpy import codes


class ArcError(Exception):
    """Base of every arcpy error. `status` is the libarc status code, or None for host-side errors."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class NoDeviceError(ArcError):
    """No usable GPU: no driver, no device, or libarc.so could not be loaded."""


class InvalidArgumentError(ArcError, ValueError):
    """An argument was out of range or inconsistent (shape, token id, position, option value)."""


class ModelFileError(ArcError):
    """A model directory, config or weight file is missing, corrupt or unsupported."""


class BadLogitsError(ArcError):
    """No token can be chosen from the forward's logits: the model's fault, not the loop's, so
    the host path would meet it too (no fallback)."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


class NonFiniteLogitsError(BadLogitsError):
    """The forward's largest logit is NaN or infinite."""

    def __init__(self, position: int, where: str):
        super().__init__(f"{where}: the forward at position {position} gave non-finite logits (NaN or inf): "
                         "the weights hold NaN or inf, or the activations overflowed", position)


class DegenerateLogitsError(BadLogitsError):
    """Every logit of the forward is equal (over a vocabulary of more than one token): the
    weights carry no information, and any token would be arbitrary."""

    def __init__(self, position: int, where: str):
        super().__init__(f"{where}: the forward at position {position} gave degenerate logits (every one equal): "
                         "the weights are zero where they must not be, or the activations saturated", position)


class DeviceFaultError(ArcError):
    """The GPU reported a fault: a sticky CUDA error, a latched fault word, a short or hung burst."""


class ContextLostError(DeviceFaultError):
    """A sticky asynchronous fault: the CUDA context is unusable; the process must restart."""


class HangError(DeviceFaultError):
    """No progress and no error within the polling budget; the stream still holds the work."""


class LoopFault(DeviceFaultError):
    """The device loop failed but the context is still usable: the engine may fall back."""


class FaultWordError(LoopFault):
    """The commit kernel latched a range fault: nothing was published at or after it."""

    def __init__(self, code: int, token: int, position: int):
        what = codes.FAULT_NAMES.get(code, f"fault code {code}")
        super().__init__(f"device loop: {what}: token {token} at position {position}")
        self.code, self.token, self.position = code, token, position


class ShortBurstError(LoopFault):
    """idle-but-short: the work retired without doing what it was asked."""
