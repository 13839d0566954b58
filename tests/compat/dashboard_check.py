"""Loads Flink's web dashboard, served by a coordinator at ``/flink/``, in headless Chromium
(Playwright) and reports what each page requested and showed, as one JSON object on stdout.

    .venv-compat/bin/python tests/compat/dashboard_check.py http://127.0.0.1:8081 JOBID

Pages: Overview, Running Jobs (or Completed Jobs), the job's Overview, and its Checkpoints tab
(Overview, History, Configuration). A request that fails, or is answered 4xx/5xx, is listed
under ``failed``; ``checkpoints`` holds the text the Checkpoints tab shows. Runs in the venv
``make compat`` makes (playwright is not a dependency of sparkpoint); the browser is Debian's
Chromium (/usr/bin/chromium, or $CHROMIUM).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def main(base: str, jid: str, finished: bool) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    listing = "completed-jobs" if finished else "running-jobs"
    pages = {
        "overview": "#/overview",
        listing: f"#/job/{'completed' if finished else 'running'}",
        "job": f"#/job/{'completed' if finished else 'running'}/{jid}/overview",
        "checkpoints": f"#/job/{'completed' if finished else 'running'}/{jid}/checkpoints",
    }
    report: dict[str, Any] = {"requests": [], "failed": [], "pages": {}}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), args=FLAGS
        )
        page = browser.new_page()
        page.on(
            "requestfailed",
            lambda r: report["failed"].append(f"{r.method} {r.url}: {r.failure}"),
        )

        def answered(response: Any) -> None:
            if response.url.startswith(base) and "/flink/" in response.url:
                path = response.url[len(base) :]
                if path.split("?")[0].rsplit(".", 1)[-1] not in ("js", "css", "svg", "woff2"):
                    report["requests"].append(f"{response.request.method} {path}")
            if response.status >= 400:
                report["failed"].append(f"{response.status} {response.url}")

        page.on("response", answered)
        for name, fragment in pages.items():
            page.goto(f"{base}/flink/{fragment}")
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(1500)  # the dashboard polls; let its first answers render
            if name == "checkpoints":
                texts = {"overview": page.inner_text("body")}
                for tab in ("History", "Configuration"):
                    link = page.get_by_text(tab, exact=True)
                    if link.count():
                        link.first.click()
                        page.wait_for_timeout(1000)
                        texts[tab.lower()] = page.inner_text("body")
                report["checkpoints"] = texts
            report["pages"][name] = page.title()
            page.screenshot(path=os.path.join(os.environ.get("SCREENSHOTS", "."), f"{name}.png"))
        browser.close()
    report["requests"] = sorted(set(report["requests"]))
    return report


if __name__ == "__main__":
    finished = "--finished" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--finished"]
    print(json.dumps(main(args[0].rstrip("/"), args[1], finished)))
