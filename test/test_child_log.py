"""The tests' view of a child's output: read while the child writes, no line may go missing."""

from __future__ import annotations

import subprocess
import sys

from child_log import ChildLog

WRITER = (
    "import sys, time\n"
    "for i in range(40):\n"
    "    sys.stderr.write(f'line {i:03d} ' + 'x' * 100 + '\\n')\n"
    "    time.sleep(0.0005)\n"
)


def test_polling_a_childs_output_while_it_writes_loses_no_line():
    """Polled as wait_until polls; a seek(0)-and-read reader lost lines in every one of these runs."""
    for _ in range(10):
        log = ChildLog()
        child = subprocess.Popen([sys.executable, "-c", WRITER], stdout=log.file, stderr=subprocess.STDOUT)
        polls = 0
        while child.poll() is None:
            log.text()
            polls += 1
        assert child.wait() == 0
        text = log.text()
        missing = [i for i in range(40) if f"line {i:03d} {'x' * 100}\n" not in text]
        assert not missing, f"lines {missing} lost after {polls} polls:\n{text}"
        assert len(text) == 40 * len("line 000 \n" + "x" * 100), "more than the child wrote"
