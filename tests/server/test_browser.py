"""A real browser: Playwright drives Debian's Chromium (headless) against the app on loopback, one browser for the
module. It signs in, answers with the keyboard only (three picks, a skip, a flag with a note, and one answer changed
with `u`), and the store must hold exactly those judgements; the options are shuffled per labeler, so each stored pick
must be the sample whose text was on the key pressed.
Also checks that the page runs under its CSP without errors and that a `<script>` in a sample is shown as text, and
that the pages fit a phone (375x740) and a desktop (1280x800): the first option on screen without scrolling, nothing
wider than the window, even with an 80-character labeler name.
CI installs Chromium with scripts/ci_browser_deps.sh; never `playwright install` (it downloads browsers)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app
from lmprefs.server.live import running

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS = "<script>alert('xss')</script>"


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: run scripts/ci_browser_deps.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def sign_in(page, url: str, token: str) -> None:
    page.goto(url + "/label")  # not signed in: sent to the sign-in page
    assert page.url == url + "/login"
    page.fill("#token", token)
    page.keyboard.press("Enter")
    page.wait_for_url(url + "/label")


def test_label_with_the_keyboard_in_chromium(browser, tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        store.add_item(f"The first query. {XSS}", [f" first {j} {XSS}" for j in range(4)], source="t")
        for i in range(2, 8):
            store.add_item(f"Query {i}.", [f" sample {i}.{j}" for j in range(4)], source="t")
        token = store.add_labeler("browser")

    problems: list[str] = []
    answered: list[tuple[int, str]] = []
    picked: dict[int, str] = {}  # item -> text of the option pressed
    with running(create_app(path)) as url:
        page = browser.new_page()
        try:
            page.set_default_timeout(10_000)
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            sign_in(page, url, token)
            assert XSS in page.inner_text(".query .text")  # shown as text, never run

            orders = []

            def answer(key: str, expect: str, note: str | None = None) -> None:
                item = int(page.get_attribute("#label-form", "data-item"))
                texts = page.locator("button.option .text").all_inner_texts()
                orders.append(texts)
                if key.isdigit():
                    picked[item] = texts[int(key) - 1]
                if note is None:
                    page.keyboard.press(key)
                else:
                    page.keyboard.press("f")  # moves to the note field, typing nothing into it
                    page.keyboard.type(note)
                    page.keyboard.press("Enter")
                page.wait_for_selector(f'.flash:has-text("item {item} {expect}")')  # Saved: or Changed:
                answered.append((item, key if note is None else "f"))

            answer("2", "picked option 2")
            answer("4", "picked option 4")
            answer("1", "picked option 1")
            answer("s", "skipped")
            answer("f", "flagged", note="off-topic")
            assert page.inner_text("#done-count") == "3"
            # change the flag into a pick: u brings the item back, in the same order, and 3 replaces the answer
            page.keyboard.press("u")
            page.wait_for_selector("#redo")
            assert int(page.get_attribute("#label-form", "data-item")) == answered[4][0]
            assert page.locator("button.option .text").all_inner_texts() == orders[4]
            answered.pop()
            answer("3", "picked option 3")
            assert page.inner_text("#done-count") == "4"
        finally:
            page.close()

    assert not problems, problems
    assert len({item for item, _ in answered}) == 5
    assert any(o != sorted(o) for o in orders)  # the options were shuffled (samples are numbered in stored order)
    with LabelStore(path) as store:
        rows = store.connection().execute("SELECT item_id, kind, best, note FROM labels ORDER BY id").fetchall()
        texts = {item: store.get_item(item).samples for item, _ in answered}
    expected = [(item, "label", None) for item, _ in answered[:3]]
    expected += [(answered[3][0], "skip", None), (answered[4][0], "label", None)]
    assert [(item, kind, note) for item, kind, _, note in rows] == expected
    for item, _, best, _ in rows:  # each stored index points at the text that was on the key pressed
        if item in picked:
            assert texts[item][best].strip() == picked[item].strip()


# LMPREFS_SCREENSHOTS=docs/img: the layout test also writes its screenshots there (the docs show them)
SCREENSHOTS = Path(os.environ["LMPREFS_SCREENSHOTS"]) if os.environ.get("LMPREFS_SCREENSHOTS") else None

PASSAGE = ("She walked into the room and looked around. The furniture was old but well kept, and the windows let in a "
           "pale light that fell across the floor in long stripes.")  # fmt: skip
ENDINGS = [
    " The chair creaked as she sat down, and for a moment she thought she heard someone on the stairs.",
    " Nothing moved. The house was quiet, the way it always was in the hour before dinner.",
    " She smiled, remembering the summers she had spent here as a child, running through the garden.",
    " A letter lay on the table, its envelope torn open, the handwriting unmistakably her mother's.",
]


def test_the_pages_fit_a_phone_and_a_desktop_without_scrolling_sideways(browser, tmp_path):
    path = tmp_path / "labels.sqlite"
    long_name = "x" * 80  # no spaces to break at
    with LabelStore(path) as store:
        ids = [store.add_item(f"{PASSAGE} ({i})", ENDINGS, source="t") for i in range(6)]
        store.set_gold(ids[5], 1)
        token = store.add_labeler(long_name, admin=True)
        anchor = store.add_item(f"{PASSAGE} (anchor)", ENDINGS, source="t")
        store.set_anchor(anchor)  # a drift chart, captioned with the long name (it made the page 711 px wide)
        store.set_anchor_every(50)
        store.add_anchor_answer(anchor, store.labelers()[0].id, 0, best=1)
        for i in ids[:3]:  # the admin page's tables: labelers, quality, agreement, flags, held and gold items
            store.add_label(i, long_name[:-1] + "y", best=1, shown=[0, 1, 2, 3], seconds=4.0)
            store.add_label(i, "carol", best=1, shown=[1, 0, 2, 3], seconds=5.0)
        store.add_label(ids[3], "carol", kind="flag", note="n" * 120)
    with running(create_app(path, gold_rate=0.1)) as url:
        page = browser.new_page(viewport={"width": 375, "height": 740})
        try:
            sign_in(page, url, token)
            assert "u change your last answer" in page.inner_text("#keys")  # every key is in the hint
            for width, height in ((375, 740), (1280, 800)):
                page.set_viewport_size({"width": width, "height": height})
                for where in ("/label", "/admin"):
                    page.goto(url + where)
                    shot = tmp_path / f"{where[1:]}-{width}.png"
                    page.screenshot(path=shot, full_page=True)
                    if SCREENSHOTS:  # the docs' pictures of the app come from this test
                        shutil.copyfile(shot, SCREENSHOTS / f"app-{where[1:]}-{width}.png")
                    wide, window = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
                    assert wide <= window, (where, width, wide)
                page.goto(url + "/label")
                box = page.locator("button.option").first.bounding_box()
                assert page.evaluate("scrollY") == 0
                assert box["x"] >= 0 and box["x"] + box["width"] <= width, (width, box)
                assert box["y"] >= 0 and box["y"] + box["height"] <= height, (width, box)  # seen without scrolling
        finally:
            page.close()


def test_s_on_a_practice_page_does_nothing_and_on_an_anchor_skips(browser, tmp_path):
    # `s` sent a skip from both, which the server refused with a bare 422 page
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        gold = store.add_item(f"{PASSAGE} (gold)", ENDINGS, source="t")
        store.set_gold(gold, 2, note="the calm one")
        anchor = store.add_item(f"{PASSAGE} (anchor)", ENDINGS, source="t")
        store.set_anchor(anchor)
        store.add_item(PASSAGE, ENDINGS, source="t")
        store.set_onboarding(1, 0.0)
        store.set_anchor_every(10)
        token = store.add_labeler("newcomer")
    problems: list[str] = []
    with running(create_app(path)) as url:
        page = browser.new_page()
        try:
            page.set_default_timeout(10_000)
            page.on("pageerror", lambda e: problems.append(str(e)))
            sign_in(page, url, token)
            assert "Practice question 1 of 1" in page.inner_text("#practice")
            page.keyboard.press("s")
            page.keyboard.press("f")
            page.wait_for_timeout(300)
            assert page.url == url + "/label" and "Practice question 1 of 1" in page.inner_text("#practice")
            page.keyboard.press("1")
            page.wait_for_selector("#feedback")  # admitted at 0%: the anchor comes next, unannounced
            assert page.get_attribute("#label-form", "data-item") == str(anchor)
            page.keyboard.press("s")
            page.wait_for_selector(f'.flash:has-text("Saved: item {anchor} skipped.")')
        finally:
            page.close()
    assert not problems, problems


def test_a_ranking_can_be_submitted_on_a_phone_without_scrolling(browser, tmp_path):
    # four long options put the Submit button three screens down on a 375 px phone
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        store.add_item(PASSAGE, [f" option {j}: " + "a long continuation " * 12 for j in range(4)], source="t",
                       label_type="ranking_4")  # fmt: skip
        token = store.add_labeler("ranker")
    with running(create_app(path)) as url:
        page = browser.new_page(viewport={"width": 375, "height": 740})
        try:
            sign_in(page, url, token)
            first = page.locator("button.option").first.bounding_box()
            submit = page.locator("#ranking-submit").bounding_box()
            assert page.evaluate("scrollY") == 0 and first["y"] + first["height"] < 740
            assert submit["y"] >= 0 and submit["y"] + submit["height"] <= 740, submit  # on screen without scrolling
            assert submit["y"] >= first["y"] + first["height"]  # below the first option, not over it
            for key in "1234":
                page.keyboard.press(key)
            page.click("#ranking-submit")
            page.wait_for_selector('.flash:has-text("ranked options 1, 2, 3, 4")')
        finally:
            page.close()


def test_rank_with_the_keyboard_in_chromium(browser, tmp_path):
    """Keys 1-4 build the order on screen, Backspace and r take it back, x sets confidence 2, Enter submits; the store
    holds the samples in the order of the texts on the keys pressed."""
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        store.add_item("Rank these.", [f" sample {j}" for j in range(4)], source="t", label_type="ranking_4")
        token = store.add_labeler("ranker")
    problems: list[str] = []
    with running(create_app(path)) as url:
        page = browser.new_page()
        try:
            page.set_default_timeout(10_000)
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            sign_in(page, url, token)
            texts = page.locator("button.option .text").all_inner_texts()
            for key in "31":
                page.keyboard.press(key)
            assert page.inner_text("#ranking-order") == "1. option 3 · 2. option 1"
            assert page.is_disabled("#ranking-submit")
            page.keyboard.press("Enter")  # incomplete: nothing is sent
            page.keyboard.press("r")
            assert page.inner_text("#ranking-order") == "none yet"
            for key in "2413":
                page.keyboard.press(key)
            page.keyboard.press("Backspace")
            page.keyboard.press("3")
            assert page.inner_text("button.option[data-key='4'] .rank") == "#2"
            page.keyboard.press("x")  # fairly sure
            page.keyboard.press("Enter")
            page.wait_for_selector('.flash:has-text("ranked options 2, 4, 1, 3 (confidence 2)")')
        finally:
            page.close()
    assert not problems, problems
    with LabelStore(path) as store:
        (ex,) = store.labeled_examples("ranking_4")
    assert [ex.samples[i].strip() for i in ex.ranking] == [texts[k - 1].strip() for k in (2, 4, 1, 3)]
    assert ex.confidence == 2
