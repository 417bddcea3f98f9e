"""Run an ExecutionController in its own process (so a test can SIGKILL it).

Usage: python -m tests.support.controller_main STATE_ROOT
Prints ``ready`` once recovery is done, then runs until killed.
"""

from __future__ import annotations

import os
import sys
import time

from qinglong_edge.execution.controller import ExecutionController
from qinglong_edge.local.store import Store
from tests.support.execution_env import Env


def main() -> None:
    root = sys.argv[1]
    store = Store.open(os.path.join(root, "local.db"))
    env = Env(store, root, os.path.join(root, "logs"))
    controller = ExecutionController(store, env.config(), work_directory=root)
    controller.start()
    controller.wait_ready(30)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)  # the scenario: the agent keeps its controller awake until it is killed
        controller.notify()


if __name__ == "__main__":
    main()
