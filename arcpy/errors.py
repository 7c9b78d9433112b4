"""The exceptions arcpy raises. One base class; a few subclasses people catch."""


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


class DeviceFaultError(ArcError):
    """The GPU reported a fault: a sticky CUDA error, a latched fault word, a short or hung burst."""


class ContextLostError(DeviceFaultError):
    """A sticky asynchronous fault: the CUDA context is unusable; the process must restart."""
