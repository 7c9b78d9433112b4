"""What every family's readers make of every file and preset the tests hold (CPU tier): the config
of each fixture's config.json and GGUF files, each fixture's tensors as loaded (names and bytes),
each preset's config.json and the config read back from it, the names its tensors take in a GGUF
file and in saved safetensors, and the configs of GGUF files written from the family presets.

`tests/data/family_configs.json` holds what the readers gave when it was written; a change to it is
a change of behaviour. Rewrite it, where a change is meant, with `python tests/test_family_configs.py`
(from the repository root, PYTHONPATH naming it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from arcpy.model import SHAPES, config_from_hf, config_to_hf, load_model, open_gguf, random_model
from arcpy.model.checkpoint import _saved_tensors
from arcpy.model.gguf import _gguf_name
from arcpy.model.families import family_for
from arcpy.model.native import expected_tensors
from arcpy.model.quant import QuantTensor

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "family_configs.json"
FIXTURES = sorted(p for p in (DATA / "families").iterdir() if p.is_dir()) + sorted(
    p for p in (DATA / "moe").iterdir() if p.is_dir())


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def tensor_digests(model) -> dict[str, str]:
    out = {}
    for name, t in model.tensors.items():
        data = t.data if isinstance(t, QuantTensor) else t
        kind = f"q{t.format}" if isinstance(t, QuantTensor) else "bf16"
        out[name] = f"{kind} {list(data.shape)} {hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()[:16]}"
    return out


def fixture_facts() -> dict:
    out = {}
    for d in FIXTURES:
        key = f"{d.parent.name}/{d.name}"
        doc = json.loads((d / "config.json").read_text())
        cfg = config_from_hf(doc, "config.json")
        model = load_model(d)
        out[key] = {"config": repr(cfg), "config_json": config_to_hf(cfg), "loaded": repr(model.config),
                    "tensors": tensor_digests(model)}
        for g in sorted(d.glob("*.gguf")):
            for quantized in (True, False):
                ckpt = open_gguf(g, quantized=quantized)
                out[f"{key}/{g.name}/{quantized}"] = {"config": repr(ckpt.config),
                                                       "tensors": tensor_digests(ckpt.model())}
    return out


def preset_facts() -> dict:
    out = {}
    for name, cfg in SHAPES.items():
        doc = config_to_hf(cfg)
        shapes = expected_tensors(cfg)
        stub = {n: np.empty((s[0], 0), np.uint16) for n, s in shapes.items()}
        family = family_for(cfg)
        out[name] = {"config_json": doc, "read_back": repr(config_from_hf(json.loads(json.dumps(doc)), "c")),
                     "norms_less_one": family.norms_less_one,
                     "gguf_names": digest({n: _gguf_name(n, family) for n in shapes}),
                     "saved_names": digest(sorted(_saved_tensors(stub, cfg, family)))}
    return out


def written_gguf_facts(tmp: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import FAMILIES, GGUF_ARCH, preset, write_family_gguf
    from test_gguf import write_model
    from test_moe import MIXTRAL, QWEN, gguf_tensors, write

    paths = {GGUF_ARCH[family]: write_family_gguf(tmp / f"{family}.gguf", family, preset(family, max_seq=128))
             for family in FAMILIES}
    vocab = preset("qwen3").config.vocab
    for name in ("stories15M", "gqa", "tiny-quant"):
        cfg = dataclasses.replace(SHAPES[name], vocab=vocab, max_seq=256)
        paths[f"llama {name}"] = write_model(tmp / f"{name}.gguf", random_model(cfg, seed=3))
    for cfg, arch in ((QWEN, "qwen3moe"), (MIXTRAL, "llama")):
        cfg = dataclasses.replace(cfg, vocab=vocab, mlp_only_layers=())
        model = random_model(cfg, seed=5)
        paths[f"moe {arch}"] = write(tmp / f"{arch}-moe.gguf", cfg, gguf_tensors(model, permute=arch == "llama"), arch)
    out = {}
    for key, path in paths.items():
        ckpt = open_gguf(path)
        out[key] = {"config": repr(ckpt.config), "tensors": tensor_digests(ckpt.model())}
    return out


def facts(tmp: Path) -> dict:
    return {"fixtures": fixture_facts(), "presets": preset_facts(), "written": written_gguf_facts(tmp)}


def test_every_family_reads_every_file_and_preset_as_before(tmp_path):
    want = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(facts(tmp_path)))
    for part in want:
        assert set(got[part]) == set(want[part]), part
        for key in want[part]:
            assert got[part][key] == want[part][key], f"{part}: {key}"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(facts(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
