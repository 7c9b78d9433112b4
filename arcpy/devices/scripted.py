"""The scripted model: libarc's stand-in forward for testing the device loop on a real GPU.

Its argmax is `scripted_next(token, position)`, read from the loop's device state exactly as the
real forward reads them, so the loop can be captured, replayed and broken on purpose (an illegal
address, a spin on a host flag, a forced token) without a transformer. FakeDevice uses the same
rule, so the GPU and the fake agree on what a scripted run produces.
"""

from __future__ import annotations

from arcpy import _lib
from arcpy.devices.cuda import Context, CudaDevice

SCRIPT_MUL, SCRIPT_ADD = 31, 7


def scripted_next(token: int, position: int, vocab: int, bias: int = 3) -> int:
    """The scripted model's next token: the same rule as libarc's script kernel."""
    return (token * SCRIPT_MUL + position * SCRIPT_ADD + bias) % vocab


class ScriptedForward:
    """arc_script_forward with its own logits buffer. `mode` is an arc_script_mode name."""

    supports_prefill = False

    def __init__(self, ctx: Context, vocab: int, max_seq: int, mode: str, at_pos: int, bias: int, flag):
        self.ctx, self.lib = ctx, ctx.lib
        self.width, self.max_seq = vocab, max_seq
        script = ctx.ffi.new("arc_script *")
        script.vocab, script.mul, script.add, script.bias = vocab, SCRIPT_MUL, SCRIPT_ADD, bias
        script.mode, script.at_pos = getattr(ctx.lib, mode), at_pos
        script.flag = flag if flag is not None else ctx.ffi.NULL
        self.script = script
        self.logits = ctx.device_alloc(vocab * 4)

    def enqueue(self, loop) -> None:
        _lib.check(self.lib.arc_script_forward(loop, self.script, self.logits))

    def enqueue_greedy(self, loop) -> None:
        self.enqueue(loop)
        _lib.check(self.lib.arc_loop_enqueue_sample_commit(loop, self.logits, self.width))

    def close(self) -> None:
        if self.logits is not None:
            self.ctx.device_free(self.logits)
            self.logits = None


def scripted_device(ctx: Context, vocab: int = 32000, loop_vocab: int | None = None, max_seq: int = 4096,
                    mode: str = "ARC_SCRIPT_NORMAL", at_pos: int = -1, bias: int = 3, flag=None) -> CudaDevice:
    """A CudaDevice over the scripted forward on `ctx` (which stays the caller's to close), warmed
    up and captured. `loop_vocab` narrows the valid token ids below the logits' width (a padded
    head); `flag` is the host-mapped word ARC_SCRIPT_SPIN waits on."""
    device = CudaDevice(ctx, ScriptedForward(ctx, vocab, max_seq, mode, at_pos, bias, flag), loop_vocab)
    try:
        device.warm_up()
        device.capture()
    except BaseException:
        device.close()
        raise
    return device
