"""Files of generated secrets in the data dir: created readable by their owner alone, once.

A file written first and restricted after is readable by every user of the host until then; one
created empty and written after can be read empty, or partly written, by a process starting at
the same time; and two such processes can each write a secret of their own. ``create_private``
stages the text in a file of mode 0600 beside the path and links it there only if nothing is
there yet, so the path appears whole, and the first process's text is every process's.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def create_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) unless ``path`` exists; never changes one that does."""
    fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        with contextlib.suppress(FileExistsError):
            os.link(staged, path)
    finally:
        os.unlink(staged)
