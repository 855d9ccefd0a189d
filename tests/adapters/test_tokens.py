from __future__ import annotations

import subprocess
import sys

from shadow.adapters import tokens as T
from shadow.adapters.tokens import Tokens, get_tokens

# A sample that round-trips, with ids checked against the real vocabulary.
SAMPLE = (
    "<|im_start|>user\nHello! 毕老师！1 + 1 = 2, café naïve 12345 don't  \n\n<think>\nok\n</think>\n\n"
    "<|im_end|>"
)
SAMPLE_IDS = [
    248045, 846, 198, 9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 11, 50203,
    91603, 571, 220, 16, 17, 18, 19, 20, 1459, 914, 18050, 248068, 198, 547, 198, 248069, 271, 248046,
]  # fmt: skip


def test_special_ids() -> None:
    tk = get_tokens()
    assert tk.n_vocab == 248077
    for text, want in [
        ("<|endoftext|>", T.ENDOFTEXT),
        ("<|im_start|>", T.IM_START),
        ("<|im_end|>", T.IM_END),
        ("<think>", T.THINK),
        ("</think>", T.THINK_END),
        ("<tool_call>", T.TOOL_CALL),
        ("</tool_call>", T.TOOL_CALL_END),
        ("<tool_response>", T.TOOL_RESPONSE),
        ("</tool_response>", T.TOOL_RESPONSE_END),
    ]:
        assert tk.encode(text) == [want]
    assert (T.IM_START, T.IM_END, T.THINK, T.THINK_END, T.ENDOFTEXT) == (
        248045,
        248046,
        248068,
        248069,
        248044,
    )


def test_sample_round_trip() -> None:
    tk = get_tokens()
    assert tk.encode(SAMPLE) == SAMPLE_IDS
    assert tk.decode(SAMPLE_IDS) == SAMPLE


def test_nfc_and_cache() -> None:
    tk = Tokens()
    assert tk.encode("cafe\u0301") == tk.encode("café")
    assert get_tokens() is get_tokens()


def test_pure_python() -> None:
    # The adapters run in processes (API, benchmarks) that may never load torch.
    code = (
        "import sys\n"
        "import shadow.adapters.tokens, shadow.adapters.chat, shadow.adapters.transcripts\n"
        "shadow.adapters.tokens.get_tokens().encode('x')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
