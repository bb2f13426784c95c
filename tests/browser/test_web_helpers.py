"""The page's shared helpers, run in Chromium as the page runs them: the byte
formatter (web/format.js `bytes`, every size on the page), the render scheduler
(web/schedule.js, the job view's, the chat's and the export panel's renders) and
the element builder (web/dom.js `el`). Each module is imported into a served page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.config import Settings
from tests.helpers.browser import open_page
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.browser


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: Any) -> Iterator[Any]:
    """The page, open on a live server with no jobs."""
    monkeypatch.chdir(REPO)
    with LiveServer(Settings(data_dir=tmp_path / "data")) as server:
        open_page(page, server.url)
        yield page


def test_bytes_reads_as_people_write_sizes(served: Any) -> None:
    values = [None, float("nan"), 0, 1, 512, 999, 999.6, 1536, 65536, 999_999, 734_003_200, 5_368_709_120,
              25_300_000_000, 2e12, 1.5e15, 3e18]
    shown = served.evaluate(
        """async (values) => {
            const { bytes } = await import("/format.js");
            return [...values.map((value) => bytes(value)), bytes(Infinity), bytes(undefined)];
        }""",
        values,
    )
    assert shown == [
        "–", "–", "0 bytes", "1 byte", "512 bytes", "999 bytes",
        "1 kB",  # 999.6 bytes round to 1,000: the next unit up
        "1.54 kB", "65.5 kB",
        "1 MB",  # not "1,000 kB"
        "734 MB", "5.37 GB", "25.3 GB", "2 TB", "1.5 PB", "3,000 PB",
        "–", "–",
    ]


def test_renders_are_coalesced_to_one_per_frame(served: Any) -> None:
    runs = served.evaluate(
        """async () => {
            const { renderScheduler, scheduleRender } = await import("/schedule.js");
            const frame = () => new Promise((done) => requestAnimationFrame(done));
            const log = [];
            const job = renderScheduler(() => log.push("job"));
            const chat = renderScheduler(() => log.push("chat"));
            let again = 0;
            const growing = () => {
                log.push(`growing ${again}`);
                if (again++ === 0) scheduleRender(growing); // asked for again while it draws
            };
            for (let i = 0; i < 5; i += 1) {
                job();
                chat();
                scheduleRender(growing);
            }
            const before = log.length;
            await frame();
            const first = log.slice();
            await frame();
            const second = log.slice(first.length);
            await frame();
            return { before, first, second, third: log.slice(first.length + second.length) };
        }"""
    )
    # Nothing draws at once; each render once on the next frame, all on the same one;
    # a render asked for while it draws runs again on the frame after, once.
    assert runs == {"before": 0, "first": ["job", "chat", "growing 0"], "second": ["growing 1"], "third": []}


def test_el_builds_elements_with_text_never_markup(served: Any) -> None:
    built = served.evaluate(
        """async () => {
            const { el } = await import("/dom.js");
            let clicks = 0;
            const button = el("button", {
                type: "button", class: "btn btn-small", "data-testid": "x", "aria-label": "Go", hidden: false,
                disabled: true, title: null, style: { whiteSpace: "pre-wrap" }, onclick: () => { clicks += 1; },
            }, "Go ", 3, null, undefined, false, "", ["<b>not bold</b>", el("span", "inner")]);
            const disabled = button.getAttribute("disabled"); // true: present, empty
            button.disabled = false;
            button.click();
            const plain = el("li", "just text");
            return {
                html: button.outerHTML,
                text: button.textContent,
                clicks,
                disabled,
                childNodes: button.childNodes.length,
                plain: plain.outerHTML,
                empty: el("div").outerHTML,
                withNode: el("p", el("code", "c")).outerHTML,
                list: el("ul", ["a", "b"].map((item) => el("li", item))).outerHTML,
            };
        }"""
    )
    assert built["html"] == (
        '<button type="button" class="btn btn-small" data-testid="x" aria-label="Go" style="white-space: pre-wrap;">'
        "Go 3&lt;b&gt;not bold&lt;/b&gt;<span>inner</span></button>"
    )
    assert built["text"] == "Go 3<b>not bold</b>inner"
    assert built["clicks"] == 1
    assert built["disabled"] == ""
    assert built["childNodes"] == 4  # "Go ", "3", the text with brackets, the span: nothing for null/false/""
    assert built["plain"] == "<li>just text</li>"
    assert built["empty"] == "<div></div>"
    assert built["withNode"] == "<p><code>c</code></p>"
    assert built["list"] == "<ul><li>a</li><li>b</li></ul>"
