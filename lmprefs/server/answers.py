"""What an answer form says, read for both the labeling page and onboarding: the order a labeler sees an item's
options in, and the form's choice (a displayed position, skip or flag) or ranking, checked: bad input is a 422 with
one line saying what is wrong, before anything is stored."""

from __future__ import annotations

from fastapi import HTTPException

from lmprefs.server.pages import WHOLE, State
from lmprefs.server.queue import display_order


def order_of(st: State, labeler: str, item_id: int, n: int) -> list[int]:
    return display_order(st.store.store_id, labeler, item_id, n) if st.shuffle else list(range(n))


def shown_options(st: State, labeler: str, item) -> list[tuple[int, str]]:
    """(displayed position, text) of an item's options in the order this labeler sees them."""
    order = order_of(st, labeler, item.id, len(item.samples))
    return [(position, item.samples[k]) for position, k in enumerate(order)]


def parse_ranking(text: str, n: int, iid: int) -> list[int]:
    """The form's ranking, option numbers as shown (1..n) best first, as displayed positions 0..n-1; a 422 naming a
    repeated, missing or unknown option."""
    parts = text.split(",") if text else []
    if not all(p.isascii() and p.isdigit() and len(p) == 1 for p in parts):
        raise HTTPException(422, f"ranking={text!r:.40} must be the option numbers 1..{n}, best first, separated by "
                                 f"commas (like 2,1,3), for item {iid}.")  # fmt: skip
    options = [int(p) for p in parts]
    if bad := [o for o in options if not 1 <= o <= n]:
        raise HTTPException(422, f"The ranking names option {bad[0]}; item {iid} has options 1..{n}.")
    if repeated := sorted({o for o in options if options.count(o) > 1}):
        raise HTTPException(422, f"The ranking names option {repeated[0]} twice; rank each option once (nothing "
                                 "was saved).")  # fmt: skip
    if missing := [o for o in range(1, n + 1) if o not in options]:
        raise HTTPException(422, f"The ranking leaves out option {missing[0]}; rank all {n} options (nothing was "
                                 "saved).")  # fmt: skip
    return [o - 1 for o in options]


def read_answer(choice: str, ranking: str, value_field: str, n: int, iid: int) -> tuple[str, int | None, list | None]:
    """(kind, displayed position picked, displayed positions ranked) of a form's answer, or a 422."""
    if choice in ("skip", "flag"):
        return choice, None, None
    if value_field == "ranking":
        if choice != "rank":
            raise HTTPException(422, f"Item {iid} asks for a ranking: choice={choice!r} must be 'rank' (with the "
                                     "ranking), 'skip' or 'flag'.")  # fmt: skip
        return "label", None, parse_ranking(ranking, n, iid)
    # as the page writes it: "٣".isdigit() is True, and "01" or "00" would pass as options 1 and 0
    if not WHOLE.fullmatch(choice) or not int(choice) < n:
        raise HTTPException(422, f"choice={choice!r} must be 0..{n - 1}, 'skip' or 'flag' for item {iid}.")
    return "label", int(choice), None


def saved_flash(iid: int, kind: str, position: int | None, ranked: list[int] | None, sure: int | None,
                changed: bool) -> str:  # fmt: skip
    """What the page says after an answer, the same for every question the labeler is served."""
    if ranked is not None:
        done = "ranked options " + ", ".join(str(p + 1) for p in ranked)
    else:
        done = {"label": f"picked option {(position or 0) + 1}", "skip": "skipped", "flag": "flagged"}[kind]
    sure_text = f" (confidence {sure})" if sure else ""
    return f"{'Changed' if changed else 'Saved'}: item {iid} {done}{sure_text}."


def read_confidence(confidence: str, kind: str) -> int | None:
    """The form's confidence, 1..3, or None (left out, or on a skip or flag, which judge nothing); else a 422."""
    if confidence not in ("", "1", "2", "3"):
        raise HTTPException(422, f"confidence={confidence!r:.20} must be 1 (a guess), 2 or 3 (sure), or left out.")
    return int(confidence) if confidence and kind == "label" else None
