"""Model description and weights: the config, the safetensors reader and writer, the embedded default.

A model is a `ModelConfig` plus a dict of tensors under their Hugging Face names, every tensor held
as raw bf16 words (`uint16`, C-contiguous). Files are read with NumPy alone: a safetensors file is an
8-byte little-endian header length N, N bytes of JSON describing each tensor (dtype, shape,
data_offsets relative to the end of the header), then the data. Every check on a file happens before
`load_model` returns, and every failure is one `ModelFileError` line naming the file and tensor.
Pickle checkpoints are never opened: loading one runs arbitrary code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from arcpy.errors import InvalidArgumentError, ModelFileError

# ---------------------------------------------------------------------------------------------
# bf16 words
# ---------------------------------------------------------------------------------------------


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bf16 words (uint16, any shape) -> float32 of the same shape. Exact: bf16 is the top half of f32."""
    u16 = np.asarray(u16)
    if u16.dtype != np.uint16:
        raise InvalidArgumentError(f"bf16_to_f32 expects uint16 words, got {u16.dtype}")
    return np.asarray(u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x) -> np.ndarray:
    """float values (any shape) -> bf16 words (uint16), rounded to nearest, ties to even.

    Values too large for bf16 round to +-inf like any other RNE overflow; a NaN stays a NaN (its
    top bits are kept and the quiet bit set, so rounding can never carry it into an infinity).
    """
    bits = np.array(x, dtype=np.float32, order="C", copy=True).view(np.uint32)
    with np.errstate(over="ignore"):  # NaN words wrap here; they are replaced below
        # Adding 0x7FFF plus the lowest kept bit rounds half-way cases towards the even word.
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.asarray(np.where(is_nan, quiet_nan, rounded).astype(np.uint16))


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise InvalidArgumentError(msg)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency scaling ("rope_type": "llama3" in config.json)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _require(self.factor > 0, f"rope_scaling.factor must be > 0, got {self.factor}")
        _require(self.low_freq_factor > 0, f"rope_scaling.low_freq_factor must be > 0, got {self.low_freq_factor}")
        # The smooth band divides by (high - low); equal factors would leave it undefined.
        _require(self.high_freq_factor > self.low_freq_factor,
                 f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                 f"low_freq_factor ({self.low_freq_factor})")
        _require(_is_int(self.original_max_position_embeddings) and self.original_max_position_embeddings > 0,
                 "rope_scaling.original_max_position_embeddings must be a positive int, "
                 f"got {self.original_max_position_embeddings!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder. Invariants are checked on construction."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab: int
    max_seq: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tied_embeddings: bool = False
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        for field in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "max_seq"):
            v = getattr(self, field)
            _require(_is_int(v) and v > 0, f"ModelConfig.{field} must be a positive int, got {v!r}")
        # Token ids and positions travel as int32 on the device.
        _require(self.vocab < 2**31 and self.max_seq < 2**31, "vocab and max_seq must fit in int32")
        _require(self.n_heads % self.n_kv_heads == 0,
                 f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        _require(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        _require(math.isfinite(self.rms_eps) and self.rms_eps > 0, f"rms_eps must be > 0, got {self.rms_eps}")
        _require(math.isfinite(self.rope_theta) and self.rope_theta > 0,
                 f"rope_theta must be > 0, got {self.rope_theta}")
        _require(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
                 f"rope_scaling must be None or RopeScaling, got {type(self.rope_scaling).__name__}")
        _require(isinstance(self.tied_embeddings, bool) and isinstance(self.qkv_bias, bool),
                 "tied_embeddings and qkv_bias must be bool")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_params(self) -> int:
        """Number of stored weights (the embedding once when tied)."""
        return sum(math.prod(s) for s in expected_tensors(self).values())

    @property
    def weight_bytes(self) -> int:
        """bf16 bytes of weights streamed to decode one token: the bandwidth floor of a step.

        Every layer tensor, the final norm and the lm_head are read whole; of an untied embedding
        table only the token's row is read. When tied the table is the lm_head and counts once.
        """
        n = sum(math.prod(s) for name, s in expected_tensors(self).items() if name != EMBED)
        n += self.dim if not self.tied_embeddings else self.vocab * self.dim
        return 2 * n


_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
_IGNORED_ROPE_TYPES = (None, "default")


def _hf_get(d: Mapping, key: str, source: str, kind=(int,), default=None, required=True):
    if key not in d or d[key] is None:
        if required:
            raise ModelFileError(f"{source}: missing key '{key}'")
        return default
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool) and bool not in kind:
        raise ModelFileError(f"{source}: key '{key}' has type {type(v).__name__}, expected {kind[0].__name__}")
    return v


def _rope_from_hf(d: Mapping, source: str) -> tuple[float, RopeScaling | None]:
    # Newer configs group the rope settings under "rope_parameters"; older ones use top-level keys.
    params = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else None
    theta = (params or {}).get("rope_theta", d.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        raise ModelFileError(f"{source}: key 'rope_theta' is not a number")
    rs = params if params is not None else d.get("rope_scaling")
    if rs is None:
        return float(theta), None
    if not isinstance(rs, dict):
        raise ModelFileError(f"{source}: key 'rope_scaling' must be an object or null")
    rope_type = rs.get("rope_type", rs.get("type"))
    if rope_type in _IGNORED_ROPE_TYPES:
        return float(theta), None
    if rope_type != "llama3":
        raise ModelFileError(f"{source}: unsupported rope scaling type '{rope_type}' (supported: llama3)")
    try:
        scaling = RopeScaling(
            factor=float(_hf_get(rs, "factor", source, (int, float))),
            low_freq_factor=float(_hf_get(rs, "low_freq_factor", source, (int, float))),
            high_freq_factor=float(_hf_get(rs, "high_freq_factor", source, (int, float))),
            original_max_position_embeddings=_hf_get(rs, "original_max_position_embeddings", source),
        )
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None
    return float(theta), scaling


def config_from_hf(d: dict, source: str) -> ModelConfig:
    """A Hugging Face config.json dict -> ModelConfig. `source` names the file in error messages.

    Accepts Llama, Mistral and Qwen2 decoders. A Mistral sliding window shorter than the context is
    honoured exactly by capping max_seq at the window (attention then never reaches past it); an
    active Qwen2 sliding window is refused. Llama's attention_bias also adds an o_proj bias, which
    this engine does not carry, so it is refused rather than dropped.
    """
    if not isinstance(d, dict):
        raise ModelFileError(f"{source}: config must be a JSON object")
    archs = d.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs:
            raise ModelFileError(f"{source}: key 'architectures' must be a non-empty list")
        known = [a for a in archs if a in _ARCHITECTURES]
        if not known:
            raise ModelFileError(f"{source}: unsupported architecture {', '.join(map(str, archs))} "
                                 f"(supported: {', '.join(_ARCHITECTURES)})")
        family = _ARCHITECTURES[known[0]]
    else:
        family = d.get("model_type")
        if family is None:
            raise ModelFileError(f"{source}: missing key 'architectures'")
        if family not in _ARCHITECTURES.values():
            raise ModelFileError(f"{source}: unsupported model_type '{family}' (supported: llama, mistral, qwen2)")

    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ModelFileError(f"{source}: unsupported hidden_act '{act}' (supported: silu)")
    if d.get("mlp_bias"):
        raise ModelFileError(f"{source}: unsupported mlp_bias=true")
    if family == "qwen2":
        qkv_bias = True
    else:
        if d.get("attention_bias"):
            raise ModelFileError(f"{source}: unsupported attention_bias=true (o_proj bias)")
        qkv_bias = False

    dim = _hf_get(d, "hidden_size", source)
    n_heads = _hf_get(d, "num_attention_heads", source)
    max_seq = _hf_get(d, "max_position_embeddings", source)
    window = d.get("sliding_window")
    if window is not None and d.get("use_sliding_window", family == "mistral"):
        if family != "mistral":
            raise ModelFileError(f"{source}: unsupported active sliding window (use_sliding_window=true)")
        if not _is_int(window) or window <= 0:
            raise ModelFileError(f"{source}: key 'sliding_window' must be a positive int")
        max_seq = min(max_seq, window)
    theta, scaling = _rope_from_hf(d, source)
    if not _is_int(n_heads) or n_heads <= 0:
        raise ModelFileError(f"{source}: key 'num_attention_heads' must be a positive int")
    try:
        return ModelConfig(
            dim=dim,
            n_layers=_hf_get(d, "num_hidden_layers", source),
            n_heads=n_heads,
            n_kv_heads=_hf_get(d, "num_key_value_heads", source, default=n_heads, required=False),
            head_dim=_hf_get(d, "head_dim", source, default=dim // n_heads, required=False),
            ffn_dim=_hf_get(d, "intermediate_size", source),
            vocab=_hf_get(d, "vocab_size", source),
            max_seq=max_seq,
            rms_eps=float(_hf_get(d, "rms_norm_eps", source, (int, float), default=1e-6, required=False)),
            rope_theta=theta,
            rope_scaling=scaling,
            tied_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
        )
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None


def config_to_hf(cfg: ModelConfig) -> dict:
    """ModelConfig -> a config.json dict that `config_from_hf` reads back to the same config."""
    qwen = cfg.qkv_bias  # only Qwen2 carries q/k/v biases without an o_proj bias
    d = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim,
        "vocab_size": cfg.vocab,
        "max_position_embeddings": cfg.max_seq,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if qwen:
        d["use_sliding_window"] = False
    else:
        d["attention_bias"] = False
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    return d


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies (head_dim//2,) float32: theta**(-2i/head_dim), Llama 3 scaled if configured.

    Llama 3 rule: wavelengths longer than original/low_freq_factor are slowed by `factor`, those
    shorter than original/high_freq_factor are kept, and the band between blends the two linearly
    in original/wavelength. Computed in float64, rounded once to float32.
    """
    i = np.arange(cfg.head_dim // 2, dtype=np.float64)
    freq = float(cfg.rope_theta) ** (-2.0 * i / cfg.head_dim)
    rs = cfg.rope_scaling
    if rs is not None:
        orig = float(rs.original_max_position_embeddings)
        wavelen = 2.0 * math.pi / freq
        slow = wavelen > orig / rs.low_freq_factor
        fast = wavelen < orig / rs.high_freq_factor
        blend = (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        mixed = (1.0 - blend) * freq / rs.factor + blend * freq
        freq = np.where(slow, freq / rs.factor, np.where(fast, freq, mixed))
    return freq.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Tensors and the Model
# ---------------------------------------------------------------------------------------------

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config stores, name -> shape, in a fixed order."""
    d, q, kv, f = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    out: dict[str, tuple[int, ...]] = {EMBED: (cfg.vocab, d)}
    for i in range(cfg.n_layers):
        p = layer_prefix(i)
        out[p + "input_layernorm.weight"] = (d,)
        out[p + "self_attn.q_proj.weight"] = (q, d)
        out[p + "self_attn.k_proj.weight"] = (kv, d)
        out[p + "self_attn.v_proj.weight"] = (kv, d)
        if cfg.qkv_bias:
            out[p + "self_attn.q_proj.bias"] = (q,)
            out[p + "self_attn.k_proj.bias"] = (kv,)
            out[p + "self_attn.v_proj.bias"] = (kv,)
        out[p + "self_attn.o_proj.weight"] = (d, q)
        out[p + "post_attention_layernorm.weight"] = (d,)
        out[p + "mlp.gate_proj.weight"] = (f, d)
        out[p + "mlp.up_proj.weight"] = (f, d)
        out[p + "mlp.down_proj.weight"] = (d, f)
    out[FINAL_NORM] = (d,)
    if not cfg.tied_embeddings:
        out[LM_HEAD] = (cfg.vocab, d)
    return out


class Model:
    """A config and its weights as bf16 words. Weights loaded from files may be read-only mmap views."""

    def __init__(self, config: ModelConfig, tensors: dict[str, np.ndarray], name: str, source: str):
        expected = expected_tensors(config)
        for tname, shape in expected.items():
            t = tensors.get(tname)
            _require(t is not None, f"model {name}: missing tensor {tname}")
            _require(t.dtype == np.uint16 and t.flags.c_contiguous,
                     f"model {name}: tensor {tname} must be C-contiguous uint16 bf16 words, got {t.dtype}")
            _require(t.shape == shape, f"model {name}: tensor {tname} has shape {t.shape}, expected {shape}")
        extra = sorted(set(tensors) - set(expected))
        _require(not extra, f"model {name}: unexpected tensor {extra[0] if extra else ''}")
        self.config = config
        self.tensors = dict(tensors)
        self.name = name
        self.source = source

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidArgumentError(f"model {self.name}: no tensor named {name}") from None

    def lm_head(self) -> np.ndarray:
        """The (vocab, dim) output projection: the embedding table when tied."""
        return self.tensors[EMBED] if self.config.tied_embeddings else self.tensors[LM_HEAD]

    def __repr__(self) -> str:
        return f"Model(name={self.name!r}, source={self.source!r}, n_params={self.config.n_params})"


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

MAX_HEADER_BYTES = 100 * 1024 * 1024  # real headers are kilobytes; more means a corrupt length word
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
             "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_READABLE = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}
# Buffers some exporters save next to the weights; they are recomputed from the config.
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def _read_header(file: Path) -> dict[str, _Entry]:
    """Parse and validate one safetensors header against the file's size; reads no tensor data."""
    size = file.stat().st_size
    if size < 8:
        raise ModelFileError(f"{file}: too short for a safetensors header ({size} bytes)")
    with open(file, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise ModelFileError(f"{file}: oversized header ({n} bytes; file is {size} bytes)")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{file}: header is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{file}: header is not a JSON object")
    base, entries = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{file}: tensor {name}"
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ModelFileError(f"{where}: malformed header entry") from None
        if not isinstance(dtype, str):
            raise ModelFileError(f"{where}: malformed dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise ModelFileError(f"{where}: malformed shape {shape!r}")
        if not (_is_int(begin) and _is_int(end) and 0 <= begin <= end):
            raise ModelFileError(f"{where}: malformed data_offsets {info['data_offsets']!r}")
        if base + end > size:
            raise ModelFileError(f"{where}: data_offsets [{begin}, {end}] run past the end of the file "
                                 f"({size - base} data bytes; truncated?)")
        item = _ITEMSIZE.get(dtype)
        if item is not None and end - begin != math.prod(shape) * item:
            raise ModelFileError(f"{where}: data_offsets span {end - begin} bytes but {dtype}{shape} "
                                 f"needs {math.prod(shape) * item}")
        entries[name] = _Entry(file, str(dtype), tuple(shape), base + begin, end - begin)
    return entries


def _weight_files(directory: Path) -> dict[str, _Entry]:
    """Locate the safetensors file(s) in a model directory and return the tensor index."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return _read_header(single)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError) as e:
            raise ModelFileError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
        if not isinstance(weight_map, dict):
            raise ModelFileError(f"{index}: 'weight_map' must be an object")
        headers: dict[str, dict[str, _Entry]] = {}
        entries = {}
        for name, shard in weight_map.items():
            # A shard must sit in the model directory: no paths, so an index cannot point elsewhere.
            if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise ModelFileError(f"{index}: tensor {name} maps to invalid shard name {shard!r}")
            if shard not in headers:
                if not (directory / shard).is_file():
                    raise ModelFileError(f"{directory / shard}: shard listed in the index is missing")
                headers[shard] = _read_header(directory / shard)
            if name not in headers[shard]:
                raise ModelFileError(f"{directory / shard}: tensor {name} listed in the index is absent")
            entries[name] = headers[shard][name]
        return entries
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelFileError(f"{directory}: refusing pickle checkpoint {pickles[0]} (pickle runs code on "
                             "load); convert it to safetensors")
    raise ModelFileError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _to_bf16_words(entry: _Entry, maps: dict[Path, np.ndarray]) -> np.ndarray:
    if entry.file not in maps:  # one mapping per file, shared by its tensors
        maps[entry.file] = np.asarray(np.memmap(entry.file, dtype=np.uint8, mode="r"))
    raw = maps[entry.file][entry.start:entry.start + entry.nbytes]
    arr = raw.view(_READABLE[entry.dtype]).reshape(entry.shape)
    if entry.dtype == "BF16":
        # Writers that do not pad the header leave the data at an odd address; copy those once.
        return arr if arr.dtype == np.uint16 and arr.flags.aligned else arr.astype(np.uint16)
    return f32_to_bf16(arr.astype(np.float32))


def load_model(path, max_seq: int | None = None) -> Model:
    """Read a Hugging Face style directory (config.json + safetensors) into a Model.

    BF16 tensors stay memory-mapped words; F16/F32 are rounded to bf16. `max_seq` caps the context
    (a 128k context's KV cache may not fit where the model does). Tensors the config does not
    expect are an error, except buffers that are recomputed anyway (rotary inv_freq) and an
    lm_head.weight next to tied embeddings (tying means the embedding is used).
    """
    try:
        return _load_model(Path(path), max_seq)
    except OSError as e:  # unreadable file, I/O error: still one line naming the file
        raise ModelFileError(f"{e.filename or path}: cannot read ({e.strerror or e})") from None


def _load_model(directory: Path, max_seq: int | None) -> Model:
    if not directory.exists():
        raise ModelFileError(f"{directory}: no such model directory")
    if not directory.is_dir():
        if directory.suffix in PICKLE_SUFFIXES:
            raise ModelFileError(f"{directory}: refusing pickle checkpoint (pickle runs code on load); "
                                 "convert it to safetensors")
        raise ModelFileError(f"{directory}: expected a model directory with config.json and safetensors")
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise ModelFileError(f"{cfg_path}: missing config.json")
    try:
        cfg_dict = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{cfg_path}: not valid JSON ({type(e).__name__}: {e})") from None
    cfg = config_from_hf(cfg_dict, str(cfg_path))
    if max_seq is not None:
        _require(_is_int(max_seq) and max_seq > 0, f"max_seq must be a positive int, got {max_seq!r}")
        cfg = dataclasses.replace(cfg, max_seq=min(cfg.max_seq, max_seq))

    entries = _weight_files(directory)
    expected = expected_tensors(cfg)
    for name, shape in expected.items():
        e = entries.get(name)
        if e is None:
            raise ModelFileError(f"{directory}: missing tensor {name}")
        if e.dtype not in _READABLE:
            raise ModelFileError(f"{e.file}: tensor {name} has unsupported dtype {e.dtype} (BF16, F16, F32)")
        if e.shape != shape:
            raise ModelFileError(f"{e.file}: tensor {name} has shape {list(e.shape)}, config expects {list(shape)}")
    for name, e in entries.items():
        harmless = name.endswith(_HARMLESS_SUFFIXES) or (name == LM_HEAD and cfg.tied_embeddings)
        if name not in expected and not harmless:
            raise ModelFileError(f"{e.file}: unexpected tensor {name} (not part of this config)")

    maps: dict[Path, np.ndarray] = {}
    tensors = {name: _to_bf16_words(entries[name], maps) for name in expected}
    return Model(cfg, tensors, name=directory.resolve().name, source=str(directory))


def save_safetensors(path, tensors: Mapping[str, np.ndarray], dtype: str = "BF16") -> None:
    """Write tensors to one safetensors file, all stored as `dtype` (BF16, F16 or F32).

    uint16 arrays are taken as bf16 words; float arrays as values (rounded to bf16 for BF16).
    """
    if dtype not in _READABLE:
        raise InvalidArgumentError(f"save_safetensors: dtype must be BF16, F16 or F32, got {dtype!r}")
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = np.asarray(t)
        values = bf16_to_f32(t) if t.dtype == np.uint16 else t.astype(np.float32)
        if dtype == "BF16":
            data = t if t.dtype == np.uint16 else f32_to_bf16(values)
        elif dtype == "F16" and np.any(np.abs(values[np.isfinite(values)]) > np.finfo(np.float16).max):
            raise InvalidArgumentError(f"save_safetensors: tensor {name} has values beyond the F16 range")
        else:
            data = values.astype(_READABLE[dtype])
        data = np.ascontiguousarray(data).astype(_READABLE[dtype], copy=False)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + data.nbytes]}
        blobs.append(data)
        offset += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as other writers do
    # Write beside the target and rename: a model loaded from `path` is memory-mapped, and
    # truncating a mapped file in place would crash its next read.
    tmp = Path(f"{path}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for data in blobs:
            fh.write(data.tobytes())
    os.replace(tmp, path)


def save_model(model: Model, directory) -> None:
    """Write config.json and model.safetensors (BF16) so that `load_model(directory)` reads it back."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_to_hf(model.config), indent=2) + "\n")
    save_safetensors(directory / "model.safetensors", model.tensors, "BF16")


# ---------------------------------------------------------------------------------------------
# The embedded default: random weights of a known shape
# ---------------------------------------------------------------------------------------------

SHAPES: dict[str, ModelConfig] = {
    # The llama2.c "stories" shapes, with random weights instead of the trained ones.
    "stories15M": ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, head_dim=48, ffn_dim=768,
                              vocab=32000, max_seq=1024, tied_embeddings=True),
    "stories110M": ModelConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, ffn_dim=2048,
                               vocab=32000, max_seq=1024, tied_embeddings=True),
    # Llama 3 style: grouped-query attention, large theta, frequency scaling, untied head.
    "gqa": ModelConfig(dim=2048, n_layers=2, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=5632,
                       vocab=32000, max_seq=4096, rope_theta=500000.0,
                       rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192)),
    # The Llama-3.2-1B shape (16 layers, GQA 32/8, vocab 128256, tied), for benchmarks.
    "llama1B": ModelConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                           vocab=128256, max_seq=4096, rope_theta=500000.0,
                           rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), tied_embeddings=True),
    # Qwen2 style: q/k/v biases, large theta; small enough for fast tests.
    "qwen-tiny": ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=384,
                             vocab=512, max_seq=512, rms_eps=1e-6, rope_theta=1000000.0, qkv_bias=True),
}

_EMBED_STD = 0.5
# q and k at twice unit scale give scores of std ~4: attention picks out a few positions, so the
# next token depends on the context, not only on the current token.
_QK_GAIN = 2.0


def _random_tensor(tname: str, shape: tuple[int, ...], seed: np.random.SeedSequence) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    if tname.endswith("norm.weight"):
        x = np.float32(1.0) + np.float32(0.05) * x
        if tname == FINAL_NORM:
            # With a tied head the residual still holds the current token's embedding, whose
            # logit e.(e*w) would win every step and repeat the token forever. Random signs
            # in the final norm make that self-score zero-mean; magnitudes stay near 1.
            x *= np.where(rng.random(shape) < 0.5, np.float32(-1.0), np.float32(1.0))
    elif tname.endswith(".bias"):
        x *= np.float32(0.1)
    elif tname == EMBED:
        x *= np.float32(_EMBED_STD)
    else:
        gain = _QK_GAIN if tname.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
        x *= np.float32(gain / math.sqrt(shape[1]))  # 1/sqrt(fan_in): unit-variance outputs
    return f32_to_bf16(x)


def random_model(cfg: ModelConfig, seed: int = 0, name: str = "random") -> Model:
    """Deterministic random weights for `cfg` (same seed, same words), scaled to keep activations O(1).
    Each tensor has its own child seed, so the tensors are made in parallel threads."""
    shapes = expected_tensors(cfg)
    seeds = np.random.SeedSequence(seed).spawn(len(shapes))
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        arrays = pool.map(_random_tensor, shapes.keys(), shapes.values(), seeds)
        tensors = dict(zip(shapes.keys(), arrays))
    return Model(cfg, tensors, name=name, source=f"random:{name}:seed={seed}")


def synthetic_model(shape: str = "stories15M", seed: int = 0, max_seq: int | None = None) -> Model:
    """The embedded default model: a preset of SHAPES with random weights, built in memory."""
    if shape not in SHAPES:
        raise InvalidArgumentError(f"unknown synthetic shape {shape!r} (choose from {', '.join(SHAPES)})")
    cfg = SHAPES[shape]
    if max_seq is not None:
        cfg = dataclasses.replace(cfg, max_seq=max_seq)
    return random_model(cfg, seed=seed, name=shape)
