#!/usr/bin/env python3
"""Chaos soak (docs/checkpoints.md, "Chaos soak"): one training job of a tiny model on 4 ranks taken through a
seeded random sequence of faults, each followed by a restart with `checkpoint.restart: auto` as a
job script would do, then run to its end; its final tensors are compared with those of the same
deck run without faults.

Faults: kill -9 of a random rank at a random time; SIGTERM to the launcher; SIGUSR1 to the ranks;
the checkpoint file system (a small tmpfs this script mounts: it needs root) filled up before a
checkpoint, with and without checkpoint.reserve; the newest checkpoint corrupted between jobs (a
flipped byte in a tensor); a rank hung before a step (TESSERA_TEST_STALL, the watchdog's case,
run.hang_timeout); one rank's checkpoint writes failing with EDQUOT, a project quota seen by one
client (--shim: tests/integration/write_fail_shim.c built as a shared library, preloaded).
Asserts, for each: the job ends within --limit seconds of the fault with the
documented exit status (kill -9: the launcher's non-zero status; SIGTERM/SIGUSR1: 3, as
<run.dir>/exit_status records it; disk full and the write error: 1 with one line; hang: 5), `latest` names a complete
checkpoint that `tessera ckpt verify` accepts, no older than before the job (nothing lost beyond
the last checkpoint; a corrupted newest one is passed over by the restart, which says so). At the
end: every tensor of the final checkpoint equal to the fault-free run's bit for bit when every job
kept the layout; when some changed it, every weight within a tolerance of its tensor's largest
value (tests/integration/compare_runs.py's rule): 1e-4, or twice the drift between the fault-free
runs on the layouts if larger (sums in another order drift apart over the steps).

  tools/runs/chaos.py --tessera bin/tessera --data build/testdata --faults 8 --seed 27

--zero 3 runs every job (and the fault-free run) under ZeRO-3; --kinds names the faults drawn.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

FAULTS = ["kill9", "sigterm", "sigusr1", "disk_full", "corrupt", "hang", "write_error"]
LAYOUTS = {"2,2,1": ["parallel.dp=2", "parallel.tp=2"], "1,2,2": ["parallel.tp=2", "parallel.pp=2"]}


def deck_text(data, steps):
    return f"""model:
  n_layer: 2
  n_head: 2
  n_embd: 32
  block_size: 32
data:
  train: {data}/train.h5
  val: {data}/val.h5
  seq_len: 16
train:
  steps: {steps}
  batch_size: 8
  micro_batch: 2
  seed: 7
optim:
  lr: 3.0e-3
  min_lr: 3.0e-4
  warmup_steps: 3
  decay_steps: {steps}
  weight_decay: 0.1
  grad_clip: 1.0
eval:
  every: 0
  batches: 1
log:
  every: 1
  peak_gflops: 50
checkpoint:
  every: 4
  keep: 3
  restart: auto
"""


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.work = os.path.abspath(args.work)
        self.deck = os.path.join(self.work, "chaos.yaml")
        self.ck = os.path.join(self.work, "ck")  # the checkpoint file system
        self.run_dir = os.path.join(self.work, "run")
        self.mounted = False
        self.failures = []
        self.results = []
        self.changed_layout = False
        self.flipped = set()

    # --- helpers ---
    def say(self, text):
        print(text, flush=True)

    def fail(self, text):
        self.failures.append(text)
        self.say("FAIL " + text)

    def mount(self):
        os.makedirs(self.ck, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.a.tmpfs_kb}k", "tmpfs", self.ck],
                           capture_output=True, text=True)
        self.mounted = r.returncode == 0
        if not self.mounted:
            self.say("note: cannot mount a tmpfs (" + r.stderr.strip() + "): no disk-full faults")

    def unmount(self):
        if self.mounted:
            subprocess.run(["umount", self.ck], capture_output=True)

    def latest_step(self):
        try:
            name = open(os.path.join(self.ck, "latest")).read().strip()
            if os.path.isfile(os.path.join(self.ck, name)):
                return int(name[5:13]), os.path.join(self.ck, name)
        except (OSError, ValueError):
            pass
        return -1, None

    def command(self, layout, steps, extra):
        return [self.a.mpiexec, "-n", "4", self.a.tessera, "train", self.deck, f"train.steps={steps}",
                f"run.dir={self.run_dir}", f"checkpoint.dir={self.ck}"] + self.layout(layout) + extra

    def layout(self, name):
        return LAYOUTS[name] + ([f"parallel.zero={self.a.zero}"] if self.a.zero else [])

    def rank_pids(self, root):
        """The tessera processes under the launcher's process `root`."""
        children, pids = {}, []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(p))
            except (OSError, IndexError, ValueError):
                pass
        todo = [root]
        while todo:
            pid = todo.pop()
            for c in children.get(pid, []):
                todo.append(c)
                try:
                    exe = os.readlink(f"/proc/{c}/exe")
                except OSError:
                    continue
                if os.path.basename(exe).startswith("tessera"):
                    pids.append(c)
        return sorted(pids)

    def wait_steps(self, log, proc, n, limit=90):
        """Waits until the job's log shows n steps trained by this job; False if it ended first."""
        t0 = time.time()
        while time.time() - t0 < limit:
            if proc.poll() is not None:
                return False
            try:
                if len(re.findall(r"^step +\d+/", open(log).read(), re.M)) >= n:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def verify(self, path):
        r = subprocess.run([self.a.tessera, "ckpt", "verify", path], capture_output=True, text=True)
        return r.returncode == 0, (r.stdout + r.stderr).strip()

    # --- one job, one fault ---
    def sound_step(self):
        """The newest step_*.h5 but `latest`'s (which corrupt() damaged): what a restart takes."""
        _, damaged = self.latest_step()
        steps = [int(n[5:13]) for n in os.listdir(self.ck) if re.fullmatch(r"step_\d{8}\.h5", n)
                 and os.path.join(self.ck, n) != damaged]
        return max(steps, default=-1)

    def job(self, i, fault, layout, steps, corrupted):
        before = self.sound_step() if corrupted else self.latest_step()[0]
        log = os.path.join(self.work, f"job{i:02d}.log")
        err = os.path.join(self.work, f"job{i:02d}.err")
        extra, env = [], dict(os.environ)
        filler = os.path.join(self.ck, "filler")
        if fault == "hang":
            stall_step = max(before, 0) + self.rng.randint(2, 5)
            env["TESSERA_TEST_STALL"] = f"{self.rng.randrange(4)}:{stall_step}"
            extra.append("run.hang_timeout=3")
        if fault == "disk_full":
            reserve = self.rng.choice(["true", "false"])
            extra.append("checkpoint.reserve=" + reserve)
        if fault == "write_error":
            # The shim fails every checkpoint write of one rank from the job's start: its next
            # checkpoint is the one that fails.
            env.update(LD_PRELOAD=os.path.abspath(self.a.shim), TESSERA_SHIM_MATCH=".h5.tmp",
                       TESSERA_SHIM_ERRNO="122", TESSERA_SHIM_RANK=str(self.rng.randrange(4)))
        # The fault hits after a random number of this job's steps (and a random fraction of one).
        after = self.rng.randint(1, 3)
        delay = self.rng.uniform(0.0, 0.4)
        victim = self.rng.randrange(4)
        with open(log, "w") as out, open(err, "w") as errf:
            proc = subprocess.Popen(self.command(layout, steps, extra), stdout=out, stderr=errf,
                                    env=env, start_new_session=True)
        t_fault = time.time()
        note = ""
        if fault == "disk_full":
            # The checkpoint file system filled up while the job starts: the next write fails.
            self.wait_steps(log, proc, 1)
            free = os.statvfs(self.ck).f_bavail * os.statvfs(self.ck).f_frsize
            leave = self.rng.randint(100, 600) * 1024
            with open(filler, "wb") as f:
                f.write(b"\0" * max(free - leave, 0))
            note = f"reserve={reserve}, {leave // 1024} KiB left free"
            t_fault = time.time()
        elif fault in ("kill9", "sigterm", "sigusr1"):
            if self.wait_steps(log, proc, after):
                time.sleep(delay)
                t_fault = time.time()
                if fault == "sigterm":
                    os.kill(proc.pid, signal.SIGTERM)
                else:
                    pids = self.rank_pids(proc.pid)
                    if fault == "kill9" and pids:
                        os.kill(pids[victim % len(pids)], signal.SIGKILL)
                        note = f"rank process {victim % len(pids)} of {len(pids)}"
                    for pid in pids if fault == "sigusr1" else []:
                        os.kill(pid, signal.SIGUSR1)
            note += f" after {after} steps + {delay:.2f} s"
        elif fault == "hang":
            note = "TESSERA_TEST_STALL=" + env["TESSERA_TEST_STALL"]
        elif fault == "write_error":
            note = "EDQUOT on rank " + env["TESSERA_SHIM_RANK"]
        try:
            rc = proc.wait(timeout=self.a.limit + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "hung"
        took = time.time() - t_fault
        if os.path.exists(filler):
            os.unlink(filler)
        status_file = os.path.join(self.run_dir, "exit_status")
        recorded = open(status_file).read().strip() if os.path.exists(status_file) else "?"
        text = open(log).read()
        errs = [l for l in open(err).read().splitlines() if l.strip()]
        return before, rc, took, recorded, text, errs, note

    def check(self, i, fault, before, rc, took, recorded, text, errs, note, skipped_expected):
        after, path = self.latest_step()
        done = re.search(r"^done", text, re.M) is not None
        want = {"kill9": "non-zero", "sigterm": "3", "sigusr1": "3", "disk_full": "1", "hang": "5",
                "write_error": "1"}[fault]
        if done and rc == 0:
            ok_status = True  # the run reached its end before the fault
        elif rc == "hung":
            ok_status = False
        elif fault == "kill9":
            ok_status = rc != 0
        elif fault in ("sigterm", "sigusr1"):
            ok_status = recorded == "3" and rc in (0, 3)
        elif fault == "disk_full":
            # The disk-full watch's line, or, when a write meets the full disk before the watch
            # sees the space go, the write error's (io/io_error_watch.hpp): both end the job.
            ok_status = rc == 1 and any(
                re.search(r"checkpoint step \d+: (disk full on |.*No space left on device)", l)
                for l in errs)
        elif fault == "write_error":
            ok_status = rc == 1 and any(re.search(r"checkpoint step \d+: .*Disk quota exceeded", l)
                                        for l in errs)
        else:
            ok_status = rc == 5 and any(l.startswith("hang: ") for l in errs)
        problems = []
        if not ok_status:
            problems.append(f"exit {rc} (exit_status {recorded}), want {want}: " + " | ".join(errs[:3]))
        if took > self.a.limit:
            problems.append(f"took {took:.1f} s > {self.a.limit} s")
        if after < before:
            problems.append(f"latest went back from step {before} to {after}")
        if path:
            ok, why = self.verify(path)
            if not ok:
                problems.append("latest does not verify: " + why)
        if skipped_expected and not re.search(r"^restart: skipped step_\d{8}\.h5 \(", text, re.M):
            problems.append("the corrupted checkpoint was not reported as skipped")
        for name in os.listdir(self.ck):  # what an operator would remove after reading the log
            if name.endswith(".damaged"):
                os.unlink(os.path.join(self.ck, name))
        line = (f"fault {i + 1:2d} {fault:9s} {note.strip():40s} exit {rc} (exit_status {recorded}) "
                f"in {took:5.1f} s, latest step {before} -> {after}")
        self.results.append(line)
        if problems:
            self.fail(line + ": " + "; ".join(problems))
        else:
            self.say("ok   " + line)
        return done

    def corrupt(self):
        """Flips one byte of a tensor of the newest checkpoint, at a random place (never twice at
        the same one: two flips there would undo each other)."""
        step, path = self.latest_step()
        if not path:
            return None
        with h5py.File(path, "r") as f:
            d = f["model/wte"]
            place = self.rng.randrange(d.id.get_storage_size())
            while (path, place) in self.flipped:
                place = (place + 1) % d.id.get_storage_size()
            self.flipped.add((path, place))
            offset = d.id.get_offset() + place
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x40]))
        return step

    # --- the soak ---
    def run(self):
        os.makedirs(self.work, exist_ok=True)
        steps = self.a.steps or 5 * self.a.faults + 8
        with open(self.deck, "w") as f:
            f.write(deck_text(self.a.data, steps))
        self.mount()
        try:
            return self.soak(steps)
        finally:
            self.unmount()

    def soak(self, steps):
        layouts = self.a.layouts.split()
        first = layouts[0]
        ref_dir = os.path.join(self.work, "reference")
        t0 = time.time()
        r = subprocess.run([self.a.mpiexec, "-n", "4", self.a.tessera, "train", self.deck,
                            f"train.steps={steps}", f"run.dir={ref_dir}"] + self.layout(first),
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            self.fail("reference run: exit %d: %s" % (r.returncode, r.stderr.strip()[:300]))
            return 1
        self.say(f"reference: {steps} steps on ({first}) without faults in {time.time() - t0:.1f} s")
        kinds = [f for f in (self.a.kinds.split(",") if self.a.kinds else FAULTS)
                 if (f != "disk_full" or self.mounted) and (f != "write_error" or self.a.shim)]
        i, corrupted = 0, False
        t_soak = time.time()
        # Every kind once first (a seeded order), then any.
        order = self.rng.sample(kinds, len(kinds))
        while i < self.a.faults:
            fault = order[i] if i < len(order) else self.rng.choice(kinds)
            if fault == "corrupt" and self.latest_step()[1] is None:  # nothing to corrupt yet
                fault = self.rng.choice([k for k in kinds if k != "corrupt"])
            if fault == "corrupt":
                step = self.corrupt()
                self.results.append(f"fault {i + 1:2d} corrupt   newest checkpoint step {step} damaged")
                self.say("ok   " + self.results[-1])
                corrupted = True
                i += 1
                continue
            layout = self.rng.choice(layouts)
            self.changed_layout |= layout != first
            out = self.job(i, fault, layout, steps, corrupted)
            done = self.check(i, fault, *out, skipped_expected=corrupted)
            corrupted = False
            i += 1
            if done:
                self.fail("the run reached its end before all faults: raise --steps")
                break
        # The end: restarts (as a job script would) until the run is done.
        for attempt in range(3):
            r = subprocess.run(self.command(first, steps, []), capture_output=True, text=True, timeout=600)
            if r.returncode == 0:
                break
        final = os.path.join(self.ck, f"step_{steps:08d}.h5")
        reference = os.path.join(ref_dir, "checkpoints", f"step_{steps:08d}.h5")
        if r.returncode != 0 or not os.path.exists(final):
            self.fail(f"final run: exit {r.returncode}: {r.stderr.strip()[:300]}")
            return 1
        # With layout changes the tolerance is the drift between fault-free runs on the layouts
        # (fp32 sums in another order drift apart over steps), at least 1e-4.
        tol = 1e-4
        for other in layouts[1:] if self.changed_layout else []:
            odir = os.path.join(self.work, "reference_" + other.replace(",", ""))
            subprocess.run([self.a.mpiexec, "-n", "4", self.a.tessera, "train", self.deck,
                            f"train.steps={steps}", f"run.dir={odir}"] + self.layout(other),
                           capture_output=True, text=True, timeout=600)
            drift = self.weight_diff(os.path.join(odir, "checkpoints", f"step_{steps:08d}.h5"),
                                     reference)
            self.say(f"reference on ({other}) without faults: weights within {drift:.1e} of ({first})'s")
            tol = max(tol, 2 * drift)
        self.compare(final, reference, tol)
        self.say(f"{self.a.faults} faults (seed {self.a.seed}) in {time.time() - t_soak:.0f} s: "
                 f"{len(self.failures)} failures")
        return 1 if self.failures else 0

    @staticmethod
    def weight_diff(path, reference):
        """max |a - b| / max |b| over the /model tensors, the worst tensor's."""
        worst = 0.0
        with h5py.File(path, "r") as a, h5py.File(reference, "r") as b:
            for k in b["model"]:
                x, y = a["model"][k][()], b["model"][k][()]
                worst = max(worst, float(np.abs(x - y).max() / max(float(np.abs(y).max()), 1e-30)))
        return worst

    def compare(self, final, reference, tol):
        worst, n, differ = 0.0, 0, []
        with h5py.File(final, "r") as a, h5py.File(reference, "r") as b:
            names = []
            b.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) and
                         k.split("/")[0] in ("model", "optim") else None)
            for k in names:
                x, y = np.asarray(a[k][()]), np.asarray(b[k][()])
                n += 1
                if x.shape != y.shape or x.tobytes() != y.tobytes():
                    differ.append(k)
                    if k.startswith("model/"):  # the layout suite's rule (compare_runs.py)
                        rel = np.abs(x - y).max() / max(float(np.abs(y).max()), 1e-30)
                        worst = max(worst, float(rel))
        if not self.changed_layout:
            if differ or n == 0:
                self.fail(f"final tensors differ from the fault-free run: {len(differ)} of {n}, "
                          f"first {differ[:3]}, worst relative {worst:.2e}")
            else:
                self.say(f"final: all {n} tensors (weights and moments) bit-identical to the "
                         f"fault-free run")
        elif worst > tol:
            self.fail(f"final weights differ by {worst:.2e} of their largest value (> {tol:.1e}) "
                      f"after layout changes")
        else:
            self.say(f"final: every weight within {worst:.1e} of its tensor's largest value in the "
                     f"fault-free run ({len(differ)} of {n} tensors not bit-identical: some restarts "
                     f"changed the layout)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tessera", default="bin/tessera")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--data", default="build/testdata", help="directory of train.h5 and val.h5")
    p.add_argument("--work", required=True, help="scratch directory (made)")
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--steps", type=int, default=0, help="train.steps (0: 5 per fault + 8)")
    p.add_argument("--layouts", default="2,2,1", help="(dp,tp,pp) layouts the jobs pick from; the "
                   "first is the fault-free run's")
    p.add_argument("--limit", type=float, default=60.0, help="seconds a faulted job may take to end")
    p.add_argument("--tmpfs-kb", type=int, default=4096)
    p.add_argument("--zero", type=int, default=0, help="parallel.zero of every job")
    p.add_argument("--kinds", default="", help="the faults drawn, comma separated (default: all)")
    p.add_argument("--shim", default="", help="write_fail_shim.c built as a shared library: "
                   "the write_error fault (left out without it)")
    a = p.parse_args()
    unknown = set(a.kinds.split(",")) - set(FAULTS) if a.kinds else set()
    if unknown:
        p.error(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(FAULTS)}")
    a.tessera = os.path.abspath(a.tessera)
    a.data = os.path.abspath(a.data)
    sys.exit(Soak(a).run())


if __name__ == "__main__":
    main()
