"""Redraw ``docs/sweep-report.png``: the README's own ``sweep --format html`` command, rendered
in headless Chromium at 1,400 px (offline, as the browser test renders it).

    python docs/sweep_screenshot.py            # from the repository root, in the dev venv

The command is read from README.md (the first ``autopar sweep ... --format html`` line), so the
picture is always of what the README tells a reader to run.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "sweep-report.png"
WIDTH_PX, HEIGHT_PX = 1400, 1700
BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome", "google-chrome-stable")
OFFLINE = (  # no sandbox (root), no background services, every host unresolvable
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars",
)  # fmt: skip


def readme_command() -> list[str]:
    """The README's HTML sweep, as arguments after ``autopar`` (its ``-o`` dropped)."""
    for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("autopar sweep ") or "--format html" not in line:
            continue
        words = shlex.split(line.split("#")[0])
        if words[:2] == ["autopar", "sweep"]:
            out = words[1:]
            for flag in ("-o", "--output"):
                if flag in out:
                    del out[out.index(flag) : out.index(flag) + 2]
            return out
    raise SystemExit("README.md has no `autopar sweep ... --format html` line")


def main() -> None:
    browser = next((found for b in BROWSERS if (found := shutil.which(b))), None)
    if browser is None:
        raise SystemExit(f"no headless Chromium on PATH (looked for {', '.join(BROWSERS)})")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "plan.html"
        args = [*readme_command(), "--output", str(page)]
        print("autopar", shlex.join(args), file=sys.stderr)
        subprocess.run([sys.executable, "-m", "autopar", *args], check=True)
        subprocess.run(
            [
                browser, *OFFLINE, f"--user-data-dir={scratch}/profile",
                f"--window-size={WIDTH_PX},{HEIGHT_PX}", "--virtual-time-budget=10000",
                f"--screenshot={TARGET}", page.as_uri(),
            ],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    print(f"wrote {TARGET.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
