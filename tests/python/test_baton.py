"""The Python module `baton` (tools/python): schedules, file forms, validation,
simulation with numpy results, the automatic scheduler, timelines and planning.

Run by ctest (tests/python/CMakeLists.txt) with PYTHONPATH at the built module."""

import json
import os
import re
import subprocess
import tempfile
import threading
import time
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import baton

SOURCE = os.environ.get("BATON_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(SOURCE, "tests", "fixtures", "torch_schedules")


class Import(unittest.TestCase):
    def test_sighup_is_left_to_the_interpreter(self):
        # UCX, loaded with the module, had installed its debug handler on SIGHUP: a hangup
        # no longer ended Python. The kernel's mask of caught signals says who handles it.
        with open("/proc/self/status") as f:
            caught = next(int(l.split()[1], 16) for l in f if l.startswith("SigCgt"))
        self.assertFalse(caught & (1 << (1 - 1)), "SIGHUP has a handler after import baton")

    def test_no_cuda_library_is_loaded(self):
        # A cuDNN or CUDA runtime loaded with the module is what PyTorch, imported after it,
        # resolved its own to ("cuDNN version incompatibility"); cuBLAS cost 150 MB.
        with open("/proc/self/maps") as f:
            loaded = {l.split()[-1] for l in f if "/lib" in l}
        for lib in ("libcudnn", "libcudart", "libcublas"):
            self.assertEqual([p for p in loaded if lib in os.path.basename(p)], [], lib)


class Logging(unittest.TestCase):
    """The module's log lines go to standard error, and survive a fork() from a thread."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.model = os.path.join(SOURCE, "examples", "models", "mlp.json")
        cls.costs = os.path.join(cls.dir, "costs.json")
        # Timed at 2 threads: planning then warns that the ranks run at another count.
        subprocess.run([os.environ.get("BATON_BIN", "baton"), "profile", "--model", cls.model,
                        "--batch", "2", "--repeats", "1", "--warmup", "0", "--threads", "2",
                        "--out", cls.costs], check=True, capture_output=True)

    def run_python(self, code):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=os.path.dirname(baton.__file__)))

    def test_warnings_go_to_standard_error(self):
        # They had gone to standard output, into the data a script prints there.
        r = self.run_python(
            "import baton; m = baton.load_model(%r)\n"
            "baton.plan(m, devices=2, batch=8, device_memory='1GiB', top=1, costs=%r)"
            % (self.model, self.costs))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("baton: warning: ", r.stderr)

    def test_a_child_forked_while_another_thread_logs_does_not_hang(self):
        # A thread that logged held spdlog's console mutex at the fork: the child waited on
        # it for ever (2 of 20 children here).
        r = self.run_python("""
import os, signal, threading, baton
m = baton.load_model(%r)
best = baton.plan(m, devices=2, batch=8, device_memory="1GiB", top=1)["best"]
check = lambda: baton.check(best, costs=%r)
threading.Thread(target=lambda: [check() for _ in iter(int, 1)], daemon=True).start()
hung = 0
for i in range(20):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        check()
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    hung += os.waitstatus_to_exitcode(st) != 0
print("hung", hung)
os._exit(0)
""" % (self.model, self.costs))
        self.assertIn("hung 0", r.stdout, r.stderr[-2000:])


class Schedules(unittest.TestCase):
    def test_generate_every_generator(self):
        names = baton.schedule_names()
        self.assertIn("zb-v", names)
        for name in names:
            s = baton.generate(name, 4, 8)
            baton.validate(s)
            self.assertEqual(s.num_ranks, 4)
            self.assertEqual(s.num_micro_batches, 8)
            self.assertGreater(len(s), 0)
        s = baton.generate("interleaved-1f1b", 4, 8, chunks=3)
        self.assertEqual(s.num_stages, 12)
        with self.assertRaises(baton.InputError) as e:
            baton.generate("no-such", 4, 8)
        self.assertIn("1f1b", str(e.exception))

    def test_building_blocks(self):
        # V-ZB: the reorder pass at 1F1B's memory reaches the V's bound 3m + (p-1)/2.
        for p, m in ((4, 8), (8, 8), (8, 32)):
            r = baton.simulate(baton.generate("v-zb", p, m), {"forward": 1, "backward_input": 1, "backward_weight": 1})
            self.assertAlmostEqual(r.makespan, 3 * m + (p - 1) / 2)
            self.assertAlmostEqual(r.peak_micro_batches, p)
        # A named block rebuilt from its dict gives the generator's schedule.
        b = baton.v_block("v-half", 4)
        self.assertEqual(b["period"], 6)
        s = baton.block_schedule("v-half", 4, 8, **b)
        self.assertEqual(s, baton.generate("v-half", 4, 8))
        # The same block under the reorder pass at 2 micro-batches of memory.
        b["memory_limit"] = 2
        tight = baton.block_schedule("v-half-2", 4, 8, **b)
        baton.validate(tight)
        self.assertLessEqual(baton.simulate(tight, {"forward": 1, "backward_input": 1, "backward_weight": 1}).peak_micro_batches, 2)
        # A limit beyond an int (inf too) had overflowed its conversion and been refused as
        # "expected at least 1 micro-batch": any limit of m or more never binds.
        b["memory_limit"] = 8
        loose = baton.block_schedule("v", 4, 8, **b)
        for big in (1.1e9, float("inf")):
            b["memory_limit"] = big
            self.assertEqual(baton.block_schedule("v", 4, 8, **b), loose)
        b["memory_limit"] = float("nan")
        with self.assertRaisesRegex(baton.InputError, "memory_limit: expected 0 .none. or micro-batches > 0"):
            baton.block_schedule("v", 4, 8, **b)
        # 1F1B written as a block by hand; a stage held twice is refused.
        p = 4
        one = baton.block_schedule("mine", p, 8, period=3, chunk_stage=[[r] for r in range(p)],
                                   forward=[[r] for r in range(p)], backward=[[2 * p - 1 - r] for r in range(p)])
        baton.validate(one)
        with self.assertRaises(baton.InputError) as e:
            baton.block_schedule("bad", p, 8, period=3, chunk_stage=[[0]] * p,
                                 forward=[[r] for r in range(p)], backward=[[2 * p - 1 - r] for r in range(p)])
        self.assertIn("held twice", str(e.exception))
        for ranks in (-4, 0, 5000):
            with self.assertRaises(baton.InputError) as e:
                baton.v_block("v-half", ranks)
            self.assertIn("v-half: ranks: expected 1 to 4096", str(e.exception))

    def test_file_forms_round_trip(self):
        s = baton.lower(baton.generate("zb-h1", 3, 5))
        self.assertEqual(baton.parse_text(s.to_text()), s)
        self.assertEqual(baton.parse_json(s.to_json()), s)
        c = baton.generate("1f1b", 3, 5)
        back, dialect, empty = baton.parse_csv(c.to_csv())
        self.assertEqual(dialect, "current")
        self.assertEqual(back.tokens(), c.tokens())
        self.assertIn("0B0", c.to_csv("legacy"))

    def test_schedules_and_actions_pickle_and_copy(self):
        # Process pools pass them between processes; both had refused pickle, copy and
        # deepcopy ("cannot pickle 'baton.Schedule' object").
        import copy, pickle
        from concurrent.futures import ProcessPoolExecutor
        s = baton.lower(baton.generate("zb-v", 2, 4))
        for back in (pickle.loads(pickle.dumps(s)), copy.copy(s), copy.deepcopy(s)):
            self.assertEqual(back, s)
            self.assertEqual(back.placement, s.placement)
        for a in s.ranks[0]:
            self.assertEqual(pickle.loads(pickle.dumps(a)), a)
            self.assertEqual(pickle.loads(pickle.dumps(a)).peer, a.peer)
        with ProcessPoolExecutor(2) as pool:
            # To a worker and back (copy.copy, a function pickle can name, runs there).
            self.assertEqual(list(pool.map(copy.copy, [s, s])), [s, s])

    def test_long_calls_release_the_gil(self):
        # While one thread parses a large schedule, another keeps running Python: its
        # longest pause is a few switch intervals, not the whole parse (as it would be
        # if the parse held the GIL).
        # The schedule grows until its parse is long enough to show it (a faster machine
        # parsed 64 x 512 in 0.0397 s).
        m = 512
        while True:
            text = baton.lower(baton.generate("zb-v", 64, m)).to_text()
            start = time.perf_counter()
            baton.parse_text(text)
            alone = time.perf_counter() - start
            if alone > 0.04 or m >= 8192:
                break
            m *= 2
        self.assertGreater(alone, 0.04, "the parse is too short to show the GIL")
        done = threading.Event()

        def parse():
            baton.parse_text(text)
            done.set()

        worker = threading.Thread(target=parse)
        last = time.perf_counter()
        longest = 0.0
        worker.start()
        while not done.is_set():
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now
        worker.join()
        self.assertLess(longest, alone / 2, f"a pause of {longest:.3f} s in a {alone:.3f} s parse")

    def test_iterate_and_build_from_lists(self):
        s = baton.Schedule([["0F0", "0F1", "0BW0", "0BW1"], ["1F0", ("BW", 0, 1), "1F1", "1BW1"]],
                           name="hand")
        self.assertEqual(s.placement, [0, 1])
        self.assertEqual(s.num_micro_batches, 2)
        baton.validate(s)
        seen = [(r, i, a.token) for r, i, a in s]
        self.assertEqual(seen[5], (1, 1, "1BW0"))
        self.assertEqual(s.actions(1)[1].kind, "BW")
        for bad in (-1, s.num_ranks):
            with self.assertRaises(IndexError):
                s.actions(bad)
        self.assertEqual(s.tokens()[0], ["0F0", "0F1", "0BW0", "0BW1"])
        # A composite OVERLAP_F_B from a token.
        v = baton.Schedule([["0F0", "3F0", "(0F1;3BW0)", "3F1", "3BW1", "0BW0", "0BW1"],
                            ["1F0", "2F0", "1F1", "2BW0", "2F1", "2BW1", "1BW0", "1BW1"]],
                           placement=[0, 1, 1, 0])
        self.assertTrue(v.actions(0)[2].overlap)
        baton.validate(v)

    def test_rename_while_other_threads_read(self):
        # s.name is writable, and to_text, lower and simulate(timeline=True) read the
        # schedule with the GIL released: they had read it while another thread renamed
        # it, and given torn names (one name's length with the other's bytes).
        s = baton.generate("1f1b", 1, 1)
        names = ("a" * 200, "b" * 300)
        stop = threading.Event()
        seen = set()

        def read():
            while not stop.is_set():
                seen.add(s.to_text().split("\n")[1][len("name: "):])
                seen.add(baton.lower(s).name)
                seen.add(baton.simulate(s, timeline=True).timeline.name)

        reader = threading.Thread(target=read)
        reader.start()
        end = time.perf_counter() + 2
        while time.perf_counter() < end:
            for n in names:
                s.name = n
        stop.set()
        reader.join()
        self.assertLessEqual(seen, set(names) | {"1f1b"}, [n[:8] + "..." for n in seen])

    def test_messages_name_one_position(self):
        # A composite with a space had said "rank 0, action 1:1 (rank 0, action 0)".
        with self.assertRaises(baton.InputError) as e:
            baton.Schedule([["0F0", "(0F1; 0BW0)", "0BW1"]])
        self.assertTrue(str(e.exception).startswith("rank 0, action 1: bad composite '(0F1; 0BW0)'"),
                        str(e.exception))
        self.assertNotIn(":1 (", str(e.exception))
        # A lower-case kind is named (it had read kind '').
        with self.assertRaisesRegex(baton.InputError, r"unknown kind 'f' \(kinds are upper case: 'F'\)"):
            baton.Action.parse("0f0")
        # Kept CSV cells are what parse_csv keeps, blanks and waits, at increasing cells
        # within the row: anything else is refused (to_csv had written a file that
        # parse_csv then refused, or put a cell -1 first and 10^8 last).
        s = baton.generate("1f1b", 2, 2)
        for text in ("a,b", "x\ny", 'say "hi"', "hello", "0F0"):
            with self.assertRaisesRegex(baton.InputError,
                                        r"kept cells: rank 0, cell 0: expected a blank or a wait"):
                baton.to_csv(s, "current", [[(0, text)], []])
        with self.assertRaisesRegex(baton.InputError, r"cell -1: expected cells in increasing order"):
            baton.to_csv(s, "current", [[(-1, "")], []])
        with self.assertRaisesRegex(baton.InputError, r"cell 3: expected cells in increasing order from 0, after cell 3"):
            baton.to_csv(s, "current", [[(3, ""), (3, "")], []])
        with self.assertRaisesRegex(baton.InputError, r"cell 100000000: past the row's end"):
            baton.to_csv(s, "current", [[(100000000, "")], []])
        self.assertEqual(baton.to_csv(s, "current", [[(1, " 0WAIT_SEND_F0")], []]).split("\r\n")[0],
                         "0F0, 0WAIT_SEND_F0,0F1,0B0,0B1")
        back, _, kept = baton.parse_csv(baton.to_csv(s, "current", [[(0, "  ")], []]))
        self.assertEqual(kept, [[(0, "  ")], []])

    def test_given_peers_names_and_counts_are_checked(self):
        # A given peer is kept for the validator, as the JSON reader keeps it (Schedule had
        # overwritten it from the placement); a peer on an F is refused, as there.
        A = baton.Action
        low = baton.lower(baton.generate("1f1b", 2, 2))
        acts = [list(low.actions(0)), list(low.actions(1))]
        acts[0][1] = A("SEND_F", 0, 0, peer=0)
        s = baton.Schedule(acts)
        self.assertEqual(s.actions(0)[1].peer, 0)
        with self.assertRaisesRegex(baton.ScheduleError,
                                    "peer 0, but the placement puts stage 1 on rank 1"):
            baton.validate(s)
        # The text form holds no peers: saving that one there is refused, not repaired.
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(baton.InputError, "which the text form cannot hold"):
                s.save(os.path.join(tmp, "s.txt"))
            s.save(os.path.join(tmp, "s.json"))
            self.assertEqual(baton.load(os.path.join(tmp, "s.json")).actions(0)[1].peer, 0)
        self.assertEqual(baton.Schedule([list(low.actions(0)), list(low.actions(1))], name="1f1b"), low)
        with self.assertRaisesRegex(baton.InputError,
                                    r"rank 0, action 0\.peer: only sends and receives have a peer"):
            baton.Schedule([[A("F", 0, 0, peer=3), "0BW0"]])
        # A name with a line break could not come back from the text form: refused.
        for bad in ("line one\nline two", "a\rb"):
            with self.assertRaisesRegex(baton.InputError, "name: expected a name on one line"):
                baton.Schedule([["0F0", "0BW0"]], name=bad)
            t = baton.generate("1f1b", 2, 2)
            with self.assertRaisesRegex(ValueError, "name: expected a name on one line"):
                t.name = bad
            j = json.loads(t.to_json())
            j["name"] = bad
            with self.assertRaisesRegex(baton.InputError, "name: expected a name on one line"):
                baton.parse_json(json.dumps(j))
        # A bool is no count (Python makes it an int).
        with self.assertRaises(TypeError):
            baton.generate("1f1b", True, 8)
        with self.assertRaises(TypeError):
            baton.Schedule([["0F0", "0BW0"]], micro_batches=True)
        with self.assertRaises(TypeError):
            baton.auto_schedule(True, 8)
        self.assertEqual(baton.generate("1f1b", np.int64(2), 4).num_ranks, 2)
        # Numbers in messages as Python writes them, one "costs:" prefix.
        sim = baton.Simulator(baton.generate("1f1b", 2, 4))
        with self.assertRaisesRegex(baton.InputError, r"^costs: forward\[0\]: expected a number >= 0, found -1$"):
            sim.run_stages(-1, 1, 1)
        with self.assertRaisesRegex(baton.InputError, r"^costs: forward: expected a finite number, found nan$"):
            sim.run_stages(float("nan"), 1, 1)
        v = baton.v_block("v-min", 2)
        with self.assertRaisesRegex(baton.InputError, r"memory_limit: .*found -1$"):
            baton.block_schedule("b", 2, 4, v["period"], v["chunk_stage"], v["forward"],
                                 v["backward"], memory_limit=-1)

    def test_validate_raises_schedule_error_with_position(self):
        s = baton.Schedule([["0F0", "0BW0"], ["1BW0", "1F0"]])
        with self.assertRaises(baton.ScheduleError) as e:
            baton.validate(s)
        err = e.exception
        self.assertIsInstance(err, baton.InputError)
        self.assertEqual((err.rank, err.index, err.action), (1, 0, "1BW0"))
        self.assertIn("backward before its forward", err.message)
        self.assertIn("> 1BW0 <", err.grid)
        self.assertFalse(baton.is_valid(s))

    def test_lower_refuses_an_invalid_schedule(self):
        # Checked as written, as `baton simulate --file F --lower` checks it: a STEP on rank 0
        # only had been taken out and put back on every rank, the fault gone.
        s = baton.parse_text("0: 0F0 0F1 0BW0 0BW1 STEP\n1: 1F0 1BW0 1F1 1BW1\n")
        with self.assertRaises(baton.ScheduleError) as e:
            baton.lower(s)
        err = e.exception
        self.assertIsInstance(err, ValueError)
        self.assertIn("STEP", err.message)
        with self.assertRaises(baton.ScheduleError) as v:
            baton.validate(s)
        self.assertEqual(str(err), str(v.exception))
        self.assertEqual((err.rank, err.index, err.action),
                         (v.exception.rank, v.exception.index, v.exception.action))
        # A valid schedule lowers as before, a lowered one too.
        low = baton.lower(baton.generate("1f1b", 2, 4))
        baton.validate(low)
        self.assertEqual(baton.lower(low), low)


    def test_what_python_users_pass_by_mistake(self):
        # NumPy's bools are bools too: no count, no number; switches take bools only
        # (None and 1 had passed as False and True).
        s = baton.generate("1f1b", 2, 4)
        for call in (lambda: baton.generate("1f1b", np.True_, 8),
                     lambda: baton.Action("F", True, 0),
                     lambda: s.actions(True),
                     lambda: baton.lower(s, transfers=None),
                     lambda: baton.simulate(s, timeline=1),
                     lambda: baton.auto_schedule(2, 4, limit_in_bytes=None)):
            with self.assertRaises(TypeError):
                call()
        self.assertEqual(baton.lower(s, transfers=np.False_).num_actions, s.num_actions + 4)
        with self.assertRaisesRegex(baton.InputError, "^costs: forward: expected"):
            baton.Simulator(s).run_stages(np.True_, 1, 1)
        # An integer past a double, named (it had been pybind11's bare cast error).
        with self.assertRaisesRegex(baton.InputError, r"^costs: \$\.forward: expected a number, found an integer of 401 digits"):
            baton.simulate(s, dict(forward=10**400, backward_input=1, backward_weight=1))
        # A rank that is no list of actions is named; a str is not read letter by letter.
        for ranks, text in (([["0F0"], 5], "rank 1: expected a list of actions, found 5"),
                            (["0F0 0B0"], "rank 0: expected a list of actions, found '0F0 0B0'"),
                            ("0F0 0B0", "ranks: expected a list of per-rank action lists, found '0F0 0B0'")):
            with self.assertRaises(baton.InputError) as e:
                baton.Schedule(ranks)
            self.assertIn(text, str(e.exception))
        # The simulator refuses an invalid schedule as validate() does: where and what.
        bad = baton.Schedule([["0F0", "0BW0"], ["1BW0", "1F0"]])
        for call in (lambda: baton.simulate(bad), lambda: baton.Simulator(bad)):
            with self.assertRaises(baton.ScheduleError) as e:
                call()
            self.assertEqual((e.exception.rank, e.exception.action), (1, "1BW0"))
        # An action without its stage (a 2-tuple) is refused where it is made: it had been
        # written as "-1F0", a file that does not read back. STEP has neither.
        for call, where in ((lambda: baton.Schedule([[("F", 0), ("BW", 0)]]), "rank 0, action 0: "),
                            (lambda: baton.Action("F", 0), "Action: ")):
            with self.assertRaisesRegex(baton.InputError, "^" + where + "a 'F' action needs its stage"):
                call()
        with self.assertRaisesRegex(baton.InputError, "needs its micro-batch"):
            baton.Action("B", -1, 0)
        self.assertEqual(str(baton.Action("STEP")), "Action('STEP')")
        # An empty path is named (it had been "cannot rename .tmp1.0 to : ...").
        for call in (lambda: s.save(""), lambda: baton.load(""), lambda: baton.CostSpec.load("")):
            with self.assertRaisesRegex(baton.InputError, "^path: expected a file's path, found an empty string$"):
                call()

class Simulation(unittest.TestCase):
    def test_ctrl_c_stops_the_automatic_scheduler(self):
        # A search of half a minute here (p = 128, m = 1024) had held Ctrl-C until it
        # returned; it now stops between candidates, and the module works after.
        import signal
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        with self.assertRaises(KeyboardInterrupt):
            baton.auto_schedule(128, 1024)
        timer.join()
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(baton.auto_schedule(4, 8)[1]["chosen"], "zb-v")

    def test_results_and_numpy_arrays(self):
        s = baton.generate("1f1b", 4, 8)
        r = baton.simulate(s)
        # 1F1B, F = B = W = 1: makespan 3(m + p - 1).
        self.assertAlmostEqual(r.makespan, 33.0)
        self.assertAlmostEqual(r.bubble, 3 / 11)
        self.assertEqual(r.busy.shape, (4,))
        np.testing.assert_allclose(r.busy, 24.0)
        np.testing.assert_allclose(r.idle, 9.0)
        np.testing.assert_allclose(r.peak_memory, [4, 3, 2, 1])
        self.assertEqual(r.start.shape, (len(s),))
        self.assertEqual(r.offsets[-1], len(s))
        # Rank 3's first action (its F0) starts after the three F0's before it.
        self.assertAlmostEqual(r.start[r.offsets[3]], 3.0)
        np.testing.assert_array_less(r.start - 1e-12, r.end)
        # Built once on first read (no copy on access), still valid after r is gone; the
        # library's one-pass fill agrees with the per-rank slices above.
        a = r.start
        self.assertIs(r.start, a)
        self.assertAlmostEqual(r.end[r.offsets[3]], 4.0)
        del r
        self.assertEqual(a.shape, (len(s),))
        # The simulator shares the schedule, which outlives neither it nor the result.
        big = baton.lower(baton.generate("zb-v", 4, 8))
        sim = baton.Simulator(big)
        r = baton.simulate(big)
        del big
        self.assertEqual(sim.run()[0], r.makespan)
        np.testing.assert_array_less(r.start - 1e-12, r.end)

    def test_threads_first_arrays_and_shared_simulator(self):
        # In a fresh interpreter (NumPy's C API not yet set up, no array built): two
        # threads' first arrays at once had deadlocked, and two first reads of one
        # result's start had freed the simulator the other was reading.
        code = """
import sys, threading, baton
r = baton.simulate(baton.generate("zb-v", 32, 256))
go = threading.Barrier(2)
out = []
def read():
    go.wait()
    out.append((r.busy.sum(), r.start.sum()))
ts = [threading.Thread(target=read) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
assert out[0] == out[1], out
print("ok")
"""
        for _ in range(3):
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual((p.returncode, p.stdout.strip()), (0, "ok"), p.stderr)
        # One Simulator shared by a thread pool: each run's results its own (runs had
        # overwritten each other's state and returned wrong makespans, silently).
        s = baton.generate("zb-v", 16, 64)
        costs = [{"forward": 1, "backward_input": 1 + 0.25 * i, "backward_weight": 1}
                 for i in range(8)]
        expected = [baton.Simulator(s).run(c) for c in costs]
        shared = baton.Simulator(s)
        with ThreadPoolExecutor(4) as pool:
            for _ in range(5):
                self.assertEqual(list(pool.map(shared.run, costs)), expected)

    def test_numbers_from_python(self):
        s = baton.generate("1f1b", 2, 4)
        # NaN and inf are named as such (they had read "found null null").
        for bad in (float("nan"), float("inf"), np.float64("nan")):
            with self.assertRaisesRegex(baton.InputError,
                                        r"costs: \$\.forward: expected a finite number, found"):
                baton.simulate(s, {"forward": bad})
        with self.assertRaisesRegex(baton.InputError, r"costs: \$\.forward\[1\]: expected a finite"):
            baton.simulate(s, {"forward": np.array([1.0, np.nan])})
        with self.assertRaisesRegex(baton.InputError, "forward: expected a finite number, found nan"):
            baton.Simulator(s).run_stages(float("nan"), 1, 1)
        # numpy's scalars are numbers (they had been refused in some places).
        self.assertEqual(baton.Simulator(s).run_stages(np.float32(1), 1, 1),
                         baton.Simulator(s).run_stages(1, 1, 1))
        c = {"backward_input": 1, "backward_weight": 1}
        self.assertEqual(baton.simulate(s, {"forward": np.int64(2), **c}).makespan,
                         baton.simulate(s, {"forward": 2, **c}).makespan)
        # A tuple's micro-batch and stage are whole numbers, named where they are not
        # (these had been "Unable to cast Python instance to C++ type").
        with self.assertRaisesRegex(baton.InputError,
                                    "rank 0, action 0: micro_batch: expected a whole number, found '0'"):
            baton.Schedule([[("F", "0", 0), ("BW", 0, 0)]])
        with self.assertRaisesRegex(baton.InputError, "stage: expected a whole number, found 0.5"):
            baton.Schedule([[("F", 0, 0.5), ("BW", 0, 0)]])
        self.assertEqual(baton.Schedule([[("F", np.int64(0), 0), ("BW", 0, 0)]]).tokens(),
                         [["0F0", "0BW0"]])
        # Past long long too (10**400 had been "Unable to cast").
        with self.assertRaisesRegex(baton.InputError, "micro_batch: expected a whole number within an int's range"):
            baton.Schedule([[("F", 10**400, 0), ("BW", 0, 0)]])
        # Counts are whole: what only has __int__ (a float scalar, Decimal, Fraction, a
        # 0-d float array) had been truncated, 4.5 ranks read as 4.
        from decimal import Decimal
        from fractions import Fraction
        for x in (np.float32(4.5), np.array(4.7), Decimal("4.9"), Fraction(9, 2), 4.0):
            with self.assertRaises(TypeError, msg=repr(x)):
                baton.generate("1f1b", x, 8)
        self.assertEqual(baton.generate("1f1b", np.int32(4), 8).num_ranks, 4)
        # A 0-d array is one number everywhere (run_stages had refused what simulate takes).
        self.assertEqual(baton.Simulator(s).run_stages(np.array(2.0), 1, 1)[0],
                         baton.simulate(s, {"forward": np.array(2.0), "backward_input": 1,
                                            "backward_weight": 1}).makespan)
        # A list or dict that holds itself is refused, not recursed until the stack overflows.
        loop = []
        loop.append(loop)
        with self.assertRaisesRegex(baton.InputError, "nested deeper than 256 levels"):
            baton.simulate(s, {"forward": loop})
        cyclic = {}
        cyclic["model"] = cyclic
        with self.assertRaisesRegex(baton.InputError, "^plan: .*nested deeper than 256 levels"):
            baton.check(cyclic)
        # A pickled state's fields are checked (they had been bare cast errors).
        for state, text in ((("F", "x", 1, False, -1), "micro_batch: expected a whole number"),
                            (("F", 1, 1, 2, -1), "overlap: expected a bool, found 2")):
            with self.assertRaisesRegex(baton.InputError, text):
                baton.Action.__new__(baton.Action).__setstate__(state)

    def test_numpy_integers_strings_and_bounds(self):
        # numpy's integers had gone through doubles: a group id 0 read "found number 0.0".
        s = baton.lower(baton.generate("1f1b", 4, 4))
        base = {"forward": 1, "backward_input": 1, "backward_weight": 1, "reduce": 3}
        want = baton.simulate(s, dict(base, reduce_group=[0, -1, -1, 0])).makespan
        for groups in (np.array([0, -1, -1, 0]), np.array([0, -1, -1, 0], dtype=np.int32),
                       [np.int64(x) for x in (0, -1, -1, 0)], np.array([0, -1, -1, 0], dtype=object)):
            self.assertEqual(baton.simulate(s, dict(base, reduce_group=groups)).makespan, want)
        with self.assertRaisesRegex(baton.InputError, r"reduce_group\[0\]: expected -1 or a group id >= 0, found 9007199254740993"):
            baton.simulate(s, dict(base, reduce_group=np.array([2 ** 53 + 1, -1, -1, 0])))
        # A numpy array of strings is a list of str (it had been "expected a
        # one-dimensional array").
        s = baton.generate("1f1b", 4, 8)
        sizes = dict(base, activation_bytes=["1MiB"] * 4)
        self.assertEqual(baton.simulate(s, dict(sizes, activation_bytes=np.array(["1MiB"] * 4))).peak_bytes,
                         baton.simulate(s, sizes).peak_bytes)
        # run_stages takes the cost files' bound on a time (1e308 had given inf and NaN).
        sim = baton.Simulator(s)
        with self.assertRaisesRegex(baton.InputError, r"^costs: forward: expected at most 1e9 .*found 1e\+308"):
            sim.run_stages(1e308, 1e308, 1)
        with self.assertRaisesRegex(baton.InputError, r"^costs: backward_input\[2\]: expected at most 1e9"):
            sim.run_stages(1, np.array([1, 1, 2e9, 1]), 1)
        with self.assertRaisesRegex(baton.InputError, r"^costs: backward_weight\[1\]: expected a finite number"):
            sim.run_stages(1, 1, [1, float("nan"), 1, 1])
        # A bool in a list is no number, as one alone is not (forcecast had read it as 1).
        with self.assertRaisesRegex(baton.InputError, r"^costs: forward\[0\]: expected a number, found True"):
            sim.run_stages([True, 1, 1, 1], 1, 1)
        with self.assertRaisesRegex(baton.InputError, r"^memory_limit\[0\]: expected a number, found True"):
            baton.auto_schedule(4, 8, None, memory_limit=[True, 2, 2, 2])
        self.assertEqual(sim.run_stages(1e9, 1, 1)[0], sim.run_stages(np.full(4, 1e9), 1, 1)[0])
        # A per-rank memory limit refuses inf as one number does.
        c = {"forward": 1, "backward_input": 1.5, "backward_weight": 0.7}
        for limit, where in ((float("inf"), "memory_limit"), ([4, float("inf"), 4, 4], r"memory_limit\[1\]")):
            with self.assertRaisesRegex(baton.InputError, "^" + where + ": expected a finite number"):
                baton.auto_schedule(4, 8, c, memory_limit=limit)

    def test_equality_with_other_types(self):
        s = baton.generate("1f1b", 2, 4)
        self.assertFalse(s == None)  # noqa: E711 (the operator itself is under test)
        self.assertIn(s, [None, s])
        a = baton.Action.parse("0F0")
        self.assertFalse(a == "0F0")
        self.assertTrue(a != "0F0")
        # A transfer's peer, as lower() sets it, can be given to compare with one.
        send = baton.lower(s).actions(0)
        tokens = [x.token for x in send]
        i = tokens.index("0SEND_F0")
        self.assertNotEqual(baton.Action.parse("0SEND_F0"), send[i])
        self.assertEqual(baton.Action("SEND_F", 0, 0, peer=send[i].peer), send[i])

    def test_costs_as_dict_lists_and_numpy(self):
        s = baton.generate("zb-h1", 4, 8)
        d = baton.simulate(s, {"forward": 1.0, "backward_input": 1.0, "backward_weight": 1.0})
        lists = baton.simulate(s, {"forward": [1, 1, 1, 1], "backward_input": [1] * 4,
                                   "backward_weight": [1.0] * 4})
        arrays = baton.simulate(s, {"forward": np.ones(4), "backward_input": np.ones(4),
                                    "backward_weight": np.ones(4)})
        self.assertEqual(d.makespan, lists.makespan)
        self.assertEqual(d.makespan, arrays.makespan)
        slow = baton.simulate(s, {"forward": np.array([1, 1, 1, 2.0]), "backward_input": 1,
                                  "backward_weight": 1})
        self.assertGreater(slow.makespan, d.makespan)
        with self.assertRaises(baton.InputError) as e:
            baton.simulate(s, {"forward": 1, "backward_input": 1})
        self.assertIn("backward_weight: missing", str(e.exception))
        sim = baton.Simulator(s)
        self.assertEqual(sim.run_stages(1.0, np.ones(4), [1, 1, 1, 1])[0], d.makespan)

    def test_timelines_and_trace_comparison(self):
        s = baton.generate("zb-v", 2, 4)
        r = baton.simulate(s, {"forward": 1, "backward_input": 1, "backward_weight": 1,
                               "time_unit": "ms"}, timeline=True)
        svg = r.timeline.svg()
        self.assertTrue(svg.startswith("<svg") or svg.startswith("<?xml"))
        trace = r.timeline.chrome_trace()
        self.assertIn("traceEvents", json.loads(trace))
        back = baton.read_chrome_trace(trace)
        c = baton.compare_traces(back, r.timeline)
        self.assertEqual(c["unmatched_measured"], 0)
        self.assertAlmostEqual(c["measured_makespan"], c["predicted_makespan"])
        self.assertEqual(len(r.timeline.events()), len(back.events()))

    def test_auto_schedule(self):
        costs = {"forward": 1, "backward_input": 1.5, "backward_weight": 0.7}
        s, info = baton.auto_schedule(4, 8, costs, memory_limit=4)
        baton.validate(s)
        self.assertLessEqual(info["peak_micro_batches"], 4 + 1e-9)
        fixed = {c["name"]: c for c in info["fixed"]}
        self.assertLessEqual(info["makespan"], fixed["zb-h1"]["makespan"] + 1e-9)
        self.assertAlmostEqual(baton.simulate(s, costs).makespan, info["makespan"])
        # By the longest rank span instead: never a longer span than the makespan choice.
        t, by_span = baton.auto_schedule(4, 8, costs, memory_limit=4, objective="span")
        baton.validate(t)
        self.assertLessEqual(by_span["span"], info["span"] + 1e-9)
        with self.assertRaises(baton.InputError):
            baton.auto_schedule(4, 8, costs, objective="fastest")

    def test_speed(self):
        # 1,000 simulations of p = 8, m = 32 well under a second (the bound; the
        # machine may be loaded, so the test allows 3 s and prints what it measured).
        s = baton.generate("zb-h1", 8, 32)
        sim = baton.Simulator(s)
        costs = {"forward": 1.0, "backward_input": 1.0, "backward_weight": 1.0}
        t0 = time.perf_counter()
        for _ in range(1000):
            sim.run(costs)
        reused = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(1000):
            baton.simulate(s, costs)
        fresh = time.perf_counter() - t0
        print(f"\n1000 simulations p=8 m=32: {reused:.3f} s (Simulator.run), "
              f"{fresh:.3f} s (simulate)")
        self.assertLess(reused, 3.0)


class TorchCsv(unittest.TestCase):
    def test_fixtures_round_trip(self):
        # The runtime's lowered dumps (*_comms.csv) name FSDP's UNSHARD, which baton
        # refuses; torch 2.15's own 1F1B lists (1f1b_*.csv) are invalid (their last rank
        # runs F1..Fm): both are checked by tests/schedule/test_torch_csv.cpp.
        files = sorted(f for f in os.listdir(FIXTURES)
                       if f.endswith(".csv") and "_comms" not in f and not f.startswith("1f1b_"))
        self.assertGreater(len(files), 5)
        for f in files:
            with open(os.path.join(FIXTURES, f), newline="") as fh:
                text = fh.read()
            s, dialect, empty = baton.parse_csv(text)
            baton.validate(s)
            self.assertGreater(baton.simulate(s).makespan, 0)
            self.assertEqual(baton.to_csv(s, dialect, empty), text, f)
            self.assertEqual(baton.load(os.path.join(FIXTURES, f)).tokens(), s.tokens())
            # The tokens build the same schedule again, DualPipeV's overlapped pairs too.
            self.assertEqual(baton.Schedule(s.tokens(), placement=s.placement, micro_batches=s.num_micro_batches,
                                            directions=s.num_directions, name=s.name), s, f)
        with open(os.path.join(FIXTURES, "1f1b_p4_m8.csv"), newline="") as fh:
            bad, _, _ = baton.parse_csv(fh.read())
        with self.assertRaises(baton.ScheduleError) as e:
            baton.validate(bad)
        self.assertIn("0F8", e.exception.message)
        with self.assertRaises(baton.InputError) as e:
            baton.load(os.path.join(FIXTURES, "zbv_p2_m4_comms.csv"))
        self.assertIn("UNSHARD/RESHARD", str(e.exception))


class Planning(unittest.TestCase):
    def test_plan_check_and_layer_costs(self):
        model = baton.load_model(os.path.join(SOURCE, "examples", "models", "mlp.json"))
        self.assertGreater(model.num_layers, 1)
        costs = baton.layer_costs(model, tp=1, batch=4)
        self.assertEqual(len(costs), model.num_layers)
        self.assertGreater(sum(c["forward"] for c in costs), 0)
        self.assertGreater(sum(c["backward_weight"] for c in costs), 0)
        res = baton.plan(model, devices=2, batch=8, device_memory="1GiB", top=2)
        best = res["best"]
        self.assertIsNotNone(best)
        self.assertEqual(best["devices"], 2)
        est = baton.check(best, base_dir=os.path.join(SOURCE, "examples", "models"))
        self.assertTrue(est["fits"])
        self.assertEqual(len(est["ranks"]), 2)
        self.assertGreater(est["step_time"], 0)
        self.assertIn("rank", est["table"])
        self.assertAlmostEqual(est["step_time"], res["plans"][0]["step_time"], delta=1e-9 + 0.05 * est["step_time"])
        # The best plan is listed with its exact estimate, as `baton plan` prints it, and
        # at exactly that peak (below the search's bound of it) it is still found.
        exact = max(r["peak"] for r in est["ranks"])
        self.assertEqual(res["plans"][0]["peak"], exact)
        tight = baton.plan(model, devices=2, batch=8, device_memory=exact, top=2)
        self.assertEqual(tight["plans"][0]["describe"], res["plans"][0]["describe"])
        self.assertEqual(tight["plans"][0]["peak"], exact)
        self.assertGreater(tight["exact_checks"], 0)
        # Out-of-range arguments are InputErrors naming them, never a crash or numbers
        # from a degree 0 or negative samples.
        for kw, text in ((dict(tp=0), "tp: expected a tensor-parallel degree of at least 1"),
                         (dict(batch=-2), "batch: expected 1 to 16777216 samples per micro-batch"),
                         (dict(batch=2**50), "batch: expected 1 to 16777216 samples per micro-batch"),
                         (dict(tp=np.int64(0)), "tp: expected a tensor-parallel degree of at least 1"),
                         (dict(machine={"flops": np.True_}), "machine.flops: expected a number, found " + repr(np.True_)),
                         (dict(machine={"p2p_bandwidth": 0}), "machine.p2p_bandwidth: expected a positive rate"),
                         (dict(machine={"flops": float("inf")}), "machine.flops: expected a positive rate"),
                         (dict(machine={"flops": "fast"}), "machine.flops: expected a number, found 'fast'"),
                         (dict(costs={"forward": 1}), "costs: expected the path of a baton profile cost file")):
            with self.assertRaises(baton.InputError, msg=str(kw)) as e:
                baton.layer_costs(model, **kw)
            self.assertIn(text, str(e.exception))
        # Named by the keywords given, not `baton plan`'s flags (it had said "--top: ...").
        with self.assertRaisesRegex(baton.InputError, r"^tp: tensor-parallel degree 3 does not divide "):
            baton.layer_costs(model, tp=3)
        for kw, text in ((dict(tp=-1), "tp: expected at least 1"), (dict(top=0), "top: expected at least 1"),
                         (dict(micro_batches=-1), "micro_batches: expected at least 1"),
                         # As `baton plan --chunks` refuses them (they had been taken silently).
                         (dict(chunks=65), "chunks: expected 1 to 64 model chunks per pipeline rank"),
                         (dict(chunks=3, schedules=["1f1b"]), "chunks: only interleaved-1f1b takes a chunk count, and schedules 1f1b"),
                         # A fraction (0.5 GiB meant?) had been truncated to 0 bytes: no cap.
                         (dict(device_memory=0.5), "device_memory: expected a whole number of bytes or a size such as '512MiB', found 0.5")):
            with self.assertRaises(baton.InputError) as e:
                baton.plan(model, devices=2, batch=8, **kw)
            self.assertIn(text, str(e.exception))
            self.assertNotIn("--", str(e.exception))
        with self.assertRaises(baton.InputError) as e:
            baton.check(best, base_dir=os.path.join(SOURCE, "examples", "models"), machine={"dp_bandwidth": 0})
        self.assertIn("machine.dp_bandwidth", str(e.exception))
        # No model (None) is refused, not dereferenced (a segfault); bools are no counts.
        for call in (lambda: baton.layer_costs(None), lambda: baton.plan(None, 4)):
            with self.assertRaisesRegex(baton.InputError, "^model: expected a model"):
                call()
        for call in (lambda: baton.plan(model, True), lambda: baton.layer_costs(model, tp=True),
                     lambda: baton.plan(model, 2, recompute=1), lambda: baton.plan(model, 2, batch=True),
                     lambda: baton.layer_costs(model, batch=np.True_)):
            with self.assertRaises(TypeError):
                call()
        # The best plan as `baton plan --out` writes it: checked exactly, its estimate
        # per rank in predicted.memory_bytes.
        self.assertEqual(best["predicted"]["memory_bytes"], [r["peak"] for r in est["ranks"]])

    def test_plan_dicts_paths_and_nothing_fits(self):
        model = baton.load_model(os.path.join(SOURCE, "examples", "models", "mlp.json"))
        best = baton.plan(model, devices=2, batch=8, device_memory="1GiB", top=1)["best"]
        # The model is named by its absolute path, so the plan reads from any folder (it
        # had been relative to the current one, and a plan saved elsewhere named no file).
        self.assertTrue(os.path.isabs(best["model"]), best["model"])
        want = baton.check(best)["step_time"]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.json")
            with open(path, "w") as f:
                json.dump(best, f)
            # A path as str or os.PathLike (a pathlib.Path had been a TypeError).
            import pathlib
            self.assertEqual(baton.check(pathlib.Path(path))["step_time"], want)
            self.assertEqual(baton.predict(pathlib.Path(path))["step_time"],
                             baton.predict(path)["step_time"])
        with self.assertRaisesRegex(baton.InputError, "plan: expected a plan dict .* or a plan file's path"):
            baton.check(42)
        # NaN and inf are refused naming the field (they had been nlohmann's parse error);
        # numpy's integers are integers (np.int64 had been "not JSON serializable").
        mb = best["schedule"]["micro_batches"]
        for bad in (float("nan"), float("inf")):
            for call in (baton.check, baton.predict):
                with self.assertRaisesRegex(baton.InputError,
                                            r"^plan: \$\.schedule\.micro_batches: expected a finite number"):
                    call(dict(best, schedule=dict(best["schedule"], micro_batches=bad)))
        numpy_mb = dict(best, schedule=dict(best["schedule"], micro_batches=np.int64(mb)))
        self.assertEqual(baton.check(numpy_mb)["step_time"], want)
        self.assertEqual(baton.predict(numpy_mb)["step_time"], baton.predict(best)["step_time"])
        # Nothing fits: the InputError `baton plan` exits 2 with (it had been best None and
        # no reason).
        with self.assertRaisesRegex(baton.InputError,
                                    r"^no plan fits in 1\.00 KiB per device; the closest is .* needs .* over its capacity"):
            baton.plan(model, devices=2, batch=8, device_memory="1KiB")
        with self.assertRaisesRegex(baton.InputError, r"^no plan matches the options \(.*\)"):
            baton.plan(model, devices=2, batch=8, pp=2, schedules=["dualpipe"], micro_batches=3)

    def test_every_path_as_os_pathlike(self):
        # load, save, CostSpec.load, load_model, plan's model_path and check's and
        # predict's base_dir take os.PathLike as well as str (they had taken only str: a
        # pathlib.Path was a TypeError).
        import pathlib
        s = baton.lower(baton.generate("zb-h1", 3, 5))
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp)
            for name in ("s.json", "s.txt"):
                s.save(d / name)
                self.assertEqual(baton.load(d / name), s)
                self.assertEqual(baton.load(str(d / name)), s)
            costs = d / "costs.json"
            costs.write_text('{"forward": 2, "backward_input": 3, "backward_weight": 1}')
            self.assertEqual(baton.simulate(s, baton.CostSpec.load(costs)).makespan,
                             baton.simulate(s, baton.CostSpec.load(str(costs))).makespan)
        models = pathlib.Path(SOURCE).resolve() / "examples" / "models"
        model = baton.load_model(models / "mlp.json")
        self.assertEqual(model.layers, baton.load_model(str(models / "mlp.json")).layers)
        best = baton.plan(model, devices=2, batch=8, device_memory="1GiB", top=1,
                          model_path=models / "mlp.json")["best"]
        self.assertEqual(best["model"], str(models / "mlp.json"))
        # A plan naming its model relative to base_dir.
        relative = dict(best, model="mlp.json")
        want = baton.check(best)["step_time"]
        self.assertEqual(baton.check(relative, base_dir=models)["step_time"], want)
        self.assertEqual(baton.predict(relative, base_dir=models)["step_time"],
                         baton.predict(best)["step_time"])

    def test_paths_that_are_not_utf8(self):
        # Linux names may hold any bytes. Errors quoting one keep their message (it had been
        # empty), every path argument takes one (check and predict had raised "Unable to
        # cast"), and a model whose path plans cannot record in JSON is refused when loaded
        # (plan() had raised nlohmann's bare type_error).
        import pathlib
        import shutil
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(os.fsdecode(os.fsencode(tmp) + b"/caf\xe9"))
            d.mkdir()
            for call in (lambda: baton.load(d / "missing.json"),
                         lambda: baton.CostSpec.load(d / "c.json"),
                         lambda: baton.check(d / "plan.json"),
                         lambda: baton.predict(str(d / "plan.json"))):
                with self.assertRaisesRegex(baton.InputError, "caf\ufffd.*cannot open file"):
                    call()
            shutil.copy(os.path.join(SOURCE, "examples", "models", "mlp.json"), d / "m.json")
            with self.assertRaisesRegex(baton.InputError, "the path is not valid UTF-8"):
                baton.load_model(d / "m.json")
            s = baton.generate("1f1b", 2, 4)
            s.save(d / "s.json")
            self.assertEqual(baton.load(d / "s.json"), s)

    def test_measured_costs_as_the_command_uses_them(self):
        # A cost file of `baton profile` at two micro-batch sizes: plan(), check() and
        # layer_costs() take it as `baton plan --costs` does, and say so.
        binary = os.environ.get("BATON_BIN")
        if not binary:
            self.skipTest("BATON_BIN (the baton command, set by ctest) is not set")
        path = os.path.join(SOURCE, "examples", "models", "mlp.json")
        model = baton.load_model(path)
        with tempfile.TemporaryDirectory() as tmp:
            costs = os.path.join(tmp, "costs.json")
            subprocess.run([binary, "profile", "--model", path, "--batch", "2", "4", "--repeats", "1",
                            "--warmup", "0", "--out", costs], check=True, capture_output=True)
            flops = baton.layer_costs(model, tp=1, batch=4)
            measured = baton.layer_costs(model, tp=1, batch=4, costs=costs)
            self.assertNotEqual([c["forward"] for c in flops], [c["forward"] for c in measured])
            res = baton.plan(model, devices=2, batch=8, device_memory="1GiB", top=1, costs=costs)
            self.assertIn("timed at micro-batches of 2 and 4 samples", res["time_source"])
            plan_file = os.path.join(tmp, "plan.json")
            best = dict(res["best"], model=path)
            with open(plan_file, "w") as f:
                json.dump(best, f)
            est = baton.check(plan_file, costs=costs)
            self.assertIn(costs, est["time_source"])
            out = subprocess.run([binary, "plan", "--check", plan_file, "--costs", costs],
                                 check=True, capture_output=True, text=True).stdout
            cli = float(re.search(r"predicted step time ([0-9.]+) ms", out).group(1))
            self.assertAlmostEqual(est["step_time"] * 1e3, cli, delta=1e-3)
            self.assertNotAlmostEqual(baton.check(plan_file)["step_time"] * 1e3, cli, delta=1e-3)
            # The step's timeline, as `baton trace predict` writes it, from the same file.
            pred = baton.predict(plan_file, costs=costs)
            self.assertAlmostEqual(pred["step_time"], est["step_time"], delta=1e-12)
            self.assertIsInstance(pred["timeline"], baton.Timeline)
            self.assertGreater(len(pred["timeline"].events()), 0)
            traced = os.path.join(tmp, "predicted.json")
            subprocess.run([binary, "trace", "predict", "--plan", plan_file, "--costs", costs, "-o", traced],
                           check=True, capture_output=True)
            with open(traced) as f:
                cli_timeline = baton.read_chrome_trace(f.read())
            # (the file holds microseconds to a few decimals)
            both = baton.compare_traces(cli_timeline, pred["timeline"])
            self.assertAlmostEqual(both["measured_makespan"], both["predicted_makespan"], delta=1e-9)
            self.assertEqual(both["unmatched_measured"], 0)
            # The plan's own schedule passed as a Schedule predicts the same step.
            own = baton.generate(best["schedule"]["name"], ranks=best["parallel"]["pp"],
                                 micro_batches=best["schedule"]["micro_batches"])
            self.assertAlmostEqual(baton.predict(plan_file, costs=costs, schedule=own)["step_time"],
                                   pred["step_time"], delta=1e-12)
        with self.assertRaises(baton.InputError) as e:
            baton.check(best, costs=os.path.join(SOURCE, "no-such-costs.json"))
        self.assertIn("no-such-costs.json", str(e.exception))
        with self.assertRaises(baton.InputError) as e:
            baton.layer_costs(model, machine={"cores_per_host": -1})
        self.assertIn("machine.cores_per_host", str(e.exception))

    def test_the_research_loop_example(self):
        # examples/python/predict_and_measure.py on the tiny GPT: profiled, planned,
        # predicted, trained for real, and the measured step compared with the prediction.
        binary = os.environ.get("BATON_BIN")
        if not binary:
            self.skipTest("BATON_BIN (the baton command, set by ctest) is not set")
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "predict_and_measure", os.path.join(SOURCE, "examples", "python", "predict_and_measure.py"))
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        comparison = example.main(binary, os.path.join(SOURCE, "examples", "models", "tiny-gpt.json"), 2,
                                  os.path.join(SOURCE, "examples", "data", "licenses.txt"))
        self.assertGreater(comparison["measured_makespan"], 0)
        self.assertGreater(comparison["predicted_makespan"], 0)
        self.assertEqual(comparison["unmatched_measured"], 0)
        self.assertIn("makespan: measured", comparison["report"])
        # Its defaults are the examples beside it, whatever the working folder (installed,
        # they had been looked for under ./examples).
        _, model, _, data = example.main.__defaults__
        for path in (model, data):
            self.assertTrue(os.path.isabs(path) and os.path.exists(path), path)


if __name__ == "__main__":
    unittest.main()
