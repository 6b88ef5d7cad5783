"""The page at `GET /` (`vsagen.serve.page`): the form's fields, the names it shows escaped, no markup built from a
job's text; in a real browser (headless Chromium through Playwright, where both are installed): tests/serve/
test_routes.py."""

from __future__ import annotations

import json
import re

from vsagen.serve.page import TIMING_ROWS, page_html


def test_the_page_has_the_form_and_the_timing_rows():
    page = page_html("tiny", "160x96")
    for field in ("prompt", "size", "seconds", "steps", "seed", "attn", "token"):
        assert f'id="{field}"' in page, field
    assert 'id="image"' not in page  # a text-to-video server's
    with_image = page_html("tiny-i2v", "160x96", image=True)
    assert '<input id="image" name="image" type="file" accept="image/png,image/jpeg,image/webp" required>' in with_image
    assert 'form.append("input_reference", image.files[0])' in with_image
    optional = page_html("tiny-ti2v", "224x160", image=True, image_required=False)  # text-image to video
    assert ('<label for="image">image (optional)</label><input id="image" name="image" type="file" '
            'accept="image/png,image/jpeg,image/webp">') in optional
    assert "<title>vsagen serve: tiny</title>" in page and "e.g. 160x96" in page
    rows = json.loads(re.search(r"const ROWS = (.*);", page)[1])
    assert [tuple(r) for r in rows] == list(TIMING_ROWS)
    assert "__" not in page.replace("__proto__", "")  # every placeholder filled


def test_names_are_escaped_and_job_text_is_never_markup():
    page = page_html("<script>alert(1)</script>", "16x16\"><b>")
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '16x16&quot;&gt;&lt;b&gt;' in page
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page
