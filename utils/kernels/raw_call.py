"""Run by utils.kernels.raw_errors in a child process (lesson 06): load an extension and call each bad input,
printing one JSON line before and one after every call. A call that kills this process names itself: its "start"
line has no result line. faulthandler adds the fatal signal and the Python line to stderr.

    python -m utils.kernels.raw_call LIBRARY NAMESPACE '{"name": "expression over ops and torch", ...}'
"""

import faulthandler
import json
import sys

import torch


def main(library: str, namespace: str, calls_json: str) -> None:
    faulthandler.enable()
    torch.ops.load_library(library)
    scope = {"ops": getattr(torch.ops, namespace), "torch": torch}
    for name, expr in json.loads(calls_json).items():
        print(json.dumps({"start": name}), flush=True)
        try:
            eval(expr, scope)  # the expressions are the course's own (kernels.RAW_BAD_INPUTS) or a test's
            result = "no error"
        except Exception as exc:
            result = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(json.dumps({"name": name, "result": result}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
