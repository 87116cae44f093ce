"""The research loop from Python: time a model's ops on this machine, plan it from those
times, predict one step of the plan, run the plan for real and set the measured step
beside the prediction, action by action.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/python/predict_and_measure.py \\
        [baton] [model] [pipeline ranks] [data]

(defaults: build/release/baton, else the `baton` on PATH; the examples' gpt-config-a.json,
2, the examples' licenses.txt: the examples found beside this script, in the source tree
or an installed share/baton/examples). Its files go to a temporary folder; it prints the
plan, the prediction and `baton trace compare`'s report."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import baton

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(binary=None, model=os.path.join(EXAMPLES, "models", "gpt-config-a.json"), ranks=2,
         data=os.path.join(EXAMPLES, "data", "licenses.txt")):
    if binary is None:
        binary = "build/release/baton" if os.path.exists("build/release/baton") else shutil.which("baton")
        if binary is None:
            sys.exit("predict_and_measure.py: no baton command (build/release/baton or on PATH): "
                     "give its path as the first argument")
    ranks = int(ranks)
    with tempfile.TemporaryDirectory() as tmp:
        # The ops timed at two micro-batch sizes (the planner interpolates between them),
        # and beside copies of the profile, as the plan's ranks will share this host.
        costs = os.path.join(tmp, "costs.json")
        subprocess.run([binary, "profile", "--model", model, "--batch", "1", "2", "--threads", "1",
                        "--colocated", str(ranks), "--out", costs], check=True, capture_output=True)
        found = baton.plan(baton.load_model(model), devices=ranks, pp=ranks, batch=8, top=1,
                           costs=costs)
        plan_file = os.path.join(tmp, "plan.json")
        with open(plan_file, "w") as f:
            json.dump(found["best"], f)  # names the model by its absolute path
        predicted = baton.predict(plan_file, costs=costs)
        print(f"plan: {found['plans'][0]['describe']}")
        print(f"predicted step: {predicted['step_time'] * 1e3:.2f} ms, "
              f"times from {predicted['time_source']}")

        # Train it on `ranks` processes; the last step's timeline is kept (the first steps
        # pay for allocation and warm-up).
        trace = os.path.join(tmp, "measured.json")
        subprocess.run([binary, "launch", "-n", str(ranks), "--", binary, "train", "--plan",
                        plan_file, "--data", data, "--steps", "10", "--threads", "1", "--trace", trace],
                       check=True, capture_output=True)
        with open(trace) as f:
            measured = baton.read_chrome_trace(f.read())
        comparison = baton.compare_traces(measured, predicted["timeline"])
        print(comparison["report"], end="")
        return comparison


if __name__ == "__main__":
    main(*sys.argv[1:])
