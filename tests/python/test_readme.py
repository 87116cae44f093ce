"""The README's Python example, taken from README.md and run as a user pastes it, so that
it keeps working as the module changes (it once called generate() with a keyword the
module does not have).

Run by ctest (tests/python/CMakeLists.txt) with PYTHONPATH at the built module."""

import os
import re
import subprocess
import sys
import unittest

SOURCE = os.environ.get("BATON_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


class ReadmeExample(unittest.TestCase):
    def test_the_python_example_runs_and_prints_zb_h1s_step(self):
        with open(os.path.join(SOURCE, "README.md"), encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"PYTHONPATH=build/release/python /usr/bin/python3 -c '\n(.*?)'\n", text, re.S)
        self.assertIsNotNone(m, "README.md has no `python3 -c '...'` example")
        run = subprocess.run([sys.executable, "-c", m.group(1)], capture_output=True, text=True,
                             env=os.environ, check=False)
        self.assertEqual(run.returncode, 0, run.stderr)
        makespan, bubble = map(float, run.stdout.split())
        # ZB-H1 with F = B = W = 1 on 4 ranks and 8 micro-batches: each rank's 8 x 3 units
        # of work plus the schedule's bubble of (ranks - 1) x (F + B - W) = 3.
        self.assertAlmostEqual(makespan, 27.0)
        self.assertAlmostEqual(bubble, 3.0 / 27.0)


if __name__ == "__main__":
    unittest.main()
