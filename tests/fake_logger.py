"""A logger plug-in for tests: records what the reporter hands it, in memory and in RUN_DIR/fake_logger.jsonl."""

from __future__ import annotations

import json
import os

INSTANCES: list[FakeLogger] = []


class FakeLogger:
    def __init__(self, run_dir: str, rank: int, config: dict):
        self.run_dir, self.rank, self.config = run_dir, rank, config
        self.logged: list[tuple[int, dict]] = []
        self.closed = False
        INSTANCES.append(self)

    def log(self, scalars: dict[str, float], epoch: int) -> None:
        self.logged.append((epoch, dict(scalars)))
        with open(os.path.join(self.run_dir, f"fake_logger.rank{self.rank}.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "scalars": scalars, "method": self.config["method"]["name"]}) + "\n")

    def close(self) -> None:
        self.closed = True
        with open(os.path.join(self.run_dir, f"fake_logger.rank{self.rank}.closed"), "w"):
            pass
