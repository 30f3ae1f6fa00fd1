"""The dashboard's own redaction (ui/redact.js) agrees with duetime.core.redact on what it
masks: run under Node.js when it is installed (the browser tests run it in Chromium)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.redact import redact_headers, redact_text, redact_url

UI = Path(__file__).resolve().parents[2] / "producers" / "api" / "ui"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")

URLS = [
    "http://user:pw@hooks.example.com/p?api_key=k1&team=a",
    "https://hooks.example.com/p",
    "https://h.example.com/p?flag",
    "https://u@h.example.com:8443/a/b?x=1#frag",
    "http://127.0.0.1:9/hook?token=t&t2=",
]
TEXTS = [
    "POST http://u:s3cr3t@h.example.com/p?k=v failed: Bearer abcdef123456",
    "no url here, Basic dXNlcjpwYXNz and token xyz",
    "two: https://a.example/x?y=1 and ftp://u:p@b.example/",
]
HEADERS = [
    {"Authorization": "Bearer x", "X-Api-Key": "k", "Accept": "json", "Cookie": "c"},
    {"X-Signature": "${secret:HOOK}", "Authorization": "Bearer ${secret:TOKEN}", "X-T": "v"},
    {"X-Auth": "${secret:A} extra"},
]


def _run_js(cases: dict[str, list[object]]) -> dict[str, list[object]]:
    script = (
        f"import * as r from {json.dumps((UI / 'redact.js').as_uri())};\n"
        f"const cases = {json.dumps(cases)};\n"
        "console.log(JSON.stringify({\n"
        "  urls: cases.urls.map(r.redactUrl),\n"
        "  texts: cases.texts.map(r.redactText),\n"
        "  headers: cases.headers.map(r.redactHeaders),\n"
        "}));\n"
    )
    assert NODE is not None
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out: dict[str, list[object]] = json.loads(done.stdout)
    return out


def test_the_dashboard_masks_what_the_server_masks() -> None:
    out = _run_js({"urls": URLS, "texts": TEXTS, "headers": HEADERS})  # type: ignore[dict-item]
    assert out["urls"] == [redact_url(u) for u in URLS]
    assert out["texts"] == [redact_text(t) for t in TEXTS]
    assert out["headers"] == [redact_headers(h) for h in HEADERS]


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.builds(
            lambda user, query: f"https://{user}h.example.com/p{query}",
            st.sampled_from(["", "u@", "u:p@", "a:b:c@"]),
            st.sampled_from(["", "?a=1", "?a=1&b", "?x=%20y&z=="]),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_urls_agree(urls: list[str]) -> None:
    assert _run_js({"urls": urls, "texts": [], "headers": []})["urls"] == [  # type: ignore[dict-item]
        redact_url(u) for u in urls
    ]
