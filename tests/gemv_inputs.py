"""The decode's quantized GEMVs round their input before the products (arc.h: per 32 values,
x_q = rint(x * 127 / amax), clamped to 127, dx = amax / 127), where the NumPy reference keeps it
float32. A model whose logits move with that rounding (gpt-oss-tiny's random weights: 0.16 of
the logits' scale from the experts' inputs alone) is compared with a reference that rounds as the
device does: while `libarc_gemv_inputs()` lasts, a ReferenceModel built inside it rounds so the
input of each product over a quantized matrix (its decode steps; build and step it inside)."""

import contextlib

import numpy as np

import arcpy.devices.reference as reference
import arcpy.devices.reference_layer as reference_layer
import arcpy.devices.reference_ops as reference_ops


class Packed(np.ndarray):
    """A quantized matrix's dequantized weights (a view, and its views, stay Packed)."""


def round_like_libarc(x: np.ndarray) -> np.ndarray:
    """x (..., n), n % 32 == 0, as the quantized GEMVs take it: each 32 values' amax, the values
    rounded to nearest even at 127 / amax, clamped, and scaled back by amax / 127."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.rint(blocks * scale), -127, 127)
    return (q * (amax / np.float32(127))).astype(np.float32).reshape(x.shape)


@contextlib.contextmanager
def libarc_gemv_inputs():
    weights, linear, gemv = reference_layer.weights_f32, reference_ops.linear, reference_ops.gemv

    def packed_weights(t):
        w = weights(t)
        return w.view(Packed) if isinstance(t, reference_layer.QuantTensor) else w

    def rounded_linear(x, w, bias=None):
        return linear(round_like_libarc(x) if isinstance(w, Packed) else x, np.asarray(w), bias)

    def rounded_gemv(w, x, bias=None):
        return gemv(np.asarray(w), round_like_libarc(x) if isinstance(w, Packed) else x, bias)

    patches = [(reference_layer, "weights_f32", packed_weights), (reference, "weights_f32", packed_weights),
               (reference_ops, "linear", rounded_linear), (reference_ops, "gemv", rounded_gemv),
               (reference, "gemv", rounded_gemv)]
    saved = [(m, name, getattr(m, name)) for m, name, _ in patches]
    try:
        for m, name, f in patches:
            setattr(m, name, f)
        yield
    finally:
        for m, name, f in saved:
            setattr(m, name, f)
