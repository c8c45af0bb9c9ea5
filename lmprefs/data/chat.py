"""Chat templates as a query's frame (task.chat_template): the text an instruct model's template puts before a
user turn's content becomes token ids before the query, and the text after it (the end of the turn and the
assistant's header) ids after the query. A query stays a fixed-length padded block between fixed ids, so sampling,
PPO, the frozen prefix and the reward model (which reads the same framed query) are the same code with or without
a template, and the texts kept in samples, reports and the label store are the plain query texts."""

from __future__ import annotations

from lmprefs.assets.models import MODEL_ASSETS, resolve_model
from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.config import TaskConfig
from lmprefs.data.tasks import encode_fixed
from lmprefs.errors import UserError

# a content string no template rewrites (no leading or trailing space a template might strip, no markup)
SENTINEL = "LMPREFSQUERYSENTINEL"
CHECK_TEXT = "It is a truth universally acknowledged."


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat_template(task: TaskConfig, tokenizer) -> bool:
    """Whether task.chat_template frames this task's queries with the tokenizer's template. auto: only for a model
    of the user's own (not a bundled asset, whose presets reproduce the original's raw-text format) that has one."""
    if task.chat_template == "true":
        if not has_chat_template(tokenizer):
            raise UserError(f"task.chat_template=true: {task.initial_model!r} has no chat template (its tokenizer "
                            "sets none); use task.chat_template=false")  # fmt: skip
        return True
    if task.chat_template == "false":
        return False
    return has_chat_template(tokenizer) and task.initial_model not in MODEL_ASSETS


def chat_template_note(task: TaskConfig, tokenizer, what: str = "queries") -> str | None:
    """The line a command prints where task.chat_template=auto frames `what` with the model's chat template (the
    texts a model reads change with it; a user who did not ask for it should know, and how to turn it off); None
    where the template is not used or was asked for."""
    if task.chat_template != "auto" or not has_chat_template(tokenizer):
        return None
    return (f"task.chat_template=auto: {task.initial_model!r} has a chat template, so {what} are framed as a user "
            "turn and its answer; task.chat_template=false uses plain text")  # fmt: skip


def check_chat_template(task: TaskConfig) -> None:
    """task.chat_template=true for a model without a template, refused from its tokenizer alone, before a command
    writes its run directory (a model that cannot be read is left to the loading that names it)."""
    if task.chat_template != "true":
        return
    try:
        tokenizer = load_tokenizer(resolve_model(task.initial_model))
    except (OSError, ValueError):
        return
    uses_chat_template(task, tokenizer)


def render_user_turn(tokenizer, content: str) -> str:
    """The template's text of one user turn followed by the assistant's generation prompt."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip
    assert isinstance(text, str)
    return text


def chat_frame(tokenizer) -> tuple[str, str]:
    """(text before, text after) a user turn's content in the tokenizer's chat template, found by rendering a
    sentinel; checked on a second text, so a template that alters the content (strips or escapes it) is refused
    rather than framed wrongly."""
    text = render_user_turn(tokenizer, SENTINEL)
    if text.count(SENTINEL) != 1:
        raise UserError("task.chat_template: the tokenizer's chat template does not put a user turn's text once, "
                        "verbatim, in its output; use task.chat_template=false")  # fmt: skip
    before, after = text.split(SENTINEL)
    if render_user_turn(tokenizer, CHECK_TEXT) != before + CHECK_TEXT + after:
        raise UserError("task.chat_template: the tokenizer's chat template renders a user turn's text differently "
                        "from one text to another, so it cannot frame fixed-length queries; use "
                        "task.chat_template=false")  # fmt: skip
    return before, after


def template_lengths(task: TaskConfig, tokenizer) -> tuple[int, int]:
    """Ids the chat template puts before and after a query ((0, 0) when it does not apply)."""
    if not uses_chat_template(task, tokenizer):
        return 0, 0
    before, after = chat_frame(tokenizer)
    return len(encode_fixed(tokenizer, before)), len(encode_fixed(tokenizer, after))


def task_frame(task: TaskConfig, tokenizer, chat: bool | None = None) -> tuple[list[int], list[int]]:
    """(prefix ids, suffix ids) put around every padded query: task.query_prefix and task.query_suffix, inside the
    chat template's user turn when it applies (`chat`: whether it does; None = decide by task.chat_template)."""
    prefix, suffix = encode_fixed(tokenizer, task.query_prefix), encode_fixed(tokenizer, task.query_suffix)
    if not (uses_chat_template(task, tokenizer) if chat is None else chat):
        return prefix, suffix
    before, after = chat_frame(tokenizer)
    return encode_fixed(tokenizer, before) + prefix, suffix + encode_fixed(tokenizer, after)


def saved_task(task: TaskConfig, tokenizer) -> dict:
    """The query format a reward model is saved with (lmprefs.json's "task"): query_prefix, query_suffix, the trained
    lengths, whether the chat template framed the queries (resolved, never auto) and, where it did, its text before
    and after a query (`chat_frame`), so that `lmprefs score` and a plain transformers reader frame texts as training
    did: before + query_prefix + query + query_suffix + after + response, each piece tokenized on its own."""
    out = {k: getattr(task, k) for k in ("query_prefix", "query_suffix", "query_length", "response_length")}
    out["chat_template"] = uses_chat_template(task, tokenizer)
    if out["chat_template"]:
        out["chat_frame"] = list(chat_frame(tokenizer))
    return out


def scoring_pieces(task: dict, tokenizer=None) -> tuple[list[str], list[str]]:
    """(texts before, texts after) a query in a saved reward model's frame (`saved_task`), each tokenized on its own;
    a model saved before the frame's text was kept has its tokenizer's template read instead."""
    before, after = [task.get("query_prefix", "")], [task.get("query_suffix", "")]
    if task.get("chat_template"):
        frame = task.get("chat_frame") or chat_frame(tokenizer)
        before, after = [frame[0], *before], [*after, frame[1]]
    return before, after
