"""How soon a SIGTERM during the warm start ends a run: the quickstart through the real command line,
signalled DELAY seconds after its warm-start bar first appears (0: while the first call compiles),
timed from the signal to the process's exit.  Prints a table, one row per delay.

  python scripts/warm_start_stop_latency.py [DELAY ...]      # default: 0 5 8
"""
import os
import signal
import subprocess
import sys
import tempfile
import time


def stop_latency(delay: float) -> tuple[float, int]:
  """(seconds from the signal to the exit, exit status) of one quickstart run in a fresh workdir."""
  with tempfile.TemporaryDirectory() as workdir:
    log = os.path.join(workdir, "stderr.log")
    with open(log, "w") as stderr:
      run = subprocess.Popen([sys.executable, "-m", "marl_jax.main", "--config=experiments/quickstart.py",
                              f"--workdir={workdir}/run"], stdout=subprocess.DEVNULL, stderr=stderr)
      while "warm start:" not in open(log).read():  # the bar's first line: the first call is compiling
        if run.poll() is not None:
          raise SystemExit(f"the run ended before its warm start:\n{open(log).read()[-3000:]}")
        time.sleep(0.1)
      time.sleep(delay)
      signalled = time.monotonic()
      run.send_signal(signal.SIGTERM)
      status = run.wait()
    return time.monotonic() - signalled, status


def main(delays):
  print("| signalled, s after the warm-start bar appeared | exit, s after the signal | status |")
  print("|---|---|---|")
  for delay in delays:
    seconds, status = stop_latency(delay)
    print(f"| {delay:g} | {seconds:.1f} | {status} |", flush=True)


if __name__ == "__main__":
  main([float(d) for d in sys.argv[1:]] or [0.0, 5.0, 8.0])
