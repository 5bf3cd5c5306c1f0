"""Which lessons an emulated platform must run again (`make test-platforms`), as a pytest -k expression.

    python -m tests.build.platform_lessons PLATFORM [REFERENCE]

prints "every lesson" for the reference itself, "no_lesson_differs", or e.g. "01_inference_modes or 03_profiling_amp".

The reference platform (default linux-aarch64) runs every lesson. Another platform runs a lesson again only where its
platform changes something the lesson reads: an optional section predicted differently (utils.core.sections.predict),
or a capability the lesson's own code reads outside a section guard (READS). A lesson that would take exactly the
same path as the reference run is not run twice: that keeps the whole CI run within its time budget (issue 26).
Each platform's answers come from a child process with WORKBOOK_EMULATE set, so nothing here is cached across them.
"""

from __future__ import annotations

import json
import subprocess
import sys

from utils.core import env

# Capabilities lesson code reads without a section guard (a portable path chosen by the capability, not a skip).
READS = {
    "00_environment": ("page_faults",),  # clone page faults (env.page_faults)
    "01_serving_basics": ("glibc_malloc", "quantized_engine"),  # heap_bytes_held_by's source; dynamic int8's engine
    "03_profiling_amp": ("page_faults",),  # allocator faults per step
    "04_onnx_tensorrt": ("page_faults",),  # ORT vs eager page faults
    "04_porting": ("quantized_engine",),  # MiniLM dynamic int8
    "08_interview_prep": ("quantized_engine",),  # the dynamic-quantization proof in the interview bank
}

_PROBE = """
import json
from utils.core import env, sections
caps = env.capabilities()
print(json.dumps({"plan": {s: v[0] for s, v in sections.predict().items()},
                  "caps": {k: [c.available, c.reason.split(" ")[0]] for k, c in caps.items()}}))
"""


def _probe(platform: str) -> dict:
    child = env.child_environ()
    child["WORKBOOK_EMULATE"] = platform
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=child,
                         cwd=env.repo_root(), check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def lessons_to_run(platform: str, reference: str = "linux-aarch64") -> list[str]:
    """Stems of the lesson notebooks whose path under `platform` differs from the `reference` platform's run: a
    section guarded in that notebook is predicted differently, or a capability it reads (READS) differs."""
    from tests.notebooks.test_lesson_results import LESSONS

    if platform == reference:
        return [nb.stem for nb in LESSONS]
    here, ref = _probe(platform), _probe(reference)
    changed = [s for s in here["plan"] if here["plan"][s] != ref["plan"][s]]
    out = []
    for nb in LESSONS:
        text = nb.read_text()
        if any(f'section=\\"{s}\\"' in text for s in changed) or \
                any(here["caps"][c] != ref["caps"][c] for c in READS.get(nb.stem, ())):
            out.append(nb.stem)
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m tests.build.platform_lessons PLATFORM [REFERENCE]", file=sys.stderr)
        return 2
    platform, reference = argv[0], (argv[1] if len(argv) == 2 else "linux-aarch64")
    if platform == reference:  # the reference runs everything, the lesson-independent checks included
        print("every lesson")
        return 0
    stems = lessons_to_run(platform, reference)
    print(" or ".join(stems) if stems else "no_lesson_differs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
