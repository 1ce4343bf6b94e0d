"""A command for the warm starter's tests: ``python -m tests.support.warm_child MODE [STATUS]``.

``report`` prints what it is (pid, parent, session, working directory, the
``PROBE`` variable, argv) as JSON, leaves a thread that prints "thread done"
and an exit function that prints "atexit ran", and exits with STATUS;
``message`` exits with a message, ``raise`` with an exception; ``wait``
prints "waiting", writes its pid to the file ``PID_FILE`` names (if set)
and sleeps; ``stubborn`` ignores SIGTERM, starts a child that ignores it
too, prints "child PID" and sleeps.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def finish_later() -> None:
    time.sleep(0.3)
    print("thread done")


def main(mode: str, status: int) -> int:
    if mode == "report":
        print(json.dumps({
            "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(),
            "probe": os.environ.get("PROBE"), "argv": sys.argv,
        }), flush=True)  # fmt: skip
        print("to stderr", file=sys.stderr)
        threading.Thread(target=finish_later).start()
        atexit.register(print, "atexit ran")
        return status
    if mode == "message":
        sys.exit("a message for the operator")
    if mode == "raise":
        raise RuntimeError("boom")
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        )])  # fmt: skip
        print("child", child.pid, flush=True)
    else:
        print("waiting", flush=True)
        if "PID_FILE" in os.environ:
            Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
