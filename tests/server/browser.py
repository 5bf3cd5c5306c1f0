"""The headless browser the server-tier tests open pages in: Debian's chromium (installed by .ci/run where it can be),
with the flags that keep it off the network. Tests that need it skip with the install command where it is missing.
"""

import os
import shutil

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and os.path.exists(p)), "")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=5000"]
