"""A schedule PyTorch wrote (torch.distributed.pipelining's CSV), read, checked and
simulated next to baton's own generator of the same family.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/python/torch_csv.py \
        examples/schedules/zbv_p4_m8.csv zb-v

(examples/schedules/zbv_p4_m8.csv is PyTorch 2.15's own output, as the test fixtures'.)
"""

import os
import sys

import baton

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COSTS = {"forward": 1.0, "backward_input": 1.0, "backward_weight": 1.0}


def main(path=os.path.join(EXAMPLES, "schedules", "zbv_p4_m8.csv"), ours="zb-v"):
    with open(path, newline="") as f:
        text = f.read()
    theirs, dialect, kept = baton.parse_csv(text, source=path)
    assert baton.to_csv(theirs, dialect, kept) == text  # byte for byte
    baton.validate(theirs)
    mine = baton.generate(ours, theirs.num_ranks, theirs.num_micro_batches)
    print(f"{path}: PyTorch's schedule, {dialect} dialect, {theirs.num_ranks} ranks, "
          f"{theirs.num_micro_batches} micro-batches, {theirs.num_stages} stages")
    print(f"{'':12} {'makespan':>9} {'bubble':>8} {'span':>8} {'peak':>6}")
    for label, s in (("pytorch", theirs), ("baton " + ours, mine)):
        r = baton.simulate(s, COSTS)
        print(f"{label:12} {r.makespan:9.2f} {r.bubble:8.2%} {r.span_bubble:8.2%} "
              f"{r.peak_micro_batches:6.2f}")
    same = theirs.tokens() == mine.tokens()
    overlapped = sum(a.overlap for _, _, a in theirs)
    print(("same action order on every rank" if same else "the action orders differ") +
          (f"; PyTorch's runs {overlapped} forwards beside a backward (OVERLAP_F_B), which "
           "the default costs charge F + B and end together" if overlapped else ""))


if __name__ == "__main__":
    main(*sys.argv[1:])
