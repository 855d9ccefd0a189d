"""A question's ids and its choices' tokens, checked before anything is read (``Shadow.ask``)."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import BadInput
from .protocols import Prompter
from .token_ids import checked

MAX_CHOICES = 26


def choice_tokens(prompter: Prompter, choices: Sequence[str]) -> list[int]:
    """One token per choice, each a label that is one token (``A``, ``B``, ...), or BadInput."""
    if not choices:
        raise BadInput("choices is empty")
    if len(choices) > MAX_CHOICES:
        raise BadInput(f"{len(choices)} choices; at most {MAX_CHOICES}")
    if len(set(choices)) != len(choices):
        raise BadInput("choices repeat a label")
    tokens = []
    for c in choices:
        t = prompter.single_token(c)
        if t is None:
            raise BadInput(f"choice {c!r} is not one token")
        tokens.append(t)
    return tokens


def question_ids(prompter: Prompter, vocab_size: int, question: str | Sequence[int]) -> list[int]:
    """A question as text (rendered by the prompter) or as ids (checked against the vocabulary)."""
    if isinstance(question, str):
        if not question.strip():
            raise BadInput("empty question")
        return prompter.question_ids(question)
    ids = checked(question, vocab_size, "question")
    if not ids:
        raise BadInput("empty question")
    return ids
