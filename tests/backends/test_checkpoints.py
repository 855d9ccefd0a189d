"""Loading real-format checkpoints: layouts, sharding, malformed folders, the weights hash, mmap."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shadow.backends.qwen35 import Qwen35, Qwen35Config
from shadow.backends.qwen35.checkpoint import random_tensors, write_checkpoint
from shadow.backends.qwen35.weights import weights_hash
from shadow.core.errors import CheckpointError

from .tiny import CONFIGS, tiny

TC = CONFIGS["gva-untied"]


@pytest.fixture
def folder(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "ck", TC, dtype=torch.float32, seed=1)


def _ids() -> torch.Tensor:
    return torch.arange(0, 100) * 5 % TC["vocab_size"]


@pytest.mark.parametrize("layout", ["multimodal", "text", "mlx"])
@pytest.mark.parametrize("shards", [1, 3])
def test_layouts_and_shards_load_the_same_model(tmp_path, folder, layout, shards):
    other = write_checkpoint(tmp_path / f"{layout}-{shards}", TC, dtype=torch.float32, seed=1,
                             layout=layout, shards=shards)
    assert torch.equal(Qwen35.from_pretrained(other).logits(_ids()), Qwen35.from_pretrained(folder).logits(_ids()))
    cfg = Qwen35Config.from_folder(folder)
    assert weights_hash(other, cfg) == weights_hash(folder, cfg)


def test_hash_changes_with_any_value(tmp_path, folder):
    cfg = Qwen35Config.from_folder(folder)
    base = weights_hash(folder, cfg)
    assert base == weights_hash(folder, cfg)
    assert weights_hash(write_checkpoint(tmp_path / "s2", TC, dtype=torch.float32, seed=2), cfg) != base
    tensors = random_tensors(cfg, seed=1, dtype=torch.float32)
    tensors["layers.2.linear_attn.dt_bias"][0] += 1e-3  # one value of one tensor
    assert weights_hash(write_checkpoint(tmp_path / "one", TC, tensors), cfg) != base


def test_tied_and_untied_from_the_config(tmp_path):
    tied = Qwen35.from_pretrained(write_checkpoint(tmp_path / "t", tiny(tie=True), dtype=torch.float32))
    assert tied.lm_head is tied.embed
    untied = Qwen35.from_pretrained(write_checkpoint(tmp_path / "u", tiny(tie=False), dtype=torch.float32))
    assert untied.lm_head is not untied.embed


def test_layer_types_from_interval_when_absent(tmp_path):
    tc = tiny(layers=7)
    del tc["layer_types"]
    cfg = Qwen35Config.from_dict(tc)
    assert cfg.layer_types[3] == "full_attention" and cfg.full_layers == (3,)


def test_weights_are_mapped_not_copied(folder):
    model = Qwen35.from_pretrained(folder, dtype=torch.float32)  # stored fp32: views of the file
    storages = {model.embed.untyped_storage().data_ptr(), model.layers[0].qkv.untyped_storage().data_ptr(),
                model.layers[3].q.untyped_storage().data_ptr()}
    assert len(storages) == 1, "tensors of one file should share the one mapped storage"


def _rewrite(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _edit_config(folder: Path, edit) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


CASES = {
    "missing tensor": (lambda f: _rewrite(f, lambda t: t.pop("model.language_model.layers.1.linear_attn.A_log")),
                       "missing tensor 'layers.1.linear_attn.A_log'"),
    "unexpected tensor": (lambda f: _rewrite(f, lambda t: t.update({"model.language_model.layers.0.extra":
                                                                     torch.zeros(2)})),
                          "unexpected tensor 'model.language_model.layers.0.extra'"),
    "wrong shape": (lambda f: _rewrite(f, lambda t: t.update({"model.language_model.norm.weight": torch.zeros(3)})),
                    "'model.language_model.norm.weight' has shape [3], expected [64]"),
    "not qwen3.5": (lambda f: _edit_config(f, lambda c: c.update(model_type="llama")),
                    "model_type 'llama' is not a Qwen3.5 model"),
    "unknown layer type": (lambda f: _edit_config(f, lambda c: c["text_config"]["layer_types"].__setitem__(
        1, "sliding_attention")), "layer_types[1] is 'sliding_attention'"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "no model.safetensors"),
    "no config": (lambda f: (f / "config.json").unlink(), "no config.json"),
    "truncated file": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-100]),
                       "the tensors run past the end of the file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_checkpoint_is_a_clear_error(tmp_path, folder, case, monkeypatch):
    damage, message = CASES[case]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    damage(bad)
    computed = []
    monkeypatch.setattr(Qwen35, "forward", lambda *a, **k: computed.append(1))
    with pytest.raises(CheckpointError) as err:
        Qwen35.from_pretrained(bad)
    assert message in str(err.value)
    assert not computed
