"""The launchers' record of what they started (`app/launchers/processes.ProcessRecords`): several
writers at once (the coordinator's launcher, and a CLI's or a test's in another process) lose nothing."""

from __future__ import annotations

import threading
from pathlib import Path

from app.launchers.processes import ProcessRecords


def test_writers_at_once_keep_every_entry_and_never_find_the_temporary_file_gone(tmp_path: Path) -> None:
    # Each writer opens its own lock file description, as a second process does.
    path = tmp_path / "local-agents.json"
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        records = ProcessRecords(path)
        try:
            for n in range(40):
                records.set(f"w{writer}-{n}", {"pid": n})
                if n % 2:
                    records.set(f"w{writer}-{n}", None)
        except BaseException as error:  # a renamed-away temporary file, seen in CI
            errors.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(ProcessRecords(path).read()) == sorted(
        f"w{w}-{n}" for w in range(6) for n in range(0, 40, 2)
    )
